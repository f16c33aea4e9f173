//! A FederationDomain checked as Pinniped's Supervisor checks it: its conditions (types, reasons
//! and messages of Pinniped's `federation_domain_watcher`) and the identity providers it serves,
//! from the FederationDomains and identity providers of its namespace. Pure: the controller
//! gathers the inputs and writes the result.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use selkie_api::supervisor_config::FederationDomain;
use selkie_kube::conditions::Check;

use crate::idp::transforms::Transforms;
use crate::idp::Upstream;
use crate::issuer::{split_issuer, SessionPolicy};
use crate::session::SessionTerms;

/// The identity-provider kinds a FederationDomain may name: Pinniped's, in the group
/// [`Namespace::idp_group`], then Selkie's own (`SAMLIdentityProvider`), in
/// [`selkie_api::supervisor_saml::GROUP`].
pub(crate) const KINDS: [&str; 5] = [
    "ActiveDirectoryIdentityProvider",
    "GitHubIdentityProvider",
    "LDAPIdentityProvider",
    "OIDCIdentityProvider",
    crate::controller::saml::KIND,
];

/// The API group a reference to an identity provider of `kind` must name: Selkie's own for its
/// kinds, else `pinniped_group` (Pinniped's under the installation's suffix).
fn group_of<'a>(kind: &str, pinniped_group: &'a str) -> &'a str {
    if kind == crate::controller::saml::KIND {
        selkie_api::supervisor_saml::GROUP
    } else {
        pinniped_group
    }
}

/// What the namespace holds besides FederationDomains.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    /// The identity provider objects that exist, by (kind, name).
    pub existing: HashSet<(String, String)>,
    /// The upstreams that are ready to use, by kind (`OIDCIdentityProvider`, ...) and name.
    pub ready: HashMap<(String, String), Arc<Upstream>>,
    /// The identity providers' API group under the installation's suffix.
    pub idp_group: String,
}

/// What checking one FederationDomain needs of every FederationDomain of its namespace (itself
/// included): its `spec.issuer` and `spec.tls.secretName` (empty when unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IssuerClaim {
    /// `spec.issuer`, as written.
    pub issuer: String,
    /// `spec.tls.secretName`, or empty.
    pub tls_secret: String,
}

impl IssuerClaim {
    /// The claim of a typed FederationDomain (the tests' and the fuzz targets' way in).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn of(fd: &FederationDomain) -> Self {
        Self {
            issuer: fd.spec.issuer.clone(),
            tls_secret: fd
                .spec
                .tls
                .as_ref()
                .and_then(|tls| tls.secret_name.clone())
                .unwrap_or_default(),
        }
    }

    /// The claim read straight from a watched object's JSON (the same as [`IssuerClaim::of`] of
    /// its typed form; a missing or non-string field reads as empty). Every reconcile reads the
    /// claims of every FederationDomain of the namespace: converting each object in full made
    /// each reconcile cost O(FederationDomains) conversions, and the periodic reconciles of all of
    /// them O(N²).
    pub(crate) fn of_object(object: &kube::api::DynamicObject) -> Self {
        let text = |pointer: &str| {
            object
                .data
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Self {
            issuer: text("/spec/issuer"),
            tls_secret: text("/spec/tls/secretName"),
        }
    }
}

/// The key under which two issuers are the same: lower-case host (with port) and path.
fn issuer_key(issuer: &str) -> Option<String> {
    let uri: http::Uri = issuer.parse().ok()?;
    let authority = uri.authority()?.as_str().to_ascii_lowercase();
    Some(format!("{authority}{}", uri.path().trim_end_matches('/')))
}

/// The issuer's host, lower-case, without port.
fn host(issuer: &str) -> Option<String> {
    split_issuer(issuer).ok().map(|(host, _)| host)
}

/// The conditions of `fd` among `all` (the claims of its namespace's FederationDomains, itself
/// included), and the upstreams it serves, in its order and under its display names — `None`
/// when it cannot be served (a condition says why).
pub(crate) fn check(
    fd: &FederationDomain,
    all: &[IssuerClaim],
    namespace: &Namespace,
) -> (Vec<Check>, Option<Vec<Arc<Upstream>>>) {
    let mut checks = Vec::new();
    let mut servable = true;

    // The issuer, and how it stands among the others.
    match split_issuer(&fd.spec.issuer) {
        Ok(_) => checks.push(Check::success("IssuerURLValid", "spec.issuer is a valid URL")),
        Err(error) => {
            servable = false;
            checks.push(Check::failure(
                "IssuerURLValid",
                "InvalidIssuerURL",
                error.to_string(),
            ));
        }
    }
    match (issuer_key(&fd.spec.issuer), host(&fd.spec.issuer)) {
        (Some(key), Some(hostname)) => {
            let same = all
                .iter()
                .filter(|other| issuer_key(&other.issuer).as_deref() == Some(key.as_str()))
                .count();
            if same > 1 {
                servable = false;
                checks.push(Check::failure(
                    "IssuerIsUnique",
                    "DuplicateIssuer",
                    "multiple FederationDomains have the same spec.issuer URL: these URLs must be unique (can use different hosts or paths)",
                ));
            } else {
                checks.push(Check::success(
                    "IssuerIsUnique",
                    "spec.issuer is unique among all FederationDomains",
                ));
            }
            let secrets: BTreeSet<String> = all
                .iter()
                .filter(|other| host(&other.issuer).as_deref() == Some(hostname.as_str()))
                .map(|other| other.tls_secret.clone())
                .collect();
            if secrets.len() > 1 {
                servable = false;
                checks.push(Check::failure(
                    "OneTLSSecretPerIssuerHostname",
                    "DifferentSecretRefsFound",
                    "when different FederationDomains are using the same hostname in the spec.issuer URL then they must also use the same TLS secretRef: different secretRefs found",
                ));
            } else {
                checks.push(Check::success(
                    "OneTLSSecretPerIssuerHostname",
                    "all FederationDomains are using the same TLS secret when using the same hostname in the spec.issuer URL",
                ));
            }
        }
        _ => {
            servable = false;
            checks.push(Check::unknown(
                "IssuerIsUnique",
                "unable to check if spec.issuer is unique among all FederationDomains because URL cannot be parsed",
            ));
            checks.push(Check::unknown(
                "OneTLSSecretPerIssuerHostname",
                "unable to check if all FederationDomains are using the same TLS secret when using the same hostname in the spec.issuer URL because URL cannot be parsed",
            ));
        }
    }

    let (idp_checks, upstreams) = identity_providers(fd, namespace);
    checks.extend(idp_checks);
    (checks, upstreams.filter(|_| servable))
}

/// The identity-provider conditions, and the upstreams when every reference is good.
fn identity_providers(
    fd: &FederationDomain,
    namespace: &Namespace,
) -> (Vec<Check>, Option<Vec<Arc<Upstream>>>) {
    const FOUND: &str = "IdentityProvidersFound";
    let references = &fd.spec.identity_providers;
    let mut checks = Vec::new();
    if references.is_empty() {
        // Legacy mode: the namespace's only identity provider, under its own name.
        let count = namespace.existing.len();
        let upstreams = match count {
            1 => {
                let Some((kind, name)) = namespace.existing.iter().next() else {
                    return (checks, None);
                };
                checks.push(Check::success_with_reason(
                    FOUND,
                    "LegacyConfigurationSuccess",
                    format!(
                        "no resources were specified by .spec.identityProviders[].objectRef but exactly one identity provider resource has been found: using {name:?} as identity provider: please explicitly list identity providers in .spec.identityProviders (this legacy configuration mode may be removed in a future version of Pinniped)"
                    ),
                ));
                namespace
                    .ready
                    .get(&(kind.clone(), name.clone()))
                    .cloned()
                    .map(|upstream| vec![upstream])
            }
            0 => {
                checks.push(Check::failure(
                    FOUND,
                    "LegacyConfigurationIdentityProviderNotFound",
                    "no resources were specified by .spec.identityProviders[].objectRef and no identity provider resources have been found: please create an identity provider resource",
                ));
                None
            }
            count => {
                checks.push(Check::failure(
                    FOUND,
                    "IdentityProviderNotSpecified",
                    format!(
                        "no resources were specified by .spec.identityProviders[].objectRef and {count} identity provider resources have been found: please update .spec.identityProviders to specify which identity providers this federation domain should use"
                    ),
                ));
                None
            }
        };
        checks.push(Check::success(
            "IdentityProvidersDisplayNamesUnique",
            "the names specified by .spec.identityProviders[].displayName are unique",
        ));
        checks.push(Check::success(
            "IdentityProvidersObjectRefAPIGroupSuffixValid",
            "the API groups specified by .spec.identityProviders[].objectRef.apiGroup are recognized",
        ));
        checks.push(Check::success(
            "IdentityProvidersObjectRefKindValid",
            "the kinds specified by .spec.identityProviders[].objectRef.kind are recognized",
        ));
        checks.extend(transforms_checks(fd));
        checks.push(sessions_check(fd));
        let ok = checks.iter().all(Check::is_true);
        return (checks, upstreams.filter(|_| ok));
    }

    let mut not_found = Vec::new();
    let mut bad_groups = BTreeSet::new();
    let mut bad_kinds = BTreeSet::new();
    let mut seen = HashSet::new();
    let mut duplicates = BTreeSet::new();
    let mut upstreams = Vec::new();
    // Whether a reference to one of Selkie's own kinds named another group.
    let mut selkie_group_wrong = false;
    for (index, reference) in references.iter().enumerate() {
        let object = &reference.object_ref;
        if !seen.insert(reference.display_name.clone()) {
            duplicates.insert(reference.display_name.clone());
        }
        let group = object.api_group.clone().unwrap_or_default();
        let expected = group_of(&object.kind, &namespace.idp_group);
        if group != expected {
            bad_groups.insert(group);
            selkie_group_wrong |= expected != namespace.idp_group;
        }
        if !KINDS.contains(&object.kind.as_str()) {
            bad_kinds.insert(object.kind.clone());
        }
        let exists = namespace
            .existing
            .contains(&(object.kind.clone(), object.name.clone()));
        if !exists {
            not_found.push(format!(
                "cannot find resource specified by .spec.identityProviders[{index}].objectRef (with name {:?})",
                object.name
            ));
        } else if let Some(upstream) = namespace.ready.get(&(object.kind.clone(), object.name.clone())) {
            upstreams.push(Arc::new(upstream.with_display_name(&reference.display_name)));
        }
    }
    checks.push(if not_found.is_empty() {
        Check::success(
            FOUND,
            "the resources specified by .spec.identityProviders[].objectRef were found",
        )
    } else {
        Check::failure(
            FOUND,
            "IdentityProvidersObjectRefsNotFound",
            not_found.join("\n\n"),
        )
    });
    let quoted = |set: &BTreeSet<String>| {
        set.iter()
            .map(|item| format!("{item:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    checks.push(if duplicates.is_empty() {
        Check::success(
            "IdentityProvidersDisplayNamesUnique",
            "the names specified by .spec.identityProviders[].displayName are unique",
        )
    } else {
        Check::failure(
            "IdentityProvidersDisplayNamesUnique",
            "DuplicateDisplayNames",
            format!(
                "the names specified by .spec.identityProviders[].displayName contain duplicates: {}",
                quoted(&duplicates)
            ),
        )
    });
    checks.push(if bad_groups.is_empty() {
        Check::success(
            "IdentityProvidersObjectRefAPIGroupSuffixValid",
            "the API groups specified by .spec.identityProviders[].objectRef.apiGroup are recognized",
        )
    } else {
        Check::failure(
            "IdentityProvidersObjectRefAPIGroupSuffixValid",
            "APIGroupUnrecognized",
            format!(
                "some API groups specified by .spec.identityProviders[].objectRef.apiGroup are not recognized (should be {:?}{}): {}",
                namespace.idp_group,
                if selkie_group_wrong {
                    format!(", or {:?} for SAMLIdentityProvider", selkie_api::supervisor_saml::GROUP)
                } else {
                    String::new()
                },
                quoted(&bad_groups)
            ),
        )
    });
    checks.push(if bad_kinds.is_empty() {
        Check::success(
            "IdentityProvidersObjectRefKindValid",
            "the kinds specified by .spec.identityProviders[].objectRef.kind are recognized",
        )
    } else {
        Check::failure(
            "IdentityProvidersObjectRefKindValid",
            "KindUnrecognized",
            format!(
                "some kinds specified by .spec.identityProviders[].objectRef.kind are not recognized (should be one of {}): {}",
                KINDS.join(", "),
                quoted(&bad_kinds)
            ),
        )
    });
    checks.extend(transforms_checks(fd));
    checks.push(sessions_check(fd));
    let ok = checks.iter().all(Check::is_true);
    (checks, ok.then_some(upstreams))
}

/// Identity transforms and policies are not evaluated by this Supervisor yet: a FederationDomain
/// that has any is refused (fail closed: a policy may be there to keep users out) rather than
/// served without them.
fn transforms_checks(fd: &FederationDomain) -> [Check; 2] {
    let mut invalid = Vec::new();
    let mut failed = Vec::new();
    for (index, reference) in fd.spec.identity_providers.iter().enumerate() {
        match Transforms::compile(&reference.transforms, index) {
            Ok(transforms) => failed.extend(transforms.check_examples(&reference.transforms.examples, index)),
            Err(errors) => {
                invalid.extend(errors);
                if !reference.transforms.examples.is_empty() {
                    failed.push(format!(
                        "unable to check if the examples specified by .spec.identityProviders[{index}].transforms.examples[] had errors because an expression was invalid"
                    ));
                }
            }
        }
    }
    [
        if invalid.is_empty() {
            Check::success(
                "TransformsExpressionsValid",
                "the expressions specified by .spec.identityProviders[].transforms.expressions[] are valid",
            )
        } else {
            Check::failure(
                "TransformsExpressionsValid",
                "InvalidTransformsExpressions",
                invalid.join("\n\n"),
            )
        },
        if failed.is_empty() {
            Check::success(
                "TransformsExamplesPassed",
                "the examples specified by .spec.identityProviders[].transforms.examples[] had no errors",
            )
        } else {
            Check::failure(
                "TransformsExamplesPassed",
                "TransformsExamplesFailed",
                failed.join("\n\n"),
            )
        },
    ]
}

/// Selkie's `SessionsValid`: whether every `sessions` of the FederationDomain (its own and its
/// providers') is within bounds ([`SessionTerms::of`]); a FederationDomain with one that is not
/// is not served, rather than served with terms its admin did not ask for.
fn sessions_check(fd: &FederationDomain) -> Check {
    match sessions(fd) {
        Ok(_) => Check::success(
            "SessionsValid",
            "the session terms specified by .spec.sessions and .spec.identityProviders[].sessions are valid",
        ),
        Err(errors) => Check::failure("SessionsValid", "InvalidSessions", errors.join("\n\n")),
    }
}

/// The session terms of a FederationDomain's identity providers, or every reason they are not
/// valid (each naming its field).
pub(crate) fn sessions(fd: &FederationDomain) -> Result<SessionPolicy, Vec<String>> {
    let own = fd.spec.sessions.as_ref();
    let mut errors = BTreeSet::new();
    let default = SessionTerms::of(own, None);
    let mut by_idp = HashMap::new();
    for (index, reference) in fd.spec.identity_providers.iter().enumerate() {
        let Some(sessions) = &reference.sessions else {
            continue;
        };
        match SessionTerms::of(own, Some((index, sessions))) {
            Ok(terms) => {
                by_idp.insert(reference.display_name.clone(), terms);
            }
            Err(error) => {
                errors.insert(error);
            }
        }
    }
    match default {
        Ok(default) if errors.is_empty() => return Ok(SessionPolicy { default, by_idp }),
        Ok(_) => {}
        Err(error) => {
            errors.insert(error);
        }
    }
    Err(errors.into_iter().collect())
}

/// The compiled transforms of a FederationDomain's identity providers, by display name (only
/// those that compile: a FederationDomain with an invalid one is not served, [`check`]).
pub(crate) fn transforms(fd: &FederationDomain) -> HashMap<String, Arc<Transforms>> {
    fd.spec
        .identity_providers
        .iter()
        .enumerate()
        .filter_map(|(index, reference)| {
            Transforms::compile(&reference.transforms, index)
                .ok()
                .filter(|transforms| !transforms.is_empty())
                .map(|transforms| (reference.display_name.clone(), Arc::new(transforms)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use selkie_oidc::{
        discovery::Discovery,
        https::TlsOptions,
        rp::{ClientConfig, Provider},
    };

    use super::*;
    use crate::idp::OidcUpstream;

    const GROUP: &str = "idp.supervisor.pinniped.dev";

    fn claims(all: &[FederationDomain]) -> Vec<IssuerClaim> {
        all.iter().map(IssuerClaim::of).collect()
    }

    #[test]
    fn a_claim_read_from_the_watched_object_is_the_typed_ones() {
        let object: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
            "kind": "FederationDomain",
            "metadata": {"name": "t1", "namespace": "ns"},
            "spec": {"issuer": "https://host.example.com/1", "tls": {"secretName": "one"},
                     "identityProviders": [reference("Corp", "OIDCIdentityProvider", "dex")]},
            "status": {"phase": "Ready"},
        }))
        .unwrap();
        let typed: FederationDomain = crate::controller::sources::typed(&object).unwrap();
        let claim = IssuerClaim::of_object(&object);
        assert_eq!(claim, IssuerClaim::of(&typed));
        assert_eq!(claim.issuer, "https://host.example.com/1");
        assert_eq!(claim.tls_secret, "one");

        let bare: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
            "kind": "FederationDomain",
            "metadata": {"name": "t2"},
            "spec": {"issuer": 42},
        }))
        .unwrap();
        let claim = IssuerClaim::of_object(&bare);
        assert_eq!((claim.issuer.as_str(), claim.tls_secret.as_str()), ("", ""));
    }

    fn fd(name: &str, issuer: &str, idps: serde_json::Value) -> FederationDomain {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
            "kind": "FederationDomain",
            "metadata": {"name": name, "namespace": "sso"},
            "spec": {"issuer": issuer, "identityProviders": idps},
        }))
        .unwrap()
    }

    fn upstream(name: &str) -> Arc<Upstream> {
        let discovery = Discovery {
            issuer: "https://dex.example.com".into(),
            authorization_endpoint: "https://dex.example.com/auth".into(),
            token_endpoint: "https://dex.example.com/token".into(),
            jwks_uri: "https://dex.example.com/keys".into(),
            ..Discovery::default()
        };
        Arc::new(Upstream::Oidc(OidcUpstream {
            display_name: name.into(),
            resource_name: name.into(),
            resource_uid: String::new(),
            provider: Arc::new(Provider::from_discovery(discovery, &TlsOptions::default()).unwrap()),
            client: ClientConfig::public("c", Vec::new()),
            additional_authorize_parameters: Vec::new(),
            allow_password_grant: false,
            username_claim: None,
            groups_claim: None,
            additional_claim_mappings: Default::default(),
        }))
    }

    fn namespace(existing: &[(&str, &str)]) -> Namespace {
        Namespace {
            existing: existing
                .iter()
                .map(|(k, n)| (k.to_string(), n.to_string()))
                .collect(),
            ready: HashMap::from([(
                ("OIDCIdentityProvider".to_string(), "dex".to_string()),
                upstream("dex"),
            )]),
            idp_group: GROUP.into(),
        }
    }

    fn reason<'a>(checks: &'a [Check], type_: &str) -> &'a str {
        &checks.iter().find(|check| check.type_ == type_).unwrap().reason
    }

    fn reference(display: &str, kind: &str, name: &str) -> serde_json::Value {
        serde_json::json!({"displayName": display, "objectRef": {"apiGroup": GROUP, "kind": kind, "name": name}})
    }

    #[test]
    fn a_good_federation_domain_serves_its_providers_under_their_display_names() {
        let one = fd(
            "one",
            "https://sso.example.com/a",
            serde_json::json!([reference("Corp", "OIDCIdentityProvider", "dex")]),
        );
        let (checks, upstreams) = check(
            &one,
            &claims(std::slice::from_ref(&one)),
            &namespace(&[("OIDCIdentityProvider", "dex")]),
        );
        assert!(checks.iter().all(Check::is_true), "{checks:?}");
        assert_eq!(checks.len(), 10, "Pinniped's nine and Selkie's SessionsValid");
        let upstreams = upstreams.unwrap();
        assert_eq!(upstreams[0].display_name(), "Corp");
    }

    #[test]
    fn pinnipeds_reasons_for_what_is_wrong() {
        let ns = namespace(&[("OIDCIdentityProvider", "dex"), ("LDAPIdentityProvider", "ldap")]);
        let a = fd(
            "a",
            "https://sso.example.com/x",
            serde_json::json!([reference("Corp", "OIDCIdentityProvider", "dex")]),
        );
        let b = fd(
            "b",
            "https://SSO.example.com/x/",
            serde_json::json!([reference("Corp", "OIDCIdentityProvider", "dex")]),
        );
        let (checks, upstreams) = check(&a, &claims(&[a.clone(), b]), &ns);
        assert_eq!(reason(&checks, "IssuerIsUnique"), "DuplicateIssuer");
        assert!(upstreams.is_none());

        let bad = fd(
            "bad",
            "https://sso.example.com/y",
            serde_json::json!([
                reference("Corp", "OIDCIdentityProvider", "missing"),
                reference("Corp", "CASIdentityProvider", "dex"),
                {"displayName": "Other", "objectRef": {"apiGroup": "idp.supervisor.acme.io", "kind": "OIDCIdentityProvider", "name": "dex"}},
            ]),
        );
        let (checks, upstreams) = check(&bad, &claims(std::slice::from_ref(&bad)), &ns);
        assert!(upstreams.is_none());
        assert_eq!(
            reason(&checks, "IdentityProvidersFound"),
            "IdentityProvidersObjectRefsNotFound"
        );
        assert_eq!(
            reason(&checks, "IdentityProvidersDisplayNamesUnique"),
            "DuplicateDisplayNames"
        );
        assert_eq!(
            reason(&checks, "IdentityProvidersObjectRefKindValid"),
            "KindUnrecognized"
        );
        assert_eq!(
            reason(&checks, "IdentityProvidersObjectRefAPIGroupSuffixValid"),
            "APIGroupUnrecognized"
        );

        // Selkie's own kind is named in Selkie's own group, and only there.
        let saml_in = |group: &str| {
            fd(
                "saml",
                "https://sso.example.com/saml",
                serde_json::json!([{"displayName": "SAML", "objectRef": {"apiGroup": group, "kind": "SAMLIdentityProvider", "name": "keycloak"}}]),
            )
        };
        let wrong = saml_in(GROUP);
        let (checks, _) = check(&wrong, &claims(std::slice::from_ref(&wrong)), &ns);
        let group_check = checks
            .iter()
            .find(|check| check.type_ == "IdentityProvidersObjectRefAPIGroupSuffixValid")
            .unwrap();
        assert_eq!(group_check.reason, "APIGroupUnrecognized");
        assert!(
            group_check
                .message
                .contains(r#"or "idp.supervisor.selkie.dev" for SAMLIdentityProvider"#),
            "{}",
            group_check.message
        );
        assert_eq!(reason(&checks, "IdentityProvidersObjectRefKindValid"), "Success");
        let right = saml_in(selkie_api::supervisor_saml::GROUP);
        let (checks, _) = check(&right, &claims(std::slice::from_ref(&right)), &ns);
        assert_eq!(
            reason(&checks, "IdentityProvidersObjectRefAPIGroupSuffixValid"),
            "Success"
        );

        let tls_a: FederationDomain = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t1"}, "spec": {"issuer": "https://host.example.com/1", "tls": {"secretName": "one"}}})).unwrap();
        let tls_b: FederationDomain = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t2"}, "spec": {"issuer": "https://host.example.com/2", "tls": {"secretName": "two"}}})).unwrap();
        let (checks, _) = check(&tls_a, &claims(&[tls_a.clone(), tls_b]), &ns);
        assert_eq!(
            reason(&checks, "OneTLSSecretPerIssuerHostname"),
            "DifferentSecretRefsFound"
        );

        // Legacy mode: with two identity providers, none is chosen.
        let legacy = fd("legacy", "https://sso.example.com/z", serde_json::json!([]));
        let (checks, upstreams) = check(&legacy, &claims(std::slice::from_ref(&legacy)), &ns);
        assert_eq!(
            reason(&checks, "IdentityProvidersFound"),
            "IdentityProviderNotSpecified"
        );
        assert!(upstreams.is_none());
        let (checks, upstreams) = check(
            &legacy,
            &claims(std::slice::from_ref(&legacy)),
            &namespace(&[("OIDCIdentityProvider", "dex")]),
        );
        assert_eq!(
            reason(&checks, "IdentityProvidersFound"),
            "LegacyConfigurationSuccess"
        );
        assert_eq!(upstreams.unwrap()[0].display_name(), "dex");
    }

    #[test]
    fn transforms_are_checked_and_a_failing_example_keeps_the_federation_domain_from_serving() {
        let with = |examples: serde_json::Value, expression: &str| {
            fd(
                "p",
                "https://sso.example.com/p",
                serde_json::json!([{
                    "displayName": "Corp",
                    "objectRef": {"apiGroup": GROUP, "kind": "OIDCIdentityProvider", "name": "dex"},
                    "transforms": {
                        "expressions": [{"type": "policy/v1", "expression": expression}],
                        "examples": examples,
                    },
                }]),
            )
        };
        let ns = namespace(&[("OIDCIdentityProvider", "dex")]);
        let passing = with(
            serde_json::json!([{"username": "mallory", "expects": {"rejected": true}}]),
            "username != 'mallory'",
        );
        let (checks, upstreams) = check(&passing, &claims(std::slice::from_ref(&passing)), &ns);
        assert_eq!(reason(&checks, "TransformsExpressionsValid"), "Success");
        assert_eq!(reason(&checks, "TransformsExamplesPassed"), "Success");
        assert!(upstreams.is_some());
        assert!(transforms(&passing).contains_key("Corp"));

        let failing = with(
            serde_json::json!([{"username": "pinny", "expects": {"rejected": true}}]),
            "username != 'mallory'",
        );
        let (checks, upstreams) = check(&failing, &claims(std::slice::from_ref(&failing)), &ns);
        assert_eq!(
            reason(&checks, "TransformsExamplesPassed"),
            "TransformsExamplesFailed"
        );
        assert!(upstreams.is_none(), "a failing example keeps it from serving");

        let invalid = with(serde_json::json!([]), "username !=");
        let (checks, upstreams) = check(&invalid, &claims(std::slice::from_ref(&invalid)), &ns);
        assert_eq!(
            reason(&checks, "TransformsExpressionsValid"),
            "InvalidTransformsExpressions"
        );
        assert!(upstreams.is_none(), "a policy must never be skipped");
    }

    #[test]
    fn session_terms_are_checked_and_bad_ones_keep_the_federation_domain_from_serving() {
        let with = |own: serde_json::Value, provider: serde_json::Value| {
            let mut fd = fd(
                "p",
                "https://sso.example.com/p",
                serde_json::json!([
                    {"displayName": "Corp", "objectRef": {"apiGroup": GROUP, "kind": "LDAPIdentityProvider", "name": "ldap"}, "sessions": provider},
                    {"displayName": "Dex", "objectRef": {"apiGroup": GROUP, "kind": "OIDCIdentityProvider", "name": "dex"}},
                ]),
            );
            fd.spec.sessions = serde_json::from_value(own).unwrap();
            fd
        };
        let ns = namespace(&[("LDAPIdentityProvider", "ldap"), ("OIDCIdentityProvider", "dex")]);
        let good = with(
            serde_json::json!({"maxLifetime": "24h"}),
            serde_json::json!({"maxLifetime": "120h", "idleTimeout": "8h"}),
        );
        let (checks, upstreams) = check(&good, &claims(std::slice::from_ref(&good)), &ns);
        assert_eq!(reason(&checks, "SessionsValid"), "Success");
        assert!(upstreams.is_some());
        let policy = sessions(&good).unwrap();
        assert_eq!(policy.of("Corp").max_lifetime, time::Duration::hours(120));
        assert_eq!(policy.of("Corp").idle_timeout, Some(time::Duration::hours(8)));
        assert_eq!(policy.of("Dex").max_lifetime, time::Duration::hours(24));
        assert_eq!(policy.of("Dex").idle_timeout, None);

        let bad = with(
            serde_json::json!({"maxLifetime": "1000h"}),
            serde_json::json!({"maxLifetime": "24h", "idleTimeout": "200h"}),
        );
        let (checks, upstreams) = check(&bad, &claims(std::slice::from_ref(&bad)), &ns);
        assert_eq!(reason(&checks, "SessionsValid"), "InvalidSessions");
        let message = &checks
            .iter()
            .find(|c| c.type_ == "SessionsValid")
            .unwrap()
            .message;
        assert!(
            message.contains("spec.sessions.maxLifetime: \"1000h\""),
            "{message}"
        );
        assert!(
            message.contains("spec.identityProviders[0].sessions.idleTimeout: \"200h\""),
            "{message}"
        );
        assert!(
            upstreams.is_none(),
            "terms the admin did not ask for are never served"
        );
    }
}
