//! Whether the machine is quiet: before a step, waiting (bounded) until no compiler or other
//! kube-apiserver runs and the CPUs are nearly idle; while it runs, watching for other work.

use std::time::{Duration, Instant};

use selkie_perf::procstat::{load_average, machine_busy, process_tree, processes_named};

use crate::{cli::Args, Runner};

/// Processes that mean someone else is busy on the machine.
const BUSY: [&str; 3] = ["rustc", "kube-apiserver", "cc1"];

/// Compilers and kube-apiservers running, except `ignore` (the K rows' own cluster).
fn busy_processes(ignore: &[u32]) -> Vec<(u32, String)> {
    processes_named(&BUSY)
        .into_iter()
        .filter(|(pid, _)| !ignore.contains(pid))
        .collect()
}

/// Waits (bounded) until no compiler or kube-apiserver runs and the CPUs are nearly idle.
/// Returns (load average at the end, busy share, seconds waited, whether it got quiet).
pub(crate) fn wait_for_quiet(args: &Args, budget: &mut Duration, ignore: &[u32]) -> (f64, f64, f64, bool) {
    let start = Instant::now();
    let limit = args.quiet_wait.min(*budget);
    loop {
        let busy_procs = busy_processes(ignore);
        let busy = machine_busy(Duration::from_secs(5));
        let load = load_average().map(|l| l[0]).unwrap_or(f64::NAN);
        let quiet = busy_procs.is_empty() && busy < args.quiet_busy;
        let waited = start.elapsed();
        if quiet || waited >= limit {
            *budget = budget.saturating_sub(waited);
            if !quiet {
                eprintln!(
                    "  machine not quiet after {:.0} s (busy {:.0} %, {:?}); measuring anyway",
                    waited.as_secs_f64(),
                    busy * 100.0,
                    busy_procs
                );
            }
            return (load, busy, waited.as_secs_f64(), quiet);
        }
        eprintln!(
            "  waiting for a quiet machine: busy {:.0} %, load {load:.2}, running {:?}",
            busy * 100.0,
            busy_procs
                .iter()
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_secs(10));
    }
}

/// Watches, while a step runs, for other work starting on the machine.
pub(crate) struct Interference {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

impl Interference {
    pub(crate) fn watch(ignore: Vec<u32>) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut seen: Vec<String> = Vec::new();
            loop {
                for (_, name) in busy_processes(&ignore) {
                    if !seen.contains(&name) {
                        seen.push(name);
                    }
                }
                match stopped.recv_timeout(Duration::from_secs(1)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return seen,
                }
            }
        });
        Self { stop, thread }
    }

    pub(crate) fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

impl Runner {
    /// Our own processes the quiet check must not count as other work (the K rows' cluster).
    pub(crate) fn own_processes(&self) -> Vec<u32> {
        self.kube
            .as_ref()
            .map(|kube| process_tree(kube.cluster_pid))
            .unwrap_or_default()
    }
}
