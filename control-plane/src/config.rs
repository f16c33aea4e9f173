//! The control plane's own configuration: where it runs, what its objects are called, which API
//! group suffix it serves and where it listens. Read once at start-up (YAML, camelCase, unknown
//! fields refused) from the file `selkie-concierge --control-plane FILE` names; every default is
//! Pinniped's, so a Pinniped-shaped installation needs no settings at all.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use kube::{core::ApiResource, Resource};
use selkie_api::group_suffix::{replace_group_suffix, validate_api_group_suffix, DEFAULT_API_GROUP_SUFFIX};
use selkie_filters::issuing::login_api::{MAX_CLIENT_CERTIFICATE_LIFETIME, MIN_CLIENT_CERTIFICATE_LIFETIME};
use serde::Deserialize;

/// The control plane's configuration. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// A kubeconfig to reach kube-apiserver with; the in-cluster service account (or
    /// `$KUBECONFIG`) when absent.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace the Concierge runs in: its Secrets, Services and Lease live there.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Pinniped's `apiGroupSuffix`: serve and watch `*.concierge.<suffix>` instead of
    /// `*.concierge.pinniped.dev`.
    #[serde(default = "default_api_group_suffix")]
    pub api_group_suffix: String,
    /// The prefix of every object the Concierge creates (Pinniped: `pinniped-concierge`).
    #[serde(default = "default_name_prefix")]
    pub name_prefix: String,
    /// The name of the CredentialIssuer to maintain.
    #[serde(default = "default_credential_issuer_name")]
    pub credential_issuer_name: String,
    /// This replica's name, for the leader-election Lease (the pod name in a cluster).
    #[serde(default = "default_identity")]
    pub identity: String,
    /// The aggregated API server.
    #[serde(default)]
    pub aggregated_api: AggregatedApiConfig,
    /// Where the cluster's own signing key comes from (the KubeClusterSigningCertificate
    /// strategy); when absent only Selkie's signer CA issues credentials.
    #[serde(default)]
    pub cluster_signing_key: Option<ClusterSigningKeySource>,
    /// The kube-apiserver URL clients use for TokenCredentialRequests
    /// (`tokenCredentialRequestInfo.server`); read from `kube-public/cluster-info` when absent.
    #[serde(default)]
    pub discovery_url: Option<String>,
    /// Labels put on every object the Concierge creates (Pinniped's `labels`); the value of the
    /// `app` label also selects the Concierge's pods in the Services in front of the
    /// impersonation proxy.
    #[serde(default = "default_labels")]
    pub labels: BTreeMap<String, String>,
    /// The port the impersonation proxy listens on in each pod, which is the target port of the
    /// Services in front of it (Pinniped's `impersonationProxyServerPort`: 8444).
    #[serde(default = "default_impersonation_proxy_port")]
    pub impersonation_proxy_port: u16,
    /// Selkie's extension (Pinniped #1987): how long the client certificates of
    /// TokenCredentialRequests are valid, as a duration (`1h`, `30m`), from 1 minute to 8 hours
    /// ([`MIN_CLIENT_CERTIFICATE_LIFETIME`], [`MAX_CLIENT_CERTIFICATE_LIFETIME`]); Pinniped's 5
    /// minutes when absent. A certificate cannot be revoked: a longer one outlives the user's
    /// removal upstream by as much.
    #[serde(default, deserialize_with = "deserialize_lifetime")]
    pub client_certificate_lifetime: Option<Duration>,
}

/// A duration as Kubernetes writes one ([`selkie_api::duration::parse`]), not negative.
fn deserialize_lifetime<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    let parsed = selkie_api::duration::parse(&text).map_err(serde::de::Error::custom)?;
    if parsed.negative {
        return Err(serde::de::Error::custom(format!("{text:?} is negative")));
    }
    Ok(Some(parsed.magnitude))
}

/// The aggregated API server (TokenCredentialRequest, WhoAmIRequest).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AggregatedApiConfig {
    /// `host:port` to serve HTTPS on (Pinniped: `:10250`).
    #[serde(default = "default_aggregated_listen")]
    pub listen: SocketAddr,
}

impl Default for AggregatedApiConfig {
    fn default() -> Self {
        Self {
            listen: default_aggregated_listen(),
        }
    }
}

/// Where the cluster's client signing certificate and key are read from: exactly one of a
/// Secret (`secret: {namespace, name}`), files (`files: {certFile, keyFile}`) or the kube cert
/// agent (`agent: {image, …}`, the agent itself is `crate::kube_cert_agent`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSigningKeySource {
    /// A Secret with `tls.crt` / `tls.key` (or `ca.crt` / `ca.key`), re-read periodically.
    #[serde(default)]
    pub secret: Option<SecretReference>,
    /// PEM files on this node (kube-controller-manager's `--cluster-signing-cert-file` and
    /// `--cluster-signing-key-file`), re-read periodically.
    #[serde(default)]
    pub files: Option<KeyFiles>,
    /// The kube cert agent: a pod beside kube-controller-manager whose files it prints.
    #[serde(default)]
    pub agent: Option<AgentConfig>,
}

/// A Secret by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretReference {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A PEM certificate file and its key file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyFiles {
    /// The CA certificate.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

fn default_namespace() -> String {
    "pinniped-concierge".into()
}

fn default_api_group_suffix() -> String {
    DEFAULT_API_GROUP_SUFFIX.into()
}

fn default_name_prefix() -> String {
    "pinniped-concierge".into()
}

fn default_credential_issuer_name() -> String {
    format!("{}-config", default_name_prefix())
}

fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("selkie-concierge-{}", std::process::id()))
}

fn default_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), default_name_prefix())])
}

fn default_impersonation_proxy_port() -> u16 {
    8444
}

fn default_aggregated_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 10250))
}

/// Why the control plane's configuration cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The YAML is invalid or has unknown fields.
    #[error("{path} is not a valid control-plane configuration: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What serde said.
        error: serde_yaml::Error,
    },
    /// A field has an unusable value.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl ControlPlaneConfig {
    /// Reads and validates the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let bytes = std::fs::read(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let config: Self = serde_yaml::from_slice(&bytes).map_err(|error| ConfigError::Parse {
            path: path.to_path_buf(),
            error,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the fields serde cannot: the suffix and the names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_api_group_suffix(&self.api_group_suffix).map_err(|e| ConfigError::Invalid {
            field: "apiGroupSuffix",
            message: e.to_string(),
        })?;
        if let Some(source) = &self.cluster_signing_key {
            let sources = [
                source.secret.is_some(),
                source.files.is_some(),
                source.agent.is_some(),
            ];
            if sources.iter().filter(|set| **set).count() != 1 {
                return Err(ConfigError::Invalid {
                    field: "clusterSigningKey",
                    message: "needs exactly one of secret, files and agent".into(),
                });
            }
            if let Some(agent) = &source.agent {
                agent
                    .validate()
                    .map_err(|(field, message)| ConfigError::Invalid { field, message })?;
            }
        }
        if let Some(lifetime) = self.client_certificate_lifetime {
            if !(MIN_CLIENT_CERTIFICATE_LIFETIME..=MAX_CLIENT_CERTIFICATE_LIFETIME).contains(&lifetime) {
                return Err(ConfigError::Invalid {
                    field: "clientCertificateLifetime",
                    message: format!(
                        "must be from {}m to {}h",
                        MIN_CLIENT_CERTIFICATE_LIFETIME.as_secs() / 60,
                        MAX_CLIENT_CERTIFICATE_LIFETIME.as_secs() / 3600
                    ),
                });
            }
        }
        for (field, value) in [
            ("namespace", &self.namespace),
            ("namePrefix", &self.name_prefix),
            ("credentialIssuerName", &self.credential_issuer_name),
        ] {
            if value.is_empty() {
                return Err(ConfigError::Invalid {
                    field,
                    message: "must not be empty".into(),
                });
            }
        }
        Ok(())
    }

    /// `group` (a default `*.pinniped.dev` group) with this installation's suffix.
    pub fn group(&self, group: &str) -> String {
        replace_group_suffix(group, &self.api_group_suffix).unwrap_or_else(|| group.to_string())
    }

    /// The API resource of the static type `K` under this installation's group suffix, for
    /// `Api::all_with` / `Api::namespaced_with` over `DynamicObject`s (kube's typed `Api<K>`
    /// always uses the compiled-in `pinniped.dev` group).
    pub fn api_resource<K: Resource<DynamicType = ()>>(&self) -> ApiResource {
        let mut resource = ApiResource::erase::<K>(&());
        resource.group = self.group(&resource.group);
        resource.api_version = format!("{}/{}", resource.group, resource.version);
        resource
    }

    /// `<namePrefix>-<suffix>`: the name of an object the Concierge owns.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.name_prefix)
    }

    /// The leader-election Lease: `<namePrefix>-leader-election` in the Concierge's namespace,
    /// held as this replica's identity.
    pub fn lease(&self) -> selkie_kube::leader::LeaseConfig {
        selkie_kube::leader::LeaseConfig {
            namespace: self.namespace.clone(),
            name: self.name("leader-election"),
            identity: self.identity.clone(),
        }
    }
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        // An empty YAML document gives every default.
        Self {
            kubeconfig: None,
            namespace: default_namespace(),
            api_group_suffix: default_api_group_suffix(),
            name_prefix: default_name_prefix(),
            credential_issuer_name: default_credential_issuer_name(),
            identity: default_identity(),
            aggregated_api: AggregatedApiConfig::default(),
            cluster_signing_key: None,
            discovery_url: None,
            labels: default_labels(),
            impersonation_proxy_port: default_impersonation_proxy_port(),
            client_certificate_lifetime: None,
        }
    }
}

/// The agent binary's default name in its image.
pub const DEFAULT_AGENT_BINARY: &str = "selkie-kube-cert-agent";

/// `clusterSigningKey.agent` in the control-plane configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// The container image holding the agent binary.
    pub image: String,
    /// The agent binary's name (or path) in that image.
    #[serde(default = "default_agent_binary")]
    pub binary: String,
    /// Secrets to pull the image with.
    #[serde(default)]
    pub image_pull_secrets: Vec<String>,
    /// The agent pod's service account (the namespace's default when absent).
    #[serde(default)]
    pub service_account_name: Option<String>,
    /// The agent pod's priority class.
    #[serde(default)]
    pub priority_class_name: Option<String>,
}

fn default_agent_binary() -> String {
    DEFAULT_AGENT_BINARY.into()
}

impl AgentConfig {
    /// Checks what serde cannot: the image and binary are not empty. The message names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.image.trim().is_empty() {
            return Err(("clusterSigningKey.agent.image", "must not be empty".into()));
        }
        if self.binary.trim().is_empty() {
            return Err(("clusterSigningKey.agent.binary", "must not be empty".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use selkie_api::authentication::JWTAuthenticator;

    use super::*;

    #[test]
    fn an_empty_file_gives_pinnipeds_names() {
        let config: ControlPlaneConfig = serde_yaml::from_str("{}").unwrap();
        config.validate().unwrap();
        assert_eq!(config.namespace, "pinniped-concierge");
        assert_eq!(config.credential_issuer_name, "pinniped-concierge-config");
        assert_eq!(config.name("api"), "pinniped-concierge-api");
        assert_eq!(config.aggregated_api.listen.port(), 10250);
    }

    #[test]
    fn the_group_suffix_rewrites_api_resources() {
        let config: ControlPlaneConfig = serde_yaml::from_str("apiGroupSuffix: acme.example.com").unwrap();
        config.validate().unwrap();
        let resource = config.api_resource::<JWTAuthenticator>();
        assert_eq!(resource.group, "authentication.concierge.acme.example.com");
        assert_eq!(
            resource.api_version,
            "authentication.concierge.acme.example.com/v1alpha1"
        );
        assert_eq!(resource.plural, "jwtauthenticators");
    }

    #[test]
    fn bad_settings_name_their_field() {
        let config: ControlPlaneConfig = serde_yaml::from_str("apiGroupSuffix: acme").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with("apiGroupSuffix:"), "{error}");
        assert!(serde_yaml::from_str::<ControlPlaneConfig>("namspace: x").is_err());
        let both: ControlPlaneConfig = serde_yaml::from_str(
            "clusterSigningKey: {secret: {namespace: a, name: b}, files: {certFile: c, keyFile: d}}",
        )
        .unwrap();
        let error = both.validate().unwrap_err().to_string();
        assert_eq!(
            error,
            "clusterSigningKey: needs exactly one of secret, files and agent"
        );
        let agent_and_files: ControlPlaneConfig =
            serde_yaml::from_str("clusterSigningKey: {agent: {image: i}, files: {certFile: c, keyFile: d}}")
                .unwrap();
        let error = agent_and_files.validate().unwrap_err().to_string();
        assert_eq!(
            error,
            "clusterSigningKey: needs exactly one of secret, files and agent"
        );
        let agent: ControlPlaneConfig =
            serde_yaml::from_str("clusterSigningKey: {agent: {image: registry.example/selkie:1}}").unwrap();
        agent.validate().unwrap();
        let no_image: ControlPlaneConfig =
            serde_yaml::from_str("clusterSigningKey: {agent: {image: ''}}").unwrap();
        let error = no_image.validate().unwrap_err().to_string();
        assert_eq!(error, "clusterSigningKey.agent.image: must not be empty");
        let secret: ControlPlaneConfig =
            serde_yaml::from_str("clusterSigningKey: {secret: {namespace: a, name: b}}").unwrap();
        secret.validate().unwrap();
    }

    #[test]
    fn the_certificate_lifetime_is_a_bounded_duration() {
        let lifetime = |yaml: &str| {
            serde_yaml::from_str::<ControlPlaneConfig>(yaml)
                .map(|c| (c.validate().map_err(|e| e.to_string()), c))
        };
        let (valid, config) = lifetime("clientCertificateLifetime: 1h30m").unwrap();
        valid.unwrap();
        assert_eq!(
            config.client_certificate_lifetime,
            Some(Duration::from_secs(5400))
        );
        for bound in ["1m", "8h"] {
            lifetime(&format!("clientCertificateLifetime: {bound}"))
                .unwrap()
                .0
                .unwrap();
        }
        let (valid, config) = lifetime("{}").unwrap();
        valid.unwrap();
        assert_eq!(config.client_certificate_lifetime, None);
        for (yaml, message) in [
            (
                "clientCertificateLifetime: 30s",
                "clientCertificateLifetime: must be from 1m to 8h",
            ),
            (
                "clientCertificateLifetime: 8h1s",
                "clientCertificateLifetime: must be from 1m to 8h",
            ),
            (
                "clientCertificateLifetime: 0",
                "clientCertificateLifetime: must be from 1m to 8h",
            ),
        ] {
            assert_eq!(lifetime(yaml).unwrap().0.unwrap_err(), message);
        }
        for (yaml, needle) in [
            ("clientCertificateLifetime: -1h", r#""-1h" is negative"#),
            (
                "clientCertificateLifetime: 1 hour",
                "is not a duration such as 10s",
            ),
            ("clientCertificateLifetime: 300", "has no unit"),
        ] {
            let error = lifetime(yaml).unwrap_err().to_string();
            assert!(error.contains(needle), "{yaml}: {error}");
        }
    }
}
