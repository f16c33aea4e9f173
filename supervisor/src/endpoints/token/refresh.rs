//! The refresh token grant: the upstream checked again (and the FederationDomain's transforms
//! run again), new tokens issued, the used refresh token kept marked rotated; a rotated token
//! presented again ends its whole login (RFC 9700 §4.14.2).

use std::{collections::HashMap, sync::Arc};

use time::OffsetDateTime;

use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::{end_login, issue_tokens, other_client, param, store_failed, TokenClient};
use crate::endpoints::Endpoints;
use crate::idp::transforms::Outcome;
use crate::idp::{Upstream, UpstreamFailure};
use crate::issuer::Issuer;
use crate::session::storage::Resource;
use crate::session::store::StoreError;
use crate::session::tokens::Kind;
use crate::session::Session;

/// The refresh token grant.
pub(crate) async fn refresh(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
) -> Result<serde_json::Value, OAuthError> {
    let invalid = |hint: &str| OAuthError::new(Code::InvalidGrant, hint);
    let token = param(params, "refresh_token")?;
    let signature = issuer
        .token_key
        .signature_of(Kind::RefreshToken, token)
        .map_err(|_| invalid("The refresh token is malformed or was not issued by this FederationDomain."))?;
    let now = OffsetDateTime::now_utc();
    let Some((mut session, stored)) = endpoints
        .store
        .get(Resource::RefreshToken, &signature)
        .await
        .map_err(|e| store_failed(&e))?
    else {
        return Err(invalid(
            "The refresh token has expired, was used already, or is unknown.",
        ));
    };
    if session.rotated {
        return Err(reused(endpoints, issuer, &session).await);
    }
    if session.client_id != client.id {
        return Err(other_client());
    }
    if session.expired_at(now) {
        return Err(invalid("The session has ended; log in again."));
    }
    if now.unix_timestamp() >= session.token_expires_at {
        return Err(invalid(
            "The session went unused for longer than its idle timeout; log in again.",
        ));
    }
    // The token's Secret is kept once used, marked rotated and emptied of upstream tokens, so
    // that its reuse is recognised.
    let rotated = session.rotated();
    // Nothing is rotated until the upstream agrees: a refusal or an outage there leaves this
    // token good for another try (as Pinniped's).
    upstream_refresh(endpoints, issuer, &mut session).await?;
    // The access token issued with this refresh token ends now.
    let revoked = match session.access_token_signature.take() {
        Some(access) => endpoints.store.delete(Resource::AccessToken, &access).await,
        None => endpoints
            .store
            .delete_login(Resource::AccessToken, &session.request_id)
            .await
            .map(drop),
    };
    revoked.map_err(|e| store_failed(&e))?;
    // The new tokens are stored first and this token marked rotated after, conditionally (as in
    // the code grant): whatever the interleaving of two uses of one refresh token, the second
    // either reads it rotated — the first's tokens exist by then, and ending the login ends
    // them — or loses the conditional update and ends the login itself.
    let issued = issue_tokens(
        endpoints,
        issuer,
        session.clone(),
        false,
        client.id_token_lifetime,
        now,
    )
    .await?;
    match endpoints
        .store
        .update(Resource::RefreshToken, &signature, stored, &rotated)
        .await
    {
        Ok(()) => {}
        Err(StoreError::Conflict) => return Err(reused(endpoints, issuer, &session).await),
        Err(error) => {
            // Nothing was rotated, so the client may try again with this token: the tokens it
            // never got go (best effort: unknown to anyone, they expire with the session).
            for (resource, signature) in &issued.signatures {
                if let Err(error) = endpoints.store.delete(*resource, signature).await {
                    tracing::warn!(%error, "deleting tokens that were never handed out failed");
                }
            }
            return Err(store_failed(&error));
        }
    }
    endpoints.audit.session_refreshed(&issuer.issuer, &session);
    Ok(issued.body)
}

/// A refresh token used a second time (RFC 9700 §4.14.2: stolen, or replayed): the whole login
/// ends ([`end_login`]), audited; returns the error to answer, `invalid_grant`.
pub(crate) async fn reused(endpoints: &Endpoints, issuer: &Issuer, session: &Session) -> OAuthError {
    endpoints.audit.refresh_token_reused(&issuer.issuer, session);
    if let Err(error) = end_login(endpoints, &session.request_id).await {
        tracing::error!(%error, "revoking the tokens of a reused refresh token failed");
        return store_failed(&error);
    }
    OAuthError::new(
        Code::InvalidGrant,
        "The refresh token was used already; every token of this login is revoked. Log in again.",
    )
}

/// Checks the user again at the upstream (see [`upstream_identity`]), then runs the
/// FederationDomain's identity transforms on what it says now: a policy may refuse the refresh,
/// the downstream username must not change, the downstream groups become what the transforms make
/// of the upstream's groups now.
pub(crate) async fn upstream_refresh(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    session: &mut Session,
) -> Result<(), OAuthError> {
    let denied =
        |hint: &str| OAuthError::new(Code::InvalidGrant, &format!("Upstream refresh failed. {hint}"));
    let Some((username, groups)) = upstream_identity(issuer, session).await? else {
        return Ok(());
    };
    let idp_name = session.upstream.idp_name.clone();
    match issuer.transform(&idp_name, &username, &groups) {
        Ok(Outcome::Allowed {
            username: downstream,
            groups: downstream_groups,
        }) => {
            if downstream != session.identity.username {
                return Err(denied("The username changed."));
            }
            session.identity.groups = downstream_groups;
        }
        Ok(Outcome::Rejected(message)) => {
            endpoints
                .audit
                .rejected_by_transforms(&issuer.issuer, &idp_name, &username, &message);
            return Err(denied(&format!(
                "Configured identity policy rejected this authentication: {message}."
            )));
        }
        Err(error) => {
            tracing::warn!(issuer = %issuer.issuer, idp = %idp_name, %error, "the identity transforms failed at a refresh");
            return Err(denied("The identity transformations failed."));
        }
    }
    session.upstream.username = Some(username);
    session.upstream.groups = Some(groups);
    Ok(())
}

/// Checks the user again at the upstream and returns their upstream username and groups now, or
/// `None` when the upstream said nothing new (a userinfo answer without the username claim).
/// LDAP and Active Directory: [`crate::idp::LdapUpstream::refresh`]. GitHub:
/// [`crate::idp::GitHubUpstream::refresh`], the username unchanged. OIDC: the upstream
/// refresh grant when the session holds an upstream refresh token, else the upstream's userinfo
/// endpoint with the upstream access token it holds; the upstream subject must be the same and
/// the upstream username unchanged; the additional claims become what the upstream says now.
/// An upstream that cannot be asked — unreachable, timed out, failing (5xx, 429), an LDAP
/// directory busy — is `temporarily_unavailable` (the refresh token was not rotated and may be
/// tried again: a client keeps its session through an outage), and everything else
/// `invalid_grant`.
pub(crate) async fn upstream_identity(
    issuer: &Arc<Issuer>,
    session: &mut Session,
) -> Result<Option<(String, Vec<String>)>, OAuthError> {
    let denied =
        |hint: &str| OAuthError::new(Code::InvalidGrant, &format!("Upstream refresh failed. {hint}"));
    // An upstream that could not be asked: the refresh token was not rotated; try again later.
    let unavailable = || {
        OAuthError::new(
            Code::TemporarilyUnavailable,
            "Upstream refresh failed. Reason: the upstream identity provider could not be reached or failed; try again later.",
        )
    };
    let failed = |idp: &str, failure: UpstreamFailure| match failure {
        UpstreamFailure::Unavailable(reason) => {
            tracing::warn!(issuer = %issuer.issuer, %idp, %reason, "the upstream refresh could not be checked");
            unavailable()
        }
        UpstreamFailure::Refused(reason) => {
            tracing::info!(issuer = %issuer.issuer, %idp, %reason, "upstream refresh refused");
            denied(&reason)
        }
    };
    let Some(idp) = issuer.idp(Some(&session.upstream.idp_name), Some(&session.upstream.idp_type)) else {
        return Err(denied("The identity provider of this session no longer exists."));
    };
    // The upstream username of the login (sessions stored before transforms existed kept only
    // the downstream one, which was the same).
    let upstream_username = session
        .upstream
        .username
        .clone()
        .unwrap_or_else(|| session.identity.username.clone());
    let oidc = match idp.as_ref() {
        Upstream::Oidc(oidc) => oidc,
        Upstream::Ldap(ldap) => {
            let groups = ldap
                .refresh(&session.upstream)
                .await
                .map_err(|failure| failed(&ldap.display_name, failure))?;
            return Ok(Some((upstream_username, groups)));
        }
        Upstream::GitHub(github) => {
            let (username, groups) = github
                .refresh(&session.upstream, &session.identity.subject)
                .await
                .map_err(|failure| failed(&github.display_name, failure))?;
            if username != upstream_username {
                return Err(denied("The username changed."));
            }
            return Ok(Some((username, groups)));
        }
    };
    if oidc.provider.discovery.issuer != session.upstream.issuer {
        return Err(denied("The identity provider's issuer changed."));
    }
    let refused = |error: selkie_oidc::rp::OidcError| {
        if error.is_retryable() {
            tracing::warn!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "the upstream refresh could not be checked");
            return unavailable();
        }
        tracing::info!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "upstream refresh refused");
        denied("The upstream identity provider refused the refresh.")
    };
    let claims = match (&session.upstream.refresh_token, &session.upstream.access_token) {
        (Some(refresh_token), _) => {
            let tokens = oidc
                .provider
                .refresh(&oidc.client, refresh_token)
                .await
                .map_err(refused)?;
            if let Some(refresh) = tokens.refresh {
                session.upstream.refresh_token = Some(refresh.token);
            }
            tokens.id.map(|id_token| id_token.claims)
        }
        (None, Some(access_token)) => Some(oidc.provider.userinfo(access_token).await.map_err(refused)?),
        // Without either there is nothing to check the user against.
        (None, None) => return Err(denied("The session holds no upstream token; log in again.")),
    };
    let Some(claims) = claims else {
        return Ok(None);
    };
    if claims.get("sub").and_then(|sub| sub.as_str()) != Some(session.upstream.subject.as_str()) {
        return Err(denied("The upstream subject changed."));
    }
    let has_username = oidc
        .username_claim
        .as_deref()
        .is_none_or(|claim| claims.contains_key(claim));
    if !has_username {
        // A userinfo answer need not repeat every claim; what it leaves out stays as it was.
        return Ok(None);
    }
    let (identity, _) = oidc.identity(&claims).map_err(|reason| denied(&reason))?;
    if identity.username != upstream_username {
        return Err(denied("The username changed."));
    }
    session.identity.additional_claims = identity.additional_claims;
    // An absent groups claim is no groups (Dex leaves an empty one out): fail closed.
    Ok(Some((identity.username, identity.groups)))
}
