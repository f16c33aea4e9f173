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
mod ldap_directory;
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
mod supervisor_active_directory;
mod supervisor_callback;
mod supervisor_full;
mod supervisor_install;
mod supervisor_keys;
mod supervisor_ldap;
mod supervisor_legacy;
mod supervisor_login;
mod supervisor_multi_idp;
mod supervisor_oauth;
mod supervisor_oidc_client;
mod supervisor_revocation;
mod supervisor_rp;
mod supervisor_sessions;
mod supervisor_sni;
mod supervisor_transforms;
mod token_review;
mod x509_identity;

pub use selkie_e2e::eventually;
