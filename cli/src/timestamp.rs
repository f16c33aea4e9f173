//! Timestamps as Kubernetes writes them (`metav1.Time`): RFC 3339, UTC, whole seconds; and
//! deadlines on the monotonic clock.

use time::{format_description::well_known::Rfc3339, OffsetDateTime, PrimitiveDateTime, UtcOffset};

/// Parses an RFC 3339 timestamp (any offset, optional fraction) into UTC. `None` if it is not
/// one, or if it names a moment UTC cannot represent (such as `9999-12-31T23:59:59-01:00`, which
/// is in the year 10000): such a text comes from a server or a file, never from a clock, and
/// refusing it here keeps every later conversion total.
pub fn parse(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339)
        .ok()?
        .checked_to_offset(UtcOffset::UTC)
}

/// Formats `moment` as `metav1.Time` marshals it: `2006-01-02T15:04:05Z`, in UTC, the fraction of
/// a second dropped. Never panics: a moment past the years UTC can represent (only possible with
/// an offset, and never from [`parse`] or [`now`]) is written as the nearest one it can.
pub fn format(moment: OffsetDateTime) -> String {
    let utc = moment.checked_to_offset(UtcOffset::UTC).unwrap_or_else(|| {
        if moment.offset().is_negative() {
            PrimitiveDateTime::MAX.assume_utc()
        } else {
            PrimitiveDateTime::MIN.assume_utc()
        }
    });
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        utc.year(),
        u8::from(utc.month()),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second()
    )
}

/// The current time.
pub fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// The moment `timeout` from now on tokio's monotonic clock. Never panics: a timeout the clock
/// cannot represent (a caller's `Duration::MAX`, say) gives a deadline a century away, which no
/// command outlives.
pub fn deadline(timeout: std::time::Duration) -> tokio::time::Instant {
    const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_metav1_time() {
        let moment = parse("2026-03-04T05:06:07.891+02:00").unwrap();
        assert_eq!(format(moment), "2026-03-04T03:06:07Z");
        assert_eq!(parse("not a time"), None);
    }

    #[test]
    fn times_utc_cannot_hold_are_refused_not_panicked_on() {
        // A server's (or a cache file's) timestamp past the last second UTC can represent.
        assert_eq!(parse("9999-12-31T23:59:59-01:00"), None);
        let last = parse("9999-12-31T23:59:59Z").unwrap();
        assert_eq!(format(last), "9999-12-31T23:59:59Z");
        assert_eq!(
            format(parse("9999-12-31T23:59:59+01:00").unwrap()),
            "9999-12-31T22:59:59Z"
        );
        // Built directly with an offset that pushes it past the end: written as the last second.
        let beyond = PrimitiveDateTime::MAX.assume_offset(UtcOffset::from_hms(-1, 0, 0).unwrap());
        assert_eq!(format(beyond), "9999-12-31T23:59:59Z");
        let before = PrimitiveDateTime::MIN.assume_offset(UtcOffset::from_hms(1, 0, 0).unwrap());
        assert_eq!(format(before), "-9999-01-01T00:00:00Z");
    }

    #[tokio::test]
    async fn deadlines_past_the_clock_are_far_away_not_a_panic() {
        let start = tokio::time::Instant::now();
        let soon = deadline(std::time::Duration::from_secs(60));
        assert!(soon >= start + std::time::Duration::from_secs(60));
        let far = deadline(std::time::Duration::MAX);
        assert!(far >= start + std::time::Duration::from_secs(99 * 365 * 24 * 3600));
    }
}
