//! # selkie-control-plane
//!
//! The Concierge's control plane. It will own the kube-rs reconcilers for the Concierge CRDs, the
//! certificate authorities (client signer with overlapping rotation, serving CA), Service and
//! load-balancer management, CredentialIssuer status, the aggregated TokenCredentialRequest and
//! WhoAmIRequest API server, and the validated snapshots it publishes to the proxy. It knows
//! nothing of pingora.
//!
//! Status: empty; the reconcilers arrive with the control-plane work.
