//! Prometheus metrics of the request path, served on the operations port
//! ([`crate::operations`]).
//!
//! Families, all prefixed `selkie_proxy_`:
//!
//! | name | type | labels |
//! |---|---|---|
//! | `requests_total` | counter | `code` (HTTP status; `0` when no response was sent), `verb_class` |
//! | `request_duration_seconds` | histogram, 100 µs … 60 s | `verb_class` |
//! | `authentications_total` | counter | `authenticator`, `result`, `reason` |
//! | `upstream_connections_total` | counter | `connection` ([`UpstreamConnection`]: `new`, `resumed` or `reused`) |
//! | `in_flight_requests` | gauge | `verb_class` |
//! | `active_tunnels` | gauge | — |
//! | `connections_open` | gauge | — |
//! | `connections_refused_total` | counter | — |
//!
//! Every label value comes from a fixed set (status codes, [`VerbClass`], reject reasons) or from
//! the configuration (authenticator names); none is taken from a request, so user names, tokens,
//! paths and object names never reach a label and the number of series stays bounded.

use std::{sync::Arc, time::Duration};

use http::{header, request::Parts, HeaderMap, Method, Uri};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};
use selkie_filters::chain::Decision;

/// Upper bounds of the latency buckets, in seconds: 100 µs up to a minute (watches and tunnels
/// that last longer land in `+Inf`).
const DURATION_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

/// What kind of work a request is, from its method, path, query and headers: the one request
/// property metrics are split by, because the classes differ by orders of magnitude in duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerbClass {
    /// `GET` (get, list) and `HEAD`.
    Read,
    /// `POST`, `PUT`, `PATCH`, `DELETE`.
    Write,
    /// A `GET` that watches: `?watch=` with any value but `0` or `false` (kube-apiserver's rule),
    /// or a legacy `/api/{version}/watch/…` or `/apis/{group}/{version}/watch/…` path.
    Watch,
    /// A protocol upgrade (`Connection: Upgrade` with an `Upgrade` header): exec, attach,
    /// port-forward over SPDY or WebSocket.
    Upgrade,
    /// Any other method.
    Other,
}

impl VerbClass {
    /// Every class, in label order.
    pub const ALL: [Self; 5] = [Self::Read, Self::Write, Self::Watch, Self::Upgrade, Self::Other];

    /// Classifies a request. Looks at headers, method and URI only; never fails.
    pub fn of(request: &Parts) -> Self {
        if is_upgrade(&request.headers) {
            return Self::Upgrade;
        }
        match request.method {
            Method::GET if is_watch(&request.uri) => Self::Watch,
            Method::GET | Method::HEAD => Self::Read,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE => Self::Write,
            _ => Self::Other,
        }
    }

    /// The label value: `read`, `write`, `watch`, `upgrade` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Watch => "watch",
            Self::Upgrade => "upgrade",
            Self::Other => "other",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Read => 0,
            Self::Write => 1,
            Self::Watch => 2,
            Self::Upgrade => 3,
            Self::Other => 4,
        }
    }
}

impl EncodeLabelValue for VerbClass {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers.get_all(header::CONNECTION).iter().any(|value| {
            value.to_str().is_ok_and(|value| {
                value
                    .split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

fn is_watch(uri: &Uri) -> bool {
    let by_query = uri.query().is_some_and(|query| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(name, _)| name == "watch")
            .is_some_and(|(_, value)| value != "0" && !value.eq_ignore_ascii_case("false"))
    });
    by_query || is_legacy_watch_path(uri.path())
}

/// `/api/{version}/watch/…` or `/apis/{group}/{version}/watch/…`; a namespace or object that
/// happens to be called `watch` elsewhere in the path does not count.
fn is_legacy_watch_path(path: &str) -> bool {
    let mut segments = path.trim_start_matches('/').split('/');
    let skip = match segments.next() {
        Some("api") => 1,
        Some("apis") => 2,
        _ => return false,
    };
    segments.nth(skip) == Some("watch") && segments.next().is_some_and(|next| !next.is_empty())
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    code: u16,
    verb_class: VerbClass,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VerbClassLabel {
    verb_class: VerbClass,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AuthenticationLabels {
    authenticator: Arc<str>,
    result: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConnectionLabel {
    connection: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// How a request reached kube-apiserver, the `connection` label of `upstream_connections_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamConnection {
    /// A new connection, with a full TLS handshake.
    New,
    /// A new connection whose TLS handshake resumed an earlier session (a tunnel's: pingora's
    /// own connections never resume).
    Resumed,
    /// A pooled connection.
    Reused,
}

impl UpstreamConnection {
    /// A connection from pingora's pools: `Reused` when it was pooled, `New` otherwise.
    pub fn pooled(reused: bool) -> Self {
        if reused {
            Self::Reused
        } else {
            Self::New
        }
    }
}

/// Counts one request or tunnel in a gauge for as long as it lives: dropping it (at the end of
/// the request, on an error, or when the request's task is cancelled) takes it out again.
#[derive(Debug)]
#[must_use = "the gauge goes back down when this is dropped"]
pub struct Active(Gauge);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The proxy's metric families. Cheap to clone: every clone records into the same series.
#[derive(Debug, Clone)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    durations: [Histogram; 5],
    authentications: Family<AuthenticationLabels, Counter>,
    upstream_connections: [Counter; 3],
    in_flight: [Gauge; 5],
    tunnels: Gauge,
    connections_open: Gauge,
    connections_refused: Counter,
    /// The `authenticator` label values that name no configured authenticator.
    anonymous: Arc<str>,
    chain: Arc<str>,
}

impl Metrics {
    /// Creates the families and registers them in `registry` under the `selkie_proxy_` prefix.
    /// The per-class series (durations, in-flight gauges, upstream connections) exist from the
    /// start, at zero.
    pub fn new(registry: &mut Registry) -> Self {
        let registry = registry.sub_registry_with_prefix("selkie_proxy");

        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests answered, by HTTP status code (0 when no response was sent) and verb class",
            requests.clone(),
        );

        let durations_family =
            Family::<VerbClassLabel, Histogram, fn() -> Histogram>::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "request_duration",
            "Time from the request's headers to the end of its response, by verb class",
            Unit::Seconds,
            durations_family.clone(),
        );
        let durations = VerbClass::ALL
            .map(|verb_class| durations_family.get_or_create_owned(&VerbClassLabel { verb_class }));

        let authentications = Family::<AuthenticationLabels, Counter>::default();
        registry.register(
            "authentications",
            "Authentication verdicts: result authenticated, anonymous or rejected; a rejection \
             counts once for each authenticator that refused the credential, with its reason",
            authentications.clone(),
        );

        let connections_family = Family::<ConnectionLabel, Counter>::default();
        registry.register(
            "upstream_connections",
            "Requests sent to kube-apiserver, by whether the connection was new or reused",
            connections_family.clone(),
        );
        let upstream_connections = ["new", "resumed", "reused"]
            .map(|connection| connections_family.get_or_create_owned(&ConnectionLabel { connection }));

        let in_flight_family = Family::<VerbClassLabel, Gauge>::default();
        registry.register(
            "in_flight_requests",
            "Requests being served (open watches and tunnels included), by verb class",
            in_flight_family.clone(),
        );
        let in_flight = VerbClass::ALL
            .map(|verb_class| in_flight_family.get_or_create_owned(&VerbClassLabel { verb_class }));

        let tunnels = Gauge::default();
        registry.register(
            "active_tunnels",
            "Upgraded connections (exec, attach, port-forward) open now",
            tunnels.clone(),
        );

        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Client connections open now, TLS handshakes included (at most listenerLimits.maxConnections)",
            connections_open.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Client connections closed at once because listenerLimits.maxConnections were open",
            connections_refused.clone(),
        );

        Self {
            requests,
            durations,
            authentications,
            upstream_connections,
            in_flight,
            tunnels,
            connections_open,
            connections_refused,
            anonymous: Arc::from("anonymous"),
            chain: Arc::from("chain"),
        }
    }

    /// Call when a request's headers have been read: it counts as in flight until the returned
    /// guard is dropped.
    pub fn request_started(&self, verb_class: VerbClass) -> Active {
        let gauge = self.in_flight[verb_class.index()].clone();
        gauge.inc();
        Active(gauge)
    }

    /// Call once per request when it ends, with the status sent (`0` if none was) and the time
    /// since its headers were read.
    pub fn request_finished(&self, verb_class: VerbClass, code: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels { code, verb_class })
            .inc();
        self.durations[verb_class.index()].observe(elapsed.as_secs_f64());
    }

    /// Records the authentication chain's verdict on one request: the authenticator that
    /// accepted it; `anonymous` when no credential was presented; each refusing authenticator
    /// with its reason; or authenticator `chain` with reason `unrecognized` when a credential was
    /// presented that no authenticator recognised.
    pub fn authentication(&self, decision: &Decision) {
        let count = |authenticator: &Arc<str>, result, reason| {
            self.authentications
                .get_or_create(&AuthenticationLabels {
                    authenticator: authenticator.clone(),
                    result,
                    reason,
                })
                .inc();
        };
        match decision {
            Decision::Authenticated(identity) => count(&identity.authenticator, "authenticated", "none"),
            Decision::Anonymous => count(&self.anonymous, "anonymous", "none"),
            Decision::Unauthenticated(refusals) if refusals.is_empty() => {
                count(&self.chain, "rejected", "unrecognized")
            }
            Decision::Unauthenticated(refusals) => {
                for (authenticator, reason) in refusals {
                    count(authenticator, "rejected", reason.as_str());
                }
            }
        }
    }

    /// Call each time a request is about to be sent upstream, with how it got its connection.
    pub fn upstream_connected(&self, connection: UpstreamConnection) {
        self.upstream_connections[connection as usize].inc();
    }

    /// Call when a request has been upgraded (101 Switching Protocols): it counts as an active
    /// tunnel until the returned guard is dropped.
    pub fn tunnel_opened(&self) -> Active {
        self.tunnels.inc();
        Active(self.tunnels.clone())
    }

    /// Call when a client connection takes a place under `listenerLimits.maxConnections`
    /// ([`crate::admission`]): it counts as open until the returned guard is dropped.
    pub fn connection_admitted(&self) -> Active {
        self.connections_open.inc();
        Active(self.connections_open.clone())
    }

    /// Call when a client connection is closed at once because `listenerLimits.maxConnections`
    /// are open.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// How many requests are in flight now, all classes together (what a graceful shutdown waits
    /// for).
    pub fn in_flight(&self) -> i64 {
        self.in_flight.iter().map(Gauge::get).sum()
    }
}

#[cfg(test)]
mod tests;
