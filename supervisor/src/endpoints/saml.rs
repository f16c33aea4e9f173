//! The SAML service provider's endpoints, served by a FederationDomain that offers a
//! SAMLIdentityProvider: `GET /saml/metadata`, the service provider's metadata (its URL is its
//! entity ID), and `POST /saml/acs`, the assertion consumer service the identity provider sends
//! the browser back to (HTTP-POST binding).
//!
//! A login reaches the assertion consumer service in these steps:
//! 1. the form (`SAMLResponse`, `RelayState`) is read;
//! 2. `RelayState` is the AuthnRequest's ID, which names the browser's cookie holding the login's
//!    sealed state ([`crate::endpoints::authorize::SAML_STATE_COOKIE_PREFIX`]): it is opened,
//!    and the client's authorization request in it is checked again; the answer clears the
//!    cookie, whatever it is;
//! 3. the identity provider of the state must still be a SAML one;
//! 4. the response is verified ([`crate::idp::saml::verify_response`]: the signature by the
//!    identity provider's certificates, issuer, audience, recipient, the request it answers,
//!    validity windows);
//! 5. the assertion is recorded as presented, once across replicas: a second presentation is a
//!    replay and refused;
//! 6. the user's identity is mapped ([`crate::idp::SamlUpstream::login`]) and the authorization
//!    code issued, the session ending no later than the identity provider's
//!    `SessionNotOnOrAfter`.
//!
//! A failure at steps 1–5 is a page in the browser with its status and reason (as GitHub's
//! refusals are), never a redirect to the client: the response may be an attacker's. A refusal
//! of the mapped identity (step 6) goes back to the client as `access_denied`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use sha2::Digest as _;
use time::OffsetDateTime;

use crate::endpoints::authorize::{self, clear_saml_state_cookie, open_saml_state, Refusal, UpstreamState};
use crate::endpoints::code::issue_code_until;
use crate::endpoints::html::refused;
use crate::endpoints::oauth::{Code, OAuthError};
use crate::endpoints::{read_form_of_at_most, text, Body, Endpoints};
use crate::idp::saml::{verify_response, MAX_RESPONSE_BASE64};
use crate::idp::Upstream;
use crate::issuer::Issuer;

/// `GET /saml/metadata`: the service provider's metadata.
pub(crate) fn metadata(issuer: &Issuer) -> Response<Body> {
    let xml = issuer.saml_service_provider().metadata_xml();
    let mut response = Response::new(Body::new(Bytes::from(xml)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/samlmetadata+xml"),
    );
    response
}

/// The largest form the assertion consumer service reads: the largest `SAMLResponse` the
/// verifier takes, URL-encoded (each base64 `+`, `/` and `=` becomes three bytes), and the rest.
const MAX_ACS_FORM_BYTES: usize = 3 * MAX_RESPONSE_BASE64 + 4096;

/// `POST /saml/acs`: see the module documentation.
pub(crate) async fn acs<B>(endpoints: &Endpoints, issuer: &Arc<Issuer>, request: Request<B>) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let now = OffsetDateTime::now_utc();
    // 1. The form.
    let (parts, body) = request.into_parts();
    let Some(form) = read_form_of_at_most(body, MAX_ACS_FORM_BYTES).await else {
        return text(
            StatusCode::BAD_REQUEST,
            "Bad Request: the SAML response is too large or unreadable",
        );
    };
    let field = |name: &str| {
        form.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let (Some(saml_response), Some(relay_state)) = (field("SAMLResponse"), field("RelayState")) else {
        return text(
            StatusCode::BAD_REQUEST,
            "Bad Request: the form must carry SAMLResponse and RelayState",
        );
    };

    // 2. The login's state in the browser's cookie, the client's request.
    let state = match open_saml_state(issuer, relay_state, &parts.headers, now) {
        Ok(state) => state,
        Err((status, message)) => return text(status, &message),
    };
    let mut response = answer(endpoints, issuer, &state, saml_response, now).await;
    clear_saml_state_cookie(&mut response, &state.saml_request_id);
    response
}

/// Steps 3–6 of [`acs`] for the login `state`.
async fn answer(
    endpoints: &Endpoints,
    issuer: &Arc<Issuer>,
    state: &UpstreamState,
    saml_response: &str,
    now: OffsetDateTime,
) -> Response<Body> {
    let request = match authorize::parse(&state.authorize_query, &|id| endpoints.client(issuer, id)) {
        Ok(request) => request,
        Err(refusal) => return refused(refusal),
    };

    // 3. The identity provider, still a SAML one.
    let Some(Upstream::Saml(saml)) = issuer.idp(Some(&state.idp_name), None).map(AsRef::as_ref) else {
        return text(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Unprocessable Entity: the SAML identity provider of this login no longer exists",
        );
    };

    // 4. The response.
    // Parsing, canonicalization and the signature check are CPU work in C libraries: on the
    // blocking pool, not on a worker that serves other requests.
    let (sp, metadata, request_id, clock_skew) = (
        issuer.saml_service_provider(),
        saml.metadata.clone(),
        state.saml_request_id.clone(),
        saml.clock_skew,
    );
    let posted = saml_response.to_string();
    let checked = tokio::task::spawn_blocking(move || {
        verify_response(&posted, &metadata, &sp, &request_id, now, clock_skew)
    })
    .await;
    let verified = match checked {
        Ok(Ok(verified)) => verified,
        Err(_) => {
            tracing::error!(issuer = %issuer.issuer, idp = %saml.display_name, "the SAML response check did not finish");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Server Error: the SAML response could not be checked",
            );
        }
        Ok(Err(error)) => {
            tracing::info!(issuer = %issuer.issuer, idp = %saml.display_name, %error, "SAML response refused");
            return text(
                StatusCode::FORBIDDEN,
                &format!("Forbidden: the SAML response was refused: {error}"),
            );
        }
    };
    if verified.session_not_on_or_after.is_some_and(|end| end <= now) {
        return text(
            StatusCode::FORBIDDEN,
            "Forbidden: the SAML response was refused: the identity provider's session has ended (SessionNotOnOrAfter)",
        );
    }

    // 5. Once only.
    let key: [u8; 32] = sha2::Sha256::new()
        .chain_update((saml.metadata.entity_id.len() as u64).to_be_bytes())
        .chain_update(saml.metadata.entity_id.as_bytes())
        .chain_update(verified.assertion_id.as_bytes())
        .finalize()
        .into();
    match endpoints
        .store
        .record_saml_assertion(&key, verified.valid_until)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(issuer = %issuer.issuer, idp = %saml.display_name, "a SAML assertion was presented again; refused");
            return text(
                StatusCode::FORBIDDEN,
                "Forbidden: the SAML response was refused: its assertion was presented already (a replay)",
            );
        }
        Err(error) => {
            tracing::error!(issuer = %issuer.issuer, %error, "recording a SAML assertion failed");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: the login could not be recorded; try again",
            );
        }
    }

    // 6. The identity, and the code.
    match saml.login(&verified) {
        Ok((identity, upstream)) => {
            issue_code_until(
                endpoints,
                issuer,
                &request,
                identity,
                upstream,
                verified.session_not_on_or_after,
            )
            .await
        }
        Err(reason) => refused(Refusal::Redirect {
            error: OAuthError::new(Code::AccessDenied, &reason),
            redirect_uri: request.redirect_uri.clone(),
            response_mode: request.response_mode,
            state: Some(request.state.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest `SAMLResponse` the verifier takes fits the ACS's form however it is
    /// URL-encoded (every character a `+`, `/` or `=`), with its RelayState.
    #[test]
    fn the_acs_form_holds_the_largest_response_the_verifier_takes() {
        let response = "+/=".repeat(MAX_RESPONSE_BASE64 / 3);
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("SAMLResponse", &response)
            .append_pair("RelayState", &format!("_{}", "0".repeat(32)))
            .finish();
        assert!(form.len() > crate::endpoints::MAX_FORM_BYTES);
        assert!(form.len() <= MAX_ACS_FORM_BYTES, "{}", form.len());
    }
}
