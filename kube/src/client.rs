//! The Kubernetes client of a server: from a kubeconfig file when one is configured, else the
//! in-cluster configuration (or `$KUBECONFIG`), speaking HTTP/2 to kube-apiserver ([`client`]).

use std::{path::Path, time::Duration};

use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    client::{retry::RetryPolicy, ConfigExt as _},
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};
use tower::{retry::RetryLayer, BoxError, ServiceBuilder};

/// How long a connection to kube-apiserver may carry nothing before it is pinged (an HTTP/2
/// PING, answered by kube-apiserver itself)...
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// ...and how long the answer may take before the connection is closed: its requests and
/// watches then fail, and are retried on a new connection. A kube-apiserver that froze, or whose
/// packets are dropped, is noticed within 40 s even by a watch that sees no events.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why no client could be made. Names the file; never quotes credentials.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The kubeconfig cannot be read or parsed.
    #[error("kubeconfig: reading {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The kubeconfig cannot be used.
    #[error("kubeconfig: {path} is unusable: {message}")]
    Unusable {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// No kubeconfig, and no in-cluster configuration either.
    #[error("no kubeconfig is configured and neither in-cluster configuration nor $KUBECONFIG works: {0}")]
    NoConfiguration(String),
    /// The client cannot be built from the configuration.
    #[error("building the Kubernetes client: {0}")]
    Build(String),
}

/// A client for `kubeconfig`, or for the in-cluster configuration when `None`.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| ClientError::Read {
                path: shown.clone(),
                message: e.to_string(),
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| ClientError::Unusable {
                    path: shown,
                    message: e.to_string(),
                })?
        }
        None => Config::infer()
            .await
            .map_err(|e| ClientError::NoConfiguration(e.to_string()))?,
    };
    client(config)
}

/// Whether kube-apiserver refuses `client`'s credentials outright: a 401 to a SelfSubjectReview,
/// which any authenticated identity may create. That is what a server in a pod sees once its pod
/// has been force-deleted (`kubectl delete pod --force`): the pod's bound service-account token
/// dies with the pod object, so the server can no longer do its work and should stop at once
/// rather than serve out a grace period. `false` when the credentials are accepted, and when
/// kube-apiserver does not answer within `timeout` or fails otherwise (nothing is known then).
pub async fn credentials_rejected(client: &Client, timeout: Duration) -> bool {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let reviews: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    matches!(
        tokio::time::timeout(timeout, reviews.create(&Default::default(), &SelfSubjectReview::default())).await,
        Ok(Err(kube::Error::Api(status))) if status.code == 401
    )
}

/// A client for `config` that speaks HTTP/2 to kube-apiserver when it offers it (it does, over
/// TLS): every request and watch of a server shares one connection, where kube's default client
/// (HTTP/1.1) opens a connection per request in flight and pools them — 249 connections for the
/// Supervisor's status writes at 500 FederationDomains. The connection is pinged when idle
/// ([`KEEP_ALIVE_INTERVAL`], [`KEEP_ALIVE_TIMEOUT`]). Requests asking for an upgrade (exec) go
/// over HTTP/1.1 connections of their own: HTTP/2 has no `Upgrade`.
///
/// Otherwise the client is kube's own: its base URI, authentication (tokens re-read from their
/// file, client certificates), extra headers, retries of 429/503/504 and connect timeout, from
/// `config`. A configuration with a proxy gets kube's default client (HTTP/1.1). Fails when the
/// TLS or authentication settings are unusable.
pub fn client(config: Config) -> Result<Client, ClientError> {
    let build = |error: kube::Error| ClientError::Build(error.to_string());
    if config.proxy_url.is_some() {
        return Client::try_from(config).map_err(build);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let tls = config.rustls_client_config().map_err(build)?;
    let server_name = match &config.tls_server_name {
        Some(name) => Some(
            rustls_pki_types::ServerName::try_from(name.clone())
                .map_err(|e| ClientError::Build(format!("tls-server-name {name:?}: {e}")))?,
        ),
        None => None,
    };
    let https = || {
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http();
        match &server_name {
            Some(name) => {
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name.clone()))
            }
            None => builder,
        }
    };
    let mut pool = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    pool.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true);
    let connections = ByUpgrade {
        multiplexed: pool.build(https().enable_all_versions().wrap_connector(http.clone())),
        upgrades: pool.build(https().enable_http1().wrap_connector(http)),
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(build)?)
        .layer(config.extra_headers_layer().map_err(build)?)
        .map_err(BoxError::from)
        .service(connections);
    Ok(Client::new(service, config.default_namespace))
}

/// The connection pools of [`client`]: requests asking for an upgrade (`kubectl exec`-style
/// WebSocket or SPDY, the Concierge's exec into its kube-cert-agent pod) over HTTP/1.1, whose
/// `Upgrade` HTTP/2 has no room for; every other request over the shared HTTP/2 connection.
#[derive(Clone)]
struct ByUpgrade<M, U> {
    multiplexed: hyper_util::client::legacy::Client<M, kube::client::Body>,
    upgrades: hyper_util::client::legacy::Client<U, kube::client::Body>,
}

impl<M, U> tower::Service<http::Request<kube::client::Body>> for ByUpgrade<M, U>
where
    M: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
    U: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = hyper_util::client::legacy::ResponseFuture;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        // Both pools take requests at any time (as hyper-util's own `Service` impl says).
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        if request.headers().contains_key(http::header::UPGRADE) {
            self.upgrades.request(request)
        } else {
            self.multiplexed.request(request)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use base64::Engine as _;
    use http_body_util::Full;
    use hyper::{body::Incoming, Request, Response};
    use hyper_util::rt::TokioIo;
    use rustls_pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
    use tokio::net::TcpListener;

    use super::*;
    use crate::certs;

    /// A TLS server offering HTTP/2 and HTTP/1.1, as kube-apiserver does, answering every
    /// request with the HTTP version it came in and its `Authorization`; counts connections.
    async fn server(serving: &certs::CertPair) -> (u16, Arc<AtomicUsize>) {
        let chain = CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap();
        let mut tls =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                        let authorization = request
                            .headers()
                            .get("authorization")
                            .and_then(|value| value.to_str().ok())
                            .unwrap_or("-");
                        let body = format!("{:?} {authorization}", request.version());
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(bytes::Bytes::from(body))))
                    });
                    let _ended = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        (port, connections)
    }

    /// The server's requests and watches share one HTTP/2 connection, with the kubeconfig's
    /// credentials; kube's default client would open one HTTP/1.1 connection per request in
    /// flight.
    #[tokio::test]
    async fn requests_share_one_http2_connection_with_the_kubeconfigs_credentials() {
        let day = Duration::from_secs(86_400);
        let ca = certs::generate_ca("test CA", day).unwrap();
        let serving = certs::issue_serving(&ca, &["127.0.0.1".to_string()], day).unwrap();
        let (port, connections) = server(&serving).await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let ca_data = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:{port}', certificate-authority-data: {ca_data}}}}}]\n\
                 users: [{{name: u, user: {{token: t0ken}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
            ),
        )
        .unwrap();
        let client = connect(Some(&kubeconfig)).await.unwrap();
        let get = || {
            let client = client.clone();
            async move {
                let request = Request::get("/version").body(Vec::new()).unwrap();
                client.request_text(request).await.unwrap()
            }
        };
        assert_eq!(get().await, "HTTP/2.0 Bearer t0ken");
        let answers = futures::future::join_all((0..20).map(|_| get())).await;
        assert!(
            answers.iter().all(|answer| answer == "HTTP/2.0 Bearer t0ken"),
            "{answers:?}"
        );
        assert_eq!(connections.load(Ordering::SeqCst), 1, "connections opened");
        // A request asking for an upgrade (kube's exec) goes over HTTP/1.1, on a connection of
        // its own.
        let upgrade = Request::get("/exec")
            .header(http::header::UPGRADE, "websocket")
            .body(Vec::new())
            .unwrap();
        assert_eq!(
            client.request_text(upgrade).await.unwrap(),
            "HTTP/1.1 Bearer t0ken"
        );
        assert_eq!(connections.load(Ordering::SeqCst), 2, "connections opened");
    }
}
