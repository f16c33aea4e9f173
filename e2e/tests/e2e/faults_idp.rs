//! Reliability rows of the identity providers (`perf/results/reliability.md`, issue 27's "IdP
//! outage"): Dex black-holed — its process stopped with SIGSTOP, so the kernel still accepts
//! connections and buffers requests but nothing answers, and Dex keeps its state and keys — and
//! Dex down (stopped, then started again with new signing keys), under the Concierge and under
//! the Supervisor; an LDAP directory (slapd) and an Active Directory domain controller (Samba)
//! black-holed under the Supervisor; and a WebhookAuthenticator's webhook black-holed.
//!
//! * The Concierge (installed from `conf/`, control plane included, on a private cluster) with a
//!   JWTAuthenticator trusting Dex; the load: ConfigMap lists through the impersonation proxy with
//!   a Dex ID token as bearer, one after another, plus tokens the proxy has never seen presented
//!   for the first time during each fault (verified with the cached keys, not a cached review).
//!   What must hold: none of them fails, none hangs; a token naming a key nobody has is refused
//!   with a 401 `metav1.Status` within the authenticator's bound on a key fetch (never hanging on
//!   the black hole), the log naming the reason; once Dex is back with new keys a token of theirs
//!   works with nothing restarted, and a token of the old key is refused (one whose review is
//!   cached, once that expires).
//! * The Supervisor with Dex as its OIDCIdentityProvider: password logins (the pinniped CLI's
//!   `cli_password` flow) and refreshes of sessions made before, during the black hole, several at
//!   once. What must hold: each ends within the Supervisor's bound on an upstream request (logins
//!   do not queue behind one another), either with tokens or with an OAuth error naming the
//!   upstream (`temporarily_unavailable`, as for an unreachable LDAP directory: try again later);
//!   after SIGCONT logins and refreshes work again with nothing restarted. (A session whose
//!   refresh the Supervisor gave up on is printed, not asserted: Dex answers the buffered request
//!   after SIGCONT and rotates its refresh token, so that session's next refresh is refused.)
//! * A WebhookAuthenticator (the Concierge's TokenReview filter, on kube-apiserver's TokenReview
//!   behind a relay that can be paused): cached reviews keep serving while it is black-holed,
//!   uncached tokens are refused within the webhook's timeout, and after it is back they work.
//!
//! Every loop is bounded in count and time; the figures are printed for the results page.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{ensure, Context as _};
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use nix::{
    sys::signal::{self, Signal},
    unistd::Pid,
};
use selkie_e2e::{
    concierge::InstalledConcierge,
    dex::{Dex, DexUser, CLIENT_ID},
    ldap::{LdapUser, Slapd},
    pinniped_cli,
    samba::{AdUser, SambaDc},
    supervisor::Supervisor,
    Cluster,
};
use selkie_filters::{
    outcome::{Outcome, RejectReason},
    tokenreview::{ClientAuth, TokenReviewAuthenticator, TokenReviewConfig},
};
use selkie_oidc::https::HttpsClient;
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
    time::Instant,
};

use crate::{
    proxy_kubectl::{client_trusting, grant_configmaps, ProxyClient},
    supervisor_oauth::{IDP_NAME, PASSWORD},
    token_review::service_account_token,
};

/// A client's deadline for one request: an answer later than this hung.
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// How long Dex (or the webhook) stays black-holed.
const BLACK_HOLE: Duration = Duration::from_secs(20);
/// How long Dex stays down before it is started again (with new keys).
const DOWN: Duration = Duration::from_secs(6);
/// The longest a refusal may take while an identity provider is black-holed: the bound on one
/// request to it — the Concierge's key fetch (`JwtConfig::timeout`) and webhook review
/// (`TokenReviewConfig::timeout`), the Supervisor's upstream requests — 10 s, and 3 s for the rest.
const PROMPT: Duration = Duration::from_secs(13);
/// The most requests one load loop sends.
const MAX_REQUESTS: usize = 20_000;

fn rss_kib(pid: u32) -> u64 {
    selkie_perf::procstat::rss_kib(pid).unwrap_or(0)
}

/// A process stopped with SIGSTOP: black-holed. Continued (SIGCONT) by [`Stopped::resume`] or,
/// so that a failing test never leaves it stopped, when dropped.
struct Stopped(Option<Pid>);

impl Stopped {
    /// Stops `pid` and waits (up to 5 s) until the kernel reports it stopped.
    async fn stop(pid: u32) -> anyhow::Result<Self> {
        let pid = Pid::from_raw(i32::try_from(pid)?);
        signal::kill(pid, Signal::SIGSTOP)?;
        let stopped = Self(Some(pid));
        selkie_e2e::eventually(Duration::from_secs(5), || async {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
            // `pid (comm) state ...`: the state follows the last `)`.
            let state = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next());
            ensure!(state == Some(Some('T')), "process {pid} is not stopped: {stat}");
            Ok(())
        })
        .await?;
        Ok(stopped)
    }

    /// Continues the process.
    fn resume(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.0.take() {
            signal::kill(pid, Signal::SIGCONT)?;
        }
        Ok(())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = signal::kill(pid, Signal::SIGCONT);
        }
    }
}

// -------------------------------------------------------------------------------------------------
// The Concierge.

/// One request through the proxy: when it started, how long it took, the HTTP status (`None`: no
/// answer within [`REQUEST_DEADLINE`], or no HTTP answer at all) and the body or the error.
struct Answer {
    at: Instant,
    took: Duration,
    status: Option<u16>,
    body: String,
}

impl Answer {
    fn ok(&self) -> bool {
        self.status == Some(200)
    }

    /// A 401 `metav1.Status` "Unauthorized", as kube-apiserver refuses a credential.
    fn unauthorized(&self) -> bool {
        let status: Value = serde_json::from_str(&self.body).unwrap_or_default();
        self.status == Some(401)
            && status["kind"] == "Status"
            && status["code"] == 401
            && status["reason"] == "Unauthorized"
    }

    fn describe(&self) -> String {
        format!(
            "{:?} after {:?}: {}",
            self.status,
            self.took,
            self.body.chars().take(200).collect::<String>()
        )
    }
}

/// GETs `url` through the proxy with `token` as bearer.
async fn get(client: &ProxyClient, url: &str, token: &str) -> Answer {
    let at = Instant::now();
    let exchange = async {
        let request = http::Request::get(url)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))?;
        let response = client.request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    let (status, body) = match tokio::time::timeout(REQUEST_DEADLINE, exchange).await {
        Ok(Ok((status, body))) => (Some(status), body),
        Ok(Err(error)) => (None, format!("{error:#}")),
        Err(_) => (None, format!("no answer within {REQUEST_DEADLINE:?}: hung")),
    };
    Answer {
        at,
        took: at.elapsed(),
        status,
        body,
    }
}

/// `token` with its header's `kid` replaced by `kid`, a key nobody has (its signature is then no
/// one's either).
fn with_kid(token: &str, kid: &str) -> anyhow::Result<String> {
    let (header, rest) = token.split_once('.').context("not a JWS")?;
    let mut header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header)?)?;
    header["kid"] = kid.into();
    Ok(format!(
        "{}.{rest}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?)
    ))
}

/// `count` requests at once, each with `token` naming another unknown key (`unknown-<label>-<n>`).
async fn unknown_kid_requests(
    client: &ProxyClient,
    url: &str,
    token: &str,
    label: &str,
    count: usize,
) -> anyhow::Result<Vec<Answer>> {
    let forged = (0..count)
        .map(|n| with_kid(token, &format!("unknown-{label}-{n}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(futures::future::join_all(forged.iter().map(|token| get(client, url, token))).await)
}

/// A fresh ID token of `user` from `dex`.
async fn id_token(dex: &Dex, user: &DexUser) -> anyhow::Result<String> {
    Ok(dex.password_grant(&user.email, &user.password).await?.id_token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_idp_dex_black_holed_then_down_the_concierge_serves_from_cached_keys_and_refuses_unknown_keys_promptly(
) -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = Cluster::start().await?;
    let concierge = InstalledConcierge::install(&cluster).await?;
    let (_, proxy_ca) = concierge.expose_proxy(&cluster).await?;
    let user = DexUser {
        email: "faults-idp@example.com".into(),
        password: "faults-password".into(),
        user_id: "0a8b2c1d-0000-4000-8000-0000000000f1".into(),
        groups: vec!["faults".into()],
    };
    let mut dex = Dex::start(std::slice::from_ref(&user)).await?;
    concierge
        .apply_jwt_authenticator(&cluster, "dex", dex.issuer(), CLIENT_ID, &dex.ca_pem())
        .await?;
    let admin = cluster.client().await?;
    let namespace = cluster.create_namespace(&admin, "faults-idp").await?;
    grant_configmaps(&cluster, &namespace, "User", &user.email).await?;
    let client = client_trusting(&proxy_ca, None, false)?;
    let url = format!(
        "{}/api/v1/namespaces/{namespace}/configmaps",
        concierge.process().url()
    );
    let pid = concierge.process().pid();

    // The load's token, and tokens of the same key the proxy sees for the first time during the
    // faults (the last one only after Dex has new keys).
    let load_token = id_token(&dex, &user).await?;
    let mut unseen = Vec::new();
    for _ in 0..4 {
        unseen.push(id_token(&dex, &user).await?);
    }
    let ready = selkie_e2e::eventually(Duration::from_secs(30), || async {
        let answer = get(&client, &url, &load_token).await;
        ensure!(answer.ok(), "{}", answer.describe());
        Ok(())
    })
    .await;
    ready.map_err(|e| crate::with_log(e, concierge.process().log()))?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, client, url, token) = (stop.clone(), client.clone(), url.clone(), load_token.clone());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) && answers.len() < MAX_REQUESTS {
                answers.push(get(&client, &url, &token).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_before = rss_kib(pid);

    // Black-holed.
    let stopped = Stopped::stop(dex.pid().context("Dex is not running")?).await?;
    let black_holed_at = Instant::now();
    let first_use_black_holed = get(&client, &url, &unseen[0]).await;
    let unknown_black_holed = unknown_kid_requests(&client, &url, &load_token, "black-holed", 3).await?;
    // Another unknown key a few seconds after that fetch failed: refused at once (at most one
    // fetch per `jwks_min_refresh_interval`, 10 s).
    tokio::time::sleep_until(black_holed_at + Duration::from_secs(14)).await;
    let unknown_black_holed_again = unknown_kid_requests(&client, &url, &load_token, "again", 1).await?;
    let rss_black_holed = rss_kib(pid);
    tokio::time::sleep_until(black_holed_at + BLACK_HOLE).await;
    stopped.resume()?;
    let first_use_continued = get(&client, &url, &unseen[1]).await;
    let unknown_continued = unknown_kid_requests(&client, &url, &load_token, "continued", 1).await?;

    // Down.
    tokio::time::sleep(Duration::from_secs(2)).await;
    dex.stop().await;
    let down_at = Instant::now();
    let first_use_down = get(&client, &url, &unseen[2]).await;
    let unknown_down = unknown_kid_requests(&client, &url, &load_token, "down", 3).await?;
    let rss_down = rss_kib(pid);
    tokio::time::sleep_until(down_at + DOWN).await;
    // The load's token is of the old key: the load ends as Dex comes back with new ones.
    stop.store(true, Ordering::Relaxed);
    let samples = load.await?;
    dex.restart().await?;
    let back_at = Instant::now();

    // A token of the new key works, nothing restarted.
    let new_token = id_token(&dex, &user).await?;
    let mut before_recovery = Vec::new();
    let recovered = loop {
        let answer = get(&client, &url, &new_token).await;
        if answer.ok() {
            break Some(back_at.elapsed());
        }
        before_recovery.push(answer);
        if back_at.elapsed() > Duration::from_secs(60) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // A token of the old key the proxy never saw is refused. (The load's token is too once its
    // cached review expires, at most `CacheConfig::positive_ttl`, 60 s, after its first check:
    // not waited for here.)
    let old_key_unseen = get(&client, &url, &unseen[3]).await;
    let rss_after = rss_kib(pid);

    let failed: Vec<String> = samples
        .iter()
        .filter(|answer| !answer.ok())
        .map(Answer::describe)
        .collect();
    let slowest = samples.iter().map(|answer| answer.took).max().unwrap_or_default();
    let during_black_hole = samples
        .iter()
        .filter(|answer| answer.at >= black_holed_at && answer.at < black_holed_at + BLACK_HOLE)
        .count();
    let during_down = samples.iter().filter(|answer| answer.at >= down_at).count();
    let unknown: Vec<(&str, &Answer)> = [
        ("black-holed", &unknown_black_holed),
        ("black-holed, 14 s in", &unknown_black_holed_again),
        ("continued", &unknown_continued),
        ("down", &unknown_down),
    ]
    .into_iter()
    .flat_map(|(when, answers)| answers.iter().map(move |answer| (when, answer)))
    .collect();
    let slowest_unknown = |when: &str| {
        unknown
            .iter()
            .filter(|(at, _)| at.starts_with(when))
            .map(|(_, answer)| answer.took)
            .max()
            .unwrap_or_default()
    };
    println!(
        "Concierge, Dex black-holed {BLACK_HOLE:?} then down {DOWN:?}: {} lists through the proxy with a Dex \
         token ({during_black_hole} while black-holed, {during_down} while down), {} failed, slowest {slowest:?}; \
         first use of unseen tokens of the cached key: black-holed {:?} {:?}, continued {:?} {:?}, down {:?} {:?}; \
         unknown kid refused (401): slowest black-holed {:?}, again 14 s in {:?}, continued {:?}, down {:?}; \
         new-key token first succeeded {recovered:?} after Dex was back ({} refusals before); old-key token \
         never seen: {:?}; Concierge RSS {rss_before} / {rss_black_holed} / {rss_down} / {rss_after} KiB \
         (before / black-holed / down / after); the test took {:?}",
        samples.len(),
        failed.len(),
        first_use_black_holed.status,
        first_use_black_holed.took,
        first_use_continued.status,
        first_use_continued.took,
        first_use_down.status,
        first_use_down.took,
        slowest_unknown("black-holed"),
        slowest_unknown("black-holed, 14"),
        slowest_unknown("continued"),
        slowest_unknown("down"),
        before_recovery.len(),
        old_key_unseen.status,
        started.elapsed(),
    );

    ensure!(
        failed.is_empty(),
        "requests with a valid token failed: {failed:#?}"
    );
    ensure!(
        during_black_hole > 20 && during_down > 10,
        "too little load ran: {during_black_hole} requests while black-holed, {during_down} while down"
    );
    ensure!(slowest < PROMPT, "a request with a valid token took {slowest:?}");
    for (when, answer) in [
        ("black-holed", &first_use_black_holed),
        ("continued", &first_use_continued),
        ("down", &first_use_down),
    ] {
        ensure!(
            answer.ok() && answer.took < PROMPT,
            "the first use of a token of a cached key, {when}: {}",
            answer.describe()
        );
    }
    for (when, answer) in &unknown {
        ensure!(
            answer.unauthorized() && answer.took < PROMPT,
            "a token of an unknown key, {when}: {}",
            answer.describe()
        );
    }
    ensure!(
        recovered.is_some(),
        "a token of Dex's new key was still refused 60 s after Dex was back: {:#?}\n{}",
        before_recovery.iter().map(Answer::describe).collect::<Vec<_>>(),
        concierge.process().log()
    );
    ensure!(
        old_key_unseen.unauthorized(),
        "a token of Dex's old key: {}",
        old_key_unseen.describe()
    );
    // The reasons are in the proxy's log (its audit lines), never the tokens.
    let log = concierge.process().log();
    for reason in ["dex:unknown_key", "dex:upstream_unavailable"] {
        ensure!(log.contains(reason), "the log does not name {reason}");
    }
    for token in [&load_token, &new_token] {
        let (_, signature) = token.rsplit_once('.').unwrap_or_default();
        ensure!(!log.contains(signature), "a token is in the Concierge's log");
    }
    ensure!(
        rss_after < rss_before * 2,
        "the Concierge's memory grew from {rss_before} to {rss_after} KiB"
    );
    Ok(())
}

// -------------------------------------------------------------------------------------------------
// The Supervisor.

/// What a login or a refresh at the Supervisor got.
#[derive(Debug)]
enum Got {
    /// Tokens: the session's refresh token.
    Tokens(String),
    /// An OAuth error: `error`, `error_description`.
    Refused(String, String),
    /// No answer within the client's deadline, or no OAuth answer.
    Broken(String),
}

/// One login or refresh: what it was (the session refreshed, if any), when it started, how long
/// it took and what it got.
#[derive(Debug)]
struct Attempt {
    session: Option<usize>,
    at: Instant,
    took: Duration,
    got: Got,
}

impl Attempt {
    async fn of(session: Option<usize>, attempt: impl std::future::Future<Output = Got>) -> Self {
        let at = Instant::now();
        let got = attempt.await;
        Self {
            session,
            at,
            took: at.elapsed(),
            got,
        }
    }

    fn tokens(&self) -> Option<&str> {
        match &self.got {
            Got::Tokens(refresh_token) => Some(refresh_token),
            _ => None,
        }
    }
}

/// A `cli_password` login at `issuer` as `email`, the code redeemed.
async fn login(http: &HttpsClient, issuer: &str, email: &str) -> Got {
    let (base, path) = pinniped_cli::split_issuer(issuer);
    let url = pinniped_cli::authorize_url(&base, &path, &[], &[]);
    let params = match pinniped_cli::get(http, &url, Some(PASSWORD), email).await {
        Ok(response) => match pinniped_cli::redirected(&response) {
            Ok(params) => params,
            Err(error) => return Got::Broken(format!("{error:#}")),
        },
        Err(error) => return Got::Broken(format!("{error:#}")),
    };
    if let Some(error) = pinniped_cli::param(&params, "error") {
        let description = pinniped_cli::param(&params, "error_description").unwrap_or_default();
        return Got::Refused(error.into(), description.into());
    }
    let Some(code) = pinniped_cli::param(&params, "code") else {
        return Got::Broken(format!("neither a code nor an error: {params:?}"));
    };
    let redeemed = pinniped_cli::token(
        http,
        &format!("{issuer}/oauth2/token"),
        &[
            ("grant_type", "authorization_code"),
            ("client_id", pinniped_cli::CLIENT_ID),
            ("code", code),
            ("redirect_uri", pinniped_cli::REDIRECT),
            ("code_verifier", pinniped_cli::VERIFIER),
        ],
    )
    .await;
    token_answer(redeemed)
}

/// The refresh grant with `refresh_token` at `issuer`.
async fn refresh(http: &HttpsClient, issuer: &str, refresh_token: &str) -> Got {
    token_answer(pinniped_cli::refresh(http, &format!("{issuer}/oauth2/token"), refresh_token).await)
}

fn token_answer(answer: anyhow::Result<(u16, Value)>) -> Got {
    match answer {
        Ok((200, tokens)) => match tokens["refresh_token"].as_str() {
            Some(refresh_token) => Got::Tokens(refresh_token.into()),
            None => Got::Broken("a token response without a refresh token".into()),
        },
        Ok((status, answer)) => match answer["error"].as_str() {
            Some(error) => Got::Refused(
                error.into(),
                answer["error_description"].as_str().unwrap_or_default().into(),
            ),
            None => Got::Broken(format!("{status} without an OAuth error")),
        },
        Err(error) => Got::Broken(format!("{error:#}")),
    }
}

/// Logins at `issuer` as each of `usernames`, one after another, before an outage: their
/// refresh tokens, and the longest a login took. Fails on any login that got no tokens (with
/// the Supervisor's `log`).
async fn sessions_before(
    http: &HttpsClient,
    issuer: &str,
    usernames: &[&str],
    log: impl Fn() -> String,
) -> anyhow::Result<(Vec<String>, Duration)> {
    let mut sessions = Vec::new();
    let mut slowest = Duration::ZERO;
    for username in usernames {
        let attempt = Attempt::of(None, login(http, issuer, username)).await;
        let refresh_token = attempt
            .tokens()
            .with_context(|| format!("a login before the outage: {attempt:?}\n{}", log()))?;
        sessions.push(refresh_token.to_string());
        slowest = slowest.max(attempt.took);
    }
    Ok((sessions, slowest))
}

/// What happened at the Supervisor while its upstream was black-holed ([`black_holed`]).
struct Outage {
    /// Every login and refresh made during it.
    during: Vec<Attempt>,
    /// When the upstream was continued.
    continued_at: Instant,
    /// The Supervisor's RSS while the upstream was stopped, KiB.
    rss_during: u64,
}

/// The load of an upstream outage at the Supervisor (process `supervisor`): the upstream
/// process `upstream` stopped (SIGSTOP) for `length`; a second in, four logins as `username` and
/// a refresh of each of `refreshed` (its index among the test's sessions, its refresh token) at
/// once; 12 s in, two more logins while the first may still wait; then SIGCONT. Every attempt is
/// waited for at most `bound` after SIGCONT.
async fn black_holed(
    http: &HttpsClient,
    issuer: &str,
    username: &str,
    refreshed: &[(usize, &str)],
    (upstream, supervisor): (u32, u32),
    length: Duration,
    bound: Duration,
) -> anyhow::Result<Outage> {
    let logins = |attempts: &mut JoinSet<Attempt>, count: usize| {
        for _ in 0..count {
            let (http, issuer, username) = (http.clone(), issuer.to_string(), username.to_string());
            attempts.spawn(async move { Attempt::of(None, login(&http, &issuer, &username)).await });
        }
    };
    let stopped = Stopped::stop(upstream).await?;
    let stopped_at = Instant::now();
    let mut attempts = JoinSet::new();
    tokio::time::sleep(Duration::from_secs(1)).await;
    logins(&mut attempts, 4);
    for (index, refresh_token) in refreshed {
        let (http, issuer, refresh_token, index) = (
            http.clone(),
            issuer.to_string(),
            refresh_token.to_string(),
            *index,
        );
        attempts
            .spawn(async move { Attempt::of(Some(index), refresh(&http, &issuer, &refresh_token)).await });
    }
    tokio::time::sleep_until(stopped_at + Duration::from_secs(12)).await;
    logins(&mut attempts, 2);
    let rss_during = rss_kib(supervisor);
    tokio::time::sleep_until(stopped_at + length).await;
    stopped.resume()?;
    let continued_at = Instant::now();
    let during = tokio::time::timeout(bound, attempts.join_all())
        .await
        .with_context(|| format!("logins and refreshes still running {bound:?} after the outage"))?;
    Ok(Outage {
        during,
        continued_at,
        rss_during,
    })
}

/// What must hold of the Supervisor after an outage, whatever its answers: no password and no
/// refresh token of `sessions` in its `log`, and its memory (`rss_before`, `rss_after`, KiB) not
/// doubled.
fn nothing_leaked(log: &str, sessions: &[String], rss_before: u64, rss_after: u64) -> anyhow::Result<()> {
    ensure!(!log.contains(PASSWORD), "a password is in the Supervisor's log");
    for refresh_token in sessions {
        ensure!(
            !log.contains(refresh_token.as_str()),
            "a refresh token is in the Supervisor's log"
        );
    }
    ensure!(
        rss_after < rss_before * 2,
        "the Supervisor's memory grew from {rss_before} to {rss_after} KiB"
    );
    Ok(())
}

/// Logins as `username` at `issuer`, one after another, from an outage's end (`continued_at`)
/// until one gets tokens: how long after the end that was (`None`: not within
/// [`REQUEST_DEADLINE`]), and what the failed ones got.
async fn recovery(
    http: &HttpsClient,
    issuer: &str,
    username: &str,
    continued_at: Instant,
) -> (Option<Duration>, Vec<Attempt>) {
    let mut failed = Vec::new();
    loop {
        let attempt = Attempt::of(None, login(http, issuer, username)).await;
        if attempt.tokens().is_some() {
            return (Some(continued_at.elapsed()), failed);
        }
        failed.push(attempt);
        if continued_at.elapsed() > REQUEST_DEADLINE {
            return (None, failed);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What every login and refresh during an upstream's outage must have got: an answer within
/// `prompt` (none waited for the upstream to come back), either tokens or the OAuth error that
/// says the upstream could not be asked (`temporarily_unavailable`; a refresh's says it was
/// the upstream refresh), never `invalid_grant`, which would end a session the outage did not
/// end.
fn outage_answers(during: &[Attempt], prompt: Duration) -> anyhow::Result<()> {
    for attempt in during {
        ensure!(
            attempt.took < prompt,
            "an attempt took {:?} while the upstream was black-holed (the Supervisor waits too long on \
             it): {attempt:?}",
            attempt.took
        );
        match (&attempt.got, attempt.session) {
            (Got::Tokens(_), _) => {}
            (Got::Refused(error, description), None) => ensure!(
                error == "temporarily_unavailable" && description.contains("upstream identity provider"),
                "a login during the outage: {attempt:?}"
            ),
            (Got::Refused(error, description), Some(_)) => ensure!(
                error == "temporarily_unavailable"
                    && description.contains("Upstream refresh failed")
                    && description.contains("upstream identity provider"),
                "a refresh during the outage: {attempt:?}"
            ),
            (Got::Broken(_), _) => anyhow::bail!("no OAuth answer during the outage: {attempt:?}"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_idp_dex_black_holed_supervisor_logins_fail_fast_with_an_oauth_error_and_recover(
) -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "faults-idp").await?;
    // A Dex user per session and one for the logins during the outage: Dex keeps one refresh
    // token per user and client, so a login — even one the Supervisor gave up on, which Dex
    // answers after SIGCONT — ends the upstream session of that user's earlier logins.
    let users: Vec<DexUser> = ["refreshed-0", "refreshed-1", "untouched", "logins"]
        .into_iter()
        .map(|name| DexUser {
            email: format!("{name}-{namespace}@example.com"),
            password: PASSWORD.into(),
            user_id: format!("{name}-{namespace}"),
            groups: vec!["seals".into()],
        })
        .collect();
    let dex = Dex::start(&users).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let http = supervisor.client()?;
    let issuer = supervisor.issuer().to_string();
    let pid = supervisor.pid();
    let email = users[3].email.clone();

    // Sessions from before the outage.
    let names: Vec<&str> = users[..3].iter().map(|user| user.email.as_str()).collect();
    let (sessions, login_before) = sessions_before(&http, &issuer, &names, || supervisor.log()).await?;
    let rss_before = rss_kib(pid);

    // Black-holed: logins, several at once, and refreshes of two of the sessions; a second wave of
    // logins while the first may still wait.
    let refreshed: Vec<(usize, &str)> = sessions.iter().map(String::as_str).enumerate().take(2).collect();
    let Outage {
        during,
        continued_at,
        rss_during,
    } = black_holed(
        &http,
        &issuer,
        &email,
        &refreshed,
        (dex.pid().context("Dex is not running")?, pid),
        BLACK_HOLE,
        REQUEST_DEADLINE * 2,
    )
    .await?;

    // Recovery, nothing restarted: a login, a refresh of the session nobody touched, and again
    // the refreshes that failed during the outage (a failed refresh rotates nothing).
    let (recovered, logins_before_recovery) = recovery(&http, &issuer, &email, continued_at).await;
    let untouched = Attempt::of(Some(2), refresh(&http, &issuer, &sessions[2])).await;
    let mut retried = Vec::new();
    for attempt in during.iter().filter(|attempt| attempt.tokens().is_none()) {
        if let Some(index) = attempt.session {
            retried.push(Attempt::of(Some(index), refresh(&http, &issuer, &sessions[index])).await);
        }
    }
    let rss_after = rss_kib(pid);

    let (logins, refreshes): (Vec<&Attempt>, Vec<&Attempt>) =
        during.iter().partition(|attempt| attempt.session.is_none());
    let ended_in_outage = |attempts: &[&Attempt]| {
        attempts
            .iter()
            .filter(|attempt| attempt.at + attempt.took < continued_at)
            .count()
    };
    let slowest = |attempts: &[&Attempt]| {
        attempts
            .iter()
            .map(|attempt| attempt.took)
            .max()
            .unwrap_or_default()
    };
    let answers: std::collections::BTreeSet<String> = during
        .iter()
        .map(|attempt| match &attempt.got {
            Got::Tokens(_) => "tokens".to_string(),
            Got::Refused(error, description) => format!("{error}: {description}"),
            Got::Broken(problem) => format!("broken: {problem}"),
        })
        .collect();
    println!("what logins and refreshes got while Dex was black-holed: {answers:#?}");
    println!(
        "Supervisor, upstream Dex black-holed {BLACK_HOLE:?}: {} logins ({} ended during the outage, slowest \
         {:?}; a login before it took at most {login_before:?}) and {} refreshes of earlier sessions ({} ended \
         during the outage, slowest {:?}), {} got tokens; after SIGCONT the first login succeeded after \
         {recovered:?}, the untouched session refreshed: {}, the refreshes that failed retried: {:?}; \
         Supervisor RSS {rss_before} / {rss_during} / {rss_after} KiB (before / black-holed / after); the test \
         took {:?}",
        logins.len(),
        ended_in_outage(&logins),
        slowest(&logins),
        refreshes.len(),
        ended_in_outage(&refreshes),
        slowest(&refreshes),
        during.iter().filter(|attempt| attempt.tokens().is_some()).count(),
        untouched.tokens().is_some(),
        retried.iter().map(|attempt| &attempt.got).collect::<Vec<_>>(),
        started.elapsed(),
    );

    outage_answers(&during, PROMPT)?;
    ensure!(
        ended_in_outage(&logins) >= 4,
        "the first logins did not end during the outage: they waited for Dex"
    );
    ensure!(
        recovered.is_some(),
        "no login succeeded within {REQUEST_DEADLINE:?} of SIGCONT: {logins_before_recovery:?}\n{}",
        supervisor.log()
    );
    ensure!(
        untouched.tokens().is_some(),
        "the session nobody refreshed during the outage: {untouched:?}"
    );
    for attempt in &retried {
        ensure!(
            !matches!(attempt.got, Got::Broken(_)),
            "a refresh retried after the outage: {attempt:?}"
        );
    }
    nothing_leaked(&supervisor.log(), &sessions, rss_before, rss_after)
}

/// How long the Supervisor's LDAP directory stays black-holed: longer than one LDAP timeout
/// plus the second wave's start, so every attempt of the test ends inside the outage.
const LDAP_BLACK_HOLE: Duration = Duration::from_secs(50);
/// The longest a refusal may take while the directory is black-holed: the Supervisor's bound on
/// one LDAP operation (30 s), and 5 s for the rest.
const LDAP_PROMPT: Duration = Duration::from_secs(35);

/// The Supervisor with an LDAPIdentityProvider at OpenLDAP, slapd black-holed (SIGSTOP) for
/// [`LDAP_BLACK_HOLE`] under password logins and a refresh: see [`directory_black_holed`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_idp_ldap_black_holed_supervisor_answers_within_one_timeout_and_sessions_survive(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "faults-ldap").await?;
    let users: Vec<LdapUser> = DIRECTORY_USERS
        .into_iter()
        .zip(2001..)
        .map(|(uid, uid_number)| LdapUser {
            uid: uid.into(),
            password: PASSWORD.into(),
            uid_number,
            groups: vec!["seals".into()],
        })
        .collect();
    let slapd = Slapd::start(&users).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &slapd, IDP_NAME).await?;
    directory_black_holed("LDAP directory (slapd)", &supervisor, slapd.pid()).await
}

/// The same with an ActiveDirectoryIdentityProvider at a Samba domain controller (one process,
/// `--model=single`), black-holed the same way: Active Directory's refresh checks (account
/// disabled, password changed, locked) cannot be made either, and must not end the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_idp_active_directory_black_holed_supervisor_answers_within_one_timeout_and_sessions_survive(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "faults-ad").await?;
    let users: Vec<AdUser> = DIRECTORY_USERS
        .into_iter()
        .map(|name| AdUser {
            name: name.into(),
            password: PASSWORD.into(),
            groups: vec!["seals".into()],
        })
        .collect();
    let samba = SambaDc::start(&users, &[]).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &samba, IDP_NAME).await?;
    directory_black_holed("Active Directory (Samba)", &supervisor, samba.pid()).await
}

/// The users of a directory's outage row, by login name: a session refreshed during the outage,
/// one untouched, and the one the logins during the outage are made as.
const DIRECTORY_USERS: [&str; 3] = ["refreshed", "untouched", "logins"];

/// The outage row of an LDAP-based identity provider (`label`) whose directory is the process
/// `directory`, behind `supervisor` (its users [`DIRECTORY_USERS`], password [`PASSWORD`]):
/// the directory black-holed (SIGSTOP) for [`LDAP_BLACK_HOLE`] under password logins and a
/// refresh. What must hold: each ends within one LDAP timeout whatever the others do, with
/// `temporarily_unavailable` (a refresh too: the directory did not say no, so the session is not
/// ended); after SIGCONT logins work again by themselves, and the very refresh token refused
/// during the outage refreshes (nothing was rotated or lost).
async fn directory_black_holed(label: &str, supervisor: &Supervisor, directory: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    let http = supervisor.client()?;
    let issuer = supervisor.issuer().to_string();
    let pid = supervisor.pid();
    let [refreshed, untouched, username] = DIRECTORY_USERS;

    let (sessions, _) = sessions_before(&http, &issuer, &[refreshed, untouched], || supervisor.log()).await?;
    let rss_before = rss_kib(pid);

    // Black-holed: logins, several at once, and a refresh; a second wave of logins while the
    // first waits.
    let Outage {
        during,
        continued_at,
        rss_during,
    } = black_holed(
        &http,
        &issuer,
        username,
        &[(0, &sessions[0])],
        (directory, pid),
        LDAP_BLACK_HOLE,
        LDAP_PROMPT * 2,
    )
    .await?;

    // Recovery, nothing restarted.
    let (recovered, logins_before_recovery) = recovery(&http, &issuer, username, continued_at).await;
    let untouched = Attempt::of(Some(1), refresh(&http, &issuer, &sessions[1])).await;
    let again = Attempt::of(Some(0), refresh(&http, &issuer, &sessions[0])).await;
    let rss_after = rss_kib(pid);

    let slowest = during
        .iter()
        .map(|attempt| attempt.took)
        .max()
        .unwrap_or_default();
    let ended_in_outage = during
        .iter()
        .filter(|attempt| attempt.session.is_none() && attempt.at + attempt.took < continued_at)
        .count();
    println!(
        "Supervisor, {label} black-holed {LDAP_BLACK_HOLE:?}: {} logins and refreshes ({ended_in_outage} \
         logins ended during the outage), slowest {slowest:?}, answers {:?}; after SIGCONT the first login \
         succeeded after {recovered:?}; the untouched session refreshed: {}; the session refused during the \
         outage refreshed: {}; Supervisor RSS {rss_before} / {rss_during} / {rss_after} KiB; the test took {:?}",
        during.len(),
        during.iter().map(|attempt| &attempt.got).collect::<Vec<_>>(),
        untouched.tokens().is_some(),
        again.tokens().is_some(),
        started.elapsed(),
    );

    outage_answers(&during, LDAP_PROMPT)?;
    ensure!(
        ended_in_outage == 6,
        "only {ended_in_outage} of 6 logins ended during the outage: some waited for the directory"
    );
    ensure!(
        recovered.is_some(),
        "no login succeeded within {REQUEST_DEADLINE:?} of SIGCONT: {logins_before_recovery:?}\n{}",
        supervisor.log()
    );
    ensure!(
        untouched.tokens().is_some(),
        "the untouched session: {untouched:?}"
    );
    ensure!(
        again.tokens().is_some(),
        "the session whose refresh was refused during the outage: {again:?}"
    );
    nothing_leaked(&supervisor.log(), &sessions, rss_before, rss_after)
}

// -------------------------------------------------------------------------------------------------
// A webhook.

/// A TCP relay on 127.0.0.1 to `target` that can be paused: paused, it still accepts connections
/// and reads what comes, but passes nothing on either way (a server whose kernel accepts and whose
/// process does not answer: black-holed); resumed, it passes on what it held. Stops when dropped.
struct Relay {
    address: std::net::SocketAddr,
    paused: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: String) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (paused, watching) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut relays = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (target, watching) = (target.clone(), watching.clone());
                relays.spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (client_reads, client_writes) = client.into_split();
                    let (server_reads, server_writes) = server.into_split();
                    tokio::join!(
                        pipe(client_reads, server_writes, watching.clone()),
                        pipe(server_reads, client_writes, watching),
                    );
                });
            }
        });
        Ok(Self {
            address,
            paused,
            task,
        })
    }

    fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding what it read while `paused` says so.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if paused.wait_for(|paused| !paused).await.is_err() || to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// One review: how long it took and its outcome (`None`: still running at the client's deadline).
async fn review(webhook: &TokenReviewAuthenticator, token: &str) -> (Duration, Option<Outcome>) {
    let at = Instant::now();
    let outcome = tokio::time::timeout(REQUEST_DEADLINE, webhook.authenticate(token))
        .await
        .ok();
    (at.elapsed(), outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_idp_webhook_black_holed_cached_reviews_serve_and_uncached_tokens_are_refused_promptly(
) -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "faults-webhook").await?;
    let (cached_token, _) = service_account_token(cluster, &namespace, "cached").await?;
    let mut uncached = Vec::new();
    for n in 0..3 {
        uncached.push(
            service_account_token(cluster, &namespace, &format!("uncached-{n}"))
                .await?
                .0,
        );
    }
    // The webhook is kube-apiserver's TokenReview; the reviewer's own credential may create them.
    let reviewer = format!("faults-webhook-{namespace}");
    let kubectl = cluster.kubectl();
    kubectl
        .run(&[
            "create",
            "clusterrolebinding",
            &reviewer,
            "--clusterrole=system:auth-delegator",
            &format!("--user={reviewer}"),
        ])
        .await?;
    let credential = cluster.pki().client_ca.issue_client(&reviewer, &[])?;
    let relay = Relay::start(cluster.server_url().trim_start_matches("https://").to_string()).await?;
    let mut config = TokenReviewConfig::new(
        "faults-webhook",
        format!(
            "https://{}/apis/authentication.k8s.io/v1/tokenreviews",
            relay.address
        ),
    );
    config.ca_bundle_pem = Some(cluster.pki().server_ca.cert_pem());
    config.client_auth = ClientAuth::Certificate {
        cert_pem: credential.cert_pem,
        key_pem: credential.key_pem,
    };
    let timeout = config.timeout;
    let webhook = Arc::new(TokenReviewAuthenticator::new(config)?);
    let (_, before) = review(&webhook, &cached_token).await;
    ensure!(
        matches!(before, Some(Outcome::Authenticated(_))),
        "before the outage: {before:?}"
    );

    // Black-holed: the cached token again and again, and uncached tokens at once.
    relay.pause(true);
    let paused_at = Instant::now();
    let first_reviews = {
        let (webhook, tokens) = (webhook.clone(), uncached.clone());
        tokio::spawn(async move {
            futures::future::join_all(tokens.iter().map(|token| review(&webhook, token))).await
        })
    };
    let mut cached = Vec::new();
    while paused_at.elapsed() < BLACK_HOLE - Duration::from_secs(5) && cached.len() < MAX_REQUESTS {
        cached.push(review(&webhook, &cached_token).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first_reviews = first_reviews.await?;
    relay.pause(false);
    let resumed_at = Instant::now();

    // Back: the tokens refused during the outage (a failure to check is never cached) work.
    let recovered = loop {
        let (_, outcome) = review(&webhook, &uncached[0]).await;
        if matches!(outcome, Some(Outcome::Authenticated(_))) {
            break Some(resumed_at.elapsed());
        }
        if resumed_at.elapsed() > REQUEST_DEADLINE {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let _best_effort = kubectl.run(&["delete", "clusterrolebinding", &reviewer]).await;

    let cached_failed = cached
        .iter()
        .filter(|(_, outcome)| !matches!(outcome, Some(Outcome::Authenticated(_))))
        .count();
    let cached_slowest = cached.iter().map(|(took, _)| *took).max().unwrap_or_default();
    let uncached_slowest = first_reviews
        .iter()
        .map(|(took, _)| *took)
        .max()
        .unwrap_or_default();
    println!(
        "WebhookAuthenticator, webhook black-holed {:?}: {} reviews of a cached token, {cached_failed} failed, \
         slowest {cached_slowest:?}; {} uncached tokens at once: {:?}, slowest {uncached_slowest:?} (the \
         webhook's timeout {timeout:?}); after it was back an uncached token was accepted after {recovered:?}; \
         the test took {:?}",
        BLACK_HOLE - Duration::from_secs(5),
        cached.len(),
        first_reviews.len(),
        first_reviews.iter().map(|(_, outcome)| outcome).collect::<Vec<_>>(),
        started.elapsed(),
    );
    ensure!(
        cached_failed == 0 && cached.len() > 20,
        "the cached token's reviews: {cached_failed} of {} failed",
        cached.len()
    );
    ensure!(
        cached_slowest < Duration::from_secs(1),
        "a cached review took {cached_slowest:?}"
    );
    for (took, outcome) in &first_reviews {
        ensure!(
            *outcome == Some(Outcome::Rejected(RejectReason::UpstreamUnavailable)) && *took < PROMPT,
            "an uncached token while the webhook was black-holed: {outcome:?} after {took:?}"
        );
    }
    ensure!(
        recovered.is_some(),
        "an uncached token was still refused {REQUEST_DEADLINE:?} after the webhook was back"
    );
    Ok(())
}
