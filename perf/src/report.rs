//! The JSON the binaries print and read: the load client's report of one step and the backend's
//! counters.

use serde::{Deserialize, Serialize};

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// CPU time one process group used during the measured window.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CpuUse {
    /// Label given on the command line, e.g. `sut` or `backend`.
    pub name: String,
    /// The processes summed.
    pub pids: Vec<u32>,
    /// utime + stime delta over the window, seconds.
    pub cpu_seconds: f64,
    /// `cpu_seconds` ÷ completed requests, microseconds.
    pub us_per_request: f64,
    /// Resident memory at the end of the window, KiB (summed over `pids`).
    pub rss_kib: u64,
}

/// The negotiated TLS parameters of the first connection.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TlsInfo {
    /// Protocol version.
    pub version: String,
    /// Cipher suite.
    pub suite: String,
    /// ALPN protocol.
    pub alpn: String,
}

/// What `selkie-perf-load` prints (one JSON object) after a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadReport {
    /// `open` (fixed rate) or `closed` (as fast as possible).
    pub mode: String,
    /// `h1` or `h2`.
    pub protocol: String,
    /// TCP connections.
    pub connections: usize,
    /// Requests in flight per connection (closed loop over h2); 1 otherwise.
    pub streams_per_connection: usize,
    /// Offered rate (open loop), requests per second; 0 for closed loop.
    pub target_rate: f64,
    /// Length of the measured window, seconds (after the warm-up).
    pub window_seconds: f64,
    /// Requests started in the window.
    pub sent: u64,
    /// Requests answered (any status) in the window.
    pub completed: u64,
    /// Answered with a status outside 200–299.
    pub non_2xx: u64,
    /// Failed: connection errors, resets, timeouts, truncated bodies.
    pub errors: u64,
    /// Requests still unanswered when the run was cut off (counted in `errors` too).
    pub timeouts: u64,
    /// Connections re-established after the previous one closed or failed.
    pub reconnects: u64,
    /// The first few distinct error messages.
    pub error_examples: Vec<String>,
    /// `completed` ÷ `window_seconds`.
    pub achieved_rps: f64,
    /// Response body bytes received in the window.
    pub body_bytes: u64,
    /// Latency of answered requests. Open loop: from the *intended* send time (corrected for
    /// coordinated omission). Closed loop: from the actual send time.
    pub latency_us: Percentiles,
    /// Open loop: how late the client actually sent, relative to the schedule (its own lag).
    pub send_lag_us: Percentiles,
    /// The TLS session of the first connection.
    pub tls: TlsInfo,
    /// CPU of the processes given with `--pid`, and of the load client itself (`load`).
    pub cpu: Vec<CpuUse>,
    /// Watch mode only: the watch and the updates behind its events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchReport>,
}

/// What the load client's watch mode saw (`--mode watch`): one watch held through the system
/// under test while the client updates the watched object directly at the server, at a fixed
/// rate. In its [`LoadReport`], `sent` counts the window's updates, `completed` their events,
/// `latency_us` the time from sending an update to its event's arrival, `non_2xx` updates the
/// server refused, and `errors` failed updates, missing events and unexpected lines.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WatchReport {
    /// The watch was answered 200 and its first event (the object as it was) arrived.
    pub established: bool,
    /// Updates sent in the window.
    pub updates: u64,
    /// Of those, answered 2xx.
    pub updates_ok: u64,
    /// Updates that failed (connection errors, timeouts).
    pub updates_failed: u64,
    /// Events received for the window's updates.
    pub events: u64,
    /// Window updates answered 2xx whose event had not arrived when the drain ended.
    pub missing: u64,
    /// Lines that were not an event of one of this run's updates (or repeated one), and a watch
    /// that ended early.
    pub unexpected: u64,
    /// How long the updates themselves took (sent → answered).
    pub update_latency_us: Percentiles,
}

/// The backend's counters (`GET /counters` on its admin port).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackendCounters {
    /// TLS connections accepted (handshake completed).
    pub connections: u64,
    /// TLS handshakes that failed (for instance no or an untrusted client certificate).
    pub handshake_failures: u64,
    /// Requests served.
    pub requests: u64,
    /// Requests that came over HTTP/1.1.
    pub http1_requests: u64,
    /// Requests that came over HTTP/2.
    pub http2_requests: u64,
    /// Requests whose `Impersonate-*` headers were not exactly the expected ones, or that
    /// carried an `Authorization` header (answered 403).
    pub impersonation_mismatches: u64,
    /// The first few mismatches, described.
    pub mismatch_examples: Vec<String>,
}
