//! The per-issuer DPoP keys (RFC 9449) of `login oidc`: when an issuer's discovery document
//! advertises ES256 DPoP proofs (a Supervisor whose FederationDomain binds sessions to a key),
//! its sessions are bound to a key kept next to the session cache, which every later token
//! request (a refresh, an RFC 8693 exchange) proves possession of.
//!
//! * The key of issuer `I` is `<session cache's directory>/dpop-keys/<h>.json`, `h` the first 32
//!   hex characters of SHA-256(`I`), holding the private JWK (EC P-256). `sessions.yaml` itself
//!   stays exactly Pinniped's format.
//! * The directory is created 0700 and the file 0600, written as a private temporary file that
//!   is then linked into place, so it is never readable by others nor half-written, and a key
//!   made at the same moment by another process is used rather than replaced.
//! * A key file (or directory) open to other users, or one that is not a private JWK, fails the
//!   login with a one-line error naming the path, never its content, and is left as it is.
//! * Without a session cache, a key lives only as long as the process (as its sessions do).

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use selkie_oidc::{
    discovery::Discovery,
    jose::sign::{KeyError, SigningKey},
};
use sha2::{Digest as _, Sha256};

use crate::yaml_file::{sibling, write_private};

/// The directory of the keys, next to the session cache.
pub const DIRECTORY: &str = "dpop-keys";
/// The `kid` of a key made here (proofs carry the public key itself, not its `kid`).
const KID: &str = "selkie-dpop";

/// Why a DPoP key cannot be used. Never holds key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DpopKeyError {
    /// The key file or its directory cannot be used.
    #[error("cannot use the DPoP key {path}: {reason}")]
    File {
        /// The key file or its directory.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A key of this process only (no session cache) could not be made.
    #[error("cannot make a DPoP key: {0}")]
    Generate(#[source] KeyError),
}

/// The DPoP key of a login ([`for_login`]).
#[derive(Debug, Clone)]
pub struct LoginKey {
    /// The key.
    pub key: Arc<SigningKey>,
    /// Its file; `None` for a key of this process only.
    pub path: Option<PathBuf>,
}

/// The DPoP key of a login at `issuer` whose discovery document is `discovery`: `None` when the
/// document does not advertise ES256 DPoP proofs (nothing is created then); otherwise the
/// issuer's key next to `session_cache` ([`load_or_create`]), or, without a session cache, a
/// new key of this process only.
pub fn for_login(
    issuer: &str,
    discovery: &Discovery,
    session_cache: Option<&Path>,
) -> Result<Option<LoginKey>, DpopKeyError> {
    if !discovery.supports_dpop() {
        return Ok(None);
    }
    match session_cache {
        Some(session_cache) => {
            let path = key_path(session_cache, issuer);
            Ok(Some(LoginKey {
                key: load_or_create(&path)?,
                path: Some(path),
            }))
        }
        None => Ok(Some(LoginKey {
            key: Arc::new(SigningKey::generate(KID).map_err(DpopKeyError::Generate)?),
            path: None,
        })),
    }
}

/// Where the DPoP key of `issuer` is kept, for the session cache at `session_cache`.
pub fn key_path(session_cache: &Path, issuer: &str) -> PathBuf {
    let dir = session_cache
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let digest = Sha256::digest(issuer.as_bytes());
    let name: String = digest.iter().take(16).map(|byte| format!("{byte:02x}")).collect();
    dir.join(DIRECTORY).join(format!("{name}.json"))
}

/// The key at `path`, or a new one stored there when there is none (see the module
/// documentation). Fails, changing nothing, when the file or its directory is open to other
/// users, cannot be read, or is not a private EC P-256 JWK; or when a new key cannot be stored.
pub fn load_or_create(path: &Path) -> Result<Arc<SigningKey>, DpopKeyError> {
    let fail = |path: &Path, reason: String| DpopKeyError::File {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail(dir, format!("creating its directory: {e}")))?;
        let mode = fs::metadata(dir)
            .map_err(|e| fail(dir, format!("reading its directory's permissions: {e}")))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(fail(
                dir,
                format!(
                    "the directory is accessible to other users (mode {:04o}): run chmod 700 {}",
                    mode & 0o7777,
                    dir.display()
                ),
            ));
        }
    }
    match load(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        loaded => return loaded.map_err(|e| fail(path, e.to_string())),
    }
    let key = SigningKey::generate(KID).map_err(|e| fail(path, e.to_string()))?;
    let json = serde_json::to_vec_pretty(&key.private_jwk())
        .map_err(|e| fail(path, format!("serializing it: {e}")))?;
    // A private, complete file first, then linked into place: `link` never replaces a key
    // another process stored meanwhile (that one is used instead, below).
    let staged = sibling(path, &format!(".{}.new", std::process::id()));
    write_private(&staged, &json).map_err(|e| fail(path, format!("writing it: {e}")))?;
    let linked = match fs::hard_link(&staged, path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        // A file system without hard links: the rename (which replaces) is the best there is.
        Err(_) => fs::rename(&staged, path).map(|()| true),
        Ok(()) => Ok(true),
    };
    let _best_effort = fs::remove_file(&staged);
    match linked.map_err(|e| fail(path, format!("writing it: {e}")))? {
        true => Ok(Arc::new(key)),
        false => load(path).map_err(|e| fail(path, e.to_string())),
    }
}

/// Removes the key at `path`; `Ok(false)` when there was none.
pub fn remove(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The key of an existing file; `NotFound` when there is none. Other errors are the reason, one
/// line, without the content.
fn load(path: &Path) -> io::Result<Arc<SigningKey>> {
    let metadata = fs::metadata(path)?;
    if !metadata.is_file() {
        return Err(io::Error::other("it is not a regular file"));
    }
    let mode = metadata.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "it is accessible to other users (mode {:04o}) and holds a private key: run chmod 600 {} \
             (or delete it, and log in again)",
            mode & 0o7777,
            path.display()
        )));
    }
    let bytes = fs::read(path).map_err(|e| io::Error::new(e.kind(), format!("reading it: {e}")))?;
    let corrupt = || {
        io::Error::other(format!(
            "it is not a private EC P-256 JWK: delete {}, and log in again",
            path.display()
        ))
    };
    let jwk: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| corrupt())?;
    SigningKey::from_private_jwk(&jwk)
        .map(Arc::new)
        .map_err(|_| corrupt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_path_is_next_to_the_session_cache_named_by_the_issuers_hash() {
        let path = key_path(
            Path::new("/home/u/.config/pinniped/sessions.yaml"),
            "https://sso.example.com/fd",
        );
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            path.parent().unwrap(),
            Path::new("/home/u/.config/pinniped/dpop-keys")
        );
        let digest = Sha256::digest(b"https://sso.example.com/fd");
        let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(name, format!("{}.json", &hex[..32]));
        assert_ne!(
            key_path(Path::new("sessions.yaml"), "https://other.example.com"),
            path
        );
        assert_eq!(
            key_path(Path::new("sessions.yaml"), "https://x")
                .parent()
                .unwrap(),
            Path::new("./dpop-keys")
        );
    }

    #[test]
    fn a_key_is_made_only_for_an_issuer_that_advertises_es256_dpop() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = dir.path().join("pinniped/sessions.yaml");
        let issuer = "https://sso.example.com";
        let mut discovery = Discovery {
            issuer: issuer.into(),
            ..Discovery::default()
        };
        assert!(for_login(issuer, &discovery, Some(&sessions)).unwrap().is_none());
        discovery.dpop_signing_alg_values_supported = vec!["RS256".into()];
        assert!(for_login(issuer, &discovery, Some(&sessions)).unwrap().is_none());
        assert!(!dir.path().join("pinniped").exists(), "nothing is created");

        discovery.dpop_signing_alg_values_supported = vec!["ES256".into()];
        let LoginKey { key, path } = for_login(issuer, &discovery, Some(&sessions)).unwrap().unwrap();
        assert_eq!(path.as_deref(), Some(key_path(&sessions, issuer).as_path()));
        let again = for_login(issuer, &discovery, Some(&sessions)).unwrap().unwrap();
        assert_eq!(again.key.public_jwk(), key.public_jwk());
        // Without a session cache: a key of this run, stored nowhere.
        let ephemeral = for_login(issuer, &discovery, None).unwrap().unwrap();
        assert_eq!(ephemeral.path, None);
        assert_ne!(ephemeral.key.public_jwk(), key.public_jwk());
        assert!(!Path::new(DIRECTORY).exists());
    }

    #[test]
    fn a_key_is_created_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_path(
            &dir.path().join("pinniped/sessions.yaml"),
            "https://sso.example.com",
        );
        let first = load_or_create(&path).unwrap();
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let stored: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(stored, first.private_jwk());
        let second = load_or_create(&path).unwrap();
        assert_eq!(second.public_jwk(), first.public_jwk(), "the next run reuses it");
        let left: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
        assert!(remove(&path).unwrap());
        assert!(!remove(&path).unwrap());
    }

    #[test]
    fn an_open_or_broken_key_file_is_refused_naming_it_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_path(&dir.path().join("sessions.yaml"), "https://sso.example.com");
        let key = load_or_create(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "cannot use the DPoP key {0}: it is accessible to other users (mode 0644) and holds a \
                 private key: run chmod 600 {0} (or delete it, and log in again)",
                path.display()
            )
        );
        assert!(!error.contains('\n'));
        let d = key.private_jwk()["d"].as_str().unwrap().to_string();
        assert!(!error.contains(&d), "{error}");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);

        fs::write(&path, "{\"kty\": \"EC\", \"d\": \"secret-looking\"}").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert!(error.contains("is not a private EC P-256 JWK"), "{error}");
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(!error.contains("secret-looking"), "{error}");
        assert!(
            fs::read_to_string(&path).unwrap().contains("secret-looking"),
            "not replaced"
        );

        let open_dir = path.parent().unwrap();
        fs::set_permissions(open_dir, fs::Permissions::from_mode(0o755)).unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert!(error.contains("mode 0755"), "{error}");
        assert!(error.contains("chmod 700"), "{error}");
    }
}
