//! Reliability row "the Concierge's signer CA rotated under load" (`perf/results/reliability.md`).
//!
//! A private cluster with the Concierge installed from `conf/` (proxy and control plane), a
//! JWTAuthenticator trusting Dex, and the impersonation proxy's signer CA (the Secret
//! `pinniped-concierge-impersonation-proxy-signer-ca-certificate`) replaced by the test with one
//! that enters its renewal window (its last 30 days) [`ROTATES_IN`] later — as a year-old CA does
//! one day. Users trade a Dex ID token for a client certificate with `selkie login static` (a
//! TokenCredentialRequest through the proxy) and list ConfigMaps through the proxy with it:
//! three users on certificates the old CA issued, one after another all the time, and a fourth
//! asking for a new certificate every half second and using it once.
//!
//! What must hold: the leader rotates the CA by itself, keeping the old one trusted
//! (`previous-ca.crt`); no request fails, before, during or after the rotation — certificates of
//! the old CA keep working until they expire, and new certificates come from the new CA.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use anyhow::{ensure, Context as _};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    api::{Patch, PatchParams},
    Api,
};
use selkie_e2e::{
    concierge::{InstalledConcierge, NAMESPACE},
    dex::{Dex, DexUser, CLIENT_ID},
    eventually,
    pki::{CertAndKey, CertificateAuthority},
    Cluster,
};
use serde_json::{json, Value};
use tokio::time::Instant;
use x509_cert::der::DecodePem as _;

use crate::faults_churn::load;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const AUTHENTICATOR: &str = "signer-dex";
const SIGNER_SECRET: &str = "pinniped-concierge-impersonation-proxy-signer-ca-certificate";
/// The common name of the CA the test puts in place.
const ENDING_CA: &str = "selkie-test-signer-ca-near-its-end";
/// The renewal window of the Concierge's signer CA (`SIGNER_CA_RENEW_BEFORE`).
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long after the test puts it in place the CA enters its renewal window.
const ROTATES_IN: Duration = Duration::from_secs(40);
/// How long the load goes on after the rotation.
const AFTER: Duration = Duration::from_secs(15);

/// The subject common name of the issuer of the PEM certificate `pem`.
fn issuer(pem: &str) -> anyhow::Result<String> {
    let certificate = x509_cert::Certificate::from_pem(pem.as_bytes()).context("a PEM certificate")?;
    Ok(certificate.tbs_certificate.issuer.to_string())
}

/// A certificate for `token` from the Concierge at `endpoint`, the way kubectl's exec plugin
/// gets one: `selkie login static` (no cache), a TokenCredentialRequest through the proxy at
/// `endpoint` (a URL).
async fn login(
    selkie: &std::path::Path,
    endpoint: &str,
    proxy_ca: &str,
    token: &str,
) -> anyhow::Result<CertAndKey> {
    let output = tokio::process::Command::new(selkie)
        .args([
            "login",
            "static",
            "--enable-concierge",
            "--concierge-api-group-suffix=pinniped.dev",
            "--concierge-authenticator-type=jwt",
            &format!("--concierge-authenticator-name={AUTHENTICATOR}"),
            &format!("--concierge-endpoint={endpoint}"),
            &format!("--concierge-ca-bundle-data={}", B64.encode(proxy_ca)),
            "--credential-cache=",
            "--token-env=SELKIE_E2E_SIGNER_TOKEN",
        ])
        .env("SELKIE_E2E_SIGNER_TOKEN", token)
        .env_remove("KUBERNETES_EXEC_INFO")
        .kill_on_drop(true)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "selkie login static: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let credential: Value = serde_json::from_slice(&output.stdout)?;
    let field = |name: &str| -> anyhow::Result<String> {
        Ok(credential["status"][name]
            .as_str()
            .with_context(|| format!("no {name} in the ExecCredential"))?
            .to_string())
    };
    Ok(CertAndKey {
        cert_pem: field("clientCertificateData")?,
        key_pem: field("clientKeyData")?,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_signer_ca_rotated_under_load_old_and_new_certificates_keep_working() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let cluster = Cluster::start().await?;
    let concierge = InstalledConcierge::install(&cluster).await?;
    let (endpoint, proxy_ca) = concierge.expose_proxy(&cluster).await?;
    let kubectl = cluster.kubectl();
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "faults-signer").await?;
    let pinny = DexUser::pinny();
    let dex = Dex::start(std::slice::from_ref(&pinny)).await?;
    concierge
        .apply_jwt_authenticator(&cluster, AUTHENTICATOR, dex.issuer(), CLIENT_ID, &dex.ca_pem())
        .await?;
    kubectl
        .create_role_and_binding(
            &namespace,
            "signer-read",
            "list",
            "configmaps",
            &[&format!("--user={}", pinny.email)],
        )
        .await?;
    let token = dex.password_grant(&pinny.email, &pinny.password).await?.id_token;

    // The signer CA replaced by one about to enter its renewal window.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    eventually(Duration::from_secs(60), || async {
        secrets.get(SIGNER_SECRET).await.context("the signer CA Secret")
    })
    .await?;
    let ending =
        CertificateAuthority::new_ending_at(ENDING_CA, SystemTime::now() + RENEW_BEFORE + ROTATES_IN)?;
    let patch = json!({"data": {
        "ca.crt": B64.encode(ending.cert_pem()),
        "ca.key": B64.encode(ending.key_pem()),
        "previous-ca.crt": null,
    }});
    secrets
        .patch(SIGNER_SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let replaced_at = Instant::now();
    let ending_issuer = issuer(&ending.cert_pem())?;

    // Certificates of the ending CA, one per user of the load.
    let mut old_certificates = Vec::new();
    let first = eventually(Duration::from_secs(30), || async {
        let credential = login(&selkie, &endpoint, &proxy_ca, &token).await?;
        ensure!(
            issuer(&credential.cert_pem)? == ending_issuer,
            "not yet issued by the test's CA"
        );
        Ok(credential)
    })
    .await?;
    old_certificates.push(first);
    for _ in 0..2 {
        old_certificates.push(login(&selkie, &endpoint, &proxy_ca, &token).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    for (n, credential) in old_certificates.iter().enumerate() {
        ensure!(
            issuer(&credential.cert_pem)? == ending_issuer,
            "user {n}'s certificate"
        );
        let kubeconfig = concierge.dir().join(format!("signer-user-{n}.kubeconfig"));
        selkie_e2e::cluster::write_kubeconfig(&kubeconfig, &endpoint, &proxy_ca, &pinny.email, credential)?;
        let client = selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await?;
        loads.push(load(client, namespace.clone(), stop.clone()));
    }
    // New certificates all along, each used once: (issuer, failure) per round.
    let fresh = {
        let (stop, selkie, endpoint, proxy_ca, token, namespace, dir) = (
            stop.clone(),
            selkie.clone(),
            endpoint.clone(),
            proxy_ca.clone(),
            token.clone(),
            namespace.clone(),
            concierge.dir().to_path_buf(),
        );
        let user = pinny.email.clone();
        tokio::spawn(async move {
            let mut rounds: Vec<(String, Option<String>)> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let round = async {
                    let credential = login(&selkie, &endpoint, &proxy_ca, &token).await?;
                    let from = issuer(&credential.cert_pem)?;
                    let kubeconfig = dir.join(format!("signer-fresh-{n}.kubeconfig"));
                    selkie_e2e::cluster::write_kubeconfig(
                        &kubeconfig,
                        &endpoint,
                        &proxy_ca,
                        &user,
                        &credential,
                    )?;
                    let client = selkie_e2e::cluster::client_from_kubeconfig(&kubeconfig).await?;
                    let listed = Api::<ConfigMap>::namespaced(client, &namespace)
                        .list(&Default::default())
                        .await;
                    anyhow::Ok((
                        from,
                        listed.err().map(|e| format!("{:#}", anyhow::Error::from(e))),
                    ))
                };
                rounds.push(match round.await {
                    Ok(outcome) => outcome,
                    Err(error) => (String::new(), Some(format!("{error:#}"))),
                });
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            rounds
        })
    };

    // The leader rotates by itself once the CA is in its renewal window.
    let pid = concierge.process().pid();
    let rss_before = selkie_perf::procstat::rss_kib(pid)?;
    let rotated = eventually(ROTATES_IN + Duration::from_secs(60), || async {
        let secret = secrets.get(SIGNER_SECRET).await?;
        let data = secret.data.unwrap_or_default();
        let text = |key: &str| {
            data.get(key)
                .map(|bytes| String::from_utf8_lossy(&bytes.0).to_string())
                .unwrap_or_default()
        };
        ensure!(
            text("previous-ca.crt").trim() == ending.cert_pem().trim(),
            "not rotated yet"
        );
        Ok(text("ca.crt"))
    })
    .await?;
    let rotated_after = replaced_at.elapsed();
    let new_issuer = issuer(&rotated)?;
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    let mut requests = 0;
    let mut failures = Vec::new();
    for load in loads {
        let (made, failed) = load.await?;
        requests += made;
        failures.extend(failed);
    }
    let rounds = fresh.await?;
    let rss_after = selkie_perf::procstat::rss_kib(pid)?;
    let mut by_issuer: BTreeMap<&str, usize> = BTreeMap::new();
    for (from, _) in &rounds {
        *by_issuer.entry(from.as_str()).or_default() += 1;
    }
    let fresh_failures: Vec<&String> = rounds
        .iter()
        .filter_map(|(_, failure)| failure.as_ref())
        .collect();
    println!(
        "signer CA rotated {rotated_after:?} after the test put a CA {ROTATES_IN:?} from its renewal window in \
         place; {requests} requests on the old CA's certificates, {} failed; {} fresh certificates used once, {} \
         failed, by issuer {by_issuer:?}; Concierge RSS {rss_before} / {rss_after} KiB",
        failures.len(),
        rounds.len(),
        fresh_failures.len(),
    );
    ensure!(
        failures.is_empty(),
        "requests on the old CA's certificates failed: {failures:?}"
    );
    ensure!(
        fresh_failures.is_empty(),
        "fresh certificates failed: {fresh_failures:?}"
    );
    ensure!(new_issuer != ending_issuer, "the CA was not replaced");
    ensure!(
        by_issuer.get(new_issuer.as_str()).is_some_and(|n| *n > 0)
            && by_issuer.get(ending_issuer.as_str()).is_some_and(|n| *n > 0),
        "fresh certificates came from both CAs in turn: {by_issuer:?}"
    );
    ensure!(requests > 30, "too little load ran: {requests}");
    Ok(())
}
