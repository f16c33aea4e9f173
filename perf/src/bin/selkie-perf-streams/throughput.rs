//! The echo throughput step: MiB/s through upgraded streams and the system's CPU time per byte.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use selkie_perf::report::BackendCounters;
use serde::Serialize;

use crate::{
    measure::{backend_counters, backend_delta, warmup},
    systems::{Sut, System, Target},
    tunnels::{run_tunnel, Tunnel, TunnelStats, MAX_MESSAGE},
    Env,
};

/// One throughput step.
#[derive(Debug, Serialize)]
pub(crate) struct ThroughputStep {
    pub(crate) system: System,
    pub(crate) tunnel: Tunnel,
    connections: usize,
    message_bytes: usize,
    window_seconds: f64,
    pub(crate) echoed_bytes: u64,
    pub(crate) mib_per_second: f64,
    sut_cpu_seconds: Option<f64>,
    /// SUT CPU ÷ echoed payload bytes (each byte crosses the system twice: up and back).
    pub(crate) sut_cpu_ns_per_echoed_byte: Option<f64>,
    /// SUT CPU ÷ bytes through the system in both directions.
    pub(crate) sut_cpu_ns_per_byte_each_way: Option<f64>,
    pub(crate) failed_upgrades: u64,
    pub(crate) dropped: u64,
    pub(crate) echo_mismatches: u64,
    pub(crate) backend: BackendCounters,
    pub(crate) error_examples: Vec<String>,
}

pub(crate) async fn throughput_step(
    env: &Env,
    sut: &Sut,
    target: &Target,
    system: System,
    kind: Tunnel,
) -> anyhow::Result<ThroughputStep> {
    let before = backend_counters(env.backend_admin)?;
    let tunnels = Tunnels::start(env, target, kind, env.args.tunnel_connections);
    let stats = tunnels.stats.clone();
    tokio::time::sleep(warmup(&env.args)).await;
    let cpu0 = sut.cpu();
    let echoed0 = stats.echoed.load(Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(env.args.duration).await;
    let echoed = stats.echoed.load(Ordering::Relaxed) - echoed0;
    let cpu = sut.cpu().saturating_sub(cpu0);
    let window = start.elapsed().as_secs_f64();
    tunnels.finish().await;
    let sut_cpu = (system != System::D).then_some(cpu.as_secs_f64());
    let per = |bytes: u64| sut_cpu.filter(|_| bytes > 0).map(|cpu| cpu * 1e9 / bytes as f64);
    let examples = stats.examples.lock().map(|e| e.clone()).unwrap_or_default();
    Ok(ThroughputStep {
        system,
        tunnel: kind,
        connections: env.args.tunnel_connections.max(1),
        message_bytes: env.args.message_bytes.clamp(16, MAX_MESSAGE),
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

/// Upgraded connections echoing at once (`--message-bytes`, `--window`) until [`Tunnels::finish`].
pub(crate) struct Tunnels {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// What they saw.
    pub(crate) stats: Arc<TunnelStats>,
}

impl Tunnels {
    /// Starts `connections` (at least one) upgrades of `kind` to `target`, each echoing.
    pub(crate) fn start(env: &Env, target: &Target, kind: Tunnel, connections: usize) -> Self {
        let stats = Arc::new(TunnelStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let args = (
            env.args.message_bytes.clamp(16, MAX_MESSAGE),
            env.args.window.max(1),
        );
        let tasks = (0..connections.max(1))
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
        Self { tasks, stop, stats }
    }

    /// Stops them and waits up to 10 s for each to drain; one that does not is aborted and
    /// counted as dropped.
    pub(crate) async fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        for mut task in self.tasks {
            if tokio::time::timeout(Duration::from_secs(10), &mut task)
                .await
                .is_err()
            {
                task.abort();
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                self.stats.example("a tunnel did not drain within 10 s".into());
            }
        }
    }
}
