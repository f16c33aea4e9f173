//! Dynamic clients, on the Supervisor installed from `conf/install/supervisor.yaml` (run with the
//! manifests' configuration and their service account's token, so its RBAC is what is tested): a
//! web application registered as an OIDCClient, its secret made with `kubectl create` of an
//! OIDCClientSecretRequest through kube-apiserver's aggregation layer as the manifests register
//! it, logs a user in with openid-client from npm (a confidential client: client_secret_basic) —
//! Chromium on Dex's form behind the Supervisor —, redeems the code and the refresh token; and what
//! an admin gets wrong is refused with a clear message. (In `supervisor_install`'s module: both
//! install into the one `pinniped-supervisor` namespace, so they run one after the other.)

use std::time::Duration;

use crate::supervisor_rp::RelyingParty;
use bytes::Bytes;
use selkie_e2e::{browser::Browser, supervisor::Supervisor, Cluster};
use serde_json::{json, Value};

const CLIENT: &str = "client.oauth.pinniped.dev-webapp";
const REDIRECT: &str = "http://127.0.0.1:48125/auth/callback";

/// A web application logs a user in with an OIDCClient on the installed Supervisor (see the
/// module documentation). Run by `supervisor_install`'s test, after its own checks.
pub(crate) async fn a_web_app_logs_in_with_an_oidc_client_and_a_secret_from_kubectl(
    cluster: &Cluster,
    supervisor: &Supervisor,
    email: &str,
    password: &str,
) -> anyhow::Result<()> {
    let namespace = supervisor.namespace().to_string();
    let kubectl = cluster.kubectl();

    // The admin registers the web application ...
    let oidc_client = json!({
        "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
        "kind": "OIDCClient",
        "metadata": {"name": CLIENT, "namespace": namespace},
        "spec": {
            "allowedRedirectURIs": [REDIRECT],
            "allowedGrantTypes": ["authorization_code", "refresh_token"],
            "allowedScopes": ["openid", "offline_access", "username", "groups"],
            "tokenLifetimes": {"idTokenSeconds": 300},
        },
    })
    .to_string();
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&oidc_client))
        .await?;
    // ... which has no secret yet, and says so.
    let pending = kubectl
        .run(&[
            "wait",
            "-n",
            &namespace,
            "--timeout=30s",
            "--for=jsonpath={.status.conditions[?(@.type==\"ClientSecretExists\")].status}=False",
            &format!("oidcclient/{CLIENT}"),
        ])
        .await;
    anyhow::ensure!(pending.is_ok(), "{pending:?}\n{}", supervisor.log());

    // A secret, shown once; the client becomes Ready with one secret.
    let created = kubectl
        .create_client_secret_request(&namespace, CLIENT, true, false)
        .await?
        .map_err(|stderr| anyhow::anyhow!("{stderr}\n{}", supervisor.log()))?;
    let secret = created["status"]["generatedSecret"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(secret.len() == 64, "{created}");
    anyhow::ensure!(created["status"]["totalClientSecrets"] == 1, "{created}");
    kubectl
        .run(&[
            "wait",
            "-n",
            &namespace,
            "--timeout=30s",
            "--for=jsonpath={.status.phase}=Ready",
            &format!("oidcclient/{CLIENT}"),
        ])
        .await?;
    let listed = kubectl
        .run(&[
            "get",
            "oidcclient",
            CLIENT,
            "-n",
            &namespace,
            "-o",
            "jsonpath={.status.totalClientSecrets}",
        ])
        .await?;
    anyhow::ensure!(listed.trim() == "1", "{listed}");
    // Only its bcrypt hash is stored, in Pinniped's storage Secret.
    let stored = kubectl
        .run(&[
            "get",
            "secrets",
            "-n",
            &namespace,
            "-l",
            "storage.pinniped.dev/type=oidc-client-secret",
            "-o",
            "json",
        ])
        .await?;
    anyhow::ensure!(!stored.contains(&secret), "the secret is stored in clear");
    anyhow::ensure!(
        stored.contains("storage.pinniped.dev/oidc-client-secret"),
        "{stored}"
    );

    // The web application logs the user in.
    let (rp, authorize) = RelyingParty::start(
        supervisor,
        REDIRECT,
        "Dex Users",
        &[
            ("RP_CLIENT_ID", CLIENT),
            ("RP_CLIENT_SECRET", &secret),
            ("RP_SCOPE", "openid offline_access username groups"),
        ],
    )
    .await?;
    let browser = Browser::start().await?;
    let landed = browser.dex_login(&authorize, email, password).await?;
    anyhow::ensure!(
        landed.starts_with(&format!("{REDIRECT}?code=")),
        "{landed}\n{}",
        supervisor.log()
    );
    let result = rp.finish(&landed, supervisor).await?;
    let claims = &result["claims"];
    anyhow::ensure!(claims["aud"] == json!([CLIENT]), "{result}");
    anyhow::ensure!(claims["azp"] == CLIENT, "{result}");
    anyhow::ensure!(claims["username"] == email, "{result}");
    anyhow::ensure!(claims["groups"] == json!(["seals"]), "{result}");
    // The client's own ID token lifetime.
    let lifetime = claims["exp"].as_i64().unwrap_or_default() - claims["iat"].as_i64().unwrap_or_default();
    anyhow::ensure!(lifetime == 300, "{result}");
    // The refresh grant, authenticated the same way, checks the user again and keeps them.
    let refreshed = &result["refreshed"];
    anyhow::ensure!(refreshed["sub"] == claims["sub"], "{result}");
    anyhow::ensure!(refreshed["username"] == email, "{result}");
    // Logout: the refresh token the library revoked at the revocation endpoint refreshes no more.
    anyhow::ensure!(result["after_revocation"] == "invalid_grant", "{result}");

    // A wrong secret is refused at the token and revocation endpoints, with RFC 6749's answer.
    let https = supervisor.client()?;
    use base64::Engine as _;
    let basic = |secret: &str| base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT}:{secret}"));
    let post = |path: &'static str, basic: String, body: String| {
        let https = https.clone();
        let url = format!("{}{path}", supervisor.issuer());
        async move {
            let response = https
                .send(
                    http::Method::POST,
                    &url,
                    &[
                        (
                            http::header::AUTHORIZATION,
                            http::HeaderValue::from_str(&format!("Basic {basic}"))?,
                        ),
                        (
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/x-www-form-urlencoded"),
                        ),
                    ],
                    Bytes::from(body),
                    1 << 16,
                    Some(Duration::from_secs(30)),
                )
                .await?;
            anyhow::Ok(response)
        }
    };
    // The secret with its last hex digit changed (a fixed digit would be the secret itself one time in 16).
    let last = if secret.ends_with('0') { '1' } else { '0' };
    let wrong = basic(&format!("{}{last}", &secret[..63]));
    let code_grant = format!(
        "grant_type=authorization_code&code=pin_ac_x.y&redirect_uri={REDIRECT}&code_verifier={}",
        "v".repeat(43)
    );
    for (path, body) in [
        ("/oauth2/token", code_grant),
        ("/oauth2/revoke", "token=pin_rt_x.y".to_string()),
    ] {
        let refused = post(path, wrong.clone(), body).await?;
        let answer: Value = serde_json::from_slice(&refused.body)?;
        anyhow::ensure!(
            refused.status == 401 && answer["error"] == "invalid_client",
            "{path}: {}: {answer}",
            refused.status
        );
    }
    // An unknown token is revoked as if it were known (RFC 7009 §2.2): 200, nothing to say.
    let unknown = post("/oauth2/revoke", basic(&secret), "token=pin_rt_x.y".into()).await?;
    anyhow::ensure!(
        unknown.status == 200 && unknown.body.is_empty(),
        "{}: {:?}",
        unknown.status,
        unknown.body
    );

    // Secrets: at most five; revoking keeps only the newest.
    for total in 2..=5 {
        let more = kubectl
            .create_client_secret_request(&namespace, CLIENT, true, false)
            .await?
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(more["status"]["totalClientSecrets"] == total, "{more}");
    }
    let sixth = kubectl
        .create_client_secret_request(&namespace, CLIENT, true, false)
        .await?;
    anyhow::ensure!(
        matches!(&sixth, Err(stderr) if stderr.contains("has too many secrets, spec.revokeOldSecrets must be true")),
        "{sixth:?}"
    );
    let revoked = kubectl
        .create_client_secret_request(&namespace, CLIENT, false, true)
        .await?
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(revoked["status"]["totalClientSecrets"] == 1, "{revoked}");
    anyhow::ensure!(revoked["status"].get("generatedSecret").is_none(), "{revoked}");

    // Requests for clients that do not exist, or names that cannot be clients.
    let missing = kubectl
        .create_client_secret_request(&namespace, "client.oauth.pinniped.dev-nobody", true, false)
        .await?;
    anyhow::ensure!(
        matches!(&missing, Err(stderr) if stderr.contains("metadata.name: Not found: \"client.oauth.pinniped.dev-nobody\"")),
        "{missing:?}"
    );
    let unprefixed = kubectl
        .create_client_secret_request(&namespace, "webapp", true, false)
        .await?;
    anyhow::ensure!(
        matches!(&unprefixed, Err(stderr) if stderr.contains("must start with 'client.oauth.pinniped.dev-'")),
        "{unprefixed:?}"
    );

    // An OIDCClient with a plain-http redirect off loopback is refused by the CRD.
    let insecure = json!({
        "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
        "kind": "OIDCClient",
        "metadata": {"name": "client.oauth.pinniped.dev-insecure", "namespace": namespace},
        "spec": {
            "allowedRedirectURIs": ["http://app.example.com/callback"],
            "allowedGrantTypes": ["authorization_code"],
            "allowedScopes": ["openid"],
        },
    })
    .to_string();
    let refused = kubectl.output(&["apply", "-f", "-"], Some(&insecure)).await?;
    anyhow::ensure!(
        !refused.success && refused.stderr.contains("allowedRedirectURIs"),
        "{}",
        refused.stderr
    );
    // One whose grants and scopes do not go together is kept, and says why it is not Ready.
    let mismatched = json!({
        "apiVersion": "config.supervisor.pinniped.dev/v1alpha1",
        "kind": "OIDCClient",
        "metadata": {"name": "client.oauth.pinniped.dev-mismatched", "namespace": namespace},
        "spec": {
            "allowedRedirectURIs": ["https://app.example.com/callback"],
            "allowedGrantTypes": ["authorization_code"],
            "allowedScopes": ["openid", "offline_access"],
        },
    })
    .to_string();
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&mismatched))
        .await?;
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let status: Value = serde_json::from_str(
            &kubectl
                .run(&["get", "oidcclient", "client.oauth.pinniped.dev-mismatched", "-n", &namespace, "-o", "json"])
                .await?,
        )?;
        let status = &status["status"];
        let message = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|condition| condition["type"] == "AllowedGrantTypesValid")
            .map(|condition| condition["message"].clone());
        anyhow::ensure!(
            status["phase"] == "Error"
                && message
                    == Some(json!(
                        "\"refresh_token\" must be included in \"allowedGrantTypes\" when \"offline_access\" is included in \"allowedScopes\""
                    )),
            "{status}"
        );
        Ok(())
    })
    .await?;
    anyhow::ensure!(
        !supervisor.log().contains(&secret),
        "the client secret is in the Supervisor's log"
    );
    Ok(())
}
