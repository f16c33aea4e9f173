//! SAML as the Supervisor reads it from the outside: identity-provider metadata (what a
//! SAMLIdentityProvider names) and the `SAMLResponse` a browser posts to the assertion consumer
//! service, through `selkie_supervisor::fuzzing::{saml_metadata, saml_verify}`.
//!
//! The selector's bit 0 picks the input:
//!
//! 0. the rest is a response's XML, posted base64-encoded (bit 1: with line breaks every 76
//!    characters, as identity providers post it; bit 2: the rest is posted as is, not encoded),
//!    and verified against the metadata of the test identity provider, whose key signed the seeds
//!    (`supervisor/src/idp/saml/testdata/idp-cert.pem`), for the seeds' service provider and
//!    request, at the seeds' time;
//! 1. the rest (lossy UTF-8) is metadata, read.
//!
//! Invariants (a violation panics): nothing panics in the parsers or in libxmlsec1; a response
//! verifies only with the identity the seeds' signed assertion carries — the fuzzer cannot sign,
//! so a changed, moved or added element never changes who logs in (signature wrapping); metadata
//! that reads has an entity ID and an http(s) single sign-on URL.

#![no_main]

use std::collections::BTreeMap;

use base64::{engine::general_purpose::STANDARD, Engine as _};
use libfuzzer_sys::fuzz_target;
use selkie_fuzz::text;
use selkie_supervisor::fuzzing::{saml_metadata, saml_verify};
use time::OffsetDateTime;

/// The seeds' identity provider, service provider and request (as the unit tests' fixture).
const IDP: &str = "http://keycloak.test/realms/selkie";
const SP: &str = "https://supervisor.test/issuer";
const ACS: &str = "https://supervisor.test/issuer/saml/acs";
const REQUEST: &str = "_00112233445566778899aabbccddeeff";
/// The identity provider's certificate.
const CERTIFICATE: &str = include_str!("../../supervisor/src/idp/saml/testdata/idp-cert.pem");

/// The seeds' "now": 2030-03-17T17:46:40Z, inside their validity windows.
fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_900_000_000).expect("a valid time")
}

/// Keycloak-like metadata naming [`CERTIFICATE`] for signing.
fn metadata() -> String {
    let body: String = CERTIFICATE
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    format!(
        r#"<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:ds="http://www.w3.org/2000/09/xmldsig#" entityID="{IDP}"><md:IDPSSODescriptor protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol"><md:KeyDescriptor use="signing"><ds:KeyInfo><ds:X509Data><ds:X509Certificate>{body}</ds:X509Certificate></ds:X509Data></ds:KeyInfo></md:KeyDescriptor><md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="{IDP}/protocol/saml"/></md:IDPSSODescriptor></md:EntityDescriptor>"#
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector & 1 == 1 {
        if let Ok((entity_id, sso)) = saml_metadata(&text(rest)) {
            assert!(!entity_id.is_empty(), "metadata without an entity ID read");
            assert!(
                sso.starts_with("https://") || sso.starts_with("http://"),
                "a single sign-on URL that is not http(s): {sso:?}"
            );
        }
        return;
    }
    let posted = if selector & 0b100 != 0 {
        text(rest)
    } else {
        let encoded = STANDARD.encode(rest);
        if selector & 0b10 != 0 {
            encoded
                .as_bytes()
                .chunks(76)
                .map(|line| std::str::from_utf8(line).expect("base64 is ASCII"))
                .collect::<Vec<_>>()
                .join("\r\n")
        } else {
            encoded
        }
    };
    if let Ok((name_id, attributes, assertion_id)) =
        saml_verify(&posted, &metadata(), SP, ACS, REQUEST, now())
    {
        // Only the seeds' signed assertion verifies: its subject and attributes, nothing else.
        assert_eq!(name_id, "alice", "a response verified for another subject");
        assert_eq!(assertion_id, "ID_assertion");
        let expected = BTreeMap::from([
            ("email".to_string(), vec!["alice@example.com".to_string()]),
            (
                "Role".to_string(),
                vec!["admins".to_string(), "developers".to_string()],
            ),
        ]);
        assert_eq!(attributes, expected, "a response verified with other attributes");
    }
});
