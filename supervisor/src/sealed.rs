//! Sealed values: what the Supervisor hands a browser or an upstream and must get back unchanged
//! and unread — the upstream `state` parameter of a login in progress (Pinniped keeps its
//! authorization request there, so no replica stores anything until the user comes back) and the
//! CSRF cookie.
//!
//! A sealed value is `base64url(nonce ‖ AES-256-GCM(json ‖ expiry))` under a FederationDomain's
//! 32-byte state-encryption key, with the value's purpose and the issuer as additional
//! authenticated data: it cannot be read, changed, replayed after it expires, or moved to another
//! FederationDomain or purpose.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::{
    aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN},
    rand::{SecureRandom as _, SystemRandom},
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use time::OffsetDateTime;

/// Why a sealed value cannot be opened. Never quotes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The key is not 32 bytes.
    #[error("the state encryption key must be 32 bytes")]
    BadKey,
    /// Not something this key sealed for this purpose and issuer, or altered.
    #[error("the value was not sealed by this FederationDomain or has been altered")]
    Invalid,
    /// Sealed, but its time is over.
    #[error("the value has expired")]
    Expired,
    /// No randomness, or the value cannot be encoded.
    #[error("the value could not be sealed")]
    Sealing,
}

/// A FederationDomain's sealing key.
pub struct Sealer {
    key: LessSafeKey,
    issuer: String,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    /// Unix seconds after which the value is refused.
    exp: i64,
    value: T,
}

impl Sealer {
    /// The sealer of `issuer` with its 32-byte state-encryption key.
    pub fn new(key: &[u8], issuer: &str) -> Result<Self, SealError> {
        let key = UnboundKey::new(&AES_256_GCM, key).map_err(|_| SealError::BadKey)?;
        Ok(Self {
            key: LessSafeKey::new(key),
            issuer: issuer.to_string(),
        })
    }

    fn aad(&self, purpose: &str) -> Vec<u8> {
        format!("{purpose}\n{}", self.issuer).into_bytes()
    }

    /// Seals `value` for `purpose` until `expires`.
    pub fn seal<T: Serialize>(
        &self,
        purpose: &str,
        value: &T,
        expires: OffsetDateTime,
    ) -> Result<String, SealError> {
        let mut plain = serde_json::to_vec(&Envelope {
            exp: expires.unix_timestamp(),
            value,
        })
        .map_err(|_| SealError::Sealing)?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Sealing)?;
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad(purpose)),
                &mut plain,
            )
            .map_err(|_| SealError::Sealing)?;
        Ok(B64URL.encode([&nonce[..], &plain].concat()))
    }

    /// Opens a value sealed for `purpose`, if it is still valid at `now`.
    pub fn open<T: DeserializeOwned>(
        &self,
        purpose: &str,
        sealed: &str,
        now: OffsetDateTime,
    ) -> Result<T, SealError> {
        let bytes = B64URL.decode(sealed).map_err(|_| SealError::Invalid)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Invalid);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Invalid)?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(self.aad(purpose)), &mut sealed)
            .map_err(|_| SealError::Invalid)?;
        let envelope: Envelope<T> = serde_json::from_slice(plain).map_err(|_| SealError::Invalid)?;
        if now.unix_timestamp() > envelope.exp {
            return Err(SealError::Expired);
        }
        Ok(envelope.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Login {
        verifier: String,
    }

    #[test]
    fn only_the_same_key_purpose_and_issuer_open_a_value_in_time() {
        let now = OffsetDateTime::now_utc();
        let sealer = Sealer::new(&[1; 32], "https://sso.example.com/a").unwrap();
        let login = Login {
            verifier: "v-0123456789".into(),
        };
        let sealed = sealer
            .seal("upstream-state", &login, now + time::Duration::minutes(90))
            .unwrap();
        assert!(!sealed.contains("v-0123456789"));
        assert_eq!(
            sealer.open::<Login>("upstream-state", &sealed, now).unwrap(),
            login
        );
        assert_eq!(
            sealer.open::<Login>("upstream-state", &sealed, now + time::Duration::minutes(91)),
            Err(SealError::Expired)
        );
        assert_eq!(
            sealer.open::<Login>("csrf", &sealed, now),
            Err(SealError::Invalid)
        );
        let other_issuer = Sealer::new(&[1; 32], "https://sso.example.com/b").unwrap();
        assert_eq!(
            other_issuer.open::<Login>("upstream-state", &sealed, now),
            Err(SealError::Invalid)
        );
        let other_key = Sealer::new(&[2; 32], "https://sso.example.com/a").unwrap();
        assert_eq!(
            other_key.open::<Login>("upstream-state", &sealed, now),
            Err(SealError::Invalid)
        );
        let mut bytes = B64URL.decode(&sealed).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert_eq!(
            sealer.open::<Login>("upstream-state", &B64URL.encode(bytes), now),
            Err(SealError::Invalid)
        );
        for garbage in ["", "!!", "AAAA"] {
            assert_eq!(
                sealer.open::<Login>("upstream-state", garbage, now),
                Err(SealError::Invalid)
            );
        }
        assert_eq!(Sealer::new(&[1; 16], "x").unwrap_err(), SealError::BadKey);
    }
}
