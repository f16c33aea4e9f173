//! Installing CustomResourceDefinitions the way every test does it: `kubectl apply
//! --server-side` with one field manager (so concurrent and repeated applies agree), then
//! waiting until each CRD is Established.

use std::path::PathBuf;

use tokio::sync::OnceCell;

use crate::{Cluster, HarnessError};

/// The field manager of the tests' CRD applies.
pub const FIELD_MANAGER: &str = "selkie-e2e-crds";

/// `conf/crds/` of this checkout: the generated CRDs as users apply them.
pub fn conf_crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conf/crds")
}

/// Applies the CRDs of `source` (`["-f", <dir or file>]`, or `["-f", "-"]` with the documents in
/// `stdin`) server-side and waits up to 60 s until each is Established. Returns the applied
/// objects' names as kubectl printed them (`customresourcedefinition.apiextensions.k8s.io/…`).
pub async fn apply(
    cluster: &Cluster,
    source: &[&str],
    stdin: Option<&str>,
) -> Result<Vec<String>, HarnessError> {
    let kubectl = cluster.kubectl();
    let mut args = vec![
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        FIELD_MANAGER,
    ];
    args.extend_from_slice(source);
    let applied = kubectl.run_with_stdin(&args, stdin).await?;
    let names: Vec<String> = applied
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    wait.extend(names.iter().map(String::as_str));
    kubectl.run(&wait).await?;
    Ok(names)
}

/// Applies `conf/crds/` to `cluster` once per test process and cluster (every later call for the
/// same cluster waits for that first one and shares its result). Discovery of the new kinds may
/// lag a moment behind the Established condition, so the first use of a kind should retry.
pub async fn install_conf_crds(cluster: &Cluster) -> Result<(), HarnessError> {
    type Once = std::sync::Arc<OnceCell<Result<(), String>>>;
    static INSTALLED: std::sync::Mutex<Vec<(String, Once)>> = std::sync::Mutex::new(Vec::new());
    let once: Once = {
        let mut installed = INSTALLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let server = cluster.server_url().to_string();
        match installed.iter().find(|(url, _)| *url == server) {
            Some((_, once)) => once.clone(),
            None => {
                let once = Once::default();
                installed.push((server, once.clone()));
                once
            }
        }
    };
    once.get_or_init(|| async {
        let dir = conf_crds_dir();
        apply(cluster, &["-f", &dir.to_string_lossy()], None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
    .clone()
    .map_err(|e| HarnessError::NotReady(format!("installing conf/crds: {e}")))
}

/// The status condition `type_` of a resource read as JSON (`kubectl get -o json`):
/// `status.conditions[]` with that `type`, `Null` when there is none.
pub fn condition<'a>(resource: &'a serde_json::Value, type_: &str) -> &'a serde_json::Value {
    resource["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_))
        .unwrap_or(&serde_json::Value::Null)
}
