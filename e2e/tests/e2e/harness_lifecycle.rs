//! The harness leaves nothing behind: components stop when a cluster is dropped, when its test
//! panics, when `selkie-cluster down` runs, and even when the owning process is SIGKILLed.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use nix::{sys::signal, unistd::Pid};
use selkie_e2e::{components::Components, Cluster};

use crate::eventually;

const SELKIE_CLUSTER: &str = env!("CARGO_BIN_EXE_selkie-cluster");

/// Whether `pid` is a live process (a zombie counts as dead: it runs nothing).
fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}

/// Direct children of `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

async fn all_gone(pids: &[u32]) -> anyhow::Result<()> {
    eventually(Duration::from_secs(15), || async {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| is_alive(*p)).collect();
        anyhow::ensure!(alive.is_empty(), "still running: {alive:?}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn dropping_a_cluster_stops_etcd_and_kube_apiserver() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let pids = cluster.pids();
    let dir = cluster.dir().to_path_buf();
    assert!(
        pids.iter().all(|p| is_alive(*p)),
        "both components must be running: {pids:?}"
    );
    drop(cluster);
    all_gone(&pids).await?;
    assert!(
        !dir.exists(),
        "the temporary directory {} must be removed",
        dir.display()
    );
    Ok(())
}

#[tokio::test]
async fn a_panicking_test_still_stops_its_cluster() -> anyhow::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let cluster = Cluster::start().await.unwrap();
            tx.send(cluster.pids()).unwrap();
            panic!("a test failed while holding its cluster");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread must have panicked");
    let pids = rx.recv()?;
    all_gone(&pids).await
}

#[tokio::test]
async fn cluster_up_prints_a_working_kubeconfig_and_down_stops_everything() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let up = Command::new(SELKIE_CLUSTER)
        .arg("--dir")
        .arg(dir.path())
        .arg("up")
        .output()?;
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let kubeconfig = stdout.lines().last().unwrap_or_default().trim().to_string();
    assert!(
        Path::new(&kubeconfig).is_file(),
        "the last line must be the kubeconfig path, got {stdout:?}"
    );

    let kubectl = selkie_e2e::kubectl::Kubectl::new(&Components::get()?.kubectl, Path::new(&kubeconfig));
    let namespaces = kubectl.run(&["get", "namespaces", "-o", "name"]).await?;
    assert!(namespaces.contains("namespace/default"), "{namespaces}");

    // `up` again is harmless and prints the same path.
    let again = Command::new(SELKIE_CLUSTER)
        .arg("--dir")
        .arg(dir.path())
        .arg("up")
        .output()?;
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).lines().last(),
        Some(kubeconfig.as_str())
    );

    let daemon: u32 = std::fs::read_to_string(dir.path().join("selkie-cluster.pid"))?
        .trim()
        .parse()?;
    let mut pids = children_of(daemon);
    assert_eq!(
        pids.len(),
        2,
        "etcd and kube-apiserver should be the daemon's children: {pids:?}"
    );
    pids.push(daemon);

    let down = Command::new(SELKIE_CLUSTER)
        .arg("--dir")
        .arg(dir.path())
        .arg("down")
        .output()?;
    assert!(
        down.status.success(),
        "down failed: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    all_gone(&pids).await?;
    let after = kubectl
        .output(&["get", "namespaces", "--request-timeout=3s"], None)
        .await?;
    assert!(!after.success, "the apiserver must be gone after down");
    Ok(())
}

#[tokio::test]
async fn components_die_with_their_owner_even_when_it_is_killed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut owner = Command::new(SELKIE_CLUSTER)
        .arg("--dir")
        .arg(dir.path())
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let ready = dir.path().join("ready");
    let started = eventually(Duration::from_secs(120), || async {
        anyhow::ensure!(ready.exists(), "{} does not exist yet", ready.display());
        Ok(())
    })
    .await;
    if let Err(e) = started {
        let _ = owner.kill();
        return Err(e);
    }
    let pids = children_of(owner.id());
    assert_eq!(
        pids.len(),
        2,
        "etcd and kube-apiserver should be children of the owner: {pids:?}"
    );

    // No chance to clean up: the kernel's parent-death signal must take the components down.
    signal::kill(Pid::from_raw(i32::try_from(owner.id())?), signal::Signal::SIGKILL)?;
    owner.wait()?;
    all_gone(&pids).await
}
