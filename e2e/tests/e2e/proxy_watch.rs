//! Watches through the proxy are streams, not requests: kubectl's `get -w` through the proxy
//! stays open while nothing happens and still delivers the next event, and more watches than one
//! upstream HTTP/2 connection may carry are spread over several.

use std::{process::Stdio, time::Duration};

use selkie_e2e::{proxy::Proxy, Cluster};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long the watch sits idle: longer than the common 60 s idle timeouts of proxies and load
/// balancers, and than pingora's defaults.
const IDLE: Duration = Duration::from_secs(125);

#[tokio::test]
async fn a_kubectl_watch_delivers_events_after_two_minutes_idle() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-watch").await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let grace = proxy.signer().issue_client("grace", &[])?;
    cluster
        .kubectl()
        .run(&[
            "create",
            "clusterrolebinding",
            &format!("watch-admin-{namespace}"),
            "--clusterrole=cluster-admin",
            "--user=grace",
        ])
        .await?;
    cluster
        .kubectl()
        .run(&["create", "configmap", "before", "-n", &namespace])
        .await?;

    let kubeconfig = proxy.kubeconfig_with_cert("grace", &grace)?;
    let mut watch = tokio::process::Command::new(cluster.kubectl().binary())
        .args([
            "get",
            "configmaps",
            "-n",
            &namespace,
            "-w",
            "-o",
            "name",
            "--request-timeout=0",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(watch.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
    assert_eq!(
        first.as_deref(),
        Some("configmap/before"),
        "the watch lists what exists first"
    );

    tokio::time::sleep(IDLE).await;
    cluster
        .kubectl()
        .run(&["create", "configmap", "after", "-n", &namespace])
        .await?;
    let next = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
    assert_eq!(
        next.as_deref(),
        Some("configmap/after"),
        "the idle watch still delivers"
    );
    assert!(watch.try_wait()?.is_none(), "kubectl's watch is still running");
    Ok(())
}

/// Watches held at once: three client connections, each at pingora's limit of 100 streams.
const HELD_WATCHES: usize = 300;
/// The proxy's HTTP/2 streams per upstream connection (config.rs), so 300 watches need at least
/// three connections to kube-apiserver.
const STREAMS_PER_UPSTREAM_CONNECTION: usize = 100;

/// The value of the Prometheus sample `name` in `exposition`.
fn sample(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

/// How many of the watch `streams` deliver an event containing `needle` within 30 s (each is
/// read until it does, or ends).
async fn watches_seeing(
    streams: &mut [http_body_util::BodyStream<hyper::body::Incoming>],
    needle: &[u8],
) -> anyhow::Result<usize> {
    use futures::StreamExt as _;
    let delivered = futures::future::join_all(streams.iter_mut().map(|stream| async move {
        let mut seen = Vec::new();
        while let Some(frame) = stream.next().await {
            if let Ok(data) = frame?.into_data() {
                seen.extend_from_slice(&data);
                if seen.windows(needle.len()).any(|w| w == needle) {
                    return anyhow::Ok(());
                }
            }
        }
        anyhow::bail!("the watch ended before the event")
    }));
    Ok(tokio::time::timeout(Duration::from_secs(30), delivered)
        .await?
        .into_iter()
        .filter(Result::is_ok)
        .count())
}

#[tokio::test]
async fn more_watches_than_one_upstream_connection_carries_all_stay_open_and_deliver() -> anyhow::Result<()> {
    use http_body_util::{BodyStream, Full};

    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-many-watches").await?;
    let user = format!("watcher-{namespace}");
    crate::proxy_kubectl::grant_configmaps(cluster, &namespace, "User", &user).await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let credential = proxy.signer().issue_client(&user, &[])?;

    let url = format!(
        "{}/api/v1/namespaces/{namespace}/configmaps?watch=1&timeoutSeconds=60",
        proxy.url()
    );
    let clients = (0..HELD_WATCHES / 100)
        .map(|_| crate::proxy_kubectl::proxy_client(&proxy, Some(&credential), true))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let opened = futures::future::join_all((0..HELD_WATCHES).map(|i| {
        let request = http::Request::get(&url).body(Full::new(bytes::Bytes::new()));
        let client = &clients[i % clients.len()];
        async move { anyhow::Ok(client.request(request?).await?) }
    }))
    .await;
    let mut streams = Vec::with_capacity(HELD_WATCHES);
    for response in opened {
        let response = response?;
        anyhow::ensure!(
            response.status() == 200,
            "a watch was answered {}",
            response.status()
        );
        streams.push(BodyStream::new(response.into_body()));
    }

    let (_, metrics) = proxy.operations_get("/metrics").await?;
    let upstream = sample(
        &metrics,
        "selkie_proxy_upstream_connections_total{connection=\"new\"}",
    )
    .ok_or_else(|| anyhow::anyhow!("no upstream connection count in:\n{metrics}"))?;
    // One connection per 100 streams, however the watches arrive: opened all at once, the
    // requests that find every connection full wait while one of them opens the next (without
    // that gate pingora opened about one connection per three watches here). One more is
    // tolerated: a request that waited out its bound goes on as pingora would.
    let needed = HELD_WATCHES.div_ceil(STREAMS_PER_UPSTREAM_CONNECTION) as f64;
    eprintln!("{HELD_WATCHES} watches over {upstream} new upstream connections");
    assert!(
        upstream >= needed && upstream <= needed + 1.0,
        "{HELD_WATCHES} held watches over {upstream} upstream connections (needed {needed})"
    );

    // One event reaches every watch.
    cluster
        .kubectl()
        .run(&["create", "configmap", "to-all", "-n", &namespace])
        .await?;
    let delivered = watches_seeing(&mut streams, b"to-all").await?;
    assert_eq!(delivered, HELD_WATCHES, "watches that saw the event");
    Ok(())
}

/// kube-apiserver's count of the watches it is serving on `resource` (its
/// `apiserver_longrunning_requests` gauge, every scope).
async fn apiserver_watches(cluster: &Cluster, resource: &str) -> anyhow::Result<f64> {
    let metrics = cluster.kubectl().run(&["get", "--raw", "/metrics"]).await?;
    let label = format!("resource=\"{resource}\"");
    Ok(metrics
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_longrunning_requests{")
                && line.contains(&label)
                && line.contains("verb=\"WATCH\"")
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// Watches over HTTP/2 take the proxy's lean path for long-lived responses
/// (`selkie_proxy::streams`): they open, deliver, and when the client cancels them (resets its
/// streams) kube-apiserver stops serving them too — the proxy resets the upstream streams rather
/// than leaving watches running upstream until their timeout. Each watch leaves its audit line,
/// with the status kube-apiserver answered.
#[tokio::test]
async fn cancelled_watches_end_at_kube_apiserver_too() -> anyhow::Result<()> {
    use http_body_util::{BodyStream, Full};

    // Nothing else in the suite watches PodTemplates, so kube-apiserver's gauge is this test's.
    const RESOURCE: &str = "podtemplates";
    const WATCHES: usize = 30;
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-cancel").await?;
    let user = format!("canceller-{namespace}");
    cluster
        .kubectl()
        .create_role_and_binding(
            &namespace,
            "watch-podtemplates",
            "get,list,watch",
            RESOURCE,
            &[&format!("--user={user}")],
        )
        .await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let credential = proxy.signer().issue_client(&user, &[])?;
    let before = apiserver_watches(cluster, RESOURCE).await?;

    let url = format!(
        "{}/api/v1/namespaces/{namespace}/{RESOURCE}?watch=true&timeoutSeconds=600",
        proxy.url()
    );
    let http2 = crate::proxy_kubectl::proxy_client(&proxy, Some(&credential), true)?;
    let mut streams = Vec::with_capacity(WATCHES);
    for _ in 0..WATCHES {
        let request = http::Request::get(&url).body(Full::new(bytes::Bytes::new()))?;
        let response = http2.request(request).await?;
        anyhow::ensure!(
            response.status() == 200,
            "a watch was answered {}",
            response.status()
        );
        streams.push(BodyStream::new(response.into_body()));
    }
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let now = apiserver_watches(cluster, RESOURCE).await?;
        anyhow::ensure!(
            now >= before + WATCHES as f64,
            "kube-apiserver serves {now} watches, {before} before"
        );
        Ok(())
    })
    .await?;

    // They deliver.
    let template = serde_json::json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": "seen-by-all", "namespace": namespace},
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    });
    cluster
        .kubectl()
        .run_with_stdin(&["create", "-f", "-"], Some(&template.to_string()))
        .await?;
    let delivered = watches_seeing(&mut streams, b"seen-by-all").await?;
    anyhow::ensure!(
        delivered == WATCHES,
        "{delivered} of {WATCHES} watches saw the event"
    );

    // The client cancels them all; kube-apiserver stops serving them well before their timeout.
    drop(streams);
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let now = apiserver_watches(cluster, RESOURCE).await?;
        anyhow::ensure!(
            now <= before,
            "kube-apiserver still serves {now} watches on {RESOURCE} ({before} before the test)"
        );
        Ok(())
    })
    .await?;

    let path = format!("\"path\":\"/api/v1/namespaces/{namespace}/{RESOURCE}\"");
    selkie_e2e::eventually(Duration::from_secs(10), || async {
        let log = proxy.log();
        let audited = log
            .lines()
            .filter(|line| {
                line.contains("selkie::audit") && line.contains(&path) && line.contains("\"status\":200")
            })
            .count();
        anyhow::ensure!(
            audited == WATCHES,
            "{audited} audit lines for the {WATCHES} watches in:\n{log}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}
