//! # selkie-supervisor
//!
//! The Supervisor: an OIDC provider per FederationDomain that federates upstream identity
//! providers (OIDC, LDAP, Active Directory, GitHub) and issues per-cluster ID tokens, with sessions
//! stored in Kubernetes Secrets so any replica can serve any step of a login.
//!
//! The process (`main.rs`) runs the [`Controller`] (FederationDomains, identity providers, keys,
//! certificates), the [`ClientController`] (OIDCClients), the session garbage collector
//! ([`sweep_sessions`]) and the listeners ([`serve_https`], [`serve_http`], [`serve_metrics`])
//! answering with the [`Endpoints`]. Everything else is private to this crate; the folders answer
//! a newcomer's questions:
//!
//! * **Where is the controller?** `controller/`: typed reconcilers, one per kind, on the
//!   reconciler machinery both servers share (`selkie_kube::reconcile`: per-object reconciles on
//!   their own tasks, backoff, an error policy, the one status writer). `identity_provider` is the
//!   one reconciler of every identity-provider kind; what differs per kind is a `Provider`:
//!   `oidc`, `directory` (LDAP and Active Directory, one provider over both CRDs) and `github`.
//!   `federation_domains` reconciles FederationDomains (their generated keys in `keys`, Pinniped's
//!   conditions in `federation_domain`) and publishes the snapshot; `upstreams` is what the
//!   identity providers built and the FederationDomains serve; `sources` the watched Secrets and
//!   ConfigMaps. It publishes [`Issuers`] and the serving certificates, nothing else.
//! * **What do the endpoints see?** `issuer`: the published snapshot — each FederationDomain as
//!   requests find it (issuer URL, keys, identity providers, transforms). Endpoints read the
//!   snapshot, never the controller. `sealed`: values handed out and read back unchanged (the
//!   upstream `state`, the CSRF cookie), encrypted and authenticated.
//! * **Where is an identity provider?** `idp/`: the upstream kinds as logins use them behind one
//!   enum (`idp::Upstream`: OIDC, LDAP/Active Directory, GitHub), the directory client
//!   (`idp::ldap`), GitHub's API (`idp::github`), CEL identity transforms and policies
//!   (`idp::transforms`), the downstream `sub` (`idp::subject`) and the password throttle
//!   (`idp::throttle`).
//! * **Where is a session?** `session/`: a login's session (`session::Session`), how it is kept
//!   in Secrets as Pinniped keeps them (`session::storage`, `session::store`), the opaque codes
//!   and tokens (`session::tokens`), the ID tokens (`session::id_token`) and the garbage
//!   collector (`session::gc`).
//! * **Where is an endpoint?** `endpoints/`: the router (`endpoints::Endpoints`), discovery, the
//!   authorization request's checks (`endpoints::authorize`), the login (authorize, callback,
//!   login page), the IdP chooser, the token endpoint and revocation, OAuth error responses
//!   (`endpoints::oauth`).
//! * **Where are the dynamic clients?** `clients/`: OIDCClients, their secrets' storage and
//!   validation (the table logins read), their reconciler (`clients::controller`) and the
//!   `OIDCClientSecretRequest` aggregated API (`clients::secret_request`).
//! * **Where are the listeners?** `server/`: HTTPS/HTTP/metrics listeners, what one client can
//!   hold on them (`server::limits`), Prometheus metrics (`server::metrics`) and the audit events
//!   (`server::audit`).
//! * `config`: the Supervisor's own configuration file.
//! * `fuzzing` (feature `fuzzing`, off by default): what the fuzz targets in `fuzz/` drive.

mod clients;
mod config;
mod controller;
mod endpoints;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod idp;
mod issuer;
mod sealed;
mod server;
mod session;
#[cfg(test)]
mod test_support;

pub use clients::{
    secret_request::{Routes as SecretRequestRoutes, VERSION as SECRET_REQUEST_VERSION},
    ClientController, Clients,
};
pub use config::SupervisorConfig;
pub use controller::{keys::KeySecret, Controller, ControllerError, Outputs};
pub use endpoints::Endpoints;
pub use idp::{
    ldap::{Directory, DirectoryConfig, Flavor, GroupSearch, LdapError, UserSearch},
    throttle::PasswordThrottle,
};
pub use issuer::Issuers;
pub use server::{
    audit::Audit, bind, limits::ListenerLimits, metrics::Metrics, serve_http, serve_https, serve_metrics,
    Readiness, ServerError,
};
pub use session::{
    gc::{sweep as sweep_sessions, Sweep},
    store::Store,
};
