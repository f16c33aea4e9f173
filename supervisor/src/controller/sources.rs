//! What every reconciler of the controller reads besides its own objects — the watched Secrets and
//! ConfigMaps of the Supervisor's namespace — and the pieces they share: the typed error every
//! reconcile fails with, the typed form of a watched object, the credentials Secrets in Pinniped's
//! words, and which Secret or ConfigMap an object names.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    api::DynamicObject,
    runtime::reflector::{ObjectRef, Store},
    ResourceExt as _,
};
use selkie_kube::{
    conditions::Check,
    reconcile::{SourceEvent, SourceKind},
    serving::ServingCert,
    tls_spec::CaSources,
};
use serde_json::Value;

/// Why one reconcile failed; see [`selkie_kube::reconcile`] for what follows.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    /// The object does not parse as its kind (the CRD's schema normally prevents this): nothing
    /// is tried again until it changes.
    #[error("the object cannot be read: {0}")]
    Spec(String),
    /// A server it needs did not answer or refused (recorded in the status): tried again with
    /// backoff.
    #[error("{0}")]
    Unavailable(String),
    /// A write to kube-apiserver (a status, a generated key) failed: tried again with backoff.
    #[error("writing to kube-apiserver failed: {0}")]
    Write(#[source] kube::Error),
}

/// The watched Secrets and ConfigMaps of the Supervisor's namespace.
#[derive(Clone)]
pub(crate) struct Sources {
    pub(crate) namespace: String,
    pub(crate) secrets: Store<Secret>,
    pub(crate) config_maps: Store<ConfigMap>,
}

impl CaSources for Sources {
    fn secret(&self, name: &str) -> Option<Arc<Secret>> {
        self.secrets.get(&ObjectRef::new(name).within(&self.namespace))
    }

    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
        self.config_maps
            .get(&ObjectRef::new(name).within(&self.namespace))
    }
}

impl Sources {
    /// Waits until both caches have been listed once (before that a named Secret would be
    /// reported missing).
    pub(crate) async fn ready(&self) {
        let _ = self.secrets.wait_until_ready().await;
        let _ = self.config_maps.wait_until_ready().await;
    }
}

/// `object` as its typed form `K`, or [`ReconcileError::Spec`] naming what does not parse (never
/// a value).
pub(crate) fn typed<K: serde::de::DeserializeOwned>(object: &DynamicObject) -> Result<K, ReconcileError> {
    let value = serde_json::to_value(object).map_err(|e| ReconcileError::Spec(e.to_string()))?;
    serde_json::from_value(value)
        .map_err(|error| ReconcileError::Spec(selkie_api::json::error_without_values(&error)))
}

/// Whether `object` names the source of `event` at one of `secret_names` (JSON pointers to a
/// Secret's name) or in a `certificateAuthorityDataSource` under one of `tls_specs` (JSON
/// pointers to a `tls` spec). [`SourceEvent::All`] concerns every object that names any.
pub(crate) fn names_source(
    object: &DynamicObject,
    event: &SourceEvent,
    secret_names: &[&str],
    tls_specs: &[&str],
) -> bool {
    let named_secrets = secret_names
        .iter()
        .filter_map(|pointer| object.data.pointer(pointer).and_then(Value::as_str))
        .map(|name| (SourceKind::Secret, name));
    let ca_sources = tls_specs.iter().filter_map(|pointer| {
        let source = object
            .data
            .pointer(&format!("{pointer}/certificateAuthorityDataSource"))?;
        let kind = match source.get("kind").and_then(Value::as_str)? {
            "Secret" => SourceKind::Secret,
            "ConfigMap" => SourceKind::ConfigMap,
            _ => return None,
        };
        Some((kind, source.get("name").and_then(Value::as_str)?))
    });
    let mut named = named_secrets.chain(ca_sources);
    match event {
        SourceEvent::All => named.next().is_some(),
        SourceEvent::Changed(kind, name) => named.any(|(k, n)| k == *kind && n == name),
    }
}

/// The two non-empty text values `keys` of the Secret `name`, which must be of type
/// `secret_type`, and its resourceVersion; or the failed `condition` as Pinniped words it
/// (`SecretNotFound`, `SecretWrongType`, `SecretMissingKeys`).
pub(crate) fn secret_pair(
    sources: &Sources,
    condition: &'static str,
    name: &str,
    secret_type: &str,
    keys: [&str; 2],
) -> Result<(String, String, String), Check> {
    let Some(secret) = sources.secret(name) else {
        return Err(Check::failure(
            condition,
            "SecretNotFound",
            format!("secret \"{name}\" not found"),
        ));
    };
    if secret.type_.as_deref() != Some(secret_type) {
        return Err(Check::failure(
            condition,
            "SecretWrongType",
            format!(
                "referenced Secret \"{name}\" has wrong type \"{}\" (should be \"{secret_type}\")",
                secret.type_.clone().unwrap_or_default()
            ),
        ));
    }
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .and_then(|bytes| String::from_utf8(bytes.0.clone()).ok())
            .filter(|value| !value.is_empty())
    };
    match (value(keys[0]), value(keys[1])) {
        (Some(first), Some(second)) => Ok((
            first,
            second,
            secret.metadata.resource_version.clone().unwrap_or_default(),
        )),
        _ => Err(Check::failure(
            condition,
            "SecretMissingKeys",
            format!(
                "referenced Secret \"{name}\" is missing required keys [\"{}\" \"{}\"]",
                keys[0], keys[1]
            ),
        )),
    }
}

/// A short, non-reversible mark of a secret value, to notice when it changes.
pub(crate) fn secret_fingerprint(secret: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `tls.crt` and `tls.key` of a TLS Secret (empty when absent).
pub(crate) fn tls_pair(secret: &Secret) -> (Vec<u8>, Vec<u8>) {
    let get = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|bytes| bytes.0.clone())
            .unwrap_or_default()
    };
    (get("tls.crt"), get("tls.key"))
}

/// The certificate and key of a TLS Secret, when they load.
pub(crate) fn serving_key(secret: &Secret) -> Option<rustls::sign::CertifiedKey> {
    let (cert, key) = tls_pair(secret);
    ServingCert::load(&cert, &key).ok()
}

/// Whether the object `name` with UID `uid` is still in `store` (a reconcile that took long —
/// a probe — must not serve an object deleted meanwhile).
pub(crate) fn still_there(store: &Store<DynamicObject>, object: &DynamicObject) -> bool {
    let namespace = object.namespace().unwrap_or_default();
    store.state().iter().any(|current| {
        current.name_any() == object.name_any()
            && current.namespace().unwrap_or_default() == namespace
            && current.metadata.uid == object.metadata.uid
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_are_related_to_the_secrets_and_config_maps_they_name() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "idp.supervisor.pinniped.dev/v1alpha1",
            "kind": "OIDCIdentityProvider",
            "metadata": {"name": "dex", "namespace": "ns"},
            "spec": {
                "issuer": "https://dex",
                "client": {"secretName": "dex-client"},
                "tls": {"certificateAuthorityDataSource": {"kind": "ConfigMap", "name": "ca", "key": "ca.crt"}},
            },
        }))
        .unwrap();
        let related =
            |event: &SourceEvent| names_source(&object, event, &["/spec/client/secretName"], &["/spec/tls"]);
        assert!(related(&SourceEvent::Changed(
            SourceKind::Secret,
            "dex-client".into()
        )));
        assert!(related(&SourceEvent::Changed(SourceKind::ConfigMap, "ca".into())));
        assert!(!related(&SourceEvent::Changed(SourceKind::Secret, "ca".into())));
        assert!(!related(&SourceEvent::Changed(
            SourceKind::ConfigMap,
            "dex-client".into()
        )));
        assert!(related(&SourceEvent::All));
        assert!(!names_source(
            &object,
            &SourceEvent::All,
            &["/spec/bind/secretName"],
            &[]
        ));
    }
}
