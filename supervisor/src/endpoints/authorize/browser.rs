//! A login in a browser: it goes to the upstream with the Supervisor's own PKCE, nonce and a
//! `state` that seals the whole authorization request (nothing is stored until the user comes
//! back, so any replica can take the callback), and a CSRF cookie ties the callback to the browser
//! that started it; LDAP and Active Directory go to the Supervisor's own login page with the same
//! sealed `state` and cookie; SAML identity providers get an AuthnRequest (HTTP-Redirect binding)
//! whose `RelayState` is the request's ID, which names a cookie of the browser's holding the
//! sealed state ([`SAML_STATE_COOKIE_PREFIX`]): SAML allows a `RelayState` of 80 bytes at most.

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

/// The state of a SAML login in progress is the cookie `__Host-selkie-saml-<ID>`, where `<ID>` is
/// the AuthnRequest's ID and the login's `RelayState` (SAML bindings §3.4.3: at most 80 bytes; the
/// sealed state is several hundred). One per login, so that logins in several tabs do not
/// overwrite each other; `SameSite=None`, since the identity provider sends the browser back with
/// a cross-site `POST` (HTTP-POST binding), which carries no `SameSite=Lax` cookie. Only the
/// browser that started the login holds it: it is also the login's CSRF check. It lives as long
/// as the login's state, and the assertion consumer service clears it.
pub(crate) const SAML_STATE_COOKIE_PREFIX: &str = "__Host-selkie-saml-";

/// The longest sealed state a SAML state cookie may hold: browsers keep a cookie of up to 4096
/// bytes, name and value together.
const MAX_SAML_STATE_COOKIE: usize = 4000;

/// How long the CSRF cookie lives.
pub(crate) const CSRF_LIFETIME: time::Duration = time::Duration::days(7);

/// How long the upstream state of a login in progress is honoured.
pub(crate) const UPSTREAM_STATE_LIFETIME: time::Duration = time::Duration::minutes(90);

pub(crate) const CSRF_PURPOSE: &str = "csrf";

pub(crate) const STATE_PURPOSE: &str = "upstream-state";

/// What a SAML login's state cookie is sealed for: it opens nowhere else.
const SAML_STATE_PURPOSE: &str = "saml-state";

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
    /// SAML: the ID of the AuthnRequest, which the response must answer (`InResponseTo`), and
    /// the login's `RelayState`.
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
    let purpose = match idp.as_ref() {
        Upstream::Saml(_) => SAML_STATE_PURPOSE,
        _ => STATE_PURPOSE,
    };
    let Ok(sealed_state) = issuer.sealer.seal(purpose, &state, now + UPSTREAM_STATE_LIFETIME) else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    // A SAML login's state goes into a cookie ([`SAML_STATE_COOKIE_PREFIX`]).
    let saml_state = match idp.as_ref() {
        Upstream::Saml(_) if sealed_state.len() > MAX_SAML_STATE_COOKIE => {
            return back(OAuthError::new(
                Code::InvalidRequest,
                "the authorization request is too long for a SAML login",
            ))
        }
        Upstream::Saml(_) => match saml_state_cookie(
            &state.saml_request_id,
            &sealed_state,
            UPSTREAM_STATE_LIFETIME.whole_seconds(),
        ) {
            Some(cookie) => Some(cookie),
            None => return back(OAuthError::new(Code::ServerError, "")),
        },
        _ => None,
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
            &state.saml_request_id,
            now,
        ),
    };
    let mut response = redirect(&url);
    set_csrf_cookie(&mut response, set_cookie);
    if let Some(state_cookie) = saml_state {
        response.headers_mut().append(header::SET_COOKIE, state_cookie);
    }
    response
}

/// The `Set-Cookie` value of the state cookie of the SAML login `request_id`, holding `value`
/// for `max_age` seconds (0 clears it). `None` when the two make no header value.
fn saml_state_cookie(request_id: &str, value: &str, max_age: i64) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{SAML_STATE_COOKIE_PREFIX}{request_id}={value}; Path=/; Max-Age={max_age}; HttpOnly; Secure; SameSite=None"
    ))
    .ok()
}

/// Clears the state cookie of the SAML login `request_id` on `response` (the assertion consumer
/// service's answer, whatever it is: the login is over).
pub(crate) fn clear_saml_state_cookie(response: &mut Response<Body>, request_id: &str) {
    if let Some(value) = saml_state_cookie(request_id, "", 0) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
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
    cookie(headers, CSRF_COOKIE)
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
    if !csrf_matches(issuer, headers, &state.csrf, now) {
        return Err((
            StatusCode::FORBIDDEN,
            "Forbidden: CSRF value does not match".into(),
        ));
    }
    Ok(state)
}

/// A SAML login's state at the assertion consumer service, from the form's `relay_state`: the
/// state cookie it names ([`SAML_STATE_COOKIE_PREFIX`]), opened, answering the AuthnRequest of
/// that ID (constant time). Else the answer's status and text: 400 when `relay_state` is not an
/// AuthnRequest ID of the Supervisor's or the state cannot be opened (expired, another
/// FederationDomain's), 403 when this browser holds no state of that login (it did not start it).
pub(crate) fn open_saml_state(
    issuer: &Issuer,
    relay_state: &str,
    headers: &HeaderMap,
    now: OffsetDateTime,
) -> Result<UpstreamState, (StatusCode, String)> {
    if !ServiceProvider::is_request_id(relay_state) {
        return Err((
            StatusCode::BAD_REQUEST,
            "Bad Request: the RelayState is not that of a SAML login".into(),
        ));
    }
    let Some(sealed) = cookie(headers, &format!("{SAML_STATE_COOKIE_PREFIX}{relay_state}")) else {
        return Err((
            StatusCode::FORBIDDEN,
            "Forbidden: this browser did not start this SAML login (its state cookie is missing)".into(),
        ));
    };
    let state: UpstreamState = issuer
        .sealer
        .open(SAML_STATE_PURPOSE, &sealed, now)
        .map_err(|error| {
            (
                StatusCode::BAD_REQUEST,
                format!("Bad Request: error reading state: {error}"),
            )
        })?;
    if !bool::from(state.saml_request_id.as_bytes().ct_eq(relay_state.as_bytes())) {
        return Err((
            StatusCode::FORBIDDEN,
            "Forbidden: the state cookie is not that of this SAML login".into(),
        ));
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use selkie_oidc::jose::sign::SigningKey;

    use super::*;
    use crate::endpoints::authorize::{parse, Client, PINNIPED_CLI};
    use crate::idp::saml::IdpMetadata;
    use crate::idp::SamlUpstream;
    use crate::sealed::Sealer;
    use crate::session::tokens::TokenKey;

    const ISSUER: &str = "https://sso.example.com/fd";

    fn issuer(sealer_key: u8) -> Arc<Issuer> {
        let metadata = IdpMetadata::parse(&crate::idp::saml::tests::test_idp_metadata_xml()).unwrap();
        let saml = Arc::new(Upstream::Saml(SamlUpstream {
            display_name: "Keycloak".into(),
            resource_name: "keycloak".into(),
            resource_uid: String::new(),
            metadata: Arc::new(metadata),
            username_attribute: None,
            groups_attribute: None,
            clock_skew: Duration::from_secs(90),
        }));
        Arc::new(
            Issuer::new(
                ISSUER.into(),
                ISSUER.into(),
                Arc::new(SigningKey::generate("k").unwrap()),
                Bytes::new(),
                Arc::new(TokenKey::new(&[1; 32])),
                Arc::new(Sealer::new(&[sealer_key; 32], ISSUER).unwrap()),
                vec![saml],
                Default::default(),
                Default::default(),
            )
            .unwrap(),
        )
    }

    fn query(state: &str) -> String {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs([
                ("client_id", PINNIPED_CLI),
                ("redirect_uri", "http://127.0.0.1:51234/callback"),
                ("response_type", "code"),
                ("scope", "openid offline_access groups"),
                ("state", state),
                ("nonce", "nonce-0123456789"),
                ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
                ("code_challenge_method", "S256"),
                ("pinniped_idp_name", "Keycloak"),
            ])
            .finish()
    }

    /// Starts a SAML login at `issuer` for a client whose `state` is `client_state`: the RelayState
    /// the identity provider is sent, and the cookies set (`name=value`, attributes).
    fn start(issuer: &Arc<Issuer>, client_state: &str) -> (Response<Body>, String, Vec<String>) {
        let query = query(client_state);
        let clients = |id: &str| (id == PINNIPED_CLI).then(Client::pinniped_cli);
        let request = parse(&query, &clients).unwrap();
        let idp = issuer.idp(Some("Keycloak"), None).unwrap().clone();
        let response = browser_login(issuer, &idp, &request, &query, &HeaderMap::new());
        let location = response.headers()[header::LOCATION].to_str().unwrap().to_string();
        let (_, params) = location.split_once('?').unwrap();
        let relay_state = form_urlencoded::parse(params.as_bytes())
            .find(|(name, _)| name == "RelayState")
            .map(|(_, value)| value.into_owned())
            .unwrap();
        let cookies = response
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|value| value.to_str().unwrap().to_string())
            .collect();
        (response, relay_state, cookies)
    }

    fn cookie_header(set_cookie: &str) -> HeaderMap {
        let pair = set_cookie.split(';').next().unwrap();
        HeaderMap::from_iter([(header::COOKIE, HeaderValue::from_str(pair).unwrap())])
    }

    fn state_cookie(cookies: &[String]) -> String {
        cookies
            .iter()
            .find(|cookie| cookie.starts_with(SAML_STATE_COOKIE_PREFIX))
            .unwrap()
            .clone()
    }

    #[test]
    fn a_saml_login_sends_a_short_relay_state_and_keeps_its_state_in_a_cookie_of_its_own() {
        let issuer = issuer(2);
        let now = OffsetDateTime::now_utc();
        // A long client state makes a long sealed state; the RelayState stays short.
        let (response, relay_state, cookies) = start(&issuer, &"s".repeat(600));
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        assert!(relay_state.len() <= 80, "{relay_state}");
        assert!(ServiceProvider::is_request_id(&relay_state), "{relay_state}");
        let cookie = state_cookie(&cookies);
        assert!(
            cookie.starts_with(&format!("{SAML_STATE_COOKIE_PREFIX}{relay_state}=")),
            "{cookie}"
        );
        for attribute in ["Path=/", "Max-Age=5400", "HttpOnly", "Secure", "SameSite=None"] {
            assert!(
                cookie.contains(&format!("; {attribute}")),
                "{attribute}: {cookie}"
            );
        }

        // The assertion consumer service finds the login by its RelayState.
        let state = open_saml_state(&issuer, &relay_state, &cookie_header(&cookie), now).unwrap();
        assert_eq!(state.saml_request_id, relay_state);
        assert_eq!(state.idp_name, "Keycloak");
        assert!(parse(&state.authorize_query, &|id| (id == PINNIPED_CLI)
            .then(Client::pinniped_cli))
        .is_ok());

        // A second login in another tab has a cookie of its own: both stay usable.
        let (_, other_relay_state, other_cookies) = start(&issuer, "state-0123456789");
        assert_ne!(other_relay_state, relay_state);
        let other_cookie = state_cookie(&other_cookies);
        let mut both = cookie_header(&cookie);
        both.append(
            header::COOKIE,
            cookie_header(&other_cookie)[header::COOKIE].clone(),
        );
        assert!(open_saml_state(&issuer, &relay_state, &both, now).is_ok());
        assert!(open_saml_state(&issuer, &other_relay_state, &both, now).is_ok());

        // The answer clears the cookie.
        let mut answer = Response::new(Body::default());
        clear_saml_state_cookie(&mut answer, &relay_state);
        let cleared = answer.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(
            cleared.starts_with(&format!("{SAML_STATE_COOKIE_PREFIX}{relay_state}=;"))
                && cleared.contains("; Max-Age=0;"),
            "{cleared}"
        );
    }

    #[test]
    fn a_saml_login_is_found_only_with_its_own_cookie() {
        let elsewhere = issuer(3);
        let issuer = issuer(2);
        let now = OffsetDateTime::now_utc();
        let (_, relay_state, cookies) = start(&issuer, "state-0123456789");
        let cookie = state_cookie(&cookies);
        let refusal = |relay: &str, headers: &HeaderMap| match open_saml_state(&issuer, relay, headers, now) {
            Ok(_) => panic!("opened with RelayState {relay}"),
            Err((status, message)) => (status, message),
        };

        // Not a request ID: the sealed state itself, a path, upper case, too short.
        let sealed = cookie
            .split(';')
            .next()
            .unwrap()
            .split_once('=')
            .unwrap()
            .1
            .to_string();
        for relay in [
            sealed.as_str(),
            "../x",
            &relay_state.to_uppercase(),
            &relay_state[..20],
            "",
        ] {
            let (status, message) = refusal(relay, &cookie_header(&cookie));
            assert_eq!(status, StatusCode::BAD_REQUEST, "{relay}");
            assert!(message.contains("not that of a SAML login"), "{message}");
        }

        // No cookie, or only another login's: this browser did not start the login.
        let (_, other_relay_state, other_cookies) = start(&issuer, "state-0123456789");
        for headers in [HeaderMap::new(), cookie_header(&state_cookie(&other_cookies))] {
            let (status, message) = refusal(&relay_state, &headers);
            assert_eq!(status, StatusCode::FORBIDDEN);
            assert!(message.contains("did not start this SAML login"), "{message}");
        }

        // Another login's state under this login's name: refused.
        let swapped = format!("{SAML_STATE_COOKIE_PREFIX}{relay_state}={}", {
            let other = state_cookie(&other_cookies);
            other
                .split(';')
                .next()
                .unwrap()
                .split_once('=')
                .unwrap()
                .1
                .to_string()
        });
        let (status, message) = refusal(&relay_state, &cookie_header(&swapped));
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(message.contains("not that of this SAML login"), "{message}");
        assert_ne!(other_relay_state, relay_state);

        // A state sealed for the callback (an OIDC login's), another FederationDomain's key, or
        // an expired one does not open.
        let upstream_state = issuer
            .sealer
            .seal(
                STATE_PURPOSE,
                &open_saml_state(&issuer, &relay_state, &cookie_header(&cookie), now).unwrap(),
                now + UPSTREAM_STATE_LIFETIME,
            )
            .unwrap();
        let as_callback_state = format!("{SAML_STATE_COOKIE_PREFIX}{relay_state}={upstream_state}");
        let (status, _) = refusal(&relay_state, &cookie_header(&as_callback_state));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = match open_saml_state(&elsewhere, &relay_state, &cookie_header(&cookie), now) {
            Ok(_) => panic!("opened with another key"),
            Err(refusal) => refusal,
        };
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let later = now + UPSTREAM_STATE_LIFETIME + time::Duration::seconds(1);
        let (status, message) = match open_saml_state(&issuer, &relay_state, &cookie_header(&cookie), later) {
            Ok(_) => panic!("opened after its lifetime"),
            Err(refusal) => refusal,
        };
        assert_eq!(status, StatusCode::BAD_REQUEST, "{message}");
    }
}
