//! The LDAP side of an LDAPIdentityProvider (REFERENCE.md §1.3, §4): authenticating a user with
//! a username and password, and finding them again at refresh, the way Pinniped's upstream LDAP
//! client does it.
//!
//! A login opens one connection (TLS from the first byte, else StartTLS — Pinniped's order),
//! binds as the service account, searches `userSearch.base` for exactly one entry matching the
//! user filter (the username escaped per RFC 4515 in place of every `{}`), binds as that entry's
//! DN with the password to check it, binds as the service account again and searches
//! `groupSearch.base` for the user's groups. Every step is bounded by [`LdapUpstream::timeout`].
//! An empty password is refused before any bind: an unauthenticated simple bind "succeeds".
//!
//! Not wired into the FederationDomains yet (issue 17): the reconciler, the login flows and the
//! refresh checks come next; this module is what they call.

use std::{collections::HashMap, sync::Arc, time::Duration};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ldap3::{LdapConnAsync, LdapConnSettings, Scope, SearchEntry};

/// Where and how to search for users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSearch {
    /// The base DN.
    pub base: String,
    /// The filter, `{}` standing for the username; empty: `<username attribute>={}`.
    pub filter: String,
    /// The attribute whose value is the downstream username.
    pub username_attribute: String,
    /// The attribute whose value is the user's stable id (the `sub`).
    pub uid_attribute: String,
}

/// Where and how to search for a user's groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSearch {
    /// The base DN; empty: no group search (no groups).
    pub base: String,
    /// The filter, `{}` standing for the user's DN (or `user_attribute_for_filter`'s value);
    /// empty: `member={}`.
    pub filter: String,
    /// The user attribute whose value replaces `{}` instead of the DN (posix `memberUid`: `uid`).
    pub user_attribute_for_filter: Option<String>,
    /// The attribute whose value is a group's name; `dn`: the whole DN.
    pub group_name_attribute: String,
}

/// An LDAP upstream, as an LDAPIdentityProvider describes it.
#[derive(Clone)]
pub struct LdapUpstream {
    /// `host:port` of the directory.
    pub host: String,
    /// The TLS client configuration (trusting the provider's CA bundle, or the system roots).
    pub tls: Arc<rustls::ClientConfig>,
    /// The service account's DN.
    pub bind_dn: String,
    /// Its password.
    pub bind_password: String,
    /// The user search.
    pub user_search: UserSearch,
    /// The group search.
    pub group_search: GroupSearch,
    /// The bound of every connect, bind and search.
    pub timeout: Duration,
}

impl std::fmt::Debug for LdapUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LdapUpstream")
            .field("host", &self.host)
            .field("bind_dn", &self.bind_dn)
            .finish_non_exhaustive()
    }
}

/// Who an LDAP login found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdapIdentity {
    /// The user's entry.
    pub dn: String,
    /// The downstream username (the username attribute's value).
    pub username: String,
    /// The user's stable id: the uid attribute's value, base64url without padding (binary ids
    /// such as `objectGUID` included).
    pub uid: String,
    /// The group names.
    pub groups: Vec<String>,
}

/// Why an LDAP login failed. Never quotes a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LdapError {
    /// The username or password is wrong, or the user is not found (indistinguishable to the
    /// caller on purpose).
    #[error("the username or password is wrong")]
    InvalidCredentials,
    /// More than one entry matched the user search.
    #[error("the user search found more than one entry for the username")]
    Ambiguous,
    /// The user's entry lacks the username or uid attribute.
    #[error("the user's entry has no single value of the attribute {0:?}")]
    MissingAttribute(String),
    /// The directory could not be reached over TLS or StartTLS, or timed out.
    #[error("the LDAP server {host} could not be reached: {reason}")]
    Unreachable {
        /// `host:port`.
        host: String,
        /// What failed.
        reason: String,
    },
    /// The service account's bind failed.
    #[error("binding as the service account {0} failed")]
    ServiceBind(String),
    /// A search failed.
    #[error("searching {base} failed: {reason}")]
    Search {
        /// The base DN.
        base: String,
        /// What the server said.
        reason: String,
    },
}

/// `filter` with every `{}` replaced by `value` escaped for a filter (RFC 4515), wrapped in
/// parentheses when it is not already.
pub fn fill_filter(filter: &str, value: &str) -> String {
    let filled = filter.replace("{}", &ldap3::ldap_escape(value));
    if filled.starts_with('(') && filled.ends_with(')') {
        filled
    } else {
        format!("({filled})")
    }
}

impl LdapUpstream {
    /// Checks `username` and `password` at the directory and returns who they are; see the
    /// module documentation for the steps. Wrong credentials and unknown users are both
    /// [`LdapError::InvalidCredentials`].
    pub async fn authenticate(&self, username: &str, password: &str) -> Result<LdapIdentity, LdapError> {
        if password.is_empty() || username.is_empty() {
            return Err(LdapError::InvalidCredentials);
        }
        let mut ldap = self.connect().await?;
        let result = self.login(&mut ldap, username, password).await;
        let _ = ldap.unbind().await;
        result
    }

    /// Connects and binds as the service account, as the reconciler's connection check: `Ok`
    /// when both work.
    pub async fn probe(&self) -> Result<(), LdapError> {
        let mut ldap = self.connect().await?;
        let result = self.bind_service(&mut ldap).await;
        let _ = ldap.unbind().await;
        result
    }

    async fn login(
        &self,
        ldap: &mut ldap3::Ldap,
        username: &str,
        password: &str,
    ) -> Result<LdapIdentity, LdapError> {
        self.bind_service(ldap).await?;
        let search = &self.user_search;
        let template = if search.filter.is_empty() {
            format!("{}={{}}", search.username_attribute)
        } else {
            search.filter.clone()
        };
        let mut entries = self
            .search(
                ldap,
                &search.base,
                &fill_filter(&template, username),
                vec![search.username_attribute.as_str(), search.uid_attribute.as_str()],
            )
            .await?;
        let entry = match entries.len() {
            0 => return Err(LdapError::InvalidCredentials),
            1 => entries.remove(0),
            _ => return Err(LdapError::Ambiguous),
        };
        // The password is checked by binding as the user.
        ldap.with_timeout(self.timeout);
        match ldap.simple_bind(&entry.dn, password).await {
            Ok(result) if result.rc == 0 => {}
            Ok(_) => return Err(LdapError::InvalidCredentials),
            Err(error) => {
                return Err(LdapError::Unreachable {
                    host: self.host.clone(),
                    reason: error.to_string(),
                })
            }
        }
        let username = single_text(&entry, &search.username_attribute)?;
        let uid = single_value(&entry, &search.uid_attribute)
            .map(|bytes| B64URL.encode(bytes))
            .ok_or_else(|| LdapError::MissingAttribute(search.uid_attribute.clone()))?;
        self.bind_service(ldap).await?;
        let groups = self.groups(ldap, &entry).await?;
        Ok(LdapIdentity {
            dn: entry.dn,
            username,
            uid,
            groups,
        })
    }

    /// The names of the groups of the user `entry` ([`GroupSearch`]), sorted.
    async fn groups(&self, ldap: &mut ldap3::Ldap, entry: &SearchEntry) -> Result<Vec<String>, LdapError> {
        let search = &self.group_search;
        if search.base.is_empty() {
            return Ok(Vec::new());
        }
        let value = match &search.user_attribute_for_filter {
            Some(attribute) => single_text(entry, attribute)?,
            None => entry.dn.clone(),
        };
        let template = if search.filter.is_empty() {
            "member={}".to_string()
        } else {
            search.filter.clone()
        };
        let by_dn = search.group_name_attribute.eq_ignore_ascii_case("dn");
        let attributes = if by_dn {
            vec!["1.1"]
        } else {
            vec![search.group_name_attribute.as_str()]
        };
        let entries = self
            .search(ldap, &search.base, &fill_filter(&template, &value), attributes)
            .await?;
        let mut names: Vec<String> = entries
            .iter()
            .filter_map(|group| {
                if by_dn {
                    Some(group.dn.clone())
                } else {
                    single_text(group, &search.group_name_attribute).ok()
                }
            })
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Connects over TLS, else with StartTLS, within the timeout.
    async fn connect(&self) -> Result<ldap3::Ldap, LdapError> {
        let unreachable = |reason: String| LdapError::Unreachable {
            host: self.host.clone(),
            reason,
        };
        let settings = |starttls: bool| {
            LdapConnSettings::new()
                .set_config(self.tls.clone())
                .set_starttls(starttls)
                .set_conn_timeout(self.timeout)
        };
        let tls = LdapConnAsync::with_settings(settings(false), &format!("ldaps://{}", self.host)).await;
        let (conn, ldap) = match tls {
            Ok(connected) => connected,
            Err(tls_error) => LdapConnAsync::with_settings(settings(true), &format!("ldap://{}", self.host))
                .await
                .map_err(|starttls_error| {
                    unreachable(format!("TLS: {tls_error}; StartTLS: {starttls_error}"))
                })?,
        };
        ldap3::drive!(conn);
        let mut ldap = ldap;
        ldap.with_timeout(self.timeout);
        Ok(ldap)
    }

    async fn bind_service(&self, ldap: &mut ldap3::Ldap) -> Result<(), LdapError> {
        if self.bind_password.is_empty() {
            return Err(LdapError::ServiceBind(self.bind_dn.clone()));
        }
        ldap.with_timeout(self.timeout);
        match ldap.simple_bind(&self.bind_dn, &self.bind_password).await {
            Ok(result) if result.rc == 0 => Ok(()),
            _ => Err(LdapError::ServiceBind(self.bind_dn.clone())),
        }
    }

    async fn search(
        &self,
        ldap: &mut ldap3::Ldap,
        base: &str,
        filter: &str,
        attributes: Vec<&str>,
    ) -> Result<Vec<SearchEntry>, LdapError> {
        let failed = |reason: String| LdapError::Search {
            base: base.to_string(),
            reason,
        };
        ldap.with_timeout(self.timeout);
        let (entries, _) = ldap
            .search(base, Scope::Subtree, filter, attributes)
            .await
            .and_then(|result| result.success())
            .map_err(|e| failed(e.to_string()))?;
        Ok(entries.into_iter().map(SearchEntry::construct).collect())
    }
}

/// The one value of `attribute` in `entry`, as bytes (text or binary).
fn single_value(entry: &SearchEntry, attribute: &str) -> Option<Vec<u8>> {
    let find = |map: &HashMap<String, Vec<Vec<u8>>>| {
        map.iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(attribute))
            .and_then(|(_, values)| (values.len() == 1).then(|| values[0].clone()))
    };
    let text: HashMap<String, Vec<Vec<u8>>> = entry
        .attrs
        .iter()
        .map(|(name, values)| {
            (
                name.clone(),
                values.iter().map(|v| v.as_bytes().to_vec()).collect(),
            )
        })
        .collect();
    find(&text).or_else(|| find(&entry.bin_attrs))
}

/// The one text value of `attribute` in `entry`.
fn single_text(entry: &SearchEntry, attribute: &str) -> Result<String, LdapError> {
    single_value(entry, attribute)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| LdapError::MissingAttribute(attribute.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_escape_what_the_user_typed() {
        assert_eq!(fill_filter("uid={}", "pinny"), "(uid=pinny)");
        assert_eq!(
            fill_filter("(&(objectClass=person)(|(uid={})(mail={})))", "pinny"),
            "(&(objectClass=person)(|(uid=pinny)(mail=pinny)))"
        );
        // An injection attempt stays a literal value.
        assert_eq!(fill_filter("uid={}", "*)(uid=*"), "(uid=\\2a\\29\\28uid=\\2a)");
        assert_eq!(
            fill_filter("member={}", "cn=a\\,b,dc=x"),
            "(member=cn=a\\5c,b,dc=x)"
        );
        assert_eq!(fill_filter("uid={}", "nul\0"), "(uid=nul\\00)");
    }
}
