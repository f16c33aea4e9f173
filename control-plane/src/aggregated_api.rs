//! The Concierge's aggregated API server: `TokenCredentialRequest` (login) and `WhoAmIRequest`
//! (identity), reached through kube-apiserver's aggregation layer as Pinniped's are.
//!
//! [`serve`] runs it: HTTPS with rustls on `aggregatedApi.listen`, TLS 1.3 only (Pinniped's
//! `Secure` profile for aggregated servers), ALPN `h2` and `http/1.1`. Alongside the listener it
//! runs:
//!
//! * a watch of `kube-system/extension-apiserver-authentication`, which decides who a caller is
//!   ([`selkie_filters::front_proxy`]: the front proxy's `X-Remote-*` headers are trusted only on a connection whose
//!   client certificate chains to `requestheader-client-ca-file` with an allowed CN; a
//!   certificate of `client-ca-file` is a user by itself; anything else is anonymous);
//! * a watch of the serving-certificate Secret `<namePrefix>-api-tls-serving-certificate`, whose
//!   certificate every new handshake uses ([`selkie_kube::serving_secret`]);
//! * while this replica is the leader, the [`CertificateManager`]: it creates and renews
//!   that Secret and keeps `spec.caBundle` of the APIServices `v1alpha1.login.concierge.<suffix>`
//!   and `v1alpha1.identity.concierge.<suffix>` in sync (it only updates existing ones).
//!
//! Routes ([`routes`]): discovery (`/apis`, `/apis/<group>`, `/apis/<group>/v1alpha1`, and the
//! aggregated v2 document kube-apiserver asks for), `/healthz`, `/livez`, `/readyz`, minimal
//! `/openapi/v2` and `/openapi/v3`, `POST .../tokencredentialrequests` (answered `201` by the
//! shared [`selkie_filters::issuing::login_api`] with the published chain, failure included, and a no-op
//! list) and `POST .../whoamirequests` (the caller). Everything else is a `metav1.Status`.
//!
//! The RBAC this needs (in the install manifests): `get`/`list`/`watch` on the ConfigMap in
//! `kube-system` (the `extension-apiserver-authentication-reader` Role), `get`/`list`/`watch`/
//! `create`/`update` on Secrets in the Concierge's namespace, and `get`/`list`/`watch`/`patch` on
//! `apiregistration.k8s.io` APIServices. kube-apiserver authorizes each request before it is
//! proxied here (Pinniped's `pre-authn-apis` ClusterRole lets everyone create both kinds).
//!
//! Tokens are never logged: the login API writes one audit line per TokenCredentialRequest (user,
//! authenticator, issued or not), and refusals here never quote a request body.

pub mod routes;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwapOption;
use futures::StreamExt as _;
use http::Request;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
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
use tokio::{net::TcpListener, sync::Notify, task::JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::{config::ControlPlaneConfig, published::Publisher};

use selkie_filters::front_proxy::{self as authn, Authentication, ConnectionVerdict};
use selkie_kube::{
    serving::ServingCert,
    serving_secret::{self as serving, CertificateManager},
};

use self::routes::{Context, Routes};

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an HTTP/1.1 client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long open connections may finish their requests after shutdown is asked for.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the aggregated API server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AggregatedApiError {
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

/// The names of what the aggregated API server manages, from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The Service kube-apiserver reaches the server through, `<namePrefix>-api`.
    pub service: String,
    /// The name the serving certificate is for, `<service>.<namespace>.svc`.
    pub serving_name: String,
    /// The serving-certificate Secret, `<namePrefix>-api-tls-serving-certificate`.
    pub secret: String,
    /// `v1alpha1.login.concierge.<suffix>`, then `v1alpha1.identity.concierge.<suffix>`.
    pub api_services: Vec<String>,
}

impl Names {
    /// The names for `config`.
    pub fn new(config: &ControlPlaneConfig) -> Self {
        let service = config.name("api");
        Self {
            serving_name: format!("{service}.{}.svc", config.namespace),
            secret: config.name("api-tls-serving-certificate"),
            api_services: [selkie_api::login::GROUP, "identity.concierge.pinniped.dev"]
                .iter()
                .map(|group| format!("{}.{}", routes::VERSION, config.group(group)))
                .collect(),
            service,
        }
    }
}

/// Shared by every connection.
struct Shared {
    routes: Routes,
    publisher: Publisher,
    serving: Arc<ServingCert>,
    authentication: ArcSwapOption<Authentication>,
}

/// Binds `config.aggregated_api.listen` and runs [`serve_on`] there. Fails at once if the address
/// cannot be bound.
pub async fn serve(
    client: Client,
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    leader: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Future,
) -> Result<(), AggregatedApiError> {
    let address = config.aggregated_api.listen;
    let listener = TcpListener::bind(address)
        .await
        .map_err(|error| AggregatedApiError::Bind { address, error })?;
    serve_on(listener, client, config, publisher, leader, shutdown).await
}

/// Serves the aggregated API on `listener` until `shutdown` completes, then stops accepting,
/// lets open connections finish for up to 10 s, stops its watches and returns `Ok(())`.
///
/// `leader` says whether this replica writes (the serving-certificate Secret and the APIServices'
/// caBundle); every replica serves. `publisher` supplies the chain each TokenCredentialRequest is
/// authenticated with and the login API that signs. Until a serving certificate is loaded from the
/// Secret, handshakes fail; until the authentication ConfigMap is read, every caller is anonymous
/// and `/readyz` fails. Errors of the watches and of the leader's writes are logged and retried;
/// only an unusable TLS configuration fails the call.
pub async fn serve_on(
    listener: TcpListener,
    client: Client,
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    leader: tokio::sync::watch::Receiver<bool>,
    shutdown: impl Future,
) -> Result<(), AggregatedApiError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let names = Names::new(&config);
    let shared = Arc::new(Shared {
        routes: Routes::new(&config),
        publisher,
        serving: Arc::new(ServingCert::disabled()),
        authentication: ArcSwapOption::empty(),
    });
    let acceptor = tls_acceptor(&provider, shared.serving.clone())?;

    let mut background = JoinSet::new();
    let wake = Arc::new(Notify::new());
    background.spawn(watch_authentication(client.clone(), shared.clone()));
    background.spawn(serving::watch_secret(
        Api::<Secret>::namespaced(client.clone(), &config.namespace),
        names.secret.clone(),
        names.serving_name.clone(),
        shared.serving.clone(),
        wake.clone(),
    ));
    background.spawn(serving::watch_api_services(
        Api::<APIService>::all(client.clone()),
        names.api_services.clone(),
        wake.clone(),
    ));
    let manager = CertificateManager {
        secrets: Api::namespaced(client.clone(), &config.namespace),
        api_services: Api::all(client),
        secret_name: names.secret.clone(),
        service_name: names.serving_name.clone(),
        api_service_names: names.api_services.clone(),
    };
    background.spawn(manager.run(leader, wake));

    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(
        address = ?listener.local_addr().ok(),
        login = shared.routes.login_group(),
        identity = shared.routes.identity_group(),
        "serving the aggregated API"
    );
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    let watcher = graceful.watcher();
                    tokio::spawn(serve_connection(tcp, acceptor.clone(), shared.clone(), watcher));
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
    background.shutdown().await;
    Ok(())
}

/// TLS 1.3 only, ALPN h2 and http/1.1, the certificate of `serving`, client certificates asked
/// for and verified per request.
fn tls_acceptor(
    provider: &Arc<CryptoProvider>,
    serving: Arc<ServingCert>,
) -> Result<TlsAcceptor, AggregatedApiError> {
    let verifier = selkie_filters::possession::PossessionVerifier::new();
    let mut tls = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| AggregatedApiError::Tls(e.to_string()))?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(serving);
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(tls)))
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    watcher: hyper_util::server::graceful::Watcher,
) {
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
        let shared = shared.clone();
        let chain = chain.clone();
        let verdict = verdict.clone();
        async move {
            let authentication = shared.authentication.load_full();
            let caller = match &authentication {
                Some(authentication) => {
                    let verdict = verdict.get(authentication, &chain);
                    authentication.user(&verdict, request.headers())
                }
                None => authn::anonymous(),
            };
            let context = Context {
                publisher: &shared.publisher,
                ready: authentication.is_some() && shared.serving.is_enabled(),
            };
            let response = shared.routes.handle(context, request, caller).await;
            Ok::<_, std::convert::Infallible>(response)
        }
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

/// Keeps `shared.authentication` equal to the last readable version of the ConfigMap. A deleted
/// ConfigMap makes every caller anonymous; an unreadable version keeps the previous settings.
async fn watch_authentication(client: Client, shared: Arc<Shared>) {
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
                        shared.authentication.store(Some(Arc::new(authentication)));
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
                shared
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
    use super::*;

    #[test]
    fn names_follow_the_prefix_namespace_and_suffix() {
        let config: ControlPlaneConfig =
            serde_yaml::from_str("{namespace: ns1, namePrefix: selkie, apiGroupSuffix: acme.example.com}")
                .unwrap();
        let names = Names::new(&config);
        assert_eq!(names.service, "selkie-api");
        assert_eq!(names.serving_name, "selkie-api.ns1.svc");
        assert_eq!(names.secret, "selkie-api-tls-serving-certificate");
        assert_eq!(
            names.api_services,
            [
                "v1alpha1.login.concierge.acme.example.com",
                "v1alpha1.identity.concierge.acme.example.com"
            ]
        );
        let pinniped = Names::new(&ControlPlaneConfig::default());
        assert_eq!(pinniped.secret, "pinniped-concierge-api-tls-serving-certificate");
        assert_eq!(pinniped.api_services[0], "v1alpha1.login.concierge.pinniped.dev");
    }
}
