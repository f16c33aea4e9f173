//! `GET /callback`: the upstream comes back with a code. It is redeemed, the ID token checked and
//! mapped (GitHub: the user read from GitHub's API), the FederationDomain's transforms run, and
//! the client gets its code by redirect or by `form_post` page.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use selkie_oidc::rp::{CallbackOutcome, CallbackParams, LoginParams};
use time::OffsetDateTime;

use crate::endpoints::authorize::{self, AuthorizeRequest, Refusal};
use crate::endpoints::authorize::{open_state, unreachable_upstream};
use crate::endpoints::code::issue_code;
use crate::endpoints::discovery::CALLBACK_PATH;
use crate::endpoints::html::refused;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::{read_form, text, Body, Endpoints};
use crate::idp::github::GitHubError;
use crate::idp::{GitHubUpstream, Upstream};
use crate::issuer::Issuer;

/// `GET|POST /callback`: the upstream sends the browser back.
pub(crate) async fn callback<B>(
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
    let request = match authorize::parse(&state.authorize_query, &|id| endpoints.client(issuer, id)) {
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
        Upstream::Ldap(_) | Upstream::Saml(_) => {
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
pub(crate) async fn github_callback(
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
