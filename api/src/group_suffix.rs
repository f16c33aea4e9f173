//! The configurable API group suffix (Pinniped's `apiGroupSuffix`).
//!
//! Every Selkie API group ends in `pinniped.dev` (`authentication.concierge.pinniped.dev`,
//! `config.concierge.pinniped.dev`, `login.concierge.pinniped.dev`, …). An installation may
//! replace that suffix, for example to run two Concierges side by side: with the suffix
//! `acme.example.com` the group `authentication.concierge.pinniped.dev` becomes
//! `authentication.concierge.acme.example.com`. The group prefix is never changed, and groups that
//! do not end in `.pinniped.dev` (Kubernetes' own) are never touched.
//!
//! These functions are pure string rewrites; `crds::with_api_group_suffix` (feature `crds`)
//! applies them to a whole CustomResourceDefinition.

/// The suffix every Selkie (and Pinniped) API group carries unless an installation overrides it.
pub const DEFAULT_API_GROUP_SUFFIX: &str = "pinniped.dev";

/// Why a suffix cannot be used as an API group suffix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupSuffixError {
    /// The suffix has no dot. Kubernetes requires API groups to be domain names with at least one
    /// dot; the likely culprit is a bare word such as `acme` instead of `acme.example.com`.
    #[error("API group suffix {0:?} must contain '.'")]
    NoDot(String),
    /// The suffix is not a DNS-1123 subdomain: empty, longer than 253 characters, or containing
    /// something other than lowercase letters, digits, '-' and '.', or a label that starts or ends
    /// with '-' (or is empty).
    #[error(
        "API group suffix {0:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
         each label starting and ending with a letter or digit, at most 253 characters)"
    )]
    NotDns1123Subdomain(String),
    /// The group being rewritten does not end in `.pinniped.dev`, so it is not one of ours and has
    /// no suffix to replace.
    #[error("API group {0:?} does not end in .{DEFAULT_API_GROUP_SUFFIX}")]
    NotAPinnipedGroup(String),
}

/// Checks that `suffix` can stand in for `pinniped.dev`: a DNS-1123 subdomain with at least one
/// dot, as Kubernetes requires of API group names.
pub fn validate_api_group_suffix(suffix: &str) -> Result<(), GroupSuffixError> {
    if !crate::names::is_dns1123_subdomain(suffix) {
        return Err(GroupSuffixError::NotDns1123Subdomain(suffix.to_owned()));
    }
    if !suffix.contains('.') {
        return Err(GroupSuffixError::NoDot(suffix.to_owned()));
    }
    Ok(())
}

/// Rewrites `group` (one of the default `*.pinniped.dev` groups) for `suffix`:
/// `authentication.concierge.pinniped.dev` with `acme.example.com` gives
/// `authentication.concierge.acme.example.com`.
///
/// Returns `None` when `group` does not end in `.pinniped.dev` (it is not ours, so it keeps its
/// name). The suffix is not validated here; call [`validate_api_group_suffix`] once when the
/// configuration is read.
pub fn replace_group_suffix(group: &str, suffix: &str) -> Option<String> {
    let prefix = group.strip_suffix(DEFAULT_API_GROUP_SUFFIX)?;
    if !prefix.ends_with('.') || prefix.len() == 1 {
        return None;
    }
    Some(format!("{prefix}{suffix}"))
}

/// The inverse of [`replace_group_suffix`]: maps `authentication.concierge.acme.example.com` back
/// to `authentication.concierge.pinniped.dev` for `suffix` `acme.example.com`.
///
/// Returns `None` when `group` does not end in `.<suffix>`.
pub fn unreplace_group_suffix(group: &str, suffix: &str) -> Option<String> {
    let prefix = group.strip_suffix(suffix)?;
    if !prefix.ends_with('.') || prefix.len() == 1 {
        return None;
    }
    Some(format!("{prefix}{DEFAULT_API_GROUP_SUFFIX}"))
}

#[cfg(test)]
mod tests;
