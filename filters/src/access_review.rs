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
    /// How long an allowed answer is reused.
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
    in_flight: Mutex<HashMap<Bytes, Arc<InFlight>>>,
}

/// One review's answer, computed once for every caller waiting on it.
type InFlight = tokio::sync::OnceCell<Result<AccessDecision, AccessReviewError>>;

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
        let in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(body.clone())
            .or_default()
            .clone();
        // The first caller sends the review; the others wait for its answer. Should the first
        // caller go away (its request was cancelled), the next waiter sends it instead.
        let decision = in_flight
            .get_or_init(|| async {
                tokio::time::timeout(self.timeout, self.post(body.clone(), authorization))
                    .await
                    .map_err(|_| AccessReviewError(format!("no answer within {:?}", self.timeout)))?
            })
            .await
            .clone();
        {
            let mut waiting = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
            if waiting
                .get(&body)
                .is_some_and(|current| Arc::ptr_eq(current, &in_flight))
            {
                waiting.remove(&body);
            }
        }
        if let (Ok(AccessDecision::Allowed), Some(allowed)) = (&decision, &self.allowed) {
            allowed.insert(body, Instant::now() + self.allowed_ttl);
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

    #[test]
    fn only_https_servers_are_accepted() {
        let error = AccessReviewer::new(AccessReviewConfig::new("http://127.0.0.1:6443", "x")).unwrap_err();
        assert!(matches!(error, AccessReviewConfigError::NotHttps(_)), "{error}");
    }
}
