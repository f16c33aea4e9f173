//! The control plane inside `selkie-concierge` (`--control-plane FILE`): it runs on a tokio
//! runtime of its own thread beside pingora's, and everything it publishes is turned into the
//! proxy's snapshot (authenticators, trusted client CAs, the login API) and serving certificate
//! (or none, which makes the proxy refuse handshakes while the CredentialIssuer disables it).
//!
//! Started here: leader election (one replica writes; all serve), the signers, the authenticator
//! reconcilers, the CredentialIssuer controller and the aggregated API server. A component that
//! ends with an error is logged and the process exits non-zero, so Kubernetes restarts it rather
//! than leaving a replica that silently stopped reconciling.

use std::{path::Path, sync::Arc};

use anyhow::Context as _;
use kube::Client;
use selkie_control_plane::{
    aggregated_api, authenticators,
    config::ControlPlaneConfig,
    credential_issuer,
    login_authorization::KubeLoginAuthorizer,
    published::{Published, Publisher},
    signing,
};
use selkie_filters::issuing::login_api::ConciergeApi;
use selkie_kube::{leader, serving::ServingCert};
use selkie_proxy::{config::Extension, operations::Health};
use tokio::sync::watch;

use selkie_proxy::composer::Composer;

/// A loaded control-plane configuration and the publisher its components will share.
pub(crate) struct ControlPlane {
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
}

impl ControlPlane {
    /// Reads and validates the control-plane configuration file.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let config = ControlPlaneConfig::load(path)?;
        let publisher = match config.client_certificate_lifetime {
            Some(lifetime) => Publisher::with_certificate_lifetime(lifetime),
            None => Publisher::new(),
        };
        Ok(Self {
            config: Arc::new(config),
            publisher,
        })
    }

    /// What the proxy starts with before anything is published: no authenticators or CAs yet,
    /// and the control plane's login API (which refuses logins until a signer is read).
    pub(crate) fn initial_extension(&self) -> Extension {
        extension(&self.config, &self.publisher, &self.publisher.current())
    }

    /// Starts the control plane on a thread of its own. Fails if its runtime cannot be built or
    /// kube-apiserver's client cannot be configured; later failures end the process.
    /// `health` is held not ready until the login API has a signer (a replica that cannot issue
    /// credentials should not get traffic).
    pub(crate) fn start(
        self,
        composer: Arc<Composer>,
        serving: Arc<ServingCert>,
        health: Arc<Health>,
    ) -> anyhow::Result<()> {
        health.hold();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("control-plane")
            .enable_all()
            .build()
            .context("building the control plane's runtime")?;
        std::thread::Builder::new()
            .name("control-plane".into())
            .spawn(move || {
                if let Err(error) = runtime.block_on(self.run(composer, serving, health)) {
                    tracing::error!(error = format!("{error:#}"), "the control plane stopped");
                    std::process::exit(1);
                }
            })
            .context("starting the control plane's thread")?;
        Ok(())
    }

    async fn run(
        self,
        composer: Arc<Composer>,
        serving: Arc<ServingCert>,
        health: Arc<Health>,
    ) -> anyhow::Result<()> {
        let Self { config, publisher } = self;
        let client = client(&config).await?;
        publisher
            .login_api()
            .set_login_authorizer(Box::new(KubeLoginAuthorizer::new(client.clone())));
        let (leader_sender, leader) = watch::channel(false);
        tracing::info!(
            namespace = %config.namespace,
            identity = %config.identity,
            api_group_suffix = %config.api_group_suffix,
            "control plane starting"
        );

        let mut tasks = tokio::task::JoinSet::new();
        {
            let (client, config) = (client.clone(), config.clone());
            tasks.spawn(async move {
                leader::run(client, &config.lease(), leader_sender).await;
                anyhow::Ok(())
            });
        }
        {
            let (client, config, publisher, leader) =
                (client.clone(), config.clone(), publisher.clone(), leader.clone());
            tasks.spawn(async move {
                let writer = {
                    let (client, config) = (client.clone(), config.clone());
                    move |strategy| {
                        let (client, config) = (client.clone(), config.clone());
                        async move {
                            credential_issuer::set_strategy(&client, &config, strategy)
                                .await
                                .map_err(|e| e.to_string())
                        }
                    }
                };
                signing::run(client, config, publisher, leader, writer).await;
                anyhow::Ok(())
            });
        }
        {
            let (client, config, publisher, leader) =
                (client.clone(), config.clone(), publisher.clone(), leader.clone());
            tasks.spawn(async move {
                authenticators::run(client, config, publisher, leader)
                    .await
                    .context("the authenticator reconcilers")
            });
        }
        {
            let (client, config, publisher, leader) =
                (client.clone(), config.clone(), publisher.clone(), leader.clone());
            tasks.spawn(async move {
                credential_issuer::run(client, config, publisher, leader)
                    .await
                    .context("the CredentialIssuer controller")
            });
        }
        {
            let (client, config, publisher, leader) =
                (client.clone(), config.clone(), publisher.clone(), leader.clone());
            tasks.spawn(async move {
                aggregated_api::serve(client, config, publisher, leader, std::future::pending::<()>())
                    .await
                    .context("the aggregated API server")
            });
        }
        tasks.spawn(bridge(config.clone(), publisher, composer, serving, health));

        match tasks.join_next().await {
            Some(Ok(Ok(()))) | None => anyhow::bail!("a control-plane component ended"),
            Some(Ok(Err(error))) => Err(error),
            Some(Err(error)) => Err(anyhow::anyhow!("a control-plane component panicked: {error}")),
        }
    }
}

/// kube-apiserver's client: the configured kubeconfig, else the in-cluster service account or
/// `$KUBECONFIG`.
async fn client(config: &ControlPlaneConfig) -> anyhow::Result<Client> {
    Ok(selkie_kube::client::connect(config.kubeconfig.as_deref()).await?)
}

/// The proxy's share of a published value.
fn extension(config: &ControlPlaneConfig, publisher: &Publisher, published: &Published) -> Extension {
    Extension {
        chain: published.chain.clone(),
        client_ca_pems: published.client_ca_pems.clone(),
        concierge_api: Some(publisher.login_api().clone() as Arc<dyn ConciergeApi>),
        api_group_suffix: Some(config.api_group_suffix.clone()),
    }
}

/// Turns every published value into the proxy's snapshot and serving certificate, until the
/// publisher is gone.
async fn bridge(
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    composer: Arc<Composer>,
    serving: Arc<ServingCert>,
    health: Arc<Health>,
) -> anyhow::Result<()> {
    let mut receiver = publisher.subscribe();
    loop {
        let published = receiver.borrow_and_update().clone();
        // The signer is installed before the CAs it brings are published, so this value is the
        // first that can be served with it; and a replica that has not evaluated the
        // authenticators the cluster already has would refuse their users' logins.
        if publisher.login_api().signer().is_some() && published.authenticators_loaded {
            health.release();
        }
        if let Err(error) = composer.extension_changed(extension(&config, &publisher, &published)) {
            tracing::warn!(%error, "what the control plane published cannot be used; the proxy keeps its configuration");
        }
        match &published.proxy_serving {
            Some(pair) => match ServingCert::load(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()) {
                Ok(cert) => {
                    if !serving.is_enabled() {
                        tracing::info!("the impersonation proxy is serving");
                    }
                    serving.replace(cert);
                }
                Err(error) => tracing::warn!(%error, "the published serving certificate is unusable"),
            },
            None => {
                if serving.is_enabled() {
                    tracing::info!("the impersonation proxy stops accepting connections");
                }
                serving.disable();
            }
        }
        if receiver.changed().await.is_err() {
            return Ok(());
        }
    }
}
