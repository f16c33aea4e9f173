//! Micro-benchmark of client-certificate authentication: chain verification against the CA pool
//! (webpki, ring) plus mapping the subject to a user (`CN` → user name, each `O` → a group), i.e.
//! [`X509Authenticator::authenticate_at`] on one leaf certificate. The proxy runs this once per
//! TLS connection, not per request.
//!
//! Run: `cargo bench -p selkie-filters --bench x509`.

#![allow(
    clippy::unwrap_used,
    reason = "bench setup: a failure is a broken bench and should panic"
)]

use std::{hint::black_box, time::Duration};

use criterion::{criterion_group, criterion_main, Criterion};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use rustls_pki_types::{CertificateDer, UnixTime};
use selkie_filters::{outcome::Outcome, x509::X509Authenticator};

/// OID of the X.520 organizationName attribute (2.5.4.10). rcgen keeps one value per `DnType`
/// (STYLE.md §0.3), so the second `O` is pushed under this custom type with the same OID.
const ORGANIZATION_NAME: [u64; 4] = [2, 5, 4, 10];

/// A CA (ECDSA P-256, as rcgen makes by default) and a client certificate it issued with the
/// clientAuth usage, `CN=alice`, `O=devs`, `O=ops`.
fn ca_and_client_cert() -> (String, CertificateDer<'static>) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, "bench ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "alice");
    params.distinguished_name.push(DnType::OrganizationName, "devs");
    params
        .distinguished_name
        .push(DnType::CustomDnType(ORGANIZATION_NAME.to_vec()), "ops");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = rcgen::date_time_ymd(2026, 1, 1);
    params.not_after = rcgen::date_time_ymd(2027, 1, 1);
    let leaf = params
        .signed_by(&KeyPair::generate().unwrap(), &ca)
        .unwrap()
        .der()
        .clone();
    (ca.pem(), leaf)
}

fn x509_identity(c: &mut Criterion) {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let (ca_pem, leaf) = ca_and_client_cert();
    let x509 = X509Authenticator::new("x509", &[ca_pem.as_str()], Duration::from_secs(30)).unwrap();
    let chain = [leaf];
    // 2026-11-21T00:00:00Z, inside the certificate's validity window.
    let now = UnixTime::since_unix_epoch(Duration::from_secs(1_795_219_200));

    let Outcome::Authenticated(identity) = x509.authenticate_at(&chain, now) else {
        panic!("the bench certificate must authenticate");
    };
    assert_eq!(identity.user.username, "alice");
    assert_eq!(identity.user.groups, ["devs", "ops"]);

    c.bench_function("x509/identity", |b| {
        b.iter(|| x509.authenticate_at(black_box(&chain), black_box(now)))
    });
}

criterion_group!(benches, x509_identity);
criterion_main!(benches);
