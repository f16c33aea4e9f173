//! The proxy's complete, immutable configuration. Requests load the current [`Snapshot`] once
//! (wait-free, arc-swap) and keep it until they finish; a new snapshot only affects later
//! requests and connections.

use std::{sync::Arc, time::Duration};

use crate::upstream_gate::ConnectionGate;
use http::HeaderValue;
use pingora::{
    upstreams::peer::HttpPeer,
    utils::tls::{CertKey, WrappedX509},
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
pub use selkie_filters::https::{TokenFile, TokenFileError};
use selkie_filters::impersonation::headers::PreparedIdentity;
use selkie_filters::{
    access_review::AccessReviewer, chain::Chain, identity::Identity, issuing::login_api::ConciergeApi,
    tokenreview::TokenReviewAuthenticator, x509::X509Authenticator,
};

/// How the proxy authenticates itself to kube-apiserver.
pub enum UpstreamCredential {
    /// A bearer token read from a file (a service-account token), re-read when the file changes.
    /// Shared with kube-apiserver's TokenReview authenticator ([`Upstream::token_reviewer`]).
    TokenFile(Arc<TokenFile>),
    /// A client certificate.
    ClientCertificate(Arc<CertKey>),
}

impl std::fmt::Debug for UpstreamCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TokenFile(file) => f.debug_tuple("TokenFile").field(&file.path()).finish(),
            Self::ClientCertificate(_) => f.write_str("ClientCertificate"),
        }
    }
}

/// Where and how to reach kube-apiserver.
pub struct Upstream {
    /// kube-apiserver's address.
    pub address: std::net::SocketAddr,
    /// TLS server name to verify.
    pub sni: String,
    /// CAs trusted for kube-apiserver's serving certificate.
    pub ca: Arc<[WrappedX509]>,
    /// The proxy's own credential.
    pub credential: UpstreamCredential,
    /// Deadline for the TCP connection; the TLS handshake after it has [`TLS_HANDSHAKE_TIMEOUT`]
    /// more.
    pub connect_timeout: Duration,
    /// HTTP/2 streams per connection before another connection is opened (kube-apiserver allows
    /// 250 by default).
    pub max_h2_streams: usize,
    /// HTTP/2 keep-alive pings (they also keep idle watches alive through middleboxes).
    pub h2_ping_interval: Duration,
    /// SubjectAccessReviews for nested impersonation, sent with the proxy's own credential.
    pub access_reviewer: AccessReviewer,
    /// kube-apiserver's own TokenReview with the proxy's own credential (`upstream.tokenReview`),
    /// the chain's implicit last authenticator: identities with a UID (service accounts) have
    /// their token passed through. Kept with the upstream so that its result cache outlives
    /// control-plane changes. `None` when turned off.
    pub token_reviewer: Option<Arc<TokenReviewAuthenticator>>,
    /// Stream accounting of the HTTP/2 connections made with the proxy's own credential, so that
    /// a burst of requests opens connections one at a time ([`crate::upstream_gate`]). Must be
    /// built with `max_h2_streams`.
    pub gate: Arc<ConnectionGate>,
    /// The same for the connections of long-lived responses ([`crate::streams`]), which have
    /// a pool of their own. Must be built with `max_h2_streams`.
    pub stream_gate: Arc<ConnectionGate>,
    /// The TLS client configurations of the tunnels' connections ([`crate::tunnels`]), built
    /// from `ca` and `credential`.
    pub tls: UpstreamTls,
}

/// kube-apiserver's TLS client configurations for HTTP/1.1 (the tunnels' connections): with the
/// proxy's client certificate and without it. Built once with their [`Upstream`], so every
/// connection shares the parsed CA and key and the session cache, and resumes kube-apiserver's
/// TLS sessions; a rotated CA or certificate comes with a new `Upstream` and new configurations.
#[derive(Clone)]
pub struct UpstreamTls {
    own: Arc<rustls::ClientConfig>,
    anonymous: Arc<rustls::ClientConfig>,
}

impl UpstreamTls {
    /// Configurations trusting `ca` (TLS 1.2 and 1.3, ALPN `http/1.1`), the first with
    /// `certificate` when there is one. Fails when a CA or the certificate's key is unusable.
    pub fn new(ca: &[WrappedX509], certificate: Option<&CertKey>) -> Result<Self, rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in ca {
            roots.add(CertificateDer::from(cert.borrow_raw_cert().clone()))?;
        }
        let roots = Arc::new(roots);
        let build = |certificate: Option<&CertKey>| {
            let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots.clone());
            let mut config = match certificate {
                Some(certificate) => {
                    let chain = std::iter::once(certificate.leaf())
                        .chain(certificate.intermediates())
                        .map(|cert| CertificateDer::from(cert.borrow_raw_cert().clone()))
                        .collect();
                    let key = PrivateKeyDer::try_from(certificate.key().clone())
                        .map_err(|error| rustls::Error::General(error.into()))?;
                    builder.with_client_auth_cert(chain, key)?
                }
                None => builder.with_no_client_auth(),
            };
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok::<_, rustls::Error>(Arc::new(config))
        };
        let anonymous = build(None)?;
        let own = match certificate {
            Some(_) => build(certificate)?,
            None => anonymous.clone(),
        };
        Ok(Self { own, anonymous })
    }

    /// The configuration with the proxy's own client certificate (when it has one), or without
    /// any when `own_credential` is false (the caller's token passes through).
    pub fn config(&self, own_credential: bool) -> &Arc<rustls::ClientConfig> {
        if own_credential {
            &self.own
        } else {
            &self.anonymous
        }
    }
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("address", &self.address)
            .field("sni", &self.sni)
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

/// How long the TLS handshake with kube-apiserver may take once TCP is connected (Go's
/// `http.Transport` default, which client-go uses).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Upstream {
    /// The proxy's own `Authorization` header for kube-apiserver, when it authenticates with a
    /// token (with a client certificate, the TLS handshake carries the credential).
    pub fn own_authorization(&self) -> Option<HeaderValue> {
        match &self.credential {
            UpstreamCredential::TokenFile(file) => file.header(),
            UpstreamCredential::ClientCertificate(_) => None,
        }
    }

    /// A peer for one request: HTTP/2 with stream multiplexing for ordinary requests, HTTP/1.1
    /// for upgrades (pingora strips `Upgrade` toward an h2 upstream). Upgrades keep their
    /// `Connection` and `Upgrade` headers whatever the protocol: pingora's default forwards only
    /// WebSocket handshakes, and `kubectl exec` also speaks SPDY/3.1. `own_credential` is false
    /// when the caller's token is passed through: kube-apiserver would otherwise authenticate the
    /// proxy's client certificate first and run the request as the proxy.
    pub fn peer(&self, upgrade: bool, own_credential: bool) -> HttpPeer {
        let mut peer = HttpPeer::new(self.address, true, self.sni.clone());
        peer.options.ca = Some(self.ca.clone());
        peer.options.connection_timeout = Some(self.connect_timeout);
        // A kube-apiserver that accepts connections but never answers (stopped, overloaded,
        // black-holed behind a load balancer) must not hold a request in the handshake forever.
        peer.options.total_connection_timeout = Some(self.connect_timeout + TLS_HANDSHAKE_TIMEOUT);
        peer.options.tcp_keepalive = Some(crate::downstream::tcp_keepalive());
        if upgrade {
            peer.options.set_http_version(1, 1);
            peer.options.http_upstream_request_policy.h1_upgrade =
                pingora::upstreams::peer::H1UpgradePolicy::Preserve;
        } else {
            peer.options.set_http_version(2, 1);
            peer.options.max_h2_streams = self.max_h2_streams;
            peer.options.h2_ping_interval = Some(self.h2_ping_interval);
        }
        if let (true, UpstreamCredential::ClientCertificate(cert)) = (own_credential, &self.credential) {
            peer.client_cert_key = Some(cert.clone());
        }
        peer
    }
}

/// Everything a request needs to be authenticated and forwarded.
#[derive(Debug)]
pub struct Snapshot {
    /// Client certificates: the CA pools that make a certificate an identity. `None` means
    /// certificates identify nobody.
    pub client_certificates: Option<Arc<X509Authenticator>>,
    /// Bearer-token authenticators, in order.
    pub chain: Chain,
    /// kube-apiserver.
    pub upstream: Arc<Upstream>,
    /// Who callers without any credential act as (`staticIdentity`); `None` means they are
    /// anonymous and reach only the anonymous paths.
    pub static_identity: Option<Arc<Identity>>,
    /// `static_identity` with its `Impersonate-*` headers built once for this snapshot. Must be
    /// built from `static_identity` (same `Arc`); requests reuse the headers only when the
    /// identity they act as is that very `Arc`, and build them themselves otherwise.
    pub static_prepared: Option<PreparedIdentity>,
    /// When set, the proxy answers TokenCredentialRequest and WhoAmIRequest itself instead of
    /// forwarding them.
    pub concierge_api: Option<Arc<dyn ConciergeApi>>,
    /// Where those two APIs live (they move with the API group suffix); anonymous callers may
    /// reach these paths and no others.
    pub concierge_paths: ConciergePaths,
}

/// The request paths of the Concierge's login and identity APIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConciergePaths {
    /// `POST` here creates a TokenCredentialRequest.
    pub token_credential_requests: String,
    /// `POST` here creates a WhoAmIRequest.
    pub who_am_i_requests: String,
    /// The API group a TokenCredentialRequest's `spec.authenticator.apiGroup` must name
    /// (`authentication.concierge.<suffix>`); any other group names no authenticator.
    pub authenticator_group: String,
}

impl ConciergePaths {
    /// The paths under `suffix` (Pinniped's `apiGroupSuffix`, `pinniped.dev` by default).
    pub fn for_suffix(suffix: &str) -> Self {
        Self {
            token_credential_requests: format!(
                "/apis/login.concierge.{suffix}/v1alpha1/tokencredentialrequests"
            ),
            who_am_i_requests: format!("/apis/identity.concierge.{suffix}/v1alpha1/whoamirequests"),
            authenticator_group: format!("authentication.concierge.{suffix}"),
        }
    }
}

impl Default for ConciergePaths {
    fn default() -> Self {
        Self::for_suffix(selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX)
    }
}

#[cfg(test)]
mod tests;
