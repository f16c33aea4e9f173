//! # selkie-supervisor
//!
//! The Supervisor: an OIDC provider per FederationDomain that federates upstream identity
//! providers (OIDC, LDAP, Active Directory, GitHub) and issues per-cluster ID tokens, with sessions
//! stored in Kubernetes Secrets so any replica can serve any step of a login.
//!
//! The process (`main.rs`) runs the [`controller`] (FederationDomains, identity providers, keys,
//! certificates), the [`clients`] controller (OIDCClients), the session garbage collector
//! ([`gc`]) and the listeners ([`server`]) answering with [`endpoints`]. The pieces:
//!
//! * [`authorize`]: the authorization request's checks (clients, loopback redirects, PKCE S256
//!   only, state and nonce entropy) and where a refusal goes; [`oauth`]: the error responses;
//! * [`clients`]: dynamic clients (OIDCClient), their secrets' storage and validation;
//! * [`federation_domain`]: a FederationDomain's conditions (Pinniped's types, reasons and
//!   messages) and the identity providers it serves; [`issuer`]: what one serves;
//! * [`upstream`], [`ldap`]: the upstream identity providers; [`transforms`]: CEL identity
//!   transforms and policies; [`audit`]: login events;
//! * [`discovery`]: the endpoint paths, the OpenID Connect discovery document and the
//!   identity-provider discovery document, as Pinniped publishes them;
//! * [`id_token`]: ES256 ID tokens with Pinniped's claims (`username`, `groups`,
//!   `additionalClaims`, `at_hash`, `rat`, ...), two minutes long by default;
//! * [`subject`]: the `sub` of downstream ID tokens, byte for byte Pinniped's;
//! * [`tokens`]: opaque authorization codes, access and refresh tokens (`pin_ac_`, `pin_at_`,
//!   `pin_rt_`) minted and checked with a FederationDomain's token-signing key;
//! * [`sealed`]: values handed out and read back unchanged (the upstream `state` of a login in
//!   progress, the CSRF cookie), encrypted and authenticated with AES-256-GCM, bound to their
//!   purpose and FederationDomain, with an expiry;
//! * [`storage`], [`store`]: the session Secrets, with Pinniped's names, types, labels, data keys
//!   and garbage-collection annotation.

pub mod aggregated_api;
pub mod audit;
pub mod authorize;
mod background;
pub mod clients;
pub mod config;
pub mod controller;
pub mod discovery;
pub mod endpoints;
pub mod federation_domain;
pub mod gc;
pub mod github;
pub mod id_token;
pub mod issuer;
pub mod keys;
pub mod ldap;
pub mod metrics;
pub mod oauth;
pub mod sealed;
pub mod server;
pub mod session;
pub mod storage;
pub mod store;
pub mod subject;
pub mod throttle;
pub mod tokens;
pub mod transforms;
pub mod upstream;
