//! Unit tests of JWT verification against a scripted discovery + JWKS endpoint, with ES256 and
//! EdDSA keys made by ring. RS256 from a real issuer is tested in `e2e/` against Dex.

use std::sync::{Arc, Mutex};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use ring::{
    rand::SystemRandom,
    signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING},
};
use serde_json::json;

use super::*;
use crate::test_util::{endpoint, Endpoint};

const AUDIENCE: &str = "selkie-test";

enum TestKey {
    Ec(EcdsaKeyPair),
    Ed(Ed25519KeyPair),
}

impl TestKey {
    fn ec() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Self::Ec(EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap())
    }

    fn ed() -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Self::Ed(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    fn jwk(&self, kid: &str) -> Value {
        match self {
            Self::Ec(key) => {
                let point = key.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                       "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..65])})
            }
            Self::Ed(key) => json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                                    "x": B64URL.encode(key.public_key().as_ref())}),
        }
    }

    fn alg(&self) -> &'static str {
        match self {
            Self::Ec(_) => "ES256",
            Self::Ed(_) => "EdDSA",
        }
    }

    fn sign(&self, header: &Value, claims: &Value) -> String {
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let signature = match self {
            Self::Ec(key) => key
                .sign(&SystemRandom::new(), signed.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
            Self::Ed(key) => key.sign(signed.as_bytes()).as_ref().to_vec(),
        };
        format!("{signed}.{}", B64URL.encode(signature))
    }

    fn token(&self, kid: &str, claims: &Value) -> String {
        self.sign(&json!({"alg": self.alg(), "kid": kid, "typ": "JWT"}), claims)
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// An issuer whose key set can be changed while it runs.
struct Issuer {
    endpoint: Endpoint,
    jwks: Arc<Mutex<Value>>,
}

impl Issuer {
    async fn start(keys: &[(&str, &TestKey)]) -> Self {
        let jwks = Arc::new(Mutex::new(Value::Null));
        let issuer_url = Arc::new(Mutex::new(String::new()));
        let (served, url) = (jwks.clone(), issuer_url.clone());
        let endpoint = endpoint(Arc::new(move |path: &str, _: &Value| {
            let issuer = url.lock().unwrap().clone();
            match path {
                "/.well-known/openid-configuration" => (
                    http::StatusCode::OK,
                    json!({"issuer": issuer, "jwks_uri": format!("{issuer}/keys")}).to_string(),
                ),
                "/keys" => (http::StatusCode::OK, served.lock().unwrap().to_string()),
                _ => (http::StatusCode::NOT_FOUND, String::new()),
            }
        }))
        .await;
        *issuer_url.lock().unwrap() = endpoint.base_url.clone();
        let issuer = Self { endpoint, jwks };
        issuer.publish(keys);
        issuer
    }

    fn publish(&self, keys: &[(&str, &TestKey)]) {
        *self.jwks.lock().unwrap() =
            json!({"keys": keys.iter().map(|(kid, key)| key.jwk(kid)).collect::<Vec<_>>()});
    }

    fn url(&self) -> &str {
        &self.endpoint.base_url
    }

    fn config(&self) -> JwtConfig {
        let mut config = JwtConfig::new("test-jwt", self.url(), AUDIENCE);
        config.ca_bundle_pem = Some(self.endpoint.ca_pem.clone());
        config.timeout = Duration::from_secs(2);
        config
    }

    fn authenticator(&self) -> JwtAuthenticator {
        JwtAuthenticator::new(self.config()).unwrap()
    }

    fn claims(&self) -> Value {
        json!({"iss": self.url(), "aud": AUDIENCE, "sub": "1", "username": "alice", "groups": ["devs", "ops"],
               "exp": now() + 300, "iat": now(), "nbf": now()})
    }

    /// `claims()` with `changes` merged in (a `null` removes the claim).
    fn claims_with(&self, changes: Value) -> Value {
        let mut claims = self.claims();
        for (key, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(key);
            } else {
                claims[key] = value.clone();
            }
        }
        claims
    }
}

fn rejected(reason: RejectReason) -> Outcome {
    Outcome::Rejected(reason)
}

#[tokio::test]
async fn a_valid_token_maps_to_its_user_and_groups() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let jwt = issuer.authenticator();
    let outcome = jwt.authenticate(&key.token("k1", &issuer.claims())).await;
    let Outcome::Authenticated(identity) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(identity.user.username, "alice");
    assert_eq!(identity.user.groups, vec!["devs", "ops"]);
    assert_eq!(identity.audiences, vec![AUDIENCE]);
    assert_eq!(&*identity.authenticator, "test-jwt");
    assert_eq!(identity.forwarding, Forwarding::Impersonate);
}

#[tokio::test]
async fn eddsa_and_keys_without_kid_or_alg_work() {
    let key = TestKey::ed();
    let issuer = Issuer::start(&[("ed", &key)]).await;
    let jwt = issuer.authenticator();
    let without_kid = key.sign(&json!({"alg": "EdDSA"}), &issuer.claims());
    assert!(matches!(
        jwt.authenticate(&without_kid).await,
        Outcome::Authenticated(_)
    ));
}

#[tokio::test]
async fn structured_mappings_prefixes_uid_extra_and_several_audiences() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let mut config = issuer.config();
    config.audiences = vec!["other".into(), AUDIENCE.into()];
    config.audience_match_policy = Some(AudienceMatchPolicy::MatchAny);
    config.username = Mapping::Claim(ClaimMapping {
        claim: "email".into(),
        prefix: "oidc:".into(),
    });
    config.groups = Some(Mapping::Claim(ClaimMapping {
        claim: "roles".into(),
        prefix: "oidc:".into(),
    }));
    config.uid = Some(ClaimMapping::claim("sub").into());
    config.extra = BTreeMap::from([("example.com/tenant".to_string(), "claims.tenant".to_string())]);
    let jwt = JwtAuthenticator::new(config).unwrap();
    let claims = issuer.claims_with(
        json!({"aud": ["x", AUDIENCE], "email": "a@example.com", "email_verified": true,
                                           "roles": "admin", "tenant": ["t1", "t2"]}),
    );
    let Outcome::Authenticated(identity) = jwt.authenticate(&key.token("k1", &claims)).await else {
        panic!()
    };
    assert_eq!(identity.user.username, "oidc:a@example.com");
    assert_eq!(identity.user.groups, vec!["oidc:admin"]);
    assert_eq!(identity.user.uid.as_deref(), Some("1"));
    assert_eq!(
        identity.user.extra.get("example.com/tenant"),
        Some(&vec!["t1".to_string(), "t2".to_string()])
    );

    let unverified = issuer.claims_with(json!({"email": "b@example.com", "email_verified": false}));
    assert_eq!(
        jwt.authenticate(&key.token("k1", &unverified)).await,
        rejected(RejectReason::ClaimInvalid)
    );
}

#[tokio::test]
async fn none_hmac_and_algorithm_confusion_are_refused() {
    let (ec, ed) = (TestKey::ec(), TestKey::ed());
    let issuer = Issuer::start(&[("ec", &ec), ("ed", &ed)]).await;
    let jwt = issuer.authenticator();
    let claims = issuer.claims();
    let unsigned = format!(
        "{}.{}.",
        B64URL.encode(json!({"alg": "none", "kid": "ec"}).to_string()),
        B64URL.encode(claims.to_string())
    );
    assert_eq!(
        jwt.authenticate(&unsigned).await,
        rejected(RejectReason::UnsupportedAlgorithm)
    );

    // HS256 "signed" with the public key as the HMAC secret: the classic confusion attack.
    let header = B64URL.encode(json!({"alg": "HS256", "kid": "ec"}).to_string());
    let signed = format!("{header}.{}", B64URL.encode(claims.to_string()));
    let public = serde_json::to_vec(&ec.jwk("ec")).unwrap();
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &public),
        signed.as_bytes(),
    );
    let hs256 = format!("{signed}.{}", B64URL.encode(tag.as_ref()));
    assert_eq!(
        jwt.authenticate(&hs256).await,
        rejected(RejectReason::UnsupportedAlgorithm)
    );

    // An ES256 token whose kid names the Ed25519 key.
    let confused = ec.sign(&json!({"alg": "ES256", "kid": "ed"}), &claims);
    assert_eq!(
        jwt.authenticate(&confused).await,
        rejected(RejectReason::UnsupportedAlgorithm)
    );

    // A valid ES256 signature by another key under the right kid.
    let forged = TestKey::ec().token("ec", &claims);
    assert_eq!(
        jwt.authenticate(&forged).await,
        rejected(RejectReason::BadSignature)
    );
    let crit = ec.sign(&json!({"alg": "ES256", "kid": "ec", "crit": ["exp"]}), &claims);
    assert_eq!(jwt.authenticate(&crit).await, rejected(RejectReason::Malformed));
}

#[tokio::test]
async fn time_claims_are_enforced_with_bounded_skew() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let jwt = issuer.authenticator(); // 60 s skew
    let token = |changes: Value| key.token("k1", &issuer.claims_with(changes));
    assert_eq!(
        jwt.authenticate(&token(json!({"exp": now() - 120}))).await,
        rejected(RejectReason::Expired)
    );
    assert!(matches!(
        jwt.authenticate(&token(json!({"exp": now() - 10}))).await,
        Outcome::Authenticated(_)
    ));
    assert_eq!(
        jwt.authenticate(&token(json!({"nbf": now() + 600}))).await,
        rejected(RejectReason::NotYetValid)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"iat": now() + 600}))).await,
        rejected(RejectReason::NotYetValid)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"exp": null}))).await,
        rejected(RejectReason::ClaimInvalid)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"exp": "soon"}))).await,
        rejected(RejectReason::ClaimInvalid)
    );
    // A signed token with a time no clock can hold is an invalid claim, never a panic.
    for (claim, value) in [
        ("exp", json!(1e300)),
        ("exp", json!(1.8e19)),
        ("exp", json!(-1e300)),
        ("nbf", json!(-1e300)),
        ("iat", json!(1e300)),
    ] {
        assert_eq!(
            jwt.authenticate(&token(json!({ claim: value }))).await,
            rejected(RejectReason::ClaimInvalid),
            "{claim}: {value}"
        );
    }
}

#[tokio::test]
async fn audience_issuer_and_claim_types_are_checked() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let jwt = issuer.authenticator();
    let token = |changes: Value| key.token("k1", &issuer.claims_with(changes));
    assert_eq!(
        jwt.authenticate(&token(json!({"aud": "someone-else"}))).await,
        rejected(RejectReason::WrongAudience)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"aud": null}))).await,
        rejected(RejectReason::WrongAudience)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"aud": 7}))).await,
        rejected(RejectReason::ClaimInvalid)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"groups": 5}))).await,
        rejected(RejectReason::ClaimInvalid)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"groups": ["a", 1]}))).await,
        rejected(RejectReason::ClaimInvalid)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"username": null}))).await,
        rejected(RejectReason::EmptyUsername)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"username": ""}))).await,
        rejected(RejectReason::EmptyUsername)
    );
    assert_eq!(
        jwt.authenticate(&token(json!({"username": {"a": 1}}))).await,
        rejected(RejectReason::ClaimInvalid)
    );
    // Another issuer's token, or something that is not a JWT at all, is for someone else.
    let other = token(json!({"iss": "https://elsewhere.example.com"}));
    assert_eq!(jwt.authenticate(&other).await, Outcome::NotMine);
    assert_eq!(jwt.authenticate("opaque-webhook-token").await, Outcome::NotMine);
    // The issuer must match exactly, trailing slash included.
    let slash = token(json!({"iss": format!("{}/", issuer.url())}));
    assert_eq!(jwt.authenticate(&slash).await, Outcome::NotMine);
}

#[tokio::test]
async fn broken_encodings_deep_json_and_oversized_tokens_are_refused() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let jwt = issuer.authenticator();
    let good = key.token("k1", &issuer.claims());
    let (header, rest) = good.split_once('.').unwrap();
    assert_eq!(
        jwt.authenticate(&format!("{header}!.{rest}")).await,
        rejected(RejectReason::Malformed)
    );
    assert_eq!(
        jwt.authenticate(&format!("{header}=.{rest}")).await,
        rejected(RejectReason::Malformed)
    );
    assert_eq!(
        jwt.authenticate(&format!("{good}%")).await,
        rejected(RejectReason::Malformed)
    );
    let deep = format!("{}{}", "[".repeat(4000), "]".repeat(4000));
    let payload = B64URL.encode(format!(r#"{{"iss":"{}","x":{deep}}}"#, issuer.url()));
    assert_eq!(
        jwt.authenticate(&format!("{header}.{payload}.AAAA")).await,
        rejected(RejectReason::Malformed)
    );
    let huge = key.token("k1", &issuer.claims_with(json!({"padding": "x".repeat(20_000)})));
    assert_eq!(jwt.authenticate(&huge).await, rejected(RejectReason::TooLarge));
    assert_eq!(jwt.authenticate("a.b.c").await, rejected(RejectReason::Malformed));
}

#[tokio::test]
async fn an_unknown_kid_refreshes_the_keys_once_per_interval() {
    let (old, new, newer) = (TestKey::ec(), TestKey::ec(), TestKey::ec());
    let issuer = Issuer::start(&[("old", &old)]).await;
    let jwt = issuer.authenticator();
    assert!(matches!(
        jwt.authenticate(&old.token("old", &issuer.claims())).await,
        Outcome::Authenticated(_)
    ));
    let fetches = issuer.endpoint.hits();
    assert_eq!(fetches, 2, "discovery + keys");

    // The issuer rotates: the new key is found by one refresh.
    issuer.publish(&[("new", &new)]);
    assert!(matches!(
        jwt.authenticate(&new.token("new", &issuer.claims())).await,
        Outcome::Authenticated(_)
    ));
    assert_eq!(issuer.endpoint.hits(), fetches + 2);

    // Another unknown kid within the minimum interval does not hit the issuer again.
    issuer.publish(&[("newer", &newer)]);
    let outcome = jwt.authenticate(&newer.token("newer", &issuer.claims())).await;
    assert_eq!(outcome, rejected(RejectReason::UnknownKey));
    assert_eq!(issuer.endpoint.hits(), fetches + 2, "rate limited");
    // A token signed by the rotated-out key is refused now.
    let stale = old.token("old", &issuer.claims_with(json!({"sub": "2"})));
    assert_eq!(jwt.authenticate(&stale).await, rejected(RejectReason::UnknownKey));
}

#[tokio::test]
async fn with_the_cache_disabled_every_presentation_is_verified() {
    let (old, new) = (TestKey::ec(), TestKey::ec());
    let issuer = Issuer::start(&[("old", &old)]).await;
    let cached = issuer.authenticator();
    let mut config = issuer.config();
    config.cache = CacheConfig::disabled();
    let uncached = JwtAuthenticator::new(config).unwrap();
    let token = old.token("old", &issuer.claims());
    for jwt in [&cached, &uncached] {
        assert!(matches!(
            jwt.authenticate(&token).await,
            Outcome::Authenticated(_)
        ));
    }
    // The key is rotated out everywhere: the cached result still stands, the uncached
    // authenticator checks the token again, finds no key for its kid (not even after the refresh
    // an unknown kid triggers) and refuses.
    issuer.publish(&[("new", &new)]);
    let jwks = json!({"keys": [new.jwk("new")]}).to_string();
    for jwt in [&cached, &uncached] {
        assert_eq!(jwt.install_keys(jwks.as_bytes()).unwrap(), 1);
    }
    assert!(matches!(
        cached.authenticate(&token).await,
        Outcome::Authenticated(_)
    ));
    assert_eq!(
        uncached.authenticate(&token).await,
        rejected(RejectReason::UnknownKey)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_fetch_the_keys_once() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let jwt = Arc::new(issuer.authenticator());
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (jwt, token) = (
                jwt.clone(),
                key.token("k1", &issuer.claims_with(json!({"sub": i.to_string()}))),
            );
            tokio::spawn(async move { jwt.authenticate(&token).await })
        })
        .collect();
    for task in tasks {
        assert!(matches!(task.await.unwrap(), Outcome::Authenticated(_)));
    }
    assert_eq!(
        issuer.endpoint.hits(),
        2,
        "one discovery and one JWKS fetch for all"
    );
}

#[tokio::test]
async fn a_broken_issuer_is_upstream_unavailable_and_never_cached_as_success() {
    let key = TestKey::ec();
    for (name, script) in [
        (
            "garbage",
            Arc::new(|_: &str, _: &Value| (http::StatusCode::OK, "<html>".to_string()))
                as crate::test_util::Script,
        ),
        (
            "error",
            Arc::new(|_: &str, _: &Value| (http::StatusCode::BAD_GATEWAY, String::new())),
        ),
        (
            "no keys",
            Arc::new(|path: &str, _: &Value| match path {
                "/keys" => (
                    http::StatusCode::OK,
                    r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#.to_string(),
                ),
                _ => (http::StatusCode::OK, String::new()),
            }),
        ),
    ] {
        let broken = endpoint(script).await;
        let mut config = JwtConfig::new("broken", &broken.base_url, AUDIENCE);
        config.ca_bundle_pem = Some(broken.ca_pem.clone());
        config.jwks_min_refresh_interval = Duration::ZERO;
        let jwt = JwtAuthenticator::new(config).unwrap();
        let claims = json!({"iss": broken.base_url, "aud": AUDIENCE, "username": "x", "exp": now() + 60});
        let token = key.token("k1", &claims);
        assert_eq!(
            jwt.authenticate(&token).await,
            rejected(RejectReason::UpstreamUnavailable),
            "{name}"
        );
        let before = broken.hits();
        assert_eq!(
            jwt.authenticate(&token).await,
            rejected(RejectReason::UpstreamUnavailable),
            "{name}"
        );
        assert!(broken.hits() > before, "{name}: a failure must not be cached");
        assert!(jwt.load_keys().await.is_err(), "{name}");
    }

    // An issuer that accepts connections and never answers.
    let url = crate::test_util::hanging_endpoint().await;
    let mut config = JwtConfig::new("hang", &url, AUDIENCE);
    config.ca_bundle_pem = Some(crate::test_util::unrelated_ca_pem());
    config.timeout = Duration::from_millis(300);
    let jwt = JwtAuthenticator::new(config).unwrap();
    let token = key.token(
        "k1",
        &json!({"iss": url, "aud": AUDIENCE, "username": "x", "exp": now() + 60}),
    );
    assert_eq!(
        jwt.authenticate(&token).await,
        rejected(RejectReason::UpstreamUnavailable)
    );
}

#[tokio::test]
async fn the_discovery_document_must_name_the_configured_issuer() {
    let lying = endpoint(Arc::new(|_: &str, _: &Value| {
        (
            http::StatusCode::OK,
            json!({"issuer": "https://evil.example.com", "jwks_uri": "https://evil.example.com/k"})
                .to_string(),
        )
    }))
    .await;
    let mut config = JwtConfig::new("lying", &lying.base_url, AUDIENCE);
    config.ca_bundle_pem = Some(lying.ca_pem.clone());
    let error = JwtAuthenticator::new(config)
        .unwrap()
        .load_keys()
        .await
        .unwrap_err();
    assert!(matches!(error, JwksError::IssuerMismatch { .. }), "{error}");
}

#[test]
fn invalid_configurations_are_refused_up_front() {
    crate::test_util::install_provider();
    let cases: Vec<(JwtConfig, &str)> = vec![
        (
            JwtConfig::new("j", "http://issuer.example.com", "a"),
            "must use https",
        ),
        (JwtConfig::new("j", "not a url", "a"), "not a valid URL"),
        (
            JwtConfig::new("j", "https://i.example.com/.well-known/openid-configuration", "a"),
            "must not contain",
        ),
        (
            JwtConfig::new("j", "https://i.example.com?x=1", "a"),
            "must not contain",
        ),
        (JwtConfig::new("j", "https://i.example.com", ""), "audience"),
        (
            JwtConfig {
                audiences: vec!["a".into(), "b".into()],
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "audienceMatchPolicy must be MatchAny",
        ),
        (
            JwtConfig {
                username: Mapping::Expression("claims.sub +".into()),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "claimMappings.username.expression: CEL expression \"claims.sub +\" does not parse",
        ),
        (
            JwtConfig {
                groups: Some(Mapping::Expression("claims.groups.frobnicate()".into())),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "claimMappings.groups.expression: CEL expression \"claims.groups.frobnicate()\" calls frobnicate()",
        ),
        (
            JwtConfig {
                user_validation_rules: vec![UserValidationRule {
                    expression: "claims.sub != ''".into(),
                    message: String::new(),
                }],
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "userValidationRules[0].expression: CEL expression \"claims.sub != ''\" refers to \"claims\"",
        ),
        (
            JwtConfig {
                claim_validation_rules: vec![
                    ClaimValidationRule::RequiredValue {
                        claim: "hd".into(),
                        required_value: "example.com".into(),
                    },
                    ClaimValidationRule::Expression {
                        expression: "user.username != ''".into(),
                        message: String::new(),
                    },
                ],
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "claimValidationRules[1].expression",
        ),
        (
            JwtConfig {
                uid: Some(Mapping::Claim(ClaimMapping {
                    claim: "sub".into(),
                    prefix: "x:".into(),
                })),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "the uid claim mapping takes no prefix",
        ),
        (
            JwtConfig {
                username: Mapping::Expression("claims.email".into()),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "claims.email_verified must be used",
        ),
        (
            JwtConfig {
                extra: BTreeMap::from([("tenant".into(), "claims.t".into())]),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "extra key \"tenant\" is invalid: it must be a domain-prefixed path",
        ),
        (
            JwtConfig {
                extra: BTreeMap::from([("Example.com/t".into(), "claims.t".into())]),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "it must be lowercase",
        ),
        (
            JwtConfig {
                extra: BTreeMap::from([("authentication.kubernetes.io/x".into(), "claims.t".into())]),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "reserved",
        ),
        (
            JwtConfig {
                extra: BTreeMap::from([("example.com/my team".into(), "claims.t".into())]),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "it may hold only lowercase letters, digits",
        ),
        (
            JwtConfig {
                extra: BTreeMap::from([(
                    "original-user-info.impersonation-proxy.concierge.pinniped.dev/x".into(),
                    "claims.t".into(),
                )]),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "belong to the impersonation proxy",
        ),
        (
            JwtConfig {
                username: ClaimMapping::claim("").into(),
                ..JwtConfig::new("j", "https://i.example.com", "a")
            },
            "username claim",
        ),
    ];
    for (mut config, expected) in cases {
        config.ca_bundle_pem = Some(String::from(
            "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n",
        ));
        let error = JwtAuthenticator::new(config).map(|_| ()).unwrap_err().to_string();
        assert!(error.contains(expected), "expected {expected:?}, got {error:?}");
    }
}

#[test]
fn an_email_user_name_is_accepted_when_email_verified_is_checked_anywhere() {
    crate::test_util::install_provider();
    let with = |change: fn(&mut JwtConfig)| {
        let mut config = JwtConfig::new("j", "https://i.example.com", "a");
        config.username = Mapping::Expression("claims.email".into());
        change(&mut config);
        JwtAuthenticator::new(config).map(|_| ())
    };
    with(|c| c.username = Mapping::Expression("claims.email_verified ? claims.email : ''".into())).unwrap();
    with(|c| {
        c.claim_validation_rules = vec![ClaimValidationRule::Expression {
            expression: "claims.email_verified == true".into(),
            message: "verified emails only".into(),
        }]
    })
    .unwrap();
    with(|c| c.extra = BTreeMap::from([("example.com/v".into(), "string(claims.email_verified)".into())]))
        .unwrap();
}

#[tokio::test]
async fn cel_mappings_and_validation_rules_decide_the_user() {
    let key = TestKey::ec();
    let issuer = Issuer::start(&[("k1", &key)]).await;
    let mut config = issuer.config();
    config.username = Mapping::Expression("'cel:' + claims.sub".into());
    config.groups = Some(Mapping::Expression("claims.groups.map(g, 'team:' + g)".into()));
    config.uid = Some(Mapping::Expression("claims.sub".into()));
    config.extra = BTreeMap::from([(
        "example.com/org".to_string(),
        "has(claims.org) ? claims.org : ''".to_string(),
    )]);
    config.claim_validation_rules = vec![
        ClaimValidationRule::RequiredValue {
            claim: "tenant".into(),
            required_value: "blue".into(),
        },
        ClaimValidationRule::Expression {
            expression: "claims.exp - claims.iat <= 3600".into(),
            message: "tokens must live at most an hour".into(),
        },
    ];
    config.user_validation_rules = vec![UserValidationRule {
        expression: "!user.username.startsWith('cel:system:')".into(),
        message: "no system users".into(),
    }];
    let jwt = JwtAuthenticator::new(config).unwrap();
    let token = |changes: Value| key.token("k1", &issuer.claims_with(changes));

    let Outcome::Authenticated(identity) = jwt
        .authenticate(&token(json!({"sub": "u-1", "tenant": "blue", "org": "acme"})))
        .await
    else {
        panic!("a token that satisfies every rule is accepted")
    };
    assert_eq!(identity.user.username, "cel:u-1");
    assert_eq!(identity.user.groups, vec!["team:devs", "team:ops"]);
    assert_eq!(identity.user.uid.as_deref(), Some("u-1"));
    assert_eq!(
        identity.user.extra.get("example.com/org"),
        Some(&vec!["acme".to_string()])
    );

    let Outcome::Authenticated(identity) = jwt
        .authenticate(&token(json!({"sub": "u-2", "tenant": "blue"})))
        .await
    else {
        panic!("an empty extra value is left out, not an error")
    };
    assert!(identity.user.extra.is_empty());

    let refused = [
        (json!({"tenant": "red"}), RejectReason::ValidationRuleFailed),
        (json!({"tenant": null}), RejectReason::ValidationRuleFailed),
        (
            json!({"tenant": "blue", "iat": now() - 7200}),
            RejectReason::ValidationRuleFailed,
        ),
        (
            json!({"tenant": "blue", "sub": "system:admin"}),
            RejectReason::ValidationRuleFailed,
        ),
        (json!({"tenant": "blue", "sub": 7}), RejectReason::ClaimInvalid),
        (
            json!({"tenant": "blue", "groups": "not-a-list"}),
            RejectReason::ClaimInvalid,
        ),
        (json!({"tenant": "blue", "sub": null}), RejectReason::ClaimInvalid),
    ];
    for (changes, reason) in refused {
        assert_eq!(
            jwt.authenticate(&token(changes.clone())).await,
            rejected(reason),
            "{changes}"
        );
    }
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    /// An authenticator whose issuer is a closed loopback port: every key fetch fails at once.
    fn offline() -> (JwtAuthenticator, String) {
        crate::test_util::install_provider();
        let issuer = "https://127.0.0.1:9".to_string();
        let mut config = JwtConfig::new("offline", &issuer, AUDIENCE);
        config.ca_bundle_pem = Some(crate::test_util::unrelated_ca_pem());
        config.timeout = Duration::from_millis(200);
        (JwtAuthenticator::new(config).unwrap(), issuer)
    }

    /// An issuer serving discovery and the key `k1`, an authenticator for it without a result
    /// cache (every token is verified), and the runtime they run on; started once for all cases.
    struct Served {
        runtime: tokio::runtime::Runtime,
        key: TestKey,
        issuer: Issuer,
        jwt: JwtAuthenticator,
    }

    fn served() -> &'static Served {
        static SERVED: std::sync::OnceLock<Served> = std::sync::OnceLock::new();
        SERVED.get_or_init(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let key = TestKey::ec();
            let issuer = runtime.block_on(Issuer::start(&[("k1", &key)]));
            let mut config = issuer.config();
            config.cache = CacheConfig::disabled();
            let jwt = JwtAuthenticator::new(config).unwrap();
            Served {
                runtime,
                key,
                issuer,
                jwt,
            }
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary text is never a success and never a panic.
        #[test]
        fn arbitrary_text_is_never_authenticated(token in "\\PC{0,300}") {
            let (jwt, _) = offline();
            let outcome = runtime().block_on(jwt.authenticate(&token));
            prop_assert!(!matches!(outcome, Outcome::Authenticated(_)), "{outcome:?}");
        }

        /// Well-formed tokens for the right issuer, whose keys are served, with arbitrary
        /// headers, claims and signature bytes are refused, never accepted; the same claims
        /// signed with the served key are accepted (so the refusals are the signature's doing).
        #[test]
        fn arbitrary_jws_for_our_issuer_is_never_authenticated(
            alg in prop::sample::select(vec!["none", "HS256", "RS256", "ES256", "EdDSA", "PS512", ""]),
            kid in proptest::option::of("[a-z0-9]{0,8}"),
            extra in prop::collection::btree_map("[a-z]{1,6}", any::<i64>(), 0..4),
            signature in prop::collection::vec(any::<u8>(), 0..128),
        ) {
            let served = served();
            let header = json!({"alg": alg, "kid": kid});
            let mut claims = json!({"iss": served.issuer.url(), "aud": AUDIENCE, "username": "x", "exp": now() + 60});
            for (key, value) in extra {
                // Extra claims only: the ones that decide validity stay as set above.
                if !["iss", "aud", "username", "exp", "nbf", "iat"].contains(&key.as_str()) {
                    claims[key] = json!(value);
                }
            }
            let token = format!(
                "{}.{}.{}",
                B64URL.encode(header.to_string()),
                B64URL.encode(claims.to_string()),
                B64URL.encode(signature)
            );
            let outcome = served.runtime.block_on(served.jwt.authenticate(&token));
            prop_assert!(matches!(outcome, Outcome::Rejected(_)), "{outcome:?}");
            let signed = served.key.token("k1", &claims);
            let control = served.runtime.block_on(served.jwt.authenticate(&signed));
            prop_assert!(matches!(control, Outcome::Authenticated(_)), "the signed twin: {control:?}");
        }
    }
}

#[test]
fn the_jws_shape_is_exactly_two_dots_wherever_they_are() {
    for token in ["a.b.c", "..", "a..", "..c", "eyJh.eyJi.c2ln"] {
        assert!(has_compact_jws_shape(token), "{token:?} has two dots");
    }
    for token in ["", "abc", "a.b", "a.b.c.d", "...", "a.b.c.d.e", "opaque-token"] {
        assert!(!has_compact_jws_shape(token), "{token:?} does not have two dots");
    }
    // Longer than one vector: the search must find dots past the first block too.
    let long = format!("{}.{}.{}", "a".repeat(300), "b".repeat(300), "c".repeat(300));
    assert!(has_compact_jws_shape(&long));
    assert!(!has_compact_jws_shape(&format!("{long}.")));
}
