//! The FederationDomain reconciler: for each FederationDomain, its generated key Secrets (created
//! and rotated by the leader, [`keys`]), Pinniped's conditions and phase
//! ([`federation_domain::check`]), and — when it can serve — its [`Issuer`], published with every
//! other in the [`Issuers`] snapshot the endpoints read, and its own TLS certificate by host.
//!
//! A FederationDomain is reconciled again when it changes, when one of its key Secrets or its TLS
//! Secret changes, when an identity provider appears, becomes ready or goes (the
//! [`Upstreams`](crate::controller::upstreams::Upstreams) say so), when another FederationDomain
//! changes (issuers must be unique), at the leader when its signing keys are next due to change
//! ([`keys::next_change`]), and at the latest every [`RESYNC`].

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use k8s_openapi::{
    api::core::v1::{LocalObjectReference, Secret},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    api::{DynamicObject, PostParams},
    runtime::{controller::Action, reflector::Store},
    Api, Client, ResourceExt as _,
};
use selkie_api::{
    supervisor_config::{FederationDomain, FederationDomainSecrets, FederationDomainStatus},
    supervisor_idp::Phase,
};
use selkie_kube::{
    conditions::{self, Check},
    reconcile::{PendingSources, Reconciler, SourceEvent, SourceKind},
    tls_spec::CaSources as _,
};

use crate::controller::federation_domain;
use crate::controller::keys::{self, KeySecret};
use crate::controller::kind::Kind;
use crate::controller::sources::{serving_key, typed, ReconcileError, Sources};
use crate::controller::upstreams::Upstreams;
use crate::controller::Outputs;
use crate::idp::Upstream;
use crate::issuer::{split_issuer, Issuer, Issuers};
use crate::sealed::Sealer;
use crate::session::tokens::TokenKey;

/// The kind's name.
pub(crate) const KIND: &str = "FederationDomain";
/// The longest a FederationDomain goes without being looked at again when no event and no key
/// change is due. Its keys are looked at sooner when they are due to change.
pub(crate) const RESYNC: Duration = Duration::from_secs(3600);
/// The least wait before a FederationDomain is looked at again for its keys: a rotation just
/// written shows in the watched Secret only a moment later.
const KEY_RETRY: Duration = Duration::from_secs(1);

/// What one FederationDomain serves, and what it was built from.
struct Served {
    uid: Option<String>,
    fingerprint: String,
    issuer: Arc<Issuer>,
    tls: Option<(String, rustls::sign::CertifiedKey)>,
}

#[derive(Default)]
struct State {
    /// By FederationDomain name.
    served: BTreeMap<String, Served>,
    /// The UID and generation each FederationDomain was last reconciled at.
    seen: HashMap<String, (Option<String>, Option<i64>)>,
}

/// See the module documentation.
pub(crate) struct FederationDomainReconciler {
    pub(crate) kind: Kind,
    client: Client,
    sources: Sources,
    upstreams: Arc<Upstreams>,
    /// The identity-provider kinds' watched objects, by kind name (which exist).
    identity_providers: Vec<(&'static str, Store<DynamicObject>)>,
    /// This reconciler's own source changes (to look at every FederationDomain again).
    pending: Arc<PendingSources>,
    outputs: Outputs,
    /// How long a signing key signs before it is rotated; `None`: never.
    rotation_interval: Option<Duration>,
    /// The identity providers' API group under the installation's suffix.
    idp_group: String,
    state: Mutex<State>,
}

impl FederationDomainReconciler {
    #[allow(clippy::too_many_arguments, reason = "the controller's wiring, in one place")]
    pub(crate) fn new(
        kind: Kind,
        client: Client,
        sources: Sources,
        upstreams: Arc<Upstreams>,
        identity_providers: Vec<(&'static str, Store<DynamicObject>)>,
        pending: Arc<PendingSources>,
        outputs: Outputs,
        rotation_interval: Option<Duration>,
        idp_group: String,
    ) -> Self {
        Self {
            kind,
            client,
            sources,
            upstreams,
            identity_providers,
            pending,
            outputs,
            rotation_interval,
            idp_group,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is one insert or remove: a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes what `state` serves: the issuers and the certificates by host.
    fn publish(&self, state: &State) {
        let issuers = state
            .served
            .values()
            .map(|served| served.issuer.clone())
            .collect();
        self.outputs.issuers.store(Arc::new(Issuers::new(issuers)));
        let by_host: HashMap<String, rustls::sign::CertifiedKey> = state
            .served
            .values()
            .filter_map(|served| served.tls.clone())
            .collect();
        self.outputs.serving.set_names(by_host);
    }

    async fn reconcile_one(self: Arc<Self>, object: Arc<DynamicObject>) -> Result<Action, ReconcileError> {
        self.sources.ready().await;
        let fd: FederationDomain = typed(&object)?;
        let name = fd.name_any();
        let identity = (fd.metadata.uid.clone(), fd.metadata.generation);
        if self.state().seen.insert(name.clone(), identity.clone()) != Some(identity) {
            // Another FederationDomain's conditions may depend on this one (unique issuers).
            self.pending.push(SourceEvent::All);
        }
        let all: Vec<federation_domain::IssuerClaim> = self
            .kind
            .store
            .state()
            .iter()
            .map(|object| federation_domain::IssuerClaim::of_object(object))
            .collect();
        let view = federation_domain::Namespace {
            existing: self
                .identity_providers
                .iter()
                .flat_map(|(kind, store)| {
                    store
                        .state()
                        .iter()
                        .map(|object| (kind.to_string(), object.name_any()))
                        .collect::<Vec<_>>()
                })
                .collect(),
            ready: self.upstreams.snapshot(),
            idp_group: self.idp_group.clone(),
        };
        let (checks, idps) = federation_domain::check(&fd, &all, &view);
        let keys_written = if self.kind.leading() {
            self.ensure_keys(&fd).await
        } else {
            Ok(())
        };
        self.serve(&fd, idps, &view.ready);
        if self.kind.leading() {
            let (mut ready, phase) = conditions::ready::<Phase>(KIND, &checks);
            if ready.is_true() {
                ready.message = format!(
                    "the FederationDomain is ready and its endpoints are available: the discovery endpoint is {}/.well-known/openid-configuration",
                    fd.spec.issuer
                );
            }
            let all_checks: Vec<Check> = checks.into_iter().chain([ready]).collect();
            let reference = |kind: KeySecret| {
                Some(LocalObjectReference {
                    name: kind.name(&name),
                })
            };
            let status = FederationDomainStatus {
                phase,
                conditions: conditions::merge(
                    &fd.status.clone().unwrap_or_default().conditions,
                    &all_checks,
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
            self.kind.write_status(&object, &status).await?;
        }
        keys_written?;
        Ok(Action::requeue(self.next_look(&name)))
    }

    /// How long until the FederationDomain `name` is looked at again without an event: at the
    /// leader, until its signing keys are next due to change (at least [`KEY_RETRY`]); at most
    /// [`RESYNC`].
    fn next_look(&self, name: &str) -> Duration {
        if !self.kind.leading() {
            return RESYNC;
        }
        let now = time::OffsetDateTime::now_utc();
        self.sources
            .secret(&KeySecret::Jwks.name(name))
            .and_then(|secret| keys::next_change(&secret, now, self.rotation_interval))
            .and_then(|at| Duration::try_from(at - now).ok())
            .map_or(RESYNC, |wait| wait.clamp(KEY_RETRY, RESYNC))
    }

    /// Serves `fd` with `idps` (`None`: it cannot serve) when its issuer is usable and its keys
    /// are readable, rebuilding its [`Issuer`] only when anything it is made from changed;
    /// otherwise stops serving it. Publishes when what is served changed.
    fn serve(
        &self,
        fd: &FederationDomain,
        idps: Option<Vec<Arc<Upstream>>>,
        ready: &HashMap<(String, String), Arc<Upstream>>,
    ) {
        let name = fd.name_any();
        let built = match idps.map(|idps| self.build(fd, idps, ready)) {
            None => None,
            Some(Ok(None)) => return, // served in exactly this form already
            Some(Ok(Some(served))) => Some(served),
            Some(Err(reason)) => {
                // The leader creates the keys; until this replica sees them, it does not serve.
                tracing::info!(federation_domain = %name, %reason, "not served yet");
                None
            }
        };
        let mut state = self.state();
        let changed = match built {
            Some(served) => {
                state.served.insert(name, served);
                true
            }
            None => state.served.remove(&name).is_some(),
        };
        if changed {
            self.publish(&state);
        }
    }

    /// What `fd` serves with `idps` (its identity providers under its display names, made from
    /// the `ready` upstreams): `Ok(None)` when it is served in exactly this form already. Fails,
    /// saying why, when its issuer or keys cannot be used.
    fn build(
        &self,
        fd: &FederationDomain,
        idps: Vec<Arc<Upstream>>,
        ready: &HashMap<(String, String), Arc<Upstream>>,
    ) -> Result<Option<Served>, String> {
        let name = fd.name_any();
        let (host, _) = split_issuer(&fd.spec.issuer).map_err(|e| e.to_string())?;
        let key_secrets = KeySecret::ALL
            .iter()
            .map(|kind| {
                let secret_name = kind.name(&name);
                self.sources
                    .secret(&secret_name)
                    .map(|secret| (*kind, secret))
                    .ok_or_else(|| format!("the Secret {secret_name} does not exist yet"))
            })
            .collect::<Result<Vec<(KeySecret, Arc<Secret>)>, String>>()?;
        let tls_secret = fd
            .spec
            .tls
            .as_ref()
            .and_then(|tls| tls.secret_name.clone())
            .and_then(|secret_name| self.sources.secret(&secret_name));
        let version = |secret: &Secret| secret.metadata.resource_version.clone().unwrap_or_default();
        let fingerprint = format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}",
            fd.metadata.uid,
            fd.metadata.generation,
            key_secrets
                .iter()
                .map(|(_, secret)| version(secret))
                .collect::<Vec<_>>(),
            tls_secret.as_deref().map(version),
            // `idps` are copies made for this FederationDomain: the upstreams they were made
            // from say whether anything changed.
            ready
                .iter()
                .map(|(key, upstream)| (key, Arc::as_ptr(upstream) as usize))
                .collect::<BTreeMap<_, _>>(),
        );
        if self
            .state()
            .served
            .get(&name)
            .is_some_and(|served| served.fingerprint == fingerprint)
        {
            return Ok(None);
        }
        let secret = |kind: KeySecret| {
            key_secrets
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, secret)| secret.clone())
                .ok_or_else(|| format!("the Secret {} does not exist yet", kind.name(&name)))
        };
        let (signing, jwks) = keys::read_jwks(&*secret(KeySecret::Jwks)?).map_err(|e| e.to_string())?;
        let token = keys::read_symmetric(&*secret(KeySecret::TokenSigning)?, KeySecret::TokenSigning)
            .map_err(|e| e.to_string())?;
        let state = keys::read_symmetric(&*secret(KeySecret::StateEncryption)?, KeySecret::StateEncryption)
            .map_err(|e| e.to_string())?;
        let sealer = Sealer::new(&state, &fd.spec.issuer).map_err(|e| e.to_string())?;
        let issuer = Issuer::new(
            format!("{}/{name}", self.sources.namespace),
            fd.spec.issuer.clone(),
            Arc::new(signing),
            Bytes::from(jwks.to_string()),
            Arc::new(TokenKey::new(&token)),
            Arc::new(sealer),
            idps,
            federation_domain::transforms(fd),
            federation_domain::sessions(fd).map_err(|errors| errors.join("; "))?,
        )
        .map_err(|e| e.to_string())?
        .with_device_authorization(
            fd.spec
                .device_authorization
                .as_ref()
                .is_some_and(|device| device.enabled),
        )
        .with_dpop(fd.spec.dpop.as_ref().is_some_and(|dpop| dpop.enabled));
        Ok(Some(Served {
            uid: fd.metadata.uid.clone(),
            fingerprint,
            issuer: Arc::new(issuer),
            tls: tls_secret.as_deref().and_then(serving_key).map(|key| (host, key)),
        }))
    }

    /// Creates the FederationDomain's generated key Secrets that are missing from the watched
    /// ones, and rotates its signing key when due ([`keys::rotate`]) (leader only). A replace
    /// that lost a race to another writer fails on its resourceVersion and changes nothing; any
    /// other failed write is returned (the reconcile is retried with backoff).
    async fn ensure_keys(&self, fd: &FederationDomain) -> Result<(), ReconcileError> {
        let name = fd.name_any();
        let namespace = &self.sources.namespace;
        let secrets = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let owner = OwnerReference {
            api_version: self.kind.resource.api_version.clone(),
            kind: KIND.into(),
            name: name.clone(),
            uid: fd.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let mut failure = None;
        for kind in KeySecret::ALL {
            let secret_name = kind.name(&name);
            match self.sources.secret(&secret_name) {
                Some(secret) if kind == KeySecret::Jwks => {
                    if let Err(error) = self.rotate_signing_key(&secrets, &name, &secret).await {
                        failure = Some(error);
                    }
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
                            tracing::warn!(secret = %secret_name, %error, "creating a generated key Secret failed");
                            failure = Some(error);
                        }
                    },
                    Err(error) => tracing::error!(secret = %secret_name, %error, "generating keys failed"),
                },
            }
        }
        failure.map_or(Ok(()), |error| Err(ReconcileError::Write(error)))
    }

    /// Writes the `jwks` Secret of the FederationDomain `name` back rotated, when [`keys::rotate`]
    /// says it changes. A conflict (another writer got there first) is no failure.
    async fn rotate_signing_key(
        &self,
        secrets: &Api<Secret>,
        name: &str,
        secret: &Secret,
    ) -> Result<(), kube::Error> {
        let secret_name = KeySecret::Jwks.name(name);
        let (updated, rotation) = match keys::rotate(
            secret,
            time::OffsetDateTime::now_utc(),
            self.rotation_interval,
        ) {
            Ok(Some(change)) => change,
            Ok(None) => return Ok(()),
            Err(error) => {
                tracing::warn!(secret = %secret_name, %error, "the signing key Secret is unusable; not rotated");
                return Ok(());
            }
        };
        // `updated` carries the watched resourceVersion: a concurrent change makes this fail.
        match secrets
            .replace(&secret_name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    federation_domain = %name,
                    new_key = rotation.new_kid.as_deref().unwrap_or("-"),
                    next_key = rotation.next_kid.as_deref().unwrap_or("-"),
                    dropped = ?rotation.dropped,
                    "rotated the signing keys"
                );
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => {
                tracing::warn!(secret = %secret_name, %error, "rotating the signing key failed; trying again");
                Err(error)
            }
        }
    }
}

impl Reconciler for FederationDomainReconciler {
    type Error = ReconcileError;

    fn kind(&self) -> &'static str {
        KIND
    }

    fn reconcile(
        self: Arc<Self>,
        object: Arc<DynamicObject>,
    ) -> impl std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        self.reconcile_one(object)
    }

    fn waits_for_change(&self, error: &ReconcileError) -> bool {
        matches!(error, ReconcileError::Spec(_))
    }

    /// Every FederationDomain on `All`; one whose key Secret or TLS Secret changed otherwise.
    fn uses_source(&self, object: &DynamicObject, event: &SourceEvent) -> bool {
        let SourceEvent::Changed(kind, changed) = event else {
            return true;
        };
        if *kind != SourceKind::Secret {
            return false;
        }
        let name = object.name_any();
        KeySecret::ALL.iter().any(|key| key.name(&name) == *changed)
            || object
                .data
                .pointer("/spec/tls/secretName")
                .and_then(serde_json::Value::as_str)
                == Some(changed.as_str())
    }

    fn forget(&self, name: &str, uid: Option<&str>) {
        let mut state = self.state();
        state.seen.remove(name);
        let matches = state
            .served
            .get(name)
            .is_some_and(|served| uid.is_none_or(|uid| served.uid.as_deref() == Some(uid)));
        if matches {
            state.served.remove(name);
            self.publish(&state);
        }
        drop(state);
        self.pending.push(SourceEvent::All);
    }

    fn retain(&self, names: &HashSet<String>) {
        let mut state = self.state();
        state.seen.retain(|name, _| names.contains(name));
        let before = state.served.len();
        state.served.retain(|name, _| names.contains(name));
        if state.served.len() != before {
            self.publish(&state);
        }
    }
}
