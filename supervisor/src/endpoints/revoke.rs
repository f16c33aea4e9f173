//! `POST /oauth2/revoke` (RFC 7009; beyond Pinniped, which has no revocation endpoint): a client
//! ends a login with one of its tokens, as at logout.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};

use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::{
    authenticate, client_error, end_login, form_params, param, store_failed, TokenClient,
};
use crate::endpoints::{json, Body, Endpoints};
use crate::issuer::Issuer;
use crate::session::storage::Resource;
use crate::session::store::StoreError;
use crate::session::tokens::Kind;

/// `POST /oauth2/revoke` (RFC 7009; beyond Pinniped, which has no revocation endpoint): a client
/// ends a login with one of its tokens, as at logout. The client authenticates as at the token
/// endpoint ([`authenticate`]); `token` is a refresh or an access token of this FederationDomain
/// (its prefix says which; `token_type_hint` is not needed and is ignored). Every refresh and
/// access token of that login is deleted, then the upstream OIDC refresh token is revoked (best
/// effort: a failure is logged, the login is over anyway). Answers 200 with an empty body,
/// also — RFC 7009 §2.2 — for a token that is unknown, expired, malformed or revoked already;
/// `unauthorized_client` for a token of another client; 503 `temporarily_unavailable` when the
/// session store cannot be reached (nothing may have been revoked; the client should retry).
pub(crate) async fn revoke<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let revoked = async {
        let params = form_params(body).await?;
        let client = authenticate(endpoints, &parts.headers, &params).await?;
        let token = param(&params, "token")?;
        revoke_token(endpoints, issuer, &client, token).await
    };
    match revoked.await {
        Ok(()) => json(StatusCode::OK, Bytes::new()),
        Err(error) => client_error(&error),
    }
}

/// Revokes the login of `token` for `client` (see [`revoke`]).
pub(crate) async fn revoke_token(
    endpoints: &Endpoints,
    issuer: &Issuer,
    client: &TokenClient,
    token: &str,
) -> Result<(), OAuthError> {
    let Some((kind, resource)) = [
        (Kind::RefreshToken, Resource::RefreshToken),
        (Kind::AccessToken, Resource::AccessToken),
    ]
    .into_iter()
    .find(|(kind, _)| token.starts_with(kind.prefix())) else {
        return Ok(()); // not a token this endpoint revokes: as an unknown one
    };
    let Ok(signature) = issuer.token_key.signature_of(kind, token) else {
        return Ok(()); // malformed, or not this FederationDomain's
    };
    let session = match endpoints.store.get(resource, &signature).await {
        Ok(Some((session, _))) => session,
        Ok(None) => return Ok(()),
        // A session no Supervisor can read again: its holder may as well delete it.
        Err(StoreError::Session(_) | StoreError::Storage(_)) => {
            return endpoints
                .store
                .delete(resource, &signature)
                .await
                .map_err(|e| store_failed(&e));
        }
        Err(error) => return Err(store_failed(&error)),
    };
    if session.client_id != client.id {
        return Err(OAuthError::new(
            Code::UnauthorizedClient,
            "The token was issued to another client.",
        ));
    }
    end_login(endpoints, &session.request_id)
        .await
        .map_err(|e| store_failed(&e))?;
    endpoints.audit.session_revoked(&issuer.issuer, &session);
    Ok(())
}
