//! Helpers for unit tests, benches and fuzz targets (feature `test-util`; never in Selkie's
//! binaries): a scripted HTTPS endpoint on loopback, one that never answers, and a CA that signs
//! nothing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test support: a failure is a broken test setup and should panic"
)]

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::{pem::PemObject, PrivateKeyDer};
use serde_json::Value;
use tokio::net::TcpListener;

/// Unit tests build rustls configurations; they need the process-wide provider installed.
pub fn install_provider() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// What the endpoint answers for a request path and JSON body (`Null` when the body is not JSON).
pub type Script = Arc<dyn Fn(&str, &Value) -> (StatusCode, String) + Send + Sync>;

/// A running scripted endpoint.
pub struct Endpoint {
    /// `https://127.0.0.1:<port>`.
    pub base_url: String,
    /// The CA that signed its certificate.
    pub ca_pem: String,
    /// Requests served so far.
    pub hits: Arc<AtomicUsize>,
}

impl Endpoint {
    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// What the endpoint answers for a request path, its headers and its JSON body.
pub type HeaderScript = Arc<dyn Fn(&str, &http::HeaderMap, &Value) -> (StatusCode, String) + Send + Sync>;

/// Starts an HTTPS server on 127.0.0.1 answering every request with `script`.
pub async fn endpoint(script: Script) -> Endpoint {
    endpoint_seeing_headers(Arc::new(move |path, _headers, body| script(path, body))).await
}

/// [`endpoint`], with a script that also sees the request's headers.
pub async fn endpoint_seeing_headers(script: HeaderScript) -> Endpoint {
    install_provider();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, script, counter) = (acceptor.clone(), script.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (script, counter) = (script.clone(), counter.clone());
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let path = request.uri().path().to_string();
                        let headers = request.headers().clone();
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let (status, text) = script(&path, &headers, &body);
                        let mut response = Response::new(Full::new(Bytes::from(text)));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Endpoint {
        base_url,
        ca_pem: ca.pem(),
        hits,
    }
}

/// A PEM CA certificate that signs nothing: for configurations that need some bundle.
pub fn unrelated_ca_pem() -> String {
    rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap()
        .pem()
}

/// `https://127.0.0.1:<port>` of a server that accepts TCP connections and never answers, not
/// even the TLS handshake. It runs until the test's runtime ends.
pub async fn hanging_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    url
}
