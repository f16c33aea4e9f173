//! The real helm (built with the other components), run with configuration, cache and data
//! directories of its own, against a cluster's kubeconfig — for the chart tests, the node tests
//! and the node demo, which all install `conf/helm/selkie` ([`chart_dir`]).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{ensure, Context as _};

use crate::components::Components;

/// How long one helm invocation may take.
const HELM_TIMEOUT: Duration = Duration::from_secs(360);

/// The repository's `conf/` directory.
pub fn conf_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conf")
}

/// Selkie's chart, `conf/helm/selkie`.
pub fn chart_dir() -> String {
    conf_dir().join("helm/selkie").to_string_lossy().into_owned()
}

/// What one helm invocation did.
#[derive(Debug)]
pub struct HelmOutput {
    /// Whether helm exited with 0.
    pub success: bool,
    /// Its exit status, for messages.
    pub status: String,
    /// What it wrote on stdout.
    pub stdout: String,
    /// What it wrote on stderr.
    pub stderr: String,
}

/// The real helm with configuration, cache and data directories of its own (removed on drop),
/// talking to the cluster of `kubeconfig` (none: rendering only).
pub struct Helm {
    binary: PathBuf,
    home: tempfile::TempDir,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    /// A helm for the cluster of `kubeconfig`; fails when the components are not built.
    pub fn new(kubeconfig: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Self {
            binary: Components::get()?.helm.clone(),
            home: tempfile::Builder::new().prefix("selkie-helm-").tempdir()?,
            kubeconfig: kubeconfig.map(Path::to_path_buf),
        })
    }

    /// A directory for the caller's files (values, renderings), removed with this.
    pub fn dir(&self) -> &Path {
        self.home.path()
    }

    /// Runs `helm <args>` and returns what it did, whatever its exit status; fails only when helm
    /// cannot be started or runs longer than 6 minutes (it is killed).
    pub async fn output(&self, args: &[&str]) -> anyhow::Result<HelmOutput> {
        let home = self.home.path();
        let kubeconfig = self
            .kubeconfig
            .clone()
            .unwrap_or_else(|| home.join("no-cluster.kubeconfig"));
        let child = tokio::process::Command::new(&self.binary)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let output = tokio::time::timeout(HELM_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| format!("helm {} did not exit within {HELM_TIMEOUT:?}", args.join(" ")))??;
        Ok(HelmOutput {
            success: output.status.success(),
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Runs `helm <args>` and returns its stdout; a non-zero exit is an error carrying stderr.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = self.output(args).await?;
        ensure!(
            output.success,
            "helm {} failed ({}):\n{}",
            args.join(" "),
            output.status,
            output.stderr
        );
        Ok(output.stdout)
    }

    /// Runs `helm <args>`, which must fail with every one of `needles` in its output (helm lint
    /// reports on stdout, the other commands on stderr).
    pub async fn refused(&self, args: &[&str], needles: &[&str]) -> anyhow::Result<()> {
        let output = self.output(args).await?;
        ensure!(
            !output.success,
            "helm {} succeeded; it should have failed naming {needles:?}:\n{}",
            args.join(" "),
            output.stdout
        );
        let said = format!("{}{}", output.stdout, output.stderr);
        for needle in needles {
            ensure!(
                said.contains(needle),
                "helm {} failed without naming {needle:?}:\n{said}",
                args.join(" "),
            );
        }
        Ok(())
    }
}
