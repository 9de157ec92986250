//! The use a decision is about, as its CEL conditions read it: one scope per
//! decision, shared by every `when` the decision evaluates.
//!
//! Place: beneath the evaluation of each `when`, made by the policy
//! decision once per use. Why: the standard CEL environment registers every
//! standard function, and a call's arguments can be large; making either per
//! rule made a rule set cost what its size times the call's size cost. Here
//! the environment is made once per process, and each variable is converted
//! when an expression first reads it, once per decision; strings are
//! borrowed from the call, never copied.
//!
//! Invariants: a variable reads as it did when every one was bound up front
//! (JSON numbers as `int` where they fit, else `uint`, else `double`; objects
//! as maps with string keys; a missing `claims` or a non-object `annotations`
//! as an empty map); a call-time variable (arguments, claims, annotations, method, now) is
//! absent when the scope has no facts (a list), so reading it is an error, as
//! before; `now` is one instant per decision.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelTimestamp,
    CelUInt,
};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use serde_json::{Map, Value};

use crate::auth::ClientId;

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

/// The standard environment (functions, macros), made once: making it per
/// evaluation cost more than most conditions do.
fn environment() -> Arc<cel::Env> {
    static ENVIRONMENT: OnceLock<Arc<cel::Env>> = OnceLock::new();
    ENVIRONMENT
        .get_or_init(|| Arc::new(cel::Env::stdlib()))
        .clone()
}

/// Who uses what where, and the call's facts, with each compound variable
/// converted on its first read.
pub(crate) struct Scope<'a> {
    client: &'a ClientId,
    server: &'a str,
    tool: &'a str,
    pub(super) facts: Option<&'a Facts<'a>>,
    arguments: OnceLock<Box<dyn Val + 'a>>,
    claims: OnceLock<Box<dyn Val + 'a>>,
    annotations: OnceLock<Box<dyn Val + 'a>>,
    now: OnceLock<Box<dyn Val + 'a>>,
}

impl<'a> Scope<'a> {
    /// The scope of `client` using `tool` on `server`; `facts` for a call,
    /// `None` for a list.
    pub(crate) fn new(
        client: &'a ClientId,
        server: &'a str,
        tool: &'a str,
        facts: Option<&'a Facts<'a>>,
    ) -> Self {
        Self {
            client,
            server,
            tool,
            facts,
            arguments: OnceLock::new(),
            claims: OnceLock::new(),
            annotations: OnceLock::new(),
            now: OnceLock::new(),
        }
    }

    /// A CEL context reading its variables from this scope.
    pub(crate) fn context<'s>(&'s self) -> cel::Context<'s, 's> {
        let mut context = cel::Context::with_env(environment());
        context.set_variable_resolver(self);
        context
    }
}

impl VariableResolver for Scope<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let text = |s: &'b str| Some(CowVal::owned(CelString::from(s)));
        match variable {
            "client" => return text(self.client.name()),
            "server" => return text(self.server),
            "tool" => return text(self.tool),
            _ => {}
        }
        let facts = self.facts?;
        let value: &'b (dyn Val + 'b) = match variable {
            "method" => return text(facts.method),
            "arguments" => &**self.arguments.get_or_init(|| to_val(facts.arguments)),
            "claims" => &**self.claims.get_or_init(|| match facts.claims {
                Some(claims) => object(claims),
                None => empty(),
            }),
            "annotations" => &**self.annotations.get_or_init(|| match facts.annotations {
                Some(Value::Object(annotations)) => object(annotations),
                _ => empty(),
            }),
            "now" => &**self
                .now
                .get_or_init(|| Box::new(CelTimestamp::from(chrono::Utc::now().fixed_offset()))),
            _ => return None,
        };
        Some(CowVal::Borrowed(value))
    }
}

/// JSON as CEL, borrowing its strings: integers as `int` where they fit (so
/// `arguments.n <= 2` compares like with like), else `uint`, else `double`.
pub(super) fn to_val(value: &Value) -> Box<dyn Val + '_> {
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => {
            Box::new(CelList::from(items.iter().map(to_val).collect::<Vec<_>>()))
        }
        Value::Object(map) => object(map),
    }
}

fn object(map: &Map<String, Value>) -> Box<dyn Val + '_> {
    let converted: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = map
        .iter()
        .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val(v)))
        .collect();
    Box::new(CelMap::from(converted))
}

fn empty() -> Box<dyn Val + 'static> {
    Box::new(CelMap::from(HashMap::new()))
}
