//! Dynamic clients (REFERENCE.md §1.3): OIDCClients, the web applications registered in the
//! Supervisor's namespace, with their secrets' bcrypt hashes in a storage Secret; and what an
//! `OIDCClientSecretRequest` does to those hashes.
//!
//! * [`validate`] checks an OIDCClient with its storage Secret as Pinniped does, giving the
//!   conditions `ClientSecretExists`, `AllowedGrantTypesValid` and `AllowedScopesValid` in
//!   Pinniped's words, and the hashes when all three hold.
//! * [`Clients`] is the table logins read: every valid OIDCClient as an [`authorize::Client`]
//!   with its hashes; [`ClientController`] keeps it equal to what is in the cluster (a watch of
//!   OIDCClients and of their storage Secrets) and, on the leader, writes their statuses.
//! * [`SecretStorage`] reads and writes the storage Secret: name
//!   `pinniped-storage-oidc-client-secret-<base32(uid)>`, type
//!   `storage.pinniped.dev/oidc-client-secret`, JSON `{"hashes": [...], "version": "1"}`, owned by
//!   its OIDCClient (deleted with it), never garbage-collected.
//!
//! Client secrets are 32 random bytes in hex, shown once; only bcrypt hashes (cost
//! [`BCRYPT_COST`]) are stored, at most [`MAX_CLIENT_SECRETS`]. A client authenticates with HTTP
//! Basic (`client_secret_basic`) only.

pub(crate) mod secret_request;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use k8s_openapi::{
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    ByteString,
};
use kube::{
    api::{ApiResource, DynamicObject, PostParams},
    runtime::{reflector, watcher},
    Api, Client, ResourceExt as _,
};
use selkie_api::supervisor_config::{GrantType, OIDCClient, OIDCClientSpec, OIDCClientStatus, Phase, Scope};
use selkie_kube::conditions::{self, Check};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::sync::{watch, Notify};

use crate::controller::{follow, parse, StatusWriter};
use crate::endpoints::authorize;
use crate::session::storage::{self, StorageError};

/// The storage type (label value) of the client-secret Secrets.
pub(crate) const SECRET_LABEL: &str = "oidc-client-secret";
/// The bcrypt cost of new hashes, and the least accepted in stored ones (Pinniped's).
pub(crate) const BCRYPT_COST: u32 = 12;
/// The most client secrets an OIDCClient may have.
pub(crate) const MAX_CLIENT_SECRETS: usize = 5;
/// How often everything is computed again, besides after every change.
const RESYNC: Duration = Duration::from_secs(30);
/// How long a burst of watch events is let settle.
const DEBOUNCE: Duration = Duration::from_millis(50);

const CLIENT_SECRET_EXISTS: &str = "ClientSecretExists";
const ALLOWED_GRANT_TYPES_VALID: &str = "AllowedGrantTypesValid";
const ALLOWED_SCOPES_VALID: &str = "AllowedScopesValid";

/// A valid OIDCClient, as logins use it.
pub struct DynamicClient {
    /// The client as the authorization endpoint checks requests against it.
    pub client: authorize::Client,
    /// The lifetime of ID tokens from the code and refresh grants; `None`: the default.
    pub id_token_lifetime: Option<Duration>,
    /// The bcrypt hashes of its secrets, newest first.
    hashes: Vec<String>,
    /// SHA-256 digests of secrets already verified against `hashes` (bcrypt costs a quarter of a
    /// second of CPU; a client redeeming codes all day pays it once per secret).
    verified: Mutex<HashSet<[u8; 32]>>,
}

impl std::fmt::Debug for DynamicClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicClient")
            .field("client", &self.client)
            .field("secrets", &self.hashes.len())
            .finish_non_exhaustive()
    }
}

impl DynamicClient {
    /// Whether `secret` is one of the client's secrets (bcrypt, the first time a secret is seen;
    /// a digest kept in memory after that). Never logs the secret.
    pub fn authenticate(&self, secret: &str) -> bool {
        let digest: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
        if self
            .verified
            .lock()
            .is_ok_and(|verified| verified.contains(&digest))
        {
            return true;
        }
        let matches = self
            .hashes
            .iter()
            .any(|hash| bcrypt::verify(secret, hash).unwrap_or(false));
        if matches {
            if let Ok(mut verified) = self.verified.lock() {
                verified.insert(digest);
            }
        }
        matches
    }
}

/// The valid OIDCClients of the Supervisor's namespace, by client ID.
#[derive(Debug, Default)]
pub struct Clients {
    by_id: HashMap<String, Arc<DynamicClient>>,
}

impl Clients {
    /// The valid OIDCClient named `id`.
    pub fn get(&self, id: &str) -> Option<Arc<DynamicClient>> {
        self.by_id.get(id).cloned()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// What the storage Secret holds.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    hashes: Vec<String>,
    version: String,
}

/// The name of the storage Secret of the OIDCClient with UID `uid` (Pinniped's: the signature is
/// the unpadded base64url of the UID).
pub(crate) fn storage_name(uid: &str) -> String {
    storage::secret_name(SECRET_LABEL, &URL_SAFE_NO_PAD.encode(uid.as_bytes()))
}

/// The hashes a storage Secret holds. Fails, naming what is wrong, when it is not a client-secret
/// storage Secret of version 1.
pub(crate) fn read_hashes(secret: &Secret) -> Result<Vec<String>, StorageError> {
    let value = storage::read(secret, SECRET_LABEL)?;
    let stored: Stored = serde_json::from_value(value)
        .map_err(|e| StorageError::NotJson(selkie_api::json::error_without_values(&e)))?;
    if stored.version != storage::VERSION {
        return Err(StorageError::WrongVersion);
    }
    Ok(stored.hashes)
}

/// The storage Secret holding `hashes` for the OIDCClient `name` with UID `uid`, owned by it
/// (`api_version` is the OIDCClient's, under the installation's group suffix).
pub(crate) fn storage_secret(name: &str, uid: &str, api_version: &str, hashes: &[String]) -> Secret {
    let stored = Stored {
        hashes: hashes.to_vec(),
        version: storage::VERSION.into(),
    };
    let data = serde_json::to_vec(&stored).unwrap_or_default();
    Secret {
        metadata: ObjectMeta {
            name: Some(storage_name(uid)),
            labels: Some([(storage::TYPE_LABEL.to_string(), SECRET_LABEL.to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: "OIDCClient".into(),
                name: name.into(),
                uid: uid.into(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        type_: Some(format!("storage.pinniped.dev/{SECRET_LABEL}")),
        data: Some(
            [
                (storage::DATA_KEY.to_string(), ByteString(data)),
                (
                    storage::VERSION_KEY.to_string(),
                    ByteString(storage::VERSION.into()),
                ),
            ]
            .into(),
        ),
        ..Secret::default()
    }
}

/// Checks an OIDCClient's spec with its storage Secret (`None`: there is none) as Pinniped does:
/// the three conditions, in Pinniped's words, and the hashes to authenticate with — empty unless
/// a secret exists and every stored hash is bcrypt of cost ≥ [`BCRYPT_COST`].
pub(crate) fn validate(spec: &OIDCClientSpec, storage: Option<&Secret>) -> (Vec<Check>, Vec<String>) {
    let (secret_check, hashes) = validate_secret(storage);
    let grants = |grant: GrantType| spec.allowed_grant_types.contains(&grant);
    let scopes = |scope: Scope| spec.allowed_scopes.contains(&scope);
    let included = |what: &str, field: &str, when: &str, in_field: &str| {
        format!("{what:?} must be included in {field:?} when {when:?} is included in {in_field:?}")
    };
    let (grant_field, scope_field) = ("allowedGrantTypes", "allowedScopes");
    let (code, refresh, exchange) = (
        "authorization_code",
        "refresh_token",
        "urn:ietf:params:oauth:grant-type:token-exchange",
    );
    let (openid, offline, audience) = ("openid", "offline_access", "pinniped:request-audience");

    let mut grant_problems = Vec::new();
    if !grants(GrantType::AuthorizationCode) {
        grant_problems.push(format!("{code:?} must always be included in {grant_field:?}"));
    }
    if scopes(Scope::OfflineAccess) && !grants(GrantType::RefreshToken) {
        grant_problems.push(included(refresh, grant_field, offline, scope_field));
    }
    if scopes(Scope::RequestAudience) && !grants(GrantType::TokenExchange) {
        grant_problems.push(included(exchange, grant_field, audience, scope_field));
    }
    let mut scope_problems = Vec::new();
    if !scopes(Scope::OpenID) {
        scope_problems.push(format!("{openid:?} must always be included in {scope_field:?}"));
    }
    if grants(GrantType::RefreshToken) && !scopes(Scope::OfflineAccess) {
        scope_problems.push(included(offline, scope_field, refresh, grant_field));
    }
    if scopes(Scope::RequestAudience) && !(scopes(Scope::Username) && scopes(Scope::Groups)) {
        scope_problems.push(format!(
            "\"username\" and \"groups\" must be included in {scope_field:?} when {audience:?} is included in {scope_field:?}"
        ));
    }
    if grants(GrantType::TokenExchange) && !scopes(Scope::RequestAudience) {
        scope_problems.push(included(audience, scope_field, exchange, grant_field));
    }
    let check = |type_: &'static str, field: &str, problems: Vec<String>| {
        if problems.is_empty() {
            Check::success(type_, format!("{field:?} is valid"))
        } else {
            Check::failure(type_, "MissingRequiredValue", problems.join("; "))
        }
    };
    let checks = vec![
        secret_check,
        check(ALLOWED_GRANT_TYPES_VALID, grant_field, grant_problems),
        check(ALLOWED_SCOPES_VALID, scope_field, scope_problems),
    ];
    let hashes = if checks.iter().all(Check::is_true) {
        hashes
    } else {
        Vec::new()
    };
    (checks, hashes)
}

/// `ClientSecretExists`, and the hashes when it holds.
fn validate_secret(storage: Option<&Secret>) -> (Check, Vec<String>) {
    let missing = |message: String| {
        (
            Check::failure(CLIENT_SECRET_EXISTS, "NoClientSecretFound", message),
            Vec::new(),
        )
    };
    let Some(secret) = storage else {
        return missing("no client secret found (no Secret storage found)".into());
    };
    let hashes = match read_hashes(secret) {
        Ok(hashes) => hashes,
        Err(error) => return missing(format!("error reading client secret storage: {error}")),
    };
    if hashes.is_empty() {
        return missing("no client secret found (empty list in storage)".into());
    }
    let invalid: Vec<String> = hashes
        .iter()
        .enumerate()
        .filter_map(|(index, hash)| {
            let problem = match hash.parse::<bcrypt::HashParts>() {
                Err(_) => "not a bcrypt hash".to_string(),
                Ok(parts) if parts.get_cost() < BCRYPT_COST => format!(
                    "bcrypt cost {} is below the required minimum of {BCRYPT_COST}",
                    parts.get_cost()
                ),
                Ok(_) => return None,
            };
            Some(format!("hashed client secret at index {index}: {problem}"))
        })
        .collect();
    if !invalid.is_empty() {
        return (
            Check::failure(
                CLIENT_SECRET_EXISTS,
                "InvalidClientSecretFound",
                format!(
                    "{} stored client secrets found, but some were invalid, so none will be used: {}",
                    hashes.len(),
                    invalid.join("; ")
                ),
            ),
            Vec::new(),
        );
    }
    (
        Check::success(
            CLIENT_SECRET_EXISTS,
            format!("{} client secret(s) found", hashes.len()),
        ),
        hashes,
    )
}

/// The client a valid OIDCClient is.
fn dynamic_client(name: &str, spec: &OIDCClientSpec, hashes: Vec<String>) -> DynamicClient {
    DynamicClient {
        client: authorize::Client {
            id: name.to_string(),
            redirect_uris: spec.allowed_redirect_uris.clone(),
            scopes: spec.allowed_scopes.iter().map(wire).collect(),
            grant_types: spec.allowed_grant_types.iter().map(wire).collect(),
            form_post: false,
        },
        id_token_lifetime: spec
            .token_lifetimes
            .id_token_seconds
            .and_then(|seconds| u64::try_from(seconds).ok())
            .map(Duration::from_secs),
        hashes,
        verified: Mutex::default(),
    }
}

/// A spec enum (a scope, a grant type) as it is written in the CR and in OAuth requests.
fn wire<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Reads and writes OIDCClients' storage Secrets in one namespace.
#[derive(Clone)]
pub(crate) struct SecretStorage {
    secrets: Api<Secret>,
}

impl std::fmt::Debug for SecretStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretStorage")
    }
}

/// Why a storage Secret could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SecretStorageError {
    /// kube-apiserver refused or could not be reached.
    #[error("the client secret storage: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret is not a readable storage Secret.
    #[error("the client secret storage: {0}")]
    Storage(#[from] StorageError),
    /// Someone else wrote it since it was read.
    #[error("the client secret storage was changed concurrently")]
    Conflict,
}

impl SecretStorage {
    /// Storage in `secrets` (the Supervisor's namespace).
    pub(crate) fn new(secrets: Api<Secret>) -> Self {
        Self { secrets }
    }

    /// The hashes of the OIDCClient with UID `uid`, with the resourceVersion of the Secret they
    /// were read from (`None`: there is no Secret, and no hashes).
    pub(crate) async fn get(&self, uid: &str) -> Result<(Option<String>, Vec<String>), SecretStorageError> {
        match self.secrets.get_opt(&storage_name(uid)).await? {
            None => Ok((None, Vec::new())),
            Some(secret) => {
                let version = secret.metadata.resource_version.clone();
                Ok((version, read_hashes(&secret)?))
            }
        }
    }

    /// Writes `hashes` for the OIDCClient: creates the Secret when `resource_version` is `None`,
    /// else replaces it only if it is still at that version ([`SecretStorageError::Conflict`]
    /// otherwise, as when another request created it first).
    pub(crate) async fn set(
        &self,
        resource_version: Option<String>,
        name: &str,
        uid: &str,
        api_version: &str,
        hashes: &[String],
    ) -> Result<(), SecretStorageError> {
        let mut secret = storage_secret(name, uid, api_version, hashes);
        let result = match resource_version {
            None => self.secrets.create(&PostParams::default(), &secret).await,
            Some(version) => {
                secret.metadata.resource_version = Some(version);
                self.secrets
                    .replace(&storage_name(uid), &PostParams::default(), &secret)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(SecretStorageError::Conflict),
            Err(error) => Err(error.into()),
        }
    }
}

/// Keeps a [`Clients`] table equal to the valid OIDCClients of the namespace; the leader also
/// writes their statuses.
pub struct ClientController {
    client: Client,
    namespace: String,
    resource: ApiResource,
    clients: Arc<ArcSwap<Clients>>,
    leader: watch::Receiver<bool>,
    statuses: StatusWriter,
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
        Ok(Self {
            statuses: StatusWriter::new(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
            resource,
            clients,
            leader,
        })
    }

    /// Runs until a watch ends (which it does not, short of the process stopping).
    pub async fn run(mut self) {
        let changed = Arc::new(Notify::new());
        let writer = reflector::store::Writer::new(self.resource.clone());
        let oidc_clients = writer.as_reader();
        let (secrets, secrets_writer) = reflector::store();
        let clients_api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.namespace, &self.resource);
        let secrets_api = Api::<Secret>::namespaced(self.client.clone(), &self.namespace);
        let secrets_config =
            watcher::Config::default().labels(&format!("{}={SECRET_LABEL}", storage::TYPE_LABEL));
        let watches = async {
            tokio::join!(
                follow(
                    watcher(clients_api, watcher::Config::default()),
                    writer,
                    changed.clone()
                ),
                follow(
                    watcher(secrets_api, secrets_config),
                    secrets_writer,
                    changed.clone()
                ),
            )
        };
        let mut leader = self.leader.clone();
        let sync_loop = async {
            loop {
                tokio::select! {
                    () = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
                    _ = leader.changed() => {}
                    () = tokio::time::sleep(RESYNC) => {}
                }
                self.sync(&oidc_clients, &secrets).await;
            }
        };
        tokio::select! {
            _ = watches => tracing::error!("the watches of OIDCClients ended"),
            () = sync_loop => {}
        }
    }

    async fn sync(
        &mut self,
        oidc_clients: &reflector::Store<DynamicObject>,
        secrets: &reflector::Store<Secret>,
    ) {
        let leading = *self.leader.borrow();
        let previous = self.clients.load_full();
        let mut by_id = HashMap::new();
        for object in oidc_clients.state() {
            let name = object.name_any();
            let Some(oidc_client) = parse::<OIDCClient>(&object) else {
                continue;
            };
            let uid = oidc_client.metadata.uid.clone().unwrap_or_default();
            let storage =
                secrets.get(&reflector::ObjectRef::new(&storage_name(&uid)).within(&self.namespace));
            let (checks, hashes) = validate(&oidc_client.spec, storage.as_deref());
            if !hashes.is_empty() {
                // The same hashes and spec: keep the client, and the secrets it has verified.
                let kept = previous.get(&name).filter(|kept| {
                    kept.hashes == hashes
                        && dynamic_client(&name, &oidc_client.spec, Vec::new()).client == kept.client
                });
                let client = kept
                    .unwrap_or_else(|| Arc::new(dynamic_client(&name, &oidc_client.spec, hashes.clone())));
                by_id.insert(name.clone(), client);
            }
            if leading {
                let current = oidc_client.status.clone();
                let (phase, conditions) = conditions::with_ready::<Phase>(
                    "OIDCClient",
                    &checks,
                    &current.clone().unwrap_or_default().conditions,
                    oidc_client.metadata.generation,
                );
                let status = OIDCClientStatus {
                    phase,
                    conditions,
                    // Pinniped's count: the usable stored secrets (none when any is unusable).
                    total_client_secrets: i32::try_from(validate_secret(storage.as_deref()).1.len())
                        .unwrap_or(i32::MAX),
                };
                self.statuses.write(&self.resource, &name, &current, status).await;
            }
        }
        self.clients.store(Arc::new(Clients { by_id }));
    }
}

#[cfg(test)]
mod tests;
