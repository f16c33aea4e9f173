//! `metav1.Status`: the body every Kubernetes API server answers a failure with, which kubectl and
//! client-go read the reason and message from.

use bytes::Bytes;

/// A `metav1.Status` failure body: `kind` `Status`, `apiVersion` `v1`, `status` `Failure`,
/// `reason` (a `metav1.StatusReason` such as `Unauthorized`), `message`, `code`, and empty
/// `metadata` and `details`.
pub fn status_body(code: u16, reason: &str, message: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": {},
            "code": code,
        })
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_metav1_status() {
        let body: serde_json::Value =
            serde_json::from_slice(&status_body(401, "Unauthorized", "Unauthorized")).unwrap();
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["status"], "Failure");
        assert_eq!(body["reason"], "Unauthorized");
        assert_eq!(body["message"], "Unauthorized");
        assert_eq!(body["code"], 401);
    }
}
