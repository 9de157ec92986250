//! What the gateway knows of each server's tools: definitions from `tools/list`,
//! with their input schemas compiled and their pins checked.
//!
//! Place in the path: filled whenever a `tools/list` passes (a client's, or one
//! the gateway sends itself when a call arrives first); read by every
//! `tools/call`; emptied by `notifications/tools/list_changed`, and stale once
//! a pin is approved (the next call fetches the list again).
//!
//! Invariants: a schema (input or output) is compiled once per distinct definition (keyed by its
//! SHA-256), also across refreshes; the compiled-schema cache is bounded; what a
//! client is shown is rendered once per snapshot, client and configuration (a
//! reload or a pin approval makes a new snapshot key or a new snapshot); a
//! tool whose schema cannot be compiled stays listed as known but uncallable;
//! every definition stored has been through [`Pins::observe_tools`], so what
//! lists serve and what calls are checked against is the pinned view.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::auth::ClientId;
use crate::config::Pinning;
use crate::error::ToolHints;
use crate::pins::{Pins, Verdict};
use crate::sanitize::Skip;
use crate::validate::{CompiledSchema, SchemaError, SchemaLimits};

/// Most distinct schemas kept compiled per server.
const MAX_COMPILED: usize = 4096;
/// Most rendered per-client lists kept per snapshot.
const MAX_RENDERED: usize = 1024;

/// One server's tools.
#[derive(Debug)]
pub(crate) struct Catalog {
    current: RwLock<Option<Arc<ToolSet>>>,
    compiled: Mutex<HashMap<[u8; 32], Result<CompiledSchema, SchemaError>>>,
    server: String,
    pinning: Pinning,
    pins: Arc<Pins>,
}

/// A snapshot of a server's tools.
#[derive(Debug, Default)]
pub(crate) struct ToolSet {
    pub tools: BTreeMap<String, ToolEntry>,
    /// Tool names in the order the server listed them.
    order: Vec<String>,
    /// The pins' generation the verdicts were made at.
    generation: u64,
    /// What lists serve (pinned view, sanitized), computed once per set.
    listed: OnceLock<Vec<Value>>,
    /// What one client is shown of `listed` under one configuration, as JSON text.
    rendered: Mutex<HashMap<(u64, ClientId), Arc<str>>>,
    /// The raw `result` of the one-page reply this set was made from, and that
    /// result without its tools: an identical reply is recognised without parsing.
    source: OnceLock<(Box<str>, Map<String, Value>)>,
}

/// One tool.
#[derive(Debug)]
pub(crate) struct ToolEntry {
    /// The definition as the server sent it.
    pub definition: Value,
    /// Its compiled `inputSchema`, or why it cannot be enforced.
    pub schema: Result<CompiledSchema, SchemaError>,
    /// Its compiled `outputSchema`, when it has one the gateway can enforce.
    pub output_schema: Option<CompiledSchema>,
    /// What its pin says.
    pub pin: Verdict,
}

impl Catalog {
    pub(crate) fn new(server: &str, pinning: Pinning, pins: Arc<Pins>) -> Self {
        Self {
            current: RwLock::default(),
            compiled: Mutex::default(),
            server: server.to_owned(),
            pinning,
            pins,
        }
    }

    /// The current snapshot, if a list has been seen since the last change
    /// (and no pin was approved since).
    pub(crate) fn get(&self) -> Option<Arc<ToolSet>> {
        let generation = self.pins.generation();
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|set| set.generation == generation)
    }

    /// Replaces the snapshot with `tools` (the full, all-pages list).
    pub(crate) fn store(&self, tools: &[Value]) -> Arc<ToolSet> {
        let generation = self.pins.generation();
        // The same list again (the common case): pins, schemas, the sanitized
        // view and what each client is shown are already worked out.
        if let Some(set) = self.get()
            && set.generation == generation
            && set.is(tools)
        {
            return set;
        }
        let mut set = ToolSet {
            generation,
            ..ToolSet::default()
        };
        let verdicts = self.pins.observe_tools(&self.server, self.pinning, tools);
        for (tool, pin) in tools.iter().zip(verdicts) {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
            let output_schema = tool
                .get("outputSchema")
                .filter(|s| !s.is_null())
                .and_then(|s| match self.compile(s) {
                    Ok(compiled) => Some(compiled),
                    Err(e) => {
                        tracing::warn!(server = %self.server, tool = name, error = %e, "outputSchema not enforced");
                        None
                    }
                });
            let entry = ToolEntry {
                definition: tool.clone(),
                schema: self.compile(&schema),
                output_schema,
                pin,
            };
            if set.tools.insert(name.to_owned(), entry).is_none() {
                set.order.push(name.to_owned());
            }
        }
        let set = Arc::new(set);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(set.clone());
        set
    }

    /// Forgets the snapshot; the next call fetches the list again.
    pub(crate) fn invalidate(&self) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn compile(&self, schema: &Value) -> Result<CompiledSchema, SchemaError> {
        let key: [u8; 32] = Sha256::digest(serde_json::to_vec(schema).unwrap_or_default()).into();
        let mut cache = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = cache.get(&key) {
            return hit.clone();
        }
        let compiled = if schema.is_null() {
            Err(SchemaError::NotAnObject)
        } else {
            CompiledSchema::compile(schema, SchemaLimits::default())
        };
        if cache.len() >= MAX_COMPILED {
            cache.clear();
        }
        cache.insert(key, compiled.clone());
        compiled
    }
}

/// The id and the raw text of `result` of a JSON-RPC response, read without
/// building a tree of the result.
fn raw_result(body: &[u8]) -> Option<(Value, &str)> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        id: Value,
        #[serde(borrow)]
        result: Option<&'a serde_json::value::RawValue>,
    }
    let envelope: Envelope<'_> = serde_json::from_slice(body).ok()?;
    Some((envelope.id, envelope.result?.get()))
}

impl ToolSet {
    /// Remembers the reply `body` this set was made from (one JSON page).
    pub(crate) fn remember_source(&self, body: &[u8], rest: &Map<String, Value>) {
        if let Some(raw) = raw_result(body) {
            let _ = self.source.set((raw.1.into(), rest.clone()));
        }
    }

    /// When `body` answers `id` with exactly the result this set was made
    /// from: that result without its tools.
    pub(crate) fn same_source(&self, body: &[u8], id: &Value) -> Option<Map<String, Value>> {
        let (known, rest) = self.source.get()?;
        let (answered, raw) = raw_result(body)?;
        (answered == *id && **known == *raw).then(|| rest.clone())
    }

    /// True when `tools` is exactly the list this set was made from.
    fn is(&self, tools: &[Value]) -> bool {
        tools.len() == self.order.len()
            && tools.iter().zip(&self.order).all(|(tool, name)| {
                self.tools
                    .get(name)
                    .is_some_and(|entry| entry.definition == *tool)
            })
    }

    /// What `client` is shown of this set under configuration `generation`,
    /// rendered by `render` the first time it is asked for.
    pub(crate) fn rendered(
        &self,
        generation: u64,
        client: &ClientId,
        render: impl FnOnce() -> String,
    ) -> Arc<str> {
        let key = (generation, client.clone());
        if let Some(hit) = self
            .rendered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return hit.clone();
        }
        let text: Arc<str> = render().into();
        let mut cache = self.rendered.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_RENDERED {
            cache.clear();
        }
        cache.insert(key, text.clone());
        text
    }

    /// What a list shows, in the server's order: held tools as pinned (or not
    /// at all), each definition passed through `prepare` (the sanitizer) once
    /// per snapshot.
    pub(crate) fn listed(&self, prepare: impl FnOnce(Vec<Value>) -> Vec<Value>) -> &[Value] {
        self.listed.get_or_init(|| {
            let definitions = self
                .order
                .iter()
                .filter_map(|name| self.tools.get(name))
                .map(|e| e.definition.clone())
                .collect();
            prepare(self.served(definitions))
        })
    }

    /// Tool names, sorted.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// What a list shows of `items` (this set's definitions): a held tool's
    /// pinned definition instead of the live one, and nothing of a held tool
    /// that has no approved definition yet.
    pub(crate) fn served(&self, items: Vec<Value>) -> Vec<Value> {
        items
            .into_iter()
            .filter_map(|item| {
                let name = item.get("name").and_then(Value::as_str)?;
                match self.tools.get(name).map(|e| &e.pin) {
                    Some(Verdict::Hold(hold)) => hold.pinned.as_deref().cloned(),
                    _ => Some(item),
                }
            })
            .collect()
    }
}

/// What the gateway knows of the tool a `tools/call` runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallFacts {
    /// Its annotations, for retry advice.
    pub hints: ToolHints,
    /// Its compiled `outputSchema`, when it has one the gateway can enforce.
    pub output_schema: Option<CompiledSchema>,
    /// Sanitizer actions exempted for it.
    pub skip: Skip,
}

impl CallFacts {
    /// Facts from a tool as the catalog knows it.
    pub(crate) fn of(entry: &ToolEntry, skip: Skip) -> Self {
        let hint = |k: &str| {
            entry
                .definition
                .get("annotations")
                .and_then(|a| a.get(k))
                .and_then(Value::as_bool)
                == Some(true)
        };
        Self {
            hints: ToolHints {
                read_only: hint("readOnlyHint"),
                idempotent: hint("idempotentHint"),
            },
            output_schema: entry.output_schema.clone(),
            skip,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reply(id: u64, tools: &Value) -> Vec<u8> {
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools, "ttlMs": 0}}),
        )
        .expect("json")
    }

    #[test]
    fn an_identical_reply_is_recognised_by_its_bytes_and_only_then() {
        let pins = Pins::open(None, "test.toml").expect("pins");
        let catalog = Catalog::new("s", Pinning::Off, pins);
        let tools = json!([{"name": "echo", "inputSchema": {"type": "object"}}]);
        let set = catalog.store(tools.as_array().expect("array"));
        let rest: Map<String, Value> = [("ttlMs".to_owned(), json!(0))].into_iter().collect();
        set.remember_source(&reply(1, &tools), &rest);

        assert_eq!(set.same_source(&reply(7, &tools), &json!(7)), Some(rest));
        // Another id than the one asked for, or another list: not the same.
        assert_eq!(set.same_source(&reply(7, &tools), &json!(8)), None);
        let changed = json!([{"name": "echo", "inputSchema": {"type": "object"}, "title": "x"}]);
        assert_eq!(set.same_source(&reply(7, &changed), &json!(7)), None);
        assert_eq!(set.same_source(b"not json", &json!(7)), None);
    }
}
