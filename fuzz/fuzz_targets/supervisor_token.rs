//! Token and revocation requests into the Supervisor's `oauth2/token` and `oauth2/revoke`
//! (`selkie_supervisor::Endpoints::handle`) at the FederationDomains of
//! `selkie_supervisor::fuzzing::Supervisor`, whose session store is empty: no code or token
//! was ever issued, so none the fuzzer sends can be valid.
//!
//! Input: `selector, form, 0x00, credentials`. The selector's bits 0-2 pick the client
//! authentication: none; HTTP Basic as `pinniped-cli` with an empty secret, or with the
//! credentials as secret; as the OIDCClient [`CLIENT_ID`] with its secret; as the client the
//! credentials name before a 0x01 with the secret after it (the OIDCClient's own ID gets its right
//! secret: a wrong one costs a bcrypt check of cost 12 by design, which would only slow the run);
//! the credentials as the whole `Authorization` value, or base64-encoded after `Basic `, or after
//! `Bearer ` — those three go to a Supervisor without the OIDCClient, for the same reason. Bit 3
//! sends the form verbatim; otherwise bits 4-5 pick a starting form (none, an authorization code
//! grant, a refresh grant, a token exchange, all of the CLI) and the form is a list of changes
//! split at 0x01: a change's first byte picks the parameter from [`PARAMS`] (modulo), its bit 6
//! adds it again instead of replacing it, its bit 7 makes the value a well-formed opaque token (the
//! prefix [`TOKEN_PREFIXES`] picked by the next byte's low 7 bits, then a key of the rest — 44
//! bytes, Selkie's format, when that byte's bit 7 is set, else 32, the earlier format — and a
//! 32-byte signature, in base64url, which only the HMAC check can refuse); otherwise the rest is the value, starting
//! with the [`VALUES`] entry the next byte picks when it is below `VALUES.len()`. Bit 6 posts to
//! `oauth2/revoke` instead, bit 7 to the FederationDomain `b`.
//!
//! Invariants (a violation panics): no request reaches the session store (a code or token is
//! looked up only once its signature checks); the token endpoint never answers 200; the
//! revocation endpoint answers 200 only with an empty body (RFC 7009 §2.2: an unknown token);
//! every other answer is an OAuth error as `expect_oauth_error` checks it (JSON, known code,
//! its status, `WWW-Authenticate: Basic` with `invalid_client`) and one a client can cause:
//! never `server_error`, `temporarily_unavailable` or `access_denied`.

#![no_main]

use std::sync::OnceLock;

use base64::{
    engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD},
    Engine as _,
};
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::Full;
use libfuzzer_sys::fuzz_target;
use selkie_fuzz::{answer, expect_oauth_error, runtime, text};
use selkie_supervisor::fuzzing::{Supervisor, CLIENT_ID, CLIENT_SECRET, DIRECTORY_ISSUER, ISSUER};

/// The parameters a change sets.
const PARAMS: [&str; 17] = [
    "grant_type",
    "code",
    "redirect_uri",
    "code_verifier",
    "client_id",
    "client_secret",
    "refresh_token",
    "scope",
    "subject_token",
    "subject_token_type",
    "requested_token_type",
    "audience",
    "username",
    "password",
    "token",
    "token_type_hint",
    "",
];
/// Values a change may start with.
const VALUES: [&str; 16] = [
    "authorization_code",
    "refresh_token",
    TOKEN_EXCHANGE,
    "password",
    "client_credentials",
    ACCESS_TOKEN_TYPE,
    "urn:ietf:params:oauth:token-type:jwt",
    "pinniped-cli",
    CLIENT_ID,
    CLIENT_SECRET,
    VERIFIER,
    REDIRECT_URI,
    "openid offline_access pinniped:request-audience username groups",
    "cluster-1",
    "client.oauth.pinniped.dev-other",
    "x.pinniped.dev",
];
/// The opaque tokens' prefixes (authorization code, access and refresh token), and others.
const TOKEN_PREFIXES: [&str; 5] = ["pin_ac_", "pin_at_", "pin_rt_", "", "pin_xx_"];
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// A PKCE verifier (RFC 7636 appendix B).
const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
const REDIRECT_URI: &str = "http://127.0.0.1:48095/callback";

struct Fixture {
    /// With the OIDCClient, which has verified its secret once.
    with_client: Supervisor,
    /// Without it: what arbitrary `Authorization` values go to.
    without_client: Supervisor,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        selkie_fuzz::install_crypto_provider();
        let build = |client| {
            runtime()
                .block_on(Supervisor::new(client))
                .expect("building the Supervisor")
        };
        Fixture {
            with_client: build(true),
            without_client: build(false),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let fixture = fixture();
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (form, credentials) = match rest.iter().position(|byte| *byte == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let body = if selector & 0b1000 != 0 {
        form.to_vec()
    } else {
        let mut params = starting_form((selector >> 4) & 0b11);
        for change in form.split(|byte| *byte == 1) {
            apply_change(&mut params, change);
        }
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&params)
            .finish()
            .into_bytes()
    };
    let basic = |id: &str, secret: &str| {
        let encode = |part: &str| form_urlencoded::byte_serialize(part.as_bytes()).collect::<String>();
        format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{}", encode(id), encode(secret)))
        )
    };
    let (authorization, supervisor) = match selector & 0b111 {
        0 => (None, &fixture.with_client),
        1 => (Some(basic("pinniped-cli", "").into_bytes()), &fixture.with_client),
        2 => (
            Some(basic("pinniped-cli", &text(credentials)).into_bytes()),
            &fixture.with_client,
        ),
        3 => (
            Some(basic(CLIENT_ID, CLIENT_SECRET).into_bytes()),
            &fixture.with_client,
        ),
        4 => {
            let (id, secret) = match credentials.iter().position(|byte| *byte == 1) {
                Some(at) => (text(&credentials[..at]), text(&credentials[at + 1..])),
                None => (text(credentials), String::new()),
            };
            let secret = if id == CLIENT_ID {
                CLIENT_SECRET.to_string()
            } else {
                secret
            };
            (Some(basic(&id, &secret).into_bytes()), &fixture.with_client)
        }
        5 => (Some(credentials.to_vec()), &fixture.without_client),
        6 => {
            let value = format!("Basic {}", STANDARD.encode(credentials));
            (Some(value.into_bytes()), &fixture.without_client)
        }
        _ => {
            let mut value = b"Bearer ".to_vec();
            value.extend_from_slice(credentials);
            (Some(value), &fixture.without_client)
        }
    };
    let revoke = selector & 0x40 != 0;
    let issuer = if selector & 0x80 != 0 {
        DIRECTORY_ISSUER
    } else {
        ISSUER
    };
    let path = if revoke { "oauth2/revoke" } else { "oauth2/token" };
    let mut request = Request::post(format!("{issuer}/{path}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(authorization) = authorization {
        let Ok(value) = http::HeaderValue::from_bytes(&authorization) else {
            return;
        };
        request = request.header(header::AUTHORIZATION, value);
    }
    let Ok(request) = request.body(Full::new(Bytes::from(body))) else {
        return;
    };
    let answer = answer(supervisor.endpoints(), request);
    assert_eq!(
        supervisor.take_store_requests(),
        0,
        "a token request reached the session store: {answer:?}"
    );
    if revoke && answer.status == StatusCode::OK {
        assert!(answer.body.is_empty(), "a revocation answered {answer:?}");
        return;
    }
    assert_ne!(
        answer.status,
        StatusCode::OK,
        "tokens for no valid grant: {answer:?}"
    );
    let error = expect_oauth_error(&answer, true);
    assert!(
        !["server_error", "temporarily_unavailable", "access_denied"].contains(&error.as_str()),
        "a token request without any valid grant answered {answer:?}"
    );
});

/// A well-formed opaque token with `prefix` whose key and signature are all zeros.
fn zero_token(prefix: &str) -> String {
    format!(
        "{prefix}{}.{}",
        URL_SAFE_NO_PAD.encode([0; 32]),
        URL_SAFE_NO_PAD.encode([0; 32])
    )
}

fn starting_form(kind: u8) -> Vec<(String, String)> {
    let (code, refresh, access) = (
        zero_token("pin_ac_"),
        zero_token("pin_rt_"),
        zero_token("pin_at_"),
    );
    let form: &[(&str, &str)] = match kind {
        0 => &[],
        1 => &[
            ("grant_type", "authorization_code"),
            ("client_id", "pinniped-cli"),
            ("code", &code),
            ("redirect_uri", REDIRECT_URI),
            ("code_verifier", VERIFIER),
        ],
        2 => &[
            ("grant_type", "refresh_token"),
            ("client_id", "pinniped-cli"),
            ("refresh_token", &refresh),
        ],
        _ => &[
            ("grant_type", TOKEN_EXCHANGE),
            ("client_id", "pinniped-cli"),
            ("subject_token", &access),
            ("subject_token_type", ACCESS_TOKEN_TYPE),
            ("requested_token_type", "urn:ietf:params:oauth:token-type:jwt"),
            ("audience", "cluster-1"),
        ],
    };
    form.iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn apply_change(params: &mut Vec<(String, String)>, change: &[u8]) {
    let Some((&what, rest)) = change.split_first() else {
        return;
    };
    let name = PARAMS[usize::from(what & 0x3f) % PARAMS.len()];
    let value = if what & 0x80 != 0 {
        let (pick, rest) = rest.split_first().map_or((0, rest), |(pick, rest)| (*pick, rest));
        // Bit 7 of the pick: a key of Selkie's format (44 bytes: login, generation, random),
        // else of the earlier one (32 random bytes); a 32-byte signature after it.
        let key_len = if pick & 0x80 != 0 { 44 } else { 32 };
        let mut bytes = [0u8; 76];
        let len = rest.len().min(key_len + 32);
        bytes[..len].copy_from_slice(&rest[..len]);
        format!(
            "{}{}.{}",
            TOKEN_PREFIXES[usize::from(pick & 0x7f) % TOKEN_PREFIXES.len()],
            URL_SAFE_NO_PAD.encode(&bytes[..key_len]),
            URL_SAFE_NO_PAD.encode(&bytes[key_len..key_len + 32])
        )
    } else {
        match rest.split_first() {
            Some((&pick, rest)) if usize::from(pick) < VALUES.len() => {
                format!("{}{}", VALUES[usize::from(pick)], text(rest))
            }
            _ => text(rest),
        }
    };
    if what & 0x40 == 0 {
        params.retain(|(existing, _)| existing != name);
    }
    params.push((name.to_string(), value));
}
