use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{PodStatus, Toleration, Volume, VolumeMount},
    apimachinery::pkg::apis::meta::v1::Time,
};

use super::*;
use selkie_kube::certs;

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn flags_are_parsed_as_pflag_does() {
    let names = CERT_FLAGS;
    assert_eq!(
        flag_value(
            &args("kube-controller-manager --cluster-signing-cert-file=/a.crt --v=2"),
            &names
        )
        .as_deref(),
        Some("/a.crt")
    );
    assert_eq!(
        flag_value(
            &args("kube-controller-manager --cluster-signing-cert-file /b.crt"),
            &names
        )
        .as_deref(),
        Some("/b.crt")
    );
    // The first name wins over the second, whatever the order on the command line.
    assert_eq!(
        flag_value(
            &args("--cluster-signing-kube-apiserver-client-cert-file=/client.crt --cluster-signing-cert-file=/main.crt"),
            &names
        )
        .as_deref(),
        Some("/main.crt")
    );
    assert_eq!(
        flag_value(
            &args("--cluster-signing-kube-apiserver-client-cert-file=/client.crt"),
            &names
        )
        .as_deref(),
        Some("/client.crt")
    );
    // The last occurrence wins; an empty value is no value.
    assert_eq!(
        flag_value(
            &args("--cluster-signing-cert-file=/1 --cluster-signing-cert-file=/2"),
            &names
        )
        .as_deref(),
        Some("/2")
    );
    assert_eq!(flag_value(&args("--cluster-signing-cert-file="), &names), None);
    // An unknown flag's separate value is skipped, not taken for a flag.
    assert_eq!(
        flag_value(&args("--unknown value --cluster-signing-cert-file=/c"), &names).as_deref(),
        Some("/c")
    );
    // Parsing stops at `--` and at a known flag without a value.
    assert_eq!(
        flag_value(&args("-- --cluster-signing-cert-file=/d"), &names),
        None
    );
    assert_eq!(flag_value(&args("--cluster-signing-cert-file"), &names), None);
    // Single-dash spellings are shorthands, not these flags.
    assert_eq!(flag_value(&args("-cluster-signing-cert-file=/e"), &names), None);
    assert_eq!(
        flag_value(&args("kube-controller-manager --leader-elect=true"), &names),
        None
    );
}

fn controller_manager(command: &str, args_line: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("kube-controller-manager-node-1".into()),
            namespace: Some("kube-system".into()),
            labels: Some(BTreeMap::from([(
                "component".to_string(),
                "kube-controller-manager".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "kube-controller-manager".into(),
                command: Some(args(command)),
                args: Some(args(args_line)),
                volume_mounts: Some(vec![VolumeMount {
                    name: "k8s-certs".into(),
                    mount_path: "/etc/kubernetes/pki".into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                }]),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: "k8s-certs".into(),
                ..Volume::default()
            }]),
            node_name: Some("node-1".into()),
            node_selector: Some(BTreeMap::from([(
                "role".to_string(),
                "control-plane".to_string(),
            )])),
            tolerations: Some(vec![Toleration {
                effect: Some("NoSchedule".into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            host_network: Some(true),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[test]
fn signing_paths_come_from_the_flags_or_the_defaults() {
    let pod = controller_manager(
        "kube-controller-manager --cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt",
        "--cluster-signing-key-file /etc/kubernetes/pki/ca.key",
    );
    assert_eq!(
        signing_paths(&pod),
        (
            "/etc/kubernetes/pki/ca.crt".to_string(),
            "/etc/kubernetes/pki/ca.key".to_string()
        )
    );
    let none = controller_manager("kube-controller-manager", "--v=2");
    assert_eq!(
        signing_paths(&none),
        (DEFAULT_CERT_PATH.to_string(), DEFAULT_KEY_PATH.to_string())
    );
    let empty = Pod::default();
    assert_eq!(signing_paths(&empty).0, DEFAULT_CERT_PATH);
}

fn agent(image: &str) -> AgentConfig {
    serde_yaml::from_str(&format!("image: {image}")).unwrap()
}

#[test]
fn the_deployment_copies_the_placement_and_is_pinnipeds() {
    let mut config = ControlPlaneConfig::default();
    config.labels.insert("team".into(), "auth".into());
    let pod = controller_manager(
        "kube-controller-manager --cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt --cluster-signing-key-file=/etc/kubernetes/pki/ca.key",
        "",
    );
    let mut agent = agent("registry.example/selkie:1");
    agent.priority_class_name = Some("system-cluster-critical".into());
    agent.image_pull_secrets = vec!["pull".into()];
    let deployment = agent_deployment(&config, &agent, &pod);

    assert_eq!(
        deployment.metadata.name.as_deref(),
        Some("pinniped-concierge-kube-cert-agent")
    );
    assert_eq!(
        deployment.metadata.namespace.as_deref(),
        Some("pinniped-concierge")
    );
    assert_eq!(deployment.metadata.labels.as_ref(), Some(&config.labels));
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.min_ready_seconds, Some(10));
    assert_eq!(spec.selector.match_labels, Some(agent_selector()));
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    assert_eq!(
        labels,
        BTreeMap::from([
            (AGENT_LABEL_KEY.to_string(), AGENT_LABEL_VALUE.to_string()),
            ("team".to_string(), "auth".to_string()),
        ]),
        "never the Concierge's app label"
    );
    let pod_spec = spec.template.spec.unwrap();
    let source = pod.spec.unwrap();
    assert_eq!(pod_spec.node_name, source.node_name);
    assert_eq!(pod_spec.node_selector, source.node_selector);
    assert_eq!(pod_spec.tolerations, source.tolerations);
    assert_eq!(pod_spec.volumes, source.volumes);
    assert_eq!(pod_spec.host_network, Some(true));
    assert_eq!(
        pod_spec.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    assert_eq!(pod_spec.termination_grace_period_seconds, Some(0));
    let security = pod_spec.security_context.unwrap();
    assert_eq!((security.run_as_user, security.run_as_group), (Some(0), Some(0)));
    assert_eq!(
        pod_spec.image_pull_secrets,
        Some(vec![LocalObjectReference { name: "pull".into() }])
    );
    let [container] = pod_spec.containers.as_slice() else {
        panic!("one container");
    };
    assert_eq!(container.name, "sleeper");
    assert_eq!(container.image.as_deref(), Some("registry.example/selkie:1"));
    assert_eq!(
        container.command,
        Some(vec!["selkie-kube-cert-agent".to_string(), "sleep".to_string()])
    );
    assert_eq!(container.volume_mounts, source.containers[0].volume_mounts);
    let env: Vec<(String, Option<String>)> = container
        .env
        .iter()
        .flatten()
        .map(|var| (var.name.clone(), var.value.clone()))
        .collect();
    assert_eq!(
        env,
        [
            (
                "CERT_PATH".to_string(),
                Some("/etc/kubernetes/pki/ca.crt".to_string())
            ),
            (
                "KEY_PATH".to_string(),
                Some("/etc/kubernetes/pki/ca.key".to_string())
            ),
        ]
    );
    let resources = container.resources.clone().unwrap();
    let limits = resources.limits.unwrap();
    assert_eq!(limits["memory"].0, "32Mi");
    assert_eq!(limits["cpu"].0, "20m");
    let requests = resources.requests.unwrap();
    assert_eq!(requests["memory"].0, "32Mi");
    assert_eq!(requests["cpu"].0, "0");

    // Without a priority class or pull secrets, neither is set.
    let plain = agent_deployment(&config, &self::agent("i"), &controller_manager("kcm", ""));
    let plain_spec = plain.spec.unwrap().template.spec.unwrap();
    assert_eq!(plain_spec.priority_class_name, None);
    assert_eq!(plain_spec.image_pull_secrets, None);
}

fn pod_at(name: &str, seconds: i64, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            creation_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        }),
    }
}

#[test]
fn the_newest_running_pod_comes_first() {
    let pods = [
        pod_at("old", 100, "Running"),
        pod_at("newest-pending", 300, "Pending"),
        pod_at("b", 200, "Running"),
        pod_at("a", 200, "Running"),
    ];
    let names: Vec<_> = running_newest_first(&pods)
        .iter()
        .map(|pod| pod.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "old"]);
}

#[test]
fn messages_are_pinnipeds() {
    assert_eq!(
        AgentError::NoHealthyControllerManager { candidates: 0 }.to_string(),
        "could not find a healthy kube-controller-manager pod (0 candidates): note that this error is the expected behavior for some cluster types, including most cloud provider clusters (e.g. GKE, AKS, EKS)"
    );
    assert_eq!(
        AgentError::NoHealthyControllerManager { candidates: 1 }.to_string(),
        "could not find a healthy kube-controller-manager pod (1 candidate)"
    );
    assert_eq!(
        AgentError::NoHealthyAgentPod { candidates: 2 }.to_string(),
        "could not find a healthy agent pod (2 candidates)"
    );
}

#[test]
fn only_an_agent_pod_that_is_not_running_yet_is_a_passing_failure() {
    for candidates in [0, 1, 2] {
        assert!(AgentError::NoHealthyAgentPod { candidates }.is_not_yet());
    }
    let pod = || "ns/agent".to_string();
    let error = || "boom".to_string();
    for lasting in [
        AgentError::NoHealthyControllerManager { candidates: 0 },
        AgentError::NoHealthyControllerManager { candidates: 1 },
        AgentError::ListControllerManagers(error()),
        AgentError::ChooseControllerManager(error()),
        AgentError::Deployment(error()),
        AgentError::ListAgentPods(error()),
        AgentError::Exec {
            pod: pod(),
            error: error(),
        },
        AgentError::DecodeJson {
            pod: pod(),
            error: error(),
        },
        AgentError::DecodeCert {
            pod: pod(),
            error: error(),
        },
        AgentError::DecodeKey {
            pod: pod(),
            error: error(),
        },
        AgentError::SetKey {
            pod: pod(),
            error: error(),
        },
    ] {
        assert!(!lasting.is_not_yet(), "{lasting}");
    }
}

#[test]
fn agent_output_round_trips_and_bad_output_is_named() {
    let pair = certs::generate_ca("cluster", Duration::from_secs(3600)).unwrap();
    let line = AgentOutput::new(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).to_json_line();
    assert!(line.ends_with('\n'));
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(value["tls.crt"].is_string() && value["tls.key"].is_string());
    assert_eq!(AgentOutput::decode(&line, "ns/agent").unwrap(), pair);

    let error = AgentOutput::decode("not json", "ns/agent")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("failed to decode signing cert/key JSON from agent pod ns/agent: "),
        "{error}"
    );
    let error = AgentOutput::decode(r#"{"tls.crt":"***","tls.key":""}"#, "ns/agent")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("failed to decode signing cert base64 from agent pod ns/agent: "),
        "{error}"
    );
    let garbage = AgentOutput::new(b"not a cert", b"not a key").to_json_line();
    let error = AgentOutput::decode(&garbage, "ns/agent").unwrap_err().to_string();
    assert!(
        error.starts_with("failed to set signing cert/key content from agent pod ns/agent: "),
        "{error}"
    );
}

#[test]
fn the_agent_configuration_needs_an_image() {
    assert!(serde_yaml::from_str::<AgentConfig>("{}").is_err());
    assert!(serde_yaml::from_str::<AgentConfig>("{image: x, imag: y}").is_err());
    let parsed = agent("x");
    assert_eq!(parsed.binary, DEFAULT_AGENT_BINARY);
    parsed.validate().unwrap();
    assert_eq!(
        agent("''").validate().unwrap_err().0,
        "clusterSigningKey.agent.image"
    );
}
