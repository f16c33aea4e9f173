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
//!
//! An RSA CA does not sign each certificate itself: its private-key operation costs ~0.7 ms
//! (fourteen times a P-256 signature), which held one core to ~1,400 credentials a second.
//! It signs a **P-256 intermediate** instead — made in memory, never stored, a CA for client
//! certificates only (`pathLenConstraint` 0, key usage certificate signing, extended key usage
//! clientAuth), valid a day (or as long as the certificate asked for needs), a new one once
//! that is over — and the intermediate signs the certificates. The certificate handed out is the
//! PEM chain: the client certificate, then the intermediate. kube-apiserver takes intermediates
//! from the chain a client presents (Go's x509 verification with the rest of the peer chain as
//! intermediates), so do Selkie's proxy and Go's TLS client send it (`tls.X509KeyPair` keeps every
//! certificate of the PEM); the user's identity is the first certificate's, as before.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

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

/// How long an intermediate of an RSA CA is made to live (unless a certificate asked for needs
/// longer): one RSA signature a day.
const DELEGATE_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How far back an intermediate's validity begins: certificates backdated for clock skew by up
/// to this still fall within it.
const DELEGATE_BACKDATE: Duration = Duration::from_secs(3600);

/// A CA that signs client certificates. See the module documentation.
pub struct ClientCertificateSigner {
    /// The CA of the certificate and key given.
    ca: Ca,
    rng: SystemRandom,
    /// For an RSA CA, the slot of the intermediate that signs in its place (made on first use);
    /// `None` for an ECDSA CA, which signs every certificate itself.
    delegate: Option<Mutex<Option<Arc<Delegate>>>>,
}

/// A CA as the signer uses it.
struct Ca {
    /// The key, for ring to sign with.
    key: CaKey,
    /// The public key and signature algorithm, as `x509-cert`'s builder wants them (it names the
    /// algorithm in the certificate and derives the authority key identifier). It never signs.
    naming: CaNaming,
    /// The CA's subject: the issuer of what it signs.
    name: Name,
}

/// An intermediate CA an RSA CA signed, with its validity and its certificate in PEM.
struct Delegate {
    ca: Ca,
    not_before: SystemTime,
    not_after: SystemTime,
    cert_pem: String,
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
            .field("issuer", &self.ca.name.to_string())
            .field("intermediate", &self.delegate.is_some())
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
        let delegate = matches!(key, CaKey::Rsa(_)).then(|| Mutex::new(None));
        Ok(Self {
            ca: Ca {
                key,
                naming: CaNaming {
                    public: CaPublicKey(spki),
                    algorithm,
                },
                name: certificate.tbs_certificate.subject,
            },
            rng,
            delegate,
        })
    }

    /// Issues a client certificate for `user` in `groups`, valid from `not_before` to
    /// `not_after`, with a new key. With an RSA CA the PEM is the certificate followed by the
    /// intermediate that signed it (see the module documentation), made here when there is none
    /// yet or the one there is does not span the validity asked for.
    pub fn issue(
        &self,
        user: &str,
        groups: &[impl AsRef<str>],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<IssuedCertificate, SignerError> {
        let key = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &self.rng)
            .map_err(|e| issue_error("key", e))?;
        let spki = p256_spki(key.as_ref())?;
        let validity = validity(not_before, not_after)?;
        let subject = client_subject(user, groups)?;
        let delegate = match &self.delegate {
            Some(slot) => Some(self.delegate_spanning(slot, not_before, not_after)?),
            None => None,
        };
        let signer = delegate.as_ref().map_or(&self.ca, |delegate| &delegate.ca);
        let profile = Profile::Leaf {
            issuer: signer.name.clone(),
            enable_key_agreement: false,
            enable_key_encipherment: false,
        };
        let certificate = self.certify(signer, profile, validity, subject, spki)?;
        let mut cert_pem = certificate
            .to_pem(LineEnding::LF)
            .map_err(|e| issue_error("encoding", e))?;
        if let Some(delegate) = delegate {
            // Each PEM block on lines of its own (the encoder ends the last line without one).
            if !cert_pem.ends_with('\n') {
                cert_pem.push('\n');
            }
            cert_pem.push_str(&delegate.cert_pem);
        }
        Ok(IssuedCertificate {
            cert_pem,
            key_pem: pem::encode_string("PRIVATE KEY", LineEnding::LF, key.as_ref())
                .map_err(|e| issue_error("encoding the key", e))?,
        })
    }

    /// The intermediate in `slot` if its validity spans `not_before` to `not_after`; otherwise a
    /// new one that does (and lives [`DELEGATE_LIFETIME`] at least), put in the slot. The slot is
    /// locked meanwhile, so concurrent issues make one intermediate, not one each.
    fn delegate_spanning(
        &self,
        slot: &Mutex<Option<Arc<Delegate>>>,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Arc<Delegate>, SignerError> {
        let mut current = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(delegate) = current
            .as_ref()
            .filter(|delegate| delegate.not_before <= not_before && not_after <= delegate.not_after)
        {
            return Ok(delegate.clone());
        }
        let now = SystemTime::now();
        let from = now.min(not_before);
        let from = from.checked_sub(DELEGATE_BACKDATE).unwrap_or(from);
        let until = now
            .checked_add(DELEGATE_LIFETIME)
            .map_or(not_after, |until| until.max(not_after));
        let delegate = Arc::new(self.new_delegate(from, until)?);
        *current = Some(delegate.clone());
        Ok(delegate)
    }

    /// A new P-256 intermediate, signed by the CA, valid from `not_before` to `not_after`.
    fn new_delegate(&self, not_before: SystemTime, not_after: SystemTime) -> Result<Delegate, SignerError> {
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &self.rng)
            .map_err(|e| issue_error("intermediate key", e))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &self.rng)
            .map_err(|e| issue_error("intermediate key", e))?;
        let spki = p256_spki(pkcs8.as_ref())?;
        let serial = serial_from(&spki)?;
        let tag: String = serial
            .as_bytes()
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = RdnSequence(vec![rdn(
            rfc4519::CN,
            &format!("selkie client certificate intermediate {tag}"),
        )?]);
        let profile = Profile::SubCA {
            issuer: self.ca.name.clone(),
            path_len_constraint: Some(0),
        };
        let certificate = self.certify(
            &self.ca,
            profile,
            validity(not_before, not_after)?,
            name.clone(),
            spki.clone(),
        )?;
        Ok(Delegate {
            ca: Ca {
                key: CaKey::Ecdsa(key),
                naming: CaNaming {
                    public: CaPublicKey(spki),
                    algorithm: AlgorithmIdentifierOwned {
                        oid: rfc5912::ECDSA_WITH_SHA_256,
                        parameters: None,
                    },
                },
                name,
            },
            not_before,
            not_after,
            cert_pem: certificate
                .to_pem(LineEnding::LF)
                .map_err(|e| issue_error("encoding", e))?,
        })
    }

    /// The certificate `ca` signs for `subject`'s key `spki`: `profile`'s extensions and the
    /// clientAuth extended key usage, a serial number from the key.
    fn certify(
        &self,
        ca: &Ca,
        profile: Profile,
        validity: Validity,
        subject: Name,
        spki: SubjectPublicKeyInfoOwned,
    ) -> Result<x509_cert::Certificate, SignerError> {
        let mut builder =
            CertificateBuilder::new(profile, serial_from(&spki)?, validity, subject, spki, &ca.naming)
                .map_err(|e| issue_error("builder", e))?;
        builder
            .add_extension(&ExtendedKeyUsage(vec![rfc5280::ID_KP_CLIENT_AUTH]))
            .map_err(|e| issue_error("extended key usage", e))?;
        // What `Builder::build` does, with ring's signature (DER for ECDSA) in place of a
        // RustCrypto signer's.
        let to_be_signed = builder.finalize().map_err(|e| issue_error("encoding", e))?;
        let signature = match &ca.key {
            CaKey::Ecdsa(ecdsa) => ecdsa
                .sign(&self.rng, &to_be_signed)
                .map(|signature| signature.as_ref().to_vec()),
            CaKey::Rsa(rsa) => {
                let mut signature = vec![0; rsa.public().modulus_len()];
                rsa.sign(&RSA_PKCS1_SHA256, &self.rng, &to_be_signed, &mut signature)
                    .map(|()| signature)
            }
        }
        .map_err(|e| issue_error("signing", e))?;
        builder
            .assemble(BitString::from_bytes(&signature).map_err(|e| issue_error("signing", e))?)
            .map_err(|e| issue_error("signing", e))
    }
}

/// [`SignerError::Issue`] for the step `what` that failed with `error`.
fn issue_error(what: &str, error: impl std::fmt::Display) -> SignerError {
    SignerError::Issue(format!("{what}: {error}"))
}

/// The SubjectPublicKeyInfo of a P-256 key ring generated (its PKCS#8 document).
fn p256_spki(pkcs8: &[u8]) -> Result<SubjectPublicKeyInfoOwned, SignerError> {
    let public = VerifyingKey::from_sec1_bytes(public_point(pkcs8)?).map_err(|e| issue_error("key", e))?;
    SubjectPublicKeyInfoOwned::from_key(public).map_err(|e| issue_error("key", e))
}

/// The validity from `not_before` to `not_after`.
fn validity(not_before: SystemTime, not_after: SystemTime) -> Result<Validity, SignerError> {
    Ok(Validity {
        not_before: Time::try_from(not_before).map_err(|e| issue_error("validity", e))?,
        not_after: Time::try_from(not_after).map_err(|e| issue_error("validity", e))?,
    })
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

/// One RDN: the attribute `oid` with the UTF-8 `value`.
fn rdn(oid: ObjectIdentifier, value: &str) -> Result<RelativeDistinguishedName, SignerError> {
    let value =
        Any::from(Utf8StringRef::new(value).map_err(|e| SignerError::Issue(format!("name {value:?}: {e}")))?);
    SetOfVec::try_from(vec![AttributeTypeAndValue { oid, value }])
        .map(RelativeDistinguishedName::from)
        .map_err(|e| issue_error("name", e))
}

/// `CN=<user>, O=<group>...`, one RDN each, in the order given.
fn client_subject(user: &str, groups: &[impl AsRef<str>]) -> Result<Name, SignerError> {
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
        // The chain as a TLS client presents it: every certificate of the PEM, in order.
        let chain: Vec<_> =
            <rustls_pki_types::CertificateDer as rustls_pki_types::pem::PemObject>::pem_slice_iter(
                issued.cert_pem.as_bytes(),
            )
            .collect::<Result<_, _>>()
            .unwrap();
        match authenticator.authenticate(&chain) {
            crate::outcome::Outcome::Authenticated(identity) => {
                assert_eq!(identity.user.username, "alice");
                assert_eq!(identity.user.groups, ["devs", "ops"]);
            }
            other => panic!("not authenticated: {other:?}"),
        }
        assert!(issued.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(format!("{issued:?}"), "IssuedCertificate { .. }");
        chain_of(&issued.cert_pem).remove(0)
    }

    #[tokio::test]
    async fn issued_certificates_carry_the_user_and_every_group() {
        let (cert_pem, key_pem) = ca();
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
        let certificate = issue_and_authenticate(&signer, &cert_pem);
        assert_eq!(certificate.signature_algorithm.oid, rfc5912::ECDSA_WITH_SHA_256);
        assert_eq!(certificate.signature_algorithm.parameters, None);
    }

    /// Every certificate of a PEM chain, in order.
    fn chain_of(pem: &str) -> Vec<x509_cert::Certificate> {
        <rustls_pki_types::CertificateDer as rustls_pki_types::pem::PemObject>::pem_slice_iter(pem.as_bytes())
            .map(|der| x509_cert::Certificate::from_der(&der.unwrap()).unwrap())
            .collect()
    }

    /// The extension `oid` of `certificate`, decoded.
    fn extension<'a, T: Decode<'a>>(certificate: &'a x509_cert::Certificate, oid: ObjectIdentifier) -> T {
        let extension = certificate
            .tbs_certificate
            .extensions
            .iter()
            .flatten()
            .find(|extension| extension.extn_id == oid)
            .unwrap_or_else(|| panic!("no extension {oid}"));
        T::from_der(extension.extn_value.as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn an_ecdsa_ca_signs_each_certificate_itself() {
        let (cert_pem, key_pem) = ca();
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
        let now = SystemTime::now();
        let issued = signer
            .issue("alice", &["devs"], now, now + Duration::from_secs(60))
            .unwrap();
        assert_eq!(chain_of(&issued.cert_pem).len(), 1);
    }

    /// An RSA CA as kubeadm makes it (PKCS#1 or PKCS#8, 2048 or 3072 bits) signs a P-256
    /// intermediate with SHA-256 and RSA, a CA for client certificates only, and the intermediate
    /// signs the client certificate; the chain handed out verifies to the RSA CA alone.
    #[tokio::test]
    async fn an_rsa_ca_signs_an_intermediate_for_client_certificates_that_signs_them() {
        use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages};
        for key in [RSA_2048, RSA_3072] {
            let (cert_pem, pkcs8_pem) = rsa_ca(key);
            let ca_certificate = x509_cert::Certificate::from_pem(cert_pem.as_bytes()).unwrap();
            for key_pem in [pkcs8_pem.clone(), pkcs1(&pkcs8_pem)] {
                let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
                let leaf = issue_and_authenticate(&signer, &cert_pem);
                let now = SystemTime::now();
                let issued = signer
                    .issue("alice", &["devs"], now, now + Duration::from_secs(60))
                    .unwrap();
                let chain = chain_of(&issued.cert_pem);
                assert_eq!(chain.len(), 2, "the certificate, then the intermediate");
                let intermediate = &chain[1];
                let tbs = &intermediate.tbs_certificate;
                assert_eq!(tbs.issuer, ca_certificate.tbs_certificate.subject);
                let algorithm = &intermediate.signature_algorithm;
                assert_eq!(algorithm.oid, rfc5912::SHA_256_WITH_RSA_ENCRYPTION);
                assert_eq!(algorithm.parameters, Some(Any::null()));
                assert_eq!(tbs.signature, *algorithm);
                assert_eq!(
                    tbs.subject_public_key_info.algorithm.oid,
                    rfc5912::ID_EC_PUBLIC_KEY
                );
                let constraints: BasicConstraints = extension(intermediate, rfc5280::ID_CE_BASIC_CONSTRAINTS);
                assert!(constraints.ca);
                assert_eq!(constraints.path_len_constraint, Some(0));
                let usage: KeyUsage = extension(intermediate, rfc5280::ID_CE_KEY_USAGE);
                assert!(usage.0.contains(KeyUsages::KeyCertSign));
                assert!(!usage.0.contains(KeyUsages::DigitalSignature));
                let extended: ExtendedKeyUsage = extension(intermediate, rfc5280::ID_CE_EXT_KEY_USAGE);
                assert_eq!(extended.0, [rfc5280::ID_KP_CLIENT_AUTH]);
                // The client certificate: the intermediate's, ECDSA with SHA-256, a P-256 key.
                for certificate in [&leaf, &chain[0]] {
                    assert_eq!(certificate.tbs_certificate.issuer, tbs.subject);
                    assert_eq!(certificate.signature_algorithm.oid, rfc5912::ECDSA_WITH_SHA_256);
                    assert_eq!(
                        certificate.tbs_certificate.subject_public_key_info.algorithm.oid,
                        rfc5912::ID_EC_PUBLIC_KEY
                    );
                }
            }
        }
    }

    /// One intermediate serves every certificate its validity spans; a certificate reaching
    /// past it gets a new one, which then serves the others.
    #[test]
    fn an_intermediate_serves_until_a_certificate_reaches_past_it() {
        let (cert_pem, key_pem) = rsa_ca(RSA_2048);
        let signer = ClientCertificateSigner::from_pem(&cert_pem, &key_pem).unwrap();
        let now = SystemTime::now();
        let issue = |from: SystemTime, lifetime: Duration| {
            let issued = signer.issue("bob", &["a"], from, from + lifetime).unwrap();
            chain_of(&issued.cert_pem).remove(1)
        };
        let first = issue(now - Duration::from_secs(300), Duration::from_secs(600));
        let validity = &first.tbs_certificate.validity;
        assert!(validity.not_before.to_system_time() <= now - DELEGATE_BACKDATE);
        assert!(validity.not_after.to_system_time() >= now + DELEGATE_LIFETIME - Duration::from_secs(5));
        assert_eq!(
            issue(now, Duration::from_secs(3600)),
            first,
            "the same intermediate"
        );
        let longer = issue(now, DELEGATE_LIFETIME * 2);
        assert_ne!(longer, first, "a new intermediate for a longer certificate");
        // Certificate times are whole seconds.
        let second = Duration::from_secs(1);
        assert!(
            longer.tbs_certificate.validity.not_after.to_system_time() + second
                >= now + DELEGATE_LIFETIME * 2
        );
        assert_eq!(
            issue(now, Duration::from_secs(600)),
            longer,
            "the new one serves from now on"
        );
        let earlier = issue(now - DELEGATE_BACKDATE * 3, Duration::from_secs(600));
        assert_ne!(
            earlier, longer,
            "a certificate from before the intermediate gets another"
        );
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
