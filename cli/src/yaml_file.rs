//! One versioned YAML document in a private file, under pinniped's lock: what the credential
//! cache ([`crate::cache`], `credentials.yaml`) and the session cache ([`crate::sessions`],
//! `sessions.yaml`) have in common. The caches decide what a problem means to a login (a
//! warning, or a refusal); this module only reports it.
//!
//! # Contract
//!
//! * [`YamlFile::lock`] creates the file's directory (mode 0700) and takes an exclusive `flock`
//!   on `<file>.lock` (mode 0600), the lock the pinniped CLI takes (gofrs/flock), polling until a
//!   timeout. Hold it from [`YamlFile::load`] until [`YamlFile::store`].
//! * [`YamlFile::load`] reads the document. No file is an empty document. A file open to other
//!   users is made 0600 or refused ([`OpenToOthers`]). A file whose content is not this
//!   [`Document`] (not YAML, the wrong shape, or another `apiVersion`/`kind`) is renamed to
//!   `<file>.corrupt` and an empty document is returned, with the reason; the reason never
//!   quotes the content, which is secret.
//! * [`YamlFile::store`] writes the document as a new 0600 file renamed over the old one
//!   ([`write_private`]), so a reader sees the old document or the new one, never half of one.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::timestamp;

/// How often a held lock is tried again (gofrs/flock's retry delay is of this order).
const LOCK_POLL: Duration = Duration::from_millis(10);

/// A document type kept in a [`YamlFile`]: a Kubernetes-style `apiVersion` + `kind` header and
/// a body. A file is this document when it parses and its header is [`Document::empty`]'s.
pub(crate) trait Document: Serialize + DeserializeOwned {
    /// What the content is called in the reason a file was set aside: "is not valid
    /// `<NAME>` YAML".
    const NAME: &'static str;
    /// The document of a new file: the header every file must have, no entries.
    fn empty() -> Self;
    /// `(apiVersion, kind)`.
    fn header(&self) -> (&str, &str);
}

/// What [`YamlFile::load`] does with a regular file that other users may read or write (any of
/// the mode bits 0o077).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenToOthers {
    /// Make it 0600 at once (not at the next write, which a failed login never makes) and report
    /// the old bits in [`Loaded::tightened_from`].
    Tighten,
    /// Read nothing and fail with [`LoadError::OpenToOthers`].
    Refuse,
}

/// A step on the file, its directory or its lock failed: usually permissions, or something else
/// (a directory, say) where the file should be. It never holds the file's content.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {error}")]
pub(crate) struct IoFailure {
    /// The step ("reading it"), phrased to follow "cannot use the … cache `<path>`: ".
    pub(crate) action: &'static str,
    /// The IO error.
    #[source]
    pub(crate) error: io::Error,
}

/// Why [`YamlFile::lock`] got no lock.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    /// The directory or the lock file cannot be created, or `flock` failed.
    #[error(transparent)]
    Io(#[from] IoFailure),
    /// Another process held `<file>.lock` for all of the timeout.
    #[error("the lock {lock} was not released within {timeout:?}")]
    Timeout {
        /// The lock file.
        lock: PathBuf,
        /// How long was waited.
        timeout: Duration,
    },
}

/// Why [`YamlFile::load`] read nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// The file's permissions or content cannot be read, or it could not be made 0600.
    #[error(transparent)]
    Io(#[from] IoFailure),
    /// With [`OpenToOthers::Refuse`]: the file may be read or written by other users.
    #[error("it is accessible to other users (mode {mode:04o})")]
    OpenToOthers {
        /// Its permission bits (mode & 0o7777).
        mode: u32,
    },
}

/// For `map_err`: the error as the failure of `action`.
fn failed(action: &'static str) -> impl FnOnce(io::Error) -> IoFailure {
    move |error| IoFailure { action, error }
}

/// A file whose content was not the document, and what became of it.
#[derive(Debug)]
pub(crate) struct Corrupt {
    /// What is wrong, phrased to follow the file's name ("is not valid … YAML (line 1 column
    /// 3)"); never the content.
    pub(crate) reason: String,
    /// `Ok(<file>.corrupt)` where it was moved, or why it could not be moved (then it is still
    /// in place, and the next [`YamlFile::store`] replaces it).
    pub(crate) moved: Result<PathBuf, io::Error>,
}

/// What [`YamlFile::load`] found.
#[derive(Debug)]
pub(crate) struct Loaded<D> {
    /// The file's document; [`Document::empty`] when there was no file or it was [`Corrupt`].
    pub(crate) document: D,
    /// With [`OpenToOthers::Tighten`]: the permission bits (mode & 0o7777) of a file that was
    /// open to others and is now 0600.
    pub(crate) tightened_from: Option<u32>,
    /// Set when the content was not the document.
    pub(crate) corrupt: Option<Corrupt>,
}

/// An exclusive `flock` on `<file>.lock`, held until dropped.
#[derive(Debug)]
pub(crate) struct Lock {
    _file: File,
}

/// A YAML document file at a path (it need not exist).
#[derive(Debug, Clone)]
pub(crate) struct YamlFile {
    path: PathBuf,
}

impl YamlFile {
    /// The file at `path`.
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `<file>.lock`.
    pub(crate) fn lock_path(&self) -> PathBuf {
        sibling(&self.path, ".lock")
    }

    /// `<file>.corrupt`, where a file that is not the document is moved.
    pub(crate) fn aside_path(&self) -> PathBuf {
        sibling(&self.path, ".corrupt")
    }

    /// Creates the file's directory (0700, with its parents) and the lock file (0600), then takes
    /// the exclusive lock, polling every 10 ms like gofrs/flock. Fails with [`LockError::Io`]
    /// ("creating its directory", "opening its lock file", "locking it") or, when another
    /// process holds the lock past `timeout`, [`LockError::Timeout`].
    pub(crate) async fn lock(&self, timeout: Duration) -> Result<Lock, LockError> {
        if let Some(dir) = self.path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(failed("creating its directory"))?;
        }
        let lock_path = self.lock_path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(failed("opening its lock file"))?;
        let deadline = timestamp::deadline(timeout);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Lock { _file: file }),
                Err(fs::TryLockError::WouldBlock) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(LOCK_POLL).await;
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(LockError::Timeout {
                        lock: lock_path,
                        timeout,
                    })
                }
                Err(fs::TryLockError::Error(e)) => return Err(failed("locking it")(e).into()),
            }
        }
    }

    /// Reads the document; call it under [`YamlFile::lock`]. No file: [`Document::empty`]. A
    /// regular file open to other users is handled as `open` says, before its content is read.
    /// Content that is not the document (not YAML, another shape, or another `apiVersion` or
    /// `kind`) is moved to `<file>.corrupt` and [`Document::empty`] returned, with
    /// [`Loaded::corrupt`] saying why and whether the move worked. Fails with [`LoadError::Io`]
    /// ("reading its permissions", "restricting its permissions to 0600", "reading it") or
    /// [`LoadError::OpenToOthers`]; nothing is changed then.
    pub(crate) fn load<D: Document>(&self, open: OpenToOthers) -> Result<Loaded<D>, LoadError> {
        let nothing = || Loaded {
            document: D::empty(),
            tightened_from: None,
            corrupt: None,
        };
        let metadata = match fs::metadata(&self.path) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(nothing()),
            Err(e) => return Err(failed("reading its permissions")(e).into()),
        };
        let mode = metadata.permissions().mode();
        let mut tightened_from = None;
        if metadata.is_file() && mode & 0o077 != 0 {
            match open {
                OpenToOthers::Refuse => return Err(LoadError::OpenToOthers { mode: mode & 0o7777 }),
                OpenToOthers::Tighten => {
                    fs::set_permissions(&self.path, fs::Permissions::from_mode(0o600))
                        .map_err(failed("restricting its permissions to 0600"))?;
                    tightened_from = Some(mode & 0o7777);
                }
            }
        }
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            // Removed since the look at its permissions: as if it had never been there.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    tightened_from,
                    ..nothing()
                })
            }
            Err(e) => return Err(failed("reading it")(e).into()),
        };
        let empty = D::empty();
        let (api_version, kind) = empty.header();
        let reason = match serde_yaml::from_slice::<D>(&bytes) {
            Ok(document) if document.header() == (api_version, kind) => {
                return Ok(Loaded {
                    document,
                    tightened_from,
                    corrupt: None,
                })
            }
            Ok(document) => {
                let (their_version, their_kind) = document.header();
                format!("is a {their_kind:?} of apiVersion {their_version:?}, not a {kind} of {api_version}")
            }
            // The location only: serde's messages can quote content, and the content is secret.
            Err(e) => match e.location() {
                Some(at) => format!(
                    "is not valid {} YAML (line {} column {})",
                    D::NAME,
                    at.line(),
                    at.column()
                ),
                None => format!("is not valid {} YAML", D::NAME),
            },
        };
        let aside = self.aside_path();
        let moved = fs::rename(&self.path, &aside).map(|()| aside);
        Ok(Loaded {
            tightened_from,
            corrupt: Some(Corrupt { reason, moved }),
            ..nothing()
        })
    }

    /// Writes `document` with [`write_private`]; call it under [`YamlFile::lock`], which made the
    /// directory. Fails with the step "serializing it" or "writing it", leaving the old file as
    /// it was.
    pub(crate) fn store<D: Serialize>(&self, document: &D) -> Result<(), IoFailure> {
        let yaml = serde_yaml::to_string(document)
            .map_err(|e| failed("serializing it")(io::Error::other(e.to_string())))?;
        write_private(&self.path, yaml.as_bytes()).map_err(failed("writing it"))
    }
}

/// For `#[serde(deserialize_with)]` on a list: `null` (what Go writes for a nil slice) as empty.
pub(crate) fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// Replaces `path` with `contents` atomically: writes a private (0600) temporary sibling and
/// renames it over `path`, so readers see the old file or the new one, never a mix. On failure
/// the temporary file is removed and `path` is untouched.
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    let temporary = sibling(path, &format!(".{}.tmp", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut out| {
            // A leftover temporary file of a dead process with this pid may have other bits.
            out.set_permissions(fs::Permissions::from_mode(0o600))?;
            out.write_all(contents)
        })
        .and_then(|()| fs::rename(&temporary, path));
    written.inspect_err(|_| {
        let _best_effort = fs::remove_file(&temporary);
    })
}

/// `path` with `suffix` appended to its file name.
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

#[cfg(test)]
mod tests;
