//! GitHub (github.com or a GitHub Enterprise Server) as an upstream identity provider, as
//! Pinniped's GitHubIdentityProvider uses it: the OAuth web flow of an OAuth App or GitHub App
//! (scopes `read:user read:org`; GitHub has no PKCE and no ID tokens), then the REST API with the
//! user's access token — `/user`, `/user/orgs` and `/user/teams`, 100 per page, following the
//! `Link` header — at every login and every refresh.
//!
//! Hosts: `github.com` (or `api.github.com`) means the API at `https://api.github.com` and OAuth
//! at `https://github.com/login/oauth`; any other host is a GitHub Enterprise Server with the
//! API at `https://<host>/api/v3` and OAuth at `https://<host>/login/oauth`.
//!
//! Every call is bounded by [`TIMEOUT`]; errors never contain a token or secret. GitHub's own
//! failures (unreachable, 5xx, rate limits) are [`GitHubError::Unavailable`]: the user may try
//! again later; a refused token or code is [`GitHubError::Refused`]; the organization policy's
//! refusal is [`GitHubError::Denied`].

use std::{collections::BTreeSet, time::Duration};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use selkie_api::supervisor_idp::{GitHubGroupNameAttribute, GitHubUsernameAttribute};
use selkie_oidc::https::{HttpError, HttpsClient};
use serde::Deserialize;

use crate::idp::subject;

/// How long one call to GitHub may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);
/// Entries asked for per page (GitHub's maximum).
const PAGE_SIZE: u32 = 100;
/// The most pages read of one list (10,000 organizations or teams).
const MAX_PAGES: usize = 100;
/// The largest answer read.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// The scopes asked for.
pub(crate) const SCOPES: &str = "read:user read:org";

/// Why GitHub could not tell who a user is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GitHubError {
    /// GitHub could not be reached, failed, or limited the rate: try again later.
    #[error("GitHub is unavailable: {0}")]
    Unavailable(String),
    /// GitHub refused the code or token, or answered something unusable.
    #[error("{0}")]
    Refused(String),
    /// The user is in none of the allowed organizations.
    #[error("user is not allowed to log in due to organization membership policy")]
    Denied,
}

/// Where a GitHub is, from a GitHubIdentityProvider's `spec.githubAPI.host` (`host[:port]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// The REST API's base URL.
    pub api: String,
    /// The OAuth endpoints' base URL (`…/login/oauth`).
    pub oauth: String,
    /// `host:port` of the API, as Pinniped's conditions name it.
    pub address: String,
}

impl Endpoints {
    /// The endpoints of `host` (`github.com`, `api.github.com`, or a GitHub Enterprise Server's
    /// `host[:port]`, IPv6 in brackets); the error says why `host` is not one, in Pinniped's
    /// words after `spec.githubAPI.host (…) is not valid: `.
    pub fn of(host: &str) -> Result<Self, String> {
        if host.is_empty() {
            return Err("must not be empty".into());
        }
        let uri: http::uri::Authority = host
            .parse()
            .map_err(|_| format!("invalid host {host:?}: not a host or host:port"))?;
        if uri.as_str().contains('@') {
            return Err(format!(
                "invalid host {host:?}: must not contain user information"
            ));
        }
        let name = uri.host().to_ascii_lowercase();
        if uri.as_str().len() != uri.host().len() && uri.port_u16().is_none_or(|port| port == 0) {
            return Err(format!(
                "invalid host {host:?}: the port is not a number from 1 to 65535"
            ));
        }
        let port = uri.port_u16().unwrap_or(443);
        let with_port = |name: &str| {
            if port == 443 {
                name.to_string()
            } else {
                format!("{name}:{port}")
            }
        };
        if name == "github.com" || name == "api.github.com" {
            return Ok(Self {
                api: format!("https://{}", with_port("api.github.com")),
                oauth: format!("https://{}/login/oauth", with_port("github.com")),
                address: format!("api.github.com:{port}"),
            });
        }
        Ok(Self {
            api: format!("https://{}/api/v3", with_port(&name)),
            oauth: format!("https://{}/login/oauth", with_port(&name)),
            address: format!("{name}:{port}"),
        })
    }
}

/// Checks that the API at `endpoints` answers over TLS with `https` (`GET <api>/rate_limit`, any
/// status): Pinniped's connection probe, made before any credentials are used. The error is the
/// reason.
pub(crate) async fn probe(endpoints: &Endpoints, https: &HttpsClient) -> Result<(), String> {
    https
        .send(
            Method::GET,
            &format!("{}/rate_limit", endpoints.api),
            &api_headers(None),
            Bytes::new(),
            64 * 1024,
            Some(TIMEOUT),
        )
        .await
        .map(|_| ())
        .map_err(|error| error.to_string())
}

/// A GitHubIdentityProvider ready to use.
#[derive(Clone)]
pub struct GitHub {
    /// Where it is.
    pub endpoints: Endpoints,
    /// The OAuth App's or GitHub App's client ID.
    pub client_id: String,
    client_secret: String,
    /// What the username is made of.
    pub username: GitHubUsernameAttribute,
    /// What group names are made of.
    pub groups: GitHubGroupNameAttribute,
    /// The allowed organizations, lower-case; empty: every GitHub user.
    pub allowed_organizations: BTreeSet<String>,
    transport: Transport,
}

/// Where GitHub's answers come from.
#[derive(Clone)]
#[cfg_attr(
    feature = "fuzzing",
    expect(
        clippy::large_enum_variant,
        reason = "the small variant exists in fuzz targets only; the Supervisor's GitHub has one variant"
    )
)]
enum Transport {
    /// GitHub itself, over HTTPS.
    Https(HttpsClient),
    /// Answers given in advance (the fuzz targets': no request leaves the process).
    #[cfg(feature = "fuzzing")]
    Answers(std::sync::Arc<crate::fuzzing::GitHubAnswers>),
}

impl std::fmt::Debug for GitHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHub")
            .field("endpoints", &self.endpoints)
            .field("client_id", &self.client_id)
            .field("username", &self.username)
            .field("groups", &self.groups)
            .field("allowed_organizations", &self.allowed_organizations)
            .finish_non_exhaustive()
    }
}

/// Who a GitHub user is downstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitHubUser {
    /// The username (`login:id`, `login` or `id`).
    pub username: String,
    /// `org/team` for each team (and parent team) in an allowed organization, sorted.
    pub groups: Vec<String>,
    /// The downstream subject ([`subject::github`]).
    pub subject: String,
}

#[derive(Deserialize)]
struct User {
    login: Option<String>,
    id: Option<u64>,
}

#[derive(Deserialize)]
struct Organization {
    login: Option<String>,
}

#[derive(Deserialize)]
struct Team {
    name: Option<String>,
    slug: Option<String>,
    organization: Option<Organization>,
    parent: Option<ParentTeam>,
}

#[derive(Deserialize)]
struct ParentTeam {
    name: Option<String>,
    slug: Option<String>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

impl GitHub {
    /// A GitHub at `endpoints` for the app `client_id`/`client_secret`, reached with `https`.
    pub fn new(
        endpoints: Endpoints,
        client_id: String,
        client_secret: String,
        username: GitHubUsernameAttribute,
        groups: GitHubGroupNameAttribute,
        allowed_organizations: &[String],
        https: HttpsClient,
    ) -> Self {
        Self {
            endpoints,
            client_id,
            client_secret,
            username,
            groups,
            allowed_organizations: allowed_organizations
                .iter()
                .map(|org| org.to_lowercase())
                .collect(),
            transport: Transport::Https(https),
        }
    }

    /// The same GitHub, answered by `answers` instead of the network (fuzz targets only).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn answered_by(mut self, answers: std::sync::Arc<crate::fuzzing::GitHubAnswers>) -> Self {
        self.transport = Transport::Answers(answers);
        self
    }

    /// One request to GitHub, bounded by [`TIMEOUT`], reading at most `limit` bytes of answer.
    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        limit: usize,
    ) -> Result<selkie_oidc::https::Response, HttpError> {
        match &self.transport {
            Transport::Https(https) => https.send(method, url, headers, body, limit, Some(TIMEOUT)).await,
            #[cfg(feature = "fuzzing")]
            Transport::Answers(answers) => answers.answer(method, url, headers, limit),
        }
    }

    /// Whether `other` was made from the same settings (the secret included).
    pub fn same_settings(&self, other: &Self) -> bool {
        self.endpoints == other.endpoints
            && self.client_id == other.client_id
            && self.client_secret == other.client_secret
            && self.username == other.username
            && self.groups == other.groups
            && self.allowed_organizations == other.allowed_organizations
    }

    /// The URL the browser is sent to: GitHub's authorization page for this app, coming back to
    /// `redirect_uri` with `state`.
    pub fn authorize_url(&self, state: &str, redirect_uri: &str) -> String {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &self.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("response_type", "code")
            .append_pair("scope", SCOPES)
            .append_pair("state", state)
            .finish();
        format!("{}/authorize?{query}", self.endpoints.oauth)
    }

    /// Redeems an authorization code (sent back to `redirect_uri`) for the user's access token.
    pub async fn exchange_code(&self, code: &str, redirect_uri: &str) -> Result<String, GitHubError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &self.client_id)
            .append_pair("client_secret", &self.client_secret)
            .append_pair("code", code)
            .append_pair("redirect_uri", redirect_uri)
            .finish();
        let response = self
            .send(
                Method::POST,
                &format!("{}/access_token", self.endpoints.oauth),
                &[
                    selkie_oidc::https::accept_json(),
                    (
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/x-www-form-urlencoded"),
                    ),
                ],
                Bytes::from(body),
                64 * 1024,
            )
            .await
            .map_err(unavailable)?;
        if response.status.is_server_error() || response.status == http::StatusCode::TOO_MANY_REQUESTS {
            return Err(GitHubError::Unavailable(format!(
                "the token endpoint answered {}",
                response.status
            )));
        }
        let answer: TokenAnswer = serde_json::from_slice(&response.body).map_err(|_| {
            GitHubError::Refused(format!(
                "the token endpoint answered {} without a token",
                response.status
            ))
        })?;
        match (answer.access_token, answer.error) {
            (Some(token), None) if !token.is_empty() => Ok(token),
            (_, Some(error)) => Err(GitHubError::Refused(format!(
                "the token endpoint refused the code: {error}{}",
                answer
                    .error_description
                    .map(|description| format!(" ({})", description.chars().take(200).collect::<String>()))
                    .unwrap_or_default()
            ))),
            _ => Err(GitHubError::Refused(
                "the token endpoint answered no access token".into(),
            )),
        }
    }

    /// Who the holder of `token` is, as the FederationDomain's identity provider `display_name`
    /// sees them: username, groups (teams of allowed organizations) and subject. Fails with
    /// [`GitHubError::Denied`] when allowed organizations are configured and the user is in
    /// none of them.
    pub async fn user(&self, token: &str, display_name: &str) -> Result<GitHubUser, GitHubError> {
        let user: User =
            serde_json::from_slice(&self.get(token, &format!("{}/user", self.endpoints.api)).await?)
                .map_err(|_| GitHubError::Refused("error fetching authenticated user: not a user".into()))?;
        let (Some(login), Some(id)) = (user.login.filter(|login| !login.is_empty()), user.id) else {
            return Err(GitHubError::Refused(
                "error fetching authenticated user: the \"id\" or \"login\" attribute is missing".into(),
            ));
        };
        let id = id.to_string();
        let username = match self.username {
            GitHubUsernameAttribute::LoginAndID => format!("{login}:{id}"),
            GitHubUsernameAttribute::Login => login.clone(),
            GitHubUsernameAttribute::ID => id.clone(),
        };
        let organizations: Vec<Organization> = self.list(token, "user/orgs").await?;
        let mut member_of = BTreeSet::new();
        for organization in organizations {
            let Some(login) = organization.login.filter(|login| !login.is_empty()) else {
                return Err(GitHubError::Refused(
                    "error fetching organizations for authenticated user: one or more organizations is missing the \"login\" attribute".into(),
                ));
            };
            member_of.insert(login.to_lowercase());
        }
        if !self.allowed_organizations.is_empty() && self.allowed_organizations.is_disjoint(&member_of) {
            return Err(GitHubError::Denied);
        }
        let teams: Vec<Team> = self.list(token, "user/teams").await?;
        let malformed = |what: &str| {
            GitHubError::Refused(format!(
                "error fetching team membership for authenticated user: {what}"
            ))
        };
        let mut found: Vec<(String, String, String)> = Vec::new();
        for team in teams {
            let organization = team
                .organization
                .and_then(|organization| organization.login)
                .filter(|login| !login.is_empty())
                .ok_or_else(|| malformed("missing the organization's \"login\" attribute for a team"))?;
            if !self.allowed_organizations.is_empty()
                && !self.allowed_organizations.contains(&organization.to_lowercase())
            {
                continue;
            }
            let named = |name: Option<String>, slug: Option<String>| match (name, slug) {
                (Some(name), Some(slug)) if !name.is_empty() && !slug.is_empty() => Ok((name, slug)),
                _ => Err(malformed(
                    "the \"name\" or \"slug\" attribute is missing for a team",
                )),
            };
            let (name, slug) = named(team.name, team.slug)?;
            found.push((organization.clone(), slug, name));
            if let Some(parent) = team.parent {
                let (name, slug) = named(parent.name, parent.slug)?;
                found.push((organization, slug, name));
            }
        }
        Ok(GitHubUser {
            username,
            groups: group_names(found, self.groups),
            subject: subject::github(&self.endpoints.api, display_name, &login, &id),
        })
    }

    /// Every entry of the paginated list at `<api>/<path>`, following `Link: <…>; rel="next"`
    /// (only to URLs under the API's base: the token goes nowhere else).
    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        token: &str,
        path: &str,
    ) -> Result<Vec<T>, GitHubError> {
        let mut url = format!("{}/{path}?per_page={PAGE_SIZE}", self.endpoints.api);
        let mut all = Vec::new();
        for _ in 0..MAX_PAGES {
            let response = self.request(token, &url).await?;
            let page: Vec<T> = serde_json::from_slice(&response.body).map_err(|_| {
                GitHubError::Refused(format!("error fetching {path}: the answer is not a list"))
            })?;
            all.extend(page);
            match next_link(&response.headers) {
                Some(next) if next.starts_with(&format!("{}/", self.endpoints.api)) => url = next,
                Some(_) => {
                    return Err(GitHubError::Refused(format!(
                        "error fetching {path}: the next page is not on the API's host"
                    )))
                }
                None => return Ok(all),
            }
        }
        Err(GitHubError::Refused(format!(
            "error fetching {path}: more than {MAX_PAGES} pages"
        )))
    }

    /// The body of a successful `GET url` with `token`.
    async fn get(&self, token: &str, url: &str) -> Result<Bytes, GitHubError> {
        Ok(self.request(token, url).await?.body)
    }

    /// `GET url` with `token`; any answer but 2xx is an error saying what GitHub said.
    async fn request(&self, token: &str, url: &str) -> Result<selkie_oidc::https::Response, GitHubError> {
        let response = self
            .send(
                Method::GET,
                url,
                &api_headers(Some(token)),
                Bytes::new(),
                MAX_BODY,
            )
            .await
            .map_err(unavailable)?;
        if response.status.is_success() {
            return Ok(response);
        }
        let message = serde_json::from_slice::<serde_json::Value>(&response.body)
            .ok()
            .and_then(|body| body.get("message").and_then(|m| m.as_str()).map(str::to_string))
            .unwrap_or_default();
        let message: String = message.chars().take(200).collect();
        let path = url
            .split('?')
            .next()
            .unwrap_or_default()
            .strip_prefix(&self.endpoints.api)
            .unwrap_or_default();
        let rate_limited = response.status == http::StatusCode::TOO_MANY_REQUESTS
            || (response.status == http::StatusCode::FORBIDDEN
                && (response
                    .headers
                    .get("x-ratelimit-remaining")
                    .is_some_and(|remaining| remaining == "0")
                    || message.to_ascii_lowercase().contains("rate limit")));
        if rate_limited {
            let reset = response
                .headers
                .get("x-ratelimit-reset")
                .and_then(|value| value.to_str().ok())
                .map(|reset| format!(" (the limit resets at unix time {reset})"))
                .unwrap_or_default();
            return Err(GitHubError::Unavailable(format!(
                "GET {path}: rate limit exceeded{reset}"
            )));
        }
        if response.status.is_server_error() {
            return Err(GitHubError::Unavailable(format!(
                "GET {path}: {} {message}",
                response.status
            )));
        }
        Err(GitHubError::Refused(format!(
            "GET {path}: {} {message}",
            response.status
        )))
    }
}

/// The headers of REST API calls (Pinniped's), with the bearer token when given.
/// The downstream group names of `teams` (`(organization, slug, name)`, parents included):
/// `<organization>/<name>` or `<organization>/<slug>` as `attribute` says, sorted by the name
/// itself and without duplicates (two teams can share a name, and names sort apart from slugs).
fn group_names(
    teams: impl IntoIterator<Item = (String, String, String)>,
    attribute: GitHubGroupNameAttribute,
) -> Vec<String> {
    teams
        .into_iter()
        .map(|(organization, slug, name)| match attribute {
            GitHubGroupNameAttribute::Name => format!("{organization}/{name}"),
            GitHubGroupNameAttribute::Slug => format!("{organization}/{slug}"),
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn api_headers(token: Option<&str>) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = vec![
        (
            http::header::ACCEPT,
            HeaderValue::from_static("application/vnd.github+json"),
        ),
        (
            HeaderName::from_static("x-github-api-version"),
            HeaderValue::from_static("2022-11-28"),
        ),
    ];
    if let Some(Ok(mut value)) = token.map(|token| HeaderValue::from_str(&format!("Bearer {token}"))) {
        value.set_sensitive(true);
        headers.push((http::header::AUTHORIZATION, value));
    }
    headers
}

/// A transport failure: GitHub is unavailable.
fn unavailable(error: HttpError) -> GitHubError {
    GitHubError::Unavailable(error.to_string())
}

/// The `rel="next"` URL of a `Link` header (RFC 8288), if any.
fn next_link(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|link| {
            let (target, params) = link.trim().split_once(';')?;
            let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
            params
                .split(';')
                .any(|param| {
                    let param = param.trim().replace(' ', "");
                    param == "rel=\"next\"" || param == "rel=next"
                })
                .then(|| target.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_pinnipeds() {
        let github = Endpoints::of("github.com").unwrap();
        assert_eq!(github.api, "https://api.github.com");
        assert_eq!(github.oauth, "https://github.com/login/oauth");
        assert_eq!(github.address, "api.github.com:443");
        assert_eq!(Endpoints::of("API.GitHub.com").unwrap(), github);
        let enterprise = Endpoints::of("ghe.example.com").unwrap();
        assert_eq!(enterprise.api, "https://ghe.example.com/api/v3");
        assert_eq!(enterprise.oauth, "https://ghe.example.com/login/oauth");
        let with_port = Endpoints::of("127.0.0.1:8443").unwrap();
        assert_eq!(with_port.api, "https://127.0.0.1:8443/api/v3");
        assert_eq!(with_port.address, "127.0.0.1:8443");
        assert_eq!(
            Endpoints::of("[::1]:9443").unwrap().oauth,
            "https://[::1]:9443/login/oauth"
        );
        assert_eq!(Endpoints::of("").unwrap_err(), "must not be empty");
        for bad in [
            "https://ghe.example.com",
            "ghe.example.com/path",
            "a b",
            "user@host",
            "host:99999",
        ] {
            assert!(Endpoints::of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_next_page_comes_from_the_link_header() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::LINK,
            HeaderValue::from_static(
                "<https://h/api/v3/user/teams?per_page=100&page=2>; rel=\"next\", <https://h/api/v3/user/teams?per_page=100&page=3>; rel=\"last\"",
            ),
        );
        assert_eq!(
            next_link(&headers).as_deref(),
            Some("https://h/api/v3/user/teams?per_page=100&page=2")
        );
        headers.insert(
            http::header::LINK,
            HeaderValue::from_static("<https://h/api/v3/user/teams?page=1>; rel=\"prev\""),
        );
        assert_eq!(next_link(&headers), None);
        assert_eq!(next_link(&http::HeaderMap::new()), None);
    }

    #[test]
    fn group_names_are_sorted_by_the_name_given_and_unique() {
        let team = |organization: &str, slug: &str, name: &str| {
            (organization.to_string(), slug.to_string(), name.to_string())
        };
        // Slugs sort one way, names the other; two teams share the name "Seals".
        let teams = || {
            vec![
                team("other", "x", "X"),
                team("Org-A", "a-mammals", "maMmals"),
                team("Org-A", "b-seals", "Seals"),
                team("Org-A", "c-seals", "Seals"),
            ]
        };
        assert_eq!(
            group_names(teams(), GitHubGroupNameAttribute::Name),
            ["Org-A/Seals", "Org-A/maMmals", "other/X"]
        );
        assert_eq!(
            group_names(teams(), GitHubGroupNameAttribute::Slug),
            ["Org-A/a-mammals", "Org-A/b-seals", "Org-A/c-seals", "other/x"]
        );
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let headers = api_headers(Some("gho_secret"));
        assert!(!format!("{headers:?}").contains("gho_secret"));
    }
}
