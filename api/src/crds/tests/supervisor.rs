//! The Supervisor's CRDs against Pinniped's (`deploy/supervisor/*.yaml` plus its install overlay):
//! the same field paths, printer columns, validation, CEL rules and defaults.

use serde_json::{json, Value};

use super::*;
use crate::{
    supervisor_config::{ISSUER_RULE, ISSUER_RULE_MESSAGE, OIDC_CLIENT_NAME_PATTERN, REDIRECT_URI_PATTERN},
    supervisor_idp::{
        DEFAULT_GITHUB_HOST, GITHUB_ORGANIZATIONS_MESSAGE_ALLOWED_NEEDS_POLICY,
        GITHUB_ORGANIZATIONS_MESSAGE_POLICY_NEEDS_ALLOWED, GITHUB_ORGANIZATIONS_RULE_ALLOWED_NEEDS_POLICY,
        GITHUB_ORGANIZATIONS_RULE_POLICY_NEEDS_ALLOWED,
    },
};

/// Every path of `kind`'s schema must be `extra` plus the root, status and condition paths every
/// Supervisor CRD has.
fn assert_paths(kind: &str, extra: &[&str]) {
    let mut expected = set(ROOT_PATHS);
    expected.extend(set(CONDITION_PATHS));
    expected.extend(set(extra));
    let actual = paths(kind);
    let missing: Vec<_> = expected.difference(&actual).collect();
    let unexpected: Vec<_> = actual.difference(&expected).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "{kind}: missing {missing:?}, not Pinniped's {unexpected:?}"
    );
}

// The paths below are the property paths of Pinniped's generated CRDs (arrays as `name[]`), less
// the root, status.phase and status.conditions ones.

#[test]
fn federation_domain_has_exactly_pinnipeds_fields() {
    assert_paths(
        "FederationDomain",
        &[
            // Selkie's extension (optional; absent means off, as in Pinniped).
            "spec.deviceAuthorization",
            "spec.deviceAuthorization.enabled",
            // Selkie's extension (optional; absent means off, as in Pinniped).
            "spec.dpop",
            "spec.dpop.enabled",
            "spec.identityProviders[]",
            "spec.identityProviders[].displayName",
            "spec.identityProviders[].objectRef",
            "spec.identityProviders[].objectRef.apiGroup",
            "spec.identityProviders[].objectRef.kind",
            "spec.identityProviders[].objectRef.name",
            // Selkie's extension (optional; absent means Pinniped's terms).
            "spec.identityProviders[].sessions",
            "spec.identityProviders[].sessions.idleTimeout",
            "spec.identityProviders[].sessions.maxLifetime",
            "spec.identityProviders[].transforms",
            "spec.identityProviders[].transforms.constants[]",
            "spec.identityProviders[].transforms.constants[].name",
            "spec.identityProviders[].transforms.constants[].stringListValue[]",
            "spec.identityProviders[].transforms.constants[].stringValue",
            "spec.identityProviders[].transforms.constants[].type",
            "spec.identityProviders[].transforms.examples[]",
            "spec.identityProviders[].transforms.examples[].expects",
            "spec.identityProviders[].transforms.examples[].expects.groups[]",
            "spec.identityProviders[].transforms.examples[].expects.message",
            "spec.identityProviders[].transforms.examples[].expects.rejected",
            "spec.identityProviders[].transforms.examples[].expects.username",
            "spec.identityProviders[].transforms.examples[].groups[]",
            "spec.identityProviders[].transforms.examples[].username",
            "spec.identityProviders[].transforms.expressions[]",
            "spec.identityProviders[].transforms.expressions[].expression",
            "spec.identityProviders[].transforms.expressions[].message",
            "spec.identityProviders[].transforms.expressions[].type",
            "spec.issuer",
            // Selkie's extension (optional; absent means Pinniped's terms).
            "spec.sessions",
            "spec.sessions.idleTimeout",
            "spec.sessions.maxLifetime",
            "spec.tls",
            "spec.tls.secretName",
            "status.secrets",
            "status.secrets.jwks",
            "status.secrets.jwks.name",
            "status.secrets.stateEncryptionKey",
            "status.secrets.stateEncryptionKey.name",
            "status.secrets.stateSigningKey",
            "status.secrets.stateSigningKey.name",
            "status.secrets.tokenSigningKey",
            "status.secrets.tokenSigningKey.name",
        ],
    );
}

#[test]
fn oidc_client_has_exactly_pinnipeds_fields() {
    assert_paths(
        "OIDCClient",
        &[
            // From Pinniped's install overlay (z0_crd_overlay.yaml), not its generated CRD.
            "metadata.name",
            "spec.allowedGrantTypes[]",
            "spec.allowedRedirectURIs[]",
            "spec.allowedScopes[]",
            "spec.tokenLifetimes",
            "spec.tokenLifetimes.idTokenSeconds",
            "status.totalClientSecrets",
        ],
    );
}

#[test]
fn oidc_identity_provider_has_exactly_pinnipeds_fields() {
    let mut extra = vec![
        "spec.authorizationConfig",
        "spec.authorizationConfig.additionalAuthorizeParameters[]",
        "spec.authorizationConfig.additionalAuthorizeParameters[].name",
        "spec.authorizationConfig.additionalAuthorizeParameters[].value",
        "spec.authorizationConfig.additionalScopes[]",
        "spec.authorizationConfig.allowPasswordGrant",
        "spec.claims",
        "spec.claims.additionalClaimMappings",
        "spec.claims.groups",
        "spec.claims.username",
        "spec.client",
        "spec.client.secretName",
        "spec.issuer",
    ];
    extra.extend(TLS_PATHS);
    assert_paths("OIDCIdentityProvider", &extra);
}

const LDAP_PATHS: &[&str] = &[
    "spec.bind",
    "spec.bind.secretName",
    "spec.groupSearch",
    "spec.groupSearch.attributes",
    "spec.groupSearch.attributes.groupName",
    "spec.groupSearch.base",
    "spec.groupSearch.filter",
    "spec.groupSearch.skipGroupRefresh",
    "spec.groupSearch.userAttributeForFilter",
    "spec.host",
    "spec.userSearch",
    "spec.userSearch.attributes",
    "spec.userSearch.attributes.uid",
    "spec.userSearch.attributes.username",
    "spec.userSearch.base",
    "spec.userSearch.filter",
];

#[test]
fn ldap_and_active_directory_identity_providers_have_exactly_pinnipeds_fields() {
    let mut extra = LDAP_PATHS.to_vec();
    extra.extend(TLS_PATHS);
    assert_paths("LDAPIdentityProvider", &extra);
    assert_paths("ActiveDirectoryIdentityProvider", &extra);
}

#[test]
fn github_identity_provider_has_exactly_pinnipeds_fields() {
    assert_paths(
        "GitHubIdentityProvider",
        &[
            "spec.allowAuthentication",
            "spec.allowAuthentication.organizations",
            "spec.allowAuthentication.organizations.allowed[]",
            "spec.allowAuthentication.organizations.policy",
            "spec.claims",
            "spec.claims.groups",
            "spec.claims.username",
            "spec.client",
            "spec.client.secretName",
            "spec.githubAPI",
            "spec.githubAPI.host",
            "spec.githubAPI.tls",
            "spec.githubAPI.tls.certificateAuthorityData",
            "spec.githubAPI.tls.certificateAuthorityDataSource",
            "spec.githubAPI.tls.certificateAuthorityDataSource.key",
            "spec.githubAPI.tls.certificateAuthorityDataSource.kind",
            "spec.githubAPI.tls.certificateAuthorityDataSource.name",
        ],
    );
}

#[test]
fn supervisor_printer_columns_are_pinnipeds() {
    let status_age = [
        ("Status", "string", ".status.phase"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ];
    let with = |first: (&'static str, &'static str, &'static str)| {
        let mut all = vec![first];
        all.extend(status_age);
        owned(&all)
    };
    assert_eq!(
        columns("FederationDomain"),
        with(("Issuer", "string", ".spec.issuer"))
    );
    assert_eq!(
        columns("OIDCIdentityProvider"),
        with(("Issuer", "string", ".spec.issuer"))
    );
    assert_eq!(
        columns("LDAPIdentityProvider"),
        with(("Host", "string", ".spec.host"))
    );
    assert_eq!(
        columns("ActiveDirectoryIdentityProvider"),
        with(("Host", "string", ".spec.host"))
    );
    assert_eq!(
        columns("GitHubIdentityProvider"),
        with(("Host", "string", ".spec.githubAPI.host"))
    );
    assert_eq!(
        columns("OIDCClient"),
        owned(&[
            (
                "Privileged Scopes",
                "string",
                r#".spec.allowedScopes[?(@ == "pinniped:request-audience")]"#
            ),
            ("Client Secrets", "integer", ".status.totalClientSecrets"),
            ("Status", "string", ".status.phase"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ])
    );
}

const SUPERVISOR_KINDS: [&str; 7] = [
    "FederationDomain",
    "OIDCClient",
    "OIDCIdentityProvider",
    "LDAPIdentityProvider",
    "ActiveDirectoryIdentityProvider",
    "GitHubIdentityProvider",
    "SAMLIdentityProvider",
];

#[test]
fn every_supervisor_crd_requires_spec_and_has_pinnipeds_status_shape() {
    let mut cases: Vec<(&str, &str, &str, Value)> = Vec::new();
    for kind in SUPERVISOR_KINDS {
        cases.extend([
            (kind, "", "required", json!(["spec"])),
            (kind, "status", "required", Value::Null),
            (kind, "status.phase", "default", json!("Pending")),
            (kind, "status.phase", "enum", json!(["Pending", "Ready", "Error"])),
            (kind, "status.conditions", "x-kubernetes-list-type", json!("map")),
            (
                kind,
                "status.conditions",
                "x-kubernetes-list-map-keys",
                json!(["type"]),
            ),
            (
                kind,
                "status.conditions[]",
                "required",
                json!(["lastTransitionTime", "message", "reason", "status", "type"]),
            ),
            (
                kind,
                "status.conditions[].status",
                "enum",
                json!(["True", "False", "Unknown"]),
            ),
        ]);
    }
    check_keywords(&cases);
}

#[test]
fn federation_domain_validation_matches_pinnipeds() {
    const FD: &str = "FederationDomain";
    check_keywords(&[
        (FD, "spec", "required", json!(["issuer"])),
        (FD, "spec.issuer", "minLength", json!(1)),
        (FD, "spec.issuer", "pattern", Value::Null),
        (
            FD,
            "spec.issuer",
            "x-kubernetes-validations",
            json!([{"message": "issuer must be an HTTPS URL",
                    "rule": "isURL(self) && url(self).getScheme() == 'https'"}]),
        ),
        (FD, "spec.tls", "required", Value::Null),
        (FD, "spec.tls.secretName", "minLength", Value::Null),
        (
            FD,
            "spec.identityProviders",
            "x-kubernetes-list-type",
            Value::Null,
        ),
        (
            FD,
            "spec.identityProviders[]",
            "required",
            json!(["displayName", "objectRef"]),
        ),
        (FD, "spec.identityProviders[].displayName", "minLength", json!(1)),
        (
            FD,
            "spec.identityProviders[].objectRef",
            "required",
            json!(["kind", "name"]),
        ),
        (
            FD,
            "spec.identityProviders[].objectRef",
            "x-kubernetes-map-type",
            json!("atomic"),
        ),
        (FD, "spec.identityProviders[].transforms", "default", Value::Null),
        (
            FD,
            "spec.identityProviders[].transforms.constants",
            "x-kubernetes-list-type",
            json!("map"),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.constants",
            "x-kubernetes-list-map-keys",
            json!(["name"]),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.constants[]",
            "required",
            json!(["name", "type"]),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.constants[].name",
            "minLength",
            json!(1),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.constants[].name",
            "maxLength",
            json!(64),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.constants[].name",
            "pattern",
            json!("^[a-zA-Z][_a-zA-Z0-9]*$"),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.constants[].type",
            "enum",
            json!(["string", "stringList"]),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.expressions[]",
            "required",
            json!(["expression", "type"]),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.expressions[].type",
            "enum",
            json!(["policy/v1", "username/v1", "groups/v1"]),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.expressions[].expression",
            "minLength",
            json!(1),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.examples[]",
            "required",
            json!(["expects", "username"]),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.examples[].username",
            "minLength",
            json!(1),
        ),
        (
            FD,
            "spec.identityProviders[].transforms.examples[].expects",
            "required",
            Value::Null,
        ),
        (FD, "status.secrets", "default", Value::Null),
        (
            FD,
            "status.secrets.jwks",
            "x-kubernetes-map-type",
            json!("atomic"),
        ),
        (FD, "status.secrets.jwks.name", "default", json!("")),
        (FD, "status.secrets.tokenSigningKey.name", "default", json!("")),
        (
            FD,
            "status.secrets.stateSigningKey",
            "x-kubernetes-map-type",
            json!("atomic"),
        ),
        (FD, "status.secrets.stateEncryptionKey.name", "default", json!("")),
    ]);
    // The exported constants are the rule the CRD carries.
    let rule = &keyword(FD, "spec.issuer", "x-kubernetes-validations")[0];
    assert_eq!(rule["rule"], ISSUER_RULE);
    assert_eq!(rule["message"], ISSUER_RULE_MESSAGE);
}

#[test]
fn oidc_client_validation_matches_pinnipeds() {
    const C: &str = "OIDCClient";
    check_keywords(&[
        (
            C,
            "spec",
            "required",
            json!(["allowedGrantTypes", "allowedRedirectURIs", "allowedScopes"]),
        ),
        (C, "spec.allowedRedirectURIs", "minItems", json!(1)),
        (
            C,
            "spec.allowedRedirectURIs",
            "x-kubernetes-list-type",
            json!("set"),
        ),
        (
            C,
            "spec.allowedRedirectURIs[]",
            "pattern",
            json!(r"^https://.+|^http://(127\.0\.0\.1|\[::1\])(:\d+)?/"),
        ),
        (C, "spec.allowedGrantTypes", "minItems", json!(1)),
        (
            C,
            "spec.allowedGrantTypes",
            "x-kubernetes-list-type",
            json!("set"),
        ),
        (
            C,
            "spec.allowedGrantTypes[]",
            "enum",
            json!([
                "authorization_code",
                "refresh_token",
                "urn:ietf:params:oauth:grant-type:token-exchange"
            ]),
        ),
        (C, "spec.allowedScopes", "minItems", json!(1)),
        (C, "spec.allowedScopes", "x-kubernetes-list-type", json!("set")),
        (
            C,
            "spec.allowedScopes[]",
            "enum",
            json!([
                "openid",
                "offline_access",
                "username",
                "groups",
                "pinniped:request-audience"
            ]),
        ),
        (C, "spec.tokenLifetimes", "default", Value::Null),
        (C, "spec.tokenLifetimes.idTokenSeconds", "minimum", json!(120)),
        (C, "spec.tokenLifetimes.idTokenSeconds", "maximum", json!(1800)),
        (C, "spec.tokenLifetimes.idTokenSeconds", "format", json!("int32")),
        (C, "status.totalClientSecrets", "format", json!("int32")),
        (C, "status.totalClientSecrets", "default", Value::Null),
        (C, "metadata", "type", json!("object")),
        (C, "metadata.name", "type", json!("string")),
        (
            C,
            "metadata.name",
            "pattern",
            json!(r"^client\.oauth\.pinniped\.dev-"),
        ),
    ]);
    assert_eq!(
        keyword(C, "spec.allowedRedirectURIs[]", "pattern"),
        json!(REDIRECT_URI_PATTERN)
    );
    assert_eq!(
        keyword(C, "metadata.name", "pattern"),
        json!(OIDC_CLIENT_NAME_PATTERN)
    );
    // Only the OIDCClient CRD restricts metadata.name.
    for kind in SUPERVISOR_KINDS.iter().filter(|k| **k != C) {
        assert_eq!(keyword(kind, "metadata", "properties"), Value::Null, "{kind}");
    }
}

#[test]
fn oidc_client_name_pattern_is_pinnipeds_prefix() {
    // The pattern is the prefix, anchored and with its dots escaped: a name matches it exactly when
    // it starts with the prefix.
    let prefix = crate::supervisor_oidc::CLIENT_ID_REQUIRED_OIDC_CLIENT_PREFIX;
    assert_eq!(
        OIDC_CLIENT_NAME_PATTERN,
        format!("^{}", prefix.replace('.', r"\."))
    );
}

#[test]
fn identity_provider_validation_matches_pinnipeds() {
    const O: &str = "OIDCIdentityProvider";
    const L: &str = "LDAPIdentityProvider";
    const A: &str = "ActiveDirectoryIdentityProvider";
    let mut cases: Vec<(&str, &str, &str, Value)> = vec![
        (O, "spec", "required", json!(["client", "issuer"])),
        (O, "spec.issuer", "minLength", json!(1)),
        (O, "spec.issuer", "pattern", json!("^https://")),
        (O, "spec.client", "required", json!(["secretName"])),
        (O, "spec.client.secretName", "minLength", Value::Null),
        (O, "spec.authorizationConfig", "default", Value::Null),
        (
            O,
            "spec.authorizationConfig.additionalAuthorizeParameters",
            "x-kubernetes-list-type",
            json!("map"),
        ),
        (
            O,
            "spec.authorizationConfig.additionalAuthorizeParameters",
            "x-kubernetes-list-map-keys",
            json!(["name"]),
        ),
        (
            O,
            "spec.authorizationConfig.additionalAuthorizeParameters[]",
            "required",
            json!(["name"]),
        ),
        (
            O,
            "spec.authorizationConfig.additionalAuthorizeParameters[].name",
            "minLength",
            json!(1),
        ),
        (
            O,
            "spec.authorizationConfig.additionalScopes",
            "x-kubernetes-list-type",
            Value::Null,
        ),
        (O, "spec.claims", "default", Value::Null),
        (
            O,
            "spec.claims.additionalClaimMappings",
            "additionalProperties",
            json!({"type": "string"}),
        ),
        (
            O,
            "spec.tls.certificateAuthorityDataSource",
            "required",
            json!(["key", "kind", "name"]),
        ),
        (
            O,
            "spec.tls.certificateAuthorityDataSource.kind",
            "enum",
            json!(["Secret", "ConfigMap"]),
        ),
        (
            O,
            "spec.tls.certificateAuthorityDataSource.name",
            "minLength",
            json!(1),
        ),
        (
            O,
            "spec.tls.certificateAuthorityDataSource.key",
            "minLength",
            json!(1),
        ),
        // LDAP: minimum lengths on the user search; Active Directory: none there.
        (L, "spec.userSearch.base", "minLength", json!(1)),
        (L, "spec.userSearch.attributes.username", "minLength", json!(1)),
        (L, "spec.userSearch.attributes.uid", "minLength", json!(1)),
        (A, "spec.userSearch.base", "minLength", Value::Null),
        (A, "spec.userSearch.attributes.username", "minLength", Value::Null),
        (A, "spec.userSearch.attributes.uid", "minLength", Value::Null),
    ];
    for kind in [L, A] {
        cases.extend([
            (kind, "spec", "required", json!(["host"])),
            (kind, "spec.host", "minLength", json!(1)),
            (kind, "spec.bind", "required", json!(["secretName"])),
            (kind, "spec.bind.secretName", "minLength", json!(1)),
            (kind, "spec.userSearch", "default", Value::Null),
            (kind, "spec.userSearch", "required", Value::Null),
            (kind, "spec.userSearch.filter", "minLength", Value::Null),
            (kind, "spec.groupSearch", "default", Value::Null),
            (kind, "spec.groupSearch", "required", Value::Null),
            (
                kind,
                "spec.groupSearch.skipGroupRefresh",
                "type",
                json!("boolean"),
            ),
            (kind, "spec.groupSearch.skipGroupRefresh", "default", Value::Null),
            (
                kind,
                "spec.tls.certificateAuthorityDataSource.kind",
                "enum",
                json!(["Secret", "ConfigMap"]),
            ),
        ]);
    }
    check_keywords(&cases);
}

#[test]
fn github_identity_provider_validation_defaults_and_cel_rules_match_pinnipeds() {
    const G: &str = "GitHubIdentityProvider";
    const ORGS: &str = "spec.allowAuthentication.organizations";
    check_keywords(&[
        (G, "spec", "required", json!(["allowAuthentication", "client"])),
        (G, "spec.githubAPI", "default", json!({})),
        (G, "spec.githubAPI.host", "default", json!("github.com")),
        (G, "spec.githubAPI.host", "minLength", json!(1)),
        (
            G,
            "spec.githubAPI.tls.certificateAuthorityDataSource.kind",
            "enum",
            json!(["Secret", "ConfigMap"]),
        ),
        (G, "spec.claims", "default", json!({})),
        (G, "spec.claims.username", "default", json!("login:id")),
        (
            G,
            "spec.claims.username",
            "enum",
            json!(["id", "login", "login:id"]),
        ),
        (G, "spec.claims.groups", "default", json!("slug")),
        (G, "spec.claims.groups", "enum", json!(["name", "slug"])),
        (
            G,
            "spec.allowAuthentication",
            "required",
            json!(["organizations"]),
        ),
        (G, ORGS, "required", Value::Null),
        (
            G,
            ORGS,
            "x-kubernetes-validations",
            json!([
                {
                    "message": "spec.allowAuthentication.organizations.policy must be 'OnlyUsersFromAllowedOrganizations' when spec.allowAuthentication.organizations.allowed has organizations listed",
                    "rule": "!(has(self.allowed) && size(self.allowed) > 0 && self.policy == 'AllGitHubUsers')",
                },
                {
                    "message": "spec.allowAuthentication.organizations.policy must be 'AllGitHubUsers' when spec.allowAuthentication.organizations.allowed is empty",
                    "rule": "!((!has(self.allowed) || size(self.allowed) == 0) && self.policy == 'OnlyUsersFromAllowedOrganizations')",
                },
            ]),
        ),
        (
            G,
            "spec.allowAuthentication.organizations.policy",
            "default",
            json!("OnlyUsersFromAllowedOrganizations"),
        ),
        (
            G,
            "spec.allowAuthentication.organizations.policy",
            "enum",
            json!(["OnlyUsersFromAllowedOrganizations", "AllGitHubUsers"]),
        ),
        (
            G,
            "spec.allowAuthentication.organizations.allowed",
            "maxItems",
            json!(64),
        ),
        (
            G,
            "spec.allowAuthentication.organizations.allowed",
            "x-kubernetes-list-type",
            json!("set"),
        ),
        (G, "spec.client", "required", json!(["secretName"])),
        (G, "spec.client.secretName", "minLength", json!(1)),
    ]);
    // The exported constants are the rules the CRD carries.
    let rules = keyword(G, ORGS, "x-kubernetes-validations");
    assert_eq!(rules[0]["rule"], GITHUB_ORGANIZATIONS_RULE_ALLOWED_NEEDS_POLICY);
    assert_eq!(
        rules[0]["message"],
        GITHUB_ORGANIZATIONS_MESSAGE_ALLOWED_NEEDS_POLICY
    );
    assert_eq!(rules[1]["rule"], GITHUB_ORGANIZATIONS_RULE_POLICY_NEEDS_ALLOWED);
    assert_eq!(
        rules[1]["message"],
        GITHUB_ORGANIZATIONS_MESSAGE_POLICY_NEEDS_ALLOWED
    );
    assert_eq!(DEFAULT_GITHUB_HOST, "github.com");
}

/// Every `default` and every CEL rule in the Supervisor's CRDs, wherever it is: exactly Pinniped's
/// (a new default or rule anywhere fails this test until it is added here and checked against
/// Pinniped).
#[test]
fn supervisor_defaults_and_cel_rules_are_exactly_pinnipeds() {
    fn collect(node: &Value, path: &str, key: &str, out: &mut Vec<(String, Value)>) {
        if let Some(value) = node.get(key) {
            out.push((path.to_string(), value.clone()));
        }
        if let Some(properties) = node.get("properties").and_then(Value::as_object) {
            for (name, child) in properties {
                let path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                collect(child, &path, key, out);
            }
        }
        if let Some(items) = node.get("items") {
            collect(items, &format!("{path}[]"), key, out);
        }
    }
    let mut defaults = Vec::new();
    let mut rules = Vec::new();
    for kind in SUPERVISOR_KINDS {
        let schema = schema(kind);
        let mut found = Vec::new();
        collect(&schema, "", "default", &mut found);
        defaults.extend(found.into_iter().map(|(p, v)| (format!("{kind} {p}"), v)));
        let mut found = Vec::new();
        collect(&schema, "", "x-kubernetes-validations", &mut found);
        rules.extend(
            found
                .into_iter()
                .map(|(p, v)| (format!("{kind} {p}"), v.as_array().map_or(0, Vec::len))),
        );
    }
    let mut expected_defaults: Vec<(String, Value)> = vec![
        ("FederationDomain status.phase".into(), json!("Pending")),
        ("FederationDomain status.secrets.jwks.name".into(), json!("")),
        (
            "FederationDomain status.secrets.stateEncryptionKey.name".into(),
            json!(""),
        ),
        (
            "FederationDomain status.secrets.stateSigningKey.name".into(),
            json!(""),
        ),
        (
            "FederationDomain status.secrets.tokenSigningKey.name".into(),
            json!(""),
        ),
        ("OIDCClient status.phase".into(), json!("Pending")),
        ("OIDCIdentityProvider status.phase".into(), json!("Pending")),
        ("LDAPIdentityProvider status.phase".into(), json!("Pending")),
        (
            "ActiveDirectoryIdentityProvider status.phase".into(),
            json!("Pending"),
        ),
        (
            "GitHubIdentityProvider spec.allowAuthentication.organizations.policy".into(),
            json!("OnlyUsersFromAllowedOrganizations"),
        ),
        // Selkie's extension.
        (
            "FederationDomain spec.deviceAuthorization.enabled".into(),
            json!(false),
        ),
        ("FederationDomain spec.dpop.enabled".into(), json!(false)),
        ("GitHubIdentityProvider spec.claims".into(), json!({})),
        ("GitHubIdentityProvider spec.claims.groups".into(), json!("slug")),
        (
            "GitHubIdentityProvider spec.claims.username".into(),
            json!("login:id"),
        ),
        ("GitHubIdentityProvider spec.githubAPI".into(), json!({})),
        (
            "GitHubIdentityProvider spec.githubAPI.host".into(),
            json!("github.com"),
        ),
        ("GitHubIdentityProvider status.phase".into(), json!("Pending")),
        // Selkie's own kind.
        ("SAMLIdentityProvider status.phase".into(), json!("Pending")),
    ];
    defaults.sort_by(|a, b| a.0.cmp(&b.0));
    expected_defaults.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(defaults, expected_defaults);
    rules.sort();
    assert_eq!(
        rules,
        [
            (
                "FederationDomain spec.identityProviders[].sessions.idleTimeout".to_string(),
                1
            ),
            (
                "FederationDomain spec.identityProviders[].sessions.maxLifetime".to_string(),
                1
            ),
            ("FederationDomain spec.issuer".to_string(), 1),
            // Selkie's extension: the session terms' bounds.
            ("FederationDomain spec.sessions".to_string(), 1),
            ("FederationDomain spec.sessions.idleTimeout".to_string(), 1),
            ("FederationDomain spec.sessions.maxLifetime".to_string(), 1),
            (
                "GitHubIdentityProvider spec.allowAuthentication.organizations".to_string(),
                2
            ),
            // Selkie's own kind: the clock skew's bound, one metadata source.
            ("SAMLIdentityProvider spec.allowedClockSkew".to_string(), 1),
            ("SAMLIdentityProvider spec.idp".to_string(), 1),
        ]
    );
}

#[test]
fn supervisor_crds_are_namespaced_and_in_pinnipeds_order() {
    let crds = supervisor_crds(DEFAULT_API_GROUP_SUFFIX).unwrap();
    let kinds: Vec<&str> = crds.iter().map(|g| g.crd.spec.names.kind.as_str()).collect();
    assert_eq!(kinds, SUPERVISOR_KINDS);
    assert!(crds.iter().all(|g| g.crd.spec.scope == "Namespaced"));
    assert!(concierge_crds(DEFAULT_API_GROUP_SUFFIX)
        .unwrap()
        .iter()
        .all(|g| g.crd.spec.scope == "Cluster"));
    // The OIDCClient name pattern does not follow the group suffix: client IDs keep Pinniped's
    // prefix whatever the installation's groups are called.
    let renamed = supervisor_crds("acme.example.com").unwrap();
    let client = &renamed[1].crd;
    assert_eq!(client.spec.group, "config.supervisor.acme.example.com");
    let schema = serde_json::to_value(
        &client.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema,
    )
    .unwrap();
    assert_eq!(
        at(&schema, "metadata.name")["pattern"],
        json!(r"^client\.oauth\.pinniped\.dev-")
    );
}
