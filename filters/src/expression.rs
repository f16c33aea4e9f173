//! CEL expressions of Kubernetes' structured AuthenticationConfiguration (claim mappings, claim
//! and user validation rules), on the `cel` crate.
//!
//! An [`Expression`] is compiled when an authenticator is configured, and compilation is where
//! mistakes are caught: a syntax error, a variable other than the one the expression may see
//! (`claims` for claim mappings and claim rules, `user` for user rules), or a function that does
//! not exist is an [`ExpressionError`], so a broken rule never reaches a request. Evaluation
//! happens once per verified token (results are cached with the token), against variables built
//! by [`claims_value`] and [`user_value`].

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, OnceLock},
};

use cel::{
    common::ast::{EntryExpr, Expr, IdedExpr},
    Context, Env, ExecutionError, Program, Value,
};

use crate::identity::UserInfo;

/// The variable an expression is evaluated against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    /// `claims`: the token's claims (claim mappings and claim validation rules).
    Claims,
    /// `user`: the mapped user, `{username, uid, groups, extra}` (user validation rules).
    User,
}

impl Variable {
    /// The name expressions use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Claims => "claims",
            Self::User => "user",
        }
    }
}

/// Why an expression cannot be used; reported when the authenticator is configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExpressionError {
    /// The expression does not parse.
    #[error("CEL expression {expression:?} does not parse: {reason}")]
    Syntax {
        /// The expression as configured.
        expression: String,
        /// The parser's first complaint.
        reason: String,
    },
    /// The expression names a variable it cannot see.
    #[error("CEL expression {expression:?} refers to {name:?}, but only {allowed} may be used here")]
    UnknownVariable {
        /// The expression as configured.
        expression: String,
        /// The unknown name.
        name: String,
        /// The variables it may use, quoted and comma-separated.
        allowed: String,
    },
    /// The expression could cost too much to evaluate: it nests comprehensions (`map`, `all`,
    /// `exists`, `filter`) deeper than [`MAX_COMPREHENSION_DEPTH`], or is longer than
    /// [`MAX_EXPRESSION_BYTES`].
    #[error("CEL expression {expression:?} exceeds the cost budget: {reason}")]
    TooCostly {
        /// The expression as configured (cut to its first 200 bytes).
        expression: String,
        /// What is over the budget.
        reason: String,
    },
    /// The expression calls a function that does not exist.
    #[error("CEL expression {expression:?} calls {name}(), which is not a known function")]
    UnknownFunction {
        /// The expression as configured.
        expression: String,
        /// The function's name.
        name: String,
    },
    /// The CEL environment could not be set up (a defect of the build, not of the expression).
    #[error("the CEL environment could not be set up: {0}")]
    Environment(String),
}

/// Why an expression could not produce a usable value for one token (the token is refused).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvaluationError {
    /// Evaluation failed, for example on a claim the token does not have.
    #[error("evaluation failed: {0}")]
    Execution(#[from] ExecutionError),
    /// The result has the wrong type.
    #[error("the expression must return {0}")]
    WrongType(&'static str),
}

/// How deeply comprehensions may nest in an expression compiled with a budget: two loops over
/// inputs of n items cost at most n² steps.
pub const MAX_COMPREHENSION_DEPTH: usize = 2;
/// The longest expression compiled with a budget.
pub const MAX_EXPRESSION_BYTES: usize = 10 * 1024;

/// A compiled expression. Cheap to clone.
#[derive(Clone)]
pub struct Expression {
    source: Arc<str>,
    program: Arc<Program>,
    claims_selected: Arc<BTreeSet<String>>,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

/// Type names an expression may mention without them being variables (`type(x) == string`).
const TYPE_NAMES: [&str; 11] = [
    "bool",
    "bytes",
    "double",
    "dyn",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
];

impl Expression {
    /// Compiles `source` for expressions that see only `variable`. Fails on a syntax error, any
    /// other free variable, or a call of an unknown function.
    pub fn compile(source: &str, variable: Variable) -> Result<Self, ExpressionError> {
        Self::compile_for(source, &[variable.name()], false)
    }

    /// Compiles `source` for expressions that see the variables `variables` (bound at
    /// evaluation by [`Expression::evaluate_with`]). With `budget`, an expression that is longer
    /// than [`MAX_EXPRESSION_BYTES`] or nests comprehensions deeper than
    /// [`MAX_COMPREHENSION_DEPTH`] is refused ([`ExpressionError::TooCostly`]), so no accepted
    /// expression can stall its caller on inputs of bounded size. Fails as
    /// [`Expression::compile`] does otherwise.
    pub fn compile_for(source: &str, variables: &[&str], budget: bool) -> Result<Self, ExpressionError> {
        let too_costly = |reason: String| ExpressionError::TooCostly {
            expression: source.chars().take(200).collect(),
            reason,
        };
        if budget && source.len() > MAX_EXPRESSION_BYTES {
            return Err(too_costly(format!(
                "it is {} bytes long (at most {MAX_EXPRESSION_BYTES})",
                source.len()
            )));
        }
        let env = environment()?;
        let program = env.compile(source).map_err(|errors| ExpressionError::Syntax {
            expression: source.to_string(),
            reason: errors.to_string().lines().next().unwrap_or_default().to_string(),
        })?;
        let mut names = Names::default();
        names.walk(program.expression(), &mut Vec::new());
        if budget && names.deepest > MAX_COMPREHENSION_DEPTH {
            return Err(too_costly(format!(
                "it nests {} comprehensions (at most {MAX_COMPREHENSION_DEPTH})",
                names.deepest
            )));
        }
        if let Some(name) = names
            .free
            .iter()
            .find(|name| !variables.contains(&name.as_str()) && !TYPE_NAMES.contains(&name.as_str()))
        {
            return Err(ExpressionError::UnknownVariable {
                expression: source.to_string(),
                name: name.clone(),
                allowed: variables
                    .iter()
                    .map(|variable| format!("{variable:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        for (name, member) in &names.calls {
            if !is_known_function(env, name, *member) {
                return Err(ExpressionError::UnknownFunction {
                    expression: source.to_string(),
                    name: name.clone(),
                });
            }
        }
        Ok(Self {
            source: source.into(),
            program: Arc::new(program),
            claims_selected: Arc::new(names.claims_selected),
        })
    }

    /// The expression as configured.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the expression reads claim `name` (as `claims.name` or `has(claims.name)`).
    pub fn reads_claim(&self, name: &str) -> bool {
        self.claims_selected.contains(name)
    }

    /// Evaluates against `value` bound to `variable`.
    pub fn evaluate(&self, variable: Variable, value: &Value) -> Result<Value, ExecutionError> {
        self.evaluate_with(&[(variable.name(), value.clone())])
    }

    /// Evaluates with each `(name, value)` of `bindings` bound.
    pub fn evaluate_with(&self, bindings: &[(&str, Value)]) -> Result<Value, ExecutionError> {
        let env = environment().map_err(|e| ExecutionError::function_error("environment", e))?;
        let mut context = Context::with_env(env.clone());
        for (name, value) in bindings {
            context.add_variable_from_value(*name, value.clone());
        }
        self.program.execute(&context)
    }

    /// Evaluates to a boolean.
    pub fn evaluate_bool(&self, variable: Variable, value: &Value) -> Result<bool, EvaluationError> {
        match self.evaluate(variable, value)? {
            Value::Bool(b) => Ok(b),
            _ => Err(EvaluationError::WrongType("a boolean")),
        }
    }

    /// Evaluates to a string.
    pub fn evaluate_string(&self, variable: Variable, value: &Value) -> Result<String, EvaluationError> {
        match self.evaluate(variable, value)? {
            Value::String(s) => Ok(s.as_str().to_string()),
            _ => Err(EvaluationError::WrongType("a string")),
        }
    }

    /// Evaluates to a string or a list of strings, as Kubernetes reads groups and extra values:
    /// `null`, `""` and empty strings in a list count as absent.
    pub fn evaluate_strings(
        &self,
        variable: Variable,
        value: &Value,
    ) -> Result<Vec<String>, EvaluationError> {
        const WANTED: &str = "a string or a list of strings";
        match self.evaluate(variable, value)? {
            Value::Null => Ok(Vec::new()),
            Value::String(s) if s.is_empty() => Ok(Vec::new()),
            Value::String(s) => Ok(vec![s.as_str().to_string()]),
            Value::List(items) => items
                .iter()
                .filter(|item| !matches!(item, Value::String(s) if s.is_empty()))
                .map(|item| match item {
                    Value::String(s) => Ok(s.as_str().to_string()),
                    _ => Err(EvaluationError::WrongType(WANTED)),
                })
                .collect(),
            _ => Err(EvaluationError::WrongType(WANTED)),
        }
    }
}

/// The standard library plus the strings extension (`lowerAscii`, `split`, `join`, …), which
/// Kubernetes also offers. Built once.
fn environment() -> Result<&'static Arc<Env>, ExpressionError> {
    static ENV: OnceLock<Result<Arc<Env>, ExpressionError>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        env.add_extension(cel::extensions::strings)
            .map_err(|e| ExpressionError::Environment(e.to_string()))?;
        Ok(Arc::new(env))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether the environment declares `name` (as a member function if `member`). The `cel` crate
/// has no query for this, so a call with no arguments is probed: only an unknown function is
/// reported as an undeclared reference to itself.
fn is_known_function(env: &Arc<Env>, name: &str, member: bool) -> bool {
    let probe = if member {
        format!("null.{name}()")
    } else {
        format!("{name}()")
    };
    let Ok(program) = env.compile(&probe) else {
        return false;
    };
    !matches!(
        program.execute(&Context::with_env(env.clone())),
        Err(ExecutionError::UndeclaredReference(reference)) if reference.as_str() == name
    )
}

/// What an expression refers to: free identifiers, calls (name, is a member call) other than
/// operators and macro internals, and fields selected from `claims`.
#[derive(Default)]
struct Names {
    free: BTreeSet<String>,
    calls: BTreeSet<(String, bool)>,
    claims_selected: BTreeSet<String>,
    /// The deepest nesting of comprehensions seen.
    deepest: usize,
    /// The comprehensions around the node being walked.
    depth: usize,
}

impl Names {
    /// Walks `expr`; `bound` holds the comprehension variables in scope.
    fn walk(&mut self, expr: &IdedExpr, bound: &mut Vec<String>) {
        match &expr.expr {
            Expr::Ident(name) => {
                if !bound.contains(name) {
                    self.free.insert(name.clone());
                }
            }
            Expr::Select(select) => {
                if matches!(&select.operand.expr, Expr::Ident(root) if root == "claims" && !bound.contains(root))
                {
                    self.claims_selected.insert(select.field.clone());
                }
                self.walk(&select.operand, bound);
            }
            Expr::Call(call) => {
                let operator = call.func_name.starts_with(['_', '@', '!']);
                if !operator {
                    self.calls.insert((call.func_name.clone(), call.target.is_some()));
                }
                if let Some(target) = &call.target {
                    self.walk(target, bound);
                }
                for arg in &call.args {
                    self.walk(arg, bound);
                }
            }
            Expr::Comprehension(comprehension) => {
                self.walk(&comprehension.iter_range, bound);
                self.walk(&comprehension.accu_init, bound);
                let scope = bound.len();
                bound.push(comprehension.iter_var.clone());
                bound.extend(comprehension.iter_var2.clone());
                bound.push(comprehension.accu_var.clone());
                self.depth += 1;
                self.deepest = self.deepest.max(self.depth);
                self.walk(&comprehension.loop_cond, bound);
                self.walk(&comprehension.loop_step, bound);
                self.depth -= 1;
                self.walk(&comprehension.result, bound);
                bound.truncate(scope);
            }
            Expr::List(list) => {
                for element in &list.elements {
                    self.walk(element, bound);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(entry) = &entry.expr {
                        self.walk(&entry.key, bound);
                        self.walk(&entry.value, bound);
                    }
                }
            }
            Expr::Struct(structure) => {
                for entry in &structure.entries {
                    if let EntryExpr::StructField(field) = &entry.expr {
                        self.walk(&field.value, bound);
                    }
                }
            }
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

/// The `claims` variable: JSON objects become maps, arrays lists, integral numbers `int` (other
/// numbers `double`), as Kubernetes converts claims.
pub fn claims_value(claims: &serde_json::Map<String, serde_json::Value>) -> Value {
    Value::from(
        claims
            .iter()
            .map(|(name, value)| (name.clone(), json_value(value)))
            .collect::<HashMap<String, Value>>(),
    )
}

fn json_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => Value::List(Arc::new(items.iter().map(json_value).collect())),
        serde_json::Value::Object(object) => claims_value(object),
    }
}

/// The `user` variable: `{username, uid, groups, extra}`, every field present (empty when unset).
pub fn user_value(user: &UserInfo) -> Value {
    let strings =
        |values: &[String]| Value::List(Arc::new(values.iter().map(|s| Value::from(s.as_str())).collect()));
    let extra: HashMap<String, Value> = user
        .extra
        .iter()
        .map(|(key, values)| (key.clone(), strings(values)))
        .collect();
    Value::from(HashMap::from([
        ("username", Value::from(user.username.as_str())),
        ("uid", Value::from(user.uid.as_deref().unwrap_or_default())),
        ("groups", strings(&user.groups)),
        ("extra", Value::from(extra)),
    ]))
}

#[cfg(test)]
mod tests;
