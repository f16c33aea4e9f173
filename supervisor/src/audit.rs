//! The Supervisor's audit events: one JSON log line each (tracing target `audit`, beside the
//! per-request line), named as Pinniped names them — `Session Started`, `Session Refreshed`,
//! `Authentication Rejected By Transforms`, `Incorrect Username Or Password` — with the
//! FederationDomain, the identity provider and the session's ID (`storage.pinniped.dev/request-id`).
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
}

/// Why an `audit` section is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid logUsernamesAndGroups format, valid choices are 'enabled', 'disabled', or empty string (equivalent to 'disabled')")]
pub struct AuditConfigError;

/// Writes audit events, redacting identities unless told not to.
#[derive(Debug, Clone, Copy, Default)]
pub struct Audit {
    identities: bool,
}

/// What a redacted value is written as.
const REDACTED: &str = "redacted";

impl Audit {
    /// The auditor `config` asks for. Fails on any value but `enabled`, `disabled` and empty.
    pub fn new(config: &AuditConfig) -> Result<Self, AuditConfigError> {
        match config.log_usernames_and_groups.as_str() {
            "enabled" => Ok(Self { identities: true }),
            "disabled" | "" => Ok(Self { identities: false }),
            _ => Err(AuditConfigError),
        }
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
        assert_eq!(Audit::new(&config("yes")).unwrap_err(), AuditConfigError);
    }
}
