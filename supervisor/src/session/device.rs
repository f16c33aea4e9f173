//! A device login (RFC 8628) in one Secret, from the device authorization request until the CLI
//! that asked for it redeems the login's authorization code.
//!
//! The Secret: name `pinniped-storage-device-<device ID as a UUID>`, type
//! `storage.selkie.dev/device` (Selkie's own), label `storage.pinniped.dev/type: device`,
//! annotation `storage.pinniped.dev/garbage-collect-after` (the device code's expiry), and data:
//! * `pinniped-storage-data`, `pinniped-storage-version`: the [`DeviceRequest`] JSON, version `1`;
//! * `status`: `pending`, then `approved <authorization code>` or `denied <OAuth error code>`
//!   when the login in the browser ends, then `redeemed` ([`DeviceStatus`]); each change is one
//!   JSON Patch whose `test` operation holds only for the status it changes, so a status is left
//!   once, whatever the interleaving.
//!
//! The device ID is a digest of the user code, so the verification page finds the Secret from the
//! code the user types (one `GET`); the device code names the same ID in its signed key
//! ([`crate::session::tokens`]), so the token endpoint finds it from the code the CLI polls with.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use k8s_openapi::{api::core::v1::Secret, ByteString};
use ring::rand::SecureRandom as _;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use time::OffsetDateTime;

use crate::session::storage::{self, StorageError};
use crate::session::store::StoreError;
use crate::session::uuid_text;

/// The type label of a device login's Secret.
pub(crate) const DEVICE_LABEL: &str = "device";
/// The Secret type of a device login's Secret.
pub(crate) const DEVICE_TYPE: &str = "storage.selkie.dev/device";
/// The data key of the device login's status.
pub(crate) const STATUS_KEY: &str = "status";
/// How long a device code and its user code are good for.
pub(crate) const DEVICE_CODE_LIFETIME: time::Duration = time::Duration::minutes(10);
/// The least time between two polls of one device code (RFC 8628 §3.2 `interval`).
pub(crate) const POLL_INTERVAL: time::Duration = time::Duration::seconds(5);
/// The letters of a user code: consonants only (no vowels, so no words), none that look alike
/// (RFC 8628 §6.1). 20 letters, 8 of them: 2.56 × 10¹⁰ codes.
const USER_CODE_ALPHABET: &[u8; 20] = b"BCDFGHJKLMNPQRSTVWXZ";
/// The letters in a user code.
const USER_CODE_LENGTH: usize = 8;

/// What the device authorization request asked for, and what ties the login to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeviceRequest {
    /// The FederationDomain's issuer URL: a user code is entered at its own only.
    pub issuer: String,
    /// The client.
    pub client_id: String,
    /// The client's PKCE S256 challenge: the login's code is issued for it, and only the
    /// client's verifier redeems it.
    pub code_challenge: String,
    /// The login's authorization request (its query string, with the client's scopes, PKCE
    /// challenge, nonce and identity provider, the device callback and [`DeviceRequest::state`]),
    /// as checked when the device login began; the verification page sends the browser there.
    pub authorize_query: String,
    /// The device code's signature.
    pub device_code_signature: String,
    /// The `state` of the login's authorization request: the device callback accepts a code
    /// for this device login only with it.
    pub state: String,
    /// When the device code expires (unix seconds).
    pub expires_at: i64,
}

impl DeviceRequest {
    /// Whether the device code has expired at `now`.
    pub(crate) fn expired(&self, now: OffsetDateTime) -> bool {
        now.unix_timestamp() >= self.expires_at
    }
}

/// Where a device login is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceStatus {
    /// Waiting for the user.
    Pending,
    /// The user logged in: the authorization code the CLI's poll redeems.
    Approved {
        /// The authorization code.
        code: String,
    },
    /// The login ended with an error (the OAuth error code, e.g. `access_denied`).
    Denied {
        /// The OAuth error code.
        error: String,
    },
    /// The CLI got its tokens.
    Redeemed,
}

impl DeviceStatus {
    /// Its stored form.
    pub(crate) fn text(&self) -> String {
        match self {
            Self::Pending => "pending".into(),
            Self::Approved { code } => format!("approved {code}"),
            Self::Denied { error } => format!("denied {error}"),
            Self::Redeemed => "redeemed".into(),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text.split_once(' ') {
            None if text == "pending" => Some(Self::Pending),
            None if text == "redeemed" => Some(Self::Redeemed),
            Some(("approved", code)) if !code.is_empty() && !code.contains(' ') => Some(Self::Approved {
                code: code.to_string(),
            }),
            Some(("denied", error)) if !error.is_empty() && !error.contains(' ') => Some(Self::Denied {
                error: error.to_string(),
            }),
            _ => None,
        }
    }
}

/// One device login as its Secret holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceLogin {
    /// Its ID (a digest of its user code, [`id_of`]).
    pub id: [u8; 16],
    /// What was asked for.
    pub request: DeviceRequest,
    /// Where it is.
    pub status: DeviceStatus,
}

/// A fresh user code, `XXXX-XXXX` (`None` without secure randomness).
pub(crate) fn new_user_code() -> Option<String> {
    let random = ring::rand::SystemRandom::new();
    let mut letters = String::with_capacity(USER_CODE_LENGTH + 1);
    while letters.len() < USER_CODE_LENGTH + 1 {
        let mut byte = [0u8; 1];
        random.fill(&mut byte).ok()?;
        // 240 = 12 × 20: below it every letter is equally likely.
        if byte[0] < 240 {
            if letters.len() == USER_CODE_LENGTH / 2 {
                letters.push('-');
            }
            letters.push(char::from(USER_CODE_ALPHABET[usize::from(byte[0] % 20)]));
        }
    }
    Some(letters)
}

/// A user code as typed (any case, with or without the dash and spaces) in its stored form
/// (upper case, `XXXX-XXXX`); `None` when it cannot be a user code.
pub(crate) fn normalize_user_code(typed: &str) -> Option<String> {
    let letters: Vec<u8> = typed
        .bytes()
        .filter(|b| !matches!(b, b'-' | b' ' | b'\t'))
        .map(|b| b.to_ascii_uppercase())
        .collect();
    if letters.len() != USER_CODE_LENGTH || !letters.iter().all(|b| USER_CODE_ALPHABET.contains(b)) {
        return None;
    }
    let text = String::from_utf8(letters).ok()?;
    Some(format!("{}-{}", &text[..4], &text[4..]))
}

/// The device ID of a (normalized) user code: the first 16 bytes of a SHA-256 of it, so that every
/// replica finds the same Secret, and the Secret's name does not show the code.
pub(crate) fn id_of(user_code: &str) -> [u8; 16] {
    let mut digest = sha2::Sha256::new();
    digest.update(b"selkie device user code\0");
    digest.update(user_code.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest.finalize()[..16]);
    id
}

/// The name of the Secret of device login `id`.
pub(crate) fn secret_name(id: &[u8; 16]) -> String {
    format!("pinniped-storage-device-{}", uuid_text(id))
}

/// The `state` of a device login's authorization request: the device ID and 24 random bytes,
/// base64url (`None` without secure randomness).
pub(crate) fn new_state(id: &[u8; 16]) -> Option<String> {
    let mut bytes = [0u8; 40];
    bytes[..16].copy_from_slice(id);
    ring::rand::SystemRandom::new().fill(&mut bytes[16..]).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}

/// The device ID a `state` names (`None` when it is no device login's state).
pub(crate) fn id_of_state(state: &str) -> Option<[u8; 16]> {
    let bytes = URL_SAFE_NO_PAD.decode(state).ok()?;
    (bytes.len() == 40).then(|| {
        let mut id = [0u8; 16];
        id.copy_from_slice(&bytes[..16]);
        id
    })
}

impl DeviceLogin {
    /// The Secret holding it, collectable when its device code expires (clamped to `now` and to
    /// [`DEVICE_CODE_LIFETIME`] from `now`).
    pub(crate) fn to_secret(&self, now: OffsetDateTime) -> Result<Secret, StoreError> {
        let data = serde_json::to_value(&self.request).map_err(|e| StoreError::Session(e.to_string()))?;
        let remaining = self
            .request
            .expires_at
            .saturating_sub(now.unix_timestamp())
            .clamp(0, DEVICE_CODE_LIFETIME.whole_seconds());
        let mut secret = storage::storage_secret(
            secret_name(&self.id),
            DEVICE_TYPE.to_string(),
            DEVICE_LABEL,
            &data,
            &Default::default(),
            now.saturating_add(time::Duration::seconds(remaining)),
        );
        secret.data.get_or_insert_default().insert(
            STATUS_KEY.to_string(),
            ByteString(self.status.text().into_bytes()),
        );
        Ok(secret)
    }

    /// The device login `secret` holds. Fails, naming what is wrong (never a value), when it is
    /// not a device login's Secret or its data does not read.
    pub(crate) fn read(secret: &Secret) -> Result<Self, StoreError> {
        let data = storage::read_as(secret, DEVICE_TYPE, DEVICE_LABEL)?;
        let request: DeviceRequest = serde_json::from_value(data)
            .map_err(|e| StoreError::Session(selkie_api::json::error_without_values(&e)))?;
        let damaged = |what: &str| {
            StoreError::Storage(StorageError::NotJson(format!(
                "the device login's {what} does not read"
            )))
        };
        let status = secret
            .data
            .as_ref()
            .and_then(|data| data.get(STATUS_KEY))
            .and_then(|value| std::str::from_utf8(&value.0).ok())
            .and_then(DeviceStatus::parse)
            .ok_or_else(|| damaged("status"))?;
        let id = secret
            .metadata
            .name
            .as_deref()
            .and_then(|name| name.strip_prefix("pinniped-storage-device-"))
            .and_then(crate::session::login::id_of)
            .ok_or_else(|| damaged("name"))?;
        Ok(Self { id, request, status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> DeviceRequest {
        DeviceRequest {
            issuer: "https://sso.example.com".into(),
            client_id: "pinniped-cli".into(),
            code_challenge: "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM".into(),
            authorize_query: "client_id=pinniped-cli&state=state&scope=openid".into(),
            device_code_signature: "sig".into(),
            state: "state".into(),
            expires_at: 1_000_600,
        }
    }

    #[test]
    fn user_codes_are_eight_unambiguous_letters_and_read_back_however_typed() {
        for _ in 0..200 {
            let code = new_user_code().unwrap();
            assert_eq!(code.len(), 9, "{code}");
            assert_eq!(&code[4..5], "-");
            assert_eq!(normalize_user_code(&code).as_deref(), Some(code.as_str()));
            let typed = code.replace('-', " ").to_lowercase();
            assert_eq!(normalize_user_code(&typed).as_deref(), Some(code.as_str()));
            assert!(!code.bytes().any(|b| b"AEIOUY0123456789".contains(&b)), "{code}");
        }
        for bad in [
            "",
            "BCDF-GHJ",
            "BCDF-GHJKL",
            "BCDF-GHJA",
            "BCDF-GH1K",
            "BCDFÉGHJK",
        ] {
            assert_eq!(normalize_user_code(bad), None, "{bad}");
        }
        assert_ne!(id_of("BCDF-GHJK"), id_of("BCDF-GHJL"));
    }

    #[test]
    fn states_name_their_device_and_nothing_else_does() {
        let id = id_of("BCDF-GHJK");
        let state = new_state(&id).unwrap();
        assert_eq!(id_of_state(&state), Some(id));
        assert_ne!(new_state(&id).unwrap(), state, "a state is random");
        for bad in ["", "short", "not base64 !", &state[..state.len() - 2]] {
            assert_eq!(id_of_state(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_device_login_reads_back_in_every_status_and_damage_is_refused() {
        let now = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        for status in [
            DeviceStatus::Pending,
            DeviceStatus::Approved {
                code: "pin_ac_abc.def".into(),
            },
            DeviceStatus::Denied {
                error: "access_denied".into(),
            },
            DeviceStatus::Redeemed,
        ] {
            let login = DeviceLogin {
                id: id_of("BCDF-GHJK"),
                request: request(),
                status,
            };
            let secret = login.to_secret(now).unwrap();
            assert_eq!(secret.type_.as_deref(), Some(DEVICE_TYPE));
            assert_eq!(
                storage::garbage_collect_after(&secret),
                Some(OffsetDateTime::from_unix_timestamp(1_000_600).unwrap())
            );
            assert_eq!(DeviceLogin::read(&secret).unwrap(), login);
        }
        let mut secret = DeviceLogin {
            id: id_of("BCDF-GHJK"),
            request: request(),
            status: DeviceStatus::Pending,
        }
        .to_secret(now)
        .unwrap();
        for damaged in ["approved", "approved a b", "denied ", "done", ""] {
            secret
                .data
                .as_mut()
                .unwrap()
                .insert(STATUS_KEY.into(), ByteString(damaged.as_bytes().to_vec()));
            let error = DeviceLogin::read(&secret).unwrap_err().to_string();
            assert!(error.contains("status does not read"), "{damaged:?}: {error}");
        }
    }
}
