//! golang.org/x/oauth2, the OAuth 2.0 library of the pinniped CLI, as a client of the Supervisor:
//! `selkie-oauth2-client` (built from `e2e/oauth2-client/` by `scripts/build-components.sh`, the
//! library at the version its `go.sum` pins) redeems an authorization code and then refreshes,
//! with the library's defaults — the public client `pinniped-cli`, no secret, the client
//! authentication style left to the library's auto-detection, which tries HTTP Basic with an
//! empty secret first.
//!
//! The program prints a report of non-secret facts only (which tokens came back, their type,
//! whether an expiry was given, and each token request as it went over the wire: grant type,
//! client authentication, answer status and OAuth error code); see [`Report`].

use std::{path::Path, time::Duration};

use serde::Deserialize;

use crate::{components::Components, pinniped_cli};

const TIMEOUT: Duration = Duration::from_secs(90);

/// One request to the token endpoint, as the server received it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct TokenRequest {
    /// `authorization_code` or `refresh_token`.
    pub grant_type: String,
    /// `basic` (an `Authorization: Basic` header), `none` or `other`.
    pub auth: String,
    /// The client ID of the Basic credentials.
    #[serde(default)]
    pub basic_client_id: String,
    /// Whether the Basic credentials' secret was empty.
    #[serde(default)]
    pub basic_secret_empty: bool,
    /// The `client_id` body parameter, if any.
    #[serde(default)]
    pub body_client_id: String,
    /// Whether the body had a `client_secret` parameter.
    #[serde(default)]
    pub body_client_secret: bool,
    /// The answer's status.
    pub status: u16,
    /// The OAuth 2.0 error code of a refusal.
    #[serde(default)]
    pub error: String,
}

/// What one grant returned.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Grant {
    /// Whether the library returned a token.
    pub ok: bool,
    /// The refusal (status, OAuth error code and description), if any.
    #[serde(default)]
    pub error: String,
    /// The token type (`Bearer`).
    #[serde(default)]
    pub token_type: String,
    /// Whether an access token came back, and whether it is a `pin_at_` token.
    pub has_access_token: bool,
    /// See `has_access_token`.
    pub access_token_pinniped_format: bool,
    /// Whether a refresh token came back, and whether it is a `pin_rt_` token.
    pub has_refresh_token: bool,
    /// See `has_refresh_token`.
    pub refresh_token_pinniped_format: bool,
    /// Whether an ID token came back.
    pub has_id_token: bool,
    /// Whether the answer gave an expiry (`expires_in`), and whether it lies in the future.
    pub expiry_set: bool,
    /// See `expiry_set`.
    pub expires_in_future: bool,
    /// For the refresh: whether the refresh token came back different (rotated).
    #[serde(default)]
    pub refresh_token_rotated: Option<bool>,
}

/// The report of one run.
#[derive(Debug, Clone, Deserialize)]
pub struct Report {
    /// Whether the code was redeemed and the token refreshed.
    pub ok: bool,
    /// What stopped the run before a grant (discovery, the CA), if anything.
    #[serde(default)]
    pub error: String,
    /// The token endpoint found in the issuer's discovery document.
    #[serde(default)]
    pub token_endpoint: String,
    /// The PKCE challenge the library's `S256ChallengeOption` derives from the verifier.
    #[serde(default)]
    pub code_challenge: String,
    /// Its method (`S256`).
    #[serde(default)]
    pub code_challenge_method: String,
    /// The authorization code grant (`Config.Exchange`).
    #[serde(default)]
    pub exchange: Option<Grant>,
    /// The refresh grant (a fresh `Config`'s `TokenSource` with the token expired).
    #[serde(default)]
    pub refresh: Option<Grant>,
    /// Every request to the token endpoint, in order.
    pub token_requests: Vec<TokenRequest>,
    /// Everything the program printed, stdout then stderr (to check that it holds no token).
    #[serde(skip)]
    pub output: String,
}

/// Runs the library against `issuer` (its serving CA `ca_pem`): redeems `code`, issued for an
/// authorization request with [`pinniped_cli::REDIRECT`] and the challenge of
/// [`pinniped_cli::VERIFIER`] (the requests of [`pinniped_cli::authorize_url`]), then refreshes.
/// Returns the report whatever the grants' outcome; fails only when the program cannot run or
/// prints no report (with its stderr).
pub async fn redeem_and_refresh(issuer: &str, ca_pem: &str, code: &str) -> anyhow::Result<Report> {
    let binary = &Components::get()?.oauth2_client;
    let ca_file = tempfile::NamedTempFile::new()?;
    std::fs::write(ca_file.path(), ca_pem)?;
    let output = run(binary, issuer, ca_file.path(), code).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut report: Report = serde_json::from_str(&stdout).map_err(|e| {
        anyhow::anyhow!(
            "{} ({}) printed no report ({e}): stdout {stdout:?}, stderr {stderr:?}",
            binary.display(),
            output.status,
        )
    })?;
    report.output = format!("{stdout}{stderr}");
    Ok(report)
}

async fn run(
    binary: &Path,
    issuer: &str,
    ca_file: &Path,
    code: &str,
) -> anyhow::Result<std::process::Output> {
    let mut command = tokio::process::Command::new(binary);
    command
        .arg(format!("-issuer={issuer}"))
        .arg(format!("-ca-file={}", ca_file.display()))
        .arg(format!("-code={code}"))
        .arg(format!("-redirect-uri={}", pinniped_cli::REDIRECT))
        .arg(format!("-verifier={}", pinniped_cli::VERIFIER))
        .arg(format!("-timeout={}s", TIMEOUT.as_secs() - 10))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(TIMEOUT, command.output())
        .await
        .map_err(|_| anyhow::anyhow!("{} did not finish within {TIMEOUT:?}", binary.display()))?
        .map_err(|e| anyhow::anyhow!("running {}: {e}", binary.display()))
}
