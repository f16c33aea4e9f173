//! ES256 signing keys: what an issuer (the Supervisor) signs its tokens with, and the JWKs it
//! publishes and stores.
//!
//! A key is an ECDSA P-256 key pair held by ring. It is written as a private JWK (`kty` `EC`,
//! `crv` `P-256`, `x`, `y`, `d`, `kid`, `use` `sig`, `alg` `ES256`), the form Pinniped keeps its
//! signing keys in, and published as the same JWK without `d`.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::{
    rand::SystemRandom,
    signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING},
};
use serde_json::{json, Value};

use super::JoseError;

/// Why a stored key cannot be used. Never quotes key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not an EC P-256 private JWK with `kid`, `x`, `y` and `d` in base64url.
    #[error("the signing key is not an EC P-256 private JWK with a kid: {0}")]
    NotAPrivateJwk(&'static str),
    /// The members do not form a valid key pair.
    #[error("the signing key's private and public parts do not form a P-256 key pair")]
    Inconsistent,
    /// The system has no secure randomness.
    #[error("no secure randomness to generate a signing key")]
    Random,
}

/// An ES256 signing key with its `kid`. `Debug` shows the `kid` only.
pub struct SigningKey {
    kid: String,
    pair: EcdsaKeyPair,
    /// The private scalar, kept to write the private JWK back.
    d: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A fresh random key named `kid`.
    pub fn generate(kid: &str) -> Result<Self, KeyError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| KeyError::Random)?;
        // ring's P-256 PKCS#8 v1 document ends with the public point inside a context tag, and
        // holds the 32-byte private scalar at a fixed place after its fixed prefix.
        let der = pkcs8.as_ref();
        let d = der
            .get(PKCS8_PRIVATE_KEY_OFFSET..PKCS8_PRIVATE_KEY_OFFSET + 32)
            .ok_or(KeyError::Inconsistent)?
            .to_vec();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
            .map_err(|_| KeyError::Inconsistent)?;
        let key = Self {
            kid: kid.to_string(),
            pair,
            d,
        };
        // The scalar taken from the document must be the pair's: re-import it to prove it.
        Self::from_private_jwk(&key.private_jwk()).map_err(|_| KeyError::Inconsistent)?;
        Ok(key)
    }

    /// The key of a private JWK as [`SigningKey::private_jwk`] writes it. The public point is
    /// checked against the private scalar.
    pub fn from_private_jwk(jwk: &Value) -> Result<Self, KeyError> {
        let field = |name: &'static str| {
            jwk.get(name)
                .and_then(Value::as_str)
                .ok_or(KeyError::NotAPrivateJwk(name))
        };
        if field("kty")? != "EC" || field("crv")? != "P-256" {
            return Err(KeyError::NotAPrivateJwk("kty/crv"));
        }
        let kid = field("kid")?;
        if kid.is_empty() {
            return Err(KeyError::NotAPrivateJwk("kid"));
        }
        let decode = |name: &'static str| -> Result<Vec<u8>, KeyError> {
            B64URL
                .decode(field(name)?)
                .ok()
                .filter(|bytes| bytes.len() == 32)
                .ok_or(KeyError::NotAPrivateJwk(name))
        };
        let (x, y, d) = (decode("x")?, decode("y")?, decode("d")?);
        let public = [&[0x04][..], &x, &y].concat();
        let pair = EcdsaKeyPair::from_private_key_and_public_key(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            &d,
            &public,
            &SystemRandom::new(),
        )
        .map_err(|_| KeyError::Inconsistent)?;
        Ok(Self {
            kid: kid.to_string(),
            pair,
            d,
        })
    }

    /// The key's `kid`.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public JWK, as a JWKS publishes it.
    pub fn public_jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({
            "kty": "EC",
            "crv": "P-256",
            "kid": self.kid,
            "use": "sig",
            "alg": "ES256",
            "x": B64URL.encode(&point[1..33]),
            "y": B64URL.encode(&point[33..65]),
        })
    }

    /// The private JWK (the public one plus `d`), for storage in a Secret. Never log it.
    pub fn private_jwk(&self) -> Value {
        let mut jwk = self.public_jwk();
        jwk["d"] = Value::String(B64URL.encode(&self.d));
        jwk
    }

    /// A compact JWS of `claims` (any JSON value, normally an object) with header
    /// `{"alg":"ES256","kid":…,"typ":"JWT"}`.
    pub fn sign(&self, claims: &Value) -> Result<String, JoseError> {
        self.sign_with_header(&json!({"alg": "ES256", "kid": self.kid, "typ": "JWT"}), claims)
    }

    /// A DPoP proof (RFC 9449 §4.2) of `claims`: header `{"typ":"dpop+jwt","alg":"ES256","jwk":…}`
    /// with the public key's members only (`kty`, `crv`, `x`, `y`).
    pub fn sign_dpop_proof(&self, claims: &Value) -> Result<String, JoseError> {
        let jwk = self.public_jwk();
        let header = json!({
            "typ": crate::dpop::PROOF_TYPE,
            "alg": "ES256",
            "jwk": {"kty": jwk["kty"], "crv": jwk["crv"], "x": jwk["x"], "y": jwk["y"]},
        });
        self.sign_with_header(&header, claims)
    }

    fn sign_with_header(&self, header: &Value, claims: &Value) -> Result<String, JoseError> {
        let signing_input = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map_err(|_| JoseError::Signing)?;
        Ok(format!("{signing_input}.{}", B64URL.encode(signature.as_ref())))
    }
}

/// Where ring's P-256 PKCS#8 document holds the private scalar: after the version, the algorithm
/// identifier, the OCTET STRING and ECPrivateKey headers and its version.
const PKCS8_PRIVATE_KEY_OFFSET: usize = 36;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jose::{parse_jwks, Jws};

    #[test]
    fn a_stored_key_signs_what_its_published_key_verifies() {
        let key = SigningKey::generate("2026-11-25").unwrap();
        let stored = key.private_jwk();
        assert!(key.public_jwk().get("d").is_none());
        let restored = SigningKey::from_private_jwk(&stored).unwrap();
        assert_eq!(restored.kid(), "2026-11-25");
        assert_eq!(restored.public_jwk(), key.public_jwk());

        let keys = parse_jwks(json!({"keys": [key.public_jwk()]}).to_string().as_bytes()).unwrap();
        let token = restored
            .sign(&json!({"iss": "https://issuer.example", "sub": "u"}))
            .unwrap();
        let jws = Jws::parse(&token).unwrap();
        assert_eq!(jws.header.kid.as_deref(), Some("2026-11-25"));
        assert_eq!(jws.verify(&keys), Ok(()));
        assert!(!format!("{restored:?}").contains(stored["d"].as_str().unwrap()));
    }

    #[test]
    fn broken_private_jwks_are_refused_with_the_member_named() {
        let key = SigningKey::generate("k").unwrap();
        let mut missing = key.private_jwk();
        missing.as_object_mut().unwrap().remove("d");
        assert_eq!(
            SigningKey::from_private_jwk(&missing).unwrap_err(),
            KeyError::NotAPrivateJwk("d")
        );
        let mut mixed = key.private_jwk();
        mixed["d"] = SigningKey::generate("other").unwrap().private_jwk()["d"].clone();
        assert_eq!(
            SigningKey::from_private_jwk(&mixed).unwrap_err(),
            KeyError::Inconsistent
        );
        let mut rsa = key.private_jwk();
        rsa["kty"] = json!("RSA");
        assert_eq!(
            SigningKey::from_private_jwk(&rsa).unwrap_err(),
            KeyError::NotAPrivateJwk("kty/crv")
        );
    }
}
