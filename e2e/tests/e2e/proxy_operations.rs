//! The proxy's operations port against the real kube-apiserver: health and readiness probes,
//! Prometheus metrics that count what kubectl did through the proxy (with bounded labels and no
//! user names), and a SIGTERM that turns readiness off, lets a watch in flight finish, and exits 0.

use std::{
    collections::BTreeMap,
    net::TcpStream,
    path::Path,
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use futures::{SinkExt as _, StreamExt as _};
use selkie_e2e::{
    echo_api::{websocket_exec, EchoApi},
    pki::CertificateAuthority,
    proxy::{JwtSpec, Proxy},
    Cluster,
};
use tokio_tungstenite::tungstenite::Message;

use crate::eventually;

/// One sample of an exposition: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// The samples of the series `name` in an OpenMetrics text exposition.
fn samples(exposition: &str, name: &str) -> anyhow::Result<Vec<Sample>> {
    let mut found = Vec::new();
    for line in exposition.lines().filter(|line| !line.starts_with('#')) {
        let (series, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("no value in {line:?}"))?;
        let (series_name, labels) = match series.split_once('{') {
            Some((series_name, labels)) => (
                series_name,
                labels
                    .strip_suffix('}')
                    .with_context(|| format!("unterminated labels in {line:?}"))?,
            ),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let mut parsed = BTreeMap::new();
        // Label values here are plain words: no commas, quotes or escapes to handle.
        for pair in labels.split(',').filter(|pair| !pair.is_empty()) {
            let (key, quoted) = pair
                .split_once('=')
                .with_context(|| format!("bad label {pair:?} in {line:?}"))?;
            let value = quoted
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .with_context(|| format!("unquoted label {pair:?} in {line:?}"))?;
            parsed.insert(key.to_string(), value.to_string());
        }
        found.push((parsed, value.parse::<f64>()?));
    }
    Ok(found)
}

/// The sum of the samples of `name` whose labels include all of `labels` (0 if none).
pub(crate) fn value(exposition: &str, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
    Ok(samples(exposition, name)?
        .iter()
        .filter(|(have, _)| {
            labels
                .iter()
                .all(|(key, value)| have.get(*key).map(String::as_str) == Some(*value))
        })
        .map(|(_, value)| value)
        .sum())
}

pub(crate) async fn metrics(proxy: &Proxy) -> anyhow::Result<String> {
    let (status, body) = proxy.operations_get("/metrics").await?;
    ensure!(status == 200, "/metrics answered {status}: {body}");
    Ok(body)
}

/// Waits until the watch gauge reads `expected`.
async fn watches_in_flight(proxy: &Proxy, expected: f64) -> anyhow::Result<()> {
    eventually(Duration::from_secs(20), || async {
        let text = metrics(proxy).await?;
        let open = value(
            &text,
            "selkie_proxy_in_flight_requests",
            &[("verb_class", "watch")],
        )?;
        ensure!(open == expected, "{open} watches in flight, expected {expected}");
        Ok(())
    })
    .await
}

/// Lets `user` get, list, watch and create ConfigMaps in `namespace`.
async fn grant_configmaps(cluster: &Cluster, namespace: &str, user: &str) -> anyhow::Result<()> {
    let kubectl = cluster.kubectl();
    kubectl
        .run(&[
            "create",
            "role",
            "configmaps",
            "--verb=get,list,watch,create",
            "--resource=configmaps",
            "-n",
            namespace,
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "rolebinding",
            "configmaps",
            "--role=configmaps",
            &format!("--user={user}"),
            "-n",
            namespace,
        ])
        .await?;
    Ok(())
}

/// `kubectl get --raw` of a ConfigMap watch in `namespace` that kube-apiserver ends after
/// `seconds`, running in the background.
fn start_watch(
    cluster: &Cluster,
    kubeconfig: &Path,
    namespace: &str,
    seconds: u32,
) -> anyhow::Result<tokio::process::Child> {
    Ok(tokio::process::Command::new(cluster.kubectl().binary())
        .args([
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{namespace}/configmaps?watch=1&timeoutSeconds={seconds}"),
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?)
}

async fn finished(watch: tokio::process::Child) -> anyhow::Result<Output> {
    let output = tokio::time::timeout(Duration::from_secs(60), watch.wait_with_output())
        .await
        .context("the watch did not end within 60s")??;
    ensure!(
        output.status.success(),
        "the watch failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

/// A JWT for `issuer` signed with algorithm `none`: the JWT authenticator must refuse it without
/// fetching any key.
fn unsigned_jwt(issuer: &str) -> String {
    let part = |json: serde_json::Value| URL_SAFE_NO_PAD.encode(json.to_string());
    format!(
        "{}.{}.{}",
        part(serde_json::json!({"alg": "none", "typ": "JWT"})),
        part(serde_json::json!({"iss": issuer, "aud": "selkie", "email": "mallory@example.com"})),
        URL_SAFE_NO_PAD.encode("not-a-signature")
    )
}

#[tokio::test]
async fn the_operations_port_counts_requests_by_class_code_and_authenticator() -> anyhow::Result<()> {
    const ISSUER: &str = "https://issuer.invalid";
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-ops").await?;
    let user = format!("ops-user-{namespace}");
    grant_configmaps(cluster, &namespace, &user).await?;
    let unused_ca = CertificateAuthority::new("selkie-test-unused-issuer-ca")?;
    let proxy = Proxy::start(
        cluster,
        &[JwtSpec {
            name: "corp-jwt".into(),
            issuer: ISSUER.into(),
            audience: "selkie".into(),
            username_claim: "email".into(),
            groups_claim: "groups".into(),
            ca_pem: unused_ca.cert_pem(),
        }],
    )
    .await?;

    assert_eq!(proxy.operations_get("/healthz").await?, (200, "ok\n".into()));
    assert_eq!(proxy.operations_get("/readyz").await?, (200, "ok\n".into()));
    assert_eq!(proxy.operations_get("/debug/pprof").await?.0, 404);

    // A success, a write, an RBAC refusal, and two refused tokens, all with kubectl.
    let credential = proxy.signer().issue_client(&user, &["ops-team"])?;
    let kubeconfig = proxy.kubeconfig_with_cert("ops-user", &credential)?;
    let kubectl = proxy.kubectl(&kubeconfig);
    let ns = ["-n", namespace.as_str()];
    kubectl
        .run(&[&["create", "configmap", "ops-settings"][..], &ns].concat())
        .await?;
    let listed = kubectl
        .run(&[&["get", "configmaps", "-o", "name"][..], &ns].concat())
        .await?;
    assert!(listed.contains("configmap/ops-settings"), "{listed}");
    let forbidden = kubectl
        .output(&["get", "secrets", "-n", "kube-system"], None)
        .await?;
    assert!(
        !forbidden.success && forbidden.stderr.contains("Forbidden"),
        "{forbidden:?}"
    );
    let opaque_token = "opaque-token-nobody-recognises";
    let unsigned_token = unsigned_jwt(ISSUER);
    for (name, token) in [("opaque", opaque_token), ("unsigned", unsigned_token.as_str())] {
        let refused = proxy
            .kubectl(&proxy.kubeconfig_with_token(name, token)?)
            .output(&[&["get", "configmaps"][..], &ns].concat(), None)
            .await?;
        assert!(
            !refused.success && refused.stderr.contains("You must be logged in"),
            "{name}: {refused:?}"
        );
    }

    // A watch is in flight while it is open, and counted as a watch once it ends.
    let watch = start_watch(cluster, &kubeconfig, &namespace, 3)?;
    watches_in_flight(&proxy, 1.0).await?;
    let output = finished(watch).await?;
    let events = String::from_utf8_lossy(&output.stdout);
    assert!(events.contains("ops-settings"), "{events}");
    watches_in_flight(&proxy, 0.0).await?;

    let text = metrics(&proxy).await?;
    let requests = |code: &'static str, verb_class: &'static str| {
        value(
            &text,
            "selkie_proxy_requests_total",
            &[("code", code), ("verb_class", verb_class)],
        )
    };
    assert!(requests("201", "write")? >= 1.0, "{text}");
    assert!(requests("200", "read")? >= 1.0, "{text}");
    assert!(requests("403", "read")? >= 1.0, "{text}");
    assert!(requests("401", "read")? >= 2.0, "{text}");
    assert_eq!(requests("200", "watch")?, 1.0, "{text}");
    assert_eq!(
        value(
            &text,
            "selkie_proxy_request_duration_seconds_count",
            &[("verb_class", "watch")]
        )?,
        1.0,
        "{text}"
    );
    // The three-second watch lands above the 2.5 s bucket.
    assert_eq!(
        value(
            &text,
            "selkie_proxy_request_duration_seconds_bucket",
            &[("verb_class", "watch"), ("le", "2.5")]
        )?,
        0.0,
        "{text}"
    );
    let authentications = |authenticator: &'static str, result: &'static str, reason: &'static str| {
        value(
            &text,
            "selkie_proxy_authentications_total",
            &[
                ("authenticator", authenticator),
                ("result", result),
                ("reason", reason),
            ],
        )
    };
    assert!(
        authentications("client-certificate", "authenticated", "none")? >= 4.0,
        "{text}"
    );
    assert!(
        authentications("corp-jwt", "rejected", "unsupported_algorithm")? >= 1.0,
        "{text}"
    );
    // The opaque token is no JWT: kube-apiserver's own TokenReview, the chain's last
    // authenticator, refuses it.
    assert!(
        authentications("kube-apiserver", "rejected", "not_authenticated")? >= 1.0,
        "{text}"
    );
    assert!(
        value(
            &text,
            "selkie_proxy_upstream_connections_total",
            &[("connection", "new")]
        )? >= 1.0,
        "{text}"
    );
    assert!(
        value(&text, "selkie_proxy_upstream_connections_total", &[])? >= 4.0,
        "every request that reached kube-apiserver went over a new or reused connection: {text}"
    );
    assert_eq!(
        value(&text, "selkie_proxy_in_flight_requests", &[])?,
        0.0,
        "{text}"
    );
    assert_eq!(value(&text, "selkie_proxy_active_tunnels", &[])?, 0.0, "{text}");

    // Labels are bounded: nothing of who called, what they named, or what they presented.
    for private in [
        user.as_str(),
        "ops-team",
        namespace.as_str(),
        "ops-settings",
        "kube-system",
        "mallory",
        opaque_token,
        unsigned_token.as_str(),
    ] {
        assert!(
            !text.contains(private),
            "{private:?} appears in the metrics:\n{text}"
        );
    }
    let log = proxy.log();
    for token in [opaque_token, unsigned_token.as_str()] {
        assert!(!log.contains(token), "a bearer token was logged:\n{log}");
    }
    Ok(())
}

#[tokio::test]
async fn sigterm_turns_unready_lets_a_watch_finish_and_exits_zero() -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(3);
    const DRAIN: Duration = Duration::from_secs(30);
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-drain").await?;
    let user = format!("drain-user-{namespace}");
    grant_configmaps(cluster, &namespace, &user).await?;
    cluster
        .kubectl()
        .run(&["create", "configmap", "before", "-n", &namespace])
        .await?;
    let mut proxy = Proxy::start_configured(cluster, &[], |config| {
        config["shutdown"] = serde_json::json!({
            "gracePeriodSeconds": GRACE.as_secs(),
            "drainTimeoutSeconds": DRAIN.as_secs(),
        });
    })
    .await?;
    let proxy_address = proxy
        .url()
        .strip_prefix("https://")
        .context("the proxy URL is https")?
        .to_string();
    let credential = proxy.signer().issue_client(&user, &[])?;
    let kubeconfig = proxy.kubeconfig_with_cert("drain-user", &credential)?;

    // kube-apiserver ends this watch after 10 s, well after the SIGTERM below.
    let watch = start_watch(cluster, &kubeconfig, &namespace, 10)?;
    watches_in_flight(&proxy, 1.0).await?;

    let signalled = Instant::now();
    proxy.terminate()?;
    // Readiness turns off at once, while the proxy still serves for the grace period.
    eventually(Duration::from_secs(1), || async {
        let (status, body) = proxy.operations_get("/readyz").await?;
        ensure!(status == 503, "/readyz answered {status} {body:?}");
        Ok(())
    })
    .await?;
    assert_eq!(proxy.operations_get("/healthz").await?.0, 200);
    assert!(
        TcpStream::connect(&proxy_address).is_ok(),
        "the listener accepts during the grace period"
    );
    assert!(
        signalled.elapsed() < GRACE,
        "the checks above took longer than the grace period"
    );

    // Then the listeners close ...
    eventually(GRACE + Duration::from_secs(5), || async {
        ensure!(
            TcpStream::connect(&proxy_address).is_err(),
            "the proxy still accepts connections"
        );
        Ok(())
    })
    .await?;
    assert!(
        signalled.elapsed() >= GRACE,
        "the listener closed before the grace period was over"
    );
    ensure!(
        proxy.operations_get("/readyz").await.is_err(),
        "the operations port closes with the proxy's listener"
    );
    // ... while the watch in flight goes on delivering events ...
    cluster
        .kubectl()
        .run(&["create", "configmap", "during-drain", "-n", &namespace])
        .await?;
    // ... and ends normally when kube-apiserver ends it.
    let output = finished(watch).await?;
    let events = String::from_utf8_lossy(&output.stdout);
    for name in ["\"before\"", "\"during-drain\""] {
        assert!(events.contains(name), "no event for {name} in {events}");
    }

    // The process exits 0 as soon as nothing is in flight, long before the drain timeout.
    let status = proxy.wait_for_exit(Duration::from_secs(10)).await?;
    let exited_after = signalled.elapsed();
    if !status.success() {
        bail!("the proxy exited with {status}:\n{}", proxy.log());
    }
    assert!(
        exited_after < GRACE + Duration::from_secs(15),
        "the proxy took {exited_after:?} to exit after SIGTERM (drain timeout {DRAIN:?})"
    );
    let log = proxy.log();
    assert!(
        log.lines().any(|line| line.contains("selkie::audit")
            && line.contains(r#""status":200"#)
            && line.contains(&format!("/api/v1/namespaces/{namespace}/configmaps"))),
        "the watch has its audit line:\n{log}"
    );
    Ok(())
}

#[tokio::test]
async fn the_drain_timeout_cuts_what_still_runs_and_the_exit_is_still_zero() -> anyhow::Result<()> {
    const DRAIN: Duration = Duration::from_secs(2);
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-drain-cut").await?;
    let user = format!("cut-user-{namespace}");
    grant_configmaps(cluster, &namespace, &user).await?;
    let mut proxy = Proxy::start_configured(cluster, &[], |config| {
        config["shutdown"] = serde_json::json!({
            "gracePeriodSeconds": 0,
            "drainTimeoutSeconds": DRAIN.as_secs(),
        });
    })
    .await?;
    let credential = proxy.signer().issue_client(&user, &[])?;
    let kubeconfig = proxy.kubeconfig_with_cert("cut-user", &credential)?;
    let watch = start_watch(cluster, &kubeconfig, &namespace, 300)?;
    watches_in_flight(&proxy, 1.0).await?;

    let signalled = Instant::now();
    proxy.terminate()?;
    let status = proxy.wait_for_exit(DRAIN + Duration::from_secs(10)).await?;
    let exited_after = signalled.elapsed();
    if !status.success() {
        bail!("the proxy exited with {status}:\n{}", proxy.log());
    }
    assert!(
        exited_after >= DRAIN,
        "the proxy exited {exited_after:?} after SIGTERM, before its watch or the drain timeout ended"
    );
    // The five-minute watch was cut, not finished: kubectl sees its connection go away.
    let output = tokio::time::timeout(Duration::from_secs(20), watch.wait_with_output())
        .await
        .context("the cut watch did not end")??;
    assert!(!output.status.success(), "the watch ended normally: {output:?}");
    Ok(())
}

#[tokio::test]
async fn an_upgraded_connection_is_an_active_tunnel_until_it_closes() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-ops-tunnel").await?;
    let user = format!("tunnel-user-{namespace}");
    // Declared before the proxy, so dropped after it.
    let echo = EchoApi::start(cluster, &namespace).await?;
    echo.grant_exec(cluster, &namespace, &user, &["get"]).await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let credential = proxy.signer().issue_client(&user, &[])?;
    let path = echo.exec_path(&namespace, "metrics-tunnel");
    let ca_pem = proxy.serving_ca().cert_pem();

    // Until the new Role reaches the authorizer the upgrade may be refused; then it stays open.
    let mut socket = eventually(Duration::from_secs(30), || {
        websocket_exec(proxy.url(), &ca_pem, &credential, &path)
    })
    .await?;
    let text = metrics(&proxy).await?;
    assert_eq!(value(&text, "selkie_proxy_active_tunnels", &[])?, 1.0, "{text}");
    assert_eq!(
        value(
            &text,
            "selkie_proxy_in_flight_requests",
            &[("verb_class", "upgrade")]
        )?,
        1.0,
        "{text}"
    );
    let message = Message::binary(b"\x00through the tunnel".to_vec());
    socket.send(message.clone()).await?;
    let echoed = tokio::time::timeout(Duration::from_secs(15), socket.next())
        .await
        .context("no echo within 15s")?
        .context("the WebSocket ended")??;
    assert_eq!(echoed, message);

    socket.close(None).await?;
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(15), socket.next())
        .await
        .context("the WebSocket did not end within 15s")?
    {
        frame?;
    }
    eventually(Duration::from_secs(10), || async {
        let text = metrics(&proxy).await?;
        ensure!(
            value(&text, "selkie_proxy_active_tunnels", &[])? == 0.0
                && value(&text, "selkie_proxy_in_flight_requests", &[])? == 0.0,
            "the closed tunnel is still counted:\n{text}"
        );
        ensure!(
            value(
                &text,
                "selkie_proxy_requests_total",
                &[("code", "101"), ("verb_class", "upgrade")]
            )? == 1.0,
            "the tunnel is not counted as one upgrade answered 101:\n{text}"
        );
        Ok(())
    })
    .await?;
    drop(proxy);
    drop(echo);
    Ok(())
}

/// An established TCP connection on loopback, from `/proc/net/tcp`.
#[derive(Debug)]
struct TcpConnection {
    local_port: u16,
    remote_port: u16,
    /// Which timer is pending: 0 none, 1 retransmission, 2 keepalive, 4 zero-window probe.
    timer: u8,
}

/// The established IPv4 connections of process `pid` (its socket inodes matched against
/// `/proc/net/tcp`).
fn established_connections(pid: u32) -> anyhow::Result<Vec<TcpConnection>> {
    let mut inodes = std::collections::BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        if let Some(inode) = target
            .to_string_lossy()
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let port = |address: &str| -> anyhow::Result<u16> {
        let (_, port) = address.split_once(':').context("no port")?;
        Ok(u16::from_str_radix(port, 16)?)
    };
    let mut found = Vec::new();
    for line in std::fs::read_to_string("/proc/net/tcp")?.lines().skip(1) {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        let fields: Vec<&str> = line.split_whitespace().collect();
        ensure!(fields.len() > 9, "unexpected /proc/net/tcp line {line:?}");
        if fields[3] != "01" || !inodes.contains(fields[9]) {
            continue;
        }
        let (timer, _) = fields[5].split_once(':').context("no timer")?;
        found.push(TcpConnection {
            local_port: port(fields[1])?,
            remote_port: port(fields[2])?,
            timer: timer.parse()?,
        });
    }
    Ok(found)
}

/// A client that vanishes without a FIN (a laptop closed mid-exec) or a kube-apiserver that does
/// must not hold a tunnel forever: every connection of the proxy, the accepted ones and those to
/// kube-apiserver, carries a TCP keepalive timer while quiet.
#[tokio::test]
async fn the_proxys_connections_both_ways_carry_tcp_keepalive() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let credential = proxy.signer().issue_client("keepalive-user", &[])?;
    let kubeconfig = proxy.kubeconfig_with_cert("keepalive-user", &credential)?;
    let client = selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await?;
    // The request leaves the client's connection to the proxy and the proxy's to kube-apiserver
    // open and idle in their pools.
    client.apiserver_version().await?;
    let proxy_port: u16 = proxy
        .url()
        .rsplit_once(':')
        .context("the proxy's URL has no port")?
        .1
        .parse()?;
    let apiserver_port = cluster.apiserver_port();
    eventually(Duration::from_secs(10), || async {
        let connections = established_connections(proxy.pid())?;
        let accepted: Vec<&TcpConnection> = connections
            .iter()
            .filter(|c| c.local_port == proxy_port)
            .collect();
        let upstream: Vec<&TcpConnection> = connections
            .iter()
            .filter(|c| c.remote_port == apiserver_port)
            .collect();
        ensure!(
            !accepted.is_empty() && !upstream.is_empty(),
            "no accepted or no upstream connection among {connections:?}"
        );
        ensure!(
            accepted.iter().chain(&upstream).all(|c| c.timer == 2),
            "a quiet connection without a keepalive timer: accepted {accepted:?}, upstream {upstream:?}"
        );
        Ok(())
    })
    .await?;
    drop(client);
    Ok(())
}
