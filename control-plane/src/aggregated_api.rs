//! The Concierge's aggregated API server: `TokenCredentialRequest` (login) and `WhoAmIRequest`
//! (identity), reached through kube-apiserver's aggregation layer as Pinniped's are.
//!
//! [`serve`] runs it on `aggregatedApi.listen` with selkie-kube's aggregated API server
//! ([`selkie_kube::aggregated::server`]): HTTPS with rustls, TLS 1.3 only (Pinniped's `Secure`
//! profile for aggregated servers), ALPN `h2` and `http/1.1`. Alongside the listener it runs:
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
//!
//! [`CertificateManager`]: selkie_kube::serving_secret::CertificateManager

pub mod routes;

use std::{future::Future, sync::Arc};

use http::Request;
use hyper::body::Incoming;
use kube::Client;
use selkie_filters::identity::UserInfo;
use selkie_kube::aggregated::server;
use tokio::net::TcpListener;

use crate::{config::ControlPlaneConfig, published::Publisher};

use self::routes::{Context, Routes};

/// Why the aggregated API server could not run (selkie-kube's server error).
pub use selkie_kube::aggregated::server::ServerError as AggregatedApiError;

/// The names of what the Concierge's aggregated API server manages, for `config`: the Service
/// `<namePrefix>-api` of `config.namespace`, the serving name `<service>.<namespace>.svc`, the
/// Secret `<namePrefix>-api-tls-serving-certificate`, and the APIServices
/// `v1alpha1.login.concierge.<suffix>`, then `v1alpha1.identity.concierge.<suffix>`.
pub fn names(config: &ControlPlaneConfig) -> server::Names {
    server::Names::new(
        &config.name_prefix,
        &config.namespace,
        routes::VERSION,
        &[
            config.group(selkie_api::login::GROUP),
            config.group("identity.concierge.pinniped.dev"),
        ],
    )
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
    let names = names(&config);
    let routes = Arc::new((Routes::new(&config), publisher));
    let handler = move |request: Request<Incoming>, caller: UserInfo, ready: bool| {
        let routes = routes.clone();
        async move {
            let (routes, publisher) = &*routes;
            routes.handle(Context { publisher, ready }, request, caller).await
        }
    };
    server::serve_on(listener, client, names, leader, shutdown, handler).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prefix_namespace_and_suffix() {
        let config: ControlPlaneConfig =
            serde_yaml::from_str("{namespace: ns1, namePrefix: selkie, apiGroupSuffix: acme.example.com}")
                .unwrap();
        let names = names(&config);
        assert_eq!(names.namespace, "ns1");
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
        let pinniped = super::names(&ControlPlaneConfig::default());
        assert_eq!(pinniped.secret, "pinniped-concierge-api-tls-serving-certificate");
        assert_eq!(pinniped.api_services[0], "v1alpha1.login.concierge.pinniped.dev");
    }
}
