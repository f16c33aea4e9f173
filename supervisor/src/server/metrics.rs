//! Prometheus metrics of the Supervisor, served in the OpenMetrics text format at `/metrics` of
//! the metrics listener (`listen.metrics`).
//!
//! Families, all prefixed `selkie_supervisor_`:
//!
//! | name | type | labels |
//! |---|---|---|
//! | `requests_total` | counter | `endpoint`, `code` (HTTP status) |
//! | `request_duration_seconds` | histogram, 100 µs … 30 s | `endpoint` |
//! | `token_grants_total` | counter | `grant_type`, `result` (`ok` or the OAuth 2.0 error code) |
//! | `sessions_collected_total` | counter | `outcome` (`deleted`, `revoked`, `retrying`, `failed`) |
//! | `session_sweeps_total` | counter | `result` (`ok`, or `failed` when the list failed): garbage-collection sweeps finished |
//! | `session_sweep_duration_seconds` | histogram, 1 ms … 10 min | — : the time a sweep took, list, revocations and deletions |
//! | `connections_open` | gauge | `listener` (`https`, `http`, `metrics`) |
//! | `connections_refused_total` | counter | `listener`: connections closed at once because `listenerLimits.maxConnections` were open |
//!
//! Every label value comes from a fixed set (endpoints, grant types, OAuth error codes, status
//! codes): no user name, client input or token reaches a label, so the number of series stays
//! bounded and nothing secret is exported.

use std::time::Duration;

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::endpoints::oauth::Code;
use crate::session::gc::Sweep;

/// Latency bucket bounds, in seconds: 100 µs (discovery from memory) to 30 s (an upstream login).
const DURATION_BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Sweep duration bucket bounds, in seconds: a sweep lists every session's metadata (pages of
/// 500), so it grows with the sessions stored: 1 ms (none) to 10 min.
const SWEEP_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 600.0,
];

/// Which endpoint a request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types, reason = "the variant names are the label values")]
pub enum Endpoint {
    /// `/healthz`.
    healthz,
    /// `/.well-known/openid-configuration`.
    discovery,
    /// `/jwks.json`.
    jwks,
    /// `/v1alpha1/pinniped_identity_providers`.
    idp_discovery,
    /// `/oauth2/authorize`.
    authorize,
    /// `/callback`.
    callback,
    /// `/login` (the LDAP and Active Directory login page).
    login,
    /// `/choose_identity_provider`.
    choose_idp,
    /// `/oauth2/token`.
    token,
    /// `/oauth2/revoke`.
    revoke,
    /// `/oauth2/device_authorization`.
    device_authorization,
    /// `/device` (the device login's verification page).
    device,
    /// `/device/callback`.
    device_callback,
    /// `/saml/metadata` (the SAML service provider's metadata).
    saml_metadata,
    /// `/saml/acs` (the SAML assertion consumer service).
    saml_acs,
    /// No endpoint (404) or no FederationDomain for the host and path.
    none,
}

/// A token request's grant type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types, reason = "the variant names are the label values")]
pub enum Grant {
    /// `authorization_code`.
    authorization_code,
    /// `refresh_token`.
    refresh_token,
    /// RFC 8693 token exchange.
    token_exchange,
    /// RFC 8628 device code.
    device_code,
    /// Anything else, or a request refused before its grant type counted.
    other,
}

/// Which listener a connection came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types, reason = "the variant names are the label values")]
pub enum Listener {
    /// `listen.https`.
    https,
    /// `listen.http`.
    http,
    /// `listen.metrics`.
    metrics,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    endpoint: Endpoint,
    code: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: Endpoint,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GrantLabels {
    grant_type: Grant,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CollectedLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SweepLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabels {
    listener: Listener,
}

/// The Supervisor's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<EndpointLabels, Histogram>,
    grants: Family<GrantLabels, Counter>,
    collected: Family<CollectedLabels, Counter>,
    sweeps: Family<SweepLabels, Counter>,
    sweep_durations: Histogram,
    connections_open: Family<ListenerLabels, Gauge>,
    connections_refused: Family<ListenerLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every family, empty.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("selkie_supervisor");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by endpoint and status",
            requests.clone(),
        );
        let durations =
            Family::<EndpointLabels, Histogram>::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        registry.register_with_unit(
            "request_duration",
            "Time to answer a request, by endpoint",
            Unit::Seconds,
            durations.clone(),
        );
        let grants = Family::<GrantLabels, Counter>::default();
        registry.register(
            "token_grants",
            "Token endpoint requests, by grant type and result (ok or the OAuth 2.0 error)",
            grants.clone(),
        );
        let collected = Family::<CollectedLabels, Counter>::default();
        registry.register(
            "sessions_collected",
            "Expired session Secrets handled by the garbage collector, by outcome",
            collected.clone(),
        );
        let sweeps = Family::<SweepLabels, Counter>::default();
        registry.register(
            "session_sweeps",
            "Session garbage-collection sweeps finished, by result (ok, or failed: the list failed)",
            sweeps.clone(),
        );
        let sweep_durations = Histogram::new(SWEEP_BUCKETS);
        registry.register_with_unit(
            "session_sweep_duration",
            "Time a session garbage-collection sweep took",
            Unit::Seconds,
            sweep_durations.clone(),
        );
        let connections_open = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "connections_open",
            "Connections open (in the TLS handshake or served), by listener",
            connections_open.clone(),
        );
        let connections_refused = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections closed at once because the listener had its maximum open, by listener",
            connections_refused.clone(),
        );
        Self {
            registry,
            requests,
            durations,
            grants,
            collected,
            sweeps,
            sweep_durations,
            connections_open,
            connections_refused,
        }
    }

    /// Counts a request to `endpoint` answered with `status` after `elapsed`.
    pub fn request(&self, endpoint: Endpoint, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint,
                code: status,
            })
            .inc();
        self.durations
            .get_or_create(&EndpointLabels { endpoint })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a token request of `grant` that succeeded (`None`) or failed with `error`.
    pub fn grant(&self, grant: Grant, error: Option<Code>) {
        let result = error.map_or("ok", Code::as_str);
        self.grants
            .get_or_create(&GrantLabels {
                grant_type: grant,
                result,
            })
            .inc();
    }

    /// Counts what a garbage-collection sweep did.
    pub fn sweep(&self, sweep: &Sweep) {
        for (outcome, count) in [
            ("deleted", sweep.deleted),
            ("revoked", sweep.revoked),
            ("retrying", sweep.retrying),
            ("failed", sweep.failed),
        ] {
            self.collected
                .get_or_create(&CollectedLabels { outcome })
                .inc_by(count as u64);
        }
    }

    /// Counts a finished sweep that took `elapsed`: `ok`, or failed (its list failed).
    pub fn sweep_finished(&self, elapsed: Duration, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.sweeps.get_or_create(&SweepLabels { result }).inc();
        self.sweep_durations.observe(elapsed.as_secs_f64());
    }

    /// The gauge of `listener`'s open connections (a handle: increment it when a connection is
    /// admitted, decrement it when the connection ends).
    pub fn connections_open(&self, listener: Listener) -> Gauge {
        self.connections_open
            .get_or_create(&ListenerLabels { listener })
            .clone()
    }

    /// The counter of connections `listener` refused because it had its maximum open (a handle).
    pub fn connections_refused(&self, listener: Listener) -> Counter {
        self.connections_refused
            .get_or_create(&ListenerLabels { listener })
            .clone()
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_appear_under_their_labels() {
        let metrics = Metrics::new();
        metrics.request(Endpoint::token, 200, Duration::from_millis(3));
        metrics.request(Endpoint::token, 200, Duration::from_millis(4));
        metrics.request(Endpoint::none, 404, Duration::from_micros(50));
        metrics.grant(Grant::refresh_token, None);
        metrics.grant(Grant::authorization_code, Some(Code::InvalidGrant));
        metrics.sweep(&Sweep {
            deleted: 3,
            revoked: 1,
            ..Sweep::default()
        });
        metrics.sweep_finished(Duration::from_millis(20), true);
        metrics.sweep_finished(Duration::from_millis(30), true);
        metrics.sweep_finished(Duration::from_secs(2), false);
        metrics.connections_refused(Listener::https).inc();
        let open = metrics.connections_open(Listener::http);
        open.inc();
        open.inc();
        open.dec();
        let text = metrics.encode();
        for line in [
            "selkie_supervisor_requests_total{endpoint=\"token\",code=\"200\"} 2",
            "selkie_supervisor_requests_total{endpoint=\"none\",code=\"404\"} 1",
            "selkie_supervisor_request_duration_seconds_count{endpoint=\"token\"} 2",
            "selkie_supervisor_token_grants_total{grant_type=\"refresh_token\",result=\"ok\"} 1",
            "selkie_supervisor_token_grants_total{grant_type=\"authorization_code\",result=\"invalid_grant\"} 1",
            "selkie_supervisor_sessions_collected_total{outcome=\"deleted\"} 3",
            "selkie_supervisor_sessions_collected_total{outcome=\"revoked\"} 1",
            "selkie_supervisor_session_sweeps_total{result=\"ok\"} 2",
            "selkie_supervisor_session_sweeps_total{result=\"failed\"} 1",
            "selkie_supervisor_session_sweep_duration_seconds_count 3",
            "selkie_supervisor_session_sweep_duration_seconds_bucket{le=\"0.05\"} 2",
            "selkie_supervisor_connections_refused_total{listener=\"https\"} 1",
            "selkie_supervisor_connections_open{listener=\"http\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
