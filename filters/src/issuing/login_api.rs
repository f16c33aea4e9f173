//! The Concierge's login API — TokenCredentialRequest and WhoAmIRequest — as one piece of logic
//! that both front ends serve: the impersonation proxy (so a client that reaches only the proxy
//! can log in and ask who it is) and the control plane's aggregated API server (reached through
//! kube-apiserver).
//!
//! [`ConciergeApi`] is the seam; [`SignerConciergeApi`] implements it with the chain's
//! authenticators and a [`ClientCertificateSigner`] that can be swapped while serving (the
//! control plane installs the cluster's signing key when it has it, else its own signer CA).
//! It answers as Pinniped's aggregated API does: a failed login is still `201 Created`, with
//! `status.message: "authentication failed"` and no detail, and identities with a UID or extras
//! are refused (a client certificate cannot carry them) — unless the authenticator is configured
//! with [`CertificateIdentity::UsernameAndGroups`], a Selkie extension for TokenReview webhooks
//! (kube-apiserver's own TokenReview gives every service account a UID).

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::{
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

/// How long an issued certificate is valid (Pinniped's `clientCertificateTTL`).
pub const CLIENT_CERTIFICATE_TTL: Duration = Duration::from_secs(5 * 60);
/// How far back an issued certificate's validity starts, for clock skew (Pinniped's
/// `certBackdate`).
pub const CLIENT_CERTIFICATE_BACKDATE: Duration = Duration::from_secs(5 * 60);

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

/// [`ConciergeApi`] with a signer CA: 5-minute client certificates, backdated 5 minutes,
/// `CN=<user>`, one `O` per group. Without a signer every request fails (fail closed), with
/// the same opaque answer.
#[derive(Debug, Default)]
pub struct SignerConciergeApi {
    signer: ArcSwapOption<ClientCertificateSigner>,
}

impl SignerConciergeApi {
    /// Issues with `signer`.
    pub fn new(signer: ClientCertificateSigner) -> Self {
        Self {
            signer: ArcSwapOption::from_pointee(signer),
        }
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

    fn issue(&self, user: &UserInfo) -> Option<ClusterCredential> {
        let Some(signer) = self.signer.load_full() else {
            tracing::warn!("no client certificate signer is available; the login is refused");
            return None;
        };
        let now = SystemTime::now();
        let expires = now + CLIENT_CERTIFICATE_TTL;
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
/// `authenticator_group`, and kind and name must both match.
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
        let (outcome, policy) = match named(chain, authenticator_group, reference) {
            Some(authenticator) if !request.spec.token.is_empty() => (
                authenticator.authenticate(&request.spec.token).await,
                authenticator.certificate_identity(),
            ),
            _ => (Outcome::NotMine, CertificateIdentity::Exact),
        };
        let (credential, omitted_uid_and_extra) = match &outcome {
            Outcome::Authenticated(identity) => match certificate_decision(&identity.user, policy) {
                Some(omits) => (self.issue(&identity.user), omits),
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
    fn expiry_reads_as_metav1_time() {
        let time = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_500);
        assert_eq!(rfc3339(time).unwrap(), "2026-11-18T11:06:40Z");
    }
}
