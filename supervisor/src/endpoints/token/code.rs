//! The authorization code grant: a code redeemed once, with its PKCE verifier and redirect URI; a
//! code redeemed twice ends its login (RFC 6749 §4.1.2), whatever the interleaving.

use std::{collections::HashMap, sync::Arc};

use time::OffsetDateTime;

use crate::endpoints::authorize::verifier_matches;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::{end_login, issue_tokens, other_client, param, store_failed, TokenClient};
use crate::endpoints::Endpoints;
use crate::issuer::Issuer;
use crate::session::storage::Resource;
use crate::session::store::StoreError;
use crate::session::tokens::Kind;

/// The authorization code grant.
pub(crate) async fn authorization_code(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
) -> Result<serde_json::Value, OAuthError> {
    let invalid = |hint: &str| OAuthError::new(Code::InvalidGrant, hint);
    let code = param(params, "code")?;
    let signature = issuer
        .token_key
        .signature_of(Kind::AuthorizationCode, code)
        .map_err(|_| {
            invalid("The authorization code is malformed or was not issued by this FederationDomain.")
        })?;
    let now = OffsetDateTime::now_utc();
    let Some((mut session, stored)) = endpoints
        .store
        .get(Resource::AuthCode, &signature)
        .await
        .map_err(|e| store_failed(&e))?
    else {
        return Err(invalid("The authorization code has expired or is unknown."));
    };
    if !session.code_active {
        // RFC 6749 §4.1.2: a code used twice revokes what it was redeemed for.
        revoke_replayed(endpoints, &session.request_id).await;
        return Err(invalid("The authorization code has already been used."));
    }
    if session.client_id != client.id {
        return Err(other_client());
    }
    if now.unix_timestamp() >= session.token_expires_at || session.expired_at(now) {
        return Err(invalid("The authorization code has expired."));
    }
    if param(params, "redirect_uri")? != session.redirect_uri {
        return Err(invalid(
            "The 'redirect_uri' parameter does not match the one of the authorization request.",
        ));
    }
    if !verifier_matches(&session.code_challenge, param(params, "code_verifier")?) {
        return Err(invalid(
            "The PKCE code challenge did not match the code verifier.",
        ));
    }
    // The tokens are stored first and the code marked used after, conditionally: whatever the
    // interleaving of two redemptions of one code, the loser either reads the code used — the
    // winner's tokens exist by then, and revoking the login ends them — or loses the conditional
    // update and revokes the login itself, the winner's tokens included.
    let body = issue_tokens(
        endpoints,
        issuer,
        session.clone(),
        true,
        client.id_token_lifetime,
        now,
    )
    .await?
    .body;
    session.code_active = false;
    match endpoints
        .store
        .update(Resource::AuthCode, &signature, stored, &session)
        .await
    {
        Ok(()) => Ok(body),
        Err(StoreError::Conflict) => {
            revoke_replayed(endpoints, &session.request_id).await;
            Err(invalid("The authorization code has already been used."))
        }
        Err(error) => {
            // The code stays redeemable and these tokens were never handed out: end them.
            revoke_replayed(endpoints, &session.request_id).await;
            Err(store_failed(&error))
        }
    }
}

/// Ends a login whose code was replayed ([`end_login`]), logging a failure.
pub(crate) async fn revoke_replayed(endpoints: &Endpoints, request_id: &str) {
    if let Err(error) = end_login(endpoints, request_id).await {
        tracing::error!(%error, "revoking the tokens of a replayed authorization code failed");
    }
}
