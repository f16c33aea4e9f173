//! `selkie-perf-run`: the side-by-side run of PERF.md (started by `perf/run`).
//!
//! Generates a PKI into a temporary directory, starts `selkie-perf-backend` (and, for the SJ and
//! SW rows, `selkie-perf-idp`: OIDC discovery, JWKS and a TokenReview webhook) and then, one after
//! another, the systems under test: D (direct to the backend), N (nginx) and H (haproxy) as TLS
//! reverse proxies adding a fixed `Impersonate-User`, and Selkie with a static identity (S0),
//! client certificates (SX), bearer JWTs (SJ-RS256-1, SJ-ES256-1, SJ-RS256-10k, ...; the runner
//! mints the tokens; `-nocache` rows turn the authenticator's result cache off), a TokenReview
//! webhook (SW-hit, SW-miss) and S0 while its configuration file is rewritten 10 times a second
//! (SR); on request, the real kube-apiserver directly (K-D, K-D-list) and behind Selkie (K-S0,
//! K-S0-list), started with the e2e harness's `selkie-cluster`: a ConfigMap GET, or a list of the
//! Pods the runner created. The systems under test run on core 1 (`taskset -c 1`), the load
//! client, the backend and the identity provider on core 0; all are started first and stay up,
//! idle while another is measured.
//!
//! Per HTTP version: a closed-loop maximum-throughput step for every system; the rate sweep, an
//! open-loop step for every system at each of `--rate-fractions` of its group's base rate (the
//! lowest maximum among the group's proxies, so every system can sustain every step; one rate
//! instead with `--rate-h1/--rate-h2`); per system, up to `--probes` open-loop probes bisecting
//! for the highest rate whose p99 stays below `--p99-bound`; for K-D and K-S0 the watch step (a
//! ConfigMap watch through the system while the ConfigMap is updated directly). Then a handshake
//! step (a new TLS connection per request, HTTP/1.1) for D, N, H and S0. Before every step the
//! runner waits (bounded) for the machine to be quiet and records its load. The tables go to
//! `<out>/<name>.md` and every number to `<out>/<name>.json`.

mod cli;
mod hotswap;
mod idp;
mod kube;
mod launch;
mod quiet;
mod report;
mod smoke;
mod step;
mod sweep;
mod systems;
#[cfg(test)]
mod testing;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::AtomicU64,
};

use anyhow::Context as _;
use clap::Parser as _;
use nix::sys::signal::Signal;
use selkie_perf::{
    pki::PerfPki,
    process::{free_port, shell, stop, wait_for_port, Machine},
};

use crate::{
    cli::Args,
    idp::Idp,
    kube::Kube,
    report::{markdown, Results, Settings},
    smoke::check_smoke,
    step::PROBE_WARMUP,
    systems::System,
};

/// The impersonated user every system must produce.
const USER: &str = "perf-user";
/// Its groups, in order.
const GROUPS: [&str; 2] = ["perf-devs", "perf-ops"];
/// The request path: a ConfigMap GET, as kubectl would send it.
const PATH: &str = "/api/v1/namespaces/default/configmaps/selkie-perf";
/// K-D-list and K-S0-list: the pods the runner created, listed.
const PODS_PATH: &str = "/api/v1/namespaces/default/pods";
/// The ConfigMap of the watch step (updated directly at kube-apiserver while it is watched).
const WATCH_OBJECT: &str = "/api/v1/namespaces/default/configmaps/selkie-perf-watch";
/// The watch step's watch, as `kubectl get --watch` sends it for one object.
const WATCH_PATH: &str =
    "/api/v1/namespaces/default/configmaps?watch=1&fieldSelector=metadata.name%3Dselkie-perf-watch";

/// What every step needs: the arguments, where the binaries and the temporary files are, the
/// PKI, and the backend, identity provider and cluster that stay up for the whole run.
struct Runner {
    args: Args,
    bin_dir: PathBuf,
    dir: PathBuf,
    pki: PerfPki,
    backend_port: u16,
    backend_admin: SocketAddr,
    backend_pid: u32,
    idp: Option<Idp>,
    kube: Option<Kube>,
    /// Steps run so far (makes SW-miss tokens unique across steps).
    steps_started: AtomicU64,
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.apply_smoke()?;
    }
    let systems = args
        .systems
        .iter()
        .map(|s| System::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for protocol in &args.protocols {
        anyhow::ensure!(
            protocol == "h1" || protocol == "h2",
            "unknown protocol {protocol:?}"
        );
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the runner has no directory")?
            .to_path_buf(),
    };
    let selkie = systems.iter().any(|s| s.is_selkie());
    let identity_provider = systems.iter().any(|s| s.uses_idp());
    for bin in [
        "selkie-perf-backend",
        "selkie-perf-load",
        "selkie-concierge",
        "selkie-perf-idp",
    ] {
        if (bin == "selkie-concierge" && !selkie) || (bin == "selkie-perf-idp" && !identity_provider) {
            continue;
        }
        anyhow::ensure!(
            bin_dir.join(bin).exists(),
            "{} is missing: perf/run builds it (cargo build [--release] -p selkie-perf -p selkie-concierge)",
            bin_dir.join(bin).display()
        );
    }
    if systems.contains(&System::N) {
        anyhow::ensure!(
            Command::new("nginx").arg("-v").output().is_ok(),
            "nginx is not installed: apt-get install -y nginx-light"
        );
    }
    if systems.contains(&System::H) {
        anyhow::ensure!(
            Command::new("haproxy").arg("-v").output().is_ok(),
            "haproxy is not installed: apt-get install -y haproxy"
        );
    }
    for (i, system) in systems.iter().enumerate() {
        anyhow::ensure!(!systems[..i].contains(system), "{system:?} is listed twice");
    }

    let temp = tempfile::Builder::new().prefix("selkie-perf-").tempdir()?;
    let dir = temp.path().to_path_buf();
    let groups: Vec<String> = GROUPS.iter().map(|g| g.to_string()).collect();
    let pki = PerfPki::generate(&dir, USER, &groups)?;
    let backend_port = free_port()?;
    let admin_port = free_port()?;
    let backend_admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let mut backend_cmd = Command::new("taskset");
    backend_cmd
        .args(["-c", "0"])
        .arg(bin_dir.join("selkie-perf-backend"))
        .args(["--listen", &format!("127.0.0.1:{backend_port}")])
        .args(["--admin-listen", &backend_admin.to_string()])
        .arg("--cert")
        .arg(&pki.backend.cert)
        .arg("--key")
        .arg(&pki.backend.key)
        .arg("--client-ca")
        .arg(&pki.upstream_ca)
        .args(["--expect-user", USER]);
    for group in GROUPS {
        backend_cmd.args(["--expect-group", group]);
    }
    let mut backend = backend_cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting selkie-perf-backend")?;
    wait_for_port(
        SocketAddr::from(([127, 0, 0, 1], backend_port)),
        &mut backend,
        "selkie-perf-backend",
    )?;
    let (idp, idp_child) = if identity_provider {
        let (idp, child) = Idp::start(&bin_dir, &dir, &pki, args.webhook_delay)?;
        (Some(idp), Some(child))
    } else {
        (None, None)
    };
    let kube_wanted = systems.iter().any(|s| s.is_kube());
    let cluster_bin = args.cluster_bin.clone().unwrap_or_else(|| {
        let beside = bin_dir.join("selkie-cluster");
        if beside.exists() {
            beside
        } else {
            PathBuf::from("target/debug/selkie-cluster")
        }
    });
    let kube = if kube_wanted {
        match Kube::start(&cluster_bin, &dir, args.pods) {
            Ok(kube) => Some(kube),
            Err(error) => {
                Kube::stop(&cluster_bin, &dir);
                let _ = stop(backend, Signal::SIGTERM, "the backend");
                if let Some(child) = idp_child {
                    let _ = stop(child, Signal::SIGTERM, "the identity provider");
                }
                return Err(error);
            }
        }
    } else {
        None
    };
    let runner = Runner {
        kube,
        backend_pid: backend.id(),
        args,
        bin_dir,
        dir,
        pki,
        backend_port,
        backend_admin,
        idp,
        steps_started: AtomicU64::new(0),
    };

    let date_utc = shell("date -u +%Y-%m-%dT%H:%M:%SZ");
    let bound_us = runner.args.p99_bound.as_secs_f64() * 1e6;
    let outcome = runner.run_steps(&systems, bound_us);
    let final_counters = stop(backend, Signal::SIGTERM, "the backend")?;
    eprintln!("backend counters at exit: {}", final_counters.trim());
    if let Some(child) = idp_child {
        let idp_counters = stop(child, Signal::SIGTERM, "the identity provider")?;
        eprintln!("identity provider counters at exit: {}", idp_counters.trim());
    }
    if runner.kube.is_some() {
        Kube::stop(&cluster_bin, &runner.dir);
    }
    if runner.args.keep_logs {
        eprintln!("logs kept in {}", runner.dir.display());
        let _kept = temp.keep();
    }
    let measured = outcome?;

    let results = Results {
        date_utc,
        machine: Machine::describe(),
        settings: Settings {
            duration_s: runner.args.duration.as_secs_f64(),
            warmup_s: runner.args.warmup.as_secs_f64(),
            h1_connections: runner.args.h1_connections,
            h2_connections: runner.args.h2_connections,
            h2_streams: runner.args.h2_streams,
            handshake_connections: runner.args.handshake_connections,
            swap_interval_ms: runner.args.swap_interval.as_millis(),
            swap_watch_interval_ms: runner.args.swap_watch_interval.as_millis(),
            webhook_delay_ms: runner.args.webhook_delay.as_millis(),
            rate_fractions: runner.args.rate_fractions.clone(),
            p99_bound_us: bound_us,
            probes: runner.args.probes,
            probe_duration_s: runner.args.probe_duration.as_secs_f64(),
            probe_warmup_s: runner.args.warmup.min(PROBE_WARMUP).as_secs_f64(),
            watch_rate: runner.args.watch_rate,
            pods: runner.args.pods,
            path: PATH,
            response_body_bytes: 1024,
        },
        skipped: measured.skipped,
        sweep_bases: measured.sweep_bases,
        bounded: measured.bounded,
        steps: measured.steps,
    };
    let (out, name) = if runner.args.smoke {
        ("target/perf-smoke", "side-by-side-smoke")
    } else {
        ("perf/results", "side-by-side-first")
    };
    let out = runner.args.out.clone().unwrap_or_else(|| out.into());
    let name = runner.args.name.clone().unwrap_or_else(|| name.into());
    std::fs::create_dir_all(&out)?;
    let json = out.join(format!("{name}.json"));
    let md = out.join(format!("{name}.md"));
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    std::fs::write(&md, markdown(&results))?;
    eprintln!("wrote {} and {}", md.display(), json.display());
    if runner.args.smoke {
        check_smoke(&systems, &runner.args.protocols, &results)?;
    }
    Ok(())
}
