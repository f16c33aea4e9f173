//! What the benchmark binaries (`selkie-supervisor-bench`, `selkie-ldap-bench`) share: the CPU
//! time of the processes they measure, the wait for a quiet machine, the re-measure of a phase
//! that other work disturbed, the clients that run a phase's operations, and kube-apiserver's
//! request counts (from its `/metrics`), and what a process holds open (from `/proc`).
//!
//! Its functions return [`anyhow::Result`], as [`crate::eventually`] does: they run the caller's
//! fallible operations and hand their errors back unchanged.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use selkie_perf::procstat;

/// How a benchmark waits for a quiet machine and when it measures a phase again (command-line
/// flags, flattened into the benchmark's own).
#[derive(Debug, Clone, clap::Args)]
pub struct QuietArgs {
    /// Longest wait, in seconds, for a quiet machine before the measured phases.
    #[arg(long, default_value_t = 300)]
    pub quiet_wait: u64,
    /// "Quiet": the machine's CPU busy share over 5 s (0–1, all cores) below this, the bench's
    /// own idle components included.
    #[arg(long, default_value_t = 0.15)]
    pub quiet_busy: f64,
    /// A phase during which other processes took more than this share (0–1) of the machine is
    /// measured again.
    #[arg(long, default_value_t = 0.10)]
    pub interference: f64,
    /// Attempts per phase at most (the one with the least interference is reported).
    #[arg(long, default_value_t = 3)]
    pub attempts: usize,
}

/// How quiet the machine was before the warm-up and the measured phases.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Quiet {
    /// Seconds waited for it.
    pub waited_seconds: f64,
    /// The machine's CPU busy share (0–1) over the last 5 s checked.
    pub busy: f64,
    /// Whether `busy` got below `--quiet-busy` within `--quiet-wait`.
    pub quiet: bool,
}

/// Waits (at most `--quiet-wait`) until the machine's CPU busy share over 5 s is below
/// `--quiet-busy`; measuring goes ahead either way, and the report says how it was.
pub async fn wait_for_quiet(args: &QuietArgs) -> anyhow::Result<Quiet> {
    let started = Instant::now();
    loop {
        let busy = tokio::task::spawn_blocking(|| procstat::machine_busy(Duration::from_secs(5))).await?;
        let quiet = busy < args.quiet_busy;
        if quiet || started.elapsed() >= Duration::from_secs(args.quiet_wait) {
            if !quiet {
                eprintln!("machine not quiet (busy {:.0} %); measuring anyway", busy * 100.0);
            }
            return Ok(Quiet {
                waited_seconds: started.elapsed().as_secs_f64(),
                busy,
                quiet,
            });
        }
        eprintln!("waiting for a quiet machine: busy {:.0} %", busy * 100.0);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Runs a phase with `run`, and again (after waiting for a quiet machine) while other processes
/// took more than `--interference` of the machine during it, at most `--attempts` times in all.
/// Returns the attempt with the least interference, numbered.
pub async fn quietly<K, E, F, Fut>(args: &QuietArgs, mut run: F) -> anyhow::Result<Phase<K, E>>
where
    K: Ord + Copy,
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Phase<K, E>>>,
{
    let mut best: Option<Phase<K, E>> = None;
    for attempt in 1..=args.attempts.max(1) {
        if attempt > 1 {
            wait_for_quiet(args).await?;
        }
        let phase = Phase {
            attempt,
            ..run().await?
        };
        let share = phase.others_share();
        let name = phase.name;
        if best.as_ref().is_none_or(|best| share < best.others_share()) {
            best = Some(phase);
        }
        if share <= args.interference {
            break;
        }
        eprintln!(
            "{name}: other processes took {:.0} % of the machine (attempt {attempt})",
            share * 100.0
        );
    }
    best.context("no attempt ran")
}

/// Runs `total` operations on one task per state of `states`: each task turns its state into
/// the next with `op` as long as operations remain (a shared count, so the tasks share the work
/// whatever their speed); the first failure ends the run with its error (the other tasks are
/// aborted). Returns the tasks' final states.
pub async fn parallel<S, F, Fut>(total: usize, states: Vec<S>, op: F) -> anyhow::Result<Vec<S>>
where
    S: Send + 'static,
    F: Fn(S) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<S>> + Send + 'static,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let count = states.len();
    for state in states {
        let (op, next) = (op.clone(), next.clone());
        tasks.spawn(async move {
            let mut state = state;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                state = op(state).await?;
            }
            anyhow::Ok(state)
        });
    }
    let mut finished = Vec::with_capacity(count);
    while let Some(result) = tasks.join_next().await {
        finished.push(result.context("a client task ended abnormally")??);
    }
    Ok(finished)
}

/// One measured phase: `operations` operations in `wall`, the CPU time they took, and what
/// kube-apiserver served meanwhile; `extra` is whatever else a benchmark measures.
#[derive(Debug)]
pub struct Phase<K, E = ()> {
    /// Its name in the report.
    pub name: &'static str,
    /// Which attempt this is (see [`quietly`]).
    pub attempt: usize,
    /// Operations done (and checked).
    pub operations: usize,
    /// Wall time they took.
    pub wall: Duration,
    /// CPU time the processes took meanwhile.
    pub cpu: Cpu<K>,
    /// kube-apiserver's requests during the phase.
    pub requests: Requests,
    /// What else the benchmark measured.
    pub extra: E,
}

impl<K: Ord + Copy, E> Phase<K, E> {
    /// The share (0–1) of the machine's CPUs over the phase that processes other than the
    /// bench's used: other work interfering with the measurement.
    pub fn others_share(&self) -> f64 {
        self.cpu.others_share(self.wall)
    }

    /// `total` per operation, in microseconds.
    pub fn micros_per_op(&self, total: Duration) -> f64 {
        total.as_secs_f64() * 1e6 / self.operations.max(1) as f64
    }

    /// Operations per second of `total`.
    pub fn per_second(&self, total: Duration) -> f64 {
        self.operations as f64 / total.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// kube-apiserver requests for `resource` (every resource when `None`) with `verb` (every
    /// verb when `None`).
    pub fn requests(&self, resource: Option<&str>, verb: Option<&str>) -> f64 {
        self.requests
            .iter()
            .filter(|((r, v, _), _)| {
                resource.is_none_or(|want| r == want) && verb.is_none_or(|want| v == want)
            })
            // A fold from +0.0: an empty f64 `sum()` is -0.0, which would print as "-0.00".
            .fold(0.0, |total, (_, count)| total + count)
    }

    /// The same per operation.
    pub fn requests_per_op(&self, resource: Option<&str>, verb: Option<&str>) -> f64 {
        self.requests(resource, verb) / self.operations.max(1) as f64
    }
}

/// CPU time (utime + stime, from `/proc`) of the measured processes, each under its key `K`, of
/// this process (the clients) and of the whole machine; indexing by a key not measured gives 0.
#[derive(Debug, Clone)]
pub struct Cpu<K> {
    processes: BTreeMap<K, Duration>,
    /// This process (the clients).
    pub bench: Duration,
    /// Every CPU of the machine busy (`/proc/stat`), whoever ran.
    pub machine: Duration,
}

impl<K: Ord + Copy> Cpu<K> {
    /// The CPU times so far of `pids` (key, pid), this process and the machine.
    pub fn of(pids: &[(K, u32)]) -> anyhow::Result<Self> {
        let (busy_jiffies, _) = procstat::machine_jiffies();
        Ok(Self {
            processes: pids
                .iter()
                .map(|&(key, pid)| Ok((key, procstat::cpu_time(pid)?)))
                .collect::<anyhow::Result<_>>()?,
            bench: procstat::cpu_time(std::process::id())?,
            machine: Duration::from_secs_f64(busy_jiffies as f64 / procstat::clock_ticks_per_second() as f64),
        })
    }

    /// What was used between `before` and `self`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            processes: self
                .processes
                .iter()
                .map(|(&key, &time)| (key, time.saturating_sub(before[key])))
                .collect(),
            bench: self.bench.saturating_sub(before.bench),
            machine: self.machine.saturating_sub(before.machine),
        }
    }

    /// CPU that none of the bench's processes used: other work on the machine.
    pub fn others(&self) -> Duration {
        self.machine
            .saturating_sub(self.processes.values().sum::<Duration>() + self.bench)
    }

    /// [`Cpu::others`] as a share (0–1) of all the machine's CPUs over `wall`.
    pub fn others_share(&self, wall: Duration) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        self.others().as_secs_f64() / (wall.as_secs_f64() * cores).max(f64::MIN_POSITIVE)
    }
}

impl<K: Ord> std::ops::Index<K> for Cpu<K> {
    type Output = Duration;

    fn index(&self, key: K) -> &Duration {
        const ZERO: &Duration = &Duration::ZERO;
        self.processes.get(&key).unwrap_or(ZERO)
    }
}

/// kube-apiserver's request counter: (resource[/subresource], verb, code) → count. Requests for
/// no resource (`/metrics`, discovery) have the resource `-`.
pub type Requests = BTreeMap<(String, String, String), f64>;

/// kube-apiserver's `apiserver_request_total`, read with `kube`'s credentials (the admin's).
pub async fn apiserver_requests(kube: &kube::Client) -> anyhow::Result<Requests> {
    let text = kube
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await
        .context("reading kube-apiserver's /metrics")?;
    let mut requests = Requests::new();
    for (labels, value) in samples(&text, "apiserver_request_total")? {
        let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
        let resource = match (label("resource"), label("subresource")) {
            (resource, _) if resource.is_empty() => "-".to_string(),
            (resource, subresource) if subresource.is_empty() => resource,
            (resource, subresource) => format!("{resource}/{subresource}"),
        };
        *requests
            .entry((resource, label("verb"), label("code")))
            .or_default() += value;
    }
    Ok(requests)
}

/// `after − before` per key, keeping the keys that moved.
pub fn delta<K: Ord + Clone>(after: &BTreeMap<K, f64>, before: &BTreeMap<K, f64>) -> BTreeMap<K, f64> {
    after
        .iter()
        .map(|(key, value)| (key.clone(), value - before.get(key).copied().unwrap_or(0.0)))
        .filter(|(_, moved)| *moved != 0.0)
        .collect()
}

/// The samples of `metric` in a Prometheus or OpenMetrics text exposition: labels and value.
/// Lines of other metrics (including `metric`'s `_created` and `_bucket` kin) are skipped.
pub fn samples(text: &str, metric: &str) -> anyhow::Result<Vec<(BTreeMap<String, String>, f64)>> {
    let mut found = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
            let (labels, value) = rest
                .rsplit_once('}')
                .with_context(|| format!("an unterminated label set in {line:?}"))?;
            (
                parse_labels(labels).with_context(|| format!("the labels of {line:?}"))?,
                value,
            )
        } else if rest.starts_with(' ') {
            (BTreeMap::new(), rest)
        } else {
            continue;
        };
        let value = value
            .split_whitespace()
            .next()
            .and_then(|value| value.parse::<f64>().ok())
            .with_context(|| format!("no value in {line:?}"))?;
        found.push((labels, value));
    }
    Ok(found)
}

/// `name="value",…` (values with `\"`, `\\` and `\n` escapes) as a map.
fn parse_labels(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text.trim_start_matches([',', ' ']);
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"").context("a label without =\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, escaped)) => value.push(escaped),
                    None => anyhow::bail!("a dangling escape"),
                },
                Some((at, '"')) => break at,
                Some((_, c)) => value.push(c),
                None => anyhow::bail!("an unterminated label value"),
            }
        };
        labels.insert(name.trim().to_string(), value);
        rest = after[end + 1..].trim_start_matches([',', ' ']);
    }
    Ok(labels)
}

/// The name of Dex's build directory in the component cache (`dex-<module version>`).
pub fn dex_build() -> anyhow::Result<String> {
    let binary = &crate::components::Components::get()?.dex;
    Ok(binary
        .parent()
        .and_then(std::path::Path::parent)
        .and_then(std::path::Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| binary.display().to_string()))
}

/// Writes a benchmark's results: `json` beside `out` (`.json`), then the markdown report that
/// `markdown` makes (given that JSON file's path) to `out`, and prints the report.
pub fn write_report(
    out: &std::path::Path,
    json: &serde_json::Value,
    markdown: impl FnOnce(&std::path::Path) -> String,
) -> anyhow::Result<()> {
    let json_path = out.with_extension("json");
    std::fs::write(&json_path, serde_json::to_string_pretty(json)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let report = markdown(&json_path);
    std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
    print!("{report}");
    Ok(())
}

/// The last `lines` lines of `text` (a component's log, for an error).
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The loopback ports that tell the Supervisor's connections apart.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// The Supervisor's HTTPS listener (inbound: the bench's clients).
    pub supervisor: u16,
    /// kube-apiserver's port (outbound).
    pub kube_apiserver: u16,
    /// Dex's port (outbound).
    pub dex: u16,
}

/// What a process holds open.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Handles {
    /// File descriptors, sockets included.
    pub fds: usize,
    /// Established TCP connections accepted on the Supervisor's HTTPS port.
    pub inbound: usize,
    /// Established TCP connections to kube-apiserver.
    pub kube_apiserver: usize,
    /// Established TCP connections to Dex.
    pub dex: usize,
}

/// The file descriptors and established loopback connections of `pid`, from `/proc`.
pub fn handles(pid: u32, ports: Ports) -> anyhow::Result<Handles> {
    let mut inodes = std::collections::BTreeSet::new();
    let mut fds = 0;
    for fd in
        std::fs::read_dir(format!("/proc/{pid}/fd")).with_context(|| format!("reading /proc/{pid}/fd"))?
    {
        fds += 1;
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut found = Handles {
        fds,
        inbound: 0,
        kube_apiserver: 0,
        dex: 0,
    };
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |field: usize| {
                fields
                    .get(field)
                    .and_then(|address| address.rsplit_once(':'))
                    .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
            };
            let established = fields.get(3) == Some(&"01");
            if !established || !fields.get(9).is_some_and(|inode| inodes.contains(*inode)) {
                continue;
            }
            match (port(1), port(2)) {
                (Some(local), _) if local == ports.supervisor => found.inbound += 1,
                (_, Some(remote)) if remote == ports.kube_apiserver => found.kube_apiserver += 1,
                (_, Some(remote)) if remote == ports.dex => found.dex += 1,
                _ => {}
            }
        }
    }
    Ok(found)
}

/// The port of an `https://host:port/…` URL.
pub fn url_port(url: &str) -> anyhow::Result<u16> {
    let uri: http::Uri = url.parse().with_context(|| format!("{url} is no URL"))?;
    uri.port_u16().with_context(|| format!("{url} has no port"))
}

/// 32 random bytes (from `/dev/urandom`).
pub fn random_seed() -> anyhow::Result<[u8; 32]> {
    use std::io::Read as _;
    let mut seed = [0; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut seed))
        .context("reading /dev/urandom")?;
    Ok(seed)
}

/// The processes of a Supervisor benchmark whose CPU time is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Process {
    /// The Supervisor under test (its first replica).
    Supervisor,
    /// Dex, the upstream identity provider.
    Dex,
    /// kube-apiserver.
    Apiserver,
    /// etcd.
    Etcd,
}

/// `result`, or its error with the last 30 lines of `supervisor`'s log added: what the
/// Supervisor logged (it logs no token or password) says why an answer was refused.
pub fn with_supervisor_log<T>(
    result: anyhow::Result<T>,
    supervisor: &crate::supervisor::Supervisor,
) -> anyhow::Result<T> {
    result.map_err(|error| {
        let log = tail(&supervisor.log(), 30);
        error.context(format!("the Supervisor's log ends:\n{log}"))
    })
}
