use super::*;

fn parse(yaml: &str) -> Result<StaticConfig, serde_yaml::Error> {
    serde_yaml::from_str(yaml)
}

#[test]
fn the_example_configuration_parses() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/proxy.example.yaml");
    let config = StaticConfig::load(Path::new(example)).unwrap();
    assert_eq!(config.listen_address().unwrap().port(), 8444);
    assert_eq!(config.jwt_authenticators.len(), 1);
    assert_eq!(config.jwt_authenticators[0].claims.username, "email");
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
