//! DPoP (RFC 9449): a client proves, at every token request, that it holds the private key a
//! session is bound to. The CLI makes proofs ([`proof`]); the Supervisor checks them ([`check`])
//! and binds a session to the key's thumbprint ([`thumbprint`], RFC 7638).
//!
//! What is checked here is what a proof says about itself (RFC 9449 §4.3 steps 2–11 but the
//! nonce and the replay check): its shape, type, algorithm, public key, signature, method, URL
//! and age. Whether its `jti` was seen before and whether its `nonce` is one the server issued
//! belong to the server, which keeps that state.
//!
//! No error here quotes a proof, a key or a nonce.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::rand::{SecureRandom as _, SystemRandom};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

use crate::jose::{parse_jwk, sign::SigningKey, JoseError, Jws};

/// The request header that carries a proof.
pub const HEADER: &str = "DPoP";
/// The response header that carries a server's nonce.
pub const NONCE_HEADER: &str = "DPoP-Nonce";
/// A proof's JWS `typ`.
pub const PROOF_TYPE: &str = "dpop+jwt";
/// The `token_type` of a DPoP-bound access token.
pub const TOKEN_TYPE: &str = "DPoP";
/// The OAuth error a server answers when a proof lacks the nonce it wants, together with a fresh
/// nonce in [`NONCE_HEADER`] (RFC 9449 §8).
pub const USE_NONCE_ERROR: &str = "use_dpop_nonce";
/// The OAuth error for a missing or bad proof (RFC 9449 §5).
pub const INVALID_PROOF_ERROR: &str = "invalid_dpop_proof";
/// The one algorithm Selkie's proofs use and its servers advertise
/// (`dpop_signing_alg_values_supported`).
pub const ALGORITHM: &str = "ES256";
/// The largest proof accepted (its public key is in its header; an ES256 proof is ~600 bytes).
pub const MAX_PROOF_BYTES: usize = 4096;
/// The longest `jti` accepted.
pub const MAX_JTI_BYTES: usize = 128;

/// Why a proof is not acceptable. Never quotes the proof or its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProofError {
    /// Longer than [`MAX_PROOF_BYTES`].
    #[error("the DPoP proof is longer than {MAX_PROOF_BYTES} bytes")]
    TooLong,
    /// Not a compact JWS with a JSON header and payload.
    #[error("the DPoP proof is not a well-formed JWT: {0}")]
    Malformed(&'static str),
    /// `typ` is not `dpop+jwt`.
    #[error("the DPoP proof's typ is not {PROOF_TYPE}")]
    WrongType,
    /// `crit` is present (Selkie understands no JWS extension).
    #[error("the DPoP proof has a crit header, which is not supported")]
    Critical,
    /// `jwk` is missing, is not a public key Selkie can verify with, or does not fit `alg`.
    #[error("the DPoP proof's jwk is not a public key for its alg: {0}")]
    BadKey(&'static str),
    /// `jwk` holds private key members.
    #[error("the DPoP proof's jwk holds a private key")]
    PrivateKey,
    /// The signature does not verify with `jwk`, or `alg` is not supported.
    #[error("the DPoP proof's signature does not verify: {0}")]
    Signature(String),
    /// A required claim is missing or of the wrong type.
    #[error("the DPoP proof has no {0} claim of the right type")]
    MissingClaim(&'static str),
    /// `htm` is not the request's method.
    #[error("the DPoP proof is for another HTTP method")]
    WrongMethod,
    /// `htu` is not the request's URL.
    #[error("the DPoP proof is for another URL")]
    WrongUrl,
    /// `iat` is outside the accepted window around the server's clock.
    #[error("the DPoP proof was made {0}s away from now, outside the accepted window")]
    OutOfWindow(i64),
}

/// The RFC 7638 thumbprint (SHA-256, base64url) of a public JWK: the hash of its required
/// members in lexicographic order. `None` for key types Selkie does not verify with.
pub fn thumbprint(jwk: &Value) -> Option<String> {
    let member = |name: &str| jwk.get(name).and_then(Value::as_str);
    // serde_json's Map keeps keys sorted (no preserve_order feature), which RFC 7638 requires.
    let canonical = match member("kty")? {
        "EC" => json!({"crv": member("crv")?, "kty": "EC", "x": member("x")?, "y": member("y")?}),
        "RSA" => json!({"e": member("e")?, "kty": "RSA", "n": member("n")?}),
        "OKP" => json!({"crv": member("crv")?, "kty": "OKP", "x": member("x")?}),
        _ => return None,
    };
    Some(B64URL.encode(Sha256::digest(canonical.to_string().as_bytes())))
}

/// A fresh proof by `key` for a `method` request to `url` (its query and fragment are left out,
/// as RFC 9449 says), made at `now` (seconds since the epoch), carrying the server's `nonce`
/// when there is one, with a random `jti`. Fails only when the system has no randomness.
pub fn proof(
    key: &SigningKey,
    method: &str,
    url: &str,
    nonce: Option<&str>,
    now: i64,
) -> Result<String, JoseError> {
    let mut jti = [0u8; 16];
    SystemRandom::new()
        .fill(&mut jti)
        .map_err(|_| JoseError::Signing)?;
    let mut claims = json!({
        "jti": B64URL.encode(jti),
        "htm": method,
        "htu": without_query(url),
        "iat": now,
    });
    if let Some(nonce) = nonce {
        claims["nonce"] = Value::String(nonce.to_string());
    }
    key.sign_dpop_proof(&claims)
}

/// A proof that passed [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedProof {
    /// The thumbprint of the proof's key (what a session is bound to).
    pub jkt: String,
    /// The proof's unique identifier (for the server's replay check).
    pub jti: String,
    /// When the client says it made the proof.
    pub iat: i64,
    /// The nonce it carries, if any (for the server to check).
    pub nonce: Option<String>,
}

/// How far from the server's clock a proof's `iat` may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Seconds a proof may be older than now.
    pub past: i64,
    /// Seconds a proof may claim to be from the future (clock skew).
    pub future: i64,
}

/// Checks `proof` (the one `DPoP` header of a request) for a `method` request to `url` at `now`
/// (seconds since the epoch): a compact JWS of `typ` `dpop+jwt`, no `crit`, signed with a
/// supported asymmetric algorithm by the public key in its `jwk` header, with a `jti`, `htm`
/// equal to `method`, `htu` equal to `url` (scheme and host case-insensitive, a default port
/// ignored, query and fragment ignored), and an `iat` within `window`. Returns the key's
/// thumbprint and the claims the server checks itself; otherwise the first check that failed.
pub fn check(
    proof: &str,
    method: &str,
    url: &str,
    now: i64,
    window: Window,
) -> Result<CheckedProof, ProofError> {
    if proof.len() > MAX_PROOF_BYTES {
        return Err(ProofError::TooLong);
    }
    let jws = Jws::parse(proof).map_err(|error| match error {
        JoseError::Malformed(what) => ProofError::Malformed(what),
        _ => ProofError::Malformed("it cannot be read"),
    })?;
    if jws.header.typ.as_deref() != Some(PROOF_TYPE) {
        return Err(ProofError::WrongType);
    }
    if jws.header.crit.is_some() {
        return Err(ProofError::Critical);
    }
    let jwk = jws
        .header
        .jwk
        .clone()
        .ok_or(ProofError::BadKey("there is none"))?;
    if ["d", "p", "q", "dp", "dq", "qi", "k"]
        .iter()
        .any(|private| jwk.get(private).is_some())
    {
        return Err(ProofError::PrivateKey);
    }
    let jkt = thumbprint(&jwk).ok_or(ProofError::BadKey("its key type is not supported"))?;
    let mut key = parse_jwk(jwk).ok_or(ProofError::BadKey("it cannot be used"))?;
    key.kid = jws.header.kid.clone();
    jws.verify(std::slice::from_ref(&key))
        .map_err(|error| ProofError::Signature(error.to_string()))?;

    let text = |name: &'static str| {
        jws.claims
            .get(name)
            .and_then(Value::as_str)
            .ok_or(ProofError::MissingClaim(name))
    };
    let jti = text("jti")?;
    if jti.is_empty() || jti.len() > MAX_JTI_BYTES {
        return Err(ProofError::MissingClaim("jti"));
    }
    if text("htm")? != method {
        return Err(ProofError::WrongMethod);
    }
    if normalized(text("htu")?) != normalized(url) {
        return Err(ProofError::WrongUrl);
    }
    let iat = jws
        .claims
        .get("iat")
        .and_then(Value::as_i64)
        .ok_or(ProofError::MissingClaim("iat"))?;
    let age = now.saturating_sub(iat);
    if age > window.past || -age > window.future {
        return Err(ProofError::OutOfWindow(age));
    }
    let nonce = match jws.claims.get("nonce") {
        None => None,
        Some(Value::String(nonce)) => Some(nonce.clone()),
        Some(_) => return Err(ProofError::MissingClaim("nonce")),
    };
    Ok(CheckedProof {
        jkt,
        jti: jti.to_string(),
        iat,
        nonce,
    })
}

/// `url` without its query and fragment.
fn without_query(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

/// `url` without query and fragment, its scheme and authority lower-cased and a default port
/// (443 for https, 80 for http) dropped: the syntax- and scheme-based normalisation of RFC 3986
/// §6 that RFC 9449 asks for.
fn normalized(url: &str) -> String {
    let url = without_query(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let scheme = scheme.to_ascii_lowercase();
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    let mut authority = authority.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    if !default_port.is_empty() && authority.ends_with(default_port) {
        authority.truncate(authority.len() - default_port.len());
    }
    format!("{scheme}://{authority}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "https://issuer.example.com/fd/oauth2/token";
    const WINDOW: Window = Window { past: 60, future: 5 };

    fn key() -> SigningKey {
        SigningKey::generate("dpop").unwrap()
    }

    #[test]
    fn a_proof_checks_and_names_its_keys_thumbprint() {
        let key = key();
        let proof = proof(&key, "POST", &format!("{URL}?x=1"), Some("n-1"), 1_000).unwrap();
        let checked = check(&proof, "POST", URL, 1_010, WINDOW).unwrap();
        assert_eq!(checked.jkt, thumbprint(&key.public_jwk()).unwrap());
        assert_eq!(checked.nonce.as_deref(), Some("n-1"));
        assert_eq!(checked.iat, 1_000);
        let again = super::proof(&key, "POST", URL, None, 1_000).unwrap();
        let again = check(&again, "POST", URL, 1_000, WINDOW).unwrap();
        assert_ne!(again.jti, checked.jti, "every proof has its own jti");
        assert_eq!(again.nonce, None);
        // Scheme and host case and the default port do not matter; the path does.
        check(
            &proof,
            "POST",
            "HTTPS://Issuer.Example.com:443/fd/oauth2/token",
            1_000,
            WINDOW,
        )
        .unwrap();
        assert_eq!(
            check(
                &proof,
                "POST",
                "https://issuer.example.com/FD/oauth2/token",
                1_000,
                WINDOW
            ),
            Err(ProofError::WrongUrl)
        );
    }

    #[test]
    fn rfc_7638s_example_thumbprint() {
        // RFC 7638 §3.1.
        let jwk = json!({
            "kty": "RSA",
            "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw",
            "e": "AQAB",
            "alg": "RS256",
            "kid": "2011-04-29",
        });
        assert_eq!(
            thumbprint(&jwk).as_deref(),
            Some("NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs")
        );
        assert_eq!(thumbprint(&json!({"kty": "oct", "k": "x"})), None);
    }

    #[test]
    fn forged_stale_and_misdirected_proofs_are_refused_with_the_reason() {
        let key = key();
        let good = proof(&key, "POST", URL, None, 1_000).unwrap();
        assert_eq!(
            check(&good, "GET", URL, 1_000, WINDOW),
            Err(ProofError::WrongMethod)
        );
        assert_eq!(
            check(
                &good,
                "POST",
                "https://issuer.example.com/other/oauth2/token",
                1_000,
                WINDOW
            ),
            Err(ProofError::WrongUrl)
        );
        assert_eq!(
            check(&good, "POST", URL, 1_061, WINDOW),
            Err(ProofError::OutOfWindow(61))
        );
        assert_eq!(
            check(&good, "POST", URL, 994, WINDOW),
            Err(ProofError::OutOfWindow(-6))
        );

        // The claims re-signed by another key, with the first key's jwk left in the header.
        let (header, rest) = good.split_once('.').unwrap();
        let (payload, _) = rest.split_once('.').unwrap();
        let other = proof(&SigningKey::generate("x").unwrap(), "POST", URL, None, 1_000).unwrap();
        let other_signature = other.rsplit_once('.').unwrap().1;
        let swapped = format!("{header}.{payload}.{other_signature}");
        assert!(matches!(
            check(&swapped, "POST", URL, 1_000, WINDOW),
            Err(ProofError::Signature(_))
        ));

        // Headers that are not a proof's.
        // The good proof's payload and signature under `header`, checked.
        let header_check = |header: Value| {
            let proof = format!(
                "{}.{payload}.{}",
                B64URL.encode(header.to_string()),
                good.rsplit_once('.').unwrap().1
            );
            check(&proof, "POST", URL, 1_000, WINDOW)
        };
        let public = {
            let jwk = key.public_jwk();
            json!({"kty": "EC", "crv": "P-256", "x": jwk["x"], "y": jwk["y"]})
        };
        assert_eq!(
            header_check(json!({"typ": "JWT", "alg": "ES256", "jwk": public})),
            Err(ProofError::WrongType)
        );
        assert_eq!(
            header_check(json!({"typ": PROOF_TYPE, "alg": "ES256"})),
            Err(ProofError::BadKey("there is none"))
        );
        assert_eq!(
            header_check(json!({"typ": PROOF_TYPE, "alg": "ES256", "jwk": key.private_jwk()})),
            Err(ProofError::PrivateKey)
        );
        assert_eq!(
            header_check(json!({"typ": PROOF_TYPE, "alg": "none", "jwk": public})),
            Err(ProofError::Signature(
                "the token is signed with \"none\", which is not supported".into()
            ))
        );
        assert_eq!(
            header_check(json!({"typ": PROOF_TYPE, "alg": "HS256", "jwk": {"kty": "oct", "k": "c2VjcmV0"}})),
            Err(ProofError::PrivateKey)
        );
        assert_eq!(
            header_check(json!({"typ": PROOF_TYPE, "alg": "ES256", "jwk": public, "crit": ["x"]})),
            Err(ProofError::Critical)
        );

        // Claims missing.
        // `claims` in a proof signed by the key, checked.
        let claims_check =
            |claims: Value| check(&key.sign_dpop_proof(&claims).unwrap(), "POST", URL, 1_000, WINDOW);
        assert_eq!(
            claims_check(json!({"htm": "POST", "htu": URL, "iat": 1_000})),
            Err(ProofError::MissingClaim("jti"))
        );
        assert_eq!(
            claims_check(json!({"jti": "a", "htm": "POST", "htu": URL})),
            Err(ProofError::MissingClaim("iat"))
        );
        assert_eq!(
            claims_check(json!({"jti": "a", "htm": "POST", "htu": URL, "iat": 1_000, "nonce": 5})),
            Err(ProofError::MissingClaim("nonce"))
        );
        assert_eq!(
            check("a.b", "POST", URL, 1_000, WINDOW),
            Err(ProofError::Malformed("it does not have three parts"))
        );
        assert_eq!(
            check(&"a".repeat(5_000), "POST", URL, 1_000, WINDOW),
            Err(ProofError::TooLong)
        );
    }

    #[test]
    fn errors_never_quote_the_proof() {
        let proof = proof(&key(), "POST", URL, Some("secret-nonce"), 1_000).unwrap();
        for error in [
            check(&proof, "GET", URL, 1_000, WINDOW).unwrap_err(),
            check(&proof, "POST", URL, 9_000, WINDOW).unwrap_err(),
        ] {
            let said = format!("{error} {error:?}");
            assert!(
                !said.contains("secret-nonce") && !said.contains(&proof[..20]),
                "{said}"
            );
        }
    }
}
