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
    collections::{BTreeMap, HashMap, HashSet},
    convert::Infallible,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::{future, stream, Stream, StreamExt};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    api::{Api, DynamicObject, Patch, PatchParams},
    core::ApiResource,
    runtime::{
        controller::{self, applier, Action},
        reflector::{self, reflector, ObjectRef, Store},
        watcher::{self, watcher, Event},
        WatchStreamExt,
    },
    Client, Resource, ResourceExt,
};
use selkie_api::authentication::{
    JWTAuthenticator, JWTAuthenticatorSpec, Phase, WebhookAuthenticator, WebhookAuthenticatorSpec,
};
use selkie_filters::chain::{Chain, TokenAuthenticator};
use serde_json::{json, Value};
use tokio::sync::watch;

use selkie_kube::{
    conditions::{self, Check},
    tls_spec::{self, CaSources},
};

use crate::{config::ControlPlaneConfig, published::Publisher};

/// How often a healthy CR is reconciled again without any event (cheap: nothing is probed).
const RESYNC: Duration = Duration::from_secs(600);
/// The first retry delay after a failure; doubled per consecutive failure.
const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest retry delay.
const MAX_RETRY: Duration = Duration::from_secs(60);
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
            secrets_writer,
            SourceKind::Secret,
            senders.clone(),
        ) => Err(AuthenticatorsError::WatchEnded("Secret")),
        () = watch_sources(
            Api::<ConfigMap>::namespaced(client.clone(), &namespace),
            config_maps_writer,
            SourceKind::ConfigMap,
            senders,
        ) => Err(AuthenticatorsError::WatchEnded("ConfigMap")),
        () = jwt.run(jwt_writer, jwt_source_events, leader.clone()) => Err(AuthenticatorsError::WatchEnded("JWTAuthenticator")),
        () = webhook.run(webhook_writer, webhook_source_events, leader) => Err(AuthenticatorsError::WatchEnded("WebhookAuthenticator")),
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
    /// Consecutive failures per CR, for the retry backoff.
    failures: HashMap<(Kind, String), u32>,
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
        state.failures.remove(&key);
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
        state
            .failures
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

/// A change to the CA sources: one object, or (after a re-list) possibly any.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SourceEvent {
    Changed(SourceKind, String),
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SourceKind {
    Secret,
    ConfigMap,
}

/// Most changed CA sources remembered by name for one reconciler; beyond that they collapse into
/// [`SourceEvent::All`] (every CR using any source is looked at again).
const MAX_PENDING_SOURCES: usize = 1_024;

/// The CA-source changes one reconciler has not taken yet, coalesced: a source that changes a
/// thousand times before the reconciler looks is one entry, and at most
/// [`MAX_PENDING_SOURCES`] names are kept before they collapse into "all". So a flood of Secret
/// and ConfigMap events costs bounded memory, and the last change is always acted on.
#[derive(Debug, Default)]
struct PendingSources {
    pending: Mutex<Pending>,
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Pending {
    all: bool,
    sources: HashSet<(SourceKind, String)>,
}

impl PendingSources {
    /// Records `event` for the reconciler (never waits).
    fn push(&self, event: SourceEvent) {
        {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match event {
                SourceEvent::All => pending.all = true,
                SourceEvent::Changed(..) if pending.all => {}
                SourceEvent::Changed(kind, name) => {
                    pending.sources.insert((kind, name));
                    if pending.sources.len() > MAX_PENDING_SOURCES {
                        pending.sources.clear();
                        pending.all = true;
                    }
                }
            }
        }
        self.changed.notify_one();
    }

    /// Waits for changes and takes all of them: `[All]`, or one event per changed source.
    async fn take(&self) -> Vec<SourceEvent> {
        loop {
            {
                let mut pending = self
                    .pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if std::mem::take(&mut pending.all) {
                    pending.sources.clear();
                    return vec![SourceEvent::All];
                }
                if !pending.sources.is_empty() {
                    return pending
                        .sources
                        .drain()
                        .map(|(kind, name)| SourceEvent::Changed(kind, name))
                        .collect();
                }
            }
            // A push between the check above and this wait leaves a permit: no change is missed.
            self.changed.notified().await;
        }
    }

    /// The changes as a stream, for the reconciler's queue.
    fn events(self: Arc<Self>) -> impl Stream<Item = SourceEvent> + Send + 'static {
        stream::unfold(self, |pending| async move {
            let events = pending.take().await;
            Some((stream::iter(events), pending))
        })
        .flatten()
    }

    /// How many changes are waiting (for tests).
    #[cfg(test)]
    fn waiting(&self) -> (bool, usize) {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (pending.all, pending.sources.len())
    }
}

impl SourceKind {
    fn as_str(self) -> &'static str {
        match self {
            SourceKind::Secret => "Secret",
            SourceKind::ConfigMap => "ConfigMap",
        }
    }
}

/// Keeps `writer`'s cache of `api` current and tells every sender which object changed.
async fn watch_sources<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    kind: SourceKind,
    senders: Vec<Arc<PendingSources>>,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflector(writer, watcher(api, watcher::Config::default()).default_backoff())
        .for_each(|event| {
            let change = match event {
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    Some(SourceEvent::Changed(kind, object.name_any()))
                }
                Ok(Event::InitDone) => Some(SourceEvent::All),
                Ok(Event::Init | Event::InitApply(_)) => None,
                Err(error) => {
                    tracing::warn!(kind = kind.as_str(), %error, "watching CA sources failed; retrying");
                    None
                }
            };
            if let Some(change) = change {
                for sender in &senders {
                    sender.push(change.clone());
                }
            }
            future::ready(())
        })
        .await;
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

    /// Runs this kind's watch and reconciles until dropped.
    async fn run(
        self: Arc<Self>,
        writer: reflector::store::Writer<DynamicObject>,
        sources: Arc<PendingSources>,
        leader: watch::Receiver<bool>,
    ) {
        let queue = self.queue(writer, sources, leader);
        let kind = self.kind.name();
        applier(
            |object, context: Arc<KindContext>| Box::pin(context.reconcile(object)),
            |object, error, context: Arc<KindContext>| context.error_policy(&object, error),
            self.clone(),
            self.store.clone(),
            queue,
            controller::Config::default(),
        )
        .for_each(|result| {
            match result {
                Ok(_) => {}
                Err(controller::Error::ReconcilerFailed(error, object)) => {
                    tracing::info!(kind, name = %object.name, %error, "reconcile failed; retrying");
                }
                Err(controller::Error::ObjectNotFound(_)) => {}
                Err(error) => tracing::warn!(kind, %error, "reconciler error"),
            }
            future::ready(())
        })
        .await;
    }

    /// What to reconcile: the CRs whose spec (generation) or identity changed, the CRs using a
    /// CA source that changed, and every CR when this replica becomes leader. Deletions (and CRs
    /// gone after a re-list) are removed from the chain right here.
    fn queue(
        self: &Arc<Self>,
        writer: reflector::store::Writer<DynamicObject>,
        sources: Arc<PendingSources>,
        leader: watch::Receiver<bool>,
    ) -> impl Stream<Item = Result<ObjectRef<DynamicObject>, Infallible>> + Send + 'static {
        let context = self.clone();
        let mut seen: HashMap<String, (Option<String>, Option<i64>)> = HashMap::new();
        let mut listing: Option<HashSet<String>> = None;
        let objects = reflector(
            writer,
            watcher(self.api.clone(), watcher::Config::default()).default_backoff(),
        )
        .map(move |event| {
            let mut refs = Vec::new();
            match event {
                Ok(Event::Apply(object) | Event::InitApply(object)) => {
                    let name = object.name_any();
                    if let Some(listing) = &mut listing {
                        listing.insert(name.clone());
                    }
                    let identity = (object.metadata.uid.clone(), object.metadata.generation);
                    if seen.get(&name) != Some(&identity) {
                        seen.insert(name, identity);
                        refs.push(context.object_ref(&object));
                    }
                }
                Ok(Event::Delete(object)) => {
                    let name = object.name_any();
                    seen.remove(&name);
                    context
                        .shared
                        .forget(context.kind, &name, object.metadata.uid.as_deref());
                }
                Ok(Event::Init) => listing = Some(HashSet::new()),
                Ok(Event::InitDone) => {
                    if let Some(names) = listing.take() {
                        seen.retain(|name, _| names.contains(name));
                        context.shared.retain(context.kind, &names);
                    }
                }
                Err(error) => {
                    tracing::warn!(kind = context.kind.name(), %error, "watching authenticators failed; retrying");
                }
            }
            stream::iter(refs)
        })
        .flatten();

        let context = self.clone();
        let related = sources.events().flat_map(move |event| {
            let refs: Vec<_> = context
                .store
                .state()
                .iter()
                .filter(|object| uses_source(object, &event))
                .map(|object| context.object_ref(object))
                .collect();
            stream::iter(refs)
        });

        let context = self.clone();
        let became_leader = stream::unfold(leader, |mut leader| async move {
            leader.changed().await.ok()?;
            let is_leader = *leader.borrow_and_update();
            Some((is_leader, leader))
        })
        .filter(|is_leader| future::ready(*is_leader))
        .flat_map(move |_| {
            let refs: Vec<_> = context
                .store
                .state()
                .iter()
                .map(|object| context.object_ref(object))
                .collect();
            stream::iter(refs)
        });

        stream::select(objects, stream::select(related, became_leader)).map(Ok)
    }

    fn error_policy(&self, object: &DynamicObject, error: &ReconcileError) -> Action {
        if let ReconcileError::Spec(_) = error {
            return Action::await_change();
        }
        let mut state = self.shared.state();
        let failures = state.failures.entry((self.kind, object.name_any())).or_insert(0);
        *failures = failures.saturating_add(1);
        Action::requeue(retry_delay(*failures))
    }

    /// One pass over `object`; see the module documentation.
    async fn reconcile(self: Arc<Self>, object: Arc<DynamicObject>) -> Result<Action, ReconcileError> {
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
        shared.state().failures.remove(&key);
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
    /// anything changed.
    async fn write_status(&self, object: &DynamicObject, checks: &[Check]) -> Result<(), ReconcileError> {
        let status = object.data.get("status");
        let existing: Vec<Condition> = status
            .and_then(|status| status.get("conditions"))
            .and_then(|conditions| serde_json::from_value(conditions.clone()).ok())
            .unwrap_or_default();
        let existing_phase: Option<Phase> = status
            .and_then(|status| status.get("phase"))
            .and_then(|phase| serde_json::from_value(phase.clone()).ok());
        let (phase, merged) =
            conditions::with_ready(self.kind.name(), checks, &existing, object.metadata.generation);
        if merged == existing && existing_phase == Some(phase) {
            return Ok(());
        }
        if !*self.shared.leader.borrow() {
            return Ok(());
        }
        let patch = json!({
            // The object the status was computed for, not one created since under its name.
            "metadata": {"uid": object.metadata.uid},
            "status": {"conditions": merged, "phase": phase},
        });
        self.api
            .patch_status(
                &object.name_any(),
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(ReconcileError::Status)?;
        Ok(())
    }
}

/// The delay before retry number `failures` (1-based): 0.5 s doubling up to 60 s.
fn retry_delay(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    FIRST_RETRY.saturating_mul(factor).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_exponentially_up_to_a_minute() {
        assert_eq!(retry_delay(1), Duration::from_millis(500));
        assert_eq!(retry_delay(2), Duration::from_secs(1));
        assert_eq!(retry_delay(4), Duration::from_secs(4));
        assert_eq!(retry_delay(8), Duration::from_secs(60));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(60));
    }

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

#[cfg(test)]
mod pending_tests {
    use super::*;

    #[tokio::test]
    async fn a_flood_of_source_events_stays_bounded_and_the_last_change_is_taken() {
        let pending = PendingSources::default();
        // The same Secret changing over and over is one entry.
        for _ in 0..100_000 {
            pending.push(SourceEvent::Changed(SourceKind::Secret, "ca".into()));
        }
        assert_eq!(pending.waiting(), (false, 1));
        pending.push(SourceEvent::Changed(SourceKind::ConfigMap, "ca".into()));
        let mut taken = pending.take().await;
        taken.sort_by_key(|event| format!("{event:?}"));
        assert_eq!(
            taken,
            [
                SourceEvent::Changed(SourceKind::ConfigMap, "ca".into()),
                SourceEvent::Changed(SourceKind::Secret, "ca".into()),
            ]
        );
        assert_eq!(pending.waiting(), (false, 0));

        // Many distinct sources collapse into "all" beyond the bound.
        for n in 0..(MAX_PENDING_SOURCES + 10) {
            pending.push(SourceEvent::Changed(SourceKind::Secret, format!("ca-{n}")));
        }
        assert_eq!(pending.waiting(), (true, 0));
        pending.push(SourceEvent::Changed(SourceKind::Secret, "late".into()));
        assert_eq!(pending.waiting(), (true, 0), "covered by all");
        assert_eq!(pending.take().await, [SourceEvent::All]);
    }

    #[tokio::test]
    async fn a_waiting_reconciler_wakes_for_a_change() {
        let pending = Arc::new(PendingSources::default());
        let mut events = Box::pin(pending.clone().events());
        let waiter = tokio::spawn(async move { events.next().await });
        tokio::task::yield_now().await;
        pending.push(SourceEvent::Changed(SourceKind::Secret, "ca".into()));
        let event = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(event, Some(SourceEvent::Changed(SourceKind::Secret, "ca".into())));
    }
}
