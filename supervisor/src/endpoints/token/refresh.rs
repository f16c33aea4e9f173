//! The refresh token grant: the upstream checked again (and the FederationDomain's transforms
//! run again), new tokens issued, the used refresh token kept marked rotated; a rotated token
//! presented again ends its whole login (RFC 9700 §4.14.2). A login bound to a DPoP key
//! needs a proof by that key ([`RequestProof::continue_session`]), checked before anything
//! else of the login: a refused request rotates nothing and is no reuse.

use std::{collections::HashMap, sync::Arc};

use time::OffsetDateTime;

use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::dpop::RequestProof;
use crate::endpoints::token::{
    end, end_earlier, mint_tokens, other_client, param, read_login, store_failed, token_response, TokenClient,
};
use crate::endpoints::Endpoints;
use crate::idp::transforms::Outcome;
use crate::idp::{Upstream, UpstreamFailure};
use crate::issuer::Issuer;
use crate::session::login::{self, CodeState, Login};
use crate::session::storage::Resource;
use crate::session::store::StoreError;
use crate::session::tokens::{Kind, LoginRef};
use crate::session::{self, Session};

/// The refresh token grant, with the request's DPoP `proof`.
pub(crate) async fn refresh(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
    proof: &mut RequestProof,
) -> Result<serde_json::Value, OAuthError> {
    let token = param(params, "refresh_token")?;
    let checked = issuer
        .token_key
        .check(Kind::RefreshToken, token)
        .map_err(|_| invalid("The refresh token is malformed or was not issued by this FederationDomain."))?;
    let now = OffsetDateTime::now_utc();
    match checked.login {
        Some(login) => refresh_login(endpoints, issuer, client, proof, login, &checked.signature, now).await,
        None => refresh_earlier(endpoints, issuer, client, proof, &checked.signature, now).await,
    }
}

fn invalid(hint: &str) -> OAuthError {
    OAuthError::new(Code::InvalidGrant, hint)
}

fn unknown() -> OAuthError {
    invalid("The refresh token has expired, was used already, or is unknown.")
}

/// The checks every refresh makes of the session it continues, after the token's: the client,
/// the session's end, the refresh token's idle expiry (`refresh_expires_at`, unix seconds).
fn session_allows(
    session: &Session,
    client: &TokenClient,
    refresh_expires_at: i64,
    now: OffsetDateTime,
) -> Result<(), OAuthError> {
    if session.client_id != client.id {
        return Err(other_client());
    }
    if session.expired_at(now) {
        return Err(invalid("The session has ended; log in again."));
    }
    if now.unix_timestamp() >= refresh_expires_at {
        return Err(invalid(
            "The session went unused for longer than its idle timeout; log in again.",
        ));
    }
    Ok(())
}

/// A refresh of a login stored in one Secret: one read, the upstream asked, one conditional
/// write of the next generation of tokens (and of what the upstream said). Whatever the
/// interleaving of two uses of one refresh token, one of them writes first and the other finds
/// the login changed (its write refused, or its read already of the next generation): that is
/// a reused token, and the login ends.
async fn refresh_login(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    proof: &mut RequestProof,
    token: LoginRef,
    signature: &str,
    now: OffsetDateTime,
) -> Result<serde_json::Value, OAuthError> {
    let (mut login, stored) = read_login(endpoints, &token.id, unknown).await?;
    // Before the reuse check: a token without its key ends no login.
    proof.continue_session(&endpoints.dpop_proofs, issuer, client, login.dpop_jkt.as_deref())?;
    let Some(tokens) = login.tokens.clone() else {
        return Err(unknown());
    };
    if token.generation < tokens.generation {
        return Err(reused(endpoints, issuer, Ending::Login(&login)).await);
    }
    if !tokens.is_refresh(token, signature) || !login.session.has_scope("offline_access") {
        return Err(unknown());
    }
    session_allows(
        &login.session,
        client,
        login.session.refresh_token_expires_at(tokens.issued()),
        now,
    )?;
    // Nothing is rotated until the upstream agrees: a refusal or an outage there leaves this
    // token good for another try (as Pinniped's).
    upstream_refresh(endpoints, issuer, &mut login.session).await?;
    let next = mint_tokens(issuer, token.id, tokens.generation.saturating_add(1), now)?;
    login.tokens = Some(next.record.clone());
    match endpoints.store.replace_login(stored, &login).await {
        Ok(()) => {}
        Err(StoreError::Conflict) => return Err(reused(endpoints, issuer, Ending::Login(&login)).await),
        Err(StoreError::Gone) => return Err(unknown()),
        Err(error) => return Err(store_failed(&error)),
    }
    endpoints.audit.session_refreshed(&issuer.issuer, &login.session);
    token_response(
        issuer,
        &login.session,
        next,
        false,
        login.dpop_jkt.is_some(),
        client.id_token_lifetime,
        now,
    )
}

/// A refresh with a token of the earlier format (a Secret per token in Pinniped's layout, as
/// Selkie stored them before one Secret per login): checked as it was stored, then carried over:
/// the session becomes a login of its own Secret holding the new tokens, and the used token's
/// Secret is kept marked rotated (so that its reuse ends the login, the new Secret included).
async fn refresh_earlier(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    proof: &mut RequestProof,
    signature: &str,
    now: OffsetDateTime,
) -> Result<serde_json::Value, OAuthError> {
    let Some((mut session, stored)) = endpoints
        .store
        .get(Resource::RefreshToken, signature)
        .await
        .map_err(|e| store_failed(&e))?
    else {
        return Err(unknown());
    };
    // Never bound (stored before DPoP): refused to the CLI while DPoP is on.
    proof.continue_session(&endpoints.dpop_proofs, issuer, client, None)?;
    if session.rotated {
        return Err(reused(endpoints, issuer, Ending::Earlier(&session)).await);
    }
    session_allows(&session, client, session.token_expires_at, now)?;
    let rotated = session.rotated();
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
    let earlier_id = session.request_id.clone();
    let id = login::id_for_earlier(&earlier_id);
    session.request_id = session::uuid_text(&id);
    session.code_active = false;
    session.rotated = false;
    let next = mint_tokens(issuer, id, 1, now)?;
    let login = Login {
        session,
        code: CodeState::Used,
        tokens: Some(next.record.clone()),
        migrated_from: Some(earlier_id),
        // Logins of the earlier format were never bound.
        dpop_jkt: None,
    };
    // The login's Secret is written first and this token marked rotated after, conditionally:
    // of two uses of one token, the second finds the token rotated, or the login's Secret
    // there (its name is the login's), or loses the conditional update — and ends the login.
    match endpoints.store.create_login(&login, now).await {
        Ok(()) => {}
        Err(StoreError::Conflict) => return Err(reused(endpoints, issuer, Ending::Login(&login)).await),
        Err(error) => return Err(store_failed(&error)),
    }
    match endpoints
        .store
        .update(Resource::RefreshToken, signature, stored, &rotated)
        .await
    {
        Ok(()) => {}
        Err(StoreError::Conflict) => return Err(reused(endpoints, issuer, Ending::Login(&login)).await),
        Err(error) => {
            // Nothing was rotated, so the client may try again with this token: the login's
            // Secret, whose tokens it never got, goes.
            if let Err(error) = endpoints.store.delete_login_secret(&id).await {
                tracing::warn!(%error, "deleting tokens that were never handed out failed");
            }
            return Err(store_failed(&error));
        }
    }
    endpoints.audit.session_refreshed(&issuer.issuer, &login.session);
    token_response(
        issuer,
        &login.session,
        next,
        false,
        false,
        client.id_token_lifetime,
        now,
    )
}

/// A login to end: one of its own Secret, or one of the earlier format (by request ID).
pub(crate) enum Ending<'a> {
    /// A login in its own Secret.
    Login(&'a Login),
    /// A login of the earlier format: the session of one of its Secrets.
    Earlier(&'a Session),
}

/// A refresh token used a second time (RFC 9700 §4.14.2: stolen, or replayed): the whole login
/// ends ([`end`] or [`end_earlier`]), audited; returns the error to answer, `invalid_grant`.
pub(crate) async fn reused(endpoints: &Endpoints, issuer: &Issuer, login: Ending<'_>) -> OAuthError {
    let (session, ended) = match login {
        Ending::Login(login) => (&login.session, end(endpoints, login).await),
        Ending::Earlier(session) => (session, end_earlier(endpoints, &session.request_id).await),
    };
    endpoints.audit.refresh_token_reused(&issuer.issuer, session);
    if let Err(error) = ended {
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
/// [`crate::idp::GitHubUpstream::refresh`], the username unchanged. SAML: what the session keeps,
/// the identity provider's entity ID unchanged. OIDC: the upstream
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
        // SAML has nothing to ask the identity provider again: the session keeps what the
        // assertion said, and ends when the identity provider said it must (its
        // `SessionNotOnOrAfter`, applied at the login). The identity provider must still be the
        // one that made the assertion.
        Upstream::Saml(saml) => {
            if saml.metadata.entity_id != session.upstream.issuer {
                return Err(denied("The identity provider's entity ID changed."));
            }
            let groups = session.upstream.groups.clone().unwrap_or_default();
            return Ok(Some((upstream_username, groups)));
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
