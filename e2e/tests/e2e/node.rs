//! Selkie as its users run it: pods on a real node ([`selkie_e2e::node`]: containerd, runc, the
//! CNI bridge, the kubelet, kube-proxy, CoreDNS, kube-scheduler and kube-controller-manager as a
//! kubeadm-shaped static pod), its images built here from the `Containerfile`
//! ([`selkie_e2e::images`]), installed with `helm install` from `conf/helm/selkie`.
//!
//! The tests share the machine's one node (`Cluster::shared_node`). Each helm release owns its
//! namespaces, and one test drives one release from install to uninstall.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use selkie_e2e::{
    eventually,
    helm::{chart_dir, Helm},
    images::{selkie_images, SelkieImages},
    Cluster,
};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::helm_chart::{identities, objects_of_release};

/// The node cluster with Selkie's images imported into its containerd.
pub(crate) struct NodeEnv {
    pub(crate) cluster: &'static Cluster,
    pub(crate) images: &'static SelkieImages,
    pub(crate) host_ip: IpAddr,
}

/// The shared node, its images imported once per test binary.
/// Held by each test that installs a Helm release on the shared node, so that one release at a
/// time is installed, upgraded, has its pods killed and is removed (each test's story is then
/// about its release alone). It was taken for kube-apiserver's APIService 404s from
/// `https://<Service IP>:443`, which it did not prevent: their cause was the machine's egress
/// proxy answering Service IPs kube-proxy had not rewritten yet (see the node's Service IP guard,
/// `selkie_e2e::node`).
pub(crate) async fn one_release_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static RELEASES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    RELEASES.lock().await
}

pub(crate) async fn node_env() -> anyhow::Result<&'static NodeEnv> {
    static ENV: OnceCell<Result<NodeEnv, String>> = OnceCell::const_new();
    ENV.get_or_init(|| async {
        let start = async {
            let cluster = Cluster::shared_node().await?;
            let node = cluster.node().context("the shared node cluster has no node")?;
            let images = tokio::task::spawn_blocking(selkie_images).await??;
            for image in [&images.concierge, &images.supervisor, &images.workload] {
                node.import_image(&image.archive)?;
            }
            anyhow::Ok(NodeEnv {
                cluster,
                images,
                host_ip: IpAddr::V4(node.ip()),
            })
        };
        start.await.map_err(|e| format!("{e:#}"))
    })
    .await
    .as_ref()
    .map_err(|e| anyhow::anyhow!("the node test environment failed to start: {e}"))
}

/// The real kubectl with `kubeconfig` (its own discovery cache), `env` added; its output whatever
/// its exit status.
pub(crate) async fn kubectl_as(
    env: &NodeEnv,
    kubeconfig: &Path,
    args: &[&str],
    vars: &[(&str, &str)],
) -> anyhow::Result<std::process::Output> {
    let mut command = tokio::process::Command::new(env.cluster.kubectl().binary());
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in vars {
        command.env(key, value);
    }
    Ok(tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .with_context(|| format!("kubectl {} did not end within 120s", args.join(" ")))??)
}

/// [`kubectl_as`] that must succeed; returns stdout.
pub(crate) async fn kubectl_ok(
    env: &NodeEnv,
    kubeconfig: &Path,
    args: &[&str],
    vars: &[(&str, &str)],
) -> anyhow::Result<String> {
    let output = kubectl_as(env, kubeconfig, args, vars).await?;
    ensure!(
        output.status.success(),
        "kubectl {} failed ({}):\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// Runs `pod` (JSON) in `namespace` as the admin and waits until it is Ready; returns its
/// name.
pub(crate) async fn run_pod(env: &NodeEnv, namespace: &str, pod: Value) -> anyhow::Result<String> {
    let kubectl = env.cluster.kubectl();
    let name = pod["metadata"]["name"]
        .as_str()
        .context("the pod has no name")?
        .to_string();
    kubectl
        .run_with_stdin(&["apply", "-n", namespace, "-f", "-"], Some(&pod.to_string()))
        .await?;
    let waited = kubectl
        .run(&[
            "wait",
            "-n",
            namespace,
            "--for=condition=Ready",
            "--timeout=120s",
            &format!("pod/{name}"),
        ])
        .await;
    if let Err(e) = waited {
        let described = kubectl
            .run(&["describe", "pod", "-n", namespace, &name])
            .await
            .unwrap_or_default();
        anyhow::bail!("pod {namespace}/{name} did not become Ready: {e}\n{described}");
    }
    Ok(name)
}

/// A pod of the workload image (busybox) running `script` with `sh -c`.
pub(crate) fn workload_pod(env: &NodeEnv, name: &str, script: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": env.images.workload.reference,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }],
        },
    })
}

/// A workload pod whose `kubectl` is the harness's (mounted read-only from the host: it is a
/// static binary), for running kubectl inside the cluster.
pub(crate) fn kubectl_pod(env: &NodeEnv, name: &str, script: &str) -> Value {
    let kubectl_dir: PathBuf = env
        .cluster
        .kubectl()
        .binary()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut pod = workload_pod(env, name, script);
    pod["spec"]["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "kubectl", "mountPath": "/opt/kubectl", "readOnly": true}]);
    pod["spec"]["volumes"] =
        serde_json::json!([{"name": "kubectl", "hostPath": {"path": kubectl_dir, "type": "Directory"}}]);
    pod
}

/// The pods of `namespace` labelled `app=<app>` (a chart component's), as JSON.
pub(crate) async fn app_pods(env: &NodeEnv, namespace: &str, app: &str) -> anyhow::Result<Vec<Value>> {
    let pods: Value = serde_json::from_str(
        &env.cluster
            .kubectl()
            .run(&[
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                &format!("app={app}"),
                "-o",
                "json",
            ])
            .await?,
    )?;
    Ok(pods["items"].as_array().cloned().unwrap_or_default())
}

/// Whether `pod` (JSON) is Ready and not being deleted.
pub(crate) fn is_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// A namespace of the admin's, unique to this run.
pub(crate) async fn namespace(env: &NodeEnv, prefix: &str) -> anyhow::Result<String> {
    let client = env.cluster.client().await?;
    Ok(env.cluster.create_namespace(&client, prefix).await?)
}

/// The node itself: pods get addresses on the pod network, resolve Services' names through the
/// cluster DNS and reach kube-apiserver through the `kubernetes` Service with their service
/// account's token; the controller manager runs as the static pod kubeadm would have.
#[tokio::test]
async fn node_pods_resolve_services_and_reach_kube_apiserver_with_their_service_account() -> anyhow::Result<()>
{
    let env = node_env().await?;
    let kubectl = env.cluster.kubectl();
    let namespace = namespace(env, "node-basics").await?;
    // The pod's service account may read pods of its namespace.
    kubectl
        .run(&[
            "create",
            "rolebinding",
            "default-view",
            "-n",
            &namespace,
            "--clusterrole=view",
            &format!("--serviceaccount={namespace}:default"),
        ])
        .await?;
    let script = "/opt/kubectl/kubectl --server=https://kubernetes.default.svc \
        --certificate-authority=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt \
        --token=\"$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\" \
        get pods -o name > /tmp/pods 2>&1; cat /tmp/pods; touch /tmp/done; sleep 3600";
    let mut pod = kubectl_pod(env, "in-cluster", script);
    pod["spec"]["containers"][0]["readinessProbe"] =
        serde_json::json!({"exec": {"command": ["cat", "/tmp/done"]}, "periodSeconds": 1});
    let name = run_pod(env, &namespace, pod).await?;
    let logs = kubectl.run(&["logs", "-n", &namespace, &name]).await?;
    ensure!(
        logs.trim() == format!("pod/{name}"),
        "the pod's kubectl said: {logs}"
    );

    let described: Value = serde_json::from_str(
        &kubectl
            .run(&["get", "pod", "-n", &namespace, &name, "-o", "json"])
            .await?,
    )?;
    let pod_ip = described["status"]["podIP"].as_str().unwrap_or_default();
    ensure!(
        pod_ip.starts_with("10.244.0."),
        "pod IP {pod_ip} is not on the pod network"
    );

    let controller_manager: Value = serde_json::from_str(
        &kubectl
            .run(&[
                "get",
                "pods",
                "-n",
                "kube-system",
                "-l",
                "component=kube-controller-manager",
                "-o",
                "json",
            ])
            .await?,
    )?;
    let kcm = &controller_manager["items"][0];
    ensure!(
        kcm["metadata"]["annotations"]["kubernetes.io/config.source"] == "file",
        "kube-controller-manager is not a static pod: {kcm}"
    );
    Ok(())
}

/// One helm release of `conf/helm/selkie` on the node, driven by a test from install to
/// uninstall: its component runs in `namespace` as the pods labelled `app=<app>`, and its values
/// file is rewritten for each install or upgrade.
pub(crate) struct Release {
    pub(crate) helm: Helm,
    name: &'static str,
    namespace: &'static str,
    app: &'static str,
    values: PathBuf,
}

/// The namespace the node tests' releases keep their records in.
pub(crate) const RELEASE_NAMESPACE: &str = "selkie-node-releases";

impl Release {
    /// A release `name` whose component is `app=<app>` in `namespace`.
    pub(crate) fn new(
        env: &NodeEnv,
        name: &'static str,
        namespace: &'static str,
        app: &'static str,
    ) -> anyhow::Result<Self> {
        let helm = Helm::new(Some(env.cluster.admin_kubeconfig()))?;
        let values = helm.dir().join("values.json");
        Ok(Self {
            helm,
            name,
            namespace,
            app,
            values,
        })
    }

    /// `helm <verb>` (`install` or `upgrade`) of the chart with `values`, waiting (5 minutes at
    /// most) until the release's pods are Ready; helm's output or error.
    pub(crate) async fn apply(&self, verb: &str, values: &Value) -> anyhow::Result<String> {
        std::fs::write(&self.values, values.to_string())?;
        let chart = chart_dir();
        let values = self.values.to_string_lossy().into_owned();
        let mut args = vec![verb, self.name, &chart, "--namespace", RELEASE_NAMESPACE];
        if verb == "install" {
            args.push("--create-namespace");
        }
        args.extend(["-f", &values, "--wait", "--timeout", "5m"]);
        self.helm
            .run(&args)
            .await
            .with_context(|| format!("helm {verb} {}", self.name))
    }

    /// The component's pods, as JSON.
    pub(crate) async fn pods(&self, env: &NodeEnv) -> anyhow::Result<Vec<Value>> {
        app_pods(env, self.namespace, self.app).await
    }

    /// A rolling `helm upgrade` to `values`: returns once the new pods are Ready and every pod
    /// from before is gone (2 minutes each at most); the pods after.
    pub(crate) async fn upgrade(&self, env: &NodeEnv, values: &Value) -> anyhow::Result<Vec<Value>> {
        let old = names(&self.pods(env).await?);
        self.apply("upgrade", values).await?;
        let kubectl = env.cluster.kubectl();
        for pod in &old {
            kubectl
                .run(&[
                    "wait",
                    "--for=delete",
                    "--timeout=120s",
                    "-n",
                    self.namespace,
                    &format!("pod/{pod}"),
                ])
                .await?;
        }
        self.pods(env).await
    }

    /// Kills the pod `victim` (`kubectl delete pod --force --grace-period=0`), waits (30 s at
    /// most) until no EndpointSlice of the namespace lists it and the node's kube-proxy no longer
    /// routes to its address (connections opened to a killed pod before then, and requests sent
    /// over them until it stops, are lost whatever the server: `meanwhile` opens its own), then
    /// waits (2 minutes at most) until two pods are Ready again, the victim not among them.
    /// `meanwhile` runs before each look of that second wait: its first failure fails this at
    /// once.
    pub(crate) async fn kill<F, Fut>(&self, env: &NodeEnv, victim: &str, meanwhile: F) -> anyhow::Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let pods = self.pods(env).await?;
        let victim_ip = pods
            .iter()
            .find(|pod| pod["metadata"]["name"] == victim)
            .and_then(|pod| pod["status"]["podIP"].as_str())
            .with_context(|| format!("{victim} has no address among {pods:#?}"))?
            .to_string();
        let node = env.cluster.node().context("the cluster has no node")?;
        env.cluster
            .kubectl()
            .run(&[
                "delete",
                "pod",
                victim,
                "-n",
                self.namespace,
                "--force",
                "--grace-period=0",
            ])
            .await?;
        eventually(Duration::from_secs(30), || async {
            let slices = env
                .cluster
                .kubectl()
                .run(&["get", "endpointslices", "-n", self.namespace, "-o", "json"])
                .await?;
            let slices: Value = serde_json::from_str(&slices)?;
            let listed = slices["items"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|slice| slice["endpoints"].as_array().into_iter().flatten())
                .any(|endpoint| endpoint["targetRef"]["name"] == victim);
            ensure!(
                !listed,
                "the EndpointSlices of {} still list {victim}",
                self.namespace
            );
            ensure!(
                !node.routes_to(&victim_ip).await?,
                "kube-proxy still routes to {victim}'s address {victim_ip}"
            );
            Ok(())
        })
        .await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            meanwhile().await.context("while the killed pod was replaced")?;
            let pods = self.pods(env).await?;
            let ready: Vec<&str> = pods
                .iter()
                .filter(|p| is_ready(p))
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            if ready.len() == 2 && !ready.contains(&victim) {
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "no second Ready pod 120 s after {victim} was killed; ready: {ready:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `outcome` unchanged; when it is an error, first prints (to the test's captured output)
    /// the error itself (CI shows the head of a failure's output, and the diagnosis is long),
    /// then what an admin would look at: the namespace's pods, kube-apiserver's view of the
    /// aggregated (non-local) APIServices, the namespace's recent events, and the last 40 log
    /// lines of each pod of the component. What cannot be read is named instead.
    pub(crate) async fn explain<T>(&self, env: &NodeEnv, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
        if let Err(error) = &outcome {
            println!("---- the failure: {error:#}");
            let kubectl = env.cluster.kubectl();
            let mut looks: Vec<(String, Vec<String>)> = vec![
                (
                    "pods".into(),
                    vec!["get", "pods", "-n", self.namespace, "-o", "wide"]
                        .into_iter()
                        .map(String::from)
                        .collect(),
                ),
                (
                    "APIServices".into(),
                    [
                        "get",
                        "apiservices",
                        "-o",
                        "custom-columns=NAME:.metadata.name,SERVICE:.spec.service.name,\
                         AVAILABLE:.status.conditions[0].status,\
                         MESSAGE:.status.conditions[0].message",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                (
                    "events".into(),
                    ["get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp"]
                        .map(String::from)
                        .to_vec(),
                ),
                // Which Service and endpoints each Service IP leads to now.
                (
                    "Services".into(),
                    ["get", "services", "-A", "-o", "wide"].map(String::from).to_vec(),
                ),
                (
                    "EndpointSlices".into(),
                    ["get", "endpointslices", "-A", "-o", "wide"]
                        .map(String::from)
                        .to_vec(),
                ),
            ];
            if let Ok(pods) = self.pods(env).await {
                for pod in names(&pods) {
                    looks.push((
                        format!("log of {pod}"),
                        ["logs", "-n", self.namespace, &pod, "--tail=40"]
                            .map(String::from)
                            .to_vec(),
                    ));
                }
            }
            for (what, args) in looks {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let mut said = kubectl
                    .run(&args)
                    .await
                    .unwrap_or_else(|e| format!("(unreadable: {e})"));
                if what == "APIServices" {
                    said = said
                        .lines()
                        .filter(|line| !line.contains(" <none> "))
                        .collect::<Vec<_>>()
                        .join("\n");
                }
                println!("---- {what} (kubectl {}):\n{said}", args.join(" "));
            }
            // The host's side of the Service network: kube-proxy's NAT rules for Service IPs
            // and the host's TCP connections to them on 443 (kube-apiserver's included).
            let host =
                "iptables-save -t nat | grep -E -- '-d 10\\.0\\.0\\.|KUBE-SEP-.* -j DNAT|KUBE-NODEPORTS|KUBE-EXT' | head -100; \
                        echo '-- connections:'; ss -tnpi 'dst 10.0.0.0/24' | head -60";
            let said = std::process::Command::new("timeout")
                .args(["10", "bash", "-c", host])
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
                .unwrap_or_else(|e| format!("(unreadable: {e})"));
            println!("---- the host's Service NAT rules and connections:\n{said}");
            if let Some(node) = env.cluster.node() {
                println!("---- kube-proxy's log:\n{}", node.kube_proxy_log_tail(30));
            }
        }
        outcome
    }

    /// `helm uninstall`, then waits (3 minutes at most) until the component's namespace is gone
    /// (the node's controller manager finishes the deletion); fails naming whatever of the
    /// release is left.
    pub(crate) async fn uninstall(&self, env: &NodeEnv) -> anyhow::Result<()> {
        self.helm
            .run(&["uninstall", self.name, "--namespace", RELEASE_NAMESPACE, "--wait"])
            .await?;
        let kubectl = env.cluster.kubectl();
        kubectl
            .run(&[
                "wait",
                "--for=delete",
                "--timeout=180s",
                &format!("namespace/{}", self.namespace),
            ])
            .await?;
        let left = objects_of_release(&kubectl, self.name).await?;
        ensure!(
            left.is_empty(),
            "left after helm uninstall: {}",
            identities(&left).join(", ")
        );
        Ok(())
    }
}

/// The names of `pods` (JSON).
pub(crate) fn names(pods: &[Value]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}
