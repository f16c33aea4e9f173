//! The OIDC session cache, `sessions.yaml`, in the pinniped CLI's format and under its lock, so
//! either CLI reuses the other's logins.
//!
//! # Format (pinniped `pkg/oidcclient/filesession/cachefile.go`)
//!
//! ```yaml
//! apiVersion: config.supervisor.pinniped.dev/v1alpha1
//! kind: SessionCache
//! sessions:
//! - creationTimestamp: "2026-01-02T03:04:05Z"
//!   key:
//!     clientID: pinniped-cli
//!     issuer: https://issuer.example.com
//!     redirect_uri: http://localhost:0/callback
//!     scopes: [groups, offline_access, openid]        # sorted
//!     upstream_provider_name: my-ldap                  # omitted when empty
//!   lastUsedTimestamp: "2026-01-02T03:04:05Z"
//!   tokens:
//!     access: {token: …, type: Bearer, expiryTimestamp: …}
//!     id: {token: …, expiryTimestamp: …, claims: {…}}
//!     refresh: {token: …}
//! ```
//!
//! Keys are written in the order Go's `sigs.k8s.io/yaml` writes them (sorted), so a file written
//! by one CLI and rewritten by the other does not churn.
//!
//! # Rules
//!
//! * Every read-modify-write holds `flock` on `<file>.lock` (pinniped's lock), waiting at most
//!   [`LOCK_TIMEOUT`]; past that the login goes on without the cache (a warning).
//! * On every write, expired ID and access tokens are dropped, entries left without any token
//!   are dropped, and so are entries unused for 90 days; entries are ordered by creation time.
//! * The file holds refresh tokens: a file that other users can read or write is refused (an
//!   error that says to `chmod 600` it), and it is always written 0600 via a renamed temporary.
//! * A file that is not a session cache of this version is moved aside to `<file>.corrupt` (a
//!   warning) and an empty cache starts.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::{
    timestamp,
    yaml_file::{null_as_empty, Document, IoFailure, LoadError, Lock, LockError, OpenToOthers, YamlFile},
};

/// `apiVersion` of the file.
pub const API_VERSION: &str = "config.supervisor.pinniped.dev/v1alpha1";
/// `kind` of the file.
pub const KIND: &str = "SessionCache";
/// How long an unused session is kept (pinniped's `sessionExpiration`).
pub const SESSION_EXPIRATION: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long to wait for the lock (pinniped's `defaultFileLockTimeout`).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// What identifies a session: pinniped's `SessionCacheKey` (field names and order of its YAML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SessionKey {
    /// The OAuth client ID.
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    /// The issuer URL, as given.
    #[serde(default)]
    pub issuer: String,
    /// The redirect URI of the key (`http://localhost:<port or 0>/callback`, as pinniped writes it).
    #[serde(rename = "redirect_uri", default)]
    pub redirect_uri: String,
    /// The requested scopes, sorted.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub scopes: Vec<String>,
    /// The Supervisor's upstream identity provider, when one was named.
    #[serde(
        rename = "upstream_provider_name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub upstream_provider_name: String,
}

/// An OAuth2 access token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AccessToken {
    /// When it expires (RFC 3339), if known.
    #[serde(rename = "expiryTimestamp", default)]
    pub expiry: Option<String>,
    /// The token.
    #[serde(default)]
    pub token: String,
    /// The token type (`Bearer`).
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub token_type: String,
}

/// An OIDC ID token.
#[derive(Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct IdToken {
    /// Its claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<BTreeMap<String, serde_json::Value>>,
    /// When it expires (RFC 3339).
    #[serde(rename = "expiryTimestamp", default)]
    pub expiry: Option<String>,
    /// The token (a JWT).
    #[serde(default)]
    pub token: String,
}

/// An OAuth2 refresh token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RefreshToken {
    /// The token.
    #[serde(default)]
    pub token: String,
}

/// The tokens of a session (pinniped's `oidctypes.Token`).
#[derive(Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Tokens {
    /// The access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessToken>,
    /// The ID token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<IdToken>,
    /// The refresh token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<RefreshToken>,
}

impl std::fmt::Debug for IdToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdToken")
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("access", &self.access.as_ref().map(|_| "<redacted>"))
            .field(
                "id",
                &self.id.as_ref().map(|id| (id.expiry.clone(), "<redacted>")),
            )
            .field("refresh", &self.refresh.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl From<selkie_oidc::rp::IdToken> for IdToken {
    fn from(id: selkie_oidc::rp::IdToken) -> Self {
        Self {
            claims: Some(id.claims.into_iter().collect()),
            expiry: Some(timestamp::format(id.expiry)),
            token: id.token,
        }
    }
}

impl From<selkie_oidc::rp::Tokens> for Tokens {
    /// The tokens of an answer, in the cache's form (times as `metav1.Time`).
    fn from(tokens: selkie_oidc::rp::Tokens) -> Self {
        Self {
            access: tokens.access.map(|access| AccessToken {
                expiry: access.expiry.map(timestamp::format),
                token: access.token,
                token_type: access.token_type,
            }),
            id: tokens.id.map(IdToken::from),
            refresh: tokens
                .refresh
                .map(|refresh| RefreshToken { token: refresh.token }),
        }
    }
}

impl Tokens {
    /// The ID token's expiry, if it has a parseable one.
    pub fn id_expiry(&self) -> Option<OffsetDateTime> {
        self.id.as_ref()?.expiry.as_deref().and_then(timestamp::parse)
    }

    /// The access token's expiry, if it has a parseable one.
    pub fn access_expiry(&self) -> Option<OffsetDateTime> {
        self.access.as_ref()?.expiry.as_deref().and_then(timestamp::parse)
    }

    /// Pinniped's pruning of one entry's tokens: empty or expired ID and access tokens and empty
    /// refresh tokens are dropped.
    fn prune(&mut self, now: OffsetDateTime) {
        let expired = |expiry: Option<OffsetDateTime>| expiry.is_some_and(|expiry| expiry < now);
        if self.id.as_ref().is_some_and(|id| id.token.is_empty()) || expired(self.id_expiry()) {
            self.id = None;
        }
        if self.access.as_ref().is_some_and(|a| a.token.is_empty()) || expired(self.access_expiry()) {
            self.access = None;
        }
        if self.refresh.as_ref().is_some_and(|r| r.token.is_empty()) {
            self.refresh = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.id.is_none() && self.access.is_none() && self.refresh.is_none()
    }
}

#[derive(Serialize, Deserialize, Default)]
struct SessionFile {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    sessions: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    #[serde(rename = "creationTimestamp", default)]
    creation: Option<String>,
    #[serde(default)]
    key: SessionKey,
    #[serde(rename = "lastUsedTimestamp", default)]
    last_used: Option<String>,
    #[serde(default)]
    tokens: Tokens,
}

impl Document for SessionFile {
    const NAME: &'static str = "session-cache";

    fn empty() -> Self {
        Self {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            sessions: Vec::new(),
        }
    }

    fn header(&self) -> (&str, &str) {
        (&self.api_version, &self.kind)
    }
}

/// A problem with the session cache that the login survives (one line each; none quotes the
/// file's content).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionWarning {
    /// The file or its lock cannot be read, created or written.
    #[error(
        "cannot use the session cache {path}: {action}: {error}; continuing without it \
         (fix its directory's permissions, or pass --session-cache with another path)"
    )]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The IO error.
        #[source]
        error: io::Error,
    },
    /// Another process held the lock too long.
    #[error(
        "the session cache lock {path} was not released within {timeout:?}; continuing without the cache"
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long was waited.
        timeout: Duration,
    },
    /// The file was not a session cache; it was moved aside.
    #[error("the session cache {path} {reason}; moved it to {aside} and started an empty cache")]
    SetAside {
        /// The file.
        path: PathBuf,
        /// Where it went.
        aside: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// A problem with the session cache that stops the login.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The file can be read or written by other users, and it holds refresh tokens.
    #[error(
        "the session cache {path} is accessible to other users (mode {mode:04o}) and holds refresh tokens: \
         run chmod 600 {path} (or delete it to log in again)"
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// What [`SessionCache::remove`] did.
#[derive(Debug, Default)]
pub struct Removed {
    /// The tokens of the sessions removed.
    pub tokens: Vec<Tokens>,
    /// The keys of the sessions left in the cache.
    pub left: Vec<SessionKey>,
}

/// `sessions.yaml` at a path.
#[derive(Debug, Clone)]
pub struct SessionCache {
    file: YamlFile,
}

impl SessionCache {
    /// The cache at `path` (it need not exist).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            file: YamlFile::new(path),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// `<file>.corrupt`.
    pub fn aside_path(&self) -> PathBuf {
        self.file.aside_path()
    }

    /// The (pruned) tokens of the session `key`, its last-used time updated. `None` when there
    /// is none or the cache is unusable (a warning). Fails only when the file is open to others.
    pub async fn get(
        &self,
        key: &SessionKey,
        warn: &mut dyn FnMut(SessionWarning),
    ) -> Result<Option<Tokens>, SessionError> {
        let mut found = None;
        self.update(warn, |file, now| {
            if let Some(entry) = file.sessions.iter_mut().find(|entry| &entry.key == key) {
                entry.last_used = Some(timestamp::format(now));
                found = Some(entry.tokens.clone());
            }
        })
        .await?;
        Ok(found)
    }

    /// Stores `tokens` as the session `key` (keeping the entry's creation time if it exists).
    pub async fn put(
        &self,
        key: &SessionKey,
        tokens: &Tokens,
        warn: &mut dyn FnMut(SessionWarning),
    ) -> Result<(), SessionError> {
        self.update(warn, |file, now| {
            let stamp = timestamp::format(now);
            match file.sessions.iter_mut().find(|entry| &entry.key == key) {
                Some(entry) => {
                    entry.tokens = tokens.clone();
                    entry.last_used = Some(stamp);
                }
                None => file.sessions.push(Entry {
                    creation: Some(stamp.clone()),
                    key: key.clone(),
                    last_used: Some(stamp),
                    tokens: tokens.clone(),
                }),
            }
        })
        .await
    }

    /// Removes every session whose key `matches` and returns their tokens (to revoke them) and
    /// the keys of the sessions left, as one change under the lock. A problem with the file goes
    /// to `warn` as for a login: then nothing was removed (and nothing is known to be left),
    /// which the caller must not report as a logout.
    pub async fn remove(
        &self,
        matches: impl Fn(&SessionKey) -> bool,
        warn: &mut dyn FnMut(SessionWarning),
    ) -> Result<Removed, SessionError> {
        let mut removed = Removed::default();
        self.update(warn, |file, _| {
            removed.tokens = file
                .sessions
                .extract_if(.., |entry| matches(&entry.key))
                .map(|entry| entry.tokens)
                .collect();
            removed.left = file.sessions.iter().map(|entry| entry.key.clone()).collect();
        })
        .await?;
        Ok(removed)
    }

    /// Lock, read (pruned), change, write back.
    async fn update(
        &self,
        warn: &mut dyn FnMut(SessionWarning),
        change: impl FnOnce(&mut SessionFile, OffsetDateTime),
    ) -> Result<(), SessionError> {
        let lock = match self.lock().await {
            Ok(lock) => lock,
            Err(warning) => {
                warn(warning);
                return Ok(());
            }
        };
        let mut file = match self.read(warn)? {
            Some(file) => file,
            None => return Ok(()),
        };
        let now = timestamp::now();
        normalize(&mut file, now);
        change(&mut file, now);
        normalize(&mut file, now);
        if let Err(warning) = self.write(&file) {
            warn(warning);
        }
        drop(lock);
        Ok(())
    }

    async fn lock(&self) -> Result<Lock, SessionWarning> {
        self.file.lock(LOCK_TIMEOUT).await.map_err(|error| match error {
            LockError::Io(failure) => self.unusable(failure),
            LockError::Timeout { lock, timeout } => SessionWarning::LockTimeout { path: lock, timeout },
        })
    }

    /// The file's content; `Ok(None)` when it cannot be read, or is not a session cache and
    /// cannot be moved aside (warned); empty when absent or set aside (warned). Fails only when
    /// the file is open to other users.
    fn read(&self, warn: &mut dyn FnMut(SessionWarning)) -> Result<Option<SessionFile>, SessionError> {
        let loaded = match self.file.load::<SessionFile>(OpenToOthers::Refuse) {
            Ok(loaded) => loaded,
            Err(LoadError::OpenToOthers { mode }) => {
                return Err(SessionError::TooOpen {
                    path: self.path().to_path_buf(),
                    mode,
                })
            }
            Err(LoadError::Io(failure)) => {
                warn(self.unusable(failure));
                return Ok(None);
            }
        };
        let Some(corrupt) = loaded.corrupt else {
            return Ok(Some(loaded.document));
        };
        match corrupt.moved {
            Ok(aside) => {
                warn(SessionWarning::SetAside {
                    path: self.path().to_path_buf(),
                    aside,
                    reason: corrupt.reason,
                });
                Ok(Some(loaded.document))
            }
            Err(error) => {
                warn(self.unusable(IoFailure {
                    action: "moving the unreadable file aside",
                    error,
                }));
                Ok(None)
            }
        }
    }

    fn write(&self, file: &SessionFile) -> Result<(), SessionWarning> {
        self.file.store(file).map_err(|failure| self.unusable(failure))
    }

    fn unusable(&self, IoFailure { action, error }: IoFailure) -> SessionWarning {
        SessionWarning::Unusable {
            path: self.path().to_path_buf(),
            action,
            error,
        }
    }
}

/// Pinniped's `normalized`.
fn normalize(file: &mut SessionFile, now: OffsetDateTime) {
    let cutoff = now - SESSION_EXPIRATION;
    for entry in &mut file.sessions {
        entry.tokens.prune(now);
    }
    file.sessions.retain(|entry| {
        !entry.tokens.is_empty()
            && entry
                .last_used
                .as_deref()
                .and_then(timestamp::parse)
                .is_none_or(|used| used >= cutoff)
    });
    file.sessions
        .sort_by_key(|entry| entry.creation.as_deref().and_then(timestamp::parse));
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt as _};

    use super::*;

    fn key() -> SessionKey {
        SessionKey {
            client_id: "pinniped-cli".into(),
            issuer: "https://issuer.example.com".into(),
            redirect_uri: "http://localhost:0/callback".into(),
            scopes: vec!["groups".into(), "offline_access".into(), "openid".into()],
            upstream_provider_name: String::new(),
        }
    }

    fn tokens(expiry: OffsetDateTime) -> Tokens {
        Tokens {
            access: Some(AccessToken {
                expiry: Some(timestamp::format(expiry)),
                token: "at".into(),
                token_type: "Bearer".into(),
            }),
            id: Some(IdToken {
                claims: Some(BTreeMap::from([("sub".to_string(), serde_json::json!("me"))])),
                expiry: Some(timestamp::format(expiry)),
                token: "a.b.c".into(),
            }),
            refresh: Some(RefreshToken { token: "rt".into() }),
        }
    }

    #[tokio::test]
    async fn round_trips_in_pinnipeds_format() {
        let dir = tempfile::tempdir().unwrap();
        let cache = SessionCache::new(dir.path().join("pinniped/sessions.yaml"));
        let mut warnings = Vec::new();
        let expiry = timestamp::now() + Duration::from_secs(3600);
        cache
            .put(&key(), &tokens(expiry), &mut |w| warnings.push(w.to_string()))
            .await
            .unwrap();
        let text = fs::read_to_string(cache.path()).unwrap();
        let mode = fs::metadata(cache.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Go's sigs.k8s.io/yaml writes keys sorted; so does Selkie.
        let order = [
            "apiVersion: config.supervisor.pinniped.dev/v1alpha1",
            "kind: SessionCache",
            "sessions:",
            "creationTimestamp:",
            "key:",
            "clientID: pinniped-cli",
            "issuer: https://issuer.example.com",
            "redirect_uri: http://localhost:0/callback",
            "scopes:",
            "lastUsedTimestamp:",
            "tokens:",
            "access:",
            "expiryTimestamp:",
            "token: at",
            "type: Bearer",
            "id:",
            "claims:",
            "sub: me",
            "token: a.b.c",
            "refresh:",
            "token: rt",
        ];
        let mut at = 0;
        for needle in order {
            let found = text[at..]
                .find(needle)
                .unwrap_or_else(|| panic!("{needle} after {at} in\n{text}"));
            at += found + needle.len();
        }
        assert!(!text.contains("upstream_provider_name"), "{text}");
        let got = cache
            .get(&key(), &mut |w| warnings.push(w.to_string()))
            .await
            .unwrap();
        assert_eq!(got, Some(tokens(expiry)));
        let other = SessionKey {
            scopes: vec!["openid".into()],
            ..key()
        };
        assert_eq!(
            cache
                .get(&other, &mut |w| warnings.push(w.to_string()))
                .await
                .unwrap(),
            None
        );
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[tokio::test]
    async fn reads_a_file_written_by_pinniped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.yaml");
        // The shape pinniped v0.39 writes (sigs.k8s.io/yaml of filesession.sessionCache).
        let used = timestamp::format(timestamp::now() - Duration::from_secs(86400));
        let pinniped = r#"apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: SessionCache
sessions:
- creationTimestamp: "2026-01-01T00:00:00Z"
  key:
    clientID: pinniped-cli
    issuer: https://issuer.example.com
    redirect_uri: http://localhost:0/callback
    scopes:
    - groups
    - offline_access
    - openid
  lastUsedTimestamp: "LAST_USED"
  tokens:
    access:
      expiryTimestamp: "2026-01-01T00:01:00Z"
      token: old-access
      type: Bearer
    id:
      claims:
        aud: pinniped-cli
        exp: 1767225660
      expiryTimestamp: "2026-01-01T00:01:00Z"
      token: old.id.token
    refresh:
      token: the-refresh-token
"#;
        fs::write(&path, pinniped.replace("LAST_USED", &used)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let cache = SessionCache::new(&path);
        let got = cache.get(&key(), &mut |w| panic!("{w}")).await.unwrap().unwrap();
        // Expired ID and access tokens are pruned; the refresh token stays.
        assert!(got.id.is_none() && got.access.is_none());
        assert_eq!(got.refresh.unwrap().token, "the-refresh-token");
    }

    #[tokio::test]
    async fn a_corrupt_file_is_set_aside_and_an_open_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.yaml");
        fs::write(&path, "{{{ not yaml").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let cache = SessionCache::new(&path);
        let mut warnings = Vec::new();
        assert_eq!(
            cache
                .get(&key(), &mut |w| warnings.push(w.to_string()))
                .await
                .unwrap(),
            None
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("moved it to"), "{warnings:?}");
        assert_eq!(fs::read_to_string(cache.aside_path()).unwrap(), "{{{ not yaml");

        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let error = cache.get(&key(), &mut |w| panic!("{w}")).await.unwrap_err();
        assert!(error.to_string().contains("chmod 600"), "{error}");
    }
}
