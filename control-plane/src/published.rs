//! What the control plane publishes to the data plane: one immutable [`Published`] value, sent
//! whole through a `tokio::sync::watch` channel whenever any part of it changes. Receivers build
//! their own snapshot from it (the proxy's `Snapshot` in `selkie-concierge`); a value is only
//! ever built from validated parts, so whatever a receiver sees is usable.

use std::sync::Arc;

use selkie_filters::{chain::Chain, issuing::login_api::SignerConciergeApi};
use tokio::sync::watch;

/// A serving certificate chain and its key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingKeyPair {
    /// The certificate chain, leaf first.
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
}

impl std::fmt::Debug for ServingKeyPair {
    // Key material never appears in debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingKeyPair").finish_non_exhaustive()
    }
}

/// Everything the data plane takes from the control plane.
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// The bearer-token authenticators of the valid JWTAuthenticators and WebhookAuthenticators
    /// (each in its last valid form), ordered by kind then name.
    pub chain: Chain,
    /// PEM CA bundles whose client certificates identify users at the proxy: Selkie's signer CAs
    /// (the current one and, during a rotation, the previous one) and kube-apiserver's client CA.
    pub client_ca_pems: Vec<String>,
    /// Whether the impersonation proxy should serve (CredentialIssuer mode), and with which
    /// certificate; `None` while it is disabled or has no certificate yet.
    pub proxy_serving: Option<ServingKeyPair>,
    /// Whether every JWTAuthenticator and WebhookAuthenticator that existed when the control
    /// plane started has been evaluated once ([`crate::authenticators`]): until then `chain` may
    /// lack authenticators the cluster has, and a replica is not ready.
    pub authenticators_loaded: bool,
}

/// The publishing side, shared by the reconcilers: each one replaces only its own part.
#[derive(Debug, Clone)]
pub struct Publisher {
    sender: Arc<watch::Sender<Arc<Published>>>,
    login_api: Arc<SignerConciergeApi>,
}

impl Default for Publisher {
    fn default() -> Self {
        Self::new()
    }
}

impl Publisher {
    /// A publisher with an empty value (no authenticators, no CAs, proxy not serving) and a login
    /// API with no signer (which refuses every login until a signer is installed).
    pub fn new() -> Self {
        Self::with_login_api(SignerConciergeApi::default())
    }

    /// [`Publisher::new`] with a login API issuing certificates valid for `lifetime` (the
    /// configuration's `clientCertificateLifetime`, validated).
    pub fn with_certificate_lifetime(lifetime: std::time::Duration) -> Self {
        Self::with_login_api(SignerConciergeApi::default().with_certificate_lifetime(lifetime))
    }

    fn with_login_api(login_api: SignerConciergeApi) -> Self {
        let (sender, _) = watch::channel(Arc::new(Published::default()));
        Self {
            sender: Arc::new(sender),
            login_api: Arc::new(login_api),
        }
    }

    /// A receiver of every future value (and the current one).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Published>> {
        self.sender.subscribe()
    }

    /// The current value.
    pub fn current(&self) -> Arc<Published> {
        self.sender.borrow().clone()
    }

    /// The login API both front ends serve (its signer is installed by [`crate::signing`]).
    pub fn login_api(&self) -> &Arc<SignerConciergeApi> {
        &self.login_api
    }

    /// Applies `change` to a copy of the current value and publishes the result. Receivers are
    /// woken only if `change` reports that it changed something.
    pub fn update(&self, change: impl FnOnce(&mut Published) -> bool) {
        self.sender.send_if_modified(|current| {
            let mut next = Published::clone(current);
            if change(&mut next) {
                *current = Arc::new(next);
                true
            } else {
                false
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn receivers_see_changes_and_only_changes() {
        let publisher = Publisher::new();
        let mut receiver = publisher.subscribe();
        assert!(receiver.borrow_and_update().client_ca_pems.is_empty());
        publisher.update(|_| false);
        assert!(!receiver.has_changed().unwrap());
        publisher.update(|published| {
            published.client_ca_pems.push("ca".into());
            true
        });
        assert!(receiver.has_changed().unwrap());
        assert_eq!(receiver.borrow_and_update().client_ca_pems, ["ca"]);
        assert_eq!(publisher.current().client_ca_pems, ["ca"]);
    }
}
