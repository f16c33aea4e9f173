//! `identity.concierge.pinniped.dev/v1alpha1` `WhoAmIRequest`: who the API server takes the
//! caller to be. Field names and JSON shape are Pinniped's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `apiVersion`.
pub const API_VERSION: &str = "identity.concierge.pinniped.dev/v1alpha1";

/// A WhoAmIRequest as sent and as answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmIRequest {
    /// `identity.concierge.pinniped.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `WhoAmIRequest`.
    #[serde(default)]
    pub kind: String,
    /// Object metadata, passed back as sent.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Always empty.
    #[serde(default)]
    pub spec: serde_json::Map<String, serde_json::Value>,
    /// The answer.
    #[serde(default)]
    pub status: WhoAmIRequestStatus,
}

/// `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmIRequestStatus {
    /// The caller.
    #[serde(default)]
    pub kubernetes_user_info: KubernetesUserInfo,
}

/// `status.kubernetesUserInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesUserInfo {
    /// The user.
    pub user: UserInfo,
}

/// `authentication.k8s.io/v1` `UserInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    /// User name.
    pub username: String,
    /// Unique id, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Extra attributes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}
