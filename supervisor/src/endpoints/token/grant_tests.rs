//! Unit tests of the token endpoint's grants and of revocation: real form requests through
//! [`Endpoints::handle`] to one FederationDomain, sessions in an in-memory Secret store
//! ([`crate::session::store::Store::in_memory`]), and — for the refreshes, which check the user
//! again upstream — an OIDC upstream served over HTTPS on 127.0.0.1 ([`FakeUpstream`]): the
//! sessions hold an upstream access token, as when an upstream issues no refresh token, so a
//! refresh asks the upstream's userinfo endpoint who the user is now.
//!
//! Each test asserts what a client relies on: which requests get tokens, which get
//! `invalid_grant` (the CLI then starts a new login) or `invalid_client`, and that a replayed code
//! or refresh token leaves no token of its login usable. The concurrency tests run on a
//! current-thread runtime and let the store interleave the requests by seed
//! ([`crate::session::store::memory::MemorySecrets::interleave`]), one seed a round: a round of
//! redemptions does no I/O, so a failing one replays exactly; a round of refreshes is the seed's
//! up to the winner's upstream check (loopback I/O), which the other requests run around.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, OnceLock,
    },
};

use arc_swap::ArcSwap;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http::HeaderMap;
use http_body_util::{BodyExt as _, Full};
use selkie_oidc::{
    discovery::Discovery,
    jose::{parse_jwks, sign::SigningKey, Jws},
};
use serde_json::Value;
use sha2::Digest as _;

use super::*;
use crate::clients::Clients;
use crate::endpoints::token::exchange::{ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE};
use crate::idp::Upstream;
use crate::idp::{throttle::PasswordThrottle, OidcUpstream};
use crate::issuer::Issuers;
use crate::sealed::Sealer;
use crate::server::{audit::Audit, metrics::Metrics};
use crate::session::login::{self as stored_login, CodeState, Login as StoredLogin};
use crate::session::store::{
    memory::{MemorySecrets, Requests, Verb},
    Store,
};
use crate::session::tokens::TokenKey;
use crate::session::{Identity, Upstream as SessionUpstream};

const ISSUER: &str = "https://sso.example.com/fd";
const REDIRECT_URI: &str = "http://127.0.0.1:48095/callback";
/// What the CLI asks for.
const CLI_SCOPES: &[&str] = &[
    "openid",
    "offline_access",
    "pinniped:request-audience",
    "username",
    "groups",
];
/// An OIDCClient's ID (none is configured: its tokens are another client's to the CLI).
const DYNAMIC_CLIENT: &str = "client.oauth.pinniped.dev-other";
/// The upstream identity provider's display name.
const IDP: &str = "Dex";
/// The upstream access token the sessions hold, which the upstream knows.
const UPSTREAM_TOKEN: &str = "upstream-access-token";
/// An upstream access token the upstream answers 503 for (it is failing).
const UNAVAILABLE_TOKEN: &str = "upstream-unavailable";

/// The CA and serving certificate of the fake upstream (made once: key generation is the
/// slowest part of starting one).
fn upstream_pki() -> &'static (selkie_kube::certs::CertPair, selkie_kube::certs::CertPair) {
    static PKI: OnceLock<(selkie_kube::certs::CertPair, selkie_kube::certs::CertPair)> = OnceLock::new();
    PKI.get_or_init(|| {
        let hour = std::time::Duration::from_secs(3600);
        let ca = selkie_kube::certs::generate_ca("fake upstream CA", hour).unwrap();
        let serving = selkie_kube::certs::issue_serving(&ca, &["127.0.0.1".into()], hour).unwrap();
        (ca, serving)
    })
}

/// An OIDC upstream's userinfo endpoint on 127.0.0.1 (HTTPS): it answers the claims of the
/// access tokens it knows, 503 for [`UNAVAILABLE_TOKEN`], 401 for others, and counts the
/// requests.
struct FakeUpstream {
    issuer: String,
    /// Upstream access token → the userinfo claims.
    users: Arc<Mutex<HashMap<String, Value>>>,
    userinfo_requests: Arc<AtomicUsize>,
}

impl FakeUpstream {
    /// Serves until the test's runtime ends.
    async fn start() -> Self {
        let (_, serving) = upstream_pki();
        let acceptor = crate::test_support::tls_acceptor(&serving.cert_pem, &serving.key_pem);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let users: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
        users.lock().unwrap().insert(
            UPSTREAM_TOKEN.into(),
            json!({"sub": "upstream-sub", "username": "pinny", "groups": ["walruses", "seals"]}),
        );
        let userinfo_requests = Arc::new(AtomicUsize::new(0));
        let (known, counter) = (users.clone(), userinfo_requests.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, known, counter) = (acceptor.clone(), known.clone(), counter.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                            counter.fetch_add(1, Ordering::SeqCst);
                            let token = request
                                .headers()
                                .get(header::AUTHORIZATION)
                                .and_then(|value| value.to_str().ok())
                                .and_then(|value| value.strip_prefix("Bearer "))
                                .filter(|_| request.uri().path() == "/userinfo");
                            let failing = token == Some(UNAVAILABLE_TOKEN);
                            let claims = token.and_then(|token| known.lock().unwrap().get(token).cloned());
                            let response = match claims {
                                Some(claims) => json(StatusCode::OK, Bytes::from(claims.to_string())),
                                None if failing => json(StatusCode::SERVICE_UNAVAILABLE, Bytes::new()),
                                None => json(StatusCode::UNAUTHORIZED, Bytes::new()),
                            };
                            async move { Ok::<_, Infallible>(response) }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            issuer: format!("https://127.0.0.1:{port}"),
            users,
            userinfo_requests,
        }
    }

    /// The upstream as the Supervisor knows it: discovered already (no revocation endpoint, so
    /// ending a login asks it nothing), trusting the fake's CA.
    fn oidc(&self) -> OidcUpstream {
        let (ca, _) = upstream_pki();
        let discovery = Discovery {
            issuer: self.issuer.clone(),
            authorization_endpoint: format!("{}/authorize", self.issuer),
            token_endpoint: format!("{}/token", self.issuer),
            jwks_uri: format!("{}/keys", self.issuer),
            userinfo_endpoint: format!("{}/userinfo", self.issuer),
            ..Discovery::default()
        };
        OidcUpstream {
            username_claim: Some("username".into()),
            groups_claim: Some("groups".into()),
            ..crate::test_support::oidc_upstream(IDP, "dex-uid", discovery, &ca.cert_pem)
        }
    }

    /// The upstream now answers `claims` for its access token.
    fn set_user(&self, claims: Value) {
        self.users.lock().unwrap().insert(UPSTREAM_TOKEN.into(), claims);
    }
}

/// An answer of the endpoint: status, headers and the JSON body (`Null` when empty).
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    async fn of(response: Response<Body>) -> Self {
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        Self {
            status: parts.status,
            headers: parts.headers,
            body: if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap()
            },
        }
    }

    /// The OAuth error code, empty for a success.
    fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or_default()
    }

    fn field(&self, name: &str) -> &str {
        self.body[name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {}", self.body))
    }

    /// A 200 with tokens.
    fn granted(&self) -> bool {
        self.status == StatusCode::OK && self.body.get("access_token").is_some()
    }

    /// The given OAuth error, with its status.
    #[track_caller]
    fn assert_error(&self, code: Code) {
        assert_eq!(
            (self.status.as_u16(), self.error()),
            (code.http_status(), code.as_str()),
            "{}",
            self.body
        );
    }
}

/// A login the user finished upstream: its authorization code and what redeems it.
struct Login {
    code: String,
    verifier: String,
    request_id: String,
}

/// One FederationDomain's endpoints over an in-memory store.
struct Harness {
    endpoints: Arc<Endpoints>,
    memory: Arc<MemorySecrets>,
    issuer: Arc<Issuer>,
    upstream: FakeUpstream,
}

/// A token request (`path` below the issuer) with `form`, and HTTP Basic `credentials` when
/// given (`id:secret`, as they are encoded: not form-encoded first).
fn post(path: &str, form: &[(&str, &str)], credentials: Option<&str>) -> Request<Full<Bytes>> {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut request = Request::post(format!("{ISSUER}{path}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(credentials) = credentials {
        request = request.header(
            header::AUTHORIZATION,
            format!("Basic {}", STANDARD.encode(credentials)),
        );
    }
    request.body(Full::new(Bytes::from(body))).unwrap()
}

/// The form of a redemption of `login`'s code, without client authentication, and `extra`.
fn code_grant<'a>(login: &'a Login, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut form = vec![
        ("grant_type", "authorization_code"),
        ("code", login.code.as_str()),
        ("redirect_uri", REDIRECT_URI),
        ("code_verifier", login.verifier.as_str()),
    ];
    form.extend_from_slice(extra);
    form
}

fn redeem_request(login: &Login) -> Request<Full<Bytes>> {
    post(
        "/oauth2/token",
        &code_grant(login, &[("client_id", "pinniped-cli")]),
        None,
    )
}

fn refresh_request(refresh_token: &str) -> Request<Full<Bytes>> {
    post(
        "/oauth2/token",
        &[
            ("grant_type", "refresh_token"),
            ("client_id", "pinniped-cli"),
            ("refresh_token", refresh_token),
        ],
        None,
    )
}

fn exchange_request(access_token: &str, audience: &str) -> Request<Full<Bytes>> {
    post(
        "/oauth2/token",
        &[
            ("grant_type", TOKEN_EXCHANGE),
            ("client_id", "pinniped-cli"),
            ("subject_token", access_token),
            ("subject_token_type", ACCESS_TOKEN_TYPE),
            ("requested_token_type", JWT_TOKEN_TYPE),
            ("audience", audience),
        ],
        None,
    )
}

fn revoke_request(token: &str) -> Request<Full<Bytes>> {
    post(
        "/oauth2/revoke",
        &[("client_id", "pinniped-cli"), ("token", token)],
        None,
    )
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(false, Clients::default()).await
    }

    /// A FederationDomain with DPoP on when `dpop`, and `clients`.
    async fn start_with(dpop: bool, clients: Clients) -> Self {
        let upstream = FakeUpstream::start().await;
        let signing_key = Arc::new(SigningKey::generate("key-1").unwrap());
        let jwks = Bytes::from(json!({"keys": [signing_key.public_jwk()]}).to_string());
        let issuer = Arc::new(
            Issuer::new(
                "supervisor/fd".into(),
                ISSUER.into(),
                signing_key,
                jwks,
                Arc::new(TokenKey::new(&[7; 32])),
                Arc::new(Sealer::new(&[9; 32], ISSUER).unwrap()),
                vec![Arc::new(Upstream::Oidc(upstream.oidc()))],
                HashMap::new(),
                Default::default(),
            )
            .unwrap()
            .with_device_authorization(true)
            .with_dpop(dpop),
        );
        let (store, memory) = Store::in_memory();
        let endpoints = Arc::new(Endpoints {
            issuers: Arc::new(ArcSwap::from_pointee(Issuers::new(vec![issuer.clone()]))),
            store,
            metrics: Arc::new(Metrics::new()),
            audit: Audit::default(),
            clients: Arc::new(ArcSwap::from_pointee(clients)),
            passwords: PasswordThrottle::new(),
            device_polls: Default::default(),
            dpop_proofs: Default::default(),
            readiness: Default::default(),
        });
        Self {
            endpoints,
            memory,
            issuer,
            upstream,
        }
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> Answer {
        Answer::of(self.endpoints.handle(request).await).await
    }

    /// The session of a login of the CLI with `scopes` and `request_id`, `verifier` its PKCE
    /// verifier, as the callback makes it.
    fn session(&self, request_id: &str, scopes: &[&str], verifier: &str) -> Session {
        let now = OffsetDateTime::now_utc();
        Session {
            request_id: request_id.to_string(),
            client_id: authorize::PINNIPED_CLI.into(),
            redirect_uri: REDIRECT_URI.into(),
            scopes: scopes.iter().map(|scope| scope.to_string()).collect(),
            nonce: Some("nonce-0123456789".into()),
            code_challenge: URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes())),
            requested_at: now.unix_timestamp(),
            auth_time: now.unix_timestamp(),
            expires_at: (now + session::MAX_SESSION).unix_timestamp(),
            idle_timeout: None,
            code_active: true,
            token_expires_at: (now + session::AUTHORIZATION_CODE_LIFETIME).unix_timestamp(),
            identity: Identity {
                subject: format!("{}?idpName={IDP}&sub=upstream-sub", self.upstream.issuer),
                username: "pinny".into(),
                groups: vec!["seals".into()],
                additional_claims: Default::default(),
            },
            upstream: SessionUpstream {
                idp_name: IDP.into(),
                idp_type: "oidc".into(),
                provider_name: "dex".into(),
                provider_uid: "dex-uid".into(),
                issuer: self.upstream.issuer.clone(),
                subject: "upstream-sub".into(),
                refresh_token: None,
                access_token: Some(UPSTREAM_TOKEN.into()),
                ldap: None,
                username: Some("pinny".into()),
                groups: Some(vec!["seals".into()]),
            },
            access_token_signature: None,
            rotated: false,
        }
    }

    /// A login of the CLI with `scopes`, as the callback stores it; `change` it before.
    async fn login_with(&self, scopes: &[&str], change: impl FnOnce(&mut Session)) -> Login {
        let now = OffsetDateTime::now_utc();
        let request_id = session::new_request_id().unwrap();
        let verifier = format!("verifier-{request_id}");
        let id = stored_login::id_of(&request_id).unwrap();
        let code = self
            .issuer
            .token_key
            .mint(Kind::AuthorizationCode, LoginRef { id, generation: 0 })
            .unwrap();
        let mut session = self.session(&request_id, scopes, &verifier);
        change(&mut session);
        let login = StoredLogin::issued(session, code.signature);
        self.endpoints.store.create_login(&login, now).await.unwrap();
        Login {
            code: code.token,
            verifier,
            request_id,
        }
    }

    async fn login(&self) -> Login {
        self.login_with(CLI_SCOPES, |_| {}).await
    }

    /// A login redeemed: its tokens.
    async fn logged_in(&self) -> (Login, Answer) {
        let login = self.login().await;
        let tokens = self.send(redeem_request(&login)).await;
        assert!(tokens.granted(), "{}", tokens.body);
        (login, tokens)
    }

    /// The stored login `request_id`, if its Secret is there.
    fn stored_login(&self, request_id: &str) -> Option<StoredLogin> {
        let id = stored_login::id_of(request_id)?;
        let secret = self.memory.stored(&stored_login::secret_name(&id))?;
        Some(StoredLogin::read(&secret).unwrap())
    }

    /// The request ID of the login `token` (of `kind`) was minted for.
    fn request_id_of(&self, kind: Kind, token: &str) -> String {
        let login = self.issuer.token_key.check(kind, token).unwrap().login.unwrap();
        session::uuid_text(&login.id)
    }

    /// The signatures of the tokens of the login `request_id` a client could still use: its
    /// current access token, and its current refresh token when it was granted
    /// `offline_access`; none once the login ended.
    fn usable_tokens(&self, request_id: &str) -> Vec<String> {
        let Some(login) = self.stored_login(request_id) else {
            return Vec::new();
        };
        let Some(tokens) = login.tokens else {
            return Vec::new();
        };
        let mut usable = vec![tokens.access];
        if login.session.has_scope("offline_access") {
            usable.push(tokens.refresh);
        }
        usable
    }

    /// The stored login of `token`, of `kind`.
    fn stored(&self, kind: Kind, token: &str) -> Option<StoredLogin> {
        self.stored_login(&self.request_id_of(kind, token))
    }

    /// Changes the stored login of `token`, of `kind`, behind the endpoint's back.
    fn edit_login(&self, kind: Kind, token: &str, change: impl FnOnce(&mut StoredLogin)) {
        let mut login = self.stored(kind, token).unwrap();
        change(&mut login);
        let fresh = login.to_secret(OffsetDateTime::now_utc()).unwrap();
        let id = login.id().unwrap();
        assert!(self
            .memory
            .edit(&stored_login::secret_name(&id), |secret| secret.data = fresh.data));
    }

    /// Changes the stored session of `token`, of `kind`, behind the endpoint's back.
    fn edit(&self, kind: Kind, token: &str, change: impl FnOnce(&mut Session)) {
        self.edit_login(kind, token, |login| change(&mut login.session));
    }

    /// Whether a client holding the tokens of `answer` can still use them: the access token for
    /// a token exchange, the refresh token (if any) for a refresh. Using a refresh token that
    /// works rotates it, so ask this last.
    async fn still_usable(&self, answer: &Answer) -> (bool, bool) {
        let access = self
            .send(exchange_request(answer.field("access_token"), "cluster-a"))
            .await;
        let refresh = match answer.body["refresh_token"].as_str() {
            Some(token) => self.send(refresh_request(token)).await.granted(),
            None => false,
        };
        (access.granted(), refresh)
    }

    /// The verified claims of an ID token of this FederationDomain.
    fn id_token_claims(&self, token: &str) -> serde_json::Map<String, Value> {
        let jws = Jws::parse(token).unwrap();
        jws.verify(&parse_jwks(&self.issuer.jwks).unwrap()).unwrap();
        jws.claims.clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The authorization code grant.

/// A good redemption answers the tokens a client needs — an opaque access token, a refresh
/// token (`offline_access`), an ID token for `pinniped-cli` with the login's nonce — and records
/// the access and refresh tokens in the login's Secret, the code marked used: in one request,
/// a conditional patch (with the code's write at the authorization endpoint, two).
#[tokio::test(flavor = "current_thread")]
async fn a_redeemed_code_gives_stored_tokens_and_an_id_token() {
    let harness = Harness::start().await;
    let login = harness.login().await;
    harness.memory.take_requests();
    let answer = harness.send(redeem_request(&login)).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(
        harness.memory.take_requests(),
        Requests {
            patch: 1,
            ..Requests::default()
        }
    );
    assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");
    assert_eq!(answer.field("token_type"), "bearer");
    assert_eq!(answer.body["expires_in"], 119);
    assert_eq!(answer.field("scope"), CLI_SCOPES.join(" "));
    let access = answer.field("access_token");
    let refresh = answer.field("refresh_token");
    assert!(access.starts_with("pin_at_") && refresh.starts_with("pin_rt_"));

    let claims = harness.id_token_claims(answer.field("id_token"));
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["aud"], json!(["pinniped-cli"]));
    assert_eq!(claims["azp"], "pinniped-cli");
    assert_eq!(claims["nonce"], "nonce-0123456789");
    assert_eq!(claims["username"], "pinny");
    assert_eq!(claims["groups"], json!(["seals"]));
    assert_eq!(claims["at_hash"], json!(id_token::at_hash(access)));

    assert_eq!(harness.request_id_of(Kind::AccessToken, access), login.request_id);
    assert_eq!(
        harness.request_id_of(Kind::RefreshToken, refresh),
        login.request_id
    );
    let stored = harness.stored_login(&login.request_id).unwrap();
    assert_eq!(stored.code, CodeState::Used);
    let tokens = stored.tokens.unwrap();
    let signature = |kind, token| harness.issuer.token_key.check(kind, token).unwrap().signature;
    assert_eq!(
        (tokens.generation, tokens.access, tokens.refresh),
        (
            1,
            signature(Kind::AccessToken, access),
            signature(Kind::RefreshToken, refresh)
        )
    );
    assert_eq!(harness.usable_tokens(&login.request_id).len(), 2);

    // Without offline_access no refresh token; without openid no ID token.
    let login = harness.login_with(&["username"], |_| {}).await;
    let answer = harness.send(redeem_request(&login)).await;
    assert!(answer.granted(), "{}", answer.body);
    assert!(answer.body.get("refresh_token").is_none() && answer.body.get("id_token").is_none());
}

/// A redemption with the wrong PKCE verifier, the wrong redirect URI, another client's code or
/// an expired code is `invalid_grant`, and stores no token (an expired code's login ends).
#[tokio::test(flavor = "current_thread")]
async fn a_code_redeemed_wrongly_is_invalid_grant() {
    let harness = Harness::start().await;
    let login = harness.login().await;
    let wrong = [
        ("code_verifier", "x".repeat(43)),
        ("code_verifier", format!("{}x", login.verifier)),
        ("redirect_uri", "http://127.0.0.1:48096/callback".to_string()),
        ("redirect_uri", "http://localhost:48095/callback".to_string()),
    ];
    for (name, value) in &wrong {
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("client_id", "pinniped-cli"),
            ("code", login.code.as_str()),
        ];
        form.push((name, value));
        let other = if *name == "code_verifier" {
            ("redirect_uri", REDIRECT_URI)
        } else {
            ("code_verifier", login.verifier.as_str())
        };
        form.push(other);
        let answer = harness.send(post("/oauth2/token", &form, None)).await;
        answer.assert_error(Code::InvalidGrant);
    }
    assert!(harness.usable_tokens(&login.request_id).is_empty());

    let others = harness
        .login_with(CLI_SCOPES, |session| session.client_id = DYNAMIC_CLIENT.into())
        .await;
    harness
        .send(redeem_request(&others))
        .await
        .assert_error(Code::InvalidGrant);
    let expired = harness
        .login_with(CLI_SCOPES, |session| {
            session.token_expires_at = OffsetDateTime::now_utc().unix_timestamp() - 1;
        })
        .await;
    let answer = harness.send(redeem_request(&expired)).await;
    answer.assert_error(Code::InvalidGrant);
    assert!(
        answer.field("error_description").contains("expired"),
        "{}",
        answer.body
    );
    assert!(harness.stored_login(&expired.request_id).is_none());
    let forged = Login {
        code: TokenKey::new(&[8; 32])
            .mint(
                Kind::AuthorizationCode,
                LoginRef {
                    id: stored_login::id_of(&login.request_id).unwrap(),
                    generation: 0,
                },
            )
            .unwrap()
            .token,
        verifier: login.verifier.clone(),
        request_id: String::new(),
    };
    harness
        .send(redeem_request(&forged))
        .await
        .assert_error(Code::InvalidGrant);
    for login in [&others, &expired] {
        assert!(harness.usable_tokens(&login.request_id).is_empty());
    }
}

/// A code redeemed a second time is `invalid_grant`, and every token the first redemption gave
/// is revoked (RFC 6749 §4.1.2): their Secrets are deleted and the client can no longer use
/// them.
#[tokio::test(flavor = "current_thread")]
async fn a_code_redeemed_twice_revokes_what_it_gave() {
    let harness = Harness::start().await;
    let (login, first) = harness.logged_in().await;
    let second = harness.send(redeem_request(&login)).await;
    second.assert_error(Code::InvalidGrant);
    assert!(harness.stored_login(&login.request_id).is_none());
    assert_eq!(harness.still_usable(&first).await, (false, false));
}

/// Whatever the interleaving of two to eight concurrent redemptions of one code, at most one
/// gets tokens, the others are `invalid_grant`, and — a replay being refused — no token of the
/// login remains usable, the granted ones included. (Two redemptions find a revocation that
/// comes too early more often than eight do: with more losers, one of them tends to revoke
/// late enough.)
#[tokio::test(flavor = "current_thread")]
async fn concurrent_redemptions_of_one_code_leave_no_usable_token() {
    let harness = Harness::start().await;
    for seed in 0..210 {
        harness.memory.interleave(seed, 4);
        let login = harness.login().await;
        let mut redemptions = tokio::task::JoinSet::new();
        for _ in 0..2 + seed % 7 {
            let (endpoints, request) = (harness.endpoints.clone(), redeem_request(&login));
            redemptions.spawn(async move { Answer::of(endpoints.handle(request).await).await });
        }
        let answers = redemptions.join_all().await;
        let granted: Vec<&Answer> = answers.iter().filter(|answer| answer.granted()).collect();
        assert!(granted.len() <= 1, "seed {seed}: {} got tokens", granted.len());
        for refused in answers.iter().filter(|answer| !answer.granted()) {
            refused.assert_error(Code::InvalidGrant);
        }
        assert!(
            harness.usable_tokens(&login.request_id).is_empty(),
            "seed {seed}: a replay was refused, yet tokens survive"
        );
        if let Some(granted) = granted.first() {
            assert_eq!(harness.still_usable(granted).await, (false, false), "seed {seed}");
        }
    }
}

/// When marking the code used fails (the store unreachable), the client is told to retry
/// (`temporarily_unavailable`), no token is recorded, and the code can be redeemed again.
#[tokio::test(flavor = "current_thread")]
async fn a_code_not_marked_used_gives_no_tokens_and_stays_redeemable() {
    let harness = Harness::start().await;
    let login = harness.login().await;
    harness.memory.fail_next(Verb::Patch, 500);
    harness
        .send(redeem_request(&login))
        .await
        .assert_error(Code::TemporarilyUnavailable);
    assert!(harness.usable_tokens(&login.request_id).is_empty());
    assert!(harness.send(redeem_request(&login)).await.granted());
}

// ---------------------------------------------------------------------------------------------
// Client authentication.

/// `pinniped-cli` is public: it is accepted with `client_id` in the body, and with HTTP Basic
/// `pinniped-cli:` and no `client_id` (golang.org/x/oauth2's first try); a secret for it, in
/// the header or the body, an unknown client, or no client at all is a 401 `invalid_client`
/// asking for Basic, and does not use the code up.
#[tokio::test(flavor = "current_thread")]
async fn pinniped_cli_authenticates_as_a_public_client() {
    let harness = Harness::start().await;
    let login = harness.login().await;
    // Extra form parameters, and Basic credentials.
    type Attempt<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let refused: [Attempt<'_>; 8] = [
        (&[("client_id", "pinniped-cli")], Some("pinniped-cli:secret")),
        (&[], Some("pinniped-cli:secret")),
        (
            &[("client_id", "pinniped-cli"), ("client_secret", "secret")],
            None,
        ),
        (&[("client_secret", "secret")], Some("pinniped-cli:")),
        (&[("client_id", "someone-else")], Some("pinniped-cli:")),
        (&[("client_id", "someone-else")], None),
        (&[], Some("client.oauth.pinniped.dev-unknown:secret")),
        (&[], None),
    ];
    for (extra, credentials) in refused {
        let answer = harness
            .send(post("/oauth2/token", &code_grant(&login, extra), credentials))
            .await;
        answer.assert_error(Code::InvalidClient);
        assert_eq!(
            answer.headers[header::WWW_AUTHENTICATE],
            "Basic",
            "{extra:?} {credentials:?}"
        );
    }
    assert!(matches!(
        harness.stored(Kind::AuthorizationCode, &login.code).unwrap().code,
        CodeState::Active { .. }
    ));

    let answer = harness
        .send(post(
            "/oauth2/token",
            &code_grant(&login, &[]),
            Some("pinniped-cli:"),
        ))
        .await;
    assert!(answer.granted(), "{}", answer.body);
    // And with the ID in the body (a refresh, with the tokens just issued).
    let refreshed = harness.send(refresh_request(answer.field("refresh_token"))).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
}

// ---------------------------------------------------------------------------------------------
// The refresh token grant.

/// A refresh checks the user upstream, rotates the refresh token (a new generation of the
/// login's tokens) and so ends the access token issued with it; the new tokens work and the ID
/// token has the groups the upstream says now and no nonce. Two store requests: a read and a
/// conditional write.
#[tokio::test(flavor = "current_thread")]
async fn a_refresh_rotates_the_refresh_token_and_ends_the_old_access_token() {
    let harness = Harness::start().await;
    let (login, first) = harness.logged_in().await;
    let (old_access, old_refresh) = (first.field("access_token"), first.field("refresh_token"));
    harness.memory.take_requests();
    let refreshed = harness.send(refresh_request(old_refresh)).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    assert_eq!(
        harness.memory.take_requests(),
        Requests {
            get: 1,
            replace: 1,
            ..Requests::default()
        }
    );
    assert_eq!(harness.upstream.userinfo_requests.load(Ordering::SeqCst), 1);
    let (new_access, new_refresh) = (refreshed.field("access_token"), refreshed.field("refresh_token"));
    assert_ne!(new_refresh, old_refresh);
    assert_ne!(new_access, old_access);
    let claims = harness.id_token_claims(refreshed.field("id_token"));
    assert_eq!(
        claims["groups"],
        json!(["seals", "walruses"]),
        "as the upstream says now"
    );
    assert!(claims.get("nonce").is_none());

    let stored = harness.stored_login(&login.request_id).unwrap();
    assert_eq!(stored.tokens.unwrap().generation, 2);
    assert_eq!(harness.usable_tokens(&login.request_id).len(), 2);
    harness
        .send(exchange_request(old_access, "cluster-a"))
        .await
        .assert_error(Code::InvalidGrant);
    assert!(harness
        .send(exchange_request(new_access, "cluster-a"))
        .await
        .granted());
    assert!(harness.send(refresh_request(new_refresh)).await.granted());
}

/// A session stored in the earlier format — one Secret per token in Pinniped's layout, as Selkie
/// stored them before one Secret per login — keeps working after the upgrade: its access
/// token still exchanges, and its refresh token refreshes, carrying the login over into a Secret
/// of its own that holds the new tokens (the old access token's Secret deleted, the old
/// refresh token's kept marked rotated). Reusing the old refresh token then ends the login in
/// both formats.
#[tokio::test(flavor = "current_thread")]
async fn an_earlier_format_session_is_carried_over_at_its_first_refresh() {
    let harness = Harness::start().await;
    let now = OffsetDateTime::now_utc();
    // Selkie's request IDs before UUIDs were not UUIDs: the login gets one.
    let earlier_id = "Zm9yLWEtdGVzdA";
    let key = &harness.issuer.token_key;
    let (access, refresh) = (
        key.mint_earlier(Kind::AccessToken).unwrap(),
        key.mint_earlier(Kind::RefreshToken).unwrap(),
    );
    let mut session = harness.session(earlier_id, CLI_SCOPES, "unused");
    session.code_active = false;
    session.access_token_signature = Some(access.signature.clone());
    let store = &harness.endpoints.store;
    let mut stored_access = session.clone();
    stored_access.token_expires_at = (now + session::ACCESS_TOKEN_LIFETIME).unix_timestamp();
    store
        .create(
            Resource::AccessToken,
            &access.signature,
            &stored_access,
            session::MAX_SESSION,
            now,
        )
        .await
        .unwrap();
    session.token_expires_at = session.expires_at;
    store
        .create(
            Resource::RefreshToken,
            &refresh.signature,
            &session,
            session::MAX_SESSION,
            now,
        )
        .await
        .unwrap();
    assert!(harness
        .send(exchange_request(&access.token, "cluster-a"))
        .await
        .granted());

    let refreshed = harness.send(refresh_request(&refresh.token)).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    let new_refresh = refreshed.field("refresh_token");
    let request_id = harness.request_id_of(Kind::RefreshToken, new_refresh);
    let login = harness.stored_login(&request_id).unwrap();
    assert_eq!(login.migrated_from.as_deref(), Some(earlier_id));
    assert_eq!(
        (login.code, login.tokens.unwrap().generation),
        (CodeState::Used, 1)
    );
    assert_eq!(login.session.identity.username, "pinny");
    let earlier = |resource: Resource, signature: &str| {
        harness
            .memory
            .stored(&resource.secret_name(signature))
            .map(|secret| serde_json::from_value::<Session>(resource.read_secret(&secret).unwrap()).unwrap())
    };
    assert!(earlier(Resource::AccessToken, &access.signature).is_none());
    assert!(
        earlier(Resource::RefreshToken, &refresh.signature)
            .unwrap()
            .rotated
    );
    harness
        .send(exchange_request(&access.token, "cluster-a"))
        .await
        .assert_error(Code::InvalidGrant);
    assert!(harness
        .send(exchange_request(refreshed.field("access_token"), "cluster-a"))
        .await
        .granted());

    // The earlier refresh token again: a reuse, and the login ends in both formats.
    harness
        .send(refresh_request(&refresh.token))
        .await
        .assert_error(Code::InvalidGrant);
    assert!(harness.stored_login(&request_id).is_none());
    assert!(earlier(Resource::RefreshToken, &refresh.signature).is_none());
    assert_eq!(harness.still_usable(&refreshed).await, (false, false));
}

/// A session with terms longer than Pinniped's and an idle timeout: its refresh tokens are good
/// for the idle timeout only, each refresh starts that again, the session's end stays where the
/// login put it, and a refresh token unused for longer is `invalid_grant`.
#[tokio::test(flavor = "current_thread")]
async fn a_session_with_an_idle_timeout_ends_when_it_goes_unused_that_long() {
    let harness = Harness::start().await;
    let week = OffsetDateTime::now_utc().unix_timestamp() + 7 * 24 * 3600;
    let login = harness
        .login_with(CLI_SCOPES, |session| {
            session.expires_at = week;
            session.idle_timeout = Some(600);
        })
        .await;
    let tokens = harness.send(redeem_request(&login)).await;
    assert!(tokens.granted(), "{}", tokens.body);
    let refresh = tokens.field("refresh_token");
    let good_until = |stored: &StoredLogin| {
        let issued = stored.tokens.as_ref().unwrap().issued();
        stored.session.refresh_token_expires_at(issued)
    };
    let stored = harness.stored(Kind::RefreshToken, refresh).unwrap();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    assert!(
        (now + 598..=now + 600).contains(&good_until(&stored)),
        "{stored:?}"
    );
    assert_eq!(stored.session.expires_at, week);

    let refreshed = harness.send(refresh_request(refresh)).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    let refresh = refreshed.field("refresh_token");
    let stored = harness.stored(Kind::RefreshToken, refresh).unwrap();
    assert_eq!(
        stored.session.expires_at, week,
        "a refresh never moves the session's end"
    );
    assert!(good_until(&stored) > now + 590, "{stored:?}");

    harness.edit_login(Kind::RefreshToken, refresh, |login| {
        login.tokens.as_mut().unwrap().issued_at = OffsetDateTime::now_utc().unix_timestamp() - 601;
    });
    let idle = harness.send(refresh_request(refresh)).await;
    idle.assert_error(Code::InvalidGrant);
    assert!(idle.body.to_string().contains("idle timeout"), "{}", idle.body);
}

/// Without an idle timeout (Pinniped's terms) a refresh token is good until the session ends.
#[tokio::test(flavor = "current_thread")]
async fn without_an_idle_timeout_a_refresh_token_lasts_as_long_as_the_session() {
    let harness = Harness::start().await;
    let (_, tokens) = harness.logged_in().await;
    let stored = harness
        .stored(Kind::RefreshToken, tokens.field("refresh_token"))
        .unwrap();
    let issued = stored.tokens.as_ref().unwrap().issued();
    assert_eq!(
        stored.session.refresh_token_expires_at(issued),
        stored.session.expires_at
    );
}

/// An old refresh token presented again is `invalid_grant` and ends its whole family
/// (RFC 9700 §4.14.2): the refresh and access tokens issued from it are revoked too.
#[tokio::test(flavor = "current_thread")]
async fn a_reused_refresh_token_revokes_the_whole_family() {
    let harness = Harness::start().await;
    let (login, first) = harness.logged_in().await;
    let refreshed = harness.send(refresh_request(first.field("refresh_token"))).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    harness
        .send(refresh_request(first.field("refresh_token")))
        .await
        .assert_error(Code::InvalidGrant);
    assert!(harness.stored_login(&login.request_id).is_none());
    assert_eq!(harness.still_usable(&refreshed).await, (false, false));
}

/// Two concurrent uses of one refresh token: whatever the interleaving, at most one gets
/// tokens, the other is `invalid_grant`.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_refreshes_with_one_token_succeed_at_most_once() {
    let harness = Harness::start().await;
    for seed in 0..40 {
        let (_, tokens) = harness.logged_in().await;
        harness.memory.interleave(seed, 4);
        let answers = concurrent_refreshes(&harness, tokens.field("refresh_token"), 2).await;
        assert!(
            answers.iter().filter(|answer| answer.granted()).count() <= 1,
            "seed {seed}"
        );
        for refused in answers.iter().filter(|answer| !answer.granted()) {
            refused.assert_error(Code::InvalidGrant);
        }
    }
}

/// Two concurrent uses of one refresh token are a reuse: whatever the interleaving, the family
/// ends — no token of the login remains usable, the tokens the winner got included.
///
/// Guards against an earlier defect: with a Secret per token, a loser that saw the reuse while
/// the winner was between its rotation and storing its new tokens revoked the login before those
/// tokens existed, and they survived. With one Secret per login the rotation and the new tokens
/// are one conditional write, and ending the login deletes that Secret.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_refreshes_with_one_token_end_the_family() {
    let harness = Harness::start().await;
    for seed in 0..40 {
        let (login, tokens) = harness.logged_in().await;
        harness.memory.interleave(seed, 4);
        let answers = concurrent_refreshes(&harness, tokens.field("refresh_token"), 2).await;
        assert_eq!(
            harness.usable_tokens(&login.request_id),
            Vec::<String>::new(),
            "seed {seed}: a reuse was seen, yet tokens survive"
        );
        if let Some(granted) = answers.iter().find(|answer| answer.granted()) {
            assert_eq!(harness.still_usable(granted).await, (false, false), "seed {seed}");
        }
    }
}

/// A refresh the store fails part-way through (its read, or its conditional write) is either `invalid_grant` — log in again — or, when answered `temporarily_unavailable`, may be
/// retried with the same refresh token, as RFC 6749 §5.2 defines that error.
///
/// Guards against an earlier defect: the answer was `temporarily_unavailable` ("try again") but
/// the token had been rotated before the failure, so the retry was taken for a stolen token's
/// reuse and ended the login. Now a failed read or write rotates nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_refresh_that_says_try_again_may_be_tried_again() {
    let harness = Harness::start().await;
    for failing in [Verb::Get, Verb::Replace] {
        let (_, tokens) = harness.logged_in().await;
        harness.memory.fail_next(failing, 500);
        let answer = harness.send(refresh_request(tokens.field("refresh_token"))).await;
        if answer.error() == "temporarily_unavailable" {
            let retry = harness.send(refresh_request(tokens.field("refresh_token"))).await;
            assert!(retry.granted(), "{failing:?}: {}", retry.body);
        } else {
            answer.assert_error(Code::InvalidGrant);
        }
    }
}

/// A refresh the upstream cannot check (it fails: a 5xx, as for a timeout or a refused
/// connection) is `temporarily_unavailable`, not a refusal of the session: nothing was rotated,
/// and once the upstream answers again the same refresh token works. (Before, it was
/// `invalid_grant`, "the upstream identity provider refused the refresh".)
#[tokio::test(flavor = "current_thread")]
async fn a_refresh_the_upstream_cannot_check_is_temporarily_unavailable_and_can_be_tried_again() {
    let harness = Harness::start().await;
    let (_, tokens) = harness.logged_in().await;
    let refresh_token = tokens.field("refresh_token");
    harness.edit(Kind::RefreshToken, refresh_token, |session| {
        session.upstream.access_token = Some(UNAVAILABLE_TOKEN.into())
    });
    let answer = harness.send(refresh_request(refresh_token)).await;
    answer.assert_error(Code::TemporarilyUnavailable);
    assert!(
        answer
            .field("error_description")
            .contains("Upstream refresh failed. Reason: the upstream identity provider could not be reached"),
        "{}",
        answer.body
    );
    harness.edit(Kind::RefreshToken, refresh_token, |session| {
        session.upstream.access_token = Some(UPSTREAM_TOKEN.into())
    });
    let retried = harness.send(refresh_request(refresh_token)).await;
    assert!(retried.granted(), "{}", retried.body);
}

/// `count` refreshes with `refresh_token` at once.
async fn concurrent_refreshes(harness: &Harness, refresh_token: &str, count: usize) -> Vec<Answer> {
    let mut refreshes = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (endpoints, request) = (harness.endpoints.clone(), refresh_request(refresh_token));
        refreshes.spawn(async move { Answer::of(endpoints.handle(request).await).await });
    }
    refreshes.join_all().await
}

/// A refresh is refused (`invalid_grant`, so the CLI logs in again) when the upstream refuses
/// the user, says they are someone else now, or the identity provider of the session is gone;
/// and a refresh token of another client is `invalid_grant` too.
#[tokio::test(flavor = "current_thread")]
async fn a_refresh_the_upstream_or_the_client_does_not_allow_is_invalid_grant() {
    let harness = Harness::start().await;
    for change in [
        (|session: &mut Session| session.upstream.access_token = Some("revoked-upstream".into()))
            as fn(&mut Session),
        |session| session.upstream.idp_name = "Gone".into(),
        |session| session.client_id = DYNAMIC_CLIENT.into(),
    ] {
        let (_, tokens) = harness.logged_in().await;
        harness.edit(Kind::RefreshToken, tokens.field("refresh_token"), change);
        harness
            .send(refresh_request(tokens.field("refresh_token")))
            .await
            .assert_error(Code::InvalidGrant);
    }
    harness
        .upstream
        .set_user(json!({"sub": "upstream-sub", "username": "someone-else"}));
    let (_, tokens) = harness.logged_in().await;
    let answer = harness.send(refresh_request(tokens.field("refresh_token"))).await;
    answer.assert_error(Code::InvalidGrant);
    assert!(
        answer.field("error_description").contains("username changed"),
        "{}",
        answer.body
    );
}

// ---------------------------------------------------------------------------------------------
// Token exchange.

/// An access token with `pinniped:request-audience` is exchanged for an ID token whose `aud` is
/// the requested audience, signed with the FederationDomain's key.
#[tokio::test(flavor = "current_thread")]
async fn an_exchange_gives_an_id_token_for_the_requested_audience() {
    let harness = Harness::start().await;
    let (_, tokens) = harness.logged_in().await;
    let answer = harness
        .send(exchange_request(tokens.field("access_token"), "cluster-a"))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.field("issued_token_type"), JWT_TOKEN_TYPE);
    assert_eq!(answer.field("token_type"), "N_A");
    let claims = harness.id_token_claims(answer.field("access_token"));
    assert_eq!(claims["aud"], json!(["cluster-a"]));
    assert_eq!(claims["azp"], "pinniped-cli");
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["username"], "pinny");
    assert!(claims.get("at_hash").is_none() && claims.get("nonce").is_none());
}

/// The audience may not be a Pinniped one (anything with `.pinniped.dev`, `pinniped-cli`, a
/// dynamic client's ID): `invalid_request`; the subject token needs the `openid` and
/// `pinniped:request-audience` scopes (`access_denied`) and must not have expired
/// (`invalid_grant`); a refresh token is no subject token.
#[tokio::test(flavor = "current_thread")]
async fn an_exchange_refuses_pinniped_audiences_missing_scopes_and_expired_tokens() {
    let harness = Harness::start().await;
    let (_, tokens) = harness.logged_in().await;
    let access = tokens.field("access_token");
    for audience in [
        "cluster.pinniped.dev",
        "x.pinniped.dev.example.com",
        "pinniped-cli",
        "client.oauth.pinniped.dev-other",
        "",
    ] {
        harness
            .send(exchange_request(access, audience))
            .await
            .assert_error(Code::InvalidRequest);
    }
    harness
        .send(exchange_request(tokens.field("refresh_token"), "cluster-a"))
        .await
        .assert_error(Code::InvalidGrant);

    for scopes in [
        &["openid", "offline_access", "username"][..],
        &["pinniped:request-audience", "username"][..],
    ] {
        let login = harness.login_with(scopes, |_| {}).await;
        let tokens = harness.send(redeem_request(&login)).await;
        harness
            .send(exchange_request(tokens.field("access_token"), "cluster-a"))
            .await
            .assert_error(Code::AccessDenied);
    }

    harness.edit_login(Kind::AccessToken, access, |login| {
        login.tokens.as_mut().unwrap().issued_at = OffsetDateTime::now_utc().unix_timestamp() - 121;
    });
    harness
        .send(exchange_request(access, "cluster-a"))
        .await
        .assert_error(Code::InvalidGrant);
}

// ---------------------------------------------------------------------------------------------
// Revocation.

/// Revoking a refresh token (or an access token) ends the login: every token Secret of it is
/// deleted and its tokens are refused.
#[tokio::test(flavor = "current_thread")]
async fn revoking_a_token_ends_its_login() {
    let harness = Harness::start().await;
    for kind in ["refresh_token", "access_token"] {
        let (login, tokens) = harness.logged_in().await;
        let refreshed = harness.send(refresh_request(tokens.field("refresh_token"))).await;
        let answer = harness.send(revoke_request(refreshed.field(kind))).await;
        assert_eq!(
            (answer.status, &answer.body),
            (StatusCode::OK, &Value::Null),
            "{kind}"
        );
        assert!(harness.stored_login(&login.request_id).is_none(), "{kind}");
        assert_eq!(harness.still_usable(&refreshed).await, (false, false), "{kind}");
    }
}

/// Revocation answers 200 for a token that is unknown, malformed, another FederationDomain's
/// or not a token at all (RFC 7009 §2.2), deleting nothing; `unauthorized_client` for another
/// client's token, which it keeps; 401 without client authentication.
#[tokio::test(flavor = "current_thread")]
async fn revocation_of_unknown_or_foreign_tokens() {
    let harness = Harness::start().await;
    let (login, tokens) = harness.logged_in().await;
    let elsewhere = LoginRef {
        id: [1; 16],
        generation: 1,
    };
    let unknown = harness
        .issuer
        .token_key
        .mint(Kind::RefreshToken, elsewhere)
        .unwrap()
        .token;
    let unknown_earlier = harness
        .issuer
        .token_key
        .mint_earlier(Kind::RefreshToken)
        .unwrap()
        .token;
    let foreign = TokenKey::new(&[8; 32])
        .mint(Kind::AccessToken, elsewhere)
        .unwrap()
        .token;
    for token in [
        unknown.as_str(),
        unknown_earlier.as_str(),
        foreign.as_str(),
        "pin_rt_not.base64!",
        "pin_ac_whatever",
        "hello",
    ] {
        let answer = harness.send(revoke_request(token)).await;
        assert_eq!(answer.status, StatusCode::OK, "{token}: {}", answer.body);
    }
    assert_eq!(harness.usable_tokens(&login.request_id).len(), 2);

    harness.edit(Kind::RefreshToken, tokens.field("refresh_token"), |session| {
        session.client_id = DYNAMIC_CLIENT.into();
    });
    let answer = harness.send(revoke_request(tokens.field("refresh_token"))).await;
    assert_eq!(answer.error(), "unauthorized_client", "{}", answer.body);
    assert_eq!(harness.usable_tokens(&login.request_id).len(), 2);

    let anonymous = post("/oauth2/revoke", &[("token", tokens.field("access_token"))], None);
    harness.send(anonymous).await.assert_error(Code::InvalidClient);
    assert_eq!(harness.usable_tokens(&login.request_id).len(), 2);
}

/// What a test sees of an HTML answer: its status, `Location`, `Set-Cookie` and text.
async fn page_of(response: Response<Body>) -> (StatusCode, String, String, String) {
    let (parts, body) = response.into_parts();
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|value: &HeaderValue| value.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let text = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
    (
        parts.status,
        header(header::LOCATION),
        header(header::SET_COOKIE),
        text,
    )
}

/// A device login's start, the browser's half, and its polls.
struct DeviceRun {
    verifier: String,
    device_code: String,
    user_code: String,
}

impl Harness {
    /// The CLI's device authorization request; its answer.
    async fn start_device(&self) -> (DeviceRun, Answer) {
        let verifier = format!("device-verifier-{}", session::new_request_id().unwrap());
        let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()));
        let answer = self
            .send(post(
                "/oauth2/device_authorization",
                &[
                    ("client_id", "pinniped-cli"),
                    ("scope", &CLI_SCOPES.join(" ")),
                    ("code_challenge", &challenge),
                    ("code_challenge_method", "S256"),
                    ("nonce", "device-nonce-0123"),
                ],
                None,
            ))
            .await;
        let run = DeviceRun {
            verifier,
            device_code: answer.body["device_code"].as_str().unwrap_or_default().into(),
            user_code: answer.body["user_code"].as_str().unwrap_or_default().into(),
        };
        (run, answer)
    }

    /// One poll of `run` with `verifier`, as the CLI sends it (pacing forgotten: the tests
    /// poll back to back).
    async fn poll(&self, run: &DeviceRun, verifier: &str) -> Answer {
        self.endpoints.device_polls.forget();
        self.send(post(
            "/oauth2/token",
            &[
                ("grant_type", DEVICE_CODE_GRANT),
                ("client_id", "pinniped-cli"),
                ("device_code", &run.device_code),
                ("code_verifier", verifier),
            ],
            None,
        ))
        .await
    }

    /// The browser enters `run`'s user code at the verification page: the authorization
    /// request's URL it is sent to.
    async fn enter_user_code(&self, run: &DeviceRun) -> String {
        let link = format!("{ISSUER}/device?user_code={}", run.user_code);
        let (status, _, cookie, page) = page_of(
            self.endpoints
                .handle(Request::get(&link).body(Full::new(Bytes::new())).unwrap())
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(
            page.contains(&format!(r#"value="{}""#, run.user_code)),
            "the link's code is filled in: {page}"
        );
        let csrf = page
            .split(r#"name="csrf" value=""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .to_string();
        let cookie = cookie.split(';').next().unwrap().to_string();
        let form = |csrf: &str, code: &str| {
            let mut request = post("/device", &[("user_code", code), ("csrf", csrf)], None);
            request
                .headers_mut()
                .insert(header::COOKIE, cookie.parse().unwrap());
            request
        };
        // Typed in lower case without the dash: the same code.
        let typed = run.user_code.replace('-', "").to_lowercase();
        let (status, location, _, page) = page_of(self.endpoints.handle(form(&csrf, &typed)).await).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
        // A form posted from elsewhere (no CSRF value of this browser) is refused.
        let (status, _, _, _) = page_of(self.endpoints.handle(form("forged", &typed)).await).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        location
    }

    /// The login of the device login's authorization request `location` ends with `callback`
    /// (`code=…` of a login issued for it, or `error=…`) at the device callback.
    async fn device_callback(&self, location: &str, callback: &str) -> (StatusCode, String) {
        let state = url_param(location, "state");
        let (status, _, _, page) = page_of(
            self.endpoints
                .handle(
                    Request::get(format!("{ISSUER}/device/callback?{callback}&state={state}"))
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
                .await,
        )
        .await;
        (status, page)
    }

    /// A login the user finished for the device login's authorization request `location`: its
    /// code, issued for the device callback and the CLI's PKCE challenge and nonce.
    async fn device_login(&self, location: &str) -> Login {
        let challenge = url_param(location, "code_challenge");
        let nonce = url_param(location, "nonce");
        self.login_with(CLI_SCOPES, |session| {
            session.redirect_uri = format!("{ISSUER}{DEVICE_CALLBACK}");
            session.code_challenge = challenge;
            session.nonce = Some(nonce);
        })
        .await
    }
}

const DEVICE_CALLBACK: &str = crate::endpoints::discovery::DEVICE_CALLBACK_PATH;

/// The query parameter `name` of `url` (decoded).
fn url_param(url: &str, name: &str) -> String {
    let query = url.split_once('?').map(|(_, query)| query).unwrap_or_default();
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| panic!("no {name} in {url}"))
}

/// RFC 8628 end to end over the endpoints: the CLI gets a device code and a user code; its polls
/// are pending until the browser has entered the code (CSRF-protected) and the login's code
/// reached the device callback; a poll without the CLI's PKCE verifier gets nothing and uses
/// nothing up; the CLI's poll gets tokens once (with its nonce in the ID token); the next poll,
/// and a second callback, are refused.
#[tokio::test(flavor = "current_thread")]
async fn a_device_login_gives_tokens_once_and_only_to_the_verifier() {
    let harness = Harness::start().await;
    let discovery: Value = serde_json::from_slice(&harness.issuer.discovery).unwrap();
    assert_eq!(
        discovery["device_authorization_endpoint"],
        format!("{ISSUER}/oauth2/device_authorization")
    );
    let (run, answer) = harness.start_device().await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.field("verification_uri"), format!("{ISSUER}/device"));
    assert_eq!(
        answer.field("verification_uri_complete"),
        format!("{ISSUER}/device?user_code={}", run.user_code)
    );
    assert_eq!(
        (
            answer.body["interval"].as_i64(),
            answer.body["expires_in"].as_i64()
        ),
        (Some(5), Some(600))
    );
    assert!(run.device_code.starts_with("pin_dc_"));

    harness
        .poll(&run, &run.verifier)
        .await
        .assert_error(Code::AuthorizationPending);
    // Polled again at once: slow down (the store is not asked).
    harness.memory.take_requests();
    let too_soon = harness
        .send(post(
            "/oauth2/token",
            &[
                ("grant_type", DEVICE_CODE_GRANT),
                ("client_id", "pinniped-cli"),
                ("device_code", &run.device_code),
                ("code_verifier", &run.verifier),
            ],
            None,
        ))
        .await;
    too_soon.assert_error(Code::SlowDown);
    assert_eq!(harness.memory.take_requests().total(), 0);

    let location = harness.enter_user_code(&run).await;
    assert!(
        location.starts_with(&format!("{ISSUER}/oauth2/authorize?")),
        "{location}"
    );
    assert_eq!(
        url_param(&location, "redirect_uri"),
        format!("{ISSUER}{DEVICE_CALLBACK}")
    );
    assert_eq!(url_param(&location, "client_id"), "pinniped-cli");
    harness
        .poll(&run, &run.verifier)
        .await
        .assert_error(Code::AuthorizationPending);

    let login = harness.device_login(&location).await;
    let (status, page) = harness
        .device_callback(&location, &format!("code={}", login.code))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("You are logged in"), "{page}");
    let (status, _) = harness
        .device_callback(&location, &format!("code={}", login.code))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a device login is finished once");

    let other_verifier = format!("{}x", run.verifier);
    let stolen = harness.poll(&run, &other_verifier).await;
    stolen.assert_error(Code::InvalidGrant);
    assert!(stolen.body["error_description"]
        .as_str()
        .unwrap()
        .contains("PKCE"));

    let tokens = harness.poll(&run, &run.verifier).await;
    assert!(tokens.granted(), "{}", tokens.body);
    let claims = harness.id_token_claims(tokens.field("id_token"));
    assert_eq!(claims["nonce"], "device-nonce-0123");
    assert_eq!(claims["username"], "pinny");
    let again = harness.poll(&run, &run.verifier).await;
    again.assert_error(Code::InvalidGrant);
    assert!(again.body["error_description"]
        .as_str()
        .unwrap()
        .contains("already been used"));
}

/// What ends a device login without tokens: the login failing in the browser (`access_denied`
/// at the next poll), an expired device code (`expired_token`, and its user code no longer
/// accepted), a device code not of this FederationDomain, another client's poll, and a device
/// authorization request the authorization request would refuse (answered at once).
#[tokio::test(flavor = "current_thread")]
async fn a_device_login_ends_with_the_error_the_cli_can_act_on() {
    let harness = Harness::start().await;

    let (denied, _) = harness.start_device().await;
    let location = harness.enter_user_code(&denied).await;
    let (status, page) = harness
        .device_callback(&location, "error=access_denied&error_description=policy+says+no")
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Error: access_denied"), "{page}");
    assert!(
        !page.contains("policy says no"),
        "a redirect's own text is not shown: {page}"
    );
    harness
        .poll(&denied, &denied.verifier)
        .await
        .assert_error(Code::AccessDenied);

    let (expired, _) = harness.start_device().await;
    let id = session::device::id_of(&expired.user_code);
    assert!(harness.memory.edit(&session::device::secret_name(&id), |secret| {
        let data = secret.data.as_mut().unwrap();
        let stored = data.get_mut(session::storage::DATA_KEY).unwrap();
        let mut request: Value = serde_json::from_slice(&stored.0).unwrap();
        request["expires_at"] = json!(OffsetDateTime::now_utc().unix_timestamp() - 1);
        stored.0 = request.to_string().into_bytes();
    }));
    harness
        .poll(&expired, &expired.verifier)
        .await
        .assert_error(Code::ExpiredToken);
    let link = format!("{ISSUER}/device?user_code={}", expired.user_code);
    let (_, _, cookie, page) = page_of(
        harness
            .endpoints
            .handle(Request::get(&link).body(Full::new(Bytes::new())).unwrap())
            .await,
    )
    .await;
    let csrf = page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap();
    let mut form = post(
        "/device",
        &[("user_code", &expired.user_code), ("csrf", csrf)],
        None,
    );
    form.headers_mut()
        .insert(header::COOKIE, cookie.split(';').next().unwrap().parse().unwrap());
    let (status, _, _, page) = page_of(harness.endpoints.handle(form).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("unknown, used already or expired"), "{page}");

    let (run, _) = harness.start_device().await;
    let forged = DeviceRun {
        device_code: run.device_code.replace("pin_dc_", "pin_ac_"),
        ..run
    };
    harness
        .poll(&forged, &forged.verifier)
        .await
        .assert_error(Code::InvalidGrant);

    let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(
        b"verifier-of-a-plain-challenge-0123456789abc",
    ));
    for (form, code) in [
        (
            vec![
                ("client_id", "pinniped-cli"),
                ("scope", "openid"),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "plain"),
            ],
            Code::InvalidRequest,
        ),
        (
            vec![("client_id", "pinniped-cli"), ("scope", "openid")],
            Code::InvalidRequest,
        ),
        (
            vec![
                ("client_id", "pinniped-cli"),
                ("scope", "openid admin"),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "S256"),
            ],
            Code::InvalidScope,
        ),
        (
            vec![
                ("client_id", "pinniped-cli"),
                ("scope", "openid"),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "S256"),
                ("pinniped_idp_name", "Nope"),
            ],
            Code::InvalidRequest,
        ),
        (
            vec![("client_id", DYNAMIC_CLIENT), ("scope", "openid")],
            Code::InvalidClient,
        ),
    ] {
        harness
            .send(post("/oauth2/device_authorization", &form, None))
            .await
            .assert_error(code);
    }
}

// ---------------------------------------------------------------------------------------------
// DPoP (RFC 9449): sessions bound to a key the client holds.

/// The token endpoint's URL, which proofs name.
const TOKEN_URL: &str = "https://sso.example.com/fd/oauth2/token";
/// The secret of the OIDCClient of [`dpop_clients`].
const CLIENT_SECRET: &str = "the-client-secret";

fn now_unix() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

/// A client's DPoP key.
struct DpopKey(SigningKey);

impl DpopKey {
    fn new() -> Self {
        Self(SigningKey::generate("dpop").unwrap())
    }

    /// A fresh proof for the token endpoint, with `nonce`.
    fn proof(&self, nonce: Option<&str>) -> String {
        selkie_oidc::dpop::proof(&self.0, "POST", TOKEN_URL, nonce, now_unix()).unwrap()
    }

    /// The key's thumbprint, which a session is bound to.
    fn jkt(&self) -> String {
        selkie_oidc::dpop::thumbprint(&self.0.public_jwk()).unwrap()
    }
}

/// `request` with one more `DPoP` header, `proof`.
fn proven(mut request: Request<Full<Bytes>>, proof: &str) -> Request<Full<Bytes>> {
    request
        .headers_mut()
        .append(selkie_oidc::dpop::HEADER, proof.parse().unwrap());
    request
}

/// The `DPoP-Nonce` of `answer`.
#[track_caller]
fn nonce_of(answer: &Answer) -> String {
    answer.headers[selkie_oidc::dpop::NONCE_HEADER]
        .to_str()
        .unwrap()
        .to_string()
}

/// The OIDCClient [`DYNAMIC_CLIENT`] with [`CLIENT_SECRET`], allowed every grant but the device
/// code's and [`REDIRECT_URI`].
fn dpop_clients() -> Clients {
    let hash = bcrypt::hash(CLIENT_SECRET, crate::clients::BCRYPT_COST).unwrap();
    let spec: selkie_api::supervisor_config::OIDCClientSpec = serde_json::from_value(json!({
        "allowedRedirectURIs": [REDIRECT_URI],
        "allowedGrantTypes": ["authorization_code", "refresh_token", TOKEN_EXCHANGE],
        "allowedScopes": ["openid", "offline_access", "pinniped:request-audience", "username", "groups"],
    }))
    .unwrap();
    let storage = crate::clients::storage_secret(
        DYNAMIC_CLIENT,
        "client-uid",
        "config.supervisor.pinniped.dev/v1alpha1",
        &[hash],
    );
    let (checks, client) = crate::clients::checked(DYNAMIC_CLIENT, &spec, Some(&storage));
    Clients::of([client.unwrap_or_else(|| panic!("{checks:?}"))])
}

impl Harness {
    /// A FederationDomain with DPoP on.
    async fn start_dpop() -> Self {
        Self::start_with(true, Clients::default()).await
    }

    /// The nonce the FederationDomain hands out now.
    fn dpop_nonce(&self) -> String {
        dpop::nonce(&self.issuer, now_unix())
    }

    /// `request` with a fresh proof by `key` carrying the current nonce.
    async fn send_proven(&self, request: Request<Full<Bytes>>, key: &DpopKey) -> Answer {
        self.send(proven(request, &key.proof(Some(&self.dpop_nonce()))))
            .await
    }

    /// A login of the CLI redeemed with a proof by `key`: its tokens, bound to it.
    async fn logged_in_bound(&self, key: &DpopKey) -> (Login, Answer) {
        let login = self.login().await;
        let tokens = self.send_proven(redeem_request(&login), key).await;
        assert!(tokens.granted(), "{}", tokens.body);
        assert_eq!(tokens.field("token_type"), "DPoP");
        (login, tokens)
    }
}

/// With DPoP on, the discovery document says so; the CLI's first redemption (its proof has no
/// nonce yet) is told to use the one of the answer's `DPoP-Nonce` and uses nothing up; with it,
/// the login is bound to the proof's key: `token_type` `DPoP`, the key's thumbprint stored with
/// the login, and a nonce for the next request.
#[tokio::test(flavor = "current_thread")]
async fn a_dpop_login_learns_the_nonce_and_is_bound_to_the_proofs_key() {
    let harness = Harness::start_dpop().await;
    let discovery: Value = serde_json::from_slice(&harness.issuer.discovery).unwrap();
    assert_eq!(discovery["dpop_signing_alg_values_supported"], json!(["ES256"]));
    let key = DpopKey::new();
    let login = harness.login().await;

    let first = harness
        .send(proven(redeem_request(&login), &key.proof(None)))
        .await;
    first.assert_error(Code::UseDpopNonce);
    assert_eq!(first.headers[header::CACHE_CONTROL], "no-store");
    let nonce = nonce_of(&first);
    assert!(
        matches!(
            harness.stored_login(&login.request_id).unwrap().code,
            CodeState::Active { .. }
        ),
        "the code is not used up"
    );

    let answer = harness
        .send(proven(redeem_request(&login), &key.proof(Some(&nonce))))
        .await;
    assert!(answer.granted(), "{}", answer.body);
    assert_eq!(answer.field("token_type"), "DPoP");
    assert_eq!(answer.headers[header::CACHE_CONTROL], "no-store");
    assert!(!nonce_of(&answer).is_empty());
    let stored = harness.stored_login(&login.request_id).unwrap();
    assert_eq!(stored.dpop_jkt, Some(key.jkt()));
    assert_eq!(stored.code, CodeState::Used);
}

/// A bound session refreshes with its key only, and stays bound. A refresh without a proof, or
/// with another key's, is refused before anything changes: the refresh token is not rotated, no
/// reuse is detected, and the owner refreshes afterwards. A rotated refresh token presented
/// without the key ends nothing either (only its key's holder can set off reuse detection).
#[tokio::test(flavor = "current_thread")]
async fn a_bound_session_refreshes_only_with_its_key_and_a_refusal_changes_nothing() {
    let harness = Harness::start_dpop().await;
    let key = DpopKey::new();
    let (login, tokens) = harness.logged_in_bound(&key).await;
    let refresh = tokens.field("refresh_token");
    let before = harness.usable_tokens(&login.request_id);

    let without = harness.send(refresh_request(refresh)).await;
    without.assert_error(Code::InvalidDpopProof);
    assert!(
        without
            .field("error_description")
            .contains("bound to a DPoP key; the request has no proof"),
        "{}",
        without.body
    );
    assert!(!nonce_of(&without).is_empty());
    let thief = harness
        .send_proven(refresh_request(refresh), &DpopKey::new())
        .await;
    thief.assert_error(Code::InvalidGrant);
    assert!(
        thief.field("error_description").contains("bound to another key"),
        "{}",
        thief.body
    );
    assert_eq!(
        harness.usable_tokens(&login.request_id),
        before,
        "nothing rotated, nothing revoked"
    );

    let refreshed = harness.send_proven(refresh_request(refresh), &key).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    assert_eq!(refreshed.field("token_type"), "DPoP");
    assert_eq!(
        harness.stored_login(&login.request_id).unwrap().dpop_jkt,
        Some(key.jkt())
    );

    // The rotated token without the key: refused, and the login goes on.
    harness
        .send(refresh_request(refresh))
        .await
        .assert_error(Code::InvalidDpopProof);
    let again = harness
        .send_proven(refresh_request(refreshed.field("refresh_token")), &key)
        .await;
    assert!(again.granted(), "{}", again.body);
    assert_eq!(again.field("token_type"), "DPoP");
}

/// A proof is good for one request: presented again (on this replica, within its window) it is
/// refused, and the owner goes on with a fresh one.
#[tokio::test(flavor = "current_thread")]
async fn a_replayed_proof_is_refused() {
    let harness = Harness::start_dpop().await;
    let key = DpopKey::new();
    let (_, tokens) = harness.logged_in_bound(&key).await;
    let proof = key.proof(Some(&harness.dpop_nonce()));
    let first = harness
        .send(proven(refresh_request(tokens.field("refresh_token")), &proof))
        .await;
    assert!(first.granted(), "{}", first.body);
    let refresh = first.field("refresh_token");
    let replayed = harness.send(proven(refresh_request(refresh), &proof)).await;
    replayed.assert_error(Code::InvalidDpopProof);
    assert!(
        replayed.field("error_description").contains("replayed"),
        "{}",
        replayed.body
    );
    assert!(harness
        .send_proven(refresh_request(refresh), &key)
        .await
        .granted());
}

/// A proof names the method and URL it is for: one for another method, another endpoint or
/// another FederationDomain is refused, so are two proofs in one request — and the code they
/// came with is not used up.
#[tokio::test(flavor = "current_thread")]
async fn a_proof_for_another_url_or_method_is_refused() {
    let harness = Harness::start_dpop().await;
    let key = DpopKey::new();
    let login = harness.login().await;
    let nonce = harness.dpop_nonce();
    for (method, url, why) in [
        ("GET", TOKEN_URL, "another HTTP method"),
        ("POST", "https://sso.example.com/fd/oauth2/revoke", "another URL"),
        (
            "POST",
            "https://sso.example.com/other/oauth2/token",
            "another URL",
        ),
    ] {
        let proof = selkie_oidc::dpop::proof(&key.0, method, url, Some(&nonce), now_unix()).unwrap();
        let answer = harness.send(proven(redeem_request(&login), &proof)).await;
        answer.assert_error(Code::InvalidDpopProof);
        assert!(
            answer.field("error_description").contains(why),
            "{method} {url}: {}",
            answer.body
        );
    }
    let twice = proven(
        proven(redeem_request(&login), &key.proof(Some(&nonce))),
        &key.proof(Some(&nonce)),
    );
    let answer = harness.send(twice).await;
    answer.assert_error(Code::InvalidDpopProof);
    assert!(answer.field("error_description").contains("more than one"));
    assert!(harness.send_proven(redeem_request(&login), &key).await.granted());
}

/// A proof whose nonce is over (older than two periods) is told to use a fresh one.
#[tokio::test(flavor = "current_thread")]
async fn an_expired_nonce_is_refused_with_a_fresh_one() {
    let harness = Harness::start_dpop().await;
    let key = DpopKey::new();
    let login = harness.login().await;
    let stale = dpop::nonce(&harness.issuer, now_unix() - 2 * dpop::NONCE_PERIOD);
    let answer = harness
        .send(proven(redeem_request(&login), &key.proof(Some(&stale))))
        .await;
    answer.assert_error(Code::UseDpopNonce);
    let fresh = nonce_of(&answer);
    assert_ne!(fresh, stale);
    let answer = harness
        .send(proven(redeem_request(&login), &key.proof(Some(&fresh))))
        .await;
    assert!(answer.granted(), "{}", answer.body);
}

/// With DPoP on, the pinniped CLI (which sends no proof) cannot log in, by either grant, and is
/// told why; the refusals are counted. A CLI session that is not bound (begun before DPoP was
/// turned on) must log in again.
#[tokio::test(flavor = "current_thread")]
async fn with_dpop_on_a_login_without_a_proof_is_refused_and_unbound_cli_sessions_log_in_again() {
    let harness = Harness::start_dpop().await;
    let login = harness.login().await;
    let answer = harness.send(redeem_request(&login)).await;
    answer.assert_error(Code::InvalidDpopProof);
    let description = answer.field("error_description");
    for part in [
        "binds sessions to a key the client holds (DPoP, RFC 9449)",
        "the request has no DPoP proof",
        "The selkie CLI sends one; the pinniped CLI cannot",
    ] {
        assert!(description.contains(part), "{description}");
    }
    assert!(!nonce_of(&answer).is_empty());
    let (run, started) = harness.start_device().await;
    assert_eq!(started.status, StatusCode::OK, "{}", started.body);
    harness
        .poll(&run, &run.verifier)
        .await
        .assert_error(Code::InvalidDpopProof);
    let metrics = harness.endpoints.metrics.encode();
    for line in [
        "selkie_supervisor_token_grants_total{grant_type=\"authorization_code\",result=\"invalid_dpop_proof\"} 1",
        "selkie_supervisor_token_grants_total{grant_type=\"device_code\",result=\"invalid_dpop_proof\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }

    let key = DpopKey::new();
    let (_, tokens) = harness.logged_in_bound(&key).await;
    harness.edit_login(Kind::RefreshToken, tokens.field("refresh_token"), |login| {
        login.dpop_jkt = None;
    });
    for request in [
        refresh_request(tokens.field("refresh_token")),
        exchange_request(tokens.field("access_token"), "cluster-a"),
    ] {
        let answer = harness.send_proven(request, &key).await;
        answer.assert_error(Code::InvalidGrant);
        assert!(
            answer.field("error_description").contains("log in again"),
            "{}",
            answer.body
        );
    }
}

/// The access token of a bound session is exchanged for a cluster's token only with a proof
/// by its key; the exchanged token's answer keeps Pinniped's shape.
#[tokio::test(flavor = "current_thread")]
async fn exchanging_a_bound_sessions_token_needs_its_proof() {
    let harness = Harness::start_dpop().await;
    let key = DpopKey::new();
    let (_, tokens) = harness.logged_in_bound(&key).await;
    let access = tokens.field("access_token");
    harness
        .send(exchange_request(access, "cluster-a"))
        .await
        .assert_error(Code::InvalidDpopProof);
    harness
        .send_proven(exchange_request(access, "cluster-a"), &DpopKey::new())
        .await
        .assert_error(Code::InvalidGrant);
    let exchanged = harness
        .send_proven(exchange_request(access, "cluster-a"), &key)
        .await;
    assert!(exchanged.granted(), "{}", exchanged.body);
    assert_eq!(exchanged.field("token_type"), "N_A");
    assert_eq!(exchanged.field("issued_token_type"), JWT_TOKEN_TYPE);
    let claims = harness.id_token_claims(exchanged.field("access_token"));
    assert_eq!(claims["aud"], json!(["cluster-a"]));
}

/// With DPoP off, `DPoP` headers mean nothing (Pinniped's behaviour): garbage, even twice, is
/// ignored, tokens are `bearer`, no nonce is handed out, the discovery document is Pinniped's.
/// A session bound while DPoP was on stays bound: its refresh still needs a proof by its key,
/// with a nonce.
#[tokio::test(flavor = "current_thread")]
async fn without_dpop_the_header_is_ignored_but_a_bound_session_keeps_its_key() {
    let harness = Harness::start().await;
    let discovery: Value = serde_json::from_slice(&harness.issuer.discovery).unwrap();
    assert!(discovery.get("dpop_signing_alg_values_supported").is_none());
    let login = harness.login().await;
    let answer = harness
        .send(proven(proven(redeem_request(&login), "not-a-proof"), "another"))
        .await;
    assert!(answer.granted(), "{}", answer.body);
    assert_eq!(answer.field("token_type"), "bearer");
    assert!(!answer.headers.contains_key(selkie_oidc::dpop::NONCE_HEADER));
    assert_eq!(harness.stored_login(&login.request_id).unwrap().dpop_jkt, None);
    let refreshed = harness
        .send(proven(
            refresh_request(answer.field("refresh_token")),
            "not-a-proof",
        ))
        .await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    assert_eq!(refreshed.field("token_type"), "bearer");
    assert!(!refreshed.headers.contains_key(selkie_oidc::dpop::NONCE_HEADER));

    let key = DpopKey::new();
    let refresh = refreshed.field("refresh_token");
    harness.edit_login(Kind::RefreshToken, refresh, |login| {
        login.dpop_jkt = Some(key.jkt());
    });
    harness
        .send(refresh_request(refresh))
        .await
        .assert_error(Code::InvalidDpopProof);
    let first = harness
        .send(proven(refresh_request(refresh), &key.proof(None)))
        .await;
    first.assert_error(Code::UseDpopNonce);
    let bound = harness
        .send(proven(
            refresh_request(refresh),
            &key.proof(Some(&nonce_of(&first))),
        ))
        .await;
    assert!(bound.granted(), "{}", bound.body);
    assert_eq!(bound.field("token_type"), "DPoP");
}

/// An OIDCClient (confidential) may send a proof: without one its login is not bound (`bearer`,
/// refreshes need none); with one it is, as the CLI's.
#[tokio::test(flavor = "current_thread")]
async fn an_oidc_clients_login_is_bound_only_when_it_sends_a_proof() {
    let harness = Harness::start_with(true, dpop_clients()).await;
    let credentials = format!("{DYNAMIC_CLIENT}:{CLIENT_SECRET}");
    let scopes = ["openid", "offline_access", "username", "groups"];
    let as_client = |session: &mut Session| session.client_id = DYNAMIC_CLIENT.into();
    let refresh = |token: &str| {
        post(
            "/oauth2/token",
            &[("grant_type", "refresh_token"), ("refresh_token", token)],
            Some(&credentials),
        )
    };

    let login = harness.login_with(&scopes, as_client).await;
    let answer = harness
        .send(post(
            "/oauth2/token",
            &code_grant(&login, &[]),
            Some(&credentials),
        ))
        .await;
    assert!(answer.granted(), "{}", answer.body);
    assert_eq!(answer.field("token_type"), "bearer");
    assert!(!nonce_of(&answer).is_empty(), "a nonce, for a later proof");
    let refreshed = harness.send(refresh(answer.field("refresh_token"))).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    assert_eq!(refreshed.field("token_type"), "bearer");

    let key = DpopKey::new();
    let login = harness.login_with(&scopes, as_client).await;
    let answer = harness
        .send_proven(
            post("/oauth2/token", &code_grant(&login, &[]), Some(&credentials)),
            &key,
        )
        .await;
    assert!(answer.granted(), "{}", answer.body);
    assert_eq!(answer.field("token_type"), "DPoP");
    let token = answer.field("refresh_token");
    harness
        .send(refresh(token))
        .await
        .assert_error(Code::InvalidDpopProof);
    let refreshed = harness.send_proven(refresh(token), &key).await;
    assert!(refreshed.granted(), "{}", refreshed.body);
    assert_eq!(refreshed.field("token_type"), "DPoP");
}
