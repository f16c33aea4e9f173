//! The Supervisor's sessions as an operator sees them and as they end: a login writes one
//! Secret, with Pinniped's labels, annotation and data keys, that never holds a downstream
//! token; the garbage collector deletes it once expired within seconds, after which its tokens
//! stop working. An upstream that issues no refresh token
//! (Dex without `offline_access`) is checked at its userinfo endpoint on every refresh, and a
//! token it no longer accepts ends the session.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{api::ListParams, Api};
use selkie_e2e::{
    dex::{Dex, DexUser},
    pinniped_cli,
    supervisor::Supervisor,
    Cluster,
};
use serde_json::Value;

use super::supervisor_oauth::{dex_user_namespace, get, DexUserNamespace, PASSWORD};

const TYPE_LABEL: &str = "storage.pinniped.dev/type";
const REQUEST_ID_LABEL: &str = "storage.pinniped.dev/request-id";
const COLLECT_AFTER: &str = "storage.pinniped.dev/garbage-collect-after";

/// `https://host:port` and `/path` of an issuer.
pub(crate) use selkie_e2e::pinniped_cli::split_issuer as split;

/// Logs `email` in through `idp_name` with the cli_password flow and redeems the code: the
/// token response (an error carries the Supervisor's log).
pub(crate) async fn login(supervisor: &Supervisor, idp_name: &str, email: &str) -> anyhow::Result<Value> {
    pinniped_cli::login(
        &supervisor.client()?,
        supervisor.issuer(),
        idp_name,
        email,
        PASSWORD,
    )
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))
}

/// The refresh grant with `refresh_token`: status and answer.
pub(crate) async fn refresh(supervisor: &Supervisor, refresh_token: &str) -> anyhow::Result<(u16, Value)> {
    let token_url = format!("{}/oauth2/token", supervisor.issuer());
    pinniped_cli::refresh(&supervisor.client()?, &token_url, refresh_token).await
}

/// The storage Secrets of the namespace, by name.
async fn storage(secrets: &Api<Secret>) -> anyhow::Result<Vec<Secret>> {
    Ok(secrets
        .list(&ListParams::default().labels(TYPE_LABEL))
        .await?
        .items)
}

fn label<'a>(secret: &'a Secret, name: &str) -> &'a str {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(name))
        .map(String::as_str)
        .unwrap_or_default()
}

/// The one storage Secret of `kind`.
pub(crate) async fn one_of(secrets: &Api<Secret>, kind: &str) -> anyhow::Result<Secret> {
    let found: Vec<Secret> = storage(secrets)
        .await?
        .into_iter()
        .filter(|secret| label(secret, TYPE_LABEL) == kind)
        .collect();
    anyhow::ensure!(found.len() == 1, "{} {kind} Secrets", found.len());
    Ok(found.into_iter().next().unwrap_or_default())
}

/// The stored session JSON of a storage Secret.
pub(crate) fn stored_session(secret: &Secret) -> anyhow::Result<Value> {
    let data = secret
        .data
        .as_ref()
        .and_then(|data| data.get("pinniped-storage-data"))
        .ok_or_else(|| anyhow::anyhow!("no pinniped-storage-data"))?;
    Ok(serde_json::from_slice(&data.0)?)
}

/// The fields of a login Secret's `tokens` entry: the generation, when they were issued (unix
/// seconds), the access and refresh tokens' signatures; none before the code was redeemed.
pub(crate) fn stored_tokens(secret: &Secret) -> Vec<String> {
    secret
        .data
        .as_ref()
        .and_then(|data| data.get("tokens"))
        .map(|tokens| {
            String::from_utf8_lossy(&tokens.0)
                .split(' ')
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Marks `name` expired as an operator could (its collection time in the past) and waits until
/// the collector has deleted it.
pub(crate) async fn expire_and_wait_for_collection(
    cluster: &Cluster,
    secrets: &Api<Secret>,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    cluster
        .kubectl()
        .run(&[
            "annotate",
            "secret",
            name,
            "-n",
            namespace,
            "--overwrite",
            &format!("{COLLECT_AFTER}=2020-01-01T00:00:00Z"),
        ])
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while secrets.get_opt(name).await?.is_some() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the garbage collector did not delete {name} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test]
async fn session_secrets_are_pinnipeds_and_expired_ones_are_collected() -> anyhow::Result<()> {
    let DexUserNamespace {
        cluster,
        client,
        namespace,
        email,
        dex,
    } = dex_user_namespace("supervisor-gc", &["seals"], None).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, "Dex Users").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);

    let tokens = login(&supervisor, "Dex Users", &email).await?;
    let access = tokens["access_token"].as_str().unwrap_or_default().to_string();
    let refresh_token = tokens["refresh_token"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(!access.is_empty() && !refresh_token.is_empty(), "{tokens}");

    // What a login leaves behind: one Secret, in Pinniped's labels, annotation and data keys
    // (and Selkie's own type and two keys of its own), the code marked used.
    let stored = storage(&secrets).await?;
    anyhow::ensure!(
        stored.len() == 1,
        "{} storage Secrets after one login",
        stored.len()
    );
    let secret = &stored[0];
    let request_id = label(secret, REQUEST_ID_LABEL).to_string();
    anyhow::ensure!(uuid_like(&request_id), "request-id {request_id:?} is not a UUID");
    let name = secret.metadata.name.clone().unwrap_or_default();
    anyhow::ensure!(
        label(secret, TYPE_LABEL) == "login" && name == format!("pinniped-storage-login-{request_id}"),
        "{name}: {:?}",
        secret.metadata.labels
    );
    anyhow::ensure!(
        secret.type_.as_deref() == Some("storage.selkie.dev/login"),
        "{name}: type {:?}",
        secret.type_
    );
    let after = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(COLLECT_AFTER))
        .ok_or_else(|| anyhow::anyhow!("{name}: no {COLLECT_AFTER}"))?;
    let after = time::OffsetDateTime::parse(after, &time::format_description::well_known::Rfc3339)?;
    anyhow::ensure!(
        after > time::OffsetDateTime::now_utc() + time::Duration::hours(8),
        "{name}: collectable before the session's end"
    );
    let data = secret.data.clone().unwrap_or_default();
    anyhow::ensure!(
        data.keys().map(String::as_str).collect::<Vec<_>>()
            == [
                "code",
                "pinniped-storage-data",
                "pinniped-storage-version",
                "tokens"
            ]
            && data["pinniped-storage-version"].0 == b"1"
            && data["code"].0 == b"used",
        "{name}: data keys {:?}",
        data.keys()
    );
    stored_session(secret)?;
    // Only signatures name the tokens: no stored byte is a downstream token.
    for value in data.values() {
        let text = String::from_utf8_lossy(&value.0);
        anyhow::ensure!(
            !text.contains(&access) && !text.contains(&refresh_token),
            "{name} holds a downstream token"
        );
    }
    let generation = |secret: &Secret| stored_tokens(secret).first().cloned().unwrap_or_default();
    anyhow::ensure!(
        generation(secret) == "1",
        "{name}: tokens of generation {}",
        generation(secret)
    );

    // The session lives on: its refresh token works and rotates, in the same Secret.
    let (status, refreshed) = refresh(&supervisor, &refresh_token).await?;
    anyhow::ensure!(status == 200, "{status}: {refreshed}");
    let rotated = refreshed["refresh_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(!rotated.is_empty() && rotated != refresh_token, "{refreshed}");
    let stored = storage(&secrets).await?;
    anyhow::ensure!(
        stored.len() == 1 && generation(&stored[0]) == "2",
        "{} storage Secrets after a refresh",
        stored.len()
    );

    // Once the login's Secret is collected, its refresh token is dead.
    expire_and_wait_for_collection(cluster, &secrets, &namespace, &name).await?;
    let (status, refused) = refresh(&supervisor, &rotated).await?;
    anyhow::ensure!(
        status == 400 && refused["error"] == "invalid_grant",
        "{status}: {refused}"
    );

    // The metrics count what happened, and nothing else.
    let metrics = supervisor.metrics().await?;
    for line in [
        "selkie_supervisor_token_grants_total{grant_type=\"authorization_code\",result=\"ok\"} 1",
        "selkie_supervisor_token_grants_total{grant_type=\"refresh_token\",result=\"ok\"} 1",
        "selkie_supervisor_token_grants_total{grant_type=\"refresh_token\",result=\"invalid_grant\"} 1",
        "selkie_supervisor_sessions_collected_total{outcome=\"deleted\"} 1",
        "selkie_supervisor_requests_total{endpoint=\"token\",code=\"200\"} 2",
        "selkie_supervisor_requests_total{endpoint=\"token\",code=\"400\"} 1",
    ] {
        anyhow::ensure!(metrics.lines().any(|l| l == line), "{line} is not in\n{metrics}");
    }

    let log = supervisor.log();
    anyhow::ensure!(
        log.matches("expired session storage deleted").count() >= 1,
        "no collection in the log:\n{log}"
    );
    for secret in [&access, &refresh_token, &rotated] {
        anyhow::ensure!(
            !log.contains(secret.as_str()),
            "a token is in the Supervisor's log"
        );
    }
    Ok(())
}

/// Whether `text` is a lower-case hyphenated UUID.
fn uuid_like(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|group| group.len()).eq([8, 4, 4, 4, 12])
        && text
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[tokio::test]
async fn an_upstream_without_refresh_tokens_is_checked_at_userinfo() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-userinfo").await?;
    let email = format!("{namespace}@example.com");
    let users = [DexUser {
        email: email.clone(),
        password: PASSWORD.into(),
        user_id: format!("id-{namespace}"),
        groups: vec!["seals".into(), "walruses".into()],
    }];
    let mut dex = Dex::start(&users).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, "Dex Users").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);

    // A second identity provider for the same Dex that does not ask for offline_access (so Dex
    // issues no refresh token), listed in the FederationDomain beside the first.
    let manifests = format!(
        r#"apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: OIDCIdentityProvider
metadata: {{name: dex-online, namespace: {namespace}}}
spec:
  issuer: {issuer}
  tls: {{certificateAuthorityData: {ca}}}
  client: {{secretName: dex-client}}
  authorizationConfig:
    additionalScopes: [email, groups]
    allowPasswordGrant: true
  claims: {{username: email, groups: groups}}
---
apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: FederationDomain
metadata: {{name: federation-domain, namespace: {namespace}}}
spec:
  issuer: {fd_issuer}
  identityProviders:
  - displayName: Dex Users
    objectRef: {{apiGroup: idp.supervisor.pinniped.dev, kind: OIDCIdentityProvider, name: dex}}
  - displayName: Dex Online
    objectRef: {{apiGroup: idp.supervisor.pinniped.dev, kind: OIDCIdentityProvider, name: dex-online}}
"#,
        issuer = dex.issuer(),
        ca = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, dex.ca_pem()),
        fd_issuer = supervisor.issuer(),
    );
    cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
        .await?;
    let idps_url = format!("{}/v1alpha1/pinniped_identity_providers", supervisor.issuer());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = get(&supervisor.client()?, &idps_url, None, "").await?;
        let idps: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        let listed = idps["pinniped_identity_providers"]
            .as_array()
            .is_some_and(|all| all.iter().any(|idp| idp["name"] == "Dex Online"));
        if listed {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "Dex Online was not served within 60 s: {idps}\n{}",
            supervisor.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let tokens = login(&supervisor, "Dex Online", &email).await?;
    let refresh_token = tokens["refresh_token"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(!refresh_token.is_empty(), "{tokens}");
    // The session holds Dex's access token, as Dex issued no refresh token.
    let session = stored_session(&one_of(&secrets, "login").await?)?;
    anyhow::ensure!(
        session["upstream"]["refresh_token"].is_null() && session["upstream"]["access_token"].is_string(),
        "the stored upstream tokens are not an access token alone"
    );

    // Refresh: Dex's userinfo vouches for the user; the groups are read again.
    let (status, refreshed) = refresh(&supervisor, &refresh_token).await?;
    anyhow::ensure!(status == 200, "{status}: {refreshed}\n{}", supervisor.log());
    let claims: Value = serde_json::from_slice(&base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        refreshed["id_token"]
            .as_str()
            .unwrap_or_default()
            .split('.')
            .nth(1)
            .unwrap_or_default(),
    )?)?;
    anyhow::ensure!(
        claims["username"] == email.as_str() && claims["groups"] == serde_json::json!(["seals", "walruses"]),
        "{claims}"
    );
    let rotated = refreshed["refresh_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    // Dex restarts with new keys (memory storage): it no longer accepts the access token it
    // issued, and the refresh fails at its userinfo endpoint.
    dex.restart_with_users(&users).await?;
    let (status, refused) = refresh(&supervisor, &rotated).await?;
    anyhow::ensure!(
        status == 400
            && refused["error"] == "invalid_grant"
            && refused["error_description"]
                .as_str()
                .is_some_and(|text| text.contains("Upstream refresh failed")),
        "{status}: {refused}"
    );
    let log = supervisor.log();
    anyhow::ensure!(
        log.contains("reading the userinfo endpoint"),
        "the refusal is not the userinfo check:\n{log}"
    );
    Ok(())
}
