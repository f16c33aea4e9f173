//! `selkie-perf-run`: the side-by-side run of PERF.md (started by `perf/run`).
//!
//! Generates a PKI into a temporary directory, starts `selkie-perf-backend` (and, for the SJ and
//! SW rows, `selkie-perf-idp`: OIDC discovery, JWKS and a TokenReview webhook) and then, one after
//! another, the systems under test: D (direct to the backend), N (nginx) and H (haproxy) as TLS
//! reverse proxies adding a fixed `Impersonate-User`, and Selkie with a static identity (S0),
//! client certificates (SX), bearer JWTs (SJ-RS256-1, SJ-ES256-1, SJ-RS256-10k, ...; the runner
//! mints the tokens; `-nocache` rows turn the authenticator's result cache off), a TokenReview
//! webhook (SW-hit, SW-miss) and S0 while its configuration file is rewritten 10 times a second
//! (SR); on request, the real kube-apiserver directly (K-D, K-D-list) and behind Selkie (K-S0,
//! K-S0-list), started with the e2e harness's `selkie-cluster`: a ConfigMap GET, or a list of the
//! Pods the runner created. The systems under test run on core 1 (`taskset -c 1`), the load
//! client, the backend and the identity provider on core 0; all are started first and stay up,
//! idle while another is measured.
//!
//! Per HTTP version: a closed-loop maximum-throughput step for every system; the rate sweep, an
//! open-loop step for every system at each of `--rate-fractions` of its group's base rate (the
//! lowest maximum among the group's proxies, so every system can sustain every step; one rate
//! instead with `--rate-h1/--rate-h2`); per system, up to `--probes` open-loop probes bisecting
//! for the highest rate whose p99 stays below `--p99-bound`; for K-D and K-S0 the watch step (a
//! ConfigMap watch through the system while the ConfigMap is updated directly). Then a handshake
//! step (a new TLS connection per request, HTTP/1.1) for D, N, H and S0. Before every step the
//! runner waits (bounded) for the machine to be quiet and records its load. The tables go to
//! `<out>/<name>.md` and every number to `<out>/<name>.json`.

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use clap::Parser;
use nix::sys::signal::Signal;
use ring::{
    rand::SystemRandom,
    signature::{
        EcdsaKeyPair, KeyPair as _, RsaKeyPair, RsaPublicKeyComponents, ECDSA_P256_SHA256_FIXED_SIGNING,
        RSA_PKCS1_SHA256,
    },
};
use rustls_pki_types::{pem::PemObject as _, PrivatePkcs8KeyDer};
use selkie_perf::{
    parse_duration,
    pki::PerfPki,
    process::{free_port, shell, start_nginx, stop, wait_for_port, Machine},
    procstat::{load_average, process_tree, processes_named},
    report::{BackendCounters, LoadReport},
};
use serde::{Deserialize, Serialize};

/// The impersonated user every system must produce.
const USER: &str = "perf-user";
/// Its groups, in order.
const GROUPS: [&str; 2] = ["perf-devs", "perf-ops"];
/// The request path: a ConfigMap GET, as kubectl would send it.
const PATH: &str = "/api/v1/namespaces/default/configmaps/selkie-perf";
/// K-D-list and K-S0-list: the pods the runner created, listed.
const PODS_PATH: &str = "/api/v1/namespaces/default/pods";
/// The ConfigMap of the watch step (updated directly at kube-apiserver while it is watched).
const WATCH_OBJECT: &str = "/api/v1/namespaces/default/configmaps/selkie-perf-watch";
/// The watch step's watch, as `kubectl get --watch` sends it for one object.
const WATCH_PATH: &str =
    "/api/v1/namespaces/default/configmaps?watch=1&fieldSelector=metadata.name%3Dselkie-perf-watch";
/// A sweep or probe step met the latency bound only if it answered at least this share of the
/// offered rate.
const ACHIEVED_SHARE: f64 = 0.98;
/// A probe's warm-up at most (the system is warm from the sweep).
const PROBE_WARMUP: Duration = Duration::from_secs(2);
/// Processes that mean someone else is busy on the machine.
const BUSY: [&str; 3] = ["rustc", "kube-apiserver", "cc1"];

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-perf-run", about)]
struct Args {
    /// Where the results go (default `perf/results`; `target/perf-smoke` with `--smoke`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// File name of the results, without extension (default `side-by-side-first`;
    /// `side-by-side-smoke` with `--smoke`).
    #[arg(long)]
    name: Option<String>,
    /// Smoke pass (what `make test` runs): every system and protocol, steps of 0.5 s after a
    /// 0.25 s warm-up, no maximum-throughput step: a sweep of two steps at 50 % and 100 % of
    /// `--smoke-rate` and one probe of the p99 search, 4 HTTP/1.1 or 1 HTTP/2 connections, a
    /// bounded request count, no waiting for a quiet machine. Exits non-zero if a system does
    /// not start or a step has no answers, a non-2xx answer, a failed request, a re-established
    /// connection, a backend handshake failure or an impersonation mismatch. Asserts that the
    /// harness runs, never that it is fast. Overrides `--duration`, `--warmup`, the connection
    /// counts, the rates, `--rate-fractions`, `--probes` and `--probe-duration`.
    #[arg(long)]
    smoke: bool,
    /// The base rate of the smoke pass's sweep, requests per second.
    #[arg(long, default_value_t = 100.0)]
    smoke_rate: f64,
    /// Most requests one load step may send, warm-up included (default: the load client's own
    /// bound; with `--smoke` twice the scheduled count).
    #[arg(long)]
    max_requests: Option<u64>,
    /// Systems to run, in this order: D, N, H, S0, SX, SJ-<RS256|ES256>-<tokens>[-nocache] (e.g.
    /// SJ-RS256-100, SJ-ES256-10k, SJ-RS256-1-nocache), SW-hit, SW-miss, SR, and on request the
    /// real kube-apiserver: K-D, K-S0 (GET a ConfigMap; with the watch step), K-D-list,
    /// K-S0-list (list pods) (see perf/README.md).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "D,N,H,S0,SX,SJ-RS256-1,SJ-ES256-1,SJ-RS256-10k,SJ-RS256-1-nocache,SJ-ES256-1-nocache,SW-hit,SW-miss,SR"
    )]
    systems: Vec<String>,
    /// The handshake step (a new TLS connection per request, HTTP/1.1) for D, N, H and S0;
    /// `--no-handshakes` leaves it out.
    #[arg(long)]
    no_handshakes: bool,
    /// Concurrent connections of the handshake step (each one request, then closed).
    #[arg(long, default_value_t = 8)]
    handshake_connections: usize,
    /// SW: how long the TokenReview webhook waits before it answers.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    webhook_delay: Duration,
    /// SR: how often the configuration file is rewritten while a step runs.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    swap_interval: Duration,
    /// SR: Selkie's `--watch-interval` (how often it looks at the file).
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    swap_watch_interval: Duration,
    /// HTTP versions client → system.
    #[arg(long, value_delimiter = ',', default_value = "h1,h2")]
    protocols: Vec<String>,
    /// Measured window of every step.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before every step.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    warmup: Duration,
    /// One fixed rate for every HTTP/1.1 row instead of the sweep.
    #[arg(long)]
    rate_h1: Option<f64>,
    /// One fixed rate for every HTTP/2 row instead of the sweep.
    #[arg(long)]
    rate_h2: Option<f64>,
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
    rate_fractions: Vec<f64>,
    /// The latency bound of the "max rate at p99 < bound" search.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    p99_bound: Duration,
    /// Probes (open-loop steps) of the bounded search for the highest rate whose p99 stays
    /// below `--p99-bound`, bisecting above the sweep's highest passing step; 0: the sweep only.
    #[arg(long, default_value_t = 4)]
    probes: usize,
    /// Measured window of each probe (after a warm-up of `--warmup`, at most 2 s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    probe_duration: Duration,
    /// K-D and K-S0's watch step: updates of the watched ConfigMap per second.
    #[arg(long, default_value_t = 50.0)]
    watch_rate: f64,
    /// K-D-list and K-S0-list: Pods the runner creates (and the rows list).
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// HTTP/1.1 connections.
    #[arg(long, default_value_t = 32)]
    h1_connections: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    h2_connections: usize,
    /// Streams per HTTP/2 connection in the closed loop.
    #[arg(long, default_value_t = 16)]
    h2_streams: usize,
    /// Longest wait for a quiet machine before a step.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    quiet_wait: Duration,
    /// Longest total wait for a quiet machine over the whole run; once spent, steps start
    /// after a single 5 s check.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    quiet_budget: Duration,
    /// "Quiet": the machine's CPU busy share over 5 s below this (0–1, both cores together).
    #[arg(long, default_value_t = 0.15)]
    quiet_busy: f64,
    /// The K rows: the `selkie-cluster` binary that starts etcd + kube-apiserver (default:
    /// beside this one, else `target/debug/selkie-cluster`).
    #[arg(long)]
    cluster_bin: Option<PathBuf>,
    /// Where the binaries are (default: beside this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Keep nginx's access log and Selkie's audit log in the temporary directory (and keep it)
    /// instead of writing them to /dev/null.
    #[arg(long)]
    keep_logs: bool,
}

/// The JWT signature algorithm of an SJ row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JwtAlg {
    /// RSA PKCS#1 v1.5 with SHA-256, 2048-bit key.
    Rs256,
    /// ECDSA P-256 with SHA-256.
    Es256,
}

impl JwtAlg {
    fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Es256 => "ES256",
        }
    }
}

/// One system under test.
#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    /// Straight to the backend.
    D,
    /// nginx.
    N,
    /// haproxy.
    H,
    /// Selkie, static identity.
    S0,
    /// Selkie, client certificates.
    SX,
    /// Selkie, bearer JWTs.
    SJ {
        /// The signature algorithm.
        alg: JwtAlg,
        /// How many distinct tokens the client rotates over.
        tokens: u32,
        /// Selkie's result cache on (`false`: `cache: {enabled: false}`, every token verified).
        cache: bool,
    },
    /// Selkie, TokenReview webhook: `miss` = a token never seen before on every request.
    SW {
        /// Every request a new token (cache miss) instead of one token (cache hit).
        miss: bool,
    },
    /// S0 while its configuration file is rewritten 10 times a second.
    SR,
    /// The real kube-apiserver, directly (admin certificate + `Impersonate-*`).
    KD {
        /// List the pods instead of GETting the ConfigMap.
        list: bool,
    },
    /// Selkie (static identity) in front of the real kube-apiserver.
    KS0 {
        /// List the pods instead of GETting the ConfigMap.
        list: bool,
    },
}

impl System {
    fn parse(text: &str) -> anyhow::Result<Self> {
        let known = "D, N, H, S0, SX, SJ-<RS256|ES256>-<count, e.g. 1, 100, 10k>[-nocache], SW-hit, \
                     SW-miss, SR, K-D, K-S0, K-D-list, K-S0-list";
        Ok(match text {
            "D" => Self::D,
            "N" => Self::N,
            "H" => Self::H,
            "S0" => Self::S0,
            "SX" => Self::SX,
            "SW-hit" => Self::SW { miss: false },
            "SW-miss" => Self::SW { miss: true },
            "SR" => Self::SR,
            "K-D" => Self::KD { list: false },
            "K-S0" => Self::KS0 { list: false },
            "K-D-list" => Self::KD { list: true },
            "K-S0-list" => Self::KS0 { list: true },
            _ => {
                let Some(rest) = text.strip_prefix("SJ-") else {
                    anyhow::bail!("unknown system {text:?} ({known})");
                };
                let (rest, cache) = match rest.strip_suffix("-nocache") {
                    Some(rest) => (rest, false),
                    None => (rest, true),
                };
                let (alg, count) = rest
                    .split_once('-')
                    .with_context(|| format!("unknown system {text:?} ({known})"))?;
                let alg = match alg {
                    "RS256" => JwtAlg::Rs256,
                    "ES256" => JwtAlg::Es256,
                    _ => anyhow::bail!("unknown JWT algorithm in {text:?} ({known})"),
                };
                let tokens = match count.strip_suffix('k') {
                    Some(thousands) => thousands.parse::<u32>().map(|k| k.saturating_mul(1000)),
                    None => count.parse::<u32>(),
                }
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .with_context(|| format!("{text:?}: the token count must be 1 to 1000k"))?;
                Self::SJ { alg, tokens, cache }
            }
        })
    }

    /// The row id, as given on the command line.
    fn id(self) -> String {
        match self {
            Self::D => "D".into(),
            Self::N => "N".into(),
            Self::H => "H".into(),
            Self::S0 => "S0".into(),
            Self::SX => "SX".into(),
            Self::SJ { alg, tokens, cache } => {
                let count = if tokens >= 1000 && tokens % 1000 == 0 {
                    format!("{}k", tokens / 1000)
                } else {
                    tokens.to_string()
                };
                let suffix = if cache { "" } else { "-nocache" };
                format!("SJ-{}-{count}{suffix}", alg.name())
            }
            Self::SW { miss: false } => "SW-hit".into(),
            Self::SW { miss: true } => "SW-miss".into(),
            Self::SR => "SR".into(),
            Self::KD { list: false } => "K-D".into(),
            Self::KS0 { list: false } => "K-S0".into(),
            Self::KD { list: true } => "K-D-list".into(),
            Self::KS0 { list: true } => "K-S0-list".into(),
        }
    }

    fn describe(self) -> String {
        match self {
            Self::D => "direct: client → backend".into(),
            Self::N => "nginx, TLS reverse proxy adding Impersonate-User/-Group".into(),
            Self::H => "haproxy, TLS reverse proxy adding Impersonate-User/-Group".into(),
            Self::S0 => "Selkie, static identity".into(),
            Self::SX => "Selkie, client certificate → identity".into(),
            Self::SJ { alg, tokens, cache } => {
                let tokens = match tokens {
                    1 => "1 token".to_string(),
                    n => format!("{n} tokens in turn"),
                };
                let cache = if cache { "" } else { ", cache off" };
                format!("Selkie, bearer JWT {}, {tokens}{cache}", alg.name())
            }
            Self::SW { miss: false } => "Selkie, TokenReview webhook, 1 token (cache hit)".into(),
            Self::SW { miss: true } => "Selkie, TokenReview webhook, a new token every request (miss)".into(),
            Self::SR => "Selkie, static identity, configuration rewritten 10×/s".into(),
            Self::KD { list: false } => {
                "direct: client → kube-apiserver (admin certificate + Impersonate-*), GET a ConfigMap".into()
            }
            Self::KS0 { list: false } => {
                "Selkie, static identity → kube-apiserver (admin certificate), GET a ConfigMap".into()
            }
            Self::KD { list: true } => {
                "direct: client → kube-apiserver (admin certificate + Impersonate-*), list pods".into()
            }
            Self::KS0 { list: true } => {
                "Selkie, static identity → kube-apiserver (admin certificate), list pods".into()
            }
        }
    }

    fn is_selkie(self) -> bool {
        !matches!(self, Self::D | Self::N | Self::H | Self::KD { .. })
    }

    /// Its maximum throughput is bounded by a wait (the webhook's answer), not by CPU.
    fn latency_bound(self) -> bool {
        self == Self::SW { miss: true }
    }

    /// In front of the real kube-apiserver rather than `selkie-perf-backend`.
    fn is_kube(self) -> bool {
        matches!(self, Self::KD { .. } | Self::KS0 { .. })
    }

    /// Needs the identity provider (JWKS, TokenReview).
    fn uses_idp(self) -> bool {
        matches!(self, Self::SJ { .. } | Self::SW { .. })
    }

    /// The row this one's added latency is measured against, and whose rate group it is in.
    fn direct(self) -> Self {
        match self {
            Self::KD { list } | Self::KS0 { list } => Self::KD { list },
            _ => Self::D,
        }
    }

    /// The request path of its load steps.
    fn path(self) -> &'static str {
        match self {
            Self::KD { list: true } | Self::KS0 { list: true } => PODS_PATH,
            _ => PATH,
        }
    }

    /// Part of the handshake step (new TLS connection per request).
    fn in_handshake_step(self) -> bool {
        matches!(self, Self::D | Self::N | Self::H | Self::S0)
    }

    /// Part of the watch step (a ConfigMap watch while the ConfigMap is updated).
    fn in_watch_step(self) -> bool {
        matches!(self, Self::KD { list: false } | Self::KS0 { list: false })
    }
}

/// Printed as its row id.
impl std::fmt::Debug for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id())
    }
}

impl Serialize for System {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.id())
    }
}

/// The hot swaps of one SR step.
#[derive(Debug, Clone, Default, Serialize)]
struct HotSwap {
    /// Configuration files written (rename over the old one) during the step.
    swaps_written: u64,
    /// "configuration reloaded" lines Selkie logged during the step.
    reloads_logged: u64,
}

/// A step's result.
#[derive(Debug, Serialize)]
struct Step {
    system: System,
    protocol: String,
    /// `max` (closed loop), `fixed-rate` (a sweep step, or the rate given), `probe` (the p99
    /// search), `handshake` or `watch`.
    kind: &'static str,
    /// A sweep step: its fraction of the base rate of the system's group.
    #[serde(skip_serializing_if = "Option::is_none")]
    fraction: Option<f64>,
    load_average_1m_at_start: f64,
    cpu_busy_at_start: f64,
    waited_for_quiet_s: f64,
    quiet: bool,
    /// Compilers or kube-apiservers seen (polled every second) while the step ran.
    busy_during_step: Vec<String>,
    load: LoadReport,
    backend: BackendCounters,
    /// SJ/SW: what the identity provider served during the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    idp: Option<IdpCounters>,
    /// SR: swaps written and reloads seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    hot_swap: Option<HotSwap>,
    command: String,
}

/// The identity provider's counters (`selkie-perf-idp`, `GET /counters`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct IdpCounters {
    discovery: u64,
    jwks: u64,
    reviews: u64,
    refused_reviews: u64,
    bad_requests: u64,
}

impl IdpCounters {
    fn minus(&self, before: &Self) -> Self {
        Self {
            discovery: self.discovery.saturating_sub(before.discovery),
            jwks: self.jwks.saturating_sub(before.jwks),
            reviews: self.reviews.saturating_sub(before.reviews),
            refused_reviews: self.refused_reviews.saturating_sub(before.refused_reviews),
            bad_requests: self.bad_requests.saturating_sub(before.bad_requests),
        }
    }
}

/// Everything recorded.
#[derive(Debug, Serialize)]
struct Results {
    date_utc: String,
    machine: Machine,
    settings: Settings,
    skipped: Vec<String>,
    /// The rate every sweep's fractions apply to, per protocol and group.
    sweep_bases: Vec<SweepBase>,
    /// Per system and protocol: the highest rate found with p99 below the bound.
    bounded: Vec<BoundedMax>,
    steps: Vec<Step>,
}

/// The base rate of one group's sweep: the rows measured against one direct row (D, K-D,
/// K-D-list), or a latency-bound row (SW-miss) whose own maximum is lower.
#[derive(Debug, Clone, Serialize)]
struct SweepBase {
    protocol: String,
    /// The direct row of the group, or the latency-bound row.
    group: String,
    /// Requests per second the fractions apply to.
    base_rate: f64,
    /// How it was chosen.
    rule: String,
    /// The group's direct row's maximum (closed loop), when measured.
    direct_max: Option<f64>,
    /// A fixed rate given on the command line (`--rate-h1`/`--rate-h2`): one step at the base
    /// rate instead of the sweep.
    given: bool,
}

/// The result of the search for the highest offered rate with p99 below `--p99-bound`.
#[derive(Debug, Clone, Serialize)]
struct BoundedMax {
    system: System,
    protocol: String,
    /// The highest rate tried that met the bound (answered ≥ 98 % of the offered rate, no error,
    /// p99 below the bound) with every lower rate tried meeting it too; `None`: even the lowest
    /// rate tried missed it.
    rate: Option<f64>,
    /// The lowest rate tried that missed the bound; `None`: none did (the result is a lower
    /// bound: the search stopped at its probe count or the closed-loop maximum).
    lowest_missing: Option<f64>,
    /// The closed-loop maximum, the search's upper end when no rate tried missed the bound.
    ceiling: Option<f64>,
    /// Probe steps run.
    probes: usize,
    /// Every rate tried (sweep and probes) and whether it met the bound.
    tried: Vec<(f64, bool)>,
}

#[derive(Debug, Serialize)]
struct Settings {
    duration_s: f64,
    warmup_s: f64,
    h1_connections: usize,
    h2_connections: usize,
    h2_streams: usize,
    handshake_connections: usize,
    swap_interval_ms: u128,
    swap_watch_interval_ms: u128,
    webhook_delay_ms: u128,
    /// The sweep's fractions of the base rates (`sweep_bases`).
    rate_fractions: Vec<f64>,
    p99_bound_us: f64,
    probes: usize,
    probe_duration_s: f64,
    probe_warmup_s: f64,
    watch_rate: f64,
    pods: usize,
    path: &'static str,
    response_body_bytes: usize,
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

/// A rate rounded to three significant digits (at least 1 request a second), so that the
/// results show rates such as 2,430 rather than 2,431.7.
fn round_rate(rate: f64) -> f64 {
    if !rate.is_finite() || rate <= 1.0 {
        return 1.0;
    }
    let scale = 10f64.powi(rate.log10().floor() as i32 - 2).max(1.0);
    (rate / scale).round() * scale
}

/// Whether a fixed-rate or probe step met the latency bound: answers at (almost) the offered
/// rate, no error, p99 below `bound_us`.
fn meets_bound(load: &LoadReport, bound_us: f64) -> bool {
    load.target_rate > 0.0
        && load.completed > 0
        && load.achieved_rps >= ACHIEVED_SHARE * load.target_rate
        && load.errors == 0
        && load.non_2xx == 0
        && load.latency_us.p99 < bound_us
}

/// What the rates tried so far say about the highest rate under the bound.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bracket {
    /// The highest rate tried that met the bound, below every rate that missed it.
    below: Option<f64>,
    /// Where the search's upper end is.
    above: f64,
    /// `above` is a rate tried that missed the bound (not the closed-loop maximum, or twice
    /// `below` when there is none).
    above_missed: bool,
}

/// The bracket of `tried` (rate, met): the highest passing rate below the lowest missing one,
/// and that missing rate; when none missed, the closed-loop `ceiling` if it is above, else twice
/// the passing rate. `None` when nothing was tried.
fn bracket(tried: &[(f64, bool)], ceiling: Option<f64>) -> Option<Bracket> {
    let lowest_missing = tried
        .iter()
        .filter(|(_, met)| !met)
        .map(|(rate, _)| *rate)
        .reduce(f64::min);
    let below = tried
        .iter()
        .filter(|(rate, met)| *met && lowest_missing.is_none_or(|missing| *rate < missing))
        .map(|(rate, _)| *rate)
        .reduce(f64::max);
    match (below, lowest_missing) {
        (_, Some(missing)) => Some(Bracket {
            below,
            above: missing,
            above_missed: true,
        }),
        (Some(passing), None) => Some(Bracket {
            below,
            above: ceiling
                .filter(|ceiling| *ceiling > passing * 1.02)
                .unwrap_or(passing * 2.0),
            above_missed: false,
        }),
        (None, None) => None,
    }
}

/// The next probe of the bisection: halfway between the bracket's ends, rounded; `None` once the
/// ends are within 2 % of each other (or rounding would repeat an end).
fn next_probe(bracket: &Bracket) -> Option<f64> {
    let low = bracket.below.unwrap_or(0.0);
    if bracket.above - low <= 0.02 * bracket.above {
        return None;
    }
    let probe = round_rate((low + bracket.above) / 2.0);
    (probe > low && probe < bracket.above).then_some(probe)
}

/// The sweep's base rate of every group among `systems` for one protocol: `given` (one fixed
/// rate), else `smoke` (the smoke pass's rate), else the lowest closed-loop maximum among the
/// group's proxies (`maxima`; the direct row's own when the group has no proxy); a latency-bound
/// row gets its own maximum where that is lower. Groups without a usable base are left out.
fn sweep_bases(
    protocol: &str,
    systems: &[System],
    maxima: &[(System, f64)],
    given: Option<f64>,
    smoke: Option<f64>,
) -> Vec<SweepBase> {
    let max_of = |system: System| {
        maxima
            .iter()
            .find(|(s, _)| *s == system)
            .map(|(_, max)| *max)
            .filter(|max| *max > 0.0)
    };
    let mut bases = Vec::new();
    let mut groups: Vec<System> = Vec::new();
    for system in systems {
        if !groups.contains(&system.direct()) {
            groups.push(system.direct());
        }
    }
    for group in groups {
        let members: Vec<System> = systems.iter().copied().filter(|s| s.direct() == group).collect();
        let lowest_proxy = members
            .iter()
            .filter(|s| **s != group && !s.latency_bound())
            .filter_map(|s| max_of(*s).map(|max| (*s, max)))
            .reduce(|a, b| if b.1 < a.1 { b } else { a });
        let (base_rate, rule) = match (given, smoke, lowest_proxy, max_of(group)) {
            (Some(rate), _, _, _) => (rate, format!("--rate-{protocol}")),
            (None, Some(rate), _, _) => (rate, "--smoke-rate".to_string()),
            (None, None, Some((proxy, max)), _) => (
                round_rate(max),
                format!("the lowest maximum among the proxies: {proxy:?}'s {max:.0} req/s"),
            ),
            (None, None, None, Some(max)) => (
                round_rate(max),
                format!("{group:?}'s maximum (no proxy measured)"),
            ),
            (None, None, None, None) => continue,
        };
        let base = SweepBase {
            protocol: protocol.to_string(),
            group: group.id(),
            base_rate,
            rule,
            direct_max: max_of(group),
            given: given.is_some(),
        };
        for bound in members.iter().filter(|s| s.latency_bound()) {
            if let Some(own) =
                max_of(*bound).filter(|own| *own < base_rate && given.is_none() && smoke.is_none())
            {
                bases.push(SweepBase {
                    group: bound.id(),
                    base_rate: round_rate(own),
                    rule: format!(
                        "its own maximum, {own:.0} req/s (bounded by the webhook's latency, not by CPU)"
                    ),
                    ..base.clone()
                });
            }
        }
        bases.push(base);
    }
    bases
}

/// The base of `system`'s sweep: its own (a latency-bound row), else its group's.
fn base_of<'a>(bases: &'a [SweepBase], protocol: &str, system: System) -> Option<&'a SweepBase> {
    let on = |group: String| {
        bases
            .iter()
            .find(move |b| b.protocol == protocol && b.group == group)
    };
    on(system.id()).or_else(|| on(system.direct().id()))
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

/// `(user + nice + system + irq + softirq + steal, total)` jiffies of all CPUs.
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    (busy, busy + get(3) + get(4))
}

/// The machine's CPU busy share over the next `over`.
fn cpu_busy(over: Duration) -> f64 {
    let (busy0, total0) = cpu_jiffies();
    std::thread::sleep(over);
    let (busy1, total1) = cpu_jiffies();
    if total1 > total0 {
        (busy1 - busy0) as f64 / (total1 - total0) as f64
    } else {
        0.0
    }
}

/// Compilers and kube-apiservers running, except `ignore` (the K rows' own cluster).
fn busy_processes(ignore: &[u32]) -> Vec<(u32, String)> {
    processes_named(&BUSY)
        .into_iter()
        .filter(|(pid, _)| !ignore.contains(pid))
        .collect()
}

/// Waits (bounded) until no compiler or kube-apiserver runs and the CPUs are nearly idle.
/// Returns (load average at the end, busy share, seconds waited, whether it got quiet).
fn wait_for_quiet(args: &Args, budget: &mut Duration, ignore: &[u32]) -> (f64, f64, f64, bool) {
    let start = Instant::now();
    let limit = args.quiet_wait.min(*budget);
    loop {
        let busy_procs = busy_processes(ignore);
        let busy = cpu_busy(Duration::from_secs(5));
        let load = load_average().map(|l| l[0]).unwrap_or(f64::NAN);
        let quiet = busy_procs.is_empty() && busy < args.quiet_busy;
        let waited = start.elapsed();
        if quiet || waited >= limit {
            *budget = budget.saturating_sub(waited);
            if !quiet {
                eprintln!(
                    "  machine not quiet after {:.0} s (busy {:.0} %, {:?}); measuring anyway",
                    waited.as_secs_f64(),
                    busy * 100.0,
                    busy_procs
                );
            }
            return (load, busy, waited.as_secs_f64(), quiet);
        }
        eprintln!(
            "  waiting for a quiet machine: busy {:.0} %, load {load:.2}, running {:?}",
            busy * 100.0,
            busy_procs
                .iter()
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_secs(10));
    }
}

/// Watches, while a step runs, for other work starting on the machine.
struct Interference {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Interference {
    fn watch(ignore: Vec<u32>) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut seen: Vec<String> = Vec::new();
            loop {
                for (_, name) in busy_processes(&ignore) {
                    if !seen.contains(&name) {
                        seen.push(name);
                    }
                }
                match stopped.recv_timeout(Duration::from_secs(1)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return seen,
                }
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

/// How the load client reaches one system.
struct Route {
    /// `https://HOST:PORT`; the step adds the path.
    base: String,
    extra: Vec<String>,
    sut: Option<u32>,
    /// SW-miss: every step sends tokens `<prefix><step>-<n>` that were never sent before.
    unique_bearer: Option<String>,
    /// The CA of the server the client talks to, when it is not the perf PKI's (K-D).
    ca: Option<PathBuf>,
}

/// SR: what the swapper rewrites and where Selkie's reload lines are counted.
struct Swappable {
    path: PathBuf,
    text: String,
    reloads: Arc<AtomicU64>,
}

/// A running system under test.
struct Running {
    child: Option<Child>,
    stop_signal: Signal,
    route: Route,
    /// SR: the `grep` that counts reload lines on Selkie's stdout.
    helper: Option<Child>,
    swappable: Option<Swappable>,
}

impl Running {
    /// nginx or haproxy listening on `port`: no extra client arguments, stopped with SIGTERM.
    fn proxy(child: Child, port: u16) -> Self {
        let sut = Some(child.id());
        Self {
            child: Some(child),
            stop_signal: Signal::SIGTERM,
            route: Route {
                base: format!("https://127.0.0.1:{port}"),
                extra: Vec::new(),
                sut,
                unique_bearer: None,
                ca: None,
            },
            helper: None,
            swappable: None,
        }
    }

    /// A direct row (no system in between): the client itself presents `cert`/`key` and the
    /// fixed `Impersonate-*` headers to `base` (trusting `ca` when given, else the perf CA).
    fn direct(base: String, cert: &Path, key: &Path, ca: Option<PathBuf>) -> Self {
        let mut extra = vec![
            "--cert".to_string(),
            cert.display().to_string(),
            "--key".to_string(),
            key.display().to_string(),
            "--header".to_string(),
            format!("Impersonate-User: {USER}"),
        ];
        for group in GROUPS {
            extra.extend(["--header".to_string(), format!("Impersonate-Group: {group}")]);
        }
        Self {
            child: None,
            stop_signal: Signal::SIGTERM,
            route: Route {
                base,
                extra,
                sut: None,
                unique_bearer: None,
                ca,
            },
            helper: None,
            swappable: None,
        }
    }
}

impl Drop for Running {
    /// A step that failed must not leave the system under test running.
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = stop(child, self.stop_signal, "the system under test");
        }
        if let Some(helper) = self.helper.take() {
            let _ = stop(helper, Signal::SIGTERM, "the reload counter");
        }
    }
}

/// The keys the runner mints JWTs with; the identity provider serves their public halves.
struct JwtKeys {
    rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
    rng: SystemRandom,
}

/// Audience of every minted token and of Selkie's JWT authenticators.
const AUDIENCE: &str = "selkie-perf";

impl JwtKeys {
    /// A fresh 2048-bit RSA key (from `openssl genpkey`: ring cannot generate RSA keys) and a
    /// fresh P-256 key; writes their JWKS to `dir/jwks.json`.
    fn generate(dir: &Path) -> anyhow::Result<(Self, PathBuf)> {
        let rsa_path = dir.join("jwt-rs256.key");
        let status = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&rsa_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running openssl genpkey (apt-get install -y openssl)")?;
        anyhow::ensure!(status.success(), "openssl genpkey failed ({status})");
        let der = PrivatePkcs8KeyDer::from_pem_file(&rsa_path)
            .with_context(|| format!("reading {}", rsa_path.display()))?;
        let rsa = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|e| anyhow::anyhow!("the RSA key: {e}"))?;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| anyhow::anyhow!("generating a P-256 key failed"))?;
        let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| anyhow::anyhow!("the P-256 key: {e}"))?;
        let public = RsaPublicKeyComponents::<Vec<u8>>::from(rsa.public());
        let point = ec.public_key().as_ref();
        anyhow::ensure!(point.len() == 65, "unexpected P-256 public key encoding");
        let jwks = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "perf-rs256", "use": "sig", "alg": "RS256",
             "n": B64URL.encode(&public.n), "e": B64URL.encode(&public.e)},
            {"kty": "EC", "crv": "P-256", "kid": "perf-es256", "use": "sig", "alg": "ES256",
             "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..65])},
        ]});
        let jwks_path = dir.join("jwks.json");
        std::fs::write(&jwks_path, jwks.to_string())?;
        Ok((Self { rsa, ec, rng }, jwks_path))
    }

    /// A token from `issuer` for [`USER`] in [`GROUPS`], valid for two hours; `jti` makes each
    /// one distinct.
    fn token(&self, alg: JwtAlg, issuer: &str, jti: u32) -> anyhow::Result<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let kid = match alg {
            JwtAlg::Rs256 => "perf-rs256",
            JwtAlg::Es256 => "perf-es256",
        };
        let header = serde_json::json!({"alg": alg.name(), "kid": kid, "typ": "JWT"});
        let claims = serde_json::json!({
            "iss": issuer, "aud": AUDIENCE, "sub": format!("perf-{jti}"),
            "username": USER, "groups": GROUPS,
            "iat": now, "nbf": now, "exp": now + 7200, "jti": jti.to_string(),
        });
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let signature = match alg {
            JwtAlg::Rs256 => {
                let mut signature = vec![0; self.rsa.public().modulus_len()];
                self.rsa
                    .sign(&RSA_PKCS1_SHA256, &self.rng, signed.as_bytes(), &mut signature)
                    .map_err(|_| anyhow::anyhow!("RS256 signing failed"))?;
                signature
            }
            JwtAlg::Es256 => self
                .ec
                .sign(&self.rng, signed.as_bytes())
                .map_err(|_| anyhow::anyhow!("ES256 signing failed"))?
                .as_ref()
                .to_vec(),
        };
        Ok(format!("{signed}.{}", B64URL.encode(signature)))
    }
}

/// The running `selkie-perf-idp` (OIDC discovery, JWKS, TokenReview).
struct Idp {
    issuer: String,
    admin: SocketAddr,
    pid: u32,
    keys: JwtKeys,
}

/// The real kube-apiserver (and etcd) of the K rows, started with `selkie-cluster`.
struct Kube {
    /// `https://127.0.0.1:PORT`.
    server: String,
    /// Its serving CA.
    ca: PathBuf,
    /// The admin (`system:masters`) client certificate and key.
    admin_cert: PathBuf,
    admin_key: PathBuf,
    /// The `selkie-cluster run` process; etcd and kube-apiserver are its children.
    cluster_pid: u32,
}

impl Kube {
    /// Starts the cluster on core 0 (`selkie-cluster --dir DIR up`), reads its admin kubeconfig,
    /// creates the ConfigMap the rows GET, the ConfigMap the watch step updates, `pods` Pods
    /// (Pending forever: there is no scheduler or kubelet) for the list rows, and lets the group
    /// `perf-devs` get, list and watch ConfigMaps and Pods.
    fn start(cluster_bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Self> {
        let cluster_dir = dir.join("cluster");
        eprintln!(
            "starting etcd + kube-apiserver on core 0 ({})",
            cluster_bin.display()
        );
        let out = Command::new("taskset")
            .args(["-c", "0"])
            .arg(cluster_bin)
            .arg("--dir")
            .arg(&cluster_dir)
            .args(["up", "--timeout-seconds", "600"])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .context("starting selkie-cluster (cargo build -p selkie-e2e --bin selkie-cluster)")?;
        anyhow::ensure!(out.status.success(), "selkie-cluster up failed ({})", out.status);
        let kubeconfig_path = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .trim(),
        );
        let kubeconfig: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&kubeconfig_path)?)
            .with_context(|| format!("reading {} as JSON", kubeconfig_path.display()))?;
        let field = |pointer: &str| -> anyhow::Result<String> {
            kubeconfig
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .with_context(|| format!("the admin kubeconfig has no {pointer}"))
        };
        let decode = |pointer: &str| -> anyhow::Result<Vec<u8>> {
            base64::engine::general_purpose::STANDARD
                .decode(field(pointer)?)
                .with_context(|| format!("{pointer} is not base64"))
        };
        let ca = dir.join("kube-ca.crt");
        let admin_cert = dir.join("kube-admin.crt");
        let admin_key = dir.join("kube-admin.key");
        std::fs::write(&ca, decode("/clusters/0/cluster/certificate-authority-data")?)?;
        std::fs::write(&admin_cert, decode("/users/0/user/client-certificate-data")?)?;
        std::fs::write(&admin_key, decode("/users/0/user/client-key-data")?)?;
        let server = field("/clusters/0/cluster/server")?;
        let cluster_pid: u32 = std::fs::read_to_string(cluster_dir.join("selkie-cluster.pid"))?
            .trim()
            .parse()
            .context("the cluster's pid file")?;
        let kubectl = kubectl();
        // About 1 KiB of JSON, like the perf backend's answer.
        let payload = format!("--from-literal=payload={}", "x".repeat(900));
        let pod_list = dir.join("kube-pods.json");
        std::fs::write(&pod_list, pod_manifests(pods).to_string())?;
        let pod_list = pod_list.display().to_string();
        for args in [
            vec![
                "create",
                "configmap",
                "selkie-perf",
                "-n",
                "default",
                payload.as_str(),
            ],
            vec![
                "create",
                "configmap",
                "selkie-perf-watch",
                "-n",
                "default",
                "--from-literal=seq=0",
            ],
            vec!["create", "-f", pod_list.as_str()],
            vec![
                "create",
                "clusterrole",
                "selkie-perf-read",
                "--verb=get,list,watch",
                "--resource=configmaps,pods",
            ],
            vec![
                "create",
                "clusterrolebinding",
                "selkie-perf-read",
                "--clusterrole=selkie-perf-read",
                "--group=perf-devs",
            ],
        ] {
            let status = Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&kubeconfig_path)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .status()
                .with_context(|| format!("running {}", kubectl.display()))?;
            anyhow::ensure!(
                status.success(),
                "kubectl {} failed ({status})",
                args[..3].join(" ")
            );
        }
        Ok(Self {
            server,
            ca,
            admin_cert,
            admin_key,
            cluster_pid,
        })
    }

    fn stop(cluster_bin: &Path, dir: &Path) {
        let _ = Command::new(cluster_bin)
            .arg("--dir")
            .arg(dir.join("cluster"))
            .arg("down")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status();
    }
}

/// `count` Pods in `default` as one `List` (`selkie-perf-000`, ...: one `pause` container each,
/// never scheduled).
fn pod_manifests(count: usize) -> serde_json::Value {
    let items: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": format!("selkie-perf-{i:03}"), "namespace": "default",
                             "labels": {"app": "selkie-perf"}},
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// `kubectl` from `PATH`, else the one the e2e harness built into `~/.cache/selkie/components`.
fn kubectl() -> PathBuf {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok()
    {
        return PathBuf::from("kubectl");
    }
    let components = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/selkie/components"))
        .unwrap_or_default();
    std::fs::read_dir(&components)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("bin/kubectl"))
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

struct Runner {
    args: Args,
    bin_dir: PathBuf,
    dir: PathBuf,
    pki: PerfPki,
    backend_port: u16,
    backend_admin: SocketAddr,
    backend_pid: u32,
    idp: Option<Idp>,
    kube: Option<Kube>,
    /// Steps run so far (makes SW-miss tokens unique across steps).
    steps_started: AtomicU64,
}

/// What a load step does.
#[derive(Debug, Clone, Copy)]
enum Kind {
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
    /// Our own processes the quiet check must not count as other work (the K rows' cluster).
    fn own_processes(&self) -> Vec<u32> {
        self.kube
            .as_ref()
            .map(|kube| process_tree(kube.cluster_pid))
            .unwrap_or_default()
    }

    fn log_target(&self, name: &str) -> anyhow::Result<Stdio> {
        if self.args.keep_logs {
            Ok(std::fs::File::create(self.dir.join(name))?.into())
        } else {
            Ok(Stdio::null())
        }
    }

    fn start_nginx(&self) -> anyhow::Result<Running> {
        let port = free_port()?;
        let dir = &self.dir;
        let access_log = if self.args.keep_logs {
            dir.join("nginx-access.log").display().to_string()
        } else {
            "/dev/null".into()
        };
        let p = |path: &Path| path.display().to_string();
        let conf = format!(
            r#"# Generated by selkie-perf-run.
user root;
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log {access_log};
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    proxy_headers_hash_bucket_size 128;
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 1024;
        keepalive_requests 100000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        location / {{
            proxy_pass https://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "";
            proxy_set_header Impersonate-User {user};
            proxy_set_header Impersonate-Group {group0};
            proxy_set_header Impersonate-Group {group1};
            proxy_ssl_certificate {client_cert};
            proxy_ssl_certificate_key {client_key};
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_protocols TLSv1.3;
            proxy_ssl_session_reuse on;
        }}
    }}
}}
"#,
            dir = dir.display(),
            backend = self.backend_port,
            cert = p(&self.pki.proxy.cert),
            key = p(&self.pki.proxy.key),
            user = USER,
            group0 = GROUPS[0],
            group1 = GROUPS[1],
            client_cert = p(&self.pki.upstream_client.cert),
            client_key = p(&self.pki.upstream_client.key),
            ca = p(&self.pki.ca),
        );
        let child = start_nginx(dir, &conf, port)?;
        Ok(Running::proxy(child, port))
    }

    fn start_haproxy(&self) -> anyhow::Result<Running> {
        let port = free_port()?;
        let dir = &self.dir;
        // haproxy takes the certificate and its key from one file.
        let bundle = |name: &str, files: &selkie_perf::pki::CertPaths| -> anyhow::Result<String> {
            let mut pem = std::fs::read_to_string(&files.cert)?;
            pem.push_str(&std::fs::read_to_string(&files.key)?);
            let path = dir.join(name);
            std::fs::write(&path, pem)?;
            Ok(path.display().to_string())
        };
        let conf = format!(
            r#"# Generated by selkie-perf-run.
global
    nbthread 1
    maxconn 4000
    ssl-default-bind-options ssl-min-ver TLSv1.3
    ssl-default-server-options ssl-min-ver TLSv1.3
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-request 10s
    timeout http-keep-alive 300s
frontend perf
    bind 127.0.0.1:{port} ssl crt {proxy} alpn h2,http/1.1
    http-request del-header Authorization
    http-request del-header Impersonate- -m beg
    http-request set-header Impersonate-User {user}
    http-request add-header Impersonate-Group {group0}
    http-request add-header Impersonate-Group {group1}
    default_backend backend
backend backend
    http-reuse always
    server backend 127.0.0.1:{backend} ssl crt {client} ca-file {ca} verify required verifyhost localhost sni str(localhost) alpn http/1.1
"#,
            proxy = bundle("haproxy-proxy.pem", &self.pki.proxy)?,
            client = bundle("haproxy-upstream-client.pem", &self.pki.upstream_client)?,
            ca = self.pki.ca.display(),
            backend = self.backend_port,
            user = USER,
            group0 = GROUPS[0],
            group1 = GROUPS[1],
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, conf)?;
        let check = Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .context("running haproxy -c (apt-get install -y haproxy)")?;
        anyhow::ensure!(
            check.status.success(),
            "haproxy rejects its configuration: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let mut child = Command::new("taskset")
            .args(["-c", "1", "haproxy", "-db", "-f"])
            .arg(&path)
            .stdin(Stdio::null())
            // The request log (one line per request, like nginx's access log) goes to stdout.
            .stdout(self.log_target("haproxy.log")?)
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting haproxy (apt-get install -y haproxy)")?;
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), &mut child, "haproxy")?;
        Ok(Running::proxy(child, port))
    }

    /// Writes `count` tokens for `alg` (one a line) and returns the file.
    fn token_file(&self, alg: JwtAlg, count: u32) -> anyhow::Result<PathBuf> {
        let idp = self.idp.as_ref().context("no identity provider running")?;
        let path = self.dir.join(format!("tokens-{}-{count}.txt", alg.name()));
        if path.exists() {
            return Ok(path);
        }
        let started = Instant::now();
        // RS256 signing is slow (about 1.5 ms a token here): both cores share the work.
        let half = count / 2;
        let mint = |range: std::ops::Range<u32>| -> anyhow::Result<String> {
            let mut text = String::new();
            for jti in range {
                text.push_str(&idp.keys.token(alg, &idp.issuer, jti)?);
                text.push('\n');
            }
            Ok(text)
        };
        let (first, second) = std::thread::scope(|scope| {
            let first = scope.spawn(|| mint(0..half));
            let second = mint(half..count);
            (first.join(), second)
        });
        let mut text = first.map_err(|_| anyhow::anyhow!("a minting thread panicked"))??;
        text.push_str(&second?);
        std::fs::write(&path, text)?;
        eprintln!(
            "minted {count} {} tokens in {:.1} s",
            alg.name(),
            started.elapsed().as_secs_f64()
        );
        Ok(path)
    }

    fn start_selkie(&self, system: System) -> anyhow::Result<Running> {
        let port = free_port()?;
        let q = |path: &Path| serde_json::to_string(&path.display().to_string()).unwrap_or_default();
        let (upstream, upstream_ca, client_cert, client_key) = match (system, &self.kube) {
            (System::KS0 { .. }, Some(kube)) => {
                (kube.server.clone(), &kube.ca, &kube.admin_cert, &kube.admin_key)
            }
            (System::KS0 { .. }, None) => anyhow::bail!("{system:?} needs the cluster"),
            _ => (
                format!("https://127.0.0.1:{}", self.backend_port),
                &self.pki.ca,
                &self.pki.upstream_client.cert,
                &self.pki.upstream_client.key,
            ),
        };
        let mut config = format!(
            "# Generated by selkie-perf-run.\nlisten: 127.0.0.1:{port}\nservingCertificate:\n  certFile: {}\n  keyFile: {}\nupstream:\n  url: {upstream}\n  caFile: {}\n  clientCertificate:\n    certFile: {}\n    keyFile: {}\n",
            q(&self.pki.proxy.cert),
            q(&self.pki.proxy.key),
            q(upstream_ca),
            q(client_cert),
            q(client_key),
        );
        let mut extra = Vec::new();
        let mut unique_bearer = None;
        let issuer = self
            .idp
            .as_ref()
            .map(|idp| idp.issuer.clone())
            .unwrap_or_default();
        match system {
            System::S0 | System::SR | System::KS0 { .. } => {
                let _ = write!(
                    config,
                    "staticIdentity:\n  username: {USER}\n  groups: [{}, {}]\n",
                    GROUPS[0], GROUPS[1]
                );
            }
            System::SX => {
                let _ = writeln!(config, "clientCertificateCaFiles:\n  - {}", q(&self.pki.user_ca));
                extra.extend([
                    "--cert".to_string(),
                    self.pki.user.cert.display().to_string(),
                    "--key".to_string(),
                    self.pki.user.key.display().to_string(),
                ]);
            }
            System::SJ { alg, tokens, cache } => {
                let _ = write!(
                    config,
                    "jwtAuthenticators:\n  - name: perf-jwt\n    issuer: {issuer}\n    audience: {AUDIENCE}\n    claims:\n      username: username\n      groups: groups\n    caFile: {}\n",
                    q(&self.pki.ca)
                );
                if !cache {
                    config.push_str("    cache: {enabled: false}\n");
                }
                let tokens = self.token_file(alg, tokens)?;
                extra.extend(["--bearer-file".to_string(), tokens.display().to_string()]);
            }
            System::SW { miss } => {
                let _ = write!(
                    config,
                    "webhookAuthenticators:\n  - name: perf-webhook\n    endpoint: {issuer}/tokenreview\n    caFile: {}\n",
                    q(&self.pki.ca)
                );
                if miss {
                    unique_bearer = Some("perf-miss-".to_string());
                } else {
                    let path = self.dir.join("tokens-webhook-hit.txt");
                    std::fs::write(&path, "perf-hit-token\n")?;
                    extra.extend(["--bearer-file".to_string(), path.display().to_string()]);
                }
            }
            System::D | System::N | System::H | System::KD { .. } => {
                anyhow::bail!("{system:?} is not Selkie")
            }
        }
        let path = self.dir.join(format!("selkie-{system:?}.yaml"));
        std::fs::write(&path, &config)?;
        let watch_interval = if system == System::SR {
            format!("{}ms", self.args.swap_watch_interval.as_millis())
        } else {
            // Only the file watcher reads this; keep it out of the way.
            "60s".to_string()
        };
        let stdout = if system == System::SR && !self.args.keep_logs {
            Stdio::piped()
        } else {
            self.log_target(&format!("selkie-{system:?}.log"))?
        };
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(self.bin_dir.join("selkie-concierge"))
            .arg("--config")
            .arg(&path)
            .args(["--watch-interval", &watch_interval])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(self.log_target(&format!("selkie-{system:?}.err"))?)
            .spawn()
            .context("starting selkie-concierge (cargo build --release -p selkie-concierge)")?;
        // SR: Selkie's log (audit lines and its own) goes through `grep` on core 0, which passes
        // on only the reload lines; a thread here counts them.
        let (helper, swappable) = if system == System::SR {
            let reloads = Arc::new(AtomicU64::new(0));
            let helper = match child.stdout.take() {
                Some(selkie_out) => {
                    let mut grep = Command::new("taskset")
                        .args(["-c", "0", "grep", "--line-buffered", "configuration reloaded"])
                        .stdin(selkie_out)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::inherit())
                        .spawn()
                        .context("starting grep to count reloads")?;
                    let lines = grep.stdout.take().context("grep has no stdout")?;
                    let counter = reloads.clone();
                    std::thread::spawn(move || {
                        use std::io::BufRead as _;
                        for _line in std::io::BufReader::new(lines).lines().map_while(Result::ok) {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    Some(grep)
                }
                // --keep-logs: the log is a file; reloads are counted from it.
                None => None,
            };
            (
                helper,
                Some(Swappable {
                    path: path.clone(),
                    text: config,
                    reloads,
                }),
            )
        } else {
            (None, None)
        };
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            "selkie-concierge",
        )?;
        let sut = Some(child.id());
        Ok(Running {
            child: Some(child),
            stop_signal: Signal::SIGINT,
            route: Route {
                base: format!("https://127.0.0.1:{port}"),
                extra,
                sut,
                unique_bearer,
                ca: None,
            },
            helper,
            swappable,
        })
    }

    fn start(&self, system: System) -> anyhow::Result<Running> {
        match system {
            System::D => Ok(Running::direct(
                format!("https://127.0.0.1:{}", self.backend_port),
                &self.pki.upstream_client.cert,
                &self.pki.upstream_client.key,
                None,
            )),
            System::KD { .. } => {
                let kube = self.kube.as_ref().context("the K rows need the cluster")?;
                Ok(Running::direct(
                    kube.server.clone(),
                    &kube.admin_cert,
                    &kube.admin_key,
                    Some(kube.ca.clone()),
                ))
            }
            System::N => self.start_nginx(),
            System::H => self.start_haproxy(),
            _ => self.start_selkie(system),
        }
    }

    /// SR: `reloads` counted so far (from the pipe, or from the kept log file).
    fn reloads(&self, running: &Running) -> u64 {
        let Some(swappable) = &running.swappable else {
            return 0;
        };
        if running.helper.is_some() {
            return swappable.reloads.load(Ordering::Relaxed);
        }
        std::fs::read_to_string(self.dir.join("selkie-SR.log"))
            .map(|log| log.matches("configuration reloaded").count() as u64)
            .unwrap_or(0)
    }

    /// One load step against `running`.
    fn step(
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

/// One line on stderr about a fixed-rate or probe step.
fn log_fixed(step: &Step, bound_us: f64) {
    eprintln!(
        "   p50 {:.0} µs, p99 {:.0} µs, achieved {:.0} req/s, SUT {:?} µs/req, errors {}, mismatches {}{}",
        step.load.latency_us.p50,
        step.load.latency_us.p99,
        step.load.achieved_rps,
        sut_cpu(step),
        step.load.errors,
        step.backend.impersonation_mismatches,
        if meets_bound(&step.load, bound_us) {
            ""
        } else {
            "; misses the p99 bound"
        },
    );
    if let Some(swap) = &step.hot_swap {
        eprintln!(
            "   hot swap: {} configurations written, {} reloads logged",
            swap.swaps_written, swap.reloads_logged
        );
    }
}

/// SR: rewrites the configuration file every interval while a step runs (a harmless change: a
/// comment with a counter; Selkie re-reads, validates and swaps in the whole configuration).
struct Swapper {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<u64>,
}

impl Swapper {
    fn start(path: PathBuf, text: String, interval: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let temporary = path.with_extension("yaml.next");
            let mut written = 0u64;
            let mut next = Instant::now() + interval;
            loop {
                let wait = next.saturating_duration_since(Instant::now());
                match stopped.recv_timeout(wait) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return written,
                }
                next += interval;
                // Written beside and renamed over, so Selkie never reads half a file.
                let content = format!("{text}# hot swap {}\n", written + 1);
                if std::fs::write(&temporary, content).is_ok() && std::fs::rename(&temporary, &path).is_ok() {
                    written += 1;
                }
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> u64 {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
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

/// The backend's mismatch count; "n/a" for the K rows (kube-apiserver counts none).
fn mismatches(step: &Step) -> String {
    if step.system.is_kube() {
        "n/a".into()
    } else {
        step.backend.impersonation_mismatches.to_string()
    }
}

fn sut_cpu(step: &Step) -> Option<f64> {
    step.load
        .cpu
        .iter()
        .find(|c| c.name == "sut")
        .map(|c| c.us_per_request)
}

fn group_cpu(step: &Step, name: &str) -> f64 {
    step.load
        .cpu
        .iter()
        .find(|c| c.name == name)
        .map_or(0.0, |c| c.us_per_request)
}

/// The sweep fraction whose steps fill the fixed-rate table: the one closest to 50 % (PERF.md's
/// "added latency at 50 % load"); `None` when no sweep ran (a rate given per protocol).
fn reference_fraction(fractions: &[f64]) -> Option<f64> {
    fractions
        .iter()
        .copied()
        .reduce(|a, b| if (b - 0.5).abs() < (a - 0.5).abs() { b } else { a })
}

/// `step`'s p50 and p99 minus its direct row's at the same protocol and offered rate; "—" for a
/// direct row or when its direct row has no step at that rate.
fn added_latency(step: &Step, steps: &[Step]) -> String {
    let same_rate = |d: &&Step| {
        d.system == step.system.direct()
            && d.protocol == step.protocol
            && (d.kind == "fixed-rate" || d.kind == "probe" || d.kind == "watch")
            && d.kind == step.kind
            && (d.load.target_rate - step.load.target_rate).abs() < 0.5
    };
    match steps.iter().find(same_rate) {
        Some(d) if step.system != step.system.direct() => format!(
            "{:+.0} / {:+.0}",
            step.load.latency_us.p50 - d.load.latency_us.p50,
            step.load.latency_us.p99 - d.load.latency_us.p99
        ),
        _ => "—".into(),
    }
}

/// The closed-loop maximum of `system`'s direct row at `protocol`.
fn direct_max(steps: &[Step], system: System, protocol: &str) -> Option<f64> {
    steps
        .iter()
        .find(|st| st.kind == "max" && st.protocol == protocol && st.system == system.direct())
        .map(|d| d.load.achieved_rps)
        .filter(|max| *max > 0.0)
}

/// The "max rate at p99 < bound" cell: the rate; `≥ rate` when no rate tried missed the bound
/// (a lower bound); `< rate` when even the lowest rate tried missed it.
fn bounded_cell(found: Option<&BoundedMax>) -> String {
    match found.map(|b| (b.rate, b.lowest_missing)) {
        Some((Some(rate), Some(_))) => format!("{rate:.0}"),
        Some((Some(rate), None)) => format!("≥ {rate:.0}"),
        Some((None, Some(missing))) => format!("< {missing:.0}"),
        _ => "—".into(),
    }
}

/// A bound in µs as the tables write it (`5 ms`, `800 µs`).
fn bound_label(us: f64) -> String {
    if us >= 1000.0 {
        format!("{} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// The cells a fixed-rate step shares across tables: offered and achieved req/s, p50, p99 and
/// p99.9 µs, the added p50 / p99 against its direct row, and the SUT's CPU µs per request.
fn latency_cells(step: &Step, steps: &[Step]) -> String {
    let l = &step.load;
    format!(
        "{:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {}",
        l.target_rate,
        l.achieved_rps,
        l.latency_us.p50,
        l.latency_us.p99,
        l.latency_us.p999,
        added_latency(step, steps),
        sut_cpu(step).map_or("—".into(), |c| format!("{c:.1}")),
    )
}

/// Writes a table's heading (`### title`), its header row and the separator row.
fn table_head(md: &mut String, title: &str, columns: &[&str]) {
    let _ = writeln!(md, "\n### {title}\n");
    let _ = writeln!(md, "| {} |", columns.join(" | "));
    let _ = writeln!(md, "|{}", "---|".repeat(columns.len()));
}

/// The rate sweep of one protocol: every row's fixed-rate and probe steps, by offered rate.
fn sweep_table(results: &Results, protocol: &str, ids: &[String], bound: &str) -> String {
    let mut md = String::new();
    let rows: Vec<&Step> = ids
        .iter()
        .flat_map(|id| {
            let mut own: Vec<&Step> = results
                .steps
                .iter()
                .filter(|st| {
                    st.protocol == protocol
                        && &st.system.id() == id
                        && (st.kind == "fixed-rate" || st.kind == "probe")
                })
                .collect();
            own.sort_by(|a, b| a.load.target_rate.total_cmp(&b.load.target_rate));
            own
        })
        .collect();
    if rows.is_empty() {
        return md;
    }
    table_head(
        &mut md,
        "Rate sweep and p99 probes (open loop; added latency vs D, or K-D, at the same offered rate)",
        &[
            "id",
            "step",
            "% of D's max (K rows: K-D's)",
            "offered req/s",
            "achieved req/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "added p50 / p99 µs",
            "SUT CPU µs/req",
            "non-2xx / errors / mismatches",
            &format!("p99 < {bound}"),
        ],
    );
    for st in rows {
        let l = &st.load;
        let step = match (st.kind, st.fraction) {
            ("probe", _) => "probe".to_string(),
            (_, Some(fraction)) => format!("{} %", fraction * 100.0),
            _ => "fixed".to_string(),
        };
        let share = direct_max(&results.steps, st.system, protocol)
            .map_or("—".into(), |d| format!("{:.0} %", l.target_rate * 100.0 / d));
        let _ = writeln!(
            md,
            "| {:?} | {step} | {share} | {} | {} / {} / {} | {} |",
            st.system,
            latency_cells(st, &results.steps),
            l.non_2xx,
            l.errors,
            mismatches(st),
            if meets_bound(l, results.settings.p99_bound_us) {
                "yes"
            } else {
                "no"
            },
        );
    }
    md
}

/// The watch step of one protocol (K-D, K-S0): update → event latency and every event accounted.
fn watch_table(results: &Results, protocol: &str) -> String {
    let mut md = String::new();
    let rows: Vec<&Step> = results
        .steps
        .iter()
        .filter(|st| st.protocol == protocol && st.kind == "watch")
        .collect();
    if rows.is_empty() {
        return md;
    }
    table_head(
        &mut md,
        "Watch (a ConfigMap watch through the system; the ConfigMap PATCHed directly at kube-apiserver)",
        &[
            "id",
            "updates/s",
            "updates",
            "events",
            "missing",
            "unexpected",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "added p50 / p99 vs K-D µs",
            "PATCH p50 / p99 µs",
            "SUT CPU µs/event",
            "errors",
        ],
    );
    for st in rows {
        let l = &st.load;
        let w = l.watch.clone().unwrap_or_default();
        let _ = writeln!(
            md,
            "| {:?} | {:.0} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.0} / {:.0} | {} | {} |",
            st.system,
            l.target_rate,
            l.sent,
            l.completed,
            w.missing,
            w.unexpected,
            l.latency_us.p50,
            l.latency_us.p99,
            l.latency_us.p999,
            added_latency(st, &results.steps),
            w.update_latency_us.p50,
            w.update_latency_us.p99,
            sut_cpu(st).map_or("—".into(), |c| format!("{c:.1}")),
            l.errors + l.non_2xx,
        );
    }
    md
}

fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let m = &results.machine;
    let ids: Vec<String> = {
        let mut seen: Vec<String> = Vec::new();
        for st in &results.steps {
            if !seen.contains(&st.system.id()) {
                seen.push(st.system.id());
            }
        }
        seen
    };
    let _ = writeln!(md, "# Side-by-side proxy benchmark ({})\n", ids.join(", "));
    let _ = writeln!(
        md,
        "Generated by `perf/run` (`selkie-perf-run`); every number is also in the `.json` beside this file.\n"
    );
    let _ = writeln!(md, "* Date (UTC): {}", results.date_utc);
    let _ = writeln!(
        md,
        "* Machine: {}; {}; {} memory; {}",
        m.cpu_model, m.cores, m.memory, m.kernel
    );
    let _ = writeln!(md, "* Toolchain: {}; {}; {}", m.rustc, m.nginx, m.haproxy);
    let s = &results.settings;
    let bound = bound_label(s.p99_bound_us);
    let _ = writeln!(
        md,
        "* Each step: {} s warm-up, then {} s measured. GET `{}`, {} B JSON answer. HTTP/1.1: {} keep-alive connections; HTTP/2: {} connections ({} streams each in the closed loop).",
        s.warmup_s, s.duration_s, s.path, s.response_body_bytes, s.h1_connections, s.h2_connections, s.h2_streams
    );
    let percents: Vec<String> = s
        .rate_fractions
        .iter()
        .map(|f| format!("{} %", f * 100.0))
        .collect();
    let _ = writeln!(
        md,
        "* Rate sweep: open-loop steps at {} of a base rate, for every row; a group's base rate is the lowest closed-loop maximum among its proxies, so that every row can sustain every step and rows are compared at the same offered rate (see perf/README.md). Base rates:",
        percents.join(", ")
    );
    for base in &results.sweep_bases {
        let share = base
            .direct_max
            .map(|d| {
                format!(
                    " = {:.0} % of {}'s maximum",
                    base.base_rate * 100.0 / d,
                    base.group
                )
            })
            .unwrap_or_default();
        let what = if base.given {
            "one fixed rate"
        } else {
            "sweep base"
        };
        let _ = writeln!(
            md,
            "  * {} {}: {what} {:.0} req/s ({}){share}",
            base.protocol, base.group, base.base_rate, base.rule
        );
    }
    let _ = writeln!(
        md,
        "* Max rate at p99 < {bound}: the highest offered rate whose step answered ≥ {:.0} % of it with no error and p99 < {bound}, every lower rate tried passing too; from the sweep plus up to {} probes ({} s warm-up, {} s measured) bisecting between the highest passing and the lowest failing rate (or the closed-loop maximum). `≥` when no rate tried failed, `<` when even the lowest did.",
        ACHIEVED_SHARE * 100.0,
        s.probes,
        s.probe_warmup_s,
        s.probe_duration_s
    );
    if let Some(list) = results
        .steps
        .iter()
        .find(|st| st.system == (System::KD { list: true }) && st.load.completed > 0)
    {
        let _ = writeln!(
            md,
            "* K-D-list / K-S0-list: GET `{PODS_PATH}` listing {} Pending pods (about {:.0} KiB of JSON per answer).",
            s.pods,
            list.load.body_bytes as f64 / list.load.completed as f64 / 1024.0
        );
    }
    if results.steps.iter().any(|st| st.kind == "watch") {
        let _ = writeln!(
            md,
            "* Watch step (K-D, K-S0): `GET {WATCH_PATH}` held through the system while the load client PATCHes that ConfigMap directly at kube-apiserver (admin certificate, HTTP/2) {:.0} times a second; latency from sending each PATCH to its event's arrival.",
            s.watch_rate
        );
    }
    let unquiet = results.steps.iter().filter(|st| !st.quiet).count();
    if unquiet > 0 {
        let _ = writeln!(
            md,
            "\n**Warning: {unquiet} of {} steps started on a machine that was not quiet** (see the load columns).",
            results.steps.len()
        );
    }
    let disturbed: Vec<String> = results
        .steps
        .iter()
        .filter(|st| !st.busy_during_step.is_empty())
        .map(|st| {
            format!(
                "{:?} {} {} ({})",
                st.system,
                st.protocol,
                st.kind,
                st.busy_during_step.join(", ")
            )
        })
        .collect();
    if disturbed.is_empty() {
        let _ = writeln!(
            md,
            "* No compiler or kube-apiserver was seen during any step (polled every second)."
        );
    } else {
        let _ = writeln!(
            md,
            "\n**Warning: other work ran during {} steps**: {}.",
            disturbed.len(),
            disturbed.join("; ")
        );
    }
    for skipped in &results.skipped {
        let _ = writeln!(md, "* Not run: {skipped}");
    }

    let protocols: Vec<String> = {
        let mut seen = Vec::new();
        for step in &results.steps {
            if !seen.contains(&step.protocol) {
                seen.push(step.protocol.clone());
            }
        }
        seen
    };
    let reference = reference_fraction(&s.rate_fractions);
    for protocol in &protocols {
        let label = if protocol == "h2" {
            "HTTP/2"
        } else {
            "HTTP/1.1 keep-alive"
        };
        let steps = |kind: &'static str| {
            results
                .steps
                .iter()
                .filter(move |st| &st.protocol == protocol && st.kind == kind)
        };
        // The fixed-rate table: the sweep's step nearest 50 %, or the one rate given.
        let fixed = || steps("fixed-rate").filter(|st| st.fraction.is_none() || st.fraction == reference);
        let nginx_fixed = fixed().find(|st| st.system == System::N);

        let _ = writeln!(md, "\n## Client → system: {label}\n");
        let title = match reference {
            Some(f) if fixed().any(|st| st.fraction.is_some()) => {
                format!("the sweep's {} % step", f * 100.0)
            }
            _ => "one rate".to_string(),
        };
        let _ = writeln!(
            md,
            "### Fixed rate: {title} (open loop; latency from the intended send time)\n"
        );
        let _ = writeln!(
            md,
            "| id | system | offered req/s | achieved req/s | p50 µs | p99 µs | p99.9 µs | added p50 / p99 vs D (K rows: vs K-D) µs | SUT CPU µs/req | ÷ N | backend CPU µs/req | non-2xx | errors | mismatches | load 1m / busy at start |"
        );
        let _ = writeln!(
            md,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for st in fixed() {
            let l = &st.load;
            let cpu = sut_cpu(st);
            let ratio = match (cpu, nginx_fixed.and_then(sut_cpu)) {
                (Some(c), Some(n))
                    if n > 0.0 && nginx_fixed.is_some_and(|n| n.load.target_rate == l.target_rate) =>
                {
                    format!("{:.2}", c / n)
                }
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {:?} | {} | {} | {} | {:.1} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                st.system.describe(),
                latency_cells(st, &results.steps),
                ratio,
                group_cpu(st, "backend"),
                l.non_2xx,
                l.errors,
                mismatches(st),
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
        md.push_str(&sweep_table(results, protocol, &ids, &bound));
        let _ = writeln!(
            md,
            "\n### Maximum throughput (closed loop; latency from the actual send time)\n"
        );
        let _ = writeln!(
            md,
            "| id | req/s | ÷ D | max rate at p99 < {bound} | p50 µs | p99 µs | SUT CPU µs/req | backend CPU µs/req | load client CPU µs/req | non-2xx | errors | mismatches | SUT RSS MiB | load 1m / busy at start |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for st in steps("max") {
            let l = &st.load;
            let rss = l
                .cpu
                .iter()
                .find(|c| c.name == "sut")
                .map_or("—".into(), |c| format!("{:.1}", c.rss_kib as f64 / 1024.0));
            let found = results
                .bounded
                .iter()
                .find(|b| b.system == st.system && &b.protocol == protocol);
            let _ = writeln!(
                md,
                "| {:?} | {:.0} | {} | {} | {:.0} | {:.0} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                l.achieved_rps,
                direct_max(&results.steps, st.system, protocol)
                    .map_or("—".into(), |d| format!("{:.2}", l.achieved_rps / d)),
                bounded_cell(found),
                l.latency_us.p50,
                l.latency_us.p99,
                sut_cpu(st).map_or("—".into(), |c| format!("{c:.1}")),
                group_cpu(st, "backend"),
                group_cpu(st, "load"),
                l.non_2xx,
                l.errors,
                mismatches(st),
                rss,
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
        md.push_str(&watch_table(results, protocol));
        let notes: Vec<String> = results
            .steps
            .iter()
            .filter(|st| &st.protocol == protocol && st.kind != "handshake")
            .filter_map(|st| {
                let answered = st.load.completed;
                let step = match st.kind {
                    "max" => "max".to_string(),
                    kind => format!("{kind} {:.0} req/s", st.load.target_rate),
                };
                if let Some(swap) = &st.hot_swap {
                    Some(format!(
                        "* {:?} {step}: {} configurations written during the step (every {} ms), {} reloads logged by Selkie; {} errors",
                        st.system,
                        swap.swaps_written,
                        results.settings.swap_interval_ms,
                        swap.reloads_logged,
                        st.load.errors + st.load.non_2xx
                    ))
                } else {
                    st.idp.as_ref().map(|idp| {
                        format!(
                            "* {:?} {step}: identity provider served {} TokenReviews ({} refused), {} discovery and {} JWKS requests for {} answers in the window (warm-up included in its counts)",
                            st.system,
                            idp.reviews,
                            idp.refused_reviews,
                            idp.discovery,
                            idp.jwks,
                            answered
                        )
                    })
                }
            })
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(md, "\nHot swaps and identity provider:\n");
            for note in notes {
                let _ = writeln!(md, "{note}");
            }
        }
        let _ = writeln!(
            md,
            "\nTLS and upstream protocol seen (fixed-rate table's steps):\n"
        );
        for st in fixed() {
            let backend = if st.system.is_kube() {
                "kube-apiserver (no backend counters)".to_string()
            } else {
                format!(
                    "backend got {} HTTP/1.1 and {} HTTP/2 requests over {} new connections",
                    st.backend.http1_requests, st.backend.http2_requests, st.backend.connections
                )
            };
            let _ = writeln!(
                md,
                "* {:?}: client TLS {} {} ALPN {}; {backend}; client send lag p50/p99 {:.0}/{:.0} µs",
                st.system,
                st.load.tls.version,
                st.load.tls.suite,
                st.load.tls.alpn,
                st.load.send_lag_us.p50,
                st.load.send_lag_us.p99,
            );
        }
    }

    let handshakes: Vec<&Step> = results.steps.iter().filter(|st| st.kind == "handshake").collect();
    if !handshakes.is_empty() {
        let nginx = handshakes
            .iter()
            .find(|st| st.system == System::N)
            .and_then(|st| sut_cpu(st));
        let mode = if handshakes.iter().all(|st| st.load.mode == "closed") {
            format!(
                "closed loop, {} connections at a time",
                results.settings.handshake_connections
            )
        } else {
            "open loop".to_string()
        };
        let _ = writeln!(
            md,
            "\n## New TLS connections (HTTP/1.1, one request per connection, `Connection: close`; {mode})\n"
        );
        let _ = writeln!(
            md,
            "Each request opens a new TLS 1.3 connection (ECDSA P-256, full handshake, no resumption), sends one GET and closes. CPU per handshake is the SUT's CPU ÷ completed requests, so it includes the one request; D has no SUT (the backend's column is its cost).\n"
        );
        let _ = writeln!(
            md,
            "| id | system | handshakes/s | p50 µs | p99 µs | SUT CPU µs/handshake | ÷ N | backend CPU µs/handshake | load client CPU µs/handshake | non-2xx | errors | mismatches | load 1m / busy at start |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for st in handshakes {
            let l = &st.load;
            let cpu = sut_cpu(st);
            let ratio = match (cpu, nginx) {
                (Some(c), Some(n)) if n > 0.0 => format!("{:.2}", c / n),
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {:?} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                st.system.describe(),
                l.achieved_rps,
                l.latency_us.p50,
                l.latency_us.p99,
                cpu.map_or("—".into(), |c| format!("{c:.1}")),
                ratio,
                group_cpu(st, "backend"),
                group_cpu(st, "load"),
                l.non_2xx,
                l.errors,
                mismatches(st),
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
    }
    md
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.duration = Duration::from_millis(500);
        args.warmup = Duration::from_millis(250);
        args.h1_connections = 4;
        args.h2_connections = 1;
        args.handshake_connections = 4;
        args.rate_h1 = None;
        args.rate_h2 = None;
        args.rate_fractions = vec![0.5, 1.0];
        args.probes = 1;
        args.probe_duration = args.duration;
        anyhow::ensure!(
            args.smoke_rate > 0.0 && args.smoke_rate <= 10_000.0,
            "--smoke-rate must be in (0, 10000]"
        );
        let scheduled = args.smoke_rate * (args.duration + args.warmup).as_secs_f64();
        args.max_requests.get_or_insert((scheduled * 2.0).ceil() as u64);
    }
    let systems = args
        .systems
        .iter()
        .map(|s| System::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for protocol in &args.protocols {
        anyhow::ensure!(
            protocol == "h1" || protocol == "h2",
            "unknown protocol {protocol:?}"
        );
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the runner has no directory")?
            .to_path_buf(),
    };
    let selkie = systems.iter().any(|s| s.is_selkie());
    let identity_provider = systems.iter().any(|s| s.uses_idp());
    for bin in [
        "selkie-perf-backend",
        "selkie-perf-load",
        "selkie-concierge",
        "selkie-perf-idp",
    ] {
        if (bin == "selkie-concierge" && !selkie) || (bin == "selkie-perf-idp" && !identity_provider) {
            continue;
        }
        anyhow::ensure!(
            bin_dir.join(bin).exists(),
            "{} is missing: perf/run builds it (cargo build [--release] -p selkie-perf -p selkie-concierge)",
            bin_dir.join(bin).display()
        );
    }
    if systems.contains(&System::N) {
        anyhow::ensure!(
            Command::new("nginx").arg("-v").output().is_ok(),
            "nginx is not installed: apt-get install -y nginx-light"
        );
    }
    if systems.contains(&System::H) {
        anyhow::ensure!(
            Command::new("haproxy").arg("-v").output().is_ok(),
            "haproxy is not installed: apt-get install -y haproxy"
        );
    }
    for (i, system) in systems.iter().enumerate() {
        anyhow::ensure!(!systems[..i].contains(system), "{system:?} is listed twice");
    }

    let temp = tempfile::Builder::new().prefix("selkie-perf-").tempdir()?;
    let dir = temp.path().to_path_buf();
    let groups: Vec<String> = GROUPS.iter().map(|g| g.to_string()).collect();
    let pki = PerfPki::generate(&dir, USER, &groups)?;
    let backend_port = free_port()?;
    let admin_port = free_port()?;
    let backend_admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let mut backend_cmd = Command::new("taskset");
    backend_cmd
        .args(["-c", "0"])
        .arg(bin_dir.join("selkie-perf-backend"))
        .args(["--listen", &format!("127.0.0.1:{backend_port}")])
        .args(["--admin-listen", &backend_admin.to_string()])
        .arg("--cert")
        .arg(&pki.backend.cert)
        .arg("--key")
        .arg(&pki.backend.key)
        .arg("--client-ca")
        .arg(&pki.upstream_ca)
        .args(["--expect-user", USER]);
    for group in GROUPS {
        backend_cmd.args(["--expect-group", group]);
    }
    let mut backend = backend_cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting selkie-perf-backend")?;
    wait_for_port(
        SocketAddr::from(([127, 0, 0, 1], backend_port)),
        &mut backend,
        "selkie-perf-backend",
    )?;
    let mut idp_child = None;
    let idp = if identity_provider {
        let (keys, jwks) = JwtKeys::generate(&dir)?;
        let port = free_port()?;
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let issuer = format!("https://127.0.0.1:{port}");
        let mut command = Command::new("taskset");
        command
            .args(["-c", "0"])
            .arg(bin_dir.join("selkie-perf-idp"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &admin.to_string()])
            .arg("--cert")
            .arg(&pki.backend.cert)
            .arg("--key")
            .arg(&pki.backend.key)
            .args(["--issuer", &issuer])
            .arg("--jwks")
            .arg(&jwks)
            .args(["--user", USER])
            .args(["--delay", &format!("{}ms", args.webhook_delay.as_millis())]);
        for group in GROUPS {
            command.args(["--group", group]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting selkie-perf-idp")?;
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &mut child,
            "selkie-perf-idp",
        )?;
        let pid = child.id();
        idp_child = Some(child);
        Some(Idp {
            issuer,
            admin,
            pid,
            keys,
        })
    } else {
        None
    };
    let kube_wanted = systems.iter().any(|s| s.is_kube());
    let cluster_bin = args.cluster_bin.clone().unwrap_or_else(|| {
        let beside = bin_dir.join("selkie-cluster");
        if beside.exists() {
            beside
        } else {
            PathBuf::from("target/debug/selkie-cluster")
        }
    });
    let kube = if kube_wanted {
        match Kube::start(&cluster_bin, &dir, args.pods) {
            Ok(kube) => Some(kube),
            Err(error) => {
                Kube::stop(&cluster_bin, &dir);
                let _ = stop(backend, Signal::SIGTERM, "the backend");
                if let Some(child) = idp_child {
                    let _ = stop(child, Signal::SIGTERM, "the identity provider");
                }
                return Err(error);
            }
        }
    } else {
        None
    };
    let runner = Runner {
        kube,
        backend_pid: backend.id(),
        args,
        bin_dir,
        dir,
        pki,
        backend_port,
        backend_admin,
        idp,
        steps_started: AtomicU64::new(0),
    };

    let date_utc = shell("date -u +%Y-%m-%dT%H:%M:%SZ");
    let mut steps = Vec::new();
    let mut skipped = Vec::new();
    let mut sweep_bases_all: Vec<SweepBase> = Vec::new();
    let mut bounded: Vec<BoundedMax> = Vec::new();
    let mut quiet_budget = runner.args.quiet_budget;
    let bound_us = runner.args.p99_bound.as_secs_f64() * 1e6;
    let outcome = (|| -> anyhow::Result<()> {
        // Every system is started once and stays up (idle) while the others are measured.
        let mut running = Vec::new();
        for system in &systems {
            match runner.start(*system) {
                Ok(started) => running.push((*system, started)),
                Err(error) if *system == System::S0 => {
                    eprintln!("S0 not run: {error:#}");
                    skipped.push(format!(
                        "S0 — selkie-concierge did not start with the `staticIdentity` configuration: {error:#}"
                    ));
                }
                Err(error) => return Err(error),
            }
        }
        let up: Vec<System> = running.iter().map(|(system, _)| *system).collect();
        for protocol in &runner.args.protocols {
            // First the maximum of every system (a smoke pass has none: its rates are fixed) ...
            let mut maxima: Vec<(System, f64)> = Vec::new();
            let max_steps = if runner.args.smoke { &[][..] } else { &running[..] };
            for (system, started) in max_steps {
                eprintln!("-- {system:?} {protocol}: maximum throughput");
                let max = runner.step(*system, started, protocol, Kind::Max, &mut quiet_budget)?;
                eprintln!(
                    "   {:.0} req/s, SUT {:?} µs/req, errors {}",
                    max.load.achieved_rps,
                    sut_cpu(&max),
                    max.load.errors
                );
                maxima.push((*system, max.load.achieved_rps));
                steps.push(max);
            }
            // ... then the sweep: every fraction for every system, fraction by fraction, so that
            // the rows compared at one offered rate are measured close together ...
            let given = if protocol == "h2" {
                runner.args.rate_h2
            } else {
                runner.args.rate_h1
            };
            let smoke = runner.args.smoke.then_some(runner.args.smoke_rate);
            let bases = sweep_bases(protocol, &up, &maxima, given, smoke);
            let fractions: Vec<Option<f64>> = match given {
                Some(_) => vec![None],
                None => runner.args.rate_fractions.iter().copied().map(Some).collect(),
            };
            for fraction in &fractions {
                for (system, started) in &running {
                    let Some(base) = base_of(&bases, protocol, *system) else {
                        continue;
                    };
                    let rate = fraction.map_or(base.base_rate, |f| round_rate(base.base_rate * f));
                    let label =
                        fraction.map_or("fixed rate".to_string(), |f| format!("sweep {:.0} %", f * 100.0));
                    eprintln!("-- {system:?} {protocol}: {label}, {rate:.0} req/s");
                    let mut fixed =
                        runner.step(*system, started, protocol, Kind::Fixed(rate), &mut quiet_budget)?;
                    fixed.fraction = *fraction;
                    log_fixed(&fixed, bound_us);
                    steps.push(fixed);
                }
            }
            sweep_bases_all.extend(bases);
            // ... then, per system, the bisection above the highest rate that met the bound ...
            for (system, started) in &running {
                let ceiling = maxima.iter().find(|(s, _)| s == system).map(|(_, max)| *max);
                let mut tried: Vec<(f64, bool)> = steps
                    .iter()
                    .filter(|st| st.system == *system && &st.protocol == protocol && st.kind == "fixed-rate")
                    .map(|st| (st.load.target_rate, meets_bound(&st.load, bound_us)))
                    .collect();
                let mut probes = 0;
                while probes < runner.args.probes {
                    let Some(rate) = bracket(&tried, ceiling).as_ref().and_then(next_probe) else {
                        break;
                    };
                    eprintln!("-- {system:?} {protocol}: p99 probe, {rate:.0} req/s");
                    let probe =
                        runner.step(*system, started, protocol, Kind::Probe(rate), &mut quiet_budget)?;
                    log_fixed(&probe, bound_us);
                    tried.push((rate, meets_bound(&probe.load, bound_us)));
                    steps.push(probe);
                    probes += 1;
                }
                let found = bracket(&tried, ceiling);
                bounded.push(BoundedMax {
                    system: *system,
                    protocol: protocol.clone(),
                    rate: found.and_then(|b| b.below),
                    lowest_missing: found.filter(|b| b.above_missed).map(|b| b.above),
                    ceiling,
                    probes,
                    tried,
                });
            }
            // ... and the watch step of the K rows.
            for (system, started) in running.iter().filter(|(s, _)| s.in_watch_step()) {
                eprintln!(
                    "-- {system:?} {protocol}: watch, {:.0} updates/s",
                    runner.args.watch_rate
                );
                let watch = runner.step(*system, started, protocol, Kind::Watch, &mut quiet_budget)?;
                eprintln!(
                    "   {} events of {} updates, p50 {:.0} µs, p99 {:.0} µs, errors {}",
                    watch.load.completed,
                    watch.load.sent,
                    watch.load.latency_us.p50,
                    watch.load.latency_us.p99,
                    watch.load.errors
                );
                steps.push(watch);
            }
        }
        // New TLS connections: one request each, HTTP/1.1.
        if !runner.args.no_handshakes {
            let rate = runner.args.smoke.then_some(runner.args.smoke_rate);
            for (system, started) in running.iter().filter(|(s, _)| s.in_handshake_step()) {
                eprintln!("-- {system:?} h1: handshakes (a new TLS connection per request)");
                let step = runner.step(*system, started, "h1", Kind::Handshakes(rate), &mut quiet_budget)?;
                eprintln!(
                    "   {:.0} handshakes/s, SUT {:?} µs/handshake, errors {}",
                    step.load.achieved_rps,
                    sut_cpu(&step),
                    step.load.errors
                );
                steps.push(step);
            }
        }
        for (system, mut started) in running {
            if let Some(child) = started.child.take() {
                stop(child, started.stop_signal, &format!("{system:?}"))?;
            }
        }
        Ok(())
    })();
    let final_counters = stop(backend, Signal::SIGTERM, "the backend")?;
    eprintln!("backend counters at exit: {}", final_counters.trim());
    if let Some(child) = idp_child {
        let idp_counters = stop(child, Signal::SIGTERM, "the identity provider")?;
        eprintln!("identity provider counters at exit: {}", idp_counters.trim());
    }
    if runner.kube.is_some() {
        Kube::stop(&cluster_bin, &runner.dir);
    }
    if runner.args.keep_logs {
        eprintln!("logs kept in {}", runner.dir.display());
        let _kept = temp.keep();
    }
    outcome?;

    let results = Results {
        date_utc,
        machine: Machine::describe(),
        settings: Settings {
            duration_s: runner.args.duration.as_secs_f64(),
            warmup_s: runner.args.warmup.as_secs_f64(),
            h1_connections: runner.args.h1_connections,
            h2_connections: runner.args.h2_connections,
            h2_streams: runner.args.h2_streams,
            handshake_connections: runner.args.handshake_connections,
            swap_interval_ms: runner.args.swap_interval.as_millis(),
            swap_watch_interval_ms: runner.args.swap_watch_interval.as_millis(),
            webhook_delay_ms: runner.args.webhook_delay.as_millis(),
            rate_fractions: runner.args.rate_fractions.clone(),
            p99_bound_us: bound_us,
            probes: runner.args.probes,
            probe_duration_s: runner.args.probe_duration.as_secs_f64(),
            probe_warmup_s: runner.args.warmup.min(PROBE_WARMUP).as_secs_f64(),
            watch_rate: runner.args.watch_rate,
            pods: runner.args.pods,
            path: PATH,
            response_body_bytes: 1024,
        },
        skipped,
        sweep_bases: sweep_bases_all,
        bounded,
        steps,
    };
    let (out, name) = if runner.args.smoke {
        ("target/perf-smoke", "side-by-side-smoke")
    } else {
        ("perf/results", "side-by-side-first")
    };
    let out = runner.args.out.clone().unwrap_or_else(|| out.into());
    let name = runner.args.name.clone().unwrap_or_else(|| name.into());
    std::fs::create_dir_all(&out)?;
    let json = out.join(format!("{name}.json"));
    let md = out.join(format!("{name}.md"));
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    std::fs::write(&md, markdown(&results))?;
    eprintln!("wrote {} and {}", md.display(), json.display());
    if runner.args.smoke {
        let failures = smoke_failures(&systems, &runner.args.protocols, &results);
        for step in &results.steps {
            let l = &step.load;
            eprintln!(
                "smoke {:?} {} {}: {} answered of {} sent at {:.0} req/s, p50 {:.0} µs, non-2xx {}, errors {}, reconnects {}, backend requests {}, mismatches {}, handshake failures {}{}",
                step.system,
                step.protocol,
                step.kind,
                l.completed,
                l.sent,
                l.target_rate,
                l.latency_us.p50,
                l.non_2xx,
                l.errors,
                l.reconnects,
                step.backend.requests,
                step.backend.impersonation_mismatches,
                step.backend.handshake_failures,
                match (&step.hot_swap, &step.idp) {
                    (Some(swap), _) => format!(
                        ", configurations written {}, reloads logged {}",
                        swap.swaps_written, swap.reloads_logged
                    ),
                    (None, Some(idp)) => format!(
                        ", TokenReviews {}, refused {}, discovery {}, JWKS {}",
                        idp.reviews, idp.refused_reviews, idp.discovery, idp.jwks
                    ),
                    (None, None) => String::new(),
                },
            );
        }
        if !failures.is_empty() {
            for failure in &failures {
                eprintln!("smoke FAILED: {failure}");
            }
            anyhow::bail!("the perf smoke pass failed ({} problems)", failures.len());
        }
        eprintln!(
            "smoke passed: {} steps ({} systems × {} protocols: {} sweep steps, {} p99 probes; {} handshake steps), every error counter 0",
            results.steps.len(),
            systems.len(),
            runner.args.protocols.len(),
            results.steps.iter().filter(|st| st.kind == "fixed-rate").count(),
            results.steps.iter().filter(|st| st.kind == "probe").count(),
            results.steps.iter().filter(|st| st.kind == "handshake").count()
        );
    }
    Ok(())
}

/// What is wrong with a smoke pass's results: a system or protocol that did not run (or ran
/// fewer sweep steps than there are fractions), a step without answers, or any non-zero error
/// counter. Empty when the pass is good.
fn smoke_failures(systems: &[System], protocols: &[String], results: &Results) -> Vec<String> {
    let mut failures: Vec<String> = results
        .skipped
        .iter()
        .map(|skipped| format!("not run: {skipped}"))
        .collect();
    for system in systems {
        for protocol in protocols {
            let ran = |kind: &str| {
                results
                    .steps
                    .iter()
                    .filter(|st| st.system == *system && &st.protocol == protocol && st.kind == kind)
                    .count()
            };
            let sweep = results.settings.rate_fractions.len();
            if ran("fixed-rate") == 0 {
                failures.push(format!("{system:?} {protocol}: no step ran"));
            } else if ran("fixed-rate") < sweep {
                failures.push(format!(
                    "{system:?} {protocol}: {} of {sweep} sweep steps ran",
                    ran("fixed-rate")
                ));
            }
        }
    }
    for st in &results.steps {
        let (l, b) = (&st.load, &st.backend);
        let id = format!("{:?} {} {}", st.system, st.protocol, st.kind);
        let mut check = |bad: bool, what: String| {
            if bad {
                failures.push(format!("{id}: {what}"));
            }
        };
        check(l.completed == 0, "no request was answered".into());
        check(l.non_2xx > 0, format!("{} answers outside 200–299", l.non_2xx));
        check(
            l.errors > 0,
            format!(
                "{} failed requests ({} timed out): {:?}",
                l.errors, l.timeouts, l.error_examples
            ),
        );
        check(
            l.reconnects > 0,
            format!("{} connections closed and re-established", l.reconnects),
        );
        let backend = !st.system.is_kube();
        check(
            backend && b.impersonation_mismatches > 0,
            format!(
                "{} impersonation mismatches at the backend: {:?}",
                b.impersonation_mismatches, b.mismatch_examples
            ),
        );
        check(
            backend && b.handshake_failures > 0,
            format!("{} failed TLS handshakes at the backend", b.handshake_failures),
        );
        // Every answer must come from the backend (through the system), not the system itself.
        check(
            backend && b.requests < l.completed,
            format!(
                "the backend served {} requests but the client got {} answers",
                b.requests, l.completed
            ),
        );
        if let Some(swap) = &st.hot_swap {
            check(swap.swaps_written == 0, "no configuration was written".into());
            check(
                swap.reloads_logged == 0,
                format!(
                    "{} configurations written but Selkie logged no reload",
                    swap.swaps_written
                ),
            );
        }
        if let Some(idp) = &st.idp {
            check(
                idp.refused_reviews > 0 || idp.bad_requests > 0,
                format!(
                    "the identity provider refused {} tokens and got {} bad requests",
                    idp.refused_reviews, idp.bad_requests
                ),
            );
            // A new token every request: every answer needs a review of its own.
            check(
                st.system == (System::SW { miss: true }) && idp.reviews < l.completed,
                format!(
                    "{} TokenReviews for {} answers with a new token each",
                    idp.reviews, l.completed
                ),
            );
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(system: System, protocol: &str) -> Step {
        Step {
            system,
            protocol: protocol.into(),
            kind: "fixed-rate",
            fraction: Some(0.5),
            load_average_1m_at_start: 0.0,
            cpu_busy_at_start: 0.0,
            waited_for_quiet_s: 0.0,
            quiet: false,
            busy_during_step: Vec::new(),
            load: LoadReport {
                sent: 100,
                completed: 100,
                ..LoadReport::default()
            },
            backend: BackendCounters {
                requests: 150,
                ..BackendCounters::default()
            },
            idp: None,
            hot_swap: None,
            command: String::new(),
        }
    }

    fn results(steps: Vec<Step>) -> Results {
        Results {
            date_utc: String::new(),
            machine: Machine {
                cpu_model: String::new(),
                cores: String::new(),
                kernel: String::new(),
                memory: String::new(),
                rustc: String::new(),
                nginx: String::new(),
                haproxy: String::new(),
            },
            settings: Settings {
                duration_s: 1.0,
                warmup_s: 0.5,
                h1_connections: 4,
                h2_connections: 1,
                h2_streams: 16,
                handshake_connections: 4,
                swap_interval_ms: 100,
                swap_watch_interval_ms: 50,
                webhook_delay_ms: 1,
                rate_fractions: vec![0.5],
                p99_bound_us: 5000.0,
                probes: 4,
                probe_duration_s: 5.0,
                probe_warmup_s: 2.0,
                watch_rate: 50.0,
                pods: 50,
                path: PATH,
                response_body_bytes: 1024,
            },
            skipped: Vec::new(),
            sweep_bases: Vec::new(),
            bounded: Vec::new(),
            steps,
        }
    }

    #[test]
    fn a_clean_smoke_pass_has_no_failures() {
        let all = results(vec![step(System::D, "h1"), step(System::S0, "h1")]);
        assert_eq!(
            smoke_failures(&[System::D, System::S0], &["h1".into()], &all),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_error_counter_fails_the_smoke_pass() {
        let systems = [System::SX];
        let protocols = ["h2".to_string()];
        type Spoil = fn(&mut Step);
        let cases: [(&str, Spoil); 7] = [
            ("no request was answered", |s| s.load.completed = 0),
            ("answers outside 200–299", |s| s.load.non_2xx = 1),
            ("failed requests", |s| s.load.errors = 2),
            ("re-established", |s| s.load.reconnects = 1),
            ("impersonation mismatches", |s| {
                s.backend.impersonation_mismatches = 3
            }),
            ("failed TLS handshakes", |s| s.backend.handshake_failures = 1),
            ("the backend served 99 requests", |s| s.backend.requests = 99),
        ];
        for (expected, spoil) in cases {
            let mut bad = step(System::SX, "h2");
            spoil(&mut bad);
            let failures = smoke_failures(&systems, &protocols, &results(vec![bad]));
            assert_eq!(failures.len(), 1, "{expected}: {failures:?}");
            assert!(failures[0].starts_with("SX h2 fixed-rate: "), "{failures:?}");
            assert!(failures[0].contains(expected), "{expected}: {failures:?}");
        }
    }

    #[test]
    fn system_ids_parse_and_print_back() {
        for id in [
            "D",
            "N",
            "H",
            "S0",
            "SX",
            "SJ-RS256-1",
            "SJ-ES256-100",
            "SJ-RS256-10k",
            "SJ-ES256-50k",
            "SJ-RS256-1-nocache",
            "SJ-ES256-10k-nocache",
            "SW-hit",
            "SW-miss",
            "SR",
            "K-D",
            "K-S0",
            "K-D-list",
            "K-S0-list",
        ] {
            assert_eq!(System::parse(id).unwrap().id(), id);
        }
        assert_eq!(
            System::parse("SJ-RS256-10k").unwrap(),
            System::SJ {
                alg: JwtAlg::Rs256,
                tokens: 10_000,
                cache: true
            }
        );
        assert_eq!(
            System::parse("SJ-ES256-1-nocache").unwrap(),
            System::SJ {
                alg: JwtAlg::Es256,
                tokens: 1,
                cache: false
            }
        );
        assert_eq!(
            System::parse("K-S0-list").unwrap().direct(),
            System::KD { list: true }
        );
        assert_eq!(System::parse("K-S0-list").unwrap().path(), PODS_PATH);
        assert_eq!(System::parse("SJ-ES256-1500").unwrap().id(), "SJ-ES256-1500");
        for bad in [
            "SJ-HS256-1",
            "SJ-RS256-0",
            "SJ-RS256",
            "SJ-RS256-x",
            "SW",
            "K",
            "K-SX",
            "SJ-RS256-nocache",
            "SJ-RS256-1-cache",
            "K-D-watch",
        ] {
            assert!(System::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hot_swaps_and_reviews_are_checked() {
        let mut sr = step(System::SR, "h1");
        sr.hot_swap = Some(HotSwap {
            swaps_written: 15,
            reloads_logged: 0,
        });
        let failures = smoke_failures(&[System::SR], &["h1".into()], &results(vec![sr]));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("no reload"), "{failures:?}");

        let miss = System::SW { miss: true };
        let mut sw = step(miss, "h1");
        sw.idp = Some(IdpCounters {
            reviews: 99,
            ..IdpCounters::default()
        });
        let failures = smoke_failures(&[miss], &["h1".into()], &results(vec![sw]));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains("99 TokenReviews for 100 answers"),
            "{failures:?}"
        );

        let es256 = System::SJ {
            alg: JwtAlg::Es256,
            tokens: 1,
            cache: true,
        };
        let mut sj = step(es256, "h2");
        sj.idp = Some(IdpCounters {
            refused_reviews: 1,
            ..IdpCounters::default()
        });
        let failures = smoke_failures(&[es256], &["h2".into()], &results(vec![sj]));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].starts_with("SJ-ES256-1 h2 fixed-rate: "),
            "{failures:?}"
        );
    }

    #[test]
    fn a_system_that_did_not_run_fails_the_smoke_pass() {
        let mut partial = results(vec![step(System::D, "h1")]);
        partial.skipped.push("S0 — did not start".into());
        let failures = smoke_failures(&[System::D, System::S0], &["h1".into(), "h2".into()], &partial);
        assert_eq!(
            failures,
            [
                "not run: S0 — did not start",
                "D h2: no step ran",
                "S0 h1: no step ran",
                "S0 h2: no step ran"
            ]
        );
    }

    #[test]
    fn a_sweep_with_fewer_steps_than_fractions_fails_the_smoke_pass() {
        let mut all = results(vec![step(System::D, "h1"), step(System::D, "h1")]);
        all.settings.rate_fractions = vec![0.5, 1.0];
        assert_eq!(
            smoke_failures(&[System::D], &["h1".into()], &all),
            Vec::<String>::new()
        );
        all.steps.pop();
        assert_eq!(
            smoke_failures(&[System::D], &["h1".into()], &all),
            ["D h1: 1 of 2 sweep steps ran"]
        );
    }

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

    #[test]
    fn rates_are_rounded_to_three_significant_digits() {
        assert_eq!(round_rate(8123.4), 8120.0);
        assert_eq!(round_rate(2431.7), 2430.0);
        assert_eq!(round_rate(812.34), 812.0);
        assert_eq!(round_rate(81.25), 81.0);
        assert_eq!(round_rate(34_567.0), 34_600.0);
        assert_eq!(round_rate(0.3), 1.0);
        assert_eq!(round_rate(f64::NAN), 1.0);
    }

    fn load(rate: f64, achieved: f64, p99: f64) -> LoadReport {
        LoadReport {
            target_rate: rate,
            achieved_rps: achieved,
            completed: 1000,
            latency_us: selkie_perf::report::Percentiles {
                p99,
                ..Default::default()
            },
            ..LoadReport::default()
        }
    }

    #[test]
    fn a_step_meets_the_bound_only_at_its_rate_without_errors() {
        assert!(meets_bound(&load(1000.0, 995.0, 4999.0), 5000.0));
        assert!(
            !meets_bound(&load(1000.0, 995.0, 5000.0), 5000.0),
            "p99 at the bound"
        );
        assert!(!meets_bound(&load(1000.0, 970.0, 800.0), 5000.0), "fell behind");
        let mut errors = load(1000.0, 1000.0, 800.0);
        errors.errors = 1;
        assert!(!meets_bound(&errors, 5000.0));
        let mut refused = load(1000.0, 1000.0, 800.0);
        refused.non_2xx = 1;
        assert!(!meets_bound(&refused, 5000.0));
        assert!(!meets_bound(&load(0.0, 0.0, 0.0), 5000.0), "closed loop");
    }

    #[test]
    fn the_search_brackets_the_highest_rate_under_the_bound() {
        let b = |below: Option<f64>, above: f64, above_missed: bool| Bracket {
            below,
            above,
            above_missed,
        };
        // Every sweep step passed: up to the closed-loop maximum, which was not tried.
        let all = [(800.0, true), (2000.0, true), (4000.0, true)];
        assert_eq!(bracket(&all, Some(8000.0)), Some(b(Some(4000.0), 8000.0, false)));
        assert_eq!(next_probe(&b(Some(4000.0), 8000.0, false)), Some(6000.0));
        // No maximum (the smoke pass) or one below the passing rate: twice the passing rate.
        assert_eq!(bracket(&all, None), Some(b(Some(4000.0), 8000.0, false)));
        assert_eq!(bracket(&all, Some(4050.0)), Some(b(Some(4000.0), 8000.0, false)));
        // Passing, then failing.
        let mixed = [(800.0, true), (2000.0, true), (4000.0, false), (6000.0, false)];
        assert_eq!(bracket(&mixed, Some(8000.0)), Some(b(Some(2000.0), 4000.0, true)));
        assert_eq!(next_probe(&b(Some(2000.0), 4000.0, true)), Some(3000.0));
        // A pass above a failure does not count: every lower rate must have passed.
        let noisy = [(800.0, true), (2000.0, false), (4000.0, true)];
        assert_eq!(bracket(&noisy, Some(8000.0)), Some(b(Some(800.0), 2000.0, true)));
        // Even the lowest rate failed: the search goes down from it.
        let none = [(800.0, false), (2000.0, false)];
        assert_eq!(bracket(&none, Some(8000.0)), Some(b(None, 800.0, true)));
        assert_eq!(next_probe(&b(None, 800.0, true)), Some(400.0));
        // Nothing tried; ends within 2 %.
        assert_eq!(bracket(&[], Some(8000.0)), None);
        assert_eq!(next_probe(&b(Some(1000.0), 1015.0, true)), None);
        assert_eq!(next_probe(&b(Some(1.0), 2.0, true)), None, "1.5 rounds to an end");
    }

    #[test]
    fn four_probes_close_in_on_the_limit() {
        // A system whose p99 crosses the bound at 5,200 req/s; the sweep (10–90 % of 8,000)
        // brackets it between 4,000 and 6,000.
        let passes = |rate: f64| rate <= 5200.0;
        let mut tried: Vec<(f64, bool)> = [800.0, 2000.0, 4000.0, 6000.0, 7200.0]
            .iter()
            .map(|rate| (*rate, passes(*rate)))
            .collect();
        let mut probes = Vec::new();
        while probes.len() < 4 {
            let Some(rate) = bracket(&tried, Some(7500.0)).as_ref().and_then(next_probe) else {
                break;
            };
            probes.push(rate);
            tried.push((rate, passes(rate)));
        }
        assert_eq!(probes, [5000.0, 5500.0, 5250.0, 5130.0]);
        let found = bracket(&tried, Some(7500.0)).unwrap();
        assert_eq!((found.below, found.above), (Some(5130.0), 5250.0));
    }

    #[test]
    fn every_group_gets_the_lowest_maximum_among_its_proxies() {
        let (kd, ks0) = (System::KD { list: false }, System::KS0 { list: false });
        let (kd_list, ks0_list) = (System::KD { list: true }, System::KS0 { list: true });
        let miss = System::SW { miss: true };
        let systems = [System::D, System::N, System::S0, miss, kd, ks0, kd_list, ks0_list];
        let maxima = [
            (System::D, 30_000.0),
            (System::N, 9_000.0),
            (System::S0, 8_123.0),
            (miss, 3_000.0),
            (kd, 2_000.0),
            (ks0, 1_500.0),
            (kd_list, 500.0),
            (ks0_list, 401.0),
        ];
        let bases = sweep_bases("h1", &systems, &maxima, None, None);
        let summary: Vec<(String, f64)> = bases.iter().map(|b| (b.group.clone(), b.base_rate)).collect();
        assert_eq!(
            summary,
            [
                ("SW-miss".to_string(), 3000.0),
                ("D".to_string(), 8120.0),
                ("K-D".to_string(), 1500.0),
                ("K-D-list".to_string(), 401.0),
            ]
        );
        assert!(bases[1].rule.contains("S0's 8123 req/s"), "{}", bases[1].rule);
        assert_eq!(bases[1].direct_max, Some(30_000.0));
        assert_eq!(base_of(&bases, "h1", miss).unwrap().group, "SW-miss");
        assert_eq!(base_of(&bases, "h1", System::N).unwrap().group, "D");
        assert_eq!(base_of(&bases, "h1", ks0_list).unwrap().group, "K-D-list");
        assert!(base_of(&bases, "h2", System::N).is_none());
        // Only D: its own maximum.
        let only_d = sweep_bases("h2", &[System::D], &[(System::D, 30_000.0)], None, None);
        assert_eq!(only_d[0].base_rate, 30_000.0);
        // A rate given, or the smoke pass: that rate for every group, no own base for SW-miss.
        for (given, smoke) in [(Some(700.0), None), (None, Some(700.0))] {
            let bases = sweep_bases("h1", &systems, &maxima, given, smoke);
            assert_eq!(bases.len(), 3);
            assert!(bases
                .iter()
                .all(|b| b.base_rate == 700.0 && b.given == given.is_some()));
        }
        // No maximum measured and no rate: no sweep.
        assert!(sweep_bases("h1", &systems, &[], None, None).is_empty());
    }

    fn at(
        system: System,
        protocol: &str,
        kind: &'static str,
        fraction: Option<f64>,
        rate: f64,
        p50: f64,
    ) -> Step {
        let mut st = step(system, protocol);
        st.kind = kind;
        st.fraction = fraction;
        st.load.target_rate = rate;
        st.load.achieved_rps = if kind == "max" { rate } else { rate * 0.999 };
        st.load.latency_us.p50 = p50;
        st.load.latency_us.p99 = p50 * 2.0;
        st.load.latency_us.p999 = p50 * 3.0;
        st.load.cpu.push(selkie_perf::report::CpuUse {
            name: "sut".into(),
            us_per_request: 30.0,
            ..Default::default()
        });
        st
    }

    #[test]
    fn the_tables_show_the_sweep_the_bound_and_the_watch() {
        let (kd, ks0) = (System::KD { list: false }, System::KS0 { list: false });
        let mut all = results(vec![
            at(System::D, "h1", "max", None, 30_000.0, 500.0),
            at(System::S0, "h1", "max", None, 8_000.0, 900.0),
            at(System::D, "h1", "fixed-rate", Some(0.1), 800.0, 100.0),
            at(System::S0, "h1", "fixed-rate", Some(0.1), 800.0, 130.0),
            at(System::D, "h1", "fixed-rate", Some(0.5), 4_000.0, 110.0),
            at(System::S0, "h1", "fixed-rate", Some(0.5), 4_000.0, 150.0),
            at(System::S0, "h1", "probe", None, 6_000.0, 3_000.0),
            at(kd, "h1", "watch", None, 50.0, 900.0),
            at(ks0, "h1", "watch", None, 50.0, 1_000.0),
        ]);
        all.settings.rate_fractions = vec![0.1, 0.5];
        all.steps[8].load.watch = Some(selkie_perf::report::WatchReport {
            established: true,
            missing: 2,
            ..Default::default()
        });
        all.bounded = vec![
            BoundedMax {
                system: System::D,
                protocol: "h1".into(),
                rate: Some(7_000.0),
                lowest_missing: None,
                ceiling: Some(30_000.0),
                probes: 4,
                tried: Vec::new(),
            },
            BoundedMax {
                system: System::S0,
                protocol: "h1".into(),
                rate: Some(4_000.0),
                lowest_missing: Some(6_000.0),
                ceiling: Some(8_000.0),
                probes: 1,
                tried: Vec::new(),
            },
        ];
        all.sweep_bases = sweep_bases(
            "h1",
            &[System::D, System::S0],
            &[(System::D, 30_000.0), (System::S0, 8_000.0)],
            None,
            None,
        );
        let md = markdown(&all);
        let line = |start: &str| {
            md.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no line {start:?} in\n{md}"))
                .to_string()
        };
        assert!(
            md.contains("* Rate sweep: open-loop steps at 10 %, 50 % of a base rate"),
            "{md}"
        );
        assert!(
            md.contains("  * h1 D: sweep base 8000 req/s (the lowest maximum among the proxies: S0's 8000 req/s) = 27 % of D's maximum"),
            "{md}"
        );
        // The fixed-rate table holds the 50 % steps.
        assert!(md.contains("### Fixed rate: the sweep's 50 % step"), "{md}");
        assert!(line("| S0 | Selkie, static identity | 4000 |").contains("| +40 / +80 |"));
        // The sweep table: every step by rate, added latency at the same rate, the bound.
        assert_eq!(
            line("| S0 | 10 % |"),
            "| S0 | 10 % | 3 % | 800 | 799 | 130 | 260 | 390 | +30 / +60 | 30.0 | 0 / 0 / 0 | yes |"
        );
        assert_eq!(
            line("| S0 | probe |"),
            "| S0 | probe | 20 % | 6000 | 5994 | 3000 | 6000 | 9000 | — | 30.0 | 0 / 0 / 0 | no |"
        );
        assert!(
            line("| D | 50 % |").contains("| — |"),
            "a direct row adds nothing"
        );
        // The maximum table's new column.
        assert!(
            md.contains("| id | req/s | ÷ D | max rate at p99 < 5 ms |"),
            "{md}"
        );
        assert!(line("| D | 30000 |").starts_with("| D | 30000 | 1.00 | ≥ 7000 |"));
        assert!(line("| S0 | 8000 |").starts_with("| S0 | 8000 | 0.27 | 4000 |"));
        // The watch table, K-S0 against K-D.
        assert_eq!(
            line("| K-S0 | 50 |"),
            "| K-S0 | 50 | 100 | 100 | 2 | 0 | 1000 | 2000 | 3000 | +100 / +200 | 0 / 0 | 30.0 | 0 |"
        );
        assert!(bounded_cell(None) == "—");
        let below_all = BoundedMax {
            system: System::S0,
            protocol: "h1".into(),
            rate: None,
            lowest_missing: Some(800.0),
            ceiling: None,
            probes: 0,
            tried: Vec::new(),
        };
        assert_eq!(bounded_cell(Some(&below_all)), "< 800");
    }
}
