//! `selkie login oidc`: the exec credential plugin for an OIDC issuer (a Pinniped Supervisor,
//! or any OIDC provider such as Dex), pinniped's `login oidc`.
//!
//! 1. The credential cache (`credentials.yaml`, keyed by the arguments and cluster, as pinniped
//!    keys `login oidc`) answers while its credential is valid; its lock is held for the whole
//!    login so parallel kubectl calls log in once.
//! 2. Otherwise the session cache (`sessions.yaml`) gives an ID token with at least
//!    [`MIN_ID_TOKEN_VALIDITY`] left, or a refresh token that is used silently.
//! 3. Otherwise a login: `browser_authcode` (authorization code + PKCE S256 + state + nonce; a
//!    callback listener on 127.0.0.1; `response_mode=form_post` when offered; the browser opened
//!    with `$BROWSER` or xdg-open unless `--skip-browser`; the URL printed on stderr and, on a
//!    terminal, the code may be pasted) or `cli_password` (username and password from
//!    `PINNIPED_USERNAME`/`PINNIPED_PASSWORD` or prompts; sent as `Pinniped-Username` /
//!    `Pinniped-Password` headers to a Supervisor's authorize endpoint, or, for an issuer that is
//!    not a Supervisor, as the OAuth2 resource-owner password grant) or `device` (RFC 8628, for
//!    a Supervisor whose FederationDomain enables it: a device authorization request with the
//!    scopes, PKCE S256 and nonce; the link and user code printed on stderr for a browser on any
//!    device; no browser opened, no listener; the token endpoint polled at the interval until
//!    the user has finished, and the tokens validated as the browser flow's are).
//!
//!    When the issuer's discovery document advertises ES256 DPoP proofs (RFC 9449), every token
//!    request of steps 2 to 4 proves possession of the issuer's key, kept next to the session
//!    cache ([`crate::dpop_keys`]); a refresh the issuer refuses (`invalid_dpop_proof`,
//!    `invalid_grant`) is followed by a fresh login, as any failed refresh is.
//! 4. With `--request-audience`, an RFC 8693 exchange for an ID token of that audience.
//! 5. With `--enable-concierge`, a TokenCredentialRequest for a client certificate; otherwise the
//!    ID token itself is the credential.

use std::{
    io::{BufRead as _, IsTerminal as _, Write as _},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD, Engine as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use selkie_oidc::{
    dpop,
    jose::sign::SigningKey,
    rp::{
        CallbackOutcome, CallbackParams, ClientConfig, DevicePoll, LoginParams, OidcError, Provider,
        DEVICE_SLOW_DOWN_STEP,
    },
};
use tokio::sync::{mpsc, oneshot};

use crate::{
    cache::{oidc_cache_key, CredentialCache, Source},
    concierge::{ConciergeClient, ConciergeOptions, EXCHANGE_TIMEOUT},
    dpop_keys,
    exec::{render, CredentialStatus, ExecApiVersion, ExecInfo},
    http::TlsOptions,
    login_static::Reporter,
    sessions::{IdToken, SessionCache, SessionKey, Tokens},
    timestamp,
};

/// A cached ID token is used only with at least this much validity left (pinniped's).
pub const MIN_ID_TOKEN_VALIDITY: Duration = Duration::from_secs(600);
/// A cached access token is used for the RFC 8693 exchange only with this much left.
pub const MIN_ACCESS_TOKEN_VALIDITY: Duration = Duration::from_secs(10);
/// The longest a login may take (pinniped's `overallTimeout`).
pub const OVERALL_TIMEOUT: Duration = Duration::from_secs(90 * 60);
/// pinniped's default `--scopes`.
pub const DEFAULT_SCOPES: &str = "offline_access,openid,pinniped:request-audience,username,groups";
/// The variable that overrides `--upstream-identity-provider-flow`.
pub const FLOW_ENV: &str = "PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW";
/// The username variable of the `cli_password` flow.
pub const USERNAME_ENV: &str = "PINNIPED_USERNAME";
/// The password variable of the `cli_password` flow.
pub const PASSWORD_ENV: &str = "PINNIPED_PASSWORD";
/// Set to anything to not print the login URL when a browser was opened.
pub const SKIP_PRINT_URL_ENV: &str = "PINNIPED_SKIP_PRINT_LOGIN_URL";
/// The paste prompt, exactly pinniped's.
pub const PASTE_PROMPT: &str = "    Optionally, paste your authorization code: ";

/// The login flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// `browser_authcode`.
    BrowserAuthcode,
    /// `cli_password`.
    CliPassword,
    /// `device`: the device authorization grant (RFC 8628).
    Device,
}

impl Flow {
    /// Parses pinniped's flow names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "browser_authcode" => Some(Self::BrowserAuthcode),
            "cli_password" => Some(Self::CliPassword),
            "device" => Some(Self::Device),
            _ => None,
        }
    }

    /// Pinniped's name of the flow.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BrowserAuthcode => "browser_authcode",
            Self::CliPassword => "cli_password",
            Self::Device => "device",
        }
    }
}

/// The command's options, as the flags give them.
#[derive(Debug, Clone, Default)]
pub struct OidcLoginOptions {
    /// `--issuer`.
    pub issuer: String,
    /// `--client-id`.
    pub client_id: String,
    /// `--listen-port` (0: any).
    pub listen_port: u16,
    /// `--scopes`.
    pub scopes: Vec<String>,
    /// `--skip-browser`.
    pub skip_browser: bool,
    /// `--skip-listen`.
    pub skip_listen: bool,
    /// `--session-cache`; `None` disables it.
    pub session_cache: Option<PathBuf>,
    /// `--ca-bundle` files.
    pub ca_bundle_files: Vec<PathBuf>,
    /// `--ca-bundle-data` (base64 of PEM).
    pub ca_bundle_data: Vec<String>,
    /// `--request-audience`.
    pub request_audience: String,
    /// `--enable-concierge` and the other Concierge flags.
    pub concierge: ConciergeOptions,
    /// `--credential-cache`; `None` disables it.
    pub credential_cache: Option<PathBuf>,
    /// `--upstream-identity-provider-name`.
    pub upstream_identity_provider_name: String,
    /// `--upstream-identity-provider-type`.
    pub upstream_identity_provider_type: String,
    /// `--upstream-identity-provider-flow` (empty: browser_authcode, or the env override).
    pub upstream_identity_provider_flow: String,
}

/// Runs the login: `args` are the process arguments after the program name (the credential
/// cache key), `lookup_env` reads the environment, `exec_info` is what kubectl passed. Returns
/// the `ExecCredential` to print on stdout. Fails with a one-line error.
pub async fn run(
    options: &OidcLoginOptions,
    args: &[String],
    lookup_env: &(dyn Fn(&str) -> Option<String> + Sync),
    exec_info: Option<&ExecInfo>,
    reporter: &mut (dyn Reporter + Send),
) -> anyhow::Result<String> {
    let flow_name = lookup_env(FLOW_ENV)
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| options.upstream_identity_provider_flow.clone());
    let flow = if flow_name.is_empty() {
        None
    } else {
        Some(Flow::parse(&flow_name).ok_or_else(|| {
            anyhow::anyhow!(
                "--upstream-identity-provider-flow (or {FLOW_ENV}) is {flow_name:?}: use browser_authcode, cli_password or device"
            )
        })?)
    };
    if !matches!(
        options.upstream_identity_provider_type.as_str(),
        "" | "oidc" | "ldap" | "activedirectory" | "github" | "saml"
    ) {
        anyhow::bail!(
            "--upstream-identity-provider-type {:?} is not one of oidc, ldap, activedirectory, github, saml",
            options.upstream_identity_provider_type
        );
    }
    let tls = TlsOptions {
        ca_pem: ca_bundle(options)?,
        ..TlsOptions::default()
    };
    let concierge = options.concierge.client()?;
    let version = exec_info.map_or(ExecApiVersion::V1Beta1, |info| info.api_version);
    let mut login = Login {
        options,
        flow,
        tls,
        lookup_env,
        debug: lookup_env(DEBUG_ENV).is_some_and(|value| value == "true"),
        dpop_key: None,
    };
    let credential = match &options.credential_cache {
        None => login.credential(concierge.as_ref()).await,
        Some(path) => {
            let key = oidc_cache_key(args, exec_info.and_then(ExecInfo::cache_cluster));
            let mut warnings = Vec::new();
            let result = CredentialCache::new(path)
                .get_or_fetch(&key, || login.credential(concierge.as_ref()), &mut |warning| {
                    warnings.push(warning)
                })
                .await;
            for warning in &warnings {
                reporter.warn(warning);
            }
            result.map(|(credential, source)| {
                if source == Source::Cache {
                    reporter.debug("using cached cluster credential.");
                }
                credential
            })
        }
    };
    Ok(render(version, &credential?))
}

/// The variable that turns on debug notes.
const DEBUG_ENV: &str = "PINNIPED_DEBUG";

/// Prints session-cache warnings (one line each) and empties the list.
fn warn_all(warnings: &mut Vec<String>) {
    for warning in warnings.drain(..) {
        eprintln!("selkie: warning: {warning}");
    }
}

struct Login<'a> {
    options: &'a OidcLoginOptions,
    /// The flow asked for; `None`: the Supervisor's first for the identity provider, else the
    /// browser.
    flow: Option<Flow>,
    tls: TlsOptions,
    lookup_env: &'a (dyn Fn(&str) -> Option<String> + Sync),
    debug: bool,
    /// The issuer's DPoP key once a discovery asked for one (loaded once per run).
    dpop_key: Option<Arc<SigningKey>>,
}

impl Login<'_> {
    /// A debug note on stderr, at once (with `PINNIPED_DEBUG=true`).
    fn debug_note(&self, message: &str) {
        if self.debug {
            eprintln!("selkie: debug: {message}");
        }
    }

    /// The issuer, discovered; when its discovery document advertises ES256 DPoP proofs, with
    /// the issuer's key ([`dpop_keys::for_login`]: next to the session cache, made on first use)
    /// for every token request. Fails when discovery fails or the key file cannot be used.
    async fn discover(&mut self) -> anyhow::Result<Provider> {
        let options = self.options;
        let provider = Provider::discover(&options.issuer, &self.tls).await?;
        if !provider.supports_dpop() {
            return Ok(provider);
        }
        let key = match &self.dpop_key {
            Some(key) => key.clone(),
            None => {
                let found = dpop_keys::for_login(
                    &options.issuer,
                    &provider.discovery,
                    options.session_cache.as_deref(),
                )?;
                let Some(dpop_keys::LoginKey { key, path }) = found else {
                    return Ok(provider);
                };
                self.debug_note(&match path {
                    Some(path) => format!(
                        "the issuer binds sessions to a key (DPoP); proving possession of the key in {}",
                        path.display()
                    ),
                    None => "the issuer binds sessions to a key (DPoP); with no session cache, using a key \
                             of this run only"
                        .to_string(),
                });
                self.dpop_key = Some(key.clone());
                key
            }
        };
        Ok(provider.with_dpop_key(key))
    }

    /// The cluster credential: the ID token, or what the Concierge gives for it.
    async fn credential(&mut self, concierge: Option<&ConciergeClient>) -> anyhow::Result<CredentialStatus> {
        let (token, expiry) = tokio::time::timeout(OVERALL_TIMEOUT, self.id_token())
            .await
            .map_err(|_| anyhow::anyhow!("the login did not finish within {OVERALL_TIMEOUT:?}"))??;
        match concierge {
            Some(concierge) => concierge
                .exchange(&token, EXCHANGE_TIMEOUT)
                .await
                .map_err(|e| anyhow::anyhow!("could not complete the Concierge credential exchange: {e}")),
            None => Ok(CredentialStatus {
                expiration_timestamp: expiry,
                token,
                ..CredentialStatus::default()
            }),
        }
    }

    /// The ID token for the cluster (and its expiry).
    async fn id_token(&mut self) -> anyhow::Result<(String, Option<String>)> {
        let options = self.options;
        let mut scopes = options.scopes.clone();
        scopes.sort();
        let key = SessionKey {
            client_id: options.client_id.clone(),
            issuer: options.issuer.clone(),
            redirect_uri: format!("http://localhost:{}/callback", options.listen_port),
            scopes,
            upstream_provider_name: options.upstream_identity_provider_name.clone(),
        };
        let sessions = options.session_cache.as_ref().map(SessionCache::new);
        let mut warnings = Vec::new();
        let cached = match &sessions {
            Some(cache) => cache.get(&key, &mut |w| warnings.push(w.to_string())).await?,
            None => None,
        };
        warn_all(&mut warnings);
        let audience = options.request_audience.as_str();
        let needs_exchange = |tokens: &Tokens| {
            !audience.is_empty()
                && tokens
                    .id
                    .as_ref()
                    .and_then(|id| id.claims.as_ref())
                    .and_then(|c| c.get("aud"))
                    .and_then(|aud| aud.as_str())
                    != Some(audience)
        };
        let now = timestamp::now();
        let fresh_enough = |tokens: &Tokens| {
            if needs_exchange(tokens) {
                tokens
                    .access_expiry()
                    .is_some_and(|e| e - now > MIN_ACCESS_TOKEN_VALIDITY)
            } else {
                tokens
                    .id_expiry()
                    .is_some_and(|e| e - now > MIN_ID_TOKEN_VALIDITY)
            }
        };
        let config = ClientConfig::public(&options.client_id, options.scopes.clone());
        let mut provider: Option<Provider> = None;
        let tokens = match cached {
            Some(tokens) if fresh_enough(&tokens) => {
                self.debug_note("found unexpired cached token.");
                tokens
            }
            cached => {
                let discovered = self.discover().await?;
                let refreshed = match cached.and_then(|tokens| tokens.refresh) {
                    Some(refresh) => match discovered
                        .refresh(&config, &refresh.token)
                        .await
                        .map(Tokens::from)
                    {
                        Ok(tokens) if tokens.id.is_some() => {
                            self.debug_note("refreshed cached tokens.");
                            Some(tokens)
                        }
                        Ok(_) => None,
                        Err(error) => {
                            self.debug_note(&format!(
                                "refresh failed, logging in again: {}",
                                refresh_failure(&error, discovered.has_dpop_key())
                            ));
                            None
                        }
                    },
                    None => None,
                };
                let tokens = match refreshed {
                    Some(tokens) => tokens,
                    None => self.login(&discovered, &config).await?,
                };
                if let Some(cache) = &sessions {
                    cache
                        .put(&key, &tokens, &mut |w| warnings.push(w.to_string()))
                        .await?;
                    warn_all(&mut warnings);
                }
                provider = Some(discovered);
                tokens
            }
        };
        if needs_exchange(&tokens) {
            let provider = match provider {
                Some(provider) => provider,
                None => self.discover().await?,
            };
            let access = tokens
                .access
                .as_ref()
                .map(|access| access.token.clone())
                .ok_or_else(|| {
                    anyhow::anyhow!("the session has no access token for the --request-audience exchange")
                })?;
            let id = provider
                .token_exchange(&config, &access, audience)
                .await
                .map_err(|e| anyhow::anyhow!("failed to exchange token: {e}"))?;
            let id = IdToken::from(id);
            return Ok((id.token, id.expiry));
        }
        let id = tokens.id.ok_or_else(|| {
            anyhow::anyhow!("the issuer gave no ID token; request the openid scope with --scopes")
        })?;
        Ok((id.token, id.expiry))
    }

    /// The flow of a fresh login, as the pinniped CLI chooses it: without
    /// `--upstream-identity-provider-name`, the one asked for or the browser; with it, the issuer
    /// must be a Supervisor whose identity-provider discovery lists a provider of that name and
    /// type (offering the flow asked for, if any), and without a flow asked for, that provider's
    /// first flow is used (LDAP and Active Directory: `cli_password`). Fails with pinniped's
    /// messages.
    async fn resolve_flow(&self, provider: &Provider) -> anyhow::Result<Flow> {
        let options = self.options;
        let name = options.upstream_identity_provider_name.as_str();
        if name.is_empty() {
            return Ok(self.flow.unwrap_or(Flow::BrowserAuthcode));
        }
        if !provider.discovery.is_supervisor() {
            anyhow::bail!(
                "upstream identity provider name {name:?} was specified, but OIDC issuer {:?} does not offer Pinniped-style IDP discovery, so it does not appear to be a Pinniped Supervisor; specifying an upstream identity provider name is only meant to be used with Pinniped Supervisors",
                options.issuer
            );
        }
        let kind = idp_type(options);
        let discovery = provider
            .identity_providers()
            .await
            .map_err(|e| anyhow::anyhow!("while fetching IDP discovery data from issuer: {e}"))?;
        let mut supported: Vec<&str> = discovery["pinniped_supported_identity_provider_types"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| entry["type"].as_str())
            .collect();
        supported.sort_unstable();
        if !supported.is_empty() && !supported.contains(&kind) {
            let quoted: Vec<String> = supported.iter().map(|kind| format!("{kind:?}")).collect();
            anyhow::bail!(
                "unable to find upstream identity provider with type {kind:?}, this Pinniped Supervisor supports IDP types [{}]",
                quoted.join(", ")
            );
        }
        let idps = discovery
            .get("pinniped_identity_providers")
            .cloned()
            .unwrap_or(serde_json::Value::Array(Vec::new()));
        let flows_of = |idp: &serde_json::Value| -> Vec<String> {
            idp["flows"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|flow| flow.as_str().map(String::from))
                .collect()
        };
        let found = idps.as_array().into_iter().flatten().find(|idp| {
            idp["name"] == name
                && idp["type"] == kind
                && self
                    .flow
                    .is_none_or(|flow| flows_of(idp).iter().any(|offered| offered == flow.as_str()))
        });
        let Some(found) = found else {
            return Err(match self.flow {
                None => anyhow::anyhow!(
                    "unable to find upstream identity provider with name {name:?} and type {kind:?}. Found these providers: {idps}"
                ),
                Some(flow) => anyhow::anyhow!(
                    "unable to find upstream identity provider with name {name:?} and type {kind:?} and flow {:?}. Found these providers: {idps}",
                    flow.as_str()
                ),
            });
        };
        if let Some(flow) = self.flow {
            return Ok(flow);
        }
        flows_of(found)
            .first()
            .and_then(|first| Flow::parse(first))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unable to infer flow for upstream identity provider with name {name:?} and type {kind:?} because there were no flows discovered for that provider"
                )
            })
    }

    /// A fresh login in the chosen flow.
    async fn login(&mut self, provider: &Provider, config: &ClientConfig) -> anyhow::Result<Tokens> {
        let params = LoginParams::generate()?;
        let options = self.options;
        let mut idp: Vec<(&str, &str)> = Vec::new();
        if !options.upstream_identity_provider_name.is_empty() {
            idp.push(("pinniped_idp_name", &options.upstream_identity_provider_name));
            idp.push(("pinniped_idp_type", idp_type(options)));
        }
        // As the pinniped CLI asks: some providers (Google) issue refresh tokens only then.
        let extra: Vec<(&str, &str)> = std::iter::once(("access_type", "offline"))
            .chain(idp.iter().copied())
            .collect();
        // The device flow asked for: whether the issuer offers it is known before the identity
        // providers are looked at, so that a FederationDomain without it says so (its providers
        // then list no `device` flow either).
        let device_endpoint = match self.flow {
            Some(Flow::Device) => Some(self.device_endpoint(provider).await?),
            _ => None,
        };
        match self.resolve_flow(provider).await? {
            Flow::CliPassword => {
                let (username, password) = self.credentials()?;
                if provider.discovery.is_supervisor() {
                    let port = self.options.listen_port;
                    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
                    let url = provider.authorize_url(config, &params, &redirect_uri, &extra);
                    let code = provider
                        .supervisor_password_authorize(
                            &url,
                            &redirect_uri,
                            &params.state,
                            &username,
                            &password,
                        )
                        .await?;
                    Ok(provider
                        .exchange_code(config, &params, &code, &redirect_uri)
                        .await?
                        .into())
                } else {
                    Ok(provider
                        .password_grant(config, &username, &password)
                        .await?
                        .into())
                }
            }
            Flow::BrowserAuthcode => self.browser_login(provider, config, &params, &extra).await,
            Flow::Device => {
                let endpoint = match device_endpoint {
                    Some(endpoint) => endpoint,
                    None => self.device_endpoint(provider).await?,
                };
                self.device_login(provider, config, &params, &endpoint, &idp)
                    .await
            }
        }
    }

    /// The issuer's `device_authorization_endpoint`; fails when its discovery document names
    /// none (or cannot be read).
    async fn device_endpoint(&self, provider: &Provider) -> anyhow::Result<String> {
        provider
            .device_authorization_endpoint()
            .map(str::to_string)
            .ok_or_else(|| {
                anyhow::anyhow!(
                "the Supervisor at {} does not offer the device flow (no device_authorization_endpoint in \
                 its discovery document; an admin enables it on the FederationDomain)",
                self.options.issuer
            )
            })
    }

    /// The device flow (RFC 8628): asks `endpoint` for a device login with `params` (PKCE and
    /// nonce) and the `idp` parameters, tells the user on stderr where to finish it (never
    /// stdout, which carries the credential; no browser is opened and no port listened on),
    /// then polls the token endpoint ([`poll_device_login`]) until the user has. Returns the
    /// tokens, their ID token validated as the browser flow's; fails with a one-line error when
    /// the request is refused, the login is denied or the device code expires. The device code
    /// and the PKCE verifier are never printed; debug notes show the user code and the link.
    async fn device_login(
        &self,
        provider: &Provider,
        config: &ClientConfig,
        params: &LoginParams,
        endpoint: &str,
        idp: &[(&str, &str)],
    ) -> anyhow::Result<Tokens> {
        let authorization = provider
            .device_authorization(endpoint, config, params, idp)
            .await?;
        self.debug_note(&format!(
            "device login started: user code {}, verification URI {}, valid for {} s, polling every {} s",
            authorization.user_code,
            authorization
                .verification_uri_complete
                .as_deref()
                .unwrap_or(&authorization.verification_uri),
            authorization.expires_in.as_secs(),
            authorization.interval.as_secs()
        ));
        eprint!(
            "{}",
            device_prompt(
                &authorization.user_code,
                &authorization.verification_uri,
                authorization.verification_uri_complete.as_deref(),
            )
        );
        let authorization = &authorization;
        poll_device_login(
            &TokioClock,
            authorization.expires_in,
            authorization.interval,
            || provider.poll_device_token(config, params, authorization),
            &|note| self.debug_note(note),
        )
        .await
    }

    /// `PINNIPED_USERNAME` / `PINNIPED_PASSWORD`, or prompts on the terminal.
    fn credentials(&mut self) -> anyhow::Result<(String, String)> {
        let env = |name| (self.lookup_env)(name).filter(|value: &String| !value.is_empty());
        if !self.options.upstream_identity_provider_name.is_empty() {
            eprintln!("\nLog in to {}\n", self.options.upstream_identity_provider_name);
        }
        let username = match env(USERNAME_ENV) {
            Some(username) => {
                self.debug_note(&format!("read username from environment variable {USERNAME_ENV}"));
                username
            }
            None => prompt_line("Username: ").map_err(|e| {
                anyhow::anyhow!(
                    "error prompting for username: {e} (set {USERNAME_ENV} and {PASSWORD_ENV} instead)"
                )
            })?,
        };
        let password = match env(PASSWORD_ENV) {
            Some(password) => password,
            None => prompt_secret("Password: ").map_err(|e| {
                anyhow::anyhow!("error prompting for password: {e} (set {PASSWORD_ENV} instead)")
            })?,
        };
        Ok((username, password))
    }

    async fn browser_login(
        &mut self,
        provider: &Provider,
        config: &ClientConfig,
        params: &LoginParams,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<Tokens> {
        let options = self.options;
        let listener = if options.skip_listen {
            None
        } else {
            match tokio::net::TcpListener::bind(("127.0.0.1", options.listen_port)).await {
                Ok(listener) => Some(listener),
                Err(error) => {
                    eprintln!(
                        "selkie: warning: could not open the callback listener on 127.0.0.1:{}: {error}",
                        options.listen_port
                    );
                    None
                }
            }
        };
        let stdin_tty = std::io::stdin().is_terminal();
        if listener.is_none() && !stdin_tty {
            anyhow::bail!(
                "login failed: must have either a localhost listener or stdin must be a TTY \
                 (run without --skip-listen, or in a terminal to paste the code)"
            );
        }
        let port = match &listener {
            Some(listener) => listener.local_addr()?.port(),
            None => options.listen_port,
        };
        let redirect_uri = format!("http://127.0.0.1:{port}/callback");
        let form_post = provider.discovery.supports_form_post();
        let mut authorize_extra = extra.to_vec();
        if form_post {
            authorize_extra.push(("response_mode", "form_post"));
        }
        let url = provider.authorize_url(config, params, &redirect_uri, &authorize_extra);

        let (codes, mut incoming) =
            mpsc::channel::<(CallbackOutcome, oneshot::Sender<Result<(), String>>)>(4);
        let server = listener.map(|listener| {
            let origin = origin_of(&options.issuer);
            tokio::spawn(serve_callbacks(
                listener,
                codes.clone(),
                origin,
                params.state.clone(),
            ))
        });
        let _stop_server = AbortOnDrop(server);

        let opened = !options.skip_browser && open_browser(&url, self.lookup_env).await;
        let print_url = !opened || (self.lookup_env)(SKIP_PRINT_URL_ENV).is_none();
        let mut pasted = None;
        if print_url {
            eprint!("Log in by visiting this link:\n\n    {url}\n\n");
            // Unlike pinniped (which offers the paste only with form_post), any issuer's code can
            // be pasted: the user copies it from the address bar of the redirect that did not
            // reach this machine.
            if stdin_tty {
                eprint!("{PASTE_PROMPT}");
                let _best_effort = std::io::stderr().flush();
                pasted = Some(read_line_in_background());
            }
        }

        let pasted_code = async {
            match pasted {
                Some(receiver) => receiver.await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            pasted = pasted_code => {
                let code = pasted.unwrap_or_default();
                eprintln!();
                let code = code.trim();
                if code.is_empty() {
                    anyhow::bail!("no authorization code was pasted; run the command again to log in");
                }
                Ok(provider.exchange_code(config, params, code, &redirect_uri).await?.into())
            }
            callback = incoming.recv() => {
                let Some((outcome, reply)) = callback else {
                    anyhow::bail!("the callback listener stopped before a login arrived");
                };
                let result = match outcome {
                    CallbackOutcome::Failed(reason) => Err(anyhow::anyhow!("login failed: {reason}")),
                    CallbackOutcome::Code(code) => provider
                        .exchange_code(config, params, &code, &redirect_uri)
                        .await
                        .map(Tokens::from)
                        .map_err(anyhow::Error::from),
                };
                let _gone = reply.send(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                // Let the browser get its page before this process goes on (and maybe exits).
                tokio::time::sleep(Duration::from_millis(100)).await;
                result
            }
        }
    }
}

/// What the device flow prints on stderr: the link that carries the user code (when the issuer
/// gives one) to open in a browser on any device and the code it must show, then the plain link
/// and the code to type; one blank line after.
fn device_prompt(user_code: &str, verification_uri: &str, complete: Option<&str>) -> String {
    match complete {
        Some(complete) => format!(
            "To log in, open this URL in a browser on any device:\n\n    {complete}\n\n\
             and check that it shows the code {user_code}.\n\
             (Or open {verification_uri} and enter the code {user_code}.)\n\n"
        ),
        None => format!(
            "To log in, open this URL in a browser on any device:\n\n    {verification_uri}\n\n\
             and enter the code {user_code}.\n\n"
        ),
    }
}

/// The clock [`poll_device_login`] waits on: [`TokioClock`] in the CLI, a fake one in tests.
trait PollClock {
    /// The current time.
    fn now(&self) -> tokio::time::Instant;
    /// Returns at `deadline`.
    async fn sleep_until(&self, deadline: tokio::time::Instant);
}

/// tokio's clock.
struct TokioClock;

impl PollClock for TokioClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }

    async fn sleep_until(&self, deadline: tokio::time::Instant) {
        tokio::time::sleep_until(deadline).await;
    }
}

/// Polls for a device login (RFC 8628 §3.4–3.5) until it ends. `poll` runs once `interval` has
/// passed on `clock`, then again after each further `interval`, which grows by
/// [`DEVICE_SLOW_DOWN_STEP`] after each `slow_down`; a token endpoint that cannot be reached or
/// answers 429 or a 5xx is polled again at the interval (a `debug` note each time). No poll is
/// sent once `expires_in` (from the call) has passed. Returns the tokens; fails with the poll's
/// one-line error when the login is denied, the device code expired or the answer is refused,
/// and with its own when `expires_in` passes first.
async fn poll_device_login<F, Fut>(
    clock: &impl PollClock,
    expires_in: Duration,
    mut interval: Duration,
    mut poll: F,
    debug: &dyn Fn(&str),
) -> anyhow::Result<Tokens>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = DevicePoll>,
{
    let start = clock.now();
    let deadline = start.checked_add(expires_in).unwrap_or(start);
    loop {
        let next = clock
            .now()
            .checked_add(interval)
            .map_or(deadline, |next| next.min(deadline));
        clock.sleep_until(next).await;
        if clock.now() >= deadline {
            anyhow::bail!(
                "the device code expired before the login was completed (it was valid for {} s); run the \
                 command again",
                expires_in.as_secs()
            );
        }
        match poll().await {
            DevicePoll::Pending => {}
            DevicePoll::SlowDown => {
                interval = interval.saturating_add(DEVICE_SLOW_DOWN_STEP);
                debug(&format!(
                    "the token endpoint asked to slow down; polling every {} s",
                    interval.as_secs()
                ));
            }
            DevicePoll::Tokens(tokens) => return Ok(tokens.into()),
            DevicePoll::Unavailable(error) => {
                debug(&format!("polling again in {} s: {error}", interval.as_secs()))
            }
            DevicePoll::Failed(error) => return Err(error.into()),
        }
    }
}

/// Why a refresh failed, for the debug note before a fresh login: with a DPoP key, the
/// issuer's refusals of the proof (`invalid_dpop_proof`) and of the refresh token
/// (`invalid_grant`, which a session bound to another key also gets) say so. Only the issuer's
/// OAuth error and description are quoted, never a token, proof or nonce.
fn refresh_failure(error: &OidcError, dpop_key: bool) -> String {
    match error {
        OidcError::TokenEndpoint { error: code, .. } if dpop_key && code == dpop::INVALID_PROOF_ERROR => {
            format!("the issuer refused this machine's DPoP proof of possession of its session key ({error})")
        }
        OidcError::TokenEndpoint { error: code, .. } if dpop_key && code == "invalid_grant" => format!(
            "the issuer refused the refresh token: the session ended, or it is bound to another DPoP key than \
             this machine's ({error})"
        ),
        _ => error.to_string(),
    }
}

/// `--upstream-identity-provider-type`, `oidc` when not given.
fn idp_type(options: &OidcLoginOptions) -> &str {
    match options.upstream_identity_provider_type.as_str() {
        "" => "oidc",
        other => other,
    }
}

struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// `scheme://host[:port]` of the issuer (the origin allowed to POST the form).
fn origin_of(issuer: &str) -> String {
    match issuer.parse::<http::Uri>() {
        Ok(uri) => format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("https"),
            uri.authority().map(|a| a.as_str()).unwrap_or_default()
        ),
        Err(_) => String::new(),
    }
}

type CallbackSender = mpsc::Sender<(CallbackOutcome, oneshot::Sender<Result<(), String>>)>;

/// Serves `/callback` on `listener`: GET (query) or POST (form_post body), CORS preflight for
/// the issuer's origin. Each authorization response goes to `codes`; the page shows the result.
async fn serve_callbacks(
    listener: tokio::net::TcpListener,
    codes: CallbackSender,
    origin: String,
    state: String,
) {
    let shared = Arc::new((origin, state));
    while let Ok((stream, _peer)) = listener.accept().await {
        let (codes, shared) = (codes.clone(), shared.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (codes, shared) = (codes.clone(), shared.clone());
                async move {
                    let (origin, state) = &*shared;
                    Ok::<_, std::convert::Infallible>(callback(request, &codes, origin, state).await)
                }
            });
            let _ended = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(Duration::from_secs(10))
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn callback(
    request: http::Request<hyper::body::Incoming>,
    codes: &CallbackSender,
    origin: &str,
    state: &str,
) -> http::Response<Full<Bytes>> {
    let page = |status: u16, text: &str| {
        let mut response = http::Response::new(Full::new(Bytes::from(text.to_string())));
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST);
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static("no-store"),
        );
        if let Ok(origin) = http::HeaderValue::from_str(origin) {
            headers.insert(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.insert(http::header::VARY, http::HeaderValue::from_static("*"));
        }
        response
    };
    if request.uri().path() != "/callback" {
        return page(404, "not found");
    }
    let params = match *request.method() {
        http::Method::OPTIONS => {
            let mut response = page(204, "");
            let headers = response.headers_mut();
            headers.insert(
                http::header::ACCESS_CONTROL_ALLOW_METHODS,
                http::HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            headers.insert(
                http::HeaderName::from_static("access-control-allow-private-network"),
                http::HeaderValue::from_static("true"),
            );
            return response;
        }
        http::Method::GET => CallbackParams::parse(request.uri().query().unwrap_or_default()),
        http::Method::POST => match Limited::new(request.into_body(), 64 << 10).collect().await {
            Ok(body) => CallbackParams::parse(&String::from_utf8_lossy(&body.to_bytes())),
            Err(_) => return page(400, "invalid form"),
        },
        _ => return page(405, "method not allowed"),
    };
    let (reply, result) = oneshot::channel();
    if codes.send((params.outcome(state), reply)).await.is_err() {
        return page(410, "this login has already finished; you may close this tab");
    }
    match result.await {
        Ok(Ok(())) => page(200, "you have been logged in and may now close this tab"),
        Ok(Err(reason)) => page(403, &format!("login failed: {reason}")),
        Err(_) => page(410, "this login has already finished; you may close this tab"),
    }
}

/// The CA bundle from `--ca-bundle` files and `--ca-bundle-data`; `None` for the system roots.
pub(crate) fn ca_bundle(options: &OidcLoginOptions) -> anyhow::Result<Option<Vec<u8>>> {
    let mut pem = Vec::new();
    for file in &options.ca_bundle_files {
        let bytes = std::fs::read(file)
            .map_err(|e| anyhow::anyhow!("could not read --ca-bundle {}: {e}", file.display()))?;
        pem.extend_from_slice(&bytes);
        pem.push(b'\n');
    }
    for data in &options.ca_bundle_data {
        let bytes = STANDARD
            .decode(data.trim())
            .map_err(|e| anyhow::anyhow!("--ca-bundle-data is not base64: {e}"))?;
        pem.extend_from_slice(&bytes);
        pem.push(b'\n');
    }
    Ok((!pem.is_empty()).then_some(pem))
}

/// Opens `url` with `$BROWSER` (a `:`-separated list of commands; `%s` is replaced by the URL,
/// otherwise it is the last argument), or else xdg-open, x-www-browser, www-browser. A command
/// that exits non-zero within two seconds counts as failed; one still running counts as opened.
/// The browser never gets this process's stdout (which carries the credential). The commands
/// are started and watched on tokio's blocking pool: the CLI's runtime keeps serving the
/// loopback callback meanwhile (a browser may complete the login before it exits).
async fn open_browser(url: &str, lookup_env: &dyn Fn(&str) -> Option<String>) -> bool {
    let commands: Vec<Vec<String>> = match lookup_env("BROWSER").filter(|b| !b.trim().is_empty()) {
        Some(list) => list
            .split(':')
            .map(|command| command.split_whitespace().map(String::from).collect::<Vec<_>>())
            .filter(|words| !words.is_empty())
            .collect(),
        None => ["xdg-open", "x-www-browser", "www-browser"]
            .iter()
            .map(|command| vec![command.to_string()])
            .collect(),
    };
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        commands.into_iter().any(|mut words| {
            let program = words.remove(0);
            let mut args: Vec<String> = words.iter().map(|w| w.replace("%s", &url)).collect();
            if !words.iter().any(|w| w.contains("%s")) {
                args.push(url.clone());
            }
            launch_browser(&program, &args)
        })
    })
    .await
    .unwrap_or(false)
}

/// Starts one browser command and watches it for up to two seconds (see [`open_browser`]);
/// blocks, so it runs on the blocking pool.
fn launch_browser(program: &str, args: &[String]) -> bool {
    let child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                // Still running: reap it in the background when it ends.
                std::thread::spawn(move || child.wait());
                return true;
            }
            Err(_) => return false,
        }
    }
}

/// Reads one line of stdin on a thread (a blocked read never holds up the login).
fn read_line_in_background() -> oneshot::Receiver<String> {
    let (sender, receiver) = oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line).is_ok() {
            let _gone = sender.send(line);
        }
    });
    receiver
}

fn prompt_line(prompt: &str) -> Result<String, String> {
    if !std::io::stdin().is_terminal() {
        return Err("stdin is not connected to a terminal".into());
    }
    eprint!("{prompt}");
    let _best_effort = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    Ok(line.trim().to_string())
}

fn prompt_secret(prompt: &str) -> Result<String, String> {
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err("stdin is not connected to a terminal".into());
    }
    eprint!("{prompt}");
    let _best_effort = std::io::stderr().flush();
    let original = tcgetattr(&stdin).map_err(|e| e.to_string())?;
    let mut quiet = original.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    tcsetattr(&stdin, SetArg::TCSANOW, &quiet).map_err(|e| e.to_string())?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    let _restored = tcsetattr(&stdin, SetArg::TCSANOW, &original);
    eprintln!();
    read.map_err(|e| e.to_string())?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn the_browser_comes_from_dollar_browser_and_a_failing_one_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("browser.sh");
        let seen = dir.path().join("seen");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$@\" > '{}'\n", seen.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let url = "https://issuer.example.com/authorize?state=s";

        let browser = format!("/bin/false:{} --new-window %s", script.display());
        let env = |name: &str| (name == "BROWSER").then(|| browser.clone());
        assert!(open_browser(url, &env).await);
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap(),
            format!("--new-window {url}\n")
        );

        let env = |name: &str| (name == "BROWSER").then(|| "/nonexistent/browser:/bin/false".to_string());
        assert!(!open_browser(url, &env).await);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_runtime_keeps_serving_while_a_browser_starts() {
        // A browser that stays up: open_browser watches it for two seconds. Meanwhile a task of
        // this (single-threaded) runtime, like the loopback callback server, must keep running.
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("slow-browser.sh");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let browser = script.display().to_string();
        let env = |name: &str| (name == "BROWSER").then(|| browser.clone());
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        let started = std::time::Instant::now();
        assert!(open_browser("https://issuer.example.com/authorize", &env).await);
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "watched for two seconds"
        );
        let ticked = ticks.load(std::sync::atomic::Ordering::Relaxed);
        ticker.abort();
        assert!(
            ticked >= 50,
            "the runtime ran only {ticked} ticks of 10 ms in two seconds"
        );
    }

    #[test]
    fn flows_and_ca_bundles() {
        assert_eq!(Flow::parse("cli_password"), Some(Flow::CliPassword));
        assert_eq!(Flow::parse("browser_authcode"), Some(Flow::BrowserAuthcode));
        assert_eq!(Flow::parse("device"), Some(Flow::Device));
        assert_eq!(Flow::Device.as_str(), "device");
        assert_eq!(Flow::parse("device_code"), None);
        let options = OidcLoginOptions {
            ca_bundle_data: vec![STANDARD.encode("PEM-A"), STANDARD.encode("PEM-B")],
            ..OidcLoginOptions::default()
        };
        assert_eq!(ca_bundle(&options).unwrap().unwrap(), b"PEM-A\nPEM-B\n");
        assert_eq!(ca_bundle(&OidcLoginOptions::default()).unwrap(), None);
        let bad = OidcLoginOptions {
            ca_bundle_data: vec!["not base64!".into()],
            ..OidcLoginOptions::default()
        };
        assert!(ca_bundle(&bad)
            .unwrap_err()
            .to_string()
            .contains("--ca-bundle-data is not base64"));
        assert_eq!(
            origin_of("https://issuer.example.com:8443/dex"),
            "https://issuer.example.com:8443"
        );
    }

    struct Quiet;

    impl Reporter for Quiet {
        fn warn(&mut self, _warning: &crate::cache::CacheWarning) {}
        fn debug(&mut self, _message: &str) {}
    }

    #[tokio::test]
    async fn an_unknown_flow_is_refused_naming_the_three_flows() {
        let options = OidcLoginOptions {
            issuer: "https://issuer.example.com".into(),
            upstream_identity_provider_flow: "browser_authcode".into(),
            ..OidcLoginOptions::default()
        };
        let env = |name: &str| (name == FLOW_ENV).then(|| "device_code".to_string());
        let error = run(&options, &[], &env, None, &mut Quiet).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "--upstream-identity-provider-flow (or PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW) is \
             \"device_code\": use browser_authcode, cli_password or device"
        );
    }

    #[test]
    fn a_refused_dpop_refresh_says_why_without_secrets() {
        let refused = |code: &str| OidcError::TokenEndpoint {
            what: "refreshing the session",
            status: 400,
            error: code.into(),
            description: ": the proof is not acceptable".into(),
        };
        let proof = refresh_failure(&refused("invalid_dpop_proof"), true);
        assert_eq!(
            proof,
            "the issuer refused this machine's DPoP proof of possession of its session key (refreshing \
             the session failed: the token endpoint answered 400 invalid_dpop_proof: the proof is not \
             acceptable)"
        );
        let grant = refresh_failure(&refused("invalid_grant"), true);
        assert!(
            grant.starts_with(
                "the issuer refused the refresh token: the session ended, or it is bound to another DPoP key"
            ),
            "{grant}"
        );
        // Without a key, the issuer's words alone, as before.
        assert_eq!(
            refresh_failure(&refused("invalid_grant"), false),
            "refreshing the session failed: the token endpoint answered 400 invalid_grant: the proof is not \
             acceptable"
        );
    }

    #[test]
    fn the_device_prompt_shows_the_link_with_the_code_and_the_code_to_type() {
        assert_eq!(
            device_prompt(
                "BCDF-GHJK",
                "https://issuer.example.com/device",
                Some("https://issuer.example.com/device?user_code=BCDF-GHJK"),
            ),
            "To log in, open this URL in a browser on any device:\n\n    \
             https://issuer.example.com/device?user_code=BCDF-GHJK\n\n\
             and check that it shows the code BCDF-GHJK.\n\
             (Or open https://issuer.example.com/device and enter the code BCDF-GHJK.)\n\n"
        );
        assert_eq!(
            device_prompt("BCDF-GHJK", "https://issuer.example.com/device", None),
            "To log in, open this URL in a browser on any device:\n\n    \
             https://issuer.example.com/device\n\nand enter the code BCDF-GHJK.\n\n"
        );
    }

    /// A clock whose sleeps return at once, having moved it to their deadline.
    struct FakeClock(std::cell::Cell<tokio::time::Instant>);

    impl PollClock for FakeClock {
        fn now(&self) -> tokio::time::Instant {
            self.0.get()
        }

        async fn sleep_until(&self, deadline: tokio::time::Instant) {
            self.0.set(self.0.get().max(deadline));
        }
    }

    /// Runs [`poll_device_login`] on a [`FakeClock`] against `answers`, one per poll, then
    /// `Pending` for ever. Returns its result, when each poll was sent (whole seconds from the
    /// start), the debug notes and how long it took.
    async fn device_polls(
        expires_in: u64,
        interval: u64,
        answers: Vec<DevicePoll>,
    ) -> (anyhow::Result<Tokens>, Vec<u64>, Vec<String>, Duration) {
        let start = tokio::time::Instant::now();
        let clock = FakeClock(std::cell::Cell::new(start));
        let answers = std::cell::RefCell::new(std::collections::VecDeque::from(answers));
        let sent = std::cell::RefCell::new(Vec::new());
        let notes = std::cell::RefCell::new(Vec::new());
        let result = poll_device_login(
            &clock,
            Duration::from_secs(expires_in),
            Duration::from_secs(interval),
            || {
                let elapsed = clock.now() - start;
                assert_eq!(elapsed.subsec_nanos(), 0, "a poll between seconds: {elapsed:?}");
                sent.borrow_mut().push(elapsed.as_secs());
                let answer = answers.borrow_mut().pop_front().unwrap_or(DevicePoll::Pending);
                async move { answer }
            },
            &|note| notes.borrow_mut().push(note.to_string()),
        )
        .await;
        (result, sent.into_inner(), notes.into_inner(), clock.now() - start)
    }

    fn device_tokens() -> DevicePoll {
        DevicePoll::Tokens(selkie_oidc::rp::Tokens {
            refresh: Some(selkie_oidc::rp::RefreshToken {
                token: "secret-refresh-token".into(),
            }),
            ..selkie_oidc::rp::Tokens::default()
        })
    }

    #[tokio::test]
    async fn device_polls_wait_the_interval_and_each_slow_down_adds_five_seconds() {
        let (result, sent, notes, _) = device_polls(
            600,
            5,
            vec![
                DevicePoll::Pending,
                DevicePoll::SlowDown,
                DevicePoll::Pending,
                DevicePoll::SlowDown,
                device_tokens(),
            ],
        )
        .await;
        let tokens = result.unwrap();
        assert_eq!(tokens.refresh.unwrap().token, "secret-refresh-token");
        assert_eq!(sent, [5, 10, 20, 30, 45]);
        assert_eq!(
            notes,
            [
                "the token endpoint asked to slow down; polling every 10 s",
                "the token endpoint asked to slow down; polling every 15 s",
            ]
        );
    }

    #[tokio::test]
    async fn a_denied_or_expired_device_login_ends_the_polling_with_the_issuers_words() {
        use selkie_oidc::rp::OidcError;
        let (result, sent, _, _) = device_polls(
            600,
            5,
            vec![
                DevicePoll::Pending,
                DevicePoll::Failed(OidcError::DeviceAccessDenied {
                    description: ": The login at the identity provider failed.".into(),
                }),
            ],
        )
        .await;
        assert_eq!(
            result.unwrap_err().to_string(),
            "the device login was denied: access_denied: The login at the identity provider failed."
        );
        assert_eq!(sent, [5, 10]);

        let (result, sent, _, _) = device_polls(
            600,
            2,
            vec![DevicePoll::Failed(OidcError::DeviceCodeExpired {
                description: ": The device code has expired.".into(),
            })],
        )
        .await;
        assert_eq!(
            result.unwrap_err().to_string(),
            "the device code expired before the login was completed (expired_token: The device code has \
             expired.); run the command again"
        );
        assert_eq!(sent, [2]);
    }

    #[tokio::test]
    async fn an_unavailable_token_endpoint_is_polled_again_at_the_interval() {
        use selkie_oidc::rp::OidcError;
        let unavailable = || {
            DevicePoll::Unavailable(OidcError::TokenEndpoint {
                what: "polling for the device login",
                status: 500,
                error: "(no OAuth2 error)".into(),
                description: String::new(),
            })
        };
        let (result, sent, notes, _) =
            device_polls(600, 5, vec![unavailable(), unavailable(), device_tokens()]).await;
        assert!(result.is_ok());
        assert_eq!(sent, [5, 10, 15]);
        assert_eq!(notes.len(), 2);
        assert_eq!(
            notes[0],
            "polling again in 5 s: polling for the device login failed: the token endpoint answered 500 \
             (no OAuth2 error)"
        );
    }

    #[tokio::test]
    async fn no_poll_is_sent_once_the_device_code_expired_here() {
        let (result, sent, _, took) = device_polls(12, 5, Vec::new()).await;
        assert_eq!(
            result.unwrap_err().to_string(),
            "the device code expired before the login was completed (it was valid for 12 s); run the \
             command again"
        );
        assert_eq!(sent, [5, 10]);
        assert_eq!(took, Duration::from_secs(12));
        // A slow_down past the expiry waits only until then.
        let (result, sent, _, took) = device_polls(30, 5, vec![DevicePoll::SlowDown]).await;
        assert!(result.is_err());
        assert_eq!(sent, [5, 15, 25]);
        assert_eq!(took, Duration::from_secs(30));
    }
}
