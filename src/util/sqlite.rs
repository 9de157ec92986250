//! Opening SQLite files the gateway keeps (pins, audit, approvals):
//! WAL mode, busy timeouts, and schema migrations applied once each.
//!
//! Place: a leaf under the stores; it knows no table of theirs. Invariants:
//! several processes may open and migrate one file at the same moment (each
//! waits for the others' locks, each migration runs once), and every failure
//! names the file.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};

/// A failure of the store, with the file it concerns.
#[derive(Debug, thiserror::Error)]
#[error("pin store {path}: {source}")]
pub(crate) struct StoreError {
    pub path: String,
    #[source]
    pub source: Fault,
}

/// What failed underneath.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Fault {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl StoreError {
    pub(crate) fn new(path: &Path, source: impl Into<Fault>) -> Self {
        Self {
            path: path.display().to_string(),
            source: source.into(),
        }
    }
}

pub(crate) fn err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::new(path, source)
}

/// How long a connection waits for another process's lock (the busy
/// timeout of every connection, and the bound on switching to WAL).
pub(crate) const BUSY: Duration = Duration::from_secs(5);

/// Opens (creating if needed) the SQLite file at `path` in WAL mode and
/// applies `migrations` not applied yet (shared with the audit store).
///
/// Several processes may do this at the same moment on one file (replicas
/// started together, a restart overlapping its predecessor): each waits for
/// the others' locks rather than failing, and each migration runs once.
pub(crate) fn open_migrated(path: &Path, migrations: &[&str]) -> Result<Connection, StoreError> {
    let e = err(path);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|io| StoreError::new(path, io))?;
    }
    let mut conn = Connection::open(path).map_err(&e)?;
    conn.busy_timeout(BUSY).map_err(&e)?;
    enable_wal(&conn).map_err(&e)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(&e)?;
    migrate(&mut conn, migrations).map_err(&e)?;
    Ok(conn)
}

/// Opens an existing store without writing to it (for `portcullis pins list`).
pub(crate) fn open_read_only(path: &Path) -> Result<Connection, StoreError> {
    let e = err(path);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(&e)?;
    conn.busy_timeout(BUSY).map_err(&e)?;
    Ok(conn)
}

/// Switches the file to WAL (a no-op once it is: the mode is stored in it).
///
/// On a fresh file the switch needs an exclusive lock, and SQLite answers
/// `SQLITE_BUSY` at once, without its busy handler, when another connection
/// is making the same switch (waiting could deadlock two upgraders); so the
/// switch is retried here, for at most [`BUSY`]. Whichever opener wins, the
/// others then find the file in WAL already.
fn enable_wal(conn: &Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + BUSY;
    let mut pause = Duration::from_millis(2);
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0)) {
            Ok(mode) => {
                if !mode.eq_ignore_ascii_case("wal") {
                    // A file system without shared memory keeps the rollback
                    // journal: slower for readers, still correct.
                    tracing::warn!(mode = %mode, "the SQLite store cannot use WAL");
                }
                return Ok(());
            }
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A lock held by another connection (`SQLITE_BUSY`, `SQLITE_LOCKED`).
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Applies the `migrations` not recorded in `schema_migrations`, in order.
///
/// Each step reads the recorded version and applies the next migration in
/// one `BEGIN IMMEDIATE` transaction: the write lock is taken before the
/// version is read, so a concurrent migrator (another process opening the
/// same file) waits and then finds the step done, instead of applying it a
/// second time ("table already exists").
pub(crate) fn migrate(conn: &mut Connection, migrations: &[&str]) -> rusqlite::Result<()> {
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version    INTEGER PRIMARY KEY,
                applied_at INTEGER NOT NULL
            )",
        )?;
        let current: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )?;
        let Some(sql) = usize::try_from(current)
            .ok()
            .and_then(|done| migrations.get(done))
        else {
            return tx.commit();
        };
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            params![current + 1, crate::util::time::now_ms()],
        )?;
        tx.commit()?;
    }
}
