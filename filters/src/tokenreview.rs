//! Authentication by TokenReview: a webhook (Pinniped's WebhookAuthenticator) or kube-apiserver
//! itself (pass-through of tokens the cluster already accepts, such as service-account tokens).
//! The impersonation proxy runs the latter as its chain's implicit last authenticator
//! ([`crate::chain::Chain::with_implicit`]), with its own rotating service-account token
//! ([`ClientAuth::BearerTokenSource`]), as Pinniped's proxy runs its delegating authenticator.
//!
//! Both send `POST <endpoint>` with a `TokenReview` and read `status.authenticated` and
//! `status.user`. Results are cached ([`ReviewCache`]). The authenticator fails closed: a timeout,
//! a connection error, a non-2xx answer or a body that is not a TokenReview is
//! [`RejectReason::UpstreamUnavailable`] and is never cached.
//!
//! API version: Pinniped sends `authentication.k8s.io/v1beta1`, which existing webhooks expect,
//! while kube-apiserver serves only `v1` since 1.22. [`ReviewVersion::Auto`] sends `v1beta1` and,
//! when the endpoint answers 400 or 404, retries once with `v1` and keeps using `v1`.

use crate::access_review::ResourceAttributes;
use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{StatusCode, Uri};
use serde::{Deserialize, Serialize};

pub use crate::https::{BearerTokenSource, ClientAuth};
use crate::{
    https::Authorization,
    identity::{CertificateIdentity, Forwarding, Identity, UserInfo},
    outcome::{Outcome, RejectReason},
    review_cache::{CacheConfig, RandomSourceError, ReviewCache},
};

/// Largest TokenReview response read; anything bigger is treated as garbage.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Which `authentication.k8s.io` version to send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReviewVersion {
    /// `v1` only.
    V1,
    /// `v1beta1` only (what Pinniped sends).
    V1beta1,
    /// `v1beta1` first, switching to `v1` for good when the endpoint rejects it.
    #[default]
    Auto,
}

/// What the authenticator does with identities that carry a UID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UidHandling {
    /// Impersonate them like any other user (webhooks).
    #[default]
    Impersonate,
    /// Mark them [`Forwarding::PassThroughToken`]: the endpoint is kube-apiserver itself, so the
    /// original token can be forwarded unchanged.
    PassThroughToken,
}

/// Configuration of a [`TokenReviewAuthenticator`].
#[derive(Debug, Clone)]
pub struct TokenReviewConfig {
    /// Name used in audit logs and metrics.
    pub name: String,
    /// Full `https://` URL of the TokenReview endpoint.
    pub endpoint: String,
    /// PEM bundle of CAs trusted for the endpoint; `None` trusts the system's roots.
    pub ca_bundle_pem: Option<String>,
    /// The authenticator's own credential. A [`ClientAuth::BearerTokenSource`] is asked for its
    /// token at every review sent (not for cached answers); while it has none, reviews fail
    /// closed ([`RejectReason::UpstreamUnavailable`]) without being sent.
    pub client_auth: ClientAuth,
    /// The TokenReview version to send.
    pub version: ReviewVersion,
    /// Audiences to ask for (`spec.audiences`); empty leaves it to the endpoint.
    pub audiences: Vec<String>,
    /// Deadline for one review, connection included.
    pub timeout: Duration,
    /// Result cache.
    pub cache: CacheConfig,
    /// What to do with identities that carry a UID.
    pub uid_handling: UidHandling,
    /// What a TokenCredentialRequest's client certificate may leave out of this authenticator's
    /// identities.
    pub certificate_identity: CertificateIdentity,
    /// What a user must be allowed to get a TokenCredentialRequest's certificate
    /// ([`crate::issuing::login_api`]); `None`: nothing more than authentication.
    pub login_authorization: Option<ResourceAttributes>,
}

impl TokenReviewConfig {
    /// A configuration with defaults: no client credential, [`ReviewVersion::Auto`], a 10 s
    /// timeout, the default cache, UIDs impersonated.
    pub fn new(name: impl Into<String>, endpoint: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            endpoint: endpoint.into(),
            ca_bundle_pem: None,
            client_auth: ClientAuth::None,
            version: ReviewVersion::Auto,
            audiences: Vec::new(),
            timeout: Duration::from_secs(10),
            cache: CacheConfig::default(),
            uid_handling: UidHandling::Impersonate,
            certificate_identity: CertificateIdentity::Exact,
            login_authorization: None,
        }
    }
}

/// Why a [`TokenReviewConfig`] cannot be used. Reported when the configuration is built, never per
/// request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenReviewConfigError {
    /// The endpoint is not a valid URL.
    #[error("endpoint {endpoint:?} is not a valid URL: {reason}")]
    InvalidEndpoint {
        /// The configured endpoint.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The endpoint does not use https.
    #[error("endpoint {0:?} must use https")]
    NotHttps(String),
    /// The bearer token has characters that cannot appear in an HTTP header.
    #[error("the bearer token contains characters not allowed in an HTTP header")]
    InvalidBearerToken,
    /// The TLS settings (CA bundle, client certificate) are unusable.
    #[error(transparent)]
    Tls(#[from] crate::https::TlsConfigError),
    /// See [`RandomSourceError`].
    #[error(transparent)]
    RandomSource(#[from] RandomSourceError),
}

/// Authenticates bearer tokens by asking a TokenReview endpoint. See the module documentation.
pub struct TokenReviewAuthenticator {
    name: Arc<str>,
    endpoint: Uri,
    client: selkie_oidc::https::HttpsClient,
    authorization: Authorization,
    version: ReviewVersion,
    /// Set once an `Auto` endpoint refused v1beta1.
    use_v1: AtomicBool,
    audiences: Vec<String>,
    timeout: Duration,
    uid_handling: UidHandling,
    certificate_identity: CertificateIdentity,
    login_authorization: Option<ResourceAttributes>,
    cache: ReviewCache,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    /// Validates `config` and builds the authenticator (and its HTTPS client).
    pub fn new(config: TokenReviewConfig) -> Result<Self, TokenReviewConfigError> {
        let endpoint: Uri = config.endpoint.parse().map_err(|e: http::uri::InvalidUri| {
            TokenReviewConfigError::InvalidEndpoint {
                endpoint: config.endpoint.clone(),
                reason: e.to_string(),
            }
        })?;
        if endpoint.scheme() != Some(&http::uri::Scheme::HTTPS) || endpoint.host().is_none() {
            return Err(TokenReviewConfigError::NotHttps(config.endpoint));
        }
        let client = crate::https::client(config.ca_bundle_pem.as_deref(), &config.client_auth)?;
        let authorization =
            Authorization::of(&config.client_auth).map_err(|_| TokenReviewConfigError::InvalidBearerToken)?;
        Ok(Self {
            name: config.name.into(),
            endpoint,
            client,
            authorization,
            version: config.version,
            use_v1: AtomicBool::new(config.version == ReviewVersion::V1),
            audiences: config.audiences,
            timeout: config.timeout,
            uid_handling: config.uid_handling,
            certificate_identity: config.certificate_identity,
            login_authorization: config.login_authorization,
            cache: ReviewCache::new(config.cache)?,
        })
    }

    /// The configured name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// What a TokenCredentialRequest's client certificate may leave out of this authenticator's
    /// identities.
    pub fn certificate_identity(&self) -> CertificateIdentity {
        self.certificate_identity
    }

    /// What a user must be allowed to get a TokenCredentialRequest's certificate, if anything.
    pub fn login_authorization(&self) -> Option<&ResourceAttributes> {
        self.login_authorization.as_ref()
    }

    /// Reviews `token` (or reuses a cached result). Never returns [`Outcome::NotMine`]: an
    /// endpoint either vouches for a token or refuses it.
    pub async fn authenticate(&self, token: &str) -> Outcome {
        self.cache.get_or_review(token, || self.review(token)).await
    }

    async fn review(&self, token: &str) -> Outcome {
        match tokio::time::timeout(self.timeout, self.review_once_or_fall_back(token)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                tracing::warn!(authenticator = %self.name, timeout = ?self.timeout, "token review timed out");
                Outcome::Rejected(RejectReason::UpstreamUnavailable)
            }
        }
    }

    async fn review_once_or_fall_back(&self, token: &str) -> Outcome {
        let v1 = self.use_v1.load(Ordering::Relaxed);
        match self.post(token, v1).await {
            Err(status)
                if !v1
                    && self.version == ReviewVersion::Auto
                    && matches!(status, Some(StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND)) =>
            {
                tracing::info!(authenticator = %self.name, "endpoint refused TokenReview v1beta1; using v1");
                self.use_v1.store(true, Ordering::Relaxed);
                self.post(token, true)
                    .await
                    .unwrap_or(Outcome::Rejected(RejectReason::UpstreamUnavailable))
            }
            Err(_) => Outcome::Rejected(RejectReason::UpstreamUnavailable),
            Ok(outcome) => outcome,
        }
    }

    /// One POST. `Err(Some(status))` for a non-2xx answer, `Err(None)` when there was no usable
    /// answer at all.
    async fn post(&self, token: &str, v1: bool) -> Result<Outcome, Option<StatusCode>> {
        let api_version = if v1 {
            "authentication.k8s.io/v1"
        } else {
            "authentication.k8s.io/v1beta1"
        };
        let body = serde_json::to_vec(&ReviewRequest {
            api_version,
            kind: "TokenReview",
            spec: ReviewSpec {
                token,
                audiences: &self.audiences,
            },
        })
        .map_err(|_| None)?;
        let authorization = self.authorization.current().map_err(|error| {
            tracing::warn!(authenticator = %self.name, %error, "token review not sent");
            None
        })?;
        let bytes = crate::https::post_json(
            &self.client,
            &self.endpoint,
            Bytes::from(body),
            authorization.as_ref(),
            MAX_RESPONSE_BYTES,
        )
        .await
        .map_err(|e| {
            tracing::warn!(authenticator = %self.name, error = %e, "token review failed");
            e.status()
        })?;
        let review: ReviewResponse = serde_json::from_slice(&bytes).map_err(|e| {
            // serde's own message quotes the offending value, which may be the webhook echoing a
            // credential: only where and what kind of mistake it is goes to the log.
            tracing::warn!(
                authenticator = %self.name,
                error = %selkie_api::json::error_without_values(&e),
                "token review response is not a TokenReview"
            );
            None
        })?;
        Ok(self.outcome_of(review))
    }

    fn outcome_of(&self, review: ReviewResponse) -> Outcome {
        let status = review.status.unwrap_or_default();
        if !status.authenticated {
            return Outcome::Rejected(RejectReason::NotAuthenticated);
        }
        let Some(user) = status.user else {
            return Outcome::Rejected(RejectReason::EmptyUsername);
        };
        if user.username.is_empty() {
            return Outcome::Rejected(RejectReason::EmptyUsername);
        }
        if !self.audiences.is_empty()
            && !status.audiences.is_empty()
            && !status.audiences.iter().any(|a| self.audiences.contains(a))
        {
            return Outcome::Rejected(RejectReason::WrongAudience);
        }
        let uid = Some(user.uid).filter(|uid| !uid.is_empty());
        let forwarding = match (self.uid_handling, &uid) {
            (UidHandling::PassThroughToken, Some(_)) => Forwarding::PassThroughToken,
            _ => Forwarding::Impersonate,
        };
        Outcome::Authenticated(Arc::new(Identity {
            user: UserInfo {
                username: user.username,
                uid,
                groups: user.groups,
                extra: user.extra,
            },
            authenticator: self.name.clone(),
            audiences: status.audiences,
            forwarding,
        }))
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
struct ReviewSpec<'a> {
    token: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    audiences: &'a [String],
}

#[derive(Deserialize)]
struct ReviewResponse {
    #[serde(default)]
    status: Option<ReviewStatus>,
}

#[derive(Deserialize, Default)]
struct ReviewStatus {
    #[serde(default)]
    authenticated: bool,
    #[serde(default)]
    user: Option<ReviewUser>,
    #[serde(default)]
    audiences: Vec<String>,
}

#[derive(Deserialize)]
struct ReviewUser {
    #[serde(default)]
    username: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    extra: BTreeMap<String, Vec<String>>,
}

#[cfg(test)]
mod tests;
