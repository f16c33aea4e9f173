//! The device authorization grant (RFC 8628), for FederationDomains that enable it
//! (`spec.deviceAuthorization.enabled`): a login begun by the CLI where no browser can be opened,
//! finished in a browser on any device.
//!
//! 1. `POST /oauth2/device_authorization` ([`device_authorization`]): the CLI (`pinniped-cli`
//!    only) asks with its scopes, PKCE challenge and nonce, and gets a device code, a user code
//!    and the verification URI. The request is checked as the authorization request the login
//!    will make ([`authorize::parse`]), so it is refused here, at once, for what would refuse it
//!    there; the device login is stored ([`crate::session::device`], one `POST`).
//! 2. `GET|POST /device` ([`verification`]): the user enters the user code (the page is CSRF
//!    protected; a code in the link is only filled in, never submitted for the user), and the
//!    browser goes on to `oauth2/authorize` with the device login's authorization request,
//!    whose redirect URI is this FederationDomain's `device/callback`: every identity provider,
//!    the chooser, identity transforms and policies work as in any login.
//! 3. `GET /device/callback` ([`callback`]): the login's authorization code (or its error) is
//!    stored in the device login (one conditional `PATCH`), and the page tells the user to go
//!    back to their device.
//! 4. The CLI polls `oauth2/token` (`crate::endpoints::token`'s device grant) and redeems the
//!    code with its PKCE verifier, so the device code alone gets no tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use serde_json::json;
use time::OffsetDateTime;

use crate::endpoints::authorize::{self, browser_csrf, csrf_matches, set_csrf_cookie, Refusal};
use crate::endpoints::discovery::{AUTHORIZE_PATH, DEVICE_CALLBACK_PATH, DEVICE_CODE_GRANT, DEVICE_PATH};
use crate::endpoints::html::{html_escape, html_page, redirect};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::token::{authenticate, client_error, form_params, store_failed};
use crate::endpoints::{json, read_form, Body, Endpoints};
use crate::issuer::Issuer;
use crate::session::device::{self, DeviceLogin, DeviceRequest, DeviceStatus};
use crate::session::store::StoreError;
use crate::session::tokens::{Kind, LoginRef};

/// How many user codes are tried when a fresh one is taken already.
const USER_CODE_ATTEMPTS: usize = 3;

/// `POST /oauth2/device_authorization`: a device code, a user code and where to enter it (RFC
/// 8628 §3.2), or an OAuth error: `invalid_client` / `unauthorized_client` for any client but
/// the CLI, what the authorization request would be refused for (scope, PKCE, nonce), an unknown
/// `pinniped_idp_name`, `temporarily_unavailable` when the store fails.
pub(crate) async fn device_authorization<B>(
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
        Err(error) => return client_error(&error),
    };
    match authorized(endpoints, issuer, &parts.headers, &params).await {
        Ok(body) => json(StatusCode::OK, Bytes::from(body.to_string())),
        Err(error) => client_error(&error),
    }
}

async fn authorized(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    headers: &http::HeaderMap,
    params: &HashMap<String, String>,
) -> Result<serde_json::Value, OAuthError> {
    let client = authenticate(endpoints, headers, params).await?;
    if !client.grant_types.iter().any(|grant| grant == DEVICE_CODE_GRANT) {
        return Err(OAuthError::new(
            Code::UnauthorizedClient,
            &format!(
                "The OAuth 2.0 Client is not allowed to use authorization grant \"{}\".",
                DEVICE_CODE_GRANT
            ),
        ));
    }
    let now = OffsetDateTime::now_utc();
    let server_error = || OAuthError::new(Code::ServerError, "");
    for _ in 0..USER_CODE_ATTEMPTS {
        let user_code = device::new_user_code().ok_or_else(server_error)?;
        let id = device::id_of(&user_code);
        let state = device::new_state(&id).ok_or_else(server_error)?;
        let query = authorize_query(issuer, &client.id, params, &state);
        let checked =
            authorize::parse(&query, &|id| endpoints.client(issuer, id)).map_err(
                |refusal| match refusal {
                    Refusal::Direct(error) | Refusal::Redirect { error, .. } => error,
                },
            )?;
        if let Some(name) = &checked.idp_name {
            if issuer.idp(Some(name), checked.idp_type.as_deref()).is_none() {
                return Err(OAuthError::new(
                    Code::InvalidRequest,
                    &format!("\"pinniped_idp_name\" param error: did not find an identity provider named {name:?}."),
                ));
            }
        }
        let device_code = issuer
            .token_key
            .mint(Kind::DeviceCode, LoginRef { id, generation: 0 })
            .map_err(|_| server_error())?;
        let login = DeviceLogin {
            id,
            request: DeviceRequest {
                issuer: issuer.issuer.clone(),
                client_id: checked.client_id,
                code_challenge: checked.code_challenge,
                authorize_query: query,
                device_code_signature: device_code.signature.clone(),
                state,
                expires_at: (now + device::DEVICE_CODE_LIFETIME).unix_timestamp(),
            },
            status: DeviceStatus::Pending,
        };
        match endpoints.store.create_device(&login, now).await {
            Ok(()) => {}
            // The user code is someone else's (one in 2.56 × 10¹⁰ per live code): another one.
            Err(StoreError::Conflict) => continue,
            Err(error) => return Err(store_failed(&error)),
        }
        let verification_uri = format!("{}{DEVICE_PATH}", issuer.issuer);
        return Ok(json!({
            "device_code": device_code.token,
            "user_code": user_code,
            "verification_uri": verification_uri,
            "verification_uri_complete": format!("{verification_uri}?user_code={user_code}"),
            "expires_in": device::DEVICE_CODE_LIFETIME.whole_seconds(),
            "interval": device::POLL_INTERVAL.whole_seconds(),
        }));
    }
    Err(OAuthError::new(
        Code::TemporarilyUnavailable,
        "No free user code was found; try again.",
    ))
}

/// The authorization request a device login makes (its query string): the device authorization
/// request's scope, PKCE challenge, nonce and identity provider, sent back to the
/// FederationDomain's device callback with `state`.
fn authorize_query(
    issuer: &Issuer,
    client_id: &str,
    params: &HashMap<String, String>,
    state: &str,
) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("client_id", client_id)
        .append_pair(
            "redirect_uri",
            &format!("{}{DEVICE_CALLBACK_PATH}", issuer.issuer),
        )
        .append_pair("response_type", "code")
        .append_pair("state", state);
    for name in [
        "scope",
        "nonce",
        "code_challenge",
        "code_challenge_method",
        "pinniped_idp_name",
        "pinniped_idp_type",
    ] {
        if let Some(value) = params.get(name) {
            query.append_pair(name, value);
        }
    }
    query.finish()
}

/// `GET|POST /device`: the verification page. GET shows the form (the `user_code` of the link
/// filled in); POST checks the form's CSRF value against the browser's CSRF cookie (403
/// otherwise), finds the device login of the user code, and sends the browser on to its
/// authorization request (303). A code that is malformed, unknown, expired, of another
/// FederationDomain or used already shows the form again with the reason (400).
pub(crate) async fn verification<B>(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: Request<B>,
) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let now = OffsetDateTime::now_utc();
    let Some((csrf, set_cookie)) = browser_csrf(issuer, &parts.headers, now) else {
        return page(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Something went wrong",
            "Try again.",
            None,
        );
    };
    let form_page = |status, alert: Option<&str>, typed: &str| {
        let mut response = code_form(status, alert, typed, &csrf);
        set_csrf_cookie(&mut response, set_cookie.clone());
        response
    };
    if parts.method != http::Method::POST {
        let typed = form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .find(|(name, _)| name == "user_code")
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        return form_page(StatusCode::OK, None, &typed);
    }
    let Some(form) = read_form(body).await else {
        return form_page(
            StatusCode::BAD_REQUEST,
            Some("The form could not be read; try again."),
            "",
        );
    };
    let field = |name: &str| {
        form.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
            .unwrap_or_default()
    };
    let typed = field("user_code");
    if !csrf_matches(issuer, &parts.headers, field("csrf"), now) {
        return page(
            StatusCode::FORBIDDEN,
            "This form has expired",
            "Open the link your device shows again.",
            None,
        );
    }
    let Some(user_code) = device::normalize_user_code(typed) else {
        return form_page(
            StatusCode::BAD_REQUEST,
            Some("That is not a code of this form: eight letters, such as BCDF-GHJK."),
            typed,
        );
    };
    let unknown =
        "That code is unknown, used already or expired. Start the login on your device again for a new one.";
    match endpoints.store.get_device(&device::id_of(&user_code)).await {
        Ok(Some(login))
            if login.request.issuer == issuer.issuer
                && login.status == DeviceStatus::Pending
                && !login.request.expired(now) =>
        {
            let mut response = redirect(&format!(
                "{}{AUTHORIZE_PATH}?{}",
                issuer.issuer, login.request.authorize_query
            ));
            set_csrf_cookie(&mut response, set_cookie.clone());
            response
        }
        Ok(_) => form_page(StatusCode::BAD_REQUEST, Some(unknown), typed),
        Err(error) => {
            tracing::error!(issuer = %issuer.issuer, %error, "reading a device login failed");
            form_page(
                StatusCode::SERVICE_UNAVAILABLE,
                Some("The code could not be checked just now; try again."),
                typed,
            )
        }
    }
}

/// `GET /device/callback`: where a device login's authorization request ends. Its `state` must be
/// a pending device login's (400 otherwise); its `code` (or `error`) is stored for the CLI's
/// next poll, once (409 when the device login was finished already). The page names an error
/// by its code only, never quoting the redirect's description.
pub(crate) async fn callback(endpoints: &Endpoints, issuer: &Arc<Issuer>, query: &str) -> Response<Body> {
    let params: HashMap<String, String> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let get = |name: &str| {
        params
            .get(name)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    };
    let bad = || {
        page(
            StatusCode::BAD_REQUEST,
            "This login cannot be finished",
            "It is not a device login of this server, or it expired. Start the login on your device again.",
            None,
        )
    };
    let Some((state, id)) = get("state").and_then(|state| Some((state, device::id_of_state(state)?))) else {
        return bad();
    };
    let login = match endpoints.store.get_device(&id).await {
        Ok(Some(login)) => login,
        Ok(None) => return bad(),
        Err(error) => {
            tracing::error!(issuer = %issuer.issuer, %error, "reading a device login failed");
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again",
                "The login could not be recorded just now. Reload this page.",
                None,
            );
        }
    };
    let now = OffsetDateTime::now_utc();
    let state_matches = {
        use subtle::ConstantTimeEq as _;
        bool::from(login.request.state.as_bytes().ct_eq(state.as_bytes()))
    };
    if !state_matches || login.request.issuer != issuer.issuer || login.request.expired(now) {
        return bad();
    }
    let (next, title, message, detail) = match (get("code"), get("error")) {
        (Some(code), _) => (
            DeviceStatus::Approved {
                code: code.to_string(),
            },
            "You are logged in",
            "Go back to your device: it continues by itself. You can close this page.",
            None,
        ),
        (None, Some(error)) => {
            // Stored as an OAuth error code: one word of the characters RFC 6749 allows there.
            let error = if error.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                error
            } else {
                "access_denied"
            };
            (
                DeviceStatus::Denied {
                    error: error.to_string(),
                },
                "The login failed",
                "Your device will say so too.",
                // The error code only: the description is whoever sent this redirect's text, and
                // this is the Supervisor's page.
                Some(format!("Error: {error}")),
            )
        }
        (None, None) => return bad(),
    };
    match endpoints
        .store
        .change_device_status(&id, &DeviceStatus::Pending, &next)
        .await
    {
        Ok(true) => page(StatusCode::OK, title, message, detail.as_deref()),
        Ok(false) => bad(),
        Err(StoreError::Conflict) => page(
            StatusCode::CONFLICT,
            "This login was finished already",
            "Go back to your device.",
            None,
        ),
        Err(error) => {
            tracing::error!(issuer = %issuer.issuer, %error, "recording a device login failed");
            page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again",
                "The login could not be recorded just now. Reload this page.",
                None,
            )
        }
    }
}

/// A page saying `title` and `message` (and `detail`, such as an error's description).
fn page(status: StatusCode, title: &str, message: &str, detail: Option<&str>) -> Response<Body> {
    let detail = detail
        .map(|detail| format!(r#"<p id="detail">{}</p>"#, html_escape(detail)))
        .unwrap_or_default();
    let mut response = html_page(
        format!(
            r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title><style>{STYLE}</style></head><body><main><h1 id="title">{title}</h1><p id="message">{message}</p>{detail}</main></body></html>"#,
            title = html_escape(title),
            message = html_escape(message),
        ),
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
    );
    *response.status_mut() = status;
    response
}

/// The page's style (as the login page's).
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:26rem;margin:4rem auto;padding:0 1rem;line-height:1.5}label{display:block;margin-top:1rem;font-weight:600}input{width:100%;padding:.5rem;font-size:1.2rem;letter-spacing:.1em;box-sizing:border-box;text-transform:uppercase}button{margin-top:1.5rem;padding:.6rem 1.2rem;font-size:1rem}.alert{border:2px solid #b00020;color:#b00020;padding:.5rem .75rem}.warning{border-left:4px solid #8a6d00;padding-left:.75rem}";

/// The verification form: the code (as typed, or from the link), the CSRF value, a warning
/// against codes sent by someone else, and `alert` when the last try failed.
fn code_form(status: StatusCode, alert: Option<&str>, typed: &str, csrf: &str) -> Response<Body> {
    let alert = alert
        .map(|alert| {
            format!(
                r#"<p id="alert" role="alert" class="alert">{}</p>"#,
                html_escape(alert)
            )
        })
        .unwrap_or_default();
    let mut response = html_page(
        format!(
            r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Log in a device</title><style>{STYLE}</style></head><body><main><h1>Log in a device</h1><p>Enter the code your device shows, then log in.</p><p class="warning">Only enter a code you read on your own screen. If someone sent you a code, do not enter it: it would log them in as you.</p>{alert}<form method="post" action="device"><input type="hidden" name="csrf" value="{csrf}"><label for="user_code">Code</label><input type="text" id="user_code" name="user_code" value="{typed}" autocomplete="off" autocapitalize="characters" spellcheck="false" required autofocus><button type="submit" id="submit">Continue</button></form></main></body></html>"#,
            csrf = html_escape(csrf),
            typed = html_escape(typed),
        ),
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' http: https:; frame-ancestors 'none'",
    );
    *response.status_mut() = status;
    response
}

/// When each device code was last polled on this replica, to answer `slow_down` to a client
/// that polls sooner than its interval (RFC 8628 §3.5). Per replica (a client alternating
/// between replicas may poll each at its interval); bounded: entries older than a device code's
/// lifetime are dropped when it grows past [`DevicePolls::CAPACITY`], and when it is full of live
/// ones it forgets them all (pacing is a courtesy; the device code's expiry is the bound).
#[derive(Debug, Default)]
pub struct DevicePolls {
    polls: Mutex<HashMap<[u8; 16], (Instant, Duration)>>,
}

impl DevicePolls {
    /// The most device codes remembered.
    const CAPACITY: usize = 100_000;

    /// Records a poll of device `id` at `now`: `false` (slow down) when it comes sooner than the
    /// device's interval after the previous one, which then grows by 5 seconds.
    pub(crate) fn poll(&self, id: [u8; 16], now: Instant) -> bool {
        let interval = Duration::from_secs(device::POLL_INTERVAL.whole_seconds().unsigned_abs());
        // A poll may arrive a little early (the client's sleep and the network jitter).
        let tolerance = Duration::from_millis(500);
        let mut polls = self
            .polls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if polls.len() >= Self::CAPACITY && !polls.contains_key(&id) {
            let lifetime = Duration::from_secs(device::DEVICE_CODE_LIFETIME.whole_seconds().unsigned_abs());
            polls.retain(|_, (last, _)| now.saturating_duration_since(*last) < lifetime);
            if polls.len() >= Self::CAPACITY {
                polls.clear();
            }
        }
        match polls.get_mut(&id) {
            Some((last, wait)) => {
                let early = now.saturating_duration_since(*last) + tolerance < *wait;
                *last = now;
                if early {
                    *wait += Duration::from_secs(5);
                }
                !early
            }
            None => {
                polls.insert(id, (now, interval));
                true
            }
        }
    }
}

#[cfg(test)]
impl DevicePolls {
    /// Forgets every poll (tests that poll back to back).
    pub(crate) fn forget(&self) {
        self.polls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_sooner_than_the_interval_slows_the_device_down_by_five_seconds() {
        let polls = DevicePolls::default();
        let start = Instant::now();
        let at = |seconds: f64| start + Duration::from_secs_f64(seconds);
        let id = [1; 16];
        assert!(polls.poll(id, at(0.0)), "the first poll");
        assert!(polls.poll(id, at(5.0)), "after the interval");
        assert!(polls.poll(id, at(9.6)), "within the tolerance");
        assert!(!polls.poll(id, at(11.0)), "too soon: slow down");
        // Now 10 seconds, from the refused poll on.
        assert!(!polls.poll(id, at(20.0)), "9 seconds: still too soon");
        assert!(polls.poll(id, at(35.0)), "15 seconds");
        assert!(polls.poll([2; 16], at(35.1)), "another device is on its own");
    }
}
