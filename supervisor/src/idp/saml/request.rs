//! What the Supervisor sends as a service provider: its metadata and its AuthnRequests.

use std::io::Write as _;

use base64::{engine::general_purpose::STANDARD, Engine as _};
use flate2::{write::DeflateEncoder, Compression};
use ring::rand::{SecureRandom as _, SystemRandom};
use time::OffsetDateTime;

use super::xml::{escape, format_time, ASSERTION, METADATA, PROTOCOL};
use super::{IdpMetadata, ServiceProvider};

const HTTP_POST: &str = "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST";
const NAME_ID_UNSPECIFIED: &str = "urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified";

impl ServiceProvider {
    /// The SP's metadata, for the IdP's administrator to import (Keycloak: Clients, Import
    /// client): its entity ID, unsigned AuthnRequests, signed assertions wanted, no particular
    /// NameID format, and the ACS URL with the HTTP-POST binding. Infallible.
    pub(crate) fn metadata_xml(&self) -> String {
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<md:EntityDescriptor xmlns:md="{METADATA}" entityID="{entity_id}">
  <md:SPSSODescriptor AuthnRequestsSigned="false" WantAssertionsSigned="true" protocolSupportEnumeration="{PROTOCOL}">
    <md:NameIDFormat>{NAME_ID_UNSPECIFIED}</md:NameIDFormat>
    <md:AssertionConsumerService Binding="{HTTP_POST}" Location="{acs_url}" index="0" isDefault="true"/>
  </md:SPSSODescriptor>
</md:EntityDescriptor>
"#,
            entity_id = escape(&self.entity_id),
            acs_url = escape(&self.acs_url),
        )
    }

    /// The AuthnRequest `request_id` issued at `now` for `idp`, as XML.
    fn authn_request_xml(&self, idp: &IdpMetadata, request_id: &str, now: OffsetDateTime) -> String {
        format!(
            concat!(
                r#"<samlp:AuthnRequest xmlns:samlp="{protocol}" xmlns:saml="{assertion}" ID="{id}" "#,
                r#"Version="2.0" IssueInstant="{instant}" Destination="{destination}" "#,
                r#"AssertionConsumerServiceURL="{acs_url}" ProtocolBinding="{binding}">"#,
                r#"<saml:Issuer>{issuer}</saml:Issuer><samlp:NameIDPolicy AllowCreate="true"/>"#,
                r#"</samlp:AuthnRequest>"#
            ),
            protocol = PROTOCOL,
            assertion = ASSERTION,
            id = escape(request_id),
            instant = format_time(now),
            destination = escape(&idp.sso_redirect_url),
            acs_url = escape(&self.acs_url),
            binding = HTTP_POST,
            issuer = escape(&self.entity_id),
        )
    }

    /// Where to send the browser to log in at `idp` (HTTP-Redirect binding): the IdP's SSO URL
    /// with `SAMLRequest` (the AuthnRequest `request_id`, issued at `now`, asking for a response
    /// to the ACS URL by HTTP-POST, raw-DEFLATEd and base64-encoded) and `RelayState`
    /// (`relay_state`, which the IdP posts back unchanged; SAML asks for at most 80 bytes) as
    /// form-urlencoded query parameters, after `?` or, if the URL has a query, `&`. The request
    /// is unsigned (the metadata says so). Runs when a login starts; infallible.
    pub(crate) fn authn_request_url(
        &self,
        idp: &IdpMetadata,
        request_id: &str,
        relay_state: &str,
        now: OffsetDateTime,
    ) -> String {
        let request = deflate(self.authn_request_xml(idp, request_id, now).as_bytes());
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("SAMLRequest", &STANDARD.encode(request))
            .append_pair("RelayState", relay_state)
            .finish();
        let separator = if idp.sso_redirect_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{separator}{query}", idp.sso_redirect_url)
    }

    /// A fresh AuthnRequest ID: `_` and 32 hexadecimal digits (128 random bits; an XML ID must
    /// not start with a digit). `None` when the system has no secure randomness.
    pub(crate) fn new_request_id() -> Option<String> {
        let mut bytes = [0u8; 16];
        SystemRandom::new().fill(&mut bytes).ok()?;
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        Some(format!("_{hex}"))
    }

    /// Whether `value` has the shape of an ID [`Self::new_request_id`] makes: `_` and 32 hex
    /// digits. Checked before a value from the browser names a cookie.
    pub(crate) fn is_request_id(value: &str) -> bool {
        value.strip_prefix('_').is_some_and(|hex| {
            hex.len() == 32 && hex.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
        })
    }
}

/// Raw DEFLATE (RFC 1951, no zlib header) of `bytes`, as the HTTP-Redirect binding encodes.
#[expect(clippy::expect_used, reason = "DEFLATE into a Vec<u8> has no failure mode")]
fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::default());
    let written = encoder.write_all(bytes).and_then(|()| encoder.finish());
    written.expect("writing into a Vec<u8> cannot fail")
}
