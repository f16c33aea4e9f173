//! `spec.tls` → the CA bundle an outbound connection trusts (a Concierge authenticator's issuer or
//! webhook, a Supervisor identity provider), and its `TLSConfigurationValid` condition, with
//! Pinniped's messages (`tlsconfigutil`): inline base64 `certificateAuthorityData`, or a
//! `certificateAuthorityDataSource` naming a Secret (type `kubernetes.io/tls` or `Opaque`) or a
//! ConfigMap in the object's namespace, read from the caller's watched caches.

use std::sync::Arc;

use base64::{engine::general_purpose::STANDARD, Engine as _};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use rustls_pki_types::{pem::PemObject, CertificateDer};
use selkie_api::common::{CertificateAuthorityDataSourceKind, TLSSpec};

use crate::conditions::{Check, REASON_INVALID_TLS_CONFIG, TYPE_TLS_CONFIGURATION_VALID};

/// Where `certificateAuthorityDataSource` objects are looked up (the watched caches, or a map in
/// unit tests).
pub trait CaSources {
    /// The Secret `name` in the object's namespace, if it exists.
    fn secret(&self, name: &str) -> Option<Arc<Secret>>;
    /// The ConfigMap `name` in the object's namespace, if it exists.
    fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>>;
}

/// What `spec.tls` amounts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOutcome {
    /// The `TLSConfigurationValid` condition.
    pub check: Check,
    /// The PEM bundle to trust (only the certificates that parse, re-encoded); `None` for the
    /// system roots or when the configuration is invalid.
    pub ca_bundle_pem: Option<String>,
}

impl TlsOutcome {
    /// Whether the TLS configuration is usable.
    pub fn ok(&self) -> bool {
        self.check.is_true()
    }
}

const NOT_PEM_HINT: &str = "(PEM certificates must begin with \"-----BEGIN CERTIFICATE-----\")";

/// Validates `tls` (the `spec.tls` of an object in `namespace`).
pub fn validate(tls: Option<&TLSSpec>, namespace: &str, sources: &impl CaSources) -> TlsOutcome {
    match bundle(tls, namespace, sources) {
        Ok(None) => TlsOutcome {
            check: Check::success(
                TYPE_TLS_CONFIGURATION_VALID,
                "spec.tls is valid: no TLS configuration provided: using default root CA bundle from container image",
            ),
            ca_bundle_pem: None,
        },
        Ok(Some(pem)) => TlsOutcome {
            check: Check::success(
                TYPE_TLS_CONFIGURATION_VALID,
                "spec.tls is valid: using configured CA bundle",
            ),
            ca_bundle_pem: Some(pem),
        },
        Err(message) => TlsOutcome {
            check: Check::failure(TYPE_TLS_CONFIGURATION_VALID, REASON_INVALID_TLS_CONFIG, message),
            ca_bundle_pem: None,
        },
    }
}

/// [`validate`] for an object whose TLS settings are at `field` (e.g. `spec.githubAPI.tls`), which
/// the condition's message names instead of `spec.tls`.
pub fn validate_at(
    tls: Option<&TLSSpec>,
    field: &str,
    namespace: &str,
    sources: &impl CaSources,
) -> TlsOutcome {
    let mut outcome = validate(tls, namespace, sources);
    outcome.check.message = outcome.check.message.replace("spec.tls", field);
    outcome
}

/// The normalised PEM bundle, `None` for "use the system roots", or the condition's message.
fn bundle(
    tls: Option<&TLSSpec>,
    namespace: &str,
    sources: &impl CaSources,
) -> Result<Option<String>, String> {
    let Some(tls) = tls else {
        return Ok(None);
    };
    let inline = tls.certificate_authority_data.as_deref().unwrap_or_default();
    if let Some(source) = &tls.certificate_authority_data_source {
        if !inline.is_empty() {
            return Err(
                "spec.tls is invalid: both tls.certificateAuthorityDataSource and tls.certificateAuthorityData provided"
                    .into(),
            );
        }
        let field = "spec.tls.certificateAuthorityDataSource";
        let namespaced = format!("{namespace}/{}", source.name);
        let (kind, bytes) = match source.kind {
            CertificateAuthorityDataSourceKind::Secret => {
                let secret = sources.secret(&source.name).ok_or_else(|| {
                    format!(
                        "{field} is invalid: failed to get secret {namespaced:?}: secret {:?} not found",
                        source.name
                    )
                })?;
                let type_ = secret.type_.as_deref().unwrap_or("Opaque");
                if type_ != "Opaque" && type_ != "kubernetes.io/tls" {
                    return Err(format!(
                        "{field} is invalid: secret {namespaced:?} of type {type_:?} cannot be used as a certificate authority data source"
                    ));
                }
                let value = secret
                    .data
                    .as_ref()
                    .and_then(|data| data.get(&source.key))
                    .ok_or_else(|| {
                        format!(
                            "{field} is invalid: key {:?} not found in secret {namespaced:?}",
                            source.key
                        )
                    })?;
                ("secret", value.0.clone())
            }
            CertificateAuthorityDataSourceKind::ConfigMap => {
                let config_map = sources.config_map(&source.name).ok_or_else(|| {
                    format!(
                        "{field} is invalid: failed to get configmap {namespaced:?}: configmap {:?} not found",
                        source.name
                    )
                })?;
                let value = config_map
                    .data
                    .as_ref()
                    .and_then(|data| data.get(&source.key))
                    .ok_or_else(|| {
                        format!(
                            "{field} is invalid: key {:?} not found in configmap {namespaced:?}",
                            source.key
                        )
                    })?;
                ("configmap", value.clone().into_bytes())
            }
        };
        if bytes.is_empty() {
            return Err(format!(
                "{field} is invalid: key {:?} has empty value in {kind} {namespaced:?}",
                source.key
            ));
        }
        return certificates_pem(&bytes).map(Some).ok_or_else(|| {
            format!(
                "{field} is invalid: key {:?} with {} bytes of data in {kind} {namespaced:?} is not a PEM-encoded certificate {NOT_PEM_HINT}",
                source.key,
                bytes.len()
            )
        });
    }
    if inline.is_empty() {
        return Ok(None);
    }
    let field = "spec.tls.certificateAuthorityData";
    // Go's decoder skips line breaks; so does this one.
    let compact: String = inline.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    let decoded = STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| format!("{field} is invalid: {}", base64_error(&e, compact.len())))?;
    certificates_pem(&decoded).map(Some).ok_or_else(|| {
        format!(
            "{field} is invalid: no base64-encoded PEM certificates found in {} bytes of data {NOT_PEM_HINT}",
            inline.len()
        )
    })
}

/// Go's wording for a base64 error: `illegal base64 data at input byte N`.
fn base64_error(error: &base64::DecodeError, length: usize) -> String {
    let offset = match error {
        base64::DecodeError::InvalidByte(offset, _) | base64::DecodeError::InvalidLastSymbol(offset, _) => {
            *offset
        }
        base64::DecodeError::InvalidLength(_) | base64::DecodeError::InvalidPadding => length,
    };
    format!("illegal base64 data at input byte {offset}")
}

/// The X.509 certificates of a PEM bundle, re-encoded as PEM; blocks that are not certificates
/// or do not parse are skipped (like Go's `AppendCertsFromPEM`). `None` when none is left.
pub fn certificates_pem(bundle: &[u8]) -> Option<String> {
    let mut pem = String::new();
    for der in CertificateDer::pem_slice_iter(bundle).take(10_000).flatten() {
        if x509_parser::parse_x509_certificate(der.as_ref()).is_err() {
            continue;
        }
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let encoded = STANDARD.encode(der.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    (!pem.is_empty()).then_some(pem)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::ObjectMeta, ByteString};
    use selkie_api::common::CertificateAuthorityDataSourceSpec;

    use super::*;

    #[derive(Default)]
    struct Sources {
        secrets: BTreeMap<String, Arc<Secret>>,
        config_maps: BTreeMap<String, Arc<ConfigMap>>,
    }

    impl CaSources for Sources {
        fn secret(&self, name: &str) -> Option<Arc<Secret>> {
            self.secrets.get(name).cloned()
        }
        fn config_map(&self, name: &str) -> Option<Arc<ConfigMap>> {
            self.config_maps.get(name).cloned()
        }
    }

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn secret(type_: &str, key: &str, value: &[u8]) -> Arc<Secret> {
        Arc::new(Secret {
            metadata: ObjectMeta::default(),
            type_: Some(type_.into()),
            data: Some([(key.to_string(), ByteString(value.to_vec()))].into()),
            ..Secret::default()
        })
    }

    fn from_source(kind: CertificateAuthorityDataSourceKind, name: &str, key: &str) -> TLSSpec {
        TLSSpec {
            certificate_authority_data: None,
            certificate_authority_data_source: Some(CertificateAuthorityDataSourceSpec {
                kind,
                name: name.into(),
                key: key.into(),
            }),
        }
    }

    fn inline(data: &str) -> TLSSpec {
        TLSSpec {
            certificate_authority_data: Some(data.into()),
            certificate_authority_data_source: None,
        }
    }

    #[test]
    fn no_tls_or_empty_data_means_the_system_roots() {
        let sources = Sources::default();
        for tls in [None, Some(TLSSpec::default()), Some(inline(""))] {
            let outcome = validate(tls.as_ref(), "ns", &sources);
            assert!(outcome.ok());
            assert_eq!(outcome.ca_bundle_pem, None);
            assert_eq!(
                outcome.check.message,
                "spec.tls is valid: no TLS configuration provided: using default root CA bundle from container image"
            );
        }
    }

    #[test]
    fn inline_data_and_both_sources_of_data() {
        let sources = Sources::default();
        let pem = ca_pem();
        let outcome = validate(Some(&inline(&STANDARD.encode(&pem))), "ns", &sources);
        assert!(outcome.ok(), "{outcome:?}");
        assert_eq!(
            outcome.check.message,
            "spec.tls is valid: using configured CA bundle"
        );
        assert_eq!(
            outcome.ca_bundle_pem.as_deref(),
            Some(pem.as_str()),
            "re-encoded identically"
        );

        let outcome = validate(Some(&inline("!!!not base64")), "ns", &sources);
        assert!(!outcome.ok());
        assert_eq!(outcome.check.reason, "InvalidTLSConfig");
        assert_eq!(
            outcome.check.message,
            "spec.tls.certificateAuthorityData is invalid: illegal base64 data at input byte 0"
        );

        let outcome = validate(Some(&inline(&STANDARD.encode("hello"))), "ns", &sources);
        assert_eq!(
            outcome.check.message,
            "spec.tls.certificateAuthorityData is invalid: no base64-encoded PEM certificates found in 8 bytes of data (PEM certificates must begin with \"-----BEGIN CERTIFICATE-----\")"
        );

        let mut both = from_source(CertificateAuthorityDataSourceKind::Secret, "s", "ca.crt");
        both.certificate_authority_data = Some(STANDARD.encode(&pem));
        let outcome = validate(Some(&both), "ns", &sources);
        assert_eq!(
            outcome.check.message,
            "spec.tls is invalid: both tls.certificateAuthorityDataSource and tls.certificateAuthorityData provided"
        );
    }

    #[test]
    fn secrets_and_config_maps() {
        let pem = ca_pem();
        let mut sources = Sources::default();
        sources.secrets.insert(
            "tls".into(),
            secret("kubernetes.io/tls", "ca.crt", pem.as_bytes()),
        );
        sources
            .secrets
            .insert("opaque".into(), secret("Opaque", "bundle", pem.as_bytes()));
        sources.secrets.insert(
            "docker".into(),
            secret("kubernetes.io/dockerconfigjson", "ca.crt", pem.as_bytes()),
        );
        sources
            .secrets
            .insert("empty".into(), secret("Opaque", "ca.crt", b""));
        sources
            .secrets
            .insert("garbage".into(), secret("Opaque", "ca.crt", b"hello"));
        sources.config_maps.insert(
            "cm".into(),
            Arc::new(ConfigMap {
                data: Some([("ca.crt".to_string(), pem.clone())].into()),
                ..ConfigMap::default()
            }),
        );
        use CertificateAuthorityDataSourceKind::{ConfigMap as Cm, Secret as S};
        let check =
            |kind, name: &str, key: &str| validate(Some(&from_source(kind, name, key)), "ns", &sources);

        for (kind, name, key) in [
            (S, "tls", "ca.crt"),
            (S, "opaque", "bundle"),
            (Cm, "cm", "ca.crt"),
        ] {
            let outcome = check(kind, name, key);
            assert!(outcome.ok(), "{name}: {outcome:?}");
            assert_eq!(outcome.ca_bundle_pem.as_deref(), Some(pem.as_str()));
        }
        let field = "spec.tls.certificateAuthorityDataSource is invalid";
        for (kind, name, key, message) in [
            (
                S,
                "missing",
                "ca.crt",
                format!(r#"{field}: failed to get secret "ns/missing": secret "missing" not found"#),
            ),
            (
                Cm,
                "missing",
                "ca.crt",
                format!(r#"{field}: failed to get configmap "ns/missing": configmap "missing" not found"#),
            ),
            (
                S,
                "docker",
                "ca.crt",
                format!(
                    r#"{field}: secret "ns/docker" of type "kubernetes.io/dockerconfigjson" cannot be used as a certificate authority data source"#
                ),
            ),
            (
                S,
                "tls",
                "other",
                format!(r#"{field}: key "other" not found in secret "ns/tls""#),
            ),
            (
                Cm,
                "cm",
                "other",
                format!(r#"{field}: key "other" not found in configmap "ns/cm""#),
            ),
            (
                S,
                "empty",
                "ca.crt",
                format!(r#"{field}: key "ca.crt" has empty value in secret "ns/empty""#),
            ),
            (
                S,
                "garbage",
                "ca.crt",
                format!(
                    r#"{field}: key "ca.crt" with 5 bytes of data in secret "ns/garbage" is not a PEM-encoded certificate (PEM certificates must begin with "-----BEGIN CERTIFICATE-----")"#
                ),
            ),
        ] {
            let outcome = check(kind, name, key);
            assert!(!outcome.ok());
            assert_eq!(outcome.check.reason, "InvalidTLSConfig");
            assert_eq!(outcome.check.message, message);
            assert_eq!(outcome.ca_bundle_pem, None);
        }
    }

    #[test]
    fn only_parsable_certificates_are_kept() {
        let pem = ca_pem();
        let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let mixed = format!("{broken}{pem}");
        assert_eq!(certificates_pem(mixed.as_bytes()).as_deref(), Some(pem.as_str()));
        assert_eq!(certificates_pem(broken.as_bytes()), None);
    }
}
