//! Unit tests of the TokenReview client's logic against a scripted HTTPS endpoint. The real
//! kube-apiserver as endpoint is exercised in `e2e/`.

use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::test_util::Endpoint;

/// What the scripted endpoint does with one request body.
type Script = Arc<dyn Fn(&Value) -> (StatusCode, String) + Send + Sync>;

async fn endpoint(script: Script) -> Endpoint {
    crate::test_util::endpoint(Arc::new(move |_path: &str, body: &Value| script(body))).await
}

fn authenticator(
    endpoint: &Endpoint,
    configure: impl FnOnce(&mut TokenReviewConfig),
) -> TokenReviewAuthenticator {
    let mut config = TokenReviewConfig::new("test-webhook", format!("{}/review", endpoint.base_url));
    config.ca_bundle_pem = Some(endpoint.ca_pem.clone());
    config.timeout = Duration::from_secs(2);
    configure(&mut config);
    TokenReviewAuthenticator::new(config).unwrap()
}

fn accepts_only(version: &'static str, user: Value) -> Script {
    Arc::new(move |body| {
        if body["apiVersion"] != version {
            return (StatusCode::BAD_REQUEST, "wrong version".into());
        }
        let authenticated = body["spec"]["token"] == "good";
        let status = if authenticated {
            json!({"authenticated": true, "user": user})
        } else {
            json!({})
        };
        (
            StatusCode::OK,
            json!({"apiVersion": version, "kind": "TokenReview", "status": status}).to_string(),
        )
    })
}

fn username(outcome: &Outcome) -> Option<&str> {
    match outcome {
        Outcome::Authenticated(identity) => Some(&identity.user.username),
        _ => None,
    }
}

#[tokio::test]
async fn auto_speaks_v1beta1_to_a_pinniped_style_webhook() {
    let user = json!({"username": "alice", "groups": ["devs"], "extra": {"k": ["v"]}});
    let endpoint = endpoint(accepts_only("authentication.k8s.io/v1beta1", user)).await;
    let webhook = authenticator(&endpoint, |_| {});
    let outcome = webhook.authenticate("good").await;
    let Outcome::Authenticated(identity) = outcome else {
        panic!("expected success, got {outcome:?}")
    };
    assert_eq!(identity.user.username, "alice");
    assert_eq!(identity.user.groups, vec!["devs"]);
    assert_eq!(identity.user.extra.get("k"), Some(&vec!["v".to_string()]));
    assert_eq!(identity.user.uid, None);
    assert_eq!(&*identity.authenticator, "test-webhook");
    assert_eq!(
        webhook.authenticate("bad").await,
        Outcome::Rejected(RejectReason::NotAuthenticated)
    );
}

#[tokio::test]
async fn auto_switches_to_v1_once_when_v1beta1_is_refused() {
    let endpoint = endpoint(accepts_only(
        "authentication.k8s.io/v1",
        json!({"username": "bob"}),
    ))
    .await;
    let webhook = authenticator(&endpoint, |c| c.cache.positive_ttl = Duration::ZERO);
    assert_eq!(username(&webhook.authenticate("good").await), Some("bob"));
    assert_eq!(endpoint.hits(), 2, "one refused v1beta1 request, then v1");
    assert_eq!(username(&webhook.authenticate("good").await), Some("bob"));
    assert_eq!(endpoint.hits(), 3, "v1 is remembered");
}

#[tokio::test]
async fn uid_identities_pass_through_only_when_configured() {
    let user = json!({"username": "system:serviceaccount:ns:sa", "uid": "1234"});
    let endpoint = endpoint(accepts_only("authentication.k8s.io/v1", user)).await;
    let webhook = authenticator(&endpoint, |c| c.version = ReviewVersion::V1);
    let apiserver = authenticator(&endpoint, |c| {
        c.version = ReviewVersion::V1;
        c.uid_handling = UidHandling::PassThroughToken;
    });
    let Outcome::Authenticated(impersonated) = webhook.authenticate("good").await else {
        panic!()
    };
    assert_eq!(impersonated.forwarding, Forwarding::Impersonate);
    assert_eq!(impersonated.user.uid.as_deref(), Some("1234"));
    let Outcome::Authenticated(passed) = apiserver.authenticate("good").await else {
        panic!()
    };
    assert_eq!(passed.forwarding, Forwarding::PassThroughToken);
}

#[tokio::test]
async fn garbage_errors_and_empty_users_are_refused_and_failures_are_not_cached() {
    let cases: Vec<(Script, RejectReason)> = vec![
        (
            Arc::new(|_| (StatusCode::OK, "not json".into())),
            RejectReason::UpstreamUnavailable,
        ),
        (
            Arc::new(|_| (StatusCode::OK, r#"{"status": {"authenticated": "yes"}}"#.into())),
            RejectReason::UpstreamUnavailable,
        ),
        (
            Arc::new(|_| {
                (
                    StatusCode::OK,
                    r#"{"status": {"authenticated": true, "user": {"groups": 7}}}"#.into(),
                )
            }),
            RejectReason::UpstreamUnavailable,
        ),
        (
            Arc::new(|_| (StatusCode::INTERNAL_SERVER_ERROR, "boom".into())),
            RejectReason::UpstreamUnavailable,
        ),
        (
            Arc::new(|_| {
                (
                    StatusCode::OK,
                    r#"{"status": {"authenticated": true, "user": {"username": ""}}}"#.into(),
                )
            }),
            RejectReason::EmptyUsername,
        ),
        (
            Arc::new(|_| (StatusCode::OK, r#"{"status": {"authenticated": true}}"#.into())),
            RejectReason::EmptyUsername,
        ),
        (
            Arc::new(|_| (StatusCode::OK, "x".repeat(MAX_RESPONSE_BYTES + 1))),
            RejectReason::UpstreamUnavailable,
        ),
    ];
    for (script, reason) in cases {
        let endpoint = endpoint(script).await;
        let webhook = authenticator(&endpoint, |c| c.version = ReviewVersion::V1);
        assert_eq!(webhook.authenticate("t").await, Outcome::Rejected(reason));
        webhook.authenticate("t").await;
        let expected_hits = if reason.is_cacheable() { 1 } else { 2 };
        assert_eq!(endpoint.hits(), expected_hits, "caching of {reason}");
    }
}

#[tokio::test]
async fn a_hanging_endpoint_is_refused_after_the_timeout() {
    let url = format!("{}/review", crate::test_util::hanging_endpoint().await);
    let mut config = TokenReviewConfig::new("hang", url);
    config.ca_bundle_pem = Some(crate::test_util::unrelated_ca_pem());
    config.timeout = Duration::from_millis(300);
    let webhook = TokenReviewAuthenticator::new(config).unwrap();
    assert_eq!(
        webhook.authenticate("t").await,
        Outcome::Rejected(RejectReason::UpstreamUnavailable)
    );
}

#[test]
fn invalid_configurations_are_refused_up_front() {
    crate::test_util::install_provider();
    let cases = [
        ("http://127.0.0.1/review", None, "must use https"),
        ("not a url at all", None, "not a valid URL"),
        ("https://127.0.0.1/review", Some("garbage"), "no certificate"),
        (
            "https://127.0.0.1/review",
            Some("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
            "CA bundle",
        ),
    ];
    for (endpoint, ca, expected) in cases {
        let mut config = TokenReviewConfig::new("w", endpoint);
        config.ca_bundle_pem = ca.map(str::to_string);
        let error = TokenReviewAuthenticator::new(config)
            .expect_err(endpoint)
            .to_string();
        assert!(error.contains(expected), "{endpoint}: {error}");
    }
}

#[test]
fn credentials_never_show_in_debug_output() {
    let auth = ClientAuth::BearerToken("secret-token".into());
    assert!(!format!("{auth:?}").contains("secret-token"));
    let auth = ClientAuth::Certificate {
        cert_pem: "CERT".into(),
        key_pem: "KEY".into(),
    };
    assert!(!format!("{auth:?}").contains("KEY"));

    crate::test_util::install_provider();
    let dir = crate::https::tests::TempDir::new();
    let path = dir.0.join("token");
    std::fs::write(&path, "secret-token").unwrap();
    let file = Arc::new(crate::https::TokenFile::open(path).unwrap());
    let mut config = TokenReviewConfig::new("kube-apiserver", "https://127.0.0.1:1/review");
    config.client_auth = ClientAuth::BearerTokenSource(file);
    assert!(!format!("{config:?}").contains("secret-token"));
    let authenticator = TokenReviewAuthenticator::new(config).unwrap();
    assert!(!format!("{authenticator:?}").contains("secret-token"));
}

/// An endpoint accepting every token and recording the `Authorization` header of each review.
async fn recording_endpoint() -> (Endpoint, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let endpoint = crate::test_util::endpoint_seeing_headers(Arc::new(move |_path, headers, body| {
        let authorization = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_string();
        record.lock().unwrap().push(authorization);
        let user = json!({"username": body["spec"]["token"], "uid": "1"});
        (
            StatusCode::OK,
            json!({"status": {"authenticated": true, "user": user}}).to_string(),
        )
    }))
    .await;
    (endpoint, seen)
}

#[tokio::test]
async fn a_rotated_token_file_is_used_from_the_next_review_on() {
    let (endpoint, seen) = recording_endpoint().await;
    let dir = crate::https::tests::TempDir::new();
    let path = dir.0.join("token");
    let age = Duration::ZERO;
    crate::https::tests::rewrite(&path, "proxy-token-1\n", age);
    let file = Arc::new(crate::https::TokenFile::open(path.clone()).unwrap());
    let reviewer = authenticator(&endpoint, |c| {
        c.version = ReviewVersion::V1;
        c.uid_handling = UidHandling::PassThroughToken;
        c.client_auth = ClientAuth::BearerTokenSource(file.clone());
    });

    assert_eq!(
        username(&reviewer.authenticate("caller-a").await),
        Some("caller-a")
    );
    // The kubelet rotates the projected token: the next review presents the new one, with no
    // refresh by anyone else in between.
    crate::https::tests::rewrite(&path, "proxy-token-2", Duration::from_secs(10));
    assert_eq!(
        username(&reviewer.authenticate("caller-b").await),
        Some("caller-b")
    );
    // A cached answer sends nothing.
    assert_eq!(
        username(&reviewer.authenticate("caller-b").await),
        Some("caller-b")
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["Bearer proxy-token-1", "Bearer proxy-token-2"]
    );
}

#[tokio::test]
async fn a_token_source_without_a_token_fails_closed_without_sending() {
    struct Revocable(std::sync::Mutex<Option<&'static str>>);
    impl BearerTokenSource for Revocable {
        fn authorization(&self) -> Option<http::HeaderValue> {
            let token = (*self.0.lock().unwrap())?;
            let mut value = http::HeaderValue::try_from(format!("Bearer {token}")).ok()?;
            value.set_sensitive(true);
            Some(value)
        }
    }
    let (endpoint, seen) = recording_endpoint().await;
    let source = Arc::new(Revocable(std::sync::Mutex::new(None)));
    let reviewer = authenticator(&endpoint, |c| {
        c.version = ReviewVersion::V1;
        c.client_auth = ClientAuth::BearerTokenSource(source.clone());
    });
    assert_eq!(
        reviewer.authenticate("caller").await,
        Outcome::Rejected(RejectReason::UpstreamUnavailable)
    );
    assert_eq!(endpoint.hits(), 0, "nothing sent without a credential");
    *source.0.lock().unwrap() = Some("now");
    assert_eq!(
        username(&reviewer.authenticate("caller").await),
        Some("caller"),
        "the failure was not cached"
    );
    assert_eq!(*seen.lock().unwrap(), vec!["Bearer now"]);
}

#[test]
fn a_malformed_answer_is_described_without_its_values() {
    let answer = br#"{"apiVersion":"authentication.k8s.io/v1","status":{"authenticated":"s3cr3t-t0ken"}}"#;
    let Err(error) = serde_json::from_slice::<ReviewResponse>(answer) else {
        panic!("a string where a boolean belongs parses")
    };
    assert!(
        error.to_string().contains("s3cr3t-t0ken"),
        "serde quotes it: {error}"
    );
    let described = selkie_api::json::error_without_values(&error);
    assert!(!described.contains("s3cr3t"), "{described}");
    assert!(
        described.starts_with("JSON of the wrong shape at line 1 column"),
        "{described}"
    );
    let Err(truncated) = serde_json::from_slice::<ReviewResponse>(b"{\"status\":") else {
        panic!("a truncated answer parses")
    };
    assert!(selkie_api::json::error_without_values(&truncated).starts_with("truncated JSON"));
}
