//! `selkie-cluster`: the test control plane (etcd + kube-apiserver) for humans.
//!
//! * `selkie-cluster up` starts it in the background and prints the admin kubeconfig path as its
//!   last line; running it again while the cluster is up prints the same path.
//! * `selkie-cluster down` stops it.
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
#[command(about = "A real etcd + kube-apiserver on loopback, for Selkie development")]
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
    },
    /// Stop the cluster started by `up`.
    Down,
    /// Run the cluster in the foreground until SIGTERM or SIGINT.
    Run,
}

const PID_FILE: &str = "selkie-cluster.pid";
const READY_FILE: &str = "ready";
const LOG_FILE: &str = "selkie-cluster.log";

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = std::path::absolute(&args.dir).with_context(|| format!("resolving {}", args.dir.display()))?;
    match args.command {
        Cmd::Up { timeout_seconds } => up(&dir, Duration::from_secs(timeout_seconds)),
        Cmd::Down => down(&dir),
        Cmd::Run => run(&dir),
    }
}

/// The pid recorded in the pid file, if that process is still alive.
fn running_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(dir.join(PID_FILE)).ok()?.trim().parse().ok()?;
    signal::kill(Pid::from_raw(pid), None).ok().map(|()| pid)
}

fn up(dir: &Path, timeout: Duration) -> Result<()> {
    let kubeconfig = dir.join("admin.kubeconfig");
    if running_pid(dir).is_some() && dir.join(READY_FILE).exists() {
        eprintln!("selkie-cluster: already running ({})", dir.display());
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
    let mut child = Command::new(exe)
        .arg("--dir")
        .arg(dir)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: the terminal's Ctrl-C and the shell's exit do not reach it.
        .process_group(0)
        .spawn()
        .context("starting `selkie-cluster run` in the background")?;
    eprintln!(
        "selkie-cluster: starting etcd and kube-apiserver (log: {})",
        log_path.display()
    );
    let deadline = Instant::now() + timeout;
    loop {
        if dir.join(READY_FILE).exists() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the cluster failed to start ({status}):\n{}", log.trim_end());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            bail!(
                "the cluster was not ready after {timeout:?}; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("selkie-cluster: ready; stop it with `make cluster-down`");
    eprintln!(
        "selkie-cluster: try `KUBECONFIG={} kubectl get namespaces`",
        kubeconfig.display()
    );
    println!("{}", kubeconfig.display());
    Ok(())
}

fn down(dir: &Path) -> Result<()> {
    let Some(pid) = running_pid(dir) else {
        eprintln!("selkie-cluster: no cluster is running in {}", dir.display());
        return Ok(());
    };
    signal::kill(Pid::from_raw(pid), signal::Signal::SIGTERM).context("signalling the cluster")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while running_pid(dir) == Some(pid) {
        if Instant::now() >= deadline {
            let _ = signal::kill(Pid::from_raw(pid), signal::Signal::SIGKILL);
            bail!("the cluster (pid {pid}) did not stop within 30s and was killed");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("selkie-cluster: stopped");
    Ok(())
}

fn run(dir: &Path) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        fs::create_dir_all(dir)?;
        fs::write(dir.join(PID_FILE), std::process::id().to_string())?;
        let result = serve(dir).await;
        let _ = fs::remove_file(dir.join(READY_FILE));
        let _ = fs::remove_file(dir.join(PID_FILE));
        result
    })
}

async fn serve(dir: &Path) -> Result<()> {
    use tokio::signal::unix::{signal as on, SignalKind};
    let mut terminate = on(SignalKind::terminate())?;
    let mut interrupt = on(SignalKind::interrupt())?;
    let cluster = tokio::select! {
        cluster = Cluster::builder().dir(dir).start() => cluster?,
        _ = terminate.recv() => return Ok(()),
        _ = interrupt.recv() => return Ok(()),
    };
    eprintln!(
        "kube-apiserver v{} ready at {} after {:.1}s",
        cluster.kubernetes_version(),
        cluster.server_url(),
        cluster.started_in().as_secs_f64()
    );
    fs::write(
        dir.join(READY_FILE),
        cluster.admin_kubeconfig().display().to_string(),
    )?;
    tokio::select! {
        _ = terminate.recv() => {},
        _ = interrupt.recv() => {},
    }
    eprintln!("stopping");
    cluster.stop();
    Ok(())
}
