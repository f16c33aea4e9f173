//! The HTTP endpoints of every FederationDomain (REFERENCE.md §4): discovery, `jwks.json`,
//! identity-provider discovery, `oauth2/authorize`, `callback` and `login` ([`login`]), the
//! identity-provider chooser ([`chooser`]), `oauth2/token`
//! ([`token`]), the device authorization grant's endpoints ([`device`], when enabled), the SAML
//! service provider's metadata and assertion consumer service ([`saml`], when the
//! FederationDomain offers a SAMLIdentityProvider), and `healthz`. One [`Endpoints::handle`]
//! answers every request of the listener:
//! it finds the FederationDomain by host and path, and never fails — errors are OAuth error
//! responses (or a plain 404/405 for what is no endpoint).

pub(crate) mod authorize;
mod callback;
mod chooser;
mod code;
mod device;
pub(crate) mod discovery;
mod html;
mod login_page;
#[cfg(test)]
mod login_tests;
pub(crate) mod oauth;
mod revoke;
mod saml;
mod token;

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};

use crate::clients::Clients;
use crate::endpoints::authorize::Client;
use crate::endpoints::oauth::OAuthError;
use crate::issuer::{Issuer, Issuers};
use crate::server::metrics::{Endpoint, Metrics};
use crate::session::store::Store;

/// A response body.
pub(crate) type Body = Full<Bytes>;

/// The largest form body read (token requests, form_post callbacks).
pub(crate) const MAX_FORM_BYTES: usize = 64 * 1024;

/// What every request needs.
#[derive(Debug)]
pub struct Endpoints {
    /// The FederationDomains, replaced whole on every configuration change.
    pub issuers: Arc<ArcSwap<Issuers>>,
    /// Where sessions live.
    pub store: Store,
    /// What is counted.
    pub metrics: Arc<Metrics>,
    /// Where login events are written.
    pub audit: crate::server::audit::Audit,
    /// The valid OIDCClients, replaced whole when one changes.
    pub clients: Arc<ArcSwap<Clients>>,
    /// Failed passwords by identity provider and username, to slow guessing down.
    pub passwords: crate::idp::throttle::PasswordThrottle,
    /// When each device code was last polled, to slow fast pollers down.
    pub device_polls: device::DevicePolls,
    /// The DPoP proofs this replica accepted lately, to refuse them a second time.
    pub dpop_proofs: token::dpop::SeenProofs,
    /// Whether `/healthz` still answers 200 (until SIGTERM).
    pub readiness: crate::server::Readiness,
}

impl Endpoints {
    /// The client `id` may ask `issuer` for authorization as: the CLI (which may also be sent
    /// to the issuer's device callback when it offers the device grant: a device login's
    /// authorization request), or a valid OIDCClient.
    pub fn client(&self, issuer: &Issuer, id: &str) -> Option<Client> {
        if id == authorize::PINNIPED_CLI {
            let mut cli = Client::pinniped_cli();
            if issuer.device_authorization {
                cli.redirect_uris
                    .push(format!("{}{}", issuer.issuer, discovery::DEVICE_CALLBACK_PATH));
            }
            return Some(cli);
        }
        self.clients.load().get(id).map(|dynamic| dynamic.client.clone())
    }

    /// Answers one request, and writes its audit line: one JSON log line (target `audit`) with
    /// the method, the path (never the query or the body: they carry codes, tokens and
    /// passwords), the status and the time taken — unless it is a health check and
    /// `audit.logInternalPaths` is not enabled —; and counts it in [`Metrics`].
    pub async fn handle<B>(&self, request: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let started = std::time::Instant::now();
        let method = request.method().clone();
        let path: String = request.uri().path().chars().take(256).collect();
        let (endpoint, response) = self.route(request).await;
        self.metrics
            .request(endpoint, response.status().as_u16(), started.elapsed());
        if !self.audit.logs_request(&path) {
            return response;
        }
        tracing::info!(
            target: "audit",
            method = %method,
            path = %path,
            status = response.status().as_u16(),
            duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "request"
        );
        response
    }

    async fn route<B>(&self, request: Request<B>) -> (Endpoint, Response<Body>)
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request.uri().path().to_string();
        if path == "/healthz" {
            if self.readiness.is_stopping() {
                return (
                    Endpoint::healthz,
                    text(StatusCode::SERVICE_UNAVAILABLE, "shutting down"),
                );
            }
            return (Endpoint::healthz, text(StatusCode::OK, "ok"));
        }
        let host = request
            .uri()
            .authority()
            .map(|authority| authority.host().to_string())
            .or_else(|| {
                request
                    .headers()
                    .get(header::HOST)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let issuers = self.issuers.load();
        let not_found = || (Endpoint::none, text(StatusCode::NOT_FOUND, "404 page not found"));
        let Some((issuer, endpoint)) = issuers.route(&host, &path) else {
            return not_found();
        };
        let issuer = issuer.clone();
        let method = request.method().clone();
        let get = method == Method::GET || method == Method::HEAD;
        let kind = match endpoint {
            discovery::WELL_KNOWN_PATH => Endpoint::discovery,
            discovery::JWKS_PATH => Endpoint::jwks,
            discovery::IDP_DISCOVERY_PATH => Endpoint::idp_discovery,
            discovery::AUTHORIZE_PATH => Endpoint::authorize,
            discovery::CALLBACK_PATH => Endpoint::callback,
            discovery::LOGIN_PATH => Endpoint::login,
            discovery::CHOOSE_IDP_PATH => Endpoint::choose_idp,
            discovery::TOKEN_PATH => Endpoint::token,
            discovery::REVOKE_PATH => Endpoint::revoke,
            discovery::DEVICE_AUTHORIZATION_PATH if issuer.device_authorization => {
                Endpoint::device_authorization
            }
            discovery::DEVICE_PATH if issuer.device_authorization => Endpoint::device,
            discovery::DEVICE_CALLBACK_PATH if issuer.device_authorization => Endpoint::device_callback,
            discovery::SAML_METADATA_PATH if issuer.has_saml() => Endpoint::saml_metadata,
            discovery::SAML_ACS_PATH if issuer.has_saml() => Endpoint::saml_acs,
            _ => return not_found(),
        };
        let response = match kind {
            Endpoint::discovery if get => json(StatusCode::OK, issuer.discovery.clone()),
            Endpoint::jwks if get => json(StatusCode::OK, issuer.jwks.clone()),
            Endpoint::idp_discovery if get => json(StatusCode::OK, issuer.idp_discovery.clone()),
            Endpoint::discovery | Endpoint::jwks | Endpoint::idp_discovery => {
                text(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed (try GET)")
            }
            Endpoint::authorize if get || method == Method::POST => {
                authorize::authorize(self, &issuer, request).await
            }
            Endpoint::callback if get || method == Method::POST => {
                callback::callback(self, &issuer, request).await
            }
            Endpoint::choose_idp if get => {
                chooser::choose(&issuer, request.uri().query().unwrap_or_default())
            }
            Endpoint::choose_idp => text(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed (try GET)"),
            Endpoint::login if get || method == Method::POST => {
                login_page::login_page(self, &issuer, request).await
            }
            Endpoint::token if method == Method::POST => token::token(self, &issuer, request).await,
            Endpoint::revoke if method == Method::POST => revoke::revoke(self, &issuer, request).await,
            Endpoint::device_authorization if method == Method::POST => {
                device::device_authorization(self, &issuer, request).await
            }
            Endpoint::device if get || method == Method::POST => {
                device::verification(self, &issuer, request).await
            }
            Endpoint::device_callback if get => {
                device::callback(self, &issuer, request.uri().query().unwrap_or_default()).await
            }
            Endpoint::saml_metadata if get => saml::metadata(&issuer),
            Endpoint::saml_acs if method == Method::POST => saml::acs(self, &issuer, request).await,
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
        };
        (kind, response)
    }
}

/// A plain-text response.
pub(crate) fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut response = Response::new(Body::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A JSON response that no cache may keep (token and error responses, RFC 6749 §5.1).
pub(crate) fn json(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    response
}

/// An OAuth error answered directly, with its HTTP status.
pub(crate) fn oauth_error(error: &OAuthError) -> Response<Body> {
    let status = StatusCode::from_u16(error.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    json(status, Bytes::from(error.json()))
}

/// How long a form body may take to arrive in whole: a slow body (one byte now and then) must not
/// hold its connection and task open for ever.
pub(crate) const BODY_READ_TIMEOUT: std::time::Duration = selkie_kube::aggregated::BODY_READ_TIMEOUT;

/// Reads an `application/x-www-form-urlencoded` body of at most [`MAX_FORM_BYTES`], arriving
/// within [`BODY_READ_TIMEOUT`]. `None` when it is larger, slower or cannot be read.
pub(crate) async fn read_form<B>(body: B) -> Option<Vec<(String, String)>>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    read_form_of_at_most(body, MAX_FORM_BYTES).await
}

/// [`read_form`] with a bound of its own, `limit` bytes, for the one form that carries a large
/// document (the SAML assertion consumer service's).
pub(crate) async fn read_form_of_at_most<B>(body: B, limit: usize) -> Option<Vec<(String, String)>>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let reading = Limited::new(body, limit).collect();
    let bytes = tokio::time::timeout(BODY_READ_TIMEOUT, reading)
        .await
        .ok()?
        .ok()?
        .to_bytes();
    Some(
        form_urlencoded::parse(&bytes)
            .map(|(name, value)| (name.into_owned(), value.into_owned()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    use super::*;

    /// A client that sends part of a form and then nothing more is cut off after
    /// [`BODY_READ_TIMEOUT`] (before, the read waited for ever, holding the connection).
    #[tokio::test(start_paused = true)]
    async fn a_form_that_stops_arriving_is_given_up_on() {
        let first = futures::stream::iter([Ok::<_, std::convert::Infallible>(Frame::data(
            Bytes::from_static(b"grant_type=refresh_token&refresh_token="),
        ))]);
        let body = StreamBody::new(first.chain(futures::stream::pending()));
        let started = tokio::time::Instant::now();
        assert_eq!(read_form(body).await, None);
        assert_eq!(started.elapsed(), BODY_READ_TIMEOUT);

        let whole = Full::new(Bytes::from_static(b"a=1&b=two"));
        assert_eq!(
            read_form(whole).await,
            Some(vec![("a".into(), "1".into()), ("b".into(), "two".into())])
        );
    }

    /// A form over [`MAX_FORM_BYTES`] is refused by [`read_form`], and read whole under a larger
    /// bound of its own.
    #[tokio::test]
    async fn a_form_is_read_up_to_its_bound() {
        let large = format!("SAMLResponse={}&RelayState=r", "A".repeat(200 * 1024));
        assert_eq!(read_form(Full::new(Bytes::from(large.clone()))).await, None);
        let form = read_form_of_at_most(Full::new(Bytes::from(large.clone())), large.len())
            .await
            .unwrap();
        assert_eq!(form[0].1.len(), 200 * 1024);
        assert_eq!(form[1], ("RelayState".into(), "r".into()));
        assert_eq!(
            read_form_of_at_most(Full::new(Bytes::from(large.clone())), large.len() - 1).await,
            None
        );
    }
}
