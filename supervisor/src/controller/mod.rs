//! The Supervisor's controller: typed reconcilers, one per kind, on the machinery both servers
//! share ([`selkie_kube::reconcile`]: each object reconciled on its own task, per-object backoff,
//! an error policy, the one status writer), publishing what the endpoints read — the [`Issuers`]
//! snapshot and the serving certificates — and nothing else:
//!
//! * [`oidc`], [`directory`] (LDAP and Active Directory, one reconciler over both kinds),
//!   [`github`] and [`saml`] (Selkie's own kind): each identity provider's conditions (Pinniped's
//!   types, reasons and messages where Pinniped has the kind) and, when they hold, the upstream
//!   logins use, kept in [`upstreams`];
//! * [`federation_domains`]: each FederationDomain's generated keys ([`keys`]), conditions
//!   ([`federation_domain`]) and issuer, published in the snapshot with the certificates by host;
//! * the default TLS certificate, from the Secret the configuration names.
//!
//! Every replica reconciles and serves; only the leader writes (statuses, generated keys), and
//! becoming the leader reconciles everything again. What objects read — Secrets and ConfigMaps of
//! the namespace ([`sources`]) — is watched, and a change re-reconciles the objects that name it.
//! A server that does not answer (an OIDC issuer, a directory, GitHub) holds up only its own
//! object, is retried with backoff, and its last working form keeps serving meanwhile: an
//! identity provider whose configuration changes to something invalid keeps serving its last
//! valid form until the new one works (Pinniped's behaviour for an invalid update is to stop; a
//! login in progress should not break because someone mistyped a Secret name).

mod directory;
pub(crate) mod federation_domain;
mod federation_domains;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod github;
mod identity_provider;
pub(crate) mod keys;
pub(crate) mod kind;
mod oidc;
pub(crate) mod saml;
pub(crate) mod sources;
#[cfg(test)]
mod tests;
mod upstreams;

use std::sync::Arc;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    api::ApiResource,
    runtime::{reflector, watcher},
    Api, Client,
};
use selkie_api::{
    supervisor_config::FederationDomain,
    supervisor_idp::{
        ActiveDirectoryIdentityProvider, GitHubIdentityProvider, LDAPIdentityProvider, OIDCIdentityProvider,
    },
    supervisor_saml::SAMLIdentityProvider,
};
use selkie_kube::{
    reconcile::{self, PendingSources, SourceEvent, SourceKind},
    serving::ServingCert,
    tls_spec::CaSources as _,
};
use tokio::sync::watch;

use crate::config::SupervisorConfig;
use crate::controller::directory::DirectoryProvider;
use crate::controller::federation_domains::FederationDomainReconciler;
use crate::controller::github::GitHubProvider;
use crate::controller::identity_provider::IdentityProviderReconciler;
use crate::controller::kind::Kind;
use crate::controller::oidc::OidcProvider;
use crate::controller::saml::SamlProvider;
use crate::controller::sources::{tls_pair, Sources};
use crate::controller::upstreams::Upstreams;
use crate::issuer::Issuers;

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The API group suffix cannot be used.
    #[error("{0}")]
    Resources(String),
    /// The configuration cannot be used.
    #[error("{0}")]
    Config(String),
    /// A watch ended (it never does while kube-apiserver exists).
    #[error("the watch of {0} ended")]
    WatchEnded(&'static str),
}

/// What the controller serves into.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The issuers table every request reads.
    pub issuers: Arc<ArcSwap<Issuers>>,
    /// The listener's certificates.
    pub serving: Arc<ServingCert>,
}

/// The controller. See the module documentation.
pub struct Controller {
    client: Client,
    config: SupervisorConfig,
    outputs: Outputs,
    leader: watch::Receiver<bool>,
    resources: Resources,
    rotation_interval: Option<std::time::Duration>,
}

/// The API resources of the kinds, under the installation's group suffix.
struct Resources {
    federation_domain: ApiResource,
    oidc: ApiResource,
    ldap: ApiResource,
    active_directory: ApiResource,
    github: ApiResource,
    /// Selkie's own kind: its group has no suffix.
    saml: ApiResource,
}

impl Controller {
    /// A controller for `config`'s namespace, writing while `leader` is true.
    pub fn new(
        client: Client,
        config: SupervisorConfig,
        outputs: Outputs,
        leader: watch::Receiver<bool>,
    ) -> Result<Self, ControllerError> {
        let suffix = &config.api_group_suffix;
        let resource = |result: Result<ApiResource, selkie_api::crds::CrdError>| {
            result.map_err(|e| ControllerError::Resources(e.to_string()))
        };
        let resources = Resources {
            federation_domain: resource(
                selkie_api::crds::api_resource_with_group_suffix::<FederationDomain>(suffix),
            )?,
            oidc: resource(selkie_api::crds::api_resource_with_group_suffix::<
                OIDCIdentityProvider,
            >(suffix))?,
            ldap: resource(selkie_api::crds::api_resource_with_group_suffix::<
                LDAPIdentityProvider,
            >(suffix))?,
            active_directory: resource(selkie_api::crds::api_resource_with_group_suffix::<
                ActiveDirectoryIdentityProvider,
            >(suffix))?,
            github: resource(selkie_api::crds::api_resource_with_group_suffix::<
                GitHubIdentityProvider,
            >(suffix))?,
            saml: ApiResource::erase::<SAMLIdentityProvider>(&()),
        };
        let rotation_interval = config
            .signing_key_rotation_interval()
            .map_err(|e| ControllerError::Config(e.to_string()))?;
        Ok(Self {
            client,
            config,
            outputs,
            leader,
            resources,
            rotation_interval,
        })
    }

    /// Runs until a watch ends (kube's watchers retry with backoff, so in practice until the
    /// process stops).
    pub async fn run(self) -> Result<(), ControllerError> {
        let Self {
            client,
            config,
            outputs,
            leader,
            resources,
            rotation_interval,
        } = self;
        let namespace = config.namespace.clone();
        let (secrets, secrets_writer) = reflector::store::<Secret>();
        let (config_maps, config_maps_writer) = reflector::store::<ConfigMap>();
        let sources = Sources {
            namespace: namespace.clone(),
            secrets,
            config_maps,
        };
        let fd_pending = Arc::new(PendingSources::default());
        let upstreams = Arc::new(Upstreams::new(fd_pending.clone()));
        let kind = |resource: &ApiResource| Kind::new(resource.clone(), &client, &namespace, leader.clone());

        let (oidc_kind, oidc_writer) = kind(&resources.oidc);
        let (ldap_kind, ldap_writer) = kind(&resources.ldap);
        let (ad_kind, ad_writer) = kind(&resources.active_directory);
        let (github_kind, github_writer) = kind(&resources.github);
        let (saml_kind, saml_writer) = kind(&resources.saml);
        let (fd_kind, fd_writer) = kind(&resources.federation_domain);
        let identity_providers = vec![
            (oidc::KIND, oidc_kind.store.clone()),
            ("LDAPIdentityProvider", ldap_kind.store.clone()),
            ("ActiveDirectoryIdentityProvider", ad_kind.store.clone()),
            (github::KIND, github_kind.store.clone()),
            (saml::KIND, saml_kind.store.clone()),
        ];
        let oidc = Arc::new(IdentityProviderReconciler::new(
            oidc_kind,
            OidcProvider,
            sources.clone(),
            upstreams.clone(),
        ));
        let ldap = Arc::new(IdentityProviderReconciler::new(
            ldap_kind,
            DirectoryProvider::<LDAPIdentityProvider>::default(),
            sources.clone(),
            upstreams.clone(),
        ));
        let active_directory = Arc::new(IdentityProviderReconciler::new(
            ad_kind,
            DirectoryProvider::<ActiveDirectoryIdentityProvider>::default(),
            sources.clone(),
            upstreams.clone(),
        ));
        let github = Arc::new(IdentityProviderReconciler::new(
            github_kind,
            GitHubProvider,
            sources.clone(),
            upstreams.clone(),
        ));
        let saml = Arc::new(IdentityProviderReconciler::new(
            saml_kind,
            SamlProvider,
            sources.clone(),
            upstreams.clone(),
        ));
        let federation_domains = Arc::new(FederationDomainReconciler::new(
            fd_kind,
            client.clone(),
            sources.clone(),
            upstreams,
            identity_providers,
            fd_pending.clone(),
            outputs.clone(),
            rotation_interval,
            config.group("idp.supervisor.pinniped.dev"),
        ));

        let pending = || Arc::new(PendingSources::default());
        let (oidc_pending, ldap_pending, ad_pending, github_pending, saml_pending, certificate_pending) =
            (pending(), pending(), pending(), pending(), pending(), pending());
        let idp_senders = vec![
            oidc_pending.clone(),
            ldap_pending.clone(),
            ad_pending.clone(),
            github_pending.clone(),
            saml_pending.clone(),
        ];
        let mut secret_senders = idp_senders.clone();
        secret_senders.extend([fd_pending.clone(), certificate_pending.clone()]);
        // Not the sessions: they are many, change with every login, and nothing here reads them.
        let secrets_config =
            watcher::Config::default().labels(&format!("!{}", crate::session::storage::TYPE_LABEL));
        let default_certificate = default_certificate(
            sources.clone(),
            config.default_tls_certificate_secret.clone(),
            certificate_pending,
            outputs.serving.clone(),
        );

        tokio::select! {
            () = reconcile::watch_sources(
                Api::<Secret>::namespaced(client.clone(), &namespace),
                secrets_config,
                secrets_writer,
                SourceKind::Secret,
                secret_senders,
            ) => Err(ControllerError::WatchEnded("Secret")),
            () = reconcile::watch_sources(
                Api::<ConfigMap>::namespaced(client.clone(), &namespace),
                watcher::Config::default(),
                config_maps_writer,
                SourceKind::ConfigMap,
                idp_senders,
            ) => Err(ControllerError::WatchEnded("ConfigMap")),
            () = reconcile::run(oidc.clone(), oidc.kind.api.clone(), oidc.kind.resource.clone(), oidc_writer, oidc_pending, leader.clone())
                => Err(ControllerError::WatchEnded(oidc::KIND)),
            () = reconcile::run(ldap.clone(), ldap.kind.api.clone(), ldap.kind.resource.clone(), ldap_writer, ldap_pending, leader.clone())
                => Err(ControllerError::WatchEnded("LDAPIdentityProvider")),
            () = reconcile::run(active_directory.clone(), active_directory.kind.api.clone(), active_directory.kind.resource.clone(), ad_writer, ad_pending, leader.clone())
                => Err(ControllerError::WatchEnded("ActiveDirectoryIdentityProvider")),
            () = reconcile::run(github.clone(), github.kind.api.clone(), github.kind.resource.clone(), github_writer, github_pending, leader.clone())
                => Err(ControllerError::WatchEnded(github::KIND)),
            () = reconcile::run(saml.clone(), saml.kind.api.clone(), saml.kind.resource.clone(), saml_writer, saml_pending, leader.clone())
                => Err(ControllerError::WatchEnded(saml::KIND)),
            () = reconcile::run(federation_domains.clone(), federation_domains.kind.api.clone(), federation_domains.kind.resource.clone(), fd_writer, fd_pending, leader)
                => Err(ControllerError::WatchEnded(federation_domains::KIND)),
            () = default_certificate => Err(ControllerError::WatchEnded("Secret")),
        }
    }
}

/// Keeps the listener's default certificate equal to the TLS Secret `name` (when configured):
/// loaded again whenever that Secret changes. A Secret that does not load leaves the certificate
/// served before (logged).
async fn default_certificate(
    sources: Sources,
    name: Option<String>,
    pending: Arc<PendingSources>,
    serving: Arc<ServingCert>,
) {
    let Some(name) = name else {
        return std::future::pending().await;
    };
    let mut events = Box::pin(pending.events());
    while let Some(event) = futures::StreamExt::next(&mut events).await {
        let concerned = match &event {
            SourceEvent::All => true,
            SourceEvent::Changed(kind, changed) => *kind == SourceKind::Secret && *changed == name,
        };
        if !concerned {
            continue;
        }
        let Some(secret) = sources.secret(&name) else {
            continue;
        };
        let (cert, key) = tls_pair(&secret);
        if let Err(error) = serving.replace_pem(&cert, &key) {
            tracing::warn!(secret = %name, %error, "the default TLS certificate Secret is unusable");
        }
    }
}
