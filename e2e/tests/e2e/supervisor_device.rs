//! The device authorization grant (RFC 8628; Pinniped #3228) on real components: kubectl runs
//! `selkie login oidc --upstream-identity-provider-flow device` as its exec plugin where no
//! browser can be opened (`BROWSER=/bin/false`); the plugin prints a link and a user code and
//! polls, while the user opens the link in headless Chromium, confirms the code, logs in at Dex,
//! and lands on the Supervisor's "You are logged in" page; kubectl then reaches the cluster as
//! the Dex user with their groups. The grant is off until the admin enables it on the
//! FederationDomain, and a user code works once.

use std::{process::Stdio, time::Duration};

use selkie_e2e::{proxy::Proxy, supervisor::Supervisor};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::{
    proxy_kubectl::grant_configmaps,
    supervisor_login::{plugin_kubeconfig, supervisor_jwt},
    supervisor_oauth::{dex_user_namespace, DexUserNamespace},
    supervisor_transforms::patch_federation_domain,
};

const PASSWORD: &str = "seal-of-approval";
const IDP_NAME: &str = "Dex Users";

/// The FederationDomain's discovery document.
pub(crate) async fn discovery(supervisor: &Supervisor) -> anyhow::Result<Value> {
    let url = format!("{}/.well-known/openid-configuration", supervisor.issuer());
    let body = supervisor.client()?.get_json(&url, 64 * 1024, None).await?;
    Ok(serde_json::from_slice(&body)?)
}

#[tokio::test]
async fn a_device_login_finished_in_a_browser_elsewhere_lets_kubectl_in() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let port = selkie_e2e::free_port()?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-device", &["seals"], Some(port)).await?;
    grant_configmaps(cluster, &namespace, "User", &email).await?;
    let supervisor = Supervisor::start_on(cluster, &namespace, &dex, IDP_NAME, port).await?;
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;

    // Off by default, as in Pinniped.
    let before = discovery(&supervisor).await?;
    anyhow::ensure!(before.get("device_authorization_endpoint").is_none(), "{before}");
    patch_federation_domain(
        cluster,
        &namespace,
        "merge",
        r#"{"spec":{"deviceAuthorization":{"enabled":true}}}"#,
    )
    .await?;
    let endpoint = format!("{}/oauth2/device_authorization", supervisor.issuer());
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let document = discovery(&supervisor).await?;
        anyhow::ensure!(
            document["device_authorization_endpoint"] == endpoint.as_str(),
            "{document}"
        );
        Ok(())
    })
    .await?;

    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-device-")
        .tempdir()?;
    let kubeconfig = plugin_kubeconfig(
        dir.path(),
        "device",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        (IDP_NAME, "oidc"),
        &[
            ("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "device"),
            ("BROWSER", "/bin/false"),
        ],
    )?;
    let mut kubectl = tokio::process::Command::new(cluster.kubectl().binary())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["auth", "whoami", "-o", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = kubectl
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut stderr = BufReader::new(
        kubectl
            .stderr
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stderr"))?,
    )
    .lines();

    // The plugin's message reaches the user through kubectl's stderr.
    let mut printed = String::new();
    let link = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await? {
            printed.push_str(&line);
            printed.push('\n');
            if let Some(at) = line.find("https://") {
                let link = line[at..].trim().to_string();
                if link.contains("/device?user_code=") {
                    return Ok(link);
                }
            }
        }
        anyhow::bail!("kubectl ended without a device link")
    })
    .await
    .map_err(|_| anyhow::anyhow!("no device link within 60 s"))?
    .map_err(|e| crate::with_log(e.context(printed.clone()), supervisor.log()))?;
    anyhow::ensure!(
        link.starts_with(&format!("{}/device?user_code=", supervisor.issuer())),
        "{link}"
    );
    let user_code = link.rsplit('=').next().unwrap_or_default().to_string();
    // The rest of stderr, read meanwhile so the plugin never blocks on a full pipe.
    let rest = tokio::spawn(async move {
        let mut rest = String::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            rest.push_str(&line);
            rest.push('\n');
        }
        rest
    });

    let browser = selkie_e2e::browser::Browser::start().await?;
    let user = async {
        browser.goto(&link).await?;
        let page = browser.body_text().await?;
        anyhow::ensure!(
            page.contains("Only enter a code you read on your own screen"),
            "{page}"
        );
        browser.click("#submit").await?;
        // On to Dex's form (the FederationDomain's only identity provider), logging in as a user
        // would: a form submission that a network change interrupts is made again.
        let dex = selkie_e2e::eventually(Duration::from_secs(30), || async {
            let at = browser.current_url().await?;
            anyhow::ensure!(at.contains("/dex/"), "at {at}");
            Ok(at)
        })
        .await?;
        browser.dex_login(&dex, &email, PASSWORD).await?;
        selkie_e2e::eventually(Duration::from_secs(30), || async {
            let at = browser.current_url().await?;
            let text = browser.body_text().await?;
            anyhow::ensure!(
                at.starts_with(&format!("{}/device/callback", supervisor.issuer()))
                    && text.contains("You are logged in"),
                "at {at}: {text}"
            );
            Ok(())
        })
        .await
    };
    // kubectl ends once the plugin's poll is answered with tokens; a failed browser login ends
    // the wait at once (dropping kubectl kills it) rather than when the device code expires.
    let output = async {
        tokio::time::timeout(Duration::from_secs(150), async {
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut BufReader::new(stdout), &mut out).await?;
            anyhow::Ok((kubectl.wait().await?, out))
        })
        .await
        .map_err(|_| anyhow::anyhow!("kubectl did not finish within 150 s of showing the link"))?
    };
    let ((), (status, out)) =
        tokio::try_join!(user, output).map_err(|e| crate::with_log(e, supervisor.log()))?;
    let rest = rest.await?;
    anyhow::ensure!(
        status.success(),
        "kubectl failed: {printed}{rest}\n{}",
        supervisor.log()
    );
    let who: Value = serde_json::from_str(&out)?;
    let info = &who["status"]["userInfo"];
    anyhow::ensure!(info["username"] == email.as_str(), "{who}");
    anyhow::ensure!(
        info["groups"]
            .as_array()
            .is_some_and(|groups| groups.iter().any(|g| g == "seals")),
        "{who}"
    );
    anyhow::ensure!(printed.contains(&user_code), "the code is shown: {printed}");
    anyhow::ensure!(
        !format!("{printed}{rest}").contains("pin_dc_"),
        "the device code was printed"
    );

    // A user code logs in once.
    browser.goto(&link).await?;
    browser.click("#submit").await?;
    selkie_e2e::eventually(Duration::from_secs(15), || async {
        let text = browser.body_text().await?;
        anyhow::ensure!(text.contains("unknown, used already or expired"), "{text}");
        Ok(())
    })
    .await?;
    Ok(())
}
