//! `selkie-perf-load`: the load client of the side-by-side benchmarks.
//!
//! * **Open loop** (`--mode open --rate R`): requests are scheduled at a fixed rate, spread
//!   round-robin over `--connections` TLS connections, whatever the server does. A pacing
//!   task on a timerfd releases each request at its intended time; latency is measured
//!   from that *intended* time, so a stalled server is charged for the queue it causes
//!   (coordinated-omission correction). How late the client itself sent is reported separately
//!   (`send_lag_us`).
//! * **Closed loop** (`--mode closed`): every connection (times `--streams` over HTTP/2) sends
//!   the next request as soon as the previous one is answered; for maximum throughput only.
//! * **Watch** (`--mode watch`): one watch (`--url` with `watch=1`) held open while the watched
//!   object is updated directly at the server (`--update-url`, a merge patch of `data.seq`) at
//!   `--rate` updates a second; latency from sending each update to the arrival of its event.
//!   Every update of the window must come back as exactly one event ([`WatchReport`]).
//!
//! HTTP/1.1 keep-alive or HTTP/2 over TLS 1.3, optional client certificate, extra headers, an
//! optional `Authorization: Bearer` token per request (rotating over a file of tokens, or a fresh
//! unique token every request), and a handshake mode (`--new-connection-per-request`, HTTP/1.1:
//! one TLS connection per request, `Connection: close`). Each
//! run is a warm-up followed by the measured window, both bounded in time and in requests; CPU
//! time of the processes given with `--pid` is sampled from `/proc` at the window's edges. The
//! report is one JSON object on stdout ([`LoadReport`]).

use std::{
    net::SocketAddr,
    os::fd::{AsFd as _, AsRawFd, RawFd},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use http::{header, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::{
    errno::Errno,
    sys::{
        time::TimeSpec,
        timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags},
    },
};
use rustls_pki_types::ServerName;
use selkie_perf::{
    parse_duration,
    procstat::{process_tree, rss_kib, total_cpu_time},
    report::{CpuUse, LoadReport, Percentiles, TlsInfo, WatchReport},
    tls::{client_config, ALPN_H2, ALPN_HTTP11},
    watch::for_each_line,
};
use tokio::{
    io::{unix::AsyncFd, Interest},
    net::TcpStream,
    sync::mpsc,
};
use tokio_rustls::TlsConnector;

/// How long to wait for requests still in flight after the window closes.
const DRAIN: Duration = Duration::from_secs(5);
/// Open loop over HTTP/2: requests in flight per connection at most (kube-apiserver's and the
/// backend's stream limit).
const MAX_STREAMS_IN_FLIGHT_U32: u32 = 250;
const MAX_STREAMS_IN_FLIGHT: usize = MAX_STREAMS_IN_FLIGHT_U32 as usize;
/// How many distinct error messages the report keeps.
const ERROR_EXAMPLES: usize = 5;
/// Pause after a failed connection attempt, so a dead server does not cause a busy loop.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

/// HTTP version towards the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    /// HTTP/1.1 keep-alive, one request in flight per connection.
    H1,
    /// HTTP/2, many streams per connection.
    H2,
}

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A fixed rate, independent of the responses.
    Open,
    /// As fast as the server answers.
    Closed,
    /// One watch held open while its object is updated at a fixed rate (`--update-url`).
    Watch,
}

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-load", about)]
struct Args {
    /// `https://127.0.0.1:PORT/path`.
    #[arg(long)]
    url: Uri,
    /// CA bundle for the server's certificate.
    #[arg(long)]
    ca: PathBuf,
    /// Client certificate (PEM) to present.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// HTTP version.
    #[arg(long, value_enum, default_value = "h1")]
    protocol: Protocol,
    /// Open (fixed rate) or closed loop (maximum throughput).
    #[arg(long, value_enum, default_value = "open")]
    mode: Mode,
    /// Requests per second (open loop).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// TCP/TLS connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Requests in flight per HTTP/2 connection in the closed loop.
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// Length of the measured window.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before the window, not measured.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    warmup: Duration,
    /// Upper bound on requests started, warm-up included.
    #[arg(long, default_value_t = 20_000_000)]
    max_requests: u64,
    /// Per-request deadline.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// Extra request header, `Name: value` (repeat the flag).
    #[arg(long)]
    header: Vec<String>,
    /// `Authorization: Bearer` tokens, one per line; requests take them in turn.
    #[arg(long, conflicts_with = "bearer_unique")]
    bearer_file: Option<PathBuf>,
    /// `Authorization: Bearer PREFIX<n>` with a counter `n`: every request a token never seen.
    #[arg(long)]
    bearer_unique: Option<String>,
    /// HTTP/1.1 only: open a new TLS connection for every request and send `Connection: close`
    /// (counts handshakes; nothing is opened before the clock starts and closes are not
    /// reconnects).
    #[arg(long)]
    new_connection_per_request: bool,
    /// Processes whose CPU time to report, `name=PID[,PID...]` (repeat the flag); each PID's
    /// descendants are included.
    #[arg(long)]
    pid: Vec<String>,
    /// Watch mode: the watched object at the server itself (`https://HOST:PORT/api/v1/...`),
    /// updated over HTTP/2 with `PATCH` (merge patch `{"data":{"seq":...}}`), `--rate` a second.
    #[arg(long, required_if_eq("mode", "watch"))]
    update_url: Option<Uri>,
    /// CA bundle of the update server (default `--ca`).
    #[arg(long)]
    update_ca: Option<PathBuf>,
    /// Client certificate (PEM) for the updates.
    #[arg(long, requires = "update_key")]
    update_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, requires = "update_cert")]
    update_key: Option<PathBuf>,
}

/// How to open a connection and what to send on it.
struct Target {
    address: SocketAddr,
    server_name: ServerName<'static>,
    connector: TlsConnector,
    protocol: Protocol,
    uri: Uri,
    authority: HeaderValue,
    headers: Vec<(HeaderName, HeaderValue)>,
    bearer: Bearer,
    /// Requests built so far (picks the bearer token).
    built: AtomicU64,
    fresh_connections: bool,
    timeout: Duration,
    tls_info: Mutex<Option<TlsInfo>>,
}

/// Where the `Authorization` header of each request comes from.
enum Bearer {
    /// No `Authorization` header.
    None,
    /// These headers in turn.
    Rotate(Vec<HeaderValue>),
    /// `Bearer <prefix><n>`, a new `n` every request.
    Unique(String),
}

impl Target {
    fn request(&self) -> anyhow::Result<Request<Empty<Bytes>>> {
        let mut builder = Request::builder();
        builder = match self.protocol {
            // HTTP/1.1: origin-form target plus Host.
            Protocol::H1 => builder
                .uri(self.uri.path_and_query().map_or("/", |p| p.as_str()))
                .header(header::HOST, self.authority.clone()),
            // HTTP/2: the absolute URI becomes :scheme and :authority.
            Protocol::H2 => builder.uri(self.uri.clone()).version(http::Version::HTTP_2),
        };
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let n = self.built.fetch_add(1, Ordering::Relaxed);
        match &self.bearer {
            Bearer::None => {}
            Bearer::Rotate(values) => {
                let i = usize::try_from(n % values.len().max(1) as u64).unwrap_or(0);
                if let Some(value) = values.get(i) {
                    builder = builder.header(header::AUTHORIZATION, value.clone());
                }
            }
            Bearer::Unique(prefix) => {
                builder = builder.header(
                    header::AUTHORIZATION,
                    HeaderValue::from_str(&format!("Bearer {prefix}{n}"))?,
                );
            }
        }
        if self.fresh_connections {
            builder = builder.header(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(builder.body(Empty::new())?)
    }

    async fn tls(&self) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.address).await?;
        tcp.set_nodelay(true)?;
        let tls = self.connector.connect(self.server_name.clone(), tcp).await?;
        if let Ok(mut info) = self.tls_info.lock() {
            if info.is_none() {
                let session = tls.get_ref().1;
                *info = Some(TlsInfo {
                    version: session
                        .protocol_version()
                        .map(|v| format!("{v:?}"))
                        .unwrap_or_default(),
                    suite: session
                        .negotiated_cipher_suite()
                        .map(|s| format!("{:?}", s.suite()))
                        .unwrap_or_default(),
                    alpn: session
                        .alpn_protocol()
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                        .unwrap_or_default(),
                });
            }
        }
        Ok(tls)
    }

    /// The TLS session of the first connection (empty before one was made).
    fn tls_info(&self) -> TlsInfo {
        self.tls_info
            .lock()
            .ok()
            .and_then(|info| info.clone())
            .unwrap_or_default()
    }

    async fn connect_h1(&self) -> anyhow::Result<http1::SendRequest<Empty<Bytes>>> {
        let (sender, connection) = http1::handshake(TokioIo::new(self.tls().await?)).await?;
        tokio::spawn(connection);
        Ok(sender)
    }

    async fn connect_h2<B>(&self) -> anyhow::Result<http2::SendRequest<B>>
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (sender, connection) =
            http2::handshake(TokioExecutor::new(), TokioIo::new(self.tls().await?)).await?;
        tokio::spawn(connection);
        Ok(sender)
    }
}

/// What came back for one request.
type Exchange = anyhow::Result<(StatusCode, u64)>;

async fn read_response(response: hyper::Response<hyper::body::Incoming>) -> Exchange {
    let status = response.status();
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            bytes += data.len() as u64;
        }
    }
    Ok((status, bytes))
}

/// One request on an HTTP/1.1 connection, reconnecting first if it was closed.
async fn exchange_h1(
    target: &Target,
    sender: &mut Option<http1::SendRequest<Empty<Bytes>>>,
    stats: &Stats,
) -> Exchange {
    if target.fresh_connections {
        // Handshake mode: every request on a connection of its own.
        *sender = None;
    }
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        if sender.is_some() {
            stats.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        *sender = None;
        match target.connect_h1().await {
            Ok(fresh) => *sender = Some(fresh),
            Err(error) => {
                tokio::time::sleep(RECONNECT_PAUSE).await;
                return Err(error);
            }
        }
    }
    let request = target.request()?;
    let Some(live) = sender.as_mut() else {
        anyhow::bail!("no connection");
    };
    let work = async {
        live.ready().await?;
        read_response(live.send_request(request).await?).await
    };
    let outcome = tokio::time::timeout(target.timeout, work).await;
    if target.fresh_connections {
        // Handshake mode: the connection served its one request.
        *sender = None;
    }
    match outcome {
        Ok(result) => result,
        Err(_) => {
            // The connection may still deliver the late answer; never reuse it.
            *sender = None;
            anyhow::bail!("timed out")
        }
    }
}

/// An HTTP/2 connection shared by many in-flight requests, re-established when it closes.
struct H2Slot {
    sender: tokio::sync::Mutex<Option<http2::SendRequest<Empty<Bytes>>>>,
}

impl H2Slot {
    async fn sender(
        &self,
        target: &Target,
        stats: &Stats,
    ) -> anyhow::Result<http2::SendRequest<Empty<Bytes>>> {
        let mut slot = self.sender.lock().await;
        if let Some(sender) = slot.as_ref().filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        if slot.is_some() {
            stats.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        *slot = None;
        match target.connect_h2().await {
            Ok(fresh) => {
                *slot = Some(fresh.clone());
                Ok(fresh)
            }
            Err(error) => {
                tokio::time::sleep(RECONNECT_PAUSE).await;
                Err(error)
            }
        }
    }

    async fn exchange(&self, target: &Target, stats: &Stats) -> Exchange {
        let mut sender = self.sender(target, stats).await?;
        let request = target.request()?;
        let work = async {
            sender.ready().await?;
            read_response(sender.send_request(request).await?).await
        };
        tokio::time::timeout(target.timeout, work)
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")))
    }
}

/// A connection opened before the run.
enum Connection {
    /// HTTP/1.1: one request at a time (none yet in handshake mode).
    H1(Option<http1::SendRequest<Empty<Bytes>>>),
    /// HTTP/2: shared by the requests in flight.
    H2(Arc<H2Slot>),
}

/// Counters and histograms of the measured window.
struct Stats {
    window: Mutex<Window>,
    reconnects: AtomicU64,
    started: AtomicU64,
}

#[derive(Default)]
struct Window {
    latency_ns: Option<Histogram<u64>>,
    lag_ns: Option<Histogram<u64>>,
    sent: u64,
    completed: u64,
    non_2xx: u64,
    errors: u64,
    body_bytes: u64,
    error_examples: Vec<String>,
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).context("creating a histogram")
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX).max(1)
}

impl Stats {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            window: Mutex::new(Window {
                latency_ns: Some(histogram()?),
                lag_ns: Some(histogram()?),
                ..Window::default()
            }),
            reconnects: AtomicU64::new(0),
            started: AtomicU64::new(0),
        })
    }

    fn sent(&self) {
        if let Ok(mut w) = self.window.lock() {
            w.sent += 1;
        }
    }

    /// Records one finished request of the window; `lag` is how late it was sent (open loop).
    fn record(&self, result: &Exchange, latency: Duration, lag: Option<Duration>) {
        let Ok(mut w) = self.window.lock() else {
            return;
        };
        match result {
            Ok((status, bytes)) => {
                w.completed += 1;
                w.body_bytes += bytes;
                if !status.is_success() {
                    w.non_2xx += 1;
                }
                if let Some(h) = w.latency_ns.as_mut() {
                    h.saturating_record(nanos(latency));
                }
            }
            Err(error) => {
                w.errors += 1;
                let text = format!("{error:#}");
                if w.error_examples.len() < ERROR_EXAMPLES && !w.error_examples.contains(&text) {
                    w.error_examples.push(text);
                }
            }
        }
        if let (Some(lag), Some(h)) = (lag, w.lag_ns.as_mut()) {
            h.saturating_record(nanos(lag));
        }
    }
}

fn percentiles(h: Option<&Histogram<u64>>) -> Percentiles {
    let Some(h) = h.filter(|h| !h.is_empty()) else {
        return Percentiles::default();
    };
    let us = |ns: u64| ns as f64 / 1000.0;
    Percentiles {
        p50: us(h.value_at_quantile(0.50)),
        p90: us(h.value_at_quantile(0.90)),
        p99: us(h.value_at_quantile(0.99)),
        p999: us(h.value_at_quantile(0.999)),
        max: us(h.max()),
        mean: h.mean() / 1000.0,
    }
}

/// The window's edges.
#[derive(Clone, Copy)]
struct Phases {
    measure_start: Instant,
    measure_end: Instant,
}

/// A timerfd, for wake-ups with nanosecond resolution inside the runtime (tokio's own timers
/// have a resolution of one millisecond, far coarser than the latencies measured here).
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Waits until `deadline` on `timer`.
async fn sleep_precisely(timer: &AsyncFd<Timer>, deadline: Instant) -> anyhow::Result<()> {
    let now = Instant::now();
    if deadline <= now {
        return Ok(());
    }
    let delay = (deadline - now).max(Duration::from_nanos(1));
    timer.get_ref().0.set(
        Expiration::OneShot(TimeSpec::from_duration(delay)),
        TimerSetTimeFlags::empty(),
    )?;
    loop {
        let mut ready = timer.readable().await?;
        let expired = ready.get_inner().0.wait();
        ready.clear_ready();
        match expired {
            Ok(()) => return Ok(()),
            Err(Errno::EAGAIN) => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

/// Open loop: hands out intended send times at `rate`, one connection after another, from
/// `start` until `end` (or `max` requests).
async fn pace(
    senders: Vec<mpsc::UnboundedSender<Instant>>,
    start: Instant,
    end: Instant,
    rate: f64,
    max: u64,
) -> anyhow::Result<()> {
    // tokio 1.54 deprecates the safe constructor because an arbitrary `AsRawFd` may hand out a
    // descriptor it does not own (tokio#8587); `Timer` owns its timerfd, which lives exactly as
    // long as the registration. The replacement is `unsafe`, which the workspace forbids.
    #[allow(deprecated, reason = "Timer owns its descriptor; see above")]
    let timer = AsyncFd::with_interest(
        Timer(TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?),
        Interest::READABLE,
    )?;
    let interval = 1.0 / rate;
    let mut i: u64 = 0;
    while i < max {
        let intended = start + Duration::from_secs_f64(i as f64 * interval);
        if intended >= end {
            break;
        }
        sleep_precisely(&timer, intended).await?;
        // Everything already due goes out now, without another wait.
        let connection = usize::try_from(i % senders.len() as u64).unwrap_or(0);
        if senders[connection].send(intended).is_err() {
            break;
        }
        i += 1;
    }
    Ok(())
}

async fn open_h1(
    target: Arc<Target>,
    stats: Arc<Stats>,
    phases: Phases,
    mut intended_times: mpsc::UnboundedReceiver<Instant>,
    mut sender: Option<http1::SendRequest<Empty<Bytes>>>,
) {
    while let Some(intended) = intended_times.recv().await {
        let measured = intended >= phases.measure_start;
        if measured {
            stats.sent();
        }
        let lag = intended.elapsed();
        let result = exchange_h1(&target, &mut sender, &stats).await;
        if measured {
            stats.record(&result, intended.elapsed(), Some(lag));
        }
    }
}

async fn open_h2(
    target: Arc<Target>,
    stats: Arc<Stats>,
    phases: Phases,
    mut intended_times: mpsc::UnboundedReceiver<Instant>,
    slot: Arc<H2Slot>,
) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS_IN_FLIGHT));
    while let Some(intended) = intended_times.recv().await {
        let measured = intended >= phases.measure_start;
        if measured {
            stats.sent();
        }
        // Past the cap, requests wait here, and the wait counts in their latency.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (target, stats, slot) = (target.clone(), stats.clone(), slot.clone());
        tokio::spawn(async move {
            let lag = intended.elapsed();
            let result = slot.exchange(&target, &stats).await;
            if measured {
                stats.record(&result, intended.elapsed(), Some(lag));
            }
            drop(permit);
        });
    }
    // Wait for this connection's requests, as the HTTP/1.1 worker does by construction.
    let _ = in_flight.acquire_many(MAX_STREAMS_IN_FLIGHT_U32).await;
}

async fn closed_h1(
    target: Arc<Target>,
    stats: Arc<Stats>,
    phases: Phases,
    max: u64,
    mut sender: Option<http1::SendRequest<Empty<Bytes>>>,
) {
    while Instant::now() < phases.measure_end && stats.started.fetch_add(1, Ordering::Relaxed) < max {
        let sent = Instant::now();
        let result = exchange_h1(&target, &mut sender, &stats).await;
        let done = Instant::now();
        if sent >= phases.measure_start && done < phases.measure_end {
            stats.sent();
            stats.record(&result, done - sent, None);
        }
    }
}

async fn closed_h2(target: Arc<Target>, stats: Arc<Stats>, phases: Phases, max: u64, slot: Arc<H2Slot>) {
    while Instant::now() < phases.measure_end && stats.started.fetch_add(1, Ordering::Relaxed) < max {
        let sent = Instant::now();
        let result = slot.exchange(&target, &stats).await;
        let done = Instant::now();
        if sent >= phases.measure_start && done < phases.measure_end {
            stats.sent();
            stats.record(&result, done - sent, None);
        }
    }
}

/// A `--pid name=PID[,PID]` group.
struct PidGroup {
    name: String,
    pids: Vec<u32>,
}

fn pid_groups(specs: &[String]) -> anyhow::Result<Vec<PidGroup>> {
    let mut groups = specs
        .iter()
        .map(|spec| {
            let (name, pids) = spec
                .split_once('=')
                .with_context(|| format!("--pid {spec:?} is not name=PID[,PID]"))?;
            let mut all = Vec::new();
            for pid in pids.split(',') {
                let pid: u32 = pid
                    .parse()
                    .with_context(|| format!("--pid {spec:?}: {pid:?} is not a PID"))?;
                for member in process_tree(pid) {
                    if !all.contains(&member) {
                        all.push(member);
                    }
                }
            }
            Ok(PidGroup {
                name: name.to_string(),
                pids: all,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    groups.push(PidGroup {
        name: "load".into(),
        pids: vec![std::process::id()],
    });
    Ok(groups)
}

fn parse_header(text: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let (name, value) = text
        .split_once(':')
        .with_context(|| format!("--header {text:?} is not `Name: value`"))?;
    Ok((
        HeaderName::from_bytes(name.trim().as_bytes())?,
        HeaderValue::from_str(value.trim())?,
    ))
}

impl Target {
    /// How to reach `url` over `protocol`: its address, a TLS 1.3 client trusting `ca` (and
    /// presenting `identity`), the headers every request carries.
    async fn new(
        url: &Uri,
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
        protocol: Protocol,
        headers: Vec<(HeaderName, HeaderValue)>,
        bearer: Bearer,
        args: &Args,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(url.scheme_str() == Some("https"), "{url} is not https://");
        let host = url
            .host()
            .context("the URL has no host")?
            .trim_matches(['[', ']']);
        let port = url.port_u16().unwrap_or(443);
        let address = tokio::net::lookup_host((host, port))
            .await?
            .next()
            .with_context(|| format!("{host} has no address"))?;
        let alpn: &[&[u8]] = match protocol {
            Protocol::H1 => &[ALPN_HTTP11],
            Protocol::H2 => &[ALPN_H2],
        };
        let config = client_config(ca, identity, alpn)?;
        Ok(Self {
            address,
            server_name: ServerName::try_from(host.to_string())?,
            connector: TlsConnector::from(Arc::new(config)),
            protocol,
            authority: HeaderValue::from_str(url.authority().map_or(host, |a| a.as_str()))?,
            uri: url.clone(),
            headers,
            bearer,
            built: AtomicU64::new(0),
            fresh_connections: args.new_connection_per_request,
            timeout: args.timeout,
            tls_info: Mutex::new(None),
        })
    }
}

/// The CPU time of every group now.
fn cpu_times(groups: &[PidGroup]) -> anyhow::Result<Vec<Duration>> {
    groups.iter().map(|g| total_cpu_time(&g.pids)).collect()
}

/// Every group's CPU use between two [`cpu_times`], per one of `completed`.
fn cpu_use(groups: &[PidGroup], before: &[Duration], after: &[Duration], completed: u64) -> Vec<CpuUse> {
    groups
        .iter()
        .zip(before.iter().zip(after))
        .map(|(group, (before, after))| {
            let seconds = after.saturating_sub(*before).as_secs_f64();
            CpuUse {
                name: group.name.clone(),
                pids: group.pids.clone(),
                cpu_seconds: seconds,
                us_per_request: if completed > 0 {
                    seconds * 1e6 / completed as f64
                } else {
                    0.0
                },
                rss_kib: group.pids.iter().filter_map(|pid| rss_kib(*pid).ok()).sum(),
            }
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    anyhow::ensure!(args.url.scheme_str() == Some("https"), "--url must be https://");
    anyhow::ensure!(
        args.connections > 0 && args.streams > 0,
        "--connections and --streams must be > 0"
    );
    anyhow::ensure!(
        args.mode == Mode::Closed || (args.rate.is_finite() && args.rate > 0.0),
        "--rate must be positive"
    );
    anyhow::ensure!(
        !args.new_connection_per_request || args.protocol == Protocol::H1,
        "--new-connection-per-request is for HTTP/1.1 (--protocol h1)"
    );
    let bearer = match (&args.bearer_file, &args.bearer_unique) {
        (Some(path), _) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let values = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .map(|token| HeaderValue::from_str(&format!("Bearer {token}")))
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{} holds a token that is not a header value", path.display()))?;
            anyhow::ensure!(!values.is_empty(), "{} holds no token", path.display());
            Bearer::Rotate(values)
        }
        (None, Some(prefix)) => Bearer::Unique(prefix.clone()),
        (None, None) => Bearer::None,
    };
    let headers = args
        .header
        .iter()
        .map(|h| parse_header(h))
        .collect::<anyhow::Result<_>>()?;
    let identity = args.cert.as_deref().zip(args.key.as_deref());
    let target = Arc::new(
        Target::new(
            &args.url,
            &args.ca,
            identity,
            args.protocol,
            headers,
            bearer,
            &args,
        )
        .await?,
    );
    let groups = pid_groups(&args.pid)?;
    let report = match args.mode {
        Mode::Open | Mode::Closed => requests(&args, target, &groups).await?,
        Mode::Watch => watch(&args, target, &groups).await?,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Open and closed loop: requests over connections opened before the clock starts.
async fn requests(args: &Args, target: Arc<Target>, groups: &[PidGroup]) -> anyhow::Result<LoadReport> {
    let stats = Arc::new(Stats::new()?);
    // Open every connection before the clock starts: the handshakes are not part of the run.
    let mut connections = Vec::new();
    for _ in 0..args.connections {
        connections.push(match args.protocol {
            Protocol::H1 if target.fresh_connections => Connection::H1(None),
            Protocol::H1 => Connection::H1(Some(target.connect_h1().await?)),
            Protocol::H2 => Connection::H2(Arc::new(H2Slot {
                sender: tokio::sync::Mutex::new(Some(target.connect_h2().await?)),
            })),
        });
    }

    let start = Instant::now();
    let phases = Phases {
        measure_start: start + args.warmup,
        measure_end: start + args.warmup + args.duration,
    };
    let mut workers = tokio::task::JoinSet::new();
    let mut pacer = None;
    let max = args.max_requests;
    match args.mode {
        Mode::Open | Mode::Watch => {
            let mut senders = Vec::new();
            for connection in connections {
                let (tx, rx) = mpsc::unbounded_channel();
                senders.push(tx);
                let (target, stats) = (target.clone(), stats.clone());
                match connection {
                    Connection::H1(sender) => workers.spawn(open_h1(target, stats, phases, rx, sender)),
                    Connection::H2(slot) => workers.spawn(open_h2(target, stats, phases, rx, slot)),
                };
            }
            pacer = Some(tokio::spawn(pace(
                senders,
                start,
                phases.measure_end,
                args.rate,
                max,
            )));
        }
        Mode::Closed => {
            for connection in connections {
                match connection {
                    Connection::H1(sender) => {
                        workers.spawn(closed_h1(target.clone(), stats.clone(), phases, max, sender));
                    }
                    Connection::H2(slot) => {
                        for _ in 0..args.streams {
                            workers.spawn(closed_h2(
                                target.clone(),
                                stats.clone(),
                                phases,
                                max,
                                slot.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }

    tokio::time::sleep_until(phases.measure_start.into()).await;
    let cpu_before = cpu_times(groups)?;
    let window_start = Instant::now();
    tokio::time::sleep_until(phases.measure_end.into()).await;
    // Open loop: the window ends when its last request is answered (or given up on).
    let drain = tokio::time::timeout(args.timeout + DRAIN, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    let window = window_start.elapsed();
    let cpu_after = cpu_times(groups)?;
    workers.abort_all();
    if let Some(pacer) = pacer {
        pacer.abort();
        if let Ok(Err(error)) = pacer.await {
            anyhow::bail!("pacing failed: {error:#}");
        }
    }

    let Ok(w) = stats.window.lock() else {
        anyhow::bail!("the statistics lock was poisoned");
    };
    let timeouts = if drain.is_err() {
        w.sent.saturating_sub(w.completed + w.errors)
    } else {
        0
    };
    // Closed loop: the window is exactly the measured interval.
    let window_seconds = match args.mode {
        Mode::Open | Mode::Watch => window.as_secs_f64(),
        Mode::Closed => args.duration.as_secs_f64(),
    };
    let completed = w.completed;
    Ok(LoadReport {
        mode: format!("{:?}", args.mode).to_lowercase(),
        protocol: format!("{:?}", args.protocol).to_lowercase(),
        connections: args.connections,
        streams_per_connection: match (args.mode, args.protocol) {
            (Mode::Closed, Protocol::H2) => args.streams,
            _ => 1,
        },
        target_rate: match args.mode {
            Mode::Open | Mode::Watch => args.rate,
            Mode::Closed => 0.0,
        },
        window_seconds,
        sent: w.sent,
        completed,
        non_2xx: w.non_2xx,
        errors: w.errors + timeouts,
        timeouts,
        reconnects: stats.reconnects.load(Ordering::Relaxed),
        achieved_rps: completed as f64 / window_seconds,
        body_bytes: w.body_bytes,
        error_examples: w.error_examples.clone(),
        latency_us: percentiles(w.latency_ns.as_ref()),
        send_lag_us: percentiles(w.lag_ns.as_ref()),
        tls: target.tls_info(),
        cpu: cpu_use(groups, &cpu_before, &cpu_after, completed),
        watch: None,
    })
}

// ---------------------------------------------------------------------------------------------
// Watch mode.

/// One update of the watched object, until its event arrives.
struct PendingUpdate {
    sent: Instant,
    /// Sent inside the measured window.
    measured: bool,
}

/// What watch mode counts; see [`WatchReport`].
struct WatchState {
    /// `data.seq` of this run's updates is `<prefix><n>`.
    prefix: String,
    inner: Mutex<WatchCounts>,
    /// Signalled when the first event arrives and whenever the last pending update got its event.
    changed: tokio::sync::Notify,
}

struct WatchCounts {
    established: bool,
    pending: std::collections::HashMap<u64, PendingUpdate>,
    event_ns: Histogram<u64>,
    update_ns: Histogram<u64>,
    lag_ns: Histogram<u64>,
    updates: u64,
    updates_ok: u64,
    non_2xx: u64,
    updates_failed: u64,
    events: u64,
    unexpected: u64,
    event_bytes: u64,
    examples: Vec<String>,
}

impl WatchCounts {
    fn example(&mut self, text: String) {
        if self.examples.len() < ERROR_EXAMPLES && !self.examples.contains(&text) {
            self.examples.push(text);
        }
    }
}

impl WatchState {
    fn new(prefix: String) -> anyhow::Result<Self> {
        Ok(Self {
            prefix,
            inner: Mutex::new(WatchCounts {
                established: false,
                pending: std::collections::HashMap::new(),
                event_ns: histogram()?,
                update_ns: histogram()?,
                lag_ns: histogram()?,
                updates: 0,
                updates_ok: 0,
                non_2xx: 0,
                updates_failed: 0,
                events: 0,
                unexpected: 0,
                event_bytes: 0,
                examples: Vec::new(),
            }),
            changed: tokio::sync::Notify::new(),
        })
    }

    fn counts(&self) -> anyhow::Result<std::sync::MutexGuard<'_, WatchCounts>> {
        self.inner
            .lock()
            .map_err(|_| anyhow::anyhow!("the watch statistics lock was poisoned"))
    }

    /// One line of the watch stream: the first event establishes the watch; every later one must
    /// be the event of a pending update.
    fn line(&self, line: &[u8]) {
        let arrived = Instant::now();
        let Ok(mut c) = self.inner.lock() else { return };
        let event: Option<serde_json::Value> = serde_json::from_slice(line).ok();
        let kind = event.as_ref().and_then(|e| e["type"].as_str());
        if !c.established && matches!(kind, Some("ADDED" | "MODIFIED")) {
            c.established = true;
            self.changed.notify_waiters();
            return;
        }
        let n = event
            .as_ref()
            .filter(|_| kind == Some("MODIFIED"))
            .and_then(|e| e["object"]["data"]["seq"].as_str())
            .and_then(|seq| seq.strip_prefix(self.prefix.as_str()))
            .and_then(|n| n.parse::<u64>().ok());
        match n.and_then(|n| c.pending.remove(&n)) {
            Some(update) => {
                if update.measured {
                    c.events += 1;
                    c.event_bytes += line.len() as u64 + 1;
                    c.event_ns.saturating_record(nanos(arrived - update.sent));
                }
                if c.pending.is_empty() {
                    self.changed.notify_waiters();
                }
            }
            None => {
                c.unexpected += 1;
                let text = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                c.example(format!("unexpected watch line: {text}"));
            }
        }
    }

    /// Update `n` is about to be sent.
    fn sending(&self, n: u64, measured: bool, lag: Duration) {
        if let Ok(mut c) = self.inner.lock() {
            c.pending.insert(
                n,
                PendingUpdate {
                    sent: Instant::now(),
                    measured,
                },
            );
            if measured {
                c.updates += 1;
                c.lag_ns.saturating_record(nanos(lag));
            }
        }
    }

    /// Update `n` was answered (or failed) after `took`; one that did not succeed expects no event.
    fn answered(&self, n: u64, measured: bool, result: &Exchange, took: Duration) {
        let Ok(mut c) = self.inner.lock() else { return };
        let ok = matches!(result, Ok((status, _)) if status.is_success());
        if !ok {
            c.pending.remove(&n);
            if c.pending.is_empty() {
                self.changed.notify_waiters();
            }
        }
        if !measured {
            return;
        }
        match result {
            Ok((status, _)) if status.is_success() => {
                c.updates_ok += 1;
                c.update_ns.saturating_record(nanos(took));
            }
            Ok((status, _)) => {
                c.non_2xx += 1;
                c.example(format!("update answered {status}"));
            }
            Err(error) => {
                c.updates_failed += 1;
                c.example(format!("update failed: {error:#}"));
            }
        }
    }
}

/// Sends the updates whose intended times `pace` hands out, each on its own HTTP/2 stream.
async fn send_updates(
    update: Arc<Target>,
    sender: http2::SendRequest<Full<Bytes>>,
    state: Arc<WatchState>,
    phases: Phases,
    mut intended_times: mpsc::UnboundedReceiver<Instant>,
) {
    let mut in_flight = tokio::task::JoinSet::new();
    let mut n = 0u64;
    while let Some(intended) = intended_times.recv().await {
        n += 1;
        let measured = intended >= phases.measure_start;
        let (update, state, mut sender) = (update.clone(), state.clone(), sender.clone());
        in_flight.spawn(async move {
            let body = format!(r#"{{"data":{{"seq":"{}{n}"}}}}"#, state.prefix);
            let request = Request::patch(update.uri.clone())
                .version(http::Version::HTTP_2)
                .header(header::CONTENT_TYPE, "application/merge-patch+json")
                .body(Full::new(Bytes::from(body)));
            state.sending(n, measured, intended.elapsed());
            let sent = Instant::now();
            let work = async {
                sender.ready().await?;
                read_response(sender.send_request(request?).await?).await
            };
            let result = tokio::time::timeout(update.timeout, work)
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
            state.answered(n, measured, &result, sent.elapsed());
        });
    }
    while in_flight.join_next().await.is_some() {}
}

/// Watch mode (see [`Mode::Watch`]).
async fn watch(args: &Args, target: Arc<Target>, groups: &[PidGroup]) -> anyhow::Result<LoadReport> {
    let update_url = args
        .update_url
        .as_ref()
        .context("--mode watch needs --update-url")?;
    let update_identity = args.update_cert.as_deref().zip(args.update_key.as_deref());
    let update = Arc::new(
        Target::new(
            update_url,
            args.update_ca.as_deref().unwrap_or(&args.ca),
            update_identity,
            Protocol::H2,
            Vec::new(),
            Bearer::None,
            args,
        )
        .await?,
    );
    let state = Arc::new(WatchState::new(format!("{}-", std::process::id()))?);
    // Registered now, so that a first event arriving before the wait below is not missed.
    let established = state.changed.notified();
    tokio::pin!(established);
    established.as_mut().enable();
    let response = match args.protocol {
        Protocol::H1 => {
            let mut sender = target.connect_h1().await?;
            sender.ready().await?;
            sender.send_request(target.request()?).await?
        }
        Protocol::H2 => {
            let mut sender = target.connect_h2::<Empty<Bytes>>().await?;
            sender.ready().await?;
            sender.send_request(target.request()?).await?
        }
    };
    anyhow::ensure!(
        response.status() == StatusCode::OK,
        "the watch was answered {}",
        response.status()
    );
    let reader = {
        let state = state.clone();
        tokio::spawn(async move {
            let end = for_each_line(response.into_body(), |line| state.line(line)).await;
            // A watch that stops while the step runs loses events.
            if let Ok(mut c) = state.inner.lock() {
                c.unexpected += 1;
                c.example(end.to_string());
            }
            state.changed.notify_waiters();
        })
    };
    if !state.counts()?.established {
        let _ = tokio::time::timeout(args.timeout, established).await;
    }
    anyhow::ensure!(
        state.counts()?.established,
        "the watch sent no first event within {} s",
        args.timeout.as_secs()
    );
    let sender = update.connect_h2::<Full<Bytes>>().await?;

    let start = Instant::now();
    let phases = Phases {
        measure_start: start + args.warmup,
        measure_end: start + args.warmup + args.duration,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let updater = tokio::spawn(send_updates(update, sender, state.clone(), phases, rx));
    let pacer = tokio::spawn(pace(
        vec![tx],
        start,
        phases.measure_end,
        args.rate,
        args.max_requests,
    ));
    tokio::time::sleep_until(phases.measure_start.into()).await;
    let cpu_before = cpu_times(groups)?;
    let window_start = Instant::now();
    if let Ok(Err(error)) = pacer.await {
        anyhow::bail!("pacing failed: {error:#}");
    }
    // The window ends when the last update's event arrived (or the drain gave up on it).
    let _ = tokio::time::timeout(args.timeout + DRAIN, async {
        let _ = updater.await;
        loop {
            let waiting = state.changed.notified();
            tokio::pin!(waiting);
            waiting.as_mut().enable();
            if state.counts().map_or(true, |c| c.pending.is_empty()) || reader.is_finished() {
                return;
            }
            waiting.await;
        }
    })
    .await;
    let window = window_start.elapsed();
    let cpu_after = cpu_times(groups)?;
    reader.abort();

    let c = state.counts()?;
    let missing = c.pending.values().filter(|p| p.measured).count() as u64;
    let window_seconds = window.as_secs_f64();
    Ok(LoadReport {
        mode: "watch".into(),
        protocol: format!("{:?}", args.protocol).to_lowercase(),
        connections: 1,
        streams_per_connection: 1,
        target_rate: args.rate,
        window_seconds,
        sent: c.updates,
        completed: c.events,
        non_2xx: c.non_2xx,
        errors: c.updates_failed + missing + c.unexpected,
        timeouts: missing,
        reconnects: 0,
        error_examples: c.examples.clone(),
        achieved_rps: c.events as f64 / window_seconds,
        body_bytes: c.event_bytes,
        latency_us: percentiles(Some(&c.event_ns)),
        send_lag_us: percentiles(Some(&c.lag_ns)),
        tls: target.tls_info(),
        cpu: cpu_use(groups, &cpu_before, &cpu_after, c.events),
        watch: Some(WatchReport {
            established: c.established,
            updates: c.updates,
            updates_ok: c.updates_ok,
            updates_failed: c.updates_failed,
            events: c.events,
            missing,
            unexpected: c.unexpected,
            update_latency_us: percentiles(Some(&c.update_ns)),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, seq: &str) -> Vec<u8> {
        serde_json::json!({"type": kind, "object": {"kind": "ConfigMap", "data": {"seq": seq}}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn every_update_must_come_back_as_exactly_one_event() {
        let state = WatchState::new("42-".into()).unwrap();
        // The first event is the object as it was (an earlier run's seq): it establishes the watch.
        state.line(&event("ADDED", "41-9"));
        state.sending(1, false, Duration::ZERO);
        state.sending(2, true, Duration::from_micros(30));
        state.sending(3, true, Duration::ZERO);
        state.sending(4, true, Duration::ZERO);
        state.answered(4, true, &Err(anyhow::anyhow!("reset")), Duration::ZERO);
        state.answered(2, true, &Ok((StatusCode::OK, 10)), Duration::from_micros(900));
        state.line(&event("MODIFIED", "42-1"));
        state.line(&event("MODIFIED", "42-2"));
        state.line(&event("MODIFIED", "42-2"));
        state.line(b"not json");
        state.line(&event("ERROR", "42-3"));
        let c = state.counts().unwrap();
        assert!(c.established);
        // 1 was warm-up (its event is expected, not counted); 2 arrived; 3 is still pending;
        // 4 failed, so no event is expected for it.
        assert_eq!((c.updates, c.updates_ok, c.updates_failed), (3, 1, 1));
        assert_eq!(c.events, 1);
        assert_eq!(c.pending.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(
            c.unexpected, 3,
            "a repeated event, a malformed line, an ERROR event"
        );
        assert_eq!(c.event_ns.len(), 1);
        assert!(
            c.examples.iter().any(|e| e.contains("update failed: reset")),
            "{:?}",
            c.examples
        );
    }
}
