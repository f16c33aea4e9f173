//! LDAP logins through the Selkie Supervisor, on real components: OpenLDAP (slapd) → the
//! Supervisor (a FederationDomain with an LDAPIdentityProvider) → an impersonation proxy with a
//! JWTAuthenticator for the FederationDomain → the real kube-apiserver, with the real kubectl
//! running `selkie login oidc` as its exec credential plugin.
//!
//! * `cli_password`: the plugin picks it for an `ldap` identity provider by itself and reads the
//!   username and password from `PINNIPED_USERNAME` / `PINNIPED_PASSWORD`;
//! * the browser: headless Chromium on the Supervisor's own login page (no script on it), where a
//!   wrong password and an unknown user get the same message;
//! * refresh: a user moved out of a group loses it at the next refresh, a deleted user's refresh
//!   is refused.

use std::{path::Path, time::Duration};

use selkie_e2e::{
    ldap::{LdapUser, Slapd, GROUPS_BASE, USERS_BASE},
    proxy::Proxy,
    supervisor::Supervisor,
    Cluster,
};
use serde_json::Value;

use crate::{
    proxy_kubectl::grant_configmaps,
    supervisor_login::{
        cli_says_logged_in, opened_url, plugin_kubeconfig, recording_browser, supervisor_jwt, whoami,
    },
};

const IDP_NAME: &str = "Corp LDAP";
const PINNY_PASSWORD: &str = "seal-of-approval";
const WALRUS_PASSWORD: &str = "tusks and (all)*";

/// `selkie get kubeconfig --no-concierge` for `supervisor`'s issuer (its CA from a file), with
/// `extra` arguments: the process's output.
pub(crate) async fn get_kubeconfig(
    selkie: &Path,
    cluster: &Cluster,
    supervisor: &Supervisor,
    extra: &[String],
) -> anyhow::Result<std::process::Output> {
    let ca_file = tempfile::NamedTempFile::new()?;
    std::fs::write(ca_file.path(), supervisor.ca_pem())?;
    let mut args = vec![
        "get".to_string(),
        "kubeconfig".into(),
        format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
        "--no-concierge".into(),
        format!("--oidc-issuer={}", supervisor.issuer()),
        format!("--oidc-ca-bundle={}", ca_file.path().display()),
    ];
    args.extend(extra.iter().cloned());
    Ok(tokio::process::Command::new(selkie)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?)
}

/// Fails unless `output` is a successful `selkie get kubeconfig` whose exec plugin logs in at the
/// LDAP identity provider `idp_name` with the `cli_password` flow.
pub(crate) fn ensure_ldap_password_flow(output: &std::process::Output, idp_name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        output.status.success(),
        "selkie get kubeconfig: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let generated: serde_yaml::Value = serde_yaml::from_slice(&output.stdout)?;
    let args = serde_json::to_value(&generated["users"][0]["user"]["exec"]["args"])?.to_string();
    for expected in [
        format!("--upstream-identity-provider-name={idp_name}"),
        "--upstream-identity-provider-type=ldap".into(),
        "--upstream-identity-provider-flow=cli_password".into(),
    ] {
        anyhow::ensure!(args.contains(&expected), "{expected} missing from {args}");
    }
    Ok(())
}

/// Marks the session cache's ID and access tokens expired and drops the credential cache, so
/// the plugin's next run must refresh at the Supervisor.
pub(crate) fn expire_cached_tokens(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("sessions.yaml");
    let mut file: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    file["sessions"][0]["tokens"]["id"]["expiryTimestamp"] = "2000-01-01T00:00:00Z".into();
    file["sessions"][0]["tokens"]["access"]["expiryTimestamp"] = "2000-01-01T00:00:00Z".into();
    std::fs::write(&path, serde_yaml::to_string(&file)?)?;
    match std::fs::remove_file(dir.join("credentials.yaml")) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error.into()),
        _ => Ok(()),
    }
}

/// The groups of `kubectl auth whoami`'s user, without the `system:authenticated` every
/// authenticated user has.
pub(crate) fn groups(user: &Value) -> Vec<&str> {
    user["groups"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .filter_map(Value::as_str)
                .filter(|group| *group != "system:authenticated")
                .collect()
        })
        .unwrap_or_default()
}

/// A login on the Supervisor's login page without a browser: starts a browser-flow login at
/// `authorize` (no password headers: the Supervisor sends the browser to `<issuer>/login` with
/// a sealed state and a CSRF cookie), then posts `username` and `password` with them. Returns
/// where the Supervisor sends the browser next: the login page again with `err=…`, or the
/// client's redirect URI with a code.
async fn login_page_post(
    http: &selkie_oidc::https::HttpsClient,
    authorize: &str,
    issuer: &str,
    username: &str,
    password: &str,
) -> anyhow::Result<String> {
    let started = selkie_e2e::pinniped_cli::get(http, authorize, None, "").await?;
    anyhow::ensure!(started.status == 303, "{}: {:?}", started.status, started.body);
    let location = started.headers[http::header::LOCATION].to_str()?;
    let query = location
        .strip_prefix(&format!("{issuer}/login?"))
        .ok_or_else(|| anyhow::anyhow!("not sent to the login page: {location}"))?;
    let state = form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "state")
        .map(|(_, state)| state.into_owned())
        .ok_or_else(|| anyhow::anyhow!("no state: {location}"))?;
    let cookie = started
        .headers
        .get(http::header::SET_COOKIE)
        .ok_or_else(|| anyhow::anyhow!("no CSRF cookie"))?
        .to_str()?
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("state", &state)
        .append_pair("username", username)
        .append_pair("password", password)
        .finish();
    let posted = http
        .send(
            http::Method::POST,
            &format!("{issuer}/login"),
            &[
                (http::header::COOKIE, http::HeaderValue::from_str(&cookie)?),
                (
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-www-form-urlencoded"),
                ),
            ],
            bytes::Bytes::from(form),
            1 << 20,
            Some(Duration::from_secs(30)),
        )
        .await?;
    anyhow::ensure!(posted.status == 303, "{}: {:?}", posted.status, posted.body);
    Ok(posted.headers[http::header::LOCATION].to_str()?.to_string())
}

#[tokio::test]
async fn ldap_users_log_in_from_the_cli_and_the_login_page_and_are_checked_at_every_refresh(
) -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-ldap-login").await?;
    let slapd = Slapd::start(&[
        LdapUser {
            uid: "pinny".into(),
            password: PINNY_PASSWORD.into(),
            uid_number: 1001,
            groups: vec!["seals".into(), "ops".into()],
        },
        LdapUser {
            uid: "walrus".into(),
            password: WALRUS_PASSWORD.into(),
            uid_number: 1002,
            groups: vec!["ops".into()],
        },
    ])
    .await?;
    grant_configmaps(cluster, &namespace, "Group", "ops").await?;
    let supervisor = Supervisor::start(cluster, &namespace, &slapd, IDP_NAME).await?;
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;
    cluster
        .kubectl()
        .run(&[
            "wait",
            "-n",
            &namespace,
            "--timeout=60s",
            "--for=jsonpath={.status.phase}=Ready",
            "ldapidentityprovider/openldap",
        ])
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;

    // The identity-provider discovery offers the password flow first, then the browser.
    let discovery: Value = serde_json::from_slice(
        &supervisor
            .client()?
            .get_json(
                &format!("{}/v1alpha1/pinniped_identity_providers", supervisor.issuer()),
                64 * 1024,
                None,
            )
            .await?,
    )?;
    anyhow::ensure!(
        discovery["pinniped_identity_providers"]
            == serde_json::json!([{"name": IDP_NAME, "type": "ldap", "flows": ["cli_password", "browser_authcode"], "sessions": {"max_lifetime": "9h"}}]),
        "{discovery}"
    );

    // `selkie get kubeconfig` finds the provider and writes its type and first flow.
    let output = get_kubeconfig(&selkie, cluster, &supervisor, &[]).await?;
    ensure_ldap_password_flow(&output, IDP_NAME)?;

    // cli_password, chosen by the plugin for an `ldap` provider, from the environment.
    let dir = tempfile::Builder::new().prefix("selkie-ldap-cli-").tempdir()?;
    let pinny = plugin_kubeconfig(
        dir.path(),
        "pinny",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        (IDP_NAME, "ldap"),
        &[
            ("PINNIPED_USERNAME", "pinny"),
            ("PINNIPED_PASSWORD", PINNY_PASSWORD),
        ],
    )?;
    let user = whoami(&proxy, &pinny)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == "pinny", "{user}");
    anyhow::ensure!(groups(&user) == ["ops", "seals"], "{user}");
    proxy
        .kubectl(&pinny)
        .run(&["get", "configmaps", "-n", &namespace])
        .await?;

    // Many logins at once (more than the directory's connection pool holds): every one works.
    let http = supervisor.client()?;
    let logins = (0..48).map(|_| {
        selkie_e2e::pinniped_cli::login(&http, supervisor.issuer(), IDP_NAME, "pinny", PINNY_PASSWORD)
    });
    for tokens in futures::future::try_join_all(logins).await? {
        let claims = selkie_e2e::pinniped_cli::jwt_claims(tokens["id_token"].as_str().unwrap_or_default())?;
        anyhow::ensure!(claims["username"] == "pinny", "{claims}");
    }

    // A wrong password: the plugin fails with the Supervisor's reason.
    let wrong_dir = tempfile::Builder::new().prefix("selkie-ldap-wrong-").tempdir()?;
    let wrong = plugin_kubeconfig(
        wrong_dir.path(),
        "wrong",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        (IDP_NAME, "ldap"),
        &[
            ("PINNIPED_USERNAME", "pinny"),
            ("PINNIPED_PASSWORD", "not-the-password"),
        ],
    )?;
    let refused = whoami(&proxy, &wrong).await;
    anyhow::ensure!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("Username/password not accepted by LDAP provider")),
        "{refused:?}"
    );

    // Refresh: moved out of "ops", pinny loses the group (and the access it gave) at the next
    // refresh, without logging in again.
    slapd
        .modify(&format!(
            "dn: cn=ops,{GROUPS_BASE}\nchangetype: modify\ndelete: member\nmember: uid=pinny,{USERS_BASE}\n"
        ))
        .await?;
    expire_cached_tokens(dir.path())?;
    let user = whoami(&proxy, &pinny)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(groups(&user) == ["seals"], "after the refresh: {user}");
    let forbidden = proxy
        .kubectl(&pinny)
        .run(&["get", "configmaps", "-n", &namespace])
        .await;
    anyhow::ensure!(
        forbidden
            .as_ref()
            .is_err_and(|e| e.to_string().contains("Forbidden") || e.to_string().contains("forbidden")),
        "{forbidden:?}"
    );

    // The browser: the Supervisor's login page, in Chromium.
    let browser_dir = tempfile::Builder::new()
        .prefix("selkie-ldap-browser-")
        .tempdir()?;
    let urls = browser_dir.path().join("browser-urls");
    let script = recording_browser(browser_dir.path(), "browser.sh", &urls)?;
    let script = script.display().to_string();
    let walrus = plugin_kubeconfig(
        browser_dir.path(),
        "walrus",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        (IDP_NAME, "ldap"),
        &[
            ("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "browser_authcode"),
            ("BROWSER", &script),
        ],
    )?;
    let browser = selkie_e2e::browser::Browser::start().await?;
    let login = async {
        let url = opened_url(&urls).await?;
        browser.goto(&url).await?;
        let page = browser.current_url().await?;
        anyhow::ensure!(
            page.starts_with(&format!("{}/login?state=", supervisor.issuer())),
            "not on the login page: {page}"
        );
        anyhow::ensure!(
            browser
                .body_text()
                .await?
                .contains(&format!("Log in to {IDP_NAME}")),
            "{}",
            browser.body_text().await?
        );
        // A wrong password, an unknown user and a filter pattern: the same page, the same
        // message, nothing more.
        let mut pages = Vec::new();
        for (username, password) in [
            ("walrus", "wrong"),
            ("nobody", WALRUS_PASSWORD),
            ("*", WALRUS_PASSWORD),
        ] {
            browser.goto(&page).await?;
            browser.type_into("#username", username).await?;
            browser.type_into("#password", password).await?;
            browser.click("#submit").await?;
            let text = selkie_e2e::eventually(Duration::from_secs(20), || async {
                let at = browser.current_url().await?;
                anyhow::ensure!(
                    at.contains("err=incorrect_username_or_password"),
                    "{username}: at {at}"
                );
                Ok(browser.body_text().await?)
            })
            .await?;
            anyhow::ensure!(
                text.contains("Incorrect username or password."),
                "{username}: {text}"
            );
            pages.push(text);
        }
        anyhow::ensure!(pages.iter().all(|text| *text == pages[0]), "{pages:?}");
        browser.type_into("#username", "walrus").await?;
        browser.type_into("#password", WALRUS_PASSWORD).await?;
        browser.click("#submit").await?;
        cli_says_logged_in(&browser).await
    };
    let (user, logged_in) = tokio::join!(whoami(&proxy, &walrus), login);
    logged_in.map_err(|e| crate::with_log(e, supervisor.log()))?;
    let user = user.map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == "walrus", "{user}");
    anyhow::ensure!(groups(&user) == ["ops"], "{user}");

    // Password guessing is slowed down: after ten wrong passwords in a row, each further one
    // makes the account wait (1 s, 2 s, 4 s, 8 s …) before the Supervisor asks the directory
    // again — even the right password is refused meanwhile, saying how long to wait — and then
    // the right one logs in. The account is walrus's entry, whatever spelling slapd resolves to
    // it (`uid` matches ignoring case and leading, trailing and repeated spaces): failures typed
    // as " walrus" or "WALRUS  " on the login page count with the CLI's "walrus", and while
    // walrus waits no spelling reaches the directory, not even with the right password.
    let http = supervisor.client()?;
    let (base, path) = selkie_e2e::pinniped_cli::split_issuer(supervisor.issuer());
    let authorize = selkie_e2e::pinniped_cli::authorize_url(
        &base,
        &path,
        &["pinniped_idp_name"],
        &[("pinniped_idp_name", IDP_NAME)],
    );
    let attempt = |username: &'static str, password: &'static str| {
        let (http, authorize) = (http.clone(), authorize.clone());
        async move {
            let response = selkie_e2e::pinniped_cli::get(&http, &authorize, Some(password), username).await?;
            selkie_e2e::pinniped_cli::redirected(&response)
        }
    };
    let login_page = |username: &'static str, password: &'static str| {
        let (http, authorize) = (http.clone(), authorize.clone());
        let issuer = supervisor.issuer().to_string();
        async move { login_page_post(&http, &authorize, &issuer, username, password).await }
    };
    let wrong_password_checked = |username: &'static str, on_page: bool| async move {
        if on_page {
            let location = login_page(username, "not-the-password").await?;
            anyhow::ensure!(
                location.contains("err=incorrect_username_or_password"),
                "{username:?}: {location}"
            );
        } else {
            let params = attempt(username, "not-the-password").await?;
            anyhow::ensure!(
                selkie_e2e::pinniped_cli::param(&params, "error_description")
                    .is_some_and(|d| d.contains("Username/password not accepted by LDAP provider")),
                "{username:?}: {params:?}"
            );
        }
        Ok(())
    };
    // Eleven failures in four spellings: counted as one account's, the eleventh makes it wait.
    let spellings = [
        ("walrus", false),
        (" walrus", true),
        ("WALRUS", false),
        ("walrus  ", true),
    ];
    for n in 0..11 {
        let (username, on_page) = spellings[n % spellings.len()];
        wrong_password_checked(username, on_page).await?;
    }
    let wait_refusal = |params: &[(String, String)]| -> Option<u64> {
        let description = selkie_e2e::pinniped_cli::param(params, "error_description")?;
        (selkie_e2e::pinniped_cli::param(params, "error") == Some("access_denied")).then_some(())?;
        description
            .split_once("Reason: too many failed logins for this username; try again in ")
            .and_then(|(_, rest)| rest.strip_suffix(" seconds."))
            .and_then(|seconds| seconds.parse().ok())
    };
    let params = attempt("walrus", "not-the-password").await?;
    anyhow::ensure!(
        wait_refusal(&params).is_some(),
        "eleven failures in several spellings did not make walrus wait: {params:?}"
    );
    // Three more failures, each once the wait is over.
    for _ in 0..3 {
        selkie_e2e::eventually(Duration::from_secs(20), || {
            wrong_password_checked("walrus", false)
        })
        .await?;
    }
    let params = attempt("walrus", WALRUS_PASSWORD).await?;
    let wait = wait_refusal(&params)
        .ok_or_else(|| anyhow::anyhow!("the right password was checked while walrus waits: {params:?}"))?;
    anyhow::ensure!((1..=8).contains(&wait), "{params:?}");
    // Meanwhile every other spelling, the right password with it, is refused unchecked: on the
    // login page (which keeps spaces) and in the CLI's headers.
    for username in [" walrus", "walrus ", "  WALRUS  ", "Walrus"] {
        let location = login_page(username, WALRUS_PASSWORD).await?;
        anyhow::ensure!(
            location.contains("err=too_many_failures"),
            "{username:?} reached the directory while walrus waits: {location}"
        );
    }
    let params = attempt("WALRUS", WALRUS_PASSWORD).await?;
    anyhow::ensure!(
        wait_refusal(&params).is_some(),
        "\"WALRUS\" reached the directory while walrus waits: {params:?}"
    );
    selkie_e2e::eventually(Duration::from_secs(20), || async {
        let params = attempt("walrus", WALRUS_PASSWORD).await?;
        anyhow::ensure!(
            selkie_e2e::pinniped_cli::param(&params, "code").is_some(),
            "{params:?}"
        );
        Ok(())
    })
    .await?;
    // Those spellings are walrus to slapd: once the wait is over, one logs in.
    let location = login_page(" walrus", WALRUS_PASSWORD).await?;
    anyhow::ensure!(
        location.starts_with(&format!("{}?", selkie_e2e::pinniped_cli::REDIRECT))
            && location.contains("code="),
        "\" walrus\" did not log in as walrus: {location}"
    );

    // Deleted from the directory: pinny's next refresh is refused, and the password no longer
    // logs in.
    slapd
        .modify(&format!("dn: uid=pinny,{USERS_BASE}\nchangetype: delete\n"))
        .await?;
    expire_cached_tokens(dir.path())?;
    let gone = whoami(&proxy, &pinny).await;
    anyhow::ensure!(
        gone.as_ref()
            .is_err_and(|e| format!("{e:#}").contains("Username/password not accepted by LDAP provider")),
        "{gone:?}"
    );
    let log = supervisor.log();
    anyhow::ensure!(
        log.contains("upstream refresh refused"),
        "the refresh was not refused: {log}"
    );
    for secret in [PINNY_PASSWORD, WALRUS_PASSWORD, "not-the-password"] {
        anyhow::ensure!(!log.contains(secret), "the Supervisor logged {secret:?}");
    }
    // Audit events, Pinniped's names; usernames and groups redacted by default.
    let events = |name: &str| -> Vec<&str> {
        log.lines()
            .filter(|line| line.contains(&format!("\"message\":\"{name}\"")))
            .collect()
    };
    let started = events("Session Started");
    anyhow::ensure!(started.len() >= 2, "no Session Started events: {log}");
    anyhow::ensure!(
        !events("Session Refreshed").is_empty() && !events("Incorrect Username Or Password").is_empty(),
        "missing audit events: {log}"
    );
    anyhow::ensure!(
        !events("Too Many Failed Passwords").is_empty(),
        "no Too Many Failed Passwords event: {log}"
    );
    for line in started
        .iter()
        .chain(&events("Incorrect Username Or Password"))
        .chain(&events("Too Many Failed Passwords"))
    {
        anyhow::ensure!(
            line.contains("redacted") && !line.contains("pinny") && !line.contains("walrus"),
            "an audit event names the user: {line}"
        );
    }
    Ok(())
}
