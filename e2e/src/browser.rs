//! Headless Chromium driven over WebDriver (chromedriver, both from Debian): the browser of the
//! OIDC login tests. [`Browser::start`] runs chromedriver on a free loopback port and opens one
//! session of `/usr/bin/chromium --headless` with a private profile; [`Browser::dex_login`] fills
//! Dex's password form. Stopped on drop (the session is closed and chromedriver killed).
//!
//! The WebDriver client is a few JSON calls over HTTP/1.1 with hyper; nothing is downloaded.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde_json::{json, Value};

use crate::HarnessError;

/// Debian's Chromium.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Debian's chromedriver.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// WebDriver's element reference key.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often one wait loads a page again after a network change interrupted it.
const RELOADS: u32 = 3;

/// A chromedriver process with one headless Chromium session.
pub struct Browser {
    driver: tokio::process::Child,
    base: String,
    session: String,
    client: Client<HttpConnector, Full<Bytes>>,
    _profile: tempfile::TempDir,
    log: PathBuf,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

fn browser_error(what: impl std::fmt::Display) -> HarnessError {
    HarnessError::kube("headless Chromium", what.to_string())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session that accepts the tests' private CAs
    /// (`acceptInsecureCerts`). Fails if either binary is missing (setup.sh installs them).
    pub async fn start() -> Result<Browser, HarnessError> {
        for binary in [CHROMIUM, CHROMEDRIVER] {
            if !Path::new(binary).exists() {
                return Err(browser_error(format!(
                    "{binary} is missing: run e2e/scripts/setup.sh (it installs chromium and chromium-driver)"
                )));
            }
        }
        let profile = tempfile::Builder::new()
            .prefix("chromium-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating Chromium's profile directory", e))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| HarnessError::io("finding a free port for chromedriver", e))?
            .port();
        let log = profile.path().join("chromedriver.log");
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::io("starting chromedriver", e))?;
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            _profile: profile,
            log,
        };
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Ok(status) = browser.call(http::Method::GET, "/status", None).await {
                if status["value"]["ready"] == true {
                    break;
                }
            }
            if Instant::now() >= deadline {
                return Err(browser_error(format!(
                    "chromedriver was not ready within {STEP_TIMEOUT:?}; log: {}",
                    browser.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let user_data_dir = browser._profile.path().join("profile");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", user_data_dir.display()),
                ],
            },
        }}});
        let created = browser
            .call(http::Method::POST, "/session", Some(capabilities))
            .await?;
        browser.session = created["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| browser_error(format!("no session id in {created}; log: {}", browser.log_tail())))?
            .to_string();
        Ok(browser)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, HarnessError> {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .map_err(browser_error)?;
        let response = tokio::time::timeout(STEP_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| browser_error(format!("WebDriver {path}: no answer within {STEP_TIMEOUT:?}")))?
            .map_err(|e| browser_error(format!("WebDriver {path}: {e}")))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| browser_error(format!("WebDriver {path}: {e}")))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(browser_error(format!(
                "WebDriver {path} answered {status}: {value}"
            )));
        }
        Ok(value)
    }

    fn session_path(&self, tail: &str) -> String {
        format!("/session/{}{tail}", self.session)
    }

    /// Navigates to `url` (waits for the page load); when a network change interrupted the load
    /// (or a redirect it led to), navigates to `url` again, at most [`RELOADS`] times, as a user
    /// would.
    pub async fn goto(&self, url: &str) -> Result<(), HarnessError> {
        self.navigate(url).await?;
        let mut reloads = 0;
        while reloads < RELOADS && self.interrupted().await? {
            reloads += 1;
            self.navigate(url).await?;
        }
        Ok(())
    }

    /// Navigates to `url` once (waits for the page load).
    async fn navigate(&self, url: &str) -> Result<(), HarnessError> {
        self.call(
            http::Method::POST,
            &self.session_path("/url"),
            Some(json!({"url": url})),
        )
        .await
        .map(drop)
    }

    /// The current URL.
    pub async fn current_url(&self) -> Result<String, HarnessError> {
        let value = self
            .call(http::Method::GET, &self.session_path("/url"), None)
            .await?;
        Ok(value["value"].as_str().unwrap_or_default().to_string())
    }

    /// The text of the page's body.
    pub async fn body_text(&self) -> Result<String, HarnessError> {
        let body = self.find("body").await?;
        let value = self
            .call(
                http::Method::GET,
                &self.session_path(&format!("/element/{body}/text")),
                None,
            )
            .await?;
        Ok(value["value"].as_str().unwrap_or_default().to_string())
    }

    /// Loads the current page again when Chromium shows its error page for a load that a
    /// network change interrupted (`ERR_NETWORK_CHANGED`: Chromium aborts page loads when the
    /// machine's interfaces change, which the node tests' CNI does while other tests run), as a
    /// user would; at most [`RELOADS`] times per wait (`reloads` counts them).
    pub async fn reload_if_interrupted(&self, reloads: &mut u32) -> Result<(), HarnessError> {
        if *reloads < RELOADS && self.interrupted().await? {
            *reloads += 1;
            let url = self.current_url().await?;
            self.navigate(&url).await?;
        }
        Ok(())
    }

    /// Whether the page is Chromium's error page for a load a network change interrupted.
    async fn interrupted(&self) -> Result<bool, HarnessError> {
        let source = self
            .call(http::Method::GET, &self.session_path("/source"), None)
            .await?;
        Ok(source["value"]
            .as_str()
            .is_some_and(|page| page.contains("ERR_NETWORK_CHANGED")))
    }

    /// The element matching the CSS `selector`, waiting for it to appear (loading the page again
    /// if a network change interrupted its load).
    pub async fn find(&self, selector: &str) -> Result<String, HarnessError> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut reloads = 0;
        loop {
            let found = self
                .call(
                    http::Method::POST,
                    &self.session_path("/element"),
                    Some(json!({"using": "css selector", "value": selector})),
                )
                .await;
            if let Ok(value) = &found {
                if let Some(id) = value["value"][ELEMENT_KEY].as_str() {
                    return Ok(id.to_string());
                }
            }
            if Instant::now() >= deadline {
                let url = self.current_url().await.unwrap_or_default();
                return Err(browser_error(format!(
                    "no element {selector:?} on {url} within {STEP_TIMEOUT:?}"
                )));
            }
            self.reload_if_interrupted(&mut reloads).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types `text` into the element matching `selector`.
    pub async fn type_into(&self, selector: &str, text: &str) -> Result<(), HarnessError> {
        let element = self.find(selector).await?;
        self.call(
            http::Method::POST,
            &self.session_path(&format!("/element/{element}/value")),
            Some(json!({"text": text})),
        )
        .await
        .map(drop)
    }

    /// Clicks the element matching `selector`.
    pub async fn click(&self, selector: &str) -> Result<(), HarnessError> {
        let element = self.find(selector).await?;
        self.call(
            http::Method::POST,
            &self.session_path(&format!("/element/{element}/click")),
            Some(json!({})),
        )
        .await
        .map(drop)
    }

    /// The DOM property `name` of the element matching `selector` (waiting for it to appear):
    /// the live value (`value` of an input, unescaped), `null` when the element has no such
    /// property.
    pub async fn property(&self, selector: &str, name: &str) -> Result<Value, HarnessError> {
        let element = self.find(selector).await?;
        let value = self
            .call(
                http::Method::GET,
                &self.session_path(&format!("/element/{element}/property/{name}")),
                None,
            )
            .await?;
        Ok(value["value"].clone())
    }

    /// Runs the DevTools protocol command `command` with `params` in the session's page
    /// (chromedriver's `goog/cdp/execute`): its result.
    pub async fn devtools(&self, command: &str, params: Value) -> Result<Value, HarnessError> {
        let value = self
            .call(
                http::Method::POST,
                &self.session_path("/goog/cdp/execute"),
                Some(json!({"cmd": command, "params": params})),
            )
            .await?;
        Ok(value["value"].clone())
    }

    /// Lets the pages' own scripts run, or not, from the next page load on (DevTools'
    /// `Emulation.setScriptExecutionDisabled`, which holds across navigations). Without scripts a
    /// page that submits a form on load — a SAML HTTP-POST binding page — stays, with its form,
    /// until the test reads it; the WebDriver commands themselves keep working.
    pub async fn set_scripts_enabled(&self, enabled: bool) -> Result<(), HarnessError> {
        self.devtools("Emulation.setScriptExecutionDisabled", json!({"value": !enabled}))
            .await
            .map(drop)
    }

    /// Opens `authorize_url` (a Dex authorization request) and logs in with Dex's password form
    /// as `login`/`password`. With `skipApprovalScreen`, Dex then redirects to the client's
    /// redirect URI; returns the URL the browser ended on. When a network change interrupts the
    /// form's submission, the login starts again from `authorize_url` (at most [`RELOADS`]
    /// times), as a user would.
    pub async fn dex_login(
        &self,
        authorize_url: &str,
        login: &str,
        password: &str,
    ) -> Result<String, HarnessError> {
        let mut attempts = 0;
        'login: loop {
            attempts += 1;
            self.goto(authorize_url).await?;
            self.type_into("input[name=login]", login).await?;
            self.type_into("input[name=password]", password).await?;
            self.click("button[type=submit]").await?;
            // Wait until the browser has left Dex.
            let deadline = Instant::now() + STEP_TIMEOUT;
            loop {
                let url = self.current_url().await?;
                if !url.contains("/dex/") {
                    return Ok(url);
                }
                if attempts <= RELOADS && self.interrupted().await? {
                    continue 'login;
                }
                if Instant::now() >= deadline {
                    let text = self.body_text().await.unwrap_or_default();
                    return Err(browser_error(format!(
                        "still on Dex ({url}) {STEP_TIMEOUT:?} after submitting the login form: {text}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closing the session makes chromedriver quit Chromium; killing chromedriver alone would
        // leave Chromium running. A blocking raw request: drop cannot await.
        if !self.session.is_empty() {
            use std::io::{Read as _, Write as _};
            let address = self.base.trim_start_matches("http://").to_string();
            if let Ok(mut stream) = std::net::TcpStream::connect(&address) {
                let _best_effort = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let request = format!(
                    "DELETE /session/{} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.session
                );
                if stream.write_all(request.as_bytes()).is_ok() {
                    let mut answer = Vec::new();
                    let _best_effort = stream.read_to_end(&mut answer);
                }
            }
        }
        let _best_effort = self.driver.start_kill();
    }
}
