//! The credential cache, `credentials.yaml`, in the pinniped CLI's format, so either CLI reuses
//! the other's cluster credentials.
//!
//! # Format
//!
//! ```yaml
//! apiVersion: config.supervisor.pinniped.dev/v1alpha1
//! kind: CredentialCache
//! credentials:
//!   - key: <sha256 hex of the login's arguments, token and cluster>   # see [`cache_key`]
//!     creationTimestamp: "2026-01-02T03:04:05Z"
//!     lastUsedTimestamp: "2026-01-02T03:09:05Z"
//!     credential:                      # client-go ExecCredentialStatus
//!       expirationTimestamp: "2026-01-02T03:09:05Z"
//!       clientCertificateData: |
//!         -----BEGIN CERTIFICATE-----
//!       clientKeyData: |
//!         -----BEGIN PRIVATE KEY-----
//! ```
//!
//! # Rules (Pinniped's, plus what it leaves out)
//!
//! * Every read-modify-write holds an exclusive `flock` on `<file>.lock`, the lock the pinniped
//!   CLI takes (gofrs/flock uses `flock(2)`), so the two CLIs never interleave.
//! * Unlike the pinniped CLI, Selkie keeps the lock while it fetches a missing credential, so
//!   parallel kubectl invocations on a cold cache make one TokenCredentialRequest, not one each:
//!   the others wait, then find the entry.
//! * Entries without a credential or expiry, expired entries, and entries created more than an
//!   hour ago are dropped on every write (Pinniped's pruning). An entry is handed out only while
//!   at least [`MIN_REMAINING_VALIDITY`] of it is left, so a certificate does not expire between
//!   the plugin and the API server.
//! * The file is written as a new file (mode 0600) renamed over the old one, so a reader never
//!   sees half a file and a file left readable by others is tightened (with a warning).
//! * A file that is not a credential cache of this version is set aside as `<file>.corrupt` with a
//!   warning, and a fresh cache starts. Any other problem with the cache (permissions, a
//!   directory in the way, a lock that is not released in time) is a warning too: the login goes
//!   on without the cache rather than failing.

use std::{
    future::Future,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use crate::{
    exec::Cluster,
    exec::CredentialStatus,
    gojson, timestamp,
    yaml_file::{null_as_empty, Document, IoFailure, LoadError, Lock, LockError, OpenToOthers, YamlFile},
};

/// `apiVersion` of the file.
pub const API_VERSION: &str = "config.supervisor.pinniped.dev/v1alpha1";
/// `kind` of the file.
pub const KIND: &str = "CredentialCache";
/// How long an entry may live, however long its credential is valid (Pinniped's
/// `maxCacheDuration`).
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// How much validity an entry must have left to be handed out.
pub const MIN_REMAINING_VALIDITY: Duration = Duration::from_secs(10);
/// How long to wait for another process's lock before going on without the cache. Longer than a
/// TokenCredentialRequest may take (30 s), since another Selkie holds the lock while it makes one.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(40);

/// The key of an entry: the hex SHA-256 of Go's JSON encoding (trailing newline included) of
/// `{"args": <argv without the program>, "token": <token>, "cluster": <v1beta1 Cluster or null>}`,
/// exactly what the pinniped CLI hashes, so the same kubeconfig finds the same entry with either.
pub fn cache_key(args: &[String], token: &str, cluster: Option<&Cluster>) -> String {
    key_of(args, Some(token), cluster)
}

/// The key of an entry written by `login oidc`: the same hash without the token member,
/// `{"args": …, "cluster": …}`, which is what pinniped's `login oidc` hashes.
pub fn oidc_cache_key(args: &[String], cluster: Option<&Cluster>) -> String {
    key_of(args, None, cluster)
}

fn key_of(args: &[String], token: Option<&str>, cluster: Option<&Cluster>) -> String {
    let mut json = String::from("{\"args\":[");
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        gojson::write_string(&mut json, arg);
    }
    json.push(']');
    if let Some(token) = token {
        json.push_str(",\"token\":");
        gojson::write_string(&mut json, token);
    }
    json.push_str(",\"cluster\":");
    let mut cluster_json = String::new();
    match cluster {
        Some(cluster) if cluster.write_go_json(&mut cluster_json) => json.push_str(&cluster_json),
        _ => json.push_str("null"),
    }
    json.push_str("}\n");
    Sha256::digest(json.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Something wrong with the cache that the login survives. Each is one line for stderr, naming
/// the file and what to do; none quotes the file's content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheWarning {
    /// The cache (or its directory or lock file) cannot be read, created or written: usually
    /// permissions, or something else in the way.
    #[error(
        "cannot use the credential cache {path}: {action}: {error}; continuing without it \
         (make it readable and writable by you, e.g. chmod 600, or pass --credential-cache \"\")"
    )]
    Unusable {
        /// The file at fault.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The IO error.
        #[source]
        error: io::Error,
    },
    /// Another process kept the lock for longer than [`LOCK_TIMEOUT`].
    #[error(
        "the credential cache lock {path} was not released within {timeout:?}; continuing without the cache \
         (a stuck kubectl or credential plugin may hold it)"
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long was waited.
        timeout: Duration,
    },
    /// The file is not a credential cache Selkie understands; it was moved aside.
    #[error("the credential cache {path} {reason}; moved it to {aside} and started an empty cache")]
    SetAside {
        /// The cache.
        path: PathBuf,
        /// Where it went.
        aside: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The file was unreadable as a cache and could not be moved aside either; it will be
    /// overwritten.
    #[error("the credential cache {path} {reason} and could not be moved aside ({error}); replacing it")]
    NotSetAside {
        /// The cache.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// Why the rename failed.
        #[source]
        error: io::Error,
    },
    /// The file could be read by other users; it holds private keys. Its mode was set to 0600.
    #[error(
        "the credential cache {path} was accessible to other users (mode {mode:04o}) and holds private keys; \
         it is now 0600"
    )]
    TooOpen {
        /// The cache.
        path: PathBuf,
        /// Its permission bits before.
        mode: u32,
    },
}

/// Where a credential came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A cache entry.
    Cache,
    /// The fetch function (and it was then stored, unless a warning said otherwise).
    Fetched,
}

/// `credentials.yaml` at a path.
#[derive(Debug, Clone)]
pub struct CredentialCache {
    file: YamlFile,
    lock_timeout: Duration,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    credentials: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    creation_timestamp: Option<String>,
    #[serde(default)]
    last_used_timestamp: Option<String>,
    #[serde(default)]
    credential: Option<CredentialStatus>,
}

impl Entry {
    fn expiry(&self) -> Option<OffsetDateTime> {
        self.credential
            .as_ref()?
            .expiration_timestamp
            .as_deref()
            .and_then(timestamp::parse)
    }

    fn created(&self) -> Option<OffsetDateTime> {
        self.creation_timestamp.as_deref().and_then(timestamp::parse)
    }

    /// Pinniped keeps an entry that has a credential and an expiry, has not expired, and was
    /// created within the last hour. (An unparseable timestamp counts as missing.)
    fn keep(&self, now: OffsetDateTime) -> bool {
        let (Some(expiry), Some(created)) = (self.expiry(), self.created()) else {
            return false;
        };
        expiry >= now && created >= now - MAX_AGE
    }

    fn usable(&self, now: OffsetDateTime) -> bool {
        self.keep(now)
            && self
                .expiry()
                .is_some_and(|expiry| expiry - now >= MIN_REMAINING_VALIDITY)
            && self.credential.as_ref().is_some_and(CredentialStatus::is_usable)
    }
}

impl Document for CacheFile {
    const NAME: &'static str = "credential-cache";

    fn empty() -> Self {
        Self {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            credentials: Vec::new(),
        }
    }

    fn header(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }
}

impl CacheFile {
    /// Pinniped's `normalized`: stale entries dropped, the rest ordered by creation time.
    fn normalize(&mut self, now: OffsetDateTime) {
        self.credentials.retain(|entry| entry.keep(now));
        self.credentials.sort_by_key(Entry::created);
    }
}

impl CredentialCache {
    /// The cache at `path` (it need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            file: YamlFile::new(path),
            lock_timeout: LOCK_TIMEOUT,
        }
    }

    /// The same cache, waiting at most `timeout` for the lock.
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// `<file>.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.file.lock_path()
    }

    /// `<file>.corrupt`, where an unreadable cache is moved.
    pub fn aside_path(&self) -> PathBuf {
        self.file.aside_path()
    }

    /// Forgets every cached credential (at logout: a cached cluster credential would otherwise
    /// keep working until it expires) and returns how many there were. Under the lock; fails when
    /// the file cannot be locked, read or written (a file that is not a credential cache is set
    /// aside, a warning, and counts as empty).
    pub async fn clear(&self, warn: &mut (dyn FnMut(CacheWarning) + Send)) -> Result<usize, CacheWarning> {
        let lock = self.lock().await?;
        let mut file = self.read(warn)?;
        let removed = file.credentials.len();
        file.credentials.clear();
        self.write(&file)?;
        drop(lock);
        Ok(removed)
    }

    /// The credential stored under `key` if it has at least [`MIN_REMAINING_VALIDITY`] left
    /// (its last-used time is updated); otherwise the result of `fetch`, stored under `key`. The
    /// lock is held from the read until the write, `fetch` included. Problems with the cache
    /// itself go to `warn` and never fail the call: without a usable cache, `fetch` is simply
    /// called. Fails only with `fetch`'s error, in which case nothing is stored.
    pub async fn get_or_fetch<F, Fut, E>(
        &self,
        key: &str,
        fetch: F,
        warn: &mut (dyn FnMut(CacheWarning) + Send),
    ) -> Result<(CredentialStatus, Source), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<CredentialStatus, E>>,
    {
        let lock = match self.lock().await {
            Ok(lock) => lock,
            Err(warning) => {
                warn(warning);
                return fetch().await.map(|credential| (credential, Source::Fetched));
            }
        };
        let mut file = match self.read(warn) {
            Ok(file) => file,
            Err(warning) => {
                warn(warning);
                drop(lock);
                return fetch().await.map(|credential| (credential, Source::Fetched));
            }
        };
        let now = timestamp::now();
        file.normalize(now);
        if let Some(entry) = file
            .credentials
            .iter_mut()
            .find(|entry| entry.key == key && entry.usable(now))
        {
            entry.last_used_timestamp = Some(timestamp::format(now));
            let credential = entry.credential.clone().unwrap_or_default();
            if let Err(warning) = self.write(&file) {
                warn(warning);
            }
            return Ok((credential, Source::Cache));
        }

        let credential = fetch().await?;
        let now = timestamp::now();
        let stamp = timestamp::format(now);
        match file.credentials.iter_mut().find(|entry| entry.key == key) {
            // Pinniped keeps the creation time of an entry it refreshes.
            Some(entry) => {
                entry.credential = Some(credential.clone());
                entry.last_used_timestamp = Some(stamp);
            }
            None => file.credentials.push(Entry {
                key: key.to_string(),
                creation_timestamp: Some(stamp.clone()),
                last_used_timestamp: Some(stamp),
                credential: Some(credential.clone()),
            }),
        }
        file.normalize(now);
        if let Err(warning) = self.write(&file) {
            warn(warning);
        }
        drop(lock);
        Ok((credential, Source::Fetched))
    }

    /// Creates the directory (0700) and takes the exclusive lock, polling like gofrs/flock.
    async fn lock(&self) -> Result<Lock, CacheWarning> {
        self.file
            .lock(self.lock_timeout)
            .await
            .map_err(|error| match error {
                LockError::Io(failure) => self.unusable(failure),
                LockError::Timeout { lock, timeout } => CacheWarning::LockTimeout { path: lock, timeout },
            })
    }

    /// Reads the file (absent = empty). A file open to others is made 0600 (a warning);
    /// unreadable content is set aside, or left to be replaced when it cannot be moved (a
    /// warning, then empty); an IO error is returned as the reason not to use the cache at all.
    fn read(&self, warn: &mut (dyn FnMut(CacheWarning) + Send)) -> Result<CacheFile, CacheWarning> {
        let loaded = self
            .file
            .load::<CacheFile>(OpenToOthers::Tighten)
            .map_err(|error| match error {
                LoadError::Io(failure) => self.unusable(failure),
                // Not asked for (the cache tightens such a file), but the same fact.
                LoadError::OpenToOthers { mode } => CacheWarning::TooOpen {
                    path: self.path().to_path_buf(),
                    mode,
                },
            })?;
        if let Some(mode) = loaded.tightened_from {
            warn(CacheWarning::TooOpen {
                path: self.path().to_path_buf(),
                mode,
            });
        }
        if let Some(corrupt) = loaded.corrupt {
            let path = self.path().to_path_buf();
            warn(match corrupt.moved {
                Ok(aside) => CacheWarning::SetAside {
                    path,
                    aside,
                    reason: corrupt.reason,
                },
                Err(error) => CacheWarning::NotSetAside {
                    path,
                    reason: corrupt.reason,
                    error,
                },
            });
        }
        Ok(loaded.document)
    }

    /// Writes `file` to a private temporary sibling and renames it over the cache.
    fn write(&self, file: &CacheFile) -> Result<(), CacheWarning> {
        self.file.store(file).map_err(|failure| self.unusable(failure))
    }

    fn unusable(&self, IoFailure { action, error }: IoFailure) -> CacheWarning {
        CacheWarning::Unusable {
            path: self.path().to_path_buf(),
            action,
            error,
        }
    }
}

#[cfg(test)]
mod tests;
