//! A user minted with the cluster client CA's key (the stand-in for the cluster signing key) is
//! authenticated with every group, and RBAC applies to it.

use std::time::Duration;

use selkie_e2e::Cluster;
use serde_json::Value;

use crate::eventually;

#[tokio::test]
async fn client_certificate_user_is_authenticated_with_both_groups_and_rbac_applies() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "rbac").await?;
    let user = format!("alice-{ns}");
    let kubeconfig = cluster.user_kubeconfig(&user, &["selkie:devs", "selkie:ops"])?;
    let alice = cluster.kubectl().with_kubeconfig(&kubeconfig);

    let whoami: Value = serde_json::from_str(&alice.run(&["auth", "whoami", "-o", "json"]).await?)?;
    let info = &whoami["status"]["userInfo"];
    assert_eq!(info["username"], user.as_str(), "{whoami}");
    let groups: Vec<&str> = info["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for group in ["selkie:devs", "selkie:ops", "system:authenticated"] {
        assert!(groups.contains(&group), "group {group} missing: {groups:?}");
    }

    // Nothing grants alice anything yet.
    let denied = alice.output(&["get", "secrets", "-n", &ns], None).await?;
    assert!(
        !denied.success,
        "reading secrets must be forbidden before any binding: {denied:?}"
    );
    assert!(
        denied.stderr.contains("Forbidden") && denied.stderr.contains(&format!("\"{user}\"")),
        "expected a Forbidden error naming the user, got: {}",
        denied.stderr
    );

    // Grant it through the *second* group, so the test also proves every O= became a group.
    let admin = cluster.kubectl();
    admin
        .run(&[
            "create",
            "role",
            "secret-reader",
            "--verb=get,list",
            "--resource=secrets",
            "-n",
            &ns,
        ])
        .await?;
    admin
        .run(&[
            "create",
            "rolebinding",
            "ops-read-secrets",
            "--role=secret-reader",
            "--group=selkie:ops",
            "-n",
            &ns,
        ])
        .await?;
    admin
        .run(&[
            "create",
            "secret",
            "generic",
            "s1",
            "--from-literal=k=v",
            "-n",
            &ns,
        ])
        .await?;

    let listed = eventually(Duration::from_secs(15), || async {
        Ok(alice.run(&["get", "secrets", "-n", &ns, "-o", "name"]).await?)
    })
    .await?;
    assert_eq!(listed.trim(), "secret/s1");

    // The grant is scoped to the namespace.
    let elsewhere = alice
        .output(&["get", "secrets", "-n", "kube-system"], None)
        .await?;
    assert!(
        !elsewhere.success && elsewhere.stderr.contains("Forbidden"),
        "{elsewhere:?}"
    );
    Ok(())
}
