//! The whole Concierge as users run it: the real `selkie-concierge` binary with `--control-plane`
//! against the harness's kube-apiserver, Pinniped's CRDs (under an API group suffix of the test's
//! own), a real Dex, and the real kubectl. A JWTAuthenticator becomes Ready; a
//! TokenCredentialRequest through kube-apiserver's aggregation returns a certificate signed with
//! the cluster's signing key (a Secret); that certificate works directly against kube-apiserver
//! and through the impersonation proxy (whose endpoint and CA come from the CredentialIssuer);
//! a GitOps change of the authenticator takes effect in seconds; and of two replicas one leads
//! (writes) while both serve, and the other takes over when the leader stops; deleting the
//! authenticator stops logins.

use std::{ffi::OsString, time::Duration};

use anyhow::{ensure, Context as _};
use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use selkie_api::crds;
use selkie_e2e::{
    cluster::write_kubeconfig_for_user,
    concierge::{self, InstalledConcierge},
    dex::{Dex, DexUser, CLIENT_ID, PUBLIC_CLIENT_ID},
    kubectl::Kubectl,
    proxy::Proxy,
    watch::ObjectWatch,
    Cluster,
};
use serde_json::{json, Value};

use crate::eventually;

fn free_port() -> anyhow::Result<u16> {
    Ok(selkie_e2e::free_port()?)
}

/// One installation of the Concierge under its own API group suffix and namespace.
struct Installation<'a> {
    cluster: &'a Cluster,
    namespace: String,
    suffix: String,
    dir: tempfile::TempDir,
}

impl<'a> Installation<'a> {
    fn group(&self, prefix: &str) -> String {
        format!("{prefix}.{}", self.suffix)
    }

    /// Plays the install manifests: CRDs for the suffix, the cluster signing key Secret, the
    /// ExternalName Service and APIServices for an aggregated API on `127.0.0.1:<port>`, the
    /// pre-authentication RBAC, and kube-public/cluster-info (as kubeadm writes it).
    async fn install(cluster: &'a Cluster, aggregated_port: u16) -> anyhow::Result<Self> {
        let client = cluster.client().await?;
        let namespace = cluster.create_namespace(&client, "concierge").await?;
        let suffix = format!("{namespace}.selkie.test");
        let kubectl = cluster.kubectl();
        for (_, yaml) in crds::render_all(&suffix)? {
            kubectl
                .run_with_stdin(&["apply", "--server-side", "-f", "-"], Some(&yaml))
                .await?;
        }
        let installation = Self {
            cluster,
            namespace,
            suffix,
            dir: tempfile::tempdir()?,
        };
        let ns = &installation.namespace;
        let pki = cluster.pki();
        let cluster_info_kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "", "cluster": {
                "server": cluster.server_url(),
                "certificate-authority-data": B64.encode(pki.server_ca.cert_pem())}}],
        });
        let mut items = vec![
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "cluster-signing", "namespace": ns},
                   "type": "kubernetes.io/tls",
                   "data": {"tls.crt": B64.encode(pki.client_ca.cert_pem()),
                            "tls.key": B64.encode(pki.client_ca.key_pem())}}),
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "pinniped-concierge-api", "namespace": ns},
                   "spec": {"type": "ExternalName", "externalName": "localhost"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": format!("{ns}-pre-authn-apis")},
                   "rules": [{"apiGroups": [installation.group("login.concierge")],
                              "resources": ["tokencredentialrequests"], "verbs": ["create", "list"]},
                             {"apiGroups": [installation.group("identity.concierge")],
                              "resources": ["whoamirequests"], "verbs": ["create", "list"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": format!("{ns}-pre-authn-apis")},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": format!("{ns}-pre-authn-apis")},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"},
                                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]}),
        ];
        for group in ["login.concierge", "identity.concierge"] {
            let group = installation.group(group);
            items.push(json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": format!("v1alpha1.{group}")},
                "spec": {"group": group, "version": "v1alpha1", "groupPriorityMinimum": 9900,
                         "versionPriority": 15,
                         "service": {"name": "pinniped-concierge-api", "namespace": ns, "port": aggregated_port}}}));
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        kubectl.run_with_stdin(&["apply", "-f", "-"], Some(&list)).await?;
        // As kubeadm writes it.
        let cluster_info = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": serde_yaml::to_string(&cluster_info_kubeconfig)?}})
        .to_string();
        kubectl
            .run_with_stdin(&["create", "-f", "-"], Some(&cluster_info))
            .await?;
        Ok(installation)
    }

    /// Starts one replica: the proxy harness's configuration without its own signer, plus a
    /// control-plane file for this installation (with `certificate_lifetime` as its
    /// `clientCertificateLifetime` when given).
    async fn start_replica(
        &self,
        identity: &str,
        aggregated_port: u16,
        certificate_lifetime: Option<&str>,
    ) -> anyhow::Result<Proxy> {
        let mut control_plane = json!({
            "kubeconfig": self.cluster.admin_kubeconfig(),
            "namespace": self.namespace,
            "apiGroupSuffix": self.suffix,
            "identity": identity,
            "aggregatedApi": {"listen": format!("127.0.0.1:{aggregated_port}")},
            "clusterSigningKey": {"secret": {"namespace": self.namespace, "name": "cluster-signing"}},
            "discoveryUrl": self.cluster.server_url(),
        });
        if let Some(lifetime) = certificate_lifetime {
            control_plane["clientCertificateLifetime"] = json!(lifetime);
        }
        let path = self.dir.path().join(format!("{identity}.yaml"));
        std::fs::write(&path, control_plane.to_string())?;
        let proxy = Proxy::start_with_args(
            self.cluster,
            &[],
            |config| {
                if let Some(config) = config.as_object_mut() {
                    for field in [
                        "credentialSigner",
                        "clientCertificateCaFiles",
                        "servingCertificate",
                    ] {
                        config.remove(field);
                    }
                }
            },
            &[OsString::from("--control-plane"), path.into_os_string()],
        )
        .await?;
        Ok(proxy)
    }

    fn kubeconfig(
        &self,
        name: &str,
        server: &str,
        ca_pem: &str,
        user: Value,
    ) -> anyhow::Result<std::path::PathBuf> {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        write_kubeconfig_for_user(&path, server, ca_pem, name, user)?;
        Ok(path)
    }

    /// kubectl against `server` as `system:anonymous`: a user name without a password is basic
    /// authentication nobody accepts (an empty user entry would make kubectl prompt on stdin).
    fn anonymous_kubectl(&self, name: &str, server: &str, ca_pem: &str) -> anyhow::Result<Kubectl> {
        let path = self.kubeconfig(name, server, ca_pem, json!({"username": "nobody"}))?;
        Ok(self.cluster.kubectl().with_kubeconfig(&path))
    }

    /// kubectl against the proxy at `server` whose user is `selkie login static` exchanging
    /// `token` at that proxy's TokenCredentialRequest API (no credential cache), as the
    /// kubeconfigs of `pinniped get kubeconfig` do in impersonation-proxy mode.
    fn plugin_kubectl(&self, name: &str, server: &str, ca_pem: &str, token: &str) -> anyhow::Result<Kubectl> {
        let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
        let exec = json!({"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": selkie,
            "args": ["login", "static", "--enable-concierge",
                     format!("--concierge-api-group-suffix={}", self.suffix),
                     "--concierge-authenticator-type=jwt",
                     "--concierge-authenticator-name=dex",
                     format!("--concierge-endpoint={server}"),
                     format!("--concierge-ca-bundle-data={}", B64.encode(ca_pem)),
                     "--credential-cache=",
                     "--token-env=SELKIE_TEST_TOKEN"],
            "env": [{"name": "SELKIE_TEST_TOKEN", "value": token}],
            "interactiveMode": "Never",
        }});
        let path = self.kubeconfig(name, server, ca_pem, exec)?;
        Ok(self.cluster.kubectl().with_kubeconfig(&path))
    }

    /// A TokenCredentialRequest for `token` naming the JWTAuthenticator `authenticator`.
    fn token_credential_request(&self, token: &str, authenticator: &str) -> String {
        self.token_credential_request_for(token, "JWTAuthenticator", authenticator)
    }

    /// A TokenCredentialRequest for `token` naming the authenticator `name` of `kind`.
    fn token_credential_request_for(&self, token: &str, kind: &str, name: &str) -> String {
        json!({
            "apiVersion": format!("{}/v1alpha1", self.group("login.concierge")),
            "kind": "TokenCredentialRequest",
            "spec": {"token": token, "authenticator": {
                "apiGroup": self.group("authentication.concierge"),
                "kind": kind, "name": name}},
        })
        .to_string()
    }

    /// kubectl against kube-apiserver as `system:anonymous`.
    fn anonymous_to_cluster(&self) -> anyhow::Result<Kubectl> {
        self.anonymous_kubectl(
            "anonymous",
            self.cluster.server_url(),
            &self.cluster.pki().server_ca.cert_pem(),
        )
    }

    /// `POST`s a TokenCredentialRequest through kube-apiserver's aggregation with `kubectl` and
    /// returns the answer.
    async fn post_token_credential_request(
        &self,
        kubectl: &Kubectl,
        request: &str,
    ) -> anyhow::Result<String> {
        let path = format!(
            "/apis/{}/v1alpha1/tokencredentialrequests",
            self.group("login.concierge")
        );
        Ok(kubectl
            .run_with_stdin(&["create", "--raw", &path, "-f", "-"], Some(request))
            .await?)
    }

    /// `POST`s `request` with `kubectl` until the answer carries a credential (at most
    /// `timeout`), and returns that answer.
    async fn wait_for_credential(
        &self,
        kubectl: &Kubectl,
        request: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        eventually(timeout, || async {
            let answer = self.post_token_credential_request(kubectl, request).await?;
            credential(&answer)?;
            Ok(answer)
        })
        .await
    }

    /// Waits until the authenticator `name` (`resource` names its plural and group, as kubectl
    /// takes it) reports `phase: Ready`.
    async fn wait_ready(&self, resource: &str, name: &str) -> anyhow::Result<()> {
        eventually(Duration::from_secs(30), || async {
            let status = self.get_json(&["get", resource, name]).await?;
            ensure!(
                status["status"]["phase"] == "Ready",
                "status: {}",
                status["status"]
            );
            Ok(())
        })
        .await
    }

    async fn apply_jwt_authenticator(&self, dex: &Dex, audience: &str) -> anyhow::Result<()> {
        self.apply_jwt_authenticator_named(dex, audience, "dex", None)
            .await
    }

    /// `kubectl apply` of the JWTAuthenticator `name` for `dex`'s tokens of `audience`, with
    /// Selkie's `loginAuthorization` when given.
    async fn apply_jwt_authenticator_named(
        &self,
        dex: &Dex,
        audience: &str,
        name: &str,
        login_authorization: Option<Value>,
    ) -> anyhow::Result<()> {
        let mut authenticator = json!({
            "apiVersion": format!("{}/v1alpha1", self.group("authentication.concierge")),
            "kind": "JWTAuthenticator",
            "metadata": {"name": name},
            "spec": {"issuer": dex.issuer(), "audience": audience,
                     "claims": {"username": "email", "groups": "groups"},
                     "tls": {"certificateAuthorityData": B64.encode(dex.ca_pem())}},
        });
        if let Some(rule) = login_authorization {
            authenticator["spec"]["loginAuthorization"] = rule;
        }
        let authenticator = authenticator.to_string();
        let kubectl = self.cluster.kubectl();
        eventually(Duration::from_secs(20), || async {
            Ok(kubectl
                .run_with_stdin(&["apply", "-f", "-"], Some(&authenticator))
                .await?)
        })
        .await?;
        Ok(())
    }

    /// The CredentialIssuer's strategy of type `kind` (`resource` names the kind's plural and
    /// group, as kubectl takes it).
    async fn strategy(&self, resource: &str, kind: &str) -> anyhow::Result<Value> {
        let issuer = self
            .get_json(&["get", resource, "pinniped-concierge-config"])
            .await?;
        issuer["status"]["strategies"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["type"] == kind))
            .cloned()
            .with_context(|| format!("no {kind} strategy in {}", issuer["status"]))
    }

    async fn get_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.cluster.kubectl().run(&all).await?)?)
    }
}

/// The credential of a TokenCredentialRequest response, or what the response said instead.
fn credential(response: &str) -> anyhow::Result<(String, String)> {
    let response: Value = serde_json::from_str(response)?;
    let credential = &response["status"]["credential"];
    match (
        credential["clientCertificateData"].as_str(),
        credential["clientKeyData"].as_str(),
    ) {
        (Some(cert), Some(key)) => Ok((cert.to_string(), key.to_string())),
        _ => anyhow::bail!("no credential in {response}"),
    }
}

/// The validity (not before, not after; unix seconds) of the first certificate of `pem`.
fn certificate_validity(pem: &str) -> anyhow::Result<(i64, i64)> {
    use x509_cert::der::DecodePem as _;
    let certificate = x509_cert::Certificate::from_pem(pem)?;
    let validity = &certificate.tbs_certificate.validity;
    let seconds = |time: &x509_cert::time::Time| -> anyhow::Result<i64> {
        let since = time.to_system_time().duration_since(std::time::UNIX_EPOCH)?;
        Ok(i64::try_from(since.as_secs())?)
    };
    Ok((seconds(&validity.not_before)?, seconds(&validity.not_after)?))
}

fn cert_user(cert: &str, key: &str) -> Value {
    json!({"client-certificate-data": B64.encode(cert), "client-key-data": B64.encode(key)})
}

async fn whoami(kubectl: &Kubectl) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(
        &kubectl.run(&["auth", "whoami", "-o", "json"]).await?,
    )?)
}

fn assert_dex_user(whoami: &Value) -> anyhow::Result<()> {
    let user = &whoami["status"]["userInfo"];
    ensure!(user["username"] == "pinny@example.com", "whoami said {whoami}");
    let groups: Vec<&str> = user["groups"]
        .as_array()
        .context("no groups")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        groups.contains(&"ops") && groups.contains(&"devs"),
        "whoami said {whoami}"
    );
    Ok(())
}

async fn lease_holder(installation: &Installation<'_>) -> anyhow::Result<String> {
    let lease = installation
        .get_json(&[
            "get",
            "lease",
            "-n",
            &installation.namespace,
            "pinniped-concierge-leader-election",
        ])
        .await?;
    Ok(lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

#[tokio::test]
async fn the_concierge_logs_dex_users_in_through_aggregation_and_the_proxy() -> anyhow::Result<()> {
    /// Longer than Pinniped's 5 minutes (Selkie's `clientCertificateLifetime`).
    const CERTIFICATE_LIFETIME: &str = "1h";
    // A private cluster: the control plane reconciles every authenticator of its API group, and
    // a second set of the Concierge's CRDs would make kubectl's short names ambiguous for the
    // other tests of the shared cluster.
    let cluster = &Cluster::start().await?;
    let aggregated_port = free_port()?;
    let installation = Installation::install(cluster, aggregated_port).await?;
    let mut first = installation
        .start_replica("replica-a", aggregated_port, Some(CERTIFICATE_LIFETIME))
        .await?;
    let dex = Dex::start(&[DexUser::pinny()]).await?;
    installation.apply_jwt_authenticator(&dex, CLIENT_ID).await?;
    let jwt_resource = format!(
        "jwtauthenticators.{}",
        installation.group("authentication.concierge")
    );

    // The authenticator becomes Ready, and the replica leads.
    installation
        .wait_ready(&jwt_resource, "dex")
        .await
        .map_err(|e| crate::with_log(e, first.log()))?;
    assert_eq!(lease_holder(&installation).await?, "replica-a");

    // A TokenCredentialRequest through kube-apiserver, as an anonymous client, with a Dex token.
    let token = dex
        .password_grant("pinny@example.com", "password123")
        .await?
        .id_token;
    let anonymous = installation.anonymous_to_cluster()?;
    let request = installation.token_credential_request(&token, "dex");
    let response = installation
        .wait_for_credential(&anonymous, &request, Duration::from_secs(60))
        .await
        .map_err(|e| crate::with_log(e, first.log()))?;
    let (cert, key) = credential(&response)?;
    assert!(!response.contains(&token), "the token is never echoed");
    // The configured lifetime (the default is 5 minutes): the certificate's validity (with its
    // 5-minute backdating) and the expiry the answer gives the client.
    let validity = certificate_validity(&cert)?;
    assert_eq!(validity.1 - validity.0, 65 * 60, "{validity:?}");
    let expiry: Value = serde_json::from_str(&response)?;
    let expiry = time::OffsetDateTime::parse(
        expiry["status"]["credential"]["expirationTimestamp"]
            .as_str()
            .context("no expirationTimestamp")?,
        &time::format_description::well_known::Rfc3339,
    )?;
    assert_eq!(expiry.unix_timestamp(), validity.1);

    // The certificate is signed with the cluster's key: it works directly against kube-apiserver.
    let direct = installation.kubeconfig(
        "direct",
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        cert_user(&cert, &key),
    )?;
    assert_dex_user(&whoami(&cluster.kubectl().with_kubeconfig(&direct)).await?)?;

    // Selkie's loginAuthorization: a second authenticator of the same issuer answers only users
    // RBAC allows to `login`. Without the grant: "authentication failed", and the audit line
    // says why; with it (to a group of the user), a certificate.
    let login_group = installation.group("login.concierge");
    installation
        .apply_jwt_authenticator_named(
            &dex,
            CLIENT_ID,
            "dex-restricted",
            Some(json!({"verb": "login", "group": login_group,
                        "resource": "tokencredentialrequests", "name": "dex-restricted"})),
        )
        .await?;
    installation.wait_ready(&jwt_resource, "dex-restricted").await?;
    let restricted = installation.token_credential_request(&token, "dex-restricted");
    let why = format!(
        "\"login_refused\":\"not allowed to login tokencredentialrequests.{login_group}/dex-restricted\""
    );
    eventually(Duration::from_secs(30), || async {
        let answer: Value = serde_json::from_str(
            &installation
                .post_token_credential_request(&anonymous, &restricted)
                .await?,
        )?;
        ensure!(answer["status"]["message"] == "authentication failed", "{answer}");
        let log = first.log();
        ensure!(
            log.lines().any(|line| line.contains("token credential request")
                && line.contains("pinny@example.com")
                && line.contains(&why)),
            "no audit line of the refused login in:\n{log}"
        );
        Ok(())
    })
    .await?;
    let grant = format!(
        "{{\"apiVersion\": \"rbac.authorization.k8s.io/v1\", \"kind\": \"ClusterRole\",
          \"metadata\": {{\"name\": \"login-{ns}\"}},
          \"rules\": [{{\"apiGroups\": [\"{login_group}\"], \"resources\": [\"tokencredentialrequests\"],
                       \"resourceNames\": [\"dex-restricted\"], \"verbs\": [\"login\"]}}]}}",
        ns = installation.namespace
    );
    let kubectl = cluster.kubectl();
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&grant))
        .await?;
    kubectl
        .run(&[
            "create",
            "clusterrolebinding",
            &format!("login-{}", installation.namespace),
            &format!("--clusterrole=login-{}", installation.namespace),
            "--group=ops",
        ])
        .await?;
    let granted = installation
        .wait_for_credential(&anonymous, &restricted, Duration::from_secs(30))
        .await
        .map_err(|e| crate::with_log(e, first.log()))?;
    let (granted_cert, granted_key) = credential(&granted)?;
    let granted_kubeconfig = installation.kubeconfig(
        "granted",
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        cert_user(&granted_cert, &granted_key),
    )?;
    assert_dex_user(&whoami(&cluster.kubectl().with_kubeconfig(&granted_kubeconfig)).await?)?;

    // The CredentialIssuer reports the cluster-key strategy with kube-apiserver as the frontend.
    let issuer_resource = format!("credentialissuers.{}", installation.group("config.concierge"));
    eventually(Duration::from_secs(30), || async {
        let key = installation
            .strategy(&issuer_resource, "KubeClusterSigningCertificate")
            .await?;
        ensure!(
            key["status"] == "Success" && key["reason"] == "FetchedKey",
            "{key}"
        );
        ensure!(
            key["frontend"]["tokenCredentialRequestInfo"]["server"] == cluster.server_url(),
            "{key}"
        );
        Ok(())
    })
    .await
    .map_err(|e| crate::with_log(e, first.log()))?;

    // Expose the proxy on its loopback address (type None + externalEndpoint) and use it with the
    // endpoint and CA the CredentialIssuer advertises.
    let endpoint = first.url().trim_start_matches("https://").to_string();
    let issuer = json!({
        "apiVersion": format!("{}/v1alpha1", installation.group("config.concierge")),
        "kind": "CredentialIssuer",
        "metadata": {"name": "pinniped-concierge-config"},
        "spec": {"impersonationProxy": {"mode": "enabled", "service": {"type": "None"},
                                        "externalEndpoint": endpoint}},
    })
    .to_string();
    cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&issuer))
        .await?;
    let (proxy_endpoint, proxy_ca) = eventually(Duration::from_secs(30), || async {
        let proxy = installation
            .strategy(&issuer_resource, "ImpersonationProxy")
            .await?;
        ensure!(
            proxy["status"] == "Success" && proxy["reason"] == "Listening",
            "{proxy}"
        );
        let info = &proxy["frontend"]["impersonationProxyInfo"];
        let ca = B64.decode(info["certificateAuthorityData"].as_str().context("no CA")?)?;
        Ok((
            info["endpoint"].as_str().context("no endpoint")?.to_string(),
            String::from_utf8(ca)?,
        ))
    })
    .await
    .map_err(|e| crate::with_log(e, first.log()))?;
    assert_eq!(proxy_endpoint, format!("https://{endpoint}"));
    let through_proxy = installation.kubeconfig(
        "through-proxy",
        &proxy_endpoint,
        &proxy_ca,
        cert_user(&cert, &key),
    )?;
    let proxy_kubectl = cluster.kubectl().with_kubeconfig(&through_proxy);
    let seen = eventually(Duration::from_secs(20), || async { whoami(&proxy_kubectl).await })
        .await
        .map_err(|e| crate::with_log(e, first.log()))?;
    assert_dex_user(&seen)?;

    // The proxy answers TokenCredentialRequests itself, for clients that reach only the proxy:
    // the CLI as kubectl's credential plugin logs in there and kubectl works through it.
    let via_proxy_login = installation.plugin_kubectl("proxy-login", &proxy_endpoint, &proxy_ca, &token)?;
    assert_dex_user(&whoami(&via_proxy_login).await?)?;

    // A second replica serves too (its own aggregated listener and proxy) but does not lead.
    // Every write to the Lease from now on is watched: while the second replica starts and
    // serves, only replica-a may hold it.
    let lease_writes = ObjectWatch::start(
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            cluster.client().await?,
            &installation.namespace,
        ),
        "pinniped-concierge-leader-election",
    )
    .await?;
    let second_port = free_port()?;
    let second = installation
        .start_replica("replica-b", second_port, Some(CERTIFICATE_LIFETIME))
        .await?;
    let second_login = installation.plugin_kubectl("second-login", second.url(), &proxy_ca, &token)?;
    let seen = eventually(Duration::from_secs(30), || async { whoami(&second_login).await })
        .await
        .map_err(|e| crate::with_log(e, second.log()))?;
    assert_dex_user(&seen)?;
    for write in lease_writes.writes() {
        let holder = write
            .object()
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref());
        assert_eq!(holder, Some("replica-a"), "one leader at a time: {write:?}");
    }
    assert_eq!(
        lease_holder(&installation).await?,
        "replica-a",
        "one leader at a time"
    );

    // GitOps: another audience takes effect within seconds on both replicas, without restarts.
    installation
        .apply_jwt_authenticator(&dex, "another-audience")
        .await?;
    let started = std::time::Instant::now();
    eventually(Duration::from_secs(2), || async {
        let response = installation
            .post_token_credential_request(&anonymous, &request)
            .await?;
        ensure!(credential(&response).is_err(), "still accepted: {response}");
        ensure!(response.contains("authentication failed"), "{response}");
        ensure!(
            whoami(&second_login).await.is_err(),
            "the second replica still logs in"
        );
        Ok(())
    })
    .await?;
    eprintln!("the audience change took effect after {:?}", started.elapsed());

    // The leader stops; the other replica takes the Lease over.
    first.terminate()?;
    first.wait_for_exit(Duration::from_secs(30)).await?;
    eventually(Duration::from_secs(40), || async {
        ensure!(lease_holder(&installation).await? == "replica-b");
        Ok(())
    })
    .await
    .map_err(|e| crate::with_log(e, second.log()))?;

    // Deleting the authenticator stops new logins.
    installation.apply_jwt_authenticator(&dex, CLIENT_ID).await?;
    eventually(Duration::from_secs(5), || async { whoami(&second_login).await })
        .await
        .map_err(|e| crate::with_log(e, second.log()))?;
    cluster.kubectl().run(&["delete", &jwt_resource, "dex"]).await?;
    eventually(Duration::from_secs(2), || async {
        ensure!(
            whoami(&second_login).await.is_err(),
            "still logging in after the delete"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// The install manifests (`conf/crds/`, `conf/install/concierge.yaml`) apply to a fresh cluster,
/// and the Concierge runs with exactly the permissions they grant its service account: its
/// control plane and its proxy use that account's token. Without a cluster signing key, logins
/// get certificates of the Concierge's own signer CA, which work through the impersonation proxy
/// and not directly against kube-apiserver.
#[tokio::test]
async fn the_install_manifests_grant_the_concierge_what_it_needs() -> anyhow::Result<()> {
    let cluster = &Cluster::start().await?;
    let kubectl = cluster.kubectl();
    let concierge = InstalledConcierge::install(cluster).await?;
    let dex = Dex::start(&[DexUser::pinny()]).await?;
    let installation = Installation {
        cluster,
        namespace: concierge::NAMESPACE.to_string(),
        suffix: "pinniped.dev".to_string(),
        dir: tempfile::tempdir()?,
    };
    installation.apply_jwt_authenticator(&dex, CLIENT_ID).await?;
    installation
        .wait_ready("jwtauthenticator", "dex")
        .await
        .map_err(|e| crate::with_log(e, concierge.process().log()))?;

    // The proxy's endpoint and CA come from the CredentialIssuer; without a configured key the
    // cluster-key strategy says why.
    let (proxy_endpoint, proxy_ca) = concierge.expose_proxy(cluster).await?;
    eventually(Duration::from_secs(20), || async {
        let key = installation
            .strategy("credentialissuer", "KubeClusterSigningCertificate")
            .await?;
        ensure!(
            key["status"] == "Error" && key["reason"] == "CouldNotFetchKey",
            "{key}"
        );
        Ok(())
    })
    .await?;

    // A login through kube-apiserver's aggregation gets a certificate of the signer CA ...
    let token = dex
        .password_grant("pinny@example.com", "password123")
        .await?
        .id_token;
    let anonymous = installation.anonymous_to_cluster()?;
    let request = installation.token_credential_request(&token, "dex");
    let response = installation
        .wait_for_credential(&anonymous, &request, Duration::from_secs(60))
        .await
        .map_err(|e| crate::with_log(e, concierge.process().log()))?;
    let (cert, key) = credential(&response)?;

    // ... which works through the impersonation proxy ...
    let through_proxy = installation.kubeconfig(
        "through-proxy",
        &proxy_endpoint,
        &proxy_ca,
        cert_user(&cert, &key),
    )?;
    let seen = eventually(Duration::from_secs(20), || async {
        whoami(&kubectl.with_kubeconfig(&through_proxy)).await
    })
    .await
    .map_err(|e| crate::with_log(e, concierge.process().log()))?;
    assert_dex_user(&seen)?;

    // ... and not directly: kube-apiserver does not trust the Concierge's own CA.
    let direct = installation.kubeconfig(
        "direct",
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        cert_user(&cert, &key),
    )?;
    let refused = whoami(&kubectl.with_kubeconfig(&direct)).await;
    ensure!(
        refused.is_err(),
        "kube-apiserver accepted a signer-CA certificate: {refused:?}"
    );

    // Nothing it did was forbidden to it.
    let log = concierge.process().log();
    let forbidden: Vec<&str> = log.lines().filter(|line| line.contains("forbidden")).collect();
    ensure!(
        forbidden.is_empty(),
        "the Concierge was refused:\n{}",
        forbidden.join("\n")
    );
    Ok(())
}

/// Runs the real kubectl with `kubeconfig` and the password flow's environment variables (the
/// exec plugin inherits them); returns stdout, or fails with stderr.
async fn kubectl_as_pinny(
    cluster: &Cluster,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(cluster.kubectl().binary())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .env("PINNIPED_USERNAME", "pinny@example.com")
        .env("PINNIPED_PASSWORD", "password123")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "kubectl {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// The Concierge and the CLI together, as a user meets them: on the installed Concierge,
/// `selkie get kubeconfig` reads the CredentialIssuer the Concierge maintains and its
/// JWTAuthenticator and writes a kubeconfig for the impersonation proxy; kubectl with it logs in
/// to Dex with the password flow, exchanges the ID token at the proxy, and works through it; the
/// next calls reuse the caches without another TokenCredentialRequest.
#[tokio::test]
async fn deployment_strategy_dynamic_cluster_authentication_jwt_get_kubeconfig_for_the_installed_concierge_logs_kubectl_in(
) -> anyhow::Result<()> {
    let cluster = &Cluster::start().await?;
    let concierge = InstalledConcierge::install(cluster).await?;
    let dex = Dex::start(&[DexUser::pinny()]).await?;
    concierge
        .apply_jwt_authenticator(cluster, "dex", dex.issuer(), PUBLIC_CLIENT_ID, &dex.ca_pem())
        .await?;
    let (proxy_endpoint, _) = concierge.expose_proxy(cluster).await?;
    crate::proxy_kubectl::grant_namespace_reading(cluster, "ops").await?;

    let dir = concierge.dir();
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let started = std::time::Instant::now();
    let output = tokio::process::Command::new(selkie)
        .args([
            "get",
            "kubeconfig",
            &format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
            &format!("--oidc-session-cache={}", dir.join("sessions.yaml").display()),
            &format!("--credential-cache={}", dir.join("credentials.yaml").display()),
            "--oidc-scopes=openid,offline_access,email,groups",
            "--upstream-identity-provider-flow=cli_password",
            "--timeout=60s",
        ])
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "selkie get kubeconfig failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let kubeconfig: Value = serde_yaml::from_slice(&output.stdout)?;
    assert_eq!(
        kubeconfig["clusters"][0]["cluster"]["server"],
        proxy_endpoint.as_str(),
        "{kubeconfig}"
    );
    let path = dir.join("pinny.kubeconfig");
    std::fs::write(&path, &output.stdout)?;
    eprintln!(
        "selkie get kubeconfig took {:?}:\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&output.stderr)
    );
    let started = std::time::Instant::now();

    let namespaces = kubectl_as_pinny(cluster, &path, &["get", "namespaces", "-o", "name"]).await?;
    assert!(
        namespaces.contains("namespace/pinniped-concierge"),
        "{namespaces}"
    );
    eprintln!("the first kubectl call (the login) took {:?}", started.elapsed());
    let seen: Value =
        serde_json::from_str(&kubectl_as_pinny(cluster, &path, &["auth", "whoami", "-o", "json"]).await?)?;
    assert_dex_user(&seen)?;
    let logins = || {
        concierge
            .process()
            .log()
            .lines()
            .filter(|line| line.contains("token credential request"))
            .count()
    };
    let after_login = logins();
    ensure!(after_login >= 1, "no TokenCredentialRequest reached the proxy");
    kubectl_as_pinny(cluster, &path, &["get", "namespaces"]).await?;
    assert_eq!(
        logins(),
        after_login,
        "the cached credential serves the next call"
    );
    Ok(())
}

/// The cluster signing key read from files on a control-plane node (kube-controller-manager's
/// `--cluster-signing-{cert,key}-file`), an RSA-2048 CA with a PKCS#1 key as kubeadm makes it:
/// certificates it issues (through a P-256 intermediate it signs with SHA-256 and RSA) work
/// directly against kube-apiserver, the
/// strategy says so, and a broken rewrite of the files keeps the last good key signing while the
/// strategy reports the failure.
#[tokio::test]
async fn the_cluster_signing_key_is_read_from_files_on_the_node() -> anyhow::Result<()> {
    use rustls_pki_types::pem::PemObject as _;
    use selkie_control_plane::{config::ControlPlaneConfig, published::Publisher, signing};
    use std::sync::{Arc, Mutex};
    use x509_cert::der::Decode as _;

    let cluster = &Cluster::builder().rsa_client_ca().start().await?;
    ensure!(cluster
        .pki()
        .client_ca
        .key_pem()
        .starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "signing-files").await?;
    let dir = tempfile::tempdir()?;
    let (cert_file, key_file) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    std::fs::write(&cert_file, cluster.pki().client_ca.cert_pem())?;
    std::fs::write(&key_file, cluster.pki().client_ca.key_pem())?;
    let cluster_info = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": serde_yaml::to_string(&json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "", "cluster": {"server": cluster.server_url(),
                "certificate-authority-data": B64.encode(cluster.pki().server_ca.cert_pem())}}]}))?}})
    .to_string();
    cluster
        .kubectl()
        .run_with_stdin(&["create", "-f", "-"], Some(&cluster_info))
        .await?;

    let config: ControlPlaneConfig = serde_json::from_value(json!({
        "namespace": namespace,
        "clusterSigningKey": {"files": {"certFile": cert_file, "keyFile": key_file}},
    }))?;
    config.validate()?;
    let publisher = Publisher::new();
    let strategies = Arc::new(Mutex::new(Vec::new()));
    let (_leader_sender, leader) = tokio::sync::watch::channel(true);
    let recorded = strategies.clone();
    let signing = tokio::spawn(signing::run(
        client,
        Arc::new(config),
        publisher.clone(),
        leader,
        move |strategy| {
            recorded.lock().expect("not poisoned").push(strategy);
            async { Ok(()) }
        },
    ));
    let last_strategy = || strategies.lock().expect("not poisoned").last().cloned();

    let signer = eventually(Duration::from_secs(20), || async {
        let strategy = last_strategy().context("no strategy yet")?;
        ensure!(
            serde_json::to_value(&strategy)?["reason"] == "FetchedKey",
            "{strategy:?}"
        );
        publisher.login_api().signer().context("no signer yet")
    })
    .await?;
    let now = std::time::SystemTime::now();
    let issued = signer.issue(
        "files-user",
        &["files-group"][..],
        now - Duration::from_secs(60),
        now + Duration::from_secs(300),
    )?;
    // The client certificate (ECDSA with SHA-256), then the P-256 intermediate the RSA CA signed
    // (SHA-256 with RSA): kube-apiserver verifies the chain to its client CA.
    let algorithms = rustls_pki_types::CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .map(|der| {
            let certificate = x509_cert::Certificate::from_der(&der?)?;
            anyhow::Ok(certificate.signature_algorithm.oid.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    assert_eq!(
        algorithms,
        ["1.2.840.10045.4.3.2", "1.2.840.113549.1.1.11"],
        "ecdsa-with-SHA256, then sha256WithRSAEncryption"
    );
    let installation = Installation {
        cluster,
        namespace,
        suffix: "pinniped.dev".into(),
        dir,
    };
    let direct = installation.kubeconfig(
        "files-user",
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        cert_user(&issued.cert_pem, &issued.key_pem),
    )?;
    let seen = whoami(&cluster.kubectl().with_kubeconfig(&direct)).await?;
    assert_eq!(seen["status"]["userInfo"]["username"], "files-user", "{seen}");

    // A broken rewrite: the strategy says so, the last good key keeps signing.
    std::fs::write(&key_file, "not a key")?;
    eventually(Duration::from_secs(20), || async {
        let strategy = last_strategy().context("no strategy")?;
        ensure!(
            serde_json::to_value(&strategy)?["reason"] == "CouldNotFetchKey",
            "{strategy:?}"
        );
        Ok(())
    })
    .await?;
    let still = publisher.login_api().signer().context("the signer is gone")?;
    assert!(Arc::ptr_eq(&still, &signer), "the last good key keeps signing");
    signing.abort();
    Ok(())
}

/// A WebhookAuthenticator pointed at kube-apiserver's own TokenReview endpoint, applied with
/// kubectl: a real service-account token's identity always has a UID, so by default (Pinniped's
/// rule) it gets no certificate; with Selkie's `certificateIdentity: UsernameAndGroups` the same
/// token is exchanged for a certificate of the service account's name and groups, which kubectl
/// uses against kube-apiserver with the service account's RBAC. A value the CRD does not know is
/// refused by kube-apiserver and leaves the working authenticator in place.
#[tokio::test]
async fn deployment_strategy_dynamic_cluster_authentication_webhook_on_kube_apiservers_token_review_exchanges_service_account_tokens(
) -> anyhow::Result<()> {
    let cluster = &Cluster::start().await?;
    let aggregated_port = free_port()?;
    let installation = Installation::install(cluster, aggregated_port).await?;
    let replica = installation
        .start_replica("replica-a", aggregated_port, None)
        .await?;
    let ns = installation.namespace.clone();
    let kubectl = cluster.kubectl();
    // Pinniped's WebhookAuthenticator sends no credential of its own: let anonymous callers
    // create TokenReviews (this private cluster only).
    kubectl
        .run(&[
            "create",
            "clusterrole",
            "anonymous-token-review",
            "--verb=create",
            "--resource=tokenreviews.authentication.k8s.io",
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "clusterrolebinding",
            "anonymous-token-review",
            "--clusterrole=anonymous-token-review",
            "--group=system:unauthenticated",
        ])
        .await?;
    kubectl
        .run(&["create", "serviceaccount", "robot", "-n", &ns])
        .await?;
    // A Role of its own (the aggregated `view` ClusterRole stays empty without
    // kube-controller-manager).
    kubectl
        .run(&[
            "create",
            "role",
            "configmap-reader",
            "--verb=get,list",
            "--resource=configmaps",
            "-n",
            &ns,
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "rolebinding",
            "robot-reads-configmaps",
            "--role=configmap-reader",
            &format!("--serviceaccount={ns}:robot"),
            "-n",
            &ns,
        ])
        .await?;
    let token = kubectl
        .run(&["create", "token", "robot", "-n", &ns, "--duration=10m"])
        .await?
        .trim()
        .to_string();
    let service_account = format!("system:serviceaccount:{ns}:robot");

    let resource = format!(
        "webhookauthenticators.{}",
        installation.group("authentication.concierge")
    );
    let authenticator = |certificate_identity: Option<&str>| {
        let mut spec = json!({
            "endpoint": format!("{}/apis/authentication.k8s.io/v1/tokenreviews", cluster.server_url()),
            "tls": {"certificateAuthorityData": B64.encode(cluster.pki().server_ca.cert_pem())},
        });
        if let Some(value) = certificate_identity {
            spec["certificateIdentity"] = json!(value);
        }
        json!({
            "apiVersion": format!("{}/v1alpha1", installation.group("authentication.concierge")),
            "kind": "WebhookAuthenticator",
            "metadata": {"name": "kube-apiserver"},
            "spec": spec,
        })
        .to_string()
    };
    let apply = |manifest: String| {
        let kubectl = kubectl.clone();
        async move { kubectl.output(&["apply", "-f", "-"], Some(&manifest)).await }
    };
    let applied = apply(authenticator(None)).await?;
    ensure!(applied.success, "{}", applied.stderr);
    installation
        .wait_ready(&resource, "kube-apiserver")
        .await
        .map_err(|e| crate::with_log(e, replica.log()))?;

    let anonymous = installation.anonymous_to_cluster()?;
    let request = installation.token_credential_request_for(&token, "WebhookAuthenticator", "kube-apiserver");
    // Ready and published: the identity (with its UID) is refused with Pinniped's answer.
    let refused = eventually(Duration::from_secs(60), || async {
        installation
            .post_token_credential_request(&anonymous, &request)
            .await
    })
    .await
    .map_err(|e| crate::with_log(e, replica.log()))?;
    let refused: Value = serde_json::from_str(&refused)?;
    assert_eq!(refused["status"]["message"], "authentication failed", "{refused}");
    assert!(refused["status"].get("credential").is_none(), "{refused}");
    assert!(!refused.to_string().contains(&token), "the token is never echoed");
    // The refusal is the UID rule's, not an authentication failure: the audit line says the
    // service account authenticated and was not issued a certificate.
    eventually(Duration::from_secs(10), || async {
        let log = replica.log();
        ensure!(
            log.lines().any(|line| line.contains("token credential request")
                && line.contains(&service_account)
                && line.contains("\"issued\":false")),
            "no audit line of the refused service account in:\n{log}"
        );
        Ok(())
    })
    .await?;

    // GitOps: the same authenticator with Selkie's extension issues the certificate.
    let applied = apply(authenticator(Some("UsernameAndGroups"))).await?;
    ensure!(applied.success, "{}", applied.stderr);
    let answer = installation
        .wait_for_credential(&anonymous, &request, Duration::from_secs(30))
        .await
        .map_err(|e| crate::with_log(e, replica.log()))?;
    assert!(!answer.contains(&token), "the token is never echoed");
    let (cert, key) = credential(&answer)?;
    let as_robot = cluster.kubectl().with_kubeconfig(&installation.kubeconfig(
        "robot",
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        cert_user(&cert, &key),
    )?);
    let who = whoami(&as_robot).await?;
    let user = &who["status"]["userInfo"];
    assert_eq!(user["username"], service_account.as_str(), "{who}");
    assert!(user.get("uid").is_none(), "a certificate carries no UID: {who}");
    // Nor the token's extras: kube-apiserver adds only its own credential id of the certificate.
    let extra = user["extra"].as_object().cloned().unwrap_or_default();
    assert!(
        extra
            .keys()
            .all(|key| key == "authentication.kubernetes.io/credential-id")
            && extra
                .values()
                .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                .all(|id| id.as_str().is_some_and(|id| id.starts_with("X509SHA256="))),
        "only the certificate's credential id: {who}"
    );
    let groups: Vec<&str> = user["groups"]
        .as_array()
        .context("no groups")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for group in ["system:serviceaccounts", &format!("system:serviceaccounts:{ns}")] {
        assert!(groups.contains(&group), "{group} missing: {who}");
    }
    // The service account's RBAC applies to the certificate: it may read its namespace's
    // ConfigMaps and nothing cluster-wide.
    as_robot.run(&["get", "configmaps", "-n", &ns]).await?;
    let denied = as_robot.output(&["get", "nodes"], None).await?;
    assert!(
        !denied.success && denied.stderr.contains("forbidden"),
        "{}",
        denied.stderr
    );
    let log = replica.log();
    assert!(
        log.lines().any(|line| line.contains("token credential request")
            && line.contains(&service_account)
            && line.contains("\"omitted_uid_and_extra\":true")),
        "the audit line says what the certificate left out:\n{log}"
    );
    assert!(!log.contains(&token), "the token is never logged");

    // A value the CRD does not know: kube-apiserver refuses it, and logins go on.
    let bad = apply(authenticator(Some("Sometimes"))).await?;
    assert!(!bad.success, "an unknown certificateIdentity was accepted");
    assert!(
        bad.stderr.contains("certificateIdentity") && bad.stderr.contains("Unsupported value"),
        "{}",
        bad.stderr
    );
    let answer = installation
        .post_token_credential_request(&anonymous, &request)
        .await?;
    credential(&answer)?;
    Ok(())
}
