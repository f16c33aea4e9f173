//! Several identity providers behind one FederationDomain: Dex (OIDC) and OpenLDAP, on real
//! components. The identity-provider discovery lists both; `selkie get kubeconfig` asks for a
//! name when there are several and writes the named one's type and flow; a browser login that
//! names none goes through the Supervisor's chooser page (Chromium), where each provider leads to
//! its own login — Dex's form, or the Supervisor's LDAP page — and kubectl reaches the cluster as
//! that provider's user.

use std::{path::Path, time::Duration};

use selkie_e2e::{
    browser::Browser,
    ldap::{LdapUser, Slapd},
    proxy::Proxy,
    supervisor::Supervisor,
};
use serde_json::Value;

use crate::{
    supervisor_ldap::{ensure_ldap_password_flow, get_kubeconfig, groups},
    supervisor_login::{
        cli_says_logged_in, opened_url, plugin_kubeconfig, recording_browser, supervisor_jwt, whoami,
    },
    supervisor_oauth::{dex_user_namespace, DexUserNamespace, PASSWORD},
};

const DEX: &str = "Dex Users";
const LDAP: &str = "Corp LDAP";
const WALRUS_PASSWORD: &str = "tusks-and-all";

/// A kubeconfig in `dir` whose plugin names no identity provider and logs in in the browser
/// (`BROWSER` records the URL it is opened at in `<dir>/urls`).
fn chooser_kubeconfig(
    dir: &Path,
    selkie: &Path,
    supervisor: &Supervisor,
    proxy: &Proxy,
) -> anyhow::Result<std::path::PathBuf> {
    let browser = recording_browser(dir, "browser.sh", &dir.join("urls"))?;
    let browser = browser.display().to_string();
    let path = plugin_kubeconfig(
        dir,
        "chooser",
        selkie,
        supervisor,
        proxy,
        "cluster-a",
        ("unused", "oidc"),
        &[("BROWSER", &browser)],
    )?;
    // No identity provider named: drop the flags that would name one.
    let mut config: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    if let Some(args) = config["users"][0]["user"]["exec"]["args"].as_sequence_mut() {
        args.retain(|arg| {
            !arg.as_str()
                .is_some_and(|a| a.starts_with("--upstream-identity-provider-"))
        });
    }
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

/// The browser's part of a login that starts at the chooser: opens the URL the plugin gave
/// `BROWSER`, checks the chooser lists both providers, picks `choice`, and lets `log_in` fill
/// that provider's form; done once the CLI's page says "logged in".
async fn through_the_chooser<F, Fut>(
    browser: &Browser,
    dir: &Path,
    supervisor: &Supervisor,
    choice: &str,
    log_in: F,
) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let url = opened_url(&dir.join("urls")).await?;
    anyhow::ensure!(!url.contains("pinniped_idp_name"), "{url}");
    browser.goto(&url).await?;
    let at = browser.current_url().await?;
    anyhow::ensure!(
        at.starts_with(&format!("{}/choose_identity_provider?", supervisor.issuer())),
        "not on the chooser: {at}"
    );
    let text = browser.body_text().await?;
    let (ldap, dex) = (text.find(LDAP), text.find(DEX));
    anyhow::ensure!(
        ldap.is_some() && dex.is_some() && ldap < dex,
        "the chooser does not list both, sorted: {text}"
    );
    browser
        .click(&format!(
            "a[href$=\"pinniped_idp_name={}\"]",
            choice.replace(' ', "+")
        ))
        .await?;
    log_in().await?;
    cli_says_logged_in(browser).await
}

#[tokio::test]
async fn one_federation_domain_serves_dex_and_openldap_through_the_chooser() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let port = selkie_e2e::free_port()?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-multi", &["seals"], Some(port)).await?;
    let slapd = Slapd::start(&[LdapUser {
        uid: "walrus".into(),
        password: WALRUS_PASSWORD.into(),
        uid_number: 1002,
        groups: vec!["ops".into()],
    }])
    .await?;
    let supervisor = Supervisor::start_many(
        cluster,
        &namespace,
        &[(&dex, DEX), (&slapd, LDAP)],
        port,
        serde_json::json!({}),
    )
    .await?;
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;

    // Both providers served: the discovery lists them (sorted by name) once both are ready.
    let http = supervisor.client()?;
    let endpoint = format!("{}/v1alpha1/pinniped_identity_providers", supervisor.issuer());
    selkie_e2e::eventually(Duration::from_secs(60), || async {
        let discovery: Value = serde_json::from_slice(&http.get_json(&endpoint, 64 * 1024, None).await?)?;
        let listed: Vec<(&str, &str)> = discovery["pinniped_identity_providers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|idp| {
                (
                    idp["name"].as_str().unwrap_or(""),
                    idp["type"].as_str().unwrap_or(""),
                )
            })
            .collect();
        anyhow::ensure!(listed == [(LDAP, "ldap"), (DEX, "oidc")], "{discovery}");
        Ok(())
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;

    // `selkie get kubeconfig`: several providers, so a name is needed; with it, that provider.
    let unnamed = get_kubeconfig(&selkie, cluster, &supervisor, &[]).await?;
    let stderr = String::from_utf8_lossy(&unnamed.stderr);
    anyhow::ensure!(
        !unnamed.status.success()
            && stderr.contains("multiple Supervisor upstream identity providers were found"),
        "{stderr}"
    );
    let named = get_kubeconfig(
        &selkie,
        cluster,
        &supervisor,
        &[format!("--upstream-identity-provider-name={LDAP}")],
    )
    .await?;
    ensure_ldap_password_flow(&named, LDAP)?;

    // The browser, naming no provider: the chooser, then Dex's form.
    let browser = Browser::start().await?;
    let dex_dir = tempfile::Builder::new().prefix("selkie-chooser-dex-").tempdir()?;
    let kubeconfig = chooser_kubeconfig(dex_dir.path(), &selkie, &supervisor, &proxy)?;
    let login = through_the_chooser(&browser, dex_dir.path(), &supervisor, DEX, || async {
        browser.type_into("input[name=login]", &email).await?;
        browser.type_into("input[name=password]", PASSWORD).await?;
        browser.click("button[type=submit]").await?;
        Ok(())
    });
    let (user, logged_in) = tokio::join!(whoami(&proxy, &kubeconfig), login);
    logged_in.map_err(|e| crate::with_log(e, supervisor.log()))?;
    let user = user.map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(
        user["username"] == email.as_str() && groups(&user) == ["seals"],
        "{user}"
    );

    // And the chooser, then the Supervisor's LDAP page.
    let ldap_dir = tempfile::Builder::new()
        .prefix("selkie-chooser-ldap-")
        .tempdir()?;
    let kubeconfig = chooser_kubeconfig(ldap_dir.path(), &selkie, &supervisor, &proxy)?;
    let login = through_the_chooser(&browser, ldap_dir.path(), &supervisor, LDAP, || async {
        browser.type_into("#username", "walrus").await?;
        browser.type_into("#password", WALRUS_PASSWORD).await?;
        browser.click("#submit").await?;
        Ok(())
    });
    let (user, logged_in) = tokio::join!(whoami(&proxy, &kubeconfig), login);
    logged_in.map_err(|e| crate::with_log(e, supervisor.log()))?;
    let user = user.map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == "walrus" && groups(&user) == ["ops"], "{user}");
    Ok(())
}
