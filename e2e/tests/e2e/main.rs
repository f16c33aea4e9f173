//! End-to-end tests against real components. One test binary: every module shares the cluster of
//! `Cluster::shared()` and isolates itself with its own namespace and uniquely named objects;
//! tests of the harness's own start-up and shutdown start private clusters.

mod aggregation;
mod cli_oidc;
mod cli_static;
mod cluster_basics;
mod concierge_aggregated_api;
mod concierge_authenticators;
mod concierge_credential_issuer;
mod concierge_kube_cert_agent;
mod concierge_process;
mod crds;
mod harness_failures;
mod harness_lifecycle;
mod jwt_dex;
mod proxy_bad_input;
mod proxy_certificates;
mod proxy_kubectl;
mod proxy_login;
mod proxy_nested;
mod proxy_operations;
mod proxy_reload;
mod proxy_upgrades;
mod proxy_watch;
mod rbac_client_cert;
mod resources;
mod token_review;
mod x509_identity;

/// Polls `check` every 250 ms until it returns `Ok`, or fails with its last error after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: std::time::Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(e.context(format!("still failing after {timeout:?}")))
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
        }
    }
}
