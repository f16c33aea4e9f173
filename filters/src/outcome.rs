//! What an authenticator answers.

use std::sync::Arc;

use crate::identity::Identity;

/// One authenticator's answer for one credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The credential is valid and belongs to this identity.
    Authenticated(Arc<Identity>),
    /// Not this authenticator's kind of credential (for example a JWT from another issuer); the
    /// next authenticator may try.
    NotMine,
    /// This authenticator looked at the credential and refused it.
    Rejected(RejectReason),
}

/// Why a credential was refused. The reason feeds audit logs and metrics (see
/// [`RejectReason::as_str`]); what a client is told stays generic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// The credential could not be parsed (broken encoding, wrong structure).
    Malformed,
    /// The credential is larger than the configured limit.
    TooLarge,
    /// Signed with an algorithm that is not allowed (`none`, HMAC, or not the key's algorithm).
    UnsupportedAlgorithm,
    /// The signature does not verify.
    BadSignature,
    /// No trusted key matches the credential's key id, even after a refresh.
    UnknownKey,
    /// The issuer is not the configured one.
    UnknownIssuer,
    /// None of the credential's audiences is accepted.
    WrongAudience,
    /// The credential has expired.
    Expired,
    /// The credential is not valid yet.
    NotYetValid,
    /// A required claim is missing or has the wrong type.
    ClaimInvalid,
    /// A claim or user validation rule evaluated to false.
    ValidationRuleFailed,
    /// The reviewing service (webhook, kube-apiserver TokenReview) answered "not authenticated".
    NotAuthenticated,
    /// The identity it maps to has an empty user name.
    EmptyUsername,
    /// The certificate does not chain to a trusted CA, lacks clientAuth, or is outside its
    /// validity window.
    UntrustedCertificate,
    /// A service the authenticator depends on (webhook, JWKS endpoint) failed or answered garbage.
    /// Never cached: the next request asks again.
    UpstreamUnavailable,
}

impl RejectReason {
    /// A short, stable, bounded label for metrics and audit logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::TooLarge => "too_large",
            Self::UnsupportedAlgorithm => "unsupported_algorithm",
            Self::BadSignature => "bad_signature",
            Self::UnknownKey => "unknown_key",
            Self::UnknownIssuer => "unknown_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::ClaimInvalid => "claim_invalid",
            Self::ValidationRuleFailed => "validation_rule_failed",
            Self::NotAuthenticated => "not_authenticated",
            Self::EmptyUsername => "empty_username",
            Self::UntrustedCertificate => "untrusted_certificate",
            Self::UpstreamUnavailable => "upstream_unavailable",
        }
    }

    /// Whether this reason describes the credential itself (and may be cached as a negative
    /// result) rather than a failure to check it (which must never be cached).
    pub fn is_cacheable(self) -> bool {
        !matches!(self, Self::UpstreamUnavailable)
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
