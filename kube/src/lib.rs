//! # selkie-kube
//!
//! The Kubernetes toolkit Selkie's servers share (the Concierge's control plane and proxy, the
//! Supervisor), with nothing of either in it:
//!
//! * [`serving`]: the serving certificate of a TLS listener, hot-swappable and chosen by SNI;
//! * [`certs`]: the CAs and certificates servers generate (ECDSA P-256, PEM);
//! * [`status`]: the `metav1.Status` failure body;
//! * [`shutdown`]: how long a server keeps serving, unready, after SIGTERM, and then drains;
//! * with the `api` feature (default), what talks to kube-apiserver: [`leader`] election over a
//!   Lease, the server's [`client`], status [`conditions`] generic over an object's phase type, and the aggregated API's
//!   serving Secret and APIService CA bundles ([`serving_secret`]), and the rest of an aggregated
//!   API server's kit: discovery, health, request objects ([`aggregated`]) and the server that
//!   runs one behind kube-apiserver ([`aggregated::server`]); and `spec.tls` of outbound
//!   connections, inline or from a Secret or ConfigMap ([`tls_spec`]); the [`reconcile`]r
//!   machinery every custom resource of both servers runs on (per-object reconciles, backoff,
//!   source changes, the one status writer).
//!
//! Only the `api` feature depends on `filters`, for who calls an aggregated API server (the front
//! proxy's settings, the possession-only client certificate verifier); `filters` never depends on
//! this crate.

#[cfg(feature = "api")]
pub mod aggregated;
pub mod certs;
#[cfg(feature = "api")]
pub mod client;
#[cfg(feature = "api")]
pub mod conditions;
#[cfg(feature = "api")]
pub mod leader;
#[cfg(feature = "api")]
pub mod reconcile;
pub mod serving;
#[cfg(feature = "api")]
pub mod serving_secret;
pub mod shutdown;
pub mod status;
#[cfg(feature = "api")]
pub mod tls_spec;
