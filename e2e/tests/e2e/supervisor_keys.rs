//! Signing-key rotation with overlap, on real components: a Supervisor whose keys rotate every
//! 40 seconds publishes the next key in `jwks.json` before it signs with it (half the interval
//! ahead here) and keeps publishing the retired key, so a cluster (Selkie's proxy with a
//! JWTAuthenticator for the FederationDomain) accepts the tokens of the old key and of the new
//! one alike; the `jwks` Secret keeps Pinniped's data keys and records when the old key goes.

use std::time::Duration;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use selkie_e2e::{
    cluster::write_kubeconfig_for_user,
    proxy::{JwtSpec, Proxy},
    supervisor::Supervisor,
};
use serde_json::{json, Value};

use crate::{
    supervisor_oauth::{dex_user_namespace, exchange, DexUserNamespace, IDP_NAME},
    supervisor_sessions::login,
};

/// The `kid` in a JWT's header.
fn kid(jwt: &str) -> anyhow::Result<String> {
    let header = jwt
        .split('.')
        .next()
        .ok_or_else(|| anyhow::anyhow!("not a JWT"))?;
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header)?)?;
    header["kid"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no kid in {header}"))
}

/// The user the cluster behind `proxy` sees for the bearer `token`.
async fn whoami(proxy: &Proxy, dir: &std::path::Path, name: &str, token: &str) -> anyhow::Result<Value> {
    let path = dir.join(format!("{name}.kubeconfig"));
    write_kubeconfig_for_user(
        &path,
        proxy.url(),
        &proxy.serving_ca().cert_pem(),
        name,
        json!({"token": token}),
    )?;
    let out = proxy
        .kubectl(&path)
        .run(&["auth", "whoami", "-o", "json"])
        .await?;
    Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
}

#[tokio::test]
async fn signing_keys_rotate_and_tokens_of_the_retired_key_stay_valid() -> anyhow::Result<()> {
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-keys", &["seals"], None).await?;
    let supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        &dex,
        IDP_NAME,
        selkie_e2e::free_port()?,
        json!({"signingKeyRotationInterval": "40s"}),
    )
    .await?;
    let proxy = Proxy::start(
        cluster,
        &[JwtSpec {
            name: "supervisor".into(),
            issuer: supervisor.issuer().into(),
            audience: "cluster-a".into(),
            username_claim: "username".into(),
            groups_claim: "groups".into(),
            ca_pem: supervisor.ca_pem(),
        }],
    )
    .await?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-supervisor-keys-")
        .tempdir()?;
    let http = supervisor.client()?;
    let token_url = format!("{}/oauth2/token", supervisor.issuer());

    let tokens = login(&supervisor, IDP_NAME, &email).await?;
    let access = tokens["access_token"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no access token: {tokens}"))?;
    let cluster_token = || async {
        let (status, answer) = exchange(&http, &token_url, "cluster-a", access).await?;
        anyhow::ensure!(status == 200, "{status}: {answer}");
        answer["access_token"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no token: {answer}"))
    };
    let old = cluster_token().await?;
    let old_kid = kid(&old)?;
    let user = whoami(&proxy, dir.path(), "old", &old).await?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");

    let jwks = || async {
        let response = http
            .send(
                http::Method::GET,
                &format!("{}/jwks.json", supervisor.issuer()),
                &[],
                bytes::Bytes::new(),
                1 << 20,
                Some(Duration::from_secs(10)),
            )
            .await?;
        let jwks: Value = serde_json::from_slice(&response.body)?;
        let kids: Vec<String> = jwks["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|key| key["kid"].as_str().map(str::to_string))
            .collect();
        anyhow::Ok((jwks, kids))
    };

    // Before the rotation the next key is published while the old one still signs.
    let next_kid = selkie_e2e::eventually(Duration::from_secs(60), || async {
        let (_, kids) = jwks().await?;
        let next = kids
            .iter()
            .find(|kid| **kid != old_kid)
            .ok_or_else(|| anyhow::anyhow!("only {kids:?} published"))?
            .clone();
        let token = cluster_token().await?;
        anyhow::ensure!(
            kid(&token)? == old_kid,
            "{next} signed before it was seen published"
        );
        Ok(next)
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;

    // Then the leader rotates: new tokens carry the key published ahead.
    let new = selkie_e2e::eventually(Duration::from_secs(60), || async {
        let token = cluster_token().await?;
        anyhow::ensure!(kid(&token)? != old_kid, "still signed with {old_kid}");
        Ok(token)
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let new_kid = kid(&new)?;
    anyhow::ensure!(
        new_kid == next_kid,
        "signed with {new_kid}, {next_kid} was published ahead"
    );

    // jwks.json publishes both: the retired key is there until its tokens have expired.
    let (jwks, published) = jwks().await?;
    anyhow::ensure!(
        published.contains(&old_kid) && published.contains(&new_kid),
        "{old_kid} and {new_kid} not both in {jwks}"
    );
    anyhow::ensure!(
        jwks["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|key| key.get("d").is_none()),
        "a private key is published: {jwks}"
    );

    // The cluster accepts both: the new key once its key cache has refetched (relying parties
    // throttle refetches on an unknown kid), the old one still.
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let user = whoami(&proxy, dir.path(), "new", &new).await?;
        anyhow::ensure!(user["username"] == email.as_str(), "{user}");
        Ok(())
    })
    .await
    .map_err(|e| crate::with_log(e, proxy.log()))?;
    let user = whoami(&proxy, dir.path(), "old-again", &old).await?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");

    // The Secret keeps Pinniped's type and data keys and says until when the old key stays.
    let secret: Value = serde_json::from_str(
        &cluster
            .kubectl()
            .run(&[
                "get",
                "secret",
                "federation-domain-jwks",
                "-n",
                &namespace,
                "-o",
                "json",
            ])
            .await?,
    )?;
    anyhow::ensure!(
        secret["type"] == "secrets.pinniped.dev/federation-domain-jwks"
            && secret["data"]["activeJWK"].is_string()
            && secret["data"]["jwks"].is_string(),
        "{}",
        secret["type"]
    );
    let annotations = &secret["metadata"]["annotations"];
    let retired: Value = serde_json::from_str(
        annotations["supervisor.selkie.dev/retired-keys"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no retired keys: {annotations}"))?,
    )?;
    let until = retired[old_kid.as_str()]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("{old_kid} not retired: {retired}"))?;
    let until = time::OffsetDateTime::parse(until, &time::format_description::well_known::Rfc3339)?;
    // Retired at most a minute ago, kept for the ID token lifetime (2 min) and 5 minutes more.
    let left = until - time::OffsetDateTime::now_utc();
    anyhow::ensure!(
        left > time::Duration::minutes(5) && left <= time::Duration::minutes(7),
        "{old_kid} goes in {left}"
    );
    anyhow::ensure!(
        annotations["supervisor.selkie.dev/active-key-since"].is_string(),
        "{annotations}"
    );

    // The log says what rotated, and holds no token.
    let log = supervisor.log();
    anyhow::ensure!(log.contains("rotated the signing keys"), "{log}");
    for secret in [old.as_str(), new.as_str(), access] {
        anyhow::ensure!(!log.contains(secret), "a token is in the log");
    }
    Ok(())
}
