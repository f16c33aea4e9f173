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

// Shaped like the FederationDomain of Pinniped's "configure identity providers on a
// FederationDomain" how-to (transforms, constants of both types, every expression type, examples).
const FEDERATION_DOMAIN_HOWTO: &str = r#"
apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: FederationDomain
metadata:
  name: demo-federation-domain
  namespace: pinniped-supervisor
spec:
  issuer: https://issuer.example.com/demo-issuer
  tls:
    secretName: my-federation-domain-tls
  identityProviders:
  - displayName: ActiveDirectory for Admins
    objectRef:
      apiGroup: idp.supervisor.pinniped.dev
      kind: ActiveDirectoryIdentityProvider
      name: ad-for-admins
    transforms:
      constants:
      - name: prefix
        type: string
        stringValue: "ad:"
      - name: mustBelongToOneOfThese
        type: stringList
        stringListValue: ["kube/admins", "kube/developers"]
      expressions:
      - type: policy/v1
        expression: 'groups.exists(g, g in strListConst.mustBelongToOneOfThese)'
        message: "Only users in kube groups are allowed to authenticate"
      - type: username/v1
        expression: 'strConst.prefix + username'
      - type: groups/v1
        expression: 'groups.map(group, strConst.prefix + group)'
      examples:
      - username: "ryan@example.com"
        groups: ["kube/developers", "non-kube-group"]
        expects:
          username: "ad:ryan@example.com"
          groups: ["ad:kube/developers", "ad:non-kube-group"]
      - username: "paul@example.com"
        groups: ["non-kube-group"]
        expects:
          rejected: true
          message: "Only users in kube groups are allowed to authenticate"
  - displayName: Okta for Developers
    objectRef:
      apiGroup: idp.supervisor.pinniped.dev
      kind: OIDCIdentityProvider
      name: okta-for-developers
"#;

#[test]
fn pinniped_federation_domain_round_trips() {
    let fd: FederationDomain = round_trip(FEDERATION_DOMAIN_HOWTO);
    assert_eq!(fd.metadata.namespace.as_deref(), Some("pinniped-supervisor"));
    assert_eq!(fd.spec.issuer, "https://issuer.example.com/demo-issuer");
    assert_eq!(
        fd.spec.tls.and_then(|t| t.secret_name).as_deref(),
        Some("my-federation-domain-tls")
    );
    let [ad, okta] = &fd.spec.identity_providers[..] else {
        panic!("two identity providers expected");
    };
    assert_eq!(ad.display_name, "ActiveDirectory for Admins");
    assert_eq!(ad.object_ref.kind, "ActiveDirectoryIdentityProvider");
    assert_eq!(
        ad.object_ref.api_group.as_deref(),
        Some("idp.supervisor.pinniped.dev")
    );
    let transforms = &ad.transforms;
    assert_eq!(transforms.constants[0].r#type, ConstantType::String);
    assert_eq!(transforms.constants[0].string_value.as_deref(), Some("ad:"));
    assert_eq!(transforms.constants[1].r#type, ConstantType::StringList);
    assert_eq!(transforms.constants[1].string_list_value.len(), 2);
    assert_eq!(
        transforms
            .expressions
            .iter()
            .map(|e| e.r#type)
            .collect::<Vec<_>>(),
        [
            ExpressionType::PolicyV1,
            ExpressionType::UsernameV1,
            ExpressionType::GroupsV1
        ]
    );
    assert!(transforms.examples[1].expects.rejected);
    assert!(!transforms.examples[0].expects.rejected);
    assert!(okta.transforms.is_empty());
    assert_eq!(fd.status, None);
}

#[test]
fn federation_domain_minimal_and_legacy_mode() {
    let fd: FederationDomain = round_trip(
        "apiVersion: config.supervisor.pinniped.dev/v1alpha1\nkind: FederationDomain\n\
         metadata: {name: legacy, namespace: supervisor}\nspec: {issuer: 'https://sso.example.com'}\n",
    );
    assert!(fd.spec.identity_providers.is_empty());
    assert_eq!(fd.spec.tls, None);
}

#[test]
fn federation_domain_status_round_trips_with_secrets() {
    let fd: FederationDomain = round_trip(
        r#"
apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: FederationDomain
metadata: {name: fd, namespace: supervisor}
spec: {issuer: 'https://sso.example.com'}
status:
  phase: Ready
  conditions:
  - type: IssuerIsUnique
    status: "True"
    reason: Success
    message: spec.issuer is unique among all FederationDomains
    lastTransitionTime: "2026-01-02T03:04:05Z"
    observedGeneration: 2
  secrets:
    jwks: {name: fd-jwks}
    tokenSigningKey: {name: fd-token-signing-key}
    stateSigningKey: {name: fd-state-signing-key}
    stateEncryptionKey: {name: fd-state-encryption-key}
"#,
    );
    let status = fd.status.unwrap();
    assert_eq!(status.phase, Phase::Ready);
    assert_eq!(status.conditions[0].type_, "IssuerIsUnique");
    assert_eq!(status.secrets.jwks.map(|s| s.name).as_deref(), Some("fd-jwks"));
    assert_eq!(
        status.secrets.state_encryption_key.map(|s| s.name).as_deref(),
        Some("fd-state-encryption-key")
    );

    let empty: FederationDomainStatus = serde_json::from_value(json!({})).unwrap();
    assert_eq!(empty.phase, Phase::Pending);
    assert!(empty.secrets.is_empty());
    assert_eq!(serde_json::to_value(&empty).unwrap(), json!({"phase": "Pending"}));
    // What Go writes for secrets it has not generated yet reads back too.
    let go: FederationDomainStatus =
        serde_json::from_value(json!({"secrets": {"jwks": {}, "tokenSigningKey": {"name": ""}}})).unwrap();
    assert_eq!(go.secrets.jwks.map(|s| s.name).as_deref(), Some(""));
}

// Shaped like the OIDCClient of Pinniped's "configure auth for web applications" how-to.
#[test]
fn pinniped_oidc_client_round_trips() {
    let client: OIDCClient = round_trip(
        r#"
apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: OIDCClient
metadata:
  name: client.oauth.pinniped.dev-my-webapp-client
  namespace: supervisor
spec:
  allowedRedirectURIs:
  - https://my-webapp.example.com/callback
  - http://127.0.0.1:12345/callback
  allowedGrantTypes:
  - authorization_code
  - refresh_token
  - urn:ietf:params:oauth:grant-type:token-exchange
  allowedScopes:
  - openid
  - offline_access
  - pinniped:request-audience
  - username
  - groups
  tokenLifetimes:
    idTokenSeconds: 300
"#,
    );
    assert!(client
        .metadata
        .name
        .as_deref()
        .unwrap()
        .starts_with(OIDC_CLIENT_NAME_PREFIX));
    assert_eq!(client.spec.allowed_redirect_uris.len(), 2);
    assert_eq!(
        client.spec.allowed_grant_types,
        [
            GrantType::AuthorizationCode,
            GrantType::RefreshToken,
            GrantType::TokenExchange
        ]
    );
    assert_eq!(
        client.spec.allowed_scopes,
        [
            Scope::OpenID,
            Scope::OfflineAccess,
            Scope::RequestAudience,
            Scope::Username,
            Scope::Groups
        ]
    );
    assert_eq!(client.spec.token_lifetimes.id_token_seconds, Some(300));
}

#[test]
fn oidc_client_status_always_writes_the_secret_count() {
    let status: OIDCClientStatus = serde_json::from_value(json!({})).unwrap();
    assert_eq!(status.total_client_secrets, 0);
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        json!({"phase": "Pending", "totalClientSecrets": 0})
    );
}

#[test]
fn values_outside_pinnipeds_enums_are_refused() {
    assert!(serde_json::from_value::<GrantType>(json!("client_credentials")).is_err());
    assert!(serde_json::from_value::<Scope>(json!("email")).is_err());
    assert!(serde_json::from_value::<ExpressionType>(json!("policy/v2")).is_err());
    assert!(serde_json::from_value::<ConstantType>(json!("int")).is_err());
}

#[test]
fn constants_match_the_derived_resources_and_the_oidc_constants() {
    use kube_core::Resource;
    assert_eq!(FederationDomain::group(&()), GROUP);
    assert_eq!(OIDCClient::group(&()), GROUP);
    assert_eq!(FederationDomain::version(&()), VERSION);
    assert_eq!(
        OIDCClient::api_version(&()),
        "config.supervisor.pinniped.dev/v1alpha1"
    );
    // The wire names of the enums are the supervisor_oidc constants.
    let grant = |g: GrantType| serde_json::to_value(g).unwrap();
    assert_eq!(
        grant(GrantType::AuthorizationCode),
        crate::supervisor_oidc::GRANT_TYPE_AUTHORIZATION_CODE
    );
    assert_eq!(
        grant(GrantType::RefreshToken),
        crate::supervisor_oidc::GRANT_TYPE_REFRESH_TOKEN
    );
    assert_eq!(
        grant(GrantType::TokenExchange),
        crate::supervisor_oidc::GRANT_TYPE_TOKEN_EXCHANGE
    );
    let scope = |s: Scope| serde_json::to_value(s).unwrap();
    assert_eq!(scope(Scope::OpenID), crate::supervisor_oidc::SCOPE_OPENID);
    assert_eq!(
        scope(Scope::OfflineAccess),
        crate::supervisor_oidc::SCOPE_OFFLINE_ACCESS
    );
    assert_eq!(scope(Scope::Username), crate::supervisor_oidc::SCOPE_USERNAME);
    assert_eq!(scope(Scope::Groups), crate::supervisor_oidc::SCOPE_GROUPS);
    assert_eq!(
        scope(Scope::RequestAudience),
        crate::supervisor_oidc::SCOPE_REQUEST_AUDIENCE
    );
    assert_eq!(OIDC_CLIENT_NAME_PREFIX, "client.oauth.pinniped.dev-");
    assert_eq!(
        OIDC_CLIENT_NAME_PATTERN,
        format!("^{}", OIDC_CLIENT_NAME_PREFIX.replace('.', r"\."))
    );
}
