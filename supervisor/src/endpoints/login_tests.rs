//! Unit tests of the login pages, redirects and refusals.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use selkie_oidc::rp::CallbackParams;

use crate::endpoints::authorize::CSRF_COOKIE;
use crate::endpoints::authorize::{Refusal, ResponseMode};
use crate::endpoints::html::{cookie, form_post, refused};
use crate::endpoints::login_page::{login_form, LoginAlert};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::Body;

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
