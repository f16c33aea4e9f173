//! Reliability rows "configuration churn" (`perf/results/reliability.md`): configuration edited
//! ten times a second under load, for both servers.
//!
//! The Concierge (a private cluster, installed from `conf/`, its control plane included): a user
//! with a client certificate of the cluster's client CA and a user with a Dex ID token (the
//! JWTAuthenticator `stable`) each list ConfigMaps through the proxy one request after another
//! (kube-rs, 10 s deadline each). The churn, 10 edits a second for 30 s, straight to
//! kube-apiserver: the JWTAuthenticator `churn` alternates between valid specs (a new audience
//! each time) and an invalid one (a CA bundle that is not PEM, which the controller refuses); a
//! WebhookAuthenticator is created, edited and deleted; and `stable` itself is re-specified with
//! the same meaning (its CA bundle with and without a trailing newline, a new generation each
//! time), so the controller rebuilds the authenticator its users depend on. No request may fail
//! (a rebuilt authenticator replaces the serving one only once it is ready; an invalid spec never
//! replaces a working one); the controller settles on the last specs; memory is the same after.
//!
//! The Supervisor: see [`faults_supervisor_configuration_churned_and_signing_key_rotated_under_load_no_login_fails`].
//! The figures (requests, CPU, RSS) are printed for the results page.

use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{ensure, Context as _};
use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    Api, Client,
};
use selkie_e2e::{
    concierge::InstalledConcierge,
    dex::{Dex, DexUser, CLIENT_ID},
    eventually, pinniped_cli,
    proxy::{JwtSpec, Proxy},
    supervisor::Supervisor,
    Cluster,
};
use selkie_oidc::https::HttpsClient;
use serde_json::json;
use tokio::time::Instant;

use crate::supervisor_oauth::{dex_user_namespace, DexUserNamespace, IDP_NAME, PASSWORD};

/// How long the churn lasts, and how often an edit is made.
const CHURN: Duration = Duration::from_secs(30);
const EDIT_EVERY: Duration = Duration::from_millis(100);
/// The deadline of one request through the proxy.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

fn authenticators(client: &Client, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("authentication.concierge.pinniped.dev", "v1alpha1", kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Lists ConfigMaps in `namespace` through `client` until `stop`: (requests, failures).
pub(crate) fn load(
    client: Client,
    namespace: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let configmaps: Api<ConfigMap> = Api::namespaced(client, &namespace);
        let (mut requests, mut failures) = (0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            requests += 1;
            match tokio::time::timeout(REQUEST_DEADLINE, configmaps.list(&Default::default())).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => failures.push(format!("{:#}", anyhow::Error::from(error))),
                Err(_) => failures.push(format!("no answer within {REQUEST_DEADLINE:?}")),
            }
        }
        (requests, failures)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_authenticators_edited_ten_times_a_second_under_load_no_request_fails() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let concierge = InstalledConcierge::install(&cluster).await?;
    let (endpoint, proxy_ca) = concierge.expose_proxy(&cluster).await?;
    let kubectl = cluster.kubectl();
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "faults-churn").await?;
    let pinny = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&pinny)).await?;
    let dex_ca = dex.ca_pem();
    concierge
        .apply_jwt_authenticator(&cluster, "stable", dex.issuer(), CLIENT_ID, &dex_ca)
        .await?;
    kubectl
        .create_role_and_binding(
            &namespace,
            "churn-read",
            "list",
            "configmaps",
            &["--user=churn-user", &format!("--user={}", pinny.email)],
        )
        .await?;
    let certificate = cluster.pki().client_ca.issue_client("churn-user", &[])?;
    let cert_kubeconfig = concierge.dir().join("churn-user.kubeconfig");
    selkie_e2e::cluster::write_kubeconfig(
        &cert_kubeconfig,
        &endpoint,
        &proxy_ca,
        "churn-user",
        &certificate,
    )?;
    let token = dex.password_grant(&pinny.email, &pinny.password).await?.id_token;
    let jwt_kubeconfig = concierge.dir().join("churn-jwt.kubeconfig");
    selkie_e2e::cluster::write_kubeconfig_for_user(
        &jwt_kubeconfig,
        &endpoint,
        &proxy_ca,
        "churn-jwt",
        json!({ "token": token }),
    )?;
    let cert_client = selkie_e2e::cluster::client_from_kubeconfig(&cert_kubeconfig).await?;
    let jwt_client = selkie_e2e::cluster::client_from_kubeconfig(&jwt_kubeconfig).await?;
    // Both users are served before the churn begins.
    for client in [&cert_client, &jwt_client] {
        Api::<ConfigMap>::namespaced(client.clone(), &namespace)
            .list(&Default::default())
            .await
            .context("a user through the proxy before the churn")?;
    }
    let pid = concierge.process().pid();
    let rss_before = selkie_perf::procstat::rss_kib(pid)?;
    let cpu_before = selkie_perf::procstat::cpu_time(pid)?;

    let stop = Arc::new(AtomicBool::new(false));
    let cert_load = load(cert_client, namespace.clone(), stop.clone());
    let jwt_load = load(jwt_client, namespace.clone(), stop.clone());

    let jwts = authenticators(&admin, "JWTAuthenticator");
    let webhooks = authenticators(&admin, "WebhookAuthenticator");
    let apply = PatchParams::apply("faults-churn").force();
    let ca_with_newline = B64.encode(format!("{}\n", dex_ca.trim_end()));
    let ca_without = B64.encode(dex_ca.trim_end());
    let (mut edits, mut refused_edits, mut last_valid_audience) = (0usize, Vec::new(), String::new());
    let began = Instant::now();
    let mut tick = tokio::time::interval(EDIT_EVERY);
    let mut n = 0u32;
    while began.elapsed() < CHURN {
        tick.tick().await;
        n += 1;
        let (api, kind, name, spec) = match n % 4 {
            // `churn`: every fifth of its edits is invalid (a CA bundle that is not PEM).
            0 | 1 if n.is_multiple_of(5) => (
                &jwts,
                "JWTAuthenticator",
                "churn",
                json!({"issuer": dex.issuer(), "audience": format!("aud-{n}"),
                       "tls": {"certificateAuthorityData": B64.encode("not a PEM bundle")}}),
            ),
            0 | 1 => {
                last_valid_audience = format!("aud-{n}");
                (
                    &jwts,
                    "JWTAuthenticator",
                    "churn",
                    json!({"issuer": dex.issuer(), "audience": last_valid_audience,
                           "tls": {"certificateAuthorityData": ca_without}}),
                )
            }
            // The webhook authenticator: a new endpoint each time (nothing listens there).
            2 => (
                &webhooks,
                "WebhookAuthenticator",
                "churn-hook",
                json!({"endpoint": format!("https://127.0.0.1:1/hook-{n}")}),
            ),
            // `stable`, re-specified with the same meaning.
            _ => (
                &jwts,
                "JWTAuthenticator",
                "stable",
                json!({"issuer": dex.issuer(), "audience": CLIENT_ID,
                       "claims": {"username": "email", "groups": "groups"},
                       "tls": {"certificateAuthorityData":
                           if n % 8 == 3 { &ca_with_newline } else { &ca_without }}}),
            ),
        };
        let object = json!({
            "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        });
        match api.patch(name, &apply, &Patch::Apply(object)).await {
            Ok(_) => edits += 1,
            // kube-apiserver's own validation may refuse an edit (that is not the Concierge's).
            Err(error) => refused_edits.push(format!("{error}")),
        }
        // The webhook authenticator is deleted now and then, to be created again.
        if n % 40 == 2 {
            let _ = webhooks.delete("churn-hook", &Default::default()).await;
        }
    }
    let churned_for = began.elapsed();
    let cpu_churn = selkie_perf::procstat::cpu_time(pid)?.saturating_sub(cpu_before);
    let rss_during = selkie_perf::procstat::rss_kib(pid)?;
    stop.store(true, Ordering::Relaxed);
    let (cert_requests, cert_failures) = cert_load.await?;
    let (jwt_requests, jwt_failures) = jwt_load.await?;

    // The controller settles on the last specs.
    let settled = eventually(Duration::from_secs(60), || async {
        let churn = jwts.get("churn").await?;
        let status = churn.data["status"].clone();
        let audience = churn.data["spec"]["audience"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ensure!(
            status["phase"] == "Ready" || audience != last_valid_audience,
            "the last valid spec of `churn` is not Ready: {status}"
        );
        let stable = jwts.get("stable").await?;
        ensure!(
            stable.data["status"]["phase"] == "Ready",
            "`stable`: {}",
            stable.data["status"]
        );
        Ok(audience)
    })
    .await;
    let rss_after = selkie_perf::procstat::rss_kib(pid)?;
    println!(
        "configuration churn: {edits} edits in {churned_for:?} ({} refused by kube-apiserver), Concierge CPU {cpu_churn:?} \
         ({:.2} ms per edit); through the proxy {cert_requests} client-certificate requests ({} failed) and \
         {jwt_requests} JWT requests ({} failed); Concierge RSS {rss_before} / {rss_during} / {rss_after} KiB \
         (before / end of churn / settled)",
        refused_edits.len(),
        cpu_churn.as_secs_f64() * 1000.0 / edits.max(1) as f64,
        cert_failures.len(),
        jwt_failures.len(),
    );
    ensure!(
        cert_failures.is_empty() && jwt_failures.is_empty(),
        "requests failed during the churn: client certificate {cert_failures:?}, JWT {jwt_failures:?}"
    );
    ensure!(
        refused_edits.is_empty(),
        "kube-apiserver refused edits: {refused_edits:?}"
    );
    ensure!(
        edits as f64 >= 0.8 * CHURN.as_secs_f64() / EDIT_EVERY.as_secs_f64(),
        "only {edits} edits in {churned_for:?}"
    );
    ensure!(cert_requests > 50 && jwt_requests > 50, "too little load ran");
    settled.context("the controller did not settle after the churn")?;
    ensure!(
        rss_after < rss_before * 2,
        "the Concierge's memory grew from {rss_before} to {rss_after} KiB"
    );
    Ok(())
}

/// One round of the Supervisor's load: a `cli_password` login, the refresh of its session, and
/// the exchange of its access token for a cluster token that the cluster behind `proxy` accepts
/// (kubectl, every fifth round). Returns the `kid` of the login's ID token (the
/// FederationDomain's signing key); fails naming the first step that failed.
async fn supervisor_round(
    http: &HttpsClient,
    supervisor: &Supervisor,
    email: &str,
    proxy: &Proxy,
    dir: &std::path::Path,
    round: usize,
) -> anyhow::Result<String> {
    let token_url = format!("{}/oauth2/token", supervisor.issuer());
    let tokens = pinniped_cli::login(http, supervisor.issuer(), IDP_NAME, email, PASSWORD)
        .await
        .context("login")?;
    let kid = kid(tokens["id_token"].as_str().context("no ID token")?)?;
    let refresh_token = tokens["refresh_token"].as_str().context("no refresh token")?;
    let (status, refreshed) = pinniped_cli::refresh(http, &token_url, refresh_token).await?;
    ensure!(status == 200, "refresh: {status}: {refreshed}");
    let access = refreshed["access_token"].as_str().context("no access token")?;
    let (status, exchanged) = pinniped_cli::exchange(http, &token_url, AUDIENCE, access).await?;
    ensure!(status == 200, "token exchange: {status}: {exchanged}");
    if round.is_multiple_of(5) {
        let token = exchanged["access_token"].as_str().context("no cluster token")?;
        let path = dir.join("round.kubeconfig");
        selkie_e2e::cluster::write_kubeconfig_for_user(
            &path,
            proxy.url(),
            &proxy.serving_ca().cert_pem(),
            "round",
            json!({ "token": token }),
        )?;
        let out = proxy
            .kubectl(&path)
            .run(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])
            .await
            .context("the cluster with the exchanged token")?;
        ensure!(out.trim() == email, "the cluster saw {out}");
    }
    Ok(kid)
}

/// The `kid` in a JWT's header.
fn kid(jwt: &str) -> anyhow::Result<String> {
    let header = jwt.split('.').next().context("not a JWT")?;
    let header: serde_json::Value = serde_json::from_slice(&B64URL.decode(header)?)?;
    header["kid"].as_str().map(str::to_string).context("no kid")
}

/// The Supervisor's configuration churned under load: its identity provider and FederationDomain
/// re-specified ten times a second for 30 s in all (each a new generation the controllers
/// validate and swap in: an additional authorize parameter, a transform constant), a second
/// identity provider the FederationDomain does not use alternating between valid and invalid
/// specs, and the signing key rotating (every 40 s, the next key published 20 s ahead) while a
/// user logs in, refreshes and exchanges tokens for a cluster that verifies them, one round after
/// another. No round may fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_supervisor_configuration_churned_and_signing_key_rotated_under_load_no_login_fails(
) -> anyhow::Result<()> {
    let DexUserNamespace {
        cluster,
        client,
        namespace,
        email,
        dex,
    } = dex_user_namespace("faults-churn-supervisor", &["seals"], None).await?;
    let supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        &dex,
        IDP_NAME,
        selkie_e2e::free_port()?,
        json!({"signingKeyRotationInterval": "40s"}),
    )
    .await?;
    let proxy = Proxy::start(
        cluster,
        &[JwtSpec {
            name: "supervisor".into(),
            issuer: supervisor.issuer().into(),
            audience: AUDIENCE.into(),
            username_claim: "username".into(),
            groups_claim: "groups".into(),
            ca_pem: supervisor.ca_pem(),
        }],
    )
    .await?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-faults-churn-supervisor-")
        .tempdir()?;
    let http = supervisor.client()?;
    let first_kid = supervisor_round(&http, &supervisor, &email, &proxy, dir.path(), 0)
        .await
        .context("before the churn")?;
    // The signing keys the load's logins were signed with. (Only the load logs in: Dex keeps one
    // refresh token per user and client, so another login of the user would revoke the upstream
    // refresh token of the load's session in flight.)
    let kids = std::sync::Mutex::new(BTreeSet::from([first_kid.clone()]));
    let pid = supervisor.pid();
    let rss_before = selkie_perf::procstat::rss_kib(pid)?;
    let cpu_before = selkie_perf::procstat::cpu_time(pid)?;

    let stop = AtomicBool::new(false);
    let load = async {
        let (mut rounds, mut failures, mut slowest) = (0usize, Vec::new(), Duration::ZERO);
        while !stop.load(Ordering::Relaxed) {
            rounds += 1;
            let began = Instant::now();
            let round = supervisor_round(&http, &supervisor, &email, &proxy, dir.path(), rounds);
            match tokio::time::timeout(Duration::from_secs(30), round).await {
                Ok(Ok(kid)) => {
                    kids.lock().unwrap_or_else(|e| e.into_inner()).insert(kid);
                }
                Ok(Err(error)) => failures.push(format!("round {rounds}: {error:#}")),
                Err(_) => failures.push(format!("round {rounds}: no end within 30 s")),
            }
            slowest = slowest.max(began.elapsed());
        }
        (rounds, failures, slowest)
    };

    let providers = namespaced(&client, &namespace, IDP_GROUP, "OIDCIdentityProvider");
    let domains = namespaced(&client, &namespace, CONFIG_GROUP, "FederationDomain");
    let churn_then_rotation = async {
        let apply = PatchParams::apply("faults-churn").force();
        let (mut edits, mut refused) = (0usize, Vec::new());
        let began = Instant::now();
        let mut tick = tokio::time::interval(EDIT_EVERY);
        let mut n = 0u32;
        while began.elapsed() < CHURN {
            tick.tick().await;
            n += 1;
            let (api, group, kind, name, spec) = match n % 3 {
                // The identity provider the FederationDomain uses, with the same meaning.
                0 => (
                    &providers,
                    IDP_GROUP,
                    "OIDCIdentityProvider",
                    "dex",
                    json!({"issuer": dex.issuer(),
                           "tls": {"certificateAuthorityData": B64.encode(dex.ca_pem())},
                           "client": {"secretName": "dex-client"},
                           "authorizationConfig": {
                               "additionalScopes": ["offline_access", "email", "groups"],
                               "allowPasswordGrant": true,
                               "additionalAuthorizeParameters": [{"name": "churn", "value": format!("{n}")}]},
                           "claims": {"username": "email", "groups": "groups"}}),
                ),
                // The FederationDomain: a transform constant that changes every time.
                1 => (
                    &domains,
                    CONFIG_GROUP,
                    "FederationDomain",
                    "federation-domain",
                    json!({"issuer": supervisor.issuer(),
                           "identityProviders": [{
                               "displayName": IDP_NAME,
                               "objectRef": {"apiGroup": IDP_GROUP, "kind": "OIDCIdentityProvider", "name": "dex"},
                               "transforms": {"constants": [
                                   {"name": "churn", "type": "string", "stringValue": format!("{n}")}]}}]}),
                ),
                // An identity provider nobody uses, valid and invalid (a CA bundle that is not
                // PEM) by turns.
                _ => (
                    &providers,
                    IDP_GROUP,
                    "OIDCIdentityProvider",
                    "unused",
                    json!({"issuer": dex.issuer(),
                           "tls": {"certificateAuthorityData": if n.is_multiple_of(2) {
                               B64.encode(dex.ca_pem())
                           } else {
                               B64.encode("not a PEM bundle")
                           }},
                           "client": {"secretName": "dex-client"}}),
                ),
            };
            let object = json!({
                "apiVersion": format!("{group}/v1alpha1"),
                "kind": kind,
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            });
            match api.patch(name, &apply, &Patch::Apply(object)).await {
                Ok(_) => edits += 1,
                Err(error) => refused.push(format!("{kind} {name}: {error}")),
            }
        }
        let churned_for = began.elapsed();
        // The load goes on until it has been signed for with the next key.
        let rotated = eventually(Duration::from_secs(60), || async {
            let kids = kids.lock().unwrap_or_else(|e| e.into_inner()).clone();
            ensure!(kids.len() >= 2, "still signing with {first_kid} only");
            Ok(())
        })
        .await;
        stop.store(true, Ordering::Relaxed);
        (edits, refused, churned_for, rotated)
    };
    let ((rounds, failures, slowest), (edits, refused, churned_for, rotated)) =
        tokio::join!(load, churn_then_rotation);
    let cpu = selkie_perf::procstat::cpu_time(pid)?.saturating_sub(cpu_before);
    let rss_after = selkie_perf::procstat::rss_kib(pid)?;
    println!(
        "Supervisor configuration churn: {edits} edits in {churned_for:?} ({} refused by kube-apiserver), the \
         load's logins signed with {:?}; {rounds} rounds of login + refresh + token exchange (+ kubectl \
         every fifth), {} failed, slowest {slowest:?}; Supervisor CPU {cpu:?} over the run, RSS {rss_before} / \
         {rss_after} KiB",
        refused.len(),
        kids.lock().unwrap_or_else(|e| e.into_inner()),
        failures.len(),
    );
    ensure!(
        failures.is_empty(),
        "rounds failed during the churn: {failures:#?}"
    );
    ensure!(refused.is_empty(), "kube-apiserver refused edits: {refused:?}");
    ensure!(
        edits as f64 >= 0.8 * CHURN.as_secs_f64() / EDIT_EVERY.as_secs_f64(),
        "only {edits} edits in {churned_for:?}"
    );
    rotated.context("the signing key did not rotate under the load")?;
    ensure!(rounds > 20, "too little load ran: {rounds} rounds");
    ensure!(
        rss_after < rss_before * 2,
        "the Supervisor's memory grew from {rss_before} to {rss_after} KiB"
    );
    Ok(())
}

const IDP_GROUP: &str = "idp.supervisor.pinniped.dev";
const CONFIG_GROUP: &str = "config.supervisor.pinniped.dev";
/// The audience of the cluster the Supervisor's tokens are exchanged for.
const AUDIENCE: &str = "churn-cluster";

/// The namespaced custom resources `kind` of `group` (v1alpha1) in `namespace`.
fn namespaced(client: &Client, namespace: &str, group: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1alpha1", kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk))
}
