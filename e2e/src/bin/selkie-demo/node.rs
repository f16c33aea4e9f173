//! `make demo NODE=1`: the same story with Selkie as an admin runs it — a real node (containerd,
//! runc, the kubelet, kube-proxy, CoreDNS, the controller manager as a static pod), Selkie's images
//! built here from the `Containerfile`, both components installed with `helm install` from
//! `conf/helm/selkie` (two replicas each, their own service accounts), the Supervisor and the
//! impersonation proxy each behind a Service fronted by haproxy on the host, Dex on the host.

use std::{net::SocketAddr, time::Duration};

use anyhow::{ensure, Context as _, Result};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use selkie_e2e::{
    dex::Dex,
    eventually,
    helm::{chart_dir, Helm},
    images::selkie_images,
    load_balancer::LoadBalancer,
    pki::CertificateAuthority,
    supervisor::{federation_domain_manifests, Upstream as _},
    Cluster,
};
use serde_json::{json, Value};

use crate::{step, Setup, AUDIENCE, IDP_NAME};

/// The helm release and the namespace of its record; the components keep the chart's defaults
/// (Pinniped's names and namespaces).
const RELEASE: &str = "selkie";
const RELEASE_NAMESPACE: &str = "selkie";
const SUPERVISOR_NAMESPACE: &str = "pinniped-supervisor";
const CONCIERGE_NAMESPACE: &str = "pinniped-concierge";
const SUPERVISOR_SERVICE: &str = "pinniped-supervisor";
const PROXY_SERVICE: &str = "pinniped-concierge-impersonation-proxy-load-balancer";

/// Starts everything of the node demo and returns it as a [`Setup`]: the cluster with its node,
/// Dex, the helm release, the load balancers, a JWTAuthenticator trusting the FederationDomain.
/// Fails naming the step that failed; what was started stops when the error drops it.
pub(crate) async fn setup(user: &selkie_e2e::dex::DexUser) -> Result<Setup> {
    step("Starting etcd, kube-apiserver and a real node: containerd, runc, the kubelet, kube-proxy, CoreDNS, the scheduler, the controller manager as a static pod");
    let cluster = Cluster::builder().node().start().await?;
    let node = cluster.node().context("the cluster has no node")?;
    let host = node.ip();
    println!(
        "kube-apiserver {} at {}; node {} at {host}",
        cluster.kubernetes_version(),
        cluster.server_url(),
        selkie_e2e::node::NODE_NAME
    );

    step("Building Selkie's images from the Containerfile (buildah, no pulls) and importing them into the node's containerd");
    let images = tokio::task::spawn_blocking(selkie_images).await??;
    for image in [&images.concierge, &images.supervisor] {
        node.import_image(&image.archive)?;
        println!("{}", image.reference);
    }

    let supervisor_endpoint = SocketAddr::new(host.into(), selkie_e2e::free_port()?);
    let proxy_endpoint = SocketAddr::new(host.into(), selkie_e2e::free_port()?);
    let issuer = format!("https://{supervisor_endpoint}/demo-issuer");

    step("Starting Dex, the identity provider, on the host with the user pinny@example.com");
    let dex = Dex::start_on(
        host.into(),
        std::slice::from_ref(user),
        &[format!("{issuer}/callback")],
    )
    .await?;
    println!("issuer {}", dex.issuer());

    step("helm install selkie conf/helm/selkie: the Concierge and the Supervisor, two replicas each");
    let helm = Helm::new(Some(cluster.admin_kubeconfig()))?;
    let values = json!({
        "concierge": {
            "image": {"repository": images.concierge.repository(), "tag": images.concierge.tag(),
                      "pullPolicy": "IfNotPresent"},
            "credentialIssuer": {"impersonationProxy": {
                "mode": "enabled",
                "service": {"type": "LoadBalancer"},
                "externalEndpoint": proxy_endpoint.to_string(),
            }},
            "controlPlane": {"clusterSigningKey": {"agent": {"image": images.concierge.reference}}},
        },
        "supervisor": {
            "image": {"repository": images.supervisor.repository(), "tag": images.supervisor.tag(),
                      "pullPolicy": "IfNotPresent"},
            // There is no cloud controller to give a LoadBalancer Service an address: a node
            // port, fronted by haproxy on the host.
            "service": {"type": "NodePort"},
        },
    });
    let values_path = helm.dir().join("values.json");
    std::fs::write(&values_path, values.to_string())?;
    let chart = chart_dir();
    let values_arg = values_path.to_string_lossy().into_owned();
    let args = [
        "install",
        RELEASE,
        chart.as_str(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "-f",
        values_arg.as_str(),
        "--wait",
        "--timeout",
        "5m",
    ];
    println!("$ helm {}", args.join(" "));
    print!("{}", helm.run(&args).await?);
    let kubectl = cluster.kubectl();
    let shown = ["get", "pods", "-o", "wide", "-n"];
    for namespace in [CONCIERGE_NAMESPACE, SUPERVISOR_NAMESPACE] {
        println!("$ kubectl {} {namespace}", shown.join(" "));
        print!("{}", kubectl.run(&[&shown[..], &[namespace]].concat()).await?);
    }

    step("The Supervisor: its TLS certificate, Dex as an OIDCIdentityProvider, a FederationDomain; haproxy in front of its node port");
    let ca = CertificateAuthority::new("selkie-demo-supervisor-ca")?;
    let serving = ca.issue_serving("supervisor", &[&host.to_string()])?;
    let manifests = federation_domain_manifests(
        SUPERVISOR_NAMESPACE,
        "demo-federation-domain",
        &issuer,
        ("pinniped-supervisor-default-tls-certificate", &serving),
        &[(&dex, IDP_NAME)],
    );
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
        .await?;
    kubectl
        .run(&[
            "wait",
            "-n",
            SUPERVISOR_NAMESPACE,
            "--for=jsonpath={.status.phase}=Ready",
            "--timeout=120s",
            "federationdomains.config.supervisor.pinniped.dev/demo-federation-domain",
            &format!("oidcidentityproviders.idp.supervisor.pinniped.dev/{}", dex.name()),
        ])
        .await?;
    let supervisor_lb = LoadBalancer::for_service(
        &cluster,
        SUPERVISOR_NAMESPACE,
        SUPERVISOR_SERVICE,
        supervisor_endpoint,
    )
    .await?;
    println!(
        "FederationDomain issuer {issuer} (haproxy → {:?})",
        supervisor_lb.backends()
    );

    step("The Concierge: haproxy in front of the impersonation proxy's LoadBalancer Service (the CredentialIssuer's externalEndpoint)");
    let proxy_lb =
        LoadBalancer::for_service(&cluster, CONCIERGE_NAMESPACE, PROXY_SERVICE, proxy_endpoint).await?;
    eventually(Duration::from_secs(120), || async {
        let issuer: Value = serde_json::from_str(
            &kubectl
                .run(&[
                    "get",
                    "credentialissuer",
                    "pinniped-concierge-config",
                    "-o",
                    "json",
                ])
                .await?,
        )?;
        let strategies = issuer["status"]["strategies"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure!(
            strategies
                .iter()
                .any(|s| s["type"] == "ImpersonationProxy" && s["status"] == "Success"),
            "the impersonation proxy is not ready yet: {strategies:?}"
        );
        Ok(())
    })
    .await?;
    println!(
        "impersonation proxy at https://{proxy_endpoint} (haproxy → {:?})",
        proxy_lb.backends()
    );

    step("Configuring the Concierge the GitOps way: kubectl apply of a JWTAuthenticator trusting the FederationDomain");
    let authenticator = json!({
        "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
        "kind": "JWTAuthenticator",
        "metadata": {"name": "supervisor"},
        "spec": {"issuer": issuer, "audience": AUDIENCE,
                 "claims": {"username": "username", "groups": "groups"},
                 "tls": {"certificateAuthorityData": B64.encode(ca.cert_pem())}},
    });
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&authenticator.to_string()))
        .await?;
    kubectl
        .run(&[
            "wait",
            "--for=jsonpath={.status.phase}=Ready",
            "--timeout=60s",
            "jwtauthenticator/supervisor",
        ])
        .await?;

    let dir = tempfile::Builder::new().prefix("selkie-demo-").tempdir()?;
    Ok(Setup {
        admin: cluster.admin_kubeconfig().to_path_buf(),
        kubectl: kubectl.binary().to_path_buf(),
        dir: dir.path().to_path_buf(),
        issuer,
        dex_issuer: dex.issuer().to_string(),
        concierge_mode: Some("ImpersonationProxy"),
        // Stopped in this order at the end: the load balancers, helm's home, Dex, the
        // cluster with its node and pods; then the demo's files.
        running: vec![
            Box::new(proxy_lb),
            Box::new(supervisor_lb),
            Box::new(helm),
            Box::new(dex),
            Box::new(cluster),
            Box::new(dir),
        ],
    })
}
