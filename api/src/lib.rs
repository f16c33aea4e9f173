//! # selkie-api
//!
//! The types of every Kubernetes API Selkie serves or reconciles, wire-compatible with Pinniped
//! (`*.pinniped.dev`, `v1alpha1`): the Concierge CRDs (`JWTAuthenticator`, `WebhookAuthenticator`,
//! `CredentialIssuer`), the aggregated API kinds (`TokenCredentialRequest`, `WhoAmIRequest`) and
//! the Supervisor CRDs. Types only — serde, schemars and kube derives, with the configurable API
//! group suffix — and no IO, so every other crate can depend on it.
//!
//! * [`login`], [`identity`]: the aggregated API kinds' wire shapes (always built).
//! * [`group_suffix`]: Pinniped's `apiGroupSuffix` rewrites (always built).
//! * [`authentication`], [`concierge_config`]: the Concierge CRD types, and [`crds`]: their
//!   generated CustomResourceDefinitions (`conf/crds/`). Behind the `crds` feature (on by
//!   default), because they pull in k8s-openapi, whose Kubernetes version feature only a final
//!   binary or test may choose; the workspace dependency turns default features off, so members
//!   that want the CRDs ask for `features = ["crds"]`.
//!
//! Status: the Supervisor CRDs arrive with the Supervisor work.

#[cfg(feature = "crds")]
pub mod authentication;
#[cfg(feature = "crds")]
pub mod concierge_config;
#[cfg(feature = "crds")]
pub mod crds;
pub mod duration;
pub mod group_suffix;
pub mod identity;
pub mod json;
pub mod login;
pub mod names;
pub mod percent;
#[cfg(feature = "crds")]
mod schema;
