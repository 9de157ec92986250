//! The use a decision is about, as its CEL conditions read it: one scope per
//! decision, shared by every `when` the decision evaluates.
//!
//! Place: beneath the evaluation of each `when`, made by the policy
//! decision once per use. Why: the standard CEL environment registers every
//! standard function, and a call's arguments can be large; making either per
//! rule made a rule set cost what its size times the call's size cost. Here
//! the environment is made once per process, and each variable is converted
//! when an expression first reads it, once per decision; strings are
//! borrowed from the call, never copied. A JSON variable is converted with
//! only the members the decision's expressions can read ([`Reads`]), and a
//! qualified name CEL resolves (`claims.team`) is answered with the member
//! itself, as CEL's own rule has the most specific name win.
//!
//! Invariants: a variable reads as it did when every one was bound up front
//! (JSON numbers as `int` where they fit, else `uint`, else `double`; objects
//! as maps with string keys; a missing `claims` or a non-object `annotations`
//! as an empty map; `labels` as a list of strings); a call-time variable
//! (arguments, claims, annotations, method, now, labels) is
//! absent when the scope knows nothing of the use (a bare decision, as
//! `portcullis check` makes without a request), so reading it is an error; a
//! list's scope ([`ListFacts`]) has everything but the arguments and the
//! session's labels, with `method` read as the call the listed item promises
//! (`tools/call`, `resources/read`, `prompts/get`); `now` is one instant per
//! decision; `query` (resources) is a map from parameter names to decoded
//! values, and a query servers would read differently fails every condition
//! that reads it ([`super::query`]). What is used names itself by its kind alone: `tool` is a tool's
//! name, `uri` a resource's canonical URI (or, in the templates list, its
//! template), `prompt` a prompt's name, and none of them reads another
//! kind's subject; `annotations` belong to tools, `arguments` to tools and
//! prompts (the `prompts/get` arguments, strings).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::common::traits::Indexer;
use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelTimestamp,
    CelUInt,
};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use serde_json::{Map, Value};

use crate::auth::ClientId;
use crate::mcp::methods::Method;
use crate::policy::subject::Subject;

use super::reads::{Reads, Shape};

/// What a call knows beyond who calls what where.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The verified JWT's claims; `None` for key and anonymous clients (an empty map).
    pub claims: Option<&'a Map<String, Value>>,
    /// The JSON-RPC method (`tools/call`, `resources/read`, `prompts/get`,
    /// `completion/complete`, …).
    pub method: &'a str,
    /// The call's arguments (an object): a tool call's, a `prompts/get`'s.
    /// `None` where the use carries none a condition may read (a resource, a
    /// completion): a condition over them is then left to the use that has
    /// them (an allow rule counts as matching, a deny rule as not), as a list
    /// leaves it.
    pub arguments: Option<&'a Value>,
    /// The tool's annotations, as pinned in the catalog; `None` reads as an empty map.
    pub annotations: Option<&'a Value>,
    /// The query of the resource URI used (canonical, without its `?`;
    /// empty when it has none), read as `query`. `None` where the use
    /// carries no URI of its own (a tool, a prompt, a completion): a
    /// condition over it is then left to the use that has one.
    pub query: Option<&'a str>,
    /// The flow labels the caller's session holds (`private`, `untrusted`),
    /// read from the state store when some condition reads `labels`.
    pub labels: &'a [&'static str],
}

/// What a list knows of the uses it promises: everything a use has but its
/// arguments and the session's labels.
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
    subject: Subject<'a>,
    pub(super) known: Known<'a>,
    /// What the expressions evaluated in this scope can read of the JSON
    /// variables: the rest is never converted.
    reads: &'a Reads,
    arguments: OnceLock<Box<dyn Val + 'a>>,
    claims: OnceLock<Box<dyn Val + 'a>>,
    annotations: OnceLock<Box<dyn Val + 'a>>,
    now: OnceLock<Box<dyn Val + 'a>>,
    labels: OnceLock<Box<dyn Val + 'a>>,
    /// The query's parameters, or why servers would read them differently.
    query: OnceLock<Result<Box<dyn Val + 'a>, String>>,
}

impl<'a> Scope<'a> {
    /// The scope of `client` using `subject` on `server`; `facts` for a
    /// use, `None` for a decision that knows nothing of it. `reads` must
    /// cover every expression evaluated in it.
    pub(crate) fn new(
        client: &'a ClientId,
        server: &'a str,
        subject: Subject<'a>,
        facts: Option<&'a Facts<'a>>,
        reads: &'a Reads,
    ) -> Self {
        let known = match facts {
            Some(facts) => Known::Call(facts),
            None => Known::Nothing,
        };
        Self::knowing(client, server, subject, known, reads)
    }

    /// The scope of a list showing `subject` on `server` to `client`.
    pub(crate) fn listed(
        client: &'a ClientId,
        server: &'a str,
        subject: Subject<'a>,
        facts: &'a ListFacts<'a>,
        reads: &'a Reads,
    ) -> Self {
        Self::knowing(client, server, subject, Known::Listed(facts), reads)
    }

    fn knowing(
        client: &'a ClientId,
        server: &'a str,
        subject: Subject<'a>,
        known: Known<'a>,
        reads: &'a Reads,
    ) -> Self {
        Self {
            client,
            server,
            subject,
            known,
            reads,
            arguments: OnceLock::new(),
            claims: OnceLock::new(),
            annotations: OnceLock::new(),
            now: OnceLock::new(),
            labels: OnceLock::new(),
            query: OnceLock::new(),
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

impl<'a> Scope<'a> {
    /// What the use knows beyond who uses what where: the method, the
    /// arguments (a call only), the claims, the annotations and the labels
    /// (a call only); `None` when nothing of the use is known.
    #[allow(clippy::type_complexity)]
    fn facts(
        &self,
    ) -> Option<(
        &'a str,
        Option<&'a Value>,
        Option<&'a Map<String, Value>>,
        Option<&'a Value>,
        Option<&'a [&'static str]>,
    )> {
        match self.known {
            Known::Nothing => None,
            Known::Call(f) => Some((
                f.method,
                f.arguments,
                f.claims,
                f.annotations,
                Some(f.labels),
            )),
            // A list promises the use its item would get.
            Known::Listed(f) => {
                let promised = match self.subject {
                    Subject::Tool(_) => Method::ToolsCall,
                    Subject::Resource(_) => Method::ResourcesRead,
                    Subject::Prompt(_) => Method::PromptsGet,
                };
                Some((promised.name(), None, f.claims, f.annotations, None))
            }
        }
    }

    /// The use's `query`, converted on its first read: `None` where the use
    /// has none, `Err` where servers would read it differently.
    fn query(&self) -> Option<&Result<Box<dyn Val + 'a>, String>> {
        let (Known::Call(f), Subject::Resource(_)) = (self.known, self.subject) else {
            return None;
        };
        let text = f.query?;
        Some(self.query.get_or_init(|| {
            let each = super::query::parameters(text)?.into_iter().map(|(n, v)| {
                let value: Box<dyn Val + 'a> = Box::new(CelString::from(v));
                (CelMapKey::from(n.into_owned()), value)
            });
            Ok(Box::new(CelMap::from(each.collect::<HashMap<_, _>>())) as Box<dyn Val + 'a>)
        }))
    }

    /// Why the use's query cannot be judged, when servers would read it
    /// differently (see [`super::query`]).
    pub(crate) fn query_refused(&self) -> Option<&str> {
        self.query()?.as_ref().err().map(String::as_str)
    }

    /// The compound variable `name` (or `now`), converted on its first read;
    /// `None` for a variable the subject's kind never has.
    fn value<'b>(&'b self, name: &str) -> Option<&'b (dyn Val + 'b)> {
        match (name, self.subject) {
            ("annotations", Subject::Resource(_) | Subject::Prompt(_))
            | ("arguments", Subject::Resource(_)) => return None,
            ("query", _) => return self.query()?.as_deref().ok(),
            _ => {}
        }
        let (_, arguments, claims, annotations, labels) = self.facts()?;
        Some(match name {
            "arguments" => {
                let arguments = arguments?;
                let shape = &self.reads.arguments;
                &**self.arguments.get_or_init(|| read(arguments, shape))
            }
            "claims" => &**self.claims.get_or_init(|| match claims {
                Some(claims) => object(claims, &self.reads.claims),
                None => empty(),
            }),
            "annotations" => &**self.annotations.get_or_init(|| match annotations {
                Some(Value::Object(annotations)) => object(annotations, &self.reads.annotations),
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
        })
    }

    /// The member a qualified name (`arguments.ticket.team`) selects, when
    /// every value on its way is a map holding the next member.
    ///
    /// CEL asks for a qualified name whole first, then without its last
    /// member, down to the variable, and selects the members left on what it
    /// finds: the most specific name wins. Answering the whole name with the
    /// member spares those lookups and selections; a member that is missing,
    /// or a value that is not a map, is left to CEL's selection, which fails
    /// as it always did. Identifiers never hold a dot, so the name's dots are
    /// the selections'.
    fn member<'b>(&'b self, name: &str) -> Option<&'b (dyn Val + 'b)> {
        let dot = name.bytes().position(|b| b == b'.')?;
        let mut at = self.value(&name[..dot])?;
        for member in name[dot + 1..].split('.') {
            let map = at.downcast_ref::<CelMap<'_>>()?;
            match map.get(&CelString::from(member)) {
                Ok(CowVal::Borrowed(value)) => at = value,
                _ => return None,
            }
        }
        Some(at)
    }
}

impl<'a> VariableResolver for Scope<'a> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let text = |s: &'b str| Some(CowVal::owned(CelString::from(s)));
        // Each kind names its subject by its own variable, and only by it.
        match (variable, self.subject) {
            ("client", _) => text(self.client.name()),
            ("server", _) => text(self.server),
            ("tool", Subject::Tool(name))
            | ("uri", Subject::Resource(name))
            | ("prompt", Subject::Prompt(name)) => text(name),
            ("tool" | "uri" | "prompt", _) => None,
            ("method", _) => text(self.facts()?.0),
            _ => self
                .value(variable)
                .or_else(|| self.member(variable))
                .map(CowVal::Borrowed),
        }
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
        Value::Object(map) => object(map, &Shape::Whole),
    }
}

/// `value` as CEL with only what `shape` reads of it (see [`Reads`]): an
/// object read by members keeps those it has; anything else is converted
/// whole, as a selection on it fails alike either way.
fn read<'v>(value: &'v Value, shape: &Shape) -> Box<dyn Val + 'v> {
    match value {
        Value::Object(map) => object(map, shape),
        other => to_val(other),
    }
}

fn object<'v>(map: &'v Map<String, Value>, shape: &Shape) -> Box<dyn Val + 'v> {
    let converted: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = match shape {
        Shape::Whole => map
            .iter()
            .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val(v)))
            .collect(),
        Shape::Members(members) => {
            let mut converted = HashMap::with_capacity(members.len().min(map.len()));
            // A small object is walked (a lookup hashes the name, the walk
            // compares it with the few names read); a large one is looked up.
            if map.len() <= 2 * members.len() + 8 {
                for (k, v) in map {
                    if let Some(shape) = members.get(k.as_str()) {
                        converted.insert(CelMapKey::from(k.as_str()), read(v, shape));
                    }
                }
            } else {
                for (name, shape) in members {
                    if let Some((k, v)) = map.get_key_value(name) {
                        converted.insert(CelMapKey::from(k.as_str()), read(v, shape));
                    }
                }
            }
            converted
        }
    };
    Box::new(CelMap::from(converted))
}

fn empty() -> Box<dyn Val + 'static> {
    Box::new(CelMap::from(HashMap::new()))
}
