//! Audit trail figures for BENCHMARKS.md: `cargo bench --bench audit`.
//!
//! 1. criterion: `Audit::record` of one forwarded `tools/call` event, the
//!    request path's share (the event is boxed and queued; the writer thread
//!    runs meanwhile, as in the gateway);
//! 2. printed after it: the whole CPU cost of an event, request path and
//!    writer thread together (SQLite file in WAL mode, as configured by
//!    default): the process's CPU time (`/proc/self/stat`, user + system)
//!    while 20,000 events are recorded and flushed, ÷ 20,000; five rounds.
//!
//! With `PORTCULLIS_BENCH_PG_URL` set (a PostgreSQL URL), both again for
//! `[audit] backend = "postgres"`: the request path's share is the spool
//! append, the rest is the shipper thread (batched inserts). The
//! database server's own CPU is another process's and not counted here.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use portcullis::audit::{Audit, Event};

/// The event of a forwarded `tools/call`, shaped as the pipeline writes it.
fn event() -> Event {
    Event {
        time_ms: 1_764_590_000_000,
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        client: Some("bench".into()),
        server: Some("up".into()),
        method: "tools/call".into(),
        tool: Some("echo".into()),
        tool_listed: true,
        decision: "forwarded".into(),
        stage: "forwarded".into(),
        sanitizer: BTreeMap::new(),
        upstream_status: Some(200),
        upstream_latency_us: Some(64),
        latency_us: 180,
        http_status: Some(200),
        era: "2026".into(),
        arguments: Some(serde_json::json!({"text": "string"})),
        ..Event::default()
    }
}

fn open(dir: &std::path::Path, postgres: Option<&str>) -> Arc<Audit> {
    let audit = match postgres {
        None => format!("database = \"{}\"\n", dir.join("audit.db").display()),
        Some(url) => format!(
            "backend = \"postgres\"\nurl = \"{url}\"\nspool = \"{}\"\nbuffer = 1000000\n",
            dir.join("spool.jsonl").display()
        ),
    };
    let text = format!(
        "[gateway]\nreplica = \"bench\"\n[servers.up]\nurl = \"http://127.0.0.1:1/mcp\"\n[audit]\n{audit}"
    );
    let config = portcullis::config::load_str(&text, "bench.toml", &|_| None)
        .unwrap_or_else(|e| panic!("the benchmark configuration is valid: {e}"));
    Audit::open(&config.audit).unwrap_or_else(|e| panic!("the audit store opens: {e}"))
}

/// This process's CPU time so far (all threads).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn record(c: &mut Criterion, audit: &Audit, name: &str) {
    let template = event();
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                // Below the queue's capacity, so nothing is dropped.
                let n = left.min(10_000);
                let events: Vec<Event> = (0..n).map(|_| template.clone()).collect();
                let start = Instant::now();
                for e in events {
                    audit.record(black_box(e));
                }
                spent += start.elapsed();
                audit.flush();
                left -= n;
            }
            spent
        })
    });
}

fn whole_cost(audit: &Audit, backend: &str) {
    const EVENTS: u32 = 20_000;
    println!(
        "\naudit ({backend}): CPU per event, request path and writer thread together ({EVENTS} events a round)"
    );
    let template = event();
    for round in 1..=5 {
        let events: Vec<Event> = (0..EVENTS).map(|_| template.clone()).collect();
        let before = cpu();
        for e in events {
            audit.record(e);
        }
        audit.flush();
        let spent = cpu() - before;
        println!(
            "  round {round}: {:.2} µs of CPU per event",
            spent.as_secs_f64() * 1e6 / f64::from(EVENTS)
        );
    }
    let c = audit.counters();
    let read = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "  written: {}, dropped: {}, failed: {}, waiting: {}",
        read(&c.written),
        read(&c.dropped),
        read(&c.failed),
        read(&c.queued)
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory: {e}"));
    let audit = open(dir.path(), None);
    let postgres = std::env::var("PORTCULLIS_BENCH_PG_URL").ok();
    let fleet = postgres.as_deref().map(|url| open(dir.path(), Some(url)));
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    record(&mut c, &audit, "audit/record");
    if let Some(fleet) = &fleet {
        record(&mut c, fleet, "audit/record_postgres");
    }
    c.final_summary();
    whole_cost(&audit, "sqlite");
    if let Some(fleet) = &fleet {
        whole_cost(fleet, "postgres");
    }
}
