//! A FederationDomain's identity transforms and policies for one identity provider
//! (`spec.identityProviders[].transforms`, Pinniped's): CEL expressions run in order on the
//! upstream username and groups at every login and every refresh.
//!
//! * `username/v1` returns the new username (a string);
//! * `groups/v1` returns the new groups (a list of strings);
//! * `policy/v1` returns whether the login may go on; `false` refuses it with the expression's
//!   `message` (or [`DEFAULT_REJECTION`]) and stops.
//!
//! Expressions see `username`, `groups`, and the constants as `strConst.<name>` and
//! `strListConst.<name>`. They are compiled by the reconciler, with a cost budget (no deeper than
//! two nested comprehensions, at most 10 KiB: see [`selkie_filters::expression`]), so an
//! expression that could stall a login never serves; the `examples` are run there too.

use std::collections::BTreeMap;

use cel::Value;
use selkie_api::supervisor_config::{ConstantType, ExpressionType, FederationDomainTransforms};
use selkie_filters::expression::Expression;

/// A policy's refusal when it has no message of its own (Pinniped's words).
pub(crate) const DEFAULT_REJECTION: &str = "authentication was rejected by a configured policy";

/// How large transforms may make an identity (its username's bytes, and each group's plus one):
/// a step whose result is larger than [`IDENTITY_GROWTH_FACTOR`] times the identity the transforms
/// were given, plus this, fails the login. Each expression's cost is bounded for bounded inputs
/// (the compilation budget), but each step's result is the next step's input: unbounded, steps
/// that each copy what they are given a few times (`username + username`) make an identity
/// exponentially large in the number of steps. Bounded, every step's input is at most a few times
/// the upstream identity.
pub(crate) const IDENTITY_GROWTH_BYTES: usize = 64 * 1024;
/// See [`IDENTITY_GROWTH_BYTES`]: room for prefixes and suffixes on every group.
pub(crate) const IDENTITY_GROWTH_FACTOR: usize = 4;

/// The variables expressions may use.
const VARIABLES: [&str; 4] = ["username", "groups", "strConst", "strListConst"];

/// What the transforms made of an identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The login goes on with this username and these groups (sorted, without duplicates).
    Allowed {
        /// The username.
        username: String,
        /// The groups.
        groups: Vec<String>,
    },
    /// A policy refused the login, with this message.
    Rejected(String),
}

#[derive(Debug, Clone)]
enum Step {
    Username(Expression),
    Groups(Expression),
    Policy(Expression, String),
}

/// The compiled transforms of one identity provider of a FederationDomain (none: the identity
/// passes unchanged).
#[derive(Debug, Clone, Default)]
pub struct Transforms {
    steps: Vec<Step>,
    string_constants: BTreeMap<String, String>,
    list_constants: BTreeMap<String, Vec<String>>,
}

impl Transforms {
    /// Compiles `spec`, the transforms of `.spec.identityProviders[idp_index]`. Fails with one
    /// message per invalid expression, in Pinniped's words (`TransformsExpressionsValid`).
    pub fn compile(spec: &FederationDomainTransforms, idp_index: usize) -> Result<Self, Vec<String>> {
        let mut transforms = Self::default();
        let mut errors = Vec::new();
        for constant in &spec.constants {
            let duplicate = match constant.r#type {
                ConstantType::String => transforms
                    .string_constants
                    .insert(
                        constant.name.clone(),
                        constant.string_value.clone().unwrap_or_default(),
                    )
                    .is_some(),
                ConstantType::StringList => transforms
                    .list_constants
                    .insert(constant.name.clone(), constant.string_list_value.clone())
                    .is_some(),
            };
            if duplicate {
                errors.push(format!(
                    "spec.identityProvider[{idp_index}].transforms.constants has more than one constant named {:?}",
                    constant.name
                ));
            }
        }
        for (index, expression) in spec.expressions.iter().enumerate() {
            match Expression::compile_for(&expression.expression, &VARIABLES, true) {
                Ok(compiled) => transforms.steps.push(match expression.r#type {
                    ExpressionType::UsernameV1 => Step::Username(compiled),
                    ExpressionType::GroupsV1 => Step::Groups(compiled),
                    ExpressionType::PolicyV1 => Step::Policy(
                        compiled,
                        expression
                            .message
                            .clone()
                            .filter(|message| !message.is_empty())
                            .unwrap_or_else(|| DEFAULT_REJECTION.to_string()),
                    ),
                }),
                Err(error) => errors.push(format!(
                    "spec.identityProvider[{idp_index}].transforms.expressions[{index}].expression was invalid:\n{error}"
                )),
            }
        }
        if errors.is_empty() {
            Ok(transforms)
        } else {
            Err(errors)
        }
    }

    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Runs the expressions in order on `username` and `groups`. Fails when an expression fails
    /// or returns the wrong type, leaves an empty username, or makes the identity too large
    /// (more than four times the identity given, plus 64 KiB); the error names the expression.
    pub fn apply(&self, username: &str, groups: &[String]) -> Result<Outcome, String> {
        let limit = identity_bytes(username, groups)
            .saturating_mul(IDENTITY_GROWTH_FACTOR)
            .saturating_add(IDENTITY_GROWTH_BYTES);
        let mut username = username.to_string();
        let mut groups = groups.to_vec();
        let constants = (
            Value::from(
                self.string_constants
                    .iter()
                    .map(|(name, value)| (name.clone(), Value::from(value.clone())))
                    .collect::<std::collections::HashMap<String, Value>>(),
            ),
            Value::from(
                self.list_constants
                    .iter()
                    .map(|(name, values)| (name.clone(), strings(values)))
                    .collect::<std::collections::HashMap<String, Value>>(),
            ),
        );
        for (index, step) in self.steps.iter().enumerate() {
            let bindings = [
                ("username", Value::from(username.clone())),
                ("groups", strings(&groups)),
                ("strConst", constants.0.clone()),
                ("strListConst", constants.1.clone()),
            ];
            let failed = |reason: String| format!("identity transformation at index {index}: {reason}");
            let (expression, wanted) = match step {
                Step::Username(expression) => (expression, "a string"),
                Step::Groups(expression) => (expression, "a list of strings"),
                Step::Policy(expression, _) => (expression, "a boolean"),
            };
            let value = expression
                .evaluate_with(&bindings)
                .map_err(|error| failed(error.to_string()))?;
            let wrong = || failed(format!("the expression did not return {wanted}"));
            match (step, value) {
                (Step::Username(_), Value::String(new)) => username = new.as_str().to_string(),
                (Step::Groups(_), Value::List(items)) => {
                    groups = items
                        .iter()
                        .map(|item| match item {
                            Value::String(group) => Ok(group.as_str().to_string()),
                            _ => Err(wrong()),
                        })
                        .collect::<Result<_, _>>()?;
                }
                (Step::Policy(_, message), Value::Bool(allowed)) => {
                    if !allowed {
                        return Ok(Outcome::Rejected(message.clone()));
                    }
                }
                _ => return Err(wrong()),
            }
            if username.trim().is_empty() {
                return Err(
                    "identity transformation returned an empty username, which is not allowed".into(),
                );
            }
            let size = identity_bytes(&username, &groups);
            if size > limit {
                return Err(failed(format!(
                    "the identity it returned has {size} bytes, more than the {limit} allowed"
                )));
            }
        }
        groups.sort();
        groups.dedup();
        Ok(Outcome::Allowed { username, groups })
    }

    /// Runs `examples` (`.spec.identityProviders[idp_index].transforms.examples`): one message per
    /// failed example, in Pinniped's words (`TransformsExamplesPassed`).
    pub fn check_examples(
        &self,
        examples: &[selkie_api::supervisor_config::FederationDomainTransformsExample],
        idp_index: usize,
    ) -> Vec<String> {
        let mut failures = Vec::new();
        for (index, example) in examples.iter().enumerate() {
            let failed = |expected: String, actual: String| {
                format!(
                    ".spec.identityProviders[{idp_index}].transforms.examples[{index}] example failed:\nexpected: {expected}\nactual:   {actual}"
                )
            };
            let expects = &example.expects;
            match self.apply(&example.username, &example.groups) {
                Err(error) => failures.push(failed(
                    "no transformation errors".into(),
                    format!("transformations resulted in an unexpected error {error:?}"),
                )),
                Ok(Outcome::Rejected(message)) if !expects.rejected => failures.push(failed(
                    "authentication not to be rejected".into(),
                    format!("authentication was rejected with message {message:?}"),
                )),
                Ok(Outcome::Rejected(message)) => {
                    let wanted = expects
                        .message
                        .clone()
                        .filter(|m| !m.is_empty())
                        .unwrap_or_else(|| DEFAULT_REJECTION.to_string());
                    if wanted != message {
                        failures.push(failed(
                            format!("authentication rejection message {wanted:?}"),
                            format!("authentication rejection message {message:?}"),
                        ));
                    }
                }
                Ok(Outcome::Allowed { .. }) if expects.rejected => failures.push(failed(
                    "authentication to be rejected".into(),
                    "authentication was not rejected".into(),
                )),
                Ok(Outcome::Allowed { username, groups }) => {
                    let wanted_username = expects.username.clone().unwrap_or_default();
                    if wanted_username != username {
                        failures.push(failed(
                            format!("username {wanted_username:?}"),
                            format!("username {username:?}"),
                        ));
                    }
                    let mut wanted_groups = expects.groups.clone();
                    wanted_groups.sort();
                    wanted_groups.dedup();
                    if wanted_groups != groups {
                        failures.push(failed(
                            format!("groups [{}]", quoted(&wanted_groups)),
                            format!("groups [{}]", quoted(&groups)),
                        ));
                    }
                }
            }
        }
        failures
    }
}

/// The size of an identity: its username's bytes, and each group's plus one (so that many empty
/// groups count too).
fn identity_bytes(username: &str, groups: &[String]) -> usize {
    groups
        .iter()
        .fold(username.len(), |size, group| size.saturating_add(group.len() + 1))
}

fn strings(values: &[String]) -> Value {
    Value::List(std::sync::Arc::new(
        values.iter().map(|value| Value::from(value.clone())).collect(),
    ))
}

fn quoted(values: &[String]) -> String {
    values
        .iter()
        .map(|value| format!("{value:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> FederationDomainTransforms {
        serde_yaml::from_str(yaml).unwrap()
    }

    const PREFIX_AND_POLICY: &str = r#"
constants:
- {name: prefix, type: string, stringValue: "ldap:"}
- {name: banned, type: stringList, stringListValue: [contractors]}
expressions:
- {type: policy/v1, expression: "!groups.exists(g, g in strListConst.banned)", message: "contractors may not log in"}
- {type: username/v1, expression: "strConst.prefix + username"}
- {type: groups/v1, expression: "groups.map(g, strConst.prefix + g)"}
examples:
- {username: pinny, groups: [seals, ops, seals], expects: {username: "ldap:pinny", groups: ["ldap:ops", "ldap:seals"]}}
- {username: walrus, groups: [contractors], expects: {rejected: true, message: "contractors may not log in"}}
"#;

    #[test]
    fn expressions_run_in_order_and_a_policy_stops_the_login() {
        let spec = spec(PREFIX_AND_POLICY);
        let transforms = Transforms::compile(&spec, 0).unwrap();
        assert_eq!(
            transforms.apply("pinny", &["seals".into(), "ops".into()]),
            Ok(Outcome::Allowed {
                username: "ldap:pinny".into(),
                groups: vec!["ldap:ops".into(), "ldap:seals".into()],
            })
        );
        assert_eq!(
            transforms.apply("walrus", &["contractors".into()]),
            Ok(Outcome::Rejected("contractors may not log in".into()))
        );
        assert!(transforms.check_examples(&spec.examples, 0).is_empty());
    }

    #[test]
    fn failing_examples_say_what_was_expected_and_what_came() {
        let mut spec = spec(PREFIX_AND_POLICY);
        spec.examples[0].expects.username = Some("pinny".into());
        spec.examples[1].expects.rejected = false;
        let failures = Transforms::compile(&spec, 2)
            .unwrap()
            .check_examples(&spec.examples, 2);
        assert_eq!(
            failures,
            [
                ".spec.identityProviders[2].transforms.examples[0] example failed:\nexpected: username \"pinny\"\nactual:   username \"ldap:pinny\"",
                ".spec.identityProviders[2].transforms.examples[1] example failed:\nexpected: authentication not to be rejected\nactual:   authentication was rejected with message \"contractors may not log in\"",
            ]
        );
    }

    #[test]
    fn invalid_and_too_costly_expressions_are_refused_at_compilation() {
        let spec = spec(
            r#"
expressions:
- {type: username/v1, expression: "username +"}
- {type: groups/v1, expression: "claims.groups"}
- {type: policy/v1, expression: "groups.all(a, groups.all(b, groups.all(c, a + b + c != username)))"}
- {type: username/v1, expression: "username"}
"#,
        );
        let errors = Transforms::compile(&spec, 1).unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0]
            .starts_with("spec.identityProvider[1].transforms.expressions[0].expression was invalid:\n"));
        assert!(errors[1].contains("\"claims\""), "{}", errors[1]);
        assert!(errors[2].contains("exceeds the cost budget"), "{}", errors[2]);
    }

    #[test]
    fn wrong_types_and_empty_usernames_are_errors_not_identities() {
        let spec = spec(
            r#"
expressions:
- {type: username/v1, expression: "groups"}
"#,
        );
        let error = Transforms::compile(&spec, 0)
            .unwrap()
            .apply("pinny", &[])
            .unwrap_err();
        assert!(error.contains("index 0") && error.contains("a string"), "{error}");
        let spec = spec_empty_username();
        let error = Transforms::compile(&spec, 0)
            .unwrap()
            .apply("pinny", &[])
            .unwrap_err();
        assert!(error.contains("empty username"), "{error}");
    }

    /// Found with the `supervisor_cel` fuzz target: steps that each return their input copied a
    /// few times grew the identity exponentially down the list — eight steps of 32 copies made a
    /// 5-byte username gigabytes long and exhausted memory. Now a step's result may not outgrow
    /// four times the identity given plus [`IDENTITY_GROWTH_BYTES`].
    #[test]
    fn steps_cannot_grow_the_identity_without_bound() {
        let copies = vec!["(username)"; 32].join("+");
        let growing = format!("{{type: username/v1, expression: \"{copies}\"}}");
        let spec_of = |expressions: Vec<String>| spec(&format!("expressions: [{}]", expressions.join(", ")));
        let transforms = Transforms::compile(&spec_of(vec![growing; 8]), 0).unwrap();
        let error = transforms.apply("pinny", &[]).unwrap_err();
        assert_eq!(
            error,
            "identity transformation at index 2: the identity it returned has 163840 bytes, more than the 65556 allowed"
        );
        // Groups count too, each at least a byte: copying a list of empty groups is growth.
        let copying = "{type: groups/v1, expression: \"groups + groups + groups + groups\"}".to_string();
        let error = Transforms::compile(&spec_of(vec![copying; 12]), 0)
            .unwrap()
            .apply("pinny", &[String::new()])
            .unwrap_err();
        assert!(error.contains("more than the 65560 allowed"), "{error}");
        // A large identity may still be transformed, up to four times its size.
        let big: Vec<String> = (0..20_000).map(|n| format!("group-{n}")).collect();
        let prefixed = spec_of(vec![
            "{type: groups/v1, expression: \"groups.map(g, 'ldap:' + g)\"}".into(),
        ]);
        let allowed = Transforms::compile(&prefixed, 0).unwrap().apply("pinny", &big);
        assert!(matches!(allowed, Ok(Outcome::Allowed { groups, .. }) if groups.len() == big.len()));
        let five = spec_of(vec![
            "{type: groups/v1, expression: \"groups + groups + groups + groups + groups.map(g, g + '.')\"}"
                .into(),
        ]);
        let error = Transforms::compile(&five, 0)
            .unwrap()
            .apply("pinny", &big)
            .unwrap_err();
        assert!(
            error.starts_with("identity transformation at index 0: the identity it returned has"),
            "{error}"
        );
    }

    fn spec_empty_username() -> FederationDomainTransforms {
        spec(
            r#"
expressions:
- {type: username/v1, expression: "\"  \""}
"#,
        )
    }
}
