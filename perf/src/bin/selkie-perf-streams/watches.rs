//! The watch client: opening many held watches over HTTP/1.1 or HTTP/2, reading and timing their
//! events, and closing them until the backend holds none.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use selkie_perf::{process::monotonic_ns, watch::for_each_line};
use tokio::{sync::Semaphore, task::JoinHandle};

use crate::{
    measure::open_backend_watches,
    systems::{Protocol, Target},
};

/// The watch, as kubectl would send it.
const WATCH_PATH: &str = "/api/v1/namespaces/default/configmaps?watch=1";

/// Connections being opened at once (TLS handshake to the first answer).
const OPENING_AT_ONCE: usize = 128;

impl Target {
    fn watch_request(&self, protocol: Protocol, interval_ms: u128) -> anyhow::Result<Request<Empty<Bytes>>> {
        let path = format!("{WATCH_PATH}&eventIntervalMs={interval_ms}");
        let mut builder = match protocol {
            Protocol::H1 => {
                Request::get(path.as_str()).header(http::header::HOST, format!("localhost:{}", self.port))
            }
            Protocol::H2 => {
                Request::get(format!("https://localhost:{}{path}", self.port)).version(http::Version::HTTP_2)
            }
        };
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        Ok(builder.body(Empty::new())?)
    }
}

/// What the watches of one step saw.
#[derive(Default)]
pub(crate) struct WatchStats {
    /// Watches whose first event arrived.
    pub(crate) established: AtomicU64,
    /// Watches that could not be opened or were not answered 200.
    pub(crate) failed: AtomicU64,
    /// Watches whose stream ended or failed while held.
    pub(crate) dropped: AtomicU64,
    /// Lines that were not a watch event with a `ts_ns`.
    pub(crate) malformed: AtomicU64,
    /// Events after the first, while recording.
    pub(crate) recorded_events: AtomicU64,
    /// Record the latency of events now.
    pub(crate) recording: AtomicBool,
    /// Event latency, µs.
    pub(crate) latency: Mutex<Option<Histogram<u64>>>,
    examples: Mutex<Vec<String>>,
}

impl WatchStats {
    pub(crate) fn new() -> anyhow::Result<Self> {
        let stats = Self::default();
        if let Ok(mut latency) = stats.latency.lock() {
            *latency = Some(Histogram::new_with_bounds(1, 60_000_000, 3)?);
        }
        Ok(stats)
    }

    fn example(&self, what: String) {
        if let Ok(mut examples) = self.examples.lock() {
            if examples.len() < 5 && !examples.contains(&what) {
                examples.push(what);
            }
        }
    }

    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.example(what);
    }

    fn line(&self, line: &[u8], first: bool) {
        let ts = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|event| event["object"]["ts_ns"].as_u64());
        let Some(ts) = ts else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            self.example(format!("malformed event {:?}", String::from_utf8_lossy(line)));
            return;
        };
        if first {
            self.established.fetch_add(1, Ordering::Relaxed);
        } else if self.recording.load(Ordering::Relaxed) {
            let us = monotonic_ns().saturating_sub(ts) / 1000;
            self.recorded_events.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut latency) = self.latency.lock() {
                if let Some(histogram) = latency.as_mut() {
                    histogram.saturating_record(us.max(1));
                }
            }
        }
    }

    pub(crate) fn examples(&self) -> Vec<String> {
        self.examples.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

/// Reads one watch's events until it ends (which counts as dropped).
async fn read_watch(response: hyper::Response<hyper::body::Incoming>, stats: &WatchStats) {
    if response.status() != StatusCode::OK {
        stats.fail(format!("watch answered {}", response.status()));
        return;
    }
    let mut first = true;
    let end = for_each_line(response.into_body(), |line| {
        stats.line(line, first);
        first = false;
    })
    .await;
    stats.dropped.fetch_add(1, Ordering::Relaxed);
    stats.example(end.to_string());
}

/// Opens `n` watches (one connection each over HTTP/1.1, `--h2-streams` per connection over
/// HTTP/2); they are held until the returned tasks are aborted.
pub(crate) fn open_watches(
    target: &Target,
    protocol: Protocol,
    n: usize,
    streams_per_connection: usize,
    interval: Duration,
    stats: &Arc<WatchStats>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let opening = Arc::new(Semaphore::new(OPENING_AT_ONCE));
    let mut tasks = Vec::new();
    let per_connection = match protocol {
        Protocol::H1 => 1,
        Protocol::H2 => streams_per_connection.max(1),
    };
    let mut left = n;
    while left > 0 {
        let streams = left.min(per_connection);
        left -= streams;
        let requests = (0..streams)
            .map(|_| target.watch_request(protocol, interval.as_millis()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (target, stats, opening) = (target.clone(), stats.clone(), opening.clone());
        tasks.push(tokio::spawn(async move {
            let permit = opening.acquire_owned().await;
            let tls = match target.tls(protocol).await {
                Ok(tls) => tls,
                Err(e) => {
                    for _ in 0..streams {
                        stats.fail(format!("connecting: {e:#}"));
                    }
                    return;
                }
            };
            match protocol {
                Protocol::H1 => {
                    let Ok((mut sender, connection)) = http1::handshake(TokioIo::new(tls)).await else {
                        stats.fail("HTTP/1.1 handshake failed".into());
                        return;
                    };
                    let watch = async {
                        let Some(request) = requests.into_iter().next() else {
                            return;
                        };
                        match sender.send_request(request).await {
                            Ok(response) => {
                                drop(permit);
                                read_watch(response, &stats).await;
                            }
                            Err(e) => stats.fail(format!("sending the watch: {e}")),
                        }
                    };
                    tokio::select! {
                        _ = connection => {
                            stats.dropped.fetch_add(1, Ordering::Relaxed);
                            stats.example("HTTP/1.1 connection closed".into());
                        }
                        _ = watch => {}
                    }
                }
                Protocol::H2 => {
                    let mut builder = http2::Builder::new(TokioExecutor::new());
                    builder.max_concurrent_reset_streams(streams * 2);
                    let Ok((sender, connection)) = builder.handshake(TokioIo::new(tls)).await else {
                        stats.fail("HTTP/2 handshake failed".into());
                        return;
                    };
                    let opened = Arc::new(Semaphore::new(0));
                    let watches = futures::future::join_all(requests.into_iter().map(|request| {
                        let mut sender = sender.clone();
                        let (stats, opened) = (&stats, opened.clone());
                        async move {
                            match sender.send_request(request).await {
                                Ok(response) => {
                                    opened.add_permits(1);
                                    read_watch(response, stats).await;
                                }
                                Err(e) => {
                                    opened.add_permits(1);
                                    stats.fail(format!("sending the watch: {e}"));
                                }
                            }
                        }
                    }));
                    let release = async {
                        let _ = opened.acquire_many(streams as u32).await;
                        drop(permit);
                        std::future::pending::<()>().await;
                    };
                    tokio::select! {
                        _ = connection => {
                            stats.dropped.fetch_add(1, Ordering::Relaxed);
                            stats.example("HTTP/2 connection closed".into());
                        }
                        _ = watches => {}
                        _ = release => {}
                    }
                }
            }
        }));
    }
    Ok(tasks)
}

/// Waits until every watch is established or has failed, at most `timeout`.
pub(crate) async fn wait_established(stats: &WatchStats, n: usize, timeout: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < timeout {
        let done = stats.established.load(Ordering::Relaxed)
            + stats.failed.load(Ordering::Relaxed)
            + stats.dropped.load(Ordering::Relaxed);
        if done >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// Aborts the watches and waits (20 s at most) until the backend holds none; returns how many it
/// still holds.
pub(crate) async fn close_watches(tasks: Vec<JoinHandle<()>>, admin: SocketAddr) -> u64 {
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let start = Instant::now();
    loop {
        let open = open_backend_watches(admin);
        if open == 0 || start.elapsed() > Duration::from_secs(20) {
            return open;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_and_timed() {
        let stats = WatchStats::new().unwrap();
        let now = monotonic_ns();
        let line = format!(r#"{{"type":"ADDED","object":{{"kind":"ConfigMap","ts_ns":{now}}}}}"#);
        stats.line(line.as_bytes(), true);
        stats.recording.store(true, Ordering::Relaxed);
        stats.line(line.replace("ADDED", "MODIFIED").as_bytes(), false);
        stats.line(b"{\"type\":\"MODIFIED\"}", false);
        assert_eq!(stats.established.load(Ordering::Relaxed), 1);
        assert_eq!(stats.recorded_events.load(Ordering::Relaxed), 1);
        assert_eq!(stats.malformed.load(Ordering::Relaxed), 1);
    }
}
