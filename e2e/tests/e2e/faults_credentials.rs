//! kube-apiserver refusing the impersonation proxy's own credentials, against the real
//! kube-apiserver: what a replica of the Concierge lives through from the moment its pod is
//! deleted (`kubectl delete pod --force`) until it stops, since its service-account token is
//! bound to the pod and invalid from the deletion on.
//!
//! The proxy here sends a service-account token bound to a Secret, and the Secret is deleted:
//! kube-apiserver then refuses the token just as it refuses a deleted pod's. The user's
//! credential is fine all along, so the user must not be told to log in (kube-apiserver's 401,
//! which kubectl shows as "You must be logged in to the server"): every path of the proxy
//! (HTTP/1.1 and HTTP/2 requests, a watch on the stream path, an upgrade) answers 503 with
//! `Retry-After`, kubectl retries, and it succeeds as soon as the proxy's token is good again.
//! The proxy's log names the cause and never the token.

use std::{path::Path, time::Duration};

use anyhow::{ensure, Context as _};
use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt as _, Full};
use selkie_e2e::{proxy::Proxy, Cluster};

use crate::{
    eventually,
    proxy_kubectl::{proxy_client, ProxyClient},
    proxy_operations::{metrics, value},
};

/// A token of the service account `proxy` of `namespace` bound to a new Secret `secret` (it is
/// valid until the Secret is deleted).
async fn token_bound_to(cluster: &Cluster, namespace: &str, secret: &str) -> anyhow::Result<String> {
    let kubectl = cluster.kubectl();
    kubectl
        .run(&["create", "secret", "generic", secret, "-n", namespace])
        .await?;
    let token = kubectl
        .run(&[
            "create",
            "token",
            "proxy",
            "-n",
            namespace,
            "--bound-object-kind=Secret",
            &format!("--bound-object-name={secret}"),
            "--duration=1h",
        ])
        .await?;
    Ok(token.trim().to_string())
}

/// Replaces the token file's content at once (a rename, as the kubelet updates projected
/// tokens), so the proxy never reads half a token.
fn write_token(path: &Path, token: &str) -> anyhow::Result<()> {
    let staged = path.with_extension("new");
    std::fs::write(&staged, token)?;
    std::fs::rename(&staged, path)?;
    Ok(())
}

/// The proxy's answer to `request`: status, `Retry-After`, body.
async fn answer(
    client: &ProxyClient,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<(u16, String, String)> {
    let response = tokio::time::timeout(Duration::from_secs(15), client.request(request))
        .await
        .context("no answer within 15s")??;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap_or("(not text)").to_string())
        .unwrap_or_default();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, retry_after, String::from_utf8_lossy(&body).into_owned()))
}

/// Checks that `answered` is the 503 of refused proxy credentials: `Retry-After: 1` and a
/// `metav1.Status` that says what happened.
fn assert_refused_credentials(
    what: &str,
    (status, retry_after, body): &(u16, String, String),
) -> anyhow::Result<()> {
    ensure!(*status == 503, "{what}: answered {status}: {body}");
    ensure!(retry_after == "1", "{what}: Retry-After {retry_after:?}");
    let body: serde_json::Value = serde_json::from_str(body).with_context(|| format!("{what}: {body}"))?;
    ensure!(
        body["kind"] == "Status"
            && body["code"] == 503
            && body["reason"] == "ServiceUnavailable"
            && body["message"] == "the Kubernetes API server refused the impersonation proxy's credentials",
        "{what}: {body}"
    );
    Ok(())
}

#[tokio::test]
async fn faults_the_proxys_own_token_refused_is_a_503_that_kubectl_retries_until_the_token_is_good_again(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-credentials").await?;
    let kubectl = cluster.kubectl();
    kubectl
        .run(&["create", "serviceaccount", "proxy", "-n", &namespace])
        .await?;
    // The role the harness's proxy has (it applies it when it starts).
    let binding = format!("selkie-proxy-{namespace}");
    kubectl
        .run(&[
            "create",
            "clusterrolebinding",
            &binding,
            "--clusterrole=selkie-impersonation-proxy",
            &format!("--serviceaccount={namespace}:proxy"),
        ])
        .await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    let first = token_bound_to(cluster, &namespace, "first").await?;
    write_token(&token_file, &first)?;
    let proxy = Proxy::start_configured(cluster, &[], |config| {
        if let Some(upstream) = config["upstream"].as_object_mut() {
            upstream.remove("clientCertificate");
            upstream.insert("tokenFile".into(), serde_json::json!(token_file));
        }
    })
    .await?;
    let user = format!("user-{namespace}");
    let credential = proxy.signer().issue_client(&user, &[])?;
    let kubeconfig = proxy.kubeconfig_with_cert("user", &credential)?;
    let user_kubectl = proxy.kubectl(&kubeconfig);
    let whoami = ["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"];
    // The binding reaches kube-apiserver's authorizer shortly.
    eventually(Duration::from_secs(30), || async {
        let name = user_kubectl.run(&whoami).await?;
        ensure!(name.trim() == user, "kube-apiserver saw {name:?}");
        Ok(())
    })
    .await?;

    kubectl
        .run(&["delete", "secret", "first", "-n", &namespace])
        .await?;
    let url = |path: &str| format!("{}{path}", proxy.url());
    let get = |path: &str| Request::get(url(path)).body(Full::new(Bytes::new()));
    let http1 = proxy_client(&proxy, Some(&credential), false)?;
    let http2 = proxy_client(&proxy, Some(&credential), true)?;
    // kube-apiserver refuses the token from the deletion on (allow for its caches).
    eventually(Duration::from_secs(30), || async {
        assert_refused_credentials("HTTP/1.1 GET", &answer(&http1, get("/api")?).await?)
    })
    .await?;
    assert_refused_credentials("HTTP/2 GET", &answer(&http2, get("/api")?).await?)?;
    let watch = format!("/api/v1/namespaces/{namespace}/configmaps?watch=true");
    assert_refused_credentials("HTTP/2 watch", &answer(&http2, get(&watch)?).await?)?;
    let upgrade = Request::builder()
        .method(Method::GET)
        .uri(url(&format!(
            "/api/v1/namespaces/{namespace}/pods/none/exec?command=true&stdout=true"
        )))
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
        .header(header::SEC_WEBSOCKET_PROTOCOL, "v5.channel.k8s.io")
        .body(Full::new(Bytes::new()))?;
    assert_refused_credentials("upgrade", &answer(&http1, upgrade).await?)?;

    // kubectl gets the 503, waits the second it says and asks again, and again…
    let refused = |text: &str| value(text, "selkie_proxy_requests_total", &[("code", "503")]);
    let before = refused(&metrics(&proxy).await?)?;
    let retrying = {
        let user_kubectl = user_kubectl.clone();
        tokio::spawn(async move { user_kubectl.output(&whoami, None).await })
    };
    eventually(Duration::from_secs(20), || async {
        let now = refused(&metrics(&proxy).await?)?;
        ensure!(now >= before + 2.0, "kubectl was refused {} times", now - before);
        Ok(())
    })
    .await?;
    // … until the proxy's token is good again: then it succeeds, without the user doing anything.
    let second = token_bound_to(cluster, &namespace, "second").await?;
    write_token(&token_file, &second)?;
    let output = tokio::time::timeout(Duration::from_secs(30), retrying)
        .await
        .context("kubectl did not end within 30s")???;
    ensure!(
        output.success && output.stdout.trim() == user,
        "kubectl through the proxy once its token was good again: {output:?}"
    );

    let log = proxy.log();
    ensure!(
        log.contains("ProxyCredentialsRefused"),
        "the proxy's log does not name the cause:\n{log}"
    );
    for token in [&first, &second] {
        ensure!(
            !log.contains(token.as_str()),
            "the proxy logged its token:\n{log}"
        );
    }
    kubectl.run(&["delete", "clusterrolebinding", &binding]).await?;
    Ok(())
}
