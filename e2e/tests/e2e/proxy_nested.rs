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
    // With her certificate's credential id, as Pinniped records the original caller; bob
    // himself gets none (his extras are what was asked for, and the original caller).
    assert_eq!(
        original["extra"],
        serde_json::json!({
            "authentication.kubernetes.io/credential-id":
                [crate::proxy_kubectl::certificate_credential_id(&alice_cert.cert_pem)?]
        }),
        "{original}"
    );
    assert!(
        info["extra"]
            .get("authentication.kubernetes.io/credential-id")
            .is_none(),
        "{review}"
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

    // The audit line names both the original and the effective user (written by the audit
    // thread a moment after the answer).
    crate::eventually(std::time::Duration::from_secs(5), || async {
        let log = proxy.log();
        anyhow::ensure!(
            log.lines().any(|line| line.contains("selkie::audit")
                && line.contains(&format!("\"original_user\":\"{dave}\""))
                && line.contains(&format!("\"user\":\"{account}\""))),
            "no audit line with both users"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Who kubectl acts as with `--as user`, or why it may not: `Ok(username)` or `Err(stderr)`.
async fn whoami_as(kubectl: &selkie_e2e::kubectl::Kubectl, user: &str) -> Result<String, String> {
    match kubectl.run(&["auth", "whoami", "-o", "json", "--as", user]).await {
        Ok(out) => {
            let review: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            Ok(user_info(&review)["username"]
                .as_str()
                .unwrap_or_default()
                .to_string())
        }
        Err(error) => Err(error.to_string()),
    }
}

#[tokio::test]
async fn only_well_formed_service_account_names_are_checked_as_service_accounts() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-nested-sa").await?;
    let frank = format!("frank-{namespace}");
    let proxy = Proxy::start(cluster, &[]).await?;
    let frank_cert = proxy.signer().issue_client(&frank, &[])?;
    let through_proxy = proxy.kubectl(&proxy.kubeconfig_with_cert("frank", &frank_cert)?);
    let frank_client = proxy_client(&proxy, Some(&frank_cert), true)?;
    let direct = cluster
        .kubectl()
        .with_kubeconfig(&cluster.user_kubeconfig(&frank, &[])?);
    // frank may impersonate every service account of the namespace, and no user.
    let rbac = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "impersonate-accounts", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "impersonate-accounts", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "impersonate-accounts"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": frank}]}
    ]});
    cluster
        .kubectl()
        .run_with_stdin(&["apply", "-f", "-"], Some(&rbac.to_string()))
        .await?;

    let account = format!("system:serviceaccount:{namespace}:builder");
    // Not a service account for kube-apiserver (the name is not a DNS subdomain, or there is a
    // third part): impersonating it needs users/impersonate, which frank lacks.
    let look_alikes = [
        format!("system:serviceaccount:{namespace}:Builder"),
        format!("system:serviceaccount:{namespace}:build_er"),
        format!("system:serviceaccount:{namespace}:builder:x"),
    ];
    // The grant may take a moment to reach the authorizer: wait for the real account to work
    // directly.
    crate::eventually(std::time::Duration::from_secs(10), || async {
        whoami_as(&direct, &account).await.map_err(anyhow::Error::msg)
    })
    .await?;
    for user in std::iter::once(&account).chain(&look_alikes) {
        let expected = whoami_as(&direct, user).await;
        let proxied = whoami_as(&through_proxy, user).await;
        assert_eq!(
            expected.is_ok(),
            proxied.is_ok(),
            "--as {user:?}: kube-apiserver {expected:?}, through the proxy {proxied:?}"
        );
        if user == &account {
            assert_eq!(proxied.as_deref(), Ok(account.as_str()));
        } else {
            // The permission checked is users/impersonate, as kube-apiserver's.
            let (status, refusal) =
                review_with(&frank_client, proxy.url(), &[("impersonate-user", user.as_str())]).await?;
            assert_eq!(status, 403, "--as {user:?}: {refusal}");
            assert!(
                refusal["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("cannot impersonate resource \"users\"")),
                "--as {user:?}: {refusal}"
            );
        }
    }

    // With users/impersonate on exactly that name, both let it through as an ordinary user.
    grant_impersonate(
        cluster,
        &format!("{namespace}-look-alike"),
        &frank,
        "",
        "users",
        &[&look_alikes[0]],
    )
    .await?;
    crate::eventually(std::time::Duration::from_secs(10), || async {
        whoami_as(&direct, &look_alikes[0])
            .await
            .map_err(anyhow::Error::msg)
    })
    .await?;
    assert_eq!(
        whoami_as(&through_proxy, &look_alikes[0]).await.as_deref(),
        Ok(look_alikes[0].as_str())
    );
    Ok(())
}

#[tokio::test]
async fn look_alikes_of_the_reserved_extra_key_and_malformed_keys_are_refused() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "proxy-nested-keys").await?;
    let grace = format!("grace-{namespace}");
    let heidi = format!("heidi-{namespace}");
    let proxy = Proxy::start(cluster, &[]).await?;
    let cert = proxy.signer().issue_client(&grace, &[])?;
    // grace may impersonate heidi with any extra at all: only the proxy stands in the way.
    grant_impersonate(
        cluster,
        &format!("{namespace}-user"),
        &grace,
        "",
        "users",
        &[&heidi],
    )
    .await?;
    grant_impersonate(
        cluster,
        &format!("{namespace}-extras"),
        &grace,
        "authentication.k8s.io",
        "*",
        &[],
    )
    .await?;
    let client = proxy_client(&proxy, Some(&cert), true)?;
    let as_heidi = |extra: &'static str, value: &'static str| {
        [("impersonate-user", heidi.clone()), (extra, value.to_string())]
    };

    // A valid key passes (once the grants reach the authorizer), percent-encoded as kubectl does.
    let review = crate::eventually(std::time::Duration::from_secs(10), || async {
        let headers = as_heidi("impersonate-extra-example.com%2fteam", "blue");
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (status, review) = review_with(&client, proxy.url(), &headers).await?;
        anyhow::ensure!(status == 201, "{status} {review}");
        Ok(review)
    })
    .await?;
    assert_eq!(
        strings(&user_info(&review)["extra"]["example.com/team"]),
        ["blue"]
    );

    for (case, header) in [
        (
            "the reserved key with an upper-case letter after decoding",
            "impersonate-extra-original-user-info.impersonation-proxy.concierge.pinniped.%44ev",
        ),
        (
            "the reserved key with trailing whitespace",
            "impersonate-extra-original-user-info.impersonation-proxy.concierge.pinniped.dev%20",
        ),
        ("an upper-case key", "impersonate-extra-%53copes"),
        ("a key with a space", "impersonate-extra-my%20scope"),
    ] {
        let headers = as_heidi(header, r#"{"username":"system:admin"}"#);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (status, refusal) = review_with(&client, proxy.url(), &headers).await?;
        assert_eq!(status, 400, "{case}: {refusal}");
        assert_eq!(refusal["kind"], "Status", "{case}");
        assert_eq!(refusal["reason"], "BadRequest", "{case}");
        assert!(
            refusal["message"]
                .as_str()
                .is_some_and(|m| m.contains("extra key")),
            "{case}: {refusal}"
        );
    }
    Ok(())
}
