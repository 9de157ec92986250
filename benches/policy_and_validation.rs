//! Micro-benchmarks of the two checks every `tools/call` goes through:
//! the access-rule decision and argument validation against the tool's schema.
//!
//! Run with `cargo bench --bench policy_and_validation`, or `bash bench/micro.sh`
//! to refresh the table in BENCHMARKS.md. Settings are kept short (2 s of
//! measurement, 30 samples) because the reference machine has 2 shared cores.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

use portcullis::auth::ClientId;
use portcullis::policy::glob::Glob;
use portcullis::policy::{Policy, Subject};
use portcullis::validate::{CompiledSchema, SchemaLimits};

// === schemas and arguments ===

/// One required string property.
fn small_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"]
    })
}

/// A typical tool schema: 9 properties with patterns, formats, ranges, an enum,
/// a nested array of objects, and no extra properties allowed.
fn nine_property_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code of the departure airport"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code of the arrival airport"},
            "date": {"type": "string", "format": "date", "description": "Departure date, YYYY-MM-DD"},
            "contact_email": {"type": "string", "format": "email"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "max_price": {"type": "integer", "minimum": 0, "maximum": 100000},
            "cabin": {"type": "string", "enum": ["economy", "premium", "business", "first"]},
            "travellers": {
                "type": "array",
                "maxItems": 9,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 100},
                        "age": {"type": "integer", "minimum": 0, "maximum": 120}
                    },
                    "required": ["name", "age"],
                    "additionalProperties": false
                }
            },
            "notes": {"type": "string", "maxLength": 500}
        },
        "required": ["origin", "destination", "date", "contact_email", "passengers"],
        "additionalProperties": false
    })
}

fn nine_property_valid() -> Value {
    json!({
        "origin": "LHR",
        "destination": "JFK",
        "date": "2026-12-01",
        "contact_email": "ada@example.com",
        "passengers": 2,
        "max_price": 1200,
        "cabin": "economy",
        "travellers": [{"name": "Ada", "age": 36}, {"name": "Charles", "age": 41}],
        "notes": "aisle seats"
    })
}

/// Seven violations: pattern, format date, format email, range, enum,
/// a nested range, and an extra property.
fn nine_property_invalid() -> Value {
    json!({
        "origin": "london",
        "destination": "JFK",
        "date": "2026-13-45",
        "contact_email": "not an email",
        "passengers": 12,
        "max_price": 1200,
        "cabin": "steerage",
        "travellers": [{"name": "Ada", "age": -1}],
        "pet": "cat"
    })
}

/// A nested schema for a batch import: an array of row objects.
fn rows_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "table": {"type": "string", "enum": ["orders", "customers"]},
            "rows": {
                "type": "array",
                "maxItems": 5000,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 0},
                        "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 1000}
                    },
                    "required": ["id", "sku", "qty"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["table", "rows"],
        "additionalProperties": false
    })
}

/// 1,000 rows, 39,917 bytes serialized.
fn rows_argument() -> Value {
    let rows: Vec<Value> = (0..1000)
        .map(|i| {
            json!({
                "id": 100_000 + i,
                "sku": format!("AB-{:04}", i % 10_000),
                "qty": 1 + i % 999
            })
        })
        .collect();
    json!({"table": "orders", "rows": rows})
}

fn compile(schema: &Value) -> CompiledSchema {
    CompiledSchema::compile(schema, SchemaLimits::default()).expect("the schema compiles")
}

// === policies ===

/// Clients, servers and the rules shared by both policy sizes: the last rule
/// denies `bob` every `delete_*` tool on `crm`.
const PREAMBLE: &str = r#"
[servers.flights]
url = "http://127.0.0.1:1/mcp"
[servers.crm]
url = "http://127.0.0.1:2/mcp"
[servers.files]
url = "http://127.0.0.1:3/mcp"
[clients.alice]
api_key_sha256 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
[clients.bob]
api_key_sha256 = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
[clients.analyst]
api_key_sha256 = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
[clients.admin]
api_key_sha256 = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
"#;

const CORE_RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["search_*", "get_*"]
action = "allow"

[[rules]]
clients = ["alice", "bob"]
servers = ["crm"]
tools = ["lookup_*", "delete_record", "update_?ecord"]
action = "allow"

[[rules]]
clients = ["analyst"]
servers = ["crm"]
tools = ["run_query"]
action = "allow"
arguments = { properties = { table = { enum = ["orders", "customers"] }, limit = { type = "integer", maximum = 1000 } }, required = ["table"] }

[[rules]]
clients = ["admin"]
servers = ["*"]
tools = ["*"]
action = "allow"
"#;

const DENY_RULE: &str = r#"
[[rules]]
clients = ["bob"]
servers = ["crm"]
tools = ["delete_*"]
action = "deny"
"#;

/// 5 rules (4 allow, then the deny), or 50 (the same, with 45 allow rules of
/// assorted globs that never match the benchmarked calls, between them).
fn policy(rules: usize) -> Policy {
    assert!(rules >= 5);
    let mut text = format!("{PREAMBLE}{CORE_RULES}");
    for i in 0..rules - 5 {
        let (clients, servers, tools) = match i % 5 {
            0 => (
                format!("\"team{i}-*\""),
                "\"*\"",
                format!("\"tool{i}_*\", \"*_v{i}\""),
            ),
            1 => (
                "\"alice\"".to_owned(),
                "\"files\"",
                format!("\"read_[a-m]*{i}\""),
            ),
            2 => (
                "\"*\"".to_owned(),
                "\"crm\"",
                format!("\"export_{i}\", \"report_{i}_*\""),
            ),
            3 => (
                format!("\"svc-{i}?\", \"bot-*\""),
                "\"crm\", \"flights\"",
                "\"*\"".to_owned(),
            ),
            _ => ("\"*\"".to_owned(), "\"fl?ghts\"", format!("\"*book_{i}\"")),
        };
        text.push_str(&format!(
            "\n[[rules]]\nclients = [{clients}]\nservers = [{servers}]\ntools = [{tools}]\naction = \"allow\"\n"
        ));
    }
    text.push_str(DENY_RULE);
    portcullis::config::load_str(&text, "bench.toml", &|_| None)
        .unwrap_or_else(|e| panic!("the benchmark policy is valid: {e}"))
        .policy
}

// === benchmarks ===

fn validation(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate");

    let small = compile(&small_schema());
    let small_ok = json!({"query": "flights to Lisbon"});
    let small_bad = json!({"query": 42});
    assert!(small.check(&small_ok).is_ok());
    assert!(small.check(&small_bad).is_err());
    group.bench_function("small/valid", |b| {
        b.iter(|| small.check(black_box(&small_ok)))
    });
    group.bench_function("small/invalid", |b| {
        b.iter(|| small.check(black_box(&small_bad)))
    });

    let nine = compile(&nine_property_schema());
    let nine_ok = nine_property_valid();
    let nine_bad = nine_property_invalid();
    assert!(nine.check(&nine_ok).is_ok());
    let found = nine.check(&nine_bad).expect_err("refused").len();
    assert_eq!(
        found, 7,
        "the invalid 9-property arguments carry 7 violations"
    );
    group.bench_function("9_properties/valid", |b| {
        b.iter(|| nine.check(black_box(&nine_ok)))
    });
    group.bench_function("9_properties/invalid_7_violations", |b| {
        b.iter(|| nine.check(black_box(&nine_bad)))
    });

    let rows = compile(&rows_schema());
    let rows_ok = rows_argument();
    let size = serde_json::to_vec(&rows_ok).expect("serializes").len();
    assert!(
        (38_000..=44_000).contains(&size),
        "the 1,000-row argument is {size} bytes, expected about 40 KB"
    );
    assert!(rows.check(&rows_ok).is_ok());
    let mut rows_bad = rows_ok.clone();
    rows_bad["rows"][999]["qty"] = json!(0);
    assert_eq!(rows.check(&rows_bad).map_err(|v| v.len()), Err(1));
    group.bench_function("40KB_1000_rows/valid", |b| {
        b.iter(|| rows.check(black_box(&rows_ok)))
    });
    group.bench_function("40KB_1000_rows/invalid_last_row", |b| {
        b.iter(|| rows.check(black_box(&rows_bad)))
    });

    let nine_source = nine_property_schema();
    group.bench_function("compile/9_properties", |b| {
        b.iter(|| CompiledSchema::compile(black_box(&nine_source), SchemaLimits::default()))
    });

    group.finish();
}

/// The same valid arguments through the `jsonschema` crate alone, built with its
/// defaults plus format checks: the reference the published figures come from,
/// measured in the same run so the comparison does not depend on the machine.
fn bare_jsonschema(c: &mut Criterion) {
    let mut group = c.benchmark_group("jsonschema_bare");
    let cases = [
        (
            "small/valid",
            small_schema(),
            json!({"query": "flights to Lisbon"}),
        ),
        (
            "9_properties/valid",
            nine_property_schema(),
            nine_property_valid(),
        ),
        ("40KB_1000_rows/valid", rows_schema(), rows_argument()),
    ];
    for (name, schema, instance) in cases {
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .expect("the schema compiles");
        assert!(validator.is_valid(&instance));
        group.bench_function(name, |b| {
            b.iter(|| validator.is_valid(black_box(&instance)))
        });
    }
    group.finish();
}

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    let alice = ClientId::named("alice");
    let bob = ClientId::named("bob");
    let analyst = ClientId::named("analyst");

    for rules in [5, 50] {
        let p = policy(rules);
        // Allow: alice may delete on crm (the second rule); every rule is visited.
        let d = p.decide(&alice, "crm", Subject::Tool("delete_record"));
        assert!(d.allowed && d.allow_rules.len() == 1, "{d:?}");
        // Deny: bob is denied the same tool by the last rule.
        let d = p.decide(&bob, "crm", Subject::Tool("delete_record"));
        assert!(!d.allowed && d.rule.is_some(), "{d:?}");
        // Default deny: nothing names this tool for the analyst.
        let d = p.decide(&analyst, "files", Subject::Tool("rm_rf"));
        assert!(!d.allowed && d.rule.is_none(), "{d:?}");

        group.bench_function(format!("{rules}_rules/allow"), |b| {
            b.iter(|| {
                p.decide(
                    black_box(&alice),
                    black_box("crm"),
                    Subject::Tool(black_box("delete_record")),
                )
            })
        });
        group.bench_function(format!("{rules}_rules/deny_rule"), |b| {
            b.iter(|| {
                p.decide(
                    black_box(&bob),
                    black_box("crm"),
                    Subject::Tool(black_box("delete_record")),
                )
            })
        });
        group.bench_function(format!("{rules}_rules/deny_default"), |b| {
            b.iter(|| {
                p.decide(
                    black_box(&analyst),
                    black_box("files"),
                    Subject::Tool(black_box("rm_rf")),
                )
            })
        });
    }

    // A rule's `arguments` constraint, checked after the decision.
    let p = policy(5);
    let d = p.decide(&analyst, "crm", Subject::Tool("run_query"));
    assert!(d.allowed, "{d:?}");
    let ok = json!({"table": "orders", "limit": 100, "filter": "status = 'open'"});
    let bad = json!({"table": "payroll", "limit": 100_000});
    assert!(p.check_arguments(&d, &ok).is_ok());
    assert!(p.check_arguments(&d, &bad).is_err());
    group.bench_function("check_arguments/pass", |b| {
        b.iter(|| p.check_arguments(black_box(&d), black_box(&ok)))
    });
    group.bench_function("check_arguments/refuse", |b| {
        b.iter(|| p.check_arguments(black_box(&d), black_box(&bad)))
    });

    group.finish();
}

/// One glob test, the unit of work of a decision (a rule tests its tool,
/// server and client globs in turn).
fn glob(c: &mut Criterion) {
    let mut group = c.benchmark_group("glob");
    let literal = Glob::new("crm").expect("valid glob");
    let prefix = Glob::new("search_*").expect("valid glob");
    assert!(literal.matches("crm") && !prefix.matches("delete_record"));
    group.bench_function("literal/match", |b| {
        b.iter(|| literal.matches(black_box("crm")))
    });
    group.bench_function("prefix_star/mismatch", |b| {
        b.iter(|| prefix.matches(black_box("delete_record")))
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = validation, bare_jsonschema, decision, glob
}
criterion_main!(benches);
