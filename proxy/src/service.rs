//! The request path (DESIGN.md, data flow 1–6): its steps as hooks of [`ImpersonationProxy`],
//! run by pingora's request loop ([`ProxyHttp`]) and by the lean path of long-lived HTTP/2
//! responses ([`crate::streams`]).
//!
//! Per request: load the snapshot once; take the connection's certificate identity (computed at
//! the handshake) or run the bearer token through the chain; remove every client credential and
//! identity header; refuse what may not pass; then forward to kube-apiserver with the proxy's own
//! credential and `Impersonate-*` headers (or, for identities that carry a UID from TokenReview,
//! the original token). The body of a response that ends on its own goes back to the client in
//! few, large writes ([`crate::coalesce`]). One audit line per request at the end.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::{header, HeaderName, HeaderValue};
use pingora::{
    http::{RequestHeader, ResponseHeader},
    protocols::http::ServerSession,
    proxy::{ProxyHttp, Session},
    upstreams::peer::HttpPeer,
    Error, Result,
};
use rustls::pki_types::UnixTime;
use selkie_filters::{
    access_review::AccessDecision,
    chain::Decision,
    identity::{Credential, Forwarding, Identity, UserInfo},
    impersonation::{
        headers::{
            client_credentials, impersonation_headers, PreparedCache, PreparedIdentity,
            RequestedImpersonation, SharedHeaders,
        },
        nested::{check_extra_key, check_extra_keys, forbidden_message, plan, NestedError},
    },
    issuing::login_api::{who_am_i, ConciergeApi},
    outcome::{Outcome, RejectReason},
};

use selkie_api::{identity::WhoAmIRequest, login::TokenCredentialRequest};

use crate::{
    coalesce::Coalescer,
    metrics::{Active, Metrics, UpstreamConnection, VerbClass},
    snapshot::{ConciergePaths, Snapshot, Upstream, UpstreamCredential},
    status::{status_body, Failure},
    tls::PeerCertificate,
    upstream_gate::Ticket,
};

/// Appends a header upstream. pingora copies any `HeaderName` it is given into a new buffer to
/// keep its case; the fixed `Impersonate-*` names go in as the same (lower-case) static strings,
/// so the bytes on the wire are unchanged and nothing is copied.
fn append_header(request: &mut RequestHeader, name: &HeaderName, value: HeaderValue) -> Result<bool> {
    match name.as_str() {
        "impersonate-user" => request.append_header("impersonate-user", value),
        "impersonate-group" => request.append_header("impersonate-group", value),
        "impersonate-uid" => request.append_header("impersonate-uid", value),
        _ => request.append_header(name.clone(), value),
    }
}

/// The impersonation proxy: the snapshot handle, the metrics, and the `Impersonate-*` headers of
/// the identities authenticators hand out again and again. Cheap to clone: clones share all
/// three (pingora's request loop holds one, [`crate::streams`] another).
#[derive(Clone)]
pub struct ImpersonationProxy {
    snapshot: Arc<ArcSwap<Snapshot>>,
    metrics: Metrics,
    prepared: Arc<PreparedCache>,
}

/// How many token identities keep their prepared `Impersonate-*` headers (as many as a JWT
/// authenticator's result cache holds by default).
const PREPARED_IDENTITIES: usize = 10_000;

impl ImpersonationProxy {
    /// Serves from whatever `snapshot` holds when each request starts, and records every request
    /// in `metrics`.
    pub fn new(snapshot: Arc<ArcSwap<Snapshot>>, metrics: Metrics) -> Self {
        Self {
            snapshot,
            metrics,
            prepared: Arc::new(PreparedCache::new(PREPARED_IDENTITIES)),
        }
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
    /// The `Impersonate-*` headers to add upstream when they were built once for the identity
    /// (static identity: per snapshot; client certificate: per connection); added before
    /// `upstream_headers`.
    shared_headers: Option<SharedHeaders>,
    /// Why the request was refused, or which authenticators refused the credential.
    refusal: Option<String>,
    /// The authenticated caller, when it impersonates someone else (`kubectl --as`).
    original: Option<Arc<Identity>>,
    /// What kind of request this is, for metrics; set by the first hook.
    verb_class: VerbClass,
    /// Counts the request as in flight until it ends, however it ends.
    in_flight: Option<Active>,
    /// Counts an upgraded request as an open tunnel until it ends.
    tunnel: Option<Active>,
    /// The request's stream in the upstream connection gate (HTTP/2 with the proxy's own
    /// credential), held until the request ends.
    upstream_stream: Option<Ticket>,
    /// Holds the body chunks of a response that ends on its own, to write them together.
    coalescer: Coalescer,
    /// The request's audit line is written ([`ImpersonationProxy::end`] ran).
    ended: bool,
}

impl RequestContext {
    /// Whether the request goes to kube-apiserver with the proxy's own credential: every request
    /// but one whose caller's token passes through.
    fn sends_own_credential(&self) -> bool {
        !matches!(self.effective, Some(Effective::PassThrough(..)))
    }
}

/// The connection's client certificate, if the client presented one.
fn peer_certificate(session: &ServerSession) -> Option<&PeerCertificate> {
    session
        .digest()
        .and_then(|digest| digest.ssl_digest.as_ref())
        .and_then(|ssl| ssl.extension.get::<PeerCertificate>())
}

fn bearer_token(value: &HeaderValue) -> Option<&str> {
    let value = value.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn refuse(session: &mut ServerSession, failure: Failure) -> Result<bool> {
    answer_failure(
        session,
        failure.code,
        failure.reason,
        failure.message,
        failure.retry_after,
    )
    .await
}

/// Answers the request with a `metav1.Status` failure and ends it.
async fn refuse_with(session: &mut ServerSession, code: u16, reason: &str, message: &str) -> Result<bool> {
    answer_failure(session, code, reason, message, None).await
}

/// [`refuse_with`], with a `Retry-After` header when `retry_after` is set.
async fn answer_failure(
    session: &mut ServerSession,
    code: u16,
    reason: &str,
    message: &str,
    retry_after: Option<u32>,
) -> Result<bool> {
    let body = status_body(code, reason, message);
    let mut response = ResponseHeader::build(code, Some(4))?;
    response.insert_header(header::CONTENT_TYPE, "application/json")?;
    response.insert_header(header::CONTENT_LENGTH, body.len())?;
    if let Some(seconds) = retry_after {
        response.insert_header(header::RETRY_AFTER, seconds)?;
    }
    // An HTTP/1.1 connection may still hold an unread request body, so it is not reused. On
    // HTTP/2 the refusal ends one stream; the connection and its other streams carry on.
    if !session.is_http2() {
        session.set_keepalive(None);
    }
    session.write_response_header(Box::new(response)).await?;
    session.write_response_body(body, true).await?;
    Ok(true)
}

/// Why the proxy answers a request itself with an error instead of forwarding it: the status
/// for the client, the line for the audit log, and whether the connection's client certificate
/// stopped counting (the connection is then closed).
struct Refusal {
    code: u16,
    reason: &'static str,
    message: String,
    log: String,
    revoke_certificate: bool,
}

impl Refusal {
    /// `failure` for the client; `log` for the audit line.
    fn of(failure: Failure, log: impl Into<String>) -> Self {
        Self {
            code: failure.code,
            reason: failure.reason,
            message: failure.message.to_string(),
            log: log.into(),
            revoke_certificate: false,
        }
    }

    /// A 400 whose message (also the audit line) says what was wrong.
    fn bad_request(message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            code: 400,
            reason: "BadRequest",
            log: message.clone(),
            message,
            revoke_certificate: false,
        }
    }
}

type Step<T> = std::result::Result<T, Refusal>;

/// Who `caller` acts as after asking for `requested` (`kubectl --as`), once kube-apiserver's
/// SubjectAccessReviews allow every part of it. Fails closed: a review that cannot be made
/// refuses the request.
async fn nested_identity(
    snapshot: &Snapshot,
    caller: &Identity,
    requested: &RequestedImpersonation,
) -> Step<Arc<Identity>> {
    let plan = plan(requested, &caller.user)
        .map_err(|error: NestedError| Refusal::bad_request(error.to_string()))?;
    let authorization = snapshot.upstream.own_authorization();
    for check in &plan.checks {
        match snapshot
            .upstream
            .access_reviewer
            .review(&caller.user, check, authorization.as_ref())
            .await
        {
            Ok(AccessDecision::Allowed) => {}
            Ok(AccessDecision::Denied { reason }) => {
                return Err(Refusal {
                    code: 403,
                    reason: "Forbidden",
                    message: forbidden_message(&caller.user.username, check, &reason),
                    log: format!("may not impersonate {} {:?}", check.resource, check.name),
                    revoke_certificate: false,
                })
            }
            Err(error) => {
                tracing::warn!(%error, "checking a nested impersonation failed");
                return Err(Refusal::of(Failure::AUTHORIZATION_UNAVAILABLE, error.to_string()));
            }
        }
    }
    Ok(Arc::new(Identity {
        user: plan.user,
        authenticator: caller.authenticator.clone(),
        audiences: caller.audiences.clone(),
        forwarding: Forwarding::Impersonate,
    }))
}

/// The `Impersonate-*` headers a client asked for, rebuilt from what was parsed. Extra keys
/// follow the same rule as the proxy's own ([`check_extra_key`]): kube-apiserver checks the
/// caller's RBAC, but a look-alike of the reserved key must not reach its audit log either.
fn requested_headers(
    requested: &RequestedImpersonation,
) -> std::result::Result<Vec<(HeaderName, HeaderValue)>, String> {
    let user = requested
        .user
        .as_deref()
        .ok_or_else(|| NestedError::NoUser.to_string())?;
    let mut info = UserInfo {
        username: user.to_string(),
        uid: requested.uid.clone(),
        groups: requested.groups.clone(),
        ..UserInfo::default()
    };
    for (key, value) in &requested.extra {
        check_extra_key(key).map_err(|error| error.to_string())?;
        info.extra.entry(key.clone()).or_default().push(value.clone());
    }
    impersonation_headers(&info).map_err(|error| error.to_string())
}

/// What [`authenticate`] found: the chain's decision, the identity whose `Impersonate-*` headers
/// were built ahead (the certificate's, else the snapshot's static identity), and why the
/// connection's certificate was refused, if it was.
struct Authenticated {
    decision: Decision,
    prepared: Option<PreparedIdentity>,
    refused_certificate: Option<RejectReason>,
    /// The caller's own `Authorization` header, for an identity whose token kube-apiserver must
    /// see unchanged (read here, before [`strip_client_headers`] removes it).
    pass_through: Option<HeaderValue>,
}

/// Step 1: who the caller is. The connection's client certificate counts when it is valid now
/// under the CA pools of the snapshot this request runs with; otherwise a bearer token goes
/// through the chain. A certificate that does not verify (expired, from a CA no longer
/// trusted), with no token, is a failed authentication, never anonymous, as in kube-apiserver.
async fn authenticate(session: &ServerSession, snapshot: &Snapshot) -> Authenticated {
    let verdict = peer_certificate(session)
        .map(|peer| peer.current(snapshot.client_certificates.as_ref(), UnixTime::now()));
    let (certificate, prepared, refused_certificate) = match verdict {
        Some((Outcome::Authenticated(identity), prepared)) => (Some(identity), prepared, None),
        Some((Outcome::Rejected(reason), _)) => (None, snapshot.static_prepared.clone(), Some(reason)),
        _ => (None, snapshot.static_prepared.clone(), None),
    };
    let mut pass_through = None;
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
            Some(token) => {
                let decision = snapshot.chain.authenticate(Credential::BearerToken(token)).await;
                // Pinniped's tokenPassthroughRoundTripper reviews the token again and compares
                // that user with the request's before passing the token on, because its request
                // user may come from a client certificate (which takes precedence over a token).
                // Here the identity to pass through is the one kube-apiserver's TokenReview
                // returned for this very header's token, and a certificate never gets this far,
                // so there is nothing else to compare it with: what kube-apiserver sees when it
                // authenticates the token again is that identity (or a refusal, if the token was
                // revoked since the review).
                if let Decision::Authenticated(identity) = &decision {
                    if identity.forwarding == Forwarding::PassThroughToken {
                        pass_through = Some(value.clone());
                    }
                }
                decision
            }
            None => Decision::Unauthenticated(Vec::new()),
        },
        (None, None) => match (refused_certificate, &snapshot.client_certificates) {
            (Some(reason), Some(x509)) => Decision::Unauthenticated(vec![(x509.name().clone(), reason)]),
            _ => Decision::Anonymous,
        },
    };
    let refused_certificate = refused_certificate.filter(|_| certificate.is_none());
    Authenticated {
        decision,
        prepared,
        refused_certificate,
        pass_through,
    }
}

/// Step 2: removes every client-supplied credential and identity header (`Authorization`,
/// `Impersonate-*`, `X-Remote-*`, `X-Forwarded-For`) and returns the impersonation the client
/// asked for; malformed `Impersonate-*` headers are a 400. The caller's own bearer token, when
/// it is to be passed through, was read before ([`Authenticated::pass_through`]).
fn strip_client_headers(session: &mut ServerSession) -> Step<RequestedImpersonation> {
    let (names, requested) = client_credentials(&session.req_header().headers);
    let request = session.req_header_mut();
    for name in &names {
        request.remove_header(name);
    }
    requested.map_err(|error| Refusal::of(Failure::BAD_REQUEST, error.to_string()))
}

/// Step 3: who the request acts as before any nested impersonation: the authenticated identity
/// (its own token passed through, for identities kube-apiserver must see unchanged), the static
/// identity for callers without credentials, or anonymous on the anonymous paths; 401 otherwise.
fn caller(session: &ServerSession, snapshot: &Snapshot, authenticated: Authenticated) -> Step<Effective> {
    let Authenticated {
        decision,
        refused_certificate,
        pass_through,
        ..
    } = authenticated;
    match decision {
        Decision::Authenticated(identity) => Ok(match pass_through {
            Some(token) => Effective::PassThrough(identity, token),
            None => Effective::Impersonate(identity),
        }),
        Decision::Anonymous => match &snapshot.static_identity {
            Some(identity) => Ok(Effective::Impersonate(identity.clone())),
            // The paths anonymous callers may reach: creating TokenCredentialRequests and
            // WhoAmIRequests.
            None if local_api(session.req_header().uri.path(), &snapshot.concierge_paths).is_some() => {
                Ok(Effective::Anonymous)
            }
            None => Err(Refusal::of(Failure::UNAUTHORIZED, "anonymous")),
        },
        Decision::Unauthenticated(refusals) => {
            let log = refusals
                .iter()
                .map(|(name, reason)| format!("{name}:{reason}"))
                .collect::<Vec<_>>()
                .join(",");
            let mut refusal = Refusal::of(Failure::UNAUTHORIZED, log);
            // A connection whose certificate no longer counts is closed after this answer
            // (HTTP/1.1: no keep-alive; HTTP/2: see `crate::downstream`).
            refusal.revoke_certificate = refused_certificate.is_some();
            Err(refusal)
        }
    }
}

/// Step 4: a caller's own `Impersonate-*` headers (`kubectl --as`). Returns who the request acts
/// as, the original caller when that changed, and headers to send upstream as they are (for a
/// passed-through token, whose impersonation kube-apiserver checks itself). `answered_locally`:
/// the proxy answers the request itself (TokenCredentialRequest, WhoAmIRequest), so nothing
/// reaches kube-apiserver to check a passed-through caller's impersonation; the proxy checks it
/// with SubjectAccessReviews as for any other caller.
async fn resolve_nested(
    snapshot: &Snapshot,
    caller: Effective,
    requested: &RequestedImpersonation,
    answered_locally: bool,
) -> Step<(Effective, Option<Arc<Identity>>, Vec<(HeaderName, HeaderValue)>)> {
    if !requested.is_requested() {
        return Ok((caller, None, Vec::new()));
    }
    match caller {
        // kube-apiserver authenticates the caller's own token and checks the impersonation
        // itself, against the caller's RBAC: the asked-for headers go along, rebuilt from what
        // was parsed, with the caller's token and never the proxy's credential, so a nested
        // impersonation can get no further than the caller could without the proxy.
        Effective::PassThrough(caller, token) if !answered_locally => {
            let headers = requested_headers(requested).map_err(Refusal::bad_request)?;
            Ok((Effective::PassThrough(caller, token), None, headers))
        }
        Effective::Impersonate(caller) | Effective::PassThrough(caller, _) => {
            let target = nested_identity(snapshot, &caller, requested).await?;
            Ok((Effective::Impersonate(target), Some(caller), Vec::new()))
        }
        Effective::Anonymous => Err(Refusal::of(
            Failure::IMPERSONATION_FORBIDDEN,
            "anonymous nested impersonation",
        )),
    }
}

/// Step 5: the headers that carry the effective user upstream: the `Impersonate-*` headers
/// (built ahead for the certificate's or the static identity, remembered in `cache` for the
/// identities token authenticators hand out again, built now for a nested impersonation's
/// target), the passed-through token, or the anonymous user. An identity whose extras cannot be
/// passed on faithfully, or whose fields cannot be header values, is refused (401).
fn prepare_upstream(
    effective: &Effective,
    nested: bool,
    prepared: Option<&PreparedIdentity>,
    cache: &PreparedCache,
    upstream_headers: &mut Vec<(HeaderName, HeaderValue)>,
) -> Step<Option<SharedHeaders>> {
    match effective {
        Effective::Impersonate(identity) => {
            if !nested {
                if let Err(error) = check_extra_keys(&identity.user) {
                    // The authenticator produced an extra the proxy cannot pass on faithfully.
                    tracing::warn!(authenticator = %identity.authenticator, %error, "an identity's extra cannot be impersonated");
                    return Err(Refusal::of(Failure::UNAUTHORIZED, error.to_string()));
                }
            }
            let headers = match prepared.and_then(|prepared| prepared.headers_for(identity)) {
                Some(built) => built.clone(),
                // A nested impersonation's target is a new identity every time: not remembered.
                None if nested => impersonation_headers(&identity.user).map(SharedHeaders::from),
                None => cache.headers(identity),
            };
            headers
                .map(Some)
                .map_err(|error| Refusal::of(Failure::UNAUTHORIZED, error.to_string()))
        }
        Effective::PassThrough(_, token) => {
            upstream_headers.push((header::AUTHORIZATION, token.clone()));
            Ok(None)
        }
        Effective::Anonymous => {
            upstream_headers.push((
                HeaderName::from_static("impersonate-user"),
                HeaderValue::from_static("system:anonymous"),
            ));
            upstream_headers.push((
                HeaderName::from_static("impersonate-group"),
                HeaderValue::from_static("system:unauthenticated"),
            ));
            Ok(None)
        }
    }
}

/// Step 6, on the request about to go upstream: removes every client credential and identity
/// header again (the downstream headers were cleaned in step 2; this catches anything added
/// since), then adds the proxy's own token (unless the caller's token passes through; with a
/// client certificate the TLS handshake carries the proxy's credential, see [`Upstream::peer`])
/// and the identity headers of step 5 (`shared`, then `headers`). A passed-through request thus
/// carries the caller's `Authorization` and no `Impersonate-*` header of the proxy's (only those
/// the caller asked for, which kube-apiserver checks against the caller).
fn identify_upstream(
    upstream_request: &mut RequestHeader,
    upstream: &Upstream,
    effective: Option<&Effective>,
    shared: &[(HeaderName, HeaderValue)],
    headers: &[(HeaderName, HeaderValue)],
) -> Result<()> {
    let (names, _) = client_credentials(&upstream_request.headers);
    for name in &names {
        upstream_request.remove_header(name);
    }
    let passes_through = matches!(effective, Some(Effective::PassThrough(..)));
    if let (false, UpstreamCredential::TokenFile(file)) = (passes_through, &upstream.credential) {
        let token = file
            .header()
            .ok_or_else(|| Error::explain(pingora::ErrorType::InternalError, "no upstream token"))?;
        upstream_request.insert_header(header::AUTHORIZATION, token)?;
    }
    for (name, value) in shared.iter().chain(headers) {
        append_header(upstream_request, name, value.clone())?;
    }
    Ok(())
}

/// The Concierge APIs the proxy can answer itself.
#[derive(Debug, Clone, Copy)]
enum LocalApi {
    TokenCredentialRequest,
    WhoAmIRequest,
}

/// Largest TokenCredentialRequest or WhoAmIRequest body read.
const MAX_LOCAL_BODY: usize = 256 * 1024;

/// Which Concierge API `path` is, under the snapshot's API group suffix.
fn local_api(path: &str, paths: &ConciergePaths) -> Option<LocalApi> {
    if path == paths.token_credential_requests {
        Some(LocalApi::TokenCredentialRequest)
    } else if path == paths.who_am_i_requests {
        Some(LocalApi::WhoAmIRequest)
    } else {
        None
    }
}

/// What was wrong with the JSON body of a `kind` request: its syntax, its end, or its shape, and
/// where. Never serde's own message, which quotes values of the body (a token sent in the wrong
/// field would come back in the answer and go into the audit log).
fn invalid_body(kind: LocalApi, error: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let (line, column) = (error.line(), error.column());
    match error.classify() {
        Category::Eof => format!("the request body is not a valid {kind:?}: the JSON ends early"),
        Category::Data => format!(
            "the request body is not a valid {kind:?}: the JSON does not match the {kind:?} schema at line {line}, column {column}"
        ),
        Category::Syntax | Category::Io => format!(
            "the request body is not a valid {kind:?}: it is not JSON (syntax error at line {line}, column {column})"
        ),
    }
}

/// Reads the whole request body, refusing more than `limit` bytes.
async fn read_body(session: &mut ServerSession, limit: usize) -> Result<std::result::Result<Vec<u8>, ()>> {
    let mut body = Vec::new();
    while let Some(chunk) = session.read_request_body().await? {
        if body.len() + chunk.len() > limit {
            return Ok(Err(()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Ok(body))
}

/// Who a WhoAmIRequest reports: the user kube-apiserver would see for this request.
fn effective_user(effective: Option<&Effective>) -> UserInfo {
    let mut user = match effective {
        Some(Effective::Impersonate(identity) | Effective::PassThrough(identity, _)) => identity.user.clone(),
        Some(Effective::Anonymous) | None => {
            return UserInfo {
                username: "system:anonymous".into(),
                groups: vec!["system:unauthenticated".into()],
                ..UserInfo::default()
            }
        }
    };
    // kube-apiserver adds this group to every authenticated (and impersonated) user.
    if !user.groups.iter().any(|group| group == "system:authenticated") {
        user.groups.push("system:authenticated".into());
    }
    user
}

/// Answers a TokenCredentialRequest or WhoAmIRequest without going upstream: `201 Created`
/// with the object, or a `metav1.Status` for a wrong method (405) or an unreadable body (400,
/// 413).
async fn answer_locally(
    session: &mut ServerSession,
    ctx: &mut RequestContext,
    api: &dyn ConciergeApi,
    snapshot: &Snapshot,
    kind: LocalApi,
) -> Result<bool> {
    if session.req_header().method != http::Method::POST {
        ctx.refusal = Some("method not allowed".into());
        return refuse_with(
            session,
            405,
            "MethodNotAllowed",
            "only create is supported on this resource",
        )
        .await;
    }
    let Ok(body) = read_body(session, MAX_LOCAL_BODY).await? else {
        ctx.refusal = Some("request body too large".into());
        return refuse_with(
            session,
            413,
            "RequestEntityTooLarge",
            "the request body is too large",
        )
        .await;
    };
    let answer = match kind {
        LocalApi::TokenCredentialRequest => match serde_json::from_slice::<TokenCredentialRequest>(&body) {
            Ok(request) => serde_json::to_vec(
                &api.token_credential_request(
                    &snapshot.chain,
                    &snapshot.concierge_paths.authenticator_group,
                    request,
                )
                .await,
            ),
            Err(error) => Err(error),
        },
        LocalApi::WhoAmIRequest => match serde_json::from_slice::<WhoAmIRequest>(&body) {
            Ok(request) => serde_json::to_vec(&who_am_i(request, &effective_user(ctx.effective.as_ref()))),
            Err(error) => Err(error),
        },
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(error) => {
            let message = invalid_body(kind, &error);
            ctx.refusal = Some(message.clone());
            return refuse_with(session, 400, "BadRequest", &message).await;
        }
    };
    let mut response = ResponseHeader::build(201, Some(3))?;
    response.insert_header(header::CONTENT_TYPE, "application/json")?;
    response.insert_header(header::CONTENT_LENGTH, answer.len())?;
    session.write_response_header(Box::new(response)).await?;
    session.write_response_body(Bytes::from(answer), true).await?;
    Ok(true)
}

/// The request path's hooks, each a step of its own, called by pingora's request loop
/// ([`ProxyHttp`], below) and by the lean path of long-lived HTTP/2 responses
/// ([`crate::streams`]) alike: both answer a request the same way.
impl ImpersonationProxy {
    /// A new request's state, its clock started.
    pub(crate) fn new_context(&self) -> RequestContext {
        RequestContext {
            started: Instant::now(),
            snapshot: None,
            effective: None,
            upstream_headers: Vec::new(),
            shared_headers: None,
            refusal: None,
            original: None,
            verb_class: VerbClass::Other,
            in_flight: None,
            tunnel: None,
            upstream_stream: None,
            coalescer: Coalescer::default(),
            ended: false,
        }
    }

    /// Runs first, as soon as the request head is parsed: counts the request as in flight, ends
    /// the connection's header-read deadline (the request itself runs with none, see
    /// [`crate::downstream`]) and refuses a head over the size limits with 431 and a
    /// `metav1.Status` body. A refusal is returned as an `HTTPStatus(431)` error, so no later
    /// step runs and the connection closes.
    pub(crate) async fn begin(&self, session: &mut ServerSession, ctx: &mut RequestContext) -> Result<()> {
        ctx.verb_class = VerbClass::of(session.req_header());
        ctx.in_flight = Some(self.metrics.request_started(ctx.verb_class));
        crate::downstream::request_head_read(session);
        if let Err(error) = crate::downstream::check_request_head(session.req_header()) {
            ctx.refusal = Some(error.to_string());
            refuse(session, crate::downstream::REQUEST_HEAD_TOO_LARGE).await?;
            return Err(Error::explain(
                pingora::ErrorType::HTTPStatus(431),
                error.to_string(),
            ));
        }
        Ok(())
    }

    /// The request path's steps, in order: [`authenticate`], [`strip_client_headers`],
    /// [`caller`], [`resolve_nested`], [`prepare_upstream`]; then the Concierge APIs the proxy
    /// answers itself. `Ok(true)` when the request was answered here (a step refused it with its
    /// `metav1.Status`, or it was a Concierge API request); `Ok(false)` when it goes upstream.
    pub(crate) async fn admit(&self, session: &mut ServerSession, ctx: &mut RequestContext) -> Result<bool> {
        let snapshot = self.snapshot.load_full();
        ctx.snapshot = Some(snapshot.clone());
        let mut authenticated = authenticate(session, &snapshot).await;
        self.metrics.authentication(&authenticated.decision);
        let prepared = authenticated.prepared.take();
        let steps = async {
            let requested = strip_client_headers(session)?;
            let caller = caller(session, &snapshot, authenticated)?;
            let answered_locally = snapshot.concierge_api.is_some()
                && local_api(session.req_header().uri.path(), &snapshot.concierge_paths).is_some();
            let (effective, original, mut upstream_headers) =
                resolve_nested(&snapshot, caller, &requested, answered_locally).await?;
            let shared = prepare_upstream(
                &effective,
                original.is_some(),
                prepared.as_ref(),
                &self.prepared,
                &mut upstream_headers,
            )?;
            Ok::<_, Refusal>((effective, original, upstream_headers, shared))
        };
        let (effective, original, upstream_headers, shared) = match steps.await {
            Ok(prepared) => prepared,
            Err(refusal) => {
                if refusal.revoke_certificate {
                    if let Some(peer) = peer_certificate(session) {
                        peer.revoke();
                    }
                }
                ctx.refusal = Some(refusal.log);
                return refuse_with(session, refusal.code, refusal.reason, &refusal.message).await;
            }
        };
        ctx.original = original;
        ctx.shared_headers = shared;
        ctx.upstream_headers = upstream_headers;
        ctx.effective = Some(effective);
        match (
            &snapshot.concierge_api,
            local_api(session.req_header().uri.path(), &snapshot.concierge_paths),
        ) {
            (Some(api), Some(kind)) => answer_locally(session, ctx, api.as_ref(), &snapshot, kind).await,
            _ => Ok(false),
        }
    }

    /// kube-apiserver as the peer of an admitted request: HTTP/1.1 for an `upgrade`, HTTP/2
    /// otherwise, with the proxy's client certificate unless the caller's token passes through.
    /// An HTTP/2 request with the proxy's own credential first takes its place in the upstream
    /// connection gate `gate` (kept in `ctx` until the request ends; a retry keeps it).
    pub(crate) async fn choose_peer(
        &self,
        upgrade: bool,
        gate: impl Fn(&Upstream) -> &Arc<crate::upstream_gate::ConnectionGate>,
        ctx: &mut RequestContext,
    ) -> Result<HttpPeer> {
        let peer = self.peer(upgrade, ctx)?;
        let own_credential = ctx.sends_own_credential();
        // Upgrades get a connection of their own anyway; passed-through tokens use another pool.
        if let (false, true, None, Some(snapshot)) =
            (upgrade, own_credential, &ctx.upstream_stream, &ctx.snapshot)
        {
            let upstream = &snapshot.upstream;
            ctx.upstream_stream = Some(gate(upstream).pass(upstream.connect_timeout).await);
        }
        Ok(peer)
    }

    /// The peer [`ImpersonationProxy::choose_peer`] chose for the request of `ctx`, built again
    /// from the same snapshot (so it names the same connection pool), without the gate.
    pub(crate) fn peer(&self, upgrade: bool, ctx: &RequestContext) -> Result<HttpPeer> {
        let (upstream, own_credential) = self.upstream(ctx)?;
        Ok(upstream.peer(upgrade, own_credential))
    }

    /// kube-apiserver as the request of `ctx` reaches it: the upstream of its snapshot, and
    /// whether with the proxy's own credential (false when the caller's token passes through).
    pub(crate) fn upstream(&self, ctx: &RequestContext) -> Result<(Arc<Upstream>, bool)> {
        let snapshot = ctx
            .snapshot
            .as_ref()
            .ok_or_else(|| Error::explain(pingora::ErrorType::InternalError, "no snapshot loaded"))?;
        Ok((snapshot.upstream.clone(), ctx.sends_own_credential()))
    }

    /// Step 6 on the request about to go upstream ([`identify_upstream`]), with what the earlier
    /// steps left in `ctx`. Takes the headers by reference, not drained: should the upstream
    /// request be retried, the new attempt carries the same identity headers.
    pub(crate) fn identify(&self, upstream_request: &mut RequestHeader, ctx: &RequestContext) -> Result<()> {
        let upstream = ctx
            .snapshot
            .as_ref()
            .map(|snapshot| &*snapshot.upstream)
            .ok_or_else(|| Error::explain(pingora::ErrorType::InternalError, "no snapshot loaded"))?;
        let shared = ctx.shared_headers.as_deref().unwrap_or_default();
        identify_upstream(
            upstream_request,
            upstream,
            ctx.effective.as_ref(),
            shared,
            &ctx.upstream_headers,
        )
    }

    /// Records that the request has an upstream connection, got as `connection` says.
    pub(crate) fn connected(&self, connection: UpstreamConnection, ctx: &mut RequestContext) {
        self.metrics.upstream_connected(connection);
        if let Some(stream) = &mut ctx.upstream_stream {
            stream.connected(connection == UpstreamConnection::Reused);
        }
    }

    /// Runs on kube-apiserver's answer to the request of `ctx` (its status), before anything of
    /// it goes to the client. A 401 to a request the proxy sent with its own credential means
    /// kube-apiserver refused the proxy, not the caller (whose credential never reaches it): a
    /// replica whose pod was deleted is in that state until it stops. Forwarded, it would tell
    /// kubectl its user is not logged in; instead this fails with
    /// [`PROXY_CREDENTIALS_REFUSED`], which [`ImpersonationProxy::fail`] answers with a 503 the
    /// client may retry. Any other answer passes.
    pub(crate) fn answered(&self, status: http::StatusCode, ctx: &RequestContext) -> Result<()> {
        if status == http::StatusCode::UNAUTHORIZED && ctx.sends_own_credential() {
            return Err(Error::explain(
                PROXY_CREDENTIALS_REFUSED,
                "kube-apiserver answered 401 to the impersonation proxy's own credentials",
            )
            .into_up());
        }
        Ok(())
    }

    /// Records that the request of `ctx` was upgraded (`101 Switching Protocols`): it counts as
    /// an open tunnel until it ends.
    pub(crate) fn tunnel_opened(&self, ctx: &mut RequestContext) {
        ctx.tunnel = Some(self.metrics.tunnel_opened());
    }

    /// Runs last, however the request ended: the audit line and the request's metrics, and the
    /// request stops counting as in flight (and as a tunnel, and in the upstream gate). Runs
    /// once: a request that already ended (a tunnel, which ends outside pingora's loop) is left
    /// as it is.
    pub(crate) fn end(&self, session: &ServerSession, error: Option<&Error>, ctx: &mut RequestContext) {
        let status = session
            .response_written()
            .map_or(0, |response| response.status.as_u16());
        self.end_of(
            session.req_header(),
            status,
            session.body_bytes_sent(),
            error,
            ctx,
        );
    }

    /// [`ImpersonationProxy::end`] for a request whose session is gone (a tunnel, whose
    /// connection left pingora's session at the `101`): its head, the status answered (0 when
    /// none was) and the body bytes sent to the client.
    pub(crate) fn end_of(
        &self,
        request: &RequestHeader,
        status: u16,
        bytes_sent: usize,
        error: Option<&Error>,
        ctx: &mut RequestContext,
    ) {
        if std::mem::replace(&mut ctx.ended, true) {
            return;
        }
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
        let original_user = ctx
            .original
            .as_ref()
            .map_or("", |identity| identity.user.username.as_str());
        crate::audit::emit(&crate::audit::AuditRecord {
            user,
            original_user,
            authenticator,
            verb: request.method.as_str(),
            path: request.uri.path(),
            status,
            bytes_sent,
            latency_us: u64::try_from(ctx.started.elapsed().as_micros()).unwrap_or(u64::MAX),
            refusal: ctx.refusal.as_deref().unwrap_or(""),
            error: error.map(|e| e.etype().as_str()).unwrap_or(""),
        });
        self.metrics
            .request_finished(ctx.verb_class, status, ctx.started.elapsed());
        ctx.tunnel = None;
        ctx.in_flight = None;
        ctx.upstream_stream = None;
    }

    /// Answers a request that failed after it was accepted with the `metav1.Status` of
    /// [`failure_of`] (unless a response was already under way), and logs the failure. Returns
    /// the status written (0 when none could be).
    pub(crate) async fn fail(
        &self,
        session: &mut ServerSession,
        error: &Error,
        ctx: &mut RequestContext,
    ) -> u16 {
        let failure = failure_of(error);
        let written = session.response_written().is_some();
        log_failure(error, failure, written);
        if written {
            return 0;
        }
        if failure.code == 400 {
            ctx.refusal = Some(failure.message.to_string());
        }
        let _ = refuse(session, failure).await;
        failure.code
    }
}

/// pingora's request loop, for every request [`crate::streams`] does not take: each hook is one
/// of the steps above.
#[async_trait]
impl ProxyHttp for ImpersonationProxy {
    type CTX = RequestContext;

    fn new_ctx(&self) -> Self::CTX {
        self.new_context()
    }

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<()> {
        self.begin(session, ctx).await
    }

    /// Admits the request ([`ImpersonationProxy::admit`]); an upgrade [`crate::tunnels`] takes
    /// is then served there to its end, and pingora's loop only finishes.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        if self.admit(session, ctx).await? {
            return Ok(true);
        }
        if crate::tunnels::takes(session) {
            crate::tunnels::serve(self, &mut session.downstream_session, ctx).await;
            return Ok(true);
        }
        Ok(false)
    }

    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<Box<HttpPeer>> {
        let upgrade = session.is_upgrade_req();
        self.choose_peer(upgrade, |upstream| &upstream.gate, ctx)
            .await
            .map(Box::new)
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        self.identify(upstream_request, ctx)
    }

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        reused: bool,
        _peer: &HttpPeer,
        #[cfg(unix)] _fd: std::os::unix::io::RawFd,
        #[cfg(windows)] _sock: std::os::windows::io::RawSocket,
        _digest: Option<&pingora::protocols::Digest>,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        self.connected(UpstreamConnection::pooled(reused), ctx);
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        self.answered(upstream_response.status, ctx)?;
        if upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS {
            self.tunnel_opened(ctx);
        }
        ctx.coalescer.start(session.req_header(), upstream_response);
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        ctx.coalescer.filter(body, end_of_stream);
        Ok(None)
    }

    /// kube-apiserver sends no trailers; should an upstream send some after a held chunk, the
    /// held bytes go out as the end of the body (pingora then writes no trailers, which an
    /// HTTP/1.1 client never gets from it anyway).
    async fn response_trailer_filter(
        &self,
        _session: &mut Session,
        _upstream_trailers: &mut http::HeaderMap,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Bytes>> {
        Ok(ctx.coalescer.take())
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut Self::CTX) {
        self.end(session, error, ctx);
    }

    /// pingora's own error line would print the error's whole chain, with the upstream peer it
    /// adds (address, SNI, the proxy's client-certificate subject and expiry);
    /// [`ProxyHttp::fail_to_proxy`] logs what matters instead ([`log_failure`]).
    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, _error: &Error) -> bool {
        true
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        error: &Error,
        ctx: &mut Self::CTX,
    ) -> pingora::proxy::FailToProxy {
        pingora::proxy::FailToProxy {
            error_code: self.fail(session, error, ctx).await,
            can_reuse_downstream: false,
        }
    }
}

/// pingora's error type for a malformed chunk of a chunked body (its `v1::body` module, which
/// defines it, is private).
const INVALID_CHUNK: pingora::ErrorType = pingora::ErrorType::new("InvalidChunk");
/// pingora's error type for a malformed trailer section after the last chunk.
const INVALID_TRAILER_END: pingora::ErrorType = pingora::ErrorType::new("InvalidTrailerEnd");
/// pingora's error type for a body that ended before its `Content-Length`.
const PREMATURE_BODY_END: pingora::ErrorType = pingora::ErrorType::new("PrematureBodyEnd");
/// The error type of a request kube-apiserver refused because of the proxy's own credentials
/// ([`ImpersonationProxy::answered`]).
const PROXY_CREDENTIALS_REFUSED: pingora::ErrorType = pingora::ErrorType::new("ProxyCredentialsRefused");

/// The answer to a request that failed after it was accepted: what the client sent could not be
/// read (400 saying what was wrong — a malformed chunked body, a truncated body, a broken HTTP/2
/// stream; 408 when the body stopped arriving), kube-apiserver could not be reached (502),
/// refused the proxy's own credentials (503 with `Retry-After`) or failed mid-exchange (503), or
/// anything else (503, not ready).
///
/// Chosen from where the error came from and its type only, never from its context: on the way
/// up pingora replaces that with the upstream peer (its address and SNI, the proxy's own
/// client-certificate subject and expiry), and the libraries below it (rustls, h2, I/O) describe
/// the proxy's side of the exchange. A [`Failure`]'s message is a fixed string, so none of that
/// can reach a client; the details go to the server's log ([`log_failure`]).
fn failure_of(error: &Error) -> Failure {
    use pingora::{ErrorSource, ErrorType};
    match (error.esource(), error.etype()) {
        (_, etype) if *etype == PROXY_CREDENTIALS_REFUSED => Failure::PROXY_CREDENTIALS_REFUSED,
        (ErrorSource::Downstream, etype) => downstream_failure(etype),
        (
            _,
            ErrorType::ConnectTimedout
            | ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError,
        ) => Failure::BAD_GATEWAY,
        (ErrorSource::Upstream, etype) if *etype != ErrorType::InternalError => Failure::UPSTREAM_FAILED,
        _ => Failure::NOT_READY,
    }
}

/// What was wrong with a request whose reading failed with `etype`.
fn downstream_failure(etype: &pingora::ErrorType) -> Failure {
    use pingora::ErrorType;
    match etype {
        ErrorType::ReadTimedout => Failure::BODY_TIMED_OUT,
        etype if *etype == INVALID_CHUNK => Failure::MALFORMED_CHUNKED_BODY,
        etype if *etype == INVALID_TRAILER_END => Failure::MALFORMED_CHUNKED_TRAILER,
        etype if *etype == PREMATURE_BODY_END => Failure::TRUNCATED_BODY,
        ErrorType::InvalidHTTPHeader | ErrorType::H1Error => Failure::MALFORMED_HEAD,
        ErrorType::H2Error | ErrorType::InvalidH2 => Failure::MALFORMED_H2_STREAM,
        _ => Failure::UNREADABLE_REQUEST,
    }
}

/// Logs a failed request for the operator: the error's source and type, the answer, and the
/// detail at the bottom of its chain ([`root_detail`]). A client's mistake is logged at debug
/// level (clients must not be able to flood the log), everything else as a warning.
fn log_failure(error: &Error, failure: Failure, response_written: bool) {
    let source = error.esource().as_str();
    let etype = error.etype().as_str();
    let detail = root_detail(error);
    let status = if response_written { 0 } else { failure.code };
    if *error.esource() == pingora::ErrorSource::Downstream {
        tracing::debug!(source, etype, %detail, status, "a request failed");
    } else {
        tracing::warn!(source, etype, %detail, status, "a request failed");
    }
}

/// The context pingora adds when an error passes the upstream peer on its way up (its
/// `error_while_proxy`): `Peer: addr: …, sni: …, client cert: …`.
const PEER_CONTEXT: &str = "Peer: ";

/// What went wrong at the bottom of `error`'s chain: the library error pingora wraps (I/O, TLS,
/// HTTP/2), else the innermost context pingora gave (e.g. `Invalid chunked encoding:
/// InvalidChunkSize`). Leaves out the upstream peer pingora adds on the way up ([`PEER_CONTEXT`]),
/// which names the proxy's own client certificate and says nothing about the failure.
fn root_detail(error: &Error) -> String {
    let mut detail = None;
    let mut current = error;
    loop {
        if let Some(context) = current.context.as_ref() {
            if !context.as_str().starts_with(PEER_CONTEXT) {
                detail = Some(context.as_str().to_string());
            }
        }
        let Some(cause) = current.cause.as_deref() else {
            return detail.unwrap_or_default();
        };
        // pingora keeps a wrapped pingora error as a `Box<Error>` inside the trait object.
        match cause
            .downcast_ref::<Box<Error>>()
            .map(|boxed| &**boxed)
            .or_else(|| cause.downcast_ref::<Error>())
        {
            Some(inner) => current = inner,
            None => return cause.to_string(),
        }
    }
}

#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod pass_through_tests;
