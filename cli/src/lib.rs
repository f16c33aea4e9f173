//! # selkie
//!
//! The command users meet: a kubectl exec credential plugin and admin CLI with the commands,
//! flags and cache files of the pinniped CLI, so kubeconfigs written for `pinniped` work with
//! `selkie` as the command and the two CLIs share `credentials.yaml`.
//!
//! * [`login_static`]: `selkie login static`, a static token, optionally exchanged for a
//!   short-lived client certificate with the Concierge's TokenCredentialRequest ([`concierge`]).
//! * [`login_oidc`]: `selkie login oidc`, an OIDC login (browser with PKCE, pasted code,
//!   password, or the RFC 8628 device flow) with pinniped's `sessions.yaml` ([`sessions`]); the
//!   relying party and ID token signatures are selkie-oidc's. An issuer that asks for DPoP gets
//!   proofs of a per-issuer key kept next to the session cache ([`dpop_keys`]).
//! * [`get_kubeconfig`]: `selkie get kubeconfig`, a kubeconfig discovered from the Concierge's
//!   CredentialIssuer and authenticators.
//! * [`exec`]: the client-go exec credential protocol (`KUBERNETES_EXEC_INFO` in, one
//!   `ExecCredential` of the same version out on stdout).
//! * [`cache`]: the credential cache, in Pinniped's format and locking, keyed the way Pinniped
//!   keys it ([`gojson`] reproduces Go's JSON bytes for the key).
//!   It and the session cache keep their YAML files through one private module, `yaml_file`
//!   (the lock, loading with corrupt files set aside, and 0600 atomic writes).
//! * [`whoami`]: `selkie whoami`, a WhoAmIRequest with the kubeconfig's own credential
//!   ([`kubeconfig`]: loading, contexts, client certificates, tokens and exec plugins).
//! * [`logout`]: `selkie logout` (Selkie's own): a kubeconfig context's OIDC sessions removed
//!   from the cache and revoked at the issuer, and the cached cluster credentials dropped.
//! * [`version`]: `selkie version`.
//!
//! Everything the binary prints besides its answer goes to stderr as one line per message, and
//! no message ever contains a token or a key.

pub mod cache;
pub mod concierge;
pub mod dpop_keys;
pub mod exec;
pub mod get_kubeconfig;
pub mod gojson;
pub mod http;
pub mod kubeconfig;
pub mod login_oidc;
pub mod login_static;
pub mod logout;
pub mod sessions;
pub mod timestamp;
pub mod version;
pub mod whoami;
mod yaml_file;
