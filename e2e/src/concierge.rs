//! Selkie's Concierge installed from its manifests (`conf/crds/`, `conf/install/concierge.yaml`)
//! on a harness [`Cluster`], and run — as the Deployment would run it — as `selkie-concierge
//! --config … --control-plane …` with the token of the service account the manifests create, so
//! it has exactly the permissions they grant.
//!
//! The loopback clusters have no kubelet (the node tests install the chart on a real one,
//! `e2e/tests/e2e/node_concierge.rs`): the Deployment's pods never start. Instead the process runs on
//! loopback, the aggregated API's Service becomes an `ExternalName` to `localhost` (with the
//! APIServices pointed at the process's port), and the proxy is exposed by setting the
//! CredentialIssuer to `service.type: None` with the loopback address as `externalEndpoint`
//! ([`InstalledConcierge::expose_proxy`]).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use serde_json::json;

use crate::{cluster::write_kubeconfig_for_user, proxy::Proxy, Cluster, HarnessError};

/// The namespace of the manifests.
pub const NAMESPACE: &str = "pinniped-concierge";
/// The CredentialIssuer of the manifests.
pub const CREDENTIAL_ISSUER: &str = "pinniped-concierge-config";

/// A Concierge installed from the manifests and running on loopback. Stops when dropped.
pub struct InstalledConcierge {
    process: Proxy,
    dir: tempfile::TempDir,
}

fn conf_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conf")
}

impl InstalledConcierge {
    /// Applies the manifests to `cluster` and starts the Concierge with its service account's
    /// token. Returns once the process serves (its `/readyz` answers 200); the control plane
    /// then writes the CredentialIssuer's status and the APIServices' `caBundle` within seconds.
    pub async fn install(cluster: &Cluster) -> Result<Self, HarnessError> {
        Self::install_with(cluster, json!({})).await
    }

    /// [`InstalledConcierge::install`] with `settings` (an object of keys of the proxy's
    /// configuration file, such as `listenerLimits`) set over the harness's, as an admin sets
    /// them through the chart's `concierge.proxy` values.
    pub async fn install_with(cluster: &Cluster, settings: serde_json::Value) -> Result<Self, HarnessError> {
        let kubectl = cluster.kubectl();
        let conf = conf_dir();
        kubectl
            .run(&[
                "apply",
                "--server-side",
                "-f",
                &conf.join("crds").to_string_lossy(),
            ])
            .await?;
        kubectl
            .run(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            ])
            .await?;
        let install = conf.join("install/concierge.yaml");
        // The CredentialIssuer in the file is of a kind discovery may not list for a moment.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match kubectl.run(&["apply", "-f", &install.to_string_lossy()]).await {
                Ok(_) => break,
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }

        let aggregated_port = crate::free_port()?;
        kubectl
            .serve_api_services_on_loopback(
                NAMESPACE,
                "pinniped-concierge-api",
                &[
                    "v1alpha1.login.concierge.pinniped.dev",
                    "v1alpha1.identity.concierge.pinniped.dev",
                ],
                aggregated_port,
            )
            .await?;

        let token = kubectl
            .run(&[
                "create",
                "token",
                "pinniped-concierge",
                "-n",
                NAMESPACE,
                "--duration=2h",
            ])
            .await?
            .trim()
            .to_string();
        let dir = tempfile::Builder::new()
            .prefix("selkie-concierge-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the Concierge's directory", e))?;
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, &token).map_err(|e| HarnessError::io("writing the token file", e))?;
        let account_kubeconfig = dir.path().join("account.kubeconfig");
        write_kubeconfig_for_user(
            &account_kubeconfig,
            cluster.server_url(),
            &cluster.pki().server_ca.cert_pem(),
            "pinniped-concierge",
            json!({"token": token}),
        )?;
        let control_plane = dir.path().join("control-plane.yaml");
        let control_plane_config = json!({
            "kubeconfig": account_kubeconfig,
            "identity": "selkie-concierge-0",
            "aggregatedApi": {"listen": format!("127.0.0.1:{aggregated_port}")},
        });
        std::fs::write(&control_plane, control_plane_config.to_string())
            .map_err(|e| HarnessError::io("writing the control-plane configuration", e))?;
        let process = Proxy::start_with_args(
            cluster,
            &[],
            |config| {
                // The proxy of the manifests: no serving certificate, signer or authenticators of
                // its own (the control plane provides them), the service account's token upstream.
                if let Some(config) = config.as_object_mut() {
                    for field in [
                        "credentialSigner",
                        "clientCertificateCaFiles",
                        "servingCertificate",
                        "jwtAuthenticators",
                    ] {
                        config.remove(field);
                    }
                }
                if let Some(upstream) = config["upstream"].as_object_mut() {
                    upstream.remove("clientCertificate");
                    upstream.insert("tokenFile".into(), json!(token_file));
                }
                for (key, value) in settings.as_object().into_iter().flatten() {
                    config[key] = value.clone();
                }
            },
            &[OsString::from("--control-plane"), control_plane.into_os_string()],
        )
        .await?;
        Ok(Self { process, dir })
    }

    /// The process (its log, its proxy address).
    pub fn process(&self) -> &Proxy {
        &self.process
    }

    /// A directory for the caller's files, removed with the Concierge.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `kubectl apply` of a JWTAuthenticator `name` for `issuer` (whose CA is `ca_pem`) and
    /// `audience`, with the username from the `email` claim and the groups from `groups`; waits
    /// (up to 30 s) until the Concierge reports it Ready.
    pub async fn apply_jwt_authenticator(
        &self,
        cluster: &Cluster,
        name: &str,
        issuer: &str,
        audience: &str,
        ca_pem: &str,
    ) -> Result<(), HarnessError> {
        self.apply_jwt_authenticator_with_claims(cluster, name, issuer, audience, ca_pem, "email")
            .await
    }

    /// [`InstalledConcierge::apply_jwt_authenticator`] with the username from the claim
    /// `username_claim` (a Supervisor's tokens carry `username`).
    pub async fn apply_jwt_authenticator_with_claims(
        &self,
        cluster: &Cluster,
        name: &str,
        issuer: &str,
        audience: &str,
        ca_pem: &str,
        username_claim: &str,
    ) -> Result<(), HarnessError> {
        let authenticator = json!({
            "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1",
            "kind": "JWTAuthenticator",
            "metadata": {"name": name},
            "spec": {"issuer": issuer, "audience": audience,
                     "claims": {"username": username_claim, "groups": "groups"},
                     "tls": {"certificateAuthorityData": B64.encode(ca_pem)}},
        })
        .to_string();
        let kubectl = cluster.kubectl();
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&authenticator))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let phase = kubectl
                .run(&["get", "jwtauthenticator", name, "-o", "jsonpath={.status.phase}"])
                .await?;
            if phase == "Ready" {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady(format!(
                    "the JWTAuthenticator {name} is {phase:?}, not Ready, after 30 s\n--- Concierge log ---\n{}",
                    self.process.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Sets the CredentialIssuer to expose the proxy at its loopback address and waits (up to
    /// 30 s) for the `ImpersonationProxy` strategy to say it listens. Returns the endpoint and
    /// the PEM CA bundle the CredentialIssuer advertises, as `pinniped get kubeconfig` reads them.
    pub async fn expose_proxy(&self, cluster: &Cluster) -> Result<(String, String), HarnessError> {
        let kubectl = cluster.kubectl();
        let endpoint = self.process.url().trim_start_matches("https://").to_string();
        let issuer = json!({
            "apiVersion": "config.concierge.pinniped.dev/v1alpha1",
            "kind": "CredentialIssuer",
            "metadata": {"name": CREDENTIAL_ISSUER},
            "spec": {"impersonationProxy": {"mode": "enabled", "service": {"type": "None"},
                                            "externalEndpoint": endpoint}},
        })
        .to_string();
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&issuer))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let issuer = kubectl
                .run(&["get", "credentialissuer", CREDENTIAL_ISSUER, "-o", "json"])
                .await?;
            let issuer: serde_json::Value =
                serde_json::from_str(&issuer).map_err(|e| HarnessError::Kube {
                    context: "reading the CredentialIssuer".into(),
                    source: Box::new(e),
                })?;
            let proxy = issuer["status"]["strategies"]
                .as_array()
                .and_then(|strategies| strategies.iter().find(|s| s["type"] == "ImpersonationProxy"))
                .cloned()
                .unwrap_or_default();
            let info = &proxy["frontend"]["impersonationProxyInfo"];
            if let (Some("Listening"), Some(endpoint), Some(ca)) = (
                proxy["reason"].as_str(),
                info["endpoint"].as_str(),
                info["certificateAuthorityData"]
                    .as_str()
                    .and_then(|ca| B64.decode(ca).ok()),
            ) {
                let ca = String::from_utf8(ca).map_err(|_| {
                    HarnessError::NotReady("the CredentialIssuer's proxy CA is not PEM text".into())
                })?;
                return Ok((endpoint.to_string(), ca));
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::NotReady(format!(
                    "the ImpersonationProxy strategy did not report Listening within 30 s; last: {proxy}\n--- Concierge log ---\n{}",
                    self.process.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
