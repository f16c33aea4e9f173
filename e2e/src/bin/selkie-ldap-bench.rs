//! `selkie-ldap-bench`: LDAP logins per second and CPU per LDAP login, the Selkie Supervisor side
//! by side with Dex's LDAP connector, against the same OpenLDAP on the same box (`perf/ldap`).
//!
//! Starts a real kube-apiserver (with etcd), slapd with one user per client (two groups each),
//! the Supervisor with an LDAPIdentityProvider for that slapd, and Dex whose password connector is
//! its `ldap` connector on the same slapd. Waits (bounded) for a quiet machine, warms both up,
//! then measures two phases, each bounded by a login count and run by a fixed number of
//! concurrent clients, each client logging its own user in again and again:
//!
//! * A: full `cli_password` logins at the Supervisor (authorization request with the
//!   Pinniped-Username/-Password headers, then the code redeemed); every ID token must name the
//!   user (`username`) and carry both groups;
//! * B: password grants at Dex (`openid email profile groups`); every ID token must come from
//!   Dex and carry the user's `email`, `name` and both groups.
//!
//! CPU is utime + stime from `/proc/PID/stat` of the Supervisor, Dex, slapd, kube-apiserver and
//! etcd before and after each phase; a phase during which other processes took more than
//! `--interference` of the machine is measured again (up to `--attempts`). kube-apiserver's
//! requests per login come from its `apiserver_request_total`. No password or token is printed.
//! Writes a markdown report (`--out`) and its raw numbers as JSON beside it. Loopback only.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use selkie_e2e::{
    bench::{self, apiserver_requests, delta, parallel, quietly, wait_for_quiet, Quiet, QuietArgs},
    dex::Dex,
    ldap::{LdapUser, Slapd},
    pinniped_cli::{self, jwt_claims},
    supervisor::Supervisor,
    Cluster,
};
use selkie_oidc::https::HttpsClient;
use selkie_perf::procstat;
use serde_json::{json, Value};

/// LDAP logins, the Supervisor's and Dex's, against one slapd (perf/README.md, "LDAP logins").
#[derive(Debug, Parser)]
struct Args {
    /// Logins to measure, at the Supervisor and at Dex each.
    #[arg(long, default_value_t = 1000)]
    logins: usize,
    /// Concurrent clients (and directory users, one each) in every phase.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Logins at each before the measured phases (not measured).
    #[arg(long, default_value_t = 50)]
    warm_up: usize,
    /// The wait for a quiet machine and the re-measure of disturbed phases.
    #[command(flatten)]
    quiet: QuietArgs,
    /// The markdown report to write (the JSON goes beside it, `.json`).
    #[arg(long, default_value = "perf/results/ldap.md")]
    out: PathBuf,
}

/// The password of every directory user of the bench (a constant, never printed).
const PASSWORD: &str = "ldap-bench-password-0123";
/// The groups every user is a member of.
const GROUPS: [&str; 2] = ["bench", "seals"];
/// The FederationDomain's display name of the LDAP identity provider.
const IDP_NAME: &str = "OpenLDAP Users";
/// The scopes of Dex's password grant.
const DEX_SCOPE: &str = "openid email profile groups";
/// The target: logins per Supervisor CPU-second ÷ logins per Dex CPU-second.
const TARGET_RATIO: f64 = 2.0;

/// The processes whose CPU time is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Process {
    Supervisor,
    Dex,
    Slapd,
    Apiserver,
    Etcd,
}

impl Process {
    const ALL: [Process; 5] = [
        Self::Supervisor,
        Self::Dex,
        Self::Slapd,
        Self::Apiserver,
        Self::Etcd,
    ];

    /// Its name in the report.
    fn name(self) -> &'static str {
        ["Supervisor", "Dex", "slapd", "kube-apiserver", "etcd"][self as usize]
    }

    /// Its key in the JSON.
    fn key(self) -> &'static str {
        ["supervisor", "dex", "slapd", "kube_apiserver", "etcd"][self as usize]
    }
}

type Cpu = bench::Cpu<Process>;

/// One measured phase.
type Phase = bench::Phase<Process>;

/// The login server of a phase.
#[derive(Debug, Clone, Copy)]
enum Server {
    Supervisor,
    Dex,
}

/// The login name (`uid`) of the bench's directory user number `user`.
fn uid(user: usize) -> String {
    format!("bench-{user:04}")
}

/// Its `uidNumber` (the directory gives it the `mail` `user<uidNumber>@selkie.test`).
fn uid_number(user: usize) -> u32 {
    20_000 + user as u32
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.concurrency > 0 && args.logins > 0,
        "--logins and --concurrency must be positive"
    );
    selkie_e2e::install_crypto_provider();
    let load_at_start = procstat::load_average()?;

    let cluster = Cluster::shared().await?;
    let kube = cluster.client().await?;
    let namespace = cluster.create_namespace(&kube, "ldap-bench").await?;
    let users: Vec<LdapUser> = (0..args.concurrency)
        .map(|user| LdapUser {
            uid: uid(user),
            password: PASSWORD.into(),
            uid_number: uid_number(user),
            groups: GROUPS.map(String::from).to_vec(),
        })
        .collect();
    let slapd = Slapd::start(&users).await?;
    // The session collector's interval is longer than the run, so no sweep lands in a phase.
    let settings = json!({"sessionGarbageCollectionInterval": "1h"});
    let port = selkie_e2e::free_port()?;
    let supervisor = Supervisor::start_with(cluster, &namespace, &slapd, IDP_NAME, port, settings).await?;
    let phase_of_idp = "get ldapidentityprovider openldap -o jsonpath={.status.phase} -n";
    let phase_of_idp: Vec<&str> = phase_of_idp.split(' ').chain([namespace.as_str()]).collect();
    selkie_e2e::eventually(Duration::from_secs(60), || async {
        let phase = cluster.kubectl().run(&phase_of_idp).await?;
        ensure!(phase == "Ready", "the LDAPIdentityProvider's phase is {phase:?}");
        Ok(())
    })
    .await?;
    let dex = Arc::new(Dex::start_ldap(&slapd).await?);

    let [etcd, apiserver] = cluster.pids()[..] else {
        anyhow::bail!("the cluster has not exactly etcd and kube-apiserver");
    };
    let dex_pid = dex.pid().context("Dex is not running")?;
    let meter = Meter {
        pids: Process::ALL
            .into_iter()
            .zip([supervisor.pid(), dex_pid, slapd.pid(), apiserver, etcd])
            .collect(),
        kube,
    };
    let logins = Logins {
        http: supervisor.client()?,
        issuer: supervisor.issuer().into(),
        dex,
    };
    let (quiet, selkie, dex) =
        bench::with_supervisor_log(measure(&args, &meter, &logins).await, &supervisor)?;
    let results = Results {
        args: &args,
        load_at_start,
        quiet,
        kubernetes_version: cluster.kubernetes_version().to_string(),
        dex_build: bench::dex_build()?,
        slapd_version: selkie_perf::process::shell(
            "/usr/sbin/slapd -VV 2>&1 | sed -n 's/.*slapd \\([^ ]*\\) .*/\\1/p' | head -1",
        ),
        selkie,
        dex,
    };
    bench::write_report(&args.out, &results.json(), |json_path| {
        results.markdown(json_path)
    })
}

/// A quiet machine, the warm-up, then phase A (the Supervisor) and phase B (Dex).
async fn measure(args: &Args, meter: &Meter, logins: &Logins) -> Result<(Quiet, Phase, Phase)> {
    let quiet = wait_for_quiet(&args.quiet).await?;
    // Every client at once, so the connection pools grow to what the phases need.
    for server in [Server::Supervisor, Server::Dex] {
        run(args.warm_up, args.concurrency, logins, server)
            .await
            .with_context(|| format!("warm-up logins at {server:?}"))?;
    }
    let selkie = quietly(&args.quiet, || meter.phase(args, logins, Server::Supervisor)).await?;
    let dex = quietly(&args.quiet, || meter.phase(args, logins, Server::Dex)).await?;
    Ok((quiet, selkie, dex))
}

/// `total` logins at `server` by `concurrency` clients, client `n` logging user `n` in.
async fn run(total: usize, concurrency: usize, logins: &Logins, server: Server) -> Result<()> {
    let logins = logins.clone();
    parallel(total, (0..concurrency).collect(), move |user| {
        let logins = logins.clone();
        async move {
            match server {
                Server::Supervisor => logins.supervisor(user).await?,
                Server::Dex => logins.dex(user).await?,
            }
            Ok(user)
        }
    })
    .await?;
    Ok(())
}

/// The clients of both login servers.
#[derive(Clone)]
struct Logins {
    /// To the Supervisor: one pooled HTTPS client (HTTP/2 by ALPN).
    http: HttpsClient,
    issuer: Arc<str>,
    dex: Arc<Dex>,
}

impl Logins {
    /// A full cli_password login of `user` at the Supervisor; fails unless its ID token names the
    /// user and both groups.
    async fn supervisor(&self, user: usize) -> Result<()> {
        let tokens = pinniped_cli::login(&self.http, &self.issuer, IDP_NAME, &uid(user), PASSWORD).await?;
        let claims = jwt_claims(tokens["id_token"].as_str().context("no ID token")?)?;
        let (username, groups) = (&claims["username"], &claims["groups"]);
        ensure!(
            *username == uid(user).as_str() && has_groups(&claims),
            "the Supervisor's ID token for {}: username {username}, groups {groups}",
            uid(user),
        );
        Ok(())
    }

    /// A password grant of `user` at Dex; fails unless Dex answers with its ID token carrying
    /// the user's `email` and `name` (`mail` and `cn` in the directory) and both groups.
    async fn dex(&self, user: usize) -> Result<()> {
        let tokens = self
            .dex
            .password_grant_with_scope(&uid(user), PASSWORD, DEX_SCOPE)
            .await?;
        let claims = jwt_claims(&tokens.id_token)?;
        let email = format!("user{}@selkie.test", uid_number(user));
        let [iss, mail, name, groups] = ["iss", "email", "name", "groups"].map(|claim| &claims[claim]);
        ensure!(
            *iss == self.dex.issuer()
                && *mail == email.as_str()
                && *name == uid(user).as_str()
                && has_groups(&claims)
                && !tokens.access_token.is_empty(),
            "Dex's ID token for {}: iss {iss}, email {mail}, name {name}, groups {groups}",
            uid(user),
        );
        Ok(())
    }
}

/// Whether the JWT `claims` carry every one of [`GROUPS`] in `groups`.
fn has_groups(claims: &Value) -> bool {
    let groups = claims["groups"].as_array().map(Vec::as_slice).unwrap_or_default();
    GROUPS.iter().all(|group| groups.iter().any(|g| g == group))
}

/// Reads the CPU times and kube-apiserver's request counts around a phase.
struct Meter {
    pids: Vec<(Process, u32)>,
    kube: kube::Client,
}

impl Meter {
    /// `args.logins` logins at `server`, measured. The request counts are scraped outside the CPU
    /// window.
    async fn phase(&self, args: &Args, logins: &Logins, server: Server) -> Result<Phase> {
        let requests = apiserver_requests(&self.kube).await?;
        let (started, cpu) = (std::time::Instant::now(), Cpu::of(&self.pids)?);
        run(args.logins, args.concurrency, logins, server)
            .await
            .with_context(|| format!("logins at {server:?}"))?;
        let (wall, cpu) = (started.elapsed(), Cpu::of(&self.pids)?.since(&cpu));
        let requests = delta(&apiserver_requests(&self.kube).await?, &requests);
        Ok(Phase {
            name: match server {
                Server::Supervisor => "A: Supervisor, cli_password logins",
                Server::Dex => "B: Dex, password grants (LDAP connector)",
            },
            attempt: 1,
            operations: args.logins,
            wall,
            cpu,
            requests,
            extra: (),
        })
    }
}

/// The JSON of `phase`.
fn phase_json(phase: &Phase) -> Value {
    let us = |p: Process| (p.key().to_string(), json!(phase.micros_per_op(phase.cpu[p])));
    let mut cpu: serde_json::Map<String, Value> = Process::ALL.into_iter().map(us).collect();
    cpu.insert(
        "bench_clients".into(),
        json!(phase.micros_per_op(phase.cpu.bench)),
    );
    json!({
        "logins": phase.operations, "attempt": phase.attempt, "wall_seconds": phase.wall.as_secs_f64(),
        "logins_per_wall_second": phase.per_second(phase.wall),
        "cpu_us_per_login": cpu,
        "machine_busy_seconds": phase.cpu.machine.as_secs_f64(),
        "other_processes_share_of_machine": phase.others_share(),
        "apiserver_requests_per_login": {
            "secrets": phase.requests_per_op(Some("secrets"), None), "all": phase.requests_per_op(None, None),
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
    slapd_version: String,
    selkie: Phase,
    dex: Phase,
}

impl Results<'_> {
    /// Logins per CPU-second: (the Supervisor's, with its storage (kube-apiserver + etcd),
    /// Dex's).
    fn per_cpu_second(&self) -> (f64, f64, f64) {
        use Process::{Apiserver, Dex, Etcd, Supervisor};
        let (selkie, dex) = (&self.selkie, &self.dex);
        let with_storage = selkie.cpu[Supervisor] + selkie.cpu[Apiserver] + selkie.cpu[Etcd];
        (
            selkie.per_second(selkie.cpu[Supervisor]),
            selkie.per_second(with_storage),
            dex.per_second(dex.cpu[Dex]),
        )
    }

    fn json(&self) -> Value {
        let m = selkie_perf::process::Machine::describe();
        let (selkie, with_storage, dex) = self.per_cpu_second();
        json!({
            "machine": {
                "cpu_model": m.cpu_model, "cores": m.cores, "kernel": m.kernel, "memory": m.memory,
                "rustc": m.rustc, "load_at_start": self.load_at_start, "quiet_before_phases": self.quiet,
            },
            "versions": {
                "slapd": self.slapd_version, "dex_build": self.dex_build, "kube_apiserver": self.kubernetes_version,
            },
            "concurrency": self.args.concurrency, "warm_up_logins": self.args.warm_up,
            "phases": {"supervisor_cli_password": phase_json(&self.selkie), "dex_password_grant": phase_json(&self.dex)},
            "target": {
                "logins_per_supervisor_cpu_second": selkie, "logins_per_dex_cpu_second": dex,
                "ratio": selkie / dex, "target": TARGET_RATIO, "met": selkie / dex >= TARGET_RATIO,
                "logins_per_cpu_second_of_supervisor_kube_apiserver_etcd": with_storage,
                "ratio_with_storage": with_storage / dex,
            },
        })
    }

    fn markdown(&self, json_path: &std::path::Path) -> String {
        use std::fmt::Write as _;
        let selkie_perf::process::Machine {
            cpu_model,
            cores,
            kernel,
            memory,
            ..
        } = selkie_perf::process::Machine::describe();
        let Args {
            logins,
            concurrency,
            warm_up,
            ..
        } = self.args;
        let [l1, l5, l15] = self.load_at_start;
        let (busy, waited) = (self.quiet.busy * 100.0, self.quiet.waited_seconds);
        let quiet = if self.quiet.quiet {
            "quiet"
        } else {
            "**not quiet**"
        };
        let (slapd, dex_build, kubernetes) = (&self.slapd_version, &self.dex_build, &self.kubernetes_version);
        let (selkie, with_storage, dex) = self.per_cpu_second();
        let (ratio, storage_ratio) = (selkie / dex, with_storage / dex);
        let met = if ratio >= TARGET_RATIO { "yes" } else { "**no**" };
        let processes: String = Process::ALL
            .iter()
            .map(|p| format!(" {} CPU µs |", p.name()))
            .collect();
        let mut md = format!(
            "# LDAP logins: the Selkie Supervisor and Dex's LDAP connector, one slapd\n\n\
             Target: **≥ 2× Dex's logins per CPU-second** (logins per Supervisor CPU-second ÷ logins per \
             Dex CPU-second).\n\n\
             * Command: `perf/ldap` (release `selkie-supervisor`): {logins} logins at each, {concurrency} \
               concurrent clients on loopback (client n logs directory user n in, again and again), after \
               {warm_up} warm-up logins at each. Every answer checked: the Supervisor's ID token names the \
               user and both groups; Dex's is Dex's, with the user's `email` (`mail`), `name` (`cn`) and both \
               groups.\n\
             * Components: OpenLDAP slapd {slapd} (MDB, `ldaps://` with an ECDSA P-256 certificate, one user \
               per client in 2 `groupOfNames`); the Supervisor with one FederationDomain and one \
               LDAPIdentityProvider (`ldaps://`, users by `uid`, groups by `member`), its sessions in Secrets \
               of kube-apiserver {kubernetes} with etcd (the e2e harness: `--unsafe-no-fsync`); Dex \
               {dex_build} with memory storage, its `ldap` connector as the password connector (`ldaps://`, \
               the same bind account, search bases and filters).\n\
             * Machine: {cpu_model} ({cores}), {kernel}, {memory} RAM; load average at start {l1:.2} / \
               {l5:.2} / {l15:.2}; before the warm-up the machine was {busy:.0} % busy over 5 s ({quiet}, \
               after {waited:.0} s of waiting). All processes share the two cores, unpinned.\n\n\
             ## Target\n\n\
             | logins per CPU-second of | Selkie | Dex | ratio | target | met? |\n|---|---|---|---|---|---|\n\
             | the login server (Supervisor; Dex) | {selkie:.0} | {dex:.0} | {ratio:.2}× | ≥ 2× | {met} |\n\
             | the login server and its storage (Supervisor + kube-apiserver + etcd; Dex, in memory) \
             | {with_storage:.0} | {dex:.0} | {storage_ratio:.2}× | — | — |\n\n\
             ## Per login\n\n\
             | phase | logins | wall | logins per wall second |{processes} bench clients CPU µs \
             | kube-apiserver requests (Secrets) | other processes, % of the machine |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for phase in [&self.selkie, &self.dex] {
            let cpu: String = Process::ALL
                .iter()
                .map(|&p| format!(" {:.0} |", phase.micros_per_op(phase.cpu[p])))
                .collect();
            let attempt = match phase.attempt {
                1 => String::new(),
                n => format!(" (attempt {n})"),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} s | {:.0} |{cpu} {:.0} | {:.2} ({:.2}) | {:.0} %{attempt} |",
                phase.name,
                phase.operations,
                phase.wall.as_secs_f64(),
                phase.per_second(phase.wall),
                phase.micros_per_op(phase.cpu.bench),
                phase.requests_per_op(None, None),
                phase.requests_per_op(Some("secrets"), None),
                phase.others_share() * 100.0,
            );
        }
        let json_name = json_path.file_name().unwrap_or_default().to_string_lossy();
        let _ = write!(
            md,
            "\n## Reading the numbers\n\n\
             * The two logins are not the same work. A Supervisor login is two HTTP requests (the \
               authorization request with the password headers, then the code redeemed at the token \
               endpoint), and it stores the session in Kubernetes Secrets: the authorization code, then \
               the access and refresh tokens (the requests column). That storage is kube-apiserver's and \
               etcd's CPU, in their own columns, left out of the target's ratio and counted in the target \
               table's second row. Dex's login is one request (the password grant), and Dex keeps what it \
               stores in memory. Both search the user as the bind account, bind as the user and search the \
               groups. The Supervisor answers with an ES256 ID token, an opaque access token and a refresh \
               token; Dex with an RS256 ID token and an RS256 JWT access token (two RSA-2048 signatures).\n\
             * slapd's column is what each server's way of speaking LDAP costs the directory: the \
               Supervisor keeps its TLS connections to slapd open; Dex's connector dials a new `ldaps://` \
               connection (a TLS handshake and a bind as the bind account) for the user search and the \
               user's bind, and another for the group search.\n\
             * CPU is utime + stime from `/proc/PID/stat` (10 ms ticks: ±10 ms per process per phase); \
               the bench's clients are a debug build. \"Other processes\" is the machine's busy time \
               (`/proc/stat`) less the bench's processes: a phase where it exceeded {:.0} % was measured \
               again after waiting for a quiet machine (up to {} attempts; the least disturbed one is shown, \
               its number when not the first).\n\
             * Raw numbers: `{json_name}`.\n",
            self.args.quiet.interference * 100.0,
            self.args.quiet.attempts,
        );
        md
    }
}
