//! Active Directory logins through the Selkie Supervisor, on a real domain controller: Samba
//! (provisioned by the harness, e2e/src/samba.rs) → the Supervisor (an
//! ActiveDirectoryIdentityProvider with Pinniped's defaults: search bases from
//! `defaultNamingContext`, nested groups by the in-chain matching rule, group names
//! `<sAMAccountName>@<domain>`) → an impersonation proxy → kubectl with `selkie login oidc`.
//!
//! Users log in with their `userPrincipalName`; each of Active Directory's refresh checks is seen
//! refusing a refresh: the account disabled (`samba-tool user disable`), the password changed
//! (`pwdLastSet`), the account locked by wrong passwords (`msDS-User-Account-Control-Computed`).

use std::{path::Path, time::Duration};

use selkie_e2e::{
    proxy::Proxy,
    samba::{AdUser, SambaDc, DOMAIN, LOCKOUT_THRESHOLD},
    supervisor::Supervisor,
    Cluster,
};
use serde_json::Value;

use crate::{
    supervisor_ldap::{expire_cached_tokens, groups},
    supervisor_login::{plugin_kubeconfig, supervisor_jwt, whoami},
};

const IDP_NAME: &str = "Corp AD";

fn user(name: &str, groups: &[&str]) -> AdUser {
    AdUser {
        name: name.into(),
        password: format!("{name}-Passw0rd"),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

#[tokio::test]
async fn active_directory_users_log_in_by_principal_name_and_lose_their_sessions_when_disabled_changed_or_locked(
) -> anyhow::Result<()> {
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-ad").await?;
    let users = [
        user("pinny", &["seals"]),
        user("walrus", &["walruses"]),
        user("otter", &[]),
    ];
    // "seals" is itself a member of "marine": pinny is in both.
    let samba = SambaDc::start(&users, &[("seals", "marine")]).await?;
    let supervisor = Supervisor::start(cluster, &namespace, &samba, IDP_NAME).await?;
    let proxy = Proxy::start(cluster, &[supervisor_jwt(&supervisor, "cluster-a")]).await?;

    // Ready, with the search base found in the directory.
    let idp: Value = selkie_e2e::eventually(Duration::from_secs(60), || async {
        let idp: Value = serde_json::from_str(
            &cluster
                .kubectl()
                .run(&[
                    "get",
                    "activedirectoryidentityprovider",
                    "samba",
                    "-n",
                    &namespace,
                    "-o",
                    "json",
                ])
                .await?,
        )?;
        anyhow::ensure!(idp["status"]["phase"] == "Ready", "{}", idp["status"]);
        Ok(idp)
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    let search_base = idp["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == "SearchBaseFound"))
        .cloned()
        .unwrap_or_default();
    anyhow::ensure!(
        search_base["status"] == "True"
            && search_base["message"]
                == "Successfully fetched defaultNamingContext to use as default search base from RootDSE.",
        "{search_base}"
    );

    let dirs = tempfile::Builder::new().prefix("selkie-ad-").tempdir()?;
    let kubeconfig = |user: &AdUser, password: &str, dir: &str| -> anyhow::Result<std::path::PathBuf> {
        let dir = dirs.path().join(dir);
        std::fs::create_dir_all(&dir)?;
        let principal = format!("{}@{DOMAIN}", user.name);
        plugin_kubeconfig(
            &dir,
            &user.name,
            &selkie,
            &supervisor,
            &proxy,
            "cluster-a",
            (IDP_NAME, "activedirectory"),
            &[("PINNIPED_USERNAME", &principal), ("PINNIPED_PASSWORD", password)],
        )
    };
    let log_in = |path: &Path| {
        let path = path.to_path_buf();
        let proxy = &proxy;
        async move { whoami(proxy, &path).await }
    };
    let mut logged_in = Vec::new();
    for user in &users {
        let path = kubeconfig(user, &user.password, &user.name)?;
        let who = log_in(&path)
            .await
            .map_err(|e| crate::with_log(e, supervisor.log()))?;
        anyhow::ensure!(who["username"] == format!("{}@{DOMAIN}", user.name), "{who}");
        logged_in.push((path, who));
    }
    anyhow::ensure!(
        groups(&logged_in[0].1) == [format!("marine@{DOMAIN}"), format!("seals@{DOMAIN}")],
        "nested groups: {}",
        logged_in[0].1
    );
    anyhow::ensure!(groups(&logged_in[2].1).is_empty(), "{}", logged_in[2].1);

    // Disabled: pinny's refresh is refused (and the password no longer logs in).
    samba.disable_user("pinny").await?;
    // A new password: walrus's refresh is refused, though the account is fine.
    samba.set_password("walrus", "walrus-N3w-Passw0rd").await?;
    // Locked by wrong passwords: otter's refresh is refused.
    for attempt in 0..LOCKOUT_THRESHOLD {
        let wrong = kubeconfig(&users[2], "not-the-password", &format!("otter-wrong-{attempt}"))?;
        anyhow::ensure!(log_in(&wrong).await.is_err(), "a wrong password logged in");
    }
    for (index, (path, _)) in logged_in.iter().enumerate() {
        expire_cached_tokens(path.parent().unwrap_or(dirs.path()))?;
        let refused = log_in(path).await;
        anyhow::ensure!(
            refused.is_err(),
            "{}: still logged in: {refused:?}",
            users[index].name
        );
    }
    let log = supervisor.log();
    for reason in [
        "user has been deactivated",
        "the password changed since the login",
        "user has been locked",
    ] {
        anyhow::ensure!(
            log.contains(reason),
            "no refresh was refused because {reason:?}: {log}"
        );
    }
    for user in &users {
        anyhow::ensure!(!log.contains(&user.password), "the Supervisor logged a password");
    }
    Ok(())
}
