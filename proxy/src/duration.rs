//! Durations in the proxy's configuration file: whole, unsigned numbers in the syntax of
//! [`selkie_api::duration`] (`10s`, `1m30s`, `500ms`), with serde deserializers for required and
//! optional fields.

use std::time::Duration;

/// Parses a duration of a configuration file ([`selkie_api::duration`]'s syntax), limited to
/// whole, unsigned numbers (`10s`, `1m30s`, `500ms`): what a timeout or lifetime is written as.
/// The error says what is wrong.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed = selkie_api::duration::parse(text).map_err(|error| error.to_string())?;
    if parsed.negative || parsed.fractional || text.starts_with('+') {
        return Err(format!(
            "{text:?} is not a duration such as 10s, 1m30s or 500ms (whole numbers, no sign)"
        ));
    }
    Ok(parsed.magnitude)
}

/// Deserializes a [`parse_duration`] string that must be greater than zero (a timeout).
pub fn deserialize_positive_duration<'de, D>(deserializer: D) -> Result<Duration, D::Error>
where
    D: serde::Deserializer<'de>,
{
    deserializer.deserialize_any(DurationText { positive: true })
}

/// An optional [`parse_duration`] field (`#[serde(default)]` when absent); `POSITIVE`: zero is
/// refused, as [`deserialize_positive_duration`] does.
pub(crate) fn deserialize_some_duration<'de, D, const POSITIVE: bool>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    deserializer
        .deserialize_any(DurationText { positive: POSITIVE })
        .map(Some)
}

/// A duration written as [`parse_duration`] reads it; `positive`: zero is refused.
struct DurationText {
    positive: bool,
}

impl serde::de::Visitor<'_> for DurationText {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration such as 10s")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
        match parse_duration(text).map_err(E::custom)? {
            Duration::ZERO if self.positive => Err(E::custom(format!("{text:?} must be greater than zero"))),
            duration => Ok(duration),
        }
    }

    fn visit_u64<E: serde::de::Error>(self, number: u64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "{number} has no unit (h, m, s or ms), e.g. {number}s"
        )))
    }

    fn visit_i64<E: serde::de::Error>(self, number: i64) -> Result<Duration, E> {
        Err(E::custom(format!("{number} has no unit (h, m, s or ms)")))
    }
}
