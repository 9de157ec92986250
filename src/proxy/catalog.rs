//! What the gateway knows of each server's tools: definitions from `tools/list`,
//! with their input schemas compiled.
//!
//! Place in the path: filled whenever a `tools/list` passes (a client's, or one
//! the gateway sends itself when a call arrives first); read by every
//! `tools/call`; emptied by `notifications/tools/list_changed`.
//!
//! Invariants: a schema is compiled once per distinct definition (keyed by its
//! SHA-256), also across refreshes; the compiled-schema cache is bounded; a
//! tool whose schema cannot be compiled stays listed as known but uncallable.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::validate::{CompiledSchema, SchemaError, SchemaLimits};

/// Most distinct schemas kept compiled per server.
const MAX_COMPILED: usize = 4096;

/// One server's tools.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    current: RwLock<Option<Arc<ToolSet>>>,
    compiled: Mutex<HashMap<[u8; 32], Result<CompiledSchema, SchemaError>>>,
}

/// A snapshot of a server's tools.
#[derive(Debug, Default)]
pub(crate) struct ToolSet {
    pub tools: BTreeMap<String, ToolEntry>,
}

/// One tool.
#[derive(Debug)]
pub(crate) struct ToolEntry {
    /// The definition as the server sent it.
    pub definition: Value,
    /// Its compiled `inputSchema`, or why it cannot be enforced.
    pub schema: Result<CompiledSchema, SchemaError>,
}

impl Catalog {
    /// The current snapshot, if a list has been seen since the last change.
    pub(crate) fn get(&self) -> Option<Arc<ToolSet>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the snapshot with `tools` (the full, all-pages list).
    pub(crate) fn store(&self, tools: &[Value]) -> Arc<ToolSet> {
        let mut set = ToolSet::default();
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
            let entry = ToolEntry {
                definition: tool.clone(),
                schema: self.compile(&schema),
            };
            set.tools.insert(name.to_owned(), entry);
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

impl ToolSet {
    /// Tool names, sorted.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }
}
