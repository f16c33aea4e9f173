//! The CredentialIssuer controller: whether the impersonation proxy runs, the Services in front
//! of it, its serving certificate, and the `ImpersonationProxy` strategy in the
//! CredentialIssuer's status — Pinniped's `impersonatorconfig` controller.
//!
//! [`run`] reconciles the CredentialIssuer named `credentialIssuerName` (created with the spec
//! Pinniped's install gives it when it has been missing for 10 s: installers such as Helm create
//! it after the Deployment), the cluster's Nodes (for `mode: auto`), the
//! proxy's Services and the Secrets of the Concierge's namespace:
//!
//! * **Mode.** `enabled`, `disabled`, or `auto`: enabled iff no Node carries a control-plane role
//!   label (`node-role.kubernetes.io/control-plane`, `node-role.kubernetes.io/master`,
//!   `kubernetes.io/node-role=control-plane|master`). Unlike Pinniped, Nodes are only consulted
//!   in `auto` mode (Pinniped fails every mode with "no nodes found" on a cluster without Nodes).
//! * **Services.** `service.type: LoadBalancer` → `<prefix>-impersonation-proxy-load-balancer`,
//!   `ClusterIP` → `<prefix>-impersonation-proxy-cluster-ip` (port 443 → the proxy's port,
//!   `loadBalancerIP`, the spec's annotations tracked in
//!   `credentialissuer.pinniped.dev/annotation-keys` so that keys dropped from the spec are
//!   removed and keys other actors added stay), `None` → no Service. A disabled proxy has none.
//!   Selkie's extension `service.loadBalancerSourceRanges` (CIDRs, validated) becomes the
//!   LoadBalancer Service's own; when the spec does not name it the Service's is left alone.
//! * **Serving certificate.** A generated CA ("Selkie Impersonation Proxy Serving CA", Secret
//!   `<prefix>-impersonation-proxy-ca-certificate`) signs an ECDSA P-256 certificate (Secret
//!   `<prefix>-impersonation-proxy-tls-serving-certificate`) for the endpoint: the
//!   `externalEndpoint` host, else the load balancer's ingress hostname or IP, else the
//!   ClusterIP(s). It is re-issued whenever it stops matching (other name, other CA, unreadable).
//!   `tls.secretName` (a `kubernetes.io/tls` Secret) replaces it; then the advertised CA is
//!   `tls.certificateAuthorityData`, else the Secret's `ca.crt` (one of them is required: the
//!   status cannot advertise an empty bundle).
//! * **Status.** The `ImpersonationProxy` strategy with Pinniped's reasons and messages,
//!   merged into `status.strategies` by [`set_strategy`].
//! * **Published.** [`crate::published::Published::proxy_serving`] is the serving certificate
//!   and key while the proxy is enabled and its endpoint known, `None` otherwise. An invalid spec
//!   or a failed step reports an `Error` strategy and leaves Services, Secrets and what is
//!   published as they were.
//!
//! Only the leader writes (the CredentialIssuer, its status, Services, Secrets); every replica
//! reads the Secrets and publishes the serving certificate the leader stored.

mod nodes;
mod reconciler;
mod services;
mod spec;
mod strategies;
mod tls;

use std::{collections::BTreeMap, net::IpAddr, sync::Arc, time::Duration};

use base64::Engine as _;
use futures::{Stream, StreamExt};
use k8s_openapi::{
    api::core::v1::{Node, Secret, Service},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    ByteString,
};
use kube::{
    api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions},
    core::PartialObjectMeta,
    runtime::{
        watcher::{self, watcher, Event},
        WatchStreamExt,
    },
    Client,
};
use selkie_api::concierge_config::{
    CredentialIssuer, CredentialIssuerFrontend, CredentialIssuerSpec, CredentialIssuerStrategy, FrontendType,
    ImpersonationProxyInfo, ImpersonationProxyMode, ImpersonationProxyServiceSpec,
    ImpersonationProxyServiceType, ImpersonationProxySpec, ImpersonationProxyTLSSpec, StrategyReason,
    StrategyStatus, StrategyType,
};
use serde_json::{json, Value};
use tokio::{
    sync::{watch, Notify},
    task::JoinSet,
};

use selkie_kube::certs::{generate_ca, issue_serving, CertPair};

use crate::{
    config::ControlPlaneConfig,
    published::{Publisher, ServingKeyPair},
};
use nodes::*;
use reconciler::*;
pub use strategies::{now, set_strategy};
use tls::DesiredName;

/// The common name of the generated serving CA.
pub const SERVING_CA_COMMON_NAME: &str = "Selkie Impersonation Proxy Serving CA";

/// The annotation Pinniped's install puts in the default CredentialIssuer's
/// `spec.impersonationProxy.service.annotations` (`deploy/concierge/values.yaml`), with the
/// value `"4000"`: AWS load balancers then keep idle connections (watches) for 4000 s.
pub const AWS_IDLE_TIMEOUT_ANNOTATION: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";

/// How long the generated CA and serving certificates are valid (Pinniped: about 100 years).
const CERT_LIFETIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How often everything is re-checked without any event.
const RESYNC: Duration = Duration::from_secs(60);

/// How long a burst of events is gathered into one sync.
const COALESCE: Duration = Duration::from_millis(25);

const CA_CRT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";
const TLS_CRT_KEY: &str = "tls.crt";
const TLS_KEY_KEY: &str = "tls.key";

/// The name of the Secret holding the generated serving CA (`ca.crt`, `ca.key`).
pub fn ca_secret_name(config: &ControlPlaneConfig) -> String {
    config.name("impersonation-proxy-ca-certificate")
}

/// The name of the `kubernetes.io/tls` Secret holding the generated serving certificate.
pub fn tls_secret_name(config: &ControlPlaneConfig) -> String {
    config.name("impersonation-proxy-tls-serving-certificate")
}

/// The name of the LoadBalancer Service in front of the proxy.
pub fn load_balancer_service_name(config: &ControlPlaneConfig) -> String {
    services::load_balancer_name(config)
}

/// The name of the ClusterIP Service in front of the proxy.
pub fn cluster_ip_service_name(config: &ControlPlaneConfig) -> String {
    services::cluster_ip_name(config)
}

/// The spec Pinniped's install gives the CredentialIssuer (`deploy/concierge/deployment.yaml`
/// with the default `values.yaml`): `mode: auto`, a LoadBalancer Service annotated with
/// [`AWS_IDLE_TIMEOUT_ANNOTATION`]` = "4000"`. [`run`] creates the CredentialIssuer with it
/// when it is missing.
pub fn default_spec() -> CredentialIssuerSpec {
    CredentialIssuerSpec {
        impersonation_proxy: ImpersonationProxySpec {
            mode: ImpersonationProxyMode::Auto,
            service: ImpersonationProxyServiceSpec {
                r#type: ImpersonationProxyServiceType::LoadBalancer,
                load_balancer_ip: None,
                annotations: BTreeMap::from([(AWS_IDLE_TIMEOUT_ANNOTATION.to_string(), "4000".to_string())]),
                load_balancer_source_ranges: None,
            },
            external_endpoint: None,
            tls: None,
        },
    }
}

/// Why [`set_strategy`] or [`run`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialIssuerError {
    /// A call to kube-apiserver failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// The CredentialIssuer's status could not be read or written as JSON.
    #[error("the status of CredentialIssuer {name} cannot be used: {message}")]
    Status {
        /// The CredentialIssuer.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// One of the watches [`run`] depends on stopped.
    #[error("the watch of {0} ended")]
    WatchEnded(&'static str),
}

fn replace<T: PartialEq>(slot: &mut T, value: T) -> bool {
    if *slot == value {
        false
    } else {
        *slot = value;
        true
    }
}

/// Reconciles the CredentialIssuer `config.credential_issuer_name` and the impersonation
/// proxy's Services and Secrets in `config.namespace` (see the module documentation), and
/// publishes `proxy_serving` through `publisher`, until the returned future is dropped. Writes
/// only while `*leader.borrow()` is true (a closed `leader` channel keeps its last value).
///
/// Every event of the CredentialIssuer, the namespace's Services and Secrets, the Nodes'
/// control-plane labels and leadership triggers a sync, as does a timer every minute. Sync
/// failures are reported in the strategy and logged, never returned; an `Err` means one of the
/// watches ended, which they do not while the client lives.
pub async fn run(
    client: Client,
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    mut leader: watch::Receiver<bool>,
) -> Result<(), CredentialIssuerError> {
    let notify = Arc::new(Notify::new());
    let (node_state, nodes) = watch::channel(NodeState::Unknown);
    let issuers: Api<DynamicObject> =
        Api::all_with(client.clone(), &config.api_resource::<CredentialIssuer>());
    let mut watches = JoinSet::new();
    watches.spawn(trigger_on(
        watcher(
            Api::<PartialObjectMeta<DynamicObject>>::all_with(
                client.clone(),
                &config.api_resource::<CredentialIssuer>(),
            ),
            watcher::Config::default().fields(&format!("metadata.name={}", config.credential_issuer_name)),
        )
        .default_backoff(),
        notify.clone(),
        "the CredentialIssuer",
    ));
    watches.spawn(trigger_on(
        watcher(
            Api::<PartialObjectMeta<Service>>::namespaced(client.clone(), &config.namespace),
            watcher::Config::default(),
        )
        .default_backoff(),
        notify.clone(),
        "Services",
    ));
    watches.spawn(trigger_on(
        watcher(
            Api::<PartialObjectMeta<Secret>>::namespaced(client.clone(), &config.namespace),
            watcher::Config::default(),
        )
        .default_backoff(),
        notify.clone(),
        "Secrets",
    ));
    watches.spawn(watch_nodes(client.clone(), node_state, notify.clone()));

    let reconciler = Reconciler {
        issuers,
        services: Api::namespaced(client.clone(), &config.namespace),
        secrets: Api::namespaced(client.clone(), &config.namespace),
        client,
        config,
        publisher,
        nodes,
        missing_since: std::sync::Mutex::new(None),
    };
    let mut leader_open = true;
    loop {
        let leading = *leader.borrow_and_update();
        let again = reconciler.sync(leading).await;
        tokio::select! {
            () = notify.notified() => {}
            changed = leader.changed(), if leader_open => leader_open = changed.is_ok(),
            () = tokio::time::sleep(again.unwrap_or(RESYNC)) => {}
            Some(_) = watches.join_next() => return Err(CredentialIssuerError::WatchEnded("a watched resource")),
        }
        tokio::time::sleep(COALESCE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{strategies::*, *};

    fn entry(type_: &str, message: &str, time: &str) -> Value {
        json!({"type": type_, "status": "Success", "reason": "Listening", "message": message, "lastUpdateTime": time})
    }

    #[test]
    fn strategies_merge_by_type_in_pinnipeds_order() {
        let proxy = entry("ImpersonationProxy", "a", "2026-01-01T00:00:00Z");
        let merged = merge_strategy(&[], proxy.clone()).unwrap();
        assert_eq!(merged, std::slice::from_ref(&proxy));
        // Only the time differs: no write.
        assert_eq!(
            merge_strategy(&merged, entry("ImpersonationProxy", "a", "2026-02-02T00:00:00Z")),
            None
        );
        let key = entry("KubeClusterSigningCertificate", "k", "2026-01-01T00:00:00Z");
        let merged = merge_strategy(&merged, key.clone()).unwrap();
        assert_eq!(merged, [key.clone(), proxy.clone()]);
        let unknown = entry("SomethingElse", "x", "2026-01-01T00:00:00Z");
        let changed = entry("ImpersonationProxy", "b", "2026-01-01T00:00:00Z");
        let merged = merge_strategy(&[unknown.clone(), proxy, key.clone()], changed.clone()).unwrap();
        assert_eq!(merged, [key, changed, unknown]);
    }

    #[test]
    fn control_plane_labels_are_pinnipeds() {
        assert!(is_control_plane_label(
            "node-role.kubernetes.io/control-plane",
            ""
        ));
        assert!(is_control_plane_label("node-role.kubernetes.io/master", ""));
        assert!(is_control_plane_label("kubernetes.io/node-role", "control-plane"));
        assert!(is_control_plane_label("kubernetes.io/node-role", "master"));
        assert!(!is_control_plane_label("kubernetes.io/node-role", "worker"));
        assert!(!is_control_plane_label("node-role.kubernetes.io/worker", ""));
    }

    #[test]
    fn the_default_spec_is_pinnipeds_install() {
        let spec = serde_json::to_value(default_spec()).unwrap();
        assert_eq!(
            spec,
            json!({"impersonationProxy": {
                "mode": "auto",
                "service": {
                    "type": "LoadBalancer",
                    "annotations": {"service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout": "4000"},
                },
            }})
        );
    }
}
