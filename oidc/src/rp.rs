//! The OIDC relying party: of `selkie login oidc` against an issuer, and of the Supervisor against
//! its upstream identity providers. Discovery, the authorization request (PKCE S256, state,
//! nonce), the token endpoint (authorization code, refresh, resource-owner password, RFC 8693
//! exchange), the Supervisor's `cli_password` authorize call, the device authorization grant
//! (RFC 8628: the device authorization request, with PKCE and a nonce as Selkie's extensions,
//! and one poll of the token endpoint at a time; the caller keeps the interval), and ID token
//! validation against the issuer's JWKS (signature, `iss`, `aud`, `exp`, `nonce`).
//!
//! Given a DPoP key ([`Provider::with_dpop_key`]), every token endpoint request carries a DPoP
//! proof of it (RFC 9449), with the nonce the token endpoint last sent, and a request refused
//! with `use_dpop_nonce` is sent once more with the nonce that refusal carries.
//!
//! Every error is one line that names the issuer or endpoint and what to do; none quotes a
//! token, a code, a password or a response body that could hold one.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use arc_swap::ArcSwapOption;
use base64::{
    engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD},
    Engine as _,
};
use ring::rand::SecureRandom as _;
use serde::Deserialize;
use serde_json::Map;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

pub use crate::discovery::Discovery;
use crate::{
    discovery::{DiscoveryError, MAX_DOCUMENT_BYTES},
    dpop,
    https::{accept_json, retrying, HttpError, HttpsClient, Response, TlsError, TlsOptions, RETRY_DELAYS},
    jose::{parse_jwks, sign::SigningKey, JoseError, Jws, VerifyingKey},
};

/// The timeout of each HTTP request to the issuer (pinniped's `httpRequestTimeout`).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(60);
/// Header carrying the username in the Supervisor's `cli_password` flow.
pub const USERNAME_HEADER: &str = "Pinniped-Username";
/// Header carrying the password in the Supervisor's `cli_password` flow.
pub const PASSWORD_HEADER: &str = "Pinniped-Password";
/// The largest token endpoint answer read.
const MAX_ANSWER_BYTES: usize = 4 << 20;
/// The longest access-token lifetime believed from a token response's `expires_in`. A longer one
/// (some issuers answer years, or `2^63 - 1`, for "does not expire") is clamped to this: the token
/// is then only believed valid for a day and is refreshed or replaced after that, which is always
/// safe, while believing it valid for years (or overflowing the clock) is not. No mainstream
/// issuer hands out access tokens valid for longer (Okta and Entra ID cap them at a day).
pub const MAX_ACCESS_TOKEN_LIFETIME: time::Duration = time::Duration::hours(24);

/// Why a step of the OIDC login failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OidcError {
    /// `--issuer` is not an https URL.
    #[error("--issuer {0:?} must be an https:// URL")]
    BadIssuer(String),
    /// The CA bundle or TLS settings could not be used.
    #[error("{0}")]
    Tls(TlsError),
    /// Discovery could not be fetched (unreachable, TLS failure, timeout).
    #[error(
        "could not perform OIDC discovery for {issuer}: {cause}; check --issuer, and pass the issuer's CA with \
         --ca-bundle or --ca-bundle-data if it is not publicly trusted"
    )]
    Discovery {
        /// The issuer.
        issuer: String,
        /// The HTTP error.
        cause: HttpError,
    },
    /// The discovery document was not usable.
    #[error("OIDC discovery for {issuer} failed: {reason}")]
    BadDiscovery {
        /// The issuer.
        issuer: String,
        /// What is wrong.
        reason: String,
    },
    /// A request to an endpoint could not be made.
    #[error("{what} failed: {cause}")]
    Request {
        /// The step.
        what: &'static str,
        /// The HTTP error.
        cause: HttpError,
    },
    /// The token endpoint refused the request.
    #[error("{what} failed: the token endpoint answered {status} {error}{description}")]
    TokenEndpoint {
        /// The step.
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// OAuth2 `error`.
        error: String,
        /// `: error_description`, if any.
        description: String,
    },
    /// The token endpoint's answer was not usable.
    #[error("{what} failed: {reason}")]
    BadTokenResponse {
        /// The step.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The token endpoint's `expires_in` is negative. RFC 6749 §5.1 makes it a lifetime in
    /// seconds; below zero it is meaningless, so the answer is refused rather than guessed at. The
    /// issuer (or a proxy rewriting its answers) is at fault.
    #[error(
        "{what} failed: the token endpoint answered expires_in {seconds}, a negative lifetime; \
         the issuer is misbehaving"
    )]
    NegativeExpiresIn {
        /// The step.
        what: &'static str,
        /// The `expires_in` received (a number, never a secret).
        seconds: i64,
    },
    /// The ID token did not validate.
    #[error("the issuer returned an invalid ID token: {0}")]
    IdToken(String),
    /// No secure randomness.
    #[error("could not generate random login parameters")]
    Random,
    /// A DPoP proof could not be made (no secure randomness, or the key cannot sign).
    #[error("{what} failed: could not make a DPoP proof: {cause}")]
    DpopProof {
        /// The step.
        what: &'static str,
        /// Why (never key material).
        cause: JoseError,
    },
    /// The device authorization endpoint refused to start a device login (RFC 8628 §3.2; the
    /// OAuth 2.0 error of RFC 6749 §5.2): a client, scope or identity provider the issuer does
    /// not allow, or, with 429 or a 5xx status, an issuer that cannot answer now.
    #[error(
        "requesting a device login failed: the device authorization endpoint answered {status} \
         {error}{description}"
    )]
    DeviceAuthorization {
        /// The HTTP status.
        status: u16,
        /// OAuth2 `error`.
        error: String,
        /// `: error_description`, if any.
        description: String,
    },
    /// The token endpoint answered a device-code poll with `access_denied` (RFC 8628 §3.5): the
    /// user refused the login, or it failed at the identity provider.
    #[error("the device login was denied: access_denied{description}")]
    DeviceAccessDenied {
        /// `: error_description`, if any.
        description: String,
    },
    /// The token endpoint answered a device-code poll with `expired_token` (RFC 8628 §3.5): the
    /// user did not finish the login in the browser before the device code expired.
    #[error(
        "the device code expired before the login was completed (expired_token{description}); \
         run the command again"
    )]
    DeviceCodeExpired {
        /// `: error_description`, if any.
        description: String,
    },
}

impl OidcError {
    /// Whether the same request may succeed later: the server could not be reached, timed out,
    /// or answered 429 or a 5xx status. Refusals (4xx) and malformed answers are final.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Request { .. } | Self::Discovery { .. } => true,
            Self::TokenEndpoint { status, .. } | Self::DeviceAuthorization { status, .. } => {
                *status == 429 || *status >= 500
            }
            _ => false,
        }
    }

    /// Whether sending the same request again at once may succeed, in the narrower sense of
    /// [`HttpError::is_retryable`]: the connection was refused, reset or closed before an
    /// answer, or the token endpoint answered 429, 502, 503 or 504 (an issuer's pod restarting
    /// or killed behind its Service or load balancer). A timeout has spent its time already.
    pub fn is_retryable_at_once(&self) -> bool {
        match self {
            Self::Request { cause, .. } => cause.is_retryable(),
            Self::TokenEndpoint { status, .. } => {
                http::StatusCode::from_u16(*status).is_ok_and(crate::https::is_retryable_status)
            }
            _ => false,
        }
    }
}

/// A discovered issuer and an HTTP client that trusts it.
pub struct Provider {
    /// The issuer URL as given.
    pub issuer: String,
    /// Its discovery document.
    pub discovery: Discovery,
    /// The client of every request to the issuer; possibly shared with other providers of the
    /// same TLS options ([`Provider::discover_with`]).
    client: Arc<HttpsClient>,
    /// The bound of each request to the issuer ([`HTTP_TIMEOUT`] unless
    /// [`Provider::with_timeout`] says otherwise).
    timeout: Duration,
    /// The issuer's keys as last fetched (again when no key verifies a token).
    jwks: ArcSwapOption<Vec<VerifyingKey>>,
    /// The key every token endpoint request proves possession of, when one was given
    /// ([`Provider::with_dpop_key`]).
    dpop: Option<Dpop>,
}

/// A provider's DPoP key and what it remembers for its proofs.
struct Dpop {
    key: Arc<SigningKey>,
    /// The `DPoP-Nonce` the token endpoint last sent (a nonce is not a secret to the client, but
    /// it is never printed either).
    nonce: Mutex<Option<String>>,
    /// Seconds since the epoch, a proof's `iat`: the system clock ([`unix_now`]); tests fix it.
    now: fn() -> i64,
}

/// The longest `DPoP-Nonce` kept (a server's nonce is tens of bytes; a proof carrying a longer
/// one could pass the server's bound on proofs, [`dpop::MAX_PROOF_BYTES`]).
const MAX_DPOP_NONCE_BYTES: usize = 1024;

/// The system clock in seconds since the epoch.
fn unix_now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

impl Dpop {
    /// The `DPoP` header of a fresh proof (new `jti`) for a POST to `endpoint`, with the last
    /// nonce. Marked sensitive, as HTTP tooling then keeps it out of its logs.
    fn header(
        &self,
        what: &'static str,
        endpoint: &str,
    ) -> Result<(http::HeaderName, http::HeaderValue), OidcError> {
        let nonce = self.nonce.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let proof = dpop::proof(&self.key, "POST", endpoint, nonce.as_deref(), (self.now)())
            .map_err(|cause| OidcError::DpopProof { what, cause })?;
        let mut value = http::HeaderValue::from_str(&proof).map_err(|_| OidcError::DpopProof {
            what,
            cause: JoseError::Signing,
        })?;
        value.set_sensitive(true);
        // `dpop::HEADER`, lower-cased as a static header name must be.
        Ok((http::HeaderName::from_static("dpop"), value))
    }

    /// Keeps the `DPoP-Nonce` of `headers`, if it has a usable one (visible ASCII, at most
    /// [`MAX_DPOP_NONCE_BYTES`]); says whether it had.
    fn remember_nonce(&self, headers: &http::HeaderMap) -> bool {
        let Some(nonce) = headers
            .get(dpop::NONCE_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|nonce| !nonce.is_empty() && nonce.len() <= MAX_DPOP_NONCE_BYTES)
        else {
            return false;
        };
        *self.nonce.lock().unwrap_or_else(PoisonError::into_inner) = Some(nonce.to_string());
        true
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// Random login parameters: state, nonce and the PKCE verifier.
#[derive(Clone)]
pub struct LoginParams {
    /// `state`.
    pub state: String,
    /// `nonce`.
    pub nonce: String,
    /// The PKCE code verifier (43 characters).
    pub verifier: String,
}

impl std::fmt::Debug for LoginParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoginParams(<redacted>)")
    }
}

impl LoginParams {
    /// Fresh random parameters (32 random bytes each, base64url).
    pub fn generate() -> Result<Self, OidcError> {
        let rng = ring::rand::SystemRandom::new();
        let random = || -> Result<String, OidcError> {
            let mut bytes = [0u8; 32];
            rng.fill(&mut bytes).map_err(|_| OidcError::Random)?;
            Ok(URL_SAFE_NO_PAD.encode(bytes))
        };
        Ok(Self {
            state: random()?,
            nonce: random()?,
            verifier: random()?,
        })
    }

    /// The S256 challenge of the verifier.
    pub fn challenge(&self) -> String {
        URL_SAFE_NO_PAD.encode(Sha256::digest(self.verifier.as_bytes()))
    }
}

/// The tokens of one token endpoint answer.
#[derive(Default)]
pub struct Tokens {
    /// The access token, if one was issued.
    pub access: Option<AccessToken>,
    /// The validated ID token, if one was issued.
    pub id: Option<IdToken>,
    /// The refresh token, if one was issued.
    pub refresh: Option<RefreshToken>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("access", &self.access)
            .field("id", &self.id)
            .field("refresh", &self.refresh)
            .finish()
    }
}

/// An access token.
#[derive(Clone)]
pub struct AccessToken {
    /// The token.
    pub token: String,
    /// `token_type` (`Bearer`).
    pub token_type: String,
    /// When it expires: the answer's time plus its `expires_in`, at most
    /// [`MAX_ACCESS_TOKEN_LIFETIME`] away. `None` when the answer gave no `expires_in` or gave 0
    /// (as golang.org/x/oauth2 reads it: unknown); callers must not take `None` for "valid".
    pub expiry: Option<OffsetDateTime>,
}

/// An ID token whose signature, issuer, audience, expiry (and nonce, when asked) were checked.
#[derive(Clone)]
pub struct IdToken {
    /// The token.
    pub token: String,
    /// Its claims.
    pub claims: Map<String, Value>,
    /// Its `exp`.
    pub expiry: OffsetDateTime,
}

/// A refresh token.
#[derive(Clone)]
pub struct RefreshToken {
    /// The token.
    pub token: String,
}

impl std::fmt::Debug for IdToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdToken")
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken")
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RefreshToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RefreshToken(<redacted>)")
    }
}

/// Who the client is and what it asks for.
#[derive(Clone)]
pub struct ClientConfig {
    /// The OAuth client ID (`pinniped-cli` for the CLI).
    pub client_id: String,
    /// The client secret of a confidential client (the Supervisor at its upstreams), sent with
    /// HTTP Basic authentication (RFC 6749 §2.3.1); `None` for a public client, which sends its
    /// `client_id` in the form instead.
    pub client_secret: Option<String>,
    /// The scopes, in order.
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    /// A public client (no secret).
    pub fn public(client_id: &str, scopes: Vec<String>) -> Self {
        Self {
            client_id: client_id.to_string(),
            client_secret: None,
            scopes,
        }
    }
}

/// What kind of token [`Provider::revoke`] revokes (RFC 7009 `token_type_hint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenTypeHint {
    /// A refresh token.
    RefreshToken,
    /// An access token.
    AccessToken,
}

impl TokenTypeHint {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RefreshToken => "refresh_token",
            Self::AccessToken => "access_token",
        }
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    access_token: String,
    #[serde(default)]
    token_type: String,
    #[serde(default)]
    refresh_token: Option<String>,
    #[serde(default)]
    expires_in: Option<i64>,
    #[serde(default)]
    id_token: Option<String>,
    #[serde(default)]
    issued_token_type: Option<String>,
}

/// The `grant_type` of a device access token request (RFC 8628 §3.4).
pub const DEVICE_CODE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";
/// The poll interval when a device authorization answer names none (RFC 8628 §3.2).
pub const DEFAULT_DEVICE_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// The shortest poll interval used, whatever the answer says (an interval of 0 would poll in a
/// busy loop).
pub const MIN_DEVICE_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How much longer the poll interval gets after each `slow_down` (RFC 8628 §3.5).
pub const DEVICE_SLOW_DOWN_STEP: Duration = Duration::from_secs(5);
/// The longest device-code lifetime (and poll interval) believed from an answer; longer ones are
/// clamped to it, so that no deadline computed from them overflows the clock.
pub const MAX_DEVICE_CODE_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// A started device login (RFC 8628 §3.2): what the user is shown, and the device code the
/// client polls with. The device code is a credential: it is private to this type, sent only by
/// [`Provider::poll_device_token`], and never shown by `Debug`.
#[derive(Clone)]
pub struct DeviceAuthorization {
    /// `device_code`.
    device_code: String,
    /// `user_code`: what the user checks (or types) on the verification page. Not a secret.
    pub user_code: String,
    /// `verification_uri`: where the user enters the user code.
    pub verification_uri: String,
    /// `verification_uri_complete`: the verification URI with the user code in it, when the
    /// issuer gives one.
    pub verification_uri_complete: Option<String>,
    /// How long the device code is valid from the answer (`expires_in`, at most
    /// [`MAX_DEVICE_CODE_LIFETIME`]).
    pub expires_in: Duration,
    /// How long to wait before the first poll and between polls (`interval`;
    /// [`DEFAULT_DEVICE_POLL_INTERVAL`] when absent, never less than
    /// [`MIN_DEVICE_POLL_INTERVAL`] nor more than [`MAX_DEVICE_CODE_LIFETIME`]).
    pub interval: Duration,
}

impl std::fmt::Debug for DeviceAuthorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceAuthorization")
            .field("user_code", &self.user_code)
            .field("verification_uri", &self.verification_uri)
            .field("verification_uri_complete", &self.verification_uri_complete)
            .field("expires_in", &self.expires_in)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// What one poll of the token endpoint for a device login ([`Provider::poll_device_token`])
/// found.
#[derive(Debug)]
pub enum DevicePoll {
    /// `authorization_pending`: the user has not finished the login yet; poll again after the
    /// interval.
    Pending,
    /// `slow_down`: poll again, with the interval [`DEVICE_SLOW_DOWN_STEP`] longer from now on.
    SlowDown,
    /// The login is done: the tokens, the ID token validated as
    /// [`Provider::exchange_code`] validates it (nonce included).
    Tokens(Tokens),
    /// The token endpoint could not be reached, timed out, or answered 429 or a 5xx status
    /// ([`OidcError::is_retryable`]): poll again after the interval, until the device code
    /// expires.
    Unavailable(OidcError),
    /// The device login is over without tokens: [`OidcError::DeviceAccessDenied`],
    /// [`OidcError::DeviceCodeExpired`], any other OAuth 2.0 error (as
    /// [`OidcError::TokenEndpoint`]), or a token response that is not usable (its ID token
    /// included). Polling again cannot help.
    Failed(OidcError),
}

#[derive(Deserialize)]
struct DeviceAuthorizationResponse {
    #[serde(default)]
    device_code: String,
    #[serde(default)]
    user_code: String,
    #[serde(default)]
    verification_uri: String,
    #[serde(default)]
    verification_uri_complete: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    interval: Option<u64>,
}

#[derive(Deserialize)]
struct OAuthError {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

impl Provider {
    /// Fetches `<issuer>/.well-known/openid-configuration` with `tls` and checks it names the
    /// same issuer and has the endpoints a login needs. The fetch is sent again after
    /// [`RETRY_DELAYS`] while its failure is one a moment may cure ([`HttpError::is_retryable`]:
    /// a lost connection, 429, 502, 503, 504): a GET changes nothing, and a CLI run should not
    /// fail because an issuer replica is restarting behind its Service.
    pub async fn discover(issuer: &str, tls: &TlsOptions) -> Result<Self, OidcError> {
        let client = HttpsClient::new(tls).map_err(OidcError::Tls)?;
        Self::discover_retrying(issuer, Arc::new(client), &RETRY_DELAYS).await
    }

    /// [`Provider::discover`] with `client` for discovery and every later request to the
    /// issuer: a client (and its connection pool) shared with other providers of the same TLS
    /// options ([`crate::https::SharedClients`]) rather than one of its own. Sent once: the
    /// caller retries as it sees fit.
    pub async fn discover_with(issuer: &str, client: Arc<HttpsClient>) -> Result<Self, OidcError> {
        Self::discover_retrying(issuer, client, &[]).await
    }

    /// [`Provider::discover_with`], the fetch sent again after each of `delays` while its failure
    /// is one a moment may cure.
    async fn discover_retrying(
        issuer: &str,
        client: Arc<HttpsClient>,
        delays: &[Duration],
    ) -> Result<Self, OidcError> {
        let bad = |reason: String| OidcError::BadDiscovery {
            issuer: issuer.into(),
            reason,
        };
        let fetched = retrying(
            delays,
            None,
            |outcome| matches!(outcome, Err(DiscoveryError::Fetch(cause)) if cause.is_retryable()),
            || Discovery::fetch(&client, issuer, HTTP_TIMEOUT),
        )
        .await;
        let discovery = match fetched {
            Ok(discovery) => discovery,
            Err(DiscoveryError::BadIssuer(_)) => return Err(OidcError::BadIssuer(issuer.into())),
            Err(DiscoveryError::Fetch(cause @ HttpError::Status { .. })) => {
                return Err(bad(cause.to_string()))
            }
            Err(DiscoveryError::Fetch(cause)) => {
                return Err(OidcError::Discovery {
                    issuer: issuer.into(),
                    cause,
                })
            }
            Err(DiscoveryError::IssuerMismatch { found, .. }) => {
                return Err(bad(format!(
                "the document names the issuer {found:?}, not {issuer:?}; use exactly that URL as --issuer"
            )))
            }
            Err(other) => return Err(bad(other.to_string())),
        };
        for (name, value) in [
            ("authorization_endpoint", &discovery.authorization_endpoint),
            ("token_endpoint", &discovery.token_endpoint),
        ] {
            if value.is_empty() {
                return Err(bad(format!("the document has no {name}")));
            }
        }
        Ok(Self {
            issuer: issuer.into(),
            discovery,
            client,
            timeout: HTTP_TIMEOUT,
            jwks: ArcSwapOption::empty(),
            dpop: None,
        })
    }

    /// A provider from a discovery document already at hand (no request is made), with `tls` for
    /// its token endpoint and JWKS.
    pub fn from_discovery(discovery: Discovery, tls: &TlsOptions) -> Result<Self, OidcError> {
        Ok(Self {
            issuer: discovery.issuer.clone(),
            discovery,
            client: Arc::new(HttpsClient::new(tls).map_err(OidcError::Tls)?),
            timeout: HTTP_TIMEOUT,
            jwks: ArcSwapOption::empty(),
            dpop: None,
        })
    }

    /// The same provider with each later request to the issuer (token, userinfo, revocation
    /// and JWKS endpoints) bounded by `timeout` instead of [`HTTP_TIMEOUT`]: for a server whose
    /// own clients wait on these requests (the Supervisor in front of an upstream), which must
    /// give up, and answer them, before they give up on it. A request that takes longer fails as
    /// [`OidcError::Request`] with [`HttpError::Timeout`], which [`OidcError::is_retryable`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound of each request to the issuer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the issuer's discovery document says its token endpoint takes ES256 DPoP proofs
    /// ([`Discovery::supports_dpop`]).
    pub fn supports_dpop(&self) -> bool {
        self.discovery.supports_dpop()
    }

    /// The same provider proving possession of `key` (RFC 9449) at every request to the token
    /// endpoint ([`Provider::exchange_code`], [`Provider::refresh`],
    /// [`Provider::password_grant`], [`Provider::poll_device_token`],
    /// [`Provider::token_exchange`]): a `DPoP` header with a fresh proof for `POST` and the token
    /// endpoint's URL, made at the system clock's time, carrying the `DPoP-Nonce` the token
    /// endpoint last answered with (kept from every answer). A request refused with 400
    /// `use_dpop_nonce` and a `DPoP-Nonce` is sent once more with a new proof carrying it. The
    /// issuer then binds the tokens to the key. Without a key (the Supervisor at its upstreams)
    /// no proof is sent.
    pub fn with_dpop_key(mut self, key: Arc<SigningKey>) -> Self {
        self.dpop = Some(Dpop {
            key,
            nonce: Mutex::new(None),
            now: unix_now,
        });
        self
    }

    /// Whether a DPoP key was given ([`Provider::with_dpop_key`]).
    pub fn has_dpop_key(&self) -> bool {
        self.dpop.is_some()
    }

    /// The authorization URL for a browser login; `extra` parameters (the CLI's
    /// `access_type=offline`, an upstream's additional authorize parameters) come last.
    pub fn authorize_url(
        &self,
        config: &ClientConfig,
        params: &LoginParams,
        redirect_uri: &str,
        extra: &[(&str, &str)],
    ) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("client_id", &config.client_id)
            .append_pair("code_challenge", &params.challenge())
            .append_pair("code_challenge_method", "S256")
            .append_pair("nonce", &params.nonce)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("response_type", "code")
            .append_pair("scope", &config.scopes.join(" "))
            .append_pair("state", &params.state);
        for (name, value) in extra {
            query.append_pair(name, value);
        }
        let endpoint = &self.discovery.authorization_endpoint;
        let separator = if endpoint.contains('?') { '&' } else { '?' };
        format!("{endpoint}{separator}{}", query.finish())
    }

    /// Redeems an authorization code (with the PKCE verifier) and validates the ID token,
    /// whose nonce must be `params.nonce`.
    pub async fn exchange_code(
        &self,
        config: &ClientConfig,
        params: &LoginParams,
        code: &str,
        redirect_uri: &str,
    ) -> Result<Tokens, OidcError> {
        let what = "redeeming the authorization code";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("code", code)
            .append_pair("code_verifier", &params.verifier)
            .append_pair("grant_type", "authorization_code")
            .append_pair("redirect_uri", redirect_uri)
            .finish();
        let response = self.token_request(what, config, body).await?;
        self.tokens(what, config, response, Some(&params.nonce), true)
            .await
    }

    /// Uses a refresh token. The new ID token (if any) is validated without a nonce, as pinniped
    /// does; without one, the old ID token is not kept.
    pub async fn refresh(&self, config: &ClientConfig, refresh_token: &str) -> Result<Tokens, OidcError> {
        let what = "refreshing the session";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "refresh_token")
            .append_pair("refresh_token", refresh_token)
            .finish();
        let response = self.token_request(what, config, body).await?;
        let mut tokens = self.tokens(what, config, response, None, false).await?;
        if tokens.refresh.is_none() {
            tokens.refresh = Some(RefreshToken {
                token: refresh_token.into(),
            });
        }
        Ok(tokens)
    }

    /// The OAuth2 resource-owner password grant, for an issuer that is not a Supervisor.
    pub async fn password_grant(
        &self,
        config: &ClientConfig,
        username: &str,
        password: &str,
    ) -> Result<Tokens, OidcError> {
        let what = "logging in with the password grant";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "password")
            .append_pair("password", password)
            .append_pair("scope", &config.scopes.join(" "))
            .append_pair("username", username)
            .finish();
        let response = self.token_request(what, config, body).await?;
        self.tokens(what, config, response, None, true).await
    }

    /// RFC 8628 §4: the issuer's `device_authorization_endpoint`, or `None` when its discovery
    /// document names none (a Supervisor names it only for a FederationDomain that enables the
    /// device flow).
    pub fn device_authorization_endpoint(&self) -> Option<&str> {
        Some(self.discovery.device_authorization_endpoint.as_str()).filter(|endpoint| !endpoint.is_empty())
    }

    /// RFC 8628 §3.1–3.2: starts a device login at `endpoint` (the issuer's
    /// [`Provider::device_authorization_endpoint`]) as `config`'s client, for its scopes, with
    /// the PKCE S256 challenge and the nonce of `params` (Selkie's extensions: they bind the
    /// device login to this run of the client as they bind a browser login; redeem it with
    /// [`Provider::poll_device_token`] and the same `params`), `extra` parameters last (a
    /// Supervisor's `pinniped_idp_name` and `pinniped_idp_type`). Returns the device code and
    /// what to show the user. Fails with [`OidcError::Request`] when the endpoint cannot be
    /// reached, [`OidcError::DeviceAuthorization`] when it answers other than 200 (its OAuth 2.0
    /// error and description quoted), and [`OidcError::BadTokenResponse`] when the answer lacks
    /// a member or has a user code or URI that cannot be shown on a terminal.
    pub async fn device_authorization(
        &self,
        endpoint: &str,
        config: &ClientConfig,
        params: &LoginParams,
        extra: &[(&str, &str)],
    ) -> Result<DeviceAuthorization, OidcError> {
        let what = "requesting a device login";
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("code_challenge", &params.challenge())
            .append_pair("code_challenge_method", "S256")
            .append_pair("nonce", &params.nonce)
            .append_pair("scope", &config.scopes.join(" "));
        for (name, value) in extra {
            form.append_pair(name, value);
        }
        let response = match self.form_request(what, endpoint, config, form.finish()).await {
            Ok(response) => response,
            Err(OidcError::TokenEndpoint {
                status,
                error,
                description,
                ..
            }) => {
                return Err(OidcError::DeviceAuthorization {
                    status,
                    error,
                    description,
                })
            }
            Err(other) => return Err(other),
        };
        device_authorization_answer(what, &response.body)
    }

    /// RFC 8628 §3.4–3.5: one poll of the token endpoint for the device login `authorization`
    /// (started with `params` by [`Provider::device_authorization`]), sending its device code
    /// and the PKCE verifier as `config`'s client. The caller waits the interval before each
    /// poll and stops at the device code's expiry. Never fails itself: what the answer means is
    /// the [`DevicePoll`], the tokens (their ID token validated as [`Provider::exchange_code`]
    /// validates it, nonce included) once the user has finished the login.
    pub async fn poll_device_token(
        &self,
        config: &ClientConfig,
        params: &LoginParams,
        authorization: &DeviceAuthorization,
    ) -> DevicePoll {
        let what = "polling for the device login";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("code_verifier", &params.verifier)
            .append_pair("device_code", &authorization.device_code)
            .append_pair("grant_type", DEVICE_CODE_GRANT)
            .finish();
        let response = match self.token_request(what, config, body).await {
            Ok(response) => response,
            Err(OidcError::TokenEndpoint {
                what,
                status,
                error,
                description,
            }) => {
                return match error.as_str() {
                    "authorization_pending" => DevicePoll::Pending,
                    "slow_down" => DevicePoll::SlowDown,
                    "access_denied" => DevicePoll::Failed(OidcError::DeviceAccessDenied { description }),
                    "expired_token" => DevicePoll::Failed(OidcError::DeviceCodeExpired { description }),
                    _ => {
                        let error = OidcError::TokenEndpoint {
                            what,
                            status,
                            error,
                            description,
                        };
                        if error.is_retryable() {
                            DevicePoll::Unavailable(error)
                        } else {
                            DevicePoll::Failed(error)
                        }
                    }
                };
            }
            Err(error) if error.is_retryable() => return DevicePoll::Unavailable(error),
            Err(error) => return DevicePoll::Failed(error),
        };
        // The device code is redeemed now: a failure from here on (the JWKS unreachable
        // included) is final, as polling again would only find the code used.
        match self
            .tokens(what, config, response, Some(&params.nonce), true)
            .await
        {
            Ok(tokens) => DevicePoll::Tokens(tokens),
            Err(error) => DevicePoll::Failed(error),
        }
    }

    /// RFC 7009: asks the issuer to revoke `token`, a refresh or access token it issued
    /// (`hint`). Returns `false`, having sent nothing, when the issuer announced no
    /// `revocation_endpoint`; `true` once it answered 200 (which RFC 7009 also answers for a token
    /// it no longer knows). Fails with [`OidcError::Request`] when it cannot be reached and
    /// [`OidcError::TokenEndpoint`] for any other status; [`OidcError::is_retryable`] tells
    /// whether trying again later may help.
    pub async fn revoke(
        &self,
        config: &ClientConfig,
        token: &str,
        hint: TokenTypeHint,
    ) -> Result<bool, OidcError> {
        if self.discovery.revocation_endpoint.is_empty() {
            return Ok(false);
        }
        let what = match hint {
            TokenTypeHint::RefreshToken => "revoking the refresh token",
            TokenTypeHint::AccessToken => "revoking the access token",
        };
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("token", token)
            .append_pair("token_type_hint", hint.as_str())
            .finish();
        self.form_request(what, &self.discovery.revocation_endpoint, config, body)
            .await?;
        Ok(true)
    }

    /// OIDC Core §5.3: the claims the issuer's `userinfo_endpoint` returns for `access_token`
    /// (JSON answers only). Fails when the issuer has no userinfo endpoint, cannot be reached,
    /// refuses the token (any status but 200), or answers something other than a JSON object
    /// with a `sub`.
    pub async fn userinfo(&self, access_token: &str) -> Result<Map<String, Value>, OidcError> {
        let what = "reading the userinfo endpoint";
        let bad = |reason: &str| OidcError::BadTokenResponse {
            what,
            reason: reason.to_string(),
        };
        if self.discovery.userinfo_endpoint.is_empty() {
            return Err(bad("the issuer has no userinfo_endpoint"));
        }
        let mut bearer = http::HeaderValue::from_str(&format!("Bearer {access_token}"))
            .map_err(|_| bad("the access token cannot be sent in an HTTP header"))?;
        bearer.set_sensitive(true);
        let response = self
            .client
            .send(
                http::Method::GET,
                &self.discovery.userinfo_endpoint,
                &[(http::header::AUTHORIZATION, bearer), accept_json()],
                bytes::Bytes::new(),
                MAX_ANSWER_BYTES,
                Some(self.timeout),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })?;
        if response.status != http::StatusCode::OK {
            return Err(OidcError::TokenEndpoint {
                what,
                status: response.status.as_u16(),
                error: "(the access token was not accepted)".into(),
                description: String::new(),
            });
        }
        let claims: Map<String, Value> =
            serde_json::from_slice(&response.body).map_err(|_| bad("the answer is not a JSON object"))?;
        if !claims.get("sub").is_some_and(Value::is_string) {
            return Err(bad("the answer has no sub"));
        }
        Ok(claims)
    }

    /// A Pinniped Supervisor's identity-provider discovery document (the JSON at the
    /// `pinniped_identity_providers_endpoint` its discovery names). Fails when the issuer
    /// publishes no such endpoint, cannot be reached, answers other than 200, or answers
    /// something other than a JSON object.
    pub async fn identity_providers(&self) -> Result<Map<String, Value>, OidcError> {
        let what = "reading the identity-provider discovery";
        let bad = |reason: &str| OidcError::BadTokenResponse {
            what,
            reason: reason.to_string(),
        };
        let Some(endpoint) = self
            .discovery
            .supervisor
            .as_ref()
            .and_then(|supervisor| supervisor["pinniped_identity_providers_endpoint"].as_str())
            .filter(|endpoint| !endpoint.is_empty())
        else {
            return Err(bad(
                "the issuer publishes no pinniped_identity_providers_endpoint",
            ));
        };
        let response = self
            .client
            .send(
                http::Method::GET,
                endpoint,
                &[accept_json()],
                bytes::Bytes::new(),
                MAX_ANSWER_BYTES,
                Some(self.timeout),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })?;
        if response.status != http::StatusCode::OK {
            return Err(bad(&format!("the endpoint answered {}", response.status)));
        }
        serde_json::from_slice(&response.body).map_err(|_| bad("the answer is not a JSON object"))
    }

    /// The Supervisor's `cli_password` authorize request: credentials in headers, the code in
    /// the `Location` of the redirect to `redirect_uri`. Returns the code.
    pub async fn supervisor_password_authorize(
        &self,
        authorize_url: &str,
        redirect_uri: &str,
        state: &str,
        username: &str,
        password: &str,
    ) -> Result<String, OidcError> {
        let what = "the password login at the authorize endpoint";
        let header = |name: &'static str, value: &str| {
            http::HeaderValue::from_str(value)
                .map(|value| (http::HeaderName::from_static(name), value))
                .map_err(|_| OidcError::Request {
                    what,
                    cause: HttpError::BadUrl {
                        url: authorize_url.to_string(),
                        reason: format!("the {name} header value is not valid in HTTP"),
                    },
                })
        };
        let headers = [
            header("pinniped-username", username)?,
            header("pinniped-password", password)?,
        ];
        let response = self
            .client
            .send(
                http::Method::GET,
                authorize_url,
                &headers,
                bytes::Bytes::new(),
                MAX_ANSWER_BYTES,
                Some(self.timeout),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })?;
        if !response.status.is_redirection() {
            return Err(OidcError::BadTokenResponse {
                what,
                reason: format!(
                    "expected to be redirected, but the response status was {}{}",
                    response.status,
                    error_detail(&response.body)
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ),
            });
        }
        let location = response
            .headers
            .get(http::header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        let Some(query) = location
            .strip_prefix(redirect_uri)
            .and_then(|rest| rest.strip_prefix('?'))
        else {
            return Err(OidcError::BadTokenResponse {
                what,
                reason: "redirected to the wrong location".into(),
            });
        };
        match CallbackParams::parse(query).outcome(state) {
            CallbackOutcome::Code(code) => Ok(code),
            CallbackOutcome::Failed(reason) => Err(OidcError::BadTokenResponse { what, reason }),
        }
    }

    /// RFC 8693: exchanges the access token for an ID token with audience `audience`. The
    /// request is sent again after [`RETRY_DELAYS`] while its failure is one a moment may cure
    /// ([`OidcError::is_retryable_at_once`]): the exchange issues a token and changes nothing, so
    /// a Supervisor replica restarting does not fail the `kubectl` command that needed it.
    pub async fn token_exchange(
        &self,
        config: &ClientConfig,
        access_token: &str,
        audience: &str,
    ) -> Result<IdToken, OidcError> {
        let what = "the RFC 8693 token exchange for --request-audience";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("audience", audience)
            .append_pair("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange")
            .append_pair("requested_token_type", "urn:ietf:params:oauth:token-type:jwt")
            .append_pair("subject_token", access_token)
            .append_pair(
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            )
            .finish();
        // An exchange changes nothing at the issuer: what a moment may cure is sent again.
        let response = retrying(
            &RETRY_DELAYS,
            None,
            |outcome| outcome.as_ref().is_err_and(OidcError::is_retryable_at_once),
            || self.token_request(what, config, body.clone()),
        )
        .await?;
        let answer: TokenResponse =
            serde_json::from_slice(&response.body).map_err(|e| OidcError::BadTokenResponse {
                what,
                reason: format!("the answer is not a token response: {e}"),
            })?;
        if answer.token_type != "N_A"
            || answer.issued_token_type.as_deref() != Some("urn:ietf:params:oauth:token-type:jwt")
        {
            return Err(OidcError::BadTokenResponse {
                what,
                reason: format!(
                    "unexpected token_type {:?} / issued_token_type {:?}",
                    answer.token_type,
                    answer.issued_token_type.unwrap_or_default()
                ),
            });
        }
        self.validate_id_token(&answer.access_token, audience, None).await
    }

    /// POSTs the form `body` to `endpoint` as `config`'s client (HTTP Basic for a confidential
    /// client, `client_id` in the form for a public one). Returns the 200 answer; any other status
    /// is [`OidcError::TokenEndpoint`] with the OAuth 2.0 error the answer names.
    async fn form_request(
        &self,
        what: &'static str,
        endpoint: &str,
        config: &ClientConfig,
        body: String,
    ) -> Result<Response, OidcError> {
        let response = self.post_form(what, endpoint, config, body, None).await?;
        oauth_answer(what, response)
    }

    /// [`Provider::form_request`] to the token endpoint, with a DPoP proof when the provider has
    /// a key ([`Provider::with_dpop_key`]): the nonce of every answer is kept for the next
    /// proof, and a 400 `use_dpop_nonce` answer that carries a nonce is followed by one more
    /// request, with a new proof carrying it.
    async fn token_request(
        &self,
        what: &'static str,
        config: &ClientConfig,
        body: String,
    ) -> Result<Response, OidcError> {
        let endpoint = self.discovery.token_endpoint.as_str();
        let Some(dpop) = &self.dpop else {
            return self.form_request(what, endpoint, config, body).await;
        };
        let proof = dpop.header(what, endpoint)?;
        let mut response = self
            .post_form(what, endpoint, config, body.clone(), Some(proof))
            .await?;
        if dpop.remember_nonce(&response.headers)
            && response.status == http::StatusCode::BAD_REQUEST
            && oauth_error_code(&response.body).as_deref() == Some(dpop::USE_NONCE_ERROR)
        {
            let proof = dpop.header(what, endpoint)?;
            response = self.post_form(what, endpoint, config, body, Some(proof)).await?;
            dpop.remember_nonce(&response.headers);
        }
        oauth_answer(what, response)
    }

    /// POSTs the form `body` to `endpoint` as `config`'s client, with the `dpop` header if
    /// given. Returns the answer, whatever its status; fails only when no answer came.
    async fn post_form(
        &self,
        what: &'static str,
        endpoint: &str,
        config: &ClientConfig,
        body: String,
        dpop: Option<(http::HeaderName, http::HeaderValue)>,
    ) -> Result<Response, OidcError> {
        let form = (
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let mut headers = vec![form, accept_json()];
        headers.extend(dpop);
        let body = match &config.client_secret {
            Some(secret) => {
                let escape =
                    |text: &str| form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
                let credentials = format!("{}:{}", escape(&config.client_id), escape(secret));
                let mut value =
                    http::HeaderValue::from_str(&format!("Basic {}", STANDARD.encode(credentials))).map_err(
                        |_| OidcError::BadTokenResponse {
                            what,
                            reason: "the client credentials cannot be sent in an HTTP header".into(),
                        },
                    )?;
                value.set_sensitive(true);
                headers.push((http::header::AUTHORIZATION, value));
                body
            }
            None => {
                let client_id = form_urlencoded::Serializer::new(String::new())
                    .append_pair("client_id", &config.client_id)
                    .finish();
                format!("{client_id}&{body}")
            }
        };
        self.client
            .send(
                http::Method::POST,
                endpoint,
                &headers,
                body.into(),
                MAX_ANSWER_BYTES,
                Some(self.timeout),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })
    }

    /// A token response's tokens, the ID token validated (and required when `need_id_token`).
    async fn tokens(
        &self,
        what: &'static str,
        config: &ClientConfig,
        response: Response,
        nonce: Option<&str>,
        need_id_token: bool,
    ) -> Result<Tokens, OidcError> {
        let answer: TokenResponse =
            serde_json::from_slice(&response.body).map_err(|e| OidcError::BadTokenResponse {
                what,
                reason: format!("the answer is not a token response: {e}"),
            })?;
        let now = OffsetDateTime::now_utc();
        let id = match answer.id_token.filter(|token| !token.is_empty()) {
            Some(token) => Some(self.validate_id_token(&token, &config.client_id, nonce).await?),
            None if need_id_token => {
                return Err(OidcError::BadTokenResponse {
                    what,
                    reason: "the answer has no id_token (is the openid scope requested?)".into(),
                })
            }
            None => None,
        };
        let access = if answer.access_token.is_empty() {
            None
        } else {
            Some(AccessToken {
                expiry: access_token_expiry(what, now, answer.expires_in)?,
                token: answer.access_token,
                token_type: answer.token_type,
            })
        };
        let refresh = answer
            .refresh_token
            .filter(|token| !token.is_empty())
            .map(|token| RefreshToken { token });
        Ok(Tokens { access, id, refresh })
    }

    /// Validates an ID token: signature by a key of the issuer's JWKS (fetched once, and again
    /// when no key fits), `iss` = the discovered issuer, `aud` contains `audience`, `exp` in the
    /// future, `nonce` equal when given.
    pub async fn validate_id_token(
        &self,
        token: &str,
        audience: &str,
        nonce: Option<&str>,
    ) -> Result<IdToken, OidcError> {
        let jws = Jws::parse(token).map_err(|e| OidcError::IdToken(e.to_string()))?;
        match self.jwks.load().as_deref().map(|keys| jws.verify(keys)) {
            Some(Ok(())) => {}
            Some(Err(JoseError::UnknownKey(_) | JoseError::BadSignature)) | None => {
                let keys = self.fetch_jwks().await?;
                jws.verify(&keys).map_err(|e| OidcError::IdToken(e.to_string()))?;
                self.jwks.store(Some(Arc::new(keys)));
            }
            Some(Err(e)) => return Err(OidcError::IdToken(e.to_string())),
        }
        let claims = jws.claims;
        if claims.get("iss").and_then(Value::as_str) != Some(self.discovery.issuer.as_str()) {
            return Err(OidcError::IdToken(format!(
                "its iss is not the issuer {:?}",
                self.discovery.issuer
            )));
        }
        let audience_ok = match claims.get("aud") {
            Some(Value::String(aud)) => aud == audience,
            Some(Value::Array(auds)) => auds.iter().any(|aud| aud == audience),
            _ => false,
        };
        if !audience_ok {
            return Err(OidcError::IdToken(format!(
                "its aud does not contain {audience:?}"
            )));
        }
        let expiry = claims
            .get("exp")
            .and_then(numeric_date)
            .ok_or_else(|| OidcError::IdToken("it has no valid exp claim".into()))?;
        if expiry <= OffsetDateTime::now_utc() {
            return Err(OidcError::IdToken(format!(
                "it expired at {}; check this machine's clock",
                expiry
                    .format(&Rfc3339)
                    .unwrap_or_else(|_| expiry.unix_timestamp().to_string())
            )));
        }
        if let Some(nonce) = nonce {
            if claims.get("nonce").and_then(Value::as_str) != Some(nonce) {
                return Err(OidcError::IdToken(
                    "its nonce does not match this login's (a replayed or mixed-up login)".into(),
                ));
            }
        }
        Ok(IdToken {
            claims,
            expiry,
            token: token.into(),
        })
    }

    async fn fetch_jwks(&self) -> Result<Vec<VerifyingKey>, OidcError> {
        let what = "fetching the issuer's signing keys (jwks_uri)";
        let body = self
            .client
            .get_json(&self.discovery.jwks_uri, MAX_DOCUMENT_BYTES, Some(self.timeout))
            .await
            .map_err(|cause| match cause {
                HttpError::Status { .. } => OidcError::BadTokenResponse {
                    what,
                    reason: cause.to_string(),
                },
                cause => OidcError::Request { what, cause },
            })?;
        parse_jwks(&body).map_err(|e| OidcError::BadTokenResponse {
            what,
            reason: format!("the issuer's JWKS is not a JWK set: {e}"),
        })
    }
}

/// A device authorization answer (RFC 8628 §3.2) as [`DeviceAuthorization`]: `device_code`,
/// `user_code`, `verification_uri` and a positive `expires_in` required, `interval` defaulted
/// and bounded, the user code and URIs checked to be safe to print on a terminal (no control
/// characters; http(s) URLs). No error quotes the answer: it holds the device code.
fn device_authorization_answer(what: &'static str, body: &[u8]) -> Result<DeviceAuthorization, OidcError> {
    let bad = |reason: &str| OidcError::BadTokenResponse {
        what,
        reason: reason.to_string(),
    };
    let answer: DeviceAuthorizationResponse = serde_json::from_slice(body)
        .map_err(|_| bad("the answer is not a device authorization response (a JSON object)"))?;
    if answer.device_code.is_empty() {
        return Err(bad("the answer has no device_code"));
    }
    if answer.user_code.is_empty() {
        return Err(bad("the answer has no user_code"));
    }
    if answer.user_code.len() > 64 || answer.user_code.chars().any(char::is_control) {
        return Err(bad("the answer's user_code cannot be shown on a terminal"));
    }
    if !printable_url(&answer.verification_uri) {
        return Err(bad(
            "the answer has no verification_uri, or one that is not an http(s) URL",
        ));
    }
    let verification_uri_complete = answer.verification_uri_complete.filter(|uri| !uri.is_empty());
    if verification_uri_complete
        .as_deref()
        .is_some_and(|uri| !printable_url(uri))
    {
        return Err(bad(
            "the answer's verification_uri_complete is not an http(s) URL",
        ));
    }
    let expires_in = match answer.expires_in {
        Some(seconds) if seconds > 0 => Duration::from_secs(seconds).min(MAX_DEVICE_CODE_LIFETIME),
        _ => return Err(bad("the answer has no positive expires_in")),
    };
    let interval = answer
        .interval
        .map_or(DEFAULT_DEVICE_POLL_INTERVAL, Duration::from_secs)
        .clamp(MIN_DEVICE_POLL_INTERVAL, MAX_DEVICE_CODE_LIFETIME);
    Ok(DeviceAuthorization {
        device_code: answer.device_code,
        user_code: answer.user_code,
        verification_uri: answer.verification_uri,
        verification_uri_complete,
        expires_in,
        interval,
    })
}

/// Whether `text` is an absolute http(s) URL with no whitespace or control characters (so it
/// prints as one unbroken, harmless line).
fn printable_url(text: &str) -> bool {
    !text.chars().any(|c| c.is_control() || c.is_whitespace())
        && text
            .parse::<http::Uri>()
            .is_ok_and(|uri| matches!(uri.scheme_str(), Some("https" | "http")) && uri.authority().is_some())
}

/// What an error answer says: an OAuth2 `error_description` (or `error`), or a Kubernetes
/// `Status` `message`, on one line.
fn error_detail(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    ["error_description", "error", "message"]
        .iter()
        .find_map(|name| {
            value
                .get(name)
                .and_then(Value::as_str)
                .filter(|text| !text.is_empty())
        })
        .map(one_line)
}

/// `response` when it is 200; otherwise [`OidcError::TokenEndpoint`] with the OAuth 2.0 error
/// and description it names, each on one line.
fn oauth_answer(what: &'static str, response: Response) -> Result<Response, OidcError> {
    if response.status == http::StatusCode::OK {
        return Ok(response);
    }
    let error: OAuthError = serde_json::from_slice(&response.body).unwrap_or(OAuthError {
        error: String::new(),
        error_description: String::new(),
    });
    Err(OidcError::TokenEndpoint {
        what,
        status: response.status.as_u16(),
        error: if error.error.is_empty() {
            "(no OAuth2 error)".into()
        } else {
            one_line(&error.error)
        },
        description: if error.error_description.is_empty() {
            String::new()
        } else {
            format!(": {}", one_line(&error.error_description))
        },
    })
}

/// The OAuth 2.0 `error` of an error answer's body, if it has one.
fn oauth_error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<OAuthError>(body)
        .ok()
        .map(|error| error.error)
        .filter(|error| !error.is_empty())
}

fn one_line(text: &str) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    line.chars().take(300).collect()
}

/// When an access token issued at `now` expires, from its token response's `expires_in`
/// (RFC 6749 §5.1, seconds). `None` (unknown) when absent or 0, as golang.org/x/oauth2 reads
/// it; a lifetime over [`MAX_ACCESS_TOKEN_LIFETIME`] is clamped to it. Never panics: fails with
/// [`OidcError::NegativeExpiresIn`] for a negative value, and with
/// [`OidcError::BadTokenResponse`] should `now` plus the lifetime not be a representable time.
fn access_token_expiry(
    what: &'static str,
    now: OffsetDateTime,
    expires_in: Option<i64>,
) -> Result<Option<OffsetDateTime>, OidcError> {
    let seconds = match expires_in {
        None | Some(0) => return Ok(None),
        Some(seconds) if seconds < 0 => return Err(OidcError::NegativeExpiresIn { what, seconds }),
        Some(seconds) => seconds,
    };
    let lifetime = time::Duration::seconds(seconds).min(MAX_ACCESS_TOKEN_LIFETIME);
    now.checked_add(lifetime)
        .map(Some)
        .ok_or_else(|| OidcError::BadTokenResponse {
            what,
            reason: "the access token's expiry is past the latest representable time".into(),
        })
}

/// A JWT NumericDate claim (RFC 7519 §2: seconds since the epoch, possibly fractional) as a
/// time, its fraction dropped. `None` for anything else: not a number, not finite, or outside
/// the years -9999..=9999. Never panics.
fn numeric_date(value: &Value) -> Option<OffsetDateTime> {
    let seconds = match value.as_i64() {
        Some(seconds) => seconds,
        None => {
            let seconds = value.as_f64().filter(|seconds| seconds.is_finite())?.trunc();
            // Finite, integral and within ±2^38: the cast below is exact, never saturating.
            if seconds.abs() > MAX_NUMERIC_DATE_SECONDS {
                return None;
            }
            seconds as i64
        }
    };
    OffsetDateTime::from_unix_timestamp(seconds).ok()
}

/// A bound beyond every representable time (year ±9999 is about ±2.6e11 seconds), small enough
/// that any finite `f64` within it converts to `i64` exactly.
const MAX_NUMERIC_DATE_SECONDS: f64 = 274_877_906_944.0; // 2^38

/// The parameters of an authorization response (the callback's query or form body).
#[derive(Debug, Default, Clone)]
pub struct CallbackParams {
    /// `code`.
    pub code: Option<String>,
    /// `state`.
    pub state: Option<String>,
    /// `error`.
    pub error: Option<String>,
    /// `error_description`.
    pub error_description: Option<String>,
}

/// What an authorization response means for the login.
#[derive(Debug, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// A code to redeem.
    Code(String),
    /// The login failed; the reason is one line.
    Failed(String),
}

impl CallbackParams {
    /// Parses `application/x-www-form-urlencoded` parameters (first value of each wins).
    pub fn parse(encoded: &str) -> Self {
        let mut params = Self::default();
        for (name, value) in form_urlencoded::parse(encoded.as_bytes()) {
            let slot = match name.as_ref() {
                "code" => &mut params.code,
                "state" => &mut params.state,
                "error" => &mut params.error,
                "error_description" => &mut params.error_description,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.into_owned());
            }
        }
        params
    }

    /// Checks the state (against `expected`, in constant time) before anything else, then the
    /// error, then the code.
    pub fn outcome(&self, expected_state: &str) -> CallbackOutcome {
        let state_ok = self
            .state
            .as_deref()
            .is_some_and(|state| bool::from(state.as_bytes().ct_eq(expected_state.as_bytes())));
        if !state_ok {
            return CallbackOutcome::Failed(
                "the authorization response has a missing or wrong state parameter (a stale or forged \
                 login page); start the login again"
                    .into(),
            );
        }
        if let Some(error) = self.error.as_deref().filter(|e| !e.is_empty()) {
            return CallbackOutcome::Failed(
                match self.error_description.as_deref().filter(|d| !d.is_empty()) {
                    Some(description) => format!(
                        "the identity provider refused the login with code {:?}: {}",
                        one_line(error),
                        one_line(description)
                    ),
                    None => format!(
                        "the identity provider refused the login with code {:?}",
                        one_line(error)
                    ),
                },
            );
        }
        match self.code.as_deref().filter(|code| !code.is_empty()) {
            Some(code) => CallbackOutcome::Code(code.into()),
            None => CallbackOutcome::Failed("the authorization response has no code".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jose::sign::SigningKey;

    #[test]
    fn pkce_challenge_is_s256_of_the_verifier() {
        // RFC 7636 appendix B.
        let params = LoginParams {
            state: String::new(),
            nonce: String::new(),
            verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into(),
        };
        assert_eq!(params.challenge(), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        let fresh = LoginParams::generate().unwrap();
        assert_eq!(fresh.verifier.len(), 43);
        assert_ne!(fresh.state, fresh.nonce);
    }

    fn es256_key() -> (SigningKey, Vec<VerifyingKey>) {
        let key = SigningKey::generate("k1").unwrap();
        let keys = parse_jwks(
            serde_json::json!({"keys": [key.public_jwk()]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        (key, keys)
    }

    fn provider(jwks: Vec<VerifyingKey>) -> Provider {
        let issuer = "https://issuer.example.com";
        Provider {
            issuer: issuer.into(),
            discovery: Discovery {
                issuer: issuer.into(),
                authorization_endpoint: format!("{issuer}/authorize"),
                token_endpoint: format!("{issuer}/token"),
                jwks_uri: format!("{issuer}/keys"),
                response_modes_supported: vec!["query".into(), "form_post".into()],
                ..Discovery::default()
            },
            client: Arc::new(HttpsClient::new(&TlsOptions::default()).unwrap()),
            timeout: HTTP_TIMEOUT,
            jwks: ArcSwapOption::from_pointee(jwks),
            dpop: None,
        }
    }

    /// An issuer that accepts connections and never answers (black-holed): with
    /// [`Provider::with_timeout`], a password grant, a refresh and a userinfo call each give up
    /// within that timeout — not [`HTTP_TIMEOUT`] — and say the issuer may work later.
    #[tokio::test]
    async fn requests_to_a_silent_issuer_end_within_the_providers_timeout() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("https://{}", silent.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((connection, _)) = silent.accept().await {
                connections.push(connection);
            }
        });
        let discovery = Discovery {
            issuer: issuer.clone(),
            authorization_endpoint: format!("{issuer}/authorize"),
            token_endpoint: format!("{issuer}/token"),
            jwks_uri: format!("{issuer}/keys"),
            userinfo_endpoint: format!("{issuer}/userinfo"),
            ..Discovery::default()
        };
        let timeout = Duration::from_millis(300);
        let provider = Provider::from_discovery(discovery, &TlsOptions::default())
            .unwrap()
            .with_timeout(timeout);
        assert_eq!(provider.timeout(), timeout);
        let config = ClientConfig {
            client_id: "client".into(),
            client_secret: Some("secret".into()),
            scopes: vec!["openid".into()],
        };
        let started = tokio::time::Instant::now();
        let failures = [
            provider.password_grant(&config, "pinny", "password").await.err(),
            provider.refresh(&config, "refresh-token").await.err(),
            provider.userinfo("access-token").await.err(),
        ];
        let took = started.elapsed();
        for failure in failures {
            let failure = failure.expect("a silent issuer gave an answer");
            assert!(
                matches!(
                    failure,
                    OidcError::Request {
                        cause: HttpError::Timeout { timeout: t, .. },
                        ..
                    } if t == timeout
                ),
                "{failure}"
            );
            assert!(failure.is_retryable(), "{failure}");
        }
        assert!(took < Duration::from_secs(3), "three requests took {took:?}");
        held.abort();
    }

    #[tokio::test]
    async fn id_tokens_are_checked_for_issuer_audience_expiry_and_nonce() {
        let (key, jwks) = es256_key();
        let provider = provider(jwks);
        let exp = OffsetDateTime::now_utc().unix_timestamp() + 3600;
        let good = serde_json::json!({"iss": "https://issuer.example.com", "aud": ["other", "pinniped-cli"],
            "exp": exp, "nonce": "n1", "email": "a@example.com"});
        let token = key.sign(&good).unwrap();
        let id = provider
            .validate_id_token(&token, "pinniped-cli", Some("n1"))
            .await
            .unwrap();
        assert_eq!(id.claims["email"], "a@example.com");
        assert_eq!(id.expiry.unix_timestamp(), exp);
        // Without a nonce to check (refresh), the nonce claim does not matter.
        provider
            .validate_id_token(&token, "pinniped-cli", None)
            .await
            .unwrap();

        let mut cases = Vec::new();
        for (change, expected) in [
            (
                ("iss", serde_json::json!("https://evil.example.com")),
                "its iss is not the issuer",
            ),
            (
                ("aud", serde_json::json!("someone-else")),
                "its aud does not contain",
            ),
            (("exp", serde_json::json!(exp - 7200)), "it expired at"),
            (("nonce", serde_json::json!("n2")), "its nonce does not match"),
        ] {
            let mut claims = good.clone();
            claims[change.0] = change.1;
            cases.push((key.sign(&claims).unwrap(), expected));
        }
        for (token, expected) in cases {
            let error = provider
                .validate_id_token(&token, "pinniped-cli", Some("n1"))
                .await
                .unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
            assert!(!error.to_string().contains(&token), "{error}");
        }
    }

    /// The access token expiry `provider` makes of a token response with `expires_in` (and no
    /// ID token), measured between two clock readings around the call.
    async fn access_expiry(
        provider: &Provider,
        expires_in: Option<Value>,
    ) -> (
        OffsetDateTime,
        Result<Option<OffsetDateTime>, OidcError>,
        OffsetDateTime,
    ) {
        let mut body = serde_json::json!({"access_token": "secret-access-token", "token_type": "Bearer"});
        if let Some(expires_in) = expires_in {
            body["expires_in"] = expires_in;
        }
        let response = Response {
            method: http::Method::POST,
            url: "https://issuer.example.com/token".into(),
            status: http::StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: body.to_string().into(),
        };
        let config = ClientConfig::public("pinniped-cli", vec!["openid".into()]);
        let before = OffsetDateTime::now_utc();
        let tokens = provider
            .tokens("refreshing the session", &config, response, None, false)
            .await;
        let after = OffsetDateTime::now_utc();
        let expiry = tokens.map(|tokens| tokens.access.and_then(|access| access.expiry));
        (before, expiry, after)
    }

    #[tokio::test]
    async fn expires_in_of_any_size_never_panics_and_is_believed_for_a_day_at_most() {
        let (_, jwks) = es256_key();
        let provider = provider(jwks);
        let hour = time::Duration::hours(1);
        for (expires_in, lifetime) in [
            // Clamped: the largest i64 (which overflowed the clock before), and a year.
            (serde_json::json!(i64::MAX), MAX_ACCESS_TOKEN_LIFETIME),
            (serde_json::json!(365 * 86_400), MAX_ACCESS_TOKEN_LIFETIME),
            (serde_json::json!(3600), hour),
            (serde_json::json!(86_400), MAX_ACCESS_TOKEN_LIFETIME),
        ] {
            let (before, expiry, after) = access_expiry(&provider, Some(expires_in.clone())).await;
            let expiry = expiry.unwrap().expect("an expiry");
            assert!(
                before + lifetime <= expiry && expiry <= after + lifetime,
                "expires_in {expires_in}: {expiry}"
            );
        }
        // Absent or 0: unknown, never a time.
        for expires_in in [None, Some(serde_json::json!(0))] {
            assert!(matches!(access_expiry(&provider, expires_in).await.1, Ok(None)));
        }
        // Negative: refused, with the number and without the token.
        for seconds in [-1, i64::MIN] {
            let (_, expiry, _) = access_expiry(&provider, Some(serde_json::json!(seconds))).await;
            let error = expiry.unwrap_err();
            assert!(
                matches!(error, OidcError::NegativeExpiresIn { seconds: got, .. } if got == seconds),
                "{error}"
            );
            assert!(!error.is_retryable());
            let message = error.to_string();
            assert!(message.contains(&seconds.to_string()), "{message}");
            assert!(!message.contains("secret-access-token"), "{message}");
        }
        // Not an i64 at all: not a token response (and no panic either).
        let (_, expiry, _) = access_expiry(&provider, Some(serde_json::json!(1e300))).await;
        assert!(matches!(expiry, Err(OidcError::BadTokenResponse { .. })));
    }

    #[test]
    fn exp_claims_are_numeric_dates_within_the_representable_years() {
        let date = |value: Value| numeric_date(&value).map(OffsetDateTime::unix_timestamp);
        assert_eq!(date(serde_json::json!(1_800_000_000)), Some(1_800_000_000));
        assert_eq!(date(serde_json::json!(1_800_000_000.9)), Some(1_800_000_000));
        assert_eq!(
            date(serde_json::json!(253_402_300_799_i64)),
            Some(253_402_300_799)
        );
        for refused in [
            serde_json::json!(253_402_300_800_i64),
            serde_json::json!(i64::MAX),
            serde_json::json!(i64::MIN),
            serde_json::json!(u64::MAX),
            serde_json::json!(1e300),
            serde_json::json!(-1e300),
            serde_json::json!(2.6e11),
            serde_json::json!("1800000000"),
            Value::Null,
        ] {
            assert_eq!(date(refused.clone()), None, "{refused}");
        }
    }

    #[test]
    fn the_authorize_url_carries_pkce_state_nonce_and_form_post() {
        let (_, jwks) = es256_key();
        let provider = provider(jwks);
        assert!(provider.discovery.supports_form_post());
        let params = LoginParams::generate().unwrap();
        let config = ClientConfig::public("pinniped-cli", vec!["openid".into(), "offline_access".into()]);
        let url = provider.authorize_url(
            &config,
            &params,
            "http://127.0.0.1:4242/callback",
            &[("response_mode", "form_post")],
        );
        let (endpoint, query) = url.split_once('?').unwrap();
        assert_eq!(endpoint, "https://issuer.example.com/authorize");
        let query: std::collections::HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        assert_eq!(query["code_challenge"], params.challenge());
        assert_eq!(query["code_challenge_method"], "S256");
        assert_eq!(query["state"], params.state);
        assert_eq!(query["nonce"], params.nonce);
        assert_eq!(query["redirect_uri"], "http://127.0.0.1:4242/callback");
        assert_eq!(query["scope"], "openid offline_access");
        assert_eq!(query["response_type"], "code");
        assert_eq!(query["response_mode"], "form_post");
        assert!(!query.contains_key("code_verifier"));
    }

    #[test]
    fn callback_outcomes() {
        let ok = CallbackParams::parse("code=abc&state=s1");
        assert_eq!(ok.outcome("s1"), CallbackOutcome::Code("abc".into()));
        let CallbackOutcome::Failed(reason) = ok.outcome("s2") else {
            panic!("state mismatch accepted")
        };
        assert!(reason.contains("wrong state"), "{reason}");
        // A state that is a prefix or an extension of the expected one is just as wrong.
        for expected in ["s", "s12", ""] {
            assert!(
                matches!(ok.outcome(expected), CallbackOutcome::Failed(_)),
                "{expected:?}"
            );
        }
        assert!(matches!(
            CallbackParams::parse("code=abc").outcome(""),
            CallbackOutcome::Failed(_)
        ));
        let denied = CallbackParams::parse("error=access_denied&error_description=no+way&state=s1");
        assert_eq!(
            denied.outcome("s1"),
            CallbackOutcome::Failed(
                "the identity provider refused the login with code \"access_denied\": no way".into()
            )
        );
        // An error with a wrong state is reported as the state problem (it could be forged).
        let CallbackOutcome::Failed(reason) = denied.outcome("other") else {
            panic!()
        };
        assert!(reason.contains("state"), "{reason}");
    }

    /// A CA's certificate, and a serving certificate and key for 127.0.0.1 it issued, for
    /// [`fake_issuer`] (PEM; made once per test run).
    fn test_pki() -> &'static (String, String, String) {
        static PKI: std::sync::OnceLock<(String, String, String)> = std::sync::OnceLock::new();
        PKI.get_or_init(|| {
            use rcgen::{
                BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            };
            let mut ca = CertificateParams::default();
            ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
            let key = KeyPair::generate().unwrap();
            let mut serving = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
            serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let cert = serving.signed_by(&key, &ca).unwrap();
            (ca.pem(), cert.pem(), key.serialize_pem())
        })
    }

    /// One request [`fake_issuer`] received.
    #[derive(Debug)]
    struct Seen {
        method: String,
        path: String,
        /// Lowercased names.
        headers: std::collections::HashMap<String, String>,
        body: String,
    }

    impl Seen {
        /// The form body as a map (each name must come once).
        fn form(&self) -> std::collections::HashMap<String, String> {
            let mut form = std::collections::HashMap::new();
            for (name, value) in form_urlencoded::parse(self.body.as_bytes()) {
                assert!(
                    form.insert(name.clone().into_owned(), value.into_owned())
                        .is_none(),
                    "{name} twice"
                );
            }
            form
        }
    }

    /// An HTTPS issuer on 127.0.0.1 (a blocking rustls server on a thread of its own, with
    /// [`test_pki`]'s serving certificate) that answers the n-th connection's request with the n-th of
    /// `answers` (made from its base URL: status and JSON body; `Connection: close`), and sends
    /// each request to the receiver before answering it. Returns `https://127.0.0.1:<port>`.
    fn fake_issuer(
        answers: impl FnOnce(&str) -> Vec<(u16, String)>,
    ) -> (String, std::sync::mpsc::Receiver<Seen>) {
        fake_issuer_with_headers(|base| {
            answers(base)
                .into_iter()
                .map(|(status, body)| (status, Vec::new(), body))
                .collect()
        })
    }

    /// [`fake_issuer`] whose answers also carry the given response headers.
    fn fake_issuer_with_headers(
        answers: impl FnOnce(&str) -> Vec<(u16, Vec<(&'static str, String)>, String)>,
    ) -> (String, std::sync::mpsc::Receiver<Seen>) {
        use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
        use std::io::Write as _;
        let (_, cert_pem, key_pem) = test_pki();
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("https://{}", listener.local_addr().unwrap());
        let answers = answers(&base);
        let (seen, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (status, headers, body) in answers {
                let Ok((tcp, _)) = listener.accept() else {
                    return;
                };
                let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut stream = rustls::StreamOwned::new(connection, tcp);
                let Some(request) = read_request(&mut stream) else {
                    continue;
                };
                if seen.send(request).is_err() {
                    return;
                }
                let headers: String = headers
                    .iter()
                    .map(|(name, value)| format!("{name}: {value}\r\n"))
                    .collect();
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     {headers}Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
                stream.conn.send_close_notify();
                let _ = stream.flush();
            }
        });
        (base, received)
    }

    /// One HTTP/1.1 request with a `Content-Length` body (or none), or `None` when the client
    /// went away.
    fn read_request(stream: &mut impl std::io::Read) -> Option<Seen> {
        let mut data = Vec::new();
        let mut buffer = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = data.windows(4).position(|window| window == b"\r\n\r\n") {
                break at + 4;
            }
            let read = stream.read(&mut buffer).ok().filter(|read| *read > 0)?;
            data.extend_from_slice(&buffer[..read]);
        };
        let head = String::from_utf8(data[..head_end].to_vec()).ok()?;
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next()?.split(' ');
        let (method, path) = (request_line.next()?.to_string(), request_line.next()?.to_string());
        let headers: std::collections::HashMap<String, String> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        let length: usize = headers
            .get("content-length")
            .and_then(|length| length.parse().ok())
            .unwrap_or(0);
        while data.len() < head_end + length {
            let read = stream.read(&mut buffer).ok().filter(|read| *read > 0)?;
            data.extend_from_slice(&buffer[..read]);
        }
        Some(Seen {
            method,
            path,
            headers,
            body: String::from_utf8_lossy(&data[head_end..head_end + length]).into_owned(),
        })
    }

    /// The provider of "https://issuer.example.com" whose token endpoint is `base`'s `/token`,
    /// trusting [`test_pki`]'s CA, its keys `jwks` already fetched.
    fn provider_at(base: &str, jwks: Vec<VerifyingKey>) -> Provider {
        let issuer = "https://issuer.example.com";
        let tls = TlsOptions {
            ca_pem: Some(test_pki().0.as_bytes().to_vec()),
            ..TlsOptions::default()
        };
        Provider {
            issuer: issuer.into(),
            discovery: Discovery {
                issuer: issuer.into(),
                authorization_endpoint: format!("{base}/oauth2/authorize"),
                token_endpoint: format!("{base}/token"),
                jwks_uri: format!("{base}/keys"),
                ..Discovery::default()
            },
            client: Arc::new(HttpsClient::new(&tls).unwrap()),
            timeout: Duration::from_secs(10),
            jwks: ArcSwapOption::from_pointee(jwks),
            dpop: None,
        }
    }

    const DEVICE_CODE: &str = "pin_dc_secret-device-code";

    fn device_answer(interval: Option<u64>) -> Value {
        let mut answer = serde_json::json!({
            "device_code": DEVICE_CODE,
            "user_code": "BCDF-GHJK",
            "verification_uri": "https://issuer.example.com/device",
            "verification_uri_complete": "https://issuer.example.com/device?user_code=BCDF-GHJK",
            "expires_in": 600,
        });
        if let Some(interval) = interval {
            answer["interval"] = serde_json::json!(interval);
        }
        answer
    }

    fn cli_config() -> ClientConfig {
        ClientConfig::public(
            "pinniped-cli",
            vec![
                "offline_access".into(),
                "openid".into(),
                "pinniped:request-audience".into(),
            ],
        )
    }

    #[tokio::test]
    async fn the_device_authorization_request_sends_the_scopes_pkce_nonce_and_idp_and_reads_the_answer() {
        let (_, jwks) = es256_key();
        let (base, seen) = fake_issuer(|_| vec![(200, device_answer(Some(7)).to_string())]);
        let provider = provider_at(&base, jwks);
        let params = LoginParams::generate().unwrap();
        let endpoint = format!("{base}/oauth2/device_authorization");
        let authorization = provider
            .device_authorization(
                &endpoint,
                &cli_config(),
                &params,
                &[
                    ("pinniped_idp_name", "my upstream"),
                    ("pinniped_idp_type", "oidc"),
                ],
            )
            .await
            .unwrap();

        let request = seen.try_recv().unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/oauth2/device_authorization");
        assert_eq!(
            request.headers["content-type"],
            "application/x-www-form-urlencoded"
        );
        assert!(!request.headers.contains_key("authorization"), "a public client");
        let form = request.form();
        let expected: std::collections::HashMap<String, String> = [
            ("client_id", "pinniped-cli"),
            ("scope", "offline_access openid pinniped:request-audience"),
            ("code_challenge", params.challenge().as_str()),
            ("code_challenge_method", "S256"),
            ("nonce", params.nonce.as_str()),
            ("pinniped_idp_name", "my upstream"),
            ("pinniped_idp_type", "oidc"),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
        assert_eq!(form, expected, "no verifier, state or redirect_uri is sent");

        assert_eq!(authorization.device_code, DEVICE_CODE);
        assert_eq!(authorization.user_code, "BCDF-GHJK");
        assert_eq!(
            authorization.verification_uri,
            "https://issuer.example.com/device"
        );
        assert_eq!(
            authorization.verification_uri_complete.as_deref(),
            Some("https://issuer.example.com/device?user_code=BCDF-GHJK")
        );
        assert_eq!(authorization.expires_in, Duration::from_secs(600));
        assert_eq!(authorization.interval, Duration::from_secs(7));
        let debug = format!("{authorization:?}");
        assert!(debug.contains("BCDF-GHJK"), "{debug}");
        assert!(!debug.contains(DEVICE_CODE), "{debug}");
    }

    #[test]
    fn device_authorization_answers_get_a_bounded_interval_and_bad_ones_are_refused_without_the_code() {
        let what = "requesting a device login";
        let parse = |answer: Value| device_authorization_answer(what, answer.to_string().as_bytes());
        // No interval: 5 s; 0: 1 s; absurd ones: bounded, never an overflowing deadline.
        assert_eq!(
            parse(device_answer(None)).unwrap().interval,
            DEFAULT_DEVICE_POLL_INTERVAL
        );
        assert_eq!(
            parse(device_answer(Some(0))).unwrap().interval,
            MIN_DEVICE_POLL_INTERVAL
        );
        assert_eq!(
            parse(device_answer(Some(u64::MAX))).unwrap().interval,
            MAX_DEVICE_CODE_LIFETIME
        );
        let mut long = device_answer(None);
        long["expires_in"] = serde_json::json!(u64::MAX);
        assert_eq!(parse(long).unwrap().expires_in, MAX_DEVICE_CODE_LIFETIME);
        // An empty complete URI is none.
        let mut plain = device_answer(None);
        plain["verification_uri_complete"] = serde_json::json!("");
        assert_eq!(parse(plain).unwrap().verification_uri_complete, None);

        for (change, value, expected) in [
            ("device_code", Value::Null, "no device_code"),
            ("user_code", serde_json::json!(""), "no user_code"),
            (
                "user_code",
                serde_json::json!("BCDF\u{1b}[2J"),
                "user_code cannot be shown",
            ),
            ("verification_uri", Value::Null, "no verification_uri"),
            (
                "verification_uri",
                serde_json::json!("javascript:alert(1)"),
                "not an http(s) URL",
            ),
            (
                "verification_uri",
                serde_json::json!("https://a.example/\nfake line"),
                "not an http(s) URL",
            ),
            (
                "verification_uri_complete",
                serde_json::json!("file:///etc/passwd"),
                "not an http(s) URL",
            ),
            ("expires_in", Value::Null, "no positive expires_in"),
            ("expires_in", serde_json::json!(0), "no positive expires_in"),
            // A mistyped member: serde would quote the value; the error must not.
            (
                "expires_in",
                serde_json::json!(DEVICE_CODE),
                "not a device authorization response",
            ),
        ] {
            let mut answer = device_answer(None);
            if value.is_null() {
                answer.as_object_mut().unwrap().remove(change);
            } else {
                answer[change] = value;
            }
            let error = parse(answer).unwrap_err();
            let message = error.to_string();
            assert!(matches!(error, OidcError::BadTokenResponse { .. }), "{message}");
            assert!(message.contains(expected), "{change}: {message}");
            assert!(!message.contains(DEVICE_CODE), "{message}");
        }
        let error = device_authorization_answer(what, b"not json").unwrap_err();
        assert!(
            error.to_string().contains("not a device authorization response"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn device_authorization_refusals_quote_the_oauth_error_on_one_line() {
        let (_, jwks) = es256_key();
        let (base, _seen) = fake_issuer(|_| {
            vec![
                (
                    400,
                    serde_json::json!({"error": "invalid_scope",
                    "error_description": "The requested scope is invalid,\nunknown, or malformed."})
                    .to_string(),
                ),
                (401, serde_json::json!({"error": "invalid_client"}).to_string()),
                (
                    503,
                    serde_json::json!({"error": "temporarily_unavailable",
                    "error_description": "try again later"})
                    .to_string(),
                ),
            ]
        });
        let provider = provider_at(&base, jwks);
        let params = LoginParams::generate().unwrap();
        let endpoint = format!("{base}/oauth2/device_authorization");
        let mut errors = Vec::new();
        for _ in 0..3 {
            errors.push(
                provider
                    .device_authorization(&endpoint, &cli_config(), &params, &[])
                    .await
                    .unwrap_err(),
            );
        }
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "requesting a device login failed: the device authorization endpoint answered 400 \
                 invalid_scope: The requested scope is invalid, unknown, or malformed.",
                "requesting a device login failed: the device authorization endpoint answered 401 \
                 invalid_client",
                "requesting a device login failed: the device authorization endpoint answered 503 \
                 temporarily_unavailable: try again later",
            ]
        );
        let retryable: Vec<bool> = errors.iter().map(OidcError::is_retryable).collect();
        assert_eq!(retryable, [false, false, true]);
    }

    /// Each answer of the token endpoint to a device-code poll, in turn, as the poll reads it;
    /// the tokens once the login is done, their ID token checked for this login's nonce.
    #[tokio::test]
    async fn device_polls_read_pending_slow_down_failures_and_tokens() {
        let (key, jwks) = es256_key();
        let params = LoginParams::generate().unwrap();
        let exp = OffsetDateTime::now_utc().unix_timestamp() + 3600;
        let id_token = |nonce: &str| {
            key.sign(
                &serde_json::json!({"iss": "https://issuer.example.com", "aud": "pinniped-cli",
                "exp": exp, "nonce": nonce, "username": "pinny"}),
            )
            .unwrap()
        };
        let tokens = |nonce: &str| {
            serde_json::json!({"access_token": "secret-access-token", "token_type": "Bearer",
                "expires_in": 120, "refresh_token": "secret-refresh-token", "id_token": id_token(nonce),
                "scope": "offline_access openid pinniped:request-audience"})
            .to_string()
        };
        let oauth = |error: &str, description: &str| {
            serde_json::json!({"error": error, "error_description": description}).to_string()
        };
        let (base, seen) = fake_issuer(|_| {
            vec![
                (
                    400,
                    oauth(
                        "authorization_pending",
                        "The authorization request is still pending.",
                    ),
                ),
                (400, oauth("slow_down", "Poll less often.")),
                (500, String::new()),
                (503, oauth("temporarily_unavailable", "the store is down")),
                (
                    400,
                    oauth("access_denied", "The login at the identity provider failed."),
                ),
                (400, oauth("expired_token", "The device code has expired.")),
                (400, oauth("invalid_grant", "The device code was used already.")),
                (200, tokens("another login's nonce")),
                (200, tokens(&params.nonce)),
            ]
        });
        let provider = provider_at(&base, jwks);
        let authorization =
            device_authorization_answer("test", device_answer(None).to_string().as_bytes()).unwrap();
        let mut polls = Vec::new();
        for _ in 0..9 {
            polls.push(
                provider
                    .poll_device_token(&cli_config(), &params, &authorization)
                    .await,
            );
        }

        let request = seen.try_recv().unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/token");
        let form = request.form();
        assert_eq!(form["grant_type"], "urn:ietf:params:oauth:grant-type:device_code");
        assert_eq!(form["device_code"], DEVICE_CODE);
        assert_eq!(form["client_id"], "pinniped-cli");
        assert_eq!(form["code_verifier"], params.verifier);
        assert_eq!(form.len(), 4, "{form:?}");
        assert_eq!(seen.try_iter().count(), 8, "every poll is one request");

        let mut polls = polls.into_iter();
        let mut next = || polls.next().unwrap();
        assert!(matches!(next(), DevicePoll::Pending));
        assert!(matches!(next(), DevicePoll::SlowDown));
        for _ in 0..2 {
            match next() {
                DevicePoll::Unavailable(error) => assert!(error.is_retryable(), "{error}"),
                other => panic!("a 5xx is worth another poll: {other:?}"),
            }
        }
        let mut failures = Vec::new();
        for _ in 0..4 {
            match next() {
                DevicePoll::Failed(error) => failures.push(error),
                other => panic!("expected a final failure: {other:?}"),
            }
        }
        let messages: Vec<String> = failures.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages[..3],
            [
                "the device login was denied: access_denied: The login at the identity provider failed.",
                "the device code expired before the login was completed (expired_token: The device code \
                 has expired.); run the command again",
                "polling for the device login failed: the token endpoint answered 400 invalid_grant: The \
                 device code was used already.",
            ]
        );
        assert!(
            messages[3].contains("its nonce does not match"),
            "{}",
            messages[3]
        );
        for (error, message) in failures.iter().zip(&messages) {
            assert!(!error.is_retryable(), "{message}");
        }
        let DevicePoll::Tokens(tokens) = next() else {
            panic!("the login's tokens")
        };
        assert_eq!(tokens.id.unwrap().claims["username"], "pinny");
        assert_eq!(tokens.access.unwrap().token, "secret-access-token");
        assert_eq!(tokens.refresh.unwrap().token, "secret-refresh-token");

        for message in &messages {
            for secret in [DEVICE_CODE, params.verifier.as_str(), "secret-access-token"] {
                assert!(!message.contains(secret), "{message}");
            }
        }
    }

    #[tokio::test]
    async fn a_device_poll_that_reaches_no_one_is_worth_another() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let (_, jwks) = es256_key();
        let provider = provider_at(&format!("https://127.0.0.1:{port}"), jwks);
        let authorization =
            device_authorization_answer("test", device_answer(None).to_string().as_bytes()).unwrap();
        let params = LoginParams::generate().unwrap();
        match provider
            .poll_device_token(&cli_config(), &params, &authorization)
            .await
        {
            DevicePoll::Unavailable(error) => {
                assert!(matches!(error, OidcError::Request { .. }), "{error}");
                assert!(!error.to_string().contains(DEVICE_CODE), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_device_authorization_endpoint_comes_from_the_discovery_document() {
        let (_, jwks) = es256_key();
        let issuer = "https://sso.example.com";
        let mut provider = provider_at(issuer, jwks);
        assert_eq!(provider.device_authorization_endpoint(), None);
        let document = serde_json::json!({
            "issuer": issuer,
            "jwks_uri": format!("{issuer}/keys"),
            "device_authorization_endpoint": format!("{issuer}/oauth2/device_authorization"),
        });
        provider.discovery = serde_json::from_value(document).unwrap();
        assert_eq!(
            provider.device_authorization_endpoint(),
            Some("https://sso.example.com/oauth2/device_authorization")
        );
    }

    /// [`provider_at`] with `key` for DPoP, its proofs made at the fixed time `1_000`.
    fn dpop_provider_at(base: &str, jwks: Vec<VerifyingKey>, key: &Arc<SigningKey>) -> Provider {
        let mut provider = provider_at(base, jwks).with_dpop_key(key.clone());
        if let Some(dpop) = provider.dpop.as_mut() {
            dpop.now = || 1_000;
        }
        provider
    }

    /// The proof of `request` checked as the Supervisor checks it: POST to `token_endpoint`,
    /// made at 1_000.
    fn checked_proof(request: &Seen, token_endpoint: &str) -> dpop::CheckedProof {
        let proof = request.headers.get("dpop").expect("a DPoP header");
        dpop::check(
            proof,
            "POST",
            token_endpoint,
            1_000,
            dpop::Window { past: 60, future: 5 },
        )
        .unwrap()
    }

    /// An ES256 ID token of "https://issuer.example.com" for `aud`, valid for an hour.
    fn id_token_for(key: &SigningKey, aud: &str, nonce: Option<&str>) -> String {
        let mut claims = serde_json::json!({"iss": "https://issuer.example.com", "aud": aud,
            "exp": OffsetDateTime::now_utc().unix_timestamp() + 3600, "username": "pinny"});
        if let Some(nonce) = nonce {
            claims["nonce"] = serde_json::json!(nonce);
        }
        key.sign(&claims).unwrap()
    }

    /// With a DPoP key, each of the five token endpoint requests carries a proof of it for POST
    /// and the token endpoint's URL, and DPoP-bound answers (`token_type` `DPoP`) are taken;
    /// requests to other endpoints (revocation, device authorization) carry none.
    #[tokio::test]
    async fn every_token_endpoint_request_proves_the_dpop_key() {
        let (signer, jwks) = es256_key();
        let key = Arc::new(SigningKey::generate("dpop").unwrap());
        let params = LoginParams::generate().unwrap();
        let tokens = |id_token: Option<String>| {
            let mut answer = serde_json::json!({"access_token": "secret-access-token", "token_type": "DPoP",
                "expires_in": 120, "refresh_token": "secret-refresh-token"});
            if let Some(id_token) = id_token {
                answer["id_token"] = serde_json::json!(id_token);
            }
            answer.to_string()
        };
        let exchanged = serde_json::json!({"access_token": id_token_for(&signer, "cluster-a", None),
            "token_type": "N_A", "issued_token_type": "urn:ietf:params:oauth:token-type:jwt"})
        .to_string();
        let (base, seen) = fake_issuer(|_| {
            vec![
                (
                    200,
                    tokens(Some(id_token_for(&signer, "pinniped-cli", Some(&params.nonce)))),
                ),
                (200, tokens(None)),
                (200, tokens(Some(id_token_for(&signer, "pinniped-cli", None)))),
                (
                    200,
                    tokens(Some(id_token_for(&signer, "pinniped-cli", Some(&params.nonce)))),
                ),
                (200, exchanged),
                (200, device_answer(None).to_string()),
                (200, "{}".into()),
            ]
        });
        let mut provider = dpop_provider_at(&base, jwks, &key);
        provider.discovery.revocation_endpoint = format!("{base}/revoke");
        assert!(provider.has_dpop_key());
        let config = cli_config();
        let code = provider
            .exchange_code(&config, &params, "code", "http://127.0.0.1/callback")
            .await
            .unwrap();
        assert_eq!(code.access.unwrap().token_type, "DPoP");
        provider.refresh(&config, "secret-refresh-token").await.unwrap();
        provider
            .password_grant(&config, "pinny", "secret-password")
            .await
            .unwrap();
        let authorization =
            device_authorization_answer("test", device_answer(None).to_string().as_bytes()).unwrap();
        let polled = provider.poll_device_token(&config, &params, &authorization).await;
        assert!(matches!(polled, DevicePoll::Tokens(_)), "{polled:?}");
        let id = provider
            .token_exchange(&config, "secret-access-token", "cluster-a")
            .await
            .unwrap();
        assert_eq!(id.claims["aud"], "cluster-a");
        provider
            .device_authorization(&format!("{base}/device"), &config, &params, &[])
            .await
            .unwrap();
        assert!(provider
            .revoke(&config, "secret-refresh-token", TokenTypeHint::RefreshToken)
            .await
            .unwrap());

        let requests: Vec<Seen> = seen.try_iter().collect();
        assert_eq!(requests.len(), 7);
        let token_endpoint = format!("{base}/token");
        let thumbprint = dpop::thumbprint(&key.public_jwk()).unwrap();
        let mut jtis = std::collections::HashSet::new();
        for request in &requests[..5] {
            assert_eq!(request.path, "/token");
            let proof = checked_proof(request, &token_endpoint);
            assert_eq!(proof.jkt, thumbprint);
            assert_eq!(proof.iat, 1_000);
            assert_eq!(proof.nonce, None, "the issuer sent no nonce");
            assert!(jtis.insert(proof.jti), "every proof has its own jti");
        }
        for request in &requests[5..] {
            assert!(!request.headers.contains_key("dpop"), "{}", request.path);
        }
    }

    /// Discovery is sent again while the issuer answers 503 or 502 (a replica restarting behind
    /// its Service); a 404 is the answer at once.
    #[tokio::test]
    async fn discovery_is_sent_again_while_the_issuer_is_briefly_unavailable() {
        let tls = TlsOptions {
            ca_pem: Some(test_pki().0.as_bytes().to_vec()),
            ..TlsOptions::default()
        };
        let document = |base: &str| {
            serde_json::json!({"issuer": base, "authorization_endpoint": format!("{base}/authorize"),
                "token_endpoint": format!("{base}/token"), "jwks_uri": format!("{base}/jwks")})
            .to_string()
        };
        let (base, seen) =
            fake_issuer(|base| vec![(503, String::new()), (502, String::new()), (200, document(base))]);
        let provider = Provider::discover(&base, &tls).await.unwrap();
        assert_eq!(provider.discovery.token_endpoint, format!("{base}/token"));
        let requests: Vec<Seen> = seen.try_iter().collect();
        assert_eq!(requests.len(), 3);
        assert!(requests
            .iter()
            .all(|request| request.path == "/.well-known/openid-configuration"));

        let (base, seen) = fake_issuer(|base| vec![(404, String::new()), (200, document(base))]);
        let refused = Provider::discover(&base, &tls).await.err().unwrap();
        assert!(matches!(refused, OidcError::BadDiscovery { .. }), "{refused}");
        assert_eq!(seen.try_iter().count(), 1);
    }

    /// An RFC 8693 exchange is sent again while the issuer answers 503, 502 or 429 (a replica
    /// restarting behind its Service), and the ID token of the answer that comes is returned; a
    /// refusal (400) is the answer at once.
    #[tokio::test]
    async fn a_token_exchange_is_sent_again_while_the_issuer_is_briefly_unavailable() {
        let exchanged = |signer: &SigningKey| {
            serde_json::json!({"access_token": id_token_for(signer, "cluster-a", None),
                "token_type": "N_A", "issued_token_type": "urn:ietf:params:oauth:token-type:jwt"})
            .to_string()
        };
        let (signer, jwks) = es256_key();
        let (base, seen) = fake_issuer(|_| {
            vec![
                (503, r#"{"error":"temporarily_unavailable"}"#.into()),
                (502, String::new()),
                (429, String::new()),
                (200, exchanged(&signer)),
            ]
        });
        let id = provider_at(&base, jwks)
            .token_exchange(&cli_config(), "secret-access-token", "cluster-a")
            .await
            .unwrap();
        assert_eq!(id.claims["aud"], "cluster-a");
        let requests: Vec<Seen> = seen.try_iter().collect();
        assert_eq!(requests.len(), 4);
        assert!(requests.iter().all(|request| request.path == "/token"));

        let (signer, jwks) = es256_key();
        let (base, seen) = fake_issuer(|_| {
            vec![
                (400, r#"{"error":"invalid_grant"}"#.into()),
                (200, exchanged(&signer)),
            ]
        });
        let refused = provider_at(&base, jwks)
            .token_exchange(&cli_config(), "secret-access-token", "cluster-a")
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, OidcError::TokenEndpoint { status: 400, error, .. } if error == "invalid_grant"),
            "{refused}"
        );
        assert!(!refused.is_retryable_at_once());
        assert_eq!(seen.try_iter().count(), 1);
    }

    #[tokio::test]
    async fn no_dpop_proof_is_sent_without_a_key() {
        let (_, jwks) = es256_key();
        let answer = serde_json::json!({"access_token": "secret-access-token", "token_type": "Bearer"});
        let (base, seen) = fake_issuer(|_| vec![(200, answer.to_string())]);
        let provider = provider_at(&base, jwks);
        assert!(!provider.has_dpop_key());
        provider
            .refresh(&cli_config(), "secret-refresh-token")
            .await
            .unwrap();
        let request = seen.try_recv().unwrap();
        assert!(!request.headers.contains_key("dpop"), "{request:?}");
    }

    /// A `use_dpop_nonce` refusal with a nonce is answered by one more request whose new proof
    /// carries it; the nonce of every answer (a success or another refusal) goes into the next
    /// proof; a second `use_dpop_nonce` in a row, or one without a nonce, is the request's
    /// failure; no error quotes a nonce.
    #[tokio::test]
    async fn a_use_dpop_nonce_refusal_is_retried_once_with_the_nonce() {
        let (_, jwks) = es256_key();
        let key = Arc::new(SigningKey::generate("dpop").unwrap());
        let tokens = serde_json::json!({"access_token": "secret-access-token", "token_type": "DPoP",
            "refresh_token": "secret-refresh-token"})
        .to_string();
        let use_nonce = serde_json::json!({"error": "use_dpop_nonce",
            "error_description": "Authorization server requires nonce in DPoP proof"})
        .to_string();
        let nonce = |value: &str| vec![(dpop::NONCE_HEADER, value.to_string())];
        let (base, seen) = fake_issuer_with_headers(|_| {
            vec![
                // The first refresh: refused, then accepted with the nonce.
                (400, nonce("nonce-one"), use_nonce.clone()),
                (200, nonce("nonce-two"), tokens.clone()),
                // The second: refused twice in a row; not tried a third time.
                (400, nonce("nonce-three"), use_nonce.clone()),
                (400, nonce("nonce-four"), use_nonce.clone()),
                // The third: refused without a nonce; not tried again.
                (400, Vec::new(), use_nonce.clone()),
                // The fourth: another refusal whose nonce is still kept.
                (
                    400,
                    nonce("nonce-five"),
                    serde_json::json!({"error": "invalid_dpop_proof"}).to_string(),
                ),
                // The fifth: accepted.
                (200, Vec::new(), tokens.clone()),
            ]
        });
        let provider = dpop_provider_at(&base, jwks, &key);
        let config = cli_config();
        let first = provider.refresh(&config, "secret-refresh-token").await.unwrap();
        assert_eq!(first.access.unwrap().token_type, "DPoP");
        let mut errors = Vec::new();
        for _ in 0..3 {
            errors.push(
                provider
                    .refresh(&config, "secret-refresh-token")
                    .await
                    .unwrap_err(),
            );
        }
        provider.refresh(&config, "secret-refresh-token").await.unwrap();

        let token_endpoint = format!("{base}/token");
        let proofs: Vec<dpop::CheckedProof> = seen
            .try_iter()
            .map(|request| checked_proof(&request, &token_endpoint))
            .collect();
        let nonces: Vec<Option<&str>> = proofs.iter().map(|proof| proof.nonce.as_deref()).collect();
        assert_eq!(
            nonces,
            [
                None,
                Some("nonce-one"),
                Some("nonce-two"),
                Some("nonce-three"),
                Some("nonce-four"),
                Some("nonce-four"),
                Some("nonce-five"),
            ]
        );
        let jtis: std::collections::HashSet<&str> = proofs.iter().map(|proof| proof.jti.as_str()).collect();
        assert_eq!(jtis.len(), proofs.len(), "a retry is a new proof");

        let codes: Vec<&str> = errors
            .iter()
            .map(|error| match error {
                OidcError::TokenEndpoint {
                    status: 400, error, ..
                } => error.as_str(),
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(codes, ["use_dpop_nonce", "use_dpop_nonce", "invalid_dpop_proof"]);
        for error in &errors {
            let message = format!("{error} {error:?}");
            assert!(!message.contains("nonce-"), "{message}");
        }
    }
}
