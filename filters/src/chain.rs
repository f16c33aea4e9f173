//! The chain: authenticators run in a configured order, built once and swapped whole.
//!
//! Besides the authenticators a TokenCredentialRequest may name (Pinniped's JWTAuthenticator and
//! WebhookAuthenticator), a chain may end with one *implicit* authenticator
//! ([`Chain::with_implicit`]): the impersonation proxy's TokenReview against kube-apiserver itself
//! (Pinniped's delegating authenticator), which accepts the tokens the cluster accepts, such as
//! service-account tokens. It is tried last and is no custom resource, so no TokenCredentialRequest
//! can name it ([`Chain::token_authenticators`] leaves it out).

use std::sync::Arc;

use crate::{
    access_review::ResourceAttributes,
    identity::{CertificateIdentity, Credential, Identity},
    jwt::JwtAuthenticator,
    outcome::{Outcome, RejectReason},
    tokenreview::TokenReviewAuthenticator,
};

/// Bearer tokens longer than this are refused before any authenticator sees them.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A bearer-token authenticator of the chain. An enum rather than a trait object: dispatch is
/// static and the per-request path allocates nothing for it. Cloning shares the authenticator
/// (its key set and result cache): a control plane that rebuilds the chain when one
/// authenticator changes keeps the others warm.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TokenAuthenticator {
    /// JWTs from one issuer.
    Jwt(Arc<JwtAuthenticator>),
    /// A TokenReview webhook, or kube-apiserver's own TokenReview (pass-through).
    TokenReview(Arc<TokenReviewAuthenticator>),
}

impl TokenAuthenticator {
    /// The authenticator's configured name.
    pub fn name(&self) -> &Arc<str> {
        match self {
            Self::Jwt(authenticator) => authenticator.name(),
            Self::TokenReview(authenticator) => authenticator.name(),
        }
    }

    /// The action a user must be allowed (a SubjectAccessReview) to get a TokenCredentialRequest's
    /// certificate through this authenticator; `None`: authentication is enough.
    pub fn login_authorization(&self) -> Option<&ResourceAttributes> {
        match self {
            Self::Jwt(authenticator) => authenticator.login_authorization(),
            Self::TokenReview(authenticator) => authenticator.login_authorization(),
        }
    }

    /// What a TokenCredentialRequest's client certificate may leave out of this authenticator's
    /// identities: configurable for TokenReview webhooks, always [`CertificateIdentity::Exact`]
    /// for JWT authenticators (whose UID and extras come only from claim mappings the
    /// administrator writes).
    pub fn certificate_identity(&self) -> CertificateIdentity {
        match self {
            Self::Jwt(_) => CertificateIdentity::Exact,
            Self::TokenReview(authenticator) => authenticator.certificate_identity(),
        }
    }

    /// Authenticates one token.
    pub async fn authenticate(&self, token: &str) -> Outcome {
        match self {
            Self::Jwt(authenticator) => authenticator.authenticate(token).await,
            Self::TokenReview(authenticator) => authenticator.authenticate(token).await,
        }
    }
}

/// The chain's verdict on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Authenticated.
    Authenticated(Arc<Identity>),
    /// No credential was presented. What an anonymous caller may reach is the caller's policy
    /// (the proxy allows only TokenCredentialRequest and WhoAmIRequest).
    Anonymous,
    /// A credential was presented and no authenticator accepted it. Each refusal is listed with
    /// the authenticator's name, for the audit log; the client is only told "Unauthorized".
    Unauthenticated(Vec<(Arc<str>, RejectReason)>),
}

/// Immutable once built; replace the whole chain (through an `ArcSwap`) to reconfigure. Cloning
/// shares the authenticators.
#[derive(Debug, Default, Clone)]
pub struct Chain {
    token_authenticators: Vec<TokenAuthenticator>,
    /// Tried after `token_authenticators`; never named by a TokenCredentialRequest.
    implicit: Option<TokenAuthenticator>,
}

impl Chain {
    /// A chain trying `token_authenticators` in this order.
    pub fn new(token_authenticators: Vec<TokenAuthenticator>) -> Self {
        Self {
            token_authenticators,
            implicit: None,
        }
    }

    /// This chain ending with `authenticator`, tried after every other one, for bearer tokens
    /// only, and never named by a TokenCredentialRequest (see the module documentation).
    /// Replaces an implicit authenticator the chain had.
    pub fn with_implicit(mut self, authenticator: TokenAuthenticator) -> Self {
        self.implicit = Some(authenticator);
        self
    }

    /// The token authenticators a TokenCredentialRequest may name, in order: not the implicit
    /// one ([`Chain::implicit`]).
    pub fn token_authenticators(&self) -> &[TokenAuthenticator] {
        &self.token_authenticators
    }

    /// The implicit authenticator, tried last, if the chain has one.
    pub fn implicit(&self) -> Option<&TokenAuthenticator> {
        self.implicit.as_ref()
    }

    /// Decides who presented `credential`.
    ///
    /// A verified client certificate is authenticated as the identity extracted at handshake. A
    /// bearer token goes to each token authenticator in order, the implicit one last: the first
    /// to authenticate it wins;
    /// one that answers "not mine" or refuses it lets the next try (like kube-apiserver's union
    /// authenticator), and if none accepts it the refusals are returned. An empty or oversized
    /// token is refused without asking anyone.
    pub async fn authenticate(&self, credential: Credential<'_>) -> Decision {
        let token = match credential {
            Credential::Certificate(identity) => return Decision::Authenticated(identity.clone()),
            Credential::Anonymous => return Decision::Anonymous,
            Credential::BearerToken(token) => token,
        };
        let chain_name = || Arc::<str>::from("chain");
        if token.is_empty() {
            return Decision::Unauthenticated(vec![(chain_name(), RejectReason::Malformed)]);
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Decision::Unauthenticated(vec![(chain_name(), RejectReason::TooLarge)]);
        }
        let mut refusals = Vec::new();
        for authenticator in self.token_authenticators.iter().chain(&self.implicit) {
            match authenticator.authenticate(token).await {
                Outcome::Authenticated(identity) => return Decision::Authenticated(identity),
                Outcome::NotMine => {}
                Outcome::Rejected(reason) => refusals.push((authenticator.name().clone(), reason)),
            }
        }
        Decision::Unauthenticated(refusals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Forwarding, UserInfo};

    #[tokio::test]
    async fn certificates_and_anonymous_callers_need_no_token_authenticator() {
        let chain = Chain::default();
        let identity = Arc::new(Identity {
            user: UserInfo {
                username: "alice".into(),
                ..UserInfo::default()
            },
            authenticator: "x509".into(),
            audiences: vec![],
            forwarding: Forwarding::Impersonate,
        });
        assert_eq!(
            chain.authenticate(Credential::Certificate(&identity)).await,
            Decision::Authenticated(identity.clone())
        );
        assert_eq!(
            chain.authenticate(Credential::Anonymous).await,
            Decision::Anonymous
        );
    }

    #[tokio::test]
    async fn empty_and_oversized_tokens_are_refused_up_front() {
        let chain = Chain::default();
        let reason = |decision| match decision {
            Decision::Unauthenticated(refusals) => refusals.first().map(|(_, reason)| *reason),
            _ => None,
        };
        assert_eq!(
            reason(chain.authenticate(Credential::BearerToken("")).await),
            Some(RejectReason::Malformed)
        );
        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(
            reason(chain.authenticate(Credential::BearerToken(&huge)).await),
            Some(RejectReason::TooLarge)
        );
    }

    /// A TokenReview authenticator `name` whose endpoint accepts only `accepted`, and its endpoint.
    async fn accepting(
        name: &str,
        accepted: &'static str,
    ) -> (TokenAuthenticator, crate::test_util::Endpoint) {
        let endpoint = crate::test_util::endpoint(Arc::new(move |_path: &str, body: &serde_json::Value| {
            let status = if body["spec"]["token"] == accepted {
                serde_json::json!({"authenticated": true, "user": {"username": accepted}})
            } else {
                serde_json::json!({"authenticated": false})
            };
            (
                http::StatusCode::OK,
                serde_json::json!({"status": status}).to_string(),
            )
        }))
        .await;
        let mut config =
            crate::tokenreview::TokenReviewConfig::new(name, format!("{}/review", endpoint.base_url));
        config.ca_bundle_pem = Some(endpoint.ca_pem.clone());
        config.version = crate::tokenreview::ReviewVersion::V1;
        let authenticator = TokenReviewAuthenticator::new(config).unwrap();
        (TokenAuthenticator::TokenReview(Arc::new(authenticator)), endpoint)
    }

    #[tokio::test]
    async fn the_implicit_authenticator_is_tried_last_and_only_for_tokens() {
        let (named, _) = accepting("webhook", "alice").await;
        let (implicit, implicit_endpoint) = accepting("kube-apiserver", "robot").await;
        let chain = Chain::new(vec![named]).with_implicit(implicit);
        assert_eq!(
            chain.token_authenticators().len(),
            1,
            "the implicit one is not listed"
        );
        assert_eq!(chain.implicit().map(|a| &**a.name()), Some("kube-apiserver"));

        let Decision::Authenticated(alice) = chain.authenticate(Credential::BearerToken("alice")).await
        else {
            panic!("alice refused")
        };
        assert_eq!(&*alice.authenticator, "webhook");
        assert_eq!(
            implicit_endpoint.hits(),
            0,
            "never asked once another authenticator accepts"
        );

        let Decision::Authenticated(robot) = chain.authenticate(Credential::BearerToken("robot")).await
        else {
            panic!("robot refused")
        };
        assert_eq!(&*robot.authenticator, "kube-apiserver");

        assert_eq!(
            chain.authenticate(Credential::BearerToken("mallory")).await,
            Decision::Unauthenticated(vec![
                ("webhook".into(), RejectReason::NotAuthenticated),
                ("kube-apiserver".into(), RejectReason::NotAuthenticated),
            ]),
            "refused by both, in order"
        );
        let hits = implicit_endpoint.hits();
        let identity = robot.clone();
        assert_eq!(
            chain.authenticate(Credential::Certificate(&identity)).await,
            Decision::Authenticated(robot)
        );
        assert_eq!(
            chain.authenticate(Credential::Anonymous).await,
            Decision::Anonymous
        );
        assert_eq!(
            implicit_endpoint.hits(),
            hits,
            "certificates and anonymous callers never reach it"
        );
    }

    #[tokio::test]
    async fn a_token_no_authenticator_accepts_is_unauthenticated() {
        let chain = Chain::default();
        assert_eq!(
            chain.authenticate(Credential::BearerToken("t")).await,
            Decision::Unauthenticated(vec![])
        );
    }
}
