//! Selkie's impersonation proxy (`selkie-concierge --config FILE`) in front of a harness
//! [`Cluster`], started as its own process exactly as a user runs it.
//!
//! The proxy authenticates to kube-apiserver with a client certificate from the cluster's client
//! CA for [`PROXY_USER`], who may impersonate (a ClusterRole applied by [`Proxy::start`]). Its
//! listener has its own serving CA, and it trusts client certificates from its own signer CA
//! ([`Proxy::signer`]), the way the Concierge issues them.
//!
//! It also serves its operations port ([`Proxy::operations_get`]), and shuts down quickly: no grace
//! period and a 3 s drain timeout, unless a test configures otherwise ([`Proxy::start_configured`]).

use std::{
    ffi::OsString,
    net::TcpStream,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use nix::{sys::signal, unistd::Pid};

use crate::{
    cluster::{write_kubeconfig, write_kubeconfig_for_user, write_private_file},
    kubectl::Kubectl,
    pki::{CertAndKey, CertificateAuthority},
    process::ManagedProcess,
    Cluster, HarnessError,
};

/// The user the proxy authenticates to kube-apiserver as.
pub const PROXY_USER: &str = "selkie-impersonation-proxy";

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// RBAC for [`PROXY_USER`]: impersonate anyone (what the impersonation proxy is for), and review
/// access and tokens (nested impersonation, `upstream.tokenReview`).
const PROXY_RBAC: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
   "metadata": {"name": "selkie-impersonation-proxy"},
   "rules": [{"apiGroups": [""], "resources": ["users", "groups", "serviceaccounts"], "verbs": ["impersonate"]},
             {"apiGroups": ["authentication.k8s.io"], "resources": ["*"], "verbs": ["impersonate"]},
             {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
             {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]},
  {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
   "metadata": {"name": "selkie-impersonation-proxy"},
   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "selkie-impersonation-proxy"},
   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "selkie-impersonation-proxy"}]}
]}"#;

/// A JWT authenticator for the proxy's configuration (Pinniped's JWTAuthenticator fields).
#[derive(Debug, Clone)]
pub struct JwtSpec {
    /// Name.
    pub name: String,
    /// Issuer URL.
    pub issuer: String,
    /// Audience.
    pub audience: String,
    /// Username claim.
    pub username_claim: String,
    /// Groups claim.
    pub groups_claim: String,
    /// The issuer's CA bundle.
    pub ca_pem: String,
}

impl JwtSpec {
    /// The authenticator `dex` for `dex`'s ID tokens (audience: the test client), the user named
    /// by the `email` claim and the groups by `groups`.
    pub fn for_dex(dex: &crate::dex::Dex) -> JwtSpec {
        JwtSpec {
            name: "dex".into(),
            issuer: dex.issuer().into(),
            audience: crate::dex::CLIENT_ID.into(),
            username_claim: "email".into(),
            groups_claim: "groups".into(),
            ca_pem: dex.ca_pem(),
        }
    }
}

/// A running proxy.
pub struct Proxy {
    process: ManagedProcess,
    dir: tempfile::TempDir,
    url: String,
    serving_ca: CertificateAuthority,
    signer: CertificateAuthority,
    kubectl_binary: PathBuf,
    config_path: PathBuf,
    config: serde_json::Value,
    operations_url: Option<String>,
}

impl Proxy {
    /// Builds `selkie-concierge` if needed, grants [`PROXY_USER`] the right to impersonate, and
    /// starts the proxy in front of `cluster` with `jwt` authenticators. Returns once it accepts
    /// connections and its `/readyz` answers 200.
    pub async fn start(cluster: &Cluster, jwt: &[JwtSpec]) -> Result<Proxy, HarnessError> {
        Self::start_configured(cluster, jwt, |_| {}).await
    }

    /// Like [`Proxy::start`], letting `customize` change the configuration (the JSON form of the
    /// YAML file) before the proxy reads it. Without an `operationsListen`, start-up waits only
    /// for the listener.
    pub async fn start_configured(
        cluster: &Cluster,
        jwt: &[JwtSpec],
        customize: impl FnOnce(&mut serde_json::Value),
    ) -> Result<Proxy, HarnessError> {
        Self::start_with_args(cluster, jwt, customize, &[]).await
    }

    /// Like [`Proxy::start_configured`], with more command-line arguments for `selkie-concierge`
    /// (e.g. `--control-plane FILE`).
    pub async fn start_with_args(
        cluster: &Cluster,
        jwt: &[JwtSpec],
        customize: impl FnOnce(&mut serde_json::Value),
        extra_args: &[OsString],
    ) -> Result<Proxy, HarnessError> {
        crate::install_crypto_provider();
        let binary = concierge_binary()?;
        {
            // Concurrent client-side applies of a new object race to create it; one at a time,
            // every apply after the first is a no-op.
            static RBAC: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
            let _one_at_a_time = RBAC.lock().await;
            cluster
                .kubectl()
                .run_with_stdin(&["apply", "-f", "-"], Some(PROXY_RBAC))
                .await?;
        }

        let dir = tempfile::Builder::new()
            .prefix("selkie-proxy-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the proxy's directory", e))?;
        let path = |name: &str| dir.path().join(name);
        let write = |name: &str, contents: &str| write_private_file(&path(name), contents);
        let serving_ca = CertificateAuthority::new("selkie-test-proxy-serving-ca")?;
        let serving = serving_ca.issue_serving("selkie-proxy", &["127.0.0.1", "localhost"])?;
        write("serving.crt", &serving.cert_pem)?;
        write("serving.key", &serving.key_pem)?;
        let signer = CertificateAuthority::new("selkie-test-signer")?;
        write("signer-ca.crt", &signer.cert_pem())?;
        write("signer-ca.key", &signer.key_pem())?;
        let upstream_credential = cluster.pki().client_ca.issue_client(PROXY_USER, &[])?;
        write("upstream.crt", &upstream_credential.cert_pem)?;
        write("upstream.key", &upstream_credential.key_pem)?;
        write("apiserver-ca.crt", &cluster.pki().server_ca.cert_pem())?;

        let mut jwt_authenticators = Vec::new();
        for (i, spec) in jwt.iter().enumerate() {
            let ca_file = format!("jwt-{i}-ca.crt");
            write(&ca_file, &spec.ca_pem)?;
            jwt_authenticators.push(serde_json::json!({
                "name": spec.name, "issuer": spec.issuer, "audience": spec.audience,
                "claims": {"username": spec.username_claim, "groups": spec.groups_claim},
                "caFile": path(&ca_file),
            }));
        }
        let (port, operations_port) = (crate::free_port()?, crate::free_port()?);
        let mut config = serde_json::json!({
            "listen": format!("127.0.0.1:{port}"),
            "operationsListen": format!("127.0.0.1:{operations_port}"),
            "shutdown": {"gracePeriodSeconds": 0, "drainTimeoutSeconds": 3},
            "servingCertificate": {"certFile": path("serving.crt"), "keyFile": path("serving.key")},
            "upstream": {
                "url": cluster.server_url(),
                "caFile": path("apiserver-ca.crt"),
                "clientCertificate": {"certFile": path("upstream.crt"), "keyFile": path("upstream.key")},
            },
            "clientCertificateCaFiles": [path("signer-ca.crt")],
            // The proxy answers TokenCredentialRequests with certificates of its signer CA, as
            // the Concierge does.
            "credentialSigner": {"certFile": path("signer-ca.crt"), "keyFile": path("signer-ca.key")},
            "jwtAuthenticators": jwt_authenticators,
        });
        customize(&mut config);
        let operations_url = config["operationsListen"]
            .as_str()
            .map(|address| format!("http://{address}"));
        let config_path = path("proxy.yaml");
        write("proxy.yaml", &config.to_string())?;

        let mut args = vec![
            OsString::from("--config"),
            config_path.clone().into_os_string(),
            OsString::from("--watch-interval"),
            OsString::from("200ms"),
        ];
        args.extend(extra_args.iter().cloned());
        let mut process = ManagedProcess::spawn("selkie-concierge", &binary, &args, path("proxy.log"))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            process.check_running("during start-up")?;
            if Instant::now() >= deadline {
                return Err(
                    process.failure(format!("did not listen on port {port} within {READY_TIMEOUT:?}"))
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut proxy = Proxy {
            process,
            url: format!("https://127.0.0.1:{port}"),
            serving_ca,
            signer,
            kubectl_binary: cluster.kubectl().binary().to_path_buf(),
            config_path,
            config,
            dir,
            operations_url,
        };
        if proxy.operations_url.is_some() {
            loop {
                match proxy.operations_get("/readyz").await {
                    Ok((200, _)) => break,
                    Ok(_) | Err(_) if Instant::now() < deadline => {}
                    Ok((status, body)) => {
                        return Err(proxy.process.failure(format!(
                            "answered /readyz with {status} {body:?} after {READY_TIMEOUT:?}"
                        )))
                    }
                    Err(error) => return Err(error),
                }
                proxy.process.check_running("during start-up")?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(proxy)
    }

    /// The process id of `selkie-concierge` (for CPU accounting in benchmarks).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// `http://127.0.0.1:<port>` of the operations port, if the configuration has one.
    pub fn operations_url(&self) -> Option<&str> {
        self.operations_url.as_deref()
    }

    /// `GET path` on the operations port, on a connection of its own (as a kubelet probe or a
    /// Prometheus scrape would): the status and the body. Fails if the port is not configured,
    /// does not answer within 10 s, or the connection fails (as it does once the port is closed).
    pub async fn operations_get(&self, path: &str) -> Result<(u16, String), HarnessError> {
        let base = self.operations_url.as_deref().ok_or_else(|| {
            HarnessError::kube(
                "querying the operations port",
                "the proxy has no operationsListen",
            )
        })?;
        let url = format!("{base}{path}");
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http::<Full<Bytes>>();
        let request = http::Request::get(&url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| HarnessError::kube(format!("building GET {url}"), e))?;
        let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
            .await
            .map_err(|_| HarnessError::kube(format!("GET {url}"), "no answer within 10s"))?
            .map_err(|e| HarnessError::kube(format!("GET {url}"), e))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| HarnessError::kube(format!("reading the body of GET {url}"), e))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// Sends the proxy SIGTERM (what Kubernetes does to a pod it stops).
    pub fn terminate(&self) -> Result<(), HarnessError> {
        let pid =
            i32::try_from(self.process.pid()).map_err(|e| HarnessError::kube("signalling the proxy", e))?;
        signal::kill(Pid::from_raw(pid), signal::Signal::SIGTERM)
            .map_err(|e| HarnessError::io("sending SIGTERM to the proxy", e.into()))
    }

    /// Waits up to `timeout` for the proxy to exit and returns how it ended; fails with the log
    /// tail if it is still running then.
    pub async fn wait_for_exit(&mut self, timeout: Duration) -> Result<ExitStatus, HarnessError> {
        self.process.wait_for_exit(timeout).await
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA of the proxy's serving certificate.
    pub fn serving_ca(&self) -> &CertificateAuthority {
        &self.serving_ca
    }

    /// The CA whose client certificates the proxy accepts as identities.
    pub fn signer(&self) -> &CertificateAuthority {
        &self.signer
    }

    /// A kubeconfig that reaches the cluster through the proxy with a client certificate.
    pub fn kubeconfig_with_cert(&self, name: &str, credential: &CertAndKey) -> Result<PathBuf, HarnessError> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        write_kubeconfig(&path, &self.url, &self.serving_ca.cert_pem(), name, credential)?;
        Ok(path)
    }

    /// A kubeconfig that reaches the cluster through the proxy with a bearer token.
    pub fn kubeconfig_with_token(&self, name: &str, token: &str) -> Result<PathBuf, HarnessError> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        let token = serde_json::json!({"token": token});
        write_kubeconfig_for_user(&path, &self.url, &self.serving_ca.cert_pem(), name, token)?;
        Ok(path)
    }

    /// kubectl with `kubeconfig`.
    pub fn kubectl(&self, kubeconfig: &Path) -> Kubectl {
        Kubectl::new(&self.kubectl_binary, kubeconfig)
    }

    /// The proxy's log so far (JSON lines; audit lines have target `selkie::audit`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default()
    }

    /// The configuration file, as written.
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// Rewrites the configuration file (the proxy picks it up within its watch interval).
    pub fn write_config(&mut self, config: serde_json::Value) -> Result<(), HarnessError> {
        replace_file(&self.config_path, &config.to_string())?;
        self.config = config;
        Ok(())
    }

    /// Issues a serving certificate from a new CA and writes it over the current one (certificate
    /// and key each replaced atomically); [`Proxy::serving_ca`] is then the new CA. The proxy
    /// serves it within its watch interval.
    pub fn rotate_serving_certificate(&mut self) -> Result<(), HarnessError> {
        let ca = CertificateAuthority::new("selkie-test-proxy-serving-ca-rotated")?;
        let serving = ca.issue_serving("selkie-proxy", &["127.0.0.1", "localhost"])?;
        for (name, contents) in [
            ("serving.key", &serving.key_pem),
            ("serving.crt", &serving.cert_pem),
        ] {
            replace_file(&self.dir.path().join(name), contents)?;
        }
        self.serving_ca = ca;
        Ok(())
    }

    /// Fails with the log tail if the proxy has exited.
    pub fn check_running(&mut self) -> Result<(), HarnessError> {
        self.process.check_running("while in use")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(5));
    }
}

/// Replaces `path` with `contents` by writing a sibling and renaming it over, as a
/// config-management tool would, so the proxy never reads half a file.
fn replace_file(path: &Path, contents: &str) -> Result<(), HarnessError> {
    let temporary = path.with_extension("tmp");
    write_private_file(&temporary, contents)?;
    std::fs::rename(&temporary, path)
        .map_err(|e| HarnessError::io(format!("replacing {}", path.display()), e))
}

/// Builds `selkie-concierge` from this source tree (a no-op when it is up to date).
fn concierge_binary() -> Result<PathBuf, HarnessError> {
    crate::process::workspace_binary("selkie-concierge", "selkie-concierge")
}
