//! `selkie-concierge`: runs the impersonation proxy from a static configuration file
//! (`--config FILE`, see `conf/proxy.example.yaml`). The file, the serving certificate and the
//! upstream token file are watched: a valid change is swapped in without a restart, an invalid one
//! is logged and the running configuration stays. SIGTERM drains and stops (pingora's graceful
//! shutdown).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use clap::Parser;
use pingora::{listeners::tls::TlsSettings, server::Server};
use selkie_proxy::{
    config::StaticConfig,
    service::ImpersonationProxy,
    snapshot::{Snapshot, UpstreamCredential},
    tls::{IdentityCallback, PossessionVerifier, ServingCert},
};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "selkie-concierge", version, about)]
struct Args {
    /// The static proxy configuration (YAML).
    #[arg(long, env = "SELKIE_CONFIG")]
    config: PathBuf,
    /// How often the configuration, certificate and token files are checked for changes.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    watch_interval: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 2s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" | "" => Ok(Duration::from_secs(number)),
        _ => Err(format!("{text:?} is not a duration such as 2s or 500ms")),
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The files a configuration depends on: the file itself and the serving certificate and key.
fn watched_files(path: &Path, config: &StaticConfig) -> [PathBuf; 3] {
    [
        path.to_path_buf(),
        config.serving_certificate.cert_file.clone(),
        config.serving_certificate.key_file.clone(),
    ]
}

/// Polls the files the running configuration depends on and, when one changes, rebuilds and swaps
/// in what is valid. Nothing is parsed while nothing changes, and a broken change is reported
/// once, not at every poll.
fn watch(
    path: PathBuf,
    interval: Duration,
    initial: &StaticConfig,
    snapshot: Arc<ArcSwap<Snapshot>>,
    serving: Arc<ServingCert>,
) {
    let mut files = watched_files(&path, initial);
    let mut seen = files.each_ref().map(|file| modified(file));
    loop {
        std::thread::sleep(interval);
        if let UpstreamCredential::TokenFile(token) = &snapshot.load().upstream.credential {
            if let Err(error) = token.refresh() {
                tracing::warn!(%error, "the upstream token file could not be re-read; keeping the previous token");
            }
        }
        let now = files.each_ref().map(|file| modified(file));
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
        match config.snapshot() {
            Ok(next) => {
                snapshot.store(Arc::new(next));
                tracing::info!(config = %path.display(), "configuration reloaded");
            }
            Err(error) => {
                tracing::warn!(%error, "the changed configuration is invalid; keeping the running one");
                continue;
            }
        }
        match config.serving_certificate.serving_key() {
            Ok(cert) => serving.replace(cert),
            Err(error) => tracing::warn!(%error, "the serving certificate could not be reloaded"),
        }
        // The certificate may have moved: watch the files the new configuration names.
        files = watched_files(&path, &config);
        seen = files.each_ref().map(|file| modified(file));
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
    let snapshot = Arc::new(ArcSwap::from_pointee(config.snapshot()?));
    let serving = Arc::new(ServingCert::new(config.serving_certificate.serving_key()?));

    let mut server = Server::new(None).context("creating the pingora server")?;
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        ImpersonationProxy::new(snapshot.clone()),
        "selkie impersonation proxy",
    );
    let mut tls = TlsSettings::with_callbacks(Box::new(IdentityCallback::new(snapshot.clone())))
        .context("configuring TLS")?;
    tls.set_cert_resolver(serving.clone());
    tls.set_client_cert_verifier(Arc::new(PossessionVerifier::new()));
    tls.enable_h2();
    proxy.add_tls_with_settings(&listen.to_string(), None, tls);
    server.add_service(proxy);

    let interval = args.watch_interval;
    let config_path = args.config.clone();
    std::thread::Builder::new()
        .name("config-watch".into())
        .spawn(move || watch(config_path, interval, &config, snapshot, serving))
        .context("starting the configuration watcher")?;

    tracing::info!(%listen, "selkie-concierge listening");
    server.run_forever()
}
