//! Reading an IdP's metadata: its entity ID, SSO URL and signing certificates.

use base64::{engine::general_purpose::STANDARD, Engine as _};
use libxml::readonly::RoNode;

use super::xml::{attr, child, children, text, Xml, DSIG, METADATA, PROTOCOL};
use super::{IdpMetadata, SamlError, MAX_METADATA};

const HTTP_REDIRECT: &str = "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect";

impl IdpMetadata {
    /// Reads IdP metadata: an `md:EntityDescriptor` (not an `EntitiesDescriptor`) with an
    /// `md:IDPSSODescriptor` supporting SAML 2.0, as Keycloak serves at
    /// `/realms/<realm>/protocol/saml/descriptor`. Takes its `entityID`, the Location of its
    /// SingleSignOnService with the HTTP-Redirect binding (an http(s) URL), and the X.509
    /// certificates of its KeyDescriptors for signing (`use="signing"` or no `use`), each
    /// checked to be DER X.509. Runs when an upstream's metadata is (re)loaded. Fails with
    /// [`SamlError::TooLarge`] above 1 MiB, [`SamlError::Doctype`] or [`SamlError::NotXml`] for
    /// a document it refuses to parse, and [`SamlError::Metadata`] naming what is missing.
    pub(crate) fn parse(xml: &str) -> Result<Self, SamlError> {
        if xml.len() > MAX_METADATA {
            return Err(SamlError::TooLarge { limit: MAX_METADATA });
        }
        let document = Xml::parse(xml.as_bytes())?;
        let root = document.root()?;
        if !super::xml::is(root, METADATA, "EntityDescriptor") {
            return Err(SamlError::Metadata("is not an md:EntityDescriptor"));
        }
        let entity_id = attr(root, "entityID")
            .filter(|id| !id.is_empty())
            .ok_or(SamlError::Metadata("has no entityID"))?;
        let descriptor = children(root, METADATA, "IDPSSODescriptor")
            .find(|descriptor| {
                attr(*descriptor, "protocolSupportEnumeration").is_some_and(|protocols| {
                    protocols.split_whitespace().any(|protocol| protocol == PROTOCOL)
                })
            })
            .ok_or(SamlError::Metadata("has no IDPSSODescriptor for SAML 2.0"))?;
        let sso_redirect_url = children(descriptor, METADATA, "SingleSignOnService")
            .find(|service| attr(*service, "Binding").as_deref() == Some(HTTP_REDIRECT))
            .and_then(|service| attr(service, "Location"))
            .ok_or(SamlError::Metadata(
                "has no SingleSignOnService with the HTTP-Redirect binding",
            ))?;
        if !(sso_redirect_url.starts_with("https://") || sso_redirect_url.starts_with("http://")) {
            return Err(SamlError::Metadata(
                "has an HTTP-Redirect SingleSignOnService that is not an http(s) URL",
            ));
        }
        let mut signing_certificates = Vec::new();
        for key in children(descriptor, METADATA, "KeyDescriptor") {
            if attr(key, "use").is_some_and(|usage| usage != "signing") {
                continue;
            }
            for certificate in certificates(key) {
                let der = certificate?;
                if !signing_certificates.contains(&der) {
                    signing_certificates.push(der);
                }
            }
        }
        if signing_certificates.is_empty() {
            return Err(SamlError::Metadata("has no signing certificate"));
        }
        Ok(Self {
            entity_id,
            sso_redirect_url,
            signing_certificates,
        })
    }
}

/// The DER of each `ds:KeyInfo/ds:X509Data/ds:X509Certificate` of a KeyDescriptor, each
/// checked to be exactly one X.509 certificate.
fn certificates(key: RoNode) -> impl Iterator<Item = Result<Vec<u8>, SamlError>> {
    let data = child(key, DSIG, "KeyInfo")
        .into_iter()
        .flat_map(|info| children(info, DSIG, "X509Data"));
    data.flat_map(|data| children(data, DSIG, "X509Certificate"))
        .map(|certificate| {
            let encoded: String = text(certificate)
                .chars()
                .filter(|c| !c.is_ascii_whitespace())
                .collect();
            let der = STANDARD.decode(encoded).ok().filter(
                |der| matches!(x509_parser::parse_x509_certificate(der), Ok((rest, _)) if rest.is_empty()),
            );
            der.ok_or(SamlError::Metadata(
                "has a signing certificate that is not base64 DER X.509",
            ))
        })
}
