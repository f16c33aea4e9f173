//! A small aggregated API for tests, served from loopback and reached through kube-apiserver.
//!
//! [`EchoApi::start`] serves HTTPS on `127.0.0.1`, trusting client certificates of the cluster's
//! front-proxy CA, and registers it the way an extension API server is registered: a Service of
//! `type: ExternalName, externalName: localhost` and an `APIService` whose `caBundle` is the
//! server's own CA. It returns once the APIService is `Available`.
//!
//! It serves the discovery documents of its group (`<namespace>.echo.e2e.selkie.dev/v1alpha1`,
//! resource `echoes` with subresource `echoes/exec`), `GET .../echoes/{name}` (an `Echo` object
//! naming the user it was asked for), and upgrades on `.../echoes/{name}/exec`, the way a kubelet
//! serves exec:
//!
//! * **WebSocket**: the subprotocol is chosen from the client's `Sec-WebSocket-Protocol` list in
//!   the client's order, among [`WEBSOCKET_PROTOCOLS`] (client-go's `wsstream` handshake); no list
//!   means no subprotocol; a list with none of them gets 403. Every text and binary message is
//!   echoed back unchanged.
//! * **SPDY/3.1**: `X-Stream-Protocol-Version` is negotiated the same way among
//!   [`SPDY_PROTOCOLS`] (client-go's `httpstream.Handshake`: 400 when absent, 403 with
//!   `X-Accepted-Stream-Protocol-Versions` when nothing matches); the 101 names the chosen
//!   version. Raw bytes are echoed until the client's end of stream.
//!
//! The query parameter `closeAfter=N` makes the server close first: after N echoed messages
//! (WebSocket, with a Close frame) or N echoed bytes (SPDY, by ending its side of the stream).
//!
//! Every request is recorded ([`EchoApi::requests`]) with the identity headers the aggregator sent,
//! and every upgraded connection is recorded when it ends ([`EchoApi::tunnels`]), with how it
//! ended. Dropping the [`EchoApi`] deletes its APIService and Service and stops the server.
//!
//! It stands in for a kubelet only where a kubelet cannot show the thing tested (byte-exact
//! echoes, server-first close, protocol negotiation failures, the identity kube-apiserver
//! forwarded): exec, attach, port-forward and logs against a real kubelet run on the node
//! (`e2e/tests/e2e/node_concierge.rs`).

use std::{
    convert::Infallible,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, upgrade::Upgraded};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{server::WebPkiClientVerifier, RootCertStore, ServerConfig};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    task::JoinHandle,
};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::{
    tungstenite::{handshake::derive_accept_key, protocol::Role, Message},
    WebSocketStream,
};
use x509_cert::der::Decode;

use crate::{pki::CertificateAuthority, Cluster, HarnessError};

/// A client's WebSocket through the impersonation proxy ([`websocket_exec`]).
pub type ExecSocket = WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// A WebSocket `exec` through the impersonation proxy at `proxy_url` (`https://127.0.0.1:<port>`,
/// its serving CA bundle `ca_pem`) to `path`, as `kubectl exec` (1.30+) opens one: HTTP/1.1 over
/// TLS with `credential` as the client certificate, offering `v5.channel.k8s.io`. Fails when the
/// upgrade is refused or not done within 15 s.
pub async fn websocket_exec(
    proxy_url: &str,
    ca_pem: &str,
    credential: &crate::pki::CertAndKey,
    path: &str,
) -> anyhow::Result<ExecSocket> {
    use anyhow::Context as _;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(credential.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(credential.key_pem.as_bytes())?,
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let address = proxy_url
        .strip_prefix("https://")
        .context("the proxy URL is not https")?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(address).await?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(rustls_pki_types::ServerName::try_from("127.0.0.1")?, tcp)
            .await?;
        let mut request = format!("wss://{address}{path}").into_client_request()?;
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("v5.channel.k8s.io"),
        );
        let (socket, _) = tokio_tungstenite::client_async(request, tls).await?;
        anyhow::Ok(socket)
    };
    tokio::time::timeout(Duration::from_secs(15), handshake)
        .await
        .context("no WebSocket handshake within 15s")?
}

/// A response of the echo API.
type Reply = Response<Full<Bytes>>;

/// The version of the echo API's group.
pub const VERSION: &str = "v1alpha1";

/// WebSocket subprotocols the echo API accepts (the kubelet's, newest first).
pub const WEBSOCKET_PROTOCOLS: [&str; 4] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// SPDY stream protocol versions the echo API accepts (the kubelet's, newest first).
pub const SPDY_PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// How long the APIService may take to become Available.
const AVAILABLE_TIMEOUT: &str = "60s";
/// How long a closing SPDY tunnel waits for the other side's end of stream.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The Service in front of the server.
const SERVICE: &str = "echo-api";

/// One request the echo API received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Subject of the verified client certificate (`CN=front-proxy-client` for the aggregator),
    /// if one was presented.
    pub peer_subject: Option<String>,
    /// `X-Remote-User`.
    pub remote_user: Option<String>,
    /// Every `X-Remote-Group`, in order.
    pub remote_groups: Vec<String>,
    /// The `Upgrade` header, if any.
    pub upgrade: Option<String>,
}

/// The protocol an upgraded connection switched to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// WebSocket (RFC 6455).
    WebSocket,
    /// `SPDY/3.1`, echoed as raw bytes.
    Spdy,
}

/// How an upgraded connection ended, as the echo server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelEnd {
    /// The client ended it: a WebSocket Close frame, or the end of the SPDY byte stream.
    ClientClosed,
    /// The server ended it because of `closeAfter`.
    ServerClosed,
    /// It broke: what went wrong.
    Failed(String),
}

/// One upgraded connection, recorded when it ended.
#[derive(Debug, Clone)]
pub struct Tunnel {
    /// The `echoes` object named in the path.
    pub name: String,
    /// What it switched to.
    pub upgrade: Upgrade,
    /// The negotiated subprotocol (WebSocket) or stream protocol version (SPDY).
    pub protocol: Option<String>,
    /// Messages (WebSocket) or bytes (SPDY) echoed.
    pub echoed: usize,
    /// How it ended.
    pub end: TunnelEnd,
}

/// What the server shares with the test.
#[derive(Default)]
struct Records {
    requests: Mutex<Vec<Seen>>,
    tunnels: Mutex<Vec<Tunnel>>,
}

struct Server {
    group: String,
    records: Records,
}

/// A running echo API, registered with a cluster. See the module documentation.
pub struct EchoApi {
    server: Arc<Server>,
    task: JoinHandle<()>,
    namespace: String,
    kubectl_binary: PathBuf,
    kubeconfig: PathBuf,
}

impl std::fmt::Debug for EchoApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoApi")
            .field("group", &self.server.group)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl EchoApi {
    /// Starts the server and registers the group `<namespace>.echo.e2e.selkie.dev` with
    /// `cluster`, its Service in `namespace` (so concurrent tests each have their own). Returns
    /// once the APIService is Available; fails if it is not within 60 s (with its status), or if
    /// the server cannot be set up.
    pub async fn start(cluster: &Cluster, namespace: &str) -> Result<EchoApi, HarnessError> {
        crate::install_crypto_provider();
        let group = format!("{namespace}.echo.e2e.selkie.dev");
        let ca = CertificateAuthority::new("echo-api-ca")?;
        let acceptor = tls_acceptor(cluster, &ca, namespace)?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| HarnessError::io("binding the echo API's listener", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io("reading the echo API's port", e))?
            .port();
        let server = Arc::new(Server {
            group: group.clone(),
            records: Records::default(),
        });
        let task = tokio::spawn(serve(listener, acceptor, server.clone()));
        let kubectl = cluster.kubectl();
        let echo = EchoApi {
            server,
            task,
            namespace: namespace.to_string(),
            kubectl_binary: kubectl.binary().to_path_buf(),
            kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
        };

        let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": SERVICE, "namespace": namespace},
             "spec": {"type": "ExternalName", "externalName": "localhost"}},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": echo.api_service()},
             "spec": {"group": group, "version": VERSION, "groupPriorityMinimum": 1000,
                      "versionPriority": 15, "caBundle": B64.encode(ca.cert_pem()),
                      "service": {"name": SERVICE, "namespace": namespace, "port": port}}},
        ]});
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&manifests.to_string()))
            .await?;
        let wait = [
            "wait",
            "--for=condition=Available",
            &format!("apiservice/{}", echo.api_service()),
            &format!("--timeout={AVAILABLE_TIMEOUT}"),
        ];
        let available = kubectl.output(&wait, None).await?;
        if !available.success {
            let status = kubectl
                .output(&["get", "apiservice", &echo.api_service(), "-o", "yaml"], None)
                .await?;
            return Err(HarnessError::Kubectl {
                args: wait.join(" "),
                status: format!("the APIService never became Available ({})", available.status),
                stderr: format!("{}\n{}", available.stderr, status.stdout),
            });
        }
        Ok(echo)
    }

    /// Lets `user` use `verbs` (`get` for WebSocket upgrades, `create` for SPDY's POST) on
    /// `echoes/exec` in `namespace`, with a Role and RoleBinding named `echo-exec`.
    pub async fn grant_exec(
        &self,
        cluster: &Cluster,
        namespace: &str,
        user: &str,
        verbs: &[&str],
    ) -> Result<(), HarnessError> {
        let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "echo-exec", "namespace": namespace},
             "rules": [{"apiGroups": [self.group()], "resources": ["echoes/exec"], "verbs": verbs}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "echo-exec", "namespace": namespace},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "echo-exec"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
        ]});
        cluster
            .kubectl()
            .run_with_stdin(&["apply", "-f", "-"], Some(&rbac.to_string()))
            .await?;
        Ok(())
    }

    /// The API group, `<namespace>.echo.e2e.selkie.dev`.
    pub fn group(&self) -> &str {
        &self.server.group
    }

    /// The APIService's name, `v1alpha1.<group>`.
    pub fn api_service(&self) -> String {
        format!("{VERSION}.{}", self.server.group)
    }

    /// The path of the `echoes` object `name` in `namespace`.
    pub fn object_path(&self, namespace: &str, name: &str) -> String {
        format!(
            "/apis/{}/{VERSION}/namespaces/{namespace}/echoes/{name}",
            self.server.group
        )
    }

    /// The path of the `exec` subresource of the `echoes` object `name` in `namespace`.
    pub fn exec_path(&self, namespace: &str, name: &str) -> String {
        format!("{}/exec", self.object_path(namespace, name))
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<Seen> {
        lock(&self.server.records.requests).clone()
    }

    /// Every upgraded connection that has ended so far, in the order they ended.
    pub fn tunnels(&self) -> Vec<Tunnel> {
        lock(&self.server.records.tunnels).clone()
    }
}

impl Drop for EchoApi {
    /// Stops accepting connections and deletes the APIService and Service, waiting for kubectl,
    /// so an unreachable APIService does not linger in every later discovery. Failures are
    /// ignored: the cluster dies with the test process anyway.
    fn drop(&mut self) {
        self.task.abort();
        let _ignored = std::process::Command::new(&self.kubectl_binary)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.kubeconfig.with_extension("kubectl-cache"))
            .args([
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "-n",
                &self.namespace,
            ])
            .arg(format!("apiservice/{}", self.api_service()))
            .arg(format!("service/{SERVICE}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking test thread cannot leave a Vec half-pushed; the records stay readable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// TLS with a certificate for the name the aggregator verifies (`<service>.<namespace>.svc`);
/// client certificates are optional and, when presented, verified against the front-proxy CA.
fn tls_acceptor(
    cluster: &Cluster,
    ca: &CertificateAuthority,
    namespace: &str,
) -> Result<TlsAcceptor, HarnessError> {
    let tls_error =
        |e: &dyn std::fmt::Display| HarnessError::Pki(format!("the echo API's TLS configuration: {e}"));
    let serving = ca.issue_serving(
        SERVICE,
        &[&format!("{SERVICE}.{namespace}.svc"), "localhost", "127.0.0.1"],
    )?;
    let mut front_proxy_roots = RootCertStore::empty();
    let front_proxy_ca = CertificateDer::from_pem_slice(cluster.pki().front_proxy_ca.cert_pem().as_bytes())
        .map_err(|e| tls_error(&e))?;
    front_proxy_roots.add(front_proxy_ca).map_err(|e| tls_error(&e))?;
    let verifier = WebPkiClientVerifier::builder(Arc::new(front_proxy_roots))
        .allow_unauthenticated()
        .build()
        .map_err(|e| tls_error(&e))?;
    let certificate =
        CertificateDer::from_pem_slice(serving.cert_pem.as_bytes()).map_err(|e| tls_error(&e))?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).map_err(|e| tls_error(&e))?;
    let mut tls = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![certificate], key)
        .map_err(|e| tls_error(&e))?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

/// Accepts connections until the task is aborted; each is served on its own task.
async fn serve(listener: TcpListener, acceptor: TlsAcceptor, server: Arc<Server>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of descriptors or similar: let other tasks finish before trying again.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let peer_subject = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| x509_cert::Certificate::from_der(leaf).ok())
                .map(|cert| cert.tbs_certificate.subject.to_string());
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = handle(request, peer_subject.clone(), &server);
                async move { Ok::<_, Infallible>(response) }
            });
            // HTTP/1.1 or h2 by the connection preface; upgrades need HTTP/1.1.
            let _ended = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// Every value of the header `name`, split at commas, trimmed, empty ones dropped.
fn header_list(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(str::to_string)
        .collect()
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

fn handle(mut request: Request<Incoming>, peer_subject: Option<String>, server: &Arc<Server>) -> Reply {
    let headers = request.headers();
    let seen = Seen {
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        peer_subject,
        remote_user: header_text(headers, "x-remote-user"),
        remote_groups: header_list(headers, "x-remote-group"),
        upgrade: header_text(headers, "upgrade"),
    };
    lock(&server.records.requests).push(seen.clone());

    let group = server.group.as_str();
    let group_version = format!("{group}/{VERSION}");
    let path: Vec<&str> = seen.path.trim_matches('/').split('/').collect();
    let body = match path.as_slice() {
        ["apis"] => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(group)]}),
        ["apis", g] if *g == group => api_group(group),
        ["apis", g, VERSION] if *g == group => json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [
                {"name": "echoes", "singularName": "echo", "namespaced": true, "kind": "Echo",
                 "verbs": ["get"]},
                {"name": "echoes/exec", "singularName": "", "namespaced": true, "kind": "Echo",
                 "verbs": ["create", "get"]},
            ],
        }),
        ["apis", g, VERSION, "namespaces", namespace, "echoes", name] if *g == group => json!({
            "apiVersion": group_version, "kind": "Echo",
            "metadata": {"name": name, "namespace": namespace},
            "seenUser": seen.remote_user,
        }),
        ["apis", g, VERSION, "namespaces", _, "echoes", name, "exec"] if *g == group => {
            let name = (*name).to_string();
            let close_after = close_after(request.uri().query());
            return upgrade(&mut request, name, close_after, server);
        }
        _ => return failure(StatusCode::NOT_FOUND, "NotFound", "not found"),
    };
    json_response(StatusCode::OK, &body)
}

/// The `closeAfter` query parameter, if present and a number.
fn close_after(query: Option<&str>) -> Option<usize> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == "closeAfter")
        .and_then(|(_, value)| value.parse().ok())
}

/// Answers an exec request: WebSocket or SPDY/3.1 by its `Upgrade` header, 400 otherwise.
fn upgrade(
    request: &mut Request<Incoming>,
    name: String,
    close_after: Option<usize>,
    server: &Arc<Server>,
) -> Reply {
    let upgrades = header_list(request.headers(), "upgrade");
    let wants = |protocol: &str| upgrades.iter().any(|u| u.eq_ignore_ascii_case(protocol));
    let connection_upgrade = header_list(request.headers(), "connection")
        .iter()
        .any(|token| token.eq_ignore_ascii_case("upgrade"));
    if !connection_upgrade || !(wants("websocket") || wants("SPDY/3.1")) {
        return failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "unable to upgrade: exec needs Connection: Upgrade and Upgrade: websocket or SPDY/3.1",
        );
    }
    let kind = if wants("websocket") {
        Upgrade::WebSocket
    } else {
        Upgrade::Spdy
    };
    let handshake = match kind {
        Upgrade::WebSocket => websocket_handshake(request.headers()),
        Upgrade::Spdy => spdy_handshake(request.headers()),
    };
    let switch = match handshake {
        Ok(switch) => switch,
        Err(refusal) => return *refusal,
    };
    let mut response = Reply::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = switch.headers;
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));

    let on_upgrade = hyper::upgrade::on(request);
    let server = server.clone();
    let protocol = switch.protocol;
    tokio::spawn(async move {
        let (echoed, end) = match on_upgrade.await {
            Ok(upgraded) => match kind {
                Upgrade::WebSocket => echo_messages(upgraded, close_after).await,
                Upgrade::Spdy => echo_bytes(upgraded, close_after).await,
            },
            Err(e) => (0, TunnelEnd::Failed(format!("upgrading: {e}"))),
        };
        lock(&server.records.tunnels).push(Tunnel {
            name,
            upgrade: kind,
            protocol,
            echoed,
            end,
        });
    });
    response
}

/// An accepted upgrade handshake.
#[derive(Debug)]
struct Switch {
    /// The negotiated subprotocol or stream protocol version.
    protocol: Option<String>,
    /// The 101's headers, but for `Connection`.
    headers: HeaderMap,
}

/// Checks a WebSocket handshake; returns the 101 to send, or the refusal.
fn websocket_handshake(headers: &HeaderMap) -> Result<Switch, Box<Reply>> {
    let bad_request = |message: &str| Box::new(failure(StatusCode::BAD_REQUEST, "BadRequest", message));
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| bad_request("missing Sec-WebSocket-Key"))?;
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|version| version != "13")
    {
        return Err(bad_request("Sec-WebSocket-Version must be 13"));
    }
    let offered = header_list(headers, "sec-websocket-protocol");
    let protocol = if offered.is_empty() {
        None
    } else {
        let chosen = offered
            .iter()
            .find(|protocol| WEBSOCKET_PROTOCOLS.contains(&protocol.as_str()))
            .ok_or_else(|| {
                Box::new(failure(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    &format!(
                        "requested protocol(s) are not supported: {offered:?}; supports {WEBSOCKET_PROTOCOLS:?}"
                    ),
                ))
            })?;
        Some(chosen.clone())
    };
    let mut switch = Switch {
        protocol,
        headers: HeaderMap::new(),
    };
    switch
        .headers
        .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let accept = HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
        .map_err(|_| bad_request("bad Sec-WebSocket-Key"))?;
    switch.headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(protocol) = &switch.protocol {
        let value = HeaderValue::from_str(protocol).map_err(|_| bad_request("bad subprotocol"))?;
        switch.headers.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
    }
    Ok(switch)
}

/// Checks a SPDY/3.1 handshake; returns the 101 to send, or the refusal.
fn spdy_handshake(headers: &HeaderMap) -> Result<Switch, Box<Reply>> {
    let offered = header_list(headers, "x-stream-protocol-version");
    if offered.is_empty() {
        return Err(Box::new(failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "unable to upgrade: X-Stream-Protocol-Version is required",
        )));
    }
    let Some(chosen) = offered
        .iter()
        .find(|protocol| SPDY_PROTOCOLS.contains(&protocol.as_str()))
    else {
        let mut refusal = failure(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {SPDY_PROTOCOLS:?}"
            ),
        );
        for protocol in SPDY_PROTOCOLS {
            refusal.headers_mut().append(
                "x-accepted-stream-protocol-versions",
                HeaderValue::from_static(protocol),
            );
        }
        return Err(Box::new(refusal));
    };
    let version = HeaderValue::from_str(chosen).map_err(|_| {
        Box::new(failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "bad protocol version",
        ))
    })?;
    let mut switch = Switch {
        protocol: Some(chosen.clone()),
        headers: HeaderMap::new(),
    };
    switch
        .headers
        .insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    switch.headers.insert("x-stream-protocol-version", version);
    Ok(switch)
}

/// Echoes every text and binary message until the client closes, or closes itself after
/// `close_after` messages. Returns how many it echoed and how it ended.
async fn echo_messages(upgraded: Upgraded, close_after: Option<usize>) -> (usize, TunnelEnd) {
    let mut socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
    let mut echoed = 0;
    let mut end = None;
    while let Some(message) = socket.next().await {
        match message {
            Ok(message @ (Message::Text(_) | Message::Binary(_))) => {
                if let Err(e) = socket.send(message).await {
                    return (echoed, TunnelEnd::Failed(format!("echoing: {e}")));
                }
                echoed += 1;
                if end.is_none() && close_after == Some(echoed) {
                    if let Err(e) = socket.close(None).await {
                        return (echoed, TunnelEnd::Failed(format!("closing: {e}")));
                    }
                    end = Some(TunnelEnd::ServerClosed);
                }
            }
            // The reply to a client's Close goes out on the next poll, which then ends the stream.
            Ok(Message::Close(_)) => {
                end.get_or_insert(TunnelEnd::ClientClosed);
            }
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
            Err(e) => return (echoed, end.unwrap_or(TunnelEnd::Failed(format!("reading: {e}")))),
        }
    }
    let end = end.unwrap_or_else(|| TunnelEnd::Failed("the connection ended without a Close frame".into()));
    (echoed, end)
}

/// Echoes bytes until the client's end of stream (then ends its own side), or ends its side
/// after `close_after` bytes and waits for the client's. Returns how many bytes it echoed and how
/// it ended.
async fn echo_bytes(upgraded: Upgraded, close_after: Option<usize>) -> (usize, TunnelEnd) {
    let mut stream = TokioIo::new(upgraded);
    let mut buffer = vec![0; 64 * 1024];
    let mut echoed = 0;
    loop {
        let room = close_after.map_or(buffer.len(), |limit| buffer.len().min(limit - echoed));
        if room == 0 {
            if let Err(e) = stream.shutdown().await {
                return (echoed, TunnelEnd::Failed(format!("ending the stream: {e}")));
            }
            // Read on until the other side ends too, so nothing unread makes the close a reset.
            let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
                while stream.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
            })
            .await;
            return match drained {
                Ok(()) => (echoed, TunnelEnd::ServerClosed),
                Err(_) => (
                    echoed,
                    TunnelEnd::Failed("the client did not close after the server did".into()),
                ),
            };
        }
        match stream.read(&mut buffer[..room]).await {
            Ok(0) => {
                let _ignored = stream.shutdown().await;
                return (echoed, TunnelEnd::ClientClosed);
            }
            Ok(n) => {
                if let Err(e) = stream.write_all(&buffer[..n]).await {
                    return (echoed, TunnelEnd::Failed(format!("echoing: {e}")));
                }
                echoed += n;
            }
            Err(e) => return (echoed, TunnelEnd::Failed(format!("reading: {e}"))),
        }
    }
}

fn api_group(group: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/{VERSION}"), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [version],
           "preferredVersion": version})
}

fn failure(status: StatusCode, reason: &str, message: &str) -> Reply {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "reason": reason, "message": message, "code": status.as_u16()});
    json_response(status, &body)
}

fn json_response(status: StatusCode, body: &Value) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    const WEBSOCKET: [(&str, &str); 2] = [
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn websocket_subprotocol_is_the_clients_first_supported_one() {
        let offer = [
            &WEBSOCKET[..],
            &[
                ("sec-websocket-protocol", "v9.example, v4.channel.k8s.io"),
                ("sec-websocket-protocol", "v5.channel.k8s.io"),
            ],
        ]
        .concat();
        let switch = websocket_handshake(&headers(&offer)).unwrap();
        assert_eq!(switch.protocol.as_deref(), Some("v4.channel.k8s.io"));
        assert_eq!(switch.headers["sec-websocket-protocol"], "v4.channel.k8s.io");
        // RFC 6455's example key and answer.
        assert_eq!(
            switch.headers["sec-websocket-accept"],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );

        let none = websocket_handshake(&headers(&WEBSOCKET)).unwrap();
        assert_eq!(none.protocol, None);
        assert!(!none.headers.contains_key("sec-websocket-protocol"));

        let unsupported = [&WEBSOCKET[..], &[("sec-websocket-protocol", "v9.example")]].concat();
        let refusal = websocket_handshake(&headers(&unsupported)).unwrap_err();
        assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
        let refusal = websocket_handshake(&headers(&WEBSOCKET[..1])).unwrap_err();
        assert_eq!(refusal.status(), StatusCode::BAD_REQUEST, "no version");
    }

    #[test]
    fn spdy_version_is_negotiated_like_httpstream_handshake() {
        let offer = headers(&[
            ("x-stream-protocol-version", "v9.example"),
            ("x-stream-protocol-version", "channel.k8s.io"),
            ("x-stream-protocol-version", "v5.channel.k8s.io"),
        ]);
        let switch = spdy_handshake(&offer).unwrap();
        assert_eq!(switch.protocol.as_deref(), Some("channel.k8s.io"));
        assert_eq!(switch.headers["x-stream-protocol-version"], "channel.k8s.io");
        assert_eq!(switch.headers["upgrade"], "SPDY/3.1");

        let refusal = spdy_handshake(&headers(&[("x-stream-protocol-version", "v9.example")])).unwrap_err();
        assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            refusal
                .headers()
                .get_all("x-accepted-stream-protocol-versions")
                .iter()
                .count(),
            SPDY_PROTOCOLS.len()
        );
        let refusal = spdy_handshake(&HeaderMap::new()).unwrap_err();
        assert_eq!(refusal.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn close_after_reads_only_a_number() {
        assert_eq!(close_after(Some("closeAfter=3&x=1")), Some(3));
        assert_eq!(close_after(Some("closeAfter=three")), None);
        assert_eq!(close_after(None), None);
    }
}
