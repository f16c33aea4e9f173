//! Upgrades through the impersonation proxy, the way `kubectl exec`, `attach` and `port-forward`
//! use them: client → Selkie's proxy → kube-apiserver (impersonating the caller) → the aggregator
//! → the harness's [`EchoApi`], whose `echoes/exec` subresource accepts WebSocket and SPDY/3.1
//! upgrades and echoes. No kubelet runs in the harness; the echo API stands in for one.
//!
//! The WebSocket side uses a real client (tokio-tungstenite); the SPDY side speaks HTTP/1.1 on a
//! raw TLS connection, so every byte of the handshake is the test's own.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::{api::PostParams, Api};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use selkie_e2e::{
    cluster::FRONT_PROXY_CLIENT_NAME,
    echo_api::{EchoApi, Tunnel, TunnelEnd, Upgrade},
    pki::CertAndKey,
    proxy::{Proxy, PROXY_USER},
    Cluster,
};
use serde_json::Value;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};
use tokio_rustls::{client::TlsStream, TlsConnector};
use tokio_tungstenite::{
    client_async,
    tungstenite::{self, client::IntoClientRequest as _, Message},
    WebSocketStream,
};

/// How long any one step (a connection, a handshake, a round trip, a close) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);
/// How many consecutive upgrades the race test runs (STYLE.md §A.1, pingora issue #946).
const UPGRADES: usize = 1000;
/// The groups in the test user's certificate.
const GROUPS: [&str; 2] = ["exec-team", "readers"];

pub(crate) type Socket = WebSocketStream<TlsStream<TcpStream>>;

/// A client of the proxy: TLS trusting its serving CA, HTTP/1.1 only (upgrades need it), with
/// or without a client certificate from its signer.
struct Client {
    connector: TlsConnector,
    /// `127.0.0.1:<port>`.
    address: String,
}

impl Client {
    fn new(proxy: &Proxy, credential: Option<&CertAndKey>) -> anyhow::Result<Self> {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(
            proxy.serving_ca().cert_pem().as_bytes(),
        )?)?;
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let mut config = match credential {
            Some(credential) => builder.with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(credential.cert_pem.as_bytes())?],
                PrivateKeyDer::from_pem_slice(credential.key_pem.as_bytes())?,
            )?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let address = proxy
            .url()
            .strip_prefix("https://")
            .context("the proxy's URL is not https")?
            .to_string();
        Ok(Self {
            connector: TlsConnector::from(std::sync::Arc::new(config)),
            address,
        })
    }

    /// A new TLS connection to the proxy.
    async fn connect(&self) -> anyhow::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(&self.address).await?;
        Ok(self
            .connector
            .connect(ServerName::try_from("127.0.0.1")?, tcp)
            .await?)
    }

    /// A WebSocket on a new connection to `path`, offering `protocols`; returns the socket and
    /// the negotiated subprotocol.
    async fn websocket(&self, path: &str, protocols: &[&str]) -> anyhow::Result<(Socket, Option<String>)> {
        let tls = within(self.connect()).await?;
        let mut request = format!("wss://{}{path}", self.address).into_client_request()?;
        request
            .headers_mut()
            .insert("sec-websocket-protocol", protocols.join(", ").parse()?);
        let (socket, response) = match within(async { Ok(client_async(request, tls).await) }).await? {
            Ok(done) => done,
            Err(tungstenite::Error::Http(response)) => bail!(
                "the upgrade of {path} was refused: {} {}",
                response.status(),
                String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
            ),
            Err(e) => return Err(e).context(format!("upgrading {path}")),
        };
        let protocol = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|value| value.to_str().map(str::to_string))
            .transpose()?;
        Ok((socket, protocol))
    }
}

/// Runs `step` with [`STEP_TIMEOUT`].
async fn within<T>(step: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(STEP_TIMEOUT, step)
        .await
        .map_err(|_| anyhow::anyhow!("no progress within {STEP_TIMEOUT:?}"))?
}

/// The next message on `socket` within [`STEP_TIMEOUT`]; fails on the end of the stream or an
/// error.
pub(crate) async fn next(socket: &mut Socket) -> anyhow::Result<Message> {
    within(async {
        match socket.next().await {
            Some(message) => Ok(message?),
            None => bail!("the WebSocket ended"),
        }
    })
    .await
}

/// Reads `socket` to its end; returns what arrived on the way.
async fn until_closed(socket: &mut Socket) -> anyhow::Result<Vec<Message>> {
    within(async {
        let mut arrived = Vec::new();
        while let Some(message) = socket.next().await {
            arrived.push(message?);
        }
        Ok(arrived)
    })
    .await
}

/// The head of an HTTP/1.1 response read from a raw stream.
#[derive(Debug)]
struct Head {
    status: u16,
    /// Names lower-cased, in order.
    headers: Vec<(String, String)>,
    /// Bytes read past the head.
    rest: Vec<u8>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<Head> {
    within(async {
        let mut buffer = Vec::new();
        let mut chunk = [0; 4096];
        let end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            ensure!(buffer.len() < 64 * 1024, "no end of the response head in 64 KiB");
            let n = stream.read(&mut chunk).await?;
            ensure!(
                n > 0,
                "the connection ended before a response head: {:?}",
                String::from_utf8_lossy(&buffer)
            );
            buffer.extend_from_slice(&chunk[..n]);
        };
        let text = std::str::from_utf8(&buffer[..end])?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .with_context(|| format!("a bad status line: {status_line:?}"))?;
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        Ok(Head {
            status,
            headers,
            rest: buffer[end + 4..].to_vec(),
        })
    })
    .await
}

/// Reads the body that follows `head` (it must have a Content-Length).
async fn read_body(stream: &mut (impl AsyncRead + Unpin), head: &Head) -> anyhow::Result<Vec<u8>> {
    let length: usize = head
        .header("content-length")
        .with_context(|| format!("a response without Content-Length: {head:?}"))?
        .parse()?;
    let mut body = head.rest.clone();
    ensure!(body.len() <= length, "more than Content-Length arrived: {head:?}");
    let mut tail = vec![0; length - body.len()];
    within(async { Ok(stream.read_exact(&mut tail).await?) }).await?;
    body.extend_from_slice(&tail);
    Ok(body)
}

/// Reads until the connection ends (a TLS connection closed without close_notify counts as
/// ended); returns what arrived on the way.
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<Vec<u8>> {
    within(async {
        let mut arrived = Vec::new();
        match stream.read_to_end(&mut arrived).await {
            Ok(_) => Ok(arrived),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(arrived),
            Err(e) => Err(e.into()),
        }
    })
    .await
}

/// An exec request as kubectl sends it: a WebSocket `GET`, or a SPDY/3.1 `POST` offering
/// `versions` (one `X-Stream-Protocol-Version` header each).
fn raw_upgrade(upgrade: Upgrade, path: &str, host: &str, versions: &[&str]) -> String {
    match upgrade {
        Upgrade::WebSocket => format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
        ),
        Upgrade::Spdy => {
            let versions: String = versions
                .iter()
                .map(|v| format!("X-Stream-Protocol-Version: {v}\r\n"))
                .collect();
            format!(
                "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
                 {versions}Content-Length: 0\r\n\r\n"
            )
        }
    }
}

/// `len` bytes that are not all alike, so a reordering or a lost chunk shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// A namespace with the echo API, a user allowed to use `echoes/exec` in it, and the proxy.
struct Setup {
    // Field order is drop order: the proxy stops before the echo API is unregistered.
    proxy: Proxy,
    echo: EchoApi,
    namespace: String,
    user: String,
    /// A client with the user's certificate.
    client: Client,
}

async fn setup(prefix: &str) -> anyhow::Result<Setup> {
    let cluster = Cluster::shared().await?;
    let kube = cluster.client().await?;
    let namespace = cluster.create_namespace(&kube, prefix).await?;
    let user = format!("exec-user-{namespace}");
    let echo = EchoApi::start(cluster, &namespace).await?;
    grant_exec(cluster, &kube, &echo, &namespace, &user).await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let credential = proxy.signer().issue_client(&user, &GROUPS)?;
    let client = Client::new(&proxy, Some(&credential))?;
    Ok(Setup {
        proxy,
        echo,
        namespace,
        user,
        client,
    })
}

/// Lets `user` get and create `echoes/exec` in `namespace` (WebSocket exec is a GET, SPDY exec a
/// POST), and waits until kube-apiserver's authorizer says so. The harness runs no controller
/// manager, so a Role says it directly.
async fn grant_exec(
    cluster: &Cluster,
    kube: &kube::Client,
    echo: &EchoApi,
    namespace: &str,
    user: &str,
) -> anyhow::Result<()> {
    echo.grant_exec(cluster, namespace, user, &["get", "create"])
        .await?;
    let reviews = Api::<SubjectAccessReview>::all(kube.clone());
    crate::eventually(Duration::from_secs(10), || async {
        for verb in ["get", "create"] {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.to_string()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(echo.group().to_string()),
                        resource: Some("echoes".into()),
                        subresource: Some("exec".into()),
                        verb: Some(verb.into()),
                        namespace: Some(namespace.to_string()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let reviewed = reviews.create(&PostParams::default(), &review).await?;
            ensure!(
                reviewed.status.is_some_and(|status| status.allowed),
                "{user} may not {verb} echoes/exec yet"
            );
        }
        Ok(())
    })
    .await
}

/// The tunnel the echo API recorded for `name`, once it has ended.
async fn tunnel(echo: &EchoApi, name: &str) -> anyhow::Result<Tunnel> {
    crate::eventually(Duration::from_secs(10), || async {
        echo.tunnels()
            .into_iter()
            .find(|t| t.name == name)
            .with_context(|| format!("the echo API recorded no end of the tunnel {name}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_and_spdy_upgrades_tunnel_through_the_proxy_as_the_caller() -> anyhow::Result<()> {
    let Setup {
        proxy,
        echo,
        namespace,
        user,
        client,
    } = setup("upgrades").await?;
    let ns = namespace.as_str();

    // WebSocket: v5 preferred and negotiated end to end; messages of every kind echo intact.
    let (mut socket, protocol) = client
        .websocket(
            &echo.exec_path(ns, "ws-echo"),
            &["v5.channel.k8s.io", "v4.channel.k8s.io"],
        )
        .await?;
    assert_eq!(protocol.as_deref(), Some("v5.channel.k8s.io"));
    let stdin = Message::binary(b"\x00echo from stdin".to_vec());
    socket.send(stdin.clone()).await?;
    assert_eq!(next(&mut socket).await?, stdin);
    let text = Message::text("a text frame");
    socket.send(text.clone()).await?;
    assert_eq!(next(&mut socket).await?, text);
    let large = pattern(1 << 20);
    socket.send(Message::binary(large.clone())).await?;
    match next(&mut socket).await? {
        Message::Binary(echoed) => assert!(echoed == large, "the 1 MiB message came back changed"),
        other => bail!("expected the 1 MiB message back, got {other:?}"),
    }
    // The client closes; the server's reply ends the stream, and the server saw the close.
    socket.close(None).await?;
    let after_close = until_closed(&mut socket).await?;
    assert!(
        matches!(after_close.as_slice(), [Message::Close(_)]),
        "{after_close:?}"
    );
    let ended = tunnel(&echo, "ws-echo").await?;
    assert_eq!(ended.upgrade, Upgrade::WebSocket);
    assert_eq!(ended.protocol.as_deref(), Some("v5.channel.k8s.io"));
    assert_eq!((ended.echoed, ended.end), (3, TunnelEnd::ClientClosed));

    // The server closes first: the client sees its Close frame, then the end of the stream.
    let path = format!("{}?closeAfter=1", echo.exec_path(ns, "ws-server-close"));
    let (mut socket, _) = client.websocket(&path, &["v5.channel.k8s.io"]).await?;
    let last = Message::binary(b"\x00last words".to_vec());
    socket.send(last.clone()).await?;
    assert_eq!(next(&mut socket).await?, last);
    let after_close = until_closed(&mut socket).await?;
    assert!(
        matches!(after_close.as_slice(), [Message::Close(_)]),
        "{after_close:?}"
    );
    let ended = tunnel(&echo, "ws-server-close").await?;
    assert_eq!((ended.echoed, ended.end), (1, TunnelEnd::ServerClosed));

    // An older client's subprotocol is negotiated too.
    let (mut socket, protocol) = client
        .websocket(&echo.exec_path(ns, "ws-v4"), &["v4.channel.k8s.io"])
        .await?;
    assert_eq!(protocol.as_deref(), Some("v4.channel.k8s.io"));
    socket.close(None).await?;
    until_closed(&mut socket).await?;

    // SPDY/3.1 on a raw TLS connection: the version is negotiated among the repeated headers.
    let spdy_path = echo.exec_path(ns, "spdy-echo");
    let mut tls = client.connect().await?;
    let offered = ["v9.unknown.example", "v4.channel.k8s.io", "channel.k8s.io"];
    tls.write_all(raw_upgrade(Upgrade::Spdy, &spdy_path, &client.address, &offered).as_bytes())
        .await?;
    let head = read_head(&mut tls).await?;
    assert_eq!(head.status, 101, "{head:?}");
    assert_eq!(
        head.header("x-stream-protocol-version"),
        Some("v4.channel.k8s.io")
    );
    assert!(
        head.header("upgrade")
            .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1")),
        "{head:?}"
    );
    assert!(head.rest.is_empty(), "bytes before the client spoke: {head:?}");
    let (mut reader, mut writer) = tokio::io::split(tls);
    writer.write_all(b"hello spdy").await?;
    let mut back = [0; 10];
    within(async { Ok(reader.read_exact(&mut back).await?) }).await?;
    assert_eq!(&back, b"hello spdy");
    // Both directions at once, more than any buffer on the way holds.
    let large = pattern(256 * 1024);
    let (sent, echoed) = tokio::join!(
        within(async { Ok(writer.write_all(&large).await?) }),
        within(async {
            let mut echoed = vec![0; large.len()];
            reader.read_exact(&mut echoed).await?;
            Ok(echoed)
        }),
    );
    sent?;
    assert!(echoed? == large, "256 KiB came back changed");
    // The client ends its side: the server sees the end, and the tunnel closes.
    writer.shutdown().await?;
    let after_close = read_until_closed(&mut reader).await?;
    assert!(
        after_close.is_empty(),
        "{} bytes after the close",
        after_close.len()
    );
    let ended = tunnel(&echo, "spdy-echo").await?;
    assert_eq!(ended.upgrade, Upgrade::Spdy);
    assert_eq!(ended.protocol.as_deref(), Some("v4.channel.k8s.io"));
    assert_eq!(
        (ended.echoed, ended.end),
        (10 + large.len(), TunnelEnd::ClientClosed)
    );

    // The server ends its side first: the client reads the echo, then the end.
    let path = format!("{}?closeAfter=5", echo.exec_path(ns, "spdy-server-close"));
    let mut tls = client.connect().await?;
    tls.write_all(raw_upgrade(Upgrade::Spdy, &path, &client.address, &["v5.channel.k8s.io"]).as_bytes())
        .await?;
    let head = read_head(&mut tls).await?;
    assert_eq!(head.status, 101, "{head:?}");
    assert_eq!(
        head.header("x-stream-protocol-version"),
        Some("v5.channel.k8s.io")
    );
    tls.write_all(b"hello").await?;
    let after = read_until_closed(&mut tls).await?;
    assert_eq!(after, b"hello");
    let ended = tunnel(&echo, "spdy-server-close").await?;
    assert_eq!((ended.echoed, ended.end), (5, TunnelEnd::ServerClosed));

    // The echo API saw the caller, impersonated by the proxy, never the proxy itself.
    let seen = echo.requests();
    for (path, method, upgrade) in [
        (echo.exec_path(ns, "ws-echo"), "GET", "websocket"),
        (spdy_path, "POST", "SPDY/3.1"),
    ] {
        let request = seen
            .iter()
            .find(|s| s.path == path)
            .with_context(|| format!("the echo API never saw {path}"))?;
        assert_eq!(request.method, method);
        assert_eq!(request.upgrade.as_deref(), Some(upgrade));
        assert_eq!(request.remote_user.as_deref(), Some(user.as_str()));
        assert_ne!(request.remote_user.as_deref(), Some(PROXY_USER));
        for group in GROUPS.iter().chain(&["system:authenticated"]) {
            assert!(
                request.remote_groups.iter().any(|g| g == group),
                "{group} missing: {:?}",
                request.remote_groups
            );
        }
        assert_eq!(
            request.peer_subject.as_deref(),
            Some(format!("CN={FRONT_PROXY_CLIENT_NAME}").as_str())
        );
    }

    // No credential: the proxy answers 401 with a Status, and nothing is tunnelled.
    let anonymous = Client::new(&proxy, None)?;
    let anonymous_path = echo.exec_path(ns, "anonymous");
    let mut tls = anonymous.connect().await?;
    tls.write_all(raw_upgrade(Upgrade::WebSocket, &anonymous_path, &client.address, &[]).as_bytes())
        .await?;
    let head = read_head(&mut tls).await?;
    assert_eq!(head.status, 401, "{head:?}");
    let status: Value = serde_json::from_slice(&read_body(&mut tls, &head).await?)?;
    assert_eq!(
        (&status["kind"], &status["code"], &status["reason"]),
        (&"Status".into(), &401.into(), &"Unauthorized".into()),
        "{status}"
    );
    let after = read_until_closed(&mut tls).await?;
    assert!(after.is_empty(), "bytes after the 401: {after:?}");

    // A user RBAC does not allow: kube-apiserver's 403 comes back intact, for both verbs.
    let stranger = format!("no-exec-{ns}");
    let outsider = Client::new(
        &proxy,
        Some(&proxy.signer().issue_client(&stranger, &["readers"])?),
    )?;
    let forbidden_path = echo.exec_path(ns, "forbidden");
    for (upgrade, verb) in [(Upgrade::WebSocket, "get"), (Upgrade::Spdy, "create")] {
        let mut tls = outsider.connect().await?;
        let request = raw_upgrade(upgrade, &forbidden_path, &client.address, &["v4.channel.k8s.io"]);
        tls.write_all(request.as_bytes()).await?;
        let head = read_head(&mut tls).await?;
        assert_eq!(head.status, 403, "{head:?}");
        let status: Value = serde_json::from_slice(&read_body(&mut tls, &head).await?)?;
        assert_eq!(
            (&status["kind"], &status["code"], &status["reason"]),
            (&"Status".into(), &403.into(), &"Forbidden".into()),
            "{status}"
        );
        let expected = format!(
            r#"User "{stranger}" cannot {verb} resource "echoes/exec" in API group "{}""#,
            echo.group()
        );
        let message = status["message"].as_str().unwrap_or_default();
        assert!(message.contains(&expected), "{message}");
    }
    let seen = echo.requests();
    for refused in [&anonymous_path, &forbidden_path] {
        assert!(
            seen.iter().all(|s| &s.path != refused),
            "a refused upgrade reached the echo API: {refused}"
        );
    }
    Ok(())
}

/// One exec-style session: a new connection, the upgrade, one round trip, the client's close.
async fn one_upgrade(client: &Client, path: &str, n: usize) -> anyhow::Result<()> {
    let (mut socket, protocol) = client.websocket(path, &["v5.channel.k8s.io"]).await?;
    ensure!(
        protocol.as_deref() == Some("v5.channel.k8s.io"),
        "negotiated {protocol:?}"
    );
    let message = Message::binary(format!("\x00round trip {n}").into_bytes());
    socket.send(message.clone()).await?;
    let echoed = next(&mut socket).await?;
    ensure!(echoed == message, "sent {message:?}, got {echoed:?}");
    socket.close(None).await?;
    let after_close = until_closed(&mut socket).await?;
    ensure!(
        matches!(after_close.as_slice(), [Message::Close(_)]),
        "after the close: {after_close:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_consecutive_websocket_upgrades_complete() -> anyhow::Result<()> {
    let setup = setup("upgrades-race").await?;
    let mut latencies = Vec::with_capacity(UPGRADES);
    let mut failures = Vec::new();
    let started = Instant::now();
    for n in 0..UPGRADES {
        let path = setup.echo.exec_path(&setup.namespace, &format!("race-{n}"));
        let begun = Instant::now();
        match one_upgrade(&setup.client, &path, n).await {
            Ok(()) => latencies.push(begun.elapsed()),
            Err(e) => failures.push(format!("upgrade {n}: {e:#}")),
        }
        if failures.len() >= 5 {
            break;
        }
    }
    let total = started.elapsed();
    latencies.sort();
    let percentile = |p: usize| {
        latencies
            .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{} consecutive WebSocket upgrades through the proxy in {total:.2?}: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        latencies.len(),
        percentile(50),
        percentile(99),
        latencies.last().copied().unwrap_or_default(),
    );
    ensure!(
        failures.is_empty(),
        "torn or failed upgrades (after {} good ones):\n{}\n--- proxy log tail ---\n{}",
        latencies.len(),
        failures.join("\n"),
        tail(&setup.proxy.log(), 20)
    );

    // The server saw every one of them through to the client's close.
    crate::eventually(Duration::from_secs(10), || async {
        let tunnels = setup.echo.tunnels();
        let good = tunnels
            .iter()
            .filter(|t| t.name.starts_with("race-") && t.echoed == 1 && t.end == TunnelEnd::ClientClosed)
            .count();
        let bad: Vec<&Tunnel> = tunnels
            .iter()
            .filter(|t| t.end != TunnelEnd::ClientClosed)
            .collect();
        ensure!(bad.is_empty(), "tunnels that did not end cleanly: {bad:?}");
        ensure!(good == UPGRADES, "{good} of {UPGRADES} tunnels ended cleanly");
        Ok(())
    })
    .await?;

    // Each upgrade had a connection to kube-apiserver of its own, and all but the first few
    // resumed a TLS session (kube-apiserver sends session tickets; the proxy keeps them).
    let text = crate::proxy_operations::metrics(&setup.proxy).await?;
    let connections = |connection| {
        crate::proxy_operations::value(
            &text,
            "selkie_proxy_upstream_connections_total",
            &[("connection", connection)],
        )
    };
    let (new, resumed) = (connections("new")?, connections("resumed")?);
    ensure!(
        resumed >= (UPGRADES as f64) * 0.9 && new + resumed >= UPGRADES as f64,
        "{new} new and {resumed} resumed upstream connections for {UPGRADES} upgrades:\n{text}"
    );
    Ok(())
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
