//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several replicas exactly one
//! writes shared objects (statuses, generated Secrets, Services) while every replica serves.
//!
//! [`run`] tries every [`RENEW_INTERVAL`] to take or renew the Lease its [`LeaseConfig`] names
//! (the Concierge's is `<prefix>-leader-election` in its namespace) (optimistic concurrency on its `resourceVersion`, so two replicas
//! never both win) and reports the outcome through a `watch` channel. A replica whose renewals
//! fail for longer than [`LEASE_DURATION`] stops calling itself leader before another can take
//! over; a Lease whose holder stopped renewing is taken over once it has expired. Every attempt
//! has a deadline ([`ATTEMPT_TIMEOUT`], and never later than the moment the leader's Lease could
//! expire): a kube-apiserver that hangs or black-holes the request cannot keep a replica
//! believing it leads after its Lease has gone to another (two writers).

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
/// The longest one attempt (a read, then a create or replace) may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The election's clock: [`LEASE_DURATION`], [`RENEW_INTERVAL`] and [`ATTEMPT_TIMEOUT`] (tests
/// use shorter ones).
#[derive(Debug, Clone, Copy)]
struct Timing {
    lease: Duration,
    renew: Duration,
    attempt: Duration,
}

const TIMING: Timing = Timing {
    lease: LEASE_DURATION,
    renew: RENEW_INTERVAL,
    attempt: ATTEMPT_TIMEOUT,
};

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

async fn attempt(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    lease: Duration,
) -> Result<Attempt, kube::Error> {
    let now = Timestamp::now();
    let duration_seconds = i32::try_from(lease.as_secs().max(1)).unwrap_or(15);
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
/// (`config.identity`) holds the Lease and `false` otherwise. Errors (kube-apiserver down, slow
/// or black-holed, conflicts) are retried; a leader whose renewals have not succeeded for
/// [`LEASE_DURATION`] less one [`RENEW_INTERVAL`] — counted from when its last successful renewal
/// was sent — turns follower, whether its attempts fail or hang.
pub async fn run(client: Client, config: &LeaseConfig, leader: watch::Sender<bool>) {
    run_with(client, config, TIMING, leader).await;
}

async fn run_with(client: Client, config: &LeaseConfig, timing: Timing, leader: watch::Sender<bool>) {
    let api = Api::<Lease>::namespaced(client, &config.namespace);
    let name = &config.name;
    // When the last successful renewal was sent (its renewTime is no earlier).
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        let started = tokio::time::Instant::now();
        // A leader must hear back while its Lease is surely still its own.
        let must_step_down_at = last_renewal + timing.lease.saturating_sub(timing.renew);
        let budget = if *leader.borrow() {
            timing
                .attempt
                .min(must_step_down_at.saturating_duration_since(started))
        } else {
            timing.attempt
        };
        let outcome =
            match tokio::time::timeout(budget, attempt(&api, name, &config.identity, timing.lease)).await {
                Ok(outcome) => outcome.map_err(|error| error.to_string()),
                Err(_) => Err(format!("kube-apiserver did not answer within {budget:?}")),
            };
        match outcome {
            Ok(Attempt::Holding) => {
                last_renewal = started;
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
                if tokio::time::Instant::now() >= must_step_down_at
                    && leader.send_if_modified(|current| std::mem::replace(current, false))
                {
                    tracing::warn!(identity = %config.identity, "no renewal in time; no longer the leader");
                }
            }
        }
        tokio::time::sleep(timing.renew).await;
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

    /// A kube-apiserver for one Lease that answers the first read (404) and the create (201),
    /// then takes every later request and never answers: black-holed. Returns its URL and how
    /// many requests it has taken.
    async fn black_holing_apiserver() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::{atomic::Ordering, Arc};

        use http_body_util::{BodyExt as _, Full};
        use hyper::{body::Incoming, service::service_fn, Request, Response};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = taken.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        async move {
                            let (status, body) = match n {
                                0 => (
                                    404,
                                    br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#.to_vec(),
                                ),
                                1 => (201, request.into_body().collect().await?.to_bytes().to_vec()),
                                _ => std::future::pending().await,
                            };
                            let mut response = Response::new(Full::new(bytes::Bytes::from(body)));
                            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, hyper::Error>(response)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        (url, taken)
    }

    #[tokio::test]
    async fn a_leader_whose_kube_apiserver_stops_answering_steps_down_before_its_lease_expires() {
        let (url, taken) = black_holing_apiserver().await;
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let config = LeaseConfig {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "replica-a".into(),
        };
        let timing = Timing {
            lease: Duration::from_secs(3),
            renew: Duration::from_millis(300),
            attempt: Duration::from_secs(2),
        };
        let (sender, mut leader) = watch::channel(false);
        let election = tokio::spawn(async move { run_with(client, &config, timing, sender).await });

        tokio::time::timeout(Duration::from_secs(5), leader.wait_for(|leads| *leads))
            .await
            .expect("the Lease was created: leader within 5 s")
            .unwrap();
        let became = tokio::time::Instant::now();
        // Every renewal from now on hangs; the replica must stop calling itself leader while the
        // Lease it created could still be valid (3 s after it was sent, which was before `became`).
        tokio::time::timeout(timing.lease, leader.wait_for(|leads| !*leads))
            .await
            .expect("still the leader when its Lease could have expired")
            .unwrap();
        assert!(became.elapsed() >= timing.lease - timing.renew - Duration::from_millis(500));
        assert!(
            taken.load(std::sync::atomic::Ordering::SeqCst) >= 3,
            "it kept trying to renew"
        );
        election.abort();
    }
}
