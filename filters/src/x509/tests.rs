//! Verification and subject mapping, with certificates made by rcgen. Multi-group certificates
//! and agreement with kube-apiserver are tested in `e2e/` with the harness's PKI.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

use super::*;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "test ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    fn issue(&self, configure: impl FnOnce(&mut CertificateParams)) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "alice");
        params.distinguished_name.push(DnType::OrganizationName, "devs");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2026, 1, 2);
        configure(&mut params);
        params
            .signed_by(&KeyPair::generate().unwrap(), &self.0)
            .unwrap()
            .der()
            .clone()
    }
}

/// 2026-01-01T12:00:00Z, inside the default validity window of `Ca::issue`.
fn noon() -> UnixTime {
    UnixTime::since_unix_epoch(Duration::from_secs(1_767_268_800))
}

fn at(seconds_after_noon: i64) -> UnixTime {
    UnixTime::since_unix_epoch(Duration::from_secs(
        noon().as_secs().saturating_add_signed(seconds_after_noon),
    ))
}

fn authenticator(cas: &[&Ca]) -> X509Authenticator {
    let pems: Vec<String> = cas.iter().map(|ca| ca.pem()).collect();
    let bundles: Vec<&str> = pems.iter().map(String::as_str).collect();
    X509Authenticator::new("x509", &bundles, Duration::from_secs(30)).unwrap()
}

#[test]
fn a_valid_certificate_becomes_its_subject() {
    let ca = Ca::new();
    let outcome = authenticator(&[&ca]).authenticate_at(&[ca.issue(|_| {})], noon());
    let Outcome::Authenticated(identity) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(identity.user.username, "alice");
    assert_eq!(identity.user.groups, vec!["devs"]);
    assert_eq!(identity.user.uid, None);
    assert_eq!(&*identity.authenticator, "x509");
}

#[test]
fn any_of_several_ca_pools_is_trusted() {
    let (signer, cluster, stranger) = (Ca::new(), Ca::new(), Ca::new());
    let both = authenticator(&[&signer, &cluster]);
    assert!(matches!(
        both.authenticate_at(&[signer.issue(|_| {})], noon()),
        Outcome::Authenticated(_)
    ));
    assert!(matches!(
        both.authenticate_at(&[cluster.issue(|_| {})], noon()),
        Outcome::Authenticated(_)
    ));
    assert_eq!(
        both.authenticate_at(&[stranger.issue(|_| {})], noon()),
        Outcome::Rejected(RejectReason::UntrustedCertificate)
    );
}

#[test]
fn the_validity_window_is_enforced_with_a_small_skew() {
    let ca = Ca::new();
    let x509 = authenticator(&[&ca]);
    let cert = [ca.issue(|p| {
        p.not_before = rcgen::date_time_ymd(2026, 1, 1) + time::Duration::hours(12);
        p.not_after = rcgen::date_time_ymd(2026, 1, 1) + time::Duration::hours(13);
    })];
    assert!(
        matches!(x509.authenticate_at(&cert, at(-10)), Outcome::Authenticated(_)),
        "10 s early is skew"
    );
    assert_eq!(
        x509.authenticate_at(&cert, at(-120)),
        Outcome::Rejected(RejectReason::NotYetValid)
    );
    assert!(
        matches!(
            x509.authenticate_at(&cert, at(3600 + 10)),
            Outcome::Authenticated(_)
        ),
        "10 s late"
    );
    assert_eq!(
        x509.authenticate_at(&cert, at(3600 + 120)),
        Outcome::Rejected(RejectReason::Expired)
    );
}

#[test]
fn without_a_configured_skew_a_certificate_counts_from_notbefore_to_notafter_exactly() {
    let ca = Ca::new();
    let x509 = X509Authenticator::new("x509", &[&ca.pem()], DEFAULT_CLOCK_SKEW).unwrap();
    let cert = [ca.issue(|p| {
        p.not_before = rcgen::date_time_ymd(2026, 1, 1) + time::Duration::hours(12);
        p.not_after = rcgen::date_time_ymd(2026, 1, 1) + time::Duration::hours(13);
    })];
    assert_eq!(
        x509.authenticate_at(&cert, at(-1)),
        Outcome::Rejected(RejectReason::NotYetValid)
    );
    assert!(matches!(
        x509.authenticate_at(&cert, at(0)),
        Outcome::Authenticated(_)
    ));
    assert!(matches!(
        x509.authenticate_at(&cert, at(3600)),
        Outcome::Authenticated(_)
    ));
    assert_eq!(
        x509.authenticate_at(&cert, at(3601)),
        Outcome::Rejected(RejectReason::Expired),
        "one second after notAfter"
    );
    let error =
        X509Authenticator::new("x509", &[&ca.pem()], MAX_CLOCK_SKEW + Duration::from_secs(1)).unwrap_err();
    assert!(matches!(error, X509ConfigError::ClockSkewTooLarge(_)), "{error}");
}

#[test]
fn a_verdict_holds_until_the_first_certificate_of_the_chain_expires() {
    let ca = Ca::new();
    let x509 = authenticator(&[&ca]);
    let cert = [ca.issue(|p| {
        p.not_after = rcgen::date_time_ymd(2026, 1, 1) + time::Duration::hours(13);
    })];
    let verdict = x509.verdict_at(&cert, noon());
    assert!(matches!(verdict.outcome, Outcome::Authenticated(_)));
    // notAfter is an hour after noon; the 30 s skew of `authenticator` is allowed on top.
    assert_eq!(verdict.recheck_at, Some(at(3600 + 30 + 1)));
    assert!(verdict.holds_at(at(3600 + 30)));
    assert!(!verdict.holds_at(at(3600 + 31)));
    assert_eq!(
        x509.verdict_at(&cert, at(3600 + 31)).outcome,
        Outcome::Rejected(RejectReason::Expired)
    );

    // Refusals that time cannot cure hold until the trust changes; "not yet valid" does not.
    let stranger = Ca::new().issue(|_| {});
    let untrusted = x509.verdict_at(&[stranger], noon());
    assert_eq!(untrusted.recheck_at, None);
    assert!(untrusted.holds_at(at(1_000_000)));
    let early = x509.verdict_at(&cert, at(-13 * 3600));
    assert_eq!(early.outcome, Outcome::Rejected(RejectReason::NotYetValid));
    assert!(!early.holds_at(at(-13 * 3600)));
}

#[test]
fn verdicts_carry_over_only_between_authenticators_with_the_same_trust() {
    let (one, two) = (Ca::new(), Ca::new());
    assert!(authenticator(&[&one, &two]).trusts_same_as(&authenticator(&[&one, &two])));
    assert!(!authenticator(&[&one, &two]).trusts_same_as(&authenticator(&[&one])));
    assert!(!authenticator(&[&one]).trusts_same_as(&authenticator(&[&two])));
    let no_skew = X509Authenticator::new("x509", &[&one.pem()], Duration::ZERO).unwrap();
    assert!(!no_skew.trusts_same_as(&authenticator(&[&one])));
}

#[test]
fn the_client_auth_usage_is_required() {
    let ca = Ca::new();
    let x509 = authenticator(&[&ca]);
    let server_only = ca.issue(|p| p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth]);
    assert_eq!(
        x509.authenticate_at(&[server_only], noon()),
        Outcome::Rejected(RejectReason::UntrustedCertificate)
    );
    let no_eku = ca.issue(|p| p.extended_key_usages = vec![]);
    assert_eq!(
        x509.authenticate_at(&[no_eku], noon()),
        Outcome::Rejected(RejectReason::UntrustedCertificate)
    );
}

#[test]
fn subjects_without_a_single_non_empty_common_name_are_refused() {
    let ca = Ca::new();
    let x509 = authenticator(&[&ca]);
    let no_cn = ca.issue(|p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationName, "devs");
    });
    assert_eq!(
        x509.authenticate_at(&[no_cn], noon()),
        Outcome::Rejected(RejectReason::EmptyUsername)
    );
    let empty_cn = ca.issue(|p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, "");
    });
    assert_eq!(
        x509.authenticate_at(&[empty_cn], noon()),
        Outcome::Rejected(RejectReason::EmptyUsername)
    );
}

#[test]
fn no_certificate_is_not_mine_and_garbage_is_malformed() {
    let ca = Ca::new();
    let x509 = authenticator(&[&ca]);
    assert_eq!(x509.authenticate_at(&[], noon()), Outcome::NotMine);
    let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01]);
    assert_eq!(
        x509.authenticate_at(&[garbage], noon()),
        Outcome::Rejected(RejectReason::Malformed)
    );
}

#[test]
fn invalid_ca_bundles_are_refused_at_configuration_time() {
    let error = X509Authenticator::new("x", &["not pem"], DEFAULT_CLOCK_SKEW)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("bundle 0") && error.contains("no PEM certificate"),
        "{error}"
    );
    let ca = Ca::new();
    let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let error = X509Authenticator::new("x", &[&ca.pem(), broken], DEFAULT_CLOCK_SKEW)
        .unwrap_err()
        .to_string();
    assert!(error.contains("bundle 1"), "{error}");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Arbitrary bytes as a peer certificate (or chain) are refused, never a panic.
        #[test]
        fn arbitrary_der_is_never_authenticated(chain in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..512), 1..3)) {
            let ca = Ca::new();
            let x509 = authenticator(&[&ca]);
            let chain: Vec<CertificateDer<'static>> = chain.into_iter().map(CertificateDer::from).collect();
            let outcome = x509.authenticate_at(&chain, noon());
            prop_assert!(matches!(outcome, Outcome::Rejected(_)), "{outcome:?}");
        }

        /// Flipping any one byte of a valid certificate never yields a different identity.
        #[test]
        fn a_corrupted_certificate_is_refused_or_unchanged(position in 0usize..2048, flip in 1u8..=255) {
            let ca = Ca::new();
            let x509 = authenticator(&[&ca]);
            let good = ca.issue(|_| {});
            let mut bytes = good.to_vec();
            let index = position % bytes.len();
            bytes[index] ^= flip;
            let outcome = x509.authenticate_at(&[CertificateDer::from(bytes)], noon());
            match outcome {
                Outcome::Rejected(_) => {}
                Outcome::Authenticated(identity) => {
                    // Only bytes outside the signed subject can change without detection
                    // (e.g. the unsigned outer signature algorithm encoding); the user is the same.
                    prop_assert_eq!(&identity.user.username, "alice");
                    prop_assert_eq!(&identity.user.groups, &vec!["devs".to_string()]);
                }
                Outcome::NotMine => prop_assert!(false, "a certificate was presented"),
            }
        }
    }
}

#[test]
fn credential_ids_are_the_lowercase_hex_sha256_of_the_der() {
    // SHA-256 test vectors (FIPS 180-2): the empty input and "abc".
    assert_eq!(
        credential_id(&CertificateDer::from(&[][..])),
        "X509SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        credential_id(&CertificateDer::from(&b"abc"[..])),
        "X509SHA256=ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn an_authenticated_certificate_carries_its_credential_id_and_nothing_else() {
    let ca = Ca::new();
    let (alice, other) = (ca.issue(|_| {}), ca.issue(|_| {}));
    let x509 = authenticator(&[&ca]);
    let extra_of =
        |leaf: &CertificateDer<'static>| match x509.authenticate_at(std::slice::from_ref(leaf), noon()) {
            Outcome::Authenticated(identity) => identity.user.extra.clone(),
            outcome => panic!("{outcome:?}"),
        };
    assert_eq!(
        extra_of(&alice),
        std::collections::BTreeMap::from([(CREDENTIAL_ID_EXTRA.to_string(), vec![credential_id(&alice)])])
    );
    // Two certificates of one subject are two credentials.
    assert_ne!(extra_of(&alice), extra_of(&other));
}
