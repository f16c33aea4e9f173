//! The Helm chart `conf/helm/selkie` (the Concierge and the Supervisor), with the real helm:
//!
//! * `conf/install/*.yaml` are the chart rendered with its default values and `conf/crds/` are
//!   its CRDs: a drift fails here, naming `make manifests`; the defaults keep Pinniped's names
//!   and render the configurations the binaries read as their own defaults;
//! * `helm lint` passes, and the schema (or a `fail` of the templates) refuses bad values naming
//!   them;
//! * every value reaches its object: names, namespaces, API group suffix, images, replicas,
//!   resources, probes, PodDisruptionBudget, placement, the CredentialIssuer's spec, and every
//!   key of the three static configurations, which parse with the binaries' own types;
//! * on a real kube-apiserver, `helm install` creates exactly the rendered objects (and the CRDs);
//!   the same release name again, the same values under another release name, and another
//!   release with the same apiGroupSuffix are refused with Helm's ownership message and leave
//!   nothing; a refused value never reaches the cluster; `helm upgrade` carries a changed value
//!   into the ConfigMap the pods mount (and rolls them); `selkie-supervisor` runs with the
//!   chart's service account and its upgraded configuration, and nothing it does is forbidden;
//!   `helm uninstall` leaves nothing of the release behind.
//!
//! The install runs on a private cluster: APIServices are named after their API group, so a
//! release on the shared cluster would clash with the tests that apply `conf/install/` there (and
//! CRDs for a second suffix would make kubectl's short resource names ambiguous for them).

use std::{collections::BTreeMap, path::Path, process::Stdio, time::Duration};

use anyhow::{bail, ensure, Context as _};
use selkie_control_plane::config::ControlPlaneConfig;
use selkie_e2e::{
    cluster::write_kubeconfig_for_user,
    helm::{chart_dir, conf_dir, Helm},
    kubectl::Kubectl,
    Cluster,
};
use selkie_supervisor::{KeySecret, SupervisorConfig};
use serde_json::{json, Value};

use crate::eventually;

/// The release the cluster test installs, and the namespace its record lives in.
const RELEASE: &str = "selkie-e2e";
const RELEASE_NAMESPACE: &str = "selkie-helm";

/// `helm template <release> <chart> <args>`, parsed into its objects.
async fn render(helm: &Helm, release: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let chart = chart_dir();
    let mut all = vec!["template", release, chart.as_str()];
    all.extend_from_slice(args);
    documents(&helm.run(&all).await?)
}

/// The objects of a multi-document YAML text (empty documents left out).
fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// The object of `kind` named `name` among `objects`.
fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    objects
        .iter()
        .find(|object| object["kind"] == kind && object["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} among {}", identities(objects).join(", ")))
}

/// `Kind namespace/name` of every object.
pub(crate) fn identities(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|object| {
            let metadata = &object["metadata"];
            match metadata["namespace"].as_str() {
                Some(namespace) => format!(
                    "{} {namespace}/{}",
                    object["kind"].as_str().unwrap_or_default(),
                    metadata["name"].as_str().unwrap_or_default()
                ),
                None => format!(
                    "{} {}",
                    object["kind"].as_str().unwrap_or_default(),
                    metadata["name"].as_str().unwrap_or_default()
                ),
            }
        })
        .collect()
}

/// The key `key` of the ConfigMap `name` among `objects`.
fn config_map_data<'a>(objects: &'a [Value], name: &str, key: &str) -> anyhow::Result<&'a str> {
    find(objects, "ConfigMap", name)?["data"][key]
        .as_str()
        .with_context(|| format!("the ConfigMap {name} has no {key}"))
}

/// The first line where `committed` (whose first line is line `offset + 1` of its file) and
/// `rendered` differ, shown both ways; `None` when they are equal.
fn first_difference(committed: &str, rendered: &str, offset: usize) -> Option<String> {
    if committed == rendered {
        return None;
    }
    let (mut committed_lines, mut rendered_lines) = (committed.lines(), rendered.lines());
    let mut number = offset + 1;
    loop {
        match (committed_lines.next(), rendered_lines.next()) {
            (Some(a), Some(b)) if a == b => number += 1,
            (a, b) => {
                return Some(format!(
                "differs from the chart's rendering at its line {number}:\n  committed: {}\n  rendered:  {}",
                a.unwrap_or("(end of file)"),
                b.unwrap_or("(end of file)")
            ))
            }
        }
    }
}

/// The `.yaml` files of `dir`, by name.
fn yaml_files(dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "yaml") {
            let name = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            files.insert(name, std::fs::read_to_string(&path)?);
        }
    }
    Ok(files)
}

/// Every object the default values render: Pinniped's names, namespaces and kinds, and a
/// PodDisruptionBudget per component (two replicas each).
const DEFAULT_OBJECTS: [&str; 33] = [
    "Namespace pinniped-concierge",
    "PodDisruptionBudget pinniped-concierge/pinniped-concierge",
    "ServiceAccount pinniped-concierge/pinniped-concierge",
    "ConfigMap pinniped-concierge/pinniped-concierge-config",
    "ClusterRole pinniped-concierge-aggregated-api-server",
    "ClusterRole pinniped-concierge-pre-authn-apis",
    "ClusterRoleBinding pinniped-concierge-aggregated-api-server",
    "ClusterRoleBinding pinniped-concierge-auth-delegator",
    "ClusterRoleBinding pinniped-concierge-pre-authn-apis",
    "Role pinniped-concierge/pinniped-concierge-aggregated-api-server",
    "Role kube-system/pinniped-concierge-kube-system-pod-read",
    "RoleBinding kube-system/pinniped-concierge-extension-apiserver-authentication-reader",
    "RoleBinding kube-system/pinniped-concierge-kube-system-pod-read",
    "RoleBinding pinniped-concierge/pinniped-concierge-aggregated-api-server",
    "Service pinniped-concierge/pinniped-concierge-api",
    "Deployment pinniped-concierge/pinniped-concierge",
    "APIService v1alpha1.login.concierge.pinniped.dev",
    "APIService v1alpha1.identity.concierge.pinniped.dev",
    "CredentialIssuer pinniped-concierge-config",
    "Namespace pinniped-supervisor",
    "PodDisruptionBudget pinniped-supervisor/pinniped-supervisor",
    "ServiceAccount pinniped-supervisor/pinniped-supervisor",
    "ConfigMap pinniped-supervisor/pinniped-supervisor-static-config",
    "ClusterRole pinniped-supervisor-aggregated-api-server",
    "ClusterRole pinniped-supervisor-oidc-client-secrets",
    "ClusterRoleBinding pinniped-supervisor-aggregated-api-server",
    "Role pinniped-supervisor/pinniped-supervisor",
    "RoleBinding pinniped-supervisor/pinniped-supervisor",
    "RoleBinding kube-system/pinniped-supervisor-extension-apiserver-authentication-reader",
    "Service pinniped-supervisor/pinniped-supervisor",
    "Service pinniped-supervisor/pinniped-supervisor-api",
    "Deployment pinniped-supervisor/pinniped-supervisor",
    "APIService v1alpha1.clientsecret.supervisor.pinniped.dev",
];

#[tokio::test]
async fn conf_install_is_the_chart_rendered_with_its_default_values() -> anyhow::Result<()> {
    let helm = Helm::new(None)?;
    let chart = chart_dir();
    let mut drift = Vec::new();
    for (component, other) in [("concierge", "supervisor"), ("supervisor", "concierge")] {
        let disable = format!("{other}.enabled=false");
        let rendered = helm
            .run(&["template", "selkie", &chart, "--set", &disable])
            .await?;
        let path = conf_dir().join(format!("install/{component}.yaml"));
        let committed =
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        // The header comment (everything before the first document separator) is the Makefile's.
        let body_start = committed.find("\n---\n").map_or(0, |at| at + 1);
        let (header, body) = committed.split_at(body_start);
        ensure!(
            header.contains("Generated") && header.contains("make manifests"),
            "conf/install/{component}.yaml does not start with the header saying it is generated by `make manifests`:\n{header}"
        );
        let header_lines = header.lines().count();
        if let Some(difference) = first_difference(body, &rendered, header_lines) {
            drift.push(format!("conf/install/{component}.yaml {difference}"));
        }
    }
    let conf_crds = yaml_files(&conf_dir().join("crds"))?;
    let chart_crds = yaml_files(&conf_dir().join("helm/selkie/crds"))?;
    // Pinniped's nine, and Selkie's SAMLIdentityProvider.
    ensure!(conf_crds.len() == 10, "conf/crds holds {} CRDs", conf_crds.len());
    let names: std::collections::BTreeSet<&String> = conf_crds.keys().chain(chart_crds.keys()).collect();
    for name in names {
        if conf_crds.get(name) != chart_crds.get(name) {
            drift.push(format!(
                "conf/helm/selkie/crds/{name} is not a copy of conf/crds/{name} (one is missing or they differ)"
            ));
        }
    }
    ensure!(
        drift.is_empty(),
        "{}\nRun `make manifests` (it renders conf/install/ from conf/helm/selkie and copies conf/crds/ into the chart), then review `git diff conf/`.",
        drift.join("\n")
    );

    // Pinniped's names, every object once.
    let objects = render(&helm, "selkie", &[]).await?;
    let mut found = identities(&objects);
    let mut expected: Vec<String> = DEFAULT_OBJECTS.iter().map(|object| object.to_string()).collect();
    found.sort();
    expected.sort();
    ensure!(
        found == expected,
        "the default rendering has\n{found:#?}\nnot\n{expected:#?}"
    );
    for object in &objects {
        ensure!(
            object["metadata"]["labels"]["app.kubernetes.io/instance"] == "selkie",
            "{object}"
        );
    }

    // The configurations are what the binaries read, with their own defaults.
    let control_plane: ControlPlaneConfig = serde_yaml::from_str(config_map_data(
        &objects,
        "pinniped-concierge-config",
        "control-plane.yaml",
    )?)?;
    control_plane.validate()?;
    let defaults = ControlPlaneConfig {
        identity: control_plane.identity.clone(),
        ..ControlPlaneConfig::default()
    };
    ensure!(
        control_plane == defaults,
        "the rendered control-plane.yaml is {control_plane:?}, the binary's defaults {defaults:?}"
    );
    let proxy: Value = serde_yaml::from_str(config_map_data(
        &objects,
        "pinniped-concierge-config",
        "proxy.yaml",
    )?)?;
    ensure!(
        proxy
            == json!({"listen": "0.0.0.0:8444", "operationsListen": "0.0.0.0:8080",
                "upstream": {"url": "https://kubernetes.default.svc:443",
                    "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                    "tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}}),
        "{proxy}"
    );
    let supervisor = SupervisorConfig::parse(config_map_data(
        &objects,
        "pinniped-supervisor-static-config",
        "supervisor.yaml",
    )?)?;
    ensure!(
        supervisor.namespace == "pinniped-supervisor"
            && supervisor.api_group_suffix == "pinniped.dev"
            && supervisor.name_prefix == "pinniped-supervisor"
            && supervisor.default_tls_certificate_secret.as_deref()
                == Some("pinniped-supervisor-default-tls-certificate")
            && supervisor.listen.https.port() == 8443
            && supervisor.listen.metrics.map(|a| a.port()) == Some(9090)
            && supervisor.listen.aggregated_api.map(|a| a.port()) == Some(10250),
        "{supervisor:?}"
    );

    // Pods as today: non-root, read-only root filesystem, no privilege escalation, no
    // capabilities, a memory limit.
    for (deployment, memory) in [("pinniped-concierge", "128Mi"), ("pinniped-supervisor", "128Mi")] {
        let pod = &find(&objects, "Deployment", deployment)?["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        ensure!(
            pod["securityContext"]["runAsNonRoot"] == true
                && container["securityContext"]
                    == json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]}})
                && container["resources"]["limits"]["memory"] == memory,
            "{pod}"
        );
        ensure!(
            find(&objects, "PodDisruptionBudget", deployment)?["spec"]["minAvailable"] == 1,
            "{deployment}'s PodDisruptionBudget"
        );
    }
    Ok(())
}

#[tokio::test]
async fn helm_lint_passes_and_bad_values_are_refused_naming_them() -> anyhow::Result<()> {
    let helm = Helm::new(None)?;
    let chart = chart_dir();
    let lint = helm.run(&["lint", "--strict", &chart]).await?;
    ensure!(lint.contains("0 chart(s) failed"), "{lint}");

    // The schema: helm lint and helm template (as install and upgrade) refuse, naming the value.
    let schema_cases: [(&str, &[&str]); 13] = [
        ("concierge.replicas=two", &["/concierge/replicas", "want integer"]),
        (
            "concierge.credentialIssuer.impersonationProxy.mode=sometimes",
            &[
                "/concierge/credentialIssuer/impersonationProxy/mode",
                "'auto', 'enabled', 'disabled'",
            ],
        ),
        ("supervisor.replica=3", &["/supervisor", "'replica' not allowed"]),
        (
            "apiGroupSuffix=pinniped",
            &["/apiGroupSuffix", "does not match pattern"],
        ),
        (
            "concierge.credentialIssuer.impersonationProxy.service.type=None",
            &["/concierge/credentialIssuer/impersonationProxy/externalEndpoint"],
        ),
        (
            "supervisor.audit.logUsernamesAndGroups=yes",
            &["/supervisor/audit/logUsernamesAndGroups", "'enabled', 'disabled'"],
        ),
        (
            "supervisor.image.pullPolicy=Sometimes",
            &[
                "/supervisor/image/pullPolicy",
                "'Always', 'IfNotPresent', 'Never'",
            ],
        ),
        (
            "concierge.namePrefix=a-concierge-prefix-far-too-long-for-names",
            &["/concierge/namePrefix", "maxLength: got 41, want 28"],
        ),
        (
            "supervisor.shutdown.gracePeriodSeconds=-5",
            &[
                "/supervisor/shutdown/gracePeriodSeconds",
                "minimum: got -5, want 0",
            ],
        ),
        (
            "supervisor.signingKeyRotationInterval=30 days",
            &["/supervisor/signingKeyRotationInterval", "does not match pattern"],
        ),
        (
            "concierge.controlPlane.clientCertificateLifetime=1 hour",
            &[
                "/concierge/controlPlane/clientCertificateLifetime",
                "does not match pattern",
            ],
        ),
        (
            "concierge.ports.proxy=70000",
            &["/concierge/ports/proxy", "maximum"],
        ),
        (
            "concierge.credentialIssuer.impersonationProxy.service.loadBalancerSourceRanges={office}",
            &[
                "/concierge/credentialIssuer/impersonationProxy/service/loadBalancerSourceRanges/0",
                "does not match pattern",
            ],
        ),
    ];
    for (value, needles) in schema_cases {
        helm.refused(&["lint", &chart, "--set", value], needles).await?;
        helm.refused(&["template", "selkie", &chart, "--set", value], needles)
            .await?;
    }

    // The templates' own checks, where one value is fine but two together are not.
    let template_cases: [(&str, &[&str]); 2] = [
        (
            "supervisor.podDisruptionBudget.minAvailable=2",
            &["supervisor.podDisruptionBudget.minAvailable (2) must be less than supervisor.replicas (2)"],
        ),
        (
            "concierge.namespace=auth,supervisor.namespace=auth,supervisor.namePrefix=pinniped-concierge",
            &["concierge.namePrefix and supervisor.namePrefix are both \"pinniped-concierge\" in the namespace \"auth\""],
        ),
    ];
    for (value, needles) in template_cases {
        helm.refused(&["template", "selkie", &chart, "--set", value], needles)
            .await?;
    }
    Ok(())
}

/// Values that set every value of the chart away from its default.
fn every_value() -> Value {
    json!({
        "apiGroupSuffix": "acme.example.com",
        "concierge": {
            "namespace": "auth-concierge",
            "namePrefix": "acme-concierge",
            "credentialIssuerName": "acme-issuer",
            "image": {"repository": "registry.example.com/selkie-concierge", "tag": "0.1.0",
                      "pullPolicy": "IfNotPresent"},
            "imagePullSecrets": ["registry"],
            "replicas": 3,
            "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "operations"}, "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "operations"}, "periodSeconds": 7},
            "podDisruptionBudget": {"enabled": true, "minAvailable": 2},
            // Maps merge with the defaults (seccompProfile stays).
            "podSecurityContext": {"runAsNonRoot": true, "runAsUser": 1000},
            "podLabels": {"team": "auth"},
            "podAnnotations": {"example.com/note": "hello"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            "priorityClassName": "system-cluster-critical",
            "extraEnv": [{"name": "RUST_LOG", "value": "debug"}],
            "extraVolumes": [{"name": "pki", "hostPath": {"path": "/etc/kubernetes/pki"}}],
            "extraVolumeMounts": [{"name": "pki", "mountPath": "/etc/kubernetes/pki", "readOnly": true}],
            "ports": {"proxy": 9444, "api": 11250, "operations": 9080},
            "credentialIssuer": {"impersonationProxy": {
                "mode": "enabled",
                // Helm merges maps with the defaults: null drops the default annotation.
                "service": {"type": "ClusterIP",
                            "annotations": {"example.com/lb": "internal",
                                "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout": null},
                            "loadBalancerIP": "10.0.0.7",
                            "loadBalancerSourceRanges": ["203.0.113.0/24", "fd00::/8"]},
                "externalEndpoint": "proxy.example.com:443",
                "tls": {"secretName": "proxy-tls", "certificateAuthorityData": "Q0E="},
            }},
            "proxy": {
                "upstream": {"url": "https://10.0.0.1:6443", "caFile": "/etc/kubernetes/pki/ca.crt",
                             "tokenFile": "/var/run/token"},
                "timeouts": {"headerRead": "5s", "idle": "2m"},
                "listenerLimits": {"maxConnections": 4000},
                "shutdown": {"gracePeriodSeconds": 3, "drainTimeoutSeconds": 10},
                "clientCertificateClockSkew": "30s",
                "config": {"clientCertificateCaFiles": ["/etc/selkie/extra-ca.crt"]},
            },
            "controlPlane": {
                "clusterSigningKey": {"files": {"certFile": "/etc/kubernetes/pki/ca.crt",
                                                "keyFile": "/etc/kubernetes/pki/ca.key"}},
                "discoveryUrl": "https://api.example.com:6443",
                "labels": {"team": "auth"},
                "clientCertificateLifetime": "1h",
                // `config` wins over the typed values.
                "config": {"discoveryUrl": "https://override.example.com:6443"},
            },
        },
        "supervisor": {
            "namespace": "auth-supervisor",
            "createNamespace": false,
            "namePrefix": "acme-supervisor",
            "image": {"repository": "registry.example.com/selkie-supervisor", "tag": "0.1.0",
                      "pullPolicy": "Always"},
            "replicas": 1,
            "resources": {"requests": null, "limits": {"memory": "96Mi"}},
            "ports": {"https": 9443, "metrics": 9091, "api": 11251},
            "service": {"type": "LoadBalancer", "port": 8443, "annotations": {"example.com/lb": "public"},
                        "loadBalancerIP": "10.0.0.8"},
            "defaultTLSCertificateSecret": "acme-tls",
            "sessionGarbageCollectionInterval": "30s",
            "signingKeyRotationInterval": "48h",
            "audit": {"logUsernamesAndGroups": "enabled", "logInternalPaths": "disabled"},
            "shutdown": {"gracePeriodSeconds": 8, "drainTimeoutSeconds": 15},
            "config": {"listen": {"http": "127.0.0.1:8080"}},
        },
    })
}

#[tokio::test]
async fn every_value_reaches_its_object_and_configuration() -> anyhow::Result<()> {
    let helm = Helm::new(None)?;
    let values = helm.dir().join("every-value.json");
    std::fs::write(&values, every_value().to_string())?;
    let objects = render(&helm, "acme", &["-f", &values.to_string_lossy()]).await?;

    // Names, namespaces and API groups all come from the values.
    let text = serde_json::to_string(&objects)?;
    ensure!(
        !text.contains("pinniped.dev") && !text.contains("pinniped-"),
        "a default name or group is left: {}",
        identities(&objects).join(", ")
    );
    for object in &objects {
        let metadata = &object["metadata"];
        let name = metadata["name"].as_str().unwrap_or_default();
        match metadata["namespace"].as_str() {
            Some(namespace) => ensure!(
                ["auth-concierge", "auth-supervisor", "kube-system"].contains(&namespace),
                "{name} is in {namespace}"
            ),
            None => ensure!(
                name.starts_with("acme-concierge")
                    || name.starts_with("acme-supervisor")
                    || ["acme-issuer", "auth-concierge"].contains(&name)
                    || (name.starts_with("v1alpha1.") && name.ends_with(".acme.example.com")),
                "the cluster-scoped {} {name} is not named by the values",
                object["kind"]
            ),
        }
        for rule in object["rules"].as_array().into_iter().flatten() {
            for group in rule["apiGroups"].as_array().into_iter().flatten() {
                let group = group.as_str().unwrap_or_default();
                // Selkie's own groups keep their name whatever the suffix.
                ensure!(
                    !(group.contains(".concierge") || group.contains(".supervisor"))
                        || group.ends_with(".acme.example.com")
                        || group == selkie_api::supervisor_saml::GROUP,
                    "{name}: {group}"
                );
            }
        }
    }
    // createNamespace false: the Supervisor's namespace is not part of the release.
    ensure!(find(&objects, "Namespace", "auth-supervisor").is_err());
    find(&objects, "Namespace", "auth-concierge")?;

    let issuer = find(&objects, "CredentialIssuer", "acme-issuer")?;
    ensure!(issuer["apiVersion"] == "config.concierge.acme.example.com/v1alpha1");
    ensure!(
        issuer["spec"]
            == json!({"impersonationProxy": {
                "mode": "enabled",
                "service": {"type": "ClusterIP", "annotations": {"example.com/lb": "internal"},
                            "loadBalancerIP": "10.0.0.7",
                            "loadBalancerSourceRanges": ["203.0.113.0/24", "fd00::/8"]},
                "externalEndpoint": "proxy.example.com:443",
                "tls": {"secretName": "proxy-tls", "certificateAuthorityData": "Q0E="},
            }}),
        "{issuer}"
    );
    for (group, service) in [
        ("login.concierge", "acme-concierge-api"),
        ("identity.concierge", "acme-concierge-api"),
        ("clientsecret.supervisor", "acme-supervisor-api"),
    ] {
        let api_service = find(
            &objects,
            "APIService",
            &format!("v1alpha1.{group}.acme.example.com"),
        )?;
        ensure!(
            api_service["spec"]["group"] == format!("{group}.acme.example.com")
                && api_service["spec"]["service"]["name"] == service,
            "{api_service}"
        );
    }

    let concierge = &find(&objects, "Deployment", "acme-concierge")?["spec"];
    let pod = &concierge["template"]["spec"];
    let container = &pod["containers"][0];
    ensure!(concierge["replicas"] == 3, "{concierge}");
    ensure!(
        container["image"] == "registry.example.com/selkie-concierge:0.1.0"
            && container["imagePullPolicy"] == "IfNotPresent",
        "{container}"
    );
    ensure!(
        container["ports"]
            == json!([{"name": "proxy", "containerPort": 9444}, {"name": "api", "containerPort": 11250},
                      {"name": "operations", "containerPort": 9080}]),
        "{container}"
    );
    ensure!(
        container["readinessProbe"]["periodSeconds"] == 5
            && container["livenessProbe"]["periodSeconds"] == 7
            && container["resources"]["limits"]["memory"] == "256Mi"
            && container["env"][1] == json!({"name": "RUST_LOG", "value": "debug"})
            && container["volumeMounts"][1]["name"] == "pki"
            && container["securityContext"]["readOnlyRootFilesystem"] == true,
        "{container}"
    );
    ensure!(
        pod["imagePullSecrets"] == json!([{"name": "registry"}])
            && pod["nodeSelector"] == json!({"kubernetes.io/os": "linux"})
            && pod["tolerations"][0]["key"] == "dedicated"
            && pod["affinity"]["podAntiAffinity"].is_object()
            && pod["priorityClassName"] == "system-cluster-critical"
            && pod["securityContext"]
                == json!({"runAsNonRoot": true, "runAsUser": 1000,
                          "seccompProfile": {"type": "RuntimeDefault"}})
            && pod["volumes"][1]["hostPath"]["path"] == "/etc/kubernetes/pki"
            && pod["serviceAccountName"] == "acme-concierge",
        "{pod}"
    );
    let template_metadata = &concierge["template"]["metadata"];
    ensure!(
        template_metadata["labels"]["team"] == "auth"
            && template_metadata["labels"]["app"] == "acme-concierge"
            && template_metadata["annotations"]["example.com/note"] == "hello"
            && template_metadata["annotations"]["checksum/config"].is_string(),
        "{template_metadata}"
    );
    ensure!(find(&objects, "PodDisruptionBudget", "acme-concierge")?["spec"]["minAvailable"] == 2);
    // One Supervisor replica: no PodDisruptionBudget.
    ensure!(find(&objects, "PodDisruptionBudget", "acme-supervisor").is_err());
    let supervisor_container =
        &find(&objects, "Deployment", "acme-supervisor")?["spec"]["template"]["spec"]["containers"][0];
    ensure!(
        supervisor_container["image"] == "registry.example.com/selkie-supervisor:0.1.0"
            && supervisor_container["imagePullPolicy"] == "Always"
            && supervisor_container["resources"] == json!({"limits": {"memory": "96Mi"}}),
        "{supervisor_container}"
    );
    let service = find(&objects, "Service", "acme-supervisor")?;
    ensure!(
        service["spec"]["type"] == "LoadBalancer"
            && service["spec"]["loadBalancerIP"] == "10.0.0.8"
            && service["spec"]["ports"][0]["port"] == 8443
            && service["spec"]["ports"][0]["targetPort"] == 9443
            && service["metadata"]["annotations"]["example.com/lb"] == "public",
        "{service}"
    );
    ensure!(find(&objects, "Service", "acme-concierge-api")?["spec"]["ports"][0]["targetPort"] == 11250);

    // The configurations parse with the binaries' own types (unknown keys are refused there).
    let control_plane: ControlPlaneConfig = serde_yaml::from_str(config_map_data(
        &objects,
        "acme-concierge-config",
        "control-plane.yaml",
    )?)?;
    control_plane.validate()?;
    let files = control_plane
        .cluster_signing_key
        .as_ref()
        .and_then(|source| source.files.as_ref())
        .context("no clusterSigningKey.files")?;
    ensure!(
        control_plane.namespace == "auth-concierge"
            && control_plane.api_group_suffix == "acme.example.com"
            && control_plane.name_prefix == "acme-concierge"
            && control_plane.credential_issuer_name == "acme-issuer"
            && control_plane.impersonation_proxy_port == 9444
            && control_plane.aggregated_api.listen.port() == 11250
            && control_plane.labels
                == BTreeMap::from([
                    ("app".to_string(), "acme-concierge".to_string()),
                    ("team".to_string(), "auth".to_string()),
                ])
            && control_plane.discovery_url.as_deref() == Some("https://override.example.com:6443")
            && control_plane.client_certificate_lifetime == Some(Duration::from_secs(3600))
            && files.key_file == Path::new("/etc/kubernetes/pki/ca.key"),
        "{control_plane:?}"
    );
    let proxy: Value =
        serde_yaml::from_str(config_map_data(&objects, "acme-concierge-config", "proxy.yaml")?)?;
    ensure!(
        proxy
            == json!({
                "listen": "0.0.0.0:9444", "operationsListen": "0.0.0.0:9080",
                "upstream": {"url": "https://10.0.0.1:6443", "caFile": "/etc/kubernetes/pki/ca.crt",
                             "tokenFile": "/var/run/token"},
                "timeouts": {"headerRead": "5s", "idle": "2m"},
                "listenerLimits": {"maxConnections": 4000},
                "shutdown": {"gracePeriodSeconds": 3, "drainTimeoutSeconds": 10},
                "clientCertificateClockSkew": "30s",
                "clientCertificateCaFiles": ["/etc/selkie/extra-ca.crt"],
            }),
        "{proxy}"
    );
    let supervisor = SupervisorConfig::parse(config_map_data(
        &objects,
        "acme-supervisor-static-config",
        "supervisor.yaml",
    )?)?;
    ensure!(
        supervisor.namespace == "auth-supervisor"
            && supervisor.api_group_suffix == "acme.example.com"
            && supervisor.name_prefix == "acme-supervisor"
            && supervisor.default_tls_certificate_secret.as_deref() == Some("acme-tls")
            && supervisor.listen.https.port() == 9443
            && supervisor.listen.metrics.map(|a| a.port()) == Some(9091)
            && supervisor.listen.aggregated_api.map(|a| a.port()) == Some(11251)
            && supervisor.listen.http.map(|a| a.to_string()).as_deref() == Some("127.0.0.1:8080")
            && supervisor.garbage_collection_interval()? == Duration::from_secs(30)
            && supervisor.signing_key_rotation_interval()? == Some(Duration::from_secs(48 * 3600))
            && supervisor.audit.log_usernames_and_groups == "enabled"
            && supervisor.audit.log_internal_paths == "disabled"
            && supervisor.shutdown.grace_period() == Duration::from_secs(8)
            && supervisor.shutdown.drain_timeout() == Duration::from_secs(15),
        "{supervisor:?}"
    );
    Ok(())
}

/// The release's values: every cluster-scoped name and both namespaces its own; one Concierge
/// replica (so no PodDisruptionBudget for it), two of the Supervisor.
fn release_values() -> Value {
    json!({
        "concierge": {"namespace": "selkie-helm-concierge", "namePrefix": "selkie-helm-concierge",
                      "replicas": 1},
        "supervisor": {"namespace": "selkie-helm-supervisor", "namePrefix": "selkie-helm-supervisor"},
    })
}

#[tokio::test]
async fn helm_installs_upgrades_and_uninstalls_the_chart_on_a_real_kube_apiserver() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let kubectl = cluster.kubectl();
    let helm = Helm::new(Some(cluster.admin_kubeconfig()))?;
    let chart = chart_dir();
    let values_path = helm.dir().join("values.json");
    std::fs::write(&values_path, release_values().to_string())?;
    let values = values_path.to_string_lossy().into_owned();
    let (concierge_ns, supervisor_ns) = ("selkie-helm-concierge", "selkie-helm-supervisor");
    let supervisor_prefix = "selkie-helm-supervisor";
    let release_args =
        |release: &'static str| vec![release, chart.as_str(), "--namespace", RELEASE_NAMESPACE];

    let mut install = vec!["install"];
    install.extend(release_args(RELEASE));
    install.extend(["--create-namespace", "-f", &values]);
    helm.run(&install).await?;

    // The CRDs came from the chart's crds/ (this cluster had none).
    for yaml in yaml_files(&conf_dir().join("crds"))?.values() {
        let crd: Value = serde_yaml::from_str(yaml)?;
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        kubectl.run(&["get", "crd", name]).await?;
    }

    // Exactly the rendered objects exist, each marked as the release's.
    let mut template = vec!["template"];
    template.extend(release_args(RELEASE));
    template.extend(["-f", &values]);
    let rendered_text = helm.run(&template).await?;
    let rendered = documents(&rendered_text)?;
    let rendered_path = helm.dir().join("rendered.yaml");
    std::fs::write(&rendered_path, &rendered_text)?;
    let live: Value = serde_json::from_str(
        &kubectl
            .run(&["get", "-f", &rendered_path.to_string_lossy(), "-o", "json"])
            .await?,
    )?;
    let live: Vec<Value> = live["items"].as_array().cloned().unwrap_or_default();
    let (mut live_names, mut rendered_names) = (identities(&live), identities(&rendered));
    live_names.sort();
    rendered_names.sort();
    ensure!(
        live_names == rendered_names,
        "installed:\n{live_names:#?}\nrendered:\n{rendered_names:#?}"
    );
    for object in &live {
        let metadata = &object["metadata"];
        ensure!(
            metadata["labels"]["app.kubernetes.io/instance"] == RELEASE
                && metadata["annotations"]["meta.helm.sh/release-name"] == RELEASE
                && metadata["annotations"]["meta.helm.sh/release-namespace"] == RELEASE_NAMESPACE,
            "{metadata}"
        );
    }
    let binding = find(
        &live,
        "ClusterRoleBinding",
        "selkie-helm-concierge-aggregated-api-server",
    )?;
    ensure!(binding["subjects"][0]["namespace"] == concierge_ns, "{binding}");
    let api_service = find(&live, "APIService", "v1alpha1.login.concierge.pinniped.dev")?;
    ensure!(
        api_service["spec"]["service"]
            == json!({"name": "selkie-helm-concierge-api", "namespace": concierge_ns, "port": 443}),
        "{api_service}"
    );
    let issuer = find(&live, "CredentialIssuer", "selkie-helm-concierge-config")?;
    ensure!(issuer["spec"]["impersonationProxy"]["mode"] == "auto", "{issuer}");
    ensure!(find(&live, "PodDisruptionBudget", "selkie-helm-concierge").is_err());
    ensure!(find(&live, "PodDisruptionBudget", supervisor_prefix)?["spec"]["minAvailable"] == 1);

    // The same release name again; the same values under another name (its Namespace and every
    // other object belong to the first release); another release with names of its own but the
    // same apiGroupSuffix (the APIServices are named after the groups); a value the schema
    // refuses. Each fails clearly and leaves nothing.
    let mut again = vec!["install"];
    again.extend(release_args(RELEASE));
    again.extend(["-f", &values]);
    helm.refused(&again, &["cannot re-use a name that is still in use"])
        .await?;
    let mut twin = vec!["install"];
    twin.extend(release_args("selkie-e2e-twin"));
    twin.extend(["-f", &values]);
    helm.refused(
        &twin,
        &[
            "exists and cannot be imported into the current release",
            "\"meta.helm.sh/release-name\" must equal \"selkie-e2e-twin\": current value is \"selkie-e2e\"",
        ],
    )
    .await?;
    let mut same_suffix = vec!["install"];
    same_suffix.extend(release_args("selkie-e2e-other"));
    same_suffix.extend([
        "--set",
        "concierge.namespace=other-concierge,concierge.namePrefix=other-concierge,\
         supervisor.namespace=other-supervisor,supervisor.namePrefix=other-supervisor",
    ]);
    helm.refused(
        &same_suffix,
        &[
            "APIService \"v1alpha1.login.concierge.pinniped.dev\"",
            "exists and cannot be imported into the current release",
        ],
    )
    .await?;
    let mut bad_value = vec!["install"];
    bad_value.extend(release_args("selkie-e2e-bad"));
    bad_value.extend(["--set", "supervisor.replicas=-1"]);
    helm.refused(&bad_value, &["/supervisor/replicas", "minimum"])
        .await?;
    let releases = helm
        .run(&["list", "--all-namespaces", "--all", "--short"])
        .await?;
    ensure!(
        releases.trim() == RELEASE,
        "releases after the refused installs: {releases}"
    );
    for namespace in ["other-concierge", "other-supervisor"] {
        let leftover = kubectl.output(&["get", "namespace", namespace], None).await?;
        ensure!(!leftover.success, "a refused release created {namespace}");
    }

    // An upgrade carries changed values into the ConfigMap the pods mount, and rolls the pods.
    let checksum = |objects: &[Value]| -> anyhow::Result<String> {
        Ok(
            find(objects, "Deployment", supervisor_prefix)?["spec"]["template"]["metadata"]["annotations"]
                ["checksum/config"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    };
    let checksum_before = checksum(&live)?;
    let mut upgrade = vec!["upgrade"];
    upgrade.extend(release_args(RELEASE));
    upgrade.extend([
        "-f",
        &values,
        "--set",
        "supervisor.signingKeyRotationInterval=48h,supervisor.audit.logUsernamesAndGroups=enabled,\
         concierge.credentialIssuer.impersonationProxy.mode=disabled",
    ]);
    helm.run(&upgrade).await?;
    let upgraded: Vec<Value> = serde_json::from_str::<Value>(
        &kubectl
            .run(&["get", "-f", &rendered_path.to_string_lossy(), "-o", "json"])
            .await?,
    )?["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let config = SupervisorConfig::parse(config_map_data(
        &upgraded,
        &format!("{supervisor_prefix}-static-config"),
        "supervisor.yaml",
    )?)?;
    ensure!(
        config.signing_key_rotation_interval.as_deref() == Some("48h")
            && config.audit.log_usernames_and_groups == "enabled",
        "the upgraded ConfigMap says {config:?}"
    );
    let checksum_after = checksum(&upgraded)?;
    ensure!(
        checksum_after != checksum_before,
        "the Deployment's pods would not roll: checksum/config stayed {checksum_before}"
    );
    let issuer = find(&upgraded, "CredentialIssuer", "selkie-helm-concierge-config")?;
    ensure!(
        issuer["spec"]["impersonationProxy"]["mode"] == "disabled",
        "{issuer}"
    );
    let status: Value = serde_json::from_str(
        &helm
            .run(&["status", RELEASE, "--namespace", RELEASE_NAMESPACE, "-o", "json"])
            .await?,
    )?;
    ensure!(
        status["version"] == 2 && status["info"]["status"] == "deployed",
        "{}",
        status["info"]
    );

    // The Supervisor runs with the chart's service account and its upgraded configuration.
    run_supervisor_as_installed(&cluster, &kubectl, helm.dir(), supervisor_ns, supervisor_prefix).await?;

    // Uninstalling leaves nothing of the release: only its namespaces, being deleted (the harness
    // runs no namespace controller to finish that). Helm keeps CRDs by design.
    helm.run(&["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE])
        .await?;
    let left = eventually(Duration::from_secs(30), || async {
        let left = objects_of_release(&kubectl, RELEASE).await?;
        ensure!(
            left.is_empty(),
            "left after helm uninstall: {}",
            identities(&left).join(", ")
        );
        Ok(left)
    })
    .await?;
    ensure!(left.is_empty());
    for namespace in [concierge_ns, supervisor_ns] {
        let deleted = kubectl
            .run(&[
                "get",
                "namespace",
                namespace,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ])
            .await?;
        ensure!(
            !deleted.is_empty(),
            "the namespace {namespace} is not being deleted"
        );
    }
    let releases = helm
        .run(&["list", "--all-namespaces", "--all", "--short"])
        .await?;
    ensure!(
        releases.trim().is_empty(),
        "releases after the uninstall: {releases}"
    );
    kubectl
        .run(&["get", "crd", "credentialissuers.config.concierge.pinniped.dev"])
        .await?;
    Ok(())
}

/// Every object of any listable kind, in any namespace, labelled as `release`'s
/// (`app.kubernetes.io/instance`), but namespaces already being deleted. Kinds of aggregated APIs
/// (an APIService with a Service) are left out: a chart's objects are never stored there, and
/// listing one fails while its server is down — another test's release may be restarting its
/// pods (kube-apiserver's discovery keeps naming the kinds of an API that was available).
pub(crate) async fn objects_of_release(kubectl: &Kubectl, release: &str) -> anyhow::Result<Vec<Value>> {
    let api_services: Value =
        serde_json::from_str(&kubectl.run(&["get", "apiservices", "-o", "json"]).await?)?;
    let aggregated: Vec<&str> = api_services["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|api| api["spec"]["service"].is_object())
        .filter_map(|api| api["spec"]["group"].as_str())
        .collect();
    let kinds = kubectl
        .run(&["api-resources", "--verbs=list", "-o", "name"])
        .await?
        .lines()
        .map(str::trim)
        .filter(|kind| !kind.is_empty())
        // `<plural>.<group>`, or `<plural>` in the core group.
        .filter(|kind| {
            !kind
                .split_once('.')
                .is_some_and(|(_, group)| aggregated.contains(&group))
        })
        .collect::<Vec<_>>()
        .join(",");
    let selector = format!("app.kubernetes.io/instance={release}");
    let listed: Value = serde_json::from_str(
        &kubectl
            .run(&["get", &kinds, "--all-namespaces", "-l", &selector, "-o", "json"])
            .await?,
    )?;
    Ok(listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|object| {
            !(object["kind"] == "Namespace" && object["metadata"]["deletionTimestamp"].is_string())
        })
        .cloned()
        .collect())
}

/// Runs `selkie-supervisor` as the release's Deployment would: the token of its service account
/// `prefix` in `namespace`, the configuration of its ConfigMap (listeners moved to loopback), its
/// aggregated API reached through the chart's APIService (its Service turned into an
/// `ExternalName` to `localhost`: the harness has no kubelet). Checks that it leads (the Lease),
/// generates a FederationDomain's keys and writes its status, serves the aggregated API through
/// kube-apiserver with the caBundle it wrote, and is refused nothing; stops it.
async fn run_supervisor_as_installed(
    cluster: &Cluster,
    kubectl: &Kubectl,
    dir: &Path,
    namespace: &str,
    prefix: &str,
) -> anyhow::Result<()> {
    let token = kubectl
        .run(&["create", "token", prefix, "-n", namespace, "--duration=1h"])
        .await?;
    let kubeconfig = dir.join("supervisor-account.kubeconfig");
    write_kubeconfig_for_user(
        &kubeconfig,
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        prefix,
        json!({"token": token.trim()}),
    )?;
    let yaml = kubectl
        .run(&[
            "get",
            "configmap",
            &format!("{prefix}-static-config"),
            "-n",
            namespace,
            "-o",
            "jsonpath={.data.supervisor\\.yaml}",
        ])
        .await?;
    let mut config: Value = serde_yaml::from_str(&yaml)?;
    let https = selkie_e2e::free_port()?;
    let aggregated = selkie_e2e::free_port()?;
    config["kubeconfig"] = json!(kubeconfig);
    config["listen"]["https"] = json!(format!("127.0.0.1:{https}"));
    config["listen"]["metrics"] = json!(format!("127.0.0.1:{}", selkie_e2e::free_port()?));
    config["listen"]["aggregatedApi"] = json!(format!("127.0.0.1:{aggregated}"));
    let config_path = dir.join("supervisor.yaml");
    std::fs::write(&config_path, config.to_string())?;

    let api_service = "v1alpha1.clientsecret.supervisor.pinniped.dev";
    let service = format!("{prefix}-api");
    kubectl
        .run(&["delete", "service", &service, "-n", namespace])
        .await?;
    let external = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": "localhost"}})
    .to_string();
    kubectl
        .run_with_stdin(&["create", "-f", "-"], Some(&external))
        .await?;
    let port_patch = json!({"spec": {"service": {"port": aggregated}}}).to_string();
    kubectl
        .run(&[
            "patch",
            "apiservice",
            api_service,
            "--type=merge",
            "-p",
            &port_patch,
        ])
        .await?;
    let federation_domain = "helm-chart";
    let manifest = json!({"apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
        "kind": "FederationDomain",
        "metadata": {"name": federation_domain, "namespace": namespace},
        "spec": {"issuer": format!("https://127.0.0.1:{https}/helm-chart")}})
    .to_string();
    kubectl
        .run_with_stdin(&["create", "-f", "-"], Some(&manifest))
        .await?;

    let binary = selkie_e2e::workspace_binary("selkie-supervisor", "selkie-supervisor")?;
    let log_path = dir.join("supervisor.log");
    let log = std::fs::File::create(&log_path)?;
    let identity = format!("{prefix}-0");
    // setpriv: the Supervisor dies with the test even when the test is killed.
    let process = tokio::process::Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(&binary)
        .arg("--config")
        .arg(&config_path)
        .env("POD_NAME", &identity)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let process = std::cell::RefCell::new(process);
    // The log's last lines (a failure repeats itself there).
    let read_log = || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };

    let checked = async {
        eventually(Duration::from_secs(90), || async {
            let exited = process.borrow_mut().try_wait()?;
            if let Some(status) = exited {
                bail!("selkie-supervisor exited ({status})");
            }
            let holder = kubectl
                .run(&[
                    "get",
                    "lease",
                    &format!("{prefix}-leader-election"),
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.spec.holderIdentity}",
                ])
                .await?;
            ensure!(holder == identity, "the Lease is held by {holder:?}");
            for kind in KeySecret::ALL {
                kubectl
                    .run(&["get", "secret", &kind.name(federation_domain), "-n", namespace])
                    .await?;
            }
            let jwks = kubectl
                .run(&[
                    "get",
                    "federationdomain",
                    federation_domain,
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.status.secrets.jwks.name}",
                ])
                .await?;
            ensure!(
                jwks == KeySecret::Jwks.name(federation_domain),
                "status.secrets.jwks is {jwks:?}"
            );
            Ok(())
        })
        .await?;
        // The leader wrote the APIService's caBundle, and kube-apiserver reaches the aggregated API
        // (front-proxy authentication from kube-system's extension-apiserver-authentication).
        kubectl
            .run(&[
                "wait",
                "--for=condition=Available",
                "--timeout=60s",
                &format!("apiservice/{api_service}"),
            ])
            .await?;
        let discovery = kubectl
            .run(&[
                "get",
                "--raw",
                "/apis/clientsecret.supervisor.pinniped.dev/v1alpha1",
            ])
            .await?;
        ensure!(discovery.contains("oidcclientsecretrequests"), "{discovery}");
        anyhow::Ok(())
    }
    .await;
    let mut process = process.into_inner();
    if let Some(status) = process.try_wait()? {
        bail!("selkie-supervisor exited ({status}):\n{}", read_log());
    }
    process.start_kill()?;
    let _exit = process.wait().await?;
    checked.with_context(|| format!("the Supervisor with the chart's permissions:\n{}", read_log()))?;
    let log = std::fs::read_to_string(&log_path)?;
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|line| line.to_ascii_lowercase().contains("forbidden"))
        .collect();
    ensure!(
        forbidden.is_empty(),
        "the chart's permissions refused the Supervisor:\n{}",
        forbidden.join("\n")
    );
    Ok(())
}
