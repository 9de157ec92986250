//! The fleet's audit in PostgreSQL: the shipper that moves spooled events
//! ([`super::spool`]) into one table shared by every replica, in batches,
//! on a thread of its own.
//!
//! Place: under the audit store; the request path only appends to the
//! spool. Invariants: the schema is migrated once per fleet, under a
//! PostgreSQL advisory lock, so replicas starting together do not race;
//! a batch is one statement, and a row's unique `key` makes a batch shipped
//! twice (a crash between the insert and the offset note) land once; while
//! the database is unreachable events stay in the spool (bounded by
//! `[audit] buffer`), the state is shown by `/healthz` and `/metrics`, and
//! the shipper retries with a capped backoff; TLS is used when the URL asks
//! for it (`sslmode=require`), through rustls with the ring provider,
//! verifying the server against the system's roots.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_postgres::config::SslMode;

use super::counters::{Counters, STATE_DOWN, STATE_STARTING, STATE_UP};
use super::spool::Spool;

/// Most events in one insert.
const MAX_BATCH: usize = 1000;
/// How long events gather after the first one wakes the shipper.
const GATHER: Duration = Duration::from_millis(5);
/// Longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often old events are deleted.
const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// The advisory lock key of the migrations (any constant the fleet shares).
const MIGRATION_LOCK: i64 = 0x706f_7274_6375_6c6c;

/// Schema versions of the fleet's table, applied in order, each once.
const MIGRATIONS: &[&str] = &[
    // 1: one row per client request, from every replica.
    "CREATE TABLE portcullis_events (
        id                  BIGSERIAL PRIMARY KEY,
        key                 TEXT    NOT NULL UNIQUE,
        replica             TEXT    NOT NULL,
        time_ms             BIGINT  NOT NULL,
        trace_id            TEXT,
        client              TEXT,
        server              TEXT,
        method              TEXT    NOT NULL,
        tool                TEXT,
        decision            TEXT    NOT NULL,
        stage               TEXT    NOT NULL,
        would_refuse        TEXT,
        violations          TEXT    NOT NULL DEFAULT '[]',
        sanitizer           TEXT    NOT NULL DEFAULT '{}',
        pin_findings        TEXT,
        upstream_status     INTEGER,
        upstream_latency_us BIGINT,
        latency_us          BIGINT  NOT NULL,
        http_status         INTEGER,
        era                 TEXT    NOT NULL,
        arguments           TEXT,
        approval            TEXT
    );
    CREATE INDEX portcullis_events_time ON portcullis_events (time_ms);
    CREATE INDEX portcullis_events_replica ON portcullis_events (replica, time_ms);",
    // 2: what a resource, prompt, completion or listen request was about
    // (a fleet's rows written before it keep theirs, with none).
    "ALTER TABLE portcullis_events ADD COLUMN subject TEXT;",
    // 3: the retries of a request the gateway sent more than once
    // (`{attempts, causes}`), as the SQLite store has kept them since its 4th.
    "ALTER TABLE portcullis_events ADD COLUMN retries TEXT;",
];

/// The columns of a spooled line, in the table's order; the JSON of the
/// line is read by PostgreSQL itself (`jsonb_to_recordset`).
const COLUMNS: &str = "key text, replica text, time_ms bigint, trace_id text, client text, \
    server text, method text, tool text, decision text, stage text, would_refuse text, \
    violations text, sanitizer text, pin_findings text, upstream_status integer, \
    upstream_latency_us bigint, latency_us bigint, http_status integer, era text, \
    arguments text, approval text, subject text, retries text";

fn insert_sql() -> String {
    let names: Vec<&str> = COLUMNS
        .split(", ")
        .map(|c| c.split(' ').next().unwrap_or_default())
        .collect();
    let names = names.join(", ");
    format!(
        "INSERT INTO portcullis_events ({names}) \
         SELECT {names} FROM jsonb_to_recordset($1::text::jsonb) AS r({COLUMNS}) \
         ON CONFLICT (key) DO NOTHING"
    )
}

/// The shipper's side shared with the request path.
#[derive(Debug)]
pub(crate) struct Shipper {
    pub spool: Arc<Spool>,
    pub wake: Notify,
}

/// Checks `url` and starts the shipper thread.
pub(crate) fn start(
    url: &str,
    spool: Arc<Spool>,
    counters: Arc<Counters>,
    retention: Duration,
) -> Result<Arc<Shipper>, String> {
    let config = tokio_postgres::Config::from_str(url)
        .map_err(|e| format!("audit.url is not a PostgreSQL connection URL: {e}"))?;
    counters.store.store(STATE_STARTING, Ordering::Relaxed);
    let shipper = Arc::new(Shipper {
        spool,
        wake: Notify::new(),
    });
    let shared = shipper.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("portcullis-audit-pg".into())
        .spawn(move || runtime.block_on(run(config, shared, counters, retention)))
        .map_err(|e| e.to_string())?;
    Ok(shipper)
}

async fn run(
    config: tokio_postgres::Config,
    shipper: Arc<Shipper>,
    counters: Arc<Counters>,
    retention: Duration,
) {
    let insert = insert_sql();
    let mut backoff = Duration::from_millis(100);
    let mut last_purge: Option<Instant> = None;
    loop {
        let client = match connect(&config).await {
            Ok(client) => client,
            Err(e) => {
                if counters.store.swap(STATE_DOWN, Ordering::Relaxed) != STATE_DOWN {
                    tracing::error!(error = %e, buffered = shipper.spool.pending(),
                        "the audit database is unreachable; events wait in the spool");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        if counters.store.swap(STATE_UP, Ordering::Relaxed) == STATE_DOWN {
            tracing::info!(
                buffered = shipper.spool.pending(),
                "the audit database is back; shipping the spool"
            );
        }
        // Ships until the connection fails; then connects again.
        loop {
            if last_purge.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
                let cutoff = crate::util::time::now_ms() - retention.as_millis() as i64;
                if let Err(e) = client
                    .execute(
                        "DELETE FROM portcullis_events WHERE time_ms < $1",
                        &[&cutoff],
                    )
                    .await
                {
                    tracing::warn!(error = %e, "cannot delete old audit events");
                }
                last_purge = Some(Instant::now());
            }
            let (lines, end) = match shipper.spool.unshipped(MAX_BATCH) {
                Ok(batch) => batch,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the audit spool");
                    tokio::time::sleep(MAX_BACKOFF).await;
                    continue;
                }
            };
            if lines.is_empty() {
                tokio::select! {
                    () = shipper.wake.notified() => tokio::time::sleep(GATHER).await,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let n = lines.len() as u64;
            let (rows, mut bad) = batch_rows(&lines);
            if let Err(e) = client.execute(&insert, &[&batch(&rows)]).await {
                if client.is_closed() {
                    counters.store.store(STATE_DOWN, Ordering::Relaxed);
                    tracing::error!(error = %e, buffered = shipper.spool.pending(),
                        "the audit database went away; events wait in the spool");
                    break;
                }
                // The database refused the batch itself: it would refuse it
                // again. Row by row, so one event it cannot take (whatever a
                // client put in it) costs no other event its row.
                tracing::error!(error = %e, events = n, "the audit database refused a batch");
                match one_by_one(&client, &insert, &rows).await {
                    Some(refused) => bad += refused,
                    None => {
                        counters.store.store(STATE_DOWN, Ordering::Relaxed);
                        break;
                    }
                }
            }
            if bad > 0 {
                tracing::error!(
                    events = bad,
                    "unreadable lines in the audit spool were passed over"
                );
                counters.failed.fetch_add(bad, Ordering::Relaxed);
            }
            counters.written.fetch_add(n - bad, Ordering::Relaxed);
            shipper.spool.shipped(end, n);
            counters.queued.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

/// Inserts each of `rows` alone; how many the database refused, or `None`
/// when the connection went away meanwhile (nothing is marked shipped then,
/// and the key of each row makes the next attempt land it once).
async fn one_by_one(client: &tokio_postgres::Client, insert: &str, rows: &[String]) -> Option<u64> {
    let mut refused = 0;
    for row in rows {
        if let Err(e) = client
            .execute(insert, &[&batch(std::slice::from_ref(row))])
            .await
        {
            if client.is_closed() {
                return None;
            }
            tracing::error!(error = %e, "the audit database refused an event");
            refused += 1;
        }
    }
    Some(refused)
}

/// The rows of `lines`, each a JSON object PostgreSQL can hold, and how many
/// lines were left out: lines that are not JSON objects are counted (one bad
/// line must not hold back the rest). A NUL character, which neither `jsonb`
/// nor `text` can hold, is written U+FFFD: a client that puts one in its
/// arguments (or a tool name) must not make its event, or its batch,
/// unstorable.
fn batch_rows(lines: &[Vec<u8>]) -> (Vec<String>, u64) {
    let mut rows = Vec::with_capacity(lines.len());
    let mut bad = 0;
    for line in lines {
        let text = std::str::from_utf8(line).ok();
        let object = text.and_then(|t| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(t).ok()
        });
        match (text, object) {
            // serde_json writes a NUL as this escape, and nothing else as it.
            (Some(text), Some(_)) if !text.contains("\\u0000") => {
                rows.push(text.trim_end().to_owned());
            }
            (Some(_), Some(object)) => {
                let mut value = serde_json::Value::Object(object);
                without_nul(&mut value);
                rows.push(value.to_string());
            }
            _ => bad += 1,
        }
    }
    (rows, bad)
}

/// `value` with every NUL in its strings and keys written U+FFFD.
fn without_nul(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s.contains('\0') => *s = s.replace('\0', "\u{FFFD}"),
        serde_json::Value::Array(items) => items.iter_mut().for_each(without_nul),
        serde_json::Value::Object(map) => {
            for (key, mut item) in std::mem::take(map) {
                without_nul(&mut item);
                map.insert(key.replace('\0', "\u{FFFD}"), item);
            }
        }
        _ => {}
    }
}

/// `rows` as one JSON array.
fn batch(rows: &[String]) -> String {
    format!("[{}]", rows.join(","))
}

/// Connects (with TLS when the URL asks) and migrates the schema.
async fn connect(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, String> {
    let client = open(config).await?;
    migrate(&client).await.map_err(|e| e.to_string())?;
    Ok(client)
}

/// The latest events of the whole fleet, oldest first, in the shape of the
/// dashboard's ring (the JSON columns as JSON), each with its `replica`.
const LATEST: &str = "SELECT json_build_object(
        'id', id, 'replica', replica, 'time_ms', time_ms, 'trace_id', trace_id,
        'client', client, 'server', server, 'method', method, 'tool', tool,
        'decision', decision, 'stage', stage, 'would_refuse', would_refuse,
        'violations', violations::json, 'sanitizer', sanitizer::json,
        'pin_findings', pin_findings::json, 'upstream_status', upstream_status,
        'upstream_latency_us', upstream_latency_us, 'latency_us', latency_us,
        'http_status', http_status, 'era', era, 'arguments', arguments::json,
        'approval', approval::json, 'subject', subject, 'retries', retries::json)::text
    FROM (SELECT * FROM portcullis_events ORDER BY time_ms DESC, id DESC LIMIT $1) e
    ORDER BY time_ms, id";

/// The admin listener's reads of the fleet's audit, on one connection
/// opened when first needed (and again after it broke).
#[derive(Debug)]
pub(crate) struct Reader {
    config: tokio_postgres::Config,
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
}

impl Reader {
    pub(crate) fn new(url: &str) -> Result<Self, String> {
        let config = tokio_postgres::Config::from_str(url)
            .map_err(|e| format!("audit.url is not a PostgreSQL connection URL: {e}"))?;
        Ok(Self {
            config,
            client: tokio::sync::Mutex::new(None),
        })
    }

    /// The latest `limit` events of the fleet, oldest first; an error
    /// within five seconds when the database cannot answer.
    pub(crate) async fn latest(&self, limit: i64) -> Result<Vec<serde_json::Value>, String> {
        let read = async {
            let mut client = self.client.lock().await;
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                *client = Some(open(&self.config).await?);
            }
            let Some(c) = client.as_ref() else {
                return Err("no connection".to_owned());
            };
            let rows = c
                .query(LATEST, &[&limit])
                .await
                .map_err(|e| e.to_string())?;
            Ok(rows
                .iter()
                .filter_map(|r| serde_json::from_str(r.get::<_, &str>(0)).ok())
                .collect())
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .map_err(|_| "the audit database did not answer within 5 s".to_owned())?
    }
}

/// Connects, with TLS when the URL asks.
async fn open(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, String> {
    let mut config = config.clone();
    config.connect_timeout(Duration::from_secs(5));
    let client = if config.get_ssl_mode() == SslMode::Require {
        let tls = tls_connector()?;
        let (client, connection) = config.connect(tls).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    } else {
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    };
    Ok(client)
}

fn tls_connector() -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Applies the migrations not yet applied, once per fleet: under an
/// advisory lock, so a replica starting beside another waits for it.
async fn migrate(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let applied = apply(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    applied?;
    unlocked.map(|_| ())
}

async fn apply(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS portcullis_migrations (
                version    INTEGER PRIMARY KEY,
                applied_ms BIGINT  NOT NULL
            )",
        )
        .await?;
    let row = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM portcullis_migrations",
            &[],
        )
        .await?;
    let current: i32 = row.get(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let version = i as i32 + 1;
        client.batch_execute("BEGIN").await?;
        let step = async {
            client.batch_execute(sql).await?;
            client
                .execute(
                    "INSERT INTO portcullis_migrations (version, applied_ms) VALUES ($1, $2)",
                    &[&version, &crate::util::time::now_ms()],
                )
                .await
        }
        .await;
        match step {
            Ok(_) => client.batch_execute("COMMIT").await?,
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(e);
            }
        }
        tracing::info!(version, "audit database migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_insert_names_every_column_once() {
        let sql = insert_sql();
        assert!(sql.starts_with("INSERT INTO portcullis_events (key, replica, time_ms,"));
        assert!(sql.contains("AS r(key text, replica text"));
        assert_eq!(sql.matches("approval").count(), 3);
        assert_eq!(sql.matches("subject").count(), 3);
    }

    /// A fleet's table keeps every column the SQLite store keeps (its own
    /// `key` and `replica` besides): a field added to one store and not the
    /// other was silently dropped from a fleet's audit (`retries` was).
    #[test]
    fn the_fleets_table_has_every_column_of_the_sqlite_store() {
        let columns = |sql: &str| -> Vec<String> {
            let mut names = Vec::new();
            for m in sql.split(';') {
                if let Some((_, body)) = m.split_once("CREATE TABLE") {
                    let inner = body.split_once('(').map(|(_, b)| b).unwrap_or_default();
                    for line in inner.lines() {
                        let word = line.split_whitespace().next().unwrap_or_default();
                        if word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                            && !word.is_empty()
                        {
                            names.push(word.to_owned());
                        }
                    }
                }
                if let Some((_, rest)) = m.split_once("ADD COLUMN") {
                    names.extend(rest.split_whitespace().next().map(str::to_owned));
                }
            }
            names
        };
        let sqlite: std::collections::BTreeSet<String> = (crate::audit::MIGRATIONS.iter())
            .flat_map(|m| columns(m))
            .filter(|c| c != "id")
            .collect();
        let fleet: std::collections::BTreeSet<String> = (MIGRATIONS.iter())
            .flat_map(|m| columns(m))
            .filter(|c| !["id", "key", "replica"].contains(&c.as_str()))
            .collect();
        assert_eq!(sqlite, fleet);
        // And every one is written and read back.
        for column in &fleet {
            assert!(
                COLUMNS.contains(&format!("{column} ")),
                "{column} is not shipped"
            );
            assert!(
                LATEST.contains(&format!("'{column}', {column}")),
                "{column} is not read"
            );
        }
    }

    #[test]
    fn the_subject_column_is_added_by_a_migration_of_its_own() {
        // A fleet's existing table is altered, not made again: the first
        // migration stays as every database already applied it.
        assert!(!MIGRATIONS[0].contains("subject"));
        let added: Vec<&&str> = MIGRATIONS
            .iter()
            .filter(|m| m.contains("subject"))
            .collect();
        assert_eq!(
            added,
            [&"ALTER TABLE portcullis_events ADD COLUMN subject TEXT;"]
        );
        assert!(LATEST.contains("'subject', subject"));
    }

    #[test]
    fn a_bad_line_is_left_out_of_its_batch_and_counted() {
        let lines = vec![
            b"{\"key\":\"a\"}".to_vec(),
            b"{oops".to_vec(),
            b"[1]".to_vec(),
        ];
        let (rows, bad) = batch_rows(&lines);
        assert_eq!((batch(&rows), bad), ("[{\"key\":\"a\"}]".to_owned(), 2));
    }

    #[test]
    fn a_nul_anywhere_in_a_row_is_written_as_a_replacement_character() {
        let row = serde_json::json!({"key": "k", "tool": "a\u{0}b",
            "arguments": {"x\u{0}": ["\u{0}", {"y": "\\u0000 stays"}]}});
        let (rows, bad) = batch_rows(&[row.to_string().into_bytes()]);
        assert_eq!(bad, 0);
        let back: serde_json::Value = serde_json::from_str(&rows[0]).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"key": "k", "tool": "a\u{FFFD}b",
                "arguments": {"x\u{FFFD}": ["\u{FFFD}", {"y": "\\u0000 stays"}]}})
        );
    }
}
