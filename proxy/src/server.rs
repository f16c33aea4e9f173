//! The proxy process on pingora: the listener with its TLS settings and its connection limit
//! ([`crate::admission`]), the operations port, the shutdown signals and the lifecycle (ready,
//! draining, exit). `selkie-concierge` builds a [`ProxyServer`] and runs it; nothing outside this
//! crate touches pingora.
//!
//! SIGTERM makes `/readyz` answer 503 at once, keeps serving for `shutdown.gracePeriodSeconds`,
//! then closes the listeners and lets the requests in flight finish for up to
//! `shutdown.drainTimeoutSeconds`; the process exits 0 as soon as none is left (or when the drain
//! timeout cuts the rest). SIGINT stops at once.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use async_trait::async_trait;
use pingora::{
    listeners::{tls::TlsSettings, TcpSocketOptions},
    server::{
        configuration::ServerConf, ExecutionPhase, RunArgs, Server, ShutdownSignal, ShutdownSignalWatch,
    },
};
use prometheus_client::registry::Registry;
use selkie_kube::serving::ServingCert;
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::broadcast::{
        self,
        error::{RecvError, TryRecvError},
    },
};

use crate::{
    admission::ConnectionLimit,
    config::{ShutdownConfig, StaticConfig},
    downstream::Timeouts,
    metrics::Metrics,
    operations::{Health, Operations},
    service::ImpersonationProxy,
    snapshot::Snapshot,
    tls::{IdentityCallback, PossessionVerifier},
};

/// How often a draining process checks whether requests are still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// How long an exiting process waits for its queued audit lines to reach stdout.
const AUDIT_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the server could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// An address cannot be listened on; `field` names it in the configuration.
    #[error("{field}: cannot listen on {address}: {source}")]
    Bind {
        /// `listen` or `operationsListen`.
        field: &'static str,
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// pingora's server or TLS settings could not be built.
    #[error("{0}")]
    Pingora(String),
    /// A thread of the process could not be started.
    #[error("starting the {0} thread: {1}")]
    Thread(&'static str, std::io::Error),
}

/// Fails with an error naming the field if the proxy's or the operations address cannot be
/// bound now, or if they overlap (both are held at once). pingora binds only once the server
/// runs, and a bind failure there panics inside the service's task and leaves the process running
/// without that listener; checking first turns a taken port into an exit with a reason.
pub fn ensure_bindable(listen: SocketAddr, operations: Option<SocketAddr>) -> Result<(), ServerError> {
    let bind = |field, address| {
        std::net::TcpListener::bind(address).map_err(|source| ServerError::Bind {
            field,
            address,
            source,
        })
    };
    let _proxy = bind("listen", listen)?;
    if let Some(address) = operations {
        bind("operationsListen", address)?;
    }
    Ok(())
}

/// The proxy's pingora server, set up and not yet running.
pub struct ProxyServer {
    server: Server,
    health: Arc<Health>,
    metrics: Metrics,
    shutdown: ShutdownConfig,
}

impl ProxyServer {
    /// Sets up the listener of `config` (TLS with `serving`'s certificate, client certificates
    /// judged against `snapshot`), the operations port when configured (serving `health` and
    /// `registry`), and the lifecycle thread. Nothing listens before [`ProxyServer::run`].
    pub fn new(
        config: &StaticConfig,
        snapshot: Arc<arc_swap::ArcSwap<Snapshot>>,
        serving: Arc<ServingCert>,
        health: Arc<Health>,
        metrics: Metrics,
        registry: Registry,
    ) -> Result<Self, ServerError> {
        let listen = config
            .listen_address()
            .map_err(|e| ServerError::Pingora(e.to_string()))?;
        let operations = config
            .operations_address()
            .map_err(|e| ServerError::Pingora(e.to_string()))?;
        let shutdown = config.shutdown.clone();
        let mut server = Server::new_with_opt_and_conf(None, server_conf(&shutdown)?);
        server.bootstrap();
        let timeouts: Timeouts = config.timeouts;
        let mut proxy = crate::downstream::service(
            &server.configuration,
            ImpersonationProxy::new(snapshot.clone(), metrics.clone()),
            "selkie impersonation proxy",
            timeouts,
        );
        let mut tls = TlsSettings::with_callbacks(Box::new(IdentityCallback::new(snapshot)))
            .map_err(|e| ServerError::Pingora(format!("configuring TLS: {e}")))?;
        tls.set_cert_resolver(serving);
        tls.set_client_cert_verifier(Arc::new(PossessionVerifier::new()));
        tls.enable_h2();
        let mut socket = TcpSocketOptions::default();
        socket.tcp_keepalive = Some(crate::downstream::tcp_keepalive());
        proxy.add_tls_with_settings(&listen.to_string(), Some(socket), tls);
        // Each connection takes a place before its TLS handshake and keeps it until it closes.
        let limit = Arc::new(ConnectionLimit::new(config.listener_limits, &metrics));
        proxy.set_connection_filter(limit.clone());
        proxy.endpoints().set_pre_tls_callback(limit);
        server.add_service(proxy);
        if let Some(address) = operations {
            let operations = Operations::new(health.clone(), Arc::new(registry));
            server.add_service(operations.service(&address.to_string()));
        }
        let phases = server.watch_execution_phase();
        {
            let (health, metrics) = (health.clone(), metrics.clone());
            std::thread::Builder::new()
                .name("lifecycle".into())
                .spawn(move || follow_lifecycle(phases, health, metrics))
                .map_err(|e| ServerError::Thread("lifecycle", e))?;
        }
        Ok(Self {
            server,
            health,
            metrics,
            shutdown,
        })
    }

    /// Serves until a signal ends the process (see the module documentation); the queued audit
    /// lines are flushed before it returns.
    pub fn run(self) {
        self.server.run(RunArgs {
            shutdown_signal: Box::new(ShutdownSignals {
                health: self.health,
                metrics: self.metrics,
                shutdown: self.shutdown,
            }),
        });
        crate::audit::flush(AUDIT_FLUSH_TIMEOUT);
    }
}

/// pingora's default server settings with the drain timeout of `shutdown`.
fn server_conf(shutdown: &ShutdownConfig) -> Result<ServerConf, ServerError> {
    let mut conf = ServerConf::new()
        .ok_or_else(|| ServerError::Pingora("building pingora's default server configuration".into()))?;
    // Once the listeners have closed, pingora waits this long before it stops its runtimes
    // (which cuts what still runs) ...
    conf.grace_period_seconds = Some(shutdown.drain_timeout_seconds);
    // ... and then at most this long for them to stop.
    conf.graceful_shutdown_timeout_seconds = Some(1);
    Ok(conf)
}

/// The signals pingora's server stops on. SIGTERM: `/readyz` turns 503, the proxy keeps serving
/// for the grace period, then pingora's graceful shutdown closes the listeners and drains.
/// SIGINT: stop at once, also during the grace period.
struct ShutdownSignals {
    health: Arc<Health>,
    metrics: Metrics,
    shutdown: ShutdownConfig,
}

fn handle(kind: SignalKind, name: &str) -> Option<Signal> {
    signal(kind)
        .inspect_err(|error| tracing::error!(%error, "cannot handle {name}; it keeps its default action"))
        .ok()
}

/// The next delivery of `signal`; never, if it could not be handled.
async fn next(signal: &mut Option<Signal>) {
    if let Some(signal) = signal {
        if signal.recv().await.is_some() {
            return;
        }
    }
    std::future::pending().await
}

#[async_trait]
impl ShutdownSignalWatch for ShutdownSignals {
    async fn recv(&self) -> ShutdownSignal {
        let mut terminate = handle(SignalKind::terminate(), "SIGTERM");
        let mut interrupt = handle(SignalKind::interrupt(), "SIGINT");
        tokio::select! {
            () = next(&mut terminate) => {}
            () = next(&mut interrupt) => {
                tracing::info!("SIGINT: stopping now");
                return ShutdownSignal::FastShutdown;
            }
        }
        self.health.shutting_down();
        tracing::info!(
            grace_period_seconds = self.shutdown.grace_period_seconds,
            "SIGTERM: /readyz answers 503; serving on for the grace period"
        );
        tokio::select! {
            () = tokio::time::sleep(self.shutdown.grace_period()) => {}
            () = next(&mut interrupt) => {
                tracing::info!("SIGINT: stopping now");
                return ShutdownSignal::FastShutdown;
            }
        }
        tracing::info!(
            in_flight = self.metrics.in_flight(),
            drain_timeout_seconds = self.shutdown.drain_timeout_seconds,
            "closing the listeners; draining the requests in flight"
        );
        ShutdownSignal::GracefulTerminate
    }
}

/// Follows pingora's execution phases (on a thread of its own): marks the process ready once the
/// server runs, not ready once it stops, and, once the listeners have closed, exits 0 as soon as
/// no request is in flight, where pingora would wait out the whole drain timeout.
fn follow_lifecycle(mut phases: broadcast::Receiver<ExecutionPhase>, health: Arc<Health>, metrics: Metrics) {
    loop {
        match phases.blocking_recv() {
            Ok(ExecutionPhase::Running) => {
                health.serving();
                tracing::info!("ready");
            }
            Ok(ExecutionPhase::ShutdownStarted) => health.shutting_down(),
            Ok(ExecutionPhase::ShutdownGracePeriod) => {
                if drained(&mut phases, &metrics) {
                    tracing::info!("every request in flight has finished; exiting");
                    crate::audit::flush(AUDIT_FLUSH_TIMEOUT);
                    std::process::exit(0);
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

/// Waits until no request has been in flight for two polls in a row (true), or until pingora
/// stops its runtimes because the drain timeout is over (false).
fn drained(phases: &mut broadcast::Receiver<ExecutionPhase>, metrics: &Metrics) -> bool {
    let mut idle_polls = 0;
    loop {
        match phases.try_recv() {
            Ok(ExecutionPhase::ShutdownRuntimes) => {
                tracing::warn!(
                    in_flight = metrics.in_flight(),
                    "the drain timeout is over; cutting the requests still in flight"
                );
                return false;
            }
            Err(TryRecvError::Closed) => return false,
            _ => {}
        }
        if metrics.in_flight() == 0 {
            idle_polls += 1;
            if idle_polls == 2 {
                return true;
            }
        } else {
            idle_polls = 0;
        }
        std::thread::sleep(DRAIN_POLL);
    }
}
