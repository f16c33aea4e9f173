//! Child processes that cannot outlive the test process.
//!
//! Every component is started through `setpriv --pdeathsig KILL`, so the kernel kills it when its
//! parent goes away, however the test process ends (normal exit, panic, SIGKILL). Linux ties the
//! parent-death signal to the *thread* that forked, not the process, and test threads come and go;
//! so all spawning happens on one spawner thread that lives as long as the process.

use std::{
    ffi::OsString,
    fs::File,
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{mpsc, OnceLock},
    thread,
    time::{Duration, Instant},
};

use nix::{sys::signal, unistd::Pid};

use crate::HarnessError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();

fn spawn_on_spawner_thread(command: Command) -> std::io::Result<Child> {
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let spawned = thread::Builder::new()
            .name("selkie-e2e-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // The requester may have given up; nothing to do then.
                    let _ = reply.send(command.spawn());
                }
            });
        if let Err(e) = spawned {
            // Without the thread every request below fails with a clear error instead.
            eprintln!("selkie-e2e: cannot start the spawner thread: {e}");
        }
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread did not answer"))?
}

/// A running component with its log file. Stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub(crate) struct ManagedProcess {
    name: String,
    command_line: String,
    log_path: PathBuf,
    child: Child,
}

impl ManagedProcess {
    /// Starts `program args` with stdout and stderr appended to `log_path`.
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[OsString],
        log_path: PathBuf,
    ) -> Result<Self, HarnessError> {
        Self::spawn_with_environment(name, program, args, log_path, &[])
    }

    /// [`ManagedProcess::spawn`] with `environment` added to the harness's own.
    pub(crate) fn spawn_with_environment(
        name: &str,
        program: &Path,
        args: &[OsString],
        log_path: PathBuf,
        environment: &[(OsString, OsString)],
    ) -> Result<Self, HarnessError> {
        let command_line = std::iter::once(program.as_os_str())
            .chain(args.iter().map(OsString::as_os_str))
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| HarnessError::io(format!("opening the {name} log {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| HarnessError::io(format!("duplicating the {name} log handle"), e))?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .envs(environment.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = spawn_on_spawner_thread(command).map_err(|e| HarnessError::Component {
            component: name.to_string(),
            problem: format!("could not be started: {e} (is util-linux's `setpriv` installed?)"),
            command: command_line.clone(),
            log: log_path.clone(),
            tail: String::new(),
        })?;
        Ok(Self {
            name: name.to_string(),
            command_line,
            log_path,
            child,
        })
    }

    /// The exit status, if the process has ended.
    pub(crate) fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Builds the error for this component: `problem` plus its command line and log tail.
    pub(crate) fn failure(&self, problem: impl Into<String>) -> HarnessError {
        HarnessError::Component {
            component: self.name.clone(),
            problem: problem.into(),
            command: self.command_line.clone(),
            log: self.log_path.clone(),
            tail: log_tail(&self.log_path, 25),
        }
    }

    /// Fails with the exit status and log tail if the process has already ended.
    pub(crate) fn check_running(&mut self, during: &str) -> Result<(), HarnessError> {
        match self.exit_status() {
            Some(status) => Err(self.failure(format!("exited {during} with {status}"))),
            None => Ok(()),
        }
    }

    /// Sends SIGTERM (what Kubernetes does to a pod it stops) and returns at once; `false` when
    /// the process had already ended.
    pub(crate) fn send_sigterm(&mut self) -> bool {
        self.terminate()
    }

    /// Waits up to `timeout` for the process to exit and returns how it ended; fails with the log
    /// tail if it is still running then.
    pub(crate) async fn wait_for_exit(&mut self, timeout: Duration) -> Result<ExitStatus, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(self.failure(format!("still running {timeout:?} later")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asks the process to stop with SIGTERM and waits up to `grace`; then kills it.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if !self.terminate() {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// [`stop`](Self::stop) without blocking the runtime's thread while it waits (for tests that
    /// stop a component while their own load keeps running on the same thread).
    pub(crate) async fn stop_async(&mut self, grace: Duration) {
        if !self.terminate() {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM; `false` when the process had already ended.
    fn terminate(&mut self) -> bool {
        if self.exit_status().is_some() {
            return false;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = signal::kill(Pid::from_raw(pid), signal::Signal::SIGTERM);
        }
        true
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// The last `lines` lines of a log file (reads at most its last 64 KiB).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(crate::components::tail_lines(
            &String::from_utf8_lossy(&bytes),
            lines,
        ))
    };
    read().unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
}

/// Builds the binary `bin` of the workspace package `package` from this source tree with the
/// cargo that runs the tests (a no-op when it is up to date) and returns its path. Each binary is
/// built once per process; a failed build is a [`HarnessError::Build`] with cargo's output, and
/// stays failed for the rest of the process. With `SELKIE_E2E_RELEASE=1` (benchmarks) the
/// release profile is built instead. A benchmark comparing builds (another commit's binary, as a
/// "before") names one with `SELKIE_E2E_BINARY_<BIN>` (`bin` upper-cased, `-` as `_`): that file
/// is used as it is, nothing is built.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf, HarnessError> {
    let chosen = format!("SELKIE_E2E_BINARY_{}", bin.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&chosen) {
        return Ok(PathBuf::from(path));
    }
    static BUILT: std::sync::Mutex<Vec<(String, Result<PathBuf, String>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let result = match built.iter().find(|(name, _)| name == bin) {
        Some((_, result)) => result.clone(),
        None => {
            let result = cargo_build(package, bin);
            built.push((bin.to_string(), result.clone()));
            result
        }
    };
    result.map_err(|tail| HarnessError::Build {
        command: format!("cargo build -p {package} --bin {bin}"),
        status: "failed".into(),
        tail,
    })
}

fn cargo_build(package: &str, bin: &str) -> Result<PathBuf, String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Benchmarks (`perf/`) measure release builds: SELKIE_E2E_RELEASE=1.
    let release = std::env::var_os("SELKIE_E2E_RELEASE").is_some_and(|value| value == "1");
    let output = Command::new(&cargo)
        .current_dir(&workspace)
        .args(["build", "--locked", "-p", package, "--bin", bin])
        .args(release.then_some("--release"))
        .args(["--message-format", "json-render-diagnostics"])
        .output()
        .map_err(|e| format!("running cargo build: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|message| {
            (message["target"]["name"] == bin)
                .then(|| message["executable"].as_str().map(PathBuf::from))
                .flatten()
        })
        .ok_or_else(|| format!("cargo build did not report the {bin} executable"))
}
