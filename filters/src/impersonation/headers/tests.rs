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

#[test]
fn impersonation_values_are_utf8_not_only_ascii() {
    let mut map = HeaderMap::new();
    map.insert("impersonate-user", HeaderValue::from_str("jos\u{e9}").unwrap());
    map.append("impersonate-group", HeaderValue::from_str("\u{e9}quipe").unwrap());
    let requested = strip_client_credentials(&mut map).unwrap();
    assert_eq!(requested.user.as_deref(), Some("jos\u{e9}"));
    assert_eq!(requested.groups, vec!["\u{e9}quipe".to_string()]);

    // What impersonation_headers writes for such a user reads back as the same user.
    let user = UserInfo {
        username: "jos\u{e9}@exemple.fr".into(),
        groups: vec!["\u{e9}quipe".into()],
        ..UserInfo::default()
    };
    let mut map: HeaderMap = impersonation_headers(&user).unwrap().into_iter().collect();
    let requested = strip_client_credentials(&mut map).unwrap();
    assert_eq!(requested.user.as_deref(), Some(user.username.as_str()));
    assert_eq!(requested.groups, user.groups);
}

#[test]
fn a_second_user_or_uid_is_ambiguous_and_refused() {
    for name in ["Impersonate-User", "Impersonate-Uid"] {
        let mut map = headers(&[("Impersonate-User", "bob"), (name, "first"), (name, "second")]);
        assert_eq!(
            strip_client_credentials(&mut map),
            Err(HeaderError::Malformed(name.to_ascii_lowercase())),
            "{name}"
        );
        assert!(map.is_empty());
    }
    // Groups and extras may repeat.
    let mut map = headers(&[
        ("Impersonate-User", "bob"),
        ("Impersonate-Group", "a"),
        ("Impersonate-Group", "a"),
        ("Impersonate-Extra-Scopes", "x"),
        ("Impersonate-Extra-Scopes", "y"),
    ]);
    let requested = strip_client_credentials(&mut map).unwrap();
    assert_eq!(requested.groups.len(), 2);
    assert_eq!(requested.extra.len(), 2);
}

#[test]
fn users_that_would_arrive_as_someone_else_are_refused() {
    let with = |change: fn(&mut UserInfo)| {
        let mut user = UserInfo {
            username: "alice".into(),
            uid: Some("u-1".into()),
            groups: vec!["devs".into()],
            extra: BTreeMap::from([("scopes".to_string(), vec!["read".to_string()])]),
        };
        change(&mut user);
        impersonation_headers(&user)
    };
    assert!(with(|_| {}).is_ok());
    assert!(
        with(|user| user.username = "al ice".into()).is_ok(),
        "inner spaces survive HTTP"
    );
    // HTTP strips whitespace around a field value: " admin" would arrive as "admin".
    for (change, what) in [
        (
            (|user| user.username = " admin".into()) as fn(&mut UserInfo),
            "user name",
        ),
        (|user| user.username = "admin\t".into(), "user name"),
        (|user| user.uid = Some("u-1 ".into()), "uid"),
        (|user| user.groups = vec![" system:masters".into()], "group"),
        (
            |user| user.extra = BTreeMap::from([("scopes".into(), vec!["read ".into()])]),
            "extra value",
        ),
    ] {
        assert_eq!(with(change), Err(HeaderError::Unrepresentable(what)));
    }
    // An empty Impersonate-User means no impersonation: the request would run as the proxy.
    assert_eq!(
        with(|user| user.username.clear()),
        Err(HeaderError::Empty("user name"))
    );
    assert_eq!(
        with(|user| user.extra = BTreeMap::from([(String::new(), vec!["v".into()])])),
        Err(HeaderError::Empty("extra key"))
    );
}

proptest! {
    /// Any extra key survives encoding and the proxy's own decoding unchanged.
    #[test]
    fn extra_keys_round_trip(key in "\\PC{1,40}") {
        prop_assert_eq!(selkie_api::percent::decode(&percent_encode(&key)), Some(key));
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

#[test]
fn prepared_headers_are_those_of_the_very_same_identity_only() {
    let identity = |name: &str| {
        Arc::new(Identity {
            user: UserInfo {
                username: name.into(),
                groups: vec!["devs".into(), "ops".into()],
                ..UserInfo::default()
            },
            authenticator: Arc::from("static"),
            audiences: Vec::new(),
            forwarding: crate::identity::Forwarding::Impersonate,
        })
    };
    let alice = identity("alice");
    let prepared = PreparedIdentity::new(alice.clone());
    let built = prepared.headers_for(&alice).unwrap().as_ref().unwrap();
    assert_eq!(&built[..], &impersonation_headers(&alice.user).unwrap()[..]);
    // An equal identity in another allocation, or another identity, builds its own headers.
    assert!(prepared.headers_for(&identity("alice")).is_none());
    assert!(prepared.headers_for(&identity("bob")).is_none());
    // A user that cannot be impersonated stays an error, shared like the headers.
    let empty = identity("");
    assert_eq!(
        PreparedIdentity::new(empty.clone())
            .headers_for(&empty)
            .unwrap()
            .clone()
            .unwrap_err(),
        HeaderError::Empty("user name")
    );
}

#[test]
fn the_headers_of_a_returning_identity_are_built_once() {
    let identity = |name: &str| {
        Arc::new(Identity {
            user: UserInfo {
                username: name.into(),
                groups: vec!["devs".into()],
                ..UserInfo::default()
            },
            authenticator: "jwt".into(),
            audiences: vec![],
            forwarding: crate::identity::Forwarding::Impersonate,
        })
    };
    let cache = PreparedCache::new(10);
    let alice = identity("alice");
    let first = cache.headers(&alice).unwrap();
    let again = cache.headers(&alice).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the same headers, not rebuilt");
    assert_eq!(&*first, &*impersonation_headers(&alice.user).unwrap());

    // Another identity with the same name is another entry: never mixed up.
    let twin = identity("alice");
    let twins = cache.headers(&twin).unwrap();
    assert!(!Arc::ptr_eq(&first, &twins));
    assert_eq!(&*first, &*twins);
    let bob = identity("bob");
    assert_eq!(cache.headers(&bob).unwrap()[0].1, HeaderValue::from_static("bob"));

    // Capacity 0 keeps nothing.
    let none = PreparedCache::new(0);
    let built = none.headers(&alice).unwrap();
    assert!(!Arc::ptr_eq(&built, &none.headers(&alice).unwrap()));
    // An unrepresentable identity is an error, every time.
    let broken = identity("bad\nname");
    assert!(cache.headers(&broken).is_err());
    assert!(cache.headers(&broken).is_err());
}
