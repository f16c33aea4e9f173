//! The reconciler machinery both servers' custom resources run on: one kind's objects watched and
//! reconciled one by one on kube-runtime's `applier` (each object on its own task, so a slow
//! upstream never delays the others), with an error policy that backs off per object, and the
//! one status writer.
//!
//! A kind provides a [`Reconciler`]; [`run`] feeds it:
//! * every object whose identity or spec (UID, generation) changed — status-only updates, such as
//!   the reconciler's own writes, are not events;
//! * the objects that [`Reconciler::uses_source`] says read a Secret or ConfigMap that changed
//!   ([`watch_sources`] reports those changes into a [`PendingSources`], coalesced and bounded),
//!   or every object on [`SourceEvent::All`] (after a re-list, or when something every object
//!   depends on changed);
//! * every object again when this replica becomes the leader (only the leader writes statuses);
//! * an object again when its reconcile asked for it ([`Action::requeue`]) or failed: a failure
//!   the object must change to cure ([`Reconciler::waits_for_change`]) waits for that change,
//!   any other is retried after [`retry_delay`] (0.5 s doubling per consecutive failure up to
//!   60 s) — a status write that failed included.
//!
//! Deleted objects (and objects missing after a re-list) are handed to [`Reconciler::forget`] and
//! [`Reconciler::retain`] right away, not reconciled.

use std::{
    collections::{HashMap, HashSet},
    convert::Infallible,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{future, stream, Stream, StreamExt as _};
use kube::{
    api::{Api, DynamicObject, Patch, PatchParams},
    core::ApiResource,
    runtime::{
        controller::{self, applier, Action},
        reflector::{self, reflector, ObjectRef, Store},
        watcher::{self, watcher, Event},
        WatchStreamExt as _,
    },
    Resource, ResourceExt as _,
};
use serde_json::{json, Value};
use tokio::sync::watch;

/// The first retry delay after a failure; doubled per consecutive failure.
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest retry delay.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// The delay before retry number `failures` (1-based): [`FIRST_RETRY`] doubling up to
/// [`MAX_RETRY`].
pub fn retry_delay(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    FIRST_RETRY.saturating_mul(factor).min(MAX_RETRY)
}

/// One kind of custom resource, reconciled object by object by [`run`].
pub trait Reconciler: Send + Sync + 'static {
    /// Why a reconcile failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The kind's name, for logs.
    fn kind(&self) -> &'static str;

    /// One pass over `object` (the cached object as last watched): validate, build, publish,
    /// write the status. `Ok` says when to look again without an event; an error is retried per
    /// the error policy (see the module documentation).
    fn reconcile(
        self: Arc<Self>,
        object: Arc<DynamicObject>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send + 'static;

    /// Whether `error` needs a change of the object to go away (its spec cannot be read): then
    /// the object is not retried until it changes.
    fn waits_for_change(&self, error: &Self::Error) -> bool;

    /// Whether `object` reads the Secret or ConfigMap `event` names (every object that reads any,
    /// or every object at all, for [`SourceEvent::All`] — as the kind decides).
    fn uses_source(&self, object: &DynamicObject, event: &SourceEvent) -> bool;

    /// The object `name` was deleted (if `uid` is given, that object only): stop serving it.
    fn forget(&self, name: &str, uid: Option<&str>);

    /// After a re-list, the objects that exist are `names`: forget every other.
    fn retain(&self, names: &HashSet<String>);
}

/// Writes `status` (the fields of a status: `phase`, `conditions`, ...) into `object`'s status
/// subresource with a merge patch bound to the object's UID (an object created since under the
/// same name is not written), when `leading` and any field differs from the object's status.
/// `Ok(true)` when written; an error is the caller's to retry.
pub async fn write_status(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    status: &Value,
    leading: bool,
    field_manager: &str,
) -> Result<bool, kube::Error> {
    let current = object.data.get("status");
    let unchanged = status.as_object().is_some_and(|fields| {
        fields
            .iter()
            .all(|(name, value)| current.and_then(|current| current.get(name)) == Some(value))
    });
    if unchanged || !leading {
        return Ok(false);
    }
    let patch = json!({
        "metadata": {"uid": object.metadata.uid},
        "status": status,
    });
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(field_manager),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(true)
}

/// A change to an object custom resources may read: one Secret or ConfigMap, or (after a
/// re-list, or when something every object depends on changed) possibly any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    /// This one changed (or was deleted).
    Changed(SourceKind, String),
    /// Anything may have changed.
    All,
}

/// The kinds of objects custom resources read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

impl SourceKind {
    /// The kind's name, as `certificateAuthorityDataSource.kind` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Secret => "Secret",
            SourceKind::ConfigMap => "ConfigMap",
        }
    }
}

/// Most changed sources remembered by name for one reconciler; beyond that they collapse into
/// [`SourceEvent::All`] (every object using any source is looked at again).
pub const MAX_PENDING_SOURCES: usize = 1_024;

/// The source changes one reconciler has not taken yet, coalesced: a source that changes a
/// thousand times before the reconciler looks is one entry, and at most [`MAX_PENDING_SOURCES`]
/// names are kept before they collapse into "all". So a flood of Secret and ConfigMap events
/// costs bounded memory, and the last change is always acted on.
#[derive(Debug, Default)]
pub struct PendingSources {
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
    pub fn push(&self, event: SourceEvent) {
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

    /// The changes as a stream (a reconciler's queue, or any other consumer of them).
    pub fn events(self: Arc<Self>) -> impl Stream<Item = SourceEvent> + Send + 'static {
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

/// Keeps `writer`'s cache of `api` (objects of `kind`) current and tells every one of `senders`
/// which object changed. Runs until dropped; watch failures are logged and retried with backoff.
pub async fn watch_sources<K>(
    api: Api<K>,
    config: watcher::Config,
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
    reflector(writer, watcher(api, config).default_backoff())
        .for_each(|event| {
            let change = match event {
                Ok(Event::Apply(object) | Event::Delete(object)) => {
                    Some(SourceEvent::Changed(kind, object.name_any()))
                }
                Ok(Event::InitDone) => Some(SourceEvent::All),
                Ok(Event::Init | Event::InitApply(_)) => None,
                Err(error) => {
                    tracing::warn!(kind = kind.as_str(), %error, "watching sources failed; retrying");
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

/// What [`run`] keeps for one kind.
struct Runner<R> {
    reconciler: Arc<R>,
    resource: ApiResource,
    store: Store<DynamicObject>,
    /// Consecutive failures per object name, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl<R: Reconciler> Runner<R> {
    fn object_ref(&self, object: &DynamicObject) -> ObjectRef<DynamicObject> {
        ObjectRef::from_obj_with(object, self.resource.clone())
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn reconcile(self: Arc<Self>, object: Arc<DynamicObject>) -> Result<Action, R::Error> {
        let name = object.name_any();
        let action = self.reconciler.clone().reconcile(object).await?;
        self.failures().remove(&name);
        Ok(action)
    }

    fn error_policy(&self, object: &DynamicObject, error: &R::Error) -> Action {
        if self.reconciler.waits_for_change(error) {
            return Action::await_change();
        }
        let mut failures = self.failures();
        let count = failures.entry(object.name_any()).or_insert(0);
        *count = count.saturating_add(1);
        Action::requeue(retry_delay(*count))
    }
}

/// Watches `api`'s objects (of `resource`) into `writer` — whose reader the reconciler may hold —
/// and reconciles them with `reconciler` until dropped; see the module documentation for what
/// triggers a reconcile. `sources` carries the source changes for this kind (fed by
/// [`watch_sources`] or pushed by the caller); `leader` says whether this replica leads.
pub async fn run<R: Reconciler>(
    reconciler: Arc<R>,
    api: Api<DynamicObject>,
    resource: ApiResource,
    writer: reflector::store::Writer<DynamicObject>,
    sources: Arc<PendingSources>,
    leader: watch::Receiver<bool>,
) {
    let kind = reconciler.kind();
    let runner = Arc::new(Runner {
        reconciler,
        resource,
        store: writer.as_reader(),
        failures: Mutex::default(),
    });
    let queue = queue(&runner, api, writer, sources, leader);
    applier(
        |object, runner: Arc<Runner<R>>| Box::pin(runner.reconcile(object)),
        |object, error, runner: Arc<Runner<R>>| runner.error_policy(&object, error),
        runner.clone(),
        runner.store.clone(),
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

/// What to reconcile: see the module documentation.
fn queue<R: Reconciler>(
    runner: &Arc<Runner<R>>,
    api: Api<DynamicObject>,
    writer: reflector::store::Writer<DynamicObject>,
    sources: Arc<PendingSources>,
    leader: watch::Receiver<bool>,
) -> impl Stream<Item = Result<ObjectRef<DynamicObject>, Infallible>> + Send + 'static {
    let context = runner.clone();
    let mut seen: HashMap<String, (Option<String>, Option<i64>)> = HashMap::new();
    let mut listing: Option<HashSet<String>> = None;
    let objects = reflector(writer, watcher(api, watcher::Config::default()).default_backoff())
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
                    context.failures().remove(&name);
                    context.reconciler.forget(&name, object.metadata.uid.as_deref());
                }
                Ok(Event::Init) => listing = Some(HashSet::new()),
                Ok(Event::InitDone) => {
                    if let Some(names) = listing.take() {
                        seen.retain(|name, _| names.contains(name));
                        context.failures().retain(|name, _| names.contains(name));
                        context.reconciler.retain(&names);
                    }
                }
                Err(error) => {
                    tracing::warn!(kind = context.reconciler.kind(), %error, "watching failed; retrying");
                }
            }
            stream::iter(refs)
        })
        .flatten();

    let context = runner.clone();
    let related = sources.events().flat_map(move |event| {
        let refs: Vec<_> = context
            .store
            .state()
            .iter()
            .filter(|object| context.reconciler.uses_source(object, &event))
            .map(|object| context.object_ref(object))
            .collect();
        stream::iter(refs)
    });

    let context = runner.clone();
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

    #[test]
    fn a_status_is_unchanged_when_every_field_it_sets_is_already_there() {
        // write_status decides with this comparison before any request.
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "X", "metadata": {"name": "a"},
            "status": {"phase": "Ready", "conditions": [], "other": 1},
        }))
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            // An unreachable client: any request fails, so Ok(false) proves none was made.
            let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
            let client = kube::Client::try_from(config).unwrap();
            let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
            let api: Api<DynamicObject> = Api::all_with(client, &resource);
            let same = json!({"phase": "Ready", "conditions": []});
            assert!(!write_status(&api, &object, &same, true, "test").await.unwrap());
            let changed = json!({"phase": "Error", "conditions": []});
            assert!(
                !write_status(&api, &object, &changed, false, "test")
                    .await
                    .unwrap(),
                "not leading"
            );
            assert!(write_status(&api, &object, &changed, true, "test").await.is_err());
        });
    }
}
