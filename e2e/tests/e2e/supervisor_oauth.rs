//! The Supervisor's OAuth 2.0 endpoints spoken to directly, as any client could: two replicas
//! sharing one kube-apiserver (a login started on one finishes on the other), single-use codes
//! whose replay revokes what they gave, rotating refresh tokens, the token exchange's audience
//! rules, and bad authorization requests answered with OAuth errors — never a panic, never a
//! secret in the log.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
// The CLI's side of the OAuth endpoints lives in the harness; the other Supervisor tests import
// it from here as well.
pub(crate) use selkie_e2e::pinniped_cli::{
    authorize_url, exchange, get, param, redirected, token, IDP_DISPLAY_NAME as IDP_NAME, REDIRECT, VERIFIER,
};
use selkie_e2e::{
    dex::{Dex, DexUser},
    pinniped_cli,
    supervisor::Supervisor,
    Cluster,
};
use serde_json::Value;

pub(crate) const PASSWORD: &str = "seal-of-approval";

/// What most Supervisor tests start from: a fresh namespace `<prefix>-…` of the shared cluster,
/// its user `<namespace>@example.com` (password [`PASSWORD`], id `id-<namespace>`, in `groups`)
/// and a Dex holding that user — which, given `browser_port`, also accepts the callback of a
/// Supervisor started on that port ([`Supervisor::start_on`]) for browser logins.
pub(crate) struct DexUserNamespace {
    pub(crate) cluster: &'static Cluster,
    pub(crate) client: kube::Client,
    pub(crate) namespace: String,
    pub(crate) email: String,
    pub(crate) dex: Dex,
}

/// Sets up a [`DexUserNamespace`].
pub(crate) async fn dex_user_namespace(
    prefix: &str,
    groups: &[&str],
    browser_port: Option<u16>,
) -> anyhow::Result<DexUserNamespace> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, prefix).await?;
    let email = format!("{namespace}@example.com");
    let callbacks: Vec<String> = browser_port
        .map(|port| format!("{}/callback", Supervisor::issuer_for(port, &namespace)))
        .into_iter()
        .collect();
    let dex = Dex::start_with_redirects(
        &[DexUser {
            email: email.clone(),
            password: PASSWORD.into(),
            user_id: format!("id-{namespace}"),
            groups: groups.iter().map(|group| group.to_string()).collect(),
        }],
        &callbacks,
    )
    .await?;
    Ok(DexUserNamespace {
        cluster,
        client,
        namespace,
        email,
        dex,
    })
}

#[tokio::test]
async fn codes_tokens_and_bad_requests_across_two_replicas() -> anyhow::Result<()> {
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-oauth", &["seals"], None).await?;
    let mut supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let second_port = supervisor.add_replica().await?;
    let http = supervisor.client()?;
    let (first, path) = pinniped_cli::split_issuer(supervisor.issuer());
    let second = format!("https://127.0.0.1:{second_port}");

    // Authorize on the first replica (cli_password), redeem on the second.
    let response = get(
        &http,
        &authorize_url(&first, &path, &[], &[]),
        Some(PASSWORD),
        &email,
    )
    .await?;
    let params = redirected(&response)?;
    anyhow::ensure!(param(&params, "state") == Some("state-0123456789"), "{params:?}");
    let code = param(&params, "code")
        .ok_or_else(|| anyhow::anyhow!("no code: {params:?}"))?
        .to_string();
    anyhow::ensure!(code.starts_with("pin_ac_"), "{code}");
    let redeem = [
        ("grant_type", "authorization_code"),
        ("client_id", "pinniped-cli"),
        ("code", code.as_str()),
        ("redirect_uri", REDIRECT),
        ("code_verifier", VERIFIER),
    ];
    let (status, tokens) = token(&http, &format!("{second}{path}/oauth2/token"), &redeem).await?;
    anyhow::ensure!(status == 200, "{status}: {tokens}");
    let access = tokens["access_token"].as_str().unwrap_or_default().to_string();
    let refresh = tokens["refresh_token"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(
        access.starts_with("pin_at_") && refresh.starts_with("pin_rt_"),
        "{tokens}"
    );
    let id_claims: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD.decode(
            tokens["id_token"]
                .as_str()
                .unwrap_or_default()
                .split('.')
                .nth(1)
                .unwrap_or_default(),
        )?,
    )?;
    anyhow::ensure!(
        id_claims["nonce"] == "nonce-0123456789" && id_claims["username"] == email.as_str(),
        "{id_claims}"
    );
    anyhow::ensure!(
        id_claims["sub"]
            .as_str()
            .is_some_and(|sub| sub.starts_with(&format!("{}?idpName=Dex+Users&sub=", dex.issuer()))),
        "{id_claims}"
    );

    // Token exchange on the first replica, with Pinniped's audience rules.
    let exchange_at = |base: String, audience: &str, subject: &str| {
        let (http, url) = (http.clone(), format!("{base}{path}/oauth2/token"));
        let (audience, subject) = (audience.to_string(), subject.to_string());
        async move { exchange(&http, &url, &audience, &subject).await }
    };
    let (status, exchanged) = exchange_at(first.clone(), "cluster-a", &access).await?;
    anyhow::ensure!(
        status == 200 && exchanged["token_type"] == "N_A",
        "{status}: {exchanged}"
    );
    for forbidden in [
        "something.pinniped.dev",
        "pinniped-cli",
        "client.oauth.pinniped.dev-x",
    ] {
        let (status, error) = exchange_at(first.clone(), forbidden, &access).await?;
        anyhow::ensure!(
            status == 400 && error["error"] == "invalid_request",
            "{forbidden}: {status} {error}"
        );
    }

    // The code again, on either replica: refused, and the tokens it gave are revoked.
    let (status, error) = token(&http, &format!("{first}{path}/oauth2/token"), &redeem).await?;
    anyhow::ensure!(
        status == 400 && error["error"] == "invalid_grant",
        "replay: {status} {error}"
    );
    anyhow::ensure!(
        error["error_description"]
            .as_str()
            .unwrap_or_default()
            .contains("already been used"),
        "{error}"
    );
    let (status, error) = exchange_at(second.clone(), "cluster-a", &access).await?;
    anyhow::ensure!(
        status == 400 && error["error"] == "invalid_grant",
        "revoked access token: {status} {error}"
    );
    let refreshed = |token: &str, base: String| {
        let (http, token) = (http.clone(), token.to_string());
        let url = format!("{base}{path}/oauth2/token");
        async move { pinniped_cli::refresh(&http, &url, &token).await }
    };
    let (status, error) = refreshed(&refresh, second.clone()).await?;
    anyhow::ensure!(
        status == 400 && error["error"] == "invalid_grant",
        "revoked refresh token: {status} {error}"
    );

    // A new login; its refresh token rotates (on the other replica), and the old one is dead.
    let response = get(
        &http,
        &authorize_url(&second, &path, &[], &[]),
        Some(PASSWORD),
        &email,
    )
    .await?;
    let code = param(&redirected(&response)?, "code")
        .unwrap_or_default()
        .to_string();
    let redeem = [
        ("grant_type", "authorization_code"),
        ("client_id", "pinniped-cli"),
        ("code", code.as_str()),
        ("redirect_uri", REDIRECT),
        ("code_verifier", VERIFIER),
    ];
    let (status, tokens) = token(&http, &format!("{first}{path}/oauth2/token"), &redeem).await?;
    anyhow::ensure!(status == 200, "{status}: {tokens}");
    let old_refresh = tokens["refresh_token"].as_str().unwrap_or_default().to_string();
    let (status, rotated) = refreshed(&old_refresh, second.clone()).await?;
    anyhow::ensure!(status == 200, "refresh: {status} {rotated}");
    let new_refresh = rotated["refresh_token"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(
        new_refresh.starts_with("pin_rt_") && new_refresh != old_refresh,
        "{rotated}"
    );
    // The refresh ended the access token issued before it; the newest one works.
    let token_url = format!("{first}{path}/oauth2/token");
    let access = tokens["access_token"].as_str().unwrap_or_default();
    let (status, error) = exchange(&http, &token_url, "cluster-a", access).await?;
    anyhow::ensure!(
        status == 400,
        "the login's access token still works: {status} {error}"
    );
    let access = rotated["access_token"].as_str().unwrap_or_default();
    let (status, answer) = exchange(&http, &token_url, "cluster-a", access).await?;
    anyhow::ensure!(status == 200, "the newest access token: {status} {answer}");
    // The rotated refresh token presented again (stolen, or replayed): refused, and the whole
    // login ends (RFC 9700 §4.14.2, beyond Pinniped) — the newest refresh and access tokens too.
    let (status, error) = refreshed(&old_refresh, first.clone()).await?;
    anyhow::ensure!(
        status == 400 && error["error"] == "invalid_grant",
        "reused refresh token: {status} {error}"
    );
    let (status, error) = refreshed(&new_refresh, second.clone()).await?;
    anyhow::ensure!(
        status == 400 && error["error"] == "invalid_grant",
        "the newest refresh token outlived the reuse of an older one: {status} {error}"
    );
    let (status, error) = exchange(&http, &token_url, "cluster-a", access).await?;
    anyhow::ensure!(
        status == 400,
        "the newest access token outlived the reuse of an older refresh token: {status} {error}"
    );

    // A wrong PKCE verifier.
    let response = get(
        &http,
        &authorize_url(&first, &path, &[], &[]),
        Some(PASSWORD),
        &email,
    )
    .await?;
    let code = param(&redirected(&response)?, "code")
        .unwrap_or_default()
        .to_string();
    let wrong_verifier = [
        ("grant_type", "authorization_code"),
        ("client_id", "pinniped-cli"),
        ("code", code.as_str()),
        ("redirect_uri", REDIRECT),
        (
            "code_verifier",
            "another-verifier-of-enough-length-0123456789-abcdef",
        ),
    ];
    let (status, error) = token(&http, &format!("{first}{path}/oauth2/token"), &wrong_verifier).await?;
    anyhow::ensure!(
        status == 400 && error["error"] == "invalid_grant",
        "PKCE: {status} {error}"
    );

    // Bad authorization requests: redirected back with the state, or answered directly.
    for (without, extra, code, hint) in [
        (
            &["code_challenge"][..],
            &[][..],
            "invalid_request",
            "code_challenge when performing the authorize code flow",
        ),
        (
            &["code_challenge_method"][..],
            &[][..],
            "invalid_request",
            "plain is not allowed",
        ),
        (
            &["code_challenge_method"][..],
            &[("code_challenge_method", "plain")][..],
            "invalid_request",
            "plain is not allowed",
        ),
        (
            &["state"][..],
            &[("state", "short")][..],
            "invalid_state",
            "at least be 8 characters",
        ),
        (
            &["pinniped_idp_name"][..],
            &[("pinniped_idp_name", "Nobody")][..],
            "invalid_request",
            "did not find an identity provider",
        ),
        (
            &["scope"][..],
            &[("scope", "openid tuna")][..],
            "invalid_scope",
            "scope 'tuna'",
        ),
    ] {
        let response = get(
            &http,
            &authorize_url(&first, &path, without, extra),
            Some(PASSWORD),
            &email,
        )
        .await?;
        let params = redirected(&response)?;
        anyhow::ensure!(
            param(&params, "error") == Some(code),
            "{without:?}/{extra:?}: {params:?}"
        );
        anyhow::ensure!(
            param(&params, "error_description").is_some_and(|d| d.contains(hint)),
            "{params:?}"
        );
        anyhow::ensure!(
            param(&params, "code").is_none(),
            "an error came with a code: {params:?}"
        );
    }
    let response = get(
        &http,
        &authorize_url(&first, &path, &[], &[]),
        Some("wrong"),
        &email,
    )
    .await?;
    anyhow::ensure!(
        param(&redirected(&response)?, "error") == Some("access_denied"),
        "wrong password"
    );
    for (without, extra, status, code) in [
        (
            &["client_id"][..],
            &[("client_id", "someone-else")][..],
            401,
            "invalid_client",
        ),
        (
            &["redirect_uri"][..],
            &[("redirect_uri", "https://evil.example.com/callback")][..],
            400,
            "invalid_request",
        ),
    ] {
        let response = get(
            &http,
            &authorize_url(&first, &path, without, extra),
            Some(PASSWORD),
            &email,
        )
        .await?;
        anyhow::ensure!(response.status == status, "{extra:?}: {}", response.status);
        let body: Value = serde_json::from_slice(&response.body)?;
        anyhow::ensure!(body["error"] == code, "{extra:?}: {body}");
    }
    // A forged or altered upstream state at the callback.
    let response = get(
        &http,
        &format!("{first}{path}/callback?code=x&state=forged"),
        None,
        &email,
    )
    .await?;
    anyhow::ensure!(response.status == 400, "forged state: {}", response.status);
    // An oversized request is refused and the Supervisor carries on.
    let huge = "x".repeat(200 * 1024);
    let oversized = get(
        &http,
        &authorize_url(&first, &path, &[], &[("junk", &huge)]),
        None,
        &email,
    )
    .await;
    anyhow::ensure!(
        oversized.map_or(true, |response| response.status.is_client_error()),
        "oversized request accepted"
    );
    let response = get(
        &http,
        &format!("{first}{path}/.well-known/openid-configuration"),
        None,
        &email,
    )
    .await?;
    anyhow::ensure!(response.status == 200, "the Supervisor stopped answering");

    let log = supervisor.log();
    // One audit line per request, without the query.
    let audit: Vec<Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "audit")
        .collect();
    anyhow::ensure!(
        audit
            .iter()
            .any(|line| line["fields"]["path"] == format!("{path}/oauth2/token")
                && line["fields"]["status"] == 400),
        "no audit line of a refused token request"
    );
    anyhow::ensure!(
        audit
            .iter()
            .all(|line| !line["fields"]["path"].as_str().unwrap_or_default().contains('?')),
        "an audit line has a query"
    );
    for secret in [PASSWORD, "pin_ac_", "pin_at_", "pin_rt_", VERIFIER] {
        anyhow::ensure!(!log.contains(secret), "the Supervisor logged {secret:?}");
    }
    supervisor.check_running()?;
    Ok(())
}
