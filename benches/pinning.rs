//! Cost per `tools/list` of pinning: RFC 8785 canonicalization + SHA-256 of
//! every tool definition, the poisoning scan, and the whole observe step the
//! gateway runs on each list (warm: every definition already pinned; cold:
//! every definition new, so each is hashed, scanned and pinned).
//!
//! `cargo bench --bench pinning`; figures go to BENCHMARKS.md ("## Pinning").

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use portcullis::pins::{MemoryPins, canonical, digest, output_findings, scan_findings};
use serde_json::{Value, json};

/// `n` definitions shaped like real servers' tools: a paragraph of
/// description, four parameters with descriptions, an enum, a default, a
/// pattern, annotations.
fn tools(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "name": format!("tool_{i:04}"),
                "title": format!("Tool number {i}"),
                "description": format!(
                    "Looks up records of kind {i} in the inventory and returns them as a table. \
                     Results are paginated; pass the cursor from the previous page to continue. \
                     Read-only: it never changes a record."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "Free-text search over names and tags", "maxLength": 200},
                        "kind": {"type": "string", "enum": ["order", "customer", "invoice", "shipment"], "default": "order"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20, "description": "Rows per page"},
                        "cursor": {"type": "string", "pattern": "^[A-Za-z0-9_-]{0,64}$", "description": "Opaque page cursor"}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                },
                "annotations": {"readOnlyHint": true, "openWorldHint": false}
            })
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let list = tools(200);
    let bytes: usize = list.iter().map(|t| t.to_string().len()).sum();
    let mut group = c.benchmark_group("pinning_200_tools");
    group.throughput(Throughput::Bytes(bytes as u64));

    group.bench_function("canonicalize", |b| {
        b.iter(|| list.iter().map(|t| canonical(t).len()).sum::<usize>())
    });
    group.bench_function("canonicalize_and_sha256", |b| {
        b.iter(|| list.iter().map(|t| digest(t)[0] as usize).sum::<usize>())
    });
    group.bench_function("scan", |b| {
        b.iter(|| list.iter().map(scan_findings).sum::<usize>())
    });
    let warm = MemoryPins::new();
    assert_eq!(warm.observe("s", &list), 0);
    group.bench_function("observe_unchanged_list", |b| {
        b.iter(|| warm.observe("s", &list))
    });
    group.bench_function("observe_new_list", |b| {
        b.iter_batched(
            MemoryPins::new,
            |pins| pins.observe("s", &list),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// `size` bytes of plain English prose, as `bench/load.py` sends.
fn prose(size: usize) -> String {
    let sentence = "The quarterly report lists every open ticket of the payments team, with its owner, \
                    its priority and the date of the last answer to the customer. ";
    sentence.repeat(size / sentence.len() + 1)[..size].to_owned()
}

/// The output scan of a tool result of 100 KB of text: prose in which no
/// pattern's anchor words occur, and the same prose with a colon and the
/// word "user" in each sentence (the pattern set then walks the text).
fn output(c: &mut Criterion) {
    let mut group = c.benchmark_group("poisoning_output_100KB");
    group.throughput(Throughput::Bytes(100_000));
    let plain = json!({"content": [{"type": "text", "text": prose(100_000)}]});
    let anchored = json!({"content": [{"type": "text",
        "text": prose(100_000).replace("customer.", "user: ok.")}]});
    group.bench_function("prose", |b| b.iter(|| output_findings(&plain)));
    group.bench_function("prose_with_anchor_words", |b| {
        b.iter(|| output_findings(&anchored))
    });
    group.finish();
}

criterion_group!(benches, bench, output);
criterion_main!(benches);
