//! The impersonation proxy's serving certificate: which names it must carry, whether a stored
//! generated certificate still fits (readable, its key matches, signed by the current serving CA,
//! exactly the desired names — Pinniped's `deleteTLSSecretWhenCertificateDoesNotMatchDesiredState`),
//! and the checks a bring-your-own certificate must pass.

use std::net::IpAddr;

use p256::ecdsa::{signature::Verifier, Signature, VerifyingKey};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use x509_parser::{certificate::X509Certificate, extensions::GeneralName, prelude::FromDer};

/// The name the serving certificate must carry and the endpoint clients are told about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DesiredName {
    /// IP SANs (a ClusterIP Service's addresses, or one address); empty when `hostname` is set.
    pub(crate) ips: Vec<IpAddr>,
    /// The DNS SAN, when the endpoint is a name.
    pub(crate) hostname: Option<String>,
    /// `host[:port]` for `https://…` in the status.
    pub(crate) client_endpoint: String,
}

impl DesiredName {
    /// The SANs to issue, for rcgen (IPs are recognised as IP SANs).
    pub(crate) fn sans(&self) -> Vec<String> {
        match &self.hostname {
            Some(hostname) => vec![hostname.clone()],
            None => self.ips.iter().map(IpAddr::to_string).collect(),
        }
    }
}

fn parse_first_cert(pem: &str) -> Option<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

/// Go's `tls.X509KeyPair` checks: the certificate PEM holds at least one certificate, the key
/// PEM a private key, and the key matches the first certificate. `Err` says which failed.
pub(crate) fn check_key_pair(cert_pem: &str, key_pem: &str) -> Result<(), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls: failed to read certificate PEM data: {e}"))?;
    if chain.is_empty() {
        return Err("tls: failed to find any PEM data in certificate input".into());
    }
    for cert in &chain {
        X509Certificate::from_der(cert).map_err(|e| format!("x509: malformed certificate: {e}"))?;
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|_| "tls: failed to find any PEM data in key input".to_string())?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map(|_| ())
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => "tls: private key does not match public key".to_string(),
            other => format!("tls: failed to parse private key: {other}"),
        })
}

/// The IP and DNS SANs of the first certificate in `pem`.
pub(crate) fn sans(pem: &str) -> Option<(Vec<IpAddr>, Vec<String>)> {
    let der = parse_first_cert(pem)?;
    let (_, cert) = X509Certificate::from_der(&der).ok()?;
    let mut ips = Vec::new();
    let mut dns = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(name) => dns.push(name.to_string()),
                GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => {
                        let octets: [u8; 4] = (*bytes).try_into().ok()?;
                        ips.push(IpAddr::from(octets));
                    }
                    16 => {
                        let octets: [u8; 16] = (*bytes).try_into().ok()?;
                        ips.push(IpAddr::from(octets));
                    }
                    _ => return None,
                },
                _ => {}
            }
        }
    }
    Some((ips, dns))
}

/// Whether the first certificate of `cert_pem` was signed by the P-256 CA `ca_pem` (issuer is
/// the CA's subject and the signature verifies with the CA's key).
fn signed_by(cert_pem: &str, ca_pem: &str) -> bool {
    let (Some(leaf), Some(ca)) = (parse_first_cert(cert_pem), parse_first_cert(ca_pem)) else {
        return false;
    };
    let (Ok((_, leaf)), Ok((_, ca))) = (X509Certificate::from_der(&leaf), X509Certificate::from_der(&ca))
    else {
        return false;
    };
    if leaf.issuer().as_raw() != ca.subject().as_raw() {
        return false;
    }
    let Ok(key) = VerifyingKey::from_sec1_bytes(&ca.public_key().subject_public_key.data) else {
        return false;
    };
    let Ok(signature) = Signature::from_der(&leaf.signature_value.data) else {
        return false;
    };
    key.verify(leaf.tbs_certificate.as_ref(), &signature).is_ok()
}

/// Whether a stored generated serving certificate can stay: readable, its key matches, signed by
/// the current serving CA, and carrying exactly the desired names (Pinniped's
/// `certHostnameAndIPMatchDesiredState`). `desired` is `None` while the endpoint is unknown, and
/// then no certificate fits.
pub(crate) fn generated_cert_fits(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    desired: Option<&DesiredName>,
) -> bool {
    let Some(desired) = desired else {
        return false;
    };
    if check_key_pair(cert_pem, key_pem).is_err() || !signed_by(cert_pem, ca_pem) {
        return false;
    }
    let Some((ips, dns)) = sans(cert_pem) else {
        return false;
    };
    match &desired.hostname {
        Some(hostname) => ips.is_empty() && dns.len() == 1 && dns[0] == *hostname,
        None => dns.is_empty() && !ips.is_empty() && ips == desired.ips,
    }
}

/// Whether `pem` starts with a PEM block that holds a certificate (Go's `pem.Decode` succeeding
/// on a CA bundle).
pub(crate) fn is_pem_certificate(pem: &[u8]) -> bool {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .is_some_and(|c| c.is_ok())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use selkie_kube::certs::{generate_ca, issue_serving};

    const DAY: Duration = Duration::from_secs(86_400);

    fn ip_name(ip: &str) -> DesiredName {
        DesiredName {
            ips: vec![ip.parse().unwrap()],
            hostname: None,
            client_endpoint: ip.into(),
        }
    }

    #[test]
    fn a_generated_certificate_fits_only_its_own_names_and_ca() {
        let ca = generate_ca("Selkie Impersonation Proxy Serving CA", DAY).unwrap();
        let other_ca = generate_ca("Selkie Impersonation Proxy Serving CA", DAY).unwrap();
        let desired = ip_name("10.96.0.10");
        let cert = issue_serving(&ca, &desired.sans(), DAY).unwrap();
        assert!(generated_cert_fits(
            &cert.cert_pem,
            &cert.key_pem,
            &ca.cert_pem,
            Some(&desired)
        ));
        // Not ready, other address, other CA, other key.
        assert!(!generated_cert_fits(
            &cert.cert_pem,
            &cert.key_pem,
            &ca.cert_pem,
            None
        ));
        assert!(!generated_cert_fits(
            &cert.cert_pem,
            &cert.key_pem,
            &ca.cert_pem,
            Some(&ip_name("10.96.0.11"))
        ));
        assert!(!generated_cert_fits(
            &cert.cert_pem,
            &cert.key_pem,
            &other_ca.cert_pem,
            Some(&desired)
        ));
        let other = issue_serving(&ca, &desired.sans(), DAY).unwrap();
        assert!(!generated_cert_fits(
            &cert.cert_pem,
            &other.key_pem,
            &ca.cert_pem,
            Some(&desired)
        ));

        let host = DesiredName {
            ips: vec![],
            hostname: Some("lb.example.com".into()),
            client_endpoint: "lb.example.com".into(),
        };
        let named = issue_serving(&ca, &host.sans(), DAY).unwrap();
        assert!(generated_cert_fits(
            &named.cert_pem,
            &named.key_pem,
            &ca.cert_pem,
            Some(&host)
        ));
        assert!(!generated_cert_fits(
            &named.cert_pem,
            &named.key_pem,
            &ca.cert_pem,
            Some(&desired)
        ));
        assert_eq!(
            sans(&named.cert_pem).unwrap(),
            (vec![], vec!["lb.example.com".to_string()])
        );
    }

    #[test]
    fn key_pairs_are_checked_like_gos_x509_key_pair() {
        let ca = generate_ca("ca", DAY).unwrap();
        let a = issue_serving(&ca, &["a.example.com".into()], DAY).unwrap();
        let b = issue_serving(&ca, &["b.example.com".into()], DAY).unwrap();
        check_key_pair(&a.cert_pem, &a.key_pem).unwrap();
        assert_eq!(
            check_key_pair(&a.cert_pem, &b.key_pem).unwrap_err(),
            "tls: private key does not match public key"
        );
        assert_eq!(
            check_key_pair("nothing", &a.key_pem).unwrap_err(),
            "tls: failed to find any PEM data in certificate input"
        );
        assert_eq!(
            check_key_pair(&a.cert_pem, "nothing").unwrap_err(),
            "tls: failed to find any PEM data in key input"
        );
        assert!(is_pem_certificate(ca.cert_pem.as_bytes()));
        assert!(!is_pem_certificate(b"not pem"));
    }
}
