//! The impersonation proxy end to end: the real kubectl talks to Selkie's proxy, which forwards to
//! the real kube-apiserver with impersonation headers. Identities come from a client certificate
//! of Selkie's signer CA and from a Dex ID token.

use selkie_e2e::{
    dex::{Dex, DexUser},
    proxy::{JwtSpec, Proxy},
    Cluster,
};
use serde_json::Value;

/// What kubectl 1.35 prints for a 401 from kube-apiserver itself (checked against the harness's
/// apiserver with a garbage token): the proxy's refusals must read the same.
const UNAUTHORIZED: &str =
    "error: You must be logged in to the server (the server has asked for the client to provide credentials)";

/// The credential id kube-apiserver gives a client certificate (Kubernetes 1.32 and later):
/// `X509SHA256=` and the lowercase hex SHA-256 of the leaf's DER. Computed here without Selkie's
/// code, to check the proxy against.
pub(crate) fn certificate_credential_id(cert_pem: &str) -> anyhow::Result<String> {
    use rustls_pki_types::{pem::PemObject as _, CertificateDer};
    use sha2::Digest as _;
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())?;
    Ok(format!("X509SHA256={:x}", sha2::Sha256::digest(&der)))
}

fn whoami(json: &str) -> anyhow::Result<(String, Vec<String>)> {
    let review: Value = serde_json::from_str(json)?;
    let user = &review["status"]["userInfo"];
    let groups = user["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    Ok((user["username"].as_str().unwrap_or_default().to_string(), groups))
}
/// Lets the members of `group` list and read namespaces in `cluster` (a ClusterRole `ns-reader`
/// and its binding `<group>-read-ns`): what a freshly logged-in user is shown doing.
pub(crate) async fn grant_namespace_reading(cluster: &Cluster, group: &str) -> anyhow::Result<()> {
    let kubectl = cluster.kubectl();
    kubectl
        .run(&[
            "create",
            "clusterrole",
            "ns-reader",
            "--verb=get,list",
            "--resource=namespaces",
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "clusterrolebinding",
            &format!("{group}-read-ns"),
            "--clusterrole=ns-reader",
            &format!("--group={group}"),
        ])
        .await?;
    Ok(())
}

/// Lets `subject` (a `User` or `Group`) work with ConfigMaps in `namespace`. (The harness runs no
/// controller manager, so the aggregated `edit` ClusterRole has no rules; a Role says it directly.)
pub(crate) async fn grant_configmaps(
    cluster: &Cluster,
    namespace: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    let kubectl = cluster.kubectl();
    let ns = ["-n", namespace];
    kubectl
        .run(
            &[
                &[
                    "create",
                    "role",
                    "configmap-editor",
                    "--verb=get,list,watch,create,update,patch,delete",
                    "--resource=configmaps",
                ][..],
                &ns,
            ]
            .concat(),
        )
        .await?;
    let flag = if kind == "User" { "--user" } else { "--group" };
    kubectl
        .run(
            &[
                &[
                    "create",
                    "rolebinding",
                    "configmap-editor",
                    "--role=configmap-editor",
                    flag,
                    name,
                ][..],
                &ns,
            ]
            .concat(),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_through_the_proxy_with_a_client_certificate() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-cert").await?;
    let team = format!("team-{namespace}");
    grant_configmaps(cluster, &namespace, "Group", &team).await?;
    let proxy = Proxy::start(cluster, &[]).await?;

    let alice = proxy.signer().issue_client("alice", &[&team, "readers"])?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_cert("alice", &alice)?);

    let review = kubectl.run(&["auth", "whoami", "-o", "json"]).await?;
    let (user, groups) = whoami(&review)?;
    assert_eq!(user, "alice");
    assert!(
        groups.contains(&team) && groups.contains(&"readers".to_string()),
        "{groups:?}"
    );
    assert!(groups.contains(&"system:authenticated".to_string()), "{groups:?}");
    // kube-apiserver sees the certificate's credential id, as it would without the proxy (its
    // audit log names the credential), and nothing else in the extras.
    let review: Value = serde_json::from_str(&review)?;
    assert_eq!(
        review["status"]["userInfo"]["extra"],
        serde_json::json!({
            "authentication.kubernetes.io/credential-id": [certificate_credential_id(&alice.cert_pem)?]
        }),
        "{review}"
    );

    // The verbs of everyday use, as alice.
    let ns = ["-n", namespace.as_str()];
    kubectl
        .run(
            &[
                &["create", "configmap", "settings", "--from-literal=color=blue"][..],
                &ns,
            ]
            .concat(),
        )
        .await?;
    let got = kubectl
        .run(
            &[
                &["get", "configmap", "settings", "-o", "jsonpath={.data.color}"][..],
                &ns,
            ]
            .concat(),
        )
        .await?;
    assert_eq!(got, "blue");
    kubectl
        .run(
            &[
                &[
                    "patch",
                    "configmap",
                    "settings",
                    "-p",
                    r#"{"data":{"color":"green"}}"#,
                ][..],
                &ns,
            ]
            .concat(),
        )
        .await?;
    let listed = kubectl
        .run(&[&["get", "configmaps", "-o", "name"][..], &ns].concat())
        .await?;
    assert!(listed.contains("configmap/settings"), "{listed}");
    let managed: Value = serde_json::from_str(
        &cluster
            .kubectl()
            .run(&["get", "configmap", "settings", "-n", &namespace, "-o", "json"])
            .await?,
    )?;
    assert_eq!(managed["data"]["color"], "green", "the patch reached the cluster");
    kubectl
        .run(&[&["delete", "configmap", "settings"][..], &ns].concat())
        .await?;

    // RBAC still applies to the impersonated user, and the 403 comes back intact.
    let forbidden = kubectl
        .output(&["get", "secrets", "-n", "kube-system"], None)
        .await?;
    assert!(!forbidden.success, "alice must not read kube-system secrets");
    assert!(
        forbidden.stderr.contains("Forbidden")
            && forbidden
                .stderr
                .contains(r#"User "alice" cannot list resource "secrets""#),
        "{}",
        forbidden.stderr
    );

    // A certificate from a CA the proxy does not trust identifies nobody.
    let stranger = cluster
        .pki()
        .client_ca
        .issue_client("mallory", &["system:masters"])?;
    let refused = proxy
        .kubectl(&proxy.kubeconfig_with_cert("mallory", &stranger)?)
        .output(&["get", "configmaps", "-n", &namespace], None)
        .await?;
    assert!(!refused.success);
    assert!(refused.stderr.contains(UNAUTHORIZED), "{}", refused.stderr);
    Ok(())
}

#[tokio::test]
async fn kubectl_through_the_proxy_with_a_dex_id_token() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-jwt").await?;
    let user = DexUser {
        email: "pinny@example.com".into(),
        password: "password123".into(),
        user_id: "0a8b2c1d-0000-4000-8000-000000000001".into(),
        groups: vec!["ops".into(), "devs".into()],
    };
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    grant_configmaps(cluster, &namespace, "User", &user.email).await?;
    let proxy = Proxy::start(cluster, &[JwtSpec::for_dex(&dex)]).await?;
    let tokens = dex.password_grant(&user.email, &user.password).await?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_token("pinny", &tokens.id_token)?);

    let (name, groups) = whoami(&kubectl.run(&["auth", "whoami", "-o", "json"]).await?)?;
    assert_eq!(name, user.email);
    assert_eq!(
        groups,
        vec!["ops", "devs", "system:authenticated"],
        "Dex's groups, then the apiserver's own"
    );
    kubectl
        .run(&["create", "configmap", "from-jwt", "-n", &namespace])
        .await?;
    let listed = kubectl
        .run(&["get", "configmaps", "-n", &namespace, "-o", "name"])
        .await?;
    assert!(listed.contains("configmap/from-jwt"), "{listed}");

    // Garbage and a truncated token are 401, worded as kube-apiserver's own.
    for token in ["not-a-token", &tokens.id_token[..tokens.id_token.len() - 4]] {
        let refused = proxy
            .kubectl(&proxy.kubeconfig_with_token("bad", token)?)
            .output(&["get", "configmaps", "-n", &namespace], None)
            .await?;
        assert!(!refused.success);
        assert!(refused.stderr.contains(UNAUTHORIZED), "{}", refused.stderr);
    }

    // The audit log names the user and never the token (lines reach stdout from the writer
    // thread a moment after the answer).
    crate::eventually(std::time::Duration::from_secs(5), || async {
        let log = proxy.log();
        anyhow::ensure!(
            log.contains("selkie::audit") && log.contains(&user.email),
            "no audit line of the user yet"
        );
        Ok(())
    })
    .await?;
    let log = proxy.log();
    assert!(
        !log.contains(&tokens.id_token[..40]),
        "the proxy must never log a token"
    );
    Ok(())
}

#[tokio::test]
async fn anonymous_and_self_asserted_identities_get_nowhere() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-anon").await?;
    let proxy = Proxy::start(cluster, &[]).await?;

    // (kubectl with no credential at all prompts for a password, so this is a plain request.)
    for http2 in [true, false] {
        let (status, refusal) = self_subject_review(&proxy, None, &[], http2).await?;
        assert_eq!(status, 401, "{refusal}");
        assert_eq!(refusal["kind"], "Status");
        assert_eq!(refusal["reason"], "Unauthorized");
    }

    // kubectl --as asks for nested impersonation, which needs an RBAC grant bob does not have
    // (proxy_nested.rs tests the grants).
    let bob = proxy.signer().issue_client("bob", &[])?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_cert("bob", &bob)?);
    let nested = kubectl
        .output(
            &["get", "configmaps", "-n", &namespace, "--as", "system:admin"],
            None,
        )
        .await?;
    assert!(!nested.success);
    assert!(nested.stderr.contains("Forbidden"), "{}", nested.stderr);

    // The signer's certificates never reach kube-apiserver as themselves: the apiserver sees
    // bob only because the proxy impersonates him (the proxy's own user is someone else).
    let (user, _) = whoami(&kubectl.run(&["auth", "whoami", "-o", "json"]).await?)?;
    assert_eq!(user, "bob");
    Ok(())
}

/// An HTTPS client for the proxy with a client certificate (or none), speaking only HTTP/2 or
/// only HTTP/1.1.
pub(crate) type ProxyClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

pub(crate) fn proxy_client(
    proxy: &Proxy,
    credential: Option<&selkie_e2e::pki::CertAndKey>,
    http2: bool,
) -> anyhow::Result<ProxyClient> {
    client_trusting(&proxy.serving_ca().cert_pem(), credential, http2)
}

/// [`proxy_client`], trusting `ca_pem` for the proxy's serving certificate.
pub(crate) fn client_trusting(
    ca_pem: &str,
    credential: Option<&selkie_e2e::pki::CertAndKey>,
    http2: bool,
) -> anyhow::Result<ProxyClient> {
    use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let tls = rustls::ClientConfig::builder().with_root_certificates(roots);
    let tls = match credential {
        Some(credential) => {
            let chain = CertificateDer::pem_slice_iter(credential.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()?;
            tls.with_client_auth_cert(
                chain,
                PrivateKeyDer::from_pem_slice(credential.key_pem.as_bytes())?,
            )?
        }
        None => tls.with_no_client_auth(),
    };
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    let connector = if http2 {
        builder.enable_http2().build()
    } else {
        builder.enable_http1().build()
    };
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(http2)
            .build(connector),
    )
}

/// POSTs a SelfSubjectReview through `client` with `headers` added; returns the status and body.
pub(crate) async fn review_with(
    client: &ProxyClient,
    proxy_url: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, Value)> {
    use http_body_util::{BodyExt, Full};

    let mut request = http::Request::post(format!(
        "{proxy_url}/apis/authentication.k8s.io/v1/selfsubjectreviews"
    ))
    .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;
    let response = client
        .request(request.body(Full::new(bytes::Bytes::from_static(body.as_bytes())))?)
        .await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&body)?))
}

/// [`review_with`] on a new connection.
async fn self_subject_review(
    proxy: &Proxy,
    credential: Option<&selkie_e2e::pki::CertAndKey>,
    headers: &[(&str, &str)],
    http2: bool,
) -> anyhow::Result<(u16, Value)> {
    review_with(&proxy_client(proxy, credential, http2)?, proxy.url(), headers).await
}

#[tokio::test]
async fn client_supplied_identity_headers_never_reach_the_apiserver() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let carol = proxy.signer().issue_client("carol", &["team-c"])?;
    for http2 in [true, false] {
        // A client certificate plus headers that would claim another identity if they reached
        // kube-apiserver: a garbage bearer token (the apiserver would refuse the request) and the
        // front-proxy headers (it would ignore them from the proxy, but they must not travel).
        let (status, review) = self_subject_review(
            &proxy,
            Some(&carol),
            &[
                ("authorization", "Bearer garbage"),
                ("x-remote-user", "system:admin"),
                ("x-remote-group", "system:masters"),
                ("x-forwarded-for", "10.9.8.7"),
            ],
            http2,
        )
        .await?;
        assert_eq!(status, 201, "{review}");
        assert_eq!(review["status"]["userInfo"]["username"], "carol", "{review}");
        let groups = review["status"]["userInfo"]["groups"].to_string();
        assert!(
            groups.contains("team-c") && !groups.contains("system:masters"),
            "{groups}"
        );

        // Impersonation headers carol has no RBAC grant for are refused with a metav1.Status,
        // not dropped silently.
        let (status, refusal) = self_subject_review(
            &proxy,
            Some(&carol),
            &[("impersonate-user", "system:admin")],
            http2,
        )
        .await?;
        assert_eq!(status, 403);
        assert_eq!(refusal["kind"], "Status");
        assert_eq!(refusal["reason"], "Forbidden");

        // A malformed Impersonate-Extra key is a 400.
        let (status, refusal) =
            self_subject_review(&proxy, Some(&carol), &[("impersonate-extra-%zz", "x")], http2).await?;
        assert_eq!(status, 400, "{refusal}");
        assert_eq!(refusal["reason"], "BadRequest");
    }
    Ok(())
}

/// A list far larger than the proxy holds back at once (`selkie_proxy::coalesce`, 64 KiB) reaches
/// kubectl through the proxy whole and in order: the same objects as kube-apiserver gives the
/// admin directly, over kubectl's usual HTTP/2 and over HTTP/1.1 (client-go's `DISABLE_HTTP2`).
#[tokio::test]
async fn a_list_of_several_hundred_kib_arrives_whole_through_the_proxy() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-large-list").await?;
    grant_configmaps(cluster, &namespace, "User", "lister").await?;
    // 48 ConfigMaps of ~8 KiB each, every byte position distinct enough that a lost, repeated or
    // reordered chunk changes what is parsed.
    let manifests: String = (0..48)
        .map(|i| {
            let value: String = (0..8192).map(|j| char::from(b'a' + ((i * 7 + j) % 26) as u8)).collect();
            format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big-{i:02}\ndata:\n  value: {value}\n")
        })
        .collect();
    let applied = cluster
        .kubectl()
        .output(&["apply", "-n", &namespace, "-f", "-"], Some(&manifests))
        .await?;
    anyhow::ensure!(applied.success, "kubectl apply: {}", applied.stderr);

    let proxy = Proxy::start(cluster, &[]).await?;
    let lister = proxy.signer().issue_client("lister", &[])?;
    let kubeconfig = proxy.kubeconfig_with_cert("lister", &lister)?;
    let kubectl = proxy.kubectl(&kubeconfig);
    let path = format!("/api/v1/namespaces/{namespace}/configmaps");
    let items = |json: &str| -> anyhow::Result<Vec<(String, String)>> {
        let list: Value = serde_json::from_str(json)?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| {
                let name = item["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let value = item["data"]["value"].as_str().unwrap_or_default().to_string();
                (name, value)
            })
            .collect())
    };

    let direct = cluster.kubectl().run(&["get", "--raw", &path]).await?;
    let expected = items(&direct)?;
    assert_eq!(expected.len(), 48, "the cluster holds the 48 ConfigMaps");
    assert!(direct.len() > 5 * 64 * 1024, "the list is {} bytes", direct.len());
    let raw = kubectl.run(&["get", "--raw", &path]).await?;
    assert_eq!(items(&raw)?, expected, "get --raw through the proxy");
    let listed = kubectl
        .run(&["get", "configmaps", "-n", &namespace, "-o", "json"])
        .await?;
    assert_eq!(items(&listed)?, expected, "get -o json through the proxy");
    let http1 = tokio::process::Command::new(kubectl.binary())
        .args(["get", "--raw", &path])
        .env("KUBECONFIG", &kubeconfig)
        .env("DISABLE_HTTP2", "1")
        .kill_on_drop(true)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&http1.stderr);
    anyhow::ensure!(http1.status.success(), "kubectl over HTTP/1.1: {stderr}");
    assert!(stderr.contains("HTTP2 has been explicitly disabled"), "{stderr}");
    assert_eq!(
        items(&String::from_utf8(http1.stdout)?)?,
        expected,
        "get --raw over HTTP/1.1 through the proxy"
    );
    Ok(())
}
