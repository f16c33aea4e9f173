//! The Supervisor installed from `conf/install/supervisor.yaml` (with `conf/crds/`), run with the
//! manifests' ConfigMap and the token of their service account: its least-privilege RBAC is
//! enough for everything the Supervisor does — watching its kinds, Secrets and ConfigMaps,
//! generating key Secrets, leader election, writing statuses, storing sessions — and serving the
//! aggregated OIDCClientSecretRequest API for a web application's OIDCClient
//! ([`crate::supervisor_oidc_client`]).

use selkie_e2e::{
    dex::{Dex, DexUser},
    supervisor::Supervisor,
    Cluster,
};
use serde_json::Value;

const PASSWORD: &str = "seal-of-approval";

#[tokio::test]
async fn the_manifests_grant_what_the_supervisor_needs() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let email = "installed@example.com".to_string();
    let port = selkie_e2e::free_port()?;
    // Dex sends browsers back to the installed Supervisor's callback (the web application's login).
    let dex = Dex::start_with_redirects(
        &[DexUser {
            email: email.clone(),
            password: PASSWORD.into(),
            user_id: "id-installed".into(),
            groups: vec!["seals".into()],
        }],
        &[format!(
            "{}/callback",
            Supervisor::issuer_for(port, "pinniped-supervisor")
        )],
    )
    .await?;
    let mut supervisor = Supervisor::install_on(cluster, &dex, "Dex Users", port).await?;
    let namespace = supervisor.namespace().to_string();
    let kubectl = cluster.kubectl();

    // The leader (the service account) generated the keys and wrote the statuses.
    let phases = selkie_e2e::eventually(std::time::Duration::from_secs(60), || async {
        let mut phases = Vec::new();
        for (kind, name) in [
            ("federationdomain", "federation-domain"),
            ("oidcidentityprovider", "dex"),
        ] {
            let phase = kubectl
                .run(&[
                    "get",
                    kind,
                    name,
                    "-n",
                    &namespace,
                    "-o",
                    "jsonpath={.status.phase}",
                ])
                .await?;
            anyhow::ensure!(phase == "Ready", "{kind} {name} is {phase:?}");
            phases.push(phase);
        }
        Ok(phases)
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(phases.len() == 2);
    let status: Value = serde_json::from_str(
        &kubectl
            .run(&[
                "get",
                "federationdomain",
                "federation-domain",
                "-n",
                &namespace,
                "-o",
                "json",
            ])
            .await?,
    )?;
    for (key, suffix) in [
        ("jwks", "jwks"),
        ("tokenSigningKey", "token-signing-key"),
        ("stateSigningKey", "state-signing-key"),
        ("stateEncryptionKey", "state-encryption-key"),
    ] {
        let name = status["status"]["secrets"][key]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        anyhow::ensure!(name == format!("federation-domain-{suffix}"), "{key}: {status}");
        let secret_type = kubectl
            .run(&["get", "secret", &name, "-n", &namespace, "-o", "jsonpath={.type}"])
            .await?;
        anyhow::ensure!(
            secret_type == format!("secrets.pinniped.dev/federation-domain-{suffix}"),
            "{name}: {secret_type}"
        );
    }
    kubectl
        .run(&[
            "get",
            "lease",
            "pinniped-supervisor-leader-election",
            "-n",
            &namespace,
        ])
        .await?;

    // A login stores its session with the service account's permissions.
    let http = supervisor.client()?;
    let verifier = "a-verifier-of-enough-length-0123456789-abcdefghijkl";
    let challenge = {
        use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
        use sha2::Digest as _;
        URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()))
    };
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("client_id", "pinniped-cli"),
            ("redirect_uri", "http://127.0.0.1:48123/callback"),
            ("response_type", "code"),
            ("scope", "openid offline_access"),
            ("state", "state-0123456789"),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
        ])
        .finish();
    let response = http
        .send(
            http::Method::GET,
            &format!("{}/oauth2/authorize?{query}", supervisor.issuer()),
            &[
                (
                    http::HeaderName::from_static("pinniped-username"),
                    http::HeaderValue::from_str(&email)?,
                ),
                (
                    http::HeaderName::from_static("pinniped-password"),
                    http::HeaderValue::from_static(PASSWORD),
                ),
            ],
            bytes::Bytes::new(),
            1 << 20,
            Some(std::time::Duration::from_secs(30)),
        )
        .await?;
    let location = response
        .headers
        .get(http::header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    anyhow::ensure!(
        location.contains("code=pin_ac_"),
        "{}: {location}\n{}",
        response.status,
        supervisor.log()
    );
    let stored = kubectl
        .secret_names(&namespace, "storage.pinniped.dev/type=login")
        .await?;
    anyhow::ensure!(stored.len() == 1, "{stored:?}");

    crate::supervisor_oidc_client::a_web_app_logs_in_with_an_oidc_client_and_a_secret_from_kubectl(
        cluster,
        &supervisor,
        &email,
        PASSWORD,
    )
    .await?;
    supervisor.check_running()?;
    Ok(())
}
