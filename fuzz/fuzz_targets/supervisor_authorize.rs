//! Authorization requests into the Supervisor's `oauth2/authorize`
//! (`selkie_supervisor::Endpoints::handle`), at the two FederationDomains of
//! `selkie_supervisor::fuzzing::Supervisor`: [`ISSUER`] (an OIDC upstream without the password
//! grant and a GitHub one) and [`DIRECTORY_ISSUER`] (a directory), with the CLI and one
//! OIDCClient as clients. No upstream is asked and sessions are kept in memory.
//!
//! Input: `selector, rest`. Selector bit 0 sends the request as a POST form instead of a GET
//! query; bits 1-2 pick the FederationDomain ([`ISSUER`] unless both are set); bit 3 sends a
//! genuine CSRF cookie (sealed by the FederationDomain) as the only cookie. With bit 4 set the
//! rest is the query (or form body) verbatim: bytes a URL cannot carry are percent-encoded for a
//! GET. Otherwise bits 5-6 pick a starting request (none, a good one of the CLI naming the OIDC
//! upstream, a good one of the OIDCClient, a good one of the CLI naming no upstream), and the
//! rest is a list of changes split at 0x00: a change's first byte picks what it sets from
//! [`PARAMS`] (modulo, past them the `Pinniped-Username`, `Pinniped-Password` and `Cookie`
//! headers), its bit 6 adds the parameter again instead of replacing it, its bit 7 starts the
//! value with the [`VALUES`] entry the next byte picks; the remaining bytes are the value (lossy
//! UTF-8). The password headers are sent to [`ISSUER`] only: at [`DIRECTORY_ISSUER`] they would
//! make the Supervisor ask the directory, which does not exist.
//!
//! Invariants (a violation panics):
//!
//! * no code is issued: the session store gets no request at all, no redirect carries a `code`,
//!   no `form_post` page has one;
//! * every answer is one of: a redirect (303, no-store) back to a redirect URI the request's
//!   client registered, carrying only `error` (a known OAuth code), `error_description` and
//!   the request's `state`; the same as a `form_post` page (the CLI only); a direct OAuth error
//!   (`invalid_client` 401 or `invalid_request` 400, JSON); the identity-provider chooser of
//!   [`ISSUER`] with the request's query; or the continuation of the login — the upstream's
//!   authorization page (OIDC, GitHub) or the FederationDomain's login page (directory) — whose
//!   `state` opens with the FederationDomain's key as the request as it came, the upstream it
//!   goes to and a CSRF value, that value being the genuine cookie's when one was sent, else the
//!   one a new `Set-Cookie` carries.

#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;
use selkie_fuzz::{answer, expect_oauth_error, runtime, text, Answer};
use selkie_supervisor::fuzzing::{
    Supervisor, CLIENT_ID, CLIENT_REDIRECT_URIS, CSRF_COOKIE, CSRF_PURPOSE, DIRECTORY_ISSUER,
    GITHUB_AUTHORIZE_URL, GITHUB_IDP, ISSUER, LDAP_IDP, OIDC_AUTHORIZE_URL, OIDC_IDP, STATE_PURPOSE,
};
use serde_json::Value;
use time::OffsetDateTime;

/// The parameters a change sets.
const PARAMS: [&str; 16] = [
    "client_id",
    "redirect_uri",
    "response_type",
    "scope",
    "state",
    "nonce",
    "code_challenge",
    "code_challenge_method",
    "prompt",
    "pinniped_idp_name",
    "pinniped_idp_type",
    "response_mode",
    "access_type",
    "code",
    "max_age",
    "",
];
/// Values a change may start with.
const VALUES: [&str; 24] = [
    "pinniped-cli",
    CLIENT_ID,
    "http://127.0.0.1:",
    "http://[::1]:48095/callback",
    "https://app.fuzz.test/callback",
    "code",
    "openid offline_access pinniped:request-audience username groups",
    "openid",
    CHALLENGE,
    "S256",
    "plain",
    "none",
    "login",
    "form_post",
    "query",
    OIDC_IDP,
    GITHUB_IDP,
    LDAP_IDP,
    "oidc",
    "github",
    "ldap",
    "state-0123456789",
    "nonce-0123456789",
    "__Host-pinniped-csrf-v2=",
];
/// A S256 challenge (RFC 7636 appendix B).
const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

struct Fixture {
    supervisor: Supervisor,
    /// Per FederationDomain: a sealed CSRF cookie value, and the CSRF value it holds.
    cookies: [(String, String); 2],
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        selkie_fuzz::install_crypto_provider();
        let supervisor = runtime()
            .block_on(Supervisor::new(true))
            .expect("building the Supervisor");
        let cookie = |issuer: &str| {
            let csrf = format!("fuzz-csrf-{issuer}");
            let expires = OffsetDateTime::now_utc() + time::Duration::days(1);
            let sealed = supervisor
                .sealer(issuer)
                .expect("the FederationDomain exists")
                .seal(CSRF_PURPOSE, &csrf, expires)
                .expect("sealing a CSRF value");
            (sealed, csrf)
        };
        let cookies = [cookie(ISSUER), cookie(DIRECTORY_ISSUER)];
        Fixture { supervisor, cookies }
    })
}

/// A request as the fuzz target sends it.
struct Sent {
    issuer: &'static str,
    post: bool,
    /// The query (GET) or form body (POST) as sent.
    encoded: String,
    /// Its parameters, decoded.
    params: Vec<(String, String)>,
    /// The genuine CSRF value sent, if any.
    csrf: Option<String>,
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let post = selector & 1 != 0;
    let (issuer, cookie_index) = if selector & 0b110 == 0b110 {
        (DIRECTORY_ISSUER, 1)
    } else {
        (ISSUER, 0)
    };
    let mut headers: Vec<(&str, String)> = Vec::new();
    let encoded = if selector & 0x10 != 0 {
        if post {
            text(rest)
        } else {
            query_of(rest)
        }
    } else {
        let mut params = starting_request(selector >> 5);
        for change in rest.split(|byte| *byte == 0) {
            apply_change(&mut params, &mut headers, change);
        }
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&params)
            .finish()
    };
    if issuer == DIRECTORY_ISSUER {
        headers.retain(|(name, _)| !name.starts_with("pinniped-"));
    }
    let mut csrf = None;
    if selector & 0b1000 != 0 {
        headers.retain(|(name, _)| *name != "cookie");
        let (sealed, value) = &fixture.cookies[cookie_index];
        headers.push(("cookie", format!("theme=dark; {CSRF_COOKIE}={sealed}")));
        csrf = Some(value.clone());
    }
    let uri = if post {
        format!("{issuer}/oauth2/authorize")
    } else {
        format!("{issuer}/oauth2/authorize?{encoded}")
    };
    let mut request = Request::builder()
        .method(if post { Method::POST } else { Method::GET })
        .uri(uri);
    if post {
        request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    for (name, value) in &headers {
        request = request.header(*name, value.as_str());
    }
    let body = if post { encoded.clone() } else { String::new() };
    let Ok(request) = request.body(Full::new(Bytes::from(body))) else {
        return; // a header value HTTP cannot carry
    };
    let params: Vec<(String, String)> = form_urlencoded::parse(encoded.as_bytes()).into_owned().collect();
    let answer = answer(fixture.supervisor.endpoints(), request);
    let sent = Sent {
        issuer,
        post,
        encoded,
        params,
        csrf,
    };
    check(fixture, &sent, &answer);
});

/// `bytes` as a query: what a URL cannot carry percent-encoded.
fn query_of(bytes: &[u8]) -> String {
    let mut query = String::new();
    for byte in bytes {
        if byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(byte) {
            query.push(char::from(*byte));
        } else {
            query.push_str(&format!("%{byte:02X}"));
        }
    }
    query
}

fn starting_request(kind: u8) -> Vec<(String, String)> {
    let (client, redirect_uri, idp) = match kind & 0b11 {
        0 => return Vec::new(),
        1 => ("pinniped-cli", "http://127.0.0.1:48095/callback", Some(OIDC_IDP)),
        2 => (CLIENT_ID, CLIENT_REDIRECT_URIS[0], Some(GITHUB_IDP)),
        _ => ("pinniped-cli", "http://127.0.0.1:48095/callback", None),
    };
    let mut params = vec![
        ("client_id", client),
        ("redirect_uri", redirect_uri),
        ("response_type", "code"),
        (
            "scope",
            "openid offline_access pinniped:request-audience username groups",
        ),
        ("state", "state-0123456789"),
        ("nonce", "nonce-0123456789"),
        ("code_challenge", CHALLENGE),
        ("code_challenge_method", "S256"),
    ];
    if let Some(idp) = idp {
        params.push(("pinniped_idp_name", idp));
    }
    params
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn apply_change(params: &mut Vec<(String, String)>, headers: &mut Vec<(&str, String)>, change: &[u8]) {
    let Some((&what, rest)) = change.split_first() else {
        return;
    };
    let mut value = String::new();
    let rest = if what & 0x80 != 0 {
        match rest.split_first() {
            Some((&pick, rest)) => {
                value.push_str(VALUES[usize::from(pick) % VALUES.len()]);
                rest
            }
            None => rest,
        }
    } else {
        rest
    };
    value.push_str(&text(rest));
    let index = usize::from(what & 0x3f) % (PARAMS.len() + 3);
    let header = match index.checked_sub(PARAMS.len()) {
        Some(0) => Some("pinniped-username"),
        Some(1) => Some("pinniped-password"),
        Some(_) => Some("cookie"),
        None => None,
    };
    if let Some(header) = header {
        headers.retain(|(name, _)| *name != header);
        headers.push((header, value));
        return;
    }
    let name = PARAMS[index];
    if what & 0x40 == 0 {
        params.retain(|(existing, _)| existing != name);
    }
    params.push((name.to_string(), value));
}

/// The values of parameter `name` in the request.
fn values<'a>(sent: &'a Sent, name: &'a str) -> impl Iterator<Item = &'a str> {
    sent.params
        .iter()
        .filter(move |(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

fn check(fixture: &Fixture, sent: &Sent, answer: &Answer) {
    let supervisor = &fixture.supervisor;
    assert_eq!(
        supervisor.take_store_requests(),
        0,
        "an authorization request reached the session store"
    );
    assert_eq!(supervisor.stored_sessions(), 0, "a session was stored");
    match answer.status {
        StatusCode::SEE_OTHER => redirected(fixture, sent, answer),
        StatusCode::OK => form_post_page(sent, answer),
        status if status.is_client_error() => {
            let error = expect_oauth_error(answer, false);
            assert!(
                ["invalid_client", "invalid_request"].contains(&error.as_str()),
                "a direct refusal with {error}: {answer:?}"
            );
        }
        _ => panic!("an unexpected answer: {answer:?}"),
    }
}

fn redirected(fixture: &Fixture, sent: &Sent, answer: &Answer) {
    assert_eq!(answer.header(header::CACHE_CONTROL), "no-store", "{answer:?}");
    let location = answer.header(header::LOCATION);
    assert!(!location.is_empty(), "a redirect without a Location: {answer:?}");
    let (base, query) = location.split_once('?').unwrap_or((location, ""));
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let chooser = format!("{ISSUER}/choose_identity_provider");
    let login_page = format!("{DIRECTORY_ISSUER}/login");
    let upstream = match base {
        OIDC_AUTHORIZE_URL if sent.issuer == ISSUER => Some(OIDC_IDP),
        GITHUB_AUTHORIZE_URL if sent.issuer == ISSUER => Some(GITHUB_IDP),
        _ if base == login_page && sent.issuer == DIRECTORY_ISSUER => Some(LDAP_IDP),
        _ => None,
    };
    if let Some(idp) = upstream {
        assert!(param("code").is_none(), "{location}");
        let state = param("state").expect("the upstream gets a state");
        continued(fixture, sent, answer, idp, state);
        return;
    }
    if base == chooser && sent.issuer == ISSUER {
        let expected = if sent.post {
            reencoded(&sent.encoded)
        } else {
            sent.encoded.clone()
        };
        assert_eq!(query, expected, "the chooser gets the request as it came");
        // The last value counts; an empty one names nothing.
        assert!(
            values(sent, "pinniped_idp_name").last().is_none_or(str::is_empty),
            "{location}"
        );
        return;
    }
    // Back to the client: with an error, at one of its redirect URIs.
    let supervisor = &fixture.supervisor;
    let allowed = values(sent, "client_id").any(|id| {
        supervisor
            .client(sent.issuer, id)
            .is_some_and(|client| client.allows_redirect(base))
    });
    assert!(
        allowed,
        "redirected to {base:?}, no redirect URI of the request's client"
    );
    assert!(values(sent, "redirect_uri").any(|uri| uri == base), "{location}");
    for (key, _) in &params {
        assert!(
            ["error", "error_description", "state"].contains(&key.as_str()),
            "the client is sent {key}: {location}"
        );
    }
    let error = param("error").expect("the client is sent an error");
    assert!(
        selkie_fuzz::OAUTH_ERRORS.iter().any(|(code, _)| *code == error),
        "{location}"
    );
    if let Some(state) = param("state") {
        assert!(values(sent, "state").any(|sent| sent == state), "{location}");
    }
}

/// The query string the endpoint makes of a form body (its pairs, encoded again).
fn reencoded(body: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form_urlencoded::parse(body.as_bytes()))
        .finish()
}

/// A login that goes on at `idp` with the sealed `state`.
fn continued(fixture: &Fixture, sent: &Sent, answer: &Answer, idp: &str, state: &str) {
    let now = OffsetDateTime::now_utc();
    let sealer = fixture
        .supervisor
        .sealer(sent.issuer)
        .expect("the FederationDomain exists");
    let opened: Value = sealer
        .open(STATE_PURPOSE, state, now)
        .unwrap_or_else(|e| panic!("the upstream state does not open: {e}"));
    let expected = if sent.post {
        reencoded(&sent.encoded)
    } else {
        sent.encoded.clone()
    };
    assert_eq!(opened["authorize_query"], expected.as_str(), "the sealed request");
    assert_eq!(opened["idp_name"], idp, "the sealed upstream");
    let csrf = opened["csrf"].as_str().expect("a sealed CSRF value");
    let set_cookie = answer.header(header::SET_COOKIE);
    match &sent.csrf {
        Some(genuine) => {
            assert_eq!(csrf, genuine, "the login's CSRF value is not the cookie's");
            assert!(
                set_cookie.is_empty(),
                "a new cookie despite a genuine one: {set_cookie}"
            );
        }
        None => {
            let cookie = set_cookie
                .strip_prefix(&format!("{CSRF_COOKIE}="))
                .and_then(|rest| rest.split(';').next())
                .unwrap_or_else(|| panic!("no new CSRF cookie: {answer:?}"));
            let opened: String = sealer
                .open(CSRF_PURPOSE, cookie, now)
                .unwrap_or_else(|e| panic!("the new CSRF cookie does not open: {e}"));
            assert_eq!(opened, csrf, "the new cookie's CSRF value is not the login's");
            assert!(set_cookie.contains("; HttpOnly; Secure;"), "{set_cookie}");
        }
    }
}

fn form_post_page(sent: &Sent, answer: &Answer) {
    assert_eq!(
        answer.header(header::CONTENT_TYPE),
        "text/html; charset=utf-8",
        "{answer:?}"
    );
    let page = text(&answer.body);
    assert!(!page.contains(r#"name="code""#), "a form_post page with a code");
    assert!(
        page.contains(r#"name="error""#),
        "a form_post page without an error"
    );
    assert!(
        values(sent, "response_mode").any(|mode| mode == "form_post"),
        "a form_post page for a request that did not ask for one"
    );
}
