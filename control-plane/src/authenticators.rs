//! The JWTAuthenticator and WebhookAuthenticator reconcilers: they validate each custom resource as
//! Pinniped does, report the result in its status (`phase` + conditions, see [`selkie_kube::conditions`])
//! and publish the valid authenticators as [`Published::chain`](crate::published::Published): JWT
//! authenticators first, then webhooks, each kind sorted by name, each named after its CR.
//!
//! [`run`] watches both kinds (cluster-scoped, under the installation's API group suffix) and the
//! Secrets and ConfigMaps of the Concierge's namespace that a `spec.tls.certificateAuthorityDataSource`
//! names; a change to such an object re-validates the authenticators that use it.
//!
//! Rules:
//! * every replica reconciles and publishes; only the leader (`*leader.borrow()`) writes
//!   statuses, and only when they changed; becoming leader re-reconciles everything;
//! * an invalid CR never replaces a working configuration: a CR updated to a spec that fails keeps
//!   serving its last valid form while its status says `Error` and why; a deleted CR leaves the
//!   chain at once;
//! * a spec and CA bundle that are already served are not probed again (Pinniped's choice: the
//!   probes catch configuration mistakes, not outages);
//! * network failures (issuer or webhook unreachable, key set unavailable) are retried with an
//!   exponential backoff (0.5 s doubling up to 60 s), so a recovering issuer turns Ready without
//!   any change to the CR; configuration mistakes wait for a change;
//! * each CR is reconciled on its own task, so a slow issuer never delays the others.
//!
//! Pinniped removes an authenticator from its cache as soon as a new spec fails; Selkie keeps the
//! last valid form (DESIGN.md: an invalid CR never replaces a good snapshot).

mod jwt;
mod webhook;

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    api::{Api, DynamicObject},
    core::ApiResource,
    runtime::{
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
    Client, ResourceExt,
};
use selkie_api::authentication::{
    JWTAuthenticator, JWTAuthenticatorSpec, Phase, WebhookAuthenticator, WebhookAuthenticatorSpec,
};
use selkie_filters::chain::{Chain, TokenAuthenticator};
use selkie_kube::{
    conditions::{self, Check},
    reconcile::{self, watch_sources, PendingSources, Reconciler, SourceEvent, SourceKind},
    tls_spec::{self, CaSources},
};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::{config::ControlPlaneConfig, published::Publisher};

/// How often a healthy CR is reconciled again without any event (cheap: nothing is probed).
const RESYNC: Duration = Duration::from_secs(600);
/// The field manager of status writes.
const FIELD_MANAGER: &str = "selkie-control-plane";

/// Why [`run`] stopped. It runs until dropped, so this only happens when a watch ends, which
/// kube's watchers (retrying with backoff) never do on their own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthenticatorsError {
    /// The watch of this kind of object ended.
    #[error("the watch of {0} objects ended")]
    WatchEnded(&'static str),
}

/// Runs the authenticator reconcilers until dropped: watches JWTAuthenticators and
/// WebhookAuthenticators (group `authentication.concierge.<apiGroupSuffix>`) and the Secrets and
/// ConfigMaps of `config.namespace`, publishes the valid authenticators through `publisher`
/// (`Published.chain`), and writes statuses while `*leader.borrow()` is true. Needs list and
/// watch on both kinds, patch on their `status`, and list and watch on Secrets and ConfigMaps
/// in the namespace. Watch failures (a CRD not installed yet, RBAC, the apiserver down) are
/// logged and retried with backoff; see the module documentation for everything else.
pub async fn run(
    client: Client,
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    leader: watch::Receiver<bool>,
) -> Result<(), AuthenticatorsError> {
    let namespace = config.namespace.clone();
    let (secrets, secrets_writer) = reflector::store::<Secret>();
    let (config_maps, config_maps_writer) = reflector::store::<ConfigMap>();
    let shared = Arc::new(Shared {
        namespace: namespace.clone(),
        publisher,
        leader: leader.clone(),
        secrets,
        config_maps,
        state: Mutex::new(State::default()),
    });
    let jwt_sources = Arc::new(PendingSources::default());
    let webhook_sources = Arc::new(PendingSources::default());
    let (jwt_source_events, webhook_source_events) = (jwt_sources.clone(), webhook_sources.clone());
    let (jwt, jwt_writer) = KindContext::new(
        Kind::Jwt,
        config.api_resource::<JWTAuthenticator>(),
        &client,
        &shared,
    );
    let (webhook, webhook_writer) = KindContext::new(
        Kind::Webhook,
        config.api_resource::<WebhookAuthenticator>(),
        &client,
        &shared,
    );
    let senders = vec![jwt_sources, webhook_sources];
    tokio::select! {
        () = watch_sources(
            Api::<Secret>::namespaced(client.clone(), &namespace),
            watcher::Config::default(),
            secrets_writer,
            SourceKind::Secret,
            senders.clone(),
        ) => Err(AuthenticatorsError::WatchEnded("Secret")),
        () = watch_sources(
            Api::<ConfigMap>::namespaced(client.clone(), &namespace),
            watcher::Config::default(),
            config_maps_writer,
            SourceKind::ConfigMap,
            senders,
        ) => Err(AuthenticatorsError::WatchEnded("ConfigMap")),
        () = async {
            mark_loaded_after_first_evaluation([jwt.clone(), webhook.clone()], shared.clone()).await;
            std::future::pending::<()>().await
        } => Err(AuthenticatorsError::WatchEnded("the first evaluation")),
        () = reconcile::run(jwt.clone(), jwt.api.clone(), jwt.resource.clone(), jwt_writer, jwt_source_events, leader.clone()) => Err(AuthenticatorsError::WatchEnded("JWTAuthenticator")),
        () = reconcile::run(webhook.clone(), webhook.api.clone(), webhook.resource.clone(), webhook_writer, webhook_source_events, leader) => Err(AuthenticatorsError::WatchEnded("WebhookAuthenticator")),
    }
}

/// The two kinds; JWT authenticators come first in the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Jwt,
    Webhook,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Jwt => "JWTAuthenticator",
            Kind::Webhook => "WebhookAuthenticator",
        }
    }
}

/// What one evaluation of a CR produced.
pub(crate) struct Evaluation {
    /// The conditions, in Pinniped's order, without `Ready`.
    pub(crate) checks: Vec<Check>,
    /// A new authenticator, when the CR is valid and not already served in this form.
    pub(crate) built: Option<TokenAuthenticator>,
    /// Whether a transient (network) failure should be retried with backoff.
    pub(crate) retry: bool,
}

impl Evaluation {
    /// Valid and already served: nothing to publish.
    pub(crate) fn unchanged(checks: Vec<Check>) -> Self {
        Self {
            checks,
            built: None,
            retry: false,
        }
    }

    /// A configuration mistake: nothing to publish, nothing to retry until the CR changes.
    pub(crate) fn invalid(checks: Vec<Check>) -> Self {
        Self::unchanged(checks)
    }
}

/// What makes a served authenticator what it is: the object, its spec and the CA bundle it
/// trusts (which may come from a Secret or ConfigMap).
#[derive(Debug, Clone, PartialEq)]
struct Fingerprint {
    uid: String,
    spec: Value,
    ca_bundle_pem: Option<String>,
}

struct Served {
    fingerprint: Fingerprint,
    authenticator: TokenAuthenticator,
}

#[derive(Default)]
struct State {
    /// The authenticators in use, in chain order: by kind, then by name.
    served: BTreeMap<(Kind, String), Served>,
    /// Every object (kind, name, uid) evaluated at least once, whatever the outcome.
    evaluated: std::collections::BTreeSet<(Kind, String, String)>,
}

/// How long the first evaluation of the authenticators present at start may hold readiness back
/// (an issuer that does not answer is evaluated, as unavailable, within its own timeouts).
const INITIAL_LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Sets [`Published::authenticators_loaded`](crate::published::Published) once every object the
/// first listings of both kinds found has been evaluated, or after [`INITIAL_LOAD_TIMEOUT`].
async fn mark_loaded_after_first_evaluation(kinds: [Arc<KindContext>; 2], shared: Arc<Shared>) {
    let first = async {
        for kind in &kinds {
            let _ = kind.store.wait_until_ready().await;
        }
        let present: Vec<(Kind, String, String)> = kinds
            .iter()
            .flat_map(|kind| {
                kind.store.state().into_iter().map(move |object| {
                    (
                        kind.kind,
                        object.name_any(),
                        object.metadata.uid.clone().unwrap_or_default(),
                    )
                })
            })
            .collect();
        loop {
            if present.iter().all(|key| shared.state().evaluated.contains(key)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(INITIAL_LOAD_TIMEOUT, first).await.is_err() {
        tracing::warn!("not every authenticator was evaluated within {INITIAL_LOAD_TIMEOUT:?} of the start; ready anyway");
    }
    shared.publisher.update(|published| {
        let changed = !published.authenticators_loaded;
        published.authenticators_loaded = true;
        changed
    });
}

struct Shared {
    namespace: String,
    publisher: Publisher,
    leader: watch::Receiver<bool>,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every change is one insert or
        // remove), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes the chain of what `state` serves, unless it is already the published one.
    fn publish(&self, state: &State) {
        let authenticators: Vec<TokenAuthenticator> = state
            .served
            .values()
            .map(|served| served.authenticator.clone())
            .collect();
        self.publisher.update(|published| {
            if same_authenticators(published.chain.token_authenticators(), &authenticators) {
                return false;
            }
            let names: Vec<&str> = authenticators.iter().map(|a| &**a.name()).collect();
            tracing::info!(authenticators = ?names, "publishing the authenticator chain");
            published.chain = Chain::new(authenticators);
            true
        });
    }

    /// Whether the CR `key` is served in exactly the form `fingerprint`.
    fn is_serving(&self, key: &(Kind, String), fingerprint: &Fingerprint) -> bool {
        self.state()
            .served
            .get(key)
            .is_some_and(|served| &served.fingerprint == fingerprint)
    }

    /// Removes the CR `name` of `kind` (if `uid` is given, only that object) and publishes.
    fn forget(&self, kind: Kind, name: &str, uid: Option<&str>) {
        let mut state = self.state();
        let key = (kind, name.to_string());
        let matches = state
            .served
            .get(&key)
            .is_some_and(|served| uid.is_none_or(|uid| served.fingerprint.uid == uid));
        if matches {
            state.served.remove(&key);
            tracing::info!(kind = kind.name(), name, "authenticator deleted");
            self.publish(&state);
        }
    }

    /// Removes every CR of `kind` whose name is not in `names` (after a re-list) and publishes.
    fn retain(&self, kind: Kind, names: &HashSet<String>) {
        let mut state = self.state();
        let before = state.served.len();
        state
            .served
            .retain(|(k, name), _| *k != kind || names.contains(name));
        if state.served.len() != before {
            self.publish(&state);
        }
    }
}

/// Whether two lists hold the very same authenticators (shared, not merely equal), in order.
fn same_authenticators(a: &[TokenAuthenticator], b: &[TokenAuthenticator]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|pair| match pair {
            (TokenAuthenticator::Jwt(x), TokenAuthenticator::Jwt(y)) => Arc::ptr_eq(x, y),
            (TokenAuthenticator::TokenReview(x), TokenAuthenticator::TokenReview(y)) => Arc::ptr_eq(x, y),
            _ => false,
        })
}

/// The watched Secrets and ConfigMaps, as [`CaSources`].
struct StoreSources<'a>(&'a Shared);

impl CaSources for StoreSources<'_> {
    fn secret(&self, name: &str) -> Option<Arc<Secret>> {
        self.0
            .secrets
            .get(&ObjectRef::new(name).within(&self.0.namespace))
    }

    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
        self.0
            .config_maps
            .get(&ObjectRef::new(name).within(&self.0.namespace))
    }
}

/// No Secrets or ConfigMaps at all (unit tests).
#[cfg(test)]
pub(crate) struct NoSources;

#[cfg(test)]
impl CaSources for NoSources {
    fn secret(&self, _: &str) -> Option<Arc<Secret>> {
        None
    }

    fn config_map(&self, _: &str) -> Option<Arc<ConfigMap>> {
        None
    }
}

/// Whether the CR `object` reads its CA bundle from the source `event` names.
fn uses_source(object: &DynamicObject, event: &SourceEvent) -> bool {
    let Some(source) = object.data.pointer("/spec/tls/certificateAuthorityDataSource") else {
        return false;
    };
    match event {
        SourceEvent::All => true,
        SourceEvent::Changed(kind, name) => {
            source.get("kind").and_then(Value::as_str) == Some(kind.as_str())
                && source.get("name").and_then(Value::as_str) == Some(name.as_str())
        }
    }
}

/// One kind's reconciler.
struct KindContext {
    kind: Kind,
    resource: ApiResource,
    api: Api<DynamicObject>,
    store: Store<DynamicObject>,
    shared: Arc<Shared>,
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    /// The object's spec does not deserialize (the CRD's schema normally prevents this).
    #[error("the spec cannot be read: {0}")]
    Spec(String),
    /// A probe failed for a reason that may go away (recorded in the status).
    #[error("{0}")]
    Unavailable(String),
    /// The status could not be written.
    #[error("writing the status failed: {0}")]
    Status(#[source] kube::Error),
}

impl KindContext {
    /// The context and the writer of its object cache.
    fn new(
        kind: Kind,
        resource: ApiResource,
        client: &Client,
        shared: &Arc<Shared>,
    ) -> (Arc<Self>, reflector::store::Writer<DynamicObject>) {
        let writer = reflector::store::Writer::new(resource.clone());
        let context = Arc::new(Self {
            kind,
            api: Api::all_with(client.clone(), &resource),
            store: writer.as_reader(),
            resource,
            shared: shared.clone(),
        });
        (context, writer)
    }

    fn object_ref(&self, object: &DynamicObject) -> ObjectRef<DynamicObject> {
        ObjectRef::from_obj_with(object, self.resource.clone())
    }

    /// One pass over `object`; see the module documentation.
    async fn evaluate_and_serve(
        self: Arc<Self>,
        object: Arc<DynamicObject>,
    ) -> Result<Action, ReconcileError> {
        let shared = &self.shared;
        // Reading a CA source before the first listing would report it missing.
        let _ = shared.secrets.wait_until_ready().await;
        let _ = shared.config_maps.wait_until_ready().await;

        let name = object.name_any();
        let uid = object.metadata.uid.clone().unwrap_or_default();
        let key = (self.kind, name.clone());
        let spec = object.data.get("spec").cloned().unwrap_or(Value::Null);
        let sources = StoreSources(shared);
        let (evaluation, fingerprint) = match self.kind {
            Kind::Jwt => {
                let parsed: JWTAuthenticatorSpec =
                    serde_json::from_value(spec.clone()).map_err(|e| ReconcileError::Spec(e.to_string()))?;
                let tls = tls_spec::validate(parsed.tls.as_ref(), &shared.namespace, &sources);
                let fingerprint = Fingerprint {
                    uid: uid.clone(),
                    spec,
                    ca_bundle_pem: tls.ca_bundle_pem.clone(),
                };
                let serving = shared.is_serving(&key, &fingerprint);
                (jwt::evaluate(&name, &parsed, &tls, serving).await, fingerprint)
            }
            Kind::Webhook => {
                let parsed: WebhookAuthenticatorSpec =
                    serde_json::from_value(spec.clone()).map_err(|e| ReconcileError::Spec(e.to_string()))?;
                let tls = tls_spec::validate(parsed.tls.as_ref(), &shared.namespace, &sources);
                let fingerprint = Fingerprint {
                    uid: uid.clone(),
                    spec,
                    ca_bundle_pem: tls.ca_bundle_pem.clone(),
                };
                let serving = shared.is_serving(&key, &fingerprint);
                (
                    webhook::evaluate(&name, &parsed, &tls, serving).await,
                    fingerprint,
                )
            }
        };
        self.serve(&key, &object, fingerprint, &evaluation);
        self.write_status(&object, &evaluation.checks).await?;
        if evaluation.retry {
            let failed: Vec<String> = evaluation
                .checks
                .iter()
                .filter(|check| check.status == conditions::Status::False)
                .map(|check| format!("{}: {}", check.type_, check.message))
                .collect();
            return Err(ReconcileError::Unavailable(failed.join("; ")));
        }
        Ok(Action::requeue(RESYNC))
    }

    /// Updates what is served for `object` after an evaluation and publishes if that changed.
    fn serve(
        &self,
        key: &(Kind, String),
        object: &DynamicObject,
        fingerprint: Fingerprint,
        evaluation: &Evaluation,
    ) {
        let shared = &self.shared;
        let mut state = shared.state();
        state
            .evaluated
            .insert((self.kind, key.1.clone(), fingerprint.uid.clone()));
        let mut changed = false;
        // A CR deleted and created again under the same name starts from nothing.
        if state
            .served
            .get(key)
            .is_some_and(|served| served.fingerprint.uid != fingerprint.uid)
        {
            state.served.remove(key);
            changed = true;
        }
        if let (false, Some(authenticator)) = (conditions::had_error(&evaluation.checks), &evaluation.built) {
            // Checked under the lock the deletion handler takes: a CR deleted while it was being
            // probed is not published again.
            let current = self.store.get(&self.object_ref(object));
            if current.is_some_and(|current| current.metadata.uid == object.metadata.uid) {
                tracing::info!(kind = self.kind.name(), name = %key.1, "authenticator validated");
                state.served.insert(
                    key.clone(),
                    Served {
                        fingerprint,
                        authenticator: authenticator.clone(),
                    },
                );
                changed = true;
            }
        }
        if changed {
            shared.publish(&state);
        }
    }

    /// Writes `checks` (plus `Ready`) and the phase into the status, if this replica leads and
    /// anything changed ([`reconcile::write_status`]).
    async fn write_status(&self, object: &DynamicObject, checks: &[Check]) -> Result<(), ReconcileError> {
        let existing: Vec<Condition> = object
            .data
            .pointer("/status/conditions")
            .and_then(|conditions| serde_json::from_value(conditions.clone()).ok())
            .unwrap_or_default();
        let (phase, merged): (Phase, _) =
            conditions::with_ready(self.kind.name(), checks, &existing, object.metadata.generation);
        let status = json!({"conditions": merged, "phase": phase});
        let leading = *self.shared.leader.borrow();
        reconcile::write_status(&self.api, object, &status, leading, FIELD_MANAGER)
            .await
            .map_err(ReconcileError::Status)?;
        Ok(())
    }
}

impl Reconciler for KindContext {
    type Error = ReconcileError;

    fn kind(&self) -> &'static str {
        self.kind.name()
    }

    fn reconcile(
        self: Arc<Self>,
        object: Arc<DynamicObject>,
    ) -> impl std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        self.evaluate_and_serve(object)
    }

    fn waits_for_change(&self, error: &ReconcileError) -> bool {
        matches!(error, ReconcileError::Spec(_))
    }

    fn uses_source(&self, object: &DynamicObject, event: &SourceEvent) -> bool {
        uses_source(object, event)
    }

    fn forget(&self, name: &str, uid: Option<&str>) {
        self.shared.forget(self.kind, name, uid);
    }

    fn retain(&self, names: &HashSet<String>) {
        self.shared.retain(self.kind, names);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crs_are_related_to_the_sources_they_name() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
            "kind": "JWTAuthenticator",
            "metadata": {"name": "a"},
            "spec": {"issuer": "https://x", "audience": "a", "tls": {
                "certificateAuthorityDataSource": {"kind": "Secret", "name": "ca", "key": "ca.crt"}
            }},
        }))
        .unwrap();
        assert!(uses_source(
            &object,
            &SourceEvent::Changed(SourceKind::Secret, "ca".into())
        ));
        assert!(!uses_source(
            &object,
            &SourceEvent::Changed(SourceKind::ConfigMap, "ca".into())
        ));
        assert!(!uses_source(
            &object,
            &SourceEvent::Changed(SourceKind::Secret, "other".into())
        ));
        assert!(uses_source(&object, &SourceEvent::All));

        let inline: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
            "kind": "JWTAuthenticator",
            "metadata": {"name": "b"},
            "spec": {"issuer": "https://x", "audience": "a"},
        }))
        .unwrap();
        assert!(!uses_source(&inline, &SourceEvent::All));
    }

    #[test]
    fn only_the_very_same_authenticators_are_the_same_chain() {
        let build = |name: &str| {
            TokenAuthenticator::Jwt(Arc::new(
                selkie_filters::jwt::JwtAuthenticator::new(selkie_filters::jwt::JwtConfig::new(
                    name,
                    "https://issuer.example.com",
                    "aud",
                ))
                .unwrap(),
            ))
        };
        let a = build("a");
        let b = build("a");
        let one = std::slice::from_ref(&a);
        assert!(same_authenticators(one, one));
        assert!(
            !same_authenticators(one, &[b]),
            "equal configuration, another instance"
        );
        assert!(!same_authenticators(one, &[]));
    }
}
