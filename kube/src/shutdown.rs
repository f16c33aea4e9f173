//! How a server behind a Kubernetes Service stops on SIGTERM without refusing a connection.
//!
//! When a pod is deleted, the kubelet sends SIGTERM while the endpoint controller, kube-proxy
//! and any load balancer in front are still removing the pod from their routes; a server that
//! closed its listeners at once would refuse the connections they keep sending it for that
//! while. So both servers first turn their readiness endpoint to 503 and keep serving for the
//! grace period, then close the listeners and let the requests in flight finish for up to the
//! drain timeout.

use std::time::Duration;

use serde::Deserialize;

/// The `shutdown` section of a server's configuration file. Read at start-up only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShutdownConfig {
    /// Seconds between SIGTERM and closing the listeners (default 5).
    #[serde(default = "default_grace_period_seconds")]
    pub grace_period_seconds: u64,
    /// Seconds in-flight requests may run after the listeners close (default 20).
    #[serde(default = "default_drain_timeout_seconds")]
    pub drain_timeout_seconds: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            grace_period_seconds: default_grace_period_seconds(),
            drain_timeout_seconds: default_drain_timeout_seconds(),
        }
    }
}

impl ShutdownConfig {
    /// How long the server keeps serving, unready, after SIGTERM.
    pub fn grace_period(&self) -> Duration {
        Duration::from_secs(self.grace_period_seconds)
    }

    /// How long in-flight requests may run once the listeners have closed.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout_seconds)
    }
}

// Together 25 s: inside Kubernetes' default terminationGracePeriodSeconds of 30.
fn default_grace_period_seconds() -> u64 {
    5
}

fn default_drain_timeout_seconds() -> u64 {
    20
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fit_inside_kubernetes_default_termination_grace_period() {
        let config: ShutdownConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, ShutdownConfig::default());
        assert_eq!(config.grace_period(), Duration::from_secs(5));
        assert_eq!(config.drain_timeout(), Duration::from_secs(20));
        assert!(config.grace_period() + config.drain_timeout() < Duration::from_secs(30));
    }

    #[test]
    fn each_setting_is_optional_and_unknown_ones_are_refused() {
        let config: ShutdownConfig = serde_json::from_str(r#"{"drainTimeoutSeconds": 60}"#).unwrap();
        assert_eq!(
            (config.grace_period_seconds, config.drain_timeout_seconds),
            (5, 60)
        );
        let error = serde_json::from_str::<ShutdownConfig>(r#"{"drainTimeout": 60}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `drainTimeout`"),
            "{error}"
        );
        assert!(serde_json::from_str::<ShutdownConfig>(r#"{"gracePeriodSeconds": -1}"#).is_err());
    }
}
