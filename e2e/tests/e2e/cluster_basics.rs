//! The shared cluster is a real, current Kubernetes control plane that kubectl talks to.

use selkie_e2e::Cluster;
use serde_json::Value;

#[tokio::test]
async fn kubectl_lists_the_namespaces_of_the_real_apiserver() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let out = cluster
        .kubectl()
        .run(&["get", "namespaces", "-o", "name"])
        .await?;
    let names: Vec<&str> = out.lines().collect();
    for expected in [
        "namespace/default",
        "namespace/kube-system",
        "namespace/kube-public",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from `kubectl get namespaces`: {names:?}"
        );
    }

    // A namespace created through the kube::Client shows up in kubectl: both talk to one server.
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "basics").await?;
    let out = cluster
        .kubectl()
        .run(&["get", "namespace", &ns, "-o", "jsonpath={.status.phase}"])
        .await?;
    assert_eq!(out, "Active");
    Ok(())
}

#[tokio::test]
async fn kubectl_version_reports_the_pinned_release_on_both_sides() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let out = cluster.kubectl().run(&["version", "-o", "json"]).await?;
    let version: Value = serde_json::from_str(&out)?;
    let pinned = format!("v{}", cluster.kubernetes_version());
    assert_eq!(version["serverVersion"]["gitVersion"], pinned.as_str(), "{out}");
    assert_eq!(version["clientVersion"]["gitVersion"], pinned.as_str(), "{out}");

    let minor: u32 = version["serverVersion"]["minor"]
        .as_str()
        .unwrap_or_default()
        .parse()?;
    assert_eq!(version["serverVersion"]["major"], "1");
    assert!(
        minor >= 34,
        "the harness must run Kubernetes 1.34 or newer, got {pinned}"
    );
    Ok(())
}

#[tokio::test]
async fn the_admin_client_is_a_cluster_admin() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let out = cluster
        .kubectl()
        .run(&["auth", "can-i", "*", "*", "--all-namespaces"])
        .await?;
    assert_eq!(out.trim(), "yes");
    let whoami: Value =
        serde_json::from_str(&cluster.kubectl().run(&["auth", "whoami", "-o", "json"]).await?)?;
    assert_eq!(
        whoami["status"]["userInfo"]["username"],
        selkie_e2e::cluster::ADMIN_USER
    );
    Ok(())
}
