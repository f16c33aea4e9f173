//! The steps of [`super::verify_response`]: the response's shape, its signatures, and the
//! checks on the signed response and assertion.

use std::collections::BTreeMap;

use base64::{engine::general_purpose::STANDARD, Engine as _};
use libxml::readonly::RoNode;
use samael::crypto::{
    AllowedSignatureAlgorithm, CertificateDer, Crypto, CryptoError, CryptoProvider as _, ReduceMode,
};
use time::OffsetDateTime;

use super::xml::{self, attr, child, children, descendants, is, text, ASSERTION, DSIG, PROTOCOL};
use super::{IdpMetadata, SamlError, ServiceProvider};

const STATUS_SUCCESS: &str = "urn:oasis:names:tc:SAML:2.0:status:Success";
const BEARER: &str = "urn:oasis:names:tc:SAML:2.0:cm:bearer";

/// The signature and digest algorithms accepted: SHA-256 or stronger, RSA or ECDSA.
const SIGNATURE_ALGORITHMS: [AllowedSignatureAlgorithm; 6] = [
    AllowedSignatureAlgorithm::RsaSha256,
    AllowedSignatureAlgorithm::RsaSha384,
    AllowedSignatureAlgorithm::RsaSha512,
    AllowedSignatureAlgorithm::EcdsaSha256,
    AllowedSignatureAlgorithm::EcdsaSha384,
    AllowedSignatureAlgorithm::EcdsaSha512,
];

/// The canonicalizations accepted (exclusive and inclusive, with or without comments).
const CANONICALIZATIONS: [&str; 4] = [
    "http://www.w3.org/2001/10/xml-exc-c14n#",
    "http://www.w3.org/2001/10/xml-exc-c14n#WithComments",
    "http://www.w3.org/TR/2001/REC-xml-c14n-20010315",
    "http://www.w3.org/TR/2001/REC-xml-c14n-20010315#WithComments",
];

const ENVELOPED_SIGNATURE: &str = "http://www.w3.org/2000/09/xmldsig#enveloped-signature";

/// Decodes the posted `SAMLResponse`: standard base64, ASCII whitespace (line breaks) ignored.
pub(super) fn decode_base64(encoded: &str) -> Result<Vec<u8>, SamlError> {
    let compact: String = encoded.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    STANDARD.decode(compact).map_err(|_| SamlError::Base64)
}

/// Where the response's parts are, as found in the document (before any signature is checked).
#[derive(Debug)]
pub(super) struct Shape {
    /// The Response's ID.
    response_id: String,
    /// The one Assertion's ID.
    pub(super) assertion_id: String,
    /// Whether the Response carries a signature (of itself).
    response_signed: bool,
}

impl Shape {
    /// Finds the parts of the response `root` and refuses any other shape (step 4 of
    /// [`super::verify_response`]).
    pub(super) fn of(root: RoNode) -> Result<Self, SamlError> {
        if !is(root, PROTOCOL, "Response") {
            return Err(SamlError::Structure("is not a samlp:Response"));
        }
        check_status(root)?;
        let all = descendants(root);
        if all.iter().any(|node| is(*node, ASSERTION, "EncryptedAssertion")) {
            return Err(SamlError::EncryptedAssertion);
        }
        let assertions: Vec<RoNode> = all
            .iter()
            .copied()
            .filter(|node| is(*node, ASSERTION, "Assertion"))
            .collect();
        let [assertion] = assertions[..] else {
            return Err(SamlError::AssertionCount(assertions.len()));
        };
        if assertion.get_parent() != Some(root) {
            return Err(SamlError::Structure(
                "has its assertion elsewhere than directly in the response",
            ));
        }
        let response_id = id(root)?;
        let assertion_id = id(assertion)?;
        let (mut response_signed, mut assertion_signed) = (false, false);
        for signature in all.iter().copied().filter(|node| is(*node, DSIG, "Signature")) {
            let (signed, signed_id) = match signature.get_parent() {
                Some(parent) if parent == root => (&mut response_signed, &response_id),
                Some(parent) if parent == assertion => (&mut assertion_signed, &assertion_id),
                _ => {
                    return Err(SamlError::Structure(
                        "has a signature on neither the response nor its assertion",
                    ))
                }
            };
            if *signed {
                return Err(SamlError::Structure(
                    "has an element with more than one signature",
                ));
            }
            *signed = true;
            check_signature(signature, signed_id)?;
        }
        if !response_signed && !assertion_signed {
            return Err(SamlError::NotSigned);
        }
        Ok(Self {
            response_id,
            assertion_id,
            response_signed,
        })
    }

    /// The signed Response (if it is what is signed) and the signed Assertion, from the root of
    /// the bytes libxmlsec1 verified: that root must be the Response step 4 found if that is
    /// signed, else its Assertion, with the same ID (step 6 of [`super::verify_response`]).
    pub(super) fn signed_parts(&self, signed: RoNode) -> Result<(Option<RoNode>, RoNode), SamlError> {
        let not_ours =
            SamlError::Structure("has a signature covering neither the response nor its assertion");
        if self.response_signed {
            if !is(signed, PROTOCOL, "Response") || attr(signed, "ID").as_ref() != Some(&self.response_id) {
                return Err(not_ours);
            }
            let assertions: Vec<RoNode> = children(signed, ASSERTION, "Assertion").collect();
            match assertions[..] {
                [assertion] if attr(assertion, "ID").as_ref() == Some(&self.assertion_id) => {
                    Ok((Some(signed), assertion))
                }
                _ => Err(SamlError::AssertionCount(assertions.len())),
            }
        } else if is(signed, ASSERTION, "Assertion")
            && attr(signed, "ID").as_ref() == Some(&self.assertion_id)
        {
            Ok((None, signed))
        } else {
            Err(not_ours)
        }
    }
}

/// The non-empty `ID` of a signable element.
fn id(node: RoNode) -> Result<String, SamlError> {
    attr(node, "ID")
        .filter(|id| !id.is_empty())
        .ok_or(SamlError::Structure("has a response or assertion without an ID"))
}

/// Refuses a top-level status other than Success, quoting its code (and a second-level code).
fn check_status(response: RoNode) -> Result<(), SamlError> {
    let code = child(response, PROTOCOL, "Status")
        .and_then(|status| child(status, PROTOCOL, "StatusCode"))
        .ok_or(SamlError::Missing("response's StatusCode"))?;
    let value = attr(code, "Value").unwrap_or_default();
    if value == STATUS_SUCCESS {
        return Ok(());
    }
    let detail = child(code, PROTOCOL, "StatusCode").and_then(|sub| attr(sub, "Value"));
    let quoted = match detail {
        Some(detail) => format!("{value} ({detail})"),
        None => value,
    };
    // Unsigned text in an error: bounded and printable only.
    Err(SamlError::Status(
        quoted.chars().filter(|c| !c.is_control()).take(256).collect(),
    ))
}

/// Checks a `ds:Signature` on the element with ID `signed_id`: exactly one Reference, whose URI
/// is `#signed_id` (nothing else, so libxmlsec1 never dereferences another URI), and only
/// accepted algorithms everywhere in SignedInfo.
fn check_signature(signature: RoNode, signed_id: &str) -> Result<(), SamlError> {
    let signed_info =
        child(signature, DSIG, "SignedInfo").ok_or(SamlError::Missing("signature's SignedInfo"))?;
    let references: Vec<RoNode> = children(signed_info, DSIG, "Reference").collect();
    match references[..] {
        [reference] if attr(reference, "URI").as_deref() == Some(&format!("#{signed_id}")) => {}
        _ => {
            return Err(SamlError::Structure(
                "has a signature that does not reference the element it is on",
            ))
        }
    }
    for node in descendants(signed_info) {
        let Some(algorithm) = attr(node, "Algorithm") else {
            continue;
        };
        let name = node.get_name();
        let canonicalization = CANONICALIZATIONS.contains(&algorithm.as_str());
        let accepted = is(node, DSIG, &name)
            && match name.as_str() {
                "CanonicalizationMethod" => canonicalization,
                "Transform" => canonicalization || algorithm == ENVELOPED_SIGNATURE,
                "SignatureMethod" => SIGNATURE_ALGORITHMS
                    .iter()
                    .any(|allowed| allowed.signature_uri() == algorithm),
                "DigestMethod" => SIGNATURE_ALGORITHMS
                    .iter()
                    .any(|allowed| allowed.digest_uri() == algorithm),
                _ => false,
            };
        if !accepted {
            return Err(SamlError::Algorithm(
                algorithm.chars().filter(|c| !c.is_control()).take(256).collect(),
            ));
        }
    }
    Ok(())
}

/// Verifies every signature in `document` with libxmlsec1, trusting only the metadata's
/// certificates (never the message's KeyInfo), and returns what is signed: the canonical bytes
/// libxmlsec1 digested for the Response if it is signed, else for the Assertion (step 5 of
/// [`super::verify_response`]). A signature that does not verify fails with
/// [`SamlError::BadSignature`]; one libxmlsec1 cannot process with [`SamlError::SignatureCheck`].
pub(super) fn verify_signatures(document: &[u8], idp: &IdpMetadata) -> Result<String, SamlError> {
    let document = std::str::from_utf8(document).map_err(|_| SamlError::NotXml)?;
    let trusted: Vec<CertificateDer> = idp
        .signing_certificates
        .iter()
        .cloned()
        .map(CertificateDer::from)
        .collect();
    Crypto::reduce_xml_to_signed_with_allowed_algorithms(
        document,
        &trusted,
        ReduceMode::PreDigest,
        Some(&SIGNATURE_ALGORITHMS),
    )
    .map_err(|error| match error {
        CryptoError::InvalidSignature => SamlError::BadSignature,
        _ => SamlError::SignatureCheck,
    })
}

/// Checks the Response's Destination (if present) is the ACS URL, its InResponseTo is this
/// login's request, and its Issuer (if present) is the IdP (step 7 of
/// [`super::verify_response`]).
pub(super) fn check_response(
    response: RoNode,
    idp: &IdpMetadata,
    sp: &ServiceProvider,
    expected_request_id: &str,
) -> Result<(), SamlError> {
    if attr(response, "Destination").is_some_and(|destination| destination != sp.acs_url) {
        return Err(SamlError::Destination);
    }
    if attr(response, "InResponseTo").as_deref() != Some(expected_request_id) {
        return Err(SamlError::InResponseTo("response"));
    }
    if child(response, ASSERTION, "Issuer").is_some_and(|issuer| text(issuer) != idp.entity_id) {
        return Err(SamlError::Issuer("response's Issuer"));
    }
    Ok(())
}

/// What step 8 of [`super::verify_response`] found.
pub(super) struct CheckedAssertion {
    /// The subject's NameID.
    pub(super) name_id: String,
    /// The earlier of the bearer confirmation's and the Conditions' NotOnOrAfter.
    pub(super) valid_until: OffsetDateTime,
}

/// Checks the signed Assertion (step 8 of [`super::verify_response`]): its Issuer is the IdP;
/// its Subject has a NameID and a bearer SubjectConfirmation for the ACS URL, this request and
/// now; its Conditions hold now and name the SP in every AudienceRestriction.
pub(super) fn check_assertion(
    assertion: RoNode,
    idp: &IdpMetadata,
    sp: &ServiceProvider,
    expected_request_id: &str,
    now: OffsetDateTime,
    skew: std::time::Duration,
) -> Result<CheckedAssertion, SamlError> {
    let issuer = child(assertion, ASSERTION, "Issuer").ok_or(SamlError::Missing("assertion's Issuer"))?;
    if text(issuer) != idp.entity_id {
        return Err(SamlError::Issuer("assertion's Issuer"));
    }
    let subject = child(assertion, ASSERTION, "Subject").ok_or(SamlError::Missing("assertion's Subject"))?;
    let name_id = child(subject, ASSERTION, "NameID")
        .map(text)
        .filter(|name_id| !name_id.is_empty());
    let name_id = name_id.ok_or(SamlError::NoNameId)?;

    // Any bearer confirmation that holds will do; if none does, say why the first one fails.
    let mut first_failure = None;
    let mut confirmed = None;
    for confirmation in children(subject, ASSERTION, "SubjectConfirmation") {
        if attr(confirmation, "Method").as_deref() != Some(BEARER) {
            continue;
        }
        match check_bearer(confirmation, sp, expected_request_id, now, skew) {
            Ok(until) => {
                confirmed = Some(until);
                break;
            }
            Err(failure) => {
                first_failure.get_or_insert(failure);
            }
        }
    }
    let confirmed_until = match (confirmed, first_failure) {
        (Some(until), _) => until,
        (None, Some(failure)) => return Err(failure),
        (None, None) => return Err(SamlError::NoBearerConfirmation),
    };

    let conditions =
        child(assertion, ASSERTION, "Conditions").ok_or(SamlError::Missing("assertion's Conditions"))?;
    if let Some(not_before) = xml::time_attr(conditions, "NotBefore", "Conditions' NotBefore")? {
        if not_before > now + skew {
            return Err(SamlError::NotYetValid {
                what: "assertion's Conditions",
                at: not_before,
            });
        }
    }
    let conditions_until = xml::time_attr(conditions, "NotOnOrAfter", "Conditions' NotOnOrAfter")?;
    if let Some(not_on_or_after) = conditions_until {
        if not_on_or_after <= now - skew {
            return Err(SamlError::Expired {
                what: "assertion's Conditions",
                at: not_on_or_after,
            });
        }
    }
    let restrictions: Vec<RoNode> = children(conditions, ASSERTION, "AudienceRestriction").collect();
    let for_us = |restriction: &RoNode| {
        children(*restriction, ASSERTION, "Audience").any(|audience| text(audience) == sp.entity_id)
    };
    if restrictions.is_empty() || !restrictions.iter().all(for_us) {
        return Err(SamlError::Audience);
    }

    let valid_until = conditions_until.map_or(confirmed_until, |until| until.min(confirmed_until));
    Ok(CheckedAssertion { name_id, valid_until })
}

/// Checks one bearer SubjectConfirmation: its data's Recipient is the ACS URL, its NotOnOrAfter
/// (required) is still ahead, its NotBefore (if any) has come, and its InResponseTo is this
/// login's request. Returns its NotOnOrAfter.
fn check_bearer(
    confirmation: RoNode,
    sp: &ServiceProvider,
    expected_request_id: &str,
    now: OffsetDateTime,
    skew: std::time::Duration,
) -> Result<OffsetDateTime, SamlError> {
    let data = child(confirmation, ASSERTION, "SubjectConfirmationData")
        .ok_or(SamlError::Missing("bearer SubjectConfirmationData"))?;
    if attr(data, "Recipient").as_deref() != Some(sp.acs_url.as_str()) {
        return Err(SamlError::Recipient);
    }
    let what = "bearer SubjectConfirmationData";
    let not_on_or_after = xml::time_attr(data, "NotOnOrAfter", "SubjectConfirmationData's NotOnOrAfter")?
        .ok_or(SamlError::Missing(
            "bearer SubjectConfirmationData's NotOnOrAfter",
        ))?;
    if not_on_or_after <= now - skew {
        return Err(SamlError::Expired {
            what,
            at: not_on_or_after,
        });
    }
    if let Some(not_before) = xml::time_attr(data, "NotBefore", "SubjectConfirmationData's NotBefore")? {
        if not_before > now + skew {
            return Err(SamlError::NotYetValid { what, at: not_before });
        }
    }
    if attr(data, "InResponseTo").as_deref() != Some(expected_request_id) {
        return Err(SamlError::InResponseTo("bearer SubjectConfirmationData"));
    }
    Ok(not_on_or_after)
}

/// Every AttributeStatement attribute's Name and its AttributeValues' text (step 9 of
/// [`super::verify_response`]); attributes without a Name are left out.
pub(super) fn attributes(assertion: RoNode) -> BTreeMap<String, Vec<String>> {
    let mut attributes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for statement in children(assertion, ASSERTION, "AttributeStatement") {
        for attribute in children(statement, ASSERTION, "Attribute") {
            let Some(name) = attr(attribute, "Name") else {
                continue;
            };
            let values = children(attribute, ASSERTION, "AttributeValue").map(text);
            attributes.entry(name).or_default().extend(values);
        }
    }
    attributes
}

/// The earliest AuthnStatement SessionNotOnOrAfter, if any.
pub(super) fn session_not_on_or_after(assertion: RoNode) -> Result<Option<OffsetDateTime>, SamlError> {
    let mut earliest: Option<OffsetDateTime> = None;
    for statement in children(assertion, ASSERTION, "AuthnStatement") {
        if let Some(at) = xml::time_attr(statement, "SessionNotOnOrAfter", "SessionNotOnOrAfter")? {
            earliest = Some(earliest.map_or(at, |earliest| earliest.min(at)));
        }
    }
    Ok(earliest)
}
