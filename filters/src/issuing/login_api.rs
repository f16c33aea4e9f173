//! The Concierge's login API — TokenCredentialRequest and WhoAmIRequest — as one piece of logic
//! that both front ends serve: the impersonation proxy (so a client that reaches only the proxy
//! can log in and ask who it is) and the control plane's aggregated API server (reached through
//! kube-apiserver).
//!
//! [`ConciergeApi`] is the seam; [`SignerConciergeApi`] implements it with the chain's
//! authenticators and a [`ClientCertificateSigner`] that can be swapped while serving (the
//! control plane installs the cluster's signing key when it has it, else its own signer CA).
//! While the cluster's key is configured but this replica does not have it yet (the kube cert
//! agent's pod is starting), a request about to be issued a certificate asks the control plane
//! for an immediate re-read and waits for the key, for at most [`PREFERRED_SIGNER_WAIT`]
//! ([`SignerRefresh`]): otherwise it would get a certificate of the signer CA, which
//! kube-apiserver itself does not accept, although the CredentialIssuer says the cluster's key
//! works.
//! It answers as Pinniped's aggregated API does: a failed login is still `201 Created`, with
//! `status.message: "authentication failed"` and no detail, and identities with a UID or extras
//! are refused (a client certificate cannot carry them) — unless the authenticator is configured
//! with [`CertificateIdentity::UsernameAndGroups`], a Selkie extension for TokenReview webhooks
//! (kube-apiserver's own TokenReview gives every service account a UID).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use crate::{
    access_review::{AccessDecision, ResourceAttributes},
    chain::{Chain, TokenAuthenticator},
    identity::{CertificateIdentity, UserInfo, CREDENTIAL_ID_EXTRA},
    issuing::signer::ClientCertificateSigner,
    outcome::Outcome,
};
use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use selkie_api::{
    identity::{KubernetesUserInfo, UserInfo as ApiUserInfo, WhoAmIRequest, WhoAmIRequestStatus},
    login::{
        ClusterCredential, TokenCredentialRequest, TokenCredentialRequestStatus, TypedLocalObjectReference,
        AUTHENTICATION_FAILED,
    },
};
use tokio::sync::{watch, Notify};

/// How long an issued certificate is valid unless configured otherwise (Pinniped's
/// `clientCertificateTTL`).
pub const CLIENT_CERTIFICATE_TTL: Duration = Duration::from_secs(5 * 60);
/// The shortest configurable certificate lifetime: a client must be able to use a certificate
/// before it renews it.
pub const MIN_CLIENT_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(60);
/// The longest configurable certificate lifetime, a working day: a client certificate cannot be
/// revoked, so a user removed upstream keeps access until it expires.
pub const MAX_CLIENT_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// How far back an issued certificate's validity starts, for clock skew (Pinniped's
/// `certBackdate`).
pub const CLIENT_CERTIFICATE_BACKDATE: Duration = Duration::from_secs(5 * 60);
/// How long a TokenCredentialRequest waits at most for the preferred signer while it is pending
/// ([`SignerRefresh`]); it is then issued with whatever signer is installed.
pub const PREFERRED_SIGNER_WAIT: Duration = Duration::from_secs(3);

/// Answers the Concierge's login API. Runs once per TokenCredentialRequest that reaches the proxy
/// or the aggregated API server.
#[async_trait]
pub trait ConciergeApi: Send + Sync + std::fmt::Debug {
    /// Authenticates `request.spec.token` with the authenticator `request.spec.authenticator`
    /// names (among `chain`'s) and fills in `status`: a credential, or only
    /// `message: "authentication failed"`. The reference names an authenticator only when its
    /// `apiGroup` is exactly `authenticator_group` (`authentication.concierge.<suffix>`), as in
    /// Pinniped; a missing or other group is an unknown authenticator. Never fails as a whole.
    async fn token_credential_request(
        &self,
        chain: &Chain,
        authenticator_group: &str,
        request: TokenCredentialRequest,
    ) -> TokenCredentialRequest;
}

/// Asks kube-apiserver's authorizers whether a user may perform an action (a SubjectAccessReview),
/// for an authenticator's login authorization. Called once per TokenCredentialRequest of an
/// authenticated user through an authenticator that has one; any failure to get an answer is an
/// `Err` with its reason (the login is then refused: fail closed).
#[async_trait]
pub trait LoginAuthorizer: Send + Sync + std::fmt::Debug {
    /// kube-apiserver's decision on `user` doing `attributes`.
    async fn review(
        &self,
        user: &UserInfo,
        attributes: &ResourceAttributes,
    ) -> Result<AccessDecision, String>;
}

/// [`ConciergeApi`] with a signer CA: client certificates valid for [`CLIENT_CERTIFICATE_TTL`]
/// (or the configured lifetime), backdated 5 minutes, `CN=<user>`, one `O` per group. Without a
/// signer every request fails (fail closed), with the same opaque answer.
#[derive(Debug)]
pub struct SignerConciergeApi {
    signer: ArcSwapOption<ClientCertificateSigner>,
    refresh: SignerRefresh,
    lifetime: Duration,
    authorizer: ArcSwapOption<Box<dyn LoginAuthorizer>>,
}

impl Default for SignerConciergeApi {
    /// No signer yet; certificates valid for [`CLIENT_CERTIFICATE_TTL`].
    fn default() -> Self {
        Self {
            signer: ArcSwapOption::empty(),
            refresh: SignerRefresh::default(),
            lifetime: CLIENT_CERTIFICATE_TTL,
            authorizer: ArcSwapOption::empty(),
        }
    }
}

impl SignerConciergeApi {
    /// Issues with `signer`.
    pub fn new(signer: ClientCertificateSigner) -> Self {
        Self {
            signer: ArcSwapOption::from_pointee(signer),
            ..Self::default()
        }
    }

    /// The same API issuing certificates valid for `lifetime` (the caller keeps it within
    /// [`MIN_CLIENT_CERTIFICATE_LIFETIME`] and [`MAX_CLIENT_CERTIFICATE_LIFETIME`]).
    pub fn with_certificate_lifetime(self, lifetime: Duration) -> Self {
        Self { lifetime, ..self }
    }

    /// How long the certificates it issues are valid.
    pub fn certificate_lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Reviews the login authorization of authenticators that have one with `authorizer` from
    /// now on. Until one is installed, such logins are refused.
    pub fn set_login_authorizer(&self, authorizer: Box<dyn LoginAuthorizer>) {
        self.authorizer.store(Some(Arc::new(authorizer)));
    }

    /// Whether `user` may log in through an authenticator requiring `attributes`: `Ok(())`, or
    /// why not (for the audit line; never shown to the client).
    async fn authorize(&self, user: &UserInfo, attributes: &ResourceAttributes) -> Result<(), String> {
        let Some(authorizer) = self.authorizer.load_full() else {
            return Err("no SubjectAccessReview client is configured".into());
        };
        // The review asks about the user the certificate will name, as kube-apiserver will see it:
        // the username and groups (a certificate carries no UID or extras), and the group
        // kube-apiserver adds to every authenticated user.
        let mut reviewed = UserInfo {
            username: user.username.clone(),
            groups: user.groups.clone(),
            ..UserInfo::default()
        };
        if !reviewed.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            reviewed.groups.push(AUTHENTICATED_GROUP.to_string());
        }
        match authorizer.review(&reviewed, attributes).await {
            Ok(AccessDecision::Allowed) => Ok(()),
            Ok(AccessDecision::Denied { reason }) if reason.is_empty() => Err(format!(
                "not allowed to {} {}",
                attributes.verb,
                describe(attributes)
            )),
            Ok(AccessDecision::Denied { reason }) => Err(format!(
                "not allowed to {} {}: {reason}",
                attributes.verb,
                describe(attributes)
            )),
            Err(error) => Err(format!("the SubjectAccessReview failed: {error}")),
        }
    }

    /// The seam to the loop that installs the signer: it says when a better signer is pending
    /// and runs the rounds requests wait for. Nothing is pending unless that loop says so.
    pub fn refresh(&self) -> &SignerRefresh {
        &self.refresh
    }

    /// Issues with `signer` from now on (`None`: refuse every request). Requests already signing
    /// finish with the signer they loaded.
    pub fn set_signer(&self, signer: Option<Arc<ClientCertificateSigner>>) {
        self.signer.store(signer);
    }

    /// The signer in use, if any.
    pub fn signer(&self) -> Option<Arc<ClientCertificateSigner>> {
        self.signer.load_full()
    }

    /// A certificate for `user` from the installed signer; first, while the preferred signer is
    /// pending, waits (bounded) for the signing loop to install it.
    async fn issue(&self, user: &UserInfo) -> Option<ClusterCredential> {
        if self.refresh.is_pending() {
            let settled = self.refresh.wait_while_pending().await;
            tracing::debug!(
                settled,
                "waited for the signing loop before issuing a client certificate"
            );
        }
        let Some(signer) = self.signer.load_full() else {
            tracing::warn!("no client certificate signer is available; the login is refused");
            return None;
        };
        let now = SystemTime::now();
        let expires = now + self.lifetime;
        let issued = signer
            .issue(
                &user.username,
                &user.groups,
                now - CLIENT_CERTIFICATE_BACKDATE,
                expires,
            )
            .map_err(|error| tracing::warn!(%error, "issuing a client certificate failed"))
            .ok()?;
        Some(ClusterCredential {
            expiration_timestamp: rfc3339(expires)?,
            token: String::new(),
            client_certificate_data: issued.cert_pem,
            client_key_data: issued.key_pem,
        })
    }
}

/// The signing loop's rounds as waiting requests see them.
#[derive(Debug, Clone, Copy, Default)]
struct Rounds {
    /// Rounds ended so far.
    finished: u64,
    /// Whether the preferred signer is pending (as last set).
    pending: bool,
}

/// The seam between the login API and the loop that installs its signer (the control plane's
/// `selkie_control_plane::signing`), so that a request does not get a certificate of the
/// fallback signer a moment before the preferred one arrives.
///
/// The loop marks the preferred signer *pending* ([`set_pending`](Self::set_pending),
/// [`end_round`](Self::end_round)) while it is configured, not installed, and expected shortly
/// (its last read failed in a way that clears by itself within seconds). A request that is about
/// to be issued a certificate then calls [`wait_while_pending`](Self::wait_while_pending): it
/// asks the loop for a round now ([`requested`](Self::requested)) and waits until a round ends
/// with the signer no longer pending (installed, or failing for a lasting reason), for at most
/// [`PREFERRED_SIGNER_WAIT`]. The requests waiting at once share the rounds (an ask is stored
/// once, however many requests make it); how often rounds run is the loop's decision. When
/// nothing is pending (the normal case: the preferred signer is installed, not configured, or
/// failing for a lasting reason) a request only reads an atomic flag.
#[derive(Debug)]
pub struct SignerRefresh {
    /// What [`Rounds::pending`] says, read without a lock on every request.
    pending: AtomicBool,
    /// A request's ask for a round; asks coalesce (at most one is stored).
    requested: Notify,
    /// The rounds, for the requests waiting for one.
    rounds: watch::Sender<Rounds>,
    /// How long a request waits at most.
    wait: Duration,
}

impl Default for SignerRefresh {
    /// Nothing pending, no round run yet, requests wait [`PREFERRED_SIGNER_WAIT`] at most.
    fn default() -> Self {
        Self {
            pending: AtomicBool::new(false),
            requested: Notify::new(),
            rounds: watch::Sender::new(Rounds::default()),
            wait: PREFERRED_SIGNER_WAIT,
        }
    }
}

impl SignerRefresh {
    /// Whether the preferred signer is pending: one atomic load, on every request.
    pub fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Marks the preferred signer pending or not, outside a round: when the loop starts (the
    /// first round's outcome is not known yet), and `false` when it stops (no request may wait
    /// for rounds that will never come). Waiting requests are released when it becomes `false`.
    pub fn set_pending(&self, pending: bool) {
        self.pending.store(pending, Ordering::Release);
        self.rounds.send_if_modified(|rounds| {
            let changed = rounds.pending != pending;
            rounds.pending = pending;
            changed
        });
    }

    /// Called by the loop as a round ends, after it has installed the signer the round read:
    /// `pending` says whether the preferred signer is still pending. When it is not, the waiting
    /// requests go on, with the signer installed now.
    pub fn end_round(&self, pending: bool) {
        self.pending.store(pending, Ordering::Release);
        self.rounds.send_modify(|rounds| {
            rounds.finished += 1;
            rounds.pending = pending;
        });
    }

    /// Completes once a request has asked for a round since the last time it completed (at once
    /// if one asked in between; several asks count as one). The loop decides when to run it.
    pub async fn requested(&self) {
        self.requested.notified().await;
    }

    /// How many rounds have ended (for tests and diagnostics).
    pub fn finished_rounds(&self) -> u64 {
        self.rounds.borrow().finished
    }

    /// Asks for a round and waits until the preferred signer is no longer pending, for at most
    /// [`PREFERRED_SIGNER_WAIT`]. Returns whether it stopped being pending in time (`false`: the
    /// bound passed, and the caller goes on with the signer installed). Returns at once when
    /// nothing is pending. Never fails.
    pub async fn wait_while_pending(&self) -> bool {
        let mut rounds = self.rounds.subscribe();
        if !rounds.borrow_and_update().pending {
            return true;
        }
        self.requested.notify_one();
        let settled = rounds.wait_for(|rounds| !rounds.pending);
        tokio::time::timeout(self.wait, settled)
            .await
            .is_ok_and(|settled| settled.is_ok())
    }
}

/// Whether a certificate can say everything about `user` (CN and O only): no UID, no extras
/// but the credential id, and a name.
fn certificate_can_carry(user: &UserInfo) -> bool {
    !user.username.is_empty() && user.uid.is_none() && user.extra.keys().all(|key| key == CREDENTIAL_ID_EXTRA)
}

/// Whether `user` may be issued a certificate under `policy`, and whether that certificate
/// leaves out a UID or extras the identity has.
fn certificate_decision(user: &UserInfo, policy: CertificateIdentity) -> Option<bool> {
    if certificate_can_carry(user) {
        return Some(false);
    }
    (policy == CertificateIdentity::UsernameAndGroups && !user.username.is_empty()).then_some(true)
}

/// The chain's authenticator a TokenCredentialRequest names: the API group must be
/// `authenticator_group`, and kind and name must both match. Only the authenticators of custom
/// resources can be named ([`Chain::token_authenticators`]): the chain's implicit one (the proxy's
/// TokenReview against kube-apiserver, [`Chain::implicit`]) is not among them, whatever its name,
/// so a login can never get a certificate for a token only kube-apiserver accepts.
fn named<'a>(
    chain: &'a Chain,
    authenticator_group: &str,
    reference: &TypedLocalObjectReference,
) -> Option<&'a TokenAuthenticator> {
    if reference.api_group.as_deref() != Some(authenticator_group) {
        return None;
    }
    let (kind, name) = (reference.kind.as_str(), reference.name.as_str());
    chain.token_authenticators().iter().find(|authenticator| {
        let kind_matches = match authenticator {
            TokenAuthenticator::Jwt(_) => kind == "JWTAuthenticator",
            TokenAuthenticator::TokenReview(_) => kind == "WebhookAuthenticator",
        };
        kind_matches && &**authenticator.name() == name
    })
}

#[async_trait]
impl ConciergeApi for SignerConciergeApi {
    async fn token_credential_request(
        &self,
        chain: &Chain,
        authenticator_group: &str,
        mut request: TokenCredentialRequest,
    ) -> TokenCredentialRequest {
        let reference = &request.spec.authenticator;
        let (outcome, policy, login_authorization) = match named(chain, authenticator_group, reference) {
            Some(authenticator) if !request.spec.token.is_empty() => (
                authenticator.authenticate(&request.spec.token).await,
                authenticator.certificate_identity(),
                authenticator.login_authorization().cloned(),
            ),
            _ => (Outcome::NotMine, CertificateIdentity::Exact, None),
        };
        // 1. Authenticated; 2. a certificate can say who the user is; 3. the login
        // authorization, if any, allows that user; 4. issued.
        let mut refused = None;
        let (credential, omitted_uid_and_extra) = match &outcome {
            Outcome::Authenticated(identity) => match certificate_decision(&identity.user, policy) {
                Some(omits) => {
                    if let Some(attributes) = &login_authorization {
                        refused = self.authorize(&identity.user, attributes).await.err();
                    }
                    match refused {
                        None => (self.issue(&identity.user).await, omits),
                        Some(_) => (None, false),
                    }
                }
                None => (None, false),
            },
            _ => (None, false),
        };
        tracing::info!(
            target: "selkie::audit",
            authenticator = %reference.name,
            user = match &outcome {
                Outcome::Authenticated(identity) => identity.user.username.as_str(),
                _ => "",
            },
            issued = credential.is_some(),
            omitted_uid_and_extra = omitted_uid_and_extra && credential.is_some(),
            login_refused = refused.as_deref().unwrap_or_default(),
            "token credential request"
        );
        request.status = match credential {
            Some(credential) => TokenCredentialRequestStatus {
                credential: Some(credential),
                message: None,
            },
            None => TokenCredentialRequestStatus {
                credential: None,
                message: Some(AUTHENTICATION_FAILED.to_string()),
            },
        };
        request.spec.token.clear();
        request
    }
}

/// The group kube-apiserver adds to every authenticated user.
const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// `resource.group[/name]`, as RBAC names what a review asks about.
fn describe(attributes: &ResourceAttributes) -> String {
    let mut described = attributes.resource.clone();
    if !attributes.group.is_empty() {
        described = format!("{described}.{}", attributes.group);
    }
    if !attributes.name.is_empty() {
        described = format!("{described}/{}", attributes.name);
    }
    described
}

/// The WhoAmIRequest answer for `user`.
pub fn who_am_i(mut request: WhoAmIRequest, user: &UserInfo) -> WhoAmIRequest {
    request.status = WhoAmIRequestStatus {
        kubernetes_user_info: KubernetesUserInfo {
            user: ApiUserInfo {
                username: user.username.clone(),
                uid: user.uid.clone().unwrap_or_default(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
            },
        },
    };
    request
}

/// `time` as RFC 3339 in UTC, whole seconds (`metav1.Time`).
fn rfc3339(time: SystemTime) -> Option<String> {
    let time = time::OffsetDateTime::from(time).replace_nanosecond(0).ok()?;
    time.format(&time::format_description::well_known::Rfc3339).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_users_a_certificate_can_describe_get_one() {
        let mut user = UserInfo {
            username: "alice".into(),
            groups: vec!["devs".into()],
            ..UserInfo::default()
        };
        assert!(certificate_can_carry(&user));
        user.extra
            .insert(CREDENTIAL_ID_EXTRA.into(), vec!["JTI=1".into()]);
        assert!(certificate_can_carry(&user));
        user.extra.insert("scopes".into(), vec!["view".into()]);
        assert!(!certificate_can_carry(&user));
        user.extra.clear();
        user.uid = Some("42".into());
        assert!(!certificate_can_carry(&user));
        assert!(!certificate_can_carry(&UserInfo::default()));
    }

    #[test]
    fn only_an_authenticator_configured_for_it_gets_certificates_without_uid_and_extras() {
        let mut service_account = UserInfo {
            username: "system:serviceaccount:ci:robot".into(),
            uid: Some("8d4c0c8e".into()),
            groups: vec!["system:serviceaccounts".into()],
            ..UserInfo::default()
        };
        service_account.extra.insert(
            "authentication.kubernetes.io/pod-name".into(),
            vec!["runner".into()],
        );
        assert_eq!(
            certificate_decision(&service_account, CertificateIdentity::Exact),
            None
        );
        assert_eq!(
            certificate_decision(&service_account, CertificateIdentity::UsernameAndGroups),
            Some(true)
        );
        // Nothing left out: issued under either policy, and not reported as trimmed.
        let plain = UserInfo {
            username: "alice".into(),
            ..UserInfo::default()
        };
        for policy in [CertificateIdentity::Exact, CertificateIdentity::UsernameAndGroups] {
            assert_eq!(certificate_decision(&plain, policy), Some(false));
        }
        // A nameless identity never gets a certificate.
        let nameless = UserInfo {
            uid: Some("1".into()),
            ..UserInfo::default()
        };
        assert_eq!(
            certificate_decision(&nameless, CertificateIdentity::UsernameAndGroups),
            None
        );
    }

    #[test]
    fn a_reference_names_an_authenticator_only_in_the_authentication_group() {
        crate::test_util::install_provider();
        let webhook = crate::tokenreview::TokenReviewAuthenticator::new(
            crate::tokenreview::TokenReviewConfig::new("corp", "https://127.0.0.1:1/review"),
        )
        .unwrap();
        let chain = Chain::new(vec![TokenAuthenticator::TokenReview(Arc::new(webhook))]);
        let group = "authentication.concierge.acme.example.com";
        let reference = |api_group: Option<&str>, kind: &str| TypedLocalObjectReference {
            api_group: api_group.map(str::to_string),
            kind: kind.into(),
            name: "corp".into(),
        };
        assert!(named(&chain, group, &reference(Some(group), "WebhookAuthenticator")).is_some());
        for (api_group, kind) in [
            (None, "WebhookAuthenticator"),
            (Some(""), "WebhookAuthenticator"),
            (
                Some("authentication.concierge.pinniped.dev"),
                "WebhookAuthenticator",
            ),
            (
                Some("authentication.concierge.acme.example.com "),
                "WebhookAuthenticator",
            ),
            (
                Some("AUTHENTICATION.concierge.acme.example.com"),
                "WebhookAuthenticator",
            ),
            (Some("example.com"), "WebhookAuthenticator"),
            (Some(group), "JWTAuthenticator"),
        ] {
            assert!(
                named(&chain, group, &reference(api_group, kind)).is_none(),
                "{api_group:?} {kind}"
            );
        }
    }

    #[test]
    fn the_implicit_authenticator_cannot_be_named() {
        crate::test_util::install_provider();
        let reviewer = |name: &str| {
            TokenAuthenticator::TokenReview(Arc::new(
                crate::tokenreview::TokenReviewAuthenticator::new(
                    crate::tokenreview::TokenReviewConfig::new(name, "https://127.0.0.1:1/review"),
                )
                .unwrap(),
            ))
        };
        let group = "authentication.concierge.pinniped.dev";
        let reference = |name: &str| TypedLocalObjectReference {
            api_group: Some(group.into()),
            kind: "WebhookAuthenticator".into(),
            name: name.into(),
        };
        let chain = Chain::new(vec![]).with_implicit(reviewer("kube-apiserver"));
        assert!(named(&chain, group, &reference("kube-apiserver")).is_none());
        // A WebhookAuthenticator of that name is named, never the implicit one.
        let chain = Chain::new(vec![reviewer("kube-apiserver")]).with_implicit(reviewer("kube-apiserver"));
        let found = named(&chain, group, &reference("kube-apiserver")).unwrap();
        let (TokenAuthenticator::TokenReview(found), Some(TokenAuthenticator::TokenReview(implicit))) =
            (found, chain.implicit())
        else {
            panic!("not TokenReview authenticators")
        };
        assert!(!Arc::ptr_eq(found, implicit));
    }

    /// The authenticators' API group the tests use.
    const GROUP: &str = "authentication.concierge.pinniped.dev";

    /// A P-256 CA whose certificate's subject is `CN=<name>`, as a signer.
    fn signer(name: &str) -> Arc<ClientCertificateSigner> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Arc::new(ClientCertificateSigner::from_pem(&cert.pem(), &key.serialize_pem()).unwrap())
    }

    /// A chain with one JWT authenticator (`jwt`, keys installed, no issuer to reach) and a
    /// TokenCredentialRequest naming it with a valid token for `alice`.
    fn chain_and_request() -> (Chain, TokenCredentialRequest) {
        chain_and_request_with(None)
    }

    /// [`chain_and_request`] with the authenticator's login authorization.
    fn chain_and_request_with(
        login_authorization: Option<ResourceAttributes>,
    ) -> (Chain, TokenCredentialRequest) {
        use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64URL, Engine as _};
        use ring::{
            rand::SystemRandom,
            signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING},
        };
        use selkie_api::login::TokenCredentialRequestSpec;
        use serde_json::json;

        crate::test_util::install_provider();
        let issuer = "https://issuer.example";
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let point = key.public_key().as_ref();
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "k", "use": "sig", "alg": "ES256",
                         "x": B64URL.encode(&point[1..33]), "y": B64URL.encode(&point[33..65])});
        let mut config = crate::jwt::JwtConfig::new("jwt", issuer, "selkie");
        config.ca_bundle_pem = Some(crate::test_util::unrelated_ca_pem());
        config.login_authorization = login_authorization;
        let jwt = crate::jwt::JwtAuthenticator::new(config).unwrap();
        jwt.install_keys(json!({"keys": [jwk]}).to_string().as_bytes())
            .unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = json!({"alg": "ES256", "kid": "k", "typ": "JWT"});
        let claims = json!({"iss": issuer, "aud": "selkie", "sub": "alice", "username": "alice",
                            "iat": now, "nbf": now, "exp": now + 3600});
        let signed = format!(
            "{}.{}",
            B64URL.encode(header.to_string()),
            B64URL.encode(claims.to_string())
        );
        let signature = key.sign(&rng, signed.as_bytes()).unwrap();
        let request = TokenCredentialRequest {
            spec: TokenCredentialRequestSpec {
                token: format!("{signed}.{}", B64URL.encode(signature.as_ref())),
                authenticator: TypedLocalObjectReference {
                    api_group: Some(GROUP.into()),
                    kind: "JWTAuthenticator".into(),
                    name: "jwt".into(),
                },
            },
            ..TokenCredentialRequest::default()
        };
        (Chain::new(vec![TokenAuthenticator::Jwt(Arc::new(jwt))]), request)
    }

    /// The issuer (`CN=<name>`) of the certificate `answer` carries.
    fn issuer(answer: &TokenCredentialRequest) -> String {
        use x509_cert::der::DecodePem as _;
        let credential = answer
            .status
            .credential
            .as_ref()
            .unwrap_or_else(|| panic!("no credential: {:?}", answer.status.message));
        let certificate = x509_cert::Certificate::from_pem(&credential.client_certificate_data).unwrap();
        certificate.tbs_certificate.issuer.to_string()
    }

    /// An API issuing with the signer CA `CN=signer CA`, the cluster's key pending.
    fn api_with_the_key_pending() -> Arc<SignerConciergeApi> {
        let api = SignerConciergeApi::default();
        api.set_signer(Some(signer("signer CA")));
        api.refresh().set_pending(true);
        Arc::new(api)
    }

    /// Plays the signing loop: runs a round when asked (or, with `cadence`, at least that
    /// often, as the loop's own retries), whose outcomes are `outcomes` in turn (the signer to
    /// install, if any, and whether the preferred signer is then still pending). Returns how
    /// many rounds ran.
    fn fake_loop(
        api: &Arc<SignerConciergeApi>,
        cadence: Option<Duration>,
        outcomes: Vec<(Option<Arc<ClientCertificateSigner>>, bool)>,
    ) -> tokio::task::JoinHandle<usize> {
        let api = api.clone();
        tokio::spawn(async move {
            let mut rounds = 0;
            for (install, pending) in outcomes {
                match cadence {
                    Some(cadence) => tokio::select! {
                        () = api.refresh().requested() => {}
                        () = tokio::time::sleep(cadence) => {}
                    },
                    None => api.refresh().requested().await,
                }
                rounds += 1;
                if let Some(signer) = install {
                    api.set_signer(Some(signer));
                }
                api.refresh().end_round(pending);
            }
            rounds
        })
    }

    #[tokio::test]
    async fn a_request_while_the_cluster_key_is_pending_is_issued_by_it_once_a_round_installs_it() {
        let (chain, request) = chain_and_request();
        let api = api_with_the_key_pending();
        // The round the request asks for finds the key "not yet" (the agent pod is starting);
        // the loop's next retry has it.
        let rounds = fake_loop(
            &api,
            Some(Duration::from_millis(20)),
            vec![(None, true), (Some(signer("cluster CA")), false)],
        );
        let answer = api.token_credential_request(&chain, GROUP, request).await;
        assert_eq!(issuer(&answer), "CN=cluster CA");
        assert_eq!(rounds.await.unwrap(), 2);
        assert!(!api.refresh().is_pending());
    }

    #[tokio::test]
    async fn requests_waiting_at_once_share_one_round() {
        let (chain, request) = chain_and_request();
        let api = api_with_the_key_pending();
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let (api, chain, request) = (api.clone(), chain.clone(), request.clone());
                tokio::spawn(async move { api.token_credential_request(&chain, GROUP, request).await })
            })
            .collect();
        // Every request has asked before the loop looks: one stored ask, one round for all.
        while api.refresh().rounds.receiver_count() < waiting.len() {
            tokio::task::yield_now().await;
        }
        let rounds = fake_loop(&api, None, vec![(Some(signer("cluster CA")), false)]);
        for answer in waiting {
            assert_eq!(issuer(&answer.await.unwrap()), "CN=cluster CA");
        }
        assert_eq!(rounds.await.unwrap(), 1);
        assert_eq!(api.refresh().finished_rounds(), 1);
    }

    #[tokio::test]
    async fn with_nothing_pending_a_request_asks_for_no_round_and_does_not_wait() {
        let (chain, request) = chain_and_request();
        let api = api_with_the_key_pending();
        // As after a lasting failure (no kube-controller-manager pod) or with no key configured.
        api.refresh().set_pending(false);
        let rounds = fake_loop(&api, None, vec![(Some(signer("cluster CA")), false)]);
        let started = tokio::time::Instant::now();
        let answer = api.token_credential_request(&chain, GROUP, request).await;
        assert_eq!(issuer(&answer), "CN=signer CA");
        assert!(
            started.elapsed() < PREFERRED_SIGNER_WAIT / 3,
            "answered in {:?}",
            started.elapsed()
        );
        // No round was asked for: the loop still waits for its first ask.
        tokio::task::yield_now().await;
        assert!(!rounds.is_finished());
        assert_eq!(api.refresh().finished_rounds(), 0);
        rounds.abort();
    }

    #[tokio::test]
    async fn a_key_that_does_not_come_in_time_leaves_the_installed_signer() {
        let (chain, request) = chain_and_request();
        let mut api = SignerConciergeApi::default();
        api.set_signer(Some(signer("signer CA")));
        api.refresh.wait = Duration::from_millis(100);
        let api = Arc::new(api);
        api.refresh().set_pending(true);
        // Every round finds the key "not yet": the request goes on after the bound.
        let rounds = fake_loop(&api, Some(Duration::from_millis(10)), vec![(None, true); 1000]);
        let started = tokio::time::Instant::now();
        let answer = api.token_credential_request(&chain, GROUP, request).await;
        assert_eq!(issuer(&answer), "CN=signer CA");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took < PREFERRED_SIGNER_WAIT,
            "{took:?}"
        );
        assert!(api.refresh().is_pending());
        // The loop stops: nothing is pending any more, so nothing waits.
        rounds.abort();
        api.refresh().set_pending(false);
        assert!(api.refresh().wait_while_pending().await);
    }

    #[tokio::test]
    async fn certificates_live_five_minutes_or_the_configured_lifetime() {
        use x509_cert::der::DecodePem as _;
        for (api, lifetime) in [
            (SignerConciergeApi::default(), CLIENT_CERTIFICATE_TTL),
            (
                SignerConciergeApi::default().with_certificate_lifetime(Duration::from_secs(3600)),
                Duration::from_secs(3600),
            ),
        ] {
            assert_eq!(api.certificate_lifetime(), lifetime);
            api.set_signer(Some(signer("signer CA")));
            let (chain, request) = chain_and_request();
            let before = SystemTime::now();
            let answer = api.token_credential_request(&chain, GROUP, request).await;
            let credential = answer.status.credential.expect("a credential");
            let leaf = x509_cert::Certificate::from_pem(&credential.client_certificate_data).unwrap();
            let validity = &leaf.tbs_certificate.validity;
            let (from, to) = (
                validity.not_before.to_system_time(),
                validity.not_after.to_system_time(),
            );
            assert_eq!(
                to.duration_since(from).unwrap(),
                lifetime + CLIENT_CERTIFICATE_BACKDATE
            );
            // The expiry the client caches is the certificate's own (second precision).
            let expected = rfc3339(to).unwrap();
            assert_eq!(credential.expiration_timestamp, expected);
            let ahead = to.duration_since(before).unwrap();
            assert!(
                ahead <= lifetime && ahead + Duration::from_secs(5) >= lifetime,
                "{ahead:?}"
            );
        }
    }

    /// Answers as RBAC would for one grant: `allowed` (username or group) may do anything; it
    /// records every user it is asked about. `None` fails every review.
    #[derive(Debug)]
    struct Rbac {
        allowed: Option<&'static str>,
        asked: Arc<std::sync::Mutex<Vec<UserInfo>>>,
    }

    #[async_trait]
    impl LoginAuthorizer for Rbac {
        async fn review(
            &self,
            user: &UserInfo,
            attributes: &ResourceAttributes,
        ) -> Result<AccessDecision, String> {
            assert_eq!(attributes.verb, "login");
            self.asked.lock().unwrap().push(user.clone());
            let allowed = self.allowed.ok_or("connection refused")?;
            Ok(
                if user.username == allowed || user.groups.iter().any(|g| g == allowed) {
                    AccessDecision::Allowed
                } else {
                    AccessDecision::Denied {
                        reason: String::new(),
                    }
                },
            )
        }
    }

    #[tokio::test]
    async fn a_login_authorization_issues_only_to_users_kube_apiserver_allows() {
        let rule = ResourceAttributes {
            verb: "login".into(),
            group: "login.concierge.pinniped.dev".into(),
            resource: "tokencredentialrequests".into(),
            ..ResourceAttributes::default()
        };
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        for (authorizer, issued) in [
            // No client to ask: refused (fail closed).
            (None, false),
            (Some(None), false),
            (Some(Some("bob")), false),
            (Some(Some("alice")), true),
            // The group every authenticated user has counts, as it does in kube-apiserver.
            (Some(Some("system:authenticated")), true),
        ] {
            let api = SignerConciergeApi::default();
            api.set_signer(Some(signer("signer CA")));
            if let Some(allowed) = authorizer {
                api.set_login_authorizer(Box::new(Rbac {
                    allowed,
                    asked: asked.clone(),
                }));
            }
            let (chain, request) = chain_and_request_with(Some(rule.clone()));
            let answer = api.token_credential_request(&chain, GROUP, request).await;
            assert_eq!(answer.status.credential.is_some(), issued, "{authorizer:?}");
            if !issued {
                assert_eq!(answer.status.message.as_deref(), Some(AUTHENTICATION_FAILED));
            }
        }
        let asked = std::mem::take(&mut *asked.lock().unwrap());
        assert_eq!(asked.len(), 4);
        // Asked about the user the certificate names: username and groups, no UID or extras.
        assert!(asked.iter().all(|user| user.username == "alice"
            && user.groups.contains(&"system:authenticated".to_string())
            && user.uid.is_none()
            && user.extra.is_empty()));

        // Without a rule nobody is asked.
        let api = SignerConciergeApi::default();
        api.set_signer(Some(signer("signer CA")));
        api.set_login_authorizer(Box::new(Rbac {
            allowed: Some("nobody"),
            asked: Arc::new(std::sync::Mutex::new(Vec::new())),
        }));
        let (chain, request) = chain_and_request();
        assert!(api
            .token_credential_request(&chain, GROUP, request)
            .await
            .status
            .credential
            .is_some());
    }

    #[test]
    fn refusals_name_the_action() {
        let attributes = ResourceAttributes {
            verb: "login".into(),
            group: "login.concierge.pinniped.dev".into(),
            resource: "tokencredentialrequests".into(),
            name: "dex".into(),
            ..ResourceAttributes::default()
        };
        assert_eq!(
            describe(&attributes),
            "tokencredentialrequests.login.concierge.pinniped.dev/dex"
        );
        let core = ResourceAttributes {
            verb: "get".into(),
            resource: "pods".into(),
            ..ResourceAttributes::default()
        };
        assert_eq!(describe(&core), "pods");
    }

    #[test]
    fn expiry_reads_as_metav1_time() {
        let time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_500);
        assert_eq!(rfc3339(time).unwrap(), "2026-11-18T11:06:40Z");
    }
}
