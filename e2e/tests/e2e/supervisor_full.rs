//! Full integration as an admin sets it up and a user meets it, on real components: Dex (the
//! upstream identity provider) → the Selkie Supervisor (on its own cluster) → two more clusters,
//! each a real kube-apiserver with Selkie's Concierge installed from its manifests and a
//! JWTAuthenticator whose issuer is the FederationDomain and whose audience is that cluster's.
//!
//! The user runs `selkie get kubeconfig` against each cluster (it discovers the Supervisor's
//! identity provider and its flows), then the real kubectl: the first call opens the browser
//! (headless Chromium) at the Supervisor, which sends it to Dex's login form and back; the CLI
//! exchanges the session's token for cluster A's audience and gets a certificate from the
//! Concierge (TokenCredentialRequest). Cluster B is then reached **without another browser login**:
//! the same session is exchanged for cluster B's audience.

use std::path::Path;

use selkie_e2e::{concierge::InstalledConcierge, supervisor::Supervisor, Cluster};
use serde_json::{json, Value};

use crate::{
    supervisor_login::{browser_login, recording_browser},
    supervisor_oauth::{dex_user_namespace, DexUserNamespace, IDP_NAME},
};

/// A cluster of the test: a private kube-apiserver with the Concierge installed and trusting the
/// Supervisor's tokens for `audience`, exposing its impersonation proxy, where the group `seals`
/// may list namespaces.
async fn member_cluster(
    supervisor: &Supervisor,
    audience: &str,
) -> anyhow::Result<(Cluster, InstalledConcierge)> {
    let cluster = Cluster::start().await?;
    let concierge = InstalledConcierge::install(&cluster).await?;
    concierge
        .apply_jwt_authenticator_with_claims(
            &cluster,
            "supervisor",
            supervisor.issuer(),
            audience,
            &supervisor.ca_pem(),
            "username",
        )
        .await?;
    concierge.expose_proxy(&cluster).await?;
    crate::proxy_kubectl::grant_namespace_reading(&cluster, "seals").await?;
    Ok((cluster, concierge))
}

/// `selkie get kubeconfig` for `cluster` with the caches in `dir`, with `$BROWSER` set to
/// `browser` in the kubeconfig's exec environment; returns the kubeconfig's path.
pub(crate) async fn get_kubeconfig(
    selkie: &Path,
    cluster: &Cluster,
    dir: &Path,
    name: &str,
    browser: &Path,
) -> anyhow::Result<std::path::PathBuf> {
    let output = tokio::process::Command::new(selkie)
        .args([
            "get".to_string(),
            "kubeconfig".into(),
            format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
            format!("--oidc-session-cache={}", dir.join("sessions.yaml").display()),
            format!("--credential-cache={}", dir.join("credentials.yaml").display()),
            "--timeout=60s".into(),
        ])
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "selkie get kubeconfig failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_slice(&output.stdout)?;
    let exec = &mut kubeconfig["users"][0]["user"]["exec"];
    let args = serde_json::to_value(&exec["args"])?;
    let text = args.to_string();
    // What `get kubeconfig` found: the Supervisor's identity provider, its browser flow, and the
    // cluster's audience to exchange the session's token for.
    for expected in [
        "--upstream-identity-provider-name=Dex Users",
        "--upstream-identity-provider-type=oidc",
        "--enable-concierge",
        "--concierge-authenticator-type=jwt",
        "--concierge-authenticator-name=supervisor",
    ] {
        anyhow::ensure!(text.contains(expected), "{expected} missing from {text}");
    }
    anyhow::ensure!(
        text.contains(&format!("--request-audience={name}")),
        "no audience {name} in {text}"
    );
    exec["env"] = serde_yaml::to_value(json!([
        {"name": "BROWSER", "value": browser.display().to_string()},
    ]))?;
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig)?)?;
    Ok(path)
}

/// The real kubectl with `kubeconfig`, its own discovery cache, no terminal.
async fn kubectl(cluster: &Cluster, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    // Bounded: a first call waits for a browser login, which must not hang the test when the
    // browser's side fails.
    let output = tokio::time::timeout(
        KUBECTL_TIMEOUT,
        tokio::process::Command::new(cluster.kubectl().binary())
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "kubectl {} gave no answer within {KUBECTL_TIMEOUT:?}",
            args.join(" ")
        )
    })??;
    anyhow::ensure!(
        output.status.success(),
        "kubectl {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// How long one kubectl call through the exec plugin may take, a browser login included.
const KUBECTL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

/// The user a cluster sees (`kubectl auth whoami`).
pub(crate) async fn whoami(cluster: &Cluster, kubeconfig: &Path) -> anyhow::Result<Value> {
    let out = kubectl(cluster, kubeconfig, &["auth", "whoami", "-o", "json"]).await?;
    Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
}

#[tokio::test]
async fn deployment_strategy_full_integration_one_browser_login_reaches_two_clusters_with_their_own_concierges(
) -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    // The Supervisor runs on the shared cluster; the clusters users reach are two others.
    let port = selkie_e2e::free_port()?;
    let DexUserNamespace {
        cluster: home,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-full", &["seals", "ops"], Some(port)).await?;
    let supervisor = Supervisor::start_on(home, &namespace, &dex, IDP_NAME, port).await?;
    let ((cluster_a, concierge_a), (cluster_b, concierge_b)) = &tokio::try_join!(
        member_cluster(&supervisor, "cluster-a"),
        member_cluster(&supervisor, "cluster-b"),
    )?;

    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-full-")
        .tempdir()?;
    let urls_a = dir.path().join("browser-urls-a");
    let urls_b = dir.path().join("browser-urls-b");
    let browser_a = recording_browser(dir.path(), "browser-a.sh", &urls_a)?;
    let browser_b = recording_browser(dir.path(), "browser-b.sh", &urls_b)?;
    let kubeconfig_a = get_kubeconfig(&selkie, cluster_a, dir.path(), "cluster-a", &browser_a).await?;
    let kubeconfig_b = get_kubeconfig(&selkie, cluster_b, dir.path(), "cluster-b", &browser_b).await?;

    // Cluster A: kubectl's first call logs in through the browser.
    let browser = selkie_e2e::browser::Browser::start().await?;
    let login = browser_login(&browser, &urls_a, &supervisor, &email);
    let context = |e: anyhow::Error| {
        e.context(format!(
            "--- Supervisor log ---\n{}\n--- Concierge A log ---\n{}",
            supervisor.log(),
            concierge_a.process().log()
        ))
    };
    let (namespaces, logged_in) = tokio::join!(
        kubectl(cluster_a, &kubeconfig_a, &["get", "namespaces", "-o", "name"]),
        login
    );
    logged_in.map_err(context)?;
    let namespaces = namespaces.map_err(context)?;
    anyhow::ensure!(
        namespaces.contains("namespace/pinniped-concierge"),
        "{namespaces}"
    );
    let user = whoami(cluster_a, &kubeconfig_a).await?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");
    let groups = user["groups"].to_string();
    anyhow::ensure!(groups.contains("seals") && groups.contains("ops"), "{user}");
    // The Concierge issued the certificate kubectl used (TokenCredentialRequest).
    anyhow::ensure!(
        concierge_a
            .process()
            .log()
            .lines()
            .any(|line| line.contains("token credential request")),
        "no TokenCredentialRequest in the Concierge's log"
    );

    // Cluster B: no browser at all — its $BROWSER records nothing — and the same user.
    let user = whoami(cluster_b, &kubeconfig_b)
        .await
        .map_err(|e| crate::with_log(e, concierge_b.process().log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");
    let namespaces = kubectl(cluster_b, &kubeconfig_b, &["get", "namespaces", "-o", "name"]).await?;
    anyhow::ensure!(
        namespaces.contains("namespace/pinniped-concierge"),
        "{namespaces}"
    );
    anyhow::ensure!(
        !urls_b.exists(),
        "cluster B opened the browser: {}",
        std::fs::read_to_string(&urls_b).unwrap_or_default()
    );
    let opened = std::fs::read_to_string(&urls_a)?;
    anyhow::ensure!(
        opened.lines().count() == 1,
        "more than one browser login: {opened}"
    );

    // The Supervisor saw one login (one authorization code redeemed) and one token exchange per
    // cluster, each for that cluster's audience (a JWTAuthenticator accepts only its own).
    let metrics = supervisor.metrics().await?;
    for expected in [
        "selkie_supervisor_token_grants_total{grant_type=\"authorization_code\",result=\"ok\"} 1",
        "selkie_supervisor_token_grants_total{grant_type=\"token_exchange\",result=\"ok\"} 2",
    ] {
        anyhow::ensure!(
            metrics.lines().any(|line| line == expected),
            "{expected} not in:\n{metrics}"
        );
    }
    Ok(())
}
