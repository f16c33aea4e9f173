//! The proxy's complete, immutable configuration. Requests load the current [`Snapshot`] once
//! (wait-free, arc-swap) and keep it until they finish; a new snapshot only affects later
//! requests and connections.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::upstream_gate::ConnectionGate;
use arc_swap::ArcSwapOption;
use http::HeaderValue;
use pingora::{
    upstreams::peer::HttpPeer,
    utils::tls::{CertKey, WrappedX509},
};
use selkie_filters::impersonation::headers::PreparedIdentity;
use selkie_filters::{
    access_review::AccessReviewer, chain::Chain, identity::Identity, issuing::login_api::ConciergeApi,
    x509::X509Authenticator,
};

/// How the proxy authenticates itself to kube-apiserver.
pub enum UpstreamCredential {
    /// A bearer token read from a file (a service-account token), re-read when the file changes.
    TokenFile(TokenFile),
    /// A client certificate.
    ClientCertificate(Arc<CertKey>),
}

impl std::fmt::Debug for UpstreamCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TokenFile(file) => f.debug_tuple("TokenFile").field(&file.path).finish(),
            Self::ClientCertificate(_) => f.write_str("ClientCertificate"),
        }
    }
}

/// A token file and the `Authorization` header built from its current content.
pub struct TokenFile {
    path: PathBuf,
    header: ArcSwapOption<(SystemTime, HeaderValue)>,
}

/// Why a token file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("reading the token file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The file is empty or holds characters a header cannot carry.
    #[error("the token file {0} is empty or holds characters a bearer token cannot have")]
    Invalid(PathBuf),
}

impl TokenFile {
    /// Reads `path` now; fails if it is missing or unusable.
    pub fn open(path: PathBuf) -> Result<Self, TokenFileError> {
        let file = Self {
            path,
            header: ArcSwapOption::empty(),
        };
        file.refresh()?;
        Ok(file)
    }

    /// Re-reads the file if its modification time changed. A failed re-read keeps the previous
    /// token (and is reported), so a file being rewritten never leaves the proxy without one.
    pub fn refresh(&self) -> Result<(), TokenFileError> {
        let read_error = |error| TokenFileError::Read {
            path: self.path.clone(),
            error,
        };
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .map_err(read_error)?;
        if self
            .header
            .load()
            .as_ref()
            .is_some_and(|current| current.0 == modified)
        {
            return Ok(());
        }
        let token = std::fs::read_to_string(&self.path).map_err(read_error)?;
        let token = token.trim();
        let header = (!token.is_empty())
            .then(|| HeaderValue::from_str(&format!("Bearer {token}")).ok())
            .flatten()
            .ok_or_else(|| TokenFileError::Invalid(self.path.clone()))?;
        let mut header = header;
        header.set_sensitive(true);
        self.header.store(Some(Arc::new((modified, header))));
        Ok(())
    }

    /// The current `Authorization` header value.
    pub fn header(&self) -> Option<HeaderValue> {
        self.header.load().as_ref().map(|current| current.1.clone())
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
    /// Deadline for connecting.
    pub connect_timeout: Duration,
    /// HTTP/2 streams per connection before another connection is opened (kube-apiserver allows
    /// 250 by default).
    pub max_h2_streams: usize,
    /// HTTP/2 keep-alive pings (they also keep idle watches alive through middleboxes).
    pub h2_ping_interval: Duration,
    /// SubjectAccessReviews for nested impersonation, sent with the proxy's own credential.
    pub access_reviewer: AccessReviewer,
    /// Stream accounting of the HTTP/2 connections made with the proxy's own credential, so that
    /// a burst of requests opens connections one at a time ([`crate::upstream_gate`]). Must be
    /// built with `max_h2_streams`.
    pub gate: Arc<ConnectionGate>,
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
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    /// Writes `contents` and moves the modification time forward, as a kubelet rotation would.
    fn rewrite(path: &std::path::Path, contents: &str, age: Duration) {
        std::fs::write(path, contents).unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() + age).unwrap();
    }

    #[test]
    fn the_token_file_is_reread_when_it_changes_and_a_bad_rewrite_keeps_the_last_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        rewrite(&path, "first\n", Duration::ZERO);
        let file = TokenFile::open(path.clone()).unwrap();
        assert_eq!(file.header().unwrap(), "Bearer first");
        assert!(
            file.header().unwrap().is_sensitive(),
            "never printed by http's Debug"
        );

        rewrite(&path, "second", Duration::from_secs(10));
        file.refresh().unwrap();
        assert_eq!(file.header().unwrap(), "Bearer second");

        rewrite(&path, "  \n", Duration::from_secs(20));
        assert!(matches!(file.refresh(), Err(TokenFileError::Invalid(_))));
        assert_eq!(
            file.header().unwrap(),
            "Bearer second",
            "the previous token stays"
        );

        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.refresh(), Err(TokenFileError::Read { .. })));
        assert_eq!(file.header().unwrap(), "Bearer second");

        assert!(TokenFile::open(dir.path().join("missing")).is_err());
    }
}
