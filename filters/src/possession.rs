//! A TLS client-certificate verifier for servers whose trusted client CAs change while they run
//! (the impersonation proxy, the aggregated API): during the handshake it only checks that the
//! client holds the private key of the certificate it presents (the handshake signature), trusting
//! no CA. Whether the chain is trusted is decided afterwards, per connection or per request,
//! against the CA pools current at that moment — so a CA rotation needs no new listener, and an
//! untrusted certificate identifies nobody instead of failing the handshake (the request may still
//! authenticate otherwise, as with kube-apiserver).

use rustls::{
    client::danger::HandshakeSignatureValid,
    crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms},
    pki_types::{CertificateDer, UnixTime},
    server::danger::{ClientCertVerified, ClientCertVerifier},
    DigitallySignedStruct, DistinguishedName, SignatureScheme,
};

/// Asks every client for a certificate (none is required) and accepts any whose private key the
/// client proves it holds. See the module documentation.
#[derive(Debug)]
pub struct PossessionVerifier {
    algorithms: WebPkiSupportedAlgorithms,
}

impl PossessionVerifier {
    /// A verifier using ring's signature algorithms.
    pub fn new() -> Self {
        Self {
            algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }
}

impl Default for PossessionVerifier {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientCertVerifier for PossessionVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: Go clients (kubectl) only send a certificate issued by a hinted CA, or any
    /// certificate when there is no hint.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // The chain is verified after the handshake (see the module documentation).
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
