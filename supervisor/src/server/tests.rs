//! The HTTPS listener's certificate choice: the configured certificate (default or by SNI) when
//! `ServingCert` has one, else Pinniped's bootstrap certificate, whose connections get `/healthz`
//! only.

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{pem::PemObject as _, CertificateDer, ServerName, UnixTime},
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use selkie_kube::{
    certs::{self, CertPair},
    serving::ServingCert,
};

use super::{bind, serve_https};
use crate::clients::Clients;
use crate::endpoints::Endpoints;
use crate::idp::throttle::PasswordThrottle;
use crate::issuer::Issuers;
use crate::server::{audit::Audit, metrics::Metrics};
use crate::session::store::Store;

const BOOTSTRAP_NAME: &str = "pinniped-supervisor-bootstrap-cert";
const INVALID_CONFIGURATION: &str = "pinniped supervisor has invalid TLS serving certificate configuration";
/// The name the test certificates are issued for (with 127.0.0.1).
const HOST: &str = "selkie.example";
const DISCOVERY: &str = "/.well-known/openid-configuration";
const LIFETIME: Duration = Duration::from_secs(3600);

/// A running `serve_https`, stopped when dropped.
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<Result<(), super::ServerError>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves HTTPS with `serving` and endpoints without any FederationDomain (so anything but
/// `/healthz` that reaches them is a 404).
async fn start(serving: Arc<ServingCert>) -> Server {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (store, _memory) = Store::in_memory();
    let endpoints = Arc::new(Endpoints {
        issuers: Arc::new(ArcSwap::from_pointee(Issuers::default())),
        store,
        metrics: Arc::new(Metrics::new()),
        audit: Audit::default(),
        clients: Arc::new(ArcSwap::from_pointee(Clients::default())),
        passwords: PasswordThrottle::new(),
    });
    let task = tokio::spawn(serve_https(listener, serving, endpoints, std::future::pending()));
    Server { addr, task }
}

/// A CA and a serving certificate it issued for [`HOST`] and 127.0.0.1.
fn issued() -> (CertPair, CertPair) {
    let ca = certs::generate_ca("selkie-test-ca", LIFETIME).unwrap();
    let serving = certs::issue_serving(&ca, &[HOST.into(), "127.0.0.1".into()], LIFETIME).unwrap();
    (ca, serving)
}

fn certified(pair: &CertPair) -> rustls::sign::CertifiedKey {
    ServingCert::load(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).unwrap()
}

fn leaf_of(pair: &CertPair) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).unwrap()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any server certificate (still checking the handshake signatures), as a probe that
/// does not verify does.
#[derive(Debug)]
struct AcceptAnything(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnything {
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

/// How the client checks the server's certificate.
enum Trust<'a> {
    Anything,
    Ca(&'a CertPair),
}

/// Which HTTP version the client asks for by ALPN.
#[derive(Clone, Copy)]
enum Version {
    Http1,
    Http2,
}

fn client_config(trust: &Trust<'_>, version: Version) -> ClientConfig {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let mut config = match trust {
        Trust::Anything => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnything(provider)))
            .with_no_client_auth(),
        Trust::Ca(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(leaf_of(ca)).unwrap();
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![match version {
        Version::Http1 => b"http/1.1".to_vec(),
        Version::Http2 => b"h2".to_vec(),
    }];
    config
}

enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

/// An HTTPS connection to the server.
struct Connection {
    /// The certificate the server presented.
    leaf: CertificateDer<'static>,
    sender: Sender,
}

impl Connection {
    /// GETs `path` on this connection: the status and the body.
    async fn get(&mut self, path: &str) -> (StatusCode, String) {
        let response = match &mut self.sender {
            Sender::Http1(sender) => {
                sender.ready().await.unwrap();
                let request = Request::get(path)
                    .header(header::HOST, HOST)
                    .body(Empty::new())
                    .unwrap();
                sender.send_request(request).await.unwrap()
            }
            Sender::Http2(sender) => {
                sender.ready().await.unwrap();
                let request = Request::get(format!("https://{HOST}{path}"))
                    .body(Empty::new())
                    .unwrap();
                sender.send_request(request).await.unwrap()
            }
        };
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }
}

/// Connects to `addr` asking for `name` by SNI (none for an IP address), trusting as `trust` says.
async fn connect(
    addr: SocketAddr,
    name: &str,
    trust: &Trust<'_>,
    version: Version,
) -> std::io::Result<Connection> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(trust, version)));
    let name = ServerName::try_from(name.to_string()).unwrap();
    let tls = connector.connect(name, tcp).await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("the server presented a certificate")
        .clone()
        .into_owned();
    let io = TokioIo::new(tls);
    let sender = match version {
        Version::Http1 => {
            let (sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(connection);
            Sender::Http1(sender)
        }
        Version::Http2 => {
            let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
            tokio::spawn(connection);
            Sender::Http2(sender)
        }
    };
    Ok(Connection { leaf, sender })
}

/// Whether `certificate` names `name` (its CN and SAN hold it as plain ASCII).
fn names(certificate: &CertificateDer<'_>, name: &str) -> bool {
    certificate
        .as_ref()
        .windows(name.len())
        .any(|window| window == name.as_bytes())
}

/// Asserts `connection` got the bootstrap certificate and is limited to `/healthz`.
async fn assert_bootstrap(mut connection: Connection) {
    assert!(
        names(&connection.leaf, BOOTSTRAP_NAME),
        "the server presented a certificate not naming {BOOTSTRAP_NAME}"
    );
    assert_eq!(connection.get("/healthz").await, (StatusCode::OK, "ok".into()));
    for path in [
        DISCOVERY,
        "/some/issuer/.well-known/openid-configuration",
        "/oauth2/token",
        "/",
    ] {
        assert_eq!(
            connection.get(path).await,
            (StatusCode::INTERNAL_SERVER_ERROR, INVALID_CONFIGURATION.into()),
            "{path}"
        );
    }
    // Still served on the same connection afterwards.
    assert_eq!(connection.get("/healthz").await, (StatusCode::OK, "ok".into()));
}

/// Asserts `connection` got `expected` and reaches the endpoints for every path.
async fn assert_configured(mut connection: Connection, expected: &CertificateDer<'_>) {
    assert_eq!(&connection.leaf, expected, "not the configured certificate");
    assert!(!names(&connection.leaf, BOOTSTRAP_NAME));
    assert_eq!(connection.get("/healthz").await, (StatusCode::OK, "ok".into()));
    // No FederationDomain: the endpoints' own 404, not the bootstrap 500.
    assert_eq!(
        connection.get(DISCOVERY).await,
        (StatusCode::NOT_FOUND, "404 page not found".into())
    );
}

#[tokio::test]
async fn without_any_certificate_the_bootstrap_certificate_serves_healthz_only() {
    let server = start(Arc::new(ServingCert::disabled())).await;
    for version in [Version::Http1, Version::Http2] {
        // With SNI, and without (an IP address).
        for name in [HOST, "127.0.0.1"] {
            let connection = connect(server.addr, name, &Trust::Anything, version)
                .await
                .unwrap();
            assert_bootstrap(connection).await;
        }
    }
    // Nobody trusts it.
    let (ca, _) = issued();
    assert!(connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .is_err());
    // Two handshakes get the same bootstrap certificate (generated once, at start).
    let first = connect(server.addr, HOST, &Trust::Anything, Version::Http1)
        .await
        .unwrap();
    let second = connect(server.addr, HOST, &Trust::Anything, Version::Http1)
        .await
        .unwrap();
    assert_eq!(first.leaf, second.leaf);
}

#[tokio::test]
async fn a_default_certificate_is_served_and_reaches_every_path() {
    let (ca, pair) = issued();
    let server = start(Arc::new(ServingCert::new(certified(&pair)))).await;
    for version in [Version::Http1, Version::Http2] {
        // The client verifies the certificate against its CA, with SNI and without.
        for name in [HOST, "127.0.0.1"] {
            let connection = connect(server.addr, name, &Trust::Ca(&ca), version)
                .await
                .unwrap();
            assert_configured(connection, &leaf_of(&pair)).await;
        }
        // A name the certificate does not hold still gets the default certificate, not the
        // bootstrap one.
        let connection = connect(server.addr, "other.example", &Trust::Anything, version)
            .await
            .unwrap();
        assert_configured(connection, &leaf_of(&pair)).await;
    }
}

#[tokio::test]
async fn a_certificate_installed_later_is_used_by_later_handshakes() {
    let serving = Arc::new(ServingCert::disabled());
    let server = start(serving.clone()).await;
    let (ca, pair) = issued();
    let before = connect(server.addr, HOST, &Trust::Anything, Version::Http1)
        .await
        .unwrap();
    assert!(connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .is_err());
    assert_bootstrap(before).await;

    serving.replace(certified(&pair));
    let after = connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .unwrap();
    assert_configured(after, &leaf_of(&pair)).await;

    // And back to the bootstrap certificate once it is removed.
    serving.disable();
    let removed = connect(server.addr, HOST, &Trust::Anything, Version::Http1)
        .await
        .unwrap();
    assert_bootstrap(removed).await;
}

#[tokio::test]
async fn a_certificate_for_an_sni_name_serves_that_name_only() {
    let serving = Arc::new(ServingCert::disabled());
    let (ca, pair) = issued();
    serving.set_names(HashMap::from([(HOST.to_string(), certified(&pair))]));
    let server = start(serving.clone()).await;

    let named = connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .unwrap();
    assert_configured(named, &leaf_of(&pair)).await;
    // Another name, and no SNI: no default certificate, so the bootstrap one.
    for name in ["other.example", "127.0.0.1"] {
        let connection = connect(server.addr, name, &Trust::Anything, Version::Http1)
            .await
            .unwrap();
        assert_bootstrap(connection).await;
    }

    // A default certificate then serves every other name.
    let (_, default) = issued();
    serving.replace(certified(&default));
    let other = connect(server.addr, "other.example", &Trust::Anything, Version::Http1)
        .await
        .unwrap();
    assert_configured(other, &leaf_of(&default)).await;
    let named = connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .unwrap();
    assert_configured(named, &leaf_of(&pair)).await;
}
