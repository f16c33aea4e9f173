//! Reliability rows of the control plane (`perf/results/reliability.md`): kube-apiserver
//! restarted, kube-apiserver black-holed (frozen: connections accepted, nothing answered),
//! kube-apiserver slow (stopped 0.7 s of every second for 40 s: answering, late), and etcd
//! restarted under kube-apiserver, under load through the Concierge (installed from
//! `conf/`, its control plane included), each on a private cluster.
//!
//! The load: one client reading ConfigMaps through the impersonation proxy one request after
//! another (kube-rs, a client certificate of the cluster's client CA, which the Concierge
//! trusts), each with a 10 s deadline; a watch through the proxy (kube-rs' watcher, which
//! re-lists as informers do); the admin writing a ConfigMap every 300 ms straight to
//! kube-apiserver. The component is stopped (SIGTERM), kept down for 5 s and started again, or
//! kube-apiserver is frozen (SIGSTOP) for 80 s and continued.
//!
//! What must hold: no request through the proxy hangs (each ends, with an answer or an error,
//! well within its deadline: the proxy fails fast while kube-apiserver is away, gives up on a
//! frozen one within its HTTP/2 ping and TLS handshake timeouts, and passes on kube-apiserver's
//! own answer while etcd is away; while kube-apiserver is only slow, nothing fails at all); from
//! 5 s after kube-apiserver is ready again
//! every request succeeds; the watch sees every write the admin's client had acknowledged,
//! before and after the restart; the Concierge's controllers resume by themselves (a
//! JWTAuthenticator applied after the restart gets its status); the Concierge's memory is the
//! same afterwards. The figures are printed for the results page.
//!
//! One more row has no load but an exec stream (WebSocket, through the impersonation proxy and
//! kube-apiserver to the harness's echo API): kube-apiserver is frozen under it, the client pings
//! as kubectl does and gives up when nothing answers, and the proxy must then let go of the tunnel
//! while kube-apiserver is still frozen.

use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::{ensure, Context as _};
use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ObjectMeta, PostParams},
    runtime::{watcher, WatchStreamExt as _},
    Api,
};
use selkie_e2e::{
    concierge::InstalledConcierge,
    echo_api::{websocket_exec, EchoApi},
    eventually,
    proxy::Proxy,
    Cluster,
};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::proxy_upgrades::next;

/// The deadline of one request through the proxy while kube-apiserver is away: the proxy itself
/// must answer, so a request that takes longer hung.
const PROXY_DEADLINE: Duration = Duration::from_secs(10);
/// The deadline of one request while kube-apiserver is frozen: the proxy drops an upstream
/// connection whose HTTP/2 ping goes unanswered (pings every 30 s, 5 s for the pong) and gives a
/// new connection's TLS handshake 10 s after its TCP connect (5 s), so a request that takes
/// longer hung in the proxy.
const FROZEN_DEADLINE: Duration = Duration::from_secs(40);
/// How long kube-apiserver stays frozen: long enough that a request waiting on the frozen
/// connection or handshake with no bound of its own would outlast [`FROZEN_DEADLINE`] (the ping
/// may take 35 s to drop the connection, and a handshake begun then would wait for the rest).
const FROZEN: Duration = Duration::from_secs(80);
/// The deadline of one request while etcd is away: kube-apiserver holds a request until its own
/// `--request-timeout` (60 s) and the proxy passes its answer on, so a request that takes longer
/// hung in the proxy.
const APISERVER_DEADLINE: Duration = Duration::from_secs(65);
/// The deadline of one request while kube-apiserver is slow: it runs 0.3 s of every second, so
/// a list takes a few of its pauses at most; nothing may fail, and a request that takes longer
/// hung.
const SLOW_DEADLINE: Duration = Duration::from_secs(20);
/// How long kube-apiserver is slow, and its rhythm: stopped [`SLOW_PAUSE`] of every
/// [`SLOW_PERIOD`].
const SLOW: Duration = Duration::from_secs(40);
const SLOW_PERIOD: Duration = Duration::from_secs(1);
const SLOW_PAUSE: Duration = Duration::from_millis(700);
/// How long kube-apiserver stays down.
const DOWN: Duration = Duration::from_secs(5);
/// After kube-apiserver is ready again, how long the proxy may take to serve again.
const RECOVERY_GRACE: Duration = Duration::from_secs(5);

/// One request through the proxy: when it started, how long it took, and its error if any.
struct Sample {
    at: Instant,
    took: Duration,
    error: Option<String>,
}

fn rss_kib(pid: u32) -> u64 {
    selkie_perf::procstat::rss_kib(pid).unwrap_or(0)
}

/// What is restarted.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// kube-apiserver: the proxy's upstream is gone.
    Apiserver,
    /// kube-apiserver frozen: connections are accepted and nothing is answered.
    ApiserverFrozen,
    /// kube-apiserver slow: it answers, late.
    ApiserverSlow,
    /// etcd: kube-apiserver stays up without its storage.
    Etcd,
}

impl Fault {
    /// The deadline of one request through the proxy during this fault.
    fn deadline(self) -> Duration {
        match self {
            Fault::Apiserver => PROXY_DEADLINE,
            Fault::ApiserverFrozen => FROZEN_DEADLINE,
            Fault::ApiserverSlow => SLOW_DEADLINE,
            Fault::Etcd => APISERVER_DEADLINE,
        }
    }

    /// Whether every request must succeed during the fault too (kube-apiserver still answers).
    fn nothing_may_fail(self) -> bool {
        matches!(self, Fault::ApiserverSlow)
    }

    /// Restarts the component, down for [`DOWN`] (or freezes kube-apiserver for [`FROZEN`]); how
    /// long until kube-apiserver was ready again.
    async fn inject(self, cluster: &mut Cluster) -> anyhow::Result<Duration> {
        Ok(match self {
            Fault::Apiserver => cluster.restart_apiserver(DOWN).await?,
            Fault::ApiserverFrozen => cluster.freeze_apiserver(FROZEN).await?,
            Fault::ApiserverSlow => cluster.slow_apiserver(SLOW_PERIOD, SLOW_PAUSE, SLOW).await?,
            Fault::Etcd => cluster.restart_etcd(DOWN).await?,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_kube_apiserver_restarted_under_load_requests_fail_fast_and_everything_recovers(
) -> anyhow::Result<()> {
    restarted_under_load(Fault::Apiserver).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_kube_apiserver_black_holed_under_load_no_request_hangs_and_everything_recovers(
) -> anyhow::Result<()> {
    restarted_under_load(Fault::ApiserverFrozen).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_kube_apiserver_slow_under_load_every_request_succeeds_late() -> anyhow::Result<()> {
    restarted_under_load(Fault::ApiserverSlow).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_etcd_restarted_under_load_requests_end_and_everything_recovers() -> anyhow::Result<()> {
    restarted_under_load(Fault::Etcd).await
}

async fn restarted_under_load(fault: Fault) -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    let concierge = InstalledConcierge::install(&cluster).await?;
    let (endpoint, proxy_ca) = concierge.expose_proxy(&cluster).await?;
    let kubectl = cluster.kubectl();
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "faults-apiserver").await?;
    kubectl
        .create_role_and_binding(
            &namespace,
            "faults-read",
            "get,list,watch",
            "configmaps",
            &["--user=faults-user"],
        )
        .await?;
    let user = cluster.pki().client_ca.issue_client("faults-user", &[])?;
    let kubeconfig = concierge.dir().join("faults-user.kubeconfig");
    selkie_e2e::cluster::write_kubeconfig(&kubeconfig, &endpoint, &proxy_ca, "faults-user", &user)?;
    let through_proxy = selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await?;
    let pid = concierge.process().pid();

    // The watch through the proxy.
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let watch = {
        let seen = seen.clone();
        let configmaps: Api<ConfigMap> = Api::namespaced(through_proxy.clone(), &namespace);
        tokio::spawn(async move {
            let mut events = watcher(configmaps, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                if let Ok(name) = event.map(|object| object.metadata.name.unwrap_or_default()) {
                    seen.lock().unwrap_or_else(|e| e.into_inner()).insert(name);
                }
            }
        })
    };
    // The reads through the proxy.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = {
        let deadline = fault.deadline();
        let (stop, configmaps) = (
            stop.clone(),
            Api::<ConfigMap>::namespaced(through_proxy.clone(), &namespace),
        );
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                let error = match tokio::time::timeout(deadline, configmaps.list(&Default::default())).await {
                    Ok(Ok(_)) => None,
                    Ok(Err(error)) => Some(format!("{:#}", anyhow::Error::from(error))),
                    Err(_) => Some(format!("no answer within {deadline:?}: hung")),
                };
                let failed = error.is_some();
                samples.push(Sample {
                    at,
                    took: at.elapsed(),
                    error,
                });
                if failed {
                    // A failing client retries, as kubectl's users and informers do, not in a
                    // tight loop.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            samples
        })
    };
    // The admin's writes, straight to kube-apiserver; only acknowledged ones count.
    let writes = {
        let (stop, configmaps) = (
            stop.clone(),
            Api::<ConfigMap>::namespaced(admin.clone(), &namespace),
        );
        tokio::spawn(async move {
            let (mut written, mut n) = (Vec::new(), 0);
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let object = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("write-{n}")),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                let created = tokio::time::timeout(
                    Duration::from_secs(5),
                    configmaps.create(&PostParams::default(), &object),
                )
                .await;
                if let Ok(Ok(object)) = created {
                    written.push(object.metadata.name.unwrap_or_default());
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            written
        })
    };

    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_before = rss_kib(pid);
    let stopped_at = Instant::now();
    let restart_took = fault.inject(&mut cluster).await?;
    let ready_at = Instant::now();
    let rss_during = rss_kib(pid);
    tokio::time::sleep(RECOVERY_GRACE + Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    let samples = reads.await?;
    let written = writes.await?;

    // Every acknowledged write is seen through the proxy's watch (it resumes by itself).
    let missing = eventually(Duration::from_secs(60), || async {
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let missing: Vec<&String> = written.iter().filter(|name| !seen.contains(*name)).collect();
        ensure!(
            missing.is_empty(),
            "the watch through the proxy never saw {missing:?}"
        );
        Ok(())
    })
    .await;
    watch.abort();

    // The controllers resume without a restart of their own: an authenticator applied now gets
    // its status (an issuer that cannot be reached: an error phase, written by the controller).
    let authenticator = serde_json::json!({
        "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
        "kind": "JWTAuthenticator",
        "metadata": {"name": "after-restart"},
        "spec": {"issuer": "https://127.0.0.1:1/unreachable", "audience": "faults"},
    });
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&authenticator.to_string()))
        .await?;
    let phase = eventually(Duration::from_secs(60), || async {
        let phase = kubectl
            .run(&[
                "get",
                "jwtauthenticator",
                "after-restart",
                "-o",
                "jsonpath={.status.phase}",
            ])
            .await?;
        ensure!(!phase.is_empty(), "no status yet");
        Ok(phase)
    })
    .await?;
    let rss_after = rss_kib(pid);

    let failed: Vec<&Sample> = samples.iter().filter(|s| s.error.is_some()).collect();
    let slowest = samples.iter().map(|s| s.took).max().unwrap_or_default();
    let late: Vec<&str> = failed
        .iter()
        .filter(|s| s.at > ready_at + RECOVERY_GRACE)
        .filter_map(|s| s.error.as_deref())
        .collect();
    let first_success_after_ready = samples
        .iter()
        .filter(|s| s.error.is_none() && s.at + s.took >= ready_at)
        .map(|s| (s.at + s.took).saturating_duration_since(ready_at))
        .min();
    let early: Vec<&str> = failed
        .iter()
        .filter(|s| s.at + s.took < stopped_at)
        .filter_map(|s| s.error.as_deref())
        .collect();
    let kinds: BTreeSet<String> = failed
        .iter()
        .filter_map(|s| s.error.as_deref())
        .map(|e| e.chars().take(160).collect())
        .collect();
    println!("what the clients got during the {fault:?} restart: {kinds:#?}");
    println!(
        "{fault:?} restart (down {DOWN:?}, back and ready after {restart_took:?}): {} requests through \
         the proxy, {} failed while it was away (slowest answer {slowest:?}), {} failed before or >{RECOVERY_GRACE:?} \
         after it was ready; first success {first_success_after_ready:?} after ready; {} writes, all seen by the \
         watch: {}; controller wrote phase {phase:?} after the restart; Concierge RSS {rss_before} / {rss_during} / \
         {rss_after} KiB (before / right after / end)",
        samples.len(),
        failed.len(),
        early.len() + late.len(),
        written.len(),
        missing.is_ok(),
    );
    ensure!(
        slowest < fault.deadline(),
        "a request through the proxy hung during the {fault:?} restart"
    );
    ensure!(
        early.is_empty() && late.is_empty(),
        "requests that should have succeeded failed: before the stop {early:?}, after recovery {late:?}"
    );
    ensure!(
        !fault.nothing_may_fail() || failed.is_empty(),
        "requests failed while kube-apiserver was only slow: {kinds:#?}"
    );
    ensure!(
        first_success_after_ready.is_some_and(|t| t <= RECOVERY_GRACE),
        "no success within {RECOVERY_GRACE:?} of kube-apiserver being ready: {first_success_after_ready:?}"
    );
    missing?;
    ensure!(written.len() > 20 && samples.len() > 20, "too little load ran");
    ensure!(
        rss_after < rss_before * 2,
        "the Concierge's memory grew from {rss_before} to {rss_after} KiB"
    );
    Ok(())
}

/// How long kube-apiserver stays frozen under an exec stream: long enough that the stream's
/// client gives up and the proxy lets go while it is still frozen.
const EXEC_FROZEN: Duration = Duration::from_secs(30);
/// The exec client's ping period and how long it waits for an answer before it gives up:
/// kubectl (client-go ≥ 1.30) pings its WebSocket exec streams every 5 s and gives up after 60 s
/// without a read; scaled down here, as the proxy's part does not depend on them.
const EXEC_PING_EVERY: Duration = Duration::from_secs(1);
const EXEC_READ_DEADLINE: Duration = Duration::from_secs(8);
/// How long the proxy may take to let go of a tunnel whose client went away.
const TUNNEL_RELEASE: Duration = Duration::from_secs(10);
/// How long kube-apiserver, once ready again after the freeze, may take to end the frozen stream
/// at the far end and to serve a new exec through its aggregation layer (its APIService
/// availability checks run again first). Recovery only: what the test holds the proxy to is
/// bounded by `TUNNEL_RELEASE` and `EXEC_FROZEN`.
const EXEC_RECOVERY: Duration = Duration::from_secs(60);

/// The tunnels and upgrades the proxy counts as open (`active_tunnels`, upgrades in flight).
async fn open_tunnels(proxy: &Proxy) -> anyhow::Result<(f64, f64)> {
    let text = crate::proxy_operations::metrics(proxy).await?;
    let value = crate::proxy_operations::value;
    Ok((
        value(&text, "selkie_proxy_active_tunnels", &[])?,
        value(
            &text,
            "selkie_proxy_in_flight_requests",
            &[("verb_class", "upgrade")],
        )?,
    ))
}

/// An exec stream (WebSocket, through the proxy and kube-apiserver to the echo API) whose
/// kube-apiserver freezes: the client's pings go unanswered — the proxy passes them through and
/// fakes no liveness — so the client gives up as kubectl does, and the proxy then lets go of the
/// tunnel and its upstream connection while kube-apiserver is still frozen; afterwards the far end
/// has seen the stream end and a new exec works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_kube_apiserver_black_holed_under_an_exec_stream_the_client_gives_up_and_the_proxy_lets_go(
) -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "faults-exec").await?;
    let user = format!("exec-user-{namespace}");
    // Declared before the proxy, so dropped after it.
    let echo = EchoApi::start(&cluster, &namespace).await?;
    echo.grant_exec(&cluster, &namespace, &user, &["get"]).await?;
    let proxy = Proxy::start(&cluster, &[]).await?;
    let credential = proxy.signer().issue_client(&user, &[])?;
    let ca_pem = proxy.serving_ca().cert_pem();
    let path = echo.exec_path(&namespace, "frozen-exec");
    // Until the Role reaches the authorizer the upgrade may be refused.
    let mut socket = eventually(Duration::from_secs(30), || {
        websocket_exec(proxy.url(), &ca_pem, &credential, &path)
    })
    .await
    .context("the exec before the freeze")?;
    let message = Message::binary(b"\x00before the freeze".to_vec());
    socket.send(message.clone()).await?;
    let echoed = next(&mut socket).await.context("the echo before the freeze")?;
    ensure!(echoed == message, "echoed {echoed:?}");
    // The client's pings are answered while kube-apiserver runs.
    socket.send(Message::Ping(b"alive".to_vec().into())).await?;
    let pong = next(&mut socket).await?;
    ensure!(
        matches!(&pong, Message::Pong(payload) if payload.as_ref() == b"alive"),
        "the ping before the freeze got {pong:?}"
    );
    ensure!(
        open_tunnels(&proxy).await? == (1.0, 1.0),
        "the tunnel is not counted"
    );
    let rss_before = rss_kib(proxy.pid());

    let frozen_at = Instant::now();
    let client = async {
        // The client: a ping every period; nothing read within the deadline, it gives up and
        // drops its connection (no close handshake with a peer that does not answer).
        let mut last_read = Instant::now();
        let mut answered_while_frozen = Vec::new();
        let mut ping = tokio::time::interval(EXEC_PING_EVERY);
        while last_read.elapsed() < EXEC_READ_DEADLINE {
            tokio::select! {
                _ = ping.tick() => socket.send(Message::Ping(b"still there?".to_vec().into())).await?,
                read = socket.next() => match read {
                    Some(Ok(message)) => {
                        last_read = Instant::now();
                        answered_while_frozen.push(message);
                    }
                    other => anyhow::bail!("the stream ended while frozen: {other:?}"),
                },
            }
        }
        let gave_up = frozen_at.elapsed();
        drop(socket);
        // The proxy lets go of the tunnel while kube-apiserver is still frozen.
        eventually(TUNNEL_RELEASE, || async {
            let open = open_tunnels(&proxy).await?;
            ensure!(
                open == (0.0, 0.0),
                "still open (tunnels, upgrades in flight): {open:?}"
            );
            Ok(())
        })
        .await?;
        anyhow::Ok((gave_up, frozen_at.elapsed(), answered_while_frozen))
    };
    let (thawed, client) = tokio::join!(cluster.freeze_apiserver(EXEC_FROZEN), client);
    let ready_after = thawed.context("kube-apiserver after the freeze")?;
    let (gave_up, released, answered_while_frozen) = client.context("the exec client during the freeze")?;
    let rss_during = rss_kib(proxy.pid());
    ensure!(
        answered_while_frozen.is_empty(),
        "pings were answered while kube-apiserver was frozen: {answered_while_frozen:?}"
    );
    ensure!(
        released < EXEC_FROZEN,
        "the proxy let go of the tunnel {released:?} after the freeze began, not while it lasted \
         ({EXEC_FROZEN:?})"
    );

    // The far end saw the stream end once kube-apiserver ran again.
    let ended = eventually(EXEC_RECOVERY, || async {
        echo.tunnels()
            .into_iter()
            .find(|tunnel| tunnel.name == "frozen-exec")
            .context("the echo API has not seen the frozen stream end")
    })
    .await?;
    // A new exec works.
    let new_path = echo.exec_path(&namespace, "after-the-freeze");
    let mut again = eventually(EXEC_RECOVERY, || {
        websocket_exec(proxy.url(), &ca_pem, &credential, &new_path)
    })
    .await
    .context("a new exec after the freeze")?;
    let message = Message::binary(b"\x00after the freeze".to_vec());
    again.send(message.clone()).await?;
    let echoed = next(&mut again)
        .await
        .context("the echo of the new exec after the freeze")?;
    ensure!(echoed == message, "echoed {echoed:?} after the freeze");
    drop(again);
    let rss_after = rss_kib(proxy.pid());
    println!(
        "exec stream under a frozen kube-apiserver (frozen {EXEC_FROZEN:?}, ready again after \
         {ready_after:?}): the client gave up {gave_up:?} in, the proxy had let go of the tunnel \
         {released:?} in; the echo API saw the stream end as {:?}; proxy RSS {rss_before} / \
         {rss_during} / {rss_after} KiB (before / after the thaw / end)",
        ended.end
    );
    drop(proxy);
    drop(echo);
    Ok(())
}
