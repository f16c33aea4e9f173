//! `login.concierge.pinniped.dev/v1alpha1` `TokenCredentialRequest`: a bearer token in, a
//! short-lived client certificate out. Field names and JSON shape are Pinniped's.

use serde::{Deserialize, Serialize};

/// The API group (before any `apiGroupSuffix` replacement).
pub const GROUP: &str = "login.concierge.pinniped.dev";
/// `apiVersion`.
pub const API_VERSION: &str = "login.concierge.pinniped.dev/v1alpha1";
/// What a failed request's `status.message` says: never why, so nothing leaks.
pub const AUTHENTICATION_FAILED: &str = "authentication failed";

/// A TokenCredentialRequest as sent and as answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCredentialRequest {
    /// `login.concierge.pinniped.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `TokenCredentialRequest`.
    #[serde(default)]
    pub kind: String,
    /// Object metadata, passed back as sent.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// What the client presents.
    #[serde(default)]
    pub spec: TokenCredentialRequestSpec,
    /// The answer.
    #[serde(default)]
    pub status: TokenCredentialRequestStatus,
}

/// `spec`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCredentialRequestSpec {
    /// The bearer token to exchange.
    #[serde(default)]
    pub token: String,
    /// Which authenticator must vouch for the token.
    #[serde(default)]
    pub authenticator: TypedLocalObjectReference,
}

impl std::fmt::Debug for TokenCredentialRequestSpec {
    // The token never appears in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCredentialRequestSpec")
            .field("token", &"<redacted>")
            .field("authenticator", &self.authenticator)
            .finish()
    }
}

/// `corev1.TypedLocalObjectReference`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    /// `authentication.concierge.pinniped.dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// `JWTAuthenticator` or `WebhookAuthenticator`.
    #[serde(default)]
    pub kind: String,
    /// The authenticator's name.
    #[serde(default)]
    pub name: String,
}

/// `status`: a credential, or a message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCredentialRequestStatus {
    /// The issued credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<ClusterCredential>,
    /// Why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `status.credential`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCredential {
    /// RFC 3339 time the certificate expires.
    pub expiration_timestamp: String,
    /// Unused by Pinniped (certificates only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// PEM client certificate.
    #[serde(default)]
    pub client_certificate_data: String,
    /// PEM private key.
    #[serde(default)]
    pub client_key_data: String,
}

impl std::fmt::Debug for ClusterCredential {
    // Key material never appears in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCredential")
            .field("expiration_timestamp", &self.expiration_timestamp)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_pinniped_cli_sends() {
        let sent = r#"{"kind":"TokenCredentialRequest","apiVersion":"login.concierge.pinniped.dev/v1alpha1",
            "metadata":{"creationTimestamp":null},
            "spec":{"token":"t0k3n","authenticator":{"apiGroup":"authentication.concierge.pinniped.dev","kind":"JWTAuthenticator","name":"dex"}},
            "status":{}}"#;
        let request: TokenCredentialRequest = serde_json::from_str(sent).unwrap();
        assert_eq!(request.spec.token, "t0k3n");
        assert_eq!(request.spec.authenticator.kind, "JWTAuthenticator");
        assert_eq!(request.spec.authenticator.name, "dex");
        assert!(!format!("{request:?}").contains("t0k3n"));
    }
}
