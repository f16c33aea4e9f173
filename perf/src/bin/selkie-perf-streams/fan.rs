//! The watch fan-through step: the latency of the backend's events through the system to held
//! watches, and the system's CPU time per event.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Instant,
};

use selkie_perf::report::{BackendCounters, Percentiles};
use serde::Serialize;

use crate::{
    measure::{backend_counters, backend_delta, percentiles, warmup},
    systems::{Protocol, Sut, System, Target},
    watches::{close_watches, open_watches, wait_established, WatchStats},
    Env,
};

/// One fan-through step.
#[derive(Debug, Serialize)]
pub(crate) struct FanStep {
    pub(crate) system: System,
    pub(crate) protocol: &'static str,
    pub(crate) watches: usize,
    interval_ms: f64,
    window_seconds: f64,
    pub(crate) events: u64,
    pub(crate) events_per_second: f64,
    pub(crate) latency_us: Percentiles,
    pub(crate) sut_cpu_us_per_event: Option<f64>,
    pub(crate) failed: u64,
    pub(crate) dropped: u64,
    pub(crate) malformed: u64,
    pub(crate) backend_watches_left_open: u64,
    pub(crate) backend: BackendCounters,
    pub(crate) error_examples: Vec<String>,
}

pub(crate) async fn fan_step(
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
