//! `POST /oauth2/token`: the authorization code grant (PKCE required), the refresh token grant
//! (rotating: the old refresh token and its access tokens are revoked; the upstream is checked
//! again), and RFC 8693 token exchange for a cluster-scoped ID token. `POST /oauth2/revoke`
//! ([`revoke`], RFC 7009): a client ends a login.

use std::{collections::HashMap, sync::Arc};

use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use serde_json::json;
use time::OffsetDateTime;

use super::{json, oauth_error, read_form, Body, Endpoints};
use crate::endpoints::authorize::{self, verifier_matches, Client};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::idp::transforms::Outcome;
use crate::idp::Upstream;
use crate::issuer::Issuer;
use crate::server::metrics::Grant;
use crate::session::id_token::{self, IdTokenClaims};
use crate::session::storage::Resource;
use crate::session::store::StoreError;
use crate::session::tokens::Kind;
use crate::session::{self, Session};

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
const JWT_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";

/// `POST /oauth2/token`.
pub(super) async fn token<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let params = match form_params(body).await {
        Ok(params) => params,
        Err(error) => return oauth_error(&error),
    };
    let grant = match params.get("grant_type").map(String::as_str) {
        Some("authorization_code") => Grant::authorization_code,
        Some("refresh_token") => Grant::refresh_token,
        Some(TOKEN_EXCHANGE) => Grant::token_exchange,
        _ => Grant::other,
    };
    let result = match authenticate(endpoints, &parts.headers, &params) {
        Err(error) => Err(error),
        Ok(client) => match params.get("grant_type").map(String::as_str) {
            None => Err(OAuthError::new(
                Code::InvalidRequest,
                "The 'grant_type' parameter is missing.",
            )),
            Some(known @ ("authorization_code" | "refresh_token" | TOKEN_EXCHANGE))
                if !client.grant_types.iter().any(|allowed| allowed == known) =>
            {
                Err(OAuthError::new(
                    Code::UnauthorizedClient,
                    &format!("The OAuth 2.0 Client is not allowed to use authorization grant \"{known}\"."),
                ))
            }
            Some("authorization_code") => authorization_code(endpoints, issuer, &client, &params).await,
            Some("refresh_token") => refresh(endpoints, issuer, &client, &params).await,
            Some(TOKEN_EXCHANGE) => exchange(endpoints, issuer, &client, &params).await,
            Some(other) => Err(OAuthError::new(
                Code::UnsupportedGrantType,
                &format!("The OAuth 2.0 Client is not allowed to use authorization grant '{other}'."),
            )),
        },
    };
    endpoints
        .metrics
        .grant(grant, result.as_ref().err().map(|error| error.code));
    match result {
        Ok(body) => json(StatusCode::OK, Bytes::from(body.to_string())),
        Err(error) => client_error(&error),
    }
}

/// The form parameters of a token or revocation request: each at most once.
async fn form_params<B>(body: B) -> Result<HashMap<String, String>, OAuthError>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(form) = read_form(body).await else {
        return Err(OAuthError::new(
            Code::InvalidRequest,
            "The request body is too large or unreadable.",
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
fn client_error(error: &OAuthError) -> Response<Body> {
    let mut response = oauth_error(error);
    if error.code == Code::InvalidClient {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
    }
    response
}

/// `POST /oauth2/revoke` (RFC 7009; beyond Pinniped, which has no revocation endpoint): a client
/// ends a login with one of its tokens, as at logout. The client authenticates as at the token
/// endpoint ([`authenticate`]); `token` is a refresh or an access token of this FederationDomain
/// (its prefix says which; `token_type_hint` is not needed and is ignored). Every refresh and
/// access token of that login is deleted, then the upstream OIDC refresh token is revoked (best
/// effort: a failure is logged, the login is over anyway). Answers 200 with an empty body,
/// also — RFC 7009 §2.2 — for a token that is unknown, expired, malformed or revoked already;
/// `unauthorized_client` for a token of another client; 503 `temporarily_unavailable` when the
/// session store cannot be reached (nothing may have been revoked; the client should retry).
pub(super) async fn revoke<B>(
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
        let client = authenticate(endpoints, &parts.headers, &params)?;
        let token = param(&params, "token")?;
        revoke_token(endpoints, issuer, &client, token).await
    };
    match revoked.await {
        Ok(()) => json(StatusCode::OK, Bytes::new()),
        Err(error) => client_error(&error),
    }
}

/// Revokes the login of `token` for `client` (see [`revoke`]).
async fn revoke_token(
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
    delete_login_tokens(endpoints, &session.request_id)
        .await
        .map_err(|e| store_failed(&e))?;
    endpoints.audit.session_revoked(&issuer.issuer, &session);
    let issuers = endpoints.issuers.load();
    if let Err(error) = session::gc::revoke_upstream_of(&issuers, Resource::RefreshToken, &session).await {
        tracing::warn!(idp = %session.upstream.provider_name, %error, "revoking the upstream token at logout failed");
    }
    Ok(())
}

/// The client a token request comes from, authenticated.
struct TokenClient {
    id: String,
    grant_types: Vec<String>,
    /// How long its ID tokens from the code and refresh grants live.
    id_token_lifetime: time::Duration,
}

/// Who sends a token request: the public `pinniped-cli` client (named by `client_id`, no secret),
/// or an OIDCClient authenticated by HTTP Basic (`client_secret_basic`, RFC 6749 §2.3.1: ID and
/// secret form-encoded, then base64) with one of its secrets. Anything else — an unknown or
/// invalid client, a wrong secret, a secret in the body, a `client_id` parameter naming another
/// client than the header — is `invalid_client`.
fn authenticate(
    endpoints: &Endpoints,
    headers: &http::HeaderMap,
    params: &HashMap<String, String>,
) -> Result<TokenClient, OAuthError> {
    let failed = || OAuthError::new(Code::InvalidClient, "");
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, credentials) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("basic").then(|| credentials.trim())
        });
    let Some(credentials) = basic else {
        if params.contains_key("client_secret") {
            return Err(OAuthError::new(
                Code::InvalidClient,
                "The OAuth 2.0 Client supports client authentication method 'client_secret_basic', but method 'client_secret_post' was requested.",
            ));
        }
        return match params.get("client_id").map(String::as_str) {
            Some(authorize::PINNIPED_CLI) => Ok(TokenClient {
                id: authorize::PINNIPED_CLI.into(),
                grant_types: Client::pinniped_cli().grant_types,
                id_token_lifetime: id_token::LIFETIME,
            }),
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
    let Some(client) = endpoints.clients.load().get(&id) else {
        return Err(failed());
    };
    if !client.authenticate(&secret) {
        return Err(failed());
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

/// The error of a grant whose code or token was issued to another client.
fn other_client() -> OAuthError {
    OAuthError::new(
        Code::InvalidGrant,
        "The OAuth 2.0 Client ID from this request does not match the one from the authorize request.",
    )
}

/// The OAuth error of a session store failure: a stored session that cannot be read (written by
/// another Supervisor version — Pinniped's, after a migration — or damaged) will never be, so
/// the user must log in again (`invalid_grant`, which makes the CLI start a new login); anything
/// else is the store being unreachable, worth a retry.
fn store_failed(error: &StoreError) -> OAuthError {
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

fn param<'a>(params: &'a HashMap<String, String>, name: &str) -> Result<&'a str, OAuthError> {
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

/// The authorization code grant.
async fn authorization_code(
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
        revoke_login(endpoints, &session.request_id).await;
        return Err(invalid("The authorization code has already been used."));
    }
    if session.client_id != client.id {
        return Err(other_client());
    }
    if now.unix_timestamp() >= session.token_expires_at {
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
    session.code_active = false;
    match endpoints
        .store
        .update(Resource::AuthCode, &signature, stored, &session)
        .await
    {
        Ok(()) => {}
        Err(StoreError::Conflict) => {
            revoke_login(endpoints, &session.request_id).await;
            return Err(invalid("The authorization code has already been used."));
        }
        Err(error) => return Err(store_failed(&error)),
    }
    issue_tokens(endpoints, issuer, session, true, client.id_token_lifetime, now).await
}

/// Deletes every token of a login (its code stays, marked used, until it is collected), logging
/// a failure.
async fn revoke_login(endpoints: &Endpoints, request_id: &str) {
    if let Err(error) = delete_login_tokens(endpoints, request_id).await {
        tracing::error!(%error, "revoking the tokens of a replayed or reused grant failed");
    }
}

/// Deletes every access and refresh token of a login: both kinds are tried whatever happens to
/// the other; the first failure is returned.
async fn delete_login_tokens(endpoints: &Endpoints, request_id: &str) -> Result<(), StoreError> {
    let access = endpoints
        .store
        .delete_login(Resource::AccessToken, request_id)
        .await;
    let refresh = endpoints
        .store
        .delete_login(Resource::RefreshToken, request_id)
        .await;
    access.and(refresh).map(|_| ())
}

/// Mints and stores an access token, a refresh token (with `offline_access`) and an ID token (with
/// `openid`, living `id_token_lifetime`) for `session`; `with_nonce` for the first ID token of a
/// code.
async fn issue_tokens(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    session: Session,
    with_nonce: bool,
    id_token_lifetime: time::Duration,
    now: OffsetDateTime,
) -> Result<serde_json::Value, OAuthError> {
    let server_error = || OAuthError::new(Code::ServerError, "");
    let access = issuer
        .token_key
        .mint(Kind::AccessToken)
        .map_err(|_| server_error())?;
    let refresh = if session.has_scope("offline_access") {
        Some(
            issuer
                .token_key
                .mint(Kind::RefreshToken)
                .map_err(|_| server_error())?,
        )
    } else {
        None
    };
    let id_token = if session.has_scope("openid") {
        let claims = IdTokenClaims {
            issuer: issuer.issuer.clone(),
            subject: session.identity.subject.clone(),
            audience: session.client_id.clone(),
            authorized_party: session.client_id.clone(),
            auth_time: OffsetDateTime::from_unix_timestamp(session.auth_time).unwrap_or(now),
            requested_at: OffsetDateTime::from_unix_timestamp(session.requested_at).unwrap_or(now),
            nonce: session.nonce.clone().filter(|_| with_nonce),
            access_token: Some(access.token.clone()),
            username: session
                .has_scope("username")
                .then(|| session.identity.username.clone()),
            groups: session
                .has_scope("groups")
                .then(|| session.identity.groups.clone()),
            additional_claims: session.identity.additional_claims.clone(),
            lifetime: id_token_lifetime,
        };
        Some(
            claims
                .sign(&issuer.signing_key, now)
                .map_err(|_| server_error())?,
        )
    } else {
        None
    };
    let remaining = time::Duration::seconds((session.expires_at - now.unix_timestamp()).max(0));
    let mut stored = session.clone();
    stored.code_active = false;
    stored.token_expires_at = (now + session::ACCESS_TOKEN_LIFETIME).unix_timestamp();
    stored.access_token_signature = Some(access.signature.clone());
    endpoints
        .store
        .create(Resource::AccessToken, &access.signature, &stored, remaining, now)
        .await
        .map_err(|e| store_failed(&e))?;
    if let Some(refresh) = &refresh {
        stored.token_expires_at = session.expires_at;
        endpoints
            .store
            .create(
                Resource::RefreshToken,
                &refresh.signature,
                &stored,
                remaining,
                now,
            )
            .await
            .map_err(|e| store_failed(&e))?;
    }
    let mut body = json!({
        "access_token": access.token,
        "token_type": "bearer",
        "expires_in": session::ACCESS_TOKEN_LIFETIME.whole_seconds() - 1,
        "scope": session.scopes.join(" "),
    });
    if let Some(refresh) = refresh {
        body["refresh_token"] = json!(refresh.token);
    }
    if let Some(id_token) = id_token {
        body["id_token"] = json!(id_token);
    }
    Ok(body)
}

/// The refresh token grant.
async fn refresh(
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
    let Some((mut session, _)) = endpoints
        .store
        .get(Resource::RefreshToken, &signature)
        .await
        .map_err(|e| store_failed(&e))?
    else {
        return Err(invalid(
            "The refresh token has expired, was used already, or is unknown.",
        ));
    };
    if session.client_id != client.id {
        return Err(other_client());
    }
    if session.expired_at(now) {
        return Err(invalid("The session has ended; log in again."));
    }
    // Rotation: this refresh token and the login's access tokens end now, whatever follows.
    endpoints
        .store
        .delete(Resource::RefreshToken, &signature)
        .await
        .map_err(|e| store_failed(&e))?;
    let revoked = match session.access_token_signature.take() {
        Some(access) => endpoints.store.delete(Resource::AccessToken, &access).await,
        None => endpoints
            .store
            .delete_login(Resource::AccessToken, &session.request_id)
            .await
            .map(|_| ()),
    };
    revoked.map_err(|e| store_failed(&e))?;
    upstream_refresh(endpoints, issuer, &mut session).await?;
    endpoints.audit.session_refreshed(&issuer.issuer, &session);
    issue_tokens(endpoints, issuer, session, false, client.id_token_lifetime, now).await
}

/// Checks the user again at the upstream (see [`upstream_identity`]), then runs the
/// FederationDomain's identity transforms on what it says now: a policy may refuse the refresh,
/// the downstream username must not change, the downstream groups become what the transforms make
/// of the upstream's groups now.
async fn upstream_refresh(
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
async fn upstream_identity(
    issuer: &Arc<Issuer>,
    session: &mut Session,
) -> Result<Option<(String, Vec<String>)>, OAuthError> {
    let denied =
        |hint: &str| OAuthError::new(Code::InvalidGrant, &format!("Upstream refresh failed. {hint}"));
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
            let groups = ldap.refresh(&session.upstream).await.map_err(|reason| {
                tracing::info!(issuer = %issuer.issuer, idp = %ldap.display_name, %reason, "upstream refresh refused");
                denied(&reason)
            })?;
            return Ok(Some((upstream_username, groups)));
        }
        Upstream::GitHub(github) => {
            let (username, groups) = github
                .refresh(&session.upstream, &session.identity.subject)
                .await
                .map_err(|reason| {
                    tracing::info!(issuer = %issuer.issuer, idp = %github.display_name, %reason, "upstream refresh refused");
                    denied(&reason)
                })?;
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

/// RFC 8693 token exchange: a Supervisor access token for an ID token of another audience.
async fn exchange(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    client: &TokenClient,
    params: &HashMap<String, String>,
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
    let signature = issuer
        .token_key
        .signature_of(Kind::AccessToken, subject_token)
        .map_err(|_| invalid("The subject token is malformed or was not issued by this FederationDomain."))?;
    let now = OffsetDateTime::now_utc();
    let Some((session, _)) = endpoints
        .store
        .get(Resource::AccessToken, &signature)
        .await
        .map_err(|e| store_failed(&e))?
    else {
        return Err(invalid("The subject token has expired or is unknown."));
    };
    if session.client_id != client.id {
        return Err(other_client());
    }
    if now.unix_timestamp() >= session.token_expires_at {
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
