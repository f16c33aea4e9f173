//! `selkie-cluster`: the test control plane (etcd + kube-apiserver) for humans, optionally with the
//! harness's real node (`--node`: containerd, the kubelet, kube-proxy, kube-scheduler,
//! kube-controller-manager and CoreDNS; see `selkie_e2e::node`).
//!
//! * `selkie-cluster up [--node]` starts it in the background and prints the admin kubeconfig path
//!   as its last line; running it again while the cluster is up prints the same path.
//! * `selkie-cluster down` stops it (a node's pods are killed with it).
//! * `selkie-cluster run` is what `up` starts in the background: it owns the cluster until SIGTERM
//!   or SIGINT.
//!
//! State lives in `--dir` (default `.selkie/cluster`): PKI, kubeconfig, logs, etcd data, pid file.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use nix::{sys::signal, unistd::Pid};
use selkie_e2e::Cluster;

#[derive(Parser)]
#[command(about = "A real etcd + kube-apiserver on loopback (and optionally a node), for Selkie development")]
struct Args {
    /// Directory for the cluster's files.
    #[arg(
        long,
        global = true,
        default_value = ".selkie/cluster",
        env = "SELKIE_CLUSTER_DIR"
    )]
    dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the cluster in the background; print the admin kubeconfig path last.
    Up {
        /// Give up if it is not ready after this many seconds (cold component builds included).
        #[arg(long, default_value_t = 3600)]
        timeout_seconds: u64,
        /// Join a real node (needs root; one node per machine, a second waits for the first).
        #[arg(long)]
        node: bool,
    },
    /// Stop the cluster started by `up`.
    Down,
    /// Run the cluster in the foreground until SIGTERM or SIGINT.
    Run {
        /// Join a real node (needs root; one node per machine, a second waits for the first).
        #[arg(long)]
        node: bool,
    },
}

const PID_FILE: &str = "selkie-cluster.pid";
const READY_FILE: &str = "ready";
const LOG_FILE: &str = "selkie-cluster.log";
/// The `ready` file's line naming the node's address, when the cluster has a node.
const NODE_IP_PREFIX: &str = "node-ip=";
/// How long `down` waits for the cluster to stop before killing it. A node stops its kube-proxy,
/// scheduler, kubelet and containerd one after the other, each with a grace period; killing
/// `run` instead would leave the node's containers running (they outlive containerd) until the
/// next node starts and sweeps them.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = std::path::absolute(&args.dir).with_context(|| format!("resolving {}", args.dir.display()))?;
    match args.command {
        Cmd::Up {
            timeout_seconds,
            node,
        } => up(&dir, Duration::from_secs(timeout_seconds), node),
        Cmd::Down => down(&dir),
        Cmd::Run { node } => run(&dir, node),
    }
}

/// The pid recorded in the pid file, if that process is still alive.
fn running_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(dir.join(PID_FILE)).ok()?.trim().parse().ok()?;
    signal::kill(Pid::from_raw(pid), None).ok().map(|()| pid)
}

/// The node's address from the `ready` file, when the running cluster has a node.
fn ready_node_ip(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(READY_FILE))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(NODE_IP_PREFIX).map(str::to_string))
}

fn up(dir: &Path, timeout: Duration, node: bool) -> Result<()> {
    let kubeconfig = dir.join("admin.kubeconfig");
    if running_pid(dir).is_some() && dir.join(READY_FILE).exists() {
        let node_ip = ready_node_ip(dir);
        if node && node_ip.is_none() {
            bail!(
                "a cluster without a node is running in {}; run `make cluster-down` first",
                dir.display()
            );
        }
        eprintln!("selkie-cluster: already running ({})", dir.display());
        print_usage(&kubeconfig, node_ip.as_deref());
        println!("{}", kubeconfig.display());
        return Ok(());
    }
    if let Some(pid) = running_pid(dir) {
        bail!(
            "a cluster (pid {pid}) is starting or stuck in {}; run `selkie-cluster down` first",
            dir.display()
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = fs::remove_file(dir.join(READY_FILE));
    let log_path = dir.join(LOG_FILE);
    let log = fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("locating selkie-cluster")?;
    let mut command = Command::new(exe);
    command.arg("--dir").arg(dir).arg("run");
    if node {
        command.arg("--node");
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: the terminal's Ctrl-C and the shell's exit do not reach it.
        .process_group(0)
        .spawn()
        .context("starting `selkie-cluster run` in the background")?;
    if node {
        eprintln!(
            "selkie-cluster: starting etcd, kube-apiserver and a node (containerd, kubelet, kube-proxy, \
             kube-scheduler, kube-controller-manager, CoreDNS; log: {})",
            log_path.display()
        );
    } else {
        eprintln!(
            "selkie-cluster: starting etcd and kube-apiserver (log: {})",
            log_path.display()
        );
    }
    let deadline = Instant::now() + timeout;
    let mut said_waiting = false;
    loop {
        if dir.join(READY_FILE).exists() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the cluster failed to start ({status}):\n{}", log.trim_end());
        }
        if node && !said_waiting {
            // The node waits (up to 15 minutes) while another process's node holds the machine.
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(line) = log
                .lines()
                .find(|l| l.contains("waiting for the node of another process"))
            {
                eprintln!("{line}");
                said_waiting = true;
            }
        }
        if Instant::now() >= deadline {
            // SIGTERM, not SIGKILL: a node stops its pods only when `run` unwinds.
            let _ = signal::kill(Pid::from_raw(child.id() as i32), signal::Signal::SIGTERM);
            let stop_deadline = Instant::now() + STOP_TIMEOUT;
            while child.try_wait()?.is_none() && Instant::now() < stop_deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = child.kill();
            bail!(
                "the cluster was not ready after {timeout:?}; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("selkie-cluster: ready; stop it with `make cluster-down`");
    print_usage(&kubeconfig, ready_node_ip(dir).as_deref());
    println!("{}", kubeconfig.display());
    Ok(())
}

/// How to use the running cluster, on stderr (stdout's last line is the kubeconfig path).
fn print_usage(kubeconfig: &Path, node_ip: Option<&str>) {
    match node_ip {
        Some(ip) => {
            eprintln!(
                "selkie-cluster: node {} at {ip} (NodePorts and the kubelet listen there; kube-apiserver \
                 too, on the kubeconfig's port)",
                selkie_e2e::node::NODE_NAME
            );
            eprintln!(
                "selkie-cluster: try `KUBECONFIG={} kubectl get nodes -o wide`",
                kubeconfig.display()
            );
        }
        None => eprintln!(
            "selkie-cluster: try `KUBECONFIG={} kubectl get namespaces`",
            kubeconfig.display()
        ),
    }
}

fn down(dir: &Path) -> Result<()> {
    let Some(pid) = running_pid(dir) else {
        eprintln!("selkie-cluster: no cluster is running in {}", dir.display());
        return Ok(());
    };
    signal::kill(Pid::from_raw(pid), signal::Signal::SIGTERM).context("signalling the cluster")?;
    let deadline = Instant::now() + STOP_TIMEOUT;
    while running_pid(dir) == Some(pid) {
        if Instant::now() >= deadline {
            let _ = signal::kill(Pid::from_raw(pid), signal::Signal::SIGKILL);
            bail!(
                "the cluster (pid {pid}) did not stop within {STOP_TIMEOUT:?} and was killed; a node's \
                 containers may still run until the next node starts and sweeps them"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("selkie-cluster: stopped");
    Ok(())
}

fn run(dir: &Path, node: bool) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        fs::create_dir_all(dir)?;
        fs::write(dir.join(PID_FILE), std::process::id().to_string())?;
        let result = serve(dir, node).await;
        let _ = fs::remove_file(dir.join(READY_FILE));
        let _ = fs::remove_file(dir.join(PID_FILE));
        result
    })
}

async fn serve(dir: &Path, node: bool) -> Result<()> {
    use tokio::signal::unix::{signal as on, SignalKind};
    let mut terminate = on(SignalKind::terminate())?;
    let mut interrupt = on(SignalKind::interrupt())?;
    let mut builder = Cluster::builder().dir(dir);
    if node {
        // A fresh etcd: the last run's Node, pods and Deployment statuses would otherwise look
        // Ready to the node's readiness check before this run's kubelet has reported anything.
        match fs::remove_dir_all(dir.join("etcd-data")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).context("removing the last run's etcd-data");
            }
            _ => {}
        }
        builder = builder.node();
    }
    let cluster = tokio::select! {
        cluster = builder.start() => cluster?,
        _ = terminate.recv() => return Ok(()),
        _ = interrupt.recv() => return Ok(()),
    };
    let mut ready = format!("{}\n", cluster.admin_kubeconfig().display());
    match cluster.node() {
        None => eprintln!(
            "kube-apiserver v{} ready at {} after {:.1}s",
            cluster.kubernetes_version(),
            cluster.server_url(),
            cluster.started_in().as_secs_f64()
        ),
        Some(node) => {
            eprintln!(
                "kube-apiserver v{} at {} and node {} at {} ready after {:.1}s (any wait for another \
                 node included)",
                cluster.kubernetes_version(),
                cluster.server_url(),
                selkie_e2e::node::NODE_NAME,
                node.ip(),
                cluster.started_in().as_secs_f64()
            );
            ready.push_str(&format!("{NODE_IP_PREFIX}{}\n", node.ip()));
        }
    }
    // Whole or not at all: `up` reads it as soon as it exists.
    let partial = dir.join(format!("{READY_FILE}.partial"));
    fs::write(&partial, ready)?;
    fs::rename(&partial, dir.join(READY_FILE))?;
    tokio::select! {
        _ = terminate.recv() => {},
        _ = interrupt.recv() => {},
    }
    eprintln!("stopping");
    cluster.stop();
    Ok(())
}
