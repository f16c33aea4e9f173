//! The session garbage collector: the leader's periodic sweep that deletes the storage Secrets
//! whose `storage.pinniped.dev/garbage-collect-after` time has passed, revoking first (RFC 7009)
//! the upstream OIDC token an expired session still holds, as Pinniped's collector does.
//!
//! A login's own Secret ([`crate::session::login`]) holds its latest upstream token. Of the
//! Secrets of the earlier format (one per token, Pinniped's), the one that holds it (only that
//! one is revoked, once) is: an authorization code never redeemed; an access token whose login was not granted
//! `offline_access` (so it has no refresh token); every refresh token (a refresh writes a new
//! one and deletes the old). A revocation that may succeed later (the upstream unreachable or
//! answering 429 or 5xx) keeps the Secret for the next sweep, for at most
//! [`RETRY_REVOCATION_FOR`] past its collection time; any other failure (the upstream refused,
//! or its identity provider resource is gone) is logged and the Secret is deleted anyway.
//!
//! Concurrency: a sweep lists the storage Secrets' metadata once, reads the expired ones
//! [`SWEEP_CONCURRENCY`] at a time ([`Store::collectable`]), then handles them as many at a
//! time, each on its own: its revocation, then its conditional delete ([`collect`]). A backlog
//! of N expired Secrets so costs about 2N / [`SWEEP_CONCURRENCY`] kube-apiserver round trips of
//! wall time (plus the revocations, as many at a time) instead of 2N one after the other. No
//! Secret's fate depends on another's, so the counts ([`Sweep`]), the log lines (in an order
//! that may differ) and what is kept or deleted are those of handling them one by one.

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use selkie_oidc::rp::TokenTypeHint;
use time::OffsetDateTime;

use crate::idp::{OidcUpstream, Upstream, UpstreamFailure};
use crate::issuer::Issuers;
use crate::session::login::{self, Login};
use crate::session::storage::{garbage_collect_after, Resource};
use crate::session::store::{Store, StoreError};
use crate::session::Session;

/// How often the leader sweeps.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// How long past its collection time a Secret is kept while its upstream revocation may still
/// succeed (Pinniped: four hours).
pub(crate) const RETRY_REVOCATION_FOR: time::Duration = time::Duration::hours(4);
/// How many expired Secrets a sweep handles at once (each a revocation at its upstream, then a
/// delete at kube-apiserver; also how many expired Secrets [`Store::collectable`] reads at
/// once). Eight requests in flight hide most of the round-trip latency of a backlog (500
/// expired Secrets: about 125 round trips of wall time instead of 1,000) while staying far
/// below kube-apiserver's in-flight limits (`--max-mutating-requests-inflight` defaults to 200)
/// and an upstream identity provider's rate limits, so the leader's sweep never bursts either
/// of them and the logins it shares them with do not wait on it.
pub(crate) const SWEEP_CONCURRENCY: usize = 8;

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// Secrets deleted.
    pub deleted: usize,
    /// Upstream tokens revoked.
    pub revoked: usize,
    /// Secrets kept to retry their revocation.
    pub retrying: usize,
    /// Revocations that failed for good (the Secret was deleted anyway).
    pub failed: usize,
}

impl Sweep {
    /// The counts of `self` and `other` together.
    fn plus(self, other: Self) -> Self {
        Self {
            deleted: self.deleted + other.deleted,
            revoked: self.revoked + other.revoked,
            retrying: self.retrying + other.retrying,
            failed: self.failed + other.failed,
        }
    }
}

/// Whether a `resource` Secret (of the earlier format, one per token) holding `session` holds
/// its login's latest upstream token, by the rules in the module's documentation (a login's own
/// Secret always does).
pub(crate) fn holds_latest(resource: Resource, session: &Session) -> bool {
    match resource {
        Resource::AuthCode => session.code_active,
        Resource::AccessToken => !session.scopes.iter().any(|scope| scope == "offline_access"),
        Resource::RefreshToken => true,
        Resource::Pkce | Resource::Oidc => false,
    }
}

/// The upstream OIDC token `session` holds, to revoke when it ends: its refresh token, else its
/// access token; `None` for other upstreams or when it holds none.
pub(crate) fn token_to_revoke(session: &Session) -> Option<(&str, TokenTypeHint)> {
    if session.upstream.idp_type != "oidc" {
        return None;
    }
    let upstream = &session.upstream;
    match (&upstream.refresh_token, &upstream.access_token) {
        (Some(token), _) => Some((token.as_str(), TokenTypeHint::RefreshToken)),
        (None, Some(token)) => Some((token.as_str(), TokenTypeHint::AccessToken)),
        (None, None) => None,
    }
}

/// One sweep at `now`: lists the expired storage Secrets (one list call), revokes what they
/// hold upstream, deletes them (each only if unchanged since listed), `SWEEP_CONCURRENCY` (8)
/// Secrets at a time. Fails only when the list, or the read of an expired Secret, fails (and
/// then deletes nothing); a failed deletion is logged and retried by the next sweep.
pub async fn sweep(store: &Store, issuers: &Issuers, now: OffsetDateTime) -> Result<Sweep, StoreError> {
    let collectable = store.collectable(now, SWEEP_CONCURRENCY).await?;
    Ok(futures::stream::iter(collectable)
        .map(|secret| collect(store, issuers, secret, now))
        .buffer_unordered(SWEEP_CONCURRENCY)
        .fold(Sweep::default(), |total, one| async move { total.plus(one) })
        .await)
}

/// What a sweep at `now` does with one expired `secret`: revokes the upstream token it holds,
/// then deletes it if unchanged, or keeps it to retry a revocation that may succeed later. The
/// counts are this Secret's (each 0 or 1).
async fn collect(store: &Store, issuers: &Issuers, secret: Secret, now: OffsetDateTime) -> Sweep {
    let mut sweep = Sweep::default();
    let name = secret.metadata.name.clone().unwrap_or_default();
    let label = crate::session::storage::type_label(&secret);
    match revoke_upstream(issuers, &secret, &label).await {
        Ok(true) => sweep.revoked += 1,
        Ok(false) => {}
        Err(UpstreamFailure::Unavailable(reason))
            if garbage_collect_after(&secret).is_some_and(|after| after + RETRY_REVOCATION_FOR > now) =>
        {
            tracing::warn!(secret = %name, storage_type = %label, %reason, "revoking the upstream token failed; the session is kept to try again");
            sweep.retrying += 1;
            return sweep;
        }
        Err(UpstreamFailure::Unavailable(reason) | UpstreamFailure::Refused(reason)) => {
            tracing::warn!(secret = %name, storage_type = %label, %reason, "revoking the upstream token failed; the session is deleted anyway");
            sweep.failed += 1;
        }
    }
    match store.delete_unchanged(&secret).await {
        Ok(true) => {
            tracing::info!(secret = %name, storage_type = %label, "expired session storage deleted");
            sweep.deleted += 1;
        }
        Ok(false) => {}
        Err(error) => tracing::warn!(secret = %name, %error, "deleting expired session storage failed"),
    }
    sweep
}

/// Revokes the upstream token `secret` (of storage type `label`) must revoke. `Ok(true)` when
/// one was revoked, `Ok(false)` when there was none to revoke or the upstream has no revocation
/// endpoint.
async fn revoke_upstream(issuers: &Issuers, secret: &Secret, label: &str) -> Result<bool, UpstreamFailure> {
    if label == crate::session::device::DEVICE_LABEL || label == crate::session::store::SAML_ASSERTION_LABEL {
        // A device login holds no upstream token (its login's own Secret does); the record of a
        // SAML assertion holds nothing.
        return Ok(false);
    }
    if label == login::LOGIN_LABEL {
        let login = Login::read(secret).map_err(|error| UpstreamFailure::Refused(error.to_string()))?;
        return revoke_upstream_of(issuers, &login.session).await;
    }
    let Some(resource) = Resource::from_label(label) else {
        return Err(UpstreamFailure::Refused(format!(
            "unknown storage type {label:?}"
        )));
    };
    if matches!(resource, Resource::Pkce | Resource::Oidc) {
        return Ok(false);
    }
    let data = resource
        .read_secret(secret)
        .map_err(|error| UpstreamFailure::Refused(error.to_string()))?;
    let session: Session = serde_json::from_value(data).map_err(|error| {
        UpstreamFailure::Refused(format!(
            "the stored session cannot be read: {}",
            selkie_api::json::error_without_values(&error)
        ))
    })?;
    if !holds_latest(resource, &session) {
        return Ok(false);
    }
    revoke_upstream_of(issuers, &session).await
}

/// Revokes the upstream token `session` holds ([`token_to_revoke`]) at its OIDC identity
/// provider: `Ok(true)` when one was revoked, `Ok(false)` when there was none to revoke or the
/// upstream has no revocation endpoint.
pub(crate) async fn revoke_upstream_of(
    issuers: &Issuers,
    session: &Session,
) -> Result<bool, UpstreamFailure> {
    let Some((token, hint)) = token_to_revoke(session) else {
        return Ok(false);
    };
    let Some(oidc) = find_oidc(
        issuers,
        &session.upstream.provider_name,
        &session.upstream.provider_uid,
    ) else {
        return Err(UpstreamFailure::Refused(format!(
            "no OIDCIdentityProvider named {:?} with UID {:?} is in use",
            session.upstream.provider_name, session.upstream.provider_uid
        )));
    };
    match oidc.provider.revoke(&oidc.client, token, hint).await {
        Ok(revoked) => {
            if revoked {
                tracing::info!(idp = %session.upstream.provider_name, token_type = hint.as_str(), "upstream token revoked");
            }
            Ok(revoked)
        }
        Err(error) if error.is_retryable() => Err(UpstreamFailure::Unavailable(error.to_string())),
        Err(error) => Err(UpstreamFailure::Refused(error.to_string())),
    }
}

/// The OIDC upstream of resource `name` and `uid` in any FederationDomain.
fn find_oidc<'a>(issuers: &'a Issuers, name: &str, uid: &str) -> Option<&'a OidcUpstream> {
    if name.is_empty() {
        return None;
    }
    issuers
        .all()
        .flat_map(|issuer| issuer.idps.iter())
        .find_map(|idp| match idp.as_ref() {
            Upstream::Oidc(oidc) if oidc.resource_name == name && oidc.resource_uid == uid => Some(oidc),
            Upstream::Oidc(_) | Upstream::Ldap(_) | Upstream::GitHub(_) | Upstream::Saml(_) => None,
        })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full};
    use selkie_oidc::{discovery::Discovery, jose::sign::SigningKey};

    use super::*;

    /// The upstream token an expired `resource` Secret holding `session` revokes.
    fn revoked_by(resource: Resource, session: &Session) -> Option<(&str, TokenTypeHint)> {
        holds_latest(resource, session)
            .then(|| token_to_revoke(session))
            .flatten()
    }
    use crate::issuer::Issuer;
    use crate::sealed::Sealer;
    use crate::session::store::memory::{Requests, Verb};
    use crate::session::tokens::TokenKey;
    use crate::session::{Identity, Upstream as SessionUpstream};

    fn session(scopes: &[&str], code_active: bool, refresh: Option<&str>, access: Option<&str>) -> Session {
        Session {
            request_id: "3f0c1f6e-52f4-4c39-9c3e-6a1f1a0e8a11".into(),
            client_id: "pinniped-cli".into(),
            redirect_uri: "http://127.0.0.1/callback".into(),
            scopes: scopes.iter().map(|scope| scope.to_string()).collect(),
            nonce: None,
            code_challenge: String::new(),
            requested_at: 0,
            auth_time: 0,
            expires_at: 0,
            idle_timeout: None,
            code_active,
            token_expires_at: 0,
            identity: Identity {
                subject: "sub".into(),
                username: "user".into(),
                groups: Vec::new(),
                additional_claims: Default::default(),
            },
            upstream: SessionUpstream {
                idp_name: "Dex".into(),
                idp_type: "oidc".into(),
                provider_name: "dex".into(),
                provider_uid: "uid".into(),
                issuer: "https://dex.example".into(),
                subject: "upstream-sub".into(),
                refresh_token: refresh.map(str::to_string),
                access_token: access.map(str::to_string),
                ldap: None,
                username: None,
                groups: None,
            },
            access_token_signature: None,
            rotated: false,
        }
    }

    #[test]
    fn only_the_secret_holding_the_latest_upstream_token_revokes_it() {
        let offline = session(&["openid", "offline_access"], true, Some("rt"), None);
        assert_eq!(
            revoked_by(Resource::AuthCode, &offline),
            Some(("rt", TokenTypeHint::RefreshToken))
        );
        assert_eq!(
            revoked_by(Resource::RefreshToken, &offline),
            Some(("rt", TokenTypeHint::RefreshToken))
        );
        // The login has a refresh token: its refresh-token Secret holds the latest upstream token.
        assert_eq!(revoked_by(Resource::AccessToken, &offline), None);
        // A redeemed code's tokens moved on.
        let redeemed = session(&["openid", "offline_access"], false, Some("rt"), None);
        assert_eq!(revoked_by(Resource::AuthCode, &redeemed), None);
        for resource in [Resource::Pkce, Resource::Oidc] {
            assert_eq!(revoked_by(resource, &offline), None);
        }
    }

    #[test]
    fn without_offline_access_the_access_token_secret_revokes_the_upstream_access_token() {
        let online = session(&["openid"], false, None, Some("at"));
        assert_eq!(
            revoked_by(Resource::AccessToken, &online),
            Some(("at", TokenTypeHint::AccessToken))
        );
        let nothing = session(&["openid"], true, None, None);
        assert_eq!(revoked_by(Resource::AuthCode, &nothing), None);
        let mut ldap = session(&["openid"], true, Some("rt"), None);
        ldap.upstream.idp_type = "ldap".into();
        assert_eq!(revoked_by(Resource::AuthCode, &ldap), None);
    }

    #[test]
    fn every_storage_label_names_its_resource() {
        for resource in Resource::ALL {
            assert_eq!(Resource::from_label(resource.as_str()), Some(resource));
        }
        assert_eq!(Resource::from_label("upstream-state"), None);
    }

    /// How long the fake revocation endpoint takes to answer: long enough that the requests of
    /// a sweep overlap when it sends them at once.
    const REVOCATION_DELAY: Duration = Duration::from_millis(100);

    /// An upstream's revocation endpoint on 127.0.0.1 (HTTPS). After [`REVOCATION_DELAY`] it
    /// answers 200 for tokens starting with `good`, 503 for `unavailable`, 400 for any other;
    /// it counts the requests and the most it was answering at once.
    struct Revoker {
        url: String,
        ca_pem: String,
        requests: Arc<AtomicUsize>,
        most_at_once: Arc<AtomicUsize>,
    }

    impl Revoker {
        /// Serves until the test's runtime ends.
        async fn start() -> Self {
            let hour = Duration::from_secs(3600);
            let ca = selkie_kube::certs::generate_ca("revoker CA", hour).unwrap();
            let serving = selkie_kube::certs::issue_serving(&ca, &["127.0.0.1".into()], hour).unwrap();
            let acceptor = crate::test_support::tls_acceptor(&serving.cert_pem, &serving.key_pem);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let requests = Arc::new(AtomicUsize::new(0));
            let most_at_once = Arc::new(AtomicUsize::new(0));
            let counters = (
                requests.clone(),
                Arc::new(AtomicUsize::new(0)),
                most_at_once.clone(),
            );
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, counters) = (acceptor.clone(), counters.clone());
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service = hyper::service::service_fn(
                            move |request: http::Request<hyper::body::Incoming>| {
                                let (requests, in_flight, most_at_once) = counters.clone();
                                async move {
                                    requests.fetch_add(1, Ordering::SeqCst);
                                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                                    most_at_once.fetch_max(now, Ordering::SeqCst);
                                    let body = request.into_body().collect().await.unwrap().to_bytes();
                                    let token = form_urlencoded::parse(&body)
                                        .find(|(key, _)| key == "token")
                                        .map(|(_, value)| value.into_owned())
                                        .unwrap_or_default();
                                    tokio::time::sleep(REVOCATION_DELAY).await;
                                    in_flight.fetch_sub(1, Ordering::SeqCst);
                                    let status = match token.as_str() {
                                        good if good.starts_with("good") => 200,
                                        "unavailable" => 503,
                                        _ => 400,
                                    };
                                    Ok::<_, Infallible>(
                                        http::Response::builder()
                                            .status(status)
                                            .body(Full::new(Bytes::new()))
                                            .unwrap(),
                                    )
                                }
                            },
                        );
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                            .await;
                    });
                }
            });
            Self {
                url: format!("https://127.0.0.1:{port}"),
                ca_pem: ca.cert_pem.clone(),
                requests,
                most_at_once,
            }
        }

        /// One FederationDomain whose only upstream, the OIDCIdentityProvider `dex` (UID `uid`),
        /// revokes its tokens here.
        fn issuers(&self) -> Issuers {
            let discovery = Discovery {
                issuer: self.url.clone(),
                authorization_endpoint: format!("{}/authorize", self.url),
                token_endpoint: format!("{}/token", self.url),
                revocation_endpoint: format!("{}/revoke", self.url),
                ..Discovery::default()
            };
            let oidc = crate::test_support::oidc_upstream("Dex", "uid", discovery, &self.ca_pem);
            let url = "https://sso.example.com/fd";
            let issuer = Issuer::new(
                "supervisor/fd".into(),
                url.into(),
                Arc::new(SigningKey::generate("k").unwrap()),
                Bytes::new(),
                Arc::new(TokenKey::new(&[1; 32])),
                Arc::new(Sealer::new(&[2; 32], url).unwrap()),
                vec![Arc::new(Upstream::Oidc(oidc))],
                Default::default(),
                Default::default(),
            )
            .unwrap();
            Issuers::new(vec![Arc::new(issuer)])
        }
    }

    fn names(secrets: &[Secret]) -> Vec<String> {
        secrets
            .iter()
            .map(|secret| secret.metadata.name.clone().unwrap())
            .collect()
    }

    /// A sweep handles its expired Secrets several at a time, at most [`SWEEP_CONCURRENCY`],
    /// and counts, keeps and deletes as handling them one by one would: revoked and deleted,
    /// kept to retry within [`RETRY_REVOCATION_FOR`], deleted anyway past it or when the
    /// upstream refuses or is gone, deleted with nothing to revoke; a failed deletion is not
    /// counted and the next sweep deletes that Secret.
    #[tokio::test]
    async fn a_sweep_handles_expired_secrets_a_few_at_a_time_and_counts_as_one_by_one() {
        let revoker = Revoker::start().await;
        let issuers = revoker.issuers();
        let (store, memory) = Store::in_memory();
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let (minute, hour) = (time::Duration::minutes(1), time::Duration::hours(1));
        let offline = ["openid", "offline_access"];
        let mut n = 0;
        let mut create = |resource: Resource, session: Session, lifetime: time::Duration| {
            n += 1;
            let (store, signature) = (store.clone(), format!("s{n:02}"));
            async move {
                store
                    .create(resource, &signature, &session, lifetime, now)
                    .await
                    .unwrap();
                resource.secret_name(&signature)
            }
        };
        for good in 0..12 {
            let token = format!("good-{good}");
            let session = session(&offline, false, Some(&token), None);
            create(Resource::RefreshToken, session, -minute).await;
        }
        let mut kept = Vec::new();
        for _ in 0..2 {
            let session = session(&offline, false, Some("unavailable"), None);
            kept.push(create(Resource::RefreshToken, session, -minute).await);
        }
        // Past the retry window; refused; its upstream gone.
        let session_unavailable = session(&offline, false, Some("unavailable"), None);
        create(Resource::RefreshToken, session_unavailable, -5 * hour).await;
        let refused = session(&offline, false, Some("refused"), None);
        create(Resource::RefreshToken, refused, -minute).await;
        let mut orphan = session(&offline, false, Some("good-orphan"), None);
        orphan.upstream.provider_uid = "another-uid".into();
        create(Resource::RefreshToken, orphan, -minute).await;
        // Nothing to revoke.
        for _ in 0..3 {
            let mut ldap = session(&["openid"], false, None, Some("at"));
            ldap.upstream.idp_type = "ldap".into();
            create(Resource::AccessToken, ldap, -minute).await;
        }
        for _ in 0..2 {
            let live = session(&offline, false, Some("good-live"), None);
            kept.push(create(Resource::RefreshToken, live, hour).await);
        }
        memory.take_requests();
        memory.fail_next(Verb::Delete, 500);

        let swept = sweep(&store, &issuers, now).await.unwrap();
        assert_eq!(
            swept,
            Sweep {
                deleted: 12 + 3 + 3 - 1,
                revoked: 12,
                retrying: 2,
                failed: 3,
            }
        );
        assert_eq!(
            memory.take_requests(),
            Requests {
                list: 1,
                get: 20,
                delete: 18,
                ..Requests::default()
            }
        );
        assert_eq!(
            revoker.requests.load(Ordering::SeqCst),
            16,
            "the orphan's upstream is not asked"
        );
        let most = revoker.most_at_once.load(Ordering::SeqCst);
        assert!(
            (2..=SWEEP_CONCURRENCY).contains(&most),
            "{most} revocations at once"
        );
        let left = names(&memory.secrets());
        assert_eq!(left.len(), kept.len() + 1, "{left:?}");
        assert!(kept.iter().all(|name| left.contains(name)), "{left:?}");

        let swept = sweep(&store, &issuers, now).await.unwrap();
        assert_eq!((swept.deleted, swept.retrying), (1, 2), "{swept:?}");
        let mut left = names(&memory.secrets());
        left.sort();
        kept.sort();
        assert_eq!(left, kept);
    }

    /// An expired device login (RFC 8628) holds no upstream token: a sweep deletes it without
    /// asking any upstream and counts no failure; a live one stays.
    #[tokio::test]
    async fn a_sweep_deletes_expired_device_logins_with_nothing_to_revoke() {
        use crate::session::device::{self, DeviceLogin, DeviceRequest, DeviceStatus};
        let revoker = Revoker::start().await;
        let (store, memory) = Store::in_memory();
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let device = |user_code: &str, expires_at: i64| DeviceLogin {
            id: device::id_of(user_code),
            request: DeviceRequest {
                issuer: "https://sso.example.com".into(),
                client_id: "pinniped-cli".into(),
                code_challenge: "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM".into(),
                authorize_query: "client_id=pinniped-cli&state=state".into(),
                device_code_signature: "sig".into(),
                state: "state".into(),
                expires_at,
            },
            status: DeviceStatus::Approved {
                code: "pin_ac_x.y".into(),
            },
        };
        let expired = device("BCDF-GHJK", now.unix_timestamp() - 60);
        let live = device("BCDF-GHJL", now.unix_timestamp() + 300);
        for login in [&expired, &live] {
            // Written when it was new: collectable at its expiry.
            store
                .create_device(login, now - time::Duration::minutes(5))
                .await
                .unwrap();
        }
        let swept = sweep(&store, &revoker.issuers(), now).await.unwrap();
        assert_eq!(
            swept,
            Sweep {
                deleted: 1,
                ..Sweep::default()
            }
        );
        assert_eq!(names(&memory.secrets()), [device::secret_name(&live.id)]);
        assert_eq!(revoker.requests.load(Ordering::SeqCst), 0);
    }

    /// A sweep fails when listing fails or an expired Secret cannot be read, and then deletes
    /// nothing.
    #[tokio::test]
    async fn a_sweep_fails_and_deletes_nothing_when_the_list_or_a_read_fails() {
        let (store, memory) = Store::in_memory();
        let issuers = Issuers::new(Vec::new());
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        for n in 0..20 {
            let mut ldap = session(&["openid"], false, None, Some("at"));
            ldap.upstream.idp_type = "ldap".into();
            store
                .create(
                    Resource::AccessToken,
                    &format!("s{n:02}"),
                    &ldap,
                    -time::Duration::minutes(1),
                    now,
                )
                .await
                .unwrap();
        }
        memory.take_requests();
        for verb in [Verb::List, Verb::Get] {
            memory.fail_next(verb, 500);
            assert!(matches!(
                sweep(&store, &issuers, now).await,
                Err(StoreError::Api(_))
            ));
            assert_eq!(memory.take_requests().delete, 0, "{verb:?}");
            assert_eq!(memory.secrets().len(), 20);
        }
        let swept = sweep(&store, &issuers, now).await.unwrap();
        assert_eq!(
            swept,
            Sweep {
                deleted: 20,
                ..Sweep::default()
            }
        );
        assert!(memory.secrets().is_empty());
    }
}
