//! The garbage collector revokes the upstream token an expired session holds, proven against an
//! identity provider that supports RFC 7009 revocation (Keycloak; Dex has no revocation
//! endpoint): Keycloak reports the refresh token the Supervisor stored as active while the
//! session lives, and as inactive once the collector has deleted the session's Secret.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use selkie_e2e::{dex::DexUser, keycloak::Keycloak, supervisor::Supervisor, Cluster};
use serde_json::Value;

use crate::{
    supervisor_oauth::PASSWORD,
    supervisor_sessions::{expire_and_wait_for_collection, login, one_of, refresh, stored_session},
};

const IDP_NAME: &str = "Keycloak Users";

/// The upstream refresh token a stored session holds (the `refresh_token` of its `upstream`).
fn upstream_refresh_token(session: &Value) -> Option<String> {
    match session {
        Value::Object(members) => members
            .get("upstream")
            .and_then(|upstream| upstream["refresh_token"].as_str())
            .map(str::to_string)
            .or_else(|| members.values().find_map(upstream_refresh_token)),
        Value::Array(items) => items.iter().find_map(upstream_refresh_token),
        _ => None,
    }
}

#[tokio::test]
async fn collecting_an_expired_session_revokes_its_upstream_refresh_token() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-revoke").await?;
    let email = format!("{namespace}@example.com");
    let keycloak = Keycloak::start(&[DexUser {
        email: email.clone(),
        password: PASSWORD.into(),
        user_id: format!("id-{namespace}"),
        groups: vec!["seals".into()],
    }])
    .await?;
    let supervisor = Supervisor::start(cluster, &namespace, &keycloak, IDP_NAME).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);

    // A password login through Keycloak: the session holds Keycloak's refresh token.
    let tokens = login(&supervisor, IDP_NAME, &email)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let refresh_token = tokens["refresh_token"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(!refresh_token.is_empty(), "{tokens}");
    let id_claims = selkie_e2e::pinniped_cli::jwt_claims(tokens["id_token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(
        id_claims["username"] == email.as_str() && id_claims["groups"] == serde_json::json!(["seals"]),
        "{id_claims}"
    );
    let session = one_of(&secrets, "login").await?;
    let upstream = upstream_refresh_token(&stored_session(&session)?)
        .ok_or_else(|| anyhow::anyhow!("the session holds no upstream refresh token"))?;
    anyhow::ensure!(
        keycloak.is_active(&upstream).await?,
        "Keycloak does not know the stored refresh token"
    );

    // Collected: the Supervisor revoked it at Keycloak before deleting the Secret.
    let name = session.metadata.name.clone().unwrap_or_default();
    expire_and_wait_for_collection(cluster, &secrets, &namespace, &name).await?;
    anyhow::ensure!(
        !keycloak.is_active(&upstream).await?,
        "the upstream refresh token is still active after its session was collected\n{}",
        supervisor.log()
    );
    let (status, refused) = refresh(&supervisor, &refresh_token).await?;
    anyhow::ensure!(
        status == 400 && refused["error"] == "invalid_grant",
        "{status}: {refused}"
    );
    let metrics = supervisor.metrics().await?;
    let line = "selkie_supervisor_sessions_collected_total{outcome=\"deleted\"} 1";
    anyhow::ensure!(metrics.lines().any(|l| l == line), "{line} is not in\n{metrics}");
    let log = supervisor.log();
    for secret in [upstream.as_str(), refresh_token.as_str(), PASSWORD] {
        anyhow::ensure!(!log.contains(secret), "a secret is in the Supervisor's log");
    }
    Ok(())
}
