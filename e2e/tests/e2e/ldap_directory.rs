//! The Supervisor's LDAP client (`selkie_supervisor`'s directory client, issue 17's base) against the real
//! OpenLDAP: a login over TLS or, when the port speaks no TLS, StartTLS; the user found by an
//! escaped filter and checked by binding as them; groups by `member` DN, by another attribute of
//! the user, or as whole DNs; wrong, unknown, empty and injected credentials refused alike; an
//! untrusted certificate and a wrong service password named as such.

use std::{sync::Arc, time::Duration};

use rustls_pki_types::{pem::PemObject as _, CertificateDer};
use selkie_e2e::crds::condition;
use selkie_e2e::ldap::{LdapUser, Slapd, BIND_DN, BIND_PASSWORD, GROUPS_BASE, POSIX_GROUPS_BASE, USERS_BASE};
use selkie_supervisor::{Directory, DirectoryConfig, Flavor, GroupSearch, LdapError, UserSearch};

fn tls_trusting(ca_pem: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    Ok(Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

fn config(host: String, tls: Arc<rustls::ClientConfig>) -> DirectoryConfig {
    DirectoryConfig {
        host,
        tls,
        bind_dn: BIND_DN.into(),
        bind_password: BIND_PASSWORD.into(),
        user_search: UserSearch {
            base: USERS_BASE.into(),
            filter: String::new(),
            username_attribute: "uid".into(),
            uid_attribute: "uidNumber".into(),
        },
        group_search: GroupSearch {
            base: GROUPS_BASE.into(),
            filter: String::new(),
            user_attribute_for_filter: None,
            group_name_attribute: "cn".into(),
            skip_group_refresh: false,
        },
        timeout: Duration::from_secs(10),
        flavor: Flavor::Ldap,
    }
}

fn upstream(host: String, tls: Arc<rustls::ClientConfig>) -> Directory {
    Directory::new(config(host, tls))
}

/// A username with Unicode, DN specials (`,`) and filter specials (`(`, `)`, `*`).
const SPECIAL: &str = "Zoë O'Brien, Jr. (ops)*";
/// More groups than one search page (and than slapd's default size limit of 500).
const CROWD_GROUPS: usize = 600;

#[tokio::test]
async fn the_ldap_client_logs_users_in_against_openldap() -> anyhow::Result<()> {
    selkie_e2e::install_crypto_provider();
    let slapd = Slapd::start(&[
        LdapUser {
            uid: "pinny".into(),
            password: "seal-of-approval".into(),
            uid_number: 1001,
            groups: vec!["seals".into(), "ops".into()],
        },
        LdapUser {
            uid: "walrus".into(),
            password: "tusks-and-all".into(),
            uid_number: 1002,
            groups: vec!["ops".into()],
        },
        LdapUser {
            uid: SPECIAL.into(),
            password: "pässwörd, too".into(),
            uid_number: 1003,
            groups: vec!["ops".into(), "Ünïcode (group), #1".into()],
        },
        LdapUser {
            uid: "crowd".into(),
            password: "in-many-groups".into(),
            uid_number: 1004,
            groups: (0..CROWD_GROUPS).map(|n| format!("g{n:04}")).collect(),
        },
    ])
    .await?;
    let tls = tls_trusting(&slapd.ca_pem())?;

    // TLS from the first byte; the identity and the groups by member DN.
    let ldaps = upstream(slapd.ldaps_host(), tls.clone());
    let identity = ldaps.authenticate("pinny", "seal-of-approval").await?;
    anyhow::ensure!(
        identity.dn == format!("uid=pinny,{USERS_BASE}")
            && identity.username == "pinny"
            && identity.uid == "MTAwMQ"
            && identity.groups == ["ops", "seals"],
        "{identity:?}"
    );

    // A port without TLS: StartTLS, the same identity.
    let starttls = upstream(slapd.starttls_host(), tls.clone());
    anyhow::ensure!(
        starttls.authenticate("pinny", "seal-of-approval").await? == identity,
        "StartTLS found someone else"
    );

    // Wrong, unknown, empty and injected credentials: refused alike. Unescaped, `*` would
    // match both users (ambiguous) and `*)(uid=*` would widen the filter.
    for (username, password) in [
        ("pinny", "wrong"),
        ("pinny", ""),
        ("nobody", "seal-of-approval"),
        ("*", "seal-of-approval"),
        ("*)(uid=*", "seal-of-approval"),
        ("", "seal-of-approval"),
    ] {
        let refused = ldaps.authenticate(username, password).await;
        anyhow::ensure!(
            refused == Err(LdapError::InvalidCredentials),
            "{username:?}/{password:?}: {refused:?}"
        );
    }

    // Groups by another attribute of the user, and as whole DNs.
    let mut by_uid = config(slapd.ldaps_host(), tls.clone());
    by_uid.group_search.filter = format!("(&(objectClass=groupOfNames)(member=uid={{}},{USERS_BASE}))");
    by_uid.group_search.user_attribute_for_filter = Some("uid".into());
    by_uid.group_search.group_name_attribute = "dn".into();
    let walrus = Directory::new(by_uid)
        .authenticate("walrus", "tusks-and-all")
        .await?;
    anyhow::ensure!(walrus.groups == [format!("cn=ops,{GROUPS_BASE}")], "{walrus:?}");
    // Posix groups: members by memberUid, the user's uid (userAttributeForFilter).
    let mut posix = config(slapd.ldaps_host(), tls.clone());
    posix.group_search.base = POSIX_GROUPS_BASE.into();
    posix.group_search.filter = "(&(objectClass=posixGroup)(memberUid={}))".into();
    posix.group_search.user_attribute_for_filter = Some("uid".into());
    let posix = Directory::new(posix);
    let pinny = posix.authenticate("pinny", "seal-of-approval").await?;
    anyhow::ensure!(pinny.groups == ["ops", "seals"], "{pinny:?}");

    // Unicode and DN and filter special characters in the username and in the group names.
    let special = ldaps.authenticate(SPECIAL, "pässwörd, too").await?;
    anyhow::ensure!(
        special.username == SPECIAL && special.groups == ["ops", "Ünïcode (group), #1"],
        "{special:?}"
    );
    // More groups than a page: all of them.
    let crowd = ldaps.authenticate("crowd", "in-many-groups").await?;
    anyhow::ensure!(
        crowd.groups.len() == CROWD_GROUPS,
        "{} groups",
        crowd.groups.len()
    );
    // A user filter that matches several entries: refused as ambiguous, not a login.
    let mut loose = config(slapd.ldaps_host(), tls.clone());
    loose.user_search.filter = "(|(uid={})(objectClass=posixAccount))".into();
    let ambiguous = Directory::new(loose)
        .authenticate("pinny", "seal-of-approval")
        .await;
    anyhow::ensure!(ambiguous == Err(LdapError::Ambiguous), "{ambiguous:?}");
    // Nobody listening: unreachable, which a login reports as "try again later".
    let closed = selkie_e2e::free_port()?;
    let unreachable = upstream(format!("127.0.0.1:{closed}"), tls.clone())
        .authenticate("pinny", "seal-of-approval")
        .await;
    anyhow::ensure!(
        unreachable.as_ref().is_err_and(LdapError::is_unavailable),
        "{unreachable:?}"
    );

    // A directory that accepts connections and never answers: every login ends within the
    // timeout (TLS, then StartTLS), several at once, instead of hanging.
    let (silent_host, held) = silent_directory().await?;
    let mut slow = config(silent_host, tls.clone());
    slow.timeout = Duration::from_secs(1);
    let slow = Directory::new(slow);
    let started = std::time::Instant::now();
    let attempts = (0..4).map(|_| slow.authenticate("pinny", "seal-of-approval"));
    for outcome in futures::future::join_all(attempts).await {
        anyhow::ensure!(
            outcome.as_ref().is_err_and(LdapError::is_unavailable),
            "{outcome:?}"
        );
    }
    anyhow::ensure!(
        started.elapsed() < Duration::from_secs(10),
        "a silent directory held logins for {:?}",
        started.elapsed()
    );
    held.abort();

    // An untrusted server certificate, and a wrong service password, say so.
    let other_ca = selkie_e2e::pki::CertificateAuthority::new("not-the-ldap-ca")?;
    let untrusted = upstream(slapd.ldaps_host(), tls_trusting(&other_ca.cert_pem())?);
    let error = untrusted.authenticate("pinny", "seal-of-approval").await;
    anyhow::ensure!(matches!(error, Err(LdapError::Unreachable { .. })), "{error:?}");
    let mut wrong_bind = config(slapd.ldaps_host(), tls);
    wrong_bind.bind_password = "not-it".into();
    let error = Directory::new(wrong_bind)
        .authenticate("pinny", "seal-of-approval")
        .await;
    anyhow::ensure!(error == Err(LdapError::ServiceBind(BIND_DN.into())), "{error:?}");
    Ok(())
}

/// A port on 127.0.0.1 in front of the directory at `target`: while `forwarding` is false it
/// accepts connections and never answers (an outage that hangs rather than refuses), once it is
/// true new connections are relayed to `target`. Its `host:port`, the switch, and the task
/// (abort it to let every connection go).
async fn switchable_front(
    target: String,
) -> anyhow::Result<(
    String,
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<()>,
)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let host = listener.local_addr()?.to_string();
    let forwarding = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let switch = forwarding.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        let mut relays = tokio::task::JoinSet::new();
        while let Ok((mut client, _)) = listener.accept().await {
            if !switch.load(std::sync::atomic::Ordering::SeqCst) {
                held.push(client);
                continue;
            }
            let target = target.clone();
            relays.spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    Ok((host, forwarding, task))
}

#[tokio::test]
async fn logins_fail_within_one_timeout_in_an_outage_and_use_the_directory_once_it_is_back(
) -> anyhow::Result<()> {
    selkie_e2e::install_crypto_provider();
    let slapd = Slapd::start(&[LdapUser {
        uid: "pinny".into(),
        password: "seal-of-approval".into(),
        uid_number: 1001,
        groups: vec!["seals".into()],
    }])
    .await?;
    let (front, forwarding, task) = switchable_front(slapd.ldaps_host()).await?;
    let mut outage = config(front, tls_trusting(&slapd.ca_pem())?);
    outage.timeout = Duration::from_secs(2);
    let directory = Directory::new(outage);

    // The directory hangs: many logins at once all fail as unavailable within about one
    // timeout each — the shared connection's connect (TLS, then StartTLS, each up to the
    // timeout) is one attempt they all wait for, each no longer than its own timeout, not one
    // attempt after another.
    const LOGINS: usize = 16;
    let started = std::time::Instant::now();
    let logins =
        futures::future::join_all((0..LOGINS).map(|_| directory.authenticate("pinny", "seal-of-approval")));
    let outcomes = tokio::time::timeout(Duration::from_secs(6), logins)
        .await
        .map_err(|_| anyhow::anyhow!("{LOGINS} logins in an outage still waiting after 6 s"))?;
    for outcome in outcomes {
        anyhow::ensure!(
            matches!(outcome, Err(LdapError::Unreachable { .. })),
            "{outcome:?}"
        );
    }
    let outage_took = started.elapsed();

    // The directory back: logins use it by themselves (once the attempt in flight is over).
    forwarding.store(true, std::sync::atomic::Ordering::SeqCst);
    let identity = selkie_e2e::eventually(Duration::from_secs(30), || async {
        Ok(directory.authenticate("pinny", "seal-of-approval").await?)
    })
    .await?;
    anyhow::ensure!(
        identity.username == "pinny" && identity.groups == ["seals"],
        "{identity:?}"
    );
    task.abort();
    eprintln!("{LOGINS} logins in the outage took {outage_took:?}");
    Ok(())
}

/// The LDAPIdentityProvider `name` once `check` accepts it (within `within`).
async fn ldap_idp_when(
    cluster: &selkie_e2e::Cluster,
    namespace: &str,
    name: &str,
    within: Duration,
    check: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    selkie_e2e::eventually(within, || async {
        let idp: serde_json::Value = serde_json::from_str(
            &cluster
                .kubectl()
                .run(&["get", "ldapidentityprovider", name, "-n", namespace, "-o", "json"])
                .await?,
        )?;
        anyhow::ensure!(check(&idp), "{}", idp["status"]);
        Ok(idp)
    })
    .await
}

const MINUTE: Duration = Duration::from_secs(60);

/// A "directory" on a loopback port that accepts connections and never answers: its
/// `host:port`, and the task holding the connections (abort it to let them go).
async fn silent_directory() -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let host = silent.local_addr()?.to_string();
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = silent.accept().await {
            connections.push(connection);
        }
    });
    Ok((host, held))
}

#[tokio::test]
async fn the_supervisor_validates_ldap_identity_providers_against_openldap() -> anyhow::Result<()> {
    use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
    let cluster = selkie_e2e::Cluster::shared().await?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace(&client, "supervisor-ldap").await?;
    let slapd = Slapd::start(&[LdapUser {
        uid: "pinny".into(),
        password: "seal-of-approval".into(),
        uid_number: 1001,
        groups: vec!["seals".into()],
    }])
    .await?;
    let dex = selkie_e2e::dex::Dex::start(&[]).await?;
    let supervisor =
        selkie_e2e::supervisor::Supervisor::start(cluster, &namespace, &dex, "Dex Users").await?;
    let apply = |yaml: String| async move {
        cluster
            .kubectl()
            .run_with_stdin(&["apply", "-f", "-"], Some(&yaml))
            .await
    };
    let bind_secret = |password: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: ldap-bind, namespace: {namespace}}}\n\
             type: kubernetes.io/basic-auth\nstringData: {{username: \"{BIND_DN}\", password: {password}}}\n"
        )
    };
    apply(bind_secret(BIND_PASSWORD)).await?;
    apply(format!(
        "apiVersion: idp.supervisor.pinniped.dev/v1alpha1\nkind: LDAPIdentityProvider\n\
         metadata: {{name: openldap, namespace: {namespace}}}\n\
         spec:\n  host: \"{host}\"\n  tls: {{certificateAuthorityData: {ca}}}\n\
         \x20 bind: {{secretName: ldap-bind}}\n\
         \x20 userSearch: {{base: \"{USERS_BASE}\", filter: \"uid={{}}\", attributes: {{username: uid, uid: uidNumber}}}}\n\
         \x20 groupSearch: {{base: \"{GROUPS_BASE}\", attributes: {{groupName: cn}}}}\n",
        host = slapd.ldaps_host(),
        ca = B64.encode(slapd.ca_pem()),
    ))
    .await?;

    // Ready: the Secret loaded, TLS valid, connected and bound (an LDAPIdentityProvider has no
    // SearchBaseFound condition: only Active Directory's do).
    let idp = ldap_idp_when(cluster, &namespace, "openldap", MINUTE, |idp| {
        idp["status"]["phase"] == "Ready"
    })
    .await
    .map_err(|e| crate::with_log(e, supervisor.log()))?;
    for (type_, reason) in [
        ("BindSecretValid", "Success"),
        ("TLSConfigurationValid", "Success"),
        ("LDAPConnectionValid", "Success"),
        ("Ready", "Success"),
    ] {
        let found = condition(&idp, type_);
        anyhow::ensure!(
            found["status"] == "True" && found["reason"] == reason,
            "{type_}: {found}"
        );
    }
    anyhow::ensure!(condition(&idp, "SearchBaseFound").is_null(), "{idp}");
    anyhow::ensure!(
        condition(&idp, "LDAPConnectionValid")["message"]
            .as_str()
            .is_some_and(|m| m.contains(&slapd.ldaps_host()) && m.contains(BIND_DN)),
        "{idp}"
    );

    // A directory and an OIDC issuer that accept connections and never answer: their checks wait
    // for their timeouts (10 s for TLS, then 10 s for StartTLS; the HTTP client's) in tasks of
    // their own, so meanwhile the controller goes on: a wrong bind password of the other
    // provider is reported well before.
    let (silent_host, held) = silent_directory().await?;
    apply(format!(
        "apiVersion: idp.supervisor.pinniped.dev/v1alpha1\nkind: LDAPIdentityProvider\n\
         metadata: {{name: silent, namespace: {namespace}}}\n\
         spec:\n  host: \"{silent_host}\"\n  bind: {{secretName: ldap-bind}}\n\
         \x20 userSearch: {{base: \"{USERS_BASE}\", attributes: {{username: uid, uid: uidNumber}}}}\n\
         ---\napiVersion: v1\nkind: Secret\nmetadata: {{name: silent-client, namespace: {namespace}}}\n\
         type: secrets.pinniped.dev/oidc-client\nstringData: {{clientID: c, clientSecret: s}}\n\
         ---\napiVersion: idp.supervisor.pinniped.dev/v1alpha1\nkind: OIDCIdentityProvider\n\
         metadata: {{name: silent-oidc, namespace: {namespace}}}\n\
         spec:\n  issuer: \"https://{silent_host}\"\n  client: {{secretName: silent-client}}\n"
    ))
    .await?;
    ldap_idp_when(cluster, &namespace, "silent", MINUTE, |idp| {
        condition(idp, "LDAPConnectionValid")["status"] == "Unknown"
    })
    .await?;
    selkie_e2e::eventually(MINUTE, || async {
        let idp: serde_json::Value = serde_json::from_str(
            &cluster
                .kubectl()
                .run(&[
                    "get",
                    "oidcidentityprovider",
                    "silent-oidc",
                    "-n",
                    &namespace,
                    "-o",
                    "json",
                ])
                .await?,
        )?;
        let discovery = condition(&idp, "OIDCDiscoverySucceeded");
        anyhow::ensure!(discovery["status"] == "Unknown", "{discovery}");
        Ok(())
    })
    .await?;

    // A wrong bind password: the connection check fails and says so.
    apply(bind_secret("not-the-password")).await?;
    let idp = ldap_idp_when(cluster, &namespace, "openldap", Duration::from_secs(8), |idp| {
        condition(idp, "LDAPConnectionValid")["reason"] == "LDAPConnectionError"
    })
    .await
    .map_err(|e| e.context("not reported while another directory's check was pending"))?;
    held.abort();
    anyhow::ensure!(idp["status"]["phase"] == "Error", "{}", idp["status"]);

    // The Secret gone: named as such.
    cluster
        .kubectl()
        .run(&["delete", "secret", "ldap-bind", "-n", &namespace])
        .await?;
    ldap_idp_when(cluster, &namespace, "openldap", MINUTE, |idp| {
        condition(idp, "BindSecretValid")["reason"] == "SecretNotFound"
    })
    .await?;
    let log = supervisor.log();
    for secret in [BIND_PASSWORD, "not-the-password"] {
        anyhow::ensure!(
            !log.contains(secret),
            "a bind password is in the Supervisor's log"
        );
    }
    Ok(())
}
