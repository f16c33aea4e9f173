//! Session terms, Selkie's extension to FederationDomain (Pinniped #1004, #2104): how long a
//! Supervisor session lasts from its login and how long it may go without a refresh, set by the
//! admin per FederationDomain (and per identity provider), listed in the identity-provider
//! discovery, kept by each login for its whole session. Against slapd and kube-apiserver, with
//! the Supervisor's wall clock moved by libfaketime ([`TestClock`]) instead of hours waited out.
//! (The harness's certificates last 24 hours, so the clock moves 18 hours at most.)

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{api::ListParams, Api};
use selkie_e2e::{
    clock::TestClock,
    ldap::{LdapUser, Slapd},
    pinniped_cli,
    supervisor::Supervisor,
    Cluster,
};
use serde_json::{json, Value};
use time::OffsetDateTime;

use super::supervisor_sessions::{refresh, stored_session, stored_tokens};
use super::supervisor_transforms::{condition_when, patch_federation_domain};

const IDP: &str = "Corp LDAP";
const PASSWORD: &str = "seal-of-approval";
const HOUR: Duration = Duration::from_secs(3600);

/// The session terms the identity-provider discovery lists for [`IDP`].
async fn discovered_terms(supervisor: &Supervisor) -> anyhow::Result<Value> {
    let url = format!("{}/v1alpha1/pinniped_identity_providers", supervisor.issuer());
    let body = supervisor.client()?.get_json(&url, 64 * 1024, None).await?;
    let discovery: Value = serde_json::from_slice(&body)?;
    Ok(discovery["pinniped_identity_providers"][0]["sessions"].clone())
}

/// A cli_password login of pinny: its refresh token.
async fn login(supervisor: &Supervisor) -> anyhow::Result<String> {
    let tokens = pinniped_cli::login(&supervisor.client()?, supervisor.issuer(), IDP, "pinny", PASSWORD)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let refresh_token = tokens["refresh_token"].as_str().unwrap_or_default();
    anyhow::ensure!(!refresh_token.is_empty(), "{tokens}");
    Ok(refresh_token.to_string())
}

/// A refresh that must succeed: the new refresh token.
async fn refreshed(supervisor: &Supervisor, refresh_token: &str) -> anyhow::Result<String> {
    let (status, answer) = refresh(supervisor, refresh_token).await?;
    anyhow::ensure!(status == 200, "refresh: {status}: {answer}\n{}", supervisor.log());
    Ok(answer["refresh_token"].as_str().unwrap_or_default().to_string())
}

/// A refresh that must be refused with `invalid_grant` saying `why`.
async fn refused(supervisor: &Supervisor, refresh_token: &str, why: &str) -> anyhow::Result<()> {
    let (status, answer) = refresh(supervisor, refresh_token).await?;
    anyhow::ensure!(
        status == 400
            && answer["error"] == "invalid_grant"
            && answer["error_description"]
                .as_str()
                .unwrap_or_default()
                .contains(why),
        "expected invalid_grant ({why}): {status}: {answer}"
    );
    Ok(())
}

/// `kubectl patch` of the FederationDomain with `patch` (`type_`: merge or json).
async fn patch(cluster: &Cluster, namespace: &str, type_: &str, patch: Value) -> anyhow::Result<String> {
    Ok(patch_federation_domain(cluster, namespace, type_, &patch.to_string()).await?)
}

/// The discovery's terms for [`IDP`] once they are `expected` (within 60 s).
async fn discovered_when(supervisor: &Supervisor, expected: &Value) -> anyhow::Result<()> {
    selkie_e2e::eventually(Duration::from_secs(60), || async {
        let terms = discovered_terms(supervisor).await?;
        anyhow::ensure!(&terms == expected, "discovery lists {terms}, not {expected}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn ldap_sessions_last_as_long_as_the_federation_domain_says_and_end_when_unused() -> anyhow::Result<()>
{
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster
        .create_namespace(&client, "supervisor-session-terms")
        .await?;
    let slapd = Slapd::start(&[LdapUser {
        uid: "pinny".into(),
        password: PASSWORD.into(),
        uid_number: 1001,
        groups: vec!["seals".into()],
    }])
    .await?;
    let clock = TestClock::new()?;
    let supervisor = Supervisor::start_with_clock(cluster, &namespace, &slapd, IDP, &clock).await?;

    // 1. Pinniped's terms by default: 9 hours, no idle limit.
    discovered_when(&supervisor, &json!({"max_lifetime": "9h"})).await?;
    let pinnipeds = login(&supervisor).await?;

    // 2. The admin gives sessions a working week, ending any that go 8 hours without a refresh.
    patch(
        cluster,
        &namespace,
        "merge",
        json!({"spec": {"sessions": {"maxLifetime": "120h", "idleTimeout": "8h"}}}),
    )
    .await?;
    discovered_when(
        &supervisor,
        &json!({"max_lifetime": "120h", "idle_timeout": "8h"}),
    )
    .await?;
    condition_when(cluster, &namespace, "SessionsValid", |c| c["status"] == "True").await?;
    let login_time = OffsetDateTime::now_utc().unix_timestamp();
    let mut week = login(&supervisor).await?;

    // The new login's stored session ends in 120 h, its refresh token in 8; its Secret is kept
    // (for reuse detection) until the session ends.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let login_secrets = secrets
        .list(&ListParams::default().labels("storage.pinniped.dev/type=login"))
        .await?
        .items;
    let mut ends = Vec::new();
    for secret in &login_secrets {
        let session = stored_session(secret)?;
        let issued_at: i64 = stored_tokens(secret)
            .get(1)
            .and_then(|issued| issued.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("a login Secret without its tokens"))?;
        let session_end = session["expires_at"].as_i64().unwrap_or_default();
        let refresh_end = session["idle_timeout"]
            .as_i64()
            .map_or(session_end, |idle| (issued_at + idle).min(session_end));
        let collect_after = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get("storage.pinniped.dev/garbage-collect-after"))
            .cloned()
            .unwrap_or_default();
        let collect_after =
            OffsetDateTime::parse(&collect_after, &time::format_description::well_known::Rfc3339)?
                .unix_timestamp();
        ends.push((
            session_end - login_time,
            refresh_end - login_time,
            collect_after - login_time,
            session["request_id"].as_str().unwrap_or_default().to_string(),
        ));
    }
    ends.sort();
    let near = |seconds: i64, hours: i64| (hours * 3600 - 120..=hours * 3600 + 120).contains(&seconds);
    anyhow::ensure!(
        ends.len() == 2
            && near(ends[0].0, 9)
            && near(ends[0].1, 9)
            && near(ends[0].2, 9)
            && near(ends[1].0, 120)
            && near(ends[1].1, 8)
            && near(ends[1].2, 120),
        "(session end, refresh token end, collection) after the login, in seconds: {ends:?}"
    );

    // 3. Five hours on (the Supervisor's clock), the week-long session refreshes: its idle limit
    //    starts again.
    clock.advance(5 * HOUR)?;
    week = refreshed(&supervisor, &week).await?;

    // 4. Nine and a half hours after the logins: Pinniped's session has ended and the collector
    //    deletes its Secret; the week-long one refreshes past the 9-hour mark.
    clock.advance(HOUR * 9 / 2)?;
    let pinnipeds_login = format!("storage.pinniped.dev/request-id={}", ends[0].3);
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let left = secrets
            .list(&ListParams::default().labels(&pinnipeds_login))
            .await?
            .items;
        anyhow::ensure!(
            left.is_empty(),
            "{} Secrets of the ended session are left",
            left.len()
        );
        Ok(())
    })
    .await?;
    refused(&supervisor, &pinnipeds, "The refresh token has expired").await?;
    week = refreshed(&supervisor, &week).await?;

    // 5. Eight and a half hours without a refresh: beyond the idle limit, the session has ended.
    clock.advance(HOUR * 17 / 2)?;
    refused(&supervisor, &week, "idle timeout").await?;
    login(&supervisor).await?;

    // 6. Terms out of bounds: kube-apiserver refuses them at the door, the served ones stay.
    for (sessions, says) in [
        (
            json!({"maxLifetime": "1000h"}),
            "maxLifetime must be from 5m to 720h",
        ),
        (json!({"maxLifetime": "a week"}), "spec.sessions.maxLifetime"),
        (
            json!({"idleTimeout": "30s"}),
            "idleTimeout must be from 1m to 720h",
        ),
        (
            json!({"maxLifetime": "8h", "idleTimeout": "9h"}),
            "idleTimeout must not be longer than maxLifetime",
        ),
    ] {
        let refused = patch(
            cluster,
            &namespace,
            "merge",
            json!({"spec": {"sessions": sessions}}),
        )
        .await;
        anyhow::ensure!(
            refused.as_ref().is_err_and(|e| format!("{e:#}").contains(says)),
            "{sessions}: {refused:?}"
        );
    }
    discovered_terms(&supervisor).await.and_then(|terms| {
        anyhow::ensure!(
            terms == json!({"max_lifetime": "120h", "idle_timeout": "8h"}),
            "{terms}"
        );
        Ok(())
    })?;

    // 7. A provider's idle limit beyond the FederationDomain's maximum passes the schema; the
    //    controller names it in SessionsValid and does not serve terms the admin did not ask for.
    patch(
        cluster,
        &namespace,
        "json",
        json!([{"op": "add", "path": "/spec/identityProviders/0/sessions", "value": {"idleTimeout": "200h"}}]),
    )
    .await?;
    let condition = condition_when(cluster, &namespace, "SessionsValid", |c| c["status"] == "False").await?;
    anyhow::ensure!(
        condition["reason"] == "InvalidSessions"
            && condition["message"]
                .as_str()
                .unwrap_or_default()
                .contains("spec.identityProviders[0].sessions.idleTimeout: \"200h\" is out of range: it must be from 1m to 120h"),
        "{condition}"
    );
    // The provider's own terms, within bounds, override the FederationDomain's.
    patch(
        cluster,
        &namespace,
        "json",
        json!([{"op": "replace", "path": "/spec/identityProviders/0/sessions", "value": {"maxLifetime": "40h"}}]),
    )
    .await?;
    discovered_when(&supervisor, &json!({"max_lifetime": "40h", "idle_timeout": "8h"})).await?;
    condition_when(cluster, &namespace, "SessionsValid", |c| c["status"] == "True").await?;
    login(&supervisor).await?;
    Ok(())
}
