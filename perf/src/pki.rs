//! The benchmark PKI, generated fresh for every run: all keys ECDSA P-256 (rcgen's default).
//!
//! * `ca.crt` signs the serving certificates of the backend (`backend.*`) and of the proxies
//!   under test (`proxy.*`); clients trust it.
//! * `upstream-ca.crt` signs `upstream-client.*`, the proxies' own credential towards the
//!   backend (what kube-apiserver would trust); the backend requires it.
//! * `user-ca.crt` signs `user.*`, a Kubernetes-style client certificate (`CN` = user, one `O`
//!   per group) for the client-certificate scenario.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// OID of the X.520 organizationName attribute. rcgen keeps one value per `DnType` (STYLE.md
/// §0.3), so every `O` after the first goes in under a custom type with this same OID.
const ORGANIZATION_NAME: [u64; 4] = [2, 5, 4, 10];

/// The host names every serving certificate carries.
const SERVING_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// A certificate file and its PKCS#8 key file.
#[derive(Debug, Clone)]
pub struct CertPaths {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM PKCS#8 private key.
    pub key: PathBuf,
}

/// The files of one generated PKI.
#[derive(Debug, Clone)]
pub struct PerfPki {
    /// CA of every serving certificate.
    pub ca: PathBuf,
    /// The backend's serving certificate.
    pub backend: CertPaths,
    /// The serving certificate of the proxy under test (nginx or Selkie).
    pub proxy: CertPaths,
    /// CA the backend requires client certificates from.
    pub upstream_ca: PathBuf,
    /// The proxies' client certificate towards the backend.
    pub upstream_client: CertPaths,
    /// CA of user client certificates.
    pub user_ca: PathBuf,
    /// The user's client certificate.
    pub user: CertPaths,
}

fn ca(name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

fn write(dir: &Path, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn issue(
    dir: &Path,
    name: &str,
    mut params: CertificateParams,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> anyhow::Result<CertPaths> {
    let key = KeyPair::generate()?;
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let cert = params.signed_by(&key, issuer)?;
    Ok(CertPaths {
        cert: write(dir, &format!("{name}.crt"), &cert.pem())?,
        key: write(dir, &format!("{name}.key"), &key.serialize_pem())?,
    })
}

fn serving(dir: &Path, name: &str, issuer: &CertifiedIssuer<'static, KeyPair>) -> anyhow::Result<CertPaths> {
    let mut params = CertificateParams::new(SERVING_NAMES.map(String::from).to_vec())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    issue(dir, name, params, issuer)
}

fn client(
    dir: &Path,
    name: &str,
    user: &str,
    groups: &[String],
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> anyhow::Result<CertPaths> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    for (i, group) in groups.iter().enumerate() {
        let kind = if i == 0 {
            DnType::OrganizationName
        } else {
            DnType::CustomDnType(ORGANIZATION_NAME.to_vec())
        };
        params.distinguished_name.push(kind, group.as_str());
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    issue(dir, name, params, issuer)
}

impl PerfPki {
    /// Generates every certificate into `dir`; the user certificate names `user` and `groups`.
    pub fn generate(dir: &Path, user: &str, groups: &[String]) -> anyhow::Result<Self> {
        if groups.len() > 1 && groups[1..].contains(&groups[0]) {
            anyhow::bail!("the groups must be distinct");
        }
        let serving_ca = ca("selkie-perf serving CA")?;
        let upstream_ca = ca("selkie-perf upstream client CA")?;
        let user_ca = ca("selkie-perf user CA")?;
        Ok(Self {
            ca: write(dir, "ca.crt", &serving_ca.pem())?,
            backend: serving(dir, "backend", &serving_ca)?,
            proxy: serving(dir, "proxy", &serving_ca)?,
            upstream_ca: write(dir, "upstream-ca.crt", &upstream_ca.pem())?,
            upstream_client: client(dir, "upstream-client", "selkie-perf-proxy", &[], &upstream_ca)?,
            user_ca: write(dir, "user-ca.crt", &user_ca.pem())?,
            user: client(dir, "user", user, groups, &user_ca)?,
        })
    }
}
