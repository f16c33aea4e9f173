//! TokenCredentialRequest and WhoAmIRequest answered by the impersonation proxy itself
//! (impersonation mode): a Dex ID token is exchanged anonymously for a 5-minute client
//! certificate of the proxy's signer CA, and kubectl with that certificate works through the
//! proxy against the real kube-apiserver.

use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full};
use selkie_e2e::{
    dex::{Dex, DexUser},
    pki::CertAndKey,
    proxy::{JwtSpec, Proxy},
    Cluster,
};
use serde_json::{json, Value};
use x509_cert::der::DecodePem;

use crate::proxy_kubectl::{certificate_credential_id, grant_configmaps, proxy_client, ProxyClient};

const TCR_PATH: &str = "/apis/login.concierge.pinniped.dev/v1alpha1/tokencredentialrequests";
const WHOAMI_PATH: &str = "/apis/identity.concierge.pinniped.dev/v1alpha1/whoamirequests";

async fn send(
    client: &ProxyClient,
    method: http::Method,
    url: String,
    body: &str,
) -> anyhow::Result<(u16, Value)> {
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))?;
    let response = client.request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&body)?))
}

fn token_credential_request(token: &str, kind: &str, name: &str) -> String {
    json!({
        "apiVersion": "login.concierge.pinniped.dev/v1alpha1",
        "kind": "TokenCredentialRequest",
        "metadata": {"creationTimestamp": null},
        "spec": {"token": token, "authenticator": {
            "apiGroup": "authentication.concierge.pinniped.dev", "kind": kind, "name": name}},
        "status": {},
    })
    .to_string()
}

const WHOAMI: &str =
    r#"{"apiVersion":"identity.concierge.pinniped.dev/v1alpha1","kind":"WhoAmIRequest","spec":{}}"#;

/// The subject's CN and O values and the validity of a PEM certificate.
fn read_certificate(pem: &str) -> anyhow::Result<(String, Vec<String>, Duration, SystemTime)> {
    let certificate = x509_cert::Certificate::from_pem(pem.as_bytes())?;
    let mut common_name = String::new();
    let mut organizations = Vec::new();
    for rdn in certificate.tbs_certificate.subject.0.iter() {
        for attribute in rdn.0.iter() {
            let value = attribute
                .value
                .decode_as::<x509_cert::der::asn1::Utf8StringRef<'_>>()?
                .to_string();
            if attribute.oid == x509_cert::der::oid::db::rfc4519::CN {
                common_name = value;
            } else if attribute.oid == x509_cert::der::oid::db::rfc4519::O {
                organizations.push(value);
            }
        }
    }
    let validity = certificate.tbs_certificate.validity;
    let not_before = validity.not_before.to_system_time();
    let not_after = validity.not_after.to_system_time();
    Ok((
        common_name,
        organizations,
        not_after.duration_since(not_before)?,
        not_after,
    ))
}

#[tokio::test]
async fn a_dex_token_becomes_a_client_certificate_that_works_through_the_proxy() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-login").await?;
    let user = DexUser {
        email: "tcr@example.com".into(),
        password: "password123".into(),
        user_id: "0a8b2c1d-0000-4000-8000-000000000002".into(),
        groups: vec!["ops".into(), "devs".into()],
    };
    let dex = Dex::start(std::slice::from_ref(&user)).await?;
    grant_configmaps(cluster, &namespace, "User", &user.email).await?;
    let proxy = Proxy::start(cluster, &[JwtSpec::for_dex(&dex)]).await?;
    let tokens = dex.password_grant(&user.email, &user.password).await?;
    let tcr_url = format!("{}{TCR_PATH}", proxy.url());
    let whoami_url = format!("{}{WHOAMI_PATH}", proxy.url());

    // Anonymous, as the CLI sends it, over HTTP/2 and HTTP/1.1.
    let mut issued = None;
    for http2 in [true, false] {
        let anonymous = proxy_client(&proxy, None, http2)?;
        let (status, answer) = send(
            &anonymous,
            http::Method::POST,
            tcr_url.clone(),
            &token_credential_request(&tokens.id_token, "JWTAuthenticator", "dex"),
        )
        .await?;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(answer["kind"], "TokenCredentialRequest");
        assert!(answer["status"].get("message").is_none(), "{answer}");
        assert_eq!(answer["spec"]["token"], "", "the token is not echoed back");
        let credential = &answer["status"]["credential"];
        let cert_pem = credential["clientCertificateData"].as_str().unwrap_or_default();
        let (common_name, groups, lifetime, not_after) = read_certificate(cert_pem)?;
        assert_eq!(common_name, user.email);
        assert_eq!(groups, ["ops", "devs"]);
        assert_eq!(
            lifetime,
            Duration::from_secs(600),
            "5 minutes, backdated 5 minutes"
        );
        let expires = credential["expirationTimestamp"].as_str().unwrap_or_default();
        assert_eq!(
            time::OffsetDateTime::parse(expires, &time::format_description::well_known::Rfc3339)?,
            time::OffsetDateTime::from(not_after),
            "expirationTimestamp is the certificate's notAfter"
        );
        issued = Some(CertAndKey {
            cert_pem: cert_pem.to_string(),
            key_pem: credential["clientKeyData"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        });
    }
    let issued = issued.expect("issued above");

    // kubectl with the certificate: the user and groups Dex asserted, RBAC as that user.
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_cert("tcr", &issued)?);
    let review: Value = serde_json::from_str(&kubectl.run(&["auth", "whoami", "-o", "json"]).await?)?;
    assert_eq!(review["status"]["userInfo"]["username"], user.email.as_str());
    kubectl
        .run(&["create", "configmap", "from-tcr", "-n", &namespace])
        .await?;

    // WhoAmIRequest, answered by the proxy for the certificate and for nobody.
    let (status, answer) = send(
        &proxy_client(&proxy, Some(&issued), true)?,
        http::Method::POST,
        whoami_url.clone(),
        WHOAMI,
    )
    .await?;
    assert_eq!(status, 201, "{answer}");
    let who = &answer["status"]["kubernetesUserInfo"]["user"];
    assert_eq!(who["username"], user.email.as_str(), "{answer}");
    assert_eq!(
        who["groups"],
        json!(["ops", "devs", "system:authenticated"]),
        "{answer}"
    );
    // The certificate's credential id, as kube-apiserver reports it for a certificate (and as
    // Pinniped's proxy passes it on).
    assert_eq!(
        who["extra"],
        json!({"authentication.kubernetes.io/credential-id": [certificate_credential_id(&issued.cert_pem)?]}),
        "{answer}"
    );
    let anonymous = proxy_client(&proxy, None, true)?;
    let (status, answer) = send(&anonymous, http::Method::POST, whoami_url.clone(), WHOAMI).await?;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["status"]["kubernetesUserInfo"]["user"],
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
    );

    // Failed logins are answered like Pinniped's: 201, "authentication failed", nothing else.
    for (token, kind, name) in [
        ("not-a-token", "JWTAuthenticator", "dex"),
        (tokens.id_token.as_str(), "JWTAuthenticator", "someone-else"),
        (tokens.id_token.as_str(), "WebhookAuthenticator", "dex"),
        ("", "JWTAuthenticator", "dex"),
    ] {
        let (status, answer) = send(
            &anonymous,
            http::Method::POST,
            tcr_url.clone(),
            &token_credential_request(token, kind, name),
        )
        .await?;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(
            answer["status"],
            json!({"message": "authentication failed"}),
            "{kind}/{name}"
        );
    }

    // The authenticator reference must name the authentication API group exactly, as in
    // Pinniped: any other group, or none, names no authenticator, with the token that works above.
    for api_group in [
        None,
        Some(""),
        Some("authentication.concierge.example.com"),
        Some("Authentication.concierge.pinniped.dev"),
        Some("authentication.concierge.pinniped.dev "),
        Some("login.concierge.pinniped.dev"),
    ] {
        let mut request: Value = serde_json::from_str(&token_credential_request(
            &tokens.id_token,
            "JWTAuthenticator",
            "dex",
        ))?;
        match api_group {
            Some(group) => request["spec"]["authenticator"]["apiGroup"] = json!(group),
            None => {
                request["spec"]["authenticator"]
                    .as_object_mut()
                    .map(|reference| reference.remove("apiGroup"));
            }
        }
        let (status, answer) = send(
            &anonymous,
            http::Method::POST,
            tcr_url.clone(),
            &request.to_string(),
        )
        .await?;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(
            answer["status"],
            json!({"message": "authentication failed"}),
            "apiGroup {api_group:?}"
        );
    }

    // Not JSON, or not create: a metav1.Status.
    let (status, refusal) = send(&anonymous, http::Method::POST, tcr_url.clone(), "{not json").await?;
    assert_eq!(
        (status, refusal["reason"].as_str()),
        (400, Some("BadRequest")),
        "{refusal}"
    );
    let (status, refusal) = send(&anonymous, http::Method::GET, tcr_url.clone(), "").await?;
    assert_eq!(
        (status, refusal["reason"].as_str()),
        (405, Some("MethodNotAllowed")),
        "{refusal}"
    );

    assert!(
        !proxy.log().contains(&tokens.id_token),
        "the proxy must never log a token"
    );
    Ok(())
}
