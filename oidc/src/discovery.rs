//! OIDC discovery (`<issuer>/.well-known/openid-configuration`): the document's members Selkie
//! reads, and fetching it with the issuer check every consumer must make.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::https::{HttpError, HttpsClient};

/// The path of the discovery document under an issuer.
pub const WELL_KNOWN: &str = "/.well-known/openid-configuration";
/// The largest discovery document or JWKS read.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

/// The discovery document's members Selkie uses. Endpoints a kind of issuer need not have (a
/// Kubernetes service-account issuer has no authorization endpoint) are empty when absent.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Discovery {
    /// `issuer`.
    pub issuer: String,
    /// `authorization_endpoint`.
    #[serde(default)]
    pub authorization_endpoint: String,
    /// `token_endpoint`.
    #[serde(default)]
    pub token_endpoint: String,
    /// `jwks_uri`.
    pub jwks_uri: String,
    /// `userinfo_endpoint` (OIDC Core §5.3), empty when the issuer has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub userinfo_endpoint: String,
    /// `revocation_endpoint` (RFC 7009, announced as RFC 8414 §2 says), empty when none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revocation_endpoint: String,
    /// `device_authorization_endpoint` (RFC 8628 §4), empty when the issuer offers no device
    /// authorization grant (a Supervisor names it only for a FederationDomain that enables it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device_authorization_endpoint: String,
    /// `response_modes_supported`.
    #[serde(default)]
    pub response_modes_supported: Vec<String>,
    /// `dpop_signing_alg_values_supported` (RFC 9449 §5.1): the algorithms of the DPoP proofs
    /// the token endpoint accepts; empty when the issuer does not take DPoP proofs (a Supervisor
    /// names it only for a FederationDomain that binds sessions to a key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dpop_signing_alg_values_supported: Vec<String>,
    /// `discovery.supervisor.pinniped.dev/v1alpha1`, present only on a Pinniped(-compatible)
    /// Supervisor.
    #[serde(
        default,
        rename = "discovery.supervisor.pinniped.dev/v1alpha1",
        skip_serializing_if = "Option::is_none"
    )]
    pub supervisor: Option<Value>,
}

/// Why discovery failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The issuer is not an https URL without query, or names the well-known path itself.
    #[error("the issuer {0:?} must be an https:// URL with a host and no query")]
    BadIssuer(String),
    /// The document could not be fetched (unreachable, TLS failure, timeout, not 2xx).
    #[error("{0}")]
    Fetch(HttpError),
    /// The answer is not a discovery document.
    #[error("{url} is not an OIDC discovery document: {reason}")]
    NotADocument {
        /// The discovery URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The document names another issuer.
    #[error("the discovery document names issuer {found:?}, not {expected:?}")]
    IssuerMismatch {
        /// The issuer asked about.
        expected: String,
        /// What the document says.
        found: String,
    },
}

impl Discovery {
    /// The discovery URL of `issuer`, after checking the issuer is an https URL with a host, no
    /// query and no well-known path of its own.
    pub fn url_of(issuer: &str) -> Result<String, DiscoveryError> {
        let uri =
            crate::https::https_url(issuer).map_err(|_| DiscoveryError::BadIssuer(issuer.to_string()))?;
        if uri.query().is_some() || issuer.contains(WELL_KNOWN) {
            return Err(DiscoveryError::BadIssuer(issuer.to_string()));
        }
        Ok(format!("{}{WELL_KNOWN}", issuer.trim_end_matches('/')))
    }

    /// Fetches `issuer`'s document with `client` (each request bounded by `timeout`) and checks it
    /// names exactly `issuer`.
    pub async fn fetch(
        client: &HttpsClient,
        issuer: &str,
        timeout: Duration,
    ) -> Result<Self, DiscoveryError> {
        let url = Self::url_of(issuer)?;
        let body = client
            .get_json(&url, MAX_DOCUMENT_BYTES, Some(timeout))
            .await
            .map_err(DiscoveryError::Fetch)?;
        let document: Self = serde_json::from_slice(&body).map_err(|e| DiscoveryError::NotADocument {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        if document.issuer != issuer {
            return Err(DiscoveryError::IssuerMismatch {
                expected: issuer.to_string(),
                found: document.issuer,
            });
        }
        Ok(document)
    }

    /// Whether the issuer offers `response_mode=form_post`.
    pub fn supports_form_post(&self) -> bool {
        self.response_modes_supported
            .iter()
            .any(|mode| mode == "form_post")
    }

    /// Whether the issuer takes DPoP proofs (RFC 9449) signed with ES256, the one algorithm
    /// Selkie's proofs use ([`crate::dpop::ALGORITHM`]).
    pub fn supports_dpop(&self) -> bool {
        self.dpop_signing_alg_values_supported
            .iter()
            .any(|alg| alg == crate::dpop::ALGORITHM)
    }

    /// Whether the issuer is a Pinniped Supervisor (it publishes identity-provider discovery).
    pub fn is_supervisor(&self) -> bool {
        self.supervisor.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_urls_need_an_https_issuer_without_query() {
        assert_eq!(
            Discovery::url_of("https://issuer.example/a/").unwrap(),
            "https://issuer.example/a/.well-known/openid-configuration"
        );
        for issuer in [
            "http://issuer.example",
            "https://issuer.example?x=1",
            "https://issuer.example/.well-known/openid-configuration",
            "issuer",
        ] {
            assert!(
                matches!(Discovery::url_of(issuer), Err(DiscoveryError::BadIssuer(_))),
                "{issuer}"
            );
        }
    }

    #[test]
    fn dpop_support_means_es256_in_the_dpop_algorithms() {
        let document = |extra: Value| {
            let mut document =
                serde_json::json!({"issuer": "https://i.example", "jwks_uri": "https://i.example/k"});
            if !extra.is_null() {
                document["dpop_signing_alg_values_supported"] = extra;
            }
            serde_json::from_value::<Discovery>(document).unwrap()
        };
        assert!(!document(Value::Null).supports_dpop());
        assert!(!document(serde_json::json!(["RS256"])).supports_dpop());
        assert!(document(serde_json::json!(["RS256", "ES256"])).supports_dpop());
        // Absent, it is not written either (a Supervisor's document stays as it was).
        let written = serde_json::to_value(document(Value::Null)).unwrap();
        assert!(
            written.get("dpop_signing_alg_values_supported").is_none(),
            "{written}"
        );
    }
}
