//! Password guessing, slowed down (beyond Pinniped, which leaves it to the directory).
//!
//! The Supervisor checks passwords for LDAP and Active Directory (the `cli_password` flow and the
//! login page) and for OIDC upstreams that allow the password grant. Each pair of identity
//! provider and username (case-insensitive) may fail [`FREE_FAILURES`] times in a row; after
//! that each failure makes the pair wait before its next attempt, twice as long as the last
//! time: 1 s, 2 s, 4 s … at most [`MAX_WAIT`]. While it waits, an attempt is refused without
//! asking the upstream — so guessing is slow, and waiting attempts add nothing to a directory's
//! own lockout count (Active Directory's; a lockout threshold below [`FREE_FAILURES`] is still
//! reached first). A password the upstream accepts resets the pair; so does [`FORGET_AFTER`]
//! without a failure.
//!
//! State is in memory, per replica: N replicas allow N times the attempts. At most
//! [`MAX_ENTRIES`] pairs are tracked; past that the entries that are not waiting are dropped
//! first (then the oldest), so a flood of usernames cannot grow memory without bound.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Failed passwords in a row a pair gets before it must wait. Generous because kubectl runs a
/// credential plugin that failed again for the same command, so one mistyped password is
/// several failures.
pub(crate) const FREE_FAILURES: u32 = 10;
/// The longest wait.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(300);
/// A pair with no failure for this long starts again from zero.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// The most pairs tracked.
pub(crate) const MAX_ENTRIES: usize = 10_000;

/// One pair's failures in a row, and until when it waits.
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    until: Option<Instant>,
}

/// Failed passwords by identity provider and username. See the module documentation.
#[derive(Debug, Default)]
pub struct PasswordThrottle {
    pairs: Mutex<HashMap<(String, String), Failures>>,
}

fn key(idp: &str, username: &str) -> (String, String) {
    (idp.to_string(), username.to_lowercase())
}

impl PasswordThrottle {
    /// Nothing tracked yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `Ok` when `username` may try a password at `idp` at `now`; otherwise how long it must
    /// still wait (at least a second, so a message can say so).
    pub fn check(&self, idp: &str, username: &str, now: Instant) -> Result<(), Duration> {
        let pairs = self.pairs.lock().unwrap_or_else(PoisonError::into_inner);
        match pairs.get(&key(idp, username)).and_then(|failures| failures.until) {
            Some(until) if until > now => Err((until - now).max(Duration::from_secs(1))),
            _ => Ok(()),
        }
    }

    /// Counts a password the upstream refused for `username` at `idp` at `now`.
    pub fn failed(&self, idp: &str, username: &str, now: Instant) {
        let mut pairs = self.pairs.lock().unwrap_or_else(PoisonError::into_inner);
        if pairs.len() >= MAX_ENTRIES && !pairs.contains_key(&key(idp, username)) {
            make_room(&mut pairs, now);
        }
        let failures = pairs.entry(key(idp, username)).or_insert(Failures {
            count: 0,
            last: now,
            until: None,
        });
        if now.duration_since(failures.last) >= FORGET_AFTER {
            failures.count = 0;
        }
        failures.count = failures.count.saturating_add(1);
        failures.last = now;
        failures.until = failures.count.checked_sub(FREE_FAILURES + 1).map(|doublings| {
            let wait = 2u64
                .checked_pow(doublings)
                .map_or(MAX_WAIT, Duration::from_secs)
                .min(MAX_WAIT);
            now + wait
        });
    }

    /// Forgets the failures of `username` at `idp` (its password was accepted).
    pub fn succeeded(&self, idp: &str, username: &str) {
        self.pairs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key(idp, username));
    }
}

/// Drops the pairs that are forgotten or not waiting; if none are, the one with the oldest
/// failure.
fn make_room(pairs: &mut HashMap<(String, String), Failures>, now: Instant) {
    let before = pairs.len();
    pairs.retain(|_, failures| {
        failures.until.is_some_and(|until| until > now) && now.duration_since(failures.last) < FORGET_AFTER
    });
    if pairs.len() < before {
        return;
    }
    if let Some(oldest) = pairs
        .iter()
        .min_by_key(|(_, failures)| failures.last)
        .map(|(key, _)| key.clone())
    {
        pairs.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_beyond_the_free_ones_wait_twice_as_long_each_time() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.check("ldap", "pinny", start), Ok(()));
            throttle.failed("ldap", "pinny", start);
        }
        assert_eq!(throttle.check("ldap", "pinny", start), Ok(()));
        // The first failure past the free ones: one second.
        throttle.failed("ldap", "Pinny", start);
        assert_eq!(
            throttle.check("ldap", "PINNY", start),
            Err(Duration::from_secs(1))
        );
        // Other users and other identity providers are not affected.
        assert_eq!(throttle.check("ldap", "someone", start), Ok(()));
        assert_eq!(throttle.check("ad", "pinny", start), Ok(()));
        let later = start + Duration::from_secs(1);
        assert_eq!(throttle.check("ldap", "pinny", later), Ok(()));
        // Then 2 s, 4 s, …, never more than MAX_WAIT.
        throttle.failed("ldap", "pinny", later);
        assert_eq!(
            throttle.check("ldap", "pinny", later),
            Err(Duration::from_secs(2))
        );
        let mut now = later;
        for _ in 0..20 {
            now += MAX_WAIT;
            throttle.failed("ldap", "pinny", now);
        }
        assert_eq!(throttle.check("ldap", "pinny", now), Err(MAX_WAIT));
        // An accepted password resets the pair.
        throttle.succeeded("ldap", "PINNY");
        assert_eq!(throttle.check("ldap", "pinny", now), Ok(()));
    }

    #[test]
    fn failures_long_ago_are_forgotten() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        for _ in 0..FREE_FAILURES {
            throttle.failed("ldap", "pinny", start);
        }
        // Well after the last failure, one more failure is the first of a new run.
        let later = start + FORGET_AFTER;
        throttle.failed("ldap", "pinny", later);
        assert_eq!(throttle.check("ldap", "pinny", later), Ok(()));
    }

    #[test]
    fn the_number_of_pairs_is_bounded_and_waiting_ones_are_kept_first() {
        let throttle = PasswordThrottle::new();
        let start = Instant::now();
        for _ in 0..=FREE_FAILURES {
            throttle.failed("ldap", "target", start);
        }
        for n in 0..MAX_ENTRIES + 10 {
            throttle.failed("ldap", &format!("user-{n}"), start);
        }
        let pairs = throttle.pairs.lock().unwrap().len();
        assert!(pairs <= MAX_ENTRIES, "{pairs}");
        // The pair that waits is still waiting.
        assert!(throttle.check("ldap", "target", start).is_err());
    }
}
