//! SR: rewriting Selkie's configuration file while a step runs, and counting the reloads Selkie
//! logs.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{launch::Running, Runner};

/// The hot swaps of one SR step.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct HotSwap {
    /// Configuration files written (rename over the old one) during the step.
    pub(crate) swaps_written: u64,
    /// "configuration reloaded" lines Selkie logged during the step.
    pub(crate) reloads_logged: u64,
}

/// SR: what the swapper rewrites and where Selkie's reload lines are counted.
pub(crate) struct Swappable {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    pub(crate) reloads: Arc<AtomicU64>,
}

impl Runner {
    /// SR: `reloads` counted so far (from the pipe, or from the kept log file).
    pub(crate) fn reloads(&self, running: &Running) -> u64 {
        let Some(swappable) = &running.swappable else {
            return 0;
        };
        if running.helper.is_some() {
            return swappable.reloads.load(Ordering::Relaxed);
        }
        std::fs::read_to_string(self.dir.join("selkie-SR.log"))
            .map(|log| log.matches("configuration reloaded").count() as u64)
            .unwrap_or(0)
    }
}

/// SR: rewrites the configuration file every interval while a step runs (a harmless change: a
/// comment with a counter; Selkie re-reads, validates and swaps in the whole configuration).
pub(crate) struct Swapper {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<u64>,
}

impl Swapper {
    pub(crate) fn start(path: PathBuf, text: String, interval: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let temporary = path.with_extension("yaml.next");
            let mut written = 0u64;
            let mut next = Instant::now() + interval;
            loop {
                let wait = next.saturating_duration_since(Instant::now());
                match stopped.recv_timeout(wait) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return written,
                }
                next += interval;
                // Written beside and renamed over, so Selkie never reads half a file.
                let content = format!("{text}# hot swap {}\n", written + 1);
                if std::fs::write(&temporary, content).is_ok() && std::fs::rename(&temporary, &path).is_ok() {
                    written += 1;
                }
            }
        });
        Self { stop, thread }
    }

    pub(crate) fn stop(self) -> u64 {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}
