//! A login's session: who logged in, through which upstream, what the client was granted, and
//! what the Supervisor needs to check the upstream again on every refresh. It is the JSON of the
//! storage Secrets ([`crate::session::storage`]) of the login's authorization code, access and refresh
//! tokens, and is never logged (it holds the upstream refresh token).

pub(crate) mod device;
pub(crate) mod gc;
pub(crate) mod id_token;
pub(crate) mod login;
pub(crate) mod storage;
pub(crate) mod store;
pub(crate) mod tokens;

use std::collections::BTreeMap;

use selkie_api::supervisor_config::FederationDomainSessions;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

/// How long a session lasts from the initial login unless its FederationDomain says otherwise
/// ([`SessionTerms`]); refreshes never extend it. Pinniped's fixed 9 hours.
pub(crate) const MAX_SESSION: time::Duration = time::Duration::hours(9);
/// The longest session a FederationDomain may configure (30 days).
pub(crate) const LONGEST_SESSION: time::Duration = time::Duration::hours(720);
/// The shortest maximum lifetime a FederationDomain may configure.
const SHORTEST_SESSION: time::Duration = time::Duration::minutes(5);
/// The shortest idle timeout a FederationDomain may configure.
const SHORTEST_IDLE_TIMEOUT: time::Duration = time::Duration::minutes(1);
/// How long an authorization code may be redeemed.
pub(crate) const AUTHORIZATION_CODE_LIFETIME: time::Duration = time::Duration::minutes(10);
/// How long an access token is good for.
pub(crate) const ACCESS_TOKEN_LIFETIME: time::Duration = time::Duration::minutes(2);

/// How long the sessions of logins through one identity provider of a FederationDomain last:
/// `spec.sessions` of the FederationDomain, overridden field by field by the provider's own. A
/// login's terms are copied into its [`Session`] and kept for the session's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTerms {
    /// How long a session lasts from its login ([`MAX_SESSION`] by default).
    pub max_lifetime: time::Duration,
    /// How long a session may go without a refresh; no limit when `None` (the default).
    pub idle_timeout: Option<time::Duration>,
}

impl Default for SessionTerms {
    /// Pinniped's: 9 hours, no idle limit.
    fn default() -> Self {
        Self {
            max_lifetime: MAX_SESSION,
            idle_timeout: None,
        }
    }
}

impl SessionTerms {
    /// The terms of `provider`'s sessions (its `sessions`, then the FederationDomain's, then the
    /// defaults), checked against the bounds. The error names the field (`spec.sessions.…` or
    /// `spec.identityProviders[index].sessions.…`) and says what is wrong.
    pub fn of(
        federation_domain: Option<&FederationDomainSessions>,
        provider: Option<(usize, &FederationDomainSessions)>,
    ) -> Result<Self, String> {
        let field = |name: &str, pick: fn(&FederationDomainSessions) -> Option<&String>| {
            provider
                .and_then(|(index, sessions)| {
                    pick(sessions)
                        .map(|text| (format!("spec.identityProviders[{index}].sessions.{name}"), text))
                })
                .or_else(|| {
                    federation_domain
                        .and_then(pick)
                        .map(|text| (format!("spec.sessions.{name}"), text))
                })
        };
        let mut terms = Self::default();
        if let Some((path, text)) = field("maxLifetime", |s| s.max_lifetime.as_ref()) {
            terms.max_lifetime = bounded(&path, text, SHORTEST_SESSION, LONGEST_SESSION)?;
        }
        if let Some((path, text)) = field("idleTimeout", |s| s.idle_timeout.as_ref()) {
            terms.idle_timeout = Some(bounded(&path, text, SHORTEST_IDLE_TIMEOUT, terms.max_lifetime)?);
        }
        Ok(terms)
    }

    /// The terms as the identity-provider discovery document lists them.
    pub fn discovered(&self) -> selkie_api::supervisor_oidc::IDPSessions {
        selkie_api::supervisor_oidc::IDPSessions {
            max_lifetime: written(self.max_lifetime),
            idle_timeout: self.idle_timeout.map(written),
        }
    }
}

/// `duration` as a FederationDomain writes it (`9h`, `90m` is `1h30m`).
pub(crate) fn written(duration: time::Duration) -> String {
    selkie_api::duration::format(duration.unsigned_abs())
}

/// `text` as a duration from `least` to `most` (Go's form, `90s`, `1h30m`); the error names
/// `path` and says what is wrong (not a duration, or out of range and the range).
pub(crate) fn bounded(
    path: &str,
    text: &str,
    least: time::Duration,
    most: time::Duration,
) -> Result<time::Duration, String> {
    let parsed = selkie_api::duration::parse(text).map_err(|error| format!("{path}: {error}"))?;
    let duration = time::Duration::try_from(parsed.magnitude).unwrap_or(time::Duration::MAX);
    if parsed.negative || duration < least || duration > most {
        return Err(format!(
            "{path}: {text:?} is out of range: it must be from {} to {}",
            written(least),
            written(most)
        ));
    }
    Ok(duration)
}

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
    /// When the session ends (unix seconds): its [`SessionTerms::max_lifetime`] after the login.
    pub expires_at: i64,
    /// Its [`SessionTerms::idle_timeout`] in seconds: each refresh token it issues is good for that
    /// long (and never past `expires_at`). Absent: no idle limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<i64>,
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

    /// When a refresh token issued at `now` stops being good (unix seconds): after the session's
    /// idle timeout, and never after the session ends.
    pub fn refresh_token_expires_at(&self, now: OffsetDateTime) -> i64 {
        match self.idle_timeout {
            Some(idle) => now
                .unix_timestamp()
                .saturating_add(idle.max(0))
                .min(self.expires_at),
            None => self.expires_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(max: Option<&str>, idle: Option<&str>) -> FederationDomainSessions {
        FederationDomainSessions {
            max_lifetime: max.map(String::from),
            idle_timeout: idle.map(String::from),
        }
    }

    #[test]
    fn session_terms_are_pinnipeds_unless_said_otherwise_and_a_provider_overrides_field_by_field() {
        assert_eq!(SessionTerms::of(None, None), Ok(SessionTerms::default()));
        assert_eq!(SessionTerms::default().max_lifetime, time::Duration::hours(9));
        let week = sessions(Some("120h"), Some("8h"));
        assert_eq!(
            SessionTerms::of(Some(&week), None),
            Ok(SessionTerms {
                max_lifetime: time::Duration::hours(120),
                idle_timeout: Some(time::Duration::hours(8)),
            })
        );
        assert_eq!(
            SessionTerms::of(Some(&week), Some((0, &sessions(Some("1h30m"), None)))),
            Err("spec.sessions.idleTimeout: \"8h\" is out of range: it must be from 1m to 1h30m".into()),
            "the FederationDomain's idle limit is checked against the provider's maximum"
        );
        assert_eq!(
            SessionTerms::of(Some(&week), Some((1, &sessions(None, Some("30m"))))),
            Ok(SessionTerms {
                max_lifetime: time::Duration::hours(120),
                idle_timeout: Some(time::Duration::minutes(30)),
            })
        );
    }

    #[test]
    fn session_terms_out_of_bounds_name_their_field() {
        for (max, idle, error) in [
            (
                Some("4m59s"),
                None,
                "spec.sessions.maxLifetime: \"4m59s\" is out of range: it must be from 5m to 720h",
            ),
            (
                Some("721h"),
                None,
                "spec.sessions.maxLifetime: \"721h\" is out of range: it must be from 5m to 720h",
            ),
            (
                Some("-9h"),
                None,
                "spec.sessions.maxLifetime: \"-9h\" is out of range: it must be from 5m to 720h",
            ),
            (
                Some("a week"),
                None,
                "spec.sessions.maxLifetime: \"a week\" is not a duration such as 10s, 1m30s or 500ms",
            ),
            (
                Some("9"),
                None,
                "spec.sessions.maxLifetime: \"9\" has no unit (h, m, s, ms, us or ns)",
            ),
            (
                None,
                Some("59s"),
                "spec.sessions.idleTimeout: \"59s\" is out of range: it must be from 1m to 9h",
            ),
            (
                None,
                Some("10h"),
                "spec.sessions.idleTimeout: \"10h\" is out of range: it must be from 1m to 9h",
            ),
            (
                Some("99999999999999999999h"),
                None,
                "spec.sessions.maxLifetime: \"99999999999999999999h\" is not a duration that fits: too large",
            ),
        ] {
            assert_eq!(
                SessionTerms::of(Some(&sessions(max, idle)), None),
                Err(error.to_string())
            );
        }
        assert_eq!(
            SessionTerms::of(None, Some((2, &sessions(Some("1000h"), None)))),
            Err("spec.identityProviders[2].sessions.maxLifetime: \"1000h\" is out of range: it must be from 5m to 720h".into())
        );
    }

    #[test]
    fn a_refresh_token_lasts_the_idle_timeout_and_never_past_the_session() {
        let now = OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        let mut session: Session = serde_json::from_value(serde_json::json!({
            "request_id": "r", "client_id": "c", "redirect_uri": "u", "scopes": [],
            "code_challenge": "x", "requested_at": 0, "auth_time": 0,
            "expires_at": 1_000_000 + 3600, "token_expires_at": 0,
            "identity": {"subject": "s", "username": "u", "groups": []},
            "upstream": {"idp_name": "i", "idp_type": "ldap", "issuer": "", "subject": "s"},
        }))
        .unwrap();
        assert_eq!(
            session.idle_timeout, None,
            "sessions stored before have no idle limit"
        );
        assert_eq!(session.refresh_token_expires_at(now), 1_000_000 + 3600);
        session.idle_timeout = Some(600);
        assert_eq!(session.refresh_token_expires_at(now), 1_000_000 + 600);
        session.idle_timeout = Some(7200);
        assert_eq!(session.refresh_token_expires_at(now), 1_000_000 + 3600);
        session.idle_timeout = Some(i64::MAX);
        assert_eq!(session.refresh_token_expires_at(now), 1_000_000 + 3600);
    }

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
