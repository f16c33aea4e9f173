//! Migrating from Pinniped's Supervisor: Selkie's is started over a namespace that Pinniped's
//! left behind — its FederationDomain and OIDCIdentityProvider (the same CRs, applied unchanged),
//! the FederationDomain's `jwks` Secret in Pinniped's format (its signing key, `kid`
//! `pinniped-supervisor-key`), a session Secret in Pinniped's own (fosite) format, and a user's
//! `sessions.yaml` written by the pinniped CLI. Then:
//!
//! * the CRs serve unchanged, and the signing key is kept: `jwks.json` publishes Pinniped's key,
//!   so a cluster token Pinniped issued before the switch is still accepted by a cluster trusting
//!   the FederationDomain;
//! * the cached session's refresh token (minted with Pinniped's token key, which Selkie does not
//!   read) is refused with `invalid_grant`, and the CLI logs in again by itself — kubectl keeps
//!   working, the user sees no error;
//! * Pinniped's session Secret, unreadable to Selkie, is collected when it expires.
//!
//! The README's "Migrating from Pinniped" lists the steps this follows.

use std::{io::Read as _, time::Duration};

use base64::{
    engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD as B64URL},
    Engine as _,
};
use p256::ecdsa::{signature::Signer as _, Signature, SigningKey};
use selkie_e2e::{cluster::write_kubeconfig_for_user, proxy::Proxy, supervisor::Supervisor};
use serde_json::{json, Value};

use crate::{
    supervisor_login::{plugin_kubeconfig, supervisor_jwt, whoami},
    supervisor_oauth::{dex_user_namespace, DexUserNamespace, PASSWORD},
};

const IDP_NAME: &str = "Dex Users";

/// A P-256 key as Pinniped stores it: the private JWK (`activeJWK`) and the public one.
fn pinniped_key() -> anyhow::Result<(SigningKey, Value, Value)> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    let key = SigningKey::from_bytes(&seed.into())?;
    let point = key.verifying_key().to_encoded_point(false);
    let (x, y) = (
        B64URL.encode(point.x().ok_or_else(|| anyhow::anyhow!("no x"))?),
        B64URL.encode(point.y().ok_or_else(|| anyhow::anyhow!("no y"))?),
    );
    let public = json!({"use": "sig", "kty": "EC", "kid": "pinniped-supervisor-key", "crv": "P-256",
        "alg": "ES256", "x": x, "y": y});
    let mut private = public.clone();
    private["d"] = json!(B64URL.encode(seed));
    Ok((key, private, public))
}

/// A JWT of `claims` signed with `key` (ES256, `kid` `pinniped-supervisor-key`), as Pinniped signs.
fn sign(key: &SigningKey, claims: &Value) -> String {
    let header =
        B64URL.encode(json!({"alg": "ES256", "kid": "pinniped-supervisor-key", "typ": "JWT"}).to_string());
    let payload = B64URL.encode(claims.to_string());
    let signature: Signature = key.sign(format!("{header}.{payload}").as_bytes());
    format!("{header}.{payload}.{}", B64URL.encode(signature.to_bytes()))
}

#[tokio::test]
async fn migration_from_pinniped_keeps_the_crs_and_the_signing_key_and_old_sessions_log_in_again(
) -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("migration", &["seals"], None).await?;
    let kubectl = cluster.kubectl();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();

    // What Pinniped's Supervisor left: the FederationDomain's signing key ...
    let (key, private, public) = pinniped_key()?;
    let jwks = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "federation-domain-jwks", "namespace": namespace,
                     "labels": {"app": "pinniped-supervisor"}},
        "type": "secrets.pinniped.dev/federation-domain-jwks",
        "data": {"activeJWK": B64.encode(private.to_string()),
                 "jwks": B64.encode(json!({"keys": [public]}).to_string())}});
    // ... and a session Secret of its own format, expired a minute ago.
    let expired = time::OffsetDateTime::from_unix_timestamp(now - 60)?
        .format(&time::format_description::well_known::Rfc3339)?;
    let pinniped_session = json!({"request": {
        "id": "0c2f3e74-9d3c-4b7e-8d0a-0d6c1f6f0a11", "requestedAt": "2026-01-02T03:04:05Z",
        "client": {"id": "pinniped-cli", "redirect_uris": ["http://127.0.0.1/callback"]},
        "grantedScopes": ["openid", "offline_access"],
        "session": {"fosite": {"claims": {"sub": "x"}}, "custom": {"username": email, "providerType": "oidc",
            "oidc": {"upstreamRefreshToken": "dex-refresh-token"}}}}, "version": "8"});
    let session_secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pinniped-storage-refresh-token-mfrggzdfmztwq2lknnwg23tpobyxe43u", "namespace": namespace,
            "labels": {"storage.pinniped.dev/type": "refresh-token",
                       "storage.pinniped.dev/request-id": "0c2f3e74-9d3c-4b7e-8d0a-0d6c1f6f0a11"},
            "annotations": {"storage.pinniped.dev/garbage-collect-after": expired}},
        "type": "storage.pinniped.dev/refresh-token",
        "data": {"pinniped-storage-data": B64.encode(pinniped_session.to_string()),
                 "pinniped-storage-version": B64.encode("1")}});
    kubectl
        .run_with_stdin(
            &["apply", "-f", "-"],
            Some(&json!({"apiVersion": "v1", "kind": "List", "items": [jwks, session_secret]}).to_string()),
        )
        .await?;

    // Selkie's Supervisor over it (the same FederationDomain and OIDCIdentityProvider CRs).
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;

    // The signing key is kept.
    let published: Value = serde_json::from_slice(
        &supervisor
            .client()?
            .get_json(
                &format!("{}/jwks.json", supervisor.issuer()),
                1 << 16,
                Some(Duration::from_secs(10)),
            )
            .await?,
    )?;
    anyhow::ensure!(
        published["keys"].as_array().is_some_and(|keys| keys
            .iter()
            .any(|jwk| jwk["kid"] == "pinniped-supervisor-key"
                && jwk["x"] == public["x"]
                && jwk["y"] == public["y"])),
        "Pinniped's key is not published: {published}\n{}",
        supervisor.log()
    );
    let fd = kubectl
        .run(&[
            "get",
            "federationdomain",
            "federation-domain",
            "-n",
            &namespace,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .await?;
    anyhow::ensure!(fd == "Ready", "{fd}");

    // A cluster token Pinniped issued before the switch is still accepted.
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;
    let dir = tempfile::Builder::new().prefix("selkie-migration-").tempdir()?;
    let token = sign(
        &key,
        &json!({"iss": supervisor.issuer(), "sub": "pinniped-subject", "aud": ["cluster-a"],
                "azp": "pinniped-cli", "iat": now, "exp": now + 120, "username": email,
                "groups": ["seals"]}),
    );
    let static_kubeconfig = dir.path().join("pinniped-token.kubeconfig");
    write_kubeconfig_for_user(
        &static_kubeconfig,
        proxy.url(),
        &proxy.serving_ca().cert_pem(),
        "pinniped-token",
        json!({"token": token}),
    )?;
    let user = whoami(&proxy, &static_kubeconfig)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");

    // The pinniped CLI's cached session: an expired ID token and Pinniped's refresh token.
    let stale_refresh = "pin_rt_bWlncmF0ZWQtZnJvbS1waW5uaXBlZA.c2lnbmF0dXJlLW9mLXBpbm5pcGVk";
    let expired_id = sign(
        &key,
        &json!({"iss": supervisor.issuer(), "sub": "pinniped-subject", "aud": ["pinniped-cli"],
                "iat": now - 600, "exp": now - 480}),
    );
    let rfc3339 = |at: i64| -> anyhow::Result<String> {
        Ok(time::OffsetDateTime::from_unix_timestamp(at)?
            .format(&time::format_description::well_known::Rfc3339)?)
    };
    // Used ten minutes ago (sessions unused for 90 days are dropped by both CLIs).
    let sessions = json!({"apiVersion": "config.supervisor.pinniped.dev/v1alpha1", "kind": "SessionCache",
        "sessions": [{
            "creationTimestamp": rfc3339(now - 600)?, "lastUsedTimestamp": rfc3339(now - 600)?,
            "key": {"clientID": "pinniped-cli", "issuer": supervisor.issuer(),
                    "redirect_uri": "http://localhost:0/callback",
                    "scopes": ["groups", "offline_access", "openid", "pinniped:request-audience", "username"],
                    "upstream_provider_name": IDP_NAME},
            "tokens": {"id": {"token": expired_id, "expiryTimestamp": rfc3339(now - 480)?},
                       "refresh": {"token": stale_refresh}}}]});
    std::fs::write(
        dir.path().join("sessions.yaml"),
        serde_yaml::to_string(&sessions)?,
    )?;
    // The pinniped CLI writes it readable by its owner only.
    std::fs::set_permissions(
        dir.path().join("sessions.yaml"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let kubeconfig = plugin_kubeconfig(
        dir.path(),
        "pinny",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        (IDP_NAME, "oidc"),
        &[
            ("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "cli_password"),
            ("PINNIPED_USERNAME", &email),
            ("PINNIPED_PASSWORD", PASSWORD),
        ],
    )?;
    // kubectl keeps working: the refresh is refused, the CLI logs in again by itself.
    let user = whoami(&proxy, &kubeconfig)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email.as_str(), "{user}");
    let log = supervisor.log();
    anyhow::ensure!(
        log.lines()
            .any(|line| line.contains("/oauth2/token") && line.contains("\"status\":400")),
        "no refused refresh in the log; sessions.yaml now:\n{}",
        std::fs::read_to_string(dir.path().join("sessions.yaml")).unwrap_or_default()
    );
    let rewritten: Value = serde_yaml::from_str(&std::fs::read_to_string(dir.path().join("sessions.yaml"))?)?;
    let refresh = rewritten["sessions"][0]["tokens"]["refresh"]["token"]
        .as_str()
        .unwrap_or_default();
    anyhow::ensure!(
        refresh.starts_with("pin_rt_") && refresh != stale_refresh,
        "the session was not replaced: {rewritten}"
    );

    // Pinniped's expired session Secret is collected, though Selkie cannot read it.
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let left = kubectl
            .secret_names(
                &namespace,
                "storage.pinniped.dev/request-id=0c2f3e74-9d3c-4b7e-8d0a-0d6c1f6f0a11",
            )
            .await?;
        anyhow::ensure!(left.is_empty(), "still there: {left:?}");
        Ok(())
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    Ok(())
}

/// The Concierge's half: Selkie's Concierge installed from `conf/install/concierge.yaml` over a
/// cluster where Pinniped's ran — its JWTAuthenticator, and its impersonation proxy's signer CA
/// (the Secret `pinniped-concierge-impersonation-proxy-signer-ca-certificate`, key in SEC1 as
/// Pinniped writes it). The CA is kept, not regenerated, so a client certificate Pinniped's
/// proxy issued (a user's cached credential) still works through Selkie's proxy, with its groups;
/// the JWTAuthenticator serves unchanged.
#[tokio::test]
async fn migration_from_pinniped_keeps_the_concierges_signer_and_cached_certificates_work(
) -> anyhow::Result<()> {
    use selkie_e2e::{concierge::InstalledConcierge, dex::Dex, pki::CertificateAuthority, Cluster};
    let cluster = Cluster::start().await?;
    let kubectl = cluster.kubectl();

    // Pinniped's signer CA, its key as Pinniped stores it (SEC1, "EC PRIVATE KEY").
    let ca = CertificateAuthority::new("Pinniped Impersonation Proxy Signer CA")?;
    let sec1 = {
        use pkcs8::DecodePrivateKey as _;
        p256::SecretKey::from_pkcs8_pem(&ca.key_pem())?.to_sec1_pem(pkcs8::LineEnding::LF)?
    };
    let leftovers = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pinniped-concierge"}},
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "pinniped-concierge-impersonation-proxy-signer-ca-certificate",
                      "namespace": "pinniped-concierge", "labels": {"app": "pinniped-concierge"}},
         "type": "Opaque",
         "data": {"ca.crt": B64.encode(ca.cert_pem()), "ca.key": B64.encode(sec1.as_bytes())}},
    ]});
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&leftovers.to_string()))
        .await?;
    // A user's credential cached from Pinniped's proxy: a client certificate of that CA.
    let cached = ca.issue_client("pinny@example.com", &["seals"])?;

    let concierge = InstalledConcierge::install(&cluster).await?;
    let dex = Dex::start(&[]).await?;
    concierge
        .apply_jwt_authenticator(&cluster, "dex", dex.issuer(), "pinniped-cli", &dex.ca_pem())
        .await?;
    let (endpoint, proxy_ca) = concierge.expose_proxy(&cluster).await?;
    crate::proxy_kubectl::grant_namespace_reading(&cluster, "seals").await?;

    let dir = tempfile::Builder::new()
        .prefix("selkie-migration-concierge-")
        .tempdir()?;
    let kubeconfig = dir.path().join("cached.kubeconfig");
    write_kubeconfig_for_user(
        &kubeconfig,
        &if endpoint.starts_with("https://") {
            endpoint.clone()
        } else {
            format!("https://{endpoint}")
        },
        &proxy_ca,
        "pinny",
        json!({"client-certificate-data": B64.encode(&cached.cert_pem),
               "client-key-data": B64.encode(&cached.key_pem)}),
    )?;
    let through_proxy = kubectl.with_kubeconfig(&kubeconfig);
    let user = selkie_e2e::eventually(Duration::from_secs(30), || async {
        let out = through_proxy.run(&["auth", "whoami", "-o", "json"]).await?;
        Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
    })
    .await
    .map_err(|e| crate::with_log(e, concierge.process().log()))?;
    anyhow::ensure!(user["username"] == "pinny@example.com", "{user}");
    anyhow::ensure!(
        user["groups"]
            .as_array()
            .is_some_and(|groups| groups.iter().any(|g| g == "seals")),
        "{user}"
    );
    through_proxy.run(&["get", "namespaces"]).await?;
    // The CA was kept as it was.
    let kept = kubectl
        .run(&[
            "get",
            "secret",
            "-n",
            "pinniped-concierge",
            "pinniped-concierge-impersonation-proxy-signer-ca-certificate",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ])
        .await?;
    anyhow::ensure!(
        B64.decode(kept.trim())? == ca.cert_pem().as_bytes(),
        "the signer CA was replaced"
    );
    let phase = kubectl
        .run(&["get", "jwtauthenticator", "dex", "-o", "jsonpath={.status.phase}"])
        .await?;
    anyhow::ensure!(phase == "Ready", "{phase}");
    Ok(())
}
