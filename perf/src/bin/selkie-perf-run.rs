//! `selkie-perf-run`: the first side-by-side run of PERF.md (started by `perf/run-first`).
//!
//! Generates a PKI into a temporary directory, starts `selkie-perf-backend` and then, one after
//! another, the systems under test: D (direct to the backend), N (nginx as a TLS reverse proxy
//! adding a fixed `Impersonate-User`), S0 (Selkie with a static identity) and SX (Selkie with
//! client certificates). The systems under test run on core 1 (`taskset -c 1`), the load client
//! and the backend on core 0; all are started first and stay up, idle while another is measured.
//! Per HTTP version: a closed-loop maximum-throughput step for every system, then an open-loop
//! step for every system at one fixed rate, half of the lowest maximum (so every system can
//! sustain it) unless `--rate-h1/--rate-h2` are given. Before every step the runner waits
//! (bounded) for the machine to be quiet and records its load. The table goes to `<out>/<name>.md` and every number to `<out>/<name>.json`.

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use nix::{sys::signal::Signal, unistd::Pid};
use selkie_perf::{
    parse_duration,
    pki::PerfPki,
    procstat::{load_average, processes_named},
    report::{BackendCounters, LoadReport},
};
use serde::Serialize;

/// The impersonated user every system must produce.
const USER: &str = "perf-user";
/// Its groups, in order.
const GROUPS: [&str; 2] = ["perf-devs", "perf-ops"];
/// The request path: a ConfigMap GET, as kubectl would send it.
const PATH: &str = "/api/v1/namespaces/default/configmaps/selkie-perf";
/// Processes that mean someone else is busy on the machine.
const BUSY: [&str; 3] = ["rustc", "kube-apiserver", "cc1"];

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-run", about)]
struct Args {
    /// Where the results go (default `perf/results`; `target/perf-smoke` with `--smoke`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// File name of the results, without extension (default `side-by-side-first`;
    /// `side-by-side-smoke` with `--smoke`).
    #[arg(long)]
    name: Option<String>,
    /// Smoke pass (what `make test` runs): every system and protocol for 1 s after a 0.5 s
    /// warm-up at `--smoke-rate` only (no maximum-throughput step), 4 HTTP/1.1 or 1 HTTP/2
    /// connections, a bounded request count, no waiting for a quiet machine. Exits non-zero if
    /// a system does not start or a step has no answers, a non-2xx answer, a failed request, a
    /// re-established connection, a backend handshake failure or an impersonation mismatch.
    /// Asserts that the harness runs, never that it is fast. Overrides `--duration`,
    /// `--warmup`, the connection counts and the rates.
    #[arg(long)]
    smoke: bool,
    /// The fixed rate of every smoke step, requests per second.
    #[arg(long, default_value_t = 100.0)]
    smoke_rate: f64,
    /// Most requests one load step may send, warm-up included (default: the load client's own
    /// bound; with `--smoke` twice the scheduled count).
    #[arg(long)]
    max_requests: Option<u64>,
    /// Systems to run, in this order.
    #[arg(long, value_delimiter = ',', default_value = "D,N,S0,SX")]
    systems: Vec<String>,
    /// HTTP versions client → system.
    #[arg(long, value_delimiter = ',', default_value = "h1,h2")]
    protocols: Vec<String>,
    /// Measured window of every step.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before every step.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    warmup: Duration,
    /// Fixed rate for HTTP/1.1 (default: `--rate-fraction` of the lowest maximum).
    #[arg(long)]
    rate_h1: Option<f64>,
    /// Fixed rate for HTTP/2 (default: `--rate-fraction` of the lowest maximum).
    #[arg(long)]
    rate_h2: Option<f64>,
    /// Fraction of the lowest maximum throughput used as the fixed rate.
    #[arg(long, default_value_t = 0.5)]
    rate_fraction: f64,
    /// HTTP/1.1 connections.
    #[arg(long, default_value_t = 32)]
    h1_connections: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    h2_connections: usize,
    /// Streams per HTTP/2 connection in the closed loop.
    #[arg(long, default_value_t = 16)]
    h2_streams: usize,
    /// Longest wait for a quiet machine before a step.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    quiet_wait: Duration,
    /// Longest total wait for a quiet machine over the whole run; once spent, steps start
    /// after a single 5 s check.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    quiet_budget: Duration,
    /// "Quiet": the machine's CPU busy share over 5 s below this (0–1, both cores together).
    #[arg(long, default_value_t = 0.15)]
    quiet_busy: f64,
    /// Where the binaries are (default: beside this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Keep nginx's access log and Selkie's audit log in the temporary directory (and keep it)
    /// instead of writing them to /dev/null.
    #[arg(long)]
    keep_logs: bool,
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
    /// Selkie, client certificates.
    SX,
}

impl System {
    fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "D" => Self::D,
            "N" => Self::N,
            "S0" => Self::S0,
            "SX" => Self::SX,
            _ => anyhow::bail!("unknown system {text:?} (D, N, S0, SX)"),
        })
    }

    fn describe(self) -> &'static str {
        match self {
            Self::D => "direct: client → backend",
            Self::N => "nginx, TLS reverse proxy adding Impersonate-User/-Group",
            Self::S0 => "Selkie, static identity",
            Self::SX => "Selkie, client certificate → identity",
        }
    }
}

/// A step's result.
#[derive(Debug, Serialize)]
struct Step {
    system: System,
    protocol: String,
    kind: &'static str,
    load_average_1m_at_start: f64,
    cpu_busy_at_start: f64,
    waited_for_quiet_s: f64,
    quiet: bool,
    /// Compilers or kube-apiservers seen (polled every second) while the step ran.
    busy_during_step: Vec<String>,
    load: LoadReport,
    backend: BackendCounters,
    command: String,
}

/// Everything recorded.
#[derive(Debug, Serialize)]
struct Results {
    date_utc: String,
    machine: Machine,
    settings: Settings,
    skipped: Vec<String>,
    steps: Vec<Step>,
}

#[derive(Debug, Serialize)]
struct Settings {
    duration_s: f64,
    warmup_s: f64,
    h1_connections: usize,
    h2_connections: usize,
    h2_streams: usize,
    fixed_rates: Vec<(String, f64)>,
    rate_rule: String,
    path: &'static str,
    response_body_bytes: usize,
}

#[derive(Debug, Serialize)]
struct Machine {
    cpu_model: String,
    cores: String,
    kernel: String,
    memory: String,
    rustc: String,
    nginx: String,
}

fn shell(command: &str) -> String {
    Command::new("sh")
        .args(["-c", command])
        .output()
        .map(|out| {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            text.trim().to_string()
        })
        .unwrap_or_default()
}

fn machine() -> Machine {
    Machine {
        cpu_model: shell("lscpu | sed -n 's/^Model name: *//p'"),
        cores: shell(
            "echo \"$(nproc) online; $(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s) per core\"",
        ),
        kernel: shell("uname -sr"),
        memory: shell("free -h | awk '/^Mem:/ {print $2}'"),
        rustc: shell("rustc --version"),
        nginx: shell("nginx -v 2>&1"),
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_for_port(address: SocketAddr, child: &mut Child, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{what} exited ({status}) before listening on {address}");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what} did not listen on {address} within 15 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn stop(mut child: Child, signal: Signal, what: &str) -> anyhow::Result<String> {
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let _ = nix::sys::signal::kill(pid, signal);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            eprintln!("{what} did not stop within 10 s; killing it");
            child.kill()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    let _ = child.wait();
    Ok(out)
}

fn counters(admin: SocketAddr) -> anyhow::Result<BackendCounters> {
    let mut tcp = TcpStream::connect_timeout(&admin, Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    tcp.write_all(b"GET /counters HTTP/1.0\r\nHost: backend\r\n\r\n")?;
    let mut response = String::new();
    tcp.read_to_string(&mut response)?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .context("the counters response has no body")?;
    Ok(serde_json::from_str(body)?)
}

fn difference(after: &BackendCounters, before: &BackendCounters) -> BackendCounters {
    BackendCounters {
        connections: after.connections - before.connections,
        handshake_failures: after.handshake_failures - before.handshake_failures,
        requests: after.requests - before.requests,
        http1_requests: after.http1_requests - before.http1_requests,
        http2_requests: after.http2_requests - before.http2_requests,
        impersonation_mismatches: after.impersonation_mismatches - before.impersonation_mismatches,
        mismatch_examples: after.mismatch_examples[before.mismatch_examples.len()..].to_vec(),
    }
}

/// `(user + nice + system + irq + softirq + steal, total)` jiffies of all CPUs.
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    (busy, busy + get(3) + get(4))
}

/// The machine's CPU busy share over the next `over`.
fn cpu_busy(over: Duration) -> f64 {
    let (busy0, total0) = cpu_jiffies();
    std::thread::sleep(over);
    let (busy1, total1) = cpu_jiffies();
    if total1 > total0 {
        (busy1 - busy0) as f64 / (total1 - total0) as f64
    } else {
        0.0
    }
}

/// Waits (bounded) until no compiler or kube-apiserver runs and the CPUs are nearly idle.
/// Returns (load average at the end, busy share, seconds waited, whether it got quiet).
fn wait_for_quiet(args: &Args, budget: &mut Duration) -> (f64, f64, f64, bool) {
    let start = Instant::now();
    let limit = args.quiet_wait.min(*budget);
    loop {
        let busy_procs = processes_named(&BUSY);
        let busy = cpu_busy(Duration::from_secs(5));
        let load = load_average().map(|l| l[0]).unwrap_or(f64::NAN);
        let quiet = busy_procs.is_empty() && busy < args.quiet_busy;
        let waited = start.elapsed();
        if quiet || waited >= limit {
            *budget = budget.saturating_sub(waited);
            if !quiet {
                eprintln!(
                    "  machine not quiet after {:.0} s (busy {:.0} %, {:?}); measuring anyway",
                    waited.as_secs_f64(),
                    busy * 100.0,
                    busy_procs
                );
            }
            return (load, busy, waited.as_secs_f64(), quiet);
        }
        eprintln!(
            "  waiting for a quiet machine: busy {:.0} %, load {load:.2}, running {:?}",
            busy * 100.0,
            busy_procs
                .iter()
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_secs(10));
    }
}

/// Watches, while a step runs, for other work starting on the machine.
struct Interference {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Interference {
    fn watch() -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut seen: Vec<String> = Vec::new();
            loop {
                for (_, name) in processes_named(&BUSY) {
                    if !seen.contains(&name) {
                        seen.push(name);
                    }
                }
                match stopped.recv_timeout(Duration::from_secs(1)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return seen,
                }
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

/// How the load client reaches one system.
struct Route {
    url: String,
    extra: Vec<String>,
    sut: Option<u32>,
}

/// A running system under test.
struct Running {
    child: Option<Child>,
    stop_signal: Signal,
    route: Route,
}

impl Drop for Running {
    /// A step that failed must not leave the system under test running.
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = stop(child, self.stop_signal, "the system under test");
        }
    }
}

struct Runner {
    args: Args,
    bin_dir: PathBuf,
    dir: PathBuf,
    pki: PerfPki,
    backend_port: u16,
    backend_admin: SocketAddr,
    backend_pid: u32,
}

impl Runner {
    fn log_target(&self, name: &str) -> anyhow::Result<Stdio> {
        if self.args.keep_logs {
            Ok(std::fs::File::create(self.dir.join(name))?.into())
        } else {
            Ok(Stdio::null())
        }
    }

    fn start_nginx(&self) -> anyhow::Result<Running> {
        let port = free_port()?;
        let dir = &self.dir;
        let access_log = if self.args.keep_logs {
            dir.join("nginx-access.log").display().to_string()
        } else {
            "/dev/null".into()
        };
        let p = |path: &Path| path.display().to_string();
        let conf = format!(
            r#"# Generated by selkie-perf-run.
user root;
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log {access_log};
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    proxy_headers_hash_bucket_size 128;
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
            proxy_set_header Connection "";
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
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf)?;
        let mut child = Command::new("taskset")
            .args(["-c", "1", "nginx", "-p"])
            .arg(dir)
            .arg("-c")
            .arg(&path)
            .arg("-e")
            .arg(dir.join("nginx-error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting nginx (apt-get install -y nginx-light)")?;
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), &mut child, "nginx")?;
        let sut = Some(child.id());
        Ok(Running {
            child: Some(child),
            stop_signal: Signal::SIGTERM,
            route: Route {
                url: format!("https://127.0.0.1:{port}{PATH}"),
                extra: Vec::new(),
                sut,
            },
        })
    }

    fn start_selkie(&self, system: System) -> anyhow::Result<Running> {
        let port = free_port()?;
        let q = |path: &Path| serde_json::to_string(&path.display().to_string()).unwrap_or_default();
        let mut config = format!(
            "# Generated by selkie-perf-run.\nlisten: 127.0.0.1:{port}\nservingCertificate:\n  certFile: {}\n  keyFile: {}\nupstream:\n  url: https://127.0.0.1:{}\n  caFile: {}\n  clientCertificate:\n    certFile: {}\n    keyFile: {}\n",
            q(&self.pki.proxy.cert),
            q(&self.pki.proxy.key),
            self.backend_port,
            q(&self.pki.ca),
            q(&self.pki.upstream_client.cert),
            q(&self.pki.upstream_client.key),
        );
        let mut extra = Vec::new();
        match system {
            System::S0 => {
                let _ = write!(
                    config,
                    "staticIdentity:\n  username: {USER}\n  groups: [{}, {}]\n",
                    GROUPS[0], GROUPS[1]
                );
            }
            System::SX => {
                let _ = writeln!(config, "clientCertificateCaFiles:\n  - {}", q(&self.pki.user_ca));
                extra.extend([
                    "--cert".to_string(),
                    self.pki.user.cert.display().to_string(),
                    "--key".to_string(),
                    self.pki.user.key.display().to_string(),
                ]);
            }
            System::D | System::N => anyhow::bail!("{system:?} is not Selkie"),
        }
        let path = self.dir.join(format!("selkie-{system:?}.yaml"));
        std::fs::write(&path, config)?;
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(self.bin_dir.join("selkie-concierge"))
            .arg("--config")
            .arg(&path)
            // Only the file watcher reads this; keep it out of the way.
            .args(["--watch-interval", "60s"])
            .stdin(Stdio::null())
            .stdout(self.log_target(&format!("selkie-{system:?}.log"))?)
            .stderr(self.log_target(&format!("selkie-{system:?}.err"))?)
            .spawn()
            .context("starting selkie-concierge (cargo build --release -p selkie-concierge)")?;
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            "selkie-concierge",
        )?;
        let sut = Some(child.id());
        Ok(Running {
            child: Some(child),
            stop_signal: Signal::SIGINT,
            route: Route {
                url: format!("https://127.0.0.1:{port}{PATH}"),
                extra,
                sut,
            },
        })
    }

    fn start(&self, system: System) -> anyhow::Result<Running> {
        match system {
            System::D => {
                let mut extra = vec![
                    "--cert".to_string(),
                    self.pki.upstream_client.cert.display().to_string(),
                    "--key".to_string(),
                    self.pki.upstream_client.key.display().to_string(),
                    "--header".to_string(),
                    format!("Impersonate-User: {USER}"),
                ];
                for group in GROUPS {
                    extra.extend(["--header".to_string(), format!("Impersonate-Group: {group}")]);
                }
                Ok(Running {
                    child: None,
                    stop_signal: Signal::SIGTERM,
                    route: Route {
                        url: format!("https://127.0.0.1:{}{PATH}", self.backend_port),
                        extra,
                        sut: None,
                    },
                })
            }
            System::N => self.start_nginx(),
            System::S0 | System::SX => self.start_selkie(system),
        }
    }

    /// One load step against `route`; `rate` = None is the closed loop.
    fn step(
        &self,
        system: System,
        route: &Route,
        protocol: &str,
        rate: Option<f64>,
        quiet_budget: &mut Duration,
    ) -> anyhow::Result<Step> {
        let (load_average_1m_at_start, cpu_busy_at_start, waited, quiet) = if self.args.smoke {
            // A smoke pass asserts that the harness runs; it neither waits for nor claims a
            // quiet machine.
            let load = load_average().map(|l| l[0]).unwrap_or(f64::NAN);
            (load, 0.0, 0.0, false)
        } else {
            wait_for_quiet(&self.args, quiet_budget)
        };
        let mut command = Command::new("taskset");
        command
            .args(["-c", "0"])
            .arg(self.bin_dir.join("selkie-perf-load"))
            .args(["--url", &route.url, "--protocol", protocol])
            .arg("--ca")
            .arg(&self.pki.ca)
            .args(["--duration", &format!("{}ms", self.args.duration.as_millis())])
            .args(["--warmup", &format!("{}ms", self.args.warmup.as_millis())])
            .args(&route.extra)
            .args(["--pid", &format!("backend={}", self.backend_pid)]);
        if let Some(max) = self.args.max_requests {
            command.args(["--max-requests", &max.to_string()]);
        }
        if let Some(sut) = route.sut {
            command.args(["--pid", &format!("sut={sut}")]);
        }
        let connections = if protocol == "h2" {
            self.args.h2_connections
        } else {
            self.args.h1_connections
        };
        command.args(["--connections", &connections.to_string()]);
        match rate {
            None => {
                command.args(["--mode", "closed", "--streams", &self.args.h2_streams.to_string()]);
            }
            Some(rate) => {
                command.args(["--mode", "open", "--rate", &format!("{rate}")]);
            }
        }
        let rendered = format!("{command:?}");
        let before = counters(self.backend_admin)?;
        let watcher = Interference::watch();
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting selkie-perf-load")?;
        let output = wait_bounded(
            child,
            self.args.warmup + self.args.duration + Duration::from_secs(60),
        )?;
        let busy_during_step = watcher.stop();
        let after = counters(self.backend_admin)?;
        let load: LoadReport = serde_json::from_slice(&output)
            .with_context(|| format!("parsing the load report of {rendered}"))?;
        Ok(Step {
            system,
            protocol: protocol.to_string(),
            kind: if rate.is_some() { "fixed-rate" } else { "max" },
            load_average_1m_at_start,
            cpu_busy_at_start,
            waited_for_quiet_s: waited,
            quiet,
            busy_during_step,
            load,
            backend: difference(&after, &before),
            command: rendered,
        })
    }
}

/// Waits for a child at most `limit`, killing it after; returns its stdout.
fn wait_bounded(mut child: Child, limit: Duration) -> anyhow::Result<Vec<u8>> {
    let mut stdout = child.stdout.take().context("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::ensure!(status.success(), "the load client failed ({status})");
            break;
        }
        if Instant::now() > deadline {
            child.kill()?;
            let _ = child.wait();
            anyhow::bail!("the load client ran past {} s and was killed", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the stdout reader panicked"))
}

fn sut_cpu(step: &Step) -> Option<f64> {
    step.load
        .cpu
        .iter()
        .find(|c| c.name == "sut")
        .map(|c| c.us_per_request)
}

fn group_cpu(step: &Step, name: &str) -> f64 {
    step.load
        .cpu
        .iter()
        .find(|c| c.name == name)
        .map_or(0.0, |c| c.us_per_request)
}

fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let m = &results.machine;
    let _ = writeln!(md, "# Side-by-side proxy benchmark, first run (D, N, S0, SX)\n");
    let _ = writeln!(
        md,
        "Generated by `perf/run-first` (`selkie-perf-run`); every number is also in the `.json` beside this file.\n"
    );
    let _ = writeln!(md, "* Date (UTC): {}", results.date_utc);
    let _ = writeln!(
        md,
        "* Machine: {}; {}; {} memory; {}",
        m.cpu_model, m.cores, m.memory, m.kernel
    );
    let _ = writeln!(md, "* Toolchain: {}; {}", m.rustc, m.nginx);
    let s = &results.settings;
    let _ = writeln!(
        md,
        "* Each step: {:.0} s warm-up, then {:.0} s measured. GET `{}`, {} B JSON answer. HTTP/1.1: {} keep-alive connections; HTTP/2: {} connections ({} streams each in the closed loop).",
        s.warmup_s, s.duration_s, s.path, s.response_body_bytes, s.h1_connections, s.h2_connections, s.h2_streams
    );
    let rates: Vec<String> = s
        .fixed_rates
        .iter()
        .map(|(p, r)| {
            let direct = results
                .steps
                .iter()
                .find(|st| &st.protocol == p && st.kind == "max" && st.system == System::D);
            match direct {
                Some(d) if d.load.achieved_rps > 0.0 => format!(
                    "{p} {r:.0} req/s ({:.0} % of D's maximum)",
                    r * 100.0 / d.load.achieved_rps
                ),
                _ => format!("{p} {r:.0} req/s"),
            }
        })
        .collect();
    let _ = writeln!(md, "* Fixed rates ({}): {}", s.rate_rule, rates.join(", "));
    let unquiet = results.steps.iter().filter(|st| !st.quiet).count();
    if unquiet > 0 {
        let _ = writeln!(
            md,
            "\n**Warning: {unquiet} of {} steps started on a machine that was not quiet** (see the load columns).",
            results.steps.len()
        );
    }
    let disturbed: Vec<String> = results
        .steps
        .iter()
        .filter(|st| !st.busy_during_step.is_empty())
        .map(|st| {
            format!(
                "{:?} {} {} ({})",
                st.system,
                st.protocol,
                st.kind,
                st.busy_during_step.join(", ")
            )
        })
        .collect();
    if disturbed.is_empty() {
        let _ = writeln!(
            md,
            "* No compiler or kube-apiserver was seen during any step (polled every second)."
        );
    } else {
        let _ = writeln!(
            md,
            "\n**Warning: other work ran during {} steps**: {}.",
            disturbed.len(),
            disturbed.join("; ")
        );
    }
    for skipped in &results.skipped {
        let _ = writeln!(md, "* Not run: {skipped}");
    }

    let protocols: Vec<String> = {
        let mut seen = Vec::new();
        for step in &results.steps {
            if !seen.contains(&step.protocol) {
                seen.push(step.protocol.clone());
            }
        }
        seen
    };
    for protocol in &protocols {
        let label = if protocol == "h2" {
            "HTTP/2"
        } else {
            "HTTP/1.1 keep-alive"
        };
        let steps = |kind: &'static str| {
            results
                .steps
                .iter()
                .filter(move |st| &st.protocol == protocol && st.kind == kind)
        };
        let direct_fixed = steps("fixed-rate").find(|st| st.system == System::D);
        let nginx_fixed = steps("fixed-rate").find(|st| st.system == System::N);

        let _ = writeln!(md, "\n## Client → system: {label}\n");
        let _ = writeln!(
            md,
            "### Fixed rate (open loop; latency from the intended send time)\n"
        );
        let _ = writeln!(
            md,
            "| id | system | offered req/s | achieved req/s | p50 µs | p99 µs | p99.9 µs | added p50 / p99 vs D µs | SUT CPU µs/req | ÷ N | backend CPU µs/req | non-2xx | errors | mismatches | load 1m / busy at start |"
        );
        let _ = writeln!(
            md,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for st in steps("fixed-rate") {
            let l = &st.load;
            let added = match direct_fixed {
                Some(d) if st.system != System::D => format!(
                    "{:+.0} / {:+.0}",
                    l.latency_us.p50 - d.load.latency_us.p50,
                    l.latency_us.p99 - d.load.latency_us.p99
                ),
                _ => "—".into(),
            };
            let cpu = sut_cpu(st);
            let ratio = match (cpu, nginx_fixed.and_then(sut_cpu)) {
                (Some(c), Some(n)) if n > 0.0 => format!("{:.2}", c / n),
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {:?} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {:.1} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                st.system.describe(),
                l.target_rate,
                l.achieved_rps,
                l.latency_us.p50,
                l.latency_us.p99,
                l.latency_us.p999,
                added,
                cpu.map_or("—".into(), |c| format!("{c:.1}")),
                ratio,
                group_cpu(st, "backend"),
                l.non_2xx,
                l.errors,
                st.backend.impersonation_mismatches,
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
        let _ = writeln!(
            md,
            "\n### Maximum throughput (closed loop; latency from the actual send time)\n"
        );
        let _ = writeln!(
            md,
            "| id | req/s | ÷ D | p50 µs | p99 µs | SUT CPU µs/req | backend CPU µs/req | load client CPU µs/req | non-2xx | errors | mismatches | SUT RSS MiB | load 1m / busy at start |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let direct_max = steps("max")
            .find(|st| st.system == System::D)
            .map(|d| d.load.achieved_rps);
        for st in steps("max") {
            let l = &st.load;
            let rss = l
                .cpu
                .iter()
                .find(|c| c.name == "sut")
                .map_or("—".into(), |c| format!("{:.1}", c.rss_kib as f64 / 1024.0));
            let _ = writeln!(
                md,
                "| {:?} | {:.0} | {} | {:.0} | {:.0} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                l.achieved_rps,
                direct_max.map_or("—".into(), |d| format!("{:.2}", l.achieved_rps / d)),
                l.latency_us.p50,
                l.latency_us.p99,
                sut_cpu(st).map_or("—".into(), |c| format!("{c:.1}")),
                group_cpu(st, "backend"),
                group_cpu(st, "load"),
                l.non_2xx,
                l.errors,
                st.backend.impersonation_mismatches,
                rss,
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
        let _ = writeln!(md, "\nTLS and upstream protocol seen:\n");
        for st in steps("fixed-rate") {
            let _ = writeln!(
                md,
                "* {:?}: client TLS {} {} ALPN {}; backend got {} HTTP/1.1 and {} HTTP/2 requests over {} new connections; client send lag p50/p99 {:.0}/{:.0} µs",
                st.system,
                st.load.tls.version,
                st.load.tls.suite,
                st.load.tls.alpn,
                st.backend.http1_requests,
                st.backend.http2_requests,
                st.backend.connections,
                st.load.send_lag_us.p50,
                st.load.send_lag_us.p99,
            );
        }
    }
    md
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.duration = Duration::from_secs(1);
        args.warmup = Duration::from_millis(500);
        args.h1_connections = 4;
        args.h2_connections = 1;
        args.rate_h1 = Some(args.smoke_rate);
        args.rate_h2 = Some(args.smoke_rate);
        anyhow::ensure!(
            args.smoke_rate > 0.0 && args.smoke_rate <= 10_000.0,
            "--smoke-rate must be in (0, 10000]"
        );
        let scheduled = args.smoke_rate * (args.duration + args.warmup).as_secs_f64();
        args.max_requests.get_or_insert((scheduled * 2.0).ceil() as u64);
    }
    let systems = args
        .systems
        .iter()
        .map(|s| System::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for protocol in &args.protocols {
        anyhow::ensure!(
            protocol == "h1" || protocol == "h2",
            "unknown protocol {protocol:?}"
        );
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the runner has no directory")?
            .to_path_buf(),
    };
    let selkie = systems.contains(&System::S0) || systems.contains(&System::SX);
    for bin in ["selkie-perf-backend", "selkie-perf-load", "selkie-concierge"] {
        if bin == "selkie-concierge" && !selkie {
            continue;
        }
        anyhow::ensure!(
            bin_dir.join(bin).exists(),
            "{} is missing: perf/run-first builds it (cargo build [--release] -p selkie-perf -p selkie-concierge)",
            bin_dir.join(bin).display()
        );
    }
    if systems.contains(&System::N) {
        anyhow::ensure!(
            Command::new("nginx").arg("-v").output().is_ok(),
            "nginx is not installed: apt-get install -y nginx-light"
        );
    }

    let temp = tempfile::Builder::new().prefix("selkie-perf-").tempdir()?;
    let dir = temp.path().to_path_buf();
    let groups: Vec<String> = GROUPS.iter().map(|g| g.to_string()).collect();
    let pki = PerfPki::generate(&dir, USER, &groups)?;
    let backend_port = free_port()?;
    let admin_port = free_port()?;
    let backend_admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
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
        .args(["--expect-user", USER]);
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
    let runner = Runner {
        backend_pid: backend.id(),
        args,
        bin_dir,
        dir,
        pki,
        backend_port,
        backend_admin,
    };

    let date_utc = shell("date -u +%Y-%m-%dT%H:%M:%SZ");
    let mut steps = Vec::new();
    let mut skipped = Vec::new();
    let mut fixed_rates: Vec<(String, f64)> = Vec::new();
    let mut quiet_budget = runner.args.quiet_budget;
    let outcome = (|| -> anyhow::Result<()> {
        // Every system is started once and stays up (idle) while the others are measured.
        let mut running = Vec::new();
        for system in &systems {
            match runner.start(*system) {
                Ok(started) => running.push((*system, started)),
                Err(error) if *system == System::S0 => {
                    eprintln!("S0 not run: {error:#}");
                    skipped.push(format!(
                        "S0 — selkie-concierge did not start with the `staticIdentity` configuration: {error:#}"
                    ));
                }
                Err(error) => return Err(error),
            }
        }
        // First the maximum of every system, then one fixed rate that all of them can sustain.
        for protocol in &runner.args.protocols {
            let mut lowest_max = f64::INFINITY;
            // A smoke pass has no maximum step: its rate is fixed.
            let max_steps = if runner.args.smoke { &[][..] } else { &running[..] };
            for (system, started) in max_steps {
                eprintln!("-- {system:?} {protocol}: maximum throughput");
                let max = runner.step(*system, &started.route, protocol, None, &mut quiet_budget)?;
                eprintln!(
                    "   {:.0} req/s, SUT {:?} µs/req, errors {}",
                    max.load.achieved_rps,
                    sut_cpu(&max),
                    max.load.errors
                );
                lowest_max = lowest_max.min(max.load.achieved_rps);
                steps.push(max);
            }
            let given = if protocol == "h2" {
                runner.args.rate_h2
            } else {
                runner.args.rate_h1
            };
            let rate = given.unwrap_or((lowest_max * runner.args.rate_fraction / 100.0).round() * 100.0);
            fixed_rates.push((protocol.clone(), rate));
            for (system, started) in &running {
                eprintln!("-- {system:?} {protocol}: fixed rate {rate:.0} req/s");
                let fixed = runner.step(*system, &started.route, protocol, Some(rate), &mut quiet_budget)?;
                eprintln!(
                    "   p50 {:.0} µs, p99 {:.0} µs, SUT {:?} µs/req, errors {}, mismatches {}",
                    fixed.load.latency_us.p50,
                    fixed.load.latency_us.p99,
                    sut_cpu(&fixed),
                    fixed.load.errors,
                    fixed.backend.impersonation_mismatches
                );
                steps.push(fixed);
            }
        }
        for (system, mut started) in running {
            if let Some(child) = started.child.take() {
                stop(child, started.stop_signal, &format!("{system:?}"))?;
            }
        }
        Ok(())
    })();
    let final_counters = stop(backend, Signal::SIGTERM, "the backend")?;
    eprintln!("backend counters at exit: {}", final_counters.trim());
    if runner.args.keep_logs {
        eprintln!("logs kept in {}", runner.dir.display());
        let _kept = temp.keep();
    }
    outcome?;

    let results = Results {
        date_utc,
        machine: machine(),
        settings: Settings {
            duration_s: runner.args.duration.as_secs_f64(),
            warmup_s: runner.args.warmup.as_secs_f64(),
            h1_connections: runner.args.h1_connections,
            h2_connections: runner.args.h2_connections,
            h2_streams: runner.args.h2_streams,
            fixed_rates,
            rate_rule: match (runner.args.rate_h1, runner.args.rate_h2) {
                (None, None) => format!(
                    "{:.0} % of the lowest maximum of all systems, so that every system can sustain it",
                    runner.args.rate_fraction * 100.0
                ),
                _ => "given on the command line where set".into(),
            },
            path: PATH,
            response_body_bytes: 1024,
        },
        skipped,
        steps,
    };
    let (out, name) = if runner.args.smoke {
        ("target/perf-smoke", "side-by-side-smoke")
    } else {
        ("perf/results", "side-by-side-first")
    };
    let out = runner.args.out.clone().unwrap_or_else(|| out.into());
    let name = runner.args.name.clone().unwrap_or_else(|| name.into());
    std::fs::create_dir_all(&out)?;
    let json = out.join(format!("{name}.json"));
    let md = out.join(format!("{name}.md"));
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    std::fs::write(&md, markdown(&results))?;
    eprintln!("wrote {} and {}", md.display(), json.display());
    if runner.args.smoke {
        let failures = smoke_failures(&systems, &runner.args.protocols, &results);
        for step in &results.steps {
            let l = &step.load;
            eprintln!(
                "smoke {:?} {}: {} answered of {} sent at {:.0} req/s, p50 {:.0} µs, non-2xx {}, errors {}, reconnects {}, backend requests {}, mismatches {}, handshake failures {}",
                step.system,
                step.protocol,
                l.completed,
                l.sent,
                l.target_rate,
                l.latency_us.p50,
                l.non_2xx,
                l.errors,
                l.reconnects,
                step.backend.requests,
                step.backend.impersonation_mismatches,
                step.backend.handshake_failures,
            );
        }
        if !failures.is_empty() {
            for failure in &failures {
                eprintln!("smoke FAILED: {failure}");
            }
            anyhow::bail!("the perf smoke pass failed ({} problems)", failures.len());
        }
        eprintln!(
            "smoke passed: {} steps ({} systems × {} protocols), every error counter 0",
            results.steps.len(),
            systems.len(),
            runner.args.protocols.len()
        );
    }
    Ok(())
}

/// What is wrong with a smoke pass's results: a system or protocol that did not run, a step
/// without answers, or any non-zero error counter. Empty when the pass is good.
fn smoke_failures(systems: &[System], protocols: &[String], results: &Results) -> Vec<String> {
    let mut failures: Vec<String> = results
        .skipped
        .iter()
        .map(|skipped| format!("not run: {skipped}"))
        .collect();
    for system in systems {
        for protocol in protocols {
            let ran = results
                .steps
                .iter()
                .any(|st| st.system == *system && &st.protocol == protocol);
            if !ran {
                failures.push(format!("{system:?} {protocol}: no step ran"));
            }
        }
    }
    for st in &results.steps {
        let (l, b) = (&st.load, &st.backend);
        let id = format!("{:?} {} {}", st.system, st.protocol, st.kind);
        let mut check = |bad: bool, what: String| {
            if bad {
                failures.push(format!("{id}: {what}"));
            }
        };
        check(l.completed == 0, "no request was answered".into());
        check(l.non_2xx > 0, format!("{} answers outside 200–299", l.non_2xx));
        check(
            l.errors > 0,
            format!(
                "{} failed requests ({} timed out): {:?}",
                l.errors, l.timeouts, l.error_examples
            ),
        );
        check(
            l.reconnects > 0,
            format!("{} connections closed and re-established", l.reconnects),
        );
        check(
            b.impersonation_mismatches > 0,
            format!(
                "{} impersonation mismatches at the backend: {:?}",
                b.impersonation_mismatches, b.mismatch_examples
            ),
        );
        check(
            b.handshake_failures > 0,
            format!("{} failed TLS handshakes at the backend", b.handshake_failures),
        );
        // Every answer must come from the backend (through the system), not the system itself.
        check(
            b.requests < l.completed,
            format!(
                "the backend served {} requests but the client got {} answers",
                b.requests, l.completed
            ),
        );
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(system: System, protocol: &str) -> Step {
        Step {
            system,
            protocol: protocol.into(),
            kind: "fixed-rate",
            load_average_1m_at_start: 0.0,
            cpu_busy_at_start: 0.0,
            waited_for_quiet_s: 0.0,
            quiet: false,
            busy_during_step: Vec::new(),
            load: LoadReport {
                sent: 100,
                completed: 100,
                ..LoadReport::default()
            },
            backend: BackendCounters {
                requests: 150,
                ..BackendCounters::default()
            },
            command: String::new(),
        }
    }

    fn results(steps: Vec<Step>) -> Results {
        Results {
            date_utc: String::new(),
            machine: Machine {
                cpu_model: String::new(),
                cores: String::new(),
                kernel: String::new(),
                memory: String::new(),
                rustc: String::new(),
                nginx: String::new(),
            },
            settings: Settings {
                duration_s: 1.0,
                warmup_s: 0.5,
                h1_connections: 4,
                h2_connections: 1,
                h2_streams: 16,
                fixed_rates: Vec::new(),
                rate_rule: String::new(),
                path: PATH,
                response_body_bytes: 1024,
            },
            skipped: Vec::new(),
            steps,
        }
    }

    #[test]
    fn a_clean_smoke_pass_has_no_failures() {
        let all = results(vec![step(System::D, "h1"), step(System::S0, "h1")]);
        assert_eq!(
            smoke_failures(&[System::D, System::S0], &["h1".into()], &all),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_error_counter_fails_the_smoke_pass() {
        let systems = [System::SX];
        let protocols = ["h2".to_string()];
        type Spoil = fn(&mut Step);
        let cases: [(&str, Spoil); 7] = [
            ("no request was answered", |s| s.load.completed = 0),
            ("answers outside 200–299", |s| s.load.non_2xx = 1),
            ("failed requests", |s| s.load.errors = 2),
            ("re-established", |s| s.load.reconnects = 1),
            ("impersonation mismatches", |s| {
                s.backend.impersonation_mismatches = 3
            }),
            ("failed TLS handshakes", |s| s.backend.handshake_failures = 1),
            ("the backend served 99 requests", |s| s.backend.requests = 99),
        ];
        for (expected, spoil) in cases {
            let mut bad = step(System::SX, "h2");
            spoil(&mut bad);
            let failures = smoke_failures(&systems, &protocols, &results(vec![bad]));
            assert_eq!(failures.len(), 1, "{expected}: {failures:?}");
            assert!(failures[0].starts_with("SX h2 fixed-rate: "), "{failures:?}");
            assert!(failures[0].contains(expected), "{expected}: {failures:?}");
        }
    }

    #[test]
    fn a_system_that_did_not_run_fails_the_smoke_pass() {
        let mut partial = results(vec![step(System::D, "h1")]);
        partial.skipped.push("S0 — did not start".into());
        let failures = smoke_failures(&[System::D, System::S0], &["h1".into(), "h2".into()], &partial);
        assert_eq!(
            failures,
            [
                "not run: S0 — did not start",
                "D h2: no step ran",
                "S0 h1: no step ran",
                "S0 h2: no step ran"
            ]
        );
    }
}
