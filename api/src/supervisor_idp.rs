//! `idp.supervisor.pinniped.dev/v1alpha1`: the upstream identity providers the Supervisor
//! authenticates users with, namespaced CRDs in the Supervisor's namespace:
//! [`OIDCIdentityProvider`], [`LDAPIdentityProvider`], [`ActiveDirectoryIdentityProvider`] and
//! [`GitHubIdentityProvider`]. A FederationDomain offers them under display names (its
//! `spec.identityProviders[].objectRef`).
//!
//! Field names, JSON shapes, defaults and validation (CEL rules included) are Pinniped's, so
//! Pinniped's manifests apply unchanged; the Rust type names follow Pinniped's Go type names.
//! Strings Pinniped declares `omitempty` (or optional pointers) are `Option<String>` here, lists
//! and maps are empty when absent. Fields the apiserver defaults (GitHub's `githubAPI.host`,
//! `claims.*`, `allowAuthentication.organizations.policy`) stay `Option`s: a value read back from
//! the apiserver always has them, a value built in Rust need not.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::common::{
    CertificateAuthorityDataSourceKind, CertificateAuthorityDataSourceSpec, Phase, TLSSpec,
};

/// The API group (before any `apiGroupSuffix` replacement, see [`crate::group_suffix`]).
pub const GROUP: &str = "idp.supervisor.pinniped.dev";
/// The one version of the group.
pub const VERSION: &str = "v1alpha1";

/// The host GitHubIdentityProvider's `spec.githubAPI.host` defaults to.
pub const DEFAULT_GITHUB_HOST: &str = "github.com";
/// The first CEL rule on GitHubIdentityProvider's `spec.allowAuthentication.organizations`: no
/// allowed organizations with the AllGitHubUsers policy.
pub const GITHUB_ORGANIZATIONS_RULE_ALLOWED_NEEDS_POLICY: &str =
    "!(has(self.allowed) && size(self.allowed) > 0 && self.policy == 'AllGitHubUsers')";
/// The message of [`GITHUB_ORGANIZATIONS_RULE_ALLOWED_NEEDS_POLICY`].
pub const GITHUB_ORGANIZATIONS_MESSAGE_ALLOWED_NEEDS_POLICY: &str =
    "spec.allowAuthentication.organizations.policy must be 'OnlyUsersFromAllowedOrganizations' when \
     spec.allowAuthentication.organizations.allowed has organizations listed";
/// The second CEL rule on GitHubIdentityProvider's `spec.allowAuthentication.organizations`: the
/// OnlyUsersFromAllowedOrganizations policy (the default) needs allowed organizations.
pub const GITHUB_ORGANIZATIONS_RULE_POLICY_NEEDS_ALLOWED: &str =
    "!((!has(self.allowed) || size(self.allowed) == 0) && self.policy == 'OnlyUsersFromAllowedOrganizations')";
/// The message of [`GITHUB_ORGANIZATIONS_RULE_POLICY_NEEDS_ALLOWED`].
pub const GITHUB_ORGANIZATIONS_MESSAGE_POLICY_NEEDS_ALLOWED: &str =
    "spec.allowAuthentication.organizations.policy must be 'AllGitHubUsers' when \
     spec.allowAuthentication.organizations.allowed is empty";

// ---- OIDCIdentityProvider -----------------------------------------------------------------------

/// An upstream OpenID Connect provider.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "idp.supervisor.pinniped.dev",
    version = "v1alpha1",
    kind = "OIDCIdentityProvider",
    plural = "oidcidentityproviders",
    singular = "oidcidentityprovider",
    namespaced,
    category = "pinniped",
    category = "pinniped-idp",
    category = "pinniped-idps",
    status = "OIDCIdentityProviderStatus",
    derive = "PartialEq",
    doc = "OIDCIdentityProvider configures an upstream OpenID Connect provider the Supervisor \
           sends users to for login.",
    printcolumn(name = "Issuer", type_ = "string", json_path = ".spec.issuer"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct OIDCIdentityProviderSpec {
    /// The provider's issuer URL (https only); its /.well-known/openid-configuration is fetched
    /// for the endpoints and keys.
    #[schemars(length(min = 1), pattern(r"^https://"))]
    pub issuer: String,

    /// How to trust the provider's TLS certificate; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,

    /// What the Supervisor asks of the provider when it sends a user there.
    #[serde(default, skip_serializing_if = "OIDCAuthorizationConfig::is_empty")]
    pub authorization_config: OIDCAuthorizationConfig,

    /// Which claims of the provider's ID token give the username, the groups and extra claims.
    #[serde(default, skip_serializing_if = "OIDCClaims::is_empty")]
    pub claims: OIDCClaims,

    /// The Supervisor's client registration with the provider.
    pub client: OIDCClient,
}

/// The authorization request the Supervisor makes of an upstream OIDC provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OIDCAuthorizationConfig {
    /// The scopes to request, in the authorization code flow and in the password grant; openid
    /// is requested whatever this says. When absent: openid, offline_access, email and profile.
    /// Setting it replaces that default, so list offline_access (or whatever the provider needs to
    /// return refresh tokens, which the Supervisor requires) and the scopes of the claims you use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_scopes: Vec<String>,

    /// Extra query parameters for the provider's authorize endpoint in the authorization code
    /// flow (for example a prompt value some providers need before they issue refresh tokens),
    /// unique by name. Not allowed: the parameters the Supervisor sends itself (response_type,
    /// scope, client_id, state, nonce, code_challenge, code_challenge_method, redirect_uri) and
    /// hd.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
    ))]
    pub additional_authorize_parameters: Vec<Parameter>,

    /// Whether the CLI may also log in without a browser: the user's username and password go
    /// through the Supervisor to the provider in an OAuth 2.0 resource owner password credentials
    /// grant, which the provider must support. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_password_grant: bool,
}

impl OIDCAuthorizationConfig {
    /// Whether everything takes its default.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One extra authorize parameter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Parameter {
    /// The parameter's name.
    #[schemars(length(min = 1))]
    pub name: String,

    /// The parameter's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// How an upstream OIDC provider's claims become the user's identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OIDCClaims {
    /// The claim (of the ID token or the userinfo response) with the user's groups; no groups
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<String>,

    /// The claim (of the ID token or the userinfo response) with the username. When absent, the
    /// username is a unique string made of the provider's issuer URL and the "sub" claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,

    /// Upstream claims copied into the Supervisor's ID tokens (for every client) inside their
    /// "additionalClaims" claim: each key is the name there, each value the upstream claim's
    /// name. Upstream claims that are missing are left out, and so is "additionalClaims" when
    /// nothing is left.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_claim_mappings: BTreeMap<String, String>,
}

impl OIDCClaims {
    /// Whether every claim takes its default.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The Supervisor's OAuth client at an upstream OIDC provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OIDCClient {
    /// A Secret of type secrets.pinniped.dev/oidc-client in this namespace, with the keys
    /// clientID and clientSecret.
    pub secret_name: String,
}

/// The observed state of an OIDCIdentityProvider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OIDCIdentityProviderStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The provider's conditions (Ready, ClientCredentialsSecretValid, OIDCDiscoverySucceeded,
    /// AdditionalAuthorizeParametersValid, TLSConfigurationValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

// ---- LDAPIdentityProvider -----------------------------------------------------------------------

/// An upstream LDAP directory.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "idp.supervisor.pinniped.dev",
    version = "v1alpha1",
    kind = "LDAPIdentityProvider",
    plural = "ldapidentityproviders",
    singular = "ldapidentityprovider",
    namespaced,
    category = "pinniped",
    category = "pinniped-idp",
    category = "pinniped-idps",
    status = "LDAPIdentityProviderStatus",
    derive = "PartialEq",
    doc = "LDAPIdentityProvider configures an upstream LDAP directory the Supervisor checks \
           usernames and passwords against.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.host"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderSpec {
    /// The server as host or host:port, such as ldap.example.com:636. TLS is tried first, then
    /// StartTLS.
    #[schemars(length(min = 1))]
    pub host: String,

    /// How to trust the server's TLS certificate; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,

    /// The account the Supervisor binds as to search the directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<LDAPIdentityProviderBind>,

    /// How a user entry is found from the username typed at login.
    #[serde(default, skip_serializing_if = "LDAPIdentityProviderUserSearch::is_empty")]
    pub user_search: LDAPIdentityProviderUserSearch,

    /// How the user's groups are found; no groups when no base is set.
    #[serde(default, skip_serializing_if = "LDAPIdentityProviderGroupSearch::is_empty")]
    pub group_search: LDAPIdentityProviderGroupSearch,
}

/// The LDAP service account.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderBind {
    /// A Secret of type kubernetes.io/basic-auth in this namespace: username is the bind DN
    /// (such as cn=bind-account,ou=users,dc=example,dc=com), password must not be empty.
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// The LDAP user search.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderUserSearch {
    /// The DN to search under, such as ou=users,dc=example,dc=com.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub base: Option<String>,

    /// The search filter, where every "{}" stands for the username (such as "mail={}" or
    /// "&(objectClass=person)(uid={})"); "dn={}" cannot work, a DN is not an attribute. When
    /// absent, "<username attribute>={}".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,

    /// Which attributes of the user entry give the username and the UID.
    #[serde(
        default,
        skip_serializing_if = "LDAPIdentityProviderUserSearchAttributes::is_empty"
    )]
    pub attributes: LDAPIdentityProviderUserSearchAttributes,
}

impl LDAPIdentityProviderUserSearch {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The attributes of an LDAP user entry that make up the identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderUserSearchAttributes {
    /// The attribute (case-sensitive, as the server returns it) whose value is the username, such
    /// as "uid" or "mail"; "dn" for the entry's DN, which then needs an explicit filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub username: Option<String>,

    /// The attribute (case-sensitive) whose value identifies the user for good, such as
    /// "uidNumber" or "objectGUID"; "dn" for the entry's DN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub uid: Option<String>,
}

impl LDAPIdentityProviderUserSearchAttributes {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The LDAP group search.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderGroupSearch {
    /// The DN to search under, such as ou=groups,dc=example,dc=com; no group search when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,

    /// The search filter, where every "{}" stands for the userAttributeForFilter value of the
    /// user entry (such as "member={}"). When absent, "member={}".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,

    /// The attribute of the user entry that replaces "{}" in the filter (such as "uid" with a
    /// filter "&(objectClass=posixGroup)(memberUid={})"); the entry's DN when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_attribute_for_filter: Option<String>,

    /// Which attribute of each group entry gives the group name.
    #[serde(
        default,
        skip_serializing_if = "LDAPIdentityProviderGroupSearchAttributes::is_empty"
    )]
    pub attributes: LDAPIdentityProviderGroupSearchAttributes,

    /// Keep the groups found at login for the whole session (about a day) instead of searching
    /// again at every refresh. Faster for slow directories, but removals from groups go unnoticed
    /// until the next login. Experimental.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_group_refresh: bool,
}

impl LDAPIdentityProviderGroupSearch {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The attributes of an LDAP group entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderGroupSearchAttributes {
    /// The attribute (case-sensitive) whose value is the group's name, such as "cn"; "dn" for the
    /// group's DN, which is also the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
}

impl LDAPIdentityProviderGroupSearchAttributes {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self.group_name.is_none()
    }
}

/// The observed state of an LDAPIdentityProvider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LDAPIdentityProviderStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The provider's conditions (Ready, BindSecretValid, LDAPConnectionValid,
    /// TLSConfigurationValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

// ---- ActiveDirectoryIdentityProvider ------------------------------------------------------------

/// An upstream Microsoft Active Directory.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "idp.supervisor.pinniped.dev",
    version = "v1alpha1",
    kind = "ActiveDirectoryIdentityProvider",
    plural = "activedirectoryidentityproviders",
    singular = "activedirectoryidentityprovider",
    namespaced,
    category = "pinniped",
    category = "pinniped-idp",
    category = "pinniped-idps",
    status = "ActiveDirectoryIdentityProviderStatus",
    derive = "PartialEq",
    doc = "ActiveDirectoryIdentityProvider configures an upstream Microsoft Active Directory the \
           Supervisor checks usernames and passwords against.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.host"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderSpec {
    /// The domain controller as host or host:port, such as ldap.example.com:636. TLS is tried
    /// first, then StartTLS.
    #[schemars(length(min = 1))]
    pub host: String,

    /// How to trust the server's TLS certificate; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,

    /// The account the Supervisor binds as to search the directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<ActiveDirectoryIdentityProviderBind>,

    /// How a user entry is found from the username typed at login.
    #[serde(
        default,
        skip_serializing_if = "ActiveDirectoryIdentityProviderUserSearch::is_empty"
    )]
    pub user_search: ActiveDirectoryIdentityProviderUserSearch,

    /// How the user's groups are found.
    #[serde(
        default,
        skip_serializing_if = "ActiveDirectoryIdentityProviderGroupSearch::is_empty"
    )]
    pub group_search: ActiveDirectoryIdentityProviderGroupSearch,
}

/// The Active Directory service account.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderBind {
    /// A Secret of type kubernetes.io/basic-auth in this namespace: username is the bind
    /// account's DN, password must not be empty.
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// The Active Directory user search.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderUserSearch {
    /// The DN to search under; when absent, the domain's defaultNamingContext (from the RootDSE),
    /// that is the whole domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,

    /// The search filter, where every "{}" stands for the username. When absent, a filter for
    /// normal user accounts (people, not computers, not shown in advanced view only, with
    /// sAMAccountType 805306368) whose sAMAccountName, mail or userPrincipalName is the username.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,

    /// Which attributes of the user entry give the username and the UID.
    #[serde(
        default,
        skip_serializing_if = "ActiveDirectoryIdentityProviderUserSearchAttributes::is_empty"
    )]
    pub attributes: ActiveDirectoryIdentityProviderUserSearchAttributes,
}

impl ActiveDirectoryIdentityProviderUserSearch {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The attributes of an Active Directory user entry that make up the identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderUserSearchAttributes {
    /// The attribute whose value is the username; userPrincipalName when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,

    /// The attribute whose value identifies the user for good; objectGUID when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl ActiveDirectoryIdentityProviderUserSearchAttributes {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The Active Directory group search.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderGroupSearch {
    /// The DN to search under; when absent, the domain's defaultNamingContext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,

    /// The search filter, where every "{}" stands for the userAttributeForFilter value of the
    /// user entry. When absent, groups that have the user as a member directly or through nested
    /// groups ("(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={}))"), which some servers
    /// answer slowly; "(&(objectClass=group)(member={}))" searches direct membership only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,

    /// The attribute of the user entry that replaces "{}" in the filter; the entry's DN when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_attribute_for_filter: Option<String>,

    /// Which attribute of each group entry gives the group name.
    #[serde(
        default,
        skip_serializing_if = "ActiveDirectoryIdentityProviderGroupSearchAttributes::is_empty"
    )]
    pub attributes: ActiveDirectoryIdentityProviderGroupSearchAttributes,

    /// Keep the groups found at login for the whole session (about a day) instead of searching
    /// again at every refresh. Faster for slow directories, but removals from groups go unnoticed
    /// until the next login. Experimental.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_group_refresh: bool,
}

impl ActiveDirectoryIdentityProviderGroupSearch {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The attributes of an Active Directory group entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderGroupSearchAttributes {
    /// The attribute whose value is the group's name ("dn" for the group's DN). When absent,
    /// "<sAMAccountName>@<domain>", the domain taken from the group DN's domain components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
}

impl ActiveDirectoryIdentityProviderGroupSearchAttributes {
    /// Whether nothing is configured.
    pub fn is_empty(&self) -> bool {
        self.group_name.is_none()
    }
}

/// The observed state of an ActiveDirectoryIdentityProvider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveDirectoryIdentityProviderStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The provider's conditions (Ready, BindSecretValid, LDAPConnectionValid, SearchBaseFound,
    /// TLSConfigurationValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

// ---- GitHubIdentityProvider ---------------------------------------------------------------------

/// GitHub (github.com or GitHub Enterprise Server) as an upstream identity provider.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "idp.supervisor.pinniped.dev",
    version = "v1alpha1",
    kind = "GitHubIdentityProvider",
    plural = "githubidentityproviders",
    singular = "githubidentityprovider",
    namespaced,
    category = "pinniped",
    category = "pinniped-idp",
    category = "pinniped-idps",
    status = "GitHubIdentityProviderStatus",
    derive = "PartialEq",
    doc = "GitHubIdentityProvider configures GitHub, or a GitHub Enterprise Server, as an \
           upstream identity provider users log in with in a browser.",
    printcolumn(name = "Host", type_ = "string", json_path = ".spec.githubAPI.host"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct GitHubIdentityProviderSpec {
    /// Where GitHub's API is; github.com when absent.
    #[serde(default, rename = "githubAPI")]
    pub github_api: GitHubAPIConfig,

    /// Which GitHub attributes give the username and the group names.
    #[serde(default)]
    pub claims: GitHubClaims,

    /// Which GitHub users may log in.
    pub allow_authentication: GitHubAllowAuthenticationSpec,

    /// The Supervisor's OAuth App or GitHub App.
    pub client: GitHubClientSpec,
}

/// The location of GitHub's API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubAPIConfig {
    /// github.com (the default; api.github.com means the same), or a GitHub Enterprise Server's
    /// host name or IP address with an optional port ("[::1]:443" for IPv6 with a port). No
    /// scheme (always https), path, query or user info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), extend("default" = DEFAULT_GITHUB_HOST))]
    pub host: Option<String>,

    /// How to trust the API's TLS certificate; the system roots when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TLSSpec>,
}

/// How a GitHub user becomes an identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubClaims {
    /// What the username is made of (see [`GitHubUsernameAttribute`], whose doc is the CRD's
    /// description of this field); login:id when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "login:id"))]
    pub username: Option<GitHubUsernameAttribute>,

    /// What the group names are made of (see [`GitHubGroupNameAttribute`], whose doc is the CRD's
    /// description of this field); slug when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "slug"))]
    pub groups: Option<GitHubGroupNameAttribute>,
}

// kube's schema of an optional enum field takes the enum's doc as its description, so the docs of
// GitHubUsernameAttribute, GitHubGroupNameAttribute and GitHubAllowedAuthOrganizationsPolicy are
// written as the CRD's descriptions of the fields that use them.

/// What a GitHub user's username is made of: "id" (the numeric user ID, which never changes),
/// "login" (the login name, which its owner may change and another user may then take, so it is
/// not safe alone for authorization), or "login:id" (the default: the login name, a colon and the
/// numeric ID; neither contains a colon).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum GitHubUsernameAttribute {
    /// The numeric user ID.
    #[serde(rename = "id")]
    ID,
    /// The login name.
    #[serde(rename = "login")]
    Login,
    /// The login name, a colon, and the numeric user ID.
    #[serde(rename = "login:id")]
    LoginAndID,
}

/// What the user's group names are made of: the team's "name" (any characters, such as
/// "Kube admins!") or its "slug" (the default: lowercase letters, digits, '-' and '_', such as
/// "kube-admins"), always prefixed with the organization's login and a slash ("my-org/my-team").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum GitHubGroupNameAttribute {
    /// The team's name.
    #[serde(rename = "name")]
    Name,
    /// The team's slug.
    #[serde(rename = "slug")]
    Slug,
}

/// Who may log in with a GitHubIdentityProvider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubAllowAuthenticationSpec {
    /// Membership in GitHub organizations. Allowed organizations need the
    /// OnlyUsersFromAllowedOrganizations policy, and that policy needs allowed organizations.
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "message": GITHUB_ORGANIZATIONS_MESSAGE_ALLOWED_NEEDS_POLICY,
            "rule": GITHUB_ORGANIZATIONS_RULE_ALLOWED_NEEDS_POLICY,
        },
        {
            "message": GITHUB_ORGANIZATIONS_MESSAGE_POLICY_NEEDS_ALLOWED,
            "rule": GITHUB_ORGANIZATIONS_RULE_POLICY_NEEDS_ALLOWED,
        },
    ]))]
    pub organizations: GitHubOrganizationsSpec,
}

/// The GitHub organizations whose members may log in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubOrganizationsSpec {
    /// Who may log in (see [`GitHubAllowedAuthOrganizationsPolicy`], whose doc is the CRD's
    /// description of this field); OnlyUsersFromAllowedOrganizations when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "OnlyUsersFromAllowedOrganizations"))]
    pub policy: Option<GitHubAllowedAuthOrganizationsPolicy>,

    /// The logins of the allowed organizations: only their members may log in, and only their
    /// teams become groups. The GitHub App or OAuth App must be able to see membership in them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "set"))]
    pub allowed: Vec<String>,
}

/// Who may log in: OnlyUsersFromAllowedOrganizations (the default), only members of the allowed
/// organizations; AllGitHubUsers, every GitHub user, which must be chosen explicitly when no
/// organizations are allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum GitHubAllowedAuthOrganizationsPolicy {
    /// Members of the allowed organizations only.
    OnlyUsersFromAllowedOrganizations,
    /// Every GitHub user.
    AllGitHubUsers,
}

/// The Supervisor's GitHub application.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubClientSpec {
    /// A Secret of type secrets.pinniped.dev/github-client in this namespace, with the keys
    /// clientID and clientSecret of a GitHub OAuth App or GitHub App.
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// The observed state of a GitHubIdentityProvider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubIdentityProviderStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The provider's conditions (Ready, HostValid, TLSConfigurationValid,
    /// OrganizationsPolicyValid, ClientCredentialsSecretValid, GitHubConnectionValid,
    /// ClaimsValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests;
