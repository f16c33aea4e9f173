//! `selkie-concierge`: runs the impersonation proxy from a static configuration file
//! (`--config FILE`, see `conf/proxy.example.yaml`), and with `--control-plane FILE` the
//! Concierge's control plane in the same process (see [`control_plane`]): authenticators from
//! JWTAuthenticator / WebhookAuthenticator resources, the proxy's certificate and mode from the
//! CredentialIssuer, and the aggregated TokenCredentialRequest / WhoAmIRequest API. The file, the
//! serving certificate and the upstream token file are watched: a valid change is swapped in
//! without a restart, an invalid one is logged and the running configuration stays.
//!
//! With `operationsListen` set, `/healthz`, `/readyz` and `/metrics` are served there. SIGTERM
//! makes `/readyz` answer 503 at once, keeps serving for `shutdown.gracePeriodSeconds`, then
//! closes the listeners and lets the requests in flight finish for up to
//! `shutdown.drainTimeoutSeconds`; the process exits 0 as soon as none is left (or when the drain
//! timeout cuts the rest). SIGINT stops at once.

mod control_plane;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use clap::Parser;
use pingora::{
    listeners::tls::TlsSettings,
    server::{
        configuration::ServerConf, ExecutionPhase, RunArgs, Server, ShutdownSignal, ShutdownSignalWatch,
    },
};
use prometheus_client::registry::Registry;
use selkie_proxy::{
    config::{Extension, ShutdownConfig, StaticConfig},
    metrics::Metrics,
    operations::{Health, Operations},
    service::ImpersonationProxy,
    snapshot::{Snapshot, UpstreamCredential},
    tls::{IdentityCallback, PossessionVerifier, ServingCert},
};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::broadcast::{
        self,
        error::{RecvError, TryRecvError},
    },
};

/// How often a draining process checks whether requests are still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-concierge", version, about)]
struct Args {
    /// The static proxy configuration (YAML).
    #[arg(long, env = "SELKIE_CONFIG")]
    config: PathBuf,
    /// Run the control plane too, configured by this file (YAML; `{}` for Pinniped's defaults):
    /// authenticators and the proxy's certificate come from the cluster's custom resources, and
    /// the aggregated TokenCredentialRequest / WhoAmIRequest API is served.
    #[arg(long, env = "SELKIE_CONTROL_PLANE")]
    control_plane: Option<PathBuf>,
    /// How often the configuration, certificate and token files are checked for changes.
    #[arg(long, default_value = "2s", value_parser = selkie_proxy::duration::parse_duration)]
    watch_interval: Duration,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The files a configuration depends on: the file itself and, when the file provides the
/// serving certificate, its certificate and key.
fn watched_files(path: &Path, config: &StaticConfig) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    if let Some(serving) = &config.serving_certificate {
        files.push(serving.cert_file.clone());
        files.push(serving.key_file.clone());
    }
    files
}

/// Builds the proxy's snapshot from its two sources — the static file and, with a control
/// plane, what the control plane publishes — and stores it whenever either changes. Each source
/// keeps its last valid state: a broken file keeps the running configuration, and a control-plane
/// change never re-reads the file's upstream (its connections stay warm).
struct Composer {
    snapshot: Arc<ArcSwap<Snapshot>>,
    state: Mutex<ComposerState>,
}

struct ComposerState {
    config: StaticConfig,
    extension: Extension,
}

impl Composer {
    fn new(config: StaticConfig, extension: Extension) -> anyhow::Result<Self> {
        let snapshot = Arc::new(ArcSwap::from_pointee(config.snapshot_with(&extension, None)?));
        Ok(Self {
            snapshot,
            state: Mutex::new(ComposerState { config, extension }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ComposerState> {
        // A panic while holding the lock cannot leave the state half-written (it is replaced
        // whole), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file changed: rebuild everything from it (a new upstream included). Fails, keeping the
    /// running snapshot, if the new file is invalid.
    fn file_changed(&self, config: StaticConfig) -> Result<(), selkie_proxy::config::ConfigError> {
        let mut state = self.state();
        let next = config.snapshot_with(&state.extension, None)?;
        self.snapshot.store(Arc::new(next));
        state.config = config;
        Ok(())
    }

    /// The control plane published: rebuild with the file as it is and the running upstream.
    fn extension_changed(&self, extension: Extension) -> Result<(), selkie_proxy::config::ConfigError> {
        let mut state = self.state();
        let upstream = self.snapshot.load().upstream.clone();
        let next = state.config.snapshot_with(&extension, Some(upstream))?;
        self.snapshot.store(Arc::new(next));
        state.extension = extension;
        Ok(())
    }
}

/// Polls the files the running configuration depends on and, when one changes, rebuilds and swaps
/// in what is valid. Nothing is parsed while nothing changes, and a broken change is reported
/// once, not at every poll. `serving` is `None` when a control plane provides the certificate.
fn watch(path: PathBuf, interval: Duration, composer: Arc<Composer>, serving: Option<Arc<ServingCert>>) {
    let mut files = watched_files(&path, &composer.state().config);
    let mut seen: Vec<_> = files.iter().map(|file| modified(file)).collect();
    loop {
        std::thread::sleep(interval);
        if let UpstreamCredential::TokenFile(token) = &composer.snapshot.load().upstream.credential {
            if let Err(error) = token.refresh() {
                tracing::warn!(%error, "the upstream token file could not be re-read; keeping the previous token");
            }
        }
        let now: Vec<_> = files.iter().map(|file| modified(file)).collect();
        if now == seen {
            continue;
        }
        seen = now;
        let config = match StaticConfig::load(&path) {
            Ok(config) => config,
            Err(error) => {
                tracing::warn!(%error, "the configuration could not be reloaded; keeping the running one");
                continue;
            }
        };
        let serving_key = serving.as_ref().map(|_| config.serving_key());
        if let Err(error) = composer.file_changed(config.clone()) {
            tracing::warn!(%error, "the changed configuration is invalid; keeping the running one");
            continue;
        }
        tracing::info!(config = %path.display(), "configuration reloaded");
        match (serving.as_ref(), serving_key) {
            (Some(serving), Some(Ok(cert))) => serving.replace(cert),
            (Some(_), Some(Err(error))) => {
                tracing::warn!(%error, "the serving certificate could not be reloaded")
            }
            _ => {}
        }
        // The certificate may have moved: watch the files the new configuration names.
        files = watched_files(&path, &config);
        seen = files.iter().map(|file| modified(file)).collect();
    }
}

/// Fails with an error naming the field if the proxy's or the operations address cannot be
/// bound now, or if they overlap (both are held at once). pingora binds only once the server
/// runs, and a bind failure there panics inside the service's task and leaves the process running
/// without that listener; checking first turns a taken port into an exit with a reason.
fn ensure_bindable(listen: SocketAddr, operations: Option<SocketAddr>) -> anyhow::Result<()> {
    let _proxy =
        std::net::TcpListener::bind(listen).with_context(|| format!("listen: cannot listen on {listen}"))?;
    if let Some(address) = operations {
        std::net::TcpListener::bind(address)
            .with_context(|| format!("operationsListen: cannot listen on {address}"))?;
    }
    Ok(())
}

/// pingora's default server settings with the drain timeout of `shutdown`.
fn server_conf(shutdown: &ShutdownConfig) -> anyhow::Result<ServerConf> {
    let mut conf = ServerConf::new().context("building pingora's default server configuration")?;
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
                    selkie_proxy::audit::flush(AUDIT_FLUSH_TIMEOUT);
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;

    let config = StaticConfig::load(&args.config)?;
    let listen = config.listen_address()?;
    let operations = config.operations_address()?;
    let shutdown = config.shutdown.clone();
    ensure_bindable(listen, operations)?;
    // With a control plane, the proxy serves only once the CredentialIssuer enables it and its
    // certificate exists; the control plane's login API answers TokenCredentialRequests.
    let control_plane = args
        .control_plane
        .as_deref()
        .map(control_plane::ControlPlane::load)
        .transpose()?;
    let (serving, extension) = match &control_plane {
        Some(control_plane) => (
            Arc::new(ServingCert::disabled()),
            control_plane.initial_extension(),
        ),
        None => (
            Arc::new(ServingCert::new(config.serving_key()?)),
            Extension::default(),
        ),
    };
    let composer = Arc::new(Composer::new(config.clone(), extension)?);
    let snapshot = composer.snapshot.clone();

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(Health::new());

    let mut server = Server::new_with_opt_and_conf(None, server_conf(&shutdown)?);
    server.bootstrap();
    let mut proxy = selkie_proxy::downstream::service(
        &server.configuration,
        ImpersonationProxy::new(snapshot.clone(), metrics.clone()),
        "selkie impersonation proxy",
        config.timeouts,
    );
    let mut tls = TlsSettings::with_callbacks(Box::new(IdentityCallback::new(snapshot.clone())))
        .context("configuring TLS")?;
    tls.set_cert_resolver(serving.clone());
    tls.set_client_cert_verifier(Arc::new(PossessionVerifier::new()));
    tls.enable_h2();
    proxy.add_tls_with_settings(&listen.to_string(), None, tls);
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
            .context("starting the lifecycle thread")?;
    }

    let interval = args.watch_interval;
    let config_path = args.config.clone();
    {
        let composer = composer.clone();
        let serving = control_plane.is_none().then(|| serving.clone());
        std::thread::Builder::new()
            .name("config-watch".into())
            .spawn(move || watch(config_path, interval, composer, serving))
            .context("starting the configuration watcher")?;
    }
    if let Some(control_plane) = control_plane {
        control_plane.start(composer, serving, health.clone())?;
    }

    tracing::info!(%listen, operations = ?operations, "selkie-concierge listening");
    server.run(RunArgs {
        shutdown_signal: Box::new(ShutdownSignals {
            health,
            metrics,
            shutdown,
        }),
    });
    selkie_proxy::audit::flush(AUDIT_FLUSH_TIMEOUT);
    tracing::info!("selkie-concierge stopped");
    Ok(())
}

/// How long an exiting process waits for its queued audit lines to reach stdout.
const AUDIT_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
