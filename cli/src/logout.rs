//! `selkie logout` (Selkie's own command; the pinniped CLI has none): ends the OIDC logins a
//! kubeconfig context uses. The context's user must run `login oidc` (selkie's or pinniped's
//! arguments); from them come the issuer, the client ID, the CA bundle and the two caches. Then:
//!
//! 1. every session of that issuer and client is removed from the session cache (under its
//!    lock), whatever scopes or upstream identity provider it was for;
//! 2. their refresh tokens are revoked at the issuer's `revocation_endpoint` (RFC 7009; a Selkie
//!    Supervisor has one, a Pinniped Supervisor or Dex may not: then the issuer's sessions end
//!    when they expire, and the output says so);
//! 3. the credential cache is emptied: a cached cluster credential would otherwise keep working
//!    for its last minutes;
//! 4. once no session of the issuer is left in the session cache (any client), the issuer's DPoP
//!    key next to it ([`crate::dpop_keys`]) is deleted: nothing is bound to it any more, and the
//!    next login makes a new one.
//!
//! The next kubectl call logs in again. Nothing is printed that holds a token.

use crate::{
    cache::CredentialCache,
    dpop_keys,
    http::TlsOptions,
    login_oidc::{ca_bundle, OidcLoginOptions},
    sessions::{SessionCache, SessionWarning},
};
use selkie_oidc::rp::{ClientConfig, Provider, TokenTypeHint};

/// What a logout did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logout {
    /// Sessions removed from the session cache.
    pub sessions: usize,
    /// Refresh tokens the issuer revoked.
    pub revoked: usize,
    /// The issuer has no revocation endpoint (its sessions end when they expire).
    pub no_revocation_endpoint: bool,
    /// Cluster credentials removed from the credential cache.
    pub credentials: usize,
    /// The issuer's DPoP key file was deleted.
    pub dpop_key: bool,
}

impl Logout {
    /// The one line `selkie logout` prints for `issuer`.
    pub fn render(&self, issuer: &str) -> String {
        let sessions = match self.sessions {
            1 => "1 session".to_string(),
            n => format!("{n} sessions"),
        };
        let upstream = if self.sessions == 0 {
            String::new()
        } else if self.no_revocation_endpoint {
            "; the issuer has no revocation endpoint, so its sessions end when they expire".into()
        } else {
            format!("; {} revoked at the issuer", self.revoked)
        };
        let dpop_key = if self.dpop_key {
            "; the issuer's DPoP key deleted"
        } else {
            ""
        };
        format!(
            "logged out of {issuer}: {sessions} removed{upstream}; {} cached cluster credential(s) \
             removed{dpop_key}\n",
            self.credentials
        )
    }
}

/// Logs out of `options.issuer` for `options.client_id` (see the module documentation); a
/// session cache or credential cache that cannot be used fails the logout with its reason, and
/// so does a revocation the issuer refuses or cannot be asked (the session is removed from the
/// cache anyway; the message says the issuer may still honour its refresh token until it
/// expires). `warn` gets the problems a logout survives (a damaged cache file set aside).
pub async fn run(
    options: &OidcLoginOptions,
    warn: &mut (dyn FnMut(String) + Send),
) -> anyhow::Result<Logout> {
    let mut dpop_key = false;
    let removed = match &options.session_cache {
        None => Vec::new(),
        Some(path) => {
            let cache = SessionCache::new(path);
            let mut problem = None;
            let mut note = |warning: SessionWarning| match warning {
                SessionWarning::SetAside { .. } => warn(warning.to_string()),
                other => problem = Some(other.to_string()),
            };
            let removed = cache
                .remove(
                    |key| key.issuer == options.issuer && key.client_id == options.client_id,
                    &mut note,
                )
                .await?;
            if let Some(problem) = problem.take() {
                anyhow::bail!("the session cache was not changed: {problem}");
            }
            if !removed.left.iter().any(|key| key.issuer == options.issuer) {
                let key = dpop_keys::key_path(path, &options.issuer);
                match dpop_keys::remove(&key) {
                    Ok(deleted) => dpop_key = deleted,
                    Err(e) => warn(format!("could not delete the DPoP key {}: {e}", key.display())),
                }
            }
            removed.tokens
        }
    };
    let credentials = match &options.credential_cache {
        None => 0,
        Some(path) => CredentialCache::new(path)
            .clear(&mut |warning| warn(warning.to_string()))
            .await
            .map_err(|e| anyhow::anyhow!("the credential cache was not emptied: {e}"))?,
    };
    let refresh_tokens: Vec<String> = removed
        .iter()
        .filter_map(|tokens| tokens.refresh.as_ref().map(|refresh| refresh.token.clone()))
        .filter(|token| !token.is_empty())
        .collect();
    let sessions = removed.len();
    let mut logout = Logout {
        sessions,
        revoked: 0,
        no_revocation_endpoint: false,
        credentials,
        dpop_key,
    };
    if refresh_tokens.is_empty() {
        return Ok(logout);
    }
    let not_revoked = |e: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "removed {sessions} session(s) from the cache, but the issuer did not revoke them (it may accept their refresh tokens until they expire): {e}"
        )
    };
    let tls = TlsOptions {
        ca_pem: ca_bundle(options)?,
        ..TlsOptions::default()
    };
    let provider = Provider::discover(&options.issuer, &tls)
        .await
        .map_err(|e| not_revoked(&e))?;
    let client = ClientConfig {
        client_id: options.client_id.clone(),
        client_secret: None,
        scopes: Vec::new(),
    };
    for token in &refresh_tokens {
        match provider.revoke(&client, token, TokenTypeHint::RefreshToken).await {
            Ok(true) => logout.revoked += 1,
            Ok(false) => logout.no_revocation_endpoint = true,
            Err(error) => return Err(not_revoked(&error)),
        }
    }
    Ok(logout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_happened_at_the_issuer() {
        let mut logout = Logout {
            sessions: 2,
            revoked: 2,
            no_revocation_endpoint: false,
            credentials: 1,
            dpop_key: false,
        };
        assert_eq!(
            logout.render("https://sso.example.com"),
            "logged out of https://sso.example.com: 2 sessions removed; 2 revoked at the issuer; 1 cached cluster credential(s) removed\n"
        );
        logout.no_revocation_endpoint = true;
        assert!(logout
            .render("https://dex.example.com")
            .contains("has no revocation endpoint, so its sessions end when they expire"));
        logout.sessions = 0;
        assert_eq!(
            logout.render("https://x"),
            "logged out of https://x: 0 sessions removed; 1 cached cluster credential(s) removed\n"
        );
        logout.dpop_key = true;
        assert_eq!(
            logout.render("https://x"),
            "logged out of https://x: 0 sessions removed; 1 cached cluster credential(s) removed; the \
             issuer's DPoP key deleted\n"
        );
    }

    /// The issuer's DPoP key goes with the issuer's last session (of any client), not before.
    #[tokio::test]
    async fn the_dpop_key_is_deleted_with_the_issuers_last_session() {
        use crate::sessions::{IdToken, SessionKey, Tokens};
        let dir = tempfile::tempdir().unwrap();
        let sessions = dir.path().join("sessions.yaml");
        let issuer = "https://sso.example.com";
        let cache = SessionCache::new(&sessions);
        let expiry = crate::timestamp::format(crate::timestamp::now() + std::time::Duration::from_secs(3600));
        // ID tokens only: no refresh token to revoke, so no request to the issuer.
        let tokens = Tokens {
            id: Some(IdToken {
                claims: None,
                expiry: Some(expiry),
                token: "a.b.c".into(),
            }),
            ..Tokens::default()
        };
        for client_id in ["pinniped-cli", "other-cli"] {
            let key = SessionKey {
                client_id: client_id.into(),
                issuer: issuer.into(),
                ..SessionKey::default()
            };
            cache.put(&key, &tokens, &mut |w| panic!("{w}")).await.unwrap();
        }
        let key = dpop_keys::key_path(&sessions, issuer);
        dpop_keys::load_or_create(&key).unwrap();
        let other_issuers_key = dpop_keys::key_path(&sessions, "https://other.example.com");
        dpop_keys::load_or_create(&other_issuers_key).unwrap();

        let options = |client_id: &str| OidcLoginOptions {
            issuer: issuer.into(),
            client_id: client_id.into(),
            session_cache: Some(sessions.clone()),
            ..OidcLoginOptions::default()
        };
        let first = run(&options("pinniped-cli"), &mut |w| panic!("{w}"))
            .await
            .unwrap();
        assert_eq!((first.sessions, first.dpop_key), (1, false));
        assert!(key.exists(), "other-cli's session is still bound to it");
        let second = run(&options("other-cli"), &mut |w| panic!("{w}")).await.unwrap();
        assert_eq!((second.sessions, second.dpop_key), (1, true));
        assert!(!key.exists());
        assert!(other_issuers_key.exists());
        let third = run(&options("other-cli"), &mut |w| panic!("{w}")).await.unwrap();
        assert_eq!((third.sessions, third.dpop_key), (0, false));
    }
}
