//! The Services in front of the impersonation proxy, as Pinniped manages them: the desired
//! Service of each type, and how an existing one is brought to it without disturbing what other
//! actors put there (annotations the CredentialIssuer spec never named).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Service, ServicePort, ServiceSpec},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

use selkie_api::concierge_config::ImpersonationProxyServiceSpec;

use super::spec::DEFAULT_HTTPS_PORT;
use crate::config::ControlPlaneConfig;

/// The bookkeeping annotation that lists (as a sorted JSON array) the annotation keys that came
/// from `spec.impersonationProxy.service.annotations`, so that keys removed from the spec are
/// removed from the Service and keys other actors added are kept.
pub(crate) const ANNOTATION_KEYS_KEY: &str = "credentialissuer.pinniped.dev/annotation-keys";

/// The label whose value selects the Concierge's pods.
const APP_LABEL_KEY: &str = "app";

/// The name of the LoadBalancer Service.
pub(crate) fn load_balancer_name(config: &ControlPlaneConfig) -> String {
    config.name("impersonation-proxy-load-balancer")
}

/// The name of the ClusterIP Service.
pub(crate) fn cluster_ip_name(config: &ControlPlaneConfig) -> String {
    config.name("impersonation-proxy-cluster-ip")
}

/// The Service named `name` of `type_` (`LoadBalancer` or `ClusterIP`): port 443 to the proxy's
/// port, selecting the pods by their `app` label, with the spec's annotations (plus the
/// bookkeeping annotation when there are any) and, for a LoadBalancer, its `loadBalancerIP` and
/// `loadBalancerSourceRanges` (`Some` only when the spec names them: see [`updated`]).
pub(crate) fn desired(
    config: &ControlPlaneConfig,
    name: String,
    type_: &str,
    service: &ImpersonationProxyServiceSpec,
) -> Service {
    let load_balancer = type_ == "LoadBalancer";
    let load_balancer_ip = service
        .load_balancer_ip
        .clone()
        .filter(|ip| load_balancer && !ip.is_empty());
    let source_ranges = service
        .load_balancer_source_ranges
        .clone()
        .filter(|_| load_balancer);
    let mut annotations = service.annotations.clone();
    if !annotations.is_empty() {
        let keys: Vec<&String> = annotations.keys().collect();
        // A list of strings always serializes.
        let keys = serde_json::to_string(&keys).unwrap_or_default();
        annotations.insert(ANNOTATION_KEYS_KEY.into(), keys);
    }
    let app = config.labels.get(APP_LABEL_KEY).cloned().unwrap_or_default();
    Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(config.namespace.clone()),
            labels: Some(config.labels.clone()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            ports: Some(vec![ServicePort {
                port: i32::from(DEFAULT_HTTPS_PORT),
                target_port: Some(IntOrString::Int(i32::from(config.impersonation_proxy_port))),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            load_balancer_ip,
            load_balancer_source_ranges: source_ranges,
            selector: Some(BTreeMap::from([(APP_LABEL_KEY.to_string(), app)])),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// `existing` brought to `desired`, or `None` when it already is: labels, type, selector and
/// `loadBalancerIP` replaced; `loadBalancerSourceRanges` replaced only when `desired` names them
/// (an empty list clears them: an admin's own ranges on the Service are never dropped because
/// the spec is silent about them); the desired annotations merged in; annotations an earlier spec
/// named (per the bookkeeping annotation) and this one does not removed; the bookkeeping
/// annotation removed when the spec names none. Ports are left alone, as Pinniped does.
pub(crate) fn updated(existing: &Service, desired: &Service) -> Option<Service> {
    let mut updated = existing.clone();
    updated.metadata.labels = desired.metadata.labels.clone();
    let desired_spec = desired.spec.clone().unwrap_or_default();
    let spec = updated.spec.get_or_insert_with(ServiceSpec::default);
    spec.load_balancer_ip = desired_spec.load_balancer_ip;
    if let Some(ranges) = desired_spec.load_balancer_source_ranges {
        spec.load_balancer_source_ranges = (!ranges.is_empty()).then_some(ranges);
    }
    spec.type_ = desired_spec.type_;
    spec.selector = desired_spec.selector;

    let desired_annotations = desired.metadata.annotations.clone().unwrap_or_default();
    let annotations = updated.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.extend(desired_annotations.clone());
    let previous_keys: Vec<String> = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_KEYS_KEY))
        // An unreadable bookkeeping annotation counts as absent; it is rewritten below.
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    for key in previous_keys {
        if !desired_annotations.contains_key(&key) {
            annotations.remove(&key);
        }
    }
    if desired_annotations.is_empty() {
        annotations.remove(ANNOTATION_KEYS_KEY);
    }
    if existing.metadata.annotations.is_none() && annotations.is_empty() {
        updated.metadata.annotations = None;
    }
    (updated != *existing).then_some(updated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ControlPlaneConfig {
        ControlPlaneConfig::default()
    }

    fn service(ip: Option<&str>, pairs: &[(&str, &str)]) -> ImpersonationProxyServiceSpec {
        ImpersonationProxyServiceSpec {
            load_balancer_ip: ip.map(str::to_string),
            annotations: annotations(pairs),
            ..ImpersonationProxyServiceSpec::default()
        }
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_desired_service_is_pinnipeds() {
        let service = desired(
            &config(),
            load_balancer_name(&config()),
            "LoadBalancer",
            &service(Some("10.9.8.7"), &[("b", "2"), ("a", "1")]),
        );
        assert_eq!(
            service.metadata.name.as_deref(),
            Some("pinniped-concierge-impersonation-proxy-load-balancer")
        );
        let spec = service.spec.unwrap();
        let port = &spec.ports.unwrap()[0];
        assert_eq!(
            (port.port, port.target_port.clone()),
            (443, Some(IntOrString::Int(8444)))
        );
        assert_eq!(spec.load_balancer_ip.as_deref(), Some("10.9.8.7"));
        assert_eq!(spec.selector.unwrap()["app"], "pinniped-concierge");
        let annotations = service.metadata.annotations.unwrap();
        assert_eq!(annotations[ANNOTATION_KEYS_KEY], r#"["a","b"]"#);
        assert_eq!(
            cluster_ip_name(&config()),
            "pinniped-concierge-impersonation-proxy-cluster-ip"
        );
    }

    #[test]
    fn updates_merge_annotations_and_remove_only_the_ones_the_spec_dropped() {
        let name = load_balancer_name(&config());
        let first = desired(
            &config(),
            name.clone(),
            "LoadBalancer",
            &service(None, &[("a", "1"), ("b", "2")]),
        );
        assert_eq!(updated(&first, &first), None);

        let mut existing = first.clone();
        // Another actor adds its own annotation.
        existing
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("other".into(), "kept".into());
        let second = desired(
            &config(),
            name.clone(),
            "LoadBalancer",
            &service(None, &[("b", "3"), ("c", "4")]),
        );
        let next = updated(&existing, &second).unwrap();
        assert_eq!(
            next.metadata.annotations.clone().unwrap(),
            annotations(&[
                ("b", "3"),
                ("c", "4"),
                ("other", "kept"),
                (ANNOTATION_KEYS_KEY, r#"["b","c"]"#)
            ])
        );

        let none = desired(&config(), name, "LoadBalancer", &service(Some("1.2.3.4"), &[]));
        let last = updated(&next, &none).unwrap();
        assert_eq!(
            last.metadata.annotations.unwrap(),
            annotations(&[("other", "kept")])
        );
        assert_eq!(last.spec.unwrap().load_balancer_ip.as_deref(), Some("1.2.3.4"));
    }

    #[test]
    fn source_ranges_are_set_replaced_and_cleared_only_when_the_spec_names_them() {
        let name = load_balancer_name(&config());
        let ranges = |list: Option<&[&str]>| ImpersonationProxyServiceSpec {
            load_balancer_source_ranges: list.map(|l| l.iter().map(|r| r.to_string()).collect()),
            ..ImpersonationProxyServiceSpec::default()
        };
        let of = |service: &Service| service.spec.clone().unwrap().load_balancer_source_ranges;
        let first = desired(
            &config(),
            name.clone(),
            "LoadBalancer",
            &ranges(Some(&["203.0.113.0/24"])),
        );
        assert_eq!(of(&first), Some(vec!["203.0.113.0/24".to_string()]));
        // A ClusterIP Service never carries them (kube-apiserver refuses them there).
        let cluster_ip = desired(
            &config(),
            cluster_ip_name(&config()),
            "ClusterIP",
            &ranges(Some(&["203.0.113.0/24"])),
        );
        assert_eq!(of(&cluster_ip), None);

        // Replaced when the spec names others.
        let other = desired(
            &config(),
            name.clone(),
            "LoadBalancer",
            &ranges(Some(&["198.51.100.0/24", "fd00::/8"])),
        );
        let next = updated(&first, &other).unwrap();
        assert_eq!(
            of(&next),
            Some(vec!["198.51.100.0/24".to_string(), "fd00::/8".to_string()])
        );
        assert_eq!(updated(&next, &other), None);

        // Left alone when the spec is silent: an admin's own ranges stay.
        let silent = desired(&config(), name.clone(), "LoadBalancer", &ranges(None));
        assert_eq!(updated(&next, &silent), None);

        // Cleared by an empty list.
        let cleared = updated(
            &next,
            &desired(&config(), name, "LoadBalancer", &ranges(Some(&[]))),
        )
        .unwrap();
        assert_eq!(of(&cleared), None);
    }
}
