//! # selkie-control-plane
//!
//! The Concierge's control plane: it reads the Concierge's custom resources and Secrets from
//! kube-apiserver (kube-rs), reports on them in their status, and publishes what the data plane
//! needs as one validated, immutable value ([`published::Published`]) through a
//! `tokio::sync::watch` channel. It knows nothing of pingora: the `selkie-concierge` binary turns
//! what is published into the proxy's snapshot.
//!
//! * [`config`]: the control plane's own configuration (namespace, object names, API group
//!   suffix, listeners) and the group-suffixed API resources.
//! * [`authenticators`]: JWTAuthenticator and WebhookAuthenticator reconcilers → the chain.
//! * [`signing`]: where client certificates are signed — the cluster's signing key (a Secret or
//!   files on a control-plane node) and Selkie's own signer CA, rotated with an overlap.
//! * [`aggregated_api`]: the aggregated API server (TokenCredentialRequest, WhoAmIRequest)
//!   behind kube-apiserver, with front-proxy authentication.
//! * [`credential_issuer`]: the CredentialIssuer — impersonation proxy mode, its Services,
//!   serving certificates and the status strategies clients read.
//!
//! * [`kube_cert_agent`]: the kube cert agent — a pod beside kube-controller-manager that the
//!   cluster's signing key is read from (the third `clusterSigningKey` source).
//! * [`login_authorization`]: an authenticator's `loginAuthorization` (Selkie's extension), asked
//!   of kube-apiserver as a SubjectAccessReview at each TokenCredentialRequest.
//!
//! Status conditions, leader election, certificates and the aggregated API's serving Secret are
//! selkie-kube's; front-proxy authentication is selkie-filters'.
//!
//! Every failure of a custom resource is reported in that resource's status and never replaces a
//! working configuration; nothing here logs a token or a key.

pub mod aggregated_api;
pub mod authenticators;
pub mod config;
pub mod credential_issuer;
pub mod kube_cert_agent;
pub mod login_authorization;
pub mod published;
pub mod signing;
