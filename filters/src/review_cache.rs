//! A bounded cache of authentication results keyed by an HMAC of the token.
//!
//! * Keys are HMAC-SHA256 of the token under a random per-cache key, so the cache never holds a
//!   token and a memory dump does not reveal one.
//! * Authenticated results live for the positive TTL, refusals of the credential itself for the
//!   (shorter) negative TTL; failures to check ([`RejectReason::UpstreamUnavailable`]) are never
//!   cached.
//! * Concurrent misses for one token are coalesced: one caller reviews, the others wait for its
//!   result (and if it is not cacheable, the next waiter reviews). A caller cancelled while it
//!   reviews or waits leaves nothing behind: the cache's placeholder passes to the next waiter,
//!   or is removed with the last one, so a later call for the token reviews afresh.
//! * Capacity is bounded; the least valuable entries are evicted (S3-FIFO).
//! * A capacity of 0 turns the cache off ([`CacheConfig::disabled`]): every call runs its review,
//!   nothing is stored, looked up or coalesced.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use ring::hmac;

use crate::outcome::{Outcome, RejectReason};

/// Sizes and lifetimes of a [`ReviewCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Most entries held at once; 0 turns the cache off (every call reviews).
    pub capacity: usize,
    /// How long an authenticated result is reused. A TTL too long for the monotonic clock to
    /// represent (such as `Duration::MAX`) keeps nothing, rather than keeping it forever.
    pub positive_ttl: Duration,
    /// How long a refusal of the credential is reused (same rule).
    pub negative_ttl: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            capacity: 10_000,
            positive_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(5),
        }
    }
}

impl CacheConfig {
    /// No cache at all: every [`ReviewCache::get_or_review`] runs its review, concurrent calls
    /// for one token included (capacity 0; the TTLs are not used).
    pub fn disabled() -> Self {
        Self {
            capacity: 0,
            positive_ttl: Duration::ZERO,
            negative_ttl: Duration::ZERO,
        }
    }

    /// Whether results are kept at all (capacity above 0).
    pub fn is_enabled(&self) -> bool {
        self.capacity > 0
    }
}

#[derive(Clone)]
struct Entry {
    outcome: Outcome,
    expires: Instant,
}

/// See the module documentation.
pub struct ReviewCache {
    key: hmac::Key,
    /// `None` when the cache is off (capacity 0).
    entries: Option<quick_cache::sync::Cache<[u8; 32], Entry>>,
    config: CacheConfig,
}

impl std::fmt::Debug for ReviewCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewCache")
            .field("config", &self.config)
            .field("len", &self.len())
            .finish()
    }
}

/// The HMAC key could not be generated (the system's random source failed).
#[derive(Debug, thiserror::Error)]
#[error("generating the cache's HMAC key failed: the system random source is unavailable")]
pub struct RandomSourceError;

impl ReviewCache {
    /// An empty cache with a fresh random HMAC key; one that never holds anything when
    /// `config.capacity` is 0.
    pub fn new(config: CacheConfig) -> Result<Self, RandomSourceError> {
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .map_err(|_| RandomSourceError)?;
        Ok(Self {
            key,
            entries: config
                .is_enabled()
                .then(|| quick_cache::sync::Cache::new(config.capacity)),
            config,
        })
    }

    /// Returns the cached outcome for `token`, or runs `review` (once, however many callers ask
    /// for the same token at the same time) and caches what it returns according to the rules
    /// above.
    pub async fn get_or_review<F, Fut>(&self, token: &str, review: F) -> Outcome
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Outcome>,
    {
        self.get_or_review_capped(token, || async { (review().await, None) })
            .await
    }

    /// Like [`ReviewCache::get_or_review`], for credentials that expire on their own: `review`
    /// also returns how long its outcome may be reused at most (for example until a JWT's `exp`),
    /// and the entry lives for the shorter of that and the configured TTL.
    pub async fn get_or_review_capped<F, Fut>(&self, token: &str, review: F) -> Outcome
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = (Outcome, Option<Duration>)>,
    {
        let Some(entries) = &self.entries else {
            return review().await.0;
        };
        let key = self.key_for(token);
        let mut review = Some(review);
        loop {
            match entries.get_value_or_guard_async(&key).await {
                Ok(entry) if entry.expires > Instant::now() => return entry.outcome,
                Ok(_expired) => {
                    entries.remove(&key);
                }
                Err(guard) => {
                    let Some(review) = review.take() else {
                        // Unreachable: the review runs at most once, and this arm returns.
                        return Outcome::Rejected(RejectReason::UpstreamUnavailable);
                    };
                    let (outcome, cap) = review().await;
                    let ttl = match (self.ttl_for(&outcome), cap) {
                        (Some(ttl), Some(cap)) => Some(ttl.min(cap)),
                        (ttl, _) => ttl,
                    };
                    let expires = ttl
                        .filter(|ttl| !ttl.is_zero())
                        .and_then(|ttl| Instant::now().checked_add(ttl));
                    if let Some(expires) = expires {
                        let _ = guard.insert(Entry {
                            outcome: outcome.clone(),
                            expires,
                        });
                    }
                    return outcome;
                }
            }
        }
    }

    /// Number of cached entries (expired ones included until they are looked up or evicted);
    /// always 0 when the cache is off.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |entries| entries.len())
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ttl_for(&self, outcome: &Outcome) -> Option<Duration> {
        match outcome {
            Outcome::Authenticated(_) => Some(self.config.positive_ttl),
            Outcome::Rejected(reason) if reason.is_cacheable() => Some(self.config.negative_ttl),
            Outcome::Rejected(_) => None,
            Outcome::NotMine => Some(self.config.negative_ttl),
        }
    }

    fn key_for(&self, token: &str) -> [u8; 32] {
        let tag = hmac::sign(&self.key, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(tag.as_ref());
        key
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use super::*;
    use crate::identity::{Forwarding, Identity, UserInfo};

    fn identity(name: &str) -> Outcome {
        Outcome::Authenticated(Arc::new(Identity {
            user: UserInfo {
                username: name.into(),
                ..UserInfo::default()
            },
            authenticator: "test".into(),
            audiences: vec![],
            forwarding: Forwarding::Impersonate,
        }))
    }

    fn cache(positive: u64, negative: u64) -> ReviewCache {
        ReviewCache::new(CacheConfig {
            capacity: 16,
            positive_ttl: Duration::from_millis(positive),
            negative_ttl: Duration::from_millis(negative),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn a_success_is_reused_until_its_ttl_ends() {
        let cache = cache(200, 10);
        let calls = AtomicUsize::new(0);
        let review = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            identity("alice")
        };
        assert_eq!(cache.get_or_review("t", review).await, identity("alice"));
        assert_eq!(cache.get_or_review("t", review).await, identity("alice"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
        cache.get_or_review("t", review).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "an expired entry must be reviewed again"
        );
    }

    #[tokio::test]
    async fn upstream_failures_are_never_cached_and_refusals_only_briefly() {
        let cache = cache(10_000, 10_000);
        let calls = AtomicUsize::new(0);
        for _ in 0..3 {
            let outcome = cache
                .get_or_review("t", || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Outcome::Rejected(RejectReason::UpstreamUnavailable)
                })
                .await;
            assert_eq!(outcome, Outcome::Rejected(RejectReason::UpstreamUnavailable));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(cache.is_empty());

        let refused = || async { Outcome::Rejected(RejectReason::NotAuthenticated) };
        cache.get_or_review("u", refused).await;
        assert_eq!(
            cache.len(),
            1,
            "a refusal of the credential is cached for the negative TTL"
        );
    }

    #[tokio::test]
    async fn different_tokens_do_not_share_entries() {
        let cache = cache(10_000, 10);
        cache.get_or_review("a", || async { identity("alice") }).await;
        assert_eq!(
            cache.get_or_review("b", || async { identity("bob") }).await,
            identity("bob")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_disabled_cache_never_returns_an_entry() {
        let cache = Arc::new(ReviewCache::new(CacheConfig::disabled()).unwrap());
        assert!(!CacheConfig::disabled().is_enabled() && CacheConfig::default().is_enabled());
        let calls = Arc::new(AtomicUsize::new(0));
        // Every call reviews, with whatever the review says now: nothing earlier is returned.
        for (i, name) in ["alice", "bob", "carol"].into_iter().enumerate() {
            let outcome = cache
                .get_or_review("t", || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    identity(name)
                })
                .await;
            assert_eq!(outcome, identity(name));
            assert_eq!(calls.load(Ordering::SeqCst), i + 1);
            assert!(cache.is_empty());
        }
        // Refusals and capped outcomes are not kept either.
        cache
            .get_or_review("u", || async {
                Outcome::Rejected(RejectReason::NotAuthenticated)
            })
            .await;
        cache
            .get_or_review_capped("v", || async {
                (identity("dave"), Some(Duration::from_secs(60)))
            })
            .await;
        assert_eq!(cache.len(), 0);
        // Concurrent calls for one token are not coalesced: each one reviews.
        assert_eq!(concurrent_reviews(cache, 8, Duration::from_millis(20)).await, 8);
    }

    /// Asks `cache` for one token from `n` tasks at once, each review taking `pause`; returns how
    /// many reviews ran.
    async fn concurrent_reviews(cache: Arc<ReviewCache>, n: usize, pause: Duration) -> usize {
        let calls = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let cache = cache.clone();
                let calls = calls.clone();
                tokio::spawn(async move {
                    cache
                        .get_or_review("same", || async {
                            calls.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(pause).await;
                            identity("alice")
                        })
                        .await
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap(), identity("alice"));
        }
        calls.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reviews_whose_callers_all_went_away_leave_nothing_behind() {
        let cache = Arc::new(cache(10_000, 10));
        let calls = Arc::new(AtomicUsize::new(0));
        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let (cache, calls) = (cache.clone(), calls.clone());
            callers.spawn(async move {
                cache
                    .get_or_review("same", || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<Outcome>().await
                    })
                    .await
            });
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "no review started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the others wait for the one review"
        );
        // Every caller is cancelled (a JoinSet reports an aborted task once its future is gone).
        // A waiter may take the review over before its own cancellation lands; it is cancelled
        // too.
        callers.abort_all();
        while let Some(joined) = callers.join_next().await {
            assert!(joined.unwrap_err().is_cancelled());
        }
        // A later call reviews afresh instead of waiting on the abandoned review.
        let outcome = tokio::time::timeout(
            Duration::from_secs(10),
            cache.get_or_review("same", || async { identity("alice") }),
        )
        .await
        .expect("a later call is not stuck behind the abandoned review");
        assert_eq!(outcome, identity("alice"));
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test]
    async fn a_ttl_past_the_clock_keeps_nothing_and_does_not_panic() {
        let cache = ReviewCache::new(CacheConfig {
            capacity: 16,
            positive_ttl: Duration::MAX,
            negative_ttl: Duration::MAX,
        })
        .unwrap();
        let calls = AtomicUsize::new(0);
        for _ in 0..2 {
            let outcome = cache
                .get_or_review_capped("t", || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    (identity("alice"), Some(Duration::MAX))
                })
                .await;
            assert_eq!(outcome, identity("alice"));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(cache.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_for_one_token_run_one_review() {
        let cache = Arc::new(cache(10_000, 10));
        assert_eq!(concurrent_reviews(cache, 32, Duration::from_millis(50)).await, 1);
    }
}
