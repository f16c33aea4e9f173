//! From verified claims to a user: claim mappings (a claim with a prefix, or a CEL expression),
//! claim validation rules and user validation rules, in Kubernetes' order: username, groups, uid,
//! extra, then claim rules, then user rules.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{ClaimMapping, ClaimValidationRule, JwtConfig, JwtConfigError, Mapping, Verdict};
use crate::{
    expression::{claims_value, user_value, EvaluationError, Expression, Variable},
    identity::UserInfo,
    outcome::RejectReason,
};

/// A [`Mapping`] with its expression compiled.
enum Source {
    Claim(ClaimMapping),
    Expression(Expression),
}

enum ClaimRule {
    RequiredValue { claim: String, value: String },
    Expression { expression: Expression, message: String },
}

/// The compiled mappings and rules of one authenticator.
pub(super) struct Mapper {
    username: Source,
    groups: Option<Source>,
    uid: Option<Source>,
    extra: Vec<(String, Expression)>,
    claim_rules: Vec<ClaimRule>,
    user_rules: Vec<(Expression, String)>,
    /// Whether any expression reads `claims` (the CEL value is only built then).
    uses_claims_expressions: bool,
}

fn compile(field: &str, source: &str, variable: Variable) -> Result<Expression, JwtConfigError> {
    Expression::compile(source, variable).map_err(|error| JwtConfigError::Expression {
        field: field.to_string(),
        error,
    })
}

fn source(field: &'static str, mapping: &Mapping, prefix_allowed: bool) -> Result<Source, JwtConfigError> {
    match mapping {
        Mapping::Claim(claim) if claim.claim.is_empty() => Err(JwtConfigError::EmptyClaimName(field)),
        Mapping::Claim(claim) if !prefix_allowed && !claim.prefix.is_empty() => {
            Err(JwtConfigError::PrefixNotAllowed(field))
        }
        Mapping::Claim(claim) => Ok(Source::Claim(claim.clone())),
        Mapping::Expression(expression) => Ok(Source::Expression(compile(
            &format!("claimMappings.{field}.expression"),
            expression,
            Variable::Claims,
        )?)),
    }
}

/// Kubernetes reserves extra keys under these domains (and their subdomains).
const RESERVED_EXTRA_DOMAINS: [&str; 2] = ["k8s.io", "kubernetes.io"];
/// The impersonation proxy's own extra keys live under this domain.
const RESERVED_PROXY_DOMAIN: &str = "impersonation-proxy.concierge.pinniped.dev";

fn check_extra_key(key: &str) -> Result<(), JwtConfigError> {
    let invalid = |why: &'static str| JwtConfigError::InvalidExtraKey {
        key: key.to_string(),
        why,
    };
    let Some((domain, path)) = key.split_once('/') else {
        return Err(invalid(
            "it must be a domain-prefixed path such as example.org/team",
        ));
    };
    if domain.is_empty() || path.is_empty() || !domain.contains('.') {
        return Err(invalid(
            "it must be a domain-prefixed path such as example.org/team",
        ));
    }
    if key != key.to_lowercase() {
        return Err(invalid("it must be lowercase"));
    }
    // What the impersonation proxy can pass on faithfully as an `Impersonate-Extra-` header
    // (Pinniped's rule); refused here, so the authenticator reports it instead of every login.
    let allowed = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"/-._".contains(&byte);
    if !key.bytes().all(allowed) {
        return Err(invalid(
            "it may hold only lowercase letters, digits, '/', '-', '.' and '_'",
        ));
    }
    if domain == RESERVED_PROXY_DOMAIN || domain.ends_with(&format!(".{RESERVED_PROXY_DOMAIN}")) {
        return Err(invalid(
            "impersonation-proxy.concierge.pinniped.dev and its subdomains belong to the impersonation proxy",
        ));
    }
    if RESERVED_EXTRA_DOMAINS
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
    {
        return Err(invalid("k8s.io, kubernetes.io and their subdomains are reserved"));
    }
    Ok(())
}

impl Mapper {
    /// Compiles the mappings and rules of `config`; every mistake is reported here.
    pub(super) fn new(config: &JwtConfig) -> Result<Self, JwtConfigError> {
        let username = source("username", &config.username, true)?;
        let groups = config
            .groups
            .as_ref()
            .map(|groups| source("groups", groups, true))
            .transpose()?;
        let uid = config
            .uid
            .as_ref()
            .map(|uid| source("uid", uid, false))
            .transpose()?;
        let extra = config
            .extra
            .iter()
            .map(|(key, expression)| {
                check_extra_key(key)?;
                Ok((
                    key.clone(),
                    compile(
                        &format!("claimMappings.extra[{key}].valueExpression"),
                        expression,
                        Variable::Claims,
                    )?,
                ))
            })
            .collect::<Result<Vec<_>, JwtConfigError>>()?;
        let claim_rules = config
            .claim_validation_rules
            .iter()
            .enumerate()
            .map(|(i, rule)| match rule {
                ClaimValidationRule::RequiredValue { claim, .. } if claim.is_empty() => {
                    Err(JwtConfigError::EmptyClaimName("claimValidationRules[].claim"))
                }
                ClaimValidationRule::RequiredValue {
                    claim,
                    required_value,
                } => Ok(ClaimRule::RequiredValue {
                    claim: claim.clone(),
                    value: required_value.clone(),
                }),
                ClaimValidationRule::Expression { expression, message } => Ok(ClaimRule::Expression {
                    expression: compile(
                        &format!("claimValidationRules[{i}].expression"),
                        expression,
                        Variable::Claims,
                    )?,
                    message: message.clone(),
                }),
            })
            .collect::<Result<Vec<_>, JwtConfigError>>()?;
        let user_rules = config
            .user_validation_rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                Ok((
                    compile(
                        &format!("userValidationRules[{i}].expression"),
                        &rule.expression,
                        Variable::User,
                    )?,
                    rule.message.clone(),
                ))
            })
            .collect::<Result<Vec<_>, JwtConfigError>>()?;

        let claim_expressions = || {
            [&username]
                .into_iter()
                .chain(groups.iter())
                .chain(uid.iter())
                .filter_map(|source| match source {
                    Source::Expression(expression) => Some(expression),
                    Source::Claim(_) => None,
                })
                .chain(extra.iter().map(|(_, expression)| expression))
                .chain(claim_rules.iter().filter_map(|rule| match rule {
                    ClaimRule::Expression { expression, .. } => Some(expression),
                    ClaimRule::RequiredValue { .. } => None,
                }))
        };
        // Kubernetes' rule: a user name built from `claims.email` must be backed by a check of
        // `claims.email_verified` somewhere in the mappings or claim rules.
        if let Source::Expression(expression) = &username {
            if expression.reads_claim("email")
                && !claim_expressions().any(|e| e.reads_claim("email_verified"))
            {
                return Err(JwtConfigError::EmailVerifiedNotChecked);
            }
        }
        let uses_claims_expressions = claim_expressions().next().is_some();
        Ok(Self {
            username,
            groups,
            uid,
            extra,
            claim_rules,
            user_rules,
            uses_claims_expressions,
        })
    }

    /// Maps verified claims to a user, then applies the validation rules.
    pub(super) fn user(&self, authenticator: &str, claims: &Map<String, Value>) -> Result<UserInfo, Verdict> {
        let reject = |reason| Verdict::Rejected(reason);
        let cel_claims = if self.uses_claims_expressions {
            claims_value(claims)
        } else {
            cel::Value::Null
        };
        let unusable = |what: &str, expression: &Expression, error: EvaluationError| {
            tracing::debug!(authenticator, mapping = what, expression = expression.source(), %error,
                "a claim expression did not produce a usable value");
            reject(RejectReason::ClaimInvalid)
        };
        let failed = |expression: &str, message: &str| {
            tracing::debug!(authenticator, expression, message, "a validation rule failed");
            reject(RejectReason::ValidationRuleFailed)
        };

        let username = match &self.username {
            Source::Claim(mapping) => {
                let name = match claims.get(&mapping.claim) {
                    Some(Value::String(name)) if !name.is_empty() => name,
                    Some(Value::String(_)) | None => return Err(reject(RejectReason::EmptyUsername)),
                    Some(_) => return Err(reject(RejectReason::ClaimInvalid)),
                };
                // An email address is only a user name if the IdP did not say it is unverified.
                if mapping.claim == "email"
                    && claims
                        .get("email_verified")
                        .is_some_and(|v| v != &Value::Bool(true))
                {
                    return Err(reject(RejectReason::ClaimInvalid));
                }
                format!("{}{name}", mapping.prefix)
            }
            Source::Expression(expression) => expression
                .evaluate_string(Variable::Claims, &cel_claims)
                .map_err(|e| unusable("username", expression, e))?,
        };
        if username.is_empty() {
            return Err(reject(RejectReason::EmptyUsername));
        }
        let groups = match &self.groups {
            None => Vec::new(),
            Some(Source::Claim(mapping)) => strings(claims.get(&mapping.claim))
                .ok_or(reject(RejectReason::ClaimInvalid))?
                .into_iter()
                .map(|group| format!("{}{group}", mapping.prefix))
                .collect(),
            Some(Source::Expression(expression)) => expression
                .evaluate_strings(Variable::Claims, &cel_claims)
                .map_err(|e| unusable("groups", expression, e))?,
        };
        let uid = match &self.uid {
            None => None,
            Some(Source::Claim(mapping)) => match claims.get(&mapping.claim) {
                Some(Value::String(uid)) => Some(uid.clone()),
                _ => return Err(reject(RejectReason::ClaimInvalid)),
            },
            Some(Source::Expression(expression)) => Some(
                expression
                    .evaluate_string(Variable::Claims, &cel_claims)
                    .map_err(|e| unusable("uid", expression, e))?,
            ),
        }
        .filter(|uid| !uid.is_empty());
        let mut extra = BTreeMap::new();
        for (key, expression) in &self.extra {
            let values = expression
                .evaluate_strings(Variable::Claims, &cel_claims)
                .map_err(|e| unusable(key, expression, e))?;
            if !values.is_empty() {
                extra.insert(key.clone(), values);
            }
        }

        for rule in &self.claim_rules {
            match rule {
                ClaimRule::RequiredValue { claim, value } => {
                    if claims.get(claim).and_then(Value::as_str) != Some(value.as_str()) {
                        return Err(failed(claim, "a required claim is missing or has another value"));
                    }
                }
                ClaimRule::Expression { expression, message } => {
                    let passed = expression
                        .evaluate_bool(Variable::Claims, &cel_claims)
                        .map_err(|e| unusable("claimValidationRules", expression, e))?;
                    if !passed {
                        return Err(failed(expression.source(), message));
                    }
                }
            }
        }

        let user = UserInfo {
            username,
            uid,
            groups,
            extra,
        };
        if !self.user_rules.is_empty() {
            let cel_user = user_value(&user);
            for (expression, message) in &self.user_rules {
                let passed = expression
                    .evaluate_bool(Variable::User, &cel_user)
                    .map_err(|e| unusable("userValidationRules", expression, e))?;
                if !passed {
                    return Err(failed(expression.source(), message));
                }
            }
        }
        Ok(user)
    }
}

/// A claim that is a string or a list of strings, as a list; a missing claim is an empty list;
/// anything else is `None`.
pub(super) fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    match value {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect(),
        Some(_) => None,
    }
}
