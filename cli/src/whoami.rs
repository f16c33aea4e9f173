//! `selkie whoami`: a WhoAmIRequest to the kubeconfig's current cluster with the kubeconfig's
//! own credential, printed as the pinniped CLI prints it.

use std::{path::PathBuf, time::Duration};

use selkie_api::identity::{WhoAmIRequest, WhoAmIRequestStatus};
use serde::Serialize;

use crate::{
    concierge::{status_message, validate_group_suffix},
    http::{HttpsClient, TlsOptions},
    kubeconfig::{Credential, Kubeconfig},
};

/// How to print the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// The pinniped CLI's human-readable summary.
    Text,
    /// The WhoAmIRequest as indented JSON.
    Json,
    /// The WhoAmIRequest as YAML.
    Yaml,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            "yaml" => Ok(Self::Yaml),
            other => Err(format!(
                "unknown output format: {other:?} (use text, yaml or json)"
            )),
        }
    }
}

/// The command's options.
#[derive(Debug, Clone)]
pub struct WhoamiOptions {
    /// `-o`.
    pub output: OutputFormat,
    /// `--kubeconfig`; `None` follows `KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `--kubeconfig-context`; `None` is the current context.
    pub context: Option<String>,
    /// `--timeout` for the API request (not for the credential plugin); `None` waits
    /// indefinitely.
    pub timeout: Option<Duration>,
    /// `--api-group-suffix`.
    pub api_group_suffix: String,
}

/// Runs `whoami` and returns what to print on stdout. Errors are one line each.
pub async fn run(options: &WhoamiOptions) -> anyhow::Result<String> {
    validate_group_suffix("--api-group-suffix", &options.api_group_suffix)?;
    let kubeconfig = Kubeconfig::load(options.kubeconfig.as_deref())
        .map_err(|e| anyhow::anyhow!("could not load the kubeconfig: {e}"))?;
    let selected = kubeconfig
        .select(options.context.as_deref())
        .map_err(|e| anyhow::anyhow!("could not configure the Kubernetes client: {e}"))?;
    let mut tls: TlsOptions = selected
        .tls_options()
        .map_err(|e| anyhow::anyhow!("could not configure the Kubernetes client: {e}"))?;
    let credential = selected.credential().await.map_err(|e| {
        anyhow::anyhow!(
            "could not get a credential for context {:?}: {e}",
            selected.context
        )
    })?;
    let authorization = match credential {
        Credential::Anonymous => None,
        Credential::Certificate(identity) => {
            tls.client_identity = Some(identity);
            None
        }
        Credential::Token(token) => Some(
            http::HeaderValue::from_str(&format!("Bearer {}", token.0)).map_err(|_| {
                anyhow::anyhow!(
                    "the token for context {:?} is not a valid header value",
                    selected.context
                )
            })?,
        ),
        Credential::Basic(basic) => Some(http::HeaderValue::from_str(&basic.0).map_err(|_| {
            anyhow::anyhow!("the basic auth for context {:?} is not valid", selected.context)
        })?),
    };
    let client = HttpsClient::new(&selected.cluster.server, &tls, authorization)
        .map_err(|e| anyhow::anyhow!("could not configure the Kubernetes client: {e}"))?;

    let suffix = &options.api_group_suffix;
    let api_version = format!("identity.concierge.{suffix}/v1alpha1");
    let request = WhoAmIRequest {
        api_version: api_version.clone(),
        kind: "WhoAmIRequest".into(),
        metadata: creation_timestamp_null(),
        ..WhoAmIRequest::default()
    };
    let path = format!("/apis/identity.concierge.{suffix}/v1alpha1/whoamirequests");
    let response = client
        .post_json(&path, serde_json::to_vec(&request)?, options.timeout)
        .await
        .map_err(|e| anyhow::anyhow!("could not complete WhoAmIRequest: {e}"))?;
    if !response.status.is_success() {
        let hint = if response.status == http::StatusCode::NOT_FOUND {
            " (is the Pinniped WhoAmI API running and healthy?)"
        } else {
            ""
        };
        let detail = status_message(&response.body)
            .map(|message| format!(": {message}"))
            .unwrap_or_default();
        anyhow::bail!(
            "could not complete WhoAmIRequest{hint}: {} answered HTTP {}{detail}",
            client.url(&path),
            response.status
        );
    }
    let mut answer: WhoAmIRequest = serde_json::from_slice(&response.body).map_err(|e| {
        anyhow::anyhow!(
            "could not complete WhoAmIRequest: the answer is not a WhoAmIRequest (JSON error at line {} column {})",
            e.line(),
            e.column()
        )
    })?;
    answer.api_version = api_version;
    answer.kind = "WhoAmIRequest".into();
    if !answer.metadata.contains_key("creationTimestamp") {
        answer
            .metadata
            .insert("creationTimestamp".into(), serde_json::Value::Null);
    }
    let (cluster_name, cluster_url) = kubeconfig
        .cluster_of(options.context.as_deref())
        .unwrap_or_else(|| ("???".into(), "???".into()));
    render(options.output, &cluster_name, &cluster_url, &answer)
}

fn creation_timestamp_null() -> serde_json::Map<String, serde_json::Value> {
    serde_json::Map::from_iter([("creationTimestamp".to_string(), serde_json::Value::Null)])
}

/// The WhoAmIRequest in the field order Kubernetes' serializer writes (`kind` first).
#[derive(Serialize)]
struct Ordered<'a> {
    kind: &'a str,
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    metadata: &'a serde_json::Map<String, serde_json::Value>,
    spec: &'a serde_json::Map<String, serde_json::Value>,
    status: &'a WhoAmIRequestStatus,
}

/// Formats `answer` as the pinniped CLI does: the text summary (ending in a newline), indented
/// JSON (no trailing newline), or YAML with sorted keys.
pub fn render(
    format: OutputFormat,
    cluster_name: &str,
    cluster_url: &str,
    answer: &WhoAmIRequest,
) -> anyhow::Result<String> {
    let ordered = Ordered {
        kind: &answer.kind,
        api_version: &answer.api_version,
        metadata: &answer.metadata,
        spec: &answer.spec,
        status: &answer.status,
    };
    Ok(match format {
        OutputFormat::Text => {
            let user = &answer.status.kubernetes_user_info.user;
            format!(
                "Current cluster info:\n\nName: {cluster_name}\nURL: {cluster_url}\n\nCurrent user info:\n\n\
                 Username: {}\nGroups: {}\n",
                user.username,
                user.groups.join(", ")
            )
        }
        OutputFormat::Json => serde_json::to_string_pretty(&ordered)?,
        // Through a JSON value, whose maps are sorted, as Kubernetes' YAML serializer sorts keys.
        OutputFormat::Yaml => serde_yaml::to_string(&serde_json::to_value(&ordered)?)?,
    })
}

/// Parses a Go duration (`time.ParseDuration`): `0`, or a sequence of decimal numbers each with a
/// unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), optionally signed. A negative duration is
/// returned as zero.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let parsed = selkie_api::duration::parse(text).map_err(|error| error.to_string())?;
    Ok(if parsed.negative {
        Duration::ZERO
    } else {
        parsed.magnitude
    })
}

#[cfg(test)]
mod tests {
    use selkie_api::identity::{KubernetesUserInfo, UserInfo};

    use super::*;

    fn answer(groups: &[&str]) -> WhoAmIRequest {
        WhoAmIRequest {
            api_version: "identity.concierge.pinniped.dev/v1alpha1".into(),
            kind: "WhoAmIRequest".into(),
            metadata: creation_timestamp_null(),
            spec: serde_json::Map::new(),
            status: WhoAmIRequestStatus {
                kubernetes_user_info: KubernetesUserInfo {
                    user: UserInfo {
                        username: "some-username".into(),
                        groups: groups.iter().map(|g| g.to_string()).collect(),
                        ..UserInfo::default()
                    },
                },
            },
        }
    }

    // The expected texts are the pinniped CLI's own (cmd/pinniped/cmd/whoami_test.go).
    #[test]
    fn prints_like_the_pinniped_cli() {
        let both = answer(&["some-group-0", "some-group-1"]);
        assert_eq!(
            render(
                OutputFormat::Text,
                "kind-cluster",
                "https://fake-server-url-value",
                &both
            )
            .unwrap(),
            "Current cluster info:\n\nName: kind-cluster\nURL: https://fake-server-url-value\n\n\
             Current user info:\n\nUsername: some-username\nGroups: some-group-0, some-group-1\n"
        );
        assert!(render(OutputFormat::Text, "c", "u", &answer(&[]))
            .unwrap()
            .ends_with("Groups: \n"));
        assert_eq!(
            render(OutputFormat::Json, "c", "u", &both).unwrap(),
            r#"{
  "kind": "WhoAmIRequest",
  "apiVersion": "identity.concierge.pinniped.dev/v1alpha1",
  "metadata": {
    "creationTimestamp": null
  },
  "spec": {},
  "status": {
    "kubernetesUserInfo": {
      "user": {
        "username": "some-username",
        "groups": [
          "some-group-0",
          "some-group-1"
        ]
      }
    }
  }
}"#
        );
        assert_eq!(
            render(OutputFormat::Yaml, "c", "u", &both).unwrap(),
            "apiVersion: identity.concierge.pinniped.dev/v1alpha1\nkind: WhoAmIRequest\nmetadata:\n  creationTimestamp: null\n\
             spec: {}\nstatus:\n  kubernetesUserInfo:\n    user:\n      groups:\n      - some-group-0\n      - some-group-1\n\
             \x20     username: some-username\n"
        );
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("-5s"), Ok(Duration::ZERO));
        for bad in ["", "5", "s", "5x", "1m30"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }
}
