//! The CredentialIssuer controller (`selkie_control_plane::credential_issuer::run`), run in
//! process against the shared cluster's real kube-apiserver with Selkie's CRDs: `kubectl apply`
//! of the CredentialIssuer drives the impersonation proxy's Services, its serving certificate
//! Secrets, the `ImpersonationProxy` strategy in the status and what is published to the proxy.
//! The harness has no Nodes, no cloud and no controller manager: the tests play the cloud by
//! writing the LoadBalancer Service's `status.loadBalancer.ingress` themselves.
//!
//! Every test has its own namespace, and names its CredentialIssuer and object prefix after it.

use std::{net::IpAddr, sync::Arc, time::Duration};

use anyhow::{bail, ensure, Context};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::{
    api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    Client,
};
use selkie_api::concierge_config::{
    CredentialIssuer, CredentialIssuerStrategy, FrontendType, StrategyReason, StrategyStatus, StrategyType,
};
use selkie_control_plane::{
    config::ControlPlaneConfig,
    credential_issuer::{self, AWS_IDLE_TIMEOUT_ANNOTATION},
    published::{Publisher, ServingKeyPair},
};
use selkie_e2e::{watch::ObjectWatch, Cluster};
use serde_json::{json, Value};
use tokio::{sync::watch, task::JoinHandle};
use x509_cert::{
    der::{oid::AssociatedOid, Decode, DecodePem},
    ext::pkix::{name::GeneralName, SubjectAltName},
    Certificate,
};

use crate::eventually;

const WAIT: Duration = Duration::from_secs(20);

/// Aborts the controller when the test ends.
struct Running(JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One test's controller and its namespace.
struct Fixture {
    cluster: &'static Cluster,
    client: Client,
    namespace: String,
    config: Arc<ControlPlaneConfig>,
    publisher: Publisher,
    leader: watch::Sender<bool>,
    _running: Option<Running>,
}

impl Fixture {
    /// A fresh namespace and a controller for it (leading when `leading`). With `first`, the
    /// CredentialIssuer is applied with that `spec.impersonationProxy` before the controller
    /// starts (otherwise the leader creates it with the defaults, which a later client-side
    /// `kubectl apply` would merge with rather than replace).
    async fn start(leading: bool, first: Option<Value>) -> anyhow::Result<Self> {
        let cluster = Cluster::shared().await?;
        selkie_e2e::crds::install_conf_crds(cluster).await?;
        let client = cluster.client().await?;
        let namespace = cluster.create_namespace(&client, "ci").await?;
        let config = Arc::new(ControlPlaneConfig {
            namespace: namespace.clone(),
            name_prefix: namespace.clone(),
            credential_issuer_name: format!("{namespace}-config"),
            labels: [("app".to_string(), namespace.clone())].into(),
            ..ControlPlaneConfig::default()
        });
        let publisher = Publisher::new();
        let (leader, receiver) = watch::channel(leading);
        let mut fixture = Self {
            cluster,
            client,
            namespace,
            config,
            publisher,
            leader,
            _running: None,
        };
        if let Some(first) = first {
            fixture.apply(first).await?;
        }
        fixture._running = Some(spawn(
            &fixture.client,
            &fixture.config,
            &fixture.publisher,
            receiver,
        ));
        Ok(fixture)
    }

    fn issuer_name(&self) -> &str {
        &self.config.credential_issuer_name
    }

    /// `kubectl apply` of the CredentialIssuer with `spec.impersonationProxy` = `proxy`.
    async fn apply(&self, proxy: Value) -> anyhow::Result<()> {
        let document = json!({
            "apiVersion": "config.concierge.pinniped.dev/v1alpha1",
            "kind": "CredentialIssuer",
            "metadata": {"name": self.issuer_name()},
            "spec": {"impersonationProxy": proxy},
        });
        let yaml = serde_json::to_string(&document)?;
        let kubectl = self.cluster.kubectl();
        eventually(WAIT, || async {
            Ok(kubectl.run_with_stdin(&["apply", "-f", "-"], Some(&yaml)).await?)
        })
        .await?;
        Ok(())
    }

    fn issuers(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &self.config.api_resource::<CredentialIssuer>(),
        )
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn lb_name(&self) -> String {
        format!("{}-impersonation-proxy-load-balancer", self.namespace)
    }

    fn cip_name(&self) -> String {
        format!("{}-impersonation-proxy-cluster-ip", self.namespace)
    }

    fn tls_name(&self) -> String {
        format!("{}-impersonation-proxy-tls-serving-certificate", self.namespace)
    }

    fn ca_name(&self) -> String {
        format!("{}-impersonation-proxy-ca-certificate", self.namespace)
    }

    /// The strategy entries in the CredentialIssuer's status.
    async fn strategies(&self) -> anyhow::Result<Vec<CredentialIssuerStrategy>> {
        let issuer = self.issuers().get(self.issuer_name()).await?;
        let strategies = issuer
            .data
            .get("status")
            .and_then(|s| s.get("strategies"))
            .cloned()
            .unwrap_or(json!([]));
        Ok(serde_json::from_value(strategies)?)
    }

    /// Waits until the ImpersonationProxy strategy has `reason` and `message`, and returns it.
    async fn wait_for_strategy(
        &self,
        reason: StrategyReason,
        message: &str,
    ) -> anyhow::Result<CredentialIssuerStrategy> {
        eventually(WAIT, || async {
            let strategies = self.strategies().await?;
            let Some(proxy) = strategies
                .iter()
                .find(|s| s.r#type == StrategyType::ImpersonationProxy)
            else {
                bail!("no ImpersonationProxy strategy yet: {strategies:?}");
            };
            ensure!(
                proxy.reason == reason && proxy.message == message,
                "strategy is {:?} {:?}",
                proxy.reason,
                proxy.message
            );
            Ok(proxy.clone())
        })
        .await
    }

    /// Waits for a Listening strategy whose frontend endpoint is `endpoint`; returns its base64
    /// CA data.
    async fn wait_for_listening(&self, endpoint: &str) -> anyhow::Result<String> {
        eventually(WAIT, || async {
            let strategy = self
                .wait_for_strategy(
                    StrategyReason::Listening,
                    "impersonation proxy is ready to accept client connections",
                )
                .await?;
            ensure!(strategy.status == StrategyStatus::Success);
            let frontend = strategy.frontend.context("no frontend")?;
            ensure!(frontend.r#type == FrontendType::ImpersonationProxy);
            let info = frontend
                .impersonation_proxy_info
                .context("no impersonationProxyInfo")?;
            ensure!(info.endpoint == endpoint, "endpoint is {}", info.endpoint);
            Ok(info.certificate_authority_data)
        })
        .await
    }

    /// Waits until the published serving pair satisfies `check`, and returns it.
    async fn wait_for_serving(
        &self,
        check: impl Fn(Option<&ServingKeyPair>) -> anyhow::Result<()>,
    ) -> anyhow::Result<Option<ServingKeyPair>> {
        eventually(WAIT, || async {
            let serving = self.publisher.current().proxy_serving.clone();
            check(serving.as_ref())?;
            Ok(serving)
        })
        .await
    }

    /// Waits until the published certificate carries exactly these SANs.
    async fn wait_for_served_sans(&self, ips: &[&str], dns: &[&str]) -> anyhow::Result<ServingKeyPair> {
        let serving = self
            .wait_for_serving(|serving| {
                let serving = serving.context("nothing published")?;
                ensure_sans(&serving.cert_pem, ips, dns)
            })
            .await?;
        serving.context("nothing published")
    }

    async fn wait_for_services(&self, lb: bool, cip: bool) -> anyhow::Result<()> {
        eventually(WAIT, || async {
            let has_lb = self.services().get_opt(&self.lb_name()).await?.is_some();
            let has_cip = self.services().get_opt(&self.cip_name()).await?.is_some();
            ensure!(
                (has_lb, has_cip) == (lb, cip),
                "load balancer: {has_lb}, cluster IP: {has_cip}"
            );
            Ok(())
        })
        .await
    }

    /// Plays the cloud: sets the LoadBalancer Service's ingress.
    async fn set_ingress(&self, ingress: Value) -> anyhow::Result<()> {
        let name = self.lb_name();
        eventually(WAIT, || async {
            self.services()
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": ingress}}})),
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// The PEM `tls.crt` of a Secret.
    async fn secret_cert(&self, name: &str, key: &str) -> anyhow::Result<String> {
        let secret = self.secrets().get(name).await?;
        let data = secret.data.context("no data")?;
        let bytes = data.get(key).with_context(|| format!("no {key}"))?;
        Ok(String::from_utf8(bytes.0.clone())?)
    }
}

fn spawn(
    client: &Client,
    config: &Arc<ControlPlaneConfig>,
    publisher: &Publisher,
    leader: watch::Receiver<bool>,
) -> Running {
    let (client, config, publisher) = (client.clone(), config.clone(), publisher.clone());
    Running(tokio::spawn(async move {
        if let Err(error) = credential_issuer::run(client, config, publisher, leader).await {
            eprintln!("the CredentialIssuer controller stopped: {error}");
        }
    }))
}

/// The IP and DNS SANs of a PEM certificate.
fn sans(pem: &str) -> anyhow::Result<(Vec<IpAddr>, Vec<String>)> {
    let cert = Certificate::from_pem(pem.as_bytes())?;
    let mut ips = Vec::new();
    let mut dns = Vec::new();
    for extension in cert.tbs_certificate.extensions.unwrap_or_default() {
        if extension.extn_id != SubjectAltName::OID {
            continue;
        }
        for name in SubjectAltName::from_der(extension.extn_value.as_bytes())?.0 {
            match name {
                GeneralName::DnsName(name) => dns.push(name.to_string()),
                GeneralName::IpAddress(bytes) => match bytes.as_bytes().len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(bytes.as_bytes())?)),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(bytes.as_bytes())?)),
                    n => bail!("an IP SAN of {n} bytes"),
                },
                _ => {}
            }
        }
    }
    Ok((ips, dns))
}

fn ensure_sans(pem: &str, ips: &[&str], dns: &[&str]) -> anyhow::Result<()> {
    let (actual_ips, actual_dns) = sans(pem)?;
    let want_ips: Vec<IpAddr> = ips.iter().map(|ip| ip.parse()).collect::<Result<_, _>>()?;
    ensure!(
        actual_ips == want_ips && actual_dns == dns,
        "SANs are {actual_ips:?} {actual_dns:?}, want {want_ips:?} {dns:?}"
    );
    Ok(())
}

/// Whether the certificate's key is ECDSA P-256.
fn is_p256(pem: &str) -> anyhow::Result<bool> {
    let cert = Certificate::from_pem(pem.as_bytes())?;
    let algorithm = cert.tbs_certificate.subject_public_key_info.algorithm;
    let curve = algorithm
        .parameters
        .and_then(|p| p.decode_as::<x509_cert::der::asn1::ObjectIdentifier>().ok());
    Ok(algorithm.oid.to_string() == "1.2.840.10045.2.1"
        && curve.map(|c| c.to_string()).as_deref() == Some("1.2.840.10045.3.1.7"))
}

fn issuer_cn(pem: &str) -> anyhow::Result<String> {
    Ok(Certificate::from_pem(pem.as_bytes())?
        .tbs_certificate
        .issuer
        .to_string())
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn mode_changes_create_and_remove_the_services() -> anyhow::Result<()> {
    // Enabled behind a LoadBalancer: the Service, the CA, and Pending until a cloud assigns an
    // address; nothing is served meanwhile.
    let f = Fixture::start(
        true,
        Some(json!({"mode": "enabled", "service": {"type": "LoadBalancer"}})),
    )
    .await?;
    f.wait_for_strategy(
        StrategyReason::Pending,
        "waiting for load balancer Service to be assigned IP or hostname",
    )
    .await?;
    f.wait_for_services(true, false).await?;
    let lb = f.services().get(&f.lb_name()).await?;
    let spec = lb.spec.context("no spec")?;
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let port = &spec.ports.context("no ports")?[0];
    assert_eq!(port.port, 443);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
            8444
        ))
    );
    assert_eq!(spec.selector.context("no selector")?["app"], f.namespace);
    let ca_pem = f.secret_cert(&f.ca_name(), "ca.crt").await?;
    assert!(issuer_cn(&ca_pem)?.contains("Selkie Impersonation Proxy Serving CA"));
    assert!(f.secrets().get_opt(&f.tls_name()).await?.is_none());
    assert!(f.publisher.current().proxy_serving.is_none());

    // ClusterIP: the load balancer goes, a ClusterIP Service comes, and the certificate names
    // its address.
    f.apply(json!({"mode": "enabled", "service": {"type": "ClusterIP"}}))
        .await?;
    f.wait_for_services(false, true).await?;
    let cluster_ip = f
        .services()
        .get(&f.cip_name())
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("no clusterIP")?;
    let ca_data = f.wait_for_listening(&format!("https://{cluster_ip}")).await?;
    assert_eq!(ca_data, base64(ca_pem.as_bytes()));
    let served = f.wait_for_served_sans(&[&cluster_ip], &[]).await?;
    ensure_sans(
        &f.secret_cert(&f.tls_name(), "tls.crt").await?,
        &[&cluster_ip],
        &[],
    )?;
    assert!(issuer_cn(&served.cert_pem)?.contains("Selkie Impersonation Proxy Serving CA"));
    assert!(is_p256(&served.cert_pem)?, "the serving key is not ECDSA P-256");

    // None with an external endpoint: no Service at all, the certificate names the endpoint.
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "None"},
        "externalEndpoint": "proxy.example.com:8443",
    }))
    .await?;
    f.wait_for_services(false, false).await?;
    f.wait_for_listening("https://proxy.example.com:8443").await?;
    f.wait_for_served_sans(&[], &["proxy.example.com"]).await?;
    ensure_sans(
        &f.secret_cert(&f.tls_name(), "tls.crt").await?,
        &[],
        &["proxy.example.com"],
    )?;

    // Back to a LoadBalancer with the endpoint kept: the Service returns, the name stays.
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "LoadBalancer"},
        "externalEndpoint": "proxy.example.com",
    }))
    .await?;
    f.wait_for_services(true, false).await?;
    f.wait_for_listening("https://proxy.example.com").await?;

    // Disabled: Services and the serving certificate go, nothing is served; the CA stays.
    f.apply(json!({"mode": "disabled", "service": {"type": "LoadBalancer"}}))
        .await?;
    let disabled = f
        .wait_for_strategy(
            StrategyReason::Disabled,
            "impersonation proxy was explicitly disabled by configuration",
        )
        .await?;
    assert_eq!(disabled.status, StrategyStatus::Error);
    assert!(disabled.frontend.is_none());
    f.wait_for_services(false, false).await?;
    f.wait_for_serving(|s| {
        ensure!(s.is_none(), "still serving");
        Ok(())
    })
    .await?;
    eventually(WAIT, || async {
        ensure!(
            f.secrets().get_opt(&f.tls_name()).await?.is_none(),
            "serving Secret still there"
        );
        Ok(())
    })
    .await?;
    assert!(f.secrets().get_opt(&f.ca_name()).await?.is_some());
    Ok(())
}

#[tokio::test]
async fn a_load_balancer_ingress_reissues_the_serving_certificate() -> anyhow::Result<()> {
    let f = Fixture::start(
        true,
        Some(json!({
            "mode": "enabled",
            "service": {"type": "LoadBalancer", "loadBalancerIP": "203.0.113.77"},
        })),
    )
    .await?;
    f.wait_for_strategy(
        StrategyReason::Pending,
        "waiting for load balancer Service to be assigned IP or hostname",
    )
    .await?;
    let lb = f.services().get(&f.lb_name()).await?;
    assert_eq!(
        lb.spec.and_then(|s| s.load_balancer_ip).as_deref(),
        Some("203.0.113.77")
    );

    // The cloud assigns an IP.
    f.set_ingress(json!([{"ip": "203.0.113.10"}])).await?;
    let ca_data = f.wait_for_listening("https://203.0.113.10").await?;
    let ca_pem = f.secret_cert(&f.ca_name(), "ca.crt").await?;
    assert_eq!(ca_data, base64(ca_pem.as_bytes()));
    let first = f.wait_for_served_sans(&["203.0.113.10"], &[]).await?;
    ensure_sans(
        &f.secret_cert(&f.tls_name(), "tls.crt").await?,
        &["203.0.113.10"],
        &[],
    )?;

    // Then a hostname (preferred over IPs): a new certificate, a new endpoint, the same CA.
    f.set_ingress(json!([{"ip": "203.0.113.10"}, {"hostname": "lb.example.com"}]))
        .await?;
    f.wait_for_listening("https://lb.example.com").await?;
    let second = f.wait_for_served_sans(&[], &["lb.example.com"]).await?;
    ensure_sans(
        &f.secret_cert(&f.tls_name(), "tls.crt").await?,
        &[],
        &["lb.example.com"],
    )?;
    assert_ne!(first.cert_pem, second.cert_pem);
    assert_eq!(f.secret_cert(&f.ca_name(), "ca.crt").await?, ca_pem);

    // A deleted serving Secret is re-issued for the same name.
    f.secrets()
        .delete(&f.tls_name(), &DeleteParams::default())
        .await?;
    eventually(WAIT, || async {
        let pem = f.secret_cert(&f.tls_name(), "tls.crt").await?;
        ensure!(pem != second.cert_pem, "not re-issued yet");
        ensure_sans(&pem, &[], &["lb.example.com"])
    })
    .await?;

    // The ingress disappears: Pending again, nothing served.
    f.set_ingress(json!([])).await?;
    f.wait_for_strategy(
        StrategyReason::Pending,
        "waiting for load balancer Service to be assigned IP or hostname",
    )
    .await?;
    f.wait_for_serving(|s| {
        ensure!(s.is_none(), "still serving");
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn service_annotations_follow_the_spec_and_others_stay() -> anyhow::Result<()> {
    let f = Fixture::start(
        true,
        Some(json!({
            "mode": "enabled",
            "service": {"type": "LoadBalancer", "annotations": {"a.example.com/one": "1", "b.example.com/two": "2"}},
        })),
    )
    .await?;
    let annotations = |f: &Fixture| {
        let (services, name) = (f.services(), f.lb_name());
        async move {
            let service = services.get(&name).await?;
            anyhow::Ok(service.metadata.annotations.unwrap_or_default())
        }
    };
    eventually(WAIT, || async {
        let current = annotations(&f).await?;
        ensure!(
            current.get("a.example.com/one").map(String::as_str) == Some("1"),
            "{current:?}"
        );
        ensure!(
            current.get("b.example.com/two").map(String::as_str) == Some("2"),
            "{current:?}"
        );
        ensure!(
            current
                .get("credentialissuer.pinniped.dev/annotation-keys")
                .map(String::as_str)
                == Some(r#"["a.example.com/one","b.example.com/two"]"#),
            "{current:?}"
        );
        Ok(())
    })
    .await?;

    // Someone else annotates the Service.
    f.cluster
        .kubectl()
        .run(&[
            "annotate",
            "-n",
            &f.namespace,
            "service",
            &f.lb_name(),
            "other.example.com/mine=kept",
        ])
        .await?;

    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "LoadBalancer", "annotations": {"b.example.com/two": "3", "c.example.com/three": "4"}},
    }))
    .await?;
    eventually(WAIT, || async {
        let current = annotations(&f).await?;
        let expected: std::collections::BTreeMap<String, String> = [
            ("b.example.com/two", "3"),
            ("c.example.com/three", "4"),
            ("other.example.com/mine", "kept"),
            (
                "credentialissuer.pinniped.dev/annotation-keys",
                r#"["b.example.com/two","c.example.com/three"]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        ensure!(current == expected, "{current:?}");
        Ok(())
    })
    .await?;

    // No annotations in the spec: only the other actor's stays.
    f.apply(json!({"mode": "enabled", "service": {"type": "LoadBalancer"}}))
        .await?;
    eventually(WAIT, || async {
        let current = annotations(&f).await?;
        ensure!(
            current.len() == 1 && current.get("other.example.com/mine").map(String::as_str) == Some("kept"),
            "{current:?}"
        );
        Ok(())
    })
    .await?;

    // ClusterIP Services get the spec's annotations too.
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "ClusterIP", "annotations": {"d.example.com/four": "5"}},
    }))
    .await?;
    eventually(WAIT, || async {
        let service = f.services().get(&f.cip_name()).await?;
        let current = service.metadata.annotations.unwrap_or_default();
        ensure!(
            current.get("d.example.com/four").map(String::as_str) == Some("5"),
            "{current:?}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Selkie's extension `service.loadBalancerSourceRanges` (Pinniped #1064): the spec's CIDRs
/// become the LoadBalancer Service's, are replaced and cleared with the spec; when the spec is
/// silent an admin's own ranges on the Service stay; an invalid CIDR is an error condition that
/// leaves the Service as it was.
#[tokio::test]
async fn load_balancer_source_ranges_follow_the_spec_and_an_admins_own_stay() -> anyhow::Result<()> {
    let spec = |ranges: Value, annotation: &str| {
        let mut service = json!({"type": "LoadBalancer", "annotations": {"example.com/step": annotation}});
        if !ranges.is_null() {
            service["loadBalancerSourceRanges"] = ranges;
        }
        json!({"mode": "enabled", "service": service})
    };
    let f = Fixture::start(true, Some(spec(json!(["203.0.113.0/24", "fd00::/8"]), "1"))).await?;
    // The Service once the controller has applied step `step`: its source ranges.
    let ranges_at = |step: &'static str| {
        let f = &f;
        async move {
            eventually(WAIT, || async {
                let service = f.services().get(&f.lb_name()).await?;
                let annotations = service.metadata.annotations.unwrap_or_default();
                ensure!(
                    annotations.get("example.com/step").map(String::as_str) == Some(step),
                    "step {step} not applied yet: {annotations:?}"
                );
                Ok(service
                    .spec
                    .and_then(|s| s.load_balancer_source_ranges)
                    .unwrap_or_default())
            })
            .await
        }
    };
    ensure!(ranges_at("1").await? == ["203.0.113.0/24", "fd00::/8"]);

    f.apply(spec(json!(["198.51.100.7/32"]), "2")).await?;
    ensure!(ranges_at("2").await? == ["198.51.100.7/32"]);

    // The spec stops naming ranges; an admin sets the Service's own. A later change of the
    // spec (step 4) keeps them.
    f.apply(spec(Value::Null, "3")).await?;
    ensure!(ranges_at("3").await? == ["198.51.100.7/32"]);
    f.cluster
        .kubectl()
        .run(&[
            "patch",
            "-n",
            &f.namespace,
            "service",
            &f.lb_name(),
            "--type=merge",
            "-p",
            r#"{"spec":{"loadBalancerSourceRanges":["192.0.2.0/24"]}}"#,
        ])
        .await?;
    f.apply(spec(Value::Null, "4")).await?;
    ensure!(ranges_at("4").await? == ["192.0.2.0/24"]);

    // An empty list clears them.
    f.apply(spec(json!([]), "5")).await?;
    ensure!(ranges_at("5").await?.is_empty());

    // Not a CIDR: the condition says which entry; the Service is left as it was.
    f.apply(spec(json!(["10.0.0.0/8", "10.0.0.1"]), "6")).await?;
    let error = f
        .wait_for_strategy(
            StrategyReason::ErrorDuringSetup,
            r#"could not load CredentialIssuer spec.impersonationProxy: invalid loadBalancerSourceRanges entry "10.0.0.1": not a CIDR such as 203.0.113.0/24"#,
        )
        .await?;
    assert_eq!(error.status, StrategyStatus::Error);
    ensure!(ranges_at("5").await?.is_empty());
    Ok(())
}

/// A `kubernetes.io/tls` Secret with a certificate for `name` from a fresh CA; returns the CA PEM.
async fn create_byo_secret(
    f: &Fixture,
    secret: &str,
    name: &str,
    with_ca: bool,
) -> anyhow::Result<(String, String)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "BYO Test CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])?.signed_by(&key, &ca)?;
    let mut data = serde_json::Map::new();
    data.insert("tls.crt".into(), json!(base64(cert.pem().as_bytes())));
    data.insert("tls.key".into(), json!(base64(key.serialize_pem().as_bytes())));
    if with_ca {
        data.insert("ca.crt".into(), json!(base64(ca.pem().as_bytes())));
    }
    let object: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret, "namespace": f.namespace},
        "type": "kubernetes.io/tls",
        "data": data,
    }))?;
    f.secrets().create(&PostParams::default(), &object).await?;
    Ok((cert.pem(), ca.pem()))
}

#[tokio::test]
async fn a_bring_your_own_tls_secret_is_served_and_advertised() -> anyhow::Result<()> {
    // A generated certificate first.
    let f = Fixture::start(
        true,
        Some(json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "byo.example.com"})),
    )
    .await?;
    f.wait_for_listening("https://byo.example.com").await?;
    let generated = f.wait_for_served_sans(&[], &["byo.example.com"]).await?;

    // A BYO Secret that does not exist: an Error, and the proxy keeps its certificate.
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "None"},
        "externalEndpoint": "byo.example.com",
        "tls": {"secretName": "missing-tls"},
    }))
    .await?;
    let error = f
        .wait_for_strategy(
            StrategyReason::ErrorDuringSetup,
            r#"could not load the externally provided TLS secret for the impersonation proxy: secrets "missing-tls" not found"#,
        )
        .await?;
    assert_eq!(error.status, StrategyStatus::Error);
    assert_eq!(f.publisher.current().proxy_serving.as_ref(), Some(&generated));

    // The Secret appears (with a ca.crt): it is served, its ca.crt advertised, and the
    // generated serving Secret removed.
    let (byo_cert, byo_ca) = create_byo_secret(&f, "missing-tls", "byo.example.com", true).await?;
    let ca_data = f.wait_for_listening("https://byo.example.com").await?;
    assert_eq!(ca_data, base64(byo_ca.as_bytes()));
    f.wait_for_serving(|s| {
        ensure!(
            s.map(|s| s.cert_pem.as_str()) == Some(byo_cert.as_str()),
            "not the BYO certificate"
        );
        Ok(())
    })
    .await?;
    eventually(WAIT, || async {
        ensure!(
            f.secrets().get_opt(&f.tls_name()).await?.is_none(),
            "generated Secret still there"
        );
        Ok(())
    })
    .await?;

    // The Secret is rotated in place (as cert-manager would): the new certificate is served.
    let (rotated_cert, _) = create_byo_secret(&f, "rotated-tls", "byo.example.com", true).await?;
    let rotated = f.secrets().get("rotated-tls").await?;
    f.secrets()
        .patch(
            "missing-tls",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": rotated.data })),
        )
        .await?;
    f.wait_for_serving(|s| {
        ensure!(
            s.map(|s| s.cert_pem.as_str()) == Some(rotated_cert.as_str()),
            "not the rotated certificate"
        );
        Ok(())
    })
    .await?;

    // certificateAuthorityData takes precedence over ca.crt.
    let (_, advertised) = create_byo_secret(&f, "unused-tls", "x.example.com", false).await?;
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "None"},
        "externalEndpoint": "byo.example.com",
        "tls": {"secretName": "missing-tls", "certificateAuthorityData": base64(advertised.as_bytes())},
    }))
    .await?;
    eventually(WAIT, || async {
        let data = f.wait_for_listening("https://byo.example.com").await?;
        ensure!(
            data == base64(advertised.as_bytes()),
            "still advertising the Secret's ca.crt"
        );
        Ok(())
    })
    .await?;

    // certificateAuthorityData that is not base64 PEM: a precise Error.
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "None"},
        "externalEndpoint": "byo.example.com",
        "tls": {"secretName": "missing-tls", "certificateAuthorityData": base64(b"not a certificate")},
    }))
    .await?;
    f.wait_for_strategy(
        StrategyReason::ErrorDuringSetup,
        "could not decode impersonationSpec.TLS.certificateAuthorityData: data is not a certificate",
    )
    .await?;

    // A Secret without ca.crt and no certificateAuthorityData: nothing to advertise, an Error.
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "None"},
        "externalEndpoint": "byo.example.com",
        "tls": {"secretName": "unused-tls"},
    }))
    .await?;
    f.wait_for_strategy(
        StrategyReason::ErrorDuringSetup,
        "could not load the externally provided TLS secret for the impersonation proxy: the Secret \"unused-tls\" \
         has no ca.crt and impersonationSpec.TLS.certificateAuthorityData is empty, so there is no CA bundle to \
         advertise",
    )
    .await?;

    // A Secret whose key is not the certificate's: a precise Error, the last certificate stays.
    let mut data = f.secrets().get("rotated-tls").await?.data.context("no data")?;
    let other_key = f.secrets().get("unused-tls").await?.data.context("no data")?["tls.key"].clone();
    data.insert("tls.key".into(), other_key);
    let mismatched = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("mismatched-tls".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    f.secrets().create(&PostParams::default(), &mismatched).await?;
    f.apply(json!({
        "mode": "enabled",
        "service": {"type": "None"},
        "externalEndpoint": "byo.example.com",
        "tls": {"secretName": "mismatched-tls"},
    }))
    .await?;
    f.wait_for_strategy(
        StrategyReason::ErrorDuringSetup,
        "could not load the externally provided TLS secret for the impersonation proxy: \
         could not parse TLS cert PEM data from Secret: tls: private key does not match public key",
    )
    .await?;
    assert_eq!(
        f.publisher
            .current()
            .proxy_serving
            .as_ref()
            .map(|s| s.cert_pem.as_str()),
        Some(rotated_cert.as_str())
    );
    Ok(())
}

#[tokio::test]
async fn bad_input_gives_a_precise_error_and_keeps_the_proxy() -> anyhow::Result<()> {
    let f = Fixture::start(
        true,
        Some(json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "10.20.30.40:8443"})),
    )
    .await?;
    f.wait_for_listening("https://10.20.30.40:8443").await?;
    let working = f.wait_for_served_sans(&["10.20.30.40"], &[]).await?;
    let working_secret = f.secret_cert(&f.tls_name(), "tls.crt").await?;

    let cases = [
        (
            json!({"mode": "enabled", "service": {"type": "None"}}),
            "could not load CredentialIssuer spec.impersonationProxy: externalEndpoint must be set when service.type is None",
        ),
        (
            json!({"mode": "enabled", "service": {"type": "LoadBalancer", "loadBalancerIP": "not-an-ip"}}),
            r#"could not load CredentialIssuer spec.impersonationProxy: invalid LoadBalancerIP "not-an-ip""#,
        ),
        (
            json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "proxy.example.com:http"}),
            r#"could not load CredentialIssuer spec.impersonationProxy: invalid ExternalEndpoint "proxy.example.com:http": invalid port "http""#,
        ),
        (
            json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "bad_host!"}),
            r#"could not load CredentialIssuer spec.impersonationProxy: invalid ExternalEndpoint "bad_host!": host "bad_host!" is not a valid hostname or IP address"#,
        ),
        (
            json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "x.example.com", "tls": {}}),
            "must provide impersonationSpec.TLS.secretName if impersonationSpec.TLS is provided",
        ),
    ];
    for (spec, message) in cases {
        f.apply(spec).await?;
        let error = f
            .wait_for_strategy(StrategyReason::ErrorDuringSetup, message)
            .await?;
        assert_eq!(error.status, StrategyStatus::Error);
        assert!(error.frontend.is_none());
        // The working configuration stays: same certificate published and stored, no Service.
        assert_eq!(f.publisher.current().proxy_serving.as_ref(), Some(&working));
        assert_eq!(f.secret_cert(&f.tls_name(), "tls.crt").await?, working_secret);
        assert!(f.services().get_opt(&f.lb_name()).await?.is_none());
    }

    // Fixed again: Listening with the same certificate.
    f.apply(json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "10.20.30.40:8443"}))
        .await?;
    f.wait_for_listening("https://10.20.30.40:8443").await?;
    assert_eq!(f.secret_cert(&f.tls_name(), "tls.crt").await?, working_secret);
    Ok(())
}

#[tokio::test]
async fn only_the_leader_writes_and_every_replica_serves() -> anyhow::Result<()> {
    // A follower alone writes nothing: no CredentialIssuer is created.
    let f = Fixture::start(false, None).await?;
    ObjectWatch::start(f.issuers(), f.issuer_name())
        .await?
        .expect_no_write(Duration::from_secs(2))
        .await
        .context("a follower must not create the CredentialIssuer")?;
    assert!(f.issuers().get_opt(f.issuer_name()).await?.is_none());

    // It becomes the leader: the CredentialIssuer is created with Pinniped's install defaults.
    f.leader.send(true)?;
    let issuer = eventually(WAIT, || async {
        f.issuers()
            .get_opt(f.issuer_name())
            .await?
            .context("not created yet")
    })
    .await?;
    assert_eq!(
        issuer.data["spec"],
        json!({"impersonationProxy": {
            "mode": "auto",
            "service": {"type": "LoadBalancer", "annotations": {AWS_IDLE_TIMEOUT_ANNOTATION: "4000"}},
        }})
    );
    assert_eq!(
        issuer.metadata.labels.unwrap_or_default().get("app"),
        Some(&f.namespace)
    );

    // A second replica (a follower) with the same configuration.
    let follower = Publisher::new();
    let (follower_leader, receiver) = watch::channel(false);
    let _follower = spawn(&f.client, &f.config, &follower, receiver);

    f.apply(json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "both.example.com"}))
        .await?;
    f.wait_for_listening("https://both.example.com").await?;
    let served = f.wait_for_served_sans(&[], &["both.example.com"]).await?;
    eventually(WAIT, || async {
        ensure!(
            follower.current().proxy_serving.as_ref() == Some(&served),
            "the follower serves something else"
        );
        Ok(())
    })
    .await?;

    // The leader steps down before a change: nothing is written any more...
    f.leader.send(false)?;
    // (The step-down reaches the controller through a channel; give it that moment before the
    // change, which a leader would act on.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let secret_writes = ObjectWatch::start(f.secrets(), &f.tls_name()).await?;
    f.apply(json!({"mode": "enabled", "service": {"type": "None"}, "externalEndpoint": "next.example.com"}))
        .await?;
    secret_writes
        .expect_no_write(Duration::from_secs(2))
        .await
        .context("a replica that stepped down must not write the TLS Secret")?;
    ensure_sans(
        &f.secret_cert(&f.tls_name(), "tls.crt").await?,
        &[],
        &["both.example.com"],
    )?;
    f.wait_for_listening("https://both.example.com").await?;
    // ... and neither replica serves a certificate for the wrong name.
    assert!(f.publisher.current().proxy_serving.is_none());
    assert!(follower.current().proxy_serving.is_none());

    // The follower takes over: it re-issues, and both serve the new certificate.
    follower_leader.send(true)?;
    f.wait_for_listening("https://next.example.com").await?;
    let next = f.wait_for_served_sans(&[], &["next.example.com"]).await?;
    eventually(WAIT, || async {
        ensure!(
            follower.current().proxy_serving.as_ref() == Some(&next),
            "the new leader serves something else"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn set_strategy_merges_by_type_and_skips_unchanged_writes() -> anyhow::Result<()> {
    let f = Fixture::start(true, Some(json!({"mode": "disabled"}))).await?;
    f.wait_for_strategy(
        StrategyReason::Disabled,
        "impersonation proxy was explicitly disabled by configuration",
    )
    .await?;
    let key_strategy = |message: &str| CredentialIssuerStrategy {
        r#type: StrategyType::KubeClusterSigningCertificate,
        status: StrategyStatus::Error,
        reason: StrategyReason::CouldNotFetchKey,
        message: message.into(),
        last_update_time: credential_issuer::now(),
        frontend: None,
    };
    credential_issuer::set_strategy(&f.client, &f.config, key_strategy("no key")).await?;
    let strategies = f.strategies().await?;
    let types: Vec<StrategyType> = strategies.iter().map(|s| s.r#type).collect();
    assert_eq!(
        types,
        [
            StrategyType::KubeClusterSigningCertificate,
            StrategyType::ImpersonationProxy
        ]
    );
    assert_eq!(strategies[0].message, "no key");
    assert_eq!(strategies[1].reason, StrategyReason::Disabled);

    // Only the time differs: no write (the resource version stays).
    let before = f.issuers().get(f.issuer_name()).await?.metadata.resource_version;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    credential_issuer::set_strategy(&f.client, &f.config, key_strategy("no key")).await?;
    let after = f.issuers().get(f.issuer_name()).await?.metadata.resource_version;
    assert_eq!(before, after);

    // A changed message replaces the entry and keeps the other.
    credential_issuer::set_strategy(&f.client, &f.config, key_strategy("still no key")).await?;
    let strategies = f.strategies().await?;
    assert_eq!(strategies.len(), 2);
    assert_eq!(strategies[0].message, "still no key");
    assert_eq!(strategies[1].r#type, StrategyType::ImpersonationProxy);
    Ok(())
}

#[tokio::test]
async fn auto_mode_follows_the_nodes_control_plane_labels() -> anyhow::Result<()> {
    let f = Fixture::start(
        true,
        Some(json!({"mode": "auto", "service": {"type": "None"}, "externalEndpoint": "auto.example.com"})),
    )
    .await?;
    let nodes: Api<Node> = Api::all(f.client.clone());
    // The harness has no Nodes (this is the only test that creates any): Pinniped's error.
    if nodes.list(&Default::default()).await?.items.is_empty() {
        f.wait_for_strategy(StrategyReason::ErrorDuringSetup, "no nodes found")
            .await?;
    }

    // A worker Node only: the proxy runs.
    let worker = format!("{}-worker", f.namespace);
    let control = format!("{}-control", f.namespace);
    let node = |name: &str, labels: Value| -> anyhow::Result<Node> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}}),
        )?)
    };
    nodes
        .create(
            &PostParams::default(),
            &node(&worker, json!({"node-role.kubernetes.io/worker": ""}))?,
        )
        .await?;
    let outcome = async {
        f.wait_for_listening("https://auto.example.com").await?;
        // A control-plane Node appears: the proxy is disabled automatically.
        nodes
            .create(
                &PostParams::default(),
                &node(&control, json!({"kubernetes.io/node-role": "control-plane"}))?,
            )
            .await?;
        f.wait_for_strategy(
            StrategyReason::Disabled,
            "automatically determined that impersonation proxy should be disabled",
        )
        .await?;
        f.wait_for_serving(|s| {
            ensure!(s.is_none(), "still serving");
            Ok(())
        })
        .await?;
        // It goes away again: the proxy runs again.
        nodes.delete(&control, &DeleteParams::default()).await?;
        f.wait_for_listening("https://auto.example.com").await?;
        anyhow::Ok(())
    }
    .await;
    for name in [&worker, &control] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    outcome
}
