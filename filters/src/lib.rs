//! # selkie-filters
//!
//! Decides who a request comes from. It will own the identity model (user, uid, groups, extra),
//! the credential a request presents, the `Filter` trait and the immutable chain the proxy and the
//! TokenCredentialRequest API run: x509 client certificates, JWTs (Pinniped's JWTAuthenticator and
//! Kubernetes' structured AuthenticationConfiguration), webhook TokenReview and TokenReview
//! pass-through, plus the impersonation header policy. It never depends on pingora, so the data
//! plane stays swappable.
//!
//! Status: empty; the authenticators arrive with the filter-chain work.
