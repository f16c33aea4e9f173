use serde_json::{json, Value};

use super::*;

fn round_trip(yaml: &str) -> CredentialIssuer {
    let document: Value = serde_yaml::from_str(yaml).unwrap();
    let typed: CredentialIssuer = serde_json::from_value(document.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), document);
    typed
}

// Shaped like the CredentialIssuer Pinniped's install creates (deploy/concierge/deployment.yaml
// with its default values).
#[test]
fn pinniped_install_credential_issuer_round_trips() {
    let issuer = round_trip(
        r#"
apiVersion: config.concierge.pinniped.dev/v1alpha1
kind: CredentialIssuer
metadata:
  name: pinniped-concierge-config
  labels: {app: pinniped-concierge}
spec:
  impersonationProxy:
    mode: auto
    service:
      type: LoadBalancer
      annotations:
        service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout: "4000"
"#,
    );
    assert_eq!(
        issuer.metadata.name.as_deref(),
        Some(DEFAULT_CREDENTIAL_ISSUER_NAME)
    );
    let proxy = &issuer.spec.impersonation_proxy;
    assert_eq!(proxy.mode, ImpersonationProxyMode::Auto);
    assert_eq!(proxy.service.r#type, ImpersonationProxyServiceType::LoadBalancer);
    assert_eq!(
        proxy
            .service
            .annotations
            .get("service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout")
            .map(String::as_str),
        Some("4000")
    );
}

// Shaped like Pinniped's "impersonation proxy with external certificates" post.
#[test]
fn external_endpoint_and_tls_round_trip() {
    let issuer = round_trip(
        r#"
apiVersion: config.concierge.pinniped.dev/v1alpha1
kind: CredentialIssuer
metadata: {name: pinniped-concierge-config}
spec:
  impersonationProxy:
    externalEndpoint: impersonation-proxy-mtls.local
    mode: enabled
    service:
      type: ClusterIP
      loadBalancerIP: 10.0.0.7
    tls:
      certificateAuthorityData: LS0tLS1CRUdJTi0tLS0tCg==
      secretName: impersonation-proxy-tls-serving-cert
"#,
    );
    let proxy = issuer.spec.impersonation_proxy;
    assert_eq!(proxy.mode, ImpersonationProxyMode::Enabled);
    assert_eq!(
        proxy.external_endpoint.as_deref(),
        Some("impersonation-proxy-mtls.local")
    );
    assert_eq!(proxy.service.r#type, ImpersonationProxyServiceType::ClusterIP);
    assert_eq!(proxy.service.load_balancer_ip.as_deref(), Some("10.0.0.7"));
    assert_eq!(
        proxy.tls.and_then(|t| t.secret_name).as_deref(),
        Some("impersonation-proxy-tls-serving-cert")
    );
}

#[test]
fn absent_service_means_a_load_balancer() {
    let spec: CredentialIssuerSpec =
        serde_json::from_value(json!({"impersonationProxy": {"mode": "disabled"}})).unwrap();
    assert_eq!(
        spec.impersonation_proxy.service,
        ImpersonationProxyServiceSpec::default()
    );
    assert_eq!(
        spec.impersonation_proxy.service.r#type,
        ImpersonationProxyServiceType::LoadBalancer
    );
    let none: ImpersonationProxyServiceSpec = serde_json::from_value(json!({"type": "None"})).unwrap();
    assert_eq!(none.r#type, ImpersonationProxyServiceType::None);
}

#[test]
fn unknown_mode_is_refused() {
    let spec = json!({"impersonationProxy": {"mode": "sometimes"}});
    assert!(serde_json::from_value::<CredentialIssuerSpec>(spec).is_err());
}

// The status shapes `pinniped get kubeconfig` reads (REFERENCE.md §1.1).
#[test]
fn strategies_have_pinnipeds_wire_shape() {
    let status = json!({
        "strategies": [
            {
                "type": "KubeClusterSigningCertificate",
                "status": "Success",
                "reason": "FetchedKey",
                "message": "key was fetched successfully",
                "lastUpdateTime": "2026-11-21T10:00:00Z",
                "frontend": {
                    "type": "TokenCredentialRequestAPI",
                    "tokenCredentialRequestInfo": {
                        "server": "https://127.0.0.1:6443",
                        "certificateAuthorityData": "Y2E="
                    }
                }
            },
            {
                "type": "ImpersonationProxy",
                "status": "Success",
                "reason": "Listening",
                "message": "impersonation proxy is ready to accept client connections",
                "lastUpdateTime": "2026-11-21T10:00:01Z",
                "frontend": {
                    "type": "ImpersonationProxy",
                    "impersonationProxyInfo": {
                        "endpoint": "https://proxy.example.com",
                        "certificateAuthorityData": "Y2E="
                    }
                }
            },
            {
                "type": "ImpersonationProxy",
                "status": "Error",
                "reason": "Disabled",
                "message": "impersonation proxy was explicitly disabled by configuration",
                "lastUpdateTime": "2026-11-21T10:00:02Z"
            }
        ]
    });
    let typed: CredentialIssuerStatus = serde_json::from_value(status.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), status);

    let tcr = typed.strategies[0].frontend.as_ref().unwrap();
    assert_eq!(tcr.r#type, FrontendType::TokenCredentialRequestAPI);
    assert_eq!(
        tcr.token_credential_request_api_info
            .as_ref()
            .map(|i| i.server.as_str()),
        Some("https://127.0.0.1:6443")
    );
    assert_eq!(typed.strategies[1].reason, StrategyReason::Listening);
    assert_eq!(typed.strategies[2].status, StrategyStatus::Error);
    assert_eq!(typed.strategies[2].frontend, None);
}

#[test]
fn constants_match_the_derived_resource() {
    use kube_core::Resource;
    assert_eq!(CredentialIssuer::group(&()), GROUP);
    assert_eq!(CredentialIssuer::version(&()), VERSION);
    assert_eq!(CredentialIssuer::plural(&()), "credentialissuers");
}
