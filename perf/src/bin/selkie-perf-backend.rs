//! `selkie-perf-backend`: the fast HTTPS server behind every benchmark scenario, standing in for
//! kube-apiserver.
//!
//! TLS 1.3 (rustls, ring), ALPN `h2` and `http/1.1`, HTTP/2 capped at 250 concurrent streams
//! like kube-apiserver. Every connection must present a client certificate from `--client-ca`
//! (the proxy's upstream identity). Every request must carry exactly one `Impersonate-User`
//! equal to `--expect-user`, the `Impersonate-Group` values of `--expect-group` in that order, no
//! other `Impersonate-*` header and no `Authorization`; a request that does not is answered 403
//! and counted as an impersonation mismatch. Anything else gets a fixed JSON body of
//! `--body-bytes` bytes, except:
//!
//! * **watches** (`?watch=1` or `?watch=true` on any path): 200 with a streaming body
//!   (`Transfer-Encoding: chunked` over HTTP/1.1), one watch event JSON line at once (`ADDED`) and
//!   then one (`MODIFIED`) every `--watch-interval` (the query parameter `eventIntervalMs` overrides
//!   it per request; `0` sends nothing more: an idle watch), held open until the client leaves.
//!   Every event's object carries `ts_ns`, `CLOCK_MONOTONIC` when the event was made, so a client
//!   on the same machine can time the event's way through a proxy;
//! * **WebSocket upgrades** (HTTP/1.1 `Upgrade: websocket`, subprotocol `v5.channel.k8s.io` when
//!   offered, as `kubectl exec` asks): 101, then every text and binary message is echoed back;
//! * **SPDY/3.1 upgrades** (`Upgrade: SPDY/3.1`): 101, then the raw bytes are echoed back (no SPDY
//!   framing: enough to measure the throughput of an upgraded stream).
//!
//! The counters are served as JSON on `GET /counters` of the plain-HTTP `--admin-listen` port
//! and printed to stdout when the process gets SIGTERM or SIGINT. The stream counters (watches,
//! events, upgrades, echoed bytes) are on `GET /stream-counters` and printed to stderr at exit.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use futures::{SinkExt as _, StreamExt as _};
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::{
    body::{Body, Frame, Incoming, SizeHint},
    service::service_fn,
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use selkie_perf::{
    parse_duration,
    process::monotonic_ns,
    report::BackendCounters,
    tls::{server_config, ALPN_H2, ALPN_HTTP11},
};
use serde::Serialize;
use tokio::{io::AsyncWriteExt as _, net::TcpListener};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::{
    tungstenite::{handshake::derive_accept_key, protocol::Role, Message},
    WebSocketStream,
};

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
    /// Interval between the events of a watch stream; `0` sends only the first event (idle
    /// watches). A request's `eventIntervalMs` query parameter overrides it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    watch_interval: Duration,
}

/// The WebSocket subprotocol of `kubectl exec` the echo prefers.
const WEBSOCKET_PROTOCOL: &str = "v5.channel.k8s.io";

/// What the streams did: watches, their events and upgraded connections.
#[derive(Debug, Default, Serialize)]
struct StreamCounters {
    /// Watch streams started (200 sent).
    watches_opened: u64,
    /// Watch streams open now.
    watches_open: u64,
    /// Watch events sent, the first of every stream included.
    watch_events: u64,
    /// WebSocket upgrades answered 101.
    websocket_upgrades: u64,
    /// SPDY/3.1 upgrades answered 101.
    spdy_upgrades: u64,
    /// Upgraded connections open now.
    upgrades_open: u64,
    /// Upgrade requests refused (400) or whose connection failed to switch or to echo.
    upgrade_failures: u64,
    /// Payload bytes echoed back over upgraded connections.
    echoed_bytes: u64,
}

/// The atomics behind [`StreamCounters`].
#[derive(Default)]
struct StreamStats {
    watches_opened: AtomicU64,
    watches_open: AtomicU64,
    watch_events: AtomicU64,
    websocket_upgrades: AtomicU64,
    spdy_upgrades: AtomicU64,
    upgrades_open: AtomicU64,
    upgrade_failures: AtomicU64,
    echoed_bytes: AtomicU64,
}

impl StreamStats {
    fn snapshot(&self) -> StreamCounters {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamCounters {
            watches_opened: get(&self.watches_opened),
            watches_open: get(&self.watches_open),
            watch_events: get(&self.watch_events),
            websocket_upgrades: get(&self.websocket_upgrades),
            spdy_upgrades: get(&self.spdy_upgrades),
            upgrades_open: get(&self.upgrades_open),
            upgrade_failures: get(&self.upgrade_failures),
            echoed_bytes: get(&self.echoed_bytes),
        }
    }
}

/// A response body: the fixed JSON document, or a watch stream.
enum Reply {
    /// A complete body.
    Full(Full<Bytes>),
    /// A watch stream that never ends by itself.
    Watch(WatchBody),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Self::Full(full) => Pin::new(full).poll_frame(cx),
            Self::Watch(watch) => watch.poll_event(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(full) => full.is_end_stream(),
            Self::Watch(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(full) => full.size_hint(),
            Self::Watch(_) => SizeHint::default(),
        }
    }
}

/// One watch stream: an `ADDED` event at once, then a `MODIFIED` event per tick (none when idle).
struct WatchBody {
    /// `None`: an idle watch.
    ticks: Option<tokio::time::Interval>,
    sent: u64,
    stats: Arc<StreamStats>,
}

impl WatchBody {
    fn new(interval: Duration, stats: Arc<StreamStats>) -> Self {
        stats.watches_opened.fetch_add(1, Ordering::Relaxed);
        stats.watches_open.fetch_add(1, Ordering::Relaxed);
        let ticks = (!interval.is_zero()).then(|| {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
        Self {
            ticks,
            sent: 0,
            stats,
        }
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let kind = if self.sent == 0 {
            "ADDED"
        } else {
            match &mut self.ticks {
                None => return Poll::Pending,
                Some(ticks) => {
                    if ticks.poll_tick(cx).is_pending() {
                        return Poll::Pending;
                    }
                    "MODIFIED"
                }
            }
        };
        self.sent += 1;
        self.stats.watch_events.fetch_add(1, Ordering::Relaxed);
        let event = format!(
            "{{\"type\":\"{kind}\",\"object\":{{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{{\"name\":\"selkie-perf\",\"namespace\":\"default\",\"resourceVersion\":\"{}\"}},\"ts_ns\":{}}}}}\n",
            self.sent,
            monotonic_ns()
        );
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        self.stats.watches_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The values of a comma-separated header, trimmed, over all its occurrences.
fn header_list(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|token| token.trim().to_string())
        .filter(|token| !token.is_empty())
        .collect()
}

/// The value of query parameter `name`, if present.
fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The header of kube-apiserver's `authentication.kubernetes.io/credential-id` extra.
const CREDENTIAL_ID: &str = "impersonate-extra-authentication.kubernetes.io%2fcredential-id";

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
    watch_interval: Duration,
    streams: Arc<StreamStats>,
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
        // A client-certificate caller's credential ID (kube-apiserver's extra, as Pinniped's
        // proxy passes it): one value, `X509SHA256=` and the certificate's SHA-256 in hex.
        let credential_id: Vec<&HeaderValue> = headers.get_all(CREDENTIAL_ID).iter().collect();
        let well_formed = |value: &HeaderValue| {
            value
                .to_str()
                .ok()
                .and_then(|value| value.strip_prefix("X509SHA256="))
                .is_some_and(|hex| {
                    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                })
        };
        if credential_id.len() > 1 || credential_id.first().is_some_and(|value| !well_formed(value)) {
            return Some(format!("{CREDENTIAL_ID} was {credential_id:?}"));
        }
        headers
            .keys()
            .map(|name| name.as_str())
            .find(|name| {
                name.starts_with("impersonate-")
                    && *name != "impersonate-user"
                    && *name != "impersonate-group"
                    && *name != CREDENTIAL_ID
            })
            .map(|name| format!("unexpected header {name}"))
    }

    fn handle(&self, mut request: Request<Incoming>) -> Response<Reply> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if request.version() == Version::HTTP_2 {
            self.http2_requests.fetch_add(1, Ordering::Relaxed);
        } else {
            self.http1_requests.fetch_add(1, Ordering::Relaxed);
        }
        let (status, body) = match self.mismatch(&request) {
            None if request.headers().contains_key(header::UPGRADE) => {
                return self.upgrade(&mut request);
            }
            None if matches!(query_param(request.uri().query(), "watch"), Some("1" | "true")) => {
                return self.watch(&request);
            }
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
        let mut response = Response::new(Reply::Full(Full::new(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    /// A watch stream at the request's `eventIntervalMs` or `--watch-interval`.
    fn watch(&self, request: &Request<Incoming>) -> Response<Reply> {
        let interval = query_param(request.uri().query(), "eventIntervalMs")
            .and_then(|ms| ms.parse().ok())
            .map_or(self.watch_interval, Duration::from_millis);
        let mut response = Response::new(Reply::Watch(WatchBody::new(interval, self.streams.clone())));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    /// A WebSocket or SPDY/3.1 upgrade: 101 and an echo task, or 400.
    fn upgrade(&self, request: &mut Request<Incoming>) -> Response<Reply> {
        let stats = self.streams.clone();
        let headers = request.headers();
        let upgrades = header_list(headers, "upgrade");
        let wants = |protocol: &str| upgrades.iter().any(|u| u.eq_ignore_ascii_case(protocol));
        let connection_upgrade = header_list(headers, "connection")
            .iter()
            .any(|token| token.eq_ignore_ascii_case("upgrade"));
        let websocket = wants("websocket");
        let mut switch = HeaderMap::new();
        let accepted = if !connection_upgrade || request.version() != Version::HTTP_11 {
            false
        } else if websocket {
            match headers.get(header::SEC_WEBSOCKET_KEY) {
                Some(key) => {
                    switch.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
                        switch.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
                    }
                    if header_list(headers, "sec-websocket-protocol")
                        .iter()
                        .any(|p| p == WEBSOCKET_PROTOCOL)
                    {
                        switch.insert(
                            header::SEC_WEBSOCKET_PROTOCOL,
                            HeaderValue::from_static(WEBSOCKET_PROTOCOL),
                        );
                    }
                    true
                }
                None => false,
            }
        } else if wants("SPDY/3.1") {
            switch.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            if let Some(version) = header_list(headers, "x-stream-protocol-version").first() {
                if let Ok(value) = HeaderValue::from_str(version) {
                    switch.insert("x-stream-protocol-version", value);
                }
            }
            true
        } else {
            false
        };
        if !accepted {
            stats.upgrade_failures.fetch_add(1, Ordering::Relaxed);
            let mut response = Response::new(Reply::Full(Full::new(Bytes::from_static(
                br#"{"kind":"Status","code":400,"message":"unsupported upgrade"}"#,
            ))));
            *response.status_mut() = StatusCode::BAD_REQUEST;
            return response;
        }
        switch.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        let on_upgrade = hyper::upgrade::on(request);
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                stats.upgrade_failures.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let counter = if websocket {
                &stats.websocket_upgrades
            } else {
                &stats.spdy_upgrades
            };
            counter.fetch_add(1, Ordering::Relaxed);
            stats.upgrades_open.fetch_add(1, Ordering::Relaxed);
            let echoed = if websocket {
                echo_messages(TokioIo::new(upgraded)).await
            } else {
                echo_bytes(TokioIo::new(upgraded)).await
            };
            stats.upgrades_open.fetch_sub(1, Ordering::Relaxed);
            match echoed {
                Ok(bytes) => stats.echoed_bytes.fetch_add(bytes, Ordering::Relaxed),
                Err(bytes) => {
                    stats.upgrade_failures.fetch_add(1, Ordering::Relaxed);
                    stats.echoed_bytes.fetch_add(bytes, Ordering::Relaxed)
                }
            };
        });
        let mut response = Response::new(Reply::Full(Full::new(Bytes::new())));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *response.headers_mut() = switch;
        response
    }
}

/// Echoes every WebSocket text and binary message until the client closes. `Ok(payload bytes)`
/// after a clean close, `Err(payload bytes)` when the connection failed.
async fn echo_messages(io: TokioIo<hyper::upgrade::Upgraded>) -> Result<u64, u64> {
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    let mut echoed = 0u64;
    while let Some(message) = ws.next().await {
        let message = match message {
            Ok(message) => message,
            Err(_) => return Err(echoed),
        };
        match message {
            Message::Binary(_) | Message::Text(_) => {
                let len = message.len() as u64;
                if ws.send(message).await.is_err() {
                    return Err(echoed);
                }
                echoed += len;
            }
            // tungstenite answers pings and the client's close by itself on the next flush.
            Message::Close(_) => {
                let _ = ws.flush().await;
                break;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
    Ok(echoed)
}

/// Echoes raw bytes until the client ends its side; then ends ours.
async fn echo_bytes(io: TokioIo<hyper::upgrade::Upgraded>) -> Result<u64, u64> {
    let (mut reader, mut writer) = tokio::io::split(io);
    match tokio::io::copy(&mut reader, &mut writer).await {
        Ok(bytes) => {
            let _ = writer.shutdown().await;
            Ok(bytes)
        }
        Err(_) => Err(0),
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
                let response = state.handle(request);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
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
                } else if request.uri().path() == "/stream-counters" {
                    let json = serde_json::to_vec(&state.streams.snapshot()).unwrap_or_default();
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
        watch_interval: args.watch_interval,
        streams: Arc::new(StreamStats::default()),
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
    eprintln!(
        "selkie-perf-backend stream counters: {}",
        serde_json::to_string(&state.streams.snapshot())?
    );
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

    #[test]
    fn query_parameters_are_found() {
        let query = Some("labelSelector=a&watch=1&eventIntervalMs=250&allowWatchBookmarks");
        assert_eq!(query_param(query, "watch"), Some("1"));
        assert_eq!(query_param(query, "eventIntervalMs"), Some("250"));
        assert_eq!(query_param(query, "allowWatchBookmarks"), Some(""));
        assert_eq!(query_param(query, "resourceVersion"), None);
        assert_eq!(query_param(None, "watch"), None);
    }

    #[tokio::test]
    async fn a_watch_sends_json_lines_with_timestamps() {
        let stats = Arc::new(StreamStats::default());
        let mut body = WatchBody::new(Duration::from_millis(5), stats.clone());
        let mut last = 0;
        for kind in ["ADDED", "MODIFIED", "MODIFIED"] {
            let frame = std::future::poll_fn(|cx| body.poll_event(cx)).await;
            let data = frame.unwrap().unwrap().into_data().unwrap();
            assert!(data.ends_with(b"\n"));
            let event: serde_json::Value = serde_json::from_slice(&data).unwrap();
            assert_eq!(event["type"], kind);
            let ts = event["object"]["ts_ns"].as_u64().unwrap();
            assert!(ts >= last);
            last = ts;
        }
        assert_eq!(stats.snapshot().watch_events, 3);
        assert_eq!(stats.snapshot().watches_open, 1);
        drop(body);
        assert_eq!(stats.snapshot().watches_open, 0);
    }
}
