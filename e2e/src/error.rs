use std::path::PathBuf;

/// Everything that can go wrong while building, starting or talking to the real components.
///
/// Messages are complete on their own: a component failure names the component, the command line
/// it ran and the tail of its log, so a failing test explains itself without a second look.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A component failed to start, exited, or did not become ready in time.
    #[error(
        "{component} {problem}\n  command: {command}\n  log: {log}\n--- last lines of its log ---\n{tail}"
    )]
    Component {
        /// Which component: `etcd`, `kube-apiserver`, ...
        component: String,
        /// What went wrong, as a sentence fragment ("exited during start-up with exit status: 1").
        problem: String,
        /// The command line that started it.
        command: String,
        /// Where its full log is.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },
    /// `scripts/build-components.sh` failed; its output says which build and why.
    #[error(
        "building the real components failed: `{command}` {status}\n--- last lines of its output ---\n{tail}"
    )]
    Build {
        /// The script invocation.
        command: String,
        /// How it ended.
        status: String,
        /// The tail of what it printed.
        tail: String,
    },
    /// The shared cluster of this test binary failed to start earlier; the message is that failure.
    #[error("the shared test cluster failed to start: {0}")]
    SharedCluster(String),
    /// A file or process operation failed.
    #[error("{context}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Generating a key or certificate failed.
    #[error("generating test PKI failed: {0}")]
    Pki(String),
    /// A Kubernetes API call or client construction failed.
    #[error("{context}")]
    Kube {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A component did not reach the state the harness waited for in time; the message says
    /// which state and what was last seen.
    #[error("{0}")]
    NotReady(String),
    /// Something the harness watched for happened when it must not have (see [`crate::watch`]).
    #[error("{0}")]
    Unexpected(String),
    /// A kubectl invocation failed.
    #[error("kubectl {args} failed ({status})\n--- stderr ---\n{stderr}")]
    Kubectl {
        /// The arguments it ran with.
        args: String,
        /// How it ended.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

impl HarnessError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn kube(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Kube {
            context: context.into(),
            source: source.into(),
        }
    }
}
