//! Issues Kubernetes client certificates: what a TokenCredentialRequest returns.
//!
//! A [`ClientCertificateSigner`] holds a CA certificate and its key: RSA (2048 to 8192 bits,
//! kubeadm's default cluster CA), ECDSA P-256 or ECDSA P-384, read from the forms kubeadm, Go and
//! OpenSSL write (PKCS#1 `RSA PRIVATE KEY`, SEC1 `EC PRIVATE KEY`, PKCS#8 `PRIVATE KEY`). It signs
//! as Go's `x509.CreateCertificate` does with such a key: SHA-256 with RSA (PKCS#1 v1.5),
//! ECDSA with SHA-256 for P-256, with SHA-384 for P-384.
//!
//! Each [`ClientCertificateSigner::issue`] makes a fresh P-256 key and a certificate with
//! `CN=<user>` and one `O=<group>` RDN per group (how kube-apiserver and the x509 authenticator
//! read groups; rcgen can keep only one `O`, hence `x509-cert`), the clientAuth extended key
//! usage, and the validity asked for.
//!
//! All the public-key work of an issue — the new key pair and the CA's signature — is done by
//! ring (assembly; `perf/results/token-credential-request.md` measured it at about a fifth of
//! the pure-Rust `p256` crate's cost); `x509-cert` encodes the certificate, `p256` only checks
//! the new public key and encodes it as a SubjectPublicKeyInfo.

use std::time::SystemTime;

use p256::{
    ecdsa::{signature::Keypair, VerifyingKey},
    pkcs8::LineEnding,
};
use ring::{
    rand::SystemRandom,
    signature::{
        EcdsaKeyPair, RsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING,
        RSA_PKCS1_SHA256,
    },
};
use rustls_pki_types::{pem::PemObject as _, PrivateKeyDer};
use x509_cert::{
    attr::AttributeTypeAndValue,
    builder::{Builder, CertificateBuilder, Profile},
    der::{
        asn1::{BitString, ObjectIdentifier, SetOfVec, Utf8StringRef},
        oid::db::{rfc4519, rfc5280, rfc5912},
        pem, Any, Decode, DecodePem, EncodePem,
    },
    ext::pkix::ExtendedKeyUsage,
    name::{Name, RdnSequence, RelativeDistinguishedName},
    serial_number::SerialNumber,
    spki::{
        AlgorithmIdentifierOwned, DynSignatureAlgorithmIdentifier, EncodePublicKey, SubjectPublicKeyInfoOwned,
    },
    time::{Time, Validity},
};

/// Why a signer cannot be built or a certificate not issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignerError {
    /// The CA certificate is not a PEM X.509 certificate.
    #[error("the signer CA certificate is invalid: {0}")]
    InvalidCertificate(String),
    /// The CA key is not an RSA, P-256 or P-384 private key in PEM, or does not belong to the
    /// certificate.
    #[error("the signer CA key is invalid: {0}")]
    InvalidKey(String),
    /// A name cannot be encoded, or the validity is out of range.
    #[error("the certificate cannot be issued: {0}")]
    Issue(String),
}

/// A freshly issued certificate and its private key, both PEM (the key PKCS#8).
#[derive(Clone)]
pub struct IssuedCertificate {
    /// The certificate.
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCertificate {
    // Key material never appears in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate").finish_non_exhaustive()
    }
}

/// A CA that signs client certificates. See the module documentation.
pub struct ClientCertificateSigner {
    /// The CA key, for ring to sign with.
    key: CaKey,
    /// The CA's public key and signature algorithm, as `x509-cert`'s builder wants them (it names
    /// the algorithm in the certificate and derives the authority key identifier). It never signs.
    naming: CaNaming,
    rng: SystemRandom,
    issuer: Name,
}

/// A CA private key as ring holds it.
enum CaKey {
    Ecdsa(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// The CA's public half for `x509-cert`'s builder.
struct CaNaming {
    public: CaPublicKey,
    algorithm: AlgorithmIdentifierOwned,
}

/// The CA certificate's SubjectPublicKeyInfo, as the builder's "verifying key".
#[derive(Clone)]
struct CaPublicKey(SubjectPublicKeyInfoOwned);

impl EncodePublicKey for CaPublicKey {
    fn to_public_key_der(&self) -> x509_cert::spki::Result<x509_cert::der::Document> {
        Ok(x509_cert::der::Document::encode_msg(&self.0)?)
    }
}

impl Keypair for CaNaming {
    type VerifyingKey = CaPublicKey;

    fn verifying_key(&self) -> CaPublicKey {
        self.public.clone()
    }
}

impl DynSignatureAlgorithmIdentifier for CaNaming {
    fn signature_algorithm_identifier(&self) -> x509_cert::spki::Result<AlgorithmIdentifierOwned> {
        Ok(self.algorithm.clone())
    }
}

impl std::fmt::Debug for ClientCertificateSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificateSigner")
            .field("issuer", &self.issuer.to_string())
            .finish_non_exhaustive()
    }
}

impl ClientCertificateSigner {
    /// Reads the CA certificate (the first PEM block) and its key (the first private-key PEM
    /// block: PKCS#1, SEC1 or PKCS#8; other blocks such as `EC PARAMETERS` are skipped); fails
    /// if either is unreadable, the key is not RSA (2048 to 8192 bits), P-256 or P-384, or it is
    /// not the certificate's key. Error messages never contain key material.
    pub fn from_pem(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, SignerError> {
        let certificate = x509_cert::Certificate::from_pem(ca_cert_pem.as_bytes())
            .map_err(|e| SignerError::InvalidCertificate(e.to_string()))?;
        let spki = certificate.tbs_certificate.subject_public_key_info;
        let invalid = |message: &str| SignerError::InvalidKey(message.to_string());
        let rng = SystemRandom::new();
        let key = PrivateKeyDer::from_pem_slice(ca_key_pem.as_bytes())
            .map_err(|_| invalid("no PEM private key (PKCS#1, SEC1 or PKCS#8) found"))?;
        let (key, algorithm) = match key {
            PrivateKeyDer::Pkcs1(pkcs1) => rsa_key(RsaKeyPair::from_der(pkcs1.secret_pkcs1_der()), &spki)?,
            PrivateKeyDer::Sec1(sec1) => ecdsa_key(sec1.secret_sec1_der(), None, &spki, &rng)?,
            PrivateKeyDer::Pkcs8(pkcs8) => {
                let der = pkcs8.secret_pkcs8_der();
                let info = pkcs8::PrivateKeyInfo::from_der(der)
                    .map_err(|e| SignerError::InvalidKey(format!("not PKCS#8: {e}")))?;
                match info.algorithm.oid {
                    rfc5912::RSA_ENCRYPTION => rsa_key(RsaKeyPair::from_pkcs8(der), &spki)?,
                    rfc5912::ID_EC_PUBLIC_KEY => {
                        let curve = info.algorithm.parameters_oid().ok();
                        ecdsa_key(info.private_key, curve, &spki, &rng)?
                    }
                    other => {
                        return Err(SignerError::InvalidKey(format!(
                            "a {other} key; only RSA and ECDSA (P-256, P-384) keys sign"
                        )))
                    }
                }
            }
            _ => return Err(invalid("an unknown kind of private key")),
        };
        Ok(Self {
            key,
            naming: CaNaming {
                public: CaPublicKey(spki),
                algorithm,
            },
            rng,
            issuer: certificate.tbs_certificate.subject,
        })
    }

    /// Issues a client certificate for `user` in `groups`, valid from `not_before` to
    /// `not_after`, with a new key.
    pub fn issue(
        &self,
        user: &str,
        groups: &[impl AsRef<str>],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<IssuedCertificate, SignerError> {
        let issue = |what: &str| {
            let what = what.to_string();
            move |e: &dyn std::fmt::Display| SignerError::Issue(format!("{what}: {e}"))
        };
        let key = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &self.rng)
            .map_err(|e| issue("key")(&e))?;
        let public =
            VerifyingKey::from_sec1_bytes(public_point(key.as_ref())?).map_err(|e| issue("key")(&e))?;
        let spki = SubjectPublicKeyInfoOwned::from_key(public).map_err(|e| issue("key")(&e))?;
        let validity = Validity {
            not_before: Time::try_from(not_before).map_err(|e| issue("validity")(&e))?,
            not_after: Time::try_from(not_after).map_err(|e| issue("validity")(&e))?,
        };
        let profile = Profile::Leaf {
            issuer: self.issuer.clone(),
            enable_key_agreement: false,
            enable_key_encipherment: false,
        };
        let mut builder = CertificateBuilder::new(
            profile,
            serial_from(&spki)?,
            validity,
            client_subject(user, groups)?,
            spki,
            &self.naming,
        )
        .map_err(|e| issue("builder")(&e))?;
        builder
            .add_extension(&ExtendedKeyUsage(vec![rfc5280::ID_KP_CLIENT_AUTH]))
            .map_err(|e| issue("extended key usage")(&e))?;
        // What `Builder::build` does, with ring's signature (DER for ECDSA) in place of a
        // RustCrypto signer's.
        let to_be_signed = builder.finalize().map_err(|e| issue("encoding")(&e))?;
        let signature = match &self.key {
            CaKey::Ecdsa(ecdsa) => ecdsa
                .sign(&self.rng, &to_be_signed)
                .map(|signature| signature.as_ref().to_vec()),
            CaKey::Rsa(rsa) => {
                let mut signature = vec![0; rsa.public().modulus_len()];
                rsa.sign(&RSA_PKCS1_SHA256, &self.rng, &to_be_signed, &mut signature)
                    .map(|()| signature)
            }
        }
        .map_err(|e| issue("signing")(&e))?;
        let certificate = builder
            .assemble(BitString::from_bytes(&signature).map_err(|e| issue("signing")(&e))?)
            .map_err(|e| issue("signing")(&e))?;
        Ok(IssuedCertificate {
            cert_pem: certificate
                .to_pem(LineEnding::LF)
                .map_err(|e| issue("encoding")(&e))?,
            key_pem: pem::encode_string("PRIVATE KEY", LineEnding::LF, key.as_ref())
                .map_err(|e| issue("encoding the key")(&e))?,
        })
    }
}

/// An RSA CA key ring accepted (or why not), checked to be the certificate's, and Go's signature
/// algorithm for it.
fn rsa_key(
    key: Result<RsaKeyPair, ring::error::KeyRejected>,
    spki: &SubjectPublicKeyInfoOwned,
) -> Result<(CaKey, AlgorithmIdentifierOwned), SignerError> {
    let key = key.map_err(|e| SignerError::InvalidKey(format!("an RSA key ring refuses: {e}")))?;
    if spki.algorithm.oid != rfc5912::RSA_ENCRYPTION {
        return Err(SignerError::InvalidKey(
            "an RSA key, but the CA certificate's key is not RSA".into(),
        ));
    }
    // The certificate's subjectPublicKey is the key's RSAPublicKey (DER).
    if key.public().as_ref() != spki.subject_public_key.raw_bytes() {
        return Err(SignerError::InvalidKey(
            "it does not belong to the CA certificate".into(),
        ));
    }
    // sha256WithRSAEncryption's parameters are an explicit NULL (RFC 4055).
    let algorithm = AlgorithmIdentifierOwned {
        oid: rfc5912::SHA_256_WITH_RSA_ENCRYPTION,
        parameters: Some(Any::null()),
    };
    Ok((CaKey::Rsa(key), algorithm))
}

/// An ECDSA CA key from its SEC1 `ECPrivateKey` DER (and the curve its PKCS#8 wrapper names):
/// the curve and the public point are the certificate's, and ring checks that the private scalar
/// is theirs.
fn ecdsa_key(
    sec1_der: &[u8],
    pkcs8_curve: Option<ObjectIdentifier>,
    spki: &SubjectPublicKeyInfoOwned,
    rng: &SystemRandom,
) -> Result<(CaKey, AlgorithmIdentifierOwned), SignerError> {
    let key = sec1::EcPrivateKey::from_der(sec1_der)
        .map_err(|e| SignerError::InvalidKey(format!("not an EC private key: {e}")))?;
    if spki.algorithm.oid != rfc5912::ID_EC_PUBLIC_KEY {
        return Err(SignerError::InvalidKey(
            "an EC key, but the CA certificate's key is not EC".into(),
        ));
    }
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|parameters| parameters.decode_as::<ObjectIdentifier>().ok());
    let (signing, digest, size) = match curve {
        Some(rfc5912::SECP_256_R_1) => (&ECDSA_P256_SHA256_ASN1_SIGNING, rfc5912::ECDSA_WITH_SHA_256, 32),
        Some(rfc5912::SECP_384_R_1) => (&ECDSA_P384_SHA384_ASN1_SIGNING, rfc5912::ECDSA_WITH_SHA_384, 48),
        _ => {
            return Err(SignerError::InvalidKey(
                "an EC key on a curve other than P-256 and P-384".into(),
            ))
        }
    };
    let named = key.parameters.and_then(|parameters| parameters.named_curve());
    for named in [named, pkcs8_curve].into_iter().flatten() {
        if Some(named) != curve {
            return Err(SignerError::InvalidKey(
                "it does not belong to the CA certificate (another curve)".into(),
            ));
        }
    }
    // SEC1 writes the scalar at the curve's size; a short one is left-padded as Go reads it.
    let scalar = key.private_key;
    if scalar.len() > size {
        return Err(SignerError::InvalidKey(
            "the private scalar is too long for its curve".into(),
        ));
    }
    let mut padded = vec![0u8; size - scalar.len()];
    padded.extend_from_slice(scalar);
    let pair = EcdsaKeyPair::from_private_key_and_public_key(
        signing,
        &padded,
        spki.subject_public_key.raw_bytes(),
        rng,
    )
    .map_err(|_| SignerError::InvalidKey("it does not belong to the CA certificate".into()))?;
    let algorithm = AlgorithmIdentifierOwned {
        oid: digest,
        parameters: None,
    };
    Ok((CaKey::Ecdsa(pair), algorithm))
}

/// The uncompressed public point of a P-256 PKCS#8 document ring generated: its last 65 bytes,
/// after `[1] BIT STRING` with no unused bits (ring's fixed template). Fails on any other shape.
fn public_point(pkcs8: &[u8]) -> Result<&[u8], SignerError> {
    const PREFIX: [u8; 5] = [0xa1, 0x44, 0x03, 0x42, 0x00];
    pkcs8
        .len()
        .checked_sub(PREFIX.len() + 65)
        .and_then(|start| pkcs8.get(start..))
        .and_then(|tail| tail.strip_prefix(&PREFIX[..]))
        .ok_or_else(|| {
            SignerError::Issue("key: the generated PKCS#8 document has no public key at its end".into())
        })
}

/// `CN=<user>, O=<group>...`, one RDN each, in the order given.
fn client_subject(user: &str, groups: &[impl AsRef<str>]) -> Result<Name, SignerError> {
    let rdn = |oid, value: &str| -> Result<RelativeDistinguishedName, SignerError> {
        let value = Any::from(
            Utf8StringRef::new(value).map_err(|e| SignerError::Issue(format!("name {value:?}: {e}")))?,
        );
        SetOfVec::try_from(vec![AttributeTypeAndValue { oid, value }])
            .map(RelativeDistinguishedName::from)
            .map_err(|e| SignerError::Issue(format!("name: {e}")))
    };
    let mut rdns = vec![rdn(rfc4519::CN, user)?];
    for group in groups {
        rdns.push(rdn(rfc4519::O, group.as_ref())?);
    }
    Ok(RdnSequence(rdns))
}

/// A positive 16-byte serial number taken from the (fresh, random) public key.
fn serial_from(spki: &SubjectPublicKeyInfoOwned) -> Result<SerialNumber, SignerError> {
    let raw = spki.subject_public_key.raw_bytes();
    let mut bytes = [0u8; 16];
    for (i, b) in raw.iter().rev().take(16).enumerate() {
        bytes[i] = *b;
    }
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::new(&bytes).map_err(|e| SignerError::Issue(format!("serial number: {e}")))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use p256::{
        ecdsa::SigningKey,
        pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _},
    };

    use super::*;
    use crate::x509::X509Authenticator;

    const RSA_2048: &str = include_str!("test-keys/rsa-2048-a.pem");
    const RSA_3072: &str = include_str!("test-keys/rsa-3072-b.pem");

    /// A self-signed CA certificate for `key`.
    fn ca_for(key: &rcgen::KeyPair) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "signer");
        params.self_signed(key).unwrap().pem()
    }

    /// A P-256 CA: its certificate and PKCS#8 key.
    fn ca() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        (ca_for(&key), key.serialize_pem())
    }

    /// An RSA CA for one of the test keys: its certificate and PKCS#8 key.
    fn rsa_ca(pkcs8_pem: &str) -> (String, String) {
        let key = rcgen::KeyPair::from_pkcs8_pem_and_sign_algo(pkcs8_pem, &rcgen::PKCS_RSA_SHA256).unwrap();
        (ca_for(&key), pkcs8_pem.to_string())
    }

    /// The PKCS#1 (`RSA PRIVATE KEY`) form of a PKCS#8 RSA key, as kubeadm writes `ca.key`.
    fn pkcs1(pkcs8_pem: &str) -> String {
        let (_, der) = pem::decode_vec(pkcs8_pem.as_bytes()).unwrap();
        let info = pkcs8::PrivateKeyInfo::from_der(&der).unwrap();
        pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, info.private_key).unwrap()
    }

    /// The SEC1 (`EC PRIVATE KEY`) form of a PKCS#8 EC key, as Go and Pinniped write them.
    fn sec1(pkcs8_pem: &str) -> String {
        let (_, der) = pem::decode_vec(pkcs8_pem.as_bytes()).unwrap();
        let info = pkcs8::PrivateKeyInfo::from_der(&der).unwrap();
        pem::encode_string("EC PRIVATE KEY", LineEnding::LF, info.private_key).unwrap()
    }

    /// Issues for `user` in `groups` and returns the certificate after checking that the x509
    /// authenticator (webpki, as the impersonation proxy verifies) reads that identity from it
    /// with `ca_pem` as its only anchor.
    fn issue_and_authenticate(signer: &ClientCertificateSigner, ca_pem: &str) -> x509_cert::Certificate {
        crate::test_util::install_provider();
        let now = SystemTime::now();
        let issued = signer
            .issue(
                "alice",
                &["devs", "ops"],
                now - Duration::from_secs(300),
                now + Duration::from_secs(300),
            )
            .unwrap();
        let authenticator = X509Authenticator::new("signer", &[ca_pem], Duration::from_secs(60)).unwrap();
        let der = <rustls_pki_types::CertificateDer as rustls_pki_types::pem::PemObject>::from_pem_slice(
            issued.cert_pem.as_bytes(),
        )
        .unwrap();
        match authenticator.authenticate(&[der]) {
            crate::outcome::Outcome::Authenticated(identity) => {
                assert_eq!(identity.user.username, "alice");
                assert_eq!(identity.user.groups, ["devs", "ops"]);
            }
            other => panic!("not authenticated: {other:?}"),
        }
        assert!(issued.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(format!("{issued:?}"), "IssuedCertificate { .. }");
        x509_cert::Certificate::from_pem(issued.cert_pem.as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn issued_certificates_carry_the_user_and_every_group() {
        let (cert_pem, key_pem) = ca();
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
        let certificate = issue_and_authenticate(&signer, &cert_pem);
        assert_eq!(certificate.signature_algorithm.oid, rfc5912::ECDSA_WITH_SHA_256);
        assert_eq!(certificate.signature_algorithm.parameters, None);
    }

    #[tokio::test]
    async fn an_rsa_ca_as_kubeadm_makes_it_signs_with_sha256_and_rsa() {
        for key in [RSA_2048, RSA_3072] {
            let (cert_pem, pkcs8_pem) = rsa_ca(key);
            for key_pem in [pkcs8_pem.clone(), pkcs1(&pkcs8_pem)] {
                let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
                let certificate = issue_and_authenticate(&signer, &cert_pem);
                let algorithm = &certificate.signature_algorithm;
                assert_eq!(algorithm.oid, rfc5912::SHA_256_WITH_RSA_ENCRYPTION);
                assert_eq!(algorithm.parameters, Some(Any::null()));
                assert_eq!(certificate.tbs_certificate.signature, *algorithm);
                // The issued key is P-256 whatever the CA's key is.
                assert_eq!(
                    certificate.tbs_certificate.subject_public_key_info.algorithm.oid,
                    rfc5912::ID_EC_PUBLIC_KEY
                );
            }
        }
    }

    #[tokio::test]
    async fn a_p384_ca_signs_with_sha384() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let cert_pem = ca_for(&key);
        for key_pem in [key.serialize_pem(), sec1(&key.serialize_pem())] {
            let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
            let certificate = issue_and_authenticate(&signer, &cert_pem);
            assert_eq!(certificate.signature_algorithm.oid, rfc5912::ECDSA_WITH_SHA_384);
        }
    }

    #[test]
    fn the_certificate_is_for_its_key_for_client_auth_and_for_the_validity_asked() {
        let (cert_pem, key_pem) = ca();
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
        let ca_certificate = x509_cert::Certificate::from_pem(cert_pem.as_bytes()).unwrap();
        let not_before = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        let not_after = not_before + Duration::from_secs(600);
        let issued = signer.issue("bob", &["a"], not_before, not_after).unwrap();
        let certificate = x509_cert::Certificate::from_pem(issued.cert_pem.as_bytes()).unwrap();
        let tbs = &certificate.tbs_certificate;
        assert_eq!(tbs.issuer, ca_certificate.tbs_certificate.subject);
        assert_eq!(tbs.subject.to_string(), "O=a,CN=bob");
        assert_eq!(tbs.validity.not_before.to_system_time(), not_before);
        assert_eq!(tbs.validity.not_after.to_system_time(), not_after);
        // The key handed out is the certificate's.
        let key = SigningKey::from_pkcs8_pem(&issued.key_pem).unwrap();
        let spki = SubjectPublicKeyInfoOwned::from_key(*key.verifying_key()).unwrap();
        assert_eq!(spki, tbs.subject_public_key_info);
        let extended_key_usage = tbs
            .extensions
            .iter()
            .flatten()
            .find(|extension| extension.extn_id == rfc5280::ID_CE_EXT_KEY_USAGE)
            .unwrap();
        let usage = ExtendedKeyUsage::from_der(extended_key_usage.extn_value.as_bytes()).unwrap();
        assert_eq!(usage.0, [rfc5280::ID_KP_CLIENT_AUTH]);
        // Two issues never share a key or a serial number.
        let again = x509_cert::Certificate::from_pem(
            signer
                .issue("bob", &["a"], not_before, not_after)
                .unwrap()
                .cert_pem
                .as_bytes(),
        )
        .unwrap();
        assert_ne!(
            again.tbs_certificate.subject_public_key_info,
            tbs.subject_public_key_info
        );
        assert_ne!(again.tbs_certificate.serial_number, tbs.serial_number);
    }

    #[test]
    fn a_public_point_is_only_read_from_rings_template() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        assert_eq!(
            public_point(pkcs8.as_ref()).unwrap(),
            ring::signature::KeyPair::public_key(&key).as_ref()
        );
        assert!(matches!(
            public_point(&pkcs8.as_ref()[..100]),
            Err(SignerError::Issue(_))
        ));
        assert!(matches!(public_point(&[0; 10]), Err(SignerError::Issue(_))));
    }

    #[test]
    fn sec1_keys_as_pinniped_and_openssl_write_them_sign_too() {
        let (cert_pem, key_pem) = ca();
        let sec1 = sec1(&key_pem);
        assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        // `openssl ecparam -genkey` puts the curve in a block of its own first.
        let with_parameters =
            format!("-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{sec1}");
        for key in [sec1, with_parameters] {
            let signer = ClientCertificateSigner::from_pem(&cert_pem, &key).unwrap();
            let now = SystemTime::now();
            let issued = signer
                .issue("carol", &["x"], now, now + Duration::from_secs(60))
                .unwrap();
            let certificate = x509_cert::Certificate::from_pem(issued.cert_pem.as_bytes()).unwrap();
            let ca_certificate = x509_cert::Certificate::from_pem(cert_pem.as_bytes()).unwrap();
            assert_eq!(
                certificate.tbs_certificate.issuer,
                ca_certificate.tbs_certificate.subject
            );
        }
        // ring's own PKCS#8 (the public key inside) and p256's (without) both read.
        let p256_pkcs8 = SigningKey::from_pkcs8_pem(&key_pem)
            .unwrap()
            .to_pkcs8_pem(LineEnding::LF)
            .unwrap();
        ClientCertificateSigner::from_pem(&cert_pem, &p256_pkcs8).unwrap();
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_and_never_shown() {
        let refused =
            |cert_pem: &str, key_pem: &str| match ClientCertificateSigner::from_pem(cert_pem, key_pem) {
                Err(SignerError::InvalidKey(message)) => {
                    assert!(
                        !message.contains("PRIVATE KEY") && !message.contains("MII"),
                        "{message}"
                    );
                    message
                }
                other => panic!("not refused as an invalid key: {other:?}"),
            };
        let (cert_pem, _) = ca();
        let (_, other_key) = ca();
        let (rsa_cert, rsa_key) = rsa_ca(RSA_2048);
        let (_, other_rsa_key) = rsa_ca(RSA_3072);
        let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let ed25519 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();

        let message = refused(&cert_pem, &other_key);
        assert!(
            message.contains("does not belong to the CA certificate"),
            "{message}"
        );
        refused(&cert_pem, &sec1(&other_key));
        let message = refused(&rsa_cert, &other_rsa_key);
        assert_eq!(message, "it does not belong to the CA certificate");
        refused(&rsa_cert, &pkcs1(&other_rsa_key));
        let message = refused(&cert_pem, &rsa_key);
        assert!(
            message.contains("the CA certificate's key is not RSA"),
            "{message}"
        );
        let message = refused(&rsa_cert, &other_key);
        assert!(
            message.contains("the CA certificate's key is not EC"),
            "{message}"
        );
        // A P-384 key for a P-256 certificate.
        let message = refused(&cert_pem, &p384.serialize_pem());
        assert!(message.contains("another curve"), "{message}");
        let message = refused(&ca_for(&ed25519), &ed25519.serialize_pem());
        assert!(message.contains("only RSA and ECDSA"), "{message}");
        let message = refused(&cert_pem, "not a key");
        assert!(message.contains("no PEM private key"), "{message}");
        let message = refused(&cert_pem, &cert_pem);
        assert!(message.contains("no PEM private key"), "{message}");
        // A PEM block of the right name around garbage.
        let garbage =
            pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, &[0x30, 0x03, 0x02, 0x01, 0x00]).unwrap();
        refused(&rsa_cert, &garbage);
        let garbage =
            pem::encode_string("EC PRIVATE KEY", LineEnding::LF, &[0x30, 0x03, 0x02, 0x01, 0x01]).unwrap();
        refused(&cert_pem, &garbage);
        assert!(matches!(
            ClientCertificateSigner::from_pem("garbage", &other_key),
            Err(SignerError::InvalidCertificate(_))
        ));
    }
}
