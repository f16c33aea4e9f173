//! The static YAML configuration (`selkie-concierge --config FILE`), so the proxy runs without a
//! control plane. [`StaticConfig::load`] parses a file, [`StaticConfig::snapshot`] builds a
//! validated [`Snapshot`]; any mistake is one error naming the field, and a reload that fails
//! leaves the running snapshot in place. An example is `conf/proxy.example.yaml`.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use pingora::utils::tls::{CertKey, WrappedX509};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use selkie_filters::{
    access_review::{AccessReviewConfig, AccessReviewer},
    chain::{Chain, TokenAuthenticator},
    https::ClientAuth,
    identity::{CertificateIdentity, Forwarding, Identity, UserInfo},
    impersonation::headers::PreparedIdentity,
    issuing::login_api::{ConciergeApi, SignerConciergeApi},
    issuing::signer::ClientCertificateSigner,
    jwt::{AudienceMatchPolicy, ClaimMapping, JwtAuthenticator, JwtConfig},
    review_cache::CacheConfig,
    tokenreview::{ReviewVersion, TokenReviewAuthenticator, TokenReviewConfig, UidHandling},
    x509::{X509Authenticator, DEFAULT_CLOCK_SKEW, MAX_CLOCK_SKEW},
};
use selkie_kube::serving::ServingCert;
/// Graceful shutdown on SIGTERM (shared with the Supervisor): `/readyz` turns 503 at once and
/// the proxy keeps serving for the grace period, then drains.
pub use selkie_kube::shutdown::ShutdownConfig;
use serde::Deserialize;

use crate::{
    admission::ListenerLimits,
    downstream::Timeouts,
    snapshot::{ConciergePaths, Snapshot, TokenFile, Upstream, UpstreamCredential, UpstreamTls},
    upstream_gate::ConnectionGate,
};

/// The file's top level.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticConfig {
    /// `host:port` the proxy listens on.
    pub listen: String,
    /// `host:port` of `/healthz`, `/readyz` and `/metrics` (plain HTTP); not served when unset.
    #[serde(default)]
    pub operations_listen: Option<String>,
    /// What SIGTERM does. Read at start-up only.
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    /// The listener's certificate (PEM chain, leaf first) and key; re-read when they change.
    /// Required unless a control plane provides the certificate (`selkie-concierge
    /// --control-plane`), in which case it is ignored.
    #[serde(default)]
    pub serving_certificate: Option<CertFiles>,
    /// How long clients may take to send a request head and may stay idle. Read at start-up.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// How many client connections may be open at once. Read at start-up.
    #[serde(default)]
    pub listener_limits: ListenerLimits,
    /// kube-apiserver.
    pub upstream: UpstreamConfig,
    /// CA bundles whose client certificates identify users (CN = user, O = groups).
    #[serde(default)]
    pub client_certificate_ca_files: Vec<PathBuf>,
    /// How long a client certificate keeps counting after its `notAfter` (and before its
    /// `notBefore`), for clocks that disagree. Default `0s`, as kube-apiserver; at most `5m`.
    /// Checked on every request, also on connections opened while the certificate was valid.
    #[serde(
        default,
        deserialize_with = "crate::duration::deserialize_some_duration::<_, false>"
    )]
    pub client_certificate_clock_skew: Option<Duration>,
    /// JWT authenticators, tried in order.
    #[serde(default)]
    pub jwt_authenticators: Vec<JwtAuthenticatorConfig>,
    /// TokenReview webhooks, tried after the JWT authenticators.
    #[serde(default)]
    pub webhook_authenticators: Vec<WebhookAuthenticatorConfig>,
    /// The user every request that presents no credential at all is impersonated as, instead of
    /// being refused. For benchmarks (PERF.md's S0) and single-user setups behind another
    /// authenticating layer; never set it on a proxy reachable by untrusted clients.
    #[serde(default)]
    pub static_identity: Option<StaticIdentityConfig>,
    /// Pinniped's `apiGroupSuffix`: where the proxy answers TokenCredentialRequest and
    /// WhoAmIRequest (`login.concierge.<suffix>`, `identity.concierge.<suffix>`). Default
    /// `pinniped.dev`; a control plane's own setting takes precedence.
    #[serde(default)]
    pub api_group_suffix: Option<String>,
    /// A CA certificate and key; when set, the proxy answers TokenCredentialRequests itself with
    /// client certificates from this CA (and WhoAmIRequests from what it authenticated).
    #[serde(default)]
    pub credential_signer: Option<CertFiles>,
}

/// A fixed user (`staticIdentity`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticIdentityConfig {
    /// The user name; must not be empty.
    pub username: String,
    /// Its groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A certificate and key on disk.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertFiles {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

impl CertFiles {
    /// Reads and checks the serving certificate chain and its key.
    pub fn serving_key(&self) -> Result<rustls::sign::CertifiedKey, ConfigError> {
        ServingCert::load(&read(&self.cert_file)?, &read(&self.key_file)?)
            .map_err(|e| invalid("servingCertificate", e))
    }
}

/// kube-apiserver and the proxy's credential for it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamConfig {
    /// `https://host:port`.
    pub url: String,
    /// CA bundle for kube-apiserver's serving certificate.
    pub ca_file: PathBuf,
    /// A file holding a bearer token (a service-account token); re-read when it changes.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// A client certificate instead of a token.
    #[serde(default)]
    pub client_certificate: Option<CertFiles>,
    /// Whether bearer tokens no other authenticator accepts are reviewed by kube-apiserver
    /// itself, as Pinniped's impersonation proxy does (default `true`): a TokenReview
    /// (`authentication.k8s.io/v1`, no audiences, so the token must be valid for kube-apiserver)
    /// at `<url>/apis/authentication.k8s.io/v1/tokenreviews`, sent with the proxy's own
    /// credential (`tokenFile`'s current token, or `clientCertificate`), which then needs
    /// `create` on `tokenreviews` (`system:auth-delegator` grants it). It is the chain's last
    /// authenticator, named `kube-apiserver` in logs and metrics, and no TokenCredentialRequest
    /// can name it. An identity it returns with a UID (every service account) cannot be
    /// impersonated, so the caller's own token is passed to kube-apiserver unchanged and
    /// kube-apiserver applies that identity's RBAC; one without a UID is impersonated. Results
    /// are remembered for 10 s (a refusal for 5 s). With `false`, such tokens are refused (401).
    #[serde(default = "default_token_review")]
    pub token_review: bool,
}

fn default_token_review() -> bool {
    true
}

/// The name of kube-apiserver's TokenReview authenticator in logs and metrics.
pub const KUBE_APISERVER_AUTHENTICATOR: &str = "kube-apiserver";

/// How long kube-apiserver's TokenReview answers are reused: as Pinniped's delegating
/// authenticator (and kube-apiserver's own webhook token authenticator default).
const TOKEN_REVIEW_TTL: Duration = Duration::from_secs(10);

/// A JWT authenticator, with the fields of Pinniped's JWTAuthenticator spec.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtAuthenticatorConfig {
    /// Name for logs and metrics.
    pub name: String,
    /// Issuer URL.
    pub issuer: String,
    /// Accepted audience.
    pub audience: String,
    /// Claim names.
    #[serde(default)]
    pub claims: JwtClaims,
    /// CA bundle for the issuer.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// How verified tokens are remembered; omitted: on, with the defaults of
    /// [`JwtCacheConfig`].
    #[serde(default)]
    pub cache: Option<JwtCacheConfig>,
}

/// How a JWT authenticator remembers the outcome of verifying a token (`jwtAuthenticators[].cache`),
/// keyed by an HMAC of the token, so that a token presented again is not verified again. Every
/// field is optional:
///
/// ```yaml
/// cache:
///   enabled: true      # false: no cache, every request's token is verified in full
///   capacity: 10000    # tokens remembered at most (at least 1)
///   ttl: 60s           # how long a verified token is reused (never past its exp; > 0)
///   negativeTtl: 5s    # how long a refused token stays refused (0s: not remembered)
/// ```
///
/// With `enabled: false` the other fields must be absent. Failures to reach the issuer are never
/// remembered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtCacheConfig {
    /// `false` turns the cache off: every presentation of a token is verified, signature
    /// included (default `true`).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Most tokens remembered at once, at least 1 (default 10,000).
    #[serde(default)]
    pub capacity: Option<usize>,
    /// How long a verified token is reused, greater than zero (default 60 s); never past the
    /// token's `exp`.
    #[serde(
        default,
        deserialize_with = "crate::duration::deserialize_some_duration::<_, true>"
    )]
    pub ttl: Option<Duration>,
    /// How long a refused token stays refused without another check (default 5 s; `0s`: not
    /// remembered).
    #[serde(
        default,
        deserialize_with = "crate::duration::deserialize_some_duration::<_, false>"
    )]
    pub negative_ttl: Option<Duration>,
}

impl JwtCacheConfig {
    /// The result cache these settings describe; `field` (e.g. `jwtAuthenticators[0].cache`)
    /// names the block in errors: the other fields set with `enabled: false`, or a capacity of 0.
    pub fn cache_config(&self, field: &str) -> Result<CacheConfig, ConfigError> {
        if self.enabled == Some(false) {
            if self.capacity.is_some() || self.ttl.is_some() || self.negative_ttl.is_some() {
                return Err(invalid(
                    field,
                    "capacity, ttl and negativeTtl do not apply with enabled: false",
                ));
            }
            return Ok(CacheConfig::disabled());
        }
        let defaults = CacheConfig::default();
        let capacity = self.capacity.unwrap_or(defaults.capacity);
        if capacity == 0 {
            return Err(invalid(
                format!("{field}.capacity"),
                "must be at least 1 (enabled: false turns the cache off)",
            ));
        }
        Ok(CacheConfig {
            capacity,
            positive_ttl: self.ttl.unwrap_or(defaults.positive_ttl),
            negative_ttl: self.negative_ttl.unwrap_or(defaults.negative_ttl),
        })
    }
}

/// Which claims name the user and the groups.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtClaims {
    /// Username claim (default `username`).
    #[serde(default = "default_username_claim")]
    pub username: String,
    /// Groups claim (default `groups`).
    #[serde(default = "default_groups_claim")]
    pub groups: String,
}

impl Default for JwtClaims {
    fn default() -> Self {
        Self {
            username: default_username_claim(),
            groups: default_groups_claim(),
        }
    }
}

fn default_username_claim() -> String {
    "username".into()
}

fn default_groups_claim() -> String {
    "groups".into()
}

/// A TokenReview webhook (Pinniped's WebhookAuthenticator).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookAuthenticatorConfig {
    /// Name for logs and metrics.
    pub name: String,
    /// `https://` TokenReview endpoint.
    pub endpoint: String,
    /// CA bundle for the endpoint.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// What a TokenCredentialRequest's certificate must say of this webhook's identities:
    /// `Exact` (the default, as Pinniped: an identity with a UID or extras gets none) or
    /// `UsernameAndGroups` (the UID and extras are left out, e.g. for service accounts reviewed by
    /// kube-apiserver).
    #[serde(default)]
    pub certificate_identity: CertificateIdentity,
}

/// Why a configuration cannot be used. The message names the file or field at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file could not be read.
    #[error("reading {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The YAML is invalid or has unknown fields.
    #[error("{path} is not a valid proxy configuration: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What serde said.
        error: serde_yaml::Error,
    },
    /// A field has an unusable value.
    #[error("{field}: {message}")]
    Invalid {
        /// The field, e.g. `upstream.url`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.to_string(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    })
}

fn read_string(path: &Path) -> Result<String, ConfigError> {
    String::from_utf8(read(path)?).map_err(|_| invalid(path.display().to_string(), "is not UTF-8 text"))
}

impl StaticConfig {
    /// The serving certificate and key, read now; an error if none is configured.
    pub fn serving_key(&self) -> Result<rustls::sign::CertifiedKey, ConfigError> {
        self.serving_certificate
            .as_ref()
            .ok_or_else(|| invalid("servingCertificate", "is required without a control plane"))?
            .serving_key()
    }

    /// Parses the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        serde_yaml::from_slice(&read(path)?).map_err(|error| ConfigError::Parse {
            path: path.to_path_buf(),
            error,
        })
    }

    /// The listen address.
    pub fn listen_address(&self) -> Result<SocketAddr, ConfigError> {
        self.listen
            .parse()
            .map_err(|e| invalid("listen", format!("{:?} is not host:port: {e}", self.listen)))
    }

    /// The operations address (`operationsListen`), if one is configured.
    pub fn operations_address(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.operations_listen
            .as_deref()
            .map(|listen| {
                listen
                    .parse()
                    .map_err(|e| invalid("operationsListen", format!("{listen:?} is not host:port: {e}")))
            })
            .transpose()
    }

    /// Builds and validates the snapshot. Reads every referenced file; does no network IO.
    pub fn snapshot(&self) -> Result<Snapshot, ConfigError> {
        self.snapshot_with(&Extension::default(), None)
    }

    /// Builds and validates the snapshot of this file extended by `extension` (what a control
    /// plane adds). `upstream`, when given, is reused instead of building a new one from
    /// `upstream:` (its connections and caches stay warm); pass it only when this configuration's
    /// `upstream:` is the one it was built from. Reads every referenced file; does no network IO.
    pub fn snapshot_with(
        &self,
        extension: &Extension,
        upstream: Option<Arc<Upstream>>,
    ) -> Result<Snapshot, ConfigError> {
        let mut bundles = self
            .client_certificate_ca_files
            .iter()
            .map(|path| read_string(path))
            .collect::<Result<Vec<_>, _>>()?;
        bundles.extend(extension.client_ca_pems.iter().cloned());
        let skew = self.client_certificate_clock_skew.unwrap_or(DEFAULT_CLOCK_SKEW);
        if skew > MAX_CLOCK_SKEW {
            return Err(invalid("clientCertificateClockSkew", "must be at most 5m"));
        }
        let client_certificates = if bundles.is_empty() {
            None
        } else {
            let bundles: Vec<&str> = bundles.iter().map(String::as_str).collect();
            Some(Arc::new(
                X509Authenticator::new("client-certificate", &bundles, skew)
                    .map_err(|e| invalid("clientCertificateCaFiles", e))?,
            ))
        };

        let mut authenticators = Vec::new();
        for (i, jwt) in self.jwt_authenticators.iter().enumerate() {
            let field = format!("jwtAuthenticators[{i}]");
            let mut config = JwtConfig::new(&jwt.name, &jwt.issuer, &jwt.audience);
            config.username = ClaimMapping::claim(&jwt.claims.username).into();
            config.groups = Some(ClaimMapping::claim(&jwt.claims.groups).into());
            config.audience_match_policy = Some(AudienceMatchPolicy::MatchAny);
            config.ca_bundle_pem = jwt.ca_file.as_deref().map(read_string).transpose()?;
            if let Some(cache) = &jwt.cache {
                config.cache = cache.cache_config(&format!("{field}.cache"))?;
            }
            let authenticator = JwtAuthenticator::new(config).map_err(|e| invalid(&field, e))?;
            authenticators.push(TokenAuthenticator::Jwt(Arc::new(authenticator)));
        }
        for (i, webhook) in self.webhook_authenticators.iter().enumerate() {
            let field = format!("webhookAuthenticators[{i}]");
            let mut config = TokenReviewConfig::new(&webhook.name, &webhook.endpoint);
            config.ca_bundle_pem = webhook.ca_file.as_deref().map(read_string).transpose()?;
            config.certificate_identity = webhook.certificate_identity;
            let authenticator = TokenReviewAuthenticator::new(config).map_err(|e| invalid(&field, e))?;
            authenticators.push(TokenAuthenticator::TokenReview(Arc::new(authenticator)));
        }
        authenticators.extend(extension.chain.token_authenticators().iter().cloned());

        let static_identity = match &self.static_identity {
            Some(config) if config.username.is_empty() => {
                return Err(invalid("staticIdentity.username", "must not be empty"))
            }
            Some(config) => Some(Arc::new(Identity {
                user: UserInfo {
                    username: config.username.clone(),
                    groups: config.groups.clone(),
                    ..UserInfo::default()
                },
                authenticator: Arc::from("static"),
                audiences: Vec::new(),
                forwarding: Forwarding::Impersonate,
            })),
            None => None,
        };

        let concierge_api = match (&extension.concierge_api, &self.credential_signer) {
            (Some(api), _) => Some(api.clone()),
            (None, Some(files)) => {
                let signer = ClientCertificateSigner::from_pem(
                    &read_string(&files.cert_file)?,
                    &read_string(&files.key_file)?,
                )
                .map_err(|e| invalid("credentialSigner", e))?;
                Some(Arc::new(SignerConciergeApi::new(signer)) as Arc<dyn ConciergeApi>)
            }
            (None, None) => None,
        };

        let suffix = match (&extension.api_group_suffix, &self.api_group_suffix) {
            (Some(suffix), _) | (None, Some(suffix)) => suffix.as_str(),
            (None, None) => selkie_api::group_suffix::DEFAULT_API_GROUP_SUFFIX,
        };
        selkie_api::group_suffix::validate_api_group_suffix(suffix)
            .map_err(|e| invalid("apiGroupSuffix", e))?;
        let upstream = match upstream {
            Some(upstream) => upstream,
            None => Arc::new(self.upstream.build()?),
        };
        // kube-apiserver's own TokenReview comes after the file's and the control plane's
        // authenticators, and no TokenCredentialRequest can name it.
        let chain = match &upstream.token_reviewer {
            Some(reviewer) => {
                Chain::new(authenticators).with_implicit(TokenAuthenticator::TokenReview(reviewer.clone()))
            }
            None => Chain::new(authenticators),
        };
        Ok(Snapshot {
            client_certificates,
            chain,
            upstream,
            static_prepared: static_identity.clone().map(PreparedIdentity::new),
            static_identity,
            concierge_api,
            concierge_paths: ConciergePaths::for_suffix(suffix),
        })
    }
}

/// What a control plane adds to the static configuration's snapshot.
#[derive(Debug, Default, Clone)]
pub struct Extension {
    /// Token authenticators tried after the file's own (and before kube-apiserver's TokenReview,
    /// [`UpstreamConfig::token_review`]); an implicit authenticator of this chain is not used.
    pub chain: Chain,
    /// PEM CA bundles whose client certificates identify users, besides the file's.
    pub client_ca_pems: Vec<String>,
    /// Answers TokenCredentialRequest and WhoAmIRequest instead of the file's `credentialSigner`.
    pub concierge_api: Option<Arc<dyn ConciergeApi>>,
    /// The API group suffix, instead of the file's `apiGroupSuffix`.
    pub api_group_suffix: Option<String>,
}

impl UpstreamConfig {
    fn build(&self) -> Result<Upstream, ConfigError> {
        let uri: http::Uri = self
            .url
            .parse()
            .map_err(|e| invalid("upstream.url", format!("{:?} is not a URL: {e}", self.url)))?;
        if uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
            return Err(invalid("upstream.url", "must use https"));
        }
        let host = uri
            .host()
            .ok_or_else(|| invalid("upstream.url", "has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let address = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| invalid("upstream.url", format!("cannot resolve {host}: {e}")))?
            .next()
            .ok_or_else(|| invalid("upstream.url", format!("{host} has no address")))?;

        let ca_pem = read_string(&self.ca_file)?;
        let ca = certificates(ca_pem.as_bytes()).map_err(|e| invalid("upstream.caFile", e))?;
        let certificate = match &self.client_certificate {
            Some(files) => Some(ClientAuth::Certificate {
                cert_pem: read_string(&files.cert_file)?,
                key_pem: read_string(&files.key_file)?,
            }),
            None => None,
        };
        let mut review = AccessReviewConfig::new(&self.url, ca_pem.clone());
        if let Some(certificate) = &certificate {
            review.client_auth = certificate.clone();
        }
        let access_reviewer = AccessReviewer::new(review).map_err(|e| invalid("upstream", e))?;
        let token_file = match &self.token_file {
            Some(path) => Some(Arc::new(
                TokenFile::open(path.clone()).map_err(|e| invalid("upstream.tokenFile", e))?,
            )),
            None => None,
        };
        let token_reviewer = match (self.token_review, &token_file, certificate) {
            (false, _, _) => None,
            (true, Some(file), _) => {
                Some(self.token_reviewer(ca_pem, ClientAuth::BearerTokenSource(file.clone()))?)
            }
            (true, None, Some(certificate)) => Some(self.token_reviewer(ca_pem, certificate)?),
            // Neither credential: refused below.
            (true, None, None) => None,
        };
        let credential = match (token_file, &self.client_certificate) {
            (Some(file), None) => UpstreamCredential::TokenFile(file),
            (None, Some(files)) => {
                let chain = certificates(&read(&files.cert_file)?)
                    .map_err(|e| invalid("upstream.clientCertificate.certFile", e))?;
                let key_pem = read(&files.key_file)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| invalid("upstream.clientCertificate.keyFile", e))?;
                let chain = chain.iter().map(|cert| cert.borrow_raw_cert().clone()).collect();
                UpstreamCredential::ClientCertificate(Arc::new(CertKey::new(
                    chain,
                    key.secret_der().to_vec(),
                )))
            }
            _ => {
                return Err(invalid(
                    "upstream",
                    "exactly one of tokenFile and clientCertificate is required",
                ))
            }
        };
        let certificate = match &credential {
            UpstreamCredential::ClientCertificate(certificate) => Some(&**certificate),
            UpstreamCredential::TokenFile(_) => None,
        };
        let tls = UpstreamTls::new(&ca, certificate).map_err(|e| invalid("upstream", e))?;
        Ok(Upstream {
            address,
            sni: host,
            ca,
            credential,
            tls,
            connect_timeout: Duration::from_secs(5),
            max_h2_streams: MAX_H2_STREAMS,
            h2_ping_interval: Duration::from_secs(30),
            access_reviewer,
            token_reviewer,
            gate: Arc::new(ConnectionGate::new(MAX_H2_STREAMS)),
            stream_gate: Arc::new(ConnectionGate::new(MAX_H2_STREAMS)),
        })
    }

    /// kube-apiserver's own TokenReview as Pinniped's impersonation proxy runs it (its
    /// delegating authenticator): `v1`, no audiences (the token must be valid for kube-apiserver
    /// itself), the proxy's own `credential`, identities with a UID passed through.
    fn token_reviewer(
        &self,
        ca_pem: String,
        credential: ClientAuth,
    ) -> Result<Arc<TokenReviewAuthenticator>, ConfigError> {
        let base = self.url.trim_end_matches('/');
        let mut config = TokenReviewConfig::new(
            KUBE_APISERVER_AUTHENTICATOR,
            format!("{base}/apis/authentication.k8s.io/v1/tokenreviews"),
        );
        config.ca_bundle_pem = Some(ca_pem);
        config.client_auth = credential;
        config.version = ReviewVersion::V1;
        config.uid_handling = UidHandling::PassThroughToken;
        config.cache.positive_ttl = TOKEN_REVIEW_TTL;
        let reviewer =
            TokenReviewAuthenticator::new(config).map_err(|e| invalid("upstream.tokenReview", e))?;
        Ok(Arc::new(reviewer))
    }
}

/// HTTP/2 streams per upstream connection before another is opened.
const MAX_H2_STREAMS: usize = 100;

/// Parses a PEM bundle into pingora's certificate type, refusing anything x509-parser cannot
/// read (pingora's own parser would panic on it).
fn certificates(pem: &[u8]) -> Result<Arc<[WrappedX509]>, String> {
    let ders = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if ders.is_empty() {
        return Err("no PEM certificate found".into());
    }
    ders.into_iter()
        .map(|der| {
            x509_parser::parse_x509_certificate(der.as_ref()).map_err(|e| e.to_string())?;
            Ok(WrappedX509::new(der.as_ref().to_vec(), |raw| {
                pingora::utils::tls::parse_x509(raw)
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests;
