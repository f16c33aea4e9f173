//! `selkie-concierge`: runs the impersonation proxy from a static configuration file
//! (`--config FILE`, see `conf/proxy.example.yaml`), and with `--control-plane FILE` the
//! Concierge's control plane in the same process (see [`control_plane`]): authenticators from
//! JWTAuthenticator / WebhookAuthenticator resources, the proxy's certificate and mode from the
//! CredentialIssuer, and the aggregated TokenCredentialRequest / WhoAmIRequest API. The file, the
//! serving certificate and the upstream token file are watched: a valid change is swapped in
//! without a restart, an invalid one is logged and the running configuration stays.
//!
//! The proxy's chain is the file's authenticators, then the control plane's, then kube-apiserver's
//! own TokenReview sent with the proxy's upstream credential (`upstream.tokenReview`, on unless
//! the file turns it off; the install manifests leave it on and grant `system:auth-delegator`), so
//! in-cluster clients with service-account tokens use the proxy as they use Pinniped's: their
//! tokens pass through to kube-apiserver unchanged.
//!
//! With `operationsListen` set, `/healthz`, `/readyz` and `/metrics` are served there. SIGTERM
//! makes `/readyz` answer 503 at once, keeps serving for `shutdown.gracePeriodSeconds`, then
//! closes the listeners and lets the requests in flight finish for up to
//! `shutdown.drainTimeoutSeconds`; the process exits 0 as soon as none is left (or when the drain
//! timeout cuts the rest). SIGINT stops at once.

mod control_plane;

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use selkie_kube::serving::ServingCert;
use selkie_proxy::{
    composer::Composer,
    config::{Extension, StaticConfig},
    metrics::Metrics,
    operations::Health,
    server::{ensure_bindable, ProxyServer},
};

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

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(Health::new());
    let server = ProxyServer::new(
        &config,
        composer.snapshot().clone(),
        serving.clone(),
        health.clone(),
        metrics,
        registry,
    )?;

    let interval = args.watch_interval;
    let config_path = args.config.clone();
    {
        let composer = composer.clone();
        let serving = control_plane.is_none().then(|| serving.clone());
        std::thread::Builder::new()
            .name("config-watch".into())
            .spawn(move || selkie_proxy::composer::watch(config_path, interval, composer, serving))
            .context("starting the configuration watcher")?;
    }
    if let Some(control_plane) = control_plane {
        control_plane.start(composer, serving, health)?;
    }

    tracing::info!(%listen, operations = ?operations, "selkie-concierge listening");
    server.run();
    tracing::info!("selkie-concierge stopped");
    Ok(())
}
