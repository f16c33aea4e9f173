//! Path-based multi-tenancy and Pinniped's legacy single-IdP mode on real components: a second
//! FederationDomain on the same host under another path that lists no identity providers uses
//! the namespace's only one, under its resource name, and users log in through it; once the
//! namespace has two, it names neither and says why.

use std::time::Duration;

use selkie_e2e::{pinniped_cli, supervisor::Supervisor, Cluster};
use serde_json::Value;

use crate::supervisor_oauth::{dex_user_namespace, DexUserNamespace, IDP_NAME, PASSWORD};

/// The `IdentityProvidersFound` condition of the FederationDomain `name`, once its reason is
/// `reason` (within 30 s).
async fn found_condition(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    reason: &str,
) -> anyhow::Result<Value> {
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let fd: Value = serde_json::from_str(
            &cluster
                .kubectl()
                .run(&["get", "federationdomain", name, "-n", namespace, "-o", "json"])
                .await?,
        )?;
        let condition = fd["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "IdentityProvidersFound")
            .cloned()
            .unwrap_or_default();
        anyhow::ensure!(condition["reason"] == reason, "{}", fd["status"]);
        Ok(condition)
    })
    .await
}

#[tokio::test]
async fn a_federation_domain_without_identity_providers_uses_the_only_one() -> anyhow::Result<()> {
    let DexUserNamespace {
        cluster,
        namespace,
        email,
        dex,
        ..
    } = dex_user_namespace("supervisor-legacy", &["seals"], None).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, IDP_NAME).await?;
    let http = supervisor.client()?;

    // The same host, another path, no identityProviders.
    let legacy_issuer = format!("{}-legacy", supervisor.issuer());
    let manifest = format!(
        "apiVersion: config.supervisor.pinniped.dev/v1alpha1\nkind: FederationDomain\n\
         metadata: {{name: legacy, namespace: {namespace}}}\nspec: {{issuer: {legacy_issuer}}}\n"
    );
    cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifest))
        .await?;
    let condition = found_condition(cluster, &namespace, "legacy", "LegacyConfigurationSuccess").await?;
    anyhow::ensure!(condition["status"] == "True", "{condition}");

    // Its IdP discovery names the only provider by its resource name; a login through it works,
    // and its tokens are the legacy issuer's.
    let discovery = selkie_e2e::eventually(Duration::from_secs(30), || async {
        Ok(http
            .get_json(
                &format!("{legacy_issuer}/v1alpha1/pinniped_identity_providers"),
                1 << 20,
                Some(Duration::from_secs(10)),
            )
            .await?)
    })
    .await?;
    let discovery: Value = serde_json::from_slice(&discovery)?;
    let idps = &discovery["pinniped_identity_providers"];
    anyhow::ensure!(
        idps.as_array().map(Vec::len) == Some(1) && idps[0]["name"] == "dex" && idps[0]["type"] == "oidc",
        "{discovery}"
    );
    let tokens = pinniped_cli::login(&http, &legacy_issuer, "dex", &email, PASSWORD).await?;
    let claims = pinniped_cli::jwt_claims(tokens["id_token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(
        claims["iss"] == legacy_issuer.as_str() && claims["username"] == email.as_str(),
        "{claims}"
    );
    // The first FederationDomain, on the path beside it, is unaffected.
    pinniped_cli::login(&http, supervisor.issuer(), IDP_NAME, &email, PASSWORD).await?;

    // A second provider in the namespace: the legacy FederationDomain picks neither.
    let second = format!(
        "apiVersion: idp.supervisor.pinniped.dev/v1alpha1\nkind: OIDCIdentityProvider\n\
         metadata: {{name: dex-2, namespace: {namespace}}}\n\
         spec: {{issuer: {issuer}, client: {{secretName: dex-client}}}}\n",
        issuer = dex.issuer(),
    );
    cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&second))
        .await?;
    let condition = found_condition(cluster, &namespace, "legacy", "IdentityProviderNotSpecified").await?;
    anyhow::ensure!(
        condition["status"] == "False"
            && condition["message"]
                .as_str()
                .is_some_and(|m| m.contains("2 identity provider resources have been found")),
        "{condition}"
    );
    Ok(())
}
