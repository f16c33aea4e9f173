//! The `sub` of the Supervisor's ID tokens: unique per upstream identity provider and upstream
//! user, and the same bytes Pinniped's Supervisor writes, so a user keeps their identity when a
//! cluster moves between the two.
//!
//! * OIDC: `<upstream issuer>?idpName=<display name>&sub=<upstream sub>`; SAML (Selkie's) the
//!   same with the identity provider's entity ID and the assertion's `NameID` ([`oidc`]);
//! * LDAP and Active Directory: the `ldaps://` URL of the provider with `idpName` and `sub` (the
//!   user's UID) added to its query, the query's parameters sorted by name;
//! * GitHub: `<API base URL>?idpName=<display name>&login=<login>&id=<id>`.
//!
//! Values are escaped as Go's `url.QueryEscape` escapes them (space as `+`).

/// The `sub` of a user of an OIDC upstream.
pub(crate) fn oidc(upstream_issuer: &str, upstream_subject: &str, idp_display_name: &str) -> String {
    format!(
        "{upstream_issuer}?idpName={}&sub={}",
        query_escape(idp_display_name),
        query_escape(upstream_subject)
    )
}

/// The `sub` of a user of a GitHub upstream.
pub(crate) fn github(api_base_url: &str, idp_display_name: &str, login: &str, id: &str) -> String {
    format!(
        "{api_base_url}?idpName={}&login={}&id={}",
        query_escape(idp_display_name),
        query_escape(login),
        query_escape(id)
    )
}

/// The `sub` of a user of an LDAP or Active Directory upstream whose URL is `ldap_url`
/// (`ldaps://host[:port]` with an optional query, e.g. `?base=<user search base>`).
pub(crate) fn ldap(ldap_url: &str, idp_display_name: &str, uid: &str) -> String {
    let (base, query) = ldap_url.split_once('?').unwrap_or((ldap_url, ""));
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .filter(|(name, _)| name != "idpName" && name != "sub")
        .collect();
    pairs.push(("idpName".into(), idp_display_name.into()));
    pairs.push(("sub".into(), uid.into()));
    // Go's url.Values.Encode: sorted by name, values of one name in their order.
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let encoded: Vec<String> = pairs
        .iter()
        .map(|(name, value)| format!("{}={}", query_escape(name), query_escape(value)))
        .collect();
    format!("{base}?{}", encoded.join("&"))
}

/// Go's `url.QueryEscape`: every byte but ASCII letters, digits and `-_.~` is percent-encoded
/// (upper-case hex), and a space becomes `+`.
pub(crate) fn query_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(byte)),
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // The expected values are those of Pinniped's downstreamsubject tests.
    #[test]
    fn subjects_are_byte_for_byte_pinnipeds() {
        assert_eq!(
            oidc(
                "https://server.example.com:1234/path",
                "some subject",
                "simpleName"
            ),
            "https://server.example.com:1234/path?idpName=simpleName&sub=some+subject"
        );
        assert_eq!(
            oidc(
                "https://server.example.com:1234/path",
                "some subject",
                "this is a 👍 display name that 🦭 can handle"
            ),
            "https://server.example.com:1234/path?idpName=this+is+a+%F0%9F%91%8D+display+name+that+%F0%9F%A6%AD+can+handle&sub=some+subject"
        );
        assert_eq!(
            github("https://github.com", "simpleName", "some login", "some id"),
            "https://github.com?idpName=simpleName&login=some+login&id=some+id"
        );
        assert_eq!(
            ldap("ldaps://server.example.com:1234", "simpleName", "some uid"),
            "ldaps://server.example.com:1234?idpName=simpleName&sub=some+uid"
        );
        assert_eq!(
            ldap(
                "ldaps://server.example.com:1234?b=%F0%9F%A6%AD&a=1",
                "some name",
                "some uid"
            ),
            "ldaps://server.example.com:1234?a=1&b=%F0%9F%A6%AD&idpName=some+name&sub=some+uid"
        );
        assert_eq!(query_escape("a~b*c/d"), "a~b%2Ac%2Fd");
    }
}
