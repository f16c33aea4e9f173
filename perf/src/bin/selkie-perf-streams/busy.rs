//! The busy step: the memory bound under load. A freshly started system holds idle watches while
//! WebSocket exec streams echo through it flat out: its RSS idle, with the watches held, at its
//! peak while the streams run, and once they have ended (the watches still held).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use selkie_perf::report::BackendCounters;
use serde::Serialize;

use crate::{
    measure::{backend_counters, backend_delta, warmup},
    memory::settled_rss,
    systems::{Protocol, System},
    throughput::Tunnels,
    tunnels::Tunnel,
    watches::{close_watches, open_watches, wait_established, WatchStats},
    Env,
};

/// How often the RSS is sampled while the streams run.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// One busy step.
#[derive(Debug, Serialize)]
pub(crate) struct BusyStep {
    pub(crate) system: System,
    pub(crate) protocol: &'static str,
    pub(crate) watches: usize,
    pub(crate) tunnels: usize,
    pub(crate) idle_rss_kib: u64,
    /// With the watches held, settled, before the streams start.
    pub(crate) watches_rss_kib: u64,
    /// The highest RSS sampled while the streams ran.
    pub(crate) peak_rss_kib: u64,
    /// Settled after the streams ended, the watches still held.
    pub(crate) after_rss_kib: u64,
    pub(crate) busy_seconds: f64,
    pub(crate) mib_per_second: f64,
    pub(crate) failed: u64,
    pub(crate) dropped: u64,
    pub(crate) malformed: u64,
    pub(crate) backend_watches_left_open: u64,
    pub(crate) failed_upgrades: u64,
    pub(crate) dropped_tunnels: u64,
    pub(crate) echo_mismatches: u64,
    pub(crate) backend: BackendCounters,
    pub(crate) error_examples: Vec<String>,
}

/// `n` idle watches over `protocol` and `--tunnel-connections` WebSocket echo streams for
/// `--duration` (after the warm-up) through a fresh `system`. Fails only when the system does
/// not start; what goes wrong under load is counted.
pub(crate) async fn busy_step(
    env: &Env,
    system: System,
    protocol: Protocol,
    n: usize,
) -> anyhow::Result<BusyStep> {
    let tunnels = env.args.tunnel_connections.max(1);
    let (sut, target) = env.start(system, n + tunnels)?;
    tokio::time::sleep(warmup(&env.args)).await;
    let idle_rss_kib = sut.rss_kib();
    let before = backend_counters(env.backend_admin)?;
    let stats = Arc::new(WatchStats::new()?);
    let tasks = open_watches(&target, protocol, n, env.args.h2_streams, Duration::ZERO, &stats)?;
    wait_established(&stats, n, env.args.open_timeout).await;
    let settle_max = if env.args.smoke {
        Duration::ZERO
    } else {
        env.args.settle_max
    };
    let (watches_rss_kib, _) = settled_rss(&sut, settle_max).await;

    let streams = Tunnels::start(env, &target, Tunnel::WebSocket, tunnels);
    let busy = warmup(&env.args) + env.args.duration;
    let start = Instant::now();
    let mut peak_rss_kib = watches_rss_kib;
    while start.elapsed() < busy {
        peak_rss_kib = peak_rss_kib.max(sut.rss_kib());
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let echoed = streams.stats.echoed.load(Ordering::Relaxed);
    let busy_seconds = start.elapsed().as_secs_f64();
    let tunnel_stats = streams.stats.clone();
    streams.finish().await;
    let (after_rss_kib, _) = settled_rss(&sut, settle_max).await;

    let established = stats.established.load(Ordering::Relaxed);
    let backend_watches_left_open = close_watches(tasks, env.backend_admin).await;
    drop(sut);
    let mut error_examples = stats.examples();
    if let Ok(examples) = tunnel_stats.examples.lock() {
        error_examples.extend(examples.iter().cloned());
    }
    Ok(BusyStep {
        system,
        protocol: protocol.name(),
        watches: n,
        tunnels,
        idle_rss_kib,
        watches_rss_kib,
        peak_rss_kib,
        after_rss_kib,
        busy_seconds,
        mib_per_second: echoed as f64 / busy_seconds.max(f64::EPSILON) / (1024.0 * 1024.0),
        failed: stats.failed.load(Ordering::Relaxed) + (n as u64).saturating_sub(established),
        dropped: stats.dropped.load(Ordering::Relaxed),
        malformed: stats.malformed.load(Ordering::Relaxed),
        backend_watches_left_open,
        failed_upgrades: tunnel_stats.failed_upgrades.load(Ordering::Relaxed),
        dropped_tunnels: tunnel_stats.dropped.load(Ordering::Relaxed),
        echo_mismatches: tunnel_stats.mismatches.load(Ordering::Relaxed),
        backend: backend_delta(env.backend_admin, &before),
        error_examples,
    })
}
