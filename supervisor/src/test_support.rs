//! What the crate's unit tests share: a TLS acceptor for the local servers they run (an
//! upstream's discovery, userinfo or GitHub API, a directory).

use std::sync::Arc;

use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};

/// A TLS acceptor serving the certificate `cert_pem` with its key `key_pem` (ring, the
/// crate's provider), for a test's local server. Panics on unusable PEM (a test's own).
pub(crate) fn tls_acceptor(cert_pem: &str, key_pem: &str) -> tokio_rustls::TlsAcceptor {
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}
