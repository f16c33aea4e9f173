//! One load step: `selkie-perf-load` run against a system with the step's mode, rate and window,
//! its report recorded with the backend's and the identity provider's counters around it.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Child, Command, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use selkie_perf::{
    procstat::load_average,
    report::{BackendCounters, LoadReport},
};
use serde::Serialize;

use crate::{
    hotswap::{HotSwap, Swapper},
    idp::IdpCounters,
    launch::Running,
    quiet::{wait_for_quiet, Interference},
    systems::System,
    Runner, WATCH_OBJECT, WATCH_PATH,
};

/// A probe's warm-up at most (the system is warm from the sweep).
pub(crate) const PROBE_WARMUP: Duration = Duration::from_secs(2);

/// A step's result.
#[derive(Debug, Serialize)]
pub(crate) struct Step {
    pub(crate) system: System,
    pub(crate) protocol: String,
    /// `max` (closed loop), `fixed-rate` (a sweep step, or the rate given), `probe` (the p99
    /// search), `handshake` or `watch`.
    pub(crate) kind: &'static str,
    /// A sweep step: its fraction of the base rate of the system's group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fraction: Option<f64>,
    pub(crate) load_average_1m_at_start: f64,
    pub(crate) cpu_busy_at_start: f64,
    pub(crate) waited_for_quiet_s: f64,
    pub(crate) quiet: bool,
    /// Compilers or kube-apiservers seen (polled every second) while the step ran.
    pub(crate) busy_during_step: Vec<String>,
    pub(crate) load: LoadReport,
    pub(crate) backend: BackendCounters,
    /// SJ/SW: what the identity provider served during the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idp: Option<IdpCounters>,
    /// SR: swaps written and reloads seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hot_swap: Option<HotSwap>,
    pub(crate) command: String,
}

/// What a load step does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// Closed loop, maximum throughput.
    Max,
    /// Open loop at this rate (a sweep step, or the rate given).
    Fixed(f64),
    /// Open loop at this rate for `--probe-duration`: a probe of the p99 search.
    Probe(f64),
    /// A new TLS connection per request (HTTP/1.1); open loop at the rate, or closed when None.
    Handshakes(Option<f64>),
    /// A watch on a ConfigMap held through the system while the runner's client updates it
    /// directly at kube-apiserver, `--watch-rate` times a second (K rows only).
    Watch,
}

impl Kind {
    /// As the results name it.
    fn name(self) -> &'static str {
        match self {
            Self::Max => "max",
            Self::Fixed(_) => "fixed-rate",
            Self::Probe(_) => "probe",
            Self::Handshakes(_) => "handshake",
            Self::Watch => "watch",
        }
    }
}

impl Runner {
    /// One load step against `running`.
    pub(crate) fn step(
        &self,
        system: System,
        running: &Running,
        protocol: &str,
        kind: Kind,
        quiet_budget: &mut Duration,
    ) -> anyhow::Result<Step> {
        let route = &running.route;
        let (load_average_1m_at_start, cpu_busy_at_start, waited, quiet) = if self.args.smoke {
            // A smoke pass asserts that the harness runs; it neither waits for nor claims a
            // quiet machine.
            let load = load_average().map(|l| l[0]).unwrap_or(f64::NAN);
            (load, 0.0, 0.0, false)
        } else {
            wait_for_quiet(&self.args, quiet_budget, &self.own_processes())
        };
        let step_number = self.steps_started.fetch_add(1, Ordering::Relaxed);
        let (warmup, duration) = match kind {
            Kind::Probe(_) => (self.args.warmup.min(PROBE_WARMUP), self.args.probe_duration),
            _ => (self.args.warmup, self.args.duration),
        };
        let path = match kind {
            Kind::Watch => WATCH_PATH,
            _ => system.path(),
        };
        let mut command = Command::new("taskset");
        command
            .args(["-c", "0"])
            .arg(self.bin_dir.join("selkie-perf-load"))
            .args(["--url", &format!("{}{path}", route.base), "--protocol", protocol])
            .arg("--ca")
            .arg(route.ca.as_ref().unwrap_or(&self.pki.ca))
            .args(["--duration", &format!("{}ms", duration.as_millis())])
            .args(["--warmup", &format!("{}ms", warmup.as_millis())])
            .args(&route.extra);
        match (&self.kube, system.is_kube()) {
            // K rows: the "backend" is kube-apiserver + etcd (the cluster's process tree).
            (Some(kube), true) => command.args(["--pid", &format!("backend={}", kube.cluster_pid)]),
            _ => command.args(["--pid", &format!("backend={}", self.backend_pid)]),
        };
        if let Some(prefix) = &route.unique_bearer {
            command.args(["--bearer-unique", &format!("{prefix}{step_number}-")]);
        }
        if let Some(max) = self.args.max_requests {
            command.args(["--max-requests", &max.to_string()]);
        }
        if let Some(sut) = route.sut {
            command.args(["--pid", &format!("sut={sut}")]);
        }
        if let (Some(idp), true) = (&self.idp, system.uses_idp()) {
            command.args(["--pid", &format!("idp={}", idp.pid)]);
        }
        let connections = match kind {
            Kind::Handshakes(_) => self.args.handshake_connections,
            Kind::Watch => 1,
            _ if protocol == "h2" => self.args.h2_connections,
            _ => self.args.h1_connections,
        };
        command.args(["--connections", &connections.to_string()]);
        match kind {
            Kind::Max | Kind::Handshakes(None) => {
                command.args(["--mode", "closed", "--streams", &self.args.h2_streams.to_string()]);
            }
            Kind::Fixed(rate) | Kind::Probe(rate) | Kind::Handshakes(Some(rate)) => {
                command.args(["--mode", "open", "--rate", &format!("{rate}")]);
            }
            Kind::Watch => {
                let kube = self.kube.as_ref().context("the watch step needs the cluster")?;
                command
                    .args(["--mode", "watch", "--rate", &format!("{}", self.args.watch_rate)])
                    .args(["--update-url", &format!("{}{WATCH_OBJECT}", kube.server)])
                    .arg("--update-ca")
                    .arg(&kube.ca)
                    .arg("--update-cert")
                    .arg(&kube.admin_cert)
                    .arg("--update-key")
                    .arg(&kube.admin_key);
            }
        }
        if let Kind::Handshakes(_) = kind {
            command.arg("--new-connection-per-request");
        }
        let rendered = format!("{command:?}");
        // K rows: kube-apiserver has no mismatch counters; the backend's stay at 0 (see README).
        let backend_counters = || -> anyhow::Result<BackendCounters> {
            if system.is_kube() {
                Ok(BackendCounters::default())
            } else {
                counters(self.backend_admin)
            }
        };
        let before = backend_counters()?;
        let idp_before = match (&self.idp, system.uses_idp()) {
            (Some(idp), true) => Some(counters::<IdpCounters>(idp.admin)?),
            _ => None,
        };
        let reloads_before = self.reloads(running);
        let swapper = running.swappable.as_ref().map(|swappable| {
            Swapper::start(
                swappable.path.clone(),
                swappable.text.clone(),
                self.args.swap_interval,
            )
        });
        let watcher = Interference::watch(self.own_processes());
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting selkie-perf-load")?;
        let output = wait_bounded(child, warmup + duration + Duration::from_secs(60));
        let swaps_written = swapper.map(Swapper::stop);
        let output = output?;
        let busy_during_step = watcher.stop();
        let after = backend_counters()?;
        let idp = match (&self.idp, idp_before) {
            (Some(idp), Some(before)) => Some(counters::<IdpCounters>(idp.admin)?.minus(&before)),
            _ => None,
        };
        let hot_swap = swaps_written.map(|swaps_written| {
            // The last swap's reload is at most one watch interval away.
            std::thread::sleep(self.args.swap_watch_interval * 2);
            HotSwap {
                swaps_written,
                reloads_logged: self.reloads(running).saturating_sub(reloads_before),
            }
        });
        let load: LoadReport = serde_json::from_slice(&output)
            .with_context(|| format!("parsing the load report of {rendered}"))?;
        Ok(Step {
            system,
            protocol: protocol.to_string(),
            kind: kind.name(),
            fraction: None,
            load_average_1m_at_start,
            cpu_busy_at_start,
            waited_for_quiet_s: waited,
            quiet,
            busy_during_step,
            load,
            backend: difference(&after, &before),
            idp,
            hot_swap,
            command: rendered,
        })
    }
}

fn counters<T: serde::de::DeserializeOwned>(admin: SocketAddr) -> anyhow::Result<T> {
    let mut tcp = TcpStream::connect_timeout(&admin, Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    tcp.write_all(b"GET /counters HTTP/1.0\r\nHost: admin\r\n\r\n")?;
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
