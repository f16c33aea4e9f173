//! JOSE on ring (the project's one crypto provider): JSON Web Keys, compact JWS parsing,
//! signature verification against a key set, and ES256 signing ([`sign`]).
//!
//! `none` and every HMAC algorithm are absent by construction: no token or JWKS can select them.
//! Nothing here quotes a token, a signature or key material in an error or a `Debug` output.

pub mod sign;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value};

/// JWS algorithms Selkie verifies. `none` and every HMAC algorithm are deliberately absent: they
/// can never be selected, whatever a token or a JWKS says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RS256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    RS384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    RS512,
    /// RSASSA-PSS with SHA-256.
    PS256,
    /// RSASSA-PSS with SHA-384.
    PS384,
    /// RSASSA-PSS with SHA-512.
    PS512,
    /// ECDSA P-256 with SHA-256.
    ES256,
    /// ECDSA P-384 with SHA-384.
    ES384,
    /// Ed25519.
    EdDSA,
}

impl Algorithm {
    /// The algorithm named by a JWS `alg`, if Selkie supports it.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "RS256" => Self::RS256,
            "RS384" => Self::RS384,
            "RS512" => Self::RS512,
            "PS256" => Self::PS256,
            "PS384" => Self::PS384,
            "PS512" => Self::PS512,
            "ES256" => Self::ES256,
            "ES384" => Self::ES384,
            "EdDSA" => Self::EdDSA,
            _ => return None,
        })
    }

    /// Whether a key of this material can verify this algorithm.
    pub fn fits(self, material: &KeyMaterial) -> bool {
        matches!(
            (self, material),
            (
                Self::RS256 | Self::RS384 | Self::RS512 | Self::PS256 | Self::PS384 | Self::PS512,
                KeyMaterial::Rsa { .. }
            ) | (Self::ES256, KeyMaterial::P256(_))
                | (Self::ES384, KeyMaterial::P384(_))
                | (Self::EdDSA, KeyMaterial::Ed25519(_))
        )
    }
}

/// Public key material, decoded once when the key set is fetched.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyMaterial {
    /// RSA modulus and exponent, big-endian without leading zeros.
    Rsa {
        /// The modulus.
        n: Vec<u8>,
        /// The public exponent.
        e: Vec<u8>,
    },
    /// Uncompressed P-256 point (0x04 || x || y).
    P256(Vec<u8>),
    /// Uncompressed P-384 point.
    P384(Vec<u8>),
    /// Ed25519 public key.
    Ed25519(Vec<u8>),
}

/// One usable verification key of a JWKS.
#[derive(Clone, PartialEq, Eq)]
pub struct VerifyingKey {
    /// The JWK's `kid`, if it has one.
    pub kid: Option<String>,
    /// The JWK's `alg`, when it names one: the only algorithm this key may verify.
    pub alg: Option<Algorithm>,
    /// The decoded public key.
    pub material: KeyMaterial,
}

impl std::fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyingKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl VerifyingKey {
    /// Whether `signature` over `message` verifies under this key with `alg`.
    pub fn verify(&self, alg: Algorithm, message: &[u8], signature_bytes: &[u8]) -> bool {
        use signature::{
            ECDSA_P256_SHA256_FIXED, ECDSA_P384_SHA384_FIXED, ED25519, RSA_PKCS1_2048_8192_SHA256,
            RSA_PKCS1_2048_8192_SHA384, RSA_PKCS1_2048_8192_SHA512, RSA_PSS_2048_8192_SHA256,
            RSA_PSS_2048_8192_SHA384, RSA_PSS_2048_8192_SHA512,
        };
        match (&self.material, alg) {
            (KeyMaterial::Rsa { n, e }, alg) => {
                let params = match alg {
                    Algorithm::RS256 => &RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::RS384 => &RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::RS512 => &RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::PS256 => &RSA_PSS_2048_8192_SHA256,
                    Algorithm::PS384 => &RSA_PSS_2048_8192_SHA384,
                    Algorithm::PS512 => &RSA_PSS_2048_8192_SHA512,
                    _ => return false,
                };
                RsaPublicKeyComponents { n, e }
                    .verify(params, message, signature_bytes)
                    .is_ok()
            }
            (KeyMaterial::P256(point), Algorithm::ES256) => {
                UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature_bytes)
                    .is_ok()
            }
            (KeyMaterial::P384(point), Algorithm::ES384) => {
                UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, signature_bytes)
                    .is_ok()
            }
            (KeyMaterial::Ed25519(key), Algorithm::EdDSA) => UnparsedPublicKey::new(&ED25519, key)
                .verify(message, signature_bytes)
                .is_ok(),
            _ => false,
        }
    }
}

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Value>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    key_use: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

/// Parses a JWKS document into the keys Selkie can use. Keys of unknown types, curves or
/// algorithms, encryption keys, and keys with broken encodings are skipped (an IdP may publish
/// keys for other consumers); a document that is not a JWKS at all is an error.
pub fn parse_jwks(document: &[u8]) -> Result<Vec<VerifyingKey>, serde_json::Error> {
    let set: JwkSet = serde_json::from_slice(document)?;
    Ok(set.keys.into_iter().filter_map(parse_jwk).collect())
}

/// One public JWK as a key Selkie can verify with, by the rules of [`parse_jwks`]; `None` when
/// it is not one (unknown type, curve or algorithm, an encryption key, a broken encoding).
pub fn parse_jwk(value: Value) -> Option<VerifyingKey> {
    to_verifying_key(&serde_json::from_value::<Jwk>(value).ok()?)
}

fn to_verifying_key(jwk: &Jwk) -> Option<VerifyingKey> {
    if jwk.key_use.as_deref().is_some_and(|u| u != "sig") {
        return None;
    }
    let alg = match &jwk.alg {
        Some(name) => Some(Algorithm::from_name(name)?),
        None => None,
    };
    let decode = |field: &Option<String>| field.as_deref().and_then(|v| B64URL.decode(v).ok());
    let material = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
        ("RSA", _) => {
            let strip = |bytes: Vec<u8>| bytes.iter().position(|b| *b != 0).map(|i| bytes[i..].to_vec());
            KeyMaterial::Rsa {
                n: strip(decode(&jwk.n)?)?,
                e: strip(decode(&jwk.e)?)?,
            }
        }
        ("EC", Some(curve @ ("P-256" | "P-384"))) => {
            let size = if curve == "P-256" { 32 } else { 48 };
            let (x, y) = (decode(&jwk.x)?, decode(&jwk.y)?);
            if x.len() != size || y.len() != size {
                return None;
            }
            let point = [&[0x04][..], &x, &y].concat();
            if curve == "P-256" {
                KeyMaterial::P256(point)
            } else {
                KeyMaterial::P384(point)
            }
        }
        ("OKP", Some("Ed25519")) => {
            let x = decode(&jwk.x)?;
            if x.len() != 32 {
                return None;
            }
            KeyMaterial::Ed25519(x)
        }
        _ => return None,
    };
    if alg.is_some_and(|alg| !alg.fits(&material)) {
        return None;
    }
    Some(VerifyingKey {
        kid: jwk.kid.clone(),
        alg,
        material,
    })
}

/// Why a compact JWS could not even be read. Messages never quote the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JoseError {
    /// Not three base64url parts, or a part is not the JSON it should be.
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(&'static str),
    /// The header names an algorithm Selkie does not verify (or `none`).
    #[error("the token is signed with {0:?}, which is not supported")]
    UnsupportedAlgorithm(String),
    /// The key set has no key with the token's `kid` (or none at all).
    #[error("the issuer's key set has no key for this token (kid {0:?})")]
    UnknownKey(String),
    /// The keys with the token's `kid` may not verify its algorithm.
    #[error("the issuer's key for this token may not verify {0:?}")]
    AlgorithmNotAllowed(String),
    /// No key of the set verifies the signature.
    #[error("the token's signature does not verify with the issuer's keys")]
    BadSignature,
    /// Signing failed (no randomness, or a key ring refuses).
    #[error("signing the token failed")]
    Signing,
}

/// The protected header members Selkie reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Header {
    /// `alg`.
    pub alg: String,
    /// `kid`.
    #[serde(default)]
    pub kid: Option<String>,
    /// `crit`: any value makes the token unacceptable, since Selkie understands no extension.
    #[serde(default)]
    pub crit: Option<Value>,
    /// `typ`: the token's media type (`dpop+jwt` for a DPoP proof), when it names one.
    #[serde(default)]
    pub typ: Option<String>,
    /// `jwk`: the public key a self-signed token (a DPoP proof) is signed with.
    #[serde(default)]
    pub jwk: Option<Value>,
}

/// A compact JWS split into its parts, header and payload decoded; the signature is decoded only
/// when it is verified, so a caller can route on the claims first (which issuer, which audience)
/// without trusting them.
#[derive(Debug)]
pub struct Jws<'a> {
    /// The decoded protected header.
    pub header: Header,
    /// The decoded payload: the (unverified) claims.
    pub claims: Map<String, Value>,
    signing_input: &'a str,
    signature: &'a str,
}

impl<'a> Jws<'a> {
    /// Splits `token` into three base64url parts and decodes the header and the payload (a JSON
    /// object). Fails with [`JoseError::Malformed`] otherwise; never checks anything else.
    pub fn parse(token: &'a str) -> Result<Self, JoseError> {
        // Split, not sliced at computed offsets: the signing input is everything before the last
        // dot, and it must hold exactly one more.
        let three_parts = token.rsplit_once('.').and_then(|(signing_input, signature)| {
            let (header, payload) = signing_input.split_once('.')?;
            (!payload.contains('.')).then_some((signing_input, header, payload, signature))
        });
        let Some((signing_input, header, payload, signature)) = three_parts else {
            return Err(JoseError::Malformed("it does not have three parts"));
        };
        let header =
            decode_json(header).map_err(|()| JoseError::Malformed("the header is not a JOSE header"))?;
        let claims =
            decode_json(payload).map_err(|()| JoseError::Malformed("the payload is not a JSON object"))?;
        Ok(Self {
            header,
            claims,
            signing_input,
            signature,
        })
    }

    /// The algorithm the header names, if Selkie verifies it.
    pub fn algorithm(&self) -> Result<Algorithm, JoseError> {
        Algorithm::from_name(&self.header.alg)
            .ok_or_else(|| JoseError::UnsupportedAlgorithm(self.header.alg.clone()))
    }

    /// Verifies the signature with `keys`, chosen the way go-oidc chooses: when the header names
    /// a `kid`, only keys with that `kid`; of those, only keys whose pinned `alg` (or, unpinned,
    /// whose type) fits the token's algorithm. Returns which check failed: an unsupported
    /// algorithm, a malformed signature, no key with the `kid`, keys that may not verify this
    /// algorithm, or a signature none of them verifies.
    pub fn verify(&self, keys: &[VerifyingKey]) -> Result<(), JoseError> {
        let alg = self.algorithm()?;
        let signature = self.signature()?;
        self.verify_decoded(alg, &signature, keys)
    }

    /// The decoded signature bytes.
    pub fn signature(&self) -> Result<Vec<u8>, JoseError> {
        B64URL
            .decode(self.signature)
            .map_err(|_| JoseError::Malformed("the signature is not base64url"))
    }

    /// [`Jws::verify`] with the algorithm and signature already decoded (a key cache decodes
    /// them once, before it fetches keys, and may try two key sets).
    pub(crate) fn verify_decoded(
        &self,
        alg: Algorithm,
        signature: &[u8],
        keys: &[VerifyingKey],
    ) -> Result<(), JoseError> {
        let kid = self.header.kid.as_deref();
        let (mut kid_known, mut alg_allowed) = (false, false);
        for key in keys
            .iter()
            .filter(|key| kid.is_none() || key.kid.as_deref() == kid)
        {
            kid_known = true;
            if key.alg.map_or(alg.fits(&key.material), |pinned| pinned == alg) {
                alg_allowed = true;
                if key.verify(alg, self.signing_input.as_bytes(), signature) {
                    return Ok(());
                }
            }
        }
        Err(if !kid_known {
            JoseError::UnknownKey(kid.unwrap_or_default().to_string())
        } else if !alg_allowed {
            JoseError::AlgorithmNotAllowed(self.header.alg.clone())
        } else {
            JoseError::BadSignature
        })
    }
}

/// Decodes one base64url segment and parses it as JSON. Broken encoding or JSON (including JSON
/// nested deeper than serde_json's recursion limit) is an error.
fn decode_json<T: serde::de::DeserializeOwned>(segment: &str) -> Result<T, ()> {
    let bytes = B64URL.decode(segment).map_err(|_| ())?;
    serde_json::from_slice(&bytes).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::{sign::SigningKey, *};

    #[test]
    fn verifies_a_good_signature_and_names_what_is_wrong_with_a_bad_one() {
        let key = SigningKey::generate("k1").unwrap();
        let keys = parse_jwks(
            serde_json::json!({"keys": [key.public_jwk()]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let token = key.sign(&serde_json::json!({"sub": "me"})).unwrap();
        let jws = Jws::parse(&token).unwrap();
        assert_eq!(jws.claims["sub"], "me");
        assert_eq!(jws.verify(&keys), Ok(()));

        let forged = SigningKey::generate("k1")
            .unwrap()
            .sign(&serde_json::json!({"sub": "me"}))
            .unwrap();
        assert_eq!(
            Jws::parse(&forged).unwrap().verify(&keys),
            Err(JoseError::BadSignature)
        );
        let other_kid = SigningKey::generate("k2")
            .unwrap()
            .sign(&serde_json::json!({}))
            .unwrap();
        assert_eq!(
            Jws::parse(&other_kid).unwrap().verify(&keys),
            Err(JoseError::UnknownKey("k2".into()))
        );
        // A payload changed after signing does not verify.
        let (head, rest) = token.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let altered = format!("{head}.{}.{signature}", B64URL.encode(r#"{"sub":"admin"}"#));
        assert_eq!(
            Jws::parse(&altered).unwrap().verify(&keys),
            Err(JoseError::BadSignature)
        );

        let none = format!("{}.{}.", B64URL.encode(r#"{"alg":"none"}"#), B64URL.encode("{}"));
        assert_eq!(
            Jws::parse(&none).unwrap().verify(&keys),
            Err(JoseError::UnsupportedAlgorithm("none".into()))
        );
        let hmac = format!(
            "{}.{}.c2ln",
            B64URL.encode(r#"{"alg":"HS256","kid":"k1"}"#),
            B64URL.encode("{}")
        );
        assert_eq!(
            Jws::parse(&hmac).unwrap().verify(&keys),
            Err(JoseError::UnsupportedAlgorithm("HS256".into()))
        );
        let rsa_alg = format!(
            "{}.{}.c2ln",
            B64URL.encode(r#"{"alg":"RS256","kid":"k1"}"#),
            B64URL.encode("{}")
        );
        assert_eq!(
            Jws::parse(&rsa_alg).unwrap().verify(&keys),
            Err(JoseError::AlgorithmNotAllowed("RS256".into()))
        );
        for malformed in ["a.b", "a.b.c.d", "!!.e30.c2ln", &format!("{head}.e30K.x.y")] {
            assert!(
                matches!(Jws::parse(malformed), Err(JoseError::Malformed(_))),
                "{malformed}"
            );
        }
    }
}
