//! Reading SAML documents with libxml2, the parser libxmlsec1 verifies with: a strict parse
//! (no recovery, no network, no DTD), namespace-aware element lookups, SAML times.

use libxml::{
    parser::{Parser, ParserOptions},
    readonly::RoNode,
    tree::{Document, NodeType},
};
use time::{format_description::well_known::Rfc3339, OffsetDateTime, UtcOffset};

use super::SamlError;

/// SAML 2.0 protocol (`samlp:`).
pub(super) const PROTOCOL: &str = "urn:oasis:names:tc:SAML:2.0:protocol";
/// SAML 2.0 assertions (`saml:`).
pub(super) const ASSERTION: &str = "urn:oasis:names:tc:SAML:2.0:assertion";
/// SAML 2.0 metadata (`md:`).
pub(super) const METADATA: &str = "urn:oasis:names:tc:SAML:2.0:metadata";
/// XML-DSig (`ds:`).
pub(super) const DSIG: &str = "http://www.w3.org/2000/09/xmldsig#";

/// A parsed, well-formed document with no DTD. Its nodes ([`RoNode`]) point into it: they must
/// not outlive it.
pub(super) struct Xml {
    doc: Document,
}

impl Xml {
    /// Parses `bytes` as a SAML document, refusing (before libxml2 sees them) anything but UTF-8,
    /// any `<!` other than a comment or CDATA section (so a DOCTYPE or an entity declaration
    /// never reaches a parser) and an XML declaration naming another encoding; then parses with
    /// libxml2 strictly: no recovery from errors, no network. Fails with [`SamlError::Doctype`]
    /// or [`SamlError::NotXml`].
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, SamlError> {
        let text = std::str::from_utf8(bytes).map_err(|_| SamlError::NotXml)?;
        if text.contains('\0') {
            return Err(SamlError::NotXml);
        }
        if text
            .match_indices("<!")
            .any(|(at, _)| !(text[at..].starts_with("<!--") || text[at..].starts_with("<![CDATA[")))
        {
            return Err(SamlError::Doctype);
        }
        if declared_encoding(text).is_some_and(|encoding| !encoding.eq_ignore_ascii_case("UTF-8")) {
            return Err(SamlError::NotXml);
        }
        let options = ParserOptions {
            recover: false,
            no_net: true,
            no_error: true,
            no_warning: true,
            // No encoding named: libxml 0.3.3 frees the name's C string before libxml2 reads it
            // (a use-after-free its fuzz target found, fuzz/fuzz_targets/supervisor_saml.rs).
            // The text is UTF-8 and declares no other encoding (checked above), which libxml2
            // then reads it as.
            encoding: None,
            ..ParserOptions::default()
        };
        let doc = Parser::default()
            .parse_string_with_options(bytes, options)
            .map_err(|_| SamlError::NotXml)?;
        // Belt and braces: a DTD node is a DOCTYPE, whatever the text scan saw.
        if doc
            .as_node()
            .get_child_nodes()
            .iter()
            .any(|node| node.get_type() == Some(NodeType::DTDNode))
        {
            return Err(SamlError::Doctype);
        }
        Ok(Self { doc })
    }

    /// The root element.
    pub(super) fn root(&self) -> Result<RoNode, SamlError> {
        self.doc.get_root_readonly().ok_or(SamlError::NotXml)
    }
}

/// The `encoding` of a leading XML declaration, if it names one.
fn declared_encoding(text: &str) -> Option<&str> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (declaration, _) = text.strip_prefix("<?xml")?.split_once("?>")?;
    let (_, rest) = declaration.split_once("encoding")?;
    let rest = rest.trim_start().strip_prefix('=')?.trim_start();
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    rest[1..].split(quote).next()
}

/// Whether `node` is the element `{ns}name`.
pub(super) fn is(node: RoNode, ns: &str, name: &str) -> bool {
    node.is_element_node()
        && node.get_name() == name
        && node
            .get_namespace()
            .is_some_and(|namespace| namespace.get_href() == ns)
}

/// The child elements `{ns}name` of `node`, in document order.
pub(super) fn children(node: RoNode, ns: &'static str, name: &'static str) -> impl Iterator<Item = RoNode> {
    node.get_child_elements()
        .into_iter()
        .filter(move |child| is(*child, ns, name))
}

/// The first child element `{ns}name` of `node`.
pub(super) fn child(node: RoNode, ns: &'static str, name: &'static str) -> Option<RoNode> {
    children(node, ns, name).next()
}

/// Every element under `node` (not `node` itself), in document order.
pub(super) fn descendants(node: RoNode) -> Vec<RoNode> {
    let mut found = Vec::new();
    let mut stack: Vec<RoNode> = node.get_child_elements().into_iter().rev().collect();
    while let Some(next) = stack.pop() {
        found.push(next);
        stack.extend(next.get_child_elements().into_iter().rev());
    }
    found
}

/// The attribute `name` (no namespace) of `node`.
pub(super) fn attr(node: RoNode, name: &str) -> Option<String> {
    node.get_attribute(name)
}

/// The text of `node` (all its text, comments left out), without surrounding whitespace.
pub(super) fn text(node: RoNode) -> String {
    node.get_content().trim().to_owned()
}

/// The xs:dateTime attribute `name` of `node`, if present; `what` names it in the error.
/// SAML times are UTC: a value without a zone is read as UTC.
pub(super) fn time_attr(
    node: RoNode,
    name: &str,
    what: &'static str,
) -> Result<Option<OffsetDateTime>, SamlError> {
    let Some(value) = attr(node, name) else {
        return Ok(None);
    };
    OffsetDateTime::parse(&value, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(&format!("{value}Z"), &Rfc3339))
        .map(Some)
        .map_err(|_| SamlError::BadTime(what))
}

/// `at` as a SAML xs:dateTime in UTC to the second (`2006-01-02T15:04:05Z`).
pub(super) fn format_time(at: OffsetDateTime) -> String {
    let at = at.to_offset(UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// `value` escaped for an XML attribute or text.
pub(super) fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            c => escaped.push(c),
        }
    }
    escaped
}
