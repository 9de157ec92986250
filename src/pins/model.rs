//! What a pin is: the key of a pinned thing (a tool definition, a server's
//! instructions), its approved and last-seen versions, its status, and what
//! a look-up of a live definition decides; plus `[pins]` settings and a
//! server's `pinning`.
//!
//! Place: the bottom of `pins`; the view, the store and the CLI build on it.
//! Invariant: a digest is the SHA-256 of the RFC 8785 canonical form, so two
//! spellings of one definition share their pin.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::jcs;
use super::scan::{Finding, Severity};

/// A SHA-256 digest.
pub type Digest = [u8; 32];

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
    pub(crate) fn trusted(&self) -> bool {
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

    pub(crate) fn warnings(&self) -> bool {
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
