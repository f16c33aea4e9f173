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

/// Parses `20s`, `500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 20s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" | "" => Ok(Duration::from_secs(number)),
        "m" => Ok(Duration::from_secs(number * 60)),
        _ => Err(format!("{text:?} is not a duration such as 20s, 500ms or 2m")),
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
        assert!(parse_duration("3h").is_err());
    }
}
