//! `authentication.concierge.pinniped.dev/v1alpha1`: the Concierge's authenticators,
//! [`JWTAuthenticator`] and [`WebhookAuthenticator`]. Cluster-scoped CRDs.
//!
//! Field names, JSON shapes, defaults and validation are Pinniped's, so Pinniped's manifests apply
//! unchanged; the Rust type names follow Pinniped's Go type names. Doc comments on fields become
//! the CRD's OpenAPI descriptions (`conf/crds/`, regenerated with
//! `cargo run -p selkie-api --example crdgen`).
//!
//! Strings that Pinniped declares without `omitempty` (`claims.username`, `claims.groups`) are
//! `Option<String>` here; an empty string sent by a Go client reads as `Some("")` and means the
//! same as absent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// Shared with the Supervisor's identity providers; re-exported here, where they first lived.
pub use crate::common::{
    CertificateAuthorityDataSourceKind, CertificateAuthorityDataSourceSpec, Phase, TLSSpec,
};

/// The API group (before any `apiGroupSuffix` replacement, see [`crate::group_suffix`]).
pub const GROUP: &str = "authentication.concierge.pinniped.dev";
/// The one version of the group.
pub const VERSION: &str = "v1alpha1";

/// A JWT authenticator: validates a signed JWT (signature from the issuer's JWKS, `iss`, `aud`,
/// expiry and optional rules) and maps its claims to a Kubernetes username, groups and extras.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "authentication.concierge.pinniped.dev",
    version = "v1alpha1",
    kind = "JWTAuthenticator",
    plural = "jwtauthenticators",
    singular = "jwtauthenticator",
    category = "pinniped",
    category = "pinniped-authenticator",
    category = "pinniped-authenticators",
    status = "JWTAuthenticatorStatus",
    derive = "PartialEq",
    doc = "JWTAuthenticator configures how the Concierge validates JWTs from one OIDC issuer and \
           turns their claims into a Kubernetes identity.",
    printcolumn(name = "Issuer", type_ = "string", json_path = ".spec.issuer"),
    printcolumn(name = "Audience", type_ = "string", json_path = ".spec.audience"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct JWTAuthenticatorSpec {
    /// The OIDC issuer URL (https only). Its discovery document locates the signing keys, and the
    /// token's "iss" claim must equal it.
    #[schemars(length(min = 1), pattern(r"^https://"))]
    pub issuer: String,

    /// The value the token's "aud" claim must contain (usually the OIDC client ID).
    #[schemars(length(min = 1))]
    pub audience: String,

    /// Which claims (or CEL expressions over them) give the username, groups and extras.
    #[serde(default, skip_serializing_if = "JWTTokenClaims::is_empty")]
    pub claims: JWTTokenClaims,

    /// Extra conditions on the token's claims, all of which must hold (like claimValidationRules in
    /// Kubernetes' structured AuthenticationConfiguration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_validation_rules: Vec<ClaimValidationRule>,

    /// CEL conditions on the resulting user, all of which must hold (for example, no "system:"
    /// prefix); like userValidationRules in Kubernetes' structured AuthenticationConfiguration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_validation_rules: Vec<UserValidationRule>,

    /// How to trust the issuer's TLS certificate; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,

    /// Selkie extension (see [`LoginAuthorization`]): who may log in through this authenticator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_authorization: Option<LoginAuthorization>,
}

/// Selkie extension (Pinniped #557): a TokenCredentialRequest through the authenticator is
/// answered with a certificate only when kube-apiserver's authorizers (RBAC) allow the user the
/// certificate would name — its username and groups, plus system:authenticated — this action,
/// asked as a SubjectAccessReview; otherwise "authentication failed", and the Concierge's audit
/// line says why. Absent: everyone the authenticator accepts gets a certificate (Pinniped's
/// behaviour). For example verb "login", group "login.concierge.pinniped.dev", resource
/// "tokencredentialrequests", granted by a ClusterRole with that verb.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoginAuthorization {
    /// The verb asked about.
    #[schemars(length(min = 1, max = 253))]
    pub verb: String,
    /// The API group of the resource ("" for the core group).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub group: String,
    /// The resource asked about.
    #[schemars(length(min = 1, max = 253))]
    pub resource: String,
    /// The object's name, if the grant should name one (for example this authenticator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
}

/// How a token's claims become the user's identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JWTTokenClaims {
    /// The claim holding the username; "username" when neither this nor usernameExpression is set.
    /// Mutually exclusive with usernameExpression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,

    /// A CEL expression over `claims` that yields the username (a non-empty string). Mutually
    /// exclusive with username.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_expression: Option<String>,

    /// The claim holding the groups; "groups" when neither this nor groupsExpression is set.
    /// Mutually exclusive with groupsExpression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<String>,

    /// A CEL expression over `claims` that yields the groups (a string or a list of strings; empty
    /// means none). Mutually exclusive with groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_expression: Option<String>,

    /// Extra attributes of the user, each computed by a CEL expression over `claims`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<ExtraMapping>,
}

impl JWTTokenClaims {
    /// Whether nothing is configured (every claim takes its default).
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One extra attribute of the user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraMapping {
    /// The extra's key: a lowercase, domain-prefixed path such as "example.org/team", without '='.
    /// Keys are unique.
    pub key: String,

    /// A CEL expression over `claims` yielding the value: a string or a list of strings. Empty
    /// values leave the extra out.
    pub value_expression: String,
}

/// One condition on the token's claims: either a required claim value (`claim` +
/// `requiredValue`), or a CEL `expression` with an optional `message`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimValidationRule {
    /// A claim that must be present with the string value requiredValue. Mutually exclusive with
    /// expression and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,

    /// The value the claim must have; the empty string when claim is set and this is not.
    /// Mutually exclusive with expression and message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_value: Option<String>,

    /// A CEL expression over `claims` that must evaluate to true. Mutually exclusive with claim and
    /// requiredValue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,

    /// The error message when expression is false. Mutually exclusive with claim and
    /// requiredValue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One CEL condition on the authenticated user (`user.username`, `user.groups`, `user.uid`,
/// `user.extra`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserValidationRule {
    /// A CEL expression over `user` that must evaluate to true.
    pub expression: String,

    /// The error message when expression is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The observed state of a JWTAuthenticator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JWTAuthenticatorStatus {
    /// The authenticator's conditions (Ready, IssuerURLValid, DiscoveryURLValid, JWKSURLValid,
    /// JWKSFetchValid, AuthenticatorValid, TLSConfigurationValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,
}

/// A webhook authenticator: validates a token by sending it to a remote webhook as an
/// `authentication.k8s.io` TokenReview.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "authentication.concierge.pinniped.dev",
    version = "v1alpha1",
    kind = "WebhookAuthenticator",
    plural = "webhookauthenticators",
    singular = "webhookauthenticator",
    category = "pinniped",
    category = "pinniped-authenticator",
    category = "pinniped-authenticators",
    status = "WebhookAuthenticatorStatus",
    derive = "PartialEq",
    doc = "WebhookAuthenticator configures a remote TokenReview webhook that the Concierge asks to \
           validate tokens.",
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.endpoint"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAuthenticatorSpec {
    /// The webhook's URL (https only).
    #[schemars(length(min = 1), pattern(r"^https://"))]
    pub endpoint: String,

    /// How to trust the webhook's TLS certificate; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,

    /// Selkie extension: what a TokenCredentialRequest's certificate must say of this webhook's
    /// identities (see [`CertificateIdentity`]); Exact when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_identity: Option<CertificateIdentity>,

    /// Selkie extension (see [`LoginAuthorization`]): who may log in through this authenticator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_authorization: Option<LoginAuthorization>,
}

/// Selkie extension (Pinniped has no such field): what the client certificate of a
/// TokenCredentialRequest must say of an identity this webhook returns. Exact (the default, as
/// Pinniped): an identity with a UID, or extras other than
/// authentication.kubernetes.io/credential-id, gets no certificate, because a certificate carries
/// only a username and groups. UsernameAndGroups: it gets a certificate with its username and
/// groups, and the UID and extras are left out — for webhooks whose identities always have a UID,
/// such as kube-apiserver's own TokenReview of service-account tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CertificateIdentity {
    /// The whole identity: one with a UID or extras gets no certificate (Pinniped's behaviour).
    #[default]
    Exact,
    /// The username and groups; the UID and extras are left out of the certificate.
    UsernameAndGroups,
}

/// The observed state of a WebhookAuthenticator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAuthenticatorStatus {
    /// The authenticator's conditions (Ready, EndpointURLValid, WebhookConnectionValid,
    /// AuthenticatorValid, TLSConfigurationValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,
}

#[cfg(test)]
mod tests;
