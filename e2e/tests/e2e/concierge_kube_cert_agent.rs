//! The kube cert agent (`selkie_control_plane::kube_cert_agent`), the third source of the
//! cluster's signing key, against a real kube-apiserver.
//!
//! The harness has no kubelet, scheduler or controller manager, so the tests play the cluster:
//! they create the `kube-controller-manager` Pod a kubeadm cluster would have in `kube-system`
//! (labels, flags, volumes, tolerations, nodeName) and patch its status to `Running`, and play
//! the Deployment controller by creating the agent pod the Deployment would get. The exec into
//! that pod through kube-apiserver then fails as it does without a kubelet, and that failure is
//! what is reported. The success path runs for real on the node
//! (`node_concierge::node_concierge_installed_with_helm_…`: the agent pod beside the
//! kube-controller-manager static pod, exec through the kubelet); here a stand-in kubelet
//! ([`LocalKubelet`], through `KubeCertAgent::with_executor`) runs the real agent binary locally
//! with the pod's environment as kube-apiserver has it, for what the node cannot stage without
//! breaking its controller manager: one exec per agent pod, a garbage key, a missing file. Each test writes `kube-system`, so each has a private cluster.
//!
//! The agent binary itself (`selkie-kube-cert-agent`) is run for real with files the test writes.
//!
//! Two replicas (two `signing::run` loops, each with its own login API, one the leader) show how a
//! replica that does not hold the key yet behaves: TokenCredentialRequests wait for the key while
//! the agent pod is starting, and are answered at once where the agent cannot work.

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::future::BoxFuture;

use anyhow::{ensure, Context};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Node, Pod},
};
use kube::{
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
    Client,
};
use selkie_api::{
    concierge_config::{CredentialIssuerStrategy, StrategyReason, StrategyStatus, StrategyType},
    login::{TokenCredentialRequest, TokenCredentialRequestSpec, TypedLocalObjectReference},
};
use selkie_control_plane::{
    config::ControlPlaneConfig,
    kube_cert_agent::{
        AgentError, AgentOutput, KubeCertAgent, PodExecutor, AGENT_LABEL_KEY, AGENT_LABEL_VALUE,
    },
    published::Publisher,
    signing,
};
use selkie_e2e::{pki::CertAndKey, Cluster};
use selkie_filters::{
    chain::{Chain, TokenAuthenticator},
    identity::CertificateIdentity,
    issuing::login_api::{ConciergeApi as _, SignerConciergeApi, PREFERRED_SIGNER_WAIT},
    tokenreview::{ClientAuth, TokenReviewAuthenticator, TokenReviewConfig},
};
use selkie_kube::certs;
use serde_json::{json, Value};
use tokio::{sync::watch, task::JoinHandle};
use x509_cert::der::DecodePem as _;

use crate::eventually;

const WAIT: Duration = Duration::from_secs(30);
const IMAGE: &str = "registry.example/selkie/concierge:e2e";
const NO_CONTROLLER_MANAGER: &str = "could not find a healthy kube-controller-manager pod (0 candidates): note that this error is the expected behavior for some cluster types, including most cloud provider clusters (e.g. GKE, AKS, EKS)";

/// The control-plane configuration `selkie-concierge --control-plane FILE` would read, with the
/// agent as the signing key source.
fn config(namespace: &str, extra_agent_fields: &str) -> anyhow::Result<ControlPlaneConfig> {
    let yaml = format!(
        "namespace: {namespace}\nnamePrefix: {namespace}\nidentity: e2e\nlabels: {{app: concierge, team: auth}}\nclusterSigningKey:\n  agent: {{image: '{IMAGE}'{extra_agent_fields}}}\n"
    );
    let config: ControlPlaneConfig = serde_yaml::from_str(&yaml).context("parsing the configuration")?;
    config.validate()?;
    Ok(config)
}

/// A kubeadm-like kube-controller-manager pod on `node`, created in `kube-system`.
async fn create_controller_manager(
    client: &Client,
    name: &str,
    node: &str,
    flags: &[&str],
) -> anyhow::Result<Pod> {
    let mut command = vec!["kube-controller-manager", "--leader-elect=true", "--v", "2"];
    command.extend_from_slice(flags);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "labels": {"component": "kube-controller-manager", "tier": "control-plane"},
        },
        "spec": {
            "nodeName": node,
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "hostNetwork": true,
            "tolerations": [{"effect": "NoExecute", "operator": "Exists"}],
            "containers": [{
                "name": "kube-controller-manager",
                "image": "registry.k8s.io/kube-controller-manager:v1.35.4",
                "command": command,
                "volumeMounts": [
                    {"name": "k8s-certs", "mountPath": "/etc/kubernetes/pki", "readOnly": true},
                    {"name": "kubeconfig", "mountPath": "/etc/kubernetes/controller-manager.conf", "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "k8s-certs", "hostPath": {"path": "/etc/kubernetes/pki", "type": "DirectoryOrCreate"}},
                {"name": "kubeconfig", "hostPath": {"path": "/etc/kubernetes/controller-manager.conf", "type": "FileOrCreate"}},
            ],
        },
    }))?;
    Ok(Api::<Pod>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &pod)
        .await?)
}

/// Does what the kubelet would: reports the pod Running.
async fn mark_running(client: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await?;
    Ok(())
}

/// Does what the Deployment controller would: creates a pod from the agent Deployment's
/// template, and reports it Running.
async fn create_agent_pod(client: &Client, deployment: &Deployment, name: &str) -> anyhow::Result<Pod> {
    let namespace = deployment.metadata.namespace.as_deref().context("no namespace")?;
    let template = deployment.spec.as_ref().context("no spec")?.template.clone();
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: template.metadata.and_then(|meta| meta.labels),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    };
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &pod).await?;
    mark_running(client, namespace, name).await?;
    Ok(pods.get(name).await?)
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A Node whose kubelet would listen on `127.0.0.1:port`.
async fn create_node(client: &Client, name: &str, port: u16) -> anyhow::Result<()> {
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            }})),
        )
        .await?;
    Ok(())
}

/// One replica's `signing::run` in the background: its own login API (`publisher`), and every
/// strategy it records.
struct Running {
    publisher: Publisher,
    strategies: watch::Receiver<Option<CredentialIssuerStrategy>>,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `signing::run` as the leader, execs through kube-apiserver.
fn run_signing(client: &Client, config: ControlPlaneConfig) -> Running {
    run_replica(client, Arc::new(config), true, None)
}

/// `signing::run` as the leader or not (for ever), with `executor` standing in for the kubelet
/// if given.
fn run_replica(
    client: &Client,
    config: Arc<ControlPlaneConfig>,
    is_leader: bool,
    executor: Option<Arc<dyn PodExecutor>>,
) -> Running {
    let (sender, strategies) = watch::channel(None);
    let sender = Arc::new(sender);
    let (leader_sender, leader) = watch::channel(is_leader);
    let client = client.clone();
    let publisher = Publisher::new();
    let task = tokio::spawn({
        let publisher = publisher.clone();
        async move {
            // Kept alive so the leadership never changes.
            let _leader = leader_sender;
            let record = move |strategy: CredentialIssuerStrategy| {
                let sender = sender.clone();
                async move {
                    sender.send_replace(Some(strategy));
                    Ok(())
                }
            };
            match executor {
                Some(executor) => {
                    signing::run_with_executor(client, config, publisher, leader, executor, record).await
                }
                None => signing::run(client, config, publisher, leader, record).await,
            }
        }
    });
    Running {
        publisher,
        strategies,
        task,
    }
}

impl Running {
    /// The replica's login API.
    fn login_api(&self) -> Arc<SignerConciergeApi> {
        self.publisher.login_api().clone()
    }

    /// How many signing rounds the replica has finished.
    fn rounds(&self) -> u64 {
        self.publisher.login_api().refresh().finished_rounds()
    }

    /// Waits until the replica has a signer and the cluster key is pending (`true`) or not.
    async fn expect_pending(&self, pending: bool) -> anyhow::Result<()> {
        eventually(WAIT, || async {
            let login_api = self.publisher.login_api();
            ensure!(login_api.signer().is_some(), "no signer installed yet");
            ensure!(
                login_api.refresh().is_pending() == pending,
                "the cluster key is not {}pending",
                if pending { "" } else { "un" }
            );
            Ok(())
        })
        .await
    }

    /// Waits until the recorded strategy is `CouldNotFetchKey` with exactly `message`.
    async fn expect_failure(&self, message: &str) -> anyhow::Result<()> {
        eventually(WAIT, || async {
            let strategy = self
                .strategies
                .borrow()
                .clone()
                .context("no strategy recorded yet")?;
            ensure!(
                strategy.r#type == StrategyType::KubeClusterSigningCertificate
                    && strategy.status == StrategyStatus::Error
                    && strategy.reason == StrategyReason::CouldNotFetchKey
                    && strategy.frontend.is_none()
                    && strategy.message == message,
                "the strategy is {strategy:?}, not CouldNotFetchKey with {message:?}"
            );
            Ok(())
        })
        .await
    }
}

#[tokio::test]
async fn the_agent_follows_the_controller_manager_and_reports_each_failure() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "kca").await?;
    let config = config(&namespace, ", priorityClassName: system-cluster-critical")?;
    let running = run_signing(&client, config);
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let deployment_name = format!("{namespace}-kube-cert-agent");

    // No controller manager (a managed cloud): Pinniped's message, and no Deployment.
    running.expect_failure(NO_CONTROLLER_MANAGER).await?;
    ensure!(deployments.get_opt(&deployment_name).await?.is_none());

    // A controller manager that is not Running yet is a candidate, not a choice.
    create_controller_manager(
        &client,
        "kube-controller-manager-cp-1",
        "cp-1",
        &[
            "--cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt",
            "--cluster-signing-key-file",
            "/etc/kubernetes/pki/ca.key",
        ],
    )
    .await?;
    running
        .expect_failure("could not find a healthy kube-controller-manager pod (1 candidate)")
        .await?;
    ensure!(deployments.get_opt(&deployment_name).await?.is_none());

    // Running: the leader creates the agent Deployment on its node, from its flags.
    mark_running(&client, "kube-system", "kube-controller-manager-cp-1").await?;
    running
        .expect_failure("could not find a healthy agent pod (0 candidates)")
        .await?;
    let deployment = deployments.get(&deployment_name).await?;
    let value = serde_json::to_value(&deployment)?;
    assert_eq!(
        value["metadata"]["labels"],
        json!({"app": "concierge", "team": "auth"})
    );
    let spec = &value["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["minReadySeconds"], 10);
    assert_eq!(
        spec["selector"],
        json!({"matchLabels": {AGENT_LABEL_KEY: AGENT_LABEL_VALUE}})
    );
    assert_eq!(
        spec["template"]["metadata"]["labels"],
        json!({AGENT_LABEL_KEY: AGENT_LABEL_VALUE, "team": "auth"}),
        "the agent pods never carry the Concierge's app label"
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["nodeName"], "cp-1");
    assert_eq!(
        pod["nodeSelector"],
        json!({"node-role.kubernetes.io/control-plane": ""})
    );
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        pod["tolerations"],
        json!([{"effect": "NoExecute", "operator": "Exists"}])
    );
    assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/etc/kubernetes/pki");
    assert_eq!(pod["volumes"][1]["name"], "kubeconfig");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["terminationGracePeriodSeconds"], 0);
    assert_eq!(pod["securityContext"], json!({"runAsUser": 0, "runAsGroup": 0}));
    let containers = pod["containers"].as_array().context("containers")?;
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    assert_eq!(container["name"], "sleeper");
    assert_eq!(container["image"], IMAGE);
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    assert_eq!(container["command"], json!(["selkie-kube-cert-agent", "sleep"]));
    assert_eq!(
        container["env"],
        json!([
            {"name": "CERT_PATH", "value": "/etc/kubernetes/pki/ca.crt"},
            {"name": "KEY_PATH", "value": "/etc/kubernetes/pki/ca.key"},
        ])
    );
    assert_eq!(
        container["resources"],
        json!({"limits": {"cpu": "20m", "memory": "32Mi"}, "requests": {"cpu": "0", "memory": "32Mi"}})
    );
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/kubernetes/pki");

    // The agent pod runs (as far as the apiserver knows), but there is no kubelet to exec in.
    let agent_pod = create_agent_pod(&client, &deployment, "agent-1").await?;
    ensure!(agent_pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("cp-1"));
    // kube-apiserver cannot find the pod's Node (its own wording).
    running
        .expect_failure(&format!(
            "could not exec into agent pod {namespace}/agent-1: pods \"cp-1\" not found"
        ))
        .await?;
    // The Node exists, but nothing listens on its kubelet port: kube-apiserver tried the exec
    // of `print` in the agent container there.
    let kubelet_port = closed_port()?;
    create_node(&client, "cp-1", kubelet_port).await?;
    running
        .expect_failure(&format!(
            "could not exec into agent pod {namespace}/agent-1: Internal error occurred: error sending request: \
             Post \"https://127.0.0.1:{kubelet_port}/exec/{namespace}/agent-1/sleeper?command=selkie-kube-cert-agent&command=print&output=1\": \
             dial tcp 127.0.0.1:{kubelet_port}: connect: connection refused"
        ))
        .await?;

    // The controller manager goes away: reported, and the Deployment is left alone.
    Api::<Pod>::namespaced(client.clone(), "kube-system")
        .delete(
            "kube-controller-manager-cp-1",
            &DeleteParams::default().grace_period(0),
        )
        .await?;
    running.expect_failure(NO_CONTROLLER_MANAGER).await?;
    ensure!(deployments.get_opt(&deployment_name).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn the_deployment_follows_the_newest_controller_manager_and_followers_never_write() -> anyhow::Result<()>
{
    let cluster = Cluster::start().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "kca").await?;
    let config = Arc::new(config(&namespace, "")?);
    let agent_config = config
        .cluster_signing_key
        .as_ref()
        .and_then(|source| source.agent.clone())
        .context("no agent configured")?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let deployment_name = format!("{namespace}-kube-cert-agent");

    // A controller manager without signing flags: Pinniped's default paths.
    create_controller_manager(&client, "kcm-old", "cp-old", &[]).await?;
    mark_running(&client, "kube-system", "kcm-old").await?;

    // A follower reads, never writes: no Deployment, so no agent pod.
    let mut follower = KubeCertAgent::new(client.clone(), config.clone(), agent_config.clone());
    let error = follower.fetch(false).await.expect_err("no agent pod exists");
    ensure!(
        matches!(error, AgentError::NoHealthyAgentPod { candidates: 0 }),
        "{error}"
    );
    ensure!(deployments.get_opt(&deployment_name).await?.is_none());

    // A Deployment left by an older version with another (immutable) selector is replaced.
    let stale: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": deployment_name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"kube-cert-agent.pinniped.dev": "v2", "app": "concierge"}},
            "template": {
                "metadata": {"labels": {"kube-cert-agent.pinniped.dev": "v2", "app": "concierge"}},
                "spec": {"containers": [{"name": "sleeper", "image": "old"}]},
            },
        },
    }))?;
    let stale = deployments.create(&PostParams::default(), &stale).await?;

    let mut leader = KubeCertAgent::new(client.clone(), config.clone(), agent_config.clone());
    let error = leader.fetch(true).await.expect_err("no agent pod exists");
    ensure!(
        error.to_string() == "could not find a healthy agent pod (0 candidates)",
        "{error}"
    );
    let deployment = deployments.get(&deployment_name).await?;
    ensure!(
        deployment.metadata.uid != stale.metadata.uid,
        "the stale Deployment was not recreated"
    );
    let value = serde_json::to_value(&deployment)?;
    let pod = &value["spec"]["template"]["spec"];
    assert_eq!(pod["nodeName"], "cp-old");
    assert_eq!(
        pod["containers"][0]["env"],
        json!([
            {"name": "CERT_PATH", "value": "/etc/kubernetes/ca/ca.pem"},
            {"name": "KEY_PATH", "value": "/etc/kubernetes/ca/ca.key"},
        ])
    );
    assert!(pod.get("priorityClassName").is_none());

    // An unchanged round does not write the Deployment again.
    let version = deployment.metadata.resource_version.clone();
    leader.fetch(true).await.expect_err("still no agent pod");
    ensure!(deployments.get(&deployment_name).await?.metadata.resource_version == version);

    // A newer controller manager (with the kube-apiserver-client flags) on another node: the
    // Deployment moves there, in place.
    tokio::time::sleep(Duration::from_millis(1100)).await; // a later creationTimestamp
    create_controller_manager(
        &client,
        "kcm-new",
        "cp-new",
        &[
            "--cluster-signing-kube-apiserver-client-cert-file=/pki/client-ca.crt",
            "--cluster-signing-kube-apiserver-client-key-file=/pki/client-ca.key",
        ],
    )
    .await?;
    mark_running(&client, "kube-system", "kcm-new").await?;
    leader.fetch(true).await.expect_err("still no agent pod");
    let moved = deployments.get(&deployment_name).await?;
    ensure!(
        moved.metadata.uid == deployment.metadata.uid,
        "the Deployment was recreated"
    );
    let value = serde_json::to_value(&moved)?;
    let pod = &value["spec"]["template"]["spec"];
    assert_eq!(pod["nodeName"], "cp-new");
    assert_eq!(
        pod["containers"][0]["env"],
        json!([
            {"name": "CERT_PATH", "value": "/pki/client-ca.crt"},
            {"name": "KEY_PATH", "value": "/pki/client-ca.key"},
        ])
    );
    Ok(())
}

/// Stands in for the kubelet: runs the agent's command (the real `selkie-kube-cert-agent`) on
/// this machine with the `CERT_PATH`/`KEY_PATH` of the pod kube-apiserver has, and counts the
/// execs.
struct LocalKubelet {
    client: Client,
    binary: PathBuf,
    execs: AtomicUsize,
}

impl PodExecutor for LocalKubelet {
    fn exec<'a>(
        &'a self,
        namespace: &'a str,
        pod: &'a str,
        container: &'a str,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            self.execs.fetch_add(1, Ordering::SeqCst);
            let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
                .get(pod)
                .await
                .map_err(|e| e.to_string())?;
            let spec = pod.spec.ok_or("no spec")?;
            let container = spec
                .containers
                .into_iter()
                .find(|c| c.name == container)
                .ok_or_else(|| format!("no container {container}"))?;
            let [program, args @ ..] = command else {
                return Err("no command".into());
            };
            if program != "selkie-kube-cert-agent" {
                return Err(format!("{program}: not found"));
            }
            let mut run = tokio::process::Command::new(&self.binary);
            run.args(args).env_clear();
            for var in container.env.into_iter().flatten() {
                run.env(var.name, var.value.unwrap_or_default());
            }
            let output = run.output().await.map_err(|e| e.to_string())?;
            if !output.status.success() {
                return Err(format!("command terminated with {}", output.status));
            }
            String::from_utf8(output.stdout).map_err(|e| e.to_string())
        })
    }
}

#[tokio::test]
async fn the_key_is_read_through_the_agent_pod_once_per_pod() -> anyhow::Result<()> {
    let binary = selkie_e2e::workspace_binary("selkie-concierge", "selkie-kube-cert-agent")?;
    let cluster = Cluster::start().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "kca").await?;
    let config = Arc::new(config(&namespace, "")?);
    let agent_config = config
        .cluster_signing_key
        .as_ref()
        .and_then(|source| source.agent.clone())
        .context("no agent configured")?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);

    // The controller manager's signing files, on "its node" (this machine).
    let dir = tempfile::tempdir()?;
    let pair = certs::generate_ca("e2e cluster signer", Duration::from_secs(3600))?;
    let cert_path = dir.path().join("ca.crt");
    let key_path = dir.path().join("ca.key");
    std::fs::write(&cert_path, &pair.cert_pem)?;
    std::fs::write(&key_path, &pair.key_pem)?;
    let cert_flag = format!("--cluster-signing-cert-file={}", cert_path.display());
    let key_flag = format!("--cluster-signing-key-file={}", key_path.display());
    create_controller_manager(&client, "kcm", "cp-1", &[&cert_flag, &key_flag]).await?;
    mark_running(&client, "kube-system", "kcm").await?;

    let kubelet = Arc::new(LocalKubelet {
        client: client.clone(),
        binary,
        execs: AtomicUsize::new(0),
    });
    let mut agent =
        KubeCertAgent::new(client.clone(), config.clone(), agent_config).with_executor(kubelet.clone());
    let error = agent.fetch(true).await.expect_err("no agent pod yet");
    ensure!(
        matches!(error, AgentError::NoHealthyAgentPod { candidates: 0 }),
        "{error}"
    );
    let deployment = deployments.get(&format!("{namespace}-kube-cert-agent")).await?;

    // The agent pod runs: its `print` gives the controller manager's files.
    create_agent_pod(&client, &deployment, "agent-1").await?;
    assert_eq!(agent.fetch(true).await?, pair);
    assert_eq!(kubelet.execs.load(Ordering::SeqCst), 1);
    // The same pod again: from the cache, no exec.
    assert_eq!(agent.fetch(true).await?, pair);
    assert_eq!(agent.fetch(false).await?, pair);
    assert_eq!(kubelet.execs.load(Ordering::SeqCst), 1);

    // A new agent pod (new UID) is exec'd into again; its files now hold no usable key.
    pods.delete("agent-1", &DeleteParams::default().grace_period(0))
        .await?;
    std::fs::write(&key_path, "not a key")?;
    create_agent_pod(&client, &deployment, "agent-2").await?;
    let error = agent.fetch(true).await.expect_err("the key file is garbage");
    assert_eq!(kubelet.execs.load(Ordering::SeqCst), 2);
    let message = error.to_string();
    ensure!(
        message.starts_with(&format!(
            "failed to set signing cert/key content from agent pod {namespace}/agent-2: "
        )),
        "{message}"
    );
    ensure!(
        !message.contains("not a key"),
        "the message shows the key file: {message}"
    );

    // A failure is not cached: once the file is fixed, the next round reads it.
    std::fs::write(&key_path, &pair.key_pem)?;
    assert_eq!(agent.fetch(true).await?, pair);
    assert_eq!(kubelet.execs.load(Ordering::SeqCst), 3);

    // The agent command fails in the pod (the file is gone): the exec error is reported.
    pods.delete("agent-2", &DeleteParams::default().grace_period(0))
        .await?;
    std::fs::remove_file(&cert_path)?;
    create_agent_pod(&client, &deployment, "agent-3").await?;
    let error = agent.fetch(true).await.expect_err("the cert file is gone");
    assert_eq!(
        error.to_string(),
        format!("could not exec into agent pod {namespace}/agent-3: command terminated with exit status: 1")
    );
    Ok(())
}

#[tokio::test]
async fn the_agent_binary_prints_the_files_and_fails_in_one_line() -> anyhow::Result<()> {
    let binary = selkie_e2e::workspace_binary("selkie-concierge", "selkie-kube-cert-agent")?;
    let dir = tempfile::tempdir()?;
    let pair = certs::generate_ca("e2e cluster signer", Duration::from_secs(3600))?;
    let cert_path = dir.path().join("ca.crt");
    let key_path = dir.path().join("ca.key");
    std::fs::write(&cert_path, &pair.cert_pem)?;
    std::fs::write(&key_path, &pair.key_pem)?;

    let output = tokio::process::Command::new(&binary)
        .arg("print")
        .env("CERT_PATH", &cert_path)
        .env("KEY_PATH", &key_path)
        .output()
        .await?;
    ensure!(output.status.success(), "print failed: {output:?}");
    let stdout = String::from_utf8(output.stdout)?;
    let json: Value = serde_json::from_str(&stdout)?;
    let keys: Vec<&String> = json.as_object().context("not an object")?.keys().collect();
    assert_eq!(keys, ["tls.crt", "tls.key"]);
    assert_eq!(AgentOutput::decode(&stdout, "test/agent")?, pair);

    // A missing file: one line on stderr naming the variable and the path, nothing on stdout.
    let missing = dir.path().join("missing.key");
    let output = tokio::process::Command::new(&binary)
        .arg("print")
        .env("CERT_PATH", &cert_path)
        .env("KEY_PATH", &missing)
        .output()
        .await?;
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr)?;
    assert_eq!(
        stderr,
        format!(
            "selkie-kube-cert-agent: could not read KEY_PATH: {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );

    // No variable, no subcommand, an unknown subcommand.
    for (args, env, expected) in [
        (
            vec!["print"],
            None,
            "could not read CERT_PATH: the variable is not set",
        ),
        (vec![], None, "missing subcommand (sleep or print)"),
        (vec!["cat"], None, "invalid subcommand \"cat\" (sleep or print)"),
        (
            vec!["print"],
            Some(&key_path),
            "could not read KEY_PATH: the variable is not set",
        ),
    ] {
        let mut command = tokio::process::Command::new(&binary);
        command.args(&args).env_remove("CERT_PATH").env_remove("KEY_PATH");
        if let Some(cert) = env {
            command.env("CERT_PATH", cert);
        }
        let output = command.output().await?;
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert_eq!(
            String::from_utf8(output.stderr)?,
            format!("selkie-kube-cert-agent: {expected}\n"),
            "{args:?}"
        );
    }

    // `sleep` lasts until SIGTERM, then exits 0.
    let mut sleeper = tokio::process::Command::new(&binary)
        .arg("sleep")
        .stdout(Stdio::null())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(sleeper.try_wait()?.is_none(), "sleep ended by itself");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(sleeper.id().context("no pid")?)?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
    let status = tokio::time::timeout(Duration::from_secs(10), sleeper.wait()).await??;
    ensure!(status.success(), "sleep exited with {status}");
    Ok(())
}

/// The authenticators' API group of the default suffix.
const AUTHENTICATION_GROUP: &str = "authentication.concierge.pinniped.dev";

/// A login as the service account `robot` of `namespace`: kube-apiserver's TokenReview as a
/// WebhookAuthenticator (Selkie's `UsernameAndGroups`, so the service account's identity, which
/// has a UID, gets a certificate), and a TokenCredentialRequest with a real token.
async fn service_account_login(
    cluster: &Cluster,
    namespace: &str,
) -> anyhow::Result<(Chain, TokenCredentialRequest)> {
    let kubectl = cluster.kubectl();
    kubectl
        .run(&["create", "serviceaccount", "robot", "-n", namespace])
        .await?;
    let token = kubectl
        .run(&["create", "token", "robot", "-n", namespace, "--duration=10m"])
        .await?
        .trim()
        .to_string();
    let mut config = TokenReviewConfig::new(
        "kube-apiserver",
        format!(
            "{}/apis/authentication.k8s.io/v1/tokenreviews",
            cluster.server_url()
        ),
    );
    config.ca_bundle_pem = Some(cluster.pki().server_ca.cert_pem());
    config.client_auth = ClientAuth::Certificate {
        cert_pem: cluster.pki().admin.cert_pem.clone(),
        key_pem: cluster.pki().admin.key_pem.clone(),
    };
    config.certificate_identity = CertificateIdentity::UsernameAndGroups;
    let chain = Chain::new(vec![TokenAuthenticator::TokenReview(Arc::new(
        TokenReviewAuthenticator::new(config)?,
    ))]);
    let request = TokenCredentialRequest {
        api_version: "login.concierge.pinniped.dev/v1alpha1".into(),
        kind: "TokenCredentialRequest".into(),
        spec: TokenCredentialRequestSpec {
            token,
            authenticator: TypedLocalObjectReference {
                api_group: Some(AUTHENTICATION_GROUP.into()),
                kind: "WebhookAuthenticator".into(),
                name: "kube-apiserver".into(),
            },
        },
        ..TokenCredentialRequest::default()
    };
    Ok((chain, request))
}

/// Sends `request` to a replica's login API, as kube-apiserver relays a TokenCredentialRequest to
/// one of the Concierge pods; returns the answer and how long it took.
async fn exchange(
    login_api: Arc<SignerConciergeApi>,
    chain: Chain,
    request: TokenCredentialRequest,
) -> (TokenCredentialRequest, Duration) {
    let started = tokio::time::Instant::now();
    let answer = login_api
        .token_credential_request(&chain, AUTHENTICATION_GROUP, request)
        .await;
    (answer, started.elapsed())
}

/// The issuer of the certificate in `answer`.
fn issuer(answer: &TokenCredentialRequest) -> anyhow::Result<String> {
    let credential = answer
        .status
        .credential
        .as_ref()
        .with_context(|| format!("no credential: {:?}", answer.status.message))?;
    let certificate = x509_cert::Certificate::from_pem(credential.client_certificate_data.as_bytes())?;
    Ok(certificate.tbs_certificate.issuer.to_string())
}

/// The subject of a PEM certificate.
fn subject(pem: &str) -> anyhow::Result<String> {
    Ok(x509_cert::Certificate::from_pem(pem.as_bytes())?
        .tbs_certificate
        .subject
        .to_string())
}

/// `kubectl auth whoami` straight against kube-apiserver with the certificate in `answer`.
async fn whoami(
    cluster: &Cluster,
    answer: &TokenCredentialRequest,
) -> anyhow::Result<selkie_e2e::kubectl::KubectlOutput> {
    let credential = answer.status.credential.as_ref().context("no credential")?;
    let kubeconfig = cluster.kubeconfig_with(&CertAndKey {
        cert_pem: credential.client_certificate_data.clone(),
        key_pem: credential.client_key_data.clone(),
    })?;
    Ok(cluster
        .kubectl()
        .with_kubeconfig(&kubeconfig)
        .output(
            &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
            None,
        )
        .await?)
}

#[tokio::test]
async fn where_the_agent_cannot_work_a_replica_reads_at_the_normal_pace_and_answers_at_once(
) -> anyhow::Result<()> {
    // No kube-controller-manager pod (a managed cloud); nothing here writes kube-system.
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "kca").await?;
    let (chain, request) = service_account_login(cluster, &namespace).await?;
    let replica = run_replica(&client, Arc::new(config(&namespace, "")?), true, None);
    replica.expect_failure(NO_CONTROLLER_MANAGER).await?;
    // A lasting failure: the key is not pending, the signer CA is installed.
    replica.expect_pending(false).await?;

    // A TokenCredentialRequest asks for no round and waits for nothing: the signer CA's
    // certificate at once.
    let rounds = replica.rounds();
    let (answer, took) = exchange(replica.login_api(), chain, request).await;
    assert_eq!(issuer(&answer)?, format!("CN={}", signing::SIGNER_CA_NAME));
    ensure!(took < PREFERRED_SIGNER_WAIT / 2, "answered in {took:?}");
    // The rounds go on every RESYNC (5 s), not every RETRY: at most one more in 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let more = replica.rounds() - rounds;
    ensure!(more <= 1, "{more} rounds in 3 s");
    Ok(())
}

#[tokio::test]
async fn two_replicas_issue_from_the_cluster_key_as_soon_as_the_agent_pod_runs() -> anyhow::Result<()> {
    let binary = selkie_e2e::workspace_binary("selkie-concierge", "selkie-kube-cert-agent")?;
    let cluster = Cluster::start().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "kca").await?;
    let config = Arc::new(config(&namespace, "")?);
    let (chain, request) = service_account_login(&cluster, &namespace).await?;
    let robot = format!("system:serviceaccount:{namespace}:robot");

    // The controller manager's signing files are the cluster's client CA: certificates signed
    // with it are users of kube-apiserver.
    let dir = tempfile::tempdir()?;
    let (cert_path, key_path) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    std::fs::write(&cert_path, cluster.pki().client_ca.cert_pem())?;
    std::fs::write(&key_path, cluster.pki().client_ca.key_pem())?;
    let cluster_ca = subject(&cluster.pki().client_ca.cert_pem())?;
    let cert_flag = format!("--cluster-signing-cert-file={}", cert_path.display());
    let key_flag = format!("--cluster-signing-key-file={}", key_path.display());
    create_controller_manager(&client, "kcm", "cp-1", &[&cert_flag, &key_flag]).await?;
    mark_running(&client, "kube-system", "kcm").await?;

    let kubelet = Arc::new(LocalKubelet {
        client: client.clone(),
        binary,
        execs: AtomicUsize::new(0),
    });
    let leader = run_replica(&client, config.clone(), true, Some(kubelet.clone()));
    let follower = run_replica(&client, config.clone(), false, Some(kubelet.clone()));

    // The leader creates the Deployment; no agent pod runs yet. Both replicas issue with the
    // signer CA meanwhile, and wait for the key: they read every RETRY (0.5 s), not every
    // RESYNC (5 s).
    leader
        .expect_failure("could not find a healthy agent pod (0 candidates)")
        .await?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &namespace)
        .get(&format!("{namespace}-kube-cert-agent"))
        .await?;
    leader.expect_pending(true).await?;
    follower.expect_pending(true).await?;
    let rounds = follower.rounds();

    // While no agent pod comes, a request waits for the bound, then gets the signer CA's
    // certificate, which kube-apiserver refuses.
    let (answer, took) = exchange(follower.login_api(), chain.clone(), request.clone()).await;
    assert_eq!(issuer(&answer)?, format!("CN={}", signing::SIGNER_CA_NAME));
    ensure!(
        took >= PREFERRED_SIGNER_WAIT && took < PREFERRED_SIGNER_WAIT + Duration::from_secs(2),
        "answered in {took:?}"
    );
    let refused = whoami(&cluster, &answer).await?;
    ensure!(
        !refused.success && refused.stderr.contains("Unauthorized"),
        "{refused:?}"
    );
    let more = follower.rounds() - rounds;
    ensure!(more >= 3, "only {more} rounds in {took:?}");

    // Requests that reach either replica before the agent pod runs wait for it: each is issued
    // by the cluster's key, and kube-apiserver accepts the certificate.
    let waiting: Vec<_> = [&follower, &leader]
        .iter()
        .map(|replica| tokio::spawn(exchange(replica.login_api(), chain.clone(), request.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        waiting.iter().all(|request| !request.is_finished()),
        "a request did not wait"
    );
    create_agent_pod(&client, &deployment, "agent-1").await?;
    for request in waiting {
        let (answer, took) = request.await?;
        assert_eq!(issuer(&answer)?, cluster_ca);
        ensure!(took < PREFERRED_SIGNER_WAIT, "answered in {took:?}");
        let accepted = whoami(&cluster, &answer).await?;
        ensure!(accepted.success, "{accepted:?}");
        assert_eq!(accepted.stdout, robot);
    }
    // One exec per replica.
    assert_eq!(kubelet.execs.load(Ordering::SeqCst), 2);

    // With the key held, nothing waits.
    follower.expect_pending(false).await?;
    let (answer, took) = exchange(follower.login_api(), chain, request).await;
    assert_eq!(issuer(&answer)?, cluster_ca);
    ensure!(took < PREFERRED_SIGNER_WAIT / 2, "answered in {took:?}");
    Ok(())
}

#[test]
fn the_configuration_names_exactly_one_source() {
    let both: Result<ControlPlaneConfig, _> = serde_yaml::from_str(
        "clusterSigningKey: {agent: {image: i}, secret: {namespace: kube-system, name: ca}}",
    );
    let error = both.map(|c| c.validate().map_err(|e| e.to_string()));
    assert_eq!(
        error.ok().and_then(|result| result.err()).as_deref(),
        Some("clusterSigningKey: needs exactly one of secret, files and agent")
    );
}
