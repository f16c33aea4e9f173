//! JSON written byte for byte as Go's `encoding/json` writes it.
//!
//! Pinniped names a credential-cache entry by the SHA-256 of a JSON document produced by Go's
//! `json.Encoder`. To find the entries the pinniped CLI wrote (and to let it find Selkie's), the
//! same bytes must be produced here. Go differs from serde_json in what it escapes inside strings:
//! it also escapes `<`, `>` and `&` (as `\u003c`, `\u003e`, `\u0026`) and U+2028 / U+2029, and
//! `json.Compact` applies the same escaping to embedded raw JSON.

use std::fmt::Write as _;

/// Appends `value` as a JSON string literal, quotes included, escaped as Go's encoder escapes it
/// (HTML-safe escaping on, the encoder's default).
pub fn write_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        push_escaped(out, c);
    }
    out.push('"');
}

/// Appends the raw JSON text `raw` with insignificant whitespace removed and the characters Go
/// escapes inside strings escaped, as Go's encoder writes a `json.Marshaler`'s output (it runs
/// `json.Compact` with HTML escaping). `raw` must be valid JSON; string contents are copied
/// otherwise unchanged, so existing escapes are kept as they are.
pub fn write_compact(out: &mut String, raw: &str) {
    let mut in_string = false;
    let mut escaped = false;
    for c in raw.chars() {
        if in_string {
            if escaped {
                escaped = false;
                out.push(c);
            } else if c == '\\' {
                escaped = true;
                out.push(c);
            } else if c == '"' {
                in_string = false;
                out.push(c);
            } else {
                push_html_safe(out, c);
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
}

/// One character of a string literal, escaped like Go's `encodeState.string` with `escapeHTML`.
fn push_escaped(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if u32::from(c) < 0x20 => push_unicode_escape(out, c),
        c => push_html_safe(out, c),
    }
}

/// `<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`; anything else as itself.
fn push_html_safe(out: &mut String, c: char) {
    match c {
        '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => push_unicode_escape(out, c),
        c => out.push(c),
    }
}

fn push_unicode_escape(out: &mut String, c: char) {
    // Go writes lowercase hex digits.
    let _infallible = write!(out, "\\u{:04x}", u32::from(c));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(value: &str) -> String {
        let mut out = String::new();
        write_string(&mut out, value);
        out
    }

    #[test]
    fn escapes_like_go() {
        // Expected values printed by Go's json.NewEncoder(os.Stdout).Encode(value).
        assert_eq!(string("plain"), r#""plain""#);
        assert_eq!(string("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(string("<a&b>"), r#""\u003ca\u0026b\u003e""#);
        assert_eq!(string("\n\r\t\u{8}\u{c}"), r#""\n\r\t\b\f""#);
        assert_eq!(string("\u{1}\u{1f}"), r#""\u0001\u001f""#);
        assert_eq!(string("\u{2028}\u{2029}"), r#""\u2028\u2029""#);
        assert_eq!(string("é/ü"), "\"é/ü\"");
    }

    #[test]
    fn compacts_like_go() {
        let mut out = String::new();
        write_compact(&mut out, "{ \"a\" : [1, 2],\n \"b\": \"x <y> \\\" z\" }");
        assert_eq!(out, r#"{"a":[1,2],"b":"x \u003cy\u003e \" z"}"#);
    }
}
