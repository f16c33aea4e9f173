//! The LDAPIdentityProvider and ActiveDirectoryIdentityProvider reconcilers: one reconciler over
//! both kinds ([`DirectoryKind`] says what differs: Active Directory's defaults and its search
//! bases from the directory), with Pinniped's conditions — `BindSecretValid` (a
//! `kubernetes.io/basic-auth` Secret with `username` and `password`), `TLSConfigurationValid`,
//! `LDAPConnectionValid` (a connection and the service account's bind) and, for Active Directory,
//! `SearchBaseFound` (from the spec, else the directory's `defaultNamingContext`), then `Ready` —
//! and, when they hold, the upstream logins use. The directory is probed again only when the spec,
//! the Secret or the CA bundle changed; a failed probe is retried with backoff while the last
//! working form keeps serving.

use std::{sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use selkie_api::{
    supervisor_idp::{ActiveDirectoryIdentityProvider, LDAPIdentityProvider, Phase, TLSSpec},
    supervisor_oidc::IDPType,
};
use selkie_kube::{
    conditions::{self, Check},
    tls_spec,
};
use selkie_oidc::https::TlsOptions;

use crate::controller::identity_provider::{Evaluation, Interim, Provider};
use crate::controller::sources::{secret_fingerprint, secret_pair, Sources};
use crate::idp::ldap::{self, Directory, DirectoryConfig, Flavor, GroupSearch, UserSearch};
use crate::idp::{LdapUpstream, Upstream};

/// The bound of every connect, bind and search at an LDAP or Active Directory server.
const LDAP_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound of each step of the reconciler's connection check of a directory.
const LDAP_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
const BIND: &str = "BindSecretValid";
const CONNECTION: &str = "LDAPConnectionValid";
const SEARCH_BASE: &str = "SearchBaseFound";

/// An LDAPIdentityProvider's or ActiveDirectoryIdentityProvider's spec, as one shape.
pub(crate) struct DirectorySpec<'a> {
    host: &'a str,
    tls: Option<&'a TLSSpec>,
    bind_secret: String,
    user_search: UserSearch,
    group_search: GroupSearch,
}

/// The two directory kinds: what the reconciler needs of each.
pub(crate) trait DirectoryKind: serde::de::DeserializeOwned + Send + Sync + 'static {
    /// The kind's name.
    const KIND: &'static str;
    /// Which directory it is.
    const FLAVOR: Flavor;
    /// The object's metadata.
    fn meta(&self) -> &ObjectMeta;
    /// The conditions of its status now.
    fn conditions(&self) -> Vec<Condition>;
    /// Its spec, with the kind's defaults filled in.
    fn spec(&self) -> DirectorySpec<'_>;
}

impl DirectoryKind for LDAPIdentityProvider {
    const KIND: &'static str = "LDAPIdentityProvider";
    const FLAVOR: Flavor = Flavor::Ldap;

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn conditions(&self) -> Vec<Condition> {
        self.status
            .as_ref()
            .map(|status| status.conditions.clone())
            .unwrap_or_default()
    }

    fn spec(&self) -> DirectorySpec<'_> {
        let spec = &self.spec;
        DirectorySpec {
            host: &spec.host,
            tls: spec.tls.as_ref(),
            bind_secret: spec
                .bind
                .as_ref()
                .map(|bind| bind.secret_name.clone())
                .unwrap_or_default(),
            user_search: UserSearch {
                base: spec.user_search.base.clone().unwrap_or_default(),
                filter: spec.user_search.filter.clone().unwrap_or_default(),
                username_attribute: spec.user_search.attributes.username.clone().unwrap_or_default(),
                uid_attribute: spec.user_search.attributes.uid.clone().unwrap_or_default(),
            },
            group_search: GroupSearch {
                base: spec.group_search.base.clone().unwrap_or_default(),
                filter: spec.group_search.filter.clone().unwrap_or_default(),
                user_attribute_for_filter: spec.group_search.user_attribute_for_filter.clone(),
                group_name_attribute: spec
                    .group_search
                    .attributes
                    .group_name
                    .clone()
                    .unwrap_or_default(),
                skip_group_refresh: spec.group_search.skip_group_refresh,
            },
        }
    }
}

impl DirectoryKind for ActiveDirectoryIdentityProvider {
    const KIND: &'static str = "ActiveDirectoryIdentityProvider";
    const FLAVOR: Flavor = Flavor::ActiveDirectory;

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn conditions(&self) -> Vec<Condition> {
        self.status
            .as_ref()
            .map(|status| status.conditions.clone())
            .unwrap_or_default()
    }

    /// Pinniped's Active Directory defaults filled in (not the search bases: they come from the
    /// directory).
    fn spec(&self) -> DirectorySpec<'_> {
        let spec = &self.spec;
        let or = |value: &Option<String>, default: &str| {
            value
                .clone()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        DirectorySpec {
            host: &spec.host,
            tls: spec.tls.as_ref(),
            bind_secret: spec
                .bind
                .as_ref()
                .map(|bind| bind.secret_name.clone())
                .unwrap_or_default(),
            user_search: UserSearch {
                base: spec.user_search.base.clone().unwrap_or_default(),
                filter: or(&spec.user_search.filter, ldap::active_directory::USER_FILTER),
                username_attribute: or(
                    &spec.user_search.attributes.username,
                    ldap::active_directory::USERNAME_ATTRIBUTE,
                ),
                uid_attribute: or(
                    &spec.user_search.attributes.uid,
                    ldap::active_directory::UID_ATTRIBUTE,
                ),
            },
            group_search: GroupSearch {
                base: spec.group_search.base.clone().unwrap_or_default(),
                filter: or(&spec.group_search.filter, ldap::active_directory::GROUP_FILTER),
                user_attribute_for_filter: spec.group_search.user_attribute_for_filter.clone(),
                group_name_attribute: spec
                    .group_search
                    .attributes
                    .group_name
                    .clone()
                    .unwrap_or_default(),
                skip_group_refresh: spec.group_search.skip_group_refresh,
            },
        }
    }
}

/// A directory that passed its checks, and what it was made from.
#[derive(Clone)]
pub(crate) struct Built {
    fingerprint: String,
    checks: Vec<Check>,
    upstream: Arc<Upstream>,
}

/// The status of either kind (the same shape).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct DirectoryStatus {
    phase: Phase,
    conditions: Vec<Condition>,
}

/// The LDAPIdentityProvider or ActiveDirectoryIdentityProvider kind (see the module
/// documentation).
pub(crate) struct DirectoryProvider<K>(std::marker::PhantomData<fn() -> K>);

impl<K> Default for DirectoryProvider<K> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<K: DirectoryKind> Provider for DirectoryProvider<K> {
    const KIND: &'static str = K::KIND;
    const SECRET_NAMES: &'static [&'static str] = &["/spec/bind/secretName"];
    const TLS_SPECS: &'static [&'static str] = &["/spec/tls"];
    type Object = K;
    type Built = Built;

    /// The conditions of `idp` without `Ready`, the directory newly built from it when they hold
    /// and it was not built in this form already, and why the probe failed when it did (worth a
    /// retry).
    async fn evaluate(
        &self,
        sources: &Sources,
        name: &str,
        idp: &K,
        previous: Option<Built>,
        interim: &Interim<'_, Self>,
    ) -> Evaluation<Built> {
        let spec = idp.spec();
        let active_directory = K::FLAVOR == Flavor::ActiveDirectory;
        let mut checks = Vec::new();
        let bind = secret_pair(
            sources,
            BIND,
            &spec.bind_secret,
            "kubernetes.io/basic-auth",
            ["username", "password"],
        );
        checks.push(match &bind {
            Ok(_) => Check::success(BIND, "loaded bind secret"),
            Err(check) => check.clone(),
        });
        let tls = tls_spec::validate(spec.tls, &sources.namespace, sources);
        checks.push(tls.check.clone());
        let unable = |mut checks: Vec<Check>| {
            checks.push(Check::unable_to_validate(CONNECTION));
            if active_directory {
                checks.push(Check::unable_to_validate(SEARCH_BASE));
            }
            checks
        };
        let (Ok((dn, password, version)), true) = (bind, tls.ok()) else {
            return Evaluation::settled(unable(checks));
        };
        let fingerprint = format!(
            "{}|{}|{}|{dn}|{version}|{}|{:?}",
            idp.meta().uid.as_deref().unwrap_or_default(),
            idp.meta().generation.unwrap_or_default(),
            spec.host,
            secret_fingerprint(&password),
            tls.ca_bundle_pem,
        );
        if let Some(built) = previous.filter(|built| built.fingerprint == fingerprint) {
            checks.extend(built.checks);
            return Evaluation::settled(checks);
        }
        let options = TlsOptions {
            ca_pem: tls.ca_bundle_pem.as_ref().map(|pem| pem.as_bytes().to_vec()),
            ..TlsOptions::default()
        };
        let tls_config = match selkie_oidc::https::client_config(&options) {
            Ok(config) => Arc::new(config),
            Err(error) => {
                checks.push(Check::failure(
                    CONNECTION,
                    "LDAPConnectionError",
                    format!("the TLS configuration cannot be used: {error}"),
                ));
                if active_directory {
                    checks.push(Check::unable_to_validate(SEARCH_BASE));
                }
                return Evaluation::settled(checks);
            }
        };
        let config = DirectoryConfig {
            host: spec.host.to_string(),
            tls: tls_config,
            bind_dn: dn.clone(),
            bind_password: password,
            user_search: spec.user_search,
            group_search: spec.group_search,
            timeout: LDAP_TIMEOUT,
            flavor: K::FLAVOR,
        };
        let connected = format!(
            "successfully able to connect to \"{}\" and bind as user \"{dn}\" [validated with Secret \"{}\" at version \"{version}\"]",
            spec.host, spec.bind_secret
        );
        let mut waiting = checks.clone();
        waiting.push(Check::unknown(
            CONNECTION,
            format!("checking the connection to \"{}\"", spec.host),
        ));
        if active_directory {
            waiting.push(Check::unable_to_validate(SEARCH_BASE));
        }
        interim.report(&waiting).await;
        let (found, config) = probe_directory(config, connected).await;
        checks.extend(found.iter().cloned());
        if !found.iter().all(Check::is_true) {
            let failed: Vec<String> = found
                .iter()
                .filter(|check| !check.is_true())
                .map(|check| format!("{}: {}", check.type_, check.message))
                .collect();
            return Evaluation {
                checks,
                built: None,
                unavailable: Some(failed.join("; ")),
            };
        }
        let upstream = Arc::new(Upstream::Ldap(LdapUpstream {
            display_name: name.to_string(),
            resource_name: name.to_string(),
            resource_uid: idp.meta().uid.clone().unwrap_or_default(),
            kind: match K::FLAVOR {
                Flavor::Ldap => IDPType::LDAP,
                Flavor::ActiveDirectory => IDPType::ActiveDirectory,
            },
            directory: Arc::new(Directory::new(config)),
        }));
        let built = Built {
            fingerprint,
            checks: found,
            upstream,
        };
        Evaluation {
            checks,
            built: Some(built),
            unavailable: None,
        }
    }

    fn upstream(built: &Built) -> Arc<Upstream> {
        built.upstream.clone()
    }

    fn status(idp: &K, checks: &[Check]) -> serde_json::Value {
        let (phase, conditions) =
            conditions::with_ready::<Phase>(K::KIND, checks, &idp.conditions(), idp.meta().generation);
        serde_json::to_value(DirectoryStatus { phase, conditions }).unwrap_or_default()
    }
}

/// Checks a directory as an identity provider's conditions say: a connection and the service
/// account's bind (`LDAPConnectionValid`, `connected` its success message) and, for Active
/// Directory, the search bases (`SearchBaseFound`: from the spec, else the root DSE's
/// `defaultNamingContext`, filled into the configuration returned). Each step is bounded by
/// [`LDAP_PROBE_TIMEOUT`].
async fn probe_directory(mut config: DirectoryConfig, connected: String) -> (Vec<Check>, DirectoryConfig) {
    let probe = Directory::new(DirectoryConfig {
        timeout: LDAP_PROBE_TIMEOUT,
        ..config.clone()
    });
    let mut found = vec![match probe.probe().await {
        Ok(()) => Check::success(CONNECTION, connected),
        Err(error) => Check::failure(
            CONNECTION,
            "LDAPConnectionError",
            format!(
                "could not successfully connect to \"{}\" and bind as user \"{}\": {error}",
                config.host, config.bind_dn
            ),
        ),
    }];
    if config.flavor == Flavor::ActiveDirectory {
        let from_spec = !config.user_search.base.is_empty() && !config.group_search.base.is_empty();
        found.push(if from_spec {
            Check::success_with_reason(
                SEARCH_BASE,
                "UsingConfigurationFromSpec",
                "Using search base from ActiveDirectoryIdentityProvider config.",
            )
        } else if !found[0].is_true() {
            Check::unable_to_validate(SEARCH_BASE)
        } else {
            match probe.default_naming_context().await {
                Ok(context) => {
                    for base in [&mut config.user_search.base, &mut config.group_search.base] {
                        if base.is_empty() {
                            base.clone_from(&context);
                        }
                    }
                    Check::success(
                        SEARCH_BASE,
                        "Successfully fetched defaultNamingContext to use as default search base from RootDSE.",
                    )
                }
                Err(error) => Check::failure(
                    SEARCH_BASE,
                    "ErrorFetchingSearchBase",
                    format!("Error finding search base: {error}"),
                ),
            }
        });
    }
    (found, config)
}
