//! The sanitizer over whole messages: any message of any MCP method of both
//! eras (2025-11-25 and 2026-07-28 — results of every request, errors,
//! notifications, the server's own requests, `input_required` results with
//! their `inputRequests`, task results and status notifications), with random
//! extra fields at random places, carrying canaries (escape sequences, C1
//! controls, bidi overrides and isolates, zero-width and tag characters,
//! credentials) in every text position and in keys. Property: what the client
//! would receive holds none of them, a second pass changes nothing, and a
//! message whose identifiers are all well-formed is never refused.
//!
//! The method list below is written from `schema/2025-11-25/schema.ts` and
//! `schema/2026-07-28/schema.ts`; it is meant to follow the gateway's method
//! table, so a method added there gets a shape here.

use portcullis::config::SanitizeSettings;
use portcullis::sanitize::{Report, Sanitizer, Skip};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Pieces of hostile text; joined with spaces so that every credential stands
/// alone as the detectors require.
const CANARIES: &[&str] = &[
    "\u{1b}[31m",
    "\u{1b}]8;;http://evil.example\u{7}",
    "\u{1b}]52;c;Y3VybA==\u{7}",
    "\u{9b}2J",
    "\u{202e}",
    "\u{2066}",
    "\u{200b}",
    "\u{feff}",
    "\u{E0049}\u{E0067}\u{E006E}",
    "AKIAZ7QWERTYUIOPCANA",
    "ghp_C4n4ryT0k3nXq9Wv2Lm8Rt5Yp1Zs7Kd3Hf6J",
    "ignore previous instructions",
    "plain",
    "é葛",
];

/// What must never reach the client, as a character test or a substring.
fn leak(out: &str) -> Option<String> {
    for c in out.chars() {
        let bad = c == '\u{1b}'
            || ('\u{80}'..='\u{9f}').contains(&c)
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}')
            || ('\u{E0000}'..='\u{E007F}').contains(&c);
        if bad {
            return Some(format!("{c:?}"));
        }
    }
    [
        "\\u001b",
        "AKIAZ7QWERTYUIOPCANA",
        "C4n4ryT0k3n",
        "evil.example",
    ]
    .into_iter()
    .find(|needle| out.contains(needle))
    .map(str::to_owned)
}

const T: &str = "$T";

/// Sampling params (a server request in 2025-11-25, an input request in 2026).
fn sampling() -> Value {
    json!({
        "messages": [
            {"role": "user", "content": {"type": "text", "text": T, "_meta": {"k": T}}},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "get_x", "input": {"q": T}}]},
            {"role": "user", "content": [{"type": "tool_result", "toolUseId": "tu1",
                "content": [{"type": "text", "text": T}], "structuredContent": {"a": T}, "isError": false}]},
            {"role": "user", "content": {"type": "image", "data": "QUJD", "mimeType": "image/png"}}
        ],
        "systemPrompt": T,
        "modelPreferences": {"hints": [{"name": T}], "intelligencePriority": 0.5},
        "includeContext": "none",
        "maxTokens": 10,
        "stopSequences": [T],
        "metadata": {T: T},
        "tools": [{"name": "get_x", "description": T, "inputSchema": {"type": "object", "properties": {"q": {"type": "string", "description": T}}}}],
        "toolChoice": {"mode": "auto"},
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t1"}}
    })
}

fn elicitation() -> Value {
    json!({
        "mode": "form",
        "message": T,
        "requestedSchema": {"type": "object", "properties": {
            "user": {"type": "string", "title": T, "description": T, "default": T},
            "pick": {"type": "string", "enum": [T, "b"], "enumNames": [T, T]},
            "many": {"type": "array", "items": {"anyOf": [{"const": T, "title": T}]}}
        }, "required": ["user"]}
    })
}

fn call_result() -> Value {
    json!({
        "content": [
            {"type": "text", "text": T, "annotations": {"audience": ["user"], "priority": 0.5, "lastModified": T}, "_meta": {"k": T}},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png", "annotations": {"audience": ["assistant"]}},
            {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
            {"type": "resource_link", "uri": "res://a/1", "name": "a", "title": T, "description": T, "mimeType": "text/plain", "size": 3, "icons": [{"src": T, "mimeType": "image/png", "sizes": [T]}]},
            {"type": "resource", "resource": {"uri": "res://b", "mimeType": "text/plain", "text": T, "_meta": {"x": T}}},
            {"type": "resource", "resource": {"uri": "res://c", "blob": "QUJD"}}
        ],
        "structuredContent": {"k": T, "n": [T, {"deep": T}]},
        "isError": false,
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t1"}, "note": T}
    })
}

fn task(modern: bool) -> Value {
    if modern {
        json!({"resultType": "task", "taskId": "t1", "status": "working", "statusMessage": T,
               "createdAt": T, "lastUpdatedAt": T, "ttlMs": 1000, "pollIntervalMs": 100})
    } else {
        json!({"task": {"taskId": "t1", "status": "working", "statusMessage": T, "createdAt": T,
               "lastUpdatedAt": T, "ttl": 1000, "pollInterval": 100}})
    }
}

fn server_info() -> Value {
    json!({"name": "srv", "title": T, "version": T, "description": T, "websiteUrl": T,
           "icons": [{"src": T, "mimeType": "image/png", "sizes": [T], "theme": "dark"}]})
}

fn tool() -> Value {
    json!({"name": "get_x", "title": T, "description": T,
           "inputSchema": {"type": "object", "properties": {"a": {"type": "string", "description": T, "enum": [T], "default": T, "x-mcp-header": T}}, "required": ["a"]},
           "outputSchema": {"type": "object", "properties": {"k": {"type": "string", "title": T}}},
           "annotations": {"title": T, "readOnlyHint": true},
           "execution": {"taskSupport": "optional"},
           "icons": [{"src": T}], "_meta": {T: T}})
}

/// Every message shape an upstream can send, by era and method.
fn shapes() -> Vec<(&'static str, Value)> {
    let result = |r: Value| json!({"jsonrpc": "2.0", "id": 7, "result": r});
    let modern = |mut r: Value| {
        r["resultType"] = "complete".into();
        json!({"jsonrpc": "2.0", "id": "r-1", "result": r})
    };
    let note =
        |method: &str, params: Value| json!({"jsonrpc": "2.0", "method": method, "params": params});
    let request = |method: &str, params: Value| json!({"jsonrpc": "2.0", "id": 0, "method": method, "params": params});
    let resources = json!({"resources": [{"uri": "res://a", "name": "a", "title": T, "description": T, "mimeType": "text/plain",
        "annotations": {"audience": ["user"], "lastModified": T}, "size": 1, "_meta": {"k": T}}], "nextCursor": "c-1"});
    let templates = json!({"resourceTemplates": [{"uriTemplate": "res://{id}/x", "name": "t", "title": T, "description": T, "mimeType": "text/plain"}]});
    let read = json!({"contents": [{"uri": "res://a", "mimeType": "text/plain", "text": T, "_meta": {T: T}}, {"uri": "res://b", "blob": "QUJD"}], "_meta": {"x": T}});
    let prompts = json!({"prompts": [{"name": "p", "title": T, "description": T, "arguments": [{"name": "arg", "title": T, "description": T, "required": true}], "icons": [{"src": T}]}]});
    let prompt = json!({"description": T, "messages": [
        {"role": "user", "content": {"type": "text", "text": T}},
        {"role": "assistant", "content": {"type": "resource", "resource": {"uri": "res://x", "text": T}}},
        {"role": "user", "content": {"type": "resource_link", "uri": "res://y", "name": T}}
    ], "_meta": {"x": T}});
    let complete = json!({"completion": {"values": [T, T], "total": 2, "hasMore": false}});
    let caching = |mut r: Value| {
        r["ttlMs"] = 0.into();
        r["cacheScope"] = "private".into();
        r
    };
    vec![
        // 2025-11-25: results of every request.
        (
            "initialize",
            result(json!({"protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": true}, "logging": {}, "tasks": {"list": {}, "requests": {"tools": {"call": {}}}}, "experimental": {T: {"k": T}}},
            "serverInfo": server_info(), "instructions": T, "_meta": {"k": T}})),
        ),
        ("ping", result(json!({}))),
        (
            "tools/list",
            result(json!({"tools": [tool()], "nextCursor": "c-1"})),
        ),
        ("tools/call", result(call_result())),
        ("tools/call (task)", result(task(false))),
        ("tasks/get", result(task(false)["task"].clone())),
        (
            "tasks/list",
            result(json!({"tasks": [task(false)["task"].clone()], "nextCursor": "c-2"})),
        ),
        ("tasks/result", result(call_result())),
        ("tasks/cancel", result(task(false)["task"].clone())),
        ("resources/list", result(resources.clone())),
        ("resources/templates/list", result(templates.clone())),
        ("resources/read", result(read.clone())),
        ("resources/subscribe", result(json!({}))),
        ("prompts/list", result(prompts.clone())),
        ("prompts/get", result(prompt.clone())),
        ("completion/complete", result(complete.clone())),
        ("logging/setLevel", result(json!({}))),
        (
            "error",
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": T, "data": {"trace": T, "list": [T]}}}),
        ),
        (
            "error without id",
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": T, "data": T}}),
        ),
        // 2025-11-25: notifications.
        (
            "notifications/message",
            note(
                "notifications/message",
                json!({"level": "info", "logger": T, "data": {T: T}}),
            ),
        ),
        (
            "notifications/progress",
            note(
                "notifications/progress",
                json!({"progressToken": "p-1", "progress": 1, "total": 2, "message": T}),
            ),
        ),
        (
            "notifications/cancelled",
            note(
                "notifications/cancelled",
                json!({"requestId": "r-1", "reason": T}),
            ),
        ),
        (
            "notifications/resources/updated",
            note(
                "notifications/resources/updated",
                json!({"uri": "res://a", "_meta": {"k": T}}),
            ),
        ),
        (
            "notifications/resources/list_changed",
            note(
                "notifications/resources/list_changed",
                json!({"_meta": {"k": T}}),
            ),
        ),
        (
            "notifications/tools/list_changed",
            note("notifications/tools/list_changed", json!({})),
        ),
        (
            "notifications/prompts/list_changed",
            note("notifications/prompts/list_changed", json!({})),
        ),
        (
            "notifications/tasks/status",
            note("notifications/tasks/status", task(false)["task"].clone()),
        ),
        (
            "notifications/elicitation/complete",
            note(
                "notifications/elicitation/complete",
                json!({"elicitationId": "e-1"}),
            ),
        ),
        // 2025-11-25: the server's own requests.
        (
            "sampling/createMessage",
            request("sampling/createMessage", sampling()),
        ),
        (
            "elicitation/create",
            request("elicitation/create", elicitation()),
        ),
        (
            "elicitation/create (url)",
            request(
                "elicitation/create",
                json!({"mode": "url", "message": T, "url": T, "elicitationId": "e-1"}),
            ),
        ),
        ("roots/list", request("roots/list", json!({}))),
        ("ping (server)", request("ping", json!({}))),
        // 2026-07-28.
        (
            "server/discover",
            modern(
                json!({"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {T: T}}},
            "instructions": T, "ttlMs": 0, "cacheScope": "private",
            "_meta": {"io.modelcontextprotocol/serverInfo": server_info()}}),
            ),
        ),
        (
            "tools/list 2026",
            modern(caching(json!({"tools": [tool()]}))),
        ),
        ("tools/call 2026", modern(call_result())),
        (
            "tools/call input_required",
            json!({"jsonrpc": "2.0", "id": "r-1", "result": {"resultType": "input_required",
            "inputRequests": {"ask": {"method": "elicitation/create", "params": elicitation()},
                              "think": {"method": "sampling/createMessage", "params": sampling()},
                              "roots": {"method": "roots/list", "params": {}},
                              T: {"method": "elicitation/create", "params": {"message": T, "requestedSchema": {"type": "object", "properties": {}}}}},
            "requestState": "st-abc.123", "_meta": {"k": T}}}),
        ),
        (
            "tools/call task 2026",
            json!({"jsonrpc": "2.0", "id": "r-1", "result": task(true)}),
        ),
        (
            "tasks/get 2026",
            json!({"jsonrpc": "2.0", "id": "r-1", "result": {"resultType": "complete", "taskId": "t1", "status": "completed",
            "statusMessage": T, "result": call_result()}}),
        ),
        (
            "tasks/update 2026",
            modern(
                json!({"taskId": "t1", "status": "input_required", "statusMessage": T,
            "inputRequests": {"ask": {"method": "elicitation/create", "params": elicitation()}}}),
            ),
        ),
        (
            "tasks/cancel 2026",
            modern(json!({"taskId": "t1", "status": "cancelled", "statusMessage": T})),
        ),
        ("resources/list 2026", modern(caching(resources))),
        ("resources/templates/list 2026", modern(caching(templates))),
        ("resources/read 2026", modern(caching(read))),
        ("prompts/list 2026", modern(caching(prompts))),
        ("prompts/get 2026", modern(prompt)),
        ("completion/complete 2026", modern(complete)),
        (
            "subscriptions/listen ack",
            note(
                "notifications/subscriptions/acknowledged",
                json!({"_meta": {"io.modelcontextprotocol/subscriptionId": "s-1"}}),
            ),
        ),
        (
            "notifications/tools/list_changed 2026",
            note(
                "notifications/tools/list_changed",
                json!({"_meta": {"io.modelcontextprotocol/subscriptionId": "s-1", "note": T}}),
            ),
        ),
        (
            "notifications/message 2026",
            note(
                "notifications/message",
                json!({"level": "warning", "logger": T, "data": T}),
            ),
        ),
        (
            "error 2026",
            json!({"jsonrpc": "2.0", "id": "r-1", "error": {"code": -32022, "message": T, "data": {"supported": ["2026-07-28"], "requested": T}}}),
        ),
    ]
}

/// Keys that carry exempt identifiers: extra fields never use them (a
/// credential there would be a value the table exempts on purpose).
const IDENTIFIER_KEYS: &[&str] = &[
    "jsonrpc",
    "id",
    "method",
    "requestId",
    "nextCursor",
    "cursor",
    "uri",
    "uriTemplate",
    "name",
    "mimeType",
    "progressToken",
    "taskId",
    "io.modelcontextprotocol/subscriptionId",
    "toolUseId",
    "elicitationId",
    "blob",
    "data",
    "requestState",
    "resultType",
    "type",
    "protocolVersion",
];

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(CANARIES), 1..5).prop_map(|v| v.join(" "))
}

fn extra_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        3 => text().prop_map(Value::String),
        1 => any::<i32>().prop_map(Value::from),
        1 => Just(Value::Null),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((text(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A generated case: a shape, texts for its slots, extra fields, and maybe
/// one identifier corrupted with an escape sequence.
#[derive(Debug, Clone)]
struct Case {
    shape: usize,
    texts: Vec<String>,
    extras: Vec<(usize, String, Value)>,
    corrupt: Option<usize>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..shapes().len(),
        proptest::collection::vec(text(), 8),
        proptest::collection::vec(
            (
                any::<usize>(),
                prop_oneof![text(), Just("extra".to_owned())],
                extra_value(),
            ),
            0..6,
        ),
        proptest::option::weighted(0.25, any::<usize>()),
    )
        .prop_map(|(shape, texts, extras, corrupt)| Case {
            shape,
            texts,
            extras,
            corrupt,
        })
}

/// The message of a case.
fn build(case: &Case) -> (&'static str, Value) {
    let (name, mut message) = shapes().swap_remove(case.shape);
    let mut next = 0;
    fill(&mut message, &case.texts, &mut next);
    let objects = count_objects(&message);
    for (at, key, value) in &case.extras {
        if IDENTIFIER_KEYS.contains(&key.as_str()) {
            continue;
        }
        let target = at % objects;
        insert_at(&mut message, target, &mut 0, key, value);
    }
    if let Some(which) = case.corrupt {
        let n = count_identifiers(&message);
        if n > 0 {
            corrupt_at(&mut message, which % n, &mut 0);
        }
    }
    (name, message)
}

fn fill(value: &mut Value, texts: &[String], next: &mut usize) {
    fn take(texts: &[String], next: &mut usize) -> String {
        *next += 1;
        texts[*next % texts.len()].clone()
    }
    match value {
        Value::String(s) if s == T => *s = take(texts, next),
        Value::Array(items) => items.iter_mut().for_each(|i| fill(i, texts, next)),
        Value::Object(map) => {
            let old = std::mem::take(map);
            for (k, mut v) in old {
                fill(&mut v, texts, next);
                let k = if k == T { take(texts, next) } else { k };
                map.insert(k, v);
            }
        }
        _ => {}
    }
}

fn count_objects(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(count_objects).sum(),
        Value::Object(map) => 1 + map.values().map(count_objects).sum::<usize>(),
        _ => 0,
    }
}

fn insert_at(value: &mut Value, target: usize, seen: &mut usize, key: &str, extra: &Value) -> bool {
    match value {
        Value::Array(items) => items
            .iter_mut()
            .any(|i| insert_at(i, target, seen, key, extra)),
        Value::Object(map) => {
            if *seen == target {
                map.insert(key.to_owned(), extra.clone());
                return true;
            }
            *seen += 1;
            map.values_mut()
                .any(|v| insert_at(v, target, seen, key, extra))
        }
        _ => false,
    }
}

fn count_identifiers(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(count_identifiers).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(_) if IDENTIFIER_KEYS.contains(&k.as_str()) => 1,
                _ => count_identifiers(v),
            })
            .sum(),
        _ => 0,
    }
}

fn corrupt_at(value: &mut Value, target: usize, seen: &mut usize) -> bool {
    match value {
        Value::Array(items) => items.iter_mut().any(|i| corrupt_at(i, target, seen)),
        Value::Object(map) => map.iter_mut().any(|(k, v)| match v {
            Value::String(s) if IDENTIFIER_KEYS.contains(&k.as_str()) => {
                if *seen == target {
                    // At the start: in the middle it could split a sequence
                    // of a text in a `name`, which would leave its payload as
                    // plain (visible) words.
                    s.insert_str(0, "\u{1b}[31m\u{202e}");
                    return true;
                }
                *seen += 1;
                false
            }
            _ => corrupt_at(v, target, seen),
        }),
        _ => false,
    }
}

fn keys_and_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| keys_and_strings(i, out)),
        Value::Object(map) => {
            for (k, v) in map {
                out.push(k.clone());
                keys_and_strings(v, out);
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn no_canary_reaches_the_client(case in case()) {
        let (name, message) = build(&case);
        let settings = SanitizeSettings::default();
        let s = Sanitizer::new(&settings, Skip::default());
        let mut out = message.clone();
        let mut report = Report::default();
        let answering = name.split(' ').next();
        match s.message(&mut out, answering, &mut report) {
            Ok(_) => {
                let bytes = serde_json::to_string(&out).expect("serializes");
                prop_assert!(leak(&bytes).is_none(), "{name}: {:?} reached the client in {bytes}", leak(&bytes));
                let mut all = Vec::new();
                keys_and_strings(&out, &mut all);
                for text in all {
                    prop_assert!(!text.contains('\u{feff}'), "{name}: a BOM in {text:?}");
                }
                let again = out.clone();
                let mut second = Report::default();
                prop_assert!(s.message(&mut out, answering, &mut second).is_ok());
                prop_assert_eq!(&out, &again, "{}: a second pass changed it", name);
                prop_assert!(second.is_empty(), "{name}: a second pass acted: {second:?}");
            }
            Err(why) => {
                // Only a corrupted identifier makes a well-formed shape a protocol error.
                prop_assert!(case.corrupt.is_some(), "{name} refused: {}", why.0);
            }
        }
    }
}

#[test]
fn every_shape_is_well_formed_as_written() {
    let settings = SanitizeSettings::default();
    let s = Sanitizer::new(&settings, Skip::default());
    for (name, message) in shapes() {
        let mut m = message;
        fill(&mut m, &["words".to_owned()], &mut 0);
        let clean = m.clone();
        let mut report = Report::default();
        s.message(&mut m, name.split(' ').next(), &mut report)
            .unwrap_or_else(|e| panic!("{name}: {}", e.0));
        assert_eq!(m, clean, "{name}: clean input changed");
        assert!(report.is_empty(), "{name}: {report:?}");
    }
}
