//! A FederationDomain's generated keys and the Secrets that hold them, with Pinniped's types and
//! data keys, owned by the FederationDomain (deleted with it):
//!
//! * `<name>-jwks`, type `secrets.pinniped.dev/federation-domain-jwks`: `activeJWK` (the private
//!   ES256 JWK ID tokens are signed with) and `jwks` (the public keys `jwks.json` publishes);
//! * `<name>-token-signing-key`, `<name>-state-signing-key`, `<name>-state-encryption-key`, types
//!   `secrets.pinniped.dev/federation-domain-{token-signing,state-signing,state-encryption}-key`:
//!   `key`, 32 random bytes.
//!
//! The leader creates what is missing or unusable; every replica reads them.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    ByteString,
};
use ring::rand::SecureRandom as _;
use selkie_oidc::jose::sign::SigningKey;
use serde_json::{json, Value};

/// The data key of the private signing JWK.
pub const ACTIVE_JWK_KEY: &str = "activeJWK";
/// The data key of the published JWKS.
pub const JWKS_KEY: &str = "jwks";
/// The data key of a symmetric key.
pub const SYMMETRIC_KEY: &str = "key";
/// The `kid` of generated signing keys (Pinniped's).
pub const KEY_ID: &str = "pinniped-supervisor-key";

/// One of a FederationDomain's generated Secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySecret {
    /// The signing JWK and the JWKS.
    Jwks,
    /// The HMAC key of opaque tokens.
    TokenSigning,
    /// The key that signed upstream state (kept for compatibility; sealing authenticates).
    StateSigning,
    /// The key that encrypts upstream state and the CSRF cookie.
    StateEncryption,
}

impl KeySecret {
    /// Every generated Secret of a FederationDomain.
    pub const ALL: [Self; 4] = [
        Self::Jwks,
        Self::TokenSigning,
        Self::StateSigning,
        Self::StateEncryption,
    ];

    fn suffix(self) -> &'static str {
        match self {
            Self::Jwks => "jwks",
            Self::TokenSigning => "token-signing-key",
            Self::StateSigning => "state-signing-key",
            Self::StateEncryption => "state-encryption-key",
        }
    }

    /// The Secret's name for the FederationDomain `federation_domain`.
    pub fn name(self, federation_domain: &str) -> String {
        format!("{federation_domain}-{}", self.suffix())
    }

    /// The Secret's type.
    pub fn secret_type(self) -> String {
        format!("secrets.pinniped.dev/federation-domain-{}", self.suffix())
    }

    /// A new Secret with fresh key material, owned by `owner`.
    pub fn generate(
        self,
        federation_domain: &str,
        namespace: &str,
        owner: OwnerReference,
    ) -> Result<Secret, KeyError> {
        let data = match self {
            Self::Jwks => {
                let key = SigningKey::generate(KEY_ID).map_err(|_| KeyError::Random)?;
                BTreeMap::from([
                    (
                        ACTIVE_JWK_KEY.to_string(),
                        ByteString(key.private_jwk().to_string().into_bytes()),
                    ),
                    (
                        JWKS_KEY.to_string(),
                        ByteString(json!({"keys": [key.public_jwk()]}).to_string().into_bytes()),
                    ),
                ])
            }
            _ => {
                let mut key = vec![0u8; 32];
                ring::rand::SystemRandom::new()
                    .fill(&mut key)
                    .map_err(|_| KeyError::Random)?;
                BTreeMap::from([(SYMMETRIC_KEY.to_string(), ByteString(key))])
            }
        };
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(self.name(federation_domain)),
                namespace: Some(namespace.to_string()),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            type_: Some(self.secret_type()),
            data: Some(data),
            ..Secret::default()
        })
    }
}

/// Why generated key material cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The Secret is of another type.
    #[error("the Secret {name} is of type {found:?}, not {expected}")]
    WrongType {
        /// The Secret.
        name: String,
        /// Its type.
        found: String,
        /// The type expected.
        expected: String,
    },
    /// A data key is missing or unusable.
    #[error("the Secret {name} has no usable {key}")]
    Unusable {
        /// The Secret.
        name: String,
        /// The data key.
        key: &'static str,
    },
    /// No randomness to generate keys.
    #[error("no secure randomness to generate keys")]
    Random,
}

fn checked(secret: &Secret, kind: KeySecret) -> Result<&BTreeMap<String, ByteString>, KeyError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let found = secret.type_.clone().unwrap_or_default();
    if found != kind.secret_type() {
        return Err(KeyError::WrongType {
            name,
            found,
            expected: kind.secret_type(),
        });
    }
    secret.data.as_ref().ok_or(KeyError::Unusable {
        name,
        key: if kind == KeySecret::Jwks {
            ACTIVE_JWK_KEY
        } else {
            SYMMETRIC_KEY
        },
    })
}

/// The signing key and the published JWKS of a `jwks` Secret.
pub fn read_jwks(secret: &Secret) -> Result<(SigningKey, Value), KeyError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let data = checked(secret, KeySecret::Jwks)?;
    let unusable = |key| KeyError::Unusable {
        name: name.clone(),
        key,
    };
    let active: Value = data
        .get(ACTIVE_JWK_KEY)
        .and_then(|bytes| serde_json::from_slice(&bytes.0).ok())
        .ok_or_else(|| unusable(ACTIVE_JWK_KEY))?;
    let key = SigningKey::from_private_jwk(&active).map_err(|_| unusable(ACTIVE_JWK_KEY))?;
    let jwks: Value = data
        .get(JWKS_KEY)
        .and_then(|bytes| serde_json::from_slice(&bytes.0).ok())
        .filter(|jwks: &Value| {
            // The active key must be published, or its tokens would not verify.
            let public = key.public_jwk();
            jwks["keys"].as_array().is_some_and(|keys| {
                keys.iter().any(|jwk| {
                    jwk["kid"] == public["kid"] && jwk["x"] == public["x"] && jwk["y"] == public["y"]
                })
            })
        })
        .ok_or_else(|| unusable(JWKS_KEY))?;
    Ok((key, jwks))
}

/// The 32-byte key of a symmetric key Secret.
pub fn read_symmetric(secret: &Secret, kind: KeySecret) -> Result<Vec<u8>, KeyError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let data = checked(secret, kind)?;
    data.get(SYMMETRIC_KEY)
        .map(|bytes| bytes.0.clone())
        .filter(|key| key.len() == 32)
        .ok_or(KeyError::Unusable {
            name,
            key: SYMMETRIC_KEY,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "config.supervisor.pinniped.dev/v1alpha1".into(),
            kind: "FederationDomain".into(),
            name: "fd".into(),
            uid: "u-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn generated_secrets_read_back_and_damaged_ones_are_named() {
        let jwks = KeySecret::Jwks.generate("fd", "ns", owner()).unwrap();
        assert_eq!(jwks.metadata.name.as_deref(), Some("fd-jwks"));
        assert_eq!(
            jwks.type_.as_deref(),
            Some("secrets.pinniped.dev/federation-domain-jwks")
        );
        let (key, published) = read_jwks(&jwks).unwrap();
        assert_eq!(key.kid(), KEY_ID);
        assert!(published["keys"][0].get("d").is_none(), "the JWKS is public");

        let token = KeySecret::TokenSigning.generate("fd", "ns", owner()).unwrap();
        assert_eq!(token.metadata.name.as_deref(), Some("fd-token-signing-key"));
        assert_eq!(read_symmetric(&token, KeySecret::TokenSigning).unwrap().len(), 32);
        assert!(matches!(
            read_symmetric(&token, KeySecret::StateEncryption),
            Err(KeyError::WrongType { .. })
        ));
        let mut short = token.clone();
        short.data = Some(BTreeMap::from([(
            SYMMETRIC_KEY.to_string(),
            ByteString(vec![1; 16]),
        )]));
        assert!(matches!(
            read_symmetric(&short, KeySecret::TokenSigning),
            Err(KeyError::Unusable { .. })
        ));
        let mut foreign_jwks = jwks.clone();
        let other = KeySecret::Jwks.generate("fd", "ns", owner()).unwrap();
        foreign_jwks
            .data
            .as_mut()
            .unwrap()
            .insert(JWKS_KEY.into(), other.data.as_ref().unwrap()[JWKS_KEY].clone());
        // Same kid, another key: tokens of the active key would not verify.
        assert!(matches!(
            read_jwks(&foreign_jwks),
            Err(KeyError::Unusable { key: JWKS_KEY, .. })
        ));
        let mut broken = jwks;
        broken
            .data
            .as_mut()
            .unwrap()
            .insert(ACTIVE_JWK_KEY.into(), ByteString(b"{}".to_vec()));
        assert!(matches!(
            read_jwks(&broken),
            Err(KeyError::Unusable {
                key: ACTIVE_JWK_KEY,
                ..
            })
        ));
    }
}
