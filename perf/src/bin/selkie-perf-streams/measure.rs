//! What the steps measure with besides their own clients: the backend's counters over its admin
//! port, latency percentiles from a histogram, and the warm-up before a timed window.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use selkie_perf::report::{BackendCounters, Percentiles};

use crate::cli::Args;

/// GET `path` on the backend's plain-HTTP admin port.
fn admin_get(admin: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut tcp = TcpStream::connect_timeout(&admin, Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(tcp, "GET {path} HTTP/1.0\r\nHost: backend\r\n\r\n")?;
    let mut response = String::new();
    tcp.read_to_string(&mut response)?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .with_context(|| format!("the backend's {path} answer has no body"))
}

pub(crate) fn backend_counters(admin: SocketAddr) -> anyhow::Result<BackendCounters> {
    Ok(serde_json::from_str(&admin_get(admin, "/counters")?)?)
}

/// The backend's stream counters (`/stream-counters`), as JSON.
fn stream_counters(admin: SocketAddr) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&admin_get(admin, "/stream-counters")?)?)
}

pub(crate) fn open_backend_watches(admin: SocketAddr) -> u64 {
    stream_counters(admin)
        .ok()
        .and_then(|c| c["watches_open"].as_u64())
        .unwrap_or(u64::MAX)
}

pub(crate) fn percentiles(histogram: &Histogram<u64>) -> Percentiles {
    if histogram.is_empty() {
        return Percentiles::default();
    }
    let at = |q: f64| histogram.value_at_quantile(q) as f64;
    Percentiles {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        p999: at(0.999),
        max: histogram.max() as f64,
        mean: histogram.mean(),
    }
}

pub(crate) fn backend_delta(admin: SocketAddr, before: &BackendCounters) -> BackendCounters {
    let after = backend_counters(admin).unwrap_or_default();
    BackendCounters {
        connections: after.connections.saturating_sub(before.connections),
        handshake_failures: after.handshake_failures.saturating_sub(before.handshake_failures),
        requests: after.requests.saturating_sub(before.requests),
        http1_requests: after.http1_requests.saturating_sub(before.http1_requests),
        http2_requests: after.http2_requests.saturating_sub(before.http2_requests),
        impersonation_mismatches: after
            .impersonation_mismatches
            .saturating_sub(before.impersonation_mismatches),
        mismatch_examples: after
            .mismatch_examples
            .get(before.mismatch_examples.len()..)
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
    }
}

pub(crate) fn warmup(args: &Args) -> Duration {
    if args.smoke {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(1)
    }
}
