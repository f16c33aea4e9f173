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
        apiserver_requests, delta, dex_build, parallel, quietly, samples, tail, wait_for_quiet, write_report,
        Quiet, QuietArgs, Requests,
    },
    dex::{Dex, DexUser},
    pinniped_cli::{self, jwt_claims},
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
    /// The markdown report to write (the JSON goes beside it, `.json`).
    #[arg(long, default_value = "perf/results/supervisor.md")]
    out: PathBuf,
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
    let supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        dex.as_ref(),
        IDP_NAME,
        selkie_e2e::free_port()?,
        json!({"sessionGarbageCollectionInterval": GC_INTERVAL}),
    )
    .await?;
    let results = match measure(&args, load_at_start, cluster, kube, &dex, &supervisor).await {
        Ok(results) => results,
        // What the Supervisor logged (it logs no token) says why an answer was refused.
        Err(error) => {
            let log = tail(&supervisor.log(), 30);
            return Err(error.context(format!("the Supervisor's log ends:\n{log}")));
        }
    };
    write_report(&args.out, &results.json(), |json_path| {
        results.markdown(json_path)
    })
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

/// One logged-in session: its user and tokens (never printed).
#[derive(Clone)]
struct Session {
    email: String,
    access: String,
    refresh: String,
}

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
        let tokens = pinniped_cli::login(&self.http, &self.issuer, IDP_NAME, email, PASSWORD).await?;
        check_id_token(&tokens, email, pinniped_cli::CLIENT_ID)?;
        Ok(Session {
            email: email.to_string(),
            access: string(&tokens, "access_token")?,
            refresh: string(&tokens, "refresh_token")?,
        })
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
        let (status, answer) = pinniped_cli::refresh(&self.http, &self.token_url, &session.refresh).await?;
        ensure!(status == 200, "refresh: {status}: {}", without_tokens(&answer));
        let (access, refresh) = (
            string(&answer, "access_token")?,
            string(&answer, "refresh_token")?,
        );
        ensure!(
            access.starts_with("pin_at_") && refresh.starts_with("pin_rt_") && refresh != session.refresh,
            "refresh: unexpected tokens in {}",
            without_tokens(&answer)
        );
        check_id_token(&answer, &session.email, pinniped_cli::CLIENT_ID)?;
        Ok(Session {
            access,
            refresh,
            ..session
        })
    }
}

/// Fails unless the token response `answer` has an ID token for `audience` naming `email`.
fn check_id_token(answer: &Value, email: &str, audience: &str) -> Result<()> {
    let claims = jwt_claims(&string(answer, "id_token")?)?;
    ensure!(
        claims["username"] == email && has_audience(&claims, audience),
        "the ID token is not the user's: username {}, aud {}",
        claims["username"],
        claims["aud"]
    );
    Ok(())
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

/// Whether the JWT `claims` name `audience` in `aud` (a string or an array of them).
fn has_audience(claims: &Value, audience: &str) -> bool {
    match &claims["aud"] {
        Value::String(aud) => aud == audience,
        Value::Array(auds) => auds.iter().any(|aud| aud == audience),
        _ => false,
    }
}

/// The string `name` of a token response.
fn string(answer: &Value, name: &str) -> Result<String> {
    answer[name]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no {name} in {}", without_tokens(answer)))
}

/// A token response with every token replaced by its length, fit for an error message.
fn without_tokens(answer: &Value) -> Value {
    let mut shown = answer.clone();
    if let Some(object) = shown.as_object_mut() {
        for (name, value) in object.iter_mut() {
            if name.ends_with("token") {
                *value = json!(format!("<{} bytes>", value.as_str().map_or(0, str::len)));
            }
        }
    }
    shown
}

/// The loopback ports that tell the Supervisor's connections apart.
#[derive(Debug, Clone, Copy)]
struct Ports {
    /// The Supervisor's HTTPS listener (inbound: the bench's clients).
    supervisor: u16,
    kube_apiserver: u16,
    dex: u16,
}

/// What a process holds open.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Handles {
    /// File descriptors, sockets included.
    fds: usize,
    /// Established TCP connections accepted on the Supervisor's HTTPS port.
    inbound: usize,
    /// Established TCP connections to kube-apiserver.
    kube_apiserver: usize,
    /// Established TCP connections to Dex.
    dex: usize,
}

/// The file descriptors and established loopback connections of `pid`, from `/proc`.
fn handles(pid: u32, ports: Ports) -> Result<Handles> {
    let mut inodes = std::collections::BTreeSet::new();
    let mut fds = 0;
    for fd in
        std::fs::read_dir(format!("/proc/{pid}/fd")).with_context(|| format!("reading /proc/{pid}/fd"))?
    {
        fds += 1;
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut found = Handles {
        fds,
        inbound: 0,
        kube_apiserver: 0,
        dex: 0,
    };
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |field: usize| {
                fields
                    .get(field)
                    .and_then(|address| address.rsplit_once(':'))
                    .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
            };
            let established = fields.get(3) == Some(&"01");
            if !established || !fields.get(9).is_some_and(|inode| inodes.contains(*inode)) {
                continue;
            }
            match (port(1), port(2)) {
                (Some(local), _) if local == ports.supervisor => found.inbound += 1,
                (_, Some(remote)) if remote == ports.kube_apiserver => found.kube_apiserver += 1,
                (_, Some(remote)) if remote == ports.dex => found.dex += 1,
                _ => {}
            }
        }
    }
    Ok(found)
}

/// The port of an `https://host:port/…` URL.
fn url_port(url: &str) -> Result<u16> {
    let uri: http::Uri = url.parse().with_context(|| format!("{url} is no URL"))?;
    uri.port_u16().with_context(|| format!("{url} has no port"))
}

/// The processes whose CPU time is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Process {
    Supervisor,
    Dex,
    Apiserver,
    Etcd,
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
             over {:.0} s, below). The Supervisor's kube client speaks HTTP/1.1 (one request per \
             connection at a time); the last column is how many connections to kube-apiserver it held at \
             the phase's start and end (the watches' included).\n\n\
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
               grant, whose bcrypt check is most of Dex's CPU per login, and stores the code) and the code's \
               redemption (tokens minted, stored). A Supervisor refresh reads the session, revokes the old \
               tokens, refreshes at Dex and stores new ones; Dex's CPU in that row is the upstream refresh \
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
