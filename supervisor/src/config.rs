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
//! listenerLimits:                       # per listener (https, http); see crate::server::limits
//!   maxConnections: 10000               # default; 1 … 1000000; more are closed at once
//!   idleTimeout: 90s                    # default; 1s … 1h with no request in flight
//!   headerReadTimeout: 10s              # default; 1s … 5m to send an HTTP/1.1 request head
//!   maxConcurrentStreams: 100           # default; 1 … 1000 HTTP/2 streams per connection
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
    /// What one client can hold on the HTTPS and HTTP listeners ([`Self::listener_limits`]).
    #[serde(default)]
    pub listener_limits: ListenerLimitsConfig,
    /// What SIGTERM does: `/healthz` answers 503 and the listeners keep serving for
    /// `gracePeriodSeconds` (default 5), then close, and open connections may finish their
    /// requests for `drainTimeoutSeconds` (default 20).
    #[serde(default)]
    pub shutdown: selkie_kube::shutdown::ShutdownConfig,
}

/// The `listenerLimits` section: every key optional, each checked by
/// [`SupervisorConfig::listener_limits`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerLimitsConfig {
    /// Connections open at once per listener (`1` … `1000000`; default `10000`).
    #[serde(default)]
    pub max_connections: Option<u64>,
    /// How long a connection with no request in flight stays open (a Go duration, `1s` … `1h`;
    /// default `90s`).
    #[serde(default)]
    pub idle_timeout: Option<String>,
    /// How long an HTTP/1.1 client may take to send a request head (a Go duration, `1s` … `5m`;
    /// default `10s`).
    #[serde(default)]
    pub header_read_timeout: Option<String>,
    /// HTTP/2 streams a client may have open on one connection (`1` … `1000`; default `100`).
    #[serde(default)]
    pub max_concurrent_streams: Option<u64>,
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
        config.listener_limits()?;
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

    /// The listeners' limits: `listenerLimits`, each key within its range (see
    /// [`ListenerLimitsConfig`]) or its default ([`ListenerLimits::DEFAULT`]). Fails naming the
    /// key, its value and the range.
    ///
    /// [`ListenerLimits::DEFAULT`]: crate::server::limits::ListenerLimits::DEFAULT
    pub fn listener_limits(&self) -> Result<crate::server::limits::ListenerLimits, ConfigError> {
        use std::time::Duration;
        let section = &self.listener_limits;
        let defaults = crate::server::limits::ListenerLimits::DEFAULT;
        let count = |key: &str, value: Option<u64>, max: u64, default: u64| {
            let Some(value) = value else {
                return Ok(default);
            };
            if (1..=max).contains(&value) {
                return Ok(value);
            }
            let why = if value == 0 && key == "maxConnections" {
                " (0 would refuse every connection)"
            } else {
                ""
            };
            Err(ConfigError::Invalid(format!(
                "listenerLimits.{key} {value}: must be between 1 and {max}{why}"
            )))
        };
        let duration = |key: &str, value: &Option<String>, (max, max_text): (Duration, &str), default| {
            let Some(text) = value else {
                return Ok(default);
            };
            let invalid =
                |reason: String| ConfigError::Invalid(format!("listenerLimits.{key} {text:?}: {reason}"));
            let parsed = selkie_api::duration::parse(text).map_err(|e| invalid(e.to_string()))?;
            if parsed.negative || !(Duration::from_secs(1)..=max).contains(&parsed.magnitude) {
                return Err(invalid(format!("must be between 1s and {max_text}")));
            }
            Ok(parsed.magnitude)
        };
        let max_connections = count(
            "maxConnections",
            section.max_connections,
            1_000_000,
            defaults.max_connections as u64,
        )?;
        let max_concurrent_streams = count(
            "maxConcurrentStreams",
            section.max_concurrent_streams,
            1000,
            u64::from(defaults.max_concurrent_streams),
        )?;
        Ok(crate::server::limits::ListenerLimits {
            // Both at most 1000000: they fit.
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            idle_timeout: duration(
                "idleTimeout",
                &section.idle_timeout,
                (Duration::from_secs(3600), "1h"),
                defaults.idle_timeout,
            )?,
            header_read_timeout: duration(
                "headerReadTimeout",
                &section.header_read_timeout,
                (Duration::from_secs(300), "5m"),
                defaults.header_read_timeout,
            )?,
            max_concurrent_streams: u32::try_from(max_concurrent_streams).unwrap_or(u32::MAX),
            drain_timeout: self.shutdown.drain_timeout(),
        })
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

    #[test]
    fn listener_limits_default_and_are_checked() {
        use crate::server::limits::ListenerLimits;
        use std::time::Duration;
        let parse =
            |limits: &str| SupervisorConfig::parse(&format!("namespace: sso\nlistenerLimits: {limits}\n"));
        let default = SupervisorConfig::parse("namespace: sso\n").unwrap();
        assert_eq!(default.listener_limits().unwrap(), ListenerLimits::DEFAULT);
        assert_eq!(
            ListenerLimits::DEFAULT,
            ListenerLimits {
                max_connections: 10_000,
                idle_timeout: Duration::from_secs(90),
                header_read_timeout: Duration::from_secs(10),
                max_concurrent_streams: 100,
                drain_timeout: Duration::from_secs(20),
            }
        );
        assert_eq!(
            parse("{}").unwrap().listener_limits().unwrap(),
            ListenerLimits::DEFAULT
        );
        let set = parse(
            "{maxConnections: 500, idleTimeout: 1m30s, headerReadTimeout: 2500ms, maxConcurrentStreams: 250}",
        )
        .unwrap();
        assert_eq!(
            set.listener_limits().unwrap(),
            ListenerLimits {
                max_connections: 500,
                idle_timeout: Duration::from_secs(90),
                header_read_timeout: Duration::from_millis(2500),
                max_concurrent_streams: 250,
                drain_timeout: Duration::from_secs(20),
            }
        );
        // The drain timeout comes from the shutdown section.
        let drain = SupervisorConfig::parse("namespace: sso\nshutdown: {drainTimeoutSeconds: 7}\n")
            .unwrap()
            .listener_limits()
            .unwrap();
        assert_eq!(drain.drain_timeout, Duration::from_secs(7));
        let error = SupervisorConfig::parse("namespace: sso\nshutdown: {gracePeriod: 7}\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `gracePeriod`"), "{error}");
        let one = parse("{idleTimeout: 5s}").unwrap().listener_limits().unwrap();
        assert_eq!(
            one,
            ListenerLimits {
                idle_timeout: Duration::from_secs(5),
                ..ListenerLimits::DEFAULT
            }
        );

        let error = parse("{maxConnections: 0}").unwrap_err().to_string();
        assert_eq!(
            error,
            "the Supervisor configuration is invalid: listenerLimits.maxConnections 0: must be between 1 and 1000000 (0 would refuse every connection)"
        );
        for (limits, needle) in [
            (
                "{maxConnections: 1000001}",
                "listenerLimits.maxConnections 1000001: must be between 1 and 1000000",
            ),
            ("{maxConnections: -1}", "maxConnections"),
            ("{maxConnections: many}", "maxConnections"),
            (
                "{maxConcurrentStreams: 0}",
                "listenerLimits.maxConcurrentStreams 0: must be between 1 and 1000",
            ),
            ("{maxConcurrentStreams: 1001}", "must be between 1 and 1000"),
            (
                "{idleTimeout: 0s}",
                "listenerLimits.idleTimeout \"0s\": must be between 1s and 1h",
            ),
            (
                "{idleTimeout: 2h}",
                "listenerLimits.idleTimeout \"2h\": must be between 1s and 1h",
            ),
            ("{idleTimeout: 500ms}", "must be between 1s and 1h"),
            ("{idleTimeout: -5s}", "must be between 1s and 1h"),
            ("{idleTimeout: soon}", "listenerLimits.idleTimeout \"soon\""),
            (
                "{headerReadTimeout: 10m}",
                "listenerLimits.headerReadTimeout \"10m\": must be between 1s and 5m",
            ),
            ("{idle: 5s}", "unknown field `idle`"),
        ] {
            let error = parse(limits).unwrap_err().to_string();
            assert!(error.contains(needle), "{limits}: {error}");
        }
    }
}
