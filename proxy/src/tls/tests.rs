//! A connection's client certificate: its identity names the certificate as kube-apiserver does
//! (the credential-id extra), computed once for the connection and sent upstream as an
//! `Impersonate-Extra-` header.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

use super::*;

/// A CA, the authenticator trusting it, and a client certificate of `alice` in `devs`.
fn alice() -> (Arc<X509Authenticator>, CertificateDer<'static>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "test ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "alice");
    params.distinguished_name.push(DnType::OrganizationName, "devs");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let leaf = params
        .signed_by(&KeyPair::generate().unwrap(), &ca)
        .unwrap()
        .der()
        .clone();
    let x509 = X509Authenticator::new("x509", &[&ca.pem()], Duration::ZERO).unwrap();
    (Arc::new(x509), leaf)
}

#[test]
fn the_certificate_identity_carries_its_credential_id_upstream() {
    let (x509, leaf) = alice();
    let peer = PeerCertificate::verify(Box::new([leaf.clone()]), Some(&x509), UnixTime::now());
    let (Outcome::Authenticated(identity), Some(prepared)) = peer.current(Some(&x509), UnixTime::now())
    else {
        panic!("alice is not authenticated")
    };
    // Its format is tested against SHA-256 test vectors in selkie-filters.
    let id = selkie_filters::x509::credential_id(&leaf);
    assert!(id.starts_with("X509SHA256="), "{id}");
    assert_eq!(
        identity
            .user
            .extra
            .get("authentication.kubernetes.io/credential-id"),
        Some(&vec![id.clone()])
    );
    // The header kube-apiserver reads the extra from: the key percent-encoded ('/' is %2f).
    let headers = prepared
        .headers_for(&identity)
        .expect("the headers of this very identity")
        .as_ref()
        .unwrap();
    let extras: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("impersonate-extra-"))
        .map(|(name, value)| (name.as_str(), value.to_str().unwrap()))
        .collect();
    assert_eq!(
        extras,
        [(
            "impersonate-extra-authentication.kubernetes.io%2fcredential-id",
            id.as_str()
        )]
    );
}

#[test]
fn the_digest_is_computed_once_per_connection() {
    let (x509, leaf) = alice();
    let peer = PeerCertificate::verify(Box::new([leaf]), Some(&x509), UnixTime::now());
    let identity_of = |outcome: Outcome| match outcome {
        Outcome::Authenticated(identity) => identity,
        outcome => panic!("{outcome:?}"),
    };
    let first = identity_of(peer.current(Some(&x509), UnixTime::now()).0);
    let second = identity_of(peer.current(Some(&x509), UnixTime::now()).0);
    // The handshake's verdict, reused: the very same identity, not a new one with a new digest.
    assert!(Arc::ptr_eq(&first, &second));
}
