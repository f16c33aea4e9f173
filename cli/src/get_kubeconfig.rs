//! `selkie get kubeconfig`: a kubeconfig whose user runs `selkie login oidc` (or `login static`)
//! as its exec credential plugin, discovered from the cluster the way `pinniped get kubeconfig`
//! discovers it:
//!
//! 1. the CredentialIssuer (the one named, or the only one), waiting while a strategy is
//!    `Pending` (unless `--concierge-skip-wait`), and its first successful strategy frontend that
//!    fits `--concierge-mode`: TokenCredentialRequest API (endpoint and CA of the kubeconfig's
//!    cluster) or impersonation proxy (endpoint and CA from the frontend);
//! 2. the authenticator (the one named, or the only JWTAuthenticator / WebhookAuthenticator); a
//!    JWTAuthenticator gives `--issuer` (`spec.issuer`), `--request-audience` (`spec.audience`)
//!    and the issuer's CA (`spec.tls.certificateAuthorityData`);
//! 3. for an issuer that is a Supervisor, its identity-provider discovery picks the upstream
//!    name, type and flow, and drops the `username`/`groups` scopes it does not support;
//! 4. the result is validated by polling `GET <server>` with the embedded CA until TLS works
//!    (unless `--skip-validation`).
//!
//! Messages go to stderr (one line each); the kubeconfig is the only output.

use std::{path::PathBuf, time::Duration};

use base64::{engine::general_purpose::STANDARD, Engine as _};
use serde_json::{json, Value};

use crate::{
    concierge::validate_group_suffix,
    http::{HttpsClient, TlsOptions},
    kubeconfig::{Credential, Kubeconfig, Selected},
};

/// How often a pending CredentialIssuer and the validation are polled.
pub const POLL: Duration = Duration::from_secs(2);
/// pinniped's default `--install-hint`, naming Selkie.
pub const DEFAULT_INSTALL_HINT: &str =
    "The selkie CLI does not appear to be installed. Build it with `cargo build -p selkie` and put it on your PATH";

/// The command's options (pinniped's flags of the same names).
#[derive(Debug, Clone, Default)]
pub struct GetKubeconfigOptions {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--kubeconfig-context`.
    pub kubeconfig_context: Option<String>,
    /// `--timeout`.
    pub timeout: Duration,
    /// `--skip-validation`.
    pub skip_validation: bool,
    /// `--generated-name-suffix`.
    pub generated_name_suffix: String,
    /// `--credential-cache`, when given (passed through).
    pub credential_cache: Option<String>,
    /// `--pinniped-cli-path`; `None` uses this binary's path.
    pub cli_path: Option<String>,
    /// `--install-hint`.
    pub install_hint: String,
    /// `--static-token`.
    pub static_token: String,
    /// `--static-token-env`.
    pub static_token_env: String,
    /// `--no-concierge`.
    pub no_concierge: bool,
    /// `--concierge-credential-issuer`.
    pub concierge_credential_issuer: String,
    /// `--concierge-authenticator-type`.
    pub concierge_authenticator_type: String,
    /// `--concierge-authenticator-name`.
    pub concierge_authenticator_name: String,
    /// `--concierge-api-group-suffix`.
    pub concierge_api_group_suffix: String,
    /// `--concierge-skip-wait`.
    pub concierge_skip_wait: bool,
    /// `--concierge-ca-bundle` files.
    pub concierge_ca_bundle: Vec<PathBuf>,
    /// `--concierge-endpoint`.
    pub concierge_endpoint: String,
    /// `--concierge-mode` (`TokenCredentialRequestAPI`, `ImpersonationProxy`, or empty).
    pub concierge_mode: String,
    /// `--oidc-issuer`.
    pub oidc_issuer: String,
    /// `--oidc-client-id`.
    pub oidc_client_id: String,
    /// `--oidc-listen-port`.
    pub oidc_listen_port: u16,
    /// `--oidc-scopes`.
    pub oidc_scopes: Vec<String>,
    /// `--oidc-skip-browser`.
    pub oidc_skip_browser: bool,
    /// `--oidc-skip-listen`.
    pub oidc_skip_listen: bool,
    /// `--oidc-session-cache`.
    pub oidc_session_cache: String,
    /// `--oidc-ca-bundle` files.
    pub oidc_ca_bundle: Vec<PathBuf>,
    /// `--oidc-request-audience`.
    pub oidc_request_audience: String,
    /// `--upstream-identity-provider-name`.
    pub upstream_identity_provider_name: String,
    /// `--upstream-identity-provider-type`.
    pub upstream_identity_provider_type: String,
    /// `--upstream-identity-provider-flow`.
    pub upstream_identity_provider_flow: String,
}

/// Runs the discovery and returns the kubeconfig (YAML). `self_path` is the command written into
/// the kubeconfig when `--pinniped-cli-path` is not given; `log` receives progress lines.
pub async fn run(
    options: &GetKubeconfigOptions,
    self_path: &str,
    log: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<String> {
    let mut options = options.clone();
    validate_group_suffix(
        "--concierge-api-group-suffix",
        &options.concierge_api_group_suffix,
    )
    .map_err(|e| anyhow::anyhow!("invalid API group suffix: {e}"))?;
    if !matches!(
        options.concierge_mode.as_str(),
        "" | "TokenCredentialRequestAPI" | "ImpersonationProxy"
    ) {
        anyhow::bail!(
            "--concierge-mode {:?} is not TokenCredentialRequestAPI or ImpersonationProxy",
            options.concierge_mode
        );
    }
    if !options.static_token.is_empty() && !options.static_token_env.is_empty() {
        anyhow::bail!("only one of --static-token and --static-token-env can be specified");
    }
    let deadline = crate::timestamp::deadline(options.timeout);
    let kubeconfig = Kubeconfig::load(options.kubeconfig.as_deref())
        .map_err(|e| anyhow::anyhow!("could not load --kubeconfig: {e}"))?;
    let selected = kubeconfig
        .select(options.kubeconfig_context.as_deref())
        .map_err(|e| anyhow::anyhow!("could not load --kubeconfig/--kubeconfig-context: {e}"))?;
    let mut server = selected.cluster.server.clone();
    let mut ca = selected
        .ca_pem()
        .map_err(|e| anyhow::anyhow!("could not load --kubeconfig: {e}"))?
        .unwrap_or_default();
    let mut oidc_ca = read_files("--oidc-ca-bundle", &options.oidc_ca_bundle)?;
    let mut concierge_ca = read_files("--concierge-ca-bundle", &options.concierge_ca_bundle)?;

    if !options.no_concierge {
        let client = cluster_client(&selected).await?;
        let suffix = options.concierge_api_group_suffix.clone();
        let issuer = wait_for_credential_issuer(&client, &options, &suffix, deadline, log).await?;
        let authenticator = lookup_authenticator(&client, &options, &suffix, log).await?;

        // The frontend: the first successful strategy of a known type that fits --concierge-mode.
        let frontend = issuer["status"]["strategies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|strategy| strategy["status"] == "Success")
            .filter_map(|strategy| strategy.get("frontend"))
            .find(|frontend| {
                let kind = frontend["type"].as_str().unwrap_or_default();
                matches!(kind, "TokenCredentialRequestAPI" | "ImpersonationProxy")
                    && (options.concierge_mode.is_empty() || options.concierge_mode == kind)
            })
            .cloned();
        let Some(frontend) = frontend else {
            for strategy in issuer["status"]["strategies"].as_array().into_iter().flatten() {
                log(format!(
                    "found CredentialIssuer strategy type={} status={} reason={} message={:?}",
                    strategy["type"].as_str().unwrap_or_default(),
                    strategy["status"].as_str().unwrap_or_default(),
                    strategy["reason"].as_str().unwrap_or_default(),
                    strategy["message"].as_str().unwrap_or_default()
                ));
            }
            if options.concierge_mode.is_empty() {
                anyhow::bail!("could not autodiscover --concierge-mode: the CredentialIssuer has no successful strategy");
            }
            anyhow::bail!(
                "could not find successful Concierge strategy matching --concierge-mode={}",
                options.concierge_mode
            );
        };
        let kind = frontend["type"].as_str().unwrap_or_default().to_string();
        if options.concierge_mode.is_empty() {
            log(match kind.as_str() {
                "ImpersonationProxy" => "discovered Concierge operating in impersonation proxy mode".into(),
                _ => "discovered Concierge operating in TokenCredentialRequest API mode".into(),
            });
            options.concierge_mode = kind.clone();
        }
        if options.concierge_endpoint.is_empty() {
            options.concierge_endpoint = if kind == "ImpersonationProxy" {
                frontend["impersonationProxyInfo"]["endpoint"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            } else {
                server.clone()
            };
            log(format!(
                "discovered Concierge endpoint {}",
                options.concierge_endpoint
            ));
        }
        if concierge_ca.is_empty() {
            concierge_ca = if kind == "ImpersonationProxy" {
                STANDARD
                    .decode(
                        frontend["impersonationProxyInfo"]["certificateAuthorityData"]
                            .as_str()
                            .unwrap_or_default(),
                    )
                    .map_err(|e| anyhow::anyhow!("autodiscovered Concierge CA bundle is invalid: {e}"))?
            } else {
                ca.clone()
            };
            log(format!(
                "discovered Concierge certificate authority bundle roots={}",
                count_certificates(&concierge_ca)
            ));
        }

        let (auth_kind, auth) = authenticator;
        let name = auth["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if options.concierge_authenticator_type.is_empty() && options.concierge_authenticator_name.is_empty()
        {
            log(format!("discovered {auth_kind} {name}"));
            options.concierge_authenticator_type = if auth_kind == "JWTAuthenticator" {
                "jwt"
            } else {
                "webhook"
            }
            .into();
            options.concierge_authenticator_name = name.clone();
        }
        if auth_kind == "JWTAuthenticator" {
            if options.oidc_issuer.is_empty() {
                options.oidc_issuer = auth["spec"]["issuer"].as_str().unwrap_or_default().to_string();
                log(format!("discovered OIDC issuer {}", options.oidc_issuer));
            }
            if options.oidc_request_audience.is_empty() {
                options.oidc_request_audience =
                    auth["spec"]["audience"].as_str().unwrap_or_default().to_string();
                log(format!(
                    "discovered OIDC audience {}",
                    options.oidc_request_audience
                ));
            }
            if oidc_ca.is_empty() {
                let tls = &auth["spec"]["tls"];
                if let Some(data) = tls["certificateAuthorityData"].as_str().filter(|d| !d.is_empty()) {
                    oidc_ca = STANDARD.decode(data).map_err(|e| {
                        anyhow::anyhow!(
                            "tried to autodiscover --oidc-ca-bundle, but JWTAuthenticator {name} has invalid \
                             spec.tls.certificateAuthorityData: {e}"
                        )
                    })?;
                    log(format!(
                        "discovered OIDC CA bundle roots={}",
                        count_certificates(&oidc_ca)
                    ));
                } else if tls
                    .get("certificateAuthorityDataSource")
                    .is_some_and(|s| !s.is_null())
                {
                    anyhow::bail!(
                        "JWTAuthenticator {name} takes its CA from spec.tls.certificateAuthorityDataSource, which \
                         selkie get kubeconfig does not read yet: pass --oidc-ca-bundle"
                    );
                }
            }
        }
        server = options.concierge_endpoint.clone();
        ca = concierge_ca.clone();
    }

    let static_login = !options.static_token.is_empty() || !options.static_token_env.is_empty();
    if !static_login && !options.oidc_issuer.is_empty() {
        supervisor_discovery(&mut options, &oidc_ca, log).await?;
    }

    let mut args: Vec<String> = Vec::new();
    if !options.no_concierge {
        args.extend([
            "--enable-concierge".to_string(),
            format!(
                "--concierge-api-group-suffix={}",
                options.concierge_api_group_suffix
            ),
            format!(
                "--concierge-authenticator-name={}",
                options.concierge_authenticator_name
            ),
            format!(
                "--concierge-authenticator-type={}",
                options.concierge_authenticator_type
            ),
            format!("--concierge-endpoint={}", options.concierge_endpoint),
            format!("--concierge-ca-bundle-data={}", STANDARD.encode(&concierge_ca)),
        ]);
    }
    if let Some(cache) = &options.credential_cache {
        args.push(format!("--credential-cache={cache}"));
    }
    if static_login {
        args.splice(0..0, ["login".to_string(), "static".to_string()]);
        if !options.static_token.is_empty() {
            args.push(format!("--token={}", options.static_token));
        } else {
            args.push(format!("--token-env={}", options.static_token_env));
        }
    } else {
        if options.oidc_issuer.is_empty() {
            anyhow::bail!("could not autodiscover --oidc-issuer and none was provided");
        }
        args.splice(0..0, ["login".to_string(), "oidc".to_string()]);
        args.extend([
            format!("--issuer={}", options.oidc_issuer),
            format!("--client-id={}", options.oidc_client_id),
            format!("--scopes={}", options.oidc_scopes.join(",")),
        ]);
        if options.oidc_skip_browser {
            args.push("--skip-browser".into());
        }
        if options.oidc_skip_listen {
            args.push("--skip-listen".into());
        }
        if options.oidc_listen_port != 0 {
            args.push(format!("--listen-port={}", options.oidc_listen_port));
        }
        if !oidc_ca.is_empty() {
            args.push(format!("--ca-bundle-data={}", STANDARD.encode(&oidc_ca)));
        }
        if !options.oidc_session_cache.is_empty() {
            args.push(format!("--session-cache={}", options.oidc_session_cache));
        }
        if !options.oidc_request_audience.is_empty() {
            if options.oidc_request_audience.contains(".pinniped.dev") {
                anyhow::bail!(
                    "request audience is not allowed to include the substring '.pinniped.dev': {}",
                    options.oidc_request_audience
                );
            }
            args.push(format!("--request-audience={}", options.oidc_request_audience));
        }
        for (flag, value) in [
            (
                "--upstream-identity-provider-name",
                &options.upstream_identity_provider_name,
            ),
            (
                "--upstream-identity-provider-type",
                &options.upstream_identity_provider_type,
            ),
            (
                "--upstream-identity-provider-flow",
                &options.upstream_identity_provider_flow,
            ),
        ] {
            if !value.is_empty() {
                args.push(format!("{flag}={value}"));
            }
        }
    }

    let suffix = &options.generated_name_suffix;
    let cluster_name = format!("{}{suffix}", selected.cluster_name);
    let user_name = format!("{}{suffix}", selected.user_name);
    let context_name = format!("{}{suffix}", selected.context);
    let mut cluster = json!({"server": server});
    if !ca.is_empty() {
        cluster["certificate-authority-data"] = json!(STANDARD.encode(&ca));
    }
    if options.no_concierge {
        if let Some(name) = selected
            .cluster
            .tls_server_name
            .as_deref()
            .filter(|n| !n.is_empty())
        {
            cluster["tls-server-name"] = json!(name);
        }
        if selected.cluster.insecure_skip_tls_verify {
            cluster["insecure-skip-tls-verify"] = json!(true);
        }
    }
    let command = options.cli_path.clone().unwrap_or_else(|| self_path.to_string());
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "users": [{"name": user_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": command,
            "args": args,
            "env": null,
            "installHint": options.install_hint,
            "interactiveMode": "IfAvailable",
            "provideClusterInfo": true,
        }}}],
        "contexts": [{"name": context_name, "context": {"cluster": cluster_name, "user": user_name}}],
        "current-context": context_name,
        "preferences": {},
    });

    if !options.skip_validation {
        validate(&server, &ca, deadline, log).await?;
    }
    Ok(serde_yaml::to_string(&config)?)
}

fn read_files(flag: &str, files: &[PathBuf]) -> anyhow::Result<Vec<u8>> {
    let mut pem = Vec::new();
    for file in files {
        let bytes = std::fs::read(file)
            .map_err(|e| anyhow::anyhow!("could not read {flag} {}: {e}", file.display()))?;
        pem.extend_from_slice(&bytes);
        if !bytes.ends_with(b"\n") {
            pem.push(b'\n');
        }
    }
    Ok(pem)
}

fn count_certificates(pem: &[u8]) -> usize {
    String::from_utf8_lossy(pem)
        .matches("-----BEGIN CERTIFICATE-----")
        .count()
}

/// An HTTPS client for the kubeconfig's cluster with its credential.
pub async fn cluster_client(selected: &Selected) -> anyhow::Result<HttpsClient> {
    let configure = |e: &dyn std::fmt::Display| anyhow::anyhow!("could not configure Kubernetes client: {e}");
    let mut tls: TlsOptions = selected.tls_options().map_err(|e| configure(&e))?;
    let credential = selected.credential().await.map_err(|e| {
        anyhow::anyhow!(
            "could not get a credential for context {:?}: {e}",
            selected.context
        )
    })?;
    let authorization = match credential {
        Credential::Anonymous => None,
        Credential::Certificate(identity) => {
            tls.client_identity = Some(identity);
            None
        }
        Credential::Token(token) => Some(
            http::HeaderValue::from_str(&format!("Bearer {}", token.0))
                .map_err(|_| configure(&"the token is not a valid header value"))?,
        ),
        Credential::Basic(basic) => Some(
            http::HeaderValue::from_str(&basic.0).map_err(|_| configure(&"the basic auth is not valid"))?,
        ),
    };
    HttpsClient::new(&selected.cluster.server, &tls, authorization).map_err(|e| configure(&e))
}

/// GETs `path` on the cluster: `Ok(None)` for 404, the JSON otherwise; errors name `what`.
async fn get_json(client: &HttpsClient, path: &str, what: &str) -> anyhow::Result<Option<Value>> {
    let url = client.url(path);
    // As client-go does, a 429 (e.g. a CRD's storage still initializing) is retried after its
    // Retry-After, up to ten times.
    let mut retries = 0;
    let response = loop {
        let response = client
            .send(
                http::Method::GET,
                &url,
                &[(http::header::ACCEPT, "application/json".into())],
                Vec::new(),
                Some(Duration::from_secs(20)),
            )
            .await
            .map_err(|e| anyhow::anyhow!("failed to {what}: {e}"))?;
        if response.status != http::StatusCode::TOO_MANY_REQUESTS || retries >= 10 {
            break response;
        }
        retries += 1;
        let wait = response
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .unwrap_or(1)
            .clamp(1, 10);
        tokio::time::sleep(Duration::from_secs(wait)).await;
    };
    if response.status == http::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !response.status.is_success() {
        let detail = crate::concierge::status_message(&response.body)
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        anyhow::bail!(
            "failed to {what}: {url} answered HTTP {}{detail}",
            response.status
        );
    }
    Ok(Some(
        serde_json::from_slice(&response.body).map_err(|e| anyhow::anyhow!("failed to {what}: {e}"))?,
    ))
}

async fn lookup_credential_issuer(
    client: &HttpsClient,
    options: &GetKubeconfigOptions,
    suffix: &str,
    log: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<Value> {
    let base = format!("/apis/config.concierge.{suffix}/v1alpha1/credentialissuers");
    if !options.concierge_credential_issuer.is_empty() {
        let name = &options.concierge_credential_issuer;
        return get_json(
            client,
            &format!("{base}/{name}"),
            &format!("get CredentialIssuer {name}"),
        )
        .await?
        .ok_or_else(|| {
            anyhow::anyhow!("CredentialIssuer {name:?} was not found (--concierge-credential-issuer)")
        });
    }
    let list = get_json(client, &base, "list CredentialIssuer objects for autodiscovery")
        .await?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "failed to list CredentialIssuer objects for autodiscovery: the API config.concierge.{suffix} is not \
                 served (is the Concierge installed? check --concierge-api-group-suffix)"
            )
        })?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    match items.as_slice() {
        [] => anyhow::bail!("no CredentialIssuers were found"),
        [one] => {
            log(format!(
                "discovered CredentialIssuer {}",
                one["metadata"]["name"].as_str().unwrap_or_default()
            ));
            Ok(one.clone())
        }
        _ => anyhow::bail!(
            "multiple CredentialIssuers were found, so the --concierge-credential-issuer flag must be specified"
        ),
    }
}

async fn wait_for_credential_issuer(
    client: &HttpsClient,
    options: &GetKubeconfigOptions,
    suffix: &str,
    deadline: tokio::time::Instant,
    log: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<Value> {
    let mut attempts = 1;
    loop {
        let issuer = lookup_credential_issuer(client, options, suffix, log).await?;
        let pending = issuer["status"]["strategies"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|strategy| strategy["reason"] == "Pending");
        if options.concierge_skip_wait || !pending {
            return Ok(issuer);
        }
        let now = tokio::time::Instant::now();
        if now + POLL > deadline {
            anyhow::bail!(
                "the CredentialIssuer still has a pending strategy after {:?}; wait and retry, raise --timeout, \
                 or pass --concierge-skip-wait",
                options.timeout
            );
        }
        log(format!(
            "waiting for CredentialIssuer pending strategies to finish attempts={attempts} remaining={}s",
            (deadline - now).as_secs()
        ));
        attempts += 1;
        tokio::time::sleep(POLL).await;
    }
}

/// The authenticator: (kind, object).
async fn lookup_authenticator(
    client: &HttpsClient,
    options: &GetKubeconfigOptions,
    suffix: &str,
    log: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<(&'static str, Value)> {
    let base = format!("/apis/authentication.concierge.{suffix}/v1alpha1");
    let (kind_flag, name) = (
        options.concierge_authenticator_type.to_lowercase(),
        &options.concierge_authenticator_name,
    );
    if !kind_flag.is_empty() && !name.is_empty() {
        let (kind, resource) = match kind_flag.as_str() {
            "jwt" => ("JWTAuthenticator", "jwtauthenticators"),
            "webhook" => ("WebhookAuthenticator", "webhookauthenticators"),
            other => anyhow::bail!(
                "invalid authenticator type {other:?}, supported values are \"webhook\" and \"jwt\""
            ),
        };
        let object = get_json(
            client,
            &format!("{base}/{resource}/{name}"),
            &format!("get {kind} {name}"),
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("{kind} {name:?} was not found"))?;
        return Ok((kind, object));
    }
    let mut found = Vec::new();
    for (kind, resource) in [
        ("JWTAuthenticator", "jwtauthenticators"),
        ("WebhookAuthenticator", "webhookauthenticators"),
    ] {
        let list = get_json(
            client,
            &format!("{base}/{resource}"),
            &format!("list {kind} objects for autodiscovery"),
        )
        .await?
        .unwrap_or(Value::Null);
        for item in list["items"].as_array().into_iter().flatten() {
            found.push((kind, item.clone()));
        }
    }
    match found.len() {
        0 => anyhow::bail!("no authenticators were found"),
        1 => Ok(found.remove(0)),
        _ => {
            for (kind, item) in &found {
                log(format!(
                    "found {kind} {}",
                    item["metadata"]["name"].as_str().unwrap_or_default()
                ));
            }
            anyhow::bail!(
                "multiple authenticators were found, so the --concierge-authenticator-type/--concierge-authenticator-name \
                 flags must be specified"
            )
        }
    }
}

/// For a Supervisor issuer: scopes it does not support are dropped, and the upstream identity
/// provider and flow are chosen from its identity-provider discovery.
async fn supervisor_discovery(
    options: &mut GetKubeconfigOptions,
    ca: &[u8],
    log: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<()> {
    let tls = TlsOptions {
        ca_pem: (!ca.is_empty()).then(|| ca.to_vec()),
        ..TlsOptions::default()
    };
    let issuer = options.oidc_issuer.clone();
    let client = HttpsClient::new(&issuer, &tls, None)
        .map_err(|e| anyhow::anyhow!("while fetching OIDC discovery data from issuer: {e}"))?;
    let discovery = get_json(
        &client,
        "/.well-known/openid-configuration",
        "fetch OIDC discovery data from the issuer",
    )
    .await?
    .ok_or_else(|| {
        anyhow::anyhow!("while fetching OIDC discovery data from issuer {issuer}: 404 Not Found")
    })?;
    let Some(endpoint) = discovery[selkie_api::supervisor_oidc::SUPERVISOR_DISCOVERY_MEMBER]
        ["pinniped_identity_providers_endpoint"]
        .as_str()
        .filter(|e| !e.is_empty())
        .map(String::from)
    else {
        return Ok(());
    };
    let scopes_supported: Vec<&str> = discovery["scopes_supported"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !(scopes_supported.contains(&"username") && scopes_supported.contains(&"groups")) {
        options.oidc_scopes.retain(|scope| {
            let keep = scope != "username" && scope != "groups";
            if !keep {
                log(format!(
                    "removed scope {scope} from --oidc-scopes because this Supervisor does not support it"
                ));
            }
            keep
        });
    }
    if !options.upstream_identity_provider_name.is_empty()
        && !options.upstream_identity_provider_type.is_empty()
        && !options.upstream_identity_provider_flow.is_empty()
    {
        return Ok(());
    }
    let answer = client
        .send(
            http::Method::GET,
            &endpoint,
            &[(http::header::ACCEPT, "application/json".into())],
            Vec::new(),
            Some(Duration::from_secs(20)),
        )
        .await
        .map_err(|e| anyhow::anyhow!("while fetching IDP discovery data from issuer: {e}"))?;
    if !answer.status.is_success() {
        anyhow::bail!(
            "while fetching IDP discovery data from issuer: {endpoint} answered {}",
            answer.status
        );
    }
    let idps: Value = serde_json::from_slice(&answer.body)
        .map_err(|e| anyhow::anyhow!("unable to fetch the Pinniped IDP discovery document: {e}"))?;
    let all: Vec<Value> = idps["pinniped_identity_providers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if all.is_empty() {
        return Ok(());
    }
    let matching: Vec<&Value> = all
        .iter()
        .filter(|idp| {
            (options.upstream_identity_provider_name.is_empty()
                || idp["name"] == options.upstream_identity_provider_name.as_str())
                && (options.upstream_identity_provider_type.is_empty()
                    || idp["type"] == options.upstream_identity_provider_type.as_str())
        })
        .collect();
    let names: Vec<String> = all
        .iter()
        .map(|idp| {
            format!(
                "{}:{}",
                idp["name"].as_str().unwrap_or_default(),
                idp["type"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let idp = match matching.as_slice() {
        [one] => *one,
        [] => anyhow::bail!(
            "no Supervisor upstream identity providers matched --upstream-identity-provider-name/-type; found these \
             upstreams: {}",
            names.join(", ")
        ),
        _ => anyhow::bail!(
            "multiple Supervisor upstream identity providers were found, so the --upstream-identity-provider-name/\
             --upstream-identity-provider-type flags must be specified; found these upstreams: {}",
            names.join(", ")
        ),
    };
    options.upstream_identity_provider_name = idp["name"].as_str().unwrap_or_default().to_string();
    options.upstream_identity_provider_type = idp["type"].as_str().unwrap_or_default().to_string();
    let flows: Vec<&str> = idp["flows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if options.upstream_identity_provider_flow.is_empty() {
        if let Some(first) = flows.first() {
            options.upstream_identity_provider_flow = (*first).to_string();
        }
    } else if !flows.contains(&options.upstream_identity_provider_flow.as_str()) {
        anyhow::bail!(
            "no client flow {:?} for Supervisor upstream identity provider {:?} (supported: {})",
            options.upstream_identity_provider_flow,
            options.upstream_identity_provider_name,
            flows.join(", ")
        );
    }
    Ok(())
}

/// Polls `GET <server>` with the embedded CA until the TLS connection works and the answer is
/// below 500, or the deadline passes.
async fn validate(
    server: &str,
    ca: &[u8],
    deadline: tokio::time::Instant,
    log: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<()> {
    if ca.is_empty() {
        anyhow::bail!("invalid kubeconfig (no certificateAuthorityData)");
    }
    let tls = TlsOptions {
        ca_pem: Some(ca.to_vec()),
        ..TlsOptions::default()
    };
    let client =
        HttpsClient::new(server, &tls, None).map_err(|e| anyhow::anyhow!("invalid kubeconfig: {e}"))?;
    let mut attempts = 0;
    loop {
        let result = client
            .send(
                http::Method::GET,
                server,
                &[],
                Vec::new(),
                Some(Duration::from_secs(10)),
            )
            .await;
        let problem = match result {
            Ok(response) if response.status.as_u16() < 500 => {
                log("validated connection to the cluster".into());
                return Ok(());
            }
            Ok(response) => format!("unexpected status code {}", response.status.as_u16()),
            Err(e) => e.to_string(),
        };
        attempts += 1;
        if tokio::time::Instant::now() + POLL > deadline {
            anyhow::bail!(
                "could not validate the kubeconfig: {problem}; pass --skip-validation to write it anyway"
            );
        }
        log(format!(
            "could not connect to the cluster, retrying... attempts={attempts} error={problem}"
        ));
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_timeout_past_the_clock_is_a_long_wait_not_a_panic() {
        // `--timeout` is the user's (and `GetKubeconfigOptions` any caller's): `Duration::MAX`
        // once overflowed the monotonic clock before anything else ran.
        let options = GetKubeconfigOptions {
            kubeconfig: Some(PathBuf::from("/nonexistent/selkie-test/kubeconfig")),
            timeout: Duration::MAX,
            concierge_api_group_suffix: "pinniped.dev".into(),
            ..GetKubeconfigOptions::default()
        };
        let error = run(&options, "selkie", &mut |_| {}).await.unwrap_err();
        assert!(
            error.to_string().contains("could not load --kubeconfig"),
            "{error}"
        );
    }
}
