//! Observing that something does *not* happen, without sleeping and then looking: a watch on one
//! object, started before the action, that reports every write it sees the moment it arrives.
//!
//! [`ObjectWatch::start`] opens a kube-apiserver watch on one named object from the current
//! resource version. [`ObjectWatch::expect_no_write`] then fails at the first write (create,
//! update, delete) that arrives within a window, and [`ObjectWatch::writes`] lists what was seen
//! so far, for checks such as "every write kept the same holder".

use std::{
    fmt::Debug,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::StreamExt as _;
use kube::{
    api::{ListParams, WatchEvent, WatchParams},
    Api, Resource,
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::HarnessError;

/// One write seen by an [`ObjectWatch`].
#[derive(Debug, Clone)]
pub enum Write<K> {
    /// The object was created.
    Added(K),
    /// The object was changed.
    Modified(K),
    /// The object was deleted.
    Deleted(K),
}

impl<K> Write<K> {
    /// The object as the write left it (as it was, for a deletion).
    pub fn object(&self) -> &K {
        match self {
            Self::Added(object) | Self::Modified(object) | Self::Deleted(object) => object,
        }
    }
}

/// A watch on one object, collecting its writes in the background until dropped.
pub struct ObjectWatch<K> {
    name: String,
    writes: Arc<Mutex<Vec<Write<K>>>>,
    /// Woken at every write, and when the watch fails.
    seen: Arc<Notify>,
    failure: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Drop for ObjectWatch<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K> ObjectWatch<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    /// Starts watching the object `name` of `api` (which may not exist yet) from now on: writes
    /// made before this returns are not seen, every later one is.
    pub async fn start(api: Api<K>, name: &str) -> Result<Self, HarnessError> {
        let selector = format!("metadata.name={name}");
        let context = || format!("watching {name}");
        let list = api
            .list_metadata(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| HarnessError::kube(context(), e))?;
        let version = list.metadata.resource_version.unwrap_or_default();
        let params = WatchParams::default().fields(&selector).timeout(290);
        let mut stream = api
            .watch(&params, &version)
            .await
            .map_err(|e| HarnessError::kube(context(), e))?
            .boxed();
        let writes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Notify::new());
        let failure = Arc::new(Mutex::new(None));
        let task = {
            let (writes, seen, failure) = (writes.clone(), seen.clone(), failure.clone());
            tokio::spawn(async move {
                while let Some(event) = stream.next().await {
                    let write = match event {
                        Ok(WatchEvent::Added(object)) => Write::Added(object),
                        Ok(WatchEvent::Modified(object)) => Write::Modified(object),
                        Ok(WatchEvent::Deleted(object)) => Write::Deleted(object),
                        Ok(WatchEvent::Bookmark(_)) => continue,
                        Ok(WatchEvent::Error(error)) => {
                            *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
                            break;
                        }
                        Err(error) => {
                            *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
                            break;
                        }
                    };
                    writes.lock().unwrap_or_else(PoisonError::into_inner).push(write);
                    seen.notify_waiters();
                }
                failure
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert_with(|| "the watch ended".into());
                seen.notify_waiters();
            })
        };
        Ok(Self {
            name: name.to_string(),
            writes,
            seen,
            failure,
            task,
        })
    }

    /// The writes seen so far, oldest first.
    pub fn writes(&self) -> Vec<Write<K>> {
        self.writes.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Fails at once if the object was written since the watch started, or as soon as it is
    /// written within `window`; succeeds when `window` passes without a write. A watch that
    /// breaks is a failure too (it could no longer see writes).
    pub async fn expect_no_write(&self, window: Duration) -> Result<(), HarnessError> {
        let deadline = tokio::time::Instant::now() + window;
        loop {
            let notified = self.seen.notified();
            if let Some(write) = self.writes().first() {
                return Err(HarnessError::Unexpected(format!(
                    "{} was written: {write:?}",
                    self.name
                )));
            }
            if let Some(failure) = self
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
            {
                return Err(HarnessError::Unexpected(format!(
                    "the watch on {} broke: {failure}",
                    self.name
                )));
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(());
            }
        }
    }
}
