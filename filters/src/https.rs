//! The HTTPS client authenticators use to reach webhooks, TokenReview endpoints, OIDC discovery
//! and JWKS: rustls with ring, the configured CA bundle (or the system's roots), an optional client
//! certificate, HTTP/2 or HTTP/1.1 by ALPN, and bounded response bodies.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// How an authenticator proves itself to the service it calls.
#[derive(Clone, Default)]
pub enum ClientAuth {
    /// No credential (Pinniped's WebhookAuthenticator).
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    BearerToken(String),
    /// A TLS client certificate and its private key, both PEM.
    Certificate {
        /// Certificate chain, PEM.
        cert_pem: String,
        /// Private key, PEM.
        key_pem: String,
    },
}

impl std::fmt::Debug for ClientAuth {
    // Credentials never appear in logs or debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClientAuth::None => "None",
            ClientAuth::BearerToken(_) => "BearerToken(<redacted>)",
            ClientAuth::Certificate { .. } => "Certificate(<redacted>)",
        })
    }
}

/// The client type every authenticator holds.
pub(crate) type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why TLS settings cannot be used. Reported at configuration time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// The CA bundle holds no PEM certificate, or one that cannot be parsed.
    #[error("the CA bundle is not valid PEM or holds no certificate: {0}")]
    InvalidCaBundle(String),
    /// The client certificate or key cannot be parsed or do not match.
    #[error("the client certificate or key is invalid: {0}")]
    InvalidClientCertificate(String),
    /// The system's trusted roots cannot be loaded.
    #[error("loading the system's trusted CA certificates failed: {0}")]
    SystemRoots(String),
}

/// Builds a client trusting `ca_bundle_pem` (or, when `None`, the system's roots) and presenting
/// `client_auth`'s certificate if it has one. Only `https://` URLs are allowed.
pub(crate) fn client(
    ca_bundle_pem: Option<&str>,
    client_auth: &ClientAuth,
) -> Result<HttpsClient, TlsConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_bundle_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| TlsConfigError::InvalidCaBundle(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| TlsConfigError::InvalidCaBundle(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(TlsConfigError::InvalidCaBundle("no certificate found".into()));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            if let (Some(error), true) = (native.errors.first(), native.certs.is_empty()) {
                return Err(TlsConfigError::SystemRoots(error.to_string()));
            }
            roots.add_parsable_certificates(native.certs);
        }
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsConfigError::InvalidCaBundle(e.to_string()))?
            .with_root_certificates(roots);
    // ALPN (h2, http/1.1) is set by the connector builder from the enabled protocols.
    let tls = match client_auth {
        ClientAuth::Certificate { cert_pem, key_pem } => {
            let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsConfigError::InvalidClientCertificate(e.to_string()))?;
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                .map_err(|e| TlsConfigError::InvalidClientCertificate(e.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsConfigError::InvalidClientCertificate(e.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    // TCP_NODELAY, as Go's clients (kube-apiserver's webhook client included) have it: without
    // it a request written in two segments waits for the peer's delayed ACK (~40 ms on Linux),
    // which every uncached webhook review paid (perf/README.md, SW-miss).
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector))
}

/// Why a request got no usable answer.
#[derive(Debug)]
pub(crate) enum FetchError {
    /// Connecting or sending failed.
    Transport(String),
    /// The answer's status was not 2xx.
    Status(StatusCode),
    /// The body could not be read or exceeded the limit.
    Body,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport(e) => write!(f, "request failed: {e}"),
            Self::Status(status) => write!(f, "answered {status}"),
            Self::Body => f.write_str("response body unreadable or too large"),
        }
    }
}

/// POSTs the JSON `body` to `uri` (with `authorization` as the `Authorization` header, if any)
/// and reads at most `limit` bytes of a 2xx answer: the one request shape of every Kubernetes
/// review API (TokenReview, SubjectAccessReview).
pub(crate) async fn post_json(
    client: &HttpsClient,
    uri: &http::Uri,
    body: Bytes,
    authorization: Option<&http::HeaderValue>,
    limit: usize,
) -> Result<Bytes, FetchError> {
    let mut request = Request::builder()
        .method(http::Method::POST)
        .uri(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(body))
        .map_err(|e| FetchError::Transport(e.to_string()))?;
    if let Some(value) = authorization {
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, value.clone());
    }
    fetch(client, request, limit).await
}

/// Sends `request` and reads at most `limit` bytes of a 2xx answer.
pub(crate) async fn fetch(
    client: &HttpsClient,
    request: Request<Full<Bytes>>,
    limit: usize,
) -> Result<Bytes, FetchError> {
    let response = client
        .request(request)
        .await
        .map_err(|e| FetchError::Transport(e.to_string()))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|_| FetchError::Body)?;
    if !status.is_success() {
        return Err(FetchError::Status(status));
    }
    Ok(body.to_bytes())
}
