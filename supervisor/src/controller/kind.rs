//! What every reconciler of the controller holds for its kind: the API and the watched cache of
//! its objects, and the status writing of the leader.

use std::{
    collections::HashSet,
    sync::{Mutex, PoisonError},
};

use kube::{
    api::{Api, DynamicObject},
    core::ApiResource,
    runtime::reflector::{store::Writer, Store},
    Client,
};
use selkie_kube::reconcile;
use serde::Serialize;
use tokio::sync::watch;

use crate::controller::sources::ReconcileError;

/// The field manager of the Supervisor's status writes.
const FIELD_MANAGER: &str = "selkie-supervisor";

/// One kind of object in the Supervisor's namespace, as its reconciler sees it.
pub(crate) struct Kind {
    pub(crate) resource: ApiResource,
    pub(crate) api: Api<DynamicObject>,
    /// The watched objects (filled by [`reconcile::run`] through the writer made with it).
    pub(crate) store: Store<DynamicObject>,
    leader: watch::Receiver<bool>,
    /// Names reconciled at least once, to tell when one appears.
    seen: Mutex<HashSet<String>>,
}

impl Kind {
    /// The kind of `resource` in `namespace`, and the writer of its cache (for
    /// [`reconcile::run`]); statuses are written while `leader` is true.
    pub(crate) fn new(
        resource: ApiResource,
        client: &Client,
        namespace: &str,
        leader: watch::Receiver<bool>,
    ) -> (Self, Writer<DynamicObject>) {
        let writer = Writer::new(resource.clone());
        let kind = Self {
            api: Api::namespaced_with(client.clone(), namespace, &resource),
            store: writer.as_reader(),
            resource,
            leader,
            seen: Mutex::default(),
        };
        (kind, writer)
    }

    /// Says whether this replica leads (for [`reconcile::run`]).
    pub(crate) fn leader(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Whether this replica leads (and so writes).
    pub(crate) fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    /// Writes `status` into `object`'s status when this replica leads and it changed
    /// ([`reconcile::write_status`]); a failure is [`ReconcileError::Write`], retried.
    pub(crate) async fn write_status<S: Serialize>(
        &self,
        object: &DynamicObject,
        status: &S,
    ) -> Result<(), ReconcileError> {
        let value = serde_json::to_value(status).map_err(|e| ReconcileError::Spec(e.to_string()))?;
        reconcile::write_status(&self.api, object, &value, self.leading(), FIELD_MANAGER)
            .await
            .map_err(ReconcileError::Write)?;
        Ok(())
    }

    /// Records that `name` was reconciled; `true` the first time.
    pub(crate) fn first_seen(&self, name: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string())
    }

    /// Forgets that `name` was seen.
    pub(crate) fn unseen(&self, name: &str) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// Keeps only `names` as seen.
    pub(crate) fn retain_seen(&self, names: &HashSet<String>) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name| names.contains(name));
    }
}
