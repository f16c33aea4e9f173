//! SubjectAccessReviews: asks kube-apiserver whether a user may perform an action, the way its
//! own impersonation filter does before it honours `Impersonate-*` headers.
//!
//! [`AccessReviewer::review`] POSTs an `authorization.k8s.io/v1` SubjectAccessReview with the
//! caller's credential for the API server (the proxy's service-account token or client
//! certificate) and answers [`AccessDecision`]. Allowed answers are cached for a short time keyed
//! by the whole review (which holds no secret); denials and failures are never cached, so a new
//! RBAC grant takes effect at once and an outage is never remembered. Any failure to get an
//! answer is an [`AccessReviewError`]: callers fail closed.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Uri};
use quick_cache::sync::Cache;
use serde::{Deserialize, Serialize};

use crate::{
    https::{ClientAuth, HttpsClient, TlsConfigError},
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
    /// How many allowed answers are kept.
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
    /// Review body → when the allowed answer expires.
    allowed: Cache<Bytes, Instant>,
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
            allowed: Cache::new(config.cache_capacity.max(1)),
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
            .get(&body)
            .is_some_and(|expires| expires > Instant::now())
        {
            return Ok(AccessDecision::Allowed);
        }
        let decision = tokio::time::timeout(self.timeout, self.post(body.clone(), authorization))
            .await
            .map_err(|_| AccessReviewError(format!("no answer within {:?}", self.timeout)))??;
        if decision == AccessDecision::Allowed {
            self.allowed.insert(body, Instant::now() + self.allowed_ttl);
        }
        Ok(decision)
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

    #[test]
    fn only_https_servers_are_accepted() {
        let error = AccessReviewer::new(AccessReviewConfig::new("http://127.0.0.1:6443", "x")).unwrap_err();
        assert!(matches!(error, AccessReviewConfigError::NotHttps(_)), "{error}");
    }
}
