//! rustls configurations for the backend and the load client: TLS 1.3 only, ring, PEM files.

use std::{path::Path, sync::Arc};

use anyhow::Context as _;
use rustls::{
    crypto::CryptoProvider, server::WebPkiClientVerifier, version::TLS13, ClientConfig, RootCertStore,
    ServerConfig,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// ALPN `h2`.
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN `http/1.1`.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file.
pub fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", path.display());
    Ok(certs)
}

/// The private key in a PEM file.
pub fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| format!("reading the key {}", path.display()))
}

fn roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots
            .add(cert)
            .with_context(|| format!("adding a CA from {}", path.display()))?;
    }
    Ok(roots)
}

/// A TLS 1.3 server that requires a client certificate issued by `client_ca` and offers `alpn`.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
    alpn: &[&[u8]],
) -> anyhow::Result<ServerConfig> {
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(client_ca)?), provider())
        .build()
        .context("building the client certificate verifier")?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&TLS13])
        .context("TLS 1.3 with ring")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates(cert)?, private_key(key)?)
        .context("the serving certificate and key")?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A TLS 1.3 client trusting `ca`, presenting `identity` (certificate, key) if given.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> anyhow::Result<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&TLS13])
        .context("TLS 1.3 with ring")?
        .with_root_certificates(roots(ca)?);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .context("the client certificate and key")?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}
