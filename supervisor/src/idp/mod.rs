//! The upstream identity providers of a FederationDomain as logins use them: OIDC, LDAP and
//! Active Directory, GitHub, and SAML 2.0 (Selkie's own kind).
//!
//! An OIDC upstream is a discovered [`Provider`] the Supervisor is a confidential client of, and
//! the rules that turn its ID token into a downstream identity (Pinniped's): the username claim
//! (default: `<issuer>?sub=<sub>`; `email` only when `email_verified` is not false), the groups
//! claim (a string or a list of strings), additional claim mappings.

pub(crate) mod github;
pub(crate) mod ldap;
pub(crate) mod saml;
pub(crate) mod subject;
pub(crate) mod throttle;
pub(crate) mod transforms;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use selkie_oidc::rp::{ClientConfig, Provider, Tokens};
use serde_json::{Map, Value};

use selkie_api::supervisor_oidc::{IDPFlow, IDPType};

use crate::idp::github::{GitHub, GitHubError};
use crate::idp::ldap::{Directory, LdapError, StoredLogin};
use crate::idp::throttle::{Account, IdpObject, PasswordThrottle};
use crate::session::{self, Identity, LdapSession};

/// A configured upstream identity provider.
#[derive(Debug)]
pub enum Upstream {
    /// An OIDCIdentityProvider.
    Oidc(OidcUpstream),
    /// An LDAPIdentityProvider or ActiveDirectoryIdentityProvider.
    Ldap(LdapUpstream),
    /// A GitHubIdentityProvider.
    GitHub(GitHubUpstream),
    /// A SAMLIdentityProvider.
    Saml(SamlUpstream),
}

impl Upstream {
    /// The name it goes by in the FederationDomain.
    pub fn display_name(&self) -> &str {
        match self {
            Self::Oidc(oidc) => &oidc.display_name,
            Self::Ldap(ldap) => &ldap.display_name,
            Self::GitHub(github) => &github.display_name,
            Self::Saml(saml) => &saml.display_name,
        }
    }

    /// The UID of the identity-provider object it was built from.
    pub fn resource_uid(&self) -> &str {
        match self {
            Self::Oidc(oidc) => &oidc.resource_uid,
            Self::Ldap(ldap) => &ldap.resource_uid,
            Self::GitHub(github) => &github.resource_uid,
            Self::Saml(saml) => &saml.resource_uid,
        }
    }

    /// The same upstream under another display name (a FederationDomain's).
    pub fn with_display_name(&self, display_name: &str) -> Self {
        match self {
            Self::Oidc(oidc) => Self::Oidc(OidcUpstream {
                display_name: display_name.to_string(),
                ..oidc.clone()
            }),
            Self::Ldap(ldap) => Self::Ldap(LdapUpstream {
                display_name: display_name.to_string(),
                ..ldap.clone()
            }),
            Self::GitHub(github) => Self::GitHub(GitHubUpstream {
                display_name: display_name.to_string(),
                ..github.clone()
            }),
            Self::Saml(saml) => Self::Saml(SamlUpstream {
                display_name: display_name.to_string(),
                ..saml.clone()
            }),
        }
    }

    /// Its type.
    pub fn kind(&self) -> IDPType {
        match self {
            Self::Oidc(_) => IDPType::OIDC,
            Self::Ldap(ldap) => ldap.kind,
            Self::GitHub(_) => IDPType::GitHub,
            Self::Saml(_) => IDPType::SAML,
        }
    }

    /// The flows it offers, in Pinniped's order.
    pub fn flows(&self) -> Vec<IDPFlow> {
        match self {
            Self::Oidc(oidc) if oidc.allow_password_grant => {
                vec![IDPFlow::BrowserAuthcode, IDPFlow::CliPassword]
            }
            Self::Oidc(_) => vec![IDPFlow::BrowserAuthcode],
            Self::Ldap(_) => vec![IDPFlow::CliPassword, IDPFlow::BrowserAuthcode],
            Self::GitHub(_) | Self::Saml(_) => vec![IDPFlow::BrowserAuthcode],
        }
    }
}

/// An OIDCIdentityProvider ready to use.
#[derive(Debug, Clone)]
pub struct OidcUpstream {
    /// Its display name in the FederationDomain.
    pub display_name: String,
    /// The OIDCIdentityProvider's name (sessions record it, to find the upstream again).
    pub resource_name: String,
    /// The OIDCIdentityProvider's UID (a recreated resource of the same name is another upstream).
    pub resource_uid: String,
    /// The discovered issuer (shared by the FederationDomains that list it, with its key cache).
    pub provider: Arc<Provider>,
    /// The Supervisor's client registration there, and the scopes it asks for.
    pub client: ClientConfig,
    /// Extra parameters of the authorization request (`authorizationConfig.additionalAuthorizeParameters`).
    pub additional_authorize_parameters: Vec<(String, String)>,
    /// Whether the `cli_password` flow may send users' passwords to it (the password grant).
    pub allow_password_grant: bool,
    /// The claim holding the username; `None`: `<issuer>?sub=<sub>`.
    pub username_claim: Option<String>,
    /// The claim holding the groups; `None`: no groups.
    pub groups_claim: Option<String>,
    /// Downstream `additionalClaims` name → upstream claim.
    pub additional_claim_mappings: BTreeMap<String, String>,
}

impl OidcUpstream {
    /// What a successful upstream login (`tokens`, from the code or the password grant) makes of
    /// the user: their downstream identity and what the session keeps of the upstream. The
    /// session keeps the upstream refresh token, or, when the upstream issued none, its access
    /// token if it has a userinfo endpoint to check it at on refresh (Pinniped's rule); with
    /// neither the login is refused, since the session could never be checked again. The error
    /// is the reason of an `access_denied`.
    pub fn login(&self, tokens: Tokens) -> Result<(Identity, session::Upstream), String> {
        let Some(id_token) = tokens.id else {
            return Err("Reason: the upstream identity provider returned no ID token.".into());
        };
        let (identity, upstream_subject) = self.identity(&id_token.claims)?;
        let (refresh_token, access_token) = match (tokens.refresh, tokens.access) {
            (Some(refresh), _) => (Some(refresh.token), None),
            (None, Some(access)) if !self.provider.discovery.userinfo_endpoint.is_empty() => {
                (None, Some(access.token))
            }
            (None, _) => {
                return Err(
                    "Reason: the upstream identity provider returned no refresh token, and no access \
                     token with a userinfo endpoint to check it at; the session could not be refreshed."
                        .into(),
                )
            }
        };
        Ok((
            identity,
            session::Upstream {
                idp_name: self.display_name.clone(),
                idp_type: "oidc".into(),
                provider_name: self.resource_name.clone(),
                provider_uid: self.resource_uid.clone(),
                issuer: self.provider.discovery.issuer.clone(),
                subject: upstream_subject,
                refresh_token,
                access_token,
                ldap: None,
                username: None,
                groups: None,
            },
        ))
    }

    /// The downstream identity of a user with these (validated) upstream ID token claims, and
    /// their upstream `sub`. The error is the reason of an `access_denied`, in Pinniped's words.
    pub fn identity(&self, claims: &Map<String, Value>) -> Result<(Identity, String), String> {
        let issuer = self.provider.discovery.issuer.as_str();
        let upstream_subject = match claims.get("sub") {
            Some(Value::String(sub)) if !sub.is_empty() => sub.clone(),
            _ => return Err("Reason: required claim in upstream ID token missing.".into()),
        };
        let username = match self.username_claim.as_deref() {
            None => format!("{issuer}?sub={}", subject::query_escape(&upstream_subject)),
            Some(claim) => {
                if claim == "email" {
                    match claims.get("email_verified") {
                        None | Some(Value::Bool(true)) => {}
                        Some(Value::Bool(false)) => {
                            return Err(
                                "Reason: email_verified claim in upstream ID token has false value.".into(),
                            )
                        }
                        Some(_) => {
                            return Err(
                                "Reason: email_verified claim in upstream ID token has invalid format."
                                    .into(),
                            )
                        }
                    }
                }
                match claims.get(claim) {
                    None => return Err("Reason: required claim in upstream ID token missing.".into()),
                    Some(Value::String(value)) if !value.is_empty() => value.clone(),
                    Some(Value::String(_)) => {
                        return Err("Reason: required claim in upstream ID token is empty.".into())
                    }
                    Some(_) => {
                        return Err("Reason: required claim in upstream ID token has invalid format.".into())
                    }
                }
            }
        };
        let groups = match self.groups_claim.as_deref().map(|claim| claims.get(claim)) {
            None | Some(None) => Vec::new(),
            Some(Some(Value::String(group))) => vec![group.clone()],
            Some(Some(Value::Array(values))) => values
                .iter()
                .map(|value| value.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or("Reason: groups claim in upstream ID token has invalid format.")?,
            Some(Some(_)) => {
                return Err("Reason: groups claim in upstream ID token has invalid format.".into())
            }
        };
        let additional_claims = self
            .additional_claim_mappings
            .iter()
            .filter_map(|(downstream, upstream)| {
                claims
                    .get(upstream)
                    .map(|value| (downstream.clone(), value.clone()))
            })
            .collect();
        Ok((
            Identity {
                subject: subject::oidc(issuer, &upstream_subject, &self.display_name),
                username,
                groups,
                additional_claims,
            },
            upstream_subject,
        ))
    }
}

/// An LDAPIdentityProvider or ActiveDirectoryIdentityProvider ready to use.
#[derive(Debug, Clone)]
pub struct LdapUpstream {
    /// Its display name in the FederationDomain.
    pub display_name: String,
    /// The resource's name.
    pub resource_name: String,
    /// The resource's UID.
    pub resource_uid: String,
    /// `ldap` or `activedirectory`.
    pub kind: IDPType,
    /// The directory (shared by the FederationDomains that list it, with its connections).
    pub directory: Arc<Directory>,
}

/// Why an LDAP or Active Directory login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LdapLoginError {
    /// The account failed too many passwords in a row and must wait this long before the
    /// directory checks another ([`crate::idp::throttle`]); nothing was bound.
    #[error("too many failed passwords in a row for this account; it must wait {0:?}")]
    MustWait(Duration),
    /// The directory refused the login or could not be asked.
    #[error(transparent)]
    Directory(#[from] LdapError),
}

impl LdapUpstream {
    /// The identity provider object the password throttle counts this upstream's accounts
    /// under: the resource (kind, name, UID), whatever FederationDomain lists it.
    pub(crate) fn idp_object(&self) -> IdpObject<'_> {
        IdpObject {
            kind: self.kind.as_str(),
            name: &self.resource_name,
            uid: &self.resource_uid,
        }
    }

    /// Logs `username` in with `password`, slowed down by `throttle`: their downstream identity
    /// (username and groups as the directory has them, `sub` from the directory's URL and their
    /// UID) and what the session keeps for refreshes.
    ///
    /// The steps: an empty username or password is refused; the user's entry is searched
    /// ([`Directory::find_user`], as the service account); the throttle is asked about the
    /// entry — by its DN, so every spelling of the username the directory resolves to it is one
    /// account — or, when there is none, about the typed username, normalised
    /// ([`crate::idp::throttle::Account`]); an account that must wait is
    /// [`LdapLoginError::MustWait`] and its password is never sent; then the password is
    /// checked ([`Directory::check_password`]). A refused password, and an unknown user, count
    /// as a failure; an accepted password clears the account. Other failures count nothing and
    /// are [`LdapLoginError::Directory`], as the directory's are.
    pub async fn login(
        &self,
        throttle: &PasswordThrottle,
        username: &str,
        password: &str,
    ) -> Result<(Identity, session::Upstream), LdapLoginError> {
        if username.is_empty() || password.is_empty() {
            return Err(LdapError::InvalidCredentials.into());
        }
        let user = self.directory.find_user(username).await?;
        let account = match &user {
            Some(user) => Account::entry(self.idp_object(), user.dn()),
            None => Account::username(self.idp_object(), username),
        };
        throttle
            .check(&account, Instant::now())
            .map_err(LdapLoginError::MustWait)?;
        let Some(user) = user else {
            throttle.failed(&account, Instant::now());
            return Err(LdapError::InvalidCredentials.into());
        };
        let found = match self.directory.check_password(user, password).await {
            Ok(found) => found,
            Err(error) => {
                if error == LdapError::InvalidCredentials {
                    throttle.failed(&account, Instant::now());
                }
                return Err(error.into());
            }
        };
        throttle.succeeded(&account);
        let url = self.directory.url();
        Ok((
            Identity {
                subject: subject::ldap(&url, &self.display_name, &found.uid),
                username: found.username.clone(),
                groups: found.groups.clone(),
                additional_claims: BTreeMap::new(),
            },
            session::Upstream {
                idp_name: self.display_name.clone(),
                idp_type: self.kind.as_str().to_string(),
                provider_name: self.resource_name.clone(),
                provider_uid: self.resource_uid.clone(),
                issuer: url,
                subject: found.uid,
                refresh_token: None,
                access_token: None,
                username: Some(found.username.clone()),
                groups: Some(found.groups),
                ldap: Some(LdapSession {
                    dn: found.dn,
                    username: found.username,
                    refresh_attributes: found.refresh_attributes,
                }),
            },
        ))
    }

    /// Checks the user of a session (what it keeps of the login, `upstream`) again at the
    /// directory ([`Directory::refresh`]) and returns their groups there now. The session must
    /// be of this directory (same URL). Fails as [`UpstreamFailure::Unavailable`] when the
    /// directory could not be asked (unreachable, busy, timed out), else as
    /// [`UpstreamFailure::Refused`] with the reason.
    pub async fn refresh(&self, upstream: &session::Upstream) -> Result<Vec<String>, UpstreamFailure> {
        let Some(stored) = upstream.ldap.as_ref() else {
            return Err(UpstreamFailure::Refused(
                "The session holds no LDAP entry; log in again.".into(),
            ));
        };
        if upstream.issuer != self.directory.url() {
            return Err(UpstreamFailure::Refused(
                "The identity provider's host or user search base changed.".into(),
            ));
        }
        self.directory
            .refresh(&StoredLogin {
                dn: &stored.dn,
                username: &stored.username,
                uid: &upstream.subject,
                groups: upstream.groups.as_deref().unwrap_or_default(),
                refresh_attributes: &stored.refresh_attributes,
            })
            .await
            .map_err(|error| match error {
                LdapError::Changed(what) => UpstreamFailure::Refused(what),
                other if other.is_unavailable() => {
                    UpstreamFailure::Unavailable(format!("The directory could not be asked: {other}"))
                }
                other => UpstreamFailure::Refused(format!("The directory refused: {other}")),
            })
    }
}

/// Why an upstream did not do what was asked of it (confirm a refresh, revoke a token). Both
/// carry a reason for a log line or a client's `error_description`, never a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The upstream could not be asked (unreachable, busy, timed out, failing): nothing was
    /// decided, and trying again later may succeed.
    Unavailable(String),
    /// The upstream said no (the user changed, is gone, or may no longer log in; the token was
    /// refused), or the request cannot be made at all: trying again will not help.
    Refused(String),
}

impl std::fmt::Display for UpstreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(reason) | Self::Refused(reason) => f.write_str(reason),
        }
    }
}

/// A GitHubIdentityProvider ready to use.
#[derive(Debug, Clone)]
pub struct GitHubUpstream {
    /// Its display name in the FederationDomain.
    pub display_name: String,
    /// The resource's name.
    pub resource_name: String,
    /// The resource's UID.
    pub resource_uid: String,
    /// The GitHub it logs in at.
    pub github: Arc<GitHub>,
}

impl GitHubUpstream {
    /// Finishes a login whose browser came back with `code` (sent to `redirect_uri`): redeems it
    /// for the user's access token and asks GitHub who they are ([`GitHub::user`]). The session
    /// keeps the access token to ask again at every refresh. Fails as those do.
    pub async fn login(
        &self,
        code: &str,
        redirect_uri: &str,
    ) -> Result<(Identity, session::Upstream), GitHubError> {
        let token = self.github.exchange_code(code, redirect_uri).await?;
        let user = self.github.user(&token, &self.display_name).await?;
        Ok((
            Identity {
                subject: user.subject,
                username: user.username.clone(),
                groups: user.groups.clone(),
                additional_claims: BTreeMap::new(),
            },
            session::Upstream {
                idp_name: self.display_name.clone(),
                idp_type: IDPType::GitHub.as_str().to_string(),
                provider_name: self.resource_name.clone(),
                provider_uid: self.resource_uid.clone(),
                issuer: self.github.endpoints.api.clone(),
                subject: String::new(),
                refresh_token: None,
                access_token: Some(token),
                username: Some(user.username),
                groups: Some(user.groups),
                ldap: None,
            },
        ))
    }

    /// Checks the user of a session again at GitHub with the access token it keeps and returns
    /// their upstream username and groups now. The user must be the same one (the same
    /// downstream subject, `downstream_subject`) and still pass the organization policy. Fails
    /// as [`UpstreamFailure::Unavailable`] when GitHub could not be asked, else as
    /// [`UpstreamFailure::Refused`] with the reason.
    pub async fn refresh(
        &self,
        upstream: &session::Upstream,
        downstream_subject: &str,
    ) -> Result<(String, Vec<String>), UpstreamFailure> {
        let Some(token) = upstream.access_token.as_deref() else {
            return Err(UpstreamFailure::Refused(
                "The session holds no GitHub access token; log in again.".into(),
            ));
        };
        let user = self
            .github
            .user(token, &self.display_name)
            .await
            .map_err(|error| match error {
                GitHubError::Unavailable(_) => UpstreamFailure::Unavailable(error.to_string()),
                GitHubError::Refused(_) | GitHubError::Denied => UpstreamFailure::Refused(error.to_string()),
            })?;
        if user.subject != downstream_subject {
            return Err(UpstreamFailure::Refused(
                "The GitHub user or the identity provider's host changed.".into(),
            ));
        }
        Ok((user.username, user.groups))
    }
}

/// A SAMLIdentityProvider ready to use.
#[derive(Debug, Clone)]
pub struct SamlUpstream {
    /// Its display name in the FederationDomain.
    pub display_name: String,
    /// The resource's name.
    pub resource_name: String,
    /// The resource's UID.
    pub resource_uid: String,
    /// The identity provider's metadata: its entity ID, where to send users, its signing
    /// certificates.
    pub(crate) metadata: Arc<saml::IdpMetadata>,
    /// The attribute holding the username; `None`: the subject's `NameID`.
    pub username_attribute: Option<String>,
    /// The attribute holding the groups; `None`: no groups.
    pub groups_attribute: Option<String>,
    /// How far the identity provider's clock may be off when validity windows are checked.
    pub clock_skew: Duration,
}

impl SamlUpstream {
    /// Whether `other` is configured exactly as this one (same resource, metadata and mapping).
    pub(crate) fn same_settings(&self, other: &Self) -> bool {
        self.resource_name == other.resource_name
            && self.resource_uid == other.resource_uid
            && self.metadata == other.metadata
            && self.username_attribute == other.username_attribute
            && self.groups_attribute == other.groups_attribute
            && self.clock_skew == other.clock_skew
    }

    /// What a verified assertion makes of its user: their downstream identity (the username from
    /// the username attribute's first value or the `NameID`; every value of the groups
    /// attribute a group; `sub` from the identity provider's entity ID and the `NameID`) and
    /// what the session keeps (the username and groups, which no refresh can ask the identity
    /// provider about again). The end the identity provider set for the session
    /// (`SessionNotOnOrAfter`) is the caller's to apply. The error is the reason of an
    /// `access_denied`.
    pub(crate) fn login(&self, verified: &saml::Verified) -> Result<(Identity, session::Upstream), String> {
        let entity_id = &self.metadata.entity_id;
        let username = match self.username_attribute.as_deref() {
            None => verified.name_id.clone(),
            Some(attribute) => match verified
                .attributes
                .get(attribute)
                .and_then(|values| values.first())
            {
                Some(value) if !value.is_empty() => value.clone(),
                _ => {
                    return Err(format!(
                        "Reason: the assertion has no value of the username attribute {attribute:?}."
                    ))
                }
            },
        };
        let groups: Vec<String> = self
            .groups_attribute
            .as_deref()
            .and_then(|attribute| verified.attributes.get(attribute))
            .map(|values| values.iter().filter(|group| !group.is_empty()).cloned().collect())
            .unwrap_or_default();
        Ok((
            Identity {
                subject: subject::oidc(entity_id, &verified.name_id, &self.display_name),
                username: username.clone(),
                groups: groups.clone(),
                additional_claims: BTreeMap::new(),
            },
            session::Upstream {
                idp_name: self.display_name.clone(),
                idp_type: IDPType::SAML.as_str().to_string(),
                provider_name: self.resource_name.clone(),
                provider_uid: self.resource_uid.clone(),
                issuer: entity_id.clone(),
                subject: verified.name_id.clone(),
                refresh_token: None,
                access_token: None,
                ldap: None,
                username: Some(username),
                groups: Some(groups),
            },
        ))
    }
}

#[cfg(test)]
mod refresh_tests {
    use selkie_api::supervisor_idp::{GitHubGroupNameAttribute, GitHubUsernameAttribute};
    use selkie_oidc::https::{HttpsClient, TlsOptions};

    use super::*;

    fn github_at(host: &str) -> GitHubUpstream {
        let github = GitHub::new(
            github::Endpoints::of(host).unwrap(),
            "app".into(),
            "app-secret".into(),
            GitHubUsernameAttribute::LoginAndID,
            GitHubGroupNameAttribute::Slug,
            &[],
            HttpsClient::new(&TlsOptions::default()).unwrap(),
        );
        GitHubUpstream {
            display_name: "github".into(),
            resource_name: "github".into(),
            resource_uid: "github-uid".into(),
            github: Arc::new(github),
        }
    }

    fn session(access_token: Option<&str>) -> session::Upstream {
        session::Upstream {
            idp_name: "github".into(),
            idp_type: "github".into(),
            provider_name: "github".into(),
            provider_uid: "github-uid".into(),
            issuer: String::new(),
            subject: "https://api.github.com?idpName=github&login=seal&id=1".into(),
            refresh_token: None,
            access_token: access_token.map(Into::into),
            ldap: None,
            username: Some("seal:1".into()),
            groups: Some(Vec::new()),
        }
    }

    /// A GitHub that cannot be reached leaves the session to be refreshed again later
    /// (`Unavailable`, which the token endpoint answers `temporarily_unavailable`); a session
    /// that cannot be refreshed at all is `Refused`. Neither reason quotes the access token.
    #[tokio::test]
    async fn an_unreachable_github_is_unavailable_not_a_refusal() {
        // Nothing listens on port 1 of the loopback: the connection is refused.
        let github = github_at("127.0.0.1:1");
        let failure = github
            .refresh(&session(Some("gho_secret_token")), "downstream-subject")
            .await
            .unwrap_err();
        assert!(matches!(failure, UpstreamFailure::Unavailable(_)), "{failure:?}");
        assert!(!failure.to_string().contains("gho_secret_token"), "{failure}");
        let failure = github
            .refresh(&session(None), "downstream-subject")
            .await
            .unwrap_err();
        assert!(matches!(failure, UpstreamFailure::Refused(_)), "{failure:?}");
    }
}

#[cfg(test)]
mod saml_login_tests {
    use super::*;

    fn upstream(username: Option<&str>, groups: Option<&str>) -> SamlUpstream {
        SamlUpstream {
            display_name: "Corp SAML".into(),
            resource_name: "corp".into(),
            resource_uid: "corp-uid".into(),
            metadata: Arc::new(saml::IdpMetadata::parse(&saml::tests::test_idp_metadata_xml()).unwrap()),
            username_attribute: username.map(Into::into),
            groups_attribute: groups.map(Into::into),
            clock_skew: Duration::ZERO,
        }
    }

    fn verified() -> saml::Verified {
        saml::Verified {
            name_id: "alice id".into(),
            attributes: BTreeMap::from([
                (
                    "mail".into(),
                    vec!["alice@example.com".into(), "a@example.com".into()],
                ),
                (
                    "groups".into(),
                    vec!["seals".into(), String::new(), "pups".into()],
                ),
            ]),
            assertion_id: "ID_1".into(),
            valid_until: time::OffsetDateTime::UNIX_EPOCH,
            session_not_on_or_after: None,
        }
    }

    /// The username is the NameID, or the first value of its attribute; the groups every
    /// non-empty value of theirs; `sub` names the entity ID, the display name and the NameID.
    #[test]
    fn the_identity_comes_from_the_name_id_or_the_configured_attributes() {
        let (identity, kept) = upstream(None, None).login(&verified()).unwrap();
        assert_eq!(identity.username, "alice id");
        assert!(identity.groups.is_empty());
        assert_eq!(
            identity.subject,
            "http://keycloak.test/realms/selkie?idpName=Corp+SAML&sub=alice+id"
        );
        assert_eq!(kept.idp_type, "saml");
        assert_eq!(kept.issuer, "http://keycloak.test/realms/selkie");
        assert_eq!(kept.subject, "alice id");

        let (identity, kept) = upstream(Some("mail"), Some("groups")).login(&verified()).unwrap();
        assert_eq!(identity.username, "alice@example.com");
        assert_eq!(identity.groups, ["seals", "pups"]);
        assert_eq!(kept.username.as_deref(), Some("alice@example.com"));
        assert_eq!(
            kept.groups.as_deref(),
            Some(&["seals".to_string(), "pups".to_string()][..])
        );
    }

    /// An assertion without the username attribute is no login, and the reason names it.
    #[test]
    fn a_missing_username_attribute_refuses_the_login() {
        let refused = upstream(Some("uid"), None).login(&verified()).unwrap_err();
        assert_eq!(
            refused,
            r#"Reason: the assertion has no value of the username attribute "uid"."#
        );
    }
}
