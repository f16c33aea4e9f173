//! # selkie-api
//!
//! The types of every Kubernetes API Selkie serves or reconciles, wire-compatible with Pinniped
//! (`*.pinniped.dev`, `v1alpha1`): the Concierge CRDs (`JWTAuthenticator`, `WebhookAuthenticator`,
//! `CredentialIssuer`), the Supervisor CRDs (`FederationDomain`, `OIDCClient` and the four
//! identity providers), and the aggregated API kinds (`TokenCredentialRequest`, `WhoAmIRequest`,
//! `OIDCClientSecretRequest`). Types only — serde, schemars and kube derives, with the
//! configurable API group suffix — and no IO, so every other crate can depend on it.
//!
//! * [`login`], [`identity`]: the Concierge's aggregated API kinds' wire shapes (always built).
//! * [`supervisor_oidc`]: the Supervisor's OIDC constants (custom headers, parameters, claims,
//!   scopes, client IDs) and its identity provider discovery documents (always built).
//! * [`group_suffix`]: Pinniped's `apiGroupSuffix` rewrites, for every group of both components
//!   (always built).
//! * [`authentication`], [`concierge_config`]: the Concierge CRD types; [`supervisor_config`],
//!   [`supervisor_idp`]: the Supervisor CRD types; [`common`]: what they share (`TLSSpec`,
//!   `Phase`); [`supervisor_clientsecret`]: the Supervisor's aggregated API kind; and [`crds`]:
//!   the generated CustomResourceDefinitions (`conf/crds/`). Behind the `crds` feature (on by
//!   default), because they pull in k8s-openapi, whose Kubernetes version feature only a final
//!   binary or test may choose; the workspace dependency turns default features off, so members
//!   that want the CRDs ask for `features = ["crds"]`.

#[cfg(feature = "crds")]
pub mod authentication;
#[cfg(feature = "crds")]
pub mod common;
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
#[cfg(feature = "crds")]
pub mod supervisor_clientsecret;
#[cfg(feature = "crds")]
pub mod supervisor_config;
#[cfg(feature = "crds")]
pub mod supervisor_idp;
pub mod supervisor_oidc;
#[cfg(feature = "crds")]
pub mod supervisor_saml;
