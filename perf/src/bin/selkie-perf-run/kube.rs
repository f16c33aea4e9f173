//! The K rows' real kube-apiserver: starting and stopping it with `selkie-cluster`, and creating
//! the objects the rows read and watch.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::Context as _;
use base64::Engine as _;

/// The real kube-apiserver (and etcd) of the K rows, started with `selkie-cluster`.
pub(crate) struct Kube {
    /// `https://127.0.0.1:PORT`.
    pub(crate) server: String,
    /// Its serving CA.
    pub(crate) ca: PathBuf,
    /// The admin (`system:masters`) client certificate and key.
    pub(crate) admin_cert: PathBuf,
    pub(crate) admin_key: PathBuf,
    /// The `selkie-cluster run` process; etcd and kube-apiserver are its children.
    pub(crate) cluster_pid: u32,
}

impl Kube {
    /// Starts the cluster on core 0 (`selkie-cluster --dir DIR up`), reads its admin kubeconfig,
    /// creates the ConfigMap the rows GET, the ConfigMap the watch step updates, `pods` Pods
    /// (Pending forever: there is no scheduler or kubelet) for the list rows, and lets the group
    /// `perf-devs` get, list and watch ConfigMaps and Pods.
    pub(crate) fn start(cluster_bin: &Path, dir: &Path, pods: usize) -> anyhow::Result<Self> {
        let cluster_dir = dir.join("cluster");
        eprintln!(
            "starting etcd + kube-apiserver on core 0 ({})",
            cluster_bin.display()
        );
        let out = Command::new("taskset")
            .args(["-c", "0"])
            .arg(cluster_bin)
            .arg("--dir")
            .arg(&cluster_dir)
            .args(["up", "--timeout-seconds", "600"])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .context("starting selkie-cluster (cargo build -p selkie-e2e --bin selkie-cluster)")?;
        anyhow::ensure!(out.status.success(), "selkie-cluster up failed ({})", out.status);
        let kubeconfig_path = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .trim(),
        );
        let kubeconfig: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&kubeconfig_path)?)
            .with_context(|| format!("reading {} as JSON", kubeconfig_path.display()))?;
        let field = |pointer: &str| -> anyhow::Result<String> {
            kubeconfig
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .with_context(|| format!("the admin kubeconfig has no {pointer}"))
        };
        let decode = |pointer: &str| -> anyhow::Result<Vec<u8>> {
            base64::engine::general_purpose::STANDARD
                .decode(field(pointer)?)
                .with_context(|| format!("{pointer} is not base64"))
        };
        let ca = dir.join("kube-ca.crt");
        let admin_cert = dir.join("kube-admin.crt");
        let admin_key = dir.join("kube-admin.key");
        std::fs::write(&ca, decode("/clusters/0/cluster/certificate-authority-data")?)?;
        std::fs::write(&admin_cert, decode("/users/0/user/client-certificate-data")?)?;
        std::fs::write(&admin_key, decode("/users/0/user/client-key-data")?)?;
        let server = field("/clusters/0/cluster/server")?;
        let cluster_pid: u32 = std::fs::read_to_string(cluster_dir.join("selkie-cluster.pid"))?
            .trim()
            .parse()
            .context("the cluster's pid file")?;
        let kubectl = kubectl();
        // About 1 KiB of JSON, like the perf backend's answer.
        let payload = format!("--from-literal=payload={}", "x".repeat(900));
        let pod_list = dir.join("kube-pods.json");
        std::fs::write(&pod_list, pod_manifests(pods).to_string())?;
        let pod_list = pod_list.display().to_string();
        for args in [
            vec![
                "create",
                "configmap",
                "selkie-perf",
                "-n",
                "default",
                payload.as_str(),
            ],
            vec![
                "create",
                "configmap",
                "selkie-perf-watch",
                "-n",
                "default",
                "--from-literal=seq=0",
            ],
            vec!["create", "-f", pod_list.as_str()],
            vec![
                "create",
                "clusterrole",
                "selkie-perf-read",
                "--verb=get,list,watch",
                "--resource=configmaps,pods",
            ],
            vec![
                "create",
                "clusterrolebinding",
                "selkie-perf-read",
                "--clusterrole=selkie-perf-read",
                "--group=perf-devs",
            ],
        ] {
            let status = Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&kubeconfig_path)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .status()
                .with_context(|| format!("running {}", kubectl.display()))?;
            anyhow::ensure!(
                status.success(),
                "kubectl {} failed ({status})",
                args[..3].join(" ")
            );
        }
        Ok(Self {
            server,
            ca,
            admin_cert,
            admin_key,
            cluster_pid,
        })
    }

    pub(crate) fn stop(cluster_bin: &Path, dir: &Path) {
        let _ = Command::new(cluster_bin)
            .arg("--dir")
            .arg(dir.join("cluster"))
            .arg("down")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status();
    }
}

/// `count` Pods in `default` as one `List` (`selkie-perf-000`, ...: one `pause` container each,
/// never scheduled).
fn pod_manifests(count: usize) -> serde_json::Value {
    let items: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": format!("selkie-perf-{i:03}"), "namespace": "default",
                             "labels": {"app": "selkie-perf"}},
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// `kubectl` from `PATH`, else the one the e2e harness built into `~/.cache/selkie/components`.
fn kubectl() -> PathBuf {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok()
    {
        return PathBuf::from("kubectl");
    }
    let components = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/selkie/components"))
        .unwrap_or_default();
    std::fs::read_dir(&components)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("bin/kubectl"))
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}
