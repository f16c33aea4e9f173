//! The TokenCredentialRequest issue rate (PERF.md: ≥ 3,000 issued credentials per second per
//! core, ECDSA P-256), in process, and where its time goes.
//!
//! * `tcr/end-to-end`: [`SignerConciergeApi::token_credential_request`] with a chain holding one
//!   JWT authenticator (ES256 key installed by the `test-util` hook, no issuer) whose result for
//!   the token is already cached, so each iteration is what a repeated login costs: find the
//!   named authenticator, a cache hit, the audit event (no subscriber here), a fresh P-256 key, a
//!   signed certificate, both PEM-encoded, the expiry formatted. The request is cloned from a
//!   template in the untimed setup.
//! * `signer/issue`: [`ClientCertificateSigner::issue`] alone (`alice`, two groups);
//!   `signer/issue/rsa-2048-ca` the same with an RSA-2048 CA (kubeadm's default cluster CA).
//! * `signer/parts/*`: the steps of `issue` one by one, done the way `filters/src/signer.rs`
//!   does them with the same crates: `keygen` (ring: a P-256 key pair as PKCS#8), `spki` (the
//!   public point checked by p256 and encoded as a SubjectPublicKeyInfo), `build-tbs` (the
//!   subject, the x509-cert builder, the TBS encoding), `ca-sign` (ring: the CA's ECDSA-SHA256
//!   signature of the TBS), `cert-pem` and `key-pem` (the two encodings).
//! * `p256/*`: key generation, the CA's signature and the key's PKCS#8 PEM with the pure-Rust
//!   `p256` crate, as the signer did before it used ring, for comparison.
//!
//! Run: `cargo bench -p selkie-filters --features test-util --bench token_credential_request`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failure is a broken bench and should panic"
)]

mod common;

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use p256::{
    ecdsa::{signature::Signer as _, DerSignature, SigningKey, VerifyingKey},
    pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _, LineEnding},
};
use ring::{
    rand::SystemRandom,
    signature::{
        EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P256_SHA256_FIXED_SIGNING,
    },
};
use selkie_api::login::{TokenCredentialRequest, TokenCredentialRequestSpec, TypedLocalObjectReference};
use selkie_filters::{
    chain::{Chain, TokenAuthenticator},
    issuing::login_api::{ConciergeApi as _, SignerConciergeApi},
    issuing::signer::ClientCertificateSigner,
    jwt::{JwtAuthenticator, JwtConfig},
    test_util,
};
use serde_json::json;
use x509_cert::{
    attr::AttributeTypeAndValue,
    builder::{Builder as _, CertificateBuilder, Profile},
    der::{
        asn1::{BitString, SetOfVec, Utf8StringRef},
        oid::db::{rfc4519, rfc5280},
        pem, Any, DecodePem as _, EncodePem as _,
    },
    ext::pkix::ExtendedKeyUsage,
    name::{Name, RdnSequence, RelativeDistinguishedName},
    serial_number::SerialNumber,
    spki::SubjectPublicKeyInfoOwned,
    time::{Time, Validity},
};

const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "selkie-bench";
const GROUPS: [&str; 2] = ["devs", "ops"];
/// The authenticators' API group (`selkie_api::authentication::GROUP`, behind a feature this
/// crate does not turn on).
const AUTHENTICATION_GROUP: &str = "authentication.concierge.pinniped.dev";

/// An ECDSA P-256 CA (rcgen), as PEM certificate and PKCS#8 key.
fn ca() -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    (ca_certificate(&key), key.serialize_pem())
}

/// A self-signed CA certificate (PEM) for `key`.
fn ca_certificate(key: &rcgen::KeyPair) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "selkie-bench-signer");
    params.self_signed(key).unwrap().pem()
}

/// A JWT authenticator for [`ISSUER`] trusting `key` (ES256), and a valid token for `alice` in
/// [`GROUPS`].
fn jwt_and_token() -> (JwtAuthenticator, String) {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = key.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "es", "use": "sig", "alg": "ES256",
                     "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..65])});
    let mut config = JwtConfig::new("bench-jwt", ISSUER, AUDIENCE);
    // Never contacted (keys are installed), but a bundle avoids loading the system's roots.
    config.ca_bundle_pem = Some(test_util::unrelated_ca_pem());
    let jwt = JwtAuthenticator::new(config).unwrap();
    assert_eq!(
        jwt.install_keys(json!({"keys": [jwk]}).to_string().as_bytes())
            .unwrap(),
        1
    );

    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let header = json!({"alg": "ES256", "kid": "es", "typ": "JWT"});
    let claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "CgVhbGljZRIFbG9jYWw",
                        "username": "alice", "groups": GROUPS,
                        "iat": now, "nbf": now, "exp": now + 3600});
    let signed = format!(
        "{}.{}",
        B64URL.encode(header.to_string()),
        B64URL.encode(claims.to_string())
    );
    let signature = key.sign(&rng, signed.as_bytes()).unwrap();
    (jwt, format!("{signed}.{}", B64URL.encode(signature.as_ref())))
}

/// Panics unless `response` carries a credential for `alice` (a bench never measures a refusal).
fn assert_issued(response: &TokenCredentialRequest) {
    let credential = response
        .status
        .credential
        .as_ref()
        .unwrap_or_else(|| panic!("no credential: {:?}", response.status.message));
    let pem = credential.client_certificate_data.as_bytes();
    let certificate = x509_cert::Certificate::from_pem(pem).unwrap();
    let subject = certificate.tbs_certificate.subject.to_string();
    // RFC 4514 order: the last RDN first.
    assert_eq!(subject, "O=ops,O=devs,CN=alice");
    assert!(credential
        .client_key_data
        .starts_with("-----BEGIN PRIVATE KEY-----"));
}

/// `CN=<user>, O=<group>...`, one RDN each, the way the signer builds it.
fn subject(user: &str, groups: &[&str]) -> Name {
    let rdn = |oid, value: &str| {
        let value = Any::from(Utf8StringRef::new(value).unwrap());
        RelativeDistinguishedName::from(
            SetOfVec::try_from(vec![AttributeTypeAndValue { oid, value }]).unwrap(),
        )
    };
    let mut rdns = vec![rdn(rfc4519::CN, user)];
    rdns.extend(groups.iter().map(|group| rdn(rfc4519::O, group)));
    RdnSequence(rdns)
}

fn token_credential_request(c: &mut Criterion) {
    test_util::install_provider();
    let rt = common::runtime();
    let (ca_cert, ca_key) = ca();
    let signer = ClientCertificateSigner::from_pem(&ca_cert, &ca_key).unwrap();
    let api = SignerConciergeApi::new(signer);
    let (jwt, token) = jwt_and_token();
    let chain = Chain::new(vec![TokenAuthenticator::Jwt(Arc::new(jwt))]);
    let template = TokenCredentialRequest {
        api_version: "login.concierge.pinniped.dev/v1alpha1".into(),
        kind: "TokenCredentialRequest".into(),
        spec: TokenCredentialRequestSpec {
            token,
            authenticator: TypedLocalObjectReference {
                api_group: Some("authentication.concierge.pinniped.dev".into()),
                kind: "JWTAuthenticator".into(),
                name: "bench-jwt".into(),
            },
        },
        ..TokenCredentialRequest::default()
    };
    // The first request verifies the token and caches the result; the timed ones hit.
    assert_issued(&rt.block_on(api.token_credential_request(&chain, AUTHENTICATION_GROUP, template.clone())));
    common::assert_alice(&rt.block_on(chain.token_authenticators()[0].authenticate(&template.spec.token)));

    c.bench_function("tcr/end-to-end", |b| {
        b.to_async(&rt).iter_batched(
            || template.clone(),
            |request| {
                let (api, chain) = (&api, &chain);
                async move {
                    api.token_credential_request(chain, AUTHENTICATION_GROUP, request)
                        .await
                }
            },
            BatchSize::SmallInput,
        )
    });

    let signer = api.signer().unwrap();
    let now = SystemTime::now();
    let (not_before, not_after) = (now - Duration::from_secs(300), now + Duration::from_secs(300));
    c.bench_function("signer/issue", |b| {
        b.iter(|| {
            signer
                .issue(black_box("alice"), black_box(&GROUPS), not_before, not_after)
                .unwrap()
        })
    });

    // kubeadm's default cluster CA is RSA-2048 (here the RS256 benches' test key). Its one RSA
    // signature goes into the P-256 intermediate the signer makes at the first issue (outside
    // the measurement: criterion's warm-up) and keeps for a day; each issue is then the
    // intermediate's P-256 signature and the chain's PEM.
    let rsa_key = include_str!("keys/rs256-test-key.pem");
    let rsa_ca = ca_certificate(
        &rcgen::KeyPair::from_pkcs8_pem_and_sign_algo(rsa_key, &rcgen::PKCS_RSA_SHA256).unwrap(),
    );
    let rsa_signer = ClientCertificateSigner::from_pem(&rsa_ca, rsa_key).unwrap();
    c.bench_function("signer/issue/rsa-2048-ca", |b| {
        b.iter(|| {
            rsa_signer
                .issue(black_box("alice"), black_box(&GROUPS), not_before, not_after)
                .unwrap()
        })
    });

    // The parts, with the same crates and calls as the signer.
    let ca_signing = SigningKey::from_pkcs8_pem(&ca_key).unwrap();
    let ca_ring = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_ASN1_SIGNING,
        ca_signing.to_pkcs8_der().unwrap().as_bytes(),
        &SystemRandom::new(),
    )
    .unwrap();
    let issuer = x509_cert::Certificate::from_pem(ca_cert.as_bytes())
        .unwrap()
        .tbs_certificate
        .subject;
    let rng = SystemRandom::new();
    c.bench_function("signer/parts/keygen", |b| {
        b.iter(|| EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap())
    });
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    // ring's template ends with the uncompressed public point.
    let point = &pkcs8.as_ref()[pkcs8.as_ref().len() - 65..];
    c.bench_function("signer/parts/spki", |b| {
        b.iter(|| {
            let public = VerifyingKey::from_sec1_bytes(black_box(point)).unwrap();
            SubjectPublicKeyInfoOwned::from_key(public).unwrap()
        })
    });
    let spki = SubjectPublicKeyInfoOwned::from_key(VerifyingKey::from_sec1_bytes(point).unwrap()).unwrap();
    let validity = Validity {
        not_before: Time::try_from(not_before).unwrap(),
        not_after: Time::try_from(not_after).unwrap(),
    };
    let build = || {
        let profile = Profile::Leaf {
            issuer: issuer.clone(),
            enable_key_agreement: false,
            enable_key_encipherment: false,
        };
        let serial = SerialNumber::new(&[0x40; 16]).unwrap();
        let mut builder = CertificateBuilder::new(
            profile,
            serial,
            validity,
            subject("alice", &GROUPS),
            spki.clone(),
            &ca_signing,
        )
        .unwrap();
        builder
            .add_extension(&ExtendedKeyUsage(vec![rfc5280::ID_KP_CLIENT_AUTH]))
            .unwrap();
        let tbs = builder.finalize().unwrap();
        (builder, tbs)
    };
    c.bench_function("signer/parts/build-tbs", |b| b.iter(build));
    let (builder, tbs) = build();
    eprintln!("TBS certificate: {} bytes", tbs.len());
    c.bench_function("signer/parts/ca-sign", |b| {
        b.iter(|| ca_ring.sign(&rng, black_box(&tbs)).unwrap())
    });
    let signature = ca_ring.sign(&rng, &tbs).unwrap();
    let certificate = builder
        .assemble(BitString::from_bytes(signature.as_ref()).unwrap())
        .unwrap();
    c.bench_function("signer/parts/cert-pem", |b| {
        b.iter(|| black_box(&certificate).to_pem(LineEnding::LF).unwrap())
    });
    c.bench_function("signer/parts/key-pem", |b| {
        b.iter(|| pem::encode_string("PRIVATE KEY", LineEnding::LF, black_box(pkcs8.as_ref())).unwrap())
    });

    // The same steps with the pure-Rust p256 crate (the signer before ring): keygen, the CA's
    // signature, and PKCS#8 PEM (which recomputes the public key from the private scalar).
    let rng = &mut p256::elliptic_curve::rand_core::OsRng;
    c.bench_function("p256/keygen", |b| b.iter(|| SigningKey::random(rng)));
    c.bench_function("p256/ca-sign", |b| {
        b.iter(|| -> DerSignature { ca_signing.sign(black_box(&tbs)) })
    });
    let leaf = SigningKey::random(rng);
    c.bench_function("p256/key-pkcs8-pem", |b| {
        b.iter(|| black_box(&leaf).to_pkcs8_pem(LineEnding::LF).unwrap())
    });
}

criterion_group!(benches, token_credential_request);
criterion_main!(benches);
