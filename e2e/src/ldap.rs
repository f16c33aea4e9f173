//! OpenLDAP (Debian's `slapd`), the real directory of the LDAP tests: run from a temporary
//! directory (not as a system service) with an in-directory MDB database, the `memberof` and
//! `refint` overlays as Pinniped's test directory has them, TLS on an `ldaps://` port and StartTLS
//! on an `ldap://` port, and users and groups seeded online with `ldapadd`:
//!
//! * `ou=users,<BASE>`: one `inetOrgPerson` + `posixAccount` per [`LdapUser`] (`uid` = login
//!   name, `mail`, `uidNumber`, `userPassword`), and the Supervisor's bind account
//!   [`BIND_DN`];
//! * `ou=groups,<BASE>`: one `groupOfNames` per group name, its `member`s the users in it;
//! * `ou=posixgroups,<BASE>`: the same groups as `posixGroup`s, their `memberUid`s the users' `uid`s
//!   (ASCII ones only: the attribute allows no other).
//!
//! The bind account gets at most 500 entries from a search (slapd's default) but any number from
//! a paged one, as directories are commonly set up: a client must page to read long group lists.
//!
//! Stopped on drop.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{pki::CertificateAuthority, process::ManagedProcess, HarnessError};

/// The directory's suffix.
pub const BASE: &str = "dc=selkie,dc=test";
/// Where the users are.
pub const USERS_BASE: &str = "ou=users,dc=selkie,dc=test";
/// Where the groups are.
pub const GROUPS_BASE: &str = "ou=groups,dc=selkie,dc=test";
/// Where the same groups are as `posixGroup`s, their members by `memberUid` (the user's `uid`).
pub const POSIX_GROUPS_BASE: &str = "ou=posixgroups,dc=selkie,dc=test";
/// The Supervisor's bind account (a plain entry; the default access rules let it read).
pub const BIND_DN: &str = "cn=supervisor,ou=users,dc=selkie,dc=test";
/// Its password.
pub const BIND_PASSWORD: &str = "supervisor-bind-password";

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A user of the directory.
#[derive(Debug, Clone)]
pub struct LdapUser {
    /// The login name (`uid`, any text: escaped in its DN); `mail` is `user<uid_number>@selkie.test`.
    pub uid: String,
    /// The password.
    pub password: String,
    /// The POSIX `uidNumber` (the user's stable id).
    pub uid_number: u32,
    /// The names of the groups the user is a member of.
    pub groups: Vec<String>,
}

/// The DN of the user whose `uid` is `uid` (its value escaped as RFC 4514 requires).
pub fn user_dn(uid: &str) -> String {
    format!("uid={},{USERS_BASE}", escape_rdn_value(uid))
}

/// An attribute value escaped for a DN (RFC 4514): `,+"\<>;` and `=` with a backslash, as are a
/// leading `#` or space and a trailing space.
fn escape_rdn_value(value: &str) -> String {
    let last = value.chars().count().saturating_sub(1);
    value
        .chars()
        .enumerate()
        .map(|(index, c)| match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=' => format!("\\{c}"),
            '#' if index == 0 => "\\#".into(),
            ' ' if index == 0 || index == last => "\\ ".into(),
            other => other.to_string(),
        })
        .collect()
}

/// One LDIF line `name: value`, base64 (`name:: …`) when the value is not plain ASCII text.
fn ldif_line(name: &str, value: &str) -> String {
    use base64::{engine::general_purpose::STANDARD, Engine as _};
    let safe = value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with([' ', ':', '<'])
        && !value.ends_with(' ');
    if safe {
        format!("{name}: {value}\n")
    } else {
        format!("{name}:: {}\n", STANDARD.encode(value))
    }
}

/// A running slapd.
pub struct Slapd {
    process: ManagedProcess,
    dir: tempfile::TempDir,
    ldap_port: u16,
    ldaps_port: u16,
    ca: CertificateAuthority,
}

impl std::fmt::Debug for Slapd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slapd")
            .field("ldaps_port", &self.ldaps_port)
            .finish_non_exhaustive()
    }
}

impl Slapd {
    /// Starts slapd on two free loopback ports and seeds it with `users` and their groups.
    /// Returns once the entries are in. Fails with slapd's log when it does not start, or with
    /// `ldapadd`'s output when seeding fails.
    pub async fn start(users: &[LdapUser]) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("slapd-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating slapd's directory", e))?;
        let d = dir.path();
        let ca = CertificateAuthority::new("selkie-test-ldap-ca")?;
        let serving = ca.issue_serving("ldap", &["127.0.0.1", "localhost"])?;
        let write = |path: PathBuf, contents: &str| {
            std::fs::write(&path, contents)
                .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
        };
        write(d.join("tls.crt"), &serving.cert_pem)?;
        write(d.join("tls.key"), &serving.key_pem)?;
        std::fs::create_dir(d.join("data"))
            .map_err(|e| HarnessError::io("creating slapd's data directory", e))?;
        let admin_password = format!("admin-{}", std::process::id());
        write(d.join("admin.password"), &admin_password)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(d.join("admin.password"), std::fs::Permissions::from_mode(0o600))
                .map_err(|e| HarnessError::io("restricting the admin password file", e))?;
        }
        write(
            d.join("slapd.conf"),
            &format!(
                "include /etc/ldap/schema/core.schema\n\
                 include /etc/ldap/schema/cosine.schema\n\
                 include /etc/ldap/schema/inetorgperson.schema\n\
                 include /etc/ldap/schema/nis.schema\n\
                 modulepath /usr/lib/ldap\n\
                 moduleload back_mdb\nmoduleload memberof\nmoduleload refint\n\
                 pidfile {dir}/slapd.pid\nargsfile {dir}/slapd.args\n\
                 TLSCertificateFile {dir}/tls.crt\nTLSCertificateKeyFile {dir}/tls.key\n\
                 database mdb\nmaxsize 104857600\n\
                 suffix \"{BASE}\"\nrootdn \"cn=admin,{BASE}\"\nrootpw {admin_password}\n\
                 directory {dir}/data\n\
                 overlay memberof\noverlay refint\nrefint_attributes memberof member\n\
                 limits dn.exact=\"{BIND_DN}\" size.soft=500 size.hard=500 size.prtotal=unlimited\n",
                dir = d.display(),
            ),
        )?;
        let ldap_port = crate::free_port()?;
        let ldaps_port = crate::free_port()?;
        let args = [
            OsString::from("-f"),
            d.join("slapd.conf").into_os_string(),
            OsString::from("-h"),
            OsString::from(format!(
                "ldap://127.0.0.1:{ldap_port}/ ldaps://127.0.0.1:{ldaps_port}/"
            )),
            // Stay in the foreground (the harness owns the process), logging nothing extra.
            OsString::from("-d"),
            OsString::from("0"),
        ];
        let mut process =
            ManagedProcess::spawn("slapd", Path::new("/usr/sbin/slapd"), &args, d.join("slapd.log"))?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while tokio::net::TcpStream::connect(("127.0.0.1", ldap_port))
            .await
            .is_err()
        {
            process.check_running("during start-up")?;
            if tokio::time::Instant::now() >= deadline {
                return Err(
                    process.failure(format!("did not listen on {ldap_port} within {READY_TIMEOUT:?}"))
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let slapd = Self {
            process,
            dir,
            ldap_port,
            ldaps_port,
            ca,
        };
        slapd.seed(users).await?;
        Ok(slapd)
    }

    /// Adds the base entries, the bind account, `users`, then their groups (so `memberOf` is
    /// maintained), with `ldapadd` as the directory's administrator.
    async fn seed(&self, users: &[LdapUser]) -> Result<(), HarnessError> {
        let mut ldif = format!(
            "dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: selkie\no: Selkie\n\n\
             dn: {USERS_BASE}\nobjectClass: organizationalUnit\nou: users\n\n\
             dn: {GROUPS_BASE}\nobjectClass: organizationalUnit\nou: groups\n\n\
             dn: {POSIX_GROUPS_BASE}\nobjectClass: organizationalUnit\nou: posixgroups\n\n\
             dn: {BIND_DN}\nobjectClass: person\ncn: supervisor\nsn: Supervisor\nuserPassword: {BIND_PASSWORD}\n\n"
        );
        for user in users {
            let number = user.uid_number;
            ldif.push_str(&ldif_line("dn", &user_dn(&user.uid)));
            ldif.push_str("objectClass: inetOrgPerson\nobjectClass: posixAccount\n");
            for attribute in ["uid", "cn", "sn"] {
                ldif.push_str(&ldif_line(attribute, &user.uid));
            }
            ldif.push_str(&format!(
                "mail: user{number}@selkie.test\nuidNumber: {number}\ngidNumber: 1000\n\
                 homeDirectory: /home/user{number}\n"
            ));
            ldif.push_str(&ldif_line("userPassword", &user.password));
            ldif.push('\n');
        }
        let groups: std::collections::BTreeSet<&str> = users
            .iter()
            .flat_map(|user| user.groups.iter().map(String::as_str))
            .collect();
        for group in &groups {
            ldif.push_str(&ldif_line(
                "dn",
                &format!("cn={},{GROUPS_BASE}", escape_rdn_value(group)),
            ));
            ldif.push_str("objectClass: groupOfNames\n");
            ldif.push_str(&ldif_line("cn", group));
            for user in users
                .iter()
                .filter(|user| user.groups.iter().any(|g| g == *group))
            {
                ldif.push_str(&ldif_line("member", &user_dn(&user.uid)));
            }
            ldif.push('\n');
        }
        for (number, group) in groups.iter().enumerate() {
            ldif.push_str(&ldif_line(
                "dn",
                &format!("cn={},{POSIX_GROUPS_BASE}", escape_rdn_value(group)),
            ));
            ldif.push_str(&format!(
                "objectClass: posixGroup\ngidNumber: {}\n",
                5000 + number
            ));
            ldif.push_str(&ldif_line("cn", group));
            // memberUid is ASCII (IA5String): users with other names are in no posix group.
            for user in users
                .iter()
                .filter(|user| user.uid.is_ascii() && user.groups.iter().any(|g| g == *group))
            {
                ldif.push_str(&ldif_line("memberUid", &user.uid));
            }
            ldif.push('\n');
        }
        self.ldap_tool("ldapadd", &ldif).await
    }

    /// Changes the directory with `ldif` (`changetype:` records: `modify`, `delete`, ...) as its
    /// administrator, with `ldapmodify`. Fails with the tool's output.
    pub async fn modify(&self, ldif: &str) -> Result<(), HarnessError> {
        self.ldap_tool("ldapmodify", ldif).await
    }

    /// Runs `program` (`ldapadd`, `ldapmodify`) on `ldif` as the directory's administrator.
    async fn ldap_tool(&self, program: &str, ldif: &str) -> Result<(), HarnessError> {
        let file = tempfile::NamedTempFile::new_in(self.dir.path())
            .map_err(|e| HarnessError::io("creating an LDIF file", e))?;
        std::fs::write(file.path(), ldif).map_err(|e| HarnessError::io("writing an LDIF file", e))?;
        let output = tokio::process::Command::new(program)
            .args(["-x", "-H"])
            .arg(format!("ldap://127.0.0.1:{}", self.ldap_port))
            .args(["-D", &format!("cn=admin,{BASE}"), "-y"])
            .arg(self.dir.path().join("admin.password"))
            .arg("-f")
            .arg(file.path())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| HarnessError::io(format!("running {program} (is ldap-utils installed?)"), e))?;
        if !output.status.success() {
            return Err(self.process.failure(format!(
                "{program} {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }

    /// `127.0.0.1:<port>` of the `ldaps://` listener (TLS from the first byte).
    pub fn ldaps_host(&self) -> String {
        format!("127.0.0.1:{}", self.ldaps_port)
    }

    /// `127.0.0.1:<port>` of the `ldap://` listener (StartTLS).
    pub fn starttls_host(&self) -> String {
        format!("127.0.0.1:{}", self.ldap_port)
    }

    /// The CA of slapd's serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// slapd's process id (for its CPU time in `/proc`).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}
