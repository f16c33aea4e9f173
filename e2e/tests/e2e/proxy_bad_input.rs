//! Bad input at the proxy, against the real kube-apiserver: every malformed, oversized, slow,
//! unencrypted or untrusted request gets a precise answer (a status with a `metav1.Status` body
//! where HTTP and pingora allow one, otherwise a closed connection), and the proxy keeps serving.
//!
//! Where kubectl cannot produce the input, requests are written by hand over TLS (tokio-rustls)
//! or plain TCP. What pingora itself answers before any of the proxy's code runs (an unparsable
//! HTTP/1.1 head, more than 256 header fields) is asserted as pingora answers it: 400 with an
//! empty body, and the connection closed.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderName, HeaderValue, Method};
use http_body_util::{BodyExt, Full};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use selkie_e2e::{
    echo_api::EchoApi,
    pki::{CertAndKey, CertificateAuthority},
    proxy::{JwtSpec, Proxy},
    Cluster,
};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};
use tokio_rustls::{client::TlsStream, TlsConnector};
use tokio_tungstenite::{
    client_async,
    tungstenite::{client::IntoClientRequest as _, Message},
    WebSocketStream,
};

use crate::proxy_kubectl::{grant_configmaps, proxy_client, review_with, ProxyClient};

/// How long any single exchange may take before the test calls the connection hung.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(15);

#[tokio::test]
async fn bad_input_gets_a_precise_answer_and_the_proxy_stays_healthy() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-bad-input").await?;
    grant_configmaps(cluster, &namespace, "User", "alice").await?;
    // A JWT authenticator whose issuer is never reachable: token-shaped garbage gets as far as
    // the JWT parser, and no token can be verified.
    let unreachable = JwtSpec {
        name: "unreachable".into(),
        issuer: "https://127.0.0.1:1".into(),
        audience: "selkie".into(),
        username_claim: "sub".into(),
        groups_claim: "groups".into(),
        ca_pem: CertificateAuthority::new("selkie-test-unused-issuer-ca")?.cert_pem(),
    };
    let mut proxy = Proxy::start(cluster, &[unreachable]).await?;
    let alice = proxy.signer().issue_client("alice", &[])?;

    oversized_request_heads(&proxy, &alice)
        .await
        .context("oversized request heads")?;
    malformed_request_heads(&proxy, &alice)
        .await
        .context("malformed request heads")?;
    no_tls_and_broken_tls(&proxy).await.context("no or broken TLS")?;
    untrusted_client_certificates(&proxy)
        .await
        .context("untrusted client certificates")?;
    malformed_credentials(&proxy)
        .await
        .context("malformed bearer tokens")?;
    malformed_impersonation_headers(&proxy, &alice)
        .await
        .context("malformed impersonation headers")?;
    malformed_and_oversized_bodies(cluster, &proxy, &alice, &namespace)
        .await
        .context("malformed and oversized bodies")?;
    malformed_chunked_bodies(cluster, &proxy, &alice, &namespace)
        .await
        .context("malformed chunked bodies")?;
    pipelined_requests(&proxy, &alice)
        .await
        .context("pipelined requests")?;

    assert_healthy(&mut proxy, &alice).await
}

#[tokio::test]
async fn slow_and_idle_clients_are_closed_on_time_and_long_requests_are_not() -> anyhow::Result<()> {
    const HEADER_READ: Duration = Duration::from_secs(2);
    const IDLE: Duration = Duration::from_secs(3);
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-slow").await?;
    grant_configmaps(cluster, &namespace, "User", "alice").await?;
    let mut proxy = Proxy::start_configured(cluster, &[], |config| {
        config["timeouts"] = json!({"headerRead": "2s", "idle": "3s"});
    })
    .await?;
    let alice = proxy.signer().issue_client("alice", &[])?;

    let (stalled, silent, trickled, idle, h1_watch, h2_watch) = tokio::join!(
        async {
            // Half a request head, then nothing.
            let mut tls = tls_connect(&proxy, Some(&alice), b"http/1.1").await?;
            let start = Instant::now();
            tls.write_all(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: ")
                .await?;
            until_closed(&mut tls, start).await
        },
        async {
            // A TLS handshake, then nothing at all.
            let mut tls = tls_connect(&proxy, Some(&alice), b"http/1.1").await?;
            until_closed(&mut tls, Instant::now()).await
        },
        async {
            // One byte every 300 ms: every read is prompt, the head as a whole is not.
            let tls = tls_connect(&proxy, Some(&alice), b"http/1.1").await?;
            let start = Instant::now();
            let (mut reader, mut writer) = tokio::io::split(tls);
            let trickle = tokio::spawn(async move {
                for byte in b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\n\r\n" {
                    if writer.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            });
            let closed = until_closed(&mut reader, start).await;
            trickle.abort();
            closed
        },
        async {
            // A complete request, answered; then the kept-alive connection sits idle.
            let mut tls = tls_connect(&proxy, Some(&alice), b"http/1.1").await?;
            tls.write_all(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let (response, _) = read_response(&mut tls).await?;
            ensure!(response.status == 200, "GET /version: {response:?}");
            until_closed(&mut tls, Instant::now()).await
        },
        watch_outlives_the_timeouts_over_http1(cluster, &proxy, &alice, &namespace),
        watch_outlives_the_timeouts_over_http2(cluster, &proxy, &alice, &namespace),
    );
    for (case, closed, expected) in [
        ("a stalled request head", stalled, HEADER_READ),
        ("a connection that sends nothing", silent, HEADER_READ),
        ("a trickled request head", trickled, HEADER_READ),
        ("an idle kept-alive connection", idle, IDLE),
    ] {
        let (received, after) = closed.with_context(|| case.to_string())?;
        ensure!(
            received.is_empty(),
            "{case}: the connection is closed without a response, got {:?}",
            String::from_utf8_lossy(&received)
        );
        // The proxy's clock starts when its side of the handshake is done, a moment after the
        // client's; scheduling on a busy machine can only make it later.
        ensure!(
            after >= expected - Duration::from_millis(100) && after <= expected + Duration::from_millis(1500),
            "{case}: closed after {after:?}, expected {expected:?}"
        );
    }
    h1_watch.context("a watch over HTTP/1.1")?;
    h2_watch.context("a watch over HTTP/2")?;
    assert_healthy(&mut proxy, &alice).await
}

#[tokio::test]
async fn a_quiet_exec_session_outlives_every_timeout() -> anyhow::Result<()> {
    // Longer than pingora's fixed 60 s read timeout on request bodies, which an upgraded
    // connection's client side would otherwise count as.
    const QUIET: Duration = Duration::from_secs(65);
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-quiet-exec").await?;
    let echo = EchoApi::start(cluster, &namespace).await?;
    let user = format!("quiet-{namespace}");
    cluster
        .kubectl()
        .run(&[
            "create",
            "clusterrolebinding",
            &format!("quiet-exec-{namespace}"),
            "--clusterrole=cluster-admin",
            &format!("--user={user}"),
        ])
        .await?;
    let mut proxy = Proxy::start_configured(cluster, &[], |config| {
        config["timeouts"] = json!({"headerRead": "2s", "idle": "3s"});
    })
    .await?;
    let credential = proxy.signer().issue_client(&user, &[])?;

    // An exec WebSocket, as kubectl opens it (the grant may take a moment to reach the
    // authorizer).
    let path = echo.exec_path(&namespace, "quiet");
    let mut socket = crate::eventually(Duration::from_secs(10), || async {
        let tls = tls_connect(&proxy, Some(&credential), b"http/1.1").await?;
        let mut request = format!("wss://127.0.0.1{path}").into_client_request()?;
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("v5.channel.k8s.io"),
        );
        Ok(client_async(request, tls).await?.0)
    })
    .await?;
    socket.send(Message::text("before")).await?;
    ensure!(next_message(&mut socket).await? == Message::text("before"));

    tokio::time::sleep(QUIET).await;
    socket.send(Message::text("after a quiet minute")).await?;
    ensure!(
        next_message(&mut socket).await? == Message::text("after a quiet minute"),
        "the tunnel did not survive {QUIET:?} of quiet"
    );
    socket.close(None).await?;
    drop(echo);
    let alice = proxy.signer().issue_client("alice", &[])?;
    assert_healthy(&mut proxy, &alice).await
}

// ---------------------------------------------------------------------------------------------
// The cases.

/// A head with one 200 KiB field, or 150 fields, is over the proxy's limits (64 KiB, 100 fields)
/// and gets its 431 with a Status, over HTTP/1.1 (then the connection closes) and HTTP/2. 300
/// fields is over pingora's own HTTP/1.1 parser limit (256): it answers 400 with no body before
/// any hook can run. The head limits are the proxy's so that nearly every oversized head gets a
/// Status; pingora's 400 is the only answer it has for the rest.
async fn oversized_request_heads(proxy: &Proxy, alice: &CertAndKey) -> anyhow::Result<()> {
    let big = format!("X-Big: {}\r\n", "b".repeat(200 * 1024));
    let many = |count: usize| {
        (0..count)
            .map(|i| format!("X-Field-{i}: v\r\n"))
            .collect::<String>()
    };
    for (case, fields) in [("one 200 KiB field", big.clone()), ("150 fields", many(150))] {
        let response = exchange(proxy, Some(alice), &get_api(&fields)).await?;
        ensure!(response.closed, "{case}: the connection stays open after a 431");
        assert_status(&response.body, 431, "RequestHeaderFieldsTooLarge")
            .with_context(|| format!("{case} over HTTP/1.1: {response:?}"))?;
    }
    let response = exchange(proxy, Some(alice), &get_api(&many(300))).await?;
    ensure!(
        response.status == 400 && response.body.is_empty() && response.closed,
        "300 fields, pingora's answer: {response:?}"
    );

    let h2 = proxy_client(proxy, Some(alice), true)?;
    let big_value = HeaderValue::from_str(&"b".repeat(200 * 1024))?;
    let many_fields = (0..150)
        .map(|i| {
            Ok((
                HeaderName::try_from(format!("x-field-{i}"))?,
                HeaderValue::from_static("v"),
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (case, fields) in [
        (
            "one 200 KiB field",
            vec![(HeaderName::from_static("x-big"), big_value)],
        ),
        ("150 fields", many_fields),
    ] {
        let (status, body) = send(&h2, Method::GET, &format!("{}/api", proxy.url()), fields, "").await?;
        assert_status(&body, 431, "RequestHeaderFieldsTooLarge")
            .with_context(|| format!("{case} over HTTP/2: {status}"))?;
    }
    Ok(())
}

/// Heads pingora's parser refuses: it answers 400 with an empty body and closes the connection.
async fn malformed_request_heads(proxy: &Proxy, alice: &CertAndKey) -> anyhow::Result<()> {
    for (case, head) in [
        (
            "a request line with no version",
            "GET /api\r\nHost: 127.0.0.1\r\n\r\n",
        ),
        ("three words that are no request", "NOT A REQUEST\r\n\r\n"),
        (
            "a space in a field name",
            "GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Field: x\r\n\r\n",
        ),
        (
            "a field line without a colon",
            "GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\nNoColon\r\n\r\n",
        ),
        ("binary bytes", "\u{1}\u{2}\u{3} / HTTP/1.1\r\n\r\n"),
        (
            "a non-numeric Content-Length",
            "POST /api HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ten\r\n\r\n",
        ),
    ] {
        let response = exchange(proxy, Some(alice), head.as_bytes())
            .await
            .with_context(|| case.to_string())?;
        ensure!(response.status == 400 && response.closed, "{case}: {response:?}");
    }
    Ok(())
}

/// A chunked request body that breaks the chunked encoding is the client's mistake: 400 with a
/// `metav1.Status` that says what was malformed (not 503 "not ready"), and the connection closed.
/// The message says that and nothing else: none of the context pingora attaches to the error on
/// its way up (the upstream peer's address and SNI, the proxy's own client certificate's subject
/// and expiry).
async fn malformed_chunked_bodies(
    cluster: &Cluster,
    proxy: &Proxy,
    alice: &CertAndKey,
    namespace: &str,
) -> anyhow::Result<()> {
    let upstream = cluster
        .server_url()
        .strip_prefix("https://")
        .context("the apiserver URL is https")?
        .to_string();
    let head = format!(
        "POST /api/v1/namespaces/{namespace}/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    for (case, body) in [
        ("a chunk size that is not hexadecimal", "zz\r\n{}\r\n0\r\n\r\n"),
        ("a chunk longer than its size", "2\r\n{\"a\": 1}\r\n0\r\n\r\n"),
        ("a chunk size with a 0x prefix", "0x2\r\n{}\r\n0\r\n\r\n"),
        (
            "a chunk size past 64 bits",
            "10000000000000002\r\n{}\r\n0\r\n\r\n",
        ),
        (
            "a quoted CRLF in a chunk extension",
            "2;name=\"a\r\nb\"\r\n{}\r\n0\r\n\r\n",
        ),
        ("a bare LF after the chunk size", "2\n{}\r\n0\r\n\r\n"),
    ] {
        let response = exchange(proxy, Some(alice), format!("{head}{body}").as_bytes())
            .await
            .with_context(|| case.to_string())?;
        ensure!(response.status == 400 && response.closed, "{case}: {response:?}");
        assert_status(&response.body, 400, "BadRequest").with_context(|| case.to_string())?;
        let status: Value = serde_json::from_slice(&response.body)?;
        let message = status["message"].as_str().unwrap_or_default();
        ensure!(
            message == "the request body's chunked encoding is malformed",
            "{case}: {status}"
        );
        for internal in [
            "Peer",
            "addr",
            "client cert",
            "CN",
            "expire",
            selkie_e2e::proxy::PROXY_USER,
            upstream.as_str(),
        ] {
            ensure!(
                !message.contains(internal),
                "{case}: {internal:?} in the message {message:?}"
            );
        }
        ensure!(
            !contains_socket_address(message),
            "{case}: an address in the message {message:?}"
        );
    }
    Ok(())
}

/// Whether `text` holds something shaped like an IPv4 socket address (`1.2.3.4:5`).
fn contains_socket_address(text: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .any(|word| {
            word.split_once(':').is_some_and(|(host, port)| {
                host.split('.').count() == 4
                    && host
                        .split('.')
                        .all(|part| !part.is_empty() && part.parse::<u8>().is_ok())
                    && !port.is_empty()
                    && port.chars().all(|c| c.is_ascii_digit())
            })
        })
}

/// Several HTTP/1.1 requests written at once (pipelining): each is answered in order, none with
/// a 503.
async fn pipelined_requests(proxy: &Proxy, alice: &CertAndKey) -> anyhow::Result<()> {
    let mut tls = tls_connect(proxy, Some(alice), b"http/1.1").await?;
    let burst = "GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(3);
    tls.write_all(burst.as_bytes()).await?;
    let mut rest = Vec::new();
    for n in 0..3 {
        let (response, after) = match parse_response(&rest)? {
            Some(parsed) => parsed,
            None => {
                let mut received = std::mem::take(&mut rest);
                loop {
                    read_some(&mut tls, &mut received)
                        .await
                        .with_context(|| format!("response {n}"))?;
                    if let Some(parsed) = parse_response(&received)? {
                        break parsed;
                    }
                }
            }
        };
        ensure!(response.status == 200, "response {n}: {response:?}");
        rest = after;
    }
    Ok(())
}

/// No TLS at all, or a broken ClientHello: the handshake fails and the connection is closed at
/// once, with at most a TLS alert and never an HTTP response.
async fn no_tls_and_broken_tls(proxy: &Proxy) -> anyhow::Result<()> {
    let mut garbage_hello = vec![0x16, 0x03, 0x01, 0x00, 0x30, 0x01, 0x00, 0x00, 0x2c, 0x03, 0x03];
    garbage_hello.extend_from_slice(&[0xa5; 44]);
    for (case, bytes) in [
        (
            "plain HTTP",
            b"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec(),
        ),
        ("a garbled ClientHello", garbage_hello),
        ("random bytes", (0..=255u8).rev().collect()),
    ] {
        let mut tcp = TcpStream::connect(proxy_address(proxy)?).await?;
        tcp.write_all(&bytes).await?;
        let (received, _) = until_closed(&mut tcp, Instant::now())
            .await
            .with_context(|| case.to_string())?;
        ensure!(
            received.is_empty() || received[0] == 0x15,
            "{case}: expected nothing or a TLS alert record, got {:?}",
            String::from_utf8_lossy(&received)
        );
    }
    Ok(())
}

/// An expired certificate from the proxy's own signer CA, and a current one from a CA it does
/// not trust, complete the handshake (certificates are optional) and identify nobody: 401.
async fn untrusted_client_certificates(proxy: &Proxy) -> anyhow::Result<()> {
    let hour = Duration::from_secs(3600);
    let now = std::time::SystemTime::now();
    let expired = proxy
        .signer()
        .issue_client_with_validity("alice", &[], now - 2 * hour, now - hour)?;
    let unknown =
        CertificateAuthority::new("selkie-test-unknown-ca")?.issue_client("alice", &["system:masters"])?;
    let not_yet_valid =
        proxy
            .signer()
            .issue_client_with_validity("alice", &[], now + hour, now + 2 * hour)?;
    for (case, credential) in [
        ("an expired certificate", &expired),
        ("a certificate from an unknown CA", &unknown),
        ("a certificate not valid yet", &not_yet_valid),
    ] {
        for http2 in [false, true] {
            let client = proxy_client(proxy, Some(credential), http2)?;
            let (status, body) = review_with(&client, proxy.url(), &[]).await?;
            ensure!(status == 401, "{case} (HTTP/2: {http2}): {status} {body}");
            assert_status(body.to_string().as_bytes(), 401, "Unauthorized")
                .with_context(|| format!("{case} (HTTP/2: {http2})"))?;
        }
    }
    Ok(())
}

/// Bearer tokens that are garbage, truncated, empty or not bearer tokens at all: 401.
async fn malformed_credentials(proxy: &Proxy) -> anyhow::Result<()> {
    let client = proxy_client(proxy, None, true)?;
    let cases: [(&str, HeaderValue); 8] = [
        ("garbage", HeaderValue::from_static("Bearer garbage")),
        (
            "a truncated JWT",
            HeaderValue::from_static("Bearer eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJodHRwczovLzEyNy4wLjAuMToxIn0"),
        ),
        (
            "a JWT of the issuer with a forged signature",
            HeaderValue::from_static(
                "Bearer eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJodHRwczovLzEyNy4wLjAuMToxIiwiYXVkIjoic2Vsa2llIiwic3ViIjoiYWxpY2UifQ.AAAA",
            ),
        ),
        ("the scheme with no token", HeaderValue::from_static("Bearer")),
        ("the scheme and a space", HeaderValue::from_static("Bearer ")),
        ("another scheme", HeaderValue::from_static("Basic YWxpY2U6c2VjcmV0")),
        ("bytes that are not text", HeaderValue::from_bytes(b"Bearer \xff\xfe\xfd")?),
        ("a 40 KiB token", HeaderValue::from_str(&format!("Bearer {}", "a".repeat(40 * 1024)))?),
    ];
    for (case, value) in cases {
        let (status, body) = send(
            &client,
            Method::GET,
            &format!("{}/api/v1/namespaces", proxy.url()),
            vec![(http::header::AUTHORIZATION, value)],
            "",
        )
        .await?;
        assert_status(&body, 401, "Unauthorized").with_context(|| format!("{case}: {status}"))?;
    }
    Ok(())
}

/// `Impersonate-Extra-` keys must be percent-encoded UTF-8 and not empty, and a second
/// `Impersonate-User` is ambiguous: 400, before any authorization check.
async fn malformed_impersonation_headers(proxy: &Proxy, alice: &CertAndKey) -> anyhow::Result<()> {
    for http2 in [false, true] {
        let client = proxy_client(proxy, Some(alice), http2)?;
        for (name, value) in [
            ("Impersonate-Extra-%zz", "v"),
            ("Impersonate-Extra-%4", "v"),
            ("Impersonate-Extra-%ff", "v"),
            ("Impersonate-Extra-", "v"),
            ("Impersonate-User", "carol"),
        ] {
            let (status, body) = review_with(
                &client,
                proxy.url(),
                &[("Impersonate-User", "bob"), (name, value)],
            )
            .await?;
            ensure!(status == 400, "{name} (HTTP/2: {http2}): {status} {body}");
            assert_status(body.to_string().as_bytes(), 400, "BadRequest")
                .with_context(|| format!("{name} (HTTP/2: {http2})"))?;
        }
    }
    Ok(())
}

/// A create with a body that is not JSON, and one over kube-apiserver's 3 MiB limit: its own 400
/// and 413 come back through the proxy byte for byte, as kube-apiserver answers them directly.
async fn malformed_and_oversized_bodies(
    cluster: &Cluster,
    proxy: &Proxy,
    alice: &CertAndKey,
    namespace: &str,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/namespaces/{namespace}/configmaps");
    let oversized = format!(
        r#"{{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "big"}}, "data": {{"big": "{}"}}}}"#,
        "x".repeat(4 * 1024 * 1024)
    );
    for (case, body, code, reason) in [
        (
            "a truncated JSON object",
            r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"#.to_string(),
            400,
            "BadRequest",
        ),
        ("not JSON at all", "<configmap/>".to_string(), 400, "BadRequest"),
        ("a 4 MiB ConfigMap", oversized, 413, "RequestEntityTooLarge"),
    ] {
        let direct = {
            let request = http::Request::post(&path)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body.clone().into_bytes()))?;
            let response = cluster.client().await?.send(request).await?;
            let status = response.status().as_u16();
            (status, response.into_body().collect().await?.to_bytes())
        };
        ensure!(
            direct.0 == code,
            "{case}: kube-apiserver itself answers {direct:?}"
        );
        for http2 in [false, true] {
            let client = proxy_client(proxy, Some(alice), http2)?;
            let content_type = (
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            let (status, answer) = send(
                &client,
                Method::POST,
                &format!("{}{path}", proxy.url()),
                vec![content_type],
                body.clone(),
            )
            .await?;
            ensure!(
                (status, &answer) == (direct.0, &direct.1),
                "{case} (HTTP/2: {http2}): through the proxy {status} {answer:?}, directly {direct:?}"
            );
            assert_status(&answer, code, reason).with_context(|| format!("{case} (HTTP/2: {http2})"))?;
        }
    }
    Ok(())
}

/// A watch over HTTP/1.1 (one request on its connection) stays open through longer than both
/// timeouts without a byte, then delivers the next event.
async fn watch_outlives_the_timeouts_over_http1(
    cluster: &Cluster,
    proxy: &Proxy,
    alice: &CertAndKey,
    namespace: &str,
) -> anyhow::Result<()> {
    let mut tls = tls_connect(proxy, Some(alice), b"http/1.1").await?;
    let request = format!(
        "GET /api/v1/namespaces/{namespace}/configmaps?watch=true&fieldSelector=metadata.name%3Dafter-h1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await?;
    let mut received = Vec::new();
    while !received.windows(4).any(|window| window == b"\r\n\r\n") {
        read_some(&mut tls, &mut received).await?;
    }
    ensure!(
        received.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&received)
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster
        .kubectl()
        .run(&["create", "configmap", "after-h1", "-n", namespace])
        .await?;
    while !String::from_utf8_lossy(&received).contains(r#""name":"after-h1""#) {
        read_some(&mut tls, &mut received).await?;
    }
    Ok(())
}

/// The same over HTTP/2, where an open stream keeps the connection from being idle.
async fn watch_outlives_the_timeouts_over_http2(
    cluster: &Cluster,
    proxy: &Proxy,
    alice: &CertAndKey,
    namespace: &str,
) -> anyhow::Result<()> {
    let client = proxy_client(proxy, Some(alice), true)?;
    let request = http::Request::get(format!(
        "{}/api/v1/namespaces/{namespace}/configmaps?watch=true&fieldSelector=metadata.name%3Dafter-h2",
        proxy.url()
    ))
    .body(Full::new(Bytes::new()))?;
    let response = client.request(request).await?;
    ensure!(response.status() == 200, "{}", response.status());
    let mut body = response.into_body();
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster
        .kubectl()
        .run(&["create", "configmap", "after-h2", "-n", namespace])
        .await?;
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains(r#""name":"after-h2""#) {
        let frame = tokio::time::timeout(EXCHANGE_LIMIT, body.frame())
            .await
            .context("no event within the limit")?
            .context("the watch ended")??;
        if let Ok(data) = frame.into_data() {
            received.extend_from_slice(&data);
        }
    }
    Ok(())
}

/// The proxy process runs and still serves an ordinary request on a new connection.
async fn assert_healthy(proxy: &mut Proxy, alice: &CertAndKey) -> anyhow::Result<()> {
    proxy.check_running()?;
    for http2 in [false, true] {
        let client = proxy_client(proxy, Some(alice), http2)?;
        let (status, review) = review_with(&client, proxy.url(), &[]).await?;
        ensure!(
            status == 201 && review["status"]["userInfo"]["username"] == "alice",
            "after the bad input (HTTP/2: {http2}): {status} {review}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// The next WebSocket message; fails at the end of the stream or after [`EXCHANGE_LIMIT`].
async fn next_message(socket: &mut WebSocketStream<TlsStream<TcpStream>>) -> anyhow::Result<Message> {
    match tokio::time::timeout(EXCHANGE_LIMIT, socket.next()).await {
        Ok(Some(message)) => Ok(message?),
        Ok(None) => anyhow::bail!("the WebSocket ended"),
        Err(_) => anyhow::bail!("no message within {EXCHANGE_LIMIT:?}"),
    }
}

/// `body` is a `metav1.Status` failure with `code` and `reason`.
pub(crate) fn assert_status(body: &[u8], code: u16, reason: &str) -> anyhow::Result<()> {
    let status: Value = serde_json::from_slice(body)
        .with_context(|| format!("not JSON: {:?}", String::from_utf8_lossy(body)))?;
    ensure!(
        status["kind"] == "Status"
            && status["apiVersion"] == "v1"
            && status["status"] == "Failure"
            && status["code"] == code
            && status["reason"] == reason
            && status["message"]
                .as_str()
                .is_some_and(|message| !message.is_empty()),
        "expected a {code} {reason} Status, got {status}"
    );
    Ok(())
}

/// `GET /api` with `fields` (each line ending in CRLF) after `Host`.
fn get_api(fields: &str) -> Vec<u8> {
    format!("GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\n{fields}\r\n").into_bytes()
}

fn proxy_address(proxy: &Proxy) -> anyhow::Result<String> {
    Ok(proxy
        .url()
        .strip_prefix("https://")
        .context("the proxy URL is https")?
        .to_string())
}

/// A TLS connection to the proxy offering `alpn`, trusting its serving CA.
pub(crate) async fn tls_connect(
    proxy: &Proxy,
    credential: Option<&CertAndKey>,
    alpn: &[u8],
) -> anyhow::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(
        proxy.serving_ca().cert_pem().as_bytes(),
    )?)?;
    let config = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = match credential {
        Some(credential) => config.with_client_auth_cert(
            CertificateDer::pem_slice_iter(credential.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(credential.key_pem.as_bytes())?,
        )?,
        None => config.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(proxy_address(proxy)?).await?;
    let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
    Ok(TlsConnector::from(Arc::new(config)).connect(name, tcp).await?)
}

/// Reads until the peer closes (EOF, a TLS close or a reset); returns what arrived and how long
/// after `start` the connection closed. Fails if it stays open for [`EXCHANGE_LIMIT`].
async fn until_closed(
    stream: &mut (impl AsyncRead + Unpin),
    start: Instant,
) -> anyhow::Result<(Vec<u8>, Duration)> {
    let mut received = Vec::new();
    match tokio::time::timeout(EXCHANGE_LIMIT, stream.read_to_end(&mut received)).await {
        // A peer that closes without a TLS close_notify, or resets, closed all the same.
        Ok(_) => Ok((received, start.elapsed())),
        Err(_) => anyhow::bail!(
            "still open after {EXCHANGE_LIMIT:?}, having sent {:?}",
            String::from_utf8_lossy(&received)
        ),
    }
}

/// Reads whatever arrives next into `received`; fails on EOF or after [`EXCHANGE_LIMIT`].
async fn read_some(stream: &mut (impl AsyncRead + Unpin), received: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut chunk = [0; 16 * 1024];
    let read = tokio::time::timeout(EXCHANGE_LIMIT, stream.read(&mut chunk))
        .await
        .context("nothing arrived within the limit")??;
    ensure!(read > 0, "closed after {:?}", String::from_utf8_lossy(received));
    received.extend_from_slice(&chunk[..read]);
    Ok(())
}

/// An HTTP/1.1 response read off the wire.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    body: Vec<u8>,
    /// Whether the proxy closed the connection after it.
    closed: bool,
}

/// Connects (HTTP/1.1 over TLS), writes `request` and reads the response and, if the proxy closes
/// the connection within a second after it, that close.
async fn exchange(
    proxy: &Proxy,
    credential: Option<&CertAndKey>,
    request: &[u8],
) -> anyhow::Result<RawResponse> {
    let mut tls = tls_connect(proxy, credential, b"http/1.1").await?;
    tls.write_all(request).await?;
    let (mut response, rest) = read_response(&mut tls).await?;
    let mut byte = [0; 1];
    response.closed = rest.is_empty()
        && matches!(
            tokio::time::timeout(Duration::from_secs(1), tls.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        );
    Ok(response)
}

/// Reads one response (`Content-Length` or chunked body); returns it and any bytes after it.
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<(RawResponse, Vec<u8>)> {
    let mut received = Vec::new();
    loop {
        if let Some(parsed) = parse_response(&received)? {
            return Ok(parsed);
        }
        read_some(stream, &mut received).await?;
    }
}

/// The response at the start of `bytes`, or `None` while it is incomplete.
fn parse_response(bytes: &[u8]) -> anyhow::Result<Option<(RawResponse, Vec<u8>)>> {
    let Some(head_end) = bytes.windows(4).position(|window| window == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&bytes[..head_end]).context("the response head is not text")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not a status line: {status_line:?}"))?;
    let field = |wanted: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case(wanted)
                .then(|| value.trim().to_ascii_lowercase())
        })
    };
    let rest = &bytes[head_end + 4..];
    let response = |body: Vec<u8>, after: &[u8]| {
        Some((
            RawResponse {
                status,
                body,
                closed: false,
            },
            after.to_vec(),
        ))
    };
    if field("transfer-encoding").as_deref() == Some("chunked") {
        let mut body = Vec::new();
        let mut at = rest;
        loop {
            let Some(line_end) = at.windows(2).position(|window| window == b"\r\n") else {
                return Ok(None);
            };
            let size_text = std::str::from_utf8(&at[..line_end])?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or_default().trim(), 16)
                .with_context(|| format!("bad chunk size {size_text:?}"))?;
            let chunk_start = line_end + 2;
            if at.len() < chunk_start + size + 2 {
                return Ok(None);
            }
            if size == 0 {
                return Ok(response(body, &at[chunk_start + 2..]));
            }
            body.extend_from_slice(&at[chunk_start..chunk_start + size]);
            at = &at[chunk_start + size + 2..];
        }
    }
    let length: usize = field("content-length")
        .context("a response with neither Content-Length nor chunks")?
        .parse()?;
    if rest.len() < length {
        return Ok(None);
    }
    Ok(response(rest[..length].to_vec(), &rest[length..]))
}

/// Sends one request through `client`; returns the status and the whole body.
async fn send(
    client: &ProxyClient,
    method: Method,
    url: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: impl Into<Bytes>,
) -> anyhow::Result<(u16, Bytes)> {
    let mut request = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = tokio::time::timeout(
        EXCHANGE_LIMIT,
        client.request(request.body(Full::new(body.into()))?),
    )
    .await
    .context("no response within the limit")??;
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}
