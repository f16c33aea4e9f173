//! What the login pages and redirects share: HTML pages with their Content-Security-Policy,
//! escaping, `form_post` pages, redirects with query parameters, refusals sent back to the
//! client, cookies and random values.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use ring::rand::SecureRandom as _;

use crate::endpoints::authorize::{Refusal, ResponseMode};
use crate::endpoints::{oauth_error, Body};

/// An HTML page that is never cached or framed, under the Content-Security-Policy `csp`.
pub(crate) fn html_page(page: String, csp: &'static str) -> Response<Body> {
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

/// The answer to a refused authorization request.
pub(crate) fn refused(refusal: Refusal) -> Response<Body> {
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

pub(crate) fn with_query(uri: &str, params: &[(&str, &str)]) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{separator}{query}")
}

pub(crate) fn redirect(location: &str) -> Response<Body> {
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
pub(crate) fn form_post(redirect_uri: &str, params: &[(&str, &str)]) -> Response<Body> {
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
pub(crate) fn html_escape(text: &str) -> String {
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
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
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
pub(crate) fn random_string() -> Option<String> {
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}
