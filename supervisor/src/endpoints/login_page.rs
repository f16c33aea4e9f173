//! `/login`: the Supervisor's own login page for LDAP and Active Directory in a browser (no script,
//! labelled fields, one message for an unknown user and a wrong password), and its form's post.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use time::OffsetDateTime;

use crate::endpoints::authorize::{self};
use crate::endpoints::authorize::{audit_must_wait, ldap_refusal, open_state};
use crate::endpoints::code::issue_code;
use crate::endpoints::discovery::LOGIN_PATH;
use crate::endpoints::html::{html_escape, html_page, redirect, refused};
use crate::endpoints::{read_form, text, Body, Endpoints};
use crate::idp::{LdapLoginError, Upstream};
use crate::issuer::Issuer;

/// What the login page says above its form (`err` of its URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoginAlert {
    /// `incorrect_username_or_password`: the same for an unknown user and a wrong password.
    Incorrect,
    /// `internal_error`: the directory could not be asked, or something else failed.
    Internal,
    /// `too_many_failures`: the username failed too often in a row; it must wait
    /// ([`crate::idp::throttle`]). Selkie's own (Pinniped does not throttle).
    TooManyFailures,
}

impl LoginAlert {
    pub(crate) fn param(self) -> &'static str {
        match self {
            Self::Incorrect => "incorrect_username_or_password",
            Self::Internal => "internal_error",
            Self::TooManyFailures => "too_many_failures",
        }
    }

    pub(crate) fn message(self) -> &'static str {
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
pub(crate) fn login_page_url(issuer: &Issuer, sealed_state: &str, alert: Option<LoginAlert>) -> String {
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
pub(crate) async fn login_page<B>(
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
    let request = match authorize::parse(&state.authorize_query, &|id| endpoints.client(issuer, id)) {
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
    // The directory resolves the user first; the throttle counts its entry.
    match ldap.login(&endpoints.passwords, username, password).await {
        Ok((identity, upstream)) => issue_code(endpoints, issuer, &request, identity, upstream).await,
        Err(LdapLoginError::MustWait(_)) => {
            audit_must_wait(endpoints, issuer, idp, username);
            redirect(&login_page_url(issuer, sealed, Some(LoginAlert::TooManyFailures)))
        }
        Err(LdapLoginError::Directory(error)) => {
            let alert = if error.is_unavailable() {
                LoginAlert::Internal
            } else {
                LoginAlert::Incorrect
            };
            // Logged as the CLI flow logs it; the page says no more than the alert.
            let _ = ldap_refusal(endpoints, issuer, ldap, username, &error);
            redirect(&login_page_url(issuer, sealed, Some(alert)))
        }
    }
}

/// The login page: a plain form (no script), labelled fields with the browser's autocomplete
/// hints, the alert announced to screen readers, the form posting back to the page itself.
pub(crate) fn login_form(idp_name: &str, sealed_state: &str, alert: Option<LoginAlert>) -> Response<Body> {
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
