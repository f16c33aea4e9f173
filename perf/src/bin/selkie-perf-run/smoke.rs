//! The smoke pass's verdict (what `make test` runs): whether every system and protocol ran and
//! every error counter stayed 0.

use crate::{report::Results, systems::System};

/// What is wrong with a smoke pass's results: a system or protocol that did not run (or ran
/// fewer sweep steps than there are fractions), a step without answers, or any non-zero error
/// counter. Empty when the pass is good.
fn smoke_failures(systems: &[System], protocols: &[String], results: &Results) -> Vec<String> {
    let mut failures: Vec<String> = results
        .skipped
        .iter()
        .map(|skipped| format!("not run: {skipped}"))
        .collect();
    for system in systems {
        for protocol in protocols {
            let ran = |kind: &str| {
                results
                    .steps
                    .iter()
                    .filter(|st| st.system == *system && &st.protocol == protocol && st.kind == kind)
                    .count()
            };
            let sweep = results.settings.rate_fractions.len();
            if ran("fixed-rate") == 0 {
                failures.push(format!("{system:?} {protocol}: no step ran"));
            } else if ran("fixed-rate") < sweep {
                failures.push(format!(
                    "{system:?} {protocol}: {} of {sweep} sweep steps ran",
                    ran("fixed-rate")
                ));
            }
        }
    }
    for st in &results.steps {
        let (l, b) = (&st.load, &st.backend);
        let id = format!("{:?} {} {}", st.system, st.protocol, st.kind);
        let mut check = |bad: bool, what: String| {
            if bad {
                failures.push(format!("{id}: {what}"));
            }
        };
        check(l.completed == 0, "no request was answered".into());
        check(l.non_2xx > 0, format!("{} answers outside 200–299", l.non_2xx));
        check(
            l.errors > 0,
            format!(
                "{} failed requests ({} timed out): {:?}",
                l.errors, l.timeouts, l.error_examples
            ),
        );
        check(
            l.reconnects > 0,
            format!("{} connections closed and re-established", l.reconnects),
        );
        let backend = !st.system.is_kube();
        check(
            backend && b.impersonation_mismatches > 0,
            format!(
                "{} impersonation mismatches at the backend: {:?}",
                b.impersonation_mismatches, b.mismatch_examples
            ),
        );
        check(
            backend && b.handshake_failures > 0,
            format!("{} failed TLS handshakes at the backend", b.handshake_failures),
        );
        // Every answer must come from the backend (through the system), not the system itself.
        check(
            backend && b.requests < l.completed,
            format!(
                "the backend served {} requests but the client got {} answers",
                b.requests, l.completed
            ),
        );
        if let Some(swap) = &st.hot_swap {
            check(swap.swaps_written == 0, "no configuration was written".into());
            check(
                swap.reloads_logged == 0,
                format!(
                    "{} configurations written but Selkie logged no reload",
                    swap.swaps_written
                ),
            );
        }
        if let Some(idp) = &st.idp {
            check(
                idp.refused_reviews > 0 || idp.bad_requests > 0,
                format!(
                    "the identity provider refused {} tokens and got {} bad requests",
                    idp.refused_reviews, idp.bad_requests
                ),
            );
            // A new token every request: every answer needs a review of its own.
            check(
                st.system == (System::SW { miss: true }) && idp.reviews < l.completed,
                format!(
                    "{} TokenReviews for {} answers with a new token each",
                    idp.reviews, l.completed
                ),
            );
        }
    }
    failures
}

/// The end of a smoke pass: one line on stderr per step, then an error when
/// [`smoke_failures`] finds anything.
pub(crate) fn check_smoke(systems: &[System], protocols: &[String], results: &Results) -> anyhow::Result<()> {
    let failures = smoke_failures(systems, protocols, results);
    for step in &results.steps {
        let l = &step.load;
        eprintln!(
            "smoke {:?} {} {}: {} answered of {} sent at {:.0} req/s, p50 {:.0} µs, non-2xx {}, errors {}, reconnects {}, backend requests {}, mismatches {}, handshake failures {}{}",
            step.system,
            step.protocol,
            step.kind,
            l.completed,
            l.sent,
            l.target_rate,
            l.latency_us.p50,
            l.non_2xx,
            l.errors,
            l.reconnects,
            step.backend.requests,
            step.backend.impersonation_mismatches,
            step.backend.handshake_failures,
            match (&step.hot_swap, &step.idp) {
                (Some(swap), _) => format!(
                    ", configurations written {}, reloads logged {}",
                    swap.swaps_written, swap.reloads_logged
                ),
                (None, Some(idp)) => format!(
                    ", TokenReviews {}, refused {}, discovery {}, JWKS {}",
                    idp.reviews, idp.refused_reviews, idp.discovery, idp.jwks
                ),
                (None, None) => String::new(),
            },
        );
    }
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("smoke FAILED: {failure}");
        }
        anyhow::bail!("the perf smoke pass failed ({} problems)", failures.len());
    }
    eprintln!(
        "smoke passed: {} steps ({} systems × {} protocols: {} sweep steps, {} p99 probes; {} handshake steps), every error counter 0",
        results.steps.len(),
        systems.len(),
        protocols.len(),
        results.steps.iter().filter(|st| st.kind == "fixed-rate").count(),
        results.steps.iter().filter(|st| st.kind == "probe").count(),
        results.steps.iter().filter(|st| st.kind == "handshake").count()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        hotswap::HotSwap,
        idp::IdpCounters,
        step::Step,
        systems::JwtAlg,
        testing::{results, step},
    };

    #[test]
    fn a_clean_smoke_pass_has_no_failures() {
        let all = results(vec![step(System::D, "h1"), step(System::S0, "h1")]);
        assert_eq!(
            smoke_failures(&[System::D, System::S0], &["h1".into()], &all),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_error_counter_fails_the_smoke_pass() {
        let systems = [System::SX];
        let protocols = ["h2".to_string()];
        type Spoil = fn(&mut Step);
        let cases: [(&str, Spoil); 7] = [
            ("no request was answered", |s| s.load.completed = 0),
            ("answers outside 200–299", |s| s.load.non_2xx = 1),
            ("failed requests", |s| s.load.errors = 2),
            ("re-established", |s| s.load.reconnects = 1),
            ("impersonation mismatches", |s| {
                s.backend.impersonation_mismatches = 3
            }),
            ("failed TLS handshakes", |s| s.backend.handshake_failures = 1),
            ("the backend served 99 requests", |s| s.backend.requests = 99),
        ];
        for (expected, spoil) in cases {
            let mut bad = step(System::SX, "h2");
            spoil(&mut bad);
            let failures = smoke_failures(&systems, &protocols, &results(vec![bad]));
            assert_eq!(failures.len(), 1, "{expected}: {failures:?}");
            assert!(failures[0].starts_with("SX h2 fixed-rate: "), "{failures:?}");
            assert!(failures[0].contains(expected), "{expected}: {failures:?}");
        }
    }

    #[test]
    fn hot_swaps_and_reviews_are_checked() {
        let mut sr = step(System::SR, "h1");
        sr.hot_swap = Some(HotSwap {
            swaps_written: 15,
            reloads_logged: 0,
        });
        let failures = smoke_failures(&[System::SR], &["h1".into()], &results(vec![sr]));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("no reload"), "{failures:?}");

        let miss = System::SW { miss: true };
        let mut sw = step(miss, "h1");
        sw.idp = Some(IdpCounters {
            reviews: 99,
            ..IdpCounters::default()
        });
        let failures = smoke_failures(&[miss], &["h1".into()], &results(vec![sw]));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains("99 TokenReviews for 100 answers"),
            "{failures:?}"
        );

        let es256 = System::SJ {
            alg: JwtAlg::Es256,
            tokens: 1,
            cache: true,
        };
        let mut sj = step(es256, "h2");
        sj.idp = Some(IdpCounters {
            refused_reviews: 1,
            ..IdpCounters::default()
        });
        let failures = smoke_failures(&[es256], &["h2".into()], &results(vec![sj]));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].starts_with("SJ-ES256-1 h2 fixed-rate: "),
            "{failures:?}"
        );
    }

    #[test]
    fn a_system_that_did_not_run_fails_the_smoke_pass() {
        let mut partial = results(vec![step(System::D, "h1")]);
        partial.skipped.push("S0 — did not start".into());
        let failures = smoke_failures(&[System::D, System::S0], &["h1".into(), "h2".into()], &partial);
        assert_eq!(
            failures,
            [
                "not run: S0 — did not start",
                "D h2: no step ran",
                "S0 h1: no step ran",
                "S0 h2: no step ran"
            ]
        );
    }

    #[test]
    fn a_sweep_with_fewer_steps_than_fractions_fails_the_smoke_pass() {
        let mut all = results(vec![step(System::D, "h1"), step(System::D, "h1")]);
        all.settings.rate_fractions = vec![0.5, 1.0];
        assert_eq!(
            smoke_failures(&[System::D], &["h1".into()], &all),
            Vec::<String>::new()
        );
        all.steps.pop();
        assert_eq!(
            smoke_failures(&[System::D], &["h1".into()], &all),
            ["D h1: 1 of 2 sweep steps ran"]
        );
    }
}
