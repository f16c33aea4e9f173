//! `selkie-cli-bench`: PERF.md's "CLI, cached credential" row (≤ 5 ms wall per kubectl invocation
//! of the plugin), run by `perf/cli-cached`. Starts a real kube-apiserver, Dex and Selkie's proxy,
//! logs in once with `selkie login static --enable-concierge` exactly as kubectl would run it
//! (same arguments, same `KUBERNETES_EXEC_INFO`), then lets hyperfine time the same invocation,
//! which now answers from `credentials.yaml` without any network call, and writes the result
//! (markdown with the machine, plus hyperfine's JSON) next to `--out`.

use std::{path::PathBuf, process::Command};

use anyhow::{ensure, Context, Result};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use clap::Parser;
use selkie_e2e::{
    dex::{Dex, DexUser},
    proxy::{JwtSpec, Proxy},
    Cluster,
};

#[derive(Debug, Parser)]
struct Args {
    /// The `selkie` binary under test (build it in release mode).
    #[arg(long)]
    selkie: PathBuf,
    /// The markdown report to write (the JSON goes beside it).
    #[arg(long)]
    out: PathBuf,
    /// hyperfine runs.
    #[arg(long, default_value_t = 200)]
    runs: u32,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let cluster = Cluster::start().await?;
    let user = DexUser {
        email: "bench@example.com".into(),
        password: "password123".into(),
        user_id: "bench-0001".into(),
        groups: vec!["bench".into()],
    };
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let proxy = Proxy::start(&cluster, &[JwtSpec::for_dex(&dex)]).await?;
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("credentials.yaml");
    let plugin_args = vec![
        "login".to_string(),
        "static".into(),
        "--enable-concierge".into(),
        "--concierge-authenticator-type=jwt".into(),
        "--concierge-authenticator-name=dex".into(),
        format!("--concierge-endpoint={}", proxy.url()),
        format!(
            "--concierge-ca-bundle-data={}",
            B64.encode(proxy.serving_ca().cert_pem())
        ),
        format!("--credential-cache={}", cache.display()),
        "--token-env=SELKIE_BENCH_TOKEN".into(),
    ];
    let exec_info = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "spec": {"interactive": false, "cluster": {
            "server": proxy.url(),
            "certificate-authority-data": B64.encode(proxy.serving_ca().cert_pem()),
        }},
    })
    .to_string();
    let env = [
        ("SELKIE_BENCH_TOKEN", token.as_str()),
        ("KUBERNETES_EXEC_INFO", exec_info.as_str()),
    ];

    // The login: one TokenCredentialRequest, then the credential is cached.
    let login = Command::new(&args.selkie)
        .args(&plugin_args)
        .envs(env)
        .output()
        .context("running selkie")?;
    ensure!(
        login.status.success() && String::from_utf8_lossy(&login.stdout).contains("clientCertificateData"),
        "the first login failed: {}",
        String::from_utf8_lossy(&login.stderr)
    );
    ensure!(cache.exists(), "the login wrote no credential cache");

    let json = args.out.with_extension("json");
    let command_line = std::iter::once(args.selkie.display().to_string())
        .chain(plugin_args.iter().map(|arg| format!("'{arg}'")))
        .collect::<Vec<_>>()
        .join(" ");
    let hyperfine = Command::new("hyperfine")
        .args([
            "--warmup",
            "20",
            "--runs",
            &args.runs.to_string(),
            "--shell=none",
            "--export-json",
        ])
        .arg(&json)
        .arg(&command_line)
        .envs(env)
        .output()
        .context("running hyperfine (apt-get install hyperfine)")?;
    ensure!(
        hyperfine.status.success(),
        "hyperfine failed: {}",
        String::from_utf8_lossy(&hyperfine.stderr)
    );
    let requests = proxy
        .log()
        .lines()
        .filter(|line| line.contains("token credential request"))
        .count();
    ensure!(
        requests == 1,
        "the timed runs reached the Concierge ({requests} TokenCredentialRequests)"
    );

    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let run = &result["results"][0];
    let ms = |key: &str| run[key].as_f64().unwrap_or(f64::NAN) * 1000.0;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .map(|line| line.split(':').nth(1).unwrap_or_default().trim().to_string())
        })
        .unwrap_or_default();
    let report = format!(
        "# CLI exec plugin, cached credential\n\n\
         PERF.md target: **≤ 5 ms wall** per kubectl invocation of the plugin with a valid cached credential.\n\n\
         * Command: `perf/cli-cached` ({} timed runs after 20 warm-up runs, hyperfine `--shell=none`); \
           the plugin is `selkie login static --enable-concierge …` as kubectl runs it, answering \
           from `credentials.yaml` (the Concierge saw exactly one TokenCredentialRequest: the login \
           before the timing).\n\
         * Binary: release build of `selkie`.\n\
         * Machine: {cpu}, {} cores.\n\n\
         | mean | stddev | median | min | max |\n|---|---|---|---|---|\n\
         | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |\n\n\
         Target {}. Raw data: `{}`.\n",
        args.runs,
        std::thread::available_parallelism().map_or(0, usize::from),
        ms("mean"),
        ms("stddev"),
        ms("median"),
        ms("min"),
        ms("max"),
        if ms("median") <= 5.0 { "met" } else { "not met" },
        json.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default(),
    );
    std::fs::write(&args.out, &report)?;
    print!("{report}");
    drop(proxy);
    drop(dex);
    cluster.stop();
    Ok(())
}
