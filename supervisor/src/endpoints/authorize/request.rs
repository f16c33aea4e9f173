//! The authorization request (`GET /oauth2/authorize`): its parameters checked in the order and
//! with the words of Pinniped's Supervisor. Until the client and its redirect URI are known good,
//! an error is answered directly; after that it goes back to the client at its redirect URI.

use std::collections::HashMap;

use subtle::ConstantTimeEq as _;

use crate::endpoints::oauth::{Code, OAuthError};

/// The CLI's client ID: a public client with loopback redirects.
pub(crate) const PINNIPED_CLI: &str = "pinniped-cli";
/// The least length of `state` (and `nonce`, when present).
pub(crate) const MIN_PARAMETER_ENTROPY: usize = 8;

/// A client that may ask for authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its ID.
    pub id: String,
    /// Where it may be sent back. `http://127.0.0.1/...` and `http://[::1]/...` match any port
    /// (RFC 8252 §7.3).
    pub redirect_uris: Vec<String>,
    /// The scopes it may ask for.
    pub scopes: Vec<String>,
    /// The grant types it may use at the token endpoint.
    pub grant_types: Vec<String>,
    /// Whether it may ask for `response_mode=form_post` (the CLI may; OIDCClients get the
    /// query, as in Pinniped).
    pub form_post: bool,
}

impl Client {
    /// The static `pinniped-cli` client.
    pub fn pinniped_cli() -> Self {
        Self {
            id: PINNIPED_CLI.into(),
            redirect_uris: vec!["http://127.0.0.1/callback".into()],
            scopes: [
                "openid",
                "offline_access",
                "profile",
                "email",
                "pinniped:request-audience",
                "username",
                "groups",
            ]
            .map(String::from)
            .to_vec(),
            grant_types: [
                "authorization_code",
                "refresh_token",
                "urn:ietf:params:oauth:grant-type:token-exchange",
                crate::endpoints::discovery::DEVICE_CODE_GRANT,
            ]
            .map(String::from)
            .to_vec(),
            form_post: true,
        }
    }

    /// Whether `requested` is one of the client's redirect URIs.
    pub fn allows_redirect(&self, requested: &str) -> bool {
        self.redirect_uris
            .iter()
            .any(|registered| registered == requested || loopback_match(registered, requested))
    }
}

/// Whether two loopback `http` URIs differ at most in their port.
fn loopback_match(registered: &str, requested: &str) -> bool {
    let (Ok(registered), Ok(requested)) = (registered.parse::<http::Uri>(), requested.parse::<http::Uri>())
    else {
        return false;
    };
    let loopback = |uri: &http::Uri| {
        uri.scheme_str() == Some("http") && matches!(uri.host(), Some("127.0.0.1" | "[::1]"))
    };
    loopback(&registered)
        && loopback(&requested)
        && registered.host() == requested.host()
        && registered.path() == requested.path()
        && registered.query() == requested.query()
}

/// How the authorization response is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseMode {
    /// In the redirect's query.
    Query,
    /// In an auto-submitted HTML form POSTed to the redirect URI.
    FormPost,
}

/// An authorization request whose every parameter checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuthorizeRequest {
    /// The client.
    pub client_id: String,
    /// Where the response goes.
    pub redirect_uri: String,
    /// How it goes there.
    pub response_mode: ResponseMode,
    /// The scopes asked for, in order.
    pub scopes: Vec<String>,
    /// The client's `state`, returned unchanged.
    pub state: String,
    /// The client's `nonce`, put in the ID token.
    pub nonce: Option<String>,
    /// The PKCE S256 challenge.
    pub code_challenge: String,
    /// `pinniped_idp_name`, when the client chose an identity provider.
    pub idp_name: Option<String>,
    /// `pinniped_idp_type`, when given.
    pub idp_type: Option<String>,
}

/// Why an authorization request is refused, and where the answer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Answered directly (the client or its redirect URI cannot be trusted).
    Direct(OAuthError),
    /// Sent back to the client's redirect URI, with its `state` if it gave one.
    Redirect {
        /// The error.
        error: OAuthError,
        /// The redirect URI.
        redirect_uri: String,
        /// How.
        response_mode: ResponseMode,
        /// The client's state.
        state: Option<String>,
    },
}

/// Checks the query parameters of an authorization request against `clients` (looked up by ID).
/// Every parameter may appear once; the first refusal found is returned.
pub(crate) fn parse(
    query: &str,
    clients: &dyn Fn(&str) -> Option<Client>,
) -> Result<AuthorizeRequest, Refusal> {
    let mut params: HashMap<String, String> = HashMap::new();
    let mut repeated = None;
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if params.insert(name.to_string(), value.into_owned()).is_some() {
            repeated.get_or_insert_with(|| name.to_string());
        }
    }
    let get = |name: &str| {
        params
            .get(name)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    };
    let direct = |code, hint: &str| Refusal::Direct(OAuthError::new(code, hint));

    let client = get("client_id").and_then(clients).ok_or_else(|| {
        direct(
            Code::InvalidClient,
            "The requested OAuth 2.0 Client does not exist.",
        )
    })?;
    let redirect_uri = get("redirect_uri")
        .filter(|uri| client.allows_redirect(uri))
        .ok_or_else(|| {
            direct(
                Code::InvalidRequest,
                "The 'redirect_uri' parameter does not match any of the OAuth 2.0 Client's pre-registered redirect urls.",
            )
        })?
        .to_string();
    if redirect_uri.contains('#') {
        // RFC 6749 §3.1.2: a redirection endpoint has no fragment (matching dropped it).
        return Err(direct(
            Code::InvalidRequest,
            &format!(
                "The redirect URI '{redirect_uri}' contains an illegal character (for example #) or is otherwise invalid."
            ),
        ));
    }
    let state = get("state").map(str::to_string);
    // The response mode decides how even the next errors are delivered.
    let response_mode = match get("response_mode") {
        None | Some("query") => ResponseMode::Query,
        Some("form_post") if client.form_post => ResponseMode::FormPost,
        Some(other) => {
            return Err(Refusal::Redirect {
                error: OAuthError::new(
                    Code::UnsupportedResponseMode,
                    &if other == "form_post" {
                        "The client is not allowed to request response_mode 'form_post'.".to_string()
                    } else {
                        format!("Request with unsupported response_mode \"{other}\".")
                    },
                ),
                redirect_uri,
                response_mode: ResponseMode::Query,
                state,
            })
        }
    };
    let refuse = |code, hint: String| Refusal::Redirect {
        error: OAuthError::new(code, &hint),
        redirect_uri: redirect_uri.clone(),
        response_mode,
        state: state.clone(),
    };
    if let Some(name) = repeated {
        return Err(refuse(
            Code::InvalidRequest,
            format!("The parameter '{name}' must not be given more than once."),
        ));
    }
    match get("response_type") {
        None => {
            return Err(refuse(
                Code::UnsupportedResponseType,
                "`The request is missing the 'response_type' parameter.".into(),
            ))
        }
        Some("code") => {}
        Some(other) => {
            return Err(refuse(
                Code::UnsupportedResponseType,
                format!("The client is not allowed to request response_type '{other}'."),
            ))
        }
    }
    let scopes: Vec<String> = get("scope")
        .unwrap_or_default()
        .split(' ')
        .filter(|scope| !scope.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(scope) = scopes.iter().find(|scope| !client.scopes.contains(scope)) {
        return Err(refuse(
            Code::InvalidScope,
            format!("The OAuth 2.0 Client is not allowed to request scope '{scope}'."),
        ));
    }
    let Some(state) = state.clone().filter(|state| state.len() >= MIN_PARAMETER_ENTROPY) else {
        return Err(refuse(
            Code::InvalidState,
            format!(
                "Request parameter 'state' must be at least be {MIN_PARAMETER_ENTROPY} characters long to ensure sufficient entropy."
            ),
        ));
    };
    let nonce = get("nonce").map(str::to_string);
    if nonce
        .as_ref()
        .is_some_and(|nonce| nonce.len() < MIN_PARAMETER_ENTROPY)
    {
        return Err(refuse(
            Code::InvalidRequest,
            format!(
                "Parameter 'nonce' is set but does not satisfy the minimum entropy of {MIN_PARAMETER_ENTROPY} characters."
            ),
        ));
    }
    let Some(code_challenge) = get("code_challenge") else {
        return Err(refuse(
            Code::InvalidRequest,
            "Clients must include a code_challenge when performing the authorize code flow, but it is missing.".into(),
        ));
    };
    match get("code_challenge_method") {
        Some("S256") => {}
        None | Some("plain") => {
            return Err(refuse(
                Code::InvalidRequest,
                "Clients must use code_challenge_method=S256, plain is not allowed.".into(),
            ))
        }
        Some(_) => {
            return Err(refuse(
                Code::InvalidRequest,
                "The code_challenge_method is not supported, use S256 instead.".into(),
            ))
        }
    }
    // A S256 challenge is the unpadded base64url of a SHA-256: 43 characters.
    if code_challenge.len() != 43
        || !code_challenge
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(refuse(
            Code::InvalidRequest,
            "The code_challenge is not the base64url encoding of a SHA-256 digest.".into(),
        ));
    }
    if scopes.iter().any(|scope| scope == "openid") {
        check_prompt(get("prompt")).map_err(|(code, hint)| refuse(code, hint))?;
    }
    Ok(AuthorizeRequest {
        client_id: client.id,
        redirect_uri,
        response_mode,
        scopes,
        state,
        nonce,
        code_challenge: code_challenge.to_string(),
        idp_name: get("pinniped_idp_name").map(str::to_string),
        idp_type: get("pinniped_idp_type").map(str::to_string),
    })
}

/// The values `prompt` may have (OpenID Connect Core §3.1.2.1).
const PROMPTS: [&str; 4] = ["none", "login", "consent", "select_account"];

/// Checks an OpenID Connect request's `prompt` as Pinniped's Supervisor does: only known values;
/// `none` alone. The Supervisor keeps no browser session, so a login always needs the user:
/// `none` is `login_required` (before any page is shown or the upstream is asked); `login`,
/// `consent` and `select_account` are satisfied by every login anyway.
fn check_prompt(prompt: Option<&str>) -> Result<(), (Code, String)> {
    let values: Vec<&str> = prompt
        .unwrap_or_default()
        .split(' ')
        .filter(|value| !value.is_empty())
        .collect();
    if values.iter().any(|value| !PROMPTS.contains(value)) {
        return Err((
            Code::InvalidRequest,
            format!("Used unknown value '[{}]' for prompt parameter", values.join(" ")),
        ));
    }
    if values.contains(&"none") && values.len() > 1 {
        return Err((
            Code::InvalidRequest,
            "Parameter 'prompt' was set to 'none', but contains other values as well which is not allowed."
                .into(),
        ));
    }
    if values.contains(&"none") {
        return Err((Code::LoginRequired, String::new()));
    }
    Ok(())
}

/// Whether a PKCE `verifier` (43 to 128 unreserved characters, RFC 7636 §4.1) is the one whose
/// S256 `challenge` the authorization request carried.
pub(crate) fn verifier_matches(challenge: &str, verifier: &str) -> bool {
    // Both sides are public-length strings; compare without an early exit anyway.
    challenge_of(verifier).is_some_and(|computed| bool::from(computed.as_bytes().ct_eq(challenge.as_bytes())))
}

/// The S256 PKCE challenge of `verifier` (RFC 7636 §4.2), `None` when it is no well-formed
/// verifier (43 to 128 unreserved characters).
pub(crate) fn challenge_of(verifier: &str) -> Option<String> {
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
    use sha2::Digest as _;
    let well_formed = (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
    well_formed.then(|| URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    fn clients(id: &str) -> Option<Client> {
        (id == PINNIPED_CLI).then(Client::pinniped_cli)
    }

    fn good() -> Vec<(String, String)> {
        [
            ("client_id", "pinniped-cli"),
            ("redirect_uri", "http://127.0.0.1:51234/callback"),
            ("response_type", "code"),
            (
                "scope",
                "openid offline_access pinniped:request-audience username groups",
            ),
            ("state", "state-0123456789"),
            ("nonce", "nonce-0123456789"),
            ("code_challenge", CHALLENGE),
            ("code_challenge_method", "S256"),
            ("pinniped_idp_name", "Dex"),
        ]
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .to_vec()
    }

    fn query(params: &[(String, String)]) -> String {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish()
    }

    /// The good request with `name` removed, or set to `value`.
    fn with(name: &str, value: Option<&str>) -> String {
        let mut params: Vec<(String, String)> = good().into_iter().filter(|(n, _)| n != name).collect();
        if let Some(value) = value {
            params.push((name.to_string(), value.to_string()));
        }
        query(&params)
    }

    fn redirected(query: &str) -> (Code, String, Option<String>) {
        match parse(query, &clients) {
            Err(Refusal::Redirect { error, state, .. }) => (error.code, error.description, state),
            other => panic!("expected a redirected refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_redirect_uri_with_a_fragment_is_refused_directly() {
        let with_fragment = "http://127.0.0.1:48123/callback#frag";
        match parse(&with("redirect_uri", Some(with_fragment)), &clients) {
            Err(Refusal::Direct(error)) => {
                assert_eq!(error.code, Code::InvalidRequest);
                assert!(
                    error
                        .description
                        .contains("contains an illegal character (for example #)"),
                    "{}",
                    error.description
                );
            }
            other => panic!("expected a direct refusal, got {other:?}"),
        }
    }

    #[test]
    fn prompt_none_needs_a_login_and_is_alone_and_unknown_values_are_refused() {
        let (code, description, state) = redirected(&with("prompt", Some("none")));
        assert_eq!(code, Code::LoginRequired);
        assert_eq!(
            description,
            "The Authorization Server requires End-User authentication."
        );
        assert_eq!(state.as_deref(), Some("state-0123456789"));
        let (code, description, _) = redirected(&with("prompt", Some("none login")));
        assert_eq!(code, Code::InvalidRequest);
        assert!(description.ends_with(
            "Parameter 'prompt' was set to 'none', but contains other values as well which is not allowed."
        ));
        let (code, description, _) = redirected(&with("prompt", Some("login bogus")));
        assert_eq!(code, Code::InvalidRequest);
        assert!(description.ends_with("Used unknown value '[login bogus]' for prompt parameter"));
        for fine in ["login", "consent", "select_account", "login consent"] {
            assert!(parse(&with("prompt", Some(fine)), &clients).is_ok(), "{fine}");
        }
        // Without openid it is no OpenID Connect request: prompt means nothing (Pinniped's).
        let mut plain: Vec<(String, String)> = good().into_iter().filter(|(n, _)| n != "scope").collect();
        plain.push(("scope".into(), "offline_access".into()));
        plain.push(("prompt".into(), "none".into()));
        assert!(parse(&query(&plain), &clients).is_ok());
    }

    #[test]
    fn pkce_verifiers_match_their_s256_challenge_only() {
        // RFC 7636 appendix B.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert!(verifier_matches(CHALLENGE, verifier));
        assert!(!verifier_matches(
            CHALLENGE,
            "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXK"
        ));
        assert!(!verifier_matches(CHALLENGE, "short"));
        assert!(!verifier_matches(CHALLENGE, &format!("{verifier} ")));
    }

    #[test]
    fn a_good_request_is_accepted_on_any_loopback_port() {
        let request = parse(&query(&good()), &clients).unwrap();
        assert_eq!(request.redirect_uri, "http://127.0.0.1:51234/callback");
        assert_eq!(request.code_challenge, CHALLENGE);
        assert_eq!(request.idp_name.as_deref(), Some("Dex"));
        assert_eq!(request.response_mode, ResponseMode::Query);
        assert!(parse(&with("response_mode", Some("form_post")), &clients).is_ok());
    }

    #[test]
    fn untrusted_clients_and_redirects_are_answered_directly() {
        for (change, value) in [
            ("client_id", Some("someone-else")),
            ("client_id", None),
            ("redirect_uri", Some("http://127.0.0.1:51234/other")),
            ("redirect_uri", Some("http://evil.example.com:51234/callback")),
            ("redirect_uri", Some("https://127.0.0.1:51234/callback")),
            ("redirect_uri", None),
        ] {
            let refusal = parse(&with(change, value), &clients).unwrap_err();
            assert!(
                matches!(refusal, Refusal::Direct(_)),
                "{change}={value:?}: {refusal:?}"
            );
        }
    }

    #[test]
    fn bad_parameters_go_back_to_the_client_with_pinnipeds_words() {
        let (code, description, state) = redirected(&with("code_challenge_method", Some("plain")));
        assert_eq!(code, Code::InvalidRequest);
        assert!(description.ends_with("Clients must use code_challenge_method=S256, plain is not allowed."));
        assert_eq!(state.as_deref(), Some("state-0123456789"));
        let (_, description, _) = redirected(&with("code_challenge", None));
        assert!(description.ends_with("but it is missing."), "{description}");
        let (code, description, _) = redirected(&with("state", Some("short")));
        assert_eq!(code, Code::InvalidState);
        assert!(description.ends_with("at least be 8 characters long to ensure sufficient entropy."));
        let (code, description, _) = redirected(&with("scope", Some("openid tuna")));
        assert_eq!(code, Code::InvalidScope);
        assert!(description.ends_with("not allowed to request scope 'tuna'."));
        let (code, _, _) = redirected(&with("response_type", Some("token")));
        assert_eq!(code, Code::UnsupportedResponseType);
        let (code, _, _) = redirected(&with("response_mode", Some("fragment")));
        assert_eq!(code, Code::UnsupportedResponseMode);
        let (code, _, _) = redirected(&with("code_challenge", Some("too-short")));
        assert_eq!(code, Code::InvalidRequest);
        let mut twice = good();
        twice.push(("scope".into(), "openid".into()));
        let (code, description, _) = redirected(&query(&twice));
        assert_eq!(code, Code::InvalidRequest);
        assert!(description.contains("'scope' must not be given more than once"));
    }
}
