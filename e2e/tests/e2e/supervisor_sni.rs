//! Host-based multi-tenancy on real components: a second FederationDomain on its own host name,
//! with its own TLS Secret, is served with that certificate to clients that name the host (SNI),
//! while clients that name no host (an IP address) get the default certificate; each host
//! answers with its own issuer.

use std::{sync::Arc, time::Duration};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use rustls_pki_types::{pem::PemObject as _, CertificateDer, ServerName};
use selkie_e2e::{pki::CertificateAuthority, supervisor::Supervisor};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::supervisor_oauth::{dex_user_namespace, DexUserNamespace, IDP_NAME};

/// GET `path` from `port` on loopback over TLS, naming `server_name` (SNI, and `Host`) and
/// trusting only `ca_pem`: the status line and body. Fails when the handshake does (for
/// example when the certificate is not one `ca_pem` signed for `server_name`).
async fn get_as(port: u16, server_name: &str, ca_pem: &str, path: &str) -> anyhow::Result<(String, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(server_name.to_string())?, tcp)
        .await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {server_name}:{port}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response)).await??;
    let response = String::from_utf8(response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response: {response}"))?;
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

#[tokio::test]
async fn each_host_is_served_with_its_own_certificate_and_issuer() -> anyhow::Result<()> {
    selkie_e2e::install_crypto_provider();
    let DexUserNamespace {
        cluster,
        namespace,
        dex,
        ..
    } = dex_user_namespace("supervisor-sni", &[], None).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let port: u16 = supervisor
        .issuer()
        .trim_start_matches("https://127.0.0.1:")
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()?;

    // Team B's FederationDomain on its own host, with a certificate from its own CA.
    let team_ca = CertificateAuthority::new("team-b-ca")?;
    let team_cert = team_ca.issue_serving("sso.team-b.test", &["sso.team-b.test"])?;
    let issuer_b = format!("https://sso.team-b.test:{port}/team-b");
    let manifests = format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: team-b-tls, namespace: {namespace}}}
type: kubernetes.io/tls
data: {{tls.crt: {cert}, tls.key: {key}}}
---
apiVersion: config.supervisor.pinniped.dev/v1alpha1
kind: FederationDomain
metadata: {{name: team-b, namespace: {namespace}}}
spec:
  issuer: {issuer_b}
  tls: {{secretName: team-b-tls}}
  identityProviders:
  - displayName: {IDP_NAME:?}
    objectRef: {{apiGroup: idp.supervisor.pinniped.dev, kind: OIDCIdentityProvider, name: dex}}
"#,
        cert = B64.encode(&team_cert.cert_pem),
        key = B64.encode(&team_cert.key_pem),
    );
    let kubectl = cluster.kubectl();
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
        .await?;
    kubectl
        .run(&[
            "wait",
            "--for=jsonpath={.status.phase}=Ready",
            "--timeout=60s",
            "federationdomain/team-b",
            "-n",
            &namespace,
        ])
        .await?;

    // Naming team B's host: its certificate (trusted through its CA only), its issuer.
    let (status, body) = selkie_e2e::eventually(Duration::from_secs(30), || async {
        get_as(
            port,
            "sso.team-b.test",
            &team_ca.cert_pem(),
            "/team-b/.well-known/openid-configuration",
        )
        .await
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(status.contains(" 200 "), "{status}: {body}");
    let discovery: Value = serde_json::from_str(&body)?;
    anyhow::ensure!(discovery["issuer"] == issuer_b.as_str(), "{discovery}");
    // The default certificate is not what team B's host is served with.
    let default_ca = supervisor.ca_pem();
    anyhow::ensure!(
        get_as(
            port,
            "sso.team-b.test",
            &default_ca,
            "/team-b/.well-known/openid-configuration"
        )
        .await
        .is_err(),
        "team B's host was served the default certificate"
    );

    // Naming no host (an IP address): the default certificate and the first issuer; team B's
    // issuer is not served there.
    let (_, path) = crate::supervisor_sessions::split(supervisor.issuer());
    let (status, body) = get_as(
        port,
        "127.0.0.1",
        &default_ca,
        &format!("{path}/.well-known/openid-configuration"),
    )
    .await?;
    anyhow::ensure!(status.contains(" 200 "), "{status}: {body}");
    let discovery: Value = serde_json::from_str(&body)?;
    anyhow::ensure!(discovery["issuer"] == supervisor.issuer(), "{discovery}");
    let (status, _) = get_as(
        port,
        "127.0.0.1",
        &default_ca,
        "/team-b/.well-known/openid-configuration",
    )
    .await?;
    anyhow::ensure!(
        status.contains(" 404 "),
        "team B's issuer answered on another host: {status}"
    );
    Ok(())
}
