//! One login in one Secret: the session, the state of its authorization code and the login's
//! current tokens, so that a login costs kube-apiserver two requests (the code's `POST` at the
//! authorization endpoint, one conditional `PATCH` redeeming it) and a refresh two (a `GET`, a
//! conditional `PUT`).
//!
//! The Secret: name `pinniped-storage-login-<login ID as a UUID>`, type
//! `storage.selkie.dev/login` (Selkie's, not one of Pinniped's), label
//! `storage.pinniped.dev/type: login` and the login's `storage.pinniped.dev/request-id`,
//! annotation `storage.pinniped.dev/garbage-collect-after` (the session's end), and data:
//! * `pinniped-storage-data`, `pinniped-storage-version`: the [`Session`] JSON, version `1`, as
//!   in Pinniped's storage Secrets;
//! * `code`: `active <signature> <binding>` until the code is redeemed, then `used`
//!   ([`CodeState`]); the binding is a digest of the client ID, redirect URI and PKCE challenge
//!   the code was issued for, so that the redemption's `test` operation checks all of them at
//!   once;
//! * `tokens`, from the code's redemption on: `<generation> <issued at> <access signature>
//!   <refresh signature>` ([`Tokens`]); a token of an earlier generation is over (a refresh
//!   token of one is a reused one);
//! * `migrated-from`, for a login carried over from Secrets of the earlier format (Pinniped's
//!   layout, one per token, as Selkie wrote them before): its request ID there, whose Secrets
//!   end with it;
//! * `dpop-jkt`, for a login bound to a key of its client (DPoP, RFC 9449): the RFC 7638
//!   thumbprint of that key, written with the code's redemption and kept for the login's life
//!   (absent in logins stored before, and in unbound ones).
//!
//! A token names its login's ID and generation in its signed key ([`crate::session::tokens`]);
//! its signature is checked against the `tokens` entry in constant time.

use std::collections::BTreeMap;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use k8s_openapi::{api::core::v1::Secret, ByteString};
use sha2::Digest as _;
use subtle::ConstantTimeEq as _;
use time::OffsetDateTime;

use crate::session::storage::{self, StorageError};
use crate::session::store::{StoreError, REQUEST_ID_LABEL};
use crate::session::tokens::LoginRef;
use crate::session::{uuid_text, Session};

/// The type label of a login's Secret.
pub(crate) const LOGIN_LABEL: &str = "login";
/// The Secret type of a login's Secret.
pub(crate) const LOGIN_TYPE: &str = "storage.selkie.dev/login";
/// The data key of the code's state.
pub(crate) const CODE_KEY: &str = "code";
/// The data key of the login's tokens.
pub(crate) const TOKENS_KEY: &str = "tokens";
/// The data key of the earlier request ID of a migrated login.
const MIGRATED_FROM_KEY: &str = "migrated-from";
/// The data key of the thumbprint of the DPoP key a login is bound to.
pub(crate) const DPOP_JKT_KEY: &str = "dpop-jkt";

/// The name of the Secret of login `id`.
pub(crate) fn secret_name(id: &[u8; 16]) -> String {
    format!("pinniped-storage-login-{}", uuid_text(id))
}

/// The login ID of a request ID in a UUID's text form; `None` for any other request ID (one
/// of the earlier format).
pub(crate) fn id_of(request_id: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = request_id.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 || request_id.len() != 36 {
        return None;
    }
    let mut id = [0u8; 16];
    for (byte, pair) in id.iter_mut().zip(hex.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    (uuid_text(&id) == request_id).then_some(id)
}

/// The login ID a login of the earlier format (one Secret per token) with `request_id` is
/// carried over to: its request ID when that is a UUID (Selkie's, Pinniped's), else the first
/// 16 bytes of its SHA-256 (earlier Selkie versions' IDs), so that every replica carries it to the
/// same Secret and its Secrets of the earlier format lead there.
pub(crate) fn id_for_earlier(request_id: &str) -> [u8; 16] {
    id_of(request_id).unwrap_or_else(|| {
        let digest = sha2::Sha256::digest(request_id.as_bytes());
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        id
    })
}

/// The state of a login's authorization code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CodeState {
    /// Not redeemed yet: the code's signature and [`binding`].
    Active {
        /// The code's signature.
        signature: String,
        /// [`binding`] of what the code was issued for.
        binding: String,
    },
    /// Redeemed (or the login has none: one migrated from the earlier format).
    Used,
}

impl CodeState {
    /// Its stored form.
    pub(crate) fn text(&self) -> String {
        match self {
            Self::Active { signature, binding } => format!("active {signature} {binding}"),
            Self::Used => "used".to_string(),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        if text == "used" {
            return Some(Self::Used);
        }
        let mut parts = text.strip_prefix("active ")?.split(' ');
        let (Some(signature), Some(binding), None) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        Some(Self::Active {
            signature: signature.to_string(),
            binding: binding.to_string(),
        })
    }
}

/// What a code is bound to: a digest (base64url SHA-256, each part length-prefixed) of the client
/// ID, the redirect URI and the PKCE challenge of its authorization request. The token endpoint
/// computes it from the redemption's parameters (the challenge from the verifier).
pub(crate) fn binding(client_id: &str, redirect_uri: &str, code_challenge: &str) -> String {
    let mut digest = sha2::Sha256::new();
    for part in [client_id, redirect_uri, code_challenge] {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part.as_bytes());
    }
    URL_SAFE_NO_PAD.encode(digest.finalize())
}

/// A login's current tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tokens {
    /// Their generation (1 for the code's, one more with each refresh).
    pub generation: u32,
    /// When they were issued (unix seconds).
    pub issued_at: i64,
    /// The access token's signature.
    pub access: String,
    /// The refresh token's signature. Always minted; handed out only to a login granted
    /// `offline_access`, and only then accepted.
    pub refresh: String,
}

impl Tokens {
    /// Its stored form.
    pub(crate) fn text(&self) -> String {
        format!(
            "{} {} {} {}",
            self.generation, self.issued_at, self.access, self.refresh
        )
    }

    fn parse(text: &str) -> Option<Self> {
        let parts: Vec<&str> = text.split(' ').collect();
        let [generation, issued_at, access, refresh] = parts[..] else {
            return None;
        };
        Some(Self {
            generation: generation.parse().ok()?,
            issued_at: issued_at.parse().ok()?,
            access: access.to_string(),
            refresh: refresh.to_string(),
        })
    }

    /// When they were issued.
    pub(crate) fn issued(&self) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(self.issued_at).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// Whether `token` (a checked token's login and signature) is this generation's access token.
    pub(crate) fn is_access(&self, token: LoginRef, signature: &str) -> bool {
        token.generation == self.generation && same(&self.access, signature)
    }

    /// Whether `token` is this generation's refresh token.
    pub(crate) fn is_refresh(&self, token: LoginRef, signature: &str) -> bool {
        token.generation == self.generation && same(&self.refresh, signature)
    }
}

/// Constant-time equality of two signatures.
fn same(stored: &str, presented: &str) -> bool {
    bool::from(stored.as_bytes().ct_eq(presented.as_bytes()))
}

/// One login as its Secret holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Login {
    /// The session.
    pub session: Session,
    /// The authorization code's state.
    pub code: CodeState,
    /// The current tokens, once the code was redeemed.
    pub tokens: Option<Tokens>,
    /// The request ID of the earlier-format Secrets this login was carried over from.
    pub migrated_from: Option<String>,
    /// The thumbprint (RFC 7638) of the DPoP key the login is bound to, from the code's
    /// redemption on: every refresh and token exchange of it needs a proof by that key. `None`:
    /// unbound (a login of a FederationDomain without DPoP, one stored before, an OIDCClient's
    /// login without a proof).
    pub dpop_jkt: Option<String>,
}

impl Login {
    /// A new login of `session`, whose authorization code (of signature `code_signature`) is
    /// active and bound to the session's client ID, redirect URI and PKCE challenge.
    pub(crate) fn issued(session: Session, code_signature: String) -> Self {
        Self {
            code: CodeState::Active {
                signature: code_signature,
                binding: binding(&session.client_id, &session.redirect_uri, &session.code_challenge),
            },
            session,
            tokens: None,
            migrated_from: None,
            dpop_jkt: None,
        }
    }

    /// The login's ID (from its session's request ID, a UUID).
    pub(crate) fn id(&self) -> Result<[u8; 16], StoreError> {
        id_of(&self.session.request_id)
            .ok_or_else(|| StoreError::Session("the request ID is not a UUID".to_string()))
    }

    /// The Secret holding the login, collectable when its session ends (clamped to `now` and
    /// to [`crate::session::LONGEST_SESSION`] from `now`: stored numbers are outside data).
    pub(crate) fn to_secret(&self, now: OffsetDateTime) -> Result<Secret, StoreError> {
        let id = self.id()?;
        let data = serde_json::to_value(&self.session).map_err(|e| StoreError::Session(e.to_string()))?;
        let remaining = self
            .session
            .expires_at
            .saturating_sub(now.unix_timestamp())
            .clamp(0, crate::session::LONGEST_SESSION.whole_seconds());
        let labels = BTreeMap::from([(REQUEST_ID_LABEL.to_string(), self.session.request_id.clone())]);
        let mut secret = storage::storage_secret(
            secret_name(&id),
            LOGIN_TYPE.to_string(),
            LOGIN_LABEL,
            &data,
            &labels,
            now.saturating_add(time::Duration::seconds(remaining)),
        );
        let stored = secret.data.get_or_insert_default();
        stored.insert(CODE_KEY.to_string(), ByteString(self.code.text().into_bytes()));
        if let Some(tokens) = &self.tokens {
            stored.insert(TOKENS_KEY.to_string(), ByteString(tokens.text().into_bytes()));
        }
        if let Some(earlier) = &self.migrated_from {
            stored.insert(
                MIGRATED_FROM_KEY.to_string(),
                ByteString(earlier.clone().into_bytes()),
            );
        }
        if let Some(jkt) = &self.dpop_jkt {
            stored.insert(DPOP_JKT_KEY.to_string(), ByteString(jkt.clone().into_bytes()));
        }
        Ok(secret)
    }

    /// The login `secret` holds. Fails, naming what is wrong (never a value), when it is not a
    /// login's Secret or its data does not read.
    pub(crate) fn read(secret: &Secret) -> Result<Self, StoreError> {
        let data = storage::read_as(secret, LOGIN_TYPE, LOGIN_LABEL)?;
        let session: Session = serde_json::from_value(data)
            .map_err(|e| StoreError::Session(selkie_api::json::error_without_values(&e)))?;
        let text = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(|value| String::from_utf8_lossy(&value.0).into_owned())
        };
        let damaged = |what: &str| {
            StoreError::Storage(StorageError::NotJson(format!("the login's {what} does not read")))
        };
        let code = text(CODE_KEY)
            .and_then(|code| CodeState::parse(&code))
            .ok_or_else(|| damaged("code"))?;
        let tokens = match text(TOKENS_KEY) {
            Some(tokens) => Some(Tokens::parse(&tokens).ok_or_else(|| damaged("tokens"))?),
            None => None,
        };
        Ok(Self {
            session,
            code,
            tokens,
            migrated_from: text(MIGRATED_FROM_KEY),
            dpop_jkt: text(DPOP_JKT_KEY),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_ids_are_uuids_and_name_their_secret() {
        let id = [0xab; 16];
        let text = uuid_text(&id);
        assert_eq!(id_of(&text), Some(id));
        assert_eq!(
            secret_name(&id),
            "pinniped-storage-login-abababab-abab-abab-abab-abababababab"
        );
        for other in [
            "",
            "abc",
            "ABABABAB-ABAB-ABAB-ABAB-ABABABABABAB",
            "ababababababababababababababababab-a",
        ] {
            assert_eq!(id_of(other), None, "{other}");
        }
        assert_eq!(id_for_earlier(&text), id);
        assert_eq!(id_for_earlier("Zm9yLWEtdGVzdA"), id_for_earlier("Zm9yLWEtdGVzdA"));
        assert_ne!(id_for_earlier("Zm9yLWEtdGVzdA"), id_for_earlier("Zm9yLWEtdGVzdB"));
    }

    #[test]
    fn code_states_and_tokens_read_back_and_damage_is_refused() {
        for code in [
            CodeState::Used,
            CodeState::Active {
                signature: "c1g".into(),
                binding: binding("pinniped-cli", "http://127.0.0.1/cb", "chal"),
            },
        ] {
            assert_eq!(CodeState::parse(&code.text()), Some(code));
        }
        for damaged in ["", "active", "active a", "active a b c", "usedd"] {
            assert_eq!(CodeState::parse(damaged), None, "{damaged}");
        }
        let tokens = Tokens {
            generation: 3,
            issued_at: 10,
            access: "at".into(),
            refresh: "rt".into(),
        };
        assert_eq!(Tokens::parse(&tokens.text()), Some(tokens));
        for damaged in ["", "1 2 a", "x 2 a b", "1 2 a b c", "1 x a b"] {
            assert_eq!(Tokens::parse(damaged), None, "{damaged}");
        }
    }

    /// A login's DPoP binding is kept in its Secret (and by every rewrite of it); a Secret
    /// without one (stored before, or unbound) reads as unbound.
    #[test]
    fn a_logins_dpop_binding_reads_back_and_is_absent_from_unbound_ones() {
        let session: Session = serde_json::from_value(serde_json::json!({
            "request_id": uuid_text(&[1; 16]), "client_id": "pinniped-cli", "redirect_uri": "u",
            "scopes": [], "code_challenge": "x", "requested_at": 0, "auth_time": 0,
            "expires_at": 3600, "token_expires_at": 0,
            "identity": {"subject": "s", "username": "u", "groups": []},
            "upstream": {"idp_name": "i", "idp_type": "ldap", "issuer": "", "subject": "s"},
        }))
        .unwrap();
        let now = OffsetDateTime::from_unix_timestamp(0).unwrap();
        let mut login = Login::issued(session, "sig".into());
        let unbound = login.to_secret(now).unwrap();
        assert!(!unbound.data.as_ref().unwrap().contains_key(DPOP_JKT_KEY));
        assert_eq!(Login::read(&unbound).unwrap().dpop_jkt, None);
        login.dpop_jkt = Some("0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I".into());
        assert_eq!(Login::read(&login.to_secret(now).unwrap()).unwrap(), login);
    }

    #[test]
    fn a_binding_changes_with_each_part() {
        let base = binding("client", "http://127.0.0.1/cb", "challenge");
        assert_ne!(base, binding("client2", "http://127.0.0.1/cb", "challenge"));
        assert_ne!(base, binding("client", "http://127.0.0.1/cb2", "challenge"));
        assert_ne!(base, binding("client", "http://127.0.0.1/cb", "challengf"));
        // Length prefixes: moving a character from one part to the next is another binding.
        assert_ne!(binding("ab", "c", "d"), binding("a", "bc", "d"));
        assert!(!base.contains(' '));
    }

    #[test]
    fn tokens_match_only_their_generation_and_signature() {
        let tokens = Tokens {
            generation: 2,
            issued_at: 10,
            access: "at".into(),
            refresh: "rt".into(),
        };
        let at = |generation| LoginRef {
            id: [0; 16],
            generation,
        };
        assert!(tokens.is_access(at(2), "at"));
        assert!(!tokens.is_access(at(1), "at"));
        assert!(!tokens.is_access(at(2), "rt"));
        assert!(tokens.is_refresh(at(2), "rt"));
        assert!(!tokens.is_refresh(at(3), "rt"));
        assert!(!tokens.is_refresh(at(2), "at"));
    }
}
