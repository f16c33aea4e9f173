//! `config.concierge.pinniped.dev/v1alpha1`: [`CredentialIssuer`], the Concierge's cluster-scoped
//! configuration (how to expose the impersonation proxy) and its report of which strategies work
//! on this cluster and how clients reach them (read by `pinniped get kubeconfig`).
//!
//! Field names, JSON shapes, defaults and validation are Pinniped's; the Rust type names follow
//! Pinniped's Go type names.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group (before any `apiGroupSuffix` replacement, see [`crate::group_suffix`]).
pub const GROUP: &str = "config.concierge.pinniped.dev";
/// The one version of the group.
pub const VERSION: &str = "v1alpha1";
/// The name of the singleton CredentialIssuer a default install creates.
pub const DEFAULT_CREDENTIAL_ISSUER_NAME: &str = "pinniped-concierge-config";

/// The desired configuration of the Concierge.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "config.concierge.pinniped.dev",
    version = "v1alpha1",
    kind = "CredentialIssuer",
    plural = "credentialissuers",
    singular = "credentialissuer",
    category = "pinniped",
    status = "CredentialIssuerStatus",
    derive = "PartialEq",
    doc = "CredentialIssuer holds the Concierge's configuration and reports how clients of this \
           cluster can obtain credentials.",
    printcolumn(
        name = "ProxyMode",
        type_ = "string",
        json_path = ".spec.impersonationProxy.mode"
    ),
    printcolumn(
        name = "DefaultStrategy",
        type_ = "string",
        json_path = r#".status.strategies[?(@.status == "Success")].type"#
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct CredentialIssuerSpec {
    /// How the impersonation proxy runs and is exposed.
    pub impersonation_proxy: ImpersonationProxySpec,
}

/// The impersonation proxy's desired configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImpersonationProxySpec {
    /// Whether the proxy runs: "enabled", "disabled", or "auto" (only on clusters whose control
    /// plane nodes are not visible, such as managed clusters).
    pub mode: ImpersonationProxyMode,

    /// The Service that exposes the proxy; a LoadBalancer when absent.
    #[serde(default)]
    pub service: ImpersonationProxyServiceSpec,

    /// The HTTPS endpoint (host or host:port) clients use to reach the proxy. Required when
    /// service.type is "None"; otherwise the Service's load balancer address or cluster DNS name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_endpoint: Option<String>,

    /// The proxy's serving certificate; the Concierge generates its own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ImpersonationProxyTLSSpec>,
}

/// Whether the impersonation proxy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImpersonationProxyMode {
    /// Run the proxy only where the cluster's signing key cannot be borrowed (no visible control
    /// plane nodes).
    Auto,
    /// Always run the proxy.
    Enabled,
    /// Never run the proxy.
    Disabled,
}

/// The Service the Concierge provisions in front of the impersonation proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImpersonationProxyServiceSpec {
    /// LoadBalancer (the default), ClusterIP, or None (no Service: expose the proxy yourself and
    /// set externalEndpoint).
    #[serde(default, rename = "type")]
    pub r#type: ImpersonationProxyServiceType,

    /// The Service's spec.loadBalancerIP, where the cloud provider supports it.
    #[serde(default, rename = "loadBalancerIP", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub load_balancer_ip: Option<String>,

    /// Annotations for the Service (for example a cloud load balancer's idle timeout).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,

    /// Selkie's extension (Pinniped #1064): the client address ranges (CIDRs such as
    /// `203.0.113.0/24`) the cloud load balancer admits, as the Service's
    /// spec.loadBalancerSourceRanges; type LoadBalancer only. Absent: the Service's own value is
    /// left as it is (Pinniped's behaviour); an empty list clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    pub load_balancer_source_ranges: Option<Vec<String>>,
}

/// The kind of Service in front of the impersonation proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ImpersonationProxyServiceType {
    /// A Service of type LoadBalancer; the default.
    #[default]
    LoadBalancer,
    /// A Service of type ClusterIP (reach it through an Ingress or a tunnel).
    ClusterIP,
    /// No Service at all.
    None,
}

/// The impersonation proxy's serving certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImpersonationProxyTLSSpec {
    /// The CA bundle (base64-encoded PEM) advertised to clients for the proxy. When absent, the
    /// Secret's "ca.crt" is advertised if it has one, else nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,

    /// A Secret of type kubernetes.io/tls in the Concierge's namespace with the proxy's serving
    /// certificate and key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub secret_name: Option<String>,
}

/// The Concierge's report on each way it tried to provide credentials on this cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialIssuerStatus {
    /// One entry per strategy attempted.
    pub strategies: Vec<CredentialIssuerStrategy>,
}

/// The outcome of one strategy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialIssuerStrategy {
    /// Which strategy.
    pub r#type: StrategyType,

    /// Whether it works.
    pub status: StrategyStatus,

    /// Why it is in this status.
    pub reason: StrategyReason,

    /// A human-readable explanation.
    #[schemars(length(min = 1))]
    pub message: String,

    /// When the status was last checked.
    #[schemars(schema_with = "crate::schema::time")]
    pub last_update_time: Time,

    /// How clients connect when the strategy works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend: Option<CredentialIssuerFrontend>,
}

/// A way of providing credentials on a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StrategyType {
    /// Client certificates signed with the cluster's own signing key (kube-cert-agent).
    KubeClusterSigningCertificate,
    /// The impersonation proxy.
    ImpersonationProxy,
}

/// Whether a strategy works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StrategyStatus {
    /// It works.
    Success,
    /// It does not work.
    Error,
}

/// The detailed reason for a strategy's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StrategyReason {
    /// The impersonation proxy is serving.
    Listening,
    /// The impersonation proxy is starting or waiting for its load balancer.
    Pending,
    /// The impersonation proxy is turned off.
    Disabled,
    /// Setting the strategy up failed.
    ErrorDuringSetup,
    /// The cluster signing key could not be fetched.
    CouldNotFetchKey,
    /// The cluster's API server URL or CA could not be found.
    CouldNotGetClusterInfo,
    /// The cluster signing key was fetched.
    FetchedKey,
}

/// How clients connect when using a strategy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialIssuerFrontend {
    /// Which frontend; selects which of the two info fields is set.
    pub r#type: FrontendType,

    /// Set when type is TokenCredentialRequestAPI.
    #[serde(
        default,
        rename = "tokenCredentialRequestInfo",
        skip_serializing_if = "Option::is_none"
    )]
    pub token_credential_request_api_info: Option<TokenCredentialRequestAPIInfo>,

    /// Set when type is ImpersonationProxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impersonation_proxy_info: Option<ImpersonationProxyInfo>,
}

/// The mechanism clients use to obtain credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FrontendType {
    /// The TokenCredentialRequest API, then the cluster's own API server.
    TokenCredentialRequestAPI,
    /// The impersonation proxy, which also serves TokenCredentialRequest.
    ImpersonationProxy,
}

/// Where the TokenCredentialRequest API's cluster lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenCredentialRequestAPIInfo {
    /// The Kubernetes API server's URL.
    #[schemars(length(min = 1), pattern(r"^https://|^http://"))]
    pub server: String,

    /// The API server's CA bundle, base64-encoded PEM.
    #[schemars(length(min = 1))]
    pub certificate_authority_data: String,
}

/// Where the impersonation proxy listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImpersonationProxyInfo {
    /// The proxy's HTTPS URL.
    #[schemars(length(min = 1), pattern(r"^https://"))]
    pub endpoint: String,

    /// The proxy's CA bundle, base64-encoded PEM.
    #[schemars(length(min = 1))]
    pub certificate_authority_data: String,
}

#[cfg(test)]
mod tests;
