//! `selkie-demo`: the local demo behind `make demo`. Starts a real control plane (etcd +
//! kube-apiserver), Dex as the identity provider, and Selkie's impersonation proxy configured
//! with a JWT authenticator for Dex; logs in as a Dex user (password grant) and uses the real
//! kubectl through the proxy with the ID token. Everything runs on loopback and stops when the
//! demo ends.

use std::process::Command;

use anyhow::{Context, Result};
use selkie_e2e::{
    dex::{Dex, DexUser},
    proxy::{JwtSpec, Proxy},
    Cluster,
};

fn step(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

/// Runs kubectl with `kubeconfig`, printing the command line and its output.
fn kubectl(binary: &std::path::Path, kubeconfig: &std::path::Path, args: &[&str]) -> Result<()> {
    println!("$ kubectl {}", args.join(" "));
    let output = Command::new(binary)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .output()
        .context("running kubectl")?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    anyhow::ensure!(output.status.success(), "kubectl {} failed", args.join(" "));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    step("Starting etcd and kube-apiserver on loopback (the real components)");
    let cluster = Cluster::start().await?;
    println!(
        "kube-apiserver {} at {}",
        cluster.kubernetes_version(),
        cluster.server_url()
    );

    step("Starting Dex, the identity provider, with the user pinny@example.com");
    let user = DexUser {
        email: "pinny@example.com".into(),
        password: "password123".into(),
        user_id: "4f1c2a9e-demo-4000-8000-000000000001".into(),
        groups: vec!["demo-viewers".into()],
    };
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    println!("issuer {}", dex.issuer());

    step("Letting the group demo-viewers read namespaces (RBAC, as the cluster admin)");
    let admin = cluster.admin_kubeconfig();
    let kubectl_binary = cluster.kubectl().binary().to_path_buf();
    kubectl(
        &kubectl_binary,
        admin,
        &[
            "create",
            "clusterrole",
            "demo-viewer",
            "--verb=get,list,watch",
            "--resource=namespaces",
        ],
    )?;
    kubectl(
        &kubectl_binary,
        admin,
        &[
            "create",
            "clusterrolebinding",
            "demo-viewers",
            "--clusterrole=demo-viewer",
            "--group=demo-viewers",
        ],
    )?;

    step("Starting Selkie's impersonation proxy with a JWT authenticator for Dex");
    let proxy = Proxy::start(&cluster, &[JwtSpec::for_dex(&dex)]).await?;
    println!("proxy {}", proxy.url());

    step("Logging in to Dex as pinny@example.com");
    let tokens = dex.password_grant(&user.email, &user.password).await?;
    println!("got an ID token ({} bytes; not shown)", tokens.id_token.len());
    let kubeconfig = proxy.kubeconfig_with_token("pinny", &tokens.id_token)?;

    step("kubectl through the proxy, as pinny");
    kubectl(&kubectl_binary, &kubeconfig, &["auth", "whoami"])?;
    kubectl(&kubectl_binary, &kubeconfig, &["get", "namespaces"])?;
    println!("$ kubectl get secrets -n kube-system   # RBAC still decides, and says no");
    let refused = Command::new(&kubectl_binary)
        .args(["get", "secrets", "-n", "kube-system"])
        .env("KUBECONFIG", &kubeconfig)
        .output()?;
    eprint!("{}", String::from_utf8_lossy(&refused.stderr));
    anyhow::ensure!(!refused.status.success(), "pinny must not read secrets");

    step("Stopping everything");
    drop(proxy);
    drop(dex);
    cluster.stop();
    println!("done");
    Ok(())
}
