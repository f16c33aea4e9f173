//! # selkie-perf
//!
//! The side-by-side benchmark harness of `PERF.md`: a fast HTTPS backend that checks the
//! `Impersonate-*` headers it receives, a load client for what generic tools cannot do (mTLS with
//! per-connection identities, held watches, upgraded streams), the scenario runner and the
//! recorded results. Criterion micro-benchmarks of hot paths live beside it.
//!
//! Status: empty; the harness arrives with the performance work.
