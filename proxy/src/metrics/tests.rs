use selkie_filters::{
    identity::{Forwarding, Identity, UserInfo},
    outcome::RejectReason,
};

use super::*;

fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut builder = http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

fn class(method: &str, uri: &str) -> VerbClass {
    VerbClass::of(&request(method, uri, &[]))
}

#[test]
fn methods_map_to_read_write_and_other() {
    assert_eq!(class("GET", "/api/v1/namespaces/a/pods"), VerbClass::Read);
    assert_eq!(class("HEAD", "/api/v1/namespaces/a/pods/p"), VerbClass::Read);
    for method in ["POST", "PUT", "PATCH", "DELETE"] {
        assert_eq!(
            class(method, "/api/v1/namespaces/a/configmaps"),
            VerbClass::Write,
            "{method}"
        );
    }
    assert_eq!(class("OPTIONS", "/api"), VerbClass::Other);
    assert_eq!(class("TRACE", "/api"), VerbClass::Other);
}

#[test]
fn watches_are_recognised_by_query_and_by_legacy_path() {
    for query in [
        "watch=true",
        "watch=1",
        "watch=TRUE",
        "watch=",
        "watch",
        "limit=5&watch=true",
    ] {
        assert_eq!(
            class("GET", &format!("/api/v1/pods?{query}")),
            VerbClass::Watch,
            "{query}"
        );
    }
    for query in [
        "watch=false",
        "watch=0",
        "watch=False",
        "watched=true",
        "allowWatchBookmarks=true",
    ] {
        assert_eq!(
            class("GET", &format!("/api/v1/pods?{query}")),
            VerbClass::Read,
            "{query}"
        );
    }
    // Percent-encoding does not hide a watch.
    assert_eq!(class("GET", "/api/v1/pods?%77atch=%74rue"), VerbClass::Watch);

    assert_eq!(class("GET", "/api/v1/watch/namespaces/a/pods"), VerbClass::Watch);
    assert_eq!(class("GET", "/apis/apps/v1/watch/deployments"), VerbClass::Watch);
    // Only in the verb position: a namespace, group or object called "watch" is no watch.
    assert_eq!(class("GET", "/api/v1/namespaces/watch/pods"), VerbClass::Read);
    assert_eq!(class("GET", "/apis/watch/v1/things"), VerbClass::Read);
    assert_eq!(
        class("GET", "/api/v1/namespaces/a/configmaps/watch"),
        VerbClass::Read
    );
    assert_eq!(class("GET", "/api/v1/watch"), VerbClass::Read);
    // A watch is a GET; anything else with the parameter is what its method says.
    assert_eq!(class("POST", "/api/v1/pods?watch=true"), VerbClass::Write);
}

#[test]
fn upgrades_need_both_connection_and_upgrade_headers() {
    let spdy = request(
        "POST",
        "/api/v1/namespaces/a/pods/p/exec?command=sh",
        &[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")],
    );
    assert_eq!(VerbClass::of(&spdy), VerbClass::Upgrade);
    let websocket = request(
        "GET",
        "/api/v1/namespaces/a/pods/p/portforward?watch=true",
        &[("connection", "keep-alive, upgrade"), ("upgrade", "websocket")],
    );
    assert_eq!(VerbClass::of(&websocket), VerbClass::Upgrade);
    let no_connection = request("GET", "/api/v1/pods", &[("upgrade", "websocket")]);
    assert_eq!(VerbClass::of(&no_connection), VerbClass::Read);
    let no_upgrade = request("GET", "/api/v1/pods", &[("connection", "upgrade")]);
    assert_eq!(VerbClass::of(&no_upgrade), VerbClass::Read);
}

fn identity(username: &str, authenticator: &str) -> Arc<Identity> {
    Arc::new(Identity {
        user: UserInfo {
            username: username.into(),
            groups: vec!["secret-team".into()],
            ..UserInfo::default()
        },
        authenticator: authenticator.into(),
        audiences: vec![],
        forwarding: Forwarding::Impersonate,
    })
}

fn exposition(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The value of the sample written exactly as `series` (name and labels in encoding order).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

#[test]
fn the_exposition_has_every_family_with_bounded_labels() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);

    let read = metrics.request_started(VerbClass::Read);
    metrics.authentication(&Decision::Authenticated(identity(
        "alice@example.com",
        "client-certificate",
    )));
    metrics.upstream_connected(UpstreamConnection::New);
    metrics.upstream_connected(UpstreamConnection::Resumed);
    metrics.request_finished(VerbClass::Read, 403, Duration::from_micros(1500));
    drop(read);

    metrics.authentication(&Decision::Anonymous);
    metrics.authentication(&Decision::Unauthenticated(vec![]));
    metrics.authentication(&Decision::Unauthenticated(vec![
        (Arc::from("corporate-idp"), RejectReason::Expired),
        (Arc::from("webhook"), RejectReason::NotAuthenticated),
    ]));
    metrics.request_finished(VerbClass::Read, 401, Duration::from_millis(2));
    metrics.request_finished(VerbClass::Read, 401, Duration::from_millis(3));
    metrics.upstream_connected(UpstreamConnection::pooled(true));
    metrics.upstream_connected(UpstreamConnection::pooled(true));

    let watch = metrics.request_started(VerbClass::Watch);
    let exec = metrics.request_started(VerbClass::Upgrade);
    let tunnel = metrics.tunnel_opened();
    let text = exposition(&registry);
    assert_eq!(metrics.in_flight(), 2);
    assert_eq!(
        sample(&text, r#"selkie_proxy_in_flight_requests{verb_class="watch"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"selkie_proxy_in_flight_requests{verb_class="upgrade"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"selkie_proxy_in_flight_requests{verb_class="read"}"#),
        Some(0.0)
    );
    assert_eq!(sample(&text, "selkie_proxy_active_tunnels"), Some(1.0));
    assert_eq!(sample(&text, "selkie_proxy_connections_open"), Some(0.0));
    assert_eq!(sample(&text, "selkie_proxy_connections_refused_total"), Some(0.0));

    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_requests_total{code="403",verb_class="read"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_requests_total{code="401",verb_class="read"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_request_duration_seconds_count{verb_class="read"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_request_duration_seconds_bucket{le="0.0025",verb_class="read"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_request_duration_seconds_count{verb_class="watch"}"#
        ),
        Some(0.0)
    );
    for (series, value) in [
        (
            r#"{authenticator="client-certificate",result="authenticated",reason="none"}"#,
            1.0,
        ),
        (
            r#"{authenticator="anonymous",result="anonymous",reason="none"}"#,
            1.0,
        ),
        (
            r#"{authenticator="chain",result="rejected",reason="unrecognized"}"#,
            1.0,
        ),
        (
            r#"{authenticator="corporate-idp",result="rejected",reason="expired"}"#,
            1.0,
        ),
        (
            r#"{authenticator="webhook",result="rejected",reason="not_authenticated"}"#,
            1.0,
        ),
    ] {
        let series = format!("selkie_proxy_authentications_total{series}");
        assert_eq!(sample(&text, &series), Some(value), "{series} in\n{text}");
    }
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_upstream_connections_total{connection="new"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_upstream_connections_total{connection="reused"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"selkie_proxy_upstream_connections_total{connection="resumed"}"#
        ),
        Some(1.0)
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    for private in ["alice", "secret-team"] {
        assert!(!text.contains(private), "{private} leaked into\n{text}");
    }

    drop((watch, exec, tunnel));
    let text = exposition(&registry);
    assert_eq!(metrics.in_flight(), 0);
    assert_eq!(
        sample(&text, r#"selkie_proxy_in_flight_requests{verb_class="watch"}"#),
        Some(0.0)
    );
    assert_eq!(sample(&text, "selkie_proxy_active_tunnels"), Some(0.0));
}

#[test]
fn clones_record_into_the_same_series() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let clone = metrics.clone();
    let _active = clone.request_started(VerbClass::Write);
    assert_eq!(metrics.in_flight(), 1);
}
