//! `selkie-tcr-bench`: PERF.md's "TokenCredentialRequest" row end to end, run by `perf/tcr-aggregated`.
//! Installs the Concierge from `conf/` on a real kube-apiserver with a JWTAuthenticator for a real
//! Dex, then sends TokenCredentialRequests **through kube-apiserver's aggregation layer**
//! (anonymous, as `pinniped login` does in TokenCredentialRequest mode) from a fixed number of
//! concurrent clients, counts the issued credentials, and reads the Concierge's CPU time from
//! `/proc`: issued credentials per second of wall time and per CPU-second of the Concierge.
//! Every answer must carry a credential; any other answer fails the run. Loopback only, bounded
//! by `--requests`.

use std::{path::PathBuf, sync::Arc, time::Instant};

use anyhow::{ensure, Result};
use clap::Parser;
use selkie_e2e::{
    concierge::InstalledConcierge,
    dex::{Dex, DexUser, CLIENT_ID},
    Cluster,
};
use selkie_perf::procstat;

#[derive(Debug, Parser)]
struct Args {
    /// TokenCredentialRequests to send.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// The markdown report to write.
    #[arg(long)]
    out: PathBuf,
}

const TCR_PATH: &str = "/apis/login.concierge.pinniped.dev/v1alpha1/tokencredentialrequests";

/// Sends one TokenCredentialRequest; fails unless the answer carries a credential.
async fn send(client: kube::Client, body: Vec<u8>) -> Result<()> {
    let request = http::Request::post(TCR_PATH)
        .header("content-type", "application/json")
        .body(body)?;
    let answer: serde_json::Value = client.request(request).await?;
    ensure!(
        answer["status"]["credential"]["clientCertificateData"].is_string(),
        "no credential: {}",
        answer["status"]
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    selkie_e2e::install_crypto_provider();
    let cluster = Cluster::start().await?;
    let user = DexUser {
        email: "bench@example.com".into(),
        password: "password123".into(),
        user_id: "bench-0002".into(),
        groups: vec!["bench".into()],
    };
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let concierge = InstalledConcierge::install(&cluster).await?;
    concierge
        .apply_jwt_authenticator(&cluster, "dex", dex.issuer(), CLIENT_ID, &dex.ca_pem())
        .await?;
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;

    // An anonymous client of kube-apiserver (no credentials at all).
    let mut config = kube::Config::new(cluster.server_url().parse()?);
    config.root_cert = Some(vec![rustls_pem(&cluster.pki().server_ca.cert_pem())?]);
    let client = kube::Client::try_from(config)?;
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "login.concierge.pinniped.dev/v1alpha1",
        "kind": "TokenCredentialRequest",
        "spec": {"token": token, "authenticator": {
            "apiGroup": "authentication.concierge.pinniped.dev", "kind": "JWTAuthenticator", "name": "dex"}},
    }))?;
    // Warm up until the APIService answers.
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while let Err(error) = send(client.clone(), body.clone()).await {
        ensure!(
            Instant::now() < deadline,
            "the aggregated API never answered: {error:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    for _ in 0..50 {
        send(client.clone(), body.clone()).await?;
    }

    let pid = concierge.process().pid();
    let cpu_before = procstat::cpu_time(pid)?;
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let (client, body, next, total) = (client.clone(), body.clone(), next.clone(), args.requests);
        workers.spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                send(client.clone(), body.clone()).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(result) = workers.join_next().await {
        result??;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = procstat::cpu_time(pid)?.saturating_sub(cpu_before).as_secs_f64();
    let report = format!(
        "# TokenCredentialRequest through kube-apiserver's aggregation layer\n\n\
         PERF.md target: **≥ 3,000 issued credentials per second per core**.\n\n\
         * Command: `perf/tcr-aggregated` — {} requests from {} concurrent anonymous clients through a real \
           kube-apiserver 1.35 to the Concierge installed from `conf/` (release build of \
           `selkie-concierge`, signer CA, cached JWT authentication), every answer checked for a credential.\n\
         * Machine: {} cores, kube-apiserver, etcd, Dex, the client and the Concierge all on it.\n\n\
         | issued | wall | rate (wall) | Concierge CPU | per Concierge CPU-second |\n|---|---|---|---|---|\n\
         | {} | {:.2} s | {:.0}/s | {:.2} s | {:.0}/s |\n\n\
         The wall rate is bounded by kube-apiserver on the same two cores; the Concierge's own \
         cost is the last column.\n",
        args.requests,
        args.concurrency,
        std::thread::available_parallelism().map_or(0, usize::from),
        args.requests,
        wall,
        args.requests as f64 / wall,
        cpu,
        args.requests as f64 / cpu.max(0.001),
    );
    std::fs::write(&args.out, &report)?;
    print!("{report}");
    drop(concierge);
    drop(dex);
    cluster.stop();
    Ok(())
}

/// The DER of the first certificate of a PEM bundle.
fn rustls_pem(pem: &str) -> Result<Vec<u8>> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?.to_vec())
}
