//! Client certificates: verify the chain, then read the user from the subject the way
//! kube-apiserver does (`CN` is the user name, every `O` is a group), and name the certificate in
//! the extra [`CREDENTIAL_ID_EXTRA`] as kube-apiserver does since Kubernetes 1.32
//! ([`credential_id`]), so the audit log of a request made through the proxy names the
//! certificate as it would for a request made directly.
//!
//! A verdict is not for ever: [`X509Authenticator::verdict_at`] also says when it must be
//! computed again (the first moment one of the chain's certificates is past its `notAfter`), and
//! [`X509Authenticator::trusts_same_as`] says whether a verdict reached under one set of CA pools
//! holds under another. The proxy and the aggregated API keep one verdict per connection and use
//! both on every request, so a certificate is honoured only while it is valid under the CA pools
//! of the configuration the request runs with, as kube-apiserver checks on every request.
//!
//! The clock skew allowed past `notAfter` (and before `notBefore`) is configurable and zero by
//! default ([`DEFAULT_CLOCK_SKEW`]): kube-apiserver allows none.

use std::{sync::Arc, time::Duration};

use rustls_pki_types::{pem::PemObject, CertificateDer, TrustAnchor, UnixTime};
use webpki::{EndEntityCert, KeyUsage};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{
    identity::{Forwarding, Identity, UserInfo, CREDENTIAL_ID_EXTRA},
    outcome::{Outcome, RejectReason},
};

/// DER value of id-kp-clientAuth (1.3.6.1.5.5.7.3.2).
const ID_KP_CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];

/// Default tolerance for clocks that disagree about a certificate's validity window: none, as
/// kube-apiserver. (Certificates from TokenCredentialRequests are backdated, so `notBefore`
/// needs none; a certificate is refused from the second after its `notAfter`.)
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::ZERO;

/// The largest clock skew a configuration may ask for: a certificate may outlive its `notAfter`
/// by at most this much.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// An [`Outcome`] for a certificate chain and how long it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What the chain is worth.
    pub outcome: Outcome,
    /// From this moment on the outcome no longer holds and the chain must be verified again:
    /// for an authenticated chain, the first second after the earliest `notAfter` (plus the
    /// clock skew) among its certificates; for a certificate not valid yet, the moment it was
    /// computed. `None`: it holds for as long as the trusted CAs stay the same.
    pub recheck_at: Option<UnixTime>,
}

impl Verdict {
    /// Whether the outcome still holds at `now`.
    pub fn holds_at(&self, now: UnixTime) -> bool {
        self.recheck_at.is_none_or(|at| now.as_secs() < at.as_secs())
    }
}

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
    /// The clock skew is over [`MAX_CLOCK_SKEW`].
    #[error("a clock skew of {0:?} is too large (at most 5m)")]
    ClockSkewTooLarge(Duration),
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
    /// Trusts every certificate in each PEM bundle of `ca_bundles`, allowing `clock_skew` around
    /// each certificate's validity window. Fails if any bundle is empty or holds something that is
    /// not a certificate, or if `clock_skew` is over [`MAX_CLOCK_SKEW`].
    pub fn new(
        name: impl Into<Arc<str>>,
        ca_bundles: &[&str],
        clock_skew: Duration,
    ) -> Result<Self, X509ConfigError> {
        if clock_skew > MAX_CLOCK_SKEW {
            return Err(X509ConfigError::ClockSkewTooLarge(clock_skew));
        }
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

    /// Whether a [`Verdict`] of `other` holds under `self`: both trust exactly the same CAs and
    /// allow the same clock skew. Compares the trust anchors (a few hundred bytes each); callers
    /// first check whether they hold the very same authenticator.
    pub fn trusts_same_as(&self, other: &Self) -> bool {
        self.clock_skew == other.clock_skew && self.anchors == other.anchors
    }

    /// [`X509Authenticator::authenticate_at`], and when its outcome stops holding (see
    /// [`Verdict::recheck_at`]).
    pub fn verdict_at(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> Verdict {
        let outcome = self.authenticate_at(chain, now);
        let recheck_at = match &outcome {
            Outcome::Authenticated(_) => Some(self.first_expiry(chain, now)),
            Outcome::Rejected(RejectReason::NotYetValid) => Some(now),
            _ => None,
        };
        Verdict { outcome, recheck_at }
    }

    /// The first second at which one of `chain`'s certificates that is valid at `now` is past its
    /// `notAfter` plus the clock skew. (A presented certificate that is already expired took no
    /// part in a chain that verified at `now`, so it does not count.) Unparsable certificates
    /// count as expiring now, which only makes the caller verify again.
    fn first_expiry(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> UnixTime {
        let skew = self.clock_skew.as_secs();
        let first = chain
            .iter()
            .map(|der| match X509Certificate::from_der(der) {
                Ok((_, cert)) => u64::try_from(cert.validity().not_after.timestamp())
                    .unwrap_or(0)
                    .saturating_add(skew)
                    .saturating_add(1),
                Err(_) => now.as_secs(),
            })
            .filter(|expiry| *expiry > now.as_secs())
            .min()
            .unwrap_or(now.as_secs());
        UnixTime::since_unix_epoch(Duration::from_secs(first))
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
    ///
    /// An authenticated user has no UID and exactly one extra, [`CREDENTIAL_ID_EXTRA`], whose one
    /// value is the leaf's [`credential_id`]. Callers keep the verdict per connection, so the
    /// digest is computed once per connection (again only when the verdict must be recomputed).
    pub fn authenticate_at(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> Outcome {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Outcome::NotMine;
        };
        if let Err(reason) = self.verify(leaf, intermediates, now) {
            return Outcome::Rejected(reason);
        }
        match user_from_subject(leaf) {
            Ok(mut user) => {
                user.extra
                    .insert(CREDENTIAL_ID_EXTRA.to_string(), vec![credential_id(leaf)]);
                Outcome::Authenticated(Arc::new(Identity {
                    user,
                    authenticator: self.name.clone(),
                    audiences: Vec::new(),
                    forwarding: Forwarding::Impersonate,
                }))
            }
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
            Err(webpki::Error::CertExpired { .. }) if skew > 0 => {
                let earlier =
                    UnixTime::since_unix_epoch(Duration::from_secs(now.as_secs().saturating_sub(skew)));
                verify_at(earlier).map_err(|e| reason_of(&e))
            }
            Err(webpki::Error::CertNotValidYet { .. }) if skew > 0 => {
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

/// The credential id kube-apiserver's x509 authenticator gives a client certificate:
/// `X509SHA256=` followed by the lowercase hex SHA-256 of the certificate's DER (the leaf's, not
/// the chain's).
pub fn credential_id(certificate: &CertificateDer<'_>) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = ring::digest::digest(&ring::digest::SHA256, certificate);
    let mut id = String::with_capacity("X509SHA256=".len() + 2 * digest.as_ref().len());
    id.push_str("X509SHA256=");
    for byte in digest.as_ref() {
        id.push(char::from(HEX[usize::from(byte >> 4)]));
        id.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    id
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
