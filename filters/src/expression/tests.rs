use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn claims(value: serde_json::Value) -> Value {
    claims_value(value.as_object().unwrap())
}

#[test]
fn mistakes_are_caught_when_compiling() {
    let cases = [
        ("claims.sub +", Variable::Claims, "does not parse"),
        ("user.username", Variable::Claims, "refers to \"user\""),
        ("claims.sub", Variable::User, "refers to \"claims\""),
        ("request.path == '/'", Variable::Claims, "refers to \"request\""),
        ("frobnicate(claims.sub)", Variable::Claims, "calls frobnicate()"),
        ("claims.sub.frobnicate()", Variable::Claims, "calls frobnicate()"),
    ];
    for (source, variable, wanted) in cases {
        let error = Expression::compile(source, variable).unwrap_err().to_string();
        assert!(error.contains(wanted), "{source}: {error}");
        assert!(!error.contains('\n'), "one line: {error}");
    }
}

#[test]
fn comprehension_variables_types_and_library_functions_are_accepted() {
    for source in [
        "claims.groups.exists(g, g == 'admins')",
        "claims.groups.all(g, claims.groups.exists(h, h == g))",
        "claims.groups.map(g, 'oidc:' + g)",
        "type(claims.sub) == string",
        "claims.email.lowerAscii().endsWith('@example.com')",
        "claims.roles.split(',')",
        "has(claims.tenant) ? claims.tenant : ''",
        "size(claims.sub) > 0 && claims.sub.matches('^[a-z]+$')",
    ] {
        Expression::compile(source, Variable::Claims).unwrap_or_else(|e| panic!("{source}: {e}"));
    }
}

#[test]
fn claims_read_are_reported() {
    let expression = Expression::compile(
        "claims.email_verified ? claims.email : has(claims.sub) ? claims.sub : ''",
        Variable::Claims,
    )
    .unwrap();
    for claim in ["email", "email_verified", "sub"] {
        assert!(expression.reads_claim(claim), "{claim}");
    }
    assert!(!expression.reads_claim("groups"));
}

#[test]
fn values_are_typed_like_kubernetes_claims() {
    let value = claims(json!({
        "sub": "alice", "n": 3, "f": 1.5, "ok": true, "nested": {"a": ["x", "y"]}, "none": null
    }));
    let check = |source: &str| {
        Expression::compile(source, Variable::Claims)
            .unwrap()
            .evaluate_bool(Variable::Claims, &value)
            .unwrap()
    };
    assert!(check("claims.n == 3 && claims.n > 2"));
    assert!(check("claims.f == 1.5"));
    assert!(check("claims.ok"));
    assert!(check("claims.nested.a[1] == 'y'"));
    assert!(check("claims.none == null"));
    assert!(!check("has(claims.missing)"));
}

#[test]
fn results_of_the_wrong_type_and_missing_claims_are_errors() {
    let value = claims(json!({"sub": "alice", "n": 3, "mixed": ["a", 1]}));
    let expr = |source: &str| Expression::compile(source, Variable::Claims).unwrap();
    assert_eq!(
        expr("claims.n").evaluate_string(Variable::Claims, &value),
        Err(EvaluationError::WrongType("a string"))
    );
    assert_eq!(
        expr("claims.sub").evaluate_bool(Variable::Claims, &value),
        Err(EvaluationError::WrongType("a boolean"))
    );
    assert!(matches!(
        expr("claims.mixed").evaluate_strings(Variable::Claims, &value),
        Err(EvaluationError::WrongType(_))
    ));
    assert!(matches!(
        expr("claims.missing").evaluate_string(Variable::Claims, &value),
        Err(EvaluationError::Execution(_))
    ));
}

#[test]
fn string_lists_drop_empty_values() {
    let value = claims(json!({"groups": ["a", "", "b"], "empty": "", "one": "x"}));
    let strings = |source: &str| {
        Expression::compile(source, Variable::Claims)
            .unwrap()
            .evaluate_strings(Variable::Claims, &value)
            .unwrap()
    };
    assert_eq!(strings("claims.groups"), vec!["a", "b"]);
    assert_eq!(strings("claims.empty"), Vec::<String>::new());
    assert_eq!(strings("claims.one"), vec!["x"]);
    assert_eq!(strings("null"), Vec::<String>::new());
}

#[test]
fn the_user_variable_has_every_field() {
    let user = UserInfo {
        username: "oidc:alice".into(),
        uid: None,
        groups: vec!["devs".into()],
        extra: BTreeMap::from([("example.com/tenant".to_string(), vec!["t1".to_string()])]),
    };
    let value = user_value(&user);
    for (source, wanted) in [
        ("!user.username.startsWith('system:')", true),
        ("user.uid == ''", true),
        ("'devs' in user.groups", true),
        ("user.extra['example.com/tenant'] == ['t1']", true),
        ("size(user.groups) == 0", false),
    ] {
        let got = Expression::compile(source, Variable::User)
            .unwrap()
            .evaluate_bool(Variable::User, &value)
            .unwrap();
        assert_eq!(got, wanted, "{source}");
    }
}
