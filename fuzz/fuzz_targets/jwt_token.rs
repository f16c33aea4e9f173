//! Bearer tokens into `JwtAuthenticator::authenticate`, against a fixed key set (ES256, ES384,
//! EdDSA, RSA) whose private keys nobody has.
//!
//! An input whose first byte is below [`STRUCTURED`] is the token itself (lossy UTF-8). Otherwise
//! the rest is `selector, header JSON, 0x00, claims JSON, 0x00, signature bytes`, assembled into
//! `base64url(header).base64url(claims).base64url(signature)`: the header gets the `alg` and `kid`
//! the selector picks, the claims are those of an acceptable token with the configured issuer,
//! and the fuzzer's JSON objects are merged over both (`iss` stays). Those tokens pass routing and
//! reach algorithm and key selection and signature verification. With the selector's top bit
//! set, the two JSON parts are used verbatim instead.
//!
//! Invariants: no token is authenticated (none can carry a valid signature); a structured token
//! is never `NotMine`; and no token makes the authenticator fetch keys again, since refreshes are
//! rate-limited after the one made at start-up.

#![no_main]

use std::sync::OnceLock;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use libfuzzer_sys::fuzz_target;
use selkie_filters::{
    jwt::JwtAuthenticator,
    outcome::{Outcome, RejectReason},
};
use serde_json::{Map, Value};

/// An input whose first byte is at least this is structured (no ASCII token starts so).
const STRUCTURED: u8 = 0xF0;

/// Picked by the selector's low four bits: every supported algorithm, and lookalikes that must be
/// refused.
const ALGS: [&str; 16] = [
    "ES256", "ES384", "EdDSA", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "HS256", "none",
    "ES512", "es256", "Ed25519", "", "RS256 ",
];

fn authenticator() -> &'static JwtAuthenticator {
    static AUTHENTICATOR: OnceLock<JwtAuthenticator> = OnceLock::new();
    AUTHENTICATOR.get_or_init(selkie_fuzz::jwt_authenticator)
}

fuzz_target!(|data: &[u8]| {
    let authenticator = authenticator();
    let (token, routed) = match data.split_first() {
        Some((&flag, rest)) if flag >= STRUCTURED => structured(rest),
        _ => (String::from_utf8_lossy(data).into_owned(), false),
    };
    let outcome = selkie_fuzz::runtime().block_on(authenticator.authenticate(&token));
    match outcome {
        Outcome::Authenticated(identity) => {
            panic!("accepted a token no key signed, as {:?}: {token}", identity.user)
        }
        Outcome::NotMine if routed => panic!("a token with the configured issuer was NotMine: {token}"),
        Outcome::Rejected(RejectReason::UpstreamUnavailable) => {
            panic!("a token made the authenticator fetch keys despite the rate limit: {token}")
        }
        Outcome::NotMine | Outcome::Rejected(_) => {}
    }
});

/// The token a structured input describes, and whether it names the configured issuer.
fn structured(input: &[u8]) -> (String, bool) {
    let (selector, rest) = input.split_first().map_or((0, &[][..]), |(s, rest)| (*s, rest));
    let mut parts = rest.splitn(3, |b| *b == 0);
    let (header_part, claims_part, signature) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let verbatim = selector & 0x80 != 0;
    let (header, claims) = if verbatim {
        (header_part.to_vec(), claims_part.to_vec())
    } else {
        let mut header = Map::new();
        header.insert("alg".into(), ALGS[usize::from(selector & 0x0f)].into());
        // Bits 4-6: no kid, one of the key set's, one it lacks, or an empty one.
        let kid = usize::from((selector >> 4) & 0x07);
        match kid {
            0 => {}
            1..=5 => {
                header.insert("kid".into(), selkie_fuzz::KIDS[kid - 1].into());
            }
            6 => {
                header.insert("kid".into(), "".into());
            }
            _ => {
                header.insert("kid".into(), "hmac".into());
            }
        }
        merge(&mut header, header_part);
        let mut claims = selkie_fuzz::claims();
        merge(&mut claims, claims_part);
        claims.insert("iss".into(), selkie_fuzz::ISSUER.into());
        (
            Value::Object(header).to_string().into_bytes(),
            Value::Object(claims).to_string().into_bytes(),
        )
    };
    let token = format!(
        "{}.{}.{}",
        B64URL.encode(header),
        B64URL.encode(claims),
        B64URL.encode(signature)
    );
    (token, !verbatim)
}

/// Sets the members of `json` over `map`, if `json` is a JSON object.
fn merge(map: &mut Map<String, Value>, json: &[u8]) {
    if let Ok(Value::Object(members)) = serde_json::from_slice(json) {
        map.extend(members);
    }
}
