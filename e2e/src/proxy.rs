//! Selkie's impersonation proxy (`selkie-concierge --config FILE`) in front of a harness
//! [`Cluster`], started as its own process exactly as a user runs it.
//!
//! The proxy authenticates to kube-apiserver with a client certificate from the cluster's client
//! CA for [`PROXY_USER`], who may impersonate (a ClusterRole applied by [`Proxy::start`]). Its
//! listener has its own serving CA, and it trusts client certificates from its own signer CA
//! ([`Proxy::signer`]), the way the Concierge issues them.

use std::{
    ffi::OsString,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

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

/// RBAC for [`PROXY_USER`]: impersonate anyone (what the impersonation proxy is for).
const PROXY_RBAC: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
   "metadata": {"name": "selkie-impersonation-proxy"},
   "rules": [{"apiGroups": [""], "resources": ["users", "groups", "serviceaccounts"], "verbs": ["impersonate"]},
             {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/*", "uids"], "verbs": ["impersonate"]},
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
}

impl Proxy {
    /// Builds `selkie-concierge` if needed, grants [`PROXY_USER`] the right to impersonate, and
    /// starts the proxy in front of `cluster` with `jwt` authenticators. Returns once it accepts
    /// connections.
    pub async fn start(cluster: &Cluster, jwt: &[JwtSpec]) -> Result<Proxy, HarnessError> {
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
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| HarnessError::io("finding a free port for the proxy", e))?
            .port();
        let config = serde_json::json!({
            "listen": format!("127.0.0.1:{port}"),
            "servingCertificate": {"certFile": path("serving.crt"), "keyFile": path("serving.key")},
            "upstream": {
                "url": cluster.server_url(),
                "caFile": path("apiserver-ca.crt"),
                "clientCertificate": {"certFile": path("upstream.crt"), "keyFile": path("upstream.key")},
            },
            "clientCertificateCaFiles": [path("signer-ca.crt")],
            "jwtAuthenticators": jwt_authenticators,
        });
        let config_path = path("proxy.yaml");
        write("proxy.yaml", &config.to_string())?;

        let args = [
            OsString::from("--config"),
            config_path.clone().into_os_string(),
            OsString::from("--watch-interval"),
            OsString::from("200ms"),
        ];
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
        Ok(Proxy {
            process,
            url: format!("https://127.0.0.1:{port}"),
            serving_ca,
            signer,
            kubectl_binary: cluster.kubectl().binary().to_path_buf(),
            config_path,
            config,
            dir,
        })
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

static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Builds `selkie-concierge` from this source tree (a no-op when it is up to date) and returns its
/// path, once per process.
fn concierge_binary() -> Result<PathBuf, HarnessError> {
    BINARY
        .get_or_init(|| {
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let output = Command::new(&cargo)
                .current_dir(&workspace)
                .args([
                    "build",
                    "--locked",
                    "-p",
                    "selkie-concierge",
                    "--bin",
                    "selkie-concierge",
                ])
                .args(["--message-format", "json-render-diagnostics"])
                .output()
                .map_err(|e| format!("running cargo build: {e}"))?;
            if !output.status.success() {
                return Err(String::from_utf8_lossy(&output.stderr).into_owned());
            }
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .find_map(|message| {
                    (message["target"]["name"] == "selkie-concierge")
                        .then(|| message["executable"].as_str().map(PathBuf::from))
                        .flatten()
                })
                .ok_or_else(|| "cargo build did not report the selkie-concierge executable".to_string())
        })
        .clone()
        .map_err(|tail| HarnessError::Build {
            command: "cargo build -p selkie-concierge".into(),
            status: "failed".into(),
            tail,
        })
}
