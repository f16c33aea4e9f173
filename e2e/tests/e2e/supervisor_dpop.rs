//! Sender-constrained sessions (DPoP, RFC 9449; issue 29) on real components: once the admin
//! turns `spec.dpop` on for a FederationDomain, the discovery document says so, the pinniped
//! CLI's logins (which carry no proof) are refused with a clear error and its earlier sessions
//! end, while kubectl with `selkie login oidc` as its exec plugin logs in, keeps a per-issuer key
//! (mode 0600) next to its session cache and proves it at every token request. A copied
//! `sessions.yaml` is then worth nothing: its refresh token is refused without a proof by the
//! owner's key (with another key, or none), and the owner's CLI still refreshes afterwards.
//! Off (the default), the pinniped CLI works as against Pinniped.

use std::{os::unix::fs::PermissionsExt as _, path::Path, time::Duration};

use anyhow::{ensure, Context as _};
use selkie_e2e::{eventually, pinniped_cli, proxy::Proxy, supervisor::Supervisor};
use selkie_oidc::{dpop, https::HttpsClient, jose::sign::SigningKey};
use serde_json::Value;

use crate::{
    proxy_kubectl::grant_configmaps,
    supervisor_device::discovery,
    supervisor_ldap::expire_cached_tokens,
    supervisor_login::{kubeconfig, login, session, supervisor_jwt, whoami},
    supervisor_oauth::{dex_user_namespace, DexUserNamespace, PASSWORD},
    supervisor_transforms::patch_federation_domain,
};

const IDP_NAME: &str = "Dex Users";
const AUDIENCE: &str = "cluster-a";

/// The refresh token of the session cache in `dir`.
fn cached_refresh_token(dir: &Path) -> anyhow::Result<String> {
    session(dir)?["tokens"]["refresh"]["token"]
        .as_str()
        .map(String::from)
        .context("the session cache holds no refresh token")
}

/// The refresh grant of the pinniped-cli client with `refresh_token`, carrying a DPoP proof by
/// `key` (with `nonce`): status, headers and answer.
async fn refresh_with_proof(
    client: &HttpsClient,
    token_url: &str,
    refresh_token: &str,
    key: &SigningKey,
    nonce: Option<&str>,
) -> anyhow::Result<(u16, http::HeaderMap, Value)> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let proof = dpop::proof(key, "POST", token_url, nonce, now)?;
    pinniped_cli::token_with_headers(
        client,
        token_url,
        &[
            ("grant_type", "refresh_token"),
            ("client_id", pinniped_cli::CLIENT_ID),
            ("refresh_token", refresh_token),
        ],
        &[(
            http::HeaderName::from_static("dpop"),
            http::HeaderValue::from_str(&proof)?,
        )],
    )
    .await
}

#[tokio::test]
async fn a_copied_session_cache_is_refused_where_sessions_are_bound_to_the_clis_key() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-dpop", &["seals"], None).await?;
    grant_configmaps(cluster, &namespace, "User", &email).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, AUDIENCE)]).await?;
    let client = supervisor.client()?;
    let token_url = format!("{}/oauth2/token", supervisor.issuer());

    // 1. Off by default: nothing advertised, and the pinniped CLI logs in with bearer tokens.
    let document = discovery(&supervisor).await?;
    ensure!(
        document.get("dpop_signing_alg_values_supported").is_none(),
        "{document}"
    );
    let pinniped = pinniped_cli::login(&client, supervisor.issuer(), IDP_NAME, &email, PASSWORD)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    ensure!(
        pinniped["token_type"]
            .as_str()
            .is_some_and(|t| t.eq_ignore_ascii_case("bearer")),
        "{:?}",
        pinniped.get("token_type")
    );
    let pinniped_refresh = pinniped["refresh_token"]
        .as_str()
        .context("refresh token")?
        .to_string();

    // 2. The admin turns binding on; the discovery document says so.
    patch_federation_domain(
        cluster,
        &namespace,
        "merge",
        r#"{"spec":{"dpop":{"enabled":true}}}"#,
    )
    .await?;
    eventually(Duration::from_secs(30), || async {
        let document = discovery(&supervisor).await?;
        ensure!(
            document["dpop_signing_alg_values_supported"] == serde_json::json!(["ES256"]),
            "{document}"
        );
        Ok(())
    })
    .await?;

    // The pinniped CLI's login is refused, saying why; its session from before ends.
    let refused = pinniped_cli::login(&client, supervisor.issuer(), IDP_NAME, &email, PASSWORD)
        .await
        .err()
        .context("the pinniped CLI logged in without a DPoP proof")?;
    let refused = format!("{refused:#}");
    ensure!(
        refused.contains("invalid_dpop_proof") && refused.contains("DPoP"),
        "{refused}"
    );
    let (status, body) = pinniped_cli::refresh(&client, &token_url, &pinniped_refresh).await?;
    ensure!(
        status == 400 && body["error"] == "invalid_grant",
        "a session begun before binding was turned on refreshed: {status}: {body}"
    );

    // 3. kubectl with selkie as its exec plugin logs in; the CLI keeps its key beside the
    //    session cache, readable by its owner only, and out of sessions.yaml.
    let owner = tempfile::Builder::new()
        .prefix("selkie-supervisor-dpop-")
        .tempdir()?;
    let kubeconfig = kubeconfig(
        owner.path(),
        "owner",
        &selkie,
        &supervisor,
        &proxy,
        AUDIENCE,
        &email,
        PASSWORD,
    )?;
    let user = whoami(&proxy, &kubeconfig)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    ensure!(user["username"] == email.as_str(), "{user}");
    let keys: Vec<_> = std::fs::read_dir(owner.path().join("dpop-keys"))
        .context("the CLI kept no DPoP key beside its session cache")?
        .collect::<Result<_, _>>()?;
    ensure!(keys.len() == 1, "one key per issuer: {keys:?}");
    let mode = keys[0].metadata()?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "the DPoP key file has mode {mode:o}");
    let cache = std::fs::read_to_string(owner.path().join("sessions.yaml"))?;
    let key: Value = serde_json::from_str(&std::fs::read_to_string(keys[0].path())?)?;
    let private = key["d"].as_str().context("the key file holds no private key")?;
    ensure!(!cache.contains(private), "sessions.yaml holds the private key");
    let stolen_refresh = cached_refresh_token(owner.path())?;

    // 4. A copy of sessions.yaml elsewhere (the CLI there makes its own key): the refresh is
    //    refused, and so is the login that follows it without the user's password.
    let thief = tempfile::Builder::new()
        .prefix("selkie-supervisor-dpop-copy-")
        .tempdir()?;
    std::fs::copy(
        owner.path().join("sessions.yaml"),
        thief.path().join("sessions.yaml"),
    )?;
    expire_cached_tokens(thief.path())?;
    let (ok, stdout, stderr) = login(
        &selkie,
        &supervisor,
        thief.path(),
        AUDIENCE,
        &email,
        "not-the-password",
    )
    .await?;
    ensure!(
        !ok && stdout.is_empty(),
        "a copied session cache got a credential ({} bytes on stdout): {stderr}",
        stdout.len()
    );
    ensure!(
        stderr.contains("did not accept the username or password"),
        "the copied session cache's run failed otherwise: {stderr}"
    );
    // What the Supervisor says to the copied refresh token: without a proof, and with a proof
    // by another key (after the nonce it asks for).
    let (status, body) = pinniped_cli::refresh(&client, &token_url, &stolen_refresh).await?;
    ensure!(
        status == 400 && body["error"] == "invalid_dpop_proof",
        "the copied refresh token without a proof: {status}: {body}"
    );
    let other_key = SigningKey::generate("thief")?;
    let (status, headers, body) =
        refresh_with_proof(&client, &token_url, &stolen_refresh, &other_key, None).await?;
    ensure!(
        status == 400 && body["error"] == dpop::USE_NONCE_ERROR,
        "a proof without a nonce: {status}: {body}"
    );
    let nonce = headers
        .get(dpop::NONCE_HEADER)
        .and_then(|value| value.to_str().ok())
        .context("use_dpop_nonce without a DPoP-Nonce header")?
        .to_string();
    let (status, _, body) =
        refresh_with_proof(&client, &token_url, &stolen_refresh, &other_key, Some(&nonce)).await?;
    ensure!(
        status == 400 && body["error"] == "invalid_grant",
        "the copied refresh token with another key's proof: {status}: {body}"
    );

    // 5. The owner's CLI still refreshes (with its key), rotating the refresh token, and
    //    kubectl reaches the cluster again.
    expire_cached_tokens(owner.path())?;
    let (ok, stdout, stderr) = login(
        &selkie,
        &supervisor,
        owner.path(),
        AUDIENCE,
        &email,
        "not-the-password",
    )
    .await?;
    ensure!(
        ok && stdout.contains("\"token\""),
        "the owner's refresh: {stderr}\n{}",
        supervisor.log()
    );
    ensure!(
        cached_refresh_token(owner.path())? != stolen_refresh,
        "the owner's refresh token was not rotated"
    );
    let user = whoami(&proxy, &kubeconfig)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    ensure!(user["username"] == email.as_str(), "{user}");

    // No token, proof or key in the Supervisor's log.
    let log = supervisor.log();
    ensure!(
        !log.contains(&stolen_refresh) && !log.contains(private),
        "the Supervisor logged a secret"
    );
    Ok(())
}
