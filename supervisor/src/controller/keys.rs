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
//!
//! **Signing-key rotation with overlap** (beyond Pinniped, which never rotates): the leader gives
//! the `jwks` Secret a new active key once the old one has signed for the rotation interval
//! ([`rotate`]); the old public key stays in `jwks` for [`RETIRED_KEY_OVERLAP`] — longer than any
//! token it signed lives — so no token is refused because of a rotation. When a key became
//! active and when a retired key may go are the annotations [`ACTIVE_SINCE_ANNOTATION`] and
//! [`RETIRED_KEYS_ANNOTATION`]; a Secret without them (Pinniped's) counts from its creation.
//!
//! **The next key is published before it signs**: [`NEXT_KEY_LEAD`] before a rotation is due the
//! leader generates the next key, keeps it (private) in the data key [`NEXT_JWK_KEY`] and adds
//! its public key to `jwks`; the rotation then makes that key active. Relying parties that
//! refresh their key sets (Selkie's JWTAuthenticator at least hourly) already hold the key when
//! its first token arrives, and replicas that see the rotation late serve a `jwks.json` that
//! already lists it. Pinniped reads only `activeJWK` and `jwks` and ignores the extra data key.

use std::collections::BTreeMap;

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

use k8s_openapi::{
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    ByteString,
};
use ring::rand::SecureRandom as _;
use selkie_oidc::jose::sign::SigningKey;
use serde_json::{json, Value};

/// The data key of the private signing JWK.
pub(crate) const ACTIVE_JWK_KEY: &str = "activeJWK";
/// The data key of the published JWKS.
pub(crate) const JWKS_KEY: &str = "jwks";
/// The data key of the next signing key (a private JWK), already published in `jwks`.
pub(crate) const NEXT_JWK_KEY: &str = "nextJWK";
/// How long before a rotation the next key is published (at most half the rotation interval):
/// longer than the hour after which Selkie's JWTAuthenticator refreshes a key set.
pub(crate) const NEXT_KEY_LEAD: time::Duration = time::Duration::hours(2);
/// The data key of a symmetric key.
pub(crate) const SYMMETRIC_KEY: &str = "key";
/// The `kid` of the first signing key of a FederationDomain (Pinniped's); rotated keys get a
/// random one ([`rotated_kid`]).
pub(crate) const KEY_ID: &str = "pinniped-supervisor-key";
/// The `jwks` Secret's annotation: when its active key became active (RFC 3339).
pub(crate) const ACTIVE_SINCE_ANNOTATION: &str = "supervisor.selkie.dev/active-key-since";
/// The `jwks` Secret's annotation: the retired keys still published, as a JSON object from `kid`
/// to the time (RFC 3339) after which the key is dropped from `jwks`.
pub(crate) const RETIRED_KEYS_ANNOTATION: &str = "supervisor.selkie.dev/retired-keys";
/// How long a retired key stays published: the lifetime of the ID tokens it signed, plus five
/// minutes for clocks that disagree.
pub(crate) const RETIRED_KEY_OVERLAP: time::Duration =
    crate::session::id_token::LIFETIME.saturating_add(time::Duration::minutes(5));
/// How long a signing key signs before the leader rotates it, unless `signingKeyRotationInterval`
/// says otherwise: 30 days.
pub(crate) const DEFAULT_ROTATION_INTERVAL: std::time::Duration =
    std::time::Duration::from_secs(30 * 24 * 3600);

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
                jwks_data(&key, &[], None)
            }
            _ => {
                let mut key = vec![0u8; 32];
                ring::rand::SystemRandom::new()
                    .fill(&mut key)
                    .map_err(|_| KeyError::Random)?;
                BTreeMap::from([(SYMMETRIC_KEY.to_string(), ByteString(key))])
            }
        };
        let annotations = (self == Self::Jwks).then(|| {
            BTreeMap::from([(
                ACTIVE_SINCE_ANNOTATION.to_string(),
                rfc3339(OffsetDateTime::now_utc()),
            )])
        });
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(self.name(federation_domain)),
                namespace: Some(namespace.to_string()),
                owner_references: Some(vec![owner]),
                annotations,
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
pub(crate) fn read_jwks(secret: &Secret) -> Result<(SigningKey, Value), KeyError> {
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
        // The active key must be published, or its tokens would not verify.
        .filter(|jwks: &Value| publishes(jwks, &key))
        .ok_or_else(|| unusable(JWKS_KEY))?;
    Ok((key, jwks))
}

/// Whether the JWKS `jwks` holds the public half of `key` (same `kid` and point).
fn publishes(jwks: &Value, key: &SigningKey) -> bool {
    let public = key.public_jwk();
    jwks["keys"].as_array().is_some_and(|keys| {
        keys.iter()
            .any(|jwk| jwk["kid"] == public["kid"] && jwk["x"] == public["x"] && jwk["y"] == public["y"])
    })
}

/// The next signing key of a `jwks` Secret whose published keys are `jwks`: `None` when there is
/// none, or it is unreadable or not published (then it is never used; a new one replaces it).
fn read_next(secret: &Secret, jwks: &Value) -> Option<SigningKey> {
    let data = secret.data.as_ref()?.get(NEXT_JWK_KEY)?;
    serde_json::from_slice(&data.0)
        .ok()
        .and_then(|jwk: Value| SigningKey::from_private_jwk(&jwk).ok())
        .filter(|next| publishes(jwks, next))
}

/// The data of a `jwks` Secret whose active key is `active`, whose next key is `next`, and whose
/// published keys are the active one and `others` (public JWKs; the next key's among them).
fn jwks_data(
    active: &SigningKey,
    others: &[Value],
    next: Option<&SigningKey>,
) -> BTreeMap<String, ByteString> {
    let published: Vec<Value> = std::iter::once(active.public_jwk())
        .chain(others.iter().cloned())
        .collect();
    let next = next.map(|next| {
        (
            NEXT_JWK_KEY.to_string(),
            ByteString(next.private_jwk().to_string().into_bytes()),
        )
    });
    BTreeMap::from_iter([
        (
            ACTIVE_JWK_KEY.to_string(),
            ByteString(active.private_jwk().to_string().into_bytes()),
        ),
        (
            JWKS_KEY.to_string(),
            ByteString(json!({"keys": published}).to_string().into_bytes()),
        ),
    ])
    .into_iter()
    .chain(next)
    .collect()
}

/// A new signing key for a rotation, with a fresh [`rotated_kid`].
fn rotated_key() -> Result<SigningKey, KeyError> {
    SigningKey::generate(&rotated_kid()?).map_err(|_| KeyError::Random)
}

/// A fresh random `kid` for a rotated key: `selkie-` and 16 hex digits.
pub(crate) fn rotated_kid() -> Result<String, KeyError> {
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| KeyError::Random)?;
    Ok(format!(
        "selkie-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.replace_nanosecond(0)
        .unwrap_or(at)
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// What [`rotate`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rotation {
    /// The `kid` of the new active key, when there is one.
    pub new_kid: Option<String>,
    /// The `kid` of a next key published now, when there is one.
    pub next_kid: Option<String>,
    /// The `kid`s dropped from `jwks` because their overlap is over.
    pub dropped: Vec<String>,
}

/// When the keys of a `jwks` Secret are due to change, as its annotations (or, without them, its
/// creation time) say at `now`, with keys rotated every `interval` (`None`: never).
struct Schedule {
    /// The retired keys still published, by `kid`, with the time after which each goes; `None`
    /// when that time is unreadable or beyond the overlap (an edited annotation would keep a
    /// retired key published for ever): the key goes at once.
    retired: BTreeMap<String, Option<OffsetDateTime>>,
    /// When the next key is published: the lead ([`NEXT_KEY_LEAD`], at most half the interval)
    /// before the rotation.
    lead_at: Option<OffsetDateTime>,
    /// When the active key is replaced.
    due_at: Option<OffsetDateTime>,
}

impl Schedule {
    fn of(secret: &Secret, now: OffsetDateTime, interval: Option<std::time::Duration>) -> Self {
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        let parse_time = |text: &str| OffsetDateTime::parse(text, &Rfc3339).ok();
        // When the active key became active. A time in the future (a clock gone wrong, an edited
        // annotation) would keep the key from ever rotating: it counts as unreadable, and the
        // Secret's creation time stands instead.
        let since = annotations
            .get(ACTIVE_SINCE_ANNOTATION)
            .and_then(|text| parse_time(text))
            .filter(|since| *since <= now)
            .or_else(|| {
                let created = secret.metadata.creation_timestamp.as_ref()?;
                OffsetDateTime::from_unix_timestamp(created.0.as_second()).ok()
            })
            .unwrap_or(now);
        let retired: BTreeMap<String, String> = annotations
            .get(RETIRED_KEYS_ANNOTATION)
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        let retired = retired
            .into_iter()
            .map(|(kid, until)| {
                let until = parse_time(&until).filter(|until| *until <= now + RETIRED_KEY_OVERLAP);
                (kid, until)
            })
            .collect();
        let interval =
            interval.map(|interval| time::Duration::try_from(interval).unwrap_or(time::Duration::MAX));
        let due_at = interval.and_then(|interval| since.checked_add(interval));
        let lead_at =
            interval.and_then(|interval| since.checked_add(interval - NEXT_KEY_LEAD.min(interval / 2)));
        Self {
            retired,
            lead_at,
            due_at,
        }
    }
}

/// When [`rotate`] will next change the `jwks` Secret `secret`, as seen at `now` with keys
/// rotated every `interval` (`None`: never): the earliest of the next key's publication, the
/// rotation and a retired key's end (`now` when one is overdue). `None` when nothing is ever due
/// or the Secret is unusable (nothing changes it but a new version of it).
pub(crate) fn next_change(
    secret: &Secret,
    now: OffsetDateTime,
    interval: Option<std::time::Duration>,
) -> Option<OffsetDateTime> {
    let (_, published) = read_jwks(secret).ok()?;
    let has_next = read_next(secret, &published).is_some();
    let schedule = Schedule::of(secret, now, interval);
    let retired_ends = schedule.retired.values().map(|until| until.unwrap_or(now));
    let lead_at = schedule.lead_at.filter(|_| !has_next);
    retired_ends
        .chain(lead_at)
        .chain(schedule.due_at)
        .min()
        .map(|at| at.max(now))
}

/// The `jwks` Secret as it should be at `now` with keys rotated every `interval` (`None`: never):
/// a next key published once the active one has been active for `interval` less the lead
/// ([`NEXT_KEY_LEAD`], at most half of `interval`); a new active key — the next one, or a fresh
/// one when none was published in time — once it has been active for `interval` (the old one
/// retired, published until `now` + [`RETIRED_KEY_OVERLAP`]); and the retired keys whose time is
/// over dropped. Keys in `jwks` that are neither active nor retired by Selkie (an admin's) are left
/// alone. Returns `Ok(None)` when nothing changes, and fails when the Secret is unusable (see
/// [`read_jwks`]; the caller leaves it as it is) or no randomness is available.
pub(crate) fn rotate(
    secret: &Secret,
    now: OffsetDateTime,
    interval: Option<std::time::Duration>,
) -> Result<Option<(Secret, Rotation)>, KeyError> {
    let (active, published) = read_jwks(secret)?;
    let next = read_next(secret, &published);
    let Schedule {
        mut retired,
        lead_at,
        due_at,
    } = Schedule::of(secret, now, interval);
    let mut others: Vec<Value> = published["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter(|jwk| jwk["kid"] != active.kid())
                .cloned()
                .collect()
        })
        .unwrap_or_default();

    // Drop the retired keys whose overlap is over.
    let mut dropped = Vec::new();
    retired.retain(|kid, until| {
        let keep = until.is_some_and(|until| until > now);
        if !keep {
            dropped.push(kid.clone());
        }
        keep
    });
    others.retain(|jwk| !dropped.iter().any(|kid| jwk["kid"] == kid.as_str()));

    let due = due_at.is_some_and(|at| now >= at);
    let publish_next = lead_at.is_some_and(|at| now >= at) && next.is_none();
    let (active, next, new_kid, next_kid) = if due {
        let promoted = match next {
            Some(next) => next,
            None => rotated_key()?,
        };
        retired.insert(active.kid().to_string(), Some(now + RETIRED_KEY_OVERLAP));
        others.retain(|jwk| jwk["kid"] != promoted.kid());
        others.insert(0, active.public_jwk());
        let kid = promoted.kid().to_string();
        (promoted, None, Some(kid), None)
    } else if publish_next {
        let next = rotated_key()?;
        others.push(next.public_jwk());
        let kid = next.kid().to_string();
        (active, Some(next), None, Some(kid))
    } else {
        (active, next, None, None)
    };
    if new_kid.is_none() && next_kid.is_none() && dropped.is_empty() {
        return Ok(None);
    }
    let mut updated = secret.clone();
    updated.data = Some(jwks_data(&active, &others, next.as_ref()));
    let annotations = updated.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if new_kid.is_some() {
        annotations.insert(ACTIVE_SINCE_ANNOTATION.to_string(), rfc3339(now));
    }
    if retired.is_empty() {
        annotations.remove(RETIRED_KEYS_ANNOTATION);
    } else {
        let retired: BTreeMap<&String, String> = retired
            .iter()
            .filter_map(|(kid, until)| Some((kid, rfc3339((*until)?))))
            .collect();
        annotations.insert(
            RETIRED_KEYS_ANNOTATION.to_string(),
            serde_json::to_string(&retired).unwrap_or_default(),
        );
    }
    Ok(Some((
        updated,
        Rotation {
            new_kid,
            next_kid,
            dropped,
        },
    )))
}

/// The 32-byte key of a symmetric key Secret.
pub(crate) fn read_symmetric(secret: &Secret, kind: KeySecret) -> Result<Vec<u8>, KeyError> {
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

    /// The public keys `jwks` publishes, by `kid`.
    fn published_kids(secret: &Secret) -> Vec<String> {
        let (_, jwks) = read_jwks(secret).unwrap();
        jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|jwk| jwk["kid"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn times_in_the_future_neither_stop_a_rotation_nor_keep_a_retired_key() {
        let day = std::time::Duration::from_secs(24 * 3600);
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let mut secret = KeySecret::Jwks.generate("fd", "ns", owner()).unwrap();
        secret.metadata.creation_timestamp =
            serde_json::from_value(json!(rfc3339(now - time::Duration::days(2)))).unwrap();
        secret.metadata.annotations = Some(BTreeMap::from([
            (
                ACTIVE_SINCE_ANNOTATION.to_string(),
                rfc3339(now + time::Duration::days(3650)),
            ),
            (
                RETIRED_KEYS_ANNOTATION.to_string(),
                json!({"old": rfc3339(now + time::Duration::days(3650))}).to_string(),
            ),
        ]));
        // Active since its creation two days ago: due, whatever the annotation says.
        let (_, rotation) = rotate(&secret, now, Some(day)).unwrap().unwrap();
        assert!(rotation.new_kid.is_some(), "{rotation:?}");
        assert_eq!(rotation.dropped, ["old"]);
    }

    #[test]
    fn keys_rotate_after_the_interval_and_retired_ones_stay_for_the_overlap() {
        let day = std::time::Duration::from_secs(24 * 3600);
        let start = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let mut secret = KeySecret::Jwks.generate("fd", "ns", owner()).unwrap();
        secret.metadata.annotations = Some(BTreeMap::from([(
            ACTIVE_SINCE_ANNOTATION.to_string(),
            rfc3339(start),
        )]));
        // Not yet due; rotation off.
        assert_eq!(
            rotate(&secret, start + time::Duration::hours(21), Some(day)).unwrap(),
            None
        );
        assert_eq!(
            rotate(&secret, start + time::Duration::days(400), None).unwrap(),
            None
        );

        // Due with no next key published (the Supervisor was down): a fresh key at once.
        let at = start + time::Duration::days(1);
        let (fresh, rotation) = rotate(&secret, at, Some(day)).unwrap().unwrap();
        assert_eq!(rotation.next_kid, None);
        assert_ne!(read_jwks(&fresh).unwrap().0.kid(), KEY_ID);

        // Two hours before it is due: the next key is published, the active one still signs.
        let (with_next, rotation) = rotate(&secret, start + time::Duration::hours(22), Some(day))
            .unwrap()
            .unwrap();
        assert_eq!(rotation.new_kid, None);
        let next_kid = rotation.next_kid.clone().unwrap();
        assert!(
            next_kid.starts_with("selkie-") && next_kid.len() == 23,
            "{next_kid}"
        );
        assert_eq!(read_jwks(&with_next).unwrap().0.kid(), KEY_ID);
        assert_eq!(published_kids(&with_next), [KEY_ID.to_string(), next_kid.clone()]);
        let data = with_next.data.clone().unwrap();
        assert!(data.contains_key(NEXT_JWK_KEY));
        let (_, jwks) = read_jwks(&with_next).unwrap();
        assert!(jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .all(|jwk| jwk.get("d").is_none()));
        // Published once: nothing more changes until the rotation.
        assert_eq!(
            rotate(&with_next, start + time::Duration::hours(23), Some(day)).unwrap(),
            None
        );
        // A next key that is not published is never promoted; a new one is published instead.
        let mut unpublished = with_next.clone();
        unpublished.data.as_mut().unwrap().insert(
            NEXT_JWK_KEY.into(),
            ByteString(
                SigningKey::generate("stray")
                    .unwrap()
                    .private_jwk()
                    .to_string()
                    .into_bytes(),
            ),
        );
        let (_, rotation) = rotate(&unpublished, start + time::Duration::hours(23), Some(day))
            .unwrap()
            .unwrap();
        assert!(rotation.next_kid.is_some_and(|kid| kid != "stray"));
        let secret = with_next;

        // Due: the published next key becomes active; the old one is still published.
        let (rotated, rotation) = rotate(&secret, at, Some(day)).unwrap().unwrap();
        let new_kid = rotation.new_kid.clone().unwrap();
        assert_eq!(new_kid, next_kid);
        assert!(!rotated.data.as_ref().unwrap().contains_key(NEXT_JWK_KEY));
        assert!(new_kid.starts_with("selkie-") && new_kid.len() == 23, "{new_kid}");
        assert!(rotation.dropped.is_empty());
        let (active, _) = read_jwks(&rotated).unwrap();
        assert_eq!(active.kid(), new_kid);
        assert_eq!(published_kids(&rotated), [new_kid.clone(), KEY_ID.to_string()]);
        let annotations = rotated.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[ACTIVE_SINCE_ANNOTATION], rfc3339(at));
        let retired: BTreeMap<String, String> =
            serde_json::from_str(&annotations[RETIRED_KEYS_ANNOTATION]).unwrap();
        assert_eq!(retired[KEY_ID], rfc3339(at + RETIRED_KEY_OVERLAP));
        // A token of the old key verifies against the new jwks.
        let old = read_jwks(&secret).unwrap().0;
        let token = old.sign(&json!({"sub": "s"})).unwrap();
        let (_, published) = read_jwks(&rotated).unwrap();
        let keys = selkie_oidc::jose::parse_jwks(published.to_string().as_bytes()).unwrap();
        assert!(selkie_oidc::jose::Jws::parse(&token)
            .unwrap()
            .verify(&keys)
            .is_ok());

        // During the overlap nothing changes; after it the old key goes.
        let during = at + RETIRED_KEY_OVERLAP - time::Duration::seconds(1);
        assert_eq!(rotate(&rotated, during, Some(day)).unwrap(), None);
        let after = at + RETIRED_KEY_OVERLAP + time::Duration::seconds(1);
        let (pruned, rotation) = rotate(&rotated, after, Some(day)).unwrap().unwrap();
        assert_eq!(
            rotation,
            Rotation {
                new_kid: None,
                next_kid: None,
                dropped: vec![KEY_ID.to_string()]
            }
        );
        assert_eq!(published_kids(&pruned), [new_kid]);
        // A short interval: the lead is half of it.
        let minute = std::time::Duration::from_secs(60);
        assert_eq!(
            rotate(&pruned, at + time::Duration::seconds(29), Some(minute)).unwrap(),
            None
        );
        let (_, rotation) = rotate(&pruned, at + time::Duration::seconds(30), Some(minute))
            .unwrap()
            .unwrap();
        assert!(rotation.next_kid.is_some() && rotation.new_kid.is_none());
        assert!(!pruned
            .metadata
            .annotations
            .unwrap()
            .contains_key(RETIRED_KEYS_ANNOTATION));
    }

    /// The leader looks at a FederationDomain again when [`next_change`] says: each time it names
    /// is the first at which [`rotate`] changes the Secret, and before it nothing changes.
    #[test]
    fn the_next_change_is_when_rotate_first_changes_the_secret() {
        let day = std::time::Duration::from_secs(24 * 3600);
        let second = time::Duration::seconds(1);
        let start = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let mut secret = KeySecret::Jwks.generate("fd", "ns", owner()).unwrap();
        secret.metadata.annotations = Some(BTreeMap::from([(
            ACTIVE_SINCE_ANNOTATION.to_string(),
            rfc3339(start),
        )]));
        let changes_first_at = |secret: &Secret, at: OffsetDateTime| {
            assert_eq!(
                rotate(secret, at - second, Some(day)).unwrap(),
                None,
                "changed before {at}"
            );
            rotate(secret, at, Some(day))
                .unwrap()
                .expect("changes at the time named")
                .0
        };

        // The next key is published two hours before the rotation.
        let lead = start + time::Duration::hours(22);
        assert_eq!(next_change(&secret, start, Some(day)), Some(lead));
        let with_next = changes_first_at(&secret, lead);
        // Then the rotation.
        let due = start + time::Duration::days(1);
        assert_eq!(next_change(&with_next, lead, Some(day)), Some(due));
        let rotated = changes_first_at(&with_next, due);
        // Then the retired key's end, before the new key's lead.
        let retired_end = due + RETIRED_KEY_OVERLAP;
        assert_eq!(next_change(&rotated, due, Some(day)), Some(retired_end));
        assert!(rotate(&rotated, retired_end - second, Some(day))
            .unwrap()
            .is_none());
        assert!(rotate(&rotated, retired_end + second, Some(day))
            .unwrap()
            .is_some());

        // Never rotating: only the retired key's end, then nothing at all.
        assert_eq!(next_change(&rotated, due, None), Some(retired_end));
        assert_eq!(next_change(&secret, start, None), None);
        // Overdue (the Supervisor was down): now.
        let late = due + time::Duration::days(3);
        assert_eq!(next_change(&secret, late, Some(day)), Some(late));
        // An unusable Secret changes only when it is written again.
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().remove(ACTIVE_JWK_KEY);
        assert_eq!(next_change(&broken, start, Some(day)), None);
    }

    #[test]
    fn pinnipeds_secret_counts_from_its_creation_and_an_admins_extra_key_stays() {
        let start = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
        let mut secret = KeySecret::Jwks.generate("fd", "ns", owner()).unwrap();
        // Pinniped's Secret: no annotations, a creation time 40 days ago, and an extra public
        // key an admin added.
        secret.metadata.annotations = None;
        secret.metadata.creation_timestamp =
            serde_json::from_value(json!(rfc3339(start - time::Duration::days(40)))).unwrap();
        let extra = SigningKey::generate("admins-key").unwrap().public_jwk();
        let (active, _) = read_jwks(&secret).unwrap();
        secret.data = Some(jwks_data(&active, &[extra], None));
        let (rotated, rotation) = rotate(&secret, start, Some(DEFAULT_ROTATION_INTERVAL))
            .unwrap()
            .unwrap();
        let new_kid = rotation.new_kid.unwrap();
        assert_eq!(
            published_kids(&rotated),
            [new_kid.clone(), KEY_ID.to_string(), "admins-key".to_string()]
        );
        let later = start + RETIRED_KEY_OVERLAP + time::Duration::minutes(1);
        let (pruned, _) = rotate(&rotated, later, Some(DEFAULT_ROTATION_INTERVAL))
            .unwrap()
            .unwrap();
        assert_eq!(published_kids(&pruned), [new_kid, "admins-key".to_string()]);
        // A damaged Secret is not rotated over.
        let mut broken = pruned;
        broken.data.as_mut().unwrap().remove(ACTIVE_JWK_KEY);
        assert!(rotate(&broken, later, Some(std::time::Duration::from_secs(1))).is_err());
    }
}
