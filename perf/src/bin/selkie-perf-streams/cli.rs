//! The command line of `selkie-perf-streams` and what `--smoke` overrides.

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use selkie_perf::parse_duration;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-streams", about)]
pub(crate) struct Args {
    /// Smoke pass: 50 watches per step, 1 s per timed step, 10 exec setups, no settling wait;
    /// results to `target/perf-smoke/streams-smoke.{md,json}`. Exits non-zero if a system does
    /// not start or any error counter is not 0. Overrides the counts and durations.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Where the results go (default `perf/results`; `target/perf-smoke` with `--smoke`).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// File name of the results, without extension (default `streams`; `streams-smoke`).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Systems to run, in this order (D, N, S0). D has no memory rows (no system in between).
    #[arg(long, value_delimiter = ',', default_value = "D,N,S0")]
    pub(crate) systems: Vec<String>,
    /// Held idle watches per memory step.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    pub(crate) watches: Vec<usize>,
    /// HTTP versions of the memory and fan-through steps.
    #[arg(long, value_delimiter = ',', default_value = "h2,h1")]
    pub(crate) protocols: Vec<String>,
    /// Most streams per HTTP/2 connection (Selkie's pingora and nginx allow 100 and 128; the
    /// backend 250, like kube-apiserver).
    #[arg(long, default_value_t = 100)]
    pub(crate) h2_streams: usize,
    /// Longest wait for a step's watches to be established.
    #[arg(long, default_value = "180s", value_parser = parse_duration)]
    pub(crate) open_timeout: Duration,
    /// Longest wait for the RSS to settle (unchanged within 0.5 % for 2 s) with watches held.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub(crate) settle_max: Duration,
    /// Held watches of the fan-through step.
    #[arg(long, default_value_t = 1000)]
    pub(crate) fan_watches: usize,
    /// Interval between the events of every watch in the fan-through step.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub(crate) fan_interval: Duration,
    /// Measured window of the fan-through and throughput steps (after a 1 s warm-up).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Upgraded connections of the throughput steps, echoing at once.
    #[arg(long, default_value_t = 4)]
    pub(crate) tunnel_connections: usize,
    /// Message (WebSocket) or write (SPDY) size of the throughput steps, bytes.
    #[arg(long, default_value_t = 65_536)]
    pub(crate) message_bytes: usize,
    /// Messages or writes in flight per connection.
    #[arg(long, default_value_t = 4)]
    pub(crate) window: usize,
    /// Exec setups (connection + WebSocket upgrade + one message + close), one after another.
    #[arg(long, default_value_t = 300)]
    pub(crate) exec_setups: usize,
    /// Held idle watches of the busy step (on a fresh system, while `--tunnel-connections`
    /// WebSocket exec streams echo for `--duration`), per count.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    pub(crate) busy_watches: Vec<usize>,
    /// Steps to run: memory, busy (memory with watches held and exec streams echoing), fan,
    /// throughput (WebSocket and SPDY), exec.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,busy,fan,throughput,exec"
    )]
    pub(crate) steps: Vec<String>,
    /// Keep the temporary directory (configurations, nginx's error log, Selkie's stderr).
    #[arg(long)]
    pub(crate) keep_temp: bool,
    /// Where the binaries are (default: beside this one).
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
}

impl Args {
    /// `--smoke`: the small counts and short steps of the smoke pass.
    pub(crate) fn apply_smoke(&mut self) {
        self.watches = vec![50];
        self.busy_watches = vec![50];
        self.fan_watches = 20;
        self.fan_interval = Duration::from_millis(50);
        self.duration = Duration::from_secs(1);
        self.exec_setups = 10;
        self.tunnel_connections = 2;
        self.message_bytes = 16 * 1024;
        self.open_timeout = Duration::from_secs(20);
    }
}
