//! A real node beside the control plane: containerd (with Debian's runc and the CNI plugins), the
//! kubelet, kube-proxy (iptables), kube-scheduler, and kube-controller-manager as a kubeadm-shaped
//! static pod.
//!
//! Started by [`crate::ClusterBuilder::node`] after kube-apiserver is ready; the cluster then serves
//! on the host's address too, so that pods reach it through the `kubernetes` Service. Everything
//! kubeadm keeps in `/etc/kubernetes` is written there as kubeadm writes it (the PKI under `pki/`,
//! the controller manager's kubeconfig, the static pod manifests), because the kube cert agent reads
//! the controller manager's pod as it finds it on kubeadm clusters. Everything else (containerd's
//! state, the kubelet's root, pod logs, IP allocations) lives in the cluster's run directory.
//!
//! A node needs root, and the kubelet's ports and the host's iptables rules are the machine's: one
//! node runs on a machine at a time, enforced by an exclusive lock on [`NODE_LOCK`]. These machines
//! run cgroup v1 (hybrid), so the kubelet runs with `failCgroupV1: false` and the cgroupfs driver.
//! Containers outlive containerd (their shims are reparented), so a node's pods are killed when it
//! stops, and whatever a killed test process left behind is swept when the next node starts.

use std::{
    ffi::OsString,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod, ServiceAccount};
use kube::{api::ListParams, Api, Client};

use crate::{
    cluster::{write_kubeconfig, write_private_file, ClusterPki},
    components::{tail_lines, BUILD_SCRIPT},
    pki::CertAndKey,
    process::ManagedProcess,
    HarnessError,
};

/// The node's name (its Node object and the kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "selkie-node";
/// The pod network: every pod gets an address here, on the bridge [`POD_BRIDGE`].
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The cluster's pod CIDR (the controller manager's `--cluster-cidr`, kube-proxy's `clusterCIDR`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The Linux bridge the CNI bridge plugin puts pods on.
pub const POD_BRIDGE: &str = "selkie-cni0";
/// kubeadm's directory; the node writes its PKI, kubeconfigs and static pod manifests here.
pub const KUBERNETES_DIR: &str = "/etc/kubernetes";
/// The cluster DNS Service's address (the kubelet's `clusterDNS`), served by CoreDNS.
pub const CLUSTER_DNS_IP: &str = "10.0.0.10";
/// The cluster's Service IP range (kube-apiserver's `--service-cluster-ip-range`).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The cluster's DNS domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// Held (flock) by the process that owns the machine's one node.
pub const NODE_LOCK: &str = "/run/selkie-node.lock";

const NODE_READY_TIMEOUT: Duration = Duration::from_secs(180);
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The node components' binaries, built by `build-components.sh node`.
#[derive(Debug, Clone)]
pub struct NodeComponents {
    /// `kubelet`.
    pub kubelet: PathBuf,
    /// `kube-controller-manager` (packed into its image by `build-images.sh`).
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler`.
    pub kube_scheduler: PathBuf,
    /// `kube-proxy`.
    pub kube_proxy: PathBuf,
    /// The directory of `pause` and `pause.version` (the sandbox image's binary).
    pub kubernetes_node_bin: PathBuf,
    /// `containerd`.
    pub containerd: PathBuf,
    /// `containerd-shim-runc-v2`.
    pub containerd_shim: PathBuf,
    /// `ctr`, containerd's CLI (image import).
    pub ctr: PathBuf,
    /// The directory of the CNI plugins (bridge, host-local, loopback, portmap).
    pub cni_bin: PathBuf,
    /// `coredns` (packed into its image by `build-images.sh`).
    pub coredns: PathBuf,
}

static NODE_COMPONENTS: OnceLock<Result<NodeComponents, String>> = OnceLock::new();

impl NodeComponents {
    /// Builds (once per process; cached outside the repository) and locates the node components.
    pub fn get() -> Result<&'static NodeComponents, HarnessError> {
        NODE_COMPONENTS
            .get_or_init(|| build_node_components().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| HarnessError::Build {
                command: format!("bash {BUILD_SCRIPT} node"),
                status: "failed earlier in this process".into(),
                tail: e.clone(),
            })
    }
}

fn build_node_components() -> Result<NodeComponents, HarnessError> {
    let command = format!("bash {BUILD_SCRIPT} node");
    let output = Command::new("bash")
        .args([BUILD_SCRIPT, "node"])
        .output()
        .map_err(|e| HarnessError::io(format!("running `{command}`"), e))?;
    if !output.status.success() {
        return Err(HarnessError::Build {
            command,
            status: output.status.to_string(),
            tail: tail_lines(&String::from_utf8_lossy(&output.stderr), 40),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = |key: &str| -> Result<PathBuf, HarnessError> {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{key}=")))
            .map(PathBuf::from)
            .ok_or_else(|| HarnessError::Build {
                command: command.clone(),
                status: format!("succeeded but did not print `{key}=`"),
                tail: tail_lines(&stdout, 20),
            })
    };
    let kube = dir("kubernetes-node")?;
    let containerd = dir("containerd")?;
    let components = NodeComponents {
        kubelet: kube.join("kubelet"),
        kube_controller_manager: kube.join("kube-controller-manager"),
        kube_scheduler: kube.join("kube-scheduler"),
        kube_proxy: kube.join("kube-proxy"),
        kubernetes_node_bin: kube,
        containerd: containerd.join("containerd"),
        containerd_shim: containerd.join("containerd-shim-runc-v2"),
        ctr: containerd.join("ctr"),
        cni_bin: dir("cni-plugins")?,
        coredns: dir("coredns")?.join("coredns"),
    };
    for path in [
        &components.kubelet,
        &components.containerd,
        &components.cni_bin.join("bridge"),
        &components.coredns,
    ] {
        if !path.is_file() {
            return Err(HarnessError::Build {
                command,
                status: format!("succeeded but {} is missing", path.display()),
                tail: String::new(),
            });
        }
    }
    Ok(components)
}

/// The host's address the node registers with and kube-apiserver advertises: the first global
/// IPv4 address of the host's interfaces (not loopback: pods cannot reach the host's loopback).
pub fn host_ip() -> Result<Ipv4Addr, HarnessError> {
    let output = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .map_err(|e| HarnessError::io("running `ip -4 -o addr show scope global` (iproute2)", e))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.contains(POD_BRIDGE))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .ok_or_else(|| {
            HarnessError::NotReady(
                "a node needs a global IPv4 address on the host for pods to reach it; `ip -4 addr` shows none"
                    .into(),
            )
        })
}

/// What [`Node::start`] needs of the control plane it joins.
pub(crate) struct ControlPlane<'a> {
    pub root: &'a Path,
    pub pki: &'a ClusterPki,
    pub host_ip: Ipv4Addr,
    pub apiserver_port: u16,
    pub admin_kubeconfig: &'a Path,
    pub kubernetes_version: &'a str,
    /// kubectl, which applies the cluster DNS.
    pub kubectl: &'a Path,
    /// The images the node imports before its kubelet starts (the sandbox, the controller
    /// manager's and CoreDNS's, from `build-images.sh`).
    pub images: &'a crate::images::NodeImages,
}

/// A running node. Dropping it stops its processes (kube-proxy, scheduler, kubelet, containerd)
/// and kills its pods.
#[derive(Debug)]
pub struct Node {
    // Field order is drop order.
    kube_proxy: ManagedProcess,
    scheduler: ManagedProcess,
    kubelet: ManagedProcess,
    containerd: ManagedProcess,
    ctr: PathBuf,
    containerd_socket: PathBuf,
    ip: Ipv4Addr,
    /// The node's run directory (`<cluster>/node`): its mounts are detached when it stops.
    dir: PathBuf,
    _lock: nix::fcntl::Flock<fs::File>,
}

impl Node {
    /// Takes the machine's node lock, sweeps what a dead node left, writes the node's files,
    /// starts containerd, imports `plane.images`, starts the kubelet, kube-scheduler and kube-proxy,
    /// and waits until the Node is Ready, the controller manager's static pod runs and the
    /// `default` service account exists.
    ///
    /// Fails with a [`HarnessError`] naming the component and its log tail; waits up to 15 minutes
    /// for another node on the machine to stop, then fails saying so.
    pub(crate) async fn start(plane: ControlPlane<'_>) -> Result<Node, HarnessError> {
        let components = NodeComponents::get()?;
        let lock = take_node_lock().await?;
        sweep_leftovers(plane.root);
        prepare_host()?;
        let files = write_node_files(&plane, components)?;
        let node_dir = plane.root.join("node");

        let mut containerd = ManagedProcess::spawn(
            "containerd",
            &components.containerd,
            &[OsString::from("--config"), files.containerd_config.clone().into()],
            node_dir.join("containerd.log"),
        )?;
        wait_for_socket(&mut containerd, &files.containerd_socket).await?;
        for image in plane.images.all() {
            import_image(&components.ctr, &files.containerd_socket, &image.archive)?;
        }

        let kubelet = ManagedProcess::spawn(
            "kubelet",
            &components.kubelet,
            &[
                format!("--config={}", files.kubelet_config.display()),
                format!("--kubeconfig={}", files.kubelet_kubeconfig.display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={}", plane.host_ip),
                format!("--root-dir={}", node_dir.join("kubelet").display()),
                "--v=1".into(),
            ]
            .map(OsString::from),
            node_dir.join("kubelet.log"),
        )?;
        let scheduler = ManagedProcess::spawn(
            "kube-scheduler",
            &components.kube_scheduler,
            &[
                format!("--kubeconfig={}", files.scheduler_kubeconfig.display()),
                format!(
                    "--authentication-kubeconfig={}",
                    files.scheduler_kubeconfig.display()
                ),
                format!(
                    "--authorization-kubeconfig={}",
                    files.scheduler_kubeconfig.display()
                ),
                "--bind-address=127.0.0.1".into(),
                "--leader-elect=false".into(),
            ]
            .map(OsString::from),
            node_dir.join("kube-scheduler.log"),
        )?;
        let kube_proxy = ManagedProcess::spawn(
            "kube-proxy",
            &components.kube_proxy,
            &[format!("--config={}", files.kube_proxy_config.display())].map(OsString::from),
            node_dir.join("kube-proxy.log"),
        )?;
        let mut node = Node {
            kube_proxy,
            scheduler,
            kubelet,
            containerd,
            ctr: components.ctr.clone(),
            containerd_socket: files.containerd_socket,
            ip: plane.host_ip,
            dir: node_dir.clone(),
            _lock: lock,
        };
        let kubectl = crate::kubectl::Kubectl::new(plane.kubectl, plane.admin_kubeconfig);
        let server_url = format!("https://{}:{}", plane.host_ip, plane.apiserver_port);
        for manifest in [
            cluster_dns_manifest(&plane.images.coredns.reference),
            cluster_info_manifest(&server_url, &plane.pki.server_ca.cert_pem()),
        ] {
            kubectl
                .run_with_stdin(&["apply", "-f", "-"], Some(&manifest))
                .await?;
        }
        node.wait_ready(plane.admin_kubeconfig).await?;
        // kubeadm marks the node that runs the control plane.
        kubectl
            .run(&[
                "label",
                "node",
                NODE_NAME,
                "node-role.kubernetes.io/control-plane=",
                "--overwrite",
            ])
            .await?;
        Ok(node)
    }

    /// The node's address (the host's), where NodePorts and the kubelet listen.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The last `lines` lines of kube-proxy's log (its rule syncs and what failed in them).
    pub fn kube_proxy_log_tail(&self, lines: usize) -> String {
        crate::process::log_tail(&self.dir.join("kube-proxy.log"), lines)
    }

    /// Whether kube-proxy's rules (the host's `nat` table) still send Service traffic to the pod
    /// address `pod_ip`: kube-proxy syncs its rules some time after the EndpointSlices change,
    /// and until then new connections to a Service may reach a pod that is gone. Fails when
    /// `iptables-save` cannot be run.
    pub async fn routes_to(&self, pod_ip: &str) -> Result<bool, HarnessError> {
        let out = tokio::process::Command::new("iptables-save")
            .args(["-t", "nat"])
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| HarnessError::io("running iptables-save -t nat", e))?;
        if !out.status.success() {
            return Err(HarnessError::NotReady(format!(
                "iptables-save -t nat failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let target = format!("--to-destination {pod_ip}:");
        Ok(String::from_utf8_lossy(&out.stdout).contains(&target))
    }

    /// Imports a docker or OCI archive into the node's containerd (the CRI's `k8s.io` namespace),
    /// so pods run it without pulling.
    pub fn import_image(&self, archive: &Path) -> Result<(), HarnessError> {
        import_image(&self.ctr, &self.containerd_socket, archive)
    }

    /// Fails with the component's log tail if one of the node's processes has exited.
    pub fn check_running(&mut self) -> Result<(), HarnessError> {
        self.containerd.check_running("while the node ran")?;
        self.kubelet.check_running("while the node ran")?;
        self.scheduler.check_running("while the node ran")?;
        self.kube_proxy.check_running("while the node ran")
    }

    async fn wait_ready(&mut self, admin_kubeconfig: &Path) -> Result<(), HarnessError> {
        let client = crate::cluster::client_from_kubeconfig(admin_kubeconfig).await?;
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        loop {
            self.check_running()?;
            let last = match node_state(&client).await {
                Ok(None) => return Ok(()),
                Ok(Some(waiting_for)) => waiting_for,
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(self.kubelet.failure(format!(
                    "did not make the node ready within {NODE_READY_TIMEOUT:?} (last seen: {last})"
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Stop the kubelet first so that it does not restart what is killed below.
        self.kube_proxy.stop(Duration::from_secs(5));
        self.scheduler.stop(Duration::from_secs(5));
        self.kubelet.stop(Duration::from_secs(10));
        kill_pods();
        self.containerd.stop(Duration::from_secs(10));
        // What the kubelet and containerd mounted (volumes, sandboxes' shm, network namespaces).
        unmount_under(&self.dir);
        // The machine's Service IP range is its own again (it may be a real network elsewhere).
        // The e2e tests' shared node is never dropped (a static): there the rule stays, as
        // kube-proxy's rules do, until the next node's start finds it in place.
        for chain in ["OUTPUT", "FORWARD"] {
            while iptables(&[&["-D", chain], &SERVICE_IP_GUARD[..]].concat()) {}
        }
    }
}

/// `None` once the node is Ready, the controller manager's mirror pod is Ready and the `default`
/// service account exists; otherwise what is still missing.
async fn node_state(client: &Client) -> Result<Option<String>, kube::Error> {
    let node = Api::<KubeNode>::all(client.clone()).get_opt(NODE_NAME).await?;
    let ready = node
        .as_ref()
        .and_then(|n| n.status.as_ref()?.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        None => return Ok(Some(format!("Node {NODE_NAME} is not registered yet"))),
        Some(c) if c.status != "True" => {
            return Ok(Some(format!(
                "Node {NODE_NAME} is not Ready: {}",
                c.message.clone().unwrap_or_default()
            )))
        }
        Some(_) => {}
    }
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default().labels("component=kube-controller-manager"))
        .await?;
    let kcm_ready = pods.items.iter().any(|pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    if !kcm_ready {
        return Ok(Some(
            "the kube-controller-manager static pod is not Ready yet".into(),
        ));
    }
    if Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .get_opt("default")
        .await?
        .is_none()
    {
        return Ok(Some(
            "the controller manager has not created the default service account yet".into(),
        ));
    }
    let dns = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "kube-system")
        .get_opt("coredns")
        .await?;
    let available = dns
        .as_ref()
        .and_then(|d| d.status.as_ref()?.available_replicas)
        .unwrap_or(0);
    if available < 1 {
        return Ok(Some("the cluster DNS (CoreDNS) is not available yet".into()));
    }
    Ok(None)
}

/// How long a node start waits for another node on the machine to stop.
const NODE_LOCK_WAIT: Duration = Duration::from_secs(900);

/// Takes [`NODE_LOCK`], waiting up to [`NODE_LOCK_WAIT`] while another process's node holds it.
async fn take_node_lock() -> Result<nix::fcntl::Flock<fs::File>, HarnessError> {
    let deadline = Instant::now() + NODE_LOCK_WAIT;
    let mut said = false;
    loop {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(NODE_LOCK)
            .map_err(|e| {
                HarnessError::io(
                    format!("opening {NODE_LOCK} (a node needs root: it runs containerd and the kubelet)"),
                    e,
                )
            })?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((_, errno)) if errno != nix::errno::Errno::EWOULDBLOCK => {
                return Err(HarnessError::io(format!("locking {NODE_LOCK}"), errno.into()))
            }
            Err(_) if Instant::now() >= deadline => {
                return Err(HarnessError::NotReady(format!(
                    "another node ran on this machine for all of {NODE_LOCK_WAIT:?} ({NODE_LOCK} stayed \
                     locked); stop it first (`make cluster-down`, or the test run that started it)"
                )))
            }
            Err(_) => {
                if !said {
                    eprintln!("selkie-e2e: waiting for the node of another process to stop ({NODE_LOCK})");
                    said = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Sets what the kubelet and kube-proxy need of the kernel: IP forwarding, and bridged pod
/// traffic through iptables (so Services work between pods on the bridge); and refuses traffic
/// to a Service IP that kube-proxy has not rewritten ([`SERVICE_IP_GUARD`]).
fn prepare_host() -> Result<(), HarnessError> {
    for (key, value) in [
        ("/proc/sys/net/ipv4/ip_forward", "1"),
        ("/proc/sys/net/bridge/bridge-nf-call-iptables", "1"),
    ] {
        fs::write(key, value).map_err(|e| HarnessError::io(format!("setting {key} to {value}"), e))?;
    }
    for chain in ["OUTPUT", "FORWARD"] {
        if !iptables(&[&["-C", chain], &SERVICE_IP_GUARD[..]].concat())
            && !iptables(&[&["-A", chain], &SERVICE_IP_GUARD[..]].concat())
        {
            return Err(HarnessError::io(
                format!("adding the Service IP guard to the {chain} chain"),
                std::io::Error::other("iptables failed"),
            ));
        }
    }
    Ok(())
}

/// An iptables rule (of the filter table, after kube-proxy's DNAT) refusing packets still bound
/// for a Service IP: ones kube-proxy has not rewritten (yet). Without it such a packet leaves by
/// the default route, and on this project's machines the network's transparent egress proxy
/// answers any `10.0.0.x:443` with TLS, HTTP/2 and a 404: kube-aggregator's availability check of
/// a new APIService, when it connected before kube-proxy's rule for the Service existed, got that
/// 404 and kept the pooled connection, so the APIService stayed unavailable for minutes (the
/// node tests' failures of sessions 21, 22 and 24). In a real cluster a Service IP leads nowhere
/// without kube-proxy; now here too.
const SERVICE_IP_GUARD: [&str; 8] = [
    "-d",
    SERVICE_CIDR,
    "-m",
    "comment",
    "--comment",
    "selkie-e2e: a Service IP without a kube-proxy rule",
    "-j",
    "REJECT",
];

/// Runs `iptables -w` with `args`; whether it succeeded.
fn iptables(args: &[&str]) -> bool {
    Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Kills every process in the kubelet's pod cgroups (containers and their sandboxes) and every
/// shim, then unmounts what the kubelet and containerd mounted under the run directories of
/// dead runs. A node's processes die with their owner, but containers outlive containerd.
fn sweep_leftovers(root: &Path) {
    kill_pods();
    unmount_under(&crate::cluster::temp_root());
    unmount_under(root);
}

/// SIGKILLs every process in a `kubepods` cgroup (any hierarchy) and every
/// `containerd-shim-runc-v2`.
fn kill_pods() {
    use nix::{sys::signal, unistd::Pid};
    let mut pids = Vec::new();
    if let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") {
        for hierarchy in hierarchies.flatten() {
            collect_cgroup_procs(&hierarchy.path().join("kubepods"), &mut pids);
        }
    }
    if let Ok(processes) = fs::read_dir("/proc") {
        for process in processes.flatten() {
            let Some(pid) = process.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let cmdline = fs::read(process.path().join("cmdline")).unwrap_or_default();
            if cmdline.starts_with(b"/")
                && String::from_utf8_lossy(&cmdline).contains("containerd-shim-runc-v2")
            {
                pids.push(pid);
            }
        }
    }
    for pid in pids {
        let _ = signal::kill(Pid::from_raw(pid), signal::Signal::SIGKILL);
    }
}

fn collect_cgroup_procs(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()));
    }
    if let Ok(children) = fs::read_dir(dir) {
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_procs(&child.path(), pids);
            }
        }
    }
}

/// Detaches every mount at or below `root` (deepest first), so that the directories can be
/// removed.
pub(crate) fn unmount_under(root: &Path) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}

struct NodeFiles {
    containerd_config: PathBuf,
    containerd_socket: PathBuf,
    kubelet_config: PathBuf,
    kubelet_kubeconfig: PathBuf,
    scheduler_kubeconfig: PathBuf,
    kube_proxy_config: PathBuf,
}

fn write_node_files(
    plane: &ControlPlane<'_>,
    components: &NodeComponents,
) -> Result<NodeFiles, HarnessError> {
    let node_dir = plane.root.join("node");
    let etc = Path::new(KUBERNETES_DIR);
    let pki_dir = etc.join("pki");
    let _ = fs::remove_dir_all(etc);
    for dir in [
        &node_dir,
        &pki_dir,
        &etc.join("manifests"),
        &node_dir.join("cni/net.d"),
    ] {
        fs::create_dir_all(dir).map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
    }
    let server_url = format!("https://{}:{}", plane.host_ip, plane.apiserver_port);
    let server_ca = plane.pki.server_ca.cert_pem();
    let write = |path: &Path, contents: &str| write_private_file(path, contents);
    let kubeconfig = |path: &Path, user: &str, cert: &CertAndKey| {
        write_kubeconfig(path, &server_url, &server_ca, user, cert)
    };

    // kubeadm's /etc/kubernetes/pki: ca.{crt,key} is the cluster signing CA (here the client CA,
    // whose key signs the users the cluster trusts), sa.{key,pub} the service-account key pair.
    write(&pki_dir.join("ca.crt"), &plane.pki.client_ca.cert_pem())?;
    write(&pki_dir.join("ca.key"), &plane.pki.client_ca.key_pem())?;
    write(&pki_dir.join("apiserver-ca.crt"), &server_ca)?;
    write(
        &pki_dir.join("front-proxy-ca.crt"),
        &plane.pki.front_proxy_ca.cert_pem(),
    )?;
    write(&pki_dir.join("sa.key"), &plane.pki.service_account.private_pem)?;
    write(&pki_dir.join("sa.pub"), &plane.pki.service_account.public_pem)?;

    let client_ca = &plane.pki.client_ca;
    kubeconfig(
        &etc.join("controller-manager.conf"),
        "system:kube-controller-manager",
        &client_ca.issue_client("system:kube-controller-manager", &[])?,
    )?;
    let kubelet_kubeconfig = etc.join("kubelet.conf");
    kubeconfig(
        &kubelet_kubeconfig,
        &format!("system:node:{NODE_NAME}"),
        &client_ca.issue_client(&format!("system:node:{NODE_NAME}"), &["system:nodes"])?,
    )?;
    let scheduler_kubeconfig = etc.join("scheduler.conf");
    kubeconfig(
        &scheduler_kubeconfig,
        "system:kube-scheduler",
        &client_ca.issue_client("system:kube-scheduler", &[])?,
    )?;
    let kube_proxy_kubeconfig = node_dir.join("kube-proxy.kubeconfig");
    kubeconfig(
        &kube_proxy_kubeconfig,
        "system:kube-proxy",
        &client_ca.issue_client("system:kube-proxy", &[])?,
    )?;
    let ip = plane.host_ip.to_string();
    let kubelet_serving = plane.pki.server_ca.issue_serving(NODE_NAME, &[NODE_NAME, &ip])?;
    write(&node_dir.join("kubelet.crt"), &kubelet_serving.cert_pem)?;
    write(&node_dir.join("kubelet.key"), &kubelet_serving.key_pem)?;

    write(
        &etc.join("manifests/kube-controller-manager.yaml"),
        &controller_manager_manifest(plane.kubernetes_version),
    )?;

    let containerd_dir = node_dir.join("containerd");
    let containerd_socket = containerd_dir.join("containerd.sock");
    let pause_version = fs::read_to_string(components.kubernetes_node_bin.join("pause.version"))
        .map_err(|e| HarnessError::io("reading pause.version of the kubernetes-node build", e))?;
    let containerd_config = node_dir.join("containerd.toml");
    write(
        &containerd_config,
        &format!(
            r#"version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "registry.k8s.io/pause:{pause}"
[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # These machines forbid lowering a process's oom_score_adj below 0 (the kubelet asks -998 for
  # sandboxes): cap it at containerd's own, as for rootless runs.
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{shim}"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = false
"#,
            root = containerd_dir.join("root").display(),
            state = containerd_dir.join("state").display(),
            socket = containerd_socket.display(),
            pause = pause_version.trim(),
            cni_bin = components.cni_bin.display(),
            cni_conf = node_dir.join("cni/net.d").display(),
            shim = components.containerd_shim.display(),
        ),
    )?;
    write(
        &node_dir.join("cni/net.d/10-selkie.conflist"),
        &serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "selkie-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": POD_BRIDGE,
                    "isGateway": true,
                    "ipMasq": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": node_dir.join("cni/ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        })
        .to_string(),
    )?;

    let kubelet_config = node_dir.join("kubelet.yaml");
    write(
        &kubelet_config,
        &serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // These machines run cgroup v1 (hybrid); the kubelet refuses it unless told.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": false,
            "containerRuntimeEndpoint": format!("unix://{}", containerd_socket.display()),
            "staticPodPath": etc.join("manifests"),
            "podLogsDir": node_dir.join("pod-logs"),
            "address": ip,
            "healthzBindAddress": "127.0.0.1",
            "readOnlyPort": 0,
            "tlsCertFile": node_dir.join("kubelet.crt"),
            "tlsPrivateKeyFile": node_dir.join("kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": pki_dir.join("ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "resolvConf": "/etc/resolv.conf",
            "clusterDNS": [CLUSTER_DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            // The test machines' disks are shared and often half full: evict only when nearly full.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": false,
        })
        .to_string(),
    )?;
    let kube_proxy_config = node_dir.join("kube-proxy.yaml");
    write(
        &kube_proxy_config,
        &serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clusterCIDR": CLUSTER_CIDR,
            "hostnameOverride": NODE_NAME,
            "clientConnection": {"kubeconfig": kube_proxy_kubeconfig},
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            // Leave the host's conntrack table size alone.
            "conntrack": {"maxPerCore": 0},
        })
        .to_string(),
    )?;
    Ok(NodeFiles {
        containerd_config,
        containerd_socket,
        kubelet_config,
        kubelet_kubeconfig,
        scheduler_kubeconfig,
        kube_proxy_config,
    })
}

/// kube-controller-manager's static pod as kubeadm writes it (its flags, its `/etc/kubernetes/pki`
/// and kubeconfig hostPaths, its labels), with this cluster's ranges.
fn controller_manager_manifest(kubernetes_version: &str) -> String {
    let flags = [
        "--allocate-node-cidrs=true",
        "--authentication-kubeconfig=/etc/kubernetes/controller-manager.conf",
        "--authorization-kubeconfig=/etc/kubernetes/controller-manager.conf",
        "--bind-address=127.0.0.1",
        "--client-ca-file=/etc/kubernetes/pki/ca.crt",
        &format!("--cluster-cidr={CLUSTER_CIDR}"),
        "--cluster-name=kubernetes",
        "--cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt",
        "--cluster-signing-key-file=/etc/kubernetes/pki/ca.key",
        "--controllers=*,bootstrapsigner,tokencleaner",
        "--kubeconfig=/etc/kubernetes/controller-manager.conf",
        "--leader-elect=true",
        "--requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt",
        "--root-ca-file=/etc/kubernetes/pki/apiserver-ca.crt",
        "--service-account-private-key-file=/etc/kubernetes/pki/sa.key",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--use-service-account-credentials=true",
    ];
    let host_path = |name: &str, path: &str, kind: &str| serde_json::json!({"name": name, "hostPath": {"path": path, "type": kind}});
    let mount =
        |name: &str, path: &str| serde_json::json!({"name": name, "mountPath": path, "readOnly": true});
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-controller-manager",
            "namespace": "kube-system",
            "labels": {"component": "kube-controller-manager", "tier": "control-plane"},
        },
        "spec": {
            "hostNetwork": true,
            "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "kube-controller-manager",
                "image": format!("registry.k8s.io/kube-controller-manager:v{kubernetes_version}"),
                "imagePullPolicy": "IfNotPresent",
                "command": std::iter::once("kube-controller-manager").chain(flags.iter().copied()).collect::<Vec<_>>(),
                "livenessProbe": {
                    "httpGet": {"host": "127.0.0.1", "path": "/healthz", "port": 10257, "scheme": "HTTPS"},
                    "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 8,
                },
                "startupProbe": {
                    "httpGet": {"host": "127.0.0.1", "path": "/healthz", "port": 10257, "scheme": "HTTPS"},
                    "initialDelaySeconds": 1, "periodSeconds": 2, "failureThreshold": 60,
                },
                "resources": {"requests": {"cpu": "200m"}},
                "volumeMounts": [
                    mount("ca-certs", "/etc/ssl/certs"),
                    mount("k8s-certs", "/etc/kubernetes/pki"),
                    mount("kubeconfig", "/etc/kubernetes/controller-manager.conf"),
                ],
            }],
            "volumes": [
                host_path("ca-certs", "/etc/ssl/certs", "DirectoryOrCreate"),
                host_path("k8s-certs", "/etc/kubernetes/pki", "DirectoryOrCreate"),
                host_path("kubeconfig", "/etc/kubernetes/controller-manager.conf", "FileOrCreate"),
            ],
        },
    })
    .to_string()
}

/// `kube-public/cluster-info` as kubeadm publishes it: a kubeconfig naming the cluster's URL and
/// CA, readable by anyone (clients discover the cluster from it).
fn cluster_info_manifest(server_url: &str, ca_pem: &str) -> String {
    use base64::{engine::general_purpose::STANDARD, Engine as _};
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {
            "server": server_url,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "contexts": [],
        "users": [],
    });
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-info", "namespace": "kube-public"},
         "data": {"kubeconfig": kubeconfig.to_string()}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kubeadm:bootstrap-signer-clusterinfo"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}]},
    ]})
    .to_string()
}

/// CoreDNS as kubeadm installs it (the `kube-dns` Service at [`CLUSTER_DNS_IP`], the `coredns`
/// Deployment with its RBAC and Corefile), one replica.
fn cluster_dns_manifest(image: &str) -> String {
    let corefile = format!(
        ".:53 {{\n    errors\n    health :8080\n    ready :8181\n    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n       pods insecure\n       fallthrough in-addr.arpa ip6.arpa\n       ttl 30\n    }}\n    forward . /etc/resolv.conf\n    cache 30\n    loop\n    reload\n}}\n"
    );
    let labels = serde_json::json!({"k8s-app": "kube-dns"});
    let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": "coredns",
                "priorityClassName": "system-cluster-critical",
                "dnsPolicy": "Default",
                "containers": [{
                    "name": "coredns",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["-conf", "/etc/coredns/Corefile"],
                    "ports": [
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "readOnlyRootFilesystem": true,
                        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                    },
                    "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "initialDelaySeconds": 10},
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": true}],
                }],
                "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
            }}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
         "spec": {"clusterIP": CLUSTER_DNS_IP, "selector": labels, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
         ]}},
    ]});
    objects.to_string()
}

async fn wait_for_socket(containerd: &mut ManagedProcess, socket: &Path) -> Result<(), HarnessError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        containerd.check_running("during start-up")?;
        if Instant::now() >= deadline {
            return Err(containerd.failure(format!("did not open {} within 30s", socket.display())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn import_image(ctr: &Path, socket: &Path, archive: &Path) -> Result<(), HarnessError> {
    let output = Command::new(ctr)
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "import"])
        .arg(archive)
        .output()
        .map_err(|e| HarnessError::io(format!("running {} images import", ctr.display()), e))?;
    if !output.status.success() {
        return Err(HarnessError::Build {
            command: format!("ctr images import {}", archive.display()),
            status: output.status.to_string(),
            tail: tail_lines(&String::from_utf8_lossy(&output.stderr), 20),
        });
    }
    Ok(())
}
