//! A login in a browser: it goes to the upstream with the Supervisor's own PKCE, nonce and a
//! `state` that seals the whole authorization request (nothing is stored until the user comes
//! back, so any replica can take the callback), and a CSRF cookie ties the callback to the browser
//! that started it; LDAP and Active Directory go to the Supervisor's own login page with the same
//! sealed `state` and cookie; SAML identity providers get an AuthnRequest (HTTP-Redirect binding)
//! whose `RelayState` is the sealed state, which carries the request's ID, and a second CSRF
//! cookie that a cross-site POST still carries ([`SAML_CSRF_COOKIE`]).

use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use selkie_oidc::rp::LoginParams;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;

use crate::endpoints::authorize::{AuthorizeRequest, Refusal};
use crate::endpoints::discovery::CALLBACK_PATH;
use crate::endpoints::html::{cookie, random_string, redirect, refused};
use crate::endpoints::login_page::login_page_url;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::Body;
use crate::idp::saml::ServiceProvider;
use crate::idp::Upstream;
use crate::issuer::Issuer;

/// The CSRF cookie (the `__Host-` prefix: Secure, Path=/, no Domain).
pub(crate) const CSRF_COOKIE: &str = "__Host-pinniped-csrf-v2";

/// The CSRF cookie of SAML logins: the same sealed value as [`CSRF_COOKIE`], but `SameSite=None`,
/// since the identity provider sends the browser back with a cross-site `POST` (HTTP-POST
/// binding), which carries no `SameSite=Lax` cookie. It lives as long as the login's state.
pub(crate) const SAML_CSRF_COOKIE: &str = "__Host-selkie-saml-csrf";

/// How long the CSRF cookie lives.
pub(crate) const CSRF_LIFETIME: time::Duration = time::Duration::days(7);

/// How long the upstream state of a login in progress is honoured.
pub(crate) const UPSTREAM_STATE_LIFETIME: time::Duration = time::Duration::minutes(90);

pub(crate) const CSRF_PURPOSE: &str = "csrf";

pub(crate) const STATE_PURPOSE: &str = "upstream-state";

/// What the upstream `state` parameter carries through the upstream login.
#[derive(Serialize, Deserialize)]
pub(crate) struct UpstreamState {
    /// The client's authorization request, as it came (checked again at the callback).
    pub(crate) authorize_query: String,
    /// The identity provider's display name.
    pub(crate) idp_name: String,
    /// The Supervisor's nonce at the upstream.
    pub(crate) nonce: String,
    /// The Supervisor's PKCE verifier at the upstream.
    pub(crate) verifier: String,
    /// The CSRF value the callback's cookie must hold.
    pub(crate) csrf: String,
    /// SAML: the ID of the AuthnRequest, which the response must answer (`InResponseTo`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) saml_request_id: String,
}

/// Sends the browser to the upstream (OIDC) or to the login page (LDAP, Active Directory), with
/// a sealed state and the CSRF cookie.
pub(crate) fn browser_login(
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
    let Some((csrf, set_cookie)) = browser_csrf(issuer, headers, now) else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let Ok(upstream_params) = LoginParams::generate() else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let saml_request_id = match idp.as_ref() {
        Upstream::Saml(_) => match ServiceProvider::new_request_id() {
            Some(id) => id,
            None => return back(OAuthError::new(Code::ServerError, "")),
        },
        _ => String::new(),
    };
    let state = UpstreamState {
        authorize_query: query.to_string(),
        idp_name: idp.display_name().to_string(),
        nonce: upstream_params.nonce.clone(),
        verifier: upstream_params.verifier.clone(),
        csrf: csrf.clone(),
        saml_request_id,
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
        Upstream::Saml(saml) => issuer.saml_service_provider().authn_request_url(
            &saml.metadata,
            &state.saml_request_id,
            &sealed_state,
            now,
        ),
    };
    let mut response = redirect(&url);
    set_csrf_cookie(&mut response, set_cookie);
    if matches!(idp.as_ref(), Upstream::Saml(_)) {
        let Ok(sealed) = issuer
            .sealer
            .seal(CSRF_PURPOSE, &csrf, now + UPSTREAM_STATE_LIFETIME)
        else {
            return back(OAuthError::new(Code::ServerError, ""));
        };
        let value = format!(
            "{SAML_CSRF_COOKIE}={sealed}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=None",
            UPSTREAM_STATE_LIFETIME.whole_seconds()
        );
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// The browser's CSRF value at `now`: the one its CSRF cookie seals, or a fresh one and the
/// sealed cookie value to set ([`set_csrf_cookie`]). `None` without secure randomness.
pub(crate) fn browser_csrf(
    issuer: &Issuer,
    headers: &HeaderMap,
    now: OffsetDateTime,
) -> Option<(String, Option<String>)> {
    let existing = cookie(headers, CSRF_COOKIE)
        .and_then(|sealed| issuer.sealer.open::<String>(CSRF_PURPOSE, &sealed, now).ok());
    match existing {
        Some(csrf) => Some((csrf, None)),
        None => {
            let csrf = random_string()?;
            let sealed = issuer
                .sealer
                .seal(CSRF_PURPOSE, &csrf, now + CSRF_LIFETIME)
                .ok()?;
            Some((csrf, Some(sealed)))
        }
    }
}

/// Sets the CSRF cookie to `sealed` on `response`, when there is one to set.
pub(crate) fn set_csrf_cookie(response: &mut Response<Body>, sealed: Option<String>) {
    let Some(sealed) = sealed else {
        return;
    };
    let value = format!(
        "{CSRF_COOKIE}={sealed}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Lax",
        CSRF_LIFETIME.whole_seconds()
    );
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
}

/// Whether `presented` is the CSRF value the browser's CSRF cookie seals (constant time).
pub(crate) fn csrf_matches(
    issuer: &Issuer,
    headers: &HeaderMap,
    presented: &str,
    now: OffsetDateTime,
) -> bool {
    cookie_csrf_matches(issuer, headers, CSRF_COOKIE, presented, now)
}

/// Whether `presented` is the CSRF value cookie `name` seals (constant time).
fn cookie_csrf_matches(
    issuer: &Issuer,
    headers: &HeaderMap,
    name: &str,
    presented: &str,
    now: OffsetDateTime,
) -> bool {
    cookie(headers, name)
        .and_then(|sealed| issuer.sealer.open::<String>(CSRF_PURPOSE, &sealed, now).ok())
        .is_some_and(|csrf| bool::from(csrf.as_bytes().ct_eq(presented.as_bytes())))
}

/// The login's sealed `state`, opened, and checked against the browser's CSRF cookie; else the
/// answer's status and text: 400 when it is not one of this FederationDomain's or has expired,
/// 403 when the cookie is missing or from another login.
pub(crate) fn open_state(
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
    // A SAML login comes back in a cross-site POST, with its own cookie (`SameSite=None`).
    let matches = csrf_matches(issuer, headers, &state.csrf, now)
        || (!state.saml_request_id.is_empty()
            && cookie_csrf_matches(issuer, headers, SAML_CSRF_COOKIE, &state.csrf, now));
    if !matches {
        return Err((
            StatusCode::FORBIDDEN,
            "Forbidden: CSRF value does not match".into(),
        ));
    }
    Ok(state)
}
