//! Long-lived HTTP/2 responses — watches and followed logs — served by a lean path of their own,
//! every other request by pingora's request loop.
//!
//! pingora's `ProxyHttp` loop holds one boxed future per request for the request's whole life:
//! the state machine of every phase it might run (cache, subrequests, both upstream protocols),
//! 13.6 KiB of the ~24 KiB an idle watch cost (`perf/results/profile-round3.md`). A watch
//! lives for minutes to hours and mostly waits, so that is what 10,000 watches cost.
//!
//! [`Routes`] sends an HTTP/2 `GET` without a body that asks to watch (`watch=true`, a `/watch/`
//! path) or to follow a log (`follow=true`) down [`serve_stream`] instead. It runs the very same
//! steps as pingora's loop does through [`ImpersonationProxy`]'s hooks (head checks,
//! authentication and the header policy, the Concierge APIs, the upstream gate, identity
//! headers, failures as `metav1.Status`, the audit line), each step that waits on the network
//! in a boxed future of its own that is freed when the step is done. What stays for the life of
//! the stream is small: the request's state, the two HTTP/2 streams, and the copy loop
//! ([`pump`]).
//!
//! The stream's upstream HTTP/2 connections are pooled apart from pingora's (its connector is
//! private to its loop), gated by [`Upstream::stream_gate`] as pingora's are by
//! [`Upstream::gate`].
//!
//! How a stream ends, as pingora's loop ends it: kube-apiserver ends the response → the client's
//! stream ends cleanly; kube-apiserver's stream or connection fails → the client's stream is
//! reset; the client resets its stream → the upstream stream is reset (kube-apiserver stops the
//! watch).
//!
//! [`Upstream::stream_gate`]: crate::snapshot::Upstream::stream_gate
//! [`Upstream::gate`]: crate::snapshot::Upstream::gate

use std::{future::Future, pin::Pin, sync::Arc};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::{
    apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream},
    connectors::{http::Connector, ConnectorOptions},
    http::RequestHeader,
    protocols::http::{
        client::HttpSession as ClientSession, v2::client::Http2Session, v2::server::H2Options, ServerSession,
    },
    proxy::HttpProxy,
    server::{configuration::ServerConf, ShutdownWatch},
    upstreams::peer::Peer as _,
    Error, ErrorType, Result,
};

use crate::{
    metrics::UpstreamConnection,
    service::{ImpersonationProxy, RequestContext},
};

/// pingora's HTTP application with long-lived HTTP/2 responses taken out of its request loop
/// (see the module documentation).
pub struct Routes {
    /// pingora's request loop with the proxy's hooks, for every other request; its server and
    /// HTTP/2 options are the listener's.
    proxy: Arc<HttpProxy<ImpersonationProxy>>,
    service: ImpersonationProxy,
    connector: Connector,
}

impl Routes {
    /// Serves long-lived HTTP/2 responses with `service`'s hooks and upstream connections made
    /// with the connector settings of `conf`; every other request goes to `proxy` (pingora's
    /// loop, built with the same `service`).
    pub fn new(conf: &ServerConf, proxy: HttpProxy<ImpersonationProxy>, service: ImpersonationProxy) -> Self {
        Self {
            proxy: Arc::new(proxy),
            service,
            connector: Connector::new(Some(ConnectorOptions::from_server_conf(conf))),
        }
    }
}

#[async_trait]
impl HttpServerApp for Routes {
    /// Written out rather than as an `async fn`: `async_trait` would move `session` from the
    /// captured argument into a local of the same future, and the future keeps room for both
    /// (680 bytes each) for the request's life. Here the stream path's future uses the captured
    /// session in place, and every other request returns pingora's own boxed future, without a
    /// box around it.
    fn process_new_http<'this, 'shutdown, 'future>(
        self: &'this Arc<Self>,
        mut session: ServerSession,
        shutdown: &'shutdown ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<ReusedHttpStream>> + Send + 'future>>
    where
        'this: 'future,
        'shutdown: 'future,
        Self: 'future,
    {
        if session.is_http2() && long_lived(session.req_header()) && session.is_body_empty() {
            return Box::pin(async move {
                serve_stream(&self.service, &self.connector, &mut session).await;
                None
            });
        }
        self.proxy.process_new_http(session, shutdown)
    }

    async fn http_cleanup(&self) {
        self.proxy.http_cleanup().await;
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.proxy.server_options.as_ref()
    }

    fn h2_options(&self) -> Option<H2Options> {
        self.proxy.h2_options.clone()
    }
}

/// Whether `request` asks for a response that stays open: a `GET` that watches (`watch` set
/// true in the query, or a `/watch/` path of the deprecated watch endpoints) or follows a log
/// (`follow` set true). Anything else, or a malformed query, is not; both paths answer any
/// request the same way, so this only decides which one serves it.
pub(crate) fn long_lived(request: &RequestHeader) -> bool {
    if request.method != http::Method::GET {
        return false;
    }
    if request.uri.path().contains("/watch/") {
        return true;
    }
    let Some(query) = request.uri.query() else {
        return false;
    };
    query.split('&').any(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        // kube-apiserver reads these with Go's strconv.ParseBool.
        (key == "watch" || key == "follow") && matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
    })
}

/// A long-lived HTTP/2 response from start to end: the request's steps ([`open`]), then the
/// body ([`pump`]), then the failure answer and the audit line. Every step but the copy loop
/// runs in a boxed future of its own, freed when it is done: while the response streams, only
/// the request's state, the two streams and the copy loop are held. Dropping the session
/// afterwards resets the client's stream if its response did not end.
async fn serve_stream(service: &ImpersonationProxy, connector: &Connector, session: &mut ServerSession) {
    let mut ctx = service.new_context();
    // A statement of its own: a temporary in a `match` scrutinee would live (and keep the
    // boxed steps allocated) until the end of the `match`, through the whole copy loop.
    let opened = Box::pin(open(service, connector, session, &mut ctx)).await;
    let error = match opened {
        Ok(None) => None,
        Ok(Some(mut upstream)) => {
            let pumped = pump(session, &mut upstream).await;
            Box::pin(release(service, connector, &ctx, upstream)).await;
            pumped.err()
        }
        Err(error) => Some(error),
    };
    if let Some(error) = &error {
        Box::pin(service.fail(session, error, &mut ctx)).await;
    }
    service.end(session, error.as_deref(), &mut ctx);
}

/// Gives the upstream stream back to its connection's pool, which the peer names, or drops it
/// when the peer cannot be named again. Boxed by the caller: the peer (672 bytes) is built again
/// here rather than kept through the stream, and this step's state is not part of the stream's
/// future, which would otherwise have room for it for the stream's whole life.
async fn release(
    service: &ImpersonationProxy,
    connector: &Connector,
    ctx: &RequestContext,
    upstream: Box<Http2Session>,
) {
    match service.peer(false, ctx) {
        Ok(peer) => {
            connector
                .release_http_session(ClientSession::H2(*upstream), &peer, peer.idle_timeout())
                .await;
        }
        Err(_) => drop(upstream),
    }
}

/// How many times a request whose pooled upstream connection turned out dead is sent again on a
/// new one (pingora's loop does the same), before any answer went to the client.
const RETRIES: usize = 1;

/// The request's steps up to its response headers: [`ImpersonationProxy::begin`] and
/// [`ImpersonationProxy::admit`] (`Ok(None)` when it was answered there), then the upstream
/// stream: the peer and the gate, the request with the identity headers, the response headers
/// sent on to the client.
///
/// Watches arrive in bursts (a controller starting, a client reconnecting), and most of a burst
/// waits here, in the upstream gate or for kube-apiserver's headers. So the steps whose futures
/// are large (admission with the authenticators' calls, the upstream TLS connect) are boxed on
/// their own and freed once done: the memory of a burst is that of its waiting, not of every step
/// at once, and the heap does not keep the burst's high-water mark.
async fn open(
    service: &ImpersonationProxy,
    connector: &Connector,
    session: &mut ServerSession,
    ctx: &mut RequestContext,
) -> Result<Option<Box<Http2Session>>> {
    let answered = Box::pin(async {
        service.begin(session, ctx).await?;
        service.admit(session, ctx).await
    })
    .await?;
    if answered {
        return Ok(None);
    }
    let mut retries = 0;
    loop {
        let peer = service
            .choose_peer(false, |upstream| &upstream.stream_gate, ctx)
            .await?;
        let (client, reused) = Box::pin(connector.get_http_session(&peer)).await?;
        service.connected(UpstreamConnection::pooled(reused), ctx);
        let ClientSession::H2(mut upstream) = client else {
            Box::pin(connector.release_http_session(client, &peer, peer.idle_timeout())).await;
            return Err(Error::explain(
                ErrorType::InternalError,
                "kube-apiserver did not negotiate HTTP/2",
            ));
        };
        match exchange_headers(service, session, &mut upstream, ctx).await {
            // Boxed: the stream's future holds a pointer through the copy loop.
            Ok(()) => return Ok(Some(Box::new(upstream))),
            Err(error) => {
                Box::pin(connector.release_http_session(
                    ClientSession::H2(upstream),
                    &peer,
                    peer.idle_timeout(),
                ))
                .await;
                if reused && error.retry() && retries < RETRIES && session.response_written().is_none() {
                    retries += 1;
                    continue;
                }
                return Err(error);
            }
        }
    }
}

/// Sends the client's request upstream with the proxy's identity headers and the end of the
/// stream (it has no body), and the upstream response's headers to the client.
async fn exchange_headers(
    service: &ImpersonationProxy,
    session: &mut ServerSession,
    upstream: &mut Http2Session,
    ctx: &RequestContext,
) -> Result<()> {
    let mut request = session.req_header().clone();
    service.identify(&mut request, ctx)?;
    // HTTP/2 carries the authority in the URI (`:authority`), not in a Host header.
    if let Some(host) = request.remove_header(&http::header::HOST) {
        if request.uri.authority().is_none() {
            let uri = http::Uri::builder()
                .scheme("https")
                .authority(host.as_bytes())
                .path_and_query(request.uri.path_and_query().map_or("/", |p| p.as_str()))
                .build()
                .map_err(|error| Error::because(ErrorType::InvalidHTTPHeader, "the Host header", error))?;
            request.set_uri(uri);
        }
    }
    request.set_version(http::Version::HTTP_2);
    // pingora keeps the request for the stream's life. Adding the identity headers grew its
    // header map to up to twice the room they take; a clone has exactly that room.
    upstream
        .write_request_header(Box::new(request.clone()), true)
        .map_err(|error| error.into_up())?;
    upstream
        .read_response_header()
        .await
        .map_err(|error| error.into_up())?;
    let response = upstream
        .response_header()
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream response header"))?
        .clone();
    service.answered(response.status, ctx)?;
    let ServerSession::H2(session) = session else {
        return Err(Error::explain(ErrorType::InternalError, "not an HTTP/2 stream"));
    };
    session
        .write_response_header(Box::new(response), false)
        .map_err(|error| error.into_down())
}

/// Copies the upstream response body to the client as it arrives, until kube-apiserver ends it
/// (the client's stream is then ended too) or either stream fails or is reset (an error whose
/// source says which side).
async fn pump(session: &mut ServerSession, upstream: &mut Http2Session) -> Result<()> {
    // The HTTP/2 session itself: its futures are a fraction of the size of the generic
    // session's, which hold every protocol's.
    let ServerSession::H2(session) = session else {
        return Err(Error::explain(ErrorType::InternalError, "not an HTTP/2 stream"));
    };
    loop {
        let chunk = {
            let closed = session.idle();
            // Polled rather than awaited through `read_response_body`, whose future has room for
            // a read timeout the stream path never sets: this wait is what an idle watch holds.
            let read = std::future::poll_fn(|cx| upstream.poll_read_response_body(cx));
            tokio::select! {
                chunk = read => chunk
                    .transpose()
                    .map_err(|error| Error::because(ErrorType::ReadError, "reading the upstream response body", error).into_up())?,
                reason = closed => {
                    let reason = reason.map_err(|error| error.into_down())?;
                    return Err(Error::explain(
                        ErrorType::H2Error,
                        format!("the client closed the stream: {reason}"),
                    )
                    .into_down());
                }
            }
        };
        if chunk.as_ref().is_some_and(Bytes::is_empty) {
            continue;
        }
        let end = chunk.is_none();
        // Boxed: the write's future (two timeouts deep) exists only while a chunk goes out,
        // instead of widening the copy loop's state for the stream's whole life.
        Box::pin(session.write_body(chunk.unwrap_or_else(Bytes::new), end))
            .await
            .map_err(|error| error.into_down())?;
        if end {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, target: &str) -> RequestHeader {
        RequestHeader::build(method, target.as_bytes(), None).unwrap()
    }

    #[test]
    fn watches_and_followed_logs_are_long_lived() {
        for target in [
            "/api/v1/namespaces/default/configmaps?watch=true",
            "/api/v1/configmaps?resourceVersion=10&watch=1&allowWatchBookmarks=true",
            "/apis/apps/v1/deployments?watch=True&timeoutSeconds=300",
            "/api/v1/watch/namespaces/default/pods",
            "/api/v1/namespaces/default/pods/web/log?container=app&follow=true",
        ] {
            assert!(long_lived(&request("GET", target)), "{target}");
        }
    }

    #[test]
    fn other_requests_are_not() {
        for (method, target) in [
            ("GET", "/api/v1/namespaces/default/configmaps"),
            ("GET", "/api/v1/configmaps?watch=false"),
            ("GET", "/api/v1/configmaps?watch="),
            ("GET", "/api/v1/configmaps?watchlist=true"),
            ("GET", "/api/v1/configmaps?xwatch=true"),
            ("GET", "/api/v1/namespaces/default/pods/web/log"),
            ("POST", "/api/v1/namespaces/default/configmaps?watch=true"),
            ("DELETE", "/api/v1/watch/namespaces/default/pods"),
        ] {
            assert!(!long_lived(&request(method, target)), "{method} {target}");
        }
    }
}
