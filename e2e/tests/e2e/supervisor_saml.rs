//! SAML 2.0 through the Supervisor, on real components: Keycloak (run from its Maven Central
//! distribution) as the SAML identity provider, the Supervisor as the service provider of a
//! FederationDomain (entity ID `<issuer>/saml/metadata`, assertion consumer service
//! `<issuer>/saml/acs`, HTTP-POST binding) with a `SAMLIdentityProvider` reading Keycloak's IdP
//! metadata from its descriptor URL, headless Chromium as the user's browser, and the real kubectl
//! running `selkie login oidc` as its exec credential plugin.
//!
//! * A user logs in through Keycloak's login form and reaches a cluster as their Keycloak username
//!   (the NameID) with their Keycloak groups (the `groups` attribute), with the kubeconfig
//!   `selkie get kubeconfig` wrote.
//! * The assertion consumer service refuses a response whose signed content was altered, one
//!   whose signatures were removed, and a genuine response posted a second time (a replay).

use std::time::Duration;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use selkie_e2e::{
    browser::Browser,
    dex::DexUser,
    keycloak::Keycloak,
    pinniped_cli::{
        authorize_url, jwt_claims, param, redirected, split_issuer, token, REDIRECT, STATE, VERIFIER,
    },
    supervisor::{Supervisor, Upstream},
    Cluster,
};
use selkie_oidc::https::{HttpsClient, Response};
use serde_json::{json, Value};

use crate::{
    supervisor_ldap::{get_kubeconfig, groups},
    supervisor_login::{cli_says_logged_in, cluster_trusting, opened_url, recording_browser},
};

const IDP_NAME: &str = "Keycloak SAML";
/// The SAMLIdentityProvider's name.
const IDP_RESOURCE: &str = "keycloak-saml";
const PASSWORD: &str = "seal-of-approval";
/// The API group of Selkie's own identity-provider kinds.
const SELKIE_IDP_GROUP: &str = "idp.supervisor.selkie.dev";

/// The SAMLIdentityProvider `name` for `keycloak`'s realm: its metadata from Keycloak's descriptor
/// URL (fetched trusting Keycloak's CA), the username from the NameID (no `username` claim), the
/// groups from the `groups` attribute.
struct KeycloakSaml<'a> {
    name: &'a str,
    keycloak: &'a Keycloak,
}

impl Upstream for KeycloakSaml<'_> {
    fn name(&self) -> &str {
        self.name
    }

    fn kind(&self) -> &str {
        "SAMLIdentityProvider"
    }

    fn api_group(&self) -> &str {
        SELKIE_IDP_GROUP
    }

    fn manifests(&self, namespace: &str) -> String {
        format!(
            r#"apiVersion: {SELKIE_IDP_GROUP}/v1alpha1
kind: SAMLIdentityProvider
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  idp:
    metadataURL: {metadata}
    tls: {{certificateAuthorityData: {ca}}}
  claims: {{groups: groups}}
  allowedClockSkew: 90s
"#,
            name = self.name,
            metadata = self.keycloak.saml_descriptor_url(),
            ca = B64.encode(self.keycloak.ca_pem()),
        )
    }
}

/// One test's world: a namespace of the shared cluster, Keycloak with the user
/// `<namespace>@example.com` (password [`PASSWORD`]) in `groups` and a SAML client for the
/// Supervisor's FederationDomain, and the Supervisor serving it with the SAMLIdentityProvider
/// [`IDP_RESOURCE`] as [`IDP_NAME`], once that provider reports Ready.
struct SamlWorld {
    cluster: &'static Cluster,
    namespace: String,
    email: String,
    keycloak: Keycloak,
    supervisor: Supervisor,
}

impl SamlWorld {
    async fn start(prefix: &str, groups: &[&str]) -> anyhow::Result<Self> {
        let cluster = Cluster::shared().await?;
        let client = cluster.client().await?;
        let namespace = cluster.create_namespace(&client, prefix).await?;
        let email = format!("{namespace}@example.com");
        // Keycloak on `localhost`, the Supervisor on 127.0.0.1: two sites, so Keycloak's POST to
        // the assertion consumer service is cross-site, as it is in production (the browser sends
        // no `SameSite=Lax` cookie with it).
        let keycloak = Keycloak::start_as(
            &[DexUser {
                email: email.clone(),
                password: PASSWORD.into(),
                user_id: format!("id-{namespace}"),
                groups: groups.iter().map(|group| group.to_string()).collect(),
            }],
            "localhost",
        )
        .await?;
        // The service provider's names follow from the issuer, known before the Supervisor starts.
        let port = selkie_e2e::free_port()?;
        let issuer = Supervisor::issuer_for(port, &namespace);
        keycloak
            .create_saml_client(&entity_id(&issuer), &acs_url(&issuer))
            .await?;
        let idp = KeycloakSaml {
            name: IDP_RESOURCE,
            keycloak: &keycloak,
        };
        // Applies the SAMLIdentityProvider and a FederationDomain listing it, and returns once the
        // identity-provider discovery lists it.
        let supervisor = Supervisor::start_with(cluster, &namespace, &idp, IDP_NAME, port, json!({})).await?;
        let world = Self {
            cluster,
            namespace,
            email,
            keycloak,
            supervisor,
        };
        world.wait_until_ready().await?;
        Ok(world)
    }

    /// Waits (60 s at most) until the SAMLIdentityProvider's phase is Ready with its metadata
    /// valid: Keycloak's descriptor fetched over TLS and understood.
    async fn wait_until_ready(&self) -> anyhow::Result<Value> {
        selkie_e2e::eventually(Duration::from_secs(60), || async {
            let idp = self.identity_provider().await?;
            let status = &idp["status"];
            anyhow::ensure!(status["phase"] == "Ready", "not Ready: {status}");
            let metadata = selkie_e2e::crds::condition(&idp, "MetadataValid");
            anyhow::ensure!(
                metadata["status"] == "True",
                "MetadataValid is not True: {status}"
            );
            let failing: Vec<&Value> = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|condition| condition["status"] == "False")
                .collect();
            anyhow::ensure!(failing.is_empty(), "failing conditions: {failing:?}");
            Ok(idp)
        })
        .await
        .map_err(|e| crate::with_log(e, self.supervisor.log()))
    }

    /// The SAMLIdentityProvider [`IDP_RESOURCE`] as `kubectl get -o json` shows it.
    async fn identity_provider(&self) -> anyhow::Result<Value> {
        let resource = format!("samlidentityprovider.{SELKIE_IDP_GROUP}");
        let shown = self
            .cluster
            .kubectl()
            .run(&[
                "get",
                &resource,
                IDP_RESOURCE,
                "-n",
                &self.namespace,
                "-o",
                "json",
            ])
            .await?;
        Ok(serde_json::from_str(&shown)?)
    }
}

/// The Supervisor's SAML entity ID for the FederationDomain at `issuer`.
fn entity_id(issuer: &str) -> String {
    format!("{issuer}/saml/metadata")
}

/// The Supervisor's assertion consumer service for the FederationDomain at `issuer`.
fn acs_url(issuer: &str) -> String {
    format!("{issuer}/saml/acs")
}

#[tokio::test]
async fn a_saml_login_through_keycloak_reaches_the_cluster_as_the_keycloak_user_with_their_groups(
) -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let world = SamlWorld::start("supervisor-saml", &["seals", "pups"]).await?;
    let (supervisor, keycloak, email) = (&world.supervisor, &world.keycloak, world.email.as_str());
    let issuer = supervisor.issuer().to_string();
    let http = supervisor.client()?;

    // The identity-provider discovery offers it as a `saml` provider with the browser flow only.
    let discovery: Value = serde_json::from_slice(
        &http
            .get_json(
                &format!("{issuer}/v1alpha1/pinniped_identity_providers"),
                1 << 16,
                Some(Duration::from_secs(10)),
            )
            .await?,
    )?;
    let listed = discovery["pinniped_identity_providers"]
        .as_array()
        .and_then(|idps| idps.iter().find(|idp| idp["name"] == IDP_NAME))
        .ok_or_else(|| anyhow::anyhow!("{IDP_NAME} is not listed: {discovery}"))?;
    anyhow::ensure!(
        listed["type"] == "saml" && listed["flows"] == json!(["browser_authcode"]),
        "{discovery}"
    );

    // The service provider's metadata is served at its entity ID and names the ACS (HTTP-POST).
    let metadata = http
        .send(
            http::Method::GET,
            &entity_id(&issuer),
            &[],
            Bytes::new(),
            1 << 20,
            Some(Duration::from_secs(10)),
        )
        .await?;
    let metadata_xml = String::from_utf8_lossy(&metadata.body);
    for expected in [
        format!("entityID=\"{}\"", entity_id(&issuer)),
        "AssertionConsumerService".to_string(),
        "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST".to_string(),
        format!("Location=\"{}\"", acs_url(&issuer)),
    ] {
        anyhow::ensure!(
            metadata.status == 200 && metadata_xml.contains(&expected),
            "{expected} missing from the SP metadata ({}): {metadata_xml}",
            metadata.status
        );
    }

    // A cluster trusting the FederationDomain's tokens for its own audience (no Concierge).
    const AUDIENCE: &str = "saml-cluster";
    let dir = tempfile::Builder::new().prefix("selkie-saml-").tempdir()?;
    let member = cluster_trusting(supervisor, AUDIENCE, dir.path()).await?;

    // `selkie get kubeconfig` discovers the SAML provider and its browser flow.
    let output = get_kubeconfig(
        &selkie,
        &member,
        supervisor,
        &[
            format!("--oidc-request-audience={AUDIENCE}"),
            format!(
                "--oidc-session-cache={}",
                dir.path().join("sessions.yaml").display()
            ),
            format!(
                "--credential-cache={}",
                dir.path().join("credentials.yaml").display()
            ),
            "--timeout=60s".into(),
        ],
    )
    .await?;
    anyhow::ensure!(
        output.status.success(),
        "selkie get kubeconfig: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        supervisor.log()
    );
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_slice(&output.stdout)?;
    let exec = &mut kubeconfig["users"][0]["user"]["exec"];
    let args: Vec<String> = serde_json::from_value(serde_json::to_value(&exec["args"])?)?;
    for expected in [
        format!("--upstream-identity-provider-name={IDP_NAME}"),
        "--upstream-identity-provider-type=saml".into(),
        format!("--issuer={issuer}"),
        format!("--request-audience={AUDIENCE}"),
    ] {
        anyhow::ensure!(args.contains(&expected), "{expected} missing from {args:?}");
    }
    anyhow::ensure!(
        args.iter()
            .filter_map(|arg| arg.strip_prefix("--upstream-identity-provider-flow="))
            .all(|flow| flow == "browser_authcode"),
        "not the browser flow: {args:?}"
    );
    // The plugin opens "the browser" with a script that records the URL for Chromium.
    let urls = dir.path().join("browser-urls");
    let script = recording_browser(dir.path(), "browser.sh", &urls)?;
    exec["env"] = serde_yaml::to_value(json!([{"name": "BROWSER", "value": script.display().to_string()}]))?;
    let kubeconfig_path = dir.path().join("saml.kubeconfig");
    std::fs::write(&kubeconfig_path, serde_yaml::to_string(&kubeconfig)?)?;
    let kubectl = member.kubectl().with_kubeconfig(&kubeconfig_path);

    // kubectl runs the plugin, which opens the browser at the Supervisor; the Supervisor sends it
    // to Keycloak with an AuthnRequest (HTTP-Redirect binding), Keycloak's login form takes the
    // password, Keycloak's page POSTs the signed response to the ACS, and the Supervisor hands
    // the code to the CLI's listener.
    let browser = Browser::start().await?;
    let login = async {
        let url = opened_url(&urls).await?;
        anyhow::ensure!(url.starts_with(&format!("{issuer}/oauth2/authorize?")), "{url}");
        browser.goto(&url).await?;
        let at = browser.current_url().await?;
        anyhow::ensure!(
            at.starts_with(&format!("{}?", keycloak.saml_sso_url())) && at.contains("SAMLRequest="),
            "not sent to Keycloak's SAML endpoint with an AuthnRequest: {at}"
        );
        // SAML's bindings allow a RelayState of at most 80 bytes (§3.4.3): some IdPs refuse more.
        let query = at.split_once('?').map(|(_, query)| query).unwrap_or_default();
        let relay_state = form_urlencoded::parse(query.as_bytes())
            .find(|(name, _)| name == "RelayState")
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        anyhow::ensure!(
            !relay_state.is_empty() && relay_state.len() <= 80,
            "the RelayState is missing or longer than 80 bytes: {relay_state}"
        );
        Keycloak::fill_login_form(&browser, email, PASSWORD).await?;
        cli_says_logged_in(&browser).await?;
        Ok(())
    };
    // kube-apiserver fetches the issuer's keys in the background after it starts: the first
    // answer may be a 401, after which kubectl runs the plugin again (with the cached session).
    let whoami = crate::eventually(Duration::from_secs(90), || async {
        let out = kubectl.run(&["auth", "whoami", "-o", "json"]).await?;
        Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
    });
    let (user, logged_in) = tokio::join!(whoami, login);
    logged_in.map_err(|e| crate::with_log(e, supervisor.log()))?;
    let user = user.map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == email, "{user}");
    let mut user_groups = groups(&user);
    user_groups.sort_unstable();
    anyhow::ensure!(user_groups == ["pups", "seals"], "{user}");

    // One login: the next call uses the cached credential, no browser.
    let again = kubectl.run(&["auth", "whoami", "-o", "json"]).await?;
    anyhow::ensure!(
        serde_json::from_str::<Value>(&again)?["status"]["userInfo"]["username"] == email,
        "{again}"
    );
    let opened = std::fs::read_to_string(&urls)?;
    anyhow::ensure!(
        opened.lines().count() == 1,
        "more than one browser login: {opened}"
    );

    let log = supervisor.log();
    anyhow::ensure!(!log.contains(PASSWORD), "the Supervisor logged the password");
    Ok(())
}

/// What Keycloak's HTTP-POST binding page holds for the Supervisor after a login: the form's
/// target, the SAML response (base64) and the RelayState, with the Supervisor's state cookie of
/// the login (`name=value`).
struct CapturedResponse {
    action: String,
    saml_response: String,
    relay_state: String,
    cookie: String,
}

/// Starts a browser login at the Supervisor as the browser would, with the test's own HTTPS client
/// (which gets the login's state cookie a browser would keep), and goes through Keycloak in
/// `browser` —
/// whose pages run no scripts ([`Browser::set_scripts_enabled`]) — up to Keycloak's HTTP-POST
/// binding page, logging in on Keycloak's form when it is shown (Keycloak's own SSO session skips
/// it after the first login). That page normally submits its form on load; without scripts it
/// stays, and the form is read from the page instead.
async fn capture_response(
    http: &HttpsClient,
    authorize: &str,
    browser: &Browser,
    keycloak: &Keycloak,
    email: &str,
) -> anyhow::Result<CapturedResponse> {
    let started = http
        .send(
            http::Method::GET,
            authorize,
            &[],
            Bytes::new(),
            1 << 20,
            Some(Duration::from_secs(30)),
        )
        .await?;
    anyhow::ensure!(
        started.status.is_redirection(),
        "the authorization request answered {}: {:?}",
        started.status,
        started.body
    );
    let location = started
        .headers
        .get(http::header::LOCATION)
        .ok_or_else(|| anyhow::anyhow!("a redirect without a Location"))?
        .to_str()?
        .to_string();
    anyhow::ensure!(
        location.starts_with(&format!("{}?", keycloak.saml_sso_url())) && location.contains("SAMLRequest="),
        "not sent to Keycloak with an AuthnRequest: {location}"
    );
    let cookie = started
        .headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .map(|value| value.split(';').next().unwrap_or_default().to_string())
        .find(|cookie| cookie.starts_with("__Host-selkie-saml-"))
        .ok_or_else(|| anyhow::anyhow!("no SAML state cookie: {:?}", started.headers))?;

    browser.goto(&location).await?;
    // Either Keycloak's login form or, with Keycloak's SSO session, its POST binding page.
    let post_form = "form:has(input[name=SAMLResponse])";
    let first = browser
        .property(&format!("form#kc-form-login, {post_form}"), "id")
        .await?;
    if first == "kc-form-login" {
        Keycloak::fill_login_form(browser, email, PASSWORD).await?;
    }
    let text = |value: Value| value.as_str().unwrap_or_default().to_string();
    let saml_response = text(
        browser
            .property(&format!("{post_form} input[name=SAMLResponse]"), "value")
            .await?,
    );
    let relay_state = text(
        browser
            .property(&format!("{post_form} input[name=RelayState]"), "value")
            .await?,
    );
    let action = text(browser.property(post_form, "action").await?);
    anyhow::ensure!(
        !saml_response.is_empty() && !relay_state.is_empty(),
        "Keycloak's POST binding page has no SAMLResponse or RelayState"
    );
    Ok(CapturedResponse {
        action,
        saml_response,
        relay_state,
        cookie,
    })
}

/// The CLI's authorization request to the FederationDomain at `issuer` for the SAML provider,
/// and a browser whose pages run no scripts, to [`capture_response`] with.
async fn capturing(issuer: &str) -> anyhow::Result<(String, Browser)> {
    let (base, path) = split_issuer(issuer);
    let authorize = authorize_url(
        &base,
        &path,
        &["pinniped_idp_name"],
        &[("pinniped_idp_name", IDP_NAME)],
    );
    let browser = Browser::start().await?;
    browser.set_scripts_enabled(false).await?;
    Ok((authorize, browser))
}

/// POSTs `saml_response` (base64) and `relay_state` to the assertion consumer service `acs` with
/// the login's state cookie `cookie`, as the browser would: the answer, whatever it is (redirects are not
/// followed).
async fn post_to_acs(
    http: &HttpsClient,
    acs: &str,
    cookie: &str,
    saml_response: &str,
    relay_state: &str,
) -> anyhow::Result<Response> {
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("SAMLResponse", saml_response)
        .append_pair("RelayState", relay_state)
        .finish();
    Ok(http
        .send(
            http::Method::POST,
            acs,
            &[
                (
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/x-www-form-urlencoded"),
                ),
                (http::header::COOKIE, http::HeaderValue::from_str(cookie)?),
            ],
            Bytes::from(body),
            1 << 20,
            Some(Duration::from_secs(30)),
        )
        .await?)
}

/// Why the ACS refused a response, lowercased. A refusal is a client error (4xx) whose body says
/// why, or an OAuth error sent back to the client's redirect URI (`error`, no `code`) whose
/// `error_description` says why. Fails if the ACS accepted the response (a code for the client,
/// or any other success) or failed in another way (5xx).
fn refusal(response: &Response) -> anyhow::Result<String> {
    let body = String::from_utf8_lossy(&response.body).into_owned();
    if response.status.is_client_error() {
        return Ok(body.to_lowercase());
    }
    if response.status.is_redirection() {
        let location = response
            .headers
            .get(http::header::LOCATION)
            .and_then(|location| location.to_str().ok())
            .unwrap_or_default();
        if let Some(query) = location.strip_prefix(&format!("{REDIRECT}?")) {
            let params: Vec<(String, String)> =
                form_urlencoded::parse(query.as_bytes()).into_owned().collect();
            anyhow::ensure!(
                param(&params, "code").is_none(),
                "accepted: the client got a code ({location})"
            );
            if let Some(error) = param(&params, "error") {
                let description = param(&params, "error_description").unwrap_or_default();
                return Ok(format!("{error}: {description}").to_lowercase());
            }
        }
        anyhow::bail!("not refused: redirected to {location}");
    }
    anyhow::bail!("not refused: {} {body}", response.status)
}

/// The XML of a base64 SAML response (HTTP-POST binding: base64, not deflated).
fn decode(saml_response: &str) -> anyhow::Result<String> {
    let compact: String = saml_response.split_whitespace().collect();
    Ok(String::from_utf8(B64.decode(compact)?)?)
}

/// `xml` without its XML signatures — every `<prefix:Signature …>…</prefix:Signature>` element,
/// whatever its namespace prefix (signatures do not nest) — and how many there were.
fn without_signatures(xml: &str) -> (String, usize) {
    let mut kept = String::with_capacity(xml.len());
    let mut rest = xml;
    let mut removed = 0;
    while let Some(open) = rest.find('<') {
        let tag = &rest[open + 1..];
        let name_length = tag
            .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
            .unwrap_or(tag.len());
        let name = &tag[..name_length];
        if name.rsplit(':').next() == Some("Signature") {
            let close = format!("</{name}>");
            if let Some(end) = rest[open..].find(&close) {
                kept.push_str(&rest[..open]);
                rest = &rest[open + end + close.len()..];
                removed += 1;
                continue;
            }
        }
        kept.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
    }
    kept.push_str(rest);
    (kept, removed)
}

/// The login the code in `accepted` (the ACS's redirect to the client) gives: the token
/// response, after redeeming the code with the PKCE verifier.
async fn redeem(http: &HttpsClient, issuer: &str, accepted: &Response) -> anyhow::Result<Value> {
    let params = redirected(accepted)?;
    anyhow::ensure!(param(&params, "state") == Some(STATE), "{params:?}");
    let code = param(&params, "code").ok_or_else(|| anyhow::anyhow!("no code: {params:?}"))?;
    let (status, tokens) = token(
        http,
        &format!("{issuer}/oauth2/token"),
        &[
            ("grant_type", "authorization_code"),
            ("client_id", selkie_e2e::pinniped_cli::CLIENT_ID),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", VERIFIER),
        ],
    )
    .await?;
    anyhow::ensure!(status == 200, "redeeming the code: {status}: {tokens}");
    Ok(tokens)
}

/// The tamper and replay checks need Keycloak's genuine response in hand before it reaches the
/// Supervisor. Chromium runs no page scripts here, so Keycloak's POST binding page (whose script
/// submits its form on load) stays, and the test reads the form's SAMLResponse and RelayState
/// through WebDriver. The login is started by the test's HTTPS client (the Supervisor's
/// authorization endpoint answers it with the redirect to Keycloak and the state cookie, as it
/// would a browser), so the test holds the cookie the ACS checks and posts to the ACS itself,
/// seeing the status, headers and body of each answer. Every case has a login of its own (a fresh
/// AuthnRequest, RelayState and cookie), so no case depends on what an earlier refusal did to the
/// login's state; only the first shows Keycloak's login form (Keycloak's SSO session then answers
/// at once).
#[tokio::test]
async fn a_tampered_or_unsigned_saml_response_is_refused() -> anyhow::Result<()> {
    let world = SamlWorld::start("supervisor-saml-tamper", &["seals"]).await?;
    let (supervisor, keycloak, email) = (&world.supervisor, &world.keycloak, world.email.as_str());
    let issuer = supervisor.issuer().to_string();
    let acs = acs_url(&issuer);
    let http = supervisor.client()?;
    let (authorize, browser) = capturing(&issuer).await?;
    let capture = || async {
        let captured = capture_response(&http, &authorize, &browser, keycloak, email)
            .await
            .map_err(|e| crate::with_log(e, supervisor.log()))?;
        anyhow::ensure!(
            captured.action == acs,
            "Keycloak posts to {} instead of the ACS",
            captured.action
        );
        anyhow::Ok(captured)
    };
    let post = |captured: &CapturedResponse, saml_response: String| {
        let (http, acs) = (&http, &acs);
        let (cookie, relay_state) = (captured.cookie.clone(), captured.relay_state.clone());
        async move { post_to_acs(http, acs, &cookie, &saml_response, &relay_state).await }
    };

    // The genuine response: accepted once — the client gets a code for the Keycloak user with
    // their groups — and refused when posted again: an assertion is single-use.
    let genuine = capture().await?;
    let accepted = post(&genuine, genuine.saml_response.clone()).await?;
    // The answer clears the login's state cookie: the login is over.
    let (cookie_name, _) = genuine.cookie.split_once('=').unwrap_or_default();
    anyhow::ensure!(
        accepted
            .headers
            .get_all(http::header::SET_COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .any(|value| value.starts_with(&format!("{cookie_name}=;")) && value.contains("Max-Age=0")),
        "the ACS did not clear the login's state cookie: {:?}",
        accepted.headers
    );
    let tokens = redeem(&http, &issuer, &accepted)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let claims = jwt_claims(tokens["id_token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(
        claims["username"] == email && claims["groups"] == json!(["seals"]),
        "{claims}"
    );
    // The session refreshes with what the assertion said (SAML has nothing to ask again).
    let (status, refreshed) = token(
        &http,
        &format!("{issuer}/oauth2/token"),
        &[
            ("grant_type", "refresh_token"),
            ("client_id", selkie_e2e::pinniped_cli::CLIENT_ID),
            (
                "refresh_token",
                tokens["refresh_token"].as_str().unwrap_or_default(),
            ),
        ],
    )
    .await?;
    anyhow::ensure!(
        status == 200,
        "refreshing the SAML session: {status}: {refreshed}"
    );
    let claims = jwt_claims(refreshed["id_token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(
        claims["username"] == email && claims["groups"] == json!(["seals"]),
        "after a refresh: {claims}"
    );
    let replayed = post(&genuine, genuine.saml_response.clone()).await?;
    let why = refusal(&replayed).map_err(|e| crate::with_log(e, supervisor.log()))?;
    // Expected: the Supervisor says the response (its assertion ID) was seen before, e.g.
    // "replayed" or "already used".
    anyhow::ensure!(
        why.contains("replay") || why.contains("already"),
        "the replay is refused without saying so: {why}"
    );

    // A signed value altered: the user's group becomes one they do not have. The signatures no
    // longer match the content.
    let altered = capture().await?;
    // Posted with another login's cookie (not the browser that started this one): refused before
    // anything else is looked at.
    let elsewhere = post_to_acs(
        &http,
        &acs,
        &genuine.cookie,
        &altered.saml_response,
        &altered.relay_state,
    )
    .await?;
    let why = refusal(&elsewhere).map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(
        elsewhere.status == 403 && why.contains("did not start this saml login"),
        "a response posted with another login's cookie: {} {why}",
        elsewhere.status
    );
    let xml = decode(&altered.saml_response)?;
    anyhow::ensure!(
        xml.matches(">seals<").count() == 1,
        "the response does not carry the group once: {xml}"
    );
    let tampered = B64.encode(xml.replacen(">seals<", ">system:masters<", 1));
    let why = refusal(&post(&altered, tampered).await?).map_err(|e| crate::with_log(e, supervisor.log()))?;
    // Expected: the Supervisor says the signature does not verify.
    anyhow::ensure!(
        why.contains("signature"),
        "the tampered response is refused without saying why: {why}"
    );

    // The signatures removed (Keycloak signs the response and its assertion): nothing vouches for
    // the content.
    let unsigned = capture().await?;
    let (stripped, removed) = without_signatures(&decode(&unsigned.saml_response)?);
    anyhow::ensure!(
        removed == 2,
        "expected Keycloak's two signatures, found {removed}"
    );
    let why = refusal(&post(&unsigned, B64.encode(stripped)).await?)
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    // Expected: the Supervisor says the response or assertion is not signed (no signature).
    anyhow::ensure!(
        why.contains("signature") || why.contains("signed"),
        "the unsigned response is refused without saying why: {why}"
    );

    // Neither the responses nor the cookies reach the log.
    let log = supervisor.log();
    for captured in [&genuine, &altered, &unsigned] {
        let cookie_value = captured
            .cookie
            .split_once('=')
            .map(|(_, v)| v)
            .unwrap_or_default();
        anyhow::ensure!(
            !log.contains(&captured.saml_response) && !log.contains(cookie_value),
            "a SAML response or a state cookie is in the Supervisor's log"
        );
    }
    anyhow::ensure!(!log.contains(PASSWORD), "the Supervisor logged the password");
    Ok(())
}

/// What an admin gets wrong in a SAMLIdentityProvider: what kube-apiserver can tell (a clock
/// skew out of bounds, both metadata sources or neither) is refused by `kubectl apply` with the
/// rule's message; metadata that is not an identity provider's is taken, named in the
/// `MetadataValid` condition, and never replaces the working configuration: the provider stays
/// offered and logins keep working.
#[tokio::test]
async fn a_bad_saml_identity_provider_is_refused_or_named_and_never_replaces_a_working_one(
) -> anyhow::Result<()> {
    let world = SamlWorld::start("supervisor-saml-bad", &["seals"]).await?;
    let kubectl = world.cluster.kubectl();
    let manifest = |spec: &str| {
        format!(
            "apiVersion: {SELKIE_IDP_GROUP}/v1alpha1\nkind: SAMLIdentityProvider\n\
             metadata: {{name: {IDP_RESOURCE}, namespace: {}}}\nspec:\n{spec}",
            world.namespace
        )
    };
    let descriptor = world.keycloak.saml_descriptor_url();
    for (spec, message) in [
        (
            format!("  idp: {{metadataURL: {descriptor}}}\n  allowedClockSkew: 10m\n"),
            "allowedClockSkew must be at most 5m",
        ),
        (
            format!("  idp: {{metadataURL: {descriptor}, metadata: '<x/>'}}\n"),
            "exactly one of metadataURL and metadata must be set",
        ),
        (
            "  idp: {}\n".to_string(),
            "exactly one of metadataURL and metadata must be set",
        ),
    ] {
        let refused = kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&manifest(&spec)))
            .await
            .expect_err("kube-apiserver refuses it");
        anyhow::ensure!(refused.to_string().contains(message), "{spec}: {refused}");
    }

    // Accepted by kube-apiserver, refused by the Supervisor: the condition says why.
    kubectl
        .run_with_stdin(
            &["apply", "-f", "-"],
            Some(&manifest(
                "  idp: {metadata: '<md:EntityDescriptor xmlns:md=\"urn:oasis:names:tc:SAML:2.0:metadata\" entityID=\"x\"/>'}\n",
            )),
        )
        .await?;
    let idp = selkie_e2e::eventually(Duration::from_secs(60), || async {
        let idp = world.identity_provider().await?;
        let metadata = selkie_e2e::crds::condition(&idp, "MetadataValid");
        anyhow::ensure!(
            metadata["status"] == "False" && idp["status"]["phase"] == "Error",
            "not refused yet: {}",
            idp["status"]
        );
        Ok(idp)
    })
    .await
    .map_err(|e| crate::with_log(e, world.supervisor.log()))?;
    let message = selkie_e2e::crds::condition(&idp, "MetadataValid")["message"].clone();
    anyhow::ensure!(
        message
            .as_str()
            .is_some_and(|message| message
                .starts_with("spec.idp.metadata is not usable: the identity provider metadata ")),
        "{message}"
    );

    // The working configuration still serves: a login through Keycloak still gets a code.
    let issuer = world.supervisor.issuer().to_string();
    let http = world.supervisor.client()?;
    let (authorize, browser) = capturing(&issuer).await?;
    let captured = capture_response(&http, &authorize, &browser, &world.keycloak, &world.email).await?;
    let accepted = post_to_acs(
        &http,
        &acs_url(&issuer),
        &captured.cookie,
        &captured.saml_response,
        &captured.relay_state,
    )
    .await?;
    let tokens = redeem(&http, &issuer, &accepted)
        .await
        .map_err(|e| crate::with_log(e, world.supervisor.log()))?;
    let claims = jwt_claims(tokens["id_token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(claims["username"] == world.email.as_str(), "{claims}");
    Ok(())
}
