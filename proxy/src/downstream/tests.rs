use std::time::Duration;

use bytes::Bytes;
use pingora::{apps::HttpPersistentSettings, http::ResponseHeader};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, DuplexStream},
    time::Instant,
};

use super::*;

const TIMEOUTS: Timeouts = Timeouts {
    header_read: Duration::from_millis(400),
    idle: Duration::from_millis(700),
};

/// Answers every request with `200 ok`, keeping the connection; `GET /slow` takes longer than
/// both timeouts to answer.
struct Ok200;

#[async_trait]
impl HttpServerApp for Ok200 {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        _shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !session.read_request().await.ok()? {
            return None;
        }
        request_head_read(&mut session);
        if session.req_header().uri.path() == "/slow" {
            tokio::time::sleep(TIMEOUTS.idle * 2).await;
        }
        let mut response = ResponseHeader::build(200, None).ok()?;
        response.insert_header("content-length", "2").ok()?;
        session.write_response_header(Box::new(response)).await.ok()?;
        session
            .write_response_body(Bytes::from_static(b"ok"), true)
            .await
            .ok()?;
        let settings = HttpPersistentSettings::for_session(&session);
        let stream = session.finish().await.ok()??;
        Some(ReusedHttpStream::from_reusable_stream(stream, settings))
    }
}

/// A client end connected to a new [`DownstreamApp`] connection.
fn connect() -> DuplexStream {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let app = Arc::new(DownstreamApp::new(Ok200, TIMEOUTS));
    tokio::spawn(async move {
        let (_keep_open, shutdown) = tokio::sync::watch::channel(false);
        app.process_new(Box::new(server), &shutdown).await;
    });
    client
}

/// Reads until the server closes; returns what it sent and when it closed, from `start`.
async fn until_closed(client: &mut DuplexStream, start: Instant) -> (String, Duration) {
    let mut received = Vec::new();
    let _ = client.read_to_end(&mut received).await;
    (String::from_utf8_lossy(&received).into_owned(), start.elapsed())
}

/// Reads one `200 ok` response.
async fn read_ok(client: &mut DuplexStream) {
    let mut received = Vec::new();
    while !received.ends_with(b"\r\n\r\nok") {
        let mut chunk = [0; 256];
        let read = client.read(&mut chunk).await.unwrap();
        assert!(read > 0, "closed before the response: {received:?}");
        received.extend_from_slice(&chunk[..read]);
    }
    assert!(received.starts_with(b"HTTP/1.1 200"), "{received:?}");
}

fn assert_about(elapsed: Duration, expected: Duration) {
    assert!(
        elapsed >= expected && elapsed < expected + Duration::from_millis(300),
        "closed after {elapsed:?}, expected {expected:?}"
    );
}

#[tokio::test]
async fn a_stalled_request_head_is_closed_after_the_header_read_timeout() {
    let start = Instant::now();
    let mut client = connect();
    client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let (response, elapsed) = until_closed(&mut client, start).await;
    assert_eq!(response, "", "no response to half a request");
    assert_about(elapsed, TIMEOUTS.header_read);
}

#[tokio::test]
async fn a_trickled_request_head_gets_no_more_time_than_a_stalled_one() {
    let start = Instant::now();
    let head = b"GET / HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nUser-Agent: slow\r\n";
    let (mut reader, mut writer) = tokio::io::split(connect());
    let trickle = tokio::spawn(async move {
        for byte in head {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut received = Vec::new();
    let _ = reader.read_to_end(&mut received).await;
    assert_about(start.elapsed(), TIMEOUTS.header_read);
    assert!(received.is_empty());
    trickle.abort();
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    let start = Instant::now();
    let mut client = connect();
    let (_, elapsed) = until_closed(&mut client, start).await;
    assert_about(elapsed, TIMEOUTS.header_read);
}

#[tokio::test]
async fn keep_alive_connections_close_after_the_idle_timeout_and_each_request_head_gets_its_own_deadline() {
    let mut client = connect();
    for _ in 0..2 {
        // Each request starts later than a head deadline counted from the connection's start.
        tokio::time::sleep(TIMEOUTS.header_read / 2).await;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_ok(&mut client).await;
    }
    let idle_since = Instant::now();
    let (_, elapsed) = until_closed(&mut client, idle_since).await;
    assert_about(elapsed, TIMEOUTS.idle);
}

#[tokio::test]
async fn a_request_in_progress_has_no_deadline() {
    let mut client = connect();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_ok(&mut client).await;
    // The connection is still usable.
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_ok(&mut client).await;
}

#[test]
fn request_heads_over_the_limits_are_refused() {
    let head = |fields: &[(&str, usize)]| {
        let mut head = RequestHeader::build("GET", b"/api", None).unwrap();
        for (i, (name, size)) in fields.iter().enumerate() {
            head.append_header(format!("{name}-{i}"), "v".repeat(*size))
                .unwrap();
        }
        head
    };
    assert_eq!(check_request_head(&head(&[("accept", 100); 20])), Ok(()));
    assert_eq!(
        check_request_head(&head(&[("x-many", 1); MAX_REQUEST_HEADERS + 1])),
        Err(RequestHeadError::TooManyFields(MAX_REQUEST_HEADERS + 1))
    );
    assert!(matches!(
        check_request_head(&head(&[("authorization", MAX_REQUEST_HEAD_BYTES)])),
        Err(RequestHeadError::TooLarge(_))
    ));
    assert!(matches!(
        check_request_head(&head(&[("x-big", MAX_REQUEST_HEAD_BYTES / 4); 5])),
        Err(RequestHeadError::TooLarge(_))
    ));
}

#[test]
fn timeouts_parse_with_defaults() {
    let parse = |yaml: &str| serde_yaml::from_str::<Timeouts>(yaml);
    assert_eq!(parse("{}").unwrap(), Timeouts::default());
    assert_eq!(
        parse("headerRead: 2s\nidle: 1m30s").unwrap(),
        Timeouts {
            header_read: Duration::from_secs(2),
            idle: Duration::from_secs(90),
        }
    );
    let error = parse("headerRead: 0s").unwrap_err().to_string();
    assert!(error.contains("greater than zero"), "{error}");
    let error = parse("idle: 10").unwrap_err().to_string();
    assert!(error.contains("unit"), "{error}");
    let error = parse("read: 1s").unwrap_err().to_string();
    assert!(error.contains("unknown field `read`"), "{error}");
}
