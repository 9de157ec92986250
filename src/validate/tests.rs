use serde_json::json;

use super::*;

fn flight_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code of the departure airport"},
            "date": {"type": "string", "format": "date", "description": "Departure date, YYYY-MM-DD"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9, "description": "Number of travellers"},
            "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
            "bags": {"type": "array", "items": {"type": "object", "properties": {"weight_kg": {"type": "number", "maximum": 32}}, "required": ["weight_kg"]}}
        },
        "required": ["origin", "date", "passengers"],
        "additionalProperties": false
    })
}

fn lines(schema: &Value, args: Value) -> Vec<String> {
    let compiled = CompiledSchema::compile(schema, SchemaLimits::default()).expect("compiles");
    compiled
        .check(&args)
        .expect_err("must be refused")
        .iter()
        .map(Violation::line)
        .collect()
}

#[test]
fn valid_arguments_pass() {
    let compiled =
        CompiledSchema::compile(&flight_schema(), SchemaLimits::default()).expect("compiles");
    let ok = json!({"origin": "LHR", "date": "2026-12-01", "passengers": 2, "bags": [{"weight_kg": 20}]});
    assert_eq!(compiled.check(&ok), Ok(()));
}

#[test]
fn every_violation_is_named_with_pointer_expectation_and_description() {
    let got = lines(
        &flight_schema(),
        json!({"origin": "london", "date": "tomorrow", "passengers": 12, "cabin": "steerage", "bags": [{"weight_kg": 40}], "pet": "cat"}),
    );
    let text = got.join("\n");
    assert!(text.contains("/origin: expected a string matching the pattern ^[A-Z]{3}$, got \"london\" — IATA code of the departure airport"), "{text}");
    assert!(text.contains("/date: expected a string in format \"date\", got \"tomorrow\" — Departure date, YYYY-MM-DD"), "{text}");
    assert!(
        text.contains("/passengers: expected a number ≤ 9, got 12 — Number of travellers"),
        "{text}"
    );
    assert!(
        text.contains(
            "/cabin: expected one of [\"economy\",\"business\",\"first\"], got \"steerage\""
        ),
        "{text}"
    );
    assert!(
        text.contains("/bags/0/weight_kg: expected a number ≤ 32, got 40"),
        "{text}"
    );
    assert!(text.contains("(arguments): expected only the declared properties (origin, date, passengers, cabin, bags), got unexpected property \"pet\""), "{text}");
}

#[test]
fn missing_and_mistyped_properties() {
    let got = lines(&flight_schema(), json!({"origin": 7, "passengers": "two"})).join("\n");
    assert!(got.contains("/date: expected a value (this property is required), got nothing: the property is missing — Departure date, YYYY-MM-DD"), "{got}");
    assert!(
        got.contains("/origin: expected a value of type string, got 7"),
        "{got}"
    );
    assert!(
        got.contains("/passengers: expected a value of type integer, got \"two\""),
        "{got}"
    );
}

#[test]
fn long_received_values_are_shortened() {
    let long = "x".repeat(10_000);
    let got = lines(
        &flight_schema(),
        json!({"origin": long, "date": "2026-01-01", "passengers": 1}),
    )
    .join("\n");
    assert!(got.contains("(a string of 10000 characters)"), "{got}");
    assert!(got.len() < 400, "{got}");
}

#[test]
fn draft07_schemas_are_honoured() {
    let schema = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"n": {"type": "number", "exclusiveMaximum": 5}}});
    let got = lines(&schema, json!({"n": 5})).join("\n");
    assert!(got.contains("/n: expected a number < 5, got 5"), "{got}");
}

#[test]
fn remote_and_file_refs_are_refused_without_fetching() {
    for target in [
        "https://127.0.0.1:9/evil.json",
        "http://169.254.169.254/latest",
        "file:///etc/passwd",
    ] {
        let schema = json!({"type": "object", "properties": {"a": {"$ref": target}}});
        let err =
            CompiledSchema::compile(&schema, SchemaLimits::default()).expect_err("must refuse");
        assert!(matches!(err, SchemaError::Invalid(_)), "{target}: {err:?}");
    }
}

#[test]
fn local_refs_still_work() {
    let schema = json!({"type": "object", "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "properties": {"a": {"$ref": "#/$defs/code"}}});
    let got = lines(&schema, json!({"a": "xx"})).join("\n");
    assert!(
        got.contains("/a: expected a string matching the pattern ^[A-Z]{3}$"),
        "{got}"
    );
}

#[test]
fn unknown_dialects_are_refused() {
    let schema = json!({"$schema": "https://evil.example/meta", "type": "object"});
    assert_eq!(
        CompiledSchema::compile(&schema, SchemaLimits::default()).map(|_| ()),
        Err(SchemaError::UnknownDialect(
            "https://evil.example/meta".into()
        ))
    );
}

#[test]
fn catastrophic_pattern_runs_in_linear_time() {
    let schema =
        json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}});
    let compiled = CompiledSchema::compile(&schema, SchemaLimits::default()).expect("compiles");
    let near_miss = format!("{}!", "a".repeat(50_000));
    // A backtracking engine would not return from this in any useful time.
    assert!(compiled.check(&json!({"s": near_miss})).is_err());
}

#[test]
fn deeply_nested_schemas_are_refused_before_compiling() {
    let mut schema = json!({"type": "object"});
    for _ in 0..50 {
        schema = json!({"allOf": [schema]});
    }
    assert_eq!(
        CompiledSchema::compile(&schema, SchemaLimits::default()).map(|_| ()),
        Err(SchemaError::TooDeep(64))
    );
}

#[test]
fn oversized_schemas_are_refused() {
    let mut props = serde_json::Map::new();
    for i in 0..20_000 {
        props.insert(format!("p{i}"), json!({"type": "string"}));
    }
    let schema = json!({"type": "object", "properties": props});
    assert!(matches!(
        CompiledSchema::compile(&schema, SchemaLimits::default()),
        Err(SchemaError::TooLarge(..) | SchemaError::TooManyNodes(_))
    ));
}
