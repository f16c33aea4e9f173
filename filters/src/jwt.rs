//! JWT bearer tokens with Pinniped's JWTAuthenticator semantics: exact issuer, an accepted
//! audience, a username claim and a groups claim, keys from the issuer's OIDC discovery document.
//! It also takes the `jwt[]` fields of Kubernetes' structured AuthenticationConfiguration (and
//! of Pinniped's JWTAuthenticator since v0.40): several audiences with `audienceMatchPolicy:
//! MatchAny`, claim mappings from a claim with a prefix or from a CEL expression (username,
//! groups, uid, extra), claim validation rules and user validation rules. Expressions are
//! compiled by [`JwtAuthenticator::new`], so a broken one is a configuration error, never a
//! per-request surprise.
//!
//! Security rules, whatever a token or a key set says:
//! * only RS256/384/512, PS256/384/512, ES256/384 and EdDSA are verified; `none` and HMAC never;
//! * a key's algorithm is pinned by its JWK (`alg`, else its key type), so a token cannot pick
//!   an algorithm its key was not made for;
//! * `iss` must equal the configured issuer exactly, `exp` is required, `nbf`/`iat`/`exp` allow only
//!   a bounded clock skew, and tokens have a size limit;
//! * a `crit` header is refused (no extensions are understood).
//!
//! Keys come from `<issuer>/.well-known/openid-configuration` → `jwks_uri` and are cached. An
//! unknown `kid` triggers one refresh (single-flight, at most once per
//! [`JwtConfig::jwks_min_refresh_interval`]); key sets older than [`JwtConfig::jwks_max_age`] are
//! refreshed on use. Verified results are cached (keyed by an HMAC of the token) no longer than
//! the token's own expiry, unless [`JwtConfig::cache`] is [`CacheConfig::disabled`]: then every
//! presentation of a token is verified in full, signature included.

mod mapping;
#[cfg(test)]
mod tests;

use crate::access_review::ResourceAttributes;
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http::Uri;
use mapping::Mapper;
use selkie_oidc::{
    discovery::WELL_KNOWN,
    jose::{JoseError, Jws},
    keys::{IssuerKeys, KeyPolicy, VerifyError},
};
pub use selkie_oidc::{jose::Algorithm, keys::JwksError};
use serde_json::{Map, Value};

use crate::{
    expression::ExpressionError,
    https::{ClientAuth, TlsConfigError},
    identity::{Forwarding, Identity},
    outcome::{Outcome, RejectReason},
    review_cache::{CacheConfig, RandomSourceError, ReviewCache},
};

/// A claim copied into the user, with an optional prefix (Kubernetes' `claimMappings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMapping {
    /// Claim name.
    pub claim: String,
    /// Prepended to the claim's value (to each value, for lists).
    pub prefix: String,
}

impl ClaimMapping {
    /// The claim, without a prefix.
    pub fn claim(claim: impl Into<String>) -> Self {
        Self {
            claim: claim.into(),
            prefix: String::new(),
        }
    }
}

/// Where a user attribute comes from (Kubernetes' `claimMappings.<field>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// A claim, with a prefix.
    Claim(ClaimMapping),
    /// A CEL expression over `claims`: a string for username and uid, a string or a list of
    /// strings for groups.
    Expression(String),
}

impl From<ClaimMapping> for Mapping {
    fn from(mapping: ClaimMapping) -> Self {
        Self::Claim(mapping)
    }
}

/// How the token's audiences are matched against the configured ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudienceMatchPolicy {
    /// Any one of the token's audiences must be configured (Kubernetes' only policy).
    MatchAny,
}

/// A check of the claims (Kubernetes' `claimValidationRules[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimValidationRule {
    /// The claim must be a string equal to `required_value`.
    RequiredValue {
        /// Claim name.
        claim: String,
        /// The value it must have.
        required_value: String,
    },
    /// A CEL expression over `claims` that must be true.
    Expression {
        /// The expression.
        expression: String,
        /// Logged when it is false.
        message: String,
    },
}

/// A check of the mapped user (Kubernetes' `userValidationRules[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserValidationRule {
    /// A CEL expression over `user` (`username`, `uid`, `groups`, `extra`) that must be true.
    pub expression: String,
    /// Logged when it is false.
    pub message: String,
}

/// Configuration of a [`JwtAuthenticator`].
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// Name used in audit logs and metrics (the JWTAuthenticator's name).
    pub name: String,
    /// The `https://` issuer URL; `iss` must equal it exactly.
    pub issuer: String,
    /// Accepted audiences: a token is accepted if any of its `aud` values is one of these.
    pub audiences: Vec<String>,
    /// Required (as in Kubernetes) when there is more than one audience.
    pub audience_match_policy: Option<AudienceMatchPolicy>,
    /// Where the user name comes from (Pinniped's default: claim `username`).
    pub username: Mapping,
    /// Where the groups come from (Pinniped's default: claim `groups`); `None` gives no groups.
    pub groups: Option<Mapping>,
    /// Where the user's UID comes from (a claim without prefix, or an expression).
    pub uid: Option<Mapping>,
    /// Extra attributes: key (a lowercase domain-prefixed path) → CEL expression over `claims`
    /// giving a string or a list of strings; empty results are left out.
    pub extra: BTreeMap<String, String>,
    /// Checks of the claims, after mapping; any failure refuses the token.
    pub claim_validation_rules: Vec<ClaimValidationRule>,
    /// Checks of the mapped user; any failure refuses the token.
    pub user_validation_rules: Vec<UserValidationRule>,
    /// PEM CA bundle for the issuer's discovery and JWKS endpoints; `None` trusts the system roots.
    pub ca_bundle_pem: Option<String>,
    /// Tolerance for `exp`, `nbf` and `iat`.
    pub clock_skew: Duration,
    /// Longest token accepted.
    pub max_token_bytes: usize,
    /// An unknown `kid` refreshes the key set at most this often.
    pub jwks_min_refresh_interval: Duration,
    /// Key sets older than this are refreshed when used.
    pub jwks_max_age: Duration,
    /// Deadline for fetching discovery or keys.
    pub timeout: Duration,
    /// Result cache (entries never outlive the token's `exp`); [`CacheConfig::disabled`] (capacity
    /// 0) verifies every presentation of a token.
    pub cache: CacheConfig,
    /// What a user must be allowed to get a TokenCredentialRequest's certificate
    /// ([`crate::issuing::login_api`]); `None`: nothing more than authentication.
    pub login_authorization: Option<ResourceAttributes>,
}

impl JwtConfig {
    /// Pinniped's defaults for `issuer` and one `audience`: claims `username` and `groups`, 60 s
    /// clock skew, 16 KiB tokens, key refresh at most every 10 s and at least hourly.
    pub fn new(name: impl Into<String>, issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            issuer: issuer.into(),
            audiences: vec![audience.into()],
            audience_match_policy: None,
            username: ClaimMapping::claim("username").into(),
            groups: Some(ClaimMapping::claim("groups").into()),
            uid: None,
            extra: BTreeMap::new(),
            claim_validation_rules: Vec::new(),
            user_validation_rules: Vec::new(),
            ca_bundle_pem: None,
            clock_skew: Duration::from_secs(60),
            max_token_bytes: 16 * 1024,
            jwks_min_refresh_interval: Duration::from_secs(10),
            jwks_max_age: Duration::from_secs(3600),
            timeout: Duration::from_secs(10),
            cache: CacheConfig::default(),
            login_authorization: None,
        }
    }
}

/// Why a [`JwtConfig`] cannot be used; reported at configuration time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwtConfigError {
    /// The issuer is not an absolute URL.
    #[error("issuer {0:?} is not a valid URL")]
    InvalidIssuerUrl(String),
    /// The issuer does not use https.
    #[error("issuer {0:?} must use https")]
    IssuerNotHttps(String),
    /// The issuer has a query or contains the discovery path itself.
    #[error("issuer {0:?} must not contain a query or the /.well-known/openid-configuration path")]
    IssuerHasExtraParts(String),
    /// No audience, or an empty one.
    #[error("at least one non-empty audience is required")]
    NoAudience,
    /// Several audiences without `audienceMatchPolicy: MatchAny`.
    #[error("audienceMatchPolicy must be MatchAny when more than one audience is configured")]
    AudienceMatchPolicyRequired,
    /// A claim name is empty.
    #[error("the {0} claim name must not be empty")]
    EmptyClaimName(&'static str),
    /// A prefix was given where Kubernetes allows none.
    #[error("the {0} claim mapping takes no prefix")]
    PrefixNotAllowed(&'static str),
    /// An extra key Kubernetes would refuse.
    #[error("extra key {key:?} is invalid: {why}")]
    InvalidExtraKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A CEL expression does not compile.
    #[error("{field}: {error}")]
    Expression {
        /// Where the expression is configured, e.g. `claimMappings.username.expression`.
        field: String,
        /// What is wrong with it.
        error: ExpressionError,
    },
    /// The user name is built from `claims.email` but nothing checks `claims.email_verified`.
    #[error("claims.email_verified must be used in claimMappings.username.expression, claimMappings.extra[].valueExpression or claimValidationRules[].expression when claims.email is used in claimMappings.username.expression")]
    EmailVerifiedNotChecked,
    /// See [`TlsConfigError`].
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
    /// See [`RandomSourceError`].
    #[error(transparent)]
    RandomSource(#[from] RandomSourceError),
}

/// See the module documentation.
pub struct JwtAuthenticator {
    name: Arc<str>,
    issuer: String,
    audiences: Vec<String>,
    mapper: Mapper,
    clock_skew: Duration,
    max_token_bytes: usize,
    keys: IssuerKeys,
    cache: ReviewCache,
    login_authorization: Option<ResourceAttributes>,
}

impl std::fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuthenticator")
            .field("name", &self.name)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

impl JwtAuthenticator {
    /// Validates `config` and builds the authenticator. Does no network IO: keys are fetched on
    /// first use, or by [`JwtAuthenticator::load_keys`].
    pub fn new(config: JwtConfig) -> Result<Self, JwtConfigError> {
        let issuer_uri: Uri = config
            .issuer
            .parse()
            .map_err(|_| JwtConfigError::InvalidIssuerUrl(config.issuer.clone()))?;
        if issuer_uri.host().is_none() {
            return Err(JwtConfigError::InvalidIssuerUrl(config.issuer));
        }
        if issuer_uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
            return Err(JwtConfigError::IssuerNotHttps(config.issuer));
        }
        if issuer_uri.query().is_some() || config.issuer.contains(WELL_KNOWN) {
            return Err(JwtConfigError::IssuerHasExtraParts(config.issuer));
        }
        if config.audiences.is_empty() || config.audiences.iter().any(String::is_empty) {
            return Err(JwtConfigError::NoAudience);
        }
        if config.audiences.len() > 1 && config.audience_match_policy != Some(AudienceMatchPolicy::MatchAny) {
            return Err(JwtConfigError::AudienceMatchPolicyRequired);
        }
        let mapper = Mapper::new(&config)?;
        let client = crate::https::client(config.ca_bundle_pem.as_deref(), &ClientAuth::None)?;
        let policy = KeyPolicy {
            min_refresh: config.jwks_min_refresh_interval,
            max_age: config.jwks_max_age,
            timeout: config.timeout,
        };
        Ok(Self {
            name: config.name.into(),
            keys: IssuerKeys::new(&config.issuer, client, policy),
            issuer: config.issuer,
            audiences: config.audiences,
            mapper,
            clock_skew: config.clock_skew,
            max_token_bytes: config.max_token_bytes,
            cache: ReviewCache::new(config.cache)?,
            login_authorization: config.login_authorization,
        })
    }

    /// The configured name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// What a user must be allowed to get a TokenCredentialRequest's certificate, if anything.
    pub fn login_authorization(&self) -> Option<&ResourceAttributes> {
        self.login_authorization.as_ref()
    }

    /// The configured issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Fetches discovery and the key set now, replacing the cached keys on success (used by the
    /// control plane to report whether an authenticator works). Returns the number of usable
    /// keys. Not rate-limited.
    pub async fn load_keys(&self) -> Result<usize, JwksError> {
        self.keys.load().await
    }

    /// Replaces the key set with the keys of a JWKS document, as if just fetched (benches and fuzz
    /// targets run without an issuer). Returns the number of usable keys; a document that does not
    /// parse, or holds no usable key, changes nothing.
    #[cfg(any(test, feature = "test-util"))]
    pub fn install_keys(&self, jwks_json: &[u8]) -> Result<usize, JwksError> {
        self.keys.install(jwks_json)
    }

    /// Authenticates a bearer token. A token that is not a JWT, or whose (unverified) `iss` is
    /// another issuer, is [`Outcome::NotMine`].
    pub async fn authenticate(&self, token: &str) -> Outcome {
        if token.len() > self.max_token_bytes {
            return Outcome::Rejected(RejectReason::TooLarge);
        }
        if !has_compact_jws_shape(token) {
            return Outcome::NotMine;
        }
        self.cache
            .get_or_review_capped(token, || self.verify(token))
            .await
    }

    /// The full check of one token: the outcome and how long it may be reused at most.
    async fn verify(&self, token: &str) -> (Outcome, Option<Duration>) {
        match self.verify_inner(token).await {
            Ok((identity, valid_for)) => (Outcome::Authenticated(Arc::new(identity)), Some(valid_for)),
            Err(Verdict::NotMine) => (Outcome::NotMine, None),
            Err(Verdict::Rejected(reason)) => (Outcome::Rejected(reason), None),
        }
    }

    async fn verify_inner(&self, token: &str) -> Result<(Identity, Duration), Verdict> {
        let jws = Jws::parse(token).map_err(|_| Verdict::Rejected(RejectReason::Malformed))?;
        // Routing only: the issuer is trusted after the signature verifies.
        if jws.claims.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return Err(Verdict::NotMine);
        }
        if jws.header.crit.is_some() {
            return Err(Verdict::Rejected(RejectReason::Malformed));
        }
        self.keys.verify(&jws).await.map_err(|e| {
            Verdict::Rejected(match e {
                VerifyError::Token(
                    JoseError::UnsupportedAlgorithm(_) | JoseError::AlgorithmNotAllowed(_),
                ) => RejectReason::UnsupportedAlgorithm,
                VerifyError::Token(JoseError::UnknownKey(_)) => RejectReason::UnknownKey,
                VerifyError::Token(JoseError::BadSignature) => RejectReason::BadSignature,
                VerifyError::Token(_) => RejectReason::Malformed,
                VerifyError::Unavailable => RejectReason::UpstreamUnavailable,
                _ => RejectReason::UpstreamUnavailable,
            })
        })?;
        self.identity_from(&jws.claims)
    }

    /// Checks the time and audience claims and maps the claims to a user. Returns the identity and
    /// how long the token remains valid.
    fn identity_from(&self, claims: &Map<String, Value>) -> Result<(Identity, Duration), Verdict> {
        let reject = |reason| Verdict::Rejected(reason);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| reject(RejectReason::Expired))?
            .as_secs_f64();
        let skew = self.clock_skew.as_secs_f64();
        // NumericDate: seconds since the epoch, finite and no later than 9999-12-31 (what any
        // issuer can mean); anything else is an invalid claim, never a time this code computes with.
        let time_claim = |name: &str| match claims.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|seconds| seconds.is_finite() && seconds.abs() <= MAX_NUMERIC_DATE)
                .map(Some)
                .ok_or(reject(RejectReason::ClaimInvalid)),
            Some(_) => Err(reject(RejectReason::ClaimInvalid)),
        };
        let exp = time_claim("exp")?.ok_or(reject(RejectReason::ClaimInvalid))?;
        if now > exp + skew {
            return Err(reject(RejectReason::Expired));
        }
        if time_claim("nbf")?.is_some_and(|nbf| now + skew < nbf)
            || time_claim("iat")?.is_some_and(|iat| now + skew < iat)
        {
            return Err(reject(RejectReason::NotYetValid));
        }
        let audiences = mapping::strings(claims.get("aud")).ok_or(reject(RejectReason::ClaimInvalid))?;
        if !audiences.iter().any(|aud| self.audiences.contains(aud)) {
            return Err(reject(RejectReason::WrongAudience));
        }

        let user = self.mapper.user(&self.name, claims)?;
        let identity = Identity {
            user,
            authenticator: self.name.clone(),
            audiences: audiences
                .into_iter()
                .filter(|aud| self.audiences.contains(aud))
                .collect(),
            forwarding: Forwarding::Impersonate,
        };
        let valid_for = Duration::try_from_secs_f64((exp + skew - now).max(0.0)).unwrap_or(Duration::MAX);
        Ok((identity, valid_for))
    }
}

/// The latest NumericDate a time claim may hold: 9999-12-31T23:59:59Z.
const MAX_NUMERIC_DATE: f64 = 253_402_300_799.0;

/// Why a token was not accepted, before it becomes an [`Outcome`].
enum Verdict {
    NotMine,
    Rejected(RejectReason),
}

/// Whether `token` has the shape of a compact JWS: exactly two `.` separators. Runs on every
/// bearer token the authenticator sees, cached or not, so it uses a vectorised search (a byte
/// loop cost a third of a cache hit on a 642-byte token). Says nothing of what the parts hold.
pub fn has_compact_jws_shape(token: &str) -> bool {
    let mut dots = memchr::memchr_iter(b'.', token.as_bytes());
    dots.next().is_some() && dots.next().is_some() && dots.next().is_none()
}
