//! `config.supervisor.pinniped.dev/v1alpha1`: the Supervisor's own configuration, namespaced CRDs
//! in the Supervisor's namespace. A [`FederationDomain`] is one OIDC issuer the Supervisor serves
//! and the identity providers it offers; an [`OIDCClient`] is a dynamically registered downstream
//! OAuth client of every FederationDomain in its namespace.
//!
//! Field names, JSON shapes, defaults and validation (CEL rules included) are Pinniped's, so
//! Pinniped's manifests apply unchanged; the Rust type names follow Pinniped's Go type names.
//! Strings Pinniped declares `omitempty` are `Option<String>` here, lists are empty when absent.

use k8s_openapi::{
    api::core::v1::{LocalObjectReference, TypedLocalObjectReference},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::common::Phase;

/// The API group (before any `apiGroupSuffix` replacement, see [`crate::group_suffix`]).
pub const GROUP: &str = "config.supervisor.pinniped.dev";
/// The one version of the group.
pub const VERSION: &str = "v1alpha1";
/// What every OIDCClient's `metadata.name` (its OAuth client ID) starts with; the CRD refuses
/// other names.
pub const OIDC_CLIENT_NAME_PREFIX: &str = crate::supervisor_oidc::CLIENT_ID_REQUIRED_OIDC_CLIENT_PREFIX;
/// The pattern Pinniped's install adds to the OIDCClient CRD's `metadata.name` (see
/// [`OIDC_CLIENT_NAME_PREFIX`]).
pub const OIDC_CLIENT_NAME_PATTERN: &str = r"^client\.oauth\.pinniped\.dev-";
/// The pattern every `spec.allowedRedirectURIs` entry must match: any https URL, or an http URL on
/// the IPv4 or IPv6 loopback address (any port).
pub const REDIRECT_URI_PATTERN: &str = r"^https://.+|^http://(127\.0\.0\.1|\[::1\])(:\d+)?/";
/// The CEL rule on `spec.issuer`.
pub const ISSUER_RULE: &str = "isURL(self) && url(self).getScheme() == 'https'";
/// The message kube-apiserver gives when [`ISSUER_RULE`] fails.
pub const ISSUER_RULE_MESSAGE: &str = "issuer must be an HTTPS URL";

// ---- FederationDomain ---------------------------------------------------------------------------

/// One OIDC issuer served by the Supervisor, with the identity providers its users log in with.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "config.supervisor.pinniped.dev",
    version = "v1alpha1",
    kind = "FederationDomain",
    plural = "federationdomains",
    singular = "federationdomain",
    namespaced,
    category = "pinniped",
    status = "FederationDomainStatus",
    derive = "PartialEq",
    doc = "FederationDomain configures one OIDC issuer served by the Supervisor and the identity \
           providers available through it.",
    printcolumn(name = "Issuer", type_ = "string", json_path = ".spec.issuer"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainSpec {
    /// The issuer URL (https only): the "iss" of every token this FederationDomain issues, the
    /// value its discovery document advertises, and the prefix of all of its endpoints. Several
    /// FederationDomains may share a host with different paths, or use different hosts.
    #[schemars(
        length(min = 1),
        extend("x-kubernetes-validations" = [{"message": ISSUER_RULE_MESSAGE, "rule": ISSUER_RULE}])
    )]
    pub issuer: String,

    /// The serving certificate for this issuer's hostname; the Supervisor's default certificate
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<FederationDomainTLSSpec>,

    /// The identity providers users of this FederationDomain can log in with, each under a display
    /// name and with optional transformations and policies. When empty, the FederationDomain uses
    /// the only identity provider of its namespace under that resource's name, and refuses every
    /// login while there is more than one (a mode kept for upgrades from older releases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identity_providers: Vec<FederationDomainIdentityProvider>,

    /// How long the sessions of logins through this FederationDomain last (Selkie's extension;
    /// when absent, as Pinniped's: 9 hours from the login, no idle limit). An identity provider's
    /// own `sessions` overrides these field by field. The terms a login starts with are kept for
    /// its whole session: a later change applies to later logins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Checked here by kube-apiserver; an identity provider's terms (whose rule would cost more
    // than kube-apiserver allows in a list without maxItems) and the two levels together are
    // checked by the reconciler (condition SessionsValid).
    #[schemars(extend("x-kubernetes-validations" = [{
        "message": "idleTimeout must not be longer than maxLifetime",
        "rule": "!has(self.idleTimeout) || !has(self.maxLifetime) || duration(self.idleTimeout) <= duration(self.maxLifetime)"
    }]))]
    pub sessions: Option<FederationDomainSessions>,

    /// The device authorization grant (RFC 8628) for the CLI (`selkie login oidc --flow device`):
    /// a login begun where no browser can be opened (an SSH jump host, a container) and finished
    /// in a browser on any device. Selkie's extension; off when absent, as in Pinniped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_authorization: Option<FederationDomainDeviceAuthorization>,

    /// Sender-constrained sessions (DPoP, RFC 9449): a login binds its session to a key the
    /// client holds, so that its refresh token and access token are of no use to anyone who
    /// copies them without that key. Selkie's extension; off when absent, as in Pinniped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpop: Option<FederationDomainDPoP>,
}

/// The device authorization grant of a FederationDomain (Selkie's extension).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainDeviceAuthorization {
    /// Whether the FederationDomain offers the grant: its discovery document then names the
    /// `device_authorization_endpoint`, its identity providers list the `device` flow, and its
    /// `device` page takes user codes. A user code must be entered only by someone who reads it
    /// off their own device (a code sent by someone else logs the sender in as the user who
    /// enters it): leave this off where users cannot be told so.
    #[serde(default)]
    pub enabled: bool,
}

/// DPoP (RFC 9449) of a FederationDomain (Selkie's extension).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainDPoP {
    /// Whether sessions are bound to a key of the client (its discovery document then lists
    /// `dpop_signing_alg_values_supported`). When on, every login of the public `pinniped-cli`
    /// client must carry a DPoP proof (the selkie CLI sends one), and its session is bound to
    /// the thumbprint of the proof's key; an OIDCClient's login is bound when it carries one.
    /// Every refresh and token exchange of a bound session then needs a fresh proof by that
    /// key, for the session's whole life (also after this is turned off). The pinniped CLI
    /// sends no proofs, so its logins are refused while this is on, and sessions it began
    /// before must log in again.
    #[serde(default)]
    pub enabled: bool,
}

/// The schema pattern of a duration as Go writes one without a sign (`9h`, `1h30m`, `90s`); its
/// range is a CEL rule of each field.
pub const GO_DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$";

/// How long a Supervisor session lasts (Selkie's extension to FederationDomain). Durations are
/// written as Go and Kubernetes write them (`9h`, `90m`, `168h`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainSessions {
    /// The longest a session lasts from its login; refreshes never extend it. From 5m to 720h
    /// (30 days); 9h when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        pattern(GO_DURATION_PATTERN),
        extend("x-kubernetes-validations" = [{
            "message": "maxLifetime must be from 5m to 720h",
            "rule": "duration(self) >= duration('5m') && duration(self) <= duration('720h')"
        }])
    )]
    pub max_lifetime: Option<String>,

    /// How long a session may go without a refresh before it ends (its refresh token expires
    /// that long after it was issued). From 1m up to the session's maximum lifetime; no idle
    /// limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        pattern(GO_DURATION_PATTERN),
        extend("x-kubernetes-validations" = [{
            "message": "idleTimeout must be from 1m to 720h",
            "rule": "duration(self) >= duration('1m') && duration(self) <= duration('720h')"
        }])
    )]
    pub idle_timeout: Option<String>,
}

/// The serving certificate of a FederationDomain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainTLSSpec {
    /// A Secret of type kubernetes.io/tls (keys tls.crt and tls.key) in this namespace, served by
    /// SNI for the issuer's hostname. Issuers that share a hostname must name the same Secret.
    /// Ignored when the issuer's host is an IP address, since SNI carries only names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
}

/// One identity provider as a FederationDomain offers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainIdentityProvider {
    /// The name clients see and kubeconfigs record; renaming a provider in use breaks those
    /// kubeconfigs.
    #[schemars(length(min = 1))]
    pub display_name: String,

    /// The identity provider resource (OIDCIdentityProvider, LDAPIdentityProvider,
    /// ActiveDirectoryIdentityProvider or GitHubIdentityProvider of the
    /// idp.supervisor.pinniped.dev group) in this namespace. While it cannot be found, the
    /// provider is not offered.
    #[schemars(schema_with = "crate::schema::typed_local_object_reference")]
    pub object_ref: TypedLocalObjectReference,

    /// How the provider's username and groups are rewritten, and which users are refused, at
    /// every login and every session refresh.
    #[serde(default, skip_serializing_if = "FederationDomainTransforms::is_empty")]
    pub transforms: FederationDomainTransforms,

    /// How long sessions through this identity provider last, overriding the FederationDomain's
    /// `spec.sessions` field by field (Selkie's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<FederationDomainSessions>,
}

/// Constants, CEL expressions and self-tests that transform an identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainTransforms {
    /// Named values the expressions can use (`strConst.<name>` or `strListConst.<name>`); names
    /// are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
    ))]
    pub constants: Vec<FederationDomainTransformsConstant>,

    /// CEL expressions (with the CEL string extensions) run in order over the variables
    /// `username`, `groups`, `strConst` and `strListConst`. A policy/v1 expression returns a
    /// boolean and false refuses the login; a username/v1 expression returns the new username; a
    /// groups/v1 expression returns the new list of groups. Each expression sees the result of
    /// the ones before it. An expression that does not compile puts the FederationDomain in
    /// error; one that fails at runtime fails the login.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expressions: Vec<FederationDomainTransformsExpression>,

    /// Sample identities and what the expressions must make of them. They are checked whenever
    /// the FederationDomain is reconciled; while one fails, the provider is not offered and the
    /// failure is reported in the status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<FederationDomainTransformsExample>,
}

impl FederationDomainTransforms {
    /// Whether there are no constants, expressions or examples (the identity passes unchanged).
    pub fn is_empty(&self) -> bool {
        self.constants.is_empty() && self.expressions.is_empty() && self.examples.is_empty()
    }
}

/// A named value the transform expressions can use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainTransformsConstant {
    /// The variable name: a letter, then letters, digits or underscores.
    #[schemars(length(min = 1, max = 64), pattern(r"^[a-zA-Z][_a-zA-Z0-9]*$"))]
    pub name: String,

    /// string (the value is stringValue) or stringList (the value is stringListValue).
    #[serde(rename = "type")]
    pub r#type: ConstantType,

    /// The value when type is string; ignored otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string_value: Option<String>,

    /// The value when type is stringList; ignored otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub string_list_value: Vec<String>,
}

/// The type of a transform constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConstantType {
    /// A string, available as `strConst.<name>`.
    #[serde(rename = "string")]
    String,
    /// A list of strings, available as `strListConst.<name>`.
    #[serde(rename = "stringList")]
    StringList,
}

/// One transform expression.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainTransformsExpression {
    /// What the expression returns and what is done with it.
    #[serde(rename = "type")]
    pub r#type: ExpressionType,

    /// The CEL expression.
    #[schemars(length(min = 1))]
    pub expression: String,

    /// For policy/v1 only: the error shown when the policy refuses a login; a generic message
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The kind of a transform expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ExpressionType {
    /// Returns a boolean; false refuses the login and stops evaluation.
    #[serde(rename = "policy/v1")]
    PolicyV1,
    /// Returns the new username.
    #[serde(rename = "username/v1")]
    UsernameV1,
    /// Returns the new list of groups.
    #[serde(rename = "groups/v1")]
    GroupsV1,
}

/// A sample identity and the expected result of the transforms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainTransformsExample {
    /// The username given to the transforms.
    #[schemars(length(min = 1))]
    pub username: String,

    /// The groups given to the transforms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,

    /// What the transforms must produce.
    pub expects: FederationDomainTransformsExampleExpects,
}

/// The expected outcome of a transform example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainTransformsExampleExpects {
    /// The resulting username.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,

    /// The resulting groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,

    /// Whether a policy must refuse the login (false: no policy may refuse it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rejected: bool,

    /// The expected error: with rejected, the refusing policy's message (empty meaning the
    /// generic refusal message); without it, the message of a failure other than a policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The observed state of a FederationDomain.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The FederationDomain's conditions (Ready, IssuerIsUnique, IssuerURLValid,
    /// OneTLSSecretPerIssuerHostname, IdentityProvidersFound, and the checks of the identity
    /// providers' display names, references and transforms), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// The Secrets the Supervisor generated for this issuer's keys.
    #[serde(default, skip_serializing_if = "FederationDomainSecrets::is_empty")]
    pub secrets: FederationDomainSecrets,
}

/// The generated Secrets that hold a FederationDomain's keys, in its namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationDomainSecrets {
    /// The Secret with the JSON Web Key Set that signs and verifies the issuer's tokens; absent or
    /// empty while there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::local_object_reference")]
    pub jwks: Option<LocalObjectReference>,

    /// The Secret with the key that signs the issuer's opaque tokens (authorization codes,
    /// access and refresh tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::local_object_reference")]
    pub token_signing_key: Option<LocalObjectReference>,

    /// The Secret with the key that signs the state parameter of upstream logins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::local_object_reference")]
    pub state_signing_key: Option<LocalObjectReference>,

    /// The Secret with the key that encrypts the state parameter of upstream logins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::local_object_reference")]
    pub state_encryption_key: Option<LocalObjectReference>,
}

impl FederationDomainSecrets {
    /// Whether no Secret is recorded.
    pub fn is_empty(&self) -> bool {
        self.jwks.is_none()
            && self.token_signing_key.is_none()
            && self.state_signing_key.is_none()
            && self.state_encryption_key.is_none()
    }
}

// ---- OIDCClient ---------------------------------------------------------------------------------

/// A downstream OAuth 2.0 / OIDC client (a web application) allowed to use the FederationDomains
/// of its namespace. Its metadata.name is its client ID and must start with
/// client.oauth.pinniped.dev-; its secrets are managed with OIDCClientSecretRequest.
#[expect(
    clippy::duplicated_attributes,
    reason = "every kube printcolumn(..) repeats its own type_ = \"string\"; they are not duplicates"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "config.supervisor.pinniped.dev",
    version = "v1alpha1",
    kind = "OIDCClient",
    plural = "oidcclients",
    singular = "oidcclient",
    namespaced,
    category = "pinniped",
    status = "OIDCClientStatus",
    derive = "PartialEq",
    doc = "OIDCClient registers a downstream OAuth 2.0 client of the Supervisor; its name, which \
           must start with client.oauth.pinniped.dev-, is the client ID.",
    printcolumn(
        name = "Privileged Scopes",
        type_ = "string",
        json_path = r#".spec.allowedScopes[?(@ == "pinniped:request-audience")]"#
    ),
    printcolumn(
        name = "Client Secrets",
        type_ = "integer",
        json_path = ".status.totalClientSecrets"
    ),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(kube_core = "::kube_core")
)]
#[serde(rename_all = "camelCase")]
pub struct OIDCClientSpec {
    /// The redirect_uri values the client may send; any other is refused. https URLs, or http URLs
    /// on a loopback address (127.0.0.1 or [::1]), whose port may be left out and is ignored when
    /// a redirect_uri is compared with them.
    #[serde(rename = "allowedRedirectURIs")]
    #[schemars(
        length(min = 1),
        inner(pattern(REDIRECT_URI_PATTERN)),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub allowed_redirect_uris: Vec<String>,

    /// The grant_type values the client may use. authorization_code (logins) must always be
    /// listed; refresh_token (extending sessions) goes with the offline_access scope; the
    /// token-exchange grant (RFC 8693, on the way to a cluster credential) goes with the
    /// pinniped:request-audience scope. A grant listed without its scope, or the reverse, is an
    /// error.
    #[schemars(length(min = 1), extend("x-kubernetes-list-type" = "set"))]
    pub allowed_grant_types: Vec<GrantType>,

    /// The scopes the client may request. openid (ID tokens with only the required claims) must
    /// always be listed; offline_access (a refresh token from the authorization code flow) goes
    /// with the refresh_token grant; username and groups let ID tokens carry those claims;
    /// pinniped:request-audience (token exchange for another audience) goes with the
    /// token-exchange grant and needs username and groups listed too.
    #[schemars(length(min = 1), extend("x-kubernetes-list-type" = "set"))]
    pub allowed_scopes: Vec<Scope>,

    /// How long the tokens issued to this client live.
    #[serde(default, skip_serializing_if = "OIDCClientTokenLifetimes::is_empty")]
    pub token_lifetimes: OIDCClientTokenLifetimes,
}

/// An OAuth grant type an OIDCClient may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum GrantType {
    /// The authorization code flow (logins through the browser).
    #[serde(rename = "authorization_code")]
    AuthorizationCode,
    /// Refreshing a session with a refresh token.
    #[serde(rename = "refresh_token")]
    RefreshToken,
    /// RFC 8693 token exchange, for ID tokens with another audience.
    #[serde(rename = "urn:ietf:params:oauth:grant-type:token-exchange")]
    TokenExchange,
}

/// A scope an OIDCClient may request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Scope {
    /// ID tokens (with only the required claims unless other scopes add some).
    #[serde(rename = "openid")]
    OpenID,
    /// A refresh token from the authorization code flow.
    #[serde(rename = "offline_access")]
    OfflineAccess,
    /// The username claim in ID tokens.
    #[serde(rename = "username")]
    Username,
    /// The groups claim in ID tokens.
    #[serde(rename = "groups")]
    Groups,
    /// Token exchange for another audience (a cluster's).
    #[serde(rename = "pinniped:request-audience")]
    RequestAudience,
}

/// Token lifetimes of one OIDCClient.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OIDCClientTokenLifetimes {
    /// How long ID tokens from the authorization code and refresh grants live, in seconds
    /// (120 to 1800); the Supervisor's default when absent. Short lifetimes make the client
    /// refresh often, and each refresh re-checks the user with the upstream identity provider.
    /// Not applied to tokens from token exchange.
    #[serde(rename = "idTokenSeconds", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 120, max = 1800))]
    pub id_token_seconds: Option<i32>,
}

impl OIDCClientTokenLifetimes {
    /// Whether every lifetime takes its default.
    pub fn is_empty(&self) -> bool {
        self.id_token_seconds.is_none()
    }
}

/// The observed state of an OIDCClient.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OIDCClientStatus {
    /// Pending, Ready or Error: a summary of the conditions.
    #[serde(default)]
    pub phase: Phase,

    /// The client's conditions (Ready, ClientSecretExists, AllowedGrantTypesValid,
    /// AllowedScopesValid), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,

    /// How many client secrets the client has. Always written, zero included, so the printer
    /// column shows it.
    #[serde(default)]
    #[schemars(transform = crate::schema::no_default)]
    pub total_client_secrets: i32,
}

#[cfg(test)]
mod tests;
