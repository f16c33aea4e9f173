//! `metav1.Status` bodies: what API clients (kubectl, client-go) expect in an error response.

use bytes::Bytes;

/// A failure as kube-apiserver would report it. The message is generic on purpose where it
/// concerns authentication: the reason a credential was refused goes to the audit log, not to
/// the client. It is a `&'static str` on purpose too: a failure the proxy reports for an error
/// of a library (pingora, rustls, h2, I/O) is one of these fixed constants, so no context such
/// an error carries (the upstream's address, the proxy's own client certificate) can reach a
/// client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// HTTP status code.
    pub code: u16,
    /// `metav1.StatusReason`, e.g. `Unauthorized`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: &'static str,
    /// Seconds after which the client may send the same request again (`Retry-After`; client-go
    /// retries a 5xx that carries one, whatever its verb). Only for a failure that guarantees
    /// kube-apiserver did not act on the request.
    pub retry_after: Option<u32>,
}

impl Failure {
    /// 401: no usable credential.
    pub const UNAUTHORIZED: Self = Self {
        code: 401,
        reason: "Unauthorized",
        message: "Unauthorized",
        retry_after: None,
    };
    /// 400: a request the proxy cannot interpret.
    pub const BAD_REQUEST: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request's impersonation headers are malformed",
        retry_after: None,
    };
    /// 403: the caller may not impersonate.
    pub const IMPERSONATION_FORBIDDEN: Self = Self {
        code: 403,
        reason: "Forbidden",
        message: "impersonation through the impersonation proxy is not permitted for this caller",
        retry_after: None,
    };
    /// 502: kube-apiserver could not be reached.
    pub const BAD_GATEWAY: Self = Self {
        code: 502,
        reason: "ServiceUnavailable",
        message: "the Kubernetes API server could not be reached",
        retry_after: None,
    };
    /// 503: the proxy is not configured yet.
    pub const NOT_READY: Self = Self {
        code: 503,
        reason: "ServiceUnavailable",
        message: "the impersonation proxy is not ready",
        retry_after: None,
    };

    /// 500: a check the request depends on could not be made.
    pub const AUTHORIZATION_UNAVAILABLE: Self = Self {
        code: 500,
        reason: "InternalError",
        message: "the caller's permission to impersonate could not be checked",
        retry_after: None,
    };

    /// 503: kube-apiserver was reached, but the exchange with it failed before its response
    /// arrived (the connection broke, or its answer could not be read).
    pub const UPSTREAM_FAILED: Self = Self {
        code: 503,
        reason: "ServiceUnavailable",
        message: "the request to the Kubernetes API server failed",
        retry_after: None,
    };

    /// 503: kube-apiserver refused the proxy's own credentials (it answered 401 to a request the
    /// proxy sent as itself): the client's credentials were fine, and kube-apiserver did not act
    /// on the request. A replica whose pod was deleted answers this until it stops (its bound
    /// service account token is invalid from the deletion on), so the client is told to try
    /// again. An HTTP/1.1 connection is closed after the answer, so a retry may reach another
    /// replica at once; an HTTP/2 client retries on the same connection, which ends when this
    /// replica stops.
    pub const PROXY_CREDENTIALS_REFUSED: Self = Self {
        code: 503,
        reason: "ServiceUnavailable",
        message: "the Kubernetes API server refused the impersonation proxy's credentials",
        retry_after: Some(1),
    };

    /// 400: a chunk of an HTTP/1.1 `Transfer-Encoding: chunked` request body is malformed (a
    /// size that is not hexadecimal or too large, a chunk longer than its size, a line not ended
    /// by CRLF).
    pub const MALFORMED_CHUNKED_BODY: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request body's chunked encoding is malformed",
        retry_after: None,
    };
    /// 400: the trailer section after the last chunk of a chunked request body is malformed.
    pub const MALFORMED_CHUNKED_TRAILER: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the trailer section of the request body's chunked encoding is malformed",
        retry_after: None,
    };
    /// 400: the request body ended before the length its head announced.
    pub const TRUNCATED_BODY: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request body ended before its announced length",
        retry_after: None,
    };
    /// 400: the request head cannot be used as HTTP.
    pub const MALFORMED_HEAD: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request head is malformed",
        retry_after: None,
    };
    /// 400: the client's HTTP/2 stream broke the protocol or was reset.
    pub const MALFORMED_H2_STREAM: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request's HTTP/2 stream is malformed or was reset",
        retry_after: None,
    };
    /// 400: the request (its body, usually) could not be read from the client's connection.
    pub const UNREADABLE_REQUEST: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request could not be read from the connection",
        retry_after: None,
    };
    /// 408: the request body stopped arriving.
    pub const BODY_TIMED_OUT: Self = Self {
        code: 408,
        reason: "Timeout",
        message: "the request body did not arrive in time",
        retry_after: None,
    };

    /// The JSON body.
    pub fn body(&self) -> Bytes {
        status_body(self.code, self.reason, self.message)
    }
}

/// A `metav1.Status` failure body with any message (e.g. kube-apiserver's wording of a refused
/// impersonation).
pub fn status_body(code: u16, reason: &str, message: &str) -> Bytes {
    selkie_kube::status::status_body(code, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_metav1_status() {
        let body: serde_json::Value = serde_json::from_slice(&Failure::UNAUTHORIZED.body()).unwrap();
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["status"], "Failure");
        assert_eq!(body["reason"], "Unauthorized");
        assert_eq!(body["code"], 401);
    }
}
