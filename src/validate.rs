//! Tool-input validation: each tool's advertised `inputSchema`, compiled once,
//! enforced on every `tools/call` before the upstream sees it.
//!
//! Place in the path: after access rules (and rate limits), before forwarding.
//! Also compiles the `arguments` constraints of rules, with the same options.
//!
//! Invariants:
//! - no `$ref` is ever fetched: the crate is built without its HTTP and file
//!   resolvers, and a retriever that refuses everything is installed anyway, so a
//!   later feature unification cannot quietly turn fetching back on;
//! - `pattern` runs on a linear-time regex engine with a size cap;
//! - schemas over [`SchemaLimits`] (bytes, depth, node count) are refused before
//!   they reach the compiler, so hostile schemas cost bounded time;
//! - a schema that cannot be compiled makes its tool uncallable (fail closed);
//! - violation text for the caller may echo the caller's own values (shortened);
//!   nothing here logs them.

mod message;

use std::sync::Arc;

use jsonschema::{PatternOptions, Retrieve, Uri, Validator};
use serde_json::Value;

pub use message::Violation;

/// Caps applied to a schema before it is compiled.
#[derive(Debug, Clone, Copy)]
pub struct SchemaLimits {
    /// Serialized size.
    pub max_bytes: usize,
    /// Nesting depth of JSON arrays and objects.
    pub max_depth: usize,
    /// Number of JSON values in the schema.
    pub max_nodes: usize,
}

impl Default for SchemaLimits {
    fn default() -> Self {
        Self {
            max_bytes: 256 * 1024,
            max_depth: 64,
            max_nodes: 20_000,
        }
    }
}

/// Most violations listed for one call; the rest are counted.
const MAX_VIOLATIONS: usize = 20;
/// Compiled-regex size cap for `pattern` (the regex crate's own unit, bytes).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The dialects the gateway enforces, by their `$schema` URI.
const KNOWN_DIALECTS: &[&str] = &[
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-04/schema",
];

/// A schema ready to check instances.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    validator: Arc<Validator>,
    /// Kept to find property descriptions for violation messages.
    source: Arc<Value>,
}

/// Why a schema is not enforced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Serialized size over the limit.
    #[error("the schema is {0} bytes, over the {1}-byte limit")]
    TooLarge(usize, usize),
    /// Nesting over the limit.
    #[error("the schema nests deeper than {0} levels")]
    TooDeep(usize),
    /// Value count over the limit.
    #[error("the schema has more than {0} values")]
    TooManyNodes(usize),
    /// Not a JSON object (or missing).
    #[error("the schema is not a JSON object")]
    NotAnObject,
    /// `$schema` names a dialect the gateway does not know.
    #[error("the schema declares the dialect {0:?}, which the gateway does not support")]
    UnknownDialect(String),
    /// The compiler refused it (including any external `$ref`).
    #[error("the schema cannot be compiled: {0}")]
    Invalid(String),
}

/// Refuses every external `$ref`; only references inside the schema resolve.
struct DenyExternalRefs;

impl Retrieve for DenyExternalRefs {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!(
            "external $ref {} refused: the gateway never fetches schemas",
            uri.as_str()
        )
        .into())
    }
}

// === impl CompiledSchema ===

impl CompiledSchema {
    /// Checks limits and dialect, then compiles.
    pub fn compile(schema: &Value, limits: SchemaLimits) -> Result<Self, SchemaError> {
        let size = serde_json::to_vec(schema)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > limits.max_bytes {
            return Err(SchemaError::TooLarge(size, limits.max_bytes));
        }
        check_shape(schema, limits)?;
        let object = schema.as_object().ok_or(SchemaError::NotAnObject)?;
        if let Some(dialect) = object.get("$schema") {
            let uri = dialect.as_str().unwrap_or_default();
            let bare = uri.trim_end_matches('#');
            if !KNOWN_DIALECTS.contains(&bare) {
                return Err(SchemaError::UnknownDialect(uri.to_owned()));
            }
        }
        let validator = jsonschema::options()
            .with_retriever(DenyExternalRefs)
            .should_validate_formats(true)
            .with_pattern_options(PatternOptions::regex().size_limit(REGEX_SIZE_LIMIT))
            .build(schema)
            .map_err(|e| {
                // Say where in the schema the fault is, not only what it is.
                let at = e.instance_path().as_str();
                let at = if at.is_empty() {
                    String::new()
                } else {
                    format!(" (at {at})")
                };
                SchemaError::Invalid(format!("{}{at}", e.masked()))
            })?;
        Ok(Self {
            validator: Arc::new(validator),
            source: Arc::new(schema.clone()),
        })
    }

    /// `Ok` when `instance` conforms; otherwise the violations, in the order found.
    pub fn check(&self, instance: &Value) -> Result<(), Vec<Violation>> {
        if self.validator.is_valid(instance) {
            return Ok(());
        }
        let violations: Vec<Violation> = self
            .validator
            .iter_errors(instance)
            .take(MAX_VIOLATIONS)
            .map(|e| Violation::from_error(&e, &self.source))
            .collect();
        Err(violations)
    }
}

/// Walks the schema once, without recursion, to bound its depth and size.
fn check_shape(schema: &Value, limits: SchemaLimits) -> Result<(), SchemaError> {
    let mut stack = vec![(schema, 1usize)];
    let mut nodes = 0usize;
    while let Some((value, depth)) = stack.pop() {
        nodes += 1;
        if nodes > limits.max_nodes {
            return Err(SchemaError::TooManyNodes(limits.max_nodes));
        }
        if depth > limits.max_depth {
            return Err(SchemaError::TooDeep(limits.max_depth));
        }
        match value {
            Value::Object(map) => stack.extend(map.values().map(|v| (v, depth + 1))),
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
