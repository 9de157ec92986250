//! Tool-definition pinning: every tool definition and every server's
//! instructions are trusted on first use, pinned by the SHA-256 of their RFC
//! 8785 canonical JSON, and held back when they change until an operator
//! approves the change.
//!
//! Place in the path: [`Pins::observe_tools`] runs where a server's tool list
//! is stored (`proxy::catalog`), and decides per tool: pass, flag (`warn`) or
//! hold (`block`: lists serve the pinned definition, calls are answered with
//! `tool_quarantined`). [`Pins::observe_instructions`] runs where `initialize`
//! and `server/discover` replies pass. Approvals come from the admin API
//! ([`Pins::approve`]) or from `portcullis pins approve`, which writes the
//! store file; the writer thread notices and merges them.
//!
//! Invariants: the hot path is an in-memory lookup (hash and compare; a
//! definition is scanned only when its hash is new); the disk is touched only
//! by the writer thread ([`store`]); a definition with poisoning warnings is
//! never trusted on first use; any semantic change (and nothing else: not key
//! order, whitespace or number spelling) changes the pin.

pub(crate) mod fleet;
pub(crate) mod jcs;
pub(crate) mod model;
pub(crate) mod present;
pub(crate) mod scan;
pub(crate) mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value, json};

use crate::util::time::now_ms;
pub(crate) use model::{
    Approved, Cause, Change, Hold, Key, PinKind, Record, Status, Verdict, Version,
};
pub use model::{Digest, Pinning, PinsSettings, digest};
pub(crate) use present::{
    approve_body, approve_command, changed_fields, diff, entry_json, short, summary,
};
use scan::{Finding, OtherTools};
pub(crate) use store::{ApproveOutcome, StoreError};

/// The RFC 8785 canonical serialization of a JSON value.
pub fn canonical(value: &Value) -> String {
    jcs::canonical(value)
}

/// How many poisoning findings the scan has for one tool definition.
pub fn scan_findings(definition: &Value) -> usize {
    scan::tool(definition, &OtherTools::default()).len()
}

/// How many poisoning findings the output scan has for one tool result
/// (the `result` member), for benchmarks.
pub fn output_findings(result: &Value) -> usize {
    scan::output(result).len()
}

/// Pins kept in memory only, observed as a `block` server's: what the
/// gateway does on every `tools/list`, for benchmarks.
#[derive(Debug)]
pub struct MemoryPins(Arc<Pins>);

impl MemoryPins {
    /// An empty store.
    pub fn new() -> Self {
        Self(Arc::new(Pins::empty(":memory:", "bench.toml", None)))
    }

    /// Pins a whole list of `server` (hash, compare, scan what is new); returns
    /// how many tools are held.
    pub fn observe(&self, server: &str, tools: &[Value]) -> usize {
        self.0
            .observe_tools(server, Pinning::Block, tools)
            .iter()
            .filter(|v| v.held().is_some())
            .count()
    }
}

impl Default for MemoryPins {
    fn default() -> Self {
        Self::new()
    }
}

/// Every pin of one server.
#[derive(Debug, Default)]
struct ServerView {
    tools: HashMap<String, Record>,
    instructions: Option<Record>,
}

/// The pins of every server: an in-memory view, written behind to SQLite.
#[derive(Debug)]
pub(crate) struct Pins {
    view: RwLock<HashMap<String, ServerView>>,
    /// Bumped whenever trust changes other than through a list (approvals,
    /// instructions): cached verdicts older than it are stale.
    generation: AtomicU64,
    writer: Option<store::Writer>,
    /// Where the store lives (`:memory:` when not durable).
    location: String,
    /// The configuration file, for the approve command in texts.
    config: String,
}

impl Pins {
    /// Opens the store at `path` (`None`: memory only) and loads every pin.
    pub(crate) fn open(path: Option<&Path>, config: &str) -> Result<Arc<Self>, StoreError> {
        let Some(path) = path else {
            return Ok(Arc::new(Self::empty(":memory:", config, None)));
        };
        let conn = store::open(path)?;
        let rows = store::load(&conn).map_err(|e| StoreError::new(path, e))?;
        let mut spawn_error = None;
        let pins = Arc::new_cyclic(|weak: &std::sync::Weak<Pins>| {
            let weak = weak.clone();
            let merge: store::Merge = Box::new(move |rows| {
                if let Some(pins) = weak.upgrade() {
                    pins.merge(rows);
                }
            });
            let writer = match store::spawn(PathBuf::from(path), conn, merge) {
                Ok(w) => Some(w),
                Err(e) => {
                    spawn_error = Some(e);
                    None
                }
            };
            let pins = Self::empty(&path.display().to_string(), config, writer);
            pins.load(rows);
            pins
        });
        if let Some(e) = spawn_error {
            return Err(StoreError::new(path, e));
        }
        Ok(pins)
    }

    fn empty(location: &str, config: &str, writer: Option<store::Writer>) -> Self {
        Self {
            view: RwLock::default(),
            generation: AtomicU64::new(0),
            writer,
            location: location.to_owned(),
            config: config.to_owned(),
        }
    }

    fn load(&self, rows: Vec<(Key, Record)>) {
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        for (key, record) in rows {
            let server = view.entry(key.server).or_default();
            match key.kind {
                PinKind::Tool => {
                    server.tools.insert(key.name, record);
                }
                PinKind::Instructions => server.instructions = Some(record),
            }
        }
    }

    /// Changes whenever cached verdicts may have gone stale.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Waits until every pin is on disk.
    pub(crate) fn flush(&self) {
        if let Some(w) = &self.writer {
            w.flush();
        }
    }

    fn put(&self, key: Key, record: &Record, approval_changed: bool) {
        if let Some(w) = &self.writer {
            w.put(key, record.clone(), approval_changed);
        }
    }

    // --- the hot path ---

    /// Pins `tools` (a server's whole list) and decides what each gets.
    pub(crate) fn observe_tools(
        &self,
        server: &str,
        mode: Pinning,
        tools: &[Value],
    ) -> Vec<Verdict> {
        if mode == Pinning::Off {
            return vec![Verdict::Pass; tools.len()];
        }
        let seen: Vec<(Option<&str>, Digest)> = tools
            .iter()
            .map(|t| (t.get("name").and_then(Value::as_str), digest(t)))
            .collect();
        {
            let view = self.view.read().unwrap_or_else(|p| p.into_inner());
            if let Some(sv) = view.get(server)
                && self.unchanged(sv, &seen)
            {
                return self.verdicts(server, sv, mode, &seen);
            }
        }
        // Something is new, changed or gone: scan what is new, outside the lock.
        let others = self.other_tools(server, &seen);
        let scans: Vec<Option<Vec<Finding>>> = {
            let view = self.view.read().unwrap_or_else(|p| p.into_inner());
            let sv = view.get(server);
            tools
                .iter()
                .zip(&seen)
                .map(|(tool, (name, hash))| {
                    let known = name
                        .and_then(|n| sv.and_then(|sv| sv.tools.get(n)))
                        .is_some_and(|r| &r.seen.hash == hash);
                    (!known && name.is_some()).then(|| scan::tool(tool, &others))
                })
                .collect()
        };
        let now = now_ms();
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        let sv = view.entry(server.to_owned()).or_default();
        let mut listed = BTreeSet::new();
        for ((tool, (name, hash)), scanned) in tools.iter().zip(&seen).zip(scans) {
            let Some(name) = name else { continue };
            listed.insert(*name);
            let key = Key {
                server: server.to_owned(),
                kind: PinKind::Tool,
                name: (*name).to_owned(),
            };
            let version = || Version {
                hash: *hash,
                definition: Arc::new(tool.clone()),
                at: now,
            };
            match sv.tools.get_mut(*name) {
                None => {
                    let findings = Arc::new(scanned.unwrap_or_default());
                    let mut record = Record {
                        approved: None,
                        seen: version(),
                        findings,
                        present: true,
                    };
                    if record.warnings() {
                        tracing::warn!(server, tool = name, findings = %summary(&record.findings),
                            "new tool definition has poisoning warnings; it is not trusted until approved");
                    } else {
                        record.approved = Some(Approved {
                            version: record.seen.clone(),
                            by: "first use".into(),
                        });
                        tracing::info!(server, tool = name, hash = %hex::encode(hash), "tool definition pinned on first use");
                    }
                    self.put(key, &record, record.approved.is_some());
                    sv.tools.insert((*name).to_owned(), record);
                }
                Some(record) if &record.seen.hash != hash => {
                    record.seen = version();
                    if let Some(findings) = scanned {
                        record.findings = Arc::new(findings);
                    }
                    record.present = true;
                    if record.trusted() {
                        tracing::info!(
                            server,
                            tool = name,
                            "tool definition is back to the approved one"
                        );
                    } else {
                        let fields = record
                            .approved
                            .as_ref()
                            .map(|a| changed_fields(&diff(&a.version.definition, tool).0))
                            .unwrap_or_default();
                        tracing::warn!(server, tool = name, pinning = mode.as_str(), changed = %fields.join(","),
                            findings = %summary(&record.findings), hash = %hex::encode(hash),
                            "tool definition differs from its pin");
                    }
                    self.put(key, record, false);
                }
                Some(record) if !record.present => {
                    record.present = true;
                    self.put(key, record, false);
                }
                Some(_) => {}
            }
        }
        for (name, record) in sv.tools.iter_mut() {
            if record.present && !listed.contains(name.as_str()) {
                record.present = false;
                tracing::info!(server, tool = %name, "tool no longer listed by the server; its pin is kept");
                let key = Key {
                    server: server.to_owned(),
                    kind: PinKind::Tool,
                    name: name.clone(),
                };
                self.put(key, record, false);
            }
        }
        self.verdicts(server, sv, mode, &seen)
    }

    fn unchanged(&self, sv: &ServerView, seen: &[(Option<&str>, Digest)]) -> bool {
        let all_known = seen.iter().all(|(name, hash)| {
            name.and_then(|n| sv.tools.get(n))
                .is_some_and(|r| r.present && &r.seen.hash == hash)
        });
        let present = sv.tools.values().filter(|r| r.present).count();
        all_known && present == seen.iter().filter(|(n, _)| n.is_some()).count()
    }

    fn verdicts(
        &self,
        server: &str,
        sv: &ServerView,
        mode: Pinning,
        seen: &[(Option<&str>, Digest)],
    ) -> Vec<Verdict> {
        let instructions_held =
            mode == Pinning::Block && sv.instructions.as_ref().is_some_and(|r| !r.trusted());
        seen.iter()
            .map(|(name, _)| {
                let Some(record) = name.and_then(|n| sv.tools.get(n)) else {
                    return Verdict::Pass;
                };
                let name = name.unwrap_or_default();
                let cause = match record.status() {
                    Status::Trusted if instructions_held => Cause::Instructions,
                    Status::Trusted => return Verdict::Pass,
                    Status::Changed => Cause::Changed,
                    Status::Unapproved => Cause::New,
                };
                let hold = Arc::new(self.hold(server, name, record, sv, cause));
                match mode {
                    Pinning::Block => Verdict::Hold(hold),
                    _ => Verdict::Flag(hold),
                }
            })
            .collect()
    }

    fn hold(
        &self,
        server: &str,
        tool: &str,
        record: &Record,
        sv: &ServerView,
        cause: Cause,
    ) -> Hold {
        let (subject, changes_of) = match cause {
            Cause::Instructions => match &sv.instructions {
                Some(i) => (i, true),
                None => (record, false),
            },
            _ => (record, true),
        };
        let (changes, total_changes) = match (&subject.approved, changes_of) {
            (Some(a), true) => diff(&a.version.definition, &subject.seen.definition),
            _ => (Vec::new(), 0),
        };
        Hold {
            server: server.to_owned(),
            tool: tool.to_owned(),
            cause,
            pinned: record
                .approved
                .as_ref()
                .map(|a| a.version.definition.clone()),
            pinned_at: subject.approved.as_ref().map(|a| a.version.at),
            seen_hash: subject.seen.hash,
            changes,
            total_changes,
            findings: subject.findings.clone(),
            config: self.config.clone(),
        }
    }

    /// Tool names of the servers other than `server`, for the scan.
    fn other_tools(&self, server: &str, own: &[(Option<&str>, Digest)]) -> OtherTools {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        let own: BTreeSet<&str> = own.iter().filter_map(|(n, _)| *n).collect();
        let pairs: Vec<(&str, &str)> = view
            .iter()
            .filter(|(s, _)| s.as_str() != server)
            .flat_map(|(s, sv)| {
                sv.tools
                    .iter()
                    .filter(|(_, r)| r.present)
                    .map(move |(t, _)| (s.as_str(), t.as_str()))
            })
            .collect();
        OtherTools::new(pairs, &|t| own.contains(t))
    }

    /// Pins a server's instructions (`null` when it gives none). Under `block`,
    /// changed instructions hold every tool of the server until approved.
    pub(crate) fn observe_instructions(&self, server: &str, mode: Pinning, instructions: &Value) {
        if mode == Pinning::Off {
            return;
        }
        let hash = digest(instructions);
        {
            let view = self.view.read().unwrap_or_else(|p| p.into_inner());
            let known = view
                .get(server)
                .and_then(|sv| sv.instructions.as_ref())
                .is_some_and(|r| r.seen.hash == hash);
            if known {
                return;
            }
        }
        let others = self.other_tools(server, &[]);
        let findings = match instructions {
            Value::String(text) => scan::instructions(text, &others),
            _ => Vec::new(),
        };
        let now = now_ms();
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        let sv = view.entry(server.to_owned()).or_default();
        let version = Version {
            hash,
            definition: Arc::new(instructions.clone()),
            at: now,
        };
        let key = Key {
            server: server.to_owned(),
            kind: PinKind::Instructions,
            name: String::new(),
        };
        let was_trusted = sv.instructions.as_ref().is_some_and(Record::trusted);
        let record = match sv.instructions.take() {
            None => {
                let mut record = Record {
                    approved: None,
                    seen: version,
                    findings: Arc::new(findings),
                    present: true,
                };
                if record.warnings() {
                    tracing::warn!(server, findings = %summary(&record.findings),
                        "server instructions have poisoning warnings; not trusted until approved");
                } else {
                    record.approved = Some(Approved {
                        version: record.seen.clone(),
                        by: "first use".into(),
                    });
                    tracing::info!(server, "server instructions pinned on first use");
                }
                self.put(key, &record, record.approved.is_some());
                record
            }
            Some(mut record) => {
                record.seen = version;
                record.findings = Arc::new(findings);
                if !record.trusted() {
                    tracing::warn!(server, pinning = mode.as_str(), findings = %summary(&record.findings),
                        "server instructions differ from their pin; under block every tool of the server is held");
                }
                self.put(key, &record, false);
                record
            }
        };
        if was_trusted != record.trusted() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        sv.instructions = Some(record);
    }

    // --- approvals ---

    /// Approves the definition last seen for `key`. `expected`, when given,
    /// must be its hash (hex), so an operator approves what they reviewed.
    pub(crate) fn approve(&self, key: &Key, expected: Option<&str>, by: &str) -> ApproveOutcome {
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        let record = view.get_mut(&key.server).and_then(|sv| match key.kind {
            PinKind::Tool => sv.tools.get_mut(&key.name),
            PinKind::Instructions => sv.instructions.as_mut(),
        });
        let Some(record) = record else {
            return ApproveOutcome::Unknown;
        };
        let seen = hex::encode(record.seen.hash);
        if let Some(want) = expected
            && !want.eq_ignore_ascii_case(&seen)
        {
            return ApproveOutcome::HashMismatch { seen };
        }
        if record.trusted() {
            return ApproveOutcome::AlreadyApproved { hash: seen };
        }
        let mut version = record.seen.clone();
        version.at = now_ms();
        record.approved = Some(Approved {
            version,
            by: by.to_owned(),
        });
        self.put(key.clone(), record, true);
        self.generation.fetch_add(1, Ordering::AcqRel);
        tracing::info!(server = %key.server, kind = key.kind.as_str(), name = %key.name, hash = %seen, by, "pin approved");
        ApproveOutcome::Approved { hash: seen }
    }

    /// Merges approvals another process wrote into the store.
    fn merge(&self, rows: Vec<(Key, Record)>) {
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        let pending = self
            .writer
            .as_ref()
            .map(|w| w.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut changed = false;
        for (key, row) in rows {
            let ours = pending
                .as_ref()
                .and_then(|p| p.get(&key))
                .is_some_and(|p| p.approval_changed);
            if ours {
                continue;
            }
            let sv = view.entry(key.server.clone()).or_default();
            let slot = match key.kind {
                PinKind::Tool => sv.tools.get_mut(&key.name),
                PinKind::Instructions => sv.instructions.as_mut(),
            };
            match slot {
                Some(record) => {
                    let theirs = row.approved.as_ref().map(|a| a.version.hash);
                    let mine = record.approved.as_ref().map(|a| a.version.hash);
                    if theirs != mine && theirs.is_some() {
                        tracing::info!(server = %key.server, kind = key.kind.as_str(), name = %key.name,
                            by = row.approved.as_ref().map(|a| a.by.as_str()).unwrap_or_default(),
                            "approval picked up from the pin store");
                        record.approved = row.approved;
                        changed = true;
                    }
                }
                None => {
                    match key.kind {
                        PinKind::Tool => {
                            sv.tools.insert(key.name.clone(), row);
                        }
                        PinKind::Instructions => sv.instructions = Some(row),
                    }
                    changed = true;
                }
            }
        }
        drop(pending);
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    // --- what operators see ---

    /// Every pin, for `GET /api/pins`.
    pub(crate) fn report(&self, modes: &BTreeMap<String, Pinning>) -> Value {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        let mut servers = Map::new();
        for (server, mode) in modes {
            let sv = view.get(server);
            let mut tools: Vec<(&String, &Record)> =
                sv.map(|sv| sv.tools.iter().collect()).unwrap_or_default();
            tools.sort_by(|a, b| a.0.cmp(b.0));
            let tools: Vec<Value> = tools
                .into_iter()
                .map(|(name, r)| self.entry(server, PinKind::Tool, name, r))
                .collect();
            let instructions = sv
                .and_then(|sv| sv.instructions.as_ref())
                .map(|r| self.entry(server, PinKind::Instructions, "", r));
            servers.insert(
                server.clone(),
                json!({"pinning": mode.as_str(), "instructions": instructions, "tools": tools}),
            );
        }
        json!({"store": self.location, "servers": servers})
    }

    fn entry(&self, server: &str, kind: PinKind, name: &str, r: &Record) -> Value {
        let key = Key {
            server: server.to_owned(),
            kind,
            name: name.to_owned(),
        };
        let mut entry = entry_json(&key, r, &self.config);
        // The tools page shows what the server serves (schema included).
        entry["definition"] = (*r.seen.definition).clone();
        entry
    }
}

#[cfg(test)]
mod tests;
