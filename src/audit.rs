//! The audit store: every finished request's event, kept in SQLite (one
//! replica) or in PostgreSQL (a fleet, `[audit] backend = "postgres"`).
//!
//! Place in the path: a sink of the record layer ([`crate::record`]). When a
//! request's trail is let go, its event is handed here. SQLite: with
//! `try_send` on a bounded channel; the writer thread inserts events in
//! batches, one transaction each, and deletes events older than
//! `[audit] retention`. PostgreSQL: appended to the replica's spool file
//! ([`spool`]) with one `write(2)`, then shipped in batches by the shipper
//! thread ([`postgres`]).
//!
//! Invariants: the request path never waits for a database: SQLite's queue
//! drops and counts when full ([`Counters::dropped`]); the spool is a
//! write to the kernel's page cache, done before the answer leaves, so a
//! replica killed after answering keeps the event (shipped by its next
//! start), and a spool past `[audit] buffer` unshipped events drops and
//! counts; every row carries the replica that wrote it; an event holds
//! argument values only under `arguments = "full"` (`redacted` replaces
//! every string a secret detector matches); everything queued is written
//! before [`Audit::flush`] returns (PostgreSQL: while it is reachable).

mod arguments;
mod counters;
mod postgres;
mod spool;

pub use arguments::{AuditArguments, record_arguments};
pub use counters::{Counters, STATE_DOWN, STATE_STARTING, STATE_UP};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};
use serde_json::Value;

pub use crate::record::event::Event;
use crate::record::sink::Sink;
use crate::util::sqlite as store;

/// Events the queue holds before new ones are dropped.
pub const QUEUE: usize = 65_536;
/// Most events written in one transaction.
const MAX_BATCH: usize = 1024;
/// How long the writer lets events gather after the first one of a batch
/// wakes it: the queue is drained once per window instead of once per event,
/// so under load one wake-up and one transaction carry many events, and
/// senders find the writer asleep (no wake-up to pay on their side).
const GATHER: Duration = Duration::from_millis(5);
/// How often old events are deleted.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Schema versions, applied in order; each runs once, in a transaction.
const MIGRATIONS: &[&str] = &[
    // 1: one row per client request.
    "CREATE TABLE events (
        id                  INTEGER PRIMARY KEY,
        time_ms             INTEGER NOT NULL,
        trace_id            TEXT,
        client              TEXT,
        server              TEXT,
        method              TEXT    NOT NULL,
        tool                TEXT,
        decision            TEXT    NOT NULL,
        stage               TEXT    NOT NULL,
        violations          TEXT    NOT NULL DEFAULT '[]',
        sanitizer           TEXT    NOT NULL DEFAULT '{}',
        pin_findings        TEXT,
        upstream_status     INTEGER,
        upstream_latency_us INTEGER,
        latency_us          INTEGER NOT NULL,
        http_status         INTEGER,
        era                 TEXT    NOT NULL,
        arguments           TEXT
    );
    CREATE INDEX events_time ON events (time_ms);",
    // 2: what enforcement would have refused, in observe mode (stores written
    // before it keep their rows; theirs have none).
    "ALTER TABLE events ADD COLUMN would_refuse TEXT;",
    // 3: human approval of a tool call (who was asked, the outcome, the
    // argument digest, who decided, when).
    "ALTER TABLE events ADD COLUMN approval TEXT;",
    // 4: the retries of a request the gateway sent more than once
    // (`{attempts, causes}`).
    "ALTER TABLE events ADD COLUMN retries TEXT;",
    // 5: what a resource, prompt, completion or listen request was about
    // (stores written before it keep their rows; theirs have none).
    "ALTER TABLE events ADD COLUMN subject TEXT;",
];

enum Msg {
    Event(Arc<Event>),
    Flush(std::sync::mpsc::Sender<()>),
}

/// The request path's side of the audit store.
#[derive(Debug)]
pub struct Audit {
    /// `[audit] enabled`: when false, nothing is queued or stored.
    enabled: bool,
    store: Store,
    counters: Arc<Counters>,
    /// `[gateway] replica`: written into every row.
    replica: String,
}

/// Where the events go.
#[derive(Debug)]
enum Store {
    Sqlite(SyncSender<Msg>),
    Postgres(Box<Fleet>),
}

/// The PostgreSQL side of the store.
#[derive(Debug)]
struct Fleet {
    shipper: Arc<postgres::Shipper>,
    /// Most unshipped events the spool keeps.
    buffer: u64,
    /// `replica:pid:start_ms:`, the prefix of every row key.
    key_prefix: String,
    seq: AtomicU64,
    /// The admin listener's reads of the fleet's events.
    reader: postgres::Reader,
}

/// What `/healthz` says of the audit store.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StoreHealth {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// `up`, `down` (unreachable: events wait in the spool) or `starting`.
    pub state: &'static str,
    /// Events waiting to be written.
    pub buffered: u64,
    /// Events lost (dropped when the buffer was full, or refused by the store).
    pub lost: u64,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl Audit {
    /// Opens (creating and migrating) the store of `settings` and starts its
    /// writer thread. `":memory:"` keeps events in memory only.
    pub fn open(settings: &AuditSettings) -> Result<Arc<Self>, String> {
        Self::open_with_queue(settings, QUEUE)
    }

    /// [`Audit::open`] with a queue of `capacity` events.
    pub fn open_with_queue(settings: &AuditSettings, capacity: usize) -> Result<Arc<Self>, String> {
        let counters = Arc::new(Counters {
            store: STATE_UP.into(),
            ..Counters::default()
        });
        let _ = counters.replica.set(settings.replica.clone());
        if let (AuditBackend::Postgres { url, spool, buffer }, true) =
            (&settings.backend, settings.enabled)
        {
            let spool = Arc::new(
                spool::Spool::open(Path::new(spool))
                    .map_err(|e| format!("cannot open the audit spool {spool}: {e}"))?,
            );
            counters.queued.store(spool.pending(), Ordering::Relaxed);
            if spool.pending() > 0 {
                tracing::info!(events = spool.pending(), spool = %spool.path().display(),
                    "shipping the audit events a previous run left in the spool");
            }
            let shipper = postgres::start(url, spool, counters.clone(), settings.retention)?;
            let reader = postgres::Reader::new(url)?;
            let key_prefix = format!(
                "{}:{}:{}:",
                settings.replica,
                std::process::id(),
                crate::util::time::now_ms()
            );
            return Ok(Arc::new(Self {
                enabled: true,
                store: Store::Postgres(Box::new(Fleet {
                    shipper,
                    buffer: *buffer,
                    key_prefix,
                    seq: AtomicU64::new(0),
                    reader,
                })),
                counters,
                replica: settings.replica.clone(),
            }));
        }
        // A disabled trail keeps an empty in-memory store, so every reader still works.
        let conn = if settings.database == ":memory:" || !settings.enabled {
            let mut conn = Connection::open_in_memory().map_err(|e| e.to_string())?;
            store::migrate(&mut conn, MIGRATIONS).map_err(|e| e.to_string())?;
            conn
        } else {
            store::open_migrated(Path::new(&settings.database), MIGRATIONS)
                .map_err(|e| e.to_string().replacen("pin store", "audit store", 1))?
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let shared = counters.clone();
        let retention = settings.retention;
        std::thread::Builder::new()
            .name("portcullis-audit".into())
            .spawn(move || run(conn, rx, shared, retention))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            enabled: settings.enabled,
            store: Store::Sqlite(tx),
            counters,
            replica: settings.replica.clone(),
        }))
    }

    /// Queues `event` without waiting; drops and counts it when the queue is full.
    pub fn record(&self, event: Event) {
        self.keep(Arc::new(event));
    }

    fn keep(&self, event: Arc<Event>) {
        if !self.enabled {
            return;
        }
        let tx = match &self.store {
            Store::Sqlite(tx) => tx,
            Store::Postgres(fleet) => {
                self.spool(fleet, &event);
                return;
            }
        };
        match tx.try_send(Msg::Event(event)) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Appends the event to the spool, unless the spool already holds
    /// `buffer` unshipped events: then it is dropped, counted and logged.
    fn spool(&self, fleet: &Fleet, event: &Event) {
        let Fleet {
            shipper,
            buffer,
            key_prefix,
            seq,
            ..
        } = fleet;
        let buffer = *buffer;
        if shipper.spool.pending() >= buffer {
            let lost = self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            // The first loss of a run and every thousandth after it.
            if lost.is_multiple_of(1000) {
                tracing::error!(
                    lost = lost + 1,
                    buffer,
                    "the audit spool is full (the database is unreachable): events are lost"
                );
            }
            return;
        }
        let key = format!("{key_prefix}{}", seq.fetch_add(1, Ordering::Relaxed));
        let line = spool::encode(&spool::Row {
            key: &key,
            replica: &self.replica,
            event,
        });
        match shipper.spool.append(&line) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
                shipper.wake.notify_one();
            }
            Err(e) => {
                let lost = self.counters.failed.fetch_add(1, Ordering::Relaxed);
                if lost.is_multiple_of(1000) {
                    tracing::error!(error = %e, lost = lost + 1, "cannot append to the audit spool: events are lost");
                }
            }
        }
    }

    /// Blocks until every event queued before the call is written, and old
    /// events are deleted (shutdown and tests). Gives up after ten seconds
    /// (PostgreSQL unreachable: the spool keeps them for the next start).
    pub fn flush(&self) {
        match &self.store {
            Store::Sqlite(tx) => {
                let (done, wait) = std::sync::mpsc::channel();
                if tx.send(Msg::Flush(done)).is_ok() {
                    let _ = wait.recv_timeout(Duration::from_secs(10));
                }
            }
            Store::Postgres(fleet) => {
                let shipper = &fleet.shipper;
                let deadline = Instant::now() + Duration::from_secs(10);
                shipper.wake.notify_one();
                while shipper.spool.pending() > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// The store's state, for `/healthz`.
    pub fn health(&self) -> StoreHealth {
        let c = &self.counters;
        let lost = c.dropped.load(Ordering::Relaxed) + c.failed.load(Ordering::Relaxed);
        match &self.store {
            Store::Sqlite(_) => StoreHealth {
                backend: "sqlite",
                state: "up",
                buffered: c.queued.load(Ordering::Relaxed),
                lost,
            },
            Store::Postgres(fleet) => StoreHealth {
                backend: "postgres",
                state: match c.store.load(Ordering::Relaxed) {
                    STATE_UP => "up",
                    STATE_DOWN => "down",
                    _ => "starting",
                },
                buffered: fleet.shipper.spool.pending(),
                lost,
            },
        }
    }

    /// The latest `limit` events of the whole fleet, oldest first, each with
    /// its `replica` (the dashboard's shape); `None` with SQLite, whose
    /// events the dashboard reads from its own ring.
    pub async fn fleet_events(&self, limit: usize) -> Option<Result<Vec<Value>, String>> {
        match &self.store {
            Store::Sqlite(_) => None,
            Store::Postgres(fleet) => Some(fleet.reader.latest(limit as i64).await),
        }
    }

    /// `[gateway] replica`.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// What the trail has done so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The counters, shared (for the metrics).
    pub fn shared_counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }
}

impl Sink for Audit {
    fn record(&self, event: &Arc<Event>) {
        self.keep(event.clone());
    }
}

// === writer thread ===

fn run(mut conn: Connection, rx: Receiver<Msg>, counters: Arc<Counters>, retention: Duration) {
    let mut last_purge = Instant::now();
    purge(&conn, retention);
    loop {
        let first = match rx.recv_timeout(RETENTION_EVERY) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                purge(&conn, retention);
                last_purge = Instant::now();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        if matches!(first, Msg::Event(_)) {
            std::thread::sleep(GATHER);
        }
        let mut next = Some(first);
        while let Some(m) = next {
            match m {
                Msg::Event(e) => batch.push(e),
                Msg::Flush(done) => flushes.push(done),
            }
            next = (batch.len() < MAX_BATCH)
                .then(|| rx.try_recv().ok())
                .flatten();
        }
        let n = batch.len() as u64;
        counters.queued.fetch_sub(n, Ordering::Relaxed);
        match write(&mut conn, &batch) {
            Ok(()) => counters.written.fetch_add(n, Ordering::Relaxed),
            Err(e) => {
                tracing::error!(error = %e, events = n, "cannot write audit events");
                counters.failed.fetch_add(n, Ordering::Relaxed)
            }
        };
        if !flushes.is_empty() || last_purge.elapsed() >= RETENTION_EVERY {
            purge(&conn, retention);
            last_purge = Instant::now();
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

fn write(conn: &mut Connection, batch: &[Arc<Event>]) -> rusqlite::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (time_ms, trace_id, client, server, method, tool, decision,
                stage, violations, sanitizer, pin_findings, upstream_status,
                upstream_latency_us, latency_us, http_status, era, arguments, would_refuse,
                approval, retries, subject)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
                ?19, ?20, ?21)",
        )?;
        for e in batch {
            let json = |v: &Value| v.to_string();
            insert.execute(params![
                e.time_ms,
                e.trace_id,
                e.client,
                e.server,
                e.method,
                e.tool,
                e.decision,
                e.stage,
                serde_json::to_string(&e.violations).unwrap_or_default(),
                serde_json::to_string(&e.sanitizer).unwrap_or_default(),
                e.pin_findings.as_ref().map(json),
                e.upstream_status,
                e.upstream_latency_us.map(|v| v as i64),
                e.latency_us as i64,
                e.http_status,
                e.era,
                e.arguments.as_ref().map(json),
                e.would_refuse,
                e.approval.as_ref().map(json),
                (e.retries.as_ref()).and_then(|r| serde_json::to_string(r).ok()),
                e.subject,
            ])?;
        }
    }
    tx.commit()
}

fn purge(conn: &Connection, retention: Duration) {
    let cutoff = crate::util::time::now_ms() - retention.as_millis() as i64;
    if let Err(e) = conn.execute("DELETE FROM events WHERE time_ms < ?1", params![cutoff]) {
        tracing::error!(error = %e, "cannot delete old audit events");
    }
}

/// `[audit]`.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Whether events are stored at all (metrics and the live feed see them either way).
    pub enabled: bool,
    /// Where events are kept: this replica's SQLite file, or the fleet's PostgreSQL.
    pub backend: AuditBackend,
    /// `[gateway] replica`: who wrote each row (default: the host name).
    pub replica: String,
    /// SQLite file (WAL); a relative path is read from the configuration
    /// file's directory. `":memory:"`: kept in memory only, lost at exit.
    pub database: String,
    /// How long events are kept.
    pub retention: Duration,
    /// How arguments are recorded.
    pub arguments: AuditArguments,
}

/// `backend` of `[audit]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditBackend {
    /// `database`, one SQLite file per replica.
    Sqlite,
    /// One PostgreSQL database for the fleet.
    Postgres {
        /// `url`: a PostgreSQL connection URL (`sslmode=require` for TLS).
        url: String,
        /// `spool`: this replica's spool file.
        spool: String,
        /// `buffer`: most unshipped events the spool keeps.
        buffer: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_of_the_first_schema_gains_the_would_refuse_column_and_keeps_its_rows() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.db");
        {
            let mut old = store::open_migrated(&path, &MIGRATIONS[..1]).expect("v1 store");
            old.execute(
                "INSERT INTO events (time_ms, method, decision, stage, latency_us, era)
                 VALUES (?1, 'tools/call', 'forwarded', 'forwarded', 1, '2026')",
                params![crate::util::time::now_ms()],
            )
            .expect("a v1 row");
            store::migrate(&mut old, &MIGRATIONS[..1]).expect("nothing new");
        }
        let conn = store::open_migrated(&path, MIGRATIONS).expect("migrated");
        let (rows, empty): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE would_refuse IS NULL) FROM events",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("the new column is there");
        assert_eq!((rows, empty), (1, 1));
        let versions: i64 = conn
            .query_row("SELECT MAX(version) FROM schema_migrations", [], |r| {
                r.get(0)
            })
            .expect("version");
        assert_eq!(versions, MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_store_of_the_fourth_schema_gains_the_subject_column_keeps_its_rows_and_takes_new_ones() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.db");
        {
            let old = store::open_migrated(&path, &MIGRATIONS[..4]).expect("v4 store");
            old.execute(
                "INSERT INTO events (time_ms, method, decision, stage, latency_us, era, retries)
                 VALUES (?1, 'resources/read', 'forwarded', 'forwarded', 1, '2026', '{}')",
                params![crate::util::time::now_ms()],
            )
            .expect("a v4 row");
        }
        let mut conn = store::open_migrated(&path, MIGRATIONS).expect("migrated");
        let read = Event {
            time_ms: crate::util::time::now_ms(),
            method: "resources/read".into(),
            subject: Some("file:///docs/a.md?rev=2".into()),
            decision: "forwarded".into(),
            stage: "forwarded".into(),
            era: "2026".into(),
            ..Event::default()
        };
        write(&mut conn, &[Arc::new(read)]).expect("a new row");
        let mut rows = conn
            .prepare("SELECT method, subject FROM events ORDER BY id")
            .expect("the new column is there");
        let rows: Vec<(String, Option<String>)> = rows
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("rows read");
        assert_eq!(
            rows,
            [
                ("resources/read".to_owned(), None),
                (
                    "resources/read".to_owned(),
                    Some("file:///docs/a.md?rev=2".to_owned())
                ),
            ]
        );
    }
}
