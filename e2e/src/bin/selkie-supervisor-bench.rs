//! `selkie-supervisor-bench`: issue 16's Supervisor performance rows, run by `perf/supervisor`.
//!
//! Starts a real kube-apiserver (with etcd), a real Dex with one user per client, and the
//! Supervisor with an OIDCIdentityProvider for that Dex (the upstream of every login and refresh),
//! waits (bounded) for a quiet machine, warms up, then measures, each phase bounded by a request
//! count and run by a fixed number of concurrent clients:
//!
//! 1. full `cli_password` logins (authorization request with the password headers, then the code
//!    redeemed): the Supervisor's CPU per login, Dex's, and kube-apiserver requests per login;
//! 2. RFC 8693 token exchanges (access token → cluster-audience ID token) over one pooled
//!    connection, then with a new TLS connection each: exchanges per Supervisor CPU-second;
//! 3. refresh grants at the Supervisor, in chains (each refresh spends the token the previous one
//!    returned), each refreshing at Dex inside;
//! 4. Dex's own refresh grant, the same number in the same chains, for the side-by-side ratio;
//! 5. the Supervisor's resident memory idle right after start and idle after the run.
//!
//! CPU is utime + stime from `/proc/PID/stat` before and after each phase, and the machine's busy
//! time from `/proc/stat`: a phase during which other processes took more than `--interference`
//! of the machine is measured again (up to `--attempts`, the least disturbed attempt reported).
//! kube-apiserver requests are the deltas of its `apiserver_request_total`; the Supervisor's own
//! `token_grants_total` must have counted exactly the phase's grants, all `ok`. Every answer is
//! checked (status, token shapes, the exchanged token's audience) and the first bad one fails
//! the run with the answer, so the numbers come from successful operations only. No token or
//! password is ever printed. Writes a markdown report (`--out`) and its raw numbers as JSON beside
//! it. Loopback only.
//!
//! `--flood` measures something else instead (module [`flood`]): whether a flood of wrong
//! `client_secret_basic` secrets for a known OIDCClient slows the Supervisor for everyone else —
//! discovery, `cli_password` logins with their token exchange, and OIDCClients' requests with their
//! correct secrets, each on a new TLS connection, in a baseline window and then in a window of the
//! same length during the flood (perf/results/supervisor-flood.md).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use futures::future::try_join_all;
use selkie_e2e::{
    bench::{
        apiserver_requests, delta, dex_build, handles, parallel, quietly, samples, url_port, wait_for_quiet,
        with_supervisor_log, write_report, Handles, Ports, Process, Quiet, QuietArgs, Requests,
    },
    dex::{Dex, DexUser},
    pinniped_cli::{self, has_audience, jwt_claims, without_tokens, Session},
    supervisor::Supervisor,
    Cluster,
};
use selkie_oidc::https::{HttpsClient, TlsOptions};
use selkie_perf::procstat;
use serde_json::{json, Value};

/// Issue 16's Supervisor benchmark: logins, token exchanges and refreshes side by side with Dex's
/// own refresh grant (perf/README.md, "Supervisor").
#[derive(Debug, Parser)]
struct Args {
    /// Full cli_password logins (authorize + code exchange) to measure.
    #[arg(long, default_value_t = 200)]
    logins: usize,
    /// Token exchanges over pooled connections.
    #[arg(long, default_value_t = 5000)]
    exchanges: usize,
    /// Token exchanges with a new TLS connection each (as a CLI process makes them).
    #[arg(long, default_value_t = 1000)]
    fresh_connection_exchanges: usize,
    /// Sessions whose access tokens the exchanges use, in turn.
    #[arg(long, default_value_t = 4)]
    exchange_sessions: usize,
    /// Refresh grants, at the Supervisor and at Dex each.
    #[arg(long, default_value_t = 300)]
    refreshes: usize,
    /// Concurrent clients in every phase; as many refresh chains and Dex users.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seconds of the idle window that measures background apiserver traffic.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// The wait for a quiet machine and the re-measure of disturbed phases.
    #[command(flatten)]
    quiet: QuietArgs,
    /// The markdown report to write (the JSON goes beside it, `.json`) [default:
    /// perf/results/supervisor.md; with --flood perf/results/supervisor-flood.md].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Instead of the phases above: a baseline window, then a window as long during which
    /// --flood-clients clients send wrong client secrets for one OIDCClient, both measured with
    /// probes on new TLS connections (perf/README.md, "Supervisor: a wrong-client-secret flood").
    #[arg(long)]
    flood: bool,
    /// --flood: clients sending wrong secrets at once, each on a connection of its own.
    #[arg(long, default_value_t = 24)]
    flood_clients: usize,
    /// --flood: seconds of each window (the baseline, then the flood).
    #[arg(long, default_value_t = 20)]
    flood_seconds: u64,
    /// --flood: seconds the flood runs before its window starts, so that the window (probes and
    /// CPU) sees it established: every flooding client's check queued, the 5 s limit reached.
    #[arg(long, default_value_t = 5)]
    flood_lead_seconds: u64,
    /// --flood: most requests one flooding client sends in the window (a bound besides the time).
    #[arg(long, default_value_t = 10_000)]
    flood_max_requests: usize,
    /// --flood: seconds a probe or a flood request may take before it counts as not answered.
    #[arg(long, default_value_t = 10)]
    probe_timeout: u64,
    /// --flood: milliseconds from the start of one discovery probe to the next.
    #[arg(long, default_value_t = 250)]
    discovery_interval_ms: u64,
    /// --flood: milliseconds from the start of one login (+ token exchange) probe to the next.
    #[arg(long, default_value_t = 1000)]
    login_interval_ms: u64,
    /// --flood: milliseconds from the start of one correct-secret token request to the next (per
    /// OIDCClient).
    #[arg(long, default_value_t = 500)]
    secret_interval_ms: u64,
}

/// The password of every Dex user of the bench (a constant, never printed).
const PASSWORD: &str = "bench-password-0123";
/// The FederationDomain's display name of the Dex identity provider.
const IDP_NAME: &str = pinniped_cli::IDP_DISPLAY_NAME;
/// The cluster audience of the token exchanges.
const AUDIENCE: &str = "bench-cluster";
/// The session garbage collector's interval: longer than the run, so no sweep lands in a phase.
const GC_INTERVAL: &str = "1h";
/// The Supervisor's metric of token grants.
const GRANTS_METRIC: &str = "selkie_supervisor_token_grants_total";

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.concurrency > 0, "--concurrency must be positive");
    ensure!(args.exchange_sessions > 0, "--exchange-sessions must be positive");
    selkie_e2e::install_crypto_provider();
    let load_at_start = procstat::load_average()?;

    // The Supervisor harness wants a cluster for the whole process: this one is private to the
    // bench (its processes die with it, and the next harness run sweeps its files).
    let cluster = Cluster::shared().await?;
    let kube = cluster.client().await?;
    let namespace = cluster.create_namespace(&kube, "supervisor-bench").await?;
    // One Dex user per client: Dex keeps one live refresh token per user and OAuth client (a new
    // login of the user revokes the one before), so concurrent refresh chains need a user each.
    let users: Vec<DexUser> = (0..args.concurrency)
        .map(|user| DexUser {
            email: email(user),
            password: PASSWORD.into(),
            user_id: format!("bench-{user:04}"),
            groups: vec!["bench".into(), "seals".into()],
        })
        .collect();
    let dex = Arc::new(Dex::start(&users).await?);
    let mut settings = json!({"sessionGarbageCollectionInterval": GC_INTERVAL});
    // The flood's OIDCClients get their secrets from the aggregated API, as an admin's do.
    let aggregated_port = selkie_e2e::free_port()?;
    if args.flood {
        settings["listen"] = json!({"aggregatedApi": format!("127.0.0.1:{aggregated_port}")});
    }
    let supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        dex.as_ref(),
        IDP_NAME,
        selkie_e2e::free_port()?,
        settings,
    )
    .await?;
    if args.flood {
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from("perf/results/supervisor-flood.md"));
        let results = with_supervisor_log(
            flood::measure(&args, load_at_start, cluster, &dex, &supervisor, aggregated_port).await,
            &supervisor,
        )?;
        write_report(&out, &results.json(), |json_path| results.markdown(json_path))?;
        let wrong = results.wrong_answers();
        ensure!(
            wrong.is_empty(),
            "wrong answers (the report is written):\n{}",
            wrong.join("\n")
        );
        return Ok(());
    }
    let results = with_supervisor_log(
        measure(&args, load_at_start, cluster, kube, &dex, &supervisor).await,
        &supervisor,
    )?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("perf/results/supervisor.md"));
    write_report(&out, &results.json(), |json_path| results.markdown(json_path))
}

/// The email (login name) of the bench's Dex user number `user`.
fn email(user: usize) -> String {
    format!("bench-{user:02}@example.com")
}

/// Every phase, in order, against the running `dex` and `supervisor`, whose users are
/// `email(0..args.concurrency)` (`load_at_start`: the load average before anything started).
async fn measure<'a>(
    args: &'a Args,
    load_at_start: [f64; 3],
    cluster: &Cluster,
    kube: kube::Client,
    dex: &Arc<Dex>,
    supervisor: &Supervisor,
) -> Result<Results<'a>> {
    let supervisor_pid = supervisor.pid();
    let dex_pid = dex.pid().context("Dex is not running")?;
    let [etcd_pid, apiserver_pid] = cluster.pids()[..] else {
        bail!("the cluster has not exactly etcd and kube-apiserver");
    };
    let pids = [
        (Process::Supervisor, supervisor_pid),
        (Process::Dex, dex_pid),
        (Process::Apiserver, apiserver_pid),
        (Process::Etcd, etcd_pid),
    ];
    let bench = Bench {
        http: supervisor.client()?,
        issuer: supervisor.issuer().to_string(),
        token_url: format!("{}/oauth2/token", supervisor.issuer()),
        ca_pem: supervisor.ca_pem(),
    };

    // Idle right after start, before any login.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_idle_start_kib = procstat::rss_kib(supervisor_pid)?;
    let ports = Ports {
        supervisor: url_port(supervisor.issuer())?,
        kube_apiserver: cluster.apiserver_port(),
        dex: url_port(dex.issuer())?,
    };
    let handles_start = handles(supervisor_pid, ports)?;

    // A quiet machine first; then the warm-up (not measured), every client at once: the connection
    // pools to kube-apiserver and Dex grow to what the phases need (and are not left idle long
    // enough to expire), and lazy state is built.
    let quiet = wait_for_quiet(&args.quiet).await?;
    let users = 0..args.concurrency;
    let warm = try_join_all(users.clone().map(|user| {
        let bench = &bench;
        async move { bench.login(&email(user)).await }
    }))
    .await
    .context("warm-up logins")?;
    try_join_all(warm.iter().map(|session| bench.exchange(session)))
        .await
        .context("warm-up token exchanges")?;
    try_join_all(warm.into_iter().map(|session| bench.refresh(session)))
        .await
        .context("warm-up refreshes")?;
    try_join_all(users.map(|user| async move {
        let token = dex_refresh_token(dex, &email(user)).await?;
        dex_refresh(dex, (email(user), token)).await
    }))
    .await
    .context("warm-up refreshes at Dex")?;

    let meter = Meter {
        pids,
        ports,
        kube,
        supervisor,
    };

    // Background: what kube-apiserver serves and the Supervisor spends while nothing happens.
    let before = meter.sample().await?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle = meter.phase("idle", 0, before, &[]).await?;

    // The phases; one with other work on the machine is measured again (see `quietly`).
    let logins = quietly(&args.quiet, || login_phase(&bench, &meter, args)).await?;
    // Token exchanges, pooled, then a new connection each.
    let exchanges = quietly(&args.quiet, || {
        exchange_phase(&bench, &meter, args, args.exchanges, false)
    })
    .await?;
    let fresh = quietly(&args.quiet, || {
        exchange_phase(&bench, &meter, args, args.fresh_connection_exchanges, true)
    })
    .await?;
    let refreshes = quietly(&args.quiet, || refresh_phase(&bench, &meter, args)).await?;
    let dex_refreshes = quietly(&args.quiet, || dex_refresh_phase(dex, &meter, args)).await?;

    // 5. Idle again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(Results {
        args,
        load_at_start,
        quiet,
        kubernetes_version: cluster.kubernetes_version().to_string(),
        dex_build: dex_build()?,
        rss_idle_start_kib,
        rss_idle_end_kib: procstat::rss_kib(supervisor_pid)?,
        handles_start,
        handles_end: handles(supervisor_pid, ports)?,
        idle,
        logins,
        exchanges,
        fresh,
        refreshes,
        dex_refreshes,
    })
}

/// The name of the phase of Dex's own refresh grants.
const DEX_REFRESHES: &str = "Dex's own refreshes";

/// The client side of the Supervisor: one pooled HTTPS client (HTTP/2 by ALPN).
#[derive(Clone)]
struct Bench {
    http: HttpsClient,
    issuer: String,
    token_url: String,
    /// The Supervisor's serving CA, PEM (for clients made per request).
    ca_pem: String,
}

impl Bench {
    /// A full cli_password login of `email`; fails unless it yields all three tokens, the ID
    /// token naming the user.
    async fn login(&self, email: &str) -> Result<Session> {
        pinniped_cli::login_session(&self.http, &self.issuer, IDP_NAME, email, PASSWORD).await
    }

    /// One token exchange of `session`'s access token for an ID token of [`AUDIENCE`] over
    /// `http`; fails unless the answer is a 200 with a JWT from this issuer for that audience
    /// and the session's user.
    async fn exchange_with(&self, http: &HttpsClient, session: &Session) -> Result<()> {
        let (status, answer) =
            pinniped_cli::exchange(http, &self.token_url, AUDIENCE, &session.access).await?;
        ensure!(
            status == 200
                && answer["token_type"] == "N_A"
                && answer["issued_token_type"] == "urn:ietf:params:oauth:token-type:jwt",
            "token exchange: {status}: {}",
            without_tokens(&answer)
        );
        let claims = jwt_claims(answer["access_token"].as_str().unwrap_or_default())?;
        ensure!(
            has_audience(&claims, AUDIENCE)
                && claims["iss"] == self.issuer.as_str()
                && claims["username"] == session.email.as_str(),
            "the exchanged token: iss {}, aud {}, username {}",
            claims["iss"],
            claims["aud"],
            claims["username"]
        );
        Ok(())
    }

    /// [`Bench::exchange_with`] over the pooled client.
    async fn exchange(&self, session: &Session) -> Result<()> {
        self.exchange_with(&self.http, session).await
    }

    /// One refresh grant with `session`'s refresh token; returns the session with the new
    /// tokens after checking the answer is a 200 with a new refresh token, an access token and
    /// an ID token of the session's user.
    async fn refresh(&self, session: Session) -> Result<Session> {
        pinniped_cli::refresh_session(&self.http, &self.token_url, session).await
    }
}

/// Full logins, of every user in turn.
async fn login_phase(bench: &Bench, meter: &Meter<'_>, args: &Args) -> Result<Phase> {
    let next_user = Arc::new(AtomicUsize::new(0));
    let before = meter.sample().await?;
    let done = parallel(args.logins, vec![0usize; args.concurrency], {
        let (bench, users) = (bench.clone(), args.concurrency);
        move |done: usize| {
            let bench = bench.clone();
            let user = next_user.fetch_add(1, Ordering::Relaxed) % users;
            async move {
                bench.login(&email(user)).await?;
                Ok(done + 1)
            }
        }
    })
    .await
    .context("logins")?;
    ensure!(done.iter().sum::<usize>() == args.logins, "logins missing");
    meter
        .phase(
            "logins",
            args.logins,
            before,
            &[("authorization_code", args.logins)],
        )
        .await
}

/// Refresh grants at the Supervisor, one chain per client, each from a new login of its own user
/// (so that its session holds the user's live Dex refresh token).
async fn refresh_phase(bench: &Bench, meter: &Meter<'_>, args: &Args) -> Result<Phase> {
    let mut chains = Vec::with_capacity(args.concurrency);
    for user in 0..args.concurrency {
        chains.push(bench.login(&email(user)).await?);
    }
    let before = meter.sample().await?;
    parallel(args.refreshes, chains, {
        let bench = bench.clone();
        move |session: Session| {
            let bench = bench.clone();
            async move { bench.refresh(session).await }
        }
    })
    .await
    .context("refreshes at the Supervisor")?;
    meter
        .phase(
            "Supervisor refreshes",
            args.refreshes,
            before,
            &[("refresh_token", args.refreshes)],
        )
        .await
}

/// Dex's own refresh grant, as many in the same chains, straight at Dex.
async fn dex_refresh_phase(dex: &Arc<Dex>, meter: &Meter<'_>, args: &Args) -> Result<Phase> {
    let mut chains = Vec::with_capacity(args.concurrency);
    for user in 0..args.concurrency {
        chains.push((email(user), dex_refresh_token(dex, &email(user)).await?));
    }
    let before = meter.sample().await?;
    parallel(args.refreshes, chains, {
        let dex = dex.clone();
        move |chain: (String, String)| {
            let dex = dex.clone();
            async move { dex_refresh(&dex, chain).await }
        }
    })
    .await
    .context("refreshes at Dex")?;
    meter.phase(DEX_REFRESHES, args.refreshes, before, &[]).await
}

/// Token exchanges, pooled or with a new connection each, from `args.exchange_sessions` new
/// sessions (of different users) used in turn.
async fn exchange_phase(
    bench: &Bench,
    meter: &Meter<'_>,
    args: &Args,
    count: usize,
    fresh: bool,
) -> Result<Phase> {
    let mut sessions = Vec::with_capacity(args.exchange_sessions);
    for n in 0..args.exchange_sessions {
        sessions.push(bench.login(&email(n % args.concurrency)).await?);
    }
    let sessions = Arc::new(sessions);
    let next_session = Arc::new(AtomicUsize::new(0));
    let before = meter.sample().await?;
    parallel(count, vec![(); args.concurrency], {
        let bench = bench.clone();
        move |()| {
            let (bench, sessions, next_session) = (bench.clone(), sessions.clone(), next_session.clone());
            async move {
                let session = &sessions[next_session.fetch_add(1, Ordering::Relaxed) % sessions.len()];
                if fresh {
                    // A client of its own: a new TCP connection and TLS handshake, closed after.
                    let http = HttpsClient::new(&TlsOptions {
                        ca_pem: Some(bench.ca_pem.clone().into_bytes()),
                        ..TlsOptions::default()
                    })?;
                    bench.exchange_with(&http, session).await
                } else {
                    bench.exchange(session).await
                }
            }
        }
    })
    .await
    .context("token exchanges")?;
    let name = if fresh {
        "token exchanges, new connection each"
    } else {
        "token exchanges"
    };
    meter
        .phase(name, count, before, &[("token_exchange", count)])
        .await
}

/// A Dex refresh token of `email`, from the password grant with `offline_access`.
async fn dex_refresh_token(dex: &Dex, email: &str) -> Result<String> {
    dex.password_grant_with_scope(email, PASSWORD, "openid offline_access email groups")
        .await?
        .refresh_token
        .context("Dex issued no refresh token for offline_access")
}

/// One refresh grant at Dex of the chain (user's email, refresh token); returns the chain with
/// the next refresh token after checking Dex rotated it and issued an ID token naming the user.
async fn dex_refresh(dex: &Dex, (email, refresh): (String, String)) -> Result<(String, String)> {
    let tokens = dex.refresh_grant(&refresh).await?;
    let next = tokens
        .refresh_token
        .context("Dex's refresh answer has no refresh token")?;
    ensure!(
        next != refresh && !tokens.access_token.is_empty(),
        "Dex's refresh answer does not carry new tokens"
    );
    let claims = jwt_claims(&tokens.id_token)?;
    ensure!(
        claims["email"] == email.as_str(),
        "Dex's refreshed ID token is for {}",
        claims["email"]
    );
    Ok((email, next))
}

/// CPU time (utime + stime) of the measured processes, the bench's clients and the machine.
type Cpu = selkie_e2e::bench::Cpu<Process>;

/// The measured processes and their pids.
type Pids = [(Process, u32); 4];

/// The counters at the start of a phase.
struct Sample {
    at: Instant,
    cpu: Cpu,
    handles: Handles,
    requests: Requests,
    grants: BTreeMap<(String, String), f64>,
}

/// Reads the counters before and after a phase.
struct Meter<'a> {
    pids: Pids,
    ports: Ports,
    kube: kube::Client,
    supervisor: &'a Supervisor,
}

impl Meter<'_> {
    /// Scrapes kube-apiserver's and the Supervisor's metrics, then reads the CPU times and the
    /// clock (so the scrapes fall outside the phase's CPU window).
    async fn sample(&self) -> Result<Sample> {
        let requests = apiserver_requests(&self.kube).await?;
        let grants = grants(&self.supervisor.metrics().await?)?;
        Ok(Sample {
            handles: handles(self.supervisor.pid(), self.ports)?,
            at: Instant::now(),
            cpu: Cpu::of(&self.pids)?,
            requests,
            grants,
        })
    }

    /// The phase since `before`, of `operations` operations. The Supervisor must have counted
    /// exactly `expected` grants (grant type, count) since, every one `ok`, and no other.
    async fn phase(
        &self,
        name: &'static str,
        operations: usize,
        before: Sample,
        expected: &[(&str, usize)],
    ) -> Result<Phase> {
        let wall = before.at.elapsed();
        let cpu = Cpu::of(&self.pids)?.since(&before.cpu);
        let handles = (before.handles, handles(self.supervisor.pid(), self.ports)?);
        let requests = delta(&apiserver_requests(&self.kube).await?, &before.requests);
        let grants = delta(&grants(&self.supervisor.metrics().await?)?, &before.grants);
        let mut counted: Vec<(String, String, usize)> = grants
            .iter()
            .map(|((grant, result), count)| (grant.clone(), result.clone(), count.round() as usize))
            .collect();
        counted.sort();
        let mut wanted: Vec<(String, String, usize)> = expected
            .iter()
            .map(|(grant, count)| (grant.to_string(), "ok".to_string(), *count))
            .collect();
        wanted.sort();
        ensure!(
            counted == wanted,
            "{name}: the Supervisor counted the grants {counted:?}, not {wanted:?}"
        );
        Ok(Phase {
            name,
            attempt: 1,
            operations,
            wall,
            cpu,
            requests,
            extra: handles,
        })
    }
}

/// The Supervisor's grant counter: (grant type, result) → count.
fn grants(text: &str) -> Result<BTreeMap<(String, String), f64>> {
    let mut grants = BTreeMap::new();
    for (labels, value) in samples(text, GRANTS_METRIC)? {
        let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
        *grants.entry((label("grant_type"), label("result"))).or_default() += value;
    }
    Ok(grants)
}

/// One measured phase; `extra` is what the Supervisor held open at the start and at the end.
type Phase = selkie_e2e::bench::Phase<Process, (Handles, Handles)>;

/// The JSON of `phase`, given the idle window `idle`.
fn phase_json(phase: &Phase, idle: &Phase) -> Value {
    let us = |d: Duration| (phase.micros_per_op(d) * 10.0).round() / 10.0;
    let idle_rate = idle.requests(None, None) / idle.wall.as_secs_f64();
    json!({
        "operations": phase.operations,
        "wall_seconds": phase.wall.as_secs_f64(),
        "per_wall_second": phase.per_second(phase.wall),
        "cpu_seconds": {
            "supervisor": phase.cpu[Process::Supervisor].as_secs_f64(),
            "dex": phase.cpu[Process::Dex].as_secs_f64(),
            "kube_apiserver": phase.cpu[Process::Apiserver].as_secs_f64(),
            "etcd": phase.cpu[Process::Etcd].as_secs_f64(),
            "bench_clients": phase.cpu.bench.as_secs_f64(),
            "machine_busy": phase.cpu.machine.as_secs_f64(),
            "other_processes": phase.cpu.others().as_secs_f64(),
        },
        "other_processes_share_of_machine": phase.others_share(),
        "attempt": phase.attempt,
        "supervisor_open": {"start": phase.extra.0, "end": phase.extra.1},
        "cpu_us_per_op": {
            "supervisor": us(phase.cpu[Process::Supervisor]),
            "dex": us(phase.cpu[Process::Dex]),
            "kube_apiserver": us(phase.cpu[Process::Apiserver]),
            "etcd": us(phase.cpu[Process::Etcd]),
        },
        "per_supervisor_cpu_second": phase.per_second(phase.cpu[Process::Supervisor]),
        "apiserver_requests": phase.requests.iter().map(|((resource, verb, code), count)| json!({
            "resource": resource, "verb": verb, "code": code, "count": count,
        })).collect::<Vec<_>>(),
        "apiserver_requests_per_op": {
            "secrets": phase.requests_per_op(Some("secrets"), None),
            "all": phase.requests_per_op(None, None),
            "all_less_idle_rate": (phase.requests(None, None) - idle_rate * phase.wall.as_secs_f64())
                / phase.operations.max(1) as f64,
        },
    })
}

/// Everything measured.
struct Results<'a> {
    args: &'a Args,
    load_at_start: [f64; 3],
    quiet: Quiet,
    kubernetes_version: String,
    dex_build: String,
    rss_idle_start_kib: u64,
    rss_idle_end_kib: u64,
    handles_start: Handles,
    handles_end: Handles,
    idle: Phase,
    logins: Phase,
    exchanges: Phase,
    fresh: Phase,
    refreshes: Phase,
    dex_refreshes: Phase,
}

/// Issue 16's targets.
const TARGET_EXCHANGES_PER_CPU_SECOND: f64 = 3000.0;
const TARGET_REFRESH_RATIO: f64 = 0.5;
const TARGET_IDLE_RSS_MIB: f64 = 30.0;

impl Results<'_> {
    fn phases(&self) -> [&Phase; 5] {
        [
            &self.logins,
            &self.exchanges,
            &self.fresh,
            &self.refreshes,
            &self.dex_refreshes,
        ]
    }

    fn exchanges_per_cpu_second(&self) -> f64 {
        self.exchanges.per_second(self.exchanges.cpu[Process::Supervisor])
    }

    /// The Supervisor's CPU per refresh ÷ Dex's CPU per refresh of its own.
    fn refresh_ratio(&self) -> f64 {
        self.refreshes
            .micros_per_op(self.refreshes.cpu[Process::Supervisor])
            / self
                .dex_refreshes
                .micros_per_op(self.dex_refreshes.cpu[Process::Dex])
    }

    fn mib(kib: u64) -> f64 {
        kib as f64 / 1024.0
    }

    fn json(&self) -> Value {
        let machine = selkie_perf::process::Machine::describe();
        json!({
            "machine": {
                "cpu_model": machine.cpu_model,
                "cores": machine.cores,
                "kernel": machine.kernel,
                "memory": machine.memory,
                "rustc": machine.rustc,
                "load_at_start": self.load_at_start,
                "quiet_before_phases": self.quiet,
            },
            "kubernetes_version": self.kubernetes_version,
            "dex_build": self.dex_build,
            "concurrency": self.args.concurrency,
            "exchange_sessions": self.args.exchange_sessions,
            "gc_interval": GC_INTERVAL,
            "rss_kib": {"idle_after_start": self.rss_idle_start_kib, "idle_after_run": self.rss_idle_end_kib},
            "open": {"idle_after_start": self.handles_start, "idle_after_run": self.handles_end},
            "idle": {
                "seconds": self.idle.wall.as_secs_f64(),
                "supervisor_cpu_seconds": self.idle.cpu[Process::Supervisor].as_secs_f64(),
                "apiserver_requests": self.idle.requests.iter().map(|((resource, verb, code), count)| json!({
                    "resource": resource, "verb": verb, "code": code, "count": count,
                })).collect::<Vec<_>>(),
            },
            "phases": {
                "logins": phase_json(&self.logins, &self.idle),
                "token_exchanges": phase_json(&self.exchanges, &self.idle),
                "token_exchanges_new_connection": phase_json(&self.fresh, &self.idle),
                "supervisor_refreshes": phase_json(&self.refreshes, &self.idle),
                "dex_refreshes": phase_json(&self.dex_refreshes, &self.idle),
            },
            "targets": {
                "exchanges_per_supervisor_cpu_second": {
                    "value": self.exchanges_per_cpu_second(), "target": TARGET_EXCHANGES_PER_CPU_SECOND,
                    "met": self.exchanges_per_cpu_second() >= TARGET_EXCHANGES_PER_CPU_SECOND,
                },
                "refresh_cpu_supervisor_over_dex": {
                    "value": self.refresh_ratio(), "target": TARGET_REFRESH_RATIO,
                    "met": self.refresh_ratio() <= TARGET_REFRESH_RATIO,
                },
                "idle_rss_mib_after_start": {
                    "value": Self::mib(self.rss_idle_start_kib), "target": TARGET_IDLE_RSS_MIB,
                    "met": Self::mib(self.rss_idle_start_kib) <= TARGET_IDLE_RSS_MIB,
                },
                "idle_rss_mib_after_run": {
                    "value": Self::mib(self.rss_idle_end_kib), "target": TARGET_IDLE_RSS_MIB,
                    "met": Self::mib(self.rss_idle_end_kib) <= TARGET_IDLE_RSS_MIB,
                },
            },
        })
    }

    fn markdown(&self, json_path: &std::path::Path) -> String {
        use std::fmt::Write as _;
        let machine = selkie_perf::process::Machine::describe();
        let met = |ok: bool| if ok { "yes" } else { "**no**" };
        let mut md = String::new();
        let a = self.args;
        let _ = write!(
            md,
            "# Supervisor: token exchange, refresh and login cost\n\n\
             Issue 16's targets: **≥ 3,000 token exchanges per Supervisor CPU-second**, **refresh CPU ≤ ½ of \
             Dex's**, **idle RSS ≤ 30 MiB**.\n\n\
             * Command: `perf/supervisor` (release build of `selkie-supervisor`): {} logins, {} token \
               exchanges over pooled connections and {} with a new TLS connection each (from {} sessions \
               in turn), {} refresh grants at the Supervisor and {} at Dex, each phase by {} concurrent \
               clients on loopback. Every answer checked (a 200 with the expected tokens; the exchanged \
               token's audience, issuer and user); the Supervisor's own `token_grants_total` counted \
               exactly each phase's grants, all `ok`.\n\
             * Components: kube-apiserver {} with etcd (the e2e harness: `--unsafe-no-fsync`), Dex {} as \
               the upstream OIDC provider (the real IdP the harness has; the issue's \"perf IdP\" is the \
               benchmark's upstream), the Supervisor with one FederationDomain and one OIDCIdentityProvider \
               (password grant allowed, `offline_access`), sessions in Secrets, garbage collector every {} \
               (so no sweep lands in a phase).\n\
             * Machine: {} ({}), {}, {} RAM; load average at start {:.2} / {:.2} / {:.2}; before the \
               warm-up the machine was {:.0} % busy over 5 s ({}, after {:.0} s of waiting). Every process \
               (kube-apiserver, etcd, Dex, the Supervisor, the clients) shares the two cores, unpinned; \
               the last column below is the CPU that other processes took during each phase.\n\n",
            a.logins,
            a.exchanges,
            a.fresh_connection_exchanges,
            a.exchange_sessions,
            a.refreshes,
            a.refreshes,
            a.concurrency,
            self.kubernetes_version,
            self.dex_build,
            GC_INTERVAL,
            machine.cpu_model,
            machine.cores,
            machine.kernel,
            machine.memory,
            self.load_at_start[0],
            self.load_at_start[1],
            self.load_at_start[2],
            self.quiet.busy * 100.0,
            if self.quiet.quiet {
                "quiet"
            } else {
                "**not quiet**"
            },
            self.quiet.waited_seconds,
        );
        let ratio = self.refresh_ratio();
        let (rss_start, rss_end) = (
            Self::mib(self.rss_idle_start_kib),
            Self::mib(self.rss_idle_end_kib),
        );
        let _ = write!(
            md,
            "## Targets\n\n\
             | metric | value | target | met? |\n|---|---|---|---|\n\
             | token exchanges per Supervisor CPU-second (pooled connection) | {:.0} | ≥ 3,000 | {} |\n\
             | Supervisor CPU per refresh ÷ Dex's CPU per refresh grant | {:.2} ({:.0} µs ÷ {:.0} µs) | ≤ 0.5 | {} |\n\
             | Supervisor idle RSS, right after start | {:.1} MiB | ≤ 30 MiB | {} |\n\
             | Supervisor idle RSS, 5 s after the run | {:.1} MiB | ≤ 30 MiB | {} |\n\n",
            self.exchanges_per_cpu_second(),
            met(self.exchanges_per_cpu_second() >= TARGET_EXCHANGES_PER_CPU_SECOND),
            ratio,
            self.refreshes.micros_per_op(self.refreshes.cpu[Process::Supervisor]),
            self.dex_refreshes.micros_per_op(self.dex_refreshes.cpu[Process::Dex]),
            met(ratio <= TARGET_REFRESH_RATIO),
            rss_start,
            met(rss_start <= TARGET_IDLE_RSS_MIB),
            rss_end,
            met(rss_end <= TARGET_IDLE_RSS_MIB),
        );
        md.push_str(
            "## CPU per operation\n\n\
             | phase | operations | wall | per wall second | Supervisor CPU µs/op | per Supervisor CPU-second \
             | Dex CPU µs/op | kube-apiserver CPU µs/op | etcd CPU µs/op | other processes, % of the machine |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
        );
        for phase in self.phases() {
            let supervisor = if phase.name == DEX_REFRESHES {
                "—".to_string()
            } else {
                format!("{:.0}", phase.per_second(phase.cpu[Process::Supervisor]))
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} s | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {:.0} %{} |",
                phase.name,
                phase.operations,
                phase.wall.as_secs_f64(),
                phase.per_second(phase.wall),
                phase.micros_per_op(phase.cpu[Process::Supervisor]),
                supervisor,
                phase.micros_per_op(phase.cpu[Process::Dex]),
                phase.micros_per_op(phase.cpu[Process::Apiserver]),
                phase.micros_per_op(phase.cpu[Process::Etcd]),
                phase.others_share() * 100.0,
                if phase.attempt > 1 {
                    format!(" (attempt {})", phase.attempt)
                } else {
                    String::new()
                },
            );
        }
        // Secrets verbs any phase used, in a fixed order.
        let verbs: Vec<String> = ["GET", "LIST", "POST", "PUT", "PATCH", "DELETE", "WATCH"]
            .into_iter()
            .filter(|verb| {
                self.phases()
                    .iter()
                    .any(|phase| phase.requests(Some("secrets"), Some(verb)) > 0.0)
            })
            .map(str::to_string)
            .collect();
        let idle_seconds = self.idle.wall.as_secs_f64();
        let idle_rate = self.idle.requests(None, None) / idle_seconds;
        let _ = write!(
            md,
            "\n## kube-apiserver requests per operation\n\n\
             From kube-apiserver's `apiserver_request_total` before and after each phase. Only the \
             Supervisor touches Secrets here (no controller-manager runs), so the `secrets` columns are \
             its session storage. \"All\" counts every request kube-apiserver served in the phase: \
             the Supervisor's, the bench's one `/metrics` scrape, and background traffic (leases, \
             kube-apiserver's own); the last column subtracts the idle window's rate ({:.1} requests/s \
             over {:.0} s, below). The Supervisor's kube client speaks HTTP/2 (its requests and \
             watches share a connection); the last column is how many connections to kube-apiserver it \
             held at the phase's start and end (the watches' included).\n\n\
             | phase |{} secrets, all | all requests | all, less the idle rate | Supervisor → kube-apiserver connections |\n\
             |---|{}---|---|---|---|\n",
            idle_rate,
            idle_seconds,
            verbs
                .iter()
                .map(|verb| format!(" secrets {verb} |"))
                .collect::<String>(),
            "---|".repeat(verbs.len()),
        );
        for phase in self.phases() {
            let by_verb: String = verbs
                .iter()
                .map(|verb| format!(" {:.2} |", phase.requests_per_op(Some("secrets"), Some(verb))))
                .collect();
            let _ = writeln!(
                md,
                "| {} |{} {:.2} | {:.2} | {:.2} | {} → {} |",
                phase.name,
                by_verb,
                phase.requests_per_op(Some("secrets"), None),
                phase.requests_per_op(None, None),
                (phase.requests(None, None) - idle_rate * phase.wall.as_secs_f64()) / phase.operations as f64,
                phase.extra.0.kube_apiserver,
                phase.extra.1.kube_apiserver,
            );
        }
        let idle_requests: String = self
            .idle
            .requests
            .iter()
            .map(|((resource, verb, code), count)| format!("{resource} {verb} {code}: {count}"))
            .collect::<Vec<_>>()
            .join("; ");
        let _ = write!(
            md,
            "\nIdle window ({:.0} s, after the warm-up, before the logins): the Supervisor used {:.0} ms of CPU; \
             kube-apiserver served {}.\n\n\
             The Supervisor held {} file descriptors idle after start ({} connections from clients, {} to \
             kube-apiserver, {} to Dex) and {} idle after the run ({} from clients, {} to kube-apiserver, {} to Dex).\n\n",
            idle_seconds,
            self.idle.cpu[Process::Supervisor].as_secs_f64() * 1000.0,
            if idle_requests.is_empty() {
                "nothing".to_string()
            } else {
                idle_requests
            },
            self.handles_start.fds,
            self.handles_start.inbound,
            self.handles_start.kube_apiserver,
            self.handles_start.dex,
            self.handles_end.fds,
            self.handles_end.inbound,
            self.handles_end.kube_apiserver,
            self.handles_end.dex,
        );
        let _ = write!(
            md,
            "## Reading the numbers\n\n\
             * A login is an authorization request (the Supervisor logs in at Dex with the password \
               grant, whose bcrypt check is most of Dex's CPU per login, and stores the login's Secret with \
               the code) and the code's redemption (tokens minted, recorded in the login's Secret by one \
               conditional patch). A Supervisor refresh reads the login's Secret, refreshes at Dex and \
               writes the next generation of tokens into it (one conditional write); Dex's CPU in that row is the upstream refresh \
               the Supervisor makes. The Dex row is Dex's own refresh grant from the bench (the confidential \
               client, `offline_access` from the password grant), the denominator of the ratio.\n\
             * Pooled: all clients share one HTTP/2 connection to the Supervisor. New connection: a TLS \
               handshake (ECDSA P-256) per exchange, as a CLI process that exchanges once and exits makes.\n\
             * CPU is utime + stime from `/proc/PID/stat` (10 ms ticks: ±10 ms per process per phase). \
               \"Other processes\" is the machine's busy time (`/proc/stat`) less the bench's processes: \
               a phase where it exceeded {:.0} % was measured again after waiting for a quiet machine \
               (up to {} attempts; the least disturbed one is shown, its number in parentheses when not \
               the first).\n\
             * Raw numbers: `{}`.\n",
            self.args.quiet.interference * 100.0,
            self.args.quiet.attempts,
            json_path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        md
    }
}

/// `--flood`: does a flood of wrong client secrets for one OIDCClient slow the Supervisor for
/// everyone else?
///
/// Two OIDCClients get a secret each through the aggregated API (an OIDCClientSecretRequest made
/// with `kubectl create`, as an admin makes it): the *flooded* one, whose ID the flood names (client
/// IDs are public), and a *bystander*. Then two windows of `--flood-seconds` each, the baseline and
/// the flood, in which paced probes, each on a new TCP connection and TLS handshake, measure:
/// OIDC discovery; a `cli_password` login of the pinniped CLI with its RFC 8693 token exchange;
/// and a token request of each OIDCClient with its correct secret (HTTP Basic, a made-up code: the
/// answer is `invalid_grant` once the secret is accepted). Between the windows both clients'
/// secrets are replaced (`generateNewSecret` and `revokeOldSecrets`), so each window's first
/// request with a correct secret costs one bcrypt check, and the later ones are recognised by
/// their digest. From `--flood-lead-seconds` before the flood window (so that the window sees the
/// flood established) to its end, `--flood-clients` clients, each on a connection of its own, post
/// `grant_type=authorization_code` with Basic `<flooded client ID>:<a random 64-hex secret>` one
/// after the other; each answer must be 401 `invalid_client` or 503
/// `temporarily_unavailable`. Every loop is bounded by a count and by the window; every request
/// by `--probe-timeout`.
mod flood {
    use std::{
        collections::BTreeMap,
        future::Future,
        time::{Duration, Instant},
    };

    use anyhow::{ensure, Context, Result};
    use base64::Engine as _;
    use bytes::Bytes;
    use selkie_e2e::{
        bench::{delta, dex_build, wait_for_quiet, Quiet},
        dex::Dex,
        kubectl::Kubectl,
        pinniped_cli,
        supervisor::{Supervisor, CLIENT_SECRET_API_SERVICE},
        Cluster,
    };
    use selkie_oidc::https::{HttpsClient, TlsOptions};
    use selkie_perf::procstat;
    use serde_json::{json, Value};
    use sha2::Digest as _;
    use tokio::task::JoinSet;

    use super::{email, grants, Args, Bench, Cpu, Pids, Process, GC_INTERVAL, IDP_NAME, PASSWORD};

    /// The OIDCClient the flood names.
    const FLOODED: &str = "client.oauth.pinniped.dev-bench-flooded";
    /// An OIDCClient nobody floods.
    const BYSTANDER: &str = "client.oauth.pinniped.dev-bench-bystander";
    /// The OIDCClients' redirect URI (never followed: no login of theirs happens).
    const CLIENT_REDIRECT: &str = "http://127.0.0.1:48125/auth/callback";
    /// The probes, in the report's order.
    const DISCOVERY: &str = "OIDC discovery";
    const LOGIN: &str = "cli_password login + token exchange";
    const FLOODED_SECRET: &str = "flooded client, correct secret";
    const BYSTANDER_SECRET: &str = "second client, correct secret";
    const PROBES: [&str; 4] = [DISCOVERY, LOGIN, FLOODED_SECRET, BYSTANDER_SECRET];

    /// How one probe ended.
    #[derive(Debug, Clone, PartialEq)]
    enum Outcome {
        /// The expected answer.
        Ok,
        /// 503 `temporarily_unavailable` (only a client-secret check may answer it).
        Busy,
        /// No answer within `--probe-timeout`.
        Timeout,
        /// Anything else: the answer, shortened (never a token or secret).
        Wrong(String),
    }

    impl Outcome {
        fn name(&self) -> String {
            match self {
                Outcome::Ok => "ok".into(),
                Outcome::Busy => "503 temporarily_unavailable".into(),
                Outcome::Timeout => "no answer".into(),
                Outcome::Wrong(what) => format!("wrong: {what}"),
            }
        }
    }

    /// One probe: when it started (from the window's start), how long it took, how it ended and,
    /// for the login, its parts.
    #[derive(Debug, Clone)]
    struct Sample {
        offset: Duration,
        latency: Duration,
        outcome: Outcome,
        parts: Vec<(&'static str, Duration)>,
    }

    impl Sample {
        /// Its latency, `None` when it was not answered (longer than any answer).
        fn answered_in(&self) -> Option<Duration> {
            (self.outcome != Outcome::Timeout).then_some(self.latency)
        }
    }

    /// What the probes and the flooding clients need, cloned into each task.
    #[derive(Clone)]
    struct Ctx {
        bench: Bench,
        /// The OIDCClients' current secrets (never printed).
        flooded_secret: String,
        bystander_secret: String,
        /// Dex users the logins take in turn.
        users: usize,
    }

    impl Ctx {
        /// A client of its own: its first request opens a new TCP connection and TLS handshake.
        fn new_client(&self) -> Result<HttpsClient> {
            Ok(HttpsClient::new(&TlsOptions {
                ca_pem: Some(self.bench.ca_pem.clone().into_bytes()),
                ..TlsOptions::default()
            })?)
        }
    }

    /// A token request at `token_url` with a made-up authorization code, authenticated as
    /// `client_id` with `secret` by HTTP Basic (`None`: no authentication, `client_id` in the
    /// body). The status, `error` and `error_description`.
    async fn client_token_request(
        http: &HttpsClient,
        token_url: &str,
        client_id: &str,
        secret: Option<&str>,
    ) -> Result<(u16, String, String)> {
        let verifier = "v".repeat(43);
        let mut pairs = vec![
            ("grant_type", "authorization_code"),
            ("code", "pin_ac_x.y"),
            ("redirect_uri", CLIENT_REDIRECT),
            ("code_verifier", verifier.as_str()),
        ];
        let mut headers = vec![(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-www-form-urlencoded"),
        )];
        match secret {
            // RFC 6749 §2.3.1: both form-encoded (the IDs and hex secrets here are unchanged by it).
            Some(secret) => {
                let basic = base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}"));
                headers.push((
                    http::header::AUTHORIZATION,
                    http::HeaderValue::from_str(&format!("Basic {basic}"))?,
                ));
            }
            None => pairs.push(("client_id", client_id)),
        }
        let form = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        let response = http
            .send(
                http::Method::POST,
                token_url,
                &headers,
                Bytes::from(form),
                1 << 16,
                None,
            )
            .await?;
        let answer: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        let field = |name: &str| answer[name].as_str().unwrap_or_default().to_string();
        Ok((
            response.status.as_u16(),
            field("error"),
            field("error_description"),
        ))
    }

    /// A wrong secret: 64 hex digits, SHA-256 of the window's random seed, the client and the
    /// request number (never the real one: that would take guessing 256 bits).
    fn wrong_secret(seed: &[u8; 32], client: usize, n: usize) -> String {
        sha2::Sha256::new()
            .chain_update(seed)
            .chain_update(client.to_le_bytes())
            .chain_update(n.to_le_bytes())
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// Runs `op` (numbered) from `start` on, one at a time, each started `interval` after the
    /// previous one started (or as soon as it ended, when it took longer), until `deadline`:
    /// at most one more than `deadline − start` over `interval` probes. A probe taking longer
    /// than `timeout` is not answered.
    async fn probe_loop<F, Fut>(
        start: Instant,
        deadline: Instant,
        interval: Duration,
        timeout: Duration,
        op: F,
    ) -> Vec<Sample>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = (Outcome, Vec<(&'static str, Duration)>)>,
    {
        let most = (deadline.saturating_duration_since(start).as_millis() / interval.as_millis().max(1))
            as usize
            + 1;
        let mut samples = Vec::with_capacity(most);
        let mut next = start;
        for n in 0..most {
            tokio::time::sleep_until(next.into()).await;
            let began = Instant::now();
            if began >= deadline {
                break;
            }
            let (outcome, parts) = match tokio::time::timeout(timeout, op(n)).await {
                Ok(done) => done,
                Err(_) => (Outcome::Timeout, Vec::new()),
            };
            samples.push(Sample {
                offset: began - start,
                latency: began.elapsed(),
                outcome,
                parts,
            });
            next = began + interval;
        }
        samples
    }

    /// GET the discovery document on a new connection; it must name the issuer.
    async fn discovery(ctx: Ctx) -> (Outcome, Vec<(&'static str, Duration)>) {
        let result = async {
            let http = ctx.new_client()?;
            let url = format!("{}/.well-known/openid-configuration", ctx.bench.issuer);
            let body = http.get_json(&url, 64 * 1024, None).await?;
            let document: Value = serde_json::from_slice(&body)?;
            ensure!(
                document["issuer"] == ctx.bench.issuer.as_str(),
                "the discovery document's issuer is {}",
                document["issuer"]
            );
            anyhow::Ok(())
        }
        .await;
        (outcome_of(result), Vec::new())
    }

    /// A whole `cli_password` login of user `n` (modulo the users) on a new connection, then the
    /// token exchange of its access token on the same connection, as one CLI process makes them;
    /// every answer checked.
    async fn login(ctx: Ctx, n: usize) -> (Outcome, Vec<(&'static str, Duration)>) {
        let mut parts = Vec::new();
        let result = async {
            let http = ctx.new_client()?;
            let email = email(n % ctx.users);
            let began = Instant::now();
            let session =
                pinniped_cli::login_session(&http, &ctx.bench.issuer, IDP_NAME, &email, PASSWORD).await?;
            parts.push(("login", began.elapsed()));
            let began = Instant::now();
            ctx.bench.exchange_with(&http, &session).await?;
            parts.push(("exchange", began.elapsed()));
            anyhow::Ok(())
        }
        .await;
        (outcome_of(result), parts)
    }

    /// A token request of `client_id` with its correct `secret` on a new connection: accepted
    /// (then `invalid_grant`, the code being made up) or 503 `temporarily_unavailable`.
    async fn correct_secret(
        ctx: Ctx,
        client_id: &'static str,
        secret: String,
    ) -> (Outcome, Vec<(&'static str, Duration)>) {
        let result = async {
            let http = ctx.new_client()?;
            client_token_request(&http, &ctx.bench.token_url, client_id, Some(&secret)).await
        }
        .await;
        let outcome = match result {
            Ok((400, error, _)) if error == "invalid_grant" => Outcome::Ok,
            Ok((503, error, _)) if error == "temporarily_unavailable" => Outcome::Busy,
            Ok((status, error, _)) => Outcome::Wrong(format!("{status} {error}")),
            Err(error) => Outcome::Wrong(short(&format!("{error:#}"))),
        };
        (outcome, Vec::new())
    }

    fn outcome_of(result: Result<()>) -> Outcome {
        match result {
            Ok(()) => Outcome::Ok,
            Err(error) => Outcome::Wrong(short(&format!("{error:#}"))),
        }
    }

    /// The first 300 characters of an error, on one line.
    fn short(text: &str) -> String {
        text.replace('\n', " ").chars().take(300).collect()
    }

    /// What the flooding clients got.
    #[derive(Debug, Default)]
    struct Flood {
        clients: usize,
        /// From the first flood request to the window's deadline (the lead and the window).
        wall: Duration,
        sent: usize,
        /// 401 answers that came within the window (each the end of one bcrypt check there).
        refused_in_window: usize,
        /// Latencies of the 401 `invalid_client` answers.
        refused: Vec<Duration>,
        /// Latencies of the 503 `temporarily_unavailable` answers.
        busy: Vec<Duration>,
        timeouts: usize,
        /// Any other answer or failure, and the first few of them.
        other: usize,
        others: Vec<String>,
    }

    impl Flood {
        fn add(&mut self, other: Flood) {
            self.sent += other.sent;
            self.refused_in_window += other.refused_in_window;
            self.refused.extend(other.refused);
            self.busy.extend(other.busy);
            self.timeouts += other.timeouts;
            self.other += other.other;
            for what in other.others {
                if self.others.len() < 5 {
                    self.others.push(what);
                }
            }
        }
    }

    /// One flooding client: on a connection of its own, wrong secrets for [`FLOODED`] one after
    /// the other until `deadline` or `most` requests (the window starting at `start`).
    async fn flooder(
        ctx: Ctx,
        client: usize,
        seed: [u8; 32],
        (start, deadline): (Instant, Instant),
        most: usize,
        timeout: Duration,
    ) -> Result<Flood> {
        let http = ctx.new_client()?;
        let mut flood = Flood::default();
        for n in 0..most {
            if Instant::now() >= deadline {
                break;
            }
            let secret = wrong_secret(&seed, client, n);
            flood.sent += 1;
            let began = Instant::now();
            let answer = tokio::time::timeout(
                timeout,
                client_token_request(&http, &ctx.bench.token_url, FLOODED, Some(&secret)),
            )
            .await;
            let took = began.elapsed();
            let other = match answer {
                Err(_) => {
                    flood.timeouts += 1;
                    None
                }
                Ok(Ok((401, error, _))) if error == "invalid_client" => {
                    flood.refused.push(took);
                    if Instant::now() >= start {
                        flood.refused_in_window += 1;
                    }
                    None
                }
                Ok(Ok((503, error, _))) if error == "temporarily_unavailable" => {
                    flood.busy.push(took);
                    None
                }
                Ok(Ok((status, error, _))) => Some(format!("{status} {error}")),
                Ok(Err(error)) => Some(short(&format!("{error:#}"))),
            };
            if let Some(other) = other {
                flood.other += 1;
                if flood.others.len() < 5 {
                    flood.others.push(other);
                }
            }
        }
        Ok(flood)
    }

    /// One measured window.
    struct Window {
        name: &'static str,
        flooding: bool,
        /// Which attempt this is (a window disturbed by other processes is measured again).
        attempt: usize,
        quiet: Quiet,
        /// From the start to the deadline (the CPU window).
        wall: Duration,
        /// From the deadline until the last request in flight ended.
        drain: Duration,
        cpu: Cpu,
        probes: Vec<(&'static str, Vec<Sample>)>,
        flood: Flood,
        /// The Supervisor's `token_grants_total` moves, (grant type, result) → count, from the
        /// start until everything ended.
        grants: BTreeMap<(String, String), f64>,
        /// The Supervisor's threads and resident memory at the deadline.
        threads: u64,
        rss_kib: u64,
    }

    /// Waits for a quiet machine, then runs the probes (and, when `flooding`, the flood) for
    /// `--flood-seconds`; then waits (bounded) for the requests still in flight.
    async fn window(
        name: &'static str,
        flooding: bool,
        ctx: &Ctx,
        args: &Args,
        pids: &Pids,
        supervisor: &Supervisor,
    ) -> Result<Window> {
        let quiet = wait_for_quiet(&args.quiet).await?;
        eprintln!("{name} window: {} s", args.flood_seconds);
        let timeout = Duration::from_secs(args.probe_timeout);
        let seed = selkie_e2e::bench::random_seed()?;
        let grants_before = grants(&supervisor.metrics().await?)?;
        let flood_start = Instant::now();
        let start = flood_start
            + if flooding {
                Duration::from_secs(args.flood_lead_seconds)
            } else {
                Duration::ZERO
            };
        let deadline = start + Duration::from_secs(args.flood_seconds);

        let mut flooders = JoinSet::new();
        if flooding {
            for client in 0..args.flood_clients {
                flooders.spawn(flooder(
                    ctx.clone(),
                    client,
                    seed,
                    (start, deadline),
                    args.flood_max_requests,
                    timeout,
                ));
            }
        }
        tokio::time::sleep_until(start.into()).await;
        let cpu_before = Cpu::of(pids)?;
        let every = Duration::from_millis;
        let mut probes = JoinSet::new();
        {
            let ctx = ctx.clone();
            let interval = every(args.discovery_interval_ms);
            probes.spawn(async move {
                let samples =
                    probe_loop(start, deadline, interval, timeout, |_| discovery(ctx.clone())).await;
                (DISCOVERY, samples)
            });
        }
        {
            let ctx = ctx.clone();
            let interval = every(args.login_interval_ms);
            probes.spawn(async move {
                let samples = probe_loop(start, deadline, interval, timeout, |n| login(ctx.clone(), n)).await;
                (LOGIN, samples)
            });
        }
        for (probe, client_id, secret) in [
            (FLOODED_SECRET, FLOODED, ctx.flooded_secret.clone()),
            (BYSTANDER_SECRET, BYSTANDER, ctx.bystander_secret.clone()),
        ] {
            let ctx = ctx.clone();
            let interval = every(args.secret_interval_ms);
            probes.spawn(async move {
                let samples = probe_loop(start, deadline, interval, timeout, |_| {
                    correct_secret(ctx.clone(), client_id, secret.clone())
                })
                .await;
                (probe, samples)
            });
        }

        tokio::time::sleep_until(deadline.into()).await;
        let cpu = Cpu::of(pids)?.since(&cpu_before);
        let wall = start.elapsed();
        let (threads, rss_kib) = (
            procstat::threads(supervisor.pid())?,
            procstat::rss_kib(supervisor.pid())?,
        );
        // Every request started before the deadline ends within the timeout (a login's two
        // requests and exchange within one), so this wait is bounded.
        let (flood, mut by_name) = tokio::time::timeout(timeout * 2 + Duration::from_secs(5), async {
            let mut flood = Flood {
                clients: if flooding { args.flood_clients } else { 0 },
                wall: deadline - flood_start,
                ..Flood::default()
            };
            while let Some(one) = flooders.join_next().await {
                flood.add(one.context("a flooding client ended abnormally")??);
            }
            let mut by_name = BTreeMap::new();
            while let Some(probe) = probes.join_next().await {
                let (name, samples) = probe.context("a probe ended abnormally")?;
                by_name.insert(name, samples);
            }
            anyhow::Ok((flood, by_name))
        })
        .await
        .context("the window's requests did not end within twice the probe timeout")??;
        let drain = start.elapsed() - wall;
        let grants = delta(&grants(&supervisor.metrics().await?)?, &grants_before);
        Ok(Window {
            name,
            flooding,
            attempt: 1,
            quiet,
            wall,
            drain,
            cpu,
            probes: PROBES
                .iter()
                .map(|name| (*name, by_name.remove(name).unwrap_or_default()))
                .collect(),
            flood,
            grants,
            threads,
            rss_kib,
        })
    }

    /// `kubectl create` of an OIDCClientSecretRequest for `client`: its JSON answer.
    async fn secret_request(
        kubectl: &Kubectl,
        namespace: &str,
        client: &str,
        generate: bool,
        revoke: bool,
    ) -> Result<Value> {
        kubectl
            .create_client_secret_request(namespace, client, generate, revoke)
            .await?
            .map_err(|stderr| anyhow::anyhow!("OIDCClientSecretRequest for {client}: {stderr}"))
    }

    /// The new secret in a secret request's answer; the client must have exactly one.
    fn generated(answer: &Value) -> Result<String> {
        let secret = answer["status"]["generatedSecret"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ensure!(
            secret.len() == 64 && answer["status"]["totalClientSecrets"] == 1,
            "the secret request's status: {} secret(s), a new one of {} characters",
            answer["status"]["totalClientSecrets"],
            secret.len()
        );
        Ok(secret)
    }

    /// The Supervisor's aggregated API (OIDCClientSecretRequest) behind kube-apiserver, as the
    /// manifests register it, on loopback: the Service `<namePrefix>-api` (the harness's prefix
    /// is `supervisor-<namespace>`) as an `ExternalName` to `localhost` and the APIService on
    /// `port`; returns once the APIService is Available (the leader writes its caBundle).
    async fn serve_secret_api(kubectl: &Kubectl, namespace: &str, port: u16) -> Result<()> {
        let service = format!("supervisor-{namespace}-api");
        let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": service, "namespace": namespace},
             "spec": {"type": "ExternalName", "externalName": "localhost"}},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": CLIENT_SECRET_API_SERVICE},
             "spec": {"group": "clientsecret.supervisor.pinniped.dev", "version": "v1alpha1",
                      "groupPriorityMinimum": 9900, "versionPriority": 15,
                      "service": {"name": service, "namespace": namespace, "port": port}}},
        ]})
        .to_string();
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
            .await?;
        kubectl
            .run(&[
                "wait",
                "--for=condition=Available",
                "--timeout=90s",
                &format!("apiservice/{CLIENT_SECRET_API_SERVICE}"),
            ])
            .await?;
        Ok(())
    }

    /// Registers the OIDCClient `name` (as the e2e test's web application) and makes its first
    /// secret; returns the secret once the client is Ready.
    async fn create_client(kubectl: &Kubectl, namespace: &str, name: &str) -> Result<String> {
        let client = json!({
            "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
            "kind": "OIDCClient",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "allowedRedirectURIs": [CLIENT_REDIRECT],
                "allowedGrantTypes": ["authorization_code", "refresh_token"],
                "allowedScopes": ["openid", "offline_access", "username", "groups"],
            },
        })
        .to_string();
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&client))
            .await?;
        kubectl
            .run(&[
                "wait",
                "-n",
                namespace,
                "--timeout=30s",
                "--for=jsonpath={.status.conditions[?(@.type==\"ClientSecretExists\")].status}=False",
                &format!("oidcclient/{name}"),
            ])
            .await?;
        let secret = generated(&secret_request(kubectl, namespace, name, true, false).await?)?;
        kubectl
            .run(&[
                "wait",
                "-n",
                namespace,
                "--timeout=30s",
                "--for=jsonpath={.status.phase}=Ready",
                &format!("oidcclient/{name}"),
            ])
            .await?;
        Ok(secret)
    }

    /// Polls (every 100 ms, at most 30 s) the token endpoint with `client_id` and `secret` (or
    /// without authentication) until the answer is `want` (status, error); what it was otherwise.
    async fn wait_for_answer(
        bench: &Bench,
        client_id: &str,
        secret: Option<&str>,
        want: (u16, &str, &str),
    ) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, error, description) =
                client_token_request(&bench.http, &bench.token_url, client_id, secret).await?;
            if status == want.0 && error == want.1 && description.contains(want.2) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{client_id}: still {status} {error} ({description}) after 30 s, waiting for {} {}",
                want.0,
                want.1
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Replaces `name`'s secret by a new one (the old revoked) and waits until the Supervisor
    /// refuses the old one (`old` was verified: it is answered by its digest until the client is
    /// reloaded with the new hash, then refused by bcrypt); returns the new secret, not yet
    /// verified.
    async fn rotate(
        kubectl: &Kubectl,
        bench: &Bench,
        namespace: &str,
        name: &str,
        old: &str,
    ) -> Result<String> {
        let secret = generated(&secret_request(kubectl, namespace, name, true, true).await?)?;
        wait_for_answer(bench, name, Some(old), (401, "invalid_client", "")).await?;
        Ok(secret)
    }

    /// Everything `--flood` measured.
    pub(super) struct Results<'a> {
        args: &'a Args,
        load_at_start: [f64; 3],
        kubernetes_version: String,
        dex_build: String,
        windows: Vec<Window>,
        /// Wrong answers in attempts not reported (a disturbed window measured again).
        discarded: Vec<String>,
    }

    /// The setup, the warm-up, the baseline window, the secrets replaced, the flood window.
    pub(super) async fn measure<'a>(
        args: &'a Args,
        load_at_start: [f64; 3],
        cluster: &Cluster,
        dex: &Dex,
        supervisor: &Supervisor,
        aggregated_port: u16,
    ) -> Result<Results<'a>> {
        ensure!(
            args.flood_seconds > 0 && args.probe_timeout > 0 && args.flood_max_requests > 0,
            "--flood-seconds, --probe-timeout and --flood-max-requests must be positive"
        );
        let [etcd_pid, apiserver_pid] = cluster.pids()[..] else {
            anyhow::bail!("the cluster has not exactly etcd and kube-apiserver");
        };
        let pids: Pids = [
            (Process::Supervisor, supervisor.pid()),
            (Process::Dex, dex.pid().context("Dex is not running")?),
            (Process::Apiserver, apiserver_pid),
            (Process::Etcd, etcd_pid),
        ];
        let bench = Bench {
            http: supervisor.client()?,
            issuer: supervisor.issuer().to_string(),
            token_url: format!("{}/oauth2/token", supervisor.issuer()),
            ca_pem: supervisor.ca_pem(),
        };
        let kubectl = cluster.kubectl();
        let namespace = supervisor.namespace();
        serve_secret_api(&kubectl, namespace, aggregated_port)
            .await
            .context("serving the aggregated API")?;
        let flooded_secret = create_client(&kubectl, namespace, FLOODED).await?;
        let bystander_secret = create_client(&kubectl, namespace, BYSTANDER).await?;
        // Both served (with their hashes) before anything is measured: asked without a secret,
        // a known OIDCClient says which method it wants.
        for name in [FLOODED, BYSTANDER] {
            wait_for_answer(&bench, name, None, (401, "invalid_client", "client_secret_basic")).await?;
        }

        // Warm-up (not measured): new connections, logins with their exchanges, discovery.
        let mut ctx = Ctx {
            bench: bench.clone(),
            flooded_secret,
            bystander_secret,
            users: args.concurrency,
        };
        for n in 0..3 {
            for (outcome, what) in [
                (discovery(ctx.clone()).await.0, DISCOVERY),
                (login(ctx.clone(), n).await.0, LOGIN),
            ] {
                ensure!(outcome == Outcome::Ok, "warm-up {what}: {}", outcome.name());
            }
        }

        let setup = Setup {
            kubectl: &kubectl,
            bench: &bench,
            namespace,
            args,
            pids: &pids,
            supervisor,
        };
        let mut discarded = Vec::new();
        let baseline = measured_window(&setup, "baseline", false, &mut ctx, &mut discarded).await?;
        let flood = measured_window(&setup, "flood", true, &mut ctx, &mut discarded).await?;
        let _best_effort = kubectl
            .output(
                &[
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                    "apiservice",
                    CLIENT_SECRET_API_SERVICE,
                ],
                None,
            )
            .await;
        Ok(Results {
            args,
            load_at_start,
            kubernetes_version: cluster.kubernetes_version().to_string(),
            dex_build: dex_build()?,
            windows: vec![baseline, flood],
            discarded,
        })
    }

    /// What [`measured_window`] needs besides the window.
    struct Setup<'a> {
        kubectl: &'a Kubectl,
        bench: &'a Bench,
        namespace: &'a str,
        args: &'a Args,
        pids: &'a Pids,
        supervisor: &'a Supervisor,
    }

    /// The window `name` (see [`window`]), measured again (at most `--attempts` times in all)
    /// while other processes took more than `--interference` of the machine during it; the least
    /// disturbed attempt is returned, the wrong answers of the others are added to `discarded`.
    /// Before every attempt but a first baseline (whose secrets were just made) both OIDCClients'
    /// secrets are replaced in `ctx`, so each attempt's first correct request costs one bcrypt.
    async fn measured_window(
        setup: &Setup<'_>,
        name: &'static str,
        flooding: bool,
        ctx: &mut Ctx,
        discarded: &mut Vec<String>,
    ) -> Result<Window> {
        let args = setup.args;
        let mut best: Option<Window> = None;
        for attempt in 1..=args.quiet.attempts.max(1) {
            if flooding || attempt > 1 {
                let (kubectl, bench, namespace) = (setup.kubectl, setup.bench, setup.namespace);
                ctx.flooded_secret = rotate(kubectl, bench, namespace, FLOODED, &ctx.flooded_secret).await?;
                ctx.bystander_secret =
                    rotate(kubectl, bench, namespace, BYSTANDER, &ctx.bystander_secret).await?;
            }
            let measured = Window {
                attempt,
                ..window(name, flooding, ctx, args, setup.pids, setup.supervisor).await?
            };
            let share = measured.cpu.others_share(measured.wall);
            let (keep, drop) = match best.take() {
                Some(kept) if kept.cpu.others_share(kept.wall) <= share => (kept, Some(measured)),
                Some(kept) => (measured, Some(kept)),
                None => (measured, None),
            };
            if let Some(dropped) = drop {
                discarded.extend(
                    dropped
                        .wrong_answers()
                        .into_iter()
                        .map(|wrong| format!("(attempt {}, not reported) {wrong}", dropped.attempt)),
                );
            }
            best = Some(keep);
            if share <= args.quiet.interference {
                break;
            }
            eprintln!(
                "{name} window: other processes took {:.0} % of the machine (attempt {attempt})",
                share * 100.0
            );
        }
        best.context("no attempt ran")
    }

    /// Percentiles and counts of one probe's samples in one window.
    struct Summary {
        requests: usize,
        ok: usize,
        busy: usize,
        timeouts: usize,
        wrong: usize,
        /// Nearest-rank percentiles over every sample, an unanswered one counting as longer than
        /// any answer (`Some(None)`); `None` when there is no sample.
        p50: Option<Option<Duration>>,
        p95: Option<Option<Duration>>,
        max: Option<Option<Duration>>,
        /// The window's first sample.
        first: Option<Sample>,
    }

    /// `p` (0–1] of `sorted` (answered first, ascending; unanswered last), nearest rank.
    fn percentile(sorted: &[Option<Duration>], p: f64) -> Option<Option<Duration>> {
        if sorted.is_empty() {
            return None;
        }
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1])
    }

    fn sorted(latencies: impl Iterator<Item = Option<Duration>>) -> Vec<Option<Duration>> {
        let mut all: Vec<Option<Duration>> = latencies.collect();
        // `None` (not answered) after every answer.
        all.sort_by_key(|latency| (latency.is_none(), *latency));
        all
    }

    fn summarize(samples: &[Sample]) -> Summary {
        let all = sorted(samples.iter().map(Sample::answered_in));
        let count = |want: fn(&Outcome) -> bool| samples.iter().filter(|s| want(&s.outcome)).count();
        Summary {
            requests: samples.len(),
            ok: count(|o| *o == Outcome::Ok),
            busy: count(|o| *o == Outcome::Busy),
            timeouts: count(|o| *o == Outcome::Timeout),
            wrong: count(|o| matches!(o, Outcome::Wrong(_))),
            p50: percentile(&all, 0.5),
            p95: percentile(&all, 0.95),
            max: percentile(&all, 1.0),
            first: samples.first().cloned(),
        }
    }

    fn ms(duration: Duration) -> f64 {
        (duration.as_secs_f64() * 1e5).round() / 100.0
    }

    /// A latency for the report: "12.3 ms", "5.01 s", "> 10 s" (not answered), "—" (none).
    fn shown(latency: Option<Option<Duration>>, timeout: u64) -> String {
        match latency {
            None => "—".into(),
            Some(None) => format!("> {timeout} s"),
            Some(Some(d)) if d < Duration::from_secs(1) => format!("{:.1} ms", d.as_secs_f64() * 1000.0),
            Some(Some(d)) => format!("{:.2} s", d.as_secs_f64()),
        }
    }

    fn latency_json(latency: Option<Option<Duration>>) -> Value {
        match latency {
            Some(Some(d)) => json!(ms(d)),
            Some(None) => json!("not answered"),
            None => Value::Null,
        }
    }

    impl Window {
        /// Its answers that were neither expected nor allowed.
        fn wrong_answers(&self) -> Vec<String> {
            let mut wrong = Vec::new();
            for (probe, samples) in &self.probes {
                for sample in samples {
                    if let Outcome::Wrong(what) = &sample.outcome {
                        wrong.push(format!("{} window, {probe}: {what}", self.name));
                    }
                }
            }
            for what in &self.flood.others {
                wrong.push(format!("{} window, a flood request: {what}", self.name));
            }
            wrong
        }

        fn probe(&self, name: &str) -> &[Sample] {
            self.probes
                .iter()
                .find(|(probe, _)| *probe == name)
                .map_or(&[], |(_, samples)| samples)
        }

        /// CPU-seconds of `process` per wall second: how many cores it kept busy on average.
        fn cores(&self, cpu: Duration) -> f64 {
            cpu.as_secs_f64() / self.wall.as_secs_f64().max(f64::MIN_POSITIVE)
        }

        fn grant(&self, grant_type: &str, result: &str) -> f64 {
            self.grants
                .get(&(grant_type.to_string(), result.to_string()))
                .copied()
                .unwrap_or(0.0)
        }

        /// What the bench expected the Supervisor to count, (grant type, result) → count, from
        /// the answers it got (a request not answered in time is not expected anywhere).
        fn expected_grants(&self) -> BTreeMap<(String, String), usize> {
            let mut expected = BTreeMap::new();
            let mut add = |grant: &str, result: &str, count: usize| {
                if count > 0 {
                    *expected
                        .entry((grant.to_string(), result.to_string()))
                        .or_default() += count;
                }
            };
            let login = summarize(self.probe(LOGIN));
            add("authorization_code", "ok", login.ok);
            add("token_exchange", "ok", login.ok);
            for probe in [FLOODED_SECRET, BYSTANDER_SECRET] {
                let secret = summarize(self.probe(probe));
                add("authorization_code", "invalid_grant", secret.ok);
                add("authorization_code", "temporarily_unavailable", secret.busy);
            }
            add("authorization_code", "invalid_client", self.flood.refused.len());
            add(
                "authorization_code",
                "temporarily_unavailable",
                self.flood.busy.len(),
            );
            expected
        }

        fn json(&self) -> Value {
            let probes: serde_json::Map<String, Value> = self
                .probes
                .iter()
                .map(|(name, samples)| {
                    let summary = summarize(samples);
                    (
                        name.to_string(),
                        json!({
                            "requests": summary.requests,
                            "ok": summary.ok,
                            "temporarily_unavailable": summary.busy,
                            "not_answered": summary.timeouts,
                            "wrong": summary.wrong,
                            "p50_ms": latency_json(summary.p50),
                            "p95_ms": latency_json(summary.p95),
                            "max_ms": latency_json(summary.max),
                            "samples": samples.iter().map(|sample| json!({
                                "offset_ms": ms(sample.offset),
                                "latency_ms": ms(sample.latency),
                                "outcome": sample.outcome.name(),
                                "parts_ms": sample.parts.iter().map(|(part, took)| (part.to_string(), json!(ms(*took)))).collect::<serde_json::Map<_, _>>(),
                            })).collect::<Vec<_>>(),
                        }),
                    )
                })
                .collect();
            let stats = |latencies: &[Duration]| {
                let all = sorted(latencies.iter().map(|d| Some(*d)));
                json!({
                    "count": latencies.len(),
                    "p50_ms": latency_json(percentile(&all, 0.5)),
                    "p95_ms": latency_json(percentile(&all, 0.95)),
                    "max_ms": latency_json(percentile(&all, 1.0)),
                })
            };
            json!({
                "name": self.name,
                "flooding": self.flooding,
                "attempt": self.attempt,
                "quiet_before": self.quiet,
                "wall_seconds": self.wall.as_secs_f64(),
                "drain_seconds_after_the_deadline": self.drain.as_secs_f64(),
                "cpu_seconds": {
                    "supervisor": self.cpu[Process::Supervisor].as_secs_f64(),
                    "dex": self.cpu[Process::Dex].as_secs_f64(),
                    "kube_apiserver": self.cpu[Process::Apiserver].as_secs_f64(),
                    "etcd": self.cpu[Process::Etcd].as_secs_f64(),
                    "bench_clients": self.cpu.bench.as_secs_f64(),
                    "machine_busy": self.cpu.machine.as_secs_f64(),
                    "other_processes": self.cpu.others().as_secs_f64(),
                },
                "supervisor_cores_busy": self.cores(self.cpu[Process::Supervisor]),
                "other_processes_share_of_machine": self.cpu.others_share(self.wall),
                "supervisor_at_deadline": {"threads": self.threads, "rss_kib": self.rss_kib},
                "probes": probes,
                "flood": {
                    "clients": self.flood.clients,
                    "seconds_including_the_lead": self.flood.wall.as_secs_f64(),
                    "sent": self.flood.sent,
                    "invalid_client_401_within_the_window": self.flood.refused_in_window,
                    "invalid_client_401": stats(&self.flood.refused),
                    "temporarily_unavailable_503": stats(&self.flood.busy),
                    "not_answered": self.flood.timeouts,
                    "other": self.flood.other,
                    "other_examples": self.flood.others,
                },
                "supervisor_token_grants": self.grants.iter().map(|((grant, result), count)| json!({
                    "grant_type": grant, "result": result, "count": count,
                })).collect::<Vec<_>>(),
                "expected_token_grants": self.expected_grants().iter().map(|((grant, result), count)| json!({
                    "grant_type": grant, "result": result, "count": count,
                })).collect::<Vec<_>>(),
            })
        }
    }

    impl Results<'_> {
        fn window(&self, flooding: bool) -> &Window {
            self.windows
                .iter()
                .find(|window| window.flooding == flooding)
                .unwrap_or(&self.windows[0])
        }

        /// Every answer that was neither expected nor allowed (a 503 is allowed for the
        /// client-secret checks, not answering in time for none of the probes, but that is a
        /// measurement, not a wrong answer): what made the run fail, once the report is written.
        pub(super) fn wrong_answers(&self) -> Vec<String> {
            let mut wrong: Vec<String> = self.windows.iter().flat_map(Window::wrong_answers).collect();
            wrong.extend(self.discarded.iter().cloned());
            wrong
        }

        pub(super) fn json(&self) -> Value {
            let machine = selkie_perf::process::Machine::describe();
            let a = self.args;
            json!({
                "machine": {
                    "cpu_model": machine.cpu_model,
                    "cores": machine.cores,
                    "kernel": machine.kernel,
                    "memory": machine.memory,
                    "rustc": machine.rustc,
                    "load_at_start": self.load_at_start,
                },
                "kubernetes_version": self.kubernetes_version,
                "dex_build": self.dex_build,
                "gc_interval": GC_INTERVAL,
                "settings": {
                    "window_seconds": a.flood_seconds,
                    "flood_lead_seconds": a.flood_lead_seconds,
                    "flood_clients": a.flood_clients,
                    "flood_max_requests_per_client": a.flood_max_requests,
                    "probe_timeout_seconds": a.probe_timeout,
                    "discovery_interval_ms": a.discovery_interval_ms,
                    "login_interval_ms": a.login_interval_ms,
                    "secret_interval_ms": a.secret_interval_ms,
                    "dex_users": a.concurrency,
                },
                "windows": self.windows.iter().map(Window::json).collect::<Vec<_>>(),
                "wrong_answers": self.wrong_answers(),
            })
        }

        pub(super) fn markdown(&self, json_path: &std::path::Path) -> String {
            use std::fmt::Write as _;
            let machine = selkie_perf::process::Machine::describe();
            let a = self.args;
            let (base, flood) = (self.window(false), self.window(true));
            let t = a.probe_timeout;
            let lead = a.flood_lead_seconds;
            let mut md = String::new();
            let _ = write!(
                md,
                "# Supervisor: does a wrong-client-secret flood slow everyone else?\n\n\
                 An outside attack run found that 24 clients sending wrong `client_secret_basic` secrets for \
                 a known OIDCClient (client IDs are public) made OIDC discovery on new connections take 7–9 s \
                 instead of 8 ms, or not answer within 10 s: every check was a bcrypt (cost 12) on the async \
                 runtime. Since then a check runs on the blocking pool, one at a time per OIDCClient, at most \
                 half the cores at once in all, waiting at most 5 s for its turn before `temporarily_unavailable` \
                 (503); a secret once verified is recognised by its SHA-256 digest without bcrypt. This \
                 measures what everyone else sees during such a flood.\n\n\
                 * Command: `perf/supervisor-flood` (= `perf/supervisor --flood`; release build of \
                   `selkie-supervisor`). Two windows of {secs} s, the baseline and then the flood. From {lead} s \
                   before the flood window (so that the window sees the flood established: every flooding \
                   client's check queued, the 5 s limit reached) until its end, {clients} clients, each on a \
                   keep-alive connection of its own, post \
                   `grant_type=authorization_code` to the token endpoint with HTTP Basic `<client ID of the \
                   flooded OIDCClient>:<a random 64-hex secret>`, one request after the other (at most {most} \
                   each); every answer must be 401 `invalid_client` or 503 `temporarily_unavailable`.\n\
                 * Probes, in both windows, each on a **new TCP connection and TLS handshake**, paced (the next \
                   one starts an interval after the previous one started, or when it ended if later): OIDC \
                   discovery (`GET /.well-known/openid-configuration`, every {d} ms); a `cli_password` login \
                   of the pinniped CLI (authorization request with the password headers, the Supervisor's \
                   password grant at Dex, the code redeemed) and the RFC 8693 token exchange of its access \
                   token on the same connection, as one CLI process makes them (every {l} ms, the Dex users in \
                   turn); and, every {s} ms each, a token request with the **correct** secret (HTTP Basic) of the \
                   flooded OIDCClient and of a second OIDCClient nobody floods, with a made-up code, so that an \
                   accepted secret is answered 400 `invalid_grant` and nothing else is measured. A probe not \
                   answered within {t} s counts as longer than any answer.\n\
                 * The OIDCClients and their secrets are made as an admin makes them (the e2e test \
                   `supervisor_oidc_client`): an `OIDCClient`, then `kubectl create` of an \
                   `OIDCClientSecretRequest` through kube-apiserver's aggregation layer (one secret each). \
                   Before the flood window both secrets are replaced (`generateNewSecret` + `revokeOldSecrets`), \
                   so in **each** window the first request with a correct secret costs one bcrypt check and the \
                   later ones are recognised by their digest.\n\
                 * Components: kube-apiserver {kube} with etcd (the e2e harness), Dex {dex} as the upstream of \
                   the logins, the Supervisor with one FederationDomain and one OIDCIdentityProvider, sessions \
                   in Secrets, garbage collector every {gc}.\n\
                 * Machine: {cpu} ({cores}), {kernel}, {memory} RAM, {rustc}; load average at start {l1:.2} / \
                   {l5:.2} / {l15:.2}; before the baseline window the machine was {bq:.0} % busy over 5 s ({bqs}, \
                   after {bw:.0} s of waiting), before the flood window {fq:.0} % ({fqs}, after {fw:.0} s). A \
                   window during which other processes took more than {interference:.0} % of the machine is \
                   measured again after waiting for a quiet machine (up to {attempts} attempts, the secrets \
                   replaced first; the least disturbed is shown, its number beside the window's name in the CPU \
                   table when not the first). Every process (kube-apiserver, etcd, Dex, the \
                   Supervisor, the bench's clients) shares the {ncores} cores, unpinned.\n\n",
                secs = a.flood_seconds,
                clients = a.flood_clients,
                most = a.flood_max_requests,
                d = a.discovery_interval_ms,
                l = a.login_interval_ms,
                s = a.secret_interval_ms,
                kube = self.kubernetes_version,
                dex = self.dex_build,
                gc = GC_INTERVAL,
                cpu = machine.cpu_model,
                cores = machine.cores,
                kernel = machine.kernel,
                memory = machine.memory,
                rustc = machine.rustc,
                l1 = self.load_at_start[0],
                l5 = self.load_at_start[1],
                l15 = self.load_at_start[2],
                bq = base.quiet.busy * 100.0,
                bqs = if base.quiet.quiet { "quiet" } else { "**not quiet**" },
                fq = flood.quiet.busy * 100.0,
                bw = base.quiet.waited_seconds,
                fw = flood.quiet.waited_seconds,
                interference = a.quiet.interference * 100.0,
                attempts = a.quiet.attempts,
                fqs = if flood.quiet.quiet { "quiet" } else { "**not quiet**" },
                ncores = std::thread::available_parallelism().map_or(1, usize::from),
            );
            let _ = write!(
                md,
                "## Latency on new connections, without and with the flood\n\n\
                 Percentiles over every probe of the window (nearest rank; an unanswered probe counts as \
                 longer than any answer, shown `> {t} s`). \"Expected\" is a 200 with the checked document \
                 or tokens, for the client-secret rows the 400 `invalid_grant` of an accepted secret.\n\n\
                 | probe | window | probes | p50 | p95 | max | expected answer | 503 temporarily_unavailable | not answered in {t} s | wrong answer |\n\
                 |---|---|---|---|---|---|---|---|---|---|\n"
            );
            for probe in PROBES {
                for window in [base, flood] {
                    let summary = summarize(window.probe(probe));
                    let _ = writeln!(
                        md,
                        "| {probe} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        window.name,
                        summary.requests,
                        shown(summary.p50, t),
                        shown(summary.p95, t),
                        shown(summary.max, t),
                        summary.ok,
                        summary.busy,
                        summary.timeouts,
                        summary.wrong,
                    );
                }
            }
            // The login's parts.
            let part = |window: &Window, name: &str| {
                let all = sorted(
                    window
                        .probe(LOGIN)
                        .iter()
                        .flat_map(|sample| sample.parts.iter())
                        .filter(|(part, _)| *part == name)
                        .map(|(_, took)| Some(*took)),
                );
                format!(
                    "{} / {}",
                    shown(percentile(&all, 0.5), t),
                    shown(percentile(&all, 0.95), t)
                )
            };
            let _ = write!(
                md,
                "\nThe login row's parts, p50 / p95 of the successful ones: login (authorization request and \
                 code redemption, with the TLS handshake) {} in the baseline, {} during the flood; token \
                 exchange {} and {}.\n\n\
                 The first request with each OIDCClient's correct secret in the window (not yet verified: one \
                 bcrypt check, after waiting for its turn):\n\n\
                 | client | baseline | flood |\n|---|---|---|\n",
                part(base, "login"),
                part(flood, "login"),
                part(base, "exchange"),
                part(flood, "exchange"),
            );
            let first = |window: &Window, probe: &str| match summarize(window.probe(probe)).first {
                None => "—".to_string(),
                Some(sample) => format!(
                    "{} ({})",
                    shown(Some(sample.answered_in()), t),
                    if sample.outcome == Outcome::Ok {
                        "accepted".to_string()
                    } else {
                        sample.outcome.name()
                    }
                ),
            };
            for (probe, client) in [
                (FLOODED_SECRET, "flooded"),
                (BYSTANDER_SECRET, "second (not flooded)"),
            ] {
                let _ = writeln!(
                    md,
                    "| {client} | {} | {} |",
                    first(base, probe),
                    first(flood, probe)
                );
            }
            // When, in the flood window, the flooded client's correct secret was first accepted.
            let accepted_at = flood
                .probe(FLOODED_SECRET)
                .iter()
                .position(|sample| sample.outcome == Outcome::Ok)
                .map(|at| (at, flood.probe(FLOODED_SECRET)[at].offset));
            let _ = write!(
                md,
                "\nDuring the flood the flooded client's correct secret was {}.\n\n",
                match accepted_at {
                    Some((0, _)) => "accepted at its first request".to_string(),
                    Some((n, offset)) => format!(
                        "first accepted at request {} ({:.1} s into the window; the {n} before were answered 503 or not at all)",
                        n + 1,
                        offset.as_secs_f64()
                    ),
                    None => "never accepted".to_string(),
                }
            );
            let _ = write!(
                md,
                "## CPU during the windows\n\n\
                 Cores kept busy on average (CPU-seconds from `/proc/PID/stat` ÷ the window's wall time, \
                 10 ms ticks); \"other processes\" is the machine's busy time less the bench's processes, as a \
                 share of all {n} cores.\n\n\
                 | window | wall | Supervisor | Dex | kube-apiserver | etcd | the bench's clients | other processes | Supervisor threads, RSS at the window's end |\n\
                 |---|---|---|---|---|---|---|---|---|\n",
                n = std::thread::available_parallelism().map_or(1, usize::from),
            );
            for window in [base, flood] {
                let _ = writeln!(
                    md,
                    "| {}{} | {:.1} s | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} % | {}, {:.1} MiB |",
                    window.name,
                    if window.attempt > 1 {
                        format!(" (attempt {})", window.attempt)
                    } else {
                        String::new()
                    },
                    window.wall.as_secs_f64(),
                    window.cores(window.cpu[Process::Supervisor]),
                    window.cores(window.cpu[Process::Dex]),
                    window.cores(window.cpu[Process::Apiserver]),
                    window.cores(window.cpu[Process::Etcd]),
                    window.cores(window.cpu.bench),
                    window.cpu.others_share(window.wall) * 100.0,
                    window.threads,
                    window.rss_kib as f64 / 1024.0,
                );
            }
            let f = &flood.flood;
            let stats = |latencies: &[Duration]| {
                let all = sorted(latencies.iter().map(|d| Some(*d)));
                format!(
                    "{} / {} / {}",
                    shown(percentile(&all, 0.5), t),
                    shown(percentile(&all, 0.95), t),
                    shown(percentile(&all, 1.0), t)
                )
            };
            let _ = write!(
                md,
                "\n## The flood\n\n\
                 From its start, {lead} s before the window, to the window's end ({:.1} s).\n\n\
                 | clients | requests | 401 invalid_client | 503 temporarily_unavailable | not answered in {t} s | other | answers per second | 401: p50 / p95 / max | 503: p50 / p95 / max |\n\
                 |---|---|---|---|---|---|---|---|---|\n\
                 | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} |\n\n",
                f.wall.as_secs_f64(),
                f.clients,
                f.sent,
                f.refused.len(),
                f.busy.len(),
                f.timeouts,
                f.other,
                (f.refused.len() + f.busy.len()) as f64 / f.wall.as_secs_f64().max(f64::MIN_POSITIVE),
                stats(&f.refused),
                stats(&f.busy),
            );
            if !f.others.is_empty() {
                let _ = writeln!(
                    md,
                    "Other answers (first {}): {}\n",
                    f.others.len(),
                    f.others.join("; ")
                );
            }
            let _ = write!(
                md,
                "## The Supervisor's own count\n\n\
                 `selkie_supervisor_token_grants_total` moved by (from the window's start, the flood's for the \
                 flood window, until its last request ended), beside what the bench's answers say it should have \
                 counted:\n\n\
                 | window | grant, result | the Supervisor counted | the bench's answers |\n|---|---|---|---|\n"
            );
            for window in [base, flood] {
                let expected = window.expected_grants();
                let mut keys: Vec<(String, String)> = window.grants.keys().cloned().collect();
                keys.extend(expected.keys().cloned());
                keys.sort();
                keys.dedup();
                for (grant, result) in keys {
                    let _ = writeln!(
                        md,
                        "| {} | {grant}, {result} | {:.0} | {} |",
                        window.name,
                        window.grant(&grant, &result),
                        expected
                            .get(&(grant.clone(), result.clone()))
                            .copied()
                            .unwrap_or(0),
                    );
                }
            }
            md.push_str(&self.reading(json_path));
            md
        }

        /// "Reading the numbers", with this run's figures.
        fn reading(&self, json_path: &std::path::Path) -> String {
            let (base, flood) = (self.window(false), self.window(true));
            let t = self.args.probe_timeout;
            let pair = |probe: &str| {
                let (b, f) = (summarize(base.probe(probe)), summarize(flood.probe(probe)));
                format!(
                    "p50 {} → {}, p95 {} → {}, max {} → {}",
                    shown(b.p50, t),
                    shown(f.p50, t),
                    shown(b.p95, t),
                    shown(f.p95, t),
                    shown(b.max, t),
                    shown(f.max, t)
                )
            };
            let unanswered: usize = PROBES
                .iter()
                .map(|probe| summarize(flood.probe(probe)).timeouts)
                .sum();
            let flooded = summarize(flood.probe(FLOODED_SECRET));
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            let later = sorted(
                flood
                    .probe(FLOODED_SECRET)
                    .iter()
                    .skip(1)
                    .map(Sample::answered_in),
            );
            let first = match &flooded.first {
                None => "—".to_string(),
                Some(sample) => format!(
                    "{} ({})",
                    shown(Some(sample.answered_in()), t),
                    if sample.outcome == Outcome::Ok {
                        "accepted".to_string()
                    } else {
                        sample.outcome.name()
                    }
                ),
            };
            let refused = sorted(flood.flood.refused.iter().map(|d| Some(*d)));
            // Checks that ran bcrypt in the flood window: the wrong secrets refused and each
            // client's first correct secret accepted; the Supervisor's CPU in the window is mostly
            // theirs (the rest is the baseline's load).
            let checks = flood.flood.refused_in_window
                + [FLOODED_SECRET, BYSTANDER_SECRET]
                    .iter()
                    .filter(|probe| flood.probe(probe).iter().any(|s| s.outcome == Outcome::Ok))
                    .count();
            let bcrypt = (flood.cpu[Process::Supervisor].saturating_sub(base.cpu[Process::Supervisor]))
                .as_secs_f64()
                / checks.max(1) as f64;
            format!(
                "\n## Reading the numbers\n\n\
                 * Baseline → flood, on new connections: discovery {disc}; login + exchange {login}; the \
                   second OIDCClient's correct secret {by}. {unanswered} probe(s) of the flood window were not \
                   answered within {t} s (the attack run's symptom).\n\
                 * The flooded OIDCClient's own correct secret ({fl}): a check of its secrets waits for the \
                   ones before it for the same client ID, one at a time, and the flood keeps {clients} wrong \
                   ones queued: its own answers took p50 {flood_p50} (401) — {clients} checks of about {bcrypt_ms:.0} ms \
                   of CPU each ({checks} bcrypt checks ended in the flood window), which is why {busy503} of the \
                   flood's requests reached the 5 s limit and were answered 503. A secret **not yet verified** when the flood \
                   starts waits in the same queue: here the first request with the new secret took {first}. \
                   Near the limit, such a request is answered 503 `temporarily_unavailable` (retryable) or \
                   accepted after about 5 s; {busy} of the flooded client's {req} requests were answered 503. \
                   Once accepted, a secret is recognised by its digest and waits no more (the later requests: \
                   p50 {later_p50}, p95 {later_p95}). So a client ID under attack costs its own legitimate \
                   client a bounded, retryable delay until its secret is verified once; nobody else waits in \
                   that queue. A wrong secret and a new right one cost the same until checked: that is \
                   bcrypt.\n\
                 * The Supervisor's CPU: {bc:.2} cores in the baseline, {fc:.2} during the flood; bcrypt may use \
                   at most half the cores ({slots} of {cores} here) however many wrong secrets arrive, which \
                   leaves the rest to every other request. The flood's answers per second are therefore about \
                   {slots} ÷ bcrypt's time plus the 503s of checks that waited 5 s.\n\
                 * The probes are paced and few (this run's baseline: {nd} discovery probes, {nl} logins, {ns} \
                   requests per OIDCClient), so p95 of the logins is about their second-slowest, and the `max` \
                   column is one probe. Everything shares the {cores} cores unpinned with \
                   kube-apiserver, etcd, Dex and the bench's own {clients} flooding clients; the CPU table says \
                   how much each took.\n\
                 * The Supervisor's own counter must agree with the bench's answers; a request not answered \
                   within {t} s may still be counted by the Supervisor.\n\
                 * Raw numbers, every probe with its start, latency and outcome: `{json}`.\n",
                nd = base.probe(DISCOVERY).len(),
                nl = base.probe(LOGIN).len(),
                ns = base.probe(FLOODED_SECRET).len(),
                disc = pair(DISCOVERY),
                login = pair(LOGIN),
                by = pair(BYSTANDER_SECRET),
                fl = pair(FLOODED_SECRET),
                clients = self.args.flood_clients,
                busy = flooded.busy,
                req = flooded.requests,
                flood_p50 = shown(percentile(&refused, 0.5), t),
                bcrypt_ms = bcrypt * 1000.0,
                checks = checks,
                busy503 = flood.flood.busy.len(),
                first = first,
                later_p50 = shown(percentile(&later, 0.5), t),
                later_p95 = shown(percentile(&later, 0.95), t),
                bc = base.cores(base.cpu[Process::Supervisor]),
                fc = flood.cores(flood.cpu[Process::Supervisor]),
                slots = (cores / 2).max(1),
                json = json_path
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            )
        }
    }
}
