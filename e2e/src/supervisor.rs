//! The Selkie Supervisor as a test runs it: its CRDs installed, a namespace with a serving
//! certificate Secret, an identity provider ([`Upstream`]: an OIDCIdentityProvider for a [`Dex`]
//! or [`Keycloak`] — the Supervisor is a confidential client there and may use the password grant
//! — or an LDAPIdentityProvider for a [`crate::ldap::Slapd`]), a FederationDomain naming it, and the
//! `selkie-supervisor` process (a workspace binary) with a kubeconfig for the cluster, serving
//! HTTPS on a loopback port. Stopped on drop.

use std::{ffi::OsString, path::PathBuf, process::ExitStatus, time::Duration};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use selkie_oidc::https::{HttpsClient, TlsOptions};

use crate::{
    clock::TestClock,
    dex::{Dex, CLIENT_ID, CLIENT_SECRET},
    keycloak::Keycloak,
    pki::{CertAndKey, CertificateAuthority},
    process::{workspace_binary, ManagedProcess},
    Cluster, HarnessError,
};

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The APIService of the Supervisor's aggregated API.
pub const CLIENT_SECRET_API_SERVICE: &str = "v1alpha1.clientsecret.supervisor.pinniped.dev";

/// Deletes the client-secret APIService when dropped (an unreachable APIService would linger in
/// every later discovery).
struct ApiServiceGuard {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Drop for ApiServiceGuard {
    fn drop(&mut self) {
        let _best_effort = std::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "apiservice",
                CLIENT_SECRET_API_SERVICE,
            ])
            .output();
    }
}

/// A running Supervisor.
pub struct Supervisor {
    process: ManagedProcess,
    dir: tempfile::TempDir,
    namespace: String,
    issuer: String,
    ca: CertificateAuthority,
    binary: PathBuf,
    config: serde_json::Value,
    replicas: Vec<ManagedProcess>,
    /// The identity providers' display names (a replica serves once it lists them all).
    idp_names: Vec<String>,
    /// The aggregated API's APIService of an installed Supervisor, deleted on drop.
    api_service: Option<ApiServiceGuard>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("issuer", &self.issuer)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// An upstream identity provider of a test's Supervisor: the identity provider resource (and
/// its Secret) the harness creates for it.
pub trait Upstream {
    /// The resource's name.
    fn name(&self) -> &str;
    /// The resource's kind (`OIDCIdentityProvider`, `LDAPIdentityProvider`, ...).
    fn kind(&self) -> &str {
        "OIDCIdentityProvider"
    }
    /// The resource's API group: Pinniped's `idp.supervisor.pinniped.dev` for the kinds Pinniped
    /// has, Selkie's `idp.supervisor.selkie.dev` for its own (`SAMLIdentityProvider`).
    fn api_group(&self) -> &str {
        "idp.supervisor.pinniped.dev"
    }
    /// The YAML of the resource and its Secrets in `namespace`.
    fn manifests(&self, namespace: &str) -> String;
}

/// The YAML of a FederationDomain's whole configuration in `namespace`: the TLS Secret
/// `tls.0` holding the serving certificate `tls.1`, every upstream's resources, and the
/// FederationDomain `name` at `issuer` listing the upstreams with their display names, in order.
pub fn federation_domain_manifests(
    namespace: &str,
    name: &str,
    issuer: &str,
    tls: (&str, &CertAndKey),
    upstreams: &[(&dyn Upstream, &str)],
) -> String {
    let (tls_secret, serving) = tls;
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {tls_secret}, namespace: {namespace}}}
type: kubernetes.io/tls
data: {{tls.crt: {cert}, tls.key: {key}}}
---
{upstream_manifests}---
apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: FederationDomain
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  issuer: {issuer}
  identityProviders:
{references}"#,
        cert = B64.encode(&serving.cert_pem),
        key = B64.encode(&serving.key_pem),
        upstream_manifests = upstreams
            .iter()
            .map(|(upstream, _)| upstream.manifests(namespace))
            .collect::<Vec<_>>()
            .join("---\n"),
        references = upstreams
            .iter()
            .map(|(upstream, display_name)| format!(
                "  - displayName: {display_name:?}\n    objectRef: {{apiGroup: {}, kind: {}, name: {}}}\n",
                upstream.api_group(),
                upstream.kind(),
                upstream.name()
            ))
            .collect::<String>(),
    )
}

/// An OIDCIdentityProvider `name` for an upstream at `issuer` (its serving CA `ca_pem`) where the
/// Supervisor is the confidential client `client_id`/`client_secret` (the Secret
/// `<name>-client`), asking for `scopes` besides `openid`; username from `email`, groups from
/// `groups`, the password grant allowed.
fn oidc_manifests(
    namespace: &str,
    name: &str,
    issuer: &str,
    ca_pem: &str,
    (client_id, client_secret): (&str, &str),
    scopes: &[&str],
) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-client, namespace: {namespace}}}
type: secrets.pinniped.dev/oidc-client
stringData: {{clientID: {client_id}, clientSecret: {client_secret}}}
---
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: OIDCIdentityProvider
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  issuer: {issuer}
  tls: {{certificateAuthorityData: {ca}}}
  client: {{secretName: {name}-client}}
  authorizationConfig:
    additionalScopes: {scopes:?}
    allowPasswordGrant: true
  claims: {{username: email, groups: groups}}
"#,
        ca = B64.encode(ca_pem),
    )
}

impl Upstream for Dex {
    fn name(&self) -> &str {
        "dex"
    }
    fn manifests(&self, namespace: &str) -> String {
        dex_manifests(self, namespace, self.name())
    }
}

/// The YAML of an OIDCIdentityProvider `name` for `dex` and its client Secret `<name>-client` in
/// `namespace`, as [`Upstream::manifests`] makes Dex's (`dex`): for a Supervisor with many
/// identity providers on one Dex.
pub fn dex_manifests(dex: &Dex, namespace: &str, name: &str) -> String {
    oidc_manifests(
        namespace,
        name,
        dex.issuer(),
        &dex.ca_pem(),
        (CLIENT_ID, CLIENT_SECRET),
        &["offline_access", "email", "groups"],
    )
}

impl Upstream for Keycloak {
    fn name(&self) -> &str {
        "keycloak"
    }
    fn manifests(&self, namespace: &str) -> String {
        // Keycloak refuses scopes it has no client scope for; its groups come from a mapper.
        oidc_manifests(
            namespace,
            self.name(),
            self.issuer(),
            &self.ca_pem(),
            (crate::keycloak::CLIENT_ID, crate::keycloak::CLIENT_SECRET),
            &["offline_access", "email"],
        )
    }
}

/// A directory identity provider `name` of `kind` in `namespace`: its `kubernetes.io/basic-auth`
/// bind Secret `<name>-bind` for `bind` (DN, password), and the resource for `host` trusting
/// `ca_pem`, with `searches` (the spec's YAML lines after `bind`, indented by two).
fn directory_manifests(
    namespace: &str,
    (kind, name): (&str, &str),
    (bind_dn, bind_password): (&str, &str),
    host: &str,
    ca_pem: &str,
    searches: &str,
) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-bind, namespace: {namespace}}}
type: kubernetes.io/basic-auth
stringData: {{username: "{bind_dn}", password: "{bind_password}"}}
---
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: {kind}
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  host: "{host}"
  tls: {{certificateAuthorityData: {ca}}}
  bind: {{secretName: {name}-bind}}
{searches}"#,
        ca = B64.encode(ca_pem),
    )
}

/// An LDAPIdentityProvider `openldap` for slapd's `ldaps://` port: users by `uid` under
/// [`crate::ldap::USERS_BASE`] (username `uid`, UID `uidNumber`), groups by `member` DN under
/// [`crate::ldap::GROUPS_BASE`] named by `cn`; bound as [`crate::ldap::BIND_DN`] (the Secret
/// `openldap-bind`).
impl Upstream for crate::ldap::Slapd {
    fn name(&self) -> &str {
        "openldap"
    }
    fn kind(&self) -> &str {
        "LDAPIdentityProvider"
    }
    fn manifests(&self, namespace: &str) -> String {
        use crate::ldap::{BIND_DN, BIND_PASSWORD, GROUPS_BASE, USERS_BASE};
        directory_manifests(
            namespace,
            (self.kind(), self.name()),
            (BIND_DN, BIND_PASSWORD),
            &self.ldaps_host(),
            &self.ca_pem(),
            &format!(
                "  userSearch: {{base: \"{USERS_BASE}\", filter: \"uid={{}}\", attributes: {{username: uid, uid: uidNumber}}}}\n  \
                 groupSearch: {{base: \"{GROUPS_BASE}\", attributes: {{groupName: cn}}}}\n"
            ),
        )
    }
}

/// An ActiveDirectoryIdentityProvider `samba` for the domain controller, with Pinniped's Active
/// Directory defaults (search bases from `defaultNamingContext`, users by `sAMAccountName`,
/// `mail` or `userPrincipalName`, nested groups); bound as the domain administrator (the Secret
/// `samba-bind`).
impl Upstream for crate::samba::SambaDc {
    fn name(&self) -> &str {
        "samba"
    }
    fn kind(&self) -> &str {
        "ActiveDirectoryIdentityProvider"
    }
    fn manifests(&self, namespace: &str) -> String {
        use crate::samba::{ADMIN_DN, ADMIN_PASSWORD};
        directory_manifests(
            namespace,
            (self.kind(), self.name()),
            (ADMIN_DN, ADMIN_PASSWORD),
            &self.ldaps_host(),
            &self.ca_pem(),
            "",
        )
    }
}

/// The configuration of a Supervisor [`Supervisor::start`] runs in `namespace` (before settings).
fn base_config(cluster: &Cluster, namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "namespace": namespace,
        "namePrefix": format!("supervisor-{namespace}"),
        "defaultTLSCertificateSecret": "supervisor-tls",
        "kubeconfig": cluster.admin_kubeconfig(),
    })
}

impl Supervisor {
    /// Sets up `namespace` (which must exist) and starts the Supervisor: the identity provider
    /// for `upstream` ([`Upstream`]), and
    /// the FederationDomain `federation-domain` with issuer `https://127.0.0.1:<port>/<namespace>`
    /// listing it as `idp_display_name`. Returns once the issuer is served with the identity
    /// provider in its identity-provider discovery.
    pub async fn start(
        cluster: &Cluster,
        namespace: &str,
        upstream: &dyn Upstream,
        idp_display_name: &str,
    ) -> Result<Self, HarnessError> {
        Self::start_on(
            cluster,
            namespace,
            upstream,
            idp_display_name,
            crate::free_port()?,
        )
        .await
    }

    /// The issuer a Supervisor started on `port` for `namespace` has (to register its callback at
    /// Dex before it starts).
    pub fn issuer_for(port: u16, namespace: &str) -> String {
        format!("https://127.0.0.1:{port}/{namespace}")
    }

    /// [`Supervisor::start`] on a chosen loopback `port`.
    pub async fn start_on(
        cluster: &Cluster,
        namespace: &str,
        upstream: &dyn Upstream,
        idp_display_name: &str,
        port: u16,
    ) -> Result<Self, HarnessError> {
        Self::start_with(
            cluster,
            namespace,
            upstream,
            idp_display_name,
            port,
            serde_json::json!({}),
        )
        .await
    }

    /// [`Supervisor::start_on`] with `settings` (an object of configuration-file keys, such as
    /// `signingKeyRotationInterval`, or `sessionGarbageCollectionInterval`, otherwise `1s`) added to
    /// the configuration.
    pub async fn start_with(
        cluster: &Cluster,
        namespace: &str,
        upstream: &dyn Upstream,
        idp_display_name: &str,
        port: u16,
        settings: serde_json::Value,
    ) -> Result<Self, HarnessError> {
        Self::start_many(
            cluster,
            namespace,
            &[(upstream, idp_display_name)],
            port,
            settings,
        )
        .await
    }

    /// [`Supervisor::start`] with its wall clock `clock` ([`TestClock`]), which the test moves
    /// (replicas added later keep the real time).
    pub async fn start_with_clock(
        cluster: &Cluster,
        namespace: &str,
        upstream: &dyn Upstream,
        idp_display_name: &str,
        clock: &TestClock,
    ) -> Result<Self, HarnessError> {
        let config = base_config(cluster, namespace);
        let port = crate::free_port()?;
        Self::launch(
            cluster,
            namespace,
            &[(upstream, idp_display_name)],
            port,
            config,
            Some(clock),
        )
        .await
    }

    /// [`Supervisor::start_with`] with several identity providers, each `(upstream, display name)`,
    /// listed in the FederationDomain in that order.
    pub async fn start_many(
        cluster: &Cluster,
        namespace: &str,
        upstreams: &[(&dyn Upstream, &str)],
        port: u16,
        settings: serde_json::Value,
    ) -> Result<Self, HarnessError> {
        let mut config = base_config(cluster, namespace);
        for (key, value) in settings.as_object().into_iter().flatten() {
            config[key] = value.clone();
        }
        Self::launch(cluster, namespace, upstreams, port, config, None).await
    }

    /// Installs the Supervisor from its manifests (`conf/crds/`, `conf/install/supervisor.yaml`)
    /// and runs it — as the Deployment would — with the configuration of the manifests'
    /// ConfigMap and the token of their service account, so it has exactly the permissions they
    /// grant; with the default TLS Secret the manifests name, and an identity provider and
    /// FederationDomain as [`Supervisor::start`] creates them (in `pinniped-supervisor`). Its
    /// aggregated API (OIDCClientSecretRequest) is reached through kube-apiserver as the
    /// manifests register it, with the Service `pinniped-supervisor-api` turned into an
    /// `ExternalName` to `localhost` and the APIService pointed at a loopback port (the loopback
    /// clusters have no kubelet); returns once that APIService is Available, and deletes it when dropped.
    /// One test at a time may install (one namespace, one APIService per cluster).
    pub async fn install(
        cluster: &Cluster,
        upstream: &dyn Upstream,
        idp_display_name: &str,
    ) -> Result<Self, HarnessError> {
        Self::install_on(cluster, upstream, idp_display_name, crate::free_port()?).await
    }

    /// [`Supervisor::install`] serving HTTPS on `port` (so an upstream can be told the issuer's
    /// callback beforehand: [`Supervisor::issuer_for`] with `pinniped-supervisor`).
    pub async fn install_on(
        cluster: &Cluster,
        upstream: &dyn Upstream,
        idp_display_name: &str,
        port: u16,
    ) -> Result<Self, HarnessError> {
        Self::install_with(cluster, upstream, idp_display_name, port, serde_json::json!({})).await
    }

    /// [`Supervisor::install_on`] with `settings` (an object of configuration-file keys, such as
    /// `listenerLimits`) set over the manifests' configuration, as an admin sets them through the
    /// chart's values.
    pub async fn install_with(
        cluster: &Cluster,
        upstream: &dyn Upstream,
        idp_display_name: &str,
        port: u16,
        settings: serde_json::Value,
    ) -> Result<Self, HarnessError> {
        const NAMESPACE: &str = "pinniped-supervisor";
        crate::crds::install_conf_crds(cluster).await?;
        let manifest =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/install/supervisor.yaml");
        let kubectl = cluster.kubectl();
        kubectl.run(&["apply", "-f", &manifest.to_string_lossy()]).await?;
        let yaml = kubectl
            .run(&[
                "get",
                "configmap",
                "pinniped-supervisor-static-config",
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.data.supervisor\\.yaml}",
            ])
            .await?;
        let mut config: serde_json::Value = serde_yaml::from_str(&yaml)
            .map_err(|e| HarnessError::NotReady(format!("the manifests' supervisor.yaml: {e}")))?;
        for (key, value) in settings.as_object().into_iter().flatten() {
            config[key] = value.clone();
        }
        let token = kubectl
            .run(&[
                "create",
                "token",
                "pinniped-supervisor",
                "-n",
                NAMESPACE,
                "--duration=2h",
            ])
            .await?
            .trim()
            .to_string();
        let account = tempfile::Builder::new()
            .prefix("supervisor-account-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a directory", e))?
            .keep();
        let kubeconfig = account.join("account.kubeconfig");
        crate::cluster::write_kubeconfig_for_user(
            &kubeconfig,
            cluster.server_url(),
            &cluster.pki().server_ca.cert_pem(),
            "pinniped-supervisor",
            serde_json::json!({"token": token}),
        )?;
        config["kubeconfig"] = serde_json::json!(kubeconfig);

        // The aggregated API on loopback, reached through an ExternalName Service.
        let aggregated_port = crate::free_port()?;
        config["listen"]["aggregatedApi"] = serde_json::json!(format!("127.0.0.1:{aggregated_port}"));
        kubectl
            .serve_api_services_on_loopback(
                NAMESPACE,
                "pinniped-supervisor-api",
                &[CLIENT_SECRET_API_SERVICE],
                aggregated_port,
            )
            .await?;
        let guard = ApiServiceGuard {
            kubectl: kubectl.binary().to_path_buf(),
            kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
        };

        let mut supervisor = Self::launch(
            cluster,
            NAMESPACE,
            &[(upstream, idp_display_name)],
            port,
            config,
            None,
        )
        .await?;
        supervisor.api_service = Some(guard);
        // The leader writes the serving certificate and the APIService's caBundle.
        kubectl
            .run(&[
                "wait",
                "--for=condition=Available",
                "--timeout=90s",
                &format!("apiservice/{CLIENT_SECRET_API_SERVICE}"),
            ])
            .await
            .map_err(|error| HarnessError::NotReady(format!("{error}\n{}", supervisor.log())))?;
        Ok(supervisor)
    }

    /// Creates the TLS Secret `config` names, the identity provider and the FederationDomain in
    /// `namespace`, and starts the process with `config` listening on `port`.
    async fn launch(
        cluster: &Cluster,
        namespace: &str,
        upstreams: &[(&dyn Upstream, &str)],
        port: u16,
        mut config_doc: serde_json::Value,
        clock: Option<&TestClock>,
    ) -> Result<Self, HarnessError> {
        crate::install_crypto_provider();
        crate::crds::install_conf_crds(cluster).await?;
        let binary = workspace_binary("selkie-supervisor", "selkie-supervisor")?;
        let dir = tempfile::Builder::new()
            .prefix("supervisor-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the Supervisor's directory", e))?;
        let issuer = Self::issuer_for(port, namespace);
        let ca = CertificateAuthority::new("selkie-test-supervisor-ca")?;
        let serving = ca.issue_serving("supervisor", &["127.0.0.1", "localhost"])?;
        let tls_secret = config_doc["defaultTLSCertificateSecret"]
            .as_str()
            .unwrap_or("supervisor-tls")
            .to_string();

        let manifests = federation_domain_manifests(
            namespace,
            "federation-domain",
            &issuer,
            (&tls_secret, &serving),
            upstreams,
        );
        cluster
            .kubectl()
            .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
            .await?;

        // The caller's other listeners (the aggregated API's) stay.
        if !config_doc["listen"].is_object() {
            config_doc["listen"] = serde_json::json!({});
        }
        config_doc["listen"]["https"] = serde_json::json!(format!("127.0.0.1:{port}"));
        config_doc["listen"]["metrics"] = serde_json::json!(format!("127.0.0.1:{}", crate::free_port()?));
        // Unless the caller chose otherwise (`start_with`: benchmarks keep sweeps out of their
        // phases), expired sessions go within seconds, so tests observe the collector (and every
        // test's live sessions run beside it).
        if config_doc.get("sessionGarbageCollectionInterval").is_none() {
            config_doc["sessionGarbageCollectionInterval"] = serde_json::json!("1s");
        }
        // Unless the caller chose otherwise, SIGTERM stops it without the grace period meant for
        // Service endpoints (there are none here): tests stop many Supervisors.
        if config_doc.get("shutdown").is_none() {
            config_doc["shutdown"] = serde_json::json!({"gracePeriodSeconds": 0, "drainTimeoutSeconds": 5});
        }
        let config = dir.path().join("supervisor.yaml");
        std::fs::write(&config, config_doc.to_string())
            .map_err(|e| HarnessError::io("writing the Supervisor's configuration", e))?;
        let log = dir.path().join("supervisor.log");
        let args = [OsString::from("--config"), config.into_os_string()];
        let environment = clock.map(TestClock::environment).unwrap_or_default();
        let mut process =
            ManagedProcess::spawn_with_environment("selkie-supervisor", &binary, &args, log, &environment)?;
        let idp_names: Vec<String> = upstreams.iter().map(|(_, name)| name.to_string()).collect();
        wait_for(&mut process, &ca, &issuer, &idp_names).await?;
        Ok(Self {
            process,
            dir,
            namespace: namespace.to_string(),
            issuer,
            ca,
            binary,
            config: config_doc,
            replicas: Vec::new(),
            idp_names,
            api_service: None,
        })
    }

    /// Starts another replica with the same configuration on another port, and returns that
    /// port once the replica serves the FederationDomain (the issuer's host is the same, so it
    /// answers for it). Replicas stop with the Supervisor.
    pub async fn add_replica(&mut self) -> Result<u16, HarnessError> {
        let port = crate::free_port()?;
        let index = self.replicas.len() + 2;
        let mut config = self.config.clone();
        config["listen"]["https"] = serde_json::json!(format!("127.0.0.1:{port}"));
        config["listen"]["metrics"] = serde_json::json!(format!("127.0.0.1:{}", crate::free_port()?));
        let path = self.dir.path().join(format!("supervisor-{index}.yaml"));
        std::fs::write(&path, config.to_string())
            .map_err(|e| HarnessError::io("writing a replica's configuration", e))?;
        let log = self.dir.path().join(format!("supervisor-{index}.log"));
        let args = [OsString::from("--config"), path.into_os_string()];
        let mut process =
            ManagedProcess::spawn(&format!("selkie-supervisor-{index}"), &self.binary, &args, log)?;
        let path_part = self.issuer.splitn(4, '/').nth(3).unwrap_or_default();
        let issuer = format!("https://127.0.0.1:{port}/{path_part}");
        wait_for(&mut process, &self.ca, &issuer, &self.idp_names).await?;
        self.replicas.push(process);
        Ok(port)
    }

    /// The first replica's metrics in the OpenMetrics text format (its plain-HTTP metrics
    /// listener's `/metrics`).
    pub async fn metrics(&self) -> Result<String, HarnessError> {
        let addr = self.config["listen"]["metrics"].as_str().unwrap_or_default();
        let url = format!("http://{addr}/metrics");
        let failed = |e: &dyn std::fmt::Display| HarnessError::NotReady(format!("{url}: {e}"));
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let uri: http::Uri = url.parse().map_err(|e| failed(&e))?;
        let response = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
            .await
            .map_err(|e| failed(&e))?
            .map_err(|e| failed(&e))?;
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .map_err(|e| failed(&e))?
            .to_bytes();
        if !status.is_success() {
            return Err(failed(&status));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// An HTTPS client trusting the Supervisor's certificate.
    pub fn client(&self) -> Result<HttpsClient, HarnessError> {
        client(&self.ca)
    }

    /// The FederationDomain's issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The CA of its serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// The first replica's process id (for its CPU time and memory in `/proc`).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The logs so far (JSON lines) of every replica.
    pub fn log(&self) -> String {
        let mut logs = String::new();
        for index in 1..=self.replicas.len() + 1 {
            let name = if index == 1 {
                "supervisor.log".to_string()
            } else {
                format!("supervisor-{index}.log")
            };
            logs.push_str(&std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default());
        }
        logs
    }

    /// Its directory (configuration and log).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Sends the (first) Supervisor process SIGTERM, as Kubernetes does to a pod it stops, and
    /// returns at once.
    pub fn terminate(&mut self) {
        self.process.send_sigterm();
    }

    /// Waits up to `timeout` for the (first) Supervisor process to exit and returns how it
    /// ended; fails with its log tail if it is still running then.
    pub async fn wait_for_exit(&mut self, timeout: Duration) -> Result<ExitStatus, HarnessError> {
        self.process.wait_for_exit(timeout).await
    }

    /// Fails with its log tail if it (or a replica) has stopped.
    pub fn check_running(&mut self) -> Result<(), HarnessError> {
        self.process.check_running("during the test")?;
        for replica in &mut self.replicas {
            replica.check_running("during the test")?;
        }
        Ok(())
    }
}

fn client(ca: &CertificateAuthority) -> Result<HttpsClient, HarnessError> {
    HttpsClient::new(&TlsOptions {
        ca_pem: Some(ca.cert_pem().into_bytes()),
        ..TlsOptions::default()
    })
    .map_err(|e| HarnessError::Pki(e.to_string()))
}

/// Waits (at most [`READY_TIMEOUT`]) until the Supervisor serves `issuer`'s discovery document
/// and its identity-provider discovery lists every one of `idp_names` (identity providers are
/// checked in the background — discovery, connection checks — so a FederationDomain can be
/// served a moment before its identity providers are). Fails with the process's log.
async fn wait_for(
    process: &mut ManagedProcess,
    ca: &CertificateAuthority,
    issuer: &str,
    idp_names: &[String],
) -> Result<(), HarnessError> {
    let client = client(ca)?;
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let discovery = format!("{issuer}/.well-known/openid-configuration");
    let idps = format!("{issuer}/v1alpha1/pinniped_identity_providers");
    loop {
        process.check_running("during start-up")?;
        let timeout = Some(Duration::from_secs(5));
        let last = match client.get_json(&discovery, 64 * 1024, timeout).await {
            Err(e) => e.to_string(),
            Ok(_) => match client.get_json(&idps, 64 * 1024, timeout).await {
                Err(e) => e.to_string(),
                Ok(body) => {
                    let listed: Vec<String> = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|doc| doc["pinniped_identity_providers"].as_array().cloned())
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|idp| idp["name"].as_str().map(str::to_string))
                        .collect();
                    if idp_names.iter().all(|name| listed.contains(name)) {
                        return Ok(());
                    }
                    format!("identity providers listed: {listed:?}, waiting for {idp_names:?}")
                }
            },
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(process.failure(format!(
                "did not serve {issuer} with its identity providers within {READY_TIMEOUT:?} (last: {last})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
