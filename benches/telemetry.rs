//! Tracing figures for BENCHMARKS.md: `cargo bench --bench telemetry`.
//!
//! 1. criterion: the request path's tracing work for one forwarded
//!    `tools/call` (a span per stage, the upstream's traceparent, the finished
//!    spans queued) with export off, off with a client traceparent, and on;
//! 2. printed after it: the exporter thread's own cost per request (span
//!    data, protobuf, one HTTP POST per batch to a loopback sink), from the
//!    time a flush of 4,000 queued requests takes.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use criterion::Criterion;
use http::HeaderMap;
use portcullis::config::{LogFormat, TelemetrySettings};
use portcullis::record::probe::Probe;
use portcullis::telemetry::Traces;

const BODY: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;

/// An OTLP sink on loopback that answers every POST with 200; runs until the process ends.
fn sink() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut writer = stream;
                // One request per loop: headers, then the body by its length.
                for _ in 0..1_000_000 {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

fn exporting(endpoint: &str) -> Traces {
    let settings = TelemetrySettings {
        otlp_endpoint: Some(reqwest::Url::parse(endpoint).expect("url")),
        log_format: LogFormat::Json,
        replica: "bench".into(),
    };
    Traces::start(&settings).expect("exporter")
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let endpoint = sink();
    let plain = Probe::new(HeaderMap::new(), BODY).expect("probe");
    let mut with_parent = HeaderMap::new();
    with_parent.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .expect("header"),
    );
    let child = Probe::new(with_parent, BODY).expect("probe");

    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let off = Traces::off();
    let on = exporting(&endpoint);
    let mut group = c.benchmark_group("trace");
    group.bench_function("off", |b| b.iter(|| black_box(plain.run(&off))));
    group.bench_function("off_client_traceparent", |b| {
        b.iter(|| black_box(child.run(&off)))
    });
    group.bench_function("on", |b| b.iter(|| black_box(plain.run(&on))));
    group.finish();
    on.flush();
    let counters = on.counters();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "while benchmarking `trace/on`: spans exported {}, dropped (queue full) {}, failed {}",
        load(&counters.exported),
        load(&counters.dropped),
        load(&counters.failed)
    );

    // The exporter thread's cost: its CPU time while it sends 20,000 requests
    // (queued 4,000 at a time, below the queue's capacity, each lot flushed).
    let traces = exporting(&endpoint);
    let (lots, lot) = (5u32, 4000u32);
    let mut per_request = Vec::new();
    for _ in 0..5 {
        let before = exporter_cpu();
        for _ in 0..lots {
            for _ in 0..lot {
                plain.run(&traces);
            }
            traces.flush();
        }
        per_request.push((exporter_cpu() - before) / (lots * lot));
    }
    per_request.sort();
    let c = traces.counters();
    println!(
        "exporter thread CPU per request (12 spans), 5 rounds of {}: median {:?}, range {:?} – {:?}; spans exported {}, dropped {}, failed {}",
        lots * lot,
        per_request[2],
        per_request[0],
        per_request[4],
        load(&c.exported),
        load(&c.dropped),
        load(&c.failed)
    );
}

/// CPU time (user + system) of the threads named `portcullis-otlp`, from /proc.
fn exporter_cpu() -> Duration {
    let tick = 100; // USER_HZ on Linux
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .flatten()
    {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if name.trim() != "portcullis-otlp" {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3; utime 14, stime 15.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        ticks += field(14) + field(15);
    }
    Duration::from_millis(ticks * 1000 / tick)
}
