//! `metav1.Status` bodies: what API clients (kubectl, client-go) expect in an error response.

use bytes::Bytes;

/// A failure as kube-apiserver would report it. The message is generic on purpose where it
/// concerns authentication: the reason a credential was refused goes to the audit log, not to
/// the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// HTTP status code.
    pub code: u16,
    /// `metav1.StatusReason`, e.g. `Unauthorized`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: &'static str,
}

impl Failure {
    /// 401: no usable credential.
    pub const UNAUTHORIZED: Self = Self {
        code: 401,
        reason: "Unauthorized",
        message: "Unauthorized",
    };
    /// 400: a request the proxy cannot interpret.
    pub const BAD_REQUEST: Self = Self {
        code: 400,
        reason: "BadRequest",
        message: "the request's impersonation headers are malformed",
    };
    /// 403: the caller may not impersonate.
    pub const IMPERSONATION_FORBIDDEN: Self = Self {
        code: 403,
        reason: "Forbidden",
        message: "impersonation through the impersonation proxy is not permitted for this caller",
    };
    /// 502: kube-apiserver could not be reached.
    pub const BAD_GATEWAY: Self = Self {
        code: 502,
        reason: "ServiceUnavailable",
        message: "the Kubernetes API server could not be reached",
    };
    /// 503: the proxy is not configured yet.
    pub const NOT_READY: Self = Self {
        code: 503,
        reason: "ServiceUnavailable",
        message: "the impersonation proxy is not ready",
    };

    /// 500: a check the request depends on could not be made.
    pub const AUTHORIZATION_UNAVAILABLE: Self = Self {
        code: 500,
        reason: "InternalError",
        message: "the caller's permission to impersonate could not be checked",
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
