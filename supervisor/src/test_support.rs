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

/// An OIDC upstream already discovered as `discovery` (no request is made), trusting `ca_pem`
/// for its endpoints, logged in with the confidential client `supervisor` / `supervisor-secret`
/// asking for `openid`, with no claim mappings and no extra parameters. Tests change what they
/// need with struct update syntax.
pub(crate) fn oidc_upstream(
    display_name: &str,
    resource_uid: &str,
    discovery: selkie_oidc::rp::Discovery,
    ca_pem: &str,
) -> crate::idp::OidcUpstream {
    let tls = selkie_oidc::https::TlsOptions {
        ca_pem: Some(ca_pem.as_bytes().to_vec()),
        ..Default::default()
    };
    crate::idp::OidcUpstream {
        display_name: display_name.into(),
        resource_name: "dex".into(),
        resource_uid: resource_uid.into(),
        provider: Arc::new(selkie_oidc::rp::Provider::from_discovery(discovery, &tls).unwrap()),
        client: selkie_oidc::rp::ClientConfig {
            client_id: "supervisor".into(),
            client_secret: Some("supervisor-secret".into()),
            scopes: vec!["openid".into()],
        },
        additional_authorize_parameters: Vec::new(),
        allow_password_grant: false,
        username_claim: None,
        groups_claim: None,
        additional_claim_mappings: Default::default(),
    }
}
