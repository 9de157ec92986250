//! `when = "…"` on a rule: a CEL expression over the use being decided,
//! compiled when the configuration loads and evaluated per use.
//!
//! Place in the path: inside the policy decision ([`super::Policy::decide_call`]
//! for calls, [`super::Policy::decide_listed`] for tool lists,
//! [`super::Policy::decide`] where nothing of the use is known). Invariants:
//! an expression that does not compile, or whose cost grows with the product
//! of two sizes a client chooses (see [`cost`]), refuses the configuration;
//! one that fails at run time, or yields anything but a bool, denies the call
//! (fail closed). A list knows everything a call knows but its arguments, so
//! an expression that does not read `arguments` is evaluated there as the
//! call would evaluate it (the list and the call agree); one that reads
//! `arguments` (or a URI's `query`, or the session's `labels`) is left to the
//! call ([`Outcome::Deferred`]), and so is every
//! expression that reads a call-time fact where nothing of the use is known.
//! Whether an expression reads a name is known when it compiles, and so is
//! whether it reads one the kind of its rule never has (`uri` on a tool
//! rule, `tool` or `arguments` on a resource rule): such a rule is refused
//! at load ([`Expression::compile_for`]), never left to fail per use.

mod cost;
mod kind;
pub mod query;
mod reads;
mod scope;

use super::subject::{Kind, Subject};
use crate::auth::ClientId;
pub(crate) use reads::Reads;
pub use scope::{Facts, ListFacts};
pub(crate) use scope::{Known, Scope};

/// The names an expression may read that a list does not know.
const CALL_TIME: [&str; 7] = [
    "arguments",
    "query",
    "claims",
    "annotations",
    "method",
    "now",
    "labels",
];

/// Every name the context of an expression offers (each kind of rule reads
/// a part of them: [`variables`]).
pub const CONTEXT: [&str; 12] = [
    "client",
    "server",
    "tool",
    "uri",
    "query",
    "prompt",
    "method",
    "arguments",
    "claims",
    "annotations",
    "now",
    "labels",
];

/// One compiled `when`.
pub struct Expression {
    source: String,
    program: cel::Program,
    /// Whether it reads a call-time fact (see [`CALL_TIME`]).
    call_time: bool,
    /// Whether it reads the call's arguments, a fact a list lacks.
    reads_arguments: bool,
    /// Whether it reads a resource URI's query, a fact a list lacks (a
    /// listed URI is read with whatever query its read will carry).
    reads_query: bool,
    /// Whether it reads the session's flow labels: they change after a list
    /// (a later call sets one), so a list leaves it to the call too.
    reads_labels: bool,
    /// Whether a list evaluates it and its value there can change from one
    /// list to the next of the same client (it reads the claims of the token
    /// presented, or the time).
    varies: bool,
    /// What it reads of the JSON variables (see [`reads`]).
    reads: Reads,
}

/// What one expression said about one use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    True,
    False,
    /// It raised an error or yielded a non-bool: the reason, in CEL's words.
    Failed(String),
    /// It reads a fact the decision does not have (the arguments, in a
    /// list): left to the call.
    Deferred,
}

// === impl Expression ===

impl Expression {
    /// Compiles `source` for a rule of `kind`: as [`Self::compile`], and
    /// refused, with the line and column of the read, when it reads a name
    /// rules of that kind never have ([`variables`]).
    pub fn compile_for(source: &str, kind: Kind) -> Result<Self, String> {
        let compiled = Self::compile(source)?;
        let own = variables(kind);
        let foreign: Vec<&str> = (CONTEXT.iter().copied())
            .filter(|n| !own.contains(n))
            .collect();
        match kind::foreign(&compiled.program, source, kind, own, &foreign) {
            Some(why) => Err(why),
            None => Ok(compiled),
        }
    }

    /// Compiles `source`; the error says it is not valid CEL (CEL's words) or
    /// why its cost is refused (see [`cost`]), with its line and column
    /// inside the expression.
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
            format!("not a valid CEL expression: {}", each.join("; "))
        })?;
        if let Some(why) = cost::refusal(&program, source) {
            return Err(format!("refused for its cost: {why}"));
        }
        let refs = program.references();
        let call_time = CALL_TIME.iter().any(|n| refs.has_variable(n));
        let reads_arguments = refs.has_variable("arguments");
        let reads_query = refs.has_variable("query");
        let reads_labels = refs.has_variable("labels");
        let varies = !reads_arguments
            && !reads_query
            && !reads_labels
            && (refs.has_variable("claims") || refs.has_variable("now"));
        let reads = Reads::of(program.expression());
        Ok(Self {
            source: source.to_owned(),
            reads,
            program,
            call_time,
            reads_arguments,
            reads_query,
            reads_labels,
            varies,
        })
    }

    /// What it reads of the JSON variables: a scope it is evaluated in
    /// converts at least that.
    pub(crate) fn reads(&self) -> &Reads {
        &self.reads
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether it reads a call-time fact (arguments, claims, annotations, method, now).
    pub fn reads_call(&self) -> bool {
        self.call_time
    }

    /// Whether it reads the call's arguments: a list leaves it to the call.
    pub fn reads_arguments(&self) -> bool {
        self.reads_arguments
    }

    /// Whether it reads a resource URI's query: a list leaves it to the read.
    pub fn reads_query(&self) -> bool {
        self.reads_query
    }

    /// Whether it reads the session's flow labels: the call reads them from
    /// the state store first, and a list leaves it to the call.
    pub fn reads_labels(&self) -> bool {
        self.reads_labels
    }

    /// Whether a list evaluates it and may find another value for the same
    /// client next time (it reads claims or the time).
    pub fn varies_per_list(&self) -> bool {
        self.varies
    }

    /// Evaluates it for `client` using `tool` on `server`; without `facts`
    /// an expression that reads call-time facts is [`Outcome::Deferred`].
    pub fn evaluate(
        &self,
        client: &ClientId,
        server: &str,
        tool: &str,
        facts: Option<&Facts<'_>>,
    ) -> Outcome {
        self.evaluate_use(client, server, Subject::Tool(tool), facts)
    }

    /// Evaluates it for `client` using `subject` on `server` (see [`Self::evaluate`]).
    pub fn evaluate_use(
        &self,
        client: &ClientId,
        server: &str,
        subject: Subject<'_>,
        facts: Option<&Facts<'_>>,
    ) -> Outcome {
        let scope = Scope::new(client, server, subject, facts, &self.reads);
        let mut context = None;
        self.evaluate_in(&scope, &mut context)
    }

    /// Evaluates it in `scope`, the use a decision is about; `context` is the
    /// decision's CEL context, made on the first condition that runs and
    /// shared by the others.
    pub(crate) fn evaluate_in<'s>(
        &self,
        scope: &'s Scope<'_>,
        context: &mut Option<cel::Context<'s, 's>>,
    ) -> Outcome {
        let deferred = match scope.known {
            Known::Nothing => self.call_time,
            Known::Listed(_) => self.reads_arguments || self.reads_query || self.reads_labels,
            // A use without arguments (or a URI) of its own (a completion)
            // leaves a condition over them to the use that has them.
            Known::Call(f) => {
                (self.reads_arguments && f.arguments.is_none())
                    || (self.reads_query && f.query.is_none())
            }
        };
        if deferred {
            return Outcome::Deferred;
        }
        if self.reads_query
            && let Some(why) = scope.query_refused()
        {
            // Servers would read another query than the one judged.
            return Outcome::Failed(why.to_owned());
        }
        let context = context.get_or_insert_with(|| scope.context());
        match self.program.execute(context) {
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

/// The names a condition on a rule of `kind` may read: who uses what where
/// (the subject by its kind's own name), the method, the claims, the time
/// and the session's labels; the annotations on tools only; the arguments on
/// tools (the call's) and prompts (the `prompts/get` arguments); the URI's
/// query on resources.
pub fn variables(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Tool => &[
            "client",
            "server",
            "tool",
            "method",
            "arguments",
            "claims",
            "annotations",
            "now",
            "labels",
        ],
        Kind::Resource => &[
            "client", "server", "uri", "query", "method", "claims", "now", "labels",
        ],
        Kind::Prompt => &[
            "client",
            "server",
            "prompt",
            "method",
            "arguments",
            "claims",
            "now",
            "labels",
        ],
    }
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
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
