//! A FederationDomain's identity transforms and policies (CEL), on real components: OpenLDAP →
//! the Supervisor, the transforms applied with `kubectl patch` to the FederationDomain. A
//! username prefix shows in the ID tokens of a login and of a refresh; a policy refusing a group
//! refuses a login, and a refresh once the user joins that group; examples are run by the
//! reconciler, and one that fails is reported and stops the FederationDomain from serving.

use std::time::Duration;

use selkie_e2e::{
    ldap::user_dn,
    ldap::{LdapUser, Slapd, GROUPS_BASE},
    pinniped_cli::{self, jwt_claims},
    supervisor::Supervisor,
    Cluster,
};
use serde_json::{json, Value};

const IDP_NAME: &str = "Corp LDAP";
const PASSWORD: &str = "seal-of-approval";

/// The FederationDomain's identity providers with `transforms` on the LDAP one.
fn with_transforms(transforms: Value) -> String {
    json!({"spec": {"identityProviders": [{
        "displayName": IDP_NAME,
        "objectRef": {"apiGroup": "idp.supervisor.pinniped.dev", "kind": "LDAPIdentityProvider", "name": "openldap"},
        "transforms": transforms,
    }]}})
    .to_string()
}

fn transforms(expected_username: &str) -> Value {
    json!({
        "constants": [
            {"name": "prefix", "type": "string", "stringValue": "corp:"},
            {"name": "refused", "type": "stringList", "stringListValue": ["contractors"]},
        ],
        "expressions": [
            {"type": "policy/v1", "expression": "!groups.exists(g, g in strListConst.refused)",
             "message": "contractors may not log in"},
            {"type": "username/v1", "expression": "strConst.prefix + username"},
        ],
        "examples": [
            {"username": "pinny", "groups": ["seals"], "expects": {"username": expected_username, "groups": ["seals"]}},
            {"username": "otter", "groups": ["contractors"], "expects": {"rejected": true, "message": "contractors may not log in"}},
        ],
    })
}

/// `kubectl patch` (`type_`: merge or json) of the FederationDomain [`Supervisor::start`] made
/// in `namespace`: kubectl's output, or its error.
pub(crate) async fn patch_federation_domain(
    cluster: &Cluster,
    namespace: &str,
    type_: &str,
    patch: &str,
) -> Result<String, selkie_e2e::HarnessError> {
    cluster
        .kubectl()
        .run(&[
            "patch",
            "federationdomain",
            "federation-domain",
            "-n",
            namespace,
            "--type",
            type_,
            "-p",
            patch,
        ])
        .await
}

/// The FederationDomain's condition `type_` once `check` accepts it (within 60 s).
pub(crate) async fn condition_when(
    cluster: &Cluster,
    namespace: &str,
    type_: &str,
    check: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    selkie_e2e::eventually(Duration::from_secs(60), || async {
        let fd: Value = serde_json::from_str(
            &cluster
                .kubectl()
                .run(&[
                    "get",
                    "federationdomain",
                    "federation-domain",
                    "-n",
                    namespace,
                    "-o",
                    "json",
                ])
                .await?,
        )?;
        let condition = selkie_e2e::crds::condition(&fd, type_).clone();
        anyhow::ensure!(check(&condition), "{type_}: {condition}");
        Ok(condition)
    })
    .await
}

#[tokio::test]
async fn transforms_and_policies_apply_at_login_and_refresh_and_failing_examples_stop_serving(
) -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-transforms").await?;
    let user = |uid: &str, number: u32, groups: &[&str]| LdapUser {
        uid: uid.into(),
        password: PASSWORD.into(),
        uid_number: number,
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    let slapd = Slapd::start(&[
        user("pinny", 1001, &["seals"]),
        user("walrus", 1002, &["seals"]),
        user("otter", 1003, &["contractors"]),
    ])
    .await?;
    // With usernames in the audit events (Pinniped's option; redacted by default).
    let supervisor = Supervisor::start_with(
        cluster,
        &namespace,
        &slapd,
        IDP_NAME,
        selkie_e2e::free_port()?,
        json!({"audit": {"logUsernamesAndGroups": "enabled"}}),
    )
    .await?;
    let patch = |transforms: Value| {
        let namespace = namespace.clone();
        async move { patch_federation_domain(cluster, &namespace, "merge", &with_transforms(transforms)).await }
    };
    patch(transforms("corp:pinny")).await?;
    condition_when(cluster, &namespace, "TransformsExamplesPassed", |c| {
        c["status"] == "True"
            && c["message"]
                == "the examples specified by .spec.identityProviders[].transforms.examples[] had no errors"
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;

    // The prefix, at login (once the transforms serve).
    let http = supervisor.client()?;
    let issuer = supervisor.issuer().to_string();
    let token_url = format!("{issuer}/oauth2/token");
    let tokens = selkie_e2e::eventually(Duration::from_secs(30), || async {
        let tokens = pinniped_cli::login(&http, &issuer, IDP_NAME, "pinny", PASSWORD).await?;
        let claims = jwt_claims(tokens["id_token"].as_str().unwrap_or_default())?;
        anyhow::ensure!(claims["username"] == "corp:pinny", "{claims}");
        anyhow::ensure!(claims["groups"] == json!(["seals"]), "{claims}");
        Ok(tokens)
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;

    // The policy, at login: a contractor is refused with the policy's message.
    let refused = pinniped_cli::login(&http, &issuer, IDP_NAME, "otter", PASSWORD).await;
    anyhow::ensure!(
        refused.as_ref().is_err_and(|e| {
            let text = format!("{e:#}");
            text.contains("access_denied") && text.contains("contractors may not log in")
        }),
        "{refused:?}"
    );

    // And at refresh: the prefix again; then pinny joins the contractors and the next refresh is
    // refused.
    let (status, refreshed) = pinniped_cli::refresh(
        &http,
        &token_url,
        tokens["refresh_token"].as_str().unwrap_or_default(),
    )
    .await?;
    anyhow::ensure!(status == 200, "{status}: {refreshed}");
    let claims = jwt_claims(refreshed["id_token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(claims["username"] == "corp:pinny", "{claims}");
    slapd
        .modify(&format!(
            "dn: cn=contractors,{GROUPS_BASE}\nchangetype: modify\nadd: member\nmember: {}\n",
            user_dn("pinny")
        ))
        .await?;
    let (status, answer) = pinniped_cli::refresh(
        &http,
        &token_url,
        refreshed["refresh_token"].as_str().unwrap_or_default(),
    )
    .await?;
    anyhow::ensure!(
        status == 400
            && answer["error"] == "invalid_grant"
            && answer["error_description"]
                .as_str()
                .is_some_and(|d| d.contains("contractors may not log in")),
        "{status}: {answer}"
    );
    // Others still log in.
    pinniped_cli::login(&http, &issuer, IDP_NAME, "walrus", PASSWORD).await?;
    // The refusals are audit events naming the (upstream) user, as configured.
    let log = supervisor.log();
    let rejections: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("\"message\":\"Authentication Rejected By Transforms\""))
        .collect();
    anyhow::ensure!(
        rejections
            .iter()
            .any(|line| line.contains("\"username\":\"otter\""))
            && rejections
                .iter()
                .any(|line| line.contains("\"username\":\"pinny\"")),
        "{rejections:?}"
    );

    // An example that does not hold: reported, and the FederationDomain stops serving.
    patch(transforms("pinny")).await?;
    let failed = condition_when(cluster, &namespace, "TransformsExamplesPassed", |c| {
        c["status"] == "False"
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    anyhow::ensure!(
        failed["reason"] == "TransformsExamplesFailed"
            && failed["message"]
                == ".spec.identityProviders[0].transforms.examples[0] example failed:\nexpected: username \"pinny\"\nactual:   username \"corp:pinny\"",
        "{failed}"
    );
    let discovery = format!("{issuer}/.well-known/openid-configuration");
    selkie_e2e::eventually(Duration::from_secs(30), || async {
        let answer = http.get_json(&discovery, 64 * 1024, None).await;
        anyhow::ensure!(answer.is_err(), "still served");
        Ok(())
    })
    .await?;
    // An invalid expression: reported as such.
    patch(json!({"expressions": [{"type": "username/v1", "expression": "claims.email"}]})).await?;
    let invalid = condition_when(cluster, &namespace, "TransformsExpressionsValid", |c| {
        c["status"] == "False"
    })
    .await?;
    anyhow::ensure!(
        invalid["reason"] == "InvalidTransformsExpressions"
            && invalid["message"].as_str().is_some_and(|m| m
                .starts_with("spec.identityProvider[0].transforms.expressions[0].expression was invalid:")),
        "{invalid}"
    );
    Ok(())
}
