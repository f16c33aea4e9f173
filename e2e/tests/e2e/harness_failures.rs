//! When something is wrong the harness fails fast with one message naming the component, its
//! command and the tail of its log; it never hangs and never skips.

use std::{process::Command, time::Duration};

use selkie_e2e::{components::BUILD_SCRIPT, Cluster, HarnessError};

#[tokio::test]
async fn a_taken_apiserver_port_fails_with_the_component_command_and_log() -> anyhow::Result<()> {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = squatter.local_addr()?.port();
    let error = Cluster::builder()
        .apiserver_port(port)
        .start()
        .await
        .expect_err("the apiserver cannot serve on a port that is taken");
    let message = error.to_string();
    assert!(matches!(error, HarnessError::Component { ref component, .. } if component == "kube-apiserver"));
    assert!(
        message.contains(&format!("--secure-port={port}")),
        "the command line is missing:\n{message}"
    );
    assert!(
        message.contains("address already in use"),
        "the log tail is missing:\n{message}"
    );
    drop(squatter);
    Ok(())
}

#[tokio::test]
async fn an_apiserver_that_never_becomes_ready_fails_after_its_timeout() -> anyhow::Result<()> {
    // Port 1 on loopback has no etcd: the apiserver can never become ready.
    let error = Cluster::builder()
        .apiserver_arg("--etcd-servers=http://127.0.0.1:1")
        .apiserver_ready_timeout(Duration::from_secs(10))
        .start()
        .await
        .expect_err("an apiserver without etcd must not be reported ready");
    let message = error.to_string();
    assert!(matches!(error, HarnessError::Component { ref component, .. } if component == "kube-apiserver"));
    assert!(
        message.contains("did not become ready within 10s") || message.contains("exited during start-up"),
        "{message}"
    );
    assert!(message.contains("--etcd-servers=http://127.0.0.1:1"), "{message}");
    Ok(())
}

#[test]
fn a_component_that_cannot_be_built_is_named_with_the_go_error() -> anyhow::Result<()> {
    let cache = tempfile::tempdir()?;
    let out = Command::new("bash")
        .arg(BUILD_SCRIPT)
        .arg("kubernetes")
        .env("SELKIE_CACHE_DIR", cache.path())
        .env("SELKIE_K8S_VERSION", "0.0.99")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a version that does not exist must fail the build"
    );
    assert!(stderr.contains("building kubernetes failed"), "{stderr}");
    assert!(
        stderr.contains("k8s.io/kubernetes@v0.0.99"),
        "the go error is missing:\n{stderr}"
    );
    Ok(())
}

#[test]
fn a_second_component_build_is_served_from_the_cache() -> anyhow::Result<()> {
    selkie_e2e::components::Components::get()?;
    let out = Command::new("bash").arg(BUILD_SCRIPT).arg("all").output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for component in ["etcd", "kubernetes", "dex"] {
        let cached = stderr
            .lines()
            .any(|line| line.contains(&format!("] {component} ")) && line.contains(": cached in "));
        assert!(cached, "{component} should come from the cache:\n{stderr}");
    }
    assert!(
        !stderr.contains("building in"),
        "nothing may be rebuilt:\n{stderr}"
    );
    Ok(())
}
