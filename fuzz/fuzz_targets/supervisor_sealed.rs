//! Sealed values — the upstream `state` of a login in progress and the CSRF cookie — opened by
//! `selkie_supervisor::fuzzing::Sealer` directly and by the endpoints that read them back (the
//! `callback` of the OIDC upstream at `ISSUER`, the directory's `login` page at
//! `DIRECTORY_ISSUER`).
//!
//! The selector's bits 0-1 pick the mode:
//!
//! 0. the rest (lossy UTF-8) is opened with sealers whose keys were drawn at random at start-up,
//!    for the `state` and CSRF purposes and another one; and the rest's first 32 bytes, or all of
//!    it, are taken as a key;
//! 1. a value sealed at start-up (a live one, and one that has expired) is changed — bit 2: its
//!    base64url text, else the bytes it decodes to — by the rest read as 3-byte patches (u16 LE
//!    offset, xor byte), and opened; the live one also with another purpose and as another
//!    FederationDomain's;
//! 2. a genuine `state` and CSRF cookie, from a real authorization request at start-up, go to the
//!    endpoint bit 2 picks (`callback`, else `login`, bit 3 picking POST for it) after the rest's
//!    patches: `state patches, 0x00, cookie patches, 0x00, text` (bit 4 patches the text instead of
//!    the bytes; bit 5 sends no cookie, bit 6 the other FederationDomain's); the text is the
//!    callback's `error_description`, or the login form's username;
//! 3. the same requests with the rest as `state, 0x00, cookie` verbatim.
//!
//! What goes to an endpoint never reaches an upstream: a callback carries an `error` (and a `code`
//! only with a changed `state`), a login form a username and password only with a changed one.
//!
//! Invariants (a violation panics): nothing opens unless it is unchanged and sealed with the key,
//! for the purpose and the FederationDomain it is opened for (the fuzzer cannot forge a value);
//! what fails to open is `Invalid`, and `Expired` only when a genuine value's time is over; a key
//! is accepted only if it has 32 bytes; an endpoint answers 400 to a `state` that does not open,
//! 403 to a genuine `state` without its genuine cookie, and goes on with the login only with both
//! (the callback redirects to the client with `access_denied`, the login page shows its form or
//! comes back to itself); the session store is never asked.

#![no_main]

use std::sync::OnceLock;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;
use ring::rand::{SecureRandom as _, SystemRandom};
use selkie_fuzz::{answer, runtime, text, Answer};
use selkie_supervisor::fuzzing::{
    SealError, Sealer, Supervisor, CSRF_COOKIE, CSRF_PURPOSE, DIRECTORY_ISSUER, ISSUER, OIDC_IDP,
    STATE_PURPOSE,
};
use serde_json::{json, Value};
use time::OffsetDateTime;

/// The CLI's redirect URI in the genuine requests.
const REDIRECT_URI: &str = "http://127.0.0.1:48095/callback";

struct Genuine {
    issuer: &'static str,
    state: String,
    cookie: String,
}

struct Fixture {
    /// Random keys, for `ISSUER`, and the same key for `DIRECTORY_ISSUER`.
    sealer: Sealer,
    same_key_other_issuer: Sealer,
    /// The key of `sealer`.
    key: [u8; 32],
    /// Sealed by `sealer` for `STATE_PURPOSE`: live and expired.
    live: String,
    expired: String,
    supervisor: Supervisor,
    /// A login in progress at `ISSUER` (OIDC), and at `DIRECTORY_ISSUER`.
    logins: [Genuine; 2],
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        selkie_fuzz::install_crypto_provider();
        let mut key = [0u8; 32];
        SystemRandom::new().fill(&mut key).expect("randomness");
        let sealer = Sealer::new(&key, ISSUER).expect("a 32-byte key");
        let now = OffsetDateTime::now_utc();
        let value = json!({"authorize_query": "client_id=pinniped-cli", "idp_name": OIDC_IDP});
        let live = sealer
            .seal(STATE_PURPOSE, &value, now + time::Duration::days(1))
            .expect("sealing");
        let expired = sealer
            .seal(STATE_PURPOSE, &value, now - time::Duration::seconds(2))
            .expect("sealing");
        let supervisor = runtime()
            .block_on(Supervisor::new(false))
            .expect("building the Supervisor");
        let logins = [ISSUER, DIRECTORY_ISSUER].map(|issuer| start_login(&supervisor, issuer));
        Fixture {
            same_key_other_issuer: Sealer::new(&key, DIRECTORY_ISSUER).expect("a 32-byte key"),
            sealer,
            key,
            live,
            expired,
            supervisor,
            logins,
        }
    })
}

/// A browser login started at `issuer`'s authorization endpoint: its sealed state and cookie.
fn start_login(supervisor: &Supervisor, issuer: &'static str) -> Genuine {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("client_id", "pinniped-cli"),
            ("redirect_uri", REDIRECT_URI),
            ("response_type", "code"),
            ("scope", "openid offline_access"),
            ("state", "state-0123456789"),
            ("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
            ("code_challenge_method", "S256"),
        ])
        .finish();
    let idp = if issuer == ISSUER {
        format!("&pinniped_idp_name={OIDC_IDP}")
    } else {
        String::new()
    };
    let request = Request::get(format!("{issuer}/oauth2/authorize?{query}{idp}"))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let started = answer(supervisor.endpoints(), request);
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{started:?}");
    let location = started.header(header::LOCATION);
    let state = form_urlencoded::parse(location.split_once('?').map_or("", |(_, query)| query).as_bytes())
        .find(|(name, _)| name == "state")
        .map(|(_, value)| value.into_owned())
        .expect("a sealed state");
    let cookie = started
        .header(header::SET_COOKIE)
        .strip_prefix(&format!("{CSRF_COOKIE}="))
        .and_then(|rest| rest.split(';').next())
        .expect("a CSRF cookie")
        .to_string();
    Genuine {
        issuer,
        state,
        cookie,
    }
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector & 0b11 {
        0 => open_anything(fixture, rest),
        1 => open_changed(fixture, selector, rest),
        mode => {
            let mut parts = rest.splitn(3, |byte| *byte == 0);
            let (first, second, third) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            let login = &fixture.logins[usize::from(selector & 0b100 == 0)];
            let (state, cookie, extra) = if mode == 2 {
                let cookie_of = if selector & 0x40 != 0 {
                    &fixture.logins[usize::from(selector & 0b100 != 0)].cookie
                } else {
                    &login.cookie
                };
                let text_patches = selector & 0x10 != 0;
                (
                    patched(&login.state, first, text_patches),
                    (selector & 0x20 == 0).then(|| patched(cookie_of, second, text_patches)),
                    text(third),
                )
            } else {
                (text(first), Some(text(second)), String::new())
            };
            to_endpoint(
                fixture,
                login,
                selector & 0b1000 != 0,
                &state,
                cookie.as_deref(),
                &extra,
            );
        }
    }
});

fn open_anything(fixture: &Fixture, rest: &[u8]) {
    let now = OffsetDateTime::now_utc();
    let value = text(rest);
    for purpose in [STATE_PURPOSE, CSRF_PURPOSE, "other"] {
        for sealer in [&fixture.sealer, &fixture.same_key_other_issuer] {
            let opened = sealer.open::<Value>(purpose, &value, now);
            assert_eq!(opened, Err(SealError::Invalid), "{value:?} opened for {purpose}");
        }
    }
    for key in [rest, &rest[..rest.len().min(32)]] {
        match Sealer::new(key, ISSUER) {
            Ok(sealer) => {
                assert_eq!(key.len(), 32, "a key of {} bytes was accepted", key.len());
                let opened = sealer.open::<Value>(STATE_PURPOSE, &fixture.live, now);
                assert_eq!(
                    opened.is_ok(),
                    key == fixture.key,
                    "another key opened the value, or the key did not"
                );
            }
            Err(error) => {
                assert_eq!(error, SealError::BadKey);
                assert_ne!(key.len(), 32, "a 32-byte key was refused");
            }
        }
    }
}

/// `genuine` changed by `patches` (3-byte u16 LE offset and xor byte): its text, or the bytes it
/// decodes to, encoded again.
fn patched(genuine: &str, patches: &[u8], text_patches: bool) -> String {
    let mut bytes = if text_patches {
        genuine.as_bytes().to_vec()
    } else {
        URL_SAFE_NO_PAD
            .decode(genuine)
            .expect("a genuine value is base64url")
    };
    if bytes.is_empty() {
        return genuine.to_string();
    }
    for patch in patches.chunks_exact(3) {
        let offset = usize::from(u16::from_le_bytes([patch[0], patch[1]])) % bytes.len();
        bytes[offset] ^= patch[2];
    }
    if text_patches {
        text(&bytes)
    } else {
        URL_SAFE_NO_PAD.encode(bytes)
    }
}

fn open_changed(fixture: &Fixture, selector: u8, patches: &[u8]) {
    let now = OffsetDateTime::now_utc();
    let text_patches = selector & 0b100 != 0;
    let live = patched(&fixture.live, patches, text_patches);
    let opened = fixture.sealer.open::<Value>(STATE_PURPOSE, &live, now);
    if live == fixture.live {
        assert!(opened.is_ok(), "a genuine value did not open: {opened:?}");
    } else {
        assert_eq!(opened, Err(SealError::Invalid), "a changed value opened");
    }
    for (sealer, purpose) in [
        (&fixture.sealer, CSRF_PURPOSE),
        (&fixture.same_key_other_issuer, STATE_PURPOSE),
    ] {
        let opened = sealer.open::<Value>(purpose, &live, now);
        assert_eq!(
            opened,
            Err(SealError::Invalid),
            "opened for another purpose or FederationDomain"
        );
    }
    let expired = patched(&fixture.expired, patches, text_patches);
    let opened = fixture.sealer.open::<Value>(STATE_PURPOSE, &expired, now);
    let expected = if expired == fixture.expired {
        SealError::Expired
    } else {
        SealError::Invalid
    };
    assert_eq!(opened, Err(expected), "an expired value, changed or not");
}

/// Sends `state` and `cookie` to the callback (`login` at `ISSUER`) or the login page.
fn to_endpoint(
    fixture: &Fixture,
    login: &Genuine,
    post: bool,
    state: &str,
    cookie: Option<&str>,
    extra: &str,
) {
    let genuine_state = state == login.state;
    let callback = login.issuer == ISSUER;
    let mut form = vec![("state", state.to_string())];
    if callback {
        form.push(("error", "access_denied".into()));
        form.push(("error_description", extra.to_string()));
        if !genuine_state {
            form.push(("code", "upstream-code".into()));
        }
    } else if post {
        // A username and password reach the directory only with a genuine state.
        let username = if genuine_state { "" } else { extra };
        form.push(("username", username.to_string()));
        form.push(("password", if genuine_state { "" } else { "pw" }.into()));
    }
    let encoded = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&form)
        .finish();
    let path = if callback { "callback" } else { "login" };
    let post = post && !callback;
    let mut request = if post {
        Request::builder()
            .method(Method::POST)
            .uri(format!("{}/{path}", login.issuer))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
    } else {
        Request::builder()
            .method(Method::GET)
            .uri(format!("{}/{path}?{encoded}", login.issuer))
    };
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, format!("{CSRF_COOKIE}={cookie}"));
    }
    let body = if post { encoded } else { String::new() };
    let Ok(request) = request.body(Full::new(Bytes::from(body))) else {
        return; // a cookie HTTP cannot carry
    };
    let supervisor = &fixture.supervisor;
    let answer = answer(supervisor.endpoints(), request);
    assert_eq!(
        supervisor.take_store_requests(),
        0,
        "the session store was asked: {answer:?}"
    );
    let genuine_cookie = cookie.is_some_and(|cookie| cookie == login.cookie);
    if state.is_empty() || !genuine_state {
        // The fuzzer cannot seal: nothing else opens (an empty state is not even looked at).
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        return;
    }
    if !genuine_cookie {
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
        return;
    }
    logged_in(login, callback, post, &answer);
}

/// What a genuine state with its cookie gets.
fn logged_in(login: &Genuine, callback: bool, post: bool, answer: &Answer) {
    let location = answer.header(header::LOCATION);
    if callback {
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
        let (base, query) = location.split_once('?').expect("a query");
        assert_eq!(base, REDIRECT_URI);
        let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        assert!(
            params.contains(&("error".into(), "access_denied".into())),
            "{location}"
        );
        assert!(
            params.contains(&("state".into(), "state-0123456789".into())),
            "{location}"
        );
    } else if post {
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{answer:?}");
        let expected = format!("{DIRECTORY_ISSUER}/login?");
        assert!(location.starts_with(&expected), "{location}");
        assert!(
            location.ends_with("&err=incorrect_username_or_password"),
            "{location}"
        );
    } else {
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert!(text(&answer.body).contains("<form method=\"post\""), "{answer:?}");
    }
    let _ = login;
}
