//! Just enough JOSE for the OIDC login: split a compact JWS, verify its signature with a key
//! from the issuer's JWKS (RS256/384/512, PS256/384/512, ES256/384), and read its claims.
//! Verification is done on ring directly.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Why a token was not accepted. Messages never quote the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum JoseError {
    /// Not three base64url parts, or a part is not the JSON it should be.
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    /// The header names an algorithm Selkie does not verify (or `none`).
    #[error("the token is signed with {0:?}, which is not supported")]
    UnsupportedAlgorithm(String),
    /// The JWKS has no key that fits the token's `kid` and algorithm.
    #[error("the issuer's JWKS has no key for this token (kid {0:?})")]
    NoKey(String),
    /// No key of the JWKS verifies the signature.
    #[error("the token's signature does not verify with the issuer's keys")]
    BadSignature,
    /// The JWKS document is not a JWK set.
    #[error("the issuer's JWKS is not a JWK set: {0}")]
    BadJwks(String),
}

/// A JWK set, as published at `jwks_uri`.
#[derive(Debug, Clone, Deserialize)]
pub struct Jwks {
    /// The keys.
    pub keys: Vec<Jwk>,
}

/// One JWK (only the members verification needs).
#[derive(Debug, Clone, Deserialize)]
pub struct Jwk {
    /// `kty`: `RSA` or `EC`.
    pub kty: String,
    /// `kid`.
    #[serde(default)]
    pub kid: Option<String>,
    /// `alg`, when the key is bound to one.
    #[serde(default)]
    pub alg: Option<String>,
    /// `use`: keys for `enc` are skipped.
    #[serde(default, rename = "use")]
    pub use_: Option<String>,
    /// RSA modulus.
    #[serde(default)]
    pub n: Option<String>,
    /// RSA exponent.
    #[serde(default)]
    pub e: Option<String>,
    /// EC curve.
    #[serde(default)]
    pub crv: Option<String>,
    /// EC x.
    #[serde(default)]
    pub x: Option<String>,
    /// EC y.
    #[serde(default)]
    pub y: Option<String>,
}

impl Jwks {
    /// Parses a JWKS document.
    pub fn parse(bytes: &[u8]) -> Result<Self, JoseError> {
        serde_json::from_slice(bytes).map_err(|e| JoseError::BadJwks(e.to_string()))
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

/// The claims of `token`, without checking anything (for a token already verified, or to show
/// what it says).
pub fn claims_unverified(token: &str) -> Result<Map<String, Value>, JoseError> {
    let parts: Vec<&str> = token.split('.').collect();
    let [_, payload, _] = parts.as_slice() else {
        return Err(JoseError::Malformed("it does not have three parts".into()));
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|_| JoseError::Malformed("the payload is not base64url".into()))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| JoseError::Malformed("the payload is not a JSON object".into()))
}

/// Verifies `token`'s signature with a key of `jwks` and returns its claims. Keys are chosen by
/// `kid` when the token has one; otherwise every key of a fitting type is tried.
pub fn verify(token: &str, jwks: &Jwks) -> Result<Map<String, Value>, JoseError> {
    let parts: Vec<&str> = token.split('.').collect();
    let [header_b64, _, signature_b64] = parts.as_slice() else {
        return Err(JoseError::Malformed("it does not have three parts".into()));
    };
    let header_bytes = URL_SAFE_NO_PAD
        .decode(header_b64)
        .map_err(|_| JoseError::Malformed("the header is not base64url".into()))?;
    let header: Header = serde_json::from_slice(&header_bytes)
        .map_err(|_| JoseError::Malformed("the header is not a JOSE header".into()))?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| JoseError::Malformed("the signature is not base64url".into()))?;
    let signed = &token.as_bytes()[..header_b64.len() + 1 + parts[1].len()];
    let kty = match header.alg.as_str() {
        "RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512" => "RSA",
        "ES256" | "ES384" => "EC",
        other => return Err(JoseError::UnsupportedAlgorithm(other.to_string())),
    };
    let candidates: Vec<&Jwk> = jwks
        .keys
        .iter()
        .filter(|key| key.kty == kty)
        .filter(|key| key.use_.as_deref() != Some("enc"))
        .filter(|key| key.alg.as_deref().is_none_or(|alg| alg == header.alg))
        .filter(|key| match (&header.kid, &key.kid) {
            (Some(wanted), Some(kid)) => wanted == kid,
            _ => true,
        })
        .collect();
    if candidates.is_empty() {
        return Err(JoseError::NoKey(header.kid.unwrap_or_default()));
    }
    if candidates
        .iter()
        .any(|key| verify_with(key, &header.alg, signed, &signature))
    {
        claims_unverified(token)
    } else {
        Err(JoseError::BadSignature)
    }
}

fn verify_with(key: &Jwk, alg: &str, message: &[u8], signature: &[u8]) -> bool {
    let decode = |value: &Option<String>| value.as_deref().and_then(|v| URL_SAFE_NO_PAD.decode(v).ok());
    match key.kty.as_str() {
        "RSA" => {
            let (Some(n), Some(e)) = (decode(&key.n), decode(&key.e)) else {
                return false;
            };
            let params: &signature::RsaParameters = match alg {
                "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                "PS512" => &signature::RSA_PSS_2048_8192_SHA512,
                _ => return false,
            };
            RsaPublicKeyComponents { n: &n, e: &e }
                .verify(params, message, signature)
                .is_ok()
        }
        "EC" => {
            let (Some(x), Some(y)) = (decode(&key.x), decode(&key.y)) else {
                return false;
            };
            let (algorithm, crv, size): (&signature::EcdsaVerificationAlgorithm, _, _) = match alg {
                "ES256" => (&signature::ECDSA_P256_SHA256_FIXED, "P-256", 32),
                "ES384" => (&signature::ECDSA_P384_SHA384_FIXED, "P-384", 48),
                _ => return false,
            };
            if key.crv.as_deref() != Some(crv) || x.len() != size || y.len() != size {
                return false;
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            UnparsedPublicKey::new(algorithm, point)
                .verify(message, signature)
                .is_ok()
        }
        _ => false,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::{
        rand::SystemRandom,
        signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING},
    };

    /// A fresh ES256 key and a JWKS with its public half (`kid` `k1`).
    pub(crate) fn es256_key() -> (EcdsaKeyPair, Jwks) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let public = pair.public_key().as_ref();
        let jwks = Jwks::parse(
            serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1",
                "x": URL_SAFE_NO_PAD.encode(&public[1..33]), "y": URL_SAFE_NO_PAD.encode(&public[33..])}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        (pair, jwks)
    }

    /// A token signed by `pair` with `header` and `claims`.
    pub(crate) fn sign(pair: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = pair.sign(&SystemRandom::new(), signing_input.as_bytes()).unwrap();
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }

    #[test]
    fn verifies_a_good_signature_and_refuses_a_bad_one() {
        let (pair, jwks) = es256_key();
        let header = serde_json::json!({"alg": "ES256", "kid": "k1"});
        let token = sign(&pair, &header, &serde_json::json!({"sub": "me"}));
        assert_eq!(verify(&token, &jwks).unwrap()["sub"], "me");

        let (other, _) = es256_key();
        let forged = sign(&other, &header, &serde_json::json!({"sub": "me"}));
        assert_eq!(verify(&forged, &jwks), Err(JoseError::BadSignature));

        let unknown_kid = sign(
            &pair,
            &serde_json::json!({"alg": "ES256", "kid": "k2"}),
            &serde_json::json!({}),
        );
        assert_eq!(verify(&unknown_kid, &jwks), Err(JoseError::NoKey("k2".into())));

        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode("{}")
        );
        assert_eq!(
            verify(&none, &jwks),
            Err(JoseError::UnsupportedAlgorithm("none".into()))
        );
        assert!(matches!(verify("a.b", &jwks), Err(JoseError::Malformed(_))));
    }
}
