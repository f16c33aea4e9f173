//! `selkie login oidc` against the real Dex, with the real kubectl through Selkie's impersonation
//! proxy in front of the real kube-apiserver, and headless Chromium (Debian's, over WebDriver)
//! as the user's browser.
//!
//! Dex has the public client `pinniped-cli` (no secret, PKCE, any loopback redirect). The proxy
//! has a JWTAuthenticator `dex` for Dex's ID tokens of that client and answers
//! TokenCredentialRequests itself (one audit line each, which is how the tests count them).
//! `$BROWSER` is a script that records the URL it was given; the test then opens that URL in
//! Chromium and fills Dex's login form, and Chromium follows Dex's redirect to the CLI's
//! callback listener, exactly as a user's browser would.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use selkie_e2e::{
    browser::Browser,
    cluster::write_kubeconfig_for_user,
    dex::{Dex, DexUser, PUBLIC_CLIENT_ID},
    kubectl::Kubectl,
    pki::CertificateAuthority,
    proxy::{JwtSpec, Proxy},
    Cluster,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use crate::proxy_kubectl::grant_configmaps;

const SCOPES: &str = "openid,offline_access,email,groups";
const PASSWORD: &str = "correct-horse-battery";

/// One test's world: Dex with one user, a proxy trusting Dex's `pinniped-cli` tokens, a
/// namespace where that user may edit configmaps, and a private directory for caches.
struct Setup {
    namespace: String,
    email: String,
    selkie: PathBuf,
    dex: Dex,
    proxy: Proxy,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn start(prefix: &str) -> anyhow::Result<Self> {
        let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
        let cluster = Cluster::shared().await?;
        let client = cluster.client().await?;
        let namespace = cluster.create_namespace(&client, prefix).await?;
        let email = format!("{namespace}@example.com");
        let dex = Dex::start(&[DexUser {
            email: email.clone(),
            password: PASSWORD.into(),
            user_id: format!("id-{namespace}"),
            groups: vec!["oidc-devs".into()],
        }])
        .await?;
        grant_configmaps(cluster, &namespace, "User", &email).await?;
        let jwt = JwtSpec {
            audience: PUBLIC_CLIENT_ID.into(),
            ..JwtSpec::for_dex(&dex)
        };
        let proxy = Proxy::start(cluster, &[jwt]).await?;
        let dir = tempfile::Builder::new().prefix("selkie-oidc-").tempdir()?;
        Ok(Self {
            namespace,
            email,
            selkie,
            dex,
            proxy,
            dir,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `login oidc` arguments for Dex (and, with `concierge`, the proxy's TokenCredentialRequest).
    fn args(&self, concierge: bool, extra: &[String]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "login".into(),
            "oidc".into(),
            format!("--issuer={}", self.dex.issuer()),
            format!("--ca-bundle-data={}", B64.encode(self.dex.ca_pem())),
            format!("--scopes={SCOPES}"),
            format!("--session-cache={}", self.path("sessions.yaml").display()),
            format!("--credential-cache={}", self.path("credentials.yaml").display()),
        ];
        if concierge {
            args.extend([
                "--enable-concierge".into(),
                "--concierge-api-group-suffix=pinniped.dev".into(),
                "--concierge-authenticator-type=jwt".into(),
                "--concierge-authenticator-name=dex".into(),
                format!("--concierge-endpoint={}", self.proxy.url()),
                format!(
                    "--concierge-ca-bundle-data={}",
                    B64.encode(self.proxy.serving_ca().cert_pem())
                ),
            ]);
        }
        args.extend(extra.iter().cloned());
        args
    }

    /// A `$BROWSER` script that appends the URL it is given to `browser-urls`.
    fn browser_script(&self) -> anyhow::Result<PathBuf> {
        let script = self.path("browser.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$1\" >> '{}'\n",
                self.path("browser-urls").display()
            ),
        )?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        Ok(script)
    }

    fn browser_urls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("browser-urls"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// A kubeconfig for the proxy whose user runs `selkie args` with `env`.
    fn kubeconfig(&self, name: &str, args: &[String], env: &[(&str, String)]) -> anyhow::Result<PathBuf> {
        let path = self.path(&format!("{name}.kubeconfig"));
        let env: Vec<Value> = env
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        let exec = json!({"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": self.selkie,
            "args": args,
            "env": env,
            "provideClusterInfo": true,
            "interactiveMode": "IfAvailable",
        }});
        write_kubeconfig_for_user(
            &path,
            self.proxy.url(),
            &self.proxy.serving_ca().cert_pem(),
            name,
            exec,
        )?;
        Ok(path)
    }

    fn kubectl(&self, kubeconfig: &Path) -> Kubectl {
        self.proxy.kubectl(kubeconfig)
    }

    fn token_credential_requests(&self) -> usize {
        self.proxy
            .log()
            .lines()
            .filter(|line| line.contains("token credential request"))
            .count()
    }

    /// `kubectl auth whoami` through `kubeconfig` names the Dex user.
    async fn assert_whoami(&self, kubeconfig: &Path) -> anyhow::Result<()> {
        let review: Value = serde_json::from_str(
            &self
                .kubectl(kubeconfig)
                .run(&["auth", "whoami", "-o", "json"])
                .await?,
        )?;
        anyhow::ensure!(
            review["status"]["userInfo"]["username"] == self.email.as_str(),
            "kubectl auth whoami: {review}"
        );
        Ok(())
    }

    /// Runs selkie directly with `env` (and no KUBERNETES_EXEC_INFO), stdin closed.
    async fn run(&self, args: &[String], env: &[(&str, String)]) -> anyhow::Result<(bool, String, String)> {
        let output = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(&self.selkie)
                .args(args)
                .env_remove("KUBERNETES_EXEC_INFO")
                .env_remove("PINNIPED_USERNAME")
                .env_remove("PINNIPED_PASSWORD")
                .env_remove("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW")
                .env("BROWSER", "/bin/false")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| anyhow::anyhow!("selkie {args:?} did not exit within 60s"))??;
        Ok((
            output.status.success(),
            String::from_utf8(output.stdout)?,
            String::from_utf8(output.stderr)?,
        ))
    }

    fn password_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PINNIPED_UPSTREAM_IDENTITY_PROVIDER_FLOW", "cli_password".into()),
            ("PINNIPED_USERNAME", self.email.clone()),
            ("PINNIPED_PASSWORD", PASSWORD.into()),
        ]
    }
}

/// The one session of `sessions.yaml`.
fn only_session(path: &Path) -> anyhow::Result<Value> {
    let file: Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
    anyhow::ensure!(
        file["apiVersion"] == "config.supervisor.pinniped.dev/v1alpha1",
        "{file}"
    );
    anyhow::ensure!(file["kind"] == "SessionCache", "{file}");
    let sessions = file["sessions"].as_array().cloned().unwrap_or_default();
    anyhow::ensure!(sessions.len() == 1, "expected one session: {file}");
    Ok(sessions[0].clone())
}

#[tokio::test]
async fn the_first_kubectl_call_logs_in_with_the_browser_and_the_next_ones_use_the_caches(
) -> anyhow::Result<()> {
    let setup = Setup::start("oidc-browser").await?;
    let browser = Browser::start().await?;
    let kubeconfig = setup.kubeconfig(
        "browser",
        &setup.args(true, &[]),
        &[("BROWSER", setup.browser_script()?.display().to_string())],
    )?;
    let kubectl = setup.kubectl(&kubeconfig);
    let get = ["get", "configmaps", "-n", &setup.namespace, "-o", "name"];

    // kubectl runs the plugin, which opens the "browser"; Chromium logs in at Dex and lands on
    // the plugin's callback listener.
    let login = async {
        let url = crate::eventually(Duration::from_secs(60), || async {
            (setup.browser_urls().into_iter().next())
                .ok_or_else(|| anyhow::anyhow!("the plugin has not opened the browser"))
        })
        .await?;
        anyhow::ensure!(url.starts_with(&format!("{}/auth?", setup.dex.issuer())), "{url}");
        for parameter in [
            "code_challenge_method=S256",
            "client_id=pinniped-cli",
            "redirect_uri=http%3A%2F%2F127.0.0.1%3A",
            "nonce=",
            "state=",
        ] {
            anyhow::ensure!(url.contains(parameter), "{parameter} missing from {url}");
        }
        let landed = browser.dex_login(&url, &setup.email, PASSWORD).await?;
        anyhow::ensure!(
            landed.starts_with("http://127.0.0.1:") && landed.contains("/callback?code="),
            "Chromium ended on {landed}"
        );
        let page = browser.body_text().await?;
        anyhow::ensure!(page.contains("you have been logged in"), "callback page: {page}");
        Ok(())
    };
    let (first, logged_in) = tokio::join!(kubectl.output(&get, None), login);
    let first = first?;
    logged_in?;
    anyhow::ensure!(first.success, "first kubectl get: {}", first.stderr);
    anyhow::ensure!(setup.token_credential_requests() == 1, "{}", setup.proxy.log());

    // The session is in pinniped's format, 0600, with the tokens Dex issued.
    let sessions = setup.path("sessions.yaml");
    anyhow::ensure!(std::fs::metadata(&sessions)?.permissions().mode() & 0o777 == 0o600);
    let session = only_session(&sessions)?;
    anyhow::ensure!(session["key"]["clientID"] == "pinniped-cli", "{session}");
    anyhow::ensure!(session["key"]["issuer"] == setup.dex.issuer(), "{session}");
    anyhow::ensure!(
        session["key"]["redirect_uri"] == "http://localhost:0/callback",
        "{session}"
    );
    anyhow::ensure!(
        session["key"]["scopes"] == json!(["email", "groups", "offline_access", "openid"]),
        "{session}"
    );
    let id_token = session["tokens"]["id"]["token"].as_str().unwrap_or_default();
    anyhow::ensure!(
        selkie_e2e::pinniped_cli::jwt_claims(id_token)?["email"] == setup.email.as_str(),
        "{session}"
    );
    anyhow::ensure!(session["tokens"]["refresh"]["token"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));

    // The next calls use the cached client certificate: no browser, no TokenCredentialRequest.
    kubectl.run(&get).await?;
    setup.assert_whoami(&kubeconfig).await?;
    anyhow::ensure!(setup.browser_urls().len() == 1, "{:?}", setup.browser_urls());
    anyhow::ensure!(setup.token_credential_requests() == 1, "{}", setup.proxy.log());

    // Without the credential cache, the cached ID token is reused: a TokenCredentialRequest but
    // still no browser.
    std::fs::remove_file(setup.path("credentials.yaml"))?;
    kubectl.run(&get).await?;
    anyhow::ensure!(setup.browser_urls().len() == 1, "{:?}", setup.browser_urls());
    anyhow::ensure!(setup.token_credential_requests() == 2, "{}", setup.proxy.log());
    anyhow::ensure!(only_session(&sessions)?["tokens"]["id"]["token"] == id_token);
    Ok(())
}

#[tokio::test]
async fn the_password_flow_from_environment_variables_needs_no_browser_and_refreshes_silently(
) -> anyhow::Result<()> {
    let setup = Setup::start("oidc-password").await?;
    let mut env = setup.password_env();
    env.push(("BROWSER", "/bin/false".into()));
    let kubeconfig = setup.kubeconfig("password", &setup.args(true, &[]), &env)?;
    let kubectl = setup.kubectl(&kubeconfig);
    kubectl
        .run(&["create", "configmap", "from-oidc", "-n", &setup.namespace])
        .await?;
    setup.assert_whoami(&kubeconfig).await?;
    anyhow::ensure!(setup.token_credential_requests() == 1, "{}", setup.proxy.log());

    // Directly, without the Concierge: the credential is Dex's ID token for pinniped-cli.
    // No credential cache: every run shows what the session cache gives.
    let args: Vec<String> = setup
        .args(false, &[])
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--credential-cache=") {
                "--credential-cache=".into()
            } else {
                arg
            }
        })
        .collect();
    let (ok, stdout, stderr) = setup.run(&args, &setup.password_env()).await?;
    anyhow::ensure!(ok, "{stderr}");
    let credential: Value = serde_json::from_str(&stdout)?;
    let token = credential["status"]["token"].as_str().unwrap_or_default();
    let claims = selkie_e2e::pinniped_cli::jwt_claims(token)?;
    anyhow::ensure!(
        claims["aud"] == "pinniped-cli" && claims["email"] == setup.email.as_str(),
        "{claims}"
    );
    anyhow::ensure!(
        credential["status"]["expirationTimestamp"].is_string(),
        "{credential}"
    );

    // An ID token with less than 10 minutes left is not used; the refresh token is, silently
    // (no username or password available now, and stdin is no terminal).
    let sessions = setup.path("sessions.yaml");
    let text = std::fs::read_to_string(&sessions)?;
    let mut file: Value = serde_yaml::from_str(&text)?;
    let soon = time::OffsetDateTime::now_utc() + time::Duration::minutes(5);
    let soon = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        soon.year(),
        u8::from(soon.month()),
        soon.day(),
        soon.hour(),
        soon.minute(),
        soon.second()
    );
    file["sessions"][0]["tokens"]["id"]["expiryTimestamp"] = json!(soon);
    let old_id = file["sessions"][0]["tokens"]["id"]["token"].clone();
    std::fs::write(&sessions, serde_yaml::to_string(&file)?)?;
    let (ok, stdout, stderr) = setup.run(&args, &[]).await?;
    anyhow::ensure!(ok, "refresh: {stderr}");
    let refreshed: Value = serde_json::from_str(&stdout)?;
    anyhow::ensure!(
        refreshed["status"]["token"] != old_id,
        "the old ID token was used"
    );
    anyhow::ensure!(only_session(&sessions)?["tokens"]["id"]["token"] == refreshed["status"]["token"]);

    // A wrong password: one line, non-zero, nothing on stdout.
    std::fs::remove_file(&sessions)?;
    let mut wrong = setup.password_env();
    wrong[2].1 = "not-the-password".into();
    let (ok, stdout, stderr) = setup.run(&args, &wrong).await?;
    anyhow::ensure!(!ok && stdout.is_empty(), "{stdout}");
    anyhow::ensure!(stderr.lines().count() == 1, "{stderr}");
    anyhow::ensure!(stderr.contains("password grant failed"), "{stderr}");

    // Ten kubectl calls at once on cold caches log in once (last: Dex keeps one refresh token per
    // user and client, so this login revokes the earlier session's): one password grant, one session,
    // one TokenCredentialRequest.
    let parallel_args: Vec<String> = setup
        .args(true, &[])
        .into_iter()
        .map(|arg| arg.replace("sessions.yaml", "parallel-sessions.yaml"))
        .map(|arg| arg.replace("credentials.yaml", "parallel-credentials.yaml"))
        .collect();
    let parallel = setup.kubeconfig("parallel", &parallel_args, &env)?;
    let parallel_kubectl = setup.kubectl(&parallel);
    let get = ["get", "configmaps", "-n", &setup.namespace, "-o", "name"];
    let calls = (0..10).map(|_| parallel_kubectl.run(&get));
    for result in futures::future::join_all(calls).await {
        anyhow::ensure!(result?.contains("from-oidc"), "a parallel kubectl call failed");
    }
    anyhow::ensure!(setup.token_credential_requests() == 2, "{}", setup.proxy.log());
    only_session(&setup.path("parallel-sessions.yaml"))?;

    // A revoked session: another login of the same user and client makes Dex drop the parallel
    // session's refresh token. With its ID token near expiry, the refresh fails and the login
    // starts again (here from the environment) instead of failing.
    let other: Vec<String> = args
        .iter()
        .map(|arg| arg.replace("sessions.yaml", "other-sessions.yaml"))
        .collect();
    let (ok, _, stderr) = setup.run(&other, &setup.password_env()).await?;
    anyhow::ensure!(ok, "{stderr}");
    let parallel_sessions = setup.path("parallel-sessions.yaml");
    let mut file: Value = serde_yaml::from_str(&std::fs::read_to_string(&parallel_sessions)?)?;
    file["sessions"][0]["tokens"]["id"]["expiryTimestamp"] = json!(soon);
    std::fs::write(&parallel_sessions, serde_yaml::to_string(&file)?)?;
    let revoked: Vec<String> = args
        .iter()
        .map(|arg| arg.replace("sessions.yaml", "parallel-sessions.yaml"))
        .collect();
    let mut env = setup.password_env();
    env.push(("PINNIPED_DEBUG", "true".into()));
    let (ok, stdout, stderr) = setup.run(&revoked, &env).await?;
    anyhow::ensure!(ok && stdout.contains("\"token\""), "revoked session: {stderr}");
    anyhow::ensure!(stderr.contains("refresh failed, logging in again"), "{stderr}");
    Ok(())
}

/// Runs `tmux args`, failing on a non-zero exit.
async fn tmux(args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new("tmux").args(args).output().await?;
    anyhow::ensure!(
        output.status.success(),
        "tmux {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

struct TmuxSession(String);

impl Drop for TmuxSession {
    fn drop(&mut self) {
        let _best_effort = std::process::Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

#[tokio::test]
async fn with_skip_listen_the_code_is_pasted_into_the_terminal() -> anyhow::Result<()> {
    let setup = Setup::start("oidc-paste").await?;
    let browser = Browser::start().await?;
    // Where the browser lands: nothing of the CLI listens here (--skip-listen), as when the
    // browser runs on another machine. The test reads the code from the request, as a user
    // copies it from the address bar.
    let landing = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = landing.local_addr()?.port();
    let out = setup.path("paste.out");
    let status = setup.path("paste.status");
    let args = setup.args(
        false,
        &[
            "--skip-listen".into(),
            "--skip-browser".into(),
            format!("--listen-port={port}"),
        ],
    );
    let quoted: Vec<String> = args.iter().map(|arg| format!("'{arg}'")).collect();
    let command = format!(
        "env -u KUBERNETES_EXEC_INFO '{}' {} > '{}'; echo $? > '{}'; sleep 30",
        setup.selkie.display(),
        quoted.join(" "),
        out.display(),
        status.display()
    );
    let name = format!("selkie-{}", setup.namespace);
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &name,
        "-x",
        "200",
        "-y",
        "50",
        &command,
    ])
    .await?;
    let _session = TmuxSession(name.clone());
    let pane = || async { tmux(&["capture-pane", "-p", "-J", "-t", &name]).await };

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let screen = loop {
        let screen = pane().await?;
        if screen.contains("Optionally, paste your authorization code:") {
            break screen;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no prompt; the terminal shows:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let url: String = screen
        .split_whitespace()
        .find(|word| word.starts_with("https://"))
        .ok_or_else(|| anyhow::anyhow!("no URL on the terminal:\n{screen}"))?
        .to_string();
    anyhow::ensure!(
        url.contains(&format!(
            "redirect_uri=http%3A%2F%2F127.0.0.1%3A{port}%2Fcallback"
        )),
        "{url}"
    );

    // Chromium may open speculative connections; each is served on its own, and the first
    // request for /callback gives the code.
    let (targets, mut received) = tokio::sync::mpsc::channel::<String>(1);
    let server = tokio::spawn(async move {
        while let Ok((mut stream, _)) = landing.accept().await {
            let targets = targets.clone();
            tokio::spawn(async move {
                let mut reader = tokio::io::BufReader::new(&mut stream);
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).await.is_err() {
                    return;
                }
                let _best_effort = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                    .await;
                let target = request_line
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                if target.starts_with("/callback?") {
                    let _first_wins = targets.send(target).await;
                }
            });
        }
    });
    let (landed, target) = tokio::join!(browser.dex_login(&url, &setup.email, PASSWORD), received.recv());
    server.abort();
    landed?;
    let target = target.ok_or_else(|| anyhow::anyhow!("the browser never reached the callback"))?;
    let query = target
        .split_once('?')
        .map(|(_, q)| q.to_string())
        .unwrap_or_default();
    let code = form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "code")
        .map(|(_, value)| value.into_owned())
        .ok_or_else(|| anyhow::anyhow!("no code in {target}"));
    let code = code?;
    tmux(&["send-keys", "-t", &name, &code, "Enter"]).await?;

    let exit = crate::eventually(Duration::from_secs(30), || async {
        std::fs::read_to_string(&status)
            .ok()
            .filter(|s| s.ends_with('\n'))
            .ok_or_else(|| anyhow::anyhow!("selkie has not exited"))
    })
    .await?;
    let screen = pane().await?;
    anyhow::ensure!(exit.trim() == "0", "exit {exit}; the terminal shows:\n{screen}");
    let credential: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let claims =
        selkie_e2e::pinniped_cli::jwt_claims(credential["status"]["token"].as_str().unwrap_or_default())?;
    anyhow::ensure!(claims["email"] == setup.email.as_str(), "{claims}");
    anyhow::ensure!(!screen.contains("eyJ"), "a token reached the terminal:\n{screen}");
    Ok(())
}

/// Runs selkie with a callback listener and `--skip-browser`, reads the URL it prints, and
/// sends the browser's redirect to its callback with `query` (the state appended unless
/// `keep_state` is false, when `state=forged` is sent). Returns (success, stdout, stderr).
async fn run_with_callback(
    setup: &Setup,
    query: &str,
    real_state: bool,
) -> anyhow::Result<(bool, String, String)> {
    let mut child = tokio::process::Command::new(&setup.selkie)
        .args(setup.args(false, &["--skip-browser".into()]))
        .env_remove("KUBERNETES_EXEC_INFO")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stderr =
        tokio::io::BufReader::new(child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?);
    let mut seen = String::new();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let mut line = String::new();
            anyhow::ensure!(stderr.read_line(&mut line).await? > 0, "selkie ended: {seen}");
            seen.push_str(&line);
            if let Some(url) = line.split_whitespace().find(|w| w.starts_with("https://")) {
                return anyhow::Ok(url.to_string());
            }
        }
    })
    .await??;
    let params: Vec<(String, String)> =
        form_urlencoded::parse(url.split_once('?').map(|(_, q)| q).unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let redirect = get("redirect_uri");
    let state = if real_state { get("state") } else { "forged".into() };
    let callback = format!("{redirect}?{query}&state={state}");
    let host = redirect
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(&host).await?;
    let target = callback.trim_start_matches(&format!("http://{host}"));
    stream
        .write_all(format!("GET {target} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut page = String::new();
    stream.read_to_string(&mut page).await?;
    anyhow::ensure!(page.starts_with("HTTP/1.1 403"), "callback answered: {page}");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).await?;
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout).await?;
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await??;
    Ok((status.success(), stdout, rest))
}

/// A failure must be exactly one line on stderr, with no output and no token.
fn assert_one_line(what: &str, result: &(bool, String, String), expected: &[&str]) -> anyhow::Result<()> {
    let (ok, stdout, stderr) = result;
    anyhow::ensure!(!ok, "{what}: succeeded: {stdout}");
    anyhow::ensure!(stdout.is_empty(), "{what}: printed {stdout}");
    anyhow::ensure!(stderr.lines().count() == 1, "{what}: not one line:\n{stderr}");
    anyhow::ensure!(!stderr.contains("eyJ"), "{what}: a token on stderr: {stderr}");
    for needle in expected {
        anyhow::ensure!(
            stderr.contains(needle),
            "{what}: {needle:?} missing from: {stderr}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn bad_input_is_one_line_on_stderr_and_no_token() -> anyhow::Result<()> {
    let setup = Setup::start("oidc-bad").await?;
    let password_env = setup.password_env();

    // Unreachable issuer.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut args = setup.args(false, &[]);
    args[2] = format!("--issuer=https://127.0.0.1:{closed}/dex");
    let result = setup.run(&args, &password_env).await?;
    assert_one_line(
        "unreachable issuer",
        &result,
        &["could not perform OIDC discovery", "Connection refused"],
    )?;

    // A CA that did not sign Dex's certificate.
    let other_ca = CertificateAuthority::new("selkie-test-not-dex")?;
    let mut args = setup.args(false, &[]);
    args[3] = format!("--ca-bundle-data={}", B64.encode(other_ca.cert_pem()));
    let result = setup.run(&args, &password_env).await?;
    assert_one_line(
        "wrong CA",
        &result,
        &["could not perform OIDC discovery", "certificate", "--ca-bundle"],
    )?;

    // The identity provider's error redirect, and a callback with a forged state.
    let result = run_with_callback(
        &setup,
        "error=access_denied&error_description=the+user+declined",
        true,
    )
    .await?;
    let stderr_lines: Vec<&str> = result.2.lines().filter(|l| l.starts_with("selkie:")).collect();
    anyhow::ensure!(!result.0 && result.1.is_empty(), "access_denied: {result:?}");
    anyhow::ensure!(stderr_lines.len() == 1, "{}", result.2);
    anyhow::ensure!(
        stderr_lines[0].contains("refused the login with code \"access_denied\": the user declined"),
        "{}",
        result.2
    );
    let result = run_with_callback(&setup, "code=stolen-code", false).await?;
    let stderr_lines: Vec<&str> = result.2.lines().filter(|l| l.starts_with("selkie:")).collect();
    anyhow::ensure!(!result.0 && result.1.is_empty(), "forged state: {result:?}");
    anyhow::ensure!(
        stderr_lines.len() == 1 && stderr_lines[0].contains("wrong state"),
        "{}",
        result.2
    );

    // A corrupt session cache is set aside with one warning; the login goes on.
    let sessions = setup.path("sessions.yaml");
    std::fs::write(&sessions, "sessions: [ {{{ not yaml")?;
    std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o600))?;
    let (ok, stdout, stderr) = setup.run(&setup.args(false, &[]), &password_env).await?;
    anyhow::ensure!(ok && stdout.contains("\"token\""), "corrupt cache: {stderr}");
    anyhow::ensure!(
        stderr.lines().count() == 1 && stderr.contains("moved it to"),
        "{stderr}"
    );
    anyhow::ensure!(setup.path("sessions.yaml.corrupt").exists());
    only_session(&sessions)?;

    // A session cache others can read is refused (it holds refresh tokens).
    std::fs::set_permissions(&sessions, std::fs::Permissions::from_mode(0o644))?;
    std::fs::remove_file(setup.path("credentials.yaml"))?;
    let result = setup.run(&setup.args(false, &[]), &password_env).await?;
    assert_one_line("open session cache", &result, &["mode 0644", "chmod 600"])?;
    Ok(())
}

/// Runs kubectl (directly, to give it `env`) with `kubeconfig`.
async fn kubectl_with_env(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
    env: &[(&str, String)],
) -> anyhow::Result<(bool, String, String)> {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(kubectl)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("KUBECACHEDIR", kubeconfig.with_extension("kubectl-cache"))
            .env_remove("KUBERNETES_EXEC_INFO")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    Ok((
        output.status.success(),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

#[tokio::test]
async fn get_kubeconfig_discovers_the_concierge_and_the_jwt_authenticator_and_its_output_works(
) -> anyhow::Result<()> {
    // A cluster of its own: discovery wants exactly one CredentialIssuer and one authenticator.
    // The JWTAuthenticator object is named like the proxy's configured authenticator ("dex"), as
    // the Concierge's controller would configure it.
    let selkie = selkie_e2e::workspace_binary("selkie", "selkie")?;
    let cluster = Cluster::start().await?;
    let client = cluster.client().await?;
    let admin = cluster.kubectl();
    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conf/crds");
    admin
        .run(&["apply", "--server-side", "-f", &crds.to_string_lossy()])
        .await?;
    admin
        .run(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &crds.to_string_lossy(),
        ])
        .await?;
    let namespace = cluster.create_namespace(&client, "oidc-kubeconfig").await?;
    let email = format!("{namespace}@example.com");
    let dex = Dex::start(&[DexUser {
        email: email.clone(),
        password: PASSWORD.into(),
        user_id: format!("id-{namespace}"),
        groups: vec![],
    }])
    .await?;
    grant_configmaps(&cluster, &namespace, "User", &email).await?;
    let proxy = Proxy::start(
        &cluster,
        &[JwtSpec {
            audience: PUBLIC_CLIENT_ID.into(),
            ..JwtSpec::for_dex(&dex)
        }],
    )
    .await?;
    let dir = tempfile::Builder::new().prefix("selkie-getkc-").tempdir()?;
    let get = |extra: &[String]| {
        let mut args = vec![
            "get".to_string(),
            "kubeconfig".into(),
            format!("--kubeconfig={}", cluster.admin_kubeconfig().display()),
            format!(
                "--oidc-session-cache={}",
                dir.path().join("sessions.yaml").display()
            ),
            format!(
                "--credential-cache={}",
                dir.path().join("credentials.yaml").display()
            ),
            "--oidc-scopes=openid,offline_access,email,groups".into(),
            "--upstream-identity-provider-flow=cli_password".into(),
            "--timeout=60s".into(),
        ];
        args.extend(extra.iter().cloned());
        let selkie = selkie.clone();
        async move {
            let output = tokio::process::Command::new(selkie)
                .args(&args)
                .env_remove("KUBECONFIG")
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output()
                .await?;
            anyhow::Ok((
                output.status.success(),
                String::from_utf8(output.stdout)?,
                String::from_utf8(output.stderr)?,
            ))
        }
    };

    // Nothing installed yet: one line each.
    // Progress lines come first (as pinniped logs them); the failure is the last line.
    let failed_with = |(ok, stdout, stderr): (bool, String, String), expected: &str| {
        let last = stderr.lines().last().unwrap_or_default().to_string();
        anyhow::ensure!(!ok && stdout.is_empty(), "{expected}: {stdout}");
        anyhow::ensure!(
            last.starts_with("selkie: ") && last.contains(expected),
            "{expected}: {stderr}"
        );
        Ok(())
    };
    failed_with(get(&[]).await?, "no CredentialIssuers were found")?;

    let issuer_object = json!({
        "apiVersion": "config.concierge.pinniped.dev/v1alpha1", "kind": "CredentialIssuer",
        "metadata": {"name": "selkie-test-config"},
        "spec": {"impersonationProxy": {"mode": "auto", "service": {"type": "LoadBalancer"}}},
    });
    admin
        .run_with_stdin(&["apply", "-f", "-"], Some(&issuer_object.to_string()))
        .await?;
    failed_with(get(&[]).await?, "no authenticators were found")?;

    let authenticator = json!({
        "apiVersion": "authentication.concierge.pinniped.dev/v1alpha1", "kind": "JWTAuthenticator",
        "metadata": {"name": "dex"},
        "spec": {"issuer": dex.issuer(), "audience": PUBLIC_CLIENT_ID,
                 "tls": {"certificateAuthorityData": B64.encode(dex.ca_pem())}},
    });
    admin
        .run_with_stdin(&["apply", "-f", "-"], Some(&authenticator.to_string()))
        .await?;

    // The impersonation proxy strategy is pending at first: the command waits for it.
    let strategy = |status: &str, reason: &str, frontend: Value| {
        json!({"status": {"strategies": [
            {"type": "KubeClusterSigningCertificate", "status": "Error", "reason": "CouldNotFetchKey",
             "message": "unable to fetch cluster signing key", "lastUpdateTime": "2026-01-01T00:00:00Z"},
            {"type": "ImpersonationProxy", "status": status, "reason": reason, "message": "test",
             "lastUpdateTime": "2026-01-01T00:00:00Z", "frontend": frontend},
        ]}})
    };
    let patch_status = |status: Value| {
        let admin = admin.clone();
        async move {
            admin
                .run(&[
                    "patch",
                    "credentialissuer",
                    "selkie-test-config",
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &status.to_string(),
                ])
                .await
        }
    };
    patch_status(strategy("Error", "Pending", Value::Null)).await?;
    let proxy_frontend = json!({"type": "ImpersonationProxy", "impersonationProxyInfo": {
        "endpoint": proxy.url(), "certificateAuthorityData": B64.encode(proxy.serving_ca().cert_pem())}});
    let (generated, patched) = tokio::join!(get(&[]), async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        patch_status(strategy("Success", "Listening", proxy_frontend.clone())).await
    });
    patched?;
    let (ok, yaml, stderr) = generated?;
    anyhow::ensure!(ok, "get kubeconfig: {stderr}");
    anyhow::ensure!(
        stderr.contains("waiting for CredentialIssuer pending strategies"),
        "{stderr}"
    );
    anyhow::ensure!(stderr.contains("impersonation proxy mode"), "{stderr}");
    anyhow::ensure!(!yaml.contains("selkie:"), "messages on stdout: {yaml}");

    let config: Value = serde_yaml::from_str(&yaml)?;
    anyhow::ensure!(config["current-context"] == "selkie-test-pinniped", "{config}");
    let cluster_entry = &config["clusters"][0]["cluster"];
    anyhow::ensure!(cluster_entry["server"] == proxy.url(), "{config}");
    anyhow::ensure!(
        cluster_entry["certificate-authority-data"] == B64.encode(proxy.serving_ca().cert_pem()).as_str(),
        "{config}"
    );
    let exec = &config["users"][0]["user"]["exec"];
    anyhow::ensure!(exec["command"] == selkie.to_string_lossy().as_ref(), "{exec}");
    anyhow::ensure!(exec["provideClusterInfo"] == true, "{exec}");
    let args: Vec<String> = exec["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    for expected in [
        "login".to_string(),
        "oidc".into(),
        "--enable-concierge".into(),
        "--concierge-authenticator-type=jwt".into(),
        "--concierge-authenticator-name=dex".into(),
        format!("--concierge-endpoint={}", proxy.url()),
        format!(
            "--concierge-ca-bundle-data={}",
            B64.encode(proxy.serving_ca().cert_pem())
        ),
        format!("--issuer={}", dex.issuer()),
        "--client-id=pinniped-cli".into(),
        format!("--request-audience={PUBLIC_CLIENT_ID}"),
        format!("--ca-bundle-data={}", B64.encode(dex.ca_pem())),
        "--upstream-identity-provider-flow=cli_password".into(),
    ] {
        anyhow::ensure!(args.contains(&expected), "{expected} missing from {args:?}");
    }

    // kubectl with the generated kubeconfig: the password flow from the environment, a
    // TokenCredentialRequest at the proxy, then the cluster.
    let kubeconfig = dir.path().join("generated.kubeconfig");
    std::fs::write(&kubeconfig, &yaml)?;
    let env = vec![
        ("PINNIPED_USERNAME", email.clone()),
        ("PINNIPED_PASSWORD", PASSWORD.to_string()),
    ];
    let kubectl_binary = admin.binary().to_path_buf();
    let (ok, _, stderr) = kubectl_with_env(
        &kubectl_binary,
        &kubeconfig,
        &["create", "configmap", "via-generated", "-n", &namespace],
        &env,
    )
    .await?;
    anyhow::ensure!(ok, "kubectl with the generated kubeconfig: {stderr}");
    let (ok, whoami, stderr) = kubectl_with_env(
        &kubectl_binary,
        &kubeconfig,
        &["auth", "whoami", "-o", "json"],
        &env,
    )
    .await?;
    anyhow::ensure!(ok, "{stderr}");
    let review: Value = serde_json::from_str(&whoami)?;
    anyhow::ensure!(
        review["status"]["userInfo"]["username"] == email.as_str(),
        "{review}"
    );

    // The static-token variant.
    let (ok, yaml, stderr) = get(&[
        "--static-token-env=MY_TOKEN".into(),
        "--concierge-authenticator-type=jwt".into(),
        "--concierge-authenticator-name=dex".into(),
    ])
    .await?;
    anyhow::ensure!(ok, "{stderr}");
    let config: Value = serde_yaml::from_str(&yaml)?;
    let args = &config["users"][0]["user"]["exec"]["args"];
    anyhow::ensure!(args[0] == "login" && args[1] == "static", "{args}");
    anyhow::ensure!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|v| v == "--token-env=MY_TOKEN")),
        "{args}"
    );
    anyhow::ensure!(!args.to_string().contains("--issuer"), "{args}");
    Ok(())
}

/// Deployment strategy 4, minimal (CLI only): no Concierge, no Supervisor. kube-apiserver trusts
/// Dex directly through a structured `--authentication-config`, and kubectl's credential plugin is
/// `selkie login oidc` straight against Dex (`--enable-concierge` off): Chromium logs in at Dex's
/// form once, kubectl acts as the Dex user with their groups, and the next call uses the cached
/// ID token without a browser.
#[tokio::test]
async fn deployment_strategy_minimal_cli_only_against_dex_and_a_kube_apiserver_trusting_it(
) -> anyhow::Result<()> {
    let setup = Setup::start("strategy-minimal").await?;
    let authentication = setup.path("authentication.yaml");
    let config = json!({
        "apiVersion": "apiserver.config.k8s.io/v1beta1",
        "kind": "AuthenticationConfiguration",
        "jwt": [{
            "issuer": {
                "url": setup.dex.issuer(),
                "audiences": [PUBLIC_CLIENT_ID],
                "certificateAuthority": setup.dex.ca_pem(),
            },
            "claimMappings": {
                "username": {"claim": "email", "prefix": ""},
                "groups": {"claim": "groups", "prefix": ""},
            },
        }],
    });
    std::fs::write(&authentication, serde_yaml::to_string(&config)?)?;
    let cluster = Cluster::builder()
        .dir(setup.path("cluster"))
        .apiserver_arg(format!("--authentication-config={}", authentication.display()))
        .start()
        .await?;
    let kubeconfig = setup.path("minimal.kubeconfig");
    let exec = json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": setup.selkie,
        "args": setup.args(false, &[]),
        "env": [{"name": "BROWSER", "value": setup.browser_script()?.display().to_string()}],
        "interactiveMode": "IfAvailable",
    }});
    write_kubeconfig_for_user(
        &kubeconfig,
        cluster.server_url(),
        &cluster.pki().server_ca.cert_pem(),
        "minimal",
        exec,
    )?;
    let kubectl = cluster.kubectl().with_kubeconfig(&kubeconfig);
    let browser = Browser::start().await?;
    let login = async {
        let url = crate::eventually(Duration::from_secs(60), || async {
            (setup.browser_urls().into_iter().next())
                .ok_or_else(|| anyhow::anyhow!("the plugin has not opened the browser"))
        })
        .await?;
        anyhow::ensure!(url.starts_with(&format!("{}/auth?", setup.dex.issuer())), "{url}");
        browser.dex_login(&url, &setup.email, PASSWORD).await?;
        Ok(())
    };
    // kube-apiserver fetches Dex's keys in the background after it starts: the first answer may
    // be a 401, after which kubectl runs the plugin again (with the cached token).
    let whoami = || async {
        crate::eventually(Duration::from_secs(60), || async {
            let out = kubectl.run(&["auth", "whoami", "-o", "json"]).await?;
            Ok(serde_json::from_str::<Value>(&out)?["status"]["userInfo"].clone())
        })
        .await
    };
    let (user, logged_in) = tokio::join!(whoami(), login);
    logged_in?;
    let user = user?;
    anyhow::ensure!(user["username"] == setup.email.as_str(), "{user}");
    anyhow::ensure!(
        user["groups"]
            .as_array()
            .is_some_and(|groups| groups.iter().any(|group| group == "oidc-devs")),
        "{user}"
    );
    // The next call: the cached ID token, no second browser.
    let again = whoami().await?;
    anyhow::ensure!(again["username"] == setup.email.as_str(), "{again}");
    anyhow::ensure!(setup.browser_urls().len() == 1, "{:?}", setup.browser_urls());
    Ok(())
}
