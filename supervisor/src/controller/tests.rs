//! Unit tests of the controller's decisions, without kube-apiserver: what each identity-provider
//! kind concludes from its object and the watched Secrets (the conditions and phase it writes,
//! what it serves, whether it is retried), when the FederationDomains are woken ([`Upstreams`]),
//! which Secrets and ConfigMaps an object reads ([`names_source`], [`secret_pair`]) and what a
//! follower's FederationDomain reconciler serves ([`FederationDomainReconciler`]).
//!
//! The watched caches are kube-runtime reflector stores filled by hand, as the controller's
//! watches fill them (listed once, then one event per change). Each identity-provider kind runs
//! in its real [`IdentityProviderReconciler`] as the leader ([`Harness`]): `Provider::evaluate`
//! takes an `Interim` status writer only that module can make, and the reconciler is what an
//! admin sees anyway — its one kube-apiserver call, the status PATCH, is recorded by a local
//! stand-in ([`StatusApi`]), so every condition is asserted as written, with Pinniped's type,
//! status, reason and message. The other servers are real and local: an HTTPS server for OIDC
//! discovery and GitHub's API ([`FakeHttps`]), an LDAPS server that answers binds and the root
//! DSE ([`FakeDirectory`]), and a port that refuses connections for a server that does not
//! answer. Each counts what it was asked, so a test can prove that nothing was.

use std::{
    collections::HashSet,
    convert::Infallible,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use base64::{engine::general_purpose::STANDARD, Engine as _};
use bytes::Bytes;
use futures::{FutureExt as _, Stream, StreamExt as _};
use http_body_util::{BodyExt as _, Full};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    ByteString,
};
use kube::{
    api::{ApiResource, DynamicObject},
    runtime::{
        reflector::{self, store::Writer},
        watcher::Event,
    },
    ResourceExt as _,
};
use selkie_api::{
    supervisor_config::FederationDomain,
    supervisor_idp::{
        ActiveDirectoryIdentityProvider, GitHubIdentityProvider, LDAPIdentityProvider, OIDCIdentityProvider,
    },
};
use selkie_kube::{
    certs::CertPair,
    conditions::Status,
    reconcile::{PendingSources, Reconciler as _, SourceEvent, SourceKind},
    serving::ServingCert,
};
use selkie_oidc::{
    discovery::Discovery,
    https::TlsOptions,
    rp::{ClientConfig, Provider as Discovered},
};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    sync::watch,
    task::JoinHandle,
};

use crate::controller::directory::DirectoryProvider;
use crate::controller::federation_domains::FederationDomainReconciler;
use crate::controller::github::GitHubProvider;
use crate::controller::identity_provider::{IdentityProviderReconciler, Provider};
use crate::controller::keys::KeySecret;
use crate::controller::kind::Kind;
use crate::controller::oidc::OidcProvider;
use crate::controller::saml::SamlProvider;
use crate::controller::sources::{names_source, secret_pair, ReconcileError, Sources};
use crate::controller::upstreams::Upstreams;
use crate::controller::Outputs;
use crate::idp::{OidcUpstream, Upstream};
use crate::issuer::Issuers;

/// The Supervisor's namespace.
const NS: &str = "supervisor";
/// The identity providers' API group.
const IDP_GROUP: &str = "idp.supervisor.pinniped.dev";
/// Pinniped's message of a condition not evaluated because an earlier one failed.
const UNABLE: &str = "unable to validate; see other conditions for details";
const OIDC_SECRET_TYPE: &str = "secrets.pinniped.dev/oidc-client";
const GITHUB_SECRET_TYPE: &str = "secrets.pinniped.dev/github-client";
const BASIC_AUTH: &str = "kubernetes.io/basic-auth";
/// The fake directory's service account.
const BIND_DN: &str = "cn=admin,dc=corp,dc=example,dc=com";
const BIND_PASSWORD: &str = "admin-password";
/// The fake directory's root DSE `defaultNamingContext`.
const NAMING_CONTEXT: &str = "DC=corp,DC=example,DC=com";
/// Every wait for something that must happen at once.
const PROMPTLY: Duration = Duration::from_secs(5);

// ---- the watched caches -------------------------------------------------------------------------

/// The watched Secrets and ConfigMaps of the namespace, as the controller's reflectors fill them:
/// listed once (so [`Sources::ready`] returns), then changed one event at a time.
struct Watched {
    sources: Sources,
    secrets: Writer<Secret>,
    _config_maps: Writer<ConfigMap>,
}

impl Watched {
    fn new() -> Self {
        let (secrets_store, mut secrets) = reflector::store::<Secret>();
        let (config_maps_store, mut config_maps) = reflector::store::<ConfigMap>();
        for event in [Event::Init, Event::InitDone] {
            secrets.apply_watcher_event(&event);
        }
        for event in [Event::Init, Event::InitDone] {
            config_maps.apply_watcher_event(&event);
        }
        Self {
            sources: Sources {
                namespace: NS.into(),
                secrets: secrets_store,
                config_maps: config_maps_store,
            },
            secrets,
            _config_maps: config_maps,
        }
    }

    /// With `secrets` (created or changed).
    fn with(mut self, secrets: impl IntoIterator<Item = Secret>) -> Self {
        for secret in secrets {
            self.apply(secret);
        }
        self
    }

    fn apply(&mut self, secret: Secret) {
        self.secrets.apply_watcher_event(&Event::Apply(secret));
    }
}

/// A Secret of the namespace with `data` (text values), at resourceVersion `version`.
fn secret(name: &str, type_: &str, data: &[(&str, &str)], version: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        },
        type_: Some(type_.into()),
        data: Some(
            data.iter()
                .map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

// ---- written statuses ---------------------------------------------------------------------------

/// The condition `type_` of a written status, as [status, reason, message].
fn condition(status: &Value, type_: &str) -> [String; 3] {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
    status["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_))
        .map(|c| [text(&c["status"]), text(&c["reason"]), text(&c["message"])])
        .unwrap_or_else(|| panic!("no {type_} in {status:#}"))
}

#[track_caller]
fn assert_condition(status: &Value, type_: &str, expected: [&str; 3]) {
    assert_eq!(
        condition(status, type_),
        expected.map(String::from),
        "{type_} in {status:#}"
    );
}

/// The condition types of a written status, in its order.
fn condition_types(status: &Value) -> Vec<String> {
    status["conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("no conditions in {status}"))
        .iter()
        .map(|c| c["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Whether `status` has a condition of `type_`.
fn has_condition(status: &Value, type_: &str) -> bool {
    condition_types(status).iter().any(|t| t == type_)
}

/// Every condition of `status` observed `generation`.
#[track_caller]
fn assert_observed(status: &Value, generation: i64) {
    for c in status["conditions"].as_array().unwrap() {
        assert_eq!(c["observedGeneration"], generation, "{c}");
    }
}

fn sorted(types: &[&str]) -> Vec<String> {
    let mut types: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    types.sort();
    types
}

// ---- local servers ------------------------------------------------------------------------------

/// The CA and the 127.0.0.1 serving certificate of every fake server (made once: key generation
/// is the slowest part of starting one).
fn pki() -> &'static (CertPair, CertPair) {
    static PKI: OnceLock<(CertPair, CertPair)> = OnceLock::new();
    PKI.get_or_init(|| {
        let hour = Duration::from_secs(3600);
        let ca = selkie_kube::certs::generate_ca("controller tests CA", hour).unwrap();
        let serving = selkie_kube::certs::issue_serving(&ca, &["127.0.0.1".into()], hour).unwrap();
        (ca, serving)
    })
}

/// The fake servers' CA as `certificateAuthorityData`.
fn ca_data() -> String {
    STANDARD.encode(&pki().0.cert_pem)
}

fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    let (_, serving) = pki();
    crate::test_support::tls_acceptor(&serving.cert_pem, &serving.key_pem)
}

/// `127.0.0.1:<port>` of a socket that is bound but does not listen: connections to it are
/// refused at once, and no other test can be given the port while this lives.
struct Refused {
    address: String,
    _socket: tokio::net::TcpSocket,
}

fn refused() -> Refused {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    Refused {
        address: socket.local_addr().unwrap().to_string(),
        _socket: socket,
    }
}

/// An HTTPS server on 127.0.0.1 answering an OIDC discovery document (issuer
/// `https://<address>`), GitHub Enterprise's `/api/v3/rate_limit` and SAML IdP metadata
/// (`/saml/descriptor`), counting requests.
struct FakeHttps {
    address: String,
    requests: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl FakeHttps {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let issuer = format!("https://{address}");
        let acceptor = tls_acceptor();
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            // The connections are this task's: stopping it closes them too, so a client's pooled
            // connection cannot reach a stopped server.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, counter, issuer) = (acceptor.clone(), counter.clone(), issuer.clone());
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            counter.fetch_add(1, Ordering::SeqCst);
                            if request.uri().path() == "/saml/descriptor" {
                                let response = http::Response::builder()
                                    .header(http::header::CONTENT_TYPE, "application/xml")
                                    .body(Full::new(Bytes::from(
                                        crate::idp::saml::tests::test_idp_metadata_xml(),
                                    )))
                                    .unwrap();
                                return std::future::ready(Ok::<_, Infallible>(response)).left_future();
                            }
                            let body = match request.uri().path() {
                                "/.well-known/openid-configuration" => Some(json!({
                                    "issuer": issuer,
                                    "authorization_endpoint": format!("{issuer}/authorize"),
                                    "token_endpoint": format!("{issuer}/token"),
                                    "jwks_uri": format!("{issuer}/keys"),
                                })),
                                "/api/v3/rate_limit" => Some(json!({"resources": {}})),
                                _ => None,
                            };
                            let response = match body {
                                Some(body) => http::Response::builder()
                                    .header(http::header::CONTENT_TYPE, "application/json")
                                    .body(Full::new(Bytes::from(body.to_string()))),
                                None => http::Response::builder()
                                    .status(http::StatusCode::NOT_FOUND)
                                    .body(Full::new(Bytes::new())),
                            }
                            .unwrap();
                            async move { Ok::<_, Infallible>(response) }.right_future()
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            address,
            requests,
            task,
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Stops listening and closes the connections it serves: every later request to its
    /// address is refused, pooled connections or not.
    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// An LDAPS server on 127.0.0.1 that accepts the bind of [`BIND_DN`] with [`BIND_PASSWORD`]
/// (any other bind: `invalidCredentials`) and answers every search with the root DSE's
/// `defaultNamingContext` ([`NAMING_CONTEXT`]); it counts binds and searches.
struct FakeDirectory {
    address: String,
    binds: Arc<AtomicUsize>,
    searches: Arc<AtomicUsize>,
}

/// A BER element: `tag`, its definite length, `content`.
fn ber(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        len @ 0..=0x7f => out.push(len as u8),
        len @ 0x80..=0xff => out.extend([0x81, len as u8]),
        len => out.extend([0x82, (len >> 8) as u8, len as u8]),
    }
    out.extend_from_slice(content);
    out
}

/// The first BER element of `buf`, when complete: (tag, content, the bytes after it).
fn split_ber(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = buf.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        let bytes = rest.get(..count)?;
        let len = bytes
            .iter()
            .fold(0usize, |len, byte| (len << 8) | usize::from(*byte));
        (len, &rest[count..])
    };
    let content = rest.get(..len)?;
    Some((tag, content, &rest[len..]))
}

/// An LDAPResult-shaped answer (`op`: its application tag) with `code`.
fn ldap_result(op: u8, code: u8) -> Vec<u8> {
    ber(
        op,
        &[vec![0x0a, 0x01, code], ber(0x04, b""), ber(0x04, b"")].concat(),
    )
}

impl FakeDirectory {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let acceptor = tls_acceptor();
        let (binds, searches) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (bind_count, search_count) = (binds.clone(), searches.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, binds, searches) =
                    (acceptor.clone(), bind_count.clone(), search_count.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    loop {
                        let Some(used) = split_ber(&buf).map(|(_, _, rest)| buf.len() - rest.len()) else {
                            match tls.read_buf(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) => continue,
                            }
                        };
                        let whole: Vec<u8> = buf.drain(..used).collect();
                        let (_, message, _) = split_ber(&whole).unwrap();
                        // LDAPMessage: messageID, then the operation.
                        let (_, _, after_id) = split_ber(message).unwrap();
                        let id = &message[..message.len() - after_id.len()];
                        let (op, op_content, _) = split_ber(after_id).unwrap();
                        let mut answers = Vec::new();
                        match op {
                            // BindRequest: version, name, simple [0] password.
                            0x60 => {
                                binds.fetch_add(1, Ordering::SeqCst);
                                let (_, _, rest) = split_ber(op_content).unwrap();
                                let (_, name, rest) = split_ber(rest).unwrap();
                                let (_, password, _) = split_ber(rest).unwrap();
                                let good = name == BIND_DN.as_bytes() && password == BIND_PASSWORD.as_bytes();
                                answers.push(ldap_result(0x61, if good { 0 } else { 49 }));
                            }
                            // SearchRequest: the root DSE's entry, then done.
                            0x63 => {
                                searches.fetch_add(1, Ordering::SeqCst);
                                let attribute = ber(
                                    0x30,
                                    &[
                                        ber(0x04, b"defaultNamingContext"),
                                        ber(0x31, &ber(0x04, NAMING_CONTEXT.as_bytes())),
                                    ]
                                    .concat(),
                                );
                                answers.push(ber(0x64, &[ber(0x04, b""), ber(0x30, &attribute)].concat()));
                                answers.push(ldap_result(0x65, 0));
                            }
                            // UnbindRequest, or anything else: the end.
                            _ => return,
                        }
                        for answer in answers {
                            let reply = ber(0x30, &[id, &answer[..]].concat());
                            if tls.write_all(&reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self {
            address,
            binds,
            searches,
        }
    }

    fn binds(&self) -> usize {
        self.binds.load(Ordering::SeqCst)
    }

    fn searches(&self) -> usize {
        self.searches.load(Ordering::SeqCst)
    }
}

// ---- an identity-provider reconciler, leading -------------------------------------------------

/// The one kube-apiserver call an identity-provider reconciler makes — the PATCH of an object's
/// status — answered on 127.0.0.1 (plain HTTP): each request's method, path and JSON body is
/// recorded and answered 200. Nothing else of kube-apiserver exists here.
struct StatusApi {
    url: String,
    requests: Arc<Mutex<Vec<(String, String, Value)>>>,
}

impl StatusApi {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests: Arc<Mutex<Vec<(String, String, Value)>>> = Arc::default();
        let recorded = requests.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let recorded = recorded.clone();
                            async move {
                                let method = request.method().to_string();
                                let path = request.uri().path().to_string();
                                let body = request.into_body().collect().await.unwrap().to_bytes();
                                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                                recorded.lock().unwrap().push((method, path, body));
                                let answer = json!({
                                    "apiVersion": "idp.supervisor.pinniped.dev/v1alpha1",
                                    "kind": "Recorded",
                                    "metadata": {"name": "recorded", "namespace": NS},
                                });
                                Ok::<_, Infallible>(
                                    http::Response::builder()
                                        .header(http::header::CONTENT_TYPE, "application/json")
                                        .body(Full::new(Bytes::from(answer.to_string())))
                                        .unwrap(),
                                )
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Self { url, requests }
    }

    /// The statuses written since the last look, in order, checking each was a PATCH of the
    /// status of `plural`/`name` in the namespace, bound to the object's `uid`.
    fn written(&self, plural: &str, name: &str, uid: &str) -> Vec<Value> {
        // Selkie's own kinds live in Selkie's own group.
        let group = if plural == "samlidentityproviders" {
            selkie_api::supervisor_saml::GROUP
        } else {
            IDP_GROUP
        };
        let path = format!("/apis/{group}/v1alpha1/namespaces/{NS}/{plural}/{name}/status");
        std::mem::take(&mut *self.requests.lock().unwrap())
            .into_iter()
            .map(|(method, request_path, body)| {
                assert_eq!((method.as_str(), request_path.as_str()), ("PATCH", path.as_str()));
                assert_eq!(body["metadata"]["uid"], uid, "bound to the object's UID");
                body["status"].clone()
            })
            .collect()
    }
}

/// One identity-provider kind's reconciler as the leader runs it: its watched objects, the
/// watched Secrets, the upstreams it serves (and the FederationDomains' queue they wake), and
/// the statuses it writes ([`StatusApi`]).
struct Harness<P: Provider> {
    reconciler: Arc<IdentityProviderReconciler<P>>,
    objects: Writer<DynamicObject>,
    watched: Watched,
    upstreams: Arc<Upstreams>,
    wakes: Wakes,
    api: StatusApi,
    plural: String,
    _leader: watch::Sender<bool>,
}

/// How long one reconcile may take at most here: every server is local, and one that refuses
/// does so at once (this bound only keeps a broken test from hanging).
const RECONCILE_BOUND: Duration = Duration::from_secs(20);

impl<P: Provider> Harness<P> {
    async fn new(provider: P, resource: ApiResource) -> Self {
        let api = StatusApi::start().await;
        let client = kube::Client::try_from(kube::Config::new(api.url.parse().unwrap())).unwrap();
        let (leader, leading) = watch::channel(true);
        let plural = resource.plural.clone();
        let (kind, objects) = Kind::new(resource, &client, NS, leading);
        let watched = Watched::new();
        let pending = Arc::new(PendingSources::default());
        let wakes = Wakes::new(&pending);
        let upstreams = Arc::new(Upstreams::new(pending));
        let reconciler = Arc::new(IdentityProviderReconciler::new(
            kind,
            provider,
            watched.sources.clone(),
            upstreams.clone(),
        ));
        Self {
            reconciler,
            objects,
            watched,
            upstreams,
            wakes,
            api,
            plural,
            _leader: leader,
        }
    }

    /// Puts `object` in the kind's watched objects and reconciles it: `Ok` when nothing is to be
    /// retried, else the reason it is retried with backoff (a server did not answer).
    async fn reconcile(&mut self, object: &DynamicObject) -> Result<(), String> {
        self.objects.apply_watcher_event(&Event::Apply(object.clone()));
        let result = tokio::time::timeout(
            RECONCILE_BOUND,
            self.reconciler.clone().reconcile(Arc::new(object.clone())),
        )
        .await
        .expect("the reconcile ends");
        match result {
            Ok(_) => Ok(()),
            Err(ReconcileError::Unavailable(reason)) => Err(reason),
            Err(other) => panic!("unexpected failure: {other}"),
        }
    }

    /// The statuses written since the last look.
    fn written(&self, object: &DynamicObject) -> Vec<Value> {
        self.api.written(
            &self.plural,
            &object.name_any(),
            object.metadata.uid.as_deref().unwrap_or_default(),
        )
    }

    /// The one status written since the last look.
    #[track_caller]
    fn written_once(&self, object: &DynamicObject) -> Value {
        let mut written = self.written(object);
        assert_eq!(written.len(), 1, "{written:#?}");
        written.remove(0)
    }

    /// What is served for `name` of this kind.
    fn served(&self, name: &str) -> Option<Arc<Upstream>> {
        self.upstreams
            .snapshot()
            .get(&(P::KIND.to_string(), name.to_string()))
            .cloned()
    }
}

/// An identity provider `name` of `kind` (UID `<name>-uid`) at `generation` with `spec`, as
/// watched.
fn idp_object(kind: &str, name: &str, generation: i64, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "idp.supervisor.pinniped.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid"), "generation": generation},
        "spec": spec,
    }))
    .unwrap()
}

/// `object` as kube-apiserver holds it after `status` was written.
fn with_status(object: &DynamicObject, status: &Value) -> DynamicObject {
    let mut object = object.clone();
    object.data["status"] = status.clone();
    object
}

/// Adds the fields of `extra` (an object) to `value`.
fn merge(value: &mut Value, extra: Value) {
    if let (Some(value), Value::Object(extra)) = (value.as_object_mut(), extra) {
        value.extend(extra);
    }
}

// ---- OIDCIdentityProvider -----------------------------------------------------------------------

const OIDC: &str = "OIDCIdentityProvider";

async fn oidc_harness() -> Harness<OidcProvider> {
    Harness::new(OidcProvider, ApiResource::erase::<OIDCIdentityProvider>(&())).await
}

fn oidc_client_secret(client_secret: &str, version: &str) -> Secret {
    secret(
        "dex-client",
        OIDC_SECRET_TYPE,
        &[("clientID", "dex-client-id"), ("clientSecret", client_secret)],
        version,
    )
}

const OIDC_TYPES: [&str; 5] = [
    "AdditionalAuthorizeParametersValid",
    "ClientCredentialsSecretValid",
    "OIDCDiscoverySucceeded",
    "Ready",
    "TLSConfigurationValid",
];

#[tokio::test]
async fn oidc_client_secret_problems_are_pinnipeds_and_nothing_is_discovered() {
    let cases: [(&str, Option<Secret>, &str, &str); 4] = [
        (
            "missing",
            None,
            "SecretNotFound",
            r#"secret "dex-client" not found"#,
        ),
        (
            "wrong type",
            Some(secret(
                "dex-client",
                "Opaque",
                &[("clientID", "id"), ("clientSecret", "s")],
                "1",
            )),
            "SecretWrongType",
            r#"referenced Secret "dex-client" has wrong type "Opaque" (should be "secrets.pinniped.dev/oidc-client")"#,
        ),
        (
            "no clientSecret",
            Some(secret("dex-client", OIDC_SECRET_TYPE, &[("clientID", "id")], "1")),
            "SecretMissingKeys",
            r#"referenced Secret "dex-client" is missing required keys ["clientID" "clientSecret"]"#,
        ),
        (
            "empty clientID",
            Some(secret(
                "dex-client",
                OIDC_SECRET_TYPE,
                &[("clientID", ""), ("clientSecret", "s")],
                "1",
            )),
            "SecretMissingKeys",
            r#"referenced Secret "dex-client" is missing required keys ["clientID" "clientSecret"]"#,
        ),
    ];
    // An issuer that refuses connections: had discovery been tried, it would say Unreachable.
    let refused = refused();
    let issuer = format!("https://{}", refused.address);
    for (case, client_secret, reason, message) in cases {
        let mut harness = oidc_harness().await;
        if let Some(secret) = client_secret {
            harness.watched.apply(secret);
        }
        let dex = idp_object(
            OIDC,
            "dex",
            3,
            json!({"issuer": issuer, "client": {"secretName": "dex-client"}}),
        );
        assert_eq!(
            harness.reconcile(&dex).await,
            Ok(()),
            "{case}: the object must change; no retry"
        );
        let status = harness.written_once(&dex);
        assert_eq!(
            condition_types(&status),
            OIDC_TYPES,
            "{case}: one per type, sorted as Pinniped sorts"
        );
        assert_condition(
            &status,
            "ClientCredentialsSecretValid",
            ["False", reason, message],
        );
        assert_condition(
            &status,
            "TLSConfigurationValid",
            [
                "True",
                "Success",
                "spec.tls is valid: no TLS configuration provided: using default root CA bundle from container image",
            ],
        );
        assert_condition(
            &status,
            "AdditionalAuthorizeParametersValid",
            [
                "True",
                "Success",
                "additionalAuthorizeParameters parameter names are allowed",
            ],
        );
        assert_condition(
            &status,
            "OIDCDiscoverySucceeded",
            ["Unknown", "UnableToValidate", UNABLE],
        );
        assert_condition(
            &status,
            "Ready",
            [
                "False",
                "NotReady",
                "the OIDCIdentityProvider is not ready: see other conditions for details",
            ],
        );
        assert_eq!(status["phase"], "Error", "{case}");
        assert_observed(&status, 3);
        assert!(harness.served("dex").is_none(), "{case}: nothing is served");
    }
}

#[tokio::test]
async fn oidc_disallowed_authorize_parameters_are_named_and_nothing_is_discovered() {
    let refused = refused();
    let issuer = format!("https://{}", refused.address);
    let mut harness = oidc_harness().await;
    harness.watched.apply(oidc_client_secret("s", "1"));
    let dex = idp_object(
        OIDC,
        "dex",
        1,
        json!({
            "issuer": issuer,
            "client": {"secretName": "dex-client"},
            "authorizationConfig": {"additionalAuthorizeParameters": [
                {"name": "prompt", "value": "consent"},
                {"name": "state", "value": "x"},
                {"name": "hd", "value": "example.com"},
            ]},
        }),
    );
    assert_eq!(harness.reconcile(&dex).await, Ok(()));
    let status = harness.written_once(&dex);
    assert_condition(
        &status,
        "ClientCredentialsSecretValid",
        ["True", "Success", "loaded client credentials"],
    );
    assert_condition(
        &status,
        "AdditionalAuthorizeParametersValid",
        [
            "False",
            "DisallowedParameterName",
            "the following additionalAuthorizeParameters are not allowed: state,hd",
        ],
    );
    assert_condition(
        &status,
        "OIDCDiscoverySucceeded",
        ["Unknown", "UnableToValidate", UNABLE],
    );
    assert_eq!(status["phase"], "Error");
    assert!(harness.served("dex").is_none());

    // Every parameter Pinniped reserves is refused on its own.
    for name in [
        "response_type",
        "scope",
        "client_id",
        "state",
        "nonce",
        "code_challenge",
        "code_challenge_method",
        "redirect_uri",
        "hd",
    ] {
        let dex = idp_object(
            OIDC,
            "dex",
            1,
            json!({
                "issuer": issuer,
                "client": {"secretName": "dex-client"},
                "authorizationConfig": {"additionalAuthorizeParameters": [{"name": name, "value": "v"}]},
            }),
        );
        assert_eq!(harness.reconcile(&dex).await, Ok(()));
        let status = harness.written_once(&dex);
        let message = format!("the following additionalAuthorizeParameters are not allowed: {name}");
        assert_condition(
            &status,
            "AdditionalAuthorizeParametersValid",
            ["False", "DisallowedParameterName", &message],
        );
    }
}

#[tokio::test]
async fn oidc_issuer_that_does_not_answer_is_unreachable_and_retried() {
    let refused = refused();
    let issuer = format!("https://{}", refused.address);
    let mut harness = oidc_harness().await;
    harness.watched.apply(oidc_client_secret("s", "1"));
    let dex = idp_object(
        OIDC,
        "dex",
        1,
        json!({"issuer": issuer, "client": {"secretName": "dex-client"}}),
    );
    let retried = harness.reconcile(&dex).await.expect_err("retried with backoff");

    let written = harness.written(&dex);
    assert_eq!(
        written.len(),
        2,
        "while discovering, then the outcome: {written:#?}"
    );
    assert_condition(
        &written[0],
        "OIDCDiscoverySucceeded",
        [
            "Unknown",
            "UnableToValidate",
            &format!("performing OIDC discovery against {issuer:?}"),
        ],
    );
    let status = &written[1];
    let [state, reason, message] = condition(status, "OIDCDiscoverySucceeded");
    assert_eq!((state.as_str(), reason.as_str()), ("False", "Unreachable"));
    let prefix = format!("failed to perform OIDC discovery against {issuer:?}:\n");
    assert!(
        message.starts_with(&prefix) && message.len() > prefix.len(),
        "{message:?}"
    );
    assert_eq!(retried, message, "the retry says why");
    assert_condition(
        status,
        "ClientCredentialsSecretValid",
        ["True", "Success", "loaded client credentials"],
    );
    assert_eq!(status["phase"], "Error");
    assert_eq!(condition(status, "Ready")[0], "False");
    assert!(harness.served("dex").is_none());
}

/// The upstream built for a working issuer bounds each request to it by
/// [`crate::controller::oidc::UPSTREAM_TIMEOUT`], well within the 60 s the Supervisor's own
/// clients wait for it, so that a black-holed upstream is answered `temporarily_unavailable`
/// before they give up (before, the upstream's requests had the CLI's own 60 s).
#[tokio::test]
async fn oidc_upstream_requests_are_bounded_well_within_the_clients_timeout() {
    let server = FakeHttps::start().await;
    let mut harness = oidc_harness().await;
    harness
        .watched
        .apply(oidc_client_secret("dex-client-secret", "1"));
    let dex = idp_object(
        OIDC,
        "dex",
        1,
        json!({
            "issuer": server.url(),
            "tls": {"certificateAuthorityData": ca_data()},
            "client": {"secretName": "dex-client"},
        }),
    );
    assert_eq!(harness.reconcile(&dex).await, Ok(()));
    let upstream = harness.served("dex").expect("served");
    let Upstream::Oidc(oidc) = &*upstream else {
        panic!("not an OIDC upstream");
    };
    assert_eq!(oidc.provider.timeout(), crate::controller::oidc::UPSTREAM_TIMEOUT);
    assert!(oidc.provider.timeout() * 3 <= selkie_oidc::rp::HTTP_TIMEOUT);
}

/// The reconciler keeps what each object last built; a reconcile of the same object with the
/// same Secret and CA bundle must not discover again. The issuer is a real discovery document on
/// 127.0.0.1; after the first reconcile the server stops listening, so a discovery attempt would
/// be refused (`Unreachable`) — a `Success` afterwards proves none was made, as does the request
/// count while it is up.
#[tokio::test]
async fn oidc_working_issuer_is_served_and_not_discovered_again_until_something_changes() {
    let server = FakeHttps::start().await;
    let mut harness = oidc_harness().await;
    harness
        .watched
        .apply(oidc_client_secret("dex-client-secret", "1"));
    let spec = json!({
        "issuer": server.url(),
        "tls": {"certificateAuthorityData": ca_data()},
        "client": {"secretName": "dex-client"},
    });
    let dex = idp_object(OIDC, "dex", 1, spec.clone());
    assert_eq!(harness.reconcile(&dex).await, Ok(()));
    assert_eq!(server.requests(), 1, "one discovery");
    let written = harness.written(&dex);
    assert_eq!(written.len(), 2, "{written:#?}");
    let status = written[1].clone();
    assert_condition(
        &status,
        "ClientCredentialsSecretValid",
        ["True", "Success", "loaded client credentials"],
    );
    assert_condition(
        &status,
        "TLSConfigurationValid",
        ["True", "Success", "spec.tls is valid: using configured CA bundle"],
    );
    assert_condition(
        &status,
        "AdditionalAuthorizeParametersValid",
        [
            "True",
            "Success",
            "additionalAuthorizeParameters parameter names are allowed",
        ],
    );
    assert_condition(
        &status,
        "OIDCDiscoverySucceeded",
        ["True", "Success", "discovered issuer configuration"],
    );
    assert_condition(
        &status,
        "Ready",
        ["True", "Success", "the OIDCIdentityProvider is ready"],
    );
    assert_eq!(status["phase"], "Ready");

    let upstream = harness.served("dex").expect("served");
    let Upstream::Oidc(oidc) = &*upstream else {
        panic!("not an OIDC upstream");
    };
    assert_eq!(oidc.resource_uid, "dex-uid");
    assert_eq!(oidc.client.client_id, "dex-client-id");
    assert_eq!(oidc.client.client_secret.as_deref(), Some("dex-client-secret"));
    assert_eq!(
        oidc.client.scopes,
        ["openid", "offline_access", "email", "profile"]
    );
    assert!(harness.wakes.woke().await, "the FederationDomains look again");

    // Again, the status as written: nothing asked, nothing written, nothing new served.
    let dex_now = with_status(&dex, &status);
    assert_eq!(harness.reconcile(&dex_now).await, Ok(()));
    assert_eq!(server.requests(), 1, "no second discovery");
    assert!(harness.written(&dex).is_empty(), "the status is unchanged");
    assert!(Arc::ptr_eq(&harness.served("dex").unwrap(), &upstream));
    assert!(
        !harness.wakes.woke().await,
        "the FederationDomains are left alone"
    );

    server.stop().await;
    assert_eq!(
        harness.reconcile(&dex_now).await,
        Ok(()),
        "no network was attempted"
    );
    assert!(harness.written(&dex).is_empty());

    // A new client secret is not covered by the old build: discovery again, which fails now;
    // the last working upstream keeps serving meanwhile, and its status stands until the check
    // ends (no interim not-ready status while it serves).
    harness.watched.apply(oidc_client_secret("rotated-secret", "2"));
    assert!(harness.reconcile(&dex_now).await.is_err());
    let written = harness.written_once(&dex);
    assert_eq!(condition(&written, "OIDCDiscoverySucceeded")[1], "Unreachable");
    assert!(Arc::ptr_eq(&harness.served("dex").unwrap(), &upstream));

    // So is a new generation of the object.
    harness
        .watched
        .apply(oidc_client_secret("dex-client-secret", "3"));
    let newer = with_status(&idp_object(OIDC, "dex", 2, spec), &status);
    assert!(harness.reconcile(&newer).await.is_err());
}

// ---- LDAPIdentityProvider and ActiveDirectoryIdentityProvider -----------------------------------

const LDAP: &str = "LDAPIdentityProvider";
const AD: &str = "ActiveDirectoryIdentityProvider";

async fn ldap_harness() -> Harness<DirectoryProvider<LDAPIdentityProvider>> {
    Harness::new(
        DirectoryProvider::default(),
        ApiResource::erase::<LDAPIdentityProvider>(&()),
    )
    .await
}

async fn ad_harness() -> Harness<DirectoryProvider<ActiveDirectoryIdentityProvider>> {
    Harness::new(
        DirectoryProvider::default(),
        ApiResource::erase::<ActiveDirectoryIdentityProvider>(&()),
    )
    .await
}

/// A directory identity provider of `kind` at `host` trusting the fake servers' CA, with the
/// search settings of `search`.
fn directory_object(kind: &str, name: &str, host: &str, search: Value) -> DynamicObject {
    let mut spec = json!({
        "host": host,
        "tls": {"certificateAuthorityData": ca_data()},
        "bind": {"secretName": "bind"},
    });
    merge(&mut spec, search);
    idp_object(kind, name, 1, spec)
}

fn bind_secret(password: &str, version: &str) -> Secret {
    secret(
        "bind",
        BASIC_AUTH,
        &[("username", BIND_DN), ("password", password)],
        version,
    )
}

#[tokio::test]
async fn directory_bind_secret_problems_are_pinnipeds_and_the_directory_is_not_probed() {
    let cases: [(&str, Option<Secret>, &str, &str); 4] = [
        ("missing", None, "SecretNotFound", r#"secret "bind" not found"#),
        (
            "wrong type",
            Some(secret(
                "bind",
                "Opaque",
                &[("username", BIND_DN), ("password", "p")],
                "1",
            )),
            "SecretWrongType",
            r#"referenced Secret "bind" has wrong type "Opaque" (should be "kubernetes.io/basic-auth")"#,
        ),
        (
            "no password",
            Some(secret("bind", BASIC_AUTH, &[("username", BIND_DN)], "1")),
            "SecretMissingKeys",
            r#"referenced Secret "bind" is missing required keys ["username" "password"]"#,
        ),
        (
            "empty username",
            Some(secret(
                "bind",
                BASIC_AUTH,
                &[("username", ""), ("password", "p")],
                "1",
            )),
            "SecretMissingKeys",
            r#"referenced Secret "bind" is missing required keys ["username" "password"]"#,
        ),
    ];
    // A host that refuses connections: had it been probed, LDAPConnectionValid would be False.
    let refused = refused();
    let host = refused.address.clone();
    for (case, bind, reason, message) in cases {
        let mut ldap = ldap_harness().await;
        let mut ad = ad_harness().await;
        if let Some(secret) = bind {
            ldap.watched.apply(secret.clone());
            ad.watched.apply(secret);
        }

        let object = directory_object(LDAP, "ldap", &host, json!({}));
        assert_eq!(ldap.reconcile(&object).await, Ok(()), "{case}: no retry");
        let status = ldap.written_once(&object);
        assert_eq!(
            condition_types(&status),
            sorted(&[
                "BindSecretValid",
                "TLSConfigurationValid",
                "LDAPConnectionValid",
                "Ready"
            ]),
            "{case}"
        );
        assert_condition(&status, "BindSecretValid", ["False", reason, message]);
        assert_condition(
            &status,
            "TLSConfigurationValid",
            ["True", "Success", "spec.tls is valid: using configured CA bundle"],
        );
        assert_condition(
            &status,
            "LDAPConnectionValid",
            ["Unknown", "UnableToValidate", UNABLE],
        );
        assert_condition(
            &status,
            "Ready",
            [
                "False",
                "NotReady",
                "the LDAPIdentityProvider is not ready: see other conditions for details",
            ],
        );
        assert_eq!(status["phase"], "Error", "{case}");
        assert!(ldap.served("ldap").is_none(), "{case}");

        let object = directory_object(AD, "ad", &host, json!({}));
        assert_eq!(ad.reconcile(&object).await, Ok(()), "{case}: no retry");
        let status = ad.written_once(&object);
        assert_eq!(
            condition_types(&status),
            sorted(&[
                "BindSecretValid",
                "TLSConfigurationValid",
                "LDAPConnectionValid",
                "SearchBaseFound",
                "Ready"
            ]),
            "{case}"
        );
        assert_condition(&status, "BindSecretValid", ["False", reason, message]);
        assert_condition(
            &status,
            "LDAPConnectionValid",
            ["Unknown", "UnableToValidate", UNABLE],
        );
        assert_condition(
            &status,
            "SearchBaseFound",
            ["Unknown", "UnableToValidate", UNABLE],
        );
        assert_condition(
            &status,
            "Ready",
            [
                "False",
                "NotReady",
                "the ActiveDirectoryIdentityProvider is not ready: see other conditions for details",
            ],
        );
        assert_eq!(status["phase"], "Error", "{case}");
        assert!(ad.served("ad").is_none(), "{case}");
    }
}

/// The `LDAPConnectionValid` of a host that refuses connections, worded as Pinniped words it
/// (`could not successfully connect to "<host>" and bind as user "<bind DN>": <error>`, from
/// `upstreamwatchers.TestConnection`; the error is the client library's own); returns its
/// message.
#[track_caller]
fn assert_connection_refused(status: &Value, host: &str) -> String {
    let [state, reason, message] = condition(status, "LDAPConnectionValid");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("False", "LDAPConnectionError")
    );
    let prefix = format!("could not successfully connect to \"{host}\" and bind as user \"{BIND_DN}\": ");
    assert!(message.starts_with(&prefix), "{message:?}");
    assert!(message.contains("could not be reached"), "says why: {message:?}");
    message
}

#[tokio::test]
async fn directory_that_refuses_connections_is_a_connection_error_and_retried() {
    let refused = refused();
    let host = refused.address.clone();
    let mut ldap = ldap_harness().await;
    ldap.watched.apply(bind_secret(BIND_PASSWORD, "1"));
    let object = directory_object(LDAP, "ldap", &host, json!({}));
    let retried = ldap.reconcile(&object).await.expect_err("retried with backoff");
    let written = ldap.written(&object);
    assert_eq!(written.len(), 2, "while probing, then the outcome: {written:#?}");
    assert_condition(
        &written[0],
        "LDAPConnectionValid",
        [
            "Unknown",
            "UnableToValidate",
            &format!("checking the connection to {host:?}"),
        ],
    );
    let status = &written[1];
    assert_condition(
        status,
        "BindSecretValid",
        ["True", "Success", "loaded bind secret"],
    );
    let message = assert_connection_refused(status, &host);
    assert_eq!(retried, format!("LDAPConnectionValid: {message}"));
    assert_eq!(status["phase"], "Error");
    assert!(ldap.served("ldap").is_none());

    // Active Directory without search bases: they would come from the directory, which is down.
    let mut ad = ad_harness().await;
    ad.watched.apply(bind_secret(BIND_PASSWORD, "1"));
    let object = directory_object(AD, "ad", &host, json!({}));
    assert!(ad.reconcile(&object).await.is_err());
    let status = ad.written(&object).pop().unwrap();
    assert_connection_refused(&status, &host);
    assert_condition(
        &status,
        "SearchBaseFound",
        ["Unknown", "UnableToValidate", UNABLE],
    );
    assert!(ad.served("ad").is_none());

    // With both bases in the spec, the search base holds whatever the directory does.
    let object = directory_object(
        AD,
        "ad",
        &host,
        json!({"userSearch": {"base": "OU=users,DC=x"}, "groupSearch": {"base": "OU=groups,DC=x"}}),
    );
    assert!(ad.reconcile(&object).await.is_err());
    let status = ad.written(&object).pop().unwrap();
    assert_connection_refused(&status, &host);
    assert_condition(
        &status,
        "SearchBaseFound",
        [
            "True",
            "UsingConfigurationFromSpec",
            "Using search base from ActiveDirectoryIdentityProvider config.",
        ],
    );
    assert!(ad.served("ad").is_none());
}

#[tokio::test]
async fn directory_that_works_is_served_and_not_probed_again_until_its_secret_changes() {
    let directory = FakeDirectory::start().await;
    let mut ldap = ldap_harness().await;
    ldap.watched.apply(bind_secret(BIND_PASSWORD, "7"));
    let object = directory_object(
        LDAP,
        "ldap",
        &directory.address,
        json!({
            "userSearch": {"base": "ou=users,dc=corp", "filter": "uid={}", "attributes": {"username": "uid", "uid": "uidNumber"}},
            "groupSearch": {"base": "ou=groups,dc=corp"},
        }),
    );
    assert_eq!(ldap.reconcile(&object).await, Ok(()));
    assert_eq!(directory.binds(), 1);
    let status = ldap.written(&object).pop().unwrap();
    assert_condition(
        &status,
        "BindSecretValid",
        ["True", "Success", "loaded bind secret"],
    );
    let connected = format!(
        r#"successfully able to connect to "{}" and bind as user "{BIND_DN}" [validated with Secret "bind" at version "7"]"#,
        directory.address
    );
    assert_condition(&status, "LDAPConnectionValid", ["True", "Success", &connected]);
    assert_condition(
        &status,
        "Ready",
        ["True", "Success", "the LDAPIdentityProvider is ready"],
    );
    assert_eq!(status["phase"], "Ready");
    assert!(
        !has_condition(&status, "SearchBaseFound"),
        "Active Directory's only"
    );

    let upstream = ldap.served("ldap").expect("served");
    let Upstream::Ldap(served) = &*upstream else {
        panic!("not a directory");
    };
    assert_eq!(served.resource_uid, "ldap-uid");
    let config = served.directory.config();
    assert_eq!(
        (config.bind_dn.as_str(), config.bind_password.as_str()),
        (BIND_DN, BIND_PASSWORD)
    );
    assert_eq!(
        (
            config.user_search.filter.as_str(),
            config.user_search.uid_attribute.as_str()
        ),
        ("uid={}", "uidNumber")
    );

    // Unchanged: no probe, nothing written, the same upstream.
    let now = with_status(&object, &status);
    assert_eq!(ldap.reconcile(&now).await, Ok(()));
    assert_eq!(directory.binds(), 1, "not probed again");
    assert!(ldap.written(&object).is_empty());
    assert!(Arc::ptr_eq(&ldap.served("ldap").unwrap(), &upstream));

    // A new version of the Secret is probed; the directory refuses the new password, and the
    // last working form keeps serving.
    ldap.watched.apply(bind_secret("wrong-password", "8"));
    assert!(ldap.reconcile(&now).await.is_err());
    assert_eq!(directory.binds(), 2, "probed again");
    let status = ldap.written(&object).pop().unwrap();
    assert_eq!(
        condition(&status, "LDAPConnectionValid")[..2],
        ["False", "LDAPConnectionError"]
    );
    assert!(Arc::ptr_eq(&ldap.served("ldap").unwrap(), &upstream));
}

#[tokio::test]
async fn active_directory_defaults_are_filled_in_and_the_search_base_comes_from_the_root_dse() {
    let directory = FakeDirectory::start().await;
    let mut ad = ad_harness().await;
    ad.watched.apply(bind_secret(BIND_PASSWORD, "1"));
    let object = directory_object(AD, "ad", &directory.address, json!({}));
    assert_eq!(ad.reconcile(&object).await, Ok(()));
    let status = ad.written(&object).pop().unwrap();
    assert_condition(
        &status,
        "SearchBaseFound",
        [
            "True",
            "Success",
            "Successfully fetched defaultNamingContext to use as default search base from RootDSE.",
        ],
    );
    assert_condition(
        &status,
        "Ready",
        ["True", "Success", "the ActiveDirectoryIdentityProvider is ready"],
    );
    assert_eq!(directory.searches(), 1);
    let upstream = ad.served("ad").expect("served");
    let Upstream::Ldap(served) = &*upstream else {
        panic!("not a directory");
    };
    let config = served.directory.config();
    assert_eq!(config.user_search.base, NAMING_CONTEXT);
    assert_eq!(config.group_search.base, NAMING_CONTEXT);
    assert_eq!(
        config.user_search.filter,
        "(&(objectClass=person)(!(objectClass=computer))(!(showInAdvancedViewOnly=TRUE))(|(sAMAccountName={})(mail={})(userPrincipalName={}))(sAMAccountType=805306368))"
    );
    assert_eq!(config.user_search.username_attribute, "userPrincipalName");
    assert_eq!(config.user_search.uid_attribute, "objectGUID");
    assert_eq!(
        config.group_search.filter,
        "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={}))"
    );
    assert_eq!(
        config.group_search.group_name_attribute, "",
        "empty: <sAMAccountName>@<domain> at search time"
    );

    // What the spec says wins over every default, and bases from the spec need no search.
    let object = directory_object(
        AD,
        "ad",
        &directory.address,
        json!({
            "userSearch": {"base": "OU=people,DC=x", "filter": "(sAMAccountName={})", "attributes": {"username": "sAMAccountName", "uid": "objectSid"}},
            "groupSearch": {"base": "OU=teams,DC=x", "filter": "(member={})", "attributes": {"groupName": "cn"}},
        }),
    );
    let object = idp_object(AD, "ad", 2, object.data["spec"].clone());
    assert_eq!(ad.reconcile(&object).await, Ok(()));
    let status = ad.written(&object).pop().unwrap();
    assert_condition(
        &status,
        "SearchBaseFound",
        [
            "True",
            "UsingConfigurationFromSpec",
            "Using search base from ActiveDirectoryIdentityProvider config.",
        ],
    );
    assert_eq!(directory.searches(), 1, "no root DSE search");
    let upstream = ad.served("ad").expect("served");
    let Upstream::Ldap(served) = &*upstream else {
        panic!("not a directory");
    };
    let config = served.directory.config();
    assert_eq!(
        [
            config.user_search.base.as_str(),
            config.user_search.filter.as_str(),
            config.user_search.username_attribute.as_str(),
            config.user_search.uid_attribute.as_str(),
            config.group_search.base.as_str(),
            config.group_search.filter.as_str(),
            config.group_search.group_name_attribute.as_str(),
        ],
        [
            "OU=people,DC=x",
            "(sAMAccountName={})",
            "sAMAccountName",
            "objectSid",
            "OU=teams,DC=x",
            "(member={})",
            "cn"
        ]
    );

    // LDAP has no such defaults: the same empty spec stays empty.
    let mut ldap = ldap_harness().await;
    ldap.watched.apply(bind_secret(BIND_PASSWORD, "1"));
    let object = directory_object(LDAP, "ldap", &directory.address, json!({}));
    assert_eq!(ldap.reconcile(&object).await, Ok(()));
    let upstream = ldap.served("ldap").expect("served");
    let Upstream::Ldap(served) = &*upstream else {
        panic!("not a directory");
    };
    let config = served.directory.config();
    assert_eq!(
        [
            config.user_search.filter.as_str(),
            config.user_search.username_attribute.as_str(),
            config.user_search.uid_attribute.as_str(),
            config.group_search.filter.as_str(),
        ],
        ["", "", "", ""]
    );
}

// ---- GitHubIdentityProvider ---------------------------------------------------------------------

const GITHUB: &str = "GitHubIdentityProvider";

async fn github_harness() -> Harness<GitHubProvider> {
    let mut harness = Harness::new(GitHubProvider, ApiResource::erase::<GitHubIdentityProvider>(&())).await;
    harness.watched.apply(github_secret());
    harness
}

/// The GitHubIdentityProvider `github` at `host`, trusting the fake servers' CA, as
/// kube-apiserver defaults it, with the fields of `overrides` instead.
fn github_object(host: &str, overrides: Value) -> DynamicObject {
    let mut spec = json!({
        "githubAPI": {"host": host, "tls": {"certificateAuthorityData": ca_data()}},
        "claims": {"username": "login:id", "groups": "slug"},
        "allowAuthentication": {"organizations": {"policy": "OnlyUsersFromAllowedOrganizations", "allowed": ["org"]}},
        "client": {"secretName": "github-client"},
    });
    merge(&mut spec, overrides);
    idp_object(GITHUB, "github", 1, spec)
}

fn github_secret() -> Secret {
    secret(
        "github-client",
        GITHUB_SECRET_TYPE,
        &[("clientID", "github-id"), ("clientSecret", "github-secret")],
        "1",
    )
}

/// Pinniped's six conditions, always all of them, and no `Ready`.
fn github_types() -> Vec<String> {
    sorted(&[
        "ClientCredentialsSecretValid",
        "ClaimsValid",
        "OrganizationsPolicyValid",
        "HostValid",
        "TLSConfigurationValid",
        "GitHubConnectionValid",
    ])
}

#[tokio::test]
async fn github_that_works_is_served_without_a_ready_condition_and_not_probed_again() {
    let server = FakeHttps::start().await;
    let mut harness = github_harness().await;
    let object = github_object(&server.address, json!({}));
    assert_eq!(harness.reconcile(&object).await, Ok(()));
    assert_eq!(server.requests(), 1, "one probe");
    let written = harness.written(&object);
    let address = &server.address;
    assert_condition(
        &written[0],
        "GitHubConnectionValid",
        [
            "Unknown",
            "UnableToValidate",
            &format!(r#"probing the connection to "{address}" for spec.githubAPI.host ("{address}")"#),
        ],
    );
    let status = written.last().unwrap().clone();
    assert_eq!(
        condition_types(&status),
        github_types(),
        "no Ready condition, as in Pinniped"
    );
    assert_condition(
        &status,
        "ClientCredentialsSecretValid",
        [
            "True",
            "Success",
            r#"clientID and clientSecret have been read from spec.client.SecretName ("github-client")"#,
        ],
    );
    assert_condition(
        &status,
        "ClaimsValid",
        ["True", "Success", "spec.claims are valid"],
    );
    assert_condition(
        &status,
        "OrganizationsPolicyValid",
        [
            "True",
            "Success",
            r#"spec.allowAuthentication.organizations.policy ("OnlyUsersFromAllowedOrganizations") is valid"#,
        ],
    );
    assert_condition(
        &status,
        "HostValid",
        [
            "True",
            "Success",
            &format!(r#"spec.githubAPI.host ("{address}") is valid"#),
        ],
    );
    assert_condition(
        &status,
        "TLSConfigurationValid",
        [
            "True",
            "Success",
            "spec.githubAPI.tls is valid: using configured CA bundle",
        ],
    );
    assert_condition(
        &status,
        "GitHubConnectionValid",
        [
            "True",
            "Success",
            &format!(
                r#"probed connection to "{address}" for spec.githubAPI.host ("{address}"): host is reachable and TLS verification succeeds"#
            ),
        ],
    );
    assert_eq!(status["phase"], "Ready");

    let upstream = harness.served("github").expect("served");
    let Upstream::GitHub(github) = &*upstream else {
        panic!("not GitHub");
    };
    assert_eq!(github.resource_uid, "github-uid");
    assert_eq!(github.github.client_id, "github-id");
    assert_eq!(github.github.endpoints.api, format!("https://{address}/api/v3"));
    assert!(harness.wakes.woke().await);

    // Unchanged: no probe, nothing written, the same upstream, the FederationDomains left alone.
    let now = with_status(&object, &status);
    assert_eq!(harness.reconcile(&now).await, Ok(()));
    assert_eq!(server.requests(), 1, "not probed again");
    assert!(harness.written(&object).is_empty());
    assert!(Arc::ptr_eq(&harness.served("github").unwrap(), &upstream));
    assert!(!harness.wakes.woke().await);

    // Another organization: a new upstream (the address and CAs are the same: no probe).
    let other = github_object(
        &server.address,
        json!({"allowAuthentication": {"organizations": {"policy": "OnlyUsersFromAllowedOrganizations", "allowed": ["other"]}}}),
    );
    assert_eq!(harness.reconcile(&with_status(&other, &status)).await, Ok(()));
    assert_eq!(server.requests(), 1);
    assert!(!Arc::ptr_eq(&harness.served("github").unwrap(), &upstream));
    assert!(harness.wakes.woke().await);
}

#[tokio::test]
async fn github_organizations_policy_rules_are_pinnipeds() {
    let server = FakeHttps::start().await;
    let needs_only = "spec.allowAuthentication.organizations.policy must be 'OnlyUsersFromAllowedOrganizations' when spec.allowAuthentication.organizations.allowed has organizations listed";
    let needs_all = "spec.allowAuthentication.organizations.policy must be 'AllGitHubUsers' when spec.allowAuthentication.organizations.allowed is empty";
    let cases: [(Value, Result<&str, &str>); 6] = [
        (
            json!({"policy": "AllGitHubUsers"}),
            Ok(r#"spec.allowAuthentication.organizations.policy ("AllGitHubUsers") is valid"#),
        ),
        (
            json!({"policy": "OnlyUsersFromAllowedOrganizations", "allowed": ["org"]}),
            Ok(
                r#"spec.allowAuthentication.organizations.policy ("OnlyUsersFromAllowedOrganizations") is valid"#,
            ),
        ),
        (
            json!({"policy": "AllGitHubUsers", "allowed": ["org"]}),
            Err(needs_only),
        ),
        (
            json!({"policy": "OnlyUsersFromAllowedOrganizations"}),
            Err(needs_all),
        ),
        (json!({}), Err(needs_all)),
        (json!({"allowed": ["org"]}), Err(needs_only)),
    ];
    for (organizations, expected) in cases {
        let mut harness = github_harness().await;
        let object = github_object(
            &server.address,
            json!({"allowAuthentication": {"organizations": organizations.clone()}}),
        );
        assert_eq!(
            harness.reconcile(&object).await,
            Ok(()),
            "{organizations}: no retry"
        );
        let status = harness.written(&object).pop().unwrap();
        // The connection is fine either way: only the configuration decides.
        assert_eq!(
            condition(&status, "GitHubConnectionValid")[0],
            "True",
            "{organizations}"
        );
        match expected {
            Ok(message) => {
                assert_condition(&status, "OrganizationsPolicyValid", ["True", "Success", message]);
                assert_eq!(status["phase"], "Ready");
                assert!(harness.served("github").is_some(), "{organizations}");
            }
            Err(message) => {
                assert_condition(&status, "OrganizationsPolicyValid", ["False", "Invalid", message]);
                assert_eq!(status["phase"], "Error");
                assert!(harness.served("github").is_none(), "{organizations}");
            }
        }
    }
}

#[tokio::test]
async fn github_missing_claims_are_invalid() {
    let server = FakeHttps::start().await;
    for (claims, message) in [
        (json!({"groups": "slug"}), "spec.claims.username is required"),
        (json!({"username": "id"}), "spec.claims.groups is required"),
        (json!({}), "spec.claims.username is required"),
    ] {
        let mut harness = github_harness().await;
        let object = github_object(&server.address, json!({"claims": claims}));
        assert_eq!(harness.reconcile(&object).await, Ok(()), "{message}");
        let status = harness.written(&object).pop().unwrap();
        assert_eq!(condition_types(&status), github_types());
        assert_condition(&status, "ClaimsValid", ["False", "Invalid", message]);
        assert_eq!(status["phase"], "Error");
        assert!(harness.served("github").is_none(), "{message}");
    }
}

#[tokio::test]
async fn github_invalid_host_is_named_and_the_connection_is_not_probed() {
    for (host, reason) in [
        ("", "must not be empty"),
        (
            "https://github.com",
            r#"invalid host "https://github.com": not a host or host:port"#,
        ),
        (
            "user@ghe.example.com",
            r#"invalid host "user@ghe.example.com": must not contain user information"#,
        ),
        (
            "ghe.example.com:0",
            r#"invalid host "ghe.example.com:0": the port is not a number from 1 to 65535"#,
        ),
    ] {
        let mut harness = github_harness().await;
        let object = github_object(host, json!({}));
        assert_eq!(harness.reconcile(&object).await, Ok(()), "{host}: no retry");
        let status = harness.written_once(&object);
        assert_eq!(condition_types(&status), github_types());
        let message = format!("spec.githubAPI.host ({host:?}) is not valid: {reason}");
        assert_condition(&status, "HostValid", ["False", "InvalidHost", &message]);
        assert_condition(
            &status,
            "GitHubConnectionValid",
            ["Unknown", "UnableToValidate", UNABLE],
        );
        assert_eq!(status["phase"], "Error");
        assert!(harness.served("github").is_none(), "{host}");
    }
}

#[tokio::test]
async fn github_unreachable_host_is_retried() {
    let refused = refused();
    let host = refused.address.clone();
    let mut harness = github_harness().await;
    let object = github_object(&host, json!({}));
    let retried = harness
        .reconcile(&object)
        .await
        .expect_err("retried with backoff");
    let status = harness.written(&object).pop().unwrap();
    let [state, reason, message] = condition(&status, "GitHubConnectionValid");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("False", "UnableToMakeRequest")
    );
    let prefix = format!("cannot make connection probe request for spec.githubAPI.host ({host:?}): ");
    assert!(message.starts_with(&prefix), "{message:?}");
    assert!(message.ends_with(&retried), "{message:?} / {retried:?}");
    assert_eq!(status["phase"], "Error");
    assert!(!has_condition(&status, "Ready"));
    assert!(harness.served("github").is_none());
}

#[tokio::test]
async fn github_client_secret_rules_are_pinnipeds() {
    let suffix = r#": secret from spec.client.SecretName ("github-client") must be found in namespace "supervisor" with type "secrets.pinniped.dev/github-client" and keys "clientID" and "clientSecret""#;
    let cases: [(Option<Secret>, &str); 6] = [
        (None, r#"secret "github-client" not found"#),
        (
            Some(secret(
                "github-client",
                "Opaque",
                &[("clientID", "i"), ("clientSecret", "s")],
                "2",
            )),
            r#"wrong secret type "Opaque""#,
        ),
        (
            Some(secret(
                "github-client",
                GITHUB_SECRET_TYPE,
                &[("clientSecret", "s")],
                "2",
            )),
            r#"missing key "clientID""#,
        ),
        (
            Some(secret(
                "github-client",
                GITHUB_SECRET_TYPE,
                &[("clientID", "i")],
                "2",
            )),
            r#"missing key "clientSecret""#,
        ),
        (
            Some(secret(
                "github-client",
                GITHUB_SECRET_TYPE,
                &[("clientID", "i"), ("clientSecret", "")],
                "2",
            )),
            r#"missing key "clientSecret""#,
        ),
        (
            Some(secret(
                "github-client",
                GITHUB_SECRET_TYPE,
                &[("clientID", "i"), ("clientSecret", "s"), ("extra", "x")],
                "2",
            )),
            "extra keys found",
        ),
    ];
    // An invalid host keeps the network out of it; the Secret is checked all the same.
    for (client_secret, prefix) in cases {
        let mut harness =
            Harness::new(GitHubProvider, ApiResource::erase::<GitHubIdentityProvider>(&())).await;
        if let Some(secret) = client_secret {
            harness.watched.apply(secret);
        }
        let object = github_object("", json!({}));
        assert_eq!(harness.reconcile(&object).await, Ok(()), "{prefix}");
        let status = harness.written_once(&object);
        let message = format!("{prefix}{suffix}");
        assert_condition(
            &status,
            "ClientCredentialsSecretValid",
            ["False", "SecretNotFound", &message],
        );
        assert!(harness.served("github").is_none(), "{prefix}");
    }
}

// ---- Upstreams ----------------------------------------------------------------------------------

/// An OIDC upstream (discovered already: no request is made) of the object with `uid`.
fn oidc_upstream(name: &str, uid: &str) -> Arc<Upstream> {
    let discovery = Discovery {
        issuer: "https://dex.example.com".into(),
        authorization_endpoint: "https://dex.example.com/auth".into(),
        token_endpoint: "https://dex.example.com/token".into(),
        jwks_uri: "https://dex.example.com/keys".into(),
        ..Discovery::default()
    };
    Arc::new(Upstream::Oidc(OidcUpstream {
        display_name: name.into(),
        resource_name: name.into(),
        resource_uid: uid.into(),
        provider: Arc::new(Discovered::from_discovery(discovery, &TlsOptions::default()).unwrap()),
        client: ClientConfig::public("c", Vec::new()),
        additional_authorize_parameters: Vec::new(),
        allow_password_grant: false,
        username_claim: None,
        groups_claim: None,
        additional_claim_mappings: Default::default(),
    }))
}

/// The FederationDomain reconciler's queue of source changes, as [`selkie_kube::reconcile::run`]
/// takes it.
struct Wakes {
    pending: Arc<PendingSources>,
    events: Pin<Box<dyn Stream<Item = SourceEvent> + Send>>,
}

impl Wakes {
    const MARKER: &'static str = "controller-tests-marker";

    fn new(pending: &Arc<PendingSources>) -> Self {
        Self {
            pending: pending.clone(),
            events: Box::pin(pending.clone().events()),
        }
    }

    /// Whether every FederationDomain was asked to be reconciled since the last look (and takes
    /// that). It pushes a marker change of its own and takes the next batch: a pending "all"
    /// swallows the marker, otherwise the marker alone comes out — no waiting on a clock.
    async fn woke(&mut self) -> bool {
        self.pending
            .push(SourceEvent::Changed(SourceKind::ConfigMap, Self::MARKER.into()));
        let event = tokio::time::timeout(PROMPTLY, self.events.next())
            .await
            .expect("pending changes are taken at once")
            .expect("the queue never ends");
        match event {
            SourceEvent::All => true,
            SourceEvent::Changed(SourceKind::ConfigMap, name) if name == Self::MARKER => false,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn served(upstreams: &Upstreams) -> Vec<(String, String, String)> {
    let mut served: Vec<_> = upstreams
        .snapshot()
        .into_iter()
        .map(|((kind, name), upstream)| (kind, name, upstream.resource_uid().to_string()))
        .collect();
    served.sort();
    served
}

#[tokio::test]
async fn upstreams_wake_the_federation_domains_only_when_what_is_served_changes() {
    let pending = Arc::new(PendingSources::default());
    let mut wakes = Wakes::new(&pending);
    let upstreams = Upstreams::new(pending.clone());
    assert!(!wakes.woke().await, "nothing yet");

    let dex = oidc_upstream("dex", "uid-1");
    upstreams.serve(OIDC, "dex", dex.clone());
    assert!(wakes.woke().await, "a new upstream");
    upstreams.serve(OIDC, "dex", dex.clone());
    assert!(!wakes.woke().await, "the very same upstream again");

    let rebuilt = oidc_upstream("dex", "uid-1");
    upstreams.serve(OIDC, "dex", rebuilt.clone());
    assert!(wakes.woke().await, "another upstream under the same name");
    assert!(Arc::ptr_eq(
        &upstreams.snapshot()[&(OIDC.to_string(), "dex".to_string())],
        &rebuilt
    ));

    upstreams.appeared();
    assert!(wakes.woke().await, "an identity provider appeared");
}

#[tokio::test]
async fn upstreams_forget_only_the_deleted_object_and_retain_drops_the_others() {
    let pending = Arc::new(PendingSources::default());
    let mut wakes = Wakes::new(&pending);
    let upstreams = Upstreams::new(pending.clone());
    upstreams.serve(OIDC, "dex", oidc_upstream("dex", "uid-2"));
    upstreams.serve(OIDC, "okta", oidc_upstream("okta", "uid-okta"));
    upstreams.serve("LDAPIdentityProvider", "dex", oidc_upstream("dex", "uid-ldap"));
    assert!(wakes.woke().await);

    // The deletion of an older object of the same name (uid-1) leaves the new one serving.
    upstreams.forget(OIDC, "dex", Some("uid-1"));
    assert!(served(&upstreams).contains(&(OIDC.into(), "dex".into(), "uid-2".into())));
    assert!(
        wakes.woke().await,
        "its FederationDomains' conditions may change all the same"
    );

    upstreams.forget(OIDC, "dex", Some("uid-2"));
    assert!(!served(&upstreams)
        .iter()
        .any(|(kind, name, _)| kind == OIDC && name == "dex"));
    assert!(wakes.woke().await);

    // After a re-list where only "okta" of this kind exists: nothing to drop, nobody woken.
    upstreams.retain(OIDC, &HashSet::from(["okta".to_string()]));
    assert!(!wakes.woke().await);
    upstreams.retain(OIDC, &HashSet::new());
    assert_eq!(
        served(&upstreams),
        [(
            "LDAPIdentityProvider".to_string(),
            "dex".to_string(),
            "uid-ldap".to_string()
        )],
        "other kinds are kept"
    );
    assert!(wakes.woke().await);

    upstreams.forget("LDAPIdentityProvider", "dex", None);
    assert!(served(&upstreams).is_empty(), "without a UID: whatever is served");
}

// ---- sources ------------------------------------------------------------------------------------

#[tokio::test]
async fn sources_are_ready_once_both_caches_were_listed() {
    let (secrets, mut secrets_writer) = reflector::store::<Secret>();
    let (config_maps, mut config_maps_writer) = reflector::store::<ConfigMap>();
    let sources = Sources {
        namespace: NS.into(),
        secrets,
        config_maps,
    };
    assert!(sources.ready().now_or_never().is_none(), "nothing listed");
    secrets_writer.apply_watcher_event(&Event::Init);
    secrets_writer.apply_watcher_event(&Event::InitApply(bind_secret("p", "1")));
    secrets_writer.apply_watcher_event(&Event::InitDone);
    assert!(
        sources.ready().now_or_never().is_none(),
        "the ConfigMaps are not listed yet"
    );
    config_maps_writer.apply_watcher_event(&Event::Init);
    config_maps_writer.apply_watcher_event(&Event::InitDone);
    tokio::time::timeout(PROMPTLY, sources.ready())
        .await
        .expect("ready once both are listed");
    assert!(secret_pair(
        &sources,
        "BindSecretValid",
        "bind",
        BASIC_AUTH,
        ["username", "password"]
    )
    .is_ok());
}

#[tokio::test]
async fn secret_pair_reads_the_namespace_s_secret_and_its_version() {
    let mut other_namespace = bind_secret("p", "5");
    other_namespace.metadata.name = Some("elsewhere".into());
    other_namespace.metadata.namespace = Some("kube-system".into());
    let mut watched = Watched::new().with([bind_secret("the-password", "42"), other_namespace]);
    let pair = |name: &str| {
        secret_pair(
            &watched.sources,
            "BindSecretValid",
            name,
            BASIC_AUTH,
            ["username", "password"],
        )
    };
    assert_eq!(
        pair("bind").unwrap(),
        (BIND_DN.to_string(), "the-password".to_string(), "42".to_string())
    );
    let not_found = pair("elsewhere").unwrap_err();
    assert_eq!(
        (
            not_found.type_,
            not_found.reason.as_str(),
            not_found.message.as_str()
        ),
        (
            "BindSecretValid",
            "SecretNotFound",
            r#"secret "elsewhere" not found"#
        ),
        "only the Supervisor's namespace"
    );

    // A value that is not text is as good as missing.
    let mut binary = secret("binary", BASIC_AUTH, &[("username", "u")], "2");
    binary
        .data
        .as_mut()
        .unwrap()
        .insert("password".into(), ByteString(vec![0xff, 0xfe]));
    watched.apply(binary);
    let missing = secret_pair(
        &watched.sources,
        "BindSecretValid",
        "binary",
        BASIC_AUTH,
        ["username", "password"],
    )
    .unwrap_err();
    assert_eq!(
        (missing.status, missing.reason.as_str()),
        (Status::False, "SecretMissingKeys")
    );
}

/// Whether `object` reads the source of `event`, as the reconciler of kind `P` decides.
fn related<P: Provider>(object: &DynamicObject, event: &SourceEvent) -> bool {
    names_source(object, event, P::SECRET_NAMES, P::TLS_SPECS)
}

#[test]
fn each_kind_is_related_to_the_secrets_and_ca_sources_it_names() {
    let secret = |name: &str| SourceEvent::Changed(SourceKind::Secret, name.into());
    let config_map = |name: &str| SourceEvent::Changed(SourceKind::ConfigMap, name.into());

    // GitHub's CA source is under spec.githubAPI.tls, not spec.tls.
    let github = idp_object(
        GITHUB,
        "github",
        1,
        json!({
            "client": {"secretName": "gh-client"},
            "githubAPI": {"tls": {"certificateAuthorityDataSource": {"kind": "Secret", "name": "gh-ca", "key": "ca.crt"}}},
        }),
    );
    assert!(related::<GitHubProvider>(&github, &secret("gh-client")));
    assert!(related::<GitHubProvider>(&github, &secret("gh-ca")));
    assert!(!related::<GitHubProvider>(&github, &config_map("gh-ca")));
    assert!(!related::<GitHubProvider>(&github, &secret("other")));

    // Directories: the bind Secret under spec.bind, the CA source under spec.tls.
    let directory = |kind: &str| {
        idp_object(
            kind,
            "directory",
            1,
            json!({
                "bind": {"secretName": "bind"},
                "tls": {"certificateAuthorityDataSource": {"kind": "ConfigMap", "name": "ldap-ca", "key": "ca.crt"}},
            }),
        )
    };
    type Ldap = DirectoryProvider<LDAPIdentityProvider>;
    type ActiveDirectory = DirectoryProvider<ActiveDirectoryIdentityProvider>;
    let (ldap, ad) = (directory(LDAP), directory(AD));
    for (kind, event, expected) in [
        ("bind Secret", secret("bind"), true),
        ("CA ConfigMap", config_map("ldap-ca"), true),
        ("a Secret named as the CA ConfigMap", secret("ldap-ca"), false),
        ("a re-list", SourceEvent::All, true),
    ] {
        assert_eq!(related::<Ldap>(&ldap, &event), expected, "LDAP: {kind}");
        assert_eq!(related::<ActiveDirectory>(&ad, &event), expected, "AD: {kind}");
    }

    // OIDC: the client Secret under spec.client, the CA source under spec.tls.
    let oidc = idp_object(
        OIDC,
        "dex",
        1,
        json!({
            "client": {"secretName": "dex-client"},
            "tls": {"certificateAuthorityDataSource": {"kind": "Secret", "name": "dex-ca", "key": "ca.crt"}},
        }),
    );
    assert!(related::<OidcProvider>(&oidc, &secret("dex-client")));
    assert!(related::<OidcProvider>(&oidc, &secret("dex-ca")));
    assert!(!related::<OidcProvider>(&oidc, &config_map("dex-client")));
    let nothing = idp_object(OIDC, "empty", 1, json!({}));
    assert!(
        !related::<OidcProvider>(&nothing, &SourceEvent::All),
        "an object naming nothing is not woken by a re-list"
    );
}

// ---- FederationDomains (a follower: no kube-apiserver is asked anything) ------------------------

/// A FederationDomain reconciler that does not lead, with the OIDCIdentityProvider `dex` in its
/// identity-provider cache. Its kube client points at a port nobody answers: a follower must
/// never use it (any request would fail the reconcile).
struct Follower {
    reconciler: Arc<FederationDomainReconciler>,
    writer: Writer<DynamicObject>,
    watched: Watched,
    upstreams: Arc<Upstreams>,
    pending: Arc<PendingSources>,
    outputs: Outputs,
    _leader: watch::Sender<bool>,
    _idps: Writer<DynamicObject>,
    _api: Refused,
}

impl Follower {
    fn new() -> Self {
        let api = refused();
        let client = kube::Client::try_from(kube::Config::new(
            format!("http://{}", api.address).parse().unwrap(),
        ))
        .unwrap();
        let (leader, leading) = watch::channel(false);
        let (kind, writer) = Kind::new(ApiResource::erase::<FederationDomain>(&()), &client, NS, leading);
        let mut idps = Writer::new(ApiResource::erase::<OIDCIdentityProvider>(&()));
        idps.apply_watcher_event(&Event::Apply(idp_object(OIDC, "dex", 1, json!({}))));
        let watched = Watched::new();
        let pending = Arc::new(PendingSources::default());
        let upstreams = Arc::new(Upstreams::new(pending.clone()));
        let outputs = Outputs {
            issuers: Arc::new(ArcSwap::from_pointee(Issuers::new(Vec::new()))),
            serving: Arc::new(ServingCert::disabled()),
        };
        let reconciler = Arc::new(FederationDomainReconciler::new(
            kind,
            client,
            watched.sources.clone(),
            upstreams.clone(),
            vec![(OIDC, idps.as_reader())],
            pending.clone(),
            outputs.clone(),
            None,
            IDP_GROUP.into(),
        ));
        Self {
            reconciler,
            writer,
            watched,
            upstreams,
            pending,
            outputs,
            _leader: leader,
            _idps: idps,
            _api: api,
        }
    }

    /// Puts `fd` in the watched FederationDomains and reconciles it.
    async fn reconcile(&mut self, fd: &DynamicObject) {
        self.writer.apply_watcher_event(&Event::Apply(fd.clone()));
        tokio::time::timeout(PROMPTLY, self.reconciler.clone().reconcile(Arc::new(fd.clone())))
            .await
            .expect("a follower's reconcile asks no server")
            .expect("a follower's reconcile succeeds");
    }

    /// Adds the four key Secrets the leader generates for the FederationDomain `name`.
    fn add_keys(&mut self, name: &str, uid: &str) {
        let owner = OwnerReference {
            api_version: "config.supervisor.pinniped.dev/v1alpha1".into(),
            kind: "FederationDomain".into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        for kind in KeySecret::ALL {
            let mut secret = kind.generate(name, NS, owner.clone()).unwrap();
            secret.metadata.resource_version = Some("1".into());
            self.watched.apply(secret);
        }
    }

    fn issuers(&self) -> Arc<Issuers> {
        self.outputs.issuers.load_full()
    }
}

/// The FederationDomain `fd` (UID `uid`) at `issuer`, naming `dex` as "Corp", with `tls`.
fn federation_domain(uid: &str, issuer: &str, tls: Option<&str>) -> DynamicObject {
    let mut spec = json!({
        "issuer": issuer,
        "identityProviders": [
            {"displayName": "Corp", "objectRef": {"apiGroup": IDP_GROUP, "kind": OIDC, "name": "dex"}},
        ],
    });
    if let Some(secret_name) = tls {
        merge(&mut spec, json!({"tls": {"secretName": secret_name}}));
    }
    serde_json::from_value(json!({
        "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
        "kind": "FederationDomain",
        "metadata": {"name": "fd", "namespace": NS, "uid": uid, "generation": 1},
        "spec": spec,
    }))
    .unwrap()
}

/// The one issuer `follower` serves.
fn only_issuer(follower: &Follower) -> Arc<crate::issuer::Issuer> {
    let issuers = follower.issuers();
    let all: Vec<_> = issuers.all().cloned().collect();
    assert_eq!(all.len(), 1, "one issuer served");
    all[0].clone()
}

#[tokio::test]
async fn a_follower_serves_a_federation_domain_once_its_keys_exist_and_follows_its_upstreams() {
    let mut follower = Follower::new();
    follower
        .upstreams
        .serve(OIDC, "dex", oidc_upstream("dex", "dex-uid"));
    let fd = federation_domain("fd-uid", "https://sso.example.com/fd", None);

    // The leader has not created the keys yet: nothing is served (and nothing fails).
    follower.reconcile(&fd).await;
    assert_eq!(follower.issuers().all().count(), 0);

    follower.add_keys("fd", "fd-uid");
    follower.reconcile(&fd).await;
    let issuers = follower.issuers();
    let (issuer, _) = issuers
        .route("sso.example.com", "/fd/.well-known/openid-configuration")
        .expect("served");
    assert_eq!(issuer.issuer, "https://sso.example.com/fd");
    assert_eq!(issuer.name, "supervisor/fd");
    assert_eq!(
        issuer
            .idps
            .iter()
            .map(|idp| (idp.display_name().to_string(), idp.resource_uid().to_string()))
            .collect::<Vec<_>>(),
        [("Corp".to_string(), "dex-uid".to_string())],
        "under its display name"
    );

    // The identity provider rebuilt: the issuer serves the new one.
    follower
        .upstreams
        .serve(OIDC, "dex", oidc_upstream("dex", "dex-uid-2"));
    follower.reconcile(&fd).await;
    assert_eq!(only_issuer(&follower).idps[0].resource_uid(), "dex-uid-2");

    // The identity provider gone: still served (its condition says so), without it.
    follower.upstreams.forget(OIDC, "dex", None);
    follower.reconcile(&fd).await;
    assert!(only_issuer(&follower).idps.is_empty());

    // An invalid issuer: no longer served.
    let invalid = federation_domain("fd-uid", "http://sso.example.com/fd", None);
    follower.reconcile(&invalid).await;
    assert_eq!(follower.issuers().all().count(), 0);
}

/// An issuer is rebuilt (and a new snapshot published) only when something it is made from
/// changed. `federation_domain::check` hands out a new `Arc` for every upstream on every call
/// (`with_display_name`), so a fingerprint over those would never match and every reconcile
/// (every time its keys are due, every `RESYNC`, and every wake) would rebuild the issuer.
#[tokio::test]
async fn a_federation_domain_is_not_rebuilt_when_nothing_changed() {
    let mut follower = Follower::new();
    let dex = oidc_upstream("dex", "dex-uid");
    follower.upstreams.serve(OIDC, "dex", dex.clone());
    follower.add_keys("fd", "fd-uid");
    let fd = federation_domain("fd-uid", "https://sso.example.com/fd", None);
    follower.reconcile(&fd).await;
    let (issuers, issuer) = (follower.issuers(), only_issuer(&follower));

    follower.reconcile(&fd).await;
    follower.upstreams.serve(OIDC, "dex", dex);
    follower.reconcile(&fd).await;
    assert!(
        Arc::ptr_eq(&only_issuer(&follower), &issuer),
        "the issuer was rebuilt although nothing it is made from changed"
    );
    assert!(
        Arc::ptr_eq(&follower.issuers(), &issuers),
        "a new snapshot was published"
    );
}

#[tokio::test]
async fn a_federation_domain_s_tls_secret_is_served_by_its_host_until_it_is_forgotten() {
    let mut follower = Follower::new();
    follower
        .upstreams
        .serve(OIDC, "dex", oidc_upstream("dex", "dex-uid"));
    follower.add_keys("fd", "fd-uid");
    let hour = Duration::from_secs(3600);
    let certificate = selkie_kube::certs::issue_serving(&pki().0, &["sso.example.com".into()], hour).unwrap();
    follower.watched.apply(secret(
        "sso-tls",
        "kubernetes.io/tls",
        &[
            ("tls.crt", certificate.cert_pem.as_str()),
            ("tls.key", certificate.key_pem.as_str()),
        ],
        "1",
    ));
    let fd = federation_domain("fd-uid", "https://SSO.example.com/fd", Some("sso-tls"));
    follower.reconcile(&fd).await;
    let served = follower
        .outputs
        .serving
        .resolve_name(Some("sso.example.com"))
        .expect("its certificate, by its host");
    let expected =
        ServingCert::load(certificate.cert_pem.as_bytes(), certificate.key_pem.as_bytes()).unwrap();
    assert_eq!(served.cert, expected.cert);
    assert_eq!(follower.issuers().all().count(), 1);

    // The deletion of an older FederationDomain of the same name changes nothing.
    follower.reconciler.forget("fd", Some("older-uid"));
    assert_eq!(follower.issuers().all().count(), 1);
    assert!(follower
        .outputs
        .serving
        .resolve_name(Some("sso.example.com"))
        .is_some());

    follower.reconciler.forget("fd", Some("fd-uid"));
    assert_eq!(follower.issuers().all().count(), 0);
    assert!(follower
        .outputs
        .serving
        .resolve_name(Some("sso.example.com"))
        .is_none());

    // Served again, then gone from a re-list.
    follower.reconcile(&fd).await;
    assert_eq!(follower.issuers().all().count(), 1);
    follower.reconciler.retain(&HashSet::from(["other".to_string()]));
    assert_eq!(follower.issuers().all().count(), 0);
}

#[tokio::test]
async fn a_federation_domain_wakes_the_others_only_when_it_is_new_or_changed() {
    let mut follower = Follower::new();
    let mut wakes = Wakes::new(&follower.pending);
    let fd = federation_domain("fd-uid", "https://sso.example.com/fd", None);
    follower.reconcile(&fd).await;
    assert!(
        wakes.woke().await,
        "a new FederationDomain: the others' uniqueness may change"
    );
    follower.reconcile(&fd).await;
    assert!(!wakes.woke().await, "the same one again");
    let recreated = federation_domain("fd-uid-2", "https://sso.example.com/fd", None);
    follower.reconcile(&recreated).await;
    assert!(wakes.woke().await, "recreated under the same name");
    follower.reconciler.forget("fd", Some("fd-uid-2"));
    assert!(wakes.woke().await, "deleted");
}

#[tokio::test]
async fn a_federation_domain_reads_its_key_secrets_and_its_tls_secret_only() {
    let follower = Follower::new();
    let fd = federation_domain("fd-uid", "https://sso.example.com/fd", Some("sso-tls"));
    let uses = |event: SourceEvent| follower.reconciler.uses_source(&fd, &event);
    for name in [
        "fd-jwks",
        "fd-token-signing-key",
        "fd-state-signing-key",
        "fd-state-encryption-key",
        "sso-tls",
    ] {
        assert!(
            uses(SourceEvent::Changed(SourceKind::Secret, name.into())),
            "{name}"
        );
    }
    assert!(!uses(SourceEvent::Changed(
        SourceKind::Secret,
        "other-jwks".into()
    )));
    assert!(!uses(SourceEvent::Changed(
        SourceKind::ConfigMap,
        "fd-jwks".into()
    )));
    assert!(!uses(SourceEvent::Changed(
        SourceKind::Secret,
        "dex-client".into()
    )));
    assert!(uses(SourceEvent::All));
}

// ---- SAMLIdentityProvider -------------------------------------------------------------------------

const SAML: &str = "SAMLIdentityProvider";

async fn saml_harness() -> Harness<SamlProvider> {
    Harness::new(
        SamlProvider,
        ApiResource::erase::<selkie_api::supervisor_saml::SAMLIdentityProvider>(&()),
    )
    .await
}

/// The SAMLIdentityProvider `keycloak` at `generation` with `spec`.
fn saml_object(generation: i64, spec: Value) -> DynamicObject {
    let mut object = idp_object(SAML, "keycloak", generation, spec);
    object.types = Some(kube::api::TypeMeta {
        api_version: "idp.supervisor.selkie.dev/v1alpha1".into(),
        kind: SAML.into(),
    });
    object
}

fn saml_types() -> Vec<String> {
    sorted(&[
        "TLSConfigurationValid",
        "MetadataValid",
        "AllowedClockSkewValid",
        "Ready",
    ])
}

/// Metadata given inline is read, the upstream served with the mapping and skew of the spec;
/// unchanged, the same upstream keeps serving; an invalid change never replaces it.
#[tokio::test]
async fn saml_inline_metadata_is_served_and_an_invalid_change_keeps_it_serving() {
    let mut harness = saml_harness().await;
    let object = saml_object(
        1,
        json!({
            "idp": {"metadata": crate::idp::saml::tests::test_idp_metadata_xml()},
            "claims": {"groups": "groups"},
            "allowedClockSkew": "30s",
        }),
    );
    assert_eq!(harness.reconcile(&object).await, Ok(()));
    let status = harness.written(&object).pop().unwrap();
    let mut types = condition_types(&status);
    types.sort();
    assert_eq!(types, saml_types());
    assert_condition(
        &status,
        "MetadataValid",
        [
            "True",
            "Success",
            r#"the metadata of identity provider "http://keycloak.test/realms/selkie" has a single sign-on service (HTTP-Redirect) and signing certificates"#,
        ],
    );
    assert_condition(
        &status,
        "AllowedClockSkewValid",
        ["True", "Success", "spec.allowedClockSkew allows 30s"],
    );
    assert_eq!(condition(&status, "Ready")[0], "True");
    assert_eq!(status["phase"], "Ready");
    let upstream = harness.served("keycloak").expect("served");
    let Upstream::Saml(saml) = &*upstream else {
        panic!("not SAML");
    };
    assert_eq!(saml.metadata.entity_id, "http://keycloak.test/realms/selkie");
    assert_eq!(saml.username_attribute, None, "the NameID");
    assert_eq!(saml.groups_attribute.as_deref(), Some("groups"));
    assert_eq!(saml.clock_skew, Duration::from_secs(30));
    assert!(harness.wakes.woke().await);

    let now = with_status(&object, &status);
    assert_eq!(harness.reconcile(&now).await, Ok(()));
    assert!(Arc::ptr_eq(&harness.served("keycloak").unwrap(), &upstream));
    assert!(!harness.wakes.woke().await);

    // Broken metadata: the condition says why, and the working form keeps serving.
    let broken = saml_object(2, json!({"idp": {"metadata": "<md:EntityDescriptor"}}));
    assert_eq!(harness.reconcile(&with_status(&broken, &status)).await, Ok(()));
    let status = harness.written(&broken).pop().unwrap();
    let [state, reason, message] = condition(&status, "MetadataValid");
    assert_eq!((state.as_str(), reason.as_str()), ("False", "Invalid"));
    assert!(
        message.starts_with("spec.idp.metadata is not usable: "),
        "{message}"
    );
    assert_eq!(status["phase"], "Error");
    assert!(Arc::ptr_eq(&harness.served("keycloak").unwrap(), &upstream));
}

/// Metadata fetched from `metadataURL` with the CA of `tls`; a clock skew out of bounds is
/// named and nothing is served.
#[tokio::test]
async fn saml_metadata_is_fetched_and_a_clock_skew_out_of_bounds_is_refused() {
    let server = FakeHttps::start().await;
    let mut harness = saml_harness().await;
    let url = format!("https://{}/saml/descriptor", server.address);
    let spec = |skew: &str| {
        json!({
            "idp": {"metadataURL": url, "tls": {"certificateAuthorityData": ca_data()}},
            "allowedClockSkew": skew,
        })
    };
    let too_far = saml_object(1, spec("6m"));
    assert_eq!(harness.reconcile(&too_far).await, Ok(()));
    let status = harness.written(&too_far).pop().unwrap();
    assert_condition(
        &status,
        "AllowedClockSkewValid",
        [
            "False",
            "Invalid",
            r#"spec.allowedClockSkew: "6m" is out of range: it must be from 0s to 5m"#,
        ],
    );
    assert_eq!(condition(&status, "MetadataValid")[0], "True");
    assert_eq!(status["phase"], "Error");
    assert!(harness.served("keycloak").is_none());

    let fine = saml_object(2, spec("2m"));
    assert_eq!(harness.reconcile(&fine).await, Ok(()));
    assert_eq!(harness.written(&fine).pop().unwrap()["phase"], "Ready");
    let Some(upstream) = harness.served("keycloak") else {
        panic!("not served");
    };
    let Upstream::Saml(saml) = &*upstream else {
        panic!("not SAML");
    };
    assert_eq!(
        saml.metadata.sso_redirect_url,
        "http://keycloak.test/realms/selkie/protocol/saml"
    );
    assert_eq!(server.requests(), 2, "fetched at each check");
}

/// A metadata URL nobody answers at is retried with backoff, its condition saying why.
#[tokio::test]
async fn saml_unreachable_metadata_url_is_retried() {
    let refused = refused();
    let mut harness = saml_harness().await;
    let url = format!("https://{}/saml/descriptor", refused.address);
    let object = saml_object(1, json!({"idp": {"metadataURL": url}}));
    let retried = harness
        .reconcile(&object)
        .await
        .expect_err("retried with backoff");
    let status = harness.written(&object).pop().unwrap();
    let [state, reason, message] = condition(&status, "MetadataValid");
    assert_eq!((state.as_str(), reason.as_str()), ("False", "UnableToFetch"));
    assert!(
        message.starts_with(&format!(
            "cannot fetch the metadata from spec.idp.metadataURL ({url:?}): "
        )),
        "{message}"
    );
    assert!(message.ends_with(&retried), "{message:?} / {retried:?}");
    assert!(harness.served("keycloak").is_none());
}
