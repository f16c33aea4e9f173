//! Types several CRDs share: the `status.phase` every Pinniped CRD with conditions carries, and the
//! TLS settings of an outbound connection (Concierge authenticators, Supervisor identity
//! providers). Pinniped declares them once per API group with the same fields, values and
//! validation; here each is declared once, and [`crate::authentication`] re-exports them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A resource's overall state: the summary of its conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    /// Not yet (or not fully) reconciled; the default.
    #[default]
    Pending,
    /// Every condition is healthy; the resource is in use.
    Ready,
    /// At least one condition is unhealthy; the resource is not used.
    Error,
}

/// TLS settings for an outbound connection (to an OIDC issuer, a webhook, an LDAP server or
/// GitHub's API).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TLSSpec {
    /// The certificate authorities to trust: a base64-encoded PEM bundle. The system roots when
    /// neither this nor certificateAuthorityDataSource is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,

    /// A Secret or ConfigMap holding the PEM bundle to trust, in the namespace of the Pinniped
    /// component that reads this resource (the Concierge's or the Supervisor's); changes to it are
    /// picked up without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data_source: Option<CertificateAuthorityDataSourceSpec>,
}

/// Where to read a CA bundle from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthorityDataSourceSpec {
    /// Secret (of type kubernetes.io/tls or Opaque) or ConfigMap.
    pub kind: CertificateAuthorityDataSourceKind,

    /// The Secret's or ConfigMap's name, in the namespace of the Pinniped component that reads it.
    #[schemars(length(min = 1))]
    pub name: String,

    /// The key whose value is the PEM bundle; the value must be a non-empty, valid bundle.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// The kind of object a CA bundle is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CertificateAuthorityDataSourceKind {
    /// A Secret of type kubernetes.io/tls or Opaque.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}
