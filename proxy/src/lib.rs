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
//!   `Impersonate-*` headers over pooled HTTP/2;
//! * [`streams`]: watches and followed logs over HTTP/2, served outside pingora's request loop
//!   by the same steps, so that an idle stream holds only what it needs;
//! * [`tunnels`]: upgraded requests (exec, attach, port-forward) served by the same steps over
//!   kube-apiserver connections of their own, whose TLS configuration is built once per
//!   credential and resumes sessions, and copied both ways after the `101`;
//! * [`coalesce`]: the body chunks of a response that ends on its own (a list, a GET) written
//!   together rather than one by one as kube-apiserver's encoder produces them;
//! * [`downstream`]: what a client connection is allowed before authentication: header-read and
//!   idle timeouts (none for a request in progress) and request-head size limits;
//! * [`admission`]: how many client connections are open at once (`listenerLimits`), counted
//!   from before their TLS handshake;
//! * the header policy itself lives in `selkie_filters::impersonation`, free of pingora;
//! * [`snapshot`] and [`config`]: the immutable configuration a request runs with, and the static
//!   YAML file it can be built from without a control plane;
//! * [`audit`]: the one JSON audit line per request, formatted without `tracing`'s generic
//!   formatter;
//! * [`upstream_gate`]: upstream HTTP/2 connections opened one at a time, only when the open
//!   ones are full (pingora alone opens one per request in a burst);
//! * [`metrics`] and [`operations`]: Prometheus metrics with bounded labels, and the plain-HTTP
//!   port serving them with `/healthz` and `/readyz`;
//! * [`server`] and [`composer`]: the pingora server itself (listeners, signals, lifecycle and
//!   drain), and the snapshot composed from the static file and a control plane's publications,
//!   with the file watcher that swaps it.
//!
//! It knows nothing of CRDs; the control plane publishes snapshots into the same `ArcSwap`.

pub mod admission;
pub mod audit;
pub mod coalesce;
pub mod composer;
pub mod config;
pub mod downstream;
pub mod duration;
pub mod metrics;
pub mod operations;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod status;
pub mod streams;
pub mod tls;
pub mod tunnels;
pub mod upstream_gate;
