//! `selkie-demo`: the local demo behind `make demo`. Starts a real control plane (etcd +
//! kube-apiserver) and Dex as the identity provider; installs Selkie's Concierge from its
//! manifests (`conf/`) and runs it — impersonation proxy, control plane and aggregated API in one
//! process — with the permissions the manifests grant; configures it the GitOps way (`kubectl
//! apply` of a JWTAuthenticator); lets `selkie get kubeconfig` write a kubeconfig from what the
//! Concierge publishes; and uses the real kubectl with it: the first call logs in to Dex (password
//! flow), exchanges the ID token for a short-lived certificate at the Concierge, and reaches the
//! cluster through the impersonation proxy. Everything runs on loopback and stops at the end.

use std::{path::Path, process::Command};

use anyhow::{Context, Result};
use selkie_e2e::{
    concierge::InstalledConcierge,
    dex::{Dex, DexUser, PUBLIC_CLIENT_ID},
    Cluster,
};

fn step(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}

/// Runs `program args`, printing the command line, its stderr and (`print_stdout`) its stdout;
/// returns stdout, or fails if the command fails.
fn run(
    program: &Path,
    shown: &str,
    args: &[&str],
    env: &[(&str, &str)],
    print_stdout: bool,
) -> Result<String> {
    println!("$ {shown} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("running {shown}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    if print_stdout {
        print!("{stdout}");
    }
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    anyhow::ensure!(output.status.success(), "{shown} {} failed", args.join(" "));
    Ok(stdout)
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

    step("Installing Selkie's Concierge from conf/crds and conf/install/concierge.yaml");
    let concierge = InstalledConcierge::install(&cluster).await?;
    println!(
        "selkie-concierge (proxy {}) runs as the pinniped-concierge service account",
        concierge.process().url()
    );

    step("Configuring it the GitOps way: kubectl apply of a JWTAuthenticator for Dex");
    concierge
        .apply_jwt_authenticator(&cluster, "dex", dex.issuer(), PUBLIC_CLIENT_ID, &dex.ca_pem())
        .await?;
    let admin = cluster.admin_kubeconfig().to_path_buf();
    let admin_env = [("KUBECONFIG", admin.to_str().context("a UTF-8 path")?)];
    let kubectl = cluster.kubectl().binary().to_path_buf();
    run(
        &kubectl,
        "kubectl",
        &["get", "jwtauthenticators"],
        &admin_env,
        true,
    )?;

    step("Exposing the impersonation proxy (CredentialIssuer: service type None, loopback endpoint)");
    let (endpoint, _) = concierge.expose_proxy(&cluster).await?;
    println!("impersonation proxy at {endpoint}");
    run(
        &kubectl,
        "kubectl",
        &["get", "credentialissuer"],
        &admin_env,
        true,
    )?;

    step("Letting the group demo-viewers read namespaces (RBAC, as the cluster admin)");
    run(
        &kubectl,
        "kubectl",
        &[
            "create",
            "clusterrole",
            "demo-viewer",
            "--verb=get,list,watch",
            "--resource=namespaces",
        ],
        &admin_env,
        true,
    )?;
    run(
        &kubectl,
        "kubectl",
        &[
            "create",
            "clusterrolebinding",
            "demo-viewers",
            "--clusterrole=demo-viewer",
            "--group=demo-viewers",
        ],
        &admin_env,
        true,
    )?;

    step("selkie get kubeconfig: a kubeconfig for everyone, from what the Concierge publishes");
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let dir = concierge.dir();
    let sessions = format!("--oidc-session-cache={}", dir.join("sessions.yaml").display());
    let credentials = format!("--credential-cache={}", dir.join("credentials.yaml").display());
    let kubeconfig = run(
        &selkie,
        "selkie",
        &[
            "get",
            "kubeconfig",
            "--oidc-scopes=openid,offline_access,email,groups",
            "--upstream-identity-provider-flow=cli_password",
            &sessions,
            &credentials,
        ],
        &admin_env,
        false,
    )?;
    let pinny = dir.join("pinny.kubeconfig");
    std::fs::write(&pinny, &kubeconfig)?;
    println!("wrote {} (no secrets in it)", pinny.display());

    step("kubectl as pinny: the first call logs in (password flow), the next ones use the cache");
    let pinny_env = [
        ("KUBECONFIG", pinny.to_str().context("a UTF-8 path")?),
        ("PINNIPED_USERNAME", user.email.as_str()),
        ("PINNIPED_PASSWORD", user.password.as_str()),
    ];
    run(&kubectl, "kubectl", &["auth", "whoami"], &pinny_env, true)?;
    run(&kubectl, "kubectl", &["get", "namespaces"], &pinny_env, true)?;
    println!("$ kubectl get secrets -n kube-system   # RBAC still decides, and says no");
    let refused = Command::new(&kubectl)
        .args(["get", "secrets", "-n", "kube-system"])
        .envs(pinny_env.iter().copied())
        .output()?;
    eprint!("{}", String::from_utf8_lossy(&refused.stderr));
    anyhow::ensure!(!refused.status.success(), "pinny must not read secrets");

    step("Stopping everything");
    drop(concierge);
    drop(dex);
    cluster.stop();
    println!("done");
    Ok(())
}
