//! The Concierge's TokenCredentialRequest API, as the pinniped CLI calls it
//! (`pkg/conciergeclient`): an anonymous `POST` of the token and the authenticator's name to
//! `<endpoint>/apis/login.concierge.<suffix>/v1alpha1/tokencredentialrequests`, trusting only the
//! given CA bundle; the answer's `status.credential` becomes the exec credential.

use std::time::Duration;

use base64::Engine as _;
use selkie_api::login::{TokenCredentialRequest, TokenCredentialRequestSpec, TypedLocalObjectReference};

use crate::{
    exec::CredentialStatus,
    http::{is_retryable_status, retrying, HttpError, HttpsClient, Response, TlsOptions, RETRY_DELAYS},
    timestamp,
};

/// Pinniped's default API group suffix.
pub const DEFAULT_API_GROUP_SUFFIX: &str = "pinniped.dev";
/// How long a TokenCredentialRequest may take (the pinniped CLI's timeout).
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the Concierge flags cannot be used. Each message names the flag.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConciergeConfigError {
    /// `--concierge-endpoint` is missing.
    #[error("--concierge-endpoint is required with --enable-concierge")]
    NoEndpoint,
    /// `--concierge-endpoint` is not an https URL.
    #[error("--concierge-endpoint {endpoint:?} is not usable: {reason}")]
    BadEndpoint {
        /// The value.
        endpoint: String,
        /// What is wrong.
        reason: String,
    },
    /// `--concierge-ca-bundle-data` is not base64.
    #[error("--concierge-ca-bundle-data is not base64 (it is the base64 of a PEM CA bundle): {0}")]
    CaNotBase64(base64::DecodeError),
    /// `--concierge-ca-bundle-data` decodes to something without a certificate.
    #[error("--concierge-ca-bundle-data holds no PEM certificate")]
    CaNoCertificates,
    /// `--concierge-authenticator-name` is missing.
    #[error("--concierge-authenticator-name is required with --enable-concierge")]
    NoAuthenticatorName,
    /// `--concierge-authenticator-type` is not `webhook` or `jwt`.
    #[error("--concierge-authenticator-type {0:?} is not supported: use \"webhook\" or \"jwt\"")]
    BadAuthenticatorType(String),
    /// The API group suffix is not a DNS subdomain with a dot.
    #[error("{flag} {suffix:?} is not a valid API group suffix: {reason}")]
    BadGroupSuffix {
        /// The flag.
        flag: &'static str,
        /// The value.
        suffix: String,
        /// What is wrong.
        reason: String,
    },
    /// The TLS client cannot be built from these settings.
    #[error("the Concierge client cannot be configured: {0}")]
    Client(#[from] HttpError),
}

/// Why an exchange produced no credential. Messages name the endpoint and what to check, never
/// the token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The endpoint could not be reached, the TLS handshake failed, or no answer came in time.
    #[error("could not reach the Concierge: {0}; check --concierge-endpoint and --concierge-ca-bundle-data")]
    Unreachable(#[source] HttpError),
    /// The Concierge answered, but not with a TokenCredentialRequest (wrong endpoint or group
    /// suffix, API not installed, anonymous access blocked, …).
    #[error("the TokenCredentialRequest to {url} failed with HTTP {status}{detail}; check --concierge-endpoint and --concierge-api-group-suffix")]
    Http {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: http::StatusCode,
        /// `: <metav1.Status message>`, or empty.
        detail: String,
    },
    /// The answer could not be understood.
    #[error(
        "the Concierge at {url} answered with something that is not a TokenCredentialRequest ({reason})"
    )]
    BadAnswer {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The Concierge refused the token (`status.message`, usually "authentication failed").
    #[error(
        "the Concierge refused the token ({message}): check that the token is valid and current, and that the \
         {kind} {name:?} (--concierge-authenticator-type, --concierge-authenticator-name) is the one that accepts it"
    )]
    Refused {
        /// What the Concierge said.
        message: String,
        /// The authenticator kind asked for.
        kind: String,
        /// The authenticator name asked for.
        name: String,
    },
}

/// The Concierge settings of `login oidc` and `login static`, as their flags give them (the
/// binary fills them from the flags both commands share).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConciergeOptions {
    /// `--enable-concierge`.
    pub enabled: bool,
    /// `--concierge-authenticator-type`.
    pub authenticator_type: String,
    /// `--concierge-authenticator-name`.
    pub authenticator_name: String,
    /// `--concierge-endpoint`.
    pub endpoint: String,
    /// `--concierge-ca-bundle-data` (base64 of PEM).
    pub ca_bundle_data: String,
    /// `--concierge-api-group-suffix`.
    pub api_group_suffix: String,
}

impl ConciergeOptions {
    /// The client to exchange tokens with: `None` without `--enable-concierge`. Checks the
    /// settings as [`ConciergeClient::new`] does and sends nothing, so a login calls it before it
    /// reads or sends anything. Fails with "invalid Concierge parameters: …" naming the flag.
    pub fn client(&self) -> anyhow::Result<Option<ConciergeClient>> {
        if !self.enabled {
            return Ok(None);
        }
        ConciergeClient::new(
            &self.endpoint,
            &self.ca_bundle_data,
            &self.authenticator_type,
            &self.authenticator_name,
            &self.api_group_suffix,
        )
        .map(Some)
        .map_err(|e| anyhow::anyhow!("invalid Concierge parameters: {e}"))
    }
}

/// A configured Concierge client.
#[derive(Debug)]
pub struct ConciergeClient {
    http: HttpsClient,
    authenticator: TypedLocalObjectReference,
    group_suffix: String,
}

/// Checks an API group suffix the way Pinniped does: a DNS-1123 subdomain of at least two labels.
pub fn validate_group_suffix(flag: &'static str, suffix: &str) -> Result<(), ConciergeConfigError> {
    let bad = |reason: &str| ConciergeConfigError::BadGroupSuffix {
        flag,
        suffix: suffix.to_string(),
        reason: reason.to_string(),
    };
    if !suffix.contains('.') {
        return Err(bad("it must contain '.'"));
    }
    if suffix.len() > 253 {
        return Err(bad("it must be at most 253 characters"));
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if !suffix.split('.').all(label_ok) {
        return Err(bad(
            "it must be lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit",
        ));
    }
    Ok(())
}

impl ConciergeClient {
    /// Checks the Concierge flags as the pinniped CLI does and builds the client: `endpoint`
    /// an https URL, `ca_bundle_base64` the base64 of a PEM bundle (empty: the system's roots),
    /// `authenticator_type` `webhook` or `jwt` (any case), `authenticator_name` non-empty,
    /// `group_suffix` a valid suffix.
    pub fn new(
        endpoint: &str,
        ca_bundle_base64: &str,
        authenticator_type: &str,
        authenticator_name: &str,
        group_suffix: &str,
    ) -> Result<Self, ConciergeConfigError> {
        if endpoint.is_empty() {
            return Err(ConciergeConfigError::NoEndpoint);
        }
        let uri: http::Uri =
            endpoint
                .parse()
                .map_err(|e: http::uri::InvalidUri| ConciergeConfigError::BadEndpoint {
                    endpoint: endpoint.to_string(),
                    reason: e.to_string(),
                })?;
        if uri.scheme_str() != Some("https") {
            return Err(ConciergeConfigError::BadEndpoint {
                endpoint: endpoint.to_string(),
                reason: format!(
                    "the scheme must be \"https\", not {:?}",
                    uri.scheme_str().unwrap_or_default()
                ),
            });
        }
        let ca_pem = if ca_bundle_base64.is_empty() {
            None
        } else {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(ca_bundle_base64.trim())
                .map_err(ConciergeConfigError::CaNotBase64)?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(ConciergeConfigError::CaNoCertificates);
            }
            Some(pem)
        };
        let kind = match authenticator_type.to_ascii_lowercase().as_str() {
            "webhook" => "WebhookAuthenticator",
            "jwt" => "JWTAuthenticator",
            _ => {
                return Err(ConciergeConfigError::BadAuthenticatorType(
                    authenticator_type.to_string(),
                ))
            }
        };
        if authenticator_name.is_empty() {
            return Err(ConciergeConfigError::NoAuthenticatorName);
        }
        validate_group_suffix("--concierge-api-group-suffix", group_suffix)?;
        let tls = TlsOptions {
            ca_pem,
            ..TlsOptions::default()
        };
        Ok(Self {
            http: HttpsClient::new(endpoint, &tls, None)?,
            authenticator: TypedLocalObjectReference {
                api_group: Some(format!("authentication.concierge.{group_suffix}")),
                kind: kind.to_string(),
                name: authenticator_name.to_string(),
            },
            group_suffix: group_suffix.to_string(),
        })
    }

    /// The request path of TokenCredentialRequests under the endpoint.
    pub fn path(&self) -> String {
        format!(
            "/apis/login.concierge.{}/v1alpha1/tokencredentialrequests",
            self.group_suffix
        )
    }

    /// Exchanges `token` for a cluster credential, within `timeout`, asking again while the
    /// Concierge is briefly out of reach (see [`ConciergeClient::post_retrying`]). A refusal
    /// (`status.message`) is final at once.
    pub async fn exchange(&self, token: &str, timeout: Duration) -> Result<CredentialStatus, ExchangeError> {
        let request = TokenCredentialRequest {
            api_version: format!("login.concierge.{}/v1alpha1", self.group_suffix),
            kind: "TokenCredentialRequest".into(),
            metadata: serde_json::Map::from_iter([(
                "creationTimestamp".to_string(),
                serde_json::Value::Null,
            )]),
            spec: TokenCredentialRequestSpec {
                token: token.to_string(),
                authenticator: self.authenticator.clone(),
            },
            status: Default::default(),
        };
        let body = serde_json::to_vec(&request).map_err(|e| ExchangeError::BadAnswer {
            url: self.http.url(&self.path()),
            reason: format!("the request could not be encoded: {e}"),
        })?;
        let url = self.http.url(&self.path());
        let response = self.post_retrying(body, timeout).await?;
        if !response.status.is_success() {
            return Err(ExchangeError::Http {
                url,
                status: response.status,
                // Never quote an answer that repeats the token (a misdirected echo).
                detail: status_message(&response.body)
                    .filter(|_| !String::from_utf8_lossy(&response.body).contains(token))
                    .map(|message| format!(": {message}"))
                    .unwrap_or_default(),
            });
        }
        let answer: TokenCredentialRequest =
            serde_json::from_slice(&response.body).map_err(|e| ExchangeError::BadAnswer {
                url: url.clone(),
                reason: format!("JSON error at line {} column {}", e.line(), e.column()),
            })?;
        let refused = |message: String| ExchangeError::Refused {
            message,
            kind: self.authenticator.kind.clone(),
            name: self.authenticator.name.clone(),
        };
        let credential = match (answer.status.credential, answer.status.message) {
            (_, Some(message)) => return Err(refused(message)),
            (None, None) => return Err(refused("unknown cause".into())),
            (Some(credential), None) => credential,
        };
        let expiration =
            timestamp::parse(&credential.expiration_timestamp).ok_or_else(|| ExchangeError::BadAnswer {
                url: url.clone(),
                reason: "status.credential.expirationTimestamp is not an RFC 3339 time".into(),
            })?;
        let status = CredentialStatus {
            expiration_timestamp: Some(timestamp::format(expiration)),
            token: credential.token,
            client_certificate_data: credential.client_certificate_data,
            client_key_data: credential.client_key_data,
        };
        if !status.is_usable() {
            return Err(ExchangeError::BadAnswer {
                url,
                reason: "status.credential has neither a certificate and key nor a token".into(),
            });
        }
        Ok(status)
    }
}

impl ConciergeClient {
    /// `POST`s the TokenCredentialRequest `body`, sending it again after [`RETRY_DELAYS`] while
    /// the failure is one a moment may cure: the connection was refused, reset or closed before
    /// an answer, or the answer was 429, 502, 503 or 504 (a Concierge pod killed or restarting
    /// behind kube-apiserver's aggregation layer or a load balancer). Everything fits in
    /// `timeout`; the last answer (whatever its status) or error is returned. A request is
    /// only a credential asked for: sending it twice issues nothing the caller does not get.
    async fn post_retrying(&self, body: Vec<u8>, timeout: Duration) -> Result<Response, ExchangeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let path = self.path();
        let again = |outcome: &Result<Response, HttpError>| match outcome {
            Ok(response) => is_retryable_status(response.status),
            Err(error) => error.is_retryable(),
        };
        retrying(&RETRY_DELAYS, Some(deadline), again, || {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            self.http.post_json(&path, body.clone(), Some(left))
        })
        .await
        .map_err(ExchangeError::Unreachable)
    }
}

/// What an error answer says, on one line and bounded to 300 characters: the `message` of a
/// `metav1.Status` body; else a short plain-text body (kube-apiserver's aggregation layer answers
/// `service unavailable` or `error trying to reach service: …` as text); else nothing (JSON
/// without a message, binary, or a text longer than 1 KiB, such as an HTML page).
pub fn status_message(body: &[u8]) -> Option<String> {
    let message = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(status) => status.get("message")?.as_str()?.to_string(),
        Err(_) if body.len() <= 1024 => {
            let text = std::str::from_utf8(body).ok()?;
            if text.trim_start().starts_with(['{', '[', '<']) {
                return None;
            }
            text.to_string()
        }
        Err(_) => return None,
    };
    let one_line: String = message
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    (!one_line.is_empty()).then(|| one_line.chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(
        endpoint: &str,
        ca: &str,
        kind: &str,
        name: &str,
        suffix: &str,
    ) -> Result<ConciergeClient, String> {
        ConciergeClient::new(endpoint, ca, kind, name, suffix).map_err(|e| e.to_string())
    }

    #[test]
    fn options_give_a_client_only_when_enabled() {
        let options = ConciergeOptions {
            enabled: false,
            endpoint: "http://not-checked".into(),
            ..ConciergeOptions::default()
        };
        assert!(options.client().unwrap().is_none());
        let enabled = ConciergeOptions {
            enabled: true,
            authenticator_type: "jwt".into(),
            authenticator_name: "j".into(),
            endpoint: "https://127.0.0.1:8443".into(),
            api_group_suffix: "pinniped.dev".into(),
            ..ConciergeOptions::default()
        };
        let client = enabled.client().unwrap().unwrap();
        assert_eq!(client.authenticator.kind, "JWTAuthenticator");
        let error = ConciergeOptions {
            endpoint: "http://x".into(),
            ..enabled
        }
        .client()
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("invalid Concierge parameters: --concierge-endpoint"),
            "{error}"
        );
    }

    #[test]
    fn checks_the_flags_like_the_pinniped_cli() {
        let ok = client("https://127.0.0.1:8443", "", "Webhook", "w", "pinniped.dev").unwrap();
        assert_eq!(ok.authenticator.kind, "WebhookAuthenticator");
        assert_eq!(
            ok.authenticator.api_group.as_deref(),
            Some("authentication.concierge.pinniped.dev")
        );
        let suffixed = client("https://example.com/base/", "", "jwt", "j", "tuna.io").unwrap();
        assert_eq!(
            suffixed.http.url(&suffixed.path()),
            "https://example.com/base/apis/login.concierge.tuna.io/v1alpha1/tokencredentialrequests"
        );
        for (endpoint, ca, kind, name, suffix, expected) in [
            (
                "",
                "",
                "jwt",
                "j",
                "pinniped.dev",
                "--concierge-endpoint is required",
            ),
            ("http://x", "", "jwt", "j", "pinniped.dev", "must be \"https\""),
            ("https://x", "%%%", "jwt", "j", "pinniped.dev", "not base64"),
            (
                "https://x",
                "aGVsbG8=",
                "jwt",
                "j",
                "pinniped.dev",
                "holds no PEM certificate",
            ),
            (
                "https://x",
                "",
                "ldap",
                "j",
                "pinniped.dev",
                "\"ldap\" is not supported",
            ),
            (
                "https://x",
                "",
                "jwt",
                "",
                "pinniped.dev",
                "--concierge-authenticator-name is required",
            ),
            ("https://x", "", "jwt", "j", "nodot", "must contain '.'"),
            ("https://x", "", "jwt", "j", "Upper.Case", "lowercase"),
        ] {
            let error = client(endpoint, ca, kind, name, suffix).unwrap_err();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn error_answers_are_quoted_from_a_status_or_a_short_text_only() {
        let status = br#"{"kind":"Status","message":"tokencredentialrequests is forbidden:\n  denied"}"#;
        assert_eq!(
            status_message(status).as_deref(),
            Some("tokencredentialrequests is forbidden: denied")
        );
        // kube-apiserver's aggregation layer answers in plain text.
        assert_eq!(
            status_message(b"service unavailable\n").as_deref(),
            Some("service unavailable")
        );
        assert_eq!(
            status_message(b"error trying to reach service: dial tcp 10.0.0.1:443: i/o timeout\n").as_deref(),
            Some("error trying to reach service: dial tcp 10.0.0.1:443: i/o timeout")
        );
        for unquoted in [
            &br#"{"kind":"Status"}"#[..],
            b"<html><body>gateway</body></html>",
            b"{not json",
            b"\xff\xfe",
            b"   \n",
            &[b'x'; 2000][..],
        ] {
            assert_eq!(status_message(unquoted), None, "{unquoted:?}");
        }
        assert_eq!(status_message(&[b'y'; 1000]).map(|m| m.len()), Some(300));
    }
}
