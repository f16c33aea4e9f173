//! GitHub's answers into the Supervisor's GitHub identity provider
//! (`selkie_supervisor::fuzzing::github`): the REST API's `/user`, `/user/orgs` and `/user/teams`
//! (paginated by `Link` headers) as `GitHub::user` reads them at every login and refresh, and the
//! OAuth token endpoint's answer as `GitHub::exchange_code` reads it. The answers are given in
//! order (`GitHubAnswers`) instead of fetched; no request leaves the process.
//!
//! Input: `selector, answers split by 0x01`. An answer is `status, headers, 0x00, body`: the
//! status byte picks from [`STATUSES`] (low four bits), headers are `name:value` lines; an empty
//! answer is no answer (GitHub unreachable). Selector bits 0-1 pick the username attribute, bit 2
//! the group name attribute, bit 3 allowed organizations (`Org-A`, `org-b`) instead of all users,
//! bit 4 redeems a code instead of reading the user; bits 5-6 pick the host — `github.com`, a
//! GitHub Enterprise Server, one with a port, or the first answer's text (which then is no
//! answer), checked by `GitHubEndpoints::of` as a GitHubIdentityProvider's `spec.githubAPI.host`.
//!
//! Invariants (a violation panics): nothing panics; a host is either refused or gives https
//! endpoints; the user's token goes only to the API (every request of a user read is an
//! authorized GET under the API's base URL, the first one `/user`, at most 201 of them) and a
//! code only to the OAuth token endpoint (one POST, unauthorized); a user read gives the username
//! the attribute asks for, groups sorted without duplicates, named `<organization>/<team>`, of
//! allowed organizations only, and a subject; `Denied` only with allowed organizations; a
//! redeemed code gives the `access_token` of a JSON answer; no error repeats the user's token or
//! the app's secret unless an answer or the host did.

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use selkie_api::supervisor_idp::{GitHubGroupNameAttribute, GitHubUsernameAttribute};
use selkie_fuzz::{runtime, text};
use selkie_supervisor::fuzzing::{github, GitHubAnswer, GitHubAnswers, GitHubEndpoints, GitHubError};

/// The statuses an answer may have.
const STATUSES: [u16; 16] = [
    200, 200, 200, 201, 204, 301, 304, 400, 401, 403, 404, 422, 429, 500, 502, 503,
];
/// The user's access token, and the app's client secret.
const TOKEN: &str = "gho_fuzz0user0token0AbCdEf0123456789";
const CLIENT_SECRET: &str = "fuzz-app-secret-0123456789abcdef";
/// The allowed organizations, when there are any.
const ALLOWED: [&str; 2] = ["Org-A", "org-b"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mut chunks: Vec<&[u8]> = rest.split(|byte| *byte == 1).collect();
    let host = match (selector >> 5) & 0b11 {
        0 => "github.com".to_string(),
        1 => "ghe.fuzz.test".to_string(),
        2 => "ghe.fuzz.test:8443".to_string(),
        _ => text(chunks.remove(0)),
    };
    let answers: Vec<Option<GitHubAnswer>> = chunks.iter().map(|chunk| answer_of(chunk)).collect();
    let echoed = |secret: &str| {
        answers.iter().flatten().any(|answer| {
            contains(&answer.body, secret)
                || answer
                    .headers
                    .iter()
                    .any(|(name, value)| name.contains(secret) || contains(value, secret))
        })
    };
    // Errors name URLs (so the host) and quote GitHub's messages: only what no answer and no
    // host carried must not come back.
    let echoed =
        echoed(TOKEN) || echoed(CLIENT_SECRET) || host.contains(TOKEN) || host.contains(CLIENT_SECRET);
    let username = match selector & 0b11 {
        1 => GitHubUsernameAttribute::Login,
        2 => GitHubUsernameAttribute::ID,
        _ => GitHubUsernameAttribute::LoginAndID,
    };
    let groups = if selector & 0b100 != 0 {
        GitHubGroupNameAttribute::Slug
    } else {
        GitHubGroupNameAttribute::Name
    };
    let allowed: Vec<String> = if selector & 0b1000 != 0 {
        ALLOWED.map(String::from).to_vec()
    } else {
        Vec::new()
    };
    let answers = Arc::new(GitHubAnswers::new(answers));
    let github = match github(
        &host,
        "fuzz-app",
        CLIENT_SECRET,
        username,
        groups,
        &allowed,
        answers.clone(),
    ) {
        Ok(github) => github,
        Err(reason) => {
            assert!(!reason.is_empty(), "a host refused without reason");
            assert!(
                GitHubEndpoints::of(&host).is_err(),
                "the same host accepted on a second look"
            );
            return;
        }
    };
    let endpoints = github.endpoints.clone();
    assert!(endpoints.api.starts_with("https://"), "{endpoints:?}");
    assert!(endpoints.oauth.starts_with("https://"), "{endpoints:?}");
    assert!(endpoints.oauth.ends_with("/login/oauth"), "{endpoints:?}");
    let error = if selector & 0x10 != 0 {
        let redeemed =
            runtime().block_on(github.exchange_code("fuzz-code", "https://sso.fuzz.test/a/callback"));
        let requests = answers.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(requests[0].method, http::Method::POST);
        assert_eq!(requests[0].url, format!("{}/access_token", endpoints.oauth));
        assert!(
            !requests[0].authorized,
            "the token endpoint got an Authorization header"
        );
        match redeemed {
            Ok(token) => {
                assert!(!token.is_empty(), "an empty access token");
                assert!(
                    chunks
                        .iter()
                        .filter_map(|chunk| answer_of(chunk))
                        .filter_map(|answer| serde_json::from_slice::<TokenAnswer>(&answer.body).ok())
                        .any(|body| body.access_token.as_deref() == Some(token.as_str())),
                    "a token that no answer's access_token is"
                );
                None
            }
            Err(error) => Some(error),
        }
    } else {
        let user = runtime().block_on(github.user(TOKEN, "GitHub"));
        let requests = answers.requests();
        assert!(
            !requests.is_empty() && requests.len() <= 201,
            "{} requests",
            requests.len()
        );
        assert_eq!(requests[0].url, format!("{}/user", endpoints.api));
        for request in &requests {
            assert_eq!(request.method, http::Method::GET, "{request:?}");
            assert!(request.authorized, "{request:?}");
            assert!(
                request.url.starts_with(&format!("{}/", endpoints.api)),
                "the user's token went to {:?}",
                request.url
            );
        }
        match user {
            Ok(user) => {
                check_user(&user, username, &allowed);
                None
            }
            Err(GitHubError::Denied) => {
                assert!(!allowed.is_empty(), "denied with every user allowed");
                None
            }
            Err(error) => Some(error),
        }
    };
    if let Some(error) = error {
        let message = error.to_string();
        assert!(!message.is_empty(), "an error without message");
        if !echoed {
            assert!(!message.contains(TOKEN), "an error repeats the user's token");
            assert!(
                !message.contains(CLIENT_SECRET),
                "an error repeats the app's secret"
            );
        }
    }
});

/// The member of a token endpoint's JSON answer that holds the token (the others are not read).
#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

fn answer_of(chunk: &[u8]) -> Option<GitHubAnswer> {
    let (&status, rest) = chunk.split_first()?;
    let (head, body) = match rest.iter().position(|byte| *byte == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&[][..], rest),
    };
    let headers = head
        .split(|byte| *byte == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|byte| *byte == b':')?;
            Some((text(&line[..colon]), line[colon + 1..].to_vec()))
        })
        .collect();
    Some(GitHubAnswer {
        status: STATUSES[usize::from(status & 0x0f)],
        headers,
        body: body.to_vec(),
    })
}

fn check_user(
    user: &selkie_supervisor::fuzzing::GitHubUser,
    attribute: GitHubUsernameAttribute,
    allowed: &[String],
) {
    assert!(!user.username.is_empty(), "an empty username");
    assert!(!user.subject.is_empty(), "no subject");
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match attribute {
        GitHubUsernameAttribute::ID => assert!(digits(&user.username), "{user:?}"),
        GitHubUsernameAttribute::LoginAndID => {
            let (_, id) = user.username.rsplit_once(':').expect("login:id");
            assert!(digits(id), "{user:?}");
        }
        _ => {}
    }
    assert!(
        user.groups.windows(2).all(|pair| pair[0] < pair[1]),
        "groups not sorted or with duplicates: {:?}",
        user.groups
    );
    for group in &user.groups {
        let (organization, team) = group.split_once('/').expect("<organization>/<team>");
        assert!(!organization.is_empty() && !team.is_empty(), "{group:?}");
        if !allowed.is_empty() {
            assert!(
                allowed
                    .iter()
                    .any(|org| org.to_lowercase() == organization.to_lowercase()),
                "a group of an organization that is not allowed: {group:?}"
            );
        }
    }
}
