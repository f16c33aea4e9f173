//! The request path (DESIGN.md, data flow 1–6) as a pingora [`ProxyHttp`].
//!
//! Per request: load the snapshot once; take the connection's certificate identity (computed at
//! the handshake) or run the bearer token through the chain; remove every client credential and
//! identity header; refuse what may not pass; then forward to kube-apiserver with the proxy's own
//! credential and `Impersonate-*` headers (or, for identities that carry a UID from TokenReview,
//! the original token). One audit line per request at the end.

use std::{sync::Arc, time::Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use http::{header, HeaderName, HeaderValue};
use pingora::{
    http::{RequestHeader, ResponseHeader},
    proxy::{ProxyHttp, Session},
    upstreams::peer::HttpPeer,
    Error, Result,
};
use selkie_filters::{
    chain::Decision,
    identity::{Credential, Forwarding, Identity},
    outcome::Outcome,
};

use crate::{
    headers::{client_credentials, impersonation_headers},
    snapshot::{Snapshot, UpstreamCredential},
    status::Failure,
    tls::PeerIdentity,
};

/// The paths anonymous callers may reach: creating TokenCredentialRequests and WhoAmIRequests.
const ANONYMOUS_PATHS: [&str; 2] = [
    "/apis/login.concierge.pinniped.dev/v1alpha1/tokencredentialrequests",
    "/apis/identity.concierge.pinniped.dev/v1alpha1/whoamirequests",
];

/// The impersonation proxy. Cheap to share: it holds only the snapshot handle.
pub struct ImpersonationProxy {
    snapshot: Arc<ArcSwap<Snapshot>>,
}

impl ImpersonationProxy {
    /// Serves from whatever `snapshot` holds when each request starts.
    pub fn new(snapshot: Arc<ArcSwap<Snapshot>>) -> Self {
        Self { snapshot }
    }
}

/// Who a request acts as upstream.
enum Effective {
    /// Impersonate this user.
    Impersonate(Arc<Identity>),
    /// Forward the caller's own token unchanged (kube-apiserver accepts it itself).
    PassThrough(Arc<Identity>, HeaderValue),
    /// An anonymous caller on an anonymous path.
    Anonymous,
}

/// Per-request state.
pub struct RequestContext {
    started: Instant,
    snapshot: Option<Arc<Snapshot>>,
    effective: Option<Effective>,
    /// Headers to add upstream, computed once the caller is known.
    upstream_headers: Vec<(HeaderName, HeaderValue)>,
    /// Why the request was refused, or which authenticators refused the credential.
    refusal: Option<String>,
}

fn bearer_token(value: &HeaderValue) -> Option<&str> {
    let value = value.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn refuse(session: &mut Session, failure: Failure) -> Result<bool> {
    let body = failure.body();
    let mut response = ResponseHeader::build(failure.code, Some(3))?;
    response.insert_header(header::CONTENT_TYPE, "application/json")?;
    response.insert_header(header::CONTENT_LENGTH, body.len())?;
    // An HTTP/1.1 connection may still hold an unread request body, so it is not reused. On
    // HTTP/2 the refusal ends one stream; the connection and its other streams carry on.
    if !session.is_http2() {
        session.set_keepalive(None);
    }
    session.write_response_header(Box::new(response), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(true)
}

#[async_trait]
impl ProxyHttp for ImpersonationProxy {
    type CTX = RequestContext;

    fn new_ctx(&self) -> Self::CTX {
        RequestContext {
            started: Instant::now(),
            snapshot: None,
            effective: None,
            upstream_headers: Vec::new(),
            refusal: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        let snapshot = self.snapshot.load_full();
        ctx.snapshot = Some(snapshot.clone());

        let certificate = session
            .digest()
            .and_then(|digest| digest.ssl_digest.as_ref())
            .and_then(|ssl| ssl.extension.get::<PeerIdentity>())
            .and_then(|peer| match &peer.0 {
                Outcome::Authenticated(identity) => Some(identity.clone()),
                _ => None,
            });
        let decision = match (
            &certificate,
            session.req_header().headers.get(header::AUTHORIZATION),
        ) {
            (Some(identity), _) => {
                snapshot
                    .chain
                    .authenticate(Credential::Certificate(identity))
                    .await
            }
            (None, Some(value)) => match bearer_token(value) {
                Some(token) => snapshot.chain.authenticate(Credential::BearerToken(token)).await,
                None => Decision::Unauthenticated(Vec::new()),
            },
            (None, None) => Decision::Anonymous,
        };
        let original_token = match &decision {
            Decision::Authenticated(identity) if identity.forwarding == Forwarding::PassThroughToken => {
                session.req_header().headers.get(header::AUTHORIZATION).cloned()
            }
            _ => None,
        };

        let (names, requested) = client_credentials(&session.req_header().headers);
        let request = session.req_header_mut();
        for name in &names {
            request.remove_header(name);
        }
        let requested = match requested {
            Ok(requested) => requested,
            Err(error) => {
                ctx.refusal = Some(error.to_string());
                return refuse(session, Failure::BAD_REQUEST).await;
            }
        };

        let effective = match decision {
            Decision::Authenticated(identity) => match original_token {
                Some(token) => Effective::PassThrough(identity, token),
                None => Effective::Impersonate(identity),
            },
            Decision::Anonymous if ANONYMOUS_PATHS.contains(&session.req_header().uri.path()) => {
                Effective::Anonymous
            }
            Decision::Anonymous => {
                ctx.refusal = Some("anonymous".into());
                return refuse(session, Failure::UNAUTHORIZED).await;
            }
            Decision::Unauthenticated(refusals) => {
                ctx.refusal = Some(
                    refusals
                        .iter()
                        .map(|(name, reason)| format!("{name}:{reason}"))
                        .collect::<Vec<_>>()
                        .join(","),
                );
                return refuse(session, Failure::UNAUTHORIZED).await;
            }
        };
        if requested.is_requested() {
            // Nested impersonation (kubectl --as) needs SubjectAccessReviews; until then it is
            // refused rather than ignored.
            ctx.refusal = Some("nested impersonation".into());
            return refuse(session, Failure::IMPERSONATION_FORBIDDEN).await;
        }

        let mut upstream_headers = Vec::new();
        match &effective {
            Effective::Impersonate(identity) => match impersonation_headers(&identity.user) {
                Ok(headers) => upstream_headers = headers,
                Err(error) => {
                    ctx.refusal = Some(error.to_string());
                    return refuse(session, Failure::UNAUTHORIZED).await;
                }
            },
            Effective::PassThrough(_, token) => upstream_headers.push((header::AUTHORIZATION, token.clone())),
            Effective::Anonymous => {
                upstream_headers.push((
                    HeaderName::from_static("impersonate-user"),
                    HeaderValue::from_static("system:anonymous"),
                ));
                upstream_headers.push((
                    HeaderName::from_static("impersonate-group"),
                    HeaderValue::from_static("system:unauthenticated"),
                ));
            }
        }
        ctx.upstream_headers = upstream_headers;
        ctx.effective = Some(effective);
        Ok(false)
    }

    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        let snapshot = ctx
            .snapshot
            .as_ref()
            .ok_or_else(|| Error::explain(pingora::ErrorType::InternalError, "no snapshot loaded"))?;
        let own_credential = !matches!(ctx.effective, Some(Effective::PassThrough(..)));
        Ok(Box::new(
            snapshot.upstream.peer(session.is_upgrade_req(), own_credential),
        ))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        // The downstream headers were cleaned in request_filter; clean again so nothing added
        // since (by any module) can carry a client identity upstream.
        let (names, _) = client_credentials(&upstream_request.headers);
        for name in &names {
            upstream_request.remove_header(name);
        }
        let passes_through = matches!(ctx.effective, Some(Effective::PassThrough(..)));
        if !passes_through {
            if let Some(UpstreamCredential::TokenFile(file)) = ctx
                .snapshot
                .as_ref()
                .map(|snapshot| &snapshot.upstream.credential)
            {
                let token = file
                    .header()
                    .ok_or_else(|| Error::explain(pingora::ErrorType::InternalError, "no upstream token"))?;
                upstream_request.insert_header(header::AUTHORIZATION, token)?;
            }
        }
        for (name, value) in ctx.upstream_headers.drain(..) {
            upstream_request.append_header(name, value)?;
        }
        Ok(())
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut Self::CTX) {
        let status = session
            .response_written()
            .map_or(0, |response| response.status.as_u16());
        let request = session.req_header();
        let user = match &ctx.effective {
            Some(Effective::Impersonate(identity) | Effective::PassThrough(identity, _)) => {
                identity.user.username.as_str()
            }
            Some(Effective::Anonymous) => "system:anonymous",
            None => "",
        };
        let authenticator = match &ctx.effective {
            Some(Effective::Impersonate(identity) | Effective::PassThrough(identity, _)) => {
                &*identity.authenticator
            }
            _ => "",
        };
        tracing::info!(
            target: "selkie::audit",
            user,
            authenticator,
            verb = %request.method,
            path = request.uri.path(),
            status,
            bytes_sent = session.body_bytes_sent(),
            latency_us = u64::try_from(ctx.started.elapsed().as_micros()).unwrap_or(u64::MAX),
            refusal = ctx.refusal.as_deref().unwrap_or(""),
            error = error.map(|e| e.etype().as_str()).unwrap_or(""),
            "request"
        );
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        error: &Error,
        _ctx: &mut Self::CTX,
    ) -> pingora::proxy::FailToProxy {
        let failure = match error.etype() {
            pingora::ErrorType::ConnectTimedout
            | pingora::ErrorType::ConnectRefused
            | pingora::ErrorType::ConnectNoRoute
            | pingora::ErrorType::TLSHandshakeFailure => Failure::BAD_GATEWAY,
            _ => Failure::NOT_READY,
        };
        let code = if session.response_written().is_some() {
            0
        } else {
            let _ = refuse(session, failure).await;
            failure.code
        };
        pingora::proxy::FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }
}
