//! `selkie-soak`: issue 27's soak, run by `perf/soak`.
//!
//! Both servers, real, on loopback, under mixed traffic for `--minutes` (30; `--smoke`: 1):
//! the Concierge installed from `conf/` (control plane included) on a real kube-apiserver with a
//! JWTAuthenticator for Dex, and the Supervisor with an OIDCIdentityProvider for the same Dex.
//! Every stream is paced at a fixed rate and ends at the deadline; every operation has a deadline
//! of its own ([`OP_TIMEOUT`]) and its answer is checked:
//!
//! * through the Concierge's impersonation proxy, as a client-certificate user (the cluster's
//!   client CA) and as a Dex-token user: ConfigMap GETs and lists, and merge patches, each user
//!   writing ConfigMaps of its own;
//! * `--watches` held watches through the proxy (half per user) on the namespace's ConfigMaps from
//!   the resourceVersion before the first write, re-established from their last resourceVersion
//!   when kube-apiserver ends them (`timeoutSeconds`), which must each see every write the
//!   writers had acknowledged (a missed event fails the run);
//! * WebSocket upgrades through the proxy to the harness's echo aggregated API (`echoes/exec`,
//!   reached through kube-apiserver's aggregation layer: the harness has no kubelet, so this
//!   stands in for `kubectl exec`), messages echoed byte for byte;
//! * anonymous TokenCredentialRequests with the Dex token through kube-apiserver's aggregation
//!   layer, the issued certificate then used for a GET through the proxy;
//! * at the Supervisor, as Pinniped's CLI does (`cli_password`): full logins, a refresh chain
//!   (each refresh spends the previous refresh token; Dex refreshes inside), and RFC 8693 token
//!   exchanges of the chain's current access token.
//!
//! Every `--sample-seconds` both servers' RSS, open file descriptors, threads and CPU are read
//! from `/proc`. After the run: per server the first sample after the warm-up (the first 20 % of
//! the run) against the last, and the least-squares slope of RSS and fds per 10 minutes over
//! the samples after the warm-up. The run fails (non-zero exit, the report still written) when an
//! operation failed, a watch missed an event, fds grew by more than `--fd-growth` or RSS by more
//! than max(8 MiB, 10 %) after the warm-up. No token or password is printed.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Parser;
use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    Api,
};
use rustls_pki_types::{pem::PemObject as _, CertificateDer};
use selkie_e2e::{
    bench::{tail, write_report},
    cluster::{client_from_kubeconfig, write_kubeconfig, write_kubeconfig_for_user},
    concierge::InstalledConcierge,
    dex::{Dex, DexUser, CLIENT_ID},
    echo_api::{websocket_exec, EchoApi},
    eventually, pinniped_cli,
    pki::CertAndKey,
    supervisor::Supervisor,
    Cluster,
};
use selkie_oidc::https::HttpsClient;
use selkie_perf::procstat;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{Error, Message};

/// Issue 27's soak: mixed traffic at both servers with RSS and open fds sampled (perf/README.md,
/// "Soak").
#[derive(Debug, Parser)]
struct Args {
    /// Length of the run, in minutes.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// The smoke pass: 1 minute (unless --minutes says otherwise), samples every 5 s, 20 watches;
    /// results to target/perf-smoke/soak-smoke.{md,json} unless --out says otherwise.
    #[arg(long)]
    smoke: bool,
    /// Seconds between samples of the servers [default: 30; --smoke: 5].
    #[arg(long)]
    sample_seconds: Option<f64>,
    /// Held watches through the proxy [default: 50; --smoke: 20].
    #[arg(long)]
    watches: Option<usize>,
    /// ConfigMap reads (GET and list by turns) per second, per user.
    #[arg(long, default_value_t = 10.0)]
    reads_per_second: f64,
    /// ConfigMap writes (merge patches) per second, per user.
    #[arg(long, default_value_t = 2.0)]
    writes_per_second: f64,
    /// WebSocket upgrades through the proxy per second.
    #[arg(long, default_value_t = 1.0)]
    execs_per_second: f64,
    /// TokenCredentialRequests (each followed by a GET with the issued certificate) per second.
    #[arg(long, default_value_t = 1.0)]
    tcrs_per_second: f64,
    /// Full cli_password logins at the Supervisor per second.
    #[arg(long, default_value_t = 0.2)]
    logins_per_second: f64,
    /// Refresh grants at the Supervisor per second (one chain).
    #[arg(long, default_value_t = 1.0)]
    refreshes_per_second: f64,
    /// RFC 8693 token exchanges at the Supervisor per second.
    #[arg(long, default_value_t = 5.0)]
    exchanges_per_second: f64,
    /// Every rate above is multiplied by this [default: 1; --smoke: 0.5].
    #[arg(long)]
    rate_scale: Option<f64>,
    /// Most open fds a server may gain from the first sample after the warm-up to the last.
    #[arg(long, default_value_t = 20)]
    fd_growth: i64,
    /// The markdown report (the JSON beside it, `.json`) [default: perf/results/soak.md;
    /// --smoke: target/perf-smoke/soak-smoke.md].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The deadline of one operation (a request, an upgrade with its echoes, a login).
const OP_TIMEOUT: Duration = Duration::from_secs(15);
/// The share of the run that is warm-up (not judged for growth).
const WARM_UP_SHARE: f64 = 0.2;
/// RSS may grow by max(this, [`RSS_GROWTH_SHARE`]) after the warm-up.
const RSS_GROWTH_KIB: u64 = 8 * 1024;
const RSS_GROWTH_SHARE: f64 = 0.10;
/// The password of every Dex user of the soak (a constant, never printed).
const PASSWORD: &str = "soak-password-0123";
/// The client-certificate user through the proxy.
const CERT_USER: &str = "soak-cert-user";
/// The Dex users: through the proxy (ID token, TokenCredentialRequests), the Supervisor's
/// logins, the Supervisor's refresh chain (Dex keeps one refresh token per user and client, so a
/// login of the chain's user would revoke the chain's upstream token).
const JWT_USER: &str = "soak-jwt@example.com";
const LOGIN_USER: &str = "soak-login@example.com";
const CHAIN_USER: &str = "soak-chain@example.com";
/// The group of every soak user, which the RBAC of the load's namespace names.
const GROUP: &str = "soak";
/// The cluster audience of the token exchanges.
const AUDIENCE: &str = "soak-cluster";
/// ConfigMaps each writing user cycles through.
const CONFIGMAPS_PER_USER: u64 = 10;
const IDP_NAME: &str = pinniped_cli::IDP_DISPLAY_NAME;
const TCR_PATH: &str = "/apis/login.concierge.pinniped.dev/v1alpha1/tokencredentialrequests";

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke && !std::env::args().any(|arg| arg.starts_with("--minutes")) {
        args.minutes = 1.0;
    }
    ensure!(args.minutes > 0.0, "--minutes must be positive");
    let scale = args.rate_scale.unwrap_or(if args.smoke { 0.5 } else { 1.0 });
    for rate in [
        &mut args.reads_per_second,
        &mut args.writes_per_second,
        &mut args.execs_per_second,
        &mut args.tcrs_per_second,
        &mut args.logins_per_second,
        &mut args.refreshes_per_second,
        &mut args.exchanges_per_second,
    ] {
        *rate *= scale;
    }
    selkie_e2e::install_crypto_provider();
    let load_at_start = procstat::load_average()?;
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(if args.smoke {
            "target/perf-smoke/soak-smoke.md"
        } else {
            "perf/results/soak.md"
        })
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let started = std::time::Instant::now();
    let world = World::start().await.context("starting the components")?;
    let setup_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "components up in {setup_seconds:.0} s; soaking for {} min",
        args.minutes
    );
    let run = match soak(&args, &world).await {
        Ok(run) => run,
        Err(error) => {
            return Err(error.context(format!(
                "--- Concierge log ends ---\n{}\n--- Supervisor log ends ---\n{}",
                tail(&world.concierge.process().log(), 20),
                tail(&world.supervisor.log(), 20)
            )))
        }
    };
    let verdict = run.verdict(&args);
    let json = run.json(&args, &world, load_at_start, setup_seconds, &verdict);
    write_report(&out, &json, |json_path| markdown(&json, json_path))?;
    ensure!(
        verdict.is_empty(),
        "the soak failed (the report is written):\n{}",
        verdict.join("\n")
    );
    Ok(())
}

/// The running components and the clients of the load.
struct World {
    // Field order is drop order: the proxy stops before the echo API is unregistered.
    concierge: InstalledConcierge,
    supervisor: Supervisor,
    echo: EchoApi,
    dex: Dex,
    cluster: &'static Cluster,
    namespace: String,
    /// kube clients through the proxy: the client-certificate user, the Dex-token user.
    cert_client: kube::Client,
    jwt_client: kube::Client,
    /// An anonymous client of kube-apiserver (TokenCredentialRequests).
    anonymous: kube::Client,
    /// The Dex ID token of [`JWT_USER`] (never printed).
    jwt: String,
    /// The proxy's URL and the CA its CredentialIssuer advertises.
    proxy_url: String,
    proxy_ca: String,
    cert_user: CertAndKey,
}

impl World {
    async fn start() -> Result<Self> {
        let cluster = Cluster::shared().await?;
        let admin = cluster.client().await?;
        let namespace = cluster.create_namespace(&admin, "soak").await?;
        let supervisor_namespace = cluster.create_namespace(&admin, "soak-supervisor").await?;
        let users: Vec<DexUser> = [JWT_USER, LOGIN_USER, CHAIN_USER]
            .iter()
            .enumerate()
            .map(|(n, email)| DexUser {
                email: email.to_string(),
                password: PASSWORD.into(),
                user_id: format!("soak-{n}"),
                groups: vec![GROUP.into()],
            })
            .collect();
        let dex = Dex::start(&users).await?;
        let concierge = InstalledConcierge::install(cluster).await?;
        let (proxy_url, proxy_ca) = concierge.expose_proxy(cluster).await?;
        concierge
            .apply_jwt_authenticator(cluster, "dex", dex.issuer(), CLIENT_ID, &dex.ca_pem())
            .await?;
        let supervisor = Supervisor::start_with(
            cluster,
            &supervisor_namespace,
            &dex,
            IDP_NAME,
            selkie_e2e::free_port()?,
            // Expired sessions are collected every minute (the harness's default is every second).
            json!({"sessionGarbageCollectionInterval": "1m"}),
        )
        .await?;
        let echo = EchoApi::start(cluster, &namespace).await?;
        echo.grant_exec(cluster, &namespace, CERT_USER, &["get"]).await?;
        cluster
            .kubectl()
            .create_role_and_binding(
                &namespace,
                "soak-configmaps",
                "get,list,watch,patch,update,create",
                "configmaps",
                &[&format!("--group={GROUP}")],
            )
            .await?;
        let cert_user = cluster.pki().client_ca.issue_client(CERT_USER, &[GROUP])?;
        let cert_kubeconfig = concierge.dir().join("soak-cert.kubeconfig");
        write_kubeconfig(&cert_kubeconfig, &proxy_url, &proxy_ca, CERT_USER, &cert_user)?;
        let jwt = dex.password_grant(JWT_USER, PASSWORD).await?.id_token;
        let jwt_kubeconfig = concierge.dir().join("soak-jwt.kubeconfig");
        write_kubeconfig_for_user(
            &jwt_kubeconfig,
            &proxy_url,
            &proxy_ca,
            "soak-jwt",
            json!({ "token": jwt }),
        )?;
        let mut anonymous = kube::Config::new(cluster.server_url().parse()?);
        anonymous.root_cert = Some(vec![CertificateDer::from_pem_slice(
            cluster.pki().server_ca.cert_pem().as_bytes(),
        )?
        .to_vec()]);
        Ok(Self {
            cert_client: client_from_kubeconfig(&cert_kubeconfig).await?,
            jwt_client: client_from_kubeconfig(&jwt_kubeconfig).await?,
            anonymous: kube::Client::try_from(anonymous)?,
            concierge,
            supervisor,
            echo,
            dex,
            cluster,
            namespace,
            jwt,
            proxy_url,
            proxy_ca,
            cert_user,
        })
    }

    fn configmaps(&self, client: &kube::Client) -> Api<ConfigMap> {
        Api::namespaced(client.clone(), &self.namespace)
    }
}

/// One paced stream's outcome.
#[derive(Debug, Default)]
struct Stream {
    ok: u64,
    failed: u64,
    /// The first few failures, in order.
    errors: Vec<String>,
    slowest: Duration,
}

impl Stream {
    fn record(&mut self, result: Result<()>, took: Duration) {
        self.slowest = self.slowest.max(took);
        match result {
            Ok(()) => self.ok += 1,
            Err(error) => {
                self.failed += 1;
                if self.errors.len() < 5 {
                    self.errors.push(format!("{error:#}"));
                }
            }
        }
    }
}

/// Runs `op` `per_second` times a second (a late tick is not made up) until `until`, each with
/// [`OP_TIMEOUT`].
async fn paced<F, Fut>(per_second: f64, until: Instant, mut op: F) -> Stream
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut stream = Stream::default();
    if per_second <= 0.0 {
        return stream;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0.. {
        tick.tick().await;
        if Instant::now() >= until {
            break;
        }
        let began = Instant::now();
        let result = tokio::time::timeout(OP_TIMEOUT, op(n))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no end within {OP_TIMEOUT:?}")));
        stream.record(result, began.elapsed());
    }
    stream
}

/// The resourceVersion of an object as a number (etcd's revision).
fn revision(meta: &kube::api::ObjectMeta) -> Result<u64> {
    meta.resource_version
        .as_deref()
        .context("no resourceVersion")?
        .parse()
        .context("a resourceVersion that is not a number")
}

/// What one held watch saw.
#[derive(Debug, Default)]
struct Watched {
    /// resourceVersions of the events seen.
    seen: BTreeSet<u64>,
    /// Times the watch was started again after kube-apiserver ended it, or after a read error
    /// (`broken`: a read that timed out, a connection that broke).
    restarts: u64,
    broken: u64,
    /// Watch requests refused and events of type ERROR (410 Gone: the watch fell behind), all
    /// counted, the first few kept.
    errors: u64,
    first_errors: Vec<String>,
}

impl Watched {
    fn error(&mut self, error: String) {
        self.errors += 1;
        if self.first_errors.len() < 3 {
            self.first_errors.push(error);
        }
    }
}

/// Holds a watch on `api` from `rv` until `stop`, restarting it from the last resourceVersion
/// seen whenever it ends.
async fn hold_watch(
    api: Api<ConfigMap>,
    mut rv: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Watched {
    let mut watched = Watched::default();
    let params = WatchParams::default().timeout(290);
    'outer: while !*stop.borrow() {
        let stream = tokio::select! {
            stream = tokio::time::timeout(OP_TIMEOUT, api.watch(&params, &rv)) => stream,
            _ = stop.changed() => break,
        };
        let mut stream = match stream {
            Ok(Ok(stream)) => stream.boxed(),
            Ok(Err(error)) => {
                watched.error(format!("starting a watch: {error}"));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(_) => {
                watched.error(format!("starting a watch: no answer within {OP_TIMEOUT:?}"));
                continue;
            }
        };
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                _ = stop.changed() => break 'outer,
            };
            match event {
                Some(Ok(WatchEvent::Added(cm) | WatchEvent::Modified(cm) | WatchEvent::Deleted(cm))) => {
                    if let Ok(seen) = revision(&cm.metadata) {
                        watched.seen.insert(seen);
                        rv = seen.to_string();
                    }
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => rv = bookmark.metadata.resource_version,
                Some(Ok(WatchEvent::Error(status))) => {
                    watched.error(format!("an ERROR event: {} {}", status.code, status.message));
                    // 410 Gone: start again from now, as an informer re-lists (what the watch
                    // did not see counts as missed).
                    if status.code == 410 {
                        if let Ok(Some(now)) = api
                            .list_metadata(&ListParams::default().limit(1))
                            .await
                            .map(|list| list.metadata.resource_version)
                        {
                            rv = now;
                        }
                    }
                    break;
                }
                // A read that timed out or a broken connection: start again from the last
                // resourceVersion, as an informer does.
                Some(Err(_)) => {
                    watched.broken += 1;
                    break;
                }
                // kube-apiserver ended the watch (`timeoutSeconds`).
                None => break,
            }
        }
        watched.restarts += 1;
    }
    watched
}

/// A WebSocket upgrade through the proxy to the echo API's `exec`, as the client-certificate
/// user: two messages echoed byte for byte, then a clean close.
async fn exec(world: &World, path: &str, n: u64) -> Result<()> {
    let mut socket = websocket_exec(&world.proxy_url, &world.proxy_ca, &world.cert_user, path)
        .await
        .context("the upgrade")?;
    for m in 0..2u64 {
        let payload: Vec<u8> = (0..1024u64).map(|i| ((i + n + m) % 251) as u8).collect();
        socket.send(Message::binary(payload.clone())).await?;
        match socket.next().await {
            Some(Ok(Message::Binary(echoed))) if echoed == payload => {}
            other => bail!("message {m} came back as {:?}", other.map(|m| m.map(|m| m.len()))),
        }
    }
    socket.close(None).await?;
    // The server's Close frame, then the end of the stream.
    loop {
        match socket.next().await {
            None | Some(Err(Error::ConnectionClosed | Error::AlreadyClosed)) => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error).context("closing"),
        }
    }
}

/// One TokenCredentialRequest with the Dex token; the certificate it issues must then read a
/// ConfigMap through the proxy.
async fn token_credential_request(world: &World, dir: &Path) -> Result<()> {
    let body = serde_json::to_vec(&json!({
        "apiVersion": "login.concierge.pinniped.dev/v1alpha1",
        "kind": "TokenCredentialRequest",
        "spec": {"token": world.jwt, "authenticator": {
            "apiGroup": "authentication.concierge.pinniped.dev", "kind": "JWTAuthenticator", "name": "dex"}},
    }))?;
    let request = http::Request::post(TCR_PATH)
        .header("content-type", "application/json")
        .body(body)?;
    let answer: Value = world.anonymous.request(request).await?;
    let credential = &answer["status"]["credential"];
    let (Some(cert_pem), Some(key_pem)) = (
        credential["clientCertificateData"].as_str(),
        credential["clientKeyData"].as_str(),
    ) else {
        bail!("no credential: {}", answer["status"]["message"]);
    };
    let issued = CertAndKey {
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
    };
    let path = dir.join("issued.kubeconfig");
    write_kubeconfig(&path, &world.proxy_url, &world.proxy_ca, "issued", &issued)?;
    let client = client_from_kubeconfig(&path).await?;
    world.configmaps(&client).get(&configmap_name("cert", 0)).await?;
    Ok(())
}

fn configmap_name(user: &str, n: u64) -> String {
    format!("soak-{user}-{:02}", n % CONFIGMAPS_PER_USER)
}

/// A merge patch of `user`'s ConfigMap number `n` (modulo) through `api`: its resourceVersion.
async fn write(api: &Api<ConfigMap>, user: &str, n: u64) -> Result<u64> {
    let patch = json!({"data": {"n": n.to_string()}});
    let written = api
        .patch(
            &configmap_name(user, n),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    revision(&written.metadata)
}

/// A sample of one server.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct ServerSample {
    rss_kib: u64,
    fds: usize,
    threads: u64,
    /// Cores busy since the previous sample (utime + stime).
    cpu_cores: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Sample {
    /// Seconds since the load started.
    at: f64,
    concierge: ServerSample,
    supervisor: ServerSample,
    /// Cores busy since the previous sample: kube-apiserver, etcd, Dex and this process (the
    /// load's clients and the echo API) together.
    harness_cores: f64,
    /// The machine's CPU busy share (0–1, all cores) since the previous sample.
    machine_busy: f64,
}

/// Samples `pids` (Concierge, Supervisor) every `every` until `until` (once at the start and once
/// at the end too); `harness` are the other processes of the soak.
async fn sampler(pids: [u32; 2], harness: &[u32], every: Duration, until: Instant) -> Result<Vec<Sample>> {
    let began = Instant::now();
    let mut previous = (
        began,
        [procstat::cpu_time(pids[0])?, procstat::cpu_time(pids[1])?],
        procstat::machine_jiffies(),
        procstat::total_cpu_time(harness)?,
    );
    let mut samples = Vec::new();
    let mut next = began;
    loop {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let wall = now.duration_since(previous.0).as_secs_f64().max(1e-3);
        let cpu = [procstat::cpu_time(pids[0])?, procstat::cpu_time(pids[1])?];
        let jiffies = procstat::machine_jiffies();
        let harness_cpu = procstat::total_cpu_time(harness)?;
        let server = |i: usize| -> Result<ServerSample> {
            Ok(ServerSample {
                rss_kib: procstat::rss_kib(pids[i])?,
                fds: procstat::open_fds(pids[i])?,
                threads: procstat::threads(pids[i])?,
                cpu_cores: cpu[i].saturating_sub(previous.1[i]).as_secs_f64() / wall,
            })
        };
        let total = jiffies.1.saturating_sub(previous.2 .1);
        samples.push(Sample {
            at: now.duration_since(began).as_secs_f64(),
            concierge: server(0)?,
            supervisor: server(1)?,
            harness_cores: harness_cpu.saturating_sub(previous.3).as_secs_f64() / wall,
            machine_busy: jiffies.0.saturating_sub(previous.2 .0) as f64 / total.max(1) as f64,
        });
        previous = (now, cpu, jiffies, harness_cpu);
        if next >= until {
            return Ok(samples);
        }
        next = (next + every).min(until);
    }
}

/// Everything the run measured.
struct Run {
    duration: Duration,
    streams: BTreeMap<&'static str, Stream>,
    /// The writes acknowledged (resourceVersions) and what each watch saw.
    writes: BTreeSet<u64>,
    watches: Vec<Watched>,
    samples: Vec<Sample>,
}

/// The soak itself: the streams and the sampler until the deadline, then the watches given time
/// to catch up with the last writes.
async fn soak(args: &Args, world: &World) -> Result<Run> {
    let watches = args.watches.unwrap_or(if args.smoke { 20 } else { 50 });
    let every = Duration::from_secs_f64(args.sample_seconds.unwrap_or(if args.smoke { 5.0 } else { 30.0 }));
    let (cert_api, jwt_api) = (
        world.configmaps(&world.cert_client),
        world.configmaps(&world.jwt_client),
    );
    // The ConfigMaps each user writes, created by the user through the proxy.
    for (api, user) in [(&cert_api, "cert"), (&jwt_api, "jwt")] {
        for n in 0..CONFIGMAPS_PER_USER {
            let configmap = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(configmap_name(user, n)),
                    ..Default::default()
                },
                // (Not a value a write sets: a merge patch that changes nothing makes no event.)
                data: Some([("n".to_string(), "created".to_string())].into()),
                ..Default::default()
            };
            let create = || async { Ok(api.create(&PostParams::default(), &configmap).await?) };
            eventually(Duration::from_secs(30), create)
                .await
                .with_context(|| format!("creating the ConfigMaps of the {user} user through the proxy"))?;
        }
    }
    // Every stream once before the clock starts (RBAC and the APIServices are settled).
    let exec_path = world.echo.exec_path(&world.namespace, "soak");
    eventually(Duration::from_secs(30), || exec(world, &exec_path, 0))
        .await
        .context("the first upgrade through the proxy")?;
    let dir = tempfile::Builder::new().prefix("selkie-soak-").tempdir()?;
    eventually(Duration::from_secs(60), || {
        token_credential_request(world, dir.path())
    })
    .await
    .context("the first TokenCredentialRequest")?;
    let http = world.supervisor.client()?;
    let issuer = world.supervisor.issuer().to_string();
    let token_url = format!("{issuer}/oauth2/token");
    let login = |email: &'static str| {
        let (http, issuer) = (&http, &issuer);
        async move { pinniped_cli::login_session(http, issuer, IDP_NAME, email, PASSWORD).await }
    };
    let chain = tokio::sync::Mutex::new(login(CHAIN_USER).await.context("the first login")?);

    let start_rv = cert_api
        .list_metadata(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .context("no resourceVersion in the list")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let held: Vec<_> = (0..watches)
        .map(|n| {
            let api = if n % 2 == 0 {
                cert_api.clone()
            } else {
                jwt_api.clone()
            };
            tokio::spawn(hold_watch(api, start_rv.clone(), stop_rx.clone()))
        })
        .collect();

    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let until = Instant::now() + duration;
    let writes = Mutex::new(BTreeSet::new());
    let acknowledge = |rv: u64| {
        writes.lock().unwrap_or_else(|e| e.into_inner()).insert(rv);
    };
    let reads = |api: Api<ConfigMap>, user: &'static str| {
        paced(args.reads_per_second, until, move |n| {
            let api = api.clone();
            async move {
                if n % 2 == 0 {
                    api.get(&configmap_name(user, n / 2)).await?;
                } else {
                    let listed = api.list(&ListParams::default()).await?;
                    ensure!(
                        listed.items.len() as u64 >= 2 * CONFIGMAPS_PER_USER,
                        "a list of {} ConfigMaps",
                        listed.items.len()
                    );
                }
                Ok(())
            }
        })
    };
    let writer = |api: Api<ConfigMap>, user: &'static str| {
        let acknowledge = &acknowledge;
        paced(args.writes_per_second, until, move |n| {
            let api = api.clone();
            async move {
                acknowledge(write(&api, user, n).await?);
                Ok(())
            }
        })
    };
    let (chain, http, token_url, issuer, login) = (&chain, &http, &token_url, &issuer, &login);
    let streams = async {
        let (cert_reads, jwt_reads, cert_writes, jwt_writes, execs, tcrs, logins, refreshes, exchanges) = tokio::join!(
            reads(cert_api.clone(), "cert"),
            reads(jwt_api.clone(), "jwt"),
            writer(cert_api.clone(), "cert"),
            writer(jwt_api.clone(), "jwt"),
            paced(args.execs_per_second, until, |n| exec(world, &exec_path, n)),
            paced(args.tcrs_per_second, until, |_| token_credential_request(
                world,
                dir.path()
            )),
            paced(args.logins_per_second, until, move |_| async move {
                login(LOGIN_USER).await.map(drop)
            }),
            paced(args.refreshes_per_second, until, move |_| async move {
                let mut session = chain.lock().await;
                match pinniped_cli::refresh_session(http, token_url, session.clone()).await {
                    Ok(refreshed) => {
                        *session = refreshed;
                        Ok(())
                    }
                    // The chain is broken (the token may have been spent): a new login mends it,
                    // and the failure counts.
                    Err(error) => {
                        if let Ok(fresh) = login(CHAIN_USER).await {
                            *session = fresh;
                        }
                        Err(error)
                    }
                }
            }),
            paced(args.exchanges_per_second, until, move |_| async move {
                let access = chain.lock().await.access.clone();
                exchange(http, token_url, issuer, &access).await
            }),
        );
        BTreeMap::from([
            ("proxy: reads, client certificate", cert_reads),
            ("proxy: reads, Dex token", jwt_reads),
            ("proxy: writes, client certificate", cert_writes),
            ("proxy: writes, Dex token", jwt_writes),
            ("proxy: WebSocket exec (echo API)", execs),
            ("Concierge: TokenCredentialRequest + GET", tcrs),
            ("Supervisor: cli_password logins", logins),
            ("Supervisor: refreshes", refreshes),
            ("Supervisor: token exchanges", exchanges),
        ])
    };
    let pids = [world.concierge.process().pid(), world.supervisor.pid()];
    let mut harness = world.cluster.pids();
    harness.extend(world.dex.pid());
    harness.push(std::process::id());
    let (streams, samples) = tokio::join!(streams, sampler(pids, &harness, every, until));
    let samples = samples?;

    // The watches catch up with the last writes (at most 20 s), then stop.
    let writes = writes.into_inner().unwrap_or_else(|e| e.into_inner());
    tokio::time::sleep(Duration::from_secs(if args.smoke { 5 } else { 20 })).await;
    stop_tx.send(true)?;
    let mut watched = Vec::new();
    for watch in held {
        watched.push(watch.await.context("a watch task ended abnormally")?);
    }
    Ok(Run {
        duration,
        streams,
        writes,
        watches: watched,
        samples,
    })
}

/// One token exchange of `access` for an ID token of [`AUDIENCE`], checked.
async fn exchange(http: &HttpsClient, token_url: &str, issuer: &str, access: &str) -> Result<()> {
    let (status, answer) = pinniped_cli::exchange(http, token_url, AUDIENCE, access).await?;
    ensure!(
        status == 200,
        "token exchange: {status}: {}",
        pinniped_cli::without_tokens(&answer)
    );
    let claims = pinniped_cli::jwt_claims(&pinniped_cli::string(&answer, "access_token")?)?;
    ensure!(
        pinniped_cli::has_audience(&claims, AUDIENCE)
            && claims["iss"] == issuer
            && claims["username"] == CHAIN_USER,
        "the exchanged token: iss {}, aud {}, username {}",
        claims["iss"],
        claims["aud"],
        claims["username"]
    );
    Ok(())
}

/// Growth of one quantity over the samples after the warm-up.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Growth {
    first: f64,
    last: f64,
    /// Least-squares slope, per 10 minutes.
    slope_per_10_min: f64,
}

fn growth(samples: &[&Sample], value: impl Fn(&Sample) -> f64) -> Growth {
    let n = samples.len() as f64;
    let (mean_t, mean_v) = samples
        .iter()
        .fold((0.0, 0.0), |(t, v), s| (t + s.at / n, v + value(s) / n));
    let (cov, var) = samples.iter().fold((0.0, 0.0), |(cov, var), s| {
        let dt = s.at - mean_t;
        (cov + dt * (value(s) - mean_v), var + dt * dt)
    });
    Growth {
        first: samples.first().map_or(0.0, |s| value(s)),
        last: samples.last().map_or(0.0, |s| value(s)),
        slope_per_10_min: if var > 0.0 { cov / var * 600.0 } else { 0.0 },
    }
}

impl Run {
    fn after_warm_up(&self) -> Vec<&Sample> {
        let warm_up = self.duration.as_secs_f64() * WARM_UP_SHARE;
        self.samples.iter().filter(|s| s.at >= warm_up).collect()
    }

    /// (server name, RSS growth in KiB, fds growth) after the warm-up.
    fn growths(&self) -> Vec<(&'static str, Growth, Growth, Growth)> {
        let after = self.after_warm_up();
        let of = |server: fn(&Sample) -> ServerSample| {
            (
                growth(&after, |s| server(s).rss_kib as f64),
                growth(&after, |s| server(s).fds as f64),
                growth(&after, |s| server(s).threads as f64),
            )
        };
        let (c, s) = (of(|s| s.concierge), of(|s| s.supervisor));
        vec![("Concierge", c.0, c.1, c.2), ("Supervisor", s.0, s.1, s.2)]
    }

    fn missed(&self) -> Vec<usize> {
        self.watches
            .iter()
            .map(|w| self.writes.difference(&w.seen).count())
            .collect()
    }

    /// Every reason the soak failed (empty: it passed).
    fn verdict(&self, args: &Args) -> Vec<String> {
        let mut failures = Vec::new();
        for (name, stream) in &self.streams {
            if stream.failed > 0 {
                failures.push(format!("{name}: {} failed: {:?}", stream.failed, stream.errors));
            }
            if stream.ok == 0 {
                failures.push(format!("{name}: nothing succeeded"));
            }
        }
        let missed: usize = self.missed().iter().sum();
        if missed > 0 {
            failures.push(format!("the watches missed {missed} events in all"));
        }
        let watch_errors: u64 = self.watches.iter().map(|w| w.errors).sum();
        if watch_errors > 0 {
            failures.push(format!(
                "{watch_errors} watch errors, the first: {:?}",
                self.watches
                    .iter()
                    .flat_map(|w| &w.first_errors)
                    .take(3)
                    .collect::<Vec<_>>()
            ));
        }
        if self.after_warm_up().len() < 2 {
            failures.push("fewer than two samples after the warm-up".into());
        }
        for (server, rss, fds, _) in self.growths() {
            let bound = (RSS_GROWTH_KIB as f64).max(rss.first * RSS_GROWTH_SHARE);
            if rss.last - rss.first > bound {
                failures.push(format!(
                    "{server}: RSS grew from {:.1} to {:.1} MiB after the warm-up (bound {:.1} MiB)",
                    rss.first / 1024.0,
                    rss.last / 1024.0,
                    bound / 1024.0
                ));
            }
            if fds.last - fds.first > args.fd_growth as f64 {
                failures.push(format!(
                    "{server}: open fds grew from {} to {} after the warm-up (bound {})",
                    fds.first, fds.last, args.fd_growth
                ));
            }
        }
        failures
    }

    fn json(
        &self,
        args: &Args,
        world: &World,
        load_at_start: [f64; 3],
        setup_seconds: f64,
        verdict: &[String],
    ) -> Value {
        let machine = selkie_perf::process::Machine::describe();
        let missed = self.missed();
        json!({
            "machine": {
                "cpu_model": machine.cpu_model, "cores": machine.cores, "kernel": machine.kernel,
                "memory": machine.memory, "rustc": machine.rustc, "load_at_start": load_at_start,
            },
            "release_build": std::env::var("SELKIE_E2E_RELEASE").is_ok_and(|v| v == "1"),
            "kubernetes_version": world.cluster.kubernetes_version(),
            "dex_build": selkie_e2e::bench::dex_build().unwrap_or_default(),
            "dex_pid": world.dex.pid(),
            "setup_seconds": setup_seconds,
            "minutes": args.minutes,
            "smoke": args.smoke,
            "warm_up_share": WARM_UP_SHARE,
            "rates_per_second": {
                "reads_per_user": args.reads_per_second, "writes_per_user": args.writes_per_second,
                "execs": args.execs_per_second, "token_credential_requests": args.tcrs_per_second,
                "logins": args.logins_per_second, "refreshes": args.refreshes_per_second,
                "exchanges": args.exchanges_per_second,
            },
            "bounds": {"rss_kib": RSS_GROWTH_KIB, "rss_share": RSS_GROWTH_SHARE, "fds": args.fd_growth},
            "streams": self.streams.iter().map(|(name, s)| json!({
                "name": name, "ok": s.ok, "failed": s.failed, "errors": s.errors,
                "slowest_ms": s.slowest.as_secs_f64() * 1000.0,
            })).collect::<Vec<_>>(),
            "watches": {
                "held": self.watches.len(),
                "writes": self.writes.len(),
                "events_seen": self.watches.iter().map(|w| w.seen.len()).sum::<usize>(),
                "missed": missed.iter().sum::<usize>(),
                "missed_per_watch_max": missed.iter().max().copied().unwrap_or(0),
                "restarts": self.watches.iter().map(|w| w.restarts).sum::<u64>(),
                "broken": self.watches.iter().map(|w| w.broken).sum::<u64>(),
                "errors": self.watches.iter().map(|w| w.errors).sum::<u64>(),
                "first_errors": self.watches.iter().flat_map(|w| &w.first_errors).take(10).collect::<Vec<_>>(),
            },
            "growth_after_warm_up": self.growths().iter().map(|(server, rss, fds, threads)| json!({
                "server": server, "rss_kib": rss, "fds": fds, "threads": threads,
            })).collect::<Vec<_>>(),
            "samples": self.samples,
            "passed": verdict.is_empty(),
            "failures": verdict,
        })
    }
}

/// The report, from the JSON (so both say the same).
fn markdown(json: &Value, json_path: &Path) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let m = &json["machine"];
    let _ = writeln!(
        md,
        "# Soak: mixed traffic at the Concierge and the Supervisor\n\n\
         Written by `perf/soak` (`e2e/src/bin/selkie-soak.rs`; perf/README.md, \"Soak\"). Raw numbers: `{}`.\n\n\
         **{}**: {} minutes{}, after {:.0} s of setup; servers built in release mode: {}. Machine: {} ({}, {} memory), kernel {}, \
         load at start {}; Kubernetes {}, Dex {}.\n",
        json_path.display(),
        if json["passed"] == true { "Passed" } else { "FAILED" },
        json["minutes"],
        if json["smoke"] == true { " (smoke)" } else { "" },
        json["setup_seconds"].as_f64().unwrap_or(0.0),
        json["release_build"],
        m["cpu_model"].as_str().unwrap_or("?"),
        m["cores"].as_str().unwrap_or("?"),
        m["memory"].as_str().unwrap_or("?"),
        m["kernel"].as_str().unwrap_or("?"),
        m["load_at_start"]
            .as_array()
            .map(|load| load.iter().map(|l| format!("{:.2}", l.as_f64().unwrap_or(0.0))).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        json["kubernetes_version"].as_str().unwrap_or("?"),
        json["dex_build"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        md,
        "| stream | rate /s | ok | failed | slowest ms |\n|---|---:|---:|---:|---:|"
    );
    let r = &json["rates_per_second"];
    for s in json["streams"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or("?");
        let rate = match name {
            n if n.contains("reads") => &r["reads_per_user"],
            n if n.contains("writes") => &r["writes_per_user"],
            n if n.contains("exec") => &r["execs"],
            n if n.contains("TokenCredentialRequest") => &r["token_credential_requests"],
            n if n.contains("logins") => &r["logins"],
            n if n.contains("refreshes") => &r["refreshes"],
            _ => &r["exchanges"],
        };
        let _ = writeln!(
            md,
            "| {name} | {rate} | {} | {} | {:.0} |",
            s["ok"],
            s["failed"],
            s["slowest_ms"].as_f64().unwrap_or(0.0)
        );
    }
    let w = &json["watches"];
    let _ = writeln!(
        md,
        "\n**Watches**: {} held through the proxy (half per user), {} writes acknowledged, {} events seen in all, \
         **{} missed** (most by one watch: {}); {} restarts from the last resourceVersion, {} of them after a read \
         error (kube-apiserver ends a watch after its `timeoutSeconds`, 290 s; a read idle for 30 s or a broken \
         connection ends it too); **{} watch errors** (refused watch requests, ERROR events) {}.\n",
        w["held"], w["writes"], w["events_seen"], w["missed"], w["missed_per_watch_max"], w["restarts"], w["broken"],
        w["errors"], w["first_errors"]
    );
    let _ = writeln!(
        md,
        "After the warm-up (the first {:.0} % of the run): first sample → last, and the least-squares slope per \
         10 minutes. Bounds: RSS max({} MiB, {:.0} %), fds +{}.\n\n\
         | server | RSS MiB first → last | RSS slope MiB/10 min | fds first → last | fds slope /10 min | threads first → last | mean CPU cores |\n\
         |---|---|---:|---|---:|---|---:|",
        json["warm_up_share"].as_f64().unwrap_or(0.0) * 100.0,
        RSS_GROWTH_KIB / 1024,
        RSS_GROWTH_SHARE * 100.0,
        json["bounds"]["fds"],
    );
    let samples = json["samples"].as_array().cloned().unwrap_or_default();
    for g in json["growth_after_warm_up"].as_array().into_iter().flatten() {
        let server = g["server"].as_str().unwrap_or("?");
        let key = server.to_lowercase();
        let cpu: f64 = samples
            .iter()
            .map(|s| s[&key]["cpu_cores"].as_f64().unwrap_or(0.0))
            .sum::<f64>()
            / samples.len().max(1) as f64;
        let f = |v: &Value| v.as_f64().unwrap_or(0.0);
        let _ = writeln!(
            md,
            "| {server} | {:.1} → {:.1} | {:+.2} | {:.0} → {:.0} | {:+.1} | {:.0} → {:.0} | {cpu:.3} |",
            f(&g["rss_kib"]["first"]) / 1024.0,
            f(&g["rss_kib"]["last"]) / 1024.0,
            f(&g["rss_kib"]["slope_per_10_min"]) / 1024.0,
            f(&g["fds"]["first"]),
            f(&g["fds"]["last"]),
            f(&g["fds"]["slope_per_10_min"]),
            f(&g["threads"]["first"]),
            f(&g["threads"]["last"]),
        );
    }
    let _ = writeln!(
        md,
        "\nEvery sample (CPU in cores busy since the previous sample; \"harness\": kube-apiserver, etcd, Dex and the \
         soak's own clients; \"machine\": all processes, as a share of both cores).\n\n\
         | t (s) | Concierge RSS MiB | fds | threads | CPU | Supervisor RSS MiB | fds | threads | CPU | harness CPU | machine busy |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for s in &samples {
        let (c, v) = (&s["concierge"], &s["supervisor"]);
        let f = |v: &Value| v.as_f64().unwrap_or(0.0);
        let _ = writeln!(
            md,
            "| {:.0} | {:.1} | {} | {} | {:.3} | {:.1} | {} | {} | {:.3} | {:.3} | {:.0} % |",
            f(&s["at"]),
            f(&c["rss_kib"]) / 1024.0,
            c["fds"],
            c["threads"],
            f(&c["cpu_cores"]),
            f(&v["rss_kib"]) / 1024.0,
            v["fds"],
            v["threads"],
            f(&v["cpu_cores"]),
            f(&s["harness_cores"]),
            f(&s["machine_busy"]) * 100.0,
        );
    }
    let failures: Vec<&str> = json["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(md, "\n## Failures\n");
        for failure in failures {
            let _ = writeln!(md, "* {failure}");
        }
    }
    md
}
