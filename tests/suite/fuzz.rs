//! Fuzz targets for the public modules: the schema compiler on hostile
//! schemas, the sanitizer, and the rate-limit arithmetic against a reference
//! model. Each replays `tests/fuzz/corpus/<target>/`, then runs generated
//! inputs (see `tests/support/fuzz.rs` for the long-run switches). The wire
//! parsers' targets live in `src/mcp/fuzz.rs`.

use crate::support;

use std::net::TcpListener;
use std::num::NonZeroU32;

use portcullis::config::SanitizeSettings;
use portcullis::ratelimit::gcra::{self, Quota};
use portcullis::sanitize::{Report, Sanitizer, Skip};
use portcullis::validate::{CompiledSchema, SchemaError, SchemaLimits};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use support::fuzz;

// === schema compiler ===

/// A listener standing where remote `$ref`s point; nothing may connect to it.
fn trap() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let url = format!(
        "http://{}/schema.json",
        listener.local_addr().expect("addr")
    );
    (listener, url)
}

fn contacted(listener: &TcpListener) -> bool {
    listener.accept().is_ok()
}

/// Small limits, so generated schemas hit every refusal too.
const LIMITS: SchemaLimits = SchemaLimits {
    max_bytes: 4096,
    max_depth: 12,
    max_nodes: 300,
};

fn schema_invariants(schema: &Value, instances: &[Value]) -> Result<(), TestCaseError> {
    let size = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
    match CompiledSchema::compile(schema, LIMITS) {
        Ok(compiled) => {
            prop_assert!(size <= LIMITS.max_bytes);
            for instance in instances {
                // Any verdict will do; what matters is that there is one.
                if let Err(violations) = compiled.check(instance) {
                    prop_assert!(!violations.is_empty());
                }
            }
        }
        Err(SchemaError::TooLarge(n, max)) => prop_assert!(n > max),
        Err(_) => {}
    }
    if size > LIMITS.max_bytes {
        prop_assert!(CompiledSchema::compile(schema, LIMITS).is_err());
    }
    Ok(())
}

fn schema(remote: String) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        Just(json!({"type": "integer", "minimum": 0, "maximum": 10})),
        Just(json!({"type": ["string", "null"]})),
        Just(json!({"type": "nonsense"})),
        Just(json!({"pattern": "^(a+)+$"})),
        Just(json!({"pattern": "(?P<x>a)\\k<x>"})),
        Just(json!({"pattern": "[" })),
        Just(json!({"pattern": "a{1000}{1000}"})),
        Just(json!({"format": "email"})),
        Just(json!({"enum": [1, "a", null]})),
        Just(json!({"$ref": "#/$defs/missing"})),
        Just(json!({"$ref": "#"})),
        Just(json!({"$ref": "file:///etc/passwd"})),
        Just(json!({"$ref": remote.clone()})),
        Just(json!({"$ref": format!("{remote}#/x")})),
        Just(json!({"$schema": "https://example.com/dialect"})),
        Just(json!({"$schema": "https://json-schema.org/draft/2020-12/schema"})),
        Just(json!({"$dynamicRef": "#meta"})),
        Just(json!({"minLength": -1})),
        Just(json!({"multipleOf": 0})),
        Just(json!(true)),
        Just(json!(false)),
        Just(json!(null)),
        Just(json!(7)),
    ];
    leaf.prop_recursive(6, 200, 6, |inner| {
        prop_oneof![
            proptest::collection::btree_map("[a-z$]{1,6}", inner.clone(), 0..5).prop_map(
                |m| json!({"type": "object", "properties": m, "additionalProperties": false})
            ),
            inner
                .clone()
                .prop_map(|s| json!({"type": "array", "items": s})),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| json!({"anyOf": v})),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| json!({"allOf": v})),
            (inner.clone(), inner.clone()).prop_map(
                |(a, b)| json!({"$defs": {"missing": a, "meta": b}, "$ref": "#/$defs/missing"})
            ),
            inner.prop_map(|s| json!({"not": s})),
        ]
    })
}

fn instance() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!(1.0)),
        "[a@.]{0,10}".prop_map(Value::from),
        Just(json!("a".repeat(40) + "!")),
    ];
    leaf.prop_recursive(3, 30, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-z$]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn fuzz_schema_compiler_on_hostile_schemas() {
    // CPU-bound for its whole run (see `support::exclusive`).
    let _alone = support::exclusive_blocking();
    let (listener, remote) = trap();
    fuzz::run(
        "schema",
        |bytes| {
            // Files that are not JSON are compiled as the string they hold.
            let schema = serde_json::from_slice(bytes)
                .unwrap_or_else(|_| Value::from(String::from_utf8_lossy(bytes).into_owned()));
            let instances = [
                json!({}),
                json!({"a": "x"}),
                json!([1, "a"]),
                json!("aaaa!"),
            ];
            schema_invariants(&schema, &instances).expect("invariants hold");
        },
        (schema(remote), proptest::collection::vec(instance(), 0..4)),
        |(schema, instances): (Value, Vec<Value>)| schema_invariants(&schema, &instances),
    );
    assert!(!contacted(&listener), "a remote $ref was fetched");
}

// === sanitizer ===

fn sanitize(input: &str) -> (String, Report) {
    let settings = SanitizeSettings::default();
    let sanitizer = Sanitizer::new(&settings, Skip::default());
    let mut report = Report::default();
    let out = sanitizer
        .text(input, &mut report)
        .unwrap_or_else(|| input.to_owned());
    (out, report)
}

fn sanitizer_invariants(input: &str) -> Result<(), TestCaseError> {
    let (once, _) = sanitize(input);
    let (twice, report) = sanitize(&once);
    prop_assert_eq!(&twice, &once, "not idempotent");
    prop_assert!(report.is_empty(), "the second pass acted: {:?}", report);
    for c in once.chars() {
        let hidden = matches!(c,
            '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
            | '\u{200b}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        prop_assert!(!hidden, "{:?} survived in {:?}", c, once);
    }
    // Whole JSON values too: keys included.
    let settings = SanitizeSettings::default();
    let sanitizer = Sanitizer::new(&settings, Skip::default());
    let mut value = json!({ input: [input, {"k": input}] });
    sanitizer.value(&mut value, &mut Report::default());
    let text = value.to_string();
    prop_assert!(
        !text.contains('\u{1b}') && !text.contains("\\u001b"),
        "{}",
        text
    );
    Ok(())
}

#[test]
fn fuzz_sanitizer() {
    // CPU-bound for its whole run (see `support::exclusive`).
    let _alone = support::exclusive_blocking();
    fuzz::run(
        "sanitize",
        |bytes| sanitizer_invariants(&String::from_utf8_lossy(bytes)).expect("invariants hold"),
        prop_oneof![
            any::<String>(),
            proptest::collection::vec(any::<u8>(), 0..300)
                .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            proptest::collection::vec(
                proptest::sample::select(
                    &[
                        "\u{1b}",
                        "[",
                        "]8;;",
                        "\u{7}",
                        "\u{9b}",
                        "\u{200b}",
                        "\u{202e}",
                        "\u{E0041}",
                        "🏴",
                        "password=",
                        "hunter2",
                        "AKIA",
                        "Z7QWERTYUIOPASDF",
                        "ghp_",
                        "eyJ",
                        ".",
                        "a",
                        " ",
                        "\r",
                        "\n",
                    ][..]
                ),
                0..80
            )
            .prop_map(|p| p.concat()),
        ],
        |input: String| sanitizer_invariants(&input),
    );
}

// === rate-limit arithmetic ===

/// A reference token bucket in exact integers: the level is kept in
/// nanoseconds of refill (one token = `interval`), starts full, refills one
/// unit per nanosecond up to `burst × interval`.
struct Model {
    level: u128,
    last: u64,
    capacity: u128,
    cost: u128,
}

impl Model {
    fn new(burst: u32, interval: u64, now: u64) -> Self {
        let capacity = u128::from(burst) * u128::from(interval);
        Self {
            level: capacity,
            last: now,
            capacity,
            cost: u128::from(interval),
        }
    }

    fn call(&mut self, now: u64) -> bool {
        self.level = (self.level + u128::from(now - self.last)).min(self.capacity);
        self.last = now;
        if self.level >= self.cost {
            self.level -= self.cost;
            true
        } else {
            false
        }
    }
}

/// (burst, interval ns, gaps between calls in ns).
type Arrivals = (u32, u64, Vec<u64>);

fn ratelimit_invariants((burst, interval, gaps): &Arrivals) -> Result<(), TestCaseError> {
    let quota = Quota::new(NonZeroU32::new(*burst).expect("burst > 0"), *interval);
    let start = 1_000u64;
    let mut model = Model::new(*burst, *interval, start);
    // A fresh bucket's TAT is "now" at its first use: start full.
    let mut tat = start;
    let mut now = start;
    for gap in gaps {
        now = now.saturating_add(*gap);
        let expected = model.call(now);
        match gcra::admit(tat, now, quota) {
            Ok(next) => {
                prop_assert!(expected, "admitted at {} where the model refuses", now);
                tat = next;
            }
            Err(retry_at) => {
                prop_assert!(!expected, "refused at {} where the model admits", now);
                prop_assert!(retry_at > now);
                // Exactly at retry_at the call passes, one nanosecond earlier it does not.
                prop_assert!(gcra::admit(tat, retry_at, quota).is_ok());
                prop_assert!(gcra::admit(tat, retry_at - 1, quota).is_err());
            }
        }
    }
    Ok(())
}

/// Corpus format: `burst interval` on the first line, then one gap per line.
fn parse_arrivals(bytes: &[u8]) -> Option<Arrivals> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.lines();
    let mut head = lines.next()?.split_whitespace();
    let burst: u32 = head.next()?.parse().ok().filter(|b| *b > 0)?;
    let interval: u64 = head.next()?.parse().ok().filter(|i| *i > 0)?;
    let gaps = lines.filter_map(|l| l.trim().parse().ok()).collect();
    Some((burst, interval, gaps))
}

#[test]
fn fuzz_rate_limit_arithmetic_against_a_model() {
    // CPU-bound for its whole run (see `support::exclusive`).
    let _alone = support::exclusive_blocking();
    fuzz::run(
        "ratelimit",
        |bytes| {
            let arrivals = parse_arrivals(bytes).expect("corpus file parses");
            ratelimit_invariants(&arrivals).expect("invariants hold");
        },
        (
            1u32..50,
            prop_oneof![1u64..10, 1_000u64..1_000_000, Just(1_000_000_000u64)],
            proptest::collection::vec(
                prop_oneof![Just(0u64), 0u64..2_000_000, 1u64..3_000_000_000],
                0..200,
            ),
        ),
        |arrivals| ratelimit_invariants(&arrivals),
    );
}
