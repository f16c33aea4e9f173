//! `idp.supervisor.selkie.dev/v1alpha1`: Selkie's own upstream identity-provider kinds, which
//! Pinniped has no counterpart for. Today one: [`SAMLIdentityProvider`], a SAML 2.0 identity
//! provider the Supervisor is a service provider of (Pinniped issue #974).
//!
//! The group is Selkie's and does not change with the installation's `apiGroupSuffix` (that
//! setting renames Pinniped's groups only). A FederationDomain offers one with
//! `objectRef: {apiGroup: idp.supervisor.selkie.dev, kind: SAMLIdentityProvider, name: ...}`.
//!
//! For a FederationDomain whose issuer is `ISSUER`, the Supervisor is the service provider
//! `ISSUER/saml/metadata` (its metadata is served there) with its assertion consumer service at
//! `ISSUER/saml/acs` (HTTP-POST binding); register that with the identity provider. The
//! Supervisor sends unsigned AuthnRequests (HTTP-Redirect binding) and requires the identity
//! provider to sign its responses or assertions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::common::{Phase, TLSSpec};
use crate::supervisor_config::GO_DURATION_PATTERN;

/// The API group (Selkie's; not renamed by an `apiGroupSuffix`).
pub const GROUP: &str = "idp.supervisor.selkie.dev";
/// The one version of the group.
pub const VERSION: &str = "v1alpha1";
/// The clock skew allowed when `spec.allowedClockSkew` is absent.
pub const DEFAULT_CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(90);

/// An upstream SAML 2.0 identity provider.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "idp.supervisor.selkie.dev",
    version = "v1alpha1",
    kind = "SAMLIdentityProvider",
    plural = "samlidentityproviders",
    singular = "samlidentityprovider",
    namespaced,
    category = "selkie",
    category = "selkie-idp",
    category = "selkie-idps",
    status = "SAMLIdentityProviderStatus",
    derive = "PartialEq",
    doc = "SAMLIdentityProvider configures an upstream SAML 2.0 identity provider the Supervisor \
           sends users to for login (Selkie's extension).",
    printcolumn(name = "Metadata", type_ = "string", json_path = ".spec.idp.metadataURL"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct SAMLIdentityProviderSpec {
    /// Where the identity provider's metadata comes from.
    pub idp: SAMLIdentityProviderMetadata,

    /// Which parts of a verified assertion give the username and the groups.
    #[serde(default, skip_serializing_if = "SAMLClaims::is_empty")]
    pub claims: SAMLClaims,

    /// How far the identity provider's clock may be from the Supervisor's when an assertion's
    /// validity window is checked. From 0s to 5m; 90s when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        pattern(GO_DURATION_PATTERN),
        extend("x-kubernetes-validations" = [{
            "message": "allowedClockSkew must be at most 5m",
            "rule": "duration(self) <= duration('5m')"
        }])
    )]
    pub allowed_clock_skew: Option<String>,
}

/// The identity provider's SAML metadata (its `EntityDescriptor`): fetched from `metadataURL`, or
/// given inline in `metadata`; exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "message": "exactly one of metadataURL and metadata must be set",
    "rule": "has(self.metadataURL) != has(self.metadata)"
}]))]
pub struct SAMLIdentityProviderMetadata {
    /// The https URL the metadata is fetched from (again whenever the resource changes, and
    /// every hour, so the identity provider's new signing certificates are picked up).
    #[serde(default, rename = "metadataURL", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), pattern(r"^https://"))]
    pub metadata_url: Option<String>,

    /// The metadata XML itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 262144))]
    pub metadata: Option<String>,

    /// How to trust the TLS certificate of `metadataURL`'s server; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,
}

/// The assertion's parts that make the downstream identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SAMLClaims {
    /// The name of the attribute holding the username (its first value); the assertion's
    /// subject `NameID` when absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub username: Option<String>,

    /// The name of the attribute holding the groups (every value is a group); no groups when
    /// absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub groups: Option<String>,
}

impl SAMLClaims {
    /// Whether everything takes its default.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The observed state of a SAMLIdentityProvider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SAMLIdentityProviderStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The provider's conditions (Ready, TLSConfigurationValid, MetadataValid,
    /// AllowedClockSkewValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}
