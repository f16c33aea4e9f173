//! A client certificate counts only while it is valid under the CA pools of the configuration a
//! request runs with — on every request, also on a connection opened while it was valid — as
//! kube-apiserver checks. An expired certificate, or one whose CA was removed, gets 401 on the
//! connection it already holds and that connection is closed, HTTP/1.1 and HTTP/2 alike (a watch
//! on it included). Each request here runs on one connection made by hand, so nothing can hide
//! behind a client that quietly reconnects.

use std::time::{Duration, SystemTime};

use anyhow::{ensure, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use selkie_e2e::{
    pki::{CertAndKey, CertificateAuthority},
    proxy::Proxy,
    Cluster,
};
use serde_json::json;
use tokio::{task::JoinHandle, time::Instant};

use crate::{
    proxy_bad_input::{assert_status, tls_connect},
    proxy_kubectl::grant_configmaps,
};

/// How long any single request may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// One TLS connection to the proxy; every request goes over it and nothing reconnects.
struct OneConnection {
    sender: Sender,
    /// Completes when the connection ends.
    closed: JoinHandle<()>,
}

enum Sender {
    Http1(http1::SendRequest<Empty<Bytes>>),
    Http2(http2::SendRequest<Empty<Bytes>>),
}

impl OneConnection {
    async fn open(proxy: &Proxy, credential: &CertAndKey, use_http2: bool) -> anyhow::Result<Self> {
        let alpn: &[u8] = if use_http2 { b"h2" } else { b"http/1.1" };
        let io = TokioIo::new(tls_connect(proxy, Some(credential), alpn).await?);
        Ok(if use_http2 {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), io).await?;
            Self {
                sender: Sender::Http2(sender),
                closed: tokio::spawn(async move {
                    let _ended = connection.await;
                }),
            }
        } else {
            let (sender, connection) = http1::handshake(io).await?;
            Self {
                sender: Sender::Http1(sender),
                closed: tokio::spawn(async move {
                    let _ended = connection.await;
                }),
            }
        })
    }

    /// Sends `GET path` on this connection; returns the response with its body unread.
    async fn send(&mut self, path: &str) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
        let request = http::Request::get(format!("https://127.0.0.1{path}")).body(Empty::new())?;
        let response = async {
            match &mut self.sender {
                Sender::Http1(sender) => {
                    sender.ready().await?;
                    sender.send_request(request).await
                }
                Sender::Http2(sender) => {
                    sender.ready().await?;
                    sender.send_request(request).await
                }
            }
        };
        Ok(tokio::time::timeout(REQUEST_LIMIT, response)
            .await
            .context("no response within the limit")??)
    }

    /// `GET path`, its status and whole body.
    async fn get(&mut self, path: &str) -> anyhow::Result<(u16, Bytes)> {
        let response = self.send(path).await?;
        let status = response.status().as_u16();
        let body = tokio::time::timeout(REQUEST_LIMIT, response.into_body().collect())
            .await
            .context("the body did not end within the limit")??;
        Ok((status, body.to_bytes()))
    }

    /// Asks `GET /api` every 200 ms until the answer is not 200; fails if it stays 200 past
    /// `deadline`. Returns that answer and when it came.
    async fn until_refused(&mut self, deadline: Instant) -> anyhow::Result<((u16, Bytes), SystemTime)> {
        loop {
            let answer = self.get("/api").await?;
            if answer.0 != 200 {
                return Ok((answer, SystemTime::now()));
            }
            ensure!(
                Instant::now() < deadline,
                "the certificate still counts on the open connection"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the proxy has closed the connection.
    async fn closes_within(self, limit: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(limit, self.closed)
            .await
            .context("the proxy did not close the connection")??;
        Ok(())
    }
}

#[tokio::test]
async fn an_expired_certificate_stops_counting_on_the_connection_it_holds() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-cert-expiry").await?;
    let user = format!("shortlived-{namespace}");
    grant_configmaps(cluster, &namespace, "User", &user).await?;
    let proxy = Proxy::start(cluster, &[]).await?;

    for use_http2 in [false, true] {
        // Valid for a few more seconds, as a TokenCredentialRequest certificate near its end.
        let now = SystemTime::now();
        let not_after = now + Duration::from_secs(5);
        let credential = proxy.signer().issue_client_with_validity(
            &user,
            &[],
            now - Duration::from_secs(60),
            not_after,
        )?;
        let mut connection = OneConnection::open(&proxy, &credential, use_http2).await?;
        let (status, body) = connection.get("/api").await?;
        ensure!(status == 200, "HTTP/2: {use_http2}: {status} {body:?}");

        // A watch keeps an HTTP/2 connection busy; it must not keep the certificate alive.
        let watch = if use_http2 {
            let response = connection
                .send(&format!("/api/v1/namespaces/{namespace}/configmaps?watch=1"))
                .await?;
            ensure!(response.status() == 200, "the watch: {}", response.status());
            Some(tokio::spawn(async move {
                let _ended = response.into_body().collect().await;
            }))
        } else {
            None
        };

        let deadline = Instant::now() + Duration::from_secs(15);
        let ((status, body), refused_at) = connection
            .until_refused(deadline)
            .await
            .with_context(|| format!("HTTP/2: {use_http2}"))?;
        ensure!(status == 401, "HTTP/2: {use_http2}: {status} {body:?}");
        assert_status(&body, 401, "Unauthorized")?;
        // notAfter has whole seconds; the certificate counts through that second, not longer.
        let not_after_second = not_after.duration_since(SystemTime::UNIX_EPOCH)?.as_secs();
        let refused_second = refused_at.duration_since(SystemTime::UNIX_EPOCH)?.as_secs();
        ensure!(
            refused_second > not_after_second && refused_second <= not_after_second + 2,
            "HTTP/2: {use_http2}: refused at {refused_second}, notAfter {not_after_second}"
        );
        connection
            .closes_within(Duration::from_secs(5))
            .await
            .with_context(|| format!("HTTP/2: {use_http2}"))?;
        if let Some(watch) = watch {
            tokio::time::timeout(Duration::from_secs(5), watch)
                .await
                .context("the watch outlived its connection")??;
        }
    }
    Ok(())
}

#[tokio::test]
async fn removing_a_ca_ends_the_sessions_it_signed_and_no_others() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let mut proxy = Proxy::start(cluster, &[]).await?;
    // A second CA the proxy trusts beside its signer, then stops trusting.
    let compromised = CertificateAuthority::new("selkie-test-compromised-ca")?;
    let dir = tempfile::tempdir()?;
    let compromised_file = dir.path().join("compromised-ca.crt");
    std::fs::write(&compromised_file, compromised.cert_pem())?;
    let original = proxy.config().clone();
    let mut trusting_both = original.clone();
    trusting_both["clientCertificateCaFiles"]
        .as_array_mut()
        .context("clientCertificateCaFiles is a list")?
        .push(json!(compromised_file));
    proxy.write_config(trusting_both)?;

    let mallory = compromised.issue_client("mallory", &[])?;
    let alice = proxy.signer().issue_client("alice", &[])?;
    // Opened only once the second CA is trusted (the configuration reloads in the background).
    let (mallory_h1, mallory_h2) = crate::eventually(Duration::from_secs(10), || async {
        let mut h1 = OneConnection::open(&proxy, &mallory, false).await?;
        let mut h2 = OneConnection::open(&proxy, &mallory, true).await?;
        ensure!(h1.get("/api").await?.0 == 200, "not trusted yet");
        ensure!(h2.get("/api").await?.0 == 200, "not trusted yet");
        Ok((h1, h2))
    })
    .await?;
    let mut alice_h2 = OneConnection::open(&proxy, &alice, true).await?;
    ensure!(alice_h2.get("/api").await?.0 == 200);

    // The compromised CA goes; its sessions end on the connections they hold.
    proxy.write_config(original)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    for (name, mut connection) in [("HTTP/1.1", mallory_h1), ("HTTP/2", mallory_h2)] {
        let ((status, body), _) = connection.until_refused(deadline).await.context(name)?;
        ensure!(status == 401, "{name}: {status} {body:?}");
        assert_status(&body, 401, "Unauthorized")?;
        connection
            .closes_within(Duration::from_secs(5))
            .await
            .context(name)?;
    }
    // The certificates of the CA that stays are untouched, on their open connection too.
    let (status, body) = alice_h2.get("/api").await?;
    ensure!(status == 200, "alice after the reload: {status} {body:?}");
    ensure!(!alice_h2.closed.is_finished(), "alice's connection stays open");
    Ok(())
}
