//! The Supervisor's audit events: one JSON log line each (tracing target `audit`, beside the
//! per-request line), named as Pinniped names them — `Session Started`, `Session Refreshed`,
//! `Authentication Rejected By Transforms`, `Incorrect Username Or Password` — with the
//! FederationDomain, the identity provider and the session's ID (`storage.pinniped.dev/request-id`).
//!
//! Every request also gets a line ([`Audit::logs_request`]) except requests of the internal
//! paths (`/healthz`, polled by probes), unless `audit.logInternalPaths` is `enabled`.
//!
//! Usernames, groups and subjects are personal data: as in Pinniped they are written as
//! `redacted` unless the configuration's `audit.logUsernamesAndGroups` is `enabled`. No event
//! ever carries a password, code or token.

use serde::Deserialize;

/// The `audit` section of the configuration (Pinniped's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditConfig {
    /// `enabled` writes usernames, groups and subjects in audit events; `disabled` or empty
    /// writes `redacted`.
    #[serde(default)]
    pub log_usernames_and_groups: String,
    /// `enabled` writes the request lines of internal paths (`/healthz`) too; `disabled` or
    /// empty leaves them out.
    #[serde(default)]
    pub log_internal_paths: String,
}

/// Why an `audit` section is refused: the option named has another value than `enabled`,
/// `disabled` or empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {0} format, valid choices are 'enabled', 'disabled', or empty string (equivalent to 'disabled')"
)]
pub struct AuditConfigError(pub &'static str);

/// Writes audit events, redacting identities unless told not to.
#[derive(Debug, Clone, Copy, Default)]
pub struct Audit {
    identities: bool,
    internal_paths: bool,
}

/// The paths whose requests are not audited unless `logInternalPaths` is enabled.
const INTERNAL_PATHS: [&str; 1] = ["/healthz"];

/// `enabled` → true; `disabled` or empty → false; anything else is refused naming `option`.
fn switch(value: &str, option: &'static str) -> Result<bool, AuditConfigError> {
    match value {
        "enabled" => Ok(true),
        "disabled" | "" => Ok(false),
        _ => Err(AuditConfigError(option)),
    }
}

/// What a redacted value is written as.
const REDACTED: &str = "redacted";

impl Audit {
    /// The auditor `config` asks for. Fails on any value but `enabled`, `disabled` and empty.
    pub fn new(config: &AuditConfig) -> Result<Self, AuditConfigError> {
        Ok(Self {
            identities: switch(&config.log_usernames_and_groups, "logUsernamesAndGroups")?,
            internal_paths: switch(&config.log_internal_paths, "logInternalPaths")?,
        })
    }

    /// Whether a request to `path` gets its audit line.
    pub fn logs_request(&self, path: &str) -> bool {
        self.internal_paths || !INTERNAL_PATHS.contains(&path)
    }

    /// `value`, or `redacted`.
    fn identity<'a>(&self, value: &'a str) -> &'a str {
        if self.identities {
            value
        } else {
            REDACTED
        }
    }

    /// `groups` as JSON, or `redacted`.
    fn groups(&self, groups: &[String]) -> String {
        if self.identities {
            serde_json::to_string(groups).unwrap_or_default()
        } else {
            REDACTED.to_string()
        }
    }

    /// A login stored its session (its authorization code was issued).
    pub fn session_started(&self, issuer: &str, session: &crate::session::Session) {
        tracing::info!(
            target: "audit",
            issuer,
            session_id = %session.request_id,
            idp = %session.upstream.idp_name,
            idp_type = %session.upstream.idp_type,
            username = self.identity(&session.identity.username),
            groups = %self.groups(&session.identity.groups),
            subject = self.identity(&session.identity.subject),
            "Session Started"
        );
    }

    /// A refresh checked the user upstream again and issued new tokens.
    pub fn session_refreshed(&self, issuer: &str, session: &crate::session::Session) {
        tracing::info!(
            target: "audit",
            issuer,
            session_id = %session.request_id,
            idp = %session.upstream.idp_name,
            username = self.identity(&session.identity.username),
            groups = %self.groups(&session.identity.groups),
            "Session Refreshed"
        );
    }

    /// A client revoked a login's tokens (`/oauth2/revoke`, as at logout).
    pub fn session_revoked(&self, issuer: &str, session: &crate::session::Session) {
        tracing::info!(
            target: "audit",
            issuer,
            session_id = %session.request_id,
            client_id = %session.client_id,
            idp = %session.upstream.idp_name,
            username = self.identity(&session.identity.username),
            "Session Revoked"
        );
    }

    /// A refresh token that was used already came again (stolen, or replayed): every token of
    /// its login was revoked.
    pub fn refresh_token_reused(&self, issuer: &str, session: &crate::session::Session) {
        tracing::warn!(
            target: "audit",
            issuer,
            session_id = %session.request_id,
            client_id = %session.client_id,
            idp = %session.upstream.idp_name,
            username = self.identity(&session.identity.username),
            "Refresh Token Reused"
        );
    }

    /// A FederationDomain's policy refused a login or a refresh of the upstream user `username`.
    pub fn rejected_by_transforms(&self, issuer: &str, idp: &str, username: &str, message: &str) {
        tracing::info!(
            target: "audit",
            issuer,
            idp,
            username = self.identity(username),
            reason = message,
            "Authentication Rejected By Transforms"
        );
    }

    /// A password was not even checked: `username` failed too many times in a row at `idp`
    /// ([`crate::idp::throttle`]).
    pub fn too_many_failed_passwords(&self, issuer: &str, idp: &str, username: &str) {
        tracing::info!(
            target: "audit",
            issuer,
            idp,
            username = self.identity(username),
            "Too Many Failed Passwords"
        );
    }

    /// A username and password were refused by the identity provider (unknown user or wrong
    /// password: the event does not tell them apart either).
    pub fn incorrect_password(&self, issuer: &str, idp: &str, username: &str) {
        tracing::info!(
            target: "audit",
            issuer,
            idp,
            username = self.identity(username),
            "Incorrect Username Or Password"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_redacted_unless_enabled() {
        let config = |value: &str| AuditConfig {
            log_usernames_and_groups: value.into(),
            ..AuditConfig::default()
        };
        let redacting = Audit::new(&config("")).unwrap();
        assert_eq!(redacting.identity("pinny"), "redacted");
        assert_eq!(redacting.groups(&["seals".into()]), "redacted");
        assert_eq!(
            Audit::new(&config("disabled")).unwrap().identity("pinny"),
            "redacted"
        );
        let open = Audit::new(&config("enabled")).unwrap();
        assert_eq!(open.identity("pinny"), "pinny");
        assert_eq!(open.groups(&["seals".into()]), r#"["seals"]"#);
        assert_eq!(
            Audit::new(&config("yes")).unwrap_err().to_string(),
            "invalid logUsernamesAndGroups format, valid choices are 'enabled', 'disabled', or empty string (equivalent to 'disabled')"
        );
    }

    #[test]
    fn health_checks_are_audited_only_when_asked() {
        let quiet = Audit::new(&AuditConfig::default()).unwrap();
        assert!(!quiet.logs_request("/healthz"));
        assert!(quiet.logs_request("/issuer/oauth2/token"));
        assert!(quiet.logs_request("/no/such/path"));
        let all = Audit::new(&AuditConfig {
            log_internal_paths: "enabled".into(),
            ..AuditConfig::default()
        })
        .unwrap();
        assert!(all.logs_request("/healthz"));
        assert_eq!(
            Audit::new(&AuditConfig {
                log_internal_paths: "sometimes".into(),
                ..AuditConfig::default()
            })
            .unwrap_err(),
            AuditConfigError("logInternalPaths")
        );
    }
}
