//! Service-account tokens through the impersonation proxy, as through Pinniped's: a bearer token
//! no configured authenticator accepts is reviewed by kube-apiserver's own TokenReview (the
//! proxy's `upstream.tokenReview`, on by default), and an identity with a UID — every service
//! account — cannot be impersonated, so the caller's token goes to kube-apiserver unchanged. The
//! real kubectl with real service-account tokens (`kubectl create token`) against the real
//! kube-apiserver: the identity kube-apiserver sees (with its UID), its RBAC, its nested
//! impersonation, refused and revoked tokens, the switch, the proxy's rotating token file, and the
//! Concierge installed from its manifests.

use std::{path::Path, time::Duration};

use anyhow::{ensure, Context as _};
use http_body_util::{BodyExt as _, Full};
use selkie_e2e::{
    cluster::write_kubeconfig_for_user,
    concierge::InstalledConcierge,
    kubectl::Kubectl,
    proxy::{Proxy, PROXY_USER},
    Cluster,
};
use serde_json::{json, Value};

use crate::{
    eventually,
    proxy_kubectl::{proxy_client, review_with, ProxyClient},
};

/// What kubectl prints for a 401 (the proxy's refusals read as kube-apiserver's own).
const UNAUTHORIZED: &str = "You must be logged in to the server";
/// The extra in which Pinniped's proxy records the original caller of an impersonation.
const ORIGINAL_USER_INFO: &str = "original-user-info.impersonation-proxy.concierge.pinniped.dev";
const WHOAMI_PATH: &str = "/apis/identity.concierge.pinniped.dev/v1alpha1/whoamirequests";
const TCR_PATH: &str = "/apis/login.concierge.pinniped.dev/v1alpha1/tokencredentialrequests";
const WHOAMI: &str =
    r#"{"apiVersion":"identity.concierge.pinniped.dev/v1alpha1","kind":"WhoAmIRequest","spec":{}}"#;

/// A service account `name` in `ns`: its UID and a fresh 10-minute token for it.
async fn service_account(cluster: &Cluster, ns: &str, name: &str) -> anyhow::Result<(String, String)> {
    let kubectl = cluster.kubectl();
    kubectl.run(&["create", "serviceaccount", name, "-n", ns]).await?;
    Ok((
        kubectl
            .run(&[
                "get",
                "serviceaccount",
                name,
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.uid}",
            ])
            .await?,
        token(cluster, ns, name).await?,
    ))
}

/// A fresh 10-minute token of the service account `ns/name`.
async fn token(cluster: &Cluster, ns: &str, name: &str) -> anyhow::Result<String> {
    Ok(cluster
        .kubectl()
        .run(&["create", "token", name, "-n", ns, "--duration=10m"])
        .await?
        .trim()
        .to_string())
}

/// Lets `ns/account` get and list ConfigMaps in `ns`, nothing else.
async fn grant_configmap_reading(cluster: &Cluster, ns: &str, account: &str) -> anyhow::Result<()> {
    let kubectl = cluster.kubectl();
    kubectl
        .run(&[
            "create",
            "role",
            "configmap-reader",
            "--verb=get,list",
            "--resource=configmaps",
            "-n",
            ns,
        ])
        .await?;
    kubectl
        .run(&[
            "create",
            "rolebinding",
            &format!("{account}-reads-configmaps"),
            "--role=configmap-reader",
            &format!("--serviceaccount={ns}:{account}"),
            "-n",
            ns,
        ])
        .await?;
    Ok(())
}

/// `kubectl auth whoami -o json` (a SelfSubjectReview, which kube-apiserver answers) with `args`.
async fn whoami(kubectl: &Kubectl, args: &[&str]) -> anyhow::Result<Value> {
    let output = kubectl
        .run(&[&["auth", "whoami", "-o", "json"][..], args].concat())
        .await?;
    Ok(serde_json::from_str::<Value>(&output)?["status"]["userInfo"].clone())
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// Asserts that kube-apiserver saw the service account `ns/name` itself, authenticated by its
/// own token: its name, its UID and groups, the token's credential id (`JTI=…`), and no trace of
/// an impersonation (which could not carry the UID, and would record the original caller).
fn assert_service_account_itself(info: &Value, ns: &str, name: &str, uid: &str) {
    assert_eq!(
        info["username"],
        format!("system:serviceaccount:{ns}:{name}"),
        "{info}"
    );
    assert_eq!(info["uid"], uid, "{info}");
    let groups = strings(&info["groups"]);
    for group in [
        "system:serviceaccounts",
        &format!("system:serviceaccounts:{ns}"),
        "system:authenticated",
    ] {
        assert!(groups.iter().any(|g| g == group), "{group} missing: {info}");
    }
    let extra = &info["extra"];
    assert!(
        strings(&extra["authentication.kubernetes.io/credential-id"])
            .iter()
            .any(|id| id.starts_with("JTI=")),
        "kube-apiserver authenticated the token itself: {info}"
    );
    assert!(extra.get(ORIGINAL_USER_INFO).is_none(), "impersonated: {info}");
}

/// POSTs `body` to `path` through `client` with `headers`; the status and the JSON answer.
async fn post(
    client: &ProxyClient,
    proxy: &Proxy,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, Value)> {
    let mut request =
        http::Request::post(format!("{}{path}", proxy.url())).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(bytes::Bytes::from(body.to_string())))?)
        .await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&body)?))
}

/// Lets the user `caller` impersonate only the user `target`, cluster-wide.
async fn grant_impersonating(
    cluster: &Cluster,
    role: &str,
    caller: &str,
    target: &str,
) -> anyhow::Result<()> {
    let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"],
                    "resourceNames": [target]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": caller}]}
    ]});
    cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&rbac.to_string()))
        .await?;
    Ok(())
}

/// Waits (up to 10 s: audit lines reach the log from a writer thread) for an audit line of the
/// proxy that contains every one of `parts`.
async fn audited(proxy: &Proxy, parts: &[&str]) -> anyhow::Result<()> {
    eventually(Duration::from_secs(10), || async {
        let log = proxy.log();
        ensure!(
            log.lines()
                .any(|line| line.contains("selkie::audit") && parts.iter().all(|part| line.contains(part))),
            "no audit line with {parts:?} in:\n{log}"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn service_account_tokens_pass_through_the_proxy_to_kube_apiserver() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "proxy-sa").await?;
    let (uid, token) = service_account(cluster, &ns, "robot").await?;
    let robot = format!("system:serviceaccount:{ns}:robot");
    grant_configmap_reading(cluster, &ns, "robot").await?;
    cluster
        .kubectl()
        .run(&[
            "create",
            "configmap",
            "hello",
            "--from-literal=greeting=hi",
            "-n",
            &ns,
        ])
        .await?;
    // The proxy authenticates to kube-apiserver with a client certificate (the harness's default).
    let proxy = Proxy::start(cluster, &[]).await?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_token("robot", &token)?);

    // kube-apiserver sees the service account itself, UID included: its token arrived unchanged.
    let info = whoami(&kubectl, &[]).await?;
    assert_service_account_itself(&info, &ns, "robot", &uid);
    audited(&proxy, &[&robot, r#""authenticator":"kube-apiserver""#]).await?;

    // Its RBAC applies: what it may do works, and what it may not is kube-apiserver's 403.
    let greeting = kubectl
        .run(&[
            "get",
            "configmap",
            "hello",
            "-n",
            &ns,
            "-o",
            "jsonpath={.data.greeting}",
        ])
        .await?;
    assert_eq!(greeting, "hi");
    let forbidden = kubectl.output(&["get", "secrets", "-n", &ns], None).await?;
    assert!(
        !forbidden.success
            && forbidden.stderr.contains("Forbidden")
            && forbidden
                .stderr
                .contains(&format!(r#"User "{robot}" cannot list resource "secrets""#)),
        "{}",
        forbidden.stderr
    );
    let forbidden = kubectl
        .output(&["create", "configmap", "mine", "-n", &ns], None)
        .await?;
    assert!(
        !forbidden.success
            && forbidden
                .stderr
                .contains(&format!(r#"User "{robot}" cannot create"#)),
        "{}",
        forbidden.stderr
    );

    // Tokens kube-apiserver refuses are the proxy's 401: garbage, a forged signature, and the
    // token of a deleted service account.
    let (_, orphan) = service_account(cluster, &ns, "deleted").await?;
    cluster
        .kubectl()
        .run(&["delete", "serviceaccount", "deleted", "-n", &ns])
        .await?;
    let (signed, signature) = token.rsplit_once('.').context("a JWT")?;
    let forged = format!("{signed}.{}", signature.chars().rev().collect::<String>());
    for (name, bad) in [
        ("garbage", "not-a-token"),
        ("forged", forged.as_str()),
        ("orphan", orphan.as_str()),
    ] {
        let kubectl = proxy.kubectl(&proxy.kubeconfig_with_token(name, bad)?);
        let refused = eventually(Duration::from_secs(15), || async {
            let output = kubectl.output(&["get", "configmaps", "-n", &ns], None).await?;
            ensure!(!output.success, "{name} accepted");
            Ok(output)
        })
        .await?;
        assert!(
            refused.stderr.contains(UNAUTHORIZED),
            "{name}: {}",
            refused.stderr
        );
    }
    // The proxy refused them itself, on kube-apiserver's word.
    audited(&proxy, &["kube-apiserver:not_authenticated"]).await?;

    // The proxy's own WhoAmIRequest answers for the service account too.
    let raw = proxy_client(&proxy, None, true)?;
    let bearer = format!("Bearer {token}");
    let (status, answer) = post(&raw, &proxy, WHOAMI_PATH, WHOAMI, &[("authorization", &bearer)]).await?;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["status"]["kubernetesUserInfo"]["user"]["username"],
        robot.as_str(),
        "{answer}"
    );

    // No TokenCredentialRequest can use kube-apiserver's TokenReview: it is no
    // WebhookAuthenticator, whatever name the request gives.
    for (kind, name) in [
        ("WebhookAuthenticator", "kube-apiserver"),
        ("JWTAuthenticator", "kube-apiserver"),
    ] {
        let request = json!({
            "apiVersion": "login.concierge.pinniped.dev/v1alpha1",
            "kind": "TokenCredentialRequest",
            "spec": {"token": token, "authenticator": {
                "apiGroup": "authentication.concierge.pinniped.dev", "kind": kind, "name": name}},
        })
        .to_string();
        let (status, answer) = post(&raw, &proxy, TCR_PATH, &request, &[]).await?;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(answer["status"]["message"], "authentication failed", "{answer}");
        assert!(answer["status"].get("credential").is_none(), "{answer}");
    }
    assert!(!proxy.log().contains(&token), "the proxy never logs a token");
    Ok(())
}

#[tokio::test]
async fn a_service_accounts_nested_impersonation_is_kube_apiservers_decision() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "proxy-sa-nested").await?;
    let (_, token) = service_account(cluster, &ns, "robot").await?;
    let robot = format!("system:serviceaccount:{ns}:robot");
    let target = format!("target-{ns}");
    let proxy = Proxy::start(cluster, &[]).await?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_token("robot", &token)?);
    let raw = proxy_client(&proxy, None, true)?;
    let bearer = format!("Bearer {token}");

    // Without a grant, --as is refused in kube-apiserver's own words, for the service account:
    // the proxy (which may impersonate anyone) lends it nothing.
    for who in [target.as_str(), "system:admin", PROXY_USER] {
        let (status, refusal) = review_with(
            &raw,
            proxy.url(),
            &[("authorization", &bearer), ("impersonate-user", who)],
        )
        .await?;
        assert_eq!(status, 403, "{refusal}");
        assert_eq!(
            refusal["message"],
            format!(
                "users \"{who}\" is forbidden: User \"{robot}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
            ),
            "{refusal}"
        );
    }
    let refused = kubectl
        .output(&["get", "configmaps", "-n", &ns, "--as", &target], None)
        .await?;
    assert!(
        !refused.success && refused.stderr.contains("Forbidden"),
        "{}",
        refused.stderr
    );
    // The WhoAmIRequest the proxy answers itself is checked by the proxy, as kube-apiserver would.
    let (status, refusal) = post(
        &raw,
        &proxy,
        WHOAMI_PATH,
        WHOAMI,
        &[("authorization", &bearer), ("impersonate-user", &target)],
    )
    .await?;
    assert_eq!(status, 403, "{refusal}");

    // With a grant for the target only, the service account acts as the target, and as nobody
    // else: not system:admin, not with system:masters.
    grant_impersonating(cluster, &format!("{ns}-impersonate"), &robot, &target).await?;
    let info = eventually(Duration::from_secs(10), || async {
        whoami(&kubectl, &["--as", &target]).await
    })
    .await?;
    assert_eq!(info["username"], target.as_str(), "{info}");
    assert!(info.get("uid").is_none(), "{info}");
    assert!(
        !strings(&info["groups"]).contains(&"system:serviceaccounts".to_string()),
        "{info}"
    );
    let (status, answer) = post(
        &raw,
        &proxy,
        WHOAMI_PATH,
        WHOAMI,
        &[("authorization", &bearer), ("impersonate-user", &target)],
    )
    .await?;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["status"]["kubernetesUserInfo"]["user"]["username"],
        target.as_str(),
        "{answer}"
    );
    for headers in [
        vec![("impersonate-user", "system:admin")],
        vec![
            ("impersonate-user", target.as_str()),
            ("impersonate-group", "system:masters"),
        ],
    ] {
        let mut headers = headers;
        headers.push(("authorization", &bearer));
        let (status, refusal) = review_with(&raw, proxy.url(), &headers).await?;
        assert_eq!(status, 403, "{headers:?}: {refusal}");
        assert_eq!(refusal["reason"], "Forbidden", "{refusal}");
    }
    Ok(())
}

#[tokio::test]
async fn with_token_review_off_a_service_account_token_is_refused() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "proxy-sa-off").await?;
    let (_, token) = service_account(cluster, &ns, "robot").await?;
    grant_configmap_reading(cluster, &ns, "robot").await?;
    let proxy = Proxy::start_configured(cluster, &[], |config| {
        config["upstream"]["tokenReview"] = json!(false);
    })
    .await?;
    let refused = proxy
        .kubectl(&proxy.kubeconfig_with_token("robot", &token)?)
        .output(&["get", "configmaps", "-n", &ns], None)
        .await?;
    assert!(
        !refused.success && refused.stderr.contains(UNAUTHORIZED),
        "{}",
        refused.stderr
    );
    // Nobody recognised the token: no TokenReview was made.
    let log = proxy.log();
    assert!(!log.contains("kube-apiserver:"), "{log}");
    let (_, metrics) = proxy.operations_get("/metrics").await?;
    assert!(
        metrics.contains(
            r#"selkie_proxy_authentications_total{authenticator="chain",result="rejected",reason="unrecognized"}"#
        ),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"authenticator="kube-apiserver""#),
        "{metrics}"
    );
    Ok(())
}

/// Replaces `path` with `contents` (a sibling renamed over it, as the kubelet's atomic writer
/// swaps a projected token), one second newer than before.
fn rotate(path: &Path, contents: &str) -> anyhow::Result<()> {
    let next = path.with_extension("next");
    std::fs::write(&next, contents)?;
    let previous = std::fs::metadata(path)?.modified()?;
    std::fs::File::options()
        .write(true)
        .open(&next)?
        .set_modified(previous + Duration::from_secs(1))?;
    std::fs::rename(&next, path)?;
    Ok(())
}

#[tokio::test]
async fn the_token_review_is_sent_with_the_token_files_current_token() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "proxy-sa-file").await?;
    // The proxy's own service account, with the permissions of the harness's proxy user, and
    // one that may do nothing.
    let (_, proxy_token) = service_account(cluster, &ns, "proxy").await?;
    cluster
        .kubectl()
        .run(&[
            "create",
            "clusterrolebinding",
            &format!("{ns}-proxy"),
            "--clusterrole=selkie-impersonation-proxy",
            &format!("--serviceaccount={ns}:proxy"),
        ])
        .await?;
    let (_, powerless_token) = service_account(cluster, &ns, "powerless").await?;
    let (uid, token) = service_account(cluster, &ns, "robot").await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &powerless_token)?;
    let proxy = Proxy::start_configured(cluster, &[], |config| {
        if let Some(upstream) = config["upstream"].as_object_mut() {
            upstream.remove("clientCertificate");
            upstream.insert("tokenFile".into(), json!(token_file));
        }
    })
    .await?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_token("robot", &token)?);

    // Reviewed with a token that may not create TokenReviews, the caller's token is refused: a
    // review that fails is no success (and is not remembered).
    let refused = kubectl.output(&["auth", "whoami"], None).await?;
    assert!(
        !refused.success && refused.stderr.contains(UNAUTHORIZED),
        "{}",
        refused.stderr
    );
    audited(&proxy, &["kube-apiserver:upstream_unavailable"]).await?;

    // The kubelet rotates the file: the next review presents the new token.
    rotate(&token_file, &proxy_token)?;
    let info = eventually(Duration::from_secs(10), || async { whoami(&kubectl, &[]).await }).await?;
    assert_service_account_itself(&info, &ns, "robot", &uid);
    for secret in [&proxy_token, &powerless_token, &token] {
        assert!(
            !proxy.log().contains(secret.as_str()),
            "the proxy never logs a token"
        );
    }
    cluster
        .kubectl()
        .run(&["delete", "clusterrolebinding", &format!("{ns}-proxy")])
        .await?;
    Ok(())
}

/// The Concierge as its manifests install it (its proxy configuration names no `tokenReview`):
/// its impersonation proxy passes service-account tokens through, reviewed with the Concierge's
/// own service account, which the manifests let create TokenReviews.
#[tokio::test]
async fn the_installed_concierges_proxy_passes_service_account_tokens_through() -> anyhow::Result<()> {
    // A private cluster: the Concierge's manifests are cluster-wide.
    let cluster = &Cluster::start().await?;
    let concierge = InstalledConcierge::install(cluster).await?;
    let (endpoint, ca) = concierge.expose_proxy(cluster).await?;
    let client = cluster.client().await?;
    let ns = cluster.create_namespace(&client, "concierge-sa").await?;
    let (uid, token) = service_account(cluster, &ns, "robot").await?;
    grant_configmap_reading(cluster, &ns, "robot").await?;

    let kubeconfig = concierge.dir().join("robot.kubeconfig");
    write_kubeconfig_for_user(&kubeconfig, &endpoint, &ca, "robot", json!({"token": token}))?;
    let kubectl = cluster.kubectl().with_kubeconfig(&kubeconfig);
    let info = eventually(Duration::from_secs(20), || async { whoami(&kubectl, &[]).await })
        .await
        .map_err(|e| crate::with_log(e, concierge.process().log()))?;
    assert_service_account_itself(&info, &ns, "robot", &uid);
    kubectl.run(&["get", "configmaps", "-n", &ns]).await?;
    // Nothing the Concierge did was forbidden to it.
    let log = concierge.process().log();
    let refused: Vec<&str> = log.lines().filter(|line| line.contains("forbidden")).collect();
    ensure!(
        refused.is_empty(),
        "the Concierge was refused:\n{}",
        refused.join("\n")
    );
    assert!(!log.contains(&token), "the Concierge never logs a token");

    // The service account's own RBAC applies.
    let forbidden = kubectl.output(&["get", "secrets", "-n", &ns], None).await?;
    assert!(
        !forbidden.success && forbidden.stderr.contains("Forbidden"),
        "{}",
        forbidden.stderr
    );
    Ok(())
}
