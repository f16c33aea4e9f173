//! The impersonation header policy, free of any HTTP server so it can be tested and fuzzed:
//!
//! * [`headers`]: what a client may not send upstream (`Authorization`, `Impersonate-*`,
//!   `X-Remote-*`, `X-Forwarded-For`), the impersonation it asked for, and the `Impersonate-*`
//!   headers that make kube-apiserver act as a user (built once per identity where possible);
//! * [`nested`]: kube-apiserver's rules for a caller's own `Impersonate-*` headers (`kubectl
//!   --as`): who the request then acts as, the SubjectAccessReviews that must allow it, and the
//!   extra keys the proxy accepts and reserves.

pub mod headers;
pub mod nested;
