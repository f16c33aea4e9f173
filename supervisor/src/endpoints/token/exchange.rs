//! RFC 8693 token exchange: a Supervisor access token for an ID token of another audience (a
//! cluster), two minutes long. The access token of a login bound to a DPoP key is exchanged only
//! with a proof by that key ([`RequestProof::continue_session`]).

use std::{collections::HashMap, sync::Arc};

use serde_json::json;
use time::OffsetDateTime;

use crate::endpoints::authorize::{self};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::dpop::RequestProof;
use crate::endpoints::token::{other_client, param, read_login, store_failed, TokenClient};
use crate::endpoints::Endpoints;
use crate::issuer::Issuer;
use crate::session;
use crate::session::id_token::{self, IdTokenClaims};
use crate::session::storage::Resource;
use crate::session::tokens::Kind;

pub(crate) const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

pub(crate) const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";

/// RFC 8693 token exchange: a Supervisor access token for an ID token of another audience, with
/// the request's DPoP `proof`. The response's shape is Pinniped's (`token_type` `N_A`), bound
/// login or not.
pub(crate) async fn exchange(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
    proof: &mut RequestProof,
) -> Result<serde_json::Value, OAuthError> {
    let audience = param(params, "audience")?;
    let subject_token = param(params, "subject_token")?;
    if param(params, "subject_token_type")? != ACCESS_TOKEN_TYPE {
        return Err(OAuthError::new(
            Code::InvalidRequest,
            "Unsupported subject token type.",
        ));
    }
    if param(params, "requested_token_type")? != JWT_TOKEN_TYPE {
        return Err(OAuthError::new(
            Code::InvalidRequest,
            "Unsupported requested token type.",
        ));
    }
    if audience.contains(".pinniped.dev")
        || audience == authorize::PINNIPED_CLI
        || audience.starts_with("client.oauth.pinniped.dev-")
    {
        return Err(OAuthError::new(
            Code::InvalidRequest,
            "requested audience cannot contain '.pinniped.dev', equal 'pinniped-cli', or be a dynamic client's ID",
        ));
    }
    let invalid = |hint: &str| OAuthError::new(Code::InvalidGrant, hint);
    let checked = issuer
        .token_key
        .check(Kind::AccessToken, subject_token)
        .map_err(|_| invalid("The subject token is malformed or was not issued by this FederationDomain."))?;
    let unknown = || invalid("The subject token has expired or is unknown.");
    let now = OffsetDateTime::now_utc();
    let (session, expires_at, dpop_jkt) = match checked.login {
        Some(token) => {
            let (login, _) = read_login(endpoints, &token.id, unknown).await?;
            match &login.tokens {
                Some(tokens) if tokens.is_access(token, &checked.signature) => {
                    let expires_at = (tokens.issued() + session::ACCESS_TOKEN_LIFETIME).unix_timestamp();
                    (login.session, expires_at, login.dpop_jkt)
                }
                _ => return Err(unknown()),
            }
        }
        // A token of the earlier format, stored under its signature.
        None => {
            let Some((session, _)) = endpoints
                .store
                .get(Resource::AccessToken, &checked.signature)
                .await
                .map_err(|e| store_failed(&e))?
            else {
                return Err(unknown());
            };
            let expires_at = session.token_expires_at;
            // Never bound (stored before DPoP).
            (session, expires_at, None)
        }
    };
    proof.continue_session(&endpoints.dpop_proofs, issuer, client, dpop_jkt.as_deref())?;
    if session.client_id != client.id {
        return Err(other_client());
    }
    if now.unix_timestamp() >= expires_at {
        return Err(invalid("The subject token has expired."));
    }
    if !session.has_scope("openid") || !session.has_scope("pinniped:request-audience") {
        return Err(OAuthError::new(
            Code::AccessDenied,
            "The subject token was not granted the 'openid' and 'pinniped:request-audience' scopes.",
        ));
    }
    let claims = IdTokenClaims {
        issuer: issuer.issuer.clone(),
        subject: session.identity.subject.clone(),
        audience: audience.to_string(),
        authorized_party: session.client_id.clone(),
        auth_time: OffsetDateTime::from_unix_timestamp(session.auth_time).unwrap_or(now),
        requested_at: OffsetDateTime::from_unix_timestamp(session.requested_at).unwrap_or(now),
        nonce: None,
        access_token: None,
        username: session
            .has_scope("username")
            .then(|| session.identity.username.clone()),
        groups: session
            .has_scope("groups")
            .then(|| session.identity.groups.clone()),
        additional_claims: session.identity.additional_claims.clone(),
        // Not the client's lifetime: Pinniped's exchange tokens always live the default.
        lifetime: id_token::LIFETIME,
    };
    let token = claims
        .sign(&issuer.signing_key, now)
        .map_err(|_| OAuthError::new(Code::ServerError, ""))?;
    Ok(json!({
        "access_token": token,
        "issued_token_type": JWT_TOKEN_TYPE,
        "token_type": "N_A",
        "expires_in": id_token::LIFETIME.whole_seconds(),
    }))
}
