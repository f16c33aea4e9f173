//! The memory step: a freshly started system's RSS, idle and with idle watches held open, and the
//! open files such a step needs.

use std::{
    collections::VecDeque,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use selkie_perf::report::BackendCounters;
use serde::Serialize;

use crate::{
    measure::{backend_counters, backend_delta},
    systems::{Protocol, Sut, System},
    watches::{close_watches, open_watches, wait_established, WatchStats},
    Env,
};

/// The RSS once it has not moved by more than 0.5 % (or 64 KiB) for 2 s, or after `max`.
pub(crate) async fn settled_rss(sut: &Sut, max: Duration) -> (u64, f64) {
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
pub(crate) struct MemoryStep {
    pub(crate) system: System,
    pub(crate) protocol: &'static str,
    pub(crate) watches: usize,
    pub(crate) connections: usize,
    pub(crate) idle_rss_kib: u64,
    pub(crate) rss_kib: u64,
    pub(crate) kib_per_watch: f64,
    pub(crate) open_seconds: f64,
    pub(crate) settle_seconds: f64,
    pub(crate) established: u64,
    pub(crate) failed: u64,
    pub(crate) dropped: u64,
    pub(crate) malformed: u64,
    pub(crate) backend_watches_left_open: u64,
    pub(crate) backend: BackendCounters,
    pub(crate) error_examples: Vec<String>,
}

/// Open files a memory step needs in the process that needs most: nginx holds a connection to the
/// backend per watch besides the client's connections; over HTTP/1.1 every process in the path
/// holds one per watch.
pub(crate) fn files_needed(system: System, protocol: Protocol, n: usize, h2_streams: usize) -> u64 {
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

pub(crate) async fn memory_step(
    env: &Env,
    system: System,
    protocol: Protocol,
    n: usize,
) -> anyhow::Result<MemoryStep> {
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
