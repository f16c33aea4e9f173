//! A login's session: who logged in, through which upstream, what the client was granted, and
//! what the Supervisor needs to check the upstream again on every refresh. It is the JSON of the
//! storage Secrets ([`crate::session::storage`]) of the login's authorization code, access and refresh
//! tokens, and is never logged (it holds the upstream refresh token).

pub(crate) mod gc;
pub(crate) mod id_token;
pub(crate) mod storage;
pub(crate) mod store;
pub(crate) mod tokens;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

/// How long a session lasts from the initial login; refreshes never extend it.
pub(crate) const MAX_SESSION: time::Duration = time::Duration::hours(9);
/// How long an authorization code may be redeemed.
pub(crate) const AUTHORIZATION_CODE_LIFETIME: time::Duration = time::Duration::minutes(10);
/// How long an access token is good for.
pub(crate) const ACCESS_TOKEN_LIFETIME: time::Duration = time::Duration::minutes(2);

/// The identity the Supervisor vouches for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The downstream `sub`.
    pub subject: String,
    /// The downstream username.
    pub username: String,
    /// The downstream groups.
    pub groups: Vec<String>,
    /// The upstream's additional claim mappings, for `additionalClaims`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_claims: BTreeMap<String, Value>,
}

/// What the Supervisor keeps of the upstream login.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upstream {
    /// The identity provider's display name in the FederationDomain.
    pub idp_name: String,
    /// Its type (`oidc`, ...).
    pub idp_type: String,
    /// The identity provider resource's name (the garbage collector finds it by name and UID to
    /// revoke the upstream tokens).
    #[serde(default)]
    pub provider_name: String,
    /// The identity provider resource's UID.
    #[serde(default)]
    pub provider_uid: String,
    /// The upstream issuer (OIDC).
    pub issuer: String,
    /// The upstream `sub`.
    pub subject: String,
    /// The upstream refresh token, when it issued one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// The upstream access token, when there is no refresh token (checked at userinfo instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// LDAP and Active Directory: what a refresh checks the user against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap: Option<LdapSession>,
    /// The upstream username, before the FederationDomain's identity transforms (absent in
    /// sessions stored before them: the downstream username then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The upstream groups at the login or the last refresh, before the transforms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<String>>,
}

/// What an LDAP or Active Directory login keeps for its refreshes (`issuer` is the directory's
/// URL and `subject` the user's UID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LdapSession {
    /// The user's entry.
    pub dn: String,
    /// The upstream username at login.
    pub username: String,
    /// Attributes a refresh compares (Active Directory: `pwdLastSet`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refresh_attributes: BTreeMap<String, String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("idp_name", &self.idp_name)
            .field("idp_type", &self.idp_type)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// A new login's request ID, as fosite makes one for Pinniped: a random (version 4) UUID in its
/// lowercase hyphenated form, so it is always a valid label value. `None` only when the system's
/// random source fails.
pub(crate) fn new_request_id() -> Option<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Some(uuid_text(&bytes))
}

/// 16 bytes in a UUID's text form: lowercase hex, 8-4-4-4-12.
pub(crate) fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// One login, from the authorization code on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Identifies the login across its code and tokens (`storage.pinniped.dev/request-id`).
    pub request_id: String,
    /// The client.
    pub client_id: String,
    /// The redirect URI the code was sent to (the token request must repeat it).
    pub redirect_uri: String,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// The client's nonce, for the first ID token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// The PKCE S256 challenge the code must be redeemed with.
    pub code_challenge: String,
    /// When the authorization was requested (unix seconds).
    pub requested_at: i64,
    /// When the user authenticated upstream (unix seconds).
    pub auth_time: i64,
    /// When the session ends (unix seconds): [`MAX_SESSION`] after the login.
    pub expires_at: i64,
    /// Whether the authorization code may still be redeemed (it is single-use).
    #[serde(default)]
    pub code_active: bool,
    /// When the code or token this copy is stored under stops being good (unix seconds).
    pub token_expires_at: i64,
    /// Who.
    pub identity: Identity,
    /// Through which upstream.
    pub upstream: Upstream,
    /// The signature of the access token issued with this copy's refresh token, so that a
    /// refresh deletes that token by name; absent in sessions stored before (a refresh then
    /// deletes the login's access tokens by label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token_signature: Option<String>,
    /// Set on a refresh token already exchanged for new tokens: its Secret is kept until the
    /// session ends, emptied of upstream tokens ([`Session::rotated`]), so that presenting it
    /// again is recognised as reuse and ends the whole login (RFC 9700 §4.14.2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotated: bool,
}

impl Session {
    /// Whether the session's scopes include `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|granted| granted == scope)
    }

    /// What a refresh token's Secret keeps once the token was used ([`Session::rotated`] set):
    /// the login's identity and times, none of its upstream tokens.
    pub fn rotated(&self) -> Self {
        let mut rotated = self.clone();
        rotated.rotated = true;
        rotated.upstream.refresh_token = None;
        rotated.upstream.access_token = None;
        rotated
    }

    /// Whether the session is over at `now`.
    pub fn expired_at(&self, now: OffsetDateTime) -> bool {
        now.unix_timestamp() >= self.expires_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_version_4_uuids_and_valid_label_values() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let id = new_request_id().expect("random source");
            assert_eq!(id.len(), 36, "{id}");
            let groups: Vec<&str> = id.split('-').collect();
            assert_eq!(
                groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12],
                "{id}"
            );
            assert!(
                id.bytes()
                    .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{id}"
            );
            assert!(groups[2].starts_with('4'), "{id}");
            assert!(
                matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
                "{id}"
            );
            assert!(seen.insert(id));
        }
    }
}
