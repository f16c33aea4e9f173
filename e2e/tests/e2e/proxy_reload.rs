//! The proxy's configuration and serving certificate change while it runs: valid changes are
//! picked up without a restart, invalid ones are refused and the running configuration stays,
//! and requests in flight during a swap never fail.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use selkie_e2e::{proxy::Proxy, Cluster};

use crate::{
    eventually,
    proxy_kubectl::{client_trusting, proxy_client, review_with},
};

#[tokio::test]
async fn configuration_changes_apply_without_a_restart_and_invalid_ones_are_ignored() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let mut proxy = Proxy::start(cluster, &[]).await?;
    let dave = proxy.signer().issue_client("dave", &[])?;
    let client = proxy_client(&proxy, Some(&dave), true)?;
    let url = proxy.url().to_string();
    assert_eq!(review_with(&client, &url, &[]).await?.0, 201);

    // Stop trusting the signer: dave's certificate no longer identifies anyone.
    let original = proxy.config().clone();
    let mut untrusting = original.clone();
    untrusting["clientCertificateCaFiles"] = serde_json::json!([]);
    proxy.write_config(untrusting)?;
    eventually(Duration::from_secs(10), || async {
        let fresh = proxy_client(&proxy, Some(&dave), true)?;
        let (status, _) = review_with(&fresh, &url, &[]).await?;
        anyhow::ensure!(status == 401, "still {status}");
        Ok(())
    })
    .await?;

    // Trust it again, then write something invalid: the last good configuration stays.
    proxy.write_config(original.clone())?;
    eventually(Duration::from_secs(10), || async {
        let fresh = proxy_client(&proxy, Some(&dave), true)?;
        anyhow::ensure!(
            review_with(&fresh, &url, &[]).await?.0 == 201,
            "not trusted again yet"
        );
        Ok(())
    })
    .await?;
    let mut broken = original.clone();
    broken["upstream"]["url"] = serde_json::json!("http://plaintext.invalid");
    proxy.write_config(broken)?;
    eventually(Duration::from_secs(10), || async {
        anyhow::ensure!(
            proxy.log().contains("the changed configuration is invalid"),
            "the proxy has not reported the invalid configuration yet"
        );
        Ok(())
    })
    .await?;
    let fresh = proxy_client(&proxy, Some(&dave), true)?;
    assert_eq!(
        review_with(&fresh, &url, &[]).await?.0,
        201,
        "the good configuration stays"
    );
    proxy.check_running()?;
    Ok(())
}

#[tokio::test]
async fn the_serving_certificate_rotates_without_a_restart() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let mut proxy = Proxy::start(cluster, &[]).await?;
    let erin = proxy.signer().issue_client("erin", &[])?;
    let url = proxy.url().to_string();
    let before = proxy_client(&proxy, Some(&erin), true)?;
    assert_eq!(review_with(&before, &url, &[]).await?.0, 201);

    let old_ca = proxy.serving_ca().cert_pem();
    proxy.rotate_serving_certificate()?;
    // New connections trusting only the new CA succeed once the proxy has picked it up ...
    eventually(Duration::from_secs(10), || async {
        let after = proxy_client(&proxy, Some(&erin), true)?;
        anyhow::ensure!(review_with(&after, &url, &[]).await?.0 == 201, "not rotated yet");
        Ok(())
    })
    .await?;
    // ... and new connections trusting only the old CA fail the handshake.
    let stale = client_trusting(&old_ca, Some(&erin), true)?;
    assert!(
        review_with(&stale, &url, &[]).await.is_err(),
        "a client trusting only the old CA must not complete a handshake"
    );
    proxy.check_running()?;
    Ok(())
}

#[tokio::test]
async fn requests_during_configuration_swaps_never_fail() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let mut proxy = Proxy::start(cluster, &[]).await?;
    let frank = proxy.signer().issue_client("frank", &[])?;
    let url = proxy.url().to_string();
    let done = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut workers = Vec::new();
    for http2 in [true, true, false, false] {
        let client = proxy_client(&proxy, Some(&frank), http2)?;
        let (url, done, ok, failed) = (url.clone(), done.clone(), ok.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                match review_with(&client, &url, &[]).await {
                    Ok((201, review)) if review["status"]["userInfo"]["username"] == "frank" => {
                        ok.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    // Swap the configuration repeatedly: each rewrite adds or removes a JWT authenticator, which
    // builds a whole new snapshot.
    let original = proxy.config().clone();
    for round in 0..10 {
        let mut next = original.clone();
        if round % 2 == 0 {
            next["jwtAuthenticators"] = serde_json::json!([{
                "name": format!("idp-{round}"), "issuer": "https://idp.example.com", "audience": "x",
            }]);
        }
        proxy.write_config(next)?;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    done.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await?;
    }
    let reloads = proxy.log().matches("configuration reloaded").count();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(reloads >= 5, "the proxy reloaded only {reloads} times");
    assert!(ok >= 200, "only {ok} requests completed");
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed during swaps",
        ok + failed
    );
    Ok(())
}
