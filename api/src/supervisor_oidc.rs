//! The Supervisor's OIDC wire names that are not Kubernetes API types (always built): the
//! constants of Pinniped's `apis/supervisor/oidc` (custom headers, parameters, claims, scopes and
//! the CLI's client ID), and the JSON documents of identity provider discovery
//! (`apis/supervisor/idpdiscovery/v1alpha1`): the `discovery.supervisor.pinniped.dev/v1alpha1`
//! member of a FederationDomain's OpenID configuration, and the list its endpoint returns.

use serde::{Deserialize, Deserializer, Serialize};

// ---- constants ----------------------------------------------------------------------------------

/// The header carrying the username to the authorize endpoint in the password (CLI) flows.
pub const AUTHORIZE_USERNAME_HEADER_NAME: &str = "Pinniped-Username";
/// The header carrying the password to the authorize endpoint in the password (CLI) flows.
pub const AUTHORIZE_PASSWORD_HEADER_NAME: &str = "Pinniped-Password";
/// The authorize parameter naming the identity provider (its display name) to log in with.
pub const AUTHORIZE_UPSTREAM_IDP_NAME_PARAM_NAME: &str = "pinniped_idp_name";
/// The authorize parameter giving the type ([`IDPType`]) of the identity provider to log in with.
pub const AUTHORIZE_UPSTREAM_IDP_TYPE_PARAM_NAME: &str = "pinniped_idp_type";

/// The standard issuer claim.
pub const ID_TOKEN_CLAIM_ISSUER: &str = "iss";
/// The standard subject claim.
pub const ID_TOKEN_CLAIM_SUBJECT: &str = "sub";
/// The query parameter of the Supervisor's "sub" values that names the identity provider the user
/// logged in with.
pub const ID_TOKEN_SUB_CLAIM_IDP_NAME_QUERY_PARAM: &str = "idpName";
/// The standard authorized-party claim.
pub const ID_TOKEN_CLAIM_AUTHORIZED_PARTY: &str = "azp";
/// The downstream ID token claim with the user's (transformed) username.
pub const ID_TOKEN_CLAIM_USERNAME: &str = "username";
/// The downstream ID token claim with the user's (transformed) groups.
pub const ID_TOKEN_CLAIM_GROUPS: &str = "groups";
/// The downstream ID token claim holding the claims copied by an OIDCIdentityProvider's
/// `claims.additionalClaimMappings`, when there are any.
pub const ID_TOKEN_CLAIM_ADDITIONAL_CLAIMS: &str = "additionalClaims";

/// The authorization code grant type.
pub const GRANT_TYPE_AUTHORIZATION_CODE: &str = "authorization_code";
/// The refresh token grant type.
pub const GRANT_TYPE_REFRESH_TOKEN: &str = "refresh_token";
/// The RFC 8693 token exchange grant type.
pub const GRANT_TYPE_TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// The standard openid scope.
pub const SCOPE_OPENID: &str = "openid";
/// The standard scope asking for a refresh token.
pub const SCOPE_OFFLINE_ACCESS: &str = "offline_access";
/// The standard email scope.
pub const SCOPE_EMAIL: &str = "email";
/// The standard profile scope.
pub const SCOPE_PROFILE: &str = "profile";
/// The scope asking for the username claim in ID tokens.
pub const SCOPE_USERNAME: &str = "username";
/// The scope asking for the groups claim in ID tokens.
pub const SCOPE_GROUPS: &str = "groups";
/// The scope allowing token exchange for another audience.
pub const SCOPE_REQUEST_AUDIENCE: &str = "pinniped:request-audience";

/// The client ID of the built-in public client the `pinniped` CLI uses.
pub const CLIENT_ID_PINNIPED_CLI: &str = "pinniped-cli";
/// What the name (client ID) of every OIDCClient starts with.
pub const CLIENT_ID_REQUIRED_OIDC_CLIENT_PREFIX: &str = "client.oauth.pinniped.dev-";

/// The member of a FederationDomain's OpenID configuration that points to its identity provider
/// discovery endpoint ([`OIDCDiscoveryResponse`]).
pub const SUPERVISOR_DISCOVERY_MEMBER: &str = "discovery.supervisor.pinniped.dev/v1alpha1";

// ---- identity provider discovery ----------------------------------------------------------------

/// The kind of an identity provider, as discovery reports it and `pinniped_idp_type` selects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IDPType {
    /// An OIDCIdentityProvider.
    OIDC,
    /// An LDAPIdentityProvider.
    LDAP,
    /// An ActiveDirectoryIdentityProvider.
    ActiveDirectory,
    /// A GitHubIdentityProvider.
    GitHub,
    /// A SAMLIdentityProvider (Selkie's; the pinniped CLI does not know the type, so it cannot
    /// select one by type).
    SAML,
}

impl IDPType {
    /// Every type, in the order Pinniped lists them as supported (alphabetical), Selkie's `saml`
    /// last.
    pub const ALL: [IDPType; 5] = [
        IDPType::ActiveDirectory,
        IDPType::GitHub,
        IDPType::LDAP,
        IDPType::OIDC,
        IDPType::SAML,
    ];

    /// The wire name (`oidc`, `ldap`, `activedirectory`, `github`, `saml`).
    pub fn as_str(self) -> &'static str {
        match self {
            IDPType::OIDC => "oidc",
            IDPType::LDAP => "ldap",
            IDPType::ActiveDirectory => "activedirectory",
            IDPType::GitHub => "github",
            IDPType::SAML => "saml",
        }
    }
}

impl std::fmt::Display for IDPType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A way a client can log in with an identity provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IDPFlow {
    /// The CLI sends the username and password in headers ([`AUTHORIZE_USERNAME_HEADER_NAME`],
    /// [`AUTHORIZE_PASSWORD_HEADER_NAME`]); no browser.
    CliPassword,
    /// The authorization code flow in a browser.
    BrowserAuthcode,
    /// The device authorization grant (RFC 8628): the CLI shows a code and polls while the user
    /// logs in with a browser on any device (Selkie's; listed last, and only by FederationDomains
    /// that enable it, so the pinniped CLI never picks it by itself).
    Device,
}

impl IDPFlow {
    /// The wire name (`cli_password`, `browser_authcode`, `device`).
    pub fn as_str(self) -> &'static str {
        match self {
            IDPFlow::CliPassword => "cli_password",
            IDPFlow::BrowserAuthcode => "browser_authcode",
            IDPFlow::Device => "device",
        }
    }
}

impl std::fmt::Display for IDPFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The Supervisor's member of a FederationDomain's OpenID configuration (the standard members are
/// not modelled here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OIDCDiscoveryResponse {
    /// Where to discover the FederationDomain's identity providers.
    #[serde(rename = "discovery.supervisor.pinniped.dev/v1alpha1")]
    pub supervisor_discovery: OIDCDiscoveryResponseIDPEndpoint,
}

/// The location of the identity provider discovery endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OIDCDiscoveryResponseIDPEndpoint {
    /// The endpoint's URL (`<issuer>/v1alpha1/pinniped_identity_providers`).
    #[serde(rename = "pinniped_identity_providers_endpoint", default)]
    pub pinniped_idps_endpoint: String,
}

/// What a FederationDomain's identity provider discovery endpoint returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IDPDiscoveryResponse {
    /// The identity providers of the FederationDomain, sorted by name.
    #[serde(
        rename = "pinniped_identity_providers",
        default,
        deserialize_with = "null_as_empty"
    )]
    pub pinniped_idps: Vec<PinnipedIDP>,

    /// Every identity provider type this Supervisor supports.
    #[serde(
        rename = "pinniped_supported_identity_provider_types",
        default,
        deserialize_with = "null_as_empty"
    )]
    pub pinniped_supported_idp_types: Vec<PinnipedSupportedIDPType>,
}

/// One identity provider as discovery lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnipedIDP {
    /// The provider's display name in the FederationDomain (what `pinniped_idp_name` selects).
    pub name: String,

    /// The provider's type.
    #[serde(rename = "type")]
    pub r#type: IDPType,

    /// The login flows it supports, in order of preference.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub flows: Vec<IDPFlow>,

    /// How long sessions through it last (Selkie's extension: Pinniped's Supervisor leaves it
    /// out, and its CLI ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<IDPSessions>,
}

/// The session terms of one identity provider as discovery lists them, durations written as Go
/// writes them (`9h`, `1h30m`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IDPSessions {
    /// How long a session lasts from its login.
    pub max_lifetime: String,
    /// How long a session may go without a refresh; absent: no idle limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
}

/// One supported identity provider type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PinnipedSupportedIDPType {
    /// The type.
    #[serde(rename = "type")]
    pub r#type: IDPType,
}

/// A list that Go may have written as `null`.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    // Shaped like what Pinniped's Supervisor answers (discovery_handler.go, idp_discovery_handler.go).
    #[test]
    fn discovery_documents_read_and_write_pinnipeds_json() {
        let idps = json!({
            "pinniped_identity_providers": [
                {"name": "my-ad", "type": "activedirectory", "flows": ["cli_password", "browser_authcode"]},
                {"name": "my-github", "type": "github", "flows": ["browser_authcode"]},
                {"name": "my-ldap", "type": "ldap", "flows": ["cli_password", "browser_authcode"]},
                {"name": "my-oidc", "type": "oidc", "flows": ["browser_authcode", "cli_password"]},
            ],
            "pinniped_supported_identity_provider_types": [
                {"type": "activedirectory"}, {"type": "github"}, {"type": "ldap"}, {"type": "oidc"},
                {"type": "saml"},
            ],
        });
        let parsed: IDPDiscoveryResponse = serde_json::from_value(idps.clone()).unwrap();
        assert_eq!(parsed.pinniped_idps[0].r#type, IDPType::ActiveDirectory);
        assert_eq!(
            parsed.pinniped_idps[3].flows,
            [IDPFlow::BrowserAuthcode, IDPFlow::CliPassword]
        );
        assert_eq!(
            parsed
                .pinniped_supported_idp_types
                .iter()
                .map(|t| t.r#type)
                .collect::<Vec<_>>(),
            IDPType::ALL
        );
        assert_eq!(serde_json::to_value(&parsed).unwrap(), idps);

        let oidc = json!({"discovery.supervisor.pinniped.dev/v1alpha1": {
            "pinniped_identity_providers_endpoint": "https://sso.example.com/v1alpha1/pinniped_identity_providers"
        }});
        let parsed: OIDCDiscoveryResponse = serde_json::from_value(oidc.clone()).unwrap();
        assert_eq!(
            parsed.supervisor_discovery.pinniped_idps_endpoint,
            "https://sso.example.com/v1alpha1/pinniped_identity_providers"
        );
        assert_eq!(serde_json::to_value(&parsed).unwrap(), oidc);
        assert!(serde_json::to_value(&parsed)
            .unwrap()
            .get(SUPERVISOR_DISCOVERY_MEMBER)
            .is_some());
    }

    #[test]
    fn absent_or_null_lists_read_as_empty_and_flows_are_omitted_when_empty() {
        let parsed: IDPDiscoveryResponse = serde_json::from_value(json!({
            "pinniped_identity_providers": [{"name": "x", "type": "oidc", "flows": null}],
            "pinniped_supported_identity_provider_types": null,
        }))
        .unwrap();
        assert!(parsed.pinniped_idps[0].flows.is_empty());
        assert!(parsed.pinniped_supported_idp_types.is_empty());
        assert_eq!(
            serde_json::to_value(&parsed).unwrap(),
            json!({
                "pinniped_identity_providers": [{"name": "x", "type": "oidc"}],
                "pinniped_supported_identity_provider_types": [],
            })
        );
        assert_eq!(
            serde_json::from_value::<IDPDiscoveryResponse>(json!({})).unwrap(),
            IDPDiscoveryResponse::default()
        );
    }

    #[test]
    fn wire_names_are_pinnipeds() {
        for t in IDPType::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), json!(t.as_str()));
            assert_eq!(t.to_string(), t.as_str());
        }
        assert_eq!(
            IDPType::ALL.map(IDPType::as_str),
            ["activedirectory", "github", "ldap", "oidc", "saml"]
        );
        for f in [IDPFlow::CliPassword, IDPFlow::BrowserAuthcode] {
            assert_eq!(serde_json::to_value(f).unwrap(), json!(f.as_str()));
        }
        assert_eq!(IDPFlow::CliPassword.to_string(), "cli_password");
        assert_eq!(IDPFlow::BrowserAuthcode.to_string(), "browser_authcode");
        assert!(serde_json::from_value::<IDPType>(json!("cas")).is_err());
        assert!(serde_json::from_value::<IDPFlow>(json!("device_code")).is_err());
    }
}
