//! The Supervisor's opaque tokens — authorization codes, access tokens, refresh tokens — minted
//! and checked with a FederationDomain's token-signing key.
//!
//! A token is `<prefix><key>.<signature>`: `pin_ac_`, `pin_at_` or `pin_rt_` (so a user who
//! finds one knows what it is), 32 random bytes and their HMAC-SHA256 under the token-signing
//! key, both base64url. The signature names the token's storage Secret
//! ([`crate::session::storage::Resource::secret_name`]); only a holder of the whole token can present it,
//! and only the Supervisor can make a token whose signature checks.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::{hmac, rand::SecureRandom as _};

/// What an opaque token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An authorization code (`pin_ac_`).
    AuthorizationCode,
    /// An access token (`pin_at_`).
    AccessToken,
    /// A refresh token (`pin_rt_`).
    RefreshToken,
}

impl Kind {
    /// The token's prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::AuthorizationCode => "pin_ac_",
            Self::AccessToken => "pin_at_",
            Self::RefreshToken => "pin_rt_",
        }
    }
}

/// Why a presented token is not one of ours. Never quotes the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not of the expected kind, or not `<key>.<signature>` in base64url.
    #[error("the token is malformed")]
    Malformed,
    /// The signature does not check under this FederationDomain's key.
    #[error("the token's signature is invalid")]
    BadSignature,
    /// The system has no secure randomness.
    #[error("no secure randomness to mint a token")]
    Random,
}

/// A FederationDomain's token-signing key (32 bytes from its generated Secret).
pub struct TokenKey(hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(<redacted>)")
    }
}

/// A freshly minted token and its signature (the storage key).
pub struct Minted {
    /// The whole token, for the client only.
    pub token: String,
    /// Its signature: where its session is stored.
    pub signature: String,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted").finish_non_exhaustive()
    }
}

impl TokenKey {
    /// The key of `secret_bytes` (the Secret's `key`).
    pub fn new(secret_bytes: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret_bytes))
    }

    /// A new token of `kind`.
    pub fn mint(&self, kind: Kind) -> Result<Minted, TokenError> {
        let mut key = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| TokenError::Random)?;
        let signature = B64URL.encode(hmac::sign(&self.0, &key).as_ref());
        Ok(Minted {
            token: format!("{}{}.{signature}", kind.prefix(), B64URL.encode(key)),
            signature,
        })
    }

    /// The signature of a presented `token` of `kind`, after checking it (in constant time).
    pub fn signature_of(&self, kind: Kind, token: &str) -> Result<String, TokenError> {
        let rest = token.strip_prefix(kind.prefix()).ok_or(TokenError::Malformed)?;
        let (key, signature) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let key = B64URL.decode(key).map_err(|_| TokenError::Malformed)?;
        let tag = B64URL.decode(signature).map_err(|_| TokenError::Malformed)?;
        if key.len() != 32 {
            return Err(TokenError::Malformed);
        }
        hmac::verify(&self.0, &key, &tag).map_err(|_| TokenError::BadSignature)?;
        Ok(signature.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_check_only_under_their_key_and_kind() {
        let key = TokenKey::new(&[7; 32]);
        let minted = key.mint(Kind::RefreshToken).unwrap();
        assert!(minted.token.starts_with("pin_rt_"));
        assert_eq!(
            key.signature_of(Kind::RefreshToken, &minted.token).unwrap(),
            minted.signature
        );
        assert_eq!(
            key.signature_of(Kind::AccessToken, &minted.token),
            Err(TokenError::Malformed),
            "a refresh token is not an access token"
        );
        assert_eq!(
            TokenKey::new(&[8; 32]).signature_of(Kind::RefreshToken, &minted.token),
            Err(TokenError::BadSignature),
            "another FederationDomain's key"
        );
        let (head, signature) = minted.token.rsplit_once('.').unwrap();
        let mut forged = signature.to_string();
        forged.replace_range(0..1, if forged.starts_with('A') { "B" } else { "A" });
        assert_eq!(
            key.signature_of(Kind::RefreshToken, &format!("{head}.{forged}")),
            Err(TokenError::BadSignature)
        );
        for malformed in ["pin_rt_", "pin_rt_abc", "pin_rt_!!.??", "pin_rt_YQ.YQ"] {
            assert_eq!(
                key.signature_of(Kind::RefreshToken, malformed),
                Err(TokenError::Malformed),
                "{malformed}"
            );
        }
        assert_ne!(key.mint(Kind::RefreshToken).unwrap().signature, minted.signature);
        assert!(!format!("{minted:?}").contains(&minted.signature));
    }
}
