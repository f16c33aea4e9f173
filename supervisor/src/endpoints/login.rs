//! `oauth2/authorize` and `callback`: a login from the client's authorization request to the
//! authorization code it gets back.
//!
//! * With `Pinniped-Username` / `Pinniped-Password` headers (the CLI's `cli_password` flow), the
//!   Supervisor logs in at the upstream itself (OIDC: the password grant, when the upstream allows
//!   it) and redirects straight back to the client with the code.
//!   LDAP and Active Directory: the directory checks them.
//! * Otherwise the browser goes to the upstream with the Supervisor's own PKCE, nonce and a
//!   `state` that seals the whole authorization request (nothing is stored until the user comes
//!   back, so any replica can take the callback), and a CSRF cookie ties the callback to the
//!   browser that started it. At `callback` the upstream code is redeemed, the ID token checked
//!   and mapped, and the client gets its code by redirect or by `form_post` page.
//! * LDAP and Active Directory in a browser: the Supervisor's own page, `/login`, with the same
//!   sealed `state` and CSRF cookie; its form posts the username and password back to `/login`.

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use ring::rand::SecureRandom as _;
use selkie_oidc::rp::{CallbackOutcome, CallbackParams, LoginParams};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{oauth_error, read_form, text, Body, Endpoints};
use crate::endpoints::authorize::{self, AuthorizeRequest, Refusal, ResponseMode};
use crate::endpoints::discovery::{CALLBACK_PATH, CHOOSE_IDP_PATH, LOGIN_PATH};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::idp::github::GitHubError;
use crate::idp::ldap::LdapError;
use crate::idp::transforms::Outcome;
use crate::idp::{GitHubUpstream, LdapUpstream, OidcUpstream, Upstream};
use crate::issuer::Issuer;
use crate::session::storage::Resource;
use crate::session::tokens::Kind;
use crate::session::{self, Identity, Session};

/// The CSRF cookie (the `__Host-` prefix: Secure, Path=/, no Domain).
pub(super) const CSRF_COOKIE: &str = "__Host-pinniped-csrf-v2";
/// How long the CSRF cookie lives.
const CSRF_LIFETIME: time::Duration = time::Duration::days(7);
/// How long the upstream state of a login in progress is honoured.
const UPSTREAM_STATE_LIFETIME: time::Duration = time::Duration::minutes(90);
const CSRF_PURPOSE: &str = "csrf";
const STATE_PURPOSE: &str = "upstream-state";

/// What the upstream `state` parameter carries through the upstream login.
#[derive(Serialize, Deserialize)]
struct UpstreamState {
    /// The client's authorization request, as it came (checked again at the callback).
    authorize_query: String,
    /// The identity provider's display name.
    idp_name: String,
    /// The Supervisor's nonce at the upstream.
    nonce: String,
    /// The Supervisor's PKCE verifier at the upstream.
    verifier: String,
    /// The CSRF value the callback's cookie must hold.
    csrf: String,
}

/// `GET|POST /oauth2/authorize`.
pub(super) async fn authorize<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let query = if parts.method == http::Method::POST {
        match read_form(body).await {
            Some(form) => form_urlencoded::Serializer::new(String::new())
                .extend_pairs(form)
                .finish(),
            None => {
                return oauth_error(&OAuthError::new(
                    Code::InvalidRequest,
                    "The request body is too large or unreadable.",
                ))
            }
        }
    } else {
        parts.uri.query().unwrap_or_default().to_string()
    };
    let request = match authorize::parse(&query, &|id| endpoints.client(id)) {
        Ok(request) => request,
        Err(refusal) => return refused(refusal),
    };
    let back = |error: OAuthError| {
        refused(Refusal::Redirect {
            error,
            redirect_uri: request.redirect_uri.clone(),
            response_mode: request.response_mode,
            state: Some(request.state.clone()),
        })
    };
    let header = |name: &str| parts.headers.get(name).and_then(|value| value.to_str().ok());
    let (username, password) = (header("pinniped-username"), header("pinniped-password"));
    // A browser that named no identity provider of several chooses one (Pinniped's chooser).
    if request.idp_name.is_none() && issuer.idps.len() > 1 && username.is_none() && password.is_none() {
        return redirect(&format!("{}{CHOOSE_IDP_PATH}?{query}", issuer.issuer));
    }
    let Some(idp) = issuer.idp(request.idp_name.as_deref(), request.idp_type.as_deref()) else {
        let hint = match &request.idp_name {
            Some(name) => format!("\"pinniped_idp_name\" param error: did not find an identity provider named {name:?}."),
            None => "\"pinniped_idp_name\" param error: the FederationDomain has more than one identity provider, or none; name one.".into(),
        };
        return back(OAuthError::new(Code::InvalidRequest, &hint));
    };
    if username.is_some() || password.is_some() {
        if request.client_id != authorize::PINNIPED_CLI {
            return back(OAuthError::new(
                Code::AccessDenied,
                "This client is not allowed to submit username or password headers to this endpoint.",
            ));
        }
        let (Some(username), Some(password)) = (
            username.filter(|u| !u.is_empty()),
            password.filter(|p| !p.is_empty()),
        ) else {
            return back(OAuthError::new(
                Code::AccessDenied,
                "Missing or blank username or password.",
            ));
        };
        return password_login(endpoints, issuer, idp, request, username, password).await;
    }
    browser_login(issuer, idp, &request, &query, &parts.headers)
}

/// The error of a login whose upstream could not be reached, timed out or failed (5xx, 429):
/// the user may try again later; nothing about their credentials is implied.
fn unreachable_upstream() -> OAuthError {
    OAuthError::new(
        Code::TemporarilyUnavailable,
        "Reason: the upstream identity provider could not be reached or failed; try again later.",
    )
}

/// The `cli_password` flow.
async fn password_login(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    idp: &Arc<Upstream>,
    request: AuthorizeRequest,
    username: &str,
    password: &str,
) -> Response<Body> {
    let back = |error: OAuthError| {
        refused(Refusal::Redirect {
            error,
            redirect_uri: request.redirect_uri.clone(),
            response_mode: ResponseMode::Query,
            state: Some(request.state.clone()),
        })
    };
    let throttled = match may_try_password(endpoints, issuer, idp, username) {
        Ok(throttled) => throttled,
        Err(wait) => {
            return back(OAuthError::new(
                Code::AccessDenied,
                &format!(
                    "Reason: too many failed logins for this username; try again in {} seconds.",
                    wait.as_secs()
                ),
            ))
        }
    };
    let (identity, upstream) = match idp.as_ref() {
        Upstream::Oidc(oidc) => match oidc_password_login(issuer, oidc, username, password).await {
            Ok(found) => found,
            Err((error, wrong_password)) => {
                if wrong_password {
                    endpoints.passwords.failed(&throttled, username, Instant::now());
                }
                return back(error);
            }
        },
        Upstream::Ldap(ldap) => match ldap.login(username, password).await {
            Ok(found) => found,
            Err(error) => {
                if error == LdapError::InvalidCredentials {
                    endpoints.passwords.failed(&throttled, username, Instant::now());
                }
                return back(ldap_refusal(endpoints, issuer, ldap, username, &error));
            }
        },
        Upstream::GitHub(_) => {
            return back(OAuthError::new(
                Code::AccessDenied,
                "Reason: GitHub identity providers support only the browser_authcode flow; log in with a browser.",
            ))
        }
    };
    endpoints.passwords.succeeded(&throttled, username);
    let mut request = request;
    request.response_mode = ResponseMode::Query;
    issue_code(endpoints, issuer, &request, identity, upstream).await
}

/// When `username` may try a password at `idp` of `issuer` now ([`crate::idp::throttle`]), the name
/// the throttle knows `idp` by (to count the outcome under); otherwise — audited — how long it
/// must still wait.
fn may_try_password(
    endpoints: &Endpoints,
    issuer: &Issuer,
    idp: &Upstream,
    username: &str,
) -> Result<String, std::time::Duration> {
    let throttled = format!("{} {}", issuer.issuer, idp.display_name());
    endpoints
        .passwords
        .check(&throttled, username, Instant::now())
        .inspect_err(|_| {
            endpoints
                .audit
                .too_many_failed_passwords(&issuer.issuer, idp.display_name(), username);
        })
        .map(|()| throttled)
}

/// The OIDC `cli_password` flow: the upstream's password grant, when it is allowed. A refusal
/// comes with whether the upstream refused the username or password (a failure to count).
async fn oidc_password_login(
    issuer: &Arc<Issuer>,
    oidc: &OidcUpstream,
    username: &str,
    password: &str,
) -> Result<(Identity, session::Upstream), (OAuthError, bool)> {
    if !oidc.allow_password_grant {
        return Err((
            OAuthError::new(
                Code::AccessDenied,
                "Resource owner password credentials grant is not allowed for this upstream provider according to its configuration.",
            ),
            false,
        ));
    }
    let tokens = match oidc
        .provider
        .password_grant(&oidc.client, username, password)
        .await
    {
        Ok(tokens) => tokens,
        Err(error) if error.is_retryable() => {
            tracing::warn!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "the upstream password grant failed");
            return Err((unreachable_upstream(), false));
        }
        Err(error) => {
            tracing::info!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "upstream password grant refused");
            return Err((
                OAuthError::new(
                    Code::AccessDenied,
                    "Reason: the upstream identity provider did not accept the username or password.",
                ),
                true,
            ));
        }
    };
    oidc.login(tokens)
        .map_err(|reason| (OAuthError::new(Code::AccessDenied, &reason), false))
}

/// The OAuth error of a failed LDAP login (logged, without the password): the directory's
/// failures are `temporarily_unavailable`, the user's are `access_denied` in Pinniped's words,
/// the same for an unknown user and a wrong password.
fn ldap_refusal(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    ldap: &LdapUpstream,
    username: &str,
    error: &LdapError,
) -> OAuthError {
    if error.is_unavailable() {
        tracing::warn!(issuer = %issuer.issuer, idp = %ldap.display_name, %error, "the LDAP login could not be checked");
        return unreachable_upstream();
    }
    tracing::info!(issuer = %issuer.issuer, idp = %ldap.display_name, %error, "LDAP login refused");
    if *error == LdapError::InvalidCredentials {
        endpoints
            .audit
            .incorrect_password(&issuer.issuer, &ldap.display_name, username);
    }
    OAuthError::new(
        Code::AccessDenied,
        "Username/password not accepted by LDAP provider.",
    )
}

/// Sends the browser to the upstream (OIDC) or to the login page (LDAP, Active Directory), with
/// a sealed state and the CSRF cookie.
fn browser_login(
    issuer: &Arc<Issuer>,
    idp: &Arc<Upstream>,
    request: &AuthorizeRequest,
    query: &str,
    headers: &HeaderMap,
) -> Response<Body> {
    let back = |error: OAuthError| {
        refused(Refusal::Redirect {
            error,
            redirect_uri: request.redirect_uri.clone(),
            response_mode: request.response_mode,
            state: Some(request.state.clone()),
        })
    };
    let now = OffsetDateTime::now_utc();
    let existing_csrf = cookie(headers, CSRF_COOKIE)
        .and_then(|sealed| issuer.sealer.open::<String>(CSRF_PURPOSE, &sealed, now).ok());
    let (csrf, set_cookie) = match existing_csrf {
        Some(csrf) => (csrf, None),
        None => {
            let Some(csrf) = random_string() else {
                return back(OAuthError::new(Code::ServerError, ""));
            };
            match issuer.sealer.seal(CSRF_PURPOSE, &csrf, now + CSRF_LIFETIME) {
                Ok(sealed) => (csrf, Some(sealed)),
                Err(_) => return back(OAuthError::new(Code::ServerError, "")),
            }
        }
    };
    let Ok(upstream_params) = LoginParams::generate() else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let state = UpstreamState {
        authorize_query: query.to_string(),
        idp_name: idp.display_name().to_string(),
        nonce: upstream_params.nonce.clone(),
        verifier: upstream_params.verifier.clone(),
        csrf,
    };
    let Ok(sealed_state) = issuer
        .sealer
        .seal(STATE_PURPOSE, &state, now + UPSTREAM_STATE_LIFETIME)
    else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let url = match idp.as_ref() {
        Upstream::Oidc(oidc) => {
            let params = LoginParams {
                state: sealed_state,
                ..upstream_params
            };
            let extra: Vec<(&str, &str)> = oidc
                .additional_authorize_parameters
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            oidc.provider.authorize_url(
                &oidc.client,
                &params,
                &format!("{}{CALLBACK_PATH}", issuer.issuer),
                &extra,
            )
        }
        Upstream::Ldap(_) => login_page_url(issuer, &sealed_state, None),
        Upstream::GitHub(github) => github
            .github
            .authorize_url(&sealed_state, &format!("{}{CALLBACK_PATH}", issuer.issuer)),
    };
    let mut response = redirect(&url);
    if let Some(sealed) = set_cookie {
        let value = format!(
            "{CSRF_COOKIE}={sealed}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Lax",
            CSRF_LIFETIME.whole_seconds()
        );
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
    }
    response
}

/// `GET|POST /callback`: the upstream sends the browser back.
pub(super) async fn callback<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let encoded = if parts.method == http::Method::POST {
        match read_form(body).await {
            Some(form) => form_urlencoded::Serializer::new(String::new())
                .extend_pairs(form)
                .finish(),
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: the callback body is too large or unreadable",
                )
            }
        }
    } else {
        parts.uri.query().unwrap_or_default().to_string()
    };
    let params = CallbackParams::parse(&encoded);
    let now = OffsetDateTime::now_utc();
    let Some(sealed) = params.state.as_deref() else {
        return text(StatusCode::BAD_REQUEST, "Bad Request: state param not found");
    };
    let state = match open_state(issuer, sealed, &parts.headers, now) {
        Ok(state) => state,
        Err((status, message)) => return text(status, &message),
    };
    let request = match authorize::parse(&state.authorize_query, &|id| endpoints.client(id)) {
        Ok(request) => request,
        Err(refusal) => return refused(refusal),
    };
    let back = |error: OAuthError| {
        refused(Refusal::Redirect {
            error,
            redirect_uri: request.redirect_uri.clone(),
            response_mode: request.response_mode,
            state: Some(request.state.clone()),
        })
    };
    let Some(idp) = issuer.idp(Some(&state.idp_name), None) else {
        return back(OAuthError::new(
            Code::AccessDenied,
            "Reason: the identity provider of this login no longer exists.",
        ));
    };
    // The upstream's own answer: its state is the one just opened; only code or error matter.
    let code = match params.outcome(sealed) {
        CallbackOutcome::Code(code) => code,
        CallbackOutcome::Failed(reason) => {
            return back(OAuthError::new(Code::AccessDenied, &format!("Reason: {reason}.")));
        }
    };
    let oidc = match idp.as_ref() {
        Upstream::Oidc(oidc) => oidc,
        Upstream::GitHub(github) => return github_callback(endpoints, issuer, github, &request, &code).await,
        Upstream::Ldap(_) => {
            return back(OAuthError::new(
                Code::AccessDenied,
                "Reason: this identity provider does not log in through the callback.",
            ))
        }
    };
    let upstream_params = LoginParams {
        state: String::new(),
        nonce: state.nonce,
        verifier: state.verifier,
    };
    let tokens = match oidc
        .provider
        .exchange_code(
            &oidc.client,
            &upstream_params,
            &code,
            &format!("{}{CALLBACK_PATH}", issuer.issuer),
        )
        .await
    {
        Ok(tokens) => tokens,
        Err(error) => {
            tracing::warn!(issuer = %issuer.issuer, idp = %oidc.display_name, %error, "redeeming the upstream code failed");
            return back(if error.is_retryable() {
                unreachable_upstream()
            } else {
                OAuthError::new(
                    Code::AccessDenied,
                    "Reason: the upstream identity provider did not accept the authorization code.",
                )
            });
        }
    };
    let (identity, upstream) = match oidc.login(tokens) {
        Ok(found) => found,
        Err(reason) => return back(OAuthError::new(Code::AccessDenied, &reason)),
    };
    issue_code(endpoints, issuer, &request, identity, upstream).await
}

/// The end of a GitHub login: the code redeemed and the user read from GitHub's API, then the
/// downstream code issued. As Pinniped, GitHub's refusals are pages in the browser, not
/// redirects to the client: 502 when the code cannot be redeemed (503 when GitHub is
/// unavailable), 403 with the reason when the organization policy refuses the user, 422 when the
/// user cannot be read.
async fn github_callback(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    github: &GitHubUpstream,
    request: &AuthorizeRequest,
    code: &str,
) -> Response<Body> {
    let redirect_uri = format!("{}{CALLBACK_PATH}", issuer.issuer);
    match github.login(code, &redirect_uri).await {
        Ok((identity, upstream)) => issue_code(endpoints, issuer, request, identity, upstream).await,
        Err(GitHubError::Denied) => {
            tracing::info!(issuer = %issuer.issuer, idp = %github.display_name, "GitHub login refused by the organization policy");
            text(
                StatusCode::FORBIDDEN,
                &format!(
                    "Forbidden: login denied due to configuration on GitHubIdentityProvider with display name {:?}: {}",
                    github.display_name,
                    GitHubError::Denied
                ),
            )
        }
        Err(GitHubError::Unavailable(reason)) => {
            tracing::warn!(issuer = %issuer.issuer, idp = %github.display_name, %reason, "GitHub could not be asked at a login");
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: GitHub could not be reached, failed, or limited the rate of requests; try again later",
            )
        }
        Err(GitHubError::Refused(reason)) => {
            tracing::info!(issuer = %issuer.issuer, idp = %github.display_name, %reason, "GitHub login failed");
            if reason.starts_with("the token endpoint") {
                text(
                    StatusCode::BAD_GATEWAY,
                    "Bad Gateway: failed to exchange authcode using GitHub API",
                )
            } else {
                text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Unprocessable Entity: failed to get user info from GitHub API",
                )
            }
        }
    }
}

/// The login's sealed `state`, opened, and checked against the browser's CSRF cookie; else the
/// answer's status and text: 400 when it is not one of this FederationDomain's or has expired,
/// 403 when the cookie is missing or from another login.
fn open_state(
    issuer: &Arc<Issuer>,
    sealed: &str,
    headers: &HeaderMap,
    now: OffsetDateTime,
) -> Result<UpstreamState, (StatusCode, String)> {
    let state: UpstreamState = issuer.sealer.open(STATE_PURPOSE, sealed, now).map_err(|error| {
        (
            StatusCode::BAD_REQUEST,
            format!("Bad Request: error reading state: {error}"),
        )
    })?;
    let csrf_matches = cookie(headers, CSRF_COOKIE)
        .and_then(|sealed| issuer.sealer.open::<String>(CSRF_PURPOSE, &sealed, now).ok())
        .is_some_and(|csrf| constant_time_eq(csrf.as_bytes(), state.csrf.as_bytes()));
    if !csrf_matches {
        return Err((
            StatusCode::FORBIDDEN,
            "Forbidden: CSRF value does not match".into(),
        ));
    }
    Ok(state)
}

/// What the login page says above its form (`err` of its URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginAlert {
    /// `incorrect_username_or_password`: the same for an unknown user and a wrong password.
    Incorrect,
    /// `internal_error`: the directory could not be asked, or something else failed.
    Internal,
    /// `too_many_failures`: the username failed too often in a row; it must wait
    /// ([`crate::idp::throttle`]). Selkie's own (Pinniped does not throttle).
    TooManyFailures,
}

impl LoginAlert {
    fn param(self) -> &'static str {
        match self {
            Self::Incorrect => "incorrect_username_or_password",
            Self::Internal => "internal_error",
            Self::TooManyFailures => "too_many_failures",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Self::Incorrect => "Incorrect username or password.",
            Self::Internal => "An internal error occurred. Please contact your administrator for help.",
            Self::TooManyFailures => {
                "Too many failed logins for this username. Wait a few minutes, then try again."
            }
        }
    }
}

/// `<issuer>/login?state=…[&err=…]`.
fn login_page_url(issuer: &Issuer, sealed_state: &str, alert: Option<LoginAlert>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("state", sealed_state);
    if let Some(alert) = alert {
        query.append_pair("err", alert.param());
    }
    format!("{}{LOGIN_PATH}?{}", issuer.issuer, query.finish())
}

/// `GET|POST /login`: the LDAP and Active Directory login page, and its form's submission.
///
/// GET shows the form (with the message `err` names). POST checks the username and password at
/// the directory: a wrong one (or an unknown user, alike) comes back to the page with
/// "Incorrect username or password."; a directory that cannot be asked, with the internal error;
/// a good one ends like every login, with the client's code. Both need the login's `state` and
/// its CSRF cookie (400 / 403 otherwise).
pub(super) async fn login_page<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let post = parts.method == http::Method::POST;
    let form: Vec<(String, String)> = if post {
        match read_form(body).await {
            Some(form) => form,
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: the form is too large or unreadable",
                )
            }
        }
    } else {
        form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect()
    };
    let field = |name: &str| {
        form.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let Some(sealed) = field("state").filter(|state| !state.is_empty()) else {
        return text(StatusCode::BAD_REQUEST, "Bad Request: state param not found");
    };
    let now = OffsetDateTime::now_utc();
    let state = match open_state(issuer, sealed, &parts.headers, now) {
        Ok(state) => state,
        Err((status, message)) => return text(status, &message),
    };
    let Some(idp) = issuer.idp(Some(&state.idp_name), None) else {
        return text(
            StatusCode::BAD_REQUEST,
            "Bad Request: the identity provider of this login no longer exists",
        );
    };
    let Upstream::Ldap(ldap) = idp.as_ref() else {
        return text(
            StatusCode::BAD_REQUEST,
            "Bad Request: this identity provider does not log in with a password form",
        );
    };
    if !post {
        let alert = match field("err") {
            None | Some("") => None,
            Some("incorrect_username_or_password") => Some(LoginAlert::Incorrect),
            Some("too_many_failures") => Some(LoginAlert::TooManyFailures),
            Some(_) => Some(LoginAlert::Internal),
        };
        return login_form(&ldap.display_name, sealed, alert);
    }
    let request = match authorize::parse(&state.authorize_query, &|id| endpoints.client(id)) {
        Ok(request) => request,
        Err(refusal) => return refused(refusal),
    };
    let (username, password) = (
        field("username").unwrap_or_default(),
        field("password").unwrap_or_default(),
    );
    if username.is_empty() || password.is_empty() {
        return redirect(&login_page_url(issuer, sealed, Some(LoginAlert::Incorrect)));
    }
    let Ok(throttled) = may_try_password(endpoints, issuer, idp, username) else {
        return redirect(&login_page_url(issuer, sealed, Some(LoginAlert::TooManyFailures)));
    };
    match ldap.login(username, password).await {
        Ok((identity, upstream)) => {
            endpoints.passwords.succeeded(&throttled, username);
            issue_code(endpoints, issuer, &request, identity, upstream).await
        }
        Err(error) => {
            let alert = if error.is_unavailable() {
                LoginAlert::Internal
            } else {
                LoginAlert::Incorrect
            };
            if error == LdapError::InvalidCredentials {
                endpoints.passwords.failed(&throttled, username, Instant::now());
            }
            // Logged as the CLI flow logs it; the page says no more than the alert.
            let _ = ldap_refusal(endpoints, issuer, ldap, username, &error);
            redirect(&login_page_url(issuer, sealed, Some(alert)))
        }
    }
}

/// The login page: a plain form (no script), labelled fields with the browser's autocomplete
/// hints, the alert announced to screen readers, the form posting back to the page itself.
fn login_form(idp_name: &str, sealed_state: &str, alert: Option<LoginAlert>) -> Response<Body> {
    let alert = alert
        .map(|alert| {
            format!(
                r#"<p id="alert" role="alert" class="alert">{}</p>"#,
                html_escape(alert.message())
            )
        })
        .unwrap_or_default();
    let name = html_escape(idp_name);
    let page = format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Log in to {name}</title><style>body{{font-family:system-ui,sans-serif;max-width:24rem;margin:4rem auto;padding:0 1rem;line-height:1.5}}label{{display:block;margin-top:1rem;font-weight:600}}input{{width:100%;padding:.5rem;font-size:1rem;box-sizing:border-box}}button{{margin-top:1.5rem;padding:.6rem 1.2rem;font-size:1rem}}.alert{{border:2px solid #b00020;color:#b00020;padding:.5rem .75rem}}</style></head><body><main><h1>Log in to {name}</h1>{alert}<form method="post" action="login"><input type="hidden" name="state" value="{state}"><label for="username">Username</label><input type="text" id="username" name="username" autocomplete="username" autocapitalize="none" spellcheck="false" required autofocus><label for="password">Password</label><input type="password" id="password" name="password" autocomplete="current-password" required><button type="submit" id="submit">Log in</button></form></main></body></html>"#,
        state = html_escape(sealed_state),
    );
    html_page(
        page,
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' http: https:; frame-ancestors 'none'",
    )
}

/// An HTML page that is never cached or framed, under the Content-Security-Policy `csp`.
pub(super) fn html_page(page: String, csp: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(Bytes::from(page)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// The scopes a client is granted: what it asked for, and for the CLI always `username` and
/// `groups` (as Pinniped grants them, for old CLIs that did not ask).
pub(super) fn granted_scopes(request: &AuthorizeRequest) -> Vec<String> {
    let mut scopes = request.scopes.clone();
    if request.client_id == authorize::PINNIPED_CLI {
        for always in ["username", "groups"] {
            if !scopes.iter().any(|scope| scope == always) {
                scopes.push(always.to_string());
            }
        }
    }
    scopes
}

/// The FederationDomain's identity transforms for the login's identity provider run on the
/// upstream's identity: the downstream identity, the session keeping the upstream username and
/// groups for refreshes. A policy's refusal (with its message) or a failing expression is an
/// `access_denied`.
fn transformed(
    endpoints: &Endpoints,
    issuer: &Issuer,
    mut identity: Identity,
    mut upstream: session::Upstream,
) -> Result<(Identity, session::Upstream), OAuthError> {
    match issuer.transform(&upstream.idp_name, &identity.username, &identity.groups) {
        Ok(Outcome::Allowed { username, groups }) => {
            upstream.username = Some(std::mem::replace(&mut identity.username, username));
            upstream.groups = Some(std::mem::replace(&mut identity.groups, groups));
            Ok((identity, upstream))
        }
        Ok(Outcome::Rejected(message)) => {
            endpoints.audit.rejected_by_transforms(
                &issuer.issuer,
                &upstream.idp_name,
                &identity.username,
                &message,
            );
            Err(OAuthError::new(
                Code::AccessDenied,
                &format!("Reason: configured identity policy rejected this authentication: {message}."),
            ))
        }
        Err(error) => {
            tracing::warn!(issuer = %issuer.issuer, idp = %upstream.idp_name, %error, "the identity transforms failed at a login");
            Err(OAuthError::new(
                Code::AccessDenied,
                "Reason: the identity transformations failed; the Supervisor's log says why.",
            ))
        }
    }
}

/// Stores the login under a fresh authorization code and sends the code to the client.
async fn issue_code(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: &AuthorizeRequest,
    identity: Identity,
    upstream: session::Upstream,
) -> Response<Body> {
    let back = |error: OAuthError| {
        refused(Refusal::Redirect {
            error,
            redirect_uri: request.redirect_uri.clone(),
            response_mode: request.response_mode,
            state: Some(request.state.clone()),
        })
    };
    let (identity, upstream) = match transformed(endpoints, issuer, identity, upstream) {
        Ok(transformed) => transformed,
        Err(error) => return back(error),
    };
    let now = OffsetDateTime::now_utc();
    let (Ok(code), Some(request_id)) = (
        issuer.token_key.mint(Kind::AuthorizationCode),
        session::new_request_id(),
    ) else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let scopes = granted_scopes(request);
    let session = Session {
        request_id,
        client_id: request.client_id.clone(),
        redirect_uri: request.redirect_uri.clone(),
        scopes: scopes.clone(),
        nonce: request.nonce.clone(),
        code_challenge: request.code_challenge.clone(),
        requested_at: now.unix_timestamp(),
        auth_time: now.unix_timestamp(),
        expires_at: (now + session::MAX_SESSION).unix_timestamp(),
        code_active: true,
        token_expires_at: (now + session::AUTHORIZATION_CODE_LIFETIME).unix_timestamp(),
        identity,
        upstream,
        access_token_signature: None,
    };
    if let Err(error) = endpoints
        .store
        .create(
            Resource::AuthCode,
            &code.signature,
            &session,
            session::MAX_SESSION,
            now,
        )
        .await
    {
        tracing::error!(issuer = %issuer.issuer, %error, "storing an authorization code failed");
        return back(OAuthError::new(
            Code::TemporarilyUnavailable,
            "The session could not be stored; try again.",
        ));
    }
    endpoints.audit.session_started(&issuer.issuer, &session);
    let params = [
        ("code", code.token.as_str()),
        ("scope", &scopes.join(" ")),
        ("state", request.state.as_str()),
    ];
    match request.response_mode {
        ResponseMode::Query => redirect(&with_query(&request.redirect_uri, &params)),
        ResponseMode::FormPost => form_post(&request.redirect_uri, &params),
    }
}

/// The answer to a refused authorization request.
pub(super) fn refused(refusal: Refusal) -> Response<Body> {
    match refusal {
        Refusal::Direct(error) => oauth_error(&error),
        Refusal::Redirect {
            error,
            redirect_uri,
            response_mode,
            state,
        } => {
            let mut params = vec![
                ("error", error.code.as_str()),
                ("error_description", error.description.as_str()),
            ];
            if let Some(state) = state.as_deref() {
                params.push(("state", state));
            }
            match response_mode {
                ResponseMode::Query => redirect(&with_query(&redirect_uri, &params)),
                ResponseMode::FormPost => form_post(&redirect_uri, &params),
            }
        }
    }
}

fn with_query(uri: &str, params: &[(&str, &str)]) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{separator}{query}")
}

fn redirect(location: &str) -> Response<Body> {
    let mut response = Response::new(Body::default());
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The `form_post` page (OAuth 2.0 Form Post Response Mode): a form that posts `params` to
/// `redirect_uri` by itself, and shows the code for pasting when the CLI's listener cannot be
/// reached.
fn form_post(redirect_uri: &str, params: &[(&str, &str)]) -> Response<Body> {
    let inputs: String = params
        .iter()
        .map(|(name, value)| {
            format!(
                r#"<input type="hidden" name="{}" value="{}">"#,
                html_escape(name),
                html_escape(value)
            )
        })
        .collect();
    let code = params
        .iter()
        .find(|(name, _)| *name == "code")
        .map(|(_, code)| {
            format!(
                r#"<p>If the login does not finish by itself, paste this authorization code into the command line: <code id="manual-auth-code">{}</code></p>"#,
                html_escape(code)
            )
        })
        .unwrap_or_default();
    let page = format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Selkie login</title></head><body onload="document.forms[0].submit()"><form method="post" action="{}">{inputs}<noscript><button type="submit">Continue</button></noscript></form><p id="status">Finishing the login…</p>{code}</body></html>"#,
        html_escape(redirect_uri)
    );
    html_page(
        page,
        "default-src 'none'; script-src 'unsafe-inline'; form-action http: https:; frame-ancestors 'none'",
    )
}

/// `text` with HTML's special characters escaped, for element text and quoted attributes.
pub(super) fn html_escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&#39;".to_string(),
            other => other.to_string(),
        })
        .collect()
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

/// 32 random bytes, base64url.
pub(super) fn random_string() -> Option<String> {
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_go_back_with_the_state_or_are_answered_directly() {
        let error = OAuthError::new(Code::AccessDenied, "Missing or blank username or password.");
        let response = refused(Refusal::Redirect {
            error: error.clone(),
            redirect_uri: "http://127.0.0.1:1234/callback".into(),
            response_mode: ResponseMode::Query,
            state: Some("state-123456".into()),
        });
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let location = response.headers()[header::LOCATION].to_str().unwrap().to_string();
        let (base, query) = location.split_once('?').unwrap();
        assert_eq!(base, "http://127.0.0.1:1234/callback");
        let params = CallbackParams::parse(query);
        assert_eq!(params.error.as_deref(), Some("access_denied"));
        assert_eq!(params.state.as_deref(), Some("state-123456"));
        assert_eq!(
            params.error_description.as_deref(),
            Some(error.description.as_str())
        );
        let direct = refused(Refusal::Direct(OAuthError::new(Code::InvalidClient, "")));
        assert_eq!(direct.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn the_form_post_page_escapes_what_it_carries() {
        let response = form_post(
            "http://127.0.0.1:1234/callback",
            &[("code", "pin_ac_a.b"), ("state", "\"><script>")],
        );
        let page = body_text(response);
        assert!(page.contains(r#"action="http://127.0.0.1:1234/callback""#));
        assert!(page.contains(r#"<input type="hidden" name="code" value="pin_ac_a.b">"#));
        assert!(page.contains("&quot;&gt;&lt;script&gt;"));
        assert!(!page.contains("\"><script>"));
    }

    fn body_text(response: Response<Body>) -> String {
        String::from_utf8(
            futures::executor::block_on(http_body_util::BodyExt::collect(response.into_body()))
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    }

    #[test]
    fn the_login_page_is_a_plain_form_that_escapes_what_it_shows() {
        let response = login_form("Corp <LDAP>", "sealed\"><b>", Some(LoginAlert::Incorrect));
        assert_eq!(response.status(), StatusCode::OK);
        let csp = response.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .to_string();
        assert!(csp.starts_with("default-src 'none'"), "{csp}");
        assert!(!csp.contains("script-src"), "{csp}");
        let page = body_text(response);
        assert!(
            page.contains("<title>Log in to Corp &lt;LDAP&gt;</title>"),
            "{page}"
        );
        assert!(
            page.contains(r#"name="state" value="sealed&quot;&gt;&lt;b&gt;""#),
            "{page}"
        );
        assert!(
            page.contains(r#"<p id="alert" role="alert" class="alert">Incorrect username or password.</p>"#)
        );
        assert!(
            page.contains(r#"<label for="username">"#) && page.contains(r#"autocomplete="current-password""#)
        );
        assert!(!page.contains("<script"), "{page}");
        // Without an alert there is no alert element.
        assert!(!body_text(login_form("Corp", "s", None)).contains("role=\"alert\""));
    }

    #[test]
    fn the_alerts_use_pinnipeds_error_values_and_messages() {
        assert_eq!(LoginAlert::Incorrect.param(), "incorrect_username_or_password");
        assert_eq!(LoginAlert::Internal.param(), "internal_error");
        // Selkie's own, for a username that must wait (crate::idp::throttle).
        assert_eq!(LoginAlert::TooManyFailures.param(), "too_many_failures");
        let page = body_text(login_form("Corp", "s", Some(LoginAlert::TooManyFailures)));
        assert!(
            page.contains("Too many failed logins for this username."),
            "{page}"
        );
        assert_eq!(
            LoginAlert::Internal.message(),
            "An internal error occurred. Please contact your administrator for help."
        );
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-pinniped-csrf-v2=xyz; b=2"),
        );
        assert_eq!(cookie(&headers, CSRF_COOKIE).as_deref(), Some("xyz"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
