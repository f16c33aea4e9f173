//! `selkie login static`: the exec credential plugin for a static token (pinniped's
//! `login static`). Without the Concierge it hands the token itself to kubectl; with
//! `--enable-concierge` it exchanges the token for a short-lived client certificate with a
//! TokenCredentialRequest, reusing a cached certificate while it is valid.

use std::path::PathBuf;

use crate::{
    cache::{cache_key, CacheWarning, CredentialCache, Source},
    concierge::{ConciergeClient, ConciergeOptions, EXCHANGE_TIMEOUT},
    exec::{render, CredentialStatus, ExecApiVersion, ExecInfo},
};

/// The command's options, as the flags give them.
#[derive(Clone, Default)]
pub struct StaticLoginOptions {
    /// `--token` (never shown in `Debug`).
    pub token: Option<String>,
    /// `--token-env`.
    pub token_env: Option<String>,
    /// `--enable-concierge` and the other Concierge flags.
    pub concierge: ConciergeOptions,
    /// `--credential-cache`; `None` disables the cache.
    pub credential_cache: Option<PathBuf>,
}

impl std::fmt::Debug for StaticLoginOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticLoginOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_env", &self.token_env)
            .field("concierge", &self.concierge)
            .field("credential_cache", &self.credential_cache)
            .finish_non_exhaustive()
    }
}

/// What the login printed besides the credential: debug notes and cache warnings, for stderr.
pub trait Reporter {
    /// A cache problem the login survived.
    fn warn(&mut self, warning: &CacheWarning);
    /// A debug note (shown with `PINNIPED_DEBUG=true`).
    fn debug(&mut self, message: &str);
}

/// Runs the login: `args` are the process arguments after the program name (they are part of
/// the cache key, as in the pinniped CLI), `lookup_env` reads `--token-env`, `exec_info` is what
/// kubectl passed. Returns the `ExecCredential` to print on stdout.
pub async fn run(
    options: &StaticLoginOptions,
    args: &[String],
    lookup_env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    exec_info: Option<&ExecInfo>,
    reporter: &mut dyn Reporter,
) -> anyhow::Result<String> {
    let token = token(options, lookup_env)?;
    // Flags are checked before anything is sent or read, as the pinniped CLI does.
    let concierge = options.concierge.client()?;
    let version = exec_info.map_or(ExecApiVersion::V1Beta1, |info| info.api_version);
    let Some(concierge) = concierge else {
        // The token itself, of unknown lifetime; nothing worth caching.
        let credential = CredentialStatus {
            token,
            ..CredentialStatus::default()
        };
        return Ok(render(version, &credential));
    };

    let exchange = || exchange_token(&concierge, &token);
    let credential = match &options.credential_cache {
        None => exchange().await?,
        Some(path) => {
            let key = cache_key(args, &token, exec_info.and_then(ExecInfo::cache_cluster));
            let mut warnings = Vec::new();
            let result = CredentialCache::new(path)
                .get_or_fetch(&key, exchange, &mut |warning| warnings.push(warning))
                .await;
            for warning in &warnings {
                reporter.warn(warning);
            }
            let (credential, source) = result?;
            reporter.debug(match source {
                Source::Cache => "using cached cluster credential.",
                Source::Fetched => "exchanged static token for cluster credential.",
            });
            credential
        }
    };
    Ok(render(version, &credential))
}

async fn exchange_token(concierge: &ConciergeClient, token: &str) -> anyhow::Result<CredentialStatus> {
    concierge
        .exchange(token, EXCHANGE_TIMEOUT)
        .await
        .map_err(|e| anyhow::anyhow!("could not complete the Concierge credential exchange: {e}"))
}

/// The token: `--token`, or (taking precedence, as in the pinniped CLI) the variable named by
/// `--token-env`, which must be set and non-empty.
fn token(
    options: &StaticLoginOptions,
    lookup_env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> anyhow::Result<String> {
    let from_flag = options.token.clone().filter(|token| !token.is_empty());
    let env_name = options.token_env.as_deref().filter(|name| !name.is_empty());
    let Some(name) = env_name else {
        return from_flag.ok_or_else(|| {
            anyhow::anyhow!(
                "one of --token or --token-env must be set (the static token, or the variable holding it)"
            )
        });
    };
    match lookup_env(name) {
        None => anyhow::bail!("--token-env variable {name:?} is not set: set it to the token"),
        Some(value) if value.is_empty() => {
            anyhow::bail!("--token-env variable {name:?} is empty: set it to the token")
        }
        Some(value) => value
            .into_string()
            .map_err(|_| anyhow::anyhow!("--token-env variable {name:?} is not valid UTF-8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<String>);

    impl Reporter for Collect {
        fn warn(&mut self, warning: &CacheWarning) {
            self.0.push(warning.to_string());
        }
        fn debug(&mut self, message: &str) {
            self.0.push(message.to_string());
        }
    }

    fn no_env(_: &str) -> Option<std::ffi::OsString> {
        None
    }

    #[tokio::test]
    async fn without_the_concierge_the_token_is_the_credential() {
        let options = StaticLoginOptions {
            token: Some("s3cret".into()),
            ..StaticLoginOptions::default()
        };
        let v1 = ExecInfo::parse(
            r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{}}"#,
        )
        .unwrap();
        let out = run(&options, &[], &no_env, Some(&v1), &mut Collect::default())
            .await
            .unwrap();
        assert_eq!(
            out,
            "{\"kind\":\"ExecCredential\",\"apiVersion\":\"client.authentication.k8s.io/v1\",\"spec\":{\"interactive\":false},\"status\":{\"token\":\"s3cret\"}}\n"
        );
    }

    #[tokio::test]
    async fn the_token_comes_from_the_flag_or_the_variable() {
        let env = |name: &str| (name == "TOKEN").then(|| std::ffi::OsString::from("from-env"));
        let options = StaticLoginOptions {
            token: Some("from-flag".into()),
            token_env: Some("TOKEN".into()),
            ..StaticLoginOptions::default()
        };
        let out = run(&options, &[], &env, None, &mut Collect::default())
            .await
            .unwrap();
        assert!(out.contains("\"token\":\"from-env\""), "{out}");
        assert!(out.contains("client.authentication.k8s.io/v1beta1"), "{out}");

        for (options, expected) in [
            (
                StaticLoginOptions::default(),
                "one of --token or --token-env must be set",
            ),
            (
                StaticLoginOptions {
                    token_env: Some("UNSET".into()),
                    ..StaticLoginOptions::default()
                },
                "--token-env variable \"UNSET\" is not set",
            ),
            (
                StaticLoginOptions {
                    token: Some("t".into()),
                    concierge: ConciergeOptions {
                        enabled: true,
                        ..ConciergeOptions::default()
                    },
                    ..StaticLoginOptions::default()
                },
                "invalid Concierge parameters: --concierge-endpoint is required",
            ),
        ] {
            let error = run(&options, &[], &env, None, &mut Collect::default())
                .await
                .unwrap_err();
            assert!(format!("{error:#}").contains(expected), "{error:#}");
        }
    }
}
