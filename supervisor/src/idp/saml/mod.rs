//! SAML 2.0 identity providers: the Supervisor as a service provider (SP) of the Web Browser SSO
//! profile, one SP per FederationDomain issuer.
//!
//! A login sends the browser to the identity provider (IdP) with an `AuthnRequest` in the
//! HTTP-Redirect binding ([`ServiceProvider::authn_request_url`]); the IdP posts a signed
//! `Response` back to the SP's assertion consumer service (ACS), and [`verify_response`] turns
//! it into a [`Verified`] identity or refuses it. What the IdP is (its entity ID, SSO URL and
//! signing certificates) comes only from its metadata ([`IdpMetadata::parse`]).
//!
//! Signatures are verified by libxmlsec1 (through samael) with the metadata's certificates as
//! the only keys: a certificate in the message's `KeyInfo` is never trusted. Against XML
//! signature wrapping, a response must have the one shape the checks expect (one assertion, a
//! child of the response; signatures only on those two, each referencing the element it is
//! on), and what is read afterwards is only what the signature covers: the bytes libxmlsec1
//! digested, parsed again, never the document around them. Everything is read with libxml2, the
//! parser libxmlsec1 verified with, so reader and verifier never disagree about a document.
//! Encrypted assertions, DOCTYPEs and SHA-1 are refused.
//!
//! libxmlsec1's global state is set up once by samael behind a mutex (its
//! `guarantee_xmlsec_init`) the first time a signature is checked; each check then has a
//! signature context and document of its own, so concurrent checks on tokio's worker threads
//! share nothing but that read-only setup. A check is CPU work of a few milliseconds, fine on a
//! worker thread. libxmlsec1 writes why a check failed to stderr (function, file and reason,
//! such as "data and digest do not match"; never the document).

mod metadata;
mod request;
mod response;
mod xml;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;

use time::OffsetDateTime;

/// The largest `SAMLResponse` (base64) read: Keycloak's signed responses are a few KiB; a user in
/// hundreds of groups makes hundreds of KiB.
pub(crate) const MAX_RESPONSE_BASE64: usize = 512 * 1024;

/// The largest IdP metadata document read.
const MAX_METADATA: usize = 1024 * 1024;

/// What an IdP's metadata (an `md:EntityDescriptor` with an `md:IDPSSODescriptor`) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdpMetadata {
    /// The IdP's entity ID: the Issuer of its responses and assertions.
    pub(crate) entity_id: String,
    /// Where AuthnRequests go: its SingleSignOnService with the HTTP-Redirect binding.
    pub(crate) sso_redirect_url: String,
    /// The certificates (DER) whose keys may sign its responses: its KeyDescriptors for signing
    /// (`use="signing"` or no `use`). Never empty.
    signing_certificates: Vec<Vec<u8>>,
}

/// The Supervisor as the service provider of one FederationDomain issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceProvider {
    /// The SP's entity ID: the Issuer of its AuthnRequests and the audience its assertions
    /// must name.
    pub(crate) entity_id: String,
    /// Its assertion consumer service URL (HTTP-POST binding): the responses' Destination and
    /// the bearer confirmations' Recipient.
    pub(crate) acs_url: String,
}

/// What a verified assertion says about the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    /// The subject's NameID (never empty).
    pub(crate) name_id: String,
    /// Each AttributeStatement attribute's `Name` and its AttributeValues' text, in document
    /// order (values of attributes with the same name are merged).
    pub(crate) attributes: BTreeMap<String, Vec<String>>,
    /// The assertion's ID: a one-time-use cache keyed by it refuses a replay until
    /// [`Self::valid_until`].
    pub(crate) assertion_id: String,
    /// Until when the assertion could be presented: the earlier of the bearer
    /// SubjectConfirmationData's and the Conditions' NotOnOrAfter.
    pub(crate) valid_until: OffsetDateTime,
    /// The AuthnStatement's SessionNotOnOrAfter (the earliest, if several), if any.
    pub(crate) session_not_on_or_after: Option<OffsetDateTime>,
}

/// Why IdP metadata or a SAML response is refused. Messages say what is wrong and never quote
/// the document: at most an ID, a status code, an algorithm URI or a time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SamlError {
    /// The document is larger than Selkie reads: a misconfigured or hostile IdP (or browser).
    #[error("the SAML document is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The `SAMLResponse` form field is not base64: not what an IdP posts.
    #[error("the SAMLResponse is not valid base64")]
    Base64,
    /// Not well-formed XML in UTF-8 (or another encoding declared).
    #[error("the SAML document is not well-formed UTF-8 XML")]
    NotXml,
    /// A DOCTYPE or entity declaration: never in genuine SAML, the vehicle of entity-expansion
    /// and external-entity attacks.
    #[error("the SAML document has a DOCTYPE or an entity declaration, which are refused")]
    Doctype,
    /// The IdP metadata lacks what the Supervisor needs, or has it in a form it does not read.
    #[error("the identity provider metadata {0}")]
    Metadata(&'static str),
    /// The response has a shape other than one signed response or assertion carrying one
    /// assertion: a broken IdP or a signature wrapping attempt.
    #[error("the SAML response {0}")]
    Structure(&'static str),
    /// The IdP encrypts its assertions.
    #[error("encrypted assertions are not supported: configure the identity provider not to encrypt them")]
    EncryptedAssertion,
    /// Not exactly one assertion in the whole response.
    #[error("the SAML response holds {0} assertions; exactly one is required")]
    AssertionCount(usize),
    /// Neither the response nor its assertion carries a signature: the IdP is configured not to
    /// sign, or the response was forged.
    #[error("neither the SAML response nor its assertion is signed")]
    NotSigned,
    /// A signature uses an algorithm outside the accepted ones (SHA-256 or stronger, RSA or
    /// ECDSA; exclusive or inclusive canonicalization; the enveloped-signature transform).
    #[error("the SAML signature uses {0}, which is not accepted")]
    Algorithm(String),
    /// A signature does not verify with any of the metadata's certificates: the document was
    /// changed after signing, or signed by another key (or the IdP's key rolled over and the
    /// metadata has not caught up).
    #[error("the SAML signature does not verify with the identity provider's signing certificates")]
    BadSignature,
    /// libxmlsec1 could not process a signature (malformed, or IDs it cannot resolve).
    #[error("the SAML signature could not be checked")]
    SignatureCheck,
    /// The IdP answered with another status than Success (the user failed to log in, or the
    /// IdP refused the request). The status codes are quoted: they are URIs, not secrets.
    #[error("the identity provider answered with status {0}")]
    Status(String),
    /// The response's Destination is not the ACS URL: it was meant for another SP.
    #[error("the SAML response's Destination is not this Supervisor's assertion consumer service URL")]
    Destination,
    /// The response, or its bearer confirmation, answers another AuthnRequest (or none): a replay
    /// or a response for another login.
    #[error("the {0} does not answer this login's authentication request (InResponseTo)")]
    InResponseTo(&'static str),
    /// An Issuer is not the IdP's entity ID.
    #[error("the {0} is not the identity provider's entity ID")]
    Issuer(&'static str),
    /// The assertion cannot be presented by a bearer (no SubjectConfirmation with the bearer
    /// method).
    #[error("the assertion has no bearer SubjectConfirmation")]
    NoBearerConfirmation,
    /// The bearer confirmation's Recipient is not the ACS URL: it was meant for another SP.
    #[error(
        "the bearer SubjectConfirmation's Recipient is not this Supervisor's assertion consumer service URL"
    )]
    Recipient,
    /// A NotOnOrAfter has passed (clock skew allowed for): a stale or replayed response, or
    /// clocks far apart.
    #[error("the {what} expired at {}", xml::format_time(*.at))]
    Expired {
        /// What expired.
        what: &'static str,
        /// Its NotOnOrAfter.
        at: OffsetDateTime,
    },
    /// A NotBefore is still ahead (clock skew allowed for): clocks far apart.
    #[error("the {what} is not valid before {}", xml::format_time(*.at))]
    NotYetValid {
        /// What is not valid yet.
        what: &'static str,
        /// Its NotBefore.
        at: OffsetDateTime,
    },
    /// No AudienceRestriction names the SP's entity ID (or one names only others): the assertion
    /// is for another SP.
    #[error("the assertion is not for this Supervisor: its audience does not include its entity ID")]
    Audience,
    /// The assertion's Subject has no (non-empty, unencrypted) NameID.
    #[error("the assertion has no NameID")]
    NoNameId,
    /// A part the Web Browser SSO profile requires is missing.
    #[error("the {0} is missing")]
    Missing(&'static str),
    /// A time attribute is not an xs:dateTime.
    #[error("the {0} is not a valid xs:dateTime")]
    BadTime(&'static str),
}

/// Verifies the base64 `SAMLResponse` the IdP posted to the ACS (HTTP-POST binding) as the
/// answer to the AuthnRequest `expected_request_id` of this login, at `now`, allowing
/// `clock_skew` between the IdP's clock and ours. Returns what the signed assertion says about
/// the user, or the first reason to refuse it (the [`SamlError`] of the step below that fails).
/// Runs when the browser posts to the ACS; CPU only. The caller keeps the rest of the replay
/// defence: each request ID is expected once, and a [`Verified::assertion_id`] already seen
/// before its [`Verified::valid_until`] is refused.
pub(crate) fn verify_response(
    saml_response_b64: &str,
    idp: &IdpMetadata,
    sp: &ServiceProvider,
    expected_request_id: &str,
    now: OffsetDateTime,
    clock_skew: std::time::Duration,
) -> Result<Verified, SamlError> {
    // 1. Bound the input before any work on it.
    if saml_response_b64.len() > MAX_RESPONSE_BASE64 {
        return Err(SamlError::TooLarge {
            limit: MAX_RESPONSE_BASE64,
        });
    }
    // 2. Decode it: standard base64, wrapped in lines or not.
    let bytes = response::decode_base64(saml_response_b64)?;
    // 3. Refuse a DOCTYPE, entity declarations and anything but UTF-8; parse strictly.
    let document = xml::Xml::parse(&bytes)?;
    // 4. The shape: a Response whose status is Success (a refusal the IdP sent is believed
    //    unsigned: it can only refuse), no EncryptedAssertion, exactly one Assertion (a child of
    //    the Response), signatures only on those two, each referencing the element it is on
    //    (its Reference URI pinned to that element's ID), with accepted algorithms only.
    let shape = response::Shape::of(document.root()?)?;
    // 5. libxmlsec1 verifies every signature with the metadata's certificates only, and hands
    //    back what the signature covers (the signed Response if it is signed, else the signed
    //    Assertion) as the bytes it digested.
    let signed_bytes = response::verify_signatures(&bytes, idp)?;
    // 6. From here on, read only those bytes, checked to be the element step 4 found.
    let signed = xml::Xml::parse(signed_bytes.as_bytes())?;
    let (signed_response, assertion) = shape.signed_parts(signed.root()?)?;
    // 7. The Response (from the signed bytes if it is signed, else the unsigned envelope, whose
    //    Destination and InResponseTo the signed assertion repeats): Destination, InResponseTo,
    //    Issuer.
    let envelope = document.root()?;
    response::check_response(signed_response.unwrap_or(envelope), idp, sp, expected_request_id)?;
    // 8. The Assertion: Issuer, NameID, a bearer confirmation (Recipient, NotOnOrAfter,
    //    InResponseTo), Conditions (NotBefore, NotOnOrAfter, audience).
    let checked = response::check_assertion(assertion, idp, sp, expected_request_id, now, clock_skew)?;
    // 9. What it says about the user.
    Ok(Verified {
        name_id: checked.name_id,
        attributes: response::attributes(assertion),
        assertion_id: shape.assertion_id,
        valid_until: checked.valid_until,
        session_not_on_or_after: response::session_not_on_or_after(assertion)?,
    })
}
