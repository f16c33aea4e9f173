//! Micro-benchmarks of webhook (TokenReview) authentication and of the result cache every token
//! authenticator shares.
//!
//! * `webhook/hit`: [`TokenReviewAuthenticator::authenticate`] of a token the endpoint has
//!   already vouched for: HMAC of the token + cache lookup, no network.
//! * `webhook/miss`: a never-seen token per iteration, reviewed by a loopback HTTPS endpoint
//!   (hyper + tokio-rustls, TLS 1.3, kept-alive HTTP/1.1 connection) running on the same
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
//! Run: `cargo bench -p selkie-filters --bench webhook`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failure is a broken bench and should panic"
)]

use std::{
    hint::black_box,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use ring::{hmac, rand::SystemRandom};
use rustls_pki_types::{pem::PemObject, PrivateKeyDer};
use selkie_filters::{
    identity::{Forwarding, Identity, UserInfo},
    outcome::Outcome,
    review_cache::{CacheConfig, ReviewCache},
    tokenreview::{TokenReviewAuthenticator, TokenReviewConfig},
};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Starts a TokenReview endpoint on 127.0.0.1 that vouches for every token as `alice` in `devs`
/// and `ops`. Returns its URL and the PEM of the CA that signed its certificate. Must be called
/// inside the runtime that will drive it.
async fn endpoint() -> (String, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}/review",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let answer = json!({
                        "apiVersion": review["apiVersion"],
                        "kind": "TokenReview",
                        "status": {"authenticated": true,
                                   "user": {"username": "alice", "groups": ["devs", "ops"]}},
                    });
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(answer.to_string()))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (url, ca.pem())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn assert_alice(outcome: &Outcome) {
    let Outcome::Authenticated(identity) = outcome else {
        panic!("the bench token must authenticate: {outcome:?}");
    };
    assert_eq!(identity.user.username, "alice");
    assert_eq!(identity.user.groups, ["devs", "ops"]);
}

fn webhook(c: &mut Criterion) {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let rt = runtime();
    let (url, ca_pem) = rt.block_on(endpoint());
    let mut config = TokenReviewConfig::new("bench-webhook", url);
    config.ca_bundle_pem = Some(ca_pem);
    config.timeout = Duration::from_secs(5);
    let webhook = TokenReviewAuthenticator::new(config).unwrap();

    let token = "bench-token-0123456789abcdef0123";
    assert_alice(&rt.block_on(webhook.authenticate(token)));
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
    let rt = runtime();
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
        assert_alice(&rt.block_on(cache.get_or_review(&token, || async move { fill })));
        c.bench_function(&format!("review_cache/hit/{label}"), |b| {
            b.to_async(&rt).iter(|| {
                // Never run: the entry is cached (a miss would return NotMine, checked below).
                cache.get_or_review(black_box(&token), || async { Outcome::NotMine })
            })
        });
        assert_alice(&rt.block_on(cache.get_or_review(&token, || async { Outcome::NotMine })));
        c.bench_function(&format!("review_cache/hmac-sha256/{label}"), |b| {
            b.iter(|| hmac::sign(&hmac_key, black_box(token.as_bytes())))
        });
    }
}

criterion_group!(benches, webhook, review_cache);
criterion_main!(benches);
