//! The listener's TLS: a serving certificate that can be replaced while the proxy runs, optional
//! client certificates, and the identity a client certificate carries, computed once per
//! connection.
//!
//! Client certificates are checked in two steps. During the handshake, [`PossessionVerifier`]
//! only checks that the client holds the private key of the certificate it presents (the
//! handshake signature); it trusts no CA, so a CA rotation needs no new listener. Right after the
//! handshake, [`IdentityCallback`] verifies the chain against the CA pools of the *current*
//! snapshot and stores the result with the connection ([`PeerIdentity`]); requests read it.
//! A certificate from an unknown CA therefore completes the handshake and then counts for nothing
//! (the request can still authenticate with a bearer token, as with kube-apiserver).

use std::{any::Any, sync::Arc};

use arc_swap::{ArcSwap, ArcSwapOption};
use async_trait::async_trait;
use pingora::{listeners::TlsAccept, protocols::tls::TlsRef};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use selkie_filters::outcome::Outcome;

use crate::{headers::PreparedIdentity, snapshot::Snapshot};

/// The identity of a connection's client certificate, as decided after the handshake, and (when
/// it is an identity) its `Impersonate-*` headers, built once for the connection's lifetime.
#[derive(Debug, Clone)]
pub struct PeerIdentity(pub Outcome, pub Option<PreparedIdentity>);

impl PeerIdentity {
    /// Records `outcome`, building the headers of an authenticated identity now.
    pub fn new(outcome: Outcome) -> Self {
        let prepared = match &outcome {
            Outcome::Authenticated(identity) => Some(PreparedIdentity::new(identity.clone())),
            _ => None,
        };
        Self(outcome, prepared)
    }
}

/// The handshake-time verifier: key possession only; chain trust is decided per connection by
/// [`IdentityCallback`].
pub use selkie_filters::possession::PossessionVerifier;

/// Runs once per connection after the handshake: authenticates the client certificate chain with
/// the current snapshot's x509 authenticator.
pub struct IdentityCallback {
    snapshot: Arc<ArcSwap<Snapshot>>,
}

impl IdentityCallback {
    /// Reads CA pools from `snapshot` at each handshake.
    pub fn new(snapshot: Arc<ArcSwap<Snapshot>>) -> Self {
        Self { snapshot }
    }
}

#[async_trait]
impl TlsAccept for IdentityCallback {
    async fn handshake_complete_callback(&self, tls: &TlsRef) -> Option<Arc<dyn Any + Send + Sync>> {
        let chain = tls.peer_cert_chain_der()?;
        let outcome = match &self.snapshot.load().client_certificates {
            Some(x509) => x509.authenticate(chain),
            None => Outcome::NotMine,
        };
        Some(Arc::new(PeerIdentity::new(outcome)))
    }
}

/// Why a serving certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServingCertError {
    /// The certificate PEM holds no certificate or does not parse.
    #[error("the serving certificate PEM is invalid: {0}")]
    Certificate(String),
    /// The key PEM holds no private key or does not parse.
    #[error("the serving key PEM is invalid: {0}")]
    Key(String),
    /// The key type is not supported or does not match.
    #[error("the serving key cannot be used: {0}")]
    Unusable(String),
}

/// The serving certificate, replaceable at any time; new handshakes use the newest one. While
/// it is disabled ([`ServingCert::disable`]) every handshake fails (the control plane's
/// CredentialIssuer turned the proxy off, or has no certificate for it yet).
#[derive(Debug)]
pub struct ServingCert {
    current: ArcSwapOption<CertifiedKey>,
}

impl ServingCert {
    /// Parses a PEM chain (leaf first) and its private key.
    pub fn load(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, ServingCertError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ServingCertError::Certificate(e.to_string()))?;
        if chain.is_empty() {
            return Err(ServingCertError::Certificate("no certificate found".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| ServingCertError::Key(e.to_string()))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| ServingCertError::Unusable(e.to_string()))?;
        let certified = CertifiedKey::new(chain, signing_key);
        certified
            .keys_match()
            .map_err(|e| ServingCertError::Unusable(e.to_string()))?;
        Ok(certified)
    }

    /// Starts with `initial`.
    pub fn new(initial: CertifiedKey) -> Self {
        Self {
            current: ArcSwapOption::from_pointee(initial),
        }
    }

    /// Starts disabled: handshakes fail until a certificate is installed.
    pub fn disabled() -> Self {
        Self {
            current: ArcSwapOption::empty(),
        }
    }

    /// Replaces the certificate for every later handshake (and enables serving).
    pub fn replace(&self, next: CertifiedKey) {
        self.current.store(Some(Arc::new(next)));
    }

    /// Makes every later handshake fail; connections already open are not touched.
    pub fn disable(&self) {
        self.current.store(None);
    }

    /// Whether handshakes currently succeed.
    pub fn is_enabled(&self) -> bool {
        self.current.load().is_some()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}
