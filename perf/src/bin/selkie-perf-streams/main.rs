//! `selkie-perf-streams`: the stream metrics of PERF.md (started by `perf/run-streams`).
//!
//! Generates a PKI into a temporary directory, starts `selkie-perf-backend` and then, one after
//! another, the systems under test: D (direct to the backend), N (nginx, TLS reverse proxy adding
//! the `Impersonate-*` headers, unbuffered, upgrades passed through) and S0 (Selkie, static
//! identity). Systems under test run on core 1 (`taskset -c 1`); this client and the backend run
//! on core 0 (`perf/run-streams` pins this process). It measures:
//!
//! * **memory**: idle RSS of a freshly started system, then RSS with 1k, 5k, 10k (`--watches`)
//!   idle watches held open over HTTP/2 (at most `--h2-streams` streams per connection) and over
//!   HTTP/1.1 (one connection per watch); every count on a freshly started system; (RSS − idle RSS)
//!   ÷ watches;
//! * **busy**: a fresh system holding `--busy-watches` idle watches while `--tunnel-connections`
//!   WebSocket exec streams echo for `--duration`: RSS idle, with the watches, at its peak while
//!   busy, and after;
//! * **watch fan-through**: the backend sends an event every `--fan-interval` on each of
//!   `--fan-watches` held watches; the latency from the event's `ts_ns` (the backend's
//!   `CLOCK_MONOTONIC` when it made the event) to its receipt here, p50/p99/p99.9;
//! * **upgraded streams**: WebSocket (`v5.channel.k8s.io`) and SPDY/3.1 echo through the system:
//!   MiB/s, the system's CPU ns per byte; and the system's CPU µs per exec setup (TLS connection +
//!   WebSocket upgrade + one echoed message + close, one after another);
//! * error counters: watches that failed or were not established, dropped watches and tunnels,
//!   malformed events, echo mismatches, upstream streams left open, impersonation mismatches and
//!   handshake failures at the backend. All must be 0; the run exits non-zero otherwise.

mod busy;
mod cli;
mod exec;
mod fan;
mod measure;
mod memory;
mod report;
mod systems;
mod throughput;
mod tunnels;
mod watches;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::Context as _;
use clap::Parser as _;
use nix::sys::signal::Signal;
use selkie_perf::{
    pki::PerfPki,
    process::{free_port, shell, stop, wait_for_port},
};

use crate::{
    busy::busy_step,
    cli::Args,
    exec::exec_step,
    fan::fan_step,
    memory::{files_needed, memory_step},
    report::{failures, machine, markdown, mib, opt, Results, Settings},
    systems::{Protocol, System},
    throughput::throughput_step,
    tunnels::Tunnel,
};

/// The impersonated user every system must produce.
const USER: &str = "perf-user";
/// Its groups, in order.
const GROUPS: [&str; 2] = ["perf-devs", "perf-ops"];

/// `RLIMIT_NOFILE`'s soft limit, from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|line| line.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// What every step needs: the arguments, where the binaries and the temporary files are, the
/// PKI and the backend.
struct Env {
    args: Args,
    bin_dir: PathBuf,
    dir: PathBuf,
    pki: PerfPki,
    backend_port: u16,
    backend_admin: SocketAddr,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.apply_smoke();
    }
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let systems = args
        .systems
        .iter()
        .map(|s| System::parse(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let protocols = args
        .protocols
        .iter()
        .map(|p| Protocol::parse(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this binary has no directory")?
            .to_path_buf(),
    };
    for bin in ["selkie-perf-backend", "selkie-concierge"] {
        anyhow::ensure!(
            bin_dir.join(bin).exists(),
            "{} is missing: perf/run-streams builds it",
            bin_dir.join(bin).display()
        );
    }
    let limit = open_files_limit().unwrap_or(0);
    let fan_need = args.fan_watches as u64 * 2 + 256;
    anyhow::ensure!(
        limit >= fan_need,
        "RLIMIT_NOFILE is {limit}, {fan_need} needed for {} fan-through watches: run through perf/run-streams (ulimit -n)",
        args.fan_watches
    );

    let temp = tempfile::Builder::new()
        .prefix("selkie-perf-streams-")
        .tempdir()?;
    let dir = temp.path().to_path_buf();
    let groups: Vec<String> = GROUPS.iter().map(|g| g.to_string()).collect();
    let pki = PerfPki::generate(&dir, USER, &groups)?;
    let backend_port = free_port()?;
    let backend_admin = SocketAddr::from(([127, 0, 0, 1], free_port()?));
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
        .args(["--expect-user", USER, "--watch-interval", "0"]);
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
    let env = Env {
        args,
        bin_dir,
        dir,
        pki,
        backend_port,
        backend_admin,
    };
    let date_utc = shell("date -u +%Y-%m-%dT%H:%M:%SZ");
    let mut results = Results {
        date_utc,
        machine: machine(&env.bin_dir),
        settings: Settings {
            watches: env.args.watches.clone(),
            busy_watches: env.args.busy_watches.clone(),
            protocols: env.args.protocols.clone(),
            h2_streams_per_connection: env.args.h2_streams,
            fan_watches: env.args.fan_watches,
            fan_interval_ms: env.args.fan_interval.as_secs_f64() * 1000.0,
            duration_s: env.args.duration.as_secs_f64(),
            tunnel_connections: env.args.tunnel_connections,
            message_bytes: env.args.message_bytes,
            window: env.args.window,
            exec_setups: env.args.exec_setups,
        },
        systems: systems.iter().map(|s| (*s, s.describe())).collect(),
        not_started: Vec::new(),
        skipped: Vec::new(),
        memory: Vec::new(),
        busy: Vec::new(),
        fan_through: Vec::new(),
        throughput: Vec::new(),
        exec_setup: Vec::new(),
    };
    let outcome = run(&env, &systems, &protocols, &mut results).await;
    let exit = stop(backend, Signal::SIGTERM, "the backend")?;
    eprintln!("backend counters at exit: {}", exit.trim());
    if env.args.keep_temp {
        eprintln!("kept {}", env.dir.display());
        let _kept = temp.keep();
    }
    outcome?;

    let (out, name) = if env.args.smoke {
        ("target/perf-smoke", "streams-smoke")
    } else {
        ("perf/results", "streams")
    };
    let out = env.args.out.clone().unwrap_or_else(|| out.into());
    let name = env.args.name.clone().unwrap_or_else(|| name.into());
    std::fs::create_dir_all(&out)?;
    let json = out.join(format!("{name}.json"));
    let md = out.join(format!("{name}.md"));
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    std::fs::write(&md, markdown(&results))?;
    eprintln!("wrote {} and {}", md.display(), json.display());
    let failures = failures(&results);
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("FAILED: {failure}");
        }
        anyhow::bail!("{} error counters are not 0", failures.len());
    }
    eprintln!("every error counter is 0");
    Ok(())
}

/// Whether a `step` holding `n` watches over `protocol` through `system` fits in this process's
/// `RLIMIT_NOFILE`; when it does not, it is listed in `results` as not run, with the limit,
/// rather than failing midway.
fn fits(env: &Env, step: &str, system: System, protocol: Protocol, n: usize, results: &mut Results) -> bool {
    let limit = open_files_limit().unwrap_or(0);
    let need = files_needed(system, protocol, n, env.args.h2_streams);
    if need <= limit {
        return true;
    }
    let why = format!(
        "{step} {system:?} {} {n} watches: needs {need} open files per process, RLIMIT_NOFILE is {limit} (raise the hard limit: ulimit -Hn)",
        protocol.name()
    );
    eprintln!("-- not run: {why}");
    results.skipped.push(why);
    false
}

async fn run(
    env: &Env,
    systems: &[System],
    protocols: &[Protocol],
    results: &mut Results,
) -> anyhow::Result<()> {
    for &system in systems {
        let wants = |step: &str| env.args.steps.iter().any(|s| s == step);
        // Memory: a fresh system per step.
        if system != System::D && wants("memory") {
            'memory: for &protocol in protocols {
                for &n in &env.args.watches {
                    if !fits(env, "memory", system, protocol, n, results) {
                        continue;
                    }
                    eprintln!("-- {system:?} {}: memory with {n} idle watches", protocol.name());
                    match memory_step(env, system, protocol, n).await {
                        Ok(step) => {
                            eprintln!(
                                "   idle {:.1} MiB, with watches {:.1} MiB: {:.2} KiB/watch; opened in {:.1} s; failed {}, dropped {}",
                                mib(step.idle_rss_kib),
                                mib(step.rss_kib),
                                step.kib_per_watch,
                                step.open_seconds,
                                step.failed,
                                step.dropped
                            );
                            results.memory.push(step);
                        }
                        Err(e) => {
                            eprintln!("   {system:?} did not start: {e:#}");
                            results.not_started.push(format!("{system:?}: {e:#}"));
                            break 'memory;
                        }
                    }
                }
            }
        }
        // Busy: held watches and exec streams at once, a fresh system per step.
        if system != System::D && wants("busy") {
            for &protocol in protocols {
                for &n in &env.args.busy_watches {
                    if !fits(env, "busy", system, protocol, n, results) {
                        continue;
                    }
                    eprintln!(
                        "-- {system:?} {}: {n} idle watches while {} exec streams echo",
                        protocol.name(),
                        env.args.tunnel_connections
                    );
                    let step = busy_step(env, system, protocol, n).await?;
                    eprintln!(
                        "   idle {:.1} MiB, with watches {:.1}, peak while busy {:.1}, after {:.1} MiB; {:.1} MiB/s; failed {}, dropped {}, dropped tunnels {}",
                        mib(step.idle_rss_kib),
                        mib(step.watches_rss_kib),
                        mib(step.peak_rss_kib),
                        mib(step.after_rss_kib),
                        step.mib_per_second,
                        step.failed,
                        step.dropped,
                        step.dropped_tunnels
                    );
                    results.busy.push(step);
                }
            }
        }
        // Fan-through, throughput and exec setups on one fresh system.
        if !(wants("fan") || wants("throughput") || wants("exec")) {
            continue;
        }
        let (sut, target) = match env.start(system, env.args.fan_watches + env.args.tunnel_connections) {
            Ok(started) => started,
            Err(e) => {
                eprintln!("   {system:?} did not start: {e:#}");
                results.not_started.push(format!("{system:?}: {e:#}"));
                continue;
            }
        };
        for &protocol in protocols.iter().filter(|_| wants("fan")) {
            eprintln!(
                "-- {system:?} {}: fan-through, {} watches, an event every {:?} each",
                protocol.name(),
                env.args.fan_watches,
                env.args.fan_interval
            );
            let step = fan_step(env, &sut, &target, system, protocol).await?;
            eprintln!(
                "   {:.0} events/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs; failed {}, dropped {}",
                step.events_per_second,
                step.latency_us.p50,
                step.latency_us.p99,
                step.latency_us.p999,
                step.failed,
                step.dropped
            );
            results.fan_through.push(step);
        }
        for kind in [Tunnel::WebSocket, Tunnel::Spdy]
            .into_iter()
            .filter(|_| wants("throughput"))
        {
            eprintln!("-- {system:?}: {kind:?} echo throughput");
            let step = throughput_step(env, &sut, &target, system, kind).await?;
            eprintln!(
                "   {:.1} MiB/s, SUT {} ns/echoed byte; failed upgrades {}, dropped {}, mismatches {} {:?}",
                step.mib_per_second,
                opt(step.sut_cpu_ns_per_echoed_byte, 2),
                step.failed_upgrades,
                step.dropped,
                step.echo_mismatches,
                step.error_examples
            );
            results.throughput.push(step);
        }
        if !wants("exec") {
            continue;
        }
        eprintln!("-- {system:?}: {} exec setups", env.args.exec_setups);
        let step = exec_step(env, &sut, &target, system).await?;
        eprintln!(
            "   SUT {} µs/setup, wall p50 {:.2} ms; failed {} {:?}",
            opt(step.sut_cpu_us_per_setup, 0),
            step.wall_ms.p50,
            step.failed,
            step.error_examples
        );
        results.exec_setup.push(step);
        drop(sut);
    }
    Ok(())
}
