//! The client-go exec credential protocol (`client.authentication.k8s.io` `ExecCredential`).
//!
//! kubectl runs a credential plugin with `KUBERNETES_EXEC_INFO` set to an `ExecCredential` whose
//! `spec` says which API version to answer in and, with `provideClusterInfo: true`, which cluster
//! the credential is for. The plugin answers one `ExecCredential` of the same API version on
//! stdout, with either `status.token` or `status.clientCertificateData` +
//! `status.clientKeyData`, and usually `status.expirationTimestamp`. Anything else it has to say
//! goes to stderr, which kubectl passes through to the user.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::gojson;

/// The environment variable kubectl passes the plugin's input in.
pub const EXEC_INFO_ENV: &str = "KUBERNETES_EXEC_INFO";

/// `ExecCredential` API versions Selkie speaks. (`v1alpha1` was removed from client-go.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecApiVersion {
    /// `client.authentication.k8s.io/v1`.
    V1,
    /// `client.authentication.k8s.io/v1beta1`, what `pinniped get kubeconfig` writes and what
    /// the pinniped CLI always answers in.
    V1Beta1,
}

impl ExecApiVersion {
    /// The `apiVersion` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "client.authentication.k8s.io/v1",
            Self::V1Beta1 => "client.authentication.k8s.io/v1beta1",
        }
    }

    /// The version named by `api_version`, if Selkie speaks it.
    pub fn parse(api_version: &str) -> Option<Self> {
        [Self::V1, Self::V1Beta1]
            .into_iter()
            .find(|version| version.as_str() == api_version)
    }
}

/// `spec.cluster` of an `ExecCredential` (identical in v1 and v1beta1): the cluster the
/// credential is for, as kubectl describes it. Field order and JSON names are client-go's.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cluster {
    /// The API server URL.
    #[serde(default)]
    pub server: String,
    /// The TLS server name to verify, when not the host of `server`.
    #[serde(default, rename = "tls-server-name", skip_serializing_if = "String::is_empty")]
    pub tls_server_name: String,
    /// Whether the server certificate goes unverified.
    #[serde(
        default,
        rename = "insecure-skip-tls-verify",
        skip_serializing_if = "is_false"
    )]
    pub insecure_skip_tls_verify: bool,
    /// The CA bundle, base64 of PEM, exactly as sent.
    #[serde(
        default,
        rename = "certificate-authority-data",
        skip_serializing_if = "String::is_empty"
    )]
    pub certificate_authority_data: String,
    /// The proxy URL.
    #[serde(default, rename = "proxy-url", skip_serializing_if = "String::is_empty")]
    pub proxy_url: String,
    /// Whether response compression is off.
    #[serde(default, rename = "disable-compression", skip_serializing_if = "is_false")]
    pub disable_compression: bool,
    /// The cluster's `client.authentication.k8s.io/exec` extension, raw, or `None` (`null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Box<RawValue>>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Cluster {
    /// Appends this cluster as Go's `encoding/json` writes client-go's `v1beta1.Cluster`, which
    /// is what Pinniped hashes into its credential-cache keys. Returns `false` (and appends
    /// nothing) where client-go would have refused the cluster, so Pinniped saw no cluster: a
    /// CA that is not base64. (Go's URL parser accepts nearly anything, so the proxy URL is not
    /// checked.)
    pub fn write_go_json(&self, out: &mut String) -> bool {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        // client-go holds the CA as bytes and base64-encodes them again on the way out.
        let ca = if self.certificate_authority_data.is_empty() {
            String::new()
        } else {
            match engine.decode(&self.certificate_authority_data) {
                Ok(bytes) => engine.encode(bytes),
                Err(_) => return false,
            }
        };
        out.push_str("{\"server\":");
        gojson::write_string(out, &self.server);
        if !self.tls_server_name.is_empty() {
            out.push_str(",\"tls-server-name\":");
            gojson::write_string(out, &self.tls_server_name);
        }
        if self.insecure_skip_tls_verify {
            out.push_str(",\"insecure-skip-tls-verify\":true");
        }
        if !ca.is_empty() {
            out.push_str(",\"certificate-authority-data\":");
            gojson::write_string(out, &ca);
        }
        if !self.proxy_url.is_empty() {
            out.push_str(",\"proxy-url\":");
            gojson::write_string(out, &self.proxy_url);
        }
        if self.disable_compression {
            out.push_str(",\"disable-compression\":true");
        }
        // runtime.RawExtension is a struct, so omitempty never drops it; empty, it is `null`.
        out.push_str(",\"config\":");
        match &self.config {
            Some(raw) if raw.get() != "null" => gojson::write_compact(out, raw.get()),
            _ => out.push_str("null"),
        }
        out.push('}');
        true
    }
}

/// What kubectl passed in `KUBERNETES_EXEC_INFO`.
#[derive(Debug, Clone)]
pub struct ExecInfo {
    /// The version to answer in.
    pub api_version: ExecApiVersion,
    /// The cluster, when the kubeconfig says `provideClusterInfo: true`.
    pub cluster: Option<Cluster>,
    /// Whether the plugin may prompt on stdin.
    pub interactive: bool,
}

/// Why `KUBERNETES_EXEC_INFO` cannot be used. Messages never quote its content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecInfoError {
    /// It is not a JSON object of the expected shape (kubectl always sends one; someone set the
    /// variable by hand, or a wrapper mangled it).
    #[error(
        "KUBERNETES_EXEC_INFO is not a valid ExecCredential (JSON {category} error at line {line} column {column}); \
         unset it when running selkie by hand"
    )]
    Invalid {
        /// serde_json's classification: syntax, data, eof.
        category: &'static str,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// An `ExecCredential` of a version Selkie does not speak, or not an `ExecCredential` at all.
    #[error(
        "KUBERNETES_EXEC_INFO is a {kind:?} of apiVersion {api_version:?}; selkie answers ExecCredentials of \
         client.authentication.k8s.io/v1 and v1beta1: set users[].user.exec.apiVersion in the kubeconfig to one of them"
    )]
    Unsupported {
        /// The `apiVersion` received.
        api_version: String,
        /// The `kind` received.
        kind: String,
    },
}

#[derive(Deserialize)]
struct ExecCredentialIn {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    spec: SpecIn,
}

#[derive(Deserialize, Default)]
struct SpecIn {
    #[serde(default)]
    cluster: Option<Cluster>,
    #[serde(default)]
    interactive: bool,
}

impl ExecInfo {
    /// Parses the value of `KUBERNETES_EXEC_INFO`.
    pub fn parse(raw: &str) -> Result<Self, ExecInfoError> {
        let credential: ExecCredentialIn = serde_json::from_str(raw).map_err(|e| ExecInfoError::Invalid {
            category: match e.classify() {
                serde_json::error::Category::Io => "io",
                serde_json::error::Category::Syntax => "syntax",
                serde_json::error::Category::Data => "data",
                serde_json::error::Category::Eof => "eof",
            },
            line: e.line(),
            column: e.column(),
        })?;
        let api_version = ExecApiVersion::parse(&credential.api_version)
            .filter(|_| credential.kind == "ExecCredential")
            .ok_or(ExecInfoError::Unsupported {
                api_version: credential.api_version,
                kind: credential.kind,
            })?;
        Ok(Self {
            api_version,
            cluster: credential.spec.cluster,
            interactive: credential.spec.interactive,
        })
    }

    /// Reads `KUBERNETES_EXEC_INFO` from the environment: `None` when it is unset or empty (run by
    /// hand, or by a client that does not set it).
    pub fn from_env() -> Result<Option<Self>, ExecInfoError> {
        match std::env::var(EXEC_INFO_ENV) {
            Ok(raw) if !raw.is_empty() => Self::parse(&raw).map(Some),
            _ => Ok(None),
        }
    }

    /// The cluster as the pinniped CLI sees it when computing its cache key: client-go's
    /// `LoadExecCredentialFromEnv` result cast to v1beta1, so only a v1beta1 input with cluster
    /// information counts. For a v1 input Selkie still keys by the cluster (the pinniped CLI
    /// cannot answer v1 requests at all, so there is no entry of its to share).
    pub fn cache_cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }
}

/// `ExecCredentialStatus`: the credential handed to kubectl, and what the credential cache
/// stores. Field names and order are client-go's.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialStatus {
    /// When the credential stops working, RFC 3339; `None` for a token of unknown lifetime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_timestamp: Option<String>,
    /// A bearer token.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// A PEM client certificate.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_certificate_data: String,
    /// The PEM private key of the client certificate.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_key_data: String,
}

impl fmt::Debug for CredentialStatus {
    // Never shows the token or the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialStatus")
            .field("expiration_timestamp", &self.expiration_timestamp)
            .field("token", &(!self.token.is_empty()).then_some("<redacted>"))
            .field("client_certificate", &!self.client_certificate_data.is_empty())
            .field(
                "client_key",
                &(!self.client_key_data.is_empty()).then_some("<redacted>"),
            )
            .finish()
    }
}

impl CredentialStatus {
    /// Whether it holds a usable credential: a token, or a certificate with its key.
    pub fn is_usable(&self) -> bool {
        !self.token.is_empty()
            || (!self.client_certificate_data.is_empty() && !self.client_key_data.is_empty())
    }
}

#[derive(Serialize)]
struct ExecCredentialOut<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    spec: SpecOut,
    status: &'a CredentialStatus,
}

#[derive(Serialize)]
struct SpecOut {
    interactive: bool,
}

/// The `ExecCredential` to print on stdout: `kind`, `apiVersion` (`version`), an empty spec and
/// `status`, on one line with a trailing newline (as the pinniped CLI prints it).
pub fn render(version: ExecApiVersion, status: &CredentialStatus) -> String {
    let credential = ExecCredentialOut {
        kind: "ExecCredential",
        api_version: version.as_str(),
        spec: SpecOut { interactive: false },
        status,
    };
    // Serializing plain strings and bools cannot fail.
    let mut out = serde_json::to_string(&credential).unwrap_or_default();
    out.push('\n');
    out
}

/// An `ExecCredential` read back from a credential plugin's stdout.
#[derive(Debug, Deserialize)]
pub struct ExecCredentialResponse {
    /// `apiVersion`.
    #[serde(default, rename = "apiVersion")]
    pub api_version: String,
    /// `kind`.
    #[serde(default)]
    pub kind: String,
    /// `status`.
    #[serde(default)]
    pub status: Option<CredentialStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_kubectl_sends() {
        let sent = r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","spec":{"cluster":{"server":"https://127.0.0.1:6443","certificate-authority-data":"Y2E=","config":null},"interactive":false}}"#;
        let info = ExecInfo::parse(sent).unwrap();
        assert_eq!(info.api_version, ExecApiVersion::V1Beta1);
        let cluster = info.cluster.unwrap();
        assert_eq!(cluster.server, "https://127.0.0.1:6443");
        let mut json = String::new();
        assert!(cluster.write_go_json(&mut json));
        assert_eq!(
            json,
            r#"{"server":"https://127.0.0.1:6443","certificate-authority-data":"Y2E=","config":null}"#
        );
    }

    #[test]
    fn refuses_other_versions_without_quoting_the_input() {
        let error = ExecInfo::parse(
            r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1alpha1"}"#,
        )
        .unwrap_err();
        assert!(matches!(error, ExecInfoError::Unsupported { .. }), "{error}");
        let error = ExecInfo::parse("{\"secret-token\": ").unwrap_err();
        assert!(!error.to_string().contains("secret-token"), "{error}");
    }

    #[test]
    fn renders_an_exec_credential_of_the_requested_version() {
        let status = CredentialStatus {
            expiration_timestamp: Some("2026-01-02T03:04:05Z".into()),
            client_certificate_data: "CERT".into(),
            client_key_data: "KEY".into(),
            ..CredentialStatus::default()
        };
        assert_eq!(
            render(ExecApiVersion::V1, &status),
            "{\"kind\":\"ExecCredential\",\"apiVersion\":\"client.authentication.k8s.io/v1\",\"spec\":{\"interactive\":false},\
             \"status\":{\"expirationTimestamp\":\"2026-01-02T03:04:05Z\",\"clientCertificateData\":\"CERT\",\"clientKeyData\":\"KEY\"}}\n"
        );
        assert!(!format!("{status:?}").contains("KEY"));
    }
}
