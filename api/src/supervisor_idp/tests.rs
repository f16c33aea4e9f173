use serde_json::{json, Value};

use super::*;

/// Parses `yaml` (a manifest as a user writes it) into `T`, then checks that serializing it again
/// gives back exactly the same document: no field is dropped, renamed or invented.
fn round_trip<T: serde::de::DeserializeOwned + Serialize>(yaml: &str) -> T {
    let document: Value = serde_yaml::from_str(yaml).unwrap();
    let typed: T = serde_json::from_value(document.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), document);
    typed
}

// Shaped like Pinniped's Okta how-to, plus the fields it leaves out.
#[test]
fn pinniped_oidc_identity_provider_round_trips() {
    let idp: OIDCIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: OIDCIdentityProvider
metadata:
  namespace: pinniped-supervisor
  name: okta
spec:
  issuer: https://my-company.okta.com
  tls:
    certificateAuthorityDataSource: {kind: ConfigMap, name: okta-ca, key: ca.pem}
  authorizationConfig:
    additionalScopes: [offline_access, groups, email]
    additionalAuthorizeParameters:
    - name: prompt
      value: consent
    allowPasswordGrant: true
  claims:
    username: email
    groups: groups
    additionalClaimMappings:
      department: dept
  client:
    secretName: okta-client-credentials
"#,
    );
    let spec = &idp.spec;
    assert_eq!(spec.issuer, "https://my-company.okta.com");
    assert_eq!(
        spec.authorization_config.additional_scopes,
        ["offline_access", "groups", "email"]
    );
    assert_eq!(
        spec.authorization_config.additional_authorize_parameters,
        [Parameter {
            name: "prompt".into(),
            value: Some("consent".into())
        }]
    );
    assert!(spec.authorization_config.allow_password_grant);
    assert_eq!(spec.claims.username.as_deref(), Some("email"));
    assert_eq!(spec.claims.additional_claim_mappings["department"], "dept");
    assert_eq!(spec.client.secret_name, "okta-client-credentials");
    assert_eq!(
        spec.tls
            .as_ref()
            .and_then(|t| t.certificate_authority_data_source.as_ref())
            .map(|s| s.kind),
        Some(CertificateAuthorityDataSourceKind::ConfigMap)
    );
}

#[test]
fn minimal_oidc_identity_provider_takes_every_default() {
    let idp: OIDCIdentityProvider = round_trip(
        "apiVersion: idp.supervisor.pinniped.dev/v1alpha1\nkind: OIDCIdentityProvider\n\
         metadata: {name: dex, namespace: supervisor}\n\
         spec: {issuer: 'https://dex.example.com/dex', client: {secretName: dex-client}}\n",
    );
    assert!(idp.spec.authorization_config.is_empty());
    assert!(idp.spec.claims.is_empty());
    assert_eq!(idp.spec.tls, None);
    // Go writes the optional bool and strings anyway; they read as the defaults.
    let go: OIDCIdentityProviderSpec = serde_json::from_value(json!({
        "issuer": "https://dex.example.com", "client": {"secretName": "c"},
        "authorizationConfig": {"allowPasswordGrant": false},
        "claims": {"username": "", "groups": ""},
    }))
    .unwrap();
    assert!(go.authorization_config.is_empty());
    assert_eq!(go.claims.username.as_deref(), Some(""));
}

// Shaped like Pinniped's OpenLDAP how-to.
#[test]
fn pinniped_ldap_identity_provider_round_trips() {
    let idp: LDAPIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: LDAPIdentityProvider
metadata:
  name: openldap
  namespace: pinniped-supervisor
spec:
  host: "ldap.openldap.svc.cluster.local"
  tls:
    certificateAuthorityData: LS0tLS1CRUdJTi0tLS0tCg==
  userSearch:
    base: "ou=users,dc=pinniped,dc=dev"
    filter: "&(objectClass=inetOrgPerson)(uid={})"
    attributes:
      username: "uid"
      uid: "uidNumber"
  groupSearch:
    base: "ou=users,dc=pinniped,dc=dev"
    filter: "&(objectClass=groupOfNames)(member={})"
    userAttributeForFilter: "dn"
    attributes:
      groupName: "cn"
    skipGroupRefresh: true
  bind:
    secretName: openldap-bind-account
"#,
    );
    let spec = &idp.spec;
    assert_eq!(spec.host, "ldap.openldap.svc.cluster.local");
    assert_eq!(
        spec.bind.as_ref().map(|b| b.secret_name.as_str()),
        Some("openldap-bind-account")
    );
    assert_eq!(spec.user_search.attributes.uid.as_deref(), Some("uidNumber"));
    assert_eq!(spec.group_search.user_attribute_for_filter.as_deref(), Some("dn"));
    assert_eq!(spec.group_search.attributes.group_name.as_deref(), Some("cn"));
    assert!(spec.group_search.skip_group_refresh);

    let minimal: LDAPIdentityProvider = round_trip(
        "apiVersion: idp.supervisor.pinniped.dev/v1alpha1\nkind: LDAPIdentityProvider\n\
         metadata: {name: l, namespace: s}\nspec: {host: 'ldap.example.com:636'}\n",
    );
    assert_eq!(minimal.spec.bind, None);
    assert!(minimal.spec.user_search.is_empty());
    assert!(minimal.spec.group_search.is_empty());
}

// Shaped like Pinniped's Active Directory how-to (the full form and the minimal one).
#[test]
fn pinniped_active_directory_identity_providers_round_trip() {
    let full: ActiveDirectoryIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: ActiveDirectoryIdentityProvider
metadata:
  name: my-active-directory-idp
  namespace: pinniped-supervisor
spec:
  host: "activedirectory.example.com:636"
  tls:
    certificateAuthorityData: "LS0tLS1CRUdJTi0tLS0tCg=="
  userSearch:
    base: "OU=my-department,OU=Users,DC=activedirectory,DC=example,DC=com"
    filter: "&(objectClass=person)(userPrincipalName={})"
    attributes:
      username: "mail"
      uid: "objectGUID"
  groupSearch:
    base: "ou=Groups,DC=activedirectory,DC=example,DC=com"
    filter: "&(objectClass=group)(member={})"
    userAttributeForFilter: "dn"
    attributes:
      groupName: "dn"
  bind:
    secretName: "active-directory-bind-account"
"#,
    );
    assert_eq!(full.spec.user_search.attributes.username.as_deref(), Some("mail"));
    assert_eq!(
        full.spec.group_search.filter.as_deref(),
        Some("&(objectClass=group)(member={})")
    );
    assert!(!full.spec.group_search.skip_group_refresh);

    let minimal: ActiveDirectoryIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: ActiveDirectoryIdentityProvider
metadata: {name: my-active-directory-idp, namespace: pinniped-supervisor}
spec:
  host: "activedirectory.example.com:636"
  bind:
    secretName: "active-directory-bind-account"
"#,
    );
    assert!(minimal.spec.user_search.is_empty());
    assert!(minimal.spec.group_search.is_empty());
}

// Shaped like Pinniped's GitHub how-to (github.com and GitHub Enterprise Server).
#[test]
fn pinniped_github_identity_providers_round_trip() {
    let dot_com: GitHubIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata:
  namespace: pinniped-supervisor
  name: github-dot-com
spec:
  githubAPI: {}
  claims: {}
  client:
    secretName: github-dot-com-client-credentials
  allowAuthentication:
    organizations:
      policy: AllGitHubUsers
"#,
    );
    assert_eq!(dot_com.spec.github_api, GitHubAPIConfig::default());
    assert_eq!(dot_com.spec.claims, GitHubClaims::default());
    assert_eq!(
        dot_com.spec.allow_authentication.organizations.policy,
        Some(GitHubAllowedAuthOrganizationsPolicy::AllGitHubUsers)
    );
    assert!(dot_com.spec.allow_authentication.organizations.allowed.is_empty());

    let enterprise: GitHubIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata:
  namespace: pinniped-supervisor
  name: github-enterprise
spec:
  githubAPI:
    host: github.enterprise.tld
    tls:
      certificateAuthorityData: LS0tLS1CRUdJTiBDRVJUSUZJQ0FU
  client:
    secretName: github-enterprise-client-credentials
  allowAuthentication:
    organizations:
      policy: OnlyUsersFromAllowedOrganizations
      allowed:
      - my-enterprise-organization
      - my-other-organization
  claims:
    username: "login:id"
    groups: slug
"#,
    );
    let spec = &enterprise.spec;
    assert_eq!(spec.github_api.host.as_deref(), Some("github.enterprise.tld"));
    assert_eq!(spec.claims.username, Some(GitHubUsernameAttribute::LoginAndID));
    assert_eq!(spec.claims.groups, Some(GitHubGroupNameAttribute::Slug));
    assert_eq!(spec.allow_authentication.organizations.allowed.len(), 2);
}

#[test]
fn github_defaulted_objects_are_written_even_when_empty() {
    // Pinniped's schema defaults githubAPI and claims to {}; a Rust-built spec writes them too, so
    // what is sent equals what the apiserver stores.
    let spec = GitHubIdentityProviderSpec {
        github_api: GitHubAPIConfig::default(),
        claims: GitHubClaims::default(),
        allow_authentication: GitHubAllowAuthenticationSpec {
            organizations: GitHubOrganizationsSpec {
                policy: Some(GitHubAllowedAuthOrganizationsPolicy::AllGitHubUsers),
                allowed: vec![],
            },
        },
        client: GitHubClientSpec {
            secret_name: "gh".into(),
        },
    };
    assert_eq!(
        serde_json::to_value(&spec).unwrap(),
        json!({
            "githubAPI": {},
            "claims": {},
            "allowAuthentication": {"organizations": {"policy": "AllGitHubUsers"}},
            "client": {"secretName": "gh"},
        })
    );
    for (attribute, wire) in [
        (GitHubUsernameAttribute::ID, "id"),
        (GitHubUsernameAttribute::Login, "login"),
        (GitHubUsernameAttribute::LoginAndID, "login:id"),
    ] {
        assert_eq!(serde_json::to_value(attribute).unwrap(), wire);
    }
    assert_eq!(
        serde_json::to_value(GitHubGroupNameAttribute::Name).unwrap(),
        "name"
    );
}

#[test]
fn statuses_round_trip_and_phase_defaults_to_pending() {
    let idp: GitHubIdentityProvider = round_trip(
        r#"
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata: {name: gh, namespace: s}
spec:
  githubAPI: {host: github.com}
  claims: {username: login, groups: name}
  client: {secretName: gh}
  allowAuthentication: {organizations: {policy: AllGitHubUsers}}
status:
  phase: Error
  conditions:
  - type: GitHubConnectionValid
    status: "False"
    reason: UnableToDialServer
    message: cannot dial
    lastTransitionTime: "2026-01-02T03:04:05Z"
"#,
    );
    let status = idp.status.unwrap();
    assert_eq!(status.phase, Phase::Error);
    assert_eq!(status.conditions[0].reason, "UnableToDialServer");
    for empty in [
        serde_json::to_value(serde_json::from_value::<OIDCIdentityProviderStatus>(json!({})).unwrap()),
        serde_json::to_value(serde_json::from_value::<LDAPIdentityProviderStatus>(json!({})).unwrap()),
        serde_json::to_value(
            serde_json::from_value::<ActiveDirectoryIdentityProviderStatus>(json!({})).unwrap(),
        ),
        serde_json::to_value(serde_json::from_value::<GitHubIdentityProviderStatus>(json!({})).unwrap()),
    ] {
        assert_eq!(empty.unwrap(), json!({"phase": "Pending"}));
    }
}

#[test]
fn values_outside_pinnipeds_enums_are_refused() {
    assert!(serde_json::from_value::<GitHubUsernameAttribute>(json!("email")).is_err());
    assert!(serde_json::from_value::<GitHubGroupNameAttribute>(json!("id")).is_err());
    assert!(serde_json::from_value::<GitHubAllowedAuthOrganizationsPolicy>(json!("Everyone")).is_err());
}

#[test]
fn constants_match_the_derived_resources() {
    use kube_core::Resource;
    assert_eq!(OIDCIdentityProvider::group(&()), GROUP);
    assert_eq!(LDAPIdentityProvider::group(&()), GROUP);
    assert_eq!(ActiveDirectoryIdentityProvider::group(&()), GROUP);
    assert_eq!(GitHubIdentityProvider::group(&()), GROUP);
    assert_eq!(GitHubIdentityProvider::version(&()), VERSION);
    assert_eq!(
        ActiveDirectoryIdentityProvider::plural(&()),
        "activedirectoryidentityproviders"
    );
    assert_eq!(
        OIDCIdentityProvider::api_version(&()),
        "idp.supervisor.pinniped.dev/v1alpha1"
    );
}
