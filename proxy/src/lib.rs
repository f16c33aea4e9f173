//! # selkie-proxy
//!
//! The Concierge's data plane: an L7 impersonation proxy on pingora with rustls. It will own the
//! listener (TLS 1.2/1.3, optional client certificates, serving-certificate rotation), the
//! per-connection identity, the request path that runs the `selkie-filters` chain, strips
//! client-supplied `Authorization`, `Impersonate-*` and `X-Remote-*` headers and adds its own,
//! the pooled HTTP/2 upstream to kube-apiserver, streamed watches and tunnelled upgrades. It reads
//! its configuration from an `ArcSwap` snapshot and knows nothing of CRDs.
//!
//! Status: empty; the data plane arrives with the impersonation-proxy work.
