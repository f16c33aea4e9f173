//! The command line of `selkie-perf-run`: its arguments, the syntax of `--rate-fractions` and
//! what `--smoke` overrides.

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use selkie_perf::parse_duration;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-run", about)]
pub(crate) struct Args {
    /// Where the results go (default `perf/results`; `target/perf-smoke` with `--smoke`).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// File name of the results, without extension (default `side-by-side-first`;
    /// `side-by-side-smoke` with `--smoke`).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Smoke pass (what `make test` runs): every system and protocol, steps of 0.5 s after a
    /// 0.25 s warm-up, no maximum-throughput step: a sweep of two steps at 50 % and 100 % of
    /// `--smoke-rate` and one probe of the p99 search, 4 HTTP/1.1 or 1 HTTP/2 connections, a
    /// bounded request count, no waiting for a quiet machine. Exits non-zero if a system does
    /// not start or a step has no answers, a non-2xx answer, a failed request, a re-established
    /// connection, a backend handshake failure or an impersonation mismatch. Asserts that the
    /// harness runs, never that it is fast. Overrides `--duration`, `--warmup`, the connection
    /// counts, the rates, `--rate-fractions`, `--probes` and `--probe-duration`.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// The base rate of the smoke pass's sweep, requests per second.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) smoke_rate: f64,
    /// Most requests one load step may send, warm-up included (default: the load client's own
    /// bound; with `--smoke` twice the scheduled count).
    #[arg(long)]
    pub(crate) max_requests: Option<u64>,
    /// Systems to run, in this order: D, N, H, S0, SX, SJ-<RS256|ES256>-<tokens>[-nocache] (e.g.
    /// SJ-RS256-100, SJ-ES256-10k, SJ-RS256-1-nocache), SW-hit, SW-miss, SR, and on request the
    /// real kube-apiserver: K-D, K-S0 (GET a ConfigMap; with the watch step), K-D-list,
    /// K-S0-list (list pods) (see perf/README.md).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "D,N,H,S0,SX,SJ-RS256-1,SJ-ES256-1,SJ-RS256-10k,SJ-RS256-1-nocache,SJ-ES256-1-nocache,SW-hit,SW-miss,SR"
    )]
    pub(crate) systems: Vec<String>,
    /// The handshake step (a new TLS connection per request, HTTP/1.1) for D, N, H and S0;
    /// `--no-handshakes` leaves it out.
    #[arg(long)]
    pub(crate) no_handshakes: bool,
    /// Concurrent connections of the handshake step (each one request, then closed).
    #[arg(long, default_value_t = 8)]
    pub(crate) handshake_connections: usize,
    /// SW: how long the TokenReview webhook waits before it answers.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub(crate) webhook_delay: Duration,
    /// SR: how often the configuration file is rewritten while a step runs.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub(crate) swap_interval: Duration,
    /// SR: Selkie's `--watch-interval` (how often it looks at the file).
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub(crate) swap_watch_interval: Duration,
    /// HTTP versions client → system.
    #[arg(long, value_delimiter = ',', default_value = "h1,h2")]
    pub(crate) protocols: Vec<String>,
    /// Measured window of every step.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Warm-up before every step.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) warmup: Duration,
    /// One fixed rate for every HTTP/1.1 row instead of the sweep.
    #[arg(long)]
    pub(crate) rate_h1: Option<f64>,
    /// One fixed rate for every HTTP/2 row instead of the sweep.
    #[arg(long)]
    pub(crate) rate_h2: Option<f64>,
    /// The rate sweep: open-loop steps at these fractions (0 < f ≤ 1, or percentages such as
    /// 25%) of the base rate, the lowest maximum among the proxies of a row's group (see
    /// perf/README.md), for every system.
    #[arg(
        long,
        alias = "rate-fraction",
        value_delimiter = ',',
        default_value = "0.1,0.25,0.5,0.75,0.9",
        value_parser = parse_fraction
    )]
    pub(crate) rate_fractions: Vec<f64>,
    /// The latency bound of the "max rate at p99 < bound" search.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub(crate) p99_bound: Duration,
    /// Probes (open-loop steps) of the bounded search for the highest rate whose p99 stays
    /// below `--p99-bound`, bisecting above the sweep's highest passing step; 0: the sweep only.
    #[arg(long, default_value_t = 4)]
    pub(crate) probes: usize,
    /// Measured window of each probe (after a warm-up of `--warmup`, at most 2 s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) probe_duration: Duration,
    /// K-D and K-S0's watch step: updates of the watched ConfigMap per second.
    #[arg(long, default_value_t = 50.0)]
    pub(crate) watch_rate: f64,
    /// K-D-list and K-S0-list: Pods the runner creates (and the rows list).
    #[arg(long, default_value_t = 50)]
    pub(crate) pods: usize,
    /// HTTP/1.1 connections.
    #[arg(long, default_value_t = 32)]
    pub(crate) h1_connections: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    pub(crate) h2_connections: usize,
    /// Streams per HTTP/2 connection in the closed loop.
    #[arg(long, default_value_t = 16)]
    pub(crate) h2_streams: usize,
    /// Longest wait for a quiet machine before a step.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    pub(crate) quiet_wait: Duration,
    /// Longest total wait for a quiet machine over the whole run; once spent, steps start
    /// after a single 5 s check.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub(crate) quiet_budget: Duration,
    /// "Quiet": the machine's CPU busy share over 5 s below this (0–1, both cores together).
    #[arg(long, default_value_t = 0.15)]
    pub(crate) quiet_busy: f64,
    /// The K rows: the `selkie-cluster` binary that starts etcd + kube-apiserver (default:
    /// beside this one, else `target/debug/selkie-cluster`).
    #[arg(long)]
    pub(crate) cluster_bin: Option<PathBuf>,
    /// Where the binaries are (default: beside this one).
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
    /// Keep nginx's access log and Selkie's audit log in the temporary directory (and keep it)
    /// instead of writing them to /dev/null.
    #[arg(long)]
    pub(crate) keep_logs: bool,
}

/// `--rate-fractions`: a fraction in (0, 1], written `0.25` or `25%`.
fn parse_fraction(text: &str) -> Result<f64, String> {
    let fraction = match text.trim().strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{text:?} is not a fraction such as 0.25 or 25%"))?;
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(fraction)
    } else {
        Err(format!("{text:?} is not in (0, 1]"))
    }
}

impl Args {
    /// `--smoke`: the short steps, small connection counts, two-step sweep and single probe of
    /// the smoke pass, and a bound on every step's requests.
    pub(crate) fn apply_smoke(&mut self) -> anyhow::Result<()> {
        self.duration = Duration::from_millis(500);
        self.warmup = Duration::from_millis(250);
        self.h1_connections = 4;
        self.h2_connections = 1;
        self.handshake_connections = 4;
        self.rate_h1 = None;
        self.rate_h2 = None;
        self.rate_fractions = vec![0.5, 1.0];
        self.probes = 1;
        self.probe_duration = self.duration;
        anyhow::ensure!(
            self.smoke_rate > 0.0 && self.smoke_rate <= 10_000.0,
            "--smoke-rate must be in (0, 10000]"
        );
        let scheduled = self.smoke_rate * (self.duration + self.warmup).as_secs_f64();
        self.max_requests.get_or_insert((scheduled * 2.0).ceil() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::reference_fraction;

    #[test]
    fn fractions_parse_as_numbers_or_percentages() {
        assert_eq!(parse_fraction("0.25"), Ok(0.25));
        assert_eq!(parse_fraction("25%"), Ok(0.25));
        assert_eq!(parse_fraction(" 1 "), Ok(1.0));
        for bad in ["0", "-0.1", "1.5", "150%", "x", "", "NaN"] {
            assert!(parse_fraction(bad).is_err(), "{bad}");
        }
        let args = Args::try_parse_from(["selkie-perf-run"]).unwrap();
        assert_eq!(args.rate_fractions, [0.1, 0.25, 0.5, 0.75, 0.9]);
        assert_eq!(args.p99_bound, Duration::from_millis(5));
        let args = Args::try_parse_from(["selkie-perf-run", "--rate-fractions", "10%,0.5"]).unwrap();
        assert_eq!(args.rate_fractions, [0.1, 0.5]);
        // The former single-fraction flag still works, as a one-step sweep.
        let args = Args::try_parse_from(["selkie-perf-run", "--rate-fraction", "0.5"]).unwrap();
        assert_eq!(args.rate_fractions, [0.5]);
        assert!(Args::try_parse_from(["selkie-perf-run", "--rate-fractions", "0.5,2"]).is_err());
        assert_eq!(reference_fraction(&[0.1, 0.25, 0.5, 0.75, 0.9]), Some(0.5));
        assert_eq!(reference_fraction(&[0.1, 0.4, 0.9]), Some(0.4));
        assert_eq!(reference_fraction(&[]), None);
    }
}
