//! Issues Kubernetes client certificates: what a TokenCredentialRequest returns.
//!
//! A [`ClientCertificateSigner`] holds a CA certificate and its ECDSA P-256 key. Each
//! [`ClientCertificateSigner::issue`] makes a fresh P-256 key and a certificate with
//! `CN=<user>` and one `O=<group>` RDN per group (how kube-apiserver and the x509 authenticator
//! read groups; rcgen can keep only one `O`, hence `x509-cert`), the clientAuth extended key
//! usage, and the validity asked for.
//!
//! The elliptic-curve work of an issue — the new key pair and the CA's signature — is done by
//! ring (assembly; `perf/results/token-credential-request.md` measured it at about a fifth of
//! the pure-Rust `p256` crate's cost); `x509-cert` encodes the certificate, `p256` only checks
//! the new public key and encodes it as a SubjectPublicKeyInfo.

use std::time::SystemTime;

use p256::{
    ecdsa::{SigningKey, VerifyingKey},
    pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding},
};
use ring::{
    rand::SystemRandom,
    signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING},
};
use x509_cert::{
    attr::AttributeTypeAndValue,
    builder::{Builder, CertificateBuilder, Profile},
    der::{
        asn1::{BitString, SetOfVec, Utf8StringRef},
        oid::db::{rfc4519, rfc5280},
        pem, Any, DecodePem, EncodePem,
    },
    ext::pkix::ExtendedKeyUsage,
    name::{Name, RdnSequence, RelativeDistinguishedName},
    serial_number::SerialNumber,
    spki::SubjectPublicKeyInfoOwned,
    time::{Time, Validity},
};

/// Why a signer cannot be built or a certificate not issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignerError {
    /// The CA certificate is not a PEM X.509 certificate.
    #[error("the signer CA certificate is invalid: {0}")]
    InvalidCertificate(String),
    /// The CA key is not a PKCS#8 ECDSA P-256 key, or does not belong to the certificate.
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
    /// The CA key as `x509-cert`'s builder wants it: it names the signature algorithm and gives
    /// the authority key identifier. It never signs.
    signing_key: SigningKey,
    /// The same key for ring, which signs.
    ring_key: EcdsaKeyPair,
    rng: SystemRandom,
    issuer: Name,
}

impl std::fmt::Debug for ClientCertificateSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificateSigner")
            .field("issuer", &self.issuer.to_string())
            .finish_non_exhaustive()
    }
}

impl ClientCertificateSigner {
    /// Reads the CA certificate (the first PEM block) and its P-256 key, PKCS#8 (`PRIVATE KEY`)
    /// or SEC1 (`EC PRIVATE KEY`, as Pinniped writes its CAs' keys); fails if either is
    /// unreadable or the key is not the certificate's.
    pub fn from_pem(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, SignerError> {
        let certificate = x509_cert::Certificate::from_pem(ca_cert_pem.as_bytes())
            .map_err(|e| SignerError::InvalidCertificate(e.to_string()))?;
        let signing_key = match SigningKey::from_pkcs8_pem(ca_key_pem) {
            Ok(key) => key,
            Err(pkcs8) if ca_key_pem.contains("-----BEGIN EC PRIVATE KEY-----") => {
                p256::SecretKey::from_sec1_pem(ca_key_pem)
                    .map(SigningKey::from)
                    .map_err(|sec1| {
                        SignerError::InvalidKey(format!("not PKCS#8 ({pkcs8}) nor SEC1 ({sec1})"))
                    })?
            }
            Err(pkcs8) => return Err(SignerError::InvalidKey(pkcs8.to_string())),
        };
        let public = SubjectPublicKeyInfoOwned::from_key(*signing_key.verifying_key())
            .map_err(|e| SignerError::InvalidKey(e.to_string()))?;
        if public != certificate.tbs_certificate.subject_public_key_info {
            return Err(SignerError::InvalidKey(
                "it does not belong to the CA certificate".into(),
            ));
        }
        // Re-encoded by p256 so that ring gets the form it requires (the public key included),
        // whatever PKCS#8 producer wrote the file.
        let pkcs8 = signing_key
            .to_pkcs8_der()
            .map_err(|e| SignerError::InvalidKey(e.to_string()))?;
        let rng = SystemRandom::new();
        let ring_key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_bytes(), &rng)
            .map_err(|e| SignerError::InvalidKey(e.to_string()))?;
        Ok(Self {
            signing_key,
            ring_key,
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
            &self.signing_key,
        )
        .map_err(|e| issue("builder")(&e))?;
        builder
            .add_extension(&ExtendedKeyUsage(vec![rfc5280::ID_KP_CLIENT_AUTH]))
            .map_err(|e| issue("extended key usage")(&e))?;
        // What `Builder::build` does, with ring's ECDSA-SHA256 (DER signature) in place of p256's.
        let to_be_signed = builder.finalize().map_err(|e| issue("encoding")(&e))?;
        let signature = self
            .ring_key
            .sign(&self.rng, &to_be_signed)
            .map_err(|e| issue("signing")(&e))?;
        let certificate = builder
            .assemble(BitString::from_bytes(signature.as_ref()).map_err(|e| issue("signing")(&e))?)
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

    use super::*;
    use crate::x509::X509Authenticator;

    fn ca() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "signer");
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn issued_certificates_carry_the_user_and_every_group() {
        crate::test_util::install_provider();
        let (cert_pem, key_pem) = ca();
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
        let now = SystemTime::now();
        let issued = signer
            .issue(
                "alice",
                &["devs", "ops"],
                now - Duration::from_secs(300),
                now + Duration::from_secs(300),
            )
            .unwrap();
        let authenticator =
            X509Authenticator::new("signer", &[cert_pem.as_str()], Duration::from_secs(60)).unwrap();
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
        let usage =
            <ExtendedKeyUsage as x509_cert::der::Decode>::from_der(extended_key_usage.extn_value.as_bytes())
                .unwrap();
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
    fn a_sec1_key_as_pinniped_writes_it_signs_too() {
        let (cert_pem, key_pem) = ca();
        let key = SigningKey::from_pkcs8_pem(&key_pem).unwrap();
        let sec1 = p256::SecretKey::from(&key).to_sec1_pem(LineEnding::LF).unwrap();
        assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &sec1).unwrap();
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
        let (_, other_key) = ca();
        let other_sec1 = p256::SecretKey::from(&SigningKey::from_pkcs8_pem(&other_key).unwrap())
            .to_sec1_pem(LineEnding::LF)
            .unwrap();
        assert!(matches!(
            ClientCertificateSigner::from_pem(&cert_pem, &other_sec1),
            Err(SignerError::InvalidKey(_))
        ));
    }

    #[test]
    fn a_key_from_another_ca_is_refused() {
        let (cert_pem, _) = ca();
        let (_, other_key) = ca();
        assert!(matches!(
            ClientCertificateSigner::from_pem(&cert_pem, &other_key),
            Err(SignerError::InvalidKey(_))
        ));
        assert!(matches!(
            ClientCertificateSigner::from_pem("garbage", &other_key),
            Err(SignerError::InvalidCertificate(_))
        ));
    }
}
