//! Upgraded streams: WebSocket (`v5.channel.k8s.io`) and SPDY/3.1 upgrades through a system, and
//! echoing a checked byte pattern through them.

use std::{
    fmt::Write as _,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::Context as _;
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::HeaderValue;
use serde::Serialize;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::Semaphore,
};
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest as _, Message};

use crate::systems::{Protocol, Target};

/// The exec request of the upgrades.
const EXEC_PATH: &str = "/api/v1/namespaces/default/pods/selkie-perf/exec?command=cat&stdin=true&stdout=true";
/// The WebSocket subprotocol of `kubectl exec`.
pub(crate) const WEBSOCKET_PROTOCOL: &str = "v5.channel.k8s.io";

/// The repeating byte pattern of the upgraded streams (a prime length, so that it does not line
/// up with message sizes).
const PATTERN_LEN: usize = 65_521;

/// The kind of upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Tunnel {
    /// WebSocket, subprotocol `v5.channel.k8s.io`.
    WebSocket,
    /// `Upgrade: SPDY/3.1`, raw bytes after the 101.
    Spdy,
}

/// What the tunnels of one step saw.
#[derive(Default)]
pub(crate) struct TunnelStats {
    /// Payload bytes sent.
    sent: AtomicU64,
    /// Payload bytes echoed back and checked.
    pub(crate) echoed: AtomicU64,
    /// Upgrades that failed (connection, non-101, handshake).
    pub(crate) failed_upgrades: AtomicU64,
    /// Tunnels that ended or failed before everything was echoed.
    pub(crate) dropped: AtomicU64,
    /// Echoes that differed from what was sent.
    pub(crate) mismatches: AtomicU64,
    pub(crate) examples: Mutex<Vec<String>>,
}

impl TunnelStats {
    pub(crate) fn example(&self, what: String) {
        if let Ok(mut examples) = self.examples.lock() {
            if examples.len() < 5 && !examples.contains(&what) {
                examples.push(what);
            }
        }
    }
}

/// Largest message or write of the throughput steps.
pub(crate) const MAX_MESSAGE: usize = 1 << 20;

/// `len` (≤ [`MAX_MESSAGE`]) bytes of the repeating pattern from stream offset `offset`.
fn pattern(offset: u64, len: usize) -> &'static [u8] {
    static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let all = PATTERN.get_or_init(|| {
        (0..(PATTERN_LEN + MAX_MESSAGE) as u64)
            .map(|i| {
                let at = i % PATTERN_LEN as u64;
                (at.wrapping_mul(31) ^ (at >> 8)) as u8
            })
            .collect()
    });
    let start = (offset % PATTERN_LEN as u64) as usize;
    &all[start..start + len.min(MAX_MESSAGE)]
}

type WebSocket = tokio_tungstenite::WebSocketStream<TlsStream<tokio::net::TcpStream>>;

/// A TLS connection upgraded to a WebSocket with `v5.channel.k8s.io`.
pub(crate) async fn websocket(target: &Target) -> anyhow::Result<WebSocket> {
    let tls = target.tls(Protocol::H1).await?;
    let uri: http::Uri = format!("wss://localhost:{}{EXEC_PATH}", target.port).parse()?;
    let mut request = uri.into_client_request()?;
    request.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_static(WEBSOCKET_PROTOCOL),
    );
    for (name, value) in &target.headers {
        request.headers_mut().append(name, value.clone());
    }
    let (ws, response) = tokio_tungstenite::client_async(request, tls)
        .await
        .context("WebSocket upgrade")?;
    anyhow::ensure!(
        response
            .headers()
            .get("sec-websocket-protocol")
            .is_some_and(|p| p == WEBSOCKET_PROTOCOL),
        "the 101 did not choose {WEBSOCKET_PROTOCOL}"
    );
    Ok(ws)
}

/// A TLS connection upgraded with `Upgrade: SPDY/3.1` (raw bytes after the 101).
async fn spdy(target: &Target) -> anyhow::Result<TlsStream<tokio::net::TcpStream>> {
    let mut tls = target.tls(Protocol::H1).await?;
    let mut head = format!(
        "POST {EXEC_PATH} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n",
        target.port
    );
    for (name, value) in &target.headers {
        let _ = write!(head, "{name}: {}\r\n", value.to_str().unwrap_or_default());
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes()).await?;
    // Read the answer's head byte by byte: nothing may be consumed past it.
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        anyhow::ensure!(answer.len() < 16 * 1024, "the upgrade answer's head is too long");
        let byte = tls.read_u8().await.context("reading the upgrade answer")?;
        answer.push(byte);
    }
    let status = String::from_utf8_lossy(&answer);
    let first = status.lines().next().unwrap_or_default().to_string();
    anyhow::ensure!(
        first.starts_with("HTTP/1.1 101"),
        "the upgrade was answered {first:?}"
    );
    Ok(tls)
}

/// Echoes through one tunnel until `stop`, then until everything sent came back (10 s at most).
pub(crate) async fn run_tunnel(
    kind: Tunnel,
    target: Target,
    args: (usize, usize),
    stop: Arc<AtomicBool>,
    stats: Arc<TunnelStats>,
) {
    let (message_bytes, window) = args;
    let fail = |what: String| {
        stats.failed_upgrades.fetch_add(1, Ordering::Relaxed);
        stats.example(what);
    };
    let credit = Arc::new(Semaphore::new(window));
    match kind {
        Tunnel::WebSocket => {
            let ws = match websocket(&target).await {
                Ok(ws) => ws,
                Err(e) => return fail(format!("WebSocket: {e:#}")),
            };
            let (mut sink, mut stream) = ws.split();
            let sent_messages = Arc::new(AtomicU64::new(0));
            let writer = {
                let (credit, stop, stats, sent_messages) =
                    (credit.clone(), stop.clone(), stats.clone(), sent_messages.clone());
                async move {
                    let mut offset = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(permit) = credit.acquire().await else { break };
                        permit.forget();
                        let payload = Bytes::copy_from_slice(pattern(offset, message_bytes));
                        if sink.send(Message::Binary(payload)).await.is_err() {
                            break;
                        }
                        offset += message_bytes as u64;
                        stats.sent.fetch_add(message_bytes as u64, Ordering::Relaxed);
                        sent_messages.fetch_add(1, Ordering::Relaxed);
                    }
                    sink
                }
            };
            let reader = async {
                let mut offset = 0u64;
                let mut received = 0u64;
                loop {
                    if stop.load(Ordering::Relaxed) && received >= sent_messages.load(Ordering::Relaxed) {
                        return true;
                    }
                    let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
                    let message = match next {
                        Err(_) => continue,
                        Ok(Some(Ok(message))) => message,
                        Ok(Some(Err(e))) => {
                            stats.example(format!("WebSocket failed: {e}"));
                            return false;
                        }
                        Ok(None) => {
                            stats.example("WebSocket ended early".into());
                            return false;
                        }
                    };
                    let Message::Binary(data) = message else { continue };
                    if data.len() != message_bytes || data[..] != *pattern(offset, message_bytes) {
                        stats.mismatches.fetch_add(1, Ordering::Relaxed);
                        stats.example(format!("echo of {} bytes differs", data.len()));
                    }
                    offset += message_bytes as u64;
                    received += 1;
                    stats.echoed.fetch_add(data.len() as u64, Ordering::Relaxed);
                    credit.add_permits(1);
                }
            };
            let reader = async {
                let clean = reader.await;
                credit.close();
                clean
            };
            match tokio::join!(writer, reader) {
                (mut sink, true) => {
                    let _ = sink.send(Message::Close(None)).await;
                    let _ = tokio::time::timeout(Duration::from_secs(2), stream.next()).await;
                }
                _ => {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Tunnel::Spdy => {
            let tls = match spdy(&target).await {
                Ok(tls) => tls,
                Err(e) => return fail(format!("SPDY/3.1: {e:#}")),
            };
            let (mut read, mut write) = tokio::io::split(tls);
            let sent = Arc::new(AtomicU64::new(0));
            let writer = {
                let (credit, stop, stats, sent) = (credit.clone(), stop.clone(), stats.clone(), sent.clone());
                async move {
                    let mut offset = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(permit) = credit.acquire().await else { break };
                        permit.forget();
                        if write.write_all(pattern(offset, message_bytes)).await.is_err() {
                            break;
                        }
                        offset += message_bytes as u64;
                        stats.sent.fetch_add(message_bytes as u64, Ordering::Relaxed);
                        sent.fetch_add(message_bytes as u64, Ordering::Relaxed);
                    }
                    write
                }
            };
            let reader = async {
                let mut offset = 0u64;
                let mut buffer = vec![0u8; 64 * 1024];
                let mut since_credit = 0usize;
                loop {
                    if stop.load(Ordering::Relaxed) && offset >= sent.load(Ordering::Relaxed) {
                        return true;
                    }
                    let next = tokio::time::timeout(Duration::from_millis(200), read.read(&mut buffer)).await;
                    let n = match next {
                        Err(_) => continue,
                        Ok(Ok(0)) => {
                            stats.example("SPDY tunnel ended early".into());
                            return false;
                        }
                        Ok(Ok(n)) => n,
                        Ok(Err(e)) => {
                            stats.example(format!("SPDY tunnel failed: {e}"));
                            return false;
                        }
                    };
                    if buffer[..n] != *pattern(offset, n) {
                        stats.mismatches.fetch_add(1, Ordering::Relaxed);
                        stats.example(format!("echo of {n} bytes at offset {offset} differs"));
                    }
                    offset += n as u64;
                    stats.echoed.fetch_add(n as u64, Ordering::Relaxed);
                    since_credit += n;
                    while since_credit >= message_bytes {
                        since_credit -= message_bytes;
                        credit.add_permits(1);
                    }
                }
            };
            let reader = async {
                let clean = reader.await;
                credit.close();
                clean
            };
            match tokio::join!(writer, reader) {
                (mut write, true) => {
                    let _ = write.shutdown().await;
                }
                _ => {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_continues_across_writes() {
        let whole = pattern(10, 200_000);
        let mut pieces = pattern(10, 70_000).to_vec();
        pieces.extend(pattern(70_010, 130_000));
        assert_eq!(whole, pieces);
        assert_ne!(pattern(0, 64), pattern(1, 64));
    }
}
