//! Percent-decoding as Go's `url.PathUnescape` does it, for the places where Kubernetes escapes
//! a name into a header name: `Impersonate-Extra-<key>` and `X-Remote-Extra-<key>`.

/// Decodes every `%XX` (two hexadecimal digits) of `encoded`; `None` when an escape is broken
/// (`%` not followed by two hexadecimal digits) or the result is not UTF-8. Callers decide what a
/// broken key means: the impersonation proxy refuses it, the aggregated API keeps it as sent, as
/// Kubernetes does.
pub fn decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let high = hex_value(*bytes.get(i + 1)?)?;
            let low = hex_value(*bytes.get(i + 2)?)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_decode_as_go_decodes_them() {
        assert_eq!(decode("acme.com%2fproject").as_deref(), Some("acme.com/project"));
        assert_eq!(decode("acme.com%2Fproject").as_deref(), Some("acme.com/project"));
        assert_eq!(decode("plain").as_deref(), Some("plain"));
        assert_eq!(decode("%e2%9c%93").as_deref(), Some("✓"));
        for broken in ["bad%zz", "cut%2", "cut%", "%+1", "%-1", "% 1", "%ff"] {
            assert_eq!(decode(broken), None, "{broken:?}");
        }
    }
}
