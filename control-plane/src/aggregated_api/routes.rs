//! The aggregated API's routes: discovery (legacy and aggregated v2), health, OpenAPI (all from
//! selkie-kube's aggregated-API kit), and the two create-only resources. Every error is a
//! `metav1.Status`.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use selkie_api::{identity::WhoAmIRequest, login::TokenCredentialRequest};
use selkie_filters::{identity::UserInfo, issuing::login_api::ConciergeApi as _};
use selkie_kube::aggregated::{
    created, json_response, method_not_allowed, not_acceptable, not_found, read_object, ApiResource,
    Discovery,
};
pub use selkie_kube::aggregated::{status, Body, MAX_BODY_BYTES};
use serde_json::json;

use crate::{config::ControlPlaneConfig, published::Publisher};

/// The only version served.
pub const VERSION: &str = "v1alpha1";

/// The routes of one installation (its group suffix), with precomputed discovery documents.
#[derive(Debug)]
pub struct Routes {
    login_group: String,
    /// `authentication.concierge.<suffix>`: the group a TokenCredentialRequest's authenticator
    /// reference must name.
    authenticator_group: String,
    identity_group: String,
    discovery: Discovery,
}

/// What a request needs besides itself.
pub struct Context<'a> {
    /// The published chain and login API.
    pub publisher: &'a Publisher,
    /// Whether the server is ready (certificate and authentication settings loaded).
    pub ready: bool,
}

impl Routes {
    /// The routes for `config`'s group suffix.
    pub fn new(config: &ControlPlaneConfig) -> Self {
        let login_group = config.group(selkie_api::login::GROUP);
        let identity_group = config.group("identity.concierge.pinniped.dev");
        let discovery = Discovery::new(&[
            ApiResource {
                group: login_group.clone(),
                version: VERSION,
                plural: "tokencredentialrequests",
                singular: "tokencredentialrequest",
                kind: "TokenCredentialRequest",
                // Pinniped's list is a no-op that returns an empty list.
                verbs: &["create", "list"],
                namespaced: false,
            },
            ApiResource {
                group: identity_group.clone(),
                version: VERSION,
                plural: "whoamirequests",
                singular: "whoamirequest",
                kind: "WhoAmIRequest",
                verbs: &["create"],
                namespaced: false,
            },
        ]);
        Self {
            login_group,
            authenticator_group: config.group(selkie_api::authentication::GROUP),
            identity_group,
            discovery,
        }
    }

    /// The login group, `login.concierge.<suffix>`.
    pub fn login_group(&self) -> &str {
        &self.login_group
    }

    /// The identity group, `identity.concierge.<suffix>`.
    pub fn identity_group(&self) -> &str {
        &self.identity_group
    }

    /// Answers `request` from `caller` (authenticated by the connection's certificate and, for
    /// the front proxy, its headers). Never fails: errors are `metav1.Status` responses.
    pub async fn handle<B>(
        &self,
        context: Context<'_>,
        request: Request<B>,
        caller: UserInfo,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request.uri().path().to_string();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let method = request.method().clone();
        let get = method == Method::GET || method == Method::HEAD;
        if let Some(response) = self.discovery.answer_shared(
            &segments,
            &method,
            request.headers(),
            context.ready,
            "Selkie Concierge aggregated API",
        ) {
            return response;
        }
        match segments.as_slice() {
            ["apis", group, VERSION, "tokencredentialrequests"] if *group == self.login_group => {
                if let Some(refusal) = not_acceptable(request.headers()) {
                    return refusal;
                }
                if method == Method::POST {
                    self.token_credential_request(&context, request).await
                } else if get {
                    let list = json!({"kind": "TokenCredentialRequestList",
                        "apiVersion": format!("{}/{VERSION}", self.login_group),
                        "metadata": {}, "items": []});
                    json_response(StatusCode::OK, "application/json", Bytes::from(list.to_string()))
                } else {
                    method_not_allowed()
                }
            }
            ["apis", group, VERSION, "whoamirequests"] if *group == self.identity_group => {
                if let Some(refusal) = not_acceptable(request.headers()) {
                    return refusal;
                }
                if method == Method::POST {
                    self.who_am_i(request, &caller).await
                } else {
                    method_not_allowed()
                }
            }
            _ => not_found(),
        }
    }

    async fn token_credential_request<B>(&self, context: &Context<'_>, request: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let api_version = format!("{}/{VERSION}", self.login_group);
        let mut tcr: TokenCredentialRequest =
            match read_object(request, &api_version, "TokenCredentialRequest").await {
                Ok(object) => object,
                Err(refusal) => return *refusal,
            };
        tcr.api_version = api_version;
        tcr.kind = "TokenCredentialRequest".into();
        let published = context.publisher.current();
        let answer = context
            .publisher
            .login_api()
            .token_credential_request(&published.chain, &self.authenticator_group, tcr)
            .await;
        created(&answer)
    }

    async fn who_am_i<B>(&self, request: Request<B>, caller: &UserInfo) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let api_version = format!("{}/{VERSION}", self.identity_group);
        let mut whoami: WhoAmIRequest = match read_object(request, &api_version, "WhoAmIRequest").await {
            Ok(object) => object,
            Err(refusal) => return *refusal,
        };
        whoami.api_version = api_version;
        whoami.kind = "WhoAmIRequest".into();
        created(&selkie_filters::issuing::login_api::who_am_i(whoami, caller))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::{header, HeaderMap, HeaderValue};
    use http_body_util::BodyExt as _;
    use selkie_filters::issuing::signer::ClientCertificateSigner;
    use selkie_kube::aggregated::{DISCOVERY_V2, DISCOVERY_V2BETA1};
    use serde_json::Value;

    use super::*;

    fn routes() -> (ControlPlaneConfig, Routes) {
        let config: ControlPlaneConfig = serde_yaml::from_str("apiGroupSuffix: acme.example.com").unwrap();
        let routes = Routes::new(&config);
        (config, routes)
    }

    async fn call(
        routes: &Routes,
        _config: &ControlPlaneConfig,
        publisher: &Publisher,
        request: Request<Body>,
    ) -> (StatusCode, HeaderMap, Value) {
        let context = Context {
            publisher,
            ready: true,
        };
        let caller = UserInfo {
            username: "alice".into(),
            groups: vec!["ops".into(), "system:authenticated".into()],
            ..UserInfo::default()
        };
        let response = routes.handle(context, request, caller).await;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (parts.status, parts.headers, value)
    }

    fn request(method: Method, path: &str, body: &str) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::new(Bytes::from(body.to_string())))
            .unwrap()
    }

    const TCR: &str = "/apis/login.concierge.acme.example.com/v1alpha1/tokencredentialrequests";
    const WHOAMI: &str = "/apis/identity.concierge.acme.example.com/v1alpha1/whoamirequests";

    #[tokio::test]
    async fn legacy_discovery_names_both_groups_with_the_suffix() {
        let (config, routes) = routes();
        let publisher = Publisher::new();
        let (code, _, groups) = call(&routes, &config, &publisher, request(Method::GET, "/apis", "")).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(groups["kind"], "APIGroupList");
        assert_eq!(groups["groups"][0]["name"], "login.concierge.acme.example.com");
        assert_eq!(
            groups["groups"][1]["preferredVersion"]["groupVersion"],
            "identity.concierge.acme.example.com/v1alpha1"
        );
        let (code, _, list) = call(
            &routes,
            &config,
            &publisher,
            request(Method::GET, "/apis/login.concierge.acme.example.com/v1alpha1", ""),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(list["resources"][0]["name"], "tokencredentialrequests");
        assert_eq!(list["resources"][0]["namespaced"], false);
        assert_eq!(list["resources"][0]["verbs"], json!(["create", "list"]));
        let (_, _, list) = call(
            &routes,
            &config,
            &publisher,
            request(
                Method::GET,
                "/apis/identity.concierge.acme.example.com/v1alpha1",
                "",
            ),
        )
        .await;
        assert_eq!(list["resources"][0]["kind"], "WhoAmIRequest");
        assert_eq!(list["resources"][0]["verbs"], json!(["create"]));
        let (code, _, group) = call(
            &routes,
            &config,
            &publisher,
            request(Method::GET, "/apis/identity.concierge.acme.example.com", ""),
        )
        .await;
        assert_eq!((code, group["kind"].as_str()), (StatusCode::OK, Some("APIGroup")));
        let (code, _, _) = call(
            &routes,
            &config,
            &publisher,
            request(Method::GET, "/apis/login.concierge.pinniped.dev/v1alpha1", ""),
        )
        .await;
        assert_eq!(
            code,
            StatusCode::NOT_FOUND,
            "the default group is not served under another suffix"
        );
    }

    #[tokio::test]
    async fn aggregated_discovery_is_served_as_the_aggregator_asks_with_an_etag() {
        let (config, routes) = routes();
        let publisher = Publisher::new();
        // What kube-apiserver 1.35's aggregator sends.
        let mut get = request(Method::GET, "/apis", "");
        get.headers_mut().insert(
            header::ACCEPT,
            HeaderValue::from_str(&format!("{DISCOVERY_V2},{DISCOVERY_V2BETA1}")).unwrap(),
        );
        let (code, headers, document) = call(&routes, &config, &publisher, get).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], DISCOVERY_V2);
        assert_eq!(document["apiVersion"], "apidiscovery.k8s.io/v2");
        assert_eq!(
            document["items"][0]["metadata"]["name"],
            "login.concierge.acme.example.com"
        );
        let resource = &document["items"][0]["versions"][0]["resources"][0];
        assert_eq!(resource["scope"], "Cluster");
        assert_eq!(resource["responseKind"]["kind"], "TokenCredentialRequest");
        assert_eq!(
            document["items"][1]["versions"][0]["resources"][0]["verbs"],
            json!(["create"])
        );

        let mut again = request(Method::GET, "/apis", "");
        again
            .headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static(DISCOVERY_V2BETA1));
        again
            .headers_mut()
            .insert(header::IF_NONE_MATCH, headers[header::ETAG].clone());
        let (code, _, _) = call(&routes, &config, &publisher, again).await;
        assert_eq!(code, StatusCode::NOT_MODIFIED);
        let mut beta = request(Method::GET, "/apis", "");
        beta.headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static(DISCOVERY_V2BETA1));
        let (_, headers, document) = call(&routes, &config, &publisher, beta).await;
        assert_eq!(headers[header::CONTENT_TYPE], DISCOVERY_V2BETA1);
        assert_eq!(document["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    }

    /// Held by every test that reaches the audit event's callsite. tracing caches a callsite's
    /// interest globally; a registration racing on another thread with the capture test's
    /// `set_default` could cache "never" after the capture test rebuilt the cache, and its audit
    /// line would be lost. In this binary only these tests reach that callsite.
    static AUDIT_CALLSITE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn token_credential_requests_are_answered_201_even_when_they_fail() {
        let _audit = AUDIT_CALLSITE.lock().await;
        let (config, routes) = routes();
        let publisher = Publisher::new();
        let ca =
            selkie_kube::certs::generate_ca("test signer", std::time::Duration::from_secs(3600)).unwrap();
        publisher.login_api().set_signer(Some(Arc::new(
            ClientCertificateSigner::from_pem(&ca.cert_pem, &ca.key_pem).unwrap(),
        )));
        let body = json!({"apiVersion": "login.concierge.acme.example.com/v1alpha1", "kind": "TokenCredentialRequest",
            "spec": {"token": "secret-token", "authenticator": {"kind": "JWTAuthenticator", "name": "nobody"}}});
        let (code, _, answer) = call(
            &routes,
            &config,
            &publisher,
            request(Method::POST, TCR, &body.to_string()),
        )
        .await;
        assert_eq!(code, StatusCode::CREATED);
        assert_eq!(answer["status"]["message"], "authentication failed");
        assert!(!answer.to_string().contains("secret-token"));
        // The no-op list.
        let (code, _, list) = call(&routes, &config, &publisher, request(Method::GET, TCR, "")).await;
        assert_eq!((code, list["items"].clone()), (StatusCode::OK, json!([])));
    }

    #[tokio::test]
    async fn who_am_i_reports_the_caller() {
        let (config, routes) = routes();
        let publisher = Publisher::new();
        let (code, _, answer) = call(&routes, &config, &publisher, request(Method::POST, WHOAMI, "{}")).await;
        assert_eq!(code, StatusCode::CREATED);
        assert_eq!(answer["kind"], "WhoAmIRequest");
        assert_eq!(
            answer["apiVersion"],
            "identity.concierge.acme.example.com/v1alpha1"
        );
        assert_eq!(
            answer["status"]["kubernetesUserInfo"]["user"]["username"],
            "alice"
        );
        assert_eq!(
            answer["status"]["kubernetesUserInfo"]["user"]["groups"],
            json!(["ops", "system:authenticated"])
        );
    }

    #[tokio::test]
    async fn bad_requests_get_precise_statuses_that_never_quote_the_body() {
        let (config, routes) = routes();
        let publisher = Publisher::new();
        let cases: Vec<(Request<Body>, StatusCode, &str)> = vec![
            (request(Method::POST, TCR, "{not json secret-token"), StatusCode::BAD_REQUEST, "BadRequest"),
            (request(Method::POST, TCR, r#"{"spec": "secret-token"}"#), StatusCode::BAD_REQUEST, "BadRequest"),
            (request(Method::POST, TCR, "[]"), StatusCode::BAD_REQUEST, "BadRequest"),
            (request(Method::POST, TCR, r#"{"kind": "WhoAmIRequest"}"#), StatusCode::BAD_REQUEST, "BadRequest"),
            (request(Method::POST, TCR, r#"{"apiVersion": "login.concierge.pinniped.dev/v1alpha1"}"#), StatusCode::BAD_REQUEST, "BadRequest"),
            (request(Method::POST, WHOAMI, r#"{"kind": 5}"#), StatusCode::BAD_REQUEST, "BadRequest"),
            (request(Method::DELETE, TCR, ""), StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            (request(Method::GET, WHOAMI, ""), StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            (request(Method::POST, "/apis", ""), StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            (request(Method::POST, "/apis/login.concierge.acme.example.com/v1alpha1/namespaces/default/tokencredentialrequests", "{}"), StatusCode::NOT_FOUND, "NotFound"),
            (request(Method::GET, "/apis/login.concierge.acme.example.com/v1alpha1/tokencredentialrequests/x", ""), StatusCode::NOT_FOUND, "NotFound"),
            (request(Method::GET, "/api/v1/pods", ""), StatusCode::NOT_FOUND, "NotFound"),
            (request(Method::POST, TCR, &"x".repeat(MAX_BODY_BYTES + 1)), StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
        ];
        for (request, expected, reason) in cases {
            let what = format!("{} {}", request.method(), request.uri());
            let (code, _, status) = call(&routes, &config, &publisher, request).await;
            assert_eq!(code, expected, "{what}: {status}");
            assert_eq!(status["kind"], "Status", "{what}");
            assert_eq!(status["reason"], reason, "{what}");
            assert_eq!(status["code"], expected.as_u16(), "{what}");
            assert!(!status.to_string().contains("secret-token"), "{what}: {status}");
        }

        let mut protobuf = request(Method::POST, TCR, "{}");
        protobuf.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf"),
        );
        let (code, _, status) = call(&routes, &config, &publisher, protobuf).await;
        assert_eq!(
            (code, status["reason"].as_str()),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("UnsupportedMediaType"))
        );
        let mut accept = request(Method::POST, TCR, "{}");
        accept.headers_mut().insert(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf"),
        );
        let (code, _, _) = call(&routes, &config, &publisher, accept).await;
        assert_eq!(code, StatusCode::NOT_ACCEPTABLE);

        // YAML bodies are read too.
        let mut yaml = request(Method::POST, WHOAMI, "kind: WhoAmIRequest\nspec: {}\n");
        yaml.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/yaml"));
        let (code, _, _) = call(&routes, &config, &publisher, yaml).await;
        assert_eq!(code, StatusCode::CREATED);
    }

    /// Records every event as `target field=value …` lines.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<String>>);

    impl tracing::Subscriber for Captured {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut line = format!("{} ", event.metadata().target());
            event.record(
                &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                    line.push_str(&format!("{}={value:?} ", field.name()));
                },
            );
            let mut captured = self.0.lock().unwrap();
            captured.push_str(&line);
            captured.push('\n');
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[tokio::test(flavor = "current_thread")]
    async fn one_audit_line_per_token_credential_request_and_never_a_token() {
        let _audit = AUDIT_CALLSITE.lock().await;
        let captured = Captured::default();
        let _default = tracing::subscriber::set_default(captured.clone());
        // A test that ran earlier may have registered the audit callsite while no subscriber was
        // interested, caching "never"; recompute with this one in place (no registration can be
        // under way: AUDIT_CALLSITE is held).
        tracing::callsite::rebuild_interest_cache();
        let (config, routes) = routes();
        let publisher = Publisher::new();
        let ca =
            selkie_kube::certs::generate_ca("test signer", std::time::Duration::from_secs(3600)).unwrap();
        publisher.login_api().set_signer(Some(Arc::new(
            ClientCertificateSigner::from_pem(&ca.cert_pem, &ca.key_pem).unwrap(),
        )));
        let tcr = json!({"kind": "TokenCredentialRequest",
            "spec": {"token": "tok-SECRET-1", "authenticator": {"kind": "JWTAuthenticator", "name": "dex"}}});
        let bodies = [
            tcr.to_string(),
            "{\"spec\": {\"token\": \"tok-SECRET-2\"".to_string(),
            r#"{"spec": "tok-SECRET-3"}"#.to_string(),
            r#"{"kind": "Secret", "spec": {"token": "tok-SECRET-4"}}"#.to_string(),
            r#"{"spec": {"token": 5, "authenticator": "tok-SECRET-5"}}"#.to_string(),
        ];
        for body in &bodies {
            let (code, _, answer) =
                call(&routes, &config, &publisher, request(Method::POST, TCR, body)).await;
            assert!(!answer.to_string().contains("tok-SECRET"), "{code}: {answer}");
        }
        let captured = captured.0.lock().unwrap().clone();
        let audit: Vec<&str> = captured
            .lines()
            .filter(|line| line.starts_with("selkie::audit"))
            .collect();
        assert_eq!(
            audit.len(),
            1,
            "one line for the one request that was read: {captured}"
        );
        assert!(
            audit[0].contains("authenticator=dex") && audit[0].contains("issued=false"),
            "{captured}"
        );
        assert!(!captured.contains("tok-SECRET"), "a token was logged: {captured}");
    }

    #[tokio::test]
    async fn health_and_openapi_answer() {
        let (config, routes) = routes();
        let publisher = Publisher::new();
        for path in ["/healthz", "/livez", "/readyz"] {
            let (code, _, _) = call(&routes, &config, &publisher, request(Method::GET, path, "")).await;
            assert_eq!(code, StatusCode::OK, "{path}");
        }
        let context = Context {
            publisher: &publisher,
            ready: false,
        };
        let response = routes
            .handle(context, request(Method::GET, "/readyz", ""), UserInfo::default())
            .await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let (code, _, v2) = call(
            &routes,
            &config,
            &publisher,
            request(Method::GET, "/openapi/v2", ""),
        )
        .await;
        assert_eq!((code, v2["swagger"].as_str()), (StatusCode::OK, Some("2.0")));
        let (code, _, v3) = call(
            &routes,
            &config,
            &publisher,
            request(Method::GET, "/openapi/v3", ""),
        )
        .await;
        assert_eq!((code, v3["paths"].clone()), (StatusCode::OK, json!({})));
    }
}
