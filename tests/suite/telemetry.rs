//! OpenTelemetry traces, checked at a real OTLP/HTTP receiver that decodes the
//! protobuf the gateway sends: a request span with one child per pipeline
//! stage, the MCP/GenAI and HTTP attributes (and never arguments or results),
//! refusals and upstream failures marked as errors, the client's trace context from the
//! `traceparent` header or from `params._meta` (which wins), the upstream
//! receiving a `traceparent` that names the forward stage (in the header, and
//! in `params._meta` when the client put one there), the audit row
//! carrying the exported trace id, and the real binary sending its last spans
//! when SIGTERM stops it. JSON logs never carry arguments or results.

use crate::support;
use support::Config;
use support::tools_call;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use serde_json::{Value, json};
use support::otlp::{CLIENT, Receiver, SERVER, Span};
use support::upstreams::InProcess;
use support::{
    ALICE, TestGateway, allow_all, borrow, clients, modern_call, modern_call_headers, modern_meta,
    raw_post,
};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// An argument value that must never leave the gateway on a span or a log line.
const ORDER: &str = "ORD-004211";

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// A gateway in front of `upstream` exporting to `receiver`, auditing to `db`.
async fn gateway(upstream: &InProcess, receiver: &Receiver, db: &Path) -> TestGateway {
    TestGateway::start(
        &[("demo", &upstream.url)],
        &format!(
            "{}{}\n[audit]\ndatabase = {:?}\n[telemetry]\notlp_endpoint = \"{}\"\n",
            clients(),
            allow_all(),
            db.display().to_string(),
            receiver.endpoint
        ),
    )
    .await
}

/// (trace id, tool) of every audit row, in order.
fn audit_rows(db: &Path) -> Vec<(Option<String>, Option<String>, String)> {
    let conn = Connection::open(db).expect("audit store");
    let mut q = conn
        .prepare("SELECT trace_id, tool, decision FROM events ORDER BY id")
        .expect("query");
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows read")
}

fn names(spans: &[Span]) -> BTreeSet<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn no_argument_anywhere(spans: &[Span]) {
    for span in spans {
        for (key, value) in &span.attributes {
            assert!(
                !value.contains(ORDER) && !value.contains("order_id"),
                "{key} = {value} on {}",
                span.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_a_request_span_with_a_child_per_stage_in_the_clients_trace() {
    let receiver = Receiver::start().await;
    let upstream = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("audit.db");
    let gw = gateway(&upstream, &receiver, &db).await;
    let url = gw.url("demo");

    let parent = traceparent(CLIENT_TRACE, CLIENT_SPAN);
    let session = "session-that-must-not-appear-raw";
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": ORDER}),
        &[("traceparent", &parent), ("mcp-session-id", session)],
    )
    .await
    .ok();
    // A second call with no trace context of its own starts a new trace.
    tools_call(&url, ALICE, "lookup_order", json!({"order_id": ORDER}), &[])
        .await
        .ok();
    gw.stop().await;

    let spans = receiver.spans();
    let roots: Vec<&Span> = spans.iter().filter(|s| s.kind == SERVER).collect();
    assert_eq!(roots.len(), 2, "{spans:#?}");
    let root = roots
        .iter()
        .find(|s| s.trace_id == CLIENT_TRACE)
        .expect("the span in the client's trace");
    assert_eq!(root.name, "tools/call lookup_order");
    assert_eq!(
        root.parent_span_id, CLIENT_SPAN,
        "a child of the client's span"
    );
    assert_eq!(root.service, "portcullis");
    assert_eq!(root.status_code, 0, "{root:#?}");
    for (key, want) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "lookup_order"),
        ("gen_ai.operation.name", "execute_tool"),
        ("mcp.protocol.version", "2026-07-28"),
        ("jsonrpc.request.id", "1"),
        ("network.protocol.name", "http"),
        ("network.transport", "tcp"),
        ("http.request.method", "POST"),
        ("http.response.status_code", "200"),
        ("server.address", "127.0.0.1"),
        ("portcullis.client", "alice"),
        ("portcullis.server", "demo"),
        ("portcullis.decision", "forwarded"),
        ("portcullis.rule", "rules[0]"),
    ] {
        assert_eq!(root.attr(key), Some(want), "{key} on {root:#?}");
    }
    assert_eq!(root.attr("error.type"), None);
    let hashed = root.attr("mcp.session.id").expect("session attribute");
    assert_ne!(hashed, session);
    assert!(!hashed.contains(session) && hashed.len() == 32, "{hashed}");
    no_argument_anywhere(&spans);

    // One child per stage, all in the client's trace.
    let children: Vec<Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_id)
        .cloned()
        .collect();
    for stage in [
        "admit",
        "authenticate",
        "read_body",
        "classify",
        "negotiate",
        "catalog",
        "authorize",
        "rate_limit",
        "validate",
        "forward",
        "respond",
    ] {
        assert!(
            names(&children).contains(stage),
            "no {stage} stage in {:?}",
            names(&children)
        );
    }
    assert!(children.iter().all(|c| c.trace_id == CLIENT_TRACE));
    let forwards: Vec<&Span> = children.iter().filter(|c| c.name == "forward").collect();
    for f in &forwards {
        assert_eq!(f.kind, CLIENT);
        assert_eq!(f.attr("server.address"), Some("127.0.0.1"));
        assert_eq!(f.attr("http.response.status_code"), Some("200"));
    }

    // Each request the upstream got names one of the gateway's forward spans.
    let forward_ids: BTreeSet<&str> = spans
        .iter()
        .filter(|s| s.name == "forward")
        .map(|s| s.span_id.as_str())
        .collect();
    let received = upstream.headers();
    assert!(!received.is_empty());
    let in_client_trace = received
        .iter()
        .filter_map(|h| h.get("traceparent").and_then(|v| v.to_str().ok()))
        .filter(|tp| tp.contains(CLIENT_TRACE))
        .count();
    assert!(in_client_trace >= 1, "{received:?}");
    for headers in &received {
        let tp = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .expect("every upstream request carries a traceparent");
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4, "{tp}");
        assert!(forward_ids.contains(parts[2]), "{tp} names a forward span");
        assert!(
            roots.iter().any(|r| r.trace_id == parts[1]),
            "{tp} is in a request's trace"
        );
    }

    // The audit rows carry the exported trace ids.
    let rows = audit_rows(&db);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let traces: BTreeSet<String> = roots.iter().map(|r| r.trace_id.clone()).collect();
    let audited: BTreeSet<String> = rows.iter().filter_map(|r| r.0.clone()).collect();
    assert_eq!(audited, traces);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_error_spans_with_their_decision() {
    let receiver = Receiver::start().await;
    let upstream = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("audit.db");
    let gw = gateway(&upstream, &receiver, &db).await;
    let url = gw.url("demo");

    tools_call(&url, ALICE, "no_such_tool", json!({}), &[])
        .await
        .ok();
    tools_call(&url, ALICE, "lookup_order", json!({"order_id": 7}), &[])
        .await
        .ok();
    let headers = modern_call_headers("wrong-key", "lookup_order");
    let refused = raw_post(
        &url,
        &borrow(&headers),
        modern_call(1, "lookup_order", json!({"order_id": ORDER})),
    )
    .await;
    assert_eq!(refused.status, 401);
    gw.stop().await;

    let spans = receiver.spans();
    no_argument_anywhere(&spans);
    let root = |name: &str, decision: &str| -> Span {
        spans
            .iter()
            .find(|s| {
                s.kind == SERVER
                    && s.name == name
                    && s.attr("portcullis.decision") == Some(decision)
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {name} span decided {decision}: {spans:#?}"))
    };
    let stage_of = |root: &Span, stage: &str| -> Span {
        spans
            .iter()
            .find(|s| s.parent_span_id == root.span_id && s.name == stage)
            .cloned()
            .unwrap_or_else(|| panic!("no {stage} under {root:#?}"))
    };
    for (name, decision, stage) in [
        ("tools/call no_such_tool", "unknown_tool", "authorize"),
        ("tools/call lookup_order", "invalid_arguments", "validate"),
    ] {
        let r = root(name, decision);
        assert_eq!(r.status_code, 2, "{r:#?}");
        assert_eq!(r.status_message, decision);
        assert_eq!(r.attr("error.type"), Some(decision));
        let s = stage_of(&r, stage);
        assert_eq!(s.status_code, 2, "the {stage} stage refused: {s:#?}");
        assert_eq!(s.attr("error.type"), Some(decision));
    }
    let unknown_key = spans
        .iter()
        .find(|s| s.kind == SERVER && s.attr("http.response.status_code") == Some("401"))
        .expect("the unauthenticated request's span");
    assert_eq!(unknown_key.status_code, 2);
    assert!(unknown_key.attr("portcullis.client").is_none());
    assert_eq!(
        stage_of(unknown_key, "authenticate").status_code,
        2,
        "the authenticate stage refused"
    );
    assert_eq!(upstream.ran().len(), 0, "nothing refused ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meta_traceparent_wins_over_the_header_and_reaches_the_upstream() {
    let receiver = Receiver::start().await;
    let upstream = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("audit.db");
    let gw = gateway(&upstream, &receiver, &db).await;

    let meta_trace = "0af7651916cd43dd8448eb211c80319c";
    let meta_span = "b7ad6b7169203331";
    let mut meta = modern_meta();
    meta["traceparent"] = traceparent(meta_trace, meta_span).into();
    meta["tracestate"] = "congo=t61rcWkgMzE".into();
    let body = json!({"jsonrpc": "2.0", "id": "call-1", "method": "tools/call",
        "params": {"name": "lookup_order", "arguments": {"order_id": ORDER}, "_meta": meta}});
    let headers = modern_call_headers(ALICE, "lookup_order");
    let mut headers = borrow(&headers);
    let header_parent = traceparent(CLIENT_TRACE, CLIENT_SPAN);
    headers.push(("traceparent", &header_parent));
    let reply = raw_post(&gw.url("demo"), &headers, body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let (root, children) = receiver.request("tools/call lookup_order").await;
    gw.stop().await;

    assert_eq!(
        root.trace_id, meta_trace,
        "_meta names the MCP request: it wins"
    );
    assert_eq!(root.parent_span_id, meta_span);
    assert_eq!(root.attr("jsonrpc.request.id"), Some("call-1"));
    assert!(children.iter().all(|c| c.trace_id == meta_trace));
    let last = upstream
        .headers()
        .last()
        .and_then(|h| h.get("traceparent").cloned())
        .expect("the call reached the upstream with a traceparent");
    let last = last.to_str().expect("text");
    assert!(last.starts_with(&format!("00-{meta_trace}-")), "{last}");
    let forward = children
        .iter()
        .find(|c| last.contains(&c.span_id))
        .expect("the upstream's parent is a stage of the request");
    assert_eq!(forward.name, "forward");
    // The body's _meta names the same stage; the rest of the body is as the client sent it.
    let sent: Value =
        serde_json::from_slice(upstream.bodies().last().expect("a body")).expect("JSON");
    assert_eq!(sent["params"]["_meta"]["traceparent"], last);
    assert_eq!(sent["params"]["_meta"]["tracestate"], "congo=t61rcWkgMzE");
    let mut unchanged = sent.clone();
    unchanged["params"]["_meta"]["traceparent"] = traceparent(meta_trace, meta_span).into();
    assert_eq!(unchanged, body);
    let rows = audit_rows(&db);
    assert_eq!(rows.last().and_then(|r| r.0.as_deref()), Some(meta_trace));
}

/// The real binary: spans still queued when SIGTERM comes are sent before it
/// exits; its JSON log lines carry no argument and no result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_the_last_spans_and_json_logs_hold_no_arguments_or_results() {
    support::init();
    // A collector slow to answer: the process must wait for it, not exit meanwhile.
    let receiver = Receiver::start_slow(Duration::from_millis(700)).await;
    let upstream = InProcess::demo().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    let text = Config::new()
        .server("s", &upstream.url)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .allow_all()
        .memory_stores()
        .set("arguments", "full")
        .otlp(&receiver.endpoint)
        .set("log_format", "json")
        .render();
    std::fs::write(&path, text).expect("write");
    let mut child = support::run_binary(&path, &[]);
    let (mcp, _admin, mut log) = support::listening_log(&mut child).await;
    let url = format!("http://{mcp}/mcp/s");
    let result = tools_call(&url, ALICE, "lookup_order", json!({"order_id": ORDER}), &[])
        .await
        .ok();
    let output = result["result"]["content"][0]["text"]
        .as_str()
        .expect("the tool's text")
        .to_owned();
    tools_call(&url, ALICE, "lookup_order", json!({"order_id": 7}), &[])
        .await
        .ok();

    support::signal(child.id().expect("pid").into(), "TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the process exits")
        .expect("wait");
    assert_eq!(status.code(), Some(0));

    // Sent before exit: no waiting here.
    let roots: Vec<Span> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.kind == SERVER)
        .collect();
    assert_eq!(roots.len(), 2, "{:#?}", receiver.spans());
    no_argument_anywhere(&receiver.spans());

    let mut lines = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(5), log.recv()).await {
        lines.push(line);
    }
    let requests: Vec<&String> = lines.iter().filter(|l| l.contains("\"request\"")).collect();
    assert_eq!(requests.len(), 2, "{lines:#?}");
    for line in &lines {
        serde_json::from_str::<Value>(line).unwrap_or_else(|_| panic!("JSON: {line}"));
        assert!(!line.contains(ORDER), "an argument in the log: {line}");
        let snippet: String = output.chars().take(40).collect();
        assert!(!line.contains(&snippet), "the result in the log: {line}");
    }
    // The log line and the spans name the same trace.
    for root in &roots {
        assert!(
            requests.iter().any(|l| l.contains(&root.trace_id)),
            "{} in {requests:#?}",
            root.trace_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_is_an_error_on_the_forward_stage() {
    let receiver = Receiver::start().await;
    let gw = TestGateway::start(
        &[("dead", "http://127.0.0.1:9/mcp")],
        &format!(
            "{}{}\n[telemetry]\notlp_endpoint = \"{}\"\n",
            clients(),
            allow_all(),
            receiver.endpoint
        ),
    )
    .await;
    tools_call(&gw.url("dead"), ALICE, "anything", json!({}), &[])
        .await
        .ok();
    gw.stop().await;

    let spans = receiver.spans();
    let root = spans
        .iter()
        .find(|s| s.kind == SERVER)
        .expect("the request's span");
    assert_eq!(
        root.attr("portcullis.decision"),
        Some("upstream_unavailable")
    );
    assert_eq!(root.attr("error.type"), Some("upstream_unavailable"));
    assert_eq!(root.status_code, 2);
    let forward = spans
        .iter()
        .rev()
        .find(|s| s.parent_span_id == root.span_id && s.name == "forward")
        .expect("a forward stage");
    assert_eq!(forward.kind, CLIENT);
    assert_eq!(forward.status_code, 2, "{forward:#?}");
    assert_eq!(forward.attr("error.type"), Some("upstream_unavailable"));
    assert_eq!(
        forward.attr("http.response.status_code"),
        None,
        "no reply came"
    );
}

/// Text a client chooses (a tool name, a method, a server name in the path,
/// its own name) cannot add a line to the log, nor drive the terminal it is
/// read on, in either log format: every line the process writes is its own,
/// made of plain characters, and a JSON log stays one JSON object a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_text_cannot_forge_a_log_line() {
    use portcullis::util::escape::is_plain;
    use support::process::Observed;
    const FORGED: &str = "FORGED 2026-12-02T00:00:00.000000Z  INFO portcullis: request client=\"admin\" outcome=\"forwarded\"";
    let upstream = InProcess::demo().await;
    for format in ["json", "pretty"] {
        let config = Config::new()
            .server("s", &upstream.url)
            .set("pinning", "off")
            .clients()
            .allow_all()
            .memory_stores()
            .section("telemetry")
            .set("log_format", format)
            .render();
        let gateway = Observed::start(&config).await;
        let url = gateway.url("s");
        let hostile = [
            format!("\n{FORGED}"),
            format!("\r\n{FORGED}"),
            format!("\u{85}{FORGED}"),
            format!("\u{2028}{FORGED}"),
            format!("\u{1b}[2K\r{FORGED}"),
        ];
        let auth = [("authorization", "Bearer alice-key")];
        for text in &hostile {
            // A tool name and a method, each its own request.
            let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": format!("echo{text}"), "arguments": {}}});
            raw_post(&url, &auth, call.to_string()).await;
            let body =
                json!({"jsonrpc": "2.0", "id": 1, "method": format!("x{text}"), "params": {}});
            raw_post(&url, &auth, body.to_string()).await;
            let init = json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": format!("sdk{text}"), "version": "1"}}});
            raw_post(&url, &auth, init.to_string()).await;
            // A server name in the path, percent-encoded.
            let path: String = text.bytes().map(|b| format!("%{b:02X}")).collect();
            raw_post(&format!("{}/mcp/x{path}", gateway.base), &auth, "{}").await;
        }
        // Every request is logged once its answer is written: wait for the lines.
        let expected = 4 * hostile.len();
        let mut lines = Vec::new();
        for _ in 0..100 {
            lines = gateway.output();
            let requests = lines
                .iter()
                .filter(|l| l.contains("request") && !l.contains("listening"))
                .count();
            if requests >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        gateway.stop().await;
        for line in &lines {
            assert!(
                !line.starts_with("FORGED"),
                "{format}: a forged line: {lines:#?}"
            );
            let raw: Vec<char> = line.chars().filter(|c| !is_plain(*c)).collect();
            assert!(raw.is_empty(), "{format}: {raw:?} raw in {line:?}");
            if format == "json" {
                serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            }
        }
        assert!(
            lines.iter().any(|l| l.contains("FORGED")),
            "{format}: the client's text is in the log, escaped: {lines:#?}"
        );
    }
}
