//! SIGTERM at the Supervisor, as Kubernetes sends it to a pod it stops: `/healthz` answers 503 at
//! once while logins are still served for the grace period (the time Service endpoints, kube-proxy
//! and load balancers take to stop sending connections to the pod); then the listener closes and
//! the process exits 0. Without the grace period, a rolling upgrade refuses the logins that
//! kube-proxy still routes to the old pods. A force-deleted pod's Supervisor skips the grace period
//! (its token died with the pod, so it could serve nothing): how it tells is tested here too; the
//! node test kills a pod that way under load.

use std::{
    net::TcpStream,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use selkie_e2e::{eventually, pinniped_cli, supervisor::Supervisor};

use super::{
    supervisor_oauth::{dex_user_namespace, DexUserNamespace},
    supervisor_sessions::login,
};

const IDP_NAME: &str = "Dex Users";

#[tokio::test]
async fn sigterm_turns_healthz_unready_serves_logins_through_the_grace_period_and_exits_zero(
) -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(8);
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-shutdown", &["seals"], None).await?;
    let mut supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        &dex,
        IDP_NAME,
        selkie_e2e::free_port()?,
        serde_json::json!({"shutdown": {"gracePeriodSeconds": GRACE.as_secs(), "drainTimeoutSeconds": 10}}),
    )
    .await?;
    let client = supervisor.client()?;
    let (origin, _) = pinniped_cli::split_issuer(supervisor.issuer());
    let address = origin.trim_start_matches("https://").to_string();
    let healthz = format!("{origin}/healthz");
    let health = pinniped_cli::get(&client, &healthz, None, "").await?;
    ensure!(health.status == 200, "/healthz before SIGTERM: {}", health.status);

    supervisor.terminate();
    let signalled = Instant::now();
    // Unready at once ...
    eventually(Duration::from_secs(2), || async {
        let health = pinniped_cli::get(&client, &healthz, None, "").await?;
        ensure!(
            health.status == 503 && health.body.as_ref() == b"shutting down",
            "/healthz answered {}",
            health.status
        );
        Ok(())
    })
    .await?;
    // ... while new connections are accepted and logins served.
    ensure!(
        TcpStream::connect(&address).is_ok(),
        "the listener refuses connections during the grace period"
    );
    login(&supervisor, IDP_NAME, &email)
        .await
        .context("a login during the grace period")?;
    ensure!(
        signalled.elapsed() < GRACE,
        "the checks above took longer than the grace period ({:?})",
        signalled.elapsed()
    );

    // Then the listener closes, not before the grace period is over ...
    eventually(GRACE + Duration::from_secs(5), || async {
        ensure!(
            TcpStream::connect(&address).is_err(),
            "the Supervisor still accepts connections"
        );
        Ok(())
    })
    .await?;
    ensure!(
        signalled.elapsed() >= GRACE,
        "the listener closed {:?} after SIGTERM, before the grace period was over",
        signalled.elapsed()
    );
    // ... and the process exits 0.
    let status = supervisor.wait_for_exit(Duration::from_secs(15)).await?;
    ensure!(status.success(), "the Supervisor exited with {status}");
    let log = supervisor.log();
    ensure!(
        log.contains("SIGTERM: /healthz answers 503") && log.contains("closing the listeners"),
        "{log}"
    );
    Ok(())
}

/// A kubeconfig for `cluster` whose credentials are a token of the service account `probe` of
/// `namespace`, bound to the Secret `anchor` there (both created here): deleting the Secret does
/// to the token what `kubectl delete pod --force` does to a pod's token (the loopback clusters
/// run no pods). With `admin`, the service account is bound to `cluster-admin` (named
/// `selkie-e2e-<namespace>-probe`). Returns the file's directory (kept while it is used) and path.
async fn bound_token_kubeconfig(
    cluster: &selkie_e2e::Cluster,
    namespace: &str,
    admin: bool,
) -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf)> {
    let kubectl = cluster.kubectl();
    kubectl
        .run(&["create", "serviceaccount", "probe", "-n", namespace])
        .await?;
    kubectl
        .run(&["create", "secret", "generic", "anchor", "-n", namespace])
        .await?;
    if admin {
        kubectl
            .run(&[
                "create",
                "clusterrolebinding",
                &format!("selkie-e2e-{namespace}-probe"),
                "--clusterrole=cluster-admin",
                &format!("--serviceaccount={namespace}:probe"),
            ])
            .await?;
    }
    let token = kubectl
        .run(&[
            "create",
            "token",
            "probe",
            "-n",
            namespace,
            "--duration=1h",
            "--bound-object-kind=Secret",
            "--bound-object-name=anchor",
        ])
        .await?;
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(cluster.admin_kubeconfig())?)?;
    kubeconfig["users"][0]["user"] = serde_yaml::to_value(serde_json::json!({"token": token.trim()}))?;
    let dir = tempfile::Builder::new().prefix("selkie-bound-token-").tempdir()?;
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig)?)?;
    Ok((dir, path))
}

/// Deletes the Secret `anchor` of `namespace` and waits (30 s at most) until kube-apiserver
/// refuses the token bound to it, as seen through the kubeconfig at `path`.
async fn revoke(
    cluster: &selkie_e2e::Cluster,
    namespace: &str,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let client = selkie_e2e::cluster::client_from_kubeconfig(path).await?;
    ensure!(
        !selkie_kube::client::credentials_rejected(&client, Duration::from_secs(10)).await,
        "a live token counts as rejected"
    );
    cluster
        .kubectl()
        .run(&["delete", "secret", "anchor", "-n", namespace])
        .await?;
    eventually(Duration::from_secs(30), || async {
        ensure!(
            selkie_kube::client::credentials_rejected(&client, Duration::from_secs(10)).await,
            "the token still works after its Secret was deleted"
        );
        Ok(())
    })
    .await
}

/// How the Supervisor tells, on SIGTERM, that its pod was force-deleted: kube-apiserver refuses
/// the pod's bound service-account token once the object it is bound to is gone; an admin's
/// credentials and a live token are not refused.
#[tokio::test]
async fn a_token_whose_bound_object_is_deleted_counts_as_rejected_credentials() -> anyhow::Result<()> {
    let cluster = selkie_e2e::Cluster::shared().await?;
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "supervisor-revoked").await?;
    let (_dir, path) = bound_token_kubeconfig(cluster, &namespace, false).await?;
    ensure!(
        !selkie_kube::client::credentials_rejected(&admin, Duration::from_secs(10)).await,
        "the admin's certificate counts as rejected"
    );
    revoke(cluster, &namespace, &path).await
}

/// A Supervisor whose credentials died with its pod (force-deleted) stops at once on SIGTERM
/// instead of serving out its grace period, in which it could store no session.
#[tokio::test]
async fn a_supervisor_whose_token_died_with_its_pod_skips_the_grace_period() -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(60);
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-forced", &["seals"], None).await?;
    let (_dir, kubeconfig) = bound_token_kubeconfig(cluster, &namespace, true).await?;
    let binding = format!("selkie-e2e-{namespace}-probe");
    let outcome = async {
        let mut supervisor = Supervisor::start_with(
            cluster,
            &namespace,
            &dex,
            IDP_NAME,
            selkie_e2e::free_port()?,
            serde_json::json!({
                "kubeconfig": kubeconfig,
                "shutdown": {"gracePeriodSeconds": GRACE.as_secs(), "drainTimeoutSeconds": 5},
            }),
        )
        .await?;
        // It works with these credentials ...
        login(&supervisor, IDP_NAME, &email)
            .await
            .context("a login with the bound token")?;
        // ... until they die.
        revoke(cluster, &namespace, &kubeconfig).await?;
        supervisor.terminate();
        let status = supervisor
            .wait_for_exit(Duration::from_secs(20))
            .await
            .map_err(|e| {
                crate::with_log(
                    anyhow::Error::from(e).context(format!("grace period {GRACE:?}")),
                    supervisor.log(),
                )
            })?;
        ensure!(status.success(), "the Supervisor exited with {status}");
        let log = supervisor.log();
        ensure!(
            log.contains("skipping the grace period") && !log.contains("serving on for the grace period"),
            "{log}"
        );
        Ok(())
    }
    .await;
    cluster
        .kubectl()
        .run(&["delete", "clusterrolebinding", &binding, "--ignore-not-found"])
        .await?;
    outcome
}
