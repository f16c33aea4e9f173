//! The Concierge as an admin runs it: `helm install` of `conf/helm/selkie` (Concierge only) with
//! the images built here, on the real node, and then everything a user and an admin do with it, in
//! order, on one release:
//!
//! 1. two pods Ready through their real probes, running as 65532 on a read-only root filesystem
//!    with the chart's service account (no other credential);
//! 2. the impersonation proxy behind its `LoadBalancer` Service, fronted by a real load balancer on
//!    the host (haproxy → the Service's node port), the CredentialIssuer's `externalEndpoint`
//!    pointing at it: `selkie get kubeconfig` and kubectl through it as a user logged in with the
//!    CLI (a Dex ID token, `login static` as the exec plugin);
//! 3. the same proxy from inside the cluster, through the Service's ClusterIP, from a pod;
//! 4. the kube cert agent for real: its pod next to the kube-controller-manager static pod, the
//!    Concierge's exec into it through kube-apiserver and the kubelet, and the
//!    `KubeClusterSigningCertificate` strategy's certificate used by kubectl against
//!    kube-apiserver directly;
//! 5. exec, attach, port-forward and logs through the proxy to a real pod, with kubectl, over
//!    WebSocket and over SPDY;
//! 6. `helm upgrade` to another image tag and configuration under load (kubectl calls and a held
//!    watch through the proxy): every call that should succeed succeeds, every write is seen;
//! 7. a pod killed (`kubectl delete pod --force`) under the same load: the other replica serves,
//!    a new pod becomes Ready, nothing is lost;
//! 8. `helm uninstall`: nothing of the release is left.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::{ensure, Context as _};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    runtime::{watcher, WatchStreamExt as _},
    Api,
};
use selkie_e2e::{
    dex::{Dex, DexUser, CLIENT_ID},
    eventually,
    helm::{chart_dir, Helm},
    images::{selkie_images_tagged, SelkieImages},
    load_balancer::LoadBalancer,
};
use serde_json::{json, Value};

use crate::node::{
    app_pods, is_ready, kubectl_as, kubectl_ok, kubectl_pod, namespace, node_env, run_pod, workload_pod,
    NodeEnv, Release, RELEASE_NAMESPACE,
};

const RELEASE: &str = "selkie-node-concierge";
/// The chart's defaults: Pinniped's names.
const NAMESPACE: &str = "pinniped-concierge";
const PREFIX: &str = "pinniped-concierge";
const CREDENTIAL_ISSUER: &str = "pinniped-concierge-config";
/// Resources by their full name: the faults test below installs the CRDs for another API group
/// suffix on the same cluster, which makes kubectl's short names ambiguous.
const CREDENTIAL_ISSUERS: &str = "credentialissuers.config.concierge.pinniped.dev";
const LB_SERVICE: &str = "pinniped-concierge-impersonation-proxy-load-balancer";
const AUTHENTICATOR: &str = "node-dex";

/// The release's values: the images built here, the proxy behind a LoadBalancer Service whose
/// external endpoint is the host's load balancer, the signing key from the kube cert agent.
fn values(images: &SelkieImages, endpoint: SocketAddr, extra_label: &str) -> Value {
    let image = &images.concierge;
    json!({
        "supervisor": {"enabled": false},
        "concierge": {
            "image": {"repository": image.repository(), "tag": image.tag(), "pullPolicy": "IfNotPresent"},
            "podLabels": {"selkie-e2e-revision": extra_label},
            "credentialIssuer": {"impersonationProxy": {
                "mode": "enabled",
                "service": {"type": "LoadBalancer"},
                "externalEndpoint": endpoint.to_string(),
            }},
            "controlPlane": {"clusterSigningKey": {"agent": {"image": image.reference}}},
        },
    })
}

/// The host's view of the processes running `binary` in a container: (pid, uid, root mounted
/// read-only).
pub(crate) fn container_processes(binary: &str) -> Vec<(u32, u32, bool)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let first = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if first != binary.as_bytes() || !cgroup.contains("kubepods") {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse().ok())
            .unwrap_or(u32::MAX);
        let mountinfo = std::fs::read_to_string(entry.path().join("mountinfo")).unwrap_or_default();
        let root_read_only = mountinfo.lines().any(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            fields.get(4) == Some(&"/") && fields.get(5).is_some_and(|o| o.split(',').any(|f| f == "ro"))
        });
        found.push((pid, uid, root_read_only));
    }
    found
}

/// Load through the proxy while something happens to the release: a kubectl call after another
/// (each a new connection through the load balancer), a watch (kube-rs' watcher, which resumes
/// as informers do) and an admin writing a ConfigMap every 300 ms that the watch must see.
struct Load {
    stop: Arc<AtomicBool>,
    calls: tokio::task::JoinHandle<(usize, Vec<String>)>,
    writes: tokio::task::JoinHandle<anyhow::Result<Vec<String>>>,
    seen: Arc<Mutex<BTreeSet<String>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Load {
    async fn start(
        env: &'static NodeEnv,
        kubeconfig: &Path,
        namespace: &str,
        phase: &str,
    ) -> anyhow::Result<Load> {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let client = selkie_e2e::cluster::client_from_kubeconfig(kubeconfig).await?;
        let configmaps: Api<ConfigMap> = Api::namespaced(client, namespace);
        let watch = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut events = watcher(configmaps, watcher::Config::default())
                    .applied_objects()
                    .boxed();
                while let Some(event) = events.next().await {
                    if let Ok(object) = event {
                        if let Some(name) = object.metadata.name {
                            seen.lock().unwrap_or_else(|e| e.into_inner()).insert(name);
                        }
                    }
                }
            })
        };
        let calls = {
            let (stop, kubeconfig, namespace) =
                (stop.clone(), kubeconfig.to_path_buf(), namespace.to_string());
            tokio::spawn(async move {
                let (mut ok, mut failures) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match kubectl_as(
                        env,
                        &kubeconfig,
                        &["get", "configmaps", "-n", &namespace, "-o", "name"],
                        &[],
                    )
                    .await
                    {
                        Ok(output) if output.status.success() => ok += 1,
                        Ok(output) => {
                            failures.push(String::from_utf8_lossy(&output.stderr).trim().to_string())
                        }
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                (ok, failures)
            })
        };
        let writes = {
            let (stop, namespace, phase) = (stop.clone(), namespace.to_string(), phase.to_string());
            let kubectl = env.cluster.kubectl();
            tokio::spawn(async move {
                let mut written = Vec::new();
                let counter = AtomicUsize::new(0);
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("{phase}-{}", counter.fetch_add(1, Ordering::Relaxed));
                    kubectl
                        .run(&["create", "configmap", &name, "-n", &namespace])
                        .await?;
                    written.push(name);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Ok(written)
            })
        };
        Ok(Load {
            stop,
            calls,
            writes,
            seen,
            watch,
        })
    }

    /// Stops the load; fails unless every call succeeded and the watch saw every write. Returns
    /// the number of calls made, for the test's output.
    async fn finish(self, what: &str) -> anyhow::Result<usize> {
        self.stop.store(true, Ordering::Relaxed);
        let (ok, failures) = self.calls.await?;
        let written = self.writes.await??;
        let seen = self.seen.clone();
        let missing = eventually(Duration::from_secs(60), || {
            let seen = seen.clone();
            let written = written.clone();
            async move {
                let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let missing: Vec<&String> = written.iter().filter(|name| !seen.contains(*name)).collect();
                ensure!(
                    missing.is_empty(),
                    "the watch through the proxy never saw {missing:?}"
                );
                Ok(())
            }
        })
        .await;
        self.watch.abort();
        println!(
            "{what}: {ok} kubectl calls through the proxy succeeded, {} failed; {} writes, all seen by the watch: {}",
            failures.len(),
            written.len(),
            missing.is_ok()
        );
        ensure!(
            failures.is_empty(),
            "{what}: {} kubectl calls failed: {failures:?}",
            failures.len()
        );
        missing?;
        ensure!(ok > 0 && !written.is_empty(), "{what}: no load ran");
        Ok(ok)
    }
}

/// `selkie get kubeconfig` for the user with `token`, in `mode`; returns its path.
async fn user_kubeconfig(env: &NodeEnv, dir: &Path, token: &str, mode: &str) -> anyhow::Result<PathBuf> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let output = tokio::process::Command::new(selkie)
        .args([
            "get".to_string(),
            "kubeconfig".into(),
            format!("--kubeconfig={}", env.cluster.admin_kubeconfig().display()),
            format!("--static-token={token}"),
            format!("--concierge-mode={mode}"),
            format!(
                "--credential-cache={}",
                dir.join(format!("credentials-{mode}.yaml")).display()
            ),
            "--timeout=60s".into(),
        ])
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "selkie get kubeconfig --concierge-mode={mode} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let path = dir.join(format!("{mode}.kubeconfig"));
    std::fs::write(&path, &output.stdout)?;
    Ok(path)
}

/// `times` logins: each drops the exec plugin's cached certificate, so its kubectl call makes the
/// CLI ask the proxy for a new one (a TokenCredentialRequest, spread over the replicas).
async fn fresh_logins(env: &NodeEnv, dir: &Path, kubeconfig: &Path, times: usize) -> anyhow::Result<()> {
    for _ in 0..times {
        let _ = std::fs::remove_file(dir.join("credentials-ImpersonationProxy.yaml"));
        kubectl_ok(env, kubeconfig, &["auth", "whoami"], &[]).await?;
    }
    Ok(())
}

/// The cluster URL a kubeconfig names.
fn kubeconfig_server(path: &Path) -> anyhow::Result<String> {
    let kubeconfig: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
    Ok(kubeconfig["clusters"][0]["cluster"]["server"]
        .as_str()
        .context("no server in the kubeconfig")?
        .to_string())
}

async fn whoami(env: &NodeEnv, kubeconfig: &Path) -> anyhow::Result<Value> {
    let out = kubectl_ok(env, kubeconfig, &["auth", "whoami", "-o", "json"], &[]).await?;
    Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
}

/// The status of the CredentialIssuer's strategy `kind`, once it is `Success` (within 120 s).
async fn successful_strategy(env: &NodeEnv, kind: &str) -> anyhow::Result<Value> {
    let kubectl = env.cluster.kubectl();
    eventually(Duration::from_secs(120), || async {
        let issuer: Value = serde_json::from_str(
            &kubectl
                .run(&["get", CREDENTIAL_ISSUERS, CREDENTIAL_ISSUER, "-o", "json"])
                .await?,
        )?;
        let strategy = issuer["status"]["strategies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["type"] == kind)
            .cloned()
            .unwrap_or(Value::Null);
        ensure!(strategy["status"] == "Success", "strategy {kind}: {strategy}");
        Ok(strategy)
    })
    .await
}

#[tokio::test]
async fn node_concierge_installed_with_helm_serves_users_survives_upgrades_and_uninstalls_cleanly(
) -> anyhow::Result<()> {
    let _release = crate::node::one_release_at_a_time().await;
    let env = node_env().await?;
    let release = Release::new(env, RELEASE, NAMESPACE, PREFIX)?;
    let outcome = concierge_story(env, &release).await;
    release.explain(env, outcome).await
}

async fn concierge_story(env: &'static NodeEnv, release: &Release) -> anyhow::Result<()> {
    let kubectl = env.cluster.kubectl();
    let endpoint = SocketAddr::new(env.host_ip, selkie_e2e::free_port()?);

    // 1. helm install; the pods become Ready through their probes.
    release
        .apply("install", &values(env.images, endpoint, "1"))
        .await?;
    let pods = release.pods(env).await?;
    ensure!(pods.len() == 2 && pods.iter().all(is_ready), "pods: {pods:#?}");
    for pod in &pods {
        let spec = &pod["spec"];
        ensure!(spec["serviceAccountName"] == PREFIX, "{spec}");
        ensure!(spec["nodeName"] == selkie_e2e::node::NODE_NAME, "{spec}");
        ensure!(
            spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] == true,
            "{spec}"
        );
        // Its only credential is the projected service-account token.
        let volumes = spec["volumes"].to_string();
        ensure!(
            !volumes.contains("kubeconfig") && !volumes.contains("admin"),
            "{volumes}"
        );
    }
    // kube-apiserver's aggregation layer reaches both APIs: the leader published the serving
    // CA in the APIServices, and the replicas serve with its certificate.
    for api in ["login", "identity"] {
        kubectl
            .run(&[
                "wait",
                "--for=condition=Available",
                "--timeout=120s",
                &format!("apiservice/v1alpha1.{api}.concierge.pinniped.dev"),
            ])
            .await?;
    }
    let processes = container_processes("/usr/local/bin/selkie-concierge");
    ensure!(
        processes.len() >= 2 && processes.iter().all(|(_, uid, ro)| *uid == 65532 && *ro),
        "the Concierge's processes (pid, uid, read-only root) as the host sees them: {processes:?}"
    );

    // 2. The load balancer in front of the Service's node port; a user through it.
    let _load_balancer = LoadBalancer::for_service(env.cluster, NAMESPACE, LB_SERVICE, endpoint).await?;
    successful_strategy(env, "ImpersonationProxy").await?;

    let dex = Dex::start_on(env.host_ip, &[DexUser::pinny()], &[]).await?;
    let workloads = namespace(env, "node-concierge-user").await?;
    kubectl
        .run(&[
            "create",
            "rolebinding",
            "ops-edit",
            "-n",
            &workloads,
            "--clusterrole=edit",
            "--group=ops",
        ])
        .await?;
    let authenticator = json!({
        "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
        "kind": "JWTAuthenticator",
        "metadata": {"name": AUTHENTICATOR},
        "spec": {"issuer": dex.issuer(), "audience": CLIENT_ID,
                 "claims": {"username": "email", "groups": "groups"},
                 "tls": {"certificateAuthorityData": base64::Engine::encode(
                     &base64::engine::general_purpose::STANDARD, dex.ca_pem())}},
    });
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&authenticator.to_string()))
        .await?;
    kubectl
        .run(&[
            "wait",
            "--for=jsonpath={.status.phase}=Ready",
            "--timeout=60s",
            &format!("jwtauthenticators.authentication.concierge.pinniped.dev/{AUTHENTICATOR}"),
        ])
        .await?;
    let token = dex
        .password_grant("pinny@example.com", "password123")
        .await?
        .id_token;
    let dir = tempfile::Builder::new()
        .prefix("selkie-node-concierge-")
        .tempdir()?;
    let through_proxy = user_kubeconfig(env, dir.path(), &token, "ImpersonationProxy").await?;
    ensure!(
        kubeconfig_server(&through_proxy)? == format!("https://{endpoint}"),
        "the kubeconfig does not name the load balancer"
    );
    let user = whoami(env, &through_proxy).await?;
    ensure!(user["username"] == "pinny@example.com", "{user}");
    kubectl_ok(env, &through_proxy, &["get", "configmaps", "-n", &workloads], &[]).await?;

    // 3. From a pod, through the Service's ClusterIP, with the certificate the exec plugin got
    // (from its credential cache); the proxy's serving certificate names the external endpoint.
    let cluster_ip = kubectl
        .run(&[
            "get",
            "service",
            LB_SERVICE,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .await?;
    let proxy_ca = serde_json::from_str::<Value>(
        &kubectl
            .run(&["get", CREDENTIAL_ISSUERS, CREDENTIAL_ISSUER, "-o", "json"])
            .await?,
    )?["status"]["strategies"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["type"] == "ImpersonationProxy")
        .and_then(|s| {
            s["frontend"]["impersonationProxyInfo"]["certificateAuthorityData"]
                .as_str()
                .map(str::to_string)
        })
        .context("no CA in the ImpersonationProxy strategy")?;
    let proxy_ca = String::from_utf8(base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        &proxy_ca,
    )?)?;
    let cache: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        dir.path().join("credentials-ImpersonationProxy.yaml"),
    )?)?;
    let credential = &cache["credentials"][0]["credential"];
    let files = dir.path().join("pod-credential");
    std::fs::create_dir_all(&files)?;
    for (name, value) in [
        ("ca.crt", Some(proxy_ca.as_str())),
        ("tls.crt", credential["clientCertificateData"].as_str()),
        ("tls.key", credential["clientKeyData"].as_str()),
    ] {
        std::fs::write(
            files.join(name),
            value.context("the credential cache lacks the certificate")?,
        )?;
    }
    kubectl
        .run(&[
            "create",
            "secret",
            "generic",
            "user-credential",
            "-n",
            &workloads,
            &format!("--from-file={}", files.display()),
        ])
        .await?;
    let script = format!(
        "/opt/kubectl/kubectl --server=https://{cluster_ip}:443 --tls-server-name={host} \
         --certificate-authority=/credential/ca.crt --client-certificate=/credential/tls.crt \
         --client-key=/credential/tls.key \
         auth whoami -o jsonpath='{{.status.userInfo.username}}' > /tmp/out 2>&1; cat /tmp/out; echo; \
         touch /tmp/done; sleep 3600",
        host = env.host_ip
    );
    let mut pod = kubectl_pod(env, "via-cluster-ip", &script);
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .context("mounts")?
        .push(json!({"name": "credential", "mountPath": "/credential", "readOnly": true}));
    pod["spec"]["volumes"]
        .as_array_mut()
        .context("volumes")?
        .push(json!({"name": "credential", "secret": {"secretName": "user-credential"}}));
    pod["spec"]["containers"][0]["readinessProbe"] =
        json!({"exec": {"command": ["cat", "/tmp/done"]}, "periodSeconds": 1});
    let name = run_pod(env, &workloads, pod).await?;
    let said = kubectl.run(&["logs", "-n", &workloads, &name]).await?;
    ensure!(
        said.trim() == "pinny@example.com",
        "kubectl in a pod through the ClusterIP said: {said}"
    );

    // 4. The kube cert agent for real: the strategy succeeds, its pod sits next to the
    // controller manager, and its certificate works against kube-apiserver directly.
    successful_strategy(env, "KubeClusterSigningCertificate").await?;
    let agent: Value = serde_json::from_str(
        &kubectl
            .run(&[
                "get",
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                "kube-cert-agent.pinniped.dev=v3",
                "-o",
                "json",
            ])
            .await?,
    )?;
    let agent = &agent["items"][0];
    ensure!(
        agent["spec"]["nodeName"] == selkie_e2e::node::NODE_NAME,
        "agent pod: {agent}"
    );
    ensure!(
        agent["spec"]["volumes"]
            .to_string()
            .contains("/etc/kubernetes/pki"),
        "the agent pod lacks the controller manager's volumes: {}",
        agent["spec"]["volumes"]
    );
    let direct = user_kubeconfig(env, dir.path(), &token, "TokenCredentialRequestAPI").await?;
    // kube-apiserver itself (it listens on loopback and the host's address), not the proxy.
    let named = kubeconfig_server(&direct)?;
    let port = env.cluster.apiserver_port();
    ensure!(
        [
            format!("https://127.0.0.1:{port}"),
            format!("https://{}:{port}", env.host_ip)
        ]
        .contains(&named),
        "the kubeconfig names {named}, not kube-apiserver"
    );
    // Each replica reads the key through the agent itself; one that has not yet got it when a
    // login reaches it reads it at once and waits for it (rather than signing with Selkie's own
    // CA, which kube-apiserver does not trust). So every login, on whichever replica, works from
    // the first: each below drops the cached certificate and asks again.
    for _ in 0..6 {
        let _ = std::fs::remove_file(dir.path().join("credentials-TokenCredentialRequestAPI.yaml"));
        let user = whoami(env, &direct).await?;
        ensure!(
            user["username"] == "pinny@example.com",
            "kube-apiserver saw {user}"
        );
    }

    // 5. exec, attach, port-forward and logs through the proxy to a real pod.
    exec_attach_port_forward_and_logs(env, &through_proxy, &workloads).await?;

    // 6. helm upgrade to another image tag and configuration, under load.
    let upgraded = tokio::task::spawn_blocking(|| selkie_images_tagged("node-upgrade")).await??;
    env.cluster
        .node()
        .context("node")?
        .import_image(&upgraded.concierge.archive)?;
    let load = Load::start(env, &through_proxy, &workloads, "upgrade").await?;
    let pods = release.upgrade(env, &values(&upgraded, endpoint, "2")).await?;
    load.finish("rolling upgrade").await?;
    ensure!(
        pods.len() == 2
            && pods.iter().all(|p| is_ready(p)
                && p["spec"]["containers"][0]["image"] == upgraded.concierge.reference.as_str()
                && p["metadata"]["labels"]["selkie-e2e-revision"] == "2"),
        "after the upgrade: {pods:#?}"
    );

    // 7. A pod killed under load. Right after the kill the exec plugin's cached certificate is
    // dropped, so the CLI asks for a new one (a TokenCredentialRequest) while the replacement pod
    // starts: a pod must not be Ready before it has loaded the authenticators.
    let victim = pods[0]["metadata"]["name"]
        .as_str()
        .context("pod name")?
        .to_string();
    let load = Load::start(env, &through_proxy, &workloads, "kill").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Logins while the replacement becomes Ready: some reach it.
    release
        .kill(env, &victim, || fresh_logins(env, dir.path(), &through_proxy, 6))
        .await?;
    load.finish("pod killed").await?;

    // 8. helm uninstall leaves nothing of the release: its namespace is gone too (the node's
    // controller manager finishes the deletion).
    release.uninstall(env).await?;
    let processes = container_processes("/usr/local/bin/selkie-concierge");
    ensure!(
        processes.is_empty(),
        "Concierge processes still run: {processes:?}"
    );
    Ok(())
}

/// exec (stdout, stderr, stdin, exit code), attach, port-forward and logs through the proxy as
/// the user, over WebSocket (kubectl's default) and over SPDY.
async fn exec_attach_port_forward_and_logs(
    env: &NodeEnv,
    kubeconfig: &Path,
    namespace: &str,
) -> anyhow::Result<()> {
    let web = run_pod(
        env,
        namespace,
        workload_pod(
            env,
            "web",
            "mkdir -p /tmp/www && echo hello-from-the-pod > /tmp/www/index.html && \
             echo web-started && exec httpd -f -p 8080 -h /tmp/www",
        ),
    )
    .await?;
    let logs = kubectl_ok(env, kubeconfig, &["logs", "-n", namespace, &web], &[]).await?;
    ensure!(logs.trim() == "web-started", "logs through the proxy: {logs}");

    for (protocol, vars) in [
        ("WebSocket", vec![]),
        (
            "SPDY",
            vec![
                ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
                ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
            ],
        ),
    ] {
        let output = kubectl_as(
            env,
            kubeconfig,
            &[
                "exec",
                "-n",
                namespace,
                &web,
                "--",
                "sh",
                "-c",
                "cat /tmp/www/index.html; echo oops >&2; exit 3",
            ],
            &vars,
        )
        .await?;
        ensure!(
            String::from_utf8_lossy(&output.stdout).trim() == "hello-from-the-pod"
                && String::from_utf8_lossy(&output.stderr).contains("oops")
                && output.status.code() == Some(3),
            "exec over {protocol}: {output:?}"
        );
        let echoed = exec_with_stdin(env, kubeconfig, namespace, &web, &vars, "ping over stdin\n").await?;
        ensure!(
            echoed.trim() == "ping over stdin",
            "exec -i over {protocol}: {echoed:?}"
        );
        let fetched = port_forward_get(env, kubeconfig, namespace, &web, &vars).await?;
        ensure!(
            fetched.contains("hello-from-the-pod"),
            "port-forward over {protocol}: {fetched}"
        );
        println!("exec, exec -i and port-forward through the proxy over {protocol}: ok");
    }

    // attach: a pod that echoes its stdin.
    let mut echo = workload_pod(env, "echo", "while read line; do echo \"got:$line\"; done");
    echo["spec"]["containers"][0]["stdin"] = json!(true);
    let echo = run_pod(env, namespace, echo).await?;
    for (protocol, vars) in [
        ("WebSocket", vec![]),
        ("SPDY", vec![("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]),
    ] {
        let said = attach_with_stdin(
            env,
            kubeconfig,
            namespace,
            &echo,
            &vars,
            &format!("hello {protocol}\n"),
        )
        .await?;
        ensure!(
            said.contains(&format!("got:hello {protocol}")),
            "attach over {protocol}: {said:?}"
        );
        println!("attach through the proxy over {protocol}: ok");
    }
    Ok(())
}

/// `kubectl exec -i <pod> -- cat` fed `input`.
async fn exec_with_stdin(
    env: &NodeEnv,
    kubeconfig: &Path,
    namespace: &str,
    pod: &str,
    vars: &[(&str, &str)],
    input: &str,
) -> anyhow::Result<String> {
    interactive(
        env,
        kubeconfig,
        &["exec", "-i", "-n", namespace, pod, "--", "cat"],
        vars,
        input,
        None,
    )
    .await
}

/// `kubectl attach -i <pod>` fed `input`, read until the pod's answer to it (`got:<input>`)
/// arrives: an answer to an earlier attach's input, should the pod print one late, is passed over.
async fn attach_with_stdin(
    env: &NodeEnv,
    kubeconfig: &Path,
    namespace: &str,
    pod: &str,
    vars: &[(&str, &str)],
    input: &str,
) -> anyhow::Result<String> {
    interactive(
        env,
        kubeconfig,
        &["attach", "-i", "-q", "-n", namespace, pod],
        vars,
        input,
        Some(&format!("got:{}", input.trim_end())),
    )
    .await
}

/// Runs kubectl with `input` on stdin. Without `until`, stdin is closed after the input and all
/// output is returned; with it, stdin stays open until a line containing `until` is read (attach
/// would otherwise end the pod's stream at once), the input sent again every 3 s until then, and
/// kubectl is stopped.
async fn interactive(
    env: &NodeEnv,
    kubeconfig: &Path,
    args: &[&str],
    vars: &[(&str, &str)],
    input: &str,
    until: Option<&str>,
) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
    let mut command = tokio::process::Command::new(env.cluster.kubectl().binary());
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in vars {
        command.env(key, value);
    }
    let mut child = command.spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(input.as_bytes()).await?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let result = tokio::time::timeout(Duration::from_secs(60), async {
        match until {
            None => {
                drop(stdin);
                let mut out = String::new();
                stdout.read_to_string(&mut out).await?;
                anyhow::Ok(out)
            }
            Some(marker) => {
                // containerd starts copying an attach's stdin into the container before it adds
                // the attach to the container's stdout (`ContainerIO.Attach` in its
                // internal/cri/io/container_io.go): the answer to input that was already waiting
                // can go out in between, to no one. A user would type again; so does this, every
                // 3 s until the answer comes.
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                loop {
                    // `next_line` is cancel-safe: a line cut short by the timeout is kept.
                    match tokio::time::timeout(Duration::from_secs(3), lines.next_line()).await {
                        Ok(Ok(Some(line))) if line.contains(marker) => return Ok(line),
                        Ok(Ok(Some(_))) => {}
                        Ok(Err(error)) => return Err(error.into()),
                        Ok(Ok(None)) => {
                            anyhow::bail!("kubectl {} ended without printing {marker:?}", args.join(" "))
                        }
                        Err(_) => stdin.write_all(input.as_bytes()).await?,
                    }
                }
            }
        }
    })
    .await;
    let _ = child.start_kill();
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = tokio::time::timeout(Duration::from_secs(5), err.read_to_string(&mut stderr)).await;
    }
    match result {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(e.context(stderr)),
        Err(_) => anyhow::bail!("kubectl {} did not answer within 60s: {stderr}", args.join(" ")),
    }
}

/// `kubectl port-forward <pod> :8080`, then an HTTP GET of `/` through the forwarded port.
async fn port_forward_get(
    env: &NodeEnv,
    kubeconfig: &Path,
    namespace: &str,
    pod: &str,
    vars: &[(&str, &str)],
) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
    let mut command = tokio::process::Command::new(env.cluster.kubectl().binary());
    command
        .args(["port-forward", "-n", namespace, pod, ":8080"])
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in vars {
        command.env(key, value);
    }
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let port = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            // "Forwarding from 127.0.0.1:40123 -> 8080"
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                return Ok(rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .parse::<u16>()?);
            }
        }
        anyhow::bail!("kubectl port-forward ended without forwarding")
    })
    .await
    .context("kubectl port-forward did not forward within 60s")??;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n").await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut response)).await??;
    let _ = child.start_kill();
    Ok(response)
}

/// What an admin sees when a release cannot run: an image the node does not have, and a
/// configuration the binary refuses, each named in the pod's status or its log — never a silent
/// hang. (Its own names and API group suffix, so it runs beside the release above.)
#[tokio::test]
async fn node_a_missing_image_and_a_refused_configuration_are_named_in_the_pod_status_and_log(
) -> anyhow::Result<()> {
    const FAULTS: &str = "selkie-node-faults";
    let _release = crate::node::one_release_at_a_time().await;
    let env = node_env().await?;
    let kubectl = env.cluster.kubectl();
    let helm = Helm::new(Some(env.cluster.admin_kubeconfig()))?;
    let chart = chart_dir();
    let image = &env.images.concierge;
    let values = |tag: &str, pull: &str, config: Value| {
        json!({
            "apiGroupSuffix": "faults.selkie.test",
            "supervisor": {"enabled": false},
            "concierge": {
                "namespace": FAULTS, "namePrefix": FAULTS, "replicas": 1,
                "image": {"repository": image.repository(), "tag": tag, "pullPolicy": pull},
                "controlPlane": {"config": config},
            },
        })
    };
    let values_path = helm.dir().join("values.json");
    let values_arg = values_path.to_string_lossy().into_owned();
    let pod_state = || async {
        let pods = app_pods(env, FAULTS, FAULTS).await?;
        anyhow::Ok(
            pods.first()
                .map_or(Value::Null, |pod| pod["status"]["containerStatuses"][0].clone()),
        )
    };

    // The CRDs for this suffix, as the chart's README says (the chart carries the default ones).
    let mut crds = Vec::new();
    for entry in std::fs::read_dir(selkie_e2e::crds::conf_crds_dir())? {
        let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_yaml::from_str(&std::fs::read_to_string(entry?.path())?)?;
        crds.push(serde_yaml::to_string(&selkie_api::crds::with_api_group_suffix(
            crd,
            "faults.selkie.test",
        )?)?);
    }
    selkie_e2e::crds::apply(env.cluster, &["-f", "-"], Some(&crds.join("---\n"))).await?;

    // An image the node does not have (and may not pull): ErrImageNeverPull, naming the image.
    std::fs::write(
        &values_path,
        values("not-built-here", "Never", json!({})).to_string(),
    )?;
    // Discovery may lag a moment behind the new CRDs' Established condition: helm then cannot map
    // the kinds and creates nothing; it is asked again, with a fresh discovery cache.
    let helm = eventually(Duration::from_secs(60), || async {
        let helm = Helm::new(Some(env.cluster.admin_kubeconfig()))?;
        helm.run(&[
            "install",
            FAULTS,
            &chart,
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--skip-crds",
            "-f",
            &values_arg,
        ])
        .await?;
        Ok(helm)
    })
    .await?;
    let missing = format!("{}:not-built-here", image.repository());
    eventually(Duration::from_secs(90), || async {
        let state = pod_state().await?;
        let waiting = &state["state"]["waiting"];
        ensure!(
            waiting["reason"] == "ErrImageNeverPull"
                && waiting["message"].as_str().is_some_and(|m| m.contains(&missing)),
            "container status: {state}"
        );
        Ok(())
    })
    .await?;

    // The real image with a configuration key the binary does not know: the container exits, is
    // restarted with back-off, and its log names the key.
    std::fs::write(
        &values_path,
        values(image.tag(), "IfNotPresent", json!({"notAControlPlaneKey": true})).to_string(),
    )?;
    helm.run(&[
        "upgrade",
        FAULTS,
        &chart,
        "--namespace",
        RELEASE_NAMESPACE,
        "--skip-crds",
        "-f",
        &values_arg,
    ])
    .await?;
    let pod = eventually(Duration::from_secs(120), || async {
        let pods = app_pods(env, FAULTS, FAULTS).await?;
        let crashed = pods.iter().find(|pod| {
            let status = &pod["status"]["containerStatuses"][0];
            status["image"].as_str().is_some_and(|i| i.ends_with(image.tag()))
                && status["lastState"]["terminated"]["exitCode"]
                    .as_i64()
                    .is_some_and(|code| code != 0)
        });
        crashed
            .and_then(|pod| pod["metadata"]["name"].as_str().map(str::to_string))
            .context(format!("no pod of the new image has crashed yet: {pods:?}"))
    })
    .await?;
    // The crashed container's log (or the current one's, which crashes the same way: the
    // previous container's log is gone once it is restarted again).
    eventually(Duration::from_secs(60), || async {
        let previous = kubectl
            .run(&["logs", "-n", FAULTS, &pod, "--previous"])
            .await
            .unwrap_or_default();
        let current = kubectl
            .run(&["logs", "-n", FAULTS, &pod])
            .await
            .unwrap_or_default();
        ensure!(
            previous.contains("notAControlPlaneKey") || current.contains("notAControlPlaneKey"),
            "the crashed container's log does not name the key:\n{previous}\n{current}"
        );
        Ok(())
    })
    .await?;

    helm.run(&["uninstall", FAULTS, "--namespace", RELEASE_NAMESPACE, "--wait"])
        .await?;
    kubectl
        .run(&[
            "wait",
            "--for=delete",
            "--timeout=180s",
            &format!("namespace/{FAULTS}"),
        ])
        .await?;
    Ok(())
}
