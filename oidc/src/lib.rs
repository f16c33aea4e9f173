//! # selkie-oidc
//!
//! OpenID Connect and JOSE for every part of Selkie that speaks them, with no Kubernetes and no
//! data plane in it (DESIGN.md: binaries → servers → `kube`, `filters` → `oidc` → `api`):
//!
//! * [`jose`]: JSON Web Keys, compact JWS parsing and verification on ring, and ES256 signing
//!   ([`jose::sign`]) for an issuer's own tokens;
//! * [`dpop`]: DPoP proofs (RFC 9449): made by the CLI, checked by the Supervisor;
//! * [`keys`]: an issuer's signing keys, cached, with single-flight, rate-limited refresh;
//! * [`discovery`]: the `.well-known/openid-configuration` document and its issuer check;
//! * [`rp`]: the relying party: authorization URL with PKCE, code and refresh redemption, the
//!   password grant, RFC 8693 token exchange, ID token validation;
//! * [`https`]: the one HTTPS client (CA bundle or system roots, client certificates, bounded
//!   bodies, errors that keep their cause).
//!
//! No error, log line or `Debug` output here carries a token, a code, a password or a key.

pub mod discovery;
pub mod dpop;
pub mod https;
pub mod jose;
pub mod keys;
pub mod rp;
