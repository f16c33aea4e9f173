//! Timestamps as Kubernetes writes them (`metav1.Time`): RFC 3339, UTC, whole seconds.

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// Parses an RFC 3339 timestamp (any offset, optional fraction). `None` if it is not one.
pub fn parse(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

/// Formats `moment` as `metav1.Time` marshals it: `2006-01-02T15:04:05Z`, in UTC, the fraction of
/// a second dropped.
pub fn format(moment: OffsetDateTime) -> String {
    let utc = moment.to_offset(time::UtcOffset::UTC);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_metav1_time() {
        let moment = parse("2026-03-04T05:06:07.891+02:00").unwrap();
        assert_eq!(format(moment), "2026-03-04T03:06:07Z");
        assert_eq!(parse("not a time"), None);
    }
}
