//! The operations port (`operationsListen`): `/healthz`, `/readyz` and `/metrics` over plain
//! HTTP, served by a pingora service in the proxy's own `Server`, so it starts, stops and shuts
//! down with the process.
//!
//! * `/healthz` answers 200 while the process runs (a liveness probe);
//! * `/readyz` answers 200 once the proxy serves with a loaded snapshot (and, with a control
//!   plane, once it can issue credentials), and 503 from the moment shutdown begins, so load
//!   balancers stop sending new connections before the listener closes (see [`Health`]);
//! * `/metrics` answers the registry in the OpenMetrics text format (see [`crate::metrics`]).
//!
//! Anything else is 404, and a method other than `GET` on these paths is 405. Nothing served here
//! is secret (no tokens, keys or user names), but the port has no TLS or authentication: bind it
//! to loopback or the pod network, not to the proxy's public address.

use std::sync::{
    atomic::{AtomicBool, AtomicU8, Ordering},
    Arc,
};

use async_trait::async_trait;
use http::{header, HeaderValue, Method, Response, StatusCode};
use pingora::{apps::http_app::ServeHttp, protocols::http::ServerSession, services::listening::Service};
use prometheus_client::registry::Registry;

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const SHUTTING_DOWN: u8 = 2;

/// The readiness of the process: starting, then serving, then shutting down, never backwards.
/// Shared between whoever drives the lifecycle and the operations service. A process whose
/// proxy depends on something else (a control plane that must first load its signer) can hold
/// readiness back with [`Health::hold`] until it calls [`Health::release`].
#[derive(Debug, Default)]
pub struct Health {
    state: AtomicU8,
    held: AtomicBool,
}

impl Health {
    /// Starting: not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Call once the proxy's listener serves with a loaded snapshot. Ignored once shutdown has
    /// begun.
    pub fn serving(&self) {
        let _ignored_after_shutdown =
            self.state
                .compare_exchange(STARTING, SERVING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Call when shutdown begins: from now on the process is not ready, for good.
    pub fn shutting_down(&self) {
        self.state.store(SHUTTING_DOWN, Ordering::Release);
    }

    /// Keeps `/readyz` at 503 until [`Health::release`], whatever the lifecycle says.
    pub fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Ends a [`Health::hold`].
    pub fn release(&self) {
        self.held.store(false, Ordering::Release);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == SERVING && !self.held.load(Ordering::Acquire)
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.state.load(Ordering::Acquire) == SHUTTING_DOWN
    }
}

/// The operations endpoints' application logic.
#[derive(Debug, Clone)]
pub struct Operations {
    health: Arc<Health>,
    registry: Arc<Registry>,
}

impl Operations {
    /// Serves `health` and the metrics in `registry`.
    pub fn new(health: Arc<Health>, registry: Arc<Registry>) -> Self {
        Self { health, registry }
    }

    /// A pingora service listening on `address` (`host:port`, plain TCP) with one thread of its
    /// own. Add it to the proxy's `Server`; binding happens when the server starts.
    pub fn service(self, address: &str) -> Service<Self> {
        let mut service = Service::new("selkie operations".to_string(), self);
        service.add_tcp(address);
        service.threads = Some(1);
        service
    }

    /// The response to `method path`. Never fails: a metrics encoding error is a 500.
    pub fn respond(&self, method: &Method, path: &str) -> Response<Vec<u8>> {
        let known = matches!(path, "/healthz" | "/readyz" | "/metrics");
        if !known {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
        if method != Method::GET {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET"));
            return response;
        }
        match path {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.health.is_ready() => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.health.is_shutting_down() => {
                text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            }
            "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n"),
            _ => {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &self.registry) {
                    Ok(()) => response(
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body.into_bytes(),
                    ),
                    Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed\n"),
                }
            }
        }
    }
}

fn text(status: StatusCode, body: &str) -> Response<Vec<u8>> {
    response(status, "text/plain; charset=utf-8", body.as_bytes().to_vec())
}

fn response(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Vec<u8>> {
    let length = HeaderValue::from(body.len());
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, length);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[async_trait]
impl ServeHttp for Operations {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let request = session.req_header();
        let response = self.respond(&request.method, request.uri.path());
        if request.method != Method::GET {
            // A request body, if any, was not read: the connection cannot carry another request.
            session.set_keepalive(None);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, VerbClass};

    fn operations() -> (Operations, Arc<Health>, Metrics) {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let health = Arc::new(Health::new());
        (
            Operations::new(health.clone(), Arc::new(registry)),
            health,
            metrics,
        )
    }

    fn get(operations: &Operations, path: &str) -> (StatusCode, String) {
        let response = operations.respond(&Method::GET, path);
        let status = response.status();
        (status, String::from_utf8(response.into_body()).unwrap())
    }

    #[test]
    fn readiness_follows_the_lifecycle_and_never_goes_back() {
        let (operations, health, _) = operations();
        assert_eq!(get(&operations, "/healthz").0, StatusCode::OK);
        assert_eq!(
            get(&operations, "/readyz"),
            (StatusCode::SERVICE_UNAVAILABLE, "starting\n".into())
        );
        health.serving();
        assert_eq!(get(&operations, "/readyz"), (StatusCode::OK, "ok\n".into()));
        health.shutting_down();
        health.serving();
        assert_eq!(
            get(&operations, "/readyz"),
            (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into())
        );
        assert_eq!(
            get(&operations, "/healthz").0,
            StatusCode::OK,
            "alive while draining"
        );
    }

    #[test]
    fn metrics_are_openmetrics_text() {
        let (operations, _, metrics) = operations();
        let _watch = metrics.request_started(VerbClass::Watch);
        let response = operations.respond(&Method::GET, "/metrics");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let body = String::from_utf8(response.into_body()).unwrap();
        assert!(
            body.contains("selkie_proxy_in_flight_requests{verb_class=\"watch\"} 1\n"),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"));
    }

    #[test]
    fn other_paths_and_methods_are_refused() {
        let (operations, _, _) = operations();
        assert_eq!(get(&operations, "/").0, StatusCode::NOT_FOUND);
        assert_eq!(get(&operations, "/metrics/extra").0, StatusCode::NOT_FOUND);
        let response = operations.respond(&Method::POST, "/readyz");
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "GET");
    }
}
