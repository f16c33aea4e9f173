use std::collections::VecDeque;

use super::*;

/// A connection that delivers its bytes in the given pieces, one per read, then ends.
struct Pieces(VecDeque<Vec<u8>>);

impl Pieces {
    fn new(pieces: &[&[u8]]) -> Self {
        Self(pieces.iter().map(|piece| piece.to_vec()).collect())
    }
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(mut piece) = self.0.pop_front() {
            let taken = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..taken]);
            if taken < piece.len() {
                self.0.push_front(piece.split_off(taken));
            }
        }
        Poll::Ready(Ok(()))
    }
}

fn request(lines: &[&str]) -> RequestHeader {
    let mut request = RequestHeader::build("GET", b"/api/v1/namespaces/default/pods/web/exec", None).unwrap();
    for line in lines {
        let (name, value) = line.split_once(": ").unwrap();
        request.append_header(name.to_string(), value).unwrap();
    }
    request
}

#[test]
fn takes_upgrades_without_a_body_that_keep_the_connection() {
    for lines in [
        &["Connection: Upgrade", "Upgrade: websocket"][..],
        &["Connection: Upgrade", "Upgrade: SPDY/3.1", "Content-Length: 0"],
        &["Connection: keep-alive, Upgrade", "Upgrade: websocket"],
    ] {
        assert!(without_body_or_close(&request(lines)), "{lines:?}");
    }
}

#[test]
fn leaves_upgrades_with_a_body_or_a_close_to_pingora() {
    for lines in [
        &["Connection: Upgrade", "Upgrade: websocket", "Content-Length: 5"][..],
        &[
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Transfer-Encoding: chunked",
        ],
        &["Connection: Upgrade, close", "Upgrade: websocket"],
        &["Connection: Upgrade", "Connection: Close", "Upgrade: websocket"],
    ] {
        assert!(!without_body_or_close(&request(lines)), "{lines:?}");
    }
}

#[tokio::test]
async fn a_101_head_read_in_pieces_keeps_the_bytes_after_it() {
    let raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n";
    let mut connection = Pieces::new(&[&raw[..10], &raw[10..40], &raw[40..], b"\x82\x01x", b"more"]);
    let head = read_head(&mut connection).await.unwrap();
    assert_eq!(head.response.status, 101);
    assert_eq!(
        head.response.headers.get("sec-websocket-protocol").unwrap(),
        "v5.channel.k8s.io"
    );
    assert_eq!(&head.raw[..], &raw[..]);
    // Only what arrived with the head's last read; the rest stays in the connection.
    assert_eq!(&head.rest[..], b"");
    let mut together = Pieces::new(&[&[&raw[..], b"\x82\x01x"].concat()]);
    let head = read_head(&mut together).await.unwrap();
    assert_eq!(&head.raw[..], &raw[..]);
    assert_eq!(&head.rest[..], b"\x82\x01x");
}

#[tokio::test]
async fn informational_answers_before_the_head_are_skipped() {
    let mut connection =
        Pieces::new(&[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\n{}"]);
    let head = read_head(&mut connection).await.unwrap();
    assert_eq!(head.response.status, 403);
    assert_eq!(
        &head.raw[..],
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\n"
    );
    assert_eq!(&head.rest[..], b"{}");
}

#[tokio::test]
async fn a_head_that_ends_early_is_malformed_or_too_large_fails() {
    let closed = read_head(&mut Pieces::new(&[b"HTTP/1.1 101 Switching"])).await;
    assert_eq!(closed.err().unwrap().etype(), &ErrorType::ConnectionClosed);
    let malformed = read_head(&mut Pieces::new(&[b"HTTP/1.1 abc\r\n\r\n"])).await;
    assert_eq!(malformed.err().unwrap().etype(), &ErrorType::InvalidHTTPHeader);
    let endless = vec![b'a'; 16 * 1024];
    let mut huge = vec![&b"HTTP/1.1 200 OK\r\nX-Long: "[..]];
    huge.extend(std::iter::repeat_n(&endless[..], 5));
    let large = read_head(&mut Pieces::new(&huge)).await;
    assert_eq!(large.err().unwrap().etype(), &ErrorType::InvalidHTTPHeader);
}

async fn answer(pieces: &[&[u8]]) -> Result<(u16, Bytes)> {
    let mut connection = Pieces::new(pieces);
    let mut head = read_head(&mut connection).await?;
    let body = read_answer_body(&mut connection, &mut head).await?;
    Ok((head.response.status.as_u16(), body))
}

#[tokio::test]
async fn refusal_bodies_are_read_as_their_head_frames_them() {
    let status = br#"{"kind":"Status","code":403}"#;
    let sized = answer(&[
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 28\r\n\r\n",
        &status[..9],
        &status[9..],
        b"extra",
    ])
    .await
    .unwrap();
    assert_eq!(sized, (403, Bytes::from_static(status)));
    let chunked = answer(&[
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"a\r\n{\"kind\":\"S",
        b"\r\n12\r\ntatus\",\"code\":404}\r\n0\r",
        b"\n\r\n",
    ])
    .await
    .unwrap();
    assert_eq!(
        chunked,
        (404, Bytes::from_static(br#"{"kind":"Status","code":404}"#))
    );
    let until_closed = answer(&[b"HTTP/1.1 500 Internal Server Error\r\n\r\nsomething ", b"broke"])
        .await
        .unwrap();
    assert_eq!(until_closed, (500, Bytes::from_static(b"something broke")));
    let none = answer(&[b"HTTP/1.1 204 No Content\r\n\r\n"]).await.unwrap();
    assert_eq!(none, (204, Bytes::new()));
}

#[tokio::test]
async fn refusal_bodies_that_end_early_are_malformed_or_too_large_fail() {
    for (pieces, etype) in [
        (
            vec![&b"HTTP/1.1 403 Forbidden\r\nContent-Length: 10\r\n\r\nshort"[..]],
            ErrorType::ConnectionClosed,
        ),
        (
            vec![&b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"[..]],
            ErrorType::ConnectionClosed,
        ),
        (
            vec![&b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"[..]],
            ErrorType::InvalidHTTPHeader,
        ),
        (
            vec![&b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n0\r\n\r\n"[..]],
            ErrorType::InvalidHTTPHeader,
        ),
        (
            vec![&b"HTTP/1.1 403 Forbidden\r\nContent-Length: 99999999\r\n\r\n"[..]],
            ErrorType::InvalidHTTPHeader,
        ),
        (
            vec![&b"HTTP/1.1 403 Forbidden\r\nContent-Length: x\r\n\r\n"[..]],
            ErrorType::InvalidHTTPHeader,
        ),
    ] {
        let failed = answer(&pieces).await.err().unwrap();
        assert_eq!(failed.etype(), &etype, "{:?}", String::from_utf8_lossy(pieces[0]));
    }
    let endless = vec![b'a'; 64 * 1024];
    let mut huge = vec![&b"HTTP/1.1 500 Internal Server Error\r\n\r\n"[..]];
    huge.extend(std::iter::repeat_n(&endless[..], 20));
    assert_eq!(
        answer(&huge).await.err().unwrap().etype(),
        &ErrorType::InvalidHTTPHeader
    );
}

#[tokio::test]
async fn the_pipe_passes_each_end_on_and_finishes_the_other_direction() {
    let (mut client, mut client_end) = tokio::io::duplex(64);
    let (mut server, mut server_end) = tokio::io::duplex(64);
    let piped = tokio::spawn(async move {
        let mut counted = Counted {
            inner: &mut client_end,
            written: 0,
        };
        let result = pipe(&mut counted, &mut server_end).await;
        (result.is_ok(), counted.written)
    });
    // Larger than every buffer on the way, both ways at once.
    let up: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let down: Vec<u8> = (0..70_000u32).map(|i| (i / 7) as u8).collect();
    let (sent, received) = tokio::join!(
        async {
            client.write_all(&up).await.unwrap();
            // The client ends its side first.
            tokio::io::AsyncWriteExt::shutdown(&mut client).await.unwrap();
            let mut echoed = Vec::new();
            client.read_to_end(&mut echoed).await.unwrap();
            echoed
        },
        async {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            // The server saw the end, and still answers before it ends too.
            server.write_all(&down).await.unwrap();
            tokio::io::AsyncWriteExt::shutdown(&mut server).await.unwrap();
            got
        },
    );
    assert!(received == up, "the server got other bytes");
    assert!(sent == down, "the client got other bytes");
    let (ok, written) = piped.await.unwrap();
    assert!(ok);
    assert_eq!(written, down.len());
}

#[tokio::test]
async fn the_detached_session_left_to_pingora_has_a_request_and_does_not_keep_alive() {
    let mut session = detached_session().await;
    assert_eq!(session.req_header().method, http::Method::GET);
    assert!(!session.is_upgrade_req());
    session
        .write_response_header(Box::new(ResponseHeader::build(200, None).unwrap()))
        .await
        .unwrap();
    assert!(session.finish().await.unwrap().is_none());
}

#[tokio::test]
async fn the_tunnel_ends_when_kube_apiserver_ends_it_though_the_client_stays() {
    let (mut client, mut client_end) = tokio::io::duplex(64);
    let (mut server, mut server_end) = tokio::io::duplex(64);
    let piped = tokio::spawn(async move { pipe(&mut client_end, &mut server_end).await });
    client.write_all(b"exit\n").await.unwrap();
    let mut got = [0; 5];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"exit\n");
    server.write_all(b"bye").await.unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut server).await.unwrap();
    // The client never ends its side, and the tunnel ends all the same, after the last bytes.
    tokio::time::timeout(std::time::Duration::from_secs(10), piped)
        .await
        .expect("the tunnel did not end")
        .unwrap()
        .unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"bye");
}

#[tokio::test]
async fn a_failure_on_either_side_ends_the_tunnel() {
    let (client, mut client_end) = tokio::io::duplex(64);
    let (mut server, mut server_end) = tokio::io::duplex(64);
    let piped = tokio::spawn(async move { pipe(&mut client_end, &mut server_end).await });
    // The client vanishes; its end is passed upstream, where the session goes on.
    drop(client);
    let mut end = Vec::new();
    server.read_to_end(&mut end).await.unwrap();
    assert!(end.is_empty());
    // kube-apiserver's next output cannot be delivered: the tunnel ends with that error.
    server.write_all(b"output").await.unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), piped)
        .await
        .expect("the tunnel did not end")
        .unwrap();
    assert_eq!(ended.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
}

/// A TLS server on loopback that answers each connection with `ok` and reports whether its
/// handshake was resumed and whether the client presented a certificate; the static
/// configuration of an upstream there, trusting its CA, with the proxy's client certificate.
async fn kube_apiserver(
    dir: &std::path::Path,
) -> (
    crate::config::StaticConfig,
    tokio::sync::mpsc::UnboundedReceiver<(Option<rustls::HandshakeKind>, bool)>,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    use rustls::pki_types::{pem::PemObject as _, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&client_key)
        .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("client.crt"), client.pem()).unwrap();
    std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();

    let mut clients = rustls::RootCertStore::empty();
    clients.add(client.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(clients))
        .allow_unauthenticated()
        .build()
        .unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![server.der().clone()],
            PrivateKeyDer::from_pem_slice(server_key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen, handshakes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            // A client that refused the certificate ends its handshake: no report.
            let Ok(mut stream) = acceptor.accept(tcp).await else {
                continue;
            };
            let (_, connection) = stream.get_ref();
            let _ = seen.send((
                connection.handshake_kind(),
                connection
                    .peer_certificates()
                    .is_some_and(|certs| !certs.is_empty()),
            ));
            let _ = stream.write_all(b"ok").await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
        }
    });
    let config = serde_yaml::from_str(&format!(
        "listen: 127.0.0.1:1\nupstream: {{url: 'https://127.0.0.1:{port}/', caFile: {dir}/ca.crt, \
         clientCertificate: {{certFile: {dir}/client.crt, keyFile: {dir}/client.key}}}}\n",
        dir = dir.display()
    ))
    .unwrap();
    (config, handshakes)
}

#[tokio::test]
async fn tunnel_connections_resume_kube_apiservers_tls_sessions_with_the_right_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (config, mut handshakes) = kube_apiserver(dir.path()).await;
    let snapshot = config.snapshot().unwrap();
    let upstream = &snapshot.upstream;
    let mut kinds = Vec::new();
    for own_credential in [true, true, true, false, false] {
        let mut stream = connect(upstream, own_credential).await.unwrap();
        // Reading takes in the session tickets that follow a TLS 1.3 handshake.
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"ok");
        let (kind, presented) = handshakes.recv().await.unwrap();
        assert_eq!(presented, own_credential, "a client certificate presented or not");
        kinds.push(kind.unwrap());
    }
    use rustls::HandshakeKind::{Full, Resumed};
    // Each credential has its own configuration, and so its own sessions.
    assert_eq!(kinds, [Full, Resumed, Resumed, Full, Resumed]);

    // A configuration built again (a rotated credential) starts afresh.
    let rebuilt = config.snapshot().unwrap();
    let mut stream = connect(&rebuilt.upstream, true).await.unwrap();
    stream.read_to_end(&mut Vec::new()).await.unwrap();
    assert_eq!(handshakes.recv().await.unwrap(), (Some(Full), true));
}

#[tokio::test]
async fn a_tunnel_connection_refuses_a_kube_apiserver_its_ca_did_not_sign() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _handshakes) = kube_apiserver(dir.path()).await;
    // Another CA in the file: the server's certificate is no longer trusted.
    let other = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(dir.path().join("ca.crt"), other.pem()).unwrap();
    let snapshot = config.snapshot().unwrap();
    let failed = connect(&snapshot.upstream, true).await.unwrap_err();
    assert_eq!(failed.etype(), &ErrorType::InvalidCert);
    assert_eq!(failed.esource(), &pingora::ErrorSource::Upstream);
}
