//! The Supervisor's OAuth 2.0 endpoints spoken to as Pinniped's CLI speaks to them with the
//! `cli_password` flow: an authorization request with PKCE and the `Pinniped-Username` /
//! `Pinniped-Password` headers, answered by a redirect to the CLI's loopback callback with a code
//! (no browser, no listener: the redirect is read, not followed); the code redeemed at the token
//! endpoint; the refresh grant; and RFC 8693 token exchange for a cluster-scoped ID token. Shared
//! by the Supervisor's e2e tests and its benchmark (`selkie-supervisor-bench`).
//!
//! Nothing here prints or logs a token or a password: errors carry the Supervisor's answer, which
//! holds neither.

use std::time::Duration;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use bytes::Bytes;
use selkie_oidc::https::{HttpsClient, Response};
use serde_json::Value;
use sha2::Digest as _;

/// The CLI's OAuth client.
pub const CLIENT_ID: &str = "pinniped-cli";
/// The loopback redirect URI of every authorization request made here (nothing listens on it).
pub const REDIRECT: &str = "http://127.0.0.1:48123/callback";
/// The PKCE code verifier of every authorization request made here.
pub const VERIFIER: &str = "a-verifier-of-enough-length-0123456789-abcdefghijkl";
/// The scopes the CLI asks for.
pub const SCOPES: &str = "openid offline_access pinniped:request-audience username groups";
/// The `state` of every authorization request made here.
pub const STATE: &str = "state-0123456789";
/// The `nonce` of every authorization request made here (the first ID token carries it).
pub const NONCE: &str = "nonce-0123456789";
/// The display name of the identity provider [`authorize_url`] asks for unless told otherwise
/// (`pinniped_idp_name`).
pub const IDP_DISPLAY_NAME: &str = "Dex Users";

/// How long a request waits for its answer: as long as the CLIs wait
/// ([`selkie_oidc::rp::HTTP_TIMEOUT`]), so that a Supervisor answering within its own bounds (an
/// LDAP directory's 30 s in an outage) is seen answering, not as a hang.
const TIMEOUT: Duration = selkie_oidc::rp::HTTP_TIMEOUT;
const BODY_LIMIT: usize = 1 << 20;

/// The S256 PKCE challenge of [`VERIFIER`].
pub fn challenge() -> String {
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(VERIFIER.as_bytes()))
}

/// `https://host:port` and `/path` of an issuer URL.
pub fn split_issuer(issuer: &str) -> (String, String) {
    let rest = issuer.strip_prefix("https://").unwrap_or_default();
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    (format!("https://{authority}"), format!("/{path}"))
}

/// The authorization URL at `base` (scheme and authority) of the issuer path `path`, with the
/// CLI's parameters ([`CLIENT_ID`], [`REDIRECT`], `response_type=code`, [`SCOPES`], [`STATE`],
/// [`NONCE`], the S256 challenge of [`VERIFIER`], `pinniped_idp_name` [`IDP_DISPLAY_NAME`]) minus those
/// named in `without`, plus `extra`.
pub fn authorize_url(base: &str, path: &str, without: &[&str], extra: &[(&str, &str)]) -> String {
    let challenge = challenge();
    let mut params: Vec<(&str, &str)> = vec![
        ("client_id", CLIENT_ID),
        ("redirect_uri", REDIRECT),
        ("response_type", "code"),
        ("scope", SCOPES),
        ("state", STATE),
        ("nonce", NONCE),
        ("code_challenge", &challenge),
        ("code_challenge_method", "S256"),
        ("pinniped_idp_name", IDP_DISPLAY_NAME),
    ];
    params.retain(|(name, _)| !without.contains(name));
    params.extend_from_slice(extra);
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    format!("{base}{path}/oauth2/authorize?{query}")
}

/// GETs `url`, with `email` and `password` as the `Pinniped-Username` / `Pinniped-Password`
/// headers when `password` is given. Returns the answer whatever its status (redirects are not
/// followed); fails only when there is no answer within [`TIMEOUT`].
pub async fn get(
    client: &HttpsClient,
    url: &str,
    password: Option<&str>,
    email: &str,
) -> anyhow::Result<Response> {
    let mut headers = Vec::new();
    if let Some(password) = password {
        headers.push((
            http::HeaderName::from_static("pinniped-username"),
            http::HeaderValue::from_str(email)?,
        ));
        headers.push((
            http::HeaderName::from_static("pinniped-password"),
            http::HeaderValue::from_str(password)?,
        ));
    }
    Ok(client
        .send(
            http::Method::GET,
            url,
            &headers,
            Bytes::new(),
            BODY_LIMIT,
            Some(TIMEOUT),
        )
        .await?)
}

/// The query parameters of a redirect to [`REDIRECT`]. Fails, with the status and body, unless
/// `response` is a 303 whose Location is [`REDIRECT`] with a query.
pub fn redirected(response: &Response) -> anyhow::Result<Vec<(String, String)>> {
    anyhow::ensure!(
        response.status == 303,
        "expected a redirect, got {}: {:?}",
        response.status,
        response.body
    );
    let location = response
        .headers
        .get(http::header::LOCATION)
        .ok_or_else(|| anyhow::anyhow!("a redirect without a Location"))?
        .to_str()?;
    let query = location
        .strip_prefix(&format!("{REDIRECT}?"))
        .ok_or_else(|| anyhow::anyhow!("redirected elsewhere: {location}"))?;
    Ok(form_urlencoded::parse(query.as_bytes()).into_owned().collect())
}

/// The value of the parameter `name`, if present.
pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// POSTs `form` (URL-encoded) to the token endpoint `url`: the status and the JSON answer. Fails
/// when there is no answer within [`TIMEOUT`] or it is not JSON.
pub async fn token(client: &HttpsClient, url: &str, form: &[(&str, &str)]) -> anyhow::Result<(u16, Value)> {
    let (status, _, json) = token_with_headers(client, url, form, &[]).await?;
    Ok((status, json))
}

/// [`token`] with the request headers `headers` added (a DPoP proof): status, response headers
/// and answer.
pub async fn token_with_headers(
    client: &HttpsClient,
    url: &str,
    form: &[(&str, &str)],
    headers: &[(http::HeaderName, http::HeaderValue)],
) -> anyhow::Result<(u16, http::HeaderMap, Value)> {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut request_headers = vec![(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-www-form-urlencoded"),
    )];
    request_headers.extend_from_slice(headers);
    let response = client
        .send(
            http::Method::POST,
            url,
            &request_headers,
            Bytes::from(body),
            BODY_LIMIT,
            Some(TIMEOUT),
        )
        .await?;
    let json = serde_json::from_slice(&response.body).map_err(|e| {
        anyhow::anyhow!(
            "{} answered {} with no JSON ({e}): {:?}",
            url,
            response.status,
            response.body
        )
    })?;
    Ok((response.status.as_u16(), response.headers, json))
}

/// A whole `cli_password` login at `issuer` through the identity provider `idp_name`: the
/// authorization request with `email` and `password`, then the code redeemed with [`VERIFIER`].
/// Returns the token response, after checking it is a 200 carrying an access token (`pin_at_`),
/// a refresh token (`pin_rt_`) and an ID token; anything else is an error with the answer.
pub async fn login(
    client: &HttpsClient,
    issuer: &str,
    idp_name: &str,
    email: &str,
    password: &str,
) -> anyhow::Result<Value> {
    let (base, path) = split_issuer(issuer);
    let url = authorize_url(
        &base,
        &path,
        &["pinniped_idp_name"],
        &[("pinniped_idp_name", idp_name)],
    );
    let params = redirected(&get(client, &url, Some(password), email).await?)?;
    anyhow::ensure!(param(&params, "state") == Some(STATE), "{params:?}");
    let code = param(&params, "code").ok_or_else(|| anyhow::anyhow!("no code: {params:?}"))?;
    let (status, tokens) = token(
        client,
        &format!("{issuer}/oauth2/token"),
        &[
            ("grant_type", "authorization_code"),
            ("client_id", CLIENT_ID),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("code_verifier", VERIFIER),
        ],
    )
    .await?;
    anyhow::ensure!(status == 200, "redeeming the code: {status}: {tokens}");
    let has = |name: &str, prefix: &str| tokens[name].as_str().is_some_and(|t| t.starts_with(prefix));
    anyhow::ensure!(
        has("access_token", "pin_at_") && has("refresh_token", "pin_rt_") && has("id_token", "ey"),
        "the token response lacks a token: {:?}",
        tokens.as_object().map(|o| o.keys().collect::<Vec<_>>())
    );
    Ok(tokens)
}

/// The refresh grant with `refresh_token` at the token endpoint `token_url`: status and answer,
/// whatever they are.
pub async fn refresh(
    client: &HttpsClient,
    token_url: &str,
    refresh_token: &str,
) -> anyhow::Result<(u16, Value)> {
    token(
        client,
        token_url,
        &[
            ("grant_type", "refresh_token"),
            ("client_id", CLIENT_ID),
            ("refresh_token", refresh_token),
        ],
    )
    .await
}

/// RFC 8693 token exchange at the token endpoint `token_url`: the access token `subject` for an
/// ID token (`requested_token_type` JWT) of `audience`. Status and answer, whatever they are.
pub async fn exchange(
    client: &HttpsClient,
    token_url: &str,
    audience: &str,
    subject: &str,
) -> anyhow::Result<(u16, Value)> {
    token(
        client,
        token_url,
        &[
            ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
            ("client_id", CLIENT_ID),
            ("audience", audience),
            ("subject_token", subject),
            (
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            ),
            ("requested_token_type", "urn:ietf:params:oauth:token-type:jwt"),
        ],
    )
    .await
}

/// The claims (payload) of a JWT, unverified. Fails when `jwt` is not three dot-separated parts
/// whose second is base64url JSON.
pub fn jwt_claims(jwt: &str) -> anyhow::Result<Value> {
    let mut parts = jwt.split('.');
    let (Some(_), Some(payload), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        anyhow::bail!("not a JWS in compact form");
    };
    Ok(serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload)?)?)
}

/// One logged-in session: its user and tokens (never printed, so no `Debug`).
#[derive(Clone)]
pub struct Session {
    /// The user's login name (email).
    pub email: String,
    /// The access token (`pin_at_…`).
    pub access: String,
    /// The refresh token (`pin_rt_…`).
    pub refresh: String,
}

/// A full [`login`] of `email`; fails unless it yields all three tokens, the ID token naming the
/// user.
pub async fn login_session(
    client: &HttpsClient,
    issuer: &str,
    idp_name: &str,
    email: &str,
    password: &str,
) -> anyhow::Result<Session> {
    let tokens = login(client, issuer, idp_name, email, password).await?;
    check_id_token(&tokens, email, CLIENT_ID)?;
    Ok(Session {
        email: email.to_string(),
        access: string(&tokens, "access_token")?,
        refresh: string(&tokens, "refresh_token")?,
    })
}

/// One [`refresh`] grant with `session`'s refresh token at `token_url`; returns the session with
/// the new tokens after checking the answer is a 200 with a new refresh token, an access token
/// and an ID token of the session's user.
pub async fn refresh_session(
    client: &HttpsClient,
    token_url: &str,
    session: Session,
) -> anyhow::Result<Session> {
    let (status, answer) = refresh(client, token_url, &session.refresh).await?;
    anyhow::ensure!(status == 200, "refresh: {status}: {}", without_tokens(&answer));
    let (access, refresh) = (
        string(&answer, "access_token")?,
        string(&answer, "refresh_token")?,
    );
    anyhow::ensure!(
        access.starts_with("pin_at_") && refresh.starts_with("pin_rt_") && refresh != session.refresh,
        "refresh: unexpected tokens in {}",
        without_tokens(&answer)
    );
    check_id_token(&answer, &session.email, CLIENT_ID)?;
    Ok(Session {
        access,
        refresh,
        ..session
    })
}

/// Fails unless the token response `answer` has an ID token for `audience` naming `email`.
pub fn check_id_token(answer: &Value, email: &str, audience: &str) -> anyhow::Result<()> {
    let claims = jwt_claims(&string(answer, "id_token")?)?;
    anyhow::ensure!(
        claims["username"] == email && has_audience(&claims, audience),
        "the ID token is not the user's: username {}, aud {}",
        claims["username"],
        claims["aud"]
    );
    Ok(())
}

/// Whether the JWT `claims` name `audience` in `aud` (a string or an array of them).
pub fn has_audience(claims: &Value, audience: &str) -> bool {
    match &claims["aud"] {
        Value::String(aud) => aud == audience,
        Value::Array(auds) => auds.iter().any(|aud| aud == audience),
        _ => false,
    }
}

/// The string `name` of a token response.
pub fn string(answer: &Value, name: &str) -> anyhow::Result<String> {
    use anyhow::Context as _;
    answer[name]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no {name} in {}", without_tokens(answer)))
}

/// A token response with every token replaced by its length, fit for an error message.
pub fn without_tokens(answer: &Value) -> Value {
    let mut shown = answer.clone();
    if let Some(object) = shown.as_object_mut() {
        for (name, value) in object.iter_mut() {
            if name.ends_with("token") {
                *value = serde_json::json!(format!("<{} bytes>", value.as_str().map_or(0, str::len)));
            }
        }
    }
    shown
}
