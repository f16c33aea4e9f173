//! `POST /oauth2/token`: the client authenticated ([`authenticate`]: the public `pinniped-cli`,
//! or an OIDCClient with HTTP Basic), then one grant — the authorization code grant ([`code`],
//! PKCE required), the refresh token grant ([`refresh`], rotating, the upstream checked again) or
//! RFC 8693 token exchange for a cluster-scoped ID token ([`exchange`]), the RFC 8628 device code
//! grant ([`device`], redeeming a device login's code) — and the tokens they
//! issue ([`mint_tokens`], [`token_response`]), recorded in the login's Secret. A FederationDomain
//! with DPoP on binds sessions to a key of the client ([`dpop`]). `POST /oauth2/revoke` is
//! [`crate::endpoints::revoke`].

mod code;
mod device;
pub(crate) mod dpop;
mod exchange;
#[cfg(test)]
mod grant_tests;
mod refresh;

use std::{collections::HashMap, sync::Arc};

use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Secret;
use serde_json::json;
use time::OffsetDateTime;

use crate::clients::Busy;
use crate::endpoints::authorize::{self, Client};
use crate::endpoints::discovery::DEVICE_CODE_GRANT;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::code::authorization_code;
use crate::endpoints::token::dpop::RequestProof;
use crate::endpoints::{json, oauth_error, read_form, Body, Endpoints};
use crate::issuer::Issuer;
use crate::server::metrics::Grant;
use crate::session::gc;
use crate::session::id_token::{self, IdTokenClaims};
use crate::session::login::{self, Login, Tokens};
use crate::session::storage::Resource;
use crate::session::store::StoreError;
use crate::session::tokens::{Kind, LoginRef, Minted};
use crate::session::{self, Session};

pub(crate) const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// `POST /oauth2/token`. On a FederationDomain with DPoP on, the request's DPoP proof is
/// checked once the client is authenticated and before any grant runs ([`dpop`]), and every
/// response carries a `DPoP-Nonce`.
pub(crate) async fn token<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let mut proof = RequestProof::of(&parts.headers);
    let params = match form_params(body).await {
        Ok(params) => params,
        Err(error) => return respond(issuer, &proof, Err(error)),
    };
    let grant = match params.get("grant_type").map(String::as_str) {
        Some("authorization_code") => Grant::authorization_code,
        Some("refresh_token") => Grant::refresh_token,
        Some(TOKEN_EXCHANGE) => Grant::token_exchange,
        Some(DEVICE_CODE_GRANT) => Grant::device_code,
        _ => Grant::other,
    };
    let result = match authenticate(endpoints, &parts.headers, &params).await {
        Err(error) => Err(error),
        Ok(client) => run_grant(endpoints, issuer, &client, &params, &mut proof).await,
    };
    endpoints
        .metrics
        .grant(grant, result.as_ref().err().map(|error| error.code));
    respond(issuer, &proof, result)
}

/// The grant `params` ask for, of the authenticated `client`: refused when it is missing,
/// unknown or not one the client may use; else, the request's DPoP proof checked first when
/// `issuer` has DPoP on, the grant.
async fn run_grant(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
    proof: &mut RequestProof,
) -> Result<serde_json::Value, OAuthError> {
    let grant_type = match params.get("grant_type").map(String::as_str) {
        None => {
            return Err(OAuthError::new(
                Code::InvalidRequest,
                "The 'grant_type' parameter is missing.",
            ))
        }
        Some(known @ ("authorization_code" | "refresh_token" | TOKEN_EXCHANGE | DEVICE_CODE_GRANT))
            if !client.grant_types.iter().any(|allowed| allowed == known) =>
        {
            return Err(OAuthError::new(
                Code::UnauthorizedClient,
                &format!("The OAuth 2.0 Client is not allowed to use authorization grant \"{known}\"."),
            ))
        }
        Some(known @ ("authorization_code" | "refresh_token" | TOKEN_EXCHANGE | DEVICE_CODE_GRANT)) => known,
        Some(other) => {
            return Err(OAuthError::new(
                Code::UnsupportedGrantType,
                &format!("The OAuth 2.0 Client is not allowed to use authorization grant '{other}'."),
            ))
        }
    };
    let seen = &endpoints.dpop_proofs;
    proof.check_if_enabled(seen, issuer)?;
    match grant_type {
        "authorization_code" => {
            let binding = proof.login_binding(seen, issuer, client)?;
            authorization_code(endpoints, issuer, client, params, binding.as_deref()).await
        }
        DEVICE_CODE_GRANT => {
            let binding = proof.login_binding(seen, issuer, client)?;
            device::device_code(endpoints, issuer, client, params, binding.as_deref()).await
        }
        "refresh_token" => refresh::refresh(endpoints, issuer, client, params, proof).await,
        // TOKEN_EXCHANGE, the one known grant left.
        _ => exchange::exchange(endpoints, issuer, client, params, proof).await,
    }
}

/// The response of a token request: the tokens, or the error ([`client_error`]); with the
/// `DPoP-Nonce` [`RequestProof::nonce_header`] gives.
fn respond(
    issuer: &Issuer,
    proof: &RequestProof,
    result: Result<serde_json::Value, OAuthError>,
) -> Response<Body> {
    let mut response = match result {
        Ok(body) => json(StatusCode::OK, Bytes::from(body.to_string())),
        Err(error) => client_error(&error),
    };
    if let Some(nonce) = proof.nonce_header(issuer) {
        response
            .headers_mut()
            .insert(selkie_oidc::dpop::NONCE_HEADER, nonce);
    }
    response
}

/// The form parameters of a token or revocation request: each at most once.
pub(crate) async fn form_params<B>(body: B) -> Result<HashMap<String, String>, OAuthError>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(form) = read_form(body).await else {
        return Err(OAuthError::new(
            Code::InvalidRequest,
            "The request body is too large, too slow or unreadable.",
        ));
    };
    let mut params: HashMap<String, String> = HashMap::new();
    for (name, value) in form {
        if params.insert(name.clone(), value).is_some() {
            return Err(OAuthError::new(
                Code::InvalidRequest,
                &format!("The parameter '{name}' must not be given more than once."),
            ));
        }
    }
    Ok(params)
}

/// The response of a refused token or revocation request; `invalid_client` asks for Basic
/// authentication (RFC 6749 §5.2).
pub(crate) fn client_error(error: &OAuthError) -> Response<Body> {
    let mut response = oauth_error(error);
    if error.code == Code::InvalidClient {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
    }
    response
}

/// The client a token request comes from, authenticated.
pub(crate) struct TokenClient {
    pub(crate) id: String,
    pub(crate) grant_types: Vec<String>,
    /// How long its ID tokens from the code and refresh grants live.
    pub(crate) id_token_lifetime: time::Duration,
}

/// Who sends a token request, authenticated as Pinniped's Supervisor (fosite) authenticates it:
///
/// * the public `pinniped-cli` client, named by `client_id` in the body, or by HTTP Basic with
///   an empty secret (`pinniped-cli:` — what golang.org/x/oauth2, which the pinniped CLI uses,
///   tries first); a non-empty secret for it, in the header or the body, is `invalid_client`
///   (it authenticates with method `none`);
/// * an OIDCClient authenticated by HTTP Basic (`client_secret_basic`, RFC 6749 §2.3.1: ID and
///   secret form-encoded, then base64) with one of its secrets ([`crate::clients::DynamicClient::authenticate`]:
///   bcrypt off the async runtime, bounded; `temporarily_unavailable` when too many checks wait).
///
/// Anything else — an unknown or invalid client, a wrong secret, a secret in the body, a
/// `client_id` parameter naming another client than the header — is `invalid_client`.
pub(crate) async fn authenticate(
    endpoints: &Endpoints,
    headers: &http::HeaderMap,
    params: &HashMap<String, String>,
) -> Result<TokenClient, OAuthError> {
    let failed = || OAuthError::new(Code::InvalidClient, "");
    let none_but = |method: &str| {
        OAuthError::new(
            Code::InvalidClient,
            &format!(
                "The OAuth 2.0 Client supports client authentication method 'none', but method '{method}' was requested. You must configure the OAuth 2.0 client's 'token_endpoint_auth_method' value to accept '{method}'."
            ),
        )
    };
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, credentials) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("basic").then(|| credentials.trim())
        });
    let Some(credentials) = basic else {
        let with_secret = params
            .get("client_secret")
            .is_some_and(|secret| !secret.is_empty());
        return match params.get("client_id").map(String::as_str) {
            Some(authorize::PINNIPED_CLI) if with_secret => Err(none_but("client_secret_post")),
            Some(authorize::PINNIPED_CLI) => Ok(TokenClient::pinniped_cli()),
            _ if params.contains_key("client_secret") => Err(OAuthError::new(
                Code::InvalidClient,
                "The OAuth 2.0 Client supports client authentication method 'client_secret_basic', but method 'client_secret_post' was requested.",
            )),
            Some(id) if endpoints.clients.load().get(id).is_some() => Err(OAuthError::new(
                Code::InvalidClient,
                "The OAuth 2.0 Client supports client authentication method 'client_secret_basic', but method 'none' was requested.",
            )),
            _ => Err(OAuthError::new(
                Code::InvalidClient,
                "The requested OAuth 2.0 Client does not exist.",
            )),
        };
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(credentials)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(failed)?;
    let (id, secret) = decoded.split_once(':').ok_or_else(failed)?;
    let (id, secret) = (
        selkie_api::percent::decode(id).ok_or_else(failed)?,
        selkie_api::percent::decode(secret).ok_or_else(failed)?,
    );
    if params.get("client_id").is_some_and(|named| *named != id) {
        return Err(failed());
    }
    if id == authorize::PINNIPED_CLI {
        if !secret.is_empty() {
            return Err(none_but("client_secret_basic"));
        }
        if params
            .get("client_secret")
            .is_some_and(|secret| !secret.is_empty())
        {
            return Err(none_but("client_secret_post"));
        }
        return Ok(TokenClient::pinniped_cli());
    }
    let Some(client) = endpoints.clients.load().get(&id) else {
        return Err(failed());
    };
    match client.authenticate(&secret).await {
        Ok(true) => {}
        Ok(false) => return Err(failed()),
        Err(Busy) => {
            return Err(OAuthError::new(
                Code::TemporarilyUnavailable,
                "Too many client authentications are in progress; try again.",
            ))
        }
    }
    Ok(TokenClient {
        id,
        grant_types: client.client.grant_types.clone(),
        id_token_lifetime: client
            .id_token_lifetime
            .and_then(|lifetime| time::Duration::try_from(lifetime).ok())
            .unwrap_or(id_token::LIFETIME),
    })
}

impl TokenClient {
    /// The public `pinniped-cli` client.
    fn pinniped_cli() -> Self {
        Self {
            id: authorize::PINNIPED_CLI.into(),
            grant_types: Client::pinniped_cli().grant_types,
            id_token_lifetime: id_token::LIFETIME,
        }
    }
}

/// The error of a grant whose code or token was issued to another client.
pub(crate) fn other_client() -> OAuthError {
    OAuthError::new(
        Code::InvalidGrant,
        "The OAuth 2.0 Client ID from this request does not match the one from the authorize request.",
    )
}

/// The OAuth error of a session store failure: a stored session that cannot be read (written by
/// another Supervisor version — Pinniped's, after a migration — or damaged) will never be, so
/// the user must log in again (`invalid_grant`, which makes the CLI start a new login); anything
/// else is the store being unreachable, worth a retry.
pub(crate) fn store_failed(error: &StoreError) -> OAuthError {
    if matches!(error, StoreError::Session(_) | StoreError::Storage(_)) {
        tracing::warn!(%error, "a stored session cannot be read; the user must log in again");
        return OAuthError::new(
            Code::InvalidGrant,
            "The stored session cannot be read (it was written by another version of the Supervisor, or is damaged); log in again.",
        );
    }
    tracing::error!(%error, "the session store failed");
    OAuthError::new(
        Code::TemporarilyUnavailable,
        "The session store could not be reached; try again.",
    )
}

pub(crate) fn param<'a>(params: &'a HashMap<String, String>, name: &str) -> Result<&'a str, OAuthError> {
    params
        .get(name)
        .map(String::as_str)
        .filter(|value| !value.is_empty())
        .ok_or_else(|| {
            OAuthError::new(
                Code::InvalidRequest,
                &format!("The '{name}' parameter is missing."),
            )
        })
}

/// Ends the login of the earlier format (one Secret per token) `request_id`: deletes every
/// access and refresh token of it (both kinds are tried whatever happens to the other; the first
/// failure is returned), then revokes at the upstream the tokens the deleted sessions held (best
/// effort: a failure is logged, the login is over anyway). Its authorization code stays, marked
/// used, until it is collected.
pub(crate) async fn end_login(endpoints: &Endpoints, request_id: &str) -> Result<(), StoreError> {
    let access = endpoints
        .store
        .delete_login(Resource::AccessToken, request_id)
        .await;
    let refresh = endpoints
        .store
        .delete_login(Resource::RefreshToken, request_id)
        .await;
    let issuers = endpoints.issuers.load();
    for (resource, sessions) in [
        (Resource::AccessToken, &access),
        (Resource::RefreshToken, &refresh),
    ] {
        for session in sessions.iter().flatten() {
            if gc::holds_latest(resource, session) {
                revoke_upstream_logged(&issuers, session).await;
            }
        }
    }
    access.and(refresh).map(drop)
}

/// Ends the login of the earlier format `request_id` wherever it is now: in the login's own
/// Secret it was carried over to ([`end`], which ends its Secrets of the earlier format too), or,
/// when it was not carried over, in those alone ([`end_login`]).
pub(crate) async fn end_earlier(endpoints: &Endpoints, request_id: &str) -> Result<(), StoreError> {
    let id = login::id_for_earlier(request_id);
    match endpoints.store.get_login(&id).await {
        Ok(Some((login, _))) if login.migrated_from.as_deref() == Some(request_id) => {
            end(endpoints, &login).await
        }
        Ok(_) => end_login(endpoints, request_id).await,
        Err(error) => {
            // Unreadable or unreachable: the Secrets of the earlier format end anyway.
            let earlier = end_login(endpoints, request_id).await;
            Err(earlier.err().unwrap_or(error))
        }
    }
}

/// Ends `login`: deletes its Secret (one request), and the Secrets of the earlier format it was
/// carried over from, if any ([`end_login`]); then revokes at the upstream the token the deleted
/// Secret held (best effort, as [`end_login`]; nothing when another request deleted it first,
/// which revoked it). The first failure is returned.
pub(crate) async fn end(endpoints: &Endpoints, login: &Login) -> Result<(), StoreError> {
    let deleted = match login.id() {
        Ok(id) => endpoints.store.delete_login_secret(&id).await,
        Err(error) => Err(error),
    };
    let earlier = match &login.migrated_from {
        Some(request_id) => end_login(endpoints, request_id).await,
        None => Ok(()),
    };
    if let Ok(Some(deleted)) = &deleted {
        revoke_upstream_logged(&endpoints.issuers.load(), &deleted.session).await;
    }
    deleted.map(drop).and(earlier)
}

/// Revokes the upstream token `session` holds, logging a failure.
async fn revoke_upstream_logged(issuers: &crate::issuer::Issuers, session: &Session) {
    if let Err(error) = gc::revoke_upstream_of(issuers, session).await {
        tracing::warn!(idp = %session.upstream.provider_name, %error, "revoking the upstream token of an ended login failed");
    }
}

/// The login `id` and the Secret it was read from; `unknown` when there is none, the OAuth error
/// of [`store_failed`] when it cannot be read.
pub(crate) async fn read_login(
    endpoints: &Endpoints,
    id: &[u8; 16],
    unknown: impl FnOnce() -> OAuthError,
) -> Result<(Login, Secret), OAuthError> {
    endpoints
        .store
        .get_login(id)
        .await
        .map_err(|e| store_failed(&e))?
        .ok_or_else(unknown)
}

/// Tokens minted for one generation of a login, not handed out yet.
pub(crate) struct NewTokens {
    access: Minted,
    refresh: Minted,
    /// What the login's Secret records of them.
    pub(crate) record: Tokens,
}

/// Mints the access and refresh tokens of generation `generation` of login `id`, issued at `now`.
pub(crate) fn mint_tokens(
    issuer: &Issuer,
    id: [u8; 16],
    generation: u32,
    now: OffsetDateTime,
) -> Result<NewTokens, OAuthError> {
    let server_error = |_| OAuthError::new(Code::ServerError, "");
    let login = LoginRef { id, generation };
    let access = issuer
        .token_key
        .mint(Kind::AccessToken, login)
        .map_err(server_error)?;
    let refresh = issuer
        .token_key
        .mint(Kind::RefreshToken, login)
        .map_err(server_error)?;
    let record = Tokens {
        generation,
        issued_at: now.unix_timestamp(),
        access: access.signature.clone(),
        refresh: refresh.signature.clone(),
    };
    Ok(NewTokens {
        access,
        refresh,
        record,
    })
}

/// The token response handing out `tokens` of `session`: the access token (of `token_type`
/// `DPoP` when the login is `dpop_bound`, else `bearer`), the refresh token (with
/// `offline_access`) and an ID token (with `openid`, living `id_token_lifetime`, signed now);
/// `with_nonce` for the first ID token of a code.
pub(crate) fn token_response(
    issuer: &Issuer,
    session: &Session,
    tokens: NewTokens,
    with_nonce: bool,
    dpop_bound: bool,
    id_token_lifetime: time::Duration,
    now: OffsetDateTime,
) -> Result<serde_json::Value, OAuthError> {
    let NewTokens { access, refresh, .. } = tokens;
    let mut body = json!({
        "access_token": access.token,
        "token_type": dpop::token_type(dpop_bound),
        "expires_in": session::ACCESS_TOKEN_LIFETIME.whole_seconds() - 1,
        "scope": session.scopes.join(" "),
    });
    if session.has_scope("openid") {
        let claims = IdTokenClaims {
            issuer: issuer.issuer.clone(),
            subject: session.identity.subject.clone(),
            audience: session.client_id.clone(),
            authorized_party: session.client_id.clone(),
            auth_time: OffsetDateTime::from_unix_timestamp(session.auth_time).unwrap_or(now),
            requested_at: OffsetDateTime::from_unix_timestamp(session.requested_at).unwrap_or(now),
            nonce: session.nonce.clone().filter(|_| with_nonce),
            access_token: Some(access.token),
            username: session
                .has_scope("username")
                .then(|| session.identity.username.clone()),
            groups: session
                .has_scope("groups")
                .then(|| session.identity.groups.clone()),
            additional_claims: session.identity.additional_claims.clone(),
            lifetime: id_token_lifetime,
        };
        let id_token = claims
            .sign(&issuer.signing_key, now)
            .map_err(|_| OAuthError::new(Code::ServerError, ""))?;
        body["id_token"] = json!(id_token);
    }
    if session.has_scope("offline_access") {
        body["refresh_token"] = json!(refresh.token);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_session_means_log_in_again_and_an_unreachable_store_means_retry() {
        let unreadable = store_failed(&StoreError::Session("missing field `request_id`".into()));
        assert_eq!(unreadable.code, Code::InvalidGrant);
        assert!(
            unreadable.json().contains("log in again"),
            "{}",
            unreadable.json()
        );
        let wrong_version = store_failed(&StoreError::Storage(session::storage::StorageError::WrongVersion));
        assert_eq!(wrong_version.code, Code::InvalidGrant);
        let busy = store_failed(&StoreError::Conflict);
        assert_eq!(busy.code, Code::TemporarilyUnavailable);
    }
}
