//! The answers to requests that fail after they were accepted ([`failure_of`]), and the detail
//! logged for them ([`root_detail`]): precise for the client, and free of the context pingora
//! and its libraries attach to their errors.

use std::sync::Arc;

use pingora::{upstreams::peer::HttpPeer, utils::tls::CertKey, ErrorType};

use super::*;

/// The upstream peer as the proxy builds it with its own client certificate (CN
/// `selkie-impersonation-proxy`), so that its `Display` — which pingora appends to every error
/// that passes it — names the address, the SNI and the certificate's subject and expiry.
fn upstream_peer() -> HttpPeer {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "selkie-impersonation-proxy");
    let cert = params.self_signed(&key).unwrap();
    let mut peer = HttpPeer::new("10.96.0.1:6443", true, "kubernetes.default.svc".into());
    peer.client_cert_key = Some(Arc::new(CertKey::new(
        vec![cert.der().to_vec()],
        key.serialize_der(),
    )));
    peer
}

/// `error` as it reaches [`ProxyHttp::fail_to_proxy`] once it passed the upstream peer: pingora's
/// `error_while_proxy` wraps it with the context `Peer: <peer>`.
fn through_the_peer(error: Box<Error>) -> Box<Error> {
    error.more_context(format!("Peer: {}", upstream_peer()))
}

/// What no client may see: the peer pingora names, and the proxy's own certificate.
const INTERNAL: [&str; 8] = [
    "Peer",
    "addr",
    "client cert",
    "CN",
    "expire",
    "10.96.0.1",
    "6443",
    "selkie-impersonation-proxy",
];

fn assert_context_free(failure: Failure) {
    for internal in INTERNAL {
        assert!(!failure.message.contains(internal), "{internal:?} in {failure:?}");
    }
}

#[test]
fn the_test_errors_carry_the_context_that_leaked() {
    let error = through_the_peer(Error::explain(INVALID_CHUNK, "chunk size overflows usize").into_down());
    let shown = error.to_string();
    for internal in INTERNAL {
        assert!(shown.contains(internal), "{internal:?} not in {shown}");
    }
}

#[test]
fn malformed_chunked_bodies_say_so_and_nothing_else() {
    // The contexts pingora 0.9.1 gives the four malformed bodies: a `0x` size prefix, a size
    // past 16 hex digits (httparse refuses both), a chunk line left after a quoted CRLF in an
    // extension, and a bare LF where CRLF belongs.
    for context in [
        "Invalid chunked encoding: InvalidChunkSize",
        "chunk size overflows usize",
        "Invalid chunked encoding: InvalidChunkSize",
        "Invalid chunk end, expected CR",
    ] {
        let error = through_the_peer(Error::explain(INVALID_CHUNK, context).into_down());
        let failure = failure_of(&error);
        assert_eq!(failure, Failure::MALFORMED_CHUNKED_BODY, "{error}");
        assert_eq!(
            failure.message,
            "the request body's chunked encoding is malformed"
        );
        assert_context_free(failure);
        // Before it passes the peer too.
        assert_eq!(
            failure_of(&Error::explain(INVALID_CHUNK, context).into_down()),
            Failure::MALFORMED_CHUNKED_BODY
        );
    }
}

#[test]
fn every_downstream_failure_is_precise_and_context_free() {
    for (etype, expected) in [
        (INVALID_CHUNK, Failure::MALFORMED_CHUNKED_BODY),
        (INVALID_TRAILER_END, Failure::MALFORMED_CHUNKED_TRAILER),
        (PREMATURE_BODY_END, Failure::TRUNCATED_BODY),
        (ErrorType::InvalidHTTPHeader, Failure::MALFORMED_HEAD),
        (ErrorType::H1Error, Failure::MALFORMED_HEAD),
        (ErrorType::H2Error, Failure::MALFORMED_H2_STREAM),
        (ErrorType::InvalidH2, Failure::MALFORMED_H2_STREAM),
        (ErrorType::ReadError, Failure::UNREADABLE_REQUEST),
        (ErrorType::ConnectionClosed, Failure::UNREADABLE_REQUEST),
        (ErrorType::ReadTimedout, Failure::BODY_TIMED_OUT),
    ] {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by 10.96.0.1:6443");
        let error = through_the_peer(Error::because(etype.clone(), "detail", io).into_down());
        let failure = failure_of(&error);
        assert_eq!(failure, expected, "{error}");
        assert_eq!(
            (failure.code, failure.reason),
            if failure.code == 408 {
                (408, "Timeout")
            } else {
                (400, "BadRequest")
            }
        );
        assert_context_free(failure);
    }
}

#[test]
fn upstream_and_internal_failures_keep_their_codes_without_context() {
    let refused = through_the_peer(Error::explain(ErrorType::ConnectRefused, "Fail to connect").into_up());
    assert_eq!(failure_of(&refused), Failure::BAD_GATEWAY);
    let tls = Error::explain(ErrorType::TLSHandshakeFailure, "invalid peer certificate").into_up();
    assert_eq!(failure_of(&tls), Failure::BAD_GATEWAY);
    let read = through_the_peer(Error::explain(ErrorType::ReadError, "connection reset").into_up());
    assert_eq!(failure_of(&read), Failure::UPSTREAM_FAILED);
    assert_eq!(failure_of(&read).code, 503);
    let internal = Error::explain(ErrorType::InternalError, "no snapshot loaded");
    assert_eq!(failure_of(&internal), Failure::NOT_READY);
    for failure in [
        failure_of(&refused),
        failure_of(&tls),
        failure_of(&read),
        failure_of(&internal),
    ] {
        assert_context_free(failure);
        assert!(!failure.message.contains("snapshot") && !failure.message.contains("reset"));
    }
}

#[test]
fn the_logged_detail_is_the_root_cause_without_the_peer() {
    let chunk = through_the_peer(Error::explain(INVALID_CHUNK, "chunk size overflows usize").into_down());
    assert_eq!(root_detail(&chunk), "chunk size overflows usize");
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
    let read = through_the_peer(Error::because(ErrorType::ReadError, "reading the body", io).into_down());
    assert_eq!(root_detail(&read), "connection reset");
    let bare = through_the_peer(Error::new(ErrorType::H2Error).into_down());
    assert_eq!(root_detail(&bare), "");
}

#[test]
fn an_invalid_local_body_says_where_without_quoting_it() {
    let secret = "sha256~not-for-the-log";
    for (body, expected) in [
        (
            format!(r#"{{"spec": {{"token": "{secret}"#),
            "the request body is not a valid TokenCredentialRequest: the JSON ends early",
        ),
        (
            format!(r#"{{"spec": {{"authenticator": "{secret}"}}}}"#),
            "the request body is not a valid TokenCredentialRequest: the JSON does not match the \
             TokenCredentialRequest schema at line 1, column",
        ),
        (
            format!("token={secret}"),
            "the request body is not a valid TokenCredentialRequest: it is not JSON (syntax error at \
             line 1, column 2)",
        ),
    ] {
        let error = serde_json::from_str::<TokenCredentialRequest>(&body).unwrap_err();
        let message = invalid_body(LocalApi::TokenCredentialRequest, &error);
        assert!(message.starts_with(expected), "{message}");
        assert!(!message.contains(secret), "{message}");
    }
    // serde's own message would have quoted it.
    let body = format!(r#"{{"spec": {{"authenticator": "{secret}"}}}}"#);
    let error = serde_json::from_str::<TokenCredentialRequest>(&body).unwrap_err();
    assert!(error.to_string().contains(secret), "{error}");
}
