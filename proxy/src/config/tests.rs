use super::*;
use crate::duration::parse_duration;

fn parse(yaml: &str) -> Result<StaticConfig, serde_yaml::Error> {
    serde_yaml::from_str(yaml)
}

/// `rest` after the fields every configuration needs (listener, serving certificate, upstream).
fn parse_minimal(rest: &str) -> Result<StaticConfig, serde_yaml::Error> {
    parse(&format!(
        "listen: 127.0.0.1:1\nservingCertificate: {{certFile: a, keyFile: b}}\n\
         upstream: {{url: https://x, caFile: c}}\n{rest}"
    ))
}

#[test]
fn the_example_configuration_parses() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/proxy.example.yaml");
    let config = StaticConfig::load(Path::new(example)).unwrap();
    assert_eq!(config.listen_address().unwrap().port(), 8444);
    assert_eq!(config.jwt_authenticators.len(), 1);
    assert_eq!(config.jwt_authenticators[0].claims.username, "email");
    assert!(config.upstream.token_review);
    assert_eq!(
        config.timeouts,
        Timeouts::default(),
        "the example shows the defaults"
    );
    assert_eq!(
        config.listener_limits,
        ListenerLimits::default(),
        "the example shows the defaults"
    );
}

#[test]
fn unknown_fields_and_bad_values_are_named() {
    let base = "listen: 127.0.0.1:1\nservingCertificate: {certFile: a, keyFile: b}\n";
    let error = parse(&format!(
        "{base}upstream: {{url: https://x, caFile: c}}\nbogus: 1\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(error.contains("unknown field `bogus`"), "{error}");

    let config = parse(&format!("{base}upstream: {{url: https://x, caFile: c}}\n")).unwrap();
    assert!(config.jwt_authenticators.is_empty() && config.client_certificate_ca_files.is_empty());

    let mut bad = config.clone();
    bad.listen = "nowhere".into();
    assert!(bad
        .listen_address()
        .unwrap_err()
        .to_string()
        .starts_with("listen: "));

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let mut bad = config.clone();
    bad.upstream.url = "http://127.0.0.1:6443".into();
    assert_eq!(
        bad.snapshot().unwrap_err().to_string(),
        "upstream.url: must use https"
    );
    let mut bad = config;
    bad.upstream.url = "https://127.0.0.1:6443".into();
    bad.upstream.ca_file = missing.clone();
    let error = bad.snapshot().unwrap_err().to_string();
    assert!(error.contains(&missing.display().to_string()), "{error}");
}

#[test]
fn kube_apiservers_token_review_is_on_unless_turned_off() {
    assert!(parse_minimal("").unwrap().upstream.token_review);
    let off =
        parse("listen: 127.0.0.1:1\nupstream: {url: https://x, caFile: c, tokenReview: false}\n").unwrap();
    assert!(!off.upstream.token_review);
    let error = parse("listen: 127.0.0.1:1\nupstream: {url: https://x, caFile: c, tokenReview: maybe}\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("upstream") && error.contains("invalid type"),
        "{error}"
    );
}

/// The Concierge reads its proxy configuration from the ConfigMap of its install manifests
/// (rendered from the Helm chart), which names no `tokenReview`: service-account tokens pass
/// through its proxy, as through Pinniped's.
#[test]
fn the_installed_concierges_proxy_reviews_tokens_with_kube_apiserver() {
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/install/concierge.yaml");
    let text = std::fs::read_to_string(manifests).unwrap();
    let proxy_yaml = serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).unwrap())
        .find_map(|object| {
            (object["kind"] == "ConfigMap")
                .then(|| object["data"]["proxy.yaml"].as_str().map(str::to_string))?
        })
        .expect("a ConfigMap with proxy.yaml");
    let config = parse(&proxy_yaml).unwrap();
    assert!(config.upstream.token_file.is_some(), "{proxy_yaml}");
    assert!(config.upstream.token_review, "{proxy_yaml}");
}

#[test]
fn shutdown_and_operations_settings_have_defaults_and_named_errors() {
    let config = parse_minimal("").unwrap();
    assert_eq!(config.shutdown, ShutdownConfig::default());
    assert_eq!(config.shutdown.grace_period(), Duration::from_secs(5));
    assert_eq!(config.shutdown.drain_timeout(), Duration::from_secs(20));
    assert_eq!(config.operations_address().unwrap(), None);

    let config =
        parse_minimal("operationsListen: 127.0.0.1:9090\nshutdown: {drainTimeoutSeconds: 60}\n").unwrap();
    assert_eq!(config.shutdown.grace_period_seconds, 5);
    assert_eq!(config.shutdown.drain_timeout(), Duration::from_secs(60));
    assert_eq!(config.operations_address().unwrap().map(|a| a.port()), Some(9090));

    let error = parse_minimal("shutdown: {drainTimeout: 60}\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("unknown field `drainTimeout`"), "{error}");
    let error = parse_minimal("shutdown: {gracePeriodSeconds: -1}\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("shutdown.gracePeriodSeconds"), "{error}");
    let mut bad = parse_minimal("").unwrap();
    bad.operations_listen = Some(":metrics".into());
    assert!(bad
        .operations_address()
        .unwrap_err()
        .to_string()
        .starts_with("operationsListen: "));
}

#[test]
fn durations_are_written_as_in_kubernetes() {
    for (text, expected) in [
        ("10s", Duration::from_secs(10)),
        ("500ms", Duration::from_millis(500)),
        ("1m30s", Duration::from_secs(90)),
        ("2h", Duration::from_secs(7200)),
        ("0s", Duration::ZERO),
    ] {
        assert_eq!(parse_duration(text), Ok(expected), "{text}");
    }
    for (text, complaint) in [
        ("", "not a duration"),
        ("10", "has no unit"),
        ("s", "not a duration"),
        ("1.5s", "not a duration"),
        ("10 s", "not a duration"),
        ("10d", "not a duration"),
        ("-1s", "not a duration"),
        ("99999999999999999999s", "not a duration"),
        ("18446744073709551615h", "not a duration"),
    ] {
        let error = parse_duration(text).unwrap_err();
        assert!(error.contains(complaint), "{text}: {error}");
    }
}

#[test]
fn timeouts_default_and_are_named_when_wrong() {
    assert_eq!(parse_minimal("").unwrap().timeouts, Timeouts::default());
    let config = parse_minimal("timeouts: {headerRead: 2s, idle: 5m}\n").unwrap();
    assert_eq!(config.timeouts.header_read, Duration::from_secs(2));
    assert_eq!(config.timeouts.idle, Duration::from_secs(300));
    let error = parse_minimal("timeouts: {idle: 0ms}\n").unwrap_err().to_string();
    assert!(
        error.contains("timeouts.idle") && error.contains("greater than zero"),
        "{error}"
    );
}

#[test]
fn listener_limits_default_and_are_named_when_wrong() {
    assert_eq!(
        parse_minimal("").unwrap().listener_limits,
        ListenerLimits::DEFAULT
    );
    let config = parse_minimal("listenerLimits: {maxConnections: 5000}\n").unwrap();
    assert_eq!(config.listener_limits.max_connections, 5000);
    let error = parse_minimal("listenerLimits: {maxConnections: 0}\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("listenerLimits") && error.contains("maxConnections 0: must be between 1 and 1000000"),
        "{error}"
    );
}

#[test]
fn static_identity_and_credential_signer_are_checked() {
    let error = parse_minimal("staticIdentity: {username: \"\"}\n")
        .unwrap()
        .snapshot()
        .unwrap_err()
        .to_string();
    assert_eq!(error, "staticIdentity.username: must not be empty");

    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let error = parse_minimal(&format!(
        "credentialSigner: {{certFile: {0}, keyFile: {0}}}\n",
        garbage.display()
    ))
    .unwrap()
    .snapshot()
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("credentialSigner: the signer CA certificate is invalid"),
        "{error}"
    );
}

#[test]
fn a_jwt_authenticators_cache_can_be_sized_or_turned_off() {
    let jwt = |cache: &str| {
        parse_minimal(&format!(
            "jwtAuthenticators:\n  - {{name: idp, issuer: https://idp, audience: a{cache}}}\n"
        ))
    };
    let cache_of = |config: &StaticConfig| {
        let authenticator = &config.jwt_authenticators[0];
        match &authenticator.cache {
            Some(cache) => cache.cache_config("jwtAuthenticators[0].cache"),
            None => Ok(CacheConfig::default()),
        }
    };
    assert_eq!(cache_of(&jwt("").unwrap()).unwrap(), CacheConfig::default());
    assert_eq!(
        cache_of(&jwt(", cache: {}").unwrap()).unwrap(),
        CacheConfig::default()
    );
    assert_eq!(
        cache_of(&jwt(", cache: {enabled: false}").unwrap()).unwrap(),
        CacheConfig::disabled()
    );
    assert_eq!(
        cache_of(&jwt(", cache: {capacity: 5, ttl: 2m, negativeTtl: 0s}").unwrap()).unwrap(),
        CacheConfig {
            capacity: 5,
            positive_ttl: Duration::from_secs(120),
            negative_ttl: Duration::ZERO,
        }
    );

    // Mistakes are named: in the YAML ...
    for (cache, complaint) in [
        (", cache: {ttl: 0s}", "must be greater than zero"),
        (", cache: {ttl: 60}", "has no unit"),
        (", cache: {enabled: no-thanks}", "invalid type"),
        (", cache: {size: 5}", "unknown field `size`"),
    ] {
        let error = jwt(cache).unwrap_err().to_string();
        assert!(error.contains(complaint), "{cache}: {error}");
    }
    // ... and when the snapshot is built (before any file is read).
    for (cache, expected) in [
        (
            ", cache: {capacity: 0}",
            "jwtAuthenticators[0].cache.capacity: must be at least 1 (enabled: false turns the cache off)",
        ),
        (
            ", cache: {enabled: false, ttl: 10s}",
            "jwtAuthenticators[0].cache: capacity, ttl and negativeTtl do not apply with enabled: false",
        ),
    ] {
        let error = jwt(cache).unwrap().snapshot().unwrap_err().to_string();
        assert_eq!(error, expected, "{cache}");
    }
}

#[test]
fn a_webhooks_certificate_identity_defaults_to_exact_and_is_checked() {
    let webhook = |extra: &str| {
        parse_minimal(&format!(
            "webhookAuthenticators:\n  - {{name: kas, endpoint: 'https://kas/review'{extra}}}\n"
        ))
    };
    let of = |config: StaticConfig| config.webhook_authenticators[0].certificate_identity;
    assert_eq!(of(webhook("").unwrap()), CertificateIdentity::Exact);
    assert_eq!(
        of(webhook(", certificateIdentity: UsernameAndGroups").unwrap()),
        CertificateIdentity::UsernameAndGroups
    );
    let error = webhook(", certificateIdentity: Sometimes")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("unknown variant `Sometimes`") && error.contains("UsernameAndGroups"),
        "{error}"
    );
}

#[test]
fn the_client_certificate_clock_skew_is_zero_unless_set_and_at_most_five_minutes() {
    let config = parse_minimal("").unwrap();
    assert_eq!(config.client_certificate_clock_skew, None);
    let config = parse_minimal("clientCertificateClockSkew: 30s").unwrap();
    assert_eq!(
        config.client_certificate_clock_skew,
        Some(Duration::from_secs(30))
    );
    let error = parse_minimal("clientCertificateClockSkew: soon")
        .unwrap_err()
        .to_string();
    assert!(error.contains("not a duration"), "{error}");
    let too_much = parse_minimal("clientCertificateClockSkew: 6m").unwrap();
    assert_eq!(
        too_much.snapshot().unwrap_err().to_string(),
        "clientCertificateClockSkew: must be at most 5m"
    );
}
