//! OAuth 2.0 error responses as the Supervisor gives them: the RFC 6749 `error` code and an
//! `error_description` that starts with the code's general meaning and ends with what exactly is
//! wrong — the wording Pinniped's Supervisor uses, which scripts and users already know.

use serde::Serialize;

/// An OAuth 2.0 / OIDC error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `invalid_request`.
    InvalidRequest,
    /// `invalid_client`.
    InvalidClient,
    /// `invalid_grant`.
    InvalidGrant,
    /// `invalid_scope`.
    InvalidScope,
    /// `invalid_state`.
    InvalidState,
    /// `unauthorized_client`.
    UnauthorizedClient,
    /// `unsupported_grant_type`.
    UnsupportedGrantType,
    /// `unsupported_response_type`.
    UnsupportedResponseType,
    /// `unsupported_response_mode`.
    UnsupportedResponseMode,
    /// `access_denied`.
    AccessDenied,
    /// `server_error`.
    ServerError,
    /// `temporarily_unavailable`.
    TemporarilyUnavailable,
    /// `login_required` (OpenID Connect Core §3.1.2.6): `prompt=none`, and the user would have
    /// to log in.
    LoginRequired,
    /// `authorization_pending` (RFC 8628 §3.5): the device login is not finished yet.
    AuthorizationPending,
    /// `slow_down` (RFC 8628 §3.5): polled sooner than the interval allows.
    SlowDown,
    /// `expired_token` (RFC 8628 §3.5): the device code expired.
    ExpiredToken,
    /// `invalid_dpop_proof` (RFC 9449 §5): the DPoP proof is missing where one is required,
    /// invalid, or replayed.
    InvalidDpopProof,
    /// `use_dpop_nonce` (RFC 9449 §8): the DPoP proof lacks a current nonce of the server's;
    /// the response's `DPoP-Nonce` header has one.
    UseDpopNonce,
}

impl Code {
    /// The code as it is sent.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::InvalidClient => "invalid_client",
            Self::InvalidGrant => "invalid_grant",
            Self::InvalidScope => "invalid_scope",
            Self::InvalidState => "invalid_state",
            Self::UnauthorizedClient => "unauthorized_client",
            Self::UnsupportedGrantType => "unsupported_grant_type",
            Self::UnsupportedResponseType => "unsupported_response_type",
            Self::UnsupportedResponseMode => "unsupported_response_mode",
            Self::AccessDenied => "access_denied",
            Self::ServerError => "server_error",
            Self::TemporarilyUnavailable => "temporarily_unavailable",
            Self::LoginRequired => "login_required",
            Self::AuthorizationPending => "authorization_pending",
            Self::SlowDown => "slow_down",
            Self::ExpiredToken => "expired_token",
            Self::InvalidDpopProof => selkie_oidc::dpop::INVALID_PROOF_ERROR,
            Self::UseDpopNonce => selkie_oidc::dpop::USE_NONCE_ERROR,
        }
    }

    /// The first sentence of every description of this code.
    fn meaning(self) -> &'static str {
        match self {
            Self::InvalidRequest => "The request is missing a required parameter, includes an invalid parameter value, includes a parameter more than once, or is otherwise malformed.",
            Self::InvalidClient => "Client authentication failed (e.g., unknown client, no client authentication included, or unsupported authentication method).",
            Self::InvalidGrant => "The provided authorization grant (e.g., authorization code, resource owner credentials) or refresh token is invalid, expired, revoked, does not match the redirection URI used in the authorization request, or was issued to another client.",
            Self::InvalidScope => "The requested scope is invalid, unknown, or malformed.",
            Self::InvalidState => "The state is missing or does not have enough characters and is therefore considered too weak.",
            Self::UnauthorizedClient => "The client is not authorized to request a token using this method.",
            Self::UnsupportedGrantType => "The authorization grant type is not supported by the authorization server.",
            Self::UnsupportedResponseType => "The authorization server does not support obtaining a token using this method.",
            Self::UnsupportedResponseMode => "The authorization server does not support obtaining a response using this response mode.",
            Self::AccessDenied => "The resource owner or authorization server denied the request.",
            Self::ServerError => "The authorization server encountered an unexpected condition that prevented it from fulfilling the request.",
            Self::TemporarilyUnavailable => "The authorization server is currently unable to handle the request due to a temporary overloading or maintenance of the server.",
            Self::LoginRequired => "The Authorization Server requires End-User authentication.",
            Self::AuthorizationPending => "The authorization request is still pending as the end user hasn't yet completed the user-interaction steps.",
            Self::SlowDown => "The client is polling too quickly and should back off at a reasonable rate.",
            Self::ExpiredToken => "The device_code has expired, and the device authorization session has concluded.",
            Self::InvalidDpopProof => "The DPoP proof JWT is missing, invalid, or does not match the request.",
            Self::UseDpopNonce => "The authorization server requires a nonce in the DPoP proof: make a new proof with the nonce of the DPoP-Nonce response header.",
        }
    }

    /// The HTTP status of this error when it is not redirected.
    pub fn http_status(self) -> u16 {
        match self {
            Self::InvalidClient => 401,
            Self::AccessDenied => 403,
            Self::ServerError => 500,
            Self::TemporarilyUnavailable => 503,
            _ => 400,
        }
    }
}

/// One error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct OAuthError {
    /// The code.
    #[serde(rename = "error", serialize_with = "serialize_code")]
    pub code: Code,
    /// The code's meaning and what exactly is wrong.
    #[serde(rename = "error_description")]
    pub description: String,
}

fn serialize_code<S: serde::Serializer>(code: &Code, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(code.as_str())
}

impl OAuthError {
    /// `code` with `hint` (what exactly is wrong; may be empty).
    pub(crate) fn new(code: Code, hint: &str) -> Self {
        let description = if hint.is_empty() {
            code.meaning().to_string()
        } else {
            format!("{} {hint}", code.meaning())
        };
        Self { code, description }
    }

    /// The JSON body of a direct error response.
    pub(crate) fn json(&self) -> String {
        serde_json::json!({"error": self.code.as_str(), "error_description": self.description}).to_string()
    }
}

impl std::fmt::Display for OAuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.description)
    }
}

impl std::error::Error for OAuthError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_read_as_pinnipeds() {
        let error = OAuthError::new(
            Code::InvalidRequest,
            "Clients must use code_challenge_method=S256, plain is not allowed.",
        );
        assert_eq!(
            error.description,
            "The request is missing a required parameter, includes an invalid parameter value, includes a parameter more than once, or is otherwise malformed. Clients must use code_challenge_method=S256, plain is not allowed."
        );
        let body: serde_json::Value = serde_json::from_str(&error.json()).unwrap();
        assert_eq!(body["error"], "invalid_request");
        assert_eq!(serde_json::to_value(&error).unwrap(), body);
        assert_eq!(Code::InvalidClient.http_status(), 401);
    }
}
