//! `selkie login static` as kubectl's exec credential plugin and `selkie whoami`, against
//! Selkie's real impersonation proxy in front of the real kube-apiserver, with the real kubectl.
//! (The real pinniped CLI is not among the components: the Go module proxy refuses
//! go.pinniped.dev. The cache file's compatibility is pinned by cli/src/cache tests against values
//! computed with pinniped's own Go types.)
//!
//! The proxy has a WebhookAuthenticator whose TokenReview endpoint is a small webhook in this
//! test that knows one static token. The kubeconfig's user runs `login static --enable-concierge
//! …`, which trades the token for a 5-minute client certificate with a TokenCredentialRequest;
//! the proxy logs one audit line per TokenCredentialRequest, which is how the tests count them.

use std::{
    convert::Infallible,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{body::Incoming, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
use selkie_e2e::{
    cluster::write_kubeconfig_for_user, kubectl::Kubectl, pki::CertificateAuthority, proxy::Proxy, Cluster,
};
use serde_json::{json, Value};
use tokio_rustls::TlsAcceptor;

use crate::proxy_kubectl::grant_configmaps;

const WEBHOOK: &str = "static-tokens";
const TOKEN_ENV: &str = "SELKIE_E2E_STATIC_TOKEN";
const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";
const V1: &str = "client.authentication.k8s.io/v1";

/// A TokenReview webhook that knows a set of static tokens, counting the reviews it answers.
struct Webhook {
    url: String,
    ca_pem: String,
    reviews: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `(token, username, groups)`.
type StaticUser = (String, String, Vec<String>);

impl Webhook {
    async fn start(users: Vec<StaticUser>) -> anyhow::Result<Self> {
        selkie_e2e::install_crypto_provider();
        let ca = CertificateAuthority::new("selkie-test-token-webhook-ca")?;
        let serving = ca.issue_serving("token-webhook", &["127.0.0.1"])?;
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?],
                PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?,
            )?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://127.0.0.1:{}/tokenreview", listener.local_addr()?.port());
        let reviews = Arc::new(AtomicUsize::new(0));
        let users = Arc::new(users);
        let counter = reviews.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, users, counter) = (acceptor.clone(), users.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let (users, counter) = (users.clone(), counter.clone());
                        async move { Ok::<_, Infallible>(review(request, &users, &counter).await) }
                    });
                    let _ended = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(Self {
            url,
            ca_pem: ca.cert_pem(),
            reviews,
            task,
        })
    }
}

/// Answers one TokenReview (v1beta1 or v1, in the version asked).
async fn review(
    request: Request<Incoming>,
    users: &[StaticUser],
    counter: &AtomicUsize,
) -> Response<Full<Bytes>> {
    counter.fetch_add(1, Ordering::SeqCst);
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let asked: Value = serde_json::from_slice(&body).unwrap_or_default();
    let token = asked["spec"]["token"].as_str().unwrap_or_default();
    let status = match users.iter().find(|(known, _, _)| known == token) {
        Some((_, username, groups)) => {
            json!({"authenticated": true, "user": {"username": username, "groups": groups}})
        }
        None => json!({"authenticated": false}),
    };
    let answer = json!({
        "apiVersion": asked["apiVersion"].as_str().unwrap_or("authentication.k8s.io/v1beta1"),
        "kind": "TokenReview",
        "status": status,
    });
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Builds the `selkie` binary from this source tree (a no-op when it is up to date).
fn selkie_binary() -> anyhow::Result<PathBuf> {
    Ok(selkie_e2e::workspace_binary("selkie", "selkie")?)
}

/// One test's world: a namespace, a static user the webhook knows (allowed to edit configmaps
/// in the namespace), and a proxy with the webhook as its WebhookAuthenticator.
struct Setup {
    namespace: String,
    username: String,
    groups: Vec<String>,
    token: String,
    selkie: PathBuf,
    proxy: Proxy,
    webhook: Webhook,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn start(prefix: &str) -> anyhow::Result<Self> {
        let selkie = selkie_binary()?;
        let cluster = Cluster::shared().await?;
        let client = cluster.client().await?;
        let namespace = cluster.create_namespace(&client, prefix).await?;
        let username = format!("{namespace}@example.com");
        let groups = vec!["static-devs".to_string(), format!("{namespace}-team")];
        // Distinctive, so the tests can tell it never appears in any output.
        let token = format!("tok-{namespace}-Zq9xW2");
        let webhook = Webhook::start(vec![(token.clone(), username.clone(), groups.clone())]).await?;
        grant_configmaps(cluster, &namespace, "User", &username).await?;
        let dir = tempfile::Builder::new().prefix("selkie-cli-").tempdir()?;
        let ca_file = dir.path().join("webhook-ca.crt");
        std::fs::write(&ca_file, &webhook.ca_pem)?;
        let proxy = Proxy::start_configured(cluster, &[], |config| {
            config["webhookAuthenticators"] =
                json!([{"name": WEBHOOK, "endpoint": webhook.url, "caFile": ca_file}]);
        })
        .await?;
        Ok(Self {
            namespace,
            username,
            groups,
            token,
            selkie,
            proxy,
            webhook,
            dir,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The `login static` arguments `pinniped get kubeconfig` would write for this proxy.
    fn concierge_args(&self, cache: &Path) -> Vec<String> {
        vec![
            "login".into(),
            "static".into(),
            "--enable-concierge".into(),
            "--concierge-api-group-suffix=pinniped.dev".into(),
            "--concierge-authenticator-type=webhook".into(),
            format!("--concierge-authenticator-name={WEBHOOK}"),
            format!("--concierge-endpoint={}", self.proxy.url()),
            format!(
                "--concierge-ca-bundle-data={}",
                B64.encode(self.proxy.serving_ca().cert_pem())
            ),
            format!("--credential-cache={}", cache.display()),
            format!("--token-env={TOKEN_ENV}"),
        ]
    }

    /// A kubeconfig for the proxy whose user runs `selkie args` as its exec plugin, with the
    /// token in the plugin's environment.
    fn kubeconfig(
        &self,
        name: &str,
        args: &[String],
        token: &str,
        api_version: &str,
    ) -> anyhow::Result<PathBuf> {
        let path = self.path(&format!("{name}.kubeconfig"));
        let exec = json!({"exec": {
            "apiVersion": api_version,
            "command": self.selkie,
            "args": args,
            "env": [{"name": TOKEN_ENV, "value": token}],
            "provideClusterInfo": true,
            "interactiveMode": "Never",
            "installHint": "build selkie with cargo build -p selkie",
        }});
        write_kubeconfig_for_user(
            &path,
            self.proxy.url(),
            &self.proxy.serving_ca().cert_pem(),
            name,
            exec,
        )?;
        Ok(path)
    }

    fn kubectl(&self, kubeconfig: &Path) -> Kubectl {
        self.proxy.kubectl(kubeconfig)
    }

    /// TokenCredentialRequests the proxy has answered so far (its audit lines).
    fn token_credential_requests(&self) -> usize {
        self.proxy
            .log()
            .lines()
            .filter(|line| line.contains("token credential request"))
            .count()
    }

    /// Asserts the proxy has answered exactly `expected` TokenCredentialRequests, and still has
    /// a moment later (nothing still on its way).
    async fn assert_token_credential_requests(&self, expected: usize, context: &str) -> anyhow::Result<()> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = self.token_credential_requests();
        anyhow::ensure!(
            seen == expected,
            "{context}: expected {expected} TokenCredentialRequests, the proxy answered {seen}"
        );
        Ok(())
    }

    /// `kubectl auth whoami -o json` must name the static user and its groups.
    async fn assert_whoami(&self, kubectl: &Kubectl) -> anyhow::Result<()> {
        let review: Value = serde_json::from_str(&kubectl.run(&["auth", "whoami", "-o", "json"]).await?)?;
        let user = &review["status"]["userInfo"];
        anyhow::ensure!(
            user["username"] == self.username.as_str(),
            "kubectl auth whoami: {review}"
        );
        for group in self
            .groups
            .iter()
            .map(String::as_str)
            .chain(["system:authenticated"])
        {
            anyhow::ensure!(
                user["groups"]
                    .as_array()
                    .is_some_and(|groups| groups.iter().any(|g| g == group)),
                "{group} missing: {review}"
            );
        }
        Ok(())
    }

    /// Runs `program args` (not via kubectl) with `env`, asynchronously so this test's webhook
    /// keeps answering; returns (success, stdout, stderr).
    async fn run(
        &self,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<(bool, String, String)> {
        let output = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(program)
                .args(args)
                .env_remove("KUBERNETES_EXEC_INFO")
                .env_remove("KUBECONFIG")
                .envs(env.iter().copied())
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await??;
        Ok((
            output.status.success(),
            String::from_utf8(output.stdout)?,
            String::from_utf8(output.stderr)?,
        ))
    }

    /// The text `whoami` must print for this user through `kubeconfig`.
    fn expected_whoami_text(&self) -> String {
        let mut groups = self.groups.clone();
        groups.push("system:authenticated".into());
        format!(
            "Current cluster info:\n\nName: selkie-test\nURL: {}\n\nCurrent user info:\n\nUsername: {}\nGroups: {}\n",
            self.proxy.url(),
            self.username,
            groups.join(", ")
        )
    }

    /// Fails if the token appears in the proxy's log.
    fn assert_token_not_logged(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.proxy.log().contains(&self.token),
            "the proxy logged the token"
        );
        Ok(())
    }
}

/// The cache file, parsed.
fn read_cache(path: &Path) -> anyhow::Result<serde_yaml::Value> {
    Ok(serde_yaml::from_str(&std::fs::read_to_string(path)?)?)
}

fn mode(path: &Path) -> anyhow::Result<u32> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

/// The lines of kubectl's stderr that selkie wrote.
fn selkie_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| line.starts_with("selkie:"))
        .collect()
}

#[tokio::test]
async fn kubectl_logs_in_with_selkie_login_static_once_and_reuses_the_cached_certificate(
) -> anyhow::Result<()> {
    let setup = Setup::start("cli-static").await?;
    let cache = setup.path("credentials.yaml");
    let kubeconfig = setup.kubeconfig("static", &setup.concierge_args(&cache), &setup.token, V1BETA1)?;
    let kubectl = setup.kubectl(&kubeconfig);

    setup.assert_whoami(&kubectl).await?;
    setup
        .assert_token_credential_requests(1, "after the first kubectl")
        .await?;
    assert_eq!(
        setup.webhook.reviews.load(Ordering::SeqCst),
        1,
        "the webhook reviewed the token once"
    );

    // The certificate works for real requests, as the webhook's user, and is reused.
    kubectl
        .run(&["create", "configmap", "from-static", "-n", &setup.namespace])
        .await?;
    let names = kubectl
        .run(&["get", "configmaps", "-n", &setup.namespace, "-o", "name"])
        .await?;
    assert!(names.contains("configmap/from-static"), "{names}");
    let refused = kubectl
        .output(&["get", "secrets", "-n", &setup.namespace], None)
        .await?;
    assert!(
        !refused.success && refused.stderr.contains("forbidden"),
        "RBAC applies to the user: {refused:?}"
    );
    setup
        .assert_token_credential_requests(1, "after three more kubectl calls")
        .await?;

    // Pinniped's file: private, its apiVersion and kind, one entry keyed by a SHA-256.
    assert_eq!(mode(&cache)?, 0o600);
    let file = read_cache(&cache)?;
    assert_eq!(file["apiVersion"], "config.supervisor.pinniped.dev/v1alpha1");
    assert_eq!(file["kind"], "CredentialCache");
    let entries = file["credentials"].as_sequence().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 1, "{file:?}");
    let key = entries[0]["key"].as_str().unwrap_or_default();
    assert!(
        key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    let credential = &entries[0]["credential"];
    assert!(credential["clientCertificateData"]
        .as_str()
        .is_some_and(|pem| pem.starts_with("-----BEGIN CERTIFICATE-----")));
    assert!(credential["clientKeyData"]
        .as_str()
        .is_some_and(|pem| pem.contains("PRIVATE KEY")));
    let expires = time::OffsetDateTime::parse(
        credential["expirationTimestamp"].as_str().unwrap_or_default(),
        &time::format_description::well_known::Rfc3339,
    )?;
    let left = expires - time::OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::minutes(3) && left <= time::Duration::minutes(5),
        "a 5-minute certificate: {left}"
    );
    for field in ["creationTimestamp", "lastUsedTimestamp"] {
        assert!(entries[0][field].as_str().is_some(), "{field}: {file:?}");
    }

    // selkie whoami runs the same plugin (same key: it describes the cluster as kubectl does).
    let kubeconfig_arg = kubeconfig.display().to_string();
    let (ok, text, stderr) = setup
        .run(
            &setup.selkie,
            &["whoami".into(), "--kubeconfig".into(), kubeconfig_arg.clone()],
            &[],
        )
        .await?;
    assert!(ok, "{stderr}");
    assert_eq!(text, setup.expected_whoami_text());
    let (ok, json_out, stderr) = setup
        .run(
            &setup.selkie,
            &[
                "whoami".into(),
                "-o".into(),
                "json".into(),
                format!("--kubeconfig={kubeconfig_arg}"),
            ],
            &[],
        )
        .await?;
    assert!(ok, "{stderr}");
    let answer: Value = serde_json::from_str(&json_out)?;
    assert_eq!(answer["kind"], "WhoAmIRequest");
    assert_eq!(answer["apiVersion"], "identity.concierge.pinniped.dev/v1alpha1");
    assert_eq!(
        answer["status"]["kubernetesUserInfo"]["user"]["username"],
        setup.username.as_str()
    );
    let (ok, yaml_out, stderr) = setup
        .run(
            &setup.selkie,
            &[
                "whoami".into(),
                "-o".into(),
                "yaml".into(),
                format!("--kubeconfig={kubeconfig_arg}"),
            ],
            &[],
        )
        .await?;
    assert!(ok, "{stderr}");
    let answer: serde_yaml::Value = serde_yaml::from_str(&yaml_out)?;
    assert_eq!(
        answer["status"]["kubernetesUserInfo"]["user"]["username"],
        setup.username.as_str()
    );
    // KUBECONFIG and a context by name work too.
    let (ok, text, stderr) = setup
        .run(
            &setup.selkie,
            &[
                "whoami".into(),
                "--kubeconfig-context".into(),
                "selkie-test".into(),
            ],
            &[("KUBECONFIG", kubeconfig_arg.as_str())],
        )
        .await?;
    assert!(ok, "{stderr}");
    assert_eq!(text, setup.expected_whoami_text());
    setup
        .assert_token_credential_requests(1, "after selkie whoami")
        .await?;

    // Run by hand: stdout is exactly one ExecCredential; the default cache is
    // $XDG_CONFIG_HOME/pinniped/credentials.yaml.
    let config_home = setup.path("xdg");
    let mut args = setup.concierge_args(&cache);
    args.retain(|arg| !arg.starts_with("--credential-cache"));
    let (ok, stdout, stderr) = setup
        .run(
            &setup.selkie,
            &args,
            &[
                (TOKEN_ENV, setup.token.as_str()),
                ("XDG_CONFIG_HOME", &config_home.display().to_string()),
            ],
        )
        .await?;
    assert!(ok, "{stderr}");
    assert!(stderr.is_empty(), "nothing to say: {stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let credential: Value = serde_json::from_str(&stdout)?;
    assert_eq!(credential["apiVersion"], V1BETA1);
    assert_eq!(credential["kind"], "ExecCredential");
    assert!(credential["status"]["clientCertificateData"].is_string());
    assert!(config_home.join("pinniped/credentials.yaml").is_file());
    setup
        .assert_token_credential_requests(2, "a new cache, a new TokenCredentialRequest")
        .await?;
    setup.assert_token_not_logged()
}

#[tokio::test]
async fn twenty_parallel_kubectl_invocations_on_a_cold_cache_make_one_token_credential_request(
) -> anyhow::Result<()> {
    let setup = Setup::start("cli-parallel").await?;
    let cache = setup.path("credentials.yaml");
    let kubeconfig = setup.kubeconfig("parallel", &setup.concierge_args(&cache), &setup.token, V1BETA1)?;
    let kubectl = setup.kubectl(&kubeconfig);
    let args = ["get", "configmaps", "-n", &setup.namespace];
    let runs = (0..20).map(|_| kubectl.output(&args, None));
    let outputs = futures::future::join_all(runs).await;
    for output in outputs {
        let output = output?;
        assert!(output.success, "{output:?}");
        assert!(selkie_lines(&output.stderr).is_empty(), "{}", output.stderr);
    }
    setup
        .assert_token_credential_requests(1, "20 parallel kubectl invocations")
        .await?;
    let file = read_cache(&cache)?;
    assert_eq!(
        file["credentials"].as_sequence().map(Vec::len),
        Some(1),
        "{file:?}"
    );
    Ok(())
}

#[tokio::test]
async fn exec_credential_v1_and_the_bare_token_work_with_kubectl() -> anyhow::Result<()> {
    let setup = Setup::start("cli-v1").await?;
    // client.authentication.k8s.io/v1 with the Concierge: a certificate in a v1 ExecCredential.
    let cache = setup.path("credentials.yaml");
    let v1 = setup.kubeconfig("v1", &setup.concierge_args(&cache), &setup.token, V1)?;
    setup.assert_whoami(&setup.kubectl(&v1)).await?;
    setup
        .assert_token_credential_requests(1, "v1 with the Concierge")
        .await?;

    // Without --enable-concierge the token itself goes to the proxy, which reviews it with the
    // webhook: no TokenCredentialRequest, no cache file.
    let bare_cache = setup.path("bare.yaml");
    let bare_args: Vec<String> = vec![
        "login".into(),
        "static".into(),
        format!("--token-env={TOKEN_ENV}"),
        format!("--credential-cache={}", bare_cache.display()),
    ];
    for (name, version) in [("bare-v1", V1), ("bare-v1beta1", V1BETA1)] {
        let kubeconfig = setup.kubeconfig(name, &bare_args, &setup.token, version)?;
        setup.assert_whoami(&setup.kubectl(&kubeconfig)).await?;
    }
    setup
        .assert_token_credential_requests(1, "bare tokens need no TokenCredentialRequest")
        .await?;
    assert!(!bare_cache.exists(), "a bare token is not cached");
    setup.assert_token_not_logged()
}

#[tokio::test]
async fn bad_input_fails_with_one_clear_line_and_a_damaged_cache_is_survived() -> anyhow::Result<()> {
    let setup = Setup::start("cli-bad").await?;

    // A token the webhook does not know: kubectl fails, selkie says why in one line, and the
    // token is nowhere in what was printed.
    let wrong_token = format!("wrong-{}-Kp3v", setup.namespace);
    let cache = setup.path("credentials.yaml");
    let wrong = setup.kubeconfig("wrong", &setup.concierge_args(&cache), &wrong_token, V1BETA1)?;
    let failed = setup
        .kubectl(&wrong)
        .output(&["get", "configmaps", "-n", &setup.namespace], None)
        .await?;
    assert!(!failed.success, "{failed:?}");
    // kubectl runs the plugin again for each request it retries; every run says the same line.
    let mut lines = selkie_lines(&failed.stderr);
    lines.dedup();
    assert_eq!(lines.len(), 1, "one line from selkie per run:\n{}", failed.stderr);
    assert!(
        lines[0].contains("the Concierge refused the token (authentication failed)"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(&format!("WebhookAuthenticator \"{WEBHOOK}\"")),
        "names the authenticator: {}",
        lines[0]
    );
    assert!(
        !failed.stderr.contains(&wrong_token) && !failed.stdout.contains(&wrong_token),
        "{failed:?}"
    );
    assert!(
        !cache.exists()
            || read_cache(&cache)?["credentials"]
                .as_sequence()
                .is_none_or(Vec::is_empty)
    );

    // A corrupt cache is set aside with one warning; the login still works.
    let good = setup.kubeconfig("good", &setup.concierge_args(&cache), &setup.token, V1BETA1)?;
    let garbage = "credentials: [ {key: \n\u{0}\u{1} not yaml";
    std::fs::write(&cache, garbage)?;
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o600))?;
    let worked = setup
        .kubectl(&good)
        .output(&["get", "configmaps", "-n", &setup.namespace], None)
        .await?;
    assert!(worked.success, "{worked:?}");
    let lines = selkie_lines(&worked.stderr);
    assert_eq!(lines.len(), 1, "{}", worked.stderr);
    assert!(
        lines[0].starts_with("selkie: warning: the credential cache") && lines[0].contains(".corrupt"),
        "{}",
        lines[0]
    );
    let aside = setup.path("credentials.yaml.corrupt");
    assert_eq!(std::fs::read_to_string(&aside)?, garbage);
    assert_eq!(
        read_cache(&cache)?["credentials"].as_sequence().map(Vec::len),
        Some(1)
    );

    // A cache others can read is tightened, with a warning, and still used.
    let before = setup.token_credential_requests();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o644))?;
    let worked = setup
        .kubectl(&good)
        .output(&["get", "configmaps", "-n", &setup.namespace], None)
        .await?;
    assert!(worked.success, "{worked:?}");
    let lines = selkie_lines(&worked.stderr);
    assert_eq!(lines.len(), 1, "{}", worked.stderr);
    assert!(lines[0].contains("mode 0644"), "{}", lines[0]);
    assert_eq!(mode(&cache)?, 0o600);
    setup
        .assert_token_credential_requests(before, "the tightened cache was still used")
        .await?;

    // Run by hand with bad flags or a bad endpoint: exit 1 or 2, nothing on stdout, one line.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let other_ca = CertificateAuthority::new("selkie-test-unrelated-ca")?;
    let with = |replace: &str, value: String| -> Vec<String> {
        setup
            .concierge_args(&setup.path("by-hand.yaml"))
            .into_iter()
            .map(|arg| {
                if arg.starts_with(replace) {
                    value.clone()
                } else {
                    arg
                }
            })
            .collect()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["login".into(), "static".into()],
            "one of --token or --token-env must be set",
        ),
        (
            with(
                "--concierge-endpoint",
                "--concierge-endpoint=http://127.0.0.1:1".into(),
            ),
            "--concierge-endpoint \"http://127.0.0.1:1\" is not usable",
        ),
        (
            with(
                "--concierge-authenticator-type",
                "--concierge-authenticator-type=ldap".into(),
            ),
            "--concierge-authenticator-type \"ldap\" is not supported",
        ),
        (
            with(
                "--concierge-ca-bundle-data",
                "--concierge-ca-bundle-data=not base64!".into(),
            ),
            "--concierge-ca-bundle-data is not base64",
        ),
        (
            with(
                "--concierge-endpoint",
                format!("--concierge-endpoint=https://127.0.0.1:{closed_port}"),
            ),
            "could not reach the Concierge",
        ),
        (
            with(
                "--concierge-ca-bundle-data",
                format!("--concierge-ca-bundle-data={}", B64.encode(other_ca.cert_pem())),
            ),
            "could not reach the Concierge",
        ),
        (
            with(
                "--concierge-authenticator-name",
                "--concierge-authenticator-name=nobody".into(),
            ),
            "the Concierge refused the token (authentication failed)",
        ),
        (
            with("--token-env", "--token-env=SELKIE_E2E_UNSET_VARIABLE".into()),
            "--token-env variable \"SELKIE_E2E_UNSET_VARIABLE\" is not set",
        ),
        (
            vec!["login".into(), "static".into(), setup.token.clone()],
            "unexpected positional argument (not shown)",
        ),
    ];
    for (args, expected) in cases {
        let (ok, stdout, stderr) = setup
            .run(&setup.selkie, &args, &[(TOKEN_ENV, setup.token.as_str())])
            .await?;
        assert!(!ok, "{args:?} must fail");
        assert!(stdout.is_empty(), "{args:?}: stdout {stdout:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("selkie: "), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: {stderr:?} lacks {expected:?}"
        );
        assert!(!stderr.contains(&setup.token), "{args:?}: {stderr}");
    }

    // whoami against a kubeconfig whose plugin fails: one line of its own after the plugin's.
    let (ok, stdout, stderr) = setup
        .run(
            &setup.selkie,
            &["whoami".into(), format!("--kubeconfig={}", wrong.display())],
            &[],
        )
        .await?;
    assert!(!ok && stdout.is_empty(), "{stdout}");
    let lines = selkie_lines(&stderr);
    assert_eq!(lines.len(), 2, "the plugin's line and whoami's:\n{stderr}");
    assert!(lines[1].contains("could not get a credential"), "{stderr}");
    assert!(!stderr.contains(&wrong_token), "{stderr}");
    setup.assert_token_not_logged()
}

/// A load balancer in front of the proxy whose first `closed` connections meet a backend that
/// just died: each is accepted and closed at once. Later connections are relayed to the proxy.
struct DyingBackend {
    url: String,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DyingBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DyingBackend {
    async fn start(proxy_url: &str, closed: usize) -> anyhow::Result<Self> {
        let target = proxy_url
            .strip_prefix("https://")
            .unwrap_or(proxy_url)
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://{}", listener.local_addr()?);
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                if counted.fetch_add(1, Ordering::SeqCst) < closed {
                    drop(socket);
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
                    }
                });
            }
        });
        Ok(Self {
            url,
            connections,
            task,
        })
    }

    /// `args` with the Concierge endpoint replaced by this load balancer.
    fn in_front(&self, args: Vec<String>) -> Vec<String> {
        args.into_iter()
            .map(|arg| {
                if arg.starts_with("--concierge-endpoint=") {
                    format!("--concierge-endpoint={}", self.url)
                } else {
                    arg
                }
            })
            .collect()
    }
}

#[tokio::test]
async fn a_login_while_the_concierge_is_briefly_unreachable_is_retried_and_a_tls_failure_is_not(
) -> anyhow::Result<()> {
    let setup = Setup::start("cli-retry").await?;
    let env = [(TOKEN_ENV, setup.token.as_str())];

    // Two connections closed (a killed pod still in the Service's endpoints), then the proxy:
    // the login succeeds on the third attempt with one TokenCredentialRequest answered.
    let front = DyingBackend::start(setup.proxy.url(), 2).await?;
    let args = front.in_front(setup.concierge_args(&setup.path("retry.yaml")));
    let (ok, stdout, stderr) = setup.run(&setup.selkie, &args, &env).await?;
    assert!(ok, "the login must survive two lost connections: {stderr}");
    let credential: Value = serde_json::from_str(&stdout)?;
    assert!(
        credential["status"]["clientCertificateData"]
            .as_str()
            .is_some_and(|pem| pem.starts_with("-----BEGIN CERTIFICATE-----")),
        "{credential}"
    );
    assert!(selkie_lines(&stderr).is_empty(), "retries are silent: {stderr}");
    assert_eq!(front.connections.load(Ordering::SeqCst), 3);
    setup
        .assert_token_credential_requests(1, "after a login that met two lost connections")
        .await?;

    // Every connection closed: the login gives up after its retries, a few seconds in, with
    // one line.
    let dead = DyingBackend::start(setup.proxy.url(), usize::MAX).await?;
    let args = dead.in_front(setup.concierge_args(&setup.path("dead.yaml")));
    let started = std::time::Instant::now();
    let (ok, stdout, stderr) = setup.run(&setup.selkie, &args, &env).await?;
    let took = started.elapsed();
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("could not reach the Concierge"), "{stderr}");
    let attempts = dead.connections.load(Ordering::SeqCst);
    assert_eq!(attempts, 6, "one attempt and five retries");
    assert!(took < Duration::from_secs(20), "gave up after {took:?}");

    // A certificate the CLI does not trust fails at once: retrying cannot cure it.
    let other_ca = CertificateAuthority::new("selkie-test-unrelated-ca")?;
    let relay = DyingBackend::start(setup.proxy.url(), 0).await?;
    let args: Vec<String> = relay
        .in_front(setup.concierge_args(&setup.path("untrusted.yaml")))
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--concierge-ca-bundle-data=") {
                format!("--concierge-ca-bundle-data={}", B64.encode(other_ca.cert_pem()))
            } else {
                arg
            }
        })
        .collect();
    let (ok, _, stderr) = setup.run(&setup.selkie, &args, &env).await?;
    assert!(
        !ok && stderr.contains("could not reach the Concierge"),
        "{stderr}"
    );
    assert_eq!(relay.connections.load(Ordering::SeqCst), 1, "{stderr}");
    setup.assert_token_not_logged()
}
