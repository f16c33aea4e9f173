//! Nested impersonation through the proxy (`kubectl --as`, `--as-group`, `--as-uid`,
//! `Impersonate-Extra-*`): allowed exactly where RBAC grants the caller `impersonate`, checked by
//! the proxy with SubjectAccessReviews against the real kube-apiserver, and the apiserver sees the
//! original caller in the extra `original-user-info.impersonation-proxy.concierge.pinniped.dev`.

use selkie_e2e::{proxy::Proxy, Cluster};
use serde_json::Value;

use crate::proxy_kubectl::{grant_configmaps, proxy_client, review_with};

const ORIGINAL_USER_INFO: &str = "original-user-info.impersonation-proxy.concierge.pinniped.dev";

/// Lets `caller` impersonate the named `resources` (e.g. `users`) with `names`, cluster-wide.
async fn grant_impersonate(
    cluster: &Cluster,
    role: &str,
    caller: &str,
    api_group: &str,
    resource: &str,
    names: &[&str],
) -> anyhow::Result<()> {
    let rbac = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [{"apiGroups": [api_group], "resources": [resource], "verbs": ["impersonate"],
                    "resourceNames": names}]},
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

fn user_info(review: &Value) -> &Value {
    &review["status"]["userInfo"]
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

/// The original caller as kube-apiserver recorded it in the impersonated user's extra.
fn original_caller(info: &Value) -> anyhow::Result<Value> {
    let encoded = info["extra"][ORIGINAL_USER_INFO][0]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no {ORIGINAL_USER_INFO} extra in {info}"))?;
    Ok(serde_json::from_str(encoded)?)
}

#[tokio::test]
async fn kubectl_as_works_only_where_rbac_grants_impersonate() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-nested").await?;
    // Cluster-wide names, made unique by the namespace so parallel tests never share a grant.
    let alice = format!("alice-{namespace}");
    let bob = format!("bob-{namespace}");
    let admins = format!("admins-{namespace}");
    grant_configmaps(cluster, &namespace, "User", &bob).await?;
    let proxy = Proxy::start(cluster, &[]).await?;
    let alice_cert = proxy.signer().issue_client(&alice, &["team-a"])?;
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_cert("alice", &alice_cert)?);

    // Without a grant, --as is refused in kube-apiserver's words (kubectl itself only says
    // Forbidden for discovery, so the message is read from a plain request).
    let raw = proxy_client(&proxy, Some(&alice_cert), true)?;
    let (status, refusal) = review_with(&raw, proxy.url(), &[("impersonate-user", bob.as_str())]).await?;
    assert_eq!(status, 403, "{refusal}");
    assert_eq!(
        refusal["message"],
        format!(
            "users \"{bob}\" is forbidden: User \"{alice}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
        ),
        "{refusal}"
    );
    let refused = kubectl
        .output(&["get", "configmaps", "-n", &namespace, "--as", &bob], None)
        .await?;
    assert!(
        !refused.success && refused.stderr.contains("Forbidden"),
        "{}",
        refused.stderr
    );

    // With a grant for bob (and only bob), alice works as bob, and kube-apiserver sees alice
    // recorded in bob's extra.
    grant_impersonate(
        cluster,
        &format!("{namespace}-users"),
        &alice,
        "",
        "users",
        &[&bob],
    )
    .await?;
    kubectl
        .run(&["create", "configmap", "as-bob", "-n", &namespace, "--as", &bob])
        .await?;
    let listed = kubectl
        .run(&["get", "configmaps", "-n", &namespace, "-o", "name", "--as", &bob])
        .await?;
    assert!(listed.contains("configmap/as-bob"), "{listed}");
    let review: Value = serde_json::from_str(
        &kubectl
            .run(&["auth", "whoami", "-o", "json", "--as", &bob])
            .await?,
    )?;
    let info = user_info(&review);
    assert_eq!(info["username"], bob.as_str(), "{review}");
    assert_eq!(strings(&info["groups"]), ["system:authenticated"], "{review}");
    let original = original_caller(info)?;
    assert_eq!(original["username"], alice.as_str(), "{original}");
    assert!(
        strings(&original["groups"]).contains(&"team-a".to_string()),
        "{original}"
    );

    // Alice without --as is still alice: RBAC for bob's ConfigMaps does not apply to her.
    let own = kubectl
        .output(&["get", "configmaps", "-n", &namespace], None)
        .await?;
    assert!(!own.success && own.stderr.contains("Forbidden"), "{}", own.stderr);

    // Anyone else, and any group, needs its own grant.
    for (headers, resource) in [
        (&[("impersonate-user", "system:admin")][..], "users"),
        (
            &[
                ("impersonate-user", bob.as_str()),
                ("impersonate-group", admins.as_str()),
            ][..],
            "groups",
        ),
    ] {
        let (status, refusal) = review_with(&raw, proxy.url(), headers).await?;
        assert_eq!(status, 403, "{refusal}");
        assert!(
            refusal["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("cannot impersonate resource \"{resource}\""))),
            "{refusal}"
        );
    }
    grant_impersonate(
        cluster,
        &format!("{namespace}-groups"),
        &alice,
        "",
        "groups",
        &[&admins],
    )
    .await?;
    grant_impersonate(
        cluster,
        &format!("{namespace}-uids"),
        &alice,
        "authentication.k8s.io",
        "uids",
        &["uid-42"],
    )
    .await?;
    let review: Value = serde_json::from_str(
        &kubectl
            .run(&[
                "auth",
                "whoami",
                "-o",
                "json",
                "--as",
                &bob,
                "--as-group",
                &admins,
                "--as-uid",
                "uid-42",
            ])
            .await?,
    )?;
    let info = user_info(&review);
    assert_eq!(info["username"], bob.as_str(), "{review}");
    assert_eq!(info["uid"], "uid-42", "{review}");
    assert_eq!(
        strings(&info["groups"]),
        [admins.as_str(), "system:authenticated"],
        "{review}"
    );
    Ok(())
}

#[tokio::test]
async fn extras_service_accounts_and_malformed_requests() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-nested-extra").await?;
    let dave = format!("dave-{namespace}");
    let erin = format!("erin-{namespace}");
    let proxy = Proxy::start(cluster, &[]).await?;
    let dave_cert = proxy.signer().issue_client(&dave, &[])?;
    grant_impersonate(
        cluster,
        &format!("{namespace}-users"),
        &dave,
        "",
        "users",
        &[&erin],
    )
    .await?;

    for http2 in [true, false] {
        let client = proxy_client(&proxy, Some(&dave_cert), http2)?;
        // An extra value needs a grant on userextras/<key>.
        let asking = [
            ("impersonate-user", erin.as_str()),
            ("impersonate-extra-scopes", "view"),
        ];
        let (status, refusal) = review_with(&client, proxy.url(), &asking).await?;
        assert_eq!(status, 403, "{refusal}");
        assert_eq!(refusal["reason"], "Forbidden");
        assert!(
            refusal["message"]
                .as_str()
                .is_some_and(|m| m.contains("cannot impersonate resource \"userextras/scopes\"")),
            "{refusal}"
        );

        // Groups without a user, and the proxy's own extra key, are 400 whatever RBAC says.
        for headers in [
            &[("impersonate-group", "system:masters")][..],
            &[
                ("impersonate-user", erin.as_str()),
                (
                    "impersonate-extra-original-user-info.impersonation-proxy.concierge.pinniped.dev",
                    r#"{"username":"system:admin"}"#,
                ),
            ][..],
        ] {
            let (status, refusal) = review_with(&client, proxy.url(), headers).await?;
            assert_eq!(status, 400, "{headers:?}: {refusal}");
            assert_eq!(refusal["kind"], "Status");
            assert_eq!(refusal["reason"], "BadRequest");
        }
    }

    grant_impersonate(
        cluster,
        &format!("{namespace}-extras"),
        &dave,
        "authentication.k8s.io",
        "userextras/scopes",
        &["view"],
    )
    .await?;
    let client = proxy_client(&proxy, Some(&dave_cert), true)?;
    let (status, review) = review_with(
        &client,
        proxy.url(),
        &[
            ("impersonate-user", erin.as_str()),
            ("impersonate-extra-scopes", "view"),
        ],
    )
    .await?;
    assert_eq!(status, 201, "{review}");
    let info = user_info(&review);
    assert_eq!(strings(&info["extra"]["scopes"]), ["view"], "{review}");
    assert_eq!(original_caller(info)?["username"], dave.as_str());

    // A service account is checked in its namespace and gets its fixed groups.
    let account = format!("system:serviceaccount:{namespace}:builder");
    let kubectl = proxy.kubectl(&proxy.kubeconfig_with_cert("dave", &dave_cert)?);
    let (status, refusal) =
        review_with(&client, proxy.url(), &[("impersonate-user", account.as_str())]).await?;
    assert_eq!(status, 403, "{refusal}");
    assert!(
        refusal["message"].as_str().is_some_and(|m| m.contains(&format!(
            "cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"{namespace}\""
        ))),
        "{refusal}"
    );
    cluster
        .kubectl()
        .run(&[
            "create",
            "role",
            "impersonate-builder",
            "-n",
            &namespace,
            "--verb=impersonate",
            "--resource=serviceaccounts",
            "--resource-name=builder",
        ])
        .await?;
    cluster
        .kubectl()
        .run(&[
            "create",
            "rolebinding",
            "impersonate-builder",
            "-n",
            &namespace,
            "--role=impersonate-builder",
            "--user",
            &dave,
        ])
        .await?;
    let review: Value = serde_json::from_str(
        &kubectl
            .run(&["auth", "whoami", "-o", "json", "--as", &account])
            .await?,
    )?;
    let info = user_info(&review);
    assert_eq!(info["username"], account.as_str(), "{review}");
    assert_eq!(
        strings(&info["groups"]),
        [
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
            "system:authenticated"
        ],
        "{review}"
    );

    // The audit line names both the original and the effective user.
    let log = proxy.log();
    assert!(
        log.lines().any(|line| line.contains("selkie::audit")
            && line.contains(&format!("\"original_user\":\"{dave}\""))
            && line.contains(&format!("\"user\":\"{account}\""))),
        "no audit line with both users"
    );
    Ok(())
}
