//! Fixtures the tests of several modules share: a clean fixed-rate step and a results file of
//! steps.

use selkie_perf::{
    process::Machine,
    report::{BackendCounters, LoadReport},
};

use crate::{
    report::{Results, Settings},
    step::Step,
    systems::System,
    PATH,
};

/// A fixed-rate step at 50 % of its base rate: 100 requests sent and answered, 150 at the
/// backend, no error.
pub(crate) fn step(system: System, protocol: &str) -> Step {
    Step {
        system,
        protocol: protocol.into(),
        kind: "fixed-rate",
        fraction: Some(0.5),
        load_average_1m_at_start: 0.0,
        cpu_busy_at_start: 0.0,
        waited_for_quiet_s: 0.0,
        quiet: false,
        busy_during_step: Vec::new(),
        load: LoadReport {
            sent: 100,
            completed: 100,
            ..LoadReport::default()
        },
        backend: BackendCounters {
            requests: 150,
            ..BackendCounters::default()
        },
        idp: None,
        hot_swap: None,
        command: String::new(),
    }
}

/// A results file holding `steps`, with fixed settings.
pub(crate) fn results(steps: Vec<Step>) -> Results {
    Results {
        date_utc: String::new(),
        machine: Machine {
            cpu_model: String::new(),
            cores: String::new(),
            kernel: String::new(),
            memory: String::new(),
            rustc: String::new(),
            nginx: String::new(),
            haproxy: String::new(),
        },
        settings: Settings {
            duration_s: 1.0,
            warmup_s: 0.5,
            h1_connections: 4,
            h2_connections: 1,
            h2_streams: 16,
            handshake_connections: 4,
            swap_interval_ms: 100,
            swap_watch_interval_ms: 50,
            webhook_delay_ms: 1,
            rate_fractions: vec![0.5],
            p99_bound_us: 5000.0,
            probes: 4,
            probe_duration_s: 5.0,
            probe_warmup_s: 2.0,
            watch_rate: 50.0,
            pods: 50,
            path: PATH,
            response_body_bytes: 1024,
        },
        skipped: Vec::new(),
        sweep_bases: Vec::new(),
        bounded: Vec::new(),
        steps,
    }
}
