//! The identity providers ready to serve logins, as the identity-provider reconcilers build them
//! and the FederationDomain reconciler reads them: by kind and name, the upstream last built from
//! a working configuration. A change here re-reconciles every FederationDomain (their conditions
//! and the upstreams they serve depend on it).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use selkie_kube::reconcile::{PendingSources, SourceEvent};

use crate::idp::Upstream;

/// See the module documentation.
pub(crate) struct Upstreams {
    ready: Mutex<HashMap<(String, String), Arc<Upstream>>>,
    /// The FederationDomain reconciler's source changes.
    federation_domains: Arc<PendingSources>,
}

impl Upstreams {
    /// No upstream yet; changes are told to `federation_domains`.
    pub(crate) fn new(federation_domains: Arc<PendingSources>) -> Self {
        Self {
            ready: Mutex::default(),
            federation_domains,
        }
    }

    fn ready(&self) -> MutexGuard<'_, HashMap<(String, String), Arc<Upstream>>> {
        // Every change is one insert or remove: a poisoned lock still holds consistent data.
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ready upstreams now.
    pub(crate) fn snapshot(&self) -> HashMap<(String, String), Arc<Upstream>> {
        self.ready().clone()
    }

    /// Serves `upstream` for `kind`/`name`; tells the FederationDomains unless it is the very one
    /// already served.
    pub(crate) fn serve(&self, kind: &str, name: &str, upstream: Arc<Upstream>) {
        let previous = self
            .ready()
            .insert((kind.to_string(), name.to_string()), upstream.clone());
        if !previous.is_some_and(|previous| Arc::ptr_eq(&previous, &upstream)) {
            self.federation_domains.push(SourceEvent::All);
        }
    }

    /// Stops serving `kind`/`name` (deleted; if `uid` is given, only when it is that object's).
    pub(crate) fn forget(&self, kind: &str, name: &str, uid: Option<&str>) {
        let key = (kind.to_string(), name.to_string());
        {
            let mut ready = self.ready();
            if ready
                .get(&key)
                .is_some_and(|upstream| uid.is_none_or(|uid| upstream.resource_uid() == uid))
            {
                ready.remove(&key);
            }
        }
        // Its FederationDomains' conditions change even when nothing was served.
        self.federation_domains.push(SourceEvent::All);
    }

    /// Keeps of `kind` only the upstreams named in `names` (after a re-list).
    pub(crate) fn retain(&self, kind: &str, names: &HashSet<String>) {
        let changed = {
            let mut ready = self.ready();
            let before = ready.len();
            ready.retain(|(k, name), _| k != kind || names.contains(name));
            ready.len() != before
        };
        if changed {
            self.federation_domains.push(SourceEvent::All);
        }
    }

    /// Tells the FederationDomains that an identity provider appeared (its existence matters to
    /// their conditions even before anything is served).
    pub(crate) fn appeared(&self) {
        self.federation_domains.push(SourceEvent::All);
    }
}
