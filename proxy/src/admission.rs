//! How many client connections the proxy holds at once (the static configuration's
//! `listenerLimits.maxConnections`), counted from the moment pingora accepts a connection, before
//! its TLS handshake, until its socket is closed.
//!
//! pingora accepts every connection and gives each its own task, with no bound on how many there
//! are, and each costs memory while it is open: about 70 KiB for a TLS connection that sends
//! nothing (pingora's 64 KiB read buffer, rustls' state, the HTTP/1.1 session), about 25 KiB for
//! one that never starts TLS (held for pingora's 60 s handshake timeout). A client opening a few
//! thousand connections would otherwise take the process past a 128 MiB memory limit, and with
//! it every user's requests. [`ConnectionLimit`] bounds them, in two of pingora's hooks:
//!
//! * as the listener's [`ConnectionFilter`], called in the accept loop before anything else is
//!   done with a connection, it takes a place for the connection, or — when
//!   [`ListenerLimits::max_connections`] are open — refuses it: pingora closes it at once, with
//!   nothing sent (no TLS alert, no HTTP status) and nothing logged but a debug line;
//! * as its [`PreTlsProcess`], called first thing in the connection's own task, it ties a place
//!   taken by the filter to the connection: an [`Admitted`] guard stored as the L4 stream's
//!   [`Tracer`], which pingora drops with the stream however the connection ends (a failed or
//!   timed-out handshake, either side closing it, a shutdown), giving the place back.
//!
//! Places are interchangeable: the filter counts the places it took for connections not yet
//! tied, and the hook ties one of them. A connection the filter did not see (pingora skips it for
//! a connection without a peer address) takes a place in the hook, or is refused there (pingora
//! then closes it, logging a handshake error). pingora calls the hook for every connection the
//! filter let through unless setting the listener's socket options fails (the proxy sets none);
//! a place taken for such a connection would stay taken.
//!
//! Every refusal is counted in `selkie_proxy_connections_refused_total`, and a warning is logged
//! at most once every [`REFUSAL_LOG_INTERVAL`] (with the number refused since the last one), so a
//! flood cannot flood the log. Connections already open are not affected: a client with an open
//! connection (an HTTP/2 connection with its watches, a kept-alive HTTP/1.1 one) keeps it.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use async_trait::async_trait;
use pingora::{
    listeners::{ConnectionFilter, PreTlsProcess},
    protocols::l4::stream::Stream as L4Stream,
    upstreams::peer::{Tracer, Tracing},
};
use serde::Deserialize;
use tokio::{sync::Semaphore, time::Instant};

use crate::metrics::{Active, Metrics};

/// At most one "connection limit reached" warning this often.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The largest `maxConnections` accepted: far more than one process has file descriptors for.
pub const MAX_CONNECTIONS_CEILING: usize = 1_000_000;

/// What one client can hold on the proxy's listener (the `listenerLimits` section of the static
/// configuration). Read at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ListenerLimits {
    /// Client connections open at once, those still in their TLS handshake included (`1` …
    /// [`MAX_CONNECTIONS_CEILING`]; default 1000, which with about 70 KiB per connection fits the
    /// chart's 128 MiB memory limit beside the proxy's own needs). One more is closed at once.
    #[serde(deserialize_with = "deserialize_max_connections")]
    pub max_connections: usize,
}

impl ListenerLimits {
    /// The defaults: 1000 connections.
    pub const DEFAULT: Self = Self {
        max_connections: 1000,
    };

    /// `max_connections` connections at most, otherwise the defaults. Fails unless it is between
    /// 1 and [`MAX_CONNECTIONS_CEILING`].
    pub fn with_max_connections(max_connections: usize) -> Result<Self, LimitsError> {
        if !(1..=MAX_CONNECTIONS_CEILING).contains(&max_connections) {
            return Err(LimitsError::MaxConnections(max_connections));
        }
        Ok(Self { max_connections })
    }
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why listener limits are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// `maxConnections` is zero (every connection would be refused) or above
    /// [`MAX_CONNECTIONS_CEILING`]: a mistyped value.
    #[error("maxConnections {0}: must be between 1 and {MAX_CONNECTIONS_CEILING}")]
    MaxConnections(usize),
}

fn deserialize_max_connections<'de, D>(deserializer: D) -> Result<usize, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = u64::deserialize(deserializer)?;
    let value = usize::try_from(value).unwrap_or(usize::MAX);
    ListenerLimits::with_max_connections(value)
        .map(|limits| limits.max_connections)
        .map_err(serde::de::Error::custom)
}

/// The places of the listener's connections; see the [module documentation](self). Shared by
/// the listener's filter and pre-TLS hook (one `Arc`).
#[derive(Debug)]
pub struct ConnectionLimit {
    max_connections: usize,
    /// The free places.
    places: Arc<Semaphore>,
    /// Places the filter took for connections not yet tied to one.
    untied: AtomicUsize,
    metrics: Metrics,
    refusals: Mutex<Refusals>,
}

/// Refusals since the last warning, and when that was.
#[derive(Debug, Default)]
struct Refusals {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl ConnectionLimit {
    /// Places for `limits.max_connections` connections, counted in `metrics`.
    pub fn new(limits: ListenerLimits, metrics: &Metrics) -> Self {
        Self {
            max_connections: limits.max_connections,
            // More than Semaphore::MAX_PERMITS would panic; the ceiling is far below it.
            places: Arc::new(Semaphore::new(limits.max_connections.min(Semaphore::MAX_PERMITS))),
            untied: AtomicUsize::new(0),
            metrics: metrics.clone(),
            refusals: Mutex::new(Refusals::default()),
        }
    }

    /// How many places are taken now (by open connections, and for connections accepted but not
    /// yet tied to theirs).
    pub fn open(&self) -> usize {
        self.max_connections
            .saturating_sub(self.places.available_permits())
    }

    /// Takes a place, to be tied to a connection by [`ConnectionLimit::tie`]; `false` (the
    /// refusal counted, and logged unless one was within [`REFUSAL_LOG_INTERVAL`]) when every
    /// place is taken. Never waits.
    pub fn take(&self, peer: Option<&SocketAddr>) -> bool {
        match self.places.try_acquire() {
            Ok(place) => {
                place.forget();
                self.untied.fetch_add(1, Ordering::AcqRel);
                true
            }
            Err(_) => {
                self.refuse(peer);
                false
            }
        }
    }

    /// A place for a connection, held until the returned guard is dropped: one taken by
    /// [`ConnectionLimit::take`], or else a free one; `None` (counted and logged as `take`
    /// does) when there is neither.
    pub fn tie(&self) -> Option<Admitted> {
        let untied = self
            .untied
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if !untied {
            match self.places.try_acquire() {
                Ok(place) => place.forget(),
                Err(_) => {
                    self.refuse(None);
                    return None;
                }
            }
        }
        Some(Admitted {
            _place: Some(Place {
                places: self.places.clone(),
                _open: self.metrics.connection_admitted(),
            }),
        })
    }

    /// Counts and (at most every [`REFUSAL_LOG_INTERVAL`]) logs a refused connection.
    fn refuse(&self, peer: Option<&SocketAddr>) {
        self.metrics.connection_refused();
        let mut refusals = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
        refusals.unlogged = refusals.unlogged.saturating_add(1);
        let now = Instant::now();
        let recently = refusals
            .last_logged
            .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_INTERVAL);
        if !recently {
            tracing::warn!(
                max_connections = self.max_connections,
                refused = refusals.unlogged,
                peer = peer.map(ToString::to_string).unwrap_or_default(),
                "connection limit reached: closing new connections at once (refused: since the last such warning)"
            );
            refusals.last_logged = Some(now);
            refusals.unlogged = 0;
        }
    }
}

#[async_trait]
impl ConnectionFilter for ConnectionLimit {
    /// Takes a place for the connection; refuses it when every place is taken.
    async fn should_accept(&self, peer: Option<&SocketAddr>) -> bool {
        self.take(peer)
    }
}

#[async_trait]
impl PreTlsProcess for ConnectionLimit {
    /// Ties a place to `stream` (given back when it is dropped); an error (pingora closes the
    /// connection) when there is none.
    async fn process(&self, stream: &mut L4Stream) -> pingora::Result<()> {
        match self.tie() {
            Some(admitted) => {
                stream.tracer = Some(Tracer(Box::new(admitted)));
                Ok(())
            }
            None => Err(pingora::Error::explain(
                pingora::ErrorType::Custom("ConnectionLimit"),
                "listenerLimits.maxConnections connections are open",
            )),
        }
    }
}

/// A connection's place under the limit, given back when dropped (with the L4 stream that holds
/// it as its [`Tracer`]). Its clones hold no place.
#[derive(Debug)]
pub struct Admitted {
    _place: Option<Place>,
}

/// A place taken, counted in `connections_open`; given back when dropped.
#[derive(Debug)]
struct Place {
    places: Arc<Semaphore>,
    _open: Active,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.places.add_permits(1);
    }
}

impl Tracing for Admitted {
    fn on_connected(&self) {}

    fn on_disconnected(&self) {}

    fn boxed_clone(&self) -> Box<dyn Tracing> {
        Box::new(Admitted { _place: None })
    }
}

#[cfg(test)]
mod tests;
