//! A small HTTPS client for the two API calls the CLI makes (TokenCredentialRequest and
//! WhoAmIRequest): rustls with ring, HTTP/2 or HTTP/1.1 by ALPN, no redirects, a bounded response.

use std::{sync::Arc, time::Duration};

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

/// The largest response body read.
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;

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

/// Why a request could not be made or answered. Messages name the URL, never a credential.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The CA bundle holds no PEM certificate, or one rustls cannot use.
    #[error("the CA bundle {0}")]
    BadCaBundle(String),
    /// The client certificate or key cannot be used.
    #[error("the client certificate or key {0}")]
    BadClientIdentity(String),
    /// `tls-server-name` is not a DNS name or IP address.
    #[error("the TLS server name {0:?} is not a valid DNS name or IP address")]
    BadServerName(String),
    /// The URL cannot be used.
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
}

/// An answer: status and body.
#[derive(Debug)]
pub struct Response {
    /// The HTTP status.
    pub status: http::StatusCode,
    /// The body (at most [`MAX_RESPONSE_BYTES`]).
    pub body: Bytes,
}

/// An HTTPS client bound to one server.
pub struct HttpsClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: String,
    authorization: Option<http::HeaderValue>,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl HttpsClient {
    /// A client for `base_url` (`https://host[:port][/prefix]`; request paths are appended to
    /// it), with `tls`, sending `authorization` (a full `Authorization` header value, e.g.
    /// `Bearer …`) on every request if given.
    pub fn new(
        base_url: &str,
        tls: &TlsOptions,
        authorization: Option<http::HeaderValue>,
    ) -> Result<Self, HttpError> {
        let uri: http::Uri = base_url
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpError::BadUrl {
                url: base_url.to_string(),
                reason: e.to_string(),
            })?;
        if uri.scheme_str() != Some("https") {
            return Err(HttpError::BadUrl {
                url: base_url.to_string(),
                reason: format!(
                    "the scheme must be https, not {:?}",
                    uri.scheme_str().unwrap_or("")
                ),
            });
        }
        if uri.authority().is_none() {
            return Err(HttpError::BadUrl {
                url: base_url.to_string(),
                reason: "it has no host".into(),
            });
        }
        let config = client_config(tls)?;
        let builder = HttpsConnectorBuilder::new().with_tls_config(config).https_only();
        let builder = match &tls.server_name {
            Some(name) => {
                let name =
                    ServerName::try_from(name.clone()).map_err(|_| HttpError::BadServerName(name.clone()))?;
                builder.with_server_name_resolver(FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        let connector = builder.enable_http1().enable_http2().build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            base: base_url.trim_end_matches('/').to_string(),
            authorization,
        })
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST`s `body` as JSON to `path` and returns the answer, whatever its status. `timeout`
    /// bounds connecting, sending and reading the whole answer; `None` waits indefinitely.
    pub async fn post_json(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<Response, HttpError> {
        let url = self.url(path);
        let answer = self
            .send(
                http::Method::POST,
                &url,
                &[
                    (http::header::CONTENT_TYPE, "application/json".into()),
                    (http::header::ACCEPT, "application/json".into()),
                ],
                body,
                timeout,
            )
            .await?;
        Ok(Response {
            status: answer.status,
            body: answer.body,
        })
    }

    /// Sends one request to `url` (absolute; any https URL, not only this client's base, with
    /// this client's TLS settings and authorization) with `headers` and `body` (empty for none),
    /// and returns the answer whatever its status, headers included. Redirects are not followed.
    /// `timeout` bounds the whole exchange; `None` waits indefinitely. Header values are never
    /// part of an error (they may hold credentials).
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(http::HeaderName, String)],
        body: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<FullResponse, HttpError> {
        let mut request = http::Request::builder().method(method.clone()).uri(url).header(
            http::header::USER_AGENT,
            concat!("selkie/", env!("CARGO_PKG_VERSION")),
        );
        if let Some(authorization) = &self.authorization {
            request = request.header(http::header::AUTHORIZATION, authorization.clone());
        }
        for (name, value) in headers {
            let value = http::HeaderValue::from_str(value).map_err(|_| HttpError::BadUrl {
                url: url.to_string(),
                reason: format!("the {name} header value is not valid in HTTP"),
            })?;
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| HttpError::BadUrl {
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
                })?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| HttpError::Request {
                    method: method.clone(),
                    url: url.to_string(),
                    cause: format!("reading the answer: {e}"),
                })?
                .to_bytes();
            Ok(FullResponse {
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
}

/// An answer with its headers.
#[derive(Debug)]
pub struct FullResponse {
    /// The HTTP status.
    pub status: http::StatusCode,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body (at most [`MAX_RESPONSE_BYTES`]).
    pub body: Bytes,
}

/// An error and its sources on one line, repeated messages dropped (hyper's wrappers often
/// repeat their cause).
pub fn error_chain(error: &dyn std::error::Error) -> String {
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

fn client_config(tls: &TlsOptions) -> Result<ClientConfig, HttpError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::BadCaBundle(format!("cannot be used: {e}")))?;
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
                .map_err(|e| HttpError::BadClientIdentity(format!("is not PEM: {e}")))?;
            if certs.is_empty() {
                return Err(HttpError::BadClientIdentity("holds no certificate".into()));
            }
            let key = PrivateKeyDer::from_pem_slice(&identity.key_pem)
                .map_err(|e| HttpError::BadClientIdentity(format!("holds no usable private key: {e}")))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| HttpError::BadClientIdentity(format!("cannot be used: {e}")))
        }
    }
}

fn root_store(ca_pem: Option<&[u8]>) -> Result<RootCertStore, HttpError> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| HttpError::BadCaBundle(format!("is not PEM: {e}")))?;
            if certs.is_empty() {
                return Err(HttpError::BadCaBundle("holds no certificate".into()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    HttpError::BadCaBundle(format!("holds a certificate rustls cannot use: {e}"))
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
