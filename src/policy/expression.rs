//! `when = "…"` on a rule: a CEL expression over the use being decided,
//! compiled when the configuration loads and evaluated per use.
//!
//! Place in the path: inside the policy decision ([`super::Policy::decide_call`]
//! for calls, [`super::Policy::decide`] for lists). Invariants: an expression
//! that does not compile refuses the configuration; one that fails at run
//! time, or yields anything but a bool, denies the call (fail closed); a list,
//! which has no call-time facts (arguments, claims, annotations, the time),
//! never evaluates an expression that reads them: it treats the rule as
//! undecided, so the tool stays listed and the call decides.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::auth::ClientId;

/// The names an expression may read that a list does not know.
const CALL_TIME: [&str; 5] = ["arguments", "claims", "annotations", "method", "now"];

/// Every name the context of an expression offers.
pub const CONTEXT: [&str; 8] = [
    "client",
    "server",
    "tool",
    "method",
    "arguments",
    "claims",
    "annotations",
    "now",
];

/// One compiled `when`.
pub struct Expression {
    source: String,
    program: cel::Program,
    /// Whether it reads a call-time fact (see [`CALL_TIME`]).
    call_time: bool,
}

/// What a call knows beyond who calls what where.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The verified JWT's claims; `None` for key and anonymous clients (an empty map).
    pub claims: Option<&'a Map<String, Value>>,
    /// The JSON-RPC method (`tools/call`).
    pub method: &'a str,
    /// The call's arguments (an object).
    pub arguments: &'a Value,
    /// The tool's annotations, as pinned in the catalog; `None` reads as an empty map.
    pub annotations: Option<&'a Value>,
}

/// What one expression said about one use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    True,
    False,
    /// It raised an error or yielded a non-bool: the reason, in CEL's words.
    Failed(String),
    /// It reads call-time facts and none were given (a list): left to the call.
    Deferred,
}

// === impl Expression ===

impl Expression {
    /// Compiles `source`; the error is CEL's, with its line and column inside the expression.
    pub fn compile(source: &str) -> Result<Self, String> {
        let program = cel::Program::compile(source).map_err(|errors| {
            let multiline = source.contains('\n');
            let each: Vec<String> = errors
                .errors
                .iter()
                .map(|e| match multiline {
                    true => format!("at line {}, column {}: {}", e.pos.0, e.pos.1, e.msg),
                    false => format!("at column {}: {}", e.pos.1, e.msg),
                })
                .collect();
            each.join("; ")
        })?;
        let refs = program.references();
        let call_time = CALL_TIME.iter().any(|n| refs.has_variable(n));
        Ok(Self {
            source: source.to_owned(),
            program,
            call_time,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether it reads a fact only a call has (arguments, claims, annotations, method, now).
    pub fn reads_call(&self) -> bool {
        self.call_time
    }

    /// Evaluates it for `client` using `tool` on `server`; without `facts`
    /// (a list) an expression that reads call-time facts is [`Outcome::Deferred`].
    pub fn evaluate(
        &self,
        client: &ClientId,
        server: &str,
        tool: &str,
        facts: Option<&Facts<'_>>,
    ) -> Outcome {
        if facts.is_none() && self.call_time {
            return Outcome::Deferred;
        }
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("client", client.name());
        ctx.add_variable_from_value("server", server);
        ctx.add_variable_from_value("tool", tool);
        if let Some(f) = facts {
            let empty = Map::new();
            ctx.add_variable_from_value("method", f.method);
            ctx.add_variable_from_value("arguments", to_cel(f.arguments));
            ctx.add_variable_from_value("claims", object(f.claims.unwrap_or(&empty)));
            let annotations = match f.annotations {
                Some(v @ Value::Object(_)) => to_cel(v),
                _ => object(&empty),
            };
            ctx.add_variable_from_value("annotations", annotations);
            let now = chrono::Utc::now().fixed_offset();
            ctx.add_variable_from_value("now", cel::Value::Timestamp(now));
        }
        match self.program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => Outcome::True,
            Ok(cel::Value::Bool(false)) => Outcome::False,
            Ok(other) => Outcome::Failed(format!(
                "the expression yielded {} instead of a bool",
                other.type_of()
            )),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

/// JSON as CEL: integers as `int` where they fit (so `arguments.n <= 2`
/// compares like with like), else `uint`, else `double`.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => object(map),
    }
}

fn object(map: &Map<String, Value>) -> cel::Value {
    let converted: HashMap<String, cel::Value> =
        map.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
    cel::Value::from(converted)
}

impl Outcome {
    /// `true`, `false`, `failed: …` or `decided at call time`, for `--explain`.
    pub fn describe(&self) -> String {
        match self {
            Outcome::True => "true".into(),
            Outcome::False => "false".into(),
            Outcome::Failed(why) => format!("failed: {why}"),
            Outcome::Deferred => "decided at call time".into(),
        }
    }
}

#[cfg(test)]
mod tests;
