//! GitHub through the Supervisor: a GitHubIdentityProvider pointed at the harness's
//! GitHub-API-compatible server ([`selkie_e2e::github_api`] — GitHub itself is unreachable from these
//! machines; that server, written from GitHub's REST API documentation, is the one stand-in the
//! project allows), the CLI as kubectl's exec plugin, and headless Chromium on the sign-in page:
//! the user of an allowed organization logs in with the teams of that organization as groups, a
//! team removed upstream is gone at the next refresh, a user of no allowed organization is refused
//! with a page saying why, a rate-limited GitHub gives a page saying so, and broken
//! GitHubIdentityProviders say what is wrong in their conditions.

use std::time::Duration;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use selkie_e2e::{
    github_api::GitHub,
    proxy::Proxy,
    supervisor::{Supervisor, Upstream},
    Cluster,
};
use serde_json::Value;

use crate::{
    supervisor_ldap::{expire_cached_tokens, groups},
    supervisor_login::{
        cli_says_logged_in, opened_url, plugin_kubeconfig, recording_browser, supervisor_jwt, whoami,
    },
};

const IDP_NAME: &str = "My GitHub";
const CLIENT_ID: &str = "Iv1.selkie-test-app";
const CLIENT_SECRET: &str = "github-app-secret-0123456789";

/// A GitHubIdentityProvider `name` for `github`, allowing the members of `allowed`.
struct GitHubIdp<'a> {
    name: &'a str,
    github: &'a GitHub,
    allowed: &'a [&'a str],
    secret_type: &'a str,
}

impl Upstream for GitHubIdp<'_> {
    fn name(&self) -> &str {
        self.name
    }

    fn kind(&self) -> &str {
        "GitHubIdentityProvider"
    }

    fn manifests(&self, namespace: &str) -> String {
        let name = self.name;
        let allowed = serde_json::to_string(self.allowed).unwrap_or_default();
        format!(
            r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-client, namespace: {namespace}}}
type: {secret_type}
stringData: {{clientID: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}
---
apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  githubAPI:
    host: "{host}"
    tls: {{certificateAuthorityData: {ca}}}
  client: {{secretName: {name}-client}}
  allowAuthentication:
    organizations: {{policy: OnlyUsersFromAllowedOrganizations, allowed: {allowed}}}
  claims: {{username: "login:id", groups: slug}}
"#,
            secret_type = self.secret_type,
            host = self.github.host(),
            ca = B64.encode(self.github.ca_pem()),
        )
    }
}

/// The `.status` of the GitHubIdentityProvider `name`.
async fn status(cluster: &Cluster, namespace: &str, name: &str) -> anyhow::Result<Value> {
    let object: Value = serde_json::from_str(
        &cluster
            .kubectl()
            .run(&[
                "get",
                "githubidentityprovider",
                name,
                "-n",
                namespace,
                "-o",
                "json",
            ])
            .await?,
    )?;
    Ok(object["status"].clone())
}

/// The message of condition `type_` in `status`, if it has the status `expected`.
fn condition<'a>(status: &'a Value, type_: &str, expected: &str) -> Option<&'a str> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|condition| condition["type"] == type_ && condition["status"] == expected)?["message"]
        .as_str()
}

/// Signs in on the stand-in's page (where `browser` is) as `login`.
async fn sign_in(browser: &selkie_e2e::browser::Browser, login: &str, password: &str) -> anyhow::Result<()> {
    browser.type_into("#login_field", login).await?;
    browser.type_into("#password", password).await?;
    browser.click("input[name=commit], button[name=commit]").await?;
    Ok(())
}

#[tokio::test]
async fn github_users_log_in_through_the_supervisor_by_organization_and_team() -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-github").await?;
    let port = selkie_e2e::free_port()?;
    let issuer = Supervisor::issuer_for(port, &namespace);

    let github = GitHub::start().await?;
    github.add_app(CLIENT_ID, CLIENT_SECRET, &format!("{issuer}/callback"));
    github.add_user("pinny", 1001, "pinny-password");
    github.add_user("walrus", 1002, "walrus-password");
    github.add_org("Seals", 501);
    github.add_org("walruses", 502);
    github.add_org_member("Seals", "pinny");
    github.add_org_member("walruses", "walrus");
    github.add_org_member("walruses", "pinny");
    github.add_team("Seals", 601, "Ops Team", "ops-team", None);
    github.add_team("Seals", 602, "Pups", "pups", None);
    github.add_team("Seals", 604, "Pup Squad", "pup-squad", Some("pups"));
    github.add_team("walruses", 603, "Tusks", "tusks", None);
    github.add_team_member("Seals", "ops-team", "pinny");
    // A member of a child team counts as one of its parent too (Pinniped's rule).
    github.add_team_member("Seals", "pup-squad", "pinny");
    github.add_team_member("walruses", "tusks", "pinny");
    github.add_team_member("walruses", "tusks", "walrus");

    let idp = GitHubIdp {
        name: "github",
        github: &github,
        // Case-insensitive, as GitHub's organization logins are.
        allowed: &["seals"],
        secret_type: "secrets.pinniped.dev/github-client",
    };
    let supervisor =
        Supervisor::start_with(cluster, &namespace, &idp, IDP_NAME, port, serde_json::json!({})).await?;

    // Pinniped's six conditions, all true, and no others.
    let ready = status(cluster, &namespace, "github").await?;
    anyhow::ensure!(ready["phase"] == "Ready", "{ready}");
    for type_ in [
        "ClientCredentialsSecretValid",
        "ClaimsValid",
        "OrganizationsPolicyValid",
        "HostValid",
        "TLSConfigurationValid",
        "GitHubConnectionValid",
    ] {
        anyhow::ensure!(condition(&ready, type_, "True").is_some(), "{type_}: {ready}");
    }
    anyhow::ensure!(ready["conditions"].as_array().map(Vec::len) == Some(6), "{ready}");
    // The identity-provider discovery offers GitHub with the browser flow only.
    let discovery: Value = serde_json::from_slice(
        &supervisor
            .client()?
            .get_json(
                &format!("{}/v1alpha1/pinniped_identity_providers", supervisor.issuer()),
                1 << 16,
                Some(Duration::from_secs(10)),
            )
            .await?,
    )?;
    anyhow::ensure!(
        discovery["pinniped_identity_providers"]
            == serde_json::json!([{"name": IDP_NAME, "type": "github", "flows": ["browser_authcode"], "sessions": {"max_lifetime": "9h"}}]),
        "{discovery}"
    );

    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;
    let dir = tempfile::Builder::new().prefix("selkie-github-").tempdir()?;
    let urls = dir.path().join("browser-urls");
    let script = recording_browser(dir.path(), "browser.sh", &urls)?;
    let script = script.display().to_string();
    // No flow given: the CLI learns from the discovery that GitHub logs in with a browser.
    let kubeconfig = plugin_kubeconfig(
        dir.path(),
        "pinny",
        &selkie,
        &supervisor,
        &proxy,
        "cluster-a",
        (IDP_NAME, "github"),
        &[("BROWSER", &script)],
    )?;
    let browser = selkie_e2e::browser::Browser::start().await?;
    let login = async {
        let url = opened_url(&urls).await?;
        browser.goto(&url).await?;
        let at = browser.current_url().await?;
        anyhow::ensure!(
            at.starts_with(&format!("https://{}/login/oauth/authorize?", github.host())),
            "not at GitHub's sign-in: {at}"
        );
        for parameter in [
            format!("client_id={CLIENT_ID}"),
            "scope=read%3Auser+read%3Aorg".into(),
        ] {
            anyhow::ensure!(at.contains(&parameter), "{parameter} missing from {at}");
        }
        sign_in(&browser, "pinny", "pinny-password").await?;
        cli_says_logged_in(&browser).await?;
        Ok(url)
    };
    let (user, url) = tokio::join!(whoami(&proxy, &kubeconfig), login);
    let url = url.map_err(|e| crate::with_log(e, supervisor.log()))?;
    let user = user.map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(user["username"] == "pinny:1001", "{user}");
    // Teams of the allowed organization only, as `org/slug`.
    anyhow::ensure!(
        groups(&user) == ["Seals/ops-team", "Seals/pup-squad", "Seals/pups"],
        "{user}"
    );

    // A team removed upstream is gone at the next refresh (GitHub asked again with the stored
    // token), without a new login.
    github.remove_team_member("Seals", "pup-squad", "pinny");
    expire_cached_tokens(dir.path())?;
    let refreshed = whoami(&proxy, &kubeconfig)
        .await
        .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(
        groups(&refreshed) == ["Seals/ops-team"],
        "after the refresh: {refreshed}"
    );

    // A user of no allowed organization: a page saying why, no code for the client.
    browser.goto(&url).await?;
    sign_in(&browser, "walrus", "walrus-password").await?;
    let refused = selkie_e2e::eventually(Duration::from_secs(20), || async {
        let text = browser.body_text().await?;
        anyhow::ensure!(text.contains("login denied"), "{text}");
        Ok(text)
    })
    .await?;
    anyhow::ensure!(
        refused.contains(&format!(
            "login denied due to configuration on GitHubIdentityProvider with display name \"{IDP_NAME}\": user is not allowed to log in due to organization membership policy"
        )),
        "{refused}"
    );
    anyhow::ensure!(
        browser
            .current_url()
            .await?
            .starts_with(&format!("{issuer}/callback")),
        "the refusal is not the Supervisor's page"
    );

    // GitHub's rate limit: a page saying to try later, and the Supervisor keeps serving.
    github.set_rate_limit_remaining(0);
    browser.goto(&url).await?;
    sign_in(&browser, "pinny", "pinny-password").await?;
    let limited = selkie_e2e::eventually(Duration::from_secs(20), || async {
        let text = browser.body_text().await?;
        anyhow::ensure!(text.contains("try again later"), "{text}");
        Ok(text)
    })
    .await?;
    anyhow::ensure!(limited.contains("limited the rate"), "{limited}");

    // Tokens and secrets never reach the log.
    let log = supervisor.log();
    for secret in [CLIENT_SECRET, "gho_", "pinny-password"] {
        anyhow::ensure!(!log.contains(secret), "the Supervisor logged {secret:?}");
    }
    // Every list was asked for 100 per page.
    anyhow::ensure!(
        github
            .requests()
            .iter()
            .filter(|request| request.contains("/user/teams") || request.contains("/user/orgs"))
            .all(|request| request.contains("per_page=100")),
        "{:?}",
        github.requests()
    );
    Ok(())
}

#[tokio::test]
async fn broken_github_identity_providers_say_what_is_wrong() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-github-bad").await?;
    let github = GitHub::start().await?;
    let kubectl = cluster.kubectl();
    // A Supervisor serving the namespace (with a working upstream), whose controller checks the
    // GitHubIdentityProviders applied next.
    let dex = selkie_e2e::dex::Dex::start(&[]).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &dex, "Dex Users").await?;

    // A Secret of the wrong type.
    let wrong_type = GitHubIdp {
        name: "wrong-type",
        github: &github,
        allowed: &["seals"],
        secret_type: "Opaque",
    };
    // GitHub's host that does not answer (nothing listens on port 1).
    let unreachable = format!(
        r#"apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata: {{name: unreachable, namespace: {namespace}}}
spec:
  githubAPI: {{host: "127.0.0.1:1"}}
  client: {{secretName: wrong-type-client}}
  allowAuthentication:
    organizations: {{policy: AllGitHubUsers}}
"#
    );
    // An invalid host.
    let bad_host = format!(
        r#"apiVersion: idp.supervisor.pinniped.dev/v1alpha1
kind: GitHubIdentityProvider
metadata: {{name: bad-host, namespace: {namespace}}}
spec:
  githubAPI: {{host: "ghe.example.com/api"}}
  client: {{secretName: nothing}}
  allowAuthentication:
    organizations: {{policy: AllGitHubUsers}}
"#
    );
    let manifests = format!(
        "{}---\n{unreachable}---\n{bad_host}",
        wrong_type.manifests(&namespace)
    );
    kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&manifests))
        .await?;

    let found = selkie_e2e::eventually(Duration::from_secs(60), || async {
        let wrong = status(cluster, &namespace, "wrong-type").await?;
        let silent = status(cluster, &namespace, "unreachable").await?;
        let bad = status(cluster, &namespace, "bad-host").await?;
        let secret = condition(&wrong, "ClientCredentialsSecretValid", "False");
        let connection = condition(&silent, "GitHubConnectionValid", "False");
        let host = condition(&bad, "HostValid", "False");
        anyhow::ensure!(
            secret.is_some() && connection.is_some() && host.is_some(),
            "{wrong}\n{silent}\n{bad}"
        );
        anyhow::ensure!(wrong["phase"] == "Error" && silent["phase"] == "Error" && bad["phase"] == "Error");
        Ok((
            secret.unwrap_or_default().to_string(),
            connection.unwrap_or_default().to_string(),
            host.unwrap_or_default().to_string(),
            bad.clone(),
        ))
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let (secret, connection, host, bad) = found;
    anyhow::ensure!(
        secret
            == format!(
                "wrong secret type \"Opaque\": secret from spec.client.SecretName (\"wrong-type-client\") must be found in namespace \"{namespace}\" with type \"secrets.pinniped.dev/github-client\" and keys \"clientID\" and \"clientSecret\""
            ),
        "{secret}"
    );
    anyhow::ensure!(
        connection
            .starts_with("cannot make connection probe request for spec.githubAPI.host (\"127.0.0.1:1\"): "),
        "{connection}"
    );
    anyhow::ensure!(
        host.starts_with("spec.githubAPI.host (\"ghe.example.com/api\") is not valid: "),
        "{host}"
    );
    anyhow::ensure!(
        condition(&bad, "GitHubConnectionValid", "Unknown").is_some(),
        "{bad}"
    );
    Ok(())
}
