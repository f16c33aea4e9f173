//! The order of the steps and the rates they run at: every system's maximum, the rate sweep at
//! fractions of its group's base rate, the p99 probes bisecting for the highest rate under the
//! bound, the watch steps and the handshake steps.

use selkie_perf::{process::stop, report::LoadReport};
use serde::Serialize;

use crate::{
    report::sut_cpu,
    step::{Kind, Step},
    systems::System,
    Runner,
};

/// A sweep or probe step met the latency bound only if it answered at least this share of the
/// offered rate.
pub(crate) const ACHIEVED_SHARE: f64 = 0.98;

/// The base rate of one group's sweep: the rows measured against one direct row (D, K-D,
/// K-D-list), or a latency-bound row (SW-miss) whose own maximum is lower.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SweepBase {
    pub(crate) protocol: String,
    /// The direct row of the group, or the latency-bound row.
    pub(crate) group: String,
    /// Requests per second the fractions apply to.
    pub(crate) base_rate: f64,
    /// How it was chosen.
    pub(crate) rule: String,
    /// The group's direct row's maximum (closed loop), when measured.
    pub(crate) direct_max: Option<f64>,
    /// A fixed rate given on the command line (`--rate-h1`/`--rate-h2`): one step at the base
    /// rate instead of the sweep.
    pub(crate) given: bool,
}

/// The result of the search for the highest offered rate with p99 below `--p99-bound`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BoundedMax {
    pub(crate) system: System,
    pub(crate) protocol: String,
    /// The highest rate tried that met the bound (answered ≥ 98 % of the offered rate, no error,
    /// p99 below the bound) with every lower rate tried meeting it too; `None`: even the lowest
    /// rate tried missed it.
    pub(crate) rate: Option<f64>,
    /// The lowest rate tried that missed the bound; `None`: none did (the result is a lower
    /// bound: the search stopped at its probe count or the closed-loop maximum).
    pub(crate) lowest_missing: Option<f64>,
    /// The closed-loop maximum, the search's upper end when no rate tried missed the bound.
    pub(crate) ceiling: Option<f64>,
    /// Probe steps run.
    pub(crate) probes: usize,
    /// Every rate tried (sweep and probes) and whether it met the bound.
    pub(crate) tried: Vec<(f64, bool)>,
}

/// A rate rounded to three significant digits (at least 1 request a second), so that the
/// results show rates such as 2,430 rather than 2,431.7.
fn round_rate(rate: f64) -> f64 {
    if !rate.is_finite() || rate <= 1.0 {
        return 1.0;
    }
    let scale = 10f64.powi(rate.log10().floor() as i32 - 2).max(1.0);
    (rate / scale).round() * scale
}

/// Whether a fixed-rate or probe step met the latency bound: answers at (almost) the offered
/// rate, no error, p99 below `bound_us`.
pub(crate) fn meets_bound(load: &LoadReport, bound_us: f64) -> bool {
    load.target_rate > 0.0
        && load.completed > 0
        && load.achieved_rps >= ACHIEVED_SHARE * load.target_rate
        && load.errors == 0
        && load.non_2xx == 0
        && load.latency_us.p99 < bound_us
}

/// What the rates tried so far say about the highest rate under the bound.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bracket {
    /// The highest rate tried that met the bound, below every rate that missed it.
    below: Option<f64>,
    /// Where the search's upper end is.
    above: f64,
    /// `above` is a rate tried that missed the bound (not the closed-loop maximum, or twice
    /// `below` when there is none).
    above_missed: bool,
}

/// The bracket of `tried` (rate, met): the highest passing rate below the lowest missing one,
/// and that missing rate; when none missed, the closed-loop `ceiling` if it is above, else twice
/// the passing rate. `None` when nothing was tried.
fn bracket(tried: &[(f64, bool)], ceiling: Option<f64>) -> Option<Bracket> {
    let lowest_missing = tried
        .iter()
        .filter(|(_, met)| !met)
        .map(|(rate, _)| *rate)
        .reduce(f64::min);
    let below = tried
        .iter()
        .filter(|(rate, met)| *met && lowest_missing.is_none_or(|missing| *rate < missing))
        .map(|(rate, _)| *rate)
        .reduce(f64::max);
    match (below, lowest_missing) {
        (_, Some(missing)) => Some(Bracket {
            below,
            above: missing,
            above_missed: true,
        }),
        (Some(passing), None) => Some(Bracket {
            below,
            above: ceiling
                .filter(|ceiling| *ceiling > passing * 1.02)
                .unwrap_or(passing * 2.0),
            above_missed: false,
        }),
        (None, None) => None,
    }
}

/// The next probe of the bisection: halfway between the bracket's ends, rounded; `None` once the
/// ends are within 2 % of each other (or rounding would repeat an end).
fn next_probe(bracket: &Bracket) -> Option<f64> {
    let low = bracket.below.unwrap_or(0.0);
    if bracket.above - low <= 0.02 * bracket.above {
        return None;
    }
    let probe = round_rate((low + bracket.above) / 2.0);
    (probe > low && probe < bracket.above).then_some(probe)
}

/// The sweep's base rate of every group among `systems` for one protocol: `given` (one fixed
/// rate), else `smoke` (the smoke pass's rate), else the lowest closed-loop maximum among the
/// group's proxies (`maxima`; the direct row's own when the group has no proxy); a latency-bound
/// row gets its own maximum where that is lower. Groups without a usable base are left out.
pub(crate) fn sweep_bases(
    protocol: &str,
    systems: &[System],
    maxima: &[(System, f64)],
    given: Option<f64>,
    smoke: Option<f64>,
) -> Vec<SweepBase> {
    let max_of = |system: System| {
        maxima
            .iter()
            .find(|(s, _)| *s == system)
            .map(|(_, max)| *max)
            .filter(|max| *max > 0.0)
    };
    let mut bases = Vec::new();
    let mut groups: Vec<System> = Vec::new();
    for system in systems {
        if !groups.contains(&system.direct()) {
            groups.push(system.direct());
        }
    }
    for group in groups {
        let members: Vec<System> = systems.iter().copied().filter(|s| s.direct() == group).collect();
        let lowest_proxy = members
            .iter()
            .filter(|s| **s != group && !s.latency_bound())
            .filter_map(|s| max_of(*s).map(|max| (*s, max)))
            .reduce(|a, b| if b.1 < a.1 { b } else { a });
        let (base_rate, rule) = match (given, smoke, lowest_proxy, max_of(group)) {
            (Some(rate), _, _, _) => (rate, format!("--rate-{protocol}")),
            (None, Some(rate), _, _) => (rate, "--smoke-rate".to_string()),
            (None, None, Some((proxy, max)), _) => (
                round_rate(max),
                format!("the lowest maximum among the proxies: {proxy:?}'s {max:.0} req/s"),
            ),
            (None, None, None, Some(max)) => (
                round_rate(max),
                format!("{group:?}'s maximum (no proxy measured)"),
            ),
            (None, None, None, None) => continue,
        };
        let base = SweepBase {
            protocol: protocol.to_string(),
            group: group.id(),
            base_rate,
            rule,
            direct_max: max_of(group),
            given: given.is_some(),
        };
        for bound in members.iter().filter(|s| s.latency_bound()) {
            if let Some(own) =
                max_of(*bound).filter(|own| *own < base_rate && given.is_none() && smoke.is_none())
            {
                bases.push(SweepBase {
                    group: bound.id(),
                    base_rate: round_rate(own),
                    rule: format!(
                        "its own maximum, {own:.0} req/s (bounded by the webhook's latency, not by CPU)"
                    ),
                    ..base.clone()
                });
            }
        }
        bases.push(base);
    }
    bases
}

/// The base of `system`'s sweep: its own (a latency-bound row), else its group's.
fn base_of<'a>(bases: &'a [SweepBase], protocol: &str, system: System) -> Option<&'a SweepBase> {
    let on = |group: String| {
        bases
            .iter()
            .find(move |b| b.protocol == protocol && b.group == group)
    };
    on(system.id()).or_else(|| on(system.direct().id()))
}

/// One line on stderr about a fixed-rate or probe step.
fn log_fixed(step: &Step, bound_us: f64) {
    eprintln!(
        "   p50 {:.0} µs, p99 {:.0} µs, achieved {:.0} req/s, SUT {:?} µs/req, errors {}, mismatches {}{}",
        step.load.latency_us.p50,
        step.load.latency_us.p99,
        step.load.achieved_rps,
        sut_cpu(step),
        step.load.errors,
        step.backend.impersonation_mismatches,
        if meets_bound(&step.load, bound_us) {
            ""
        } else {
            "; misses the p99 bound"
        },
    );
    if let Some(swap) = &step.hot_swap {
        eprintln!(
            "   hot swap: {} configurations written, {} reloads logged",
            swap.swaps_written, swap.reloads_logged
        );
    }
}

/// What the steps of a run recorded.
pub(crate) struct Measured {
    /// Every step, in the order run.
    pub(crate) steps: Vec<Step>,
    /// Systems that did not start and were left out (only S0 may be).
    pub(crate) skipped: Vec<String>,
    /// The rate every sweep's fractions apply to, per protocol and group.
    pub(crate) sweep_bases: Vec<SweepBase>,
    /// Per system and protocol: the highest rate found with p99 below the bound.
    pub(crate) bounded: Vec<BoundedMax>,
}

impl Runner {
    /// Starts every system and runs every step, in order: per protocol the maxima, the sweep,
    /// the p99 probes and the watch steps; then the handshake steps. `bound_us`: the p99 bound.
    pub(crate) fn run_steps(&self, systems: &[System], bound_us: f64) -> anyhow::Result<Measured> {
        let mut steps = Vec::new();
        let mut skipped = Vec::new();
        let mut sweep_bases_all: Vec<SweepBase> = Vec::new();
        let mut bounded: Vec<BoundedMax> = Vec::new();
        let mut quiet_budget = self.args.quiet_budget;
        // Every system is started once and stays up (idle) while the others are measured.
        let mut running = Vec::new();
        for system in systems {
            match self.start(*system) {
                Ok(started) => running.push((*system, started)),
                Err(error) if *system == System::S0 => {
                    eprintln!("S0 not run: {error:#}");
                    skipped.push(format!(
                        "S0 — selkie-concierge did not start with the `staticIdentity` configuration: {error:#}"
                    ));
                }
                Err(error) => return Err(error),
            }
        }
        let up: Vec<System> = running.iter().map(|(system, _)| *system).collect();
        for protocol in &self.args.protocols {
            // First the maximum of every system (a smoke pass has none: its rates are fixed) ...
            let mut maxima: Vec<(System, f64)> = Vec::new();
            let max_steps = if self.args.smoke { &[][..] } else { &running[..] };
            for (system, started) in max_steps {
                eprintln!("-- {system:?} {protocol}: maximum throughput");
                let max = self.step(*system, started, protocol, Kind::Max, &mut quiet_budget)?;
                eprintln!(
                    "   {:.0} req/s, SUT {:?} µs/req, errors {}",
                    max.load.achieved_rps,
                    sut_cpu(&max),
                    max.load.errors
                );
                maxima.push((*system, max.load.achieved_rps));
                steps.push(max);
            }
            // ... then the sweep: every fraction for every system, fraction by fraction, so that
            // the rows compared at one offered rate are measured close together ...
            let given = if protocol == "h2" {
                self.args.rate_h2
            } else {
                self.args.rate_h1
            };
            let smoke = self.args.smoke.then_some(self.args.smoke_rate);
            let bases = sweep_bases(protocol, &up, &maxima, given, smoke);
            let fractions: Vec<Option<f64>> = match given {
                Some(_) => vec![None],
                None => self.args.rate_fractions.iter().copied().map(Some).collect(),
            };
            for fraction in &fractions {
                for (system, started) in &running {
                    let Some(base) = base_of(&bases, protocol, *system) else {
                        continue;
                    };
                    let rate = fraction.map_or(base.base_rate, |f| round_rate(base.base_rate * f));
                    let label =
                        fraction.map_or("fixed rate".to_string(), |f| format!("sweep {:.0} %", f * 100.0));
                    eprintln!("-- {system:?} {protocol}: {label}, {rate:.0} req/s");
                    let mut fixed =
                        self.step(*system, started, protocol, Kind::Fixed(rate), &mut quiet_budget)?;
                    fixed.fraction = *fraction;
                    log_fixed(&fixed, bound_us);
                    steps.push(fixed);
                }
            }
            sweep_bases_all.extend(bases);
            // ... then, per system, the bisection above the highest rate that met the bound ...
            for (system, started) in &running {
                let ceiling = maxima.iter().find(|(s, _)| s == system).map(|(_, max)| *max);
                let mut tried: Vec<(f64, bool)> = steps
                    .iter()
                    .filter(|st| st.system == *system && &st.protocol == protocol && st.kind == "fixed-rate")
                    .map(|st| (st.load.target_rate, meets_bound(&st.load, bound_us)))
                    .collect();
                let mut probes = 0;
                while probes < self.args.probes {
                    let Some(rate) = bracket(&tried, ceiling).as_ref().and_then(next_probe) else {
                        break;
                    };
                    eprintln!("-- {system:?} {protocol}: p99 probe, {rate:.0} req/s");
                    let probe =
                        self.step(*system, started, protocol, Kind::Probe(rate), &mut quiet_budget)?;
                    log_fixed(&probe, bound_us);
                    tried.push((rate, meets_bound(&probe.load, bound_us)));
                    steps.push(probe);
                    probes += 1;
                }
                let found = bracket(&tried, ceiling);
                bounded.push(BoundedMax {
                    system: *system,
                    protocol: protocol.clone(),
                    rate: found.and_then(|b| b.below),
                    lowest_missing: found.filter(|b| b.above_missed).map(|b| b.above),
                    ceiling,
                    probes,
                    tried,
                });
            }
            // ... and the watch step of the K rows.
            for (system, started) in running.iter().filter(|(s, _)| s.in_watch_step()) {
                eprintln!(
                    "-- {system:?} {protocol}: watch, {:.0} updates/s",
                    self.args.watch_rate
                );
                let watch = self.step(*system, started, protocol, Kind::Watch, &mut quiet_budget)?;
                eprintln!(
                    "   {} events of {} updates, p50 {:.0} µs, p99 {:.0} µs, errors {}",
                    watch.load.completed,
                    watch.load.sent,
                    watch.load.latency_us.p50,
                    watch.load.latency_us.p99,
                    watch.load.errors
                );
                steps.push(watch);
            }
        }
        // New TLS connections: one request each, HTTP/1.1.
        if !self.args.no_handshakes {
            let rate = self.args.smoke.then_some(self.args.smoke_rate);
            for (system, started) in running.iter().filter(|(s, _)| s.in_handshake_step()) {
                eprintln!("-- {system:?} h1: handshakes (a new TLS connection per request)");
                let step = self.step(*system, started, "h1", Kind::Handshakes(rate), &mut quiet_budget)?;
                eprintln!(
                    "   {:.0} handshakes/s, SUT {:?} µs/handshake, errors {}",
                    step.load.achieved_rps,
                    sut_cpu(&step),
                    step.load.errors
                );
                steps.push(step);
            }
        }
        for (system, mut started) in running {
            if let Some(child) = started.child.take() {
                stop(child, started.stop_signal, &format!("{system:?}"))?;
            }
        }
        Ok(Measured {
            steps,
            skipped,
            sweep_bases: sweep_bases_all,
            bounded,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_rounded_to_three_significant_digits() {
        assert_eq!(round_rate(8123.4), 8120.0);
        assert_eq!(round_rate(2431.7), 2430.0);
        assert_eq!(round_rate(812.34), 812.0);
        assert_eq!(round_rate(81.25), 81.0);
        assert_eq!(round_rate(34_567.0), 34_600.0);
        assert_eq!(round_rate(0.3), 1.0);
        assert_eq!(round_rate(f64::NAN), 1.0);
    }

    fn load(rate: f64, achieved: f64, p99: f64) -> LoadReport {
        LoadReport {
            target_rate: rate,
            achieved_rps: achieved,
            completed: 1000,
            latency_us: selkie_perf::report::Percentiles {
                p99,
                ..Default::default()
            },
            ..LoadReport::default()
        }
    }

    #[test]
    fn a_step_meets_the_bound_only_at_its_rate_without_errors() {
        assert!(meets_bound(&load(1000.0, 995.0, 4999.0), 5000.0));
        assert!(
            !meets_bound(&load(1000.0, 995.0, 5000.0), 5000.0),
            "p99 at the bound"
        );
        assert!(!meets_bound(&load(1000.0, 970.0, 800.0), 5000.0), "fell behind");
        let mut errors = load(1000.0, 1000.0, 800.0);
        errors.errors = 1;
        assert!(!meets_bound(&errors, 5000.0));
        let mut refused = load(1000.0, 1000.0, 800.0);
        refused.non_2xx = 1;
        assert!(!meets_bound(&refused, 5000.0));
        assert!(!meets_bound(&load(0.0, 0.0, 0.0), 5000.0), "closed loop");
    }

    #[test]
    fn the_search_brackets_the_highest_rate_under_the_bound() {
        let b = |below: Option<f64>, above: f64, above_missed: bool| Bracket {
            below,
            above,
            above_missed,
        };
        // Every sweep step passed: up to the closed-loop maximum, which was not tried.
        let all = [(800.0, true), (2000.0, true), (4000.0, true)];
        assert_eq!(bracket(&all, Some(8000.0)), Some(b(Some(4000.0), 8000.0, false)));
        assert_eq!(next_probe(&b(Some(4000.0), 8000.0, false)), Some(6000.0));
        // No maximum (the smoke pass) or one below the passing rate: twice the passing rate.
        assert_eq!(bracket(&all, None), Some(b(Some(4000.0), 8000.0, false)));
        assert_eq!(bracket(&all, Some(4050.0)), Some(b(Some(4000.0), 8000.0, false)));
        // Passing, then failing.
        let mixed = [(800.0, true), (2000.0, true), (4000.0, false), (6000.0, false)];
        assert_eq!(bracket(&mixed, Some(8000.0)), Some(b(Some(2000.0), 4000.0, true)));
        assert_eq!(next_probe(&b(Some(2000.0), 4000.0, true)), Some(3000.0));
        // A pass above a failure does not count: every lower rate must have passed.
        let noisy = [(800.0, true), (2000.0, false), (4000.0, true)];
        assert_eq!(bracket(&noisy, Some(8000.0)), Some(b(Some(800.0), 2000.0, true)));
        // Even the lowest rate failed: the search goes down from it.
        let none = [(800.0, false), (2000.0, false)];
        assert_eq!(bracket(&none, Some(8000.0)), Some(b(None, 800.0, true)));
        assert_eq!(next_probe(&b(None, 800.0, true)), Some(400.0));
        // Nothing tried; ends within 2 %.
        assert_eq!(bracket(&[], Some(8000.0)), None);
        assert_eq!(next_probe(&b(Some(1000.0), 1015.0, true)), None);
        assert_eq!(next_probe(&b(Some(1.0), 2.0, true)), None, "1.5 rounds to an end");
    }

    #[test]
    fn four_probes_close_in_on_the_limit() {
        // A system whose p99 crosses the bound at 5,200 req/s; the sweep (10–90 % of 8,000)
        // brackets it between 4,000 and 6,000.
        let passes = |rate: f64| rate <= 5200.0;
        let mut tried: Vec<(f64, bool)> = [800.0, 2000.0, 4000.0, 6000.0, 7200.0]
            .iter()
            .map(|rate| (*rate, passes(*rate)))
            .collect();
        let mut probes = Vec::new();
        while probes.len() < 4 {
            let Some(rate) = bracket(&tried, Some(7500.0)).as_ref().and_then(next_probe) else {
                break;
            };
            probes.push(rate);
            tried.push((rate, passes(rate)));
        }
        assert_eq!(probes, [5000.0, 5500.0, 5250.0, 5130.0]);
        let found = bracket(&tried, Some(7500.0)).unwrap();
        assert_eq!((found.below, found.above), (Some(5130.0), 5250.0));
    }

    #[test]
    fn every_group_gets_the_lowest_maximum_among_its_proxies() {
        let (kd, ks0) = (System::KD { list: false }, System::KS0 { list: false });
        let (kd_list, ks0_list) = (System::KD { list: true }, System::KS0 { list: true });
        let miss = System::SW { miss: true };
        let systems = [System::D, System::N, System::S0, miss, kd, ks0, kd_list, ks0_list];
        let maxima = [
            (System::D, 30_000.0),
            (System::N, 9_000.0),
            (System::S0, 8_123.0),
            (miss, 3_000.0),
            (kd, 2_000.0),
            (ks0, 1_500.0),
            (kd_list, 500.0),
            (ks0_list, 401.0),
        ];
        let bases = sweep_bases("h1", &systems, &maxima, None, None);
        let summary: Vec<(String, f64)> = bases.iter().map(|b| (b.group.clone(), b.base_rate)).collect();
        assert_eq!(
            summary,
            [
                ("SW-miss".to_string(), 3000.0),
                ("D".to_string(), 8120.0),
                ("K-D".to_string(), 1500.0),
                ("K-D-list".to_string(), 401.0),
            ]
        );
        assert!(bases[1].rule.contains("S0's 8123 req/s"), "{}", bases[1].rule);
        assert_eq!(bases[1].direct_max, Some(30_000.0));
        assert_eq!(base_of(&bases, "h1", miss).unwrap().group, "SW-miss");
        assert_eq!(base_of(&bases, "h1", System::N).unwrap().group, "D");
        assert_eq!(base_of(&bases, "h1", ks0_list).unwrap().group, "K-D-list");
        assert!(base_of(&bases, "h2", System::N).is_none());
        // Only D: its own maximum.
        let only_d = sweep_bases("h2", &[System::D], &[(System::D, 30_000.0)], None, None);
        assert_eq!(only_d[0].base_rate, 30_000.0);
        // A rate given, or the smoke pass: that rate for every group, no own base for SW-miss.
        for (given, smoke) in [(Some(700.0), None), (None, Some(700.0))] {
            let bases = sweep_bases("h1", &systems, &maxima, given, smoke);
            assert_eq!(bases.len(), 3);
            assert!(bases
                .iter()
                .all(|b| b.base_rate == 700.0 && b.given == given.is_some()));
        }
        // No maximum measured and no rate: no sweep.
        assert!(sweep_bases("h1", &systems, &[], None, None).is_empty());
    }
}
