//! The results: the machine, the settings and every step (`<name>.json`), the Markdown tables
//! (`<name>.md`), and the error counters that fail the run.

use std::{fmt::Write as _, path::Path};

use selkie_perf::report::BackendCounters;
use serde::Serialize;

use crate::{
    busy::BusyStep, exec::ExecStep, fan::FanStep, memory::MemoryStep, open_files_limit, systems::System,
    throughput::ThroughputStep, tunnels::WEBSOCKET_PROTOCOL,
};

#[derive(Debug, Serialize)]
pub(crate) struct Machine {
    #[serde(flatten)]
    common: selkie_perf::process::Machine,
    build: String,
    open_files_limit: Option<u64>,
}

pub(crate) fn machine(bin_dir: &Path) -> Machine {
    Machine {
        common: selkie_perf::process::Machine::describe(),
        build: bin_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        open_files_limit: open_files_limit(),
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    pub(crate) watches: Vec<usize>,
    pub(crate) busy_watches: Vec<usize>,
    pub(crate) protocols: Vec<String>,
    pub(crate) h2_streams_per_connection: usize,
    pub(crate) fan_watches: usize,
    pub(crate) fan_interval_ms: f64,
    pub(crate) duration_s: f64,
    pub(crate) tunnel_connections: usize,
    pub(crate) message_bytes: usize,
    pub(crate) window: usize,
    pub(crate) exec_setups: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct Results {
    pub(crate) date_utc: String,
    pub(crate) machine: Machine,
    pub(crate) settings: Settings,
    pub(crate) systems: Vec<(System, &'static str)>,
    pub(crate) not_started: Vec<String>,
    /// Steps left out because this machine's open-files limit is too low for them.
    pub(crate) skipped: Vec<String>,
    pub(crate) memory: Vec<MemoryStep>,
    pub(crate) busy: Vec<BusyStep>,
    pub(crate) fan_through: Vec<FanStep>,
    pub(crate) throughput: Vec<ThroughputStep>,
    pub(crate) exec_setup: Vec<ExecStep>,
}

pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub(crate) fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or("—".into(), |v| format!("{v:.digits$}"))
}

pub(crate) fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let m = &results.machine.common;
    let _ = writeln!(
        md,
        "# Streams: held watches, watch fan-through, upgraded streams\n"
    );
    let _ = writeln!(
        md,
        "{} · {} · {} · {} · {} · {} · {} binaries · RLIMIT_NOFILE {}\n",
        results.date_utc,
        m.cpu_model,
        m.cores,
        m.kernel,
        m.memory,
        m.nginx,
        results.machine.build,
        results
            .machine
            .open_files_limit
            .map_or("?".into(), |n| n.to_string())
    );
    let _ = writeln!(md, "| id | system |\n|---|---|");
    for (system, describe) in &results.systems {
        let _ = writeln!(md, "| {system:?} | {describe} |");
    }
    for missing in &results.not_started {
        let _ = writeln!(md, "\n**Not started:** {missing}");
    }
    for skipped in &results.skipped {
        let _ = writeln!(md, "\n**Not run:** {skipped}");
    }
    let _ = writeln!(
        md,
        "\n## Memory: idle watches held open\n\nEvery row on a freshly started system: RSS 1 s after start (idle), then with the watches established and the RSS settled. KiB per watch = (RSS − idle RSS) ÷ watches. nginx's `worker_connections` is sized to the step (4 × watches + 1024, with less it ran out of connection slots at 5000 HTTP/1.1 watches; nginx allocates and touches every slot at start, so its idle RSS grows with the step); nginx proxies every watch over its own HTTP/1.1 connection to the backend, Selkie over pooled HTTP/2 (upstream conns: TLS connections the backend accepted during the step). PERF.md: idle ≤ 20 MiB, ≤ 8 KiB per watch, 10k watches ≤ 128 MiB.\n"
    );
    let _ = writeln!(
        md,
        "| system | proto | watches | conns | upstream conns | idle RSS MiB | RSS MiB | KiB/watch | open s | failed | dropped | left open upstream |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for s in &results.memory {
        let _ = writeln!(
            md,
            "| {:?} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.1} | {} | {} | {} |",
            s.system,
            s.protocol,
            s.watches,
            s.connections,
            s.backend.connections,
            mib(s.idle_rss_kib),
            mib(s.rss_kib),
            s.kib_per_watch,
            s.open_seconds,
            s.failed,
            s.dropped,
            s.backend_watches_left_open
        );
    }
    if !results.busy.is_empty() {
        let _ = writeln!(
            md,
            "\n## Memory under load: idle watches held while exec streams echo\n\nEvery row on a freshly started system: RSS idle, with the watches established and settled, the highest RSS sampled every 100 ms while {} WebSocket exec streams echo {}-byte messages ({} in flight each) for {:.0} s plus 1 s of warm-up, and settled after they end (the watches still held). PERF.md and the chart: 10k watches ≤ 128 MiB.\n",
            results.settings.tunnel_connections,
            results.settings.message_bytes,
            results.settings.window,
            results.settings.duration_s
        );
        let _ = writeln!(
            md,
            "| system | proto | watches | streams | idle RSS MiB | with watches MiB | peak busy MiB | after MiB | echo MiB/s | failed | dropped | dropped streams |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for s in &results.busy {
            let _ = writeln!(
                md,
                "| {:?} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
                s.system,
                s.protocol,
                s.watches,
                s.tunnels,
                mib(s.idle_rss_kib),
                mib(s.watches_rss_kib),
                mib(s.peak_rss_kib),
                mib(s.after_rss_kib),
                s.mib_per_second,
                s.failed,
                s.dropped,
                s.dropped_tunnels
            );
        }
    }
    let _ = writeln!(
        md,
        "\n## Watch event fan-through\n\nThe backend sends an event on every held watch every {:.0} ms; latency from the event's `ts_ns` (backend, `CLOCK_MONOTONIC`) to its receipt by the client.\n",
        results.settings.fan_interval_ms
    );
    let _ = writeln!(
        md,
        "| system | proto | watches | events/s | p50 µs | p99 µs | p99.9 µs | max µs | SUT CPU µs/event | failed | dropped | malformed |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for s in &results.fan_through {
        let l = &s.latency_us;
        let _ = writeln!(
            md,
            "| {:?} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            s.system,
            s.protocol,
            s.watches,
            s.events_per_second,
            l.p50,
            l.p99,
            l.p999,
            l.max,
            opt(s.sut_cpu_us_per_event, 1),
            s.failed,
            s.dropped,
            s.malformed
        );
    }
    let _ = writeln!(
        md,
        "\n## Upgraded streams: echo throughput\n\n{} connections, {} B messages (WebSocket) or writes (SPDY/3.1, raw bytes after the 101), {} in flight per connection. MiB/s of payload echoed back; CPU ns per byte = SUT CPU ÷ echoed bytes (each byte crosses the system up and back; the per-direction figure is half). PERF.md: ≤ 1 ns per byte.\n",
        results.settings.tunnel_connections, results.settings.message_bytes, results.settings.window
    );
    let _ = writeln!(
        md,
        "| system | tunnel | MiB/s echoed | SUT CPU ns/echoed byte | ns/byte each way | failed upgrades | dropped | echo mismatches |\n|---|---|--:|--:|--:|--:|--:|--:|"
    );
    for s in &results.throughput {
        let _ = writeln!(
            md,
            "| {:?} | {:?} | {:.1} | {} | {} | {} | {} | {} |",
            s.system,
            s.tunnel,
            s.mib_per_second,
            opt(s.sut_cpu_ns_per_echoed_byte, 2),
            opt(s.sut_cpu_ns_per_byte_each_way, 2),
            s.failed_upgrades,
            s.dropped,
            s.echo_mismatches
        );
    }
    let _ = writeln!(
        md,
        "\n## Exec setup\n\nOne after another: new TLS connection, WebSocket upgrade (`{WEBSOCKET_PROTOCOL}`), one echoed message, close. PERF.md: ≤ 200 µs SUT CPU per exec setup.\n"
    );
    let _ = writeln!(
        md,
        "| system | setups | SUT CPU µs/setup | wall p50 ms | wall p99 ms | failed |\n|---|--:|--:|--:|--:|--:|"
    );
    for s in &results.exec_setup {
        let _ = writeln!(
            md,
            "| {:?} | {} | {} | {:.2} | {:.2} | {} |",
            s.system,
            s.completed,
            opt(s.sut_cpu_us_per_setup, 0),
            s.wall_ms.p50,
            s.wall_ms.p99,
            s.failed
        );
    }
    let failures = failures(results);
    let _ = writeln!(md, "\n## Errors\n");
    if failures.is_empty() {
        let _ = writeln!(md, "Every error counter is 0.");
    } else {
        for failure in failures {
            let _ = writeln!(md, "* {failure}");
        }
    }
    md
}

/// Every non-zero error counter and system that did not start, described.
pub(crate) fn failures(results: &Results) -> Vec<String> {
    let mut out: Vec<String> = results
        .not_started
        .iter()
        .map(|s| format!("not started: {s}"))
        .collect();
    let mut check = |id: String, counters: &[(&str, u64)], backend: &BackendCounters, examples: &[String]| {
        let mut bad: Vec<String> = counters
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(what, n)| format!("{n} {what}"))
            .collect();
        if backend.impersonation_mismatches > 0 {
            bad.push(format!(
                "{} impersonation mismatches at the backend {:?}",
                backend.impersonation_mismatches, backend.mismatch_examples
            ));
        }
        if backend.handshake_failures > 0 {
            bad.push(format!(
                "{} failed TLS handshakes at the backend",
                backend.handshake_failures
            ));
        }
        if !bad.is_empty() {
            out.push(format!("{id}: {} (e.g. {examples:?})", bad.join(", ")));
        }
    };
    for s in &results.memory {
        check(
            format!("memory {:?} {} {}", s.system, s.protocol, s.watches),
            &[
                ("watches failed or not established", s.failed),
                ("watches dropped", s.dropped),
                ("malformed events", s.malformed),
                ("watches left open at the backend", s.backend_watches_left_open),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.busy {
        check(
            format!("busy {:?} {} {}", s.system, s.protocol, s.watches),
            &[
                ("watches failed or not established", s.failed),
                ("watches dropped", s.dropped),
                ("malformed events", s.malformed),
                ("watches left open at the backend", s.backend_watches_left_open),
                ("failed upgrades", s.failed_upgrades),
                ("dropped exec streams", s.dropped_tunnels),
                ("echo mismatches", s.echo_mismatches),
                ("(nothing echoed)", u64::from(s.mib_per_second <= 0.0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.fan_through {
        check(
            format!("fan-through {:?} {}", s.system, s.protocol),
            &[
                ("watches failed or not established", s.failed),
                ("watches dropped", s.dropped),
                ("malformed events", s.malformed),
                ("watches left open at the backend", s.backend_watches_left_open),
                ("(no events received)", u64::from(s.events == 0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.throughput {
        check(
            format!("throughput {:?} {:?}", s.system, s.tunnel),
            &[
                ("failed upgrades", s.failed_upgrades),
                ("dropped tunnels", s.dropped),
                ("echo mismatches", s.echo_mismatches),
                ("(no bytes echoed)", u64::from(s.echoed_bytes == 0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    for s in &results.exec_setup {
        check(
            format!("exec setup {:?}", s.system),
            &[
                ("failed exec setups", s.failed),
                ("(no exec setup completed)", u64::from(s.completed == 0)),
            ],
            &s.backend,
            &s.error_examples,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(failed: u64, left_open: u64) -> MemoryStep {
        MemoryStep {
            system: System::S0,
            protocol: "h1",
            watches: 10,
            connections: 10,
            idle_rss_kib: 1000,
            rss_kib: 1100,
            kib_per_watch: 10.0,
            open_seconds: 0.1,
            settle_seconds: 0.0,
            established: 10 - failed,
            failed,
            dropped: 0,
            malformed: 0,
            backend_watches_left_open: left_open,
            backend: BackendCounters::default(),
            error_examples: Vec::new(),
        }
    }

    fn results(memory: Vec<MemoryStep>, not_started: Vec<String>) -> Results {
        Results {
            date_utc: String::new(),
            machine: machine(Path::new("debug")),
            settings: Settings {
                watches: vec![10],
                busy_watches: vec![10],
                protocols: vec!["h1".into()],
                h2_streams_per_connection: 100,
                fan_watches: 1,
                fan_interval_ms: 100.0,
                duration_s: 1.0,
                tunnel_connections: 1,
                message_bytes: 16,
                window: 1,
                exec_setups: 1,
            },
            systems: vec![(System::S0, System::S0.describe())],
            not_started,
            skipped: Vec::new(),
            memory,
            busy: Vec::new(),
            fan_through: Vec::new(),
            throughput: Vec::new(),
            exec_setup: Vec::new(),
        }
    }

    #[test]
    fn every_error_counter_and_a_missing_system_fail_the_run() {
        assert!(failures(&results(vec![memory(0, 0)], Vec::new())).is_empty());
        let bad = failures(&results(vec![memory(2, 1)], vec!["N: nginx exited".into()]));
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("nginx exited"), "{bad:?}");
        assert!(
            bad[1].contains("2 watches failed") && bad[1].contains("1 watches left open"),
            "{bad:?}"
        );
        let mut mismatched = memory(0, 0);
        mismatched.backend.impersonation_mismatches = 1;
        assert_eq!(failures(&results(vec![mismatched], Vec::new())).len(), 1);
        let md = markdown(&results(vec![memory(0, 0)], Vec::new()));
        assert!(
            md.contains("| S0 | h1 | 10 | 10 | 0 | 1.0 | 1.1 | 10.00 |"),
            "{md}"
        );
        assert!(md.contains("Every error counter is 0."));
    }
}
