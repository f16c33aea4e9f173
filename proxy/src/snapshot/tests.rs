//! The upstream peer's credential and kube-apiserver's TokenReview authenticator as the static
//! configuration builds them.

use std::path::Path;

use super::*;
use crate::config::StaticConfig;

/// Writes an upstream CA, a proxy token and a client certificate into `dir`; the configuration
/// with `upstream` (YAML flow mapping entries after `url` and `caFile`).
fn config(dir: &Path, upstream: &str) -> StaticConfig {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join("ca.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("client.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("client.key"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("token"), "t0ken").unwrap();
    let upstream = upstream.replace("DIR", &dir.display().to_string());
    serde_yaml::from_str(&format!(
        "listen: 127.0.0.1:1\nupstream: {{url: 'https://127.0.0.1:6443/', caFile: {}/ca.crt, {upstream}}}\n",
        dir.display()
    ))
    .unwrap()
}

#[test]
fn a_passed_through_request_never_presents_the_proxys_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = config(
        dir.path(),
        "clientCertificate: {certFile: DIR/client.crt, keyFile: DIR/client.key}",
    )
    .snapshot()
    .unwrap();
    let upstream = &snapshot.upstream;
    assert!(upstream.own_authorization().is_none());
    for upgrade in [false, true] {
        assert!(upstream.peer(upgrade, true).client_cert_key.is_some());
        // kube-apiserver would authenticate the certificate before the caller's token.
        assert!(upstream.peer(upgrade, false).client_cert_key.is_none());
    }
}

#[test]
fn every_upstream_connection_has_a_deadline_for_its_tls_handshake_too() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = config(
        dir.path(),
        "clientCertificate: {certFile: DIR/client.crt, keyFile: DIR/client.key}",
    )
    .snapshot()
    .unwrap();
    let upstream = &snapshot.upstream;
    for upgrade in [false, true] {
        let options = upstream.peer(upgrade, true).options;
        assert_eq!(options.connection_timeout, Some(upstream.connect_timeout));
        assert_eq!(
            options.total_connection_timeout,
            Some(upstream.connect_timeout + TLS_HANDSHAKE_TIMEOUT)
        );
    }
}

#[test]
fn kube_apiservers_token_review_is_on_by_default_and_ends_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    for credential in [
        "tokenFile: DIR/token",
        "clientCertificate: {certFile: DIR/client.crt, keyFile: DIR/client.key}",
    ] {
        let config = config(dir.path(), credential);
        assert!(config.upstream.token_review, "on by default");
        let snapshot = config.snapshot().unwrap();
        let reviewer = snapshot.upstream.token_reviewer.as_ref().unwrap();
        assert_eq!(&**reviewer.name(), "kube-apiserver");
        match snapshot.chain.implicit() {
            Some(selkie_filters::chain::TokenAuthenticator::TokenReview(implicit)) => {
                assert!(Arc::ptr_eq(implicit, reviewer), "{credential}")
            }
            other => panic!("{credential}: {other:?}"),
        }
        assert!(
            snapshot.chain.token_authenticators().is_empty(),
            "nameable by no login"
        );
        let shown = format!("{:?}", snapshot.upstream);
        assert!(!shown.contains("t0ken"), "{shown}");
    }

    let off = config(dir.path(), "tokenFile: DIR/token, tokenReview: false");
    assert!(!off.upstream.token_review);
    let snapshot = off.snapshot().unwrap();
    assert!(snapshot.upstream.token_reviewer.is_none());
    assert!(snapshot.chain.implicit().is_none());
}
