//! Child processes and the machine description the runners share: ports, start-up waits,
//! stopping, and what the results files say about the box they ran on.

use std::{
    io::Read as _,
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use nix::{sys::signal::Signal, unistd::Pid};
use serde::Serialize;

/// The trimmed stdout and stderr of `sh -c command`; empty when it cannot run. For descriptions
/// only (versions, CPU model), never for decisions.
pub fn shell(command: &str) -> String {
    Command::new("sh")
        .args(["-c", command])
        .output()
        .map(|out| {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            text.trim().to_string()
        })
        .unwrap_or_default()
}

/// A loopback port that was free a moment ago (bound, read, released).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `address` accepts TCP connections. Fails when `child` (`what`, for the message)
/// exits first or after 15 s.
pub fn wait_for_port(address: SocketAddr, child: &mut Child, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{what} exited ({status}) before listening on {address}");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what} did not listen on {address} within 15 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Sends `signal` to `child`, waits for it to exit (killing it after 10 s) and returns what it
/// wrote to a piped stdout (empty when stdout was not piped).
pub fn stop(mut child: Child, signal: Signal, what: &str) -> anyhow::Result<String> {
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let _ = nix::sys::signal::kill(pid, signal);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            eprintln!("{what} did not stop within 10 s; killing it");
            child.kill()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    let _ = child.wait();
    Ok(out)
}

/// Writes `conf` to `dir/nginx.conf` and starts nginx with it (prefix `dir`, error log
/// `dir/nginx-error.log`) pinned to core 1, as the system under test; returns once `port` accepts
/// connections. Fails when nginx is missing, exits, or does not listen within 15 s.
pub fn start_nginx(dir: &Path, conf: &str, port: u16) -> anyhow::Result<Child> {
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let mut child = Command::new("taskset")
        .args(["-c", "1", "nginx", "-p"])
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .arg("-e")
        .arg(dir.join("nginx-error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting nginx (apt-get install -y nginx-light)")?;
    wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), &mut child, "nginx")?;
    Ok(child)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock watch events carry, the same for every process
/// on the machine (0 if it cannot be read).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The machine a results file was measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `lscpu`'s model name.
    pub cpu_model: String,
    /// Online CPUs and threads per core.
    pub cores: String,
    /// `uname -sr`.
    pub kernel: String,
    /// Total memory (`free -h`).
    pub memory: String,
    /// `rustc --version`.
    pub rustc: String,
    /// `nginx -v`.
    pub nginx: String,
    /// `haproxy -v`, first line.
    pub haproxy: String,
}

impl Machine {
    /// Describes this machine (a few short commands; fields are empty where one fails).
    pub fn describe() -> Self {
        Self {
            cpu_model: shell("lscpu | sed -n 's/^Model name: *//p'"),
            cores: shell(
                "echo \"$(nproc --all) online; $(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s) per core\"",
            ),
            kernel: shell("uname -sr"),
            memory: shell("free -h | awk '/^Mem:/ {print $2}'"),
            rustc: shell("rustc --version"),
            nginx: shell("nginx -v 2>&1"),
            haproxy: shell("haproxy -v 2>&1 | head -1"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound() {
        // The port is free when it is handed out; another test of this binary (they run in
        // parallel) may take the same one before this bind, so one of a few tries must work.
        let bound = (0..5).any(|_| {
            let port = free_port().unwrap();
            assert_ne!(port, 0);
            TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
        assert!(bound, "none of five free ports could be bound");
    }

    #[test]
    fn waiting_for_a_port_fails_when_the_child_exits_first() {
        let port = free_port().unwrap();
        let mut child = Command::new("true").spawn().unwrap();
        let error = wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), &mut child, "true")
            .unwrap_err()
            .to_string();
        assert!(error.contains("true exited"), "{error}");
    }

    #[test]
    fn stop_returns_the_piped_output_of_the_stopped_child() {
        let child = Command::new("sh")
            .args(["-c", "echo started; exec sleep 30"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let out = stop(child, Signal::SIGTERM, "sleep").unwrap();
        assert_eq!(out.trim(), "started");
    }

    #[test]
    fn the_monotonic_clock_advances() {
        let before = monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert!(monotonic_ns() >= before + 2_000_000);
    }
}
