//! Full integration through the Selkie Supervisor, on real components: Dex (the upstream OIDC
//! provider) → the Supervisor (a FederationDomain with an OIDCIdentityProvider for Dex) → two
//! impersonation proxies, each with a JWTAuthenticator whose issuer is the FederationDomain and
//! whose audience is its own ("cluster-a", "cluster-b") → the real kube-apiserver, with the real
//! kubectl running `selkie login oidc` as its exec credential plugin.
//!
//! The user logs in once (the `cli_password` flow: the Supervisor uses Dex's password grant);
//! every cluster then gets its own two-minute token by RFC 8693 token exchange from the session,
//! without another login.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use selkie_e2e::{
    cluster::write_kubeconfig_for_user,
    dex::{Dex, DexUser},
    proxy::{JwtSpec, Proxy},
    supervisor::Supervisor,
    Cluster,
};
use serde_json::{json, Value};

use crate::{
    proxy_kubectl::grant_configmaps,
    supervisor_oauth::{dex_user_namespace, DexUserNamespace},
};

const PASSWORD: &str = "seal-of-approval";
const IDP_NAME: &str = "Dex Users";

/// A kubeconfig for `proxy` whose user runs `selkie login oidc` against the Supervisor for
/// `audience`, with the cli_password flow and `password`, and the caches in `dir`.
#[expect(
    clippy::too_many_arguments,
    reason = "one value per part of the exec plugin's configuration"
)]
pub(crate) fn kubeconfig(
    dir: &Path,
    name: &str,
    selkie: &Path,
    supervisor: &Supervisor,
    proxy: &Proxy,
    audience: &str,
    email: &str,
    password: &str,
) -> anyhow::Result<PathBuf> {
    plugin_kubeconfig(
        dir,
        name,
        selkie,
        supervisor,
        proxy,
        audience,
        (IDP_NAME, "oidc"),
        &[
            ("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "cli_password"),
            ("PINNIPED_USERNAME", email),
            ("PINNIPED_PASSWORD", password),
        ],
    )
}

/// A kubeconfig `<dir>/<name>.kubeconfig` for `proxy` whose user runs `selkie login oidc`
/// against the Supervisor for `audience` through the Concierge's JWTAuthenticator `supervisor`,
/// with the identity provider `idp` (display name, type), the caches in `dir` and the plugin's
/// environment `env` (flow, username, password, `BROWSER`).
#[expect(
    clippy::too_many_arguments,
    reason = "one value per part of the exec plugin's configuration"
)]
pub(crate) fn plugin_kubeconfig(
    dir: &Path,
    name: &str,
    selkie: &Path,
    supervisor: &Supervisor,
    proxy: &Proxy,
    audience: &str,
    (idp_name, idp_type): (&str, &str),
    env: &[(&str, &str)],
) -> anyhow::Result<PathBuf> {
    let args = [
        "login".to_string(),
        "oidc".into(),
        format!("--issuer={}", supervisor.issuer()),
        format!("--ca-bundle-data={}", B64.encode(supervisor.ca_pem())),
        format!("--request-audience={audience}"),
        format!("--upstream-identity-provider-name={idp_name}"),
        format!("--upstream-identity-provider-type={idp_type}"),
        format!("--session-cache={}", dir.join("sessions.yaml").display()),
        format!("--credential-cache={}", dir.join("credentials.yaml").display()),
        "--enable-concierge".into(),
        "--concierge-api-group-suffix=pinniped.dev".into(),
        "--concierge-authenticator-type=jwt".into(),
        "--concierge-authenticator-name=supervisor".into(),
        format!("--concierge-endpoint={}", proxy.url()),
        format!(
            "--concierge-ca-bundle-data={}",
            B64.encode(proxy.serving_ca().cert_pem())
        ),
    ];
    let env: Vec<Value> = env
        .iter()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    let exec = json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": selkie,
        "args": args,
        "env": env,
        "provideClusterInfo": true,
        "interactiveMode": "Never",
    }});
    let path = dir.join(format!("{name}.kubeconfig"));
    write_kubeconfig_for_user(&path, proxy.url(), &proxy.serving_ca().cert_pem(), name, exec)?;
    Ok(path)
}

/// The JWTAuthenticator of a cluster trusting the Supervisor's tokens for `audience`.
pub(crate) fn supervisor_jwt(supervisor: &Supervisor, audience: &str) -> JwtSpec {
    JwtSpec {
        name: "supervisor".into(),
        issuer: supervisor.issuer().into(),
        audience: audience.into(),
        username_claim: "username".into(),
        groups_claim: "groups".into(),
        ca_pem: supervisor.ca_pem(),
    }
}

/// `kubectl auth whoami` through `proxy` with `kubeconfig`: the user info.
pub(crate) async fn whoami(proxy: &Proxy, kubeconfig: &Path) -> anyhow::Result<Value> {
    let out = proxy
        .kubectl(kubeconfig)
        .run(&["auth", "whoami", "-o", "json"])
        .await?;
    Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
}

#[tokio::test]
async fn one_password_login_through_the_supervisor_reaches_two_clusters() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor", &["seals", "ops"], None).await?;
    grant_configmaps(cluster, &namespace, "User", &email).await?;
    let mut supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let cluster_a = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;
    let cluster_b = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-b")]).await?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-login-")
        .tempdir()?;

    // The FederationDomain and its identity provider report Ready.
    let kubectl = cluster.kubectl();
    for (kind, name) in [
        ("federationdomain", "federation-domain"),
        ("oidcidentityprovider", "dex"),
    ] {
        let phase = kubectl
            .run(&[
                "get",
                kind,
                name,
                "-n",
                &namespace,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .await?;
        anyhow::ensure!(
            phase == "Ready",
            "{kind} {name} is {phase:?}:\n{}",
            supervisor.log()
        );
    }

    // Cluster A: the first kubectl call logs in (password grant at Dex through the Supervisor),
    // exchanges the session's access token for a cluster-a token, and gets a certificate.
    let config_a = kubeconfig(
        dir.path(),
        "a",
        &selkie,
        &supervisor,
        &cluster_a,
        "cluster-a",
        &email,
        PASSWORD,
    )?;
    let user = whoami(&cluster_a, &config_a)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "cluster-a: {user}");
    let groups: Vec<&str> = user["groups"]
        .as_array()
        .map(|groups| groups.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    anyhow::ensure!(
        groups.contains(&"seals") && groups.contains(&"ops"),
        "cluster-a groups: {user}"
    );

    // Cluster B: no new login — the kubeconfig's password is wrong, so a login would fail; the
    // session's tokens are exchanged for a cluster-b token instead.
    let config_b = kubeconfig(
        dir.path(),
        "b",
        &selkie,
        &supervisor,
        &cluster_b,
        "cluster-b",
        &email,
        "wrong",
    )?;
    let user = whoami(&cluster_b, &config_b)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "cluster-b: {user}");

    // A cluster-a token is not a cluster-b token: a fresh cache with a wrong password cannot get
    // in, and nothing leaks into the Supervisor's log.
    let fresh = tempfile::Builder::new()
        .prefix("selkie-supervisor-fresh-")
        .tempdir()?;
    let config_wrong = kubeconfig(
        fresh.path(),
        "wrong",
        &selkie,
        &supervisor,
        &cluster_b,
        "cluster-b",
        &email,
        "wrong",
    )?;
    let refused = cluster_b
        .kubectl(&config_wrong)
        .output(&["get", "configmaps", "-n", &namespace], None)
        .await?;
    anyhow::ensure!(!refused.success, "a wrong password logged in: {}", refused.stdout);

    // The login's state is in a Secret with Pinniped's name prefix, labels and annotation (of
    // Selkie's own type: one Secret per login, where Pinniped writes one per token).
    let secrets: Value = serde_json::from_str(
        &kubectl
            .run(&[
                "get",
                "secrets",
                "-n",
                &namespace,
                "-l",
                "storage.pinniped.dev/type",
                "-o",
                "json",
            ])
            .await?,
    )?;
    let mut kinds: Vec<String> = Vec::new();
    for secret in secrets["items"].as_array().cloned().unwrap_or_default() {
        let kind = secret["metadata"]["labels"]["storage.pinniped.dev/type"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = secret["metadata"]["name"].as_str().unwrap_or_default();
        anyhow::ensure!(name.starts_with(&format!("pinniped-storage-{kind}-")), "{name}");
        let expected_type = match kind.as_str() {
            "login" => "storage.selkie.dev/login".to_string(),
            other => format!("storage.pinniped.dev/{other}"),
        };
        anyhow::ensure!(secret["type"] == expected_type.as_str(), "{secret}");
        anyhow::ensure!(
            secret["metadata"]["annotations"]["storage.pinniped.dev/garbage-collect-after"].is_string(),
            "{secret}"
        );
        kinds.push(kind);
    }
    anyhow::ensure!(
        !kinds.is_empty() && kinds.iter().all(|kind| kind == "login"),
        "storage Secrets of kinds {kinds:?}"
    );

    // `selkie logout` with cluster A's kubeconfig: the session leaves the cache and its refresh
    // token is revoked at the Supervisor, the cached cluster credentials go, and the next kubectl
    // call must log in again (cluster B's kubeconfig, with its wrong password, no longer gets in).
    let sessions_file = dir.path().join("sessions.yaml");
    let cached: Value = serde_yaml::from_str(&std::fs::read_to_string(&sessions_file)?)?;
    let refresh_token = cached["sessions"][0]["tokens"]["refresh"]["token"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no refresh token in the session cache"))?
        .to_string();
    let logout = tokio::process::Command::new(&selkie)
        .args(["logout", "--kubeconfig"])
        .arg(&config_a)
        .output()
        .await?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&logout.stdout),
        String::from_utf8_lossy(&logout.stderr),
    );
    anyhow::ensure!(
        logout.status.success()
            && stdout.starts_with(&format!(
                "logged out of {}: 1 session removed; 1 revoked at the issuer; ",
                supervisor.issuer()
            ))
            && stderr.is_empty(),
        "{stdout}{stderr}"
    );
    anyhow::ensure!(
        !stdout.contains("pin_") && !stderr.contains("pin_"),
        "a token was printed"
    );
    let cached: Value = serde_yaml::from_str(&std::fs::read_to_string(&sessions_file)?)?;
    anyhow::ensure!(
        cached["sessions"].as_array().is_none_or(Vec::is_empty),
        "{cached}"
    );
    let credentials: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.path().join("credentials.yaml"))?)?;
    anyhow::ensure!(
        credentials["credentials"].as_array().is_none_or(Vec::is_empty),
        "cluster credentials are still cached"
    );
    let refused = supervisor
        .client()?
        .send(
            http::Method::POST,
            &format!("{}/oauth2/token", supervisor.issuer()),
            &[(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-www-form-urlencoded"),
            )],
            bytes::Bytes::from(format!(
                "grant_type=refresh_token&client_id=pinniped-cli&refresh_token={refresh_token}"
            )),
            1 << 16,
            Some(Duration::from_secs(30)),
        )
        .await?;
    anyhow::ensure!(
        refused.status == 400 && String::from_utf8_lossy(&refused.body).contains("invalid_grant"),
        "the revoked refresh token still works: {}",
        refused.status
    );
    let left = kubectl
        .secret_names(&namespace, "storage.pinniped.dev/type")
        .await?;
    anyhow::ensure!(left.is_empty(), "storage Secrets left: {left:?}");
    let refused = cluster_b
        .kubectl(&config_b)
        .output(&["get", "configmaps", "-n", &namespace], None)
        .await?;
    anyhow::ensure!(!refused.success, "cluster B still got in after the logout");
    // Logging in again works — once any wait for the wrong passwords above is over (kubectl runs
    // a failing plugin more than once per command, so they were many).
    let user = selkie_e2e::eventually(Duration::from_secs(60), || whoami(&cluster_a, &config_a))
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "logging in again: {user}");
    anyhow::ensure!(supervisor.log().contains("Session Revoked"), "no audit event");

    // No password, token or code in the Supervisor's log.
    let log = supervisor.log();
    for secret in [PASSWORD, "pin_ac_", "pin_at_", "pin_rt_"] {
        anyhow::ensure!(!log.contains(secret), "the Supervisor logged {secret:?}");
    }
    supervisor.check_running()?;
    Ok(())
}

/// A `$BROWSER` script in `dir` that appends the URL it is given to `urls`.
pub(crate) fn recording_browser(dir: &Path, name: &str, urls: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$1\" >> '{}'\n", urls.display()),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// The first URL the exec plugin opened the browser at ([`recording_browser`] wrote it to
/// `urls`), within 60 s.
pub(crate) async fn opened_url(urls: &Path) -> anyhow::Result<String> {
    selkie_e2e::eventually(Duration::from_secs(60), || async {
        std::fs::read_to_string(urls)
            .ok()
            .and_then(|text| text.lines().next().map(str::to_string))
            .ok_or_else(|| anyhow::anyhow!("the plugin has not opened the browser"))
    })
    .await
}

/// Waits (30 s at most) until `browser` is on the CLI's loopback callback page saying the login
/// is done, loading the page again when a network change interrupted its load (as a user
/// would: the redirects before it, to the Supervisor's callback and on to the CLI, may be cut
/// off by one).
pub(crate) async fn cli_says_logged_in(browser: &selkie_e2e::browser::Browser) -> anyhow::Result<()> {
    let reloads = std::cell::Cell::new(0);
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let mut reloaded = reloads.get();
        browser.reload_if_interrupted(&mut reloaded).await?;
        reloads.set(reloaded);
        let at = browser.current_url().await?;
        let text = browser.body_text().await?;
        anyhow::ensure!(
            at.starts_with("http://127.0.0.1:") && text.contains("logged in"),
            "at {at}: {text}"
        );
        Ok(())
    })
    .await
}

/// The user's part of a browser login through the Supervisor, while the exec plugin waits: once
/// the plugin has opened the browser (the first URL [`recording_browser`] wrote to `urls`, within
/// 60 s) at `supervisor`'s authorize endpoint, `browser` goes there, through Dex's form as
/// `email`, back to the Supervisor's callback, whose form_post page hands the code to the CLI's
/// listener; returns the authorize URL once the CLI's page says "logged in" (within 30 s).
pub(crate) async fn browser_login(
    browser: &selkie_e2e::browser::Browser,
    urls: &Path,
    supervisor: &Supervisor,
    email: &str,
) -> anyhow::Result<String> {
    let url = opened_url(urls).await?;
    anyhow::ensure!(
        url.starts_with(&format!("{}/oauth2/authorize?", supervisor.issuer())),
        "{url}"
    );
    browser.dex_login(&url, email, PASSWORD).await?;
    cli_says_logged_in(browser).await?;
    Ok(url)
}

/// The browser flow: kubectl runs `selkie login oidc`, which opens the browser (Chromium) at the
/// Supervisor; the Supervisor sends it to Dex's login form, takes it back at its callback, and
/// hands the code to the CLI's loopback listener with its form_post page.
#[tokio::test]
async fn a_browser_login_goes_through_the_supervisor_and_dex() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let port = selkie_e2e::free_port()?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-browser", &["seals"], Some(port)).await?;
    grant_configmaps(cluster, &namespace, "User", &email).await?;
    let supervisor = Supervisor::start_on(cluster, &namespace, &dex, IDP_NAME, port).await?;
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-browser-")
        .tempdir()?;
    let urls = dir.path().join("browser-urls");
    let script = recording_browser(dir.path(), "browser.sh", &urls)?;

    let path = kubeconfig(
        dir.path(),
        "browser",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        &email,
        "unused",
    )?;
    // The same kubeconfig, with the browser flow and the recording $BROWSER.
    let mut config: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    config["users"][0]["user"]["exec"]["env"] = serde_yaml::to_value(json!([
        {"name": "PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "value": "browser_authcode"},
        {"name": "BROWSER", "value": script.display().to_string()},
    ]))?;
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;

    let browser = selkie_e2e::browser::Browser::start().await?;
    let login = async {
        let url = browser_login(&browser, &urls, &supervisor, &email).await?;
        for parameter in [
            "code_challenge_method=S256",
            "client_id=pinniped-cli",
            "pinniped_idp_name=Dex+Users",
            "response_mode=form_post",
        ] {
            anyhow::ensure!(url.contains(parameter), "{parameter} missing from {url}");
        }
        Ok(())
    };
    let (user, logged_in) = tokio::join!(whoami(&proxy, &path), login);
    logged_in.map_err(|e| crate::with_log(e, supervisor.log()))?;
    let user = user.map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");
    anyhow::ensure!(
        user["groups"]
            .as_array()
            .is_some_and(|groups| groups.iter().any(|g| g == "seals")),
        "{user}"
    );
    Ok(())
}

/// Runs `selkie login oidc` for `audience` against the Supervisor (no Concierge) with the
/// cli_password flow and `password`, the session cache in `dir`, and no credential cache.
pub(crate) async fn login(
    selkie: &Path,
    supervisor: &Supervisor,
    dir: &Path,
    audience: &str,
    email: &str,
    password: &str,
) -> anyhow::Result<(bool, String, String)> {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(selkie)
            .args([
                "login".to_string(),
                "oidc".into(),
                format!("--issuer={}", supervisor.issuer()),
                format!("--ca-bundle-data={}", B64.encode(supervisor.ca_pem())),
                format!("--request-audience={audience}"),
                format!("--upstream-identity-provider-name={IDP_NAME}"),
                format!("--session-cache={}", dir.join("sessions.yaml").display()),
                "--credential-cache=".into(),
            ])
            .env_remove("KUBERNETES_EXEC_INFO")
            .env("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "cli_password")
            .env("PINNIPED_USERNAME", email)
            .env("PINNIPED_PASSWORD", password)
            .env("BROWSER", "/bin/false")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("selkie login oidc did not exit within 60 s"))??;
    Ok((
        output.status.success(),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

/// The session cache's one session.
pub(crate) fn session(dir: &Path) -> anyhow::Result<serde_yaml::Value> {
    let file: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("sessions.yaml"))?)?;
    Ok(file["sessions"][0].clone())
}

/// Refresh: an expired session is refreshed through the Supervisor (which refreshes at Dex)
/// without a login; once the user is gone from Dex, the refresh fails and the CLI logs in again,
/// which fails with one clear line.
#[tokio::test]
async fn sessions_refresh_silently_until_the_user_is_gone_upstream() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-refresh").await?;
    let email = format!("{namespace}@example.com");
    let user = DexUser {
        email: email.clone(),
        password: PASSWORD.into(),
        user_id: format!("id-{namespace}"),
        groups: vec!["seals".into()],
    };
    let mut dex = Dex::start(std::slice::from_ref(&user)).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-refresh-")
        .tempdir()?;

    let (ok, stdout, stderr) = login(&selkie, &supervisor, dir.path(), "cluster-a", &email, PASSWORD).await?;
    anyhow::ensure!(ok, "first login: {stderr}\n{}", supervisor.log());
    anyhow::ensure!(stdout.contains("\"token\""), "{stdout}");
    let first_refresh = session(dir.path())?["tokens"]["refresh"]["token"].clone();

    // Expire the cached ID and access tokens: the next run must refresh (the wrong password
    // proves it does not log in).
    let path = dir.path().join("sessions.yaml");
    let mut file: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    file["sessions"][0]["tokens"]["id"]["expiryTimestamp"] = "2000-01-01T00:00:00Z".into();
    file["sessions"][0]["tokens"]["access"]["expiryTimestamp"] = "2000-01-01T00:00:00Z".into();
    std::fs::write(&path, serde_yaml::to_string(&file)?)?;
    let (ok, _, stderr) = login(&selkie, &supervisor, dir.path(), "cluster-a", &email, "wrong").await?;
    anyhow::ensure!(ok, "refresh: {stderr}\n{}", supervisor.log());
    let second_refresh = session(dir.path())?["tokens"]["refresh"]["token"].clone();
    anyhow::ensure!(
        second_refresh != first_refresh && second_refresh.as_str().is_some_and(|t| t.starts_with("pin_rt_")),
        "the refresh token was not rotated"
    );

    // The user is removed from Dex: the Supervisor's upstream refresh fails, so the session is
    // over and a login is needed — which the wrong password cannot do.
    dex.restart_with_users(&[DexUser {
        email: format!("other-{email}"),
        password: PASSWORD.into(),
        user_id: format!("other-{namespace}"),
        groups: Vec::new(),
    }])
    .await?;
    let mut file: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    file["sessions"][0]["tokens"]["id"]["expiryTimestamp"] = "2000-01-01T00:00:00Z".into();
    file["sessions"][0]["tokens"]["access"]["expiryTimestamp"] = "2000-01-01T00:00:00Z".into();
    std::fs::write(&path, serde_yaml::to_string(&file)?)?;
    let (ok, stdout, stderr) = login(&selkie, &supervisor, dir.path(), "cluster-a", &email, "wrong").await?;
    anyhow::ensure!(!ok && stdout.is_empty(), "a removed user got a token: {stdout}");
    // Besides pinniped's "Log in to <IdP>" banner, one error line.
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("selkie:"))
        .collect();
    anyhow::ensure!(errors.len() == 1, "expected one error line on stderr: {stderr}");
    anyhow::ensure!(
        errors[0].contains("did not accept the username or password"),
        "{stderr}"
    );
    // Even with the right password, the removed user cannot log in.
    let (ok, _, stderr) = login(&selkie, &supervisor, dir.path(), "cluster-a", &email, PASSWORD).await?;
    anyhow::ensure!(!ok, "a removed user logged in: {stderr}");
    Ok(())
}

/// A cluster of its own (under `dir`) whose kube-apiserver takes the tokens of `supervisor`'s
/// FederationDomain for `audience` directly (a structured `--authentication-config` with the
/// issuer as JWT issuer, the `username` and `groups` claims unprefixed): no Concierge.
pub(crate) async fn cluster_trusting(
    supervisor: &Supervisor,
    audience: &str,
    dir: &Path,
) -> anyhow::Result<Cluster> {
    let authentication = dir.join("authentication.yaml");
    let config = json!({
        "apiVersion": "apiserver.config.k8s.io/v1beta1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": {
                "url": supervisor.issuer(),
                "audiences": [audience],
                "certificateAuthority": supervisor.ca_pem(),
            },
            "claimMappings": {
                "username": {"claim": "username", "prefix": ""},
                "groups": {"claim": "groups", "prefix": ""},
            },
        }],
    });
    std::fs::write(&authentication, serde_yaml::to_string(&config)?)?;
    Ok(Cluster::builder()
        .dir(dir.join("cluster"))
        .apiserver_arg(format!("--authentication-config={}", authentication.display()))
        .start()
        .await?)
}

/// Supervisor + CLI without a Concierge: a kube-apiserver started with a structured
/// `--authentication-config` whose JWT issuer is the FederationDomain accepts the Supervisor's
/// token for its audience directly; a token for another audience is refused.
#[tokio::test]
async fn deployment_strategy_static_cluster_integration_a_kube_apiserver_with_the_supervisor_as_jwt_issuer_accepts_its_tokens(
) -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-static", &["seals"], None).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-static-")
        .tempdir()?;
    let static_cluster = cluster_trusting(&supervisor, "static-cluster", dir.path()).await?;
    let server_ca = static_cluster.pki().server_ca.cert_pem();

    // kubectl with `selkie login oidc --request-audience static-cluster` as its credential plugin.
    let kubeconfig = dir.path().join("static.kubeconfig");
    let exec = json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": selkie,
        "args": [
            "login", "oidc",
            format!("--issuer={}", supervisor.issuer()),
            format!("--ca-bundle-data={}", B64.encode(supervisor.ca_pem())),
            "--request-audience=static-cluster",
            format!("--upstream-identity-provider-name={IDP_NAME}"),
            format!("--session-cache={}", dir.path().join("sessions.yaml").display()),
            format!("--credential-cache={}", dir.path().join("credentials.yaml").display()),
        ],
        "env": [
            {"name": "PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "value": "cli_password"},
            {"name": "PINNIPED_USERNAME", "value": email},
            {"name": "PINNIPED_PASSWORD", "value": PASSWORD},
        ],
        "interactiveMode": "Never",
    }});
    write_kubeconfig_for_user(
        &kubeconfig,
        static_cluster.server_url(),
        &server_ca,
        "static",
        exec,
    )?;
    // kube-apiserver fetches the issuer's keys in the background after it starts: poll.
    let kubectl = static_cluster.kubectl().with_kubeconfig(&kubeconfig);
    let user = selkie_e2e::eventually(Duration::from_secs(60), || async {
        let out = kubectl.run(&["auth", "whoami", "-o", "json"]).await?;
        Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");
    anyhow::ensure!(
        user["groups"]
            .as_array()
            .is_some_and(|groups| groups.iter().any(|g| g == "seals")),
        "{user}"
    );

    // A token the Supervisor issued for another audience is refused by this cluster.
    let other = tempfile::Builder::new()
        .prefix("selkie-supervisor-other-")
        .tempdir()?;
    let (ok, stdout, stderr) =
        login(&selkie, &supervisor, other.path(), "cluster-a", &email, PASSWORD).await?;
    anyhow::ensure!(ok, "{stderr}");
    let credential: Value = serde_json::from_str(&stdout)?;
    let token = credential["status"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(!token.is_empty(), "{stdout}");
    let token_kubeconfig = dir.path().join("token.kubeconfig");
    write_kubeconfig_for_user(
        &token_kubeconfig,
        static_cluster.server_url(),
        &server_ca,
        "token",
        json!({"token": token}),
    )?;
    let refused = static_cluster
        .kubectl()
        .with_kubeconfig(&token_kubeconfig)
        .output(&["auth", "whoami"], None)
        .await?;
    anyhow::ensure!(
        !refused.success && refused.stderr.contains("Unauthorized"),
        "{}: {}",
        refused.stdout,
        refused.stderr
    );
    Ok(())
}
