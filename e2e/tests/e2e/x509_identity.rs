//! Selkie's x509 authenticator reads a client certificate exactly as kube-apiserver does.

use std::time::Duration;

use rustls_pki_types::{pem::PemObject, CertificateDer};
use selkie_e2e::Cluster;
use selkie_filters::{
    outcome::{Outcome, RejectReason},
    x509::X509Authenticator,
};
use serde_json::Value;

fn der(pem: &str) -> anyhow::Result<CertificateDer<'static>> {
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?)
}

#[tokio::test]
async fn x509_authenticator_agrees_with_kube_apiserver_on_user_and_groups() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let x509 = X509Authenticator::new(
        "x509",
        &[&cluster.pki().client_ca.cert_pem()],
        Duration::from_secs(30),
    )?;

    let credential = cluster
        .pki()
        .client_ca
        .issue_client("carol@example.com", &["team:a", "team:b", "team:c"])?;
    let whoami = cluster
        .kubectl()
        .with_kubeconfig(&cluster.kubeconfig_with(&credential)?)
        .run(&["auth", "whoami", "-o", "json"])
        .await?;
    let whoami: Value = serde_json::from_str(&whoami)?;
    let apiserver_groups: Vec<&str> = whoami["status"]["userInfo"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|g| *g != "system:authenticated") // added by the apiserver, not the certificate
        .collect();

    let outcome = x509.authenticate(&[der(&credential.cert_pem)?]);
    let Outcome::Authenticated(identity) = outcome else {
        anyhow::bail!("refused: {outcome:?}")
    };
    assert_eq!(
        whoami["status"]["userInfo"]["username"],
        identity.user.username.as_str()
    );
    assert_eq!(apiserver_groups, identity.user.groups);
    assert_eq!(identity.user.groups, vec!["team:a", "team:b", "team:c"]);
    // The extras too: kube-apiserver names the certificate by its credential id.
    assert_eq!(
        whoami["status"]["userInfo"]["extra"],
        serde_json::to_value(&identity.user.extra)?,
        "{whoami}"
    );
    assert!(
        identity.user.extra[selkie_filters::identity::CREDENTIAL_ID_EXTRA][0].starts_with("X509SHA256="),
        "{:?}",
        identity.user.extra
    );

    // A certificate from another CA is refused by both.
    let stranger = cluster
        .pki()
        .front_proxy_ca
        .issue_client("mallory", &["system:masters"])?;
    assert_eq!(
        x509.authenticate(&[der(&stranger.cert_pem)?]),
        Outcome::Rejected(RejectReason::UntrustedCertificate)
    );
    let refused = cluster
        .kubectl()
        .with_kubeconfig(&cluster.kubeconfig_with(&stranger)?)
        .output(&["auth", "whoami"], None)
        .await?;
    assert!(
        !refused.success && refused.stderr.contains("Unauthorized"),
        "{refused:?}"
    );
    Ok(())
}
