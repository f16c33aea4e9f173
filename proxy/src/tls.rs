//! The listener's TLS: optional client certificates, and what a connection's client certificate
//! is worth, checked on every request. (The serving certificate, replaceable while the proxy runs,
//! is selkie-kube's [`selkie_kube::serving::ServingCert`].)
//!
//! Client certificates are checked in two steps. During the handshake, [`PossessionVerifier`]
//! only checks that the client holds the private key of the certificate it presents (the
//! handshake signature); it trusts no CA, so a CA rotation needs no new listener. Right after the
//! handshake, [`IdentityCallback`] verifies the chain against the CA pools of the *current*
//! snapshot and keeps the chain and that first verdict with the connection
//! ([`PeerCertificate`]). Every request then asks [`PeerCertificate::current`] with the CA pools
//! of the snapshot *it* loaded: the verdict is reused only while it holds (no certificate of the
//! chain past its `notAfter`) and only under the same trusted CAs, and is recomputed otherwise.
//! So a certificate that expires, or whose CA is removed from the configuration, stops counting
//! on connections that are already open, as kube-apiserver checks on every request.
//!
//! A certificate from an unknown CA completes the handshake and identifies nobody; a request
//! that carries no bearer token either is refused (see the service).

use std::{
    any::Any,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::{listeners::TlsAccept, protocols::tls::TlsRef};
use rustls::pki_types::{CertificateDer, UnixTime};
use selkie_filters::{
    outcome::Outcome,
    x509::{Verdict, X509Authenticator},
};

use crate::snapshot::Snapshot;
use selkie_filters::impersonation::headers::PreparedIdentity;

/// A connection's client certificate chain and its latest verdict, kept with the connection
/// (pingora's TLS digest extension) from the handshake on.
#[derive(Debug)]
pub struct PeerCertificate {
    chain: Box<[CertificateDer<'static>]>,
    verified: ArcSwap<Verified>,
    /// Set once a request was refused because the certificate stopped counting: the connection
    /// is to be closed ([`crate::downstream`] ends it).
    revoked: AtomicBool,
}

/// One verdict: under which CA pools it was reached, and (for an identity) its `Impersonate-*`
/// headers, built once.
#[derive(Debug)]
struct Verified {
    trust: Option<Arc<X509Authenticator>>,
    verdict: Verdict,
    prepared: Option<PreparedIdentity>,
}

impl Verified {
    fn new(chain: &[CertificateDer<'static>], trust: Option<&Arc<X509Authenticator>>, now: UnixTime) -> Self {
        let verdict = match trust {
            Some(x509) => x509.verdict_at(chain, now),
            None => Verdict {
                outcome: Outcome::NotMine,
                recheck_at: None,
            },
        };
        let prepared = match &verdict.outcome {
            Outcome::Authenticated(identity) => Some(PreparedIdentity::new(identity.clone())),
            _ => None,
        };
        Self {
            trust: trust.cloned(),
            verdict,
            prepared,
        }
    }

    /// Whether this verdict answers for `trust` at `now`.
    fn answers(&self, trust: Option<&Arc<X509Authenticator>>, now: UnixTime) -> bool {
        let same_trust = match (&self.trust, trust) {
            (None, None) => true,
            (Some(mine), Some(theirs)) => Arc::ptr_eq(mine, theirs) || mine.trusts_same_as(theirs),
            _ => false,
        };
        same_trust && self.verdict.holds_at(now)
    }
}

impl PeerCertificate {
    /// Verifies `chain` (leaf first) under `trust` (the snapshot's client-certificate CA pools;
    /// `None` when certificates identify nobody) as of `now`.
    pub fn verify(
        chain: Box<[CertificateDer<'static>]>,
        trust: Option<&Arc<X509Authenticator>>,
        now: UnixTime,
    ) -> Self {
        let verified = Verified::new(&chain, trust, now);
        Self {
            chain,
            verified: ArcSwap::from_pointee(verified),
            revoked: AtomicBool::new(false),
        }
    }

    /// What the certificate is worth for a request made at `now` with the CA pools `trust`, and
    /// for an identity its prebuilt headers. Reuses the last verdict when it was reached under
    /// the same trusted CAs and still holds (no certificate of the chain expired since);
    /// otherwise verifies the chain again and keeps that verdict for the next requests.
    pub fn current(
        &self,
        trust: Option<&Arc<X509Authenticator>>,
        now: UnixTime,
    ) -> (Outcome, Option<PreparedIdentity>) {
        {
            let verified = self.verified.load();
            if verified.answers(trust, now) {
                return (verified.verdict.outcome.clone(), verified.prepared.clone());
            }
        }
        let verified = Verified::new(&self.chain, trust, now);
        let answer = (verified.verdict.outcome.clone(), verified.prepared.clone());
        self.verified.store(Arc::new(verified));
        answer
    }

    /// Marks the connection for closing: its certificate no longer counts.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// Whether [`PeerCertificate::revoke`] was called.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
}

/// The handshake-time verifier: key possession only; chain trust is decided per connection by
/// [`IdentityCallback`].
pub use selkie_filters::possession::PossessionVerifier;

/// Runs once per connection after the handshake: keeps the client certificate chain, verified
/// with the current snapshot's x509 authenticator, with the connection.
pub struct IdentityCallback {
    snapshot: Arc<ArcSwap<Snapshot>>,
}

impl IdentityCallback {
    /// Reads CA pools from `snapshot` at each handshake.
    pub fn new(snapshot: Arc<ArcSwap<Snapshot>>) -> Self {
        Self { snapshot }
    }
}

#[async_trait]
impl TlsAccept for IdentityCallback {
    async fn handshake_complete_callback(&self, tls: &TlsRef) -> Option<Arc<dyn Any + Send + Sync>> {
        let chain: Box<[CertificateDer<'static>]> = tls
            .peer_cert_chain_der()?
            .iter()
            .map(|der| der.clone().into_owned())
            .collect();
        let snapshot = self.snapshot.load();
        Some(Arc::new(PeerCertificate::verify(
            chain,
            snapshot.client_certificates.as_ref(),
            UnixTime::now(),
        )))
    }
}

#[cfg(test)]
mod tests;
