//! The OIDC relying party: of `selkie login oidc` against an issuer, and of the Supervisor against
//! its upstream identity providers. Discovery, the authorization request (PKCE S256, state,
//! nonce), the token endpoint (authorization code, refresh, resource-owner password, RFC 8693
//! exchange), the Supervisor's `cli_password` authorize call, and ID token validation against the
//! issuer's JWKS (signature, `iss`, `aud`, `exp`, `nonce`).
//!
//! Every error is one line that names the issuer or endpoint and what to do; none quotes a
//! token, a code, a password or a response body that could hold one.

use std::{sync::Arc, time::Duration};

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
    https::{accept_json, HttpError, HttpsClient, Response, TlsError, TlsOptions},
    jose::{parse_jwks, JoseError, Jws, VerifyingKey},
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
}

impl OidcError {
    /// Whether the same request may succeed later: the server could not be reached, timed out,
    /// or answered 429 or a 5xx status. Refusals (4xx) and malformed answers are final.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Request { .. } | Self::Discovery { .. } => true,
            Self::TokenEndpoint { status, .. } => *status == 429 || *status >= 500,
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

#[derive(Deserialize)]
struct OAuthError {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

impl Provider {
    /// Fetches `<issuer>/.well-known/openid-configuration` with `tls` and checks it names the
    /// same issuer and has the endpoints a login needs.
    pub async fn discover(issuer: &str, tls: &TlsOptions) -> Result<Self, OidcError> {
        let client = HttpsClient::new(tls).map_err(OidcError::Tls)?;
        Self::discover_with(issuer, Arc::new(client)).await
    }

    /// [`Provider::discover`] with `client` for discovery and every later request to the
    /// issuer: a client (and its connection pool) shared with other providers of the same TLS
    /// options ([`crate::https::SharedClients`]) rather than one of its own.
    pub async fn discover_with(issuer: &str, client: Arc<HttpsClient>) -> Result<Self, OidcError> {
        let bad = |reason: String| OidcError::BadDiscovery {
            issuer: issuer.into(),
            reason,
        };
        let discovery = match Discovery::fetch(&client, issuer, HTTP_TIMEOUT).await {
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
        let response = self
            .form_request(what, &self.discovery.token_endpoint, config, body)
            .await?;
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
        let response = self
            .form_request(what, &self.discovery.token_endpoint, config, body)
            .await?;
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
        let response = self
            .form_request(what, &self.discovery.token_endpoint, config, body)
            .await?;
        self.tokens(what, config, response, None, true).await
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

    /// RFC 8693: exchanges the access token for an ID token with audience `audience`.
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
        let response = self
            .form_request(what, &self.discovery.token_endpoint, config, body)
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

    /// POSTs the form `body` to the token endpoint as `config`'s client: its `client_id` added to
    /// the form, or, with a secret, HTTP Basic authentication.
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
        let form = (
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let mut headers = vec![form, accept_json()];
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
        let response = self
            .client
            .send(
                http::Method::POST,
                endpoint,
                &headers,
                body.into(),
                MAX_ANSWER_BYTES,
                Some(self.timeout),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })?;
        if response.status != http::StatusCode::OK {
            let error: OAuthError = serde_json::from_slice(&response.body).unwrap_or(OAuthError {
                error: String::new(),
                error_description: String::new(),
            });
            return Err(OidcError::TokenEndpoint {
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
            });
        }
        Ok(response)
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
}
