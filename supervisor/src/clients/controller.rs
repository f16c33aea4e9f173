//! The OIDCClient reconciler: each OIDCClient checked with its storage Secret ([`validate`]), its
//! status written by the leader (Pinniped's three conditions, `Ready`, `totalClientSecrets`), and
//! the valid ones published as the [`Clients`] table logins read. Runs on the reconciler
//! machinery both servers share ([`selkie_kube::reconcile`]); a change to a storage Secret
//! re-reconciles its OIDCClient.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    api::DynamicObject,
    runtime::{
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
    Api, Client, ResourceExt as _,
};
use selkie_api::supervisor_config::{OIDCClient, OIDCClientStatus, Phase};
use selkie_kube::{
    conditions,
    reconcile::{self, PendingSources, Reconciler, SourceEvent, SourceKind},
};
use tokio::sync::watch;

use super::{dynamic_client, storage_name, validate, validate_secret, Clients, DynamicClient, SECRET_LABEL};
use crate::controller::kind::Kind;
use crate::controller::sources::{typed, ReconcileError};
use crate::session::storage;

/// How often an OIDCClient is looked at again without an event.
const RESYNC: Duration = Duration::from_secs(300);

/// Keeps a [`Clients`] table equal to the valid OIDCClients of the namespace; the leader also
/// writes their statuses.
pub struct ClientController {
    reconciler: ClientReconciler,
    client: Client,
    secrets_writer: reflector::store::Writer<Secret>,
    object_writer: reflector::store::Writer<DynamicObject>,
}

/// What reconciles the OIDCClients (see the module documentation).
struct ClientReconciler {
    kind: Kind,
    namespace: String,
    secrets: Store<Secret>,
    clients: Arc<ArcSwap<Clients>>,
    /// The valid clients by name, as published.
    valid: Mutex<HashMap<String, Arc<DynamicClient>>>,
}

impl ClientController {
    /// A controller of the OIDCClients in `namespace` (of the group under `api_group_suffix`),
    /// serving into `clients`, writing statuses while `leader` is true.
    pub fn new(
        client: Client,
        namespace: &str,
        api_group_suffix: &str,
        clients: Arc<ArcSwap<Clients>>,
        leader: watch::Receiver<bool>,
    ) -> Result<Self, selkie_api::crds::CrdError> {
        let resource = selkie_api::crds::api_resource_with_group_suffix::<OIDCClient>(api_group_suffix)?;
        let (kind, object_writer) = Kind::new(resource, &client, namespace, leader);
        let (secrets, secrets_writer) = reflector::store();
        Ok(Self {
            reconciler: ClientReconciler {
                kind,
                namespace: namespace.to_string(),
                secrets,
                clients,
                valid: Mutex::default(),
            },
            client,
            secrets_writer,
            object_writer,
        })
    }

    /// Runs until dropped: watches OIDCClients and their storage Secrets and reconciles.
    pub async fn run(self) {
        let Self {
            reconciler,
            client,
            secrets_writer,
            object_writer,
        } = self;
        let reconciler = Arc::new(reconciler);
        let pending = Arc::new(PendingSources::default());
        let secrets_api = Api::<Secret>::namespaced(client, &reconciler.namespace);
        let secrets_config =
            watcher::Config::default().labels(&format!("{}={SECRET_LABEL}", storage::TYPE_LABEL));
        let (api, resource, leader) = (
            reconciler.kind.api.clone(),
            reconciler.kind.resource.clone(),
            reconciler.kind.leader(),
        );
        tokio::select! {
            () = reconcile::watch_sources(secrets_api, secrets_config, secrets_writer, SourceKind::Secret, vec![pending.clone()]) => {}
            () = reconcile::run(reconciler, api, resource, object_writer, pending, leader) => {}
        }
        tracing::error!("the watches of OIDCClients ended");
    }
}

impl ClientReconciler {
    /// Publishes the valid clients as the table.
    fn publish(&self, valid: &HashMap<String, Arc<DynamicClient>>) {
        self.clients.store(Arc::new(Clients { by_id: valid.clone() }));
    }

    fn valid(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<DynamicClient>>> {
        self.valid.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn reconcile_one(self: Arc<Self>, object: Arc<DynamicObject>) -> Result<Action, ReconcileError> {
        let _ = self.secrets.wait_until_ready().await;
        let oidc_client: OIDCClient = typed(&object)?;
        let name = oidc_client.name_any();
        let uid = oidc_client.metadata.uid.clone().unwrap_or_default();
        let storage = self
            .secrets
            .get(&ObjectRef::new(&storage_name(&uid)).within(&self.namespace));
        let (checks, hashes) = validate(&oidc_client.spec, storage.as_deref());
        {
            let mut valid = self.valid();
            let changed = if hashes.is_empty() {
                valid.remove(&name).is_some()
            } else {
                // The same hashes and spec: keep the client, and the secrets it has verified.
                let kept = valid.get(&name).is_some_and(|kept| {
                    kept.hashes == hashes
                        && dynamic_client(&name, &oidc_client.spec, Vec::new()).client == kept.client
                });
                if !kept {
                    valid.insert(
                        name.clone(),
                        Arc::new(dynamic_client(&name, &oidc_client.spec, hashes)),
                    );
                }
                !kept
            };
            if changed {
                self.publish(&valid);
            }
        }
        let (phase, conditions) = conditions::with_ready::<Phase>(
            "OIDCClient",
            &checks,
            &oidc_client.status.clone().unwrap_or_default().conditions,
            oidc_client.metadata.generation,
        );
        let status = OIDCClientStatus {
            phase,
            conditions,
            // Pinniped's count: the usable stored secrets (none when any is unusable).
            total_client_secrets: i32::try_from(validate_secret(storage.as_deref()).1.len())
                .unwrap_or(i32::MAX),
        };
        self.kind.write_status(&object, &status).await?;
        Ok(Action::requeue(RESYNC))
    }
}

impl Reconciler for ClientReconciler {
    type Error = ReconcileError;

    fn kind(&self) -> &'static str {
        "OIDCClient"
    }

    fn reconcile(
        self: Arc<Self>,
        object: Arc<DynamicObject>,
    ) -> impl std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'static {
        self.reconcile_one(object)
    }

    fn waits_for_change(&self, error: &ReconcileError) -> bool {
        matches!(error, ReconcileError::Spec(_))
    }

    /// Its storage Secret (named after its UID); every OIDCClient after a re-list.
    fn uses_source(&self, object: &DynamicObject, event: &SourceEvent) -> bool {
        match event {
            SourceEvent::All => true,
            SourceEvent::Changed(kind, name) => {
                *kind == SourceKind::Secret
                    && object
                        .metadata
                        .uid
                        .as_deref()
                        .is_some_and(|uid| storage_name(uid) == *name)
            }
        }
    }

    fn forget(&self, name: &str, _uid: Option<&str>) {
        let mut valid = self.valid();
        if valid.remove(name).is_some() {
            self.publish(&valid);
        }
    }

    fn retain(&self, names: &HashSet<String>) {
        let mut valid = self.valid();
        let before = valid.len();
        valid.retain(|name, _| names.contains(name));
        if valid.len() != before {
            self.publish(&valid);
        }
    }
}
