//! Password guessing, slowed down (beyond Pinniped, which leaves it to the directory).
//!
//! The Supervisor checks passwords for LDAP and Active Directory (the `cli_password` flow and the
//! login page) and for OIDC upstreams that allow the password grant. Each [`Account`] may fail
//! [`FREE_FAILURES`] times in a row; after that each failure makes it wait before its next
//! attempt, twice as long as the last time: 1 s, 2 s, 4 s … at most [`MAX_WAIT`]. While it
//! waits, an attempt is refused without checking the password upstream — so guessing is slow,
//! and waiting attempts add nothing to a directory's own lockout count (Active Directory's; a
//! lockout threshold below [`FREE_FAILURES`] is still reached first). A password the upstream
//! accepts resets the account; so does [`FORGET_AFTER`] without a failure.
//!
//! **What is counted.** An account is one identity provider *object* (its kind, name and UID:
//! the same LDAPIdentityProvider listed by two FederationDomains, under two display names, is
//! one directory with one set of accounts, so it has ONE counter per user, not one per
//! FederationDomain) and one user of it:
//!
//! * LDAP and Active Directory: the entry the directory resolves the typed username to (its DN,
//!   [`normalize`]d). The entry is searched first, as the service account — no bind as the user,
//!   nothing for the directory's lockout — so every spelling the directory takes for the same
//!   user (case, leading, trailing or doubled spaces, compatibility forms, characters LDAP's
//!   string preparation ignores, a `mail` instead of a `uid` the filter also matches) is the same
//!   account ([`Account::entry`]).
//! * A username the directory finds no entry for: the typed username, [`normalize`]d
//!   ([`Account::username`]). Unknown users are counted and made to wait as known users are, and
//!   every spelling that differs only in case or spaces is the same account either way, so the
//!   throttle does not tell which users exist. (It does tell that two *different* names, say a
//!   uid and a mail address, belong to the same entry, once one of them waits.)
//! * OIDC upstreams with the password grant: nothing can be resolved without sending the
//!   password, so the typed username, [`normalize`]d.
//!
//! **Bounded memory.** An account is kept as a SHA-256 digest (32 bytes whatever the username;
//! usernames over [`MAX_USERNAME_BYTES`] are refused before any upstream work anyway), so each
//! tracked account costs the same (about 250 bytes: the digest in the map and in an order
//! index, the counts and instants) and [`MAX_ENTRIES`] of them stay under 3 MiB. When the table
//! is full a new account takes the place of, in this order: an account that waited but has been
//! forgotten ([`FORGET_AFTER`]); the account with the oldest failure among those that never had
//! to wait in their current run; only when every tracked account has had to wait, the one with
//! the oldest failure among them. A flood of fresh
//! usernames therefore cannot evict an account that is being made to wait — it would take
//! [`MAX_ENTRIES`] accounts that each failed more than [`FREE_FAILURES`] times. Finding the
//! place is a B-tree lookup, not a scan, under the lock.
//!
//! **Per replica, on purpose.** The counts are in memory: N Supervisor replicas allow N times the
//! attempts (each replica's waits still double, so N only multiplies the rate by a small
//! constant). Sharing them would take a write to the Kubernetes API (a Secret or Lease update,
//! with conflicts and retries) for every failed password, so a guessing attack would become an
//! attack on the API server and etcd; and the directory's own lockout policy is the cluster-wide
//! bound anyway.
//!
//! **Not covered.** Attempts are checked when they start and counted when they end, so attempts
//! made at the same time (at most 64 in flight per directory) are all let through before any of
//! them counts.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use sha2::{Digest as _, Sha256};

use crate::idp::Upstream;

/// Failed passwords in a row an account gets before it must wait. Generous because kubectl
/// runs a credential plugin that failed again for the same command, so one mistyped password
/// is several failures.
pub(crate) const FREE_FAILURES: u32 = 10;
/// The longest wait.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(300);
/// An account with no failure for this long starts again from zero.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// The most accounts tracked.
pub(crate) const MAX_ENTRIES: usize = 10_000;
/// The longest username (UTF-8 bytes) whose password is checked at all; a longer one is refused
/// as a wrong username or password before any upstream work and is not counted. 1024 is far
/// above real usernames — RFC 5321 mail addresses (254), Active Directory's `sAMAccountName`
/// (20) and practical `userPrincipalName`s, POSIX login names — and far below what a request
/// header or form may carry (64 KiB), which would otherwise go into a directory filter.
pub(crate) const MAX_USERNAME_BYTES: usize = 1024;

/// The identity provider object an account belongs to: its kind (`ldap`, `activedirectory`,
/// `oidc`), name and UID (a resource deleted and created again under the same name is another
/// object). Not the FederationDomain, not the display name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdpObject<'a> {
    /// The kind, as in the IdP discovery (`ldap`, `activedirectory`, `oidc`).
    pub kind: &'a str,
    /// The resource's name.
    pub name: &'a str,
    /// The resource's UID.
    pub uid: &'a str,
}

impl<'a> IdpObject<'a> {
    /// The object `upstream` was made from.
    pub(crate) fn of(upstream: &'a Upstream) -> Self {
        let (name, uid) = match upstream {
            Upstream::Oidc(oidc) => (&oidc.resource_name, &oidc.resource_uid),
            Upstream::Ldap(ldap) => (&ldap.resource_name, &ldap.resource_uid),
            Upstream::GitHub(github) => (&github.resource_name, &github.resource_uid),
            Upstream::Saml(saml) => (&saml.resource_name, &saml.resource_uid),
        };
        Self {
            kind: upstream.kind().as_str(),
            name,
            uid,
        }
    }
}

/// What the throttle counts failures of: a user of one identity provider object, as a SHA-256
/// digest (fixed size). See the module documentation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Account([u8; 32]);

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let prefix: String = self.0[..4].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "Account({prefix}…)")
    }
}

impl Account {
    /// The user whose directory entry is `dn` at `idp` (the DN as the directory returned it;
    /// [`normalize`]d here).
    pub(crate) fn entry(idp: IdpObject<'_>, dn: &str) -> Self {
        Self::digest(idp, b'e', &normalize(dn))
    }

    /// The user typed as `username` at `idp`, when nothing resolves it to an entry (an unknown
    /// LDAP user, an OIDC password grant); [`normalize`]d here.
    pub(crate) fn username(idp: IdpObject<'_>, username: &str) -> Self {
        Self::digest(idp, b'u', &normalize(username))
    }

    fn digest(idp: IdpObject<'_>, what: u8, value: &str) -> Self {
        let mut hash = Sha256::new();
        // Length-prefixed, so no two different tuples hash the same bytes.
        for part in [idp.kind, idp.name, idp.uid, value] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        hash.update([what]);
        Self(hash.finalize().into())
    }
}

/// `text` as the throttle compares names: what LDAP's string preparation (RFC 4518 §2.2) maps
/// to nothing is dropped, every space character (`char::is_whitespace`, the same set as
/// RFC 4518's) counts as a space, leading and trailing spaces are dropped and runs of spaces
/// are one; fullwidth ASCII (U+FF01–FF5E, a compatibility form) is read as ASCII; letters are
/// lowercased. This is not full NFKC (no Unicode tables are built in): for LDAP users that
/// exist it does not matter, since they are counted by their entry.
pub(crate) fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        if maps_to_nothing(c) {
            continue;
        }
        if c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        let c = match u32::from(c) {
            code @ 0xFF01..=0xFF5E => char::from_u32(code - 0xFEE0).unwrap_or(c),
            _ => c,
        };
        if space {
            out.push(' ');
            space = false;
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// Whether RFC 4518 §2.2 maps `c` to nothing: soft hyphens, joiners, variation selectors, the
/// object replacement character, zero width space, and control characters other than the ones
/// it maps to a space.
fn maps_to_nothing(c: char) -> bool {
    matches!(
        u32::from(c),
        0x0000..=0x0008
            | 0x000E..=0x001F
            | 0x007F..=0x0084
            | 0x0086..=0x009F
            | 0x00AD
            | 0x034F
            | 0x06DD
            | 0x070F
            | 0x1806
            | 0x180B..=0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2063
            | 0x206A..=0x206F
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFF9..=0xFFFC
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// One account's failures in a row, and until when it waits.
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    until: Option<Instant>,
    /// Tells apart accounts whose last failures are at the same instant in the order indexes.
    seq: u64,
}

impl Failures {
    /// Whether it had to wait in its current run (more than the free failures).
    fn waited(&self) -> bool {
        self.count > FREE_FAILURES
    }

    /// Its place in an order index: oldest failure first.
    fn place(&self) -> (Instant, u64) {
        (self.last, self.seq)
    }
}

/// The tracked accounts and their eviction order.
#[derive(Debug, Default)]
struct Table {
    accounts: HashMap<Account, Failures>,
    /// The accounts that never had to wait in their current run, oldest failure first.
    calm: BTreeMap<(Instant, u64), Account>,
    /// The accounts that had to wait in their current run, oldest failure first.
    waited: BTreeMap<(Instant, u64), Account>,
    next_seq: u64,
}

impl Table {
    fn index(&mut self, failures: &Failures) -> &mut BTreeMap<(Instant, u64), Account> {
        if failures.waited() {
            &mut self.waited
        } else {
            &mut self.calm
        }
    }

    /// Forgets `account`, returning what was tracked of it.
    fn remove(&mut self, account: &Account) -> Option<Failures> {
        let failures = self.accounts.remove(account)?;
        self.index(&failures).remove(&failures.place());
        Some(failures)
    }

    fn insert(&mut self, account: Account, failures: Failures) {
        self.index(&failures).insert(failures.place(), account);
        self.accounts.insert(account, failures);
    }

    /// Drops one account to make room (see the module documentation for which).
    fn make_room(&mut self, now: Instant) {
        let forgotten = self
            .waited
            .first_key_value()
            .filter(|((last, _), _)| now.saturating_duration_since(*last) >= FORGET_AFTER)
            .map(|(_, account)| *account);
        let victim = forgotten
            .or_else(|| self.calm.first_key_value().map(|(_, account)| *account))
            .or_else(|| self.waited.first_key_value().map(|(_, account)| *account));
        if let Some(victim) = victim {
            self.remove(&victim);
        }
    }
}

/// Failed passwords by `Account` (a user of an identity provider object). See the module
/// documentation. Every method takes the lock for a hash lookup and at most a few B-tree
/// operations.
#[derive(Debug, Default)]
pub struct PasswordThrottle {
    table: Mutex<Table>,
}

impl PasswordThrottle {
    /// Nothing tracked yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `Ok` when `account` may try a password at `now`; otherwise how long it must still wait
    /// (at least a second, so a message can say so).
    pub fn check(&self, account: &Account, now: Instant) -> Result<(), Duration> {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        match table.accounts.get(account).and_then(|failures| failures.until) {
            Some(until) if until > now => Err((until - now).max(Duration::from_secs(1))),
            _ => Ok(()),
        }
    }

    /// Counts a password the upstream refused for `account` at `now` (for LDAP, also a username
    /// the directory has no entry for).
    pub fn failed(&self, account: &Account, now: Instant) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = table.next_seq;
        table.next_seq = seq.wrapping_add(1);
        let previous = table.remove(account);
        if previous.is_none() && table.accounts.len() >= MAX_ENTRIES {
            table.make_room(now);
        }
        let mut failures = previous.unwrap_or(Failures {
            count: 0,
            last: now,
            until: None,
            seq,
        });
        if now.saturating_duration_since(failures.last) >= FORGET_AFTER {
            failures.count = 0;
        }
        failures.count = failures.count.saturating_add(1);
        failures.last = now;
        failures.seq = seq;
        failures.until = failures.count.checked_sub(FREE_FAILURES + 1).map(|doublings| {
            let wait = 2u64
                .checked_pow(doublings)
                .map_or(MAX_WAIT, Duration::from_secs)
                .min(MAX_WAIT);
            now + wait
        });
        table.insert(*account, failures);
    }

    /// Forgets the failures of `account` (its password was accepted).
    pub fn succeeded(&self, account: &Account) {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(account);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(table.accounts.len(), table.calm.len() + table.waited.len());
        table.accounts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LDAP: IdpObject<'static> = IdpObject {
        kind: "ldap",
        name: "corp",
        uid: "0b8f4c1e-0000-4000-8000-000000000001",
    };

    fn user(name: &str) -> Account {
        Account::username(LDAP, name)
    }

    #[test]
    fn failures_beyond_the_free_ones_wait_twice_as_long_each_time() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.check(&user("pinny"), start), Ok(()));
            throttle.failed(&user("pinny"), start);
        }
        assert_eq!(throttle.check(&user("pinny"), start), Ok(()));
        // The first failure past the free ones: one second.
        throttle.failed(&user("Pinny"), start);
        assert_eq!(throttle.check(&user("PINNY"), start), Err(Duration::from_secs(1)));
        // Other users and other identity provider objects are not affected.
        assert_eq!(throttle.check(&user("someone"), start), Ok(()));
        let ad = IdpObject {
            kind: "activedirectory",
            ..LDAP
        };
        assert_eq!(throttle.check(&Account::username(ad, "pinny"), start), Ok(()));
        let recreated = IdpObject {
            uid: "0b8f4c1e-0000-4000-8000-000000000002",
            ..LDAP
        };
        assert_eq!(
            throttle.check(&Account::username(recreated, "pinny"), start),
            Ok(())
        );
        let later = start + Duration::from_secs(1);
        assert_eq!(throttle.check(&user("pinny"), later), Ok(()));
        // Then 2 s, 4 s, …, never more than MAX_WAIT.
        throttle.failed(&user("pinny"), later);
        assert_eq!(throttle.check(&user("pinny"), later), Err(Duration::from_secs(2)));
        let mut now = later;
        for _ in 0..20 {
            now += MAX_WAIT;
            throttle.failed(&user("pinny"), now);
        }
        assert_eq!(throttle.check(&user("pinny"), now), Err(MAX_WAIT));
        // An accepted password resets the account.
        throttle.succeeded(&user("PINNY"));
        assert_eq!(throttle.check(&user("pinny"), now), Ok(()));
        assert_eq!(throttle.len(), 0);
    }

    #[test]
    fn failures_long_ago_are_forgotten() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        for _ in 0..FREE_FAILURES {
            throttle.failed(&user("pinny"), start);
        }
        // Well after the last failure, one more failure is the first of a new run.
        let later = start + FORGET_AFTER;
        throttle.failed(&user("pinny"), later);
        assert_eq!(throttle.check(&user("pinny"), later), Ok(()));
    }

    #[test]
    fn every_spelling_of_a_name_is_one_account() {
        // Spaces anywhere, case, tabs and no-break spaces, what LDAP ignores (soft hyphen, zero
        // width space, a byte order mark), fullwidth letters: all "pinny the seal".
        for spelling in [
            "pinny the seal",
            " pinny the seal",
            "pinny the seal ",
            "pinny  the   seal",
            "PINNY The Seal",
            "\tpinny\u{a0}the\u{3000}seal\n",
            "pin\u{ad}ny the se\u{200b}al\u{feff}",
            "ｐｉｎｎｙ ｔｈｅ ｓｅａｌ",
        ] {
            assert_eq!(normalize(spelling), "pinny the seal", "{spelling:?}");
            assert_eq!(user(spelling), user("pinny the seal"), "{spelling:?}");
        }
        assert_ne!(user("pinnythe seal"), user("pinny the seal"));
        // Entries are compared by DN the same way, and are other accounts than typed names.
        let dn = "uid=pinny,ou=users,dc=selkie,dc=test";
        assert_eq!(
            Account::entry(LDAP, dn),
            Account::entry(LDAP, " UID=Pinny,ou=users,dc=selkie,dc=test")
        );
        assert_ne!(Account::entry(LDAP, dn), Account::username(LDAP, dn));
    }

    #[test]
    fn an_account_takes_the_same_memory_whatever_the_name() {
        assert_eq!(size_of::<Account>(), 32);
        let long = "x".repeat(64 * 1024);
        let throttle = PasswordThrottle::new();
        throttle.failed(&user(&long), Instant::now());
        assert_eq!(throttle.len(), 1);
    }

    #[test]
    fn a_flood_of_usernames_cannot_evict_an_account_that_waits() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        for _ in 0..=FREE_FAILURES {
            throttle.failed(&user("target"), start);
        }
        // Some calm accounts with an older failure than the flood's.
        let mut now = start + Duration::from_millis(1);
        throttle.failed(&user("early"), now);
        for n in 0..MAX_ENTRIES * 3 {
            now += Duration::from_millis(1);
            throttle.failed(&user(&format!("user-{n}")), now);
            assert!(throttle.len() <= MAX_ENTRIES);
        }
        assert_eq!(throttle.len(), MAX_ENTRIES);
        // The account that waits still waits (its failure is the oldest of all); the calm ones
        // went oldest first.
        assert!(throttle.check(&user("target"), start).is_err());
        let table = throttle.table.lock().unwrap();
        assert!(table.accounts.contains_key(&user("target")));
        assert!(!table.accounts.contains_key(&user("early")));
        assert!(!table.accounts.contains_key(&user("user-0")));
        assert!(table
            .accounts
            .contains_key(&user(&format!("user-{}", MAX_ENTRIES * 3 - 1))));
    }

    #[test]
    fn accounts_that_waited_go_last_forgotten_first_then_oldest_first() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        // The table full of accounts that all had to wait, a millisecond apart.
        for n in 0..MAX_ENTRIES {
            let at = start + Duration::from_millis(n as u64);
            for _ in 0..=FREE_FAILURES {
                throttle.failed(&user(&format!("waits-{n}")), at);
            }
        }
        let full = start + Duration::from_millis(MAX_ENTRIES as u64);
        // A new one takes the place of the oldest.
        throttle.failed(&user("newcomer"), full);
        assert_eq!(throttle.len(), MAX_ENTRIES);
        {
            let table = throttle.table.lock().unwrap();
            assert!(!table.accounts.contains_key(&user("waits-0")));
            assert!(table.accounts.contains_key(&user("waits-1")));
            assert!(table.accounts.contains_key(&user("newcomer")));
        }
        // The newcomer is calm: the next one replaces it, not an account that waited…
        throttle.failed(&user("another"), full);
        {
            let table = throttle.table.lock().unwrap();
            assert!(!table.accounts.contains_key(&user("newcomer")));
            assert!(table.accounts.contains_key(&user("waits-1")));
        }
        // …unless an account that waited has been forgotten meanwhile: it goes first.
        let much_later = start + Duration::from_millis(1) + FORGET_AFTER;
        throttle.failed(&user("third"), much_later);
        let table = throttle.table.lock().unwrap();
        assert!(!table.accounts.contains_key(&user("waits-1")));
        assert!(table.accounts.contains_key(&user("another")));
        assert!(table.accounts.contains_key(&user("third")));
    }
}
