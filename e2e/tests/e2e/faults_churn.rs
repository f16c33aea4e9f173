//! Reliability row "configuration churn" (`perf/results/reliability.md`): the Concierge's
//! authenticators edited ten times a second while users work through its impersonation proxy, on
//! a private cluster with the Concierge installed from `conf/` (its control plane included).
//!
//! The load: a user with a client certificate of the cluster's client CA and a user with a Dex ID
//! token (the JWTAuthenticator `stable`) each list ConfigMaps through the proxy one request after
//! another (kube-rs, 10 s deadline each). The churn, 10 edits a second for 30 s, straight to
//! kube-apiserver: the JWTAuthenticator `churn` alternates between valid specs (a new audience
//! each time) and an invalid one (a CA bundle that is not PEM, which the controller refuses); a
//! WebhookAuthenticator is created, edited and deleted; and `stable` itself is re-specified with
//! the same meaning (its CA bundle with and without a trailing newline, a new generation each
//! time), so the controller rebuilds the authenticator its users depend on.
//!
//! What must hold: no request of either user fails (a rebuilt authenticator replaces the serving
//! one only once it is ready; an invalid spec never replaces a working one); when the churn stops
//! the controller settles on the last specs (the last valid `churn` spec Ready); the Concierge's
//! memory is the same afterwards. The figures (requests, the Concierge's CPU per edit, RSS) are
//! printed for the results page.

use std::{
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
    eventually, Cluster,
};
use serde_json::json;
use tokio::time::Instant;

/// How long the churn lasts, and how often an edit is made.
const CHURN: Duration = Duration::from_secs(30);
const EDIT_EVERY: Duration = Duration::from_millis(100);
/// The deadline of one request through the proxy.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn authenticators(client: &Client, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("authentication.concierge.pinniped.dev", "v1alpha1", kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Lists ConfigMaps in `namespace` through `client` until `stop`: (requests, failures).
fn load(
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
    // (A Role of its own: the aggregated ClusterRoles such as `view` are empty without a
    // controller manager.)
    kubectl
        .run(&[
            "create",
            "role",
            "churn-read",
            "-n",
            &namespace,
            "--verb=list",
            "--resource=configmaps",
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "rolebinding",
            "churn-read",
            "-n",
            &namespace,
            "--role=churn-read",
            "--user=churn-user",
            &format!("--user={}", pinny.email),
        ])
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
