//! What the proxy allows a client connection before any authentication: how long it may take to
//! send a request head, how long it may sit idle between requests, and how large a request head
//! may be.
//!
//! pingora 0.9.1 bounds an HTTP/1.1 request head only per read (60 s on a new connection, nothing
//! at all on a reused one once the client spoke HTTP/1.1), none of it configurable, and keeps an
//! idle keep-alive connection open for ever. [`DownstreamApp`] therefore wraps pingora's HTTP
//! application and puts every client connection in a [`TimedStream`], whose reads follow a clock
//! with three phases:
//!
//! * **head**: the whole request head must arrive within [`Timeouts::header_read`], counted from
//!   the end of the TLS handshake for the first request and from the first byte of each later one
//!   (a client trickling bytes gains nothing);
//! * **request**: from the moment pingora has parsed the head ([`request_head_read`], called by the
//!   service's first hook) until the response is complete, there is no deadline: watches, log
//!   streams, exec, attach and port-forward stay open however long they are quiet (for upgrades,
//!   pingora's own 60 s read timeout on the client's side is lifted too);
//! * **idle**: between requests on a keep-alive connection, the next request must start within
//!   [`Timeouts::idle`].
//!
//! A read past a deadline fails with [`std::io::ErrorKind::TimedOut`] and pingora closes the
//! connection without a response (there is no request to answer).
//!
//! A fourth phase, **closing**, ends a connection whose client certificate stopped counting (it
//! expired, or its CA was removed: [`crate::tls::PeerCertificate::revoke`]): the next read starts
//! a deadline of [`REVOKED_CLOSE_AFTER`], long enough for the 401 already written to leave, and
//! then the connection is closed, with every stream still open on it. HTTP/1.1 connections
//! close after that 401 anyway (no keep-alive); this is what ends an HTTP/2 connection, whose
//! other streams pingora would otherwise keep serving.
//!
//! HTTP/2 connections get the head deadline for the client's connection preface; after that
//! pingora's own HTTP/2 idle timeout (set to [`Timeouts::idle`]) closes a connection that has had
//! no open stream for that long, and a connection with a stream open (a watch) is never idle.
//! The TLS handshake itself is bounded by pingora (60 s, not configurable).
//!
//! Request heads are limited to [`MAX_REQUEST_HEAD_BYTES`] and [`MAX_REQUEST_HEADERS`]
//! ([`check_request_head`]); the service answers a larger one with 431 and a `metav1.Status`
//! body. Beyond that, pingora's and the HTTP/2 codec's own hard limits answer before any hook
//! runs, without a body: on HTTP/1.1 a head over 1 MiB or with more than 256 fields gets 400 and
//! the connection is closed; on HTTP/2 a header list over [`H2_MAX_HEADER_LIST_SIZE`] gets 431
//! and the stream is reset.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use async_trait::async_trait;
use pingora::{
    apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream, ServerApp},
    http::RequestHeader,
    protocols::{
        http::{v2::server::default_h2_options, ServerSession},
        raw_connect::ProxyDigest,
        tls::{SslDigest, TlsRef},
        GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
        TimingDigest, UniqueID, UniqueIDType, ALPN,
    },
    server::{configuration::ServerConf, ShutdownWatch},
    services::listening::Service,
};
use serde::Deserialize;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

use crate::{service::ImpersonationProxy, status::Failure, streams::Routes};

/// The largest request head the proxy serves: the request target plus, for every header field,
/// its name, its value and 32 bytes (HTTP/2's accounting, RFC 9113 §6.5.2, used for HTTP/1.1
/// too). Envoy's default (60 KiB) is of the same order; kube-apiserver's clients send a few KiB,
/// most of it a bearer token.
pub const MAX_REQUEST_HEAD_BYTES: usize = 64 * 1024;

/// The most header fields a request may carry (Envoy's default). kubectl sends about ten.
pub const MAX_REQUEST_HEADERS: usize = 100;

/// HTTP/2's `SETTINGS_MAX_HEADER_LIST_SIZE`: above [`MAX_REQUEST_HEAD_BYTES`], so that the proxy
/// itself answers heads between the two with a `metav1.Status` body, and small enough to bound
/// what one stream's headers can hold in memory.
pub const H2_MAX_HEADER_LIST_SIZE: u32 = 256 * 1024;

/// The answer to a request head over the limits.
pub const REQUEST_HEAD_TOO_LARGE: Failure = Failure {
    code: 431,
    reason: "RequestHeaderFieldsTooLarge",
    message: "the request's header fields are too large",
    retry_after: None,
};

/// How long a client connection may take to send a request head, and may stay idle between
/// requests (the `timeouts` section of the static configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Timeouts {
    /// The longest a client may take to send a complete request head (default 10 s).
    #[serde(deserialize_with = "crate::duration::deserialize_positive_duration")]
    pub header_read: Duration,
    /// The longest a keep-alive (HTTP/1.1) or HTTP/2 connection may stay open with no request
    /// in flight (default 90 s, as kube-apiserver).
    #[serde(deserialize_with = "crate::duration::deserialize_positive_duration")]
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(90),
        }
    }
}

/// TCP keepalive on every connection of the proxy, accepted or to kube-apiserver, as Go's
/// servers and clients (kube-apiserver, kubectl) set it: probes after 15 s of silence, every
/// 15 s, the connection dropped after 9 unanswered (about 2.5 minutes). An exec, attach or
/// port-forward tunnel has no read timeout (it may be quiet for hours), so without this a peer
/// that vanished without a FIN (a laptop closed, a network cut, a load balancer that forgot the
/// flow) would hold the tunnel, its upstream connection and their memory for good.
pub fn tcp_keepalive() -> pingora::protocols::TcpKeepalive {
    pingora::protocols::TcpKeepalive {
        idle: Duration::from_secs(15),
        interval: Duration::from_secs(15),
        count: 9,
        // The system default.
        #[cfg(target_os = "linux")]
        user_timeout: Duration::ZERO,
    }
}

/// Why a request head is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestHeadError {
    /// The head carries more than [`MAX_REQUEST_HEADERS`] fields.
    #[error("the request has {0} header fields, more than {MAX_REQUEST_HEADERS}")]
    TooManyFields(usize),
    /// The head is larger than [`MAX_REQUEST_HEAD_BYTES`].
    #[error("the request head is at least {0} bytes, more than {MAX_REQUEST_HEAD_BYTES}")]
    TooLarge(usize),
}

/// Checks a parsed request head against [`MAX_REQUEST_HEADERS`] and [`MAX_REQUEST_HEAD_BYTES`].
/// Stops counting at the first limit crossed.
pub fn check_request_head(head: &RequestHeader) -> Result<(), RequestHeadError> {
    let fields = head.headers.len();
    if fields > MAX_REQUEST_HEADERS {
        return Err(RequestHeadError::TooManyFields(fields));
    }
    let mut bytes = head
        .uri
        .path_and_query()
        .map_or(0, |target| target.as_str().len())
        + head
            .uri
            .authority()
            .map_or(0, |authority| authority.as_str().len());
    for (name, value) in &head.headers {
        bytes += name.as_str().len() + value.len() + 32;
        if bytes > MAX_REQUEST_HEAD_BYTES {
            return Err(RequestHeadError::TooLarge(bytes));
        }
    }
    Ok(())
}

/// To be called as soon as a request head has been parsed (the first hook of the service): ends
/// the connection's head deadline, so the request runs with none, and lifts pingora's per-read
/// timeout on the request body (60 s) for upgrades, whose "body" is the client's side of an exec,
/// attach or port-forward session and may be quiet for hours. Does nothing to streams that are not
/// [`TimedStream`]s (HTTP/2 streams, tests).
pub fn request_head_read(session: &mut ServerSession) {
    if let Some(stream) = session
        .stream()
        .and_then(|stream| stream.as_any().downcast_ref::<TimedStream>())
    {
        stream.clock.enter(REQUEST);
    }
    if session.is_upgrade_req() {
        session.set_read_timeout(None);
    }
}

/// Builds the listening service: `proxy` (pingora's request loop, with long-lived HTTP/2
/// responses taken out of it: [`crate::streams`]) behind [`DownstreamApp`], with the HTTP/2 idle
/// timeout and header-list limit set. Add listeners to the result as to any pingora service.
pub fn service(
    conf: &Arc<ServerConf>,
    proxy: ImpersonationProxy,
    name: &str,
    timeouts: Timeouts,
) -> Service<DownstreamApp<Routes>> {
    let mut app = pingora::proxy::http_proxy(conf, proxy.clone());
    let mut options = HttpServerOptions::default();
    options.h2_idle_timeout = Some(timeouts.idle);
    app.server_options = Some(options);
    let mut h2 = default_h2_options();
    h2.max_header_list_size(H2_MAX_HEADER_LIST_SIZE);
    app.h2_options = Some(h2);
    Service::new(
        name.to_string(),
        DownstreamApp::new(Routes::new(conf, app, proxy), timeouts),
    )
}

/// A pingora [`ServerApp`] that runs an HTTP application (pingora's proxy) on [`TimedStream`]s.
/// HTTP/2 connections go to the application as they would without this wrapper; HTTP/1.x
/// connections are served by the same keep-alive loop as pingora's, with the clock moved to
/// "idle" between requests.
pub struct DownstreamApp<A> {
    app: Arc<A>,
    timeouts: Timeouts,
}

impl<A> DownstreamApp<A> {
    /// Serves `app` with `timeouts`.
    pub fn new(app: A, timeouts: Timeouts) -> Self {
        Self {
            app: Arc::new(app),
            timeouts,
        }
    }
}

#[async_trait]
impl<A> ServerApp for DownstreamApp<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let h2 = matches!(stream.selected_alpn_proto(), Some(ALPN::H2));
        let clock = Arc::new(Clock::default());
        let stream: Stream = Box::new(TimedStream::new(stream, clock.clone(), self.timeouts, h2));
        if h2 {
            return ServerApp::process_new(&self.app, stream, shutdown).await;
        }
        let mut session = ServerSession::new_http1(stream);
        // Keep-alive with no pingora timeout: the stream's clock bounds the wait for the next
        // request. A server shutting down serves this request and closes.
        session.set_keepalive(if *shutdown.borrow() { None } else { Some(0) });
        // Requests written back to back (RFC 9112 §9.3.2 pipelining) are answered one after the
        // other; without this pingora drops the connection when the next request's bytes arrive
        // with the previous one. The setting carries over to the connection's later sessions.
        session.set_pipelining_enabled(true);
        let mut reused = self.app.process_new_http(session, shutdown).await;
        while let Some((stream, settings)) = reused.map(ReusedHttpStream::consume) {
            clock.enter(IDLE);
            let mut session = ServerSession::new_http1(stream);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
            reused = self.app.process_new_http(session, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.app.http_cleanup().await;
    }
}

/// How long a connection whose client certificate stopped counting stays open for the answer
/// that says so.
pub const REVOKED_CLOSE_AFTER: Duration = Duration::from_secs(1);

/// Reading a request head.
const HEAD: u32 = 0;
/// A request is being served: no deadline.
const REQUEST: u32 = 1;
/// Between requests on a keep-alive connection.
const IDLE: u32 = 2;
/// The client certificate stopped counting: the connection ends.
const CLOSING: u32 = 3;

/// A connection's phase (the low two bits) and how many times it changed (the rest), so that a
/// deadline belongs to one stretch of one phase: the second idle period of a connection does not
/// inherit the first one's deadline.
#[derive(Debug, Default)]
struct Clock(AtomicU32);

impl Clock {
    /// Starts a new stretch of `phase`, unless the connection is closing: that phase is final.
    fn enter(&self, phase: u32) {
        let _unchanged_when_closing = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
            (state & 3 != CLOSING).then(|| ((state >> 2).wrapping_add(1) << 2) | phase)
        });
    }

    /// The current stretch: its phase is `state & 3`.
    fn state(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
}

/// HTTP/2's client connection preface (RFC 9113 §3.4) is this long.
const H2_PREFACE_LEN: usize = 24;

/// A client connection whose reads follow the head / request / idle clock described in the
/// [module documentation](self). Everything else is the wrapped stream's.
#[derive(Debug)]
pub struct TimedStream {
    inner: Stream,
    clock: Arc<Clock>,
    timeouts: Timeouts,
    /// The deadline of the [`Clock::state`] it was started for.
    timer: Option<(u32, Pin<Box<Sleep>>)>,
    /// Bytes of the HTTP/2 connection preface still to come; the head phase ends when it is
    /// complete. Zero for HTTP/1.x.
    preface_left: usize,
    /// The TLS digest, whose extension holds the connection's client certificate (if any), to
    /// see whether it was revoked.
    tls: Option<Arc<SslDigest>>,
}

impl TimedStream {
    fn new(inner: Stream, clock: Arc<Clock>, timeouts: Timeouts, h2: bool) -> Self {
        let tls = inner.get_ssl_digest();
        Self {
            inner,
            clock,
            timeouts,
            timer: None,
            preface_left: if h2 { H2_PREFACE_LEN } else { 0 },
            tls,
        }
    }

    /// Whether the connection's client certificate was revoked.
    fn revoked(tls: Option<&Arc<SslDigest>>) -> bool {
        tls.and_then(|tls| tls.extension.get::<crate::tls::PeerCertificate>())
            .is_some_and(crate::tls::PeerCertificate::is_revoked)
    }
}

fn timed_out(phase: u32, limit: Duration) -> io::Error {
    let what = match phase {
        IDLE => "no request started on the idle connection",
        CLOSING => "the client certificate no longer counts; the connection was closed",
        _ => "the request head was not complete",
    };
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} within {limit:?}"))
}

impl AsyncRead for TimedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let Self {
            inner,
            clock,
            timeouts,
            timer,
            preface_left,
            tls,
        } = self.get_mut();
        let mut state = clock.state();
        if state & 3 != CLOSING && TimedStream::revoked(tls.as_ref()) {
            clock.enter(CLOSING);
            state = clock.state();
        }
        let current = state & 3;
        let limit = match current {
            HEAD => timeouts.header_read,
            IDLE => timeouts.idle,
            CLOSING => REVOKED_CLOSE_AFTER,
            _ => {
                *timer = None;
                return Pin::new(inner).poll_read(cx, buf);
            }
        };
        if timer
            .as_ref()
            .is_none_or(|(started_for, _)| *started_for != state)
        {
            *timer = None;
        }
        let (_, deadline) = timer.get_or_insert_with(|| (state, Box::pin(tokio::time::sleep(limit))));
        if Instant::now() >= deadline.deadline() {
            return Poll::Ready(Err(timed_out(current, limit)));
        }
        let before = buf.filled().len();
        match Pin::new(inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    if current == IDLE {
                        // The next request has started: its head gets the full head deadline.
                        clock.enter(HEAD);
                    }
                    if *preface_left > 0 {
                        *preface_left = preface_left.saturating_sub(read);
                        if *preface_left == 0 {
                            clock.enter(REQUEST);
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(timed_out(current, limit))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for TimedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for TimedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl UniqueID for TimedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for TimedStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for TimedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for TimedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for TimedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for TimedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests;
