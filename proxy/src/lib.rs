//! # selkie-proxy
//!
//! The Concierge's data plane: an L7 impersonation proxy on pingora with rustls.
//!
//! * [`tls`]: the listener's replaceable serving certificate, optional client certificates, and
//!   the identity a certificate carries, computed once per connection against the current CA
//!   pools;
//! * [`service`]: the request path — snapshot, authentication through the `selkie-filters` chain,
//!   removal of client-supplied `Authorization`, `Impersonate-*`, `X-Remote-*` and
//!   `X-Forwarded-For`, then forwarding to kube-apiserver with the proxy's credential and
//!   `Impersonate-*` headers over pooled HTTP/2 (HTTP/1.1 for upgrades);
//! * [`headers`]: the header policy itself, free of pingora so it can be tested and fuzzed;
//! * [`snapshot`] and [`config`]: the immutable configuration a request runs with, and the static
//!   YAML file it can be built from without a control plane.
//!
//! It knows nothing of CRDs; the control plane publishes snapshots into the same `ArcSwap`.

pub mod config;
pub mod headers;
pub mod service;
pub mod snapshot;
pub mod status;
pub mod tls;
