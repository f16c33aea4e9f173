//! What one client can hold on a listener (issue 27, "Abusive clients"), and the pieces
//! [`super::serve`] enforces it with:
//!
//! * **Connections**: at most [`ListenerLimits::max_connections`] open per listener, counted from
//!   the accept to the connection's end (TLS handshake included). [`Admission::admit`] never waits:
//!   a connection beyond the cap is closed at once by the caller, counted in
//!   `connections_refused_total`, and a warning is logged at most once per
//!   [`REFUSAL_LOG_INTERVAL`] (with the number refused since the last one), so a flood cannot flood
//!   the log. The permit ([`Admitted`]) is released when the connection's task ends, however it
//!   ends (closed, failed, aborted at the end of a drain, or panicked).
//! * **Idleness**: [`InFlight`] counts a connection's requests from the moment hyper hands one to
//!   the service until its response body is dropped (sent, or abandoned with its stream).
//!   [`InFlight::idle_for`] resolves once none has been in flight for
//!   [`ListenerLimits::idle_timeout`], and the listener then closes the connection: HTTP/1.1
//!   between requests, HTTP/2 with no open stream, and a connection that has sent nothing at all
//!   (hyper-util's auto builder waits for the first bytes with no timeout of its own) alike. A
//!   request in flight (a slow upstream identity provider) is never cut by it.
//! * **Request heads**: [`ListenerLimits::header_read_timeout`] (hyper's HTTP/1 header-read
//!   timeout) and [`MAX_HEADER_BYTES`], and for HTTP/2 [`ListenerLimits::max_concurrent_streams`]
//!   and the settings of [`super::connection_builder`].

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokio::{
    sync::{watch, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use crate::server::metrics::{Listener, Metrics};

/// The largest request head accepted, in bytes: HTTP/1's request line and header fields (hyper's
/// read buffer, so a larger head is answered 431 and the connection closed) and HTTP/2's header
/// list (`SETTINGS_MAX_HEADER_LIST_SIZE`, which also bounds the CONTINUATION frames of one header
/// block). The Supervisor's requests carry a few cookies, a basic-auth header and query strings of
/// a few KiB.
pub(crate) const MAX_HEADER_BYTES: usize = 32 * 1024;

/// At most one "connection limit reached" warning per listener this often.
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Bounds on what clients can hold on one listener (the configuration's `listenerLimits`, the
/// same for the HTTPS and the plain-HTTP listener; each counts its own connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerLimits {
    /// At most this many connections open at once; the next is closed at once.
    pub max_connections: usize,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// An HTTP/1.1 request head must be read within this long. hyper starts it when it waits for a
    /// head: once the first bytes have arrived, and again whenever a kept-alive connection goes
    /// idle, so an idle HTTP/1.1 connection is closed after the shorter of this and
    /// [`Self::idle_timeout`].
    pub header_read_timeout: Duration,
    /// HTTP/2 streams (requests) a client may have open at once on one connection
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// Once the listener has closed (shutdown), how long its open connections may finish their
    /// requests before they are dropped (`shutdown.drainTimeoutSeconds`).
    pub drain_timeout: Duration,
}

impl ListenerLimits {
    /// The defaults: 10000 connections, 90 s idle, 10 s for a request head, 100 HTTP/2 streams,
    /// 20 s to drain.
    pub const DEFAULT: Self = Self {
        max_connections: 10_000,
        idle_timeout: Duration::from_secs(90),
        header_read_timeout: Duration::from_secs(10),
        max_concurrent_streams: 100,
        drain_timeout: Duration::from_secs(20),
    };

    /// The metrics listener's (not configurable): a scraper or two, so 64 connections.
    pub(crate) const METRICS: Self = Self {
        max_connections: 64,
        ..Self::DEFAULT
    };
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Admits a listener's connections up to its cap. Owned by the accept loop.
pub(crate) struct Admission {
    listener: Listener,
    limits: ListenerLimits,
    permits: Arc<Semaphore>,
    open: Gauge,
    refused: Counter,
    /// When the last refusal warning was logged.
    last_logged: Option<Instant>,
    /// Refusals since then (the next warning's count).
    unlogged: u64,
}

impl Admission {
    /// Admission to `listener` with `limits`, counting in `metrics`.
    pub(crate) fn new(listener: Listener, limits: ListenerLimits, metrics: &Metrics) -> Self {
        Self {
            listener,
            limits,
            // More than Semaphore::MAX_PERMITS would panic; no process holds that many sockets.
            permits: Arc::new(Semaphore::new(limits.max_connections.min(Semaphore::MAX_PERMITS))),
            open: metrics.connections_open(listener),
            refused: metrics.connections_refused(listener),
            last_logged: None,
            unlogged: 0,
        }
    }

    /// The limits admission was made with.
    pub(crate) fn limits(&self) -> &ListenerLimits {
        &self.limits
    }

    /// The permit for a connection just accepted from `peer`, held until the connection ends;
    /// `None` when `max_connections` are open: the caller closes the connection at once. Never
    /// waits. A refusal is counted, and logged unless one was logged within
    /// [`REFUSAL_LOG_INTERVAL`].
    pub(crate) fn admit(&mut self, peer: SocketAddr) -> Option<Admitted> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.open.inc();
                Some(Admitted {
                    _permit: permit,
                    open: self.open.clone(),
                })
            }
            Err(_) => {
                self.refused.inc();
                self.unlogged = self.unlogged.saturating_add(1);
                let now = Instant::now();
                let recently = self
                    .last_logged
                    .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_INTERVAL);
                if !recently {
                    tracing::warn!(
                        listener = ?self.listener,
                        max_connections = self.limits.max_connections,
                        refused = self.unlogged,
                        %peer,
                        "connection limit reached: closing new connections at once (refused: since the last such warning)"
                    );
                    self.last_logged = Some(now);
                    self.unlogged = 0;
                }
                None
            }
        }
    }
}

/// An admitted connection's place under the cap, given back when dropped.
pub(crate) struct Admitted {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// The requests in flight on one connection (shared by its service and its idle watch).
#[derive(Debug, Clone)]
pub(crate) struct InFlight(Arc<watch::Sender<usize>>);

impl Default for InFlight {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl InFlight {
    /// Counts a request as in flight until the returned guard is dropped.
    pub(crate) fn start(&self) -> RequestGuard {
        self.0.send_modify(|count| *count = count.saturating_add(1));
        RequestGuard(self.0.clone())
    }

    /// Resolves once no request has been in flight for `timeout` (at once counting from now if
    /// none is): the connection is idle. A request starting, or ending, restarts the count.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        let mut changes = self.0.subscribe();
        loop {
            // The sender lives in `self`: neither wait can fail while it is borrowed.
            if changes.wait_for(|count| *count == 0).await.is_err() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(timeout) => return,
                changed = changes.changed() => if changed.is_err() {
                    return;
                },
            }
        }
    }
}

/// One request in flight (see [`InFlight::start`]).
#[derive(Debug)]
pub(crate) struct RequestGuard(Arc<watch::Sender<usize>>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count = count.saturating_sub(1));
    }
}

/// A response body that keeps its request in flight until hyper drops it: after its last frame
/// is written, or when the client goes away.
#[derive(Debug)]
pub(crate) struct Tracked<B> {
    body: B,
    _request: RequestGuard,
}

impl<B> Tracked<B> {
    /// `body`, keeping `request` in flight.
    pub(crate) fn new(body: B, request: RequestGuard) -> Self {
        Self {
            body,
            _request: request,
        }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_request_s_end() {
        const IDLE: Duration = Duration::from_secs(10);
        let in_flight = InFlight::default();
        let started = Instant::now();
        in_flight.idle_for(IDLE).await;
        assert_eq!(started.elapsed(), IDLE);

        // A request longer than the timeout, then the count starts when it ends.
        let request = in_flight.start();
        let ends = tokio::spawn(async move {
            tokio::time::sleep(IDLE * 3).await;
            drop(request);
        });
        let started = Instant::now();
        in_flight.idle_for(IDLE).await;
        assert_eq!(started.elapsed(), IDLE * 4);
        ends.await.unwrap();

        // A short request in the middle of the count restarts it.
        let in_flight_too = in_flight.clone();
        tokio::spawn(async move {
            tokio::time::sleep(IDLE / 2).await;
            let _request = in_flight_too.start();
            tokio::time::sleep(IDLE / 10).await;
        });
        let started = Instant::now();
        in_flight.idle_for(IDLE).await;
        assert_eq!(started.elapsed(), IDLE / 2 + IDLE / 10 + IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn connections_beyond_the_cap_are_refused_until_one_ends() {
        let metrics = Metrics::new();
        let limits = ListenerLimits {
            max_connections: 2,
            ..ListenerLimits::DEFAULT
        };
        let mut admission = Admission::new(Listener::http, limits, &metrics);
        let peer: SocketAddr = "192.0.2.1:1234".parse().unwrap();
        let first = admission.admit(peer).unwrap();
        let _second = admission.admit(peer).unwrap();
        for _ in 0..3 {
            assert!(admission.admit(peer).is_none());
        }
        drop(first);
        let _third = admission.admit(peer).unwrap();
        assert!(admission.admit(peer).is_none());
        let text = metrics.encode();
        for line in [
            "selkie_supervisor_connections_refused_total{listener=\"http\"} 4",
            "selkie_supervisor_connections_open{listener=\"http\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
