//! Fewer, larger writes to the client for responses that end on their own.
//!
//! kube-apiserver writes a list as its encoder produces it: HTTP/2 DATA frames of about 4 KiB,
//! spread over the milliseconds the encoding takes. Forwarded one by one, a 72 KiB list costs
//! the proxy 18 wake-ups, 18 TLS records and 18 writes to the client socket, and on a loopback or
//! virtual NIC each write also wakes the client. That per-chunk work, not the bytes, was the
//! largest part of what a list cost the proxy (`perf/results/lists-round4.md`).
//!
//! A [`Coalescer`] holds the chunks of such a response and lets them go together: when the
//! response ends, or once [`HELD_AT_MOST`] bytes are held. The client gets the same bytes in the
//! same order, and the last byte no later than before (it waits for the encoder either way); a
//! request's memory grows by at most [`HELD_AT_MOST`].
//!
//! Only responses that are known to end soon are held: never one that stays open (a watch, a
//! followed log), an upgraded stream, anything through a `proxy` subresource (arbitrary traffic,
//! perhaps server-sent events), an event stream, or a response that announces trailers. Should
//! trailers arrive anyway, [`Coalescer::take`] gives back what is held so nothing is lost.

use bytes::{Bytes, BytesMut};
use pingora::http::{RequestHeader, ResponseHeader};

/// The most a response's held chunks may add up to before they are written.
pub const HELD_AT_MOST: usize = 64 * 1024;

/// Holds a response's body chunks until the response ends or [`HELD_AT_MOST`] bytes are held.
/// Off (passing every chunk through) unless [`Coalescer::start`] found the response eligible.
#[derive(Debug, Default)]
pub struct Coalescer {
    on: bool,
    held: BytesMut,
    /// Body bytes still to come when the response has a `Content-Length`: what is held goes out
    /// with the last of them, without waiting for the end of the upstream stream.
    remaining: Option<u64>,
}

impl Coalescer {
    /// Decides, once the upstream response's header is known, whether its body is held: only
    /// when the request neither stays open nor goes through a `proxy` subresource, and the
    /// response is not `101 Switching Protocols`, not `text/event-stream` and announces no
    /// trailers. Runs before the first body chunk.
    pub fn start(&mut self, request: &RequestHeader, response: &ResponseHeader) {
        self.on = ends_on_its_own(request) && !streams(response);
        self.remaining = response
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse().ok());
    }

    /// Runs on every body chunk, in order, with `end_of_stream` set on the last. Leaves `body`
    /// as it is when off, or when nothing is held and the chunk is the whole rest of the body or
    /// already [`HELD_AT_MOST`] long (no copy). Otherwise takes the chunk, and puts back in
    /// `body` everything held once the response ends (the end of the stream, or the last byte
    /// of its `Content-Length`) or [`HELD_AT_MOST`] is reached, else `None` (pingora writes
    /// nothing for it).
    pub fn filter(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        if !self.on {
            return;
        }
        let mut end_of_stream = end_of_stream;
        if let (Some(remaining), Some(chunk)) = (self.remaining.as_mut(), body.as_ref()) {
            *remaining = remaining.saturating_sub(chunk.len() as u64);
            end_of_stream |= *remaining == 0;
        }
        if let Some(chunk) = body.take() {
            if self.held.is_empty() && (end_of_stream || chunk.len() >= HELD_AT_MOST) {
                *body = Some(chunk);
                return;
            }
            self.held.extend_from_slice(&chunk);
        }
        if end_of_stream || self.held.len() >= HELD_AT_MOST {
            *body = self.take();
        }
    }

    /// Everything held, if anything (for trailers that arrive after a held chunk); afterwards
    /// nothing is held.
    pub fn take(&mut self) -> Option<Bytes> {
        (!self.held.is_empty()).then(|| self.held.split().freeze())
    }
}

/// Whether the request's response ends by itself soon after the upstream starts it: not a watch
/// or a followed log ([`crate::streams::long_lived`]), not an upgrade, and no `proxy` path
/// segment (`pods/‹name›/proxy`, `services/‹name›/proxy`, `nodes/‹name›/proxy`, which carry
/// whatever the workload sends).
fn ends_on_its_own(request: &RequestHeader) -> bool {
    !crate::streams::long_lived(request)
        && !request.headers.contains_key(http::header::UPGRADE)
        && !request.uri.path().split('/').any(|segment| segment == "proxy")
}

/// Whether the response's header says its body is a stream of its own or has trailers.
fn streams(response: &ResponseHeader) -> bool {
    response.status == http::StatusCode::SWITCHING_PROTOCOLS
        || response.headers.contains_key(http::header::TRAILER)
        || response
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                const EVENT_STREAM: &[u8] = b"text/event-stream";
                value
                    .trim_start()
                    .as_bytes()
                    .get(..EVENT_STREAM.len())
                    .is_some_and(|prefix| prefix.eq_ignore_ascii_case(EVENT_STREAM))
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, target: &str) -> RequestHeader {
        RequestHeader::build(method, target.as_bytes(), None).unwrap()
    }

    fn response(status: u16, headers: &[(&'static str, &'static str)]) -> ResponseHeader {
        let mut response = ResponseHeader::build(status, None).unwrap();
        for (name, value) in headers {
            response.insert_header(*name, *value).unwrap();
        }
        response
    }

    fn started(target: &str) -> Coalescer {
        let mut coalescer = Coalescer::default();
        coalescer.start(
            &request("GET", target),
            &response(200, &[("content-type", "application/json")]),
        );
        coalescer
    }

    /// Feeds `chunks` (the last with end of stream) and returns what pingora would write.
    fn written(coalescer: &mut Coalescer, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut writes = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let mut body = Some(Bytes::copy_from_slice(chunk));
            coalescer.filter(&mut body, i + 1 == chunks.len());
            if let Some(body) = body {
                writes.push(body.to_vec());
            }
        }
        writes
    }

    #[test]
    fn a_list_in_small_chunks_is_written_once_at_its_end_with_every_byte_in_order() {
        let mut coalescer = started("/api/v1/namespaces/default/pods");
        let chunks: Vec<Vec<u8>> = (0..15u8).map(|i| vec![i; 4096]).collect();
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        assert_eq!(written(&mut coalescer, &refs), vec![chunks.concat()]);
        assert_eq!(coalescer.take(), None, "nothing is left held after the end");
    }

    #[test]
    fn a_long_body_goes_out_whenever_the_bound_is_reached() {
        let mut coalescer = started("/api/v1/pods");
        let chunk = vec![7u8; 24 * 1024];
        let writes = written(&mut coalescer, &[&chunk, &chunk, &chunk, &chunk, &chunk, b"end"]);
        let sizes: Vec<usize> = writes.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![3 * 24 * 1024, 2 * 24 * 1024 + 3]);
        assert!(sizes.iter().all(|size| *size <= HELD_AT_MOST + 24 * 1024));
    }

    #[test]
    fn a_single_chunk_and_a_big_chunk_pass_through_untouched() {
        let mut coalescer = started("/api/v1/namespaces/default/configmaps/one");
        assert_eq!(written(&mut coalescer, &[b"{}"]), vec![b"{}".to_vec()]);
        let big = vec![1u8; HELD_AT_MOST];
        let mut coalescer = started("/api/v1/pods");
        assert_eq!(
            written(&mut coalescer, &[&big, b"x"]),
            vec![big.clone(), b"x".to_vec()]
        );
    }

    #[test]
    fn an_empty_last_chunk_or_none_at_the_end_still_releases_what_is_held() {
        let mut coalescer = started("/api/v1/pods");
        assert_eq!(
            written(&mut coalescer, &[b"ab", b"cd", b""]),
            vec![b"abcd".to_vec()]
        );
        let mut coalescer = started("/api/v1/pods");
        let mut body = Some(Bytes::from_static(b"held"));
        coalescer.filter(&mut body, false);
        assert_eq!(body, None);
        let mut end = None;
        coalescer.filter(&mut end, true);
        assert_eq!(end, Some(Bytes::from_static(b"held")));
    }

    #[test]
    fn a_body_of_known_length_goes_out_with_its_last_byte() {
        let mut coalescer = Coalescer::default();
        let response = response(
            200,
            &[("content-type", "application/json"), ("content-length", "6")],
        );
        coalescer.start(&request("GET", "/api/v1/pods"), &response);
        let mut body = Some(Bytes::from_static(b"abc"));
        coalescer.filter(&mut body, false);
        assert_eq!(body, None);
        let mut body = Some(Bytes::from_static(b"def"));
        coalescer.filter(&mut body, false);
        assert_eq!(
            body,
            Some(Bytes::from_static(b"abcdef")),
            "not held until END_STREAM"
        );
    }

    #[test]
    fn what_is_held_when_trailers_arrive_is_taken_back() {
        let mut coalescer = started("/api/v1/pods");
        let mut body = Some(Bytes::from_static(b"partial"));
        coalescer.filter(&mut body, false);
        assert_eq!(coalescer.take(), Some(Bytes::from_static(b"partial")));
        assert_eq!(coalescer.take(), None);
    }

    #[test]
    fn streams_and_proxied_traffic_are_never_held() {
        for target in [
            "/api/v1/namespaces/default/configmaps?watch=true",
            "/api/v1/watch/namespaces/default/pods",
            "/api/v1/namespaces/default/pods/web/log?follow=true",
            "/api/v1/namespaces/default/pods/web/proxy/events",
            "/api/v1/namespaces/default/services/https:web:443/proxy/",
            "/api/v1/nodes/node-1/proxy/logs/",
        ] {
            let mut coalescer = started(target);
            assert_eq!(written(&mut coalescer, &[b"a", b"b", b"c"]).len(), 3, "{target}");
        }
        let mut upgrade = request("POST", "/api/v1/namespaces/default/pods/web/exec?command=sh");
        upgrade.insert_header("upgrade", "SPDY/3.1").unwrap();
        for (request, response) in [
            (upgrade, response(200, &[])),
            (request("GET", "/api/v1/pods"), response(101, &[])),
            (
                request("GET", "/apis/x/v1/feed"),
                response(200, &[("content-type", "Text/Event-Stream; charset=utf-8")]),
            ),
            (
                request("GET", "/apis/x/v1/rpc"),
                response(200, &[("trailer", "grpc-status")]),
            ),
        ] {
            let mut coalescer = Coalescer::default();
            coalescer.start(&request, &response);
            assert_eq!(
                written(&mut coalescer, &[b"a", b"b", b"c"]).len(),
                3,
                "{}",
                request.uri
            );
        }
    }

    #[test]
    fn without_start_every_chunk_passes_through() {
        let mut coalescer = Coalescer::default();
        assert_eq!(written(&mut coalescer, &[b"a", b"b"]).len(), 2);
    }
}
