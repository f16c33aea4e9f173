//! What Selkie's fuzz targets (`fuzz/`) drive; built with the `fuzzing` feature only, which no
//! binary enables. Every function here calls the code the Supervisor runs — none reimplements
//! it — and nothing here reaches a network or a kube-apiserver:
//!
//! * [`Supervisor`]: the [`Endpoints`] of two FederationDomains over an in-memory session store
//!   (the unit tests' `Store::in_memory`), whose upstreams are never asked (see its
//!   documentation for what that leaves out);
//! * [`Sealer`]: the sealing of state parameters and CSRF cookies;
//! * [`Transforms`]: identity transforms and policies (CEL);
//! * [`oidc_client`], [`federation_domain`], [`IdentityProviders`]: the controllers' checks of
//!   OIDCClients, FederationDomains and identity providers;
//! * [`github`] with [`GitHubAnswers`]: GitHub's REST API and OAuth answers, given instead of
//!   fetched;
//! * [`Entry`], [`directory`] and the `ldap_*` functions: directory entries as the LDAP and
//!   Active Directory identity providers read them (the directory types are the crate's own:
//!   [`crate::Directory`], [`crate::Flavor`], [`crate::UserSearch`], [`crate::GroupSearch`]);
//! * [`saml_metadata`] and [`saml_verify`]: SAML identity-provider metadata and responses as the
//!   SAMLIdentityProvider reconciler and the assertion consumer service read them.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use selkie_api::supervisor_config::{FederationDomain, OIDCClientSpec};
use selkie_api::supervisor_idp::{GitHubGroupNameAttribute, GitHubUsernameAttribute};
use selkie_api::supervisor_oidc::IDPType;
pub use selkie_kube::conditions::Check;
use selkie_oidc::{
    discovery::Discovery,
    https::{HttpError, HttpsClient, TlsOptions},
    jose::sign::SigningKey,
    rp::{ClientConfig, Provider},
};

pub use crate::clients::DynamicClient;
pub use crate::idp::github::{Endpoints as GitHubEndpoints, GitHub, GitHubError, GitHubUser};
pub use crate::idp::ldap::LdapIdentity;
pub use crate::idp::transforms::{Outcome as TransformOutcome, Transforms};
pub use crate::sealed::{SealError, Sealer};

use crate::clients::Clients;
use crate::controller::fuzzing::{IdentityProviderChecks, IdpKind};
use crate::endpoints::authorize::{CSRF_PURPOSE as CSRF, STATE_PURPOSE as STATE};
use crate::endpoints::Endpoints;
use crate::idp::ldap::{Directory, DirectoryConfig, Flavor, GroupSearch, LdapError, UserSearch};
use crate::idp::throttle::PasswordThrottle;
use crate::idp::{GitHubUpstream, LdapUpstream, OidcUpstream, Upstream};
use crate::issuer::{Issuer, Issuers};
use crate::server::{audit::Audit, metrics::Metrics};
use crate::session::store::{memory::MemorySecrets, Store};
use crate::session::tokens::TokenKey;

// ---- a Supervisor ------------------------------------------------------------------------------

/// The FederationDomain with an OIDC upstream ([`OIDC_IDP`]) and a GitHub one ([`GITHUB_IDP`]).
pub const ISSUER: &str = "https://sso.fuzz.test/a";
/// The FederationDomain with a directory upstream ([`LDAP_IDP`]) only.
pub const DIRECTORY_ISSUER: &str = "https://sso.fuzz.test/b";
/// The OIDC upstream's display name (password grant not allowed).
pub const OIDC_IDP: &str = "Dex";
/// The GitHub upstream's display name.
pub const GITHUB_IDP: &str = "GitHub";
/// The LDAP upstream's display name.
pub const LDAP_IDP: &str = "Directory";
/// Where a browser login at [`OIDC_IDP`] goes.
pub const OIDC_AUTHORIZE_URL: &str = "https://dex.fuzz.test/auth";
/// Where a browser login at [`GITHUB_IDP`] goes.
pub const GITHUB_AUTHORIZE_URL: &str = "https://github.fuzz.test/login/oauth/authorize";
/// The OIDCClient of [`Supervisor::new`] with a client.
pub const CLIENT_ID: &str = "client.oauth.pinniped.dev-fuzz";
/// Its one secret (a fixture's, known to every fuzz run).
pub const CLIENT_SECRET: &str = "fuzz-client-secret-0123456789abcdef";
/// Its redirect URIs: an https one and a loopback one (any port).
pub const CLIENT_REDIRECT_URIS: [&str; 2] = ["https://app.fuzz.test/callback", "http://127.0.0.1/callback"];
/// The CSRF cookie's name.
pub const CSRF_COOKIE: &str = crate::endpoints::authorize::CSRF_COOKIE;
/// The purpose a sealed upstream `state` is sealed for.
pub const STATE_PURPOSE: &str = STATE;
/// The purpose a sealed CSRF cookie value is sealed for.
pub const CSRF_PURPOSE: &str = CSRF;
/// The least bcrypt cost of a stored client secret hash.
pub const BCRYPT_COST: u32 = crate::clients::BCRYPT_COST;

/// TLS settings of clients that are never used to connect.
fn never_connected() -> TlsOptions {
    TlsOptions {
        insecure_skip_verify: true,
        ..TlsOptions::default()
    }
}

/// The Supervisor's endpoints for two FederationDomains, [`ISSUER`] and [`DIRECTORY_ISSUER`],
/// with sessions in an in-memory store and upstreams that are never asked:
///
/// * the OIDC upstream allows no password grant and GitHub has no password flow, so the
///   `cli_password` flow at [`ISSUER`] is refused before any upstream is asked; a browser login
///   only gets a redirect to the upstream;
/// * a callback or a login form reaches an upstream only with a `state` this process sealed
///   (an OIDC or GitHub code redeemed, a directory bind);
/// * the directory of [`DIRECTORY_ISSUER`] is asked by the `cli_password` flow (the
///   `Pinniped-Username` and `Pinniped-Password` headers) and by the login form with a genuine
///   `state`: fuzz targets must send neither to it.
///
/// So without a login nothing here issues a code or a token, and the session store is not even
/// read: a code or token is looked up only once its signature checks.
pub struct Supervisor {
    endpoints: Endpoints,
    memory: Arc<MemorySecrets>,
    issuers: Vec<Arc<Issuer>>,
}

impl Supervisor {
    /// Builds it; with `client`, the OIDCClient [`CLIENT_ID`] exists and has already verified
    /// [`CLIENT_SECRET`] once (two bcrypt computations of cost 12 here), so that the token
    /// endpoint recognises that secret without bcrypt. Any other secret for it costs one bcrypt
    /// computation, by design. Must run on a Tokio runtime. `Err` says what could not be built.
    pub async fn new(client: bool) -> Result<Self, String> {
        let error = |e: &dyn std::fmt::Display| e.to_string();
        let dex = Discovery {
            issuer: "https://dex.fuzz.test".into(),
            authorization_endpoint: OIDC_AUTHORIZE_URL.into(),
            token_endpoint: "https://dex.fuzz.test/token".into(),
            jwks_uri: "https://dex.fuzz.test/keys".into(),
            userinfo_endpoint: "https://dex.fuzz.test/userinfo".into(),
            ..Discovery::default()
        };
        let oidc = Upstream::Oidc(OidcUpstream {
            display_name: OIDC_IDP.into(),
            resource_name: "dex".into(),
            resource_uid: "dex-uid".into(),
            provider: Arc::new(Provider::from_discovery(dex, &never_connected()).map_err(|e| error(&e))?),
            client: ClientConfig {
                client_id: "supervisor".into(),
                client_secret: Some("supervisor-secret".into()),
                scopes: vec!["openid".into(), "offline_access".into()],
            },
            additional_authorize_parameters: vec![("prompt".into(), "consent".into())],
            allow_password_grant: false,
            username_claim: Some("email".into()),
            groups_claim: Some("groups".into()),
            additional_claim_mappings: BTreeMap::new(),
        });
        let https = HttpsClient::new(&never_connected()).map_err(|e| error(&e))?;
        let github = GitHub::new(
            GitHubEndpoints::of("github.fuzz.test")?,
            "fuzz-github-app".into(),
            "fuzz-github-secret".into(),
            GitHubUsernameAttribute::LoginAndID,
            GitHubGroupNameAttribute::Slug,
            &[],
            https,
        )
        .answered_by(Arc::new(GitHubAnswers::default()));
        let github = Upstream::GitHub(GitHubUpstream {
            display_name: GITHUB_IDP.into(),
            resource_name: "github".into(),
            resource_uid: "github-uid".into(),
            github: Arc::new(github),
        });
        let ldap = Upstream::Ldap(LdapUpstream {
            display_name: LDAP_IDP.into(),
            resource_name: "ldap".into(),
            resource_uid: "ldap-uid".into(),
            kind: IDPType::LDAP,
            directory: Arc::new(directory(
                Flavor::Ldap,
                UserSearch {
                    base: "ou=users,dc=fuzz,dc=test".into(),
                    filter: String::new(),
                    username_attribute: "uid".into(),
                    uid_attribute: "uidNumber".into(),
                },
                GroupSearch::default(),
            )?),
        });
        let issuer = |url: &str, key: u8, idps: Vec<Upstream>| -> Result<Arc<Issuer>, String> {
            let signing_key = Arc::new(SigningKey::generate("fuzz").map_err(|e| error(&e))?);
            let jwks = Bytes::from(serde_json::json!({"keys": [signing_key.public_jwk()]}).to_string());
            Ok(Arc::new(
                Issuer::new(
                    url.into(),
                    url.into(),
                    signing_key,
                    jwks,
                    Arc::new(TokenKey::new(&[key; 32])),
                    Arc::new(Sealer::new(&[key.wrapping_add(1); 32], url).map_err(|e| error(&e))?),
                    idps.into_iter().map(Arc::new).collect(),
                    HashMap::new(),
                    Default::default(),
                )
                .map_err(|e| error(&e))?
                // The directory's FederationDomain offers the device grant, whose callback is
                // then one of the CLI's redirect URIs there.
                .with_device_authorization(url == DIRECTORY_ISSUER),
            ))
        };
        let issuers = vec![
            issuer(ISSUER, 1, vec![oidc, github])?,
            issuer(DIRECTORY_ISSUER, 3, vec![ldap])?,
        ];
        let clients = if client {
            let hash = hash_client_secret(CLIENT_SECRET)?;
            let spec: OIDCClientSpec = serde_json::from_value(serde_json::json!({
                "allowedRedirectURIs": CLIENT_REDIRECT_URIS,
                "allowedGrantTypes": ["authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:token-exchange"],
                "allowedScopes": ["openid", "offline_access", "pinniped:request-audience", "username", "groups"],
            }))
            .map_err(|e| error(&e))?;
            let storage = client_secret_storage(CLIENT_ID, "fuzz-client-uid", &[hash]);
            let (checks, client) = crate::clients::checked(CLIENT_ID, &spec, Some(&storage));
            let client = client.ok_or_else(|| format!("the fixture OIDCClient is invalid: {checks:?}"))?;
            if client.authenticate(CLIENT_SECRET).await != Ok(true) {
                return Err("the fixture OIDCClient does not take its own secret".into());
            }
            Clients::of([client])
        } else {
            Clients::default()
        };
        let (store, memory) = Store::in_memory();
        Ok(Self {
            endpoints: Endpoints {
                issuers: Arc::new(ArcSwap::from_pointee(Issuers::new(issuers.clone()))),
                store,
                metrics: Arc::new(Metrics::new()),
                audit: Audit::default(),
                clients: Arc::new(ArcSwap::from_pointee(clients)),
                passwords: PasswordThrottle::new(),
                device_polls: Default::default(),
                dpop_proofs: Default::default(),
                readiness: Default::default(),
            },
            memory,
            issuers,
        })
    }

    /// The endpoints, to send requests to ([`Endpoints::handle`]).
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// The client `id` as the FederationDomain `issuer` sees it ([`Endpoints::client`]), `None`
    /// when there is no such client or FederationDomain.
    pub fn client(&self, issuer: &str, id: &str) -> Option<crate::endpoints::authorize::Client> {
        let served = self.issuers.iter().find(|served| served.issuer == issuer)?;
        self.endpoints.client(served, id)
    }

    /// The sealer of the FederationDomain `issuer` ([`ISSUER`] or [`DIRECTORY_ISSUER`]).
    pub fn sealer(&self, issuer: &str) -> Option<&Sealer> {
        self.issuers
            .iter()
            .find(|served| served.issuer == issuer)
            .map(|served| served.sealer.as_ref())
    }

    /// How many requests reached the session store since the last call.
    pub fn take_store_requests(&self) -> usize {
        self.memory.take_requests().total()
    }

    /// How many sessions (codes, tokens) are stored.
    pub fn stored_sessions(&self) -> usize {
        self.memory.secrets().len()
    }
}

// ---- the controllers' checks -------------------------------------------------------------------

/// A bcrypt hash of `secret` of cost [`BCRYPT_COST`], as an `OIDCClientSecretRequest` stores it
/// (a quarter of a second of CPU, or more).
pub fn hash_client_secret(secret: &str) -> Result<String, String> {
    bcrypt::hash(secret, BCRYPT_COST).map_err(|e| e.to_string())
}

/// The storage Secret of the OIDCClient `name` with UID `uid` holding `hashes`, as an
/// `OIDCClientSecretRequest` writes it.
pub fn client_secret_storage(name: &str, uid: &str, hashes: &[String]) -> Secret {
    crate::clients::storage_secret(name, uid, "config.supervisor.pinniped.dev/v1alpha1", hashes)
}

/// The OIDCClient `name` checked with its storage Secret as the client controller checks it: its
/// conditions, and the client logins would use when it is valid.
pub fn oidc_client(
    name: &str,
    spec: &OIDCClientSpec,
    storage: Option<&Secret>,
) -> (Vec<Check>, Option<DynamicClient>) {
    crate::clients::checked(name, spec, storage)
}

/// The identity providers of the namespace [`federation_domain`] checks against: kind, name,
/// and whether it is ready to serve (the ready ones are never asked).
pub const NAMESPACE_IDPS: [(&str, &str, bool); 4] = [
    ("OIDCIdentityProvider", "dex", true),
    ("GitHubIdentityProvider", "github", true),
    ("LDAPIdentityProvider", "ldap", false),
    ("ActiveDirectoryIdentityProvider", "ad", false),
];
/// The identity providers' API group those references must name.
pub const IDP_GROUP: &str = "idp.supervisor.pinniped.dev";

/// What the FederationDomain reconciler made of a FederationDomain.
#[derive(Debug)]
pub struct FederationDomainCheck {
    /// Its conditions.
    pub checks: Vec<Check>,
    /// The display names of the upstreams it serves; `None`: it is not served.
    pub served: Option<Vec<String>>,
    /// The display names of its identity providers whose transforms compiled (and are not empty).
    pub transformed: Vec<String>,
}

/// What the FederationDomain reconciler makes of `fd` among `all` (the namespace's
/// FederationDomains, itself included), in a namespace with the identity providers
/// [`NAMESPACE_IDPS`]. `Err` when that namespace could not be built.
pub fn federation_domain(
    fd: &FederationDomain,
    all: &[FederationDomain],
) -> Result<FederationDomainCheck, String> {
    static NAMESPACE: OnceLock<Result<crate::controller::federation_domain::Namespace, String>> =
        OnceLock::new();
    let namespace = NAMESPACE
        .get_or_init(|| {
            let mut namespace = crate::controller::federation_domain::Namespace {
                idp_group: IDP_GROUP.into(),
                ..Default::default()
            };
            for (kind, name, ready) in NAMESPACE_IDPS {
                namespace.existing.insert((kind.into(), name.into()));
                if ready {
                    let provider = Provider::from_discovery(
                        Discovery {
                            issuer: format!("https://{name}.fuzz.test"),
                            jwks_uri: format!("https://{name}.fuzz.test/keys"),
                            ..Discovery::default()
                        },
                        &never_connected(),
                    )
                    .map_err(|e| e.to_string())?;
                    let upstream = Upstream::Oidc(OidcUpstream {
                        display_name: name.into(),
                        resource_name: name.into(),
                        resource_uid: format!("{name}-uid"),
                        provider: Arc::new(provider),
                        client: ClientConfig {
                            client_id: "supervisor".into(),
                            client_secret: None,
                            scopes: Vec::new(),
                        },
                        additional_authorize_parameters: Vec::new(),
                        allow_password_grant: false,
                        username_claim: None,
                        groups_claim: None,
                        additional_claim_mappings: BTreeMap::new(),
                    });
                    namespace
                        .ready
                        .insert((kind.into(), name.into()), Arc::new(upstream));
                }
            }
            Ok(namespace)
        })
        .as_ref()
        .map_err(Clone::clone)?;
    let claims: Vec<_> = all
        .iter()
        .map(crate::controller::federation_domain::IssuerClaim::of)
        .collect();
    let (checks, upstreams) = crate::controller::federation_domain::check(fd, &claims, namespace);
    let served = upstreams.map(|upstreams| {
        upstreams
            .iter()
            .map(|upstream| upstream.display_name().to_string())
            .collect()
    });
    let transformed = crate::controller::federation_domain::transforms(fd)
        .into_keys()
        .collect();
    Ok(FederationDomainCheck {
        checks,
        served,
        transformed,
    })
}

/// An identity-provider kind, for [`IdentityProviders::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityProviderKind {
    /// OIDCIdentityProvider.
    Oidc,
    /// LDAPIdentityProvider.
    Ldap,
    /// ActiveDirectoryIdentityProvider.
    ActiveDirectory,
    /// GitHubIdentityProvider.
    GitHub,
}

/// What the first check of an identity provider found.
#[derive(Debug)]
pub struct IdentityProviderCheck {
    /// Its conditions, without `Ready`.
    pub checks: Vec<Check>,
    /// Whether an upstream was built to serve (never, here: see [`IdentityProviders`]).
    pub built: bool,
    /// Why a server it needs did not answer (never, here).
    pub unavailable: Option<String>,
    /// The status a leader would write.
    pub status: serde_json::Value,
}

/// The identity-provider reconcilers' checks in a namespace whose Secrets and ConfigMaps are
/// fixed ([`NAMESPACE`], [`CA_SECRET`], [`NOT_PEM_SECRET`], [`OPAQUE_CREDENTIALS`],
/// [`CA_CONFIG_MAP`]). It holds no Secret of a credentials type, and GitHub objects are given a
/// CA source that does not exist, so no check gets as far as asking a server (discovery,
/// connection probes): those need one and are not fuzzed.
pub struct IdentityProviders {
    checks: IdentityProviderChecks,
}

pub use crate::controller::fuzzing::{
    CA_CONFIG_MAP, CA_SECRET, NAMESPACE, NOT_PEM_SECRET, OPAQUE_CREDENTIALS,
};

impl IdentityProviders {
    /// Builds the namespace (a CA generated for its CA sources). Must run on a Tokio runtime.
    pub fn new() -> Result<Self, String> {
        let ca = selkie_kube::certs::generate_ca("selkie fuzz CA", std::time::Duration::from_secs(3600))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            checks: IdentityProviderChecks::new(&ca.cert_pem)?,
        })
    }

    /// The first check of `object` (JSON of a watched object of `kind`); `Err` when it is no
    /// object or cannot be read as its kind.
    pub async fn check(
        &self,
        kind: IdentityProviderKind,
        object: serde_json::Value,
    ) -> Result<IdentityProviderCheck, String> {
        let object: DynamicObject = serde_json::from_value(object).map_err(|e| e.to_string())?;
        let kind = match kind {
            IdentityProviderKind::Oidc => IdpKind::Oidc,
            IdentityProviderKind::Ldap => IdpKind::Ldap,
            IdentityProviderKind::ActiveDirectory => IdpKind::ActiveDirectory,
            IdentityProviderKind::GitHub => IdpKind::GitHub,
        };
        let checked = self.checks.check(kind, &object).await?;
        Ok(IdentityProviderCheck {
            checks: checked.checks,
            built: checked.built,
            unavailable: checked.unavailable,
            status: checked.status,
        })
    }
}

// ---- GitHub ------------------------------------------------------------------------------------

/// One answer GitHub gives.
#[derive(Debug, Clone)]
pub struct GitHubAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The headers (those HTTP cannot carry are dropped).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// A request the [`GitHub`] of [`github`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitHubRequest {
    /// Its method.
    pub method: Method,
    /// Its URL.
    pub url: String,
    /// Whether it carried an `Authorization` header (the user's token; never recorded).
    pub authorized: bool,
}

/// The answers a [`GitHub`] gets, in order, instead of GitHub's; `None`, and every request after
/// the last one, gets no answer (as when GitHub is unreachable). It records the requests made.
#[derive(Debug, Default)]
pub struct GitHubAnswers {
    answers: Mutex<VecDeque<Option<GitHubAnswer>>>,
    requests: Mutex<Vec<GitHubRequest>>,
}

impl GitHubAnswers {
    /// `answers`, in order.
    pub fn new(answers: impl IntoIterator<Item = Option<GitHubAnswer>>) -> Self {
        Self {
            answers: Mutex::new(answers.into_iter().collect()),
            requests: Mutex::default(),
        }
    }

    /// The requests made so far.
    pub fn requests(&self) -> Vec<GitHubRequest> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The next answer to a request, as the HTTPS client gives it: a body larger than `limit` is
    /// an error, as it is when read.
    pub(crate) fn answer(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        limit: usize,
    ) -> Result<selkie_oidc::https::Response, HttpError> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(GitHubRequest {
                method: method.clone(),
                url: url.to_string(),
                authorized: headers
                    .iter()
                    .any(|(name, _)| name == http::header::AUTHORIZATION),
            });
        let next = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .flatten();
        let Some(answer) = next else {
            return Err(HttpError::Request {
                method,
                url: url.to_string(),
                cause: "no answer".into(),
                connection_lost: false,
            });
        };
        if answer.body.len() > limit {
            return Err(HttpError::Body {
                method,
                url: url.to_string(),
                cause: "length limit exceeded".into(),
            });
        }
        let mut headers = http::HeaderMap::new();
        for (name, value) in &answer.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                headers.append(name, value);
            }
        }
        Ok(selkie_oidc::https::Response {
            method,
            url: url.to_string(),
            status: http::StatusCode::from_u16(answer.status).unwrap_or(http::StatusCode::OK),
            headers,
            body: Bytes::from(answer.body.clone()),
        })
    }
}

/// A GitHub identity provider at `host` (its `spec.githubAPI.host`) for the app
/// `client_id`/`client_secret`, answered by `answers`; `Err` when `host` is not valid (the
/// reason, as its condition gives it).
pub fn github(
    host: &str,
    client_id: &str,
    client_secret: &str,
    username: GitHubUsernameAttribute,
    groups: GitHubGroupNameAttribute,
    allowed_organizations: &[String],
    answers: Arc<GitHubAnswers>,
) -> Result<GitHub, String> {
    static HTTPS: OnceLock<Result<HttpsClient, String>> = OnceLock::new();
    let https = HTTPS
        .get_or_init(|| HttpsClient::new(&never_connected()).map_err(|e| e.to_string()))
        .clone()?;
    Ok(GitHub::new(
        GitHubEndpoints::of(host)?,
        client_id.into(),
        client_secret.into(),
        username,
        groups,
        allowed_organizations,
        https,
    )
    .answered_by(answers))
}

// ---- directories -------------------------------------------------------------------------------

/// A directory entry as a search returns it: its DN and its attributes' values, text and binary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The DN.
    pub dn: String,
    /// Text values by attribute (a name given twice: the last one counts).
    pub attrs: Vec<(String, Vec<String>)>,
    /// Binary values by attribute.
    pub bin_attrs: Vec<(String, Vec<Vec<u8>>)>,
}

impl Entry {
    fn search_entry(&self) -> ldap3::SearchEntry {
        ldap3::SearchEntry {
            dn: self.dn.clone(),
            attrs: self.attrs.iter().cloned().collect(),
            bin_attrs: self.bin_attrs.iter().cloned().collect(),
        }
    }

    fn of(entry: ldap3::SearchEntry) -> Self {
        let mut attrs: Vec<_> = entry.attrs.into_iter().collect();
        let mut bin_attrs: Vec<_> = entry.bin_attrs.into_iter().collect();
        attrs.sort();
        bin_attrs.sort();
        Self {
            dn: entry.dn,
            attrs,
            bin_attrs,
        }
    }
}

/// A directory with these searches that never connects (its host does not exist and no function
/// here asks it anything).
pub fn directory(
    flavor: Flavor,
    user_search: UserSearch,
    group_search: GroupSearch,
) -> Result<Directory, String> {
    static TLS: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    let tls = TLS
        .get_or_init(|| {
            selkie_oidc::https::client_config(&never_connected())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()?;
    Ok(Directory::new(DirectoryConfig {
        host: "ldap.fuzz.test:636".into(),
        tls,
        bind_dn: "cn=fuzz".into(),
        bind_password: "fuzz".into(),
        user_search,
        group_search,
        timeout: std::time::Duration::from_secs(1),
        flavor,
    }))
}

/// The entry of a search answer's BER-encoded `SearchResultEntry` (`ber`), read as the directory
/// client reads it: `None` when `ber` is no BER element; `Err` when ldap3 cannot make an entry of
/// it (it panics, and the Supervisor catches that: the panic hook runs).
pub fn ldap_entry(ber: &[u8]) -> Option<Result<Entry, LdapError>> {
    let (_, tag) = ldap3::asn1::parse_tag(ber).ok()?;
    Some(crate::idp::ldap::entry_of(ldap3::ResultEntry::new(tag), "dc=fuzz,dc=test").map(Entry::of))
}

/// Who the user `entry` is to `directory` (username, UID, refresh attributes; no groups).
pub fn ldap_identity(directory: &Directory, entry: &Entry) -> Result<LdapIdentity, LdapError> {
    directory.identity_of(&entry.search_entry())
}

/// The filter of `directory`'s group search for the user `entry`.
pub fn ldap_group_filter(directory: &Directory, entry: &Entry) -> Result<String, LdapError> {
    directory.group_filter(&entry.search_entry())
}

/// The group names `directory` makes of the group entries `entries`.
pub fn ldap_group_names(directory: &Directory, entries: &[Entry]) -> Result<Vec<String>, LdapError> {
    let entries: Vec<_> = entries.iter().map(Entry::search_entry).collect();
    directory.group_names(&entries)
}

/// Active Directory's refresh checks of `entry` against the refresh attributes of the login.
pub fn active_directory_refresh(entry: &Entry, at_login: &BTreeMap<String, String>) -> Result<(), LdapError> {
    crate::idp::ldap::active_directory_checks(&entry.search_entry(), at_login)
}

/// `template` with every `{}` replaced by `value` escaped for a filter (RFC 4515).
pub fn ldap_fill_filter(template: &str, value: &str) -> String {
    crate::idp::ldap::fill_filter(template, value)
}

/// Active Directory's `objectGUID` bytes as a GUID string.
pub fn microsoft_guid(raw: &[u8]) -> Option<String> {
    crate::idp::ldap::microsoft_guid(raw)
}

/// What a verified SAML response says: its NameID, attributes and assertion ID.
pub type SamlIdentity = (String, BTreeMap<String, Vec<String>>, String);

/// SAML identity-provider metadata as a SAMLIdentityProvider's is read: its entity ID and SSO
/// URL, or why it is refused.
pub fn saml_metadata(xml: &str) -> Result<(String, String), String> {
    crate::idp::saml::IdpMetadata::parse(xml)
        .map(|metadata| (metadata.entity_id, metadata.sso_redirect_url))
        .map_err(|error| error.to_string())
}

/// The base64 `SAMLResponse` `response` as the assertion consumer service verifies it: against
/// the identity provider `metadata` (which must read, see [`saml_metadata`]), for the service
/// provider `sp_entity_id` with its ACS `acs_url`, as the answer to `request_id`, at `now` with
/// no clock skew. What the signed assertion says, or why it is refused.
pub fn saml_verify(
    response: &str,
    metadata: &str,
    sp_entity_id: &str,
    acs_url: &str,
    request_id: &str,
    now: time::OffsetDateTime,
) -> Result<SamlIdentity, String> {
    let metadata = crate::idp::saml::IdpMetadata::parse(metadata).map_err(|error| error.to_string())?;
    let sp = crate::idp::saml::ServiceProvider {
        entity_id: sp_entity_id.to_string(),
        acs_url: acs_url.to_string(),
    };
    crate::idp::saml::verify_response(
        response,
        &metadata,
        &sp,
        request_id,
        now,
        std::time::Duration::ZERO,
    )
    .map(|verified| (verified.name_id, verified.attributes, verified.assertion_id))
    .map_err(|error| error.to_string())
}
