//! The server of an aggregated (extension) API behind kube-apiserver, everything but its routes:
//! the Concierge's (`TokenCredentialRequest`, `WhoAmIRequest`) and the Supervisor's
//! (`OIDCClientSecretRequest`) run the same machinery with their own [`Names`] and handler.
//!
//! [`serve`] (or [`serve_on`] an already bound listener) runs it: HTTPS with rustls, TLS 1.3 only
//! (Pinniped's `Secure` profile for aggregated servers), ALPN `h2` and `http/1.1`, a client
//! certificate asked for but only its possession checked during the handshake
//! ([`PossessionVerifier`]). Alongside the listener it runs:
//!
//! * a watch of `kube-system/extension-apiserver-authentication`, which decides who a caller is
//!   ([`selkie_filters::front_proxy`]: the front proxy's `X-Remote-*` headers are trusted only on a
//!   connection whose client certificate chains to `requestheader-client-ca-file` with an allowed
//!   CN; a certificate of `client-ca-file` is a user by itself; anything else is anonymous);
//! * a watch of the serving-certificate Secret [`Names::secret`], whose certificate every new
//!   handshake uses ([`crate::serving_secret`]);
//! * a watch of the APIServices [`Names::api_services`], and, while this replica is the leader,
//!   the [`CertificateManager`]: it creates and renews that Secret and keeps `spec.caBundle` of
//!   those APIServices in sync (it only updates existing ones).
//!
//! Every request goes to the server's handler with its caller and whether the server is ready
//! (a serving certificate is loaded and the authentication ConfigMap has been read); the handler
//! answers everything, health and discovery included (see [`crate::aggregated`]).
//!
//! The RBAC this needs: `get`/`list`/`watch` on the ConfigMap in `kube-system` (the
//! `extension-apiserver-authentication-reader` Role), `get`/`list`/`watch`/`create`/`update` on
//! Secrets in [`Names::namespace`], and `get`/`list`/`watch`/`patch` on `apiregistration.k8s.io`
//! APIServices. kube-apiserver authorizes each request before it is proxied here.
//!
//! Nothing here logs a request, its headers or its body.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwapOption;
use futures::StreamExt as _;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::graceful::{GracefulShutdown, Watcher},
};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    runtime::{watcher, WatchStreamExt as _},
    Api, Client,
};
use rustls::{crypto::CryptoProvider, ServerConfig};
use rustls_pki_types::CertificateDer;
use selkie_filters::{
    front_proxy::{self as authn, Authentication, ConnectionVerdict},
    identity::UserInfo,
    possession::PossessionVerifier,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{watch, Notify},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

use super::Body;
use crate::{
    serving::ServingCert,
    serving_secret::{self as serving, CertificateManager},
};

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an HTTP/1.1 client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long open connections may finish their requests after shutdown is asked for.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the aggregated API server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The listener could not be bound.
    #[error("binding the aggregated API's listener on {address}: {error}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The IO error.
        error: std::io::Error,
    },
    /// The TLS configuration could not be built.
    #[error("the aggregated API's TLS configuration: {0}")]
    Tls(String),
}

/// The names of what an aggregated API server manages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The namespace of the Service and of the serving-certificate Secret (the server's own).
    pub namespace: String,
    /// The Service kube-apiserver reaches the server through (Pinniped: `<namePrefix>-api`).
    pub service: String,
    /// The name the serving certificate is for, `<service>.<namespace>.svc` (the name
    /// kube-apiserver's aggregator verifies).
    pub serving_name: String,
    /// The serving-certificate Secret (Pinniped: `<namePrefix>-api-tls-serving-certificate`).
    pub secret: String,
    /// The APIServices whose `spec.caBundle` follows the Secret, `<version>.<group>` each.
    pub api_services: Vec<String>,
}

impl Names {
    /// Pinniped's names for an installation: the Service `<name_prefix>-api` of `namespace`, the
    /// Secret `<name_prefix>-api-tls-serving-certificate`, and the APIService
    /// `<version>.<group>` of each of `groups` (already carrying the installation's suffix), in
    /// that order.
    pub fn new(name_prefix: &str, namespace: &str, version: &str, groups: &[impl AsRef<str>]) -> Self {
        let service = format!("{name_prefix}-api");
        Self {
            namespace: namespace.to_string(),
            serving_name: format!("{service}.{namespace}.svc"),
            secret: format!("{service}-tls-serving-certificate"),
            api_services: groups
                .iter()
                .map(|group| format!("{version}.{}", group.as_ref()))
                .collect(),
            service,
        }
    }
}

/// What every connection reads: the serving certificate and the caller authentication settings
/// (`None` until the ConfigMap is first read).
struct State {
    serving: Arc<ServingCert>,
    authentication: ArcSwapOption<Authentication>,
}

impl State {
    fn new() -> Self {
        Self {
            serving: Arc::new(ServingCert::disabled()),
            authentication: ArcSwapOption::empty(),
        }
    }
}

/// Binds `address` and runs [`serve_on`] there. Fails at once with [`ServerError::Bind`] if the
/// address cannot be bound.
pub async fn serve<H, F>(
    address: SocketAddr,
    client: Client,
    names: Names,
    leader: watch::Receiver<bool>,
    shutdown: impl Future,
    handler: H,
) -> Result<(), ServerError>
where
    H: Fn(Request<Incoming>, UserInfo, bool) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let listener = TcpListener::bind(address)
        .await
        .map_err(|error| ServerError::Bind { address, error })?;
    serve_on(listener, client, names, leader, shutdown, handler).await
}

/// Serves the aggregated API on `listener` until `shutdown` completes, then stops accepting,
/// lets open connections finish for up to [`DRAIN_TIMEOUT`], stops its watches and returns
/// `Ok(())`.
///
/// Each request is answered by `handler(request, caller, ready)`: `caller` is who the request
/// comes from (see the module documentation; anonymous until the authentication ConfigMap is
/// read), `ready` whether a serving certificate is loaded and the ConfigMap has been read (what
/// `/readyz` reports). The handler never fails: its errors are responses.
///
/// `client` reads the ConfigMap, watches and (while `leader` is `true`) writes the Secret and the
/// APIServices of `names`; every replica serves. Until a serving certificate is loaded from the
/// Secret, handshakes fail. Errors of the watches and of the leader's writes are logged and
/// retried; only an unusable TLS configuration ([`ServerError::Tls`]) fails the call, at once.
pub async fn serve_on<H, F>(
    listener: TcpListener,
    client: Client,
    names: Names,
    leader: watch::Receiver<bool>,
    shutdown: impl Future,
    handler: H,
) -> Result<(), ServerError>
where
    H: Fn(Request<Incoming>, UserInfo, bool) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let state = Arc::new(State::new());
    let acceptor = tls_acceptor(&provider, state.serving.clone())?;

    let mut background = JoinSet::new();
    let wake = Arc::new(Notify::new());
    background.spawn(watch_authentication(client.clone(), state.clone()));
    background.spawn(serving::watch_secret(
        Api::<Secret>::namespaced(client.clone(), &names.namespace),
        names.secret.clone(),
        names.serving_name.clone(),
        state.serving.clone(),
        wake.clone(),
    ));
    background.spawn(serving::watch_api_services(
        Api::<APIService>::all(client.clone()),
        names.api_services.clone(),
        wake.clone(),
    ));
    let manager = CertificateManager {
        secrets: Api::namespaced(client.clone(), &names.namespace),
        api_services: Api::all(client),
        secret_name: names.secret.clone(),
        service_name: names.serving_name.clone(),
        api_service_names: names.api_services.clone(),
    };
    background.spawn(manager.run(leader, wake));

    tracing::info!(
        address = ?listener.local_addr().ok(),
        api_services = ?names.api_services,
        "serving the aggregated API"
    );
    accept_until(listener, acceptor, state, Arc::new(handler), shutdown).await;
    background.shutdown().await;
    Ok(())
}

/// Accepts connections on `listener` until `shutdown` completes, then closes it and waits up to
/// [`DRAIN_TIMEOUT`] for open connections to finish.
async fn accept_until<H, F>(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: Arc<State>,
    handler: Arc<H>,
    shutdown: impl Future,
) where
    H: Fn(Request<Incoming>, UserInfo, bool) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    let watcher = graceful.watcher();
                    tokio::spawn(serve_connection(
                        tcp,
                        acceptor.clone(),
                        state.clone(),
                        handler.clone(),
                        watcher,
                    ));
                }
                Err(error) => {
                    // Out of descriptors or similar: let other tasks finish before trying again.
                    tracing::warn!(%error, "accepting a connection to the aggregated API");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("aggregated API connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}

/// TLS 1.3 only, ALPN h2 and http/1.1, the certificate of `serving`, client certificates asked
/// for and verified per request.
fn tls_acceptor(
    provider: &Arc<CryptoProvider>,
    serving: Arc<ServingCert>,
) -> Result<TlsAcceptor, ServerError> {
    let verifier = PossessionVerifier::new();
    let mut tls = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(serving);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

/// Handshakes (for up to [`HANDSHAKE_TIMEOUT`]) and serves one connection's requests until it
/// closes or the drain of `watcher` ends it. Failures are logged at debug level.
async fn serve_connection<H, F>(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    state: Arc<State>,
    handler: Arc<H>,
    watcher: Watcher,
) where
    H: Fn(Request<Incoming>, UserInfo, bool) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(%error, "aggregated API TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!("aggregated API TLS handshake timed out");
            return;
        }
    };
    let chain: Arc<[CertificateDer<'static>]> = tls
        .get_ref()
        .1
        .peer_certificates()
        .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let verdict = Arc::new(ConnectionVerdict::default());
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let authentication = state.authentication.load_full();
        let caller = match &authentication {
            Some(authentication) => {
                let verdict = verdict.get(authentication, &chain);
                authentication.user(&verdict, request.headers())
            }
            None => authn::anonymous(),
        };
        let ready = authentication.is_some() && state.serving.is_enabled();
        let response = handler(request, caller, ready);
        async move { Ok::<_, std::convert::Infallible>(response.await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client that opens a connection and sends no request headers does not hold it forever.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    if let Err(error) = watcher.watch(connection).await {
        tracing::debug!(%error, "aggregated API connection ended with an error");
    }
}

/// Keeps `state.authentication` equal to the last readable version of the ConfigMap. A deleted
/// ConfigMap makes every caller anonymous; an unreadable version keeps the previous settings.
/// Runs until its task is dropped.
async fn watch_authentication(client: Client, state: Arc<State>) {
    let api = Api::<ConfigMap>::namespaced(client, authn::AUTHENTICATION_CONFIG_MAP_NAMESPACE);
    let config = watcher::Config::default().fields(&format!(
        "metadata.name={}",
        authn::AUTHENTICATION_CONFIG_MAP_NAME
    ));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => {
                match Authentication::from_config_map(&map.data.unwrap_or_default()) {
                    Ok(authentication) => {
                        tracing::info!("read kube-apiserver's client authentication settings");
                        state.authentication.store(Some(Arc::new(authentication)));
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        "{}/{} is unreadable; the previous settings stay",
                        authn::AUTHENTICATION_CONFIG_MAP_NAMESPACE,
                        authn::AUTHENTICATION_CONFIG_MAP_NAME
                    ),
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!("the client authentication settings were deleted; every caller is anonymous");
                state
                    .authentication
                    .store(Some(Arc::new(Authentication::default())));
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "watching kube-apiserver's client authentication settings"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Empty, Full};
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    use rustls::{ClientConfig, RootCertStore};
    use rustls_pki_types::{pem::PemObject as _, PrivateKeyDer, ServerName};
    use tokio::sync::oneshot;
    use tokio_rustls::TlsConnector;

    use super::*;
    use crate::certs::{self, CertPair};

    const SERVING_NAME: &str = "pinniped-supervisor-api.ns1.svc";
    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn names_follow_the_prefix_namespace_and_groups() {
        let names = Names::new(
            "pinniped-supervisor",
            "ns1",
            "v1alpha1",
            &["clientsecret.supervisor.pinniped.dev"],
        );
        assert_eq!(names.namespace, "ns1");
        assert_eq!(names.service, "pinniped-supervisor-api");
        assert_eq!(names.serving_name, SERVING_NAME);
        assert_eq!(names.secret, "pinniped-supervisor-api-tls-serving-certificate");
        assert_eq!(
            names.api_services,
            ["v1alpha1.clientsecret.supervisor.pinniped.dev"]
        );
        let two = Names::new(
            "p",
            "n",
            "v1",
            &[String::from("a.example"), String::from("b.example")],
        );
        assert_eq!(two.api_services, ["v1.a.example", "v1.b.example"]);
    }

    /// A client certificate signed by `ca`: CN `name`, an `O` per group.
    fn client_cert(ca: &CertPair, name: &str, groups: &[&str]) -> CertPair {
        let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, KeyPair::from_pem(&ca.key_pem).unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        for group in groups {
            params.distinguished_name.push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let now = std::time::SystemTime::now();
        params.not_before = (now - certs::BACKDATE).into();
        params.not_after = (now + DAY).into();
        let cert = params.signed_by(&key, &issuer).unwrap();
        CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn client_config(
        ca: &CertPair,
        client: Option<&CertPair>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca.cert_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            Some(client) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
                        .collect::<Result<_, _>>()
                        .unwrap(),
                    PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config
    }

    /// Sends `GET /whoami` (with `headers`) over a new connection; the ALPN protocol and the body.
    async fn get(
        port: u16,
        config: ClientConfig,
        headers: &[(&str, &str)],
    ) -> Result<(Option<Vec<u8>>, String), Box<dyn std::error::Error + Send + Sync>> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(SERVING_NAME)?, tcp)
            .await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let mut request = Request::get(format!("https://{SERVING_NAME}/whoami"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Empty::<Bytes>::new())?;
        let response = if alpn.as_deref() == Some(b"h2") {
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
            tokio::spawn(connection);
            sender.send_request(request).await?
        } else {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
            tokio::spawn(connection);
            sender.send_request(request).await?
        };
        let body = response.into_body().collect().await?.to_bytes();
        Ok((alpn, String::from_utf8(body.to_vec())?))
    }

    #[tokio::test]
    async fn each_request_gets_its_caller_and_readiness() {
        // The serving certificate, as the Secret watch would install it.
        let serving_ca = certs::generate_ca("serving CA", DAY).unwrap();
        let serving = certs::issue_serving(&serving_ca, &[SERVING_NAME.to_string()], DAY).unwrap();
        let state = Arc::new(State::new());
        state
            .serving
            .replace_pem(serving.cert_pem.as_bytes(), serving.key_pem.as_bytes())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let acceptor = tls_acceptor(&provider, state.serving.clone()).unwrap();

        let handler = |request: Request<Incoming>, caller: UserInfo, ready: bool| async move {
            let body = format!(
                "{} {} {:?} ready={ready}",
                request.uri().path(),
                caller.username,
                caller.groups
            );
            Response::new(Full::new(Bytes::from(body)))
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(accept_until(
            listener,
            acceptor,
            state.clone(),
            Arc::new(handler),
            async {
                let _stopped = stopped.await;
            },
        ));

        // Before the ConfigMap is read: anonymous, not ready (a client certificate changes nothing).
        let client_ca = certs::generate_ca("client CA", DAY).unwrap();
        let alice = client_cert(&client_ca, "alice", &["devs"]);
        let (alpn, body) = get(
            port,
            client_config(&serving_ca, Some(&alice), &[&rustls::version::TLS13]),
            &[],
        )
        .await
        .unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
        assert_eq!(
            body,
            r#"/whoami system:anonymous ["system:unauthenticated"] ready=false"#
        );

        // TLS 1.2 is refused.
        let refused = get(
            port,
            client_config(&serving_ca, None, &[&rustls::version::TLS12]),
            &[],
        )
        .await;
        assert!(refused.is_err());

        // Once it is read: a certificate of client-ca-file is a user by itself; the front proxy's
        // headers are trusted only on the front proxy's connection.
        let front_proxy_ca = certs::generate_ca("front proxy CA", DAY).unwrap();
        let front_proxy = client_cert(&front_proxy_ca, "front-proxy-client", &[]);
        let data = BTreeMap::from([
            ("client-ca-file".to_string(), client_ca.cert_pem.clone()),
            (
                "requestheader-client-ca-file".to_string(),
                front_proxy_ca.cert_pem.clone(),
            ),
            (
                "requestheader-allowed-names".to_string(),
                r#"["front-proxy-client"]"#.to_string(),
            ),
            (
                "requestheader-username-headers".to_string(),
                r#"["X-Remote-User"]"#.to_string(),
            ),
            (
                "requestheader-group-headers".to_string(),
                r#"["X-Remote-Group"]"#.to_string(),
            ),
        ]);
        state
            .authentication
            .store(Some(Arc::new(Authentication::from_config_map(&data).unwrap())));
        let headers = [("x-remote-user", "bob"), ("x-remote-group", "ops")];
        let (_, body) = get(
            port,
            client_config(&serving_ca, Some(&alice), &[&rustls::version::TLS13]),
            &headers,
        )
        .await
        .unwrap();
        assert_eq!(
            body,
            r#"/whoami alice ["devs", "system:authenticated"] ready=true"#
        );
        let (_, body) = get(
            port,
            client_config(&serving_ca, Some(&front_proxy), &[&rustls::version::TLS13]),
            &headers,
        )
        .await
        .unwrap();
        assert_eq!(body, r#"/whoami bob ["ops", "system:authenticated"] ready=true"#);
        let (_, body) = get(
            port,
            client_config(&serving_ca, None, &[&rustls::version::TLS13]),
            &headers,
        )
        .await
        .unwrap();
        assert_eq!(
            body,
            r#"/whoami system:anonymous ["system:unauthenticated"] ready=true"#
        );

        // Without a serving certificate, handshakes fail.
        state.serving.disable();
        assert!(get(
            port,
            client_config(&serving_ca, None, &[&rustls::version::TLS13]),
            &[]
        )
        .await
        .is_err());

        // Shutdown: the listener closes and the loop returns.
        stop.send(()).unwrap();
        tokio::time::timeout(DRAIN_TIMEOUT + Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    }
}
