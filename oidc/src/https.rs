//! The one HTTPS client of Selkie: authenticators reaching webhooks, TokenReview, OIDC discovery
//! and JWKS; the CLI reaching the Concierge, kube-apiserver and issuers; the Supervisor reaching
//! its upstream identity providers.
//!
//! rustls with ring; the configured CA bundle or the system's roots (or, for a kubeconfig's
//! `insecure-skip-tls-verify`, any certificate, handshake signatures still checked); an optional
//! client certificate and fixed server name; HTTP/2 or HTTP/1.1 by ALPN; TCP_NODELAY; pooled
//! connections; no redirects; bounded response bodies. Errors name the method and URL and keep the
//! whole cause chain on one line (the refused connection, the unknown CA), never a header value or
//! a body.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, Weak},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use sha2::Digest as _;

/// A client certificate and its key, PEM.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The certificate chain.
    pub cert_pem: Vec<u8>,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientIdentity(<redacted>)")
    }
}

/// How to make and check the TLS connection.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA bundle to trust; `None` trusts the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Accept any server certificate (a kubeconfig's `insecure-skip-tls-verify`). Signatures
    /// in the handshake are still checked.
    pub insecure_skip_verify: bool,
    /// The name to verify instead of the URL's host (`tls-server-name`).
    pub server_name: Option<String>,
    /// A client certificate to present.
    pub client_identity: Option<ClientIdentity>,
}

/// Why TLS settings cannot be used. Reported when the client is built.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA bundle holds no PEM certificate, or one rustls cannot use.
    #[error("the CA bundle {0}")]
    BadCaBundle(String),
    /// The client certificate or key cannot be used.
    #[error("the client certificate or key {0}")]
    BadClientIdentity(String),
    /// `tls-server-name` is not a DNS name or IP address.
    #[error("the TLS server name {0:?} is not a valid DNS name or IP address")]
    BadServerName(String),
}

/// Why a request got no answer, or not the answer asked for. Messages name the method and the
/// URL, never a header value (it may hold a credential) or a body.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The client's TLS settings cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The URL or a header cannot be sent.
    #[error("{url:?} is not a valid https URL: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// Connecting, the TLS handshake or the exchange failed.
    #[error("{method} {url}: {cause}")]
    Request {
        /// The method.
        method: http::Method,
        /// The URL.
        url: String,
        /// The error and its causes, one line.
        cause: String,
        /// Whether the connection was refused, reset or closed before an answer: a server
        /// restarting or a load balancer's stale backend, which a later attempt may not meet.
        /// A TLS failure (an untrusted certificate), a bad address or a timeout is not.
        connection_lost: bool,
    },
    /// No complete answer within the timeout.
    #[error("{method} {url}: no answer within {timeout:?}")]
    Timeout {
        /// The method.
        method: http::Method,
        /// The URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The body could not be read, or is larger than the limit.
    #[error("{method} {url}: reading the answer failed: {cause}")]
    Body {
        /// The method.
        method: http::Method,
        /// The URL.
        url: String,
        /// What went wrong.
        cause: String,
    },
    /// The answer's status is not 2xx (only from [`Response::success`]).
    #[error("{method} {url} answered {status}")]
    Status {
        /// The method.
        method: http::Method,
        /// The URL.
        url: String,
        /// The status.
        status: http::StatusCode,
    },
}

impl HttpError {
    /// Whether the same request may succeed if sent again at once: the connection was refused,
    /// reset or closed before an answer, or the answer was 429 or a gateway's 502, 503 or 504
    /// (kube-apiserver's aggregation layer, a load balancer, a server starting or stopping).
    /// Every other failure is final: a timeout has spent its time already.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Request { connection_lost, .. } => *connection_lost,
            Self::Status { status, .. } => is_retryable_status(*status),
            _ => false,
        }
    }

    /// The status of a non-2xx answer, if that is what this error is.
    pub fn status(&self) -> Option<http::StatusCode> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// An answer: status, headers and the (bounded) body.
#[derive(Debug)]
pub struct Response {
    /// The method of the request (for error messages).
    pub method: http::Method,
    /// The URL of the request (for error messages).
    pub url: String,
    /// The HTTP status.
    pub status: http::StatusCode,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Response {
    /// The body of a 2xx answer; any other status is [`HttpError::Status`].
    pub fn success(self) -> Result<Bytes, HttpError> {
        if self.status.is_success() {
            Ok(self.body)
        } else {
            Err(HttpError::Status {
                method: self.method,
                url: self.url,
                status: self.status,
            })
        }
    }
}

/// A pooled HTTPS client with fixed TLS settings. Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct HttpsClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpsClient")
    }
}

impl HttpsClient {
    /// A client with `tls`. Fails when the CA bundle, client identity or server name cannot be
    /// used; does no IO. Only `https://` URLs can be requested with it.
    pub fn new(tls: &TlsOptions) -> Result<Self, TlsError> {
        let config = client_config(tls)?;
        let builder = HttpsConnectorBuilder::new().with_tls_config(config).https_only();
        let builder = match &tls.server_name {
            Some(name) => {
                let name =
                    ServerName::try_from(name.clone()).map_err(|_| TlsError::BadServerName(name.clone()))?;
                builder.with_server_name_resolver(FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        // TCP_NODELAY, as Go's clients (kube-apiserver's webhook client included) have it: without
        // it a request written in two segments waits for the peer's delayed ACK (~40 ms on Linux),
        // which every uncached webhook review paid (perf/README.md, SW-miss).
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let connector = builder.enable_http1().enable_http2().wrap_connector(tcp);
        Ok(Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(connector),
        })
    }

    /// Sends one request to `url` (absolute https) with `headers` and `body` (empty for none)
    /// and a `User-Agent` of Selkie's, and returns the answer whatever its status, reading at most
    /// `limit` bytes of body. `timeout` bounds connecting, sending and reading it all; `None` waits
    /// indefinitely. Redirects are not followed.
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(http::HeaderName, http::HeaderValue)],
        body: Bytes,
        limit: usize,
        timeout: Option<Duration>,
    ) -> Result<Response, HttpError> {
        let mut request = http::Request::builder().method(method.clone()).uri(url).header(
            http::header::USER_AGENT,
            concat!("selkie/", env!("CARGO_PKG_VERSION")),
        );
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(body)).map_err(|e| HttpError::BadUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| HttpError::Request {
                    method: method.clone(),
                    url: url.to_string(),
                    cause: error_chain(&e),
                    connection_lost: connection_lost(&e),
                })?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| HttpError::Body {
                    method: method.clone(),
                    url: url.to_string(),
                    cause: error_chain(e.as_ref()),
                })?
                .to_bytes();
            Ok(Response {
                method: method.clone(),
                url: url.to_string(),
                status,
                headers,
                body,
            })
        };
        match timeout {
            Some(timeout) => {
                tokio::time::timeout(timeout, exchange)
                    .await
                    .map_err(|_| HttpError::Timeout {
                        method: method.clone(),
                        url: url.to_string(),
                        timeout,
                    })?
            }
            None => exchange.await,
        }
    }

    /// `GET url` accepting JSON; the body of a 2xx answer of at most `limit` bytes.
    pub async fn get_json(
        &self,
        url: &str,
        limit: usize,
        timeout: Option<Duration>,
    ) -> Result<Bytes, HttpError> {
        self.send(
            http::Method::GET,
            url,
            &[accept_json()],
            Bytes::new(),
            limit,
            timeout,
        )
        .await?
        .success()
    }
}

/// HTTPS clients shared by everyone who asks with the same [`TlsOptions`], so that they share one
/// connection pool: a hundred OIDC identity providers of one issuer with the same CA bundle hold
/// the connections of one client, not of a hundred.
///
/// The contract:
/// * [`SharedClients::get`] with options of the same content (CA bundle bytes, server name,
///   `insecure_skip_verify`, client certificate and key, compared by a SHA-256 fingerprint,
///   [`TlsOptions::fingerprint`]) answers the same client (`Arc::ptr_eq`) for as long as one of
///   its holders keeps it; options that differ in any of these get another client.
/// * Clients are held weakly: once the last holder drops its `Arc` the client and its pool are
///   gone (the next `get` builds a new one), so the clients of deleted or reconfigured users do
///   not linger. Dead entries are pruned whenever a client is built.
/// * A holder whose options change (a rotated CA bundle) asks again and gets the client of
///   its new options; clients are never changed in place.
#[derive(Debug, Default)]
pub struct SharedClients {
    clients: Mutex<HashMap<[u8; 32], Weak<HttpsClient>>>,
}

impl SharedClients {
    /// The client for `tls`: the live one of the same options, else a new one
    /// ([`HttpsClient::new`], which does no IO; its error when the options cannot be used).
    pub fn get(&self, tls: &TlsOptions) -> Result<Arc<HttpsClient>, TlsError> {
        let key = tls.fingerprint();
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(&key).and_then(Weak::upgrade) {
            return Ok(client);
        }
        let client = Arc::new(HttpsClient::new(tls)?);
        clients.retain(|_, client| client.strong_count() > 0);
        clients.insert(key, Arc::downgrade(&client));
        Ok(client)
    }

    /// How many clients are remembered, dead ones not yet pruned included.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl TlsOptions {
    /// SHA-256 of everything in these options (the CA bundle's bytes, `insecure_skip_verify`,
    /// the server name, the client certificate and key), each field length-prefixed so that
    /// no two different options share a fingerprint by accident: equal fingerprints, equal
    /// options. It names the options without revealing them (a client key included), for
    /// caches keyed by them ([`SharedClients`]).
    pub fn fingerprint(&self) -> [u8; 32] {
        // Destructured so that a new field cannot be forgotten here.
        let Self {
            ca_pem,
            insecure_skip_verify,
            server_name,
            client_identity,
        } = self;
        let mut digest = sha2::Sha256::new();
        let mut field = |value: Option<&[u8]>| match value {
            None => digest.update([0]),
            Some(bytes) => {
                digest.update([1]);
                digest.update(u64::try_from(bytes.len()).unwrap_or(u64::MAX).to_be_bytes());
                digest.update(bytes);
            }
        };
        field(ca_pem.as_deref());
        field(Some(&[u8::from(*insecure_skip_verify)]));
        field(server_name.as_deref().map(str::as_bytes));
        field(
            client_identity
                .as_ref()
                .map(|identity| identity.cert_pem.as_slice()),
        );
        field(
            client_identity
                .as_ref()
                .map(|identity| identity.key_pem.as_slice()),
        );
        digest.finalize().into()
    }
}

/// The `Accept: application/json` header.
pub fn accept_json() -> (http::HeaderName, http::HeaderValue) {
    (
        http::header::ACCEPT,
        http::HeaderValue::from_static("application/json"),
    )
}

/// `Content-Type: application/json`.
pub fn content_json() -> (http::HeaderName, http::HeaderValue) {
    (
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    )
}

/// Parses `url` and checks it is `https://` with a host. The error says which.
pub fn https_url(url: &str) -> Result<http::Uri, HttpError> {
    let bad = |reason: String| HttpError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad(format!(
            "the scheme must be https, not {:?}",
            uri.scheme_str().unwrap_or("")
        )));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("it has no host".into()));
    }
    Ok(uri)
}

/// The pauses before a request that may be sent twice is sent again after a failure a moment may
/// cure ([`HttpError::is_retryable`]): about 4 s in all, the time a Service and its load balancers
/// take to forget a killed pod.
pub const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1200),
    Duration::from_millis(1600),
];

/// Runs `attempt`, and again after each of `delays` while `again` says its outcome is a failure
/// a moment may cure and the pause ends before `deadline` (when there is one); returns the last
/// outcome: a success, a failure `again` rejects, or the failure of the last attempt made. Only
/// for requests that may be sent twice.
pub async fn retrying<T, E, Attempt>(
    delays: &[Duration],
    deadline: Option<tokio::time::Instant>,
    again: impl Fn(&Result<T, E>) -> bool,
    mut attempt: impl FnMut() -> Attempt,
) -> Result<T, E>
where
    Attempt: std::future::Future<Output = Result<T, E>>,
{
    let mut delays = delays.iter();
    loop {
        let outcome = attempt().await;
        if !again(&outcome) {
            return outcome;
        }
        match delays.next() {
            Some(delay)
                if deadline.is_none_or(|deadline| tokio::time::Instant::now() + *delay < deadline) =>
            {
                tokio::time::sleep(*delay).await;
            }
            _ => return outcome,
        }
    }
}

/// Whether an answer with `status` says "not now" rather than "no": 429, or a gateway's 502, 503
/// or 504.
pub fn is_retryable_status(status: http::StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// Whether `error` (or a cause of it) is a connection refused, reset, aborted or closed before
/// the whole answer came. TLS errors reach here as `InvalidData` and are not.
fn connection_lost(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::NotConnected
                    | ErrorKind::UnexpectedEof
            ) {
                return true;
            }
            // hyper-rustls wraps the TLS stream's errors in `io::Error::other`, whose `source`
            // skips the wrapped error itself: look inside.
            if let Some(inner) = io.get_ref() {
                current = Some(inner);
                continue;
            }
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            if hyper.is_incomplete_message() || hyper.is_closed() || hyper.is_canceled() {
                return true;
            }
        }
        current = e.source();
    }
    false
}

/// An error and its sources on one line, repeated messages dropped (hyper's wrappers often
/// repeat their cause).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client configuration `tls` describes — the one [`HttpsClient::new`] uses — for
/// Selkie's other TLS clients (LDAP). Fails when the CA bundle or client certificate is unusable.
pub fn client_config(tls: &TlsOptions) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::BadCaBundle(format!("cannot be used: {e}")))?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCertificate(provider)))
    } else {
        builder.with_root_certificates(root_store(tls.ca_pem.as_deref())?)
    };
    match &tls.client_identity {
        None => Ok(builder.with_no_client_auth()),
        Some(identity) => {
            let certs = CertificateDer::pem_slice_iter(&identity.cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::BadClientIdentity(format!("is not PEM: {e}")))?;
            if certs.is_empty() {
                return Err(TlsError::BadClientIdentity("holds no certificate".into()));
            }
            let key = PrivateKeyDer::from_pem_slice(&identity.key_pem)
                .map_err(|e| TlsError::BadClientIdentity(format!("holds no usable private key: {e}")))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| TlsError::BadClientIdentity(format!("cannot be used: {e}")))
        }
    }
}

fn root_store(ca_pem: Option<&[u8]>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::BadCaBundle(format!("is not PEM: {e}")))?;
            if certs.is_empty() {
                return Err(TlsError::BadCaBundle("holds no certificate".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    TlsError::BadCaBundle(format!("holds a certificate rustls cannot use: {e}"))
                })?;
            }
        }
        None => {
            // Unreadable system certificates are skipped, as Go's system pool skips them.
            let native = rustls_native_certs::load_native_certs();
            let (_added, _ignored) = roots.add_parsable_certificates(native.certs);
        }
    }
    Ok(roots)
}

/// `insecure-skip-tls-verify: true`: any certificate is accepted, but the handshake signatures
/// are still verified so the connection is at least to the holder of the presented key.
#[derive(Debug)]
struct AcceptAnyServerCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options with the same content share one client; options that differ in anything get
    /// another; a client nobody holds is gone, and forgotten once another is built.
    #[test]
    fn clients_are_shared_by_the_same_options_and_dropped_with_their_last_holder() {
        let clients = SharedClients::default();
        let insecure = || TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        };
        let named = |name: &str| TlsOptions {
            insecure_skip_verify: true,
            server_name: Some(name.into()),
            ..TlsOptions::default()
        };
        let a = clients.get(&insecure()).unwrap();
        let b = clients.get(&insecure()).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the same options, built apart");
        let c = clients.get(&named("dex.example.com")).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&c, &clients.get(&named("dex.example.com")).unwrap()));
        assert!(!Arc::ptr_eq(
            &c,
            &clients.get(&named("okta.example.com")).unwrap()
        ));

        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "the cache keeps no client alive");
        let d = clients.get(&insecure()).unwrap();
        // `c` and `d` live; the `okta` client died at once and was pruned when `d` was built.
        assert_eq!(clients.remembered(), 2);
        drop(d);
        assert_eq!(clients.remembered(), 2, "pruned only when a client is built");
        drop(c);
        let _e = clients.get(&named("okta.example.com")).unwrap();
        assert_eq!(clients.remembered(), 1);
    }

    /// Unusable options are refused and nothing is remembered for them.
    #[test]
    fn unusable_options_get_no_client() {
        let clients = SharedClients::default();
        let bad = TlsOptions {
            ca_pem: Some(b"not PEM".to_vec()),
            ..TlsOptions::default()
        };
        assert!(matches!(clients.get(&bad), Err(TlsError::BadCaBundle(_))));
        assert_eq!(clients.remembered(), 0);
    }

    /// Every field counts, absent differs from empty, and fields do not run into each other.
    #[test]
    fn the_fingerprint_covers_every_option() {
        let identity = |cert: &[u8], key: &[u8]| {
            Some(ClientIdentity {
                cert_pem: cert.to_vec(),
                key_pem: key.to_vec(),
            })
        };
        let options = [
            TlsOptions::default(),
            TlsOptions {
                ca_pem: Some(Vec::new()),
                ..TlsOptions::default()
            },
            TlsOptions {
                ca_pem: Some(b"ab".to_vec()),
                ..TlsOptions::default()
            },
            TlsOptions {
                ca_pem: Some(b"a".to_vec()),
                server_name: Some("b".into()),
                ..TlsOptions::default()
            },
            TlsOptions {
                insecure_skip_verify: true,
                ..TlsOptions::default()
            },
            TlsOptions {
                server_name: Some(String::new()),
                ..TlsOptions::default()
            },
            TlsOptions {
                client_identity: identity(b"cert", b"key"),
                ..TlsOptions::default()
            },
            TlsOptions {
                client_identity: identity(b"cert", b"other key"),
                ..TlsOptions::default()
            },
            TlsOptions {
                client_identity: identity(b"certkey", b""),
                ..TlsOptions::default()
            },
        ];
        let fingerprints: std::collections::HashSet<[u8; 32]> =
            options.iter().map(TlsOptions::fingerprint).collect();
        assert_eq!(fingerprints.len(), options.len());
        assert_eq!(options[6].fingerprint(), options[6].clone().fingerprint());
    }

    #[tokio::test]
    async fn a_refused_connection_keeps_its_cause() {
        // A port nothing listens on: bind one, note it, close it.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let client = HttpsClient::new(&TlsOptions::default()).unwrap();
        let url = format!("https://127.0.0.1:{port}/keys");
        let error = client
            .get_json(&url, 1024, Some(Duration::from_secs(10)))
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with(&format!("GET {url}: ")), "{text}");
        assert!(text.to_lowercase().contains("connection refused"), "{text}");
        assert!(
            error.is_retryable(),
            "a refused connection may be a restarting server"
        );
    }

    /// A server on a local port that, for each connection, reads a little and then does `answer`
    /// with the socket.
    async fn one_shot_server(answer: &'static [u8]) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buffer = [0u8; 512];
                let _ = socket.read(&mut buffer).await;
                let _ = socket.write_all(answer).await;
                drop(socket);
            }
        });
        format!("https://127.0.0.1:{port}/x")
    }

    #[tokio::test]
    async fn a_connection_closed_before_an_answer_is_retryable_and_a_tls_failure_is_not() {
        let client = HttpsClient::new(&TlsOptions::default()).unwrap();
        let closed = one_shot_server(b"").await;
        let error = client
            .get_json(&closed, 1024, Some(Duration::from_secs(10)))
            .await
            .unwrap_err();
        assert!(matches!(error, HttpError::Request { .. }), "{error}");
        assert!(error.is_retryable(), "{error}");

        // Plain HTTP where TLS is expected: the handshake fails, and so would every retry.
        let not_tls = one_shot_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
        let error = client
            .get_json(&not_tls, 1024, Some(Duration::from_secs(10)))
            .await
            .unwrap_err();
        assert!(matches!(error, HttpError::Request { .. }), "{error}");
        assert!(!error.is_retryable(), "{error}");
    }

    #[test]
    fn only_gateway_answers_and_429_are_retryable_statuses() {
        let status = |code: u16| HttpError::Status {
            method: http::Method::GET,
            url: "https://x.example/".into(),
            status: http::StatusCode::from_u16(code).unwrap(),
        };
        for code in [429, 502, 503, 504] {
            assert!(status(code).is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 500, 501] {
            assert!(!status(code).is_retryable(), "{code}");
        }
        let timeout = HttpError::Timeout {
            method: http::Method::GET,
            url: "https://x.example/".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(!timeout.is_retryable());
    }

    #[test]
    fn bad_tls_settings_and_urls_are_named() {
        let bad_ca = TlsOptions {
            ca_pem: Some(b"not pem".to_vec()),
            ..TlsOptions::default()
        };
        assert!(matches!(HttpsClient::new(&bad_ca), Err(TlsError::BadCaBundle(_))));
        let bad_name = TlsOptions {
            server_name: Some("not a name!".into()),
            ..TlsOptions::default()
        };
        assert!(matches!(
            HttpsClient::new(&bad_name),
            Err(TlsError::BadServerName(_))
        ));
        assert!(https_url("https://issuer.example/x").is_ok());
        for url in ["http://issuer.example", "https://", "::"] {
            assert!(matches!(https_url(url), Err(HttpError::BadUrl { .. })), "{url}");
        }
    }
}
