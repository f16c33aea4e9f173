//! Certificate authorities and certificates the control plane generates (signer CA, serving CAs,
//! serving certificates), all ECDSA P-256 with PKCS#8 keys, as PEM — the form they are stored in
//! Secrets. Generation is rcgen's; client certificates with several groups are issued by
//! `selkie_filters::issuing::signer` instead (rcgen keeps one `O`).

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// How far back a generated certificate's validity starts, for clock skew between replicas and
/// clients (Pinniped backdates the same way).
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// A certificate and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CertPair {
    /// The certificate.
    pub cert_pem: String,
    /// Its PKCS#8 private key.
    pub key_pem: String,
}

impl std::fmt::Debug for CertPair {
    // Key material never appears in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair").finish_non_exhaustive()
    }
}

/// Why a certificate could not be generated or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// rcgen refused the parameters or the key.
    #[error("{what}: {message}")]
    Generate {
        /// What was being made.
        what: &'static str,
        /// rcgen's message.
        message: String,
    },
    /// The PEM is not one readable X.509 certificate.
    #[error("the certificate cannot be read: {0}")]
    Parse(String),
}

fn generate(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |e| CertError::Generate {
        what,
        message: e.to_string(),
    }
}

/// A new self-signed CA named `common_name`, valid from [`BACKDATE`] ago for `lifetime`.
pub fn generate_ca(common_name: &str, lifetime: Duration) -> Result<CertPair, CertError> {
    let key = KeyPair::generate().map_err(generate("generating a CA key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + lifetime).into();
    let issuer = CertifiedIssuer::self_signed(params, key).map_err(generate("self-signing a CA"))?;
    Ok(CertPair {
        cert_pem: issuer.pem(),
        key_pem: issuer.key().serialize_pem(),
    })
}

/// A new serving certificate for `names` (DNS names or IP addresses; the first is also the
/// common name), signed by `ca`, valid from [`BACKDATE`] ago for `lifetime`.
pub fn issue_serving(ca: &CertPair, names: &[String], lifetime: Duration) -> Result<CertPair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(generate("reading the CA key"))?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(generate("reading the CA"))?;
    let key = KeyPair::generate().map_err(generate("generating a serving key"))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(generate("serving certificate names"))?;
    params.distinguished_name = DistinguishedName::new();
    if let Some(first) = names.first() {
        params.distinguished_name.push(DnType::CommonName, first.as_str());
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let now = SystemTime::now();
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + lifetime).into();
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(generate("signing a serving certificate"))?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The validity window of the first certificate in `pem`.
pub fn validity(pem: &str) -> Result<(SystemTime, SystemTime), CertError> {
    let (_, der) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| CertError::Parse(e.to_string()))?;
    let cert = der.parse_x509().map_err(|e| CertError::Parse(e.to_string()))?;
    let at = |time: x509_parser::time::ASN1Time| {
        let seconds = u64::try_from(time.timestamp()).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    };
    Ok((at(cert.validity().not_before), at(cert.validity().not_after)))
}

/// Whether a certificate valid over `window` should be replaced now: once less than `renew_before`
/// of it is left (or it is not yet valid, or already expired).
pub fn needs_renewal(window: (SystemTime, SystemTime), renew_before: Duration) -> bool {
    let now = SystemTime::now();
    now < window.0
        || window
            .1
            .duration_since(now)
            .map_or(true, |left| left < renew_before)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn a_generated_ca_signs_serving_certificates_and_client_certificates() {
        let ca = generate_ca("Selkie Test CA", 365 * DAY).unwrap();
        let (not_before, not_after) = validity(&ca.cert_pem).unwrap();
        assert!(not_before < SystemTime::now() - BACKDATE + Duration::from_secs(5));
        assert!(not_after > SystemTime::now() + 364 * DAY);
        assert!(!needs_renewal((not_before, not_after), 30 * DAY));
        assert!(needs_renewal((not_before, not_after), 366 * DAY));

        let serving = issue_serving(&ca, &["proxy.example.com".into(), "10.0.0.7".into()], DAY).unwrap();
        let (_, der) = x509_parser::pem::parse_x509_pem(serving.cert_pem.as_bytes()).unwrap();
        let cert = der.parse_x509().unwrap();
        let sans = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .len();
        assert_eq!(sans, 2);
        assert!(cert.issuer().to_string().contains("Selkie Test CA"));
    }

    #[test]
    fn unreadable_certificates_are_errors() {
        assert!(matches!(validity("not a pem"), Err(CertError::Parse(_))));
        let ca = generate_ca("x", DAY).unwrap();
        let broken = CertPair {
            cert_pem: ca.cert_pem.clone(),
            key_pem: "garbage".into(),
        };
        assert!(issue_serving(&broken, &["a".into()], DAY).is_err());
    }
}
