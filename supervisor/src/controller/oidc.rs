//! The OIDCIdentityProvider reconciler: Pinniped's conditions (`ClientCredentialsSecretValid`,
//! `TLSConfigurationValid`, `AdditionalAuthorizeParametersValid`, `OIDCDiscoverySucceeded`, then
//! `Ready`) and, when they hold, the upstream logins use. Discovery runs only when the issuer, the
//! CA bundle, the client credentials or the object changed; an issuer that does not answer is
//! retried with backoff while the last working form keeps serving.
//!
//! The upstreams share their HTTPS clients: every OIDCIdentityProvider with the same TLS
//! options (the same CA bundle, or none: the system's roots) discovers and then reaches its
//! issuer through one client ([`HTTPS_CLIENTS`]), so a hundred of them in front of one issuer
//! hold the connections of one pool, not of a hundred. A provider whose CA bundle changes is
//! discovered again and gets the client of its new bundle; a client lives as long as an
//! upstream built with it.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use selkie_api::supervisor_idp::{OIDCIdentityProvider, OIDCIdentityProviderStatus, Phase};
use selkie_kube::{
    conditions::{self, Check},
    tls_spec,
};
use selkie_oidc::{
    https::{HttpsClient, SharedClients, TlsError, TlsOptions},
    rp::{ClientConfig, OidcError, Provider as Discovery},
};

use crate::controller::identity_provider::{Evaluation, Interim, Provider};
use crate::controller::sources::{secret_fingerprint, secret_pair, Sources};
use crate::idp::{OidcUpstream, Upstream};

/// The kind's name.
pub(crate) const KIND: &str = "OIDCIdentityProvider";
/// The Secret type of an OIDC upstream's client credentials.
pub(crate) const OIDC_CLIENT_SECRET_TYPE: &str = "secrets.pinniped.dev/oidc-client";
/// Authorization request parameters an upstream's configuration may not set.
pub(crate) const DISALLOWED_AUTHORIZE_PARAMETERS: [&str; 9] = [
    "response_type",
    "scope",
    "client_id",
    "state",
    "nonce",
    "code_challenge",
    "code_challenge_method",
    "redirect_uri",
    "hd",
];
/// The bound of one discovery.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound of each request to a discovered upstream (its token, userinfo, JWKS and revocation
/// endpoints), which logins and refreshes wait on. Well within the time the Supervisor's own
/// clients wait for it ([`selkie_oidc::rp::HTTP_TIMEOUT`], 60 s, the CLI's): an upstream that
/// accepts connections and never answers costs a login this long, and the user is told
/// `temporarily_unavailable` rather than their client timing out with no reason.
pub(crate) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTPS clients of the OIDC upstreams, one per distinct TLS options in use, shared by the
/// upstreams built with those options (see [`SharedClients`] for the contract: held weakly, so
/// the client of options no upstream uses any more is dropped with the last upstream holding
/// it). One for the process, as the OIDCIdentityProviders are one controller's; the
/// Supervisor runs one tokio runtime, which drives every client's pooled connections.
static HTTPS_CLIENTS: LazyLock<SharedClients> = LazyLock::new(SharedClients::default);

/// The HTTPS client of an upstream with TLS `options` ([`HTTPS_CLIENTS`]): the one the
/// upstreams of the same options already use, else a new one.
fn https_client(options: &TlsOptions) -> Result<Arc<HttpsClient>, TlsError> {
    HTTPS_CLIENTS.get(options)
}

/// The OIDCIdentityProvider kind (see the module documentation).
pub(crate) struct OidcProvider;

impl Provider for OidcProvider {
    const KIND: &'static str = KIND;
    const SECRET_NAMES: &'static [&'static str] = &["/spec/client/secretName"];
    const TLS_SPECS: &'static [&'static str] = &["/spec/tls"];
    type Object = OIDCIdentityProvider;
    /// The fingerprint of what it was built from, and the upstream.
    type Built = (String, Arc<Upstream>);

    /// The conditions of `idp` without `Ready`, the upstream newly built from it (with its
    /// fingerprint) when they hold and it was not built in this form already, and why discovery
    /// failed when it did (worth a retry).
    async fn evaluate(
        &self,
        sources: &Sources,
        name: &str,
        idp: &OIDCIdentityProvider,
        previous: Option<(String, Arc<Upstream>)>,
        interim: &Interim<'_, Self>,
    ) -> Evaluation<(String, Arc<Upstream>)> {
        let mut checks = Vec::new();

        // The client credentials.
        let secret_name = &idp.spec.client.secret_name;
        let credentials = secret_pair(
            sources,
            "ClientCredentialsSecretValid",
            secret_name,
            OIDC_CLIENT_SECRET_TYPE,
            ["clientID", "clientSecret"],
        )
        .map(|(id, secret, _)| {
            let mark = secret_fingerprint(&secret);
            (id, secret, mark)
        });
        checks.push(match &credentials {
            Ok(_) => Check::success("ClientCredentialsSecretValid", "loaded client credentials"),
            Err(check) => check.clone(),
        });

        // TLS, then discovery.
        let tls = tls_spec::validate(idp.spec.tls.as_ref(), &sources.namespace, sources);
        checks.push(tls.check.clone());

        // Additional authorize parameters.
        let rejected: Vec<&str> = idp
            .spec
            .authorization_config
            .additional_authorize_parameters
            .iter()
            .map(|parameter| parameter.name.as_str())
            .filter(|name| DISALLOWED_AUTHORIZE_PARAMETERS.contains(name))
            .collect();
        checks.push(if rejected.is_empty() {
            Check::success(
                "AdditionalAuthorizeParametersValid",
                "additionalAuthorizeParameters parameter names are allowed",
            )
        } else {
            Check::failure(
                "AdditionalAuthorizeParametersValid",
                "DisallowedParameterName",
                format!(
                    "the following additionalAuthorizeParameters are not allowed: {}",
                    rejected.join(",")
                ),
            )
        });

        let fingerprint = format!(
            "{}|{}|{}|{:?}|{}",
            idp.metadata.uid.as_deref().unwrap_or_default(),
            idp.metadata.generation.unwrap_or_default(),
            idp.spec.issuer,
            tls.ca_bundle_pem,
            credentials
                .as_ref()
                .map(|(id, _, secret)| format!("{id}:{secret}"))
                .unwrap_or_default()
        );
        let (Ok((client_id, client_secret, _)), true, true) = (credentials, tls.ok(), rejected.is_empty())
        else {
            checks.push(Check::unable_to_validate("OIDCDiscoverySucceeded"));
            return Evaluation::settled(checks);
        };
        if previous.is_some_and(|(built, _)| built == fingerprint) {
            checks.push(Check::success(
                "OIDCDiscoverySucceeded",
                "discovered issuer configuration",
            ));
            return Evaluation::settled(checks);
        }
        let options = TlsOptions {
            ca_pem: tls.ca_bundle_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
            ..TlsOptions::default()
        };
        let issuer = &idp.spec.issuer;
        let mut waiting = checks.clone();
        waiting.push(Check::unknown(
            "OIDCDiscoverySucceeded",
            format!("performing OIDC discovery against {issuer:?}"),
        ));
        interim.report(&waiting).await;
        let discovery = async {
            let client = https_client(&options).map_err(OidcError::Tls)?;
            Discovery::discover_with(issuer, client).await
        };
        let discovered = match tokio::time::timeout(DISCOVERY_TIMEOUT, discovery).await {
            Ok(discovered) => discovered.map_err(|error| error.to_string()),
            Err(_) => Err(format!(
                "no answer within {} seconds",
                DISCOVERY_TIMEOUT.as_secs()
            )),
        };
        let provider = match discovered {
            Ok(provider) => Arc::new(provider.with_timeout(UPSTREAM_TIMEOUT)),
            Err(error) => {
                let message = format!("failed to perform OIDC discovery against {issuer:?}:\n{error}");
                checks.push(Check::failure(
                    "OIDCDiscoverySucceeded",
                    "Unreachable",
                    message.clone(),
                ));
                return Evaluation {
                    checks,
                    built: None,
                    unavailable: Some(message),
                };
            }
        };
        checks.push(Check::success(
            "OIDCDiscoverySucceeded",
            "discovered issuer configuration",
        ));
        let authorization = &idp.spec.authorization_config;
        let upstream = Arc::new(Upstream::Oidc(OidcUpstream {
            display_name: name.to_string(),
            resource_name: name.to_string(),
            resource_uid: idp.metadata.uid.clone().unwrap_or_default(),
            provider,
            client: ClientConfig {
                client_id,
                client_secret: Some(client_secret),
                scopes: compute_scopes(&authorization.additional_scopes),
            },
            additional_authorize_parameters: authorization
                .additional_authorize_parameters
                .iter()
                .map(|parameter| {
                    (
                        parameter.name.clone(),
                        parameter.value.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            allow_password_grant: authorization.allow_password_grant,
            username_claim: idp.spec.claims.username.clone().filter(|claim| !claim.is_empty()),
            groups_claim: idp.spec.claims.groups.clone().filter(|claim| !claim.is_empty()),
            additional_claim_mappings: idp.spec.claims.additional_claim_mappings.clone(),
        }));
        Evaluation {
            checks,
            built: Some((fingerprint, upstream)),
            unavailable: None,
        }
    }

    fn upstream(built: &Self::Built) -> Arc<Upstream> {
        built.1.clone()
    }

    fn status(idp: &OIDCIdentityProvider, checks: &[Check]) -> serde_json::Value {
        let (phase, conditions) = conditions::with_ready::<Phase>(
            KIND,
            checks,
            &idp.status.clone().unwrap_or_default().conditions,
            idp.metadata.generation,
        );
        serde_json::to_value(OIDCIdentityProviderStatus { phase, conditions }).unwrap_or_default()
    }
}

/// Pinniped's upstream scopes: `openid offline_access email profile` when none are configured,
/// else the configured ones with `openid`, de-duplicated and sorted.
pub(crate) fn compute_scopes(additional: &[String]) -> Vec<String> {
    if additional.is_empty() {
        return ["openid", "offline_access", "email", "profile"]
            .map(String::from)
            .to_vec();
    }
    let mut set: std::collections::BTreeSet<String> = additional.iter().cloned().collect();
    set.insert("openid".into());
    set.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA bundle (PEM) of a new CA.
    fn ca_bundle(name: &str) -> Vec<u8> {
        let ca = selkie_kube::certs::generate_ca(name, Duration::from_secs(3600)).unwrap();
        ca.cert_pem.into_bytes()
    }

    fn options(ca_pem: &[u8]) -> TlsOptions {
        TlsOptions {
            ca_pem: Some(ca_pem.to_vec()),
            ..TlsOptions::default()
        }
    }

    /// Upstreams with the same CA bundle get the same client (one connection pool), another
    /// bundle (a rotated one) gets another client, and a client no upstream holds any more is
    /// dropped.
    #[test]
    fn upstreams_with_the_same_tls_options_share_one_client() {
        let (dex, rotated) = (ca_bundle("dex CA"), ca_bundle("dex CA, rotated"));
        let first = https_client(&options(&dex)).unwrap();
        let second = https_client(&options(&dex.clone())).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        let after_rotation = https_client(&options(&rotated)).unwrap();
        assert!(!Arc::ptr_eq(&first, &after_rotation));

        let dropped = Arc::downgrade(&first);
        drop((first, second));
        assert!(dropped.upgrade().is_none(), "kept alive by the cache");
        let again = https_client(&options(&dex)).unwrap();
        assert!(Arc::ptr_eq(&again, &https_client(&options(&dex)).unwrap()));
        assert!(matches!(
            https_client(&options(b"not PEM")),
            Err(TlsError::BadCaBundle(_))
        ));
    }

    #[test]
    fn scopes_are_pinnipeds() {
        assert_eq!(
            compute_scopes(&[]),
            ["openid", "offline_access", "email", "profile"]
        );
        assert_eq!(
            compute_scopes(&["offline_access".into(), "groups".into(), "offline_access".into()]),
            ["groups", "offline_access", "openid"]
        );
    }
}
