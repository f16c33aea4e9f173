//! `selkie-scale-bench`: issue 27's "scale by simulation" of the Supervisor, run by `perf/scale`.
//!
//! Starts a real kube-apiserver (with etcd), Dex and the (release) Supervisor with a short session
//! garbage-collection interval, does real `cli_password` logins and a refresh so that the
//! namespace holds real session Secrets, then:
//!
//! 1. **FederationDomains**: creates `--federation-domains` FederationDomains (a tenth of them,
//!    then the rest), each at its own issuer path with an OIDCIdentityProvider of its own (all
//!    pointing at the one Dex), and measures the time until every one is `Ready`, the
//!    Supervisor's memory, file descriptors and idle CPU after, OIDC discovery latency at random
//!    issuers and one login through the newest one;
//! 2. **sessions**: for each of `--sessions`, tops the namespace's session Secrets up to that
//!    count by cloning the real ones through the kube API (new names in the Supervisor's
//!    scheme, a collection time 9 h ahead), then right after a sweep has finished sets the
//!    collection time of `--expired-fraction` of them into the past and waits for the next sweep:
//!    its duration (the Supervisor's `session_sweep_duration_seconds`), what it deleted (must be
//!    exactly those), kube-apiserver's requests meanwhile by resource and verb, and the CPU of
//!    the Supervisor, kube-apiserver and etcd; then, before the next sweep, login and refresh
//!    latency (p50/p99) with CPU and kube-apiserver requests per operation; and the memory and
//!    file descriptors of the Supervisor (kube-apiserver's and etcd's memory beside).
//!
//! Loopback only; every loop is bounded by a count and by `--deadline-seconds`. Every operation's
//! answer is checked and the first failure ends the run with the Supervisor's log tail (it holds
//! no token); no token or password is printed. Writes a markdown report (`--out`) and its raw
//! numbers as JSON beside it. `--smoke` is a short pass (200 sessions, 10 FederationDomains, a
//! few operations) that asserts it all works, for `make test`.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
    Api,
};
use selkie_e2e::{
    bench::{
        apiserver_requests, delta, dex_build, handles, parallel, random_seed, samples, url_port,
        wait_for_quiet, with_supervisor_log, write_report, Handles, Ports, Process, Quiet, QuietArgs,
        Requests,
    },
    dex::{Dex, DexUser},
    kubectl::Kubectl,
    pinniped_cli::{self, Session},
    supervisor::{dex_manifests, Supervisor},
    Cluster,
};
use selkie_oidc::https::HttpsClient;
use selkie_perf::procstat;
use serde_json::{json, Value};
use sha2::Digest as _;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// Issue 27's Supervisor scale benchmark (perf/README.md, "Supervisor at scale").
#[derive(Debug, Parser)]
struct Args {
    /// Session Secrets to measure at, in increasing order (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    sessions: Vec<usize>,
    /// FederationDomains (each with an OIDCIdentityProvider of its own) to create, in two steps:
    /// a tenth of them, then the rest.
    #[arg(long, default_value_t = 500)]
    federation_domains: usize,
    /// Logins measured per step (sessions) and the login latency's sample.
    #[arg(long, default_value_t = 40)]
    logins: usize,
    /// Refresh grants measured per step.
    #[arg(long, default_value_t = 40)]
    refreshes: usize,
    /// Concurrent clients of the logins and refreshes (1: latency alone).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// OIDC discovery requests at random issuers per FederationDomain step.
    #[arg(long, default_value_t = 200)]
    discoveries: usize,
    /// Share (0–1) of the sessions whose collection time is set into the past at each step.
    #[arg(long, default_value_t = 0.01)]
    expired_fraction: f64,
    /// Concurrent requests creating and changing session Secrets.
    #[arg(long, default_value_t = 16)]
    create_concurrency: usize,
    /// The Supervisor's session garbage-collection interval, in seconds.
    #[arg(long, default_value_t = 15)]
    gc_interval_seconds: u64,
    /// Seconds of the idle windows (the Supervisor's background CPU).
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// Seconds a FederationDomain step waits for every FederationDomain to be Ready; past it the
    /// step reports how many were and what the Supervisor holds (the smoke pass fails).
    #[arg(long, default_value_t = 300)]
    ready_timeout_seconds: u64,
    /// The whole run's deadline, in seconds (every wait and loop ends by then).
    #[arg(long, default_value_t = 3600)]
    deadline_seconds: u64,
    /// The wait for a quiet machine before each step (`--attempts` is not used: a step is
    /// measured once, between two sweeps).
    #[command(flatten)]
    quiet: QuietArgs,
    /// A short pass for `make test`: 200 sessions, 10 FederationDomains, 5 logins and refreshes,
    /// 20 discoveries, a 5 s interval, no wait for a quiet machine; results to
    /// target/perf-smoke/scale-smoke.md unless --out says otherwise. Fails unless every operation
    /// succeeded and each sweep deleted exactly the expired clones.
    #[arg(long)]
    smoke: bool,
    /// The markdown report to write (the JSON goes beside it) [default: perf/results/scale.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Args {
    /// The smoke pass's settings in place of the defaults.
    fn smoke(mut self) -> Self {
        self.sessions = vec![200];
        self.federation_domains = 10;
        self.logins = 5;
        self.refreshes = 5;
        self.discoveries = 20;
        self.gc_interval_seconds = 5;
        self.idle_seconds = 2;
        self.deadline_seconds = 300;
        self.out = self
            .out
            .or_else(|| Some(PathBuf::from("target/perf-smoke/scale-smoke.md")));
        self
    }
}

/// The password of every Dex user of the bench (a constant, never printed).
const PASSWORD: &str = "scale-password-0123";
/// The display name of every FederationDomain's identity provider.
const IDP_NAME: &str = pinniped_cli::IDP_DISPLAY_NAME;
/// The label every session storage Secret has (its value is what the Secret stores).
const TYPE_LABEL: &str = "storage.pinniped.dev/type";
/// The label tying a login's Secrets together.
const REQUEST_ID_LABEL: &str = "storage.pinniped.dev/request-id";
/// The annotation the collector reads.
const GARBAGE_COLLECT_AFTER: &str = "storage.pinniped.dev/garbage-collect-after";
/// The Supervisor's sweep counter, duration histogram and collected-Secrets counter.
const SWEEPS: &str = "selkie_supervisor_session_sweeps_total";
const SWEEP_SECONDS: &str = "selkie_supervisor_session_sweep_duration_seconds_sum";
const COLLECTED: &str = "selkie_supervisor_sessions_collected_total";
/// How long a live clone lives (a session's maximum, as the Supervisor writes it).
const LIVE_FOR: time::Duration = time::Duration::hours(9);

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args = args.smoke();
    }
    ensure!(args.concurrency > 0, "--concurrency must be positive");
    ensure!(
        args.create_concurrency > 0,
        "--create-concurrency must be positive"
    );
    ensure!(
        (0.0..1.0).contains(&args.expired_fraction),
        "--expired-fraction must be in [0, 1)"
    );
    ensure!(
        args.sessions.windows(2).all(|pair| pair[0] < pair[1]),
        "--sessions must increase"
    );
    selkie_e2e::install_crypto_provider();
    let deadline = Instant::now() + Duration::from_secs(args.deadline_seconds);

    let cluster = Cluster::shared().await?;
    let kube = cluster.client().await?;
    let namespace = cluster.create_namespace(&kube, "scale-bench").await?;
    let users: Vec<DexUser> = (0..args.concurrency)
        .map(|user| DexUser {
            email: email(user),
            password: PASSWORD.into(),
            user_id: format!("scale-{user:04}"),
            groups: vec!["scale".into()],
        })
        .collect();
    let dex = Dex::start(&users).await?;
    let settings = json!({"sessionGarbageCollectionInterval": format!("{}s", args.gc_interval_seconds)});
    let supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        &dex,
        IDP_NAME,
        selkie_e2e::free_port()?,
        settings,
    )
    .await?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("perf/results/scale.md"));
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let results = with_supervisor_log(
        measure(&args, deadline, cluster, kube, &dex, &supervisor, &out).await,
        &supervisor,
    )?;
    let json = results.json(&args);
    write_report(&out, &json, |json_path| markdown(&json, json_path))
}

/// The email (login name) of the bench's Dex user number `user`.
fn email(user: usize) -> String {
    format!("scale-{user:02}@example.com")
}

/// What the bench needs of the running components.
struct Ctx<'a> {
    args: &'a Args,
    deadline: Instant,
    kube: kube::Client,
    secrets: Api<Secret>,
    supervisor: &'a Supervisor,
    kubectl: Kubectl,
    http: HttpsClient,
    pids: [(Process, u32); 4],
    ports: Ports,
}

impl Ctx<'_> {
    /// Fails once the run's deadline has passed.
    fn check_deadline(&self, doing: &str) -> Result<()> {
        ensure!(
            Instant::now() < self.deadline,
            "the run's deadline (--deadline-seconds {}) passed while {doing}",
            self.args.deadline_seconds
        );
        Ok(())
    }

    /// The Supervisor's sweep counters.
    async fn sweeps(&self) -> Result<Sweeps> {
        Sweeps::parse(&self.supervisor.metrics().await?)
    }

    /// Waits (at most two intervals past `after`'s, plus 10 min for a long sweep, and never
    /// past the deadline) until a sweep finishes after `after`; fails if one failed.
    async fn next_sweep(&self, after: &Sweeps) -> Result<Sweeps> {
        let limit = Instant::now() + Duration::from_secs(2 * self.args.gc_interval_seconds + 600);
        loop {
            let now = self.sweeps().await?;
            ensure!(
                now.failed == after.failed,
                "a garbage-collection sweep failed (its list failed)"
            );
            if now.ok > after.ok {
                return Ok(now);
            }
            ensure!(Instant::now() < limit, "no sweep finished in time");
            self.check_deadline("waiting for a sweep")?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// kube-apiserver's counters, then the CPU times and the clock.
    async fn sample(&self) -> Result<Sample> {
        let requests = apiserver_requests(&self.kube).await?;
        Ok(Sample {
            requests,
            at: Instant::now(),
            cpu: Cpu::of(&self.pids)?,
        })
    }

    /// What happened since `before`: wall time, CPU and kube-apiserver's requests.
    async fn since(&self, before: &Sample) -> Result<Window> {
        let wall = before.at.elapsed();
        let cpu = Cpu::of(&self.pids)?.since(&before.cpu);
        let requests = delta(&apiserver_requests(&self.kube).await?, &before.requests);
        Ok(Window { wall, cpu, requests })
    }

    /// The Supervisor's memory and handles, and kube-apiserver's and etcd's memory.
    fn footprint(&self) -> Result<Footprint> {
        let rss = |process: Process| -> Result<f64> {
            let pid = self
                .pids
                .iter()
                .find(|(key, _)| *key == process)
                .map(|(_, pid)| *pid)
                .context("no such process")?;
            Ok(procstat::rss_kib(pid)? as f64 / 1024.0)
        };
        Ok(Footprint {
            supervisor_rss_mib: rss(Process::Supervisor)?,
            handles: handles(self.supervisor.pid(), self.ports)?,
            apiserver_rss_mib: rss(Process::Apiserver)?,
            etcd_rss_mib: rss(Process::Etcd)?,
        })
    }
}

type Cpu = selkie_e2e::bench::Cpu<Process>;

/// The counters at the start of a window.
struct Sample {
    at: Instant,
    cpu: Cpu,
    requests: Requests,
}

/// What a window cost.
struct Window {
    wall: Duration,
    cpu: Cpu,
    requests: Requests,
}

impl Window {
    /// kube-apiserver's requests for `resource` by verb (all codes).
    fn requests_of(&self, resource: &str) -> BTreeMap<String, f64> {
        let mut verbs = BTreeMap::new();
        for ((r, verb, _), count) in &self.requests {
            if r == resource {
                *verbs.entry(verb.clone()).or_default() += count;
            }
        }
        verbs
    }

    fn json(&self) -> Value {
        json!({
            "wall_seconds": self.wall.as_secs_f64(),
            "cpu_seconds": {
                "supervisor": self.cpu[Process::Supervisor].as_secs_f64(),
                "kube_apiserver": self.cpu[Process::Apiserver].as_secs_f64(),
                "etcd": self.cpu[Process::Etcd].as_secs_f64(),
                "dex": self.cpu[Process::Dex].as_secs_f64(),
                "bench": self.cpu.bench.as_secs_f64(),
            },
            "other_processes_share_of_machine": self.cpu.others_share(self.wall),
            "secrets_requests": self.requests_of("secrets"),
            "requests": self.requests.iter().map(|((resource, verb, code), count)| {
                json!({"resource": resource, "verb": verb, "code": code, "count": count})
            }).collect::<Vec<_>>(),
        })
    }
}

/// Memory and handles at a moment.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Footprint {
    supervisor_rss_mib: f64,
    handles: Handles,
    apiserver_rss_mib: f64,
    etcd_rss_mib: f64,
}

/// The Supervisor's garbage-collection counters.
#[derive(Debug, Clone, Copy)]
struct Sweeps {
    ok: f64,
    failed: f64,
    seconds: f64,
    deleted: f64,
}

impl Sweeps {
    fn parse(text: &str) -> Result<Self> {
        let sum = |metric: &str, label: Option<(&str, &str)>| -> Result<f64> {
            Ok(samples(text, metric)?
                .iter()
                .filter(|(labels, _)| {
                    label.is_none_or(|(name, value)| labels.get(name).is_some_and(|v| v == value))
                })
                .fold(0.0, |total, (_, value)| total + value))
        };
        Ok(Self {
            ok: sum(SWEEPS, Some(("result", "ok")))?,
            failed: sum(SWEEPS, Some(("result", "failed")))?,
            seconds: sum(SWEEP_SECONDS, None)?,
            deleted: sum(COLLECTED, Some(("outcome", "deleted")))?,
        })
    }
}

/// Operations' latencies (sorted) and what they cost.
struct Timed {
    latencies: Vec<Duration>,
    window: Window,
    /// Sweeps that finished during the operations (they should not have).
    sweeps_during: f64,
}

impl Timed {
    fn json(&self) -> Value {
        let ops = self.latencies.len().max(1) as f64;
        let micros = |cpu: Duration| cpu.as_secs_f64() * 1e6 / ops;
        json!({
            "operations": self.latencies.len(),
            "p50_ms": ms(percentile(&self.latencies, 0.50)),
            "p99_ms": ms(percentile(&self.latencies, 0.99)),
            "max_ms": ms(self.latencies.last().copied().unwrap_or_default()),
            "supervisor_cpu_us_per_op": micros(self.window.cpu[Process::Supervisor]),
            "kube_apiserver_cpu_us_per_op": micros(self.window.cpu[Process::Apiserver]),
            "secrets_requests_per_op": self.window.requests_of("secrets").into_iter()
                .map(|(verb, count)| (verb, json!(count / ops))).collect::<serde_json::Map<_, _>>(),
            "sweeps_during": self.sweeps_during,
            "window": self.window.json(),
        })
    }
}

/// The nearest-rank `p` quantile of `sorted` (zero when empty).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Runs `total` operations `op` on one task per state, timing each; the window's costs and the
/// sweeps that finished meanwhile.
async fn timed<S, F, Fut>(ctx: &Ctx<'_>, total: usize, states: Vec<S>, op: F) -> Result<Timed>
where
    S: Send + 'static,
    F: Fn(S) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<S>> + Send + 'static,
{
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let sweeps = ctx.sweeps().await?;
    let before = ctx.sample().await?;
    let recorded = latencies.clone();
    parallel(total, states, move |state| {
        let (op, recorded) = (op.clone(), recorded.clone());
        async move {
            let began = Instant::now();
            let state = op(state).await?;
            recorded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(began.elapsed());
            Ok(state)
        }
    })
    .await?;
    let window = ctx.since(&before).await?;
    let sweeps_during = ctx.sweeps().await?.ok - sweeps.ok;
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap_or_else(PoisonError::into_inner));
    latencies.sort();
    ensure!(
        latencies.len() == total,
        "{} of {total} operations ran",
        latencies.len()
    );
    Ok(Timed {
        latencies,
        window,
        sweeps_during,
    })
}

/// Everything measured.
struct Results {
    machine: selkie_perf::process::Machine,
    kubernetes_version: String,
    dex_build: String,
    quiet: Option<Quiet>,
    templates: BTreeMap<String, usize>,
    idle: Window,
    start: Footprint,
    federation_domains: Vec<Value>,
    scales: Vec<Value>,
}

impl Results {
    fn json(&self, args: &Args) -> Value {
        json!({
            "bench": "selkie-scale-bench",
            "smoke": args.smoke,
            "machine": {
                "cpu_model": self.machine.cpu_model,
                "cores": self.machine.cores,
                "kernel": self.machine.kernel,
                "memory": self.machine.memory,
                "rustc": self.machine.rustc,
            },
            "kubernetes_version": self.kubernetes_version,
            "dex_build": self.dex_build,
            "supervisor_build": if std::env::var_os("SELKIE_E2E_RELEASE").is_some() { "release" } else { "debug" },
            "quiet_before_start": self.quiet,
            "settings": {
                "sessions": args.sessions,
                "federation_domains": args.federation_domains,
                "logins": args.logins,
                "refreshes": args.refreshes,
                "concurrency": args.concurrency,
                "discoveries": args.discoveries,
                "expired_fraction": args.expired_fraction,
                "create_concurrency": args.create_concurrency,
                "gc_interval_seconds": args.gc_interval_seconds,
                "idle_seconds": args.idle_seconds,
            },
            "templates_by_type": self.templates,
            "idle": self.idle.json(),
            "idle_supervisor_cpu_ms_per_second": self.idle.cpu[Process::Supervisor].as_secs_f64() * 1e3 / self.idle.wall.as_secs_f64().max(1e-9),
            "start": self.start,
            "federation_domains": self.federation_domains,
            "scales": self.scales,
        })
    }
}

async fn measure(
    args: &Args,
    deadline: Instant,
    cluster: &Cluster,
    kube: kube::Client,
    dex: &Dex,
    supervisor: &Supervisor,
    out: &std::path::Path,
) -> Result<Results> {
    let [etcd_pid, apiserver_pid] = cluster.pids()[..] else {
        bail!("the cluster has not exactly etcd and kube-apiserver");
    };
    let ctx = Ctx {
        args,
        deadline,
        secrets: Api::namespaced(kube.clone(), supervisor.namespace()),
        kube,
        supervisor,
        kubectl: cluster.kubectl(),
        http: supervisor.client()?,
        pids: [
            (Process::Supervisor, supervisor.pid()),
            (Process::Dex, dex.pid().context("Dex is not running")?),
            (Process::Apiserver, apiserver_pid),
            (Process::Etcd, etcd_pid),
        ],
        ports: Ports {
            supervisor: url_port(supervisor.issuer())?,
            kube_apiserver: cluster.apiserver_port(),
            dex: url_port(dex.issuer())?,
        },
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = ctx.footprint()?;

    // Real sessions to clone: every user logs in and refreshes once (authorization code, access
    // and refresh token Secrets, one refresh token rotated).
    let token_url = format!("{}/oauth2/token", supervisor.issuer());
    for user in 0..args.concurrency {
        let session =
            pinniped_cli::login_session(&ctx.http, supervisor.issuer(), IDP_NAME, &email(user), PASSWORD)
                .await?;
        pinniped_cli::refresh_session(&ctx.http, &token_url, session).await?;
    }
    let templates = templates(&ctx.secrets).await?;
    let mut by_type = BTreeMap::new();
    for template in &templates {
        *by_type.entry(label(template, TYPE_LABEL)).or_default() += 1;
    }

    let quiet = if args.smoke {
        None
    } else {
        Some(wait_for_quiet(&args.quiet).await?)
    };
    let sweeps = ctx.sweeps().await?;
    ctx.next_sweep(&sweeps).await?;
    let before = ctx.sample().await?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle = ctx.since(&before).await?;
    let idle_rate = idle.cpu[Process::Supervisor].as_secs_f64() / idle.wall.as_secs_f64().max(1e-9);

    let seed = random_seed()?;
    let mut clones: Vec<String> = Vec::new();
    let mut scales = Vec::new();
    for &sessions in &args.sessions {
        ctx.check_deadline("measuring the sessions")?;
        scales.push(session_step(&ctx, &templates, &seed, &mut clones, sessions, idle_rate).await?);
    }

    // The FederationDomains last: their footprint stays out of the session steps, and the report
    // of the session steps is written first (a FederationDomain step that fails leaves it).
    let mut results = Results {
        machine: selkie_perf::process::Machine::describe(),
        kubernetes_version: cluster.kubernetes_version().to_string(),
        dex_build: dex_build()?,
        quiet,
        templates: by_type,
        idle,
        start,
        federation_domains: Vec::new(),
        scales,
    };
    let json = results.json(args);
    write_report(out, &json, |json_path| markdown(&json, json_path))?;
    let mut federation_domains = Vec::new();
    let first_step = (args.federation_domains / 10).max(1).min(args.federation_domains);
    let mut created = 0;
    for step in [first_step, args.federation_domains] {
        if step > created {
            federation_domains.push(federation_domain_step(&ctx, dex, created, step).await?);
            created = step;
        }
    }
    results.federation_domains = federation_domains;
    Ok(results)
}

/// The value of `name` among `secret`'s labels (empty when it has none).
fn label(secret: &Secret, name: &str) -> String {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(name))
        .cloned()
        .unwrap_or_default()
}

/// The session storage Secrets the real logins left, to clone.
async fn templates(secrets: &Api<Secret>) -> Result<Vec<Secret>> {
    let found = secrets
        .list(&ListParams::default().labels(TYPE_LABEL))
        .await
        .context("listing the session Secrets")?
        .items;
    ensure!(!found.is_empty(), "the logins left no session Secret");
    Ok(found)
}

/// The names of the session storage Secrets there are (listed by metadata, 500 a page).
async fn session_names(secrets: &Api<Secret>) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut params = ListParams::default().labels(TYPE_LABEL).limit(500);
    loop {
        let page = secrets
            .list_metadata(&params)
            .await
            .context("listing the session Secrets")?;
        names.extend(page.items.into_iter().filter_map(|item| item.metadata.name));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => return Ok(names),
        }
    }
}

/// RFC 3339 of `at`, to the second.
fn rfc3339(at: OffsetDateTime) -> Result<String> {
    Ok(at.replace_nanosecond(0)?.format(&Rfc3339)?)
}

/// Clone number `n` of `template`: a name in the Supervisor's scheme
/// (`pinniped-storage-<type>-<52 base32 characters>`, from SHA-256 of the run's seed and `n`), a
/// request ID of its own, collectable `LIVE_FOR` from now; the same type and data.
fn clone_of(template: &Secret, seed: &[u8; 32], n: usize, collect_after: &str) -> Secret {
    const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let digest = sha2::Sha256::new()
        .chain_update(seed)
        .chain_update(n.to_le_bytes())
        .finalize();
    let suffix: String = digest
        .iter()
        .chain(digest.iter().take(20))
        .map(|byte| char::from(BASE32[usize::from(byte & 31)]))
        .collect();
    let kind = label(template, TYPE_LABEL);
    let mut labels = template.metadata.labels.clone().unwrap_or_default();
    labels.insert(REQUEST_ID_LABEL.to_string(), format!("scale-{n:08}"));
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("pinniped-storage-{kind}-{suffix}")),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                GARBAGE_COLLECT_AFTER.to_string(),
                collect_after.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: template.type_.clone(),
        data: template.data.clone(),
        ..Secret::default()
    }
}

/// Runs `op` on every item, `concurrency` at a time; the first failure ends it.
async fn concurrently<T, F, Fut>(items: Vec<T>, concurrency: usize, op: F) -> Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    futures::stream::iter(items.into_iter().map(op))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}

/// One step of the sessions: top up to `sessions`, one sweep with the expired share, logins and
/// refreshes, the footprint.
async fn session_step(
    ctx: &Ctx<'_>,
    templates: &[Secret],
    seed: &[u8; 32],
    clones: &mut Vec<String>,
    sessions: usize,
    idle_rate: f64,
) -> Result<Value> {
    let args = ctx.args;
    // Top up.
    let existing = session_names(&ctx.secrets).await?.len();
    let missing = sessions.saturating_sub(existing);
    let collect_after = rfc3339(OffsetDateTime::now_utc() + LIVE_FOR)?;
    let first = clones.len();
    let new: Vec<Secret> = (first..first + missing)
        .map(|n| clone_of(&templates[n % templates.len()], seed, n, &collect_after))
        .collect();
    let names: Vec<String> = new
        .iter()
        .filter_map(|secret| secret.metadata.name.clone())
        .collect();
    let began = Instant::now();
    concurrently(new, args.create_concurrency, |secret| async move {
        ctx.check_deadline("creating session Secrets")?;
        ctx.secrets
            .create(&PostParams::default(), &secret)
            .await
            .context("creating a session Secret")?;
        Ok(())
    })
    .await?;
    let create_seconds = began.elapsed().as_secs_f64();
    clones.extend(names);
    let stored = session_names(&ctx.secrets).await?.len();
    eprintln!("{sessions} sessions: created {missing} in {create_seconds:.1} s ({stored} stored)");

    // One sweep: right after one has finished, the expired share's collection time goes into
    // the past, and the next one must delete exactly those.
    if !args.smoke {
        wait_for_quiet(&args.quiet).await?;
    }
    let expired_count = ((stored as f64 * args.expired_fraction).round() as usize).min(clones.len());
    let expired: Vec<String> = clones.split_off(clones.len() - expired_count);
    let sweeps = ctx.next_sweep(&ctx.sweeps().await?).await?;
    let before = ctx.sample().await?;
    let past = rfc3339(OffsetDateTime::now_utc() - time::Duration::minutes(1))?;
    let patch = json!({"metadata": {"annotations": {GARBAGE_COLLECT_AFTER: past}}});
    let patching = Instant::now();
    concurrently(expired.clone(), args.create_concurrency, |name| {
        let patch = &patch;
        async move {
            ctx.secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .context("expiring a session Secret")?;
            Ok(())
        }
    })
    .await?;
    let patch_seconds = patching.elapsed().as_secs_f64();
    ensure!(
        patch_seconds < args.gc_interval_seconds as f64 / 2.0,
        "expiring {expired_count} Secrets took {patch_seconds:.1} s, too close to the sweep interval"
    );
    let swept = ctx.next_sweep(&sweeps).await?;
    let window = ctx.since(&before).await?;
    let sweep_seconds = swept.seconds - sweeps.seconds;
    let deleted = (swept.deleted - sweeps.deleted).round() as usize;
    let remaining: std::collections::HashSet<String> =
        session_names(&ctx.secrets).await?.into_iter().collect();
    let still_there = expired.iter().filter(|name| remaining.contains(*name)).count();
    ensure!(
        swept.ok - sweeps.ok == 1.0 && deleted == expired_count && still_there == 0,
        "the sweep at {sessions} sessions deleted {deleted} Secrets ({} sweeps), not the {expired_count} expired \
         ones ({still_there} of them remain)",
        swept.ok - sweeps.ok
    );
    let sweep_cpu = sweep_cpu(&window, sweep_seconds, idle_rate);
    eprintln!(
        "{sessions} sessions: a sweep took {:.0} ms and deleted {deleted}",
        sweep_seconds * 1e3
    );

    // Logins and refreshes, before the next sweep.
    let logins = timed(ctx, args.logins, (0..args.concurrency).collect(), {
        let (http, issuer) = (ctx.http.clone(), ctx.supervisor.issuer().to_string());
        move |user: usize| {
            let (http, issuer) = (http.clone(), issuer.clone());
            async move {
                pinniped_cli::login_session(&http, &issuer, IDP_NAME, &email(user), PASSWORD).await?;
                Ok(user)
            }
        }
    })
    .await?;
    let token_url = format!("{}/oauth2/token", ctx.supervisor.issuer());
    let mut chains = Vec::with_capacity(args.concurrency);
    for user in 0..args.concurrency {
        chains.push(
            pinniped_cli::login_session(
                &ctx.http,
                ctx.supervisor.issuer(),
                IDP_NAME,
                &email(user),
                PASSWORD,
            )
            .await?,
        );
    }
    let refreshes = timed(ctx, args.refreshes, chains, {
        let http = ctx.http.clone();
        move |session: Session| {
            let (http, token_url) = (http.clone(), token_url.clone());
            async move { pinniped_cli::refresh_session(&http, &token_url, session).await }
        }
    })
    .await?;
    let footprint = ctx.footprint()?;
    Ok(json!({
        "sessions": sessions,
        "stored_before_sweep": stored,
        "created": missing,
        "create_seconds": create_seconds,
        "creates_per_second": missing as f64 / create_seconds.max(1e-9),
        "sweep": {
            "expired": expired_count,
            "deleted": deleted,
            "duration_seconds": sweep_seconds,
            "expire_patch_seconds": patch_seconds,
            "supervisor_cpu_seconds_estimate": sweep_cpu,
            "window": window.json(),
        },
        "logins": logins.json(),
        "refreshes": refreshes.json(),
        "footprint_after": footprint,
    }))
}

/// The Supervisor's CPU seconds of a sweep of `sweep_seconds` in `window`: the window's, less
/// what its idle rate (CPU seconds per second, from the idle window) costs over the rest of the
/// window; never negative.
fn sweep_cpu(window: &Window, sweep_seconds: f64, idle_rate: f64) -> f64 {
    let total = window.cpu[Process::Supervisor].as_secs_f64();
    let outside = (window.wall.as_secs_f64() - sweep_seconds).max(0.0);
    (total - idle_rate * outside).max(0.0)
}

/// One step of the FederationDomains: `from`..`to` created (each with an OIDCIdentityProvider of
/// its own at Dex), the time until every FederationDomain is `Ready`, the footprint, idle CPU,
/// discovery latency at random issuers and one login through the newest.
async fn federation_domain_step(ctx: &Ctx<'_>, dex: &Dex, from: usize, to: usize) -> Result<Value> {
    let namespace = ctx.supervisor.namespace();
    let base = ctx
        .supervisor
        .issuer()
        .rsplit_once('/')
        .map(|(base, _)| base.to_string())
        .context("the Supervisor's issuer has no path")?;
    let issuer = |n: usize| format!("{base}/{namespace}-fd-{n:04}");
    let mut manifests = String::new();
    for n in from..to {
        let idp = format!("dex-{n:04}");
        manifests.push_str(&dex_manifests(dex, namespace, &idp));
        manifests.push_str(&format!(
            "---\napiVersion: config.supervisor.pinniped.dev/v1alpha1\nkind: FederationDomain\n\
             metadata: {{name: fd-{n:04}, namespace: {namespace}}}\n\
             spec:\n  issuer: {}\n  identityProviders:\n  - displayName: {IDP_NAME:?}\n    \
             objectRef: {{apiGroup: idp.supervisor.pinniped.dev, kind: OIDCIdentityProvider, name: {idp}}}\n---\n",
            issuer(n)
        ));
    }
    let began = Instant::now();
    ctx.kubectl
        .run_with_stdin(&["create", "-f", "-"], Some(&manifests))
        .await?;
    let create_seconds = began.elapsed().as_secs_f64();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("config.supervisor.pinniped.dev", "v1alpha1", "FederationDomain"),
        "federationdomains",
    );
    let domains: Api<DynamicObject> = Api::namespaced_with(ctx.kube.clone(), namespace, &resource);
    let ready_seconds: std::result::Result<f64, usize> = loop {
        let listed = domains.list(&ListParams::default()).await?.items;
        let ready = listed
            .iter()
            .filter(|domain| domain.data["status"]["phase"] == "Ready")
            .count();
        // Every one created, and the Supervisor's own first FederationDomain.
        if ready == to + 1 {
            break Ok(began.elapsed().as_secs_f64());
        }
        ctx.check_deadline(&format!(
            "waiting for {to} FederationDomains to be Ready ({ready} are)"
        ))?;
        if began.elapsed() > Duration::from_secs(ctx.args.ready_timeout_seconds) {
            break Err(ready.saturating_sub(1));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let ready_seconds = match ready_seconds {
        Ok(seconds) => seconds,
        Err(ready) => {
            // A limit found: what the Supervisor holds is the measurement (no discovery or login).
            let timeout = ctx.args.ready_timeout_seconds;
            ensure!(
                !ctx.args.smoke,
                "only {ready} of {to} FederationDomains were Ready after {timeout} s"
            );
            eprintln!("{to} FederationDomains: only {ready} Ready after {timeout} s");
            return Ok(json!({
                "federation_domains": to,
                "created": to - from,
                "create_seconds": create_seconds,
                "ready": ready,
                "all_ready_seconds": null,
                "ready_timeout_seconds": timeout,
                "footprint_after": ctx.footprint()?,
            }));
        }
    };
    eprintln!(
        "{to} FederationDomains: created in {create_seconds:.1} s, all Ready after {ready_seconds:.1} s"
    );
    // Every issuer is served: its discovery answers.
    let served = Instant::now();
    for n in from..to {
        loop {
            let url = format!("{}/.well-known/openid-configuration", issuer(n));
            match ctx
                .http
                .get_json(&url, 64 * 1024, Some(Duration::from_secs(5)))
                .await
            {
                Ok(_) => break,
                Err(_) => {
                    ctx.check_deadline("waiting for every issuer's discovery")?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    let served_seconds = began.elapsed().as_secs_f64();
    let served_after_ready = served.elapsed().as_secs_f64();

    let footprint = ctx.footprint()?;
    let before = ctx.sample().await?;
    tokio::time::sleep(Duration::from_secs(ctx.args.idle_seconds)).await;
    let idle = ctx.since(&before).await?;

    // Discovery at random issuers (the run's seed picks them).
    let seed = random_seed()?;
    let mut latencies = Vec::with_capacity(ctx.args.discoveries);
    for k in 0..ctx.args.discoveries {
        let pick = usize::from(u16::from_le_bytes([seed[k % 32], seed[(k * 7 + 1) % 32]])) ^ k;
        let n = pick % to;
        let url = format!("{}/.well-known/openid-configuration", issuer(n));
        let began = Instant::now();
        let body = ctx
            .http
            .get_json(&url, 64 * 1024, Some(Duration::from_secs(10)))
            .await?;
        latencies.push(began.elapsed());
        let document: Value = serde_json::from_slice(&body)?;
        ensure!(
            document["issuer"] == issuer(n).as_str(),
            "discovery of {} named the issuer {}",
            issuer(n),
            document["issuer"]
        );
    }
    latencies.sort();
    let login_began = Instant::now();
    pinniped_cli::login_session(&ctx.http, &issuer(to - 1), IDP_NAME, &email(0), PASSWORD)
        .await
        .context("a login through the newest FederationDomain")?;
    let login = login_began.elapsed();
    Ok(json!({
        "federation_domains": to,
        "created": to - from,
        "create_seconds": create_seconds,
        "all_ready_seconds": ready_seconds,
        "all_served_seconds": served_seconds,
        "served_after_ready_seconds": served_after_ready,
        "ready": to,
        "footprint_after": footprint,
        "idle": idle.json(),
        "idle_supervisor_cpu_ms_per_second": idle.cpu[Process::Supervisor].as_secs_f64() * 1e3 / idle.wall.as_secs_f64().max(1e-9),
        "discovery": {
            "requests": latencies.len(),
            "p50_ms": ms(percentile(&latencies, 0.5)),
            "p99_ms": ms(percentile(&latencies, 0.99)),
            "max_ms": ms(latencies.last().copied().unwrap_or_default()),
        },
        "login_through_newest_ms": ms(login),
    }))
}

/// `value` as a number (0 when it is none).
fn num(value: &Value) -> f64 {
    value.as_f64().unwrap_or_default()
}

/// The markdown report of `json` (written to `json_path`).
fn markdown(json: &Value, json_path: &std::path::Path) -> String {
    use std::fmt::Write as _;
    let machine = &json["machine"];
    let settings = &json["settings"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Supervisor at scale (issue 27): sessions and FederationDomains\n\n\
         * Written by `perf/scale{}` (`e2e/src/bin/selkie-scale-bench.rs`); raw numbers in `{}`.\n\
         * Machine: {} ({} vCPU), {} RAM, {}; {} Supervisor, kube-apiserver {} with etcd \
           (`--unsafe-no-fsync`), Dex {}; everything on 127.0.0.1, unpinned.\n\
         * Session garbage collection every {} s; {} logins and {} refreshes per step by {} client(s); \
           {} % of the sessions expired before each measured sweep; Secrets created {} at a time.\n\
         * The Supervisor's idle CPU at start: {:.2} ms per second; RSS {:.1} MiB, {} file descriptors.\n",
        if json["smoke"] == true { " --smoke" } else { "" },
        json_path.display(),
        machine["cpu_model"].as_str().unwrap_or_default(),
        machine["cores"].as_str().unwrap_or_default(),
        machine["memory"].as_str().unwrap_or_default(),
        machine["kernel"].as_str().unwrap_or_default(),
        json["supervisor_build"].as_str().unwrap_or_default(),
        json["kubernetes_version"].as_str().unwrap_or_default(),
        json["dex_build"].as_str().unwrap_or_default(),
        settings["gc_interval_seconds"],
        settings["logins"],
        settings["refreshes"],
        settings["concurrency"],
        num(&settings["expired_fraction"]) * 100.0,
        settings["create_concurrency"],
        num(&json["idle_supervisor_cpu_ms_per_second"]),
        num(&json["start"]["supervisor_rss_mib"]),
        json["start"]["handles"]["fds"],
    );
    let empty = Vec::new();
    let scales = json["scales"].as_array().unwrap_or(&empty);
    let per_op = |op: &Value, verb: &str| num(&op["secrets_requests_per_op"][verb]);
    let _ = writeln!(
        out,
        "## What must stay flat: logins, refreshes, memory\n\n\
         | session Secrets | login p50 / p99 (ms) | Supervisor CPU per login (µs) | Secret requests per login \
         (POST / GET / PUT) | refresh p50 / p99 (ms) | Supervisor CPU per refresh (µs) | Secret requests per \
         refresh (POST / GET / PUT / DELETE) | Supervisor RSS (MiB) | its fds |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for scale in scales {
        let (login, refresh) = (&scale["logins"], &scale["refreshes"]);
        let _ = writeln!(
            out,
            "| {} | {:.1} / {:.1} | {:.0} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {:.0} | {:.1} / {:.1} / {:.1} / {:.1} | {:.1} | {} |",
            scale["sessions"],
            num(&login["p50_ms"]),
            num(&login["p99_ms"]),
            num(&login["supervisor_cpu_us_per_op"]),
            per_op(login, "POST"),
            per_op(login, "GET"),
            per_op(login, "PUT"),
            num(&refresh["p50_ms"]),
            num(&refresh["p99_ms"]),
            num(&refresh["supervisor_cpu_us_per_op"]),
            per_op(refresh, "POST"),
            per_op(refresh, "GET"),
            per_op(refresh, "PUT"),
            per_op(refresh, "DELETE"),
            num(&scale["footprint_after"]["supervisor_rss_mib"]),
            scale["footprint_after"]["handles"]["fds"],
        );
    }
    let _ = writeln!(
        out,
        "\n## What grows: one garbage-collection sweep\n\n\
         The sweep lists the session Secrets by metadata only, 500 a page, then reads and deletes each \
         expired one. Duration from the Supervisor's `selkie_supervisor_session_sweep_duration_seconds`; \
         requests are kube-apiserver's `apiserver_request_total` over the window from the sweep before to \
         this one (the bench's own `patch`es that expired the Secrets are in it, nothing else touches \
         Secrets); CPU over the same window, the Supervisor's less its idle rate outside the sweep.\n\n\
         | session Secrets | expired | deleted | sweep (ms) | Secret list / get / delete / patch | Supervisor CPU \
         (ms) | kube-apiserver CPU (ms) | etcd CPU (ms) | window (s) | kube-apiserver RSS (MiB) | etcd RSS (MiB) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for scale in scales {
        let sweep = &scale["sweep"];
        let window = &sweep["window"];
        let secrets = |verb: &str| num(&window["secrets_requests"][verb]);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} / {} / {} / {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} |",
            scale["stored_before_sweep"],
            sweep["expired"],
            sweep["deleted"],
            num(&sweep["duration_seconds"]) * 1e3,
            secrets("LIST"),
            secrets("GET"),
            secrets("DELETE"),
            secrets("PATCH"),
            num(&sweep["supervisor_cpu_seconds_estimate"]) * 1e3,
            num(&window["cpu_seconds"]["kube_apiserver"]) * 1e3,
            num(&window["cpu_seconds"]["etcd"]) * 1e3,
            num(&window["wall_seconds"]),
            num(&scale["footprint_after"]["apiserver_rss_mib"]),
            num(&scale["footprint_after"]["etcd_rss_mib"]),
        );
    }
    let _ = writeln!(
        out,
        "\n### Creating the sessions (the bench's clones, through kube-apiserver)\n\n\
         | step | Secrets created | seconds | per second |\n|---:|---:|---:|---:|"
    );
    for scale in scales {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.0} |",
            scale["sessions"],
            scale["created"],
            num(&scale["create_seconds"]),
            num(&scale["creates_per_second"]),
        );
    }
    let _ = writeln!(
        out,
        "\n## FederationDomains\n\n\
         Each FederationDomain has an OIDCIdentityProvider of its own (and its client Secret), all at the \
         one Dex; created with one `kubectl create` per step. \"Ready\" is every FederationDomain's \
         `status.phase`; \"served\" is every new issuer's discovery answering.\n\n\
         | FederationDomains | Ready | create (s) | all Ready (s) | all served (s) | Supervisor RSS (MiB) | its fds | \
         its connections to kube-apiserver / Dex | idle CPU (ms/s) | discovery p50 / p99 (ms) | a login through \
         the newest (ms) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let shown = |value: &Value, scale: f64, digits: usize| match value.as_f64() {
        Some(number) => format!("{:.*}", digits, number * scale),
        None => "—".to_string(),
    };
    for step in json["federation_domains"].as_array().unwrap_or(&empty) {
        let handles = &step["footprint_after"]["handles"];
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {} | {} | {:.1} | {} | {} / {} | {} | {} / {} | {} |",
            step["federation_domains"],
            step["ready"],
            num(&step["create_seconds"]),
            shown(&step["all_ready_seconds"], 1.0, 1),
            shown(&step["all_served_seconds"], 1.0, 1),
            num(&step["footprint_after"]["supervisor_rss_mib"]),
            handles["fds"],
            handles["kube_apiserver"],
            handles["dex"],
            shown(&step["idle_supervisor_cpu_ms_per_second"], 1.0, 2),
            shown(&step["discovery"]["p50_ms"], 1.0, 2),
            shown(&step["discovery"]["p99_ms"], 1.0, 2),
            shown(&step["login_through_newest_ms"], 1.0, 0),
        );
    }
    if let (Some(first), Some(last)) = (scales.first(), scales.last()) {
        let ratio = |path: &dyn Fn(&Value) -> f64| path(last) / path(first).max(1e-9);
        let sessions = ratio(&|scale| num(&scale["stored_before_sweep"]));
        let requests = |scale: &Value, op: &str| {
            scale[op]["secrets_requests_per_op"]
                .as_object()
                .map_or(0.0, |verbs| verbs.values().map(num).sum::<f64>())
        };
        let latency = [
            ratio(&|scale| num(&scale["logins"]["p50_ms"])),
            ratio(&|scale| num(&scale["refreshes"]["p50_ms"])),
            ratio(&|scale| num(&scale["logins"]["supervisor_cpu_us_per_op"])),
            ratio(&|scale| num(&scale["refreshes"]["supervisor_cpu_us_per_op"])),
        ];
        let same_requests = ["logins", "refreshes"]
            .iter()
            .all(|op| (requests(first, op) - requests(last, op)).abs() < 0.5);
        let rss = (
            num(&first["footprint_after"]["supervisor_rss_mib"]),
            num(&last["footprint_after"]["supervisor_rss_mib"]),
        );
        let lists = ratio(&|scale| num(&scale["sweep"]["window"]["secrets_requests"]["LIST"]));
        let reads_expired_only = scales.iter().all(|scale| {
            let window = &scale["sweep"]["window"]["secrets_requests"];
            num(&window["GET"]) <= num(&scale["sweep"]["expired"]) + 0.5
        });
        let _ = writeln!(
            out,
            "\n## Conclusion (computed from the first and the last step)\n\n\
             * Sessions ×{sessions:.1}: login p50 ×{:.2}, refresh p50 ×{:.2}, the Supervisor's CPU per login ×{:.2} \
               and per refresh ×{:.2} — {}. Secret requests per login {:.1} → {:.1}, per refresh {:.1} → {:.1}: {}.\n\
             * Supervisor RSS {:.1} → {:.1} MiB: {}.\n\
             * The sweep: list requests ×{lists:.1} (pages of 500) and duration ×{:.1} ({:.1} ms per 1,000 \
               session Secrets at the last step) — {}; {}.",
            latency[0],
            latency[1],
            latency[2],
            latency[3],
            if latency.iter().all(|r| *r < 1.5) {
                "flat (below ×1.5; the CPU columns count in 10 ms ticks)"
            } else {
                "NOT flat: something per operation grows with the sessions"
            },
            requests(first, "logins"),
            requests(last, "logins"),
            requests(first, "refreshes"),
            requests(last, "refreshes"),
            if same_requests {
                "the same, nothing per operation lists the sessions"
            } else {
                "they differ"
            },
            rss.0,
            rss.1,
            if rss.1 - rss.0 < 10.0 {
                "flat, the sessions are not held in memory"
            } else {
                "it GROWS with the sessions"
            },
            ratio(&|scale| num(&scale["sweep"]["duration_seconds"])),
            num(&last["sweep"]["duration_seconds"]) * 1e6 / num(&last["stored_before_sweep"]).max(1.0),
            if lists < sessions * 1.5 {
                "linear in the sessions, as it must be for a collector that reads every collection time"
            } else {
                "MORE than linear in the sessions"
            },
            if reads_expired_only {
                "only the expired Secrets are read in whole (one get each)"
            } else {
                "it reads more Secrets in whole than expired"
            },
        );
    }
    out
}
