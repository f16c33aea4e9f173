//! Keycloak, the real OIDC provider of the tests that need what Dex lacks — RFC 7009 token
//! revocation and introspection: its server distribution from Maven Central
//! (`scripts/build-components.sh keycloak`), run in development mode on loopback with TLS, an
//! in-memory database and a configuration file of its own, and a realm [`REALM`] created through
//! the admin REST API with a confidential client for the Supervisor (password grant allowed, a
//! `groups` claim from group membership) and the given users. Stopped on drop.

use std::{ffi::OsString, time::Duration};

use bytes::Bytes;
use selkie_oidc::https::{HttpsClient, TlsOptions};
use serde_json::{json, Value};

use crate::{
    components::Components, dex::DexUser, pki::CertificateAuthority, process::ManagedProcess, HarnessError,
};

/// The realm the users and the client are in.
pub const REALM: &str = "selkie";
/// The Supervisor's confidential client.
pub const CLIENT_ID: &str = "selkie-supervisor";
/// Its secret.
pub const CLIENT_SECRET: &str = "selkie-supervisor-secret";

/// A JVM start with Quarkus's first-run build on two busy cores takes a while.
const READY_TIMEOUT: Duration = Duration::from_secs(240);

/// A running Keycloak.
pub struct Keycloak {
    process: ManagedProcess,
    _dir: tempfile::TempDir,
    base: String,
    issuer: String,
    ca: CertificateAuthority,
    client: HttpsClient,
}

impl std::fmt::Debug for Keycloak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keycloak")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

impl Keycloak {
    /// Starts Keycloak on a free loopback port and creates the realm with `users` (login name
    /// and `email` = their email, in groups named as theirs). Returns once the realm's discovery
    /// document is served.
    pub async fn start(users: &[DexUser]) -> Result<Self, HarnessError> {
        crate::install_crypto_provider();
        let components = Components::get()?;
        let dir = tempfile::Builder::new()
            .prefix("keycloak-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating Keycloak's directory", e))?;
        let port = crate::free_port()?;
        let base = format!("https://127.0.0.1:{port}");
        let ca = CertificateAuthority::new("selkie-test-keycloak-ca")?;
        let serving = ca.issue_serving("keycloak", &["127.0.0.1", "localhost"])?;
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let admin_password = random_password()?;
        let config = dir.path().join("keycloak.conf");
        let write = |path: &std::path::Path, contents: &str| {
            std::fs::write(path, contents)
                .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
        };
        write(&cert, &serving.cert_pem)?;
        write(&key, &serving.key_pem)?;
        // The admin password stays in this file, off the command line and out of every log.
        write(
            &config,
            &format!(
                "db=dev-mem\nhttp-enabled=false\nhttp-host=127.0.0.1\nhttps-port={port}\n\
                 http-management-port={management}\nhttps-certificate-file={cert}\n\
                 https-certificate-key-file={key}\nhostname={base}\n\
                 bootstrap-admin-username=admin\nbootstrap-admin-password={admin_password}\n",
                management = crate::free_port()?,
                cert = cert.display(),
                key = key.display(),
            ),
        )?;
        let args = [
            OsString::from(format!("JAVA_HOME={}", components.keycloak_java_home.display())),
            components.keycloak.clone().into_os_string(),
            OsString::from(format!("--config-file={}", config.display())),
            OsString::from("start-dev"),
        ];
        let log = dir.path().join("keycloak.log");
        let mut process =
            ManagedProcess::spawn("keycloak", std::path::Path::new("/usr/bin/env"), &args, log)?;
        let client = HttpsClient::new(&TlsOptions {
            ca_pem: Some(ca.cert_pem().into_bytes()),
            ..TlsOptions::default()
        })
        .map_err(|e| HarnessError::Pki(e.to_string()))?;
        let master = format!("{base}/realms/master/.well-known/openid-configuration");
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            process.check_running("during start-up")?;
            let last = match client
                .get_json(&master, 64 * 1024, Some(Duration::from_secs(5)))
                .await
            {
                Ok(_) => break,
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(process.failure(format!(
                    "did not serve {master} within {READY_TIMEOUT:?} (last: {last})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let keycloak = Self {
            process,
            _dir: dir,
            issuer: format!("{base}/realms/{REALM}"),
            base,
            ca,
            client,
        };
        keycloak.create_realm(&admin_password, users).await?;
        Ok(keycloak)
    }

    /// Creates [`REALM`] with the client and `users`, as the master realm's admin.
    async fn create_realm(&self, admin_password: &str, users: &[DexUser]) -> Result<(), HarnessError> {
        let (status, answer) = self
            .form(
                &format!("{}/realms/master/protocol/openid-connect/token", self.base),
                &[
                    ("grant_type", "password"),
                    ("client_id", "admin-cli"),
                    ("username", "admin"),
                    ("password", admin_password),
                ],
            )
            .await?;
        let admin_token = answer["access_token"]
            .as_str()
            .filter(|_| status == 200)
            .ok_or_else(|| self.process.failure(format!("the admin login answered {status}")))?;
        let groups: std::collections::BTreeSet<&str> = users
            .iter()
            .flat_map(|user| user.groups.iter().map(String::as_str))
            .collect();
        let realm = json!({
            "realm": REALM,
            "enabled": true,
            "groups": groups.iter().map(|name| json!({"name": name})).collect::<Vec<_>>(),
            "users": users.iter().map(|user| json!({
                "username": user.email,
                "email": user.email,
                "emailVerified": true,
                "firstName": "Test",
                "lastName": "User",
                "enabled": true,
                // Imported users get no default roles, offline_access among them.
                "realmRoles": [format!("default-roles-{REALM}")],
                "credentials": [{"type": "password", "value": user.password, "temporary": false}],
                "groups": user.groups.iter().map(|group| format!("/{group}")).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "clients": [{
                "clientId": CLIENT_ID,
                "secret": CLIENT_SECRET,
                "enabled": true,
                "publicClient": false,
                "standardFlowEnabled": true,
                "directAccessGrantsEnabled": true,
                "redirectUris": ["*"],
                "protocolMappers": [{
                    "name": "groups",
                    "protocol": "openid-connect",
                    "protocolMapper": "oidc-group-membership-mapper",
                    "config": {"claim.name": "groups", "full.path": "false", "id.token.claim": "true",
                               "access.token.claim": "true", "userinfo.token.claim": "true"},
                }],
            }],
        });
        let authorization = http::HeaderValue::from_str(&format!("Bearer {admin_token}"))
            .map_err(|e| HarnessError::NotReady(format!("the admin token: {e}")))?;
        let response = self
            .client
            .send(
                http::Method::POST,
                &format!("{}/admin/realms", self.base),
                &[
                    (http::header::AUTHORIZATION, authorization),
                    (
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    ),
                ],
                Bytes::from(realm.to_string()),
                1 << 20,
                Some(Duration::from_secs(60)),
            )
            .await
            .map_err(|e| HarnessError::NotReady(format!("creating the realm: {e}")))?;
        if response.status != 201 {
            return Err(self.process.failure(format!(
                "creating the realm answered {}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            )));
        }
        Ok(())
    }

    /// POSTs `form` to `url`: the status and the JSON answer (`null` when it is not JSON).
    async fn form(&self, url: &str, form: &[(&str, &str)]) -> Result<(u16, Value), HarnessError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let response = self
            .client
            .send(
                http::Method::POST,
                url,
                &[(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-www-form-urlencoded"),
                )],
                Bytes::from(body),
                1 << 20,
                Some(Duration::from_secs(30)),
            )
            .await
            .map_err(|e| HarnessError::NotReady(format!("{url}: {e}")))?;
        Ok((
            response.status.as_u16(),
            serde_json::from_slice(&response.body).unwrap_or(Value::Null),
        ))
    }

    /// Whether Keycloak says `token` (issued to [`CLIENT_ID`]) is active: its RFC 7662
    /// introspection endpoint, as the client.
    pub async fn is_active(&self, token: &str) -> Result<bool, HarnessError> {
        let url = format!("{}/protocol/openid-connect/token/introspect", self.issuer);
        let (status, answer) = self
            .form(
                &url,
                &[
                    ("client_id", CLIENT_ID),
                    ("client_secret", CLIENT_SECRET),
                    ("token", token),
                ],
            )
            .await?;
        match answer["active"].as_bool() {
            Some(active) if status == 200 => Ok(active),
            _ => Err(HarnessError::NotReady(format!(
                "introspection answered {status}: {answer}"
            ))),
        }
    }

    /// The realm's issuer, `https://127.0.0.1:<port>/realms/selkie`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The CA of Keycloak's serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }
}

/// 24 random alphanumeric characters (from the kernel's random source).
fn random_password() -> Result<String, HarnessError> {
    use std::io::Read as _;
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|e| HarnessError::io("reading /dev/urandom", e))?;
    Ok(bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect())
}
