//! The Concierge's aggregated API server (`selkie_control_plane::aggregated_api`), run in process
//! and reached **through kube-apiserver's aggregation layer** as Pinniped's is: the test plays
//! the install manifests (an ExternalName Service to `localhost`, the two APIServices without a
//! caBundle, Pinniped's `pre-authn-apis` ClusterRole), the server's leader generates the serving
//! certificate Secret and fills in the caBundle, and kube-apiserver marks the APIServices
//! Available. Each test has its own API group suffix (`<namespace>.e2e.selkie.dev`), so the
//! tests neither share nor fight over APIServices.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use k8s_openapi::{api::core::v1::Secret, kube_aggregator::pkg::apis::apiregistration::v1::APIService};
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, PostParams},
    Api, Client,
};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use selkie_control_plane::{
    aggregated_api::{self, AggregatedApiError},
    config::ControlPlaneConfig,
    published::Publisher,
};
use selkie_e2e::{
    cluster::{client_from_kubeconfig, write_kubeconfig_for_user, ADMIN_USER, FRONT_PROXY_CLIENT_NAME},
    dex::{Dex, DexUser, CLIENT_ID},
    kubectl::Kubectl,
    pki::{CertAndKey, CertificateAuthority},
    watch::ObjectWatch,
    Cluster,
};
use selkie_filters::{
    chain::{Chain, TokenAuthenticator},
    issuing::signer::ClientCertificateSigner,
    jwt::{ClaimMapping, JwtAuthenticator, JwtConfig},
};
use selkie_kube::serving_secret as serving;
use serde_json::{json, Value};
use tokio::{net::TcpStream, sync::oneshot, task::JoinHandle};
use x509_cert::der::DecodePem as _;

use crate::eventually;

/// What kube-apiserver's aggregator asks `/apis` for.
const DISCOVERY_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Deletes the cluster-scoped objects a test created (and its Service), waiting for kubectl, so
/// no unreachable APIService lingers in every later discovery. Failures are ignored: the cluster
/// dies with the test process anyway.
struct Cleanup {
    kubectl: Kubectl,
    admin_kubeconfig: std::path::PathBuf,
    namespace: String,
    objects: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ignored = std::process::Command::new(self.kubectl.binary())
            .env("KUBECONFIG", &self.admin_kubeconfig)
            .env(
                "KUBECACHEDIR",
                self.admin_kubeconfig.with_extension("kubectl-cache"),
            )
            .args([
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "-n",
                &self.namespace,
            ])
            .args(&self.objects)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// One replica of the aggregated API server, running in this process on a loopback port.
struct Replica {
    port: u16,
    leader: tokio::sync::watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), AggregatedApiError>>>,
}

impl Replica {
    async fn start(
        client: &Client,
        config: &Arc<ControlPlaneConfig>,
        publisher: &Publisher,
        leader: bool,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (stop, stopped) = oneshot::channel::<()>();
        let (leader, leading) = tokio::sync::watch::channel(leader);
        let task = tokio::spawn(aggregated_api::serve_on(
            listener,
            client.clone(),
            config.clone(),
            publisher.clone(),
            leading,
            async move {
                let _stopped = stopped.await;
            },
        ));
        Ok(Self {
            port,
            leader,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Stops the replica and checks that it returns cleanly.
    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ignored = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), task).await???;
        }
        Ok(())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A running aggregated API server (its leading replica), registered with the shared cluster.
struct Concierge {
    namespace: String,
    config: Arc<ControlPlaneConfig>,
    names: selkie_kube::aggregated::server::Names,
    publisher: Publisher,
    port: u16,
    login_group: String,
    identity_group: String,
    replica: Option<Replica>,
    _cleanup: Cleanup,
}

impl Concierge {
    /// Starts the server (this replica leads), applies the install manifests and waits until both
    /// APIServices are Available.
    async fn start(cluster: &Cluster, client: &Client, prefix: &str) -> anyhow::Result<Self> {
        selkie_e2e::install_crypto_provider();
        let namespace = cluster.create_namespace(client, prefix).await?;
        let suffix = format!("{namespace}.e2e.selkie.dev");
        let config: ControlPlaneConfig = serde_json::from_value(json!({
            "namespace": namespace,
            "apiGroupSuffix": suffix,
            "aggregatedApi": {"listen": "127.0.0.1:0"},
        }))?;
        config.validate()?;
        let config = Arc::new(config);
        let names = aggregated_api::names(&config);
        let login_group = config.group("login.concierge.pinniped.dev");
        let identity_group = config.group("identity.concierge.pinniped.dev");
        let publisher = Publisher::new();
        let replica = Replica::start(client, &config, &publisher, true).await?;
        let port = replica.port;

        let pre_authn = format!("{namespace}-pre-authn-apis");
        let kubectl = cluster.kubectl();
        let cleanup = Cleanup {
            kubectl: kubectl.clone(),
            admin_kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
            namespace: namespace.clone(),
            objects: names
                .api_services
                .iter()
                .map(|name| format!("apiservice/{name}"))
                .chain([
                    format!("clusterrole/{pre_authn}"),
                    format!("clusterrolebinding/{pre_authn}"),
                    format!("service/{}", names.service),
                ])
                .collect(),
        };
        let api_service = |group: &str| {
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                   "metadata": {"name": format!("v1alpha1.{group}")},
                   "spec": {"group": group, "version": "v1alpha1", "groupPriorityMinimum": 9900,
                            "versionPriority": 15,
                            "service": {"name": names.service, "namespace": namespace, "port": port}}})
        };
        // Pinniped's install manifests, minus the Deployment: the server runs in this process.
        let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": names.service, "namespace": namespace},
             "spec": {"type": "ExternalName", "externalName": "localhost"}},
            api_service(&login_group),
            api_service(&identity_group),
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": pre_authn},
             "rules": [{"apiGroups": [login_group], "resources": ["tokencredentialrequests"],
                        "verbs": ["create", "list"]},
                       {"apiGroups": [identity_group], "resources": ["whoamirequests"],
                        "verbs": ["create"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": pre_authn},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": pre_authn},
             "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]},
        ]});
        kubectl
            .run_with_stdin(&["apply", "-f", "-"], Some(&manifests.to_string()))
            .await?;
        let concierge = Concierge {
            namespace,
            names,
            publisher,
            config,
            port,
            login_group,
            identity_group,
            replica: Some(replica),
            _cleanup: cleanup,
        };
        for name in &concierge.names.api_services {
            concierge.wait_available(&kubectl, name).await?;
        }
        Ok(concierge)
    }

    async fn wait_available(&self, kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
        let wait = kubectl
            .output(
                &[
                    "wait",
                    "--for=condition=Available",
                    &format!("apiservice/{name}"),
                    "--timeout=60s",
                ],
                None,
            )
            .await?;
        if !wait.success {
            let status = kubectl
                .output(&["get", "apiservice", name, "-o", "yaml"], None)
                .await?;
            anyhow::bail!(
                "APIService {name} never became Available: {}\n{}",
                wait.stderr,
                status.stdout
            );
        }
        Ok(())
    }

    fn tcr_path(&self) -> String {
        format!("/apis/{}/v1alpha1/tokencredentialrequests", self.login_group)
    }

    fn whoami_path(&self) -> String {
        format!("/apis/{}/v1alpha1/whoamirequests", self.identity_group)
    }

    fn tcr(&self, token: &str, kind: &str, name: &str) -> Value {
        json!({
            "apiVersion": format!("{}/v1alpha1", self.login_group),
            "kind": "TokenCredentialRequest",
            "metadata": {"creationTimestamp": null},
            "spec": {"token": token, "authenticator": {
                "apiGroup": self.login_group.replace("login.", "authentication."),
                "kind": kind, "name": name}},
        })
    }

    fn whoami(&self) -> String {
        json!({"apiVersion": format!("{}/v1alpha1", self.identity_group), "kind": "WhoAmIRequest", "spec": {}})
            .to_string()
    }

    /// The serving-certificate Secret as the leader wrote it.
    async fn secret(&self, client: &Client) -> anyhow::Result<serving::ServingMaterial> {
        let secret = Api::<Secret>::namespaced(client.clone(), &self.namespace)
            .get(&self.names.secret)
            .await?;
        serving::ServingMaterial::from_secret(&secret).map_err(anyhow::Error::msg)
    }

    /// Stops the server and checks that it returns cleanly; the APIServices stay registered
    /// until `self` is dropped.
    async fn stop(&mut self) -> anyhow::Result<()> {
        match self.replica.take() {
            Some(replica) => replica.stop().await,
            None => Ok(()),
        }
    }
}

/// kubectl with no credential kube-apiserver accepts: it is `system:anonymous` there. The user
/// entry has only a user name, which kubectl sends as HTTP basic authentication with an empty
/// password — something kube-apiserver has no authenticator for — because a user entry with
/// nothing at all makes kubectl prompt on stdin for a password (and stdin carries the body).
fn anonymous_kubectl(cluster: &Cluster) -> anyhow::Result<Kubectl> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = cluster.dir().join(format!("aggapi-anonymous-{n}.kubeconfig"));
    write_kubeconfig_for_user(
        &path,
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        "anonymous",
        json!({"username": "nobody"}),
    )?;
    Ok(cluster.kubectl().with_kubeconfig(&path))
}

/// `kubectl create --raw <path> -f -`: POSTs `body` through kube-apiserver and returns the answer.
async fn create_raw(kubectl: &Kubectl, path: &str, body: &str) -> anyhow::Result<Value> {
    let out = kubectl
        .run_with_stdin(&["create", "--raw", path, "-f", "-"], Some(body))
        .await?;
    Ok(serde_json::from_str(&out)?)
}

/// The issued credential of a TokenCredentialRequest answer.
fn credential(answer: &Value) -> anyhow::Result<CertAndKey> {
    let credential = &answer["status"]["credential"];
    let field = |name: &str| {
        credential[name]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no {name} in {}", redact(answer)))
    };
    Ok(CertAndKey {
        cert_pem: field("clientCertificateData")?,
        key_pem: field("clientKeyData")?,
    })
}

/// An answer with its key material replaced, for error messages.
fn redact(answer: &Value) -> String {
    let mut answer = answer.clone();
    if let Some(credential) = answer["status"]["credential"].as_object_mut() {
        credential.insert("clientKeyData".into(), json!("<redacted>"));
    }
    answer.to_string()
}

/// CN, every O, and how long after now the certificate expires.
fn subject_and_lifetime(pem: &str) -> anyhow::Result<(String, Vec<String>, Duration, Duration)> {
    let certificate = x509_cert::Certificate::from_pem(pem.as_bytes())?;
    let mut common_name = String::new();
    let mut organizations = Vec::new();
    for rdn in certificate.tbs_certificate.subject.0.iter() {
        for attribute in rdn.0.iter() {
            let value = x509_cert::der::asn1::Utf8StringRef::try_from(&attribute.value)
                .map(|s| s.as_str().to_string())
                .or_else(|_| {
                    x509_cert::der::asn1::PrintableStringRef::try_from(&attribute.value)
                        .map(|s| s.as_str().to_string())
                })?;
            match attribute.oid.to_string().as_str() {
                "2.5.4.3" => common_name = value,
                "2.5.4.10" => organizations.push(value),
                _ => {}
            }
        }
    }
    let validity = &certificate.tbs_certificate.validity;
    let now = SystemTime::now();
    let not_after = validity.not_after.to_system_time();
    let not_before = validity.not_before.to_system_time();
    Ok((
        common_name,
        organizations,
        not_after.duration_since(now).unwrap_or_default(),
        now.duration_since(not_before).unwrap_or_default(),
    ))
}

fn dex_user() -> DexUser {
    DexUser {
        email: "walrus@example.com".into(),
        password: "password123".into(),
        user_id: "8c3f5b1e-aggregated-api".into(),
        groups: vec!["ops".into(), "devs".into()],
    }
}

/// A JWTAuthenticator named `dex` for Dex's ID tokens, as Pinniped documents it: audience =
/// client id, username from `email`, groups from `groups`.
fn dex_chain(dex: &Dex) -> anyhow::Result<Chain> {
    let mut config = JwtConfig::new("dex", dex.issuer(), CLIENT_ID);
    config.username = ClaimMapping::claim("email").into();
    config.groups = Some(ClaimMapping::claim("groups").into());
    config.ca_bundle_pem = Some(dex.ca_pem());
    let jwt = JwtAuthenticator::new(config)?;
    Ok(Chain::new(vec![TokenAuthenticator::Jwt(Arc::new(jwt))]))
}

/// One HTTPS request straight to the listener (not through kube-apiserver), trusting `ca_pem`
/// and verifying the certificate for `server_name`, presenting `identity` if given. Returns the
/// status, the body as JSON, and the served leaf certificate.
#[allow(
    clippy::too_many_arguments,
    reason = "a test helper that spells out one request"
)]
async fn direct(
    port: u16,
    server_name: &str,
    ca_pem: &str,
    identity: Option<&CertAndKey>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> anyhow::Result<(u16, Value, CertificateDer<'static>)> {
    let tls = tls_connect(port, server_name, ca_pem, identity, None, &[b"http/1.1"]).await?;
    let served = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.clone().into_owned())
        .ok_or_else(|| anyhow::anyhow!("no server certificate"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", server_name)
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::from(body.to_string())))?)
        .await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await?.to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok((status, value, served))
}

async fn tls_connect(
    port: u16,
    server_name: &str,
    ca_pem: &str,
    identity: Option<&CertAndKey>,
    versions: Option<&[&'static rustls::SupportedProtocolVersion]>,
    alpn: &[&[u8]],
) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(versions.unwrap_or(rustls::DEFAULT_VERSIONS))?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(identity) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(connector
        .connect(ServerName::try_from(server_name.to_string())?, tcp)
        .await?)
}

#[tokio::test]
async fn token_credential_requests_through_kube_apiserver_issue_certificates_kubectl_can_use(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let mut concierge = Concierge::start(cluster, &client, "aggapi-login").await?;
    let user = dex_user();
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    let chain = dex_chain(&dex)?;
    concierge.publisher.update(|published| {
        published.chain = chain;
        true
    });
    // The cluster-signing-key strategy: certificates of kube-apiserver's own client CA.
    let client_ca = &cluster.pki().client_ca;
    let signer = ClientCertificateSigner::from_pem(&client_ca.cert_pem(), &client_ca.key_pem())?;
    concierge.publisher.login_api().set_signer(Some(Arc::new(signer)));
    let token = dex.password_grant(&user.email, &user.password).await?.id_token;
    let tcr_path = concierge.tcr_path();

    // The real kubectl, anonymous (no credentials at all), through kube-apiserver.
    let anonymous = anonymous_kubectl(cluster)?;
    let body = concierge.tcr(&token, "JWTAuthenticator", "dex").to_string();
    let answer = eventually(Duration::from_secs(20), || async {
        create_raw(&anonymous, &tcr_path, &body).await
    })
    .await?;
    assert_eq!(answer["kind"], "TokenCredentialRequest", "{}", redact(&answer));
    assert!(
        !answer.to_string().contains(&token),
        "the token is never sent back"
    );
    let issued = credential(&answer)?;
    let (cn, groups, expires_in, age) = subject_and_lifetime(&issued.cert_pem)?;
    assert_eq!(cn, user.email);
    assert_eq!(groups, user.groups);
    assert!(
        expires_in <= Duration::from_secs(300) && expires_in > Duration::from_secs(240),
        "{expires_in:?}"
    );
    assert!(age >= Duration::from_secs(295), "backdated 5 minutes: {age:?}");

    // The same token with an authenticator reference in another API group, or in none, names no
    // authenticator, as in Pinniped.
    for api_group in [
        None,
        Some("authentication.concierge.example.com".to_string()),
        Some(concierge.login_group.clone()),
    ] {
        let mut request = concierge.tcr(&token, "JWTAuthenticator", "dex");
        match &api_group {
            Some(group) => request["spec"]["authenticator"]["apiGroup"] = json!(group),
            None => {
                request["spec"]["authenticator"]
                    .as_object_mut()
                    .map(|reference| reference.remove("apiGroup"));
            }
        }
        let refused = create_raw(&anonymous, &tcr_path, &request.to_string()).await?;
        assert_eq!(
            refused["status"],
            json!({"message": "authentication failed"}),
            "apiGroup {api_group:?}: {}",
            redact(&refused)
        );
    }

    // kubectl with that certificate works directly against kube-apiserver.
    let as_dex_user = cluster
        .kubectl()
        .with_kubeconfig(&cluster.kubeconfig_with(&issued)?);
    let whoami: Value = serde_json::from_str(&as_dex_user.run(&["auth", "whoami", "-o", "json"]).await?)?;
    assert_eq!(
        whoami["status"]["userInfo"]["username"],
        user.email.as_str(),
        "{whoami}"
    );
    assert_eq!(
        whoami["status"]["userInfo"]["groups"],
        json!(["ops", "devs", "system:authenticated"]),
        "{whoami}"
    );
    as_dex_user.run(&["get", "--raw", "/api"]).await?;

    // `kubectl create -f -` with discovery, as an ordinary user of the cluster.
    let plain_kubeconfig = cluster.user_kubeconfig("aggapi-plain-user", &[])?;
    let plain = cluster.kubectl().with_kubeconfig(&plain_kubeconfig);
    let created = plain
        .run_with_stdin(&["create", "-f", "-", "-o", "json"], Some(&body))
        .await?;
    let created: Value = serde_json::from_str(&created)?;
    let (cn, _, _, _) = subject_and_lifetime(&credential(&created)?.cert_pem)?;
    assert_eq!(cn, user.email);
    // Pinniped's no-op list, through discovery.
    let listed = plain
        .run(&[
            "get",
            &format!("tokencredentialrequests.{}", concierge.login_group),
            "-o",
            "json",
        ])
        .await?;
    assert_eq!(serde_json::from_str::<Value>(&listed)?["items"], json!([]));

    // A kube client.
    let resource = ApiResource {
        group: concierge.login_group.clone(),
        version: "v1alpha1".into(),
        api_version: format!("{}/v1alpha1", concierge.login_group),
        kind: "TokenCredentialRequest".into(),
        plural: "tokencredentialrequests".into(),
    };
    let kube_client = client_from_kubeconfig(&plain_kubeconfig).await?;
    let request: DynamicObject = serde_json::from_value(concierge.tcr(&token, "JWTAuthenticator", "dex"))?;
    let created = Api::<DynamicObject>::all_with(kube_client, &resource)
        .create(&PostParams::default(), &request)
        .await?;
    let created = serde_json::to_value(&created)?;
    let (cn, groups, _, _) = subject_and_lifetime(&credential(&created)?.cert_pem)?;
    assert_eq!((cn, groups), (user.email.clone(), user.groups.clone()));

    // A kube client with no credential at all (no Authorization header, no certificate).
    let mut anonymous_config = kube::Config::new(cluster.server_url().parse()?);
    anonymous_config.root_cert = Some(vec![CertificateDer::from_pem_slice(
        cluster.pki().server_ca.cert_pem().as_bytes(),
    )?
    .to_vec()]);
    let anonymous_client = Client::try_from(anonymous_config)?;
    let created = Api::<DynamicObject>::all_with(anonymous_client, &resource)
        .create(&PostParams::default(), &request)
        .await?;
    let (cn, _, _, _) = subject_and_lifetime(&credential(&serde_json::to_value(&created)?)?.cert_pem)?;
    assert_eq!(cn, user.email);

    // Refused logins are still 201, with Pinniped's opaque message.
    let refused = [
        (
            "a bad token",
            concierge.tcr("not-a-jwt", "JWTAuthenticator", "dex"),
        ),
        ("an empty token", concierge.tcr("", "JWTAuthenticator", "dex")),
        (
            "an unknown authenticator",
            concierge.tcr(&token, "JWTAuthenticator", "nope"),
        ),
        (
            "another kind",
            concierge.tcr(&token, "WebhookAuthenticator", "dex"),
        ),
    ];
    for (what, request) in refused {
        let answer = create_raw(&anonymous, &tcr_path, &request.to_string()).await?;
        assert_eq!(
            answer["status"]["message"],
            "authentication failed",
            "{what}: {}",
            redact(&answer)
        );
        assert!(
            answer["status"].get("credential").is_none(),
            "{what}: {}",
            redact(&answer)
        );
    }

    // A malformed body: a metav1.Status, relayed by kube-apiserver.
    let malformed = anonymous
        .output(
            &["create", "--raw", &tcr_path, "-f", "-"],
            Some("{\"spec\": not json"),
        )
        .await?;
    assert!(!malformed.success);
    assert!(
        malformed.stderr.contains("the request body is not valid JSON"),
        "{}",
        malformed.stderr
    );
    let wrong_kind = anonymous
        .output(
            &["create", "--raw", &tcr_path, "-f", "-"],
            Some(&concierge.whoami()),
        )
        .await?;
    assert!(!wrong_kind.success);
    assert!(
        wrong_kind.stderr.contains("does not match the expected"),
        "{}",
        wrong_kind.stderr
    );

    concierge.stop().await
}

#[tokio::test]
async fn who_am_i_reports_the_front_proxy_user_and_forged_headers_are_not_trusted() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let mut concierge = Concierge::start(cluster, &client, "aggapi-whoami").await?;
    let whoami_path = concierge.whoami_path();
    let body = concierge.whoami();
    let user_info = |answer: &Value| answer["status"]["kubernetesUserInfo"]["user"].clone();

    // Through kube-apiserver, which authenticates the caller and passes it in X-Remote-* headers.
    let alice = cluster
        .kubectl()
        .with_kubeconfig(&cluster.user_kubeconfig("alice", &["devs", "qa"])?);
    let answer = eventually(Duration::from_secs(20), || async {
        create_raw(&alice, &whoami_path, &body).await
    })
    .await?;
    assert_eq!(answer["kind"], "WhoAmIRequest");
    let alice_info = user_info(&answer);
    assert_eq!(alice_info["username"], "alice", "{answer}");
    assert_eq!(
        alice_info["groups"],
        json!(["devs", "qa", "system:authenticated"]),
        "{answer}"
    );
    // kube-apiserver names the certificate in an extra, which the front proxy passes on too.
    let credential_id = &alice_info["extra"]["authentication.kubernetes.io/credential-id"][0];
    assert!(
        credential_id
            .as_str()
            .is_some_and(|id| id.starts_with("X509SHA256=")),
        "{answer}"
    );
    let answer = create_raw(&anonymous_kubectl(cluster)?, &whoami_path, &body).await?;
    assert_eq!(
        user_info(&answer),
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
    );
    let whoami_resource = ApiResource {
        group: concierge.identity_group.clone(),
        version: "v1alpha1".into(),
        api_version: format!("{}/v1alpha1", concierge.identity_group),
        kind: "WhoAmIRequest".into(),
        plural: "whoamirequests".into(),
    };
    let mut anonymous_config = kube::Config::new(cluster.server_url().parse()?);
    anonymous_config.root_cert = Some(vec![CertificateDer::from_pem_slice(
        cluster.pki().server_ca.cert_pem().as_bytes(),
    )?
    .to_vec()]);
    let answer = Api::<DynamicObject>::all_with(Client::try_from(anonymous_config)?, &whoami_resource)
        .create(&PostParams::default(), &serde_json::from_str(&body)?)
        .await?;
    assert_eq!(
        user_info(&serde_json::to_value(&answer)?),
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]}),
        "a kube client without any credential"
    );
    // Impersonation is resolved by kube-apiserver; the extras come through X-Remote-Extra-*.
    let impersonated = cluster
        .kubectl()
        .run_with_stdin(
            &[
                "create",
                "--raw",
                &whoami_path,
                "-f",
                "-",
                "--as=bob",
                "--as-group=auditors",
                "--as-uid=b0b",
                "--as-user-extra=acme.com/project=blue",
            ],
            Some(&body),
        )
        .await?;
    let impersonated: Value = serde_json::from_str(&impersonated)?;
    let info = user_info(&impersonated);
    assert_eq!(info["username"], "bob");
    assert_eq!(info["uid"], "b0b");
    assert_eq!(info["groups"], json!(["auditors", "system:authenticated"]));
    assert_eq!(info["extra"]["acme.com/project"], json!(["blue"]), "{info}");
    // A kube client as the admin.
    let admin = serde_json::to_value(
        Api::<DynamicObject>::all_with(
            client.clone(),
            &ApiResource {
                group: concierge.identity_group.clone(),
                version: "v1alpha1".into(),
                api_version: format!("{}/v1alpha1", concierge.identity_group),
                kind: "WhoAmIRequest".into(),
                plural: "whoamirequests".into(),
            },
        )
        .create(&PostParams::default(), &serde_json::from_str(&body)?)
        .await?,
    )?;
    assert_eq!(user_info(&admin)["username"], ADMIN_USER);

    // Straight to the listener: forged headers without the front-proxy certificate mean nothing.
    let material = concierge.secret(&client).await?;
    let name = concierge.names.serving_name.clone();
    let forged = [
        ("x-remote-user", "mallory"),
        ("x-remote-group", "system:masters"),
        ("x-remote-extra-scopes", "everything"),
    ];
    let port = concierge.port;
    let ca = material.ca_bundle_pem.clone();
    let ask = |identity: Option<CertAndKey>| {
        let (name, ca, body, path) = (name.clone(), ca.clone(), body.clone(), whoami_path.clone());
        async move {
            let (status, answer, _) =
                direct(port, &name, &ca, identity.as_ref(), "POST", &path, &forged, &body).await?;
            anyhow::ensure!(status == 201, "{status}: {answer}");
            Ok::<_, anyhow::Error>(answer["status"]["kubernetesUserInfo"]["user"].clone())
        }
    };
    let anonymous = json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]});
    assert_eq!(ask(None).await?, anonymous, "no client certificate");
    let stranger = CertificateAuthority::new("not-the-front-proxy-ca")?;
    assert_eq!(
        ask(Some(stranger.issue_client(FRONT_PROXY_CLIENT_NAME, &[])?)).await?,
        anonymous,
        "a certificate with the right name from the wrong CA"
    );
    let pki = cluster.pki();
    assert_eq!(
        ask(Some(pki.front_proxy_ca.issue_client("not-the-aggregator", &[])?)).await?,
        anonymous,
        "the front-proxy CA, but a name requestheader-allowed-names does not list"
    );
    // A cluster user's certificate is that user, whatever the headers say, named by its
    // credential id as kube-apiserver's x509 authenticator names it.
    let carol = pki.client_ca.issue_client("carol", &["qa"])?;
    let carol_id = crate::proxy_kubectl::certificate_credential_id(&carol.cert_pem)?;
    assert_eq!(
        ask(Some(carol)).await?,
        json!({"username": "carol", "groups": ["qa", "system:authenticated"],
               "extra": {"authentication.kubernetes.io/credential-id": [carol_id]}}),
        "a cluster user's certificate"
    );
    // The control: the real front-proxy certificate makes the same headers count.
    assert_eq!(
        ask(Some(pki.front_proxy_client.clone())).await?,
        json!({"username": "mallory", "groups": ["system:masters", "system:authenticated"],
               "extra": {"scopes": ["everything"]}})
    );

    // Discovery and errors, straight to the listener.
    let (status, document, _) = direct(
        port,
        &name,
        &ca,
        None,
        "GET",
        "/apis",
        &[("accept", DISCOVERY_V2)],
        "",
    )
    .await?;
    assert_eq!(status, 200);
    assert_eq!(document["kind"], "APIGroupDiscoveryList");
    let (status, list, _) = direct(
        port,
        &name,
        &ca,
        None,
        "GET",
        &format!("/apis/{}/v1alpha1", concierge.login_group),
        &[],
        "",
    )
    .await?;
    assert_eq!(status, 200);
    assert_eq!(list["resources"][0]["verbs"], json!(["create", "list"]));
    for (method, path, code, reason) in [
        ("GET", "/apis/nothing.example.com/v1", 404, "NotFound"),
        (
            "POST",
            &*format!(
                "/apis/{}/v1alpha1/namespaces/default/tokencredentialrequests",
                concierge.login_group
            ),
            404,
            "NotFound",
        ),
        ("PUT", &*concierge.tcr_path(), 405, "MethodNotAllowed"),
        ("POST", &*whoami_path, 413, "RequestEntityTooLarge"),
    ] {
        let body = if code == 413 {
            "x".repeat(300 * 1024)
        } else {
            "{}".into()
        };
        let (status, answer, _) = direct(port, &name, &ca, None, method, path, &[], &body).await?;
        assert_eq!(
            (status, answer["kind"].as_str(), answer["reason"].as_str()),
            (code, Some("Status"), Some(reason)),
            "{method} {path}"
        );
    }
    for path in ["/healthz", "/readyz", "/livez"] {
        let (status, _, _) = direct(port, &name, &ca, None, "GET", path, &[], "").await?;
        assert_eq!(status, 200, "{path}");
    }
    // TLS 1.3 only, with h2 offered.
    assert!(
        tls_connect(port, &name, &ca, None, Some(&[&rustls::version::TLS12]), &[b"h2"])
            .await
            .is_err(),
        "TLS 1.2 must be refused"
    );
    let h2 = tls_connect(port, &name, &ca, None, None, &[b"h2", b"http/1.1"]).await?;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

    // kubectl sees both resources through aggregated discovery.
    let resources = cluster
        .kubectl()
        .run(&[
            "api-resources",
            "--api-group",
            &concierge.login_group,
            "-o",
            "wide",
        ])
        .await?;
    assert!(
        resources.contains("tokencredentialrequests") && resources.contains("create,list"),
        "{resources}"
    );

    concierge.stop().await
}

#[tokio::test]
async fn a_deleted_serving_secret_is_regenerated_and_the_api_stays_available() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let mut concierge = Concierge::start(cluster, &client, "aggapi-rotate").await?;
    let before = concierge.secret(&client).await?;
    let api_services = Api::<APIService>::all(client.clone());
    let ca_bundle = |service: APIService| {
        service
            .spec
            .and_then(|spec| spec.ca_bundle)
            .map(|bundle| String::from_utf8_lossy(&bundle.0).into_owned())
            .unwrap_or_default()
    };
    for name in &concierge.names.api_services {
        assert_eq!(
            ca_bundle(api_services.get(name).await?),
            before.ca_bundle_pem,
            "{name}"
        );
    }
    let (status, _, served) = direct(
        concierge.port,
        &concierge.names.serving_name,
        &before.ca_bundle_pem,
        None,
        "GET",
        "/healthz",
        &[],
        "",
    )
    .await?;
    assert_eq!(status, 200);
    let first_leaf = CertificateDer::from_pem_slice(before.cert_pem.as_bytes())?;
    assert_eq!(served, first_leaf, "the Secret's certificate is served");

    // WhoAmIRequests through kube-apiserver all along the rotation.
    let user_kubeconfig = cluster.user_kubeconfig("rotation-watcher", &[])?;
    let user_client = client_from_kubeconfig(&user_kubeconfig).await?;
    let resource = ApiResource {
        group: concierge.identity_group.clone(),
        version: "v1alpha1".into(),
        api_version: format!("{}/v1alpha1", concierge.identity_group),
        kind: "WhoAmIRequest".into(),
        plural: "whoamirequests".into(),
    };
    let request: DynamicObject = serde_json::from_str(&concierge.whoami())?;
    let (done_tx, mut done) = tokio::sync::watch::channel(false);
    let succeeded = Arc::new(AtomicUsize::new(0));
    let prober = tokio::spawn({
        let succeeded = succeeded.clone();
        async move {
            let api = Api::<DynamicObject>::all_with(user_client, &resource);
            let (mut ok, mut failures) = (0usize, Vec::new());
            while !*done.borrow_and_update() {
                match api.create(&PostParams::default(), &request).await {
                    Ok(_) => {
                        ok += 1;
                        succeeded.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => failures.push(error.to_string()),
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = done.changed() => {}
                }
            }
            (ok, failures)
        }
    });

    Api::<Secret>::namespaced(client.clone(), &concierge.namespace)
        .delete(&concierge.names.secret, &DeleteParams::default())
        .await?;
    let after = eventually(Duration::from_secs(30), || async {
        let after = concierge.secret(&client).await?;
        anyhow::ensure!(after.cert_pem != before.cert_pem, "not regenerated yet");
        Ok(after)
    })
    .await?;
    // The new bundle trusts the new CA first and keeps the previous one for the switch.
    let new_ca =
        CertificateDer::pem_slice_iter(after.ca_bundle_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let old_ca =
        CertificateDer::pem_slice_iter(before.ca_bundle_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    assert_eq!(new_ca.len(), 2, "the new CA and the previous one");
    assert_eq!(new_ca[1], old_ca[0]);
    for name in &concierge.names.api_services {
        let name = name.clone();
        let api_services = api_services.clone();
        let expected = after.ca_bundle_pem.clone();
        eventually(Duration::from_secs(10), || async {
            let bundle = ca_bundle(api_services.get(&name).await?);
            anyhow::ensure!(bundle == expected, "{name}'s caBundle has not followed");
            Ok(())
        })
        .await?;
    }
    // The new certificate is served, and verifies with the new CA alone.
    let new_ca_only = String::from_utf8_lossy(
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            B64.encode(&new_ca[0])
        )
        .as_bytes(),
    )
    .into_owned();
    let new_leaf = CertificateDer::from_pem_slice(after.cert_pem.as_bytes())?;
    eventually(Duration::from_secs(10), || async {
        let (_, _, served) = direct(
            concierge.port,
            &concierge.names.serving_name,
            &new_ca_only,
            None,
            "GET",
            "/healthz",
            &[],
            "",
        )
        .await?;
        anyhow::ensure!(served == new_leaf, "the old certificate is still served");
        Ok(())
    })
    .await?;
    // Let the aggregator use the new certificate for twenty more requests, then stop probing.
    let at_switch = succeeded.load(Ordering::Relaxed);
    eventually(Duration::from_secs(30), || async {
        let now = succeeded.load(Ordering::Relaxed);
        anyhow::ensure!(
            now >= at_switch + 20,
            "{} requests since the switch",
            now - at_switch
        );
        Ok(())
    })
    .await?;
    let _ignored = done_tx.send(true);
    let (ok, failures) = prober.await?;
    assert!(ok > 10, "only {ok} WhoAmIRequests went through");
    assert!(
        failures.is_empty(),
        "requests failed during the rotation: {failures:?}"
    );
    for name in &concierge.names.api_services {
        concierge.wait_available(&cluster.kubectl(), name).await?;
    }
    concierge.stop().await
}

#[tokio::test]
async fn a_follower_serves_the_leaders_certificate_never_writes_and_takes_over() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let mut concierge = Concierge::start(cluster, &client, "aggapi-replicas").await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), &concierge.namespace);
    let api_services = Api::<APIService>::all(client.clone());
    let first = concierge.secret(&client).await?;
    let follower = Replica::start(&client, &concierge.config, &concierge.publisher, false).await?;
    let name = concierge.names.serving_name.clone();
    let served_by = |port: u16, ca: String| {
        let name = name.clone();
        async move {
            let (status, _, served) = direct(port, &name, &ca, None, "GET", "/readyz", &[], "").await?;
            anyhow::ensure!(status == 200, "/readyz answered {status}");
            Ok::<_, anyhow::Error>(served)
        }
    };
    let leaf = |material: &serving::ServingMaterial| -> anyhow::Result<CertificateDer<'static>> {
        Ok(CertificateDer::from_pem_slice(material.cert_pem.as_bytes())?)
    };
    let served = eventually(Duration::from_secs(10), || {
        served_by(follower.port, first.ca_bundle_pem.clone())
    })
    .await?;
    assert_eq!(
        served,
        leaf(&first)?,
        "the follower serves the leader's certificate"
    );

    // With the leader gone, a deleted Secret stays deleted: a follower never writes, and keeps
    // serving what it has.
    concierge.stop().await?;
    secrets
        .delete(&concierge.names.secret, &DeleteParams::default())
        .await?;
    ObjectWatch::start(secrets.clone(), &concierge.names.secret)
        .await?
        .expect_no_write(Duration::from_secs(3))
        .await
        .map_err(|e| anyhow::anyhow!("a follower must not write the Secret: {e}"))?;
    assert!(secrets.get_opt(&concierge.names.secret).await?.is_none());
    assert_eq!(
        served_by(follower.port, first.ca_bundle_pem.clone()).await?,
        leaf(&first)?
    );

    // Elected, it generates a new Secret, serves it and publishes the caBundle.
    follower.leader.send(true)?;
    let second = eventually(Duration::from_secs(20), || async {
        let second = concierge.secret(&client).await?;
        anyhow::ensure!(second.cert_pem != first.cert_pem, "not regenerated yet");
        Ok(second)
    })
    .await?;
    let served = eventually(Duration::from_secs(10), || async {
        let served = served_by(follower.port, second.ca_bundle_pem.clone()).await?;
        anyhow::ensure!(served == leaf(&second)?, "still serving the old certificate");
        Ok(served)
    })
    .await?;
    assert_eq!(served, leaf(&second)?);
    for api_service in &concierge.names.api_services {
        eventually(Duration::from_secs(10), || async {
            let bundle = api_services
                .get(api_service)
                .await?
                .spec
                .and_then(|spec| spec.ca_bundle)
                .map(|bundle| bundle.0)
                .unwrap_or_default();
            anyhow::ensure!(
                bundle == second.ca_bundle_pem.as_bytes(),
                "{api_service}'s caBundle has not followed"
            );
            Ok(())
        })
        .await?;
    }

    // A Secret for another name (which replicas refuse to serve) is replaced by the leader.
    let elsewhere = serving::ServingMaterial::generate("somewhere-else.example.svc", &[], SystemTime::now())?;
    let mut secret = secrets.get(&concierge.names.secret).await?;
    secret.data = Some(elsewhere.secret_data());
    secrets
        .replace(&concierge.names.secret, &PostParams::default(), &secret)
        .await?;
    let third = eventually(Duration::from_secs(20), || async {
        let third = concierge.secret(&client).await?;
        anyhow::ensure!(
            third.cert_pem != elsewhere.cert_pem && third.cert_pem != second.cert_pem,
            "not replaced yet"
        );
        Ok(third)
    })
    .await?;
    assert!(third.is_for(&name));
    let served = eventually(Duration::from_secs(10), || async {
        let served = served_by(follower.port, third.ca_bundle_pem.clone()).await?;
        anyhow::ensure!(served == leaf(&third)?, "not serving the replacement yet");
        Ok(served)
    })
    .await?;
    assert_ne!(served, leaf(&elsewhere)?);

    // APIServices are the install manifests' to create: a deleted one is not recreated.
    let (login, identity) = (&concierge.names.api_services[0], &concierge.names.api_services[1]);
    api_services.delete(identity, &DeleteParams::default()).await?;
    secrets
        .delete(&concierge.names.secret, &DeleteParams::default())
        .await?;
    let fourth = eventually(Duration::from_secs(20), || async {
        let fourth = concierge.secret(&client).await?;
        anyhow::ensure!(fourth.cert_pem != third.cert_pem, "not regenerated yet");
        Ok(fourth)
    })
    .await?;
    let login_bundle = api_services
        .get(login)
        .await?
        .spec
        .and_then(|spec| spec.ca_bundle)
        .map(|b| b.0);
    assert_eq!(login_bundle.as_deref(), Some(fourth.ca_bundle_pem.as_bytes()));
    assert!(
        api_services.get_opt(identity).await?.is_none(),
        "{identity} was recreated"
    );
    follower.stop().await
}
