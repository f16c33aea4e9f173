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
use http_body_util::{BodyExt as _, Empty};
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
    report::{CpuUse, LoadReport, Percentiles, TlsInfo},
    tls::{client_config, ALPN_H2, ALPN_HTTP11},
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

    async fn connect_h1(&self) -> anyhow::Result<http1::SendRequest<Empty<Bytes>>> {
        let (sender, connection) = http1::handshake(TokioIo::new(self.tls().await?)).await?;
        tokio::spawn(connection);
        Ok(sender)
    }

    async fn connect_h2(&self) -> anyhow::Result<http2::SendRequest<Empty<Bytes>>> {
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
    let host = args
        .url
        .host()
        .context("--url has no host")?
        .trim_matches(['[', ']']);
    let port = args.url.port_u16().unwrap_or(443);
    let address = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .with_context(|| format!("{host} has no address"))?;
    let alpn: &[&[u8]] = match args.protocol {
        Protocol::H1 => &[ALPN_HTTP11],
        Protocol::H2 => &[ALPN_H2],
    };
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
    let identity = args.cert.as_deref().zip(args.key.as_deref());
    let config = client_config(&args.ca, identity, alpn)?;
    let target = Arc::new(Target {
        address,
        server_name: ServerName::try_from(host.to_string())?,
        connector: TlsConnector::from(Arc::new(config)),
        protocol: args.protocol,
        authority: HeaderValue::from_str(args.url.authority().map_or(host, |a| a.as_str()))?,
        uri: args.url.clone(),
        headers: args
            .header
            .iter()
            .map(|h| parse_header(h))
            .collect::<anyhow::Result<_>>()?,
        bearer,
        built: AtomicU64::new(0),
        fresh_connections: args.new_connection_per_request,
        timeout: args.timeout,
        tls_info: Mutex::new(None),
    });
    let groups = pid_groups(&args.pid)?;
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
        Mode::Open => {
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
    let cpu_before = groups
        .iter()
        .map(|g| total_cpu_time(&g.pids))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let window_start = Instant::now();
    tokio::time::sleep_until(phases.measure_end.into()).await;
    // Open loop: the window ends when its last request is answered (or given up on).
    let drain = tokio::time::timeout(args.timeout + DRAIN, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    let window = window_start.elapsed();
    let cpu_after = groups
        .iter()
        .map(|g| total_cpu_time(&g.pids))
        .collect::<anyhow::Result<Vec<_>>>()?;
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
        Mode::Open => window.as_secs_f64(),
        Mode::Closed => args.duration.as_secs_f64(),
    };
    let completed = w.completed;
    let cpu = groups
        .iter()
        .zip(cpu_before.iter().zip(&cpu_after))
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
        .collect();
    let report = LoadReport {
        mode: format!("{:?}", args.mode).to_lowercase(),
        protocol: format!("{:?}", args.protocol).to_lowercase(),
        connections: args.connections,
        streams_per_connection: match (args.mode, args.protocol) {
            (Mode::Closed, Protocol::H2) => args.streams,
            _ => 1,
        },
        target_rate: match args.mode {
            Mode::Open => args.rate,
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
        tls: target
            .tls_info
            .lock()
            .ok()
            .and_then(|info| info.clone())
            .unwrap_or_default(),
        cpu,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
