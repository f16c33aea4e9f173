//! Micro-benchmarks of webhook (TokenReview) authentication and of the result cache every token
//! authenticator shares.
//!
//! * `webhook/hit`: [`TokenReviewAuthenticator::authenticate`] of a token the endpoint has
//!   already vouched for: HMAC of the token + cache lookup, no network.
//! * `webhook/miss`: a never-seen token per iteration, reviewed by a loopback HTTPS endpoint
//!   (`selkie_filters::test_util::endpoint`: hyper + tokio-rustls, TLS 1.3, kept-alive
//!   connection) running on the same
//!   current-thread runtime: the whole round trip, server side included. No target; for
//!   orientation.
//! * `review_cache/hit/{32B,1KiB}`: [`ReviewCache::get_or_review`] hit directly, for a short
//!   opaque token and a 1 KiB one (the size of a typical OIDC ID token).
//! * `review_cache/hmac-sha256/{32B,1KiB}`: ring's HMAC-SHA256 alone, which every lookup computes
//!   to key the cache without holding the token.
//!
//! Async routines run on a current-thread tokio runtime through criterion's `to_async`, which
//! enters the runtime once per sample rather than once per iteration.
//!
//! Run: `cargo bench -p selkie-filters --features test-util --bench webhook`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failure is a broken bench and should panic"
)]

mod common;

use std::{
    hint::black_box,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http::StatusCode;
use ring::{hmac, rand::SystemRandom};
use selkie_filters::{
    identity::{Forwarding, Identity, UserInfo},
    outcome::Outcome,
    review_cache::{CacheConfig, ReviewCache},
    test_util::{self, Endpoint},
    tokenreview::{TokenReviewAuthenticator, TokenReviewConfig},
};
use serde_json::{json, Value};

/// A TokenReview endpoint on 127.0.0.1 that vouches for every token as `alice` in `devs` and
/// `ops`. Must be started inside the runtime that will drive it.
async fn endpoint() -> Endpoint {
    test_util::endpoint(Arc::new(|_path: &str, review: &Value| {
        let answer = json!({
            "apiVersion": review["apiVersion"],
            "kind": "TokenReview",
            "status": {"authenticated": true,
                       "user": {"username": "alice", "groups": ["devs", "ops"]}},
        });
        (StatusCode::OK, answer.to_string())
    }))
    .await
}

fn webhook(c: &mut Criterion) {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let rt = common::runtime();
    let endpoint = rt.block_on(endpoint());
    let mut config = TokenReviewConfig::new("bench-webhook", format!("{}/review", endpoint.base_url));
    config.ca_bundle_pem = Some(endpoint.ca_pem.clone());
    config.timeout = Duration::from_secs(5);
    let webhook = TokenReviewAuthenticator::new(config).unwrap();

    let token = "bench-token-0123456789abcdef0123";
    common::assert_alice(&rt.block_on(webhook.authenticate(token)));
    c.bench_function("webhook/hit", |b| {
        b.to_async(&rt).iter(|| webhook.authenticate(black_box(token)))
    });

    let next = AtomicU64::new(0);
    c.bench_function("webhook/miss", |b| {
        b.to_async(&rt).iter_batched(
            || format!("bench-miss-{:020}", next.fetch_add(1, Ordering::Relaxed)),
            |token| {
                let webhook = &webhook;
                async move { webhook.authenticate(&token).await }
            },
            BatchSize::SmallInput,
        )
    });
}

fn review_cache(c: &mut Criterion) {
    let rt = common::runtime();
    let cache = ReviewCache::new(CacheConfig::default()).unwrap();
    let identity = Outcome::Authenticated(Arc::new(Identity {
        user: UserInfo {
            username: "alice".into(),
            uid: None,
            groups: vec!["devs".into(), "ops".into()],
            extra: Default::default(),
        },
        authenticator: "bench".into(),
        audiences: Vec::new(),
        forwarding: Forwarding::Impersonate,
    }));
    let hmac_key = hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new()).unwrap();
    for (label, len) in [("32B", 32), ("1KiB", 1024)] {
        let token = "t".repeat(len);
        let fill = identity.clone();
        common::assert_alice(&rt.block_on(cache.get_or_review(&token, || async move { fill })));
        c.bench_function(&format!("review_cache/hit/{label}"), |b| {
            b.to_async(&rt).iter(|| {
                // Never run: the entry is cached (a miss would return NotMine, checked below).
                cache.get_or_review(black_box(&token), || async { Outcome::NotMine })
            })
        });
        common::assert_alice(&rt.block_on(cache.get_or_review(&token, || async { Outcome::NotMine })));
        c.bench_function(&format!("review_cache/hmac-sha256/{label}"), |b| {
            b.iter(|| hmac::sign(&hmac_key, black_box(token.as_bytes())))
        });
    }
}

criterion_group!(benches, webhook, review_cache);
criterion_main!(benches);
