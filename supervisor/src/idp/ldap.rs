//! The directory side of LDAPIdentityProviders and ActiveDirectoryIdentityProviders
//! (REFERENCE.md §1.3, §4): authenticating a user with a username and password, and checking
//! them again at every refresh, the way Pinniped's upstream LDAP client does.
//!
//! **A login** is two steps, so that the password throttle (`crate::idp::throttle`) can count
//! the entry the directory resolves rather than what was typed: [`Directory::find_user`]
//! searches `userSearch.base`, as the service account, for exactly one entry matching the user
//! filter (the username escaped per RFC 4515 in place of every `{}`) — not a bind as the user,
//! nothing for the directory's lockout count; then [`Directory::check_password`] binds as the
//! entry's DN and, when that works, searches `groupSearch.base` for the user's groups (paged, so
//! a huge group list is no error). [`Directory::authenticate`] does both. An empty password is
//! refused before any bind: an unauthenticated simple bind "succeeds". A username longer than
//! [`MAX_USERNAME_BYTES`] is refused before any directory work. Unknown users and wrong
//! passwords are the same error.
//!
//! **A refresh** reads the stored DN again (a base-object search) and requires the same username
//! and UID; Active Directory also requires `pwdLastSet` unchanged since the login, the account
//! not disabled (`userAccountControl`) and not locked (`msDS-User-Account-Control-Computed`). The
//! groups are searched again unless `skipGroupRefresh`.
//!
//! **Connections** (TLS from the first byte, else StartTLS — Pinniped's order) are kept: searches
//! share one connection bound as the service account (LDAP multiplexes operations on it), and
//! users' binds go over a small pool of connections used for nothing else, so a login costs no
//! TLS handshake once the pool is warm. A connection found broken is replaced once. At most
//! [`MAX_IN_FLIGHT`] logins and refreshes run against one directory; more wait up to the timeout
//! and then fail as [`LdapError::Busy`], so a slow directory cannot exhaust the Supervisor. Every
//! connect, bind and search is bounded by [`DirectoryConfig::timeout`].
//!
//! **The shared search connection is made by one task at a time, and no login waits for it
//! longer than its own timeout.** When a search finds no working connection it starts a connect
//! (TLS or StartTLS, then the service bind) in a task of its own, unless one is already in
//! flight, and waits for that attempt's outcome at most [`DirectoryConfig::timeout`]; every
//! search needing the connection meanwhile waits for the same attempt, each within its own
//! timeout, and then fails as [`LdapError::Unreachable`]. No lock is held across the network: in
//! an outage, logins fail within one timeout each whatever other logins do, not one after
//! another. The attempt's outcome is installed for the searches after it; a failed attempt
//! leaves nothing behind, so the next search tries again and a recovered directory is used
//! without a restart.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ldap3::{
    adapters::{Adapter, EntriesOnly, PagedResults},
    DerefAliases, LdapConnAsync, LdapConnSettings, Scope, SearchEntry, SearchOptions,
};

use crate::idp::throttle::MAX_USERNAME_BYTES;

/// How many logins and refreshes may be in flight against one directory.
pub(crate) const MAX_IN_FLIGHT: usize = 64;
/// How many idle connections for users' binds are kept.
const MAX_IDLE_BINDERS: usize = 8;
/// The page size of group searches.
const GROUP_PAGE_SIZE: i32 = 500;
/// The attribute name that stands for the entry's DN.
const DN: &str = "dn";

/// Which kind of directory: it decides the UID encoding of `objectGUID`, the default group
/// names and the refresh checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// An LDAPIdentityProvider.
    Ldap,
    /// An ActiveDirectoryIdentityProvider.
    ActiveDirectory,
}

/// Active Directory's defaults, Pinniped's.
pub(crate) mod active_directory {
    /// The username attribute.
    pub(crate) const USERNAME_ATTRIBUTE: &str = "userPrincipalName";
    /// The UID attribute.
    pub(crate) const UID_ATTRIBUTE: &str = "objectGUID";
    /// The group name attribute (as `<sAMAccountName>@<domain>`).
    pub(crate) const GROUP_NAME_ATTRIBUTE: &str = "sAMAccountName";
    /// The user filter: a person, not a computer, not an advanced-view-only account, whose
    /// `sAMAccountName`, `mail` or `userPrincipalName` is the username, of a normal account type.
    pub(crate) const USER_FILTER: &str = "(&(objectClass=person)(!(objectClass=computer))(!(showInAdvancedViewOnly=TRUE))(|(sAMAccountName={})(mail={})(userPrincipalName={}))(sAMAccountType=805306368))";
    /// The group filter: groups with the user as a member, nested groups included.
    pub(crate) const GROUP_FILTER: &str = "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={}))";
    /// The attributes a refresh checks against the login's values.
    pub(crate) const PWD_LAST_SET: &str = "pwdLastSet";
    /// The account's flags; bit 0x2 is "disabled".
    pub(crate) const USER_ACCOUNT_CONTROL: &str = "userAccountControl";
    /// The account's computed flags; bit 0x10 is "locked out".
    pub(crate) const USER_ACCOUNT_CONTROL_COMPUTED: &str = "msDS-User-Account-Control-Computed";
}

/// Where and how to search for users.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserSearch {
    /// The base DN.
    pub base: String,
    /// The filter, `{}` standing for the username; empty: `<username attribute>={}`.
    pub filter: String,
    /// The attribute whose value is the downstream username (`dn`: the entry's DN).
    pub username_attribute: String,
    /// The attribute whose value is the user's stable id, the `sub` (`dn`: the entry's DN).
    pub uid_attribute: String,
}

/// Where and how to search for a user's groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupSearch {
    /// The base DN; empty: no group search (no groups).
    pub base: String,
    /// The filter, `{}` standing for the user's DN (or `user_attribute_for_filter`'s value);
    /// empty: `member={}`.
    pub filter: String,
    /// The user attribute whose value replaces `{}` instead of the DN (posix `memberUid`: `uid`).
    pub user_attribute_for_filter: Option<String>,
    /// The attribute whose value is a group's name; `dn` the whole DN; empty: `dn` (LDAP), or
    /// `<sAMAccountName>@<domain>` (Active Directory).
    pub group_name_attribute: String,
    /// Whether refreshes keep the login's groups instead of searching again.
    pub skip_group_refresh: bool,
}

/// A directory, as an identity provider resource describes it.
#[derive(Clone)]
pub struct DirectoryConfig {
    /// `host[:port]` of the directory.
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
    /// The bound of every connect, bind and search, and of the wait for a turn.
    pub timeout: Duration,
    /// LDAP or Active Directory.
    pub flavor: Flavor,
}

impl std::fmt::Debug for DirectoryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectoryConfig")
            .field("host", &self.host)
            .field("bind_dn", &self.bind_dn)
            .field("user_search", &self.user_search)
            .field("group_search", &self.group_search)
            .field("flavor", &self.flavor)
            .finish_non_exhaustive()
    }
}

/// Who a login found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdapIdentity {
    /// The user's entry.
    pub dn: String,
    /// The downstream username (the username attribute's value).
    pub username: String,
    /// The user's stable id: the uid attribute's value, base64url without padding (binary ids
    /// included); Active Directory's `objectGUID` as a GUID string.
    pub uid: String,
    /// The group names, sorted, without duplicates.
    pub groups: Vec<String>,
    /// What a refresh compares with (Active Directory: `pwdLastSet`, base64url).
    pub refresh_attributes: BTreeMap<String, String>,
}

/// Why a login or refresh failed. Never quotes a password.
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
    /// The user's entry lacks the username or uid attribute, or has several values of it.
    #[error("the user's entry has no single non-empty value of the attribute {0:?}")]
    MissingAttribute(String),
    /// The directory could not be reached over TLS or StartTLS, or timed out.
    #[error("the LDAP server {host} could not be reached: {reason}")]
    Unreachable {
        /// `host:port`.
        host: String,
        /// What failed.
        reason: String,
    },
    /// Too many logins are waiting for the directory.
    #[error("too many logins are waiting for the LDAP server {0}")]
    Busy(String),
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
    /// A refresh found the user changed: gone, renamed, disabled, locked, new password.
    #[error("{0}")]
    Changed(String),
}

impl LdapError {
    /// Whether the failure is the directory's (unreachable, busy, a failing search or service
    /// bind) rather than the user's: a login may be tried again later.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::Busy(_) | Self::ServiceBind(_) | Self::Search { .. }
        )
    }
}

/// What a login stored for its refreshes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLogin<'a> {
    /// The user's DN.
    pub dn: &'a str,
    /// The username at login.
    pub username: &'a str,
    /// The UID at login.
    pub uid: &'a str,
    /// The groups at login (kept when `skipGroupRefresh`).
    pub groups: &'a [String],
    /// [`LdapIdentity::refresh_attributes`] at login.
    pub refresh_attributes: &'a BTreeMap<String, String>,
}

/// The outcome of a connect of the shared search connection, as the searches waiting for it
/// see it: `None` until the attempt ends.
type Connected = Option<Result<ldap3::Ldap, LdapError>>;

/// The shared search connection's state.
enum Searcher {
    /// None (not made yet, broken, or the last attempt failed): the next search starts one.
    Idle,
    /// In use.
    Ready {
        /// Which attempt made it (a search that found it broken forgets only this one).
        generation: u64,
        ldap: ldap3::Ldap,
    },
    /// A connect in flight, in a task of its own; its outcome is sent on `done`.
    Connecting {
        generation: u64,
        done: tokio::sync::watch::Receiver<Connected>,
    },
}

/// The shared search connection and the number of the next connect attempt. Locked only to
/// read or replace the state, never across an await.
struct SearcherSlot {
    state: Searcher,
    next_generation: u64,
}

/// The lock of the shared search connection's slot (a panic while it was held left a
/// consistent state: every update is a single assignment).
fn lock(slot: &std::sync::Mutex<SearcherSlot>) -> std::sync::MutexGuard<'_, SearcherSlot> {
    slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A handle on the shared search connection.
struct SearchHandle {
    ldap: ldap3::Ldap,
    /// Which attempt made the connection.
    generation: u64,
    /// Whether it was made before this search (a failure may be its having broken since).
    reused: bool,
}

/// A user's entry, found by [`Directory::find_user`]; it holds the login's turn among the
/// [`MAX_IN_FLIGHT`] until [`Directory::check_password`] uses it (or it is dropped).
pub struct UserEntry<'a> {
    entry: SearchEntry,
    _turn: tokio::sync::SemaphorePermit<'a>,
}

impl UserEntry<'_> {
    /// The entry's DN, as the directory returned it.
    pub fn dn(&self) -> &str {
        &self.entry.dn
    }
}

impl std::fmt::Debug for UserEntry<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserEntry")
            .field("dn", &self.entry.dn)
            .finish_non_exhaustive()
    }
}

/// A directory to log users in at. Cheap to share ([`Arc`]); its connections are kept.
pub struct Directory {
    config: DirectoryConfig,
    /// The shared connection for searches, bound as the service account (shared with the task
    /// that connects it).
    searcher: Arc<std::sync::Mutex<SearcherSlot>>,
    /// Idle connections for users' binds.
    binders: std::sync::Mutex<Vec<ldap3::Ldap>>,
    /// Bounds the logins and refreshes in flight.
    permits: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.config.fmt(f)
    }
}

/// `filter` with every `{}` replaced by `value` escaped for a filter (RFC 4515), wrapped in
/// parentheses when it is not already.
pub(crate) fn fill_filter(filter: &str, value: &str) -> String {
    let filled = filter.replace("{}", &ldap3::ldap_escape(value));
    if filled.starts_with('(') && filled.ends_with(')') {
        filled
    } else {
        format!("({filled})")
    }
}

impl Directory {
    /// A directory with no connection yet (the first login makes them).
    pub fn new(config: DirectoryConfig) -> Self {
        Self {
            config,
            searcher: Arc::new(std::sync::Mutex::new(SearcherSlot {
                state: Searcher::Idle,
                next_generation: 0,
            })),
            binders: std::sync::Mutex::new(Vec::new()),
            permits: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        }
    }

    /// What it was made from.
    pub fn config(&self) -> &DirectoryConfig {
        &self.config
    }

    /// The URL that names this directory in users' `sub`: `ldaps://<host>?base=<user search
    /// base>` (Pinniped's, whatever the connection actually uses).
    pub fn url(&self) -> String {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("base", &self.config.user_search.base)
            .finish();
        format!("ldaps://{}?{query}", self.config.host)
    }

    /// Checks `username` and `password` at the directory and returns who they are:
    /// [`Directory::find_user`], then [`Directory::check_password`]. Wrong credentials and
    /// unknown users are both [`LdapError::InvalidCredentials`]. Counts nothing: logins go
    /// through `LdapUpstream::login`, which throttles between the two steps.
    pub async fn authenticate(&self, username: &str, password: &str) -> Result<LdapIdentity, LdapError> {
        if password.is_empty() {
            return Err(LdapError::InvalidCredentials);
        }
        match self.find_user(username).await? {
            Some(user) => self.check_password(user, password).await,
            None => Err(LdapError::InvalidCredentials),
        }
    }

    /// The first step of a login: the one entry the user search finds for `username`, searched
    /// as the service account (no bind as the user), holding a turn among the `MAX_IN_FLIGHT`
    /// (64); `None` when there is none. An empty username, or one longer than
    /// `MAX_USERNAME_BYTES` (1024), is [`LdapError::InvalidCredentials`] before any directory
    /// work; several entries are [`LdapError::Ambiguous`]; an entry lacking the username or UID
    /// attribute is found all the same (the second step refuses it). Fails as the directory
    /// does otherwise ([`LdapError::is_unavailable`]).
    pub async fn find_user(&self, username: &str) -> Result<Option<UserEntry<'_>>, LdapError> {
        if username.is_empty() || username.len() > MAX_USERNAME_BYTES {
            return Err(LdapError::InvalidCredentials);
        }
        let turn = self.turn().await?;
        let search = &self.config.user_search;
        let template = if search.filter.is_empty() {
            format!("{}={{}}", search.username_attribute)
        } else {
            search.filter.clone()
        };
        let mut entries = self
            .search(
                &search.base,
                Scope::Subtree,
                &fill_filter(&template, username),
                self.user_attributes(),
            )
            .await?;
        match entries.len() {
            0 => Ok(None),
            1 => Ok(Some(UserEntry {
                entry: entries.remove(0),
                _turn: turn,
            })),
            _ => Err(LdapError::Ambiguous),
        }
    }

    /// The second step of a login: checks `password` by binding as `user`'s entry and, when the
    /// directory accepts it, returns who the user is with their groups. A refused bind (or an
    /// empty password, refused without one) is [`LdapError::InvalidCredentials`] — the only
    /// error that says anything about the password; an entry without a single username or UID
    /// value is [`LdapError::MissingAttribute`]; a failing group search is
    /// [`LdapError::Search`].
    pub async fn check_password(
        &self,
        user: UserEntry<'_>,
        password: &str,
    ) -> Result<LdapIdentity, LdapError> {
        if password.is_empty() {
            return Err(LdapError::InvalidCredentials);
        }
        self.bind_user(&user.entry.dn, password).await?;
        let identity = self.identity_of(&user.entry)?;
        let groups = self.groups(&user.entry).await?;
        Ok(LdapIdentity { groups, ..identity })
    }

    /// Checks the user of a login again (see the module documentation) and returns their
    /// groups now. [`LdapError::Changed`] says what changed.
    pub async fn refresh(&self, stored: &StoredLogin<'_>) -> Result<Vec<String>, LdapError> {
        let _turn = self.turn().await?;
        let entries = self
            .search(stored.dn, Scope::Base, "(objectClass=*)", self.user_attributes())
            .await
            .map_err(|error| match error {
                // The entry is gone: noSuchObject.
                LdapError::Search { reason, .. } if reason.starts_with("rc=32 ") => {
                    LdapError::Changed(format!(
                        "searching for user {:?} resulted in 0 search results, but expected 1 result",
                        stored.dn
                    ))
                }
                other => other,
            })?;
        let [entry] = entries.as_slice() else {
            return Err(LdapError::Changed(format!(
                "searching for user {:?} resulted in {} search results, but expected 1 result",
                stored.dn,
                entries.len()
            )));
        };
        let now = self.identity_of(entry)?;
        if now.username != stored.username {
            return Err(LdapError::Changed(format!(
                "searching for user {:?} returned a different username than the previous value",
                stored.dn
            )));
        }
        if now.uid != stored.uid {
            return Err(LdapError::Changed(format!(
                "searching for user {:?} produced a different subject than the previous value",
                stored.dn
            )));
        }
        if self.config.flavor == Flavor::ActiveDirectory {
            active_directory_checks(entry, stored.refresh_attributes)?;
        }
        if self.config.group_search.skip_group_refresh {
            return Ok(stored.groups.to_vec());
        }
        self.groups(entry).await
    }

    /// Connects and binds as the service account, as the reconciler's connection check: `Ok`
    /// when both work. Uses a connection of its own.
    pub async fn probe(&self) -> Result<(), LdapError> {
        let mut ldap = self.connect().await?;
        let result = self.bind_service(&mut ldap).await;
        let _ = ldap.unbind().await;
        result
    }

    /// The root DSE's `defaultNamingContext` (Active Directory's default search base).
    pub async fn default_naming_context(&self) -> Result<String, LdapError> {
        let entries = self
            .search(
                "",
                Scope::Base,
                "(objectClass=*)",
                vec!["defaultNamingContext".into()],
            )
            .await?;
        entries
            .first()
            .and_then(|entry| text_value(entry, "defaultNamingContext").ok())
            .ok_or_else(|| LdapError::MissingAttribute("defaultNamingContext".into()))
    }

    /// A turn among the [`MAX_IN_FLIGHT`], waited for at most the timeout.
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, LdapError> {
        match tokio::time::timeout(self.config.timeout, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(LdapError::Busy(self.config.host.clone())),
        }
    }

    /// The attributes a user search asks for.
    fn user_attributes(&self) -> Vec<String> {
        let search = &self.config.user_search;
        let mut attributes: Vec<String> = [
            Some(search.username_attribute.as_str()),
            Some(search.uid_attribute.as_str()),
            self.config.group_search.user_attribute_for_filter.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|name| !name.is_empty() && *name != DN)
        .map(String::from)
        .collect();
        if self.config.flavor == Flavor::ActiveDirectory {
            attributes.extend(
                [
                    active_directory::PWD_LAST_SET,
                    active_directory::USER_ACCOUNT_CONTROL,
                    active_directory::USER_ACCOUNT_CONTROL_COMPUTED,
                ]
                .map(String::from),
            );
        }
        if attributes.is_empty() {
            attributes.push("1.1".into());
        }
        attributes
    }

    /// The username, UID and refresh attributes of the user `entry` (no groups yet).
    pub(crate) fn identity_of(&self, entry: &SearchEntry) -> Result<LdapIdentity, LdapError> {
        let search = &self.config.user_search;
        let username = text_value(entry, &search.username_attribute)?;
        let uid = if search.uid_attribute == DN {
            B64URL.encode(entry.dn.as_bytes())
        } else {
            let raw = raw_value(entry, &search.uid_attribute)?;
            if self.config.flavor == Flavor::ActiveDirectory
                && search
                    .uid_attribute
                    .eq_ignore_ascii_case(active_directory::UID_ATTRIBUTE)
            {
                microsoft_guid(&raw)
                    .ok_or_else(|| LdapError::MissingAttribute(search.uid_attribute.clone()))?
            } else {
                B64URL.encode(raw)
            }
        };
        let mut refresh_attributes = BTreeMap::new();
        if self.config.flavor == Flavor::ActiveDirectory {
            let attribute = active_directory::PWD_LAST_SET;
            refresh_attributes.insert(attribute.to_string(), B64URL.encode(raw_value(entry, attribute)?));
        }
        Ok(LdapIdentity {
            dn: entry.dn.clone(),
            username,
            uid,
            groups: Vec::new(),
            refresh_attributes,
        })
    }

    /// The names of the groups of the user `entry` ([`GroupSearch`]), sorted, de-duplicated.
    async fn groups(&self, entry: &SearchEntry) -> Result<Vec<String>, LdapError> {
        let search = &self.config.group_search;
        if search.base.is_empty() {
            return Ok(Vec::new());
        }
        let (name_attribute, _) = self.group_naming();
        let attributes = if name_attribute == DN {
            vec!["1.1".to_string()]
        } else {
            vec![name_attribute.to_string()]
        };
        let filter = self.group_filter(entry)?;
        let entries = self.paged_search(&search.base, &filter, attributes).await?;
        self.group_names(&entries)
    }

    /// The filter of the group search for the user `entry`: the template with `{}` standing for
    /// the user's DN, or for the value of `user_attribute_for_filter`.
    pub(crate) fn group_filter(&self, entry: &SearchEntry) -> Result<String, LdapError> {
        let search = &self.config.group_search;
        let value = match search.user_attribute_for_filter.as_deref() {
            Some(attribute) if !attribute.is_empty() && attribute != DN => text_value(entry, attribute)?,
            _ => entry.dn.clone(),
        };
        let template = if search.filter.is_empty() {
            "member={}".to_string()
        } else {
            search.filter.clone()
        };
        Ok(fill_filter(&template, &value))
    }

    /// How a group is named: the attribute holding its name (`dn`: the DN), and whether
    /// `@<domain>` is appended (Active Directory's default).
    fn group_naming(&self) -> (&str, bool) {
        let search = &self.config.group_search;
        let with_domain =
            self.config.flavor == Flavor::ActiveDirectory && search.group_name_attribute.is_empty();
        let name_attribute = match search.group_name_attribute.as_str() {
            "" if with_domain => active_directory::GROUP_NAME_ATTRIBUTE,
            "" => DN,
            other => other,
        };
        (name_attribute, with_domain)
    }

    /// The names of the group entries a group search found, sorted, de-duplicated; an entry
    /// without a single name is [`LdapError::MissingAttribute`].
    pub(crate) fn group_names(&self, entries: &[SearchEntry]) -> Result<Vec<String>, LdapError> {
        let (name_attribute, with_domain) = self.group_naming();
        let mut names = Vec::with_capacity(entries.len());
        for group in entries {
            let name = if name_attribute == DN {
                group.dn.clone()
            } else {
                text_value(group, name_attribute)?
            };
            names.push(if with_domain {
                format!("{name}@{}", domain_of(&group.dn))
            } else {
                name
            });
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Connects over TLS, else with StartTLS, within the timeout (each).
    async fn connect(&self) -> Result<ldap3::Ldap, LdapError> {
        connect(&self.config).await
    }

    /// Binds `ldap` as the service account.
    async fn bind_service(&self, ldap: &mut ldap3::Ldap) -> Result<(), LdapError> {
        bind_service(&self.config, ldap).await
    }

    fn unreachable(&self, error: &ldap3::LdapError) -> LdapError {
        unreachable(&self.config, error.to_string())
    }

    /// A handle on the shared search connection, waited for at most the timeout (see the module
    /// documentation): the working one, or the outcome of the connect in flight, started here
    /// when there is none. Fails as [`LdapError::Unreachable`] when the wait times out, or as the
    /// connect or the service bind failed.
    async fn searcher(&self) -> Result<SearchHandle, LdapError> {
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        let (generation, mut done) = {
            let mut slot = lock(&self.searcher);
            let in_flight = match &mut slot.state {
                Searcher::Ready { generation, ldap } => {
                    if !ldap.is_closed() {
                        return Ok(SearchHandle {
                            ldap: ldap.clone(),
                            generation: *generation,
                            reused: true,
                        });
                    }
                    None
                }
                // A connect in flight (its task gone without an outcome — a panic, a runtime
                // shutting down — counts as none).
                Searcher::Connecting { generation, done } => {
                    done.has_changed().is_ok().then(|| (*generation, done.clone()))
                }
                Searcher::Idle => None,
            };
            match in_flight {
                Some(in_flight) => in_flight,
                None => {
                    let generation = slot.next_generation;
                    slot.next_generation = generation.wrapping_add(1);
                    let (sender, done) = tokio::sync::watch::channel(None);
                    slot.state = Searcher::Connecting {
                        generation,
                        done: done.clone(),
                    };
                    tokio::spawn(connect_searcher(
                        self.config.clone(),
                        self.searcher.clone(),
                        generation,
                        sender,
                    ));
                    (generation, done)
                }
            }
        };
        let waited = tokio::time::timeout_at(deadline, done.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(outcome)) => match &*outcome {
                Some(Ok(ldap)) => Ok(SearchHandle {
                    ldap: ldap.clone(),
                    generation,
                    reused: false,
                }),
                Some(Err(error)) => Err(error.clone()),
                None => Err(unreachable(&self.config, "the connection attempt ended without an outcome".into())),
            },
            Ok(Err(_)) => Err(unreachable(&self.config, "the connection attempt was abandoned".into())),
            Err(_) => Err(unreachable(
                &self.config,
                format!(
                    "no connection within {:?} (connecting over TLS or StartTLS and binding as the service account)",
                    self.config.timeout
                ),
            )),
        }
    }

    /// Forgets the shared search connection made by attempt `generation` (it broke); a newer one
    /// (or a connect in flight) stays.
    fn drop_searcher(&self, generation: u64) {
        let mut slot = lock(&self.searcher);
        if matches!(slot.state, Searcher::Ready { generation: current, .. } if current == generation) {
            slot.state = Searcher::Idle;
        }
    }

    /// A search of at most two entries (the user searches want exactly one), on the shared
    /// connection; a broken kept connection is replaced once.
    async fn search(
        &self,
        base: &str,
        scope: Scope,
        filter: &str,
        attributes: Vec<String>,
    ) -> Result<Vec<SearchEntry>, LdapError> {
        let mut retried = false;
        loop {
            let SearchHandle {
                mut ldap,
                generation,
                reused,
            } = self.searcher().await?;
            ldap.with_timeout(self.config.timeout).with_search_options(
                SearchOptions::new()
                    .deref(DerefAliases::Never)
                    .sizelimit(2)
                    .timelimit(90),
            );
            match ldap.search(base, scope, filter, attributes.clone()).await {
                Ok(result) => {
                    let (entries, done) = (result.0, result.1);
                    let entries: Vec<SearchEntry> = entries
                        .into_iter()
                        .filter(|entry| !entry.is_ref() && !entry.is_intermediate())
                        .map(|entry| entry_of(entry, base))
                        .collect::<Result<_, _>>()?;
                    // sizeLimitExceeded with two entries is an ambiguous username, not a failure.
                    if done.rc == 0 || (done.rc == 4 && entries.len() > 1) {
                        return Ok(entries);
                    }
                    return Err(LdapError::Search {
                        base: base.to_string(),
                        reason: result_text(done.rc, &done.text),
                    });
                }
                Err(error) if reused && !retried && !matches!(error, ldap3::LdapError::Timeout { .. }) => {
                    self.drop_searcher(generation);
                    retried = true;
                }
                Err(error) => {
                    self.drop_searcher(generation);
                    return Err(self.unreachable(&error));
                }
            }
        }
    }

    /// A paged search of any number of entries (group searches), on the shared connection.
    async fn paged_search(
        &self,
        base: &str,
        filter: &str,
        attributes: Vec<String>,
    ) -> Result<Vec<SearchEntry>, LdapError> {
        let failed = |reason: String| LdapError::Search {
            base: base.to_string(),
            reason,
        };
        let mut retried = false;
        loop {
            let SearchHandle {
                mut ldap,
                generation,
                reused,
            } = self.searcher().await?;
            ldap.with_timeout(self.config.timeout)
                .with_search_options(SearchOptions::new().deref(DerefAliases::Never).timelimit(90));
            let adapters: Vec<Box<dyn Adapter<String, Vec<String>>>> = vec![
                Box::new(EntriesOnly::new()),
                Box::new(PagedResults::new(GROUP_PAGE_SIZE)),
            ];
            let mut stream = match ldap
                .streaming_search_with(adapters, base, Scope::Subtree, filter, attributes.clone())
                .await
            {
                Ok(stream) => stream,
                Err(error) if reused && !retried && !matches!(error, ldap3::LdapError::Timeout { .. }) => {
                    self.drop_searcher(generation);
                    retried = true;
                    continue;
                }
                Err(error) => return Err(failed(error.to_string())),
            };
            let mut entries = Vec::new();
            loop {
                match stream.next().await {
                    Ok(Some(entry)) => entries.push(entry_of(entry, base)?),
                    Ok(None) => break,
                    Err(error) => return Err(failed(error.to_string())),
                }
            }
            let done = stream.finish().await;
            if done.rc != 0 {
                return Err(failed(result_text(done.rc, &done.text)));
            }
            return Ok(entries);
        }
    }

    /// Checks `password` by binding as `dn` on a connection of the bind pool.
    async fn bind_user(&self, dn: &str, password: &str) -> Result<(), LdapError> {
        let idle = self.binders.lock().map(|mut idle| idle.pop()).unwrap_or_default();
        let (mut ldap, reused) = match idle {
            Some(ldap) => (ldap, true),
            None => (self.connect().await?, false),
        };
        ldap.with_timeout(self.config.timeout);
        let outcome = match ldap.simple_bind(dn, password).await {
            Err(error) if reused && !matches!(error, ldap3::LdapError::Timeout { .. }) => {
                ldap = self.connect().await?;
                ldap.with_timeout(self.config.timeout);
                ldap.simple_bind(dn, password).await
            }
            other => other,
        };
        match outcome {
            Ok(result) => {
                if let Ok(mut idle) = self.binders.lock() {
                    if idle.len() < MAX_IDLE_BINDERS {
                        idle.push(ldap);
                    }
                }
                match result.rc {
                    0 => Ok(()),
                    // invalidCredentials; anything else (e.g. a locked account) is no login either.
                    _ => Err(LdapError::InvalidCredentials),
                }
            }
            Err(error) => Err(self.unreachable(&error)),
        }
    }
}

/// Connects to `config`'s directory over TLS, else with StartTLS, each attempt within the
/// timeout; fails as [`LdapError::Unreachable`] naming both failures.
async fn connect(config: &DirectoryConfig) -> Result<ldap3::Ldap, LdapError> {
    let host = &config.host;
    let settings = |starttls: bool| {
        LdapConnSettings::new()
            .set_config(config.tls.clone())
            .set_starttls(starttls)
            .set_conn_timeout(config.timeout)
    };
    let tls = LdapConnAsync::with_settings(settings(false), &format!("ldaps://{host}")).await;
    let (conn, ldap) = match tls {
        Ok(connected) => connected,
        Err(tls_error) => LdapConnAsync::with_settings(settings(true), &format!("ldap://{host}"))
            .await
            .map_err(|starttls_error| {
                unreachable(config, format!("TLS: {tls_error}; StartTLS: {starttls_error}"))
            })?,
    };
    ldap3::drive!(conn);
    Ok(ldap)
}

/// Binds `ldap` as `config`'s service account within the timeout: [`LdapError::ServiceBind`]
/// when refused (or no password is configured), [`LdapError::Unreachable`] when it fails.
async fn bind_service(config: &DirectoryConfig, ldap: &mut ldap3::Ldap) -> Result<(), LdapError> {
    if config.bind_password.is_empty() {
        return Err(LdapError::ServiceBind(config.bind_dn.clone()));
    }
    ldap.with_timeout(config.timeout);
    match ldap.simple_bind(&config.bind_dn, &config.bind_password).await {
        Ok(result) if result.rc == 0 => Ok(()),
        Ok(_) => Err(LdapError::ServiceBind(config.bind_dn.clone())),
        Err(error) => Err(unreachable(config, error.to_string())),
    }
}

fn unreachable(config: &DirectoryConfig, reason: String) -> LdapError {
    LdapError::Unreachable {
        host: config.host.clone(),
        reason,
    }
}

/// The task of connect attempt `generation` of the shared search connection in `slot`: connects
/// and binds as the service account (each step within the timeout), installs the connection
/// (or, on failure, nothing, so the next search tries again) unless the slot has moved on, then
/// sends the outcome to the searches waiting on `done`.
async fn connect_searcher(
    config: DirectoryConfig,
    slot: Arc<std::sync::Mutex<SearcherSlot>>,
    generation: u64,
    done: tokio::sync::watch::Sender<Connected>,
) {
    let outcome = async {
        let mut ldap = connect(&config).await?;
        bind_service(&config, &mut ldap).await?;
        Ok(ldap)
    }
    .await;
    {
        let mut slot = lock(&slot);
        if matches!(slot.state, Searcher::Connecting { generation: current, .. } if current == generation) {
            slot.state = match &outcome {
                Ok(ldap) => Searcher::Ready {
                    generation,
                    ldap: ldap.clone(),
                },
                Err(_) => Searcher::Idle,
            };
        }
    }
    done.send_replace(Some(outcome));
}

/// The entry of a search answer. `ldap3` panics on an entry it cannot read (a DN that is not
/// UTF-8, a malformed message): a directory's bad answer is an error, never a crash.
pub(crate) fn entry_of(entry: ldap3::ResultEntry, base: &str) -> Result<SearchEntry, LdapError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| SearchEntry::construct(entry))).map_err(|_| {
        LdapError::Search {
            base: base.to_string(),
            reason: "the directory answered with an entry that cannot be read".into(),
        }
    })
}

/// An LDAP result code with its name and the server's text, e.g. `rc=4 (sizeLimitExceeded)`.
fn result_text(rc: u32, text: &str) -> String {
    let name = match rc {
        1 => "operationsError",
        3 => "timeLimitExceeded",
        4 => "sizeLimitExceeded: the directory limits how many entries the bind account may read",
        10 => "referral",
        11 => "adminLimitExceeded",
        32 => "noSuchObject",
        34 => "invalidDNSyntax",
        50 => "insufficientAccessRights",
        51 => "busy",
        52 => "unavailable",
        53 => "unwillingToPerform",
        _ => "",
    };
    let mut out = format!("rc={rc}");
    if !name.is_empty() {
        out.push_str(&format!(" ({name})"));
    }
    if !text.is_empty() {
        out.push_str(&format!(": {text}"));
    }
    out
}

/// Active Directory's refresh checks: `pwdLastSet` as at login, the account neither disabled nor
/// locked.
pub(crate) fn active_directory_checks(
    entry: &SearchEntry,
    at_login: &BTreeMap<String, String>,
) -> Result<(), LdapError> {
    let changed = |what: &str| {
        LdapError::Changed(format!(
            "validation for attribute {what} failed during upstream refresh"
        ))
    };
    let pwd = active_directory::PWD_LAST_SET;
    let now = raw_value(entry, pwd).map(|raw| B64URL.encode(raw)).ok();
    if now.is_none() || now.as_ref() != at_login.get(pwd) {
        return Err(changed(&format!("{pwd:?}: the password changed since the login")));
    }
    let flags = |attribute: &str| -> Result<u64, LdapError> {
        text_value(entry, attribute)?
            .trim()
            .parse::<i64>()
            .map(|value| value as u64)
            .map_err(|_| changed(&format!("{attribute:?}: not a number")))
    };
    if flags(active_directory::USER_ACCOUNT_CONTROL)? & 0x2 != 0 {
        return Err(changed("\"userAccountControl\": user has been deactivated"));
    }
    if flags(active_directory::USER_ACCOUNT_CONTROL_COMPUTED)? & 0x10 != 0 {
        return Err(changed(
            "\"msDS-User-Account-Control-Computed\": user has been locked",
        ));
    }
    Ok(())
}

/// Active Directory's `objectGUID` bytes as a GUID string: the first three fields are stored
/// little-endian. `None` unless 16 bytes.
pub(crate) fn microsoft_guid(raw: &[u8]) -> Option<String> {
    let b: [u8; 16] = raw.try_into().ok()?;
    let ordered = [
        b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15],
    ];
    Some(crate::session::uuid_text(&ordered))
}

/// The DNS domain of a DN: its `DC=` components joined with dots, after the first `,DC=`
/// (Pinniped's split).
fn domain_of(dn: &str) -> String {
    let mut parts = Vec::new();
    let mut rest = dn;
    while let Some(at) = rest.find(",DC=").or_else(|| rest.find(",dc=")) {
        rest = &rest[at + 4..];
        let end = rest
            .find(",DC=")
            .or_else(|| rest.find(",dc="))
            .unwrap_or(rest.len());
        parts.push(&rest[..end]);
        rest = &rest[end..];
    }
    parts.join(".")
}

/// The one non-empty value of `attribute` in `entry`, as bytes (text or binary); `dn` is the DN.
/// Attribute names are compared without case, so an entry naming the attribute twice (say `uid`
/// and `UID`, or once as text and once as binary) has no single value: which one a lookup met
/// first would depend on hash order, so it is [`LdapError::MissingAttribute`] like a missing one.
fn raw_value(entry: &SearchEntry, attribute: &str) -> Result<Vec<u8>, LdapError> {
    if attribute == DN {
        return Ok(entry.dn.as_bytes().to_vec());
    }
    let text = entry
        .attrs
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case(attribute))
        .map(|(_, values)| values.iter().map(|v| v.as_bytes()).collect::<Vec<_>>());
    let binary = entry
        .bin_attrs
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case(attribute))
        .map(|(_, values)| values.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let mut found = text.chain(binary);
    match (found.next().as_deref(), found.next()) {
        (Some([value]), None) if !value.is_empty() => Ok(value.to_vec()),
        _ => Err(LdapError::MissingAttribute(attribute.to_string())),
    }
}

/// The one non-empty text value of `attribute` in `entry`; `dn` is the DN.
fn text_value(entry: &SearchEntry, attribute: &str) -> Result<String, LdapError> {
    raw_value(entry, attribute)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| LdapError::MissingAttribute(attribute.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A directory at `host`, trusting nothing (no handshake gets that far here).
    fn directory(host: String, timeout: Duration) -> Directory {
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
        Directory::new(DirectoryConfig {
            host,
            tls: Arc::new(tls),
            bind_dn: "cn=supervisor,dc=selkie,dc=test".into(),
            bind_password: "bind-password".into(),
            user_search: UserSearch {
                base: "ou=users,dc=selkie,dc=test".into(),
                filter: String::new(),
                username_attribute: "uid".into(),
                uid_attribute: "uidNumber".into(),
            },
            group_search: GroupSearch::default(),
            timeout,
            flavor: Flavor::Ldap,
        })
    }

    /// A "directory" on 127.0.0.1 that accepts connections and never answers: its `host:port`,
    /// how many connections it accepted, and the task holding them (abort it to let them go).
    async fn silent_directory() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                connections.push(connection);
            }
        });
        (host, accepted, held)
    }

    #[tokio::test]
    async fn logins_in_an_outage_fail_within_their_own_timeout_not_one_after_another() {
        let (host, accepted, held) = silent_directory().await;
        let timeout = Duration::from_millis(500);
        let directory = directory(host, timeout);
        // One connect attempt is TLS (a timeout) then StartTLS (another), then the bind: with a
        // lock held across it, a dozen logins would take a dozen times that, one after another.
        const LOGINS: usize = 12;
        let started = std::time::Instant::now();
        let logins = futures::future::join_all((0..LOGINS).map(|_| directory.authenticate("pinny", "seal")));
        let outcomes = tokio::time::timeout(timeout * 4, logins)
            .await
            .unwrap_or_else(|_| panic!("{LOGINS} logins still running after {:?}", timeout * 4));
        for outcome in outcomes {
            assert!(
                matches!(outcome, Err(LdapError::Unreachable { .. })),
                "{outcome:?}"
            );
        }
        eprintln!("{LOGINS} logins failed in {:?}", started.elapsed());
        // They all waited for the same attempt: at most its TLS and its StartTLS connection.
        assert!(accepted.load(Ordering::SeqCst) <= 2, "{accepted:?} connections");

        // A failed attempt leaves nothing behind: once it is over, the next login connects again
        // (which is how a recovered directory gets used), and still fails within its timeout.
        let deadline = std::time::Instant::now() + timeout * 20;
        while accepted.load(Ordering::SeqCst) <= 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "no new connect after the first attempt"
            );
            let outcome = tokio::time::timeout(timeout * 3, directory.authenticate("pinny", "seal"))
                .await
                .expect("a login outlived its timeout");
            assert!(
                matches!(outcome, Err(LdapError::Unreachable { .. })),
                "{outcome:?}"
            );
        }
        held.abort();
    }

    #[tokio::test]
    async fn a_connect_attempt_outlives_the_logins_that_gave_up_on_it() {
        // A login that joins an attempt late still waits no longer than its own timeout.
        let (host, _accepted, held) = silent_directory().await;
        let timeout = Duration::from_millis(400);
        let directory = directory(host, timeout);
        let first = directory.authenticate("pinny", "seal");
        let late = async {
            tokio::time::sleep(timeout / 2).await;
            let started = std::time::Instant::now();
            let outcome = directory.authenticate("walrus", "tusks").await;
            (outcome, started.elapsed())
        };
        let (first, (late, waited)) = tokio::time::timeout(timeout * 4, futures::future::join(first, late))
            .await
            .expect("the logins outlived their timeouts");
        assert!(matches!(first, Err(LdapError::Unreachable { .. })), "{first:?}");
        assert!(matches!(late, Err(LdapError::Unreachable { .. })), "{late:?}");
        assert!(waited < timeout * 2, "the late login waited {waited:?}");
        held.abort();
    }

    #[tokio::test]
    async fn absurd_usernames_are_refused_before_any_directory_work() {
        let (host, accepted, held) = silent_directory().await;
        let directory = directory(host, Duration::from_secs(30));
        let long = "x".repeat(MAX_USERNAME_BYTES + 1);
        for username in [long.as_str(), ""] {
            let outcome = tokio::time::timeout(Duration::from_secs(5), directory.find_user(username))
                .await
                .expect("the directory was asked");
            assert_eq!(outcome.unwrap_err(), LdapError::InvalidCredentials);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
        assert!(matches!(lock(&directory.searcher).state, Searcher::Idle));
        held.abort();
    }

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

    #[test]
    fn an_entry_ldap3_cannot_read_is_an_error_not_a_panic() {
        use ldap3::asn1::{StructureTag, TagClass, PL};
        // A search result entry whose DN is not UTF-8, and one with no DN at all.
        let tag = |payload: PL| StructureTag {
            class: TagClass::Application,
            id: 4,
            payload,
        };
        let dn = StructureTag {
            class: TagClass::Universal,
            id: 4,
            payload: PL::P(vec![0xff, 0xfe]),
        };
        for broken in [tag(PL::C(vec![dn])), tag(PL::C(Vec::new()))] {
            let error = entry_of(ldap3::ResultEntry::new(broken), "dc=x").unwrap_err();
            assert!(error.to_string().contains("cannot be read"), "{error}");
        }
    }

    #[test]
    fn object_guids_read_as_pinniped_reads_them() {
        // The first three fields are swapped, as Pinniped swaps them after uuid.FromBytes.
        let raw = [
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
        ];
        assert_eq!(
            microsoft_guid(&raw).as_deref(),
            Some("04030201-0605-0807-090a-0b0c0d0e0f10")
        );
        assert_eq!(microsoft_guid(&raw[..15]), None);
    }

    #[test]
    fn group_domains_come_from_the_dc_components() {
        assert_eq!(
            domain_of("CN=Mammals,OU=Groups,DC=activedirectory,DC=example,DC=com"),
            "activedirectory.example.com"
        );
        assert_eq!(domain_of("cn=seals,dc=selkie,dc=test"), "selkie.test");
        assert_eq!(domain_of("CN=no-domain"), "");
    }

    #[test]
    fn active_directory_refresh_refuses_changed_disabled_and_locked_accounts() {
        let entry = |pwd: &str, uac: &str, computed: &str| SearchEntry {
            dn: "CN=pinny,CN=Users,DC=selkie,DC=test".into(),
            attrs: [
                ("pwdLastSet", pwd),
                ("userAccountControl", uac),
                ("msDS-User-Account-Control-Computed", computed),
            ]
            .into_iter()
            .map(|(name, value)| (name.to_string(), vec![value.to_string()]))
            .collect(),
            bin_attrs: Default::default(),
        };
        let at_login: BTreeMap<String, String> =
            [("pwdLastSet".to_string(), B64URL.encode("133000000000000000"))].into();
        assert_eq!(
            active_directory_checks(&entry("133000000000000000", "512", "0"), &at_login),
            Ok(())
        );
        for (changed, says) in [
            (entry("133999999999999999", "512", "0"), "password changed"),
            (entry("133000000000000000", "514", "0"), "deactivated"),
            (entry("133000000000000000", "512", "16"), "locked"),
            (entry("133000000000000000", "junk", "0"), "not a number"),
        ] {
            let error = active_directory_checks(&changed, &at_login).unwrap_err();
            assert!(error.to_string().contains(says), "{error}");
        }
    }

    #[test]
    fn an_attribute_named_twice_has_no_single_value() {
        let entry = |attrs: &[(&str, &str)], bin_attrs: &[(&str, &[u8])]| SearchEntry {
            dn: "uid=pinny,ou=users,dc=selkie,dc=test".into(),
            attrs: attrs
                .iter()
                .map(|(name, value)| (name.to_string(), vec![value.to_string()]))
                .collect(),
            bin_attrs: bin_attrs
                .iter()
                .map(|(name, value)| (name.to_string(), vec![value.to_vec()]))
                .collect(),
        };
        assert_eq!(
            text_value(&entry(&[("UID", "pinny")], &[]), "uid"),
            Ok("pinny".into())
        );
        assert_eq!(raw_value(&entry(&[], &[("uid", b"\xff")]), "uid"), Ok(vec![0xff]));
        let missing = Err(LdapError::MissingAttribute("uid".into()));
        for twice in [
            entry(&[("uid", "pinny"), ("UID", "admin")], &[]),
            entry(&[("uid", "pinny")], &[("Uid", b"admin")]),
            entry(&[("uid", "")], &[]),
            entry(&[("cn", "pinny")], &[]),
        ] {
            assert_eq!(text_value(&twice, "uid"), missing, "{twice:?}");
        }
    }
}
