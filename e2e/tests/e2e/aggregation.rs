//! The path the TokenCredentialRequest API will take: an APIService backed by a server on
//! loopback (Service `type: ExternalName`, `externalName: localhost`), reached through
//! kube-apiserver, which authenticates with the front-proxy client certificate and passes the
//! caller in `X-Remote-*` headers. The server is the harness's [`EchoApi`].

use std::time::Duration;

use selkie_e2e::{cluster::FRONT_PROXY_CLIENT_NAME, echo_api::EchoApi, Cluster};
use serde_json::Value;

#[tokio::test]
async fn apiservice_on_loopback_is_reached_through_kube_apiserver_with_front_proxy_identity(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "aggregation").await?;
    let echo = EchoApi::start(cluster, &ns).await?;

    // A user request, through kube-apiserver, resolved by kubectl's discovery like any resource.
    let kubectl = cluster.kubectl();
    let resource = format!("echoes.{}", echo.group());
    let out = crate::eventually(Duration::from_secs(20), || async {
        Ok(kubectl
            .run(&["get", &resource, "hello", "-n", &ns, "-o", "json"])
            .await?)
    })
    .await?;
    let object: Value = serde_json::from_str(&out)?;
    assert_eq!(object["kind"], "Echo");
    assert_eq!(object["metadata"]["name"], "hello");
    assert_eq!(object["seenUser"], selkie_e2e::cluster::ADMIN_USER, "{object}");

    let path = echo.object_path(&ns, "hello");
    let seen = echo.requests();
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

    // Dropping the echo API unregisters it, so no unreachable APIService lingers in discovery.
    let api_service = echo.api_service();
    drop(echo);
    let gone = kubectl.output(&["get", "apiservice", &api_service], None).await?;
    assert!(
        !gone.success && gone.stderr.contains("NotFound"),
        "{}",
        gone.stderr
    );
    Ok(())
}
