//! An OIDC relying party this project did not write — openid-client from npm, OpenID Certified —
//! completes discovery, the authorization code flow with PKCE, the token request and the ID token's
//! validation (signature from `jwks_uri`, `iss`, `aud`, `exp`, `nonce`) against the Supervisor.
//! The library builds the authorization request; the test plays the user's agent with the
//! `cli_password` headers (Dex's password grant behind the Supervisor), and hands the redirect back.

use std::{process::Stdio, time::Duration};

use bytes::Bytes;
use selkie_e2e::supervisor::Supervisor;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use crate::supervisor_oauth::{dex_user_namespace, DexUserNamespace, PASSWORD};

const REDIRECT: &str = "http://127.0.0.1:48124/callback";

/// The directory where e2e/scripts/setup.sh installed openid-client, with e2e/rp/rp.mjs copied
/// there (ES modules resolve packages from the script's directory). Fails, saying so, when
/// openid-client is not installed.
pub(crate) fn rp_cache() -> anyhow::Result<std::path::PathBuf> {
    let cache = std::env::var_os("SELKIE_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| std::path::PathBuf::from(home).join(".cache/selkie")))
        .ok_or_else(|| anyhow::anyhow!("neither SELKIE_CACHE_DIR nor HOME is set"))?
        .join("rp");
    anyhow::ensure!(
        cache.join("node_modules/openid-client").is_dir(),
        "openid-client is not installed in {}: run e2e/scripts/setup.sh",
        cache.display()
    );
    // Tests run in parallel: the copy is renamed into place, never seen half written.
    let copy = tempfile::NamedTempFile::new_in(&cache)?;
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rp/rp.mjs"),
        copy.path(),
    )?;
    copy.persist(cache.join("rp.mjs"))?;
    Ok(cache)
}

/// openid-client (`rp.mjs`, from [`rp_cache`]) running against a Supervisor: it has printed its
/// authorization URL and waits for the callback URL.
pub(crate) struct RelyingParty {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    _ca: tempfile::NamedTempFile,
}

impl RelyingParty {
    /// Starts `rp.mjs` for `supervisor`'s issuer (trusting its CA) with `redirect` and the
    /// identity provider `idp`, and `env` (`RP_CLIENT_ID`, `RP_CLIENT_SECRET`, `RP_SCOPE`); returns
    /// it with the authorization URL it built, which must be the issuer's (within 30 s).
    pub(crate) async fn start(
        supervisor: &Supervisor,
        redirect: &str,
        idp: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<(Self, String)> {
        let script = rp_cache()?.join("rp.mjs");
        let ca = tempfile::NamedTempFile::new()?;
        std::fs::write(ca.path(), supervisor.ca_pem())?;
        let mut child = tokio::process::Command::new("node")
            .arg(&script)
            .args([supervisor.issuer(), redirect, idp])
            .env("NODE_EXTRA_CA_CERTS", ca.path())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdout =
            tokio::io::BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?)
                .lines();
        let authorize = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await??
            .ok_or_else(|| anyhow::anyhow!("openid-client printed no authorization URL"))?;
        anyhow::ensure!(
            authorize.starts_with(&format!("{}/oauth2/authorize?", supervisor.issuer())),
            "{authorize}"
        );
        Ok((
            Self {
                child,
                stdout,
                _ca: ca,
            },
            authorize,
        ))
    }

    /// Hands it the `callback` URL (with the code) and returns what it printed (its JSON result,
    /// within 30 s); fails, with its stderr and `supervisor`'s log, when it printed nothing or
    /// exited unsuccessfully.
    pub(crate) async fn finish(mut self, callback: &str, supervisor: &Supervisor) -> anyhow::Result<Value> {
        let mut stdin = self
            .child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        stdin.write_all(format!("{callback}\n").as_bytes()).await?;
        drop(stdin);
        let result = tokio::time::timeout(Duration::from_secs(30), self.stdout.next_line()).await??;
        let output = self.child.wait_with_output().await?;
        let failed = || {
            anyhow::anyhow!(
                "openid-client failed: {}\n{}",
                String::from_utf8_lossy(&output.stderr),
                supervisor.log()
            )
        };
        let result = result.ok_or_else(failed)?;
        anyhow::ensure!(output.status.success(), failed());
        Ok(serde_json::from_str(&result)?)
    }
}

#[tokio::test]
async fn openid_client_from_npm_logs_in_through_the_supervisor() -> anyhow::Result<()> {
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-rp", &["seals"], None).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, "Dex Users").await?;
    let (rp, authorize) = RelyingParty::start(&supervisor, REDIRECT, "Dex Users", &[]).await?;

    // The user's agent: the authorization request the library built, with the password headers.
    let response = supervisor
        .client()?
        .send(
            http::Method::GET,
            &authorize,
            &[
                (
                    http::HeaderName::from_static("pinniped-username"),
                    http::HeaderValue::from_str(&email)?,
                ),
                (
                    http::HeaderName::from_static("pinniped-password"),
                    http::HeaderValue::from_static(PASSWORD),
                ),
            ],
            Bytes::new(),
            1 << 20,
            Some(Duration::from_secs(30)),
        )
        .await?;
    let location = response
        .headers
        .get(http::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        location.starts_with(&format!("{REDIRECT}?code=")),
        "{}: {location}\n{}",
        response.status,
        supervisor.log()
    );
    let result = rp.finish(&location, &supervisor).await?;
    let claims = &result["claims"];
    anyhow::ensure!(claims["iss"] == supervisor.issuer(), "{result}");
    anyhow::ensure!(claims["aud"] == serde_json::json!(["pinniped-cli"]), "{result}");
    anyhow::ensure!(claims["username"] == email.as_str(), "{result}");
    anyhow::ensure!(claims["groups"] == serde_json::json!(["seals"]), "{result}");
    anyhow::ensure!(result["token_type"] == "bearer", "{result}");
    Ok(())
}
