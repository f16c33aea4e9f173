//! `selkie-demo`: the local demo behind `make demo` — Pinniped's full integration, Dex →
//! Supervisor → Concierge → kubectl. Starts a real control plane (etcd + kube-apiserver) and Dex
//! as the upstream identity provider; installs Selkie's Supervisor from its manifests
//! (`conf/install/supervisor.yaml`) with a FederationDomain federating Dex, and Selkie's Concierge
//! (`conf/install/concierge.yaml`) — impersonation proxy, control plane and aggregated API in one
//! process — each with the permissions its manifests grant; configures the Concierge the GitOps
//! way (`kubectl apply` of a JWTAuthenticator trusting the FederationDomain); lets `selkie get
//! kubeconfig` write a kubeconfig from what the Concierge publishes; and uses the real kubectl with
//! it: the first call logs in through the Supervisor (in the browser when there is a display,
//! else with the password flow), exchanges the Supervisor's token for a cluster-scoped one and that
//! for a short-lived certificate at the Concierge, and reaches the cluster through the
//! impersonation proxy. Everything runs on loopback and stops at the end — unless `KEEP=1`: then
//! it prints the kubeconfig's path and keeps running until Ctrl-C.
//!
//! With `NODE=1` ([`node`]) Selkie runs as an admin runs it instead: on a real node, as pods of
//! its own images, installed with `helm install`; the user's steps are the same.

use std::{
    any::Any,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use selkie_e2e::{
    concierge::InstalledConcierge,
    dex::{Dex, DexUser},
    supervisor::Supervisor,
    Cluster,
};

mod node;

/// The display name of Dex in the FederationDomain.
pub(crate) const IDP_NAME: &str = "Dex Users";
/// The audience of the demo cluster's tokens.
pub(crate) const AUDIENCE: &str = "demo-cluster";

pub(crate) fn step(text: &str) {
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

/// Everything the demo's user steps need, and what keeps running until the end.
pub(crate) struct Setup {
    /// The cluster admin's kubeconfig.
    admin: PathBuf,
    /// The real kubectl.
    kubectl: PathBuf,
    /// Where the CLI's caches and the user's kubeconfig go.
    dir: PathBuf,
    /// The FederationDomain's issuer.
    issuer: String,
    /// Dex's issuer.
    dex_issuer: String,
    /// The `--concierge-mode` for `selkie get kubeconfig` (`None`: what it discovers).
    concierge_mode: Option<&'static str>,
    /// Everything started, stopped in this order when dropped.
    running: Vec<Box<dyn Any>>,
}

/// The demo on loopback: Selkie's binaries as processes, installed from `conf/install/`.
async fn processes(user: &DexUser) -> Result<Setup> {
    step("Starting etcd and kube-apiserver on loopback (the real components)");
    let owned = Cluster::start().await?;
    let cluster = &owned;
    println!(
        "kube-apiserver {} at {}",
        cluster.kubernetes_version(),
        cluster.server_url()
    );

    step("Starting Dex, the identity provider, with the user pinny@example.com");
    let port = selkie_e2e::free_port()?;
    let callback = format!("{}/callback", Supervisor::issuer_for(port, "pinniped-supervisor"));
    let dex = Dex::start_with_redirects(std::slice::from_ref(user), &[callback]).await?;
    println!("issuer {}", dex.issuer());

    step("Installing Selkie's Supervisor from conf/crds and conf/install/supervisor.yaml");
    let supervisor = Supervisor::install_on(cluster, &dex, IDP_NAME, port).await?;
    println!(
        "selkie-supervisor runs as the pinniped-supervisor service account; FederationDomain issuer {}",
        supervisor.issuer()
    );

    step("Installing Selkie's Concierge from conf/crds and conf/install/concierge.yaml");
    let concierge = InstalledConcierge::install(cluster).await?;
    println!(
        "selkie-concierge (proxy {}) runs as the pinniped-concierge service account",
        concierge.process().url()
    );

    step("Configuring it the GitOps way: kubectl apply of a JWTAuthenticator trusting the Supervisor");
    concierge
        .apply_jwt_authenticator_with_claims(
            cluster,
            "supervisor",
            supervisor.issuer(),
            AUDIENCE,
            &supervisor.ca_pem(),
            "username",
        )
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
    let (endpoint, _) = concierge.expose_proxy(cluster).await?;
    println!("impersonation proxy at {endpoint}");
    run(
        &kubectl,
        "kubectl",
        &["get", "credentialissuer"],
        &admin_env,
        true,
    )?;
    Ok(Setup {
        admin: admin.clone(),
        kubectl,
        dir: concierge.dir().to_path_buf(),
        issuer: supervisor.issuer().to_string(),
        dex_issuer: dex.issuer().to_string(),
        concierge_mode: None,
        running: vec![
            Box::new(concierge),
            Box::new(supervisor),
            Box::new(dex),
            Box::new(owned),
        ],
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let keep = std::env::var("KEEP").is_ok_and(|value| !value.is_empty() && value != "0");
    let on_node = std::env::var("NODE").is_ok_and(|value| !value.is_empty() && value != "0");
    let browser = std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    let user = DexUser {
        email: "pinny@example.com".into(),
        password: "password123".into(),
        user_id: "4f1c2a9e-demo-4000-8000-000000000001".into(),
        groups: vec!["demo-viewers".into()],
    };
    let setup = if on_node {
        node::setup(&user).await?
    } else {
        processes(&user).await?
    };
    let admin = setup.admin.clone();
    let admin_env = [("KUBECONFIG", admin.to_str().context("a UTF-8 path")?)];
    let kubectl = setup.kubectl.clone();
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
    let dir = setup.dir.as_path();
    let sessions = format!("--oidc-session-cache={}", dir.join("sessions.yaml").display());
    let credentials = format!("--credential-cache={}", dir.join("credentials.yaml").display());
    let mode = setup
        .concierge_mode
        .map(|mode| format!("--concierge-mode={mode}"));
    let mut args = vec!["get", "kubeconfig", &sessions, &credentials];
    args.extend(mode.as_deref());
    if !browser {
        // No display: the password flow (the Supervisor asks Dex with the password grant).
        args.push("--upstream-identity-provider-flow=cli_password");
    }
    let kubeconfig = run(&selkie, "selkie", &args, &admin_env, false)?;
    let pinny = dir.join("pinny.kubeconfig");
    std::fs::write(&pinny, &kubeconfig)?;
    println!("wrote {} (no secrets in it)", pinny.display());

    if browser {
        step("kubectl as pinny: the first call opens your browser at the Supervisor (log in at Dex as pinny@example.com / password123), the next ones use the cache");
    } else {
        step("kubectl as pinny: the first call logs in through the Supervisor (password flow), the next ones use the cache");
    }
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

    if keep {
        step("Everything keeps running (KEEP=1); Ctrl-C stops it");
        println!(
            "export KUBECONFIG={}   # pinny, through the Concierge",
            pinny.display()
        );
        println!("kubeconfig of the cluster admin: {}", admin.display());
        println!("Supervisor issuer: {}   Dex: {}", setup.issuer, setup.dex_issuer);
        tokio::signal::ctrl_c().await?;
    }
    step("Stopping everything");
    for running in setup.running {
        drop(running);
    }
    println!("done");
    Ok(())
}
