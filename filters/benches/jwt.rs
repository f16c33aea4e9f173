//! Micro-benchmarks of JWT bearer-token authentication through the public
//! [`JwtAuthenticator::authenticate`], with keys installed by the `test-util` hook
//! ([`JwtAuthenticator::install_keys`]) so that no issuer is needed.
//!
//! * `jwt/{rs256,es256}/miss`: a token the authenticator has never seen, with the default result
//!   cache, so each iteration runs the real first-sight path: HMAC of the token, cache lookup,
//!   base64 + JSON decoding, signature verification, claim checks, building the identity and
//!   inserting it into the cache. Every iteration gets a fresh token, signed in the untimed setup
//!   (`iter_batched`).
//! * `jwt/{rs256,es256}/no-cache`: one token over and over with both cache TTLs set to zero, so
//!   nothing is ever stored: the same path minus the cache insert.
//! * `jwt/{rs256,es256}/hit`: one token over and over with the default cache: HMAC + lookup.
//! * `jwt/hmac-sha256/{rs256,es256}-token`: ring's HMAC-SHA256 of a token of the same length
//!   alone, the part of every hit (and miss) that grows with the token.
//! * `jwt/ring-verify/{rs256,es256}`: the token's signature verified by ring alone, the way
//!   `oidc/src/jose.rs` does it (`RsaPublicKeyComponents::verify`, `UnparsedPublicKey`):
//!   the floor under the miss path.
//! * `jwt/dot-count/{rs256,es256}-token`: the check `authenticate` uses to tell a JWT from
//!   another bearer token (`has_compact_jws_shape`: exactly two `.`s) on its own, the other
//!   per-byte cost of every hit.
//!
//! Async routines run on a current-thread tokio runtime through criterion's `to_async`, which
//! enters the runtime once per sample rather than once per iteration (`block_on` per iteration
//! would add the runtime's enter/exit to every measured call).
//!
//! Run: `cargo bench -p selkie-filters --features test-util --bench jwt`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failure is a broken bench and should panic"
)]

mod common;

use std::{
    hint::black_box,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ring::{
    hmac,
    rand::SystemRandom,
    signature::{
        EcdsaKeyPair, KeyPair as _, RsaKeyPair, RsaPublicKeyComponents, UnparsedPublicKey,
        ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_2048_8192_SHA256,
        RSA_PKCS1_SHA256,
    },
};
use rustls_pki_types::{pem::PemObject, PrivatePkcs8KeyDer};
use selkie_filters::{
    jwt::{JwtAuthenticator, JwtConfig},
    review_cache::CacheConfig,
    test_util,
};
use serde_json::{json, Value};

const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "selkie-bench";
/// Test-only key, see `keys/README.md`.
const RSA_TEST_KEY_PEM: &str = include_str!("keys/rs256-test-key.pem");

/// A signing key and the JWK that verifies it.
enum SigningKey {
    Rs256(RsaKeyPair),
    Es256(EcdsaKeyPair),
}

impl SigningKey {
    fn rs256() -> Self {
        let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_TEST_KEY_PEM.as_bytes()).unwrap();
        Self::Rs256(RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap())
    }

    fn es256() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Self::Es256(EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap())
    }

    fn alg(&self) -> &'static str {
        match self {
            Self::Rs256(_) => "RS256",
            Self::Es256(_) => "ES256",
        }
    }

    fn jwk(&self) -> Value {
        match self {
            Self::Rs256(key) => {
                let public = RsaPublicKeyComponents::<Vec<u8>>::from(key.public());
                json!({"kty": "RSA", "kid": "rs", "use": "sig", "alg": "RS256",
                       "n": B64URL.encode(&public.n), "e": B64URL.encode(&public.e)})
            }
            Self::Es256(key) => {
                let point = key.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": "es", "use": "sig", "alg": "ES256",
                       "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..65])})
            }
        }
    }

    fn kid(&self) -> &'static str {
        match self {
            Self::Rs256(_) => "rs",
            Self::Es256(_) => "es",
        }
    }

    /// A token for `alice` in `devs` and `ops`, valid for an hour; `jti` makes each one distinct.
    fn token(&self, jti: u64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let header = json!({"alg": self.alg(), "kid": self.kid(), "typ": "JWT"});
        let claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "CgVhbGljZRIFbG9jYWw",
                            "username": "alice", "groups": ["devs", "ops"],
                            "iat": now, "nbf": now, "exp": now + 3600, "jti": jti.to_string()});
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let signature = match self {
            Self::Rs256(key) => {
                let mut signature = vec![0; key.public().modulus_len()];
                key.sign(&RSA_PKCS1_SHA256, &rng, signed.as_bytes(), &mut signature)
                    .unwrap();
                signature
            }
            Self::Es256(key) => key.sign(&rng, signed.as_bytes()).unwrap().as_ref().to_vec(),
        };
        format!("{signed}.{}", B64URL.encode(signature))
    }
}

/// An authenticator for [`ISSUER`] trusting both keys, with `cache` as its result cache.
fn authenticator(keys: &[&SigningKey], cache: CacheConfig) -> JwtAuthenticator {
    let mut config = JwtConfig::new("bench-jwt", ISSUER, AUDIENCE);
    // Never contacted (keys are installed), but a bundle avoids loading the system's roots.
    config.ca_bundle_pem = Some(test_util::unrelated_ca_pem());
    config.cache = cache;
    let jwt = JwtAuthenticator::new(config).unwrap();
    let jwks = json!({"keys": keys.iter().map(|key| key.jwk()).collect::<Vec<_>>()});
    assert_eq!(jwt.install_keys(jwks.to_string().as_bytes()).unwrap(), keys.len());
    jwt
}

fn jwt(c: &mut Criterion) {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let rt = common::runtime();
    let (rs256, es256) = (SigningKey::rs256(), SigningKey::es256());
    let no_cache = CacheConfig {
        positive_ttl: Duration::ZERO,
        negative_ttl: Duration::ZERO,
        ..CacheConfig::default()
    };

    for key in [&rs256, &es256] {
        let alg = key.alg().to_lowercase();
        let token = key.token(0);
        eprintln!("{} token: {} bytes", key.alg(), token.len());

        // Miss: a never-seen token per iteration. The untimed signing in the setup (about a
        // quarter of a millisecond for RSA) dominates the wall time, so this group is kept short.
        let cached = authenticator(&[&rs256, &es256], CacheConfig::default());
        common::assert_alice(&rt.block_on(cached.authenticate(&key.token(1))));
        let next = AtomicU64::new(2);
        let mut group = c.benchmark_group(format!("jwt/{alg}"));
        group
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3))
            .sample_size(30);
        group.bench_function("miss", |b| {
            b.to_async(&rt).iter_batched(
                || key.token(next.fetch_add(1, Ordering::Relaxed)),
                |token| {
                    let cached = &cached;
                    async move { cached.authenticate(&token).await }
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();

        let mut group = c.benchmark_group(format!("jwt/{alg}"));
        let uncached = authenticator(&[&rs256, &es256], no_cache);
        common::assert_alice(&rt.block_on(uncached.authenticate(&token)));
        group.bench_function("no-cache", |b| {
            b.to_async(&rt).iter(|| uncached.authenticate(black_box(&token)))
        });

        common::assert_alice(&rt.block_on(cached.authenticate(&token)));
        group.bench_function("hit", |b| {
            b.to_async(&rt).iter(|| cached.authenticate(black_box(&token)))
        });
        group.finish();

        let (signed, signature) = token.rsplit_once('.').unwrap();
        let signature = B64URL.decode(signature).unwrap();
        let jwk = key.jwk();
        let field = |name: &str| B64URL.decode(jwk[name].as_str().unwrap()).unwrap();
        match key {
            SigningKey::Rs256(_) => {
                let public = RsaPublicKeyComponents {
                    n: field("n"),
                    e: field("e"),
                };
                public
                    .verify(&RSA_PKCS1_2048_8192_SHA256, signed.as_bytes(), &signature)
                    .unwrap();
                c.bench_function("jwt/ring-verify/rs256", |b| {
                    b.iter(|| {
                        public.verify(
                            &RSA_PKCS1_2048_8192_SHA256,
                            black_box(signed.as_bytes()),
                            black_box(&signature),
                        )
                    })
                });
            }
            SigningKey::Es256(_) => {
                let point = [&[0x04][..], &field("x"), &field("y")].concat();
                let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point);
                public.verify(signed.as_bytes(), &signature).unwrap();
                c.bench_function("jwt/ring-verify/es256", |b| {
                    b.iter(|| public.verify(black_box(signed.as_bytes()), black_box(&signature)))
                });
            }
        }

        c.bench_function(&format!("jwt/dot-count/{alg}-token"), |b| {
            b.iter(|| selkie_filters::jwt::has_compact_jws_shape(black_box(token.as_str())))
        });

        let hmac_key = hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new()).unwrap();
        c.bench_function(&format!("jwt/hmac-sha256/{alg}-token"), |b| {
            b.iter(|| hmac::sign(&hmac_key, black_box(token.as_bytes())))
        });
    }
}

criterion_group!(benches, jwt);
criterion_main!(benches);
