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

mod controller;
pub(crate) mod secret_request;

pub use controller::ClientController;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use k8s_openapi::{
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    ByteString,
};
use kube::{api::PostParams, Api};
use selkie_api::supervisor_config::{GrantType, OIDCClientSpec, Scope};
use selkie_kube::conditions::Check;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::sync::Semaphore;

use crate::endpoints::authorize;
use crate::session::storage::{self, StorageError};

/// The storage type (label value) of the client-secret Secrets.
pub(crate) const SECRET_LABEL: &str = "oidc-client-secret";
/// The bcrypt cost of new hashes, and the least accepted in stored ones (Pinniped's).
pub(crate) const BCRYPT_COST: u32 = 12;
/// The most client secrets an OIDCClient may have.
pub(crate) const MAX_CLIENT_SECRETS: usize = 5;

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
    /// One bcrypt check of this client's secrets at a time: a flood of wrong secrets for one
    /// client ID (IDs are public) queues here, not in the shared [`BCRYPT_SLOTS`].
    checking: Semaphore,
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
    /// Whether `secret` is one of the client's secrets. A secret verified before is recognised by
    /// its digest at once; any other is checked with bcrypt on the blocking thread pool, one at a
    /// time per client and at most [`BCRYPT_SLOTS`] across all clients, so a flood of wrong
    /// secrets never occupies the async runtime and cannot starve other clients' checks. Fails
    /// with [`Busy`] when no check could start within [`BCRYPT_WAIT`] (the caller answers
    /// `temporarily_unavailable`). Never logs the secret.
    pub async fn authenticate(&self, secret: &str) -> Result<bool, Busy> {
        let digest: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
        if self
            .verified
            .lock()
            .is_ok_and(|verified| verified.contains(&digest))
        {
            return Ok(true);
        }
        let deadline = tokio::time::Instant::now() + BCRYPT_WAIT;
        let _mine = tokio::time::timeout_at(deadline, self.checking.acquire())
            .await
            .map_err(|_| Busy)?
            .map_err(|_| Busy)?;
        let hashes = self.hashes.clone();
        let secret = secret.to_string();
        let matches = run_bcrypt(deadline, move || {
            hashes
                .iter()
                .any(|hash| bcrypt::verify(secret.as_str(), hash).unwrap_or(false))
        })
        .await?;
        if matches {
            if let Ok(mut verified) = self.verified.lock() {
                verified.insert(digest);
            }
        }
        Ok(matches)
    }
}

/// bcrypt checks and hashes running at once, across all clients: half the cores (at least one),
/// so a flood of wrong secrets leaves CPU to every other request.
static BCRYPT_SLOTS: std::sync::LazyLock<Semaphore> = std::sync::LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    Semaphore::new((cores / 2).max(1))
});

/// How long a client-secret check or hash may wait for its turn before [`Busy`].
pub(crate) const BCRYPT_WAIT: Duration = Duration::from_secs(5);

/// Too many bcrypt computations are waiting: nothing was checked or hashed; try again later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many client-secret checks are in progress")]
pub struct Busy;

/// Runs `work` (bcrypt) on the blocking pool once one of the [`BCRYPT_SLOTS`] is free, waiting
/// until `deadline` at most ([`Busy`] then, or when the work panicked).
pub(crate) async fn run_bcrypt<T: Send + 'static>(
    deadline: tokio::time::Instant,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Busy> {
    let _slot = tokio::time::timeout_at(deadline, BCRYPT_SLOTS.acquire())
        .await
        .map_err(|_| Busy)?
        .map_err(|_| Busy)?;
    tokio::task::spawn_blocking(work).await.map_err(|_| Busy)
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
            // The CRD's bounds (Pinniped's), held here too: a stored object is outside data.
            .filter(|seconds| (120..=1800).contains(seconds))
            .and_then(|seconds| u64::try_from(seconds).ok())
            .map(Duration::from_secs),
        hashes,
        verified: Mutex::default(),
        checking: Semaphore::new(1),
    }
}

/// An OIDCClient `name` checked with its storage Secret as the reconciler checks it: the
/// conditions of [`validate`] and, when it gave hashes, the client the reconciler publishes
/// (fuzz targets and tests only).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn checked(
    name: &str,
    spec: &OIDCClientSpec,
    storage: Option<&Secret>,
) -> (Vec<Check>, Option<DynamicClient>) {
    let (checks, hashes) = validate(spec, storage);
    let client = (!hashes.is_empty()).then(|| dynamic_client(name, spec, hashes));
    (checks, client)
}

#[cfg(any(test, feature = "fuzzing"))]
impl Clients {
    /// The table of `clients`, each one [`checked`] gave (fuzz targets and tests only).
    pub(crate) fn of(clients: impl IntoIterator<Item = DynamicClient>) -> Self {
        Self {
            by_id: clients
                .into_iter()
                .map(|client| (client.client.id.clone(), Arc::new(client)))
                .collect(),
        }
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

#[cfg(test)]
mod tests;
