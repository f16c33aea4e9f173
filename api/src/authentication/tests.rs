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

// Shaped like Pinniped's "configure the Concierge with a JWT authenticator" how-to.
const JWT_HOWTO: &str = r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: JWTAuthenticator
metadata:
  name: my-jwt-authenticator
spec:
  issuer: https://my-issuer.example.com/any/path
  audience: my-client-id
  claims:
    username: email
    groups: groups
  tls:
    certificateAuthorityData: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
"#;

#[test]
fn pinniped_jwt_authenticator_round_trips() {
    let jwt: JWTAuthenticator = round_trip(JWT_HOWTO);
    assert_eq!(jwt.metadata.name.as_deref(), Some("my-jwt-authenticator"));
    assert_eq!(jwt.spec.issuer, "https://my-issuer.example.com/any/path");
    assert_eq!(jwt.spec.audience, "my-client-id");
    assert_eq!(jwt.spec.claims.username.as_deref(), Some("email"));
    assert_eq!(jwt.spec.claims.groups.as_deref(), Some("groups"));
    assert_eq!(
        jwt.spec
            .tls
            .and_then(|tls| tls.certificate_authority_data)
            .as_deref(),
        Some("LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==")
    );
    assert_eq!(jwt.status, None);
}

#[test]
fn minimal_jwt_authenticator_gets_default_claims_and_no_tls() {
    let jwt: JWTAuthenticator = round_trip(
        "apiVersion: authentication.concierge.pinniped.dev/v1alpha1\nkind: JWTAuthenticator\n\
         metadata: {name: a}\nspec: {issuer: 'https://issuer.example.com', audience: aud}\n",
    );
    assert!(jwt.spec.claims.is_empty());
    assert_eq!(jwt.spec.tls, None);
    assert!(jwt.spec.claim_validation_rules.is_empty());
    assert!(jwt.spec.user_validation_rules.is_empty());
}

#[test]
fn structured_authentication_fields_round_trip() {
    let jwt: JWTAuthenticator = round_trip(
        r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: JWTAuthenticator
metadata: {name: structured}
spec:
  issuer: https://issuer.example.com
  audience: aud
  claims:
    usernameExpression: '"oidc:" + claims.sub'
    groupsExpression: claims.roles
    extra:
    - key: example.org/team
      valueExpression: claims.team
  claimValidationRules:
  - claim: hd
    requiredValue: example.org
  - expression: claims.?email_verified.orValue(true) == true
    message: email must be verified
  userValidationRules:
  - expression: "!user.username.startsWith('system:')"
    message: no system users
  tls:
    certificateAuthorityDataSource:
      kind: ConfigMap
      name: my-trust-manager-bundle
      key: ca.pem
"#,
    );
    let claims = &jwt.spec.claims;
    assert_eq!(
        claims.username_expression.as_deref(),
        Some("\"oidc:\" + claims.sub")
    );
    assert_eq!(claims.groups_expression.as_deref(), Some("claims.roles"));
    assert_eq!(
        claims.extra,
        vec![ExtraMapping {
            key: "example.org/team".into(),
            value_expression: "claims.team".into()
        }]
    );
    assert_eq!(jwt.spec.claim_validation_rules.len(), 2);
    assert_eq!(
        jwt.spec.claim_validation_rules[0].required_value.as_deref(),
        Some("example.org")
    );
    assert_eq!(
        jwt.spec.user_validation_rules[0].message.as_deref(),
        Some("no system users")
    );
    let source = jwt
        .spec
        .tls
        .and_then(|tls| tls.certificate_authority_data_source)
        .unwrap();
    assert_eq!(source.kind, CertificateAuthorityDataSourceKind::ConfigMap);
    assert_eq!(
        (source.name.as_str(), source.key.as_str()),
        ("my-trust-manager-bundle", "ca.pem")
    );
}

// Shaped like Pinniped's "configure the Concierge with a webhook authenticator" how-to and its
// externally-managed CA bundle post.
#[test]
fn pinniped_webhook_authenticators_round_trip() {
    let with_data: WebhookAuthenticator = round_trip(
        r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: WebhookAuthenticator
metadata: {name: my-webhook-authenticator}
spec:
  endpoint: https://my-webhook.example.com/any/path
  tls:
    certificateAuthorityData: LS0tLS1CRUdJTi0tLS0tCg==
"#,
    );
    assert_eq!(with_data.spec.endpoint, "https://my-webhook.example.com/any/path");

    let with_source: WebhookAuthenticator = round_trip(
        r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: WebhookAuthenticator
metadata: {name: local-user-authenticator}
spec:
  endpoint: https://local-user-authenticator.local-user-authenticator.svc/authenticate
  tls:
    certificateAuthorityDataSource: {kind: Secret, name: ca, key: ca.crt}
"#,
    );
    assert_eq!(
        with_source
            .spec
            .tls
            .and_then(|t| t.certificate_authority_data_source)
            .map(|s| s.kind),
        Some(CertificateAuthorityDataSourceKind::Secret)
    );
}

#[test]
fn status_round_trips_and_phase_defaults_to_pending() {
    let jwt: JWTAuthenticator = round_trip(
        r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: JWTAuthenticator
metadata: {name: a}
spec: {issuer: 'https://i.example.com', audience: a}
status:
  phase: Ready
  conditions:
  - type: Ready
    status: "True"
    reason: Success
    message: the JWTAuthenticator is ready
    lastTransitionTime: "2026-11-21T10:00:00Z"
    observedGeneration: 1
"#,
    );
    let status = jwt.status.unwrap();
    assert_eq!(status.phase, Phase::Ready);
    assert_eq!(status.conditions[0].type_, "Ready");
    assert_eq!(status.conditions[0].observed_generation, Some(1));

    let empty: WebhookAuthenticatorStatus = serde_json::from_value(json!({})).unwrap();
    assert_eq!(empty.phase, Phase::Pending);
    assert_eq!(serde_json::to_value(&empty).unwrap(), json!({"phase": "Pending"}));
}

// The Selkie extension: absent means Pinniped's behaviour and is never written back.
#[test]
fn webhook_certificate_identity_is_optional_and_round_trips() {
    let plain: WebhookAuthenticator = round_trip(
        r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: WebhookAuthenticator
metadata: {name: plain}
spec: {endpoint: "https://example.com/review"}
"#,
    );
    assert_eq!(plain.spec.certificate_identity, None);
    let service_accounts: WebhookAuthenticator = round_trip(
        r#"
apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: WebhookAuthenticator
metadata: {name: kube-apiserver}
spec:
  endpoint: https://kubernetes.default.svc/apis/authentication.k8s.io/v1/tokenreviews
  certificateIdentity: UsernameAndGroups
"#,
    );
    assert_eq!(
        service_accounts.spec.certificate_identity,
        Some(CertificateIdentity::UsernameAndGroups)
    );
    let unknown = serde_yaml::from_str::<WebhookAuthenticatorSpec>(
        "{endpoint: 'https://example.com', certificateIdentity: Sometimes}",
    );
    assert!(unknown.is_err());
}

#[test]
fn values_outside_pinnipeds_enums_are_refused() {
    let bad_kind = json!({"kind": "Pod", "name": "n", "key": "k"});
    assert!(serde_json::from_value::<CertificateAuthorityDataSourceSpec>(bad_kind).is_err());
    assert!(serde_json::from_value::<Phase>(json!("Unknown")).is_err());
}

#[test]
fn constants_match_the_derived_resources() {
    use kube_core::Resource;
    assert_eq!(JWTAuthenticator::group(&()), GROUP);
    assert_eq!(WebhookAuthenticator::group(&()), GROUP);
    assert_eq!(JWTAuthenticator::version(&()), VERSION);
    assert_eq!(JWTAuthenticator::plural(&()), "jwtauthenticators");
    assert_eq!(
        WebhookAuthenticator::api_version(&()),
        "authentication.concierge.pinniped.dev/v1alpha1"
    );
}
