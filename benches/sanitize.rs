//! Sanitizer throughput: clean and dirty text at 64 KiB and 1 MiB.
//!
//!     cargo bench --bench sanitize
//!
//! "clean" is log-like ASCII with nothing to remove (the common case, the
//! ≥ 300 MB/s target); "clean-unicode" is Persian, Hindi and emoji text with
//! ZWNJ and ZWJ that must all be kept (every character judged, nothing
//! removed); "dirty" has terminal escapes, an OSC 8 link, zero-width and tag
//! characters and two secrets on every line.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use portcullis::config::SanitizeSettings;
use portcullis::sanitize::{Report, Sanitizer, Skip};

const CLEAN_LINE: &str = "2026-07-28T09:14:02Z INFO  api: GET /orders/ORD-004211 -> 200 (12 ms) user=alice region=eu-west-1 cache=hit\n";
const UNICODE_LINE: &str = "می\u{200C}خواهم این کتاب\u{200C}ها را بخوانم — क्\u{200D}ष हिन्दी पाठ — 👨\u{200D}👩\u{200D}👧 ❤\u{FE0F} done\n";
const DIRTY_LINE: &str = "2026-07-28T09:14:03Z \u{1b}[31mERROR\u{1b}[0m db: reset; password=hunter2-demo key AKIAZ7QWERTYUIOPASDF \u{1b}]8;;http://evil.example\u{7}click\u{1b}]8;;\u{7} ad\u{200b}min\u{E0049}\u{E0067}\n";

fn text(line: &str, size: usize) -> String {
    let mut out = String::with_capacity(size + line.len());
    while out.len() < size {
        out.push_str(line);
    }
    let mut end = size;
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    out.truncate(end);
    out
}

fn bench(c: &mut Criterion) {
    let settings = SanitizeSettings::default();
    let sanitizer = Sanitizer::new(&settings, Skip::default());
    let mut group = c.benchmark_group("sanitize");
    for (name, line) in [
        ("clean", CLEAN_LINE),
        ("clean-unicode", UNICODE_LINE),
        ("dirty", DIRTY_LINE),
    ] {
        for size in [64 * 1024, 1024 * 1024] {
            let input = text(line, size);
            group.throughput(Throughput::Bytes(input.len() as u64));
            let label = if size < 1 << 20 { "64KiB" } else { "1MiB" };
            group.bench_with_input(BenchmarkId::new(name, label), &input, |b, input| {
                b.iter(|| {
                    let mut report = Report::default();
                    std::hint::black_box(sanitizer.text(input, &mut report))
                })
            });
        }
    }
    group.finish();

    // A tools/list reply of 200 tools with ordinary descriptions: what sanitizing
    // titles, descriptions and schema descriptions costs per list.
    let tools: Vec<serde_json::Value> = (0..200)
        .map(|i| {
            serde_json::json!({
                "name": format!("tool_{i}"),
                "title": format!("Tool number {i}"),
                "description": "Look up an order by its id and return its status, items and totals.",
                "inputSchema": {"type": "object", "properties": {
                    "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$", "description": "Order id, e.g. ORD-004211"},
                    "include_items": {"type": "boolean", "description": "Include line items"}},
                    "required": ["order_id"]},
                "annotations": {"readOnlyHint": true}
            })
        })
        .collect();
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}});
    c.bench_function("sanitize/tools-list-200", |b| {
        b.iter_batched(
            || list.clone(),
            |mut message| {
                let mut report = Report::default();
                let _ = sanitizer.message(&mut message, Some("tools/list"), &mut report);
                std::hint::black_box(message)
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
