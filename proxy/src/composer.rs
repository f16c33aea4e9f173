//! The proxy's snapshot, composed from its two sources — the static configuration file and,
//! with a control plane, what the control plane publishes ([`Extension`]) — and kept current:
//! [`Composer`] rebuilds and swaps the snapshot whenever a source changes, and [`watch`] polls the
//! file (and the files it names) for changes.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use selkie_kube::serving::ServingCert;

use crate::{
    config::{ConfigError, Extension, StaticConfig},
    snapshot::{Snapshot, UpstreamCredential},
};

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The files a configuration depends on: the file itself and, when the file provides the
/// serving certificate, its certificate and key.
fn watched_files(path: &Path, config: &StaticConfig) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    if let Some(serving) = &config.serving_certificate {
        files.push(serving.cert_file.clone());
        files.push(serving.key_file.clone());
    }
    files
}

/// Builds the proxy's snapshot from its two sources — the static file and, with a control
/// plane, what the control plane publishes — and stores it whenever either changes. Each source
/// keeps its last valid state: a broken file keeps the running configuration, and a control-plane
/// change never re-reads the file's upstream (its connections stay warm).
pub struct Composer {
    snapshot: Arc<ArcSwap<Snapshot>>,
    state: Mutex<ComposerState>,
}

struct ComposerState {
    config: StaticConfig,
    extension: Extension,
}

impl Composer {
    /// Builds the first snapshot from `config` and `extension`; fails if they are invalid.
    pub fn new(config: StaticConfig, extension: Extension) -> Result<Self, ConfigError> {
        let snapshot = Arc::new(ArcSwap::from_pointee(config.snapshot_with(&extension, None)?));
        Ok(Self {
            snapshot,
            state: Mutex::new(ComposerState { config, extension }),
        })
    }

    /// The handle requests load the snapshot from.
    pub fn snapshot(&self) -> &Arc<ArcSwap<Snapshot>> {
        &self.snapshot
    }

    /// The static configuration the running snapshot was built from.
    pub fn config(&self) -> StaticConfig {
        self.state().config.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ComposerState> {
        // A panic while holding the lock cannot leave the state half-written (it is replaced
        // whole), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file changed: rebuild everything from it (a new upstream included). Fails, keeping the
    /// running snapshot, if the new file is invalid.
    pub fn file_changed(&self, config: StaticConfig) -> Result<(), ConfigError> {
        let mut state = self.state();
        let next = config.snapshot_with(&state.extension, None)?;
        self.snapshot.store(Arc::new(next));
        state.config = config;
        Ok(())
    }

    /// The control plane published: rebuild with the file as it is and the running upstream.
    pub fn extension_changed(&self, extension: Extension) -> Result<(), ConfigError> {
        let mut state = self.state();
        let upstream = self.snapshot.load().upstream.clone();
        let next = state.config.snapshot_with(&extension, Some(upstream))?;
        self.snapshot.store(Arc::new(next));
        state.extension = extension;
        Ok(())
    }
}

/// Polls the files the running configuration depends on and, when one changes, rebuilds and swaps
/// in what is valid. Nothing is parsed while nothing changes, and a broken change is reported
/// once, not at every poll. `serving` is `None` when a control plane provides the certificate.
pub fn watch(path: PathBuf, interval: Duration, composer: Arc<Composer>, serving: Option<Arc<ServingCert>>) {
    let mut files = watched_files(&path, &composer.state().config);
    let mut seen: Vec<_> = files.iter().map(|file| modified(file)).collect();
    loop {
        std::thread::sleep(interval);
        if let UpstreamCredential::TokenFile(token) = &composer.snapshot.load().upstream.credential {
            if let Err(error) = token.refresh() {
                tracing::warn!(%error, "the upstream token file could not be re-read; keeping the previous token");
            }
        }
        let now: Vec<_> = files.iter().map(|file| modified(file)).collect();
        if now == seen {
            continue;
        }
        seen = now;
        let config = match StaticConfig::load(&path) {
            Ok(config) => config,
            Err(error) => {
                tracing::warn!(%error, "the configuration could not be reloaded; keeping the running one");
                continue;
            }
        };
        let serving_key = serving.as_ref().map(|_| config.serving_key());
        if let Err(error) = composer.file_changed(config.clone()) {
            tracing::warn!(%error, "the changed configuration is invalid; keeping the running one");
            continue;
        }
        tracing::info!(config = %path.display(), "configuration reloaded");
        match (serving.as_ref(), serving_key) {
            (Some(serving), Some(Ok(cert))) => serving.replace(cert),
            (Some(_), Some(Err(error))) => {
                tracing::warn!(%error, "the serving certificate could not be reloaded")
            }
            _ => {}
        }
        // The certificate may have moved: watch the files the new configuration names.
        files = watched_files(&path, &config);
        seen = files.iter().map(|file| modified(file)).collect();
    }
}

#[cfg(test)]
mod tests {
    use selkie_filters::chain::TokenAuthenticator;

    use super::*;

    /// A configuration with everything in `dir`: a serving certificate, an upstream CA, a token.
    fn config(dir: &Path, listen: &str) -> StaticConfig {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = rcgen::CertifiedIssuer::self_signed(
            {
                let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                params
            },
            rcgen::KeyPair::generate().unwrap(),
        )
        .unwrap();
        std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
        std::fs::write(dir.join("token"), "t0ken").unwrap();
        serde_yaml::from_str(&format!(
            "listen: {listen}\nupstream: {{url: https://127.0.0.1:6443, caFile: {ca}, tokenFile: {token}}}\n",
            ca = dir.join("ca.crt").display(),
            token = dir.join("token").display(),
        ))
        .unwrap()
    }

    #[test]
    fn a_valid_file_replaces_the_snapshot_and_an_invalid_one_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let composer = Composer::new(config(dir.path(), "127.0.0.1:1"), Extension::default()).unwrap();
        let first = composer.snapshot().load_full();
        assert!(first.static_identity.is_none());

        let mut with_identity = config(dir.path(), "127.0.0.1:1");
        with_identity.static_identity = serde_yaml::from_str("{username: alice}").unwrap();
        composer.file_changed(with_identity).unwrap();
        let second = composer.snapshot().load_full();
        assert_eq!(second.static_identity.as_ref().unwrap().user.username, "alice");
        assert!(
            !Arc::ptr_eq(&first.upstream, &second.upstream),
            "a changed file builds a new upstream"
        );

        let mut broken = config(dir.path(), "127.0.0.1:1");
        broken.upstream.url = "http://plaintext.invalid".into();
        assert!(composer.file_changed(broken).is_err());
        assert!(
            Arc::ptr_eq(&composer.snapshot().load_full(), &second),
            "the running snapshot stays"
        );
        assert_eq!(
            composer.config().static_identity.unwrap().username,
            "alice",
            "and so does the file it came from"
        );
    }

    #[test]
    fn a_published_change_keeps_the_running_upstream_and_an_invalid_one_keeps_everything() {
        let dir = tempfile::tempdir().unwrap();
        let composer = Composer::new(config(dir.path(), "127.0.0.1:1"), Extension::default()).unwrap();
        let first = composer.snapshot().load_full();

        let webhook = selkie_filters::tokenreview::TokenReviewAuthenticator::new(
            selkie_filters::tokenreview::TokenReviewConfig::new("corp", "https://127.0.0.1:1/review"),
        )
        .unwrap();
        let extension = Extension {
            api_group_suffix: Some("acme.example.com".into()),
            chain: selkie_filters::chain::Chain::new(vec![TokenAuthenticator::TokenReview(Arc::new(
                webhook,
            ))]),
            ..Extension::default()
        };
        composer.extension_changed(extension).unwrap();
        let second = composer.snapshot().load_full();
        assert!(
            Arc::ptr_eq(&first.upstream, &second.upstream),
            "connections stay warm"
        );
        // The control plane's authenticators come before kube-apiserver's TokenReview, whose
        // result cache stays warm too.
        let names: Vec<&str> = second
            .chain
            .token_authenticators()
            .iter()
            .map(|authenticator| &**authenticator.name())
            .collect();
        assert_eq!(names, vec!["corp"]);
        match (first.chain.implicit(), second.chain.implicit()) {
            (Some(TokenAuthenticator::TokenReview(before)), Some(TokenAuthenticator::TokenReview(after))) => {
                assert!(Arc::ptr_eq(before, after));
                assert_eq!(&**after.name(), "kube-apiserver");
            }
            other => panic!("{other:?}"),
        }
        assert!(second
            .concierge_paths
            .token_credential_requests
            .contains("login.concierge.acme.example.com"));

        let invalid = Extension {
            api_group_suffix: Some("not a suffix".into()),
            ..Extension::default()
        };
        assert!(composer.extension_changed(invalid).is_err());
        assert!(Arc::ptr_eq(&composer.snapshot().load_full(), &second));
    }
}
