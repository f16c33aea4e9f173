//! The `selkie` binary: the pinniped CLI's commands and flags, each failure one line on stderr.
//!
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
    concierge::DEFAULT_API_GROUP_SUFFIX,
    exec::ExecInfo,
    login_static::{self, Reporter, StaticLoginOptions},
    version,
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
    /// Authenticate with one of [static] (kubectl exec credential plugins, not meant to be run by hand)
    Login {
        #[command(subcommand)]
        method: Login,
    },
    /// Print information about the current user
    Whoami(WhoamiArgs),
    /// Print the version of this CLI
    Version(VersionArgs),
}

#[derive(Subcommand)]
enum Login {
    /// Login using a static token
    Static(StaticArgs),
}

#[derive(Args)]
struct StaticArgs {
    /// Static token to present during login
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Environment variable containing a static token
    #[arg(long = "token-env", value_name = "NAME")]
    token_env: Option<String>,
    /// Use the Concierge to login
    #[arg(
        long = "enable-concierge",
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true",
        action = ArgAction::Set,
        value_parser = parse_go_bool,
    )]
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
            method: Login::Static(args),
        } => {
            let _deprecated_and_ignored = args.concierge_namespace;
            let credential_cache = match args.credential_cache {
                Some(path) if path.is_empty() => None,
                Some(path) => Some(PathBuf::from(path)),
                None => Some(default_credential_cache().ok_or_else(|| {
                    anyhow::anyhow!(
                        "neither XDG_CONFIG_HOME nor HOME is set, so there is no default credential cache: \
                         pass --credential-cache PATH (or \"\" for none)"
                    )
                })?),
            };
            let options = StaticLoginOptions {
                token: args.token,
                token_env: args.token_env,
                enable_concierge: args.enable_concierge,
                concierge_authenticator_type: args.concierge_authenticator_type,
                concierge_authenticator_name: args.concierge_authenticator_name,
                concierge_endpoint: args.concierge_endpoint,
                concierge_ca_bundle_data: args.concierge_ca_bundle_data,
                concierge_api_group_suffix: args.concierge_api_group_suffix,
                credential_cache,
            };
            let exec_info = ExecInfo::from_env()?;
            // The arguments after the program name, as the pinniped CLI hashes os.Args[1:].
            let argv: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|arg| arg.to_string_lossy().into_owned())
                .collect();
            let lookup_env = |name: &str| -> Option<OsString> { std::env::var_os(name) };
            let mut reporter = Stderr {
                debug: std::env::var(DEBUG_ENV).is_ok_and(|value| value == "true"),
            };
            login_static::run(&options, &argv, &lookup_env, exec_info.as_ref(), &mut reporter).await
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
