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
//! as an empty map; `labels` as a list of strings); a call-time variable
//! (arguments, claims, annotations, method, now, labels) is
//! absent when the scope knows nothing of the use (a bare decision, as
//! `portcullis check` makes without a request), so reading it is an error; a
//! list's scope ([`ListFacts`]) has everything but the arguments and the
//! session's labels, with
//! `method` read as `tools/call`, the call the listed tool would get; `now`
//! is one instant per decision.

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
use crate::mcp::methods::Method;

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
    /// The flow labels the caller's session holds (`private`, `untrusted`),
    /// read from the state store when some condition reads `labels`.
    pub labels: &'a [&'static str],
}

/// What a tool list knows of the calls it promises: everything a call has
/// but its arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListFacts<'a> {
    /// The verified JWT's claims of the client listing; `None` for key and
    /// anonymous clients (an empty map).
    pub claims: Option<&'a Map<String, Value>>,
    /// The listed tool's annotations, as the catalog holds them (the ones a
    /// call reads); `None` reads as an empty map.
    pub annotations: Option<&'a Value>,
}

/// What a scope knows beyond who uses what where.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Known<'a> {
    /// Nothing: a decision without a use (a bare `portcullis check`).
    Nothing,
    /// A tool list: everything but the arguments.
    Listed(&'a ListFacts<'a>),
    /// A call: everything.
    Call(&'a Facts<'a>),
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
    pub(super) known: Known<'a>,
    arguments: OnceLock<Box<dyn Val + 'a>>,
    claims: OnceLock<Box<dyn Val + 'a>>,
    annotations: OnceLock<Box<dyn Val + 'a>>,
    now: OnceLock<Box<dyn Val + 'a>>,
    labels: OnceLock<Box<dyn Val + 'a>>,
}

impl<'a> Scope<'a> {
    /// The scope of `client` using `tool` on `server`; `facts` for a call,
    /// `None` for a decision that knows nothing of the use.
    pub(crate) fn new(
        client: &'a ClientId,
        server: &'a str,
        tool: &'a str,
        facts: Option<&'a Facts<'a>>,
    ) -> Self {
        let known = match facts {
            Some(facts) => Known::Call(facts),
            None => Known::Nothing,
        };
        Self::knowing(client, server, tool, known)
    }

    /// The scope of a list showing `tool` on `server` to `client`.
    pub(crate) fn listed(
        client: &'a ClientId,
        server: &'a str,
        tool: &'a str,
        facts: &'a ListFacts<'a>,
    ) -> Self {
        Self::knowing(client, server, tool, Known::Listed(facts))
    }

    fn knowing(client: &'a ClientId, server: &'a str, tool: &'a str, known: Known<'a>) -> Self {
        Self {
            client,
            server,
            tool,
            known,
            arguments: OnceLock::new(),
            claims: OnceLock::new(),
            annotations: OnceLock::new(),
            now: OnceLock::new(),
            labels: OnceLock::new(),
        }
    }

    /// Who uses the subject.
    pub(crate) fn client(&self) -> &'a ClientId {
        self.client
    }

    /// Where.
    pub(crate) fn server(&self) -> &'a str {
        self.server
    }

    /// A CEL context reading its variables from this scope.
    pub(crate) fn context<'s>(&'s self) -> cel::Context<'s, 's> {
        let mut context = cel::Context::with_env(environment());
        context.set_variable_resolver(self);
        context
    }
}

impl<'a> VariableResolver for Scope<'a> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let text = |s: &'b str| Some(CowVal::owned(CelString::from(s)));
        match variable {
            "client" => return text(self.client.name()),
            "server" => return text(self.server),
            "tool" => return text(self.tool),
            _ => {}
        }
        let (method, arguments, claims, annotations, labels) = match self.known {
            Known::Nothing => return None,
            Known::Call(f) => (
                f.method,
                Some(f.arguments),
                f.claims,
                f.annotations,
                Some(f.labels),
            ),
            // A list promises the call the tool would get.
            Known::Listed(f) => (
                Method::ToolsCall.name(),
                None,
                f.claims,
                f.annotations,
                None,
            ),
        };
        let value: &'b (dyn Val + 'b) = match variable {
            "method" => return text(method),
            "arguments" => {
                let arguments = arguments?;
                &**self.arguments.get_or_init(|| to_val(arguments))
            }
            "claims" => &**self.claims.get_or_init(|| match claims {
                Some(claims) => object(claims),
                None => empty(),
            }),
            "annotations" => &**self.annotations.get_or_init(|| match annotations {
                Some(Value::Object(annotations)) => object(annotations),
                _ => empty(),
            }),
            "labels" => {
                let labels = labels?;
                &**self.labels.get_or_init(|| {
                    let each = labels
                        .iter()
                        .map(|l| -> Box<dyn Val + 'a> { Box::new(CelString::from(*l)) });
                    Box::new(CelList::from(each.collect::<Vec<_>>()))
                })
            }
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
