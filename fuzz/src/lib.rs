//! What Selkie's fuzz targets share, built once per process: a current-thread Tokio runtime, the
//! JWT authenticator under test, and key material whose private halves are thrown away as soon as
//! they have been used, so no input can carry a valid signature; and for the Supervisor's targets,
//! its endpoints' answers read whole, and what an OAuth error answer must look like.

use std::{sync::OnceLock, time::Duration};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use ring::{
    rand::SystemRandom,
    signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _},
};
use selkie_filters::{
    jwt::{JwtAuthenticator, JwtConfig},
    outcome::{Outcome, RejectReason},
    review_cache::CacheConfig,
};
use serde_json::{json, Value};

/// The issuer every authenticator is configured with. A loopback IP literal on a closed port: the
/// single key refresh of [`jwt_authenticator`] is refused at once, with no DNS lookup and no
/// traffic off the machine.
pub const ISSUER: &str = "https://127.0.0.1:1";
/// The accepted audience.
pub const AUDIENCE: &str = "aud";
/// `exp` of generated tokens (2100-01-01): a constant, so that runs are reproducible.
pub const EXPIRY: u64 = 4_102_444_800;
/// The `kid`s of [`fixed_jwks`], and one that is not in it.
pub const KIDS: [&str; 5] = ["p256", "p384", "ed25519", "rsa", "unknown"];

/// A 2048-bit RSA modulus whose private key was discarded when it was generated (ring cannot
/// generate RSA keys).
const RSA_MODULUS: &str = "u9GR8x-3Ddy-7ID6uG7FTHaTNPiT_WWWMugbbDenGnOyXCFtZo1ktPsrRImR0KTwd-WlgM5ywBX7QDfbm2ZK5UG5eR73\
    RGpFdavPXjnzhKs3UtbkQ8jIzBcWvyS3xflw8_tYCe5HYIZzysP3on4rGGuaeFZRh103lgBUYpwzZcw7qZIMnd4DKULfVi34glCo3AVD\
    h4mOdzniwNAU9gSGsmLDNVqp4q6trdjdOCX5GMkRnwu7uDy9h67chH4XdBQEdHXq7S6sxhW0lPnOw0hFnzYRTbIDrxNSnI4Rnv2SjcMBd0\
    wGbaQjQ6-j-I6l-2XkaKDBifWXqWdBKcRjVa084Q";

/// The runtime the async authenticators run on, one per process.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("building the Tokio runtime")
    })
}

/// Installs ring as rustls' process-wide provider (a second call is a no-op).
pub fn install_crypto_provider() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// A JWT authenticator for [`ISSUER`] and [`AUDIENCE`] holding the keys of [`fixed_jwks`] (its
/// key set may be replaced with `install_keys`). It caches no result, so every input reaches
/// verification, and it never fetches keys while fuzzing: it has already made the one refresh an
/// unknown `kid` may trigger, which failed, so every later one is rate-limited for a century.
pub fn jwt_authenticator() -> JwtAuthenticator {
    install_crypto_provider();
    let mut config = JwtConfig::new("fuzz", ISSUER, AUDIENCE);
    config.ca_bundle_pem = Some(throwaway_ca_pem());
    config.timeout = Duration::from_millis(200);
    config.jwks_min_refresh_interval = Duration::from_secs(100 * 365 * 24 * 3600);
    config.jwks_max_age = config.jwks_min_refresh_interval;
    config.cache = CacheConfig {
        capacity: 1,
        positive_ttl: Duration::ZERO,
        negative_ttl: Duration::ZERO,
    };
    let authenticator = JwtAuthenticator::new(config).expect("the fuzz JWT configuration is valid");
    authenticator
        .install_keys(&fixed_jwks())
        .expect("the fixed JWKS holds usable keys");

    let header = json!({"alg": "ES256", "kid": KIDS[4]});
    let token = unsigned_token(&header, &claims(), &[0; 64]);
    let outcome = runtime().block_on(authenticator.authenticate(&token));
    assert_eq!(
        outcome,
        Outcome::Rejected(RejectReason::UpstreamUnavailable),
        "the warm-up refresh must fail, so that later ones are rate-limited"
    );
    authenticator
}

/// The claims of a token that would be accepted if it were signed: [`ISSUER`], [`AUDIENCE`],
/// [`EXPIRY`], a user name and a group.
pub fn claims() -> serde_json::Map<String, Value> {
    let claims = json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": EXPIRY,
        "iat": 1_700_000_000,
        "username": "fuzz",
        "groups": ["fuzzers"],
    });
    match claims {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// `base64url(header).base64url(claims).base64url(signature)`.
pub fn unsigned_token(header: &Value, claims: &serde_json::Map<String, Value>, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        B64URL.encode(header.to_string()),
        B64URL.encode(Value::Object(claims.clone()).to_string()),
        B64URL.encode(signature),
    )
}

/// A JWKS of one key of each kind Selkie verifies, kids as in [`KIDS`], generated afresh (their
/// private keys are dropped on return), plus an HMAC key that must never be usable. P-256 and
/// Ed25519 pin their `alg`; P-384 and RSA leave it to the key type.
pub fn fixed_jwks() -> Vec<u8> {
    let rng = SystemRandom::new();
    let ec_point = |alg: &'static signature::EcdsaSigningAlgorithm| {
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("generating an ECDSA key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("parsing a fresh ECDSA key");
        pair.public_key().as_ref().to_vec()
    };
    let ec_jwk = |kid: &str, crv: &str, alg: Option<&str>, point: &[u8]| {
        // An uncompressed point: 0x04 || x || y.
        let (x, y) = point[1..].split_at((point.len() - 1) / 2);
        let mut jwk =
            json!({"kty": "EC", "kid": kid, "crv": crv, "x": B64URL.encode(x), "y": B64URL.encode(y)});
        if let Some(alg) = alg {
            jwk["alg"] = alg.into();
        }
        jwk
    };
    let ed25519 = {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("generating an Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("parsing a fresh Ed25519 key");
        pair.public_key().as_ref().to_vec()
    };
    let keys = json!({"keys": [
        ec_jwk(KIDS[0], "P-256", Some("ES256"), &ec_point(&signature::ECDSA_P256_SHA256_FIXED_SIGNING)),
        ec_jwk(KIDS[1], "P-384", None, &ec_point(&signature::ECDSA_P384_SHA384_FIXED_SIGNING)),
        {"kty": "OKP", "kid": KIDS[2], "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "x": B64URL.encode(ed25519)},
        {"kty": "RSA", "kid": KIDS[3], "n": RSA_MODULUS, "e": "AQAB"},
        {"kty": "oct", "kid": "hmac", "alg": "HS256", "k": B64URL.encode("not a verification key")},
    ]});
    keys.to_string().into_bytes()
}

/// Tokens without a `kid` for [`ISSUER`], each validly signed by a key generated here and dropped
/// on return (ES256, ES384, EdDSA), or carrying a signature of the right size for RS256 and PS256.
/// No key set the fuzzer can write verifies any of them.
pub fn reference_tokens() -> Vec<String> {
    let rng = SystemRandom::new();
    let claims = claims();
    let signing_input = |alg: &str| {
        let token = unsigned_token(&json!({"alg": alg, "typ": "JWT"}), &claims, &[]);
        token.trim_end_matches('.').to_string()
    };
    let ecdsa = |name: &str, alg: &'static signature::EcdsaSigningAlgorithm| {
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("generating an ECDSA key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("parsing a fresh ECDSA key");
        let input = signing_input(name);
        let signature = pair.sign(&rng, input.as_bytes()).expect("signing with ECDSA");
        format!("{input}.{}", B64URL.encode(signature.as_ref()))
    };
    let eddsa = {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("generating an Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("parsing a fresh Ed25519 key");
        let input = signing_input("EdDSA");
        format!("{input}.{}", B64URL.encode(pair.sign(input.as_bytes()).as_ref()))
    };
    let rsa = |name: &str| format!("{}.{}", signing_input(name), B64URL.encode([0x5a; 256]));
    vec![
        ecdsa("ES256", &signature::ECDSA_P256_SHA256_FIXED_SIGNING),
        ecdsa("ES384", &signature::ECDSA_P384_SHA384_FIXED_SIGNING),
        eddsa,
        rsa("RS256"),
        rsa("PS256"),
    ]
}

/// The PEM of a fresh self-signed CA certificate (its key is dropped on return).
pub fn throwaway_ca_pem() -> String {
    let key = rcgen::KeyPair::generate().expect("generating a CA key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "selkie fuzz throwaway CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .self_signed(&key)
        .expect("self-signing a CA certificate")
        .pem()
}

/// An answer of the Supervisor's endpoints, read whole.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// A header's value as text (empty when absent or not text).
    pub fn header(&self, name: http::HeaderName) -> &str {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
    }
}

/// What `endpoints` answer to `request` (on [`runtime`]).
pub fn answer(endpoints: &selkie_supervisor::Endpoints, request: Request<Full<Bytes>>) -> Answer {
    runtime().block_on(async {
        let response = endpoints.handle(request).await;
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    })
}

/// The OAuth 2.0 error codes (RFC 6749 §4.1.2.1, §5.2; OpenID Connect Core §3.1.2.6) and the
/// status of each when it is answered directly rather than redirected: `invalid_client` is 401
/// (RFC 6749 §5.2), `access_denied` 403, `server_error` 500, `temporarily_unavailable` 503, and
/// the others 400.
pub const OAUTH_ERRORS: [(&str, u16); 13] = [
    ("invalid_request", 400),
    ("invalid_client", 401),
    ("invalid_grant", 400),
    ("invalid_scope", 400),
    ("invalid_state", 400),
    ("unauthorized_client", 400),
    ("unsupported_grant_type", 400),
    ("unsupported_response_type", 400),
    ("unsupported_response_mode", 400),
    ("access_denied", 403),
    ("server_error", 500),
    ("temporarily_unavailable", 503),
    ("login_required", 400),
];

/// The `error` of a direct OAuth error answer, after checking that it is one: JSON (uncached)
/// holding exactly `error`, a known code whose status is the answer's, and a non-empty
/// `error_description`; and `WWW-Authenticate: Basic` with `invalid_client` when `basic` (the
/// token and revocation endpoints). Panics otherwise.
pub fn expect_oauth_error(answer: &Answer, basic: bool) -> String {
    assert_eq!(
        answer.header(http::header::CONTENT_TYPE),
        "application/json",
        "an error answer that is not JSON: {answer:?}"
    );
    assert_eq!(
        answer.header(http::header::CACHE_CONTROL),
        "no-store",
        "{answer:?}"
    );
    let body: Value = serde_json::from_slice(&answer.body)
        .unwrap_or_else(|e| panic!("an error answer that does not parse ({e}): {answer:?}"));
    let object = body.as_object().expect("an error answer is a JSON object");
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["error", "error_description"], "{body}");
    let error = body["error"].as_str().expect("error is a string");
    let description = body["error_description"]
        .as_str()
        .expect("error_description is a string");
    assert!(!description.is_empty(), "{body}");
    let Some((_, status)) = OAUTH_ERRORS.iter().find(|(code, _)| *code == error) else {
        panic!("an unknown OAuth error code: {body}");
    };
    assert_eq!(answer.status.as_u16(), *status, "the status of {body}");
    if basic && error == "invalid_client" {
        assert_eq!(
            answer.header(http::header::WWW_AUTHENTICATE),
            "Basic",
            "{answer:?}"
        );
    }
    error.to_string()
}

/// The text of `bytes` as the fuzz targets read it (lossy UTF-8).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
