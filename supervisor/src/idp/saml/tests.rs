//! SAML tests: responses shaped like Keycloak's, signed with libxmlsec1 (samael's signing) by a
//! test IdP key (testdata/, generated with openssl for these tests only), then verified, tampered
//! with, wrapped and re-dated.

use std::{io::Read as _, time::Duration};

use base64::{engine::general_purpose::STANDARD, Engine as _};
use samael::crypto::{Crypto, CryptoProvider as _};

use super::xml::{attr, child, format_time, is, text, Xml, ASSERTION, METADATA, PROTOCOL};
use super::*;

const IDP: &str = "http://keycloak.test/realms/selkie";
const SSO: &str = "http://keycloak.test/realms/selkie/protocol/saml";
const SP: &str = "https://supervisor.test/issuer";
const ACS: &str = "https://supervisor.test/issuer/saml/acs";
const REQUEST: &str = "_00112233445566778899aabbccddeeff";
const RSA_SHA256: &str = "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256";
const SHA256: &str = "http://www.w3.org/2001/04/xmlenc#sha256";
const SUCCESS: &str = r#"<samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:Success"/>"#;

/// The tests' "now": 2030-03-17T17:46:40Z.
fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap()
}

fn minutes(n: i64) -> time::Duration {
    time::Duration::minutes(n)
}

/// DER from PEM.
fn der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
    STANDARD.decode(body).unwrap()
}

struct Key {
    private: Vec<u8>,
    certificate: Vec<u8>,
}

fn idp_key() -> Key {
    Key {
        private: der(include_str!("testdata/idp-key.pem")),
        certificate: der(include_str!("testdata/idp-cert.pem")),
    }
}

fn other_key() -> Key {
    Key {
        private: der(include_str!("testdata/other-key.pem")),
        certificate: der(include_str!("testdata/other-cert.pem")),
    }
}

/// Metadata like Keycloak 26's `/realms/<realm>/protocol/saml/descriptor`, with `certificate`
/// (wrapped in lines, as some IdPs do) as its signing key.
fn keycloak_descriptor(certificate: &[u8]) -> String {
    let encoded = STANDARD.encode(certificate);
    let wrapped: Vec<&str> = encoded
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><md:EntityDescriptor xmlns="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:saml="urn:oasis:names:tc:SAML:2.0:assertion" xmlns:ds="http://www.w3.org/2000/09/xmldsig#" entityID="{IDP}">
  <md:IDPSSODescriptor WantAuthnRequestsSigned="true" protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol">
    <md:KeyDescriptor use="signing">
      <ds:KeyInfo>
        <ds:KeyName>Xu5DZYbSKxH2MHGN1LpLf5yPtnqnXzkfUw3XHBGM4Ms</ds:KeyName>
        <ds:X509Data>
          <ds:X509Certificate>
{}
          </ds:X509Certificate>
        </ds:X509Data>
      </ds:KeyInfo>
    </md:KeyDescriptor>
    <md:ArtifactResolutionService Binding="urn:oasis:names:tc:SAML:2.0:bindings:SOAP" Location="{SSO}/resolve" index="0"></md:ArtifactResolutionService>
    <md:SingleLogoutService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST" Location="{SSO}"></md:SingleLogoutService>
    <md:SingleLogoutService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="{SSO}"></md:SingleLogoutService>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:2.0:nameid-format:persistent</md:NameIDFormat>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:2.0:nameid-format:transient</md:NameIDFormat>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified</md:NameIDFormat>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress</md:NameIDFormat>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST" Location="{SSO}/post"></md:SingleSignOnService>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="{SSO}"></md:SingleSignOnService>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:SOAP" Location="{SSO}/soap"></md:SingleSignOnService>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Artifact" Location="{SSO}/artifact"></md:SingleSignOnService>
  </md:IDPSSODescriptor>
</md:EntityDescriptor>"#,
        wrapped.join("\n")
    )
}

/// Keycloak-like metadata of the test IdP (for other modules' tests).
pub(crate) fn test_idp_metadata_xml() -> String {
    keycloak_descriptor(&idp_key().certificate)
}

fn idp() -> IdpMetadata {
    IdpMetadata::parse(&keycloak_descriptor(&idp_key().certificate)).unwrap()
}

fn sp() -> ServiceProvider {
    ServiceProvider {
        entity_id: SP.to_owned(),
        acs_url: ACS.to_owned(),
    }
}

/// A time as Keycloak writes it (milliseconds, UTC).
fn keycloak_time(at: OffsetDateTime) -> String {
    format!("{}.000Z", &format_time(at)[..19])
}

/// A Keycloak-like Response to [`REQUEST`], as the fields say.
#[derive(Clone)]
struct Fixture {
    response_issuer: String,
    assertion_issuer: String,
    destination: String,
    in_response_to: String,
    confirmation_in_response_to: String,
    recipient: String,
    audience: String,
    status: String,
    name_id: String,
    email: String,
    confirmation_until: OffsetDateTime,
    not_before: OffsetDateTime,
    not_on_or_after: OffsetDateTime,
    session_until: OffsetDateTime,
    assertion: bool,
    sign_response: bool,
    sign_assertion: bool,
    signature_method: &'static str,
    digest_method: &'static str,
}

impl Default for Fixture {
    fn default() -> Self {
        Self {
            response_issuer: IDP.to_owned(),
            assertion_issuer: IDP.to_owned(),
            destination: ACS.to_owned(),
            in_response_to: REQUEST.to_owned(),
            confirmation_in_response_to: REQUEST.to_owned(),
            recipient: ACS.to_owned(),
            audience: SP.to_owned(),
            status: SUCCESS.to_owned(),
            name_id: "alice".to_owned(),
            email: "alice@example.com".to_owned(),
            confirmation_until: now() + minutes(5),
            not_before: now() - time::Duration::seconds(30),
            not_on_or_after: now() + minutes(2),
            session_until: now() + minutes(600),
            assertion: true,
            sign_response: false,
            sign_assertion: true,
            signature_method: RSA_SHA256,
            digest_method: SHA256,
        }
    }
}

/// A signature template for the element `id`, which libxmlsec1 fills in when signing.
fn signature_template(id: &str, signature_method: &str, digest_method: &str) -> String {
    format!(
        concat!(
            r#"<dsig:Signature xmlns:dsig="http://www.w3.org/2000/09/xmldsig#"><dsig:SignedInfo>"#,
            r#"<dsig:CanonicalizationMethod Algorithm="http://www.w3.org/2001/10/xml-exc-c14n#"/>"#,
            r#"<dsig:SignatureMethod Algorithm="{}"/><dsig:Reference URI="{}"><dsig:Transforms>"#,
            r#"<dsig:Transform Algorithm="http://www.w3.org/2000/09/xmldsig#enveloped-signature"/>"#,
            r#"<dsig:Transform Algorithm="http://www.w3.org/2001/10/xml-exc-c14n#"/></dsig:Transforms>"#,
            r#"<dsig:DigestMethod Algorithm="{}"/><dsig:DigestValue></dsig:DigestValue></dsig:Reference>"#,
            r#"</dsig:SignedInfo><dsig:SignatureValue></dsig:SignatureValue></dsig:Signature>"#
        ),
        signature_method,
        format_args!("#{id}"),
        digest_method
    )
}

/// Signs the first signature template in `xml` with `key` (libxmlsec1, through samael) and adds
/// the key's certificate as KeyInfo (outside what is signed, as Keycloak does).
fn sign(xml: &str, key: &Key) -> String {
    let signed = Crypto::sign_xml(xml, &key.private).unwrap();
    let signed = match signed.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").unwrap().1.trim_start().to_owned(),
        None => signed,
    };
    let key_info = format!(
        "</dsig:SignatureValue><dsig:KeyInfo><dsig:X509Data><dsig:X509Certificate>{}</dsig:X509Certificate></dsig:X509Data></dsig:KeyInfo>",
        STANDARD.encode(&key.certificate)
    );
    signed.replacen("</dsig:SignatureValue>", &key_info, 1)
}

impl Fixture {
    /// The Assertion `id` saying these fields, unsigned.
    fn assertion_xml(&self, id: &str, signature: &str) -> String {
        let value = r#"<saml:AttributeValue xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="xs:string">"#;
        let basic = "urn:oasis:names:tc:SAML:2.0:attrname-format:basic";
        format!(
            r#"<saml:Assertion xmlns="{ASSERTION}" xmlns:saml="{ASSERTION}" ID="{id}" IssueInstant="{now}" Version="2.0"><saml:Issuer>{issuer}</saml:Issuer>{signature}<saml:Subject><saml:NameID Format="urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified">{name_id}</saml:NameID><saml:SubjectConfirmation Method="urn:oasis:names:tc:SAML:2.0:cm:bearer"><saml:SubjectConfirmationData InResponseTo="{confirmation_in_response_to}" NotOnOrAfter="{confirmation_until}" Recipient="{recipient}"/></saml:SubjectConfirmation></saml:Subject><saml:Conditions NotBefore="{not_before}" NotOnOrAfter="{not_on_or_after}"><saml:AudienceRestriction><saml:Audience>{audience}</saml:Audience></saml:AudienceRestriction></saml:Conditions><saml:AuthnStatement AuthnInstant="{now}" SessionIndex="7b2c0c5e::f3a1" SessionNotOnOrAfter="{session_until}"><saml:AuthnContext><saml:AuthnContextClassRef>urn:oasis:names:tc:SAML:2.0:ac:classes:unspecified</saml:AuthnContextClassRef></saml:AuthnContext></saml:AuthnStatement><saml:AttributeStatement><saml:Attribute FriendlyName="email" Name="email" NameFormat="{basic}">{value}{email}</saml:AttributeValue></saml:Attribute><saml:Attribute Name="Role" NameFormat="{basic}">{value}admins</saml:AttributeValue>{value}developers</saml:AttributeValue></saml:Attribute></saml:AttributeStatement></saml:Assertion>"#,
            now = keycloak_time(now()),
            issuer = self.assertion_issuer,
            name_id = self.name_id,
            confirmation_in_response_to = self.confirmation_in_response_to,
            confirmation_until = keycloak_time(self.confirmation_until),
            recipient = self.recipient,
            not_before = keycloak_time(self.not_before),
            not_on_or_after = keycloak_time(self.not_on_or_after),
            audience = self.audience,
            session_until = keycloak_time(self.session_until),
            email = self.email,
        )
    }

    /// The Response around `assertion` (already signed or not), with a signature template if it
    /// is to be signed.
    fn response_xml(&self, assertion: &str) -> String {
        let signature = if self.sign_response {
            signature_template("ID_response", self.signature_method, self.digest_method)
        } else {
            String::new()
        };
        format!(
            r#"<samlp:Response xmlns:samlp="{PROTOCOL}" xmlns:saml="{ASSERTION}" Destination="{}" ID="ID_response" InResponseTo="{}" IssueInstant="{}" Version="2.0"><saml:Issuer>{}</saml:Issuer>{signature}<samlp:Status>{}</samlp:Status>{assertion}</samlp:Response>"#,
            self.destination,
            self.in_response_to,
            keycloak_time(now()),
            self.response_issuer,
            self.status,
        )
    }

    /// The signed assertion (or unsigned, if not to be signed).
    fn assertion(&self, key: &Key) -> String {
        if !self.assertion {
            return String::new();
        }
        if !self.sign_assertion {
            return self.assertion_xml("ID_assertion", "");
        }
        let template = signature_template("ID_assertion", self.signature_method, self.digest_method);
        sign(&self.assertion_xml("ID_assertion", &template), key)
    }

    /// The whole response XML, signed as the fields say by `key`.
    fn xml_signed_by(&self, key: &Key) -> String {
        let response = self.response_xml(&self.assertion(key));
        if self.sign_response {
            sign(&response, key)
        } else {
            response
        }
    }

    /// The whole response XML, signed as the fields say by the IdP.
    fn xml(&self) -> String {
        self.xml_signed_by(&idp_key())
    }

    /// The `SAMLResponse` form field: base64 in 76-character lines, as IdPs post it.
    fn encoded(&self) -> String {
        encode(&self.xml())
    }
}

fn encode(xml: &str) -> String {
    let encoded = STANDARD.encode(xml);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(76)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    lines.join("\r\n")
}

fn verify_at(encoded: &str, at: OffsetDateTime, skew: Duration) -> Result<Verified, SamlError> {
    verify_response(encoded, &idp(), &sp(), REQUEST, at, skew)
}

fn verify(encoded: &str) -> Result<Verified, SamlError> {
    verify_at(encoded, now(), Duration::ZERO)
}

fn refused(encoded: &str) -> SamlError {
    verify(encoded).unwrap_err()
}

// ---- responses that verify -------------------------------------------------------------------

fn assert_alice(verified: &Verified) {
    assert_eq!(verified.name_id, "alice");
    assert_eq!(verified.assertion_id, "ID_assertion");
    assert_eq!(verified.attributes["email"], ["alice@example.com"]);
    assert_eq!(verified.attributes["Role"], ["admins", "developers"]);
    assert_eq!(verified.attributes.len(), 2);
    // The Conditions' NotOnOrAfter (2 minutes) is earlier than the confirmation's (5).
    assert_eq!(verified.valid_until, now() + minutes(2));
    assert_eq!(verified.session_not_on_or_after, Some(now() + minutes(600)));
}

#[test]
fn a_signed_assertion_verifies() {
    assert_alice(&verify(&Fixture::default().encoded()).unwrap());
}

#[test]
fn a_signed_response_and_assertion_verify() {
    let fixture = Fixture {
        sign_response: true,
        ..Fixture::default()
    };
    assert_alice(&verify(&fixture.encoded()).unwrap());
}

#[test]
fn a_signed_response_with_an_unsigned_assertion_verifies() {
    let fixture = Fixture {
        sign_response: true,
        sign_assertion: false,
        ..Fixture::default()
    };
    assert_alice(&verify(&fixture.encoded()).unwrap());
}

#[test]
fn valid_until_is_the_earlier_not_on_or_after() {
    let fixture = Fixture {
        confirmation_until: now() + minutes(1),
        ..Fixture::default()
    };
    assert_eq!(
        verify(&fixture.encoded()).unwrap().valid_until,
        now() + minutes(1)
    );
}

#[test]
fn concurrent_verifications_from_many_threads_agree() {
    let encoded = Fixture {
        sign_response: true,
        ..Fixture::default()
    }
    .encoded();
    let tampered = encode(
        &Fixture::default()
            .xml()
            .replace("alice@example.com", "mallory@example.com"),
    );
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..10 {
                    assert_alice(&verify(&encoded).unwrap());
                    assert!(matches!(verify(&tampered), Err(SamlError::BadSignature)));
                }
            });
        }
    });
}

// ---- signatures ------------------------------------------------------------------------------

#[test]
fn an_attribute_changed_after_signing_is_a_bad_signature() {
    let signed = Fixture::default().xml();
    let tampered = signed.replace("alice@example.com", "mallory@example.com");
    assert_ne!(signed, tampered);
    assert!(matches!(refused(&encode(&tampered)), SamlError::BadSignature));

    // The same under a signature of the whole response only.
    let signed = Fixture {
        sign_response: true,
        sign_assertion: false,
        ..Fixture::default()
    }
    .xml();
    let tampered = signed.replace("admins", "cluster-admins");
    assert!(matches!(refused(&encode(&tampered)), SamlError::BadSignature));
}

#[test]
fn an_unsigned_response_is_refused() {
    let fixture = Fixture {
        sign_assertion: false,
        ..Fixture::default()
    };
    assert!(matches!(refused(&fixture.encoded()), SamlError::NotSigned));
}

#[test]
fn a_signature_by_another_key_is_refused_even_with_its_certificate_in_key_info() {
    let forged = Fixture {
        sign_response: true,
        ..Fixture::default()
    }
    .xml_signed_by(&other_key());
    assert!(forged.contains(&STANDARD.encode(other_key().certificate)));
    assert!(matches!(refused(&encode(&forged)), SamlError::BadSignature));
}

#[test]
fn key_info_in_the_message_is_never_read() {
    // A KeyInfo naming a file to fetch the key from: were libxmlsec1 to read it, the check
    // would fail (no such file); it verifies, with the metadata's key.
    let key_info = concat!(
        r#"<dsig:KeyInfo><dsig:RetrievalMethod URI="file:///nonexistent/selkie-key" "#,
        r#"Type="http://www.w3.org/2000/09/xmldsig#X509Data"/></dsig:KeyInfo>"#
    );
    let signed = Fixture::default().xml();
    let start = signed.find("<dsig:KeyInfo>").unwrap();
    let end = signed.find("</dsig:KeyInfo>").unwrap() + "</dsig:KeyInfo>".len();
    let redirected = format!("{}{key_info}{}", &signed[..start], &signed[end..]);
    assert_alice(&verify(&encode(&redirected)).unwrap());
}

#[test]
fn sha1_signatures_are_refused() {
    let fixture = Fixture {
        signature_method: "http://www.w3.org/2000/09/xmldsig#rsa-sha1",
        digest_method: "http://www.w3.org/2000/09/xmldsig#sha1",
        ..Fixture::default()
    };
    match refused(&fixture.encoded()) {
        SamlError::Algorithm(algorithm) => {
            assert_eq!(algorithm, "http://www.w3.org/2000/09/xmldsig#rsa-sha1")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_reference_to_anything_but_the_signed_element_is_refused_before_libxmlsec1_follows_it() {
    let signed = Fixture::default().xml();
    for uri in ["", "file:///etc/passwd", "http://attacker.test/x", "#ID_response"] {
        let redirected = signed.replace(r##"URI="#ID_assertion""##, &format!(r#"URI="{uri}""#));
        assert!(
            matches!(refused(&encode(&redirected)), SamlError::Structure(_)),
            "{uri}: {:?}",
            refused(&encode(&redirected))
        );
    }
}

// ---- signature wrapping ----------------------------------------------------------------------

/// The IdP-signed assertion for alice, cut out of a signed response.
fn alices_signed_assertion() -> String {
    let signed = Fixture::default().xml();
    let start = signed.find("<saml:Assertion").unwrap();
    let end = signed.find("</saml:Assertion>").unwrap() + "</saml:Assertion>".len();
    signed[start..end].to_owned()
}

/// An unsigned assertion for mallory (ID `id`), with `signature` (a stolen one, or none).
fn mallorys_assertion(id: &str, signature: &str) -> String {
    let fixture = Fixture {
        name_id: "mallory".to_owned(),
        email: "mallory@evil.test".to_owned(),
        ..Fixture::default()
    };
    fixture.assertion_xml(id, signature)
}

#[test]
fn a_signed_assertion_moved_aside_for_an_unsigned_one_is_refused() {
    let evil = mallorys_assertion("ID_evil", "");
    // The signed assertion in the response's Extensions; mallory's where a reader would look.
    let wrapped = Fixture::default().response_xml(&evil).replace(
        "<samlp:Status>",
        &format!(
            "<samlp:Extensions>{}</samlp:Extensions><samlp:Status>",
            alices_signed_assertion()
        ),
    );
    assert!(matches!(refused(&encode(&wrapped)), SamlError::AssertionCount(2)));

    // The second line of defence: what libxmlsec1 hands back is alice's signed assertion, never
    // the unsigned one next to it.
    let signed = response::verify_signatures(wrapped.as_bytes(), &idp()).unwrap();
    assert!(signed.contains("alice@example.com"), "{signed}");
    assert!(!signed.contains("mallory"), "{signed}");
}

#[test]
fn a_signed_assertion_nested_in_an_unsigned_one_is_refused() {
    let evil = mallorys_assertion("ID_evil", "").replace(
        "</saml:Subject>",
        &format!(
            "</saml:Subject><saml:Advice>{}</saml:Advice>",
            alices_signed_assertion()
        ),
    );
    let wrapped = Fixture::default().response_xml(&evil);
    assert!(matches!(refused(&encode(&wrapped)), SamlError::AssertionCount(2)));
}

#[test]
fn a_signature_moved_onto_an_unsigned_assertion_is_refused() {
    let stolen = {
        let assertion = alices_signed_assertion();
        let start = assertion.find("<dsig:Signature").unwrap();
        let end = assertion.find("</dsig:Signature>").unwrap() + "</dsig:Signature>".len();
        assertion[start..end].to_owned()
    };
    // Under its own ID the stolen signature references another element.
    let wrapped = Fixture::default().response_xml(&mallorys_assertion("ID_evil", &stolen));
    assert!(matches!(refused(&encode(&wrapped)), SamlError::Structure(_)));
    // Under the signed assertion's ID its digest does not match.
    let wrapped = Fixture::default().response_xml(&mallorys_assertion("ID_assertion", &stolen));
    assert!(matches!(refused(&encode(&wrapped)), SamlError::BadSignature));
}

#[test]
fn a_second_assertion_beside_a_signed_response_is_refused() {
    let signed = Fixture {
        sign_response: true,
        ..Fixture::default()
    }
    .xml();
    let wrapped = signed.replace(
        "</samlp:Response>",
        &format!("{}</samlp:Response>", mallorys_assertion("ID_evil", "")),
    );
    assert!(matches!(refused(&encode(&wrapped)), SamlError::AssertionCount(2)));
}

#[test]
fn an_encrypted_assertion_is_refused_as_unsupported() {
    let encrypted = concat!(
        r#"<saml:EncryptedAssertion><xenc:EncryptedData xmlns:xenc="http://www.w3.org/2001/04/xmlenc#">"#,
        r#"<xenc:CipherData><xenc:CipherValue>AAAA</xenc:CipherValue></xenc:CipherData>"#,
        r#"</xenc:EncryptedData></saml:EncryptedAssertion>"#
    );
    let response = Fixture {
        sign_response: true,
        ..Fixture::default()
    }
    .response_xml(encrypted);
    let error = refused(&encode(&sign(&response, &idp_key())));
    assert!(matches!(error, SamlError::EncryptedAssertion));
    assert!(error
        .to_string()
        .contains("encrypted assertions are not supported"));
}

// ---- what the response says ------------------------------------------------------------------

#[test]
fn another_audience_is_refused() {
    let fixture = Fixture {
        audience: "https://other-sp.test".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(refused(&fixture.encoded()), SamlError::Audience));
}

#[test]
fn another_recipient_is_refused() {
    let fixture = Fixture {
        recipient: "https://other-sp.test/acs".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(refused(&fixture.encoded()), SamlError::Recipient));
}

#[test]
fn another_destination_is_refused() {
    let fixture = Fixture {
        destination: "https://other-sp.test/acs".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(refused(&fixture.encoded()), SamlError::Destination));
}

#[test]
fn an_answer_to_another_request_is_refused() {
    let fixture = Fixture {
        in_response_to: "_another".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(
        refused(&fixture.encoded()),
        SamlError::InResponseTo("response")
    ));
    let fixture = Fixture {
        confirmation_in_response_to: "_another".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(
        refused(&fixture.encoded()),
        SamlError::InResponseTo("bearer SubjectConfirmationData")
    ));
}

#[test]
fn another_issuer_is_refused() {
    let fixture = Fixture {
        assertion_issuer: "http://other-idp.test".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(
        refused(&fixture.encoded()),
        SamlError::Issuer("assertion's Issuer")
    ));
    let fixture = Fixture {
        response_issuer: "http://other-idp.test".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(
        refused(&fixture.encoded()),
        SamlError::Issuer("response's Issuer")
    ));
}

#[test]
fn an_expired_assertion_is_refused_and_clock_skew_is_allowed_for() {
    let encoded = Fixture::default().encoded();
    // Past the confirmation's NotOnOrAfter (5 minutes).
    match verify_at(&encoded, now() + minutes(10), Duration::ZERO).unwrap_err() {
        SamlError::Expired { what, at } => {
            assert_eq!(what, "bearer SubjectConfirmationData");
            assert_eq!(at, now() + minutes(5));
        }
        other => panic!("{other:?}"),
    }
    // Past the Conditions' NotOnOrAfter (2 minutes) only.
    let error = verify_at(&encoded, now() + minutes(3), Duration::ZERO).unwrap_err();
    assert!(
        matches!(
            error,
            SamlError::Expired {
                what: "assertion's Conditions",
                ..
            }
        ),
        "{error:?}"
    );
    // NotOnOrAfter itself is too late.
    assert!(verify_at(&encoded, now() + minutes(2), Duration::ZERO).is_err());
    // Within the skew allowed.
    assert_alice(&verify_at(&encoded, now() + minutes(3), Duration::from_secs(120)).unwrap());
}

#[test]
fn a_not_yet_valid_assertion_is_refused_and_clock_skew_is_allowed_for() {
    let encoded = Fixture::default().encoded();
    let error = verify_at(&encoded, now() - minutes(5), Duration::ZERO).unwrap_err();
    match error {
        SamlError::NotYetValid { what, at } => {
            assert_eq!(what, "assertion's Conditions");
            assert_eq!(at, now() - time::Duration::seconds(30));
        }
        other => panic!("{other:?}"),
    }
    assert_alice(&verify_at(&encoded, now() - minutes(5), Duration::from_secs(300)).unwrap());
}

#[test]
fn a_status_other_than_success_is_refused_with_its_code() {
    let fixture = Fixture {
        status: concat!(
            r#"<samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:Responder">"#,
            r#"<samlp:StatusCode Value="urn:oasis:names:tc:SAML:2.0:status:AuthnFailed"/></samlp:StatusCode>"#
        )
        .to_owned(),
        assertion: false,
        sign_response: true,
        ..Fixture::default()
    };
    let error = refused(&fixture.encoded());
    assert!(matches!(error, SamlError::Status(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "the identity provider answered with status urn:oasis:names:tc:SAML:2.0:status:Responder \
         (urn:oasis:names:tc:SAML:2.0:status:AuthnFailed)"
    );
}

#[test]
fn an_empty_name_id_is_refused() {
    let fixture = Fixture {
        name_id: " ".to_owned(),
        ..Fixture::default()
    };
    assert!(matches!(refused(&fixture.encoded()), SamlError::NoNameId));
}

// ---- documents refused before any signature is checked ---------------------------------------

#[test]
fn a_doctype_is_refused() {
    let signed = Fixture::default().xml();
    let with_doctype = format!(r#"<?xml version="1.0"?><!DOCTYPE r [<!ENTITY name "mallory">]>{signed}"#);
    assert!(matches!(refused(&encode(&with_doctype)), SamlError::Doctype));
    let with_doctype = format!("<!DOCTYPE samlp:Response SYSTEM \"http://attacker.test/x.dtd\">{signed}");
    assert!(matches!(refused(&encode(&with_doctype)), SamlError::Doctype));
}

#[test]
fn encodings_other_than_utf8_are_refused() {
    let signed = Fixture::default().xml();
    let utf7 = format!(r#"<?xml version="1.0" encoding="UTF-7"?>{signed}"#);
    assert!(matches!(refused(&encode(&utf7)), SamlError::NotXml));
    let utf16: Vec<u8> = signed.encode_utf16().flat_map(u16::to_le_bytes).collect();
    assert!(matches!(refused(&STANDARD.encode(utf16)), SamlError::NotXml));
    let declared = format!(r#"<?xml version="1.0" encoding="utf-8"?>{signed}"#);
    assert_alice(&verify(&encode(&declared)).unwrap());
}

#[test]
fn an_oversized_response_is_refused() {
    let huge = "A".repeat(MAX_RESPONSE_BASE64 + 4);
    assert!(matches!(
        refused(&huge),
        SamlError::TooLarge {
            limit: MAX_RESPONSE_BASE64
        }
    ));
}

#[test]
fn bad_base64_and_bad_xml_are_refused() {
    assert!(matches!(refused("PHNhbWxwOlJlc3BvbnNl!!"), SamlError::Base64));
    assert!(matches!(
        refused(&STANDARD.encode("<samlp:Response")),
        SamlError::NotXml
    ));
    let truncated = Fixture::default().xml();
    assert!(matches!(
        refused(&encode(&truncated[..truncated.len() - 3])),
        SamlError::NotXml
    ));
}

#[test]
fn errors_never_quote_the_document() {
    let fixture = Fixture {
        audience: "https://other-sp.test".to_owned(),
        ..Fixture::default()
    };
    let message = refused(&fixture.encoded()).to_string();
    assert!(!message.contains("alice"), "{message}");
    assert!(!message.contains("other-sp"), "{message}");
}

// ---- metadata --------------------------------------------------------------------------------

#[test]
fn keycloak_metadata_is_read() {
    let metadata = idp();
    assert_eq!(metadata.entity_id, IDP);
    assert_eq!(metadata.sso_redirect_url, SSO);
    assert_eq!(metadata.signing_certificates, [idp_key().certificate]);
    assert_eq!(metadata, idp());
    let other = IdpMetadata::parse(&keycloak_descriptor(&other_key().certificate)).unwrap();
    assert_ne!(metadata, other);
}

#[test]
fn a_key_descriptor_without_use_signs_and_one_for_encryption_does_not() {
    let descriptor = keycloak_descriptor(&idp_key().certificate);
    let unspecified = IdpMetadata::parse(&descriptor.replace(r#" use="signing""#, "")).unwrap();
    assert_eq!(unspecified.signing_certificates, [idp_key().certificate]);
    let encryption = IdpMetadata::parse(&descriptor.replace(r#"use="signing""#, r#"use="encryption""#));
    assert!(matches!(
        encryption,
        Err(SamlError::Metadata("has no signing certificate"))
    ));
}

#[test]
fn metadata_without_what_the_supervisor_needs_is_refused() {
    let descriptor = keycloak_descriptor(&idp_key().certificate);
    let cases = [
        (
            descriptor.replace("bindings:HTTP-Redirect\" Location=\"http://keycloak.test/realms/selkie/protocol/saml\"></md:SingleSignOnService>", "bindings:PAOS\" Location=\"x\"></md:SingleSignOnService>"),
            "has no SingleSignOnService with the HTTP-Redirect binding",
        ),
        (descriptor.replace(&format!(r#"entityID="{IDP}""#), ""), "has no entityID"),
        (descriptor.replace("IDPSSODescriptor", "SPSSODescriptor"), "has no IDPSSODescriptor for SAML 2.0"),
        (
            descriptor.replace(&STANDARD.encode(idp_key().certificate)[..64], "bm90IGEgY2VydGlmaWNhdGU="),
            "has a signing certificate that is not base64 DER X.509",
        ),
        (sp().metadata_xml(), "has no IDPSSODescriptor for SAML 2.0"),
        (
            format!(
                r#"<md:EntitiesDescriptor xmlns:md="{METADATA}">{}</md:EntitiesDescriptor>"#,
                descriptor.split_once("?>").unwrap().1
            ),
            "is not an md:EntityDescriptor",
        ),
    ];
    for (xml, problem) in cases {
        match IdpMetadata::parse(&xml) {
            Err(SamlError::Metadata(said)) => assert_eq!(said, problem),
            other => panic!("{problem}: {other:?}"),
        }
    }
    let with_doctype = format!("<!DOCTYPE x [<!ENTITY y \"z\">]>{descriptor}");
    assert!(matches!(
        IdpMetadata::parse(&with_doctype),
        Err(SamlError::Doctype)
    ));
    let huge = format!("{descriptor}<!--{}-->", " ".repeat(MAX_METADATA));
    assert!(matches!(
        IdpMetadata::parse(&huge),
        Err(SamlError::TooLarge { .. })
    ));
}

// ---- what the Supervisor sends ---------------------------------------------------------------

#[test]
fn sp_metadata_reads_back() {
    let sp = ServiceProvider {
        entity_id: "https://s.test/a?b=1&c=\"2\"".to_owned(),
        acs_url: ACS.to_owned(),
    };
    let document = Xml::parse(sp.metadata_xml().as_bytes()).unwrap();
    let root = document.root().unwrap();
    assert!(is(root, METADATA, "EntityDescriptor"));
    assert_eq!(attr(root, "entityID").unwrap(), sp.entity_id);
    let descriptor = child(root, METADATA, "SPSSODescriptor").unwrap();
    assert_eq!(attr(descriptor, "AuthnRequestsSigned").unwrap(), "false");
    assert_eq!(attr(descriptor, "WantAssertionsSigned").unwrap(), "true");
    assert_eq!(attr(descriptor, "protocolSupportEnumeration").unwrap(), PROTOCOL);
    let format = child(descriptor, METADATA, "NameIDFormat").unwrap();
    assert_eq!(
        text(format),
        "urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified"
    );
    let acs = child(descriptor, METADATA, "AssertionConsumerService").unwrap();
    assert_eq!(
        attr(acs, "Binding").unwrap(),
        "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST"
    );
    assert_eq!(attr(acs, "Location").unwrap(), ACS);
    assert_eq!(attr(acs, "index").unwrap(), "0");
}

#[test]
fn authn_request_url_round_trips() {
    let relay_state = "state&value=1 +/";
    for (sso, separator) in [(SSO, '?'), ("https://idp.test/sso?tenant=a", '&')] {
        let idp = IdpMetadata {
            sso_redirect_url: sso.to_owned(),
            ..idp()
        };
        let url = sp().authn_request_url(&idp, REQUEST, relay_state, now());
        let query = url.strip_prefix(sso).unwrap().strip_prefix(separator).unwrap();
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[0].0, "SAMLRequest");
        assert_eq!(pairs[1], ("RelayState".to_owned(), relay_state.to_owned()));

        let deflated = STANDARD.decode(&pairs[0].1).unwrap();
        let mut xml = String::new();
        flate2::read::DeflateDecoder::new(&deflated[..])
            .read_to_string(&mut xml)
            .unwrap();
        let document = Xml::parse(xml.as_bytes()).unwrap();
        let request = document.root().unwrap();
        assert!(is(request, PROTOCOL, "AuthnRequest"));
        assert_eq!(attr(request, "ID").unwrap(), REQUEST);
        assert_eq!(attr(request, "Version").unwrap(), "2.0");
        assert_eq!(attr(request, "IssueInstant").unwrap(), "2030-03-17T17:46:40Z");
        assert_eq!(attr(request, "Destination").unwrap(), sso);
        assert_eq!(attr(request, "AssertionConsumerServiceURL").unwrap(), ACS);
        assert_eq!(
            attr(request, "ProtocolBinding").unwrap(),
            "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST"
        );
        assert_eq!(text(child(request, ASSERTION, "Issuer").unwrap()), SP);
        let policy = child(request, PROTOCOL, "NameIDPolicy").unwrap();
        assert_eq!(attr(policy, "AllowCreate").unwrap(), "true");
    }
}

#[test]
fn request_ids_are_fresh_xml_ids() {
    let id = ServiceProvider::new_request_id().unwrap();
    assert_eq!(id.len(), 33);
    assert!(id.starts_with('_'));
    assert!(id[1..]
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_ne!(id, ServiceProvider::new_request_id().unwrap());
}
