//! Watches through the proxy are streams, not requests: kubectl's `get -w` through the proxy
//! stays open while nothing happens and still delivers the next event.

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
