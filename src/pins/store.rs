//! The pin store on disk: one SQLite file (WAL), its schema migrations, and
//! the writer thread that keeps it in step with the in-memory view.
//!
//! Place in the path: off it. The request path updates the in-memory view and
//! leaves the changed rows in a pending map; the writer thread (the only
//! writer of the gateway) takes the map, writes it in one transaction, and
//! between batches notices approvals written by another process (`portcullis
//! pins approve`) through `PRAGMA data_version`, merging them into the view.
//!
//! Invariants: the request path never touches the disk and never waits for
//! the writer; pending rows are coalesced per pin, so nothing is ever dropped
//! and the map stays as small as the number of pins; the gateway's writes
//! change a pin's `approved_*` columns only when the gateway itself approved
//! (first use or admin API), so an approval made by the CLI in between is
//! never overwritten.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::model::{Approved, Key, PinKind, Record, Version};
use super::scan::Finding;
pub(crate) use crate::util::sqlite::{StoreError, err, open_migrated, open_read_only};

/// How often the writer looks for approvals made by another process.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// Schema versions, applied in order; each runs once, in a transaction.
const MIGRATIONS: &[&str] = &[
    // 1: pins and their findings.
    "CREATE TABLE pins (
        server              TEXT    NOT NULL,
        kind                TEXT    NOT NULL CHECK (kind IN ('tool', 'instructions')),
        name                TEXT    NOT NULL,
        approved_hash       TEXT,
        approved_definition TEXT,
        approved_at         INTEGER,
        approved_by         TEXT,
        seen_hash           TEXT    NOT NULL,
        seen_definition     TEXT    NOT NULL,
        seen_at             INTEGER NOT NULL,
        findings            TEXT    NOT NULL DEFAULT '[]',
        present             INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (server, kind, name)
    ) WITHOUT ROWID",
];

/// Opens (creating if needed) and migrates the store at `path`.
pub(crate) fn open(path: &Path) -> Result<Connection, StoreError> {
    open_migrated(path, MIGRATIONS)
}

/// Every pin in the store.
pub(crate) fn load(conn: &Connection) -> rusqlite::Result<Vec<(Key, Record)>> {
    let mut stmt = conn.prepare(
        "SELECT server, kind, name, approved_hash, approved_definition, approved_at, approved_by,
                seen_hash, seen_definition, seen_at, findings, present
         FROM pins ORDER BY server, kind, name",
    )?;
    let rows = stmt.query_map([], |r| {
        let kind: String = r.get(1)?;
        let key = Key {
            server: r.get(0)?,
            kind: if kind == "instructions" {
                PinKind::Instructions
            } else {
                PinKind::Tool
            },
            name: r.get(2)?,
        };
        let approved = match (
            r.get::<_, Option<String>>(3)?,
            r.get::<_, Option<String>>(4)?,
        ) {
            (Some(hash), Some(definition)) => Some(Approved {
                version: version(&hash, &definition, r.get::<_, Option<i64>>(5)?.unwrap_or(0)),
                by: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
            }),
            _ => None,
        };
        let seen_hash: String = r.get(7)?;
        let seen_definition: String = r.get(8)?;
        let findings: String = r.get(10)?;
        let record = Record {
            approved,
            seen: version(&seen_hash, &seen_definition, r.get(9)?),
            findings: Arc::new(parse_findings(&findings)),
            present: r.get::<_, i64>(11)? != 0,
        };
        Ok((key, record))
    })?;
    rows.collect()
}

fn version(hash: &str, definition: &str, at: i64) -> Version {
    let mut digest = [0u8; 32];
    let _ = hex::decode_to_slice(hash, &mut digest);
    Version {
        hash: digest,
        definition: Arc::new(serde_json::from_str(definition).unwrap_or(Value::Null)),
        at,
    }
}

fn parse_findings(text: &str) -> Vec<Finding> {
    serde_json::from_str(text).unwrap_or_default()
}

/// A row to write, and whether its approval is the gateway's own.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub record: Record,
    pub approval_changed: bool,
}

fn write(conn: &mut Connection, batch: &BTreeMap<Key, Pending>) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut upsert = tx.prepare_cached(
            "INSERT INTO pins (server, kind, name, approved_hash, approved_definition, approved_at,
                               approved_by, seen_hash, seen_definition, seen_at, findings, present)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT (server, kind, name) DO UPDATE SET
                seen_hash = excluded.seen_hash, seen_definition = excluded.seen_definition,
                seen_at = excluded.seen_at, findings = excluded.findings, present = excluded.present",
        )?;
        let mut approve = tx.prepare_cached(
            "UPDATE pins SET approved_hash = ?4, approved_definition = ?5, approved_at = ?6, approved_by = ?7
             WHERE server = ?1 AND kind = ?2 AND name = ?3",
        )?;
        for (key, pending) in batch {
            let r = &pending.record;
            let (a_hash, a_def, a_at, a_by) = match &r.approved {
                Some(a) => (
                    Some(hex::encode(a.version.hash)),
                    Some(super::jcs::canonical(&a.version.definition)),
                    Some(a.version.at),
                    Some(a.by.clone()),
                ),
                None => (None, None, None, None),
            };
            let findings = serde_json::to_string(&*r.findings).unwrap_or_else(|_| "[]".into());
            upsert.execute(params![
                key.server,
                key.kind.as_str(),
                key.name,
                a_hash,
                a_def,
                a_at,
                a_by,
                hex::encode(r.seen.hash),
                super::jcs::canonical(&r.seen.definition),
                r.seen.at,
                findings,
                r.present as i64,
            ])?;
            if pending.approval_changed {
                approve.execute(params![
                    key.server,
                    key.kind.as_str(),
                    key.name,
                    a_hash,
                    a_def,
                    a_at,
                    a_by
                ])?;
            }
        }
    }
    tx.commit()
}

/// Approves the last-seen definition of a pin in the store at `path`
/// (`portcullis pins approve`). `expected`, when given, must be its hash.
pub(crate) fn approve_in_file(
    path: &Path,
    key: &Key,
    expected: Option<&str>,
    by: &str,
) -> Result<ApproveOutcome, StoreError> {
    let e = err(path);
    let mut conn = open(path)?;
    // Immediate: the row is read and updated under one write lock (a deferred
    // read could not be upgraded while the gateway's writer commits).
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&e)?;
    let row: Option<(String, Option<String>)> = tx
        .query_row(
            "SELECT seen_hash, approved_hash FROM pins WHERE server = ?1 AND kind = ?2 AND name = ?3",
            params![key.server, key.kind.as_str(), key.name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(&e)?;
    let Some((seen, approved)) = row else {
        return Ok(ApproveOutcome::Unknown);
    };
    if let Some(want) = expected
        && !want.eq_ignore_ascii_case(&seen)
    {
        return Ok(ApproveOutcome::HashMismatch { seen });
    }
    if approved.as_deref() == Some(seen.as_str()) {
        return Ok(ApproveOutcome::AlreadyApproved { hash: seen });
    }
    tx.execute(
        "UPDATE pins SET approved_hash = seen_hash, approved_definition = seen_definition,
                         approved_at = ?4, approved_by = ?5
         WHERE server = ?1 AND kind = ?2 AND name = ?3",
        params![
            key.server,
            key.kind.as_str(),
            key.name,
            crate::util::time::now_ms(),
            by
        ],
    )
    .map_err(&e)?;
    tx.commit().map_err(&e)?;
    Ok(ApproveOutcome::Approved { hash: seen })
}

/// What an approval did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApproveOutcome {
    /// The definition with this hash is now the pinned one.
    Approved { hash: String },
    /// It already was.
    AlreadyApproved { hash: String },
    /// No such pin.
    Unknown,
    /// The definition changed since the operator looked.
    HashMismatch { seen: String },
}

// === writer thread ===

/// What the request path hands the writer.
#[derive(Debug)]
pub(crate) enum Signal {
    /// Rows are pending.
    Wake,
    /// Write everything pending, then answer.
    Flush(std::sync::mpsc::Sender<()>),
}

/// The request path's side of the writer.
#[derive(Debug)]
pub(crate) struct Writer {
    pub pending: Arc<Mutex<BTreeMap<Key, Pending>>>,
    signal: SyncSender<Signal>,
}

impl Writer {
    /// Hands `record` to the writer (coalesced with anything pending for `key`).
    /// Call with the view's lock held, so the writer's merge sees both or neither.
    pub(crate) fn put(&self, key: Key, record: Record, approval_changed: bool) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let approval_changed = approval_changed
                || pending
                    .get(&key)
                    .is_some_and(|p: &Pending| p.approval_changed);
            pending.insert(
                key,
                Pending {
                    record,
                    approval_changed,
                },
            );
        }
        match self.signal.try_send(Signal::Wake) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => {
                tracing::error!("the pin store writer has stopped; pins are kept in memory only");
            }
        }
    }

    /// Blocks until everything pending is on disk (shutdown and tests).
    pub(crate) fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.signal.send(Signal::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }
}

/// Called by the writer with approvals made by another process.
pub(crate) type Merge = Box<dyn Fn(Vec<(Key, Record)>) + Send>;

/// Starts the writer thread for the store at `path`, whose connection is `conn`.
pub(crate) fn spawn(path: PathBuf, conn: Connection, merge: Merge) -> std::io::Result<Writer> {
    let pending: Arc<Mutex<BTreeMap<Key, Pending>>> = Arc::default();
    let (signal, rx) = std::sync::mpsc::sync_channel(64);
    let shared = pending.clone();
    std::thread::Builder::new()
        .name("portcullis-pins".into())
        .spawn(move || run(path, conn, shared, rx, merge))?;
    Ok(Writer { pending, signal })
}

fn run(
    path: PathBuf,
    mut conn: Connection,
    pending: Arc<Mutex<BTreeMap<Key, Pending>>>,
    rx: Receiver<Signal>,
    merge: Merge,
) {
    let mut seen_version = data_version(&conn).unwrap_or(0);
    loop {
        let signal = rx.recv_timeout(POLL);
        let batch = std::mem::take(&mut *pending.lock().unwrap_or_else(|p| p.into_inner()));
        if !batch.is_empty()
            && let Err(e) = write(&mut conn, &batch)
        {
            tracing::error!(path = %path.display(), error = %e, rows = batch.len(), "cannot write pins; retrying");
            // Put the rows back under anything newer.
            let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
            for (k, v) in batch {
                p.entry(k).or_insert(v);
            }
        }
        match data_version(&conn) {
            Ok(v) if v != seen_version => {
                seen_version = v;
                match load(&conn) {
                    Ok(rows) => merge(rows),
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "cannot read pins")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot poll the pin store")
            }
        }
        match signal {
            Ok(Signal::Wake) | Err(RecvTimeoutError::Timeout) => {}
            Ok(Signal::Flush(done)) => {
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}
