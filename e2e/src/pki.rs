//! Test PKI: certificate authorities, serving certificates and Kubernetes client certificates.
//!
//! CAs and serving certificates come from rcgen. Client certificates come from Selkie's own
//! signer (`selkie_filters::issuing::signer`, on `x509-cert`), the one TokenCredentialRequests use,
//! because Kubernetes reads one group per `O=` attribute and rcgen keeps only one value per
//! attribute type. All keys are ECDSA P-256 except an RSA CA on request
//! ([`CertificateAuthority::new_rsa`], kubeadm's default cluster CA).

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, KeyPair, KeyUsagePurpose,
};
use selkie_filters::issuing::signer::ClientCertificateSigner;
use x509_cert::{der::Decode, name::Name};

use crate::HarnessError;

/// How long issued certificates are valid. Test clusters live minutes; a day leaves room.
const VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// Certificates start this far in the past, so small clock differences do not matter.
const BACKDATE: Duration = Duration::from_secs(300);

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone)]
pub struct CertAndKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    // Never print key material, even in test output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A self-signed certificate authority that can issue serving and client certificates.
pub struct CertificateAuthority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The private key as [`CertificateAuthority::key_pem`] gives it.
    key_pem: String,
    /// Client certificates come from the same signer TokenCredentialRequests use.
    client_signer: ClientCertificateSigner,
    issuer_name: Name,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("subject", &self.issuer_name.to_string())
            .finish()
    }
}

fn pki_err(what: &str) -> impl FnOnce(rcgen::Error) -> HarnessError + '_ {
    move |e| HarnessError::Pki(format!("{what}: {e}"))
}

fn validity_window() -> (SystemTime, SystemTime) {
    let now = SystemTime::now();
    (now - BACKDATE, now + VALIDITY)
}

impl CertificateAuthority {
    /// Generates a new CA with the given common name and a new P-256 key.
    pub fn new(common_name: &str) -> Result<Self, HarnessError> {
        let key = KeyPair::generate().map_err(pki_err("generating a CA key"))?;
        let key_pem = key.serialize_pem();
        Self::with_key(common_name, key, key_pem)
    }

    /// [`CertificateAuthority::new`] valid only until `not_after`: a CA close to its end, as
    /// a long-running cluster's is one day.
    pub fn new_ending_at(common_name: &str, not_after: SystemTime) -> Result<Self, HarnessError> {
        let key = KeyPair::generate().map_err(pki_err("generating a CA key"))?;
        let key_pem = key.serialize_pem();
        Self::with_key_until(common_name, key, key_pem, Some(not_after))
    }

    /// A new CA with the given common name for the harness's RSA-2048 test key (`keys/`; ring
    /// cannot generate RSA keys), its key given in PKCS#1 as kubeadm writes `ca.key`.
    pub fn new_rsa(common_name: &str) -> Result<Self, HarnessError> {
        const RSA_KEY: &str = include_str!("keys/rsa-2048-cluster-ca.pem");
        let key = KeyPair::from_pkcs8_pem_and_sign_algo(RSA_KEY, &rcgen::PKCS_RSA_SHA256)
            .map_err(pki_err("reading the RSA test key"))?;
        let pkcs1 = x509_cert::der::pem::decode_vec(RSA_KEY.as_bytes())
            .map_err(|e| e.to_string())
            .and_then(|(_, der)| {
                let info = pkcs8::PrivateKeyInfo::from_der(&der).map_err(|e| e.to_string())?;
                x509_cert::der::pem::encode_string(
                    "RSA PRIVATE KEY",
                    x509_cert::der::pem::LineEnding::LF,
                    info.private_key,
                )
                .map_err(|e| e.to_string())
            })
            .map_err(|e| HarnessError::Pki(format!("the RSA test key as PKCS#1: {e}")))?;
        Self::with_key(common_name, key, pkcs1)
    }

    fn with_key(common_name: &str, key: KeyPair, key_pem: String) -> Result<Self, HarnessError> {
        Self::with_key_until(common_name, key, key_pem, None)
    }

    /// A CA of `key`, valid until `not_after` (by default for thirty times the harness's
    /// certificate validity).
    fn with_key_until(
        common_name: &str,
        key: KeyPair,
        key_pem: String,
        not_after: Option<SystemTime>,
    ) -> Result<Self, HarnessError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let (not_before, default_end) = validity_window();
        params.not_before = not_before.into();
        params.not_after = not_after.unwrap_or(default_end + VALIDITY * 30).into();
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(pki_err("self-signing the CA"))?;
        let issuer_name = x509_cert::Certificate::from_der(issuer.der())
            .map_err(|e| HarnessError::Pki(format!("parsing the CA certificate: {e}")))?
            .tbs_certificate
            .subject;
        let client_signer = ClientCertificateSigner::from_pem(&issuer.pem(), &key_pem)
            .map_err(|e| HarnessError::Pki(format!("the CA as a client-certificate signer: {e}")))?;
        Ok(Self {
            issuer,
            key_pem,
            client_signer,
            issuer_name,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA private key, PEM: PKCS#8 for P-256, PKCS#1 for RSA. For the cluster client CA this
    /// stands in for the cluster signing key (what kube-controller-manager's
    /// `--cluster-signing-key-file` would hold).
    pub fn key_pem(&self) -> String {
        self.key_pem.clone()
    }

    /// Issues a TLS serving certificate for `sans` (DNS names or IP addresses).
    pub fn issue_serving(&self, common_name: &str, sans: &[&str]) -> Result<CertAndKey, HarnessError> {
        let key = KeyPair::generate().map_err(pki_err("generating a serving key"))?;
        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .map_err(pki_err("serving certificate names"))?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = validity_window();
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki_err("signing a serving certificate"))?;
        Ok(CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Issues a client certificate as Kubernetes reads it: `CN=<user>` and one `O=<group>` per
    /// group, with the clientAuth extended key usage.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey, HarnessError> {
        let (not_before, not_after) = validity_window();
        self.issue_client_with_validity(user, groups, not_before, not_after)
    }

    /// [`CertificateAuthority::issue_client`] valid from `not_before` to `not_after`, which may
    /// both lie in the past (an expired certificate) or in the future (one not yet valid).
    pub fn issue_client_with_validity(
        &self,
        user: &str,
        groups: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<CertAndKey, HarnessError> {
        let issued = self
            .client_signer
            .issue(user, groups, not_before, not_after)
            .map_err(|e| HarnessError::Pki(format!("client certificate: {e}")))?;
        Ok(CertAndKey {
            cert_pem: issued.cert_pem,
            key_pem: issued.key_pem,
        })
    }
}

/// A service-account token signing key pair.
#[derive(Clone)]
pub struct ServiceAccountKey {
    /// The private key, PKCS#8 PEM (`--service-account-signing-key-file`).
    pub private_pem: String,
    /// The public key, SPKI PEM (`--service-account-key-file`).
    pub public_pem: String,
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("public_pem", &self.public_pem)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountKey {
    /// Generates a new ECDSA P-256 key pair.
    pub fn generate() -> Result<Self, HarnessError> {
        let key = KeyPair::generate().map_err(pki_err("generating the service-account key"))?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use x509_cert::der::{oid::db::rfc4519, DecodePem};

    use super::*;

    #[test]
    fn client_certificate_carries_user_and_every_group_in_order() {
        let ca = CertificateAuthority::new("test-ca").unwrap();
        let issued = ca.issue_client("alice", &["devs", "ops"]).unwrap();
        let cert = x509_cert::Certificate::from_pem(issued.cert_pem.as_bytes()).unwrap();
        let subject = &cert.tbs_certificate.subject;
        let values: Vec<(String, String)> = subject
            .0
            .iter()
            .flat_map(|rdn| rdn.0.iter())
            .map(|atv| {
                (
                    atv.oid.to_string(),
                    String::from_utf8_lossy(atv.value.value()).into_owned(),
                )
            })
            .collect();
        assert_eq!(
            values,
            vec![
                (rfc4519::CN.to_string(), "alice".to_string()),
                (rfc4519::O.to_string(), "devs".to_string()),
                (rfc4519::O.to_string(), "ops".to_string()),
            ]
        );
        assert_eq!(cert.tbs_certificate.issuer, ca.issuer_name);
    }

    #[test]
    fn client_certificate_chains_to_its_ca_under_rustls() {
        crate::install_crypto_provider();
        let ca = CertificateAuthority::new("test-ca").unwrap();
        let other = CertificateAuthority::new("other-ca").unwrap();
        let issued = ca.issue_client("alice", &["devs"]).unwrap();
        let verify_with = |root: &CertificateAuthority| {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(pem_to_der(&root.cert_pem())).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder(std::sync::Arc::new(roots))
                .build()
                .unwrap();
            verifier.verify_client_cert(
                &pem_to_der(&issued.cert_pem),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
        };
        assert!(verify_with(&ca).is_ok(), "{:?}", verify_with(&ca));
        assert!(
            verify_with(&other).is_err(),
            "a certificate must not verify under an unrelated CA"
        );
    }

    fn pem_to_der(pem: &str) -> rustls::pki_types::CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }
}
