//! # selkie-filters
//!
//! Decides who a request comes from. It owns the identity model ([`identity`]), what an
//! authenticator answers ([`outcome`]), the immutable [`chain::Chain`] the proxy and the
//! TokenCredentialRequest API run, and the authenticators:
//!
//! * [`x509`]: client certificates, verified against one or more CA pools and mapped CN → user,
//!   O → groups, with a verdict that says when it must be reached again;
//! * [`tokenreview`]: TokenReview webhooks (Pinniped's WebhookAuthenticator) and kube-apiserver's
//!   own TokenReview for pass-through of tokens the cluster accepts, with a bounded result cache
//!   keyed by an HMAC of the token ([`review_cache`]).
//!
//! * [`jwt`]: JWT bearer tokens (Pinniped's JWTAuthenticator, plus the `jwt[]` fields of
//!   Kubernetes' structured AuthenticationConfiguration), with CEL claim mappings and validation
//!   rules compiled at configuration time ([`expression`]).
//!
//! [`issuing`] answers TokenCredentialRequest and WhoAmIRequest, for the proxy and the aggregated
//! API alike, and signs the client certificates a TokenCredentialRequest returns.
//!
//! [`impersonation`] is the header policy of the impersonation proxy: what a client may not send
//! upstream, the `Impersonate-*` headers of a user, and kube-apiserver's rules for nested
//! impersonation.
//!
//! [`possession`] is the TLS client-certificate verifier of servers that decide chain trust after
//! the handshake, against CA pools that change while they run.
//!
//! [`front_proxy`] decides who calls an extension (aggregated) API server, from kube-apiserver's
//! `extension-apiserver-authentication` settings: the front proxy's `X-Remote-*` headers on a
//! connection with its certificate, a client certificate of `client-ca-file`, else anonymous.
//!
//! [`access_review`] asks kube-apiserver for authorization decisions (SubjectAccessReview), which
//! the proxy needs to check nested impersonation.
//!
//! It never depends on pingora, so the data plane stays swappable; it never logs a token.

pub mod access_review;
pub mod chain;
pub mod expression;
pub mod front_proxy;
pub mod https;
pub mod identity;
pub mod impersonation;
pub mod issuing;
pub mod jwt;
pub mod outcome;
pub mod possession;
pub mod review_cache;
pub mod tokenreview;
pub mod x509;

#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
