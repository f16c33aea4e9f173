//! Who a request comes from, and what it presented.

use std::{collections::BTreeMap, sync::Arc};

/// kube-apiserver's extra key naming the credential a request was authenticated with (since
/// Kubernetes 1.32): `X509SHA256=<hex>` for a client certificate
/// ([`crate::x509::credential_id`]), `JTI=<id>` for a service-account token. It names the
/// credential, not the user, so audit logs can tell two credentials of one user apart.
pub const CREDENTIAL_ID_EXTRA: &str = "authentication.kubernetes.io/credential-id";

/// A Kubernetes user as kube-apiserver understands it (`authentication.k8s.io/v1` `UserInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name; never empty once authenticated.
    pub username: String,
    /// A unique, stable id, when the authenticator knows one (service accounts do).
    pub uid: Option<String>,
    /// Group memberships, in the order the authenticator reported them.
    pub groups: Vec<String>,
    /// Additional attributes (`Impersonate-Extra-*` when forwarded).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// How the proxy must forward a request from this identity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Forwarding {
    /// Add `Impersonate-*` headers for the user (the normal case).
    #[default]
    Impersonate,
    /// Forward the caller's own bearer token unchanged: kube-apiserver itself accepted it (for
    /// example a service-account token, which carries a UID that impersonation cannot express).
    PassThroughToken,
}

/// An authenticated caller: the user, which authenticator vouched for it, and how to forward it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user.
    pub user: UserInfo,
    /// Name of the authenticator that authenticated the caller (for audit and metrics).
    pub authenticator: Arc<str>,
    /// Audiences the credential was valid for, when the authenticator reports them.
    pub audiences: Vec<String>,
    /// How to forward requests made with this identity.
    pub forwarding: Forwarding,
}

/// What a request presented, as the chain sees it.
#[derive(Debug, Clone, Copy)]
pub enum Credential<'a> {
    /// A client certificate the TLS layer verified; its identity was extracted once per connection.
    Certificate(&'a Arc<Identity>),
    /// The token of an `Authorization: Bearer` header.
    BearerToken(&'a str),
    /// Nothing.
    Anonymous,
}

/// What a TokenCredentialRequest's client certificate must say of an authenticator's identity.
/// A certificate carries a username (CN) and groups (O) only. Reads from configuration as
/// `Exact` or `UsernameAndGroups`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub enum CertificateIdentity {
    /// All of it, as Pinniped: an identity with a UID, or extras other than the credential id,
    /// gets no certificate.
    #[default]
    Exact,
    /// The username and groups; the UID and extras are left out (and the audit line says so).
    /// The administrator's explicit choice for one authenticator, e.g. kube-apiserver's
    /// TokenReview of service-account tokens.
    UsernameAndGroups,
}
