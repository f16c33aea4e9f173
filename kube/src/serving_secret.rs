//! The aggregated API's serving certificate: a self-generated CA ("Selkie Aggregation CA") and a
//! certificate for `<name("api")>.<namespace>.svc` — the name kube-apiserver's aggregator verifies —
//! kept in the Secret `<name("api-tls-serving-certificate")>` with Pinniped's keys
//! (`caCertificate`, `tlsCertificateChain`, `tlsPrivateKey`).
//!
//! * Every replica watches the Secret and serves its certificate from the next handshake on
//!   ([`install`] into a [`ServingCert`]); a deleted or unreadable Secret leaves the current one
//!   in use.
//! * The leader ([`CertificateManager`]) creates the Secret when it is missing, replaces it 25 days
//!   after issuance (certificates live 30 days, as Pinniped's install configures), when it is
//!   unreadable, or when it names another Service; and keeps `spec.caBundle` of the existing
//!   APIServices equal to the Secret's `caCertificate` (it never creates an APIService).
//! * Rotation has an overlap: a new Secret's `caCertificate` holds the new CA followed by the
//!   previous, unexpired aggregation CAs, and the APIServices trust that bundle **before** the
//!   Secret is written, so kube-apiserver accepts both the old and the new certificate while the
//!   replicas switch (Pinniped's rotation has no overlap).

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use futures::StreamExt as _;
use k8s_openapi::{
    api::core::v1::Secret, kube_aggregator::pkg::apis::apiregistration::v1::APIService, ByteString,
};
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{watcher, WatchStreamExt as _},
    Api,
};
use tokio::sync::{watch, Notify};

use crate::{
    certs::{self, CertPair},
    serving::ServingCert,
};

/// The common name of the CA that signs the serving certificate (Pinniped: "Pinniped Aggregation
/// CA").
pub const CA_COMMON_NAME: &str = "Selkie Aggregation CA";
/// How long the CA and the serving certificate are valid (Pinniped's install: 30 days).
pub const CERTIFICATE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long after issuance they are replaced (Pinniped's install: 25 days).
pub const RENEW_AFTER: Duration = Duration::from_secs(25 * 24 * 3600);
/// The Secret key of the PEM CA bundle the APIServices trust.
pub const CA_CERTIFICATE_KEY: &str = "caCertificate";
/// The Secret key of the PEM serving certificate chain.
pub const TLS_CERTIFICATE_CHAIN_KEY: &str = "tlsCertificateChain";
/// The Secret key of the PEM (PKCS#8) serving key.
pub const TLS_PRIVATE_KEY_KEY: &str = "tlsPrivateKey";

/// How often the leader checks the Secret and the APIServices without being woken.
const RESYNC: Duration = Duration::from_secs(60);
/// The longest wait before retrying a failed sync.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// At most this many previous CAs stay in a new bundle.
const MAX_PREVIOUS_CAS: usize = 2;

/// What the Secret holds.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingMaterial {
    /// PEM bundle: the CA that signed `cert_pem`, then previous CAs still trusted.
    pub ca_bundle_pem: String,
    /// PEM serving certificate chain, leaf first.
    pub cert_pem: String,
    /// PEM PKCS#8 key of the leaf.
    pub key_pem: String,
}

impl std::fmt::Debug for ServingMaterial {
    // Key material never appears in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingMaterial").finish_non_exhaustive()
    }
}

/// One parsed certificate's facts.
struct Facts {
    common_name: Option<String>,
    dns_names: Vec<String>,
    not_before: SystemTime,
    not_after: SystemTime,
}

fn at(time: x509_parser::time::ASN1Time) -> SystemTime {
    let seconds = u64::try_from(time.timestamp()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
}

/// Every certificate of a PEM bundle, parsed; fails on the first unreadable one.
fn certificates(pem: &str) -> Result<Vec<(String, Facts)>, String> {
    let mut found = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block
            .parse_x509()
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        let dns_names = match cert.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_string()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let facts = Facts {
            common_name: cert
                .subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_string),
            dns_names,
            not_before: at(cert.validity().not_before),
            not_after: at(cert.validity().not_after),
        };
        let reencoded = pem_encode(&block.contents);
        found.push((reencoded, facts));
    }
    Ok(found)
}

fn pem_encode(der: &[u8]) -> String {
    let encoded = B64.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

impl ServingMaterial {
    /// Reads the Secret's three keys. Fails, naming the key, when one is missing or not UTF-8.
    pub fn from_secret(secret: &Secret) -> Result<Self, String> {
        let data = secret.data.as_ref();
        let read = |key: &str| -> Result<String, String> {
            let bytes = data
                .and_then(|data| data.get(key))
                .map(|value| value.0.clone())
                .or_else(|| {
                    secret
                        .string_data
                        .as_ref()
                        .and_then(|data| data.get(key))
                        .map(|value| value.clone().into_bytes())
                })
                .ok_or_else(|| format!("the Secret has no {key}"))?;
            String::from_utf8(bytes).map_err(|_| format!("{key} is not text"))
        };
        Ok(Self {
            ca_bundle_pem: read(CA_CERTIFICATE_KEY)?,
            cert_pem: read(TLS_CERTIFICATE_CHAIN_KEY)?,
            key_pem: read(TLS_PRIVATE_KEY_KEY)?,
        })
    }

    /// The Secret's `data`.
    pub fn secret_data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERTIFICATE_KEY, &self.ca_bundle_pem),
            (TLS_CERTIFICATE_CHAIN_KEY, &self.cert_pem),
            (TLS_PRIVATE_KEY_KEY, &self.key_pem),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), ByteString(value.clone().into_bytes())))
        .collect()
    }

    /// Why this material must be replaced at `now` to serve `service_name`, or `None` when it is
    /// good: unreadable, not for `service_name`, not yet valid, [`RENEW_AFTER`] old, expired, or
    /// without a CA bundle.
    pub fn renewal_reason(&self, service_name: &str, now: SystemTime) -> Option<String> {
        let leaf = match certificates(&self.cert_pem) {
            Ok(certificates) => match certificates.into_iter().next() {
                Some((_, facts)) => facts,
                None => return Some(format!("{TLS_CERTIFICATE_CHAIN_KEY} holds no certificate")),
            },
            Err(e) => return Some(format!("{TLS_CERTIFICATE_CHAIN_KEY}: {e}")),
        };
        match certificates(&self.ca_bundle_pem) {
            Ok(cas) if !cas.is_empty() => {}
            Ok(_) => return Some(format!("{CA_CERTIFICATE_KEY} holds no certificate")),
            Err(e) => return Some(format!("{CA_CERTIFICATE_KEY}: {e}")),
        }
        if !leaf.dns_names.iter().any(|name| name == service_name) {
            return Some(format!("the certificate is not for {service_name}"));
        }
        if now + certs::BACKDATE < leaf.not_before {
            return Some("the certificate is not valid yet".into());
        }
        if now >= leaf.not_after {
            return Some("the certificate has expired".into());
        }
        let age = now.duration_since(leaf.not_before).unwrap_or_default();
        if age >= RENEW_AFTER {
            return Some(format!(
                "the certificate was issued {} days ago",
                age.as_secs() / 86_400
            ));
        }
        None
    }

    /// Whether the serving certificate names `service_name` (what the aggregator verifies).
    pub fn is_for(&self, service_name: &str) -> bool {
        certificates(&self.cert_pem)
            .ok()
            .and_then(|certificates| certificates.into_iter().next())
            .is_some_and(|(_, leaf)| leaf.dns_names.iter().any(|name| name == service_name))
    }

    /// A new CA and serving certificate for `service_name`, valid for [`CERTIFICATE_LIFETIME`].
    /// The CA bundle also holds the aggregation CAs of `previous_bundles` that are still valid
    /// at `now` (at most two), so clients that trust them keep working during the switch.
    pub fn generate(
        service_name: &str,
        previous_bundles: &[&str],
        now: SystemTime,
    ) -> Result<Self, certs::CertError> {
        let ca = certs::generate_ca(CA_COMMON_NAME, CERTIFICATE_LIFETIME)?;
        let serving: CertPair = certs::issue_serving(&ca, &[service_name.to_string()], CERTIFICATE_LIFETIME)?;
        let mut bundle = vec![ca.cert_pem.clone()];
        let mut kept = 0;
        for previous in previous_bundles {
            // An unreadable previous bundle contributes nothing.
            for (pem, facts) in certificates(previous).unwrap_or_default() {
                let ours = facts.common_name.as_deref() == Some(CA_COMMON_NAME);
                if ours && now < facts.not_after && kept < MAX_PREVIOUS_CAS && !bundle.contains(&pem) {
                    bundle.push(pem);
                    kept += 1;
                }
            }
        }
        Ok(Self {
            ca_bundle_pem: bundle.concat(),
            cert_pem: serving.cert_pem,
            key_pem: serving.key_pem,
        })
    }
}

/// Serves `material` from the next handshake on. Returns whether it differs from what was
/// served; fails (and keeps the current certificate) when it is unusable or not for
/// `service_name` (kube-apiserver would refuse it; the leader replaces such a Secret).
pub fn install(
    serving: &ServingCert,
    material: &ServingMaterial,
    service_name: &str,
) -> Result<bool, String> {
    if !material.is_for(service_name) {
        return Err(format!("the certificate is not for {service_name}"));
    }
    serving
        .replace_pem(material.cert_pem.as_bytes(), material.key_pem.as_bytes())
        .map_err(|e| e.to_string())
}

/// Watches the Secret and installs each usable version for `service_name`; wakes `leader_wake` on every change
/// (a deleted Secret is the leader's to recreate). Runs until its task is dropped.
pub async fn watch_secret(
    secrets: Api<Secret>,
    name: String,
    service_name: String,
    serving: Arc<ServingCert>,
    leader_wake: Arc<Notify>,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(secrets, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => {
                match ServingMaterial::from_secret(&secret)
                    .and_then(|material| install(&serving, &material, &service_name))
                {
                    Ok(true) => {
                        tracing::info!(secret = %name, "serving the aggregated API's new certificate")
                    }
                    Ok(false) => {}
                    Err(error) => tracing::warn!(
                        secret = %name,
                        %error,
                        "the aggregated API's serving certificate Secret is unusable; the current certificate stays"
                    ),
                }
                leader_wake.notify_one();
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::info!(secret = %name, "the aggregated API's serving certificate Secret was deleted");
                leader_wake.notify_one();
            }
            Ok(watcher::Event::InitDone) => leader_wake.notify_one(),
            Ok(watcher::Event::Init) => {}
            Err(error) => tracing::warn!(%error, secret = %name, "watching the serving certificate Secret"),
        }
    }
}

/// Wakes `leader_wake` when one of `names` (APIServices) changes, so a caBundle reset by a
/// re-applied manifest is repaired at once. Runs until its task is dropped.
pub async fn watch_api_services(api: Api<APIService>, names: Vec<String>, leader_wake: Arc<Notify>) {
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(
                watcher::Event::Apply(service)
                | watcher::Event::Delete(service)
                | watcher::Event::InitApply(service),
            ) if names
                .iter()
                .any(|name| Some(name) == service.metadata.name.as_ref()) =>
            {
                leader_wake.notify_one();
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "watching APIServices"),
        }
    }
}

/// The leader's side: creates, renews and publishes the serving certificate. See the module
/// documentation.
#[derive(Clone)]
pub struct CertificateManager {
    /// Secrets of the Concierge's namespace.
    pub secrets: Api<Secret>,
    /// All APIServices.
    pub api_services: Api<APIService>,
    /// The Secret's name.
    pub secret_name: String,
    /// The name the certificate is for, `<service>.<namespace>.svc`.
    pub service_name: String,
    /// The APIServices whose caBundle follows the Secret.
    pub api_service_names: Vec<String>,
}

impl std::fmt::Debug for CertificateManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateManager")
            .field("secret_name", &self.secret_name)
            .field("service_name", &self.service_name)
            .field("api_service_names", &self.api_service_names)
            .finish_non_exhaustive()
    }
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// kube-apiserver refused or could not be reached.
    #[error("{what}: {error}")]
    Kube {
        /// What was being done.
        what: String,
        /// The error.
        error: kube::Error,
    },
    /// Generating the certificate failed.
    #[error(transparent)]
    Generate(#[from] certs::CertError),
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SyncError {
    let what = what.into();
    move |error| SyncError::Kube { what, error }
}

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// The Secret was good; this many APIServices got the bundle.
    Kept {
        /// APIServices patched.
        patched: usize,
    },
    /// A new certificate was written, for this reason.
    Renewed(String),
}

impl CertificateManager {
    /// One pass: renew the Secret if needed (trusting the new CA first), then make the
    /// APIServices' caBundle equal to the Secret's bundle.
    pub async fn sync(&self, now: SystemTime) -> Result<Synced, SyncError> {
        let existing = self
            .secrets
            .get_opt(&self.secret_name)
            .await
            .map_err(kube_error(format!("reading Secret {}", self.secret_name)))?;
        let material = existing.as_ref().map(ServingMaterial::from_secret);
        let reason = match &material {
            None => Some("the Secret does not exist".to_string()),
            Some(Err(error)) => Some(error.clone()),
            Some(Ok(material)) => material.renewal_reason(&self.service_name, now),
        };
        let Some(reason) = reason else {
            let bundle = material
                .and_then(Result::ok)
                .map(|m| m.ca_bundle_pem)
                .unwrap_or_default();
            let patched = self.publish_ca_bundle(&bundle).await?;
            return Ok(Synced::Kept { patched });
        };

        let mut previous = Vec::new();
        if let Some(Ok(material)) = &material {
            previous.push(material.ca_bundle_pem.clone());
        }
        previous.extend(self.current_ca_bundles().await?);
        let previous: Vec<&str> = previous.iter().map(String::as_str).collect();
        let fresh = ServingMaterial::generate(&self.service_name, &previous, now)?;
        // Trust first, serve second: kube-apiserver accepts both certificates during the switch.
        self.publish_ca_bundle(&fresh.ca_bundle_pem).await?;
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.secret_name.clone()),
                ..ObjectMeta::default()
            },
            data: Some(fresh.secret_data()),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        match existing {
            Some(existing) => {
                secret.metadata = existing.metadata;
                self.secrets
                    .replace(&self.secret_name, &PostParams::default(), &secret)
                    .await
                    .map_err(kube_error(format!("replacing Secret {}", self.secret_name)))?;
            }
            None => {
                self.secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(kube_error(format!("creating Secret {}", self.secret_name)))?;
            }
        }
        tracing::info!(
            secret = %self.secret_name,
            %reason,
            "issued a new serving certificate for the aggregated API"
        );
        Ok(Synced::Renewed(reason))
    }

    /// The caBundles the existing APIServices hold now, decoded.
    async fn current_ca_bundles(&self) -> Result<Vec<String>, SyncError> {
        let mut bundles = Vec::new();
        for name in &self.api_service_names {
            let service = self
                .api_services
                .get_opt(name)
                .await
                .map_err(kube_error(format!("reading APIService {name}")))?;
            if let Some(bundle) = service.and_then(|s| s.spec).and_then(|spec| spec.ca_bundle) {
                bundles.push(String::from_utf8_lossy(&bundle.0).into_owned());
            }
        }
        Ok(bundles)
    }

    /// Sets `spec.caBundle` of each existing APIService to `bundle` where it differs; returns how
    /// many were patched. A missing APIService is skipped: the install manifests create them.
    async fn publish_ca_bundle(&self, bundle: &str) -> Result<usize, SyncError> {
        let mut patched = 0;
        for name in &self.api_service_names {
            let Some(service) = self
                .api_services
                .get_opt(name)
                .await
                .map_err(kube_error(format!("reading APIService {name}")))?
            else {
                tracing::debug!(api_service = %name, "no such APIService; its caBundle is not managed");
                continue;
            };
            let current = service.spec.and_then(|spec| spec.ca_bundle).map(|b| b.0);
            if current.as_deref() == Some(bundle.as_bytes()) {
                continue;
            }
            let patch = serde_json::json!({"spec": {"caBundle": B64.encode(bundle)}});
            self.api_services
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kube_error(format!("updating the caBundle of APIService {name}")))?;
            tracing::info!(api_service = %name, "updated the APIService's caBundle");
            patched += 1;
        }
        Ok(patched)
    }

    /// Syncs whenever this replica is the leader and is woken (or every minute), retrying
    /// failures with a backoff up to 30 s. Returns when the leader channel closes.
    pub async fn run(self, mut leader: watch::Receiver<bool>, wake: Arc<Notify>) {
        let mut backoff = Duration::from_millis(500);
        loop {
            while !*leader.borrow_and_update() {
                if leader.changed().await.is_err() {
                    return;
                }
            }
            let delay = match self.sync(SystemTime::now()).await {
                Ok(_) => {
                    backoff = Duration::from_millis(500);
                    RESYNC
                }
                Err(error) => {
                    tracing::warn!(%error, "managing the aggregated API's serving certificate");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    backoff
                }
            };
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(delay) => {}
                changed = leader.changed() => if changed.is_err() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: &str = "pinniped-concierge-api.pinniped-concierge.svc";
    const DAY: Duration = Duration::from_secs(86_400);

    fn load(
        material: &ServingMaterial,
    ) -> Result<rustls::sign::CertifiedKey, crate::serving::ServingCertError> {
        ServingCert::load(material.cert_pem.as_bytes(), material.key_pem.as_bytes())
    }

    #[test]
    fn a_generated_certificate_serves_its_service_and_is_renewed_after_25_days() {
        let now = SystemTime::now();
        let material = ServingMaterial::generate(SERVICE, &[], now).unwrap();
        load(&material).unwrap();
        let cas = certificates(&material.ca_bundle_pem).unwrap();
        assert_eq!(cas.len(), 1);
        assert_eq!(cas[0].1.common_name.as_deref(), Some(CA_COMMON_NAME));
        let leaf = certificates(&material.cert_pem).unwrap().remove(0).1;
        assert_eq!(leaf.dns_names, [SERVICE]);
        let lifetime = leaf.not_after.duration_since(now).unwrap();
        assert!(lifetime > 29 * DAY && lifetime <= 30 * DAY, "{lifetime:?}");

        assert_eq!(material.renewal_reason(SERVICE, now), None);
        assert_eq!(material.renewal_reason(SERVICE, now + 24 * DAY), None);
        let reason = material.renewal_reason(SERVICE, now + 25 * DAY).unwrap();
        assert!(reason.contains("issued 25 days ago"), "{reason}");
        assert!(material
            .renewal_reason(SERVICE, now + 31 * DAY)
            .unwrap()
            .contains("expired"));
        let reason = material.renewal_reason("other.ns.svc", now).unwrap();
        assert!(reason.contains("not for other.ns.svc"), "{reason}");
    }

    #[test]
    fn a_new_bundle_keeps_previous_unexpired_aggregation_cas_only() {
        let now = SystemTime::now();
        let first = ServingMaterial::generate(SERVICE, &[], now).unwrap();
        let foreign = certs::generate_ca("Someone Else's CA", DAY).unwrap();
        let second = ServingMaterial::generate(
            SERVICE,
            &[&first.ca_bundle_pem, &foreign.cert_pem, "garbage"],
            now,
        )
        .unwrap();
        let cas = certificates(&second.ca_bundle_pem).unwrap();
        assert_eq!(cas.len(), 2, "the new CA and the previous one");
        assert!(second.ca_bundle_pem.ends_with(&first.ca_bundle_pem));
        assert_ne!(cas[0].0, cas[1].0);

        // Generations later, and past the old CA's expiry, only the newest remain.
        let third = ServingMaterial::generate(SERVICE, &[&second.ca_bundle_pem], now).unwrap();
        assert_eq!(certificates(&third.ca_bundle_pem).unwrap().len(), 3);
        let fourth = ServingMaterial::generate(SERVICE, &[&third.ca_bundle_pem], now + 31 * DAY).unwrap();
        assert_eq!(certificates(&fourth.ca_bundle_pem).unwrap().len(), 1);
    }

    #[test]
    fn the_secret_round_trips_and_bad_secrets_are_refused() {
        let material = ServingMaterial::generate(SERVICE, &[], SystemTime::now()).unwrap();
        let secret = Secret {
            data: Some(material.secret_data()),
            ..Secret::default()
        };
        assert_eq!(ServingMaterial::from_secret(&secret).unwrap(), material);
        let error = ServingMaterial::from_secret(&Secret::default()).unwrap_err();
        assert!(error.contains(CA_CERTIFICATE_KEY), "{error}");

        let other = ServingMaterial::generate(SERVICE, &[], SystemTime::now()).unwrap();
        let mismatched = ServingMaterial {
            key_pem: other.key_pem,
            ..material.clone()
        };
        assert!(load(&mismatched).is_err());
        let serving = ServingCert::disabled();
        assert!(!serving.is_enabled());
        assert!(install(&serving, &mismatched, SERVICE).is_err());
        assert!(!serving.is_enabled());
        assert!(install(&serving, &material, SERVICE).unwrap());
        assert!(!install(&serving, &material, SERVICE).unwrap(), "unchanged");
        assert!(serving.is_enabled());
        let elsewhere = ServingMaterial::generate("other.ns.svc", &[], SystemTime::now()).unwrap();
        assert!(!elsewhere.is_for(SERVICE));
        let refused = install(&serving, &elsewhere, SERVICE).unwrap_err();
        assert!(refused.contains("not for"), "{refused}");
        let garbage = ServingMaterial {
            cert_pem: "garbage".into(),
            ..material
        };
        assert!(garbage.renewal_reason(SERVICE, SystemTime::now()).is_some());
    }
}
