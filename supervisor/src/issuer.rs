//! The FederationDomains a Supervisor serves, as requests find them: each with its issuer URL
//! split into host and path, its keys, and its identity providers; and the routing from a
//! request's host and path to a FederationDomain and one of its endpoints. The whole table is
//! replaced at once when the configuration changes ([`Issuers`] behind an `ArcSwap`).

use std::{collections::HashMap, sync::Arc};

use bytes::Bytes;
use selkie_api::supervisor_oidc::{IDPFlow, PinnipedIDP};
use selkie_oidc::jose::sign::SigningKey;

use crate::endpoints::discovery;
use crate::idp::transforms::{Outcome, Transforms};
use crate::idp::Upstream;
use crate::sealed::Sealer;
use crate::session::tokens::TokenKey;
use crate::session::SessionTerms;

/// A FederationDomain ready to serve.
#[derive(Debug)]
pub struct Issuer {
    /// `namespace/name` of the FederationDomain.
    pub name: String,
    /// Its issuer URL, as configured (no trailing slash).
    pub issuer: String,
    /// The issuer's host (lower-case, without port).
    pub host: String,
    /// The issuer's path (empty or `/…`, no trailing slash).
    pub path: String,
    /// The key ID tokens are signed with.
    pub signing_key: Arc<SigningKey>,
    /// The JWKS document (`jwks.json`): the signing key and any older keys still trusted.
    pub jwks: Bytes,
    /// The key of its opaque tokens.
    pub token_key: Arc<TokenKey>,
    /// The key of its sealed state and CSRF values.
    pub sealer: Arc<Sealer>,
    /// Its identity providers, in the FederationDomain's order.
    pub idps: Vec<Arc<Upstream>>,
    /// The identity transforms of those that have any, by display name.
    pub transforms: HashMap<String, Arc<Transforms>>,
    /// How long the sessions of their logins last.
    pub sessions: SessionPolicy,
    /// Whether it offers the device authorization grant (`spec.deviceAuthorization`).
    pub device_authorization: bool,
    /// Whether it binds sessions to a key of the client (`spec.dpop`, RFC 9449): the token
    /// endpoint then checks every DPoP proof it is sent, requires one at every login of the
    /// `pinniped-cli` client, and answers a `DPoP-Nonce` with every response.
    pub dpop: bool,
    /// The discovery document, rendered once.
    pub discovery: Bytes,
    /// The identity-provider discovery document, rendered once.
    pub idp_discovery: Bytes,
}

/// The session terms of a FederationDomain's identity providers: its own, and those of the
/// providers that override them, by display name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPolicy {
    /// The FederationDomain's terms (`spec.sessions`, or Pinniped's).
    pub default: SessionTerms,
    /// The terms of the providers whose `sessions` say something, by display name.
    pub by_idp: HashMap<String, SessionTerms>,
}

impl SessionPolicy {
    /// The terms of logins through the identity provider `idp_name`.
    pub fn of(&self, idp_name: &str) -> SessionTerms {
        self.by_idp.get(idp_name).copied().unwrap_or(self.default)
    }
}

/// Why an issuer URL cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IssuerError {
    /// Not an https URL with a host, or with a query, fragment or user info.
    #[error("the issuer {0:?} must be an https:// URL with a host and no query, fragment or user info")]
    Invalid(String),
}

/// The host (lower-case, without port) and path (no trailing slash) of an issuer URL.
pub(crate) fn split_issuer(issuer: &str) -> Result<(String, String), IssuerError> {
    let invalid = || IssuerError::Invalid(issuer.to_string());
    let uri: http::Uri = issuer.parse().map_err(|_| invalid())?;
    if uri.scheme_str() != Some("https")
        || uri.query().is_some()
        || issuer.contains('#')
        || issuer.contains('@')
    {
        return Err(invalid());
    }
    let host = uri.host().filter(|host| !host.is_empty()).ok_or_else(invalid)?;
    let path = uri.path().trim_end_matches('/').to_string();
    Ok((host.to_ascii_lowercase(), path))
}

impl Issuer {
    /// Builds an issuer, rendering its discovery documents.
    #[expect(
        clippy::too_many_arguments,
        reason = "one argument per part of a served FederationDomain, each from the reconciler"
    )]
    pub fn new(
        name: String,
        issuer: String,
        signing_key: Arc<SigningKey>,
        jwks: Bytes,
        token_key: Arc<TokenKey>,
        sealer: Arc<Sealer>,
        idps: Vec<Arc<Upstream>>,
        transforms: HashMap<String, Arc<Transforms>>,
        sessions: SessionPolicy,
    ) -> Result<Self, IssuerError> {
        let (host, path) = split_issuer(&issuer)?;
        let issuer = issuer.trim_end_matches('/').to_string();
        let mut served = Self {
            discovery: Bytes::new(),
            idp_discovery: Bytes::new(),
            device_authorization: false,
            dpop: false,
            name,
            issuer,
            host,
            path,
            signing_key,
            jwks,
            token_key,
            sealer,
            idps,
            transforms,
            sessions,
        };
        served.render();
        Ok(served)
    }

    /// The same issuer, offering the device authorization grant when `enabled` (its discovery
    /// documents rendered again).
    pub fn with_device_authorization(mut self, enabled: bool) -> Self {
        self.device_authorization = enabled;
        self.render();
        self
    }

    /// The same issuer, binding sessions to a key of the client (DPoP) when `enabled` (its
    /// discovery documents rendered again, `dpop_signing_alg_values_supported` in them).
    pub fn with_dpop(mut self, enabled: bool) -> Self {
        self.dpop = enabled;
        self.render();
        self
    }

    /// Renders the discovery documents from the rest.
    fn render(&mut self) {
        let listed: Vec<PinnipedIDP> = self
            .idps
            .iter()
            .map(|idp| {
                let mut flows = idp.flows();
                if self.device_authorization {
                    flows.push(IDPFlow::Device);
                }
                PinnipedIDP {
                    name: idp.display_name().to_string(),
                    r#type: idp.kind(),
                    flows,
                    sessions: Some(self.sessions.of(idp.display_name()).discovered()),
                }
            })
            .collect();
        self.discovery = Bytes::from(
            discovery::openid_configuration(&self.issuer, self.device_authorization, self.dpop).to_string(),
        );
        self.idp_discovery =
            Bytes::from(serde_json::to_string(&discovery::identity_providers(&listed)).unwrap_or_default());
    }

    /// What the identity transforms of the identity provider `idp_name` make of `username` and
    /// `groups` (unchanged, sorted, when it has none). The error names the failing expression.
    pub fn transform(&self, idp_name: &str, username: &str, groups: &[String]) -> Result<Outcome, String> {
        match self.transforms.get(idp_name) {
            Some(transforms) => transforms.apply(username, groups),
            None => {
                let mut groups = groups.to_vec();
                groups.sort();
                groups.dedup();
                Ok(Outcome::Allowed {
                    username: username.to_string(),
                    groups,
                })
            }
        }
    }

    /// The identity provider a login asks for by name (and type, when given), or the only one when
    /// it names none.
    pub fn idp(&self, name: Option<&str>, kind: Option<&str>) -> Option<&Arc<Upstream>> {
        match name {
            Some(name) => self.idps.iter().find(|idp| {
                idp.display_name() == name && kind.is_none_or(|kind| idp.kind().as_str() == kind)
            }),
            None if self.idps.len() == 1 => self.idps.first(),
            None => None,
        }
    }

    /// Whether one of its identity providers is a SAMLIdentityProvider (its SAML endpoints are
    /// served then).
    pub fn has_saml(&self) -> bool {
        self.idps
            .iter()
            .any(|idp| matches!(idp.as_ref(), Upstream::Saml(_)))
    }

    /// The Supervisor as the SAML service provider of this FederationDomain: entity ID
    /// `<issuer>/saml/metadata`, assertion consumer service `<issuer>/saml/acs`.
    pub(crate) fn saml_service_provider(&self) -> crate::idp::saml::ServiceProvider {
        use crate::endpoints::discovery::{SAML_ACS_PATH, SAML_METADATA_PATH};
        crate::idp::saml::ServiceProvider {
            entity_id: format!("{}{SAML_METADATA_PATH}", self.issuer),
            acs_url: format!("{}{SAML_ACS_PATH}", self.issuer),
        }
    }
}

/// Every served FederationDomain, by host.
#[derive(Debug, Default)]
pub struct Issuers {
    by_host: HashMap<String, Vec<Arc<Issuer>>>,
}

impl Issuers {
    /// The table of `issuers`. Two with the same issuer URL: the first one serves (the reconciler
    /// refuses duplicates before they get here).
    pub fn new(issuers: Vec<Arc<Issuer>>) -> Self {
        let mut by_host: HashMap<String, Vec<Arc<Issuer>>> = HashMap::new();
        for issuer in issuers {
            let list = by_host.entry(issuer.host.clone()).or_default();
            if !list.iter().any(|other| other.path == issuer.path) {
                list.push(issuer);
            }
        }
        // Longest path first, so /a/b wins over /a.
        for list in by_host.values_mut() {
            list.sort_by_key(|issuer| std::cmp::Reverse(issuer.path.len()));
        }
        Self { by_host }
    }

    /// The FederationDomain serving a request for `host` (with or without port) and `path`, and the
    /// endpoint path below its issuer path (e.g. `/oauth2/token`).
    pub fn route<'a>(&self, host: &str, path: &'a str) -> Option<(&Arc<Issuer>, &'a str)> {
        let host = host
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(host, _)| host);
        let list = self.by_host.get(&host.to_ascii_lowercase())?;
        list.iter().find_map(|issuer| {
            let rest = path.strip_prefix(issuer.path.as_str())?;
            (rest.starts_with('/')).then_some((issuer, rest))
        })
    }

    /// Every served issuer.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Issuer>> {
        self.by_host.values().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(url: &str) -> Arc<Issuer> {
        Arc::new(
            Issuer::new(
                url.into(),
                url.into(),
                Arc::new(SigningKey::generate("k").unwrap()),
                Bytes::new(),
                Arc::new(TokenKey::new(&[1; 32])),
                Arc::new(Sealer::new(&[2; 32], url).unwrap()),
                Vec::new(),
                Default::default(),
                Default::default(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn requests_reach_the_issuer_of_their_host_and_longest_path() {
        let issuers = Issuers::new(vec![
            issuer("https://sso.example.com/a"),
            issuer("https://sso.example.com/a/b"),
            issuer("https://Other.example.com"),
        ]);
        let (found, rest) = issuers
            .route("sso.example.com:8443", "/a/b/oauth2/token")
            .unwrap();
        assert_eq!(found.issuer, "https://sso.example.com/a/b");
        assert_eq!(rest, "/oauth2/token");
        let (found, rest) = issuers.route("SSO.example.com", "/a/jwks.json").unwrap();
        assert_eq!(
            (found.issuer.as_str(), rest),
            ("https://sso.example.com/a", "/jwks.json")
        );
        let (found, _) = issuers
            .route("other.example.com", "/.well-known/openid-configuration")
            .unwrap();
        assert_eq!(found.issuer, "https://Other.example.com");
        assert!(issuers.route("sso.example.com", "/ab/jwks.json").is_none());
        assert!(issuers.route("unknown.example.com", "/a/jwks.json").is_none());
    }

    #[test]
    fn issuer_urls_must_be_plain_https() {
        assert_eq!(
            split_issuer("https://sso.example.com:8443/a/").unwrap(),
            ("sso.example.com".to_string(), "/a".to_string())
        );
        for bad in [
            "http://sso.example.com",
            "https://sso.example.com?x=1",
            "https://u@sso.example.com",
            "sso",
        ] {
            assert!(split_issuer(bad).is_err(), "{bad}");
        }
    }
}
