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

pub mod cli;
pub(crate) mod jcs;
pub(crate) mod scan;
pub(crate) mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use crate::util::time::{iso8601, now_ms};
use scan::{Finding, OtherTools, Severity};
pub(crate) use store::{ApproveOutcome, StoreError};

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// Most changes listed for one definition.
const MAX_CHANGES: usize = 12;

/// The pin of a JSON value: SHA-256 of its RFC 8785 canonical form.
pub fn digest(value: &Value) -> Digest {
    Sha256::digest(jcs::canonical(value).as_bytes()).into()
}

/// What is pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PinKind {
    /// One tool definition (the whole object of `tools/list`).
    Tool,
    /// The server's `instructions` (from `initialize` or `server/discover`).
    Instructions,
}

impl PinKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PinKind::Tool => "tool",
            PinKind::Instructions => "instructions",
        }
    }
}

/// Which pin.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    pub server: String,
    pub kind: PinKind,
    /// The tool's name; empty for instructions.
    pub name: String,
}

impl Key {
    pub(crate) fn tool(server: &str, tool: &str) -> Self {
        Self {
            server: server.to_owned(),
            kind: PinKind::Tool,
            name: tool.to_owned(),
        }
    }

    pub(crate) fn instructions(server: &str) -> Self {
        Self {
            server: server.to_owned(),
            kind: PinKind::Instructions,
            name: String::new(),
        }
    }
}

/// One definition, as hashed.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    pub hash: Digest,
    pub definition: Arc<Value>,
    /// When it was first seen (or approved), in Unix milliseconds.
    pub at: i64,
}

/// The definition an operator (or first use) trusted.
#[derive(Debug, Clone)]
pub(crate) struct Approved {
    pub version: Version,
    /// `first use`, `cli` or `api`.
    pub by: String,
}

/// What the gateway knows of one pin.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The trusted definition; `None` until one is approved.
    pub approved: Option<Approved>,
    /// The definition the server served last.
    pub seen: Version,
    /// Poisoning scan of the seen definition.
    pub findings: Arc<Vec<Finding>>,
    /// False once the server stopped listing it.
    pub present: bool,
}

/// A pin's state, as operators see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// The server serves the approved definition.
    Trusted,
    /// The server serves another definition than the approved one.
    Changed,
    /// Never approved: new with poisoning warnings.
    Unapproved,
}

impl Record {
    fn trusted(&self) -> bool {
        self.approved
            .as_ref()
            .is_some_and(|a| a.version.hash == self.seen.hash)
    }

    pub(crate) fn status(&self) -> Status {
        match &self.approved {
            _ if self.trusted() => Status::Trusted,
            Some(_) => Status::Changed,
            None => Status::Unapproved,
        }
    }

    fn warnings(&self) -> bool {
        self.findings
            .iter()
            .any(|f| f.severity == Severity::Warning)
    }
}

/// What the gateway does with a definition a server served.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// Trusted (or pinning is off).
    Pass,
    /// Not trusted, passed anyway (`warn`).
    Flag(Arc<Hold>),
    /// Not trusted, held back (`block`).
    Hold(Arc<Hold>),
}

impl Verdict {
    /// The hold, when calls must be refused.
    pub(crate) fn held(&self) -> Option<&Arc<Hold>> {
        match self {
            Verdict::Hold(h) => Some(h),
            _ => None,
        }
    }

    /// The difference, when the definition passes untrusted (`warn`).
    pub(crate) fn flagged(&self) -> Option<&Arc<Hold>> {
        match self {
            Verdict::Flag(h) => Some(h),
            _ => None,
        }
    }
}

/// Why a definition is held, and what is known about the difference.
#[derive(Debug)]
pub(crate) struct Hold {
    pub server: String,
    pub tool: String,
    pub cause: Cause,
    /// The approved definition of the tool, served in lists instead of the live one.
    pub pinned: Option<Arc<Value>>,
    /// When the approved definition was approved.
    pub pinned_at: Option<i64>,
    /// Hash of the definition the server serves now.
    pub seen_hash: Digest,
    /// What differs between the approved and the live definition.
    pub changes: Vec<Change>,
    /// How many changes there are in all (more than `changes` lists when cut).
    pub total_changes: usize,
    /// Poisoning scan of the live definition (or of the instructions).
    pub findings: Arc<Vec<Finding>>,
    /// The configuration file, for the approve command.
    pub config: String,
}

/// Why a definition is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// It differs from the approved definition.
    Changed,
    /// It was never approved (new, with poisoning warnings).
    New,
    /// The server's instructions changed: every tool of the server is held.
    Instructions,
}

/// One difference between two definitions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Change {
    /// JSON pointer into the definition.
    pub pointer: String,
    /// Approved value (`None`: absent).
    pub before: Option<Value>,
    /// Live value (`None`: removed).
    pub after: Option<Value>,
}

/// The RFC 8785 canonical serialization of a JSON value.
pub fn canonical(value: &Value) -> String {
    jcs::canonical(value)
}

/// How many poisoning findings the scan has for one tool definition.
pub fn scan_findings(definition: &Value) -> usize {
    scan::tool(definition, &OtherTools::default()).len()
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

/// A pin as operators see it (API and CLI).
pub(crate) fn entry_json(key: &Key, r: &Record, config: &str) -> Value {
    let (changes, total) = match &r.approved {
        Some(a) if !r.trusted() => diff(&a.version.definition, &r.seen.definition),
        _ => (Vec::new(), 0),
    };
    let mut out = json!({
        "kind": key.kind.as_str(),
        "status": r.status(),
        "present": r.present,
        "approved": r.approved.as_ref().map(|a| json!({
            "hash": hex::encode(a.version.hash), "at": iso8601(a.version.at), "by": a.by,
        })),
        "seen": {"hash": hex::encode(r.seen.hash), "at": iso8601(r.seen.at)},
        "findings": &*r.findings,
        "changes": changes,
        "total_changes": total,
    });
    if key.kind == PinKind::Tool {
        out["name"] = key.name.clone().into();
    }
    if r.status() != Status::Trusted {
        out["approve"] = json!({
            "cli": approve_command(config, key),
            "api": {"method": "POST", "path": "/api/pins/approve", "body": approve_body(key, Some(&r.seen.hash))},
        });
    }
    out
}

/// The CLI command that approves `key`.
pub(crate) fn approve_command(config: &str, key: &Key) -> String {
    let subject = match key.kind {
        PinKind::Tool => format!("--tool {}", shell_word(&key.name)),
        PinKind::Instructions => "--instructions".to_owned(),
    };
    format!(
        "portcullis pins approve --config {} --server {} {subject}",
        shell_word(config),
        shell_word(&key.server)
    )
}

/// The admin API body that approves `key`.
pub(crate) fn approve_body(key: &Key, hash: Option<&Digest>) -> Value {
    let mut body = json!({"server": key.server});
    match key.kind {
        PinKind::Tool => body["tool"] = key.name.clone().into(),
        PinKind::Instructions => body["instructions"] = true.into(),
    }
    if let Some(h) = hash {
        body["hash"] = hex::encode(h).into();
    }
    body
}

fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '='))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn summary(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("{} at {}", f.kind.as_str(), f.path))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The top-level fields a list of changes touches (`description`, `inputSchema`, …).
pub(crate) fn changed_fields(changes: &[Change]) -> Vec<String> {
    let mut fields: Vec<String> = changes
        .iter()
        .map(|c| {
            let first = c.pointer.trim_start_matches('/').split('/').next();
            match first {
                Some("") | None => "(whole definition)".to_owned(),
                Some(f) => f.replace("~1", "/").replace("~0", "~"),
            }
        })
        .collect();
    fields.dedup();
    fields.sort();
    fields.dedup();
    fields
}

/// The differences between two JSON values, as pointers; at most
/// [`MAX_CHANGES`] listed, with the total count.
pub(crate) fn diff(old: &Value, new: &Value) -> (Vec<Change>, usize) {
    let mut out = Vec::new();
    let mut total = 0;
    diff_at(old, new, &mut String::new(), &mut out, &mut total);
    (out, total)
}

fn diff_at(old: &Value, new: &Value, at: &mut String, out: &mut Vec<Change>, total: &mut usize) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let len = at.len();
                at.push('/');
                at.push_str(&key.replace('~', "~0").replace('/', "~1"));
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff_at(x, y, at, out, total),
                    (x, y) => push_change(out, total, at, x, y),
                }
                at.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let len = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                diff_at(x, y, at, out, total);
                at.truncate(len);
            }
        }
        (a, b) if jcs::canonical(a) == jcs::canonical(b) => {}
        (a, b) => push_change(out, total, at, Some(a), Some(b)),
    }
}

fn push_change(
    out: &mut Vec<Change>,
    total: &mut usize,
    at: &str,
    before: Option<&Value>,
    after: Option<&Value>,
) {
    *total += 1;
    if out.len() < MAX_CHANGES {
        out.push(Change {
            pointer: at.to_owned(),
            before: before.cloned(),
            after: after.cloned(),
        });
    }
}

/// A value as short, visible JSON: hidden characters spelled out, cut after
/// a few dozen characters.
pub(crate) fn short(value: &Value) -> String {
    let mut out = String::new();
    for (n, c) in value.to_string().chars().enumerate() {
        if n == 60 {
            out.push('…');
            break;
        }
        if scan::is_hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// `pinning` of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinning {
    /// Definitions are not pinned.
    Off,
    /// A changed definition passes and is flagged.
    Warn,
    /// A changed definition is quarantined until approved.
    Block,
}

impl Pinning {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Pinning::Off => "off",
            Pinning::Warn => "warn",
            Pinning::Block => "block",
        }
    }
}

/// `[pins]`: the store of pinned tool definitions and server instructions.
#[derive(Debug, Clone)]
pub struct PinsSettings {
    /// The SQLite file (`database`; default `portcullis-pins.db` beside
    /// `[audit] database`; a relative path is read from the configuration
    /// file's directory). `None` (written `":memory:"`): kept in memory only,
    /// so every restart trusts on first use again.
    pub database: Option<PathBuf>,
}

#[cfg(test)]
mod tests;
