//! # selkie-filters
//!
//! Decides who a request comes from. It owns the identity model ([`identity`]), what an
//! authenticator answers ([`outcome`]), the immutable [`chain::Chain`] the proxy and the
//! TokenCredentialRequest API run, and the authenticators:
//!
//! * [`x509`]: client certificates, verified against one or more CA pools and mapped CN → user,
//!   O → groups, once per connection;
//! * [`tokenreview`]: TokenReview webhooks (Pinniped's WebhookAuthenticator) and kube-apiserver's
//!   own TokenReview for pass-through of tokens the cluster accepts, with a bounded result cache
//!   keyed by an HMAC of the token ([`review_cache`]).
//!
//! Still to come (see the project's issues): the JWT
//! authenticator (Pinniped's JWTAuthenticator and Kubernetes' structured
//! AuthenticationConfiguration) and the impersonation header policy.
//!
//! It never depends on pingora, so the data plane stays swappable; it never logs a token.

pub mod chain;
pub mod https;
pub mod identity;
pub mod outcome;
pub mod review_cache;
pub mod tokenreview;
pub mod x509;

#[cfg(test)]
mod tests_support {
    /// Unit tests build rustls configurations; they need the process-wide provider installed.
    pub(crate) fn install_provider() {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    }
}
