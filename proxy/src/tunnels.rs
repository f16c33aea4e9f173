//! Upgraded HTTP/1.1 requests — `kubectl exec`, `attach`, `port-forward` and `cp`, over SPDY/3.1
//! or WebSocket — connected to kube-apiserver and copied by the proxy itself once admitted.
//!
//! pingora's loop connects each upgrade to kube-apiserver with a rustls client configuration it
//! builds again for every connection (a new root store, the private key parsed again, an empty
//! session cache), so no upstream handshake ever resumed a TLS session; after the `101`, it
//! passed every chunk of the tunnel through its body machinery and a channel.
//!
//! pingora's loop still reads the request and runs the first steps through
//! [`ImpersonationProxy`]'s hooks (head checks, authentication and the header policy, the
//! Concierge APIs). An admitted upgrade that [`takes`] accepts is then [`serve`]d here, inside
//! the loop's request filter, to its end; the loop only finishes:
//!
//! 1. the client's connection leaves pingora's session ([`detached_session`] takes its place);
//! 2. [`connect`] opens a connection to kube-apiserver with the [`UpstreamTls`] configuration of
//!    the request's snapshot: built once per upstream credential, so handshakes resume
//!    kube-apiserver's TLS sessions, and a rotated CA or certificate takes effect with the next
//!    snapshot;
//! 3. the request head goes upstream with the identity headers, and the answer's head comes
//!    back ([`read_head`]);
//! 4. an answer other than `101` (kube-apiserver's 403, 404, …) goes to the client whole, with
//!    its body ([`read_answer_body`]), and the connection closes;
//! 5. on `101`, the client's connection leaves its session with any bytes read past the request
//!    head, the `101` head goes to the client as kube-apiserver sent it, and [`pipe`] copies both
//!    ways until both sides have ended: the end of one direction is passed on (a TLS
//!    `close_notify` and a TCP half-close) while the other goes on.
//!
//! Failures are answered and audited as pingora's loop would ([`ImpersonationProxy::fail`],
//! [`ImpersonationProxy::end`]). An upgrade with a body, or one that asks the connection to
//! close, stays in pingora's loop.
//!
//! [`UpstreamTls`]: crate::snapshot::UpstreamTls

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use async_trait::async_trait;
use bytes::{Buf as _, Bytes, BytesMut};
use http::header;
use pingora::{
    http::{RequestHeader, ResponseHeader},
    protocols::{
        http::{v1::client::http_req_header_to_wire, ServerSession},
        raw_connect::ProxyDigest,
        GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, TimingDigest,
        UniqueID, UniqueIDType,
    },
    Error, ErrorType, OrErr as _, Result,
};
use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{client::TlsStream, TlsConnector};

use crate::{
    metrics::UpstreamConnection,
    service::{ImpersonationProxy, RequestContext},
    snapshot::{Upstream, TLS_HANDSHAKE_TIMEOUT},
};

/// The largest response head kube-apiserver may send before the tunnel (or its refusal).
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// The largest body of a refused upgrade (kube-apiserver's answers are a `metav1.Status` of a
/// few hundred bytes).
const MAX_ANSWER_BODY: usize = 1024 * 1024;
/// The copy buffer of each direction: one TLS record's plaintext.
const PIPE_BUFFER: usize = 16 * 1024;

/// Whether [`serve`] takes the request of `session`: an HTTP/1.1 upgrade without a body
/// ([`without_body_or_close`]). pingora's loop serves any other request (HTTP/1.0 knows no
/// upgrades, nor a connection kept without asking).
pub(crate) fn takes(session: &ServerSession) -> bool {
    !session.is_http2()
        && session.req_header().version == http::Version::HTTP_11
        && session.is_upgrade_req()
        && without_body_or_close(session.req_header())
}

/// Whether `request` has no body (no `Transfer-Encoding`, no `Content-Length` other than 0) and
/// does not ask the connection to close.
fn without_body_or_close(request: &RequestHeader) -> bool {
    let headers = &request.headers;
    let no_body = !headers.contains_key(header::TRANSFER_ENCODING)
        && headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .all(|length| length.as_bytes() == b"0");
    let closes = headers.get_all(header::CONNECTION).iter().any(|value| {
        value
            .as_bytes()
            .split(|byte| *byte == b',')
            .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
    });
    no_body && !closes
}

/// Serves the admitted upgrade request of `slot` (one [`takes`] accepted) to its end, as the
/// module documentation describes: its answer (the tunnel, kube-apiserver's refusal, or a
/// failure's `metav1.Status`) and its audit line. The client's connection is taken out of
/// `slot`, where a [`detached_session`] is left for pingora's loop to finish; it closes when the
/// request ends.
pub(crate) async fn serve(service: &ImpersonationProxy, slot: &mut ServerSession, ctx: &mut RequestContext) {
    let mut session = std::mem::replace(slot, detached_session().await);
    // Every answer but the `101` ends the connection.
    session.set_keepalive(None);
    let opened = Box::pin(open(service, &mut session, ctx)).await;
    match opened {
        Ok(Opened::Answered) => {
            service.end(&session, None, ctx);
            let _ = session.finish().await;
        }
        Ok(Opened::Switched(upstream, head)) => {
            let request = session.req_header().clone();
            let (sent, error) = tunnel(service, session, upstream, head, ctx).await;
            // 0 when the connection could not be handed over: no `101` went out.
            let status = sent.map_or(0, |_| 101);
            service.end_of(&request, status, sent.unwrap_or(0), error.as_deref(), ctx);
        }
        Err(error) => {
            Box::pin(service.fail(&mut session, &error, ctx)).await;
            service.end(&session, Some(&error), ctx);
            let _ = session.finish().await;
        }
    }
}

/// What came of an upgrade request before any tunnel.
enum Opened {
    /// The client has its answer: kube-apiserver's refusal.
    Answered,
    /// kube-apiserver switched protocols: its connection and the `101` head.
    Switched(Box<TlsStream<TcpStream>>, Box<Head>),
}

/// The admitted request's steps up to the tunnel: the connection to kube-apiserver
/// ([`connect`]), the request head with the identity headers, and the answer's head; an answer
/// other than `101` is sent on to the client here, with its body.
async fn open(
    service: &ImpersonationProxy,
    session: &mut ServerSession,
    ctx: &mut RequestContext,
) -> Result<Opened> {
    let (upstream, own_credential) = service.upstream(ctx)?;
    let mut stream = connect(&upstream, own_credential).await?;
    let resumed = stream.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    service.connected(
        if resumed {
            UpstreamConnection::Resumed
        } else {
            UpstreamConnection::New
        },
        ctx,
    );
    let mut request = session.req_header().clone();
    service.identify(&mut request, ctx)?;
    let wire = http_req_header_to_wire(&request).ok_or_else(|| {
        Error::explain(
            ErrorType::InvalidHTTPHeader,
            "serializing the upstream request head",
        )
    })?;
    stream
        .write_all(&wire)
        .await
        .or_err(ErrorType::WriteError, "sending the request head upstream")
        .map_err(|error| error.into_up())?;
    stream
        .flush()
        .await
        .or_err(ErrorType::WriteError, "sending the request head upstream")
        .map_err(|error| error.into_up())?;
    let mut head = read_head(&mut stream).await.map_err(|error| error.into_up())?;
    service.answered(head.response.status, ctx)?;
    if head.response.status == http::StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Opened::Switched(Box::new(stream), Box::new(head)));
    }
    let body = read_answer_body(&mut stream, &mut head)
        .await
        .map_err(|error| error.into_up())?;
    let mut response = head.response;
    response.remove_header(&header::TRANSFER_ENCODING);
    response.insert_header(header::CONTENT_LENGTH, body.len())?;
    session.write_response_header(Box::new(response)).await?;
    session.write_response_body(body, true).await?;
    Ok(Opened::Answered)
}

/// What [`serve`] leaves in pingora's loop in place of the session it took: an HTTP/1.1 session
/// on a [`Detached`] connection, with a request already read (a `GET /` that closes), so that
/// the loop can finish it like any other. Nothing written to it goes anywhere.
async fn detached_session() -> ServerSession {
    let mut session = ServerSession::new_http1(Box::new(Detached {
        request: Bytes::from_static(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"),
    }));
    // Reading from the static request cannot fail.
    let _ = session.read_request().await;
    session.set_keepalive(None);
    session
}

/// A connection that reads `request` and then its end, and takes whatever is written to it.
#[derive(Debug)]
struct Detached {
    request: Bytes,
}

impl AsyncRead for Detached {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let taken = self.request.len().min(buf.remaining());
        buf.put_slice(&self.request.split_to(taken));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Detached {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[async_trait]
impl Shutdown for Detached {
    async fn shutdown(&mut self) {}
}

impl UniqueID for Detached {
    fn id(&self) -> UniqueIDType {
        0
    }
}

impl Ssl for Detached {}

impl GetTimingDigest for Detached {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        Vec::new()
    }
}

impl GetProxyDigest for Detached {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        None
    }
}

impl GetSocketDigest for Detached {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        None
    }
}

impl Peek for Detached {}

/// A new TLS connection to kube-apiserver for one tunnel: TCP within the upstream's connect
/// timeout (with the proxy's TCP keep-alive, so a vanished kube-apiserver ends an idle tunnel),
/// then the handshake within [`TLS_HANDSHAKE_TIMEOUT`], verifying kube-apiserver's certificate
/// for the upstream's server name against its CA, with the proxy's client certificate unless
/// `own_credential` is false. Fails with pingora's connect and TLS error types (answered 502).
async fn connect(upstream: &Upstream, own_credential: bool) -> Result<TlsStream<TcpStream>> {
    let tcp = match tokio::time::timeout(upstream.connect_timeout, TcpStream::connect(upstream.address)).await
    {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(error)) => {
            let etype = match error.kind() {
                io::ErrorKind::ConnectionRefused => ErrorType::ConnectRefused,
                io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                    ErrorType::ConnectNoRoute
                }
                _ => ErrorType::ConnectError,
            };
            return Err(Error::because(etype, "connecting to kube-apiserver", error).into_up());
        }
        Err(_) => {
            return Err(Error::explain(ErrorType::ConnectTimedout, "connecting to kube-apiserver").into_up());
        }
    };
    tcp.set_nodelay(true)
        .or_err(ErrorType::ConnectError, "setting TCP_NODELAY")?;
    pingora::protocols::l4::ext::set_tcp_keepalive(&tcp, &crate::downstream::tcp_keepalive())?;
    let name = ServerName::try_from(upstream.sni.clone())
        .or_err(ErrorType::InvalidCert, "kube-apiserver's server name")
        .map_err(|error| error.into_up())?;
    let connector = TlsConnector::from(upstream.tls.config(own_credential).clone());
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) => {
            let etype = match error
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                Some(rustls::Error::InvalidCertificate(_)) => ErrorType::InvalidCert,
                _ => ErrorType::TLSHandshakeFailure,
            };
            Err(Error::because(etype, "the TLS handshake with kube-apiserver", error).into_up())
        }
        Err(_) => Err(Error::explain(
            ErrorType::TLSHandshakeTimedout,
            "the TLS handshake with kube-apiserver",
        )
        .into_up()),
    }
}

/// A response head as kube-apiserver sent it.
struct Head {
    /// The head parsed.
    response: ResponseHeader,
    /// Its bytes, status line to the empty line.
    raw: Bytes,
    /// What was read past it: the start of the body or of the tunnel.
    rest: BytesMut,
}

/// Reads the response head from `stream`, skipping informational answers other than `101`
/// (`100 Continue`). Fails when the connection ends first, the head is malformed, or it exceeds
/// [`MAX_RESPONSE_HEAD`].
async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> Result<Head> {
    let mut buffer = BytesMut::with_capacity(4096);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&buffer) {
            Ok(httparse::Status::Complete(length)) => {
                let code = parsed.code.unwrap_or_default();
                if (100..200).contains(&code) && code != 101 {
                    buffer.advance(length);
                    continue;
                }
                let mut response = ResponseHeader::build(code, Some(parsed.headers.len()))?;
                for field in parsed.headers.iter() {
                    response.append_header(field.name.to_string(), field.value)?;
                }
                let raw = buffer.split_to(length).freeze();
                return Ok(Head {
                    response,
                    raw,
                    rest: buffer,
                });
            }
            Ok(httparse::Status::Partial) if buffer.len() >= MAX_RESPONSE_HEAD => {
                return Error::e_explain(ErrorType::InvalidHTTPHeader, "the response head is too large");
            }
            Ok(httparse::Status::Partial) => {}
            Err(error) => {
                return Error::e_because(ErrorType::InvalidHTTPHeader, "parsing the response head", error);
            }
        }
        let read = stream
            .read_buf(&mut buffer)
            .await
            .or_err(ErrorType::ReadError, "reading the response head")?;
        if read == 0 {
            return Error::e_explain(
                ErrorType::ConnectionClosed,
                "the connection closed before a response head",
            );
        }
    }
}

/// The whole body of an answer that is not `101`, as its head frames it: `chunked`, a
/// `Content-Length`, or up to the end of the connection; none after `204` or `304`. Fails when
/// the connection ends early, the chunks are malformed, or the body exceeds
/// [`MAX_ANSWER_BODY`].
async fn read_answer_body(stream: &mut (impl AsyncRead + Unpin), head: &mut Head) -> Result<Bytes> {
    let headers = &head.response.headers;
    let mut buffer = std::mem::take(&mut head.rest);
    let chunked = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .is_some_and(|coding| {
            coding
                .as_bytes()
                .rsplit(|byte| *byte == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        });
    if chunked {
        return read_chunked(stream, buffer).await;
    }
    let status = head.response.status;
    if status == http::StatusCode::NO_CONTENT || status == http::StatusCode::NOT_MODIFIED {
        return Ok(Bytes::new());
    }
    let length = match headers.get(header::CONTENT_LENGTH) {
        Some(value) => Some(
            std::str::from_utf8(value.as_bytes())
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
                .ok_or_else(|| Error::explain(ErrorType::InvalidHTTPHeader, "a malformed Content-Length"))?,
        ),
        None => None,
    };
    if length.is_some_and(|length| length > MAX_ANSWER_BODY) {
        return Error::e_explain(ErrorType::InvalidHTTPHeader, "the answer's body is too large");
    }
    loop {
        if let Some(length) = length {
            if buffer.len() >= length {
                buffer.truncate(length);
                return Ok(buffer.freeze());
            }
        }
        if buffer.len() > MAX_ANSWER_BODY {
            return Error::e_explain(ErrorType::InvalidHTTPHeader, "the answer's body is too large");
        }
        let read = stream
            .read_buf(&mut buffer)
            .await
            .or_err(ErrorType::ReadError, "reading the answer's body")?;
        if read == 0 {
            return match length {
                Some(_) => Error::e_explain(ErrorType::ConnectionClosed, "the answer's body ended early"),
                None => Ok(buffer.freeze()),
            };
        }
    }
}

/// A `chunked` body whose first bytes are `buffer`, decoded, up to its last chunk (trailers
/// are not read: the connection is not used again).
async fn read_chunked(stream: &mut (impl AsyncRead + Unpin), mut buffer: BytesMut) -> Result<Bytes> {
    let mut body = BytesMut::new();
    loop {
        match httparse::parse_chunk_size(&buffer) {
            Ok(httparse::Status::Complete((start, size))) => {
                let size = usize::try_from(size)
                    .ok()
                    .filter(|size| body.len().saturating_add(*size) <= MAX_ANSWER_BODY)
                    .ok_or_else(|| {
                        Error::explain(ErrorType::InvalidHTTPHeader, "the answer's body is too large")
                    })?;
                if size == 0 {
                    return Ok(body.freeze());
                }
                if buffer.len() >= start + size + 2 {
                    if &buffer[start + size..start + size + 2] != b"\r\n" {
                        return Error::e_explain(ErrorType::InvalidHTTPHeader, "a malformed chunk");
                    }
                    body.extend_from_slice(&buffer[start..start + size]);
                    buffer.advance(start + size + 2);
                    continue;
                }
            }
            Ok(httparse::Status::Partial) if buffer.len() > 1024 => {
                return Error::e_explain(ErrorType::InvalidHTTPHeader, "a malformed chunk size");
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return Error::e_explain(ErrorType::InvalidHTTPHeader, "a malformed chunk size"),
        }
        let read = stream
            .read_buf(&mut buffer)
            .await
            .or_err(ErrorType::ReadError, "reading the answer's body")?;
        if read == 0 {
            return Error::e_explain(ErrorType::ConnectionClosed, "the answer's body ended early");
        }
    }
}

/// The tunnel, from the `101` to its end: takes the client's connection out of pingora's
/// session (with what the client sent past its request head), sends the `101` head and what
/// followed it upstream to the client, the client's early bytes upstream, then [`pipe`]s.
/// Returns the body bytes sent to the client (everything after the `101` head; `None` when the
/// connection could not be handed over and nothing was sent) and the error that ended the
/// tunnel, if any.
async fn tunnel(
    service: &ImpersonationProxy,
    session: ServerSession,
    mut upstream: Box<TlsStream<TcpStream>>,
    head: Box<Head>,
    ctx: &mut RequestContext,
) -> (Option<usize>, Option<Box<Error>>) {
    let ServerSession::H1(mut session) = session else {
        return (
            None,
            Some(Error::explain(
                ErrorType::InternalError,
                "not an HTTP/1.1 connection",
            )),
        );
    };
    // `reuse` hands the connection over only when it may be kept, with the bytes read past the
    // request (it has no body: `takes`) only when pipelining is on.
    session.set_server_keepalive(Some(1));
    session.set_keepalive_reuses_remaining(None);
    session.set_pipelining_enabled(true);
    let (client, early) = match session.reuse().await {
        Ok(Some(reusable)) => reusable.into_parts(),
        Ok(None) => {
            return (
                None,
                Some(Error::explain(
                    ErrorType::InternalError,
                    "the client connection was not handed over",
                )),
            )
        }
        Err(error) => return (None, Some(error.into_down())),
    };
    service.tunnel_opened(ctx);
    let mut client = Counted {
        inner: client,
        written: 0,
    };
    let started = async {
        client.inner.write_all(&head.raw).await?;
        client.write_all(&head.rest).await?;
        client.flush().await?;
        if let Some(early) = &early {
            upstream.write_all(early).await?;
            upstream.flush().await?;
        }
        io::Result::Ok(())
    };
    let result = match started.await {
        Ok(()) => pipe(&mut client, &mut *upstream).await,
        Err(error) => Err(error),
    };
    let error = result
        .err()
        .map(|error| Error::because(ErrorType::ConnectionClosed, "the tunnel broke", error));
    (Some(client.written), error)
}

/// Copies both ways between `client` and `upstream` until kube-apiserver's side has ended and
/// everything it sent has reached the client, whose writing side is then shut down (TLS
/// `close_notify`, then a TCP half-close). The client ending its side first is passed on the same
/// way to kube-apiserver, and the tunnel goes on until kube-apiserver ends too (it ends the
/// session then). A read or write error on either side ends both at once.
async fn pipe(
    client: &mut (impl AsyncRead + AsyncWrite + Unpin),
    upstream: &mut (impl AsyncRead + AsyncWrite + Unpin),
) -> io::Result<()> {
    let mut up = OneWay::new();
    let mut down = OneWay::new();
    std::future::poll_fn(|cx| {
        if !up.done {
            if let Poll::Ready(result) = up.poll_copy(cx, &mut *client, &mut *upstream) {
                result?;
            }
        }
        down.poll_copy(cx, &mut *upstream, &mut *client)
    })
    .await
}

/// One direction of a tunnel: a buffer read from one side and written to the other.
struct OneWay {
    buffer: Box<[u8]>,
    /// What of `buffer` is still to be written: `start..end`.
    start: usize,
    end: usize,
    /// Written since the last flush.
    unflushed: bool,
    /// The reading side has ended.
    read_done: bool,
    /// Everything was written and the writing side shut down.
    done: bool,
}

impl OneWay {
    fn new() -> Self {
        Self {
            buffer: vec![0; PIPE_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            unflushed: false,
            read_done: false,
            done: false,
        }
    }

    /// Copies from `from` to `to` until `from` ends (then `to`'s writing side is shut down and
    /// this is ready) or either fails. Before waiting for more to read, flushes what was
    /// written, so that nothing sits in a TLS buffer while the tunnel is quiet.
    fn poll_copy(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut (impl AsyncRead + Unpin),
        to: &mut (impl AsyncWrite + Unpin),
    ) -> Poll<io::Result<()>> {
        loop {
            while self.start < self.end {
                let written =
                    std::task::ready!(Pin::new(&mut *to).poll_write(cx, &self.buffer[self.start..self.end]))?;
                if written == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += written;
                self.unflushed = true;
            }
            if self.read_done {
                std::task::ready!(Pin::new(&mut *to).poll_flush(cx))?;
                std::task::ready!(Pin::new(&mut *to).poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut self.buffer);
            match Pin::new(&mut *from).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    let filled = read.filled().len();
                    (self.start, self.end) = (0, filled);
                    self.read_done = filled == 0;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {
                    if self.unflushed {
                        std::task::ready!(Pin::new(&mut *to).poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

/// A stream that counts the bytes written to it.
struct Counted<S> {
    inner: S,
    written: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.written += *written;
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
