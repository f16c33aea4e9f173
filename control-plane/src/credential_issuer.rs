//! The CredentialIssuer controller: whether the impersonation proxy runs, the Services in front
//! of it, its serving certificate, and the `ImpersonationProxy` strategy in the
//! CredentialIssuer's status — Pinniped's `impersonatorconfig` controller.
//!
//! [`run`] reconciles the CredentialIssuer named `credentialIssuerName` (created with the spec
//! Pinniped's install gives it when missing), the cluster's Nodes (for `mode: auto`), the
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

mod services;
mod spec;
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

use crate::{
    certs::{generate_ca, issue_serving, CertPair},
    config::ControlPlaneConfig,
    published::{Publisher, ServingKeyPair},
};
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

/// `lastUpdateTime` for a strategy written now (whole seconds, as Kubernetes stores them).
pub fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Preference order of strategies in `status.strategies` (Pinniped's weights).
fn strategy_weight(strategy: &Value) -> u8 {
    match strategy.get("type").and_then(Value::as_str) {
        Some("KubeClusterSigningCertificate") => 2,
        Some("ImpersonationProxy") => 1,
        _ => 0,
    }
}

fn without_time(strategy: &Value) -> Value {
    let mut strategy = strategy.clone();
    if let Some(object) = strategy.as_object_mut() {
        object.remove("lastUpdateTime");
    }
    strategy
}

/// `strategies` with `strategy` merged in (Pinniped's `mergeStrategy`): the entry of the same
/// type replaced, others kept, sorted by preference then type. `None` when nothing but
/// `lastUpdateTime` would change.
fn merge_strategy(strategies: &[Value], strategy: Value) -> Option<Vec<Value>> {
    let mut merged = strategies.to_vec();
    match merged.iter_mut().find(|s| s.get("type") == strategy.get("type")) {
        Some(existing) if without_time(existing) == without_time(&strategy) => {}
        Some(existing) => *existing = strategy,
        None => merged.push(strategy),
    }
    merged.sort_by(|a, b| {
        strategy_weight(b).cmp(&strategy_weight(a)).then_with(|| {
            let type_of = |s: &Value| {
                s.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            type_of(a).cmp(&type_of(b))
        })
    });
    (merged != strategies).then_some(merged)
}

/// Replaces the entry of `strategy.type` in the status of the CredentialIssuer
/// `config.credential_issuer_name` (keeping the other entries, in Pinniped's order), writing only
/// when something but `lastUpdateTime` changed. Retries a few times on write conflicts. Does not
/// check leadership: callers write only while they lead.
///
/// Fails when the CredentialIssuer cannot be read or its status written.
pub async fn set_strategy(
    client: &Client,
    config: &ControlPlaneConfig,
    strategy: CredentialIssuerStrategy,
) -> Result<(), CredentialIssuerError> {
    let name = &config.credential_issuer_name;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &config.api_resource::<CredentialIssuer>());
    let status_error = |message: String| CredentialIssuerError::Status {
        name: name.clone(),
        message,
    };
    let entry = serde_json::to_value(&strategy).map_err(|e| status_error(e.to_string()))?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = api
            .get(name)
            .await
            .map_err(|source| CredentialIssuerError::Kube {
                action: format!("reading CredentialIssuer {name}"),
                source,
            })?;
        let strategies = match current.data.get("status").and_then(|s| s.get("strategies")) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(strategies)) => strategies.clone(),
            Some(_) => return Err(status_error("status.strategies is not a list".into())),
        };
        let Some(merged) = merge_strategy(&strategies, entry.clone()) else {
            return Ok(());
        };
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "status": {"strategies": merged},
        });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.is_conflict() && attempt < 5 => continue,
            Err(source) => {
                return Err(CredentialIssuerError::Kube {
                    action: format!("writing the status of CredentialIssuer {name}"),
                    source,
                })
            }
        }
    }
}

/// What the Node watch knows about control-plane Nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NodeState {
    /// The first list has not completed.
    Unknown,
    /// Listing Nodes failed before any list completed.
    Error(String),
    /// The Nodes were listed.
    Known {
        /// Whether there is any Node.
        any: bool,
        /// Whether any Node has a control-plane role label.
        control_plane: bool,
    },
}

/// Whether a Node label marks a control-plane Node (Pinniped's `isControlPlaneNodeRole`).
fn is_control_plane_label(key: &str, value: &str) -> bool {
    key == "node-role.kubernetes.io/control-plane"
        || key == "node-role.kubernetes.io/master"
        || (key == "kubernetes.io/node-role" && (value == "control-plane" || value == "master"))
}

fn is_control_plane_node(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|labels| labels.iter().any(|(k, v)| is_control_plane_label(k, v)))
}

/// Wakes `notify` on every change a watch reports, until the watch ends.
async fn trigger_on<S, K>(events: S, notify: Arc<Notify>, what: &'static str)
where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => notify.notify_one(),
            Ok(Event::Init | Event::InitApply(_)) => {}
            Err(error) => tracing::warn!(%error, "watching {what} for the CredentialIssuer controller"),
        }
    }
}

/// Keeps `state` up to date with the Nodes' control-plane labels, waking `notify` when it changes.
async fn watch_nodes(client: Client, state: watch::Sender<NodeState>, notify: Arc<Notify>) {
    let events = watcher(
        Api::<PartialObjectMeta<Node>>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    let mut events = std::pin::pin!(events);
    let mut nodes: BTreeMap<String, bool> = BTreeMap::new();
    let mut listing: BTreeMap<String, bool> = BTreeMap::new();
    let mut listed = false;
    while let Some(event) = events.next().await {
        let name_and_role = |meta: &ObjectMeta| {
            (
                meta.name.clone().unwrap_or_default(),
                is_control_plane_node(meta.labels.as_ref()),
            )
        };
        match event {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(node)) => {
                let (name, role) = name_and_role(&node.metadata);
                listing.insert(name, role);
                continue;
            }
            Ok(Event::InitDone) => {
                nodes = std::mem::take(&mut listing);
                listed = true;
            }
            Ok(Event::Apply(node)) => {
                let (name, role) = name_and_role(&node.metadata);
                nodes.insert(name, role);
            }
            Ok(Event::Delete(node)) => {
                nodes.remove(&node.metadata.name.unwrap_or_default());
            }
            Err(error) => {
                tracing::warn!(%error, "watching Nodes for the CredentialIssuer controller");
                if !listed {
                    let message = format!("error fetching nodes: {error}");
                    if state.send_if_modified(|s| replace(s, NodeState::Error(message))) {
                        notify.notify_one();
                    }
                }
                continue;
            }
        }
        if !listed {
            continue;
        }
        let known = NodeState::Known {
            any: !nodes.is_empty(),
            control_plane: nodes.values().any(|role| *role),
        };
        if state.send_if_modified(|s| replace(s, known)) {
            notify.notify_one();
        }
    }
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
    };
    let mut leader_open = true;
    loop {
        let leading = *leader.borrow_and_update();
        reconciler.sync(leading).await;
        tokio::select! {
            () = notify.notified() => {}
            changed = leader.changed(), if leader_open => leader_open = changed.is_ok(),
            () = tokio::time::sleep(RESYNC) => {}
            Some(_) = watches.join_next() => return Err(CredentialIssuerError::WatchEnded("a watched resource")),
        }
        tokio::time::sleep(COALESCE).await;
    }
}

/// A failed sync: the `Error` strategy's reason and message.
#[derive(Debug)]
struct SyncError {
    reason: StrategyReason,
    message: String,
}

impl From<String> for SyncError {
    fn from(message: String) -> Self {
        Self {
            reason: StrategyReason::ErrorDuringSetup,
            message,
        }
    }
}

impl From<kube::Error> for SyncError {
    /// Pinniped's `strategyReasonForError`: conflicts and already-exists errors are expected
    /// while two replicas race, so they are Pending; the message is the API's (Go's
    /// `err.Error()`).
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => Self {
                reason: if status.is_conflict() || status.is_already_exists() {
                    StrategyReason::Pending
                } else {
                    StrategyReason::ErrorDuringSetup
                },
                message: status.message,
            },
            other => other.to_string().into(),
        }
    }
}

/// The outcome of a successful sync.
struct Synced {
    strategy: CredentialIssuerStrategy,
    serving: Option<ServingKeyPair>,
}

struct Reconciler {
    client: Client,
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    nodes: watch::Receiver<NodeState>,
    issuers: Api<DynamicObject>,
    services: Api<Service>,
    secrets: Api<Secret>,
}

fn strategy(status: StrategyStatus, reason: StrategyReason, message: &str) -> CredentialIssuerStrategy {
    CredentialIssuerStrategy {
        r#type: StrategyType::ImpersonationProxy,
        status,
        reason,
        message: message.into(),
        last_update_time: now(),
        frontend: None,
    }
}

fn secret_string(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

impl Reconciler {
    /// One pass: read everything, write what differs (leader), publish, report.
    async fn sync(&self, leading: bool) {
        let name = &self.config.credential_issuer_name;
        let issuer = match self.issuers.get_opt(name).await {
            Ok(Some(issuer)) => issuer,
            Ok(None) => {
                if leading {
                    self.create_issuer().await;
                }
                return;
            }
            Err(error) => {
                tracing::warn!(%error, credential_issuer = %name, "reading the CredentialIssuer");
                return;
            }
        };
        let strategy = match self.do_sync(&issuer, leading).await {
            Ok(synced) => {
                self.publisher
                    .update(|published| replace(&mut published.proxy_serving, synced.serving));
                synced.strategy
            }
            Err(error) => {
                tracing::warn!(reason = ?error.reason, message = %error.message, "impersonation proxy configuration");
                strategy(StrategyStatus::Error, error.reason, &error.message)
            }
        };
        if leading {
            if let Err(error) = set_strategy(&self.client, &self.config, strategy).await {
                tracing::warn!(%error, "writing the ImpersonationProxy strategy");
            }
        }
    }

    async fn create_issuer(&self) {
        let name = &self.config.credential_issuer_name;
        let mut issuer = DynamicObject::new(name, &self.config.api_resource::<CredentialIssuer>())
            .data(json!({ "spec": default_spec() }));
        issuer.metadata.labels = Some(self.config.labels.clone());
        match self.issuers.create(&PostParams::default(), &issuer).await {
            Ok(_) => {
                tracing::info!(credential_issuer = %name, "created the CredentialIssuer with the default spec")
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(error) => tracing::warn!(%error, credential_issuer = %name, "creating the CredentialIssuer"),
        }
    }

    /// Pinniped's `doSync`: the strategy and what to serve, or why not.
    async fn do_sync(&self, issuer: &DynamicObject, leading: bool) -> Result<Synced, SyncError> {
        let Some(raw) = issuer.data.get("spec").and_then(|s| s.get("impersonationProxy")) else {
            return Err("could not load CredentialIssuer: spec.impersonationProxy is nil"
                .to_string()
                .into());
        };
        let invalid =
            |message: String| format!("could not load CredentialIssuer spec.impersonationProxy: {message}");
        let spec: ImpersonationProxySpec =
            serde_json::from_value(raw.clone()).map_err(|e| invalid(e.to_string()))?;
        spec::validate(&spec).map_err(invalid)?;

        let enabled = match spec.mode {
            ImpersonationProxyMode::Enabled => true,
            ImpersonationProxyMode::Disabled => false,
            ImpersonationProxyMode::Auto => !self.has_control_plane_nodes().await?,
        };
        let service_type = spec.service.r#type;
        if leading {
            let lb = load_balancer_service_name(&self.config);
            let cip = cluster_ip_service_name(&self.config);
            if enabled && service_type == ImpersonationProxyServiceType::LoadBalancer {
                self.ensure_service(&spec, lb, "LoadBalancer").await?;
            } else {
                self.ensure_service_removed(&lb).await?;
            }
            if enabled && service_type == ImpersonationProxyServiceType::ClusterIP {
                self.ensure_service(&spec, cip, "ClusterIP").await?;
            } else {
                self.ensure_service_removed(&cip).await?;
            }
        }

        let desired = self.desired_name(&spec).await?;
        let (ca_bundle, serving) = if enabled {
            match &spec.tls {
                Some(tls) => self.external_tls(tls, leading).await?,
                None => self.generated_tls(desired.as_ref(), leading).await?,
            }
        } else {
            if leading {
                self.ensure_tls_secret_removed().await?;
            }
            (None, None)
        };

        let result = if spec.mode == ImpersonationProxyMode::Disabled {
            strategy(
                StrategyStatus::Error,
                StrategyReason::Disabled,
                "impersonation proxy was explicitly disabled by configuration",
            )
        } else if !enabled {
            strategy(
                StrategyStatus::Error,
                StrategyReason::Disabled,
                "automatically determined that impersonation proxy should be disabled",
            )
        } else if let Some(desired) = &desired {
            let mut listening = strategy(
                StrategyStatus::Success,
                StrategyReason::Listening,
                "impersonation proxy is ready to accept client connections",
            );
            listening.frontend = Some(CredentialIssuerFrontend {
                r#type: FrontendType::ImpersonationProxy,
                token_credential_request_api_info: None,
                impersonation_proxy_info: Some(ImpersonationProxyInfo {
                    endpoint: format!("https://{}", desired.client_endpoint),
                    certificate_authority_data: base64::engine::general_purpose::STANDARD
                        .encode(ca_bundle.unwrap_or_default()),
                }),
            });
            listening
        } else {
            strategy(
                StrategyStatus::Error,
                StrategyReason::Pending,
                "waiting for load balancer Service to be assigned IP or hostname",
            )
        };
        Ok(Synced {
            strategy: result,
            serving: if enabled && desired.is_some() {
                serving
            } else {
                None
            },
        })
    }

    /// Whether a Node has a control-plane role (waiting up to 10 s for the first list).
    async fn has_control_plane_nodes(&self) -> Result<bool, SyncError> {
        let mut nodes = self.nodes.clone();
        let state = tokio::time::timeout(
            Duration::from_secs(10),
            nodes.wait_for(|state| *state != NodeState::Unknown),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|state| state.clone());
        match state {
            Some(NodeState::Known { any: false, .. }) => Err("no nodes found".to_string().into()),
            Some(NodeState::Known { control_plane, .. }) => Ok(control_plane),
            Some(NodeState::Error(message)) => Err(message.into()),
            Some(NodeState::Unknown) | None => Err("error fetching nodes: timed out".to_string().into()),
        }
    }

    async fn ensure_service(
        &self,
        spec: &ImpersonationProxySpec,
        name: String,
        type_: &str,
    ) -> Result<(), SyncError> {
        let load_balancer_ip = (type_ == "LoadBalancer")
            .then(|| spec.service.load_balancer_ip.clone())
            .flatten();
        let desired = services::desired(
            &self.config,
            name.clone(),
            type_,
            load_balancer_ip,
            &spec.service.annotations,
        );
        match self.services.get_opt(&name).await? {
            None => {
                tracing::info!(service = %name, "creating the impersonation proxy's {type_} Service");
                self.services.create(&PostParams::default(), &desired).await?;
            }
            Some(existing) => {
                if let Some(updated) = services::updated(&existing, &desired) {
                    tracing::info!(service = %name, "updating the impersonation proxy's {type_} Service");
                    self.services
                        .replace(&name, &PostParams::default(), &updated)
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn ensure_service_removed(&self, name: &str) -> Result<(), SyncError> {
        if let Some(existing) = self.services.get_opt(name).await? {
            tracing::info!(service = %name, "deleting the impersonation proxy's Service");
            delete_exact(&self.services, name, &existing.metadata).await?;
        }
        Ok(())
    }

    async fn ensure_tls_secret_removed(&self) -> Result<(), SyncError> {
        let name = tls_secret_name(&self.config);
        if let Some(existing) = self.secrets.get_opt(&name).await? {
            tracing::info!(secret = %name, "deleting the impersonation proxy's generated serving certificate");
            delete_exact(&self.secrets, &name, &existing.metadata).await?;
        }
        Ok(())
    }

    /// Pinniped's `findDesiredTLSCertificateName`: `None` while waiting for an address.
    async fn desired_name(&self, spec: &ImpersonationProxySpec) -> Result<Option<DesiredName>, SyncError> {
        if let Some(endpoint) = spec.external_endpoint.as_deref().filter(|e| !e.is_empty()) {
            // Validated already.
            let parsed = spec::parse_endpoint(endpoint, spec::DEFAULT_HTTPS_PORT)?;
            let client_endpoint = parsed.client_endpoint();
            return Ok(Some(match parsed.host.parse::<IpAddr>() {
                Ok(ip) => DesiredName {
                    ips: vec![ip],
                    hostname: None,
                    client_endpoint,
                },
                Err(_) => DesiredName {
                    ips: vec![],
                    hostname: Some(parsed.host),
                    client_endpoint,
                },
            }));
        }
        if spec.service.r#type == ImpersonationProxyServiceType::ClusterIP {
            let Some(service) = self
                .services
                .get_opt(&cluster_ip_service_name(&self.config))
                .await?
            else {
                return Ok(None);
            };
            let spec = service.spec.unwrap_or_default();
            let Some(ip) = spec.cluster_ip.filter(|ip| !ip.is_empty()) else {
                return Ok(None);
            };
            let ips = match spec.cluster_ips.filter(|ips| !ips.is_empty()) {
                Some(ips) => ips,
                None => vec![ip.clone()],
            };
            let ips = ips.iter().filter_map(|ip| ip.parse().ok()).collect();
            return Ok(Some(DesiredName {
                ips,
                hostname: None,
                client_endpoint: ip,
            }));
        }
        let name = load_balancer_service_name(&self.config);
        let Some(service) = self.services.get_opt(&name).await? else {
            return Ok(None);
        };
        let ingresses = service
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default();
        let first_is_empty = ingresses.first().is_none_or(|i| {
            i.hostname.as_deref().unwrap_or_default().is_empty()
                && i.ip.as_deref().unwrap_or_default().is_empty()
        });
        if first_is_empty {
            return Ok(None);
        }
        if let Some(hostname) = ingresses
            .iter()
            .filter_map(|i| i.hostname.clone())
            .find(|h| !h.is_empty())
        {
            return Ok(Some(DesiredName {
                ips: vec![],
                hostname: Some(hostname.clone()),
                client_endpoint: hostname,
            }));
        }
        if let Some((ip, parsed)) = ingresses
            .iter()
            .filter_map(|i| i.ip.clone())
            .find_map(|ip| ip.parse::<IpAddr>().ok().map(|parsed| (ip, parsed)))
        {
            return Ok(Some(DesiredName {
                ips: vec![parsed],
                hostname: None,
                client_endpoint: ip,
            }));
        }
        Err(format!(
            "could not find valid IP addresses or hostnames from load balancer {}/{name}",
            self.config.namespace
        )
        .into())
    }

    /// The generated serving CA, created by the leader when missing; `None` for a follower
    /// before the leader created it.
    async fn serving_ca(&self, leading: bool) -> Result<Option<CertPair>, SyncError> {
        let name = ca_secret_name(&self.config);
        if let Some(secret) = self.secrets.get_opt(&name).await? {
            let (Some(cert_pem), Some(key_pem)) = (
                secret_string(&secret, CA_CRT_KEY),
                secret_string(&secret, CA_KEY_KEY),
            ) else {
                return Err(format!("the Secret {name} has no PEM {CA_CRT_KEY} and {CA_KEY_KEY}").into());
            };
            return Ok(Some(CertPair { cert_pem, key_pem }));
        }
        if !leading {
            return Ok(None);
        }
        let ca = generate_ca(SERVING_CA_COMMON_NAME, CERT_LIFETIME)
            .map_err(|e| format!("could not create impersonation CA: {e}"))?;
        let secret = Secret {
            metadata: self.metadata(&name),
            data: Some(BTreeMap::from([
                (
                    CA_CRT_KEY.to_string(),
                    ByteString(ca.cert_pem.clone().into_bytes()),
                ),
                (
                    CA_KEY_KEY.to_string(),
                    ByteString(ca.key_pem.clone().into_bytes()),
                ),
            ])),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        tracing::info!(secret = %name, "creating the impersonation proxy's serving CA");
        self.secrets.create(&PostParams::default(), &secret).await?;
        Ok(Some(ca))
    }

    fn metadata(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(self.config.namespace.clone()),
            labels: Some(self.config.labels.clone()),
            ..ObjectMeta::default()
        }
    }

    /// Pinniped's `ensureCAAndTLSSecrets`: the CA bundle to advertise and the serving pair.
    async fn generated_tls(
        &self,
        desired: Option<&DesiredName>,
        leading: bool,
    ) -> Result<(Option<Vec<u8>>, Option<ServingKeyPair>), SyncError> {
        let Some(ca) = self.serving_ca(leading).await? else {
            return Ok((None, None));
        };
        let bundle = Some(ca.cert_pem.clone().into_bytes());
        let name = tls_secret_name(&self.config);
        if let Some(secret) = self.secrets.get_opt(&name).await? {
            let cert_pem = secret_string(&secret, TLS_CRT_KEY).unwrap_or_default();
            let key_pem = secret_string(&secret, TLS_KEY_KEY).unwrap_or_default();
            if tls::generated_cert_fits(&cert_pem, &key_pem, &ca.cert_pem, desired) {
                return Ok((bundle, Some(ServingKeyPair { cert_pem, key_pem })));
            }
            if !leading {
                return Ok((bundle, None));
            }
            tracing::info!(secret = %name, "the impersonation proxy's serving certificate no longer fits; replacing it");
            delete_exact(&self.secrets, &name, &secret.metadata).await?;
        }
        let (Some(desired), true) = (desired, leading) else {
            return Ok((bundle, None));
        };
        let pair = issue_serving(&ca, &desired.sans(), CERT_LIFETIME)
            .map_err(|e| format!("could not create impersonation cert: {e}"))?;
        let secret = Secret {
            metadata: self.metadata(&name),
            data: Some(BTreeMap::from([
                (
                    TLS_CRT_KEY.to_string(),
                    ByteString(pair.cert_pem.clone().into_bytes()),
                ),
                (
                    TLS_KEY_KEY.to_string(),
                    ByteString(pair.key_pem.clone().into_bytes()),
                ),
            ])),
            type_: Some("kubernetes.io/tls".into()),
            ..Secret::default()
        };
        tracing::info!(secret = %name, names = ?desired.sans(), "issuing the impersonation proxy's serving certificate");
        self.secrets.create(&PostParams::default(), &secret).await?;
        Ok((
            bundle,
            Some(ServingKeyPair {
                cert_pem: pair.cert_pem,
                key_pem: pair.key_pem,
            }),
        ))
    }

    /// Pinniped's `evaluateExternallyProvidedTLSSecret`.
    async fn external_tls(
        &self,
        tls: &ImpersonationProxyTLSSpec,
        leading: bool,
    ) -> Result<(Option<Vec<u8>>, Option<ServingKeyPair>), SyncError> {
        let Some(secret_name) = tls.secret_name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(
                "must provide impersonationSpec.TLS.secretName if impersonationSpec.TLS is provided"
                    .to_string()
                    .into(),
            );
        };
        if leading {
            self.ensure_tls_secret_removed().await.map_err(|e| SyncError {
                message: format!(
                    "unable to remove generated TLS secret with name {}: {}",
                    tls_secret_name(&self.config),
                    e.message
                ),
                ..e
            })?;
        }
        let load_error = |message: String| {
            format!(
                "could not load the externally provided TLS secret for the impersonation proxy: {message}"
            )
        };
        let secret = match self.secrets.get_opt(secret_name).await? {
            Some(secret) => secret,
            None => return Err(load_error(format!("secrets {secret_name:?} not found")).into()),
        };
        let cert_pem = secret_string(&secret, TLS_CRT_KEY).unwrap_or_default();
        let key_pem = secret_string(&secret, TLS_KEY_KEY).unwrap_or_default();
        tls::check_key_pair(&cert_pem, &key_pem)
            .map_err(|e| load_error(format!("could not parse TLS cert PEM data from Secret: {e}")))?;
        let mut bundle = None;
        if let Some(ca) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(CA_CRT_KEY))
            .filter(|ca| !ca.0.is_empty())
        {
            if !tls::is_pem_certificate(&ca.0) {
                return Err(
                    load_error("unable to read provided ca.crt: data is not a certificate".into()).into(),
                );
            }
            bundle = Some(ca.0.clone());
        }
        if let Some(data) = tls
            .certificate_authority_data
            .as_deref()
            .filter(|d| !d.is_empty())
        {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| {
                    format!("could not decode impersonationSpec.TLS.certificateAuthorityData: {e}")
                })?;
            if !tls::is_pem_certificate(&decoded) {
                return Err("could not decode impersonationSpec.TLS.certificateAuthorityData: data is not a certificate"
                    .to_string()
                    .into());
            }
            bundle = Some(decoded);
        }
        // Pinniped would advertise an empty bundle here, which the CRD's minLength refuses, so
        // its status would never be written; say why instead.
        if bundle.is_none() {
            return Err(load_error(format!(
                "the Secret {secret_name:?} has no {CA_CRT_KEY} and impersonationSpec.TLS.certificateAuthorityData \
                 is empty, so there is no CA bundle to advertise"
            ))
            .into());
        }
        Ok((bundle, Some(ServingKeyPair { cert_pem, key_pem })))
    }
}

/// Deletes `name` only if it is still the object `meta` describes (same UID and resource
/// version); already gone counts as deleted.
async fn delete_exact<K>(api: &Api<K>, name: &str, meta: &ObjectMeta) -> Result<(), SyncError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
