//! The Concierge's authenticator reconcilers (`selkie_control_plane::authenticators::run`), run in
//! process against the real kube-apiserver, with a real Dex as the OIDC issuer and kube-apiserver's
//! own TokenReview as the webhook: statuses with Pinniped's conditions and reasons, the published
//! chain authenticating real tokens, GitOps changes within two seconds, bad input, recovery.
//!
//! Isolation: the reconcilers watch every authenticator of their API group, cluster-wide, and the
//! leader writes statuses, so they cannot share a cluster with other modules' authenticators
//! (crds.rs sets and checks statuses of its own). And CRDs of a second group suffix in the shared
//! cluster would make kubectl's short names (`kubectl get jwtauthenticator x`) ambiguous for
//! every other test: kubectl may pick either group (checked: it picked the suffixed one). So this
//! module starts one private cluster, installs the two authentication CRDs under its own
//! `apiGroupSuffix` (which proves the suffix works end to end), and runs **one** control plane
//! for all its tests, on a thread of its own, with one namespace for CA Secrets and ConfigMaps;
//! every test names its objects uniquely and looks only at its own authenticators.

use std::{sync::Arc, time::Duration};

use anyhow::{bail, ensure, Context};
use base64::{engine::general_purpose::STANDARD, Engine as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{
    api::{Api, DynamicObject},
    core::ApiResource,
};
use selkie_api::authentication::{JWTAuthenticator, WebhookAuthenticator};
use selkie_control_plane::{authenticators, config::ControlPlaneConfig, published::Publisher};
use selkie_e2e::{
    dex::{Dex, DexUser, CLIENT_ID},
    Cluster,
};
use selkie_filters::{
    chain::{Decision, TokenAuthenticator},
    identity::{Credential, Identity},
    outcome::RejectReason,
};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::eventually;

/// This module's own API group suffix.
const SUFFIX: &str = "zz-authenticators.selkie.test";
/// The field manager of the CRD installation.
/// How long a status may take to settle.
const SETTLE: Duration = Duration::from_secs(30);

/// The cluster and control plane all tests of this module share.
struct ControlPlane {
    cluster: Cluster,
    publisher: Publisher,
    config: ControlPlaneConfig,
}

static CONTROL_PLANE: OnceCell<Result<ControlPlane, String>> = OnceCell::const_new();

/// Installs the CRDs (once) and starts the shared control plane (once).
async fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    CONTROL_PLANE
        .get_or_init(|| async { start_control_plane().await.map_err(|e| format!("{e:#}")) })
        .await
        .as_ref()
        .map_err(|e| anyhow::anyhow!("starting the shared control plane: {e}"))
}

async fn start_control_plane() -> anyhow::Result<ControlPlane> {
    let cluster = Cluster::start().await?;
    install_crds(&cluster, SUFFIX).await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "authenticators").await?;
    let config = ControlPlaneConfig {
        namespace,
        api_group_suffix: SUFFIX.into(),
        ..ControlPlaneConfig::default()
    };
    config.validate()?;
    let publisher = Publisher::new();
    // Each test has its own tokio runtime, which ends with the test: the control plane lives on
    // a runtime of its own, for the whole test process.
    let (kubeconfig, thread_config, thread_publisher) = (
        cluster.admin_kubeconfig().to_path_buf(),
        Arc::new(config.clone()),
        publisher.clone(),
    );
    std::thread::Builder::new()
        .name("authenticators-control-plane".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => return eprintln!("control plane runtime: {e}"),
            };
            runtime.block_on(async move {
                let client = match selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await {
                    Ok(client) => client,
                    Err(e) => return eprintln!("control plane client: {e}"),
                };
                let (_leader, is_leader) = tokio::sync::watch::channel(true);
                if let Err(e) = authenticators::run(client, thread_config, thread_publisher, is_leader).await
                {
                    eprintln!("the authenticator reconcilers stopped: {e}");
                }
            });
        })?;
    Ok(ControlPlane {
        cluster,
        publisher,
        config,
    })
}

/// Server-side applies the authentication CRDs under `suffix` and waits until they are
/// Established.
async fn install_crds(cluster: &Cluster, suffix: &str) -> anyhow::Result<()> {
    let documents: Vec<String> = selkie_api::crds::render_all(suffix)?
        .into_iter()
        .filter(|(file, _)| file.starts_with("authentication."))
        .map(|(_, yaml)| yaml)
        .collect();
    ensure!(documents.len() == 2, "expected the two authenticator CRDs");
    selkie_e2e::crds::apply(cluster, &["-f", "-"], Some(&documents.join("---\n"))).await?;
    Ok(())
}

impl ControlPlane {
    fn group(&self) -> String {
        format!("authentication.concierge.{SUFFIX}")
    }

    fn namespace(&self) -> &str {
        &self.config.namespace
    }

    fn resource(&self, kind: Kind) -> ApiResource {
        match kind {
            Kind::Jwt => self.config.api_resource::<JWTAuthenticator>(),
            Kind::Webhook => self.config.api_resource::<WebhookAuthenticator>(),
        }
    }

    /// `kubectl apply -f -`, retried while discovery catches up with the new CRDs.
    async fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let kubectl = self.cluster.kubectl();
        eventually(Duration::from_secs(20), || async {
            Ok(kubectl.run_with_stdin(&["apply", "-f", "-"], Some(yaml)).await?)
        })
        .await?;
        Ok(())
    }

    /// A JWTAuthenticator manifest; `extra` is more YAML under `spec` (indented by two).
    fn jwt_yaml(&self, name: &str, issuer: &str, audience: &str, extra: &str) -> String {
        format!(
            "apiVersion: {}/v1alpha1\nkind: JWTAuthenticator\nmetadata:\n  name: {name}\nspec:\n  issuer: {issuer}\n  audience: {audience}\n{extra}",
            self.group()
        )
    }

    fn webhook_yaml(&self, name: &str, endpoint: &str, extra: &str) -> String {
        format!(
            "apiVersion: {}/v1alpha1\nkind: WebhookAuthenticator\nmetadata:\n  name: {name}\nspec:\n  endpoint: {endpoint}\n{extra}",
            self.group()
        )
    }

    async fn object(&self, kind: Kind, name: &str) -> anyhow::Result<DynamicObject> {
        let client = self.cluster.client().await?;
        let api: Api<DynamicObject> = Api::all_with(client, &self.resource(kind));
        Ok(api.get(name).await?)
    }

    /// Waits until the status of `name` has phase `phase` and exactly the conditions `expected`
    /// (type, status, reason), every one observing the current generation. Returns them.
    async fn wait_for_status(
        &self,
        kind: Kind,
        name: &str,
        phase: &str,
        expected: &[(&str, &str, &str)],
    ) -> anyhow::Result<Vec<Condition>> {
        let mut expected: Vec<(String, String, String)> = expected
            .iter()
            .map(|(t, s, r)| (t.to_string(), s.to_string(), r.to_string()))
            .collect();
        expected.sort();
        eventually(SETTLE, || async {
            let object = self.object(kind, name).await?;
            let status = object.data.get("status").cloned().unwrap_or(Value::Null);
            let conditions: Vec<Condition> =
                serde_json::from_value(status.get("conditions").cloned().unwrap_or(Value::Null))
                    .unwrap_or_default();
            let mut found: Vec<(String, String, String)> = conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                .collect();
            found.sort();
            let found_phase = status.get("phase").and_then(Value::as_str).unwrap_or_default();
            ensure!(
                found_phase == phase && found == expected,
                "{name}: phase {found_phase:?}, conditions {conditions:#?}"
            );
            ensure!(
                conditions
                    .iter()
                    .all(|c| c.observed_generation == object.metadata.generation),
                "{name}: a condition observed another generation than {:?}: {conditions:#?}",
                object.metadata.generation
            );
            Ok(conditions)
        })
        .await
    }

    /// The published authenticator named `name`, if any.
    fn published(&self, name: &str) -> Option<TokenAuthenticator> {
        self.publisher
            .current()
            .chain
            .token_authenticators()
            .iter()
            .find(|a| &**a.name() == name)
            .cloned()
    }

    /// What the published chain decides for `token`.
    async fn authenticate(&self, token: &str) -> Decision {
        let chain = self.publisher.current().chain.clone();
        chain.authenticate(Credential::BearerToken(token)).await
    }

    /// Waits until the published chain authenticates `token` by the authenticator `name`.
    async fn wait_authenticated_by(
        &self,
        name: &str,
        token: &str,
        timeout: Duration,
    ) -> anyhow::Result<Arc<Identity>> {
        eventually(timeout, || async {
            match self.authenticate(token).await {
                Decision::Authenticated(identity) if &*identity.authenticator == name => Ok(identity),
                other => bail!("not authenticated by {name}: {other:?}"),
            }
        })
        .await
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Jwt,
    Webhook,
}

/// A name for this test's objects: `<prefix>-<random>` (Kubernetes generates the random part).
async fn unique(control_plane: &ControlPlane, prefix: &str) -> anyhow::Result<String> {
    let client = control_plane.cluster.client().await?;
    Ok(control_plane.cluster.create_namespace(&client, prefix).await?)
}

const ALL_JWT_TRUE: &[(&str, &str, &str)] = &[
    ("AuthenticatorValid", "True", "Success"),
    ("DiscoveryURLValid", "True", "Success"),
    ("IssuerURLValid", "True", "Success"),
    ("JWKSFetchValid", "True", "Success"),
    ("JWKSURLValid", "True", "Success"),
    ("Ready", "True", "Success"),
    ("TLSConfigurationValid", "True", "Success"),
];

/// `spec.tls` with the CA inline.
fn inline_ca(pem: &str) -> String {
    format!("  tls:\n    certificateAuthorityData: {}\n", STANDARD.encode(pem))
}

/// `spec.tls` naming a Secret or ConfigMap.
fn ca_source(kind: &str, name: &str, key: &str) -> String {
    format!("  tls:\n    certificateAuthorityDataSource:\n      kind: {kind}\n      name: {name}\n      key: {key}\n")
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> anyhow::Result<&'a Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .with_context(|| format!("no {type_} condition"))
}

#[tokio::test]
async fn jwt_authenticators_trusting_dex_inline_from_a_secret_and_from_a_config_map_authenticate_dex_users(
) -> anyhow::Result<()> {
    let control_plane = control_plane().await?;
    let user = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let id = unique(control_plane, "jwt-ready").await?;
    let kubectl = control_plane.cluster.kubectl();
    let ns = control_plane.namespace();
    let ca = dex.ca_pem();
    kubectl
        .run(&[
            "create",
            "secret",
            "generic",
            &format!("{id}-ca"),
            "-n",
            ns,
            &format!("--from-literal=ca.crt={ca}"),
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "configmap",
            &format!("{id}-ca"),
            "-n",
            ns,
            &format!("--from-literal=bundle.pem={ca}"),
        ])
        .await?;

    let claims = "  claims:\n    username: email\n";
    let cases = [
        (format!("{id}-inline"), inline_ca(&ca)),
        (
            format!("{id}-secret"),
            ca_source("Secret", &format!("{id}-ca"), "ca.crt"),
        ),
        (
            format!("{id}-configmap"),
            ca_source("ConfigMap", &format!("{id}-ca"), "bundle.pem"),
        ),
    ];
    for (name, tls) in &cases {
        control_plane
            .apply(&control_plane.jwt_yaml(name, dex.issuer(), CLIENT_ID, &format!("{claims}{tls}")))
            .await?;
    }
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    for (name, _) in &cases {
        let conditions = control_plane
            .wait_for_status(Kind::Jwt, name, "Ready", ALL_JWT_TRUE)
            .await?;
        assert_eq!(
            condition(&conditions, "TLSConfigurationValid")?.message,
            "spec.tls is valid: using configured CA bundle"
        );
        assert_eq!(
            condition(&conditions, "Ready")?.message,
            "the JWTAuthenticator is ready"
        );
        assert_eq!(
            condition(&conditions, "JWKSFetchValid")?.message,
            "successfully fetched jwks"
        );
        let authenticator = control_plane
            .published(name)
            .with_context(|| format!("{name} is Ready but not published"))?;
        let TokenAuthenticator::Jwt(jwt) = &authenticator else {
            bail!("{name} is published as {authenticator:?}")
        };
        let outcome = jwt.authenticate(&token).await;
        let selkie_filters::outcome::Outcome::Authenticated(identity) = outcome else {
            bail!("{name} refused Dex's ID token: {outcome:?}")
        };
        assert_eq!(identity.user.username, user.email, "{name}");
        assert_eq!(identity.user.groups, user.groups, "{name}");
        assert_eq!(&*identity.authenticator, name.as_str());
    }
    // Through the whole chain, as the proxy and the TokenCredentialRequest API call it: the first
    // of these authenticators by name wins.
    let identity = control_plane
        .wait_authenticated_by(&cases[2].0, &token, Duration::from_secs(5))
        .await?;
    assert_eq!(identity.user.username, user.email);
    Ok(())
}

/// The structured-authentication fields of the CR (CEL mappings and rules) reach the filter.
#[tokio::test]
async fn cel_claim_mappings_and_validation_rules_of_the_cr_apply_to_dex_tokens() -> anyhow::Result<()> {
    let control_plane = control_plane().await?;
    let user = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let id = unique(control_plane, "jwt-cel").await?;
    let spec = format!(
        "  claims:\n    usernameExpression: \"claims.email_verified ? 'dex:' + claims.email : ''\"\n    \
         groupsExpression: \"claims.groups.map(g, 'dex:' + g)\"\n    extra:\n    - key: example.com/issuer\n      \
         valueExpression: claims.iss\n  claimValidationRules:\n  - expression: \"claims.email.endsWith('@example.com')\"\n    \
         message: only example.com accounts\n  userValidationRules:\n  - expression: \"'dex:ops' in user.groups\"\n    \
         message: operators only\n{}",
        inline_ca(&dex.ca_pem())
    );
    let name = format!("{id}-cel");
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &spec))
        .await?;
    control_plane
        .wait_for_status(Kind::Jwt, &name, "Ready", ALL_JWT_TRUE)
        .await?;
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    let identity = control_plane
        .wait_authenticated_by(&name, &token, Duration::from_secs(5))
        .await?;
    assert_eq!(identity.user.username, format!("dex:{}", user.email));
    assert_eq!(identity.user.groups, ["dex:ops", "dex:devs"]);
    assert_eq!(
        identity.user.extra.get("example.com/issuer"),
        Some(&vec![dex.issuer().to_string()])
    );

    // A rule this user fails: the spec is valid, the token is refused by the rule.
    let admins_only = spec.replace("'dex:ops' in user.groups", "'dex:admins' in user.groups");
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &admins_only))
        .await?;
    eventually(Duration::from_secs(5), || async {
        match control_plane.authenticate(&token).await {
            Decision::Unauthenticated(refusals)
                if refusals.contains(&(name.as_str().into(), RejectReason::ValidationRuleFailed)) =>
            {
                Ok(())
            }
            other => bail!("expected {name} to refuse by its rule: {other:?}"),
        }
    })
    .await?;

    // An expression that does not compile: AuthenticatorValid says why, discovery still ran, and
    // the last valid form (the admins-only rule) keeps serving.
    let broken = spec.replace("claims.groups.map(g, 'dex:' + g)", "claims.groups.map(g, ");
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &broken))
        .await?;
    let conditions = control_plane
        .wait_for_status(
            Kind::Jwt,
            &name,
            "Error",
            &[
                ("AuthenticatorValid", "False", "InvalidAuthenticator"),
                ("DiscoveryURLValid", "True", "Success"),
                ("IssuerURLValid", "True", "Success"),
                ("JWKSFetchValid", "True", "Success"),
                ("JWKSURLValid", "True", "Success"),
                ("Ready", "False", "NotReady"),
                ("TLSConfigurationValid", "True", "Success"),
            ],
        )
        .await?;
    let message = &condition(&conditions, "AuthenticatorValid")?.message;
    assert!(
        message.starts_with("could not initialize oidc authenticator: ") && message.contains("groups"),
        "{message}"
    );
    assert!(
        control_plane.published(&name).is_some(),
        "the last valid form keeps serving"
    );
    Ok(())
}

/// GitOps: `kubectl apply` of a changed audience takes effect (both ways), and a deleted CR
/// leaves the chain, within 10 s of kubectl's answer; the time each took is printed (tens of
/// milliseconds on a quiet machine). The deadline is a poll limit, not a latency target: on CI's
/// loaded machine (four e2e tests and a fuzz build at once) 2 s, measured with kubectl's own run
/// time, was missed once.
#[tokio::test]
async fn applied_audience_changes_and_deletion_take_effect_within_ten_seconds() -> anyhow::Result<()> {
    let control_plane = control_plane().await?;
    let user = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let id = unique(control_plane, "jwt-gitops").await?;
    let name = format!("{id}-gitops");
    let spec = format!("  claims:\n    username: email\n{}", inline_ca(&dex.ca_pem()));
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    let wrong_audience = |decision: &Decision| {
        matches!(decision, Decision::Unauthenticated(refusals)
            if refusals.contains(&(name.as_str().into(), RejectReason::WrongAudience)))
    };

    // Another cluster's audience: Ready, but Dex's tokens (audience = its client id) are refused.
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), "another-cluster", &spec))
        .await?;
    control_plane
        .wait_for_status(Kind::Jwt, &name, "Ready", ALL_JWT_TRUE)
        .await?;
    let decision = control_plane.authenticate(&token).await;
    assert!(wrong_audience(&decision), "{decision:?}");

    for (audience, accepted) in [(CLIENT_ID, true), ("another-cluster", false)] {
        control_plane
            .apply(&control_plane.jwt_yaml(&name, dex.issuer(), audience, &spec))
            .await?;
        let applied = tokio::time::Instant::now();
        loop {
            let decision = control_plane.authenticate(&token).await;
            let done = match &decision {
                Decision::Authenticated(identity) => accepted && &*identity.authenticator == name.as_str(),
                other => !accepted && wrong_audience(other),
            };
            if done {
                break;
            }
            ensure!(
                applied.elapsed() < Duration::from_secs(10),
                "audience {audience} not in effect 10 s after kubectl apply: {decision:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "audience {audience} in effect {:?} after kubectl apply",
            applied.elapsed()
        );
    }

    control_plane
        .cluster
        .kubectl()
        .run(&[
            "delete",
            &format!("jwtauthenticators.{}", control_plane.group()),
            &name,
            "--wait=false",
        ])
        .await?;
    let deleted = tokio::time::Instant::now();
    while control_plane.published(&name).is_some() {
        ensure!(
            deleted.elapsed() < Duration::from_secs(10),
            "{name} still published 10 s after kubectl delete"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{name} removed {:?} after kubectl delete", deleted.elapsed());
    Ok(())
}

/// The conditions of a JWTAuthenticator whose `failed` condition is False with `reason`: the
/// ones before it True, the ones after it Unknown (`TLSConfigurationValid` and `IssuerURLValid`
/// are independent of each other, as in Pinniped).
fn jwt_failure(
    failed: &'static str,
    reason: &'static str,
) -> Vec<(&'static str, &'static str, &'static str)> {
    let order = [
        "TLSConfigurationValid",
        "IssuerURLValid",
        "DiscoveryURLValid",
        "JWKSURLValid",
        "JWKSFetchValid",
        "AuthenticatorValid",
    ];
    let position = order.iter().position(|t| *t == failed).unwrap_or(order.len());
    let mut expected: Vec<_> = order
        .iter()
        .enumerate()
        .map(|(i, t)| match i {
            _ if i == position => (*t, "False", reason),
            // The two first checks do not depend on each other.
            0 | 1 => (*t, "True", "Success"),
            _ if i < position => (*t, "True", "Success"),
            _ => (*t, "Unknown", "UnableToValidate"),
        })
        .collect();
    expected.push(("Ready", "False", "NotReady"));
    expected
}

/// A bad JWTAuthenticator: name, issuer, `spec.tls`, the failed condition, its reason, and its
/// exact message (`Ok`) or the prefix of its message (`Err`).
type BadCase = (
    String,
    String,
    String,
    &'static str,
    &'static str,
    Result<String, &'static str>,
);

#[tokio::test]
async fn bad_jwt_authenticators_get_pinnipeds_conditions_and_reasons() -> anyhow::Result<()> {
    let control_plane = control_plane().await?;
    let dex = Dex::start(&[DexUser::pinny()]).await?;
    let id = unique(control_plane, "jwt-bad").await?;
    let ns = control_plane.namespace();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let discovery_failed = "could not perform oidc discovery on provider issuer: ";
    // (name, issuer, spec.tls, failed condition, reason, exact message or message prefix)
    let cases: Vec<BadCase> = vec![
        (
            format!("{id}-unreachable"),
            format!("https://127.0.0.1:{closed_port}/issuer"),
            String::new(),
            "DiscoveryURLValid",
            "InvalidDiscoveryProbe",
            Err(discovery_failed),
        ),
        (
            format!("{id}-well-known"),
            format!("{}/.well-known/openid-configuration", dex.issuer()),
            inline_ca(&dex.ca_pem()),
            "IssuerURLValid",
            "InvalidIssuerURLContainsWellKnownEndpoint",
            Ok(format!(
                "spec.issuer {}/.well-known/openid-configuration cannot include path '/.well-known/openid-configuration'",
                dex.issuer()
            )),
        ),
        (
            format!("{id}-wrong-ca"),
            dex.issuer().to_string(),
            // A real CA, but not the one that signed Dex's certificate.
            inline_ca(&control_plane.cluster.pki().server_ca.cert_pem()),
            "DiscoveryURLValid",
            "InvalidDiscoveryProbe",
            Err(discovery_failed),
        ),
        (
            format!("{id}-no-secret"),
            dex.issuer().to_string(),
            ca_source("Secret", &format!("{id}-missing"), "ca.crt"),
            "TLSConfigurationValid",
            "InvalidTLSConfig",
            Ok(format!(
                "spec.tls.certificateAuthorityDataSource is invalid: failed to get secret \"{ns}/{id}-missing\": secret \"{id}-missing\" not found"
            )),
        ),
        (
            format!("{id}-garbage-ca"),
            dex.issuer().to_string(),
            "  tls:\n    certificateAuthorityData: 'this is not base64!'\n".into(),
            "TLSConfigurationValid",
            "InvalidTLSConfig",
            Ok("spec.tls.certificateAuthorityData is invalid: illegal base64 data at input byte 4".into()),
        ),
    ];
    for (name, issuer, tls, ..) in &cases {
        control_plane
            .apply(&control_plane.jwt_yaml(name, issuer, CLIENT_ID, tls))
            .await?;
    }
    for (name, _, _, failed, reason, message) in &cases {
        let conditions = control_plane
            .wait_for_status(Kind::Jwt, name, "Error", &jwt_failure(failed, reason))
            .await
            .with_context(|| name.clone())?;
        let found = &condition(&conditions, failed)?.message;
        match message {
            Ok(message) => assert_eq!(found, message, "{name}"),
            Err(prefix) => assert!(found.starts_with(prefix), "{name}: {found}"),
        }
        assert_eq!(
            condition(&conditions, "Ready")?.message,
            "the JWTAuthenticator is not ready: see other conditions for details"
        );
        assert!(
            control_plane.published(name).is_none(),
            "{name} is invalid yet published"
        );
    }
    let wrong_ca = control_plane
        .wait_for_status(
            Kind::Jwt,
            &cases[2].0,
            "Error",
            &jwt_failure("DiscoveryURLValid", "InvalidDiscoveryProbe"),
        )
        .await?;
    let message = &condition(&wrong_ca, "DiscoveryURLValid")?.message;
    assert!(message.to_lowercase().contains("certificate"), "{message}");

    // The missing Secret appears: the authenticator that names it is validated again, unchanged.
    control_plane
        .cluster
        .kubectl()
        .run(&[
            "create",
            "secret",
            "generic",
            &format!("{id}-missing"),
            "-n",
            ns,
            &format!("--from-literal=ca.crt={}", dex.ca_pem()),
        ])
        .await?;
    control_plane
        .wait_for_status(Kind::Jwt, &cases[3].0, "Ready", ALL_JWT_TRUE)
        .await?;
    assert!(control_plane.published(&cases[3].0).is_some());
    Ok(())
}

/// An invalid update of a working CR: its status says Error and why, its last valid form keeps
/// authenticating. Then an issuer that goes down and comes back: Ready again, no change to the CR.
#[tokio::test]
async fn a_broken_update_keeps_the_last_valid_form_and_a_recovering_issuer_turns_ready() -> anyhow::Result<()>
{
    let control_plane = control_plane().await?;
    let user = DexUser::pinny();
    let mut dex = Dex::start(std::slice::from_ref(&user)).await?;
    let id = unique(control_plane, "jwt-keep").await?;
    let name = format!("{id}-keep");
    let claims = "  claims:\n    username: email\n";
    let good = format!("{claims}{}", inline_ca(&dex.ca_pem()));
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &good))
        .await?;
    control_plane
        .wait_for_status(Kind::Jwt, &name, "Ready", ALL_JWT_TRUE)
        .await?;
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    control_plane
        .wait_authenticated_by(&name, &token, Duration::from_secs(5))
        .await?;

    // Garbage CA data: Error with the reason, and the previous form still authenticates.
    let garbage = format!("{claims}  tls:\n    certificateAuthorityData: '%%%'\n");
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &garbage))
        .await?;
    control_plane
        .wait_for_status(
            Kind::Jwt,
            &name,
            "Error",
            &jwt_failure("TLSConfigurationValid", "InvalidTLSConfig"),
        )
        .await?;
    control_plane
        .wait_authenticated_by(&name, &token, Duration::from_secs(1))
        .await
        .context("the last valid form must keep serving")?;

    // Back to the good spec, then the issuer goes down, the CR is recreated while it is down
    // (so it must be probed again), and the issuer comes back.
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &good))
        .await?;
    control_plane
        .wait_for_status(Kind::Jwt, &name, "Ready", ALL_JWT_TRUE)
        .await?;
    kill_dex(&dex)?;
    let kubectl = control_plane.cluster.kubectl();
    kubectl
        .run(&[
            "delete",
            &format!("jwtauthenticators.{}", control_plane.group()),
            &name,
        ])
        .await?;
    control_plane
        .apply(&control_plane.jwt_yaml(&name, dex.issuer(), CLIENT_ID, &good))
        .await?;
    let down = control_plane
        .wait_for_status(
            Kind::Jwt,
            &name,
            "Error",
            &jwt_failure("DiscoveryURLValid", "InvalidDiscoveryProbe"),
        )
        .await?;
    let generation = control_plane.object(Kind::Jwt, &name).await?.metadata.generation;
    assert!(
        control_plane.published(&name).is_none(),
        "a recreated CR starts from nothing"
    );
    assert!(
        condition(&down, "DiscoveryURLValid")?
            .message
            .contains(&format!("{}/.well-known/openid-configuration", dex.issuer())),
        "{down:#?}"
    );

    dex.restart().await?;
    control_plane
        .wait_for_status(Kind::Jwt, &name, "Ready", ALL_JWT_TRUE)
        .await
        .context("the issuer is back: the retried reconcile must find it")?;
    assert_eq!(
        control_plane.object(Kind::Jwt, &name).await?.metadata.generation,
        generation,
        "nothing changed the CR"
    );
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    control_plane
        .wait_authenticated_by(&name, &token, Duration::from_secs(5))
        .await?;
    Ok(())
}

/// Each CR is probed on its own: an issuer that accepts connections and never answers does not
/// delay the publication of another authenticator.
#[tokio::test]
async fn a_hanging_issuer_does_not_delay_other_authenticators() -> anyhow::Result<()> {
    let control_plane = control_plane().await?;
    let user = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let id = unique(control_plane, "jwt-hang").await?;
    // Accepts every connection and holds it, silent, for the rest of the test.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            connections.push(connection);
        }
    });
    let hanging = format!("{id}-hanging");
    control_plane
        .apply(&control_plane.jwt_yaml(
            &hanging,
            &format!("https://127.0.0.1:{port}/issuer"),
            CLIENT_ID,
            "",
        ))
        .await?;
    // Give the hanging probe time to start before the good CR arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let good = format!("{id}-good");
    let started = tokio::time::Instant::now();
    control_plane
        .apply(&control_plane.jwt_yaml(
            &good,
            dex.issuer(),
            CLIENT_ID,
            &format!("  claims:\n    username: email\n{}", inline_ca(&dex.ca_pem())),
        ))
        .await?;
    while control_plane.published(&good).is_none() {
        ensure!(
            started.elapsed() < Duration::from_secs(2),
            "{good} not published within 2 s while {hanging} hangs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{good} published {:?} after kubectl apply", started.elapsed());
    let status = control_plane
        .object(Kind::Jwt, &hanging)
        .await?
        .data
        .get("status")
        .cloned();
    assert!(
        status.is_none(),
        "the hanging issuer's probe should still be running (no status yet): {status:?}"
    );
    held.abort();
    Ok(())
}

/// Kills the Dex process serving `dex` (found by its issuer in its configuration file), so that
/// its port refuses connections until [`Dex::restart`].
fn kill_dex(dex: &Dex) -> anyhow::Result<()> {
    let needle = format!("\"issuer\":\"{}\"", dex.issuer());
    for entry in std::fs::read_dir("/proc")? {
        let path = entry?.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_dex =
            args.first().is_some_and(|a| a.ends_with("dex")) && args.get(1).is_some_and(|a| a == "serve");
        let serves_this = args
            .get(2)
            .and_then(|config| std::fs::read_to_string(config).ok())
            .is_some_and(|config| config.replace(' ', "").contains(&needle));
        if is_dex && serves_this {
            let pid: i32 = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
                .context("a /proc entry without a pid")?;
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)?;
            return Ok(());
        }
    }
    bail!("no Dex process serves {}", dex.issuer())
}

/// A WebhookAuthenticator pointing at kube-apiserver's own TokenReview endpoint authenticates a
/// real service-account token through the published chain; an unreachable one says why.
#[tokio::test]
async fn a_webhook_authenticator_on_kube_apiservers_token_review_authenticates_service_accounts(
) -> anyhow::Result<()> {
    let control_plane = control_plane().await?;
    let cluster = &control_plane.cluster;
    let id = unique(control_plane, "webhook").await?;
    let kubectl = cluster.kubectl();
    // Pinniped's WebhookAuthenticator sends no credential: let unauthenticated callers review.
    kubectl
        .run(&[
            "create",
            "clusterrolebinding",
            &format!("{id}-anonymous-tokenreview"),
            "--clusterrole=system:auth-delegator",
            "--group=system:unauthenticated",
        ])
        .await?;
    kubectl
        .run(&["create", "serviceaccount", "robot", "-n", &id])
        .await?;
    let token = kubectl
        .run(&["create", "token", "robot", "-n", &id, "--duration=10m"])
        .await?
        .trim()
        .to_string();

    let name = format!("{id}-apiserver");
    let endpoint = format!(
        "{}/apis/authentication.k8s.io/v1/tokenreviews",
        cluster.server_url()
    );
    control_plane
        .apply(&control_plane.webhook_yaml(&name, &endpoint, &inline_ca(&cluster.pki().server_ca.cert_pem())))
        .await?;
    let conditions = control_plane
        .wait_for_status(
            Kind::Webhook,
            &name,
            "Ready",
            &[
                ("AuthenticatorValid", "True", "Success"),
                ("EndpointURLValid", "True", "Success"),
                ("Ready", "True", "Success"),
                ("TLSConfigurationValid", "True", "Success"),
                ("WebhookConnectionValid", "True", "Success"),
            ],
        )
        .await?;
    assert_eq!(
        condition(&conditions, "WebhookConnectionValid")?.message,
        "successfully dialed webhook server"
    );
    assert_eq!(
        condition(&conditions, "Ready")?.message,
        "the WebhookAuthenticator is ready"
    );
    let identity = control_plane
        .wait_authenticated_by(&name, &token, Duration::from_secs(5))
        .await?;
    assert_eq!(
        identity.user.username,
        format!("system:serviceaccount:{id}:robot")
    );
    assert!(
        identity
            .user
            .groups
            .contains(&format!("system:serviceaccounts:{id}")),
        "{:?}",
        identity.user.groups
    );

    // The chain's order: every JWT authenticator before every webhook, each kind by name.
    let chain = control_plane.publisher.current().chain.clone();
    let order: Vec<(bool, String)> = chain
        .token_authenticators()
        .iter()
        .map(|a| {
            (
                matches!(a, TokenAuthenticator::TokenReview(_)),
                a.name().to_string(),
            )
        })
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "JWT first, then webhooks, each sorted by name");

    // Nobody listens on this port: UnableToDialServer, and nothing is published.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let unreachable = format!("{id}-unreachable");
    control_plane
        .apply(&control_plane.webhook_yaml(
            &unreachable,
            &format!("https://127.0.0.1:{closed_port}/authenticate"),
            "",
        ))
        .await?;
    let conditions = control_plane
        .wait_for_status(
            Kind::Webhook,
            &unreachable,
            "Error",
            &[
                ("AuthenticatorValid", "Unknown", "UnableToValidate"),
                ("EndpointURLValid", "True", "Success"),
                ("Ready", "False", "NotReady"),
                ("TLSConfigurationValid", "True", "Success"),
                ("WebhookConnectionValid", "False", "UnableToDialServer"),
            ],
        )
        .await?;
    let message = &condition(&conditions, "WebhookConnectionValid")?.message;
    assert!(
        message.starts_with(&format!("cannot dial server: dial tcp 127.0.0.1:{closed_port}: ")),
        "{message}"
    );
    assert!(control_plane.published(&unreachable).is_none());
    assert_eq!(
        condition(&conditions, "TLSConfigurationValid")?.message,
        "spec.tls is valid: no TLS configuration provided: using default root CA bundle from container image"
    );
    Ok(())
}

/// A replica that is not the leader publishes but writes no status; once it becomes leader it
/// writes the statuses of every CR. Run with its own API group suffix, so that the module's
/// shared (leading) control plane does not see these CRs.
#[tokio::test]
async fn only_the_leader_writes_statuses_and_a_new_leader_writes_them_all() -> anyhow::Result<()> {
    const LEADER_SUFFIX: &str = "zz-leader.selkie.test";
    let control_plane = control_plane().await?;
    let cluster = &control_plane.cluster;
    install_crds(cluster, LEADER_SUFFIX).await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "leader").await?;
    let config = ControlPlaneConfig {
        namespace: namespace.clone(),
        api_group_suffix: LEADER_SUFFIX.into(),
        ..ControlPlaneConfig::default()
    };
    let publisher = Publisher::new();
    let (leader, is_leader) = tokio::sync::watch::channel(false);
    let replica = tokio::spawn(authenticators::run(
        client.clone(),
        Arc::new(config.clone()),
        publisher.clone(),
        is_leader,
    ));

    let resource = config.api_resource::<WebhookAuthenticator>();
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let name = format!("{namespace}-apiserver");
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": resource.api_version,
        "kind": "WebhookAuthenticator",
        "metadata": {"name": name},
        "spec": {
            "endpoint": format!("{}/apis/authentication.k8s.io/v1/tokenreviews", cluster.server_url()),
            "tls": {"certificateAuthorityData": STANDARD.encode(cluster.pki().server_ca.cert_pem())},
        },
    }))?;
    eventually(Duration::from_secs(10), || async {
        Ok(api.create(&Default::default(), &object).await?)
    })
    .await?;

    eventually(SETTLE, || async {
        let published = publisher.current();
        ensure!(
            published
                .chain
                .token_authenticators()
                .iter()
                .any(|a| **a.name() == *name),
            "{name} not published yet"
        );
        Ok(())
    })
    .await?;
    // The reconcile that published it has finished: a status it wrote would be there by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = api.get(&name).await?.data.get("status").cloned();
    assert!(
        status.is_none(),
        "a replica that is not the leader wrote a status: {status:?}"
    );

    leader.send(true)?;
    eventually(SETTLE, || async {
        let status = api
            .get(&name)
            .await?
            .data
            .get("status")
            .cloned()
            .unwrap_or_default();
        ensure!(
            status.get("phase").and_then(Value::as_str) == Some("Ready")
                && status
                    .get("conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|conditions| conditions.len() == 5),
            "no Ready status yet: {status}"
        );
        Ok(())
    })
    .await
    .context("the new leader must write the status")?;
    replica.abort();
    Ok(())
}
