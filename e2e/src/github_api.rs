//! A GitHub-API-compatible HTTPS server: the one stand-in the project allows (GitHub itself is
//! unreachable from these machines), written from GitHub's published documentation — "Authorizing
//! OAuth apps" (the web application flow: `GET /login/oauth/authorize`, `POST
//! /login/oauth/access_token`, its JSON and error answers such as `bad_verification_code` with
//! HTTP 200), the REST API's `GET /user`, `GET /user/orgs` and `GET /user/teams` (team objects
//! with their `organization` and `parent`), "Using pagination in the REST API" (`per_page` up to
//! 100, `page`, the `Link` header's `next`/`prev`/`first`/`last`), "Rate limits for the REST API"
//! (`x-ratelimit-*` headers, 403 with `API rate limit exceeded for …`) and the error body shape
//! (`message`, `documentation_url`).
//!
//! It is laid out as a GitHub Enterprise Server: OAuth under `/login/oauth`, the REST API under
//! `/api/v3` (what a GitHubIdentityProvider with `githubAPI.host: 127.0.0.1:<port>` uses). Users
//! sign in on an HTML form (`#login_field`, `#password`, `commit`) that Chromium fills. State is
//! in memory; tests change it while the Supervisor runs (remove a team member, exhaust the rate
//! limit). Stopped when dropped.

use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ServerConfig;
use rustls_pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_rustls::TlsAcceptor;

use crate::{pki::CertificateAuthority, HarnessError};

/// GitHub's documentation link in error bodies.
const DOCS: &str = "https://docs.github.com/rest";
/// How long an authorization code may be redeemed.
const CODE_LIFETIME: Duration = Duration::from_secs(600);
/// The most entries per page.
const MAX_PER_PAGE: usize = 100;
/// GitHub's default page size.
const DEFAULT_PER_PAGE: usize = 30;
/// The largest request body read.
const MAX_BODY: usize = 64 * 1024;

/// An OAuth App.
struct App {
    secret: String,
    callback: String,
}

/// A user.
struct User {
    id: u64,
    password: String,
}

/// A team of an organization.
struct Team {
    id: u64,
    name: String,
    slug: String,
    parent: Option<String>,
    members: BTreeSet<String>,
}

/// A code waiting to be redeemed.
struct Code {
    client_id: String,
    redirect_uri: String,
    login: String,
    issued: Instant,
}

#[derive(Default)]
struct State {
    apps: BTreeMap<String, App>,
    users: BTreeMap<String, User>,
    /// Organization login → (id, members).
    orgs: BTreeMap<String, (u64, BTreeSet<String>)>,
    /// (organization, slug) → team.
    teams: BTreeMap<(String, String), Team>,
    codes: BTreeMap<String, Code>,
    /// Access token → login.
    tokens: BTreeMap<String, String>,
    rate_limit_remaining: u32,
    requests: Vec<String>,
    serial: u64,
}

/// The running server. See the module documentation.
pub struct GitHub {
    state: Arc<Mutex<State>>,
    ca: CertificateAuthority,
    port: u16,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for GitHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHub")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for GitHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The rate limit of a fresh server (GitHub's for an authenticated user).
const RATE_LIMIT: u32 = 5000;

impl GitHub {
    /// Starts the server on a random loopback port with a certificate of its own CA.
    pub async fn start() -> Result<GitHub, HarnessError> {
        crate::install_crypto_provider();
        let ca = CertificateAuthority::new("github-stand-in-ca")?;
        let serving = ca.issue_serving("github", &["127.0.0.1", "localhost"])?;
        let tls_error =
            |e: &dyn std::fmt::Display| HarnessError::Pki(format!("the GitHub stand-in's TLS: {e}"));
        let certificate =
            CertificateDer::from_pem_slice(serving.cert_pem.as_bytes()).map_err(|e| tls_error(&e))?;
        let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).map_err(|e| tls_error(&e))?;
        let mut tls = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![certificate], key)
            .map_err(|e| tls_error(&e))?;
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| HarnessError::io("binding the GitHub stand-in's listener", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io("reading the GitHub stand-in's port", e))?
            .port();
        let state = Arc::new(Mutex::new(State {
            rate_limit_remaining: RATE_LIMIT,
            ..State::default()
        }));
        let task = tokio::spawn(serve(listener, acceptor, state.clone(), port));
        Ok(GitHub {
            state,
            ca,
            port,
            task,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `127.0.0.1:<port>`: a GitHubIdentityProvider's `githubAPI.host`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The CA of its serving certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// Registers an OAuth App whose authorization callback URL is `callback` (redirect URIs must
    /// start with it, as GitHub requires).
    pub fn add_app(&self, client_id: &str, client_secret: &str, callback: &str) {
        self.state().apps.insert(
            client_id.into(),
            App {
                secret: client_secret.into(),
                callback: callback.into(),
            },
        );
    }

    /// Adds the user `login` with the numeric `id`, signing in with `password`.
    pub fn add_user(&self, login: &str, id: u64, password: &str) {
        self.state().users.insert(
            login.into(),
            User {
                id,
                password: password.into(),
            },
        );
    }

    /// Adds the organization `login`.
    pub fn add_org(&self, login: &str, id: u64) {
        self.state()
            .orgs
            .entry(login.into())
            .or_insert((id, BTreeSet::new()));
    }

    /// Makes `user` a member of `org`.
    pub fn add_org_member(&self, org: &str, user: &str) {
        if let Some((_, members)) = self.state().orgs.get_mut(org) {
            members.insert(user.into());
        }
    }

    /// Ends `user`'s membership of `org`.
    pub fn remove_org_member(&self, org: &str, user: &str) {
        if let Some((_, members)) = self.state().orgs.get_mut(org) {
            members.remove(user);
        }
    }

    /// Adds the team `name` (`slug`) to `org`, a child of the team `parent` (a slug) if given.
    pub fn add_team(&self, org: &str, id: u64, name: &str, slug: &str, parent: Option<&str>) {
        self.state().teams.insert(
            (org.into(), slug.into()),
            Team {
                id,
                name: name.into(),
                slug: slug.into(),
                parent: parent.map(str::to_string),
                members: BTreeSet::new(),
            },
        );
    }

    /// Makes `user` a member of the team `slug` of `org`.
    pub fn add_team_member(&self, org: &str, slug: &str, user: &str) {
        if let Some(team) = self.state().teams.get_mut(&(org.to_string(), slug.to_string())) {
            team.members.insert(user.into());
        }
    }

    /// Ends `user`'s membership of the team `slug` of `org`.
    pub fn remove_team_member(&self, org: &str, slug: &str, user: &str) {
        if let Some(team) = self.state().teams.get_mut(&(org.to_string(), slug.to_string())) {
            team.members.remove(user);
        }
    }

    /// Revokes every access token of `user`.
    pub fn revoke_tokens(&self, user: &str) {
        self.state().tokens.retain(|_, login| login != user);
    }

    /// Sets how many REST API requests are left (0: every one is refused as rate-limited).
    pub fn set_rate_limit_remaining(&self, remaining: u32) {
        self.state().rate_limit_remaining = remaining;
    }

    /// `METHOD path?query` of every request served, in order (tokens are never in them).
    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
    }
}

/// Accepts connections until the task is aborted.
async fn serve(listener: TcpListener, acceptor: TlsAcceptor, state: Arc<Mutex<State>>, port: u16) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (acceptor, state) = (acceptor.clone(), state.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(request, &state, port).await) }
            });
            let _ended = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// A response with `status`, `content_type` and `body`.
fn respond(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON response.
fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    respond(status, "application/json; charset=utf-8", body.to_string())
}

/// An HTML page.
fn page(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    respond(status, "text/html; charset=utf-8", body)
}

/// HTML-escapes `text`.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// Answers one request; never panics.
async fn handle(request: Request<Incoming>, state: &Mutex<State>, port: u16) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let lock = || state.lock().unwrap_or_else(PoisonError::into_inner);
    lock().requests.push(if query.is_empty() {
        format!("{method} {path}")
    } else {
        format!("{method} {path}?{query}")
    });
    let accept_json = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.contains("json"));
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &json!({"message": "Request body too large", "documentation_url": DOCS}),
            )
        }
    };
    let form: BTreeMap<String, String> = if content_type.contains("json") {
        serde_json::from_slice::<BTreeMap<String, Value>>(&body)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, value)| value.as_str().map(|value| (name, value.to_string())))
            .collect()
    } else {
        form_urlencoded::parse(&body).into_owned().collect()
    };
    let params: BTreeMap<String, String> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    match (&method, path.as_str()) {
        (&Method::GET, "/login/oauth/authorize") => authorize_page(&lock(), &params, None),
        (&Method::POST, "/session") => sign_in(&mut lock(), &form),
        (&Method::POST, "/login/oauth/access_token") => access_token(&mut lock(), &form, accept_json),
        (_, api) if api.starts_with("/api/v3") => {
            rest(&mut lock(), &method, api, &params, authorization.as_deref(), port)
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            &json!({"message": "Not Found", "documentation_url": DOCS}),
        ),
    }
}

/// The sign-in page of an authorization request, or an error page when the app or its redirect
/// URI is unknown (GitHub never redirects to an unregistered URI).
fn authorize_page(
    state: &State,
    params: &BTreeMap<String, String>,
    alert: Option<&str>,
) -> Response<Full<Bytes>> {
    let get = |name: &str| params.get(name).cloned().unwrap_or_default();
    let (client_id, redirect_uri) = (get("client_id"), get("redirect_uri"));
    let Some(app) = state.apps.get(&client_id) else {
        return page(
            StatusCode::NOT_FOUND,
            "<!DOCTYPE html><html><body><h1>404</h1><p>The OAuth application was not found.</p></body></html>".into(),
        );
    };
    if !redirect_uri.is_empty() && !redirect_uri.starts_with(&app.callback) {
        return page(
            StatusCode::BAD_REQUEST,
            "<!DOCTYPE html><html><body><h1>Be careful!</h1><p>The redirect_uri is not associated with this application.</p></body></html>".into(),
        );
    }
    let hidden: String = ["client_id", "redirect_uri", "state", "scope"]
        .iter()
        .map(|name| {
            format!(
                r#"<input type="hidden" name="{name}" value="{}">"#,
                escape(&get(name))
            )
        })
        .collect();
    let alert = alert
        .map(|text| format!(r#"<div class="flash-error" role="alert">{}</div>"#, escape(text)))
        .unwrap_or_default();
    page(
        StatusCode::OK,
        format!(
            r#"<!DOCTYPE html><html><head><title>Sign in to GitHub</title></head><body>
<h1>Sign in to GitHub</h1><p>to continue to the application</p>{alert}
<form action="/session" method="post">{hidden}
<label for="login_field">Username or email address</label><input type="text" name="login" id="login_field" autocomplete="username">
<label for="password">Password</label><input type="password" name="password" id="password" autocomplete="current-password">
<input type="submit" name="commit" value="Sign in">
</form></body></html>"#
        ),
    )
}

/// The sign-in form's POST: a code for the app, sent to its redirect URI, or the page again.
fn sign_in(state: &mut State, form: &BTreeMap<String, String>) -> Response<Full<Bytes>> {
    let get = |name: &str| form.get(name).cloned().unwrap_or_default();
    let (login, password) = (get("login"), get("password"));
    let authentic = state
        .users
        .get(&login)
        .is_some_and(|user| user.password == password);
    if !authentic {
        return authorize_page(state, form, Some("Incorrect username or password."));
    }
    let client_id = get("client_id");
    let Some(app) = state.apps.get(&client_id) else {
        return authorize_page(state, form, None);
    };
    let redirect_uri = match get("redirect_uri") {
        uri if uri.is_empty() => app.callback.clone(),
        uri if uri.starts_with(&app.callback) => uri,
        _ => return authorize_page(state, form, None),
    };
    state.serial += 1;
    let code = format!("{:020x}{:x}", state.serial, random_u64());
    state.codes.insert(
        code.clone(),
        Code {
            client_id,
            redirect_uri: redirect_uri.clone(),
            login,
            issued: Instant::now(),
        },
    );
    let separator = if redirect_uri.contains('?') { '&' } else { '?' };
    let location = format!(
        "{redirect_uri}{separator}{}",
        form_urlencoded::Serializer::new(String::new())
            .append_pair("code", &code)
            .append_pair("state", &get("state"))
            .finish()
    );
    let mut response = respond(StatusCode::FOUND, "text/html; charset=utf-8", "");
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// A pseudo-random number (codes and tokens only need to be unguessable to other tests).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish()
}

/// `POST /login/oauth/access_token`: a token for a code, or GitHub's error (HTTP 200 with
/// `error`, as GitHub answers).
fn access_token(
    state: &mut State,
    form: &BTreeMap<String, String>,
    accept_json: bool,
) -> Response<Full<Bytes>> {
    let get = |name: &str| form.get(name).cloned().unwrap_or_default();
    let error = |code: &str, description: &str| {
        let uri = "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/";
        if accept_json {
            json_response(
                StatusCode::OK,
                &json!({"error": code, "error_description": description, "error_uri": uri}),
            )
        } else {
            respond(
                StatusCode::OK,
                "application/x-www-form-urlencoded; charset=utf-8",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("error", code)
                    .append_pair("error_description", description)
                    .append_pair("error_uri", uri)
                    .finish(),
            )
        }
    };
    let client_id = get("client_id");
    let authentic = state
        .apps
        .get(&client_id)
        .is_some_and(|app| app.secret == get("client_secret"));
    if !authentic {
        return error(
            "incorrect_client_credentials",
            "The client_id and/or client_secret passed are incorrect.",
        );
    }
    // One-time: a code is gone once presented.
    let Some(code) = state.codes.remove(&get("code")) else {
        return error(
            "bad_verification_code",
            "The code passed is incorrect or expired.",
        );
    };
    if code.client_id != client_id || code.issued.elapsed() > CODE_LIFETIME {
        return error(
            "bad_verification_code",
            "The code passed is incorrect or expired.",
        );
    }
    let redirect_uri = get("redirect_uri");
    if !redirect_uri.is_empty() && redirect_uri != code.redirect_uri {
        return error(
            "redirect_uri_mismatch",
            "The redirect_uri MUST match the registered callback URL for this application.",
        );
    }
    state.serial += 1;
    let token = format!("gho_{:016x}{:016x}", state.serial, random_u64());
    state.tokens.insert(token.clone(), code.login);
    if accept_json {
        json_response(
            StatusCode::OK,
            &json!({"access_token": token, "token_type": "bearer", "scope": "read:org,read:user"}),
        )
    } else {
        respond(
            StatusCode::OK,
            "application/x-www-form-urlencoded; charset=utf-8",
            form_urlencoded::Serializer::new(String::new())
                .append_pair("access_token", &token)
                .append_pair("scope", "read:org,read:user")
                .append_pair("token_type", "bearer")
                .finish(),
        )
    }
}

/// The REST API under `/api/v3`.
fn rest(
    state: &mut State,
    method: &Method,
    path: &str,
    params: &BTreeMap<String, String>,
    authorization: Option<&str>,
    port: u16,
) -> Response<Full<Bytes>> {
    let path = path.trim_start_matches("/api/v3");
    let user = authorization
        .and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("token "))
        })
        .and_then(|token| state.tokens.get(token.trim()))
        .cloned();
    let mut response = match (method, path) {
        (&Method::GET, "" | "/") => json_response(
            StatusCode::OK,
            &json!({"current_user_url": format!("https://127.0.0.1:{port}/api/v3/user")}),
        ),
        (&Method::GET, "/rate_limit") => {
            let core = json!({"limit": RATE_LIMIT, "remaining": state.rate_limit_remaining, "used": RATE_LIMIT - state.rate_limit_remaining.min(RATE_LIMIT), "reset": reset(), "resource": "core"});
            json_response(
                StatusCode::OK,
                &json!({"resources": {"core": core}, "rate": core}),
            )
        }
        (&Method::GET, "/user" | "/user/orgs" | "/user/teams") => {
            let Some(login) = user.clone() else {
                return rate_headers(
                    json_response(
                        StatusCode::UNAUTHORIZED,
                        &json!({"message": "Bad credentials", "documentation_url": DOCS, "status": "401"}),
                    ),
                    state,
                );
            };
            if state.rate_limit_remaining == 0 {
                let id = state.users.get(&login).map_or(0, |user| user.id);
                return rate_headers(
                    json_response(
                        StatusCode::FORBIDDEN,
                        &json!({"message": format!("API rate limit exceeded for user ID {id}."),
                                "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}),
                    ),
                    state,
                );
            }
            state.rate_limit_remaining -= 1;
            match path {
                "/user" => {
                    let id = state.users.get(&login).map_or(0, |user| user.id);
                    json_response(
                        StatusCode::OK,
                        &json!({"login": login, "id": id, "node_id": format!("U_{id}"), "type": "User",
                                "site_admin": false, "name": login,
                                "html_url": format!("https://127.0.0.1:{port}/{login}")}),
                    )
                }
                "/user/orgs" => {
                    let orgs: Vec<Value> = state
                        .orgs
                        .iter()
                        .filter(|(_, (_, members))| members.contains(&login))
                        .map(|(org, (id, _))| {
                            json!({"login": org, "id": id, "node_id": format!("O_{id}"),
                            "url": format!("https://127.0.0.1:{port}/api/v3/orgs/{org}"), "description": ""})
                        })
                        .collect();
                    paginated(orgs, params, path, port)
                }
                _ => {
                    let teams: Vec<Value> = state
                        .teams
                        .iter()
                        .filter(|(_, team)| team.members.contains(&login))
                        .map(|((org, _), team)| {
                            let org_id = state.orgs.get(org).map_or(0, |(id, _)| *id);
                            let parent = team
                                .parent
                                .as_ref()
                                .and_then(|slug| state.teams.get(&(org.clone(), slug.clone())))
                                .map(|parent| json!({"id": parent.id, "node_id": format!("T_{}", parent.id),
                                    "name": parent.name, "slug": parent.slug}));
                            json!({"id": team.id, "node_id": format!("T_{}", team.id), "name": team.name,
                                   "slug": team.slug, "description": "", "privacy": "closed",
                                   "permission": "pull", "parent": parent,
                                   "organization": {"login": org, "id": org_id, "node_id": format!("O_{org_id}")}})
                        })
                        .collect();
                    paginated(teams, params, path, port)
                }
            }
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            &json!({"message": "Not Found", "documentation_url": DOCS}),
        ),
    };
    response.headers_mut().insert(
        "x-github-api-version-selected",
        HeaderValue::from_static("2022-11-28"),
    );
    rate_headers(response, state)
}

/// When the rate limit resets: an hour from now (unix seconds).
fn reset() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| now.as_secs() + 3600)
}

/// Adds GitHub's rate-limit headers.
fn rate_headers(mut response: Response<Full<Bytes>>, state: &State) -> Response<Full<Bytes>> {
    let headers = response.headers_mut();
    let remaining = state.rate_limit_remaining;
    for (name, value) in [
        ("x-ratelimit-limit", RATE_LIMIT.to_string()),
        ("x-ratelimit-remaining", remaining.to_string()),
        (
            "x-ratelimit-used",
            (RATE_LIMIT - remaining.min(RATE_LIMIT)).to_string(),
        ),
        ("x-ratelimit-reset", reset().to_string()),
        ("x-ratelimit-resource", "core".to_string()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

/// One page of `items` as `per_page` and `page` ask, with the `Link` header.
fn paginated(
    items: Vec<Value>,
    params: &BTreeMap<String, String>,
    path: &str,
    port: u16,
) -> Response<Full<Bytes>> {
    let per_page = params
        .get("per_page")
        .and_then(|value| value.parse::<usize>().ok())
        .filter(|&size| size > 0)
        .unwrap_or(DEFAULT_PER_PAGE)
        .min(MAX_PER_PAGE);
    let page = params
        .get("page")
        .and_then(|value| value.parse::<usize>().ok())
        .filter(|&page| page > 0)
        .unwrap_or(1);
    let last = items.len().div_ceil(per_page).max(1);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut response = json_response(StatusCode::OK, &Value::Array(slice));
    let url =
        |page: usize| format!("<https://127.0.0.1:{port}/api/v3{path}?per_page={per_page}&page={page}>");
    let mut links = Vec::new();
    if page < last {
        links.push(format!("{}; rel=\"next\"", url(page + 1)));
        links.push(format!("{}; rel=\"last\"", url(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"first\"", url(1)));
        links.push(format!("{}; rel=\"prev\"", url(page - 1)));
    }
    if !links.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&links.join(", ")) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use selkie_oidc::https::{HttpsClient, TlsOptions};

    use super::*;

    async fn get(https: &HttpsClient, url: &str, token: Option<&str>) -> selkie_oidc::https::Response {
        let mut headers = vec![(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.github+json"),
        )];
        if let Some(token) = token {
            headers.push((
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            ));
        }
        https
            .send(
                Method::GET,
                url,
                &headers,
                Bytes::new(),
                1 << 20,
                Some(Duration::from_secs(10)),
            )
            .await
            .unwrap()
    }

    /// A form POST to `url`, accepting JSON.
    async fn post(https: &HttpsClient, url: &str, body: &str) -> selkie_oidc::https::Response {
        https
            .send(
                Method::POST,
                url,
                &[
                    (header::ACCEPT, HeaderValue::from_static("application/json")),
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/x-www-form-urlencoded"),
                    ),
                ],
                Bytes::from(body.to_string()),
                1 << 16,
                Some(Duration::from_secs(10)),
            )
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_web_flow_the_rest_api_pagination_and_rate_limits_behave_as_documented() {
        let github = GitHub::start().await.unwrap();
        let base = format!("https://{}", github.host());
        github.add_app("app", "secret", "https://rp.example/callback");
        github.add_user("pinny", 7, "pw");
        github.add_org("Seals", 1);
        github.add_org_member("Seals", "pinny");
        for n in 0..150 {
            github.add_team(
                "Seals",
                100 + n,
                &format!("Team {n}"),
                &format!("team-{n:03}"),
                None,
            );
            github.add_team_member("Seals", &format!("team-{n:03}"), "pinny");
        }
        let https = HttpsClient::new(&TlsOptions {
            ca_pem: Some(github.ca_pem().into_bytes()),
            ..TlsOptions::default()
        })
        .unwrap();

        // Unknown apps and foreign redirect URIs get an error page, not a redirect.
        let unknown = get(
            &https,
            &format!("{base}/login/oauth/authorize?client_id=nope"),
            None,
        )
        .await;
        assert_eq!(unknown.status, 404);
        let foreign = get(
            &https,
            &format!("{base}/login/oauth/authorize?client_id=app&redirect_uri=https%3A%2F%2Fevil.example%2F"),
            None,
        )
        .await;
        assert_eq!(foreign.status, 400);
        let form = get(
            &https,
            &format!("{base}/login/oauth/authorize?client_id=app&state=s1"),
            None,
        )
        .await;
        assert!(String::from_utf8_lossy(&form.body).contains("id=\"login_field\""));

        // Sign in: a wrong password shows the form again; the right one redirects with a code.
        let session = format!("{base}/session");
        let wrong = post(&https, &session, "client_id=app&state=s1&login=pinny&password=no").await;
        assert!(String::from_utf8_lossy(&wrong.body).contains("Incorrect username or password."));
        let signed_in = post(&https, &session, "client_id=app&state=s1&login=pinny&password=pw").await;
        assert_eq!(signed_in.status, 302);
        let location = signed_in.headers[header::LOCATION].to_str().unwrap().to_string();
        assert!(
            location.starts_with("https://rp.example/callback?code="),
            "{location}"
        );
        assert!(location.ends_with("&state=s1"), "{location}");
        let code = location
            .split("code=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap()
            .to_string();

        // The code: once, with the right secret.
        let token_url = format!("{base}/login/oauth/access_token");
        let redeem = |secret: &str, code: &str| format!("client_id=app&client_secret={secret}&code={code}");
        let bad_secret: Value =
            serde_json::from_slice(&post(&https, &token_url, &redeem("wrong", &code)).await.body).unwrap();
        assert_eq!(bad_secret["error"], "incorrect_client_credentials");
        let token: Value =
            serde_json::from_slice(&post(&https, &token_url, &redeem("secret", &code)).await.body).unwrap();
        let token = token["access_token"].as_str().unwrap().to_string();
        assert!(token.starts_with("gho_"));
        let again: Value =
            serde_json::from_slice(&post(&https, &token_url, &redeem("secret", &code)).await.body).unwrap();
        assert_eq!(again["error"], "bad_verification_code");

        // The REST API.
        let user = get(&https, &format!("{base}/api/v3/user"), Some(&token)).await;
        assert_eq!(user.status, 200);
        assert_eq!(user.headers["x-ratelimit-remaining"], "4999");
        let user: Value = serde_json::from_slice(&user.body).unwrap();
        assert_eq!(
            (user["login"].as_str(), user["id"].as_u64()),
            (Some("pinny"), Some(7))
        );
        let unauthenticated = get(&https, &format!("{base}/api/v3/user"), Some("gho_nope")).await;
        assert_eq!(unauthenticated.status, 401);
        let first = get(
            &https,
            &format!("{base}/api/v3/user/teams?per_page=100"),
            Some(&token),
        )
        .await;
        let link = first.headers[header::LINK].to_str().unwrap().to_string();
        assert!(link.contains("page=2>; rel=\"next\""), "{link}");
        assert_eq!(
            serde_json::from_slice::<Vec<Value>>(&first.body).unwrap().len(),
            100
        );
        let second = get(
            &https,
            &format!("{base}/api/v3/user/teams?per_page=100&page=2"),
            Some(&token),
        )
        .await;
        assert_eq!(
            serde_json::from_slice::<Vec<Value>>(&second.body).unwrap().len(),
            50
        );
        assert!(!second.headers[header::LINK]
            .to_str()
            .unwrap()
            .contains("rel=\"next\""));

        // Rate limits and revoked tokens.
        github.set_rate_limit_remaining(0);
        let limited = get(&https, &format!("{base}/api/v3/user"), Some(&token)).await;
        assert_eq!(limited.status, 403);
        assert_eq!(limited.headers["x-ratelimit-remaining"], "0");
        assert!(String::from_utf8_lossy(&limited.body).contains("API rate limit exceeded for user ID 7."));
        github.set_rate_limit_remaining(10);
        github.revoke_tokens("pinny");
        assert_eq!(
            get(&https, &format!("{base}/api/v3/user"), Some(&token))
                .await
                .status,
            401
        );
        assert!(github.requests().iter().all(|request| !request.contains(&token)));
    }
}
