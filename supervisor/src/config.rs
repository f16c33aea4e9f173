//! The Supervisor's own configuration file (YAML): where it runs and listens. Everything else
//! (issuers, identity providers, TLS certificates) comes from custom resources and Secrets.
//!
//! ```yaml
//! namespace: selkie-supervisor          # required: where its CRs, Secrets and sessions live
//! apiGroupSuffix: pinniped.dev          # default
//! namePrefix: selkie-supervisor         # default; the leader-election Lease is <namePrefix>-leader-election
//! identity: pod-name                    # default: $POD_NAME, else the host name
//! defaultTLSCertificateSecret: my-tls   # optional kubernetes.io/tls Secret for hosts without their own
//! listen:
//!   https: 0.0.0.0:8443                 # default
//!   http: 127.0.0.1:8080                # optional; loopback only (a sidecar terminating TLS)
//! kubeconfig: /path/to/kubeconfig       # optional; in-cluster configuration otherwise
//! sessionGarbageCollectionInterval: 1m  # default; 1s … 1h
//! signingKeyRotationInterval: 720h      # default (30 days); 0s never rotates (as Pinniped)
//! audit:
//!   logUsernamesAndGroups: enabled      # default disabled: audit events say "redacted"
//! ```

use std::{net::SocketAddr, path::PathBuf};

use serde::Deserialize;

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SupervisorConfig {
    /// The namespace of the Supervisor's objects.
    pub namespace: String,
    /// Pinniped's `apiGroupSuffix`.
    #[serde(default = "default_suffix")]
    pub api_group_suffix: String,
    /// The prefix of the names of objects the Supervisor creates for itself.
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
    /// This replica's identity in leader election.
    #[serde(default)]
    pub identity: Option<String>,
    /// The Secret with the certificate for hosts that have no FederationDomain TLS Secret.
    #[serde(default, rename = "defaultTLSCertificateSecret")]
    pub default_tls_certificate_secret: Option<String>,
    /// Listeners.
    #[serde(default)]
    pub listen: Listen,
    /// A kubeconfig to reach kube-apiserver with (outside a cluster).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// How often the leader deletes expired sessions (a Go duration, `1s` … `1h`; default `1m`).
    #[serde(default)]
    pub session_garbage_collection_interval: Option<String>,
    /// How long a FederationDomain's signing key signs before the leader rotates it (a Go
    /// duration, `1s` … `8760h`, or `0s` for never; default `720h`).
    #[serde(default)]
    pub signing_key_rotation_interval: Option<String>,
    /// The audit events' options ([`crate::server::audit`]).
    #[serde(default)]
    pub audit: crate::server::audit::AuditConfig,
}

/// Where the Supervisor listens.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listen {
    /// The HTTPS listener.
    #[serde(default = "default_https")]
    pub https: SocketAddr,
    /// A plain HTTP listener, loopback only.
    #[serde(default)]
    pub http: Option<SocketAddr>,
    /// The plain-HTTP metrics listener (`/metrics`, `/healthz`); none by default. Nothing it
    /// serves is secret, but it has no TLS or authentication: bind it to loopback or the pod
    /// network.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// The aggregated API's HTTPS listener (OIDCClientSecretRequest, reached through
    /// kube-apiserver as the APIService `v1alpha1.clientsecret.supervisor.<suffix>` and the
    /// Service `<namePrefix>-api`); none by default: OIDCClients' secrets cannot then be managed.
    #[serde(default)]
    pub aggregated_api: Option<SocketAddr>,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            https: default_https(),
            http: None,
            metrics: None,
            aggregated_api: None,
        }
    }
}

fn default_suffix() -> String {
    selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX.to_string()
}

fn default_prefix() -> String {
    "selkie-supervisor".into()
}

fn default_https() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8443))
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not YAML of this shape.
    #[error("the Supervisor configuration is invalid: {0}")]
    Parse(String),
    /// A value is not allowed.
    #[error("the Supervisor configuration is invalid: {0}")]
    Invalid(String),
}

impl SupervisorConfig {
    /// Parses and checks `yaml`.
    pub fn parse(yaml: &str) -> Result<Self, ConfigError> {
        let config: Self = serde_yaml::from_str(yaml).map_err(|e| ConfigError::Parse(e.to_string()))?;
        if !selkie_api::names::is_dns1123_label(&config.namespace) {
            return Err(ConfigError::Invalid(format!(
                "namespace {:?} is not a DNS-1123 label",
                config.namespace
            )));
        }
        selkie_api::group_suffix::validate_api_group_suffix(&config.api_group_suffix)
            .map_err(|e| ConfigError::Invalid(format!("apiGroupSuffix: {e}")))?;
        if let Some(http) = config.listen.http {
            if !http.ip().is_loopback() {
                return Err(ConfigError::Invalid(format!(
                    "listen.http {http} is not a loopback address: plain HTTP is only for a sidecar on the same host"
                )));
            }
        }
        config.garbage_collection_interval()?;
        config.signing_key_rotation_interval()?;
        crate::server::audit::Audit::new(&config.audit)
            .map_err(|e| ConfigError::Invalid(format!("audit: {e}")))?;
        Ok(config)
    }

    /// How often expired sessions are collected: `sessionGarbageCollectionInterval`, whole and
    /// between a second and an hour, or [`crate::session::gc::DEFAULT_INTERVAL`].
    pub fn garbage_collection_interval(&self) -> Result<std::time::Duration, ConfigError> {
        let Some(text) = &self.session_garbage_collection_interval else {
            return Ok(crate::session::gc::DEFAULT_INTERVAL);
        };
        let invalid = |reason: String| {
            ConfigError::Invalid(format!("sessionGarbageCollectionInterval {text:?}: {reason}"))
        };
        let parsed = selkie_api::duration::parse(text).map_err(|e| invalid(e.to_string()))?;
        let range = std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(3600);
        if parsed.negative || !range.contains(&parsed.magnitude) {
            return Err(invalid("must be between 1s and 1h".into()));
        }
        Ok(parsed.magnitude)
    }

    /// How long a signing key signs before it is rotated (see [`crate::controller::keys::rotate`]):
    /// `signingKeyRotationInterval`, whole and between a second and a year, `None` for `0s`
    /// (never), or [`crate::controller::keys::DEFAULT_ROTATION_INTERVAL`].
    pub fn signing_key_rotation_interval(&self) -> Result<Option<std::time::Duration>, ConfigError> {
        let Some(text) = &self.signing_key_rotation_interval else {
            return Ok(Some(crate::controller::keys::DEFAULT_ROTATION_INTERVAL));
        };
        let invalid =
            |reason: String| ConfigError::Invalid(format!("signingKeyRotationInterval {text:?}: {reason}"));
        let parsed = selkie_api::duration::parse(text).map_err(|e| invalid(e.to_string()))?;
        if parsed.magnitude.is_zero() {
            return Ok(None);
        }
        let range = std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(8760 * 3600);
        if parsed.negative || !range.contains(&parsed.magnitude) {
            return Err(invalid("must be 0s (never) or between 1s and 8760h".into()));
        }
        Ok(Some(parsed.magnitude))
    }

    /// `<apiGroupSuffix>`-suffixed API group of `group` (written with `pinniped.dev`).
    pub fn group(&self, group: &str) -> String {
        selkie_api::group_suffix::replace_group_suffix(group, &self.api_group_suffix)
            .unwrap_or_else(|| group.to_string())
    }

    /// This replica's identity.
    pub fn identity(&self) -> String {
        self.identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "selkie-supervisor".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let config = SupervisorConfig::parse("namespace: sso\n").unwrap();
        assert_eq!(config.listen.https, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(
            config.group("idp.supervisor.pinniped.dev"),
            "idp.supervisor.pinniped.dev"
        );
        let suffixed = SupervisorConfig::parse("namespace: sso\napiGroupSuffix: acme.io\n").unwrap();
        assert_eq!(
            suffixed.group("config.supervisor.pinniped.dev"),
            "config.supervisor.acme.io"
        );
        let error = SupervisorConfig::parse("namespace: sso\nlisten:\n  http: 0.0.0.0:8080\n").unwrap_err();
        assert!(error.to_string().contains("not a loopback address"), "{error}");
        assert!(SupervisorConfig::parse("namespace: Not_A_Label\n").is_err());
        assert!(SupervisorConfig::parse("namespace: sso\nunknown: 1\n").is_err());
        let error =
            SupervisorConfig::parse("namespace: sso\naudit: {logUsernamesAndGroups: yes}\n").unwrap_err();
        assert!(error.to_string().contains("logUsernamesAndGroups"), "{error}");
        let audited =
            SupervisorConfig::parse("namespace: sso\naudit: {logUsernamesAndGroups: enabled}\n").unwrap();
        assert_eq!(audited.audit.log_usernames_and_groups, "enabled");
        assert_eq!(
            config.garbage_collection_interval().unwrap(),
            crate::session::gc::DEFAULT_INTERVAL
        );
        let default = SupervisorConfig::parse("namespace: sso\n").unwrap();
        assert_eq!(
            default.signing_key_rotation_interval().unwrap(),
            Some(crate::controller::keys::DEFAULT_ROTATION_INTERVAL)
        );
        let never = SupervisorConfig::parse("namespace: sso\nsigningKeyRotationInterval: 0s\n").unwrap();
        assert_eq!(never.signing_key_rotation_interval().unwrap(), None);
        let daily = SupervisorConfig::parse("namespace: sso\nsigningKeyRotationInterval: 24h\n").unwrap();
        assert_eq!(
            daily.signing_key_rotation_interval().unwrap(),
            Some(std::time::Duration::from_secs(86400))
        );
        for bad in ["-1h", "9000h", "500ms", "soon"] {
            let error =
                SupervisorConfig::parse(&format!("namespace: sso\nsigningKeyRotationInterval: {bad}\n"))
                    .unwrap_err();
            assert!(
                error.to_string().contains("signingKeyRotationInterval"),
                "{error}"
            );
        }
        let fast = SupervisorConfig::parse("namespace: sso\nsessionGarbageCollectionInterval: 2s\n").unwrap();
        assert_eq!(
            fast.garbage_collection_interval().unwrap(),
            std::time::Duration::from_secs(2)
        );
        for bad in ["0s", "2h", "soon", "-5s"] {
            let error = SupervisorConfig::parse(&format!(
                "namespace: sso\nsessionGarbageCollectionInterval: {bad}\n"
            ))
            .unwrap_err();
            assert!(
                error.to_string().contains("sessionGarbageCollectionInterval"),
                "{error}"
            );
        }
    }
}
