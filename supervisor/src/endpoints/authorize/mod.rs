//! `GET /oauth2/authorize`: a login from the client's authorization request to the upstream.
//! The request is checked first ([`request`]: the client, its redirect URI, PKCE, state and
//! nonce, `prompt`); then, with `Pinniped-Username` / `Pinniped-Password` headers (the CLI's
//! `cli_password` flow), the Supervisor logs in at the upstream itself ([`password`]) and redirects
//! straight back to the client with the code; otherwise the browser goes to the upstream, or to
//! the Supervisor's own login page for LDAP and Active Directory ([`browser`]).
//!
//! The other halves of a login: `callback` (the upstream comes back), `login_page` (the form of
//! LDAP and Active Directory), `code` (the authorization code issued at the end).

mod browser;
mod password;
mod request;

pub(crate) use browser::*;
pub(crate) use password::*;
pub(crate) use request::*;

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};

use crate::endpoints::discovery::CHOOSE_IDP_PATH;
use crate::endpoints::html::{redirect, refused};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::{oauth_error, read_form, Body, Endpoints};
use crate::issuer::Issuer;

/// `GET|POST /oauth2/authorize`.
pub(crate) async fn authorize<B>(
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
                    "The request body is too large, too slow or unreadable.",
                ))
            }
        }
    } else {
        parts.uri.query().unwrap_or_default().to_string()
    };
    let request = match parse(&query, &|id| endpoints.client(issuer, id)) {
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
        if request.client_id != PINNIPED_CLI {
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
pub(crate) fn unreachable_upstream() -> OAuthError {
    OAuthError::new(
        Code::TemporarilyUnavailable,
        "Reason: the upstream identity provider could not be reached or failed; try again later.",
    )
}
