//! The exec-setup step: new TLS connection, WebSocket upgrade, one echoed message and close, one
//! after another; the wall time and the system's CPU time per setup.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use hdrhistogram::Histogram;
use selkie_perf::report::{BackendCounters, Percentiles};
use serde::Serialize;
use tokio_tungstenite::tungstenite::Message;

use crate::{
    measure::{backend_counters, backend_delta, percentiles},
    systems::{Sut, System, Target},
    tunnels::websocket,
    Env,
};

/// The exec-setup step.
#[derive(Debug, Serialize)]
pub(crate) struct ExecStep {
    pub(crate) system: System,
    setups: usize,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) wall_ms: Percentiles,
    pub(crate) sut_cpu_us_per_setup: Option<f64>,
    pub(crate) backend: BackendCounters,
    pub(crate) error_examples: Vec<String>,
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

pub(crate) async fn exec_step(
    env: &Env,
    sut: &Sut,
    target: &Target,
    system: System,
) -> anyhow::Result<ExecStep> {
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
