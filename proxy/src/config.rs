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
    chain::{Chain, TokenAuthenticator},
    jwt::{AudienceMatchPolicy, ClaimMapping, JwtAuthenticator, JwtConfig},
    tokenreview::{TokenReviewAuthenticator, TokenReviewConfig},
    x509::X509Authenticator,
};
use serde::Deserialize;

use crate::{
    snapshot::{Snapshot, TokenFile, Upstream, UpstreamCredential},
    tls::ServingCert,
};

/// The file's top level.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticConfig {
    /// `host:port` the proxy listens on.
    pub listen: String,
    /// `host:port` of `/healthz`, `/readyz` and `/metrics`.
    #[serde(default)]
    pub operations_listen: Option<String>,
    /// The listener's certificate (PEM chain, leaf first) and key; re-read when they change.
    pub serving_certificate: CertFiles,
    /// kube-apiserver.
    pub upstream: UpstreamConfig,
    /// CA bundles whose client certificates identify users (CN = user, O = groups).
    #[serde(default)]
    pub client_certificate_ca_files: Vec<PathBuf>,
    /// JWT authenticators, tried in order.
    #[serde(default)]
    pub jwt_authenticators: Vec<JwtAuthenticatorConfig>,
    /// TokenReview webhooks, tried after the JWT authenticators.
    #[serde(default)]
    pub webhook_authenticators: Vec<WebhookAuthenticatorConfig>,
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
}

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

    /// Builds and validates the snapshot. Reads every referenced file; does no network IO.
    pub fn snapshot(&self) -> Result<Snapshot, ConfigError> {
        let client_certificates = if self.client_certificate_ca_files.is_empty() {
            None
        } else {
            let bundles = self
                .client_certificate_ca_files
                .iter()
                .map(|path| read_string(path))
                .collect::<Result<Vec<_>, _>>()?;
            let bundles: Vec<&str> = bundles.iter().map(String::as_str).collect();
            Some(
                X509Authenticator::new("client-certificate", &bundles, Duration::from_secs(60))
                    .map_err(|e| invalid("clientCertificateCaFiles", e))?,
            )
        };

        let mut authenticators = Vec::new();
        for (i, jwt) in self.jwt_authenticators.iter().enumerate() {
            let field = format!("jwtAuthenticators[{i}]");
            let mut config = JwtConfig::new(&jwt.name, &jwt.issuer, &jwt.audience);
            config.username = ClaimMapping::claim(&jwt.claims.username).into();
            config.groups = Some(ClaimMapping::claim(&jwt.claims.groups).into());
            config.audience_match_policy = Some(AudienceMatchPolicy::MatchAny);
            config.ca_bundle_pem = jwt.ca_file.as_deref().map(read_string).transpose()?;
            let authenticator = JwtAuthenticator::new(config).map_err(|e| invalid(&field, e))?;
            authenticators.push(TokenAuthenticator::Jwt(Box::new(authenticator)));
        }
        for (i, webhook) in self.webhook_authenticators.iter().enumerate() {
            let field = format!("webhookAuthenticators[{i}]");
            let mut config = TokenReviewConfig::new(&webhook.name, &webhook.endpoint);
            config.ca_bundle_pem = webhook.ca_file.as_deref().map(read_string).transpose()?;
            let authenticator = TokenReviewAuthenticator::new(config).map_err(|e| invalid(&field, e))?;
            authenticators.push(TokenAuthenticator::TokenReview(Box::new(authenticator)));
        }

        Ok(Snapshot {
            client_certificates,
            chain: Chain::new(authenticators),
            upstream: Arc::new(self.upstream.build()?),
        })
    }
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

        let ca = certificates(&read(&self.ca_file)?).map_err(|e| invalid("upstream.caFile", e))?;
        let credential = match (&self.token_file, &self.client_certificate) {
            (Some(path), None) => UpstreamCredential::TokenFile(
                TokenFile::open(path.clone()).map_err(|e| invalid("upstream.tokenFile", e))?,
            ),
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
        Ok(Upstream {
            address,
            sni: host,
            ca,
            credential,
            connect_timeout: Duration::from_secs(5),
            max_h2_streams: 100,
            h2_ping_interval: Duration::from_secs(30),
        })
    }
}

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
