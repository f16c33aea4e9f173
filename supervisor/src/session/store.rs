//! Sessions kept in Kubernetes Secrets of the Supervisor's namespace ([`crate::session::storage`] names
//! and shapes them): written when a code is issued, read and rewritten by the token endpoint on
//! any replica, deleted when revoked or expired.
//!
//! A login costs five requests: three writes (the code's Secret, then the access and refresh
//! tokens' Secrets) and one read and one conditional replace (redeeming the code); a refresh
//! five: one read, two writes and the deletions of the old refresh token and of the access token
//! issued with it. Pinniped also writes `pkce` and `oidc` Secrets per code; Selkie keeps the
//! PKCE challenge and the nonce in the code's own Secret, saving two writes and two deletes per
//! login.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{
    api::{DeleteParams, ListParams, PostParams, Preconditions},
    Api,
};
use time::OffsetDateTime;

use crate::session::storage::{garbage_collect_after, Resource, StorageError, TYPE_LABEL};
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
}

/// The session store of one namespace.
#[derive(Clone)]
pub struct Store {
    secrets: Api<Secret>,
}

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
        Self { secrets }
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
        self.secrets.create(&PostParams::default(), &secret).await?;
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
        match self.secrets.replace(&name, &PostParams::default(), &stored).await {
            Ok(_) => Ok(()),
            Err(error) if is_status(&error, 409) => Err(StoreError::Conflict),
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

    /// Deletes every `resource` Secret of the login `request_id` (revoking its tokens).
    pub async fn delete_login(&self, resource: Resource, request_id: &str) -> Result<usize, StoreError> {
        let selector = format!(
            "{TYPE_LABEL}={},{REQUEST_ID_LABEL}={request_id}",
            resource.as_str()
        );
        let found = self
            .secrets
            .list(&ListParams::default().labels(&selector))
            .await?;
        let mut deleted = 0;
        for secret in found.items {
            let Some(name) = secret.metadata.name else {
                continue;
            };
            match self.secrets.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(error) if is_status(&error, 404) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(deleted)
    }

    /// Every storage Secret whose garbage-collect-after time is before `now` (one list call).
    pub async fn collectable(&self, now: OffsetDateTime) -> Result<Vec<Secret>, StoreError> {
        let found = self
            .secrets
            .list(&ListParams::default().labels(TYPE_LABEL))
            .await?;
        Ok(found
            .items
            .into_iter()
            .filter(|secret| garbage_collect_after(secret).is_some_and(|after| after < now))
            .collect())
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
