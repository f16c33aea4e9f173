//! The Supervisor's listeners: HTTPS (TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`, the certificate
//! chosen by SNI from [`ServingCert`]; a handshake it has no certificate for gets Pinniped's
//! bootstrap certificate, which serves `/healthz` only, so that probes pass before an admin has
//! configured any certificate) and, optionally, plain HTTP on a loopback address for a
//! sidecar that terminates TLS, both answering with the same [`Endpoints`]; and, optionally, the
//! plain-HTTP metrics listener ([`serve_metrics`]). Each stops accepting when `shutdown`
//! resolves, letting open connections finish for up to [`DRAIN_TIMEOUT`].

pub(crate) mod audit;
pub(crate) mod metrics;

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
};
use selkie_kube::serving::ServingCert;
use tokio::net::TcpListener;
use tokio_rustls::LazyConfigAcceptor;

use crate::endpoints::{text, Body, Endpoints};
use crate::server::metrics::Metrics;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an HTTP/1.1 client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may finish after shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

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
pub async fn serve_https(
    listener: TcpListener,
    serving: Arc<ServingCert>,
    endpoints: Arc<Endpoints>,
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
    serve(listener, Some(tls), handler(endpoints), shutdown).await;
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
/// in the OpenMetrics text format, `/healthz` answers `ok`, anything else 404.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>, shutdown: impl Future<Output = ()>) {
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
    serve(listener, None, handler, shutdown).await;
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

/// Serves plain HTTP on `listener` until `shutdown`.
pub async fn serve_http(
    listener: TcpListener,
    endpoints: Arc<Endpoints>,
    shutdown: impl Future<Output = ()>,
) {
    serve(listener, None, handler(endpoints), shutdown).await;
}

async fn serve(
    listener: TcpListener,
    tls: Option<Tls>,
    handler: impl Handler,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let handler = handler.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let result = match tls {
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &tls)).await {
                    Ok(Ok((stream, bootstrap_host))) => {
                        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                            let answer = match &bootstrap_host {
                                Some(host) if request.uri().path() != BOOTSTRAP_PATH => {
                                    futures::future::Either::Left(std::future::ready(no_certificate(
                                        host.as_deref(),
                                        request.uri().path(),
                                    )))
                                }
                                _ => futures::future::Either::Right(handler(request)),
                            };
                            async move { Ok::<_, Infallible>(answer.await) }
                        });
                        watcher
                            .watch(builder.serve_connection(TokioIo::new(stream), service))
                            .await
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
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let answer = handler(request);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    watcher
                        .watch(builder.serve_connection(TokioIo::new(tcp), service))
                        .await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}

#[cfg(test)]
mod tests;
