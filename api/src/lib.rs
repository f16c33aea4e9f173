//! # selkie-api
//!
//! The types of every Kubernetes API Selkie serves or reconciles, wire-compatible with Pinniped
//! (`*.pinniped.dev`, `v1alpha1`): the Concierge CRDs (`JWTAuthenticator`, `WebhookAuthenticator`,
//! `CredentialIssuer`), the aggregated API kinds (`TokenCredentialRequest`, `WhoAmIRequest`) and
//! the Supervisor CRDs. Types only — serde, schemars and kube derives, with the configurable API
//! group suffix — and no IO, so every other crate can depend on it.
//!
//! Status: empty; the types arrive with the control-plane work.
