use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

#[test]
fn client_credentials_are_removed_and_impersonation_is_reported() {
    let mut map = headers(&[
        ("Authorization", "Bearer secret"),
        ("Impersonate-User", "bob"),
        ("Impersonate-Group", "admins"),
        ("Impersonate-Group", "devs"),
        ("Impersonate-Uid", "42"),
        ("Impersonate-Extra-Example.com%2Fteam", "blue"),
        ("X-Remote-User", "mallory"),
        ("X-Remote-Extra-Scopes", "all"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("Accept", "application/json"),
        ("User-Agent", "kubectl"),
    ]);
    let requested = strip_client_credentials(&mut map).unwrap();
    assert_eq!(
        requested,
        RequestedImpersonation {
            user: Some("bob".into()),
            groups: vec!["admins".into(), "devs".into()],
            uid: Some("42".into()),
            extra: vec![("example.com/team".into(), "blue".into())],
        }
    );
    assert!(requested.is_requested());
    let mut left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, vec!["accept", "user-agent"]);
}

#[test]
fn a_plain_request_asks_for_nothing() {
    let mut map = headers(&[("Accept", "*/*")]);
    assert!(!strip_client_credentials(&mut map).unwrap().is_requested());
    assert_eq!(map.len(), 1);
}

#[test]
fn malformed_impersonation_headers_are_refused_and_still_removed() {
    for (name, value) in [
        ("Impersonate-Extra-%zz", "v"),
        ("Impersonate-Extra-", "v"),
        ("Impersonate-Extra-%ff", "v"),
    ] {
        let mut map = headers(&[(name, value)]);
        assert!(
            matches!(strip_client_credentials(&mut map), Err(HeaderError::Malformed(_))),
            "{name}"
        );
        assert!(map.is_empty(), "{name} must not survive");
    }
    let mut map = HeaderMap::new();
    map.insert("impersonate-user", HeaderValue::from_bytes(b"caf\xe9").unwrap());
    assert!(strip_client_credentials(&mut map).is_err());
    assert!(map.is_empty());
}

#[test]
fn impersonation_headers_carry_the_whole_user() {
    let user = UserInfo {
        username: "alice@example.com".into(),
        uid: Some("u-1".into()),
        groups: vec!["devs".into(), "ops".into()],
        extra: BTreeMap::from([(
            "example.com/Team Name".to_string(),
            vec!["a".to_string(), "b".to_string()],
        )]),
    };
    let built: Vec<(String, String)> = impersonation_headers(&user)
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    };
    assert_eq!(
        built,
        pairs(&[
            ("impersonate-user", "alice@example.com"),
            ("impersonate-uid", "u-1"),
            ("impersonate-group", "devs"),
            ("impersonate-group", "ops"),
            ("impersonate-extra-example.com%2f%54eam%20%4eame", "a"),
            ("impersonate-extra-example.com%2f%54eam%20%4eame", "b"),
        ])
    );
}

#[test]
fn control_characters_in_a_name_are_an_error() {
    let user = UserInfo {
        username: "alice\r\nImpersonate-Group: system:masters".into(),
        ..UserInfo::default()
    };
    assert_eq!(
        impersonation_headers(&user),
        Err(HeaderError::Unrepresentable("user name"))
    );
}

proptest! {
    /// Any extra key survives encoding and the proxy's own decoding unchanged.
    #[test]
    fn extra_keys_round_trip(key in "\\PC{1,40}") {
        prop_assert_eq!(percent_decode(&percent_encode(&key)), Some(key));
    }

    /// Whatever headers a client sends, none that names an identity survives.
    #[test]
    fn no_identity_header_survives(names in proptest::collection::vec("(?i)(impersonate-|x-remote-|authorization|x-forwarded-for|accept)[a-z%0-9-]{0,12}", 0..12)) {
        let mut map = HeaderMap::new();
        for name in &names {
            if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
                map.append(name, HeaderValue::from_static("v"));
            }
        }
        let _ = strip_client_credentials(&mut map);
        prop_assert!(map.keys().all(|name| !is_client_credential(name)));
    }
}
