//! The proxy's header policy (`selkie_filters::impersonation::headers`): what a client may not send upstream, the
//! impersonation it asks for, and the `Impersonate-*` headers built for a user.
//!
//! An input whose first byte is below [`USER_INFO`] is a header map: the rest, split at `\n`,
//! gives one field per line, `name:value` (lines whose name or value HTTP cannot carry are
//! skipped). Invariants:
//!
//! * `client_credentials` names every distinct field for which `is_client_credential` holds, and
//!   no other; `strip_client_credentials` removes exactly those, leaves every other field as it
//!   was, and reports the same impersonation;
//! * the impersonation reported agrees with [`expected_impersonation`], written here from the
//!   specification (one `Impersonate-User` and at most one `Impersonate-Uid`, any number of
//!   groups, `Impersonate-Extra-<percent-encoded key>`, values as UTF-8, nothing else under
//!   `Impersonate-`), not from the implementation.
//!
//! Otherwise the rest is a user: `name 0x00 uid 0x00 groups 0x00 extras`, where a uid field that
//! is empty means none, groups are split by 0x01, and extras are `key 0x02 value 0x02 value ...`
//! split by 0x01 (lossy UTF-8 throughout). Invariants: `impersonation_headers` either refuses the
//! user or yields headers that, written as HTTP/1.1 and parsed back with httparse (what pingora
//! reads requests with), come back through `client_credentials` as the same user, uid, groups and
//! extras; and a user made only of plain words is never refused.

#![no_main]

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use selkie_filters::identity::UserInfo;
use selkie_filters::impersonation::headers::{
    client_credentials, impersonation_headers, is_client_credential, strip_client_credentials,
    RequestedImpersonation,
};

/// An input whose first byte is at least this describes a user; below, a header map.
const USER_INFO: u8 = 0x80;

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((&mode, rest)) if mode >= USER_INFO => user_round_trip(&user_from(rest)),
        Some((_, rest)) => header_map(&map_from(rest)),
        None => {}
    }
});

fn map_from(input: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in input.split(|byte| *byte == b'\n') {
        let Some(colon) = line.iter().position(|byte| *byte == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            map.append(name, value);
        }
    }
    map
}

fn header_map(map: &HeaderMap) {
    let (names, requested) = client_credentials(map);
    let mut expected_names: Vec<&HeaderName> = map.keys().filter(|name| is_client_credential(name)).collect();
    let mut returned: Vec<&HeaderName> = names.iter().collect();
    expected_names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    returned.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    assert_eq!(
        returned, expected_names,
        "the credential fields named for removal"
    );

    let mut stripped = map.clone();
    let stripped_requested = strip_client_credentials(&mut stripped);
    assert_eq!(
        stripped_requested, requested,
        "strip and client_credentials disagree"
    );
    assert!(
        stripped.keys().all(|name| !is_client_credential(name)),
        "a credential field survived: {stripped:?}"
    );
    for name in map.keys().filter(|name| !is_client_credential(name)) {
        assert!(
            stripped.get_all(name).iter().eq(map.get_all(name).iter()),
            "{name} was changed"
        );
    }
    assert_eq!(stripped.keys_len(), map.keys_len() - names.len());

    match (expected_impersonation(map), &requested) {
        (Some(expected), Ok(requested)) => assert_eq!(requested, &expected, "for {map:?}"),
        (None, Err(_)) => {}
        (expected, requested) => {
            panic!("for {map:?}: expected {expected:?}, the policy says {requested:?}")
        }
    }
}

/// What the `Impersonate-*` fields of `map` ask for, or `None` if they are malformed.
fn expected_impersonation(map: &HeaderMap) -> Option<RequestedImpersonation> {
    let mut requested = RequestedImpersonation::default();
    for name in map.keys() {
        let Some(kind) = name.as_str().strip_prefix("impersonate-") else {
            continue;
        };
        let values = map
            .get_all(name)
            .iter()
            .map(|value| String::from_utf8(value.as_bytes().to_vec()).ok())
            .collect::<Option<Vec<String>>>()?;
        match kind {
            "user" | "uid" => {
                let [value] = <[String; 1]>::try_from(values).ok()?;
                if kind == "user" {
                    requested.user = Some(value);
                } else {
                    requested.uid = Some(value);
                }
            }
            "group" => requested.groups.extend(values),
            _ => {
                let key = decode_key(kind.strip_prefix("extra-")?)?;
                if key.is_empty() {
                    return None;
                }
                requested
                    .extra
                    .extend(values.into_iter().map(|value| (key.clone(), value)));
            }
        }
    }
    Some(requested)
}

/// `%hh` escapes to bytes, the bytes as UTF-8 (`url.PathUnescape`, as kube-apiserver decodes
/// extra keys).
fn decode_key(encoded: &str) -> Option<String> {
    let mut bytes = Vec::new();
    let mut chars = encoded.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            let high = chars.next()?.to_digit(16)?;
            let low = chars.next()?.to_digit(16)?;
            bytes.push(u8::try_from(high * 16 + low).ok()?);
        } else {
            let mut buffer = [0; 4];
            bytes.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
        }
    }
    String::from_utf8(bytes).ok()
}

fn user_from(input: &[u8]) -> UserInfo {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut parts = input.splitn(4, |byte| *byte == 0);
    let (name, uid, groups, extras) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let mut extra = BTreeMap::new();
    if !extras.is_empty() {
        for entry in extras.split(|byte| *byte == 1) {
            let mut fields = entry.split(|byte| *byte == 2);
            let key = text(fields.next().unwrap_or_default());
            extra.entry(key).or_insert_with(Vec::new).extend(fields.map(text));
        }
    }
    UserInfo {
        username: text(name),
        uid: (!uid.is_empty()).then(|| text(uid)),
        groups: if groups.is_empty() {
            Vec::new()
        } else {
            groups.split(|byte| *byte == 1).map(text).collect()
        },
        extra,
    }
}

/// A word of letters, digits, `-`, `.`, `_`, `:`, `@` or `/`: what user names, groups, uids and
/// extras usually look like. A user made of them must be accepted.
fn plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-._:@/".contains(&byte))
}

fn user_round_trip(user: &UserInfo) {
    let headers = match impersonation_headers(user) {
        Ok(headers) => headers,
        Err(error) => {
            let all_plain = plain(&user.username)
                && user.uid.as_deref().is_none_or(plain)
                && user.groups.iter().all(|group| plain(group))
                && user
                    .extra
                    .iter()
                    .all(|(key, values)| plain(key) && values.iter().all(|value| plain(value)));
            assert!(!all_plain, "refused a plain user {user:?}: {error}");
            return;
        }
    };

    // The headers as they travel: an HTTP/1.1 request head, parsed again.
    let mut wire = b"GET / HTTP/1.1\r\nhost: kube-apiserver\r\n".to_vec();
    for (name, value) in &headers {
        wire.extend_from_slice(name.as_str().as_bytes());
        wire.extend_from_slice(b": ");
        wire.extend_from_slice(value.as_bytes());
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"\r\n");
    let mut fields = vec![httparse::EMPTY_HEADER; headers.len() + 1];
    let mut request = httparse::Request::new(&mut fields);
    match request.parse(&wire) {
        Ok(httparse::Status::Complete(length)) => assert_eq!(length, wire.len()),
        other => panic!("the headers for {user:?} do not parse as HTTP/1.1: {other:?}"),
    }
    let mut received = HeaderMap::new();
    for field in request.headers.iter() {
        received.append(
            HeaderName::from_bytes(field.name.as_bytes()).expect("httparse yields valid names"),
            HeaderValue::from_bytes(field.value).expect("httparse yields valid values"),
        );
    }

    let (names, requested) = client_credentials(&received);
    assert_eq!(
        names.len(),
        received.keys_len() - 1,
        "every field but host is a credential"
    );
    let requested = requested.unwrap_or_else(|error| panic!("the headers for {user:?} are refused: {error}"));
    assert_eq!(requested.user.as_deref(), Some(user.username.as_str()), "user");
    assert_eq!(requested.uid, user.uid, "uid");
    assert_eq!(requested.groups, user.groups, "groups");
    let mut extra = requested.extra;
    extra.sort();
    let mut expected: Vec<(String, String)> = user
        .extra
        .iter()
        .flat_map(|(key, values)| values.iter().map(move |value| (key.clone(), value.clone())))
        .collect();
    expected.sort();
    assert_eq!(extra, expected, "extras of {user:?}");
}
