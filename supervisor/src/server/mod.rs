//! The Supervisor's listeners: HTTPS (TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`, the certificate
//! chosen by SNI from [`ServingCert`]; a handshake it has no certificate for gets Pinniped's
//! bootstrap certificate, which serves `/healthz` only, so that probes pass before an admin has
//! configured any certificate) and, optionally, plain HTTP on a loopback address for a
//! sidecar that terminates TLS, both answering with the same [`Endpoints`]; and, optionally, the
//! plain-HTTP metrics listener ([`serve_metrics`]). Each stops accepting when `shutdown`
//! resolves, letting open connections finish for up to its drain timeout
//! ([`ListenerLimits::drain_timeout`]). Before that, on SIGTERM, [`Readiness`] turns `/healthz`
//! to 503 while the listeners keep serving for the grace period.
//!
//! What one client can hold is bounded ([`limits`]): connections per listener, idle connections,
//! the TLS handshake ([`HANDSHAKE_TIMEOUT`]), request heads, and HTTP/2's streams, resets and
//! header blocks ([`connection_builder`]).

pub(crate) mod audit;
pub(crate) mod limits;
pub(crate) mod metrics;

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use selkie_kube::serving::ServingCert;
use tokio::{net::TcpListener, sync::watch, task::JoinSet, time::Instant};
use tokio_rustls::LazyConfigAcceptor;

use crate::endpoints::{text, Body, Endpoints};
use crate::server::limits::{Admission, InFlight, ListenerLimits, Tracked, MAX_HEADER_BYTES};
use crate::server::metrics::{Listener, Metrics};

/// Whether the Supervisor still takes new work. It does until SIGTERM; then [`Readiness::stop`]
/// turns `/healthz` of the HTTPS and HTTP listeners to 503 (`shutting down`) for the grace period
/// while they keep serving, so whatever probes it (kubelet's readiness probe, a load balancer's
/// health check) sends new connections elsewhere before the listeners close. It never turns back.
#[derive(Debug, Default)]
pub struct Readiness {
    stopping: std::sync::atomic::AtomicBool,
}

impl Readiness {
    /// From now on `/healthz` answers 503.
    pub fn stop(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether [`Readiness::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection closed for idleness may take to go (HTTP/2 sends GOAWAY and waits for the
/// client's PING acknowledgement before closing) before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long the accept loop pauses after an accept error other than a connection's own (out of
/// file descriptors, say), so that it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(500);
/// How often an HTTP/2 connection is sent a PING (when nothing arrived meanwhile), to notice a
/// peer that is gone while its requests are in flight; one not acknowledged within
/// [`HTTP2_KEEP_ALIVE_TIMEOUT`] closes the connection. Acknowledgements are no requests: they do
/// not keep an idle connection open.
const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`HTTP2_KEEP_ALIVE_INTERVAL`].
const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 flow-control windows: request bodies a client may have sent and the Supervisor not yet
/// read, per stream (a whole form, [`crate::endpoints::MAX_FORM_BYTES`]) and per connection.
const HTTP2_STREAM_WINDOW: u32 = 64 * 1024;
/// See [`HTTP2_STREAM_WINDOW`].
const HTTP2_CONNECTION_WINDOW: u32 = 256 * 1024;
/// Streams a client may reset before the server has accepted them (CVE-2023-26964, and HTTP/2
/// "Rapid Reset", CVE-2023-44487: open and cancel streams faster than they are served); more closes
/// the connection with ENHANCE_YOUR_CALM. h2's default, set explicitly.
const HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Streams the server may reset because of the client's protocol errors over a connection's life
/// (RUSTSEC-2024-0003, and "MadeYouReset", CVE-2025-8671: malformed frames that make the server
/// reset streams, escaping the rapid-reset limit); more closes the connection with
/// ENHANCE_YOUR_CALM. hyper's default, set explicitly.
const HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// Why a listener could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The address cannot be bound.
    #[error("listening on {addr}: {message}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What went wrong.
        message: String,
    },
    /// The TLS configuration cannot be built.
    #[error("the TLS configuration: {0}")]
    Tls(String),
}

/// Binds `addr` (so a caller learns at once that the port is taken).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr).await.map_err(|e| ServerError::Bind {
        addr,
        message: e.to_string(),
    })
}

/// The path a connection with the bootstrap certificate may ask for.
const BOOTSTRAP_PATH: &str = "/healthz";

/// Serves HTTPS on `listener` until `shutdown`. A handshake `serving` has no certificate for (no
/// FederationDomain host and no default certificate yet) completes with a self-signed bootstrap
/// certificate generated at start, as Pinniped's does: that connection gets `/healthz` and, for
/// anything else, a 500 saying the TLS configuration is missing, with a warning naming the host.
///
/// At most `limits.max_connections` connections are open at once; see [`limits`] for what else
/// `limits` bounds.
pub async fn serve_https(
    listener: TcpListener,
    serving: Arc<ServingCert>,
    endpoints: Arc<Endpoints>,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let config = |resolver: Arc<dyn rustls::server::ResolvesServerCert>| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ServerError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok::<_, ServerError>(Arc::new(tls))
    };
    let bootstrap = bootstrap_certificate()?;
    let tls = Tls {
        configured: config(serving.clone())?,
        bootstrap: config(Arc::new(ServingCert::new(bootstrap)))?,
        serving,
    };
    let admission = Admission::new(Listener::https, limits, &endpoints.metrics);
    serve(listener, Some(tls), handler(endpoints), admission, shutdown).await;
    Ok(())
}

/// A self-signed certificate for `pinniped-supervisor-bootstrap-cert` (Pinniped's name): just
/// enough to complete a handshake; nobody trusts it.
fn bootstrap_certificate() -> Result<rustls::sign::CertifiedKey, ServerError> {
    const FOREVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
    let failed = |e: &dyn std::fmt::Display| ServerError::Tls(format!("the bootstrap certificate: {e}"));
    let ca = selkie_kube::certs::generate_ca("pinniped-supervisor-bootstrap-ca", FOREVER)
        .map_err(|e| failed(&e))?;
    let pair =
        selkie_kube::certs::issue_serving(&ca, &["pinniped-supervisor-bootstrap-cert".into()], FOREVER)
            .map_err(|e| failed(&e))?;
    ServingCert::load(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).map_err(|e| failed(&e))
}

/// The TLS side of the HTTPS listener: the configured certificates, and the bootstrap one for
/// handshakes they have nothing for.
#[derive(Clone)]
struct Tls {
    configured: Arc<rustls::ServerConfig>,
    bootstrap: Arc<rustls::ServerConfig>,
    serving: Arc<ServingCert>,
}

/// The answer on a bootstrap connection to anything but [`BOOTSTRAP_PATH`].
fn no_certificate(host: Option<&str>, path: &str) -> Response<Body> {
    tracing::warn!(
        sni = host.unwrap_or(""),
        path,
        "no TLS serving certificate for this host: only /healthz is served (configure a FederationDomain's TLS Secret or the default one)"
    );
    text(
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "pinniped supervisor has invalid TLS serving certificate configuration",
    )
}

/// The handler answering every request with `endpoints`.
fn handler(endpoints: Arc<Endpoints>) -> impl Handler {
    move |request: Request<Incoming>| {
        let endpoints = endpoints.clone();
        async move { endpoints.handle(request).await }
    }
}

/// Serves the metrics listener (plain HTTP) until `shutdown`: `GET /metrics` answers `metrics`
/// in the OpenMetrics text format, `/healthz` answers `ok`, anything else 404. Its limits are fixed
/// (64 connections, otherwise [`ListenerLimits::DEFAULT`]).
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>, shutdown: impl Future<Output = ()>) {
    let admission = Admission::new(Listener::metrics, ListenerLimits::METRICS, &metrics);
    let handler = move |request: Request<Incoming>| {
        let metrics = metrics.clone();
        async move {
            match (request.method(), request.uri().path()) {
                (&http::Method::GET, "/metrics") => {
                    let mut response = text(http::StatusCode::OK, &metrics.encode());
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static(
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        ),
                    );
                    response
                }
                (_, "/healthz") => text(http::StatusCode::OK, "ok"),
                _ => text(http::StatusCode::NOT_FOUND, "404 page not found"),
            }
        }
    };
    serve(listener, None, handler, admission, shutdown).await;
}

/// The TLS handshake on `tcp`: with the configured certificates when they have one for the
/// ClientHello's name, else with the bootstrap certificate. Returns the stream and, for a
/// bootstrap connection, the name it asked for (`Some(None)`: no SNI).
async fn handshake(
    tcp: tokio::net::TcpStream,
    tls: &Tls,
) -> std::io::Result<(
    tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    Option<Option<String>>,
)> {
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await?;
    let name = start.client_hello().server_name().map(str::to_string);
    let bootstrap = tls.serving.resolve_name(name.as_deref()).is_none();
    let config = if bootstrap {
        tls.bootstrap.clone()
    } else {
        tls.configured.clone()
    };
    let stream = start.into_stream(config).await?;
    Ok((stream, bootstrap.then_some(name)))
}

/// What answers a listener's requests.
trait Handler: Fn(Request<Incoming>) -> Self::Answer + Clone + Send + Sync + 'static {
    type Answer: Future<Output = Response<Body>> + Send + 'static;
}

impl<F, A> Handler for F
where
    F: Fn(Request<Incoming>) -> A + Clone + Send + Sync + 'static,
    A: Future<Output = Response<Body>> + Send + 'static,
{
    type Answer = A;
}

/// Serves plain HTTP on `listener` until `shutdown`, with `limits` as [`serve_https`].
pub async fn serve_http(
    listener: TcpListener,
    endpoints: Arc<Endpoints>,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let admission = Admission::new(Listener::http, limits, &endpoints.metrics);
    serve(listener, None, handler(endpoints), admission, shutdown).await;
}

/// The connection settings every listener serves with, from `limits`: hyper-util's auto builder
/// (HTTP/1.1, or HTTP/2 when the client starts with its preface, as after ALPN `h2`).
fn connection_builder(limits: &ListenerLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // The read buffer must hold a whole request head: a larger one is answered 431.
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        // Also bounds the CONTINUATION frames of one header block (h2 ≥ 0.4.4 allows about this
        // size over the frame size, then closes the connection): the CONTINUATION flood,
        // VU#421644 (RUSTSEC-2024-0332 for h2).
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_pending_accept_reset_streams(HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .keep_alive_interval(HTTP2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT);
    builder
}

/// Accepts connections on `listener` and serves them with `handler` (over TLS when `tls` is
/// given) until `shutdown`: each connection is admitted by `admission` (or closed at once), then
/// gets its own task, which ends when the connection does, including when it is idle for the idle
/// timeout. After `shutdown`, open connections are asked to close and given the drain timeout of
/// `admission`'s limits; those still open then are dropped.
async fn serve(
    listener: TcpListener,
    tls: Option<Tls>,
    handler: impl Handler,
    mut admission: Admission,
    shutdown: impl Future<Output = ()>,
) {
    let limits = *admission.limits();
    let builder = Arc::new(connection_builder(&limits));
    let (stopping, stop) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_connection_error(&error) => continue,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            // Reaps the tasks of connections that ended.
            Some(_) = connections.join_next() => continue,
            () = &mut shutdown => break,
        };
        let Some(admitted) = admission.admit(peer) else {
            // A reset rather than a FIN: the client learns at once, and no TIME_WAIT is kept here.
            let _ = tcp.set_zero_linger();
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (handler, tls, builder, stop) = (handler.clone(), tls.clone(), builder.clone(), stop.clone());
        connections.spawn(async move {
            // Held until this task ends, however it ends.
            let _admitted = admitted;
            let in_flight = InFlight::default();
            let result = match tls {
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &tls)).await {
                    Ok(Ok((stream, bootstrap_host))) => {
                        let service = service(handler, bootstrap_host, in_flight.clone());
                        drive(&builder, TokioIo::new(stream), service, &in_flight, limits, stop).await
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                },
                None => {
                    let service = service(handler, None, in_flight.clone());
                    drive(&builder, TokioIo::new(tcp), service, &in_flight, limits, stop).await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(drain_timeout = ?limits.drain_timeout, "connections still open after the drain timeout; closing them");
        connections.shutdown().await;
    }
}

/// Whether an accept error is the connection's own (it went away before it was accepted), not
/// the listener's.
fn is_connection_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// The service of one connection: `handler` answers, except on a bootstrap connection
/// (`bootstrap_host` is `Some`, holding the name the client asked for) where only
/// [`BOOTSTRAP_PATH`] reaches it. Each request counts in `in_flight` until its response body is
/// dropped.
fn service(
    handler: impl Handler,
    bootstrap_host: Option<Option<String>>,
    in_flight: InFlight,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Tracked<Body>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Tracked<Body>>, Infallible>> + Send + 'static,
> + Send
       + 'static {
    hyper::service::service_fn(move |request: Request<Incoming>| {
        let request_guard = in_flight.start();
        let answer = match &bootstrap_host {
            Some(host) if request.uri().path() != BOOTSTRAP_PATH => futures::future::Either::Left(
                std::future::ready(no_certificate(host.as_deref(), request.uri().path())),
            ),
            _ => futures::future::Either::Right(handler(request)),
        };
        async move {
            let response = answer.await;
            Ok::<_, Infallible>(response.map(|body| Tracked::new(body, request_guard)))
        }
    })
}

/// Serves one connection with `service` until it ends: the client closes it, it fails, it has
/// had no request in `in_flight` for `limits.idle_timeout`, or `stop` turns true. In the last two cases
/// it is closed gracefully (HTTP/2 GOAWAY; HTTP/1.1 after the response in progress), and dropped
/// if that takes longer than [`IDLE_CLOSE_GRACE`] (idle) or `limits.drain_timeout` (stopping).
async fn drive<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    in_flight: &InFlight,
    limits: ListenerLimits,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<Tracked<Body>>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let idle = in_flight.idle_for(limits.idle_timeout);
    let mut idle = std::pin::pin!(idle);
    // Once the connection is asked to close: when it is dropped if it has not closed.
    let mut deadline: Option<Instant> = None;
    loop {
        tokio::select! {
            result = connection.as_mut() => return result,
            () = &mut idle, if deadline.is_none() => {
                tracing::debug!(idle_timeout = ?limits.idle_timeout, "closing an idle connection");
                connection.as_mut().graceful_shutdown();
                deadline = Some(Instant::now() + IDLE_CLOSE_GRACE);
            }
            _ = stop.wait_for(|stop| *stop), if deadline.is_none() => {
                connection.as_mut().graceful_shutdown();
                deadline = Some(Instant::now() + limits.drain_timeout);
            }
            () = until(deadline) => {
                tracing::debug!("a connection asked to close did not; dropping it");
                return Ok(());
            }
        }
    }
}

/// Resolves at `deadline`, or never without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
