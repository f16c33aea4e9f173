//! The identity providers' checks as the fuzz targets run them (feature `fuzzing`): an object of
//! each kind checked as its reconciler checks it the first time ([`evaluate_once`]), in a
//! namespace whose Secrets and ConfigMaps are fixed, with no kube-apiserver.
//!
//! A check asks another server — an OIDC discovery, a directory's or GitHub's connection probe —
//! only once the credentials Secret it names was read (OIDC, LDAP, Active Directory) or once its
//! host and TLS settings are valid (GitHub). The namespace here holds no Secret of any
//! credentials type, and a GitHub object's `spec.githubAPI.tls` is replaced by a CA source that
//! does not exist, so every check ends before that: what runs is the reading of the object and
//! its spec's checks against the Secrets and CA sources it names. The connection checks
//! themselves need a server and are not fuzzed.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::DynamicObject;
use kube::runtime::{reflector, watcher::Event};
use selkie_api::supervisor_idp::{
    ActiveDirectoryIdentityProvider, GitHubIdentityProvider, LDAPIdentityProvider, OIDCIdentityProvider,
};
use selkie_kube::conditions::Check;
use tokio::sync::watch;

use crate::controller::directory::DirectoryProvider;
use crate::controller::github::GitHubProvider;
use crate::controller::identity_provider::{evaluate_once, Evaluation};
use crate::controller::kind::Kind;
use crate::controller::oidc::OidcProvider;
use crate::controller::sources::{typed, Sources};

/// The namespace of the objects and their Secrets.
pub const NAMESPACE: &str = "supervisor";
/// A `kubernetes.io/tls` Secret whose `ca.crt` is a CA certificate.
pub const CA_SECRET: &str = "ca-secret";
/// An `Opaque` Secret whose `ca.crt` is not PEM.
pub const NOT_PEM_SECRET: &str = "not-pem";
/// An `Opaque` Secret with `clientID`, `clientSecret`, `username` and `password`: every
/// credentials key, under the wrong type.
pub const OPAQUE_CREDENTIALS: &str = "opaque-credentials";
/// A ConfigMap whose `ca.crt` is a CA certificate.
pub const CA_CONFIG_MAP: &str = "ca-bundle";
/// The CA source every GitHub object is given (it does not exist).
const MISSING_CA_SOURCE: &str = "fuzzing-missing-ca-source";

/// An identity-provider kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdpKind {
    /// OIDCIdentityProvider.
    Oidc,
    /// LDAPIdentityProvider.
    Ldap,
    /// ActiveDirectoryIdentityProvider.
    ActiveDirectory,
    /// GitHubIdentityProvider.
    GitHub,
}

/// What a first check of an identity provider found.
#[derive(Debug)]
pub(crate) struct Checked {
    /// Its conditions, without `Ready`.
    pub(crate) checks: Vec<Check>,
    /// Whether an upstream was built to serve.
    pub(crate) built: bool,
    /// Why a server it needs did not answer, if one did not.
    pub(crate) unavailable: Option<String>,
    /// The status a leader would write.
    pub(crate) status: serde_json::Value,
}

/// What an evaluation found, without what it built.
fn checked<B>((evaluation, status): (Evaluation<B>, serde_json::Value)) -> Checked {
    Checked {
        checks: evaluation.checks,
        built: evaluation.built.is_some(),
        unavailable: evaluation.unavailable,
        status,
    }
}

/// The kinds and the fixed namespace.
pub(crate) struct IdentityProviderChecks {
    sources: Sources,
    oidc: Kind,
    ldap: Kind,
    active_directory: Kind,
    github: Kind,
    /// Says "not the leader" to the kinds: nothing is written.
    _leader: watch::Sender<bool>,
}

impl IdentityProviderChecks {
    /// The kinds (under `pinniped.dev`) and the namespace's Secrets and ConfigMaps, `ca_pem`
    /// being the CA certificate the CA sources hold. Must run on a Tokio runtime (the kube
    /// client it makes, which is never used, starts a task); `Err` names what could not be made.
    pub(crate) fn new(ca_pem: &str) -> Result<Self, String> {
        let (secrets, mut secrets_writer) = reflector::store::<Secret>();
        let (config_maps, mut config_maps_writer) = reflector::store::<ConfigMap>();
        let meta = |name: &str| ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        };
        let secret = |name: &str, type_: &str, data: &[(&str, &str)]| Secret {
            metadata: meta(name),
            type_: Some(type_.into()),
            data: Some(
                data.iter()
                    .map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        for event in [Event::Init, Event::InitDone] {
            secrets_writer.apply_watcher_event(&event);
        }
        for event in [Event::Init, Event::InitDone] {
            config_maps_writer.apply_watcher_event(&event);
        }
        for fixed in [
            secret(CA_SECRET, "kubernetes.io/tls", &[("ca.crt", ca_pem)]),
            secret(NOT_PEM_SECRET, "Opaque", &[("ca.crt", "not a certificate")]),
            secret(
                OPAQUE_CREDENTIALS,
                "Opaque",
                &[
                    ("clientID", "fuzz"),
                    ("clientSecret", "fuzz"),
                    ("username", "cn=fuzz"),
                    ("password", "fuzz"),
                ],
            ),
        ] {
            secrets_writer.apply_watcher_event(&Event::Apply(fixed));
        }
        config_maps_writer.apply_watcher_event(&Event::Apply(ConfigMap {
            metadata: meta(CA_CONFIG_MAP),
            data: Some([("ca.crt".to_string(), ca_pem.to_string())].into()),
            ..ConfigMap::default()
        }));
        // A client of a server that is never asked: statuses are written by the leader only.
        let url = "http://127.0.0.1:1".parse().map_err(|e| format!("{e}"))?;
        let client = kube::Client::try_from(kube::Config::new(url)).map_err(|e| e.to_string())?;
        let (leader, leading) = watch::channel(false);
        let resource = |result: Result<kube::core::ApiResource, selkie_api::crds::CrdError>| {
            result
                .map(|resource| Kind::new(resource, &client, NAMESPACE, leading.clone()).0)
                .map_err(|e| e.to_string())
        };
        use selkie_api::crds::api_resource_with_group_suffix as resource_of;
        Ok(Self {
            sources: Sources {
                namespace: NAMESPACE.into(),
                secrets,
                config_maps,
            },
            oidc: resource(resource_of::<OIDCIdentityProvider>("pinniped.dev"))?,
            ldap: resource(resource_of::<LDAPIdentityProvider>("pinniped.dev"))?,
            active_directory: resource(resource_of::<ActiveDirectoryIdentityProvider>("pinniped.dev"))?,
            github: resource(resource_of::<GitHubIdentityProvider>("pinniped.dev"))?,
            _leader: leader,
        })
    }

    /// The first check of `object` (an identity provider of `kind`, as watched); `Err` when it
    /// cannot be read as its kind (the reconcile's error, which never quotes a value).
    pub(crate) async fn check(&self, kind: IdpKind, object: &DynamicObject) -> Result<Checked, String> {
        let sources = &self.sources;
        let result = match kind {
            IdpKind::Oidc => evaluate_once(&OidcProvider, &self.oidc, sources, object)
                .await
                .map(checked),
            IdpKind::Ldap => evaluate_once(
                &DirectoryProvider::<LDAPIdentityProvider>::default(),
                &self.ldap,
                sources,
                object,
            )
            .await
            .map(checked),
            IdpKind::ActiveDirectory => evaluate_once(
                &DirectoryProvider::<ActiveDirectoryIdentityProvider>::default(),
                &self.active_directory,
                sources,
                object,
            )
            .await
            .map(checked),
            IdpKind::GitHub => {
                let mut object = object.clone();
                if let Some(spec) = object.data.get_mut("spec").and_then(|spec| spec.as_object_mut()) {
                    let api = spec.entry("githubAPI").or_insert(serde_json::Value::Null);
                    if !api.is_object() {
                        *api = serde_json::json!({});
                    }
                    if let Some(api) = api.as_object_mut() {
                        api.insert(
                            "tls".into(),
                            serde_json::json!({"certificateAuthorityDataSource":
                                {"kind": "Secret", "name": MISSING_CA_SOURCE, "key": "ca.crt"}}),
                        );
                    }
                }
                // Whatever the object was, its TLS settings must now name the missing source:
                // anything else could let the check probe a host.
                let typed: GitHubIdentityProvider = typed(&object).map_err(|error| error.to_string())?;
                let source = typed
                    .spec
                    .github_api
                    .tls
                    .as_ref()
                    .and_then(|tls| tls.certificate_authority_data_source.as_ref());
                if source.is_none_or(|source| source.name != MISSING_CA_SOURCE) {
                    return Err("the object's TLS settings could not be replaced".into());
                }
                evaluate_once(&GitHubProvider, &self.github, sources, &object)
                    .await
                    .map(checked)
            }
        };
        result.map_err(|error| error.to_string())
    }
}
