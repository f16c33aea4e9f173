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
mod faults_abuse;
mod faults_apiserver;
mod faults_churn;
mod faults_credentials;
mod faults_idp;
mod faults_signer;
mod harness_failures;
mod harness_lifecycle;
mod helm_chart;
mod jwt_dex;
mod ldap_directory;
mod migration;
mod node;
mod node_concierge;
mod node_supervisor;
mod proxy_bad_input;
mod proxy_certificates;
mod proxy_kubectl;
mod proxy_login;
mod proxy_nested;
mod proxy_operations;
mod proxy_reload;
mod proxy_service_accounts;
mod proxy_upgrades;
mod proxy_watch;
mod rbac_client_cert;
mod resources;
mod supervisor_active_directory;
mod supervisor_callback;
mod supervisor_device;
mod supervisor_dpop;
mod supervisor_full;
mod supervisor_github;
mod supervisor_install;
mod supervisor_keys;
mod supervisor_ldap;
mod supervisor_legacy;
mod supervisor_login;
mod supervisor_multi_idp;
mod supervisor_oauth;
mod supervisor_oauth2_go;
mod supervisor_oidc_client;
mod supervisor_revocation;
mod supervisor_rp;
mod supervisor_saml;
mod supervisor_session_terms;
mod supervisor_sessions;
mod supervisor_shutdown;
mod supervisor_sni;
mod supervisor_transforms;
mod token_review;
mod x509_identity;

pub use selkie_e2e::eventually;

/// `error` with a component's `log` after it. The failure comes first, so a report that keeps
/// only the beginning and the end of a long output (as CI's summary does) still says what failed;
/// `anyhow`'s own `context` would print the log first and the cause last.
fn with_log(error: impl Into<anyhow::Error>, log: String) -> anyhow::Error {
    let error = error.into();
    anyhow::anyhow!("{error:#}\n--- log ---\n{log}")
}
