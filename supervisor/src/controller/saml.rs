//! The SAMLIdentityProvider reconciler (Selkie's own kind): its conditions
//! (`TLSConfigurationValid`, `MetadataValid`, `AllowedClockSkewValid`, then `Ready`) and, when
//! they hold, the upstream logins use. The metadata is read from `spec.idp.metadata`, or fetched
//! from `spec.idp.metadataURL` at every check (on every change of the object or of what it names,
//! and every five minutes), so an identity provider's new signing certificate is picked up; a
//! fetch that fails is retried with backoff while the last working form keeps serving.

use std::{sync::Arc, time::Duration};

use selkie_api::supervisor_saml::{
    Phase, SAMLIdentityProvider, SAMLIdentityProviderStatus, DEFAULT_CLOCK_SKEW,
};
use selkie_kube::{
    conditions::{self, Check},
    tls_spec,
};
use selkie_oidc::https::{HttpsClient, TlsOptions};

use crate::controller::identity_provider::{Evaluation, Interim, Provider};
use crate::controller::sources::Sources;
use crate::idp::saml::IdpMetadata;
use crate::idp::{SamlUpstream, Upstream};

/// The kind's name.
pub(crate) const KIND: &str = "SAMLIdentityProvider";
/// The bound of one metadata fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// The most metadata read from `metadataURL`.
const METADATA_LIMIT: usize = 1 << 20;
/// The most clock skew `spec.allowedClockSkew` may allow (the CRD's rule says the same).
const MOST_CLOCK_SKEW: time::Duration = time::Duration::minutes(5);
const METADATA: &str = "MetadataValid";
const CLOCK_SKEW: &str = "AllowedClockSkewValid";

/// What was built for one object: the settings and the upstream serving them.
#[derive(Clone)]
pub(crate) struct Built {
    upstream: Arc<Upstream>,
}

/// The SAMLIdentityProvider kind (see the module documentation).
pub(crate) struct SamlProvider;

impl Provider for SamlProvider {
    const KIND: &'static str = KIND;
    const SECRET_NAMES: &'static [&'static str] = &[];
    const TLS_SPECS: &'static [&'static str] = &["/spec/idp/tls"];
    type Object = SAMLIdentityProvider;
    type Built = Built;

    /// The conditions of `idp` and what to serve when they all hold: a new upstream only when
    /// the metadata or the settings changed, else the one already serving. A metadata URL that
    /// cannot be fetched is `unavailable` (retried); metadata that does not parse is not.
    async fn evaluate(
        &self,
        sources: &Sources,
        name: &str,
        idp: &SAMLIdentityProvider,
        previous: Option<Built>,
        interim: &Interim<'_, Self>,
    ) -> Evaluation<Built> {
        let spec = &idp.spec;
        let mut checks = Vec::new();

        let tls = tls_spec::validate_at(spec.idp.tls.as_ref(), "spec.idp.tls", &sources.namespace, sources);
        checks.push(tls.check.clone());

        let clock_skew = clock_skew(spec.allowed_clock_skew.as_deref());
        let clock_skew_check = match &clock_skew {
            Ok(skew) => Check::success(
                CLOCK_SKEW,
                format!("spec.allowedClockSkew allows {}s", skew.as_secs()),
            ),
            Err(message) => Check::failure(CLOCK_SKEW, "Invalid", message.clone()),
        };

        let mut unavailable = None;
        let metadata = match (&spec.idp.metadata_url, &spec.idp.metadata) {
            (Some(url), None) if tls.ok() => {
                let mut waiting = checks.clone();
                waiting.push(Check::unknown(
                    METADATA,
                    format!("fetching the metadata from {url:?}"),
                ));
                interim.report(&waiting).await;
                match fetch(url, tls.ca_bundle_pem.as_deref()).await {
                    Ok(xml) => IdpMetadata::parse(&xml).map_err(|error| {
                        format!("the metadata from spec.idp.metadataURL ({url:?}) is not usable: {error}")
                    }),
                    Err(reason) => {
                        unavailable = Some(reason.clone());
                        Err(format!(
                            "cannot fetch the metadata from spec.idp.metadataURL ({url:?}): {reason}"
                        ))
                    }
                }
            }
            (Some(_), None) => {
                Err("spec.idp.tls is not valid, so spec.idp.metadataURL cannot be fetched".into())
            }
            (None, Some(xml)) => {
                IdpMetadata::parse(xml).map_err(|error| format!("spec.idp.metadata is not usable: {error}"))
            }
            _ => Err("exactly one of spec.idp.metadataURL and spec.idp.metadata must be set".into()),
        };
        checks.push(match &metadata {
            Ok(metadata) => Check::success(
                METADATA,
                format!(
                    "the metadata of identity provider {:?} has a single sign-on service (HTTP-Redirect) and signing certificates",
                    metadata.entity_id
                ),
            ),
            Err(message) => Check::failure(
                METADATA,
                if unavailable.is_some() { "UnableToFetch" } else { "Invalid" },
                message.clone(),
            ),
        });
        checks.push(clock_skew_check);

        let (Ok(metadata), Ok(clock_skew)) = (metadata, clock_skew) else {
            return Evaluation {
                checks,
                built: None,
                unavailable,
            };
        };
        let uid = idp.metadata.uid.clone().unwrap_or_default();
        let upstream = SamlUpstream {
            display_name: name.to_string(),
            resource_name: name.to_string(),
            resource_uid: uid,
            metadata: Arc::new(metadata),
            username_attribute: spec.claims.username.clone().filter(|name| !name.is_empty()),
            groups_attribute: spec.claims.groups.clone().filter(|name| !name.is_empty()),
            clock_skew,
        };
        let upstream = match previous {
            // Unchanged: the same upstream keeps serving.
            Some(built) if matches!(built.upstream.as_ref(), Upstream::Saml(serving) if serving.same_settings(&upstream)) => {
                built.upstream
            }
            _ => Arc::new(Upstream::Saml(upstream)),
        };
        Evaluation {
            checks,
            built: Some(Built { upstream }),
            unavailable: None,
        }
    }

    fn upstream(built: &Built) -> Arc<Upstream> {
        built.upstream.clone()
    }

    /// The conditions with `Ready`, and the phase.
    fn status(idp: &SAMLIdentityProvider, checks: &[Check]) -> serde_json::Value {
        let (phase, conditions) = conditions::with_ready::<Phase>(
            KIND,
            checks,
            &idp.status.clone().unwrap_or_default().conditions,
            idp.metadata.generation,
        );
        serde_json::to_value(SAMLIdentityProviderStatus { phase, conditions }).unwrap_or_default()
    }
}

/// `spec.allowedClockSkew` ([`DEFAULT_CLOCK_SKEW`] when absent), from 0s to
/// [`MOST_CLOCK_SKEW`]; else what is wrong with it.
fn clock_skew(text: Option<&str>) -> Result<Duration, String> {
    let Some(text) = text else {
        return Ok(DEFAULT_CLOCK_SKEW);
    };
    crate::session::bounded(
        "spec.allowedClockSkew",
        text,
        time::Duration::ZERO,
        MOST_CLOCK_SKEW,
    )
    .map(time::Duration::unsigned_abs)
}

/// The metadata document at `url` (a 2xx answer of at most [`METADATA_LIMIT`] bytes of UTF-8),
/// trusting `ca_pem` (the system roots when `None`); else why not.
async fn fetch(url: &str, ca_pem: Option<&str>) -> Result<String, String> {
    let https = HttpsClient::new(&TlsOptions {
        ca_pem: ca_pem.map(|pem| pem.as_bytes().to_vec()),
        ..TlsOptions::default()
    })
    .map_err(|error| error.to_string())?;
    let body = https
        .send(
            http::Method::GET,
            url,
            &[],
            bytes::Bytes::new(),
            METADATA_LIMIT,
            Some(FETCH_TIMEOUT),
        )
        .await
        .and_then(|response| response.success())
        .map_err(|error| error.to_string())?;
    String::from_utf8(body.to_vec()).map_err(|_| "the metadata is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_skew_defaults_and_is_bounded() {
        assert_eq!(clock_skew(None), Ok(DEFAULT_CLOCK_SKEW));
        assert_eq!(clock_skew(Some("0s")), Ok(Duration::ZERO));
        assert_eq!(clock_skew(Some("5m")), Ok(Duration::from_secs(300)));
        assert_eq!(
            clock_skew(Some("5m1s")),
            Err(r#"spec.allowedClockSkew: "5m1s" is out of range: it must be from 0s to 5m"#.into())
        );
        assert!(clock_skew(Some("soon"))
            .unwrap_err()
            .starts_with("spec.allowedClockSkew: "));
    }
}
