//! The results: everything `<name>.json` records, and the Markdown tables of `<name>.md`.

use std::fmt::Write as _;

use selkie_perf::process::Machine;
use serde::Serialize;

use crate::{
    step::Step,
    sweep::{meets_bound, BoundedMax, SweepBase, ACHIEVED_SHARE},
    systems::System,
    PODS_PATH, WATCH_PATH,
};

/// Everything recorded.
#[derive(Debug, Serialize)]
pub(crate) struct Results {
    pub(crate) date_utc: String,
    pub(crate) machine: Machine,
    pub(crate) settings: Settings,
    pub(crate) skipped: Vec<String>,
    /// The rate every sweep's fractions apply to, per protocol and group.
    pub(crate) sweep_bases: Vec<SweepBase>,
    /// Per system and protocol: the highest rate found with p99 below the bound.
    pub(crate) bounded: Vec<BoundedMax>,
    pub(crate) steps: Vec<Step>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    pub(crate) duration_s: f64,
    pub(crate) warmup_s: f64,
    pub(crate) h1_connections: usize,
    pub(crate) h2_connections: usize,
    pub(crate) h2_streams: usize,
    pub(crate) handshake_connections: usize,
    pub(crate) swap_interval_ms: u128,
    pub(crate) swap_watch_interval_ms: u128,
    pub(crate) webhook_delay_ms: u128,
    /// The sweep's fractions of the base rates (`sweep_bases`).
    pub(crate) rate_fractions: Vec<f64>,
    pub(crate) p99_bound_us: f64,
    pub(crate) probes: usize,
    pub(crate) probe_duration_s: f64,
    pub(crate) probe_warmup_s: f64,
    pub(crate) watch_rate: f64,
    pub(crate) pods: usize,
    pub(crate) path: &'static str,
    pub(crate) response_body_bytes: usize,
}

/// The backend's mismatch count; "n/a" for the K rows (kube-apiserver counts none).
fn mismatches(step: &Step) -> String {
    if step.system.is_kube() {
        "n/a".into()
    } else {
        step.backend.impersonation_mismatches.to_string()
    }
}

pub(crate) fn sut_cpu(step: &Step) -> Option<f64> {
    step.load
        .cpu
        .iter()
        .find(|c| c.name == "sut")
        .map(|c| c.us_per_request)
}

fn group_cpu(step: &Step, name: &str) -> f64 {
    step.load
        .cpu
        .iter()
        .find(|c| c.name == name)
        .map_or(0.0, |c| c.us_per_request)
}

/// The sweep fraction whose steps fill the fixed-rate table: the one closest to 50 % (PERF.md's
/// "added latency at 50 % load"); `None` when no sweep ran (a rate given per protocol).
pub(crate) fn reference_fraction(fractions: &[f64]) -> Option<f64> {
    fractions
        .iter()
        .copied()
        .reduce(|a, b| if (b - 0.5).abs() < (a - 0.5).abs() { b } else { a })
}

/// `step`'s p50 and p99 minus its direct row's at the same protocol and offered rate; "—" for a
/// direct row or when its direct row has no step at that rate.
fn added_latency(step: &Step, steps: &[Step]) -> String {
    let same_rate = |d: &&Step| {
        d.system == step.system.direct()
            && d.protocol == step.protocol
            && (d.kind == "fixed-rate" || d.kind == "probe" || d.kind == "watch")
            && d.kind == step.kind
            && (d.load.target_rate - step.load.target_rate).abs() < 0.5
    };
    match steps.iter().find(same_rate) {
        Some(d) if step.system != step.system.direct() => format!(
            "{:+.0} / {:+.0}",
            step.load.latency_us.p50 - d.load.latency_us.p50,
            step.load.latency_us.p99 - d.load.latency_us.p99
        ),
        _ => "—".into(),
    }
}

/// The closed-loop maximum of `system`'s direct row at `protocol`.
fn direct_max(steps: &[Step], system: System, protocol: &str) -> Option<f64> {
    steps
        .iter()
        .find(|st| st.kind == "max" && st.protocol == protocol && st.system == system.direct())
        .map(|d| d.load.achieved_rps)
        .filter(|max| *max > 0.0)
}

/// The "max rate at p99 < bound" cell: the rate; `≥ rate` when no rate tried missed the bound
/// (a lower bound); `< rate` when even the lowest rate tried missed it.
fn bounded_cell(found: Option<&BoundedMax>) -> String {
    match found.map(|b| (b.rate, b.lowest_missing)) {
        Some((Some(rate), Some(_))) => format!("{rate:.0}"),
        Some((Some(rate), None)) => format!("≥ {rate:.0}"),
        Some((None, Some(missing))) => format!("< {missing:.0}"),
        _ => "—".into(),
    }
}

/// A bound in µs as the tables write it (`5 ms`, `800 µs`).
fn bound_label(us: f64) -> String {
    if us >= 1000.0 {
        format!("{} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// The cells a fixed-rate step shares across tables: offered and achieved req/s, p50, p99 and
/// p99.9 µs, the added p50 / p99 against its direct row, and the SUT's CPU µs per request.
fn latency_cells(step: &Step, steps: &[Step]) -> String {
    let l = &step.load;
    format!(
        "{:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {}",
        l.target_rate,
        l.achieved_rps,
        l.latency_us.p50,
        l.latency_us.p99,
        l.latency_us.p999,
        added_latency(step, steps),
        sut_cpu(step).map_or("—".into(), |c| format!("{c:.1}")),
    )
}

/// Writes a table's heading (`### title`), its header row and the separator row.
fn table_head(md: &mut String, title: &str, columns: &[&str]) {
    let _ = writeln!(md, "\n### {title}\n");
    let _ = writeln!(md, "| {} |", columns.join(" | "));
    let _ = writeln!(md, "|{}", "---|".repeat(columns.len()));
}

/// The rate sweep of one protocol: every row's fixed-rate and probe steps, by offered rate.
fn sweep_table(results: &Results, protocol: &str, ids: &[String], bound: &str) -> String {
    let mut md = String::new();
    let rows: Vec<&Step> = ids
        .iter()
        .flat_map(|id| {
            let mut own: Vec<&Step> = results
                .steps
                .iter()
                .filter(|st| {
                    st.protocol == protocol
                        && &st.system.id() == id
                        && (st.kind == "fixed-rate" || st.kind == "probe")
                })
                .collect();
            own.sort_by(|a, b| a.load.target_rate.total_cmp(&b.load.target_rate));
            own
        })
        .collect();
    if rows.is_empty() {
        return md;
    }
    table_head(
        &mut md,
        "Rate sweep and p99 probes (open loop; added latency vs D, or K-D, at the same offered rate)",
        &[
            "id",
            "step",
            "% of D's max (K rows: K-D's)",
            "offered req/s",
            "achieved req/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "added p50 / p99 µs",
            "SUT CPU µs/req",
            "non-2xx / errors / mismatches",
            &format!("p99 < {bound}"),
        ],
    );
    for st in rows {
        let l = &st.load;
        let step = match (st.kind, st.fraction) {
            ("probe", _) => "probe".to_string(),
            (_, Some(fraction)) => format!("{} %", fraction * 100.0),
            _ => "fixed".to_string(),
        };
        let share = direct_max(&results.steps, st.system, protocol)
            .map_or("—".into(), |d| format!("{:.0} %", l.target_rate * 100.0 / d));
        let _ = writeln!(
            md,
            "| {:?} | {step} | {share} | {} | {} / {} / {} | {} |",
            st.system,
            latency_cells(st, &results.steps),
            l.non_2xx,
            l.errors,
            mismatches(st),
            if meets_bound(l, results.settings.p99_bound_us) {
                "yes"
            } else {
                "no"
            },
        );
    }
    md
}

/// The watch step of one protocol (K-D, K-S0): update → event latency and every event accounted.
fn watch_table(results: &Results, protocol: &str) -> String {
    let mut md = String::new();
    let rows: Vec<&Step> = results
        .steps
        .iter()
        .filter(|st| st.protocol == protocol && st.kind == "watch")
        .collect();
    if rows.is_empty() {
        return md;
    }
    table_head(
        &mut md,
        "Watch (a ConfigMap watch through the system; the ConfigMap PATCHed directly at kube-apiserver)",
        &[
            "id",
            "updates/s",
            "updates",
            "events",
            "missing",
            "unexpected",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "added p50 / p99 vs K-D µs",
            "PATCH p50 / p99 µs",
            "SUT CPU µs/event",
            "errors",
        ],
    );
    for st in rows {
        let l = &st.load;
        let w = l.watch.clone().unwrap_or_default();
        let _ = writeln!(
            md,
            "| {:?} | {:.0} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.0} / {:.0} | {} | {} |",
            st.system,
            l.target_rate,
            l.sent,
            l.completed,
            w.missing,
            w.unexpected,
            l.latency_us.p50,
            l.latency_us.p99,
            l.latency_us.p999,
            added_latency(st, &results.steps),
            w.update_latency_us.p50,
            w.update_latency_us.p99,
            sut_cpu(st).map_or("—".into(), |c| format!("{c:.1}")),
            l.errors + l.non_2xx,
        );
    }
    md
}

pub(crate) fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let m = &results.machine;
    let ids: Vec<String> = {
        let mut seen: Vec<String> = Vec::new();
        for st in &results.steps {
            if !seen.contains(&st.system.id()) {
                seen.push(st.system.id());
            }
        }
        seen
    };
    let _ = writeln!(md, "# Side-by-side proxy benchmark ({})\n", ids.join(", "));
    let _ = writeln!(
        md,
        "Generated by `perf/run` (`selkie-perf-run`); every number is also in the `.json` beside this file.\n"
    );
    let _ = writeln!(md, "* Date (UTC): {}", results.date_utc);
    let _ = writeln!(
        md,
        "* Machine: {}; {}; {} memory; {}",
        m.cpu_model, m.cores, m.memory, m.kernel
    );
    let _ = writeln!(md, "* Toolchain: {}; {}; {}", m.rustc, m.nginx, m.haproxy);
    let s = &results.settings;
    let bound = bound_label(s.p99_bound_us);
    let _ = writeln!(
        md,
        "* Each step: {} s warm-up, then {} s measured. GET `{}`, {} B JSON answer. HTTP/1.1: {} keep-alive connections; HTTP/2: {} connections ({} streams each in the closed loop).",
        s.warmup_s, s.duration_s, s.path, s.response_body_bytes, s.h1_connections, s.h2_connections, s.h2_streams
    );
    let percents: Vec<String> = s
        .rate_fractions
        .iter()
        .map(|f| format!("{} %", f * 100.0))
        .collect();
    let _ = writeln!(
        md,
        "* Rate sweep: open-loop steps at {} of a base rate, for every row; a group's base rate is the lowest closed-loop maximum among its proxies, so that every row can sustain every step and rows are compared at the same offered rate (see perf/README.md). Base rates:",
        percents.join(", ")
    );
    for base in &results.sweep_bases {
        let share = base
            .direct_max
            .map(|d| {
                format!(
                    " = {:.0} % of {}'s maximum",
                    base.base_rate * 100.0 / d,
                    base.group
                )
            })
            .unwrap_or_default();
        let what = if base.given {
            "one fixed rate"
        } else {
            "sweep base"
        };
        let _ = writeln!(
            md,
            "  * {} {}: {what} {:.0} req/s ({}){share}",
            base.protocol, base.group, base.base_rate, base.rule
        );
    }
    let _ = writeln!(
        md,
        "* Max rate at p99 < {bound}: the highest offered rate whose step answered ≥ {:.0} % of it with no error and p99 < {bound}, every lower rate tried passing too; from the sweep plus up to {} probes ({} s warm-up, {} s measured) bisecting between the highest passing and the lowest failing rate (or the closed-loop maximum). `≥` when no rate tried failed, `<` when even the lowest did.",
        ACHIEVED_SHARE * 100.0,
        s.probes,
        s.probe_warmup_s,
        s.probe_duration_s
    );
    if let Some(list) = results
        .steps
        .iter()
        .find(|st| st.system == (System::KD { list: true }) && st.load.completed > 0)
    {
        let _ = writeln!(
            md,
            "* K-D-list / K-S0-list: GET `{PODS_PATH}` listing {} Pending pods (about {:.0} KiB of JSON per answer).",
            s.pods,
            list.load.body_bytes as f64 / list.load.completed as f64 / 1024.0
        );
    }
    if results.steps.iter().any(|st| st.kind == "watch") {
        let _ = writeln!(
            md,
            "* Watch step (K-D, K-S0): `GET {WATCH_PATH}` held through the system while the load client PATCHes that ConfigMap directly at kube-apiserver (admin certificate, HTTP/2) {:.0} times a second; latency from sending each PATCH to its event's arrival.",
            s.watch_rate
        );
    }
    let unquiet = results.steps.iter().filter(|st| !st.quiet).count();
    if unquiet > 0 {
        let _ = writeln!(
            md,
            "\n**Warning: {unquiet} of {} steps started on a machine that was not quiet** (see the load columns).",
            results.steps.len()
        );
    }
    let disturbed: Vec<String> = results
        .steps
        .iter()
        .filter(|st| !st.busy_during_step.is_empty())
        .map(|st| {
            format!(
                "{:?} {} {} ({})",
                st.system,
                st.protocol,
                st.kind,
                st.busy_during_step.join(", ")
            )
        })
        .collect();
    if disturbed.is_empty() {
        let _ = writeln!(
            md,
            "* No compiler or kube-apiserver was seen during any step (polled every second)."
        );
    } else {
        let _ = writeln!(
            md,
            "\n**Warning: other work ran during {} steps**: {}.",
            disturbed.len(),
            disturbed.join("; ")
        );
    }
    for skipped in &results.skipped {
        let _ = writeln!(md, "* Not run: {skipped}");
    }

    let protocols: Vec<String> = {
        let mut seen = Vec::new();
        for step in &results.steps {
            if !seen.contains(&step.protocol) {
                seen.push(step.protocol.clone());
            }
        }
        seen
    };
    let reference = reference_fraction(&s.rate_fractions);
    for protocol in &protocols {
        let label = if protocol == "h2" {
            "HTTP/2"
        } else {
            "HTTP/1.1 keep-alive"
        };
        let steps = |kind: &'static str| {
            results
                .steps
                .iter()
                .filter(move |st| &st.protocol == protocol && st.kind == kind)
        };
        // The fixed-rate table: the sweep's step nearest 50 %, or the one rate given.
        let fixed = || steps("fixed-rate").filter(|st| st.fraction.is_none() || st.fraction == reference);
        let nginx_fixed = fixed().find(|st| st.system == System::N);

        let _ = writeln!(md, "\n## Client → system: {label}\n");
        let title = match reference {
            Some(f) if fixed().any(|st| st.fraction.is_some()) => {
                format!("the sweep's {} % step", f * 100.0)
            }
            _ => "one rate".to_string(),
        };
        let _ = writeln!(
            md,
            "### Fixed rate: {title} (open loop; latency from the intended send time)\n"
        );
        let _ = writeln!(
            md,
            "| id | system | offered req/s | achieved req/s | p50 µs | p99 µs | p99.9 µs | added p50 / p99 vs D (K rows: vs K-D) µs | SUT CPU µs/req | ÷ N | backend CPU µs/req | non-2xx | errors | mismatches | load 1m / busy at start |"
        );
        let _ = writeln!(
            md,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for st in fixed() {
            let l = &st.load;
            let cpu = sut_cpu(st);
            let ratio = match (cpu, nginx_fixed.and_then(sut_cpu)) {
                (Some(c), Some(n))
                    if n > 0.0 && nginx_fixed.is_some_and(|n| n.load.target_rate == l.target_rate) =>
                {
                    format!("{:.2}", c / n)
                }
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {:?} | {} | {} | {} | {:.1} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                st.system.describe(),
                latency_cells(st, &results.steps),
                ratio,
                group_cpu(st, "backend"),
                l.non_2xx,
                l.errors,
                mismatches(st),
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
        md.push_str(&sweep_table(results, protocol, &ids, &bound));
        let _ = writeln!(
            md,
            "\n### Maximum throughput (closed loop; latency from the actual send time)\n"
        );
        let _ = writeln!(
            md,
            "| id | req/s | ÷ D | max rate at p99 < {bound} | p50 µs | p99 µs | SUT CPU µs/req | backend CPU µs/req | load client CPU µs/req | non-2xx | errors | mismatches | SUT RSS MiB | load 1m / busy at start |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for st in steps("max") {
            let l = &st.load;
            let rss = l
                .cpu
                .iter()
                .find(|c| c.name == "sut")
                .map_or("—".into(), |c| format!("{:.1}", c.rss_kib as f64 / 1024.0));
            let found = results
                .bounded
                .iter()
                .find(|b| b.system == st.system && &b.protocol == protocol);
            let _ = writeln!(
                md,
                "| {:?} | {:.0} | {} | {} | {:.0} | {:.0} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                l.achieved_rps,
                direct_max(&results.steps, st.system, protocol)
                    .map_or("—".into(), |d| format!("{:.2}", l.achieved_rps / d)),
                bounded_cell(found),
                l.latency_us.p50,
                l.latency_us.p99,
                sut_cpu(st).map_or("—".into(), |c| format!("{c:.1}")),
                group_cpu(st, "backend"),
                group_cpu(st, "load"),
                l.non_2xx,
                l.errors,
                mismatches(st),
                rss,
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
        md.push_str(&watch_table(results, protocol));
        let notes: Vec<String> = results
            .steps
            .iter()
            .filter(|st| &st.protocol == protocol && st.kind != "handshake")
            .filter_map(|st| {
                let answered = st.load.completed;
                let step = match st.kind {
                    "max" => "max".to_string(),
                    kind => format!("{kind} {:.0} req/s", st.load.target_rate),
                };
                if let Some(swap) = &st.hot_swap {
                    Some(format!(
                        "* {:?} {step}: {} configurations written during the step (every {} ms), {} reloads logged by Selkie; {} errors",
                        st.system,
                        swap.swaps_written,
                        results.settings.swap_interval_ms,
                        swap.reloads_logged,
                        st.load.errors + st.load.non_2xx
                    ))
                } else {
                    st.idp.as_ref().map(|idp| {
                        format!(
                            "* {:?} {step}: identity provider served {} TokenReviews ({} refused), {} discovery and {} JWKS requests for {} answers in the window (warm-up included in its counts)",
                            st.system,
                            idp.reviews,
                            idp.refused_reviews,
                            idp.discovery,
                            idp.jwks,
                            answered
                        )
                    })
                }
            })
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(md, "\nHot swaps and identity provider:\n");
            for note in notes {
                let _ = writeln!(md, "{note}");
            }
        }
        let _ = writeln!(
            md,
            "\nTLS and upstream protocol seen (fixed-rate table's steps):\n"
        );
        for st in fixed() {
            let backend = if st.system.is_kube() {
                "kube-apiserver (no backend counters)".to_string()
            } else {
                format!(
                    "backend got {} HTTP/1.1 and {} HTTP/2 requests over {} new connections",
                    st.backend.http1_requests, st.backend.http2_requests, st.backend.connections
                )
            };
            let _ = writeln!(
                md,
                "* {:?}: client TLS {} {} ALPN {}; {backend}; client send lag p50/p99 {:.0}/{:.0} µs",
                st.system,
                st.load.tls.version,
                st.load.tls.suite,
                st.load.tls.alpn,
                st.load.send_lag_us.p50,
                st.load.send_lag_us.p99,
            );
        }
    }

    let handshakes: Vec<&Step> = results.steps.iter().filter(|st| st.kind == "handshake").collect();
    if !handshakes.is_empty() {
        let nginx = handshakes
            .iter()
            .find(|st| st.system == System::N)
            .and_then(|st| sut_cpu(st));
        let mode = if handshakes.iter().all(|st| st.load.mode == "closed") {
            format!(
                "closed loop, {} connections at a time",
                results.settings.handshake_connections
            )
        } else {
            "open loop".to_string()
        };
        let _ = writeln!(
            md,
            "\n## New TLS connections (HTTP/1.1, one request per connection, `Connection: close`; {mode})\n"
        );
        let _ = writeln!(
            md,
            "Each request opens a new TLS 1.3 connection (ECDSA P-256, full handshake, no resumption), sends one GET and closes. CPU per handshake is the SUT's CPU ÷ completed requests, so it includes the one request; D has no SUT (the backend's column is its cost).\n"
        );
        let _ = writeln!(
            md,
            "| id | system | handshakes/s | p50 µs | p99 µs | SUT CPU µs/handshake | ÷ N | backend CPU µs/handshake | load client CPU µs/handshake | non-2xx | errors | mismatches | load 1m / busy at start |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for st in handshakes {
            let l = &st.load;
            let cpu = sut_cpu(st);
            let ratio = match (cpu, nginx) {
                (Some(c), Some(n)) if n > 0.0 => format!("{:.2}", c / n),
                _ => "—".into(),
            };
            let _ = writeln!(
                md,
                "| {:?} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {:.2} / {:.0} % |",
                st.system,
                st.system.describe(),
                l.achieved_rps,
                l.latency_us.p50,
                l.latency_us.p99,
                cpu.map_or("—".into(), |c| format!("{c:.1}")),
                ratio,
                group_cpu(st, "backend"),
                group_cpu(st, "load"),
                l.non_2xx,
                l.errors,
                mismatches(st),
                st.load_average_1m_at_start,
                st.cpu_busy_at_start * 100.0,
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        sweep::sweep_bases,
        testing::{results, step},
    };

    fn at(
        system: System,
        protocol: &str,
        kind: &'static str,
        fraction: Option<f64>,
        rate: f64,
        p50: f64,
    ) -> Step {
        let mut st = step(system, protocol);
        st.kind = kind;
        st.fraction = fraction;
        st.load.target_rate = rate;
        st.load.achieved_rps = if kind == "max" { rate } else { rate * 0.999 };
        st.load.latency_us.p50 = p50;
        st.load.latency_us.p99 = p50 * 2.0;
        st.load.latency_us.p999 = p50 * 3.0;
        st.load.cpu.push(selkie_perf::report::CpuUse {
            name: "sut".into(),
            us_per_request: 30.0,
            ..Default::default()
        });
        st
    }

    #[test]
    fn the_tables_show_the_sweep_the_bound_and_the_watch() {
        let (kd, ks0) = (System::KD { list: false }, System::KS0 { list: false });
        let mut all = results(vec![
            at(System::D, "h1", "max", None, 30_000.0, 500.0),
            at(System::S0, "h1", "max", None, 8_000.0, 900.0),
            at(System::D, "h1", "fixed-rate", Some(0.1), 800.0, 100.0),
            at(System::S0, "h1", "fixed-rate", Some(0.1), 800.0, 130.0),
            at(System::D, "h1", "fixed-rate", Some(0.5), 4_000.0, 110.0),
            at(System::S0, "h1", "fixed-rate", Some(0.5), 4_000.0, 150.0),
            at(System::S0, "h1", "probe", None, 6_000.0, 3_000.0),
            at(kd, "h1", "watch", None, 50.0, 900.0),
            at(ks0, "h1", "watch", None, 50.0, 1_000.0),
        ]);
        all.settings.rate_fractions = vec![0.1, 0.5];
        all.steps[8].load.watch = Some(selkie_perf::report::WatchReport {
            established: true,
            missing: 2,
            ..Default::default()
        });
        all.bounded = vec![
            BoundedMax {
                system: System::D,
                protocol: "h1".into(),
                rate: Some(7_000.0),
                lowest_missing: None,
                ceiling: Some(30_000.0),
                probes: 4,
                tried: Vec::new(),
            },
            BoundedMax {
                system: System::S0,
                protocol: "h1".into(),
                rate: Some(4_000.0),
                lowest_missing: Some(6_000.0),
                ceiling: Some(8_000.0),
                probes: 1,
                tried: Vec::new(),
            },
        ];
        all.sweep_bases = sweep_bases(
            "h1",
            &[System::D, System::S0],
            &[(System::D, 30_000.0), (System::S0, 8_000.0)],
            None,
            None,
        );
        let md = markdown(&all);
        let line = |start: &str| {
            md.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no line {start:?} in\n{md}"))
                .to_string()
        };
        assert!(
            md.contains("* Rate sweep: open-loop steps at 10 %, 50 % of a base rate"),
            "{md}"
        );
        assert!(
            md.contains("  * h1 D: sweep base 8000 req/s (the lowest maximum among the proxies: S0's 8000 req/s) = 27 % of D's maximum"),
            "{md}"
        );
        // The fixed-rate table holds the 50 % steps.
        assert!(md.contains("### Fixed rate: the sweep's 50 % step"), "{md}");
        assert!(line("| S0 | Selkie, static identity | 4000 |").contains("| +40 / +80 |"));
        // The sweep table: every step by rate, added latency at the same rate, the bound.
        assert_eq!(
            line("| S0 | 10 % |"),
            "| S0 | 10 % | 3 % | 800 | 799 | 130 | 260 | 390 | +30 / +60 | 30.0 | 0 / 0 / 0 | yes |"
        );
        assert_eq!(
            line("| S0 | probe |"),
            "| S0 | probe | 20 % | 6000 | 5994 | 3000 | 6000 | 9000 | — | 30.0 | 0 / 0 / 0 | no |"
        );
        assert!(
            line("| D | 50 % |").contains("| — |"),
            "a direct row adds nothing"
        );
        // The maximum table's new column.
        assert!(
            md.contains("| id | req/s | ÷ D | max rate at p99 < 5 ms |"),
            "{md}"
        );
        assert!(line("| D | 30000 |").starts_with("| D | 30000 | 1.00 | ≥ 7000 |"));
        assert!(line("| S0 | 8000 |").starts_with("| S0 | 8000 | 0.27 | 4000 |"));
        // The watch table, K-S0 against K-D.
        assert_eq!(
            line("| K-S0 | 50 |"),
            "| K-S0 | 50 | 100 | 100 | 2 | 0 | 1000 | 2000 | 3000 | +100 / +200 | 0 / 0 | 30.0 | 0 |"
        );
        assert!(bounded_cell(None) == "—");
        let below_all = BoundedMax {
            system: System::S0,
            protocol: "h1".into(),
            rate: None,
            lowest_missing: Some(800.0),
            ceiling: None,
            probes: 0,
            tried: Vec::new(),
        };
        assert_eq!(bounded_cell(Some(&below_all)), "< 800");
    }
}
