//! The Supervisor as an admin runs it: `helm install` of `conf/helm/selkie` (Supervisor only) with
//! the image built here, on the real node, behind its `NodePort` Service fronted by a real load
//! balancer on the host (haproxy → the node port), its FederationDomain's issuer served there; then,
//! in order, on one release:
//!
//! 1. two pods Ready through their probes, as 65532 on a read-only root filesystem;
//! 2. a user's browser login through it (Dex upstream on the host, headless Chromium) reaching a
//!    cluster: `selkie get kubeconfig` against a cluster whose Concierge trusts the
//!    FederationDomain, then kubectl;
//! 3. `helm upgrade` to another image tag and configuration under load (logins with the
//!    `cli_password` flow and refreshes through the load balancer): every one succeeds;
//! 4. a pod killed (`kubectl delete pod --force`): once the Service's endpoints no longer list it
//!    and the node's kube-proxy no longer routes to it (what was sent to it before then, or over
//!    a connection opened to it before, is lost with it, whatever the server: its token dies with
//!    the pod object), logins and refreshes on new connections through the load balancer succeed
//!    on the other replica while a new pod becomes Ready, and a session begun before the kill
//!    still refreshes (sessions live in Secrets). Graceful deletions lose nothing: step 3 deletes
//!    the old pods under load over pooled connections;
//! 5. `helm uninstall`: nothing of the release is left.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{ensure, Context as _};
use selkie_e2e::{
    concierge::InstalledConcierge,
    dex::{Dex, DexUser},
    eventually,
    images::{selkie_images_tagged, SelkieImages},
    load_balancer::LoadBalancer,
    pinniped_cli,
    pki::CertificateAuthority,
    supervisor::{federation_domain_manifests, Upstream as _},
    Cluster,
};
use selkie_oidc::https::{HttpsClient, TlsOptions};
use serde_json::{json, Value};

use crate::{
    node::{is_ready, node_env, NodeEnv, Release},
    supervisor_full::{get_kubeconfig, whoami},
    supervisor_login::{cli_says_logged_in, opened_url, recording_browser},
};

const RELEASE: &str = "selkie-node-supervisor";
/// The chart's defaults: Pinniped's names.
const NAMESPACE: &str = "pinniped-supervisor";
const PREFIX: &str = "pinniped-supervisor";
const SERVICE: &str = "pinniped-supervisor";
const IDP_NAME: &str = "Dex Users";
const AUDIENCE: &str = "node-member-cluster";
const EMAIL: &str = "walrus@example.com";
const PASSWORD: &str = "arctic-password";
/// The load's own Dex user: Dex keeps one live refresh token per user and client, so logins of
/// the browser user by the load would revoke that user's session upstream.
const LOAD_EMAIL: &str = "walrus-load@example.com";

fn values(images: &SelkieImages, revision: &str) -> Value {
    let image = &images.supervisor;
    json!({
        "concierge": {"enabled": false},
        "supervisor": {
            "image": {"repository": image.repository(), "tag": image.tag(), "pullPolicy": "IfNotPresent"},
            "podLabels": {"selkie-e2e-revision": revision},
            // A NodePort Service fronted by the host's load balancer (a `LoadBalancer` Service
            // would never get an ingress address here: there is no cloud controller, and
            // `helm --wait` waits for one).
            "service": {"type": "NodePort"},
        },
    })
}

/// What a load run did: counts, and each failure with when it happened (since the start).
#[derive(Default)]
struct LoadOutcome {
    logins: usize,
    refreshes: usize,
    failures: Vec<(Duration, String)>,
    last_success: Option<Duration>,
}

/// Logins (`cli_password`) and refreshes at the issuer, one after another over `client`'s pooled
/// connections (as a long-running client would: a pod going away must close them gracefully),
/// until stopped.
fn start_load(
    client: HttpsClient,
    issuer: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<LoadOutcome> {
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let mut outcome = LoadOutcome::default();
        let token_url = format!("{issuer}/oauth2/token");
        while !stop.load(Ordering::Relaxed) {
            let failure = match pinniped_cli::login(&client, &issuer, IDP_NAME, LOAD_EMAIL, PASSWORD).await {
                Ok(tokens) => {
                    outcome.logins += 1;
                    let refresh_token = tokens["refresh_token"].as_str().unwrap_or_default().to_string();
                    match pinniped_cli::refresh(&client, &token_url, &refresh_token).await {
                        Ok((200, _)) => {
                            outcome.refreshes += 1;
                            None
                        }
                        Ok((status, body)) => Some(format!("refresh: {status}: {body}")),
                        Err(e) => Some(format!("refresh: {e:#}")),
                    }
                }
                Err(e) => Some(format!("login: {e:#}")),
            };
            match failure {
                Some(failure) => outcome.failures.push((started.elapsed(), failure)),
                None => outcome.last_success = Some(started.elapsed()),
            }
        }
        outcome
    })
}

/// Stops the load and fails unless every login and refresh succeeded (and some ran). A failure
/// names the first and the last failed call with when they happened, the last success, and the
/// load balancer's log (whether haproxy found the node port down).
async fn finish_load(
    stop: &AtomicBool,
    load: tokio::task::JoinHandle<LoadOutcome>,
    load_balancer: &LoadBalancer,
    what: &str,
) -> anyhow::Result<()> {
    stop.store(true, Ordering::Relaxed);
    let LoadOutcome {
        logins,
        refreshes,
        failures,
        last_success,
    } = load.await?;
    println!(
        "{what}: {logins} logins and {refreshes} refreshes through the load balancer succeeded, {} failed",
        failures.len()
    );
    if let (Some((first_at, first)), Some((last_at, last))) = (failures.first(), failures.last()) {
        anyhow::bail!(
            "{what}: {} calls failed; the first at {first_at:.1?}: {first}; the last at {last_at:.1?}: \
             {last}; the last success at {last_success:.1?}\n---- haproxy's log:\n{}",
            failures.len(),
            load_balancer.log_tail(40)
        );
    }
    ensure!(logins > 0 && refreshes > 0, "{what}: no load ran");
    Ok(())
}

#[tokio::test]
async fn node_supervisor_installed_with_helm_logs_users_in_survives_upgrades_and_uninstalls_cleanly(
) -> anyhow::Result<()> {
    let _release = crate::node::one_release_at_a_time().await;
    let env = node_env().await?;
    let release = Release::new(env, RELEASE, NAMESPACE, PREFIX)?;
    let outcome = supervisor_story(env, &release).await;
    release.explain(env, outcome).await
}

async fn supervisor_story(env: &'static NodeEnv, release: &Release) -> anyhow::Result<()> {
    let kubectl = env.cluster.kubectl();
    let endpoint = SocketAddr::new(env.host_ip, selkie_e2e::free_port()?);
    let issuer = format!("https://{endpoint}/node-issuer");
    let dex = Dex::start_on(
        env.host_ip,
        &[
            DexUser {
                email: EMAIL.into(),
                password: PASSWORD.into(),
                user_id: "walrus-1".into(),
                groups: vec!["walruses".into()],
            },
            DexUser {
                email: LOAD_EMAIL.into(),
                password: PASSWORD.into(),
                user_id: "walrus-load".into(),
                groups: vec!["walruses".into()],
            },
        ],
        &[format!("{issuer}/callback")],
    )
    .await?;

    // 1. helm install; the pods become Ready through their probes.
    release.apply("install", &values(env.images, "1")).await?;
    let pods = release.pods(env).await?;
    ensure!(pods.len() == 2 && pods.iter().all(is_ready), "pods: {pods:#?}");
    for pod in &pods {
        let spec = &pod["spec"];
        ensure!(spec["serviceAccountName"] == PREFIX, "{spec}");
        ensure!(
            spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] == true,
            "{spec}"
        );
    }
    let processes = crate::node_concierge::container_processes("/usr/local/bin/selkie-supervisor");
    ensure!(
        processes.len() >= 2 && processes.iter().all(|(_, uid, ro)| *uid == 65532 && *ro),
        "the Supervisor's processes (pid, uid, read-only root) as the host sees them: {processes:?}"
    );

    // Its serving certificate (the default TLS Secret: clients send no SNI for an IP address),
    // the upstream, the FederationDomain; the load balancer in front of the node port.
    let ca = CertificateAuthority::new("selkie-node-supervisor-ca")?;
    let serving = ca.issue_serving("supervisor", &[&env.host_ip.to_string()])?;
    let manifests = federation_domain_manifests(
        NAMESPACE,
        "node-federation-domain",
        &issuer,
        (&format!("{PREFIX}-default-tls-certificate"), &serving),
        &[(&dex, IDP_NAME)],
    );
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
        .await?;
    kubectl
        .run(&[
            "wait",
            "-n",
            NAMESPACE,
            "--for=jsonpath={.status.phase}=Ready",
            "--timeout=120s",
            "federationdomains.config.supervisor.pinniped.dev/node-federation-domain",
            &format!("oidcidentityproviders.idp.supervisor.pinniped.dev/{}", dex.name()),
        ])
        .await?;
    let load_balancer = LoadBalancer::for_service(env.cluster, NAMESPACE, SERVICE, endpoint).await?;
    let tls = TlsOptions {
        ca_pem: Some(ca.cert_pem().into_bytes()),
        ..TlsOptions::default()
    };
    let client = HttpsClient::new(&tls)?;
    eventually(Duration::from_secs(60), || async {
        let response = pinniped_cli::get(
            &client,
            &format!("{issuer}/.well-known/openid-configuration"),
            None,
            "",
        )
        .await?;
        ensure!(
            response.status == 200,
            "discovery through the load balancer: {}",
            response.status
        );
        Ok(())
    })
    .await?;

    // 2. A browser login reaching a cluster whose Concierge trusts the FederationDomain.
    let member = Cluster::start().await?;
    let concierge = InstalledConcierge::install(&member).await?;
    concierge
        .apply_jwt_authenticator_with_claims(
            &member,
            "supervisor",
            &issuer,
            AUDIENCE,
            &ca.cert_pem(),
            "username",
        )
        .await?;
    concierge.expose_proxy(&member).await?;
    crate::proxy_kubectl::grant_namespace_reading(&member, "walruses").await?;
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let dir = tempfile::Builder::new()
        .prefix("selkie-node-supervisor-")
        .tempdir()?;
    let urls = dir.path().join("browser-urls");
    let browser_script = recording_browser(dir.path(), "browser.sh", &urls)?;
    let kubeconfig = get_kubeconfig(&selkie, &member, dir.path(), AUDIENCE, &browser_script).await?;
    let browser = selkie_e2e::browser::Browser::start().await?;
    let login = async {
        let url = opened_url(&urls).await?;
        ensure!(url.starts_with(&format!("{issuer}/oauth2/authorize?")), "{url}");
        browser.dex_login(&url, EMAIL, PASSWORD).await?;
        cli_says_logged_in(&browser).await
    };
    let (user, logged_in) = tokio::join!(whoami(&member, &kubeconfig), login);
    logged_in?;
    let user = user?;
    ensure!(
        user["username"] == EMAIL && user["groups"].to_string().contains("walruses"),
        "{user}"
    );

    // 3. helm upgrade to another image tag and configuration under load.
    let upgraded = tokio::task::spawn_blocking(|| selkie_images_tagged("node-upgrade")).await??;
    env.cluster
        .node()
        .context("node")?
        .import_image(&upgraded.supervisor.archive)?;
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(client.clone(), issuer.clone(), stop.clone());
    let pods = release.upgrade(env, &values(&upgraded, "2")).await?;
    finish_load(&stop, load, &load_balancer, "rolling upgrade").await?;
    ensure!(
        pods.len() == 2
            && pods.iter().all(|p| is_ready(p)
                && p["spec"]["containers"][0]["image"] == upgraded.supervisor.reference.as_str()
                && p["metadata"]["labels"]["selkie-e2e-revision"] == "2"),
        "after the upgrade: {pods:#?}"
    );
    // The session from before the upgrade still works: the cluster is reached again, without a
    // new browser login (nobody would answer one: the CLI would wait for it).
    let user = tokio::time::timeout(Duration::from_secs(120), whoami(&member, &kubeconfig))
        .await
        .context("the session from before the upgrade did not reach the cluster within 120 s: the CLI is waiting for a new browser login")??;
    ensure!(user["username"] == EMAIL, "{user}");

    // 4. A pod killed.
    let victim = pods[0]["metadata"]["name"]
        .as_str()
        .context("pod name")?
        .to_string();
    // Each login and refresh from here on opens its own connections, as a CLI run does: a
    // pooled connection opened earlier may lead (through the load balancer) to the victim, which
    // serves it until it notices its end, with a token that died with its pod object.
    let token_url = format!("{issuer}/oauth2/token");
    let refreshed = |refresh_token: String| {
        let (tls, token_url) = (&tls, &token_url);
        async move {
            let client = HttpsClient::new(tls)?;
            let (status, body) = pinniped_cli::refresh(&client, token_url, &refresh_token).await?;
            ensure!(status == 200, "refresh: {status}: {body}");
            anyhow::Ok(body)
        }
    };
    let login = |email: &'static str| {
        let (tls, issuer) = (&tls, &issuer);
        async move {
            let client = HttpsClient::new(tls)?;
            let tokens = pinniped_cli::login(&client, issuer, IDP_NAME, email, PASSWORD).await?;
            anyhow::Ok(tokens["refresh_token"].as_str().unwrap_or_default().to_string())
        }
    };
    // The browser user's (Dex keeps one live refresh token per user: the load's logins would
    // end a session of the load's user upstream); their browser session is not used again.
    let before = login(EMAIL).await.context("a login before the kill")?;
    release
        .kill(env, &victim, || async {
            refreshed(login(LOAD_EMAIL).await?).await.map(drop)
        })
        .await
        .map_err(|e| crate::with_log(e, format!("haproxy's:\n{}", load_balancer.log_tail(40))))?;
    refreshed(before)
        .await
        .context("the session begun before the kill")?;

    // 5. helm uninstall leaves nothing of the release; its namespace is deleted for good.
    release.uninstall(env).await?;
    Ok(())
}
