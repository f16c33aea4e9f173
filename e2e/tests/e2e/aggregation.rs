//! The path the TokenCredentialRequest API will take: an APIService backed by a server on
//! loopback (Service `type: ExternalName`, `externalName: localhost`), reached through
//! kube-apiserver, which authenticates with the front-proxy client certificate and passes the
//! caller in `X-Remote-*` headers.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::{server::WebPkiClientVerifier, RootCertStore, ServerConfig};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use selkie_e2e::{cluster::FRONT_PROXY_CLIENT_NAME, pki::CertificateAuthority, Cluster};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use x509_cert::der::Decode;

const GROUP: &str = "echo.e2e.selkie.dev";
const VERSION: &str = "v1alpha1";

/// One request the backend received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    /// Subject of the verified client certificate, if one was presented.
    peer_subject: Option<String>,
    remote_user: Option<String>,
    remote_groups: Vec<String>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

#[tokio::test]
async fn apiservice_on_loopback_is_reached_through_kube_apiserver_with_front_proxy_identity(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "aggregation").await?;
    let service = "echo-api";

    // The backend: TLS with a certificate for the name the aggregator verifies
    // (<service>.<namespace>.svc), client certificates verified against the front-proxy CA.
    let ca = CertificateAuthority::new("echo-api-ca")?;
    let serving = ca.issue_serving(
        "echo-api",
        &[&format!("{service}.{ns}.svc"), "localhost", "127.0.0.1"],
    )?;
    let mut front_proxy_roots = RootCertStore::empty();
    front_proxy_roots.add(CertificateDer::from_pem_slice(
        cluster.pki().front_proxy_ca.cert_pem().as_bytes(),
    )?)?;
    let verifier = WebPkiClientVerifier::builder(Arc::new(front_proxy_roots))
        .allow_unauthenticated()
        .build()?;
    let mut tls = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?,
        )?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let log: Log = Arc::default();
    let server = tokio::spawn(serve(listener, TlsAcceptor::from(Arc::new(tls)), log.clone()));

    let manifests = format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: {service}, namespace: {ns}}}
spec: {{type: ExternalName, externalName: localhost}}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {VERSION}.{GROUP}}}
spec:
  group: {GROUP}
  version: {VERSION}
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {{name: {service}, namespace: {ns}, port: {port}}}
  caBundle: {ca_bundle}
"#,
        ca_bundle = B64.encode(ca.cert_pem()),
    );
    let kubectl = cluster.kubectl();
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
        .await?;
    let available = kubectl
        .output(
            &[
                "wait",
                "--for=condition=Available",
                &format!("apiservice/{VERSION}.{GROUP}"),
                "--timeout=60s",
            ],
            None,
        )
        .await?;
    if !available.success {
        let status = kubectl
            .run(&["get", "apiservice", &format!("{VERSION}.{GROUP}"), "-o", "yaml"])
            .await?;
        anyhow::bail!(
            "the APIService never became Available:\n{}\n{status}",
            available.stderr
        );
    }

    // A user request, through kube-apiserver, resolved by kubectl's discovery like any resource.
    let out = crate::eventually(Duration::from_secs(20), || async {
        Ok(kubectl
            .run(&[
                "get",
                &format!("echoes.{GROUP}"),
                "hello",
                "-n",
                &ns,
                "-o",
                "json",
            ])
            .await?)
    })
    .await?;
    let echo: Value = serde_json::from_str(&out)?;
    assert_eq!(echo["kind"], "Echo");
    assert_eq!(echo["metadata"]["name"], "hello");
    assert_eq!(echo["seenUser"], selkie_e2e::cluster::ADMIN_USER, "{echo}");

    let path = format!("/apis/{GROUP}/{VERSION}/namespaces/{ns}/echoes/hello");
    let seen: Vec<Seen> = log.lock().map_err(|_| anyhow::anyhow!("log poisoned"))?.clone();
    let request = seen.iter().find(|s| s.path == path).ok_or_else(|| {
        anyhow::anyhow!(
            "the backend never saw {path}; it saw {:?}",
            seen.iter().map(|s| &s.path).collect::<Vec<_>>()
        )
    })?;
    let subject = request
        .peer_subject
        .as_deref()
        .unwrap_or("<no client certificate>");
    assert_eq!(
        subject,
        format!("CN={FRONT_PROXY_CLIENT_NAME}"),
        "the aggregator must present its front-proxy cert"
    );
    assert_eq!(
        request.remote_user.as_deref(),
        Some(selkie_e2e::cluster::ADMIN_USER)
    );
    for group in ["system:masters", "system:authenticated"] {
        assert!(
            request.remote_groups.iter().any(|g| g == group),
            "{group} missing: {:?}",
            request.remote_groups
        );
    }

    kubectl
        .run(&["delete", "apiservice", &format!("{VERSION}.{GROUP}")])
        .await?;
    server.abort();
    Ok(())
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, log: Log) {
    while let Ok((tcp, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        let log = log.clone();
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
                let response = handle(&request, peer_subject.clone(), &log);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

fn handle(request: &Request<Incoming>, peer_subject: Option<String>, log: &Log) -> Response<Full<Bytes>> {
    let headers = request.headers();
    let seen = Seen {
        path: request.uri().path().to_string(),
        peer_subject,
        remote_user: headers
            .get("x-remote-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        remote_groups: headers
            .get_all("x-remote-group")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect(),
    };
    if let Ok(mut log) = log.lock() {
        log.push(seen.clone());
    }
    let group_version = format!("{GROUP}/{VERSION}");
    let path: Vec<&str> = seen.path.trim_matches('/').split('/').collect();
    let body = match path.as_slice() {
        ["apis"] => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}),
        ["apis", GROUP] => api_group(),
        ["apis", GROUP, VERSION] => json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": "echoes", "singularName": "echo", "namespaced": true,
                           "kind": "Echo", "verbs": ["get"]}],
        }),
        ["apis", GROUP, VERSION, "namespaces", namespace, "echoes", name] => json!({
            "apiVersion": group_version, "kind": "Echo",
            "metadata": {"name": name, "namespace": namespace},
            "seenUser": seen.remote_user,
        }),
        _ => {
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "reason": "NotFound", "code": 404, "message": "not found"});
            return json_response(StatusCode::NOT_FOUND, &status);
        }
    };
    json_response(StatusCode::OK, &body)
}

fn api_group() -> Value {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv], "preferredVersion": gv})
}

fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
