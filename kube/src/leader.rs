//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several replicas exactly one
//! writes shared objects (statuses, generated Secrets, Services) while every replica serves.
//!
//! [`run`] tries every [`RENEW_INTERVAL`] to take or renew the Lease its [`LeaseConfig`] names
//! (the Concierge's is `<prefix>-leader-election` in its namespace) (optimistic concurrency on its `resourceVersion`, so two replicas
//! never both win) and reports the outcome through a `watch` channel. A replica whose renewals
//! fail for longer than [`LEASE_DURATION`] stops calling itself leader before another can take
//! over; a Lease whose holder stopped renewing is taken over once it has expired.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client,
};
use tokio::sync::watch;

/// Which Lease, and who this replica is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name), written as the holder.
    pub identity: String,
}

/// How long a Lease is valid after its last renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the Lease is renewed or tried.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(2);

/// What one attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease now.
    Holding,
    /// Another replica holds a valid Lease.
    HeldElsewhere,
}

/// Whether `lease` is held by someone other than `identity` and still valid at `now`.
fn held_by_other(lease: &LeaseSpec, identity: &str, now: Timestamp) -> bool {
    let holder = lease.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return false;
    }
    let duration = i64::from(lease.lease_duration_seconds.unwrap_or(0));
    match &lease.renew_time {
        Some(MicroTime(renewed)) => now.duration_since(*renewed) < SignedDuration::from_secs(duration),
        None => false,
    }
}

/// Makes `spec` (a Lease no one else validly holds) `identity`'s, renewed at `now` for
/// `duration_seconds`. Returns whether it changed hands, which counts one more transition; the
/// count is whatever the Lease said (anyone who may write it may write any number), so it
/// saturates at `i32::MAX` rather than overflowing.
fn claim(spec: &mut LeaseSpec, identity: &str, now: Timestamp, duration_seconds: i32) -> bool {
    let taken_over = spec.holder_identity.as_deref() != Some(identity);
    if taken_over {
        spec.holder_identity = Some(identity.to_string());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(duration_seconds);
    taken_over
}

async fn attempt(api: &Api<Lease>, name: &str, identity: &str) -> Result<Attempt, kube::Error> {
    let now = Timestamp::now();
    let duration_seconds = i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(15);
    match api.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(identity.to_string()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
            Ok(Attempt::Holding)
        }
        Some(mut lease) => {
            let mut spec = lease.spec.take().unwrap_or_default();
            if held_by_other(&spec, identity, now) {
                return Ok(Attempt::HeldElsewhere);
            }
            if claim(&mut spec, identity, now, duration_seconds) {
                tracing::info!(lease = name, "taking over the leader-election Lease");
            }
            lease.spec = Some(spec);
            // The resourceVersion read above makes this fail if another replica wrote in between.
            api.replace(name, &PostParams::default(), &lease).await?;
            Ok(Attempt::Holding)
        }
    }
}

/// Takes part in the election until dropped, sending `true` on `leader` while this replica
/// (`config.identity`) holds the Lease and `false` otherwise. Errors (kube-apiserver down,
/// conflicts) are retried; they turn a leader into a follower once its Lease could have expired.
pub async fn run(client: Client, config: &LeaseConfig, leader: watch::Sender<bool>) {
    let api = Api::<Lease>::namespaced(client, &config.namespace);
    let name = &config.name;
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        match attempt(&api, name, &config.identity).await {
            Ok(Attempt::Holding) => {
                last_renewal = tokio::time::Instant::now();
                if !*leader.borrow() {
                    tracing::info!(identity = %config.identity, "became the leader");
                }
                leader.send_if_modified(|current| !std::mem::replace(current, true));
            }
            Ok(Attempt::HeldElsewhere) => {
                if *leader.borrow() {
                    tracing::info!(identity = %config.identity, "another replica holds the Lease; no longer the leader");
                }
                leader.send_if_modified(|current| std::mem::replace(current, false));
            }
            Err(error) => {
                tracing::warn!(%error, "the leader-election Lease could not be renewed");
                if last_renewal.elapsed() >= LEASE_DURATION - RENEW_INTERVAL {
                    leader.send_if_modified(|current| std::mem::replace(current, false));
                }
            }
        }
        tokio::time::sleep(RENEW_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed_seconds_ago: i64) -> LeaseSpec {
        let now = Timestamp::now();
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_seconds_ago))),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_is_held_elsewhere_only_while_another_holder_renews_it() {
        let now = Timestamp::now();
        assert!(held_by_other(&spec("b", 3), "a", now));
        assert!(
            !held_by_other(&spec("b", 30), "a", now),
            "expired: may be taken over"
        );
        assert!(!held_by_other(&spec("a", 3), "a", now), "our own");
        assert!(!held_by_other(&spec("", 3), "a", now), "released");
    }

    #[test]
    fn taking_over_counts_a_transition_and_never_overflows_the_count() {
        let now = Timestamp::now();
        let mut expired = spec("b", 30);
        expired.lease_transitions = Some(i32::MAX);
        assert!(claim(&mut expired, "a", now, 15));
        assert_eq!(expired.holder_identity.as_deref(), Some("a"));
        assert_eq!(
            expired.lease_transitions,
            Some(i32::MAX),
            "saturated, not overflowed"
        );
        assert_eq!(expired.renew_time, Some(MicroTime(now)));
        assert_eq!(expired.acquire_time, Some(MicroTime(now)));

        let mut fresh = spec("b", 30);
        assert!(claim(&mut fresh, "a", now, 15));
        assert_eq!(fresh.lease_transitions, Some(1));
        // Renewing our own Lease is no transition.
        assert!(!claim(&mut fresh, "a", now, 15));
        assert_eq!(fresh.lease_transitions, Some(1));
    }
}
