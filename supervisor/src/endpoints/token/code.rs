//! The authorization code grant: a code redeemed once, with its PKCE verifier and redirect URI; a
//! code redeemed twice ends its login (RFC 6749 §4.1.2), whatever the interleaving.
//!
//! One request to kube-apiserver: a JSON Patch of the login's Secret whose `test` operation
//! holds only while the code is unused and was issued to this client for this redirect URI and
//! PKCE challenge, and which marks it used and records the new tokens in the same atomic write.
//! Only when the patch is refused is the login read, to say why.

use std::{collections::HashMap, sync::Arc};

use time::OffsetDateTime;

use crate::endpoints::authorize::{challenge_of, verifier_matches};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::{
    end, mint_tokens, other_client, param, read_login, store_failed, token_response, TokenClient,
};
use crate::endpoints::Endpoints;
use crate::issuer::Issuer;
use crate::session::login::{self, CodeState, Login};
use crate::session::store::StoreError;
use crate::session::tokens::Kind;

/// The authorization code grant; with `dpop_jkt` (the thumbprint of the request's DPoP proof's
/// key, [`crate::endpoints::token::dpop::RequestProof::login_binding`]) the login is bound to
/// that key in the same write that redeems the code, and its tokens are of type `DPoP`.
pub(crate) async fn authorization_code(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
    dpop_jkt: Option<&str>,
) -> Result<serde_json::Value, OAuthError> {
    let invalid = |hint: &str| OAuthError::new(Code::InvalidGrant, hint);
    let unknown = || invalid("The authorization code has expired or is unknown.");
    let pkce_mismatch = || invalid("The PKCE code challenge did not match the code verifier.");
    let code = param(params, "code")?;
    let checked = issuer
        .token_key
        .check(Kind::AuthorizationCode, code)
        .map_err(|_| {
            invalid("The authorization code is malformed or was not issued by this FederationDomain.")
        })?;
    // A code of the earlier format (issued before an upgrade, ten minutes at most) is not
    // redeemed: its client starts the login again.
    let Some(code_of) = checked.login else {
        return Err(unknown());
    };
    let redirect_uri = param(params, "redirect_uri")?;
    let verifier = param(params, "code_verifier")?;
    let Some(challenge) = challenge_of(verifier) else {
        return Err(pkce_mismatch());
    };
    let now = OffsetDateTime::now_utc();
    let expected = CodeState::Active {
        signature: checked.signature.clone(),
        binding: login::binding(&client.id, redirect_uri, &challenge),
    };
    let tokens = mint_tokens(issuer, code_of.id, 1, now)?;
    match endpoints
        .store
        .redeem_code(&code_of.id, &expected, &tokens.record, dpop_jkt)
        .await
    {
        Ok(Some(login)) => {
            let session = &login.session;
            if now.unix_timestamp() >= session.token_expires_at || session.expired_at(now) {
                // The patch marked it used, so it can never be redeemed: its login ends (its
                // tokens were never handed out).
                revoke_replayed(endpoints, &login).await;
                return Err(invalid("The authorization code has expired."));
            }
            token_response(
                issuer,
                session,
                tokens,
                true,
                login.dpop_jkt.is_some(),
                client.id_token_lifetime,
                now,
            )
        }
        Ok(None) => Err(unknown()),
        Err(StoreError::Conflict) => {
            // Used already, or presented with parameters it was not issued for: read it to say
            // which (this costs a request on the refusal path only).
            let (login, _) = read_login(endpoints, &code_of.id, unknown).await?;
            let session = &login.session;
            match &login.code {
                CodeState::Used => {
                    // RFC 6749 §4.1.2: a code used twice revokes what it was redeemed for.
                    revoke_replayed(endpoints, &login).await;
                    Err(invalid("The authorization code has already been used."))
                }
                CodeState::Active { signature, .. } if *signature != checked.signature => Err(unknown()),
                CodeState::Active { .. } if session.client_id != client.id => Err(other_client()),
                CodeState::Active { .. }
                    if now.unix_timestamp() >= session.token_expires_at || session.expired_at(now) =>
                {
                    Err(invalid("The authorization code has expired."))
                }
                CodeState::Active { .. } if redirect_uri != session.redirect_uri => Err(invalid(
                    "The 'redirect_uri' parameter does not match the one of the authorization request.",
                )),
                CodeState::Active { .. } if !verifier_matches(&session.code_challenge, verifier) => {
                    Err(pkce_mismatch())
                }
                // Everything the test compares matches: kube-apiserver refused the patch for
                // another reason, and the code is still unused. The client may try again.
                CodeState::Active { .. } => Err(store_failed(&StoreError::Conflict)),
            }
        }
        Err(error) => Err(store_failed(&error)),
    }
}

/// Ends a login whose code was replayed or expired ([`end`]), logging a failure.
pub(crate) async fn revoke_replayed(endpoints: &Endpoints, login: &Login) {
    if let Err(error) = end(endpoints, login).await {
        tracing::error!(%error, "revoking the tokens of a replayed authorization code failed");
    }
}
