//! An issuer's signing keys, cached: fetched through discovery on first use, refreshed when they
//! grow old or a token names a `kid` they lack, with one fetch in flight at a time and at most one
//! throttled fetch per minimum interval, so a flood of tokens with made-up `kid`s cannot turn into
//! a flood of requests to the issuer.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;

use crate::{
    discovery::{Discovery, DiscoveryError, MAX_DOCUMENT_BYTES},
    https::HttpsClient,
    jose::{parse_jwks, JoseError, Jws, VerifyingKey},
};

/// Why the key set could not be (re)loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    /// The discovery document could not be fetched or read.
    #[error("fetching the discovery document {url} failed: {reason}")]
    Discovery {
        /// The discovery URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The discovery document names another issuer.
    #[error("the discovery document names issuer {found:?}, not {expected:?}")]
    IssuerMismatch {
        /// The configured issuer.
        expected: String,
        /// What the document says.
        found: String,
    },
    /// `jwks_uri` is missing or not https.
    #[error("the discovery document's jwks_uri {0:?} is not an https URL")]
    InvalidJwksUri(String),
    /// The key set could not be fetched or parsed.
    #[error("fetching the key set {url} failed: {reason}")]
    Jwks {
        /// The JWKS URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The key set holds no key Selkie can use.
    #[error("the key set {0} holds no usable signing key")]
    NoUsableKeys(String),
    /// A refresh was attempted too recently to try again.
    #[error("the key set was refreshed less than the minimum interval ago")]
    RateLimited,
}

/// Why a token's signature was not accepted by [`IssuerKeys::verify`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The token itself is at fault (see [`JoseError`]).
    #[error(transparent)]
    Token(#[from] JoseError),
    /// No keys could be had from the issuer.
    #[error("the issuer's signing keys are unavailable")]
    Unavailable,
}

/// How keys are kept.
#[derive(Debug, Clone, Copy)]
pub struct KeyPolicy {
    /// At most one throttled fetch (for an unknown `kid`, or after a failure) per this interval.
    pub min_refresh: Duration,
    /// Keys older than this are fetched again before use (and kept if that fails).
    pub max_age: Duration,
    /// The bound of each request to the issuer.
    pub timeout: Duration,
}

struct KeySet {
    keys: Vec<VerifyingKey>,
    fetched: Instant,
}

/// The cached signing keys of one issuer. See the module documentation.
pub struct IssuerKeys {
    issuer: String,
    client: HttpsClient,
    policy: KeyPolicy,
    keys: ArcSwapOption<KeySet>,
    /// Serialises refreshes; holds when the last throttled fetch happened (one triggered by an
    /// unknown `kid`, or one that failed). A successful first or age-based fetch does not count,
    /// so a rotation right after start-up is still picked up at once.
    refresh: tokio::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for IssuerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKeys")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// What triggered a key refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refresh {
    /// No keys yet, or keys older than the maximum age.
    Scheduled,
    /// A token names a `kid` the cached keys do not have.
    UnknownKid,
}

impl IssuerKeys {
    /// An empty cache for `issuer`, fetching with `client`. Does no IO.
    pub fn new(issuer: &str, client: HttpsClient, policy: KeyPolicy) -> Self {
        Self {
            issuer: issuer.to_string(),
            client,
            policy,
            keys: ArcSwapOption::empty(),
            refresh: tokio::sync::Mutex::new(None),
        }
    }

    /// The issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Fetches discovery and the key set now, replacing the cached keys on success. Returns the
    /// number of usable keys. Not rate-limited (a controller reporting whether an issuer works).
    pub async fn load(&self) -> Result<usize, JwksError> {
        let _serialised = self.refresh.lock().await;
        let keys = self.fetch().await?;
        let count = keys.len();
        self.store(keys);
        Ok(count)
    }

    /// Replaces the keys with those of a JWKS document, as if just fetched (benches and fuzz
    /// targets run without an issuer). A document that does not parse, or holds no usable key,
    /// changes nothing.
    pub fn install(&self, jwks_json: &[u8]) -> Result<usize, JwksError> {
        let keys = parse_jwks(jwks_json).map_err(|e| JwksError::Jwks {
            url: "(installed)".to_string(),
            reason: e.to_string(),
        })?;
        if keys.is_empty() {
            return Err(JwksError::NoUsableKeys("(installed)".to_string()));
        }
        let count = keys.len();
        self.store(keys);
        Ok(count)
    }

    /// Verifies `jws`'s signature with the issuer's keys: the algorithm and signature encoding are
    /// checked first, then the cached keys are used (fetched if there are none, refreshed if old),
    /// and fetched again once if no key has the token's `kid`.
    pub async fn verify(&self, jws: &Jws<'_>) -> Result<(), VerifyError> {
        let alg = jws.algorithm()?;
        let signature = jws.signature()?;
        let observed = Instant::now();
        let mut keys = self.current(observed).await?;
        let mut refreshed = false;
        loop {
            match jws.verify_decoded(alg, &signature, &keys.keys) {
                Err(JoseError::UnknownKey(kid)) if !refreshed => {
                    keys = match self.refresh(observed, Refresh::UnknownKid).await {
                        Ok(keys) => keys,
                        Err(JwksError::RateLimited) => return Err(JoseError::UnknownKey(kid).into()),
                        Err(_) => return Err(VerifyError::Unavailable),
                    };
                    refreshed = true;
                }
                other => return other.map_err(VerifyError::from),
            }
        }
    }

    fn store(&self, keys: Vec<VerifyingKey>) -> Arc<KeySet> {
        let set = Arc::new(KeySet {
            keys,
            fetched: Instant::now(),
        });
        self.keys.store(Some(set.clone()));
        set
    }

    /// The cached keys, fetched first if there are none and refreshed if they are too old (a
    /// failed refresh of old keys keeps them).
    async fn current(&self, observed: Instant) -> Result<Arc<KeySet>, VerifyError> {
        match self.keys.load_full() {
            Some(keys) if keys.fetched.elapsed() < self.policy.max_age => Ok(keys),
            Some(stale) => Ok(self.refresh(observed, Refresh::Scheduled).await.unwrap_or(stale)),
            None => self
                .refresh(observed, Refresh::Scheduled)
                .await
                .map_err(|_| VerifyError::Unavailable),
        }
    }

    /// Single-flight refresh: if another caller refreshed after `observed`, its keys are used;
    /// otherwise at most one throttled fetch per minimum interval.
    async fn refresh(&self, observed: Instant, cause: Refresh) -> Result<Arc<KeySet>, JwksError> {
        let mut last = self.refresh.lock().await;
        if let Some(current) = self.keys.load_full() {
            if current.fetched > observed {
                return Ok(current);
            }
        }
        if last.is_some_and(|at| at.elapsed() < self.policy.min_refresh) {
            return Err(JwksError::RateLimited);
        }
        let fetched = self.fetch().await;
        if cause == Refresh::UnknownKid || fetched.is_err() {
            *last = Some(Instant::now());
        }
        match fetched {
            Ok(keys) => Ok(self.store(keys)),
            Err(e) => {
                tracing::warn!(issuer = %self.issuer, error = %e, "refreshing the signing keys failed");
                Err(e)
            }
        }
    }

    async fn fetch(&self) -> Result<Vec<VerifyingKey>, JwksError> {
        let discovery = Discovery::fetch(&self.client, &self.issuer, self.policy.timeout)
            .await
            .map_err(|e| match e {
                DiscoveryError::IssuerMismatch { expected, found } => {
                    JwksError::IssuerMismatch { expected, found }
                }
                other => JwksError::Discovery {
                    url: Discovery::url_of(&self.issuer).unwrap_or_else(|_| self.issuer.clone()),
                    reason: match other {
                        DiscoveryError::Fetch(http) => http_reason(&http),
                        other => other.to_string(),
                    },
                },
            })?;
        crate::https::https_url(&discovery.jwks_uri)
            .map_err(|_| JwksError::InvalidJwksUri(discovery.jwks_uri.clone()))?;
        let document = self
            .client
            .get_json(&discovery.jwks_uri, MAX_DOCUMENT_BYTES, Some(self.policy.timeout))
            .await
            .map_err(|e| JwksError::Jwks {
                url: discovery.jwks_uri.clone(),
                reason: http_reason(&e),
            })?;
        let keys = parse_jwks(&document).map_err(|e| JwksError::Jwks {
            url: discovery.jwks_uri.clone(),
            reason: e.to_string(),
        })?;
        if keys.is_empty() {
            return Err(JwksError::NoUsableKeys(discovery.jwks_uri));
        }
        Ok(keys)
    }
}

/// An HTTP error without the method and URL the surrounding message already names.
fn http_reason(error: &crate::https::HttpError) -> String {
    use crate::https::HttpError;
    match error {
        HttpError::Request { cause, .. } => format!("request failed: {cause}"),
        HttpError::Timeout { timeout, .. } => format!("no answer within {timeout:?}"),
        HttpError::Status { status, .. } => format!("answered {status}"),
        HttpError::Body { cause, .. } => format!("response body unreadable or too large: {cause}"),
        other => other.to_string(),
    }
}
