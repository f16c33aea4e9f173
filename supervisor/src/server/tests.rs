//! The HTTPS listener's certificate choice: the configured certificate (default or by SNI) when
//! `ServingCert` has one, else Pinniped's bootstrap certificate, whose connections get `/healthz`
//! only. And the listeners' limits, on real sockets: the connection cap, the idle timeout
//! (HTTP/1.1 and HTTP/2, never cutting a request in flight) and the request-head timeout.

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{
    pki_types::{pem::PemObject as _, CertificateDer, ServerName},
    ClientConfig,
};
use selkie_kube::{
    certs::{self, CertPair},
    serving::ServingCert,
};
use selkie_oidc::https::TlsOptions;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::Instant,
};

use super::{bind, serve, serve_https, Handler};
use crate::clients::Clients;
use crate::endpoints::{text, Endpoints};
use crate::idp::throttle::PasswordThrottle;
use crate::issuer::Issuers;
use crate::server::{
    audit::Audit,
    limits::{Admission, ListenerLimits},
    metrics::{Listener, Metrics},
};
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
    metrics: Arc<Metrics>,
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
    start_limited(serving, ListenerLimits::DEFAULT).await
}

/// [`start`] with `limits`.
async fn start_limited(serving: Arc<ServingCert>, limits: ListenerLimits) -> Server {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (store, _memory) = Store::in_memory();
    let metrics = Arc::new(Metrics::new());
    let endpoints = Arc::new(Endpoints {
        issuers: Arc::new(ArcSwap::from_pointee(Issuers::default())),
        store,
        metrics: metrics.clone(),
        audit: Audit::default(),
        clients: Arc::new(ArcSwap::from_pointee(Clients::default())),
        passwords: PasswordThrottle::new(),
        device_polls: Default::default(),
        dpop_proofs: Default::default(),
        readiness: Default::default(),
    });
    let task = tokio::spawn(serve_https(
        listener,
        serving,
        endpoints,
        limits,
        std::future::pending(),
    ));
    Server { addr, metrics, task }
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

/// The client side of Selkie's own TLS clients (`selkie_oidc::https::client_config`), asking
/// for `version` by ALPN.
fn client_config(trust: &Trust<'_>, version: Version) -> ClientConfig {
    let tls = match trust {
        // As a probe that does not verify: any certificate, handshake signatures still checked.
        Trust::Anything => TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        },
        Trust::Ca(ca) => TlsOptions {
            ca_pem: Some(ca.cert_pem.clone().into_bytes()),
            ..TlsOptions::default()
        },
    };
    let mut config = selkie_oidc::https::client_config(&tls).unwrap();
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
    let tcp = TcpStream::connect(addr).await?;
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

// The listeners' limits.

/// How long `/slow` takes to answer on [`start_plain`]'s listener: several idle timeouts.
const SLOW: Duration = Duration::from_millis(1200);
/// The idle timeout of the idle tests.
const IDLE: Duration = Duration::from_millis(300);
/// How long a test waits for something that should happen at once (the machine is busy).
const PROMPTLY: Duration = Duration::from_secs(3);

/// A running plain-HTTP `serve` answering `ok`, after [`SLOW`] for `/slow`; stopped when dropped.
struct Plain {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Plain {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn slow_or_ok() -> impl Handler {
    |request: Request<Incoming>| async move {
        if request.uri().path() == "/slow" {
            tokio::time::sleep(SLOW).await;
        }
        text(StatusCode::OK, "ok")
    }
}

async fn start_plain(limits: ListenerLimits) -> Plain {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let admission = Admission::new(Listener::http, limits, &Metrics::new());
    let task = tokio::spawn(serve(
        listener,
        None,
        slow_or_ok(),
        admission,
        std::future::pending(),
    ));
    Plain { addr, task }
}

/// Reads `stream` until the server closes it (EOF or reset); how long that took from `since`.
/// Fails if it is still open after `within`.
async fn until_closed(stream: &mut TcpStream, since: Instant, within: Duration) -> Duration {
    let closed = tokio::time::timeout(within, async {
        let mut buffer = [0; 1024];
        while let Ok(1..) = stream.read(&mut buffer).await {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server did not close the connection within {within:?}"
    );
    since.elapsed()
}

/// Awaits `connection` (a client connection's task) ending, the server having closed it; how
/// long that took from `since`. Fails if it is still open after `within`.
async fn until_ended<T>(
    connection: tokio::task::JoinHandle<T>,
    since: Instant,
    within: Duration,
) -> Duration {
    let ended = tokio::time::timeout(within, connection).await;
    assert!(
        ended.is_ok(),
        "the server did not close the connection within {within:?}"
    );
    since.elapsed()
}

/// The value of the sample `name` in `metrics`, if any.
fn sample(metrics: &Metrics, name: &str) -> Option<f64> {
    let text = metrics.encode();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn beyond_max_connections_a_connection_is_closed_at_once_until_one_ends() {
    let (ca, pair) = issued();
    let limits = ListenerLimits {
        max_connections: 3,
        ..ListenerLimits::DEFAULT
    };
    let server = start_limited(Arc::new(ServingCert::new(certified(&pair))), limits).await;
    // Three idle connections: two served (HTTP/2 and HTTP/1.1), one still before its handshake.
    let mut first = connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http2)
        .await
        .unwrap();
    let second = connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .unwrap();
    let _third = TcpStream::connect(server.addr).await.unwrap();

    // The next (accepted after them: the backlog is first in, first out) is closed at once.
    // The reset can come so soon that the connect itself reports it.
    let started = Instant::now();
    if let Ok(mut refused) = TcpStream::connect(server.addr).await {
        until_closed(&mut refused, started, PROMPTLY).await;
    }
    assert!(connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1)
        .await
        .is_err());
    // The admitted ones are still served.
    assert_eq!(first.get("/healthz").await, (StatusCode::OK, "ok".into()));

    // Once one ends, a new connection is served (as soon as the server has seen the close).
    drop(second);
    let deadline = Instant::now() + PROMPTLY;
    let mut admitted = loop {
        match connect(server.addr, HOST, &Trust::Ca(&ca), Version::Http1).await {
            Ok(connection) => break connection,
            Err(error) => {
                assert!(Instant::now() < deadline, "no connection admitted: {error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(admitted.get("/healthz").await, (StatusCode::OK, "ok".into()));

    let refusals = sample(
        &server.metrics,
        "selkie_supervisor_connections_refused_total{listener=\"https\"}",
    )
    .unwrap();
    assert!(refusals >= 2.0, "{refusals}");
    assert_eq!(
        sample(
            &server.metrics,
            "selkie_supervisor_connections_open{listener=\"https\"}"
        ),
        Some(3.0)
    );
}

#[tokio::test]
async fn an_http1_connection_idle_after_a_response_is_closed_but_a_slow_request_is_not_cut() {
    let limits = ListenerLimits {
        idle_timeout: IDLE,
        ..ListenerLimits::DEFAULT
    };
    let server = start_plain(limits).await;
    let http1 = |tcp| async move {
        let (sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
                .await
                .unwrap();
        (sender, tokio::spawn(connection))
    };
    let get = |path: &str| {
        Request::get(path)
            .header(header::HOST, "x")
            .body(Empty::new())
            .unwrap()
    };

    let (mut sender, connection) = http1(TcpStream::connect(server.addr).await.unwrap()).await;
    let response = sender.send_request(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    let idle_since = Instant::now();
    let elapsed = until_ended(connection, idle_since, PROMPTLY + IDLE).await;
    // The server counted from its end of the response, a little before the client's.
    assert!(
        elapsed >= IDLE - Duration::from_millis(100),
        "closed after {elapsed:?}"
    );

    // A request taking several idle timeouts is answered, and its connection kept alive (not
    // being closed once the response is sent), then closed once idle.
    let (mut sender, connection) = http1(TcpStream::connect(server.addr).await.unwrap()).await;
    let started = Instant::now();
    let response = sender.send_request(get("/slow")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response.headers().contains_key(header::CONNECTION));
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "ok");
    assert!(started.elapsed() >= SLOW);
    sender.ready().await.unwrap();
    let response = sender.send_request(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    until_ended(connection, Instant::now(), PROMPTLY + IDLE).await;
}

#[tokio::test]
async fn an_http2_connection_without_streams_is_closed_after_the_idle_timeout() {
    let limits = ListenerLimits {
        idle_timeout: IDLE,
        ..ListenerLimits::DEFAULT
    };
    let server = start_plain(limits).await;
    let http2 = |tcp| async move {
        let (sender, connection) = hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(tcp),
        )
        .await
        .unwrap();
        (sender, tokio::spawn(connection))
    };
    let get = |path: &str| {
        Request::get(format!("http://x{path}"))
            .body(Empty::new())
            .unwrap()
    };

    // No stream ever.
    let started = Instant::now();
    let (_sender, connection) = http2(TcpStream::connect(server.addr).await.unwrap()).await;
    let elapsed = until_ended(connection, started, PROMPTLY + IDLE).await;
    assert!(elapsed >= IDLE, "closed after {elapsed:?}");

    // Two slow streams at once, each longer than the idle timeout: both answered; then none is
    // open and the connection is closed.
    let (sender, connection) = http2(TcpStream::connect(server.addr).await.unwrap()).await;
    let started = Instant::now();
    let streams = [get("/slow"), get("/slow")].map(|request| {
        let mut sender = sender.clone();
        async move {
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.into_body().collect().await.unwrap().to_bytes()
        }
    });
    for body in futures::future::join_all(streams).await {
        assert_eq!(body, "ok");
    }
    assert!(started.elapsed() >= SLOW);
    // Not closing (no GOAWAY was sent while they were in flight): a new stream is served.
    let mut sender = sender;
    let response = sender.send_request(get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    let elapsed = until_ended(connection, Instant::now(), PROMPTLY + IDLE).await;
    assert!(
        elapsed >= IDLE - Duration::from_millis(100),
        "closed after {elapsed:?}"
    );
}

#[tokio::test]
async fn a_stalled_request_head_is_closed_after_the_header_read_timeout_and_silence_after_the_idle_timeout() {
    const HEADER_READ: Duration = Duration::from_millis(300);
    const LONG_IDLE: Duration = Duration::from_secs(3);
    let limits = ListenerLimits {
        header_read_timeout: HEADER_READ,
        idle_timeout: LONG_IDLE,
        ..ListenerLimits::DEFAULT
    };
    let server = start_plain(limits).await;
    // Nothing at all (so no HTTP version yet, and no head is awaited), and the start of HTTP/2's
    // preface then nothing: the idle timeout (checked at the end).
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut preface = TcpStream::connect(server.addr).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let idle_since = Instant::now();

    // Part of a head, then nothing: the header-read timeout, well before the idle one.
    let mut stalled = TcpStream::connect(server.addr).await.unwrap();
    let started = Instant::now();
    stalled.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let elapsed = until_closed(&mut stalled, started, LONG_IDLE).await;
    assert!(
        elapsed >= HEADER_READ && elapsed < LONG_IDLE,
        "closed after {elapsed:?}"
    );

    // A head trickled a byte at a time gets no more time in all.
    let mut trickled = TcpStream::connect(server.addr).await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = trickled.split();
    let trickle = async {
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nUser-Agent: slow\r\n" {
            if writer.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::future::pending::<()>().await;
    };
    let closed = async {
        let mut buffer = [0; 1024];
        while let Ok(1..) = reader.read(&mut buffer).await {}
    };
    tokio::select! {
        () = trickle => unreachable!(),
        () = closed => {}
        () = tokio::time::sleep(LONG_IDLE) => panic!("a trickled head was not cut"),
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= HEADER_READ && elapsed < LONG_IDLE,
        "closed after {elapsed:?}"
    );

    for stream in [&mut silent, &mut preface] {
        let elapsed = until_closed(stream, idle_since, LONG_IDLE + PROMPTLY).await;
        assert!(
            elapsed >= LONG_IDLE - Duration::from_millis(100),
            "closed after {elapsed:?}"
        );
    }
}
