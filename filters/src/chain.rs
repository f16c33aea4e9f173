//! The chain: authenticators run in a configured order, built once and swapped whole.

use std::sync::Arc;

use crate::{
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
}

impl Chain {
    /// A chain trying `token_authenticators` in this order.
    pub fn new(token_authenticators: Vec<TokenAuthenticator>) -> Self {
        Self { token_authenticators }
    }

    /// The token authenticators, in order.
    pub fn token_authenticators(&self) -> &[TokenAuthenticator] {
        &self.token_authenticators
    }

    /// Decides who presented `credential`.
    ///
    /// A verified client certificate is authenticated as the identity extracted at handshake. A
    /// bearer token goes to each token authenticator in order: the first to authenticate it wins;
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
        for authenticator in &self.token_authenticators {
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

    #[tokio::test]
    async fn a_token_no_authenticator_accepts_is_unauthenticated() {
        let chain = Chain::default();
        assert_eq!(
            chain.authenticate(Credential::BearerToken("t")).await,
            Decision::Unauthenticated(vec![])
        );
    }
}
