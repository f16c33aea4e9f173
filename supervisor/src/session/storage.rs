//! Storage Secrets as Pinniped keeps them — its names, types, labels, annotation and data keys —
//! so that an operator's `kubectl get secrets -l storage.pinniped.dev/type` lists every stored
//! login. Selkie writes one Secret per login in this shape ([`crate::session::login`]). Earlier
//! Selkie versions wrote Pinniped's layout, one Secret per stored item, which is still read (a
//! session left by them refreshes after an upgrade; Pinniped's own session JSON is refused with
//! "log in again"): name `pinniped-storage-<resource>-<base32(signature)>` (the signature of the
//! token or code it belongs to, lower-case, unpadded), type `storage.pinniped.dev/<resource>`,
//! label `storage.pinniped.dev/type: <resource>`, data `pinniped-storage-data` (the JSON) and
//! `pinniped-storage-version` (`1`), and the annotation
//! `storage.pinniped.dev/garbage-collect-after` (RFC 3339) the garbage collector deletes it after.

use std::collections::BTreeMap;

use base64::{
    engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD},
    Engine as _,
};
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta, ByteString};
use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// The label naming what a storage Secret holds.
pub(crate) const TYPE_LABEL: &str = "storage.pinniped.dev/type";
/// The annotation saying when a storage Secret may be deleted.
pub(crate) const GARBAGE_COLLECT_AFTER: &str = "storage.pinniped.dev/garbage-collect-after";
/// The data key of the stored JSON.
pub(crate) const DATA_KEY: &str = "pinniped-storage-data";
/// The data key of the storage format's version.
pub(crate) const VERSION_KEY: &str = "pinniped-storage-version";
/// The storage format's version.
pub(crate) const VERSION: &str = "1";

/// What a storage Secret holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// An authorization code's session.
    AuthCode,
    /// An access token's session.
    AccessToken,
    /// A refresh token's session.
    RefreshToken,
    /// The PKCE challenge of an authorization code.
    Pkce,
    /// The OpenID Connect request (nonce) of an authorization code.
    Oidc,
}

impl Resource {
    /// Every resource.
    pub const ALL: [Self; 5] = [
        Self::AuthCode,
        Self::AccessToken,
        Self::RefreshToken,
        Self::Pkce,
        Self::Oidc,
    ];

    /// The resource named `label` (a `storage.pinniped.dev/type` value), if it is one.
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|resource| resource.as_str() == label)
    }

    /// Pinniped's name for it, used in the Secret's name, type and label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AuthCode => "authcode",
            Self::AccessToken => "access-token",
            Self::RefreshToken => "refresh-token",
            Self::Pkce => "pkce",
            Self::Oidc => "oidc",
        }
    }

    /// The Secret type, `storage.pinniped.dev/<resource>`.
    pub fn secret_type(self) -> String {
        format!("storage.pinniped.dev/{}", self.as_str())
    }

    /// The Secret name for `signature`: [`secret_name`] of this resource.
    pub fn secret_name(self, signature: &str) -> String {
        secret_name(self.as_str(), signature)
    }

    /// The Secret storing `data` for `signature`, collectable `lifetime` after `now`.
    pub fn to_secret(
        self,
        signature: &str,
        data: &serde_json::Value,
        extra_labels: &BTreeMap<String, String>,
        lifetime: time::Duration,
        now: OffsetDateTime,
    ) -> Secret {
        storage_secret(
            self.secret_name(signature),
            self.secret_type(),
            self.as_str(),
            data,
            extra_labels,
            now.saturating_add(lifetime),
        )
    }

    /// The JSON a storage Secret of this resource holds: [`read`] of this resource.
    pub fn read_secret(self, secret: &Secret) -> Result<serde_json::Value, StorageError> {
        read(secret, self.as_str())
    }
}

/// A storage Secret: `name`, of type `secret_type` and type label `label` (and `extra_labels`),
/// holding `data` as JSON in Pinniped's keys, collectable after `collect_after`.
pub(crate) fn storage_secret(
    name: String,
    secret_type: String,
    label: &str,
    data: &serde_json::Value,
    extra_labels: &BTreeMap<String, String>,
    collect_after: OffsetDateTime,
) -> Secret {
    let mut labels = extra_labels.clone();
    labels.insert(TYPE_LABEL.to_string(), label.to_string());
    let collect_after = collect_after
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .ok()
        .and_then(|moment| moment.format(&Rfc3339).ok())
        .unwrap_or_default();
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                GARBAGE_COLLECT_AFTER.to_string(),
                collect_after,
            )])),
            ..ObjectMeta::default()
        },
        type_: Some(secret_type),
        data: Some(BTreeMap::from([
            (DATA_KEY.to_string(), ByteString(data.to_string().into_bytes())),
            (VERSION_KEY.to_string(), ByteString(VERSION.as_bytes().to_vec())),
        ])),
        ..Secret::default()
    }
}

/// The name of the storage Secret of type label `label` (a resource's name, e.g. `authcode` or
/// `oidc-client-secret`) for `signature` (a token's or code's signature, usually base64url): its
/// bytes (decoded when it is base64 of any kind) in lower-case unpadded base32.
pub(crate) fn secret_name(label: &str, signature: &str) -> String {
    let bytes = [URL_SAFE_NO_PAD, URL_SAFE, STANDARD_NO_PAD, STANDARD]
        .iter()
        .find_map(|engine| engine.decode(signature).ok())
        .unwrap_or_else(|| signature.as_bytes().to_vec());
    format!("pinniped-storage-{label}-{}", base32_lower(&bytes))
}

/// A storage Secret's `storage.pinniped.dev/type` label (empty when it has none).
pub(crate) fn type_label(secret: &Secret) -> String {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(TYPE_LABEL))
        .cloned()
        .unwrap_or_default()
}

/// The JSON a storage Secret of type label `label` holds. Fails, naming what is wrong, when the
/// Secret is of another type, label or version, or its data is not JSON.
pub(crate) fn read(secret: &Secret, label: &str) -> Result<serde_json::Value, StorageError> {
    read_as(secret, &format!("storage.pinniped.dev/{label}"), label)
}

/// The JSON a storage Secret of type `expected` and type label `label` holds, as [`read`].
pub(crate) fn read_as(
    secret: &Secret,
    expected: &str,
    label: &str,
) -> Result<serde_json::Value, StorageError> {
    let expected = expected.to_string();
    let found_type = secret.type_.clone().unwrap_or_default();
    if found_type != expected {
        return Err(StorageError::WrongType {
            found: found_type,
            expected,
        });
    }
    let found_label = type_label(secret);
    if found_label != label {
        return Err(StorageError::WrongLabel(found_label));
    }
    let data = secret.data.as_ref();
    if data
        .and_then(|data| data.get(VERSION_KEY))
        .map(|v| v.0.as_slice())
        != Some(VERSION.as_bytes())
    {
        return Err(StorageError::WrongVersion);
    }
    let json = data
        .and_then(|data| data.get(DATA_KEY))
        .ok_or(StorageError::NoData)?;
    serde_json::from_slice(&json.0)
        .map_err(|e| StorageError::NotJson(selkie_api::json::error_without_values(&e)))
}

/// When a storage Secret may be deleted, from its annotation. `None` when it has none or it does
/// not parse (such a Secret is not the garbage collector's to delete).
pub(crate) fn garbage_collect_after(secret: &Secret) -> Option<OffsetDateTime> {
    let value = secret.metadata.annotations.as_ref()?.get(GARBAGE_COLLECT_AFTER)?;
    OffsetDateTime::parse(value, &Rfc3339).ok()
}

/// Why a storage Secret cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The Secret's type is not this resource's.
    #[error("secret storage data has incorrect type: {found} must equal {expected}")]
    WrongType {
        /// The type found.
        found: String,
        /// The type expected.
        expected: String,
    },
    /// The Secret's type label is not this resource's.
    #[error("secret storage data has incorrect label: {0:?}")]
    WrongLabel(String),
    /// The Secret's storage version is not 1.
    #[error("secret storage data has incorrect version")]
    WrongVersion,
    /// The Secret has no stored data.
    #[error("secret storage data is missing")]
    NoData,
    /// The stored data is not JSON.
    #[error("secret storage data is not JSON: {0}")]
    NotJson(String),
}

/// RFC 4648 base32, lower-case, without padding.
fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in bytes {
        buffer = (buffer << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
        buffer &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_is_rfc4648_lower_case_without_padding() {
        // RFC 4648 §10 test vectors.
        for (input, expected) in [
            ("", ""),
            ("f", "my"),
            ("fo", "mzxq"),
            ("foo", "mzxw6"),
            ("foob", "mzxw6yq"),
            ("fooba", "mzxw6ytb"),
            ("foobar", "mzxw6ytboi"),
        ] {
            assert_eq!(base32_lower(input.as_bytes()), expected, "{input}");
        }
    }

    #[test]
    fn names_types_labels_and_annotations_are_pinnipeds() {
        // "Zm9vYmFy" is base64 of "foobar": the signature's bytes are decoded first.
        assert_eq!(
            Resource::AuthCode.secret_name("Zm9vYmFy"),
            "pinniped-storage-authcode-mzxw6ytboi"
        );
        assert_eq!(
            Resource::RefreshToken.secret_type(),
            "storage.pinniped.dev/refresh-token"
        );
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let labels = BTreeMap::from([("storage.pinniped.dev/request-id".to_string(), "r1".to_string())]);
        let data = serde_json::json!({"request": {"id": "r1"}});
        let secret =
            Resource::AccessToken.to_secret("Zm9vYmFy", &data, &labels, time::Duration::minutes(2), now);
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("pinniped-storage-access-token-mzxw6ytboi")
        );
        assert_eq!(secret.type_.as_deref(), Some("storage.pinniped.dev/access-token"));
        let stored_labels = secret.metadata.labels.clone().unwrap();
        assert_eq!(stored_labels[TYPE_LABEL], "access-token");
        assert_eq!(stored_labels["storage.pinniped.dev/request-id"], "r1");
        assert_eq!(
            secret.metadata.annotations.as_ref().unwrap()[GARBAGE_COLLECT_AFTER],
            "2027-01-15T08:02:00Z"
        );
        assert_eq!(
            garbage_collect_after(&secret),
            Some(now + time::Duration::minutes(2))
        );
        assert_eq!(Resource::AccessToken.read_secret(&secret).unwrap(), data);
    }

    #[test]
    fn foreign_or_damaged_secrets_are_refused_by_name() {
        let now = OffsetDateTime::now_utc();
        let secret = Resource::Pkce.to_secret(
            "sig",
            &serde_json::json!({}),
            &BTreeMap::new(),
            time::Duration::hours(1),
            now,
        );
        assert!(matches!(
            Resource::Oidc.read_secret(&secret),
            Err(StorageError::WrongType { .. })
        ));
        let mut relabelled = secret.clone();
        relabelled.metadata.labels = Some(BTreeMap::from([(TYPE_LABEL.to_string(), "oidc".to_string())]));
        assert_eq!(
            Resource::Pkce.read_secret(&relabelled),
            Err(StorageError::WrongLabel("oidc".into()))
        );
        let mut old = secret.clone();
        old.data
            .as_mut()
            .unwrap()
            .insert(VERSION_KEY.into(), ByteString(b"2".to_vec()));
        assert_eq!(Resource::Pkce.read_secret(&old), Err(StorageError::WrongVersion));
        let mut garbage = secret;
        garbage
            .data
            .as_mut()
            .unwrap()
            .insert(DATA_KEY.into(), ByteString(b"{\"token\": tru".to_vec()));
        let error = Resource::Pkce.read_secret(&garbage).unwrap_err();
        assert!(matches!(error, StorageError::NotJson(_)), "{error}");
    }
}
