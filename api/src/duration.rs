//! Durations written as Kubernetes and Go write them (`metav1.Duration`, Go's
//! `time.ParseDuration`): one or more decimal numbers, each with an optional fraction and a unit
//! (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), optionally signed, e.g. `10s`, `1m30s`, `1.5h`,
//! `-5s`; a bare `0` is zero. Every Selkie configuration file and command-line flag reads its
//! durations through [`parse`], and applies its own policy (no negatives, whole numbers only, …)
//! to what it returns.

use std::time::Duration;

/// A parsed duration: its sign and size, and whether any part had a fraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration {
    /// A leading `-` (and not zero).
    pub negative: bool,
    /// The size.
    pub magnitude: Duration,
    /// Some number was written with a decimal point (`1.5s`).
    pub fractional: bool,
}

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Empty, a number without a unit (other than a bare `0`), an unknown unit, or not a number.
    #[error("{0:?} is not a duration such as 10s, 1m30s or 500ms")]
    Malformed(String),
    /// A number is given without a unit.
    #[error("{0:?} has no unit (h, m, s, ms, us or ns)")]
    NoUnit(String),
    /// Larger than Go's `time.Duration` holds (2^63 - 1 nanoseconds, about 292 years; 2^63 when
    /// negative), which `time.ParseDuration` refuses too. Any duration this returns can be added
    /// to the current time of any clock without overflowing it.
    #[error("{0:?} is not a duration that fits: too large")]
    TooLarge(String),
}

/// Parses `text` as Go's `time.ParseDuration` does; see the module documentation.
pub fn parse(text: &str) -> Result<GoDuration, DurationError> {
    let malformed = || DurationError::Malformed(text.to_string());
    let too_large = || DurationError::TooLarge(text.to_string());
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(GoDuration {
            negative: false,
            magnitude: Duration::ZERO,
            fractional: false,
        });
    }
    if rest.is_empty() {
        return Err(malformed());
    }
    let mut nanos: u128 = 0;
    let mut fractional = false;
    while !rest.is_empty() {
        let whole_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (whole, after) = rest.split_at(whole_end);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => {
                let end = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
                fractional = true;
                after.split_at(end)
            }
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(malformed());
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(DurationError::NoUnit(text.to_string())),
            _ => return Err(malformed()),
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_large())?
        };
        let mut part = whole.checked_mul(per_unit).ok_or_else(too_large)?;
        // The fraction's digits beyond nanosecond precision are dropped, as Go drops them.
        let mut scale = per_unit;
        for digit in fraction.bytes() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            part = part
                .checked_add(u128::from(digit - b'0') * scale)
                .ok_or_else(too_large)?;
        }
        nanos = nanos.checked_add(part).ok_or_else(too_large)?;
        rest = after;
    }
    // Go's bounds: an int64 of nanoseconds, one further below zero than above.
    let limit: u128 = if negative { 1 << 63 } else { (1 << 63) - 1 };
    if nanos > limit {
        return Err(too_large());
    }
    let seconds = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_large())?;
    let sub_second = u32::try_from(nanos % 1_000_000_000).map_err(|_| too_large())?;
    let magnitude = Duration::new(seconds, sub_second);
    Ok(GoDuration {
        negative: negative && !magnitude.is_zero(),
        magnitude,
        fractional,
    })
}

/// `duration` in whole seconds, written as [`parse`] reads it and without Go's zero parts:
/// `9h`, `1h30m`, `90s` is `1m30s`, zero is `0s`. Fractions of a second are dropped.
pub fn format(duration: Duration) -> String {
    let total = duration.as_secs();
    let mut text = String::new();
    for (size, unit) in [(3600, 'h'), (60, 'm'), (1, 's')] {
        let part = total / size % if size == 3600 { u64::MAX } else { 60 };
        if part > 0 {
            text.push_str(&format!("{part}{unit}"));
        }
    }
    if text.is_empty() {
        text.push_str("0s");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_formatted_duration_is_read_back_as_itself() {
        for (seconds, text) in [
            (0, "0s"),
            (59, "59s"),
            (90, "1m30s"),
            (3600, "1h"),
            (32400, "9h"),
            (5400, "1h30m"),
            (2_592_000, "720h"),
            (3661, "1h1m1s"),
        ] {
            assert_eq!(format(Duration::from_secs(seconds)), text);
            assert_eq!(positive(text), Duration::from_secs(seconds));
        }
        assert_eq!(format(Duration::from_millis(1500)), "1s");
    }

    fn positive(text: &str) -> Duration {
        let parsed = parse(text).unwrap();
        assert!(!parsed.negative, "{text}");
        parsed.magnitude
    }

    #[test]
    fn go_syntax() {
        assert_eq!(positive("0"), Duration::ZERO);
        assert_eq!(positive("0s"), Duration::ZERO);
        assert_eq!(positive("10s"), Duration::from_secs(10));
        assert_eq!(positive("+10s"), Duration::from_secs(10));
        assert_eq!(positive("1m30s"), Duration::from_secs(90));
        assert_eq!(positive("2h"), Duration::from_secs(7200));
        assert_eq!(positive("1.5h"), Duration::from_secs(5400));
        assert_eq!(positive(".5s"), Duration::from_millis(500));
        assert_eq!(positive("250ms"), Duration::from_millis(250));
        assert_eq!(positive("3us"), Duration::from_micros(3));
        assert_eq!(positive("3µs"), Duration::from_micros(3));
        assert_eq!(positive("7ns"), Duration::from_nanos(7));
        assert_eq!(
            positive("1.0000000019s"),
            Duration::new(1, 1),
            "beyond nanoseconds is dropped"
        );
        assert!(parse("1.5s").unwrap().fractional);
        assert!(!parse("1s").unwrap().fractional);
        let negative = parse("-5s").unwrap();
        assert!(negative.negative);
        assert_eq!(negative.magnitude, Duration::from_secs(5));
        assert!(!parse("-0s").unwrap().negative);
    }

    #[test]
    fn the_range_is_go_time_durations() {
        // Go's largest Duration, and one nanosecond past it.
        assert_eq!(
            positive("2562047h47m16.854775807s"),
            Duration::new(9_223_372_036, 854_775_807)
        );
        for too_large in ["2562047h47m16.854775808s", "2562048h", "5000000000000000h"] {
            let error = parse(too_large).unwrap_err().to_string();
            assert!(error.contains("too large"), "{too_large:?}: {error}");
        }
        // Below zero Go reaches one nanosecond further.
        let lowest = parse("-2562047h47m16.854775808s").unwrap();
        assert!(lowest.negative);
        assert_eq!(lowest.magnitude, Duration::new(9_223_372_036, 854_775_808));
        assert!(parse("-2562047h47m16.854775809s").is_err());
        // So whatever parses can be added to a clock: `--timeout 5000000000000000h` was once
        // accepted and then overflowed the monotonic clock.
        let longest = positive("2562047h47m16.854775807s");
        assert!(std::time::Instant::now().checked_add(longest).is_some());
        assert!(std::time::SystemTime::now().checked_add(longest).is_some());
    }

    #[test]
    fn mistakes_are_named() {
        for (text, expected) in [
            ("", "not a duration"),
            ("-", "not a duration"),
            ("s", "not a duration"),
            (".s", "not a duration"),
            ("10d", "not a duration"),
            ("10 s", "not a duration"),
            ("1s-", "not a duration"),
            ("10", "has no unit"),
            ("1m30", "has no unit"),
            ("99999999999999999999999999999999999999999h", "too large"),
            ("18446744073709551615h", "too large"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
