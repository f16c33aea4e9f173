//! The kube cert agent: the third source of the cluster's signing key (the
//! `KubeClusterSigningCertificate` strategy), as Pinniped's `kubecertagent` controller does it.
//!
//! On clusters whose kube-controller-manager runs as a pod (kubeadm, kind, …) the cluster's
//! client-signing key sits in files on that pod's node. Each round ([`KubeCertAgent::fetch`]):
//!
//! 1. the newest `Running` pod labelled `component=kube-controller-manager` in `kube-system` is
//!    picked (preferring one on a schedulable Node when there are several);
//! 2. the **leader** creates or updates the Deployment `<namePrefix>-kube-cert-agent` in the
//!    Concierge's namespace ([`agent_deployment`]): one root pod on the same node (`nodeName`,
//!    `nodeSelector`, `tolerations`, `volumes` and the first container's `volumeMounts`,
//!    `hostNetwork`), running `selkie-kube-cert-agent sleep` from the configured image, with
//!    `CERT_PATH`/`KEY_PATH` taken from the controller manager's flags ([`signing_paths`]) and
//!    Pinniped's resources (32Mi memory, 20m CPU limit, CPU request 0);
//! 3. every replica execs `selkie-kube-cert-agent print` in the newest running agent pod (label
//!    `kube-cert-agent.pinniped.dev=v3`), decodes its JSON ([`AgentOutput`]) and checks that the
//!    pair can sign ([`KubeExec`], over kube-rs' WebSocket exec; Pinniped uses SPDY). A success
//!    is remembered for 15 minutes per agent pod (by UID), so the exec is not repeated on every
//!    round; a failure is retried on the next round.
//!
//! Every failure is an [`AgentError`] whose message is Pinniped's, and becomes the strategy's
//! `CouldNotFetchKey` message in [`crate::signing`]. The key and certificate are never logged.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD, Engine as _};
use futures::future::BoxFuture;
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            Container, EnvVar, LocalObjectReference, Node, Pod, PodSecurityContext, PodSpec, PodTemplateSpec,
            ResourceRequirements,
        },
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector},
};
use kube::{
    api::{AttachParams, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, Preconditions},
    Api, Client,
};
use selkie_filters::issuing::signer::ClientCertificateSigner;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt as _;

pub use crate::config::DEFAULT_AGENT_BINARY;
use selkie_kube::certs::CertPair;

use crate::config::{AgentConfig, ControlPlaneConfig};

/// The namespace of the kube-controller-manager pods.
pub const CONTROLLER_MANAGER_NAMESPACE: &str = "kube-system";
/// The label selector of the kube-controller-manager pods.
pub const CONTROLLER_MANAGER_SELECTOR: &str = "component=kube-controller-manager";
/// The label that marks the agent's pods (Pinniped's, so its selector stays compatible).
pub const AGENT_LABEL_KEY: &str = "kube-cert-agent.pinniped.dev";
/// The value of [`AGENT_LABEL_KEY`]; changed whenever the agent pods change incompatibly.
pub const AGENT_LABEL_VALUE: &str = "v3";
/// The agent pod's container.
pub const AGENT_CONTAINER_NAME: &str = "sleeper";
/// How long a successful exec into one agent pod is trusted before it is repeated.
pub const EXEC_CACHE_TTL: Duration = Duration::from_secs(15 * 60);
/// How long one exec may take.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// The flags naming the signing certificate, in order of preference.
pub const CERT_FLAGS: [&str; 2] = [
    "cluster-signing-cert-file",
    "cluster-signing-kube-apiserver-client-cert-file",
];
/// The flags naming the signing key, in order of preference.
pub const KEY_FLAGS: [&str; 2] = [
    "cluster-signing-key-file",
    "cluster-signing-kube-apiserver-client-key-file",
];
/// The certificate path when the controller manager has none of [`CERT_FLAGS`].
pub const DEFAULT_CERT_PATH: &str = "/etc/kubernetes/ca/ca.pem";
/// The key path when the controller manager has none of [`KEY_FLAGS`].
pub const DEFAULT_KEY_PATH: &str = "/etc/kubernetes/ca/ca.key";
/// The Concierge's own label that is never copied onto the agent pods (it would match the
/// Concierge Deployment's selector).
const CONCIERGE_APP_LABEL: &str = "app";
const FIELD_MANAGER: &str = "selkie-kube-cert-agent";

/// Why the key could not be fetched through the agent. The messages are Pinniped's; none
/// carries key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// Listing the controller manager pods failed.
    #[error("could not list controller manager pods: {0}")]
    ListControllerManagers(String),
    /// Choosing among several controller manager pods (listing Nodes) failed.
    #[error("error while looking for controller manager pod: {0}")]
    ChooseControllerManager(String),
    /// No controller manager pod is Running.
    #[error("{}", no_controller_manager_message(*.candidates))]
    NoHealthyControllerManager {
        /// How many pods matched the selector.
        candidates: usize,
    },
    /// The leader could not create or update the agent Deployment.
    #[error("could not ensure agent deployment: {0}")]
    Deployment(String),
    /// Listing the agent pods failed.
    #[error("could not list agent pods: {0}")]
    ListAgentPods(String),
    /// No agent pod is Running.
    #[error("could not find a healthy agent pod ({})", pluralize(*.candidates))]
    NoHealthyAgentPod {
        /// How many pods had the agent label.
        candidates: usize,
    },
    /// The exec into the agent pod failed.
    #[error("could not exec into agent pod {pod}: {error}")]
    Exec {
        /// `namespace/name`.
        pod: String,
        /// What failed.
        error: String,
    },
    /// The agent's output is not the expected JSON.
    #[error("failed to decode signing cert/key JSON from agent pod {pod}: {error}")]
    DecodeJson {
        /// `namespace/name`.
        pod: String,
        /// What serde said.
        error: String,
    },
    /// `tls.crt` is not base64.
    #[error("failed to decode signing cert base64 from agent pod {pod}: {error}")]
    DecodeCert {
        /// `namespace/name`.
        pod: String,
        /// What the decoder said.
        error: String,
    },
    /// `tls.key` is not base64.
    #[error("failed to decode signing key base64 from agent pod {pod}: {error}")]
    DecodeKey {
        /// `namespace/name`.
        pod: String,
        /// What the decoder said.
        error: String,
    },
    /// The certificate and key cannot sign.
    #[error("failed to set signing cert/key content from agent pod {pod}: {error}")]
    SetKey {
        /// `namespace/name`.
        pod: String,
        /// Why the pair is unusable.
        error: String,
    },
}

impl AgentError {
    /// Whether this failure is expected to clear by itself within seconds, with nothing changed
    /// in the cluster: no agent pod is Running *yet* (the Deployment was just created, or its
    /// pod is being scheduled, pulling its image or restarting). [`crate::signing`] then
    /// re-reads the key at [`crate::signing::RETRY`] and lets TokenCredentialRequests wait for
    /// it. Every other failure is lasting, needs a change to the cluster, and is re-read at the
    /// normal pace: no healthy kube-controller-manager (a managed cloud), a request
    /// kube-apiserver refuses (RBAC), a Deployment the leader cannot write (reported in
    /// preference to whatever else failed), an exec that fails, a key that does not decode or
    /// cannot sign.
    pub fn is_not_yet(&self) -> bool {
        matches!(self, Self::NoHealthyAgentPod { .. })
    }
}

fn pluralize(candidates: usize) -> String {
    if candidates == 1 {
        "1 candidate".into()
    } else {
        format!("{candidates} candidates")
    }
}

fn no_controller_manager_message(candidates: usize) -> String {
    let message = format!(
        "could not find a healthy kube-controller-manager pod ({})",
        pluralize(candidates)
    );
    if candidates == 0 {
        format!(
            "{message}: note that this error is the expected behavior for some cluster types, including most cloud provider clusters (e.g. GKE, AKS, EKS)"
        )
    } else {
        message
    }
}

/// kube-apiserver's message for an API error (what Go clients print), the client's description
/// of anything else.
fn kube_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// What `selkie-kube-cert-agent print` writes on stdout: one JSON object with the certificate and
/// key files base64-encoded under Pinniped's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentOutput {
    /// The certificate file, base64 (standard alphabet, padded).
    #[serde(rename = "tls.crt")]
    pub cert: String,
    /// The key file, base64.
    #[serde(rename = "tls.key")]
    pub key: String,
}

impl AgentOutput {
    /// The output for the given file contents.
    pub fn new(cert: &[u8], key: &[u8]) -> Self {
        Self {
            cert: STANDARD.encode(cert),
            key: STANDARD.encode(key),
        }
    }

    /// The JSON line the agent prints (with a final newline, as Pinniped's agent).
    pub fn to_json_line(&self) -> String {
        // Two plain strings always serialize.
        format!("{}\n", serde_json::to_string(self).unwrap_or_default())
    }

    /// Decodes the agent's output from pod `pod` (`namespace/name`, for the messages) into a
    /// certificate and key that can sign.
    pub fn decode(stdout: &str, pod: &str) -> Result<CertPair, AgentError> {
        let output: Self = serde_json::from_str(stdout).map_err(|e| AgentError::DecodeJson {
            pod: pod.into(),
            error: e.to_string(),
        })?;
        let cert = STANDARD
            .decode(output.cert.as_bytes())
            .map_err(|e| AgentError::DecodeCert {
                pod: pod.into(),
                error: e.to_string(),
            })?;
        let key = STANDARD
            .decode(output.key.as_bytes())
            .map_err(|e| AgentError::DecodeKey {
                pod: pod.into(),
                error: e.to_string(),
            })?;
        let set_key = |error: String| AgentError::SetKey {
            pod: pod.into(),
            error,
        };
        let pair = CertPair {
            cert_pem: String::from_utf8(cert)
                .map_err(|_| set_key("the certificate is not PEM text".into()))?,
            key_pem: String::from_utf8(key).map_err(|_| set_key("the key is not PEM text".into()))?,
        };
        ClientCertificateSigner::from_pem(&pair.cert_pem, &pair.key_pem)
            .map_err(|e| set_key(e.to_string()))?;
        Ok(pair)
    }
}

/// The value of the first of `names` set (non-empty) in `args`, parsed as pflag parses a command
/// line with unknown flags allowed: `--name=value` or `--name value`, the last occurrence wins,
/// parsing stops at `--` or at a known flag with no value.
pub fn flag_value(args: &[String], names: &[&str]) -> Option<String> {
    let mut found: BTreeMap<&str, String> = BTreeMap::new();
    let mut index = 0;
    while index < args.len() {
        let arg = args[index].as_str();
        index += 1;
        if arg == "--" {
            break;
        }
        let body = if let Some(long) = arg.strip_prefix("--") {
            long
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            // An (unknown) shorthand: its value is the next argument unless it has `=`.
            if !short.contains('=') && args.get(index).is_some_and(|next| !next.starts_with('-')) {
                index += 1;
            }
            continue;
        } else {
            continue; // a positional argument (the command itself)
        };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        match names.iter().find(|known| **known == name) {
            Some(known) => {
                let value = match inline {
                    Some(value) => value.to_string(),
                    None => match args.get(index) {
                        Some(next) => {
                            index += 1;
                            next.clone()
                        }
                        None => break, // "flag needs an argument": pflag stops
                    },
                };
                found.insert(known, value);
            }
            None => {
                if inline.is_none() && args.get(index).is_some_and(|next| !next.starts_with('-')) {
                    index += 1;
                }
            }
        }
    }
    names
        .iter()
        .find_map(|name| found.get(name).filter(|value| !value.is_empty()).cloned())
}

/// `CERT_PATH` and `KEY_PATH` for the agent: the first container of `pod` whose command and args
/// set one of [`CERT_FLAGS`] (resp. [`KEY_FLAGS`]), else [`DEFAULT_CERT_PATH`] /
/// [`DEFAULT_KEY_PATH`].
pub fn signing_paths(pod: &Pod) -> (String, String) {
    let containers = pod
        .spec
        .as_ref()
        .map(|spec| spec.containers.as_slice())
        .unwrap_or_default();
    let lookup = |names: &[&str], default: &str| {
        containers
            .iter()
            .find_map(|container| {
                let args: Vec<String> = container
                    .command
                    .iter()
                    .flatten()
                    .chain(container.args.iter().flatten())
                    .cloned()
                    .collect();
                flag_value(&args, names)
            })
            .unwrap_or_else(|| default.to_string())
    };
    (
        lookup(&CERT_FLAGS, DEFAULT_CERT_PATH),
        lookup(&KEY_FLAGS, DEFAULT_KEY_PATH),
    )
}

/// The labels of the agent pods: [`AGENT_LABEL_KEY`] plus the Concierge's labels except `app`.
pub fn agent_pod_labels(config: &ControlPlaneConfig) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = config
        .labels
        .iter()
        .filter(|(key, _)| key.as_str() != CONCIERGE_APP_LABEL)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    labels.insert(AGENT_LABEL_KEY.into(), AGENT_LABEL_VALUE.into());
    labels
}

fn agent_selector() -> BTreeMap<String, String> {
    BTreeMap::from([(AGENT_LABEL_KEY.to_string(), AGENT_LABEL_VALUE.to_string())])
}

/// The name of the agent Deployment: `<namePrefix>-kube-cert-agent`.
pub fn deployment_name(config: &ControlPlaneConfig) -> String {
    config.name("kube-cert-agent")
}

/// The agent Deployment for the controller manager pod `controller_manager`, as Pinniped builds
/// it (see the module documentation).
pub fn agent_deployment(
    config: &ControlPlaneConfig,
    agent: &AgentConfig,
    controller_manager: &Pod,
) -> Deployment {
    let template = controller_manager.spec.clone().unwrap_or_default();
    let (cert_path, key_path) = signing_paths(controller_manager);
    let quantity = |text: &str| Quantity(text.to_string());
    let env = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    let container = Container {
        name: AGENT_CONTAINER_NAME.into(),
        image: Some(agent.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![agent.binary.clone(), "sleep".into()]),
        volume_mounts: template.containers.first().and_then(|c| c.volume_mounts.clone()),
        env: Some(vec![env("CERT_PATH", cert_path), env("KEY_PATH", key_path)]),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("memory".to_string(), quantity("32Mi")),
                ("cpu".to_string(), quantity("20m")),
            ])),
            requests: Some(BTreeMap::from([
                ("memory".to_string(), quantity("32Mi")),
                // Explicitly zero, not unset (Pinniped's issue 1507).
                ("cpu".to_string(), quantity("0")),
            ])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    let image_pull_secrets = (!agent.image_pull_secrets.is_empty()).then(|| {
        agent
            .image_pull_secrets
            .iter()
            .map(|name| LocalObjectReference { name: name.clone() })
            .collect()
    });
    Deployment {
        metadata: ObjectMeta {
            name: Some(deployment_name(config)),
            namespace: Some(config.namespace.clone()),
            labels: Some(config.labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(agent_selector()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(agent_pod_labels(config)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    termination_grace_period_seconds: Some(0),
                    image_pull_secrets,
                    containers: vec![container],
                    volumes: template.volumes,
                    restart_policy: Some("Always".into()),
                    node_selector: template.node_selector,
                    automount_service_account_token: Some(false),
                    service_account_name: agent.service_account_name.clone(),
                    node_name: template.node_name,
                    tolerations: template.tolerations,
                    // The signing key's files are usually readable by root only.
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(0),
                        run_as_group: Some(0),
                        ..PodSecurityContext::default()
                    }),
                    host_network: template.host_network,
                    priority_class_name: agent.priority_class_name.clone(),
                    ..PodSpec::default()
                }),
            },
            // Keeps the agent pods from being churned too quickly.
            min_ready_seconds: Some(10),
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running")
}

/// The Running pods of `pods`, newest first (ties broken by name).
pub fn running_newest_first(pods: &[Pod]) -> Vec<&Pod> {
    let mut running: Vec<&Pod> = pods.iter().filter(|pod| is_running(pod)).collect();
    running.sort_by(|a, b| {
        let created = |pod: &Pod| pod.metadata.creation_timestamp.as_ref().map(|time| time.0);
        created(b)
            .cmp(&created(a))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    running
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A successful exec: which pod, when, and what it gave.
#[derive(Debug, Clone)]
struct Fetched {
    uid: String,
    at: Instant,
    pair: CertPair,
}

/// The agent controller of one replica: fetches the cluster's signing key through the agent pod
/// and remembers the last success per pod for [`EXEC_CACHE_TTL`].
#[derive(Clone)]
pub struct KubeCertAgent {
    client: Client,
    config: Arc<ControlPlaneConfig>,
    agent: AgentConfig,
    executor: Arc<dyn PodExecutor>,
    fetched: Option<Fetched>,
}

impl std::fmt::Debug for KubeCertAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCertAgent")
            .field("agent", &self.agent)
            .field("cached", &self.fetched.as_ref().map(|fetched| &fetched.uid))
            .finish_non_exhaustive()
    }
}

impl KubeCertAgent {
    /// An agent controller for this installation; nothing is read or written until
    /// [`fetch`](Self::fetch).
    pub fn new(client: Client, config: Arc<ControlPlaneConfig>, agent: AgentConfig) -> Self {
        Self {
            executor: Arc::new(KubeExec::new(client.clone())),
            client,
            config,
            agent,
            fetched: None,
        }
    }

    /// The same controller with another way to run `print` in the agent pod (for clusters
    /// without kubelets, such as tests'); everything else still goes to kube-apiserver.
    pub fn with_executor(mut self, executor: Arc<dyn PodExecutor>) -> Self {
        self.executor = executor;
        self
    }

    /// One round (see the module documentation): finds the controller manager, ensures the
    /// agent Deployment when `leader`, and returns the signing certificate and key from the
    /// newest running agent pod (from the cache when that pod gave them less than
    /// [`EXEC_CACHE_TTL`] ago). As in Pinniped, a Deployment the leader could not write is the
    /// error reported, whether or not a later step failed too (a compatible Deployment written
    /// by another replica may still have given the key).
    ///
    /// Needs: `list` pods in `kube-system` and in the Concierge's namespace, `list` nodes,
    /// `get`/`patch`/`delete`/`create` deployments in the Concierge's namespace (leader), and
    /// `get` on `pods/exec` there (the exec is a WebSocket upgrade, a GET; Pinniped's SPDY exec
    /// needs `create`).
    pub async fn fetch(&mut self, leader: bool) -> Result<CertPair, AgentError> {
        let controller_manager = self.newest_controller_manager().await?;
        let deployment_error = if leader {
            self.ensure_deployment(&controller_manager)
                .await
                .err()
                .map(AgentError::Deployment)
        } else {
            None
        };
        let first = |error: AgentError| match &deployment_error {
            Some(AgentError::Deployment(message)) => AgentError::Deployment(message.clone()),
            _ => error,
        };
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.config.namespace)
            .list(&ListParams::default().labels(&format!("{AGENT_LABEL_KEY}={AGENT_LABEL_VALUE}")))
            .await
            .map_err(|e| first(AgentError::ListAgentPods(kube_message(&e))))?
            .items;
        let Some(agent_pod) = running_newest_first(&pods).first().copied() else {
            return Err(first(AgentError::NoHealthyAgentPod {
                candidates: pods.len(),
            }));
        };
        let pair = self.load(agent_pod).await.map_err(first)?;
        match deployment_error {
            Some(error) => Err(error),
            None => Ok(pair),
        }
    }

    /// The newest Running controller manager pod, preferring one on a schedulable Node.
    async fn newest_controller_manager(&self) -> Result<Pod, AgentError> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), CONTROLLER_MANAGER_NAMESPACE)
            .list(&ListParams::default().labels(CONTROLLER_MANAGER_SELECTOR))
            .await
            .map_err(|e| AgentError::ListControllerManagers(kube_message(&e)))?
            .items;
        let running = running_newest_first(&pods);
        let newest = match running.as_slice() {
            [] => {
                return Err(AgentError::NoHealthyControllerManager {
                    candidates: pods.len(),
                })
            }
            [only] => *only,
            [newest, ..] => {
                let nodes = Api::<Node>::all(self.client.clone())
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| AgentError::ChooseControllerManager(kube_message(&e)))?
                    .items;
                let schedulable = |pod: &&&Pod| {
                    let node_name = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref());
                    nodes.iter().any(|node| {
                        node.metadata
                            .name
                            .as_deref()
                            .is_some_and(|name| Some(name) == node_name)
                            && !node
                                .spec
                                .as_ref()
                                .and_then(|spec| spec.unschedulable)
                                .unwrap_or(false)
                    })
                };
                running.iter().find(schedulable).copied().unwrap_or(newest)
            }
        };
        Ok(newest.clone())
    }

    /// Creates or updates the agent Deployment (server-side apply, so an unchanged Deployment is
    /// not written). A Deployment with another selector (immutable) is deleted and recreated.
    async fn ensure_deployment(&self, controller_manager: &Pod) -> Result<(), String> {
        let desired = agent_deployment(&self.config, &self.agent, controller_manager);
        let name = deployment_name(&self.config);
        let deployments = Api::<Deployment>::namespaced(self.client.clone(), &self.config.namespace);
        let existing = deployments.get_opt(&name).await.map_err(|e| kube_message(&e))?;
        if let Some(existing) = existing {
            let selector = existing.spec.as_ref().map(|spec| &spec.selector);
            if selector != desired.spec.as_ref().map(|spec| &spec.selector) {
                tracing::info!(deployment = %name, "deleting the agent Deployment to change its immutable selector");
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: existing.metadata.uid.clone(),
                        resource_version: existing.metadata.resource_version.clone(),
                    }),
                    ..DeleteParams::default()
                };
                deployments
                    .delete(&name, &params)
                    .await
                    .map_err(|e| kube_message(&e))?;
            }
        }
        deployments
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await
            .map_err(|e| kube_message(&e))?;
        Ok(())
    }

    /// The key from `pod`: cached, or by exec.
    async fn load(&mut self, pod: &Pod) -> Result<CertPair, AgentError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(fetched) = &self.fetched {
            if fetched.uid == uid && fetched.at.elapsed() < EXEC_CACHE_TTL {
                return Ok(fetched.pair.clone());
            }
        }
        let key = pod_key(pod);
        let command = [self.agent.binary.clone(), "print".to_string()];
        let stdout = self
            .executor
            .exec(
                &self.config.namespace,
                pod.metadata.name.as_deref().unwrap_or_default(),
                AGENT_CONTAINER_NAME,
                &command,
            )
            .await
            .map_err(|error| AgentError::Exec {
                pod: key.clone(),
                error,
            })?;
        let pair = AgentOutput::decode(&stdout, &key)?;
        tracing::info!(pod = %key, "loaded the cluster signing key from the agent pod");
        self.fetched = Some(Fetched {
            uid,
            at: Instant::now(),
            pair: pair.clone(),
        });
        Ok(pair)
    }
}

/// Runs a command in a pod's container and returns its stdout: the step of
/// [`KubeCertAgent::fetch`] that needs a kubelet. [`KubeExec`] is the real one; tests of
/// clusters without kubelets may stand in for it ([`KubeCertAgent::with_executor`]).
pub trait PodExecutor: Send + Sync {
    /// Runs `command` in `container` of `namespace/pod`; the error is the message reported after
    /// "could not exec into agent pod …: ".
    fn exec<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        container: &'a str,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<String, String>>;
}

/// `pods/exec` through kube-apiserver (WebSocket), bounded by [`EXEC_TIMEOUT`]; a command that
/// fails is an error with the status kube-apiserver relays.
#[derive(Clone)]
pub struct KubeExec {
    client: Client,
}

impl KubeExec {
    /// An executor using `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

impl std::fmt::Debug for KubeExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeExec").finish_non_exhaustive()
    }
}

impl PodExecutor for KubeExec {
    fn exec<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        container: &'a str,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let pods = Api::<Pod>::namespaced(self.client.clone(), namespace);
            let params = AttachParams::default()
                .container(container)
                .stdin(false)
                .stdout(true)
                .stderr(false);
            let run = async {
                let mut process = pods
                    .exec(pod, command.to_vec(), &params)
                    .await
                    .map_err(|e| kube_message(&e))?;
                let status = process.take_status();
                let mut stdout = String::new();
                if let Some(mut reader) = process.stdout() {
                    reader
                        .read_to_string(&mut stdout)
                        .await
                        .map_err(|e| format!("reading the output: {e}"))?;
                }
                if let Some(status) = status {
                    if let Some(status) = status.await {
                        if status.status.as_deref() == Some("Failure") {
                            return Err(status.message.unwrap_or_else(|| "the command failed".to_string()));
                        }
                    }
                }
                process.join().await.map_err(|e| e.to_string())?;
                Ok(stdout)
            };
            tokio::time::timeout(EXEC_TIMEOUT, run)
                .await
                .map_err(|_| format!("timed out after {EXEC_TIMEOUT:?}"))?
        })
    }
}

#[cfg(test)]
mod tests;
