//! `selkie-supervisor --config FILE`: the Supervisor process. It starts leader election, the
//! controller (FederationDomains, identity providers, keys, certificates), the session garbage
//! collector and the listeners, and stops on SIGTERM or SIGINT after draining connections.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use clap::Parser;
use selkie_kube::{aggregated::server as aggregated, leader, serving::ServingCert};
use selkie_supervisor::{
    self as server, sweep_sessions, Audit, ClientController, Clients, Controller, Endpoints, Issuers,
    Metrics, Outputs, PasswordThrottle, SecretRequestRoutes, Store, SupervisorConfig, Sweep,
    SECRET_REQUEST_VERSION,
};
use tokio::sync::watch;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-supervisor", version, about)]
struct Args {
    /// The Supervisor's configuration file (YAML).
    #[arg(long)]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading the configuration {}", args.config.display()))?;
    let config = SupervisorConfig::parse(&text)?;
    let client = selkie_kube::client::connect(config.kubeconfig.as_deref()).await?;

    let issuers = Arc::new(ArcSwap::from_pointee(Issuers::default()));
    let serving = Arc::new(ServingCert::disabled());
    let store = Store::new(kube::Api::namespaced(client.clone(), &config.namespace));
    let metrics = Arc::new(Metrics::new());
    let clients = Arc::new(ArcSwap::from_pointee(Clients::default()));
    let endpoints = Arc::new(Endpoints {
        clients: clients.clone(),
        issuers: issuers.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        audit: Audit::new(&config.audit)?,
        passwords: PasswordThrottle::new(),
        device_polls: Default::default(),
        dpop_proofs: Default::default(),
        readiness: Default::default(),
    });
    let limits = config.listener_limits()?;
    let https = server::bind(config.listen.https).await?;
    let http = match config.listen.http {
        Some(addr) => Some(server::bind(addr).await?),
        None => None,
    };
    let metrics_listener = match config.listen.metrics {
        Some(addr) => Some(server::bind(addr).await?),
        None => None,
    };
    let aggregated_listener = match config.listen.aggregated_api {
        Some(addr) => Some(server::bind(addr).await?),
        None => None,
    };
    tracing::info!(
        namespace = %config.namespace,
        https = %config.listen.https,
        http = ?config.listen.http,
        metrics = ?config.listen.metrics,
        aggregated_api = ?config.listen.aggregated_api,
        max_connections = limits.max_connections,
        idle_timeout = ?limits.idle_timeout,
        "Supervisor starting"
    );

    let (leader_sender, leader_receiver) = watch::channel(false);
    let lease = leader::LeaseConfig {
        namespace: config.namespace.clone(),
        name: format!("{}-leader-election", config.name_prefix),
        identity: config.identity(),
    };
    let controller = Controller::new(
        client.clone(),
        config.clone(),
        Outputs {
            issuers: issuers.clone(),
            serving: serving.clone(),
        },
        leader_receiver.clone(),
    )?;
    let client_controller = ClientController::new(
        client.clone(),
        &config.namespace,
        &config.api_group_suffix,
        clients,
        leader_receiver.clone(),
    )?;
    let (stop_sender, stop) = watch::channel(false);
    let stopped = |mut stop: watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    };

    let mut tasks = tokio::task::JoinSet::new();
    let leader_client = client.clone();
    tasks.spawn(async move {
        leader::run(leader_client, &lease, leader_sender).await;
        anyhow::Ok(())
    });
    tasks.spawn(async move { Ok(controller.run().await?) });
    tasks.spawn(async move {
        client_controller.run().await;
        anyhow::Ok(())
    });
    {
        let (store, leader, issuers, metrics) = (
            store.clone(),
            leader_receiver.clone(),
            issuers.clone(),
            metrics.clone(),
        );
        let interval = config.garbage_collection_interval()?;
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if !*leader.borrow() {
                    continue;
                }
                let issuers = issuers.load_full();
                let started = Instant::now();
                let swept = sweep_sessions(&store, &issuers, time::OffsetDateTime::now_utc()).await;
                metrics.sweep_finished(started.elapsed(), swept.is_ok());
                match swept {
                    Ok(sweep) if sweep == Sweep::default() => {}
                    Ok(sweep) => {
                        metrics.sweep(&sweep);
                        tracing::info!(
                            deleted = sweep.deleted,
                            revoked = sweep.revoked,
                            retrying = sweep.retrying,
                            failed = sweep.failed,
                            "session garbage collection"
                        )
                    }
                    Err(error) => tracing::warn!(%error, "listing expired sessions failed"),
                }
            }
        });
    }
    // The listeners drain on stop; the other tasks run until aborted.
    let mut listeners = tokio::task::JoinSet::new();
    listeners.spawn(
        server::serve_https(https, serving, endpoints.clone(), limits, stopped(stop.clone())).map_ok_anyhow(),
    );
    if let Some(http) = http {
        let endpoints = endpoints.clone();
        let stop = stop.clone();
        listeners.spawn(async move {
            server::serve_http(http, endpoints, limits, stopped(stop)).await;
            anyhow::Ok(())
        });
    }

    if let Some(listener) = aggregated_listener {
        let routes = Arc::new(SecretRequestRoutes::new(
            client.clone(),
            &config.namespace,
            &config.api_group_suffix,
        )?);
        let names = aggregated::Names::new(
            &config.name_prefix,
            &config.namespace,
            SECRET_REQUEST_VERSION,
            &[routes.group()],
        );
        let (client, leader, stop) = (client.clone(), leader_receiver.clone(), stop.clone());
        listeners.spawn(async move {
            let handler = move |request, caller, ready| {
                let routes = routes.clone();
                async move { routes.handle(request, caller, ready).await }
            };
            aggregated::serve_on(listener, client, names, leader, stopped(stop), handler).await?;
            anyhow::Ok(())
        });
    }

    if let Some(listener) = metrics_listener {
        let stop = stop.clone();
        listeners.spawn(async move {
            server::serve_metrics(listener, metrics, stopped(stop)).await;
            anyhow::Ok(())
        });
    }

    // SIGTERM (Kubernetes stopping the pod): unready at once, serving on for the grace period
    // while endpoints and load balancers stop sending connections here, then the listeners
    // close and drain. SIGINT: the listeners close and drain at once, also during the grace
    // period.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let graceful = tokio::select! {
        _ = terminate.recv() => true,
        _ = tokio::signal::ctrl_c() => false,
        Some(ended) = tasks.join_next() => return Err(unexpected(ended)),
        Some(ended) = listeners.join_next() => return Err(unexpected(ended)),
    };
    if graceful {
        endpoints.readiness.stop();
        let grace = config.shutdown.grace_period();
        // A force-deleted pod's token died with the pod: nothing could be served in a grace
        // period (every login and refresh needs kube-apiserver), while the listeners closing at
        // once lets clients and load balancers retry on another replica.
        if !grace.is_zero()
            && selkie_kube::client::credentials_rejected(&client, Duration::from_secs(2)).await
        {
            tracing::warn!("SIGTERM, and kube-apiserver no longer accepts this Supervisor's credentials (its pod was force-deleted?): skipping the grace period");
        } else {
            tracing::info!(
                grace_period_seconds = config.shutdown.grace_period_seconds,
                "SIGTERM: /healthz answers 503; serving on for the grace period"
            );
            tokio::select! {
                () = tokio::time::sleep(grace) => {}
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: ending the grace period"),
                Some(ended) = tasks.join_next() => return Err(unexpected(ended)),
                Some(ended) = listeners.join_next() => return Err(unexpected(ended)),
            }
        }
    }
    tracing::info!(
        drain_timeout_seconds = config.shutdown.drain_timeout_seconds,
        "closing the listeners; draining open connections"
    );
    let _ = stop_sender.send(true);
    // Open connections finish (each listener gives up on them after the drain timeout).
    let drained = tokio::time::timeout(limits.drain_timeout + Duration::from_secs(1), async {
        while listeners.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("the listeners did not stop in time");
    }
    tasks.shutdown().await;
    Ok(())
}

/// The error of a task that ended before the Supervisor was asked to stop (every task runs
/// until then).
fn unexpected(ended: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Error {
    let error = match ended {
        Ok(Ok(())) => anyhow::anyhow!("a task ended"),
        Ok(Err(error)) => error,
        Err(error) => anyhow::anyhow!(error),
    };
    error.context("the Supervisor stopped")
}

/// `Result<(), ServerError>` → `anyhow::Result<()>` for the task set.
trait MapOkAnyhow {
    fn map_ok_anyhow(self) -> impl std::future::Future<Output = anyhow::Result<()>> + Send;
}

impl<F> MapOkAnyhow for F
where
    F: std::future::Future<Output = Result<(), server::ServerError>> + Send,
{
    async fn map_ok_anyhow(self) -> anyhow::Result<()> {
        Ok(self.await?)
    }
}
