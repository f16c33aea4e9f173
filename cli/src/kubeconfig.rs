//! Just enough of kubeconfig handling for `selkie whoami`: load and merge the files the way
//! client-go does, pick a context, and turn its user into a credential — a client certificate, a
//! token, basic auth, or the result of running its exec credential plugin.

use std::{
    collections::BTreeMap,
    io::IsTerminal as _,
    path::{Path, PathBuf},
    process::Stdio,
};

use base64::Engine as _;
use serde::Deserialize;

use crate::{
    exec::{Cluster as ExecCluster, CredentialStatus, ExecApiVersion, ExecCredentialResponse, EXEC_INFO_ENV},
    http::{ClientIdentity, TlsOptions},
};

/// The cluster extension whose content client-go passes to exec plugins as `cluster.config`.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";

/// Why a kubeconfig cannot be used. Messages name the file or entry at fault, never a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeconfigError {
    /// A file could not be read.
    #[error("could not read {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        error: std::io::Error,
    },
    /// A file is not a kubeconfig.
    #[error("{path} is not a valid kubeconfig: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's location-only explanation.
        reason: String,
    },
    /// No kubeconfig file was found at all.
    #[error("no kubeconfig found: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config")]
    None,
    /// The context to use is unknown or unset.
    #[error("{0}")]
    Context(String),
    /// The context names a cluster the kubeconfig lacks.
    #[error("context {context:?} names cluster {cluster:?}, which is not in the kubeconfig")]
    NoCluster {
        /// The context.
        context: String,
        /// The cluster.
        cluster: String,
    },
    /// A field is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The user's credential cannot be obtained.
    #[error("{0}")]
    Credential(String),
}

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    clusters: Option<Vec<Named<ClusterFields>>>,
    #[serde(default)]
    users: Option<Vec<Named<UserFields>>>,
    #[serde(default)]
    contexts: Option<Vec<Named<ContextFields>>>,
    #[serde(default, rename = "current-context")]
    current_context: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(default, alias = "cluster", alias = "user", alias = "context")]
    value: Option<T>,
}

/// A kubeconfig cluster.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClusterFields {
    /// `server`.
    #[serde(default)]
    pub server: String,
    /// `certificate-authority` (a file).
    #[serde(default, rename = "certificate-authority")]
    pub certificate_authority: Option<String>,
    /// `certificate-authority-data` (base64 PEM).
    #[serde(default, rename = "certificate-authority-data")]
    pub certificate_authority_data: Option<String>,
    /// `insecure-skip-tls-verify`.
    #[serde(default, rename = "insecure-skip-tls-verify")]
    pub insecure_skip_tls_verify: bool,
    /// `tls-server-name`.
    #[serde(default, rename = "tls-server-name")]
    pub tls_server_name: Option<String>,
    /// `proxy-url`.
    #[serde(default, rename = "proxy-url")]
    pub proxy_url: Option<String>,
    /// `disable-compression`.
    #[serde(default, rename = "disable-compression")]
    pub disable_compression: bool,
    /// `extensions`.
    #[serde(default)]
    pub extensions: Option<Vec<NamedExtension>>,
}

/// One `extensions[]` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedExtension {
    /// Its name.
    pub name: String,
    /// Its content.
    #[serde(default)]
    pub extension: serde_json::Value,
}

/// A kubeconfig user (`AuthInfo`).
#[derive(Clone, Default, Deserialize)]
pub struct UserFields {
    /// `client-certificate` (a file).
    #[serde(default, rename = "client-certificate")]
    pub client_certificate: Option<String>,
    /// `client-certificate-data` (base64 PEM).
    #[serde(default, rename = "client-certificate-data")]
    pub client_certificate_data: Option<String>,
    /// `client-key` (a file).
    #[serde(default, rename = "client-key")]
    pub client_key: Option<String>,
    /// `client-key-data` (base64 PEM).
    #[serde(default, rename = "client-key-data")]
    pub client_key_data: Option<String>,
    /// `token`.
    #[serde(default)]
    pub token: Option<String>,
    /// `tokenFile`.
    #[serde(default, rename = "tokenFile")]
    pub token_file: Option<String>,
    /// `username` (basic auth).
    #[serde(default)]
    pub username: Option<String>,
    /// `password` (basic auth).
    #[serde(default)]
    pub password: Option<String>,
    /// `exec`.
    #[serde(default)]
    pub exec: Option<ExecConfig>,
    /// `auth-provider` (not supported; only noticed).
    #[serde(default, rename = "auth-provider")]
    pub auth_provider: Option<serde_json::Value>,
}

impl std::fmt::Debug for UserFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserFields")
            .field("exec", &self.exec.as_ref().map(|exec| &exec.command))
            .finish_non_exhaustive()
    }
}

/// `users[].user.exec`.
#[derive(Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecConfig {
    /// The plugin.
    #[serde(default)]
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Extra environment.
    #[serde(default)]
    pub env: Option<Vec<EnvVar>>,
    /// The `ExecCredential` version.
    #[serde(default)]
    pub api_version: String,
    /// Shown when the plugin is missing.
    #[serde(default)]
    pub install_hint: Option<String>,
    /// Whether `spec.cluster` is sent.
    #[serde(default)]
    pub provide_cluster_info: bool,
    /// `Never`, `IfAvailable` or `Always`.
    #[serde(default)]
    pub interactive_mode: Option<String>,
}

/// An `env` entry.
#[derive(Clone, Default, Deserialize)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value.
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ContextFields {
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    user: String,
}

/// The merged kubeconfig: entries with the directory of the file each came from (relative paths
/// in an entry are relative to its file).
#[derive(Debug, Default)]
pub struct Kubeconfig {
    clusters: BTreeMap<String, (ClusterFields, PathBuf)>,
    users: BTreeMap<String, (UserFields, PathBuf)>,
    contexts: BTreeMap<String, ContextFields>,
    current_context: String,
}

/// The chosen context, resolved.
#[derive(Debug)]
pub struct Selected {
    /// The context's name.
    pub context: String,
    /// The cluster's name.
    pub cluster_name: String,
    /// The cluster.
    pub cluster: ClusterFields,
    /// The directory the cluster's file is in.
    pub cluster_dir: PathBuf,
    /// The user's name, as the context gives it.
    pub user_name: String,
    /// The user (empty if the context names none, or one the kubeconfig lacks: anonymous).
    pub user: UserFields,
    /// The directory the user's file is in.
    pub user_dir: PathBuf,
}

/// A credential to present.
#[derive(Debug)]
pub enum Credential {
    /// Nothing: anonymous.
    Anonymous,
    /// A bearer token (never shown).
    Token(Redacted),
    /// Basic auth (`Authorization` header value, never shown).
    Basic(Redacted),
    /// A client certificate.
    Certificate(ClientIdentity),
}

/// A secret string whose `Debug` shows nothing.
#[derive(Clone)]
pub struct Redacted(pub String);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Kubeconfig {
    /// Loads the kubeconfig as client-go does: `explicit` alone if given (it must exist);
    /// otherwise every file in `KUBECONFIG` (colon-separated; missing files skipped) merged, the
    /// first file to define a name or a current-context winning; otherwise `~/.kube/config`.
    pub fn load(explicit: Option<&Path>) -> Result<Self, KubeconfigError> {
        let mut config = Self::default();
        if let Some(path) = explicit {
            config.merge(path, read(path)?)?;
            return Ok(config);
        }
        let mut found = false;
        if let Some(list) = std::env::var_os("KUBECONFIG").filter(|list| !list.is_empty()) {
            for path in std::env::split_paths(&list).filter(|path| !path.as_os_str().is_empty()) {
                match std::fs::read(&path) {
                    Ok(bytes) => {
                        config.merge(&path, bytes)?;
                        found = true;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(KubeconfigError::Read { path, error }),
                }
            }
        } else if let Some(home) = std::env::var_os("HOME") {
            let path = Path::new(&home).join(".kube").join("config");
            if path.exists() {
                config.merge(&path, read(&path)?)?;
                found = true;
            }
        }
        if found {
            Ok(config)
        } else {
            Err(KubeconfigError::None)
        }
    }

    /// Parses one kubeconfig document (for tests and callers with the content in hand); `path`
    /// names it in errors and anchors its relative paths.
    pub fn from_yaml(path: &Path, yaml: &str) -> Result<Self, KubeconfigError> {
        let mut config = Self::default();
        config.merge(path, yaml.as_bytes().to_vec())?;
        Ok(config)
    }

    fn merge(&mut self, path: &Path, bytes: Vec<u8>) -> Result<(), KubeconfigError> {
        let file: File = if bytes.iter().all(u8::is_ascii_whitespace) {
            File::default()
        } else {
            serde_yaml::from_slice(&bytes).map_err(|e| KubeconfigError::Parse {
                path: path.to_path_buf(),
                reason: match e.location() {
                    Some(at) => format!("YAML error at line {} column {}", at.line(), at.column()),
                    None => "YAML error".into(),
                },
            })?
        };
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        for entry in file.clusters.unwrap_or_default() {
            self.clusters
                .entry(entry.name)
                .or_insert_with(|| (entry.value.unwrap_or_default(), dir.clone()));
        }
        for entry in file.users.unwrap_or_default() {
            self.users
                .entry(entry.name)
                .or_insert_with(|| (entry.value.unwrap_or_default(), dir.clone()));
        }
        for entry in file.contexts.unwrap_or_default() {
            self.contexts
                .entry(entry.name)
                .or_insert_with(|| entry.value.unwrap_or_default());
        }
        if self.current_context.is_empty() {
            self.current_context = file.current_context.unwrap_or_default();
        }
        Ok(())
    }

    /// The name and server URL of the cluster of `context` (or of the current context), if the
    /// kubeconfig has both; what `whoami` shows as the current cluster.
    pub fn cluster_of(&self, context: Option<&str>) -> Option<(String, String)> {
        let name = context.unwrap_or(&self.current_context);
        let cluster = &self.contexts.get(name)?.cluster;
        let (fields, _) = self.clusters.get(cluster)?;
        Some((cluster.clone(), fields.server.clone()))
    }

    /// Resolves `context` (or the current context) to its cluster and user.
    pub fn select(&self, context: Option<&str>) -> Result<Selected, KubeconfigError> {
        let name = match context {
            Some(name) => name,
            None if self.current_context.is_empty() => {
                return Err(KubeconfigError::Context(
                    "the kubeconfig has no current-context: pass --kubeconfig-context".into(),
                ))
            }
            None => &self.current_context,
        };
        let fields = self
            .contexts
            .get(name)
            .ok_or_else(|| KubeconfigError::Context(format!("context {name:?} is not in the kubeconfig")))?;
        let (cluster, cluster_dir) =
            self.clusters
                .get(&fields.cluster)
                .cloned()
                .ok_or_else(|| KubeconfigError::NoCluster {
                    context: name.to_string(),
                    cluster: fields.cluster.clone(),
                })?;
        let (user, user_dir) = self
            .users
            .get(&fields.user)
            .cloned()
            .unwrap_or_else(|| (UserFields::default(), cluster_dir.clone()));
        Ok(Selected {
            context: name.to_string(),
            cluster_name: fields.cluster.clone(),
            cluster,
            cluster_dir,
            user_name: fields.user.clone(),
            user,
            user_dir,
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KubeconfigError> {
    std::fs::read(path).map_err(|error| KubeconfigError::Read {
        path: path.to_path_buf(),
        error,
    })
}

fn resolve(dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    }
}

fn decode_base64(field: &str, value: &str) -> Result<Vec<u8>, KubeconfigError> {
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|e| KubeconfigError::Invalid(format!("{field} is not base64: {e}")))
}

impl Selected {
    /// The CA bundle of the cluster (its data, or its file), if it names one.
    pub fn ca_pem(&self) -> Result<Option<Vec<u8>>, KubeconfigError> {
        if let Some(data) = self
            .cluster
            .certificate_authority_data
            .as_deref()
            .filter(|d| !d.is_empty())
        {
            return decode_base64("certificate-authority-data", data).map(Some);
        }
        match self
            .cluster
            .certificate_authority
            .as_deref()
            .filter(|f| !f.is_empty())
        {
            Some(file) => read(&resolve(&self.cluster_dir, file)).map(Some),
            None => Ok(None),
        }
    }

    /// TLS settings for the cluster (the client certificate is added by the caller).
    pub fn tls_options(&self) -> Result<TlsOptions, KubeconfigError> {
        Ok(TlsOptions {
            ca_pem: self.ca_pem()?,
            insecure_skip_verify: self.cluster.insecure_skip_tls_verify,
            server_name: self
                .cluster
                .tls_server_name
                .clone()
                .filter(|name| !name.is_empty()),
            client_identity: None,
        })
    }

    /// The cluster as an exec plugin is told about it (`provideClusterInfo: true`), the way
    /// client-go fills `ExecCredential.spec.cluster`.
    pub fn exec_cluster(&self) -> Result<ExecCluster, KubeconfigError> {
        let ca = self
            .ca_pem()?
            .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem))
            .unwrap_or_default();
        let config = self
            .cluster
            .extensions
            .iter()
            .flatten()
            .find(|extension| extension.name == EXEC_EXTENSION)
            .and_then(|extension| serde_json::value::to_raw_value(&extension.extension).ok());
        Ok(ExecCluster {
            server: self.cluster.server.clone(),
            tls_server_name: self.cluster.tls_server_name.clone().unwrap_or_default(),
            insecure_skip_tls_verify: self.cluster.insecure_skip_tls_verify,
            certificate_authority_data: ca,
            proxy_url: self.cluster.proxy_url.clone().unwrap_or_default(),
            disable_compression: self.cluster.disable_compression,
            config,
        })
    }

    /// The user's credential, in client-go's order of preference: a client certificate and a
    /// token may both be present; otherwise basic auth; an exec plugin is run (its output
    /// replaces whatever it provides). No user: anonymous.
    pub async fn credential(&self) -> Result<Credential, KubeconfigError> {
        let user = &self.user;
        if user.auth_provider.is_some() {
            return Err(KubeconfigError::Credential(format!(
                "the user of context {:?} uses an auth-provider, which selkie does not support; use an exec plugin",
                self.context
            )));
        }
        if let Some(exec) = &user.exec {
            return self.run_exec_plugin(exec).await;
        }
        let cert = match (&user.client_certificate_data, &user.client_certificate) {
            (Some(data), _) if !data.is_empty() => Some(decode_base64("client-certificate-data", data)?),
            (_, Some(file)) if !file.is_empty() => Some(read(&resolve(&self.user_dir, file))?),
            _ => None,
        };
        let key = match (&user.client_key_data, &user.client_key) {
            (Some(data), _) if !data.is_empty() => Some(decode_base64("client-key-data", data)?),
            (_, Some(file)) if !file.is_empty() => Some(read(&resolve(&self.user_dir, file))?),
            _ => None,
        };
        match (cert, key) {
            (Some(cert_pem), Some(key_pem)) => {
                return Ok(Credential::Certificate(ClientIdentity { cert_pem, key_pem }))
            }
            (None, None) => {}
            _ => {
                return Err(KubeconfigError::Invalid(format!(
                    "the user of context {:?} has a client certificate without its key, or a key without its certificate",
                    self.context
                )))
            }
        }
        if let Some(token) = user.token.as_deref().filter(|token| !token.is_empty()) {
            return Ok(Credential::Token(Redacted(token.to_string())));
        }
        if let Some(file) = user.token_file.as_deref().filter(|file| !file.is_empty()) {
            let token = String::from_utf8_lossy(&read(&resolve(&self.user_dir, file))?)
                .trim()
                .to_string();
            return Ok(Credential::Token(Redacted(token)));
        }
        if let Some(username) = user.username.as_deref().filter(|name| !name.is_empty()) {
            let pair = format!("{username}:{}", user.password.as_deref().unwrap_or_default());
            return Ok(Credential::Basic(Redacted(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))));
        }
        Ok(Credential::Anonymous)
    }

    /// Runs the user's exec plugin as client-go does: `KUBERNETES_EXEC_INFO` set, the kubeconfig's
    /// `env` added, its stderr shown, stdin passed only when interactive; reads one
    /// `ExecCredential` of the configured version from its stdout.
    async fn run_exec_plugin(&self, exec: &ExecConfig) -> Result<Credential, KubeconfigError> {
        let version = ExecApiVersion::parse(&exec.api_version).ok_or_else(|| {
            KubeconfigError::Invalid(format!(
                "the exec plugin of context {:?} has apiVersion {:?}; use client.authentication.k8s.io/v1 or v1beta1",
                self.context, exec.api_version
            ))
        })?;
        // client-go resolves a command containing a path separator against the kubeconfig's
        // directory; a bare name is looked up on PATH.
        let command = if exec.command.contains('/') {
            resolve(&self.user_dir, &exec.command)
        } else {
            PathBuf::from(&exec.command)
        };
        let interactive = std::io::stdin().is_terminal() && exec.interactive_mode.as_deref() != Some("Never");
        let mut info = serde_json::json!({
            "kind": "ExecCredential",
            "apiVersion": version.as_str(),
            "spec": {"interactive": interactive},
        });
        if exec.provide_cluster_info {
            info["spec"]["cluster"] = serde_json::to_value(self.exec_cluster()?)
                .map_err(|e| KubeconfigError::Invalid(format!("encoding the exec cluster info: {e}")))?;
        }
        let mut process = tokio::process::Command::new(&command);
        process
            .args(exec.args.iter().flatten())
            .envs(exec.env.iter().flatten().map(|var| (&var.name, &var.value)))
            .env(EXEC_INFO_ENV, info.to_string())
            .stdin(if interactive {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let shown = command.display();
        // `output()` would capture stderr too; the plugin's messages are for the user.
        let output = process.spawn().map_err(|e| {
            let hint = match (&e.kind(), &exec.install_hint) {
                (std::io::ErrorKind::NotFound, Some(hint)) => {
                    format!(" ({})", hint.trim().replace('\n', " "))
                }
                _ => String::new(),
            };
            KubeconfigError::Credential(format!("could not run the exec plugin {shown}: {e}{hint}"))
        })?;
        let output = output
            .wait_with_output()
            .await
            .map_err(|e| KubeconfigError::Credential(format!("waiting for the exec plugin {shown}: {e}")))?;
        if !output.status.success() {
            return Err(KubeconfigError::Credential(format!(
                "the exec plugin {shown} failed ({}); its messages are above",
                output.status
            )));
        }
        let answer: ExecCredentialResponse = serde_json::from_slice(&output.stdout).map_err(|e| {
            KubeconfigError::Credential(format!(
                "the exec plugin {shown} printed something that is not an ExecCredential (JSON error at line {} column {})",
                e.line(),
                e.column()
            ))
        })?;
        if answer.api_version != version.as_str() || answer.kind != "ExecCredential" {
            return Err(KubeconfigError::Credential(format!(
                "the exec plugin {shown} answered a {:?} of apiVersion {:?}, not an ExecCredential of {}",
                answer.kind,
                answer.api_version,
                version.as_str()
            )));
        }
        let status: CredentialStatus = answer.status.unwrap_or_default();
        if !status.client_certificate_data.is_empty() && !status.client_key_data.is_empty() {
            Ok(Credential::Certificate(ClientIdentity {
                cert_pem: status.client_certificate_data.into_bytes(),
                key_pem: status.client_key_data.into_bytes(),
            }))
        } else if !status.token.is_empty() {
            Ok(Credential::Token(Redacted(status.token)))
        } else {
            Err(KubeconfigError::Credential(format!(
                "the exec plugin {shown} answered an ExecCredential without a token or a client certificate and key"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: one
  cluster:
    server: https://127.0.0.1:1234/prefix
    certificate-authority-data: Y2E=
    extensions:
    - name: client.authentication.k8s.io/exec
      extension: {audience: x}
- name: two
  cluster:
    server: https://two.example
    certificate-authority: ca/two.pem
users:
- name: tokened
  user:
    token: t0ken
contexts:
- name: first
  context: {cluster: one, user: tokened}
- name: second
  context: {cluster: two, user: nobody}
current-context: first
"#;

    #[test]
    fn selects_contexts_and_resolves_relative_paths() {
        let config = Kubeconfig::from_yaml(Path::new("/home/u/.kube/config"), CONFIG).unwrap();
        assert_eq!(
            config.cluster_of(None),
            Some(("one".into(), "https://127.0.0.1:1234/prefix".into()))
        );
        let first = config.select(None).unwrap();
        assert_eq!(first.ca_pem().unwrap().as_deref(), Some(&b"ca"[..]));
        let cluster = first.exec_cluster().unwrap();
        let mut json = String::new();
        assert!(cluster.write_go_json(&mut json));
        assert_eq!(
            json,
            r#"{"server":"https://127.0.0.1:1234/prefix","certificate-authority-data":"Y2E=","config":{"audience":"x"}}"#
        );
        let second = config.select(Some("second")).unwrap();
        assert_eq!(
            second
                .cluster
                .certificate_authority
                .as_deref()
                .map(|f| resolve(&second.cluster_dir, f)),
            Some(PathBuf::from("/home/u/.kube/ca/two.pem"))
        );
        assert!(second.user.exec.is_none() && second.user.token.is_none());
        let missing = config.select(Some("third")).unwrap_err().to_string();
        assert_eq!(missing, "context \"third\" is not in the kubeconfig");
        assert_eq!(config.cluster_of(Some("third")), None);
    }

    #[tokio::test]
    async fn a_token_user_presents_its_token_and_nobody_is_anonymous() {
        let config = Kubeconfig::from_yaml(Path::new("/k/config"), CONFIG).unwrap();
        let credential = config.select(None).unwrap().credential().await.unwrap();
        assert!(matches!(&credential, Credential::Token(Redacted(t)) if t == "t0ken"));
        assert!(!format!("{credential:?}").contains("t0ken"));
        let credential = config.select(Some("second")).unwrap().credential().await.unwrap();
        assert!(matches!(credential, Credential::Anonymous));
    }
}
