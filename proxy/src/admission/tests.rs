use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A pingora L4 stream of a real loopback connection, and the accepted end (kept open).
async fn connection(listener: &TcpListener) -> (L4Stream, TcpStream) {
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    (L4Stream::from(client), accepted)
}

fn sample(registry: &Registry, series: &str) -> Option<f64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_until_one_closes() {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let limit = ConnectionLimit::new(ListenerLimits::with_max_connections(2).unwrap(), &metrics);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer: SocketAddr = "192.0.2.1:1234".parse().unwrap();

    let (mut first, _a) = connection(&listener).await;
    let (mut second, _b) = connection(&listener).await;
    for stream in [&mut first, &mut second] {
        assert!(limit.should_accept(Some(&peer)).await);
        limit.process(stream).await.unwrap();
    }
    assert_eq!(limit.open(), 2);
    assert_eq!(sample(&registry, "selkie_proxy_connections_open"), Some(2.0));

    // Full: the filter refuses, and so does the pre-TLS hook for a connection the filter did not
    // see.
    assert!(!limit.should_accept(Some(&peer)).await);
    let (mut third, _c) = connection(&listener).await;
    let refused = limit.process(&mut third).await.unwrap_err();
    assert!(refused.to_string().contains("maxConnections"), "{refused}");
    assert!(third.tracer.is_none());
    assert_eq!(
        sample(&registry, "selkie_proxy_connections_refused_total"),
        Some(2.0)
    );

    // A clone of a connection's tracer (pingora's `Tracer` is `Clone`) holds no place.
    let clone = first.tracer.clone();
    drop(clone);
    assert_eq!(limit.open(), 2);

    // The first connection closes: its place is free again, and taken by the next one.
    drop(first);
    assert_eq!(limit.open(), 1);
    assert_eq!(sample(&registry, "selkie_proxy_connections_open"), Some(1.0));
    assert!(limit.should_accept(Some(&peer)).await);
    limit.process(&mut third).await.unwrap();
    assert_eq!(limit.open(), 2);
    drop((second, third));
    assert_eq!(limit.open(), 0);
    assert_eq!(sample(&registry, "selkie_proxy_connections_open"), Some(0.0));

    // Places are interchangeable: a connection ties the place the filter took for any
    // connection, and one the filter did not see takes a free place.
    assert!(limit.should_accept(Some(&peer)).await);
    assert_eq!(limit.open(), 1);
    let (mut tied, _d) = connection(&listener).await;
    limit.process(&mut tied).await.unwrap();
    assert_eq!(limit.open(), 1);
    let (mut unseen, _e) = connection(&listener).await;
    limit.process(&mut unseen).await.unwrap();
    assert_eq!(limit.open(), 2);
    assert!(!limit.should_accept(Some(&peer)).await);
    drop((tied, unseen));
    assert_eq!(limit.open(), 0);
}

#[test]
fn max_connections_default_and_are_checked() {
    let parse = serde_yaml::from_str::<ListenerLimits>;
    assert_eq!(parse("{}").unwrap(), ListenerLimits::DEFAULT);
    assert_eq!(ListenerLimits::DEFAULT.max_connections, 1000);
    assert_eq!(parse("maxConnections: 2500").unwrap().max_connections, 2500);
    for (yaml, complaint) in [
        (
            "maxConnections: 0",
            "maxConnections 0: must be between 1 and 1000000",
        ),
        (
            "maxConnections: 1000001",
            "maxConnections 1000001: must be between 1",
        ),
        ("maxConnections: -1", "maxConnections"),
        ("maxConnection: 10", "unknown field `maxConnection`"),
    ] {
        let error = parse(yaml).unwrap_err().to_string();
        assert!(error.contains(complaint), "{yaml}: {error}");
    }
}
