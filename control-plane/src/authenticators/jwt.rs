//! One JWTAuthenticator pass: Pinniped's conditions in Pinniped's order (`TLSConfigurationValid`,
//! `IssuerURLValid`, `DiscoveryURLValid`, `JWKSURLValid`, `JWKSFetchValid`, `AuthenticatorValid`),
//! each evaluated only when those before it hold, and the authenticator built from the spec
//! (CEL claim mappings and validation rules included) with its keys already loaded.

use std::sync::Arc;

use http::Uri;
use selkie_api::authentication::{JWTAuthenticatorSpec, JWTTokenClaims};
use selkie_filters::{
    chain::TokenAuthenticator,
    jwt::{
        ClaimMapping, ClaimValidationRule, JwksError, JwtAuthenticator, JwtConfig, Mapping,
        UserValidationRule,
    },
};

use selkie_kube::tls_spec::TlsOutcome;

use super::Evaluation;
use selkie_kube::conditions::{Check, REASON_INVALID_ISSUER_URL, TYPE_AUTHENTICATOR_VALID};

/// `IssuerURLValid`.
pub(crate) const TYPE_ISSUER_URL_VALID: &str = "IssuerURLValid";
/// `DiscoveryURLValid`.
pub(crate) const TYPE_DISCOVERY_URL_VALID: &str = "DiscoveryURLValid";
/// `JWKSURLValid`.
pub(crate) const TYPE_JWKS_URL_VALID: &str = "JWKSURLValid";
/// `JWKSFetchValid`.
pub(crate) const TYPE_JWKS_FETCH_VALID: &str = "JWKSFetchValid";

const WELL_KNOWN: &str = "/.well-known/openid-configuration";

/// Checks `issuer` as Pinniped does: a URL with scheme https, no discovery path, no query, no
/// fragment.
pub(crate) fn check_issuer(issuer: &str) -> Check {
    let failure = |reason: &str, message: String| Check::failure(TYPE_ISSUER_URL_VALID, reason, message);
    let (without_fragment, fragment) = match issuer.split_once('#') {
        Some((before, after)) => (before, after),
        None => (issuer, ""),
    };
    let uri: Uri = match without_fragment.parse() {
        Ok(uri) => uri,
        Err(e) => {
            return failure(
                REASON_INVALID_ISSUER_URL,
                format!("spec.issuer URL is invalid: {e}"),
            )
        }
    };
    if uri.scheme_str() != Some("https") {
        return failure(
            "InvalidIssuerURLScheme",
            format!("spec.issuer {issuer} has invalid scheme, require 'https'"),
        );
    }
    if uri.path().ends_with(WELL_KNOWN) {
        return failure(
            "InvalidIssuerURLContainsWellKnownEndpoint",
            format!("spec.issuer {issuer} cannot include path '{WELL_KNOWN}'"),
        );
    }
    if uri.query().is_some_and(|query| !query.is_empty()) {
        return failure(
            "InvalidIssuerURLContainsQueryParams",
            format!("spec.issuer {issuer} cannot include query params"),
        );
    }
    if !fragment.is_empty() {
        return failure(
            "InvalidIssuerURLContainsFragment",
            format!("spec.issuer {issuer} cannot include fragment"),
        );
    }
    Check::success(TYPE_ISSUER_URL_VALID, "issuer is a valid URL")
}

fn discovery_ok() -> Check {
    Check::success(TYPE_DISCOVERY_URL_VALID, "discovery performed successfully")
}

fn jwks_url_ok() -> Check {
    Check::success(TYPE_JWKS_URL_VALID, "jwks_uri is a valid URL")
}

fn jwks_fetch_ok() -> Check {
    Check::success(TYPE_JWKS_FETCH_VALID, "successfully fetched jwks")
}

fn authenticator_ok() -> Check {
    Check::success(TYPE_AUTHENTICATOR_VALID, "authenticator initialized")
}

/// The filter's configuration for the CR `name` with `spec`, trusting `ca_bundle_pem`. Pinniped's
/// defaults: claims `username` and `groups` without prefix, one audience.
pub(crate) fn jwt_config(
    name: &str,
    spec: &JWTAuthenticatorSpec,
    ca_bundle_pem: Option<String>,
) -> Result<JwtConfig, String> {
    let mut config = JwtConfig::new(name, &spec.issuer, &spec.audience);
    let claims: &JWTTokenClaims = &spec.claims;
    let set = |value: &Option<String>| value.as_deref().filter(|v| !v.is_empty()).map(str::to_string);
    config.username = match (set(&claims.username), set(&claims.username_expression)) {
        (Some(_), Some(_)) => {
            return Err(
                "spec.claims.username and spec.claims.usernameExpression are mutually exclusive".into(),
            )
        }
        (_, Some(expression)) => Mapping::Expression(expression),
        (claim, None) => ClaimMapping::claim(claim.unwrap_or_else(|| "username".into())).into(),
    };
    config.groups = Some(match (set(&claims.groups), set(&claims.groups_expression)) {
        (Some(_), Some(_)) => {
            return Err("spec.claims.groups and spec.claims.groupsExpression are mutually exclusive".into())
        }
        (_, Some(expression)) => Mapping::Expression(expression),
        (claim, None) => ClaimMapping::claim(claim.unwrap_or_else(|| "groups".into())).into(),
    });
    for (i, extra) in claims.extra.iter().enumerate() {
        if config
            .extra
            .insert(extra.key.clone(), extra.value_expression.clone())
            .is_some()
        {
            return Err(format!(
                "spec.claims.extra[{i}].key: duplicate key {:?}",
                extra.key
            ));
        }
    }
    for (i, rule) in spec.claim_validation_rules.iter().enumerate() {
        let field = format!("spec.claimValidationRules[{i}]");
        config.claim_validation_rules.push(
            match (&rule.claim, &rule.required_value, &rule.expression, &rule.message) {
                (Some(claim), required_value, None, None) if !claim.is_empty() => ClaimValidationRule::RequiredValue {
                    claim: claim.clone(),
                    required_value: required_value.clone().unwrap_or_default(),
                },
                (None, None, Some(expression), message) if !expression.is_empty() => ClaimValidationRule::Expression {
                    expression: expression.clone(),
                    message: message.clone().unwrap_or_default(),
                },
                _ => {
                    return Err(format!(
                        "{field}: exactly one of claim (with requiredValue) or expression (with message) is required"
                    ))
                }
            },
        );
    }
    config.user_validation_rules = spec
        .user_validation_rules
        .iter()
        .map(|rule| UserValidationRule {
            expression: rule.expression.clone(),
            message: rule.message.clone().unwrap_or_default(),
        })
        .collect();
    config.ca_bundle_pem = ca_bundle_pem;
    config.login_authorization = spec
        .login_authorization
        .as_ref()
        .map(crate::login_authorization::attributes);
    Ok(config)
}

/// Evaluates the CR `name`. `tls` is its `TLSConfigurationValid` outcome; `already_serving` says
/// that this very spec and CA bundle are what is served already, so the network probes are not
/// repeated (Pinniped does the same: the probes catch configuration mistakes, not outages).
pub(crate) async fn evaluate(
    name: &str,
    spec: &JWTAuthenticatorSpec,
    tls: &TlsOutcome,
    already_serving: bool,
) -> Evaluation {
    let issuer = check_issuer(&spec.issuer);
    let ok_so_far = tls.ok() && issuer.is_true();
    let mut checks = vec![tls.check.clone(), issuer];
    if ok_so_far && already_serving {
        checks.extend([discovery_ok(), jwks_url_ok(), jwks_fetch_ok(), authenticator_ok()]);
        return Evaluation::unchanged(checks);
    }
    if !ok_so_far {
        checks.extend(
            [
                TYPE_DISCOVERY_URL_VALID,
                TYPE_JWKS_URL_VALID,
                TYPE_JWKS_FETCH_VALID,
                TYPE_AUTHENTICATOR_VALID,
            ]
            .map(Check::unable_to_validate),
        );
        return Evaluation::invalid(checks);
    }

    // The real authenticator when the spec builds; otherwise a probe with Pinniped's defaults, so
    // that discovery and the key set are still reported.
    let built = jwt_config(name, spec, tls.ca_bundle_pem.clone())
        .and_then(|config| JwtAuthenticator::new(config).map_err(|e| e.to_string()));
    let (authenticator, build_error) = match built {
        Ok(authenticator) => (Some(authenticator), None),
        Err(error) => {
            let mut probe = JwtConfig::new(name, &spec.issuer, &spec.audience);
            probe.ca_bundle_pem = tls.ca_bundle_pem.clone();
            (JwtAuthenticator::new(probe).ok(), Some(error))
        }
    };
    let Some(authenticator) = authenticator else {
        let message = build_error.unwrap_or_default();
        checks.extend(
            [
                TYPE_DISCOVERY_URL_VALID,
                TYPE_JWKS_URL_VALID,
                TYPE_JWKS_FETCH_VALID,
            ]
            .map(Check::unable_to_validate),
        );
        checks.push(invalid_authenticator(&message));
        return Evaluation::invalid(checks);
    };

    let mut retry = false;
    match authenticator.load_keys().await {
        Ok(_) => checks.extend([discovery_ok(), jwks_url_ok(), jwks_fetch_ok()]),
        Err(error) => {
            retry = true;
            let mut failure = fetch_failure(&error);
            if let JwksError::Discovery { .. } = error {
                // The HTTPS client reports a failed connection without its cause; a probe of the
                // same host with the same trust says what it was (refused, untrusted, ...).
                if let Some(cause) = connection_problem(&spec.issuer, tls.ca_bundle_pem.as_deref()).await {
                    failure[0].message.push_str(&format!(" ({cause})"));
                }
            }
            checks.extend(failure);
        }
    }
    let fetched = checks.iter().all(Check::is_true);
    match (&build_error, fetched) {
        (Some(message), true) => checks.push(invalid_authenticator(message)),
        (_, false) => checks.push(Check::unable_to_validate(TYPE_AUTHENTICATOR_VALID)),
        (None, true) => checks.push(authenticator_ok()),
    }
    if build_error.is_some() || !fetched {
        return Evaluation {
            checks,
            built: None,
            retry,
        };
    }
    Evaluation {
        checks,
        built: Some(TokenAuthenticator::Jwt(Arc::new(authenticator))),
        retry: false,
    }
}

/// Why a connection to the issuer's host fails, if it does.
async fn connection_problem(issuer: &str, ca_bundle_pem: Option<&str>) -> Option<String> {
    let uri: Uri = issuer.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    super::webhook::dial(host, uri.port_u16().unwrap_or(443), ca_bundle_pem)
        .await
        .err()
}

fn invalid_authenticator(message: &str) -> Check {
    Check::failure(
        TYPE_AUTHENTICATOR_VALID,
        "InvalidAuthenticator",
        format!("could not initialize oidc authenticator: {message}"),
    )
}

/// The `DiscoveryURLValid`, `JWKSURLValid` and `JWKSFetchValid` conditions for a failed fetch.
fn fetch_failure(error: &JwksError) -> [Check; 3] {
    let unknown = Check::unable_to_validate;
    match error {
        JwksError::Discovery { .. } | JwksError::IssuerMismatch { .. } => [
            Check::failure(
                TYPE_DISCOVERY_URL_VALID,
                "InvalidDiscoveryProbe",
                format!("could not perform oidc discovery on provider issuer: {error}"),
            ),
            unknown(TYPE_JWKS_URL_VALID),
            unknown(TYPE_JWKS_FETCH_VALID),
        ],
        JwksError::InvalidJwksUri(uri) => {
            let parsed: Option<Uri> = uri.parse().ok();
            let check = match parsed {
                Some(parsed) if parsed.scheme_str().is_some_and(|scheme| scheme != "https") => {
                    Check::failure(
                        TYPE_JWKS_URL_VALID,
                        "InvalidProviderJWKSURLScheme",
                        format!("jwks_uri {uri} has invalid scheme, require 'https'"),
                    )
                }
                _ => Check::failure(
                    TYPE_JWKS_URL_VALID,
                    "InvalidProviderJWKSURL",
                    format!("could not parse provider jwks_uri: {error}"),
                ),
            };
            [discovery_ok(), check, unknown(TYPE_JWKS_FETCH_VALID)]
        }
        JwksError::Jwks { .. } | JwksError::NoUsableKeys(_) => [
            discovery_ok(),
            jwks_url_ok(),
            Check::failure(
                TYPE_JWKS_FETCH_VALID,
                "InvalidCouldNotFetchJWKS",
                format!("could not fetch keys: {error}"),
            ),
        ],
        _ => [
            discovery_ok(),
            jwks_url_ok(),
            Check::unknown(
                TYPE_JWKS_FETCH_VALID,
                format!("unexpected verification error while fetching jwks: {error}"),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use selkie_api::authentication::{ClaimValidationRule as CrdClaimRule, ExtraMapping};

    use super::*;
    use selkie_kube::conditions::Status;

    fn spec(issuer: &str) -> JWTAuthenticatorSpec {
        JWTAuthenticatorSpec {
            issuer: issuer.into(),
            audience: "aud".into(),
            claims: JWTTokenClaims::default(),
            claim_validation_rules: vec![],
            user_validation_rules: vec![],
            tls: None,
            login_authorization: None,
        }
    }

    #[test]
    fn issuer_urls_are_checked_like_pinniped() {
        assert!(check_issuer("https://issuer.example.com/path").is_true());
        assert!(check_issuer("https://issuer.example.com/path?").is_true());
        for (issuer, reason, message) in [
            (
                "http://issuer.example.com",
                "InvalidIssuerURLScheme",
                "spec.issuer http://issuer.example.com has invalid scheme, require 'https'",
            ),
            (
                "https://issuer.example.com/.well-known/openid-configuration",
                "InvalidIssuerURLContainsWellKnownEndpoint",
                "spec.issuer https://issuer.example.com/.well-known/openid-configuration cannot include path '/.well-known/openid-configuration'",
            ),
            (
                "https://issuer.example.com?a=b",
                "InvalidIssuerURLContainsQueryParams",
                "spec.issuer https://issuer.example.com?a=b cannot include query params",
            ),
            (
                "https://issuer.example.com#frag",
                "InvalidIssuerURLContainsFragment",
                "spec.issuer https://issuer.example.com#frag cannot include fragment",
            ),
        ] {
            let check = check_issuer(issuer);
            assert_eq!(check.status, Status::False, "{issuer}");
            assert_eq!(check.reason, reason, "{issuer}");
            assert_eq!(check.message, message, "{issuer}");
        }
        let check = check_issuer("https://bad host/");
        assert_eq!(check.reason, "InvalidIssuerURL");
        assert!(
            check.message.starts_with("spec.issuer URL is invalid: "),
            "{check:?}"
        );
    }

    #[test]
    fn the_spec_becomes_the_filter_configuration() {
        let mut spec = spec("https://issuer.example.com");
        let config = jwt_config("name", &spec, None).unwrap();
        assert_eq!(config.name, "name");
        assert_eq!(config.audiences, ["aud"]);
        assert_eq!(config.username, ClaimMapping::claim("username").into());
        assert_eq!(config.groups, Some(ClaimMapping::claim("groups").into()));

        spec.claims.username = Some("email".into());
        spec.claims.groups = Some(String::new());
        spec.claims.groups_expression = Some("claims.roles".into());
        spec.claims.extra = vec![ExtraMapping {
            key: "example.com/team".into(),
            value_expression: "claims.team".into(),
        }];
        spec.claim_validation_rules = vec![
            CrdClaimRule {
                claim: Some("hd".into()),
                required_value: Some("example.com".into()),
                ..CrdClaimRule::default()
            },
            CrdClaimRule {
                expression: Some("claims.email_verified".into()),
                message: Some("verify".into()),
                ..CrdClaimRule::default()
            },
        ];
        let config = jwt_config("name", &spec, Some("pem".into())).unwrap();
        assert_eq!(config.username, ClaimMapping::claim("email").into());
        assert_eq!(config.groups, Some(Mapping::Expression("claims.roles".into())));
        assert_eq!(
            config.extra.get("example.com/team").map(String::as_str),
            Some("claims.team")
        );
        assert_eq!(config.claim_validation_rules.len(), 2);
        assert_eq!(config.ca_bundle_pem.as_deref(), Some("pem"));

        spec.claims.username_expression = Some("claims.sub".into());
        assert!(jwt_config("name", &spec, None)
            .unwrap_err()
            .contains("mutually exclusive"));
    }

    #[tokio::test]
    async fn nothing_after_a_failed_prerequisite_is_evaluated() {
        let tls = selkie_kube::tls_spec::validate(None, "ns", &super::super::NoSources);
        let evaluation = evaluate("n", &spec("http://issuer.example.com"), &tls, false).await;
        let statuses: Vec<_> = evaluation
            .checks
            .iter()
            .map(|c| (c.type_, c.status, c.reason.as_str()))
            .collect();
        assert_eq!(
            statuses,
            [
                ("TLSConfigurationValid", Status::True, "Success"),
                ("IssuerURLValid", Status::False, "InvalidIssuerURLScheme"),
                ("DiscoveryURLValid", Status::Unknown, "UnableToValidate"),
                ("JWKSURLValid", Status::Unknown, "UnableToValidate"),
                ("JWKSFetchValid", Status::Unknown, "UnableToValidate"),
                ("AuthenticatorValid", Status::Unknown, "UnableToValidate"),
            ]
        );
        assert!(evaluation.built.is_none());
        assert!(!evaluation.retry, "a configuration error waits for a change");
    }

    #[tokio::test]
    async fn an_unreachable_issuer_is_retried() {
        let tls = selkie_kube::tls_spec::validate(None, "ns", &super::super::NoSources);
        let evaluation = evaluate("n", &spec("https://127.0.0.1:1/issuer"), &tls, false).await;
        let discovery = &evaluation.checks[2];
        assert_eq!(discovery.type_, "DiscoveryURLValid");
        assert_eq!(discovery.reason, "InvalidDiscoveryProbe");
        assert!(
            discovery
                .message
                .starts_with("could not perform oidc discovery on provider issuer: "),
            "{discovery:?}"
        );
        assert!(
            discovery.message.contains("(dial tcp 127.0.0.1:1: "),
            "the probe names the cause: {discovery:?}"
        );
        assert!(evaluation.retry);
        assert!(evaluation.built.is_none());
        assert_eq!(evaluation.checks[5].status, Status::Unknown);
    }
}
