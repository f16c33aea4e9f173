//! The Supervisor's controller: it watches FederationDomains, the identity providers (OIDC, LDAP,
//! Active Directory, GitHub), Secrets and ConfigMaps in its
//! namespace and, after every change (and every ten seconds, to retry what
//! failed), computes what to serve as a whole — the issuers table and the serving certificates —
//! and swaps it in. Every replica serves; only the leader writes: the FederationDomains' generated
//! key Secrets and the statuses (phase and Pinniped's conditions).
//!
//! An invalid or unreachable identity provider is left out with a condition saying why; an
//! identity provider whose configuration changes to something invalid keeps serving its last
//! valid form until the new one works (Pinniped's behaviour for an invalid update is to stop; a
//! login in progress should not break because someone mistyped a Secret name).

pub(crate) mod background;
pub(crate) mod federation_domain;
pub(crate) mod keys;

use std::{collections::HashMap, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures::StreamExt as _;
use k8s_openapi::{
    api::core::v1::{ConfigMap, LocalObjectReference, Secret},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
    runtime::{
        reflector::{self, ObjectRef, Store},
        watcher, WatchStreamExt as _,
    },
    Api, Client, ResourceExt as _,
};
use selkie_api::{
    supervisor_config::{FederationDomain, FederationDomainSecrets, FederationDomainStatus},
    supervisor_idp::{
        ActiveDirectoryIdentityProvider, GitHubAllowedAuthOrganizationsPolicy, GitHubIdentityProvider,
        GitHubIdentityProviderStatus, LDAPIdentityProvider, OIDCIdentityProvider, OIDCIdentityProviderStatus,
        Phase, TLSSpec,
    },
};
use selkie_kube::{
    conditions::{self, Check},
    serving::ServingCert,
    tls_spec::{self, CaSources},
};
use selkie_oidc::{
    https::{HttpsClient, TlsOptions},
    rp::{ClientConfig, Provider},
};
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::config::SupervisorConfig;
use crate::controller::background::Background;
use crate::controller::keys::KeySecret;
use crate::idp::github;
use crate::idp::ldap::{self, Directory, DirectoryConfig, Flavor, GroupSearch, UserSearch};
use crate::idp::{GitHubUpstream, LdapUpstream, OidcUpstream, Upstream};
use crate::issuer::{split_issuer, Issuer, Issuers};
use crate::sealed::Sealer;
use crate::session::tokens::TokenKey;

/// How often everything is computed again without a change (to retry discovery and key reads).
const RESYNC: Duration = Duration::from_secs(10);
/// The bound of every connect, bind and search at an LDAP or Active Directory server.
const LDAP_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound of the controller's connection check of a directory (it holds up the sync).
const LDAP_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a failed connection check stands before the directory is probed again.
const LDAP_RETRY: Duration = Duration::from_secs(30);
/// How long after a change the computation waits for more changes.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// The Secret type of an OIDC upstream's client credentials.
pub(crate) const OIDC_CLIENT_SECRET_TYPE: &str = "secrets.pinniped.dev/oidc-client";
/// The type of a GitHubIdentityProvider's client Secret.
pub(crate) const GITHUB_CLIENT_SECRET_TYPE: &str = "secrets.pinniped.dev/github-client";
/// Authorization request parameters an upstream's configuration may not set.
pub(crate) const DISALLOWED_AUTHORIZE_PARAMETERS: [&str; 9] = [
    "response_type",
    "scope",
    "client_id",
    "state",
    "nonce",
    "code_challenge",
    "code_challenge_method",
    "redirect_uri",
    "hd",
];

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

/// A built upstream and what it was built from.
struct BuiltUpstream {
    fingerprint: String,
    upstream: Arc<Upstream>,
}

struct Watched {
    federation_domains: Store<DynamicObject>,
    identity_providers: Store<DynamicObject>,
    /// LDAP, Active Directory and GitHub identity providers.
    other_identity_providers: Vec<(&'static str, Store<DynamicObject>)>,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
}

struct Sources<'a> {
    watched: &'a Watched,
    namespace: &'a str,
}

impl CaSources for Sources<'_> {
    fn secret(&self, name: &str) -> Option<Arc<Secret>> {
        self.watched
            .secrets
            .get(&ObjectRef::new(name).within(self.namespace))
    }

    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
        self.watched
            .config_maps
            .get(&ObjectRef::new(name).within(self.namespace))
    }
}

/// The controller. See the module documentation.
pub struct Controller {
    client: Client,
    config: SupervisorConfig,
    outputs: Outputs,
    leader: watch::Receiver<bool>,
    fd_resource: ApiResource,
    idp_resource: ApiResource,
    /// The other identity-provider kinds: (kind, resource).
    other_idp_resources: Vec<(&'static str, ApiResource)>,
    /// Upstreams built before, by `namespace/name`: reused while their inputs are unchanged, kept
    /// serving while a change does not work yet.
    upstreams: HashMap<String, BuiltUpstream>,
    /// OIDC discoveries of upstreams, by `namespace/name`: run in tasks of their own, a failure
    /// standing for [`RESYNC`] before it is tried again.
    discoveries: Background<Arc<Provider>>,
    /// Writes statuses, only changes.
    statuses: StatusWriter,
    /// How long a signing key signs before it is rotated; `None`: never.
    rotation_interval: Option<Duration>,
    /// The directories of LDAP and Active Directory identity providers, by `kind/namespace/name`,
    /// with what they were made from and their connection and search-base checks: probed again
    /// only when that changes, kept serving while a change does not work yet.
    directories: HashMap<String, BuiltDirectory>,
    /// Connection checks of directories, by `kind/namespace/name`: run in tasks of their own so
    /// a directory that does not answer never holds up a sync. A passing probe gives its checks
    /// and the configuration with the search bases found; a failing one its checks, which stand
    /// for [`LDAP_RETRY`] before it runs again.
    probes: Background<(Vec<Check>, DirectoryConfig), Vec<Check>>,
    /// Wakes the sync loop (a watch event, a finished probe).
    wake: Arc<Notify>,
    /// GitHubIdentityProviders built before, by `kind/namespace/name`: reused while unchanged,
    /// kept serving while a change does not work yet.
    githubs: HashMap<String, (github::GitHub, Arc<Upstream>)>,
    /// GitHub connection probes, by the same key.
    github_probes: Background<()>,
}

/// A directory that passed its checks, and what it was made from.
struct BuiltDirectory {
    fingerprint: String,
    checks: Vec<Check>,
    upstream: Arc<Upstream>,
}

/// An LDAPIdentityProvider's or ActiveDirectoryIdentityProvider's status (the same shape).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct DirectoryStatus {
    phase: Phase,
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// An LDAPIdentityProvider's or ActiveDirectoryIdentityProvider's spec, as one shape.
struct DirectorySpec<'a> {
    flavor: Flavor,
    name: String,
    uid: String,
    generation: i64,
    host: &'a str,
    tls: Option<&'a TLSSpec>,
    bind_secret: String,
    user_search: UserSearch,
    group_search: GroupSearch,
}

impl<'a> DirectorySpec<'a> {
    fn of_ldap(idp: &'a LDAPIdentityProvider) -> Self {
        let spec = &idp.spec;
        Self {
            flavor: Flavor::Ldap,
            name: idp.name_any(),
            uid: idp.metadata.uid.clone().unwrap_or_default(),
            generation: idp.metadata.generation.unwrap_or_default(),
            host: &spec.host,
            tls: spec.tls.as_ref(),
            bind_secret: spec
                .bind
                .as_ref()
                .map(|bind| bind.secret_name.clone())
                .unwrap_or_default(),
            user_search: UserSearch {
                base: spec.user_search.base.clone().unwrap_or_default(),
                filter: spec.user_search.filter.clone().unwrap_or_default(),
                username_attribute: spec.user_search.attributes.username.clone().unwrap_or_default(),
                uid_attribute: spec.user_search.attributes.uid.clone().unwrap_or_default(),
            },
            group_search: GroupSearch {
                base: spec.group_search.base.clone().unwrap_or_default(),
                filter: spec.group_search.filter.clone().unwrap_or_default(),
                user_attribute_for_filter: spec.group_search.user_attribute_for_filter.clone(),
                group_name_attribute: spec
                    .group_search
                    .attributes
                    .group_name
                    .clone()
                    .unwrap_or_default(),
                skip_group_refresh: spec.group_search.skip_group_refresh,
            },
        }
    }

    /// Active Directory's spec with Pinniped's defaults filled in (not the search bases: they
    /// come from the directory).
    fn of_active_directory(idp: &'a ActiveDirectoryIdentityProvider) -> Self {
        let spec = &idp.spec;
        let or = |value: &Option<String>, default: &str| {
            value
                .clone()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        Self {
            flavor: Flavor::ActiveDirectory,
            name: idp.name_any(),
            uid: idp.metadata.uid.clone().unwrap_or_default(),
            generation: idp.metadata.generation.unwrap_or_default(),
            host: &spec.host,
            tls: spec.tls.as_ref(),
            bind_secret: spec
                .bind
                .as_ref()
                .map(|bind| bind.secret_name.clone())
                .unwrap_or_default(),
            user_search: UserSearch {
                base: spec.user_search.base.clone().unwrap_or_default(),
                filter: or(&spec.user_search.filter, ldap::active_directory::USER_FILTER),
                username_attribute: or(
                    &spec.user_search.attributes.username,
                    ldap::active_directory::USERNAME_ATTRIBUTE,
                ),
                uid_attribute: or(
                    &spec.user_search.attributes.uid,
                    ldap::active_directory::UID_ATTRIBUTE,
                ),
            },
            group_search: GroupSearch {
                base: spec.group_search.base.clone().unwrap_or_default(),
                filter: or(&spec.group_search.filter, ldap::active_directory::GROUP_FILTER),
                user_attribute_for_filter: spec.group_search.user_attribute_for_filter.clone(),
                group_name_attribute: spec
                    .group_search
                    .attributes
                    .group_name
                    .clone()
                    .unwrap_or_default(),
                skip_group_refresh: spec.group_search.skip_group_refresh,
            },
        }
    }

    fn kind(&self) -> &'static str {
        match self.flavor {
            Flavor::Ldap => "LDAPIdentityProvider",
            Flavor::ActiveDirectory => "ActiveDirectoryIdentityProvider",
        }
    }
}

impl Controller {
    /// A controller for `config`'s namespace, writing statuses while `leader` is true.
    pub fn new(
        client: Client,
        config: SupervisorConfig,
        outputs: Outputs,
        leader: watch::Receiver<bool>,
    ) -> Result<Self, ControllerError> {
        let resource = |result: Result<ApiResource, selkie_api::crds::CrdError>| {
            result.map_err(|e| ControllerError::Resources(e.to_string()))
        };
        let rotation_interval = config
            .signing_key_rotation_interval()
            .map_err(|e| ControllerError::Config(e.to_string()))?;
        let wake = Arc::new(Notify::new());
        Ok(Self {
            statuses: StatusWriter::new(client.clone(), &config.namespace),
            rotation_interval,
            directories: HashMap::new(),
            githubs: HashMap::new(),
            github_probes: Background::new(wake.clone()),
            discoveries: Background::new(wake.clone()),
            probes: Background::new(wake.clone()),
            wake,
            fd_resource: resource(
                selkie_api::crds::api_resource_with_group_suffix::<FederationDomain>(
                    &config.api_group_suffix,
                ),
            )?,
            idp_resource: resource(selkie_api::crds::api_resource_with_group_suffix::<
                OIDCIdentityProvider,
            >(&config.api_group_suffix))?,
            other_idp_resources: vec![
                (
                    "LDAPIdentityProvider",
                    resource(selkie_api::crds::api_resource_with_group_suffix::<
                        LDAPIdentityProvider,
                    >(&config.api_group_suffix))?,
                ),
                (
                    "ActiveDirectoryIdentityProvider",
                    resource(selkie_api::crds::api_resource_with_group_suffix::<
                        ActiveDirectoryIdentityProvider,
                    >(&config.api_group_suffix))?,
                ),
                (
                    "GitHubIdentityProvider",
                    resource(selkie_api::crds::api_resource_with_group_suffix::<
                        GitHubIdentityProvider,
                    >(&config.api_group_suffix))?,
                ),
            ],
            client,
            config,
            outputs,
            leader,
            upstreams: HashMap::new(),
        })
    }

    /// Runs until a watch ends.
    pub async fn run(mut self) -> Result<(), ControllerError> {
        let namespace = self.config.namespace.clone();
        let changed = self.wake.clone();
        let fd_writer = reflector::store::Writer::new(self.fd_resource.clone());
        let federation_domains = fd_writer.as_reader();
        let idp_writer = reflector::store::Writer::new(self.idp_resource.clone());
        let identity_providers = idp_writer.as_reader();
        let (secrets, secrets_writer) = reflector::store();
        let (config_maps, config_maps_writer) = reflector::store();
        let mut other_follows = Vec::new();
        let mut other_identity_providers = Vec::new();
        for (kind, resource) in &self.other_idp_resources {
            let writer = reflector::store::Writer::new(resource.clone());
            other_identity_providers.push((*kind, writer.as_reader()));
            let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &namespace, resource);
            other_follows.push(follow(
                watcher(api, watcher::Config::default()),
                writer,
                changed.clone(),
            ));
        }
        let watched = Watched {
            federation_domains,
            identity_providers,
            other_identity_providers,
            secrets,
            config_maps,
        };
        let fd_api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &namespace, &self.fd_resource);
        let idp_api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &namespace, &self.idp_resource);
        let secrets_api = Api::<Secret>::namespaced(self.client.clone(), &namespace);
        // Not the sessions: they are many, change with every login, and nothing here reads them.
        let secrets_config =
            watcher::Config::default().labels(&format!("!{}", crate::session::storage::TYPE_LABEL));
        let config_maps_api = Api::<ConfigMap>::namespaced(self.client.clone(), &namespace);
        let watch_all = async {
            tokio::select! {
                () = follow(watcher(fd_api, watcher::Config::default()), fd_writer, changed.clone()) => ControllerError::WatchEnded("FederationDomain"),
                () = follow(watcher(idp_api, watcher::Config::default()), idp_writer, changed.clone()) => ControllerError::WatchEnded("OIDCIdentityProvider"),
                () = follow(watcher(secrets_api, secrets_config), secrets_writer, changed.clone()) => ControllerError::WatchEnded("Secret"),
                () = follow(watcher(config_maps_api, watcher::Config::default()), config_maps_writer, changed.clone()) => ControllerError::WatchEnded("ConfigMap"),
                _ = futures::future::join_all(other_follows) => ControllerError::WatchEnded("an identity provider kind"),
            }
        };
        let mut leader = self.leader.clone();
        let sync_loop = async {
            loop {
                tokio::select! {
                    () = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
                    _ = leader.changed() => {}
                    () = tokio::time::sleep(RESYNC) => {}
                }
                self.sync(&watched).await;
            }
        };
        tokio::select! {
            error = watch_all => Err(error),
            () = sync_loop => Ok(()),
        }
    }

    /// Computes and serves everything once.
    async fn sync(&mut self, watched: &Watched) {
        let namespace = self.config.namespace.clone();
        let leading = *self.leader.borrow();
        let sources = Sources {
            watched,
            namespace: &namespace,
        };

        // Identity providers.
        let mut idps: HashMap<(String, String), Arc<Upstream>> = HashMap::new();
        for object in watched.identity_providers.state() {
            let name = object.name_any();
            let Some(idp) = parse::<OIDCIdentityProvider>(&object) else {
                continue;
            };
            let (checks, upstream) = self.oidc_upstream(&idp, &sources).await;
            if let Some(upstream) = upstream {
                idps.insert(("OIDCIdentityProvider".to_string(), name.clone()), upstream);
            }
            if leading {
                let (phase, conditions) = conditions::with_ready::<Phase>(
                    "OIDCIdentityProvider",
                    &checks,
                    &idp.status.clone().unwrap_or_default().conditions,
                    idp.metadata.generation,
                );
                let status = OIDCIdentityProviderStatus { phase, conditions };
                self.statuses
                    .write(&self.idp_resource, &name, &idp.status, status)
                    .await;
            }
        }

        // Upstreams of deleted OIDCIdentityProviders, and their discoveries, are forgotten.
        let oidc_keys: std::collections::HashSet<String> = watched
            .identity_providers
            .state()
            .iter()
            .map(|object| format!("{namespace}/{}", object.name_any()))
            .collect();
        self.upstreams.retain(|key, _| oidc_keys.contains(key));
        self.discoveries.retain(|key| oidc_keys.contains(key));

        // LDAP and Active Directory identity providers.
        for (kind, store) in &watched.other_identity_providers {
            let Some(resource) = self
                .other_idp_resources
                .iter()
                .find(|(other, _)| other == kind)
                .map(|(_, resource)| resource.clone())
            else {
                continue;
            };
            for object in store.state() {
                let name = object.name_any();
                let (ldap, active_directory);
                let (spec, current) = match *kind {
                    "LDAPIdentityProvider" => {
                        let Some(idp) = parse::<LDAPIdentityProvider>(&object) else {
                            continue;
                        };
                        ldap = idp;
                        let current = ldap.status.as_ref().map(|status| DirectoryStatus {
                            phase: status.phase,
                            conditions: status.conditions.clone(),
                        });
                        (DirectorySpec::of_ldap(&ldap), current)
                    }
                    "ActiveDirectoryIdentityProvider" => {
                        let Some(idp) = parse::<ActiveDirectoryIdentityProvider>(&object) else {
                            continue;
                        };
                        active_directory = idp;
                        let current = active_directory.status.as_ref().map(|status| DirectoryStatus {
                            phase: status.phase,
                            conditions: status.conditions.clone(),
                        });
                        (DirectorySpec::of_active_directory(&active_directory), current)
                    }
                    "GitHubIdentityProvider" => {
                        let Some(idp) = parse::<GitHubIdentityProvider>(&object) else {
                            continue;
                        };
                        let checks = self.github_upstream(&idp, &sources, &mut idps);
                        if leading {
                            let phase = if conditions::had_error(&checks) {
                                Phase::Error
                            } else {
                                Phase::Ready
                            };
                            let current = idp.status.clone();
                            let status = GitHubIdentityProviderStatus {
                                phase,
                                conditions: conditions::merge(
                                    &current.clone().unwrap_or_default().conditions,
                                    &checks,
                                    idp.metadata.generation,
                                    &conditions::now(),
                                ),
                            };
                            self.statuses.write(&resource, &name, &current, status).await;
                        }
                        continue;
                    }
                    _ => continue,
                };
                let (checks, upstream) = self.directory_upstream(&spec, &sources).await;
                if let Some(upstream) = upstream {
                    idps.insert((kind.to_string(), name.clone()), upstream);
                }
                if leading {
                    let (phase, conditions) = conditions::with_ready::<Phase>(
                        kind,
                        &checks,
                        &current.as_ref().map(|c| c.conditions.clone()).unwrap_or_default(),
                        object.metadata.generation,
                    );
                    let status = DirectoryStatus { phase, conditions };
                    self.statuses.write(&resource, &name, &current, status).await;
                }
            }
        }
        // Directories and GitHub upstreams of deleted identity providers, and their probes, are
        // forgotten (their keys are `kind/namespace/name`).
        let other_keys: std::collections::HashSet<String> = watched
            .other_identity_providers
            .iter()
            .flat_map(|(kind, store)| {
                let namespace = &namespace;
                store
                    .state()
                    .into_iter()
                    .map(move |object| format!("{kind}/{namespace}/{}", object.name_any()))
            })
            .collect();
        self.directories.retain(|key, _| other_keys.contains(key));
        self.probes.retain(|key| other_keys.contains(key));
        self.githubs.retain(|key, _| other_keys.contains(key));
        self.github_probes.retain(|key| other_keys.contains(key));

        // FederationDomains.
        let fds: Vec<FederationDomain> = watched
            .federation_domains
            .state()
            .iter()
            .filter_map(|object| parse::<FederationDomain>(object))
            .collect();
        let namespace_view = federation_domain::Namespace {
            existing: watched
                .identity_providers
                .state()
                .iter()
                .map(|object| ("OIDCIdentityProvider".to_string(), object.name_any()))
                .chain(watched.other_identity_providers.iter().flat_map(|(kind, store)| {
                    store
                        .state()
                        .iter()
                        .map(|object| (kind.to_string(), object.name_any()))
                        .collect::<Vec<_>>()
                }))
                .collect(),
            ready: idps.clone(),
            idp_group: self.config.group("idp.supervisor.pinniped.dev"),
        };
        let mut served = Vec::new();
        let mut tls_by_host: HashMap<String, rustls::sign::CertifiedKey> = HashMap::new();
        for fd in &fds {
            let name = fd.name_any();
            let (checks, fd_idps) = federation_domain::check(fd, &fds, &namespace_view);
            let issuer_ok = split_issuer(&fd.spec.issuer);
            if leading {
                self.ensure_keys(fd, watched).await;
            }
            let keys = self.read_keys(fd, watched);
            if let Err(message) = &keys {
                // The leader creates them; until this replica sees them, it does not serve.
                tracing::info!(federation_domain = %name, reason = %message, "not served yet");
            }
            if let (Ok((host, _)), Ok((signing, jwks, token, state)), Some(fd_idps)) =
                (&issuer_ok, keys, fd_idps)
            {
                if let Some(secret_name) = fd.spec.tls.as_ref().and_then(|tls| tls.secret_name.clone()) {
                    if let Some(key) = sources.secret(&secret_name).as_deref().and_then(serving_key) {
                        tls_by_host.insert(host.clone(), key);
                    }
                }
                match Sealer::new(&state, &fd.spec.issuer) {
                    Ok(sealer) => match Issuer::new(
                        format!("{namespace}/{name}"),
                        fd.spec.issuer.clone(),
                        Arc::new(signing),
                        Bytes::from(jwks.to_string()),
                        Arc::new(TokenKey::new(&token)),
                        Arc::new(sealer),
                        fd_idps,
                        federation_domain::transforms(fd),
                    ) {
                        Ok(issuer) => served.push(Arc::new(issuer)),
                        Err(error) => tracing::warn!(federation_domain = %name, %error, "not served"),
                    },
                    Err(error) => tracing::warn!(federation_domain = %name, %error, "not served"),
                }
            }
            if leading {
                let (mut ready, phase) = conditions::ready::<Phase>("FederationDomain", &checks);
                if ready.is_true() {
                    ready.message = format!(
                        "the FederationDomain is ready and its endpoints are available: the discovery endpoint is {}/.well-known/openid-configuration",
                        fd.spec.issuer
                    );
                }
                let all: Vec<Check> = checks.into_iter().chain([ready]).collect();
                let reference = |kind: KeySecret| {
                    Some(LocalObjectReference {
                        name: kind.name(&name),
                    })
                };
                let status = FederationDomainStatus {
                    phase,
                    conditions: conditions::merge(
                        &fd.status.clone().unwrap_or_default().conditions,
                        &all,
                        fd.metadata.generation,
                        &conditions::now(),
                    ),
                    secrets: FederationDomainSecrets {
                        jwks: reference(KeySecret::Jwks),
                        token_signing_key: reference(KeySecret::TokenSigning),
                        state_signing_key: reference(KeySecret::StateSigning),
                        state_encryption_key: reference(KeySecret::StateEncryption),
                    },
                };
                self.statuses
                    .write(&self.fd_resource, &name, &fd.status, status)
                    .await;
            }
        }
        self.outputs.issuers.store(Arc::new(Issuers::new(served)));

        // Certificates: the default one, and one per FederationDomain host that has its own.
        if let Some(default) = &self.config.default_tls_certificate_secret {
            if let Some(secret) = sources.secret(default) {
                let (cert, key) = tls_pair(&secret);
                if let Err(error) = self.outputs.serving.replace_pem(&cert, &key) {
                    tracing::warn!(secret = %default, %error, "the default TLS certificate Secret is unusable");
                }
            }
        }
        self.outputs.serving.set_names(tls_by_host);
    }

    /// Builds (or reuses) the upstream of an OIDCIdentityProvider, with its conditions.
    async fn oidc_upstream(
        &mut self,
        idp: &OIDCIdentityProvider,
        sources: &Sources<'_>,
    ) -> (Vec<Check>, Option<Arc<Upstream>>) {
        let name = idp.name_any();
        let key = format!("{}/{name}", sources.namespace);
        let mut checks = Vec::new();

        // The client credentials.
        let secret_name = &idp.spec.client.secret_name;
        let credentials = secret_pair(
            sources,
            "ClientCredentialsSecretValid",
            secret_name,
            OIDC_CLIENT_SECRET_TYPE,
            ["clientID", "clientSecret"],
        )
        .map(|(id, secret, _)| {
            let mark = secret_fingerprint(&secret);
            (id, secret, mark)
        });
        checks.push(match &credentials {
            Ok(_) => Check::success("ClientCredentialsSecretValid", "loaded client credentials"),
            Err(check) => check.clone(),
        });

        // TLS, then discovery.
        let tls = tls_spec::validate(idp.spec.tls.as_ref(), sources.namespace, sources);
        checks.push(tls.check.clone());

        // Additional authorize parameters.
        let rejected: Vec<&str> = idp
            .spec
            .authorization_config
            .additional_authorize_parameters
            .iter()
            .map(|parameter| parameter.name.as_str())
            .filter(|name| DISALLOWED_AUTHORIZE_PARAMETERS.contains(name))
            .collect();
        checks.push(if rejected.is_empty() {
            Check::success(
                "AdditionalAuthorizeParametersValid",
                "additionalAuthorizeParameters parameter names are allowed",
            )
        } else {
            Check::failure(
                "AdditionalAuthorizeParametersValid",
                "DisallowedParameterName",
                format!(
                    "the following additionalAuthorizeParameters are not allowed: {}",
                    rejected.join(",")
                ),
            )
        });

        let fingerprint = format!(
            "{}|{}|{}|{:?}|{}",
            idp.metadata.uid.as_deref().unwrap_or_default(),
            idp.metadata.generation.unwrap_or_default(),
            idp.spec.issuer,
            tls.ca_bundle_pem,
            credentials
                .as_ref()
                .map(|(id, _, secret)| format!("{id}:{secret}"))
                .unwrap_or_default()
        );
        let previous = self.upstreams.get(&key).map(|built| built.upstream.clone());
        let (Ok((client_id, client_secret, _)), true, true) = (credentials, tls.ok(), rejected.is_empty())
        else {
            checks.push(Check::unable_to_validate("OIDCDiscoverySucceeded"));
            return (checks, previous);
        };
        if let Some(built) = self
            .upstreams
            .get(&key)
            .filter(|built| built.fingerprint == fingerprint)
        {
            checks.push(Check::success(
                "OIDCDiscoverySucceeded",
                "discovered issuer configuration",
            ));
            return (checks, Some(built.upstream.clone()));
        }
        // Discovery runs in a task of its own (an issuer that never answers must not hold up the
        // sync); a failure stands for RESYNC before it is tried again.
        let issuer = idp.spec.issuer.clone();
        let options = TlsOptions {
            ca_pem: tls.ca_bundle_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
            ..TlsOptions::default()
        };
        let finished = self.discoveries.poll(&key, &fingerprint, RESYNC, async move {
            Provider::discover(&issuer, &options)
                .await
                .map(Arc::new)
                .map_err(|error| format!("failed to perform OIDC discovery against {issuer:?}:\n{error}"))
        });
        let provider = match finished {
            Some(Ok(provider)) => provider,
            Some(Err(message)) => {
                checks.push(Check::failure("OIDCDiscoverySucceeded", "Unreachable", message));
                return (checks, previous);
            }
            None => {
                checks.push(Check::unknown(
                    "OIDCDiscoverySucceeded",
                    format!("performing OIDC discovery against {:?}", idp.spec.issuer),
                ));
                return (checks, previous);
            }
        };
        checks.push(Check::success(
            "OIDCDiscoverySucceeded",
            "discovered issuer configuration",
        ));
        let authorization = &idp.spec.authorization_config;
        let upstream = Arc::new(Upstream::Oidc(OidcUpstream {
            display_name: name.clone(),
            resource_name: name,
            resource_uid: idp.metadata.uid.clone().unwrap_or_default(),
            provider,
            client: ClientConfig {
                client_id,
                client_secret: Some(client_secret),
                scopes: compute_scopes(&authorization.additional_scopes),
            },
            additional_authorize_parameters: authorization
                .additional_authorize_parameters
                .iter()
                .map(|parameter| {
                    (
                        parameter.name.clone(),
                        parameter.value.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            allow_password_grant: authorization.allow_password_grant,
            username_claim: idp.spec.claims.username.clone().filter(|claim| !claim.is_empty()),
            groups_claim: idp.spec.claims.groups.clone().filter(|claim| !claim.is_empty()),
            additional_claim_mappings: idp.spec.claims.additional_claim_mappings.clone(),
        }));
        self.upstreams.insert(
            key,
            BuiltUpstream {
                fingerprint,
                upstream: upstream.clone(),
            },
        );
        (checks, Some(upstream))
    }

    /// A GitHubIdentityProvider's conditions (Pinniped's six: ClientCredentialsSecretValid,
    /// ClaimsValid, OrganizationsPolicyValid, HostValid, TLSConfigurationValid,
    /// GitHubConnectionValid; no Ready) and, when they all hold, its upstream inserted into
    /// `idps`. The connection probe (`GET <api>/rate_limit`) runs in a task of its own, once per
    /// configuration, again [`LDAP_RETRY`] after a failure; meanwhile, or while a change does not
    /// work yet, the last working configuration keeps serving.
    fn github_upstream(
        &mut self,
        idp: &GitHubIdentityProvider,
        sources: &Sources<'_>,
        idps: &mut HashMap<(String, String), Arc<Upstream>>,
    ) -> Vec<Check> {
        const SECRET: &str = "ClientCredentialsSecretValid";
        const CLAIMS: &str = "ClaimsValid";
        const POLICY: &str = "OrganizationsPolicyValid";
        const HOST: &str = "HostValid";
        const CONNECTION: &str = "GitHubConnectionValid";
        let name = idp.name_any();
        let key = format!("GitHubIdentityProvider/{}/{name}", sources.namespace);
        let spec = &idp.spec;
        let mut checks = Vec::new();

        let secret_name = &spec.client.secret_name;
        let credentials = github_credentials(sources, secret_name);
        checks.push(match &credentials {
            Ok(_) => Check::success(
                SECRET,
                format!("clientID and clientSecret have been read from spec.client.SecretName (\"{secret_name}\")"),
            ),
            Err(prefix) => Check::failure(
                SECRET,
                "SecretNotFound",
                format!(
                    "{prefix}: secret from spec.client.SecretName (\"{secret_name}\") must be found in namespace \"{}\" with type \"{GITHUB_CLIENT_SECRET_TYPE}\" and keys \"clientID\" and \"clientSecret\"",
                    sources.namespace
                ),
            ),
        });

        let claims = match (spec.claims.username, spec.claims.groups) {
            (None, _) => Err("spec.claims.username is required"),
            (_, None) => Err("spec.claims.groups is required"),
            (Some(username), Some(groups)) => Ok((username, groups)),
        };
        checks.push(match &claims {
            Ok(_) => Check::success(CLAIMS, "spec.claims are valid"),
            Err(message) => Check::failure(CLAIMS, "Invalid", *message),
        });

        let organizations = &spec.allow_authentication.organizations;
        let policy = organizations.policy;
        let allowed = &organizations.allowed;
        let policy_ok = matches!(
            (policy, allowed.is_empty()),
            (Some(GitHubAllowedAuthOrganizationsPolicy::AllGitHubUsers), true)
                | (
                    Some(GitHubAllowedAuthOrganizationsPolicy::OnlyUsersFromAllowedOrganizations),
                    false
                )
        );
        checks.push(if policy_ok {
            let policy = policy.map(|policy| format!("{policy:?}")).unwrap_or_default();
            Check::success(POLICY, format!("spec.allowAuthentication.organizations.policy (\"{policy}\") is valid"))
        } else if !allowed.is_empty() {
            Check::failure(POLICY, "Invalid", "spec.allowAuthentication.organizations.policy must be 'OnlyUsersFromAllowedOrganizations' when spec.allowAuthentication.organizations.allowed has organizations listed")
        } else {
            Check::failure(POLICY, "Invalid", "spec.allowAuthentication.organizations.policy must be 'AllGitHubUsers' when spec.allowAuthentication.organizations.allowed is empty")
        });

        let host = spec.github_api.host.clone().unwrap_or_default();
        let endpoints = github::Endpoints::of(&host);
        checks.push(match &endpoints {
            Ok(_) => Check::success(HOST, format!("spec.githubAPI.host (\"{host}\") is valid")),
            Err(reason) => Check::failure(
                HOST,
                "InvalidHost",
                format!("spec.githubAPI.host (\"{host}\") is not valid: {reason}"),
            ),
        });

        let tls = tls_spec::validate_at(
            spec.github_api.tls.as_ref(),
            "spec.githubAPI.tls",
            sources.namespace,
            sources,
        );
        checks.push(tls.check.clone());

        let previous = self.githubs.get(&key).map(|(_, upstream)| upstream.clone());
        let keep_previous = |idps: &mut HashMap<(String, String), Arc<Upstream>>| {
            if let Some(previous) = previous.clone() {
                idps.insert(("GitHubIdentityProvider".into(), name.clone()), previous);
            }
        };
        let (Ok(endpoints), true) = (endpoints, tls.ok()) else {
            checks.push(Check::unable_to_validate(CONNECTION));
            keep_previous(idps);
            return checks;
        };
        let https = match HttpsClient::new(&TlsOptions {
            ca_pem: tls.ca_bundle_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
            ..TlsOptions::default()
        }) {
            Ok(https) => https,
            Err(error) => {
                checks.push(Check::failure(
                    CONNECTION,
                    "UnableToMakeRequest",
                    format!(
                        "cannot make connection probe request for spec.githubAPI.host (\"{host}\"): {error}"
                    ),
                ));
                keep_previous(idps);
                return checks;
            }
        };
        // The probe depends on where GitHub is and which CAs are trusted, nothing else.
        let probe_key = format!("{}|{:?}", endpoints.address, tls.ca_bundle_pem);
        let probed = self.github_probes.poll(&key, &probe_key, LDAP_RETRY, {
            let (endpoints, https) = (endpoints.clone(), https.clone());
            async move { github::probe(&endpoints, &https).await }
        });
        checks.push(match &probed {
            None => Check::unknown(
                CONNECTION,
                format!("probing the connection to \"{}\" for spec.githubAPI.host (\"{host}\")", endpoints.address),
            ),
            Some(Ok(())) => Check::success(
                CONNECTION,
                format!(
                    "probed connection to \"{}\" for spec.githubAPI.host (\"{host}\"): host is reachable and TLS verification succeeds",
                    endpoints.address
                ),
            ),
            Some(Err(reason)) => Check::failure(
                CONNECTION,
                "UnableToMakeRequest",
                format!("cannot make connection probe request for spec.githubAPI.host (\"{host}\"): {reason}"),
            ),
        });
        let (Ok((client_id, client_secret)), Ok((username, groups)), true, Some(Ok(()))) =
            (credentials, claims, policy_ok, probed)
        else {
            keep_previous(idps);
            return checks;
        };
        let github = github::GitHub::new(
            endpoints,
            client_id,
            client_secret,
            username,
            groups,
            allowed,
            https,
        );
        let uid = idp.metadata.uid.clone().unwrap_or_default();
        let upstream = match self.githubs.get(&key) {
            // Unchanged: the same upstream (and its connection pool) keeps serving.
            Some((built, upstream)) if built.same_settings(&github) && uid == upstream_uid(upstream) => {
                upstream.clone()
            }
            _ => {
                let upstream = Arc::new(Upstream::GitHub(GitHubUpstream {
                    display_name: name.clone(),
                    resource_name: name.clone(),
                    resource_uid: uid,
                    github: Arc::new(github.clone()),
                }));
                self.githubs.insert(key, (github, upstream.clone()));
                upstream
            }
        };
        idps.insert(("GitHubIdentityProvider".into(), name), upstream);
        checks
    }

    /// The conditions of an LDAP or Active Directory identity provider, as Pinniped's, and its
    /// upstream when they pass: `BindSecretValid` (a `kubernetes.io/basic-auth` Secret with
    /// `username` and `password`), `TLSConfigurationValid`, `LDAPConnectionValid` (a connection
    /// and the service account's bind) and, for Active Directory, `SearchBaseFound` (from the
    /// spec, else the directory's `defaultNamingContext`). The directory is probed again only
    /// when the spec, the Secret or the CA bundle changed, or [`LDAP_RETRY`] after a failed
    /// probe, in a task of its own ([`probe_directory`]; until it finishes `LDAPConnectionValid`
    /// is Unknown); until a changed one passes, the last one that did keeps serving.
    async fn directory_upstream(
        &mut self,
        spec: &DirectorySpec<'_>,
        sources: &Sources<'_>,
    ) -> (Vec<Check>, Option<Arc<Upstream>>) {
        const BIND: &str = "BindSecretValid";
        const CONNECTION: &str = "LDAPConnectionValid";
        const SEARCH_BASE: &str = "SearchBaseFound";
        let kind = spec.kind();
        let key = format!("{kind}/{}/{}", sources.namespace, spec.name);
        let previous = self.directories.get(&key).map(|built| built.upstream.clone());
        let mut checks = Vec::new();
        let bind = secret_pair(
            sources,
            BIND,
            &spec.bind_secret,
            "kubernetes.io/basic-auth",
            ["username", "password"],
        );
        checks.push(match &bind {
            Ok(_) => Check::success(BIND, "loaded bind secret"),
            Err(check) => check.clone(),
        });
        let tls = tls_spec::validate(spec.tls, sources.namespace, sources);
        checks.push(tls.check.clone());
        let active_directory = spec.flavor == Flavor::ActiveDirectory;
        let (Ok((dn, password, version)), true) = (bind, tls.ok()) else {
            checks.push(Check::unable_to_validate(CONNECTION));
            if active_directory {
                checks.push(Check::unable_to_validate(SEARCH_BASE));
            }
            return (checks, previous);
        };
        let fingerprint = format!(
            "{}|{}|{}|{dn}|{version}|{}|{:?}",
            spec.uid,
            spec.generation,
            spec.host,
            secret_fingerprint(&password),
            tls.ca_bundle_pem,
        );
        if let Some(built) = self
            .directories
            .get(&key)
            .filter(|built| built.fingerprint == fingerprint)
        {
            checks.extend(built.checks.iter().cloned());
            return (checks, Some(built.upstream.clone()));
        }
        let options = TlsOptions {
            ca_pem: tls.ca_bundle_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
            ..TlsOptions::default()
        };
        let tls_config = match selkie_oidc::https::client_config(&options) {
            Ok(config) => Arc::new(config),
            Err(error) => {
                checks.push(Check::failure(
                    CONNECTION,
                    "LDAPConnectionError",
                    format!("the TLS configuration cannot be used: {error}"),
                ));
                if active_directory {
                    checks.push(Check::unable_to_validate(SEARCH_BASE));
                }
                return (checks, previous);
            }
        };
        let config = DirectoryConfig {
            host: spec.host.to_string(),
            tls: tls_config,
            bind_dn: dn.clone(),
            bind_password: password,
            user_search: spec.user_search.clone(),
            group_search: spec.group_search.clone(),
            timeout: LDAP_TIMEOUT,
            flavor: spec.flavor,
        };
        let described = format!(
            "successfully able to connect to \"{}\" and bind as user \"{dn}\" [validated with Secret \"{}\" at version \"{version}\"]",
            spec.host, spec.bind_secret
        );
        let probed = self.probes.poll(&key, &fingerprint, LDAP_RETRY, async move {
            let (found, config) = probe_directory(config, described).await;
            // A failure is probed again after LDAP_RETRY; the last working form keeps
            // serving meanwhile.
            if found.iter().all(Check::is_true) {
                Ok((found, config))
            } else {
                Err(found)
            }
        });
        let (found, config) = match probed {
            Some(Ok(passed)) => passed,
            Some(Err(failed)) => {
                checks.extend(failed);
                return (checks, previous);
            }
            None => {
                checks.push(Check::unknown(
                    CONNECTION,
                    format!("checking the connection to \"{}\"", spec.host),
                ));
                if active_directory {
                    checks.push(Check::unable_to_validate(SEARCH_BASE));
                }
                return (checks, previous);
            }
        };
        checks.extend(found.iter().cloned());
        let upstream = Arc::new(Upstream::Ldap(LdapUpstream {
            display_name: spec.name.clone(),
            resource_name: spec.name.clone(),
            resource_uid: spec.uid.clone(),
            kind: match spec.flavor {
                Flavor::Ldap => selkie_api::supervisor_oidc::IDPType::LDAP,
                Flavor::ActiveDirectory => selkie_api::supervisor_oidc::IDPType::ActiveDirectory,
            },
            directory: Arc::new(Directory::new(config)),
        }));
        self.directories.insert(
            key,
            BuiltDirectory {
                fingerprint,
                checks: found,
                upstream: upstream.clone(),
            },
        );
        (checks, Some(upstream))
    }

    /// Creates the FederationDomain's generated key Secrets that are missing from the watched
    /// ones, and rotates its signing key when due ([`keys::rotate`]) (leader only). A failed
    /// write is logged and tried again at the next sync; a replace that lost a race to another
    /// writer fails on its resourceVersion and changes nothing.
    async fn ensure_keys(&self, fd: &FederationDomain, watched: &Watched) {
        let name = fd.name_any();
        let namespace = &self.config.namespace;
        let secrets = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let owner = OwnerReference {
            api_version: self.fd_resource.api_version.clone(),
            kind: "FederationDomain".into(),
            name: name.clone(),
            uid: fd.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        for kind in KeySecret::ALL {
            let secret_name = kind.name(&name);
            let existing = watched
                .secrets
                .get(&ObjectRef::new(&secret_name).within(namespace));
            match existing {
                Some(secret) if kind == KeySecret::Jwks => {
                    self.rotate_signing_key(&secrets, &name, &secret).await;
                }
                Some(_) => {}
                None => match kind.generate(&name, namespace, owner.clone()) {
                    Ok(secret) => match secrets.create(&PostParams::default(), &secret).await {
                        Ok(_) => {
                            tracing::info!(secret = %secret_name, "generated a FederationDomain key Secret")
                        }
                        // The watch has not shown it yet.
                        Err(kube::Error::Api(status)) if status.code == 409 => {}
                        Err(error) => {
                            tracing::warn!(secret = %secret_name, %error, "creating a generated key Secret failed")
                        }
                    },
                    Err(error) => tracing::error!(secret = %secret_name, %error, "generating keys failed"),
                },
            }
        }
    }

    /// Writes the `jwks` Secret of the FederationDomain `name` back rotated, when
    /// [`keys::rotate`] says it changes.
    async fn rotate_signing_key(&self, secrets: &Api<Secret>, name: &str, secret: &Secret) {
        let secret_name = KeySecret::Jwks.name(name);
        let (updated, rotation) = match keys::rotate(
            secret,
            time::OffsetDateTime::now_utc(),
            self.rotation_interval,
        ) {
            Ok(Some(change)) => change,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(secret = %secret_name, %error, "the signing key Secret is unusable; not rotated");
                return;
            }
        };
        // `updated` carries the watched resourceVersion: a concurrent change makes this fail.
        match secrets
            .replace(&secret_name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => tracing::info!(
                federation_domain = %name,
                new_key = rotation.new_kid.as_deref().unwrap_or("-"),
                next_key = rotation.next_kid.as_deref().unwrap_or("-"),
                dropped = ?rotation.dropped,
                "rotated the signing keys"
            ),
            Err(error) => {
                tracing::warn!(secret = %secret_name, %error, "rotating the signing key failed; trying again at the next sync")
            }
        }
    }

    /// The FederationDomain's keys from the watched Secrets.
    fn read_keys(
        &self,
        fd: &FederationDomain,
        watched: &Watched,
    ) -> Result<
        (
            selkie_oidc::jose::sign::SigningKey,
            serde_json::Value,
            Vec<u8>,
            Vec<u8>,
        ),
        String,
    > {
        let name = fd.name_any();
        let get = |kind: KeySecret| {
            let secret_name = kind.name(&name);
            watched
                .secrets
                .get(&ObjectRef::new(&secret_name).within(&self.config.namespace))
                .ok_or_else(|| format!("the Secret {secret_name} does not exist yet"))
        };
        let (signing, jwks) = keys::read_jwks(&*get(KeySecret::Jwks)?).map_err(|e| e.to_string())?;
        let token = keys::read_symmetric(&*get(KeySecret::TokenSigning)?, KeySecret::TokenSigning)
            .map_err(|e| e.to_string())?;
        let state = keys::read_symmetric(&*get(KeySecret::StateEncryption)?, KeySecret::StateEncryption)
            .map_err(|e| e.to_string())?;
        Ok((signing, jwks, token, state))
    }
}

/// Writes the statuses of a namespace's objects: a merge patch of `status`, only when it differs
/// from the object's current status and from what was last written for it.
pub(crate) struct StatusWriter {
    client: Client,
    namespace: String,
    /// Statuses last written, by `kind/name`.
    written: HashMap<String, serde_json::Value>,
}

impl StatusWriter {
    /// A writer to objects in `namespace`.
    pub(crate) fn new(client: Client, namespace: &str) -> Self {
        Self {
            client,
            namespace: namespace.to_string(),
            written: HashMap::new(),
        }
    }

    /// Writes `status` to the `resource` object `name` whose status is `current`, unless it is
    /// unchanged. A failure is logged (the next sync writes again).
    pub(crate) async fn write<S: serde::Serialize + PartialEq>(
        &mut self,
        resource: &ApiResource,
        name: &str,
        current: &Option<S>,
        status: S,
    ) {
        if current.as_ref() == Some(&status) {
            return;
        }
        let value = json!({"status": status});
        let key = format!("{}/{name}", resource.kind);
        if self.written.get(&key) == Some(&value) {
            return;
        }
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.namespace, resource);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&value))
            .await
        {
            Ok(_) => {
                self.written.insert(key, value);
            }
            Err(error) => tracing::warn!(kind = %resource.kind, %name, %error, "writing the status failed"),
        }
    }
}

/// Pinniped's upstream scopes: `openid offline_access email profile` when none are configured,
/// else the configured ones with `openid`, de-duplicated and sorted.
pub(crate) fn compute_scopes(additional: &[String]) -> Vec<String> {
    if additional.is_empty() {
        return ["openid", "offline_access", "email", "profile"]
            .map(String::from)
            .to_vec();
    }
    let mut set: std::collections::BTreeSet<String> = additional.iter().cloned().collect();
    set.insert("openid".into());
    set.into_iter().collect()
}

/// Checks a directory as an identity provider's conditions say (run in a task of its own): a
/// connection and the service account's bind (`LDAPConnectionValid`, `connected` its success
/// message) and, for Active Directory, the search bases (`SearchBaseFound`: from the spec, else
/// the root DSE's `defaultNamingContext`, filled into the configuration returned). Each step is
/// bounded by [`LDAP_PROBE_TIMEOUT`].
async fn probe_directory(mut config: DirectoryConfig, connected: String) -> (Vec<Check>, DirectoryConfig) {
    const CONNECTION: &str = "LDAPConnectionValid";
    const SEARCH_BASE: &str = "SearchBaseFound";
    let probe = Directory::new(DirectoryConfig {
        timeout: LDAP_PROBE_TIMEOUT,
        ..config.clone()
    });
    let mut found = vec![match probe.probe().await {
        Ok(()) => Check::success(CONNECTION, connected),
        Err(error) => Check::failure(
            CONNECTION,
            "LDAPConnectionError",
            format!("error dialing or binding: {error}"),
        ),
    }];
    if config.flavor == Flavor::ActiveDirectory {
        let from_spec = !config.user_search.base.is_empty() && !config.group_search.base.is_empty();
        found.push(if from_spec {
            Check::success_with_reason(
                SEARCH_BASE,
                "UsingConfigurationFromSpec",
                "Using search base from ActiveDirectoryIdentityProvider config.",
            )
        } else if !found[0].is_true() {
            Check::unable_to_validate(SEARCH_BASE)
        } else {
            match probe.default_naming_context().await {
                Ok(context) => {
                    for base in [&mut config.user_search.base, &mut config.group_search.base] {
                        if base.is_empty() {
                            base.clone_from(&context);
                        }
                    }
                    Check::success(
                        SEARCH_BASE,
                        "Successfully fetched defaultNamingContext to use as default search base from RootDSE.",
                    )
                }
                Err(error) => Check::failure(
                    SEARCH_BASE,
                    "ErrorFetchingSearchBase",
                    format!("Error finding search base: {error}"),
                ),
            }
        });
    }
    (found, config)
}

/// The two non-empty text values `keys` of the Secret `name`, which must be of type
/// `secret_type`, and its resourceVersion; or the failed `condition` as Pinniped words it
/// (`SecretNotFound`, `SecretWrongType`, `SecretMissingKeys`).
/// The `clientID` and `clientSecret` of a GitHubIdentityProvider's client Secret, or what is
/// wrong with it in Pinniped's words (the condition's message begins with it).
fn github_credentials(sources: &Sources<'_>, name: &str) -> Result<(String, String), String> {
    let Some(secret) = sources.secret(name) else {
        return Err(format!("secret \"{name}\" not found"));
    };
    let found_type = secret.type_.clone().unwrap_or_default();
    if found_type != GITHUB_CLIENT_SECRET_TYPE {
        return Err(format!("wrong secret type \"{found_type}\""));
    }
    let data = secret.data.clone().unwrap_or_default();
    let value = |key: &str| {
        data.get(key)
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|value| !value.is_empty())
    };
    let Some(client_id) = value("clientID") else {
        return Err("missing key \"clientID\"".into());
    };
    let Some(client_secret) = value("clientSecret") else {
        return Err("missing key \"clientSecret\"".into());
    };
    if data.len() != 2 {
        return Err("extra keys found".into());
    }
    Ok((client_id, client_secret))
}

/// The resource UID an upstream was built from.
fn upstream_uid(upstream: &Upstream) -> &str {
    match upstream {
        Upstream::Oidc(oidc) => &oidc.resource_uid,
        Upstream::Ldap(ldap) => &ldap.resource_uid,
        Upstream::GitHub(github) => &github.resource_uid,
    }
}

fn secret_pair(
    sources: &Sources<'_>,
    condition: &'static str,
    name: &str,
    secret_type: &str,
    keys: [&str; 2],
) -> Result<(String, String, String), Check> {
    let Some(secret) = sources.secret(name) else {
        return Err(Check::failure(
            condition,
            "SecretNotFound",
            format!("secret \"{name}\" not found"),
        ));
    };
    if secret.type_.as_deref() != Some(secret_type) {
        return Err(Check::failure(
            condition,
            "SecretWrongType",
            format!(
                "referenced Secret \"{name}\" has wrong type \"{}\" (should be \"{secret_type}\")",
                secret.type_.clone().unwrap_or_default()
            ),
        ));
    }
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|value| !value.is_empty())
    };
    match (value(keys[0]), value(keys[1])) {
        (Some(first), Some(second)) => Ok((
            first,
            second,
            secret.metadata.resource_version.clone().unwrap_or_default(),
        )),
        _ => Err(Check::failure(
            condition,
            "SecretMissingKeys",
            format!(
                "referenced Secret \"{name}\" is missing required keys [\"{}\" \"{}\"]",
                keys[0], keys[1]
            ),
        )),
    }
}

/// A short, non-reversible mark of a secret value, to notice when it changes.
fn secret_fingerprint(secret: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `tls.crt` and `tls.key` of a TLS Secret (empty when absent).
fn tls_pair(secret: &Secret) -> (Vec<u8>, Vec<u8>) {
    let get = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|bytes| bytes.0.clone())
            .unwrap_or_default()
    };
    (get("tls.crt"), get("tls.key"))
}

fn serving_key(secret: &Secret) -> Option<rustls::sign::CertifiedKey> {
    let (cert, key) = tls_pair(secret);
    ServingCert::load(&cert, &key).ok()
}

/// A watched object as its typed form; objects that do not parse are skipped with a log line (the
/// CRD's schema makes that rare).
pub(crate) fn parse<K: serde::de::DeserializeOwned>(object: &DynamicObject) -> Option<K> {
    let value = serde_json::to_value(object).ok()?;
    match serde_json::from_value(value) {
        Ok(typed) => Some(typed),
        Err(error) => {
            tracing::warn!(
                name = %object.name_any(),
                error = %selkie_api::json::error_without_values(&error),
                "an object does not parse; it is ignored"
            );
            None
        }
    }
}

/// Applies a watch's events to `writer`, waking `changed` after each.
pub(crate) async fn follow<K>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    writer: reflector::store::Writer<K>,
    changed: Arc<Notify>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut events = std::pin::pin!(stream.default_backoff().reflect(writer));
    while let Some(event) = events.next().await {
        match event {
            Ok(_) => changed.notify_one(),
            Err(error) => tracing::warn!(%error, "a watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_pinnipeds() {
        assert_eq!(
            compute_scopes(&[]),
            ["openid", "offline_access", "email", "profile"]
        );
        assert_eq!(
            compute_scopes(&["offline_access".into(), "groups".into(), "offline_access".into()]),
            ["groups", "offline_access", "openid"]
        );
    }
}
