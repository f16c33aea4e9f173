//! Dex, the real OIDC provider of the JWT tests: TLS on loopback, in-memory storage (so every
//! start has fresh signing keys), static users with groups, and the password grant. Or, started
//! with [`Dex::start_ldap`], Dex whose users are those of a [`Slapd`], through Dex's own LDAP
//! connector (the password grant logs them in there).

use std::{
    ffi::OsString,
    net::TcpListener,
    path::PathBuf,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde::Deserialize;

use crate::{
    components::Components,
    ldap::{Slapd, BIND_DN, BIND_PASSWORD, GROUPS_BASE, USERS_BASE},
    pki::CertificateAuthority,
    process::ManagedProcess,
    HarnessError,
};

/// The OAuth client the tests use for the password grant.
pub const CLIENT_ID: &str = "selkie-e2e";
/// Its secret.
pub const CLIENT_SECRET: &str = "selkie-e2e-secret";
/// A public client like pinniped's `pinniped-cli`: no secret, PKCE, and (having no registered
/// redirect URIs) any `http://127.0.0.1:<port>/callback` redirect, as Dex allows for public clients.
pub const PUBLIC_CLIENT_ID: &str = "pinniped-cli";

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A static Dex user.
#[derive(Debug, Clone)]
pub struct DexUser {
    /// Login name and `email` claim.
    pub email: String,
    /// Password for the password grant.
    pub password: String,
    /// Stable id (`sub` is derived from it).
    pub user_id: String,
    /// `groups` claim.
    pub groups: Vec<String>,
}

impl DexUser {
    /// The tests' usual user: `pinny@example.com` (password `password123`) in the groups `ops`
    /// and `devs`.
    pub fn pinny() -> Self {
        Self {
            email: "pinny@example.com".into(),
            password: "password123".into(),
            user_id: "061d23d1-fe1e-4777-9ae9-59cd12abeaab".into(),
            groups: vec!["ops".into(), "devs".into()],
        }
    }
}

/// A running Dex. Stopped on drop.
#[derive(Debug)]
pub struct Dex {
    process: Option<ManagedProcess>,
    dir: tempfile::TempDir,
    config: PathBuf,
    issuer: String,
    ca: CertificateAuthority,
    /// Trusts only `ca`; built once, used for readiness checks and token requests.
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// What Dex's token endpoint returns.
#[derive(Debug, Clone, Deserialize)]
pub struct Tokens {
    /// The ID token, a JWT signed by Dex.
    pub id_token: String,
    /// The access token.
    pub access_token: String,
    /// The refresh token, when `offline_access` was granted.
    #[serde(default)]
    pub refresh_token: Option<String>,
}

impl Dex {
    /// Starts Dex with `users`, serving `https://127.0.0.1:<free port>/dex`, and waits until its
    /// discovery document answers.
    pub async fn start(users: &[DexUser]) -> Result<Dex, HarnessError> {
        Self::start_with_redirects(users, &[]).await
    }

    /// [`Dex::start`], with `redirect_uris` also registered for the confidential client
    /// [`CLIENT_ID`] (a Supervisor's `<issuer>/callback`, for browser logins through it).
    pub async fn start_with_redirects(
        users: &[DexUser],
        redirect_uris: &[String],
    ) -> Result<Dex, HarnessError> {
        let logins = serde_json::json!({
            "enablePasswordDB": true,
            "staticPasswords": static_passwords(users)?,
        });
        Self::start_configured("127.0.0.1", redirect_uris, "local", logins).await
    }

    /// [`Dex::start_with_redirects`], serving on `host` instead of loopback: pods on a node
    /// ([`crate::node`]) reach Dex at the host's address.
    pub async fn start_on(
        host: std::net::IpAddr,
        users: &[DexUser],
        redirect_uris: &[String],
    ) -> Result<Dex, HarnessError> {
        let logins = serde_json::json!({
            "enablePasswordDB": true,
            "staticPasswords": static_passwords(users)?,
        });
        Self::start_configured(&host.to_string(), redirect_uris, "local", logins).await
    }

    /// Dex whose only users are `slapd`'s, through its LDAP connector `ldap` (the password
    /// grant's connector): over `ldaps://`, trusting slapd's CA, bound as [`BIND_DN`]; users by
    /// `uid` under [`USERS_BASE`] (id `uidNumber`, email `mail`, name `cn`), groups by `member` DN
    /// under [`GROUPS_BASE`] named by `cn`. No password database.
    pub async fn start_ldap(slapd: &Slapd) -> Result<Dex, HarnessError> {
        use base64::{engine::general_purpose::STANDARD, Engine as _};
        let logins = serde_json::json!({
            "connectors": [{
                "type": "ldap", "id": "ldap", "name": "OpenLDAP",
                "config": {
                    "host": slapd.ldaps_host(),
                    // A []byte in Dex's Go config: base64 in JSON.
                    "rootCAData": STANDARD.encode(slapd.ca_pem()),
                    "bindDN": BIND_DN, "bindPW": BIND_PASSWORD,
                    "usernamePrompt": "Username",
                    "userSearch": {
                        "baseDN": USERS_BASE, "filter": "(objectClass=posixAccount)",
                        "username": "uid", "idAttr": "uidNumber", "emailAttr": "mail", "nameAttr": "cn",
                    },
                    "groupSearch": {
                        "baseDN": GROUPS_BASE, "filter": "(objectClass=groupOfNames)",
                        "userMatchers": [{"userAttr": "DN", "groupAttr": "member"}], "nameAttr": "cn",
                    },
                },
            }],
        });
        Self::start_configured("127.0.0.1", &[], "ldap", logins).await
    }

    /// Starts Dex with `logins` (the configuration's keys for where users come from) added to
    /// the configuration every start shares, `password_connector` the connector of the password
    /// grant, and `redirect_uris` registered for [`CLIENT_ID`] besides the usual one; serving on
    /// `host` (an IP address).
    async fn start_configured(
        host: &str,
        redirect_uris: &[String],
        password_connector: &str,
        logins: serde_json::Value,
    ) -> Result<Dex, HarnessError> {
        crate::install_crypto_provider();
        let components = Components::get()?;
        let dir = tempfile::Builder::new()
            .prefix("dex-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating Dex's directory", e))?;
        let port = TcpListener::bind((host, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| HarnessError::io("finding a free port for Dex", e))?
            .port();
        let issuer = format!("https://{host}:{port}/dex");
        let ca = CertificateAuthority::new("selkie-test-dex-ca")?;
        let serving = ca.issue_serving("dex", &[host, "127.0.0.1", "localhost"])?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let write = |path: &PathBuf, contents: &str| {
            std::fs::write(path, contents)
                .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
        };
        write(&cert, &serving.cert_pem)?;
        write(&key, &serving.key_pem)?;
        // JSON is YAML: Dex reads it as its config file.
        let mut config_doc = serde_json::json!({
            "issuer": issuer,
            "storage": {"type": "memory"},
            "web": {"https": format!("{host}:{port}"), "tlsCert": cert, "tlsKey": key},
            "oauth2": {"skipApprovalScreen": true, "passwordConnector": password_connector},
            "staticClients": [{
                "id": CLIENT_ID, "secret": CLIENT_SECRET, "name": "Selkie e2e",
                "redirectURIs": std::iter::once("http://127.0.0.1/callback".to_string())
                    .chain(redirect_uris.iter().cloned())
                    .collect::<Vec<_>>(),
            }, {
                "id": PUBLIC_CLIENT_ID, "public": true, "name": "Pinniped CLI",
            }],
            "logger": {"level": "info"},
        });
        for (key, value) in logins.as_object().into_iter().flatten() {
            config_doc[key] = value.clone();
        }
        let config = dir.path().join("config.yaml");
        write(&config, &config_doc.to_string())?;
        let client = https_client(&ca)?;
        let mut dex = Dex {
            process: None,
            dir,
            config,
            issuer,
            ca,
            client,
        };
        dex.launch(components).await?;
        Ok(dex)
    }

    async fn launch(&mut self, components: &Components) -> Result<(), HarnessError> {
        let args = [OsString::from("serve"), self.config.clone().into_os_string()];
        let log = self.dir.path().join("dex.log");
        let mut process = ManagedProcess::spawn("dex", &components.dex, &args, log)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        let discovery = format!("{}/.well-known/openid-configuration", self.issuer);
        loop {
            process.check_running("during start-up")?;
            let last = match self.get(&discovery).await {
                Ok((StatusCode::OK, _)) => break,
                Ok((status, _)) => format!("discovery answered {status}"),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(process.failure(format!(
                    "did not serve its discovery document within {READY_TIMEOUT:?} (last check: {last})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.process = Some(process);
        Ok(())
    }

    /// Stops Dex (SIGTERM, SIGKILL after 10 s) without blocking the runtime's thread: its port
    /// refuses connections (an identity provider that is down) until [`Dex::restart`] starts it
    /// again. Nothing to do when it is stopped already.
    pub async fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop_async(Duration::from_secs(10)).await;
        }
    }

    /// Stops Dex and starts it again on the same port with the same users. Its storage is in
    /// memory, so it comes back with new signing keys: tokens it issued before are signed by a key
    /// it no longer publishes.
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
        self.launch(Components::get()?).await
    }

    /// Stops Dex and starts it again on the same port with `users` instead (a user removed from
    /// the identity provider). Its storage is in memory, so every refresh token it issued before is
    /// unknown to it afterwards.
    pub async fn restart_with_users(&mut self, users: &[DexUser]) -> Result<(), HarnessError> {
        let text = std::fs::read_to_string(&self.config)
            .map_err(|e| HarnessError::io("reading Dex's configuration", e))?;
        let mut config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| HarnessError::NotReady(format!("Dex's configuration: {e}")))?;
        config["staticPasswords"] = serde_json::Value::Array(static_passwords(users)?);
        std::fs::write(&self.config, config.to_string())
            .map_err(|e| HarnessError::io("writing Dex's configuration", e))?;
        self.restart().await
    }

    /// The issuer URL, `https://<host>:<port>/dex` (the host is 127.0.0.1 unless started with
    /// [`Dex::start_on`]).
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The CA that signed Dex's serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// The process id of the running Dex (for its CPU time in `/proc`), `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ManagedProcess::pid)
    }

    /// Logs `email` in with the password grant, asking for the `openid email profile groups`
    /// scopes. A refused login is an error carrying Dex's answer.
    pub async fn password_grant(&self, email: &str, password: &str) -> Result<Tokens, HarnessError> {
        self.password_grant_with_scope(email, password, "openid email profile groups")
            .await
    }

    /// [`Dex::password_grant`] asking for `scope` (space-separated; with `offline_access` Dex
    /// also issues a refresh token).
    pub async fn password_grant_with_scope(
        &self,
        email: &str,
        password: &str,
        scope: &str,
    ) -> Result<Tokens, HarnessError> {
        let form = [
            ("grant_type", "password"),
            ("username", email),
            ("password", password),
            ("scope", scope),
        ];
        self.token_request(&form, &format!("the password grant for {email}"))
            .await
    }

    /// The refresh grant of the confidential client [`CLIENT_ID`] with `refresh_token` (Dex
    /// rotates it: the answer carries the next one). A refused refresh is an error carrying Dex's
    /// answer.
    pub async fn refresh_grant(&self, refresh_token: &str) -> Result<Tokens, HarnessError> {
        let form = [("grant_type", "refresh_token"), ("refresh_token", refresh_token)];
        self.token_request(&form, "the refresh grant").await
    }

    /// POSTs `form` with the confidential client's credentials to the token endpoint; `what`
    /// names the grant in errors.
    async fn token_request(&self, form: &[(&str, &str)], what: &str) -> Result<Tokens, HarnessError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .append_pair("client_id", CLIENT_ID)
            .append_pair("client_secret", CLIENT_SECRET)
            .finish();
        let request = Request::post(format!("{}/token", self.issuer))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| HarnessError::kube("building a token request", e))?;
        let (status, body) = self
            .send(request)
            .await
            .map_err(|e| HarnessError::kube("Dex token request", e))?;
        if status != StatusCode::OK {
            let problem = format!("refused {what}: {status} {}", String::from_utf8_lossy(&body));
            return Err(match &self.process {
                Some(process) => process.failure(problem),
                None => HarnessError::kube("Dex token request", problem),
            });
        }
        serde_json::from_slice(&body).map_err(|e| HarnessError::kube("reading Dex's token response", e))
    }

    async fn get(&self, url: &str) -> Result<(StatusCode, Bytes), String> {
        let request = Request::get(url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        self.send(request).await
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String> {
        let response = tokio::time::timeout(Duration::from_secs(10), self.client.request(request))
            .await
            .map_err(|_| "no answer within 10s".to_string())?
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
}

/// An HTTPS client that trusts only `ca`.
/// Dex's `staticPasswords` entries for `users` (bcrypt hashes).
fn static_passwords(users: &[DexUser]) -> Result<Vec<serde_json::Value>, HarnessError> {
    users
        .iter()
        .map(|user| {
            let hash =
                bcrypt::hash(&user.password, 10).map_err(|e| HarnessError::Pki(format!("bcrypt: {e}")))?;
            Ok(serde_json::json!({
                "email": user.email, "username": user.email, "userID": user.user_id,
                "hash": hash, "groups": user.groups,
            }))
        })
        .collect()
}

fn https_client(
    ca: &CertificateAuthority,
) -> Result<Client<HttpsConnector<HttpConnector>, Full<Bytes>>, HarnessError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    let der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes())
        .map_err(|e| HarnessError::Pki(format!("reading back Dex's CA: {e}")))?;
    roots
        .add(der)
        .map_err(|e| HarnessError::Pki(format!("trusting Dex's CA: {e}")))?;
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}
