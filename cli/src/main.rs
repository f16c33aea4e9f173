//! The `selkie` binary: the pinniped CLI's commands and flags, each failure one line on stderr.
//!
//! * `selkie get kubeconfig [flags of pinniped get kubeconfig]` — a kubeconfig discovered from
//!   the cluster's CredentialIssuer and authenticator, its user running selkie.
//! * `selkie login oidc --issuer URL [--client-id ID] [--scopes …] [--enable-concierge ...]` — the
//!   exec credential plugin for an OIDC issuer (browser, pasted code or password login).
//! * `selkie login static [--token T | --token-env NAME] [--enable-concierge ...]` — the exec
//!   credential plugin; stdout carries only the `ExecCredential`.
//! * `selkie whoami [-o text|yaml|json] [--kubeconfig F] [--kubeconfig-context C] [--timeout D]
//!   [--api-group-suffix S]`
//! * `selkie version [-o json|yaml]`
//!
//! Exit status: 0 on success, 1 when the command fails, 2 when the command line is wrong.

use std::{
    ffi::OsString,
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::{error::ErrorKind, ArgAction, Args, Parser, Subcommand};
use selkie::{
    cache::CacheWarning,
    concierge::{ConciergeOptions, DEFAULT_API_GROUP_SUFFIX},
    exec::ExecInfo,
    get_kubeconfig::{self, GetKubeconfigOptions},
    kubeconfig::Kubeconfig,
    login_oidc::{self, OidcLoginOptions},
    login_static::{self, Reporter, StaticLoginOptions},
    logout, version,
    whoami::{self, parse_go_duration, WhoamiOptions},
};

/// The variable that turns on debug notes, as in the pinniped CLI.
const DEBUG_ENV: &str = "PINNIPED_DEBUG";

#[derive(Parser)]
#[command(
    name = "selkie",
    version,
    about = "Selkie's CLI: kubectl credential plugins and tools, interchangeable with the pinniped CLI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Authenticate with one of [oidc, static] (kubectl exec credential plugins, not meant to be run by hand)
    Login {
        #[command(subcommand)]
        method: Login,
    },
    /// Gets one of [kubeconfig]
    Get {
        #[command(subcommand)]
        what: Get,
    },
    /// Print information about the current user
    Whoami(WhoamiArgs),
    /// Log out of the OIDC issuer a kubeconfig context logs in to (Selkie's own command)
    ///
    /// Reads the context's `login oidc` exec arguments, removes that issuer's sessions from the
    /// session cache, revokes their refresh tokens at the issuer (when it has a revocation
    /// endpoint, as the Selkie Supervisor does), and empties the credential cache. The next
    /// kubectl call logs in again.
    Logout(LogoutArgs),
    /// Print the version of this CLI
    Version(VersionArgs),
}

#[derive(Subcommand)]
enum Login {
    /// Login using an OpenID Connect provider
    ///
    /// Logs in to an OIDC issuer (a Pinniped-compatible Supervisor, or any OIDC provider such as
    /// Dex) and prints an ExecCredential for kubectl. The browser flow (browser_authcode, the
    /// default) uses the authorization code with PKCE and a callback listener on 127.0.0.1; when
    /// no browser can be opened the URL is printed and, on a terminal, the code may be pasted.
    /// The password flow (cli_password, or PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW=cli_password)
    /// reads PINNIPED_USERNAME and PINNIPED_PASSWORD or prompts for them; it sends them as the
    /// Pinniped-Username/Pinniped-Password headers to a Supervisor's authorize endpoint, and, for
    /// an issuer that is not a Supervisor, uses the OAuth2 resource-owner password grant at its
    /// token endpoint (the issuer must allow it for the client). The device flow (--flow device,
    /// for a Supervisor whose FederationDomain enables it) prints a link and a code on stderr to
    /// finish the login in a browser on any device, and waits for it; it opens no browser and
    /// listens on no port.
    Oidc(Box<OidcArgs>),
    /// Login using a static token
    Static(Box<StaticArgs>),
}

#[derive(Subcommand)]
enum Get {
    /// Generate a Pinniped-compatible kubeconfig for a cluster (its user runs selkie)
    Kubeconfig(Box<GetKubeconfigArgs>),
}

#[derive(Args)]
struct GetKubeconfigArgs {
    /// Instead of doing an OIDC-based login, specify a static token
    #[arg(long = "static-token", default_value = "", hide_default_value = true)]
    static_token: String,
    /// Instead of doing an OIDC-based login, read a static token from the environment
    #[arg(long = "static-token-env", default_value = "", hide_default_value = true)]
    static_token_env: String,
    /// Generate a configuration which does not use the Concierge, but sends the credential to the cluster directly
    #[arg(long = "no-concierge", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    no_concierge: bool,
    /// Namespace in which the Concierge was installed (deprecated, ignored)
    #[arg(
        long = "concierge-namespace",
        hide = true,
        default_value = "pinniped-concierge"
    )]
    concierge_namespace: String,
    /// Concierge CredentialIssuer object to use for autodiscovery (default: autodiscover)
    #[arg(
        long = "concierge-credential-issuer",
        default_value = "",
        hide_default_value = true
    )]
    concierge_credential_issuer: String,
    /// Concierge authenticator type (e.g., 'webhook', 'jwt') (default: autodiscover)
    #[arg(
        long = "concierge-authenticator-type",
        default_value = "",
        hide_default_value = true
    )]
    concierge_authenticator_type: String,
    /// Concierge authenticator name (default: autodiscover)
    #[arg(
        long = "concierge-authenticator-name",
        default_value = "",
        hide_default_value = true
    )]
    concierge_authenticator_name: String,
    /// Concierge API group suffix
    #[arg(long = "concierge-api-group-suffix", default_value = DEFAULT_API_GROUP_SUFFIX)]
    concierge_api_group_suffix: String,
    /// Skip waiting for any pending Concierge strategies to become ready (default: false)
    #[arg(long = "concierge-skip-wait", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    concierge_skip_wait: bool,
    /// Path to TLS certificate authority bundle (PEM format, optional, can be repeated) to use when connecting to the Concierge
    #[arg(long = "concierge-ca-bundle")]
    concierge_ca_bundle: Vec<PathBuf>,
    /// API base for the Concierge endpoint
    #[arg(long = "concierge-endpoint", default_value = "", hide_default_value = true)]
    concierge_endpoint: String,
    /// Concierge mode of operation (TokenCredentialRequestAPI or ImpersonationProxy; default: autodetect)
    #[arg(long = "concierge-mode", default_value = "", hide_default_value = true)]
    concierge_mode: String,
    /// OpenID Connect issuer URL (default: autodiscover)
    #[arg(long = "oidc-issuer", default_value = "", hide_default_value = true)]
    oidc_issuer: String,
    /// OpenID Connect client ID (default: autodiscover)
    #[arg(long = "oidc-client-id", default_value = "pinniped-cli")]
    oidc_client_id: String,
    /// TCP port for localhost listener (authorization code flow only)
    #[arg(long = "oidc-listen-port", default_value = "0")]
    oidc_listen_port: u16,
    /// OpenID Connect scopes to request during login
    #[arg(long = "oidc-scopes", value_delimiter = ',', default_value = selkie::login_oidc::DEFAULT_SCOPES)]
    oidc_scopes: Vec<String>,
    /// During OpenID Connect login, skip opening the browser (just print the URL)
    #[arg(long = "oidc-skip-browser", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    oidc_skip_browser: bool,
    /// During OpenID Connect login, skip starting a localhost callback listener (manual copy/paste flow only)
    #[arg(long = "oidc-skip-listen", hide = true, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    oidc_skip_listen: bool,
    /// Path to OpenID Connect session cache file
    #[arg(long = "oidc-session-cache", default_value = "", hide_default_value = true)]
    oidc_session_cache: String,
    /// Path to TLS certificate authority bundle (PEM format, optional, can be repeated)
    #[arg(long = "oidc-ca-bundle")]
    oidc_ca_bundle: Vec<PathBuf>,
    /// Request a token with an alternate audience using RFC8693 token exchange
    #[arg(long = "oidc-request-audience", default_value = "", hide_default_value = true)]
    oidc_request_audience: String,
    /// The name of the upstream identity provider used during login with a Supervisor
    #[arg(
        long = "upstream-identity-provider-name",
        default_value = "",
        hide_default_value = true
    )]
    upstream_identity_provider_name: String,
    /// The type of the upstream identity provider used during login with a Supervisor (e.g. 'oidc', 'ldap', 'activedirectory', 'github')
    #[arg(
        long = "upstream-identity-provider-type",
        default_value = "",
        hide_default_value = true
    )]
    upstream_identity_provider_type: String,
    /// The type of client flow to use with the upstream identity provider during login with a Supervisor (e.g. 'cli_password', 'browser_authcode', 'device')
    #[arg(
        long = "upstream-identity-provider-flow",
        visible_alias = "flow",
        default_value = "",
        hide_default_value = true
    )]
    upstream_identity_provider_flow: String,
    /// Path to kubeconfig file [default: $KUBECONFIG, then ~/.kube/config]
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context name (default: current active context)
    #[arg(long = "kubeconfig-context")]
    kubeconfig_context: Option<String>,
    /// Skip final validation of the kubeconfig (default: false)
    #[arg(long = "skip-validation", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    skip_validation: bool,
    /// Timeout for autodiscovery and validation
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    timeout: std::time::Duration,
    /// Output file path (default: stdout)
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Suffix to append to generated cluster, context, user kubeconfig entries
    #[arg(long = "generated-name-suffix", default_value = "-pinniped")]
    generated_name_suffix: String,
    /// Path to cluster-specific credentials cache
    #[arg(long = "credential-cache")]
    credential_cache: Option<String>,
    /// Full path or executable name for the CLI binary to be embedded in the resulting kubeconfig output (e.g. 'selkie' or 'pinniped') (default: full path of the binary used to execute this command)
    #[arg(long = "pinniped-cli-path")]
    pinniped_cli_path: Option<String>,
    /// This text is shown to the user when the CLI is not installed.
    #[arg(long = "install-hint", default_value = selkie::get_kubeconfig::DEFAULT_INSTALL_HINT)]
    install_hint: String,
}

/// The Concierge flags `login oidc` and `login static` share (pinniped's names and defaults).
#[derive(Args)]
struct ConciergeArgs {
    /// Use the Concierge to login
    #[arg(long = "enable-concierge", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    enable_concierge: bool,
    /// Namespace in which the Concierge was installed (deprecated, ignored)
    #[arg(
        long = "concierge-namespace",
        hide = true,
        default_value = "pinniped-concierge"
    )]
    concierge_namespace: String,
    /// Concierge authenticator type (e.g., 'webhook', 'jwt')
    #[arg(
        long = "concierge-authenticator-type",
        default_value = "",
        hide_default_value = true
    )]
    concierge_authenticator_type: String,
    /// Concierge authenticator name
    #[arg(
        long = "concierge-authenticator-name",
        default_value = "",
        hide_default_value = true
    )]
    concierge_authenticator_name: String,
    /// API base for the Concierge endpoint
    #[arg(long = "concierge-endpoint", default_value = "", hide_default_value = true)]
    concierge_endpoint: String,
    /// CA bundle to use when connecting to the Concierge (base64 of PEM)
    #[arg(
        long = "concierge-ca-bundle-data",
        default_value = "",
        hide_default_value = true
    )]
    concierge_ca_bundle_data: String,
    /// Concierge API group suffix
    #[arg(long = "concierge-api-group-suffix", default_value = DEFAULT_API_GROUP_SUFFIX)]
    concierge_api_group_suffix: String,
    /// Path to cluster-specific credentials cache ("" disables the cache)
    /// [default: $XDG_CONFIG_HOME/pinniped/credentials.yaml or ~/.config/pinniped/credentials.yaml]
    #[arg(long = "credential-cache", value_name = "PATH")]
    credential_cache: Option<String>,
}

impl From<&ConciergeArgs> for ConciergeOptions {
    /// The Concierge settings of the flags (all but `--credential-cache`, which is not the
    /// Concierge's); `--concierge-namespace` is accepted and ignored, as pinniped ignores it.
    fn from(args: &ConciergeArgs) -> Self {
        let _deprecated_and_ignored = &args.concierge_namespace;
        Self {
            enabled: args.enable_concierge,
            authenticator_type: args.concierge_authenticator_type.clone(),
            authenticator_name: args.concierge_authenticator_name.clone(),
            endpoint: args.concierge_endpoint.clone(),
            ca_bundle_data: args.concierge_ca_bundle_data.clone(),
            api_group_suffix: args.concierge_api_group_suffix.clone(),
        }
    }
}

#[derive(Args)]
struct OidcArgs {
    /// OpenID Connect issuer URL
    #[arg(long, default_value = "", hide_default_value = true)]
    issuer: String,
    /// OpenID Connect client ID
    #[arg(long = "client-id", default_value = "pinniped-cli")]
    client_id: String,
    /// TCP port for localhost listener (authorization code flow only)
    #[arg(long = "listen-port", default_value = "0")]
    listen_port: u16,
    /// OIDC scopes to request during login
    #[arg(long, value_delimiter = ',', default_value = selkie::login_oidc::DEFAULT_SCOPES)]
    scopes: Vec<String>,
    /// Skip opening the browser (just print the URL)
    #[arg(long = "skip-browser", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    skip_browser: bool,
    /// Skip opening the local listener for OIDC login callback (user must copy and paste auth code)
    #[arg(long = "skip-listen", hide = true, num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", action = ArgAction::Set, value_parser = parse_go_bool)]
    skip_listen: bool,
    /// Path to session cache file [default: $XDG_CONFIG_HOME/pinniped/sessions.yaml or ~/.config/pinniped/sessions.yaml]
    #[arg(long = "session-cache", value_name = "PATH")]
    session_cache: Option<String>,
    /// Path to TLS certificate authority bundle (PEM format, optional, can be repeated)
    #[arg(long = "ca-bundle", value_delimiter = ',')]
    ca_bundle: Vec<PathBuf>,
    /// Base64 encoded TLS certificate authority bundle (base64 encoded PEM format, optional, can be repeated)
    #[arg(long = "ca-bundle-data", value_delimiter = ',')]
    ca_bundle_data: Vec<String>,
    /// Request a token with an alternate audience using RFC8693 token exchange
    #[arg(long = "request-audience", default_value = "", hide_default_value = true)]
    request_audience: String,
    #[command(flatten)]
    concierge: ConciergeArgs,
    /// The name of the upstream identity provider used during login with a Supervisor
    #[arg(
        long = "upstream-identity-provider-name",
        default_value = "",
        hide_default_value = true
    )]
    upstream_identity_provider_name: String,
    /// The type of the upstream identity provider used during login with a Supervisor (e.g. 'oidc', 'ldap', 'activedirectory', 'github')
    #[arg(long = "upstream-identity-provider-type", default_value = "oidc")]
    upstream_identity_provider_type: String,
    /// The type of client flow to use with the upstream identity provider during login with a Supervisor (e.g. 'browser_authcode', 'cli_password', 'device')
    #[arg(
        long = "upstream-identity-provider-flow",
        visible_alias = "flow",
        default_value = "",
        hide_default_value = true
    )]
    upstream_identity_provider_flow: String,
}

#[derive(Args)]
struct StaticArgs {
    /// Static token to present during login
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Environment variable containing a static token
    #[arg(long = "token-env", value_name = "NAME")]
    token_env: Option<String>,
    #[command(flatten)]
    concierge: ConciergeArgs,
}

#[derive(Args)]
struct WhoamiArgs {
    /// Output format (e.g., 'yaml', 'json', 'text')
    #[arg(short = 'o', long = "output", default_value = "text")]
    output: String,
    /// Path to kubeconfig file [default: $KUBECONFIG, then ~/.kube/config]
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context name (default: current active context)
    #[arg(long = "kubeconfig-context")]
    kubeconfig_context: Option<String>,
    /// Concierge API group suffix
    #[arg(long = "api-group-suffix", default_value = DEFAULT_API_GROUP_SUFFIX)]
    api_group_suffix: String,
    /// Timeout for the WhoAmI API request (default: 0, meaning no timeout)
    #[arg(long, default_value = "0", value_parser = parse_go_duration)]
    timeout: std::time::Duration,
}

#[derive(Args)]
struct LogoutArgs {
    /// Path to kubeconfig file [default: $KUBECONFIG, then ~/.kube/config]
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context name (default: current active context)
    #[arg(long = "kubeconfig-context")]
    kubeconfig_context: Option<String>,
}

#[derive(Args)]
struct VersionArgs {
    /// One of 'yaml' or 'json'
    #[arg(short = 'o', long = "output", default_value = "")]
    output: String,
}

/// Go's `strconv.ParseBool`, which cobra's boolean flags use.
fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("use true or false".into()),
    }
}

/// The default credential cache: `$XDG_CONFIG_HOME/pinniped/credentials.yaml`, or
/// `~/.config/pinniped/credentials.yaml`, the pinniped CLI's file.
fn default_credential_cache() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(&std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("pinniped").join("credentials.yaml"))
}

/// `$XDG_CONFIG_HOME/pinniped/<name>`, or `~/.config/pinniped/<name>`.
fn default_pinniped_file(name: &str) -> Option<PathBuf> {
    default_credential_cache().map(|path| path.with_file_name(name))
}

/// A cache path flag: "" disables the cache, absent means the default `name`.
fn cache_path(flag: Option<String>, name: &str, option: &str) -> anyhow::Result<Option<PathBuf>> {
    match flag {
        Some(path) if path.is_empty() => Ok(None),
        Some(path) => Ok(Some(PathBuf::from(path))),
        None => Ok(Some(default_pinniped_file(name).ok_or_else(|| {
            anyhow::anyhow!(
                "neither XDG_CONFIG_HOME nor HOME is set, so there is no default {name}: pass {option} PATH (or \"\" for none)"
            )
        })?)),
    }
}

/// The options of `login oidc` from its arguments; fails when `--issuer` is missing or a cache
/// has no default path.
fn oidc_options(args: OidcArgs) -> anyhow::Result<OidcLoginOptions> {
    if args.issuer.is_empty() {
        anyhow::bail!("required flag \"issuer\" not set: pass --issuer https://…");
    }
    Ok(OidcLoginOptions {
        issuer: args.issuer,
        client_id: args.client_id,
        listen_port: args.listen_port,
        scopes: args.scopes.into_iter().filter(|s| !s.is_empty()).collect(),
        skip_browser: args.skip_browser,
        skip_listen: args.skip_listen,
        session_cache: cache_path(args.session_cache, "sessions.yaml", "--session-cache")?,
        ca_bundle_files: args.ca_bundle,
        ca_bundle_data: args.ca_bundle_data,
        request_audience: args.request_audience,
        concierge: ConciergeOptions::from(&args.concierge),
        credential_cache: cache_path(
            args.concierge.credential_cache,
            "credentials.yaml",
            "--credential-cache",
        )?,
        upstream_identity_provider_name: args.upstream_identity_provider_name,
        upstream_identity_provider_type: args.upstream_identity_provider_type,
        upstream_identity_provider_flow: args.upstream_identity_provider_flow,
    })
}

/// `selkie logout`: the `login oidc` options of the kubeconfig context's exec plugin, then
/// [`logout::run`].
async fn run_logout(args: LogoutArgs) -> anyhow::Result<String> {
    let kubeconfig = Kubeconfig::load(args.kubeconfig.as_deref())?;
    let selected = kubeconfig.select(args.kubeconfig_context.as_deref())?;
    let exec = selected.user.exec.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "the user {:?} of context {:?} has no exec credential plugin: there is no OIDC login to log out of",
            selected.user_name,
            selected.context
        )
    })?;
    let exec_args = exec.args.clone().unwrap_or_default();
    let not_oidc = || {
        anyhow::anyhow!(
            "the user {:?} of context {:?} does not log in with `login oidc` (its plugin is {:?}): there is no OIDC login to log out of",
            selected.user_name,
            selected.context,
            exec.command
        )
    };
    let parsed =
        Cli::try_parse_from(std::iter::once("selkie".to_string()).chain(exec_args)).map_err(|error| {
            anyhow::anyhow!(
                "the context's `login oidc` arguments are not valid: {}",
                usage_error(&error)
            )
        })?;
    let Command::Login {
        method: Login::Oidc(oidc),
    } = parsed.command
    else {
        return Err(not_oidc());
    };
    let options = oidc_options(*oidc)?;
    let done = logout::run(&options, &mut |warning| {
        eprintln!("selkie: warning: {}", one_line(&warning));
    })
    .await?;
    Ok(done.render(&options.issuer))
}

/// The process arguments after the program name, as the pinniped CLI hashes `os.Args[1:]`.
fn argv() -> Vec<String> {
    std::env::args_os()
        .skip(1)
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect()
}

/// Writes cache warnings, and debug notes when asked for, to stderr.
struct Stderr {
    debug: bool,
}

impl Reporter for Stderr {
    fn warn(&mut self, warning: &CacheWarning) {
        eprintln!("selkie: warning: {}", one_line(&warning.to_string()));
    }

    fn debug(&mut self, message: &str) {
        if self.debug {
            eprintln!("selkie: debug: {message}");
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn run(cli: Cli) -> anyhow::Result<String> {
    match cli.command {
        Command::Login {
            method: Login::Oidc(args),
        } => {
            let options = oidc_options(*args)?;
            let exec_info = ExecInfo::from_env()?;
            let lookup_env = |name: &str| -> Option<String> { std::env::var(name).ok() };
            let mut reporter = Stderr {
                debug: std::env::var(DEBUG_ENV).is_ok_and(|value| value == "true"),
            };
            login_oidc::run(&options, &argv(), &lookup_env, exec_info.as_ref(), &mut reporter).await
        }
        Command::Login {
            method: Login::Static(args),
        } => {
            let args = *args;
            let concierge = ConciergeOptions::from(&args.concierge);
            let credential_cache = cache_path(
                args.concierge.credential_cache,
                "credentials.yaml",
                "--credential-cache",
            )?;
            let options = StaticLoginOptions {
                token: args.token,
                token_env: args.token_env,
                concierge,
                credential_cache,
            };
            let exec_info = ExecInfo::from_env()?;
            let argv = argv();
            let lookup_env = |name: &str| -> Option<OsString> { std::env::var_os(name) };
            let mut reporter = Stderr {
                debug: std::env::var(DEBUG_ENV).is_ok_and(|value| value == "true"),
            };
            login_static::run(&options, &argv, &lookup_env, exec_info.as_ref(), &mut reporter).await
        }
        Command::Get {
            what: Get::Kubeconfig(args),
        } => {
            let args = *args;
            let _deprecated_and_ignored = args.concierge_namespace;
            let options = GetKubeconfigOptions {
                kubeconfig: args.kubeconfig,
                kubeconfig_context: args.kubeconfig_context,
                timeout: args.timeout,
                skip_validation: args.skip_validation,
                generated_name_suffix: args.generated_name_suffix,
                credential_cache: args.credential_cache,
                cli_path: args.pinniped_cli_path,
                install_hint: args.install_hint,
                static_token: args.static_token,
                static_token_env: args.static_token_env,
                no_concierge: args.no_concierge,
                concierge_credential_issuer: args.concierge_credential_issuer,
                concierge_authenticator_type: args.concierge_authenticator_type,
                concierge_authenticator_name: args.concierge_authenticator_name,
                concierge_api_group_suffix: args.concierge_api_group_suffix,
                concierge_skip_wait: args.concierge_skip_wait,
                concierge_ca_bundle: args.concierge_ca_bundle,
                concierge_endpoint: args.concierge_endpoint,
                concierge_mode: args.concierge_mode,
                oidc_issuer: args.oidc_issuer,
                oidc_client_id: args.oidc_client_id,
                oidc_listen_port: args.oidc_listen_port,
                oidc_scopes: args.oidc_scopes.into_iter().filter(|s| !s.is_empty()).collect(),
                oidc_skip_browser: args.oidc_skip_browser,
                oidc_skip_listen: args.oidc_skip_listen,
                oidc_session_cache: args.oidc_session_cache,
                oidc_ca_bundle: args.oidc_ca_bundle,
                oidc_request_audience: args.oidc_request_audience,
                upstream_identity_provider_name: args.upstream_identity_provider_name,
                upstream_identity_provider_type: args.upstream_identity_provider_type,
                upstream_identity_provider_flow: args.upstream_identity_provider_flow,
            };
            let self_path = std::env::current_exe()
                .map_err(|e| anyhow::anyhow!("could not determine the selkie executable path: {e}"))?
                .to_string_lossy()
                .into_owned();
            let yaml =
                get_kubeconfig::run(&options, &self_path, &mut |line| eprintln!("selkie: {line}")).await?;
            match args.output {
                None => Ok(yaml),
                Some(path) => {
                    std::fs::write(&path, yaml).map_err(|e| {
                        anyhow::anyhow!("could not write the output file {}: {e}", path.display())
                    })?;
                    Ok(String::new())
                }
            }
        }
        Command::Whoami(args) => {
            let options = WhoamiOptions {
                output: args.output.parse().map_err(anyhow::Error::msg)?,
                kubeconfig: args.kubeconfig,
                context: args.kubeconfig_context,
                timeout: Some(args.timeout).filter(|timeout| !timeout.is_zero()),
                api_group_suffix: args.api_group_suffix,
            };
            whoami::run(&options).await
        }
        Command::Logout(args) => run_logout(args).await,
        Command::Version(args) => version::render(&args.output),
    }
}

/// One line for a command-line error: clap's first line, without quoting a stray positional
/// argument (it could be a token typed in the wrong place).
fn usage_error(error: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    if error.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(argument)) = error.get(ContextKind::InvalidArg) {
            return if argument.starts_with('-') {
                let flag = argument.split('=').next().unwrap_or_default();
                format!("unknown flag {flag}; see --help for the flags this command takes")
            } else {
                "unexpected positional argument (not shown); this command takes flags only, see --help".into()
            };
        }
    }
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    format!("{}; see --help", first.strip_prefix("error: ").unwrap_or(first))
}

fn main() -> ExitCode {
    // One crypto provider for the process (STYLE.md); an Err means one is installed already.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _best_effort = error.print();
                    ExitCode::SUCCESS
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _best_effort = error.print();
                    ExitCode::from(2)
                }
                _ => {
                    eprintln!("selkie: {}", usage_error(&error));
                    ExitCode::from(2)
                }
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("selkie: could not start: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(output) => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(output.as_bytes()).and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("selkie: could not write the output: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            eprintln!("selkie: {}", one_line(&format!("{error:#}")));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Concierge settings `login <method>` parses from `flags`.
    fn concierge_of(method: &str, flags: &[&str]) -> ConciergeOptions {
        let argv = ["selkie", "login", method]
            .into_iter()
            .chain(flags.iter().copied());
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Login {
                method: Login::Static(args),
            } => ConciergeOptions::from(&args.concierge),
            Command::Login {
                method: Login::Oidc(args),
            } => oidc_options(*args).unwrap().concierge,
            _ => unreachable!("a login"),
        }
    }

    #[test]
    fn both_logins_parse_the_concierge_flags_into_the_same_options() {
        let defaults = ConciergeOptions {
            api_group_suffix: DEFAULT_API_GROUP_SUFFIX.into(),
            ..ConciergeOptions::default()
        };
        let flags = [
            "--enable-concierge",
            "--concierge-authenticator-type=jwt",
            "--concierge-authenticator-name=my-jwt",
            "--concierge-endpoint=https://127.0.0.1:8443",
            "--concierge-ca-bundle-data=Q0E=",
            "--concierge-api-group-suffix=tuna.io",
            "--concierge-namespace=ignored",
            "--credential-cache=",
        ];
        let given = ConciergeOptions {
            enabled: true,
            authenticator_type: "jwt".into(),
            authenticator_name: "my-jwt".into(),
            endpoint: "https://127.0.0.1:8443".into(),
            ca_bundle_data: "Q0E=".into(),
            api_group_suffix: "tuna.io".into(),
        };
        let issuer = "--issuer=https://issuer.example.com";
        assert_eq!(concierge_of("static", &["--token=t"]), defaults);
        assert_eq!(concierge_of("oidc", &[issuer]), defaults);
        assert_eq!(concierge_of("static", &flags), given);
        let oidc_flags: Vec<&str> = std::iter::once(issuer).chain(flags).collect();
        assert_eq!(concierge_of("oidc", &oidc_flags), given);
    }

    #[test]
    fn flow_is_short_for_upstream_identity_provider_flow() {
        let parse = |argv: &[&str]| match Cli::try_parse_from(argv).unwrap().command {
            Command::Login {
                method: Login::Oidc(args),
            } => oidc_options(*args).unwrap().upstream_identity_provider_flow,
            Command::Get {
                what: Get::Kubeconfig(args),
            } => args.upstream_identity_provider_flow,
            _ => unreachable!("login oidc or get kubeconfig"),
        };
        let issuer = "--issuer=https://issuer.example.com";
        for flag in [
            ["--flow", "device"],
            ["--upstream-identity-provider-flow", "device"],
        ] {
            assert_eq!(
                parse(&[
                    "selkie",
                    "login",
                    "oidc",
                    issuer,
                    "--credential-cache=",
                    "--session-cache=",
                    flag[0],
                    flag[1]
                ]),
                "device"
            );
            assert_eq!(
                parse(&["selkie", "get", "kubeconfig", flag[0], flag[1]]),
                "device"
            );
        }
        assert_eq!(
            parse(&[
                "selkie",
                "login",
                "oidc",
                issuer,
                "--credential-cache=",
                "--session-cache="
            ]),
            ""
        );
    }
}
