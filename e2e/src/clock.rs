//! A wall clock a test moves: Debian's libfaketime (installed by `e2e/scripts/setup.sh`)
//! preloaded into a component, which reads its offset from a file on every call, so that a test
//! can let hours pass for that component in an instant instead of waiting them out. Only the wall
//! clock moves (`CLOCK_REALTIME`, what token lifetimes and session ends are reckoned in); the
//! monotonic clock that timers and timeouts use does not. Everything else the test talks to
//! (kube-apiserver, the directory, the test itself) keeps the real time.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use crate::HarnessError;

/// Where Debian's libfaketime package puts the library.
const LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// See the module documentation. Starts at the real time; [`TestClock::advance`] moves it on.
pub struct TestClock {
    dir: tempfile::TempDir,
    /// Seconds ahead of the real time.
    ahead: Mutex<u64>,
}

impl TestClock {
    /// A clock at the real time. Fails when libfaketime is not installed.
    pub fn new() -> Result<Self, HarnessError> {
        if !Path::new(LIBRARY).exists() {
            return Err(HarnessError::NotReady(format!(
                "{LIBRARY} is missing: install Debian's libfaketime (e2e/scripts/setup.sh does)"
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("selkie-clock-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the test clock's directory", e))?;
        let clock = Self {
            dir,
            ahead: Mutex::new(0),
        };
        clock.write(0)?;
        Ok(clock)
    }

    /// Moves the clock `by` further ahead, for every process started with it, from their next
    /// reading of the time on.
    pub fn advance(&self, by: Duration) -> Result<(), HarnessError> {
        let mut ahead = self
            .ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *ahead += by.as_secs();
        self.write(*ahead)
    }

    /// The environment that makes a process read this clock.
    pub(crate) fn environment(&self) -> Vec<(OsString, OsString)> {
        [
            ("LD_PRELOAD", OsString::from(LIBRARY)),
            ("FAKETIME_TIMESTAMP_FILE", self.file().into_os_string()),
            // Read the file at every call, so a move shows at once.
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
        .into_iter()
        .map(|(name, value)| (OsString::from(name), value))
        .collect()
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// Writes the offset (libfaketime's relative form: `+<seconds>`) atomically.
    fn write(&self, seconds: u64) -> Result<(), HarnessError> {
        let partial = self.dir.path().join("offset.partial");
        std::fs::write(&partial, format!("+{seconds}\n"))
            .and_then(|()| std::fs::rename(&partial, self.file()))
            .map_err(|e| HarnessError::io("writing the test clock's offset", e))
    }
}
