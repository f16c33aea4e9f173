//! A real Active Directory domain controller: Samba (Debian's `samba`, `samba-ad-dc`,
//! `samba-ad-provision`), provisioned by `samba-tool domain provision` into a temporary directory
//! (not as a system service) for the realm `SELKIE.TEST`, serving only LDAP, on 127.0.0.1's
//! standard ports (Samba's LDAP server cannot listen elsewhere) with a TLS certificate of the
//! test's own CA. Users and groups are created with `samba-tool` before it starts; the password
//! policy has no complexity rule and locks an account after [`LOCKOUT_THRESHOLD`] wrong
//! passwords.
//!
//! Because the ports are fixed, one domain controller runs at a time in a test process:
//! [`SambaDc::start`] waits for the previous one to stop. Stopped on drop.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock},
    time::Duration,
};

use crate::{pki::CertificateAuthority, process::ManagedProcess, HarnessError};

/// The domain's naming context.
pub const BASE: &str = "DC=selkie,DC=test";
/// The DNS domain (users' `userPrincipalName` suffix, groups' `@` suffix).
pub const DOMAIN: &str = "selkie.test";
/// Where `samba-tool` puts users and groups.
pub const USERS_BASE: &str = "CN=Users,DC=selkie,DC=test";
/// The domain administrator (the Supervisor's bind account in the tests).
pub const ADMIN_DN: &str = "CN=Administrator,CN=Users,DC=selkie,DC=test";
/// Its password.
pub const ADMIN_PASSWORD: &str = "Adm1n-Passw0rd!";
/// Wrong passwords before an account is locked.
pub const LOCKOUT_THRESHOLD: u32 = 3;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

static ONE_AT_A_TIME: LazyLock<Arc<tokio::sync::Mutex<()>>> =
    LazyLock::new(|| Arc::new(tokio::sync::Mutex::new(())));

/// A user of the domain.
#[derive(Debug, Clone)]
pub struct AdUser {
    /// The `sAMAccountName` (`userPrincipalName` is `<name>@selkie.test`).
    pub name: String,
    /// The password.
    pub password: String,
    /// The groups the user is a direct member of.
    pub groups: Vec<String>,
}

/// A running domain controller.
pub struct SambaDc {
    process: ManagedProcess,
    dir: tempfile::TempDir,
    ca: CertificateAuthority,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl std::fmt::Debug for SambaDc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SambaDc")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl SambaDc {
    /// Provisions the domain with `users`, their groups, and `nested` (`(group, parent)`: the
    /// group is made a member of the parent group), and starts the domain controller. Returns
    /// once it accepts connections on the LDAPS port. Fails with `samba-tool`'s output or
    /// Samba's log.
    pub async fn start(users: &[AdUser], nested: &[(&str, &str)]) -> Result<Self, HarnessError> {
        let turn = ONE_AT_A_TIME.clone().lock_owned().await;
        let dir = tempfile::Builder::new()
            .prefix("samba-dc-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating the domain controller's directory", e))?;
        let d = dir.path();
        let ca = CertificateAuthority::new("selkie-test-ad-ca")?;
        let serving = ca.issue_serving("dc", &["127.0.0.1", "localhost"])?;
        let write = |path: PathBuf, contents: &str, mode: u32| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::write(&path, contents)
                .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)))
                .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
        };
        write(d.join("tls.crt"), &serving.cert_pem, 0o644)?;
        write(d.join("tls.key"), &serving.key_pem, 0o600)?;
        let option = |setting: String| [OsString::from("--option"), OsString::from(setting)];
        let mut provision: Vec<OsString> = [
            "domain",
            "provision",
            "--use-rfc2307",
            "--realm=SELKIE.TEST",
            "--domain=SELKIE",
            "--server-role=dc",
            "--dns-backend=NONE",
        ]
        .map(OsString::from)
        .to_vec();
        provision.push(format!("--adminpass={ADMIN_PASSWORD}").into());
        provision.push(format!("--targetdir={}", d.display()).into());
        for setting in [
            "interfaces = 127.0.0.1".to_string(),
            "bind interfaces only = yes".into(),
            "server services = ldap".into(),
            format!("pid directory = {}", d.display()),
            format!("log file = {}", d.join("samba.log").display()),
            "tls enabled = yes".into(),
            format!("tls keyfile = {}", d.join("tls.key").display()),
            format!("tls certfile = {}", d.join("tls.crt").display()),
            "tls cafile = ".into(),
        ] {
            provision.extend(option(setting));
        }
        samba_tool(d, &provision, false).await?;
        samba_tool(
            d,
            &[
                "domain",
                "passwordsettings",
                "set",
                "--complexity=off",
                "--min-pwd-age=0",
                "--history-length=0",
                &format!("--account-lockout-threshold={LOCKOUT_THRESHOLD}"),
            ]
            .map(OsString::from),
            true,
        )
        .await?;
        let mut groups = std::collections::BTreeSet::new();
        for user in users {
            groups.extend(user.groups.iter().map(String::as_str));
        }
        for (group, parent) in nested {
            groups.insert(group);
            groups.insert(parent);
        }
        for group in &groups {
            samba_tool(d, &["group", "add", group].map(OsString::from), true).await?;
        }
        for user in users {
            samba_tool(
                d,
                &["user", "create", &user.name, &user.password].map(OsString::from),
                true,
            )
            .await?;
            for group in &user.groups {
                samba_tool(
                    d,
                    &["group", "addmembers", group, &user.name].map(OsString::from),
                    true,
                )
                .await?;
            }
        }
        for (group, parent) in nested {
            samba_tool(
                d,
                &["group", "addmembers", parent, group].map(OsString::from),
                true,
            )
            .await?;
        }

        let args = [
            OsString::from("--interactive"),
            OsString::from("--model=single"),
            OsString::from("-s"),
            d.join("etc/smb.conf").into_os_string(),
        ];
        let mut process =
            ManagedProcess::spawn("samba", Path::new("/usr/sbin/samba"), &args, d.join("samba.out"))?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while tokio::net::TcpStream::connect(("127.0.0.1", 636)).await.is_err() {
            process.check_running("during start-up")?;
            if tokio::time::Instant::now() >= deadline {
                return Err(process.failure(format!("did not listen on 636 within {READY_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Self {
            process,
            dir,
            ca,
            _turn: turn,
        })
    }

    /// `127.0.0.1:636`, the LDAPS port.
    pub fn ldaps_host(&self) -> String {
        "127.0.0.1:636".into()
    }

    /// The domain controller's process id (one process: it runs with `--model=single`).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The CA of the domain controller's certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// `samba-tool user disable <name>`.
    pub async fn disable_user(&self, name: &str) -> Result<(), HarnessError> {
        self.tool(&["user", "disable", name]).await
    }

    /// `samba-tool user setpassword <name>`: a new password (and `pwdLastSet`).
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), HarnessError> {
        self.tool(&["user", "setpassword", name, &format!("--newpassword={password}")])
            .await
    }

    /// `samba-tool group removemembers <group> <member>`.
    pub async fn remove_member(&self, group: &str, member: &str) -> Result<(), HarnessError> {
        self.tool(&["group", "removemembers", group, member]).await
    }

    async fn tool(&self, args: &[&str]) -> Result<(), HarnessError> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        samba_tool(self.dir.path(), &args, true)
            .await
            .map_err(|error| self.process.failure(error.to_string()))
    }
}

/// Runs `samba-tool <args>` on the domain in `dir` (with its `smb.conf` once provisioned).
async fn samba_tool(dir: &Path, args: &[OsString], with_config: bool) -> Result<(), HarnessError> {
    let mut command = tokio::process::Command::new("samba-tool");
    command.args(args);
    if with_config {
        command.arg("-s").arg(dir.join("etc/smb.conf"));
    }
    let output = command
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| HarnessError::io("running samba-tool (is samba installed?)", e))?;
    if !output.status.success() {
        return Err(HarnessError::NotReady(format!(
            "samba-tool {}: {}: {}{}",
            args.iter()
                .take(2)
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}
