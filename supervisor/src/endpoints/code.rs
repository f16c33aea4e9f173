//! The end of every login: the scopes granted, the identity after the FederationDomain's
//! transforms and policies, and the authorization code issued (its session stored).

use std::sync::Arc;

use http::Response;
use time::OffsetDateTime;

use crate::endpoints::authorize::{self, AuthorizeRequest, Refusal, ResponseMode};
use crate::endpoints::html::{form_post, redirect, refused, with_query};
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::{Body, Endpoints};
use crate::idp::transforms::Outcome;
use crate::issuer::Issuer;
use crate::session::login::{self, Login};
use crate::session::tokens::{Kind, LoginRef};
use crate::session::{self, Identity, Session};

/// The scopes a client is granted: what it asked for, and for the CLI always `username` and
/// `groups` (as Pinniped grants them, for old CLIs that did not ask).
pub(crate) fn granted_scopes(request: &AuthorizeRequest) -> Vec<String> {
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
pub(crate) fn transformed(
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
pub(crate) async fn issue_code(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: &AuthorizeRequest,
    identity: Identity,
    upstream: session::Upstream,
) -> Response<Body> {
    issue_code_until(endpoints, issuer, request, identity, upstream, None).await
}

/// [`issue_code`] for a login whose upstream bounds the session: it ends at `ends_by` when that
/// comes before the end the FederationDomain's terms give it.
pub(crate) async fn issue_code_until(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    request: &AuthorizeRequest,
    identity: Identity,
    upstream: session::Upstream,
    ends_by: Option<OffsetDateTime>,
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
    let Some((request_id, id)) =
        session::new_request_id().and_then(|request_id| login::id_of(&request_id).map(|id| (request_id, id)))
    else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let Ok(code) = issuer
        .token_key
        .mint(Kind::AuthorizationCode, LoginRef { id, generation: 0 })
    else {
        return back(OAuthError::new(Code::ServerError, ""));
    };
    let scopes = granted_scopes(request);
    let terms = issuer.sessions.of(&upstream.idp_name);
    let session = Session {
        request_id,
        client_id: request.client_id.clone(),
        redirect_uri: request.redirect_uri.clone(),
        scopes: scopes.clone(),
        nonce: request.nonce.clone(),
        code_challenge: request.code_challenge.clone(),
        requested_at: now.unix_timestamp(),
        auth_time: now.unix_timestamp(),
        expires_at: ends_by
            .map_or(now + terms.max_lifetime, |ends_by| {
                ends_by.min(now + terms.max_lifetime)
            })
            .unix_timestamp(),
        idle_timeout: terms.idle_timeout.map(|idle| idle.whole_seconds()),
        code_active: true,
        token_expires_at: (now + session::AUTHORIZATION_CODE_LIFETIME).unix_timestamp(),
        identity,
        upstream,
        access_token_signature: None,
        rotated: false,
    };
    let login = Login::issued(session, code.signature.clone());
    if let Err(error) = endpoints.store.create_login(&login, now).await {
        tracing::error!(issuer = %issuer.issuer, %error, "storing an authorization code failed");
        return back(OAuthError::new(
            Code::TemporarilyUnavailable,
            "The session could not be stored; try again.",
        ));
    }
    endpoints.audit.session_started(&issuer.issuer, &login.session);
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
