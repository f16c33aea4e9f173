//! SubjectAccessReviews: asks kube-apiserver whether a user may perform an action, the way its
//! own impersonation filter does before it honours `Impersonate-*` headers.
//!
//! [`AccessReviewer::review`] POSTs an `authorization.k8s.io/v1` SubjectAccessReview with the
//! caller's credential for the API server (the proxy's service-account token or client
//! certificate) and answers [`AccessDecision`]. Allowed answers are cached for a short time keyed
//! by the whole review (which holds no secret); denials and failures are never cached, so a new
//! RBAC grant takes effect at once and an outage is never remembered. A capacity of 0 caches
//! nothing. Concurrent reviews of the same question share one request to kube-apiserver (a burst
//! of `kubectl --as` requests asks once), whatever its answer. Any failure to get an answer is an
//! [`AccessReviewError`]: callers fail closed.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderValue, Uri};
use quick_cache::sync::Cache;
use serde::{Deserialize, Serialize};

use selkie_oidc::https::HttpsClient;

use crate::{
    https::{ClientAuth, TlsConfigError},
    identity::UserInfo,
};

/// Largest SubjectAccessReview answer read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The action being reviewed: `authorization.k8s.io/v1` `ResourceAttributes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAttributes {
    /// Namespace, for namespaced resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Verb, e.g. `impersonate`.
    pub verb: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// Resource, e.g. `users`.
    pub resource: String,
    /// Subresource, e.g. an extra's key for `userextras`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
    /// Object name.
    pub name: String,
}

/// kube-apiserver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessDecision {
    /// The user may.
    Allowed,
    /// The user may not; `reason` is the authorizer's explanation (may be empty).
    Denied {
        /// The authorizer's reason.
        reason: String,
    },
}

/// Where and how to send reviews.
#[derive(Debug, Clone)]
pub struct AccessReviewConfig {
    /// kube-apiserver's base URL, `https://host:port`.
    pub server: String,
    /// CA bundle (PEM) for kube-apiserver's serving certificate.
    pub ca_bundle_pem: String,
    /// A client certificate, if the caller authenticates with one. A bearer token is passed per
    /// review instead, since it may rotate.
    pub client_auth: ClientAuth,
    /// Deadline for one review.
    pub timeout: Duration,
    /// How long an allowed answer is reused. One too long for the monotonic clock to represent
    /// (such as `Duration::MAX`) caches nothing, rather than caching forever.
    pub allowed_ttl: Duration,
    /// How many allowed answers are kept; 0: none (every review asks kube-apiserver).
    pub cache_capacity: usize,
}

impl AccessReviewConfig {
    /// Defaults: 5 s timeout, allowed answers reused for 10 s (kube-apiserver's delegated
    /// authorizer default), 10,000 cached answers.
    pub fn new(server: impl Into<String>, ca_bundle_pem: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            ca_bundle_pem: ca_bundle_pem.into(),
            client_auth: ClientAuth::None,
            timeout: Duration::from_secs(5),
            allowed_ttl: Duration::from_secs(10),
            cache_capacity: 10_000,
        }
    }
}

/// Why an [`AccessReviewer`] cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AccessReviewConfigError {
    /// The server URL is not an `https://` URL.
    #[error("the API server URL {0:?} is not an https:// URL")]
    NotHttps(String),
    /// The TLS settings are unusable.
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
}

/// No answer could be had: the caller must refuse the action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the SubjectAccessReview failed: {0}")]
pub struct AccessReviewError(String);

/// Sends SubjectAccessReviews to one kube-apiserver. See the module documentation.
pub struct AccessReviewer {
    endpoint: Uri,
    client: HttpsClient,
    timeout: Duration,
    allowed_ttl: Duration,
    /// Review body → when the allowed answer expires; `None` when the capacity is 0.
    allowed: Option<Cache<Bytes, Instant>>,
    /// Review body → the review in flight for it, which every caller asking meanwhile awaits.
    /// An entry lives exactly as long as some caller waits on it (see [`Waiter`]).
    in_flight: Mutex<HashMap<Bytes, InFlight>>,
}

/// One review's answer, computed once for every caller waiting on it.
type Answer = tokio::sync::OnceCell<Result<AccessDecision, AccessReviewError>>;

/// A review in flight and how many callers wait on it (changed only under the map's lock).
struct InFlight {
    answer: Arc<Answer>,
    waiters: usize,
}

/// One caller's place in a review in flight. However the caller leaves — with the answer, or
/// cancelled in the middle of its await because its request went away — dropping its `Waiter`
/// gives up its place, and the last one to go removes the entry. So the map only ever holds
/// reviews someone still waits for: since its keys carry the `--as` values a client picks,
/// clients that give up can never make it grow.
struct Waiter<'a> {
    in_flight: &'a Mutex<HashMap<Bytes, InFlight>>,
    key: Bytes,
    answer: Arc<Answer>,
}

impl<'a> Waiter<'a> {
    /// Joins the review of `key` in flight, registering a new one if there is none.
    fn join(in_flight: &'a Mutex<HashMap<Bytes, InFlight>>, key: Bytes) -> Self {
        let mut map = in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(key.clone()).or_insert_with(|| InFlight {
            answer: Arc::default(),
            waiters: 0,
        });
        entry.waiters = entry.waiters.saturating_add(1);
        let answer = entry.answer.clone();
        drop(map);
        Self {
            in_flight,
            key,
            answer,
        }
    }

    /// The review's answer is in: callers asking from now on start a new review (the answer is
    /// shared only with those who asked while it was pending, so an error is never reused).
    fn retire(&self) {
        let mut map = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        if map
            .get(&self.key)
            .is_some_and(|entry| Arc::ptr_eq(&entry.answer, &self.answer))
        {
            map.remove(&self.key);
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = map
            .get_mut(&self.key)
            .filter(|entry| Arc::ptr_eq(&entry.answer, &self.answer))
        else {
            // Retired already (and perhaps replaced by a newer review of the same question).
            return;
        };
        entry.waiters = entry.waiters.saturating_sub(1);
        if entry.waiters == 0 {
            map.remove(&self.key);
        }
    }
}

impl std::fmt::Debug for AccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessReviewer")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewRequest<'a> {
    api_version: &'static str,
    kind: &'static str,
    spec: ReviewSpec<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewSpec<'a> {
    resource_attributes: &'a ResourceAttributes,
    user: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    groups: &'a [String],
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    extra: &'a std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
struct ReviewResponse {
    #[serde(default)]
    status: Option<ReviewStatus>,
}

#[derive(Deserialize)]
struct ReviewStatus {
    #[serde(default)]
    allowed: bool,
    #[serde(default)]
    reason: String,
}

impl AccessReviewer {
    /// Validates `config` and builds the reviewer and its HTTPS client. No network IO.
    pub fn new(config: AccessReviewConfig) -> Result<Self, AccessReviewConfigError> {
        let base = config.server.trim_end_matches('/');
        let endpoint: Uri = format!("{base}/apis/authorization.k8s.io/v1/subjectaccessreviews")
            .parse()
            .map_err(|_| AccessReviewConfigError::NotHttps(config.server.clone()))?;
        if endpoint.scheme() != Some(&http::uri::Scheme::HTTPS) || endpoint.host().is_none() {
            return Err(AccessReviewConfigError::NotHttps(config.server));
        }
        Ok(Self {
            endpoint,
            client: crate::https::client(Some(&config.ca_bundle_pem), &config.client_auth)?,
            timeout: config.timeout,
            allowed_ttl: config.allowed_ttl,
            allowed: (config.cache_capacity > 0).then(|| Cache::new(config.cache_capacity)),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `user` may perform `attributes`. `authorization` is the reviewer's own
    /// `Authorization` header for kube-apiserver, when it authenticates with a token. Fails when
    /// kube-apiserver gives no answer (unreachable, timeout, non-2xx such as a 403 because the
    /// reviewer may not create SubjectAccessReviews, or an unreadable body).
    ///
    /// Cancel-safe: dropping the returned future (the caller's request went away) leaves no
    /// trace once every caller waiting on the same question has gone too.
    pub async fn review(
        &self,
        user: &UserInfo,
        attributes: &ResourceAttributes,
        authorization: Option<&HeaderValue>,
    ) -> Result<AccessDecision, AccessReviewError> {
        let body = serde_json::to_vec(&ReviewRequest {
            api_version: "authorization.k8s.io/v1",
            kind: "SubjectAccessReview",
            spec: ReviewSpec {
                resource_attributes: attributes,
                user: &user.username,
                uid: user.uid.as_deref(),
                groups: &user.groups,
                extra: &user.extra,
            },
        })
        .map(Bytes::from)
        .map_err(|e| AccessReviewError(e.to_string()))?;
        if self
            .allowed
            .as_ref()
            .and_then(|allowed| allowed.get(&body))
            .is_some_and(|expires| expires > Instant::now())
        {
            return Ok(AccessDecision::Allowed);
        }
        let waiter = Waiter::join(&self.in_flight, body.clone());
        // The first caller sends the review; the others wait for its answer. Should the first
        // caller go away (its request was cancelled), the next waiter sends it instead; should
        // they all go away, the last one's `Waiter` removes the entry.
        let decision = waiter
            .answer
            .get_or_init(|| async {
                tokio::time::timeout(self.timeout, self.post(body.clone(), authorization))
                    .await
                    .map_err(|_| AccessReviewError(format!("no answer within {:?}", self.timeout)))?
            })
            .await
            .clone();
        waiter.retire();
        drop(waiter);
        if let (Ok(AccessDecision::Allowed), Some(allowed)) = (&decision, &self.allowed) {
            if let Some(expires) = Instant::now().checked_add(self.allowed_ttl) {
                allowed.insert(body, expires);
            }
        }
        decision
    }

    async fn post(
        &self,
        body: Bytes,
        authorization: Option<&HeaderValue>,
    ) -> Result<AccessDecision, AccessReviewError> {
        let bytes = crate::https::post_json(
            &self.client,
            &self.endpoint,
            body,
            authorization,
            MAX_RESPONSE_BYTES,
        )
        .await
        .map_err(|e| AccessReviewError(e.to_string()))?;
        let response: ReviewResponse = serde_json::from_slice(&bytes)
            .map_err(|e| AccessReviewError(format!("unreadable answer: {e}")))?;
        let status = response
            .status
            .ok_or_else(|| AccessReviewError("the answer has no status".into()))?;
        Ok(if status.allowed {
            AccessDecision::Allowed
        } else {
            AccessDecision::Denied {
                reason: status.reason,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_serialize_as_kubernetes_expects() {
        let attributes = ResourceAttributes {
            namespace: None,
            verb: "impersonate".into(),
            group: "authentication.k8s.io".into(),
            resource: "userextras".into(),
            subresource: Some("scopes".into()),
            name: "view".into(),
        };
        let json = serde_json::to_value(&attributes).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "verb": "impersonate",
                "group": "authentication.k8s.io",
                "resource": "userextras",
                "subresource": "scopes",
                "name": "view",
            })
        );
    }

    fn alice() -> UserInfo {
        UserInfo {
            username: "alice".into(),
            ..UserInfo::default()
        }
    }

    fn impersonate_bob() -> ResourceAttributes {
        ResourceAttributes {
            verb: "impersonate".into(),
            resource: "users".into(),
            name: "bob".into(),
            ..ResourceAttributes::default()
        }
    }

    /// kube-apiserver's SubjectAccessReview endpoint, answering `allowed` after `delay`.
    async fn apiserver(allowed: bool, delay: Duration) -> crate::test_util::Endpoint {
        crate::test_util::endpoint(Arc::new(move |_, _| {
            std::thread::sleep(delay);
            (
                http::StatusCode::CREATED,
                serde_json::json!({"status": {"allowed": allowed, "reason": "test"}}).to_string(),
            )
        }))
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_capacity_of_zero_caches_nothing() {
        let server = apiserver(true, Duration::ZERO).await;
        let mut config = AccessReviewConfig::new(&server.base_url, &server.ca_pem);
        config.cache_capacity = 0;
        let reviewer = AccessReviewer::new(config).unwrap();
        for _ in 0..3 {
            let decision = reviewer.review(&alice(), &impersonate_bob(), None).await;
            assert_eq!(decision, Ok(AccessDecision::Allowed));
        }
        assert_eq!(server.hits(), 3, "every review asked kube-apiserver");

        let cached = AccessReviewer::new(AccessReviewConfig::new(&server.base_url, &server.ca_pem)).unwrap();
        for _ in 0..3 {
            cached.review(&alice(), &impersonate_bob(), None).await.unwrap();
        }
        assert_eq!(
            server.hits(),
            4,
            "the default capacity remembers the allowed answer"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_reviews_of_one_question_share_one_request() {
        for allowed in [true, false] {
            let server = apiserver(allowed, Duration::from_millis(300)).await;
            let reviewer = Arc::new(
                AccessReviewer::new(AccessReviewConfig::new(&server.base_url, &server.ca_pem)).unwrap(),
            );
            let (user, attributes) = (alice(), impersonate_bob());
            let mut callers = tokio::task::JoinSet::new();
            for _ in 0..20 {
                let reviewer = reviewer.clone();
                callers.spawn(async move { reviewer.review(&alice(), &impersonate_bob(), None).await });
            }
            let answers = callers.join_all().await;
            let expected = if allowed {
                AccessDecision::Allowed
            } else {
                AccessDecision::Denied {
                    reason: "test".into(),
                }
            };
            assert!(
                answers.iter().all(|answer| answer.as_ref() == Ok(&expected)),
                "{answers:?}"
            );
            assert_eq!(
                server.hits(),
                1,
                "allowed: {allowed}: one request for twenty callers"
            );
            assert!(
                reviewer.in_flight.lock().unwrap().is_empty(),
                "nothing left in flight"
            );
            if !allowed {
                // A denial is not remembered: the next question asks again.
                let again = reviewer.review(&user, &attributes, None).await;
                assert_eq!(again, Ok(expected));
                assert_eq!(server.hits(), 2);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_review_whose_callers_all_went_away_leaves_nothing_in_flight() {
        // kube-apiserver holds its answers until released, so every caller is still waiting when
        // it is cancelled. (The wait is `block_in_place`: a worker blocked outright could stall
        // the test runtime's timers.)
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = released.clone();
        let server = crate::test_util::endpoint(Arc::new(move |_, _| {
            tokio::task::block_in_place(|| {
                let deadline = Instant::now() + Duration::from_secs(20);
                while !gate.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            (
                http::StatusCode::CREATED,
                serde_json::json!({"status": {"allowed": true}}).to_string(),
            )
        }))
        .await;
        let reviewer =
            Arc::new(AccessReviewer::new(AccessReviewConfig::new(&server.base_url, &server.ca_pem)).unwrap());
        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let reviewer = reviewer.clone();
            callers.spawn(async move { reviewer.review(&alice(), &impersonate_bob(), None).await });
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.hits() == 0 {
            assert!(
                Instant::now() < deadline,
                "the review never reached kube-apiserver"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            reviewer.in_flight.lock().unwrap().len(),
            1,
            "one coalesced review"
        );

        // Every caller's request is cancelled. A JoinSet reports an aborted task only once its
        // future has been dropped, so every waiter is gone when this loop ends.
        callers.abort_all();
        while let Some(joined) = callers.join_next().await {
            assert!(
                joined.unwrap_err().is_cancelled(),
                "a caller finished before the answer"
            );
        }
        assert!(
            reviewer.in_flight.lock().unwrap().is_empty(),
            "the abandoned review is no longer in flight"
        );

        // The same question later is asked afresh, and answered.
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        let decision = tokio::time::timeout(
            Duration::from_secs(10),
            reviewer.review(&alice(), &impersonate_bob(), None),
        )
        .await
        .expect("a fresh review is answered");
        assert_eq!(decision, Ok(AccessDecision::Allowed));
        // (A waiter may have taken the abandoned review over, and sent it again, just before its
        // own cancellation landed: at least two requests, then.)
        assert!(server.hits() >= 2, "the later request sent its own review");
        assert!(reviewer.in_flight.lock().unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_allowed_ttl_past_the_clock_caches_nothing_and_does_not_panic() {
        let server = apiserver(true, Duration::ZERO).await;
        let mut config = AccessReviewConfig::new(&server.base_url, &server.ca_pem);
        config.allowed_ttl = Duration::MAX;
        let reviewer = AccessReviewer::new(config).unwrap();
        for _ in 0..2 {
            let decision = reviewer.review(&alice(), &impersonate_bob(), None).await;
            assert_eq!(decision, Ok(AccessDecision::Allowed));
        }
        assert_eq!(server.hits(), 2, "nothing was cached");
    }

    #[test]
    fn only_https_servers_are_accepted() {
        let error = AccessReviewer::new(AccessReviewConfig::new("http://127.0.0.1:6443", "x")).unwrap_err();
        assert!(matches!(error, AccessReviewConfigError::NotHttps(_)), "{error}");
    }
}
