//! The Concierge and Supervisor CRDs generated into `conf/crds/` on the real kube-apiserver: they
//! install and become Established with Pinniped's names; Pinniped-style manifests apply unchanged
//! and read back through `kube::Api` into selkie-api's types; the status subresource takes the
//! statuses Selkie writes; `kubectl get` prints Pinniped's columns; and the apiserver itself
//! rejects what Pinniped's CRDs reject (patterns, enums and CEL rules), with its own validation
//! messages.
//!
//! The CRDs are shared by every test of this binary: they are applied idempotently (server-side
//! apply, once per process) and never deleted. Every cluster-scoped custom resource is named after
//! a fresh namespace, and every namespaced one lives in one, so parallel tests never collide.

use std::time::Duration;

use anyhow::{bail, ensure, Context};
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::{
    api::{Api, DynamicObject, Patch, PatchParams},
    Client,
};
use selkie_api::{
    authentication::{
        CertificateAuthorityDataSourceKind, JWTAuthenticator, JWTAuthenticatorSpec, JWTAuthenticatorStatus,
        Phase, WebhookAuthenticator, WebhookAuthenticatorSpec,
    },
    concierge_config::{
        CredentialIssuer, CredentialIssuerFrontend, CredentialIssuerSpec, CredentialIssuerStatus,
        CredentialIssuerStrategy, FrontendType, ImpersonationProxyInfo, ImpersonationProxyMode,
        ImpersonationProxyServiceType, StrategyReason, StrategyStatus, StrategyType,
        TokenCredentialRequestAPIInfo,
    },
    crds,
    supervisor_config::{ExpressionType, FederationDomain, OIDCClient, Scope},
    supervisor_idp::{
        ActiveDirectoryIdentityProvider, GitHubAllowedAuthOrganizationsPolicy, GitHubGroupNameAttribute,
        GitHubIdentityProvider, GitHubUsernameAttribute, LDAPIdentityProvider, OIDCIdentityProvider,
        GITHUB_ORGANIZATIONS_MESSAGE_ALLOWED_NEEDS_POLICY, GITHUB_ORGANIZATIONS_MESSAGE_POLICY_NEEDS_ALLOWED,
    },
};
use selkie_e2e::Cluster;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::eventually;

/// `conf/crds/` installed once per process (see [`selkie_e2e::crds::install_conf_crds`]).
async fn install_crds(cluster: &'static Cluster) -> anyhow::Result<()> {
    Ok(selkie_e2e::crds::install_conf_crds(cluster).await?)
}

/// [`selkie_e2e::crds::apply`] of every CRD (Concierge and Supervisor) of one API group suffix.
async fn apply_crds(cluster: &Cluster, source: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    let names = selkie_e2e::crds::apply(cluster, source, stdin).await?;
    let expected = crds::all_crds(selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX)?.len();
    ensure!(
        names.len() == expected,
        "expected {expected} CRDs to be applied, kubectl applied {names:?}"
    );
    Ok(())
}

/// A fresh name for this test's cluster-scoped objects (the generated namespace name).
async fn unique(cluster: &Cluster, client: &Client) -> anyhow::Result<String> {
    Ok(cluster.create_namespace(client, "crds").await?)
}

/// The shared cluster with Selkie's CRDs installed, a client, and a [`unique`] name.
async fn shared_cluster_with_crds() -> anyhow::Result<(&'static Cluster, Client, String)> {
    let cluster = Cluster::shared().await?;
    install_crds(cluster).await?;
    let client = cluster.client().await?;
    let id = unique(cluster, &client).await?;
    Ok((cluster, client, id))
}

/// `kubectl apply -f -` of `yaml`, retried while discovery catches up with new CRDs.
async fn apply(cluster: &Cluster, yaml: &str) -> anyhow::Result<String> {
    let kubectl = cluster.kubectl();
    eventually(Duration::from_secs(20), || async {
        Ok(kubectl.run_with_stdin(&["apply", "-f", "-"], Some(yaml)).await?)
    })
    .await
}

fn parse_yaml<T: DeserializeOwned>(yaml: &str) -> anyhow::Result<T> {
    let value: Value = serde_yaml::from_str(yaml)?;
    Ok(serde_json::from_value(value)?)
}

fn ca_data(cluster: &Cluster) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(cluster.pki().server_ca.cert_pem())
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn crds_install_established_structural_with_pinnipeds_names() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    install_crds(cluster).await?;
    let client = cluster.client().await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);

    for generated in crds::all_crds(selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX)? {
        let name = generated
            .crd
            .metadata
            .name
            .clone()
            .context("generated CRD without a name")?;
        let served = api.get(&name).await?;
        let status = served.status.clone().context("CRD without status")?;
        let conditions = status.conditions.unwrap_or_default();
        let condition = |ty: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == ty)
                .map(|c| c.status.clone())
        };
        assert_eq!(
            condition("Established").as_deref(),
            Some("True"),
            "{name}: {conditions:?}"
        );
        assert_eq!(
            condition("NamesAccepted").as_deref(),
            Some("True"),
            "{name}: {conditions:?}"
        );
        assert_eq!(
            condition("NonStructuralSchema"),
            None,
            "{name}: the apiserver found the schema non-structural: {conditions:?}"
        );
        // The apiserver accepted every name as declared (Pinniped's, checked in selkie-api's tests).
        let accepted = status.accepted_names.context("no acceptedNames")?;
        assert_eq!(accepted, generated.crd.spec.names, "{name}");
        assert_eq!(served.spec.group, generated.crd.spec.group);
        assert_eq!(served.spec.scope, generated.crd.spec.scope, "{name}");
        let version = &served.spec.versions[0];
        assert_eq!(
            (version.name.as_str(), version.served, version.storage),
            ("v1alpha1", true, true)
        );
        assert!(version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some());
        // Nothing of the schema was dropped or rewritten on the way in, and conf/crds/ holds what
        // the types generate.
        assert!(
            version.schema == generated.crd.spec.versions[0].schema,
            "{name}: the served schema differs from the one the types generate; is conf/crds/ out of \
             date? Regenerate it with `cargo run -p selkie-api --example crdgen`"
        );
    }

    // Pinniped's categories resolve: kubectl expands "pinniped-authenticators" and "pinniped" to
    // the kinds that declare them (an unknown category is "the server doesn't have a resource type").
    let kubectl = cluster.kubectl();
    for category in [
        "pinniped-authenticators",
        "pinniped-authenticator",
        "pinniped-idps",
        "pinniped-idp",
        "pinniped",
    ] {
        eventually(Duration::from_secs(20), || async {
            Ok(kubectl.run(&["get", category, "-o", "name"]).await?)
        })
        .await
        .with_context(|| format!("kubectl get {category}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn pinniped_manifests_apply_unchanged_and_read_back_typed() -> anyhow::Result<()> {
    let (cluster, client, id) = shared_cluster_with_crds().await?;
    let ca = ca_data(cluster);

    // Shaped like Pinniped's how-to guides, its install manifest and its blog posts.
    let jwt_howto = format!(
        "apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: JWTAuthenticator
metadata:
  name: jwt-howto-{id}
spec:
  issuer: https://my-issuer.example.com/any/path
  # This audience value must be the same as your OIDC client's ID.
  audience: my-client-id
  claims:
    username: email
    groups: groups
  tls:
    certificateAuthorityData: {ca}
"
    );
    let jwt_secret_source = format!(
        "apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: JWTAuthenticator
metadata:
  name: jwt-secret-ca-{id}
spec:
  issuer: https://dex.example.com/dex
  audience: pinniped-cli
  tls:
    certificateAuthorityDataSource:
      kind: Secret
      name: dex-ca
      key: ca.crt
"
    );
    let jwt_structured = format!(
        r#"apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: JWTAuthenticator
metadata:
  name: jwt-cel-{id}
spec:
  issuer: https://issuer.example.com
  audience: aud
  claims:
    usernameExpression: '"oidc:" + claims.sub'
    groupsExpression: claims.roles
    extra:
    - key: acme.io/admin
      valueExpression: '(has(claims.is_admin) && claims.is_admin) ? "true":""'
  claimValidationRules:
  - claim: hd
    requiredValue: example.com
  - expression: claims.?email_verified.orValue(true) == true
    message: email must be verified
  userValidationRules:
  - expression: "!user.username.startsWith('system:')"
    message: username cannot use reserved system prefix
"#
    );
    let webhook = format!(
        "apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: WebhookAuthenticator
metadata:
  name: webhook-{id}
spec:
  # HTTPS endpoint to be called as a webhook
  endpoint: https://local-user-authenticator.local-user-authenticator.svc/authenticate
  tls:
    certificateAuthorityData: {ca}
"
    );
    let webhook_configmap_source = format!(
        "apiVersion: authentication.concierge.pinniped.dev/v1alpha1
kind: WebhookAuthenticator
metadata:
  name: webhook-cm-{id}
spec:
  endpoint: https://my-webhook.example.com/any/path
  tls:
    certificateAuthorityDataSource:
      kind: ConfigMap
      name: my-trust-manager-bundle
      key: local-user-authenticator-ca.pem
"
    );
    let issuer_install = format!(
        "apiVersion: config.concierge.pinniped.dev/v1alpha1
kind: CredentialIssuer
metadata:
  name: ci-install-{id}
  labels:
    app: pinniped-concierge
spec:
  impersonationProxy:
    mode: auto
    service:
      type: LoadBalancer
      annotations:
        service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout: \"4000\"
"
    );
    let issuer_external = format!(
        "apiVersion: config.concierge.pinniped.dev/v1alpha1
kind: CredentialIssuer
metadata:
  name: ci-external-{id}
spec:
  impersonationProxy:
    externalEndpoint: impersonation-proxy-mtls.local
    mode: enabled
    service:
      type: ClusterIP
    tls:
      certificateAuthorityData: {ca}
      secretName: impersonation-proxy-tls-serving-cert
"
    );
    let issuer_minimal = format!(
        "apiVersion: config.concierge.pinniped.dev/v1alpha1
kind: CredentialIssuer
metadata:
  name: ci-minimal-{id}
spec:
  impersonationProxy:
    mode: disabled
"
    );

    let all = [
        &jwt_howto,
        &jwt_secret_source,
        &jwt_structured,
        &webhook,
        &webhook_configmap_source,
        &issuer_install,
        &issuer_external,
        &issuer_minimal,
    ]
    .map(String::as_str)
    .join("---\n");
    let created = apply(cluster, &all).await?;
    assert_eq!(
        created.lines().filter(|l| l.ends_with(" created")).count(),
        8,
        "{created}"
    );
    // Applying the same manifests again changes nothing: no defaulting or pruning makes them drift.
    let again = cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&all))
        .await?;
    assert_eq!(
        again.lines().filter(|l| l.ends_with(" unchanged")).count(),
        8,
        "{again}"
    );

    // Read back through kube-rs into selkie-api's types: exactly what was applied.
    let jwts: Api<JWTAuthenticator> = Api::all(client.clone());
    for yaml in [&jwt_howto, &jwt_secret_source, &jwt_structured] {
        let sent: JWTAuthenticator = parse_yaml(yaml)?;
        let name = sent.metadata.name.clone().context("no name")?;
        let read = jwts.get(&name).await?;
        assert_eq!(read.spec, sent.spec, "{name}");
        assert_eq!(read.status, None, "{name}: nobody wrote a status");
    }
    let howto = jwts.get(&format!("jwt-howto-{id}")).await?;
    assert_eq!(howto.spec.claims.username.as_deref(), Some("email"));
    assert_eq!(
        howto
            .spec
            .tls
            .and_then(|t| t.certificate_authority_data)
            .as_deref(),
        Some(ca.as_str())
    );
    let cel = jwts.get(&format!("jwt-cel-{id}")).await?;
    assert_eq!(cel.spec.claims.extra[0].key, "acme.io/admin");
    assert_eq!(cel.spec.user_validation_rules.len(), 1);

    let webhooks: Api<WebhookAuthenticator> = Api::all(client.clone());
    for yaml in [&webhook, &webhook_configmap_source] {
        let sent: WebhookAuthenticator = parse_yaml(yaml)?;
        let name = sent.metadata.name.clone().context("no name")?;
        assert_eq!(webhooks.get(&name).await?.spec, sent.spec, "{name}");
    }
    let cm = webhooks.get(&format!("webhook-cm-{id}")).await?;
    assert_eq!(
        cm.spec
            .tls
            .and_then(|t| t.certificate_authority_data_source)
            .map(|s| s.kind),
        Some(CertificateAuthorityDataSourceKind::ConfigMap)
    );

    let issuers: Api<CredentialIssuer> = Api::all(client.clone());
    for yaml in [&issuer_install, &issuer_external] {
        let sent: CredentialIssuer = parse_yaml(yaml)?;
        let name = sent.metadata.name.clone().context("no name")?;
        assert_eq!(issuers.get(&name).await?.spec, sent.spec, "{name}");
    }
    let install = issuers.get(&format!("ci-install-{id}")).await?;
    assert_eq!(
        install.spec.impersonation_proxy.mode,
        ImpersonationProxyMode::Auto
    );
    assert_eq!(
        install.spec.impersonation_proxy.service.annotations
            ["service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout"],
        "4000"
    );

    // The apiserver itself defaults an absent service to a LoadBalancer, as Pinniped's CRD does.
    let stored = cluster
        .kubectl()
        .run(&[
            "get",
            "credentialissuer",
            &format!("ci-minimal-{id}"),
            "-o",
            "jsonpath={.spec.impersonationProxy.service}",
        ])
        .await?;
    assert_eq!(
        serde_json::from_str::<Value>(&stored)?,
        json!({"type": "LoadBalancer"})
    );
    let minimal = issuers.get(&format!("ci-minimal-{id}")).await?;
    assert_eq!(
        minimal.spec.impersonation_proxy.mode,
        ImpersonationProxyMode::Disabled
    );
    assert_eq!(
        minimal.spec.impersonation_proxy.service.r#type,
        ImpersonationProxyServiceType::LoadBalancer
    );
    Ok(())
}

/// A whole-second timestamp: `metav1.Time` is serialized with second precision, so only such
/// times read back equal.
fn fixed_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::constant(1_795_000_000, 0))
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: fixed_time(),
        observed_generation: Some(1),
    }
}

/// Lines of `kubectl get <resource> <name>`, whitespace-split.
async fn table(cluster: &Cluster, resource: &str, name: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let out = cluster.kubectl().run(&["get", resource, name]).await?;
    Ok(out
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect())
}

#[tokio::test]
async fn status_subresource_and_printer_columns() -> anyhow::Result<()> {
    let (cluster, client, id) = shared_cluster_with_crds().await?;
    let params = PatchParams::default();

    // A JWTAuthenticator made with the typed API, its status written the way a reconciler will.
    let jwts: Api<JWTAuthenticator> = Api::all(client.clone());
    let name = format!("jwt-status-{id}");
    let jwt = JWTAuthenticator::new(
        &name,
        JWTAuthenticatorSpec {
            issuer: "https://issuer.example.com/path".into(),
            audience: "columns-audience".into(),
            claims: Default::default(),
            claim_validation_rules: vec![],
            user_validation_rules: vec![],
            tls: None,
            login_authorization: None,
        },
    );
    eventually(Duration::from_secs(20), || async {
        Ok(jwts.create(&Default::default(), &jwt).await?)
    })
    .await?;
    let status = JWTAuthenticatorStatus {
        phase: Phase::Ready,
        conditions: vec![
            condition("Ready", "True", "Success", "the JWTAuthenticator is ready"),
            condition("IssuerURLValid", "True", "Success", "issuer is a valid URL"),
        ],
    };
    jwts.patch_status(&name, &params, &Patch::Merge(json!({"status": status})))
        .await?;
    let read = jwts.get(&name).await?;
    let read_status = read.status.context("status was not stored")?;
    assert_eq!(read_status.phase, Phase::Ready);
    assert_eq!(read_status.conditions.len(), 2);
    assert_eq!(read_status.conditions[1].type_, "IssuerURLValid");

    let rows = table(cluster, "jwtauthenticators", &name).await?;
    assert_eq!(
        rows[0],
        ["NAME", "ISSUER", "AUDIENCE", "STATUS", "AGE"],
        "{rows:?}"
    );
    assert_eq!(
        rows[1][..4],
        [
            name.as_str(),
            "https://issuer.example.com/path",
            "columns-audience",
            "Ready"
        ],
        "{rows:?}"
    );

    // A status without a phase is defaulted to Pending by the apiserver.
    let webhooks: Api<WebhookAuthenticator> = Api::all(client.clone());
    let webhook_name = format!("webhook-status-{id}");
    webhooks
        .create(
            &Default::default(),
            &WebhookAuthenticator::new(
                &webhook_name,
                WebhookAuthenticatorSpec {
                    endpoint: "https://webhook.example.com/authenticate".into(),
                    tls: None,
                    certificate_identity: None,
                    login_authorization: None,
                },
            ),
        )
        .await?;
    webhooks
        .patch_status(
            &webhook_name,
            &params,
            &Patch::Merge(json!({"status": {"conditions": [
                condition("WebhookConnectionValid", "False", "UnableToDialServer", "cannot dial")
            ]}})),
        )
        .await?;
    let stored_phase = cluster
        .kubectl()
        .run(&[
            "get",
            "webhookauthenticator",
            &webhook_name,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .await?;
    assert_eq!(stored_phase, "Pending");
    let rows = table(cluster, "webhookauthenticators", &webhook_name).await?;
    assert_eq!(rows[0], ["NAME", "ENDPOINT", "STATUS", "AGE"], "{rows:?}");
    assert_eq!(
        rows[1][..3],
        [
            webhook_name.as_str(),
            "https://webhook.example.com/authenticate",
            "Pending"
        ]
    );

    // Statuses outside Pinniped's enums and patterns are refused by the apiserver.
    let bad_phase = cluster
        .kubectl()
        .output(
            &[
                "patch",
                "jwtauthenticator",
                &name,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Bogus"}}"#,
            ],
            None,
        )
        .await?;
    assert!(!bad_phase.success, "{bad_phase:?}");
    assert!(
        bad_phase
            .stderr
            .contains(r#"status.phase: Unsupported value: "Bogus""#),
        "{}",
        bad_phase.stderr
    );
    let bad_condition = cluster
        .kubectl()
        .output(
            &[
                "patch",
                "jwtauthenticator",
                &name,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"conditions":[{"type":"Ready","status":"Maybe","reason":"x","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
            ],
            None,
        )
        .await?;
    assert!(!bad_condition.success, "{bad_condition:?}");
    assert!(
        bad_condition
            .stderr
            .contains(r#"status.conditions[0].status: Unsupported value: "Maybe""#),
        "{}",
        bad_condition.stderr
    );

    // A CredentialIssuer with both strategies in Pinniped's status shape.
    let issuers: Api<CredentialIssuer> = Api::all(client.clone());
    let issuer_name = format!("ci-status-{id}");
    let spec: CredentialIssuerSpec = serde_json::from_value(json!({
        "impersonationProxy": {"mode": "enabled", "service": {"type": "None"},
                               "externalEndpoint": "proxy.example.com"}
    }))?;
    issuers
        .create(&Default::default(), &CredentialIssuer::new(&issuer_name, spec))
        .await?;
    let strategies = CredentialIssuerStatus {
        strategies: vec![
            CredentialIssuerStrategy {
                r#type: StrategyType::KubeClusterSigningCertificate,
                status: StrategyStatus::Error,
                reason: StrategyReason::CouldNotFetchKey,
                message: "could not find a healthy kube-controller-manager pod".into(),
                last_update_time: fixed_time(),
                frontend: None,
            },
            CredentialIssuerStrategy {
                r#type: StrategyType::ImpersonationProxy,
                status: StrategyStatus::Success,
                reason: StrategyReason::Listening,
                message: "impersonation proxy is ready to accept client connections".into(),
                last_update_time: fixed_time(),
                frontend: Some(CredentialIssuerFrontend {
                    r#type: FrontendType::ImpersonationProxy,
                    token_credential_request_api_info: None,
                    impersonation_proxy_info: Some(ImpersonationProxyInfo {
                        endpoint: "https://proxy.example.com".into(),
                        certificate_authority_data: ca_data(cluster),
                    }),
                }),
            },
            CredentialIssuerStrategy {
                r#type: StrategyType::KubeClusterSigningCertificate,
                status: StrategyStatus::Error,
                reason: StrategyReason::CouldNotGetClusterInfo,
                message: "no cluster-info".into(),
                last_update_time: fixed_time(),
                frontend: Some(CredentialIssuerFrontend {
                    r#type: FrontendType::TokenCredentialRequestAPI,
                    token_credential_request_api_info: Some(TokenCredentialRequestAPIInfo {
                        server: cluster.server_url().into(),
                        certificate_authority_data: ca_data(cluster),
                    }),
                    impersonation_proxy_info: None,
                }),
            },
        ],
    };
    issuers
        .patch_status(
            &issuer_name,
            &params,
            &Patch::Merge(json!({"status": strategies})),
        )
        .await?;
    let read = issuers.get(&issuer_name).await?;
    assert_eq!(read.status.as_ref(), Some(&strategies));
    let raw = cluster
        .kubectl()
        .run(&["get", "credentialissuer", &issuer_name, "-o", "json"])
        .await?;
    let raw: Value = serde_json::from_str(&raw)?;
    assert_eq!(
        raw["status"]["strategies"][2]["frontend"]["tokenCredentialRequestInfo"]["server"],
        cluster.server_url(),
        "Pinniped's wire name is tokenCredentialRequestInfo"
    );
    let rows = table(cluster, "credentialissuers", &issuer_name).await?;
    assert_eq!(
        rows[0],
        ["NAME", "PROXYMODE", "DEFAULTSTRATEGY", "AGE"],
        "{rows:?}"
    );
    assert_eq!(
        rows[1][..3],
        [issuer_name.as_str(), "enabled", "ImpersonationProxy"],
        "{rows:?}"
    );
    Ok(())
}

#[tokio::test]
async fn invalid_objects_are_rejected_by_the_apiserver() -> anyhow::Result<()> {
    let (cluster, _, id) = shared_cluster_with_crds().await?;
    let jwt = |name: &str, spec: &str| {
        format!(
            "apiVersion: authentication.concierge.pinniped.dev/v1alpha1\nkind: JWTAuthenticator\n\
             metadata: {{name: {name}-{id}}}\n{spec}\n"
        )
    };
    let webhook = |name: &str, spec: &str| {
        format!(
            "apiVersion: authentication.concierge.pinniped.dev/v1alpha1\nkind: WebhookAuthenticator\n\
             metadata: {{name: {name}-{id}}}\n{spec}\n"
        )
    };
    let issuer = |name: &str, spec: &str| {
        format!(
            "apiVersion: config.concierge.pinniped.dev/v1alpha1\nkind: CredentialIssuer\n\
             metadata: {{name: {name}-{id}}}\n{spec}\n"
        )
    };
    let long_ip = "1".repeat(256);
    let cases: Vec<(String, &str, Vec<&str>)> = vec![
        (
            jwt("no-issuer", "spec: {audience: a}"),
            "jwtauthenticator",
            vec!["spec.issuer: Required value"],
        ),
        (
            jwt("http-issuer", "spec: {issuer: 'http://issuer.example.com', audience: a}"),
            "jwtauthenticator",
            vec![r#"spec.issuer: Invalid value: "http://issuer.example.com""#, "should match '^https://'"],
        ),
        (
            jwt("empty-audience", "spec: {issuer: 'https://i.example.com', audience: ''}"),
            "jwtauthenticator",
            vec!["spec.audience: Invalid value: \"\"", "at least 1 chars long"],
        ),
        (jwt("no-spec", ""), "jwtauthenticator", vec!["spec: Required value"]),
        (
            jwt(
                "bad-ca-kind",
                "spec: {issuer: 'https://i.example.com', audience: a, \
                 tls: {certificateAuthorityDataSource: {kind: Pod, name: n, key: k}}}",
            ),
            "jwtauthenticator",
            vec![
                r#"spec.tls.certificateAuthorityDataSource.kind: Unsupported value: "Pod""#,
                r#"supported values: "Secret", "ConfigMap""#,
            ],
        ),
        (
            jwt(
                "no-ca-key",
                "spec: {issuer: 'https://i.example.com', audience: a, \
                 tls: {certificateAuthorityDataSource: {kind: Secret, name: n}}}",
            ),
            "jwtauthenticator",
            vec!["spec.tls.certificateAuthorityDataSource.key: Required value"],
        ),
        (
            jwt(
                "extra-without-expression",
                "spec: {issuer: 'https://i.example.com', audience: a, claims: {extra: [{key: acme.io/x}]}}",
            ),
            "jwtauthenticator",
            vec!["spec.claims.extra[0].valueExpression: Required value"],
        ),
        (
            jwt(
                "user-rule-without-expression",
                "spec: {issuer: 'https://i.example.com', audience: a, userValidationRules: [{message: m}]}",
            ),
            "jwtauthenticator",
            vec!["spec.userValidationRules[0].expression: Required value"],
        ),
        (
            // Pinniped's JWTAuthenticator has one audience; unknown fields are refused (kubectl
            // validates strictly on the server).
            jwt(
                "audiences",
                "spec: {issuer: 'https://i.example.com', audience: a, audiences: [a, b]}",
            ),
            "jwtauthenticator",
            vec![r#"unknown field "spec.audiences""#],
        ),
        (
            webhook("http-endpoint", "spec: {endpoint: 'http://webhook.example.com'}"),
            "webhookauthenticator",
            vec![r#"spec.endpoint: Invalid value: "http://webhook.example.com""#, "should match '^https://'"],
        ),
        (
            webhook("no-endpoint", "spec: {tls: {certificateAuthorityData: Y2E=}}"),
            "webhookauthenticator",
            vec!["spec.endpoint: Required value"],
        ),
        (
            issuer("sometimes", "spec: {impersonationProxy: {mode: sometimes}}"),
            "credentialissuer",
            vec![
                r#"spec.impersonationProxy.mode: Unsupported value: "sometimes""#,
                r#"supported values: "auto", "enabled", "disabled""#,
            ],
        ),
        (
            issuer("no-mode", "spec: {impersonationProxy: {service: {type: ClusterIP}}}"),
            "credentialissuer",
            vec!["spec.impersonationProxy.mode: Required value"],
        ),
        (
            issuer("nodeport", "spec: {impersonationProxy: {mode: enabled, service: {type: NodePort}}}"),
            "credentialissuer",
            vec![r#"spec.impersonationProxy.service.type: Unsupported value: "NodePort""#],
        ),
        (
            issuer(
                "long-ip",
                &format!("spec: {{impersonationProxy: {{mode: enabled, service: {{loadBalancerIP: '{long_ip}'}}}}}}"),
            ),
            "credentialissuer",
            vec!["spec.impersonationProxy.service.loadBalancerIP: Too long"],
        ),
        (
            issuer("empty-secret", "spec: {impersonationProxy: {mode: enabled, tls: {secretName: ''}}}"),
            "credentialissuer",
            vec!["spec.impersonationProxy.tls.secretName: Invalid value: \"\"", "at least 1 chars long"],
        ),
        (
            issuer("no-proxy", "spec: {}"),
            "credentialissuer",
            vec!["spec.impersonationProxy: Required value"],
        ),
    ];

    let kubectl = cluster.kubectl();
    // The first create may race discovery of the new types; wait until the apiserver answers with
    // a validation error rather than "no matches for kind".
    let (first, _, first_expected) = &cases[0];
    eventually(Duration::from_secs(20), || async {
        let out = kubectl.output(&["create", "-f", "-"], Some(first)).await?;
        if out.success || !out.stderr.contains(first_expected[0]) {
            bail!("not rejected for validation yet: {out:?}");
        }
        Ok(())
    })
    .await?;

    let mut failures = Vec::new();
    for (yaml, resource, expected) in &cases {
        let out = kubectl.output(&["create", "-f", "-"], Some(yaml)).await?;
        let name = yaml
            .lines()
            .find_map(|l| l.strip_prefix("metadata: {name: "))
            .and_then(|l| l.strip_suffix('}'))
            .unwrap_or_default();
        if out.success {
            failures.push(format!("{name}: accepted, expected rejection with {expected:?}"));
            continue;
        }
        for needle in expected {
            if !out.stderr.contains(needle) {
                failures.push(format!("{name}: stderr lacks {needle:?}:\n{}", out.stderr));
            }
        }
        let exists = kubectl.output(&["get", resource, name], None).await?;
        if exists.success {
            failures.push(format!("{name}: rejected, yet it exists"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[tokio::test]
async fn crds_for_another_api_group_suffix_install_and_serve_the_types() -> anyhow::Result<()> {
    const SUFFIX: &str = "e2e-suffix.selkie.dev";
    // A private cluster: with the same kinds served under two groups, kubectl's short resource
    // names (`kubectl get jwtauthenticators`) become ambiguous, which would disturb other tests.
    let private = Cluster::start().await?;
    let cluster = &private;
    let client = cluster.client().await?;
    let id = unique(cluster, &client).await?;

    let documents: Vec<String> = crds::render_all(SUFFIX)?
        .into_iter()
        .map(|(_, yaml)| yaml)
        .collect();
    apply_crds(cluster, &["-f", "-"], Some(&documents.join("---\n"))).await?;

    let name = format!("jwt-suffix-{id}");
    apply(
        cluster,
        &format!(
            "apiVersion: authentication.concierge.{SUFFIX}/v1alpha1\nkind: JWTAuthenticator\n\
             metadata: {{name: {name}}}\nspec: {{issuer: 'https://issuer.example.com', audience: suffixed}}\n"
        ),
    )
    .await?;

    let resource = crds::api_resource_with_group_suffix::<JWTAuthenticator>(SUFFIX)?;
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let read: JWTAuthenticator = api.get(&name).await?.try_parse()?;
    assert_eq!(read.spec.audience, "suffixed");
    assert_eq!(read.spec.issuer, "https://issuer.example.com");

    // The same validation holds under the new group.
    let rejected = cluster
        .kubectl()
        .output(
            &["create", "-f", "-"],
            Some(&format!(
                "apiVersion: config.concierge.{SUFFIX}/v1alpha1\nkind: CredentialIssuer\n\
                 metadata: {{name: ci-suffix-{id}}}\nspec: {{impersonationProxy: {{mode: sometimes}}}}\n"
            )),
        )
        .await?;
    assert!(
        !rejected.success && rejected.stderr.contains("Unsupported value: \"sometimes\""),
        "{rejected:?}"
    );
    Ok(())
}

// ---- the Supervisor's CRDs ----------------------------------------------------------------------

/// Pinniped-style manifests of every Supervisor kind in `ns`, shaped like Pinniped's how-to guides
/// (a FederationDomain with identity providers and transforms, a web application's OIDCClient,
/// Okta, OpenLDAP, Active Directory, GitHub and GitHub Enterprise), without the Secrets they name.
fn supervisor_manifests(ns: &str, ca: &str) -> Vec<String> {
    vec![
        format!(
            r#"apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: FederationDomain
metadata:
  name: demo-federation-domain
  namespace: {ns}
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
      name: okta
  - displayName: GitHub
    objectRef:
      apiGroup: idp.supervisor.pinniped.dev
      kind: GitHubIdentityProvider
      name: github-dot-com
"#
        ),
        format!(
            "apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: OIDCClient
metadata:
  name: client.oauth.pinniped.dev-my-webapp-client
  namespace: {ns}
spec:
  allowedRedirectURIs:
  - https://my-webapp.example.com/callback
  - http://127.0.0.1:8080/callback
  - http://[::1]/callback
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
    idTokenSeconds: 120
"
        ),
        format!(
            "apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: OIDCIdentityProvider
metadata:
  name: okta
  namespace: {ns}
spec:
  issuer: https://my-company.okta.com
  tls:
    certificateAuthorityData: {ca}
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
"
        ),
        format!(
            "apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: LDAPIdentityProvider
metadata:
  name: openldap
  namespace: {ns}
spec:
  host: ldap.openldap.svc.cluster.local
  tls:
    certificateAuthorityDataSource:
      kind: ConfigMap
      name: openldap-ca
      key: ca.pem
  userSearch:
    base: ou=users,dc=pinniped,dc=dev
    filter: '&(objectClass=inetOrgPerson)(uid={{}})'
    attributes:
      username: uid
      uid: uidNumber
  groupSearch:
    base: ou=users,dc=pinniped,dc=dev
    filter: '&(objectClass=groupOfNames)(member={{}})'
    userAttributeForFilter: dn
    attributes:
      groupName: cn
    skipGroupRefresh: true
  bind:
    secretName: openldap-bind-account
"
        ),
        format!(
            "apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: ActiveDirectoryIdentityProvider
metadata:
  name: ad-for-admins
  namespace: {ns}
spec:
  host: activedirectory.example.com:636
  bind:
    secretName: active-directory-bind-account
"
        ),
        format!(
            "apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata:
  name: github-dot-com
  namespace: {ns}
spec:
  client:
    secretName: github-dot-com-client-credentials
  allowAuthentication:
    organizations:
      policy: AllGitHubUsers
"
        ),
        format!(
            "apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata:
  name: github-enterprise
  namespace: {ns}
spec:
  githubAPI:
    host: github.enterprise.tld
    tls:
      certificateAuthorityData: {ca}
  client:
    secretName: github-enterprise-client-credentials
  allowAuthentication:
    organizations:
      policy: OnlyUsersFromAllowedOrganizations
      allowed:
      - my-enterprise-organization
      - my-other-organization
  claims:
    username: id
    groups: name
"
        ),
    ]
}

#[tokio::test]
async fn supervisor_crds_accept_pinniped_manifests_and_refuse_what_pinniped_refuses() -> anyhow::Result<()> {
    let (cluster, client, ns) = shared_cluster_with_crds().await?;
    let ca = ca_data(cluster);
    let kubectl = cluster.kubectl();

    // Every kind, as Pinniped's guides write it, is accepted, and applying it again changes
    // nothing (the apiserver's defaults do not make the manifests drift).
    let manifests = supervisor_manifests(&ns, &ca);
    let all = manifests.join("---\n");
    let created = apply(cluster, &all).await?;
    assert_eq!(
        created.lines().filter(|l| l.ends_with(" created")).count(),
        manifests.len(),
        "{created}"
    );
    let again = kubectl.run_with_stdin(&["apply", "-f", "-"], Some(&all)).await?;
    assert_eq!(
        again.lines().filter(|l| l.ends_with(" unchanged")).count(),
        manifests.len(),
        "{again}"
    );

    // Read back into selkie-api's types: what was sent, plus Pinniped's defaults where Pinniped's
    // CRDs have them.
    let fd: FederationDomain = Api::namespaced(client.clone(), &ns)
        .get("demo-federation-domain")
        .await?;
    assert_eq!(fd.spec, parse_yaml::<FederationDomain>(&manifests[0])?.spec);
    assert_eq!(fd.spec.identity_providers.len(), 3);
    assert_eq!(
        fd.spec.identity_providers[0].transforms.expressions[0].r#type,
        ExpressionType::PolicyV1
    );
    let oidc_client: OIDCClient = Api::namespaced(client.clone(), &ns)
        .get("client.oauth.pinniped.dev-my-webapp-client")
        .await?;
    assert_eq!(oidc_client.spec, parse_yaml::<OIDCClient>(&manifests[1])?.spec);
    assert!(oidc_client.spec.allowed_scopes.contains(&Scope::RequestAudience));
    let okta: OIDCIdentityProvider = Api::namespaced(client.clone(), &ns).get("okta").await?;
    assert_eq!(okta.spec, parse_yaml::<OIDCIdentityProvider>(&manifests[2])?.spec);
    let ldap: LDAPIdentityProvider = Api::namespaced(client.clone(), &ns).get("openldap").await?;
    assert_eq!(ldap.spec, parse_yaml::<LDAPIdentityProvider>(&manifests[3])?.spec);
    let ad: ActiveDirectoryIdentityProvider =
        Api::namespaced(client.clone(), &ns).get("ad-for-admins").await?;
    assert_eq!(
        ad.spec,
        parse_yaml::<ActiveDirectoryIdentityProvider>(&manifests[4])?.spec
    );
    let githubs: Api<GitHubIdentityProvider> = Api::namespaced(client.clone(), &ns);
    let dot_com = githubs.get("github-dot-com").await?.spec;
    assert_eq!(dot_com.github_api.host.as_deref(), Some("github.com"));
    assert_eq!(dot_com.claims.username, Some(GitHubUsernameAttribute::LoginAndID));
    assert_eq!(dot_com.claims.groups, Some(GitHubGroupNameAttribute::Slug));
    assert_eq!(
        dot_com.allow_authentication.organizations.policy,
        Some(GitHubAllowedAuthOrganizationsPolicy::AllGitHubUsers)
    );
    let enterprise = githubs.get("github-enterprise").await?.spec;
    assert_eq!(
        enterprise,
        parse_yaml::<GitHubIdentityProvider>(&manifests[6])?.spec
    );

    // The status subresource: a status without a phase reads back Pending, and the OIDCClient's
    // printer columns are Pinniped's.
    let clients: Api<OIDCClient> = Api::namespaced(client.clone(), &ns);
    clients
        .patch_status(
            "client.oauth.pinniped.dev-my-webapp-client",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "totalClientSecrets": 0,
                "conditions": [condition("ClientSecretExists", "False", "NoClientSecretFound", "no secret")],
            }})),
        )
        .await?;
    let rows = cluster
        .kubectl()
        .run(&[
            "get",
            "oidcclients",
            "-n",
            &ns,
            "client.oauth.pinniped.dev-my-webapp-client",
        ])
        .await?;
    let rows: Vec<Vec<&str>> = rows.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows[0],
        [
            "NAME",
            "PRIVILEGED",
            "SCOPES",
            "CLIENT",
            "SECRETS",
            "STATUS",
            "AGE"
        ],
        "{rows:?}"
    );
    assert_eq!(
        rows[1][..4],
        [
            "client.oauth.pinniped.dev-my-webapp-client",
            "pinniped:request-audience",
            "0",
            "Pending"
        ],
        "{rows:?}"
    );

    // What Pinniped's CRDs refuse, kube-apiserver refuses, with the pattern or the CEL rule's own
    // message. (kind, name, spec, expected pieces of kubectl's error)
    let long_org_list = format!(
        "[{}]",
        (0..65).map(|i| format!("org{i}")).collect::<Vec<_>>().join(", ")
    );
    let cases: Vec<(&str, String, String, Vec<&str>)> = vec![
        (
            "OIDCClient",
            "my-webapp-client".into(),
            "{allowedRedirectURIs: ['https://a.example.com/cb'], allowedGrantTypes: [authorization_code], \
             allowedScopes: [openid]}"
                .into(),
            vec![r"should match '^client\.oauth\.pinniped\.dev-'"],
        ),
        (
            "OIDCClient",
            "client.oauth.pinniped.dev-plain-http".into(),
            "{allowedRedirectURIs: ['http://webapp.example.com/callback'], \
             allowedGrantTypes: [authorization_code], allowedScopes: [openid]}"
                .into(),
            vec![
                r#"spec.allowedRedirectURIs[0]: Invalid value: "http://webapp.example.com/callback""#,
                r"should match '^https://.+|^http://(127\.0\.0\.1|\[::1\])(:\d+)?/'",
            ],
        ),
        (
            "OIDCClient",
            "client.oauth.pinniped.dev-client-credentials".into(),
            "{allowedRedirectURIs: ['https://a.example.com/cb'], allowedGrantTypes: [client_credentials], \
             allowedScopes: [openid]}"
                .into(),
            vec![r#"spec.allowedGrantTypes[0]: Unsupported value: "client_credentials""#],
        ),
        (
            "OIDCClient",
            "client.oauth.pinniped.dev-no-scopes".into(),
            "{allowedRedirectURIs: ['https://a.example.com/cb'], allowedGrantTypes: [authorization_code], \
             allowedScopes: []}"
                .into(),
            vec!["spec.allowedScopes: Invalid value", "should have at least 1 items"],
        ),
        (
            "OIDCClient",
            "client.oauth.pinniped.dev-short-tokens".into(),
            "{allowedRedirectURIs: ['https://a.example.com/cb'], allowedGrantTypes: [authorization_code], \
             allowedScopes: [openid], tokenLifetimes: {idTokenSeconds: 60}}"
                .into(),
            vec![
                "spec.tokenLifetimes.idTokenSeconds: Invalid value: 60",
                "should be greater than or equal to 120",
            ],
        ),
        (
            "GitHubIdentityProvider",
            "all-users-and-orgs".into(),
            "{client: {secretName: gh}, allowAuthentication: {organizations: \
             {policy: AllGitHubUsers, allowed: [my-org]}}}"
                .into(),
            vec![GITHUB_ORGANIZATIONS_MESSAGE_ALLOWED_NEEDS_POLICY],
        ),
        (
            // The policy defaults to OnlyUsersFromAllowedOrganizations, which needs organizations.
            "GitHubIdentityProvider",
            "no-orgs".into(),
            "{client: {secretName: gh}, allowAuthentication: {organizations: {}}}".into(),
            vec![GITHUB_ORGANIZATIONS_MESSAGE_POLICY_NEEDS_ALLOWED],
        ),
        (
            "GitHubIdentityProvider",
            "too-many-orgs".into(),
            format!("{{client: {{secretName: gh}}, allowAuthentication: {{organizations: {{allowed: {long_org_list}}}}}}}"),
            vec!["spec.allowAuthentication.organizations.allowed: Too many: 65: must have at most 64 items"],
        ),
        (
            "GitHubIdentityProvider",
            "email-usernames".into(),
            "{client: {secretName: gh}, claims: {username: email}, \
             allowAuthentication: {organizations: {policy: AllGitHubUsers}}}"
                .into(),
            vec![r#"spec.claims.username: Unsupported value: "email""#],
        ),
        (
            "FederationDomain",
            "http-issuer".into(),
            "{issuer: 'http://issuer.example.com'}".into(),
            vec!["spec.issuer: Invalid value", "issuer must be an HTTPS URL"],
        ),
        (
            "FederationDomain",
            "not-a-url".into(),
            "{issuer: 'not a url'}".into(),
            vec!["spec.issuer: Invalid value", "issuer must be an HTTPS URL"],
        ),
        (
            "FederationDomain",
            "bad-constant".into(),
            "{issuer: 'https://issuer.example.com', identityProviders: [{displayName: x, \
             objectRef: {kind: OIDCIdentityProvider, name: okta}, \
             transforms: {constants: [{name: 1st, type: string, stringValue: x}]}}]}"
                .into(),
            vec![
                r#"spec.identityProviders[0].transforms.constants[0].name: Invalid value: "1st""#,
                "should match '^[a-zA-Z][_a-zA-Z0-9]*$'",
            ],
        ),
        (
            "FederationDomain",
            "duplicate-constants".into(),
            "{issuer: 'https://issuer.example.com', identityProviders: [{displayName: x, \
             objectRef: {kind: OIDCIdentityProvider, name: okta}, \
             transforms: {constants: [{name: a, type: string}, {name: a, type: stringList}]}}]}"
                .into(),
            vec!["spec.identityProviders[0].transforms.constants[1]: Duplicate value"],
        ),
        (
            "FederationDomain",
            "policy-v2".into(),
            "{issuer: 'https://issuer.example.com', identityProviders: [{displayName: x, \
             objectRef: {kind: OIDCIdentityProvider, name: okta}, \
             transforms: {expressions: [{type: policy/v2, expression: 'true'}]}}]}"
                .into(),
            vec![r#"spec.identityProviders[0].transforms.expressions[0].type: Unsupported value: "policy/v2""#],
        ),
        (
            "FederationDomain",
            "no-object-ref-name".into(),
            "{issuer: 'https://issuer.example.com', identityProviders: [{displayName: x, \
             objectRef: {kind: OIDCIdentityProvider}}]}"
                .into(),
            vec!["spec.identityProviders[0].objectRef.name: Required value"],
        ),
        (
            "OIDCIdentityProvider",
            "http-issuer".into(),
            "{issuer: 'http://dex.example.com', client: {secretName: c}}".into(),
            vec![r#"spec.issuer: Invalid value: "http://dex.example.com""#, "should match '^https://'"],
        ),
        (
            "OIDCIdentityProvider",
            "no-client".into(),
            "{issuer: 'https://dex.example.com'}".into(),
            vec!["spec.client: Required value"],
        ),
        (
            "LDAPIdentityProvider",
            "empty-bind".into(),
            "{host: 'ldap.example.com', bind: {secretName: ''}}".into(),
            vec![r#"spec.bind.secretName: Invalid value: """#, "at least 1 chars long"],
        ),
        (
            "LDAPIdentityProvider",
            "empty-user-base".into(),
            "{host: 'ldap.example.com', userSearch: {base: ''}}".into(),
            vec![r#"spec.userSearch.base: Invalid value: """#],
        ),
        (
            "ActiveDirectoryIdentityProvider",
            "no-host".into(),
            "{bind: {secretName: ad}}".into(),
            vec!["spec.host: Required value"],
        ),
        (
            "ActiveDirectoryIdentityProvider",
            "pod-ca".into(),
            "{host: 'ad.example.com', tls: {certificateAuthorityDataSource: {kind: Pod, name: n, key: k}}}".into(),
            vec![r#"spec.tls.certificateAuthorityDataSource.kind: Unsupported value: "Pod""#],
        ),
    ];

    let mut failures = Vec::new();
    for (kind, name, spec, expected) in &cases {
        let group = if kind.ends_with("IdentityProvider") {
            "idp.supervisor.pinniped.dev"
        } else {
            "config.supervisor.pinniped.dev"
        };
        let yaml = format!(
            "apiVersion: {group}/v1alpha1\nkind: {kind}\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
        );
        let out = kubectl.output(&["create", "-f", "-"], Some(&yaml)).await?;
        if out.success {
            failures.push(format!(
                "{kind} {name}: accepted, expected rejection with {expected:?}"
            ));
            continue;
        }
        for needle in expected {
            if !out.stderr.contains(needle) {
                failures.push(format!("{kind} {name}: stderr lacks {needle:?}:\n{}", out.stderr));
            }
        }
        let exists = kubectl
            .output(&["get", &kind.to_lowercase(), name.as_str(), "-n", &ns], None)
            .await?;
        if exists.success {
            failures.push(format!("{kind} {name}: rejected, yet it exists"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
