//! Checks of the controller that talk to other servers (a connection probe) and so run in tasks
//! of their own: a server that never answers must not hold up the computation of everything else.
//! Each check is known by a key (the object it checks) and what it was made from (its inputs):
//! it runs once per inputs, its outcome stands until the inputs change, and a failure stands for
//! a while before the check runs again.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// One check: its inputs and, once finished, its outcome and when it finished.
struct Entry<T, E> {
    made_from: String,
    outcome: Option<(Result<T, E>, Instant)>,
}

/// Checks run in the background, by key; a finished one wakes the controller's loop. A check
/// succeeds with a `T` or fails with an `E` (a message unless said otherwise).
pub(crate) struct Background<T, E = String> {
    checks: Arc<Mutex<HashMap<String, Entry<T, E>>>>,
    wake: Arc<Notify>,
}

impl<T: Clone + Send + 'static, E: Clone + Send + 'static> Background<T, E> {
    /// No checks yet; finished ones notify `wake`.
    pub(crate) fn new(wake: Arc<Notify>) -> Self {
        Self {
            checks: Arc::default(),
            wake,
        }
    }

    /// The outcome of the check `key` made from `made_from`: `Some` once it has finished, `None`
    /// while it runs. Starts `check` in a task when no check of these inputs has run, or the
    /// last one failed more than `retry` ago (its failure is returned until then). A check of
    /// other inputs still running is forgotten: its outcome is dropped when it finishes.
    pub(crate) fn poll<F>(
        &self,
        key: &str,
        made_from: &str,
        retry: Duration,
        check: F,
    ) -> Option<Result<T, E>>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
    {
        let mut checks = self.checks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = checks.get(key).filter(|entry| entry.made_from == made_from) {
            match &entry.outcome {
                None => return None,
                Some((Ok(found), _)) => return Some(Ok(found.clone())),
                Some((Err(reason), at)) if at.elapsed() < retry => return Some(Err(reason.clone())),
                Some(_) => {}
            }
        }
        checks.insert(
            key.to_string(),
            Entry {
                made_from: made_from.to_string(),
                outcome: None,
            },
        );
        let (all, wake) = (self.checks.clone(), self.wake.clone());
        let (key, made_from) = (key.to_string(), made_from.to_string());
        tokio::spawn(async move {
            let outcome = check.await;
            if let Some(entry) = all
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(&key)
                .filter(|entry| entry.made_from == made_from)
            {
                entry.outcome = Some((outcome, Instant::now()));
            }
            wake.notify_one();
        });
        None
    }
}

impl<T, E> Background<T, E> {
    /// Forgets the checks whose key `keep` refuses (their objects are gone); a running one's
    /// outcome is dropped when it finishes.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.checks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls until the check has an outcome (a finished check wakes `wake`).
    async fn settled(
        background: &Background<u32>,
        wake: &Notify,
        made_from: &str,
        retry: Duration,
        value: Result<u32, String>,
    ) -> Result<u32, String> {
        loop {
            let notified = wake.notified();
            let value = value.clone();
            if let Some(outcome) = background.poll("k", made_from, retry, async move { value }) {
                return outcome;
            }
            tokio::time::timeout(Duration::from_secs(5), notified)
                .await
                .expect("the check finishes and wakes the loop");
        }
    }

    #[tokio::test]
    async fn a_check_runs_once_per_inputs_and_a_failure_is_retried_later() {
        let wake = Arc::new(Notify::new());
        let background = Background::new(wake.clone());
        let long = Duration::from_secs(3600);
        assert_eq!(settled(&background, &wake, "a", long, Ok(1)).await, Ok(1));
        // The same inputs: the stored outcome, not a new run.
        assert_eq!(background.poll("k", "a", long, async { Ok(2) }), Some(Ok(1)));
        // New inputs: a new run.
        assert_eq!(
            settled(&background, &wake, "b", long, Err("down".into())).await,
            Err("down".into())
        );
        // A failure stands until `retry` has passed...
        assert_eq!(
            background.poll("k", "b", long, async { Ok(3) }),
            Some(Err("down".into()))
        );
        // ... then the check runs again.
        assert_eq!(
            settled(&background, &wake, "b", Duration::ZERO, Ok(4)).await,
            Ok(4)
        );
    }
}
