//! Sessions kept in Kubernetes Secrets of the Supervisor's namespace: one Secret per login
//! ([`crate::session::login`]) written when a code is issued, patched when it is redeemed,
//! read and rewritten by each refresh on any replica, deleted when revoked or expired; and, read
//! for migration, the Secrets of the earlier format, one per token ([`crate::session::storage`]
//! names and shapes them, as Pinniped's Supervisor writes them).
//!
//! A login costs two requests (the login's `POST`, then one conditional `PATCH` redeeming its
//! code); a refresh two (a `GET`, a conditional `PUT`); a token exchange one `GET`. Pinniped
//! writes a Secret per authorization code, PKCE challenge, OIDC request, access token and
//! refresh token; Selkie's Secret per token (without the PKCE and OIDC ones) cost five requests
//! per login and per refresh.
//!
//! The store makes six kinds of request — create, get, replace (with the resourceVersion read
//! as precondition), patch (a JSON Patch whose `test` operations are its condition), delete
//! (optionally with UID and resourceVersion preconditions) and list by label selector — to
//! kube-apiserver through an `Api<Secret>`. That is its seam: unit tests put
//! an in-memory namespace in its place (`Store::in_memory` and the `memory` module, both
//! `#[cfg(test)]`, and built for the fuzz targets with the `fuzzing` feature), which answers
//! those six as kube-apiserver does — status codes and reasons included —, counts them, can fail
//! one on demand, and interleaves concurrent callers in an order drawn from a seed; the real
//! endpoints run against it.

use std::collections::BTreeMap;
#[cfg(any(test, feature = "fuzzing"))]
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions},
    Api,
};
use time::OffsetDateTime;

use crate::session::device::{self, DeviceLogin, DeviceStatus};
use crate::session::login::{self, CodeState, Login, Tokens};
use crate::session::storage::{self, garbage_collect_after, Resource, StorageError, TYPE_LABEL};
use crate::session::Session;

/// The label tying a login's tokens together, for revoking them all at once.
pub(crate) const REQUEST_ID_LABEL: &str = "storage.pinniped.dev/request-id";

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// kube-apiserver refused or could not be reached.
    #[error("the session store: {0}")]
    Api(#[from] kube::Error),
    /// A stored Secret cannot be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The stored JSON is not a session.
    #[error("the stored session cannot be read: {0}")]
    Session(String),
    /// Someone else changed the Secret since it was read (a concurrent redemption).
    #[error("the session was changed concurrently")]
    Conflict,
    /// The login's Secret was deleted since it was read (its login ended).
    #[error("the login has ended")]
    Gone,
}

/// The session store of one namespace.
#[derive(Clone)]
pub struct Store {
    secrets: Secrets,
}

/// Where the Secrets are: kube-apiserver, or (unit tests) memory. Each method is one request and
/// answers as kube-apiserver does; errors are [`kube::Error::Api`] with its status.
#[derive(Clone)]
#[cfg_attr(
    any(test, feature = "fuzzing"),
    expect(
        clippy::large_enum_variant,
        reason = "the small variant exists in unit tests and fuzz targets only; the Supervisor's store has one variant"
    )
)]
enum Secrets {
    /// The Supervisor's namespace at kube-apiserver.
    Kube(Api<Secret>),
    /// An in-memory namespace ([`memory::MemorySecrets`]).
    #[cfg(any(test, feature = "fuzzing"))]
    Memory(Arc<memory::MemorySecrets>),
}

impl Secrets {
    /// `POST`: stores the new `secret`.
    async fn create(&self, secret: &Secret) -> Result<(), kube::Error> {
        match self {
            Self::Kube(api) => api.create(&PostParams::default(), secret).await.map(drop),
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.create(secret).await.map(drop),
        }
    }

    /// `GET` of `name`.
    async fn get(&self, name: &str) -> Result<Secret, kube::Error> {
        match self {
            Self::Kube(api) => api.get(name).await,
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.get(name).await,
        }
    }

    /// `PUT` of `name`: `secret`, conditional on its resourceVersion when it has one.
    async fn replace(&self, name: &str, secret: &Secret) -> Result<(), kube::Error> {
        match self {
            Self::Kube(api) => api.replace(name, &PostParams::default(), secret).await.map(drop),
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.replace(name, secret).await.map(drop),
        }
    }

    /// `PATCH` of `name` with the JSON Patch `patch` (RFC 6902; kube-apiserver applies it
    /// atomically, and a failed `test` operation is 422): the patched Secret.
    async fn patch(&self, name: &str, patch: json_patch::Patch) -> Result<Secret, kube::Error> {
        match self {
            Self::Kube(api) => {
                api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                    .await
            }
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.patch(name, &patch).await,
        }
    }

    /// `DELETE` of `name`, with the preconditions of `params` if any: the deleted Secret when
    /// kube-apiserver answers with it (it does when the deletion is immediate, as for Secrets).
    async fn delete(&self, name: &str, params: &DeleteParams) -> Result<Option<Secret>, kube::Error> {
        match self {
            Self::Kube(api) => api.delete(name, params).await.map(|deleted| deleted.left()),
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.delete(name, params.preconditions.as_ref()).await.map(Some),
        }
    }

    /// `LIST` of the Secrets matching the label selector `selector`.
    async fn list(&self, selector: &str) -> Result<Vec<Secret>, kube::Error> {
        match self {
            Self::Kube(api) => Ok(api.list(&ListParams::default().labels(selector)).await?.items),
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.list(selector).await,
        }
    }

    /// One page of a metadata-only `LIST` (`PartialObjectMetadata`: no data, no values of the
    /// Secrets) of those matching `selector`: at most `limit`, from `continue_token` on; the
    /// metadata and the token of the next page, if any.
    async fn list_metadata_page(
        &self,
        selector: &str,
        limit: u32,
        continue_token: Option<String>,
    ) -> Result<(Vec<ObjectMeta>, Option<String>), kube::Error> {
        match self {
            Self::Kube(api) => {
                let mut params = ListParams::default().labels(selector).limit(limit);
                params.continue_token = continue_token;
                let page = api.list_metadata(&params).await?;
                let next = page.metadata.continue_.filter(|token| !token.is_empty());
                Ok((page.items.into_iter().map(|item| item.metadata).collect(), next))
            }
            #[cfg(any(test, feature = "fuzzing"))]
            Self::Memory(memory) => memory.list_metadata_page(selector, limit, continue_token).await,
        }
    }
}

/// The type label of the Secret recording that a SAML assertion was presented
/// ([`Store::record_saml_assertion`]).
pub(crate) const SAML_ASSERTION_LABEL: &str = "saml-assertion";
/// Its Secret type.
const SAML_ASSERTION_TYPE: &str = "storage.selkie.dev/saml-assertion";

/// How many Secrets one page of the garbage collector's list holds: with metadata only, a page
/// is some hundreds of KiB however many sessions there are.
pub(crate) const COLLECTOR_PAGE: u32 = 500;

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

impl Store {
    /// A store writing to `secrets` (the Supervisor's namespace).
    pub fn new(secrets: Api<Secret>) -> Self {
        Self {
            secrets: Secrets::Kube(secrets),
        }
    }

    /// A store over an empty in-memory namespace, and that namespace, to look into, to change
    /// behind the store's back, and to interleave concurrent requests with
    /// ([`memory::MemorySecrets`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn in_memory() -> (Self, Arc<memory::MemorySecrets>) {
        let memory = Arc::new(memory::MemorySecrets::default());
        (
            Self {
                secrets: Secrets::Memory(memory.clone()),
            },
            memory,
        )
    }

    /// Stores `session` under `signature`, collectable `lifetime` from `now`.
    pub async fn create(
        &self,
        resource: Resource,
        signature: &str,
        session: &Session,
        lifetime: time::Duration,
        now: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let data = serde_json::to_value(session).map_err(|e| StoreError::Session(e.to_string()))?;
        let labels = BTreeMap::from([(REQUEST_ID_LABEL.to_string(), session.request_id.clone())]);
        let secret = resource.to_secret(signature, &data, &labels, lifetime, now);
        self.secrets.create(&secret).await?;
        Ok(())
    }

    /// The session stored under `signature` and the Secret it was read from (to [`Store::update`]
    /// it), or `None`.
    pub async fn get(
        &self,
        resource: Resource,
        signature: &str,
    ) -> Result<Option<(Session, Secret)>, StoreError> {
        let secret = match self.secrets.get(&resource.secret_name(signature)).await {
            Ok(secret) => secret,
            Err(error) if is_status(&error, 404) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        let data = resource.read_secret(&secret)?;
        let session: Session = serde_json::from_value(data)
            .map_err(|e| StoreError::Session(selkie_api::json::error_without_values(&e)))?;
        Ok(Some((session, secret)))
    }

    /// Rewrites `stored` (a Secret [`Store::get`] returned for `resource` and `signature`) to
    /// hold `session`, only if it is unchanged since it was read (its resourceVersion is the
    /// replace's precondition): [`StoreError::Conflict`] otherwise (someone else got there
    /// first). One request.
    pub async fn update(
        &self,
        resource: Resource,
        signature: &str,
        mut stored: Secret,
        session: &Session,
    ) -> Result<(), StoreError> {
        let name = resource.secret_name(signature);
        let data = serde_json::to_value(session).map_err(|e| StoreError::Session(e.to_string()))?;
        let fresh = resource.to_secret(
            signature,
            &data,
            &BTreeMap::new(),
            time::Duration::ZERO,
            OffsetDateTime::now_utc(),
        );
        stored.data = fresh.data;
        // kube-apiserver keeps the managed fields of an update that carries none: not sending
        // them back makes the request (and its decoding on both sides) smaller.
        stored.metadata.managed_fields = None;
        match self.secrets.replace(&name, &stored).await {
            Ok(_) => Ok(()),
            Err(error) if is_status(&error, 409) => Err(StoreError::Conflict),
            Err(error) => Err(error.into()),
        }
    }

    /// Stores a new `login` (one `POST`), collectable when its session ends;
    /// [`StoreError::Conflict`] when a login of its ID exists.
    pub(crate) async fn create_login(&self, login: &Login, now: OffsetDateTime) -> Result<(), StoreError> {
        match self.secrets.create(&login.to_secret(now)?).await {
            Ok(()) => Ok(()),
            Err(error) if is_status(&error, 409) => Err(StoreError::Conflict),
            Err(error) => Err(error.into()),
        }
    }

    /// The login `id` and the Secret it was read from (to [`Store::replace_login`] it), or
    /// `None` (one `GET`).
    pub(crate) async fn get_login(&self, id: &[u8; 16]) -> Result<Option<(Login, Secret)>, StoreError> {
        match self.secrets.get(&login::secret_name(id)).await {
            Ok(secret) => Ok(Some((Login::read(&secret)?, secret))),
            Err(error) if is_status(&error, 404) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Redeems the authorization code of login `id` in one conditional `PATCH`: only if its
    /// code is `code` (active, with the signature and binding of the redemption's parameters)
    /// does it become used, `tokens` the login's tokens and, with `dpop_jkt`, the login bound
    /// to that DPoP key's thumbprint ([`Login::dpop_jkt`]), atomically. The login as redeemed,
    /// `None` when there is no such login, [`StoreError::Conflict`] when the code is not
    /// `code` (used already, or redeemed with other parameters: read the login to tell).
    pub(crate) async fn redeem_code(
        &self,
        id: &[u8; 16],
        code: &CodeState,
        tokens: &Tokens,
        dpop_jkt: Option<&str>,
    ) -> Result<Option<Login>, StoreError> {
        use base64::{engine::general_purpose::STANDARD, Engine as _};
        let path = |key: &str| format!("/data/{key}");
        let mut patch = serde_json::json!([
            {"op": "test", "path": path(login::CODE_KEY), "value": STANDARD.encode(code.text())},
            {"op": "replace", "path": path(login::CODE_KEY), "value": STANDARD.encode(CodeState::Used.text())},
            {"op": "add", "path": path(login::TOKENS_KEY), "value": STANDARD.encode(tokens.text())},
        ]);
        if let (Some(jkt), Some(operations)) = (dpop_jkt, patch.as_array_mut()) {
            operations.push(serde_json::json!(
                {"op": "add", "path": path(login::DPOP_JKT_KEY), "value": STANDARD.encode(jkt)}
            ));
        }
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|e| StoreError::Session(e.to_string()))?;
        match self.secrets.patch(&login::secret_name(id), patch).await {
            Ok(secret) => Ok(Some(Login::read(&secret)?)),
            Err(error) if is_status(&error, 404) => Ok(None),
            Err(error) if is_status(&error, 422) => Err(StoreError::Conflict),
            Err(error) => Err(error.into()),
        }
    }

    /// Rewrites `stored` (a Secret [`Store::get_login`] returned) to hold `login`, only if it
    /// is unchanged since it was read (one `PUT` with its resourceVersion as precondition):
    /// [`StoreError::Conflict`] when it was changed, [`StoreError::Gone`] when it was deleted.
    pub(crate) async fn replace_login(&self, mut stored: Secret, login: &Login) -> Result<(), StoreError> {
        let fresh = login.to_secret(OffsetDateTime::now_utc())?;
        let name = fresh.metadata.name.clone().unwrap_or_default();
        stored.data = fresh.data;
        stored.metadata.managed_fields = None;
        match self.secrets.replace(&name, &stored).await {
            Ok(()) => Ok(()),
            Err(error) if is_status(&error, 409) => Err(StoreError::Conflict),
            Err(error) if is_status(&error, 404) => Err(StoreError::Gone),
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes the Secret of login `id` (one `DELETE`) and returns the login it held as it was
    /// deleted (to revoke the upstream token it held: a concurrent refresh may have changed it
    /// since anyone read it); `None` when it was gone already or does not read.
    pub(crate) async fn delete_login_secret(&self, id: &[u8; 16]) -> Result<Option<Login>, StoreError> {
        match self
            .secrets
            .delete(&login::secret_name(id), &DeleteParams::default())
            .await
        {
            Ok(deleted) => Ok(deleted.and_then(|secret| Login::read(&secret).ok())),
            Err(error) if is_status(&error, 404) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Stores a new device login (one `POST`), collectable when its device code expires;
    /// [`StoreError::Conflict`] when one of its ID (so of its user code) exists.
    pub(crate) async fn create_device(
        &self,
        device: &DeviceLogin,
        now: OffsetDateTime,
    ) -> Result<(), StoreError> {
        match self.secrets.create(&device.to_secret(now)?).await {
            Ok(()) => Ok(()),
            Err(error) if is_status(&error, 409) => Err(StoreError::Conflict),
            Err(error) => Err(error.into()),
        }
    }

    /// Records that the SAML assertion `key` names (a digest of the identity provider's entity
    /// ID and the assertion's ID) was presented, in a Secret collectable at `until` (when the
    /// assertion can no longer be presented anyway): `Ok(true)` the first time, `Ok(false)` when
    /// it was recorded before — a replay. One `POST`, whichever replica saw the assertion first.
    pub(crate) async fn record_saml_assertion(
        &self,
        key: &[u8; 32],
        until: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
        let secret = storage::storage_secret(
            storage::secret_name(SAML_ASSERTION_LABEL, &URL_SAFE_NO_PAD.encode(key)),
            SAML_ASSERTION_TYPE.to_string(),
            SAML_ASSERTION_LABEL,
            &serde_json::json!({}),
            &BTreeMap::new(),
            until,
        );
        match self.secrets.create(&secret).await {
            Ok(()) => Ok(true),
            Err(error) if is_status(&error, 409) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// The device login `id`, or `None` (one `GET`).
    pub(crate) async fn get_device(&self, id: &[u8; 16]) -> Result<Option<DeviceLogin>, StoreError> {
        match self.secrets.get(&device::secret_name(id)).await {
            Ok(secret) => Ok(Some(DeviceLogin::read(&secret)?)),
            Err(error) if is_status(&error, 404) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Moves device login `id` from status `from` to `to` in one conditional `PATCH` (its `test`
    /// operation holds only while the status is `from`): `Ok(true)` when it moved, `Ok(false)`
    /// when there is no such device login, [`StoreError::Conflict`] when its status is not `from`
    /// (someone else moved it first).
    pub(crate) async fn change_device_status(
        &self,
        id: &[u8; 16],
        from: &DeviceStatus,
        to: &DeviceStatus,
    ) -> Result<bool, StoreError> {
        use base64::{engine::general_purpose::STANDARD, Engine as _};
        let path = format!("/data/{}", device::STATUS_KEY);
        let patch = serde_json::json!([
            {"op": "test", "path": path, "value": STANDARD.encode(from.text())},
            {"op": "replace", "path": path, "value": STANDARD.encode(to.text())},
        ]);
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|e| StoreError::Session(e.to_string()))?;
        match self.secrets.patch(&device::secret_name(id), patch).await {
            Ok(_) => Ok(true),
            Err(error) if is_status(&error, 404) => Ok(false),
            Err(error) if is_status(&error, 422) => Err(StoreError::Conflict),
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes what is stored under `signature` (nothing there is no error).
    pub async fn delete(&self, resource: Resource, signature: &str) -> Result<(), StoreError> {
        match self
            .secrets
            .delete(&resource.secret_name(signature), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if is_status(&error, 404) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes every `resource` Secret of the login `request_id` (revoking its tokens) and returns
    /// the sessions they held (those that could be read), for revoking upstream tokens.
    pub async fn delete_login(
        &self,
        resource: Resource,
        request_id: &str,
    ) -> Result<Vec<Session>, StoreError> {
        let selector = format!(
            "{TYPE_LABEL}={},{REQUEST_ID_LABEL}={request_id}",
            resource.as_str()
        );
        let found = self.secrets.list(&selector).await?;
        let mut deleted = Vec::new();
        for secret in found {
            let Some(name) = secret.metadata.name.as_deref() else {
                continue;
            };
            match self.secrets.delete(name, &DeleteParams::default()).await {
                Ok(_) => deleted.extend(
                    resource
                        .read_secret(&secret)
                        .ok()
                        .and_then(|data| serde_json::from_value(data).ok()),
                ),
                Err(error) if is_status(&error, 404) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(deleted)
    }

    /// Every storage Secret whose garbage-collect-after time is before `now`. The collection
    /// time is an annotation, so the storage Secrets are listed by metadata only, in pages of
    /// [`COLLECTOR_PAGE`], and only the expired ones are read in whole (one `GET` each): a sweep
    /// costs kube-apiserver and the Supervisor's memory the metadata of the live sessions, not
    /// their contents. The reads are `concurrency` (at least 1) at a time, in the listed (name)
    /// order; the first that fails fails the whole call (the ones in flight are dropped). An
    /// expired Secret deleted between the list and its read is skipped.
    pub async fn collectable(
        &self,
        now: OffsetDateTime,
        concurrency: usize,
    ) -> Result<Vec<Secret>, StoreError> {
        let mut expired = Vec::new();
        let mut next = None;
        loop {
            let (page, continue_token) = self
                .secrets
                .list_metadata_page(TYPE_LABEL, COLLECTOR_PAGE, next)
                .await?;
            expired.extend(page.into_iter().filter_map(|metadata| {
                let listed = Secret {
                    metadata,
                    ..Secret::default()
                };
                let due = garbage_collect_after(&listed).is_some_and(|after| after < now);
                due.then_some(listed.metadata.name).flatten()
            }));
            match continue_token {
                Some(token) => next = Some(token),
                None => break,
            }
        }
        let read: Vec<Option<Secret>> = futures::stream::iter(expired)
            .map(|name| async move {
                match self.secrets.get(&name).await {
                    // Read again: it may have been written since it was listed.
                    Ok(secret) if garbage_collect_after(&secret).is_some_and(|after| after < now) => {
                        Ok(Some(secret))
                    }
                    Ok(_) => Ok(None),
                    Err(error) if is_status(&error, 404) => Ok(None),
                    Err(error) => Err(StoreError::from(error)),
                }
            })
            .buffered(concurrency.max(1))
            .try_collect()
            .await?;
        Ok(read.into_iter().flatten().collect())
    }

    /// Deletes `secret` if it is still the object that was read (same UID and resourceVersion,
    /// as preconditions of the delete). `Ok(false)` when it is gone or was changed meanwhile.
    pub async fn delete_unchanged(&self, secret: &Secret) -> Result<bool, StoreError> {
        let Some(name) = secret.metadata.name.as_deref() else {
            return Ok(false);
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: secret.metadata.uid.clone(),
                resource_version: secret.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match self.secrets.delete(name, &params).await {
            Ok(_) => Ok(true),
            Err(error) if is_status(&error, 404) || is_status(&error, 409) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }
}

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod memory {
    //! An in-memory namespace of Secrets for unit tests (and fuzz targets), answering the six requests the store
    //! makes as kube-apiserver does:
    //!
    //! * create: 409 `AlreadyExists` when the name is taken, 400 `BadRequest` when the object
    //!   carries a resourceVersion, 422 `Invalid` for a name, label or data key kube-apiserver
    //!   would refuse; the stored object gets a UID and a resourceVersion;
    //! * get: 404 `NotFound`;
    //! * replace: 404 when missing, 409 `Conflict` when the object's resourceVersion (if it has
    //!   one) or UID is not the stored one's, 400 when its name is not the URL's;
    //! * patch (JSON Patch): 404 when missing, 422 `Invalid` when an operation fails (a `test`
    //!   that does not hold); applied atomically;
    //! * delete: 404 when missing, 409 `Conflict` when a UID or resourceVersion precondition
    //!   does not hold;
    //! * list: by a label selector of equality (`a=b`, `a==b`), inequality (`a!=b`), existence
    //!   (`a`) and absence (`!a`) terms, joined by commas, in name order; set-based terms
    //!   (`a in (b)`) are refused with 400 rather than answered wrongly.
    //!
    //! Every write (create, replace, patch, delete) takes the next resourceVersion, one counter for the
    //! namespace as etcd's revision is. Errors are [`kube::Error::Api`] with kube-apiserver's
    //! code and reason. Each request is counted ([`MemorySecrets::take_requests`]), can be made to
    //! fail ([`MemorySecrets::fail_next`]), and, once [`MemorySecrets::interleave`] is called,
    //! first yields to the runtime a number of times drawn from a seeded generator: on a
    //! current-thread runtime, concurrent callers then interleave in an order that depends on
    //! the seed only, so a test can try many interleavings and replay any of them.

    use std::collections::BTreeMap;
    use std::sync::{Mutex, MutexGuard, PoisonError};

    use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    use kube::api::Preconditions;

    /// The largest Secret kube-apiserver stores (its data, in bytes).
    const MAX_SECRET_BYTES: usize = 1024 * 1024;

    /// A kind of request.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Verb {
        /// `POST`.
        Create,
        /// `GET` of one Secret.
        Get,
        /// `PUT`.
        Replace,
        /// `PATCH` (JSON Patch).
        Patch,
        /// `DELETE`.
        Delete,
        /// `GET` of the collection.
        List,
    }

    /// How many requests of each kind arrived (refused ones included).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Requests {
        /// Creates.
        pub(crate) create: usize,
        /// Gets.
        pub(crate) get: usize,
        /// Replaces.
        pub(crate) replace: usize,
        /// Patches.
        pub(crate) patch: usize,
        /// Deletes.
        pub(crate) delete: usize,
        /// Lists.
        pub(crate) list: usize,
    }

    impl Requests {
        /// All of them.
        pub(crate) fn total(&self) -> usize {
            self.create + self.get + self.replace + self.patch + self.delete + self.list
        }

        fn count(&mut self, verb: Verb) {
            let counter = match verb {
                Verb::Create => &mut self.create,
                Verb::Get => &mut self.get,
                Verb::Replace => &mut self.replace,
                Verb::Patch => &mut self.patch,
                Verb::Delete => &mut self.delete,
                Verb::List => &mut self.list,
            };
            *counter += 1;
        }
    }

    /// The namespace ([`Store::in_memory`](super::Store::in_memory) hands out its handle).
    #[derive(Debug, Default)]
    pub(crate) struct MemorySecrets {
        state: Mutex<State>,
    }

    #[derive(Debug, Default)]
    struct State {
        secrets: BTreeMap<String, Secret>,
        /// The last resourceVersion given.
        revision: u64,
        /// UIDs given.
        uids: u64,
        requests: Requests,
        /// Failures to answer, in order, to the next requests of their kind.
        failures: Vec<(Verb, u16)>,
        interleaving: Option<Interleaving>,
    }

    /// The seeded generator of how often a request yields before it is answered.
    #[derive(Debug)]
    struct Interleaving {
        state: u64,
        max_yields: u64,
    }

    impl Interleaving {
        /// SplitMix64: small, fast, and the same on every platform.
        fn yields(&mut self) -> u64 {
            self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % (self.max_yields + 1)
        }
    }

    /// A kube-apiserver error.
    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        )
    }

    fn not_found(name: &str) -> kube::Error {
        status(404, "NotFound", &format!("secrets \"{name}\" not found"))
    }

    fn conflict(name: &str, why: &str) -> kube::Error {
        status(
            409,
            "Conflict",
            &format!("Operation cannot be fulfilled on secrets \"{name}\": {why}"),
        )
    }

    fn invalid(name: &str, field: &str, value: &str, why: &str) -> kube::Error {
        status(
            422,
            "Invalid",
            &format!("Secret \"{name}\" is invalid: {field}: Invalid value: \"{value}\": {why}"),
        )
    }

    /// A DNS-1123 label-ish segment: alphanumeric at both ends, `extra` allowed inside.
    fn segment(value: &str, max: usize, lower_only: bool, extra: &[u8]) -> bool {
        let bytes = value.as_bytes();
        let end_ok =
            |b: &u8| b.is_ascii_digit() || b.is_ascii_lowercase() || (!lower_only && b.is_ascii_uppercase());
        !bytes.is_empty()
            && bytes.len() <= max
            && bytes.first().is_some_and(end_ok)
            && bytes.last().is_some_and(end_ok)
            && bytes.iter().all(|b| end_ok(b) || extra.contains(b))
    }

    /// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63.
    fn label_key(key: &str) -> bool {
        let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
        prefix.is_none_or(|prefix| segment(prefix, 253, true, b"-.")) && segment(name, 63, false, b"-_.")
    }

    /// A label value: empty, or at most 63 with alphanumeric ends.
    fn label_value(value: &str) -> bool {
        value.is_empty() || segment(value, 63, false, b"-_.")
    }

    /// What kube-apiserver's validation of a Secret refuses, of what the store writes.
    fn validate(secret: &Secret) -> Result<(), kube::Error> {
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            return Err(status(
                422,
                "Invalid",
                "Secret \"\" is invalid: metadata.name: Required value: name or generateName is required",
            ));
        }
        if !segment(name, 253, true, b"-.") {
            return Err(invalid(name, "metadata.name", name, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"));
        }
        for (key, value) in secret.metadata.labels.iter().flatten() {
            if !label_key(key) {
                return Err(invalid(
                    name,
                    "metadata.labels",
                    key,
                    "name part must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
            if !label_value(value) {
                return Err(invalid(name, "metadata.labels", value, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
            }
        }
        let mut size = 0;
        for (key, value) in secret.data.iter().flatten() {
            if key.is_empty()
                || !key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            {
                return Err(invalid(
                    name,
                    "data",
                    key,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
            size += value.0.len();
        }
        if size > MAX_SECRET_BYTES {
            return Err(status(
                422,
                "Invalid",
                &format!("Secret \"{name}\" is invalid: data: Too long: must have at most {MAX_SECRET_BYTES} bytes"),
            ));
        }
        Ok(())
    }

    /// One term of a label selector.
    enum Term<'a> {
        Equals(&'a str, &'a str),
        NotEquals(&'a str, &'a str),
        Exists(&'a str),
        Absent(&'a str),
    }

    impl Term<'_> {
        fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
            match self {
                Self::Equals(key, value) => labels.get(*key).is_some_and(|found| found == value),
                // kube-apiserver: `a!=b` also selects objects without `a`.
                Self::NotEquals(key, value) => labels.get(*key).is_none_or(|found| found != value),
                Self::Exists(key) => labels.contains_key(*key),
                Self::Absent(key) => !labels.contains_key(*key),
            }
        }
    }

    /// The terms of `selector`, or 400 as kube-apiserver answers a selector it cannot parse.
    fn parse_selector(selector: &str) -> Result<Vec<Term<'_>>, kube::Error> {
        let bad = |why: &str| status(400, "BadRequest", &format!("unable to parse requirement: {why}"));
        if selector.contains(['(', ')']) {
            return Err(bad(
                "set-based requirements are not supported by the in-memory store",
            ));
        }
        let mut terms = Vec::new();
        for term in selector.split(',').map(str::trim).filter(|term| !term.is_empty()) {
            let parsed = if let Some((key, value)) = term.split_once("!=") {
                Term::NotEquals(key.trim(), value.trim())
            } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Term::Equals(key.trim(), value.trim())
            } else if let Some(key) = term.strip_prefix('!') {
                Term::Absent(key.trim())
            } else {
                Term::Exists(term)
            };
            let (key, value) = match parsed {
                Term::Equals(key, value) | Term::NotEquals(key, value) => (key, value),
                Term::Exists(key) | Term::Absent(key) => (key, ""),
            };
            if !label_key(key) || !label_value(value) || value.contains(['=', '!']) {
                return Err(bad(&format!("invalid term {term:?}")));
            }
            terms.push(parsed);
        }
        Ok(terms)
    }

    impl State {
        /// The next resourceVersion (every write takes one).
        fn write(&mut self) -> String {
            self.revision += 1;
            self.revision.to_string()
        }

        fn create(&mut self, secret: &Secret) -> Result<Secret, kube::Error> {
            validate(secret)?;
            let name = secret.metadata.name.clone().unwrap_or_default();
            if secret.metadata.resource_version.is_some() {
                return Err(status(
                    400,
                    "BadRequest",
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            if self.secrets.contains_key(&name) {
                return Err(status(
                    409,
                    "AlreadyExists",
                    &format!("secrets \"{name}\" already exists"),
                ));
            }
            self.uids += 1;
            let mut stored = secret.clone();
            stored.metadata.uid = Some(format!("00000000-0000-4000-8000-{:012x}", self.uids));
            stored.metadata.resource_version = Some(self.write());
            self.secrets.insert(name, stored.clone());
            Ok(stored)
        }

        fn get(&self, name: &str) -> Result<Secret, kube::Error> {
            self.secrets.get(name).cloned().ok_or_else(|| not_found(name))
        }

        fn replace(&mut self, name: &str, secret: &Secret) -> Result<Secret, kube::Error> {
            let named = secret.metadata.name.as_deref().unwrap_or_default();
            if named != name {
                return Err(status(
                    400,
                    "BadRequest",
                    &format!("the name of the object ({named}) does not match the name on the URL ({name})"),
                ));
            }
            validate(secret)?;
            let current = self.secrets.get(name).ok_or_else(|| not_found(name))?;
            if secret
                .metadata
                .resource_version
                .as_ref()
                .is_some_and(|version| Some(version) != current.metadata.resource_version.as_ref())
            {
                return Err(conflict(
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
            if let Some(uid) = secret
                .metadata
                .uid
                .as_ref()
                .filter(|uid| Some(*uid) != current.metadata.uid.as_ref())
            {
                return Err(conflict(
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        current.metadata.uid.as_deref().unwrap_or_default()
                    ),
                ));
            }
            let mut stored = secret.clone();
            stored.metadata.uid = current.metadata.uid.clone();
            stored.metadata.resource_version = Some(self.write());
            self.secrets.insert(name.to_string(), stored.clone());
            Ok(stored)
        }

        fn patch(&mut self, name: &str, patch: &json_patch::Patch) -> Result<Secret, kube::Error> {
            let current = self.secrets.get(name).ok_or_else(|| not_found(name))?;
            let mut document =
                serde_json::to_value(current).map_err(|e| status(500, "InternalError", &e.to_string()))?;
            json_patch::patch(&mut document, &patch.0).map_err(|e| status(422, "Invalid", &e.to_string()))?;
            let mut patched: Secret =
                serde_json::from_value(document).map_err(|e| status(400, "BadRequest", &e.to_string()))?;
            validate(&patched)?;
            patched.metadata.name = current.metadata.name.clone();
            patched.metadata.uid = current.metadata.uid.clone();
            patched.metadata.resource_version = Some(self.write());
            self.secrets.insert(name.to_string(), patched.clone());
            Ok(patched)
        }

        fn delete(
            &mut self,
            name: &str,
            preconditions: Option<&Preconditions>,
        ) -> Result<Secret, kube::Error> {
            let current = self.secrets.get(name).ok_or_else(|| not_found(name))?;
            let meta = &current.metadata;
            if let Some(preconditions) = preconditions {
                for (what, wanted, found) in [
                    ("UID", &preconditions.uid, &meta.uid),
                    (
                        "ResourceVersion",
                        &preconditions.resource_version,
                        &meta.resource_version,
                    ),
                ] {
                    if let Some(wanted) = wanted.as_ref().filter(|wanted| Some(*wanted) != found.as_ref()) {
                        return Err(conflict(
                            name,
                            &format!(
                                "Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {}",
                                found.as_deref().unwrap_or_default()
                            ),
                        ));
                    }
                }
            }
            let deleted = self.secrets.remove(name).ok_or_else(|| not_found(name))?;
            self.write();
            Ok(deleted)
        }

        fn list(&self, selector: &str) -> Result<Vec<Secret>, kube::Error> {
            let terms = parse_selector(selector)?;
            let empty = BTreeMap::new();
            Ok(self
                .secrets
                .values()
                .filter(|secret| {
                    let labels = secret.metadata.labels.as_ref().unwrap_or(&empty);
                    terms.iter().all(|term| term.matches(labels))
                })
                .cloned()
                .collect())
        }
    }

    impl MemorySecrets {
        fn state(&self) -> MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(PoisonError::into_inner)
        }

        /// A request arrives: it is counted, yields as the interleaving draws, and fails when
        /// a failure is queued for its kind.
        async fn arrive(&self, verb: Verb) -> Result<(), kube::Error> {
            let yields = {
                let mut state = self.state();
                state.requests.count(verb);
                state.interleaving.as_mut().map_or(0, Interleaving::yields)
            };
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            let mut state = self.state();
            match state.failures.iter().position(|(failing, _)| *failing == verb) {
                Some(at) => {
                    let (_, code) = state.failures.remove(at);
                    Err(status(
                        code,
                        "InternalError",
                        "Internal error occurred: injected by the test",
                    ))
                }
                None => Ok(()),
            }
        }

        /// `POST`.
        pub(crate) async fn create(&self, secret: &Secret) -> Result<Secret, kube::Error> {
            self.arrive(Verb::Create).await?;
            self.state().create(secret)
        }

        /// `GET`.
        pub(crate) async fn get(&self, name: &str) -> Result<Secret, kube::Error> {
            self.arrive(Verb::Get).await?;
            self.state().get(name)
        }

        /// `PUT`.
        pub(crate) async fn replace(&self, name: &str, secret: &Secret) -> Result<Secret, kube::Error> {
            self.arrive(Verb::Replace).await?;
            self.state().replace(name, secret)
        }

        /// `PATCH` with a JSON Patch: 404 when missing, 422 `Invalid` when an operation fails
        /// (a `test` that does not hold included); nothing changes then.
        pub(crate) async fn patch(
            &self,
            name: &str,
            patch: &json_patch::Patch,
        ) -> Result<Secret, kube::Error> {
            self.arrive(Verb::Patch).await?;
            self.state().patch(name, patch)
        }

        /// `DELETE`, with `preconditions` if any.
        pub(crate) async fn delete(
            &self,
            name: &str,
            preconditions: Option<&Preconditions>,
        ) -> Result<Secret, kube::Error> {
            self.arrive(Verb::Delete).await?;
            self.state().delete(name, preconditions)
        }

        /// `LIST` by label selector.
        pub(crate) async fn list(&self, selector: &str) -> Result<Vec<Secret>, kube::Error> {
            self.arrive(Verb::List).await?;
            self.state().list(selector)
        }

        /// A metadata-only `LIST` page by label selector, in name order: at most `limit` after
        /// the name `continue_token` holds; the token of the next page is the last name given,
        /// when more are left.
        pub(crate) async fn list_metadata_page(
            &self,
            selector: &str,
            limit: u32,
            continue_token: Option<String>,
        ) -> Result<(Vec<ObjectMeta>, Option<String>), kube::Error> {
            self.arrive(Verb::List).await?;
            let mut matching: Vec<ObjectMeta> = self
                .state()
                .list(selector)?
                .into_iter()
                .map(|secret| secret.metadata)
                .filter(|metadata| continue_token.is_none() || metadata.name > continue_token)
                .collect();
            matching.sort_by(|a, b| a.name.cmp(&b.name));
            let limit = usize::try_from(limit).unwrap_or(usize::MAX).max(1);
            let next = (matching.len() > limit)
                .then(|| matching[limit - 1].name.clone())
                .flatten();
            matching.truncate(limit);
            Ok((matching, next))
        }

        /// From now on every request first yields to the runtime 0 to `max_yields` times, as
        /// drawn by a generator seeded with `seed`.
        #[cfg_attr(
            not(test),
            expect(
                dead_code,
                reason = "unit tests only: the fuzz targets inject no failure or interleaving"
            )
        )]
        pub(crate) fn interleave(&self, seed: u64, max_yields: u64) {
            self.state().interleaving = Some(Interleaving {
                state: seed,
                max_yields,
            });
        }

        /// The next request of kind `verb` fails with `code` (`InternalError`).
        #[cfg_attr(
            not(test),
            expect(
                dead_code,
                reason = "unit tests only: the fuzz targets inject no failure or interleaving"
            )
        )]
        pub(crate) fn fail_next(&self, verb: Verb, code: u16) {
            self.state().failures.push((verb, code));
        }

        /// The requests counted since the last call.
        pub(crate) fn take_requests(&self) -> Requests {
            std::mem::take(&mut self.state().requests)
        }

        /// Every stored Secret, in name order (no request is counted).
        pub(crate) fn secrets(&self) -> Vec<Secret> {
            self.state().secrets.values().cloned().collect()
        }

        /// The Secret `name`, as stored (no request is counted).
        #[cfg_attr(
            not(test),
            expect(
                dead_code,
                reason = "unit tests only: the fuzz targets inject no failure or interleaving"
            )
        )]
        pub(crate) fn stored(&self, name: &str) -> Option<Secret> {
            self.state().secrets.get(name).cloned()
        }

        /// Changes the Secret `name` as another writer would (it takes a new resourceVersion);
        /// `false` when there is none.
        #[cfg_attr(
            not(test),
            expect(
                dead_code,
                reason = "unit tests only: the fuzz targets inject no failure or interleaving"
            )
        )]
        pub(crate) fn edit(&self, name: &str, change: impl FnOnce(&mut Secret)) -> bool {
            let mut state = self.state();
            let version = state.write();
            match state.secrets.get_mut(name) {
                Some(secret) => {
                    change(secret);
                    secret.metadata.resource_version = Some(version);
                    true
                }
                None => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta, ByteString};
    use kube::api::Preconditions;
    use time::OffsetDateTime;

    use super::memory::{Requests, Verb};
    use super::*;
    use crate::session::{Identity, Upstream};

    fn session(request_id: &str) -> Session {
        Session {
            request_id: request_id.into(),
            client_id: "pinniped-cli".into(),
            redirect_uri: "http://127.0.0.1/callback".into(),
            scopes: vec!["openid".into()],
            nonce: None,
            code_challenge: "challenge".into(),
            requested_at: 0,
            auth_time: 0,
            expires_at: 0,
            idle_timeout: None,
            code_active: true,
            token_expires_at: 0,
            identity: Identity {
                subject: "sub".into(),
                username: "pinny".into(),
                groups: vec![],
                additional_claims: BTreeMap::new(),
            },
            upstream: Upstream {
                idp_name: "Dex".into(),
                idp_type: "oidc".into(),
                provider_name: String::new(),
                provider_uid: String::new(),
                issuer: "https://dex.example.com".into(),
                subject: "sub".into(),
                refresh_token: None,
                access_token: None,
                ldap: None,
                username: None,
                groups: None,
            },
            access_token_signature: None,
            rotated: false,
        }
    }

    fn secret(name: &str, labels: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("k".to_string(), ByteString(b"v".to_vec()))])),
            ..Secret::default()
        }
    }

    /// The code and reason of a kube-apiserver error.
    fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
        match result {
            Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    fn version(secret: &Secret) -> u64 {
        secret
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// What the store relies on kube-apiserver for — a taken name, a missing object, a stale
    /// resourceVersion or UID, label selection — the in-memory namespace answers the same way,
    /// with the same codes and reasons; every write takes a new resourceVersion.
    #[tokio::test(flavor = "current_thread")]
    async fn the_in_memory_namespace_answers_as_kube_apiserver_does() {
        let (_, memory) = Store::in_memory();
        let a = memory
            .create(&secret("a", &[("t", "x"), ("r", "1")]))
            .await
            .unwrap();
        assert_eq!(version(&a), 1);
        assert!(a.metadata.uid.is_some());
        assert_eq!(
            refusal(memory.create(&secret("a", &[])).await),
            (409, "AlreadyExists".into())
        );
        assert_eq!(
            refusal(memory.create(&a).await),
            (400, "BadRequest".into()),
            "a resourceVersion on create"
        );
        assert_eq!(
            refusal(memory.create(&secret("Not_A_Name", &[])).await),
            (422, "Invalid".into())
        );
        assert_eq!(
            refusal(memory.create(&secret("b", &[("t", "-x")])).await),
            (422, "Invalid".into())
        );
        assert_eq!(refusal(memory.get("missing").await), (404, "NotFound".into()));

        // Replace: conditional on the resourceVersion the object carries.
        let replaced = memory.replace("a", &a).await.unwrap();
        assert_eq!(version(&replaced), 2);
        assert_eq!(replaced.metadata.uid, a.metadata.uid);
        assert_eq!(
            refusal(memory.replace("a", &a).await),
            (409, "Conflict".into()),
            "stale"
        );
        let mut unconditional = a.clone();
        unconditional.metadata.resource_version = None;
        assert_eq!(version(&memory.replace("a", &unconditional).await.unwrap()), 3);
        let mut other_uid = unconditional.clone();
        other_uid.metadata.uid = Some("another".into());
        assert_eq!(
            refusal(memory.replace("a", &other_uid).await),
            (409, "Conflict".into())
        );
        assert_eq!(
            refusal(memory.replace("b", &a).await),
            (400, "BadRequest".into()),
            "name mismatch"
        );
        assert_eq!(
            refusal(memory.replace("missing", &secret("missing", &[])).await),
            (404, "NotFound".into())
        );

        // Delete: preconditions.
        let current = memory.get("a").await.unwrap();
        let stale = Preconditions {
            uid: current.metadata.uid.clone(),
            resource_version: Some("1".into()),
        };
        assert_eq!(
            refusal(memory.delete("a", Some(&stale)).await),
            (409, "Conflict".into())
        );
        let wrong_uid = Preconditions {
            uid: Some("another".into()),
            resource_version: None,
        };
        assert_eq!(
            refusal(memory.delete("a", Some(&wrong_uid)).await),
            (409, "Conflict".into())
        );
        let exact = Preconditions {
            uid: current.metadata.uid.clone(),
            resource_version: current.metadata.resource_version.clone(),
        };
        memory.delete("a", Some(&exact)).await.unwrap();
        assert_eq!(refusal(memory.delete("a", None).await), (404, "NotFound".into()));
        let next = memory.create(&secret("a", &[])).await.unwrap();
        assert_eq!(version(&next), 5, "the delete was a write too");
        assert_ne!(
            next.metadata.uid, current.metadata.uid,
            "a recreated object is another object"
        );

        // List: equality, inequality, existence and absence terms.
        memory
            .create(&secret("c", &[("t", "x"), ("r", "2")]))
            .await
            .unwrap();
        memory
            .create(&secret("d", &[("t", "y"), ("r", "1")]))
            .await
            .unwrap();
        let names = |found: Vec<Secret>| {
            found
                .into_iter()
                .map(|s| s.metadata.name.unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(memory.list("t=x,r=2").await.unwrap()), ["c"]);
        assert_eq!(names(memory.list("t==y").await.unwrap()), ["d"]);
        assert_eq!(names(memory.list("t").await.unwrap()), ["c", "d"]);
        assert_eq!(names(memory.list("!t").await.unwrap()), ["a"]);
        assert_eq!(names(memory.list("r!=1").await.unwrap()), ["a", "c"]);
        assert_eq!(names(memory.list("").await.unwrap()), ["a", "c", "d"]);
        assert_eq!(refusal(memory.list("t in (x)").await), (400, "BadRequest".into()));
        assert_eq!(refusal(memory.list("t=x=y").await), (400, "BadRequest".into()));

        // Patch (JSON Patch): atomic, a failed `test` changes nothing.
        let json_patch = |ops: serde_json::Value| serde_json::from_value::<json_patch::Patch>(ops).unwrap();
        let before = memory.get("c").await.unwrap();
        let failing = json_patch(serde_json::json!([
            {"op": "add", "path": "/data", "value": {"k": "dg=="}},
            {"op": "test", "path": "/metadata/name", "value": "d"},
        ]));
        assert_eq!(
            refusal(memory.patch("c", &failing).await),
            (422, "Invalid".into())
        );
        assert_eq!(memory.get("c").await.unwrap(), before, "nothing changed");
        let holding = json_patch(serde_json::json!([
            {"op": "test", "path": "/metadata/name", "value": "c"},
            {"op": "add", "path": "/data", "value": {"k": "dg=="}},
        ]));
        let patched = memory.patch("c", &holding).await.unwrap();
        assert_eq!(patched.data.as_ref().unwrap()["k"].0, b"v");
        assert!(version(&patched) > version(&before));
        assert_eq!(patched.metadata.uid, before.metadata.uid);
        assert_eq!(
            refusal(memory.patch("missing", &holding).await),
            (404, "NotFound".into())
        );

        memory.fail_next(Verb::Get, 503);
        assert_eq!(refusal(memory.get("c").await), (503, "InternalError".into()));
        memory.get("c").await.unwrap();
        let requests = memory.take_requests();
        assert_eq!(
            requests,
            Requests {
                create: 8,
                get: 6,
                replace: 6,
                patch: 3,
                delete: 4,
                list: 8,
            }
        );
        assert_eq!(memory.take_requests().total(), 0);
    }

    /// The store's contract over the in-memory namespace: what it reads back is what it wrote,
    /// an update loses to a concurrent writer, deletes of what is gone succeed, a login's tokens
    /// go together, and only what is past its collection time is collectable.
    #[tokio::test(flavor = "current_thread")]
    async fn the_store_keeps_its_contract_over_the_in_memory_namespace() {
        let (store, memory) = Store::in_memory();
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let hour = time::Duration::hours(1);
        store
            .create(Resource::AuthCode, "c0de", &session("r1"), hour, now)
            .await
            .unwrap();
        assert!(matches!(
            store.create(Resource::AuthCode, "c0de", &session("r1"), hour, now).await,
            Err(StoreError::Api(kube::Error::Api(status))) if status.code == 409
        ));
        let (read, stored) = store.get(Resource::AuthCode, "c0de").await.unwrap().unwrap();
        assert_eq!(read, session("r1"));
        assert!(store.get(Resource::AccessToken, "c0de").await.unwrap().is_none());

        let mut used = read.clone();
        used.code_active = false;
        memory.edit(&Resource::AuthCode.secret_name("c0de"), |_| {});
        assert!(matches!(
            store.update(Resource::AuthCode, "c0de", stored, &used).await,
            Err(StoreError::Conflict)
        ));
        let (_, fresh) = store.get(Resource::AuthCode, "c0de").await.unwrap().unwrap();
        store
            .update(Resource::AuthCode, "c0de", fresh.clone(), &used)
            .await
            .unwrap();
        let (reread, updated) = store.get(Resource::AuthCode, "c0de").await.unwrap().unwrap();
        assert_eq!(reread, used);
        assert_eq!(
            updated.metadata.labels, fresh.metadata.labels,
            "labels survive an update"
        );
        assert!(
            !store.delete_unchanged(&fresh).await.unwrap(),
            "changed since read"
        );

        for (resource, signature, request_id) in [
            (Resource::AccessToken, "a1", "r1"),
            (Resource::AccessToken, "a2", "r1"),
            (Resource::RefreshToken, "f1", "r1"),
            (Resource::AccessToken, "a3", "r2"),
        ] {
            store
                .create(resource, signature, &session(request_id), hour, now)
                .await
                .unwrap();
        }
        memory.take_requests();
        let ended = store.delete_login(Resource::AccessToken, "r1").await.unwrap();
        assert_eq!(ended, [session("r1"), session("r1")]);
        assert_eq!(
            memory.take_requests(),
            Requests {
                list: 1,
                delete: 2,
                ..Requests::default()
            }
        );
        assert!(store.get(Resource::AccessToken, "a1").await.unwrap().is_none());
        assert!(
            store.get(Resource::RefreshToken, "f1").await.unwrap().is_some(),
            "another resource"
        );
        assert!(
            store.get(Resource::AccessToken, "a3").await.unwrap().is_some(),
            "another login"
        );
        store.delete(Resource::AccessToken, "a1").await.unwrap();

        store
            .create(Resource::AccessToken, "old", &session("r3"), -hour, now)
            .await
            .unwrap();
        memory.create(&secret("unrelated", &[])).await.unwrap();
        let collectable = store.collectable(now, 8).await.unwrap();
        assert_eq!(
            collectable
                .iter()
                .map(|s| s.metadata.name.clone().unwrap())
                .collect::<Vec<_>>(),
            [Resource::AccessToken.secret_name("old")]
        );
        assert!(store.delete_unchanged(&collectable[0]).await.unwrap());
        assert!(!store.delete_unchanged(&collectable[0]).await.unwrap(), "gone");
        assert!(memory.stored(&Resource::AccessToken.secret_name("old")).is_none());
    }

    /// The collector lists by metadata only, page by page, and reads in whole just the expired
    /// Secrets: with 1,201 sessions of which 3 are expired (one in each page), a sweep's list is
    /// three pages and three reads.
    #[tokio::test]
    async fn the_collector_lists_metadata_in_pages_and_reads_only_what_expired() {
        let (store, memory) = Store::in_memory();
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let hour = time::Duration::hours(1);
        let mut expired = Vec::new();
        for n in 0..1201 {
            let signature = format!("s{n:05}");
            let lifetime = if n % 500 == 7 { -hour } else { hour };
            store
                .create(Resource::AccessToken, &signature, &session("r"), lifetime, now)
                .await
                .unwrap();
            if lifetime < time::Duration::ZERO {
                expired.push(Resource::AccessToken.secret_name(&signature));
            }
        }
        memory.take_requests();
        let collectable = store.collectable(now, 8).await.unwrap();
        let mut names: Vec<String> = collectable
            .iter()
            .map(|secret| secret.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        expired.sort();
        assert_eq!(names, expired);
        assert!(
            collectable.iter().all(|secret| secret.data.is_some()),
            "read in whole"
        );
        assert_eq!(
            memory.take_requests(),
            Requests {
                list: 3,
                get: 3,
                ..Requests::default()
            }
        );
    }

    /// Concurrent callers interleave in an order that depends on the seed only: the same seed
    /// replays the same interleaving, other seeds give others.
    #[tokio::test(flavor = "current_thread")]
    async fn interleavings_depend_on_the_seed_only() {
        async fn order(seed: u64) -> String {
            let (_, memory) = Store::in_memory();
            memory.interleave(seed, 3);
            let writer = |prefix: &'static str| {
                let memory = memory.clone();
                async move {
                    for n in 0..6 {
                        memory
                            .create(&secret(&format!("{prefix}{n}"), &[]))
                            .await
                            .unwrap();
                    }
                }
            };
            futures::join!(writer("a"), writer("b"));
            let mut secrets = memory.secrets();
            secrets.sort_by_key(version);
            secrets
                .iter()
                .map(|s| &s.metadata.name.as_deref().unwrap()[..1])
                .collect()
        }
        let first = order(7).await;
        assert_eq!(order(7).await, first);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..16 {
            seen.insert(order(seed).await);
        }
        assert!(seen.len() > 4, "{seen:?}");
    }
}
