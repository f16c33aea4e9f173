//! `selkie-perf-streams`: the stream metrics of PERF.md (started by `perf/run-streams`).
//!
//! Generates a PKI into a temporary directory, starts `selkie-perf-backend` and then, one after
//! another, the systems under test: D (direct to the backend), N (nginx, TLS reverse proxy adding
//! the `Impersonate-*` headers, unbuffered, upgrades passed through) and S0 (Selkie, static
//! identity). Systems under test run on core 1 (`taskset -c 1`); this client and the backend run
//! on core 0 (`perf/run-streams` pins this process). It measures:
//!
//! * **memory**: idle RSS of a freshly started system, then RSS with 1k, 5k, 10k (`--watches`)
//!   idle watches held open over HTTP/2 (at most `--h2-streams` streams per connection) and over
//!   HTTP/1.1 (one connection per watch); every count on a freshly started system; (RSS − idle RSS)
//!   ÷ watches;
//! * **watch fan-through**: the backend sends an event every `--fan-interval` on each of
//!   `--fan-watches` held watches; the latency from the event's `ts_ns` (the backend's
//!   `CLOCK_MONOTONIC` when it made the event) to its receipt here, p50/p99/p99.9;
//! * **upgraded streams**: WebSocket (`v5.channel.k8s.io`) and SPDY/3.1 echo through the system:
//!   MiB/s, the system's CPU ns per byte; and the system's CPU µs per exec setup (TLS connection +
//!   WebSocket upgrade + one echoed message + close, one after another);
//! * error counters: watches that failed or were not established, dropped watches and tunnels,
//!   malformed events, echo mismatches, upstream streams left open, impersonation mismatches and
//!   handshake failures at the backend. All must be 0; the run exits non-zero otherwise.

use std::{
    collections::VecDeque,
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use futures::{SinkExt as _, StreamExt as _};
use hdrhistogram::Histogram;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use http_body_util::Empty;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::sys::signal::Signal;
use rustls_pki_types::ServerName;
use selkie_perf::{
    parse_duration,
    pki::PerfPki,
    process::{free_port, monotonic_ns, shell, start_nginx, stop, wait_for_port},
    procstat::{process_tree, rss_kib, total_cpu_time},
    report::{BackendCounters, Percentiles},
    tls::{client_config, ALPN_H2, ALPN_HTTP11},
    watch::for_each_line,
};
use serde::Serialize;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::Semaphore,
    task::JoinHandle,
};
use tokio_rustls::{client::TlsStream, TlsConnector};
use tokio_tungstenite::tungstenite::{client::IntoClientRequest as _, Message};

/// The impersonated user every system must produce.
const USER: &str = "perf-user";
/// Its groups, in order.
const GROUPS: [&str; 2] = ["perf-devs", "perf-ops"];
/// The watch, as kubectl would send it.
const WATCH_PATH: &str = "/api/v1/namespaces/default/configmaps?watch=1";
/// The exec request of the upgrades.
const EXEC_PATH: &str = "/api/v1/namespaces/default/pods/selkie-perf/exec?command=cat&stdin=true&stdout=true";
/// The WebSocket subprotocol of `kubectl exec`.
const WEBSOCKET_PROTOCOL: &str = "v5.channel.k8s.io";
/// Connections being opened at once (TLS handshake to the first answer).
const OPENING_AT_ONCE: usize = 128;
/// The repeating byte pattern of the upgraded streams (a prime length, so that it does not line
/// up with message sizes).
const PATTERN_LEN: usize = 65_521;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-streams", about)]
struct Args {
    /// Smoke pass: 50 watches per step, 1 s per timed step, 10 exec setups, no settling wait;
    /// results to `target/perf-smoke/streams-smoke.{md,json}`. Exits non-zero if a system does
    /// not start or any error counter is not 0. Overrides the counts and durations.
    #[arg(long)]
    smoke: bool,
    /// Where the results go (default `perf/results`; `target/perf-smoke` with `--smoke`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// File name of the results, without extension (default `streams`; `streams-smoke`).
    #[arg(long)]
    name: Option<String>,
    /// Systems to run, in this order (D, N, S0). D has no memory rows (no system in between).
    #[arg(long, value_delimiter = ',', default_value = "D,N,S0")]
    systems: Vec<String>,
    /// Held idle watches per memory step.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    watches: Vec<usize>,
    /// HTTP versions of the memory and fan-through steps.
    #[arg(long, value_delimiter = ',', default_value = "h2,h1")]
    protocols: Vec<String>,
    /// Most streams per HTTP/2 connection (Selkie's pingora and nginx allow 100 and 128; the
    /// backend 250, like kube-apiserver).
    #[arg(long, default_value_t = 100)]
    h2_streams: usize,
    /// Longest wait for a step's watches to be established.
    #[arg(long, default_value = "180s", value_parser = parse_duration)]
    open_timeout: Duration,
    /// Longest wait for the RSS to settle (unchanged within 0.5 % for 2 s) with watches held.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    settle_max: Duration,
    /// Held watches of the fan-through step.
    #[arg(long, default_value_t = 1000)]
    fan_watches: usize,
    /// Interval between the events of every watch in the fan-through step.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    fan_interval: Duration,
    /// Measured window of the fan-through and throughput steps (after a 1 s warm-up).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Upgraded connections of the throughput steps, echoing at once.
    #[arg(long, default_value_t = 4)]
    tunnel_connections: usize,
    /// Message (WebSocket) or write (SPDY) size of the throughput steps, bytes.
    #[arg(long, default_value_t = 65_536)]
    message_bytes: usize,
    /// Messages or writes in flight per connection.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Exec setups (connection + WebSocket upgrade + one message + close), one after another.
    #[arg(long, default_value_t = 300)]
    exec_setups: usize,
    /// Steps to run: memory, fan, throughput (WebSocket and SPDY), exec.
    #[arg(long, value_delimiter = ',', default_value = "memory,fan,throughput,exec")]
    steps: Vec<String>,
    /// Keep the temporary directory (configurations, nginx's error log, Selkie's stderr).
    #[arg(long)]
    keep_temp: bool,
    /// Where the binaries are (default: beside this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

/// One system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum System {
    /// Straight to the backend.
    D,
    /// nginx.
    N,
    /// Selkie, static identity.
    S0,
}

impl System {
    fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "D" => Self::D,
            "N" => Self::N,
            "S0" => Self::S0,
            _ => anyhow::bail!("unknown system {text:?} (D, N, S0)"),
        })
    }

    fn describe(self) -> &'static str {
        match self {
            Self::D => "direct: client → backend",
            Self::N => "nginx, TLS reverse proxy adding Impersonate-User/-Group",
            Self::S0 => "Selkie, static identity",
        }
    }
}

/// HTTP version client → system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    H1,
    H2,
}

impl Protocol {
    fn parse(text: &str) -> anyhow::Result<Self> {
        match text {
            "h1" => Ok(Self::H1),
            "h2" => Ok(Self::H2),
            _ => anyhow::bail!("unknown protocol {text:?} (h1, h2)"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::H1 => "h1",
            Self::H2 => "h2",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes.

/// GET `path` on the backend's plain-HTTP admin port.
fn admin_get(admin: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut tcp = TcpStream::connect_timeout(&admin, Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(tcp, "GET {path} HTTP/1.0\r\nHost: backend\r\n\r\n")?;
    let mut response = String::new();
    tcp.read_to_string(&mut response)?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .with_context(|| format!("the backend's {path} answer has no body"))
}

fn backend_counters(admin: SocketAddr) -> anyhow::Result<BackendCounters> {
    Ok(serde_json::from_str(&admin_get(admin, "/counters")?)?)
}

/// The backend's stream counters (`/stream-counters`), as JSON.
fn stream_counters(admin: SocketAddr) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&admin_get(admin, "/stream-counters")?)?)
}

fn open_backend_watches(admin: SocketAddr) -> u64 {
    stream_counters(admin)
        .ok()
        .and_then(|c| c["watches_open"].as_u64())
        .unwrap_or(u64::MAX)
}

/// `RLIMIT_NOFILE`'s soft limit, from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|line| line.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// A running system under test; stopped when dropped.
struct Sut {
    child: Option<Child>,
    signal: Signal,
    what: String,
}

impl Sut {
    /// The system's processes (nginx: master and worker), empty for D.
    fn pids(&self) -> Vec<u32> {
        self.child
            .as_ref()
            .map(|child| process_tree(child.id()))
            .unwrap_or_default()
    }

    fn rss_kib(&self) -> u64 {
        self.pids().iter().filter_map(|pid| rss_kib(*pid).ok()).sum()
    }

    fn cpu(&self) -> Duration {
        total_cpu_time(&self.pids()).unwrap_or_default()
    }
}

impl Drop for Sut {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = stop(child, self.signal, &self.what);
        }
    }
}

/// How this client reaches a system.
#[derive(Clone)]
struct Target {
    port: u16,
    h1: TlsConnector,
    h2: TlsConnector,
    /// Headers every request carries (D: the `Impersonate-*` headers a proxy would add).
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Target {
    async fn tls(&self, protocol: Protocol) -> anyhow::Result<TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        tcp.set_nodelay(true)?;
        let connector = match protocol {
            Protocol::H1 => &self.h1,
            Protocol::H2 => &self.h2,
        };
        Ok(connector
            .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
            .await?)
    }

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

struct Env {
    args: Args,
    bin_dir: PathBuf,
    dir: PathBuf,
    pki: PerfPki,
    backend_port: u16,
    backend_admin: SocketAddr,
}

impl Env {
    /// Starts `system`, sized (nginx's `worker_connections`) for `connections` client connections
    /// plus as many upstream.
    fn start(&self, system: System, connections: usize) -> anyhow::Result<(Sut, Target)> {
        let client = |identity: Option<(&Path, &Path)>, alpn: &[&[u8]]| -> anyhow::Result<TlsConnector> {
            Ok(TlsConnector::from(Arc::new(client_config(
                &self.pki.ca,
                identity,
                alpn,
            )?)))
        };
        let (sut, port, identity, headers) = match system {
            System::D => {
                let mut headers = vec![(
                    HeaderName::from_static("impersonate-user"),
                    HeaderValue::from_static(USER),
                )];
                for group in GROUPS {
                    headers.push((
                        HeaderName::from_static("impersonate-group"),
                        HeaderValue::from_static(group),
                    ));
                }
                let sut = Sut {
                    child: None,
                    signal: Signal::SIGTERM,
                    what: "D".into(),
                };
                let identity = Some((
                    self.pki.upstream_client.cert.as_path(),
                    self.pki.upstream_client.key.as_path(),
                ));
                (sut, self.backend_port, identity, headers)
            }
            System::N => {
                let (sut, port) = self.start_nginx(connections)?;
                (sut, port, None, Vec::new())
            }
            System::S0 => {
                let (sut, port) = self.start_selkie()?;
                (sut, port, None, Vec::new())
            }
        };
        let target = Target {
            port,
            h1: client(identity, &[ALPN_HTTP11])?,
            h2: client(identity, &[ALPN_H2])?,
            headers,
        };
        Ok((sut, target))
    }

    fn start_nginx(&self, connections: usize) -> anyhow::Result<(Sut, u16)> {
        let port = free_port()?;
        // nginx allocates (and touches) every connection slot when its worker starts: size them
        // to the step rather than to the largest, so that the idle RSS stays comparable.
        let worker_connections = connections * 4 + 1024;
        let rlimit = open_files_limit().unwrap_or(1024);
        let dir = &self.dir;
        let p = |path: &Path| path.display().to_string();
        let conf = format!(
            r#"# Generated by selkie-perf-streams.
user root;
worker_processes 1;
worker_rlimit_nofile {rlimit};
error_log {dir}/nginx-error.log info;
daemon off;
master_process on;
pid {dir}/nginx.pid;
events {{ worker_connections {worker_connections}; }}
http {{
    access_log /dev/null;
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    keepalive_requests 100000000;
    keepalive_timeout 3600s;
    http2_max_concurrent_streams 128;
    proxy_headers_hash_bucket_size 128;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        '' '';
    }}
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 1024;
        keepalive_requests 100000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        location / {{
            proxy_pass https://backend;
            proxy_http_version 1.1;
            # Watches and exec streams: no buffering, no read timeout within a run.
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Authorization "";
            proxy_set_header Impersonate-User {user};
            proxy_set_header Impersonate-Group {group0};
            proxy_set_header Impersonate-Group {group1};
            proxy_ssl_certificate {client_cert};
            proxy_ssl_certificate_key {client_key};
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_protocols TLSv1.3;
            proxy_ssl_session_reuse on;
        }}
    }}
}}
"#,
            dir = dir.display(),
            backend = self.backend_port,
            cert = p(&self.pki.proxy.cert),
            key = p(&self.pki.proxy.key),
            user = USER,
            group0 = GROUPS[0],
            group1 = GROUPS[1],
            client_cert = p(&self.pki.upstream_client.cert),
            client_key = p(&self.pki.upstream_client.key),
            ca = p(&self.pki.ca),
        );
        let child = start_nginx(dir, &conf, port)?;
        let sut = Sut {
            child: Some(child),
            signal: Signal::SIGTERM,
            what: "nginx".into(),
        };
        Ok((sut, port))
    }

    fn start_selkie(&self) -> anyhow::Result<(Sut, u16)> {
        let port = free_port()?;
        let q = |path: &Path| serde_json::to_string(&path.display().to_string()).unwrap_or_default();
        let config = format!(
            "# Generated by selkie-perf-streams.\nlisten: 127.0.0.1:{port}\nservingCertificate:\n  certFile: {}\n  keyFile: {}\nupstream:\n  url: https://127.0.0.1:{}\n  caFile: {}\n  clientCertificate:\n    certFile: {}\n    keyFile: {}\nstaticIdentity:\n  username: {USER}\n  groups: [{}, {}]\n",
            q(&self.pki.proxy.cert),
            q(&self.pki.proxy.key),
            self.backend_port,
            q(&self.pki.ca),
            q(&self.pki.upstream_client.cert),
            q(&self.pki.upstream_client.key),
            GROUPS[0],
            GROUPS[1],
        );
        let path = self.dir.join("selkie-S0.yaml");
        std::fs::write(&path, config)?;
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(self.bin_dir.join("selkie-concierge"))
            .arg("--config")
            .arg(&path)
            // Only the file watcher reads this; keep it out of the way.
            .args(["--watch-interval", "60s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("selkie-S0.err"))?)
            .spawn()
            .context("starting selkie-concierge (cargo build -p selkie-concierge)")?;
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            "selkie-concierge",
        )?;
        let sut = Sut {
            child: Some(child),
            signal: Signal::SIGINT,
            what: "selkie-concierge".into(),
        };
        Ok((sut, port))
    }
}

// ---------------------------------------------------------------------------------------------
// Watches.

/// What the watches of one step saw.
#[derive(Default)]
struct WatchStats {
    /// Watches whose first event arrived.
    established: AtomicU64,
    /// Watches that could not be opened or were not answered 200.
    failed: AtomicU64,
    /// Watches whose stream ended or failed while held.
    dropped: AtomicU64,
    /// Lines that were not a watch event with a `ts_ns`.
    malformed: AtomicU64,
    /// Events after the first, while recording.
    recorded_events: AtomicU64,
    /// Record the latency of events now.
    recording: AtomicBool,
    /// Event latency, µs.
    latency: Mutex<Option<Histogram<u64>>>,
    examples: Mutex<Vec<String>>,
}

impl WatchStats {
    fn new() -> anyhow::Result<Self> {
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

    fn examples(&self) -> Vec<String> {
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
fn open_watches(
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
async fn wait_established(stats: &WatchStats, n: usize, timeout: Duration) -> Duration {
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
async fn close_watches(tasks: Vec<JoinHandle<()>>, admin: SocketAddr) -> u64 {
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

/// The RSS once it has not moved by more than 0.5 % (or 64 KiB) for 2 s, or after `max`.
async fn settled_rss(sut: &Sut, max: Duration) -> (u64, f64) {
    let start = Instant::now();
    let mut samples: VecDeque<u64> = VecDeque::new();
    loop {
        let rss = sut.rss_kib();
        samples.push_back(rss);
        if samples.len() > 8 {
            samples.pop_front();
        }
        let (low, high) = samples
            .iter()
            .fold((u64::MAX, 0), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
        let settled = samples.len() == 8 && high - low <= (rss / 200).max(64);
        if settled || start.elapsed() >= max {
            return (rss, start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One memory step.
#[derive(Debug, Serialize)]
struct MemoryStep {
    system: System,
    protocol: &'static str,
    watches: usize,
    connections: usize,
    idle_rss_kib: u64,
    rss_kib: u64,
    kib_per_watch: f64,
    open_seconds: f64,
    settle_seconds: f64,
    established: u64,
    failed: u64,
    dropped: u64,
    malformed: u64,
    backend_watches_left_open: u64,
    backend: BackendCounters,
    error_examples: Vec<String>,
}

/// One fan-through step.
#[derive(Debug, Serialize)]
struct FanStep {
    system: System,
    protocol: &'static str,
    watches: usize,
    interval_ms: f64,
    window_seconds: f64,
    events: u64,
    events_per_second: f64,
    latency_us: Percentiles,
    sut_cpu_us_per_event: Option<f64>,
    failed: u64,
    dropped: u64,
    malformed: u64,
    backend_watches_left_open: u64,
    backend: BackendCounters,
    error_examples: Vec<String>,
}

fn percentiles(histogram: &Histogram<u64>) -> Percentiles {
    if histogram.is_empty() {
        return Percentiles::default();
    }
    let at = |q: f64| histogram.value_at_quantile(q) as f64;
    Percentiles {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        p999: at(0.999),
        max: histogram.max() as f64,
        mean: histogram.mean(),
    }
}

fn backend_delta(admin: SocketAddr, before: &BackendCounters) -> BackendCounters {
    let after = backend_counters(admin).unwrap_or_default();
    BackendCounters {
        connections: after.connections.saturating_sub(before.connections),
        handshake_failures: after.handshake_failures.saturating_sub(before.handshake_failures),
        requests: after.requests.saturating_sub(before.requests),
        http1_requests: after.http1_requests.saturating_sub(before.http1_requests),
        http2_requests: after.http2_requests.saturating_sub(before.http2_requests),
        impersonation_mismatches: after
            .impersonation_mismatches
            .saturating_sub(before.impersonation_mismatches),
        mismatch_examples: after
            .mismatch_examples
            .get(before.mismatch_examples.len()..)
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
    }
}

/// Open files a memory step needs in the process that needs most: nginx holds a connection to the
/// backend per watch besides the client's connections; over HTTP/1.1 every process in the path
/// holds one per watch.
fn files_needed(system: System, protocol: Protocol, n: usize, h2_streams: usize) -> u64 {
    let client_connections = match protocol {
        Protocol::H1 => n,
        Protocol::H2 => n.div_ceil(h2_streams.max(1)),
    };
    let most = match system {
        System::N => client_connections + n,
        System::D | System::S0 => client_connections,
    };
    (most + 256) as u64
}

async fn memory_step(env: &Env, system: System, protocol: Protocol, n: usize) -> anyhow::Result<MemoryStep> {
    let (sut, target) = env.start(system, n)?;
    tokio::time::sleep(Duration::from_millis(if env.args.smoke { 300 } else { 1000 })).await;
    let idle_rss_kib = sut.rss_kib();
    let before = backend_counters(env.backend_admin)?;
    let stats = Arc::new(WatchStats::new()?);
    let tasks = open_watches(&target, protocol, n, env.args.h2_streams, Duration::ZERO, &stats)?;
    let open = wait_established(&stats, n, env.args.open_timeout).await;
    let settle_max = if env.args.smoke {
        Duration::ZERO
    } else {
        env.args.settle_max
    };
    let (rss_kib, settle_seconds) = settled_rss(&sut, settle_max).await;
    let established = stats.established.load(Ordering::Relaxed);
    let backend_watches_left_open = close_watches(tasks, env.backend_admin).await;
    drop(sut);
    let connections = match protocol {
        Protocol::H1 => n,
        Protocol::H2 => n.div_ceil(env.args.h2_streams.max(1)),
    };
    Ok(MemoryStep {
        system,
        protocol: protocol.name(),
        watches: n,
        connections,
        idle_rss_kib,
        rss_kib,
        kib_per_watch: (rss_kib as f64 - idle_rss_kib as f64) / n.max(1) as f64,
        open_seconds: open.as_secs_f64(),
        settle_seconds,
        established,
        failed: stats.failed.load(Ordering::Relaxed) + (n as u64).saturating_sub(established),
        dropped: stats.dropped.load(Ordering::Relaxed),
        malformed: stats.malformed.load(Ordering::Relaxed),
        backend_watches_left_open,
        backend: backend_delta(env.backend_admin, &before),
        error_examples: stats.examples(),
    })
}

async fn fan_step(
    env: &Env,
    sut: &Sut,
    target: &Target,
    system: System,
    protocol: Protocol,
) -> anyhow::Result<FanStep> {
    let n = env.args.fan_watches;
    let before = backend_counters(env.backend_admin)?;
    let stats = Arc::new(WatchStats::new()?);
    let tasks = open_watches(
        &target.clone(),
        protocol,
        n,
        env.args.h2_streams,
        env.args.fan_interval,
        &stats,
    )?;
    wait_established(&stats, n, env.args.open_timeout).await;
    tokio::time::sleep(warmup(&env.args)).await;
    let cpu0 = sut.cpu();
    let start = Instant::now();
    stats.recording.store(true, Ordering::Relaxed);
    tokio::time::sleep(env.args.duration).await;
    stats.recording.store(false, Ordering::Relaxed);
    let window = start.elapsed().as_secs_f64();
    let cpu = sut.cpu().saturating_sub(cpu0);
    let established = stats.established.load(Ordering::Relaxed);
    let backend_watches_left_open = close_watches(tasks, env.backend_admin).await;
    let events = stats.recorded_events.load(Ordering::Relaxed);
    let latency_us = stats
        .latency
        .lock()
        .ok()
        .and_then(|h| h.as_ref().map(percentiles))
        .unwrap_or_default();
    Ok(FanStep {
        system,
        protocol: protocol.name(),
        watches: n,
        interval_ms: env.args.fan_interval.as_secs_f64() * 1000.0,
        window_seconds: window,
        events,
        events_per_second: events as f64 / window,
        latency_us,
        sut_cpu_us_per_event: (system != System::D && events > 0)
            .then(|| cpu.as_secs_f64() * 1e6 / events as f64),
        failed: stats.failed.load(Ordering::Relaxed) + (n as u64).saturating_sub(established),
        dropped: stats.dropped.load(Ordering::Relaxed),
        malformed: stats.malformed.load(Ordering::Relaxed),
        backend_watches_left_open,
        backend: backend_delta(env.backend_admin, &before),
        error_examples: stats.examples(),
    })
}

fn warmup(args: &Args) -> Duration {
    if args.smoke {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(1)
    }
}

// ---------------------------------------------------------------------------------------------
// Upgraded streams.

/// The kind of upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Tunnel {
    /// WebSocket, subprotocol `v5.channel.k8s.io`.
    WebSocket,
    /// `Upgrade: SPDY/3.1`, raw bytes after the 101.
    Spdy,
}

/// What the tunnels of one step saw.
#[derive(Default)]
struct TunnelStats {
    /// Payload bytes sent.
    sent: AtomicU64,
    /// Payload bytes echoed back and checked.
    echoed: AtomicU64,
    /// Upgrades that failed (connection, non-101, handshake).
    failed_upgrades: AtomicU64,
    /// Tunnels that ended or failed before everything was echoed.
    dropped: AtomicU64,
    /// Echoes that differed from what was sent.
    mismatches: AtomicU64,
    examples: Mutex<Vec<String>>,
}

impl TunnelStats {
    fn example(&self, what: String) {
        if let Ok(mut examples) = self.examples.lock() {
            if examples.len() < 5 && !examples.contains(&what) {
                examples.push(what);
            }
        }
    }
}

/// Largest message or write of the throughput steps.
const MAX_MESSAGE: usize = 1 << 20;

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
async fn websocket(target: &Target) -> anyhow::Result<WebSocket> {
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
async fn run_tunnel(
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

/// One throughput step.
#[derive(Debug, Serialize)]
struct ThroughputStep {
    system: System,
    tunnel: Tunnel,
    connections: usize,
    message_bytes: usize,
    window_seconds: f64,
    echoed_bytes: u64,
    mib_per_second: f64,
    sut_cpu_seconds: Option<f64>,
    /// SUT CPU ÷ echoed payload bytes (each byte crosses the system twice: up and back).
    sut_cpu_ns_per_echoed_byte: Option<f64>,
    /// SUT CPU ÷ bytes through the system in both directions.
    sut_cpu_ns_per_byte_each_way: Option<f64>,
    failed_upgrades: u64,
    dropped: u64,
    echo_mismatches: u64,
    backend: BackendCounters,
    error_examples: Vec<String>,
}

async fn throughput_step(
    env: &Env,
    sut: &Sut,
    target: &Target,
    system: System,
    kind: Tunnel,
) -> anyhow::Result<ThroughputStep> {
    let before = backend_counters(env.backend_admin)?;
    let stats = Arc::new(TunnelStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let args = (
        env.args.message_bytes.clamp(16, MAX_MESSAGE),
        env.args.window.max(1),
    );
    let tasks: Vec<_> = (0..env.args.tunnel_connections.max(1))
        .map(|_| {
            tokio::spawn(run_tunnel(
                kind,
                target.clone(),
                args,
                stop.clone(),
                stats.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(warmup(&env.args)).await;
    let cpu0 = sut.cpu();
    let echoed0 = stats.echoed.load(Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(env.args.duration).await;
    let echoed = stats.echoed.load(Ordering::Relaxed) - echoed0;
    let cpu = sut.cpu().saturating_sub(cpu0);
    let window = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for mut task in tasks {
        if tokio::time::timeout(Duration::from_secs(10), &mut task)
            .await
            .is_err()
        {
            task.abort();
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            stats.example("a tunnel did not drain within 10 s".into());
        }
    }
    let sut_cpu = (system != System::D).then_some(cpu.as_secs_f64());
    let per = |bytes: u64| sut_cpu.filter(|_| bytes > 0).map(|cpu| cpu * 1e9 / bytes as f64);
    let examples = stats.examples.lock().map(|e| e.clone()).unwrap_or_default();
    Ok(ThroughputStep {
        system,
        tunnel: kind,
        connections: env.args.tunnel_connections.max(1),
        message_bytes: args.0,
        window_seconds: window,
        echoed_bytes: echoed,
        mib_per_second: echoed as f64 / window / (1024.0 * 1024.0),
        sut_cpu_seconds: sut_cpu,
        sut_cpu_ns_per_echoed_byte: per(echoed),
        sut_cpu_ns_per_byte_each_way: per(echoed * 2),
        failed_upgrades: stats.failed_upgrades.load(Ordering::Relaxed),
        dropped: stats.dropped.load(Ordering::Relaxed),
        echo_mismatches: stats.mismatches.load(Ordering::Relaxed),
        backend: backend_delta(env.backend_admin, &before),
        error_examples: examples,
    })
}

/// The exec-setup step.
#[derive(Debug, Serialize)]
struct ExecStep {
    system: System,
    setups: usize,
    completed: u64,
    failed: u64,
    wall_ms: Percentiles,
    sut_cpu_us_per_setup: Option<f64>,
    backend: BackendCounters,
    error_examples: Vec<String>,
}

/// One exec setup: connection, WebSocket upgrade, one echoed message, close.
async fn exec_once(target: &Target) -> anyhow::Result<()> {
    let mut ws = websocket(target).await?;
    let payload = Bytes::from_static(b"\x00echo hello\n");
    ws.send(Message::Binary(payload.clone())).await?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(data))) => {
                anyhow::ensure!(data == payload, "the echo differs");
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => anyhow::bail!("the WebSocket ended before the echo"),
        }
    }
    ws.close(None).await?;
    // The server's close frame, then the end.
    while let Some(Ok(_)) = ws.next().await {}
    Ok(())
}

async fn exec_step(env: &Env, sut: &Sut, target: &Target, system: System) -> anyhow::Result<ExecStep> {
    let before = backend_counters(env.backend_admin)?;
    let mut wall = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut completed, mut failed) = (0u64, 0u64);
    let mut examples = Vec::new();
    // One setup first, outside the measurement (lazy initialisation in the system).
    let _ = exec_once(target).await;
    let cpu0 = sut.cpu();
    for _ in 0..env.args.exec_setups {
        let start = Instant::now();
        match tokio::time::timeout(Duration::from_secs(10), exec_once(target)).await {
            Ok(Ok(())) => {
                completed += 1;
                wall.saturating_record((start.elapsed().as_micros() as u64).max(1));
            }
            Ok(Err(e)) => {
                failed += 1;
                if examples.len() < 5 {
                    examples.push(format!("{e:#}"));
                }
            }
            Err(_) => {
                failed += 1;
                if examples.len() < 5 {
                    examples.push("an exec setup took more than 10 s".into());
                }
            }
        }
    }
    let cpu = sut.cpu().saturating_sub(cpu0);
    let mut wall_ms = percentiles(&wall);
    for value in [
        &mut wall_ms.p50,
        &mut wall_ms.p90,
        &mut wall_ms.p99,
        &mut wall_ms.p999,
        &mut wall_ms.max,
        &mut wall_ms.mean,
    ] {
        *value /= 1000.0;
    }
    Ok(ExecStep {
        system,
        setups: env.args.exec_setups,
        completed,
        failed,
        wall_ms,
        sut_cpu_us_per_setup: (system != System::D && completed > 0)
            .then(|| cpu.as_secs_f64() * 1e6 / completed as f64),
        backend: backend_delta(env.backend_admin, &before),
        error_examples: examples,
    })
}

// ---------------------------------------------------------------------------------------------
// Results.

#[derive(Debug, Serialize)]
struct Machine {
    #[serde(flatten)]
    common: selkie_perf::process::Machine,
    build: String,
    open_files_limit: Option<u64>,
}

fn machine(bin_dir: &Path) -> Machine {
    Machine {
        common: selkie_perf::process::Machine::describe(),
        build: bin_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        open_files_limit: open_files_limit(),
    }
}

#[derive(Debug, Serialize)]
struct Settings {
    watches: Vec<usize>,
    protocols: Vec<String>,
    h2_streams_per_connection: usize,
    fan_watches: usize,
    fan_interval_ms: f64,
    duration_s: f64,
    tunnel_connections: usize,
    message_bytes: usize,
    window: usize,
    exec_setups: usize,
}

#[derive(Debug, Serialize)]
struct Results {
    date_utc: String,
    machine: Machine,
    settings: Settings,
    systems: Vec<(System, &'static str)>,
    not_started: Vec<String>,
    /// Steps left out because this machine's open-files limit is too low for them.
    skipped: Vec<String>,
    memory: Vec<MemoryStep>,
    fan_through: Vec<FanStep>,
    throughput: Vec<ThroughputStep>,
    exec_setup: Vec<ExecStep>,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or("—".into(), |v| format!("{v:.digits$}"))
}

fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let m = &results.machine.common;
    let _ = writeln!(
        md,
        "# Streams: held watches, watch fan-through, upgraded streams\n"
    );
    let _ = writeln!(
        md,
        "{} · {} · {} · {} · {} · {} · {} binaries · RLIMIT_NOFILE {}\n",
        results.date_utc,
        m.cpu_model,
        m.cores,
        m.kernel,
        m.memory,
        m.nginx,
        results.machine.build,
        results
            .machine
            .open_files_limit
            .map_or("?".into(), |n| n.to_string())
    );
    let _ = writeln!(md, "| id | system |\n|---|---|");
    for (system, describe) in &results.systems {
        let _ = writeln!(md, "| {system:?} | {describe} |");
    }
    for missing in &results.not_started {
        let _ = writeln!(md, "\n**Not started:** {missing}");
    }
    for skipped in &results.skipped {
        let _ = writeln!(md, "\n**Not run:** {skipped}");
    }
    let _ = writeln!(
        md,
        "\n## Memory: idle watches held open\n\nEvery row on a freshly started system: RSS 1 s after start (idle), then with the watches established and the RSS settled. KiB per watch = (RSS − idle RSS) ÷ watches. nginx's `worker_connections` is sized to the step (4 × watches + 1024, with less it ran out of connection slots at 5000 HTTP/1.1 watches; nginx allocates and touches every slot at start, so its idle RSS grows with the step); nginx proxies every watch over its own HTTP/1.1 connection to the backend, Selkie over pooled HTTP/2 (upstream conns: TLS connections the backend accepted during the step). PERF.md: idle ≤ 20 MiB, ≤ 8 KiB per watch, 10k watches ≤ 128 MiB.\n"
    );
    let _ = writeln!(
        md,
        "| system | proto | watches | conns | upstream conns | idle RSS MiB | RSS MiB | KiB/watch | open s | failed | dropped | left open upstream |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for s in &results.memory {
        let _ = writeln!(
            md,
            "| {:?} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.1} | {} | {} | {} |",
            s.system,
            s.protocol,
            s.watches,
            s.connections,
            s.backend.connections,
            mib(s.idle_rss_kib),
            mib(s.rss_kib),
            s.kib_per_watch,
            s.open_seconds,
            s.failed,
            s.dropped,
            s.backend_watches_left_open
        );
    }
    let _ = writeln!(
        md,
        "\n## Watch event fan-through\n\nThe backend sends an event on every held watch every {:.0} ms; latency from the event's `ts_ns` (backend, `CLOCK_MONOTONIC`) to its receipt by the client.\n",
        results.settings.fan_interval_ms
    );
    let _ = writeln!(
        md,
        "| system | proto | watches | events/s | p50 µs | p99 µs | p99.9 µs | max µs | SUT CPU µs/event | failed | dropped | malformed |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for s in &results.fan_through {
        let l = &s.latency_us;
        let _ = writeln!(
            md,
            "| {:?} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            s.system,
            s.protocol,
            s.watches,
            s.events_per_second,
            l.p50,
            l.p99,
            l.p999,
            l.max,
            opt(s.sut_cpu_us_per_event, 1),
            s.failed,
            s.dropped,
            s.malformed
        );
    }
    let _ = writeln!(
        md,
        "\n## Upgraded streams: echo throughput\n\n{} connections, {} B messages (WebSocket) or writes (SPDY/3.1, raw bytes after the 101), {} in flight per connection. MiB/s of payload echoed back; CPU ns per byte = SUT CPU ÷ echoed bytes (each byte crosses the system up and back; the per-direction figure is half). PERF.md: ≤ 1 ns per byte.\n",
        results.settings.tunnel_connections, results.settings.message_bytes, results.settings.window
    );
    let _ = writeln!(
        md,
        "| system | tunnel | MiB/s echoed | SUT CPU ns/echoed byte | ns/byte each way | failed upgrades | dropped | echo mismatches |\n|---|---|--:|--:|--:|--:|--:|--:|"
    );
    for s in &results.throughput {
        let _ = writeln!(
            md,
            "| {:?} | {:?} | {:.1} | {} | {} | {} | {} | {} |",
            s.system,
            s.tunnel,
            s.mib_per_second,
            opt(s.sut_cpu_ns_per_echoed_byte, 2),
            opt(s.sut_cpu_ns_per_byte_each_way, 2),
            s.failed_upgrades,
            s.dropped,
            s.echo_mismatches
        );
    }
    let _ = writeln!(
        md,
        "\n## Exec setup\n\nOne after another: new TLS connection, WebSocket upgrade (`{WEBSOCKET_PROTOCOL}`), one echoed message, close. PERF.md: ≤ 200 µs SUT CPU per exec setup.\n"
    );
    let _ = writeln!(
        md,
        "| system | setups | SUT CPU µs/setup | wall p50 ms | wall p99 ms | failed |\n|---|--:|--:|--:|--:|--:|"
    );
    for s in &results.exec_setup {
        let _ = writeln!(
            md,
            "| {:?} | {} | {} | {:.2} | {:.2} | {} |",
            s.system,
            s.completed,
            opt(s.sut_cpu_us_per_setup, 0),
            s.wall_ms.p50,
            s.wall_ms.p99,
            s.failed
        );
    }
    let failures = failures(results);
    let _ = writeln!(md, "\n## Errors\n");
    if failures.is_empty() {
        let _ = writeln!(md, "Every error counter is 0.");
    } else {
        for failure in failures {
            let _ = writeln!(md, "* {failure}");
        }
    }
    md
}

/// Every non-zero error counter and system that did not start, described.
fn failures(results: &Results) -> Vec<String> {
    let mut out: Vec<String> = results
        .not_started
        .iter()
        .map(|s| format!("not started: {s}"))
        .collect();
    let mut check = |id: String, counters: &[(&str, u64)], backend: &BackendCounters, examples: &[String]| {
        let mut bad: Vec<String> = counters
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(what, n)| format!("{n} {what}"))
            .collect();
        if backend.impersonation_mismatches > 0 {
            bad.push(format!(
                "{} impersonation mismatches at the backend {:?}",
                backend.impersonation_mismatches, backend.mismatch_examples
            ));
        }
        if backend.handshake_failures > 0 {
            bad.push(format!(
                "{} failed TLS handshakes at the backend",
                backend.handshake_failures
            ));
        }
        if !bad.is_empty() {
            out.push(format!("{id}: {} (e.g. {examples:?})", bad.join(", ")));
        }
    };
    for s in &results.memory {
        check(
            format!("memory {:?} {} {}", s.system, s.protocol, s.watches),
            &[
                ("watches failed or not established", s.failed),
                ("watches dropped", s.dropped),
                ("malformed events", s.malformed),
                ("watches left open at the backend", s.backend_watches_left_open),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.fan_through {
        check(
            format!("fan-through {:?} {}", s.system, s.protocol),
            &[
                ("watches failed or not established", s.failed),
                ("watches dropped", s.dropped),
                ("malformed events", s.malformed),
                ("watches left open at the backend", s.backend_watches_left_open),
                ("(no events received)", u64::from(s.events == 0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.throughput {
        check(
            format!("throughput {:?} {:?}", s.system, s.tunnel),
            &[
                ("failed upgrades", s.failed_upgrades),
                ("dropped tunnels", s.dropped),
                ("echo mismatches", s.echo_mismatches),
                ("(no bytes echoed)", u64::from(s.echoed_bytes == 0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.exec_setup {
        check(
            format!("exec setup {:?}", s.system),
            &[
                ("failed exec setups", s.failed),
                ("(no exec setup completed)", u64::from(s.completed == 0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.watches = vec![50];
        args.fan_watches = 20;
        args.fan_interval = Duration::from_millis(50);
        args.duration = Duration::from_secs(1);
        args.exec_setups = 10;
        args.tunnel_connections = 2;
        args.message_bytes = 16 * 1024;
        args.open_timeout = Duration::from_secs(20);
    }
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let systems = args
        .systems
        .iter()
        .map(|s| System::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let protocols = args
        .protocols
        .iter()
        .map(|p| Protocol::parse(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this binary has no directory")?
            .to_path_buf(),
    };
    for bin in ["selkie-perf-backend", "selkie-concierge"] {
        anyhow::ensure!(
            bin_dir.join(bin).exists(),
            "{} is missing: perf/run-streams builds it",
            bin_dir.join(bin).display()
        );
    }
    let limit = open_files_limit().unwrap_or(0);
    let fan_need = args.fan_watches as u64 * 2 + 256;
    anyhow::ensure!(
        limit >= fan_need,
        "RLIMIT_NOFILE is {limit}, {fan_need} needed for {} fan-through watches: run through perf/run-streams (ulimit -n)",
        args.fan_watches
    );

    let temp = tempfile::Builder::new()
        .prefix("selkie-perf-streams-")
        .tempdir()?;
    let dir = temp.path().to_path_buf();
    let groups: Vec<String> = GROUPS.iter().map(|g| g.to_string()).collect();
    let pki = PerfPki::generate(&dir, USER, &groups)?;
    let backend_port = free_port()?;
    let backend_admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut backend_cmd = Command::new("taskset");
    backend_cmd
        .args(["-c", "0"])
        .arg(bin_dir.join("selkie-perf-backend"))
        .args(["--listen", &format!("127.0.0.1:{backend_port}")])
        .args(["--admin-listen", &backend_admin.to_string()])
        .arg("--cert")
        .arg(&pki.backend.cert)
        .arg("--key")
        .arg(&pki.backend.key)
        .arg("--client-ca")
        .arg(&pki.upstream_ca)
        .args(["--expect-user", USER, "--watch-interval", "0"]);
    for group in GROUPS {
        backend_cmd.args(["--expect-group", group]);
    }
    let mut backend = backend_cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting selkie-perf-backend")?;
    wait_for_port(
        SocketAddr::from(([127, 0, 0, 1], backend_port)),
        &mut backend,
        "selkie-perf-backend",
    )?;
    let env = Env {
        args,
        bin_dir,
        dir,
        pki,
        backend_port,
        backend_admin,
    };
    let date_utc = shell("date -u +%Y-%m-%dT%H:%M:%SZ");
    let mut results = Results {
        date_utc,
        machine: machine(&env.bin_dir),
        settings: Settings {
            watches: env.args.watches.clone(),
            protocols: env.args.protocols.clone(),
            h2_streams_per_connection: env.args.h2_streams,
            fan_watches: env.args.fan_watches,
            fan_interval_ms: env.args.fan_interval.as_secs_f64() * 1000.0,
            duration_s: env.args.duration.as_secs_f64(),
            tunnel_connections: env.args.tunnel_connections,
            message_bytes: env.args.message_bytes,
            window: env.args.window,
            exec_setups: env.args.exec_setups,
        },
        systems: systems.iter().map(|s| (*s, s.describe())).collect(),
        not_started: Vec::new(),
        skipped: Vec::new(),
        memory: Vec::new(),
        fan_through: Vec::new(),
        throughput: Vec::new(),
        exec_setup: Vec::new(),
    };
    let outcome = run(&env, &systems, &protocols, &mut results).await;
    let exit = stop(backend, Signal::SIGTERM, "the backend")?;
    eprintln!("backend counters at exit: {}", exit.trim());
    if env.args.keep_temp {
        eprintln!("kept {}", env.dir.display());
        let _kept = temp.keep();
    }
    outcome?;

    let (out, name) = if env.args.smoke {
        ("target/perf-smoke", "streams-smoke")
    } else {
        ("perf/results", "streams")
    };
    let out = env.args.out.clone().unwrap_or_else(|| out.into());
    let name = env.args.name.clone().unwrap_or_else(|| name.into());
    std::fs::create_dir_all(&out)?;
    let json = out.join(format!("{name}.json"));
    let md = out.join(format!("{name}.md"));
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    std::fs::write(&md, markdown(&results))?;
    eprintln!("wrote {} and {}", md.display(), json.display());
    let failures = failures(&results);
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("FAILED: {failure}");
        }
        anyhow::bail!("{} error counters are not 0", failures.len());
    }
    eprintln!("every error counter is 0");
    Ok(())
}

async fn run(
    env: &Env,
    systems: &[System],
    protocols: &[Protocol],
    results: &mut Results,
) -> anyhow::Result<()> {
    for &system in systems {
        let wants = |step: &str| env.args.steps.iter().any(|s| s == step);
        // Memory: a fresh system per step.
        if system != System::D && wants("memory") {
            'memory: for &protocol in protocols {
                for &n in &env.args.watches {
                    let limit = open_files_limit().unwrap_or(0);
                    let need = files_needed(system, protocol, n, env.args.h2_streams);
                    if need > limit {
                        let why = format!(
                            "{system:?} {} {n} watches: needs {need} open files per process, RLIMIT_NOFILE is {limit} (raise the hard limit: ulimit -Hn)",
                            protocol.name()
                        );
                        eprintln!("-- not run: {why}");
                        results.skipped.push(why);
                        continue;
                    }
                    eprintln!("-- {system:?} {}: memory with {n} idle watches", protocol.name());
                    match memory_step(env, system, protocol, n).await {
                        Ok(step) => {
                            eprintln!(
                                "   idle {:.1} MiB, with watches {:.1} MiB: {:.2} KiB/watch; opened in {:.1} s; failed {}, dropped {}",
                                mib(step.idle_rss_kib),
                                mib(step.rss_kib),
                                step.kib_per_watch,
                                step.open_seconds,
                                step.failed,
                                step.dropped
                            );
                            results.memory.push(step);
                        }
                        Err(e) => {
                            eprintln!("   {system:?} did not start: {e:#}");
                            results.not_started.push(format!("{system:?}: {e:#}"));
                            break 'memory;
                        }
                    }
                }
            }
        }
        // Fan-through, throughput and exec setups on one fresh system.
        if !(wants("fan") || wants("throughput") || wants("exec")) {
            continue;
        }
        let (sut, target) = match env.start(system, env.args.fan_watches + env.args.tunnel_connections) {
            Ok(started) => started,
            Err(e) => {
                eprintln!("   {system:?} did not start: {e:#}");
                results.not_started.push(format!("{system:?}: {e:#}"));
                continue;
            }
        };
        for &protocol in protocols.iter().filter(|_| wants("fan")) {
            eprintln!(
                "-- {system:?} {}: fan-through, {} watches, an event every {:?} each",
                protocol.name(),
                env.args.fan_watches,
                env.args.fan_interval
            );
            let step = fan_step(env, &sut, &target, system, protocol).await?;
            eprintln!(
                "   {:.0} events/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs; failed {}, dropped {}",
                step.events_per_second,
                step.latency_us.p50,
                step.latency_us.p99,
                step.latency_us.p999,
                step.failed,
                step.dropped
            );
            results.fan_through.push(step);
        }
        for kind in [Tunnel::WebSocket, Tunnel::Spdy]
            .into_iter()
            .filter(|_| wants("throughput"))
        {
            eprintln!("-- {system:?}: {kind:?} echo throughput");
            let step = throughput_step(env, &sut, &target, system, kind).await?;
            eprintln!(
                "   {:.1} MiB/s, SUT {} ns/echoed byte; failed upgrades {}, dropped {}, mismatches {} {:?}",
                step.mib_per_second,
                opt(step.sut_cpu_ns_per_echoed_byte, 2),
                step.failed_upgrades,
                step.dropped,
                step.echo_mismatches,
                step.error_examples
            );
            results.throughput.push(step);
        }
        if !wants("exec") {
            continue;
        }
        eprintln!("-- {system:?}: {} exec setups", env.args.exec_setups);
        let step = exec_step(env, &sut, &target, system).await?;
        eprintln!(
            "   SUT {} µs/setup, wall p50 {:.2} ms; failed {} {:?}",
            opt(step.sut_cpu_us_per_setup, 0),
            step.wall_ms.p50,
            step.failed,
            step.error_examples
        );
        results.exec_setup.push(step);
        drop(sut);
    }
    Ok(())
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

    fn memory(failed: u64, left_open: u64) -> MemoryStep {
        MemoryStep {
            system: System::S0,
            protocol: "h1",
            watches: 10,
            connections: 10,
            idle_rss_kib: 1000,
            rss_kib: 1100,
            kib_per_watch: 10.0,
            open_seconds: 0.1,
            settle_seconds: 0.0,
            established: 10 - failed,
            failed,
            dropped: 0,
            malformed: 0,
            backend_watches_left_open: left_open,
            backend: BackendCounters::default(),
            error_examples: Vec::new(),
        }
    }

    fn results(memory: Vec<MemoryStep>, not_started: Vec<String>) -> Results {
        Results {
            date_utc: String::new(),
            machine: machine(Path::new("debug")),
            settings: Settings {
                watches: vec![10],
                protocols: vec!["h1".into()],
                h2_streams_per_connection: 100,
                fan_watches: 1,
                fan_interval_ms: 100.0,
                duration_s: 1.0,
                tunnel_connections: 1,
                message_bytes: 16,
                window: 1,
                exec_setups: 1,
            },
            systems: vec![(System::S0, System::S0.describe())],
            not_started,
            skipped: Vec::new(),
            memory,
            fan_through: Vec::new(),
            throughput: Vec::new(),
            exec_setup: Vec::new(),
        }
    }

    #[test]
    fn every_error_counter_and_a_missing_system_fail_the_run() {
        assert!(failures(&results(vec![memory(0, 0)], Vec::new())).is_empty());
        let bad = failures(&results(vec![memory(2, 1)], vec!["N: nginx exited".into()]));
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("nginx exited"), "{bad:?}");
        assert!(
            bad[1].contains("2 watches failed") && bad[1].contains("1 watches left open"),
            "{bad:?}"
        );
        let mut mismatched = memory(0, 0);
        mismatched.backend.impersonation_mismatches = 1;
        assert_eq!(failures(&results(vec![mismatched], Vec::new())).len(), 1);
        let md = markdown(&results(vec![memory(0, 0)], Vec::new()));
        assert!(
            md.contains("| S0 | h1 | 10 | 10 | 0 | 1.0 | 1.1 | 10.00 |"),
            "{md}"
        );
        assert!(md.contains("Every error counter is 0."));
    }

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
