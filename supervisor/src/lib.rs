//! # selkie-supervisor
//!
//! The Supervisor: an OIDC provider per FederationDomain that federates upstream identity
//! providers (OIDC, LDAP, Active Directory, GitHub) and issues per-cluster ID tokens, with sessions
//! stored in Kubernetes Secrets so any replica can serve any step of a login.
//!
//! Status: empty; the provider arrives with the Supervisor work.
