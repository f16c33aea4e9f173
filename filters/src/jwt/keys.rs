//! JSON Web Keys and JWS signature verification with ring (the project's one crypto provider).

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;

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
    pub(crate) fn fits(self, material: &KeyMaterial) -> bool {
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
pub(crate) enum KeyMaterial {
    /// RSA modulus and exponent, big-endian without leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// Uncompressed P-256 point (0x04 || x || y).
    P256(Vec<u8>),
    /// Uncompressed P-384 point.
    P384(Vec<u8>),
    /// Ed25519 public key.
    Ed25519(Vec<u8>),
}

/// One usable verification key of a JWKS.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct VerifyingKey {
    pub(crate) kid: Option<String>,
    /// The JWK's `alg`, when it names one: the only algorithm this key may verify.
    pub(crate) alg: Option<Algorithm>,
    pub(crate) material: KeyMaterial,
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
    pub(crate) fn verify(&self, alg: Algorithm, message: &[u8], signature_bytes: &[u8]) -> bool {
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
    keys: Vec<serde_json::Value>,
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
pub(crate) fn parse_jwks(document: &[u8]) -> Result<Vec<VerifyingKey>, serde_json::Error> {
    let set: JwkSet = serde_json::from_slice(document)?;
    Ok(set
        .keys
        .into_iter()
        .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
        .filter_map(|jwk| to_verifying_key(&jwk))
        .collect())
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
