//! Client certificates: verify the chain, then read the user from the subject the way
//! kube-apiserver does (`CN` is the user name, every `O` is a group).
//!
//! Runs once per TLS connection, not per request: the proxy calls
//! [`X509Authenticator::authenticate`] with the peer's chain after the handshake and keeps the
//! resulting identity for every request on that connection.

use std::{sync::Arc, time::Duration};

use rustls_pki_types::{pem::PemObject, CertificateDer, TrustAnchor, UnixTime};
use webpki::{EndEntityCert, KeyUsage};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{
    identity::{Forwarding, Identity, UserInfo},
    outcome::{Outcome, RejectReason},
};

/// DER value of id-kp-clientAuth (1.3.6.1.5.5.7.3.2).
const ID_KP_CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];

/// Default tolerance for clocks that disagree about a certificate's validity window.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Why an [`X509Authenticator`] cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum X509ConfigError {
    /// A CA bundle holds no certificate, or one that is not a usable trust anchor.
    #[error("CA bundle {index} is invalid: {reason}")]
    InvalidCaBundle {
        /// Which bundle (0-based), in the order given.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// Verifies client certificate chains against one or more CA pools (for example Selkie's signer
/// CA and the cluster's client CA) and maps the subject to a user.
pub struct X509Authenticator {
    name: Arc<str>,
    anchors: Vec<TrustAnchor<'static>>,
    clock_skew: Duration,
}

impl std::fmt::Debug for X509Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("X509Authenticator")
            .field("name", &self.name)
            .field("anchors", &self.anchors.len())
            .field("clock_skew", &self.clock_skew)
            .finish()
    }
}

impl X509Authenticator {
    /// Trusts every certificate in each PEM bundle of `ca_bundles`. Fails if any bundle is empty
    /// or holds something that is not a certificate.
    pub fn new(
        name: impl Into<Arc<str>>,
        ca_bundles: &[&str],
        clock_skew: Duration,
    ) -> Result<Self, X509ConfigError> {
        let mut anchors = Vec::new();
        for (index, bundle) in ca_bundles.iter().enumerate() {
            let invalid = |reason: String| X509ConfigError::InvalidCaBundle { index, reason };
            let before = anchors.len();
            for cert in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
                let cert = cert.map_err(|e| invalid(e.to_string()))?;
                let anchor = webpki::anchor_from_trusted_cert(&cert).map_err(|e| invalid(e.to_string()))?;
                anchors.push(anchor.to_owned());
            }
            if anchors.len() == before {
                return Err(invalid("no PEM certificate found".into()));
            }
        }
        Ok(Self {
            name: name.into(),
            anchors,
            clock_skew,
        })
    }

    /// The configured name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Authenticates the peer chain (leaf first) at the current time; see
    /// [`X509Authenticator::authenticate_at`].
    pub fn authenticate(&self, chain: &[CertificateDer<'_>]) -> Outcome {
        self.authenticate_at(chain, UnixTime::now())
    }

    /// Authenticates the peer chain (leaf first, then intermediates) as of `now`.
    ///
    /// * no certificate: [`Outcome::NotMine`];
    /// * not parseable: `Malformed`;
    /// * expired or not yet valid even allowing the clock skew: `Expired` / `NotYetValid`;
    /// * not issued by a trusted CA, or without the clientAuth extended key usage:
    ///   `UntrustedCertificate`;
    /// * empty, missing or repeated `CN`, or a subject value that is not a string: `EmptyUsername`
    ///   or `Malformed`.
    pub fn authenticate_at(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> Outcome {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Outcome::NotMine;
        };
        if let Err(reason) = self.verify(leaf, intermediates, now) {
            return Outcome::Rejected(reason);
        }
        match user_from_subject(leaf) {
            Ok(user) => Outcome::Authenticated(Arc::new(Identity {
                user,
                authenticator: self.name.clone(),
                audiences: Vec::new(),
                forwarding: Forwarding::Impersonate,
            })),
            Err(reason) => Outcome::Rejected(reason),
        }
    }

    fn verify(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), RejectReason> {
        let cert = EndEntityCert::try_from(leaf).map_err(|_| RejectReason::Malformed)?;
        let algorithms = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all;
        let verify_at = |time: UnixTime| {
            cert.verify_for_usage(
                algorithms,
                &self.anchors,
                intermediates,
                time,
                KeyUsage::required(ID_KP_CLIENT_AUTH),
                None,
                None,
            )
            .map(|_| ())
        };
        let skew = self.clock_skew.as_secs();
        match verify_at(now) {
            Ok(()) => Ok(()),
            Err(webpki::Error::CertExpired { .. }) => {
                let earlier =
                    UnixTime::since_unix_epoch(Duration::from_secs(now.as_secs().saturating_sub(skew)));
                verify_at(earlier).map_err(|e| reason_of(&e))
            }
            Err(webpki::Error::CertNotValidYet { .. }) => {
                let later =
                    UnixTime::since_unix_epoch(Duration::from_secs(now.as_secs().saturating_add(skew)));
                verify_at(later).map_err(|e| reason_of(&e))
            }
            Err(e) => Err(reason_of(&e)),
        }
    }
}

fn reason_of(error: &webpki::Error) -> RejectReason {
    match error {
        webpki::Error::CertExpired { .. } => RejectReason::Expired,
        webpki::Error::CertNotValidYet { .. } => RejectReason::NotYetValid,
        webpki::Error::BadDer | webpki::Error::BadDerTime | webpki::Error::TrailingData(_) => {
            RejectReason::Malformed
        }
        _ => RejectReason::UntrustedCertificate,
    }
}

/// `CN` → user name, every `O` (in order) → a group, as kube-apiserver's x509 authenticator does.
/// A subject with more than one `CN` is refused: which one counts is ambiguous.
fn user_from_subject(leaf: &CertificateDer<'_>) -> Result<UserInfo, RejectReason> {
    let (_, cert) = X509Certificate::from_der(leaf).map_err(|_| RejectReason::Malformed)?;
    let subject = cert.subject();
    let mut common_names = subject.iter_common_name();
    let username = match (common_names.next(), common_names.next()) {
        (Some(cn), None) => cn.as_str().map_err(|_| RejectReason::Malformed)?.to_string(),
        (None, _) => return Err(RejectReason::EmptyUsername),
        (Some(_), Some(_)) => return Err(RejectReason::Malformed),
    };
    if username.is_empty() {
        return Err(RejectReason::EmptyUsername);
    }
    let groups = subject
        .iter_organization()
        .map(|o| {
            o.as_str()
                .map(str::to_string)
                .map_err(|_| RejectReason::Malformed)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(UserInfo {
        username,
        uid: None,
        groups,
        extra: Default::default(),
    })
}

#[cfg(test)]
mod tests;
