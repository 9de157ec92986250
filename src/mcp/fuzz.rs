//! Fuzz targets for the wire parsers, run as unit tests because they reach
//! crate-private types: the JSON-RPC classifier, the header ⇄ body check and
//! the SSE decoder. Each replays `tests/fuzz/corpus/<target>/` and then runs
//! generated inputs through the driver in `tests/support/fuzz.rs`
//! (`PORTCULLIS_FUZZ_CASES`, `PORTCULLIS_FUZZ_SECONDS` for long runs).

#[path = "../../tests/support/fuzz.rs"]
mod driver;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::headers::{check_method_and_name, check_params};
use super::jsonrpc::{ClassifyError, Message};
use super::sse::{SseDecoder, SseItem};

const MAX_DEPTH: usize = 64;

// === jsonrpc ===

/// Fragments that make generated bodies reach past the JSON parser.
const JSON_PIECES: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u",
    "d800",
    "\\ud800",
    "\u{feff}",
    "\"jsonrpc\"",
    "\"2.0\"",
    "\"1.0\"",
    "\"id\"",
    "1",
    "-0",
    "1e400",
    "1.5",
    "null",
    "true",
    "{}",
    "[]",
    "\"method\"",
    "\"tools/call\"",
    "\"params\"",
    "\"name\"",
    "\"result\"",
    "\"error\"",
    "\"__proto__\"",
    "\0",
    " ",
    "\n",
];

fn body_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        proptest::collection::vec(proptest::sample::select(JSON_PIECES), 0..60)
            .prop_map(|p| p.concat().into_bytes()),
        message_value().prop_map(|v| v.to_string().into_bytes()),
    ]
}

/// Well-formed-ish messages with wrong parts mixed in.
fn message_value() -> impl Strategy<Value = Value> {
    let id = prop_oneof![
        Just(None),
        any::<i64>().prop_map(|n| Some(json!(n))),
        "[a-z0-9-]{0,8}".prop_map(|s| Some(json!(s))),
        Just(Some(Value::Null)),
        Just(Some(json!(1.5))),
        Just(Some(json!({}))),
    ];
    let method = prop_oneof![
        Just(None),
        proptest::sample::select(&["tools/call", "tools/list", "initialize", "x"][..])
            .prop_map(|m| Some(json!(m))),
        Just(Some(json!(7))),
    ];
    let params = prop_oneof![
        Just(None),
        Just(Some(json!({"name": "echo", "arguments": {}}))),
        Just(Some(json!([1]))),
        Just(Some(json!("p"))),
    ];
    let version = prop_oneof![
        Just(Some(json!("2.0"))),
        Just(Some(json!("1.0"))),
        Just(None)
    ];
    let extra = prop_oneof![
        Just(None),
        Just(Some(("result", json!({})))),
        Just(Some(("error", json!({"code": 1})))),
    ];
    (version, id, method, params, extra).prop_map(|(version, id, method, params, extra)| {
        let mut m = serde_json::Map::new();
        for (key, value) in [
            ("jsonrpc", version),
            ("id", id),
            ("method", method),
            ("params", params),
        ] {
            if let Some(v) = value {
                m.insert(key.into(), v);
            }
        }
        if let Some((k, v)) = extra {
            m.insert(k.into(), v);
        }
        Value::Object(m)
    })
}

/// What a classification must satisfy whatever the input.
fn classify_invariants(body: &[u8]) -> Result<(), TestCaseError> {
    let outcome = Message::classify(body, MAX_DEPTH);
    prop_assert_eq!(
        &outcome,
        &Message::classify(body, MAX_DEPTH),
        "deterministic"
    );
    match outcome {
        Ok(message) => {
            let value: Value = serde_json::from_slice(body).expect("accepted bodies are JSON");
            prop_assert_eq!(&value["jsonrpc"], "2.0");
            if let Some(id) = message.id() {
                prop_assert!(id.is_string() || id.is_i64() || id.is_u64(), "id {}", id);
                prop_assert_eq!(id, &value["id"]);
            }
            if let Some(method) = message.method() {
                prop_assert_eq!(&value["method"], method);
            }
            prop_assert!(value.get("params").is_none_or(Value::is_object));
        }
        Err(ClassifyError::Batch) => {
            let value: Value = serde_json::from_slice(body).expect("a batch is JSON");
            prop_assert!(value.is_array());
        }
        Err(ClassifyError::DuplicateKey(_)) => {
            // Valid JSON syntax, refused only for the repeated key.
            prop_assert!(serde_json::from_slice::<Value>(body).is_ok());
        }
        Err(ClassifyError::Parse(_)) => {
            prop_assert!(serde_json::from_slice::<Value>(body).is_err());
        }
        Err(ClassifyError::TooDeep(_) | ClassifyError::Invalid(_)) => {}
    }
    Ok(())
}

#[test]
fn fuzz_jsonrpc_classifier() {
    driver::run(
        "jsonrpc",
        |bytes| classify_invariants(bytes).expect("invariants hold"),
        body_bytes(),
        |body| classify_invariants(&body),
    );
}

// === headers ===

/// A header check input: headers (name, value) and a JSON-RPC body.
#[derive(Debug, Clone)]
struct HeaderCase {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Corpus format: `name: value` lines, a blank line, then the body.
fn parse_header_case(bytes: &[u8]) -> HeaderCase {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let headers = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    HeaderCase {
        headers,
        body: body.as_bytes().to_vec(),
    }
}

fn header_map(pairs: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_bytes(v.as_bytes()),
        ) {
            map.append(k, v);
        }
    }
    map
}

fn header_invariants(case: &HeaderCase) -> Result<(), TestCaseError> {
    let Ok(message) = Message::classify(&case.body, MAX_DEPTH) else {
        return Ok(());
    };
    let headers = header_map(&case.headers);
    for required in [true, false] {
        let verdict = check_method_and_name(&headers, &message, required);
        // A standard header given twice is always a mismatch.
        if message.method().is_some() && headers.get_all("mcp-method").iter().count() > 1 {
            prop_assert!(verdict.is_err(), "a duplicate Mcp-Method was accepted");
        }
        // Exact mirrors of the body pass.
        if let Some(method) = message.method() {
            let name = message
                .params()
                .and_then(|p| ["name", "uri", "taskId"].iter().find_map(|k| p.get(*k)))
                .and_then(Value::as_str);
            let mut mirror = vec![("mcp-method".to_owned(), encode(method))];
            if let Some(name) = name {
                mirror.push(("mcp-name".to_owned(), encode(name)));
            }
            let ok = check_method_and_name(&header_map(&mirror), &message, required);
            prop_assert!(ok.is_ok(), "a faithful mirror was refused: {:?}", ok);
        }
        if let Some(arguments) = message
            .params()
            .and_then(|p| p.get("arguments"))
            .and_then(Value::as_object)
        {
            let schema = json!({"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "count": {"type": "integer", "x-mcp-header": "Count"}}});
            let _ = check_params(&headers, arguments, &schema, required);
        }
    }
    Ok(())
}

/// A header value that carries `s` exactly: plain when it is visible ASCII, base64 otherwise.
fn encode(s: &str) -> String {
    if s.bytes().all(|b| (0x21..0x7f).contains(&b)) && !s.starts_with("=?") {
        s.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(s)
        )
    }
}

fn header_case() -> impl Strategy<Value = HeaderCase> {
    let name = prop_oneof![
        Just("mcp-method".to_owned()),
        Just("mcp-name".to_owned()),
        Just("mcp-param-region".to_owned()),
        Just("mcp-param-count".to_owned()),
        Just("mcp-protocol-version".to_owned()),
    ];
    let value = prop_oneof![
        Just("tools/call".to_owned()),
        Just("echo".to_owned()),
        Just("=?base64?ZWNobw==?=".to_owned()),
        Just("=?base64?!!?=".to_owned()),
        Just("7".to_owned()),
        Just("07".to_owned()),
        "[ -~]{0,12}",
    ];
    let tool = prop_oneof![
        Just("echo".to_owned()),
        ".{0,12}",
        Just("=?base64?x?=".to_owned())
    ];
    let args = prop_oneof![
        Just(json!({})),
        Just(json!({"region": "eu", "count": 7})),
        Just(json!({"region": 7, "count": "7"})),
        Just(json!({"count": 1.5})),
    ];
    (
        proptest::collection::vec((name, value), 0..5),
        tool,
        args,
        proptest::sample::select(&["tools/call", "resources/read", "tools/list"][..]),
    )
        .prop_map(|(headers, tool, args, method)| {
            let key = if method == "resources/read" {
                "uri"
            } else {
                "name"
            };
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": method,
                              "params": {key: tool, "arguments": args}});
            HeaderCase {
                headers,
                body: body.to_string().into_bytes(),
            }
        })
}

#[test]
fn fuzz_header_body_check() {
    driver::run(
        "headers",
        |bytes| header_invariants(&parse_header_case(bytes)).expect("invariants hold"),
        header_case(),
        |case| header_invariants(&case),
    );
}

// === sse ===

const SSE_PIECES: &[&str] = &[
    "data:",
    "data: ",
    "id: ",
    "id:\0",
    "event: ",
    "retry: ",
    "retry: 12",
    ": ",
    ":",
    "\n",
    "\r",
    "\r\n",
    "\n\n",
    "{\"a\":1}",
    "x",
    "é",
    "\u{feff}",
    "\u{1b}[31m",
    "unknown: v",
];

fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::collection::vec(proptest::sample::select(SSE_PIECES), 0..60)
            .prop_map(|p| p.concat().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
}

/// Decodes `stream` cut at `cuts` (positions, any order); the items, or `None` on error.
fn decode(stream: &[u8], cuts: &[usize], max: usize) -> Option<Vec<SseItem>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    points.push(0);
    points.push(stream.len());
    points.sort_unstable();
    points.dedup();
    let mut decoder = SseDecoder::new(max);
    let mut items = Vec::new();
    for pair in points.windows(2) {
        items.extend(decoder.push(&stream[pair[0]..pair[1]]).ok()?);
    }
    items.extend(decoder.finish().ok()?);
    Some(items)
}

fn sse_invariants(stream: &[u8], cuts: &[usize], max: usize) -> Result<(), TestCaseError> {
    let whole = decode(stream, &[], max);
    let split = decode(stream, cuts, max);
    prop_assert_eq!(&whole, &split, "the split changed the result");
    let one_by_one: Vec<usize> = (0..stream.len()).collect();
    prop_assert_eq!(&whole, &decode(stream, &one_by_one, max), "byte by byte");
    if let Some(items) = whole {
        // Encoding what was decoded and decoding it again gives the same items.
        let encoded: Vec<u8> = items.iter().flat_map(|i| i.encode().to_vec()).collect();
        prop_assert_eq!(decode(&encoded, &[], usize::MAX), Some(items));
    }
    Ok(())
}

#[test]
fn fuzz_sse_decoder_whatever_the_chunking() {
    driver::run(
        "sse",
        |bytes| {
            // Every split into two, plus the byte-by-byte split, under a small cap and a large one.
            for max in [32, 64, 1 << 20] {
                for cut in 0..=bytes.len().min(512) {
                    sse_invariants(bytes, &[cut], max).expect("invariants hold");
                }
            }
        },
        (
            sse_stream(),
            proptest::collection::vec(any::<usize>(), 0..8),
            prop_oneof![Just(32usize), Just(256), Just(1 << 20)],
        ),
        |(stream, cuts, max)| sse_invariants(&stream, &cuts, max),
    );
}
