//! The serving certificate of a TLS listener, replaceable while it runs, chosen by SNI: every
//! server of Selkie (the impersonation proxy, the aggregated APIs, the Supervisor with a
//! certificate per FederationDomain host) resolves its certificate here.
//!
//! A handshake gets the certificate installed for the name it asks for (SNI, case-insensitive),
//! else the default one; with neither, the handshake fails (the server is disabled, or has no
//! certificate yet). Replacing a certificate affects only later handshakes.

use std::{collections::HashMap, sync::Arc};

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};

/// Why a serving certificate could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServingCertError {
    /// The certificate PEM holds no certificate or does not parse.
    #[error("the serving certificate PEM is invalid: {0}")]
    Certificate(String),
    /// The key PEM holds no private key or does not parse.
    #[error("the serving key PEM is invalid: {0}")]
    Key(String),
    /// The key type is not supported or does not match.
    #[error("the serving key cannot be used: {0}")]
    Unusable(String),
}

/// What is served by default, with the PEM it came from (to tell a new certificate from the same
/// one written again).
struct Served {
    cert_pem: Option<Vec<u8>>,
    key: Arc<CertifiedKey>,
}

/// See the module documentation.
#[derive(Default)]
pub struct ServingCert {
    default: ArcSwapOption<Served>,
    /// By lower-cased DNS name.
    by_name: ArcSwap<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("enabled", &self.is_enabled())
            .field("names", &self.by_name.load().len())
            .finish()
    }
}

impl ServingCert {
    /// Parses a PEM chain (leaf first) and its private key, checking they belong together.
    pub fn load(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, ServingCertError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ServingCertError::Certificate(e.to_string()))?;
        if chain.is_empty() {
            return Err(ServingCertError::Certificate("no certificate found".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| ServingCertError::Key(e.to_string()))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| ServingCertError::Unusable(e.to_string()))?;
        let certified = CertifiedKey::new(chain, signing_key);
        certified
            .keys_match()
            .map_err(|e| ServingCertError::Unusable(e.to_string()))?;
        Ok(certified)
    }

    /// Starts with `initial` as the default certificate.
    pub fn new(initial: CertifiedKey) -> Self {
        let serving = Self::default();
        serving.replace(initial);
        serving
    }

    /// Starts disabled: handshakes fail until a certificate is installed.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Replaces the default certificate for every later handshake (and enables serving).
    pub fn replace(&self, next: CertifiedKey) {
        self.default.store(Some(Arc::new(Served {
            cert_pem: None,
            key: Arc::new(next),
        })));
    }

    /// Installs the PEM chain and key as the default certificate unless the same chain is already
    /// served. Returns whether anything changed; fails, keeping the current certificate, when the
    /// PEM cannot be used.
    pub fn replace_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<bool, ServingCertError> {
        if self
            .default
            .load()
            .as_ref()
            .is_some_and(|served| served.cert_pem.as_deref() == Some(cert_pem))
        {
            return Ok(false);
        }
        let key = Self::load(cert_pem, key_pem)?;
        self.default.store(Some(Arc::new(Served {
            cert_pem: Some(cert_pem.to_vec()),
            key: Arc::new(key),
        })));
        Ok(true)
    }

    /// Sets the certificates served by SNI name, replacing the previous set (names are matched
    /// without regard to case).
    pub fn set_names(&self, by_name: HashMap<String, CertifiedKey>) {
        self.by_name.store(Arc::new(
            by_name
                .into_iter()
                .map(|(name, key)| (name.to_ascii_lowercase(), Arc::new(key)))
                .collect(),
        ));
    }

    /// Makes every later handshake without a named certificate fail; connections already open
    /// are not touched.
    pub fn disable(&self) {
        self.default.store(None);
    }

    /// Whether handshakes without a named certificate currently succeed.
    pub fn is_enabled(&self) -> bool {
        self.default.load().is_some()
    }

    /// The certificate a handshake asking for `server_name` gets.
    pub fn resolve_name(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = server_name {
            let by_name = self.by_name.load();
            if !by_name.is_empty() {
                if let Some(key) = by_name.get(&name.to_ascii_lowercase()) {
                    return Some(key.clone());
                }
            }
        }
        self.default.load().as_ref().map(|served| served.key.clone())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.resolve_name(client_hello.server_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn leaf(key: &CertifiedKey) -> Vec<u8> {
        key.cert[0].to_vec()
    }

    #[test]
    fn names_choose_their_certificate_and_others_get_the_default() {
        let (default_cert, default_key) = pair("default.example");
        let (named_cert, named_key) = pair("issuer.example");
        let serving = ServingCert::disabled();
        assert!(serving.resolve_name(Some("issuer.example")).is_none(), "disabled");
        assert!(serving
            .replace_pem(default_cert.as_bytes(), default_key.as_bytes())
            .unwrap());
        assert!(
            !serving
                .replace_pem(default_cert.as_bytes(), default_key.as_bytes())
                .unwrap(),
            "the same chain again changes nothing"
        );
        let named = ServingCert::load(named_cert.as_bytes(), named_key.as_bytes()).unwrap();
        let named_der = leaf(&named);
        serving.set_names(HashMap::from([("Issuer.Example".to_string(), named)]));
        assert_eq!(
            leaf(&serving.resolve_name(Some("issuer.EXAMPLE")).unwrap()),
            named_der
        );
        assert_ne!(
            leaf(&serving.resolve_name(Some("other.example")).unwrap()),
            named_der
        );
        assert_ne!(leaf(&serving.resolve_name(None).unwrap()), named_der);
        serving.disable();
        assert!(serving.resolve_name(None).is_none());
        assert!(
            serving.resolve_name(Some("issuer.example")).is_some(),
            "named certificates stay"
        );
    }

    #[test]
    fn unusable_pem_is_refused_and_keeps_what_is_served() {
        let (cert, key) = pair("a.example");
        let (_, other_key) = pair("b.example");
        let serving = ServingCert::disabled();
        serving.replace_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        assert!(matches!(
            serving.replace_pem(b"junk", key.as_bytes()),
            Err(ServingCertError::Certificate(_))
        ));
        let (cert2, _) = pair("c.example");
        assert!(matches!(
            serving.replace_pem(cert2.as_bytes(), other_key.as_bytes()),
            Err(ServingCertError::Unusable(_))
        ));
        assert!(serving.is_enabled());
    }
}
