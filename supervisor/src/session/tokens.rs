//! The Supervisor's opaque tokens — authorization codes, access tokens, refresh tokens — minted
//! and checked with a FederationDomain's token-signing key.
//!
//! A token is `<prefix><key>.<signature>`: `pin_ac_`, `pin_at_` or `pin_rt_` (so a user who
//! finds one knows what it is), a key and its HMAC-SHA256 under the token-signing key, both
//! base64url. Selkie's key is 44 bytes: the login's ID (16), the generation of the login's
//! tokens the token belongs to (4, big-endian) and 24 random bytes ([`LoginRef`]), signed
//! with the prefix before it (so a token of one kind never passes for another), so that a
//! token names the one Secret its login is stored in ([`crate::session::login`]). A key of 32
//! random bytes is a token of the earlier format (Pinniped's, which Selkie minted before one
//! Secret per login), whose signature names its own storage Secret
//! ([`crate::session::storage::Resource::secret_name`]). Only a holder of the whole token can
//! present it, and only the Supervisor can make a token whose signature checks.

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
    /// A device code (`pin_dc_`, RFC 8628): names its device login
    /// ([`crate::session::device`]), not a login.
    DeviceCode,
}

impl Kind {
    /// The token's prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::AuthorizationCode => "pin_ac_",
            Self::AccessToken => "pin_at_",
            Self::RefreshToken => "pin_rt_",
            Self::DeviceCode => "pin_dc_",
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

/// The login a token was minted for: where the login is stored, and which generation of its
/// tokens the token belongs to (0: the authorization code; 1: the tokens the code gave; one more
/// with each refresh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRef {
    /// The login's ID (its request ID's 16 bytes).
    pub id: [u8; 16],
    /// The generation of the login's tokens.
    pub generation: u32,
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

/// A presented token whose signature checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Its signature.
    pub signature: String,
    /// The login it was minted for; `None` for a token of the earlier format, stored under its
    /// signature.
    pub login: Option<LoginRef>,
}

/// Random bytes in a Selkie token's key.
const RANDOM: usize = 24;
/// The length of a Selkie token's key: login ID, generation, random bytes.
const KEY: usize = 16 + 4 + RANDOM;
/// The length of an earlier token's key (Pinniped's): random bytes only.
const EARLIER_KEY: usize = 32;

impl TokenKey {
    /// The key of `secret_bytes` (the Secret's `key`).
    pub fn new(secret_bytes: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret_bytes))
    }

    /// A new token of `kind` for `login`.
    pub fn mint(&self, kind: Kind, login: LoginRef) -> Result<Minted, TokenError> {
        let mut key = [0u8; KEY];
        key[..16].copy_from_slice(&login.id);
        key[16..20].copy_from_slice(&login.generation.to_be_bytes());
        ring::rand::SystemRandom::new()
            .fill(&mut key[20..])
            .map_err(|_| TokenError::Random)?;
        let signature = self.sign(&[kind.prefix().as_bytes(), &key]);
        Ok(Self::minted(kind, &key, signature))
    }

    /// A new token of `kind` in the earlier format (32 random bytes, stored under its
    /// signature), as Pinniped and earlier Selkie versions mint them: for tests of their
    /// migration.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn mint_earlier(&self, kind: Kind) -> Result<Minted, TokenError> {
        let mut key = [0u8; EARLIER_KEY];
        ring::rand::SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| TokenError::Random)?;
        let signature = self.sign(&[&key]);
        Ok(Self::minted(kind, &key, signature))
    }

    /// The HMAC-SHA256, under this key, of `purpose` and `message`, each prefixed with its
    /// length (8 bytes, big-endian): for values other than tokens that every replica must make
    /// and check alike (DPoP nonces). Such an input starts with a zero byte, never with a
    /// token's prefix, and with a `purpose` of 17 bytes or more is longer than an earlier
    /// token's 32-byte key: it is never the input of a token's signature.
    pub(crate) fn mac(&self, purpose: &str, message: &[u8]) -> hmac::Tag {
        self.sign(&[
            &(purpose.len() as u64).to_be_bytes(),
            purpose.as_bytes(),
            &(message.len() as u64).to_be_bytes(),
            message,
        ])
    }

    /// The HMAC of `parts`, one after the other.
    fn sign(&self, parts: &[&[u8]]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.0);
        for part in parts {
            context.update(part);
        }
        context.sign()
    }

    fn minted(kind: Kind, key: &[u8], signature: hmac::Tag) -> Minted {
        let signature = B64URL.encode(signature.as_ref());
        Minted {
            token: format!("{}{}.{signature}", kind.prefix(), B64URL.encode(key)),
            signature,
        }
    }

    /// Checks a presented `token` of `kind` (its signature, in constant time) and returns its
    /// signature and the login it names. Fails without saying more than
    /// [`TokenError::Malformed`] or [`TokenError::BadSignature`]; never quotes the token.
    pub fn check(&self, kind: Kind, token: &str) -> Result<Checked, TokenError> {
        let rest = token.strip_prefix(kind.prefix()).ok_or(TokenError::Malformed)?;
        let (key, signature) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let key = B64URL.decode(key).map_err(|_| TokenError::Malformed)?;
        let tag = B64URL.decode(signature).map_err(|_| TokenError::Malformed)?;
        if key.len() != KEY && key.len() != EARLIER_KEY {
            return Err(TokenError::Malformed);
        }
        // Selkie's tokens sign their kind too (an access token's key and signature never make a
        // refresh token); the earlier format signs the key alone.
        let signed: Vec<u8> = if key.len() == KEY {
            [kind.prefix().as_bytes(), &key].concat()
        } else {
            key.clone()
        };
        hmac::verify(&self.0, &signed, &tag).map_err(|_| TokenError::BadSignature)?;
        let login = (key.len() == KEY).then(|| {
            let mut id = [0u8; 16];
            id.copy_from_slice(&key[..16]);
            let mut generation = [0u8; 4];
            generation.copy_from_slice(&key[16..20]);
            LoginRef {
                id,
                generation: u32::from_be_bytes(generation),
            }
        });
        Ok(Checked {
            signature: signature.to_string(),
            login,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGIN: LoginRef = LoginRef {
        id: [3; 16],
        generation: 7,
    };

    #[test]
    fn minted_tokens_check_only_under_their_key_and_kind() {
        let key = TokenKey::new(&[7; 32]);
        let minted = key.mint(Kind::RefreshToken, LOGIN).unwrap();
        assert!(minted.token.starts_with("pin_rt_"));
        assert_eq!(
            key.check(Kind::RefreshToken, &minted.token).unwrap(),
            Checked {
                signature: minted.signature.clone(),
                login: Some(LOGIN)
            }
        );
        assert_eq!(
            key.check(Kind::AccessToken, &minted.token),
            Err(TokenError::Malformed),
            "a refresh token is not an access token"
        );
        assert_eq!(
            TokenKey::new(&[8; 32]).check(Kind::RefreshToken, &minted.token),
            Err(TokenError::BadSignature),
            "another FederationDomain's key"
        );
        let (head, signature) = minted.token.rsplit_once('.').unwrap();
        let mut forged = signature.to_string();
        forged.replace_range(0..1, if forged.starts_with('A') { "B" } else { "A" });
        assert_eq!(
            key.check(Kind::RefreshToken, &format!("{head}.{forged}")),
            Err(TokenError::BadSignature)
        );
        for malformed in ["pin_rt_", "pin_rt_abc", "pin_rt_!!.??", "pin_rt_YQ.YQ"] {
            assert_eq!(
                key.check(Kind::RefreshToken, malformed),
                Err(TokenError::Malformed),
                "{malformed}"
            );
        }
        assert_ne!(
            key.mint(Kind::RefreshToken, LOGIN).unwrap().signature,
            minted.signature
        );
        assert!(!format!("{minted:?}").contains(&minted.signature));
    }

    /// The login and generation are in the signed key: changing either breaks the signature.
    #[test]
    fn the_login_a_token_names_cannot_be_changed() {
        let key = TokenKey::new(&[7; 32]);
        let minted = key.mint(Kind::AccessToken, LOGIN).unwrap();
        let (head, signature) = minted.token.rsplit_once('.').unwrap();
        let mut raw = B64URL.decode(head.strip_prefix("pin_at_").unwrap()).unwrap();
        for byte in [0, 19] {
            raw[byte] ^= 1;
            let changed = format!("pin_at_{}.{signature}", B64URL.encode(&raw));
            assert_eq!(
                key.check(Kind::AccessToken, &changed),
                Err(TokenError::BadSignature)
            );
            raw[byte] ^= 1;
        }
    }

    /// An access token's key and signature under the refresh token's prefix are no refresh token
    /// (nor a code's under another prefix): the kind is signed.
    #[test]
    fn a_token_cannot_change_its_kind() {
        let key = TokenKey::new(&[7; 32]);
        for (kind, other) in [
            (Kind::AccessToken, Kind::RefreshToken),
            (Kind::AuthorizationCode, Kind::RefreshToken),
            (Kind::RefreshToken, Kind::AccessToken),
        ] {
            let minted = key.mint(kind, LOGIN).unwrap();
            let swapped = minted.token.replacen(kind.prefix(), other.prefix(), 1);
            assert_eq!(key.check(other, &swapped), Err(TokenError::BadSignature));
        }
    }

    /// Tokens of the earlier format (Pinniped's: 32 random bytes) still check, naming no login.
    #[test]
    fn earlier_tokens_check_without_a_login() {
        let key = TokenKey::new(&[7; 32]);
        let earlier = key.mint_earlier(Kind::RefreshToken).unwrap();
        assert_eq!(
            key.check(Kind::RefreshToken, &earlier.token).unwrap(),
            Checked {
                signature: earlier.signature,
                login: None
            }
        );
    }
}
