//! Identity transforms and policies (a FederationDomain's `spec.identityProviders[].transforms`:
//! CEL expressions, constants, examples) into `selkie_supervisor::fuzzing::Transforms`: compiled
//! as the FederationDomain reconciler compiles them, then run on an identity as every login and
//! refresh runs them, at and beyond the compilation budget (`MAX_EXPRESSION_BYTES`, nesting).
//!
//! Input: `selector, username, 0x00, groups split by 0x01, 0x00, items split by 0x00`. An item's
//! first byte picks what it is (low two bits): a `username/v1`, `groups/v1` or `policy/v1`
//! expression (the rest; a policy's message after a 0x01), or a constant (`name 0x01 value`, a
//! string list split by 0x02 when bit 2 is set). Selector bits 0-1: the first expression as it is,
//! padded with spaces to exactly `MAX_EXPRESSION_BYTES`, to one byte more, or — when the spec
//! compiles — repeated (joined by `+`) [`MAX_COPIES`] times or as often as the budget allows; bits
//! 2-4: the groups repeated 2^n times; bit 5: the expressions (so changed) repeated eight times; bit 6: the
//! username repeated 16 times; bit 7: the constants' names made valid identifiers.
//!
//! Invariants (a violation panics; an evaluation that does not end or exhausts memory is found by
//! libFuzzer's timeout and memory limit):
//!
//! * compilation fails exactly with one message or more, each naming its identity provider, and
//!   always when an expression is longer than the budget; padding an expression with spaces up to
//!   the budget does not change whether it compiles;
//! * a run either fails with a message, or refuses with a non-empty message, or allows a
//!   non-blank username (unless there is no expression) with sorted groups without duplicates;
//! * when two runs agree, an example expecting exactly that outcome passes (`check_examples`),
//!   and an example expecting the opposite fails once.

#![no_main]

use libfuzzer_sys::fuzz_target;
use selkie_api::supervisor_config::{
    ConstantType, ExpressionType, FederationDomainTransforms, FederationDomainTransformsConstant,
    FederationDomainTransformsExample, FederationDomainTransformsExampleExpects,
    FederationDomainTransformsExpression,
};
use selkie_filters::expression::MAX_EXPRESSION_BYTES;
use selkie_fuzz::text;
use selkie_supervisor::fuzzing::{TransformOutcome, Transforms};

/// How often the first expression is repeated at most (parsing a 10 KiB sum takes a third of a
/// second here).
const MAX_COPIES: usize = 32;
/// The index of the identity provider the transforms belong to.
const IDP_INDEX: usize = 3;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.split(|byte| *byte == 0);
    let mut username = text(parts.next().unwrap_or_default());
    if selector & 0x40 != 0 {
        username = username.repeat(16);
    }
    let mut groups: Vec<String> = parts
        .next()
        .unwrap_or_default()
        .split(|byte| *byte == 1)
        .filter(|group| !group.is_empty())
        .map(text)
        .collect();
    for _ in 0..((selector >> 2) & 0b111) {
        groups.extend(groups.clone());
    }
    let mut spec = FederationDomainTransforms::default();
    for item in parts {
        let Some((&kind, rest)) = item.split_first() else {
            continue;
        };
        let (first, second) = match rest.iter().position(|byte| *byte == 1) {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let expression = |r#type| FederationDomainTransformsExpression {
            r#type,
            expression: text(first),
            message: second.map(text),
        };
        match kind & 0b11 {
            0 => spec.expressions.push(expression(ExpressionType::UsernameV1)),
            1 => spec.expressions.push(expression(ExpressionType::GroupsV1)),
            2 => spec.expressions.push(expression(ExpressionType::PolicyV1)),
            _ => {
                let mut name = text(first);
                if selector & 0x80 != 0 {
                    name = identifier(&name);
                }
                let list = kind & 0b100 != 0;
                spec.constants.push(FederationDomainTransformsConstant {
                    name,
                    r#type: if list {
                        ConstantType::StringList
                    } else {
                        ConstantType::String
                    },
                    string_value: (!list).then(|| text(second.unwrap_or_default())),
                    string_list_value: if list {
                        second
                            .unwrap_or_default()
                            .split(|byte| *byte == 2)
                            .map(text)
                            .collect()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
    }
    let padding = selector & 0b11;
    if padding != 0 {
        let Some(first) = spec
            .expressions
            .first()
            .map(|expression| expression.expression.clone())
        else {
            return;
        };
        // Whether it compiles unchanged (not needed one byte beyond the budget).
        let unpadded = padding != 2 && compiles(&spec);
        let padded = match padding {
            1 | 2 => {
                let target = MAX_EXPRESSION_BYTES + usize::from(padding == 2);
                if first.len() > target {
                    return;
                }
                format!("{first}{}", " ".repeat(target - first.len()))
            }
            _ => {
                // Only an expression that compiles: the parser's error recovery on a long
                // invalid one is slow and no concern of evaluation.
                if first.is_empty() || !unpadded {
                    return;
                }
                let copies = (MAX_EXPRESSION_BYTES / (first.len() + 3)).clamp(1, MAX_COPIES);
                vec![format!("({first})"); copies].join("+")
            }
        };
        spec.expressions[0].expression = padded;
        if padding == 1 {
            assert_eq!(
                compiles(&spec),
                unpadded,
                "padding an expression with spaces to the budget changed whether it compiles"
            );
        }
    }
    if selector & 0x20 != 0 {
        let once = spec.expressions.clone();
        for _ in 0..7 {
            spec.expressions.extend(once.iter().cloned());
        }
    }
    let transforms = match Transforms::compile(&spec, IDP_INDEX) {
        Ok(transforms) => transforms,
        Err(errors) => {
            assert!(!errors.is_empty(), "a compilation failed without saying why");
            let prefix = format!("spec.identityProvider[{IDP_INDEX}].transforms.");
            for error in &errors {
                assert!(
                    error.starts_with(&prefix),
                    "an error that names no place: {error}"
                );
            }
            return;
        }
    };
    for expression in &spec.expressions {
        assert!(
            expression.expression.len() <= MAX_EXPRESSION_BYTES,
            "an expression of {} bytes compiled",
            expression.expression.len()
        );
    }
    let outcome = transforms.apply(&username, &groups);
    match &outcome {
        Ok(TransformOutcome::Allowed { username, groups }) => {
            // With no expression, the identity passes unchanged (and is never transformed).
            assert!(
                spec.expressions.is_empty() || !username.trim().is_empty(),
                "a blank username was allowed"
            );
            assert!(
                groups.windows(2).all(|pair| pair[0] < pair[1]),
                "groups not sorted or with duplicates: {groups:?}"
            );
        }
        Ok(TransformOutcome::Rejected(message)) => assert!(!message.is_empty(), "a refusal without message"),
        Err(message) => assert!(!message.is_empty(), "a failure without message"),
    }
    if username.is_empty() || transforms.apply(&username, &groups) != outcome {
        return; // examples name a user; a run that depends on map order has no one outcome
    }
    let (matching, opposite) = examples(&username, &groups, &outcome);
    let failures = transforms.check_examples(&[matching], IDP_INDEX);
    match &outcome {
        Ok(_) => assert!(
            failures.is_empty(),
            "an example of the outcome failed: {failures:?}"
        ),
        Err(_) => assert_eq!(failures.len(), 1, "{failures:?}"),
    }
    let failures = transforms.check_examples(&[opposite], IDP_INDEX);
    assert!(!failures.is_empty(), "an example of another outcome passed");
});

/// Whether `spec` compiles.
fn compiles(spec: &FederationDomainTransforms) -> bool {
    Transforms::compile(spec, IDP_INDEX).is_ok()
}

/// `name` as a CEL identifier: ASCII letters, digits and `_`, starting with a letter.
fn identifier(name: &str) -> String {
    let mut identifier: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if !identifier.starts_with(|c: char| c.is_ascii_alphabetic()) {
        identifier.insert(0, 'c');
    }
    identifier
}

/// An example expecting `outcome` for the user, and one expecting something else.
fn examples(
    username: &str,
    groups: &[String],
    outcome: &Result<TransformOutcome, String>,
) -> (
    FederationDomainTransformsExample,
    FederationDomainTransformsExample,
) {
    let example = |expects| FederationDomainTransformsExample {
        username: username.to_string(),
        groups: groups.to_vec(),
        expects,
    };
    let (matching, opposite) = match outcome {
        Ok(TransformOutcome::Allowed { username, groups }) => (
            FederationDomainTransformsExampleExpects {
                username: Some(username.clone()),
                groups: groups.clone(),
                ..Default::default()
            },
            FederationDomainTransformsExampleExpects {
                rejected: true,
                ..Default::default()
            },
        ),
        Ok(TransformOutcome::Rejected(message)) => (
            FederationDomainTransformsExampleExpects {
                rejected: true,
                message: Some(message.clone()),
                ..Default::default()
            },
            FederationDomainTransformsExampleExpects {
                username: Some(username.to_string()),
                ..Default::default()
            },
        ),
        Err(_) => (
            FederationDomainTransformsExampleExpects::default(),
            FederationDomainTransformsExampleExpects::default(),
        ),
    };
    (example(matching), example(opposite))
}
