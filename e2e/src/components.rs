//! The real components' binaries, built from their published Go modules.

use std::{collections::HashMap, path::PathBuf, process::Command, sync::OnceLock};

use crate::HarnessError;

/// The build script, run from the source tree this crate was compiled from.
pub const BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/build-components.sh");

/// Paths of the component binaries and the versions they were built at.
#[derive(Debug, Clone)]
pub struct Components {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kubectl`, the same version as the apiserver.
    pub kubectl: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `dex`, the OIDC provider.
    pub dex: PathBuf,
    /// Keycloak's start script `kc.sh` (an OIDC provider with token revocation).
    pub keycloak: PathBuf,
    /// The JDK Keycloak runs on (21 or newer).
    pub keycloak_java_home: PathBuf,
    /// `helm`, which renders and installs the chart in `conf/helm/selkie/`.
    pub helm: PathBuf,
    /// The helm version, without the leading `v`.
    pub helm_version: String,
    /// `selkie-oauth2-client`, built from `e2e/oauth2-client/`: golang.org/x/oauth2 (the OAuth
    /// library of the pinniped CLI) redeeming a code and refreshing ([`crate::oauth2_go`]).
    pub oauth2_client: PathBuf,
    /// The Kubernetes version, without the leading `v` (for example `1.35.4`).
    pub kubernetes_version: String,
    /// The etcd version, without the leading `v`.
    pub etcd_version: String,
}

static COMPONENTS: OnceLock<Result<Components, String>> = OnceLock::new();

impl Components {
    /// Returns the components, running `scripts/build-components.sh` the first time it is called in
    /// this process. The script is idempotent and caches its builds outside the repository (keyed
    /// by version), so a warm call costs a second; a cold one builds for many minutes.
    ///
    /// Fails with [`HarnessError::Build`] carrying the script's explanation, and keeps returning
    /// that failure for the rest of the process instead of rebuilding.
    pub fn get() -> Result<&'static Components, HarnessError> {
        COMPONENTS
            .get_or_init(|| build().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| HarnessError::Build {
                command: format!("bash {BUILD_SCRIPT} all"),
                status: "failed earlier in this process".into(),
                tail: e.clone(),
            })
    }
}

fn build() -> Result<Components, HarnessError> {
    let command = format!("bash {BUILD_SCRIPT} all");
    let output = Command::new("bash")
        .arg(BUILD_SCRIPT)
        .arg("all")
        .output()
        .map_err(|e| HarnessError::io(format!("running `{command}`"), e))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(HarnessError::Build {
            command,
            status: output.status.to_string(),
            tail: tail_lines(&String::from_utf8_lossy(&output.stderr), 40),
        });
    }
    let values: HashMap<&str, &str> = stdout.lines().filter_map(|line| line.split_once('=')).collect();
    let get = |key: &str| {
        values
            .get(key)
            .map(|v| v.to_string())
            .ok_or_else(|| HarnessError::Build {
                command: command.clone(),
                status: format!("succeeded but did not print `{key}=`"),
                tail: tail_lines(&stdout, 20),
            })
    };
    let kube_bin = PathBuf::from(get("kubernetes")?);
    let etcd_bin = PathBuf::from(get("etcd")?);
    let dex_bin = PathBuf::from(get("dex")?);
    let keycloak_bin = PathBuf::from(get("keycloak")?);
    let helm_bin = PathBuf::from(get("helm")?);
    let oauth2_client_bin = PathBuf::from(get("oauth2-client")?);
    let components = Components {
        kube_apiserver: kube_bin.join("kube-apiserver"),
        kubectl: kube_bin.join("kubectl"),
        etcd: etcd_bin.join("etcd"),
        dex: dex_bin.join("dex"),
        keycloak: keycloak_bin.join("kc.sh"),
        keycloak_java_home: PathBuf::from(get("keycloak_java_home")?),
        helm: helm_bin.join("helm"),
        helm_version: get("helm_version")?,
        oauth2_client: oauth2_client_bin.join("selkie-oauth2-client"),
        kubernetes_version: get("kubernetes_version")?,
        etcd_version: get("etcd_version")?,
    };
    for path in [
        &components.kube_apiserver,
        &components.kubectl,
        &components.etcd,
        &components.dex,
        &components.keycloak,
        &components.keycloak_java_home.join("bin/java"),
        &components.helm,
        &components.oauth2_client,
    ] {
        if !path.is_file() {
            return Err(HarnessError::Build {
                command,
                status: format!("succeeded but {} is missing", path.display()),
                tail: String::new(),
            });
        }
    }
    Ok(components)
}

/// The last `n` lines of `text`.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
