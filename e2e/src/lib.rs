//! # selkie-e2e
//!
//! The ground every Selkie test stands on: real components, started by the project's own code, on
//! loopback only.
//!
//! * [`components`] builds (once, cached outside the repository) and locates kube-apiserver,
//!   kubectl and etcd from their published Go modules (`scripts/build-components.sh`).
//! * [`pki`] generates the cluster's PKI: serving CA and certificate, the cluster client CA whose
//!   key tests use as the cluster signing key, the front-proxy CA and client certificate, and the
//!   service-account signing key. Client certificates carry one `O=` per group.
//! * [`cluster`] starts etcd and kube-apiserver with RBAC and the aggregation flags, waits for
//!   `/readyz`, and hands back an admin kubeconfig, `kube::Client`s and the CA material. It stops
//!   every process on drop and on panic; components die with the test process even when it is
//!   killed, because each is spawned with a parent-death signal.
//! * [`node`] joins a real node to a cluster ([`ClusterBuilder::node`]): containerd with runc and
//!   a CNI bridge, the kubelet, kube-proxy, CoreDNS, kube-scheduler, and kube-controller-manager as
//!   a kubeadm-shaped static pod; one per machine.
//! * [`images`] builds the node's images and Selkie's (from the `Containerfile`) with buildah,
//!   without pulling (`scripts/build-images.sh`); [`load_balancer`] is haproxy in front of a
//!   node's Services.
//! * [`kubectl`] runs the real kubectl against a cluster; [`helm`] the real helm, for the chart
//!   `conf/helm/selkie`.
//! * [`dex`] runs Dex, the real OIDC provider, with static users and the password grant, or with
//!   its LDAP connector on a [`ldap::Slapd`].
//! * [`echo_api`] serves a small aggregated API on loopback, registered through an APIService,
//!   that echoes over WebSocket and SPDY/3.1 upgrades and records who kube-apiserver said called.
//! * [`proxy`] runs Selkie's impersonation proxy (`selkie-concierge`) in front of a cluster.
//! * [`supervisor`] runs Selkie's Supervisor (`selkie-supervisor`) with a FederationDomain and an
//!   OIDCIdentityProvider for a [`dex::Dex`].
//! * [`pinniped_cli`] speaks to the Supervisor's OAuth endpoints as Pinniped's CLI does with the
//!   `cli_password` flow: login, refresh and token exchange.
//! * [`oauth2_go`] runs golang.org/x/oauth2, the pinniped CLI's OAuth library, with its defaults
//!   (`e2e/oauth2-client/`): it redeems a code and refreshes at the Supervisor, and reports how.
//! * [`concierge`] installs the Concierge from `conf/` and runs it, control plane included, with
//!   its service account's permissions.
//! * [`watch`] observes that an object is *not* written (a watch that fails at the first write),
//!   instead of sleeping and then looking.
//! * [`bench`](mod@bench) is what the benchmark binaries share: CPU time from `/proc`, the wait
//!   for a quiet machine, re-measuring disturbed phases, concurrent clients, kube-apiserver's
//!   request counts.
//!
//! Every wait has a timeout, and every failure is one [`HarnessError`] that names the component,
//! the command and the tail of its log.

pub mod bench;
pub mod browser;
pub mod clock;
pub mod cluster;
pub mod components;
pub mod concierge;
pub mod crds;
pub mod dex;
pub mod echo_api;
mod error;
/// The GitHub-API-compatible stand-in (GitHub itself is unreachable from these machines).
pub mod github_api;
pub mod helm;
pub mod images;
pub mod keycloak;
pub mod kubectl;
pub mod ldap;
pub mod load_balancer;
pub mod node;
pub mod oauth2_go;
pub mod pinniped_cli;
pub mod pki;
mod process;
pub mod proxy;
pub mod samba;
pub mod supervisor;
pub mod watch;

pub use cluster::{Cluster, ClusterBuilder};
pub use error::HarnessError;
pub use process::workspace_binary;

/// Installs ring as the process-wide rustls crypto provider, once. Every harness entry point calls
/// it first: kube and pingora both expect ring, and a second provider compiled in would make
/// rustls refuse to pick one.
pub fn install_crypto_provider() {
    // An Err means a provider is already installed, which is exactly the state we want.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

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

/// A free loopback port that this process has not handed out before: bound and released, so
/// another process could still take it before the component binds it (the component then exits
/// and the harness reports it), but two components of one test run never get the same port, as
/// a plain "bind port 0" can give again right after the port is released.
pub fn free_port() -> Result<u16, HarnessError> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let context = "finding a free loopback port";
    for _ in 0..100 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| HarnessError::io(context, e))?
            .port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(port)
        {
            return Ok(port);
        }
    }
    Err(HarnessError::NotReady(format!(
        "{context}: every port offered was handed out before"
    )))
}
