//! `selkie-perf-backend`: the fast HTTPS server behind every benchmark scenario, standing in for
//! kube-apiserver.
//!
//! TLS 1.3 (rustls, ring), ALPN `h2` and `http/1.1`, HTTP/2 capped at 250 concurrent streams
//! like kube-apiserver. Every connection must present a client certificate from `--client-ca`
//! (the proxy's upstream identity). Every request must carry exactly one `Impersonate-User`
//! equal to `--expect-user`, the `Impersonate-Group` values of `--expect-group` in that order, no
//! other `Impersonate-*` header and no `Authorization`; a request that does not is answered 403
//! and counted as an impersonation mismatch. Anything else gets a fixed JSON body of
//! `--body-bytes` bytes.
//!
//! The counters are served as JSON on `GET /counters` of the plain-HTTP `--admin-listen` port
//! and printed to stdout when the process gets SIGTERM or SIGINT.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use selkie_perf::{
    report::BackendCounters,
    tls::{server_config, ALPN_H2, ALPN_HTTP11},
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// How many mismatches are kept as examples.
const MISMATCH_EXAMPLES: usize = 5;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-backend", about)]
struct Args {
    /// Address of the HTTPS listener.
    #[arg(long, default_value = "127.0.0.1:9443")]
    listen: SocketAddr,
    /// Address of the plain-HTTP counters endpoint.
    #[arg(long, default_value = "127.0.0.1:9080")]
    admin_listen: SocketAddr,
    /// Serving certificate (PEM).
    #[arg(long)]
    cert: PathBuf,
    /// Serving key (PEM).
    #[arg(long)]
    key: PathBuf,
    /// CA bundle client certificates must chain to.
    #[arg(long)]
    client_ca: PathBuf,
    /// The `Impersonate-User` every request must carry.
    #[arg(long)]
    expect_user: String,
    /// The `Impersonate-Group` values every request must carry, in order (repeat the flag).
    #[arg(long)]
    expect_group: Vec<String>,
    /// Size of the JSON response body.
    #[arg(long, default_value_t = 1024)]
    body_bytes: usize,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (kube-apiserver's default is 250).
    #[arg(long, default_value_t = 250)]
    max_streams: u32,
}

/// Shared state: what to expect, what to answer, what happened.
struct State {
    expect_user: String,
    expect_groups: Vec<String>,
    body: Bytes,
    connections: AtomicU64,
    handshake_failures: AtomicU64,
    requests: AtomicU64,
    http1_requests: AtomicU64,
    http2_requests: AtomicU64,
    mismatches: AtomicU64,
    examples: Mutex<Vec<String>>,
}

impl State {
    fn counters(&self) -> BackendCounters {
        BackendCounters {
            connections: self.connections.load(Ordering::Relaxed),
            handshake_failures: self.handshake_failures.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            http1_requests: self.http1_requests.load(Ordering::Relaxed),
            http2_requests: self.http2_requests.load(Ordering::Relaxed),
            impersonation_mismatches: self.mismatches.load(Ordering::Relaxed),
            mismatch_examples: self.examples.lock().map(|e| e.clone()).unwrap_or_default(),
        }
    }

    /// Why the request's identity headers are wrong, or `None` if they are exactly right.
    fn mismatch(&self, request: &Request<Incoming>) -> Option<String> {
        let headers = request.headers();
        if headers.contains_key(header::AUTHORIZATION) {
            return Some("an Authorization header reached the backend".into());
        }
        let users: Vec<&HeaderValue> = headers.get_all("impersonate-user").iter().collect();
        if users.len() != 1 || users[0].as_bytes() != self.expect_user.as_bytes() {
            return Some(format!("Impersonate-User was {users:?}"));
        }
        let groups: Vec<&HeaderValue> = headers.get_all("impersonate-group").iter().collect();
        if groups.len() != self.expect_groups.len()
            || groups
                .iter()
                .zip(&self.expect_groups)
                .any(|(got, want)| got.as_bytes() != want.as_bytes())
        {
            return Some(format!("Impersonate-Group was {groups:?}"));
        }
        headers
            .keys()
            .map(|name| name.as_str())
            .find(|name| {
                name.starts_with("impersonate-")
                    && *name != "impersonate-user"
                    && *name != "impersonate-group"
            })
            .map(|name| format!("unexpected header {name}"))
    }

    fn handle(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if request.version() == Version::HTTP_2 {
            self.http2_requests.fetch_add(1, Ordering::Relaxed);
        } else {
            self.http1_requests.fetch_add(1, Ordering::Relaxed);
        }
        let (status, body) = match self.mismatch(request) {
            None => (StatusCode::OK, self.body.clone()),
            Some(why) => {
                self.mismatches.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut examples) = self.examples.lock() {
                    if examples.len() < MISMATCH_EXAMPLES {
                        examples.push(why);
                    }
                }
                (
                    StatusCode::FORBIDDEN,
                    Bytes::from_static(br#"{"kind":"Status","code":403}"#),
                )
            }
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// A ConfigMap-shaped JSON document of exactly `size` bytes (at least its fixed part).
fn json_body(size: usize) -> Bytes {
    let head = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"selkie-perf","namespace":"default"},"data":{"payload":""#;
    let tail = r#""}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut body = String::with_capacity(size);
    body.push_str(head);
    body.extend(std::iter::repeat_n('x', pad));
    body.push_str(tail);
    Bytes::from(body)
}

async fn serve_tls(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<State>, max_streams: u32) {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(max_streams);
    let builder = Arc::new(builder);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let state = state.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(_) => {
                    state.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            state.connections.fetch_add(1, Ordering::Relaxed);
            let service = service_fn(|request: Request<Incoming>| {
                let response = state.handle(&request);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

async fn serve_admin(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(|request: Request<Incoming>| {
                let response = if request.uri().path() == "/counters" {
                    let json = serde_json::to_vec(&state.counters()).unwrap_or_default();
                    Response::new(Full::new(Bytes::from(json)))
                } else {
                    let mut response = Response::new(Full::new(Bytes::new()));
                    *response.status_mut() = StatusCode::NOT_FOUND;
                    response
                };
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let config = server_config(&args.cert, &args.key, &args.client_ca, &[ALPN_H2, ALPN_HTTP11])?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let state = Arc::new(State {
        expect_user: args.expect_user,
        expect_groups: args.expect_group,
        body: json_body(args.body_bytes),
        connections: AtomicU64::new(0),
        handshake_failures: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        http1_requests: AtomicU64::new(0),
        http2_requests: AtomicU64::new(0),
        mismatches: AtomicU64::new(0),
        examples: Mutex::new(Vec::new()),
    });
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let admin = TcpListener::bind(args.admin_listen)
        .await
        .with_context(|| format!("listening on {}", args.admin_listen))?;
    tokio::spawn(serve_tls(listener, acceptor, state.clone(), args.max_streams));
    tokio::spawn(serve_admin(admin, state.clone()));
    eprintln!(
        "selkie-perf-backend: https://{} (admin http://{}/counters)",
        args.listen, args.admin_listen
    );

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    println!("{}", serde_json::to_string(&state.counters())?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_json_of_the_requested_size() {
        for size in [1024, 65536] {
            let body = json_body(size);
            assert_eq!(body.len(), size);
            let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(value["kind"], "ConfigMap");
        }
    }
}
