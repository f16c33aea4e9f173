//! Issues Kubernetes client certificates: what a TokenCredentialRequest returns.
//!
//! A [`ClientCertificateSigner`] holds a CA certificate and its ECDSA P-256 key. Each
//! [`ClientCertificateSigner::issue`] makes a fresh P-256 key and a certificate with
//! `CN=<user>` and one `O=<group>` RDN per group (how kube-apiserver and the x509 authenticator
//! read groups; rcgen can keep only one `O`, hence `x509-cert`), the clientAuth extended key
//! usage, and the validity asked for.

use std::time::SystemTime;

use p256::{
    ecdsa::{DerSignature, SigningKey},
    pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding},
};
use x509_cert::{
    attr::AttributeTypeAndValue,
    builder::{Builder, CertificateBuilder, Profile},
    der::{
        asn1::{SetOfVec, Utf8StringRef},
        oid::db::{rfc4519, rfc5280},
        Any, DecodePem, EncodePem,
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
    signing_key: SigningKey,
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
    /// Reads the CA certificate (the first PEM block) and its PKCS#8 P-256 key; fails if either
    /// is unreadable or the key is not the certificate's.
    pub fn from_pem(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, SignerError> {
        let certificate = x509_cert::Certificate::from_pem(ca_cert_pem.as_bytes())
            .map_err(|e| SignerError::InvalidCertificate(e.to_string()))?;
        let signing_key =
            SigningKey::from_pkcs8_pem(ca_key_pem).map_err(|e| SignerError::InvalidKey(e.to_string()))?;
        let public = SubjectPublicKeyInfoOwned::from_key(*signing_key.verifying_key())
            .map_err(|e| SignerError::InvalidKey(e.to_string()))?;
        if public != certificate.tbs_certificate.subject_public_key_info {
            return Err(SignerError::InvalidKey(
                "it does not belong to the CA certificate".into(),
            ));
        }
        Ok(Self {
            signing_key,
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
        let key = SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
        let spki = SubjectPublicKeyInfoOwned::from_key(*key.verifying_key()).map_err(|e| issue("key")(&e))?;
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
        let certificate = builder
            .build::<DerSignature>()
            .map_err(|e| issue("signing")(&e))?;
        Ok(IssuedCertificate {
            cert_pem: certificate
                .to_pem(LineEnding::LF)
                .map_err(|e| issue("encoding")(&e))?,
            key_pem: key
                .to_pkcs8_pem(LineEnding::LF)
                .map_err(|e| issue("encoding the key")(&e))?
                .to_string(),
        })
    }
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
