//! The OIDC relying party of `selkie login oidc`: discovery, the authorization request (PKCE
//! S256, state, nonce), the token endpoint (authorization code, refresh, resource-owner password,
//! RFC 8693 exchange), the Supervisor's `cli_password` authorize call, and ID token validation
//! against the issuer's JWKS (signature, `iss`, `aud`, `exp`, `nonce`).
//!
//! Every error is one line that names the issuer or endpoint and what to do; none quotes a
//! token, a code, a password or a response body that could hold one.

use std::time::Duration;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use ring::rand::SecureRandom as _;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use crate::{
    http::{FullResponse, HttpError, HttpsClient, TlsOptions},
    jose::{self, Jwks},
    sessions::{AccessToken, IdToken, RefreshToken, Tokens},
    timestamp,
};

/// The timeout of each HTTP request to the issuer (pinniped's `httpRequestTimeout`).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(60);
/// The Supervisor's discovery extension naming its identity-provider discovery endpoint.
pub const SUPERVISOR_DISCOVERY_KEY: &str = "discovery.supervisor.pinniped.dev/v1alpha1";
/// Header carrying the username in the Supervisor's `cli_password` flow.
pub const USERNAME_HEADER: &str = "Pinniped-Username";
/// Header carrying the password in the Supervisor's `cli_password` flow.
pub const PASSWORD_HEADER: &str = "Pinniped-Password";
const FORM: &str = "application/x-www-form-urlencoded";

/// Why a step of the OIDC login failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OidcError {
    /// `--issuer` is not an https URL.
    #[error("--issuer {0:?} must be an https:// URL")]
    BadIssuer(String),
    /// The CA bundle or TLS settings could not be used.
    #[error("{0}")]
    Tls(HttpError),
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
    /// The ID token did not validate.
    #[error("the issuer returned an invalid ID token: {0}")]
    IdToken(String),
    /// No secure randomness.
    #[error("could not generate random login parameters")]
    Random,
}

/// The parts of the discovery document the login uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    /// `issuer`.
    pub issuer: String,
    /// `authorization_endpoint`.
    pub authorization_endpoint: String,
    /// `token_endpoint`.
    pub token_endpoint: String,
    /// `jwks_uri`.
    pub jwks_uri: String,
    /// `response_modes_supported`.
    #[serde(default)]
    pub response_modes_supported: Vec<String>,
    /// `discovery.supervisor.pinniped.dev/v1alpha1`, present only on a Pinniped(-compatible)
    /// Supervisor.
    #[serde(default, rename = "discovery.supervisor.pinniped.dev/v1alpha1")]
    pub supervisor: Option<Value>,
}

impl Discovery {
    /// Whether the issuer offers `response_mode=form_post`.
    pub fn supports_form_post(&self) -> bool {
        self.response_modes_supported
            .iter()
            .any(|mode| mode == "form_post")
    }

    /// Whether the issuer is a Pinniped Supervisor (it publishes identity-provider discovery).
    pub fn is_supervisor(&self) -> bool {
        self.supervisor.is_some()
    }
}

/// A discovered issuer and an HTTP client that trusts it.
pub struct Provider {
    /// The issuer URL as given.
    pub issuer: String,
    /// Its discovery document.
    pub discovery: Discovery,
    client: HttpsClient,
    jwks: Option<Jwks>,
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

/// What the client asks for.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The OAuth client ID (`pinniped-cli`).
    pub client_id: String,
    /// The scopes, in order.
    pub scopes: Vec<String>,
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
    /// same issuer.
    pub async fn discover(issuer: &str, tls: &TlsOptions) -> Result<Self, OidcError> {
        let uri: http::Uri = issuer.parse().map_err(|_| OidcError::BadIssuer(issuer.into()))?;
        if uri.scheme_str() != Some("https") || uri.authority().is_none() {
            return Err(OidcError::BadIssuer(issuer.into()));
        }
        let client = HttpsClient::new(issuer, tls, None).map_err(OidcError::Tls)?;
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let response = client
            .send(
                http::Method::GET,
                &url,
                &[accept_json()],
                Vec::new(),
                Some(HTTP_TIMEOUT),
            )
            .await
            .map_err(|cause| OidcError::Discovery {
                issuer: issuer.into(),
                cause,
            })?;
        let bad = |reason: String| OidcError::BadDiscovery {
            issuer: issuer.into(),
            reason,
        };
        if response.status != http::StatusCode::OK {
            return Err(bad(format!("GET {url} answered {}", response.status)));
        }
        let discovery: Discovery = serde_json::from_slice(&response.body)
            .map_err(|e| bad(format!("{url} is not an OIDC discovery document: {e}")))?;
        if discovery.issuer != issuer {
            return Err(bad(format!(
                "the document names the issuer {:?}, not {issuer:?}; use exactly that URL as --issuer",
                discovery.issuer
            )));
        }
        Ok(Self {
            issuer: issuer.into(),
            discovery,
            client,
            jwks: None,
        })
    }

    /// The authorization URL for a browser login.
    pub fn authorize_url(
        &self,
        config: &ClientConfig,
        params: &LoginParams,
        redirect_uri: &str,
        extra: &[(&str, &str)],
    ) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("access_type", "offline")
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
        &mut self,
        config: &ClientConfig,
        params: &LoginParams,
        code: &str,
        redirect_uri: &str,
    ) -> Result<Tokens, OidcError> {
        let what = "redeeming the authorization code";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &config.client_id)
            .append_pair("code", code)
            .append_pair("code_verifier", &params.verifier)
            .append_pair("grant_type", "authorization_code")
            .append_pair("redirect_uri", redirect_uri)
            .finish();
        let response = self.token_request(what, body).await?;
        self.tokens(what, config, response, Some(&params.nonce), true)
            .await
    }

    /// Uses a refresh token. The new ID token (if any) is validated without a nonce, as pinniped
    /// does; without one, the old ID token is not kept.
    pub async fn refresh(&mut self, config: &ClientConfig, refresh_token: &str) -> Result<Tokens, OidcError> {
        let what = "refreshing the session";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &config.client_id)
            .append_pair("grant_type", "refresh_token")
            .append_pair("refresh_token", refresh_token)
            .finish();
        let response = self.token_request(what, body).await?;
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
        &mut self,
        config: &ClientConfig,
        username: &str,
        password: &str,
    ) -> Result<Tokens, OidcError> {
        let what = "logging in with the password grant";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &config.client_id)
            .append_pair("grant_type", "password")
            .append_pair("password", password)
            .append_pair("scope", &config.scopes.join(" "))
            .append_pair("username", username)
            .finish();
        let response = self.token_request(what, body).await?;
        self.tokens(what, config, response, None, true).await
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
        let response = self
            .client
            .send(
                http::Method::GET,
                authorize_url,
                &[
                    (
                        http::HeaderName::from_static("pinniped-username"),
                        username.into(),
                    ),
                    (
                        http::HeaderName::from_static("pinniped-password"),
                        password.into(),
                    ),
                ],
                Vec::new(),
                Some(HTTP_TIMEOUT),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })?;
        if !response.status.is_redirection() {
            return Err(OidcError::BadTokenResponse {
                what,
                reason: format!(
                    "expected to be redirected, but the response status was {}{}",
                    response.status,
                    crate::concierge::status_message(&response.body)
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
        &mut self,
        config: &ClientConfig,
        access_token: &str,
        audience: &str,
    ) -> Result<IdToken, OidcError> {
        let what = "the RFC 8693 token exchange for --request-audience";
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("audience", audience)
            .append_pair("client_id", &config.client_id)
            .append_pair("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange")
            .append_pair("requested_token_type", "urn:ietf:params:oauth:token-type:jwt")
            .append_pair("subject_token", access_token)
            .append_pair(
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            )
            .finish();
        let response = self.token_request(what, body).await?;
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

    async fn token_request(&self, what: &'static str, body: String) -> Result<FullResponse, OidcError> {
        let response = self
            .client
            .send(
                http::Method::POST,
                &self.discovery.token_endpoint,
                &[(http::header::CONTENT_TYPE, FORM.into()), accept_json()],
                body.into_bytes(),
                Some(HTTP_TIMEOUT),
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
        &mut self,
        what: &'static str,
        config: &ClientConfig,
        response: FullResponse,
        nonce: Option<&str>,
        need_id_token: bool,
    ) -> Result<Tokens, OidcError> {
        let answer: TokenResponse =
            serde_json::from_slice(&response.body).map_err(|e| OidcError::BadTokenResponse {
                what,
                reason: format!("the answer is not a token response: {e}"),
            })?;
        let now = timestamp::now();
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
        let access = (!answer.access_token.is_empty()).then(|| AccessToken {
            expiry: answer
                .expires_in
                .filter(|seconds| *seconds > 0)
                .map(|seconds| timestamp::format(now + time::Duration::seconds(seconds))),
            token: answer.access_token,
            token_type: answer.token_type,
        });
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
        &mut self,
        token: &str,
        audience: &str,
        nonce: Option<&str>,
    ) -> Result<IdToken, OidcError> {
        let claims = match self.jwks.as_ref().map(|jwks| jose::verify(token, jwks)) {
            Some(Ok(claims)) => claims,
            Some(Err(jose::JoseError::NoKey(_) | jose::JoseError::BadSignature)) | None => {
                let jwks = self.fetch_jwks().await?;
                let claims = jose::verify(token, &jwks).map_err(|e| OidcError::IdToken(e.to_string()))?;
                self.jwks = Some(jwks);
                claims
            }
            Some(Err(e)) => return Err(OidcError::IdToken(e.to_string())),
        };
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
            .and_then(Value::as_f64)
            .and_then(|exp| OffsetDateTime::from_unix_timestamp(exp as i64).ok())
            .ok_or_else(|| OidcError::IdToken("it has no valid exp claim".into()))?;
        if expiry <= timestamp::now() {
            return Err(OidcError::IdToken(format!(
                "it expired at {}; check this machine's clock",
                timestamp::format(expiry)
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
            claims: Some(claims.into_iter().collect()),
            expiry: Some(timestamp::format(expiry)),
            token: token.into(),
        })
    }

    async fn fetch_jwks(&self) -> Result<Jwks, OidcError> {
        let what = "fetching the issuer's signing keys (jwks_uri)";
        let response = self
            .client
            .send(
                http::Method::GET,
                &self.discovery.jwks_uri,
                &[accept_json()],
                Vec::new(),
                Some(HTTP_TIMEOUT),
            )
            .await
            .map_err(|cause| OidcError::Request { what, cause })?;
        if response.status != http::StatusCode::OK {
            return Err(OidcError::BadTokenResponse {
                what,
                reason: format!("GET {} answered {}", self.discovery.jwks_uri, response.status),
            });
        }
        Jwks::parse(&response.body).map_err(|e| OidcError::BadTokenResponse {
            what,
            reason: e.to_string(),
        })
    }
}

fn accept_json() -> (http::HeaderName, String) {
    (http::header::ACCEPT, "application/json".into())
}

fn one_line(text: &str) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    line.chars().take(300).collect()
}

/// Equal, in time that depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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
            .is_some_and(|state| constant_time_eq(state.as_bytes(), expected_state.as_bytes()));
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

    fn provider(jwks: Jwks) -> Provider {
        let issuer = "https://issuer.example.com";
        Provider {
            issuer: issuer.into(),
            discovery: Discovery {
                issuer: issuer.into(),
                authorization_endpoint: format!("{issuer}/authorize"),
                token_endpoint: format!("{issuer}/token"),
                jwks_uri: format!("{issuer}/keys"),
                response_modes_supported: vec!["query".into(), "form_post".into()],
                supervisor: None,
            },
            client: HttpsClient::new(issuer, &TlsOptions::default(), None).unwrap(),
            jwks: Some(jwks),
        }
    }

    #[tokio::test]
    async fn id_tokens_are_checked_for_issuer_audience_expiry_and_nonce() {
        let (key, jwks) = jose::tests::es256_key();
        let mut provider = provider(jwks);
        let header = serde_json::json!({"alg": "ES256", "kid": "k1"});
        let exp = timestamp::now().unix_timestamp() + 3600;
        let good = serde_json::json!({"iss": "https://issuer.example.com", "aud": ["other", "pinniped-cli"],
            "exp": exp, "nonce": "n1", "email": "a@example.com"});
        let token = jose::tests::sign(&key, &header, &good);
        let id = provider
            .validate_id_token(&token, "pinniped-cli", Some("n1"))
            .await
            .unwrap();
        assert_eq!(id.claims.unwrap()["email"], "a@example.com");
        assert_eq!(
            id.expiry
                .as_deref()
                .and_then(timestamp::parse)
                .unwrap()
                .unix_timestamp(),
            exp
        );
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
            cases.push((jose::tests::sign(&key, &header, &claims), expected));
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

    #[test]
    fn the_authorize_url_carries_pkce_state_nonce_and_form_post() {
        let (_, jwks) = jose::tests::es256_key();
        let provider = provider(jwks);
        assert!(provider.discovery.supports_form_post());
        let params = LoginParams::generate().unwrap();
        let config = ClientConfig {
            client_id: "pinniped-cli".into(),
            scopes: vec!["openid".into(), "offline_access".into()],
        };
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
