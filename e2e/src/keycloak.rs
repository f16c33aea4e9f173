//! Keycloak, the real OIDC provider of the tests that need what Dex lacks — RFC 7009 token
//! revocation and introspection: its server distribution from Maven Central
//! (`scripts/build-components.sh keycloak`), run in development mode on loopback with TLS, an
//! in-memory database and a configuration file of its own, and a realm [`REALM`] created through
//! the admin REST API with a confidential client for the Supervisor (password grant allowed, a
//! `groups` claim from group membership) and the given users. Stopped on drop.
//!
//! Keycloak is also the tests' SAML 2.0 identity provider: [`Keycloak::create_saml_client`]
//! registers a service provider (the Supervisor's FederationDomain) in the realm, whose IdP
//! metadata is at [`Keycloak::saml_descriptor_url`]; [`Keycloak::fill_login_form`] logs in on
//! Keycloak's login page in a [`Browser`].

use std::{ffi::OsString, time::Duration};

use bytes::Bytes;
use selkie_oidc::https::{HttpsClient, TlsOptions};
use serde_json::{json, Value};

use crate::{
    browser::Browser, components::Components, dex::DexUser, pki::CertificateAuthority,
    process::ManagedProcess, HarnessError,
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
    /// The master realm's `admin` password (random; only in Keycloak's configuration file and
    /// here, never in a log or on a command line).
    admin_password: String,
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
        Self::start_as(users, "127.0.0.1").await
    }

    /// [`Keycloak::start`], with Keycloak's URLs (its issuer, its SAML endpoints) on `host`
    /// (`127.0.0.1` or `localhost`: it listens on 127.0.0.1 either way). `localhost` makes it
    /// another site than a server on 127.0.0.1 for the browser, as an identity provider is in
    /// production: what it sends the browser back with is cross-site.
    pub async fn start_as(users: &[DexUser], host: &str) -> Result<Self, HarnessError> {
        crate::install_crypto_provider();
        let components = Components::get()?;
        let dir = tempfile::Builder::new()
            .prefix("keycloak-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating Keycloak's directory", e))?;
        let port = crate::free_port()?;
        let base = format!("https://{host}:{port}");
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
                 http-port={http}\nhttp-management-port={management}\nhttps-certificate-file={cert}\n\
                 https-certificate-key-file={key}\nhostname={base}\n\
                 bootstrap-admin-username=admin\nbootstrap-admin-password={admin_password}\n",
                // Development mode binds its HTTP port even with HTTP disabled: a free one, so that
                // Keycloaks of tests running side by side do not collide on the default 8080.
                http = crate::free_port()?,
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
            admin_password,
        };
        keycloak.create_realm(users).await?;
        Ok(keycloak)
    }

    /// A fresh access token of the master realm's admin (they live a minute, so every
    /// administrative step gets its own).
    async fn admin_token(&self) -> Result<String, HarnessError> {
        let (status, answer) = self
            .form(
                &format!("{}/realms/master/protocol/openid-connect/token", self.base),
                &[
                    ("grant_type", "password"),
                    ("client_id", "admin-cli"),
                    ("username", "admin"),
                    ("password", self.admin_password.as_str()),
                ],
            )
            .await?;
        answer["access_token"]
            .as_str()
            .filter(|_| status == 200)
            .map(str::to_string)
            .ok_or_else(|| self.process.failure(format!("the admin login answered {status}")))
    }

    /// POSTs the JSON `body` to the admin REST API's `path` (under `/admin`) as the master
    /// realm's admin; fails, with Keycloak's answer, unless it answers 201 Created. `what` names
    /// the step in errors.
    async fn admin_create(&self, what: &str, path: &str, body: &Value) -> Result<(), HarnessError> {
        let admin_token = self.admin_token().await?;
        let authorization = http::HeaderValue::from_str(&format!("Bearer {admin_token}"))
            .map_err(|e| HarnessError::NotReady(format!("the admin token: {e}")))?;
        let response = self
            .client
            .send(
                http::Method::POST,
                &format!("{}/admin{path}", self.base),
                &[
                    (http::header::AUTHORIZATION, authorization),
                    (
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    ),
                ],
                Bytes::from(body.to_string()),
                1 << 20,
                Some(Duration::from_secs(60)),
            )
            .await
            .map_err(|e| HarnessError::NotReady(format!("{what}: {e}")))?;
        if response.status != 201 {
            return Err(self.process.failure(format!(
                "{what} answered {}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            )));
        }
        Ok(())
    }

    /// Creates [`REALM`] with the client and `users`, as the master realm's admin.
    async fn create_realm(&self, users: &[DexUser]) -> Result<(), HarnessError> {
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
        self.admin_create("creating the realm", "/realms", &realm).await
    }

    /// Registers a SAML 2.0 service provider in [`REALM`]: the client `sp_entity_id` (its SAML
    /// entity ID) whose assertion consumer service is `acs_url` (HTTP-POST binding). Keycloak
    /// signs both the response and its assertion (RSA-SHA256, exclusive C14N, the certificate in
    /// the signatures' KeyInfo) with the realm's key — the certificate of
    /// [`Keycloak::saml_descriptor_url`] — and accepts unsigned AuthnRequests from it (HTTP-Redirect
    /// or POST; their Issuer must be `sp_entity_id`, an AssertionConsumerServiceURL `acs_url`).
    /// The response always comes back with the HTTP-POST binding, to `acs_url`. The NameID is the
    /// username (format `urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified`, whatever the
    /// request asks for); the user's groups are in attributes named `groups` (the group names,
    /// not their paths), one `<Attribute Name="groups">` per group (Keycloak's "single group
    /// attribute" off). Keycloak's default client scope for SAML clients adds `Role` attributes.
    /// Fails if the client exists (409).
    ///
    /// The attribute names are those of Keycloak 26's `SamlConfigAttributes` and `SamlProtocol`
    /// (note `saml_force_name_id_format`, with underscores).
    pub async fn create_saml_client(&self, sp_entity_id: &str, acs_url: &str) -> Result<(), HarnessError> {
        let client = json!({
            "clientId": sp_entity_id,
            "name": "Selkie Supervisor (SAML)",
            "protocol": "saml",
            "enabled": true,
            // The SP-initiated login; the ACS is also where Keycloak checks an AuthnRequest's
            // AssertionConsumerServiceURL against.
            "standardFlowEnabled": true,
            "frontchannelLogout": false,
            "redirectUris": [acs_url],
            "attributes": {
                "saml.server.signature": "true",
                "saml.assertion.signature": "true",
                "saml.client.signature": "false",
                "saml.encrypt": "false",
                "saml.authnstatement": "true",
                "saml.force.post.binding": "true",
                "saml_name_id_format": "username",
                "saml_force_name_id_format": "true",
                "saml_assertion_consumer_url_post": acs_url,
                "saml.signature.algorithm": "RSA_SHA256",
                "saml_signature_canonicalization_method": "http://www.w3.org/2001/10/xml-exc-c14n#",
            },
            "protocolMappers": [{
                "name": "groups",
                "protocol": "saml",
                "protocolMapper": "saml-group-membership-mapper",
                "config": {
                    "attribute.name": "groups",
                    "attribute.nameformat": "Basic",
                    "full.path": "false",
                    "single": "false",
                },
            }],
        });
        self.admin_create(
            &format!("creating the SAML client {sp_entity_id}"),
            &format!("/realms/{REALM}/clients"),
            &client,
        )
        .await
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

    /// The realm's issuer, `https://<host>:<port>/realms/selkie`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The CA of Keycloak's serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// The realm's SAML 2.0 IdP metadata (an `EntityDescriptor` with the signing certificate
    /// and the SingleSignOnService endpoints),
    /// `https://<host>:<port>/realms/selkie/protocol/saml/descriptor`.
    pub fn saml_descriptor_url(&self) -> String {
        format!("{}/protocol/saml/descriptor", self.issuer)
    }

    /// The realm's SAML endpoint, the location of its SingleSignOnService for every binding
    /// (an HTTP-Redirect AuthnRequest is a GET of it), `https://<host>:<port>/realms/selkie/protocol/saml`.
    pub fn saml_sso_url(&self) -> String {
        format!("{}/protocol/saml", self.issuer)
    }

    /// Logs in as `username`/`password` on Keycloak's login page, where `browser` is (waiting
    /// for the form to appear): fills the form and submits it, and returns at once.
    pub async fn fill_login_form(
        browser: &Browser,
        username: &str,
        password: &str,
    ) -> Result<(), HarnessError> {
        browser
            .type_into("#kc-form-login input[name=username]", username)
            .await?;
        browser
            .type_into("#kc-form-login input[name=password]", password)
            .await?;
        browser.click("#kc-form-login #kc-login").await
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
