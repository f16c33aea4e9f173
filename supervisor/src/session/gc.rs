//! The session garbage collector: the leader's periodic sweep that deletes the storage Secrets
//! whose `storage.pinniped.dev/garbage-collect-after` time has passed, revoking first (RFC 7009)
//! the upstream OIDC token an expired session still holds, as Pinniped's collector does.
//!
//! Which stored session holds the latest upstream token (only that one is revoked, once): an
//! authorization code never redeemed; an access token whose login was not granted
//! `offline_access` (so it has no refresh token); every refresh token (a refresh writes a new
//! one and deletes the old). A revocation that may succeed later (the upstream unreachable or
//! answering 429 or 5xx) keeps the Secret for the next sweep, for at most
//! [`RETRY_REVOCATION_FOR`] past its collection time; any other failure (the upstream refused,
//! or its identity provider resource is gone) is logged and the Secret is deleted anyway.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use selkie_oidc::rp::TokenTypeHint;
use time::OffsetDateTime;

use crate::idp::{OidcUpstream, Upstream};
use crate::issuer::Issuers;
use crate::session::storage::{garbage_collect_after, Resource};
use crate::session::store::{Store, StoreError};
use crate::session::Session;

/// How often the leader sweeps.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// How long past its collection time a Secret is kept while its upstream revocation may still
/// succeed (Pinniped: four hours).
pub(crate) const RETRY_REVOCATION_FOR: time::Duration = time::Duration::hours(4);

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// Secrets deleted.
    pub deleted: usize,
    /// Upstream tokens revoked.
    pub revoked: usize,
    /// Secrets kept to retry their revocation.
    pub retrying: usize,
    /// Revocations that failed for good (the Secret was deleted anyway).
    pub failed: usize,
}

/// The upstream token the deletion of an expired `resource` Secret holding `session` must
/// revoke, by the rules in the module's documentation; `None` when another Secret of the same
/// login holds the latest one or there is none.
pub(crate) fn token_to_revoke(resource: Resource, session: &Session) -> Option<(&str, TokenTypeHint)> {
    let holds_latest = match resource {
        Resource::AuthCode => session.code_active,
        Resource::AccessToken => !session.scopes.iter().any(|scope| scope == "offline_access"),
        Resource::RefreshToken => true,
        Resource::Pkce | Resource::Oidc => false,
    };
    if !holds_latest || session.upstream.idp_type != "oidc" {
        return None;
    }
    let upstream = &session.upstream;
    match (&upstream.refresh_token, &upstream.access_token) {
        (Some(token), _) => Some((token.as_str(), TokenTypeHint::RefreshToken)),
        (None, Some(token)) => Some((token.as_str(), TokenTypeHint::AccessToken)),
        (None, None) => None,
    }
}

/// Why a revocation did not happen.
pub(crate) enum RevokeFailure {
    /// Trying again later may help.
    Retryable(String),
    /// It never will.
    Final(String),
}

impl std::fmt::Display for RevokeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Retryable(message) | Self::Final(message) => f.write_str(message),
        }
    }
}

/// One sweep at `now`: lists the expired storage Secrets (one list call), revokes what they
/// hold upstream, deletes them (each only if unchanged since listed). Fails only when the list
/// fails; a failed deletion is logged and retried by the next sweep.
pub async fn sweep(store: &Store, issuers: &Issuers, now: OffsetDateTime) -> Result<Sweep, StoreError> {
    let mut sweep = Sweep::default();
    for secret in store.collectable(now).await? {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let label = crate::session::storage::type_label(&secret);
        match revoke_upstream(issuers, &secret, &label).await {
            Ok(true) => sweep.revoked += 1,
            Ok(false) => {}
            Err(RevokeFailure::Retryable(reason))
                if garbage_collect_after(&secret).is_some_and(|after| after + RETRY_REVOCATION_FOR > now) =>
            {
                tracing::warn!(secret = %name, storage_type = %label, %reason, "revoking the upstream token failed; the session is kept to try again");
                sweep.retrying += 1;
                continue;
            }
            Err(RevokeFailure::Retryable(reason) | RevokeFailure::Final(reason)) => {
                tracing::warn!(secret = %name, storage_type = %label, %reason, "revoking the upstream token failed; the session is deleted anyway");
                sweep.failed += 1;
            }
        }
        match store.delete_unchanged(&secret).await {
            Ok(true) => {
                tracing::info!(secret = %name, storage_type = %label, "expired session storage deleted");
                sweep.deleted += 1;
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(secret = %name, %error, "deleting expired session storage failed"),
        }
    }
    Ok(sweep)
}

/// Revokes the upstream token `secret` (of storage type `label`) must revoke. `Ok(true)` when
/// one was revoked, `Ok(false)` when there was none to revoke or the upstream has no revocation
/// endpoint.
async fn revoke_upstream(issuers: &Issuers, secret: &Secret, label: &str) -> Result<bool, RevokeFailure> {
    let Some(resource) = Resource::from_label(label) else {
        return Err(RevokeFailure::Final(format!("unknown storage type {label:?}")));
    };
    if matches!(resource, Resource::Pkce | Resource::Oidc) {
        return Ok(false);
    }
    let data = resource
        .read_secret(secret)
        .map_err(|error| RevokeFailure::Final(error.to_string()))?;
    let session: Session = serde_json::from_value(data).map_err(|error| {
        RevokeFailure::Final(format!(
            "the stored session cannot be read: {}",
            selkie_api::json::error_without_values(&error)
        ))
    })?;
    revoke_upstream_of(issuers, resource, &session).await
}

/// Revokes the upstream token the `resource` Secret holding `session` must revoke
/// ([`token_to_revoke`]) at its OIDC identity provider: `Ok(true)` when one was revoked,
/// `Ok(false)` when there was none to revoke or the upstream has no revocation endpoint.
pub(crate) async fn revoke_upstream_of(
    issuers: &Issuers,
    resource: Resource,
    session: &Session,
) -> Result<bool, RevokeFailure> {
    let Some((token, hint)) = token_to_revoke(resource, session) else {
        return Ok(false);
    };
    let Some(oidc) = find_oidc(
        issuers,
        &session.upstream.provider_name,
        &session.upstream.provider_uid,
    ) else {
        return Err(RevokeFailure::Final(format!(
            "no OIDCIdentityProvider named {:?} with UID {:?} is in use",
            session.upstream.provider_name, session.upstream.provider_uid
        )));
    };
    match oidc.provider.revoke(&oidc.client, token, hint).await {
        Ok(revoked) => {
            if revoked {
                tracing::info!(idp = %session.upstream.provider_name, token_type = hint.as_str(), "upstream token revoked");
            }
            Ok(revoked)
        }
        Err(error) if error.is_retryable() => Err(RevokeFailure::Retryable(error.to_string())),
        Err(error) => Err(RevokeFailure::Final(error.to_string())),
    }
}

/// The OIDC upstream of resource `name` and `uid` in any FederationDomain.
fn find_oidc<'a>(issuers: &'a Issuers, name: &str, uid: &str) -> Option<&'a OidcUpstream> {
    if name.is_empty() {
        return None;
    }
    issuers
        .all()
        .flat_map(|issuer| issuer.idps.iter())
        .find_map(|idp| match idp.as_ref() {
            Upstream::Oidc(oidc) if oidc.resource_name == name && oidc.resource_uid == uid => Some(oidc),
            Upstream::Oidc(_) | Upstream::Ldap(_) | Upstream::GitHub(_) => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{Identity, Upstream as SessionUpstream};

    fn session(scopes: &[&str], code_active: bool, refresh: Option<&str>, access: Option<&str>) -> Session {
        Session {
            request_id: "3f0c1f6e-52f4-4c39-9c3e-6a1f1a0e8a11".into(),
            client_id: "pinniped-cli".into(),
            redirect_uri: "http://127.0.0.1/callback".into(),
            scopes: scopes.iter().map(|scope| scope.to_string()).collect(),
            nonce: None,
            code_challenge: String::new(),
            requested_at: 0,
            auth_time: 0,
            expires_at: 0,
            code_active,
            token_expires_at: 0,
            identity: Identity {
                subject: "sub".into(),
                username: "user".into(),
                groups: Vec::new(),
                additional_claims: Default::default(),
            },
            upstream: SessionUpstream {
                idp_name: "Dex".into(),
                idp_type: "oidc".into(),
                provider_name: "dex".into(),
                provider_uid: "uid".into(),
                issuer: "https://dex.example".into(),
                subject: "upstream-sub".into(),
                refresh_token: refresh.map(str::to_string),
                access_token: access.map(str::to_string),
                ldap: None,
                username: None,
                groups: None,
            },
            access_token_signature: None,
            rotated: false,
        }
    }

    #[test]
    fn only_the_secret_holding_the_latest_upstream_token_revokes_it() {
        let offline = session(&["openid", "offline_access"], true, Some("rt"), None);
        assert_eq!(
            token_to_revoke(Resource::AuthCode, &offline),
            Some(("rt", TokenTypeHint::RefreshToken))
        );
        assert_eq!(
            token_to_revoke(Resource::RefreshToken, &offline),
            Some(("rt", TokenTypeHint::RefreshToken))
        );
        // The login has a refresh token: its refresh-token Secret holds the latest upstream token.
        assert_eq!(token_to_revoke(Resource::AccessToken, &offline), None);
        // A redeemed code's tokens moved on.
        let redeemed = session(&["openid", "offline_access"], false, Some("rt"), None);
        assert_eq!(token_to_revoke(Resource::AuthCode, &redeemed), None);
        for resource in [Resource::Pkce, Resource::Oidc] {
            assert_eq!(token_to_revoke(resource, &offline), None);
        }
    }

    #[test]
    fn without_offline_access_the_access_token_secret_revokes_the_upstream_access_token() {
        let online = session(&["openid"], false, None, Some("at"));
        assert_eq!(
            token_to_revoke(Resource::AccessToken, &online),
            Some(("at", TokenTypeHint::AccessToken))
        );
        let nothing = session(&["openid"], true, None, None);
        assert_eq!(token_to_revoke(Resource::AuthCode, &nothing), None);
        let mut ldap = session(&["openid"], true, Some("rt"), None);
        ldap.upstream.idp_type = "ldap".into();
        assert_eq!(token_to_revoke(Resource::AuthCode, &ldap), None);
    }

    #[test]
    fn every_storage_label_names_its_resource() {
        for resource in Resource::ALL {
            assert_eq!(Resource::from_label(resource.as_str()), Some(resource));
        }
        assert_eq!(Resource::from_label("upstream-state"), None);
    }
}
