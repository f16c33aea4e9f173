//! How a request goes upstream for an identity whose token passes through (a service account
//! reviewed by kube-apiserver's own TokenReview) and, for contrast, for an impersonated one:
//! [`resolve_nested`], [`prepare_upstream`] and [`identify_upstream`] on a real snapshot.

use std::{collections::BTreeMap, path::Path};

use selkie_filters::impersonation::headers::PreparedCache;

use super::*;
use crate::config::StaticConfig;

const PROXY_TOKEN: &str = "Bearer proxy-own-token";
const CALLER_TOKEN: &str = "Bearer service-account-token";

/// A snapshot whose upstream (unreachable) authenticates with the token file `proxy-own-token`.
fn snapshot(dir: &Path) -> Snapshot {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("token"), "proxy-own-token\n").unwrap();
    let config: StaticConfig = serde_yaml::from_str(&format!(
        "listen: 127.0.0.1:1\nupstream: {{url: https://127.0.0.1:1, caFile: {}, tokenFile: {}}}\n",
        dir.join("ca.crt").display(),
        dir.join("token").display(),
    ))
    .unwrap();
    config.snapshot().unwrap()
}

fn service_account() -> Arc<Identity> {
    Arc::new(Identity {
        user: UserInfo {
            username: "system:serviceaccount:ns:robot".into(),
            uid: Some("8d7e0f5c-0000-4000-8000-000000000001".into()),
            groups: vec!["system:serviceaccounts".into(), "system:authenticated".into()],
            extra: BTreeMap::from([(
                "authentication.kubernetes.io/credential-id".into(),
                vec!["JTI=1234".into()],
            )]),
        },
        authenticator: "kube-apiserver".into(),
        audiences: vec![],
        forwarding: Forwarding::PassThroughToken,
    })
}

fn pass_through() -> Effective {
    Effective::PassThrough(service_account(), HeaderValue::from_static(CALLER_TOKEN))
}

/// A request as a client sent it: its own token, a claimed front-proxy identity, and `headers`.
fn client_request(headers: &[(&'static str, &'static str)]) -> RequestHeader {
    let mut request = RequestHeader::build("GET", b"/api/v1/namespaces/ns/configmaps", None).unwrap();
    request
        .insert_header(header::AUTHORIZATION, CALLER_TOKEN)
        .unwrap();
    request.insert_header("x-remote-user", "system:admin").unwrap();
    for (name, value) in headers {
        request.append_header(*name, *value).unwrap();
    }
    request
}

fn requested(headers: &[(&'static str, &'static str)]) -> RequestedImpersonation {
    let mut map = http::HeaderMap::new();
    for (name, value) in headers {
        map.append(*name, HeaderValue::from_static(value));
    }
    client_credentials(&map).1.unwrap()
}

/// Steps 4 to 6 for `caller` asking for `asked` (as a forwarded request): the request as it
/// leaves for kube-apiserver.
async fn upstream_request(
    snapshot: &Snapshot,
    caller: Effective,
    asked: &[(&'static str, &'static str)],
) -> Step<RequestHeader> {
    let (effective, original, mut headers) =
        resolve_nested(snapshot, caller, &requested(asked), false).await?;
    let shared = prepare_upstream(
        &effective,
        original.is_some(),
        None,
        &PreparedCache::new(10),
        &mut headers,
    )?;
    let mut request = client_request(asked);
    identify_upstream(
        &mut request,
        &snapshot.upstream,
        Some(&effective),
        shared.as_deref().unwrap_or_default(),
        &headers,
    )
    .unwrap();
    Ok(request)
}

fn values<'a>(request: &'a RequestHeader, name: &str) -> Vec<&'a str> {
    request
        .headers
        .get_all(name)
        .iter()
        .map(|value| value.to_str().unwrap())
        .collect()
}

fn impersonation_headers_of(request: &RequestHeader) -> Vec<String> {
    request
        .headers
        .keys()
        .map(|name| name.as_str().to_string())
        .filter(|name| name.starts_with("impersonate-"))
        .collect()
}

#[tokio::test]
async fn a_passed_through_request_carries_the_callers_token_and_nothing_of_the_proxys() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = snapshot(dir.path());
    let request = upstream_request(&snapshot, pass_through(), &[])
        .await
        .ok()
        .unwrap();
    assert_eq!(values(&request, "authorization"), vec![CALLER_TOKEN]);
    assert!(impersonation_headers_of(&request).is_empty(), "{request:?}");
    assert!(values(&request, "x-remote-user").is_empty());
}

#[tokio::test]
async fn an_impersonated_request_carries_the_proxys_token_and_the_users_headers() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = snapshot(dir.path());
    let alice = Arc::new(Identity {
        user: UserInfo {
            username: "alice".into(),
            groups: vec!["devs".into()],
            ..UserInfo::default()
        },
        authenticator: "kube-apiserver".into(),
        audiences: vec![],
        forwarding: Forwarding::Impersonate,
    });
    let request = upstream_request(&snapshot, Effective::Impersonate(alice), &[])
        .await
        .ok()
        .unwrap();
    assert_eq!(values(&request, "authorization"), vec![PROXY_TOKEN]);
    assert_eq!(values(&request, "impersonate-user"), vec!["alice"]);
    assert_eq!(values(&request, "impersonate-group"), vec!["devs"]);
    assert!(values(&request, "x-remote-user").is_empty());
}

#[tokio::test]
async fn a_passed_through_caller_asking_for_impersonation_asks_kube_apiserver_with_its_own_token() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = snapshot(dir.path());
    // Nothing is reviewed by the proxy (its upstream is unreachable): kube-apiserver decides,
    // with the caller's token, against the caller's RBAC.
    let asked = [
        ("impersonate-user", "system:admin"),
        ("impersonate-group", "system:masters"),
    ];
    let request = upstream_request(&snapshot, pass_through(), &asked)
        .await
        .ok()
        .unwrap();
    assert_eq!(
        values(&request, "authorization"),
        vec![CALLER_TOKEN],
        "never the proxy's credential"
    );
    assert_eq!(values(&request, "impersonate-user"), vec!["system:admin"]);
    assert_eq!(values(&request, "impersonate-group"), vec!["system:masters"]);
    assert_eq!(impersonation_headers_of(&request).len(), 2, "{request:?}");
}

#[tokio::test]
async fn a_passed_through_caller_asking_for_impersonation_of_a_local_answer_is_checked_by_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = snapshot(dir.path());
    // A WhoAmIRequest answered by the proxy never reaches kube-apiserver: the proxy checks the
    // impersonation itself, and fails closed when it cannot.
    let asked = requested(&[("impersonate-user", "system:admin")]);
    let Err(refusal) = resolve_nested(&snapshot, pass_through(), &asked, true).await else {
        panic!("an unchecked impersonation was allowed")
    };
    assert_eq!(refusal.code, Failure::AUTHORIZATION_UNAVAILABLE.code);

    // Without impersonation, a local answer is about the caller itself.
    let Ok((Effective::PassThrough(identity, _), None, headers)) =
        resolve_nested(&snapshot, pass_through(), &requested(&[]), true).await
    else {
        panic!("the caller changed")
    };
    assert_eq!(identity.user.username, "system:serviceaccount:ns:robot");
    assert!(headers.is_empty());
}

/// kube-apiserver's 401 to a request the proxy sent as itself refuses the proxy (its token was
/// invalidated, say), not the caller: it becomes the proxy's own failure, a 503 the client may
/// retry. A 401 to a passed-through token is the caller's and goes back as it is, as does every
/// other answer.
#[test]
fn a_401_to_the_proxys_own_credential_is_the_proxys_failure_and_to_a_passed_through_token_the_callers() {
    let dir = tempfile::tempdir().unwrap();
    let service = ImpersonationProxy::new(
        Arc::new(ArcSwap::from_pointee(snapshot(dir.path()))),
        Metrics::new(&mut prometheus_client::registry::Registry::default()),
    );
    let answered = |effective: Effective, status: http::StatusCode| {
        let mut ctx = service.new_context();
        ctx.effective = Some(effective);
        service.answered(status, &ctx)
    };
    for effective in [Effective::Impersonate(service_account()), Effective::Anonymous] {
        let error = answered(effective, http::StatusCode::UNAUTHORIZED).unwrap_err();
        let failure = failure_of(&error);
        assert_eq!(failure, Failure::PROXY_CREDENTIALS_REFUSED);
        assert_eq!((failure.code, failure.retry_after), (503, Some(1)));
        // What the log gets names the cause, not any credential.
        assert!(!root_detail(&error).contains("proxy-own-token"));
    }
    assert!(answered(pass_through(), http::StatusCode::UNAUTHORIZED).is_ok());
    for status in [
        http::StatusCode::OK,
        http::StatusCode::SWITCHING_PROTOCOLS,
        http::StatusCode::FORBIDDEN,
        http::StatusCode::SERVICE_UNAVAILABLE,
    ] {
        assert!(answered(Effective::Impersonate(service_account()), status).is_ok());
    }
}
