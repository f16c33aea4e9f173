//! # selkie-perf
//!
//! The side-by-side benchmark harness of `PERF.md`: a fast HTTPS backend that checks the
//! `Impersonate-*` headers it receives and serves watches and upgrade echoes
//! (`selkie-perf-backend`), an identity provider for the JWT and webhook rows (`selkie-perf-idp`),
//! an open- and closed-loop load client (`selkie-perf-load`), the runner that puts direct, nginx,
//! haproxy and Selkie side by side (`selkie-perf-run`, started by `perf/run`) and the stream
//! benchmarks (`selkie-perf-streams`, started by `perf/run-streams`). See `perf/README.md`.
//!
//! The library holds what the binaries share: the test PKI, rustls configuration, CPU-time
//! sampling from `/proc`, child processes and the machine description, the JSON reports the
//! binaries exchange, and reading watch streams line by line.

pub mod pki;
pub mod process;
pub mod procstat;
pub mod report;
pub mod tls;
pub mod watch;

use std::time::Duration;

/// Parses a duration of a command line: `20s`, `500ms`, `2m`, `1.5s` ([`selkie_api::duration`]'s
/// syntax) or a bare number of seconds; not negative.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let with_unit;
    let text = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        with_unit = format!("{text}s");
        with_unit.as_str()
    } else {
        text
    };
    match selkie_api::duration::parse(text) {
        Ok(parsed) if !parsed.negative => Ok(parsed.magnitude),
        Ok(_) => Err(format!("{text:?} is negative")),
        Err(error) => Err(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("fast").is_err());
        assert_eq!(parse_duration("3h"), Ok(Duration::from_secs(3 * 3600)));
        assert!(parse_duration("-3s").is_err());
    }
}
