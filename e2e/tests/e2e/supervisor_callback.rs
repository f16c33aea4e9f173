//! The browser flow's callback under attack and failure, on real components (the Supervisor and
//! Dex): a callback without the login's CSRF cookie — or with another login's — is refused; an
//! upstream error or a code the upstream refuses goes back to the client as an OAuth error with
//! the client's state; an unreachable upstream is reported as such (`temporarily_unavailable`),
//! never as a wrong password; no code, cookie or password reaches the log.

use std::time::Duration;

use bytes::Bytes;
use selkie_e2e::{dex::Dex, supervisor::Supervisor};
use selkie_oidc::https::{HttpsClient, Response};

use crate::{
    supervisor_oauth::{
        authorize_url, dex_user_namespace, get, param, redirected, DexUserNamespace, IDP_NAME, PASSWORD,
    },
    supervisor_sessions::split,
};

/// GET `url` with the `Cookie` header `cookie`, if any.
async fn get_with_cookie(http: &HttpsClient, url: &str, cookie: Option<&str>) -> anyhow::Result<Response> {
    let headers: Vec<_> = cookie
        .map(|cookie| -> anyhow::Result<_> {
            Ok((http::header::COOKIE, http::HeaderValue::from_str(cookie)?))
        })
        .transpose()?
        .into_iter()
        .collect();
    Ok(http
        .send(
            http::Method::GET,
            url,
            &headers,
            Bytes::new(),
            1 << 20,
            Some(Duration::from_secs(30)),
        )
        .await?)
}

/// Starts a browser login: the sealed upstream state the Supervisor sends to Dex, and its CSRF
/// cookie (`name=value`).
async fn start_login(http: &HttpsClient, url: &str, dex: &Dex) -> anyhow::Result<(String, String)> {
    let response = get_with_cookie(http, url, None).await?;
    anyhow::ensure!(response.status == 303, "{}: {:?}", response.status, response.body);
    let location = response.headers[http::header::LOCATION].to_str()?;
    let query = location
        .strip_prefix(&format!("{}/auth?", dex.issuer()))
        .ok_or_else(|| anyhow::anyhow!("not sent to Dex: {location}"))?;
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let state = param(&params, "state")
        .ok_or_else(|| anyhow::anyhow!("no state: {location}"))?
        .to_string();
    let cookie = response
        .headers
        .get(http::header::SET_COOKIE)
        .ok_or_else(|| anyhow::anyhow!("no CSRF cookie"))?
        .to_str()?
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(cookie.starts_with("__Host-pinniped-csrf-v2="), "{cookie}");
    Ok((state, cookie))
}

#[tokio::test]
async fn the_callback_refuses_foreign_csrf_cookies_and_reports_upstream_failures() -> anyhow::Result<()> {
    let port = selkie_e2e::free_port()?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-callback", &[], Some(port)).await?;
    let callback_url = format!("{}/callback", Supervisor::issuer_for(port, &namespace));
    let supervisor = Supervisor::start_on(cluster, &namespace, &dex, IDP_NAME, port).await?;
    let http = supervisor.client()?;
    let (base, path) = split(supervisor.issuer());
    let authorize = authorize_url(&base, &path, &[], &[]);

    let (state, cookie) = start_login(&http, &authorize, &dex).await?;
    let (_, other_cookie) = start_login(&http, &authorize, &dex).await?;
    anyhow::ensure!(cookie != other_cookie, "two logins share a CSRF value");
    let state_query = form_urlencoded::Serializer::new(String::new())
        .append_pair("state", &state)
        .finish();
    let code_callback = format!("{callback_url}?code=bogus-upstream-code&{state_query}");

    // No cookie, or another login's: refused outright, nothing redeemed upstream.
    for cookie in [None, Some(other_cookie.as_str())] {
        let response = get_with_cookie(&http, &code_callback, cookie).await?;
        let body = String::from_utf8_lossy(&response.body);
        anyhow::ensure!(
            response.status == 403 && body.contains("CSRF"),
            "{cookie:?}: {} {body}",
            response.status
        );
    }

    // The upstream said no: back to the client with access_denied and its own state.
    let denied =
        format!("{callback_url}?error=access_denied&error_description=the+user+said+no&{state_query}");
    let params = redirected(&get_with_cookie(&http, &denied, Some(&cookie)).await?)?;
    anyhow::ensure!(
        param(&params, "error") == Some("access_denied")
            && param(&params, "state") == Some("state-0123456789")
            && param(&params, "code").is_none(),
        "{params:?}"
    );

    // A code Dex does not know: refused upstream, reported as such.
    let params = redirected(&get_with_cookie(&http, &code_callback, Some(&cookie)).await?)?;
    anyhow::ensure!(
        param(&params, "error") == Some("access_denied")
            && param(&params, "error_description")
                .is_some_and(|d| d.contains("did not accept the authorization code")),
        "{params:?}"
    );

    // The identity provider is pointed at an issuer that does not answer: its status says so,
    // naming the issuer, and the working upstream keeps serving logins meanwhile; pointed back,
    // it is discovered again.
    let kubectl = cluster.kubectl();
    let unreachable = format!("https://127.0.0.1:{}/nobody", selkie_e2e::free_port()?);
    let set_issuer = |issuer: String| {
        let kubectl = kubectl.clone();
        let namespace = namespace.clone();
        async move {
            let patch = serde_json::json!({"spec": {"issuer": issuer}}).to_string();
            kubectl
                .run(&[
                    "-n",
                    &namespace,
                    "patch",
                    "oidcidentityprovider",
                    "dex",
                    "--type=merge",
                    "-p",
                    &patch,
                ])
                .await
        }
    };
    let discovery_condition = || async {
        let idp: serde_json::Value = serde_json::from_str(
            &kubectl
                .run(&[
                    "-n",
                    &namespace,
                    "get",
                    "oidcidentityprovider",
                    "dex",
                    "-o",
                    "json",
                ])
                .await?,
        )?;
        let condition = selkie_e2e::crds::condition(&idp, "OIDCDiscoverySucceeded").clone();
        anyhow::Ok((idp, condition))
    };
    set_issuer(unreachable.clone()).await?;
    let (idp, condition) = crate::eventually(Duration::from_secs(30), || async {
        let (idp, condition) = discovery_condition().await?;
        anyhow::ensure!(condition["status"] == "False", "{condition}");
        Ok((idp, condition))
    })
    .await?;
    anyhow::ensure!(
        condition["reason"] == "Unreachable"
            && condition["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&format!(
                    "failed to perform OIDC discovery against {unreachable:?}"
                ))),
        "{condition}"
    );
    anyhow::ensure!(idp["status"]["phase"] == "Error", "{idp}");
    let params = redirected(&get(&http, &authorize, Some(PASSWORD), &email).await?)?;
    anyhow::ensure!(
        param(&params, "code").is_some(),
        "the working upstream stopped serving: {params:?}"
    );
    set_issuer(dex.issuer().to_string()).await?;
    crate::eventually(Duration::from_secs(30), || async {
        let (idp, condition) = discovery_condition().await?;
        anyhow::ensure!(
            condition["status"] == "True" && idp["status"]["phase"] == "Ready",
            "{idp}"
        );
        Ok(())
    })
    .await?;

    // Dex goes away: the same steps now fail as unreachable — not as a wrong password.
    drop(dex);
    let params = redirected(&get_with_cookie(&http, &code_callback, Some(&cookie)).await?)?;
    anyhow::ensure!(
        param(&params, "error") == Some("temporarily_unavailable")
            && param(&params, "error_description").is_some_and(|d| d.contains("could not be reached")),
        "{params:?}"
    );
    let params = redirected(&get(&http, &authorize, Some(PASSWORD), &email).await?)?;
    anyhow::ensure!(
        param(&params, "error") == Some("temporarily_unavailable")
            && param(&params, "error_description").is_some_and(|d| d.contains("could not be reached")),
        "{params:?}"
    );

    // Discovery still answers: the Supervisor carries on.
    let response = get(
        &http,
        &format!("{}/.well-known/openid-configuration", supervisor.issuer()),
        None,
        &email,
    )
    .await?;
    anyhow::ensure!(response.status == 200, "{}", response.status);

    let log = supervisor.log();
    let cookie_value = cookie.split_once('=').map(|(_, v)| v).unwrap_or_default();
    for secret in ["bogus-upstream-code", PASSWORD, cookie_value] {
        anyhow::ensure!(!log.contains(secret), "a secret is in the Supervisor's log");
    }
    Ok(())
}
