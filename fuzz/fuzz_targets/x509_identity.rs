//! Client certificates into `X509Authenticator::authenticate_at`, trusting one CA whose private
//! key is dropped once its certificate exists.
//!
//! An input whose first byte is below [`STRUCTURED`] is the leaf's DER (a chain of one). Otherwise
//! the rest describes a certificate that rcgen builds and an impostor signs (a CA with the trusted
//! CA's very name and another key, or the leaf itself): `selector, not-before and not-after as
//! i16 LE seconds from the verification time, CN, 0x00, O values split by 0x01, 0x00, patches`,
//! where each 3-byte patch (u16 LE offset, xor byte) flips bits in the finished DER. The selector
//! picks the validity window, the extended key usage, CA or not, the impostor CA's certificate
//! as an intermediate, a second CN, self-signing, the patches, and the CA's name as the subject.
//! Those certificates are well-formed enough to reach path building and signature checks.
//!
//! Invariant: nothing is authenticated (no input carries the trusted CA's signature), and a
//! non-empty chain is never `NotMine`.

#![no_main]

use std::{sync::OnceLock, time::Duration};

use libfuzzer_sys::fuzz_target;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, UnixTime};
use selkie_filters::{
    outcome::Outcome,
    x509::{X509Authenticator, DEFAULT_CLOCK_SKEW},
};

/// An input whose first byte is at least this is structured (a DER certificate starts with 0x30).
const STRUCTURED: u8 = 0xF0;
/// The verification time (2027-01-15T08:00:00Z): a constant, so that runs are reproducible.
const NOW: u64 = 1_800_000_000;

/// OIDs of CN and O, to add a second value of each (rcgen keeps one per attribute type).
const OID_COMMON_NAME: [u64; 4] = [2, 5, 4, 3];
const OID_ORGANIZATION: [u64; 4] = [2, 5, 4, 10];

struct Fixture {
    authenticator: X509Authenticator,
    /// Signs with another key under the trusted CA's name.
    impostor: Issuer<'static, KeyPair>,
    /// The impostor's self-signed CA certificate.
    impostor_cert: CertificateDer<'static>,
    leaf_key: KeyPair,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = ca_name();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    params
}

fn ca_name() -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "selkie fuzz client CA");
    name.push(DnType::OrganizationName, "selkie");
    name
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        selkie_fuzz::install_crypto_provider();
        let ca_pem = {
            let ca_key = KeyPair::generate().expect("generating the CA key");
            ca_params()
                .self_signed(&ca_key)
                .expect("self-signing the CA")
                .pem()
        };
        let authenticator =
            X509Authenticator::new("fuzz", &[&ca_pem], DEFAULT_CLOCK_SKEW).expect("trusting the fuzz CA");
        let impostor_key = KeyPair::generate().expect("generating the impostor's key");
        let impostor_cert = ca_params()
            .self_signed(&impostor_key)
            .expect("self-signing the impostor CA")
            .der()
            .clone();
        Fixture {
            authenticator,
            impostor: Issuer::new(ca_params(), impostor_key),
            impostor_cert,
            leaf_key: KeyPair::generate().expect("generating the leaf key"),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let chain = match data.split_first() {
        Some((&flag, rest)) if flag >= STRUCTURED => match structured(fixture, rest) {
            Some(chain) => chain,
            None => return,
        },
        _ => vec![CertificateDer::from(data)],
    };
    let now = UnixTime::since_unix_epoch(Duration::from_secs(NOW));
    match fixture.authenticator.authenticate_at(&chain, now) {
        Outcome::Authenticated(identity) => {
            panic!(
                "authenticated a certificate no trusted CA signed, as {:?}",
                identity.user
            )
        }
        Outcome::NotMine => panic!("a chain of {} certificates was NotMine", chain.len()),
        Outcome::Rejected(_) => {}
    }
});

/// The chain a structured input describes, or `None` if rcgen cannot build its leaf.
fn structured(fixture: &Fixture, input: &[u8]) -> Option<Vec<CertificateDer<'static>>> {
    let mut head = [0u8; 5];
    let head_len = input.len().min(head.len());
    head[..head_len].copy_from_slice(&input[..head_len]);
    let [selector, before_lo, before_hi, after_lo, after_hi] = head;
    let bit = |n: u8| selector & (1 << n) != 0;
    let mut parts = input[head_len..].splitn(3, |b| *b == 0);
    let (common_name, organizations, patches) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );

    let mut params = CertificateParams::default();
    if bit(0) {
        let at = |lo, hi| {
            let offset = time::Duration::seconds(i64::from(i16::from_le_bytes([lo, hi])));
            time::OffsetDateTime::from_unix_timestamp(NOW as i64).map(|now| now + offset)
        };
        params.not_before = at(before_lo, before_hi).ok()?;
        params.not_after = at(after_lo, after_hi).ok()?;
    }
    params.extended_key_usages = vec![if bit(1) {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    if bit(2) {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    if bit(7) {
        params.distinguished_name = ca_name();
    } else {
        let name = &mut params.distinguished_name;
        name.push(DnType::CommonName, String::from_utf8_lossy(common_name));
        if bit(4) {
            name.push(DnType::CustomDnType(OID_COMMON_NAME.to_vec()), "second");
        }
        let mut organizations = organizations.split(|b| *b == 1);
        if let Some(organization) = organizations.next() {
            name.push(DnType::OrganizationName, String::from_utf8_lossy(organization));
        }
        if let Some(organization) = organizations.next() {
            name.push(
                DnType::CustomDnType(OID_ORGANIZATION.to_vec()),
                String::from_utf8_lossy(organization),
            );
        }
    }

    let leaf = if bit(5) {
        params.self_signed(&fixture.leaf_key)
    } else {
        params.signed_by(&fixture.leaf_key, &fixture.impostor)
    };
    let mut der = leaf.ok()?.der().to_vec();
    if bit(6) {
        for patch in patches.chunks_exact(3) {
            let offset = usize::from(u16::from_le_bytes([patch[0], patch[1]])) % der.len();
            der[offset] ^= patch[2];
        }
    }
    let mut chain = vec![CertificateDer::from(der)];
    if bit(3) {
        chain.push(fixture.impostor_cert.clone());
    }
    Some(chain)
}
