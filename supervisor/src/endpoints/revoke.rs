//! `POST /oauth2/revoke` (RFC 7009; beyond Pinniped, which has no revocation endpoint): a client
//! ends a login with one of its tokens, as at logout.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};

use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::{
    authenticate, client_error, end, end_earlier, form_params, param, store_failed, TokenClient,
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
    let Ok(checked) = issuer.token_key.check(kind, token) else {
        return Ok(()); // malformed, or not this FederationDomain's
    };
    let Some(token) = checked.login else {
        return revoke_earlier(endpoints, issuer, client, resource, &checked.signature).await;
    };
    let login = match endpoints.store.get_login(&token.id).await {
        Ok(Some((login, _))) => login,
        Ok(None) => return Ok(()),
        // A login no Supervisor can read again: its holder may as well delete it.
        Err(StoreError::Session(_) | StoreError::Storage(_)) => {
            return endpoints
                .store
                .delete_login_secret(&token.id)
                .await
                .map(drop)
                .map_err(|e| store_failed(&e));
        }
        Err(error) => return Err(store_failed(&error)),
    };
    if login.session.client_id != client.id {
        return Err(unauthorized_client());
    }
    // Only a current token ends its login; one of an earlier generation is over already.
    let current = login.tokens.as_ref().is_some_and(|tokens| match kind {
        Kind::AccessToken => tokens.is_access(token, &checked.signature),
        _ => tokens.is_refresh(token, &checked.signature),
    });
    if !current {
        return Ok(());
    }
    end(endpoints, &login).await.map_err(|e| store_failed(&e))?;
    endpoints.audit.session_revoked(&issuer.issuer, &login.session);
    Ok(())
}

fn unauthorized_client() -> OAuthError {
    OAuthError::new(
        Code::UnauthorizedClient,
        "The token was issued to another client.",
    )
}

/// Revokes the login of a token of the earlier format, stored under its signature.
async fn revoke_earlier(
    endpoints: &Endpoints,
    issuer: &Issuer,
    client: &TokenClient,
    resource: Resource,
    signature: &str,
) -> Result<(), OAuthError> {
    let session = match endpoints.store.get(resource, signature).await {
        Ok(Some((session, _))) => session,
        Ok(None) => return Ok(()),
        // A session no Supervisor can read again: its holder may as well delete it.
        Err(StoreError::Session(_) | StoreError::Storage(_)) => {
            return endpoints
                .store
                .delete(resource, signature)
                .await
                .map_err(|e| store_failed(&e));
        }
        Err(error) => return Err(store_failed(&error)),
    };
    if session.client_id != client.id {
        return Err(unauthorized_client());
    }
    end_earlier(endpoints, &session.request_id)
        .await
        .map_err(|e| store_failed(&e))?;
    endpoints.audit.session_revoked(&issuer.issuer, &session);
    Ok(())
}
