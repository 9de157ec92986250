//! What holds at the edges of the main path: every listener and endpoint
//! refuses DNS rebinding the same way; every identifier a client sends is
//! bounded at the edge, and what the gateway keeps of one is bounded too; a
//! flood of the worst inputs leaves other clients served. What a reload moves (revoked
//! clients' streams, JWT audiences): `edges_reload.rs`.

use crate::support;
use support::Config;

use std::io::Write as _;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};
use support::jwt::{Signer, jwks};
use support::upstreams::InProcess;
use support::{
    ALICE, BOB, TestGateway, allow_all, borrow, clients, modern_call, modern_call_headers, raw_post,
};

pub(crate) const ADMIN_TOKEN: &str = "edges-admin-token";

pub(crate) fn http() -> reqwest::Client {
    support::init();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// A JWKS file with one key, for `[auth.jwt]`.
pub(crate) fn jwks_file() -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(jwks(&[&Signer::ec("edges")]).as_bytes())
        .expect("write");
    file
}

// === DNS rebinding: every listener, every endpoint ===

/// A named set of request headers, and whether it must be refused.
type HeaderCase = (&'static str, Vec<(&'static str, String)>, bool);

/// Header sets a rebinding page (or a confused browser) sends, and whether
/// they must be refused.
fn header_cases(port: u16) -> Vec<HeaderCase> {
    let host = |h: &str| ("host", h.to_owned());
    let local = format!("127.0.0.1:{port}");
    vec![
        (
            "rebound host",
            vec![host(&format!("rebind.attacker.test:{port}"))],
            true,
        ),
        (
            "host with a loopback prefix",
            vec![host("127.0.0.1.evil.test")],
            true,
        ),
        ("empty host", vec![host("")], true),
        (
            "foreign origin",
            vec![host(&local), ("origin", "https://evil.example".into())],
            true,
        ),
        (
            "null origin",
            vec![host(&local), ("origin", "null".into())],
            true,
        ),
        (
            "origin that only starts like localhost",
            vec![
                host(&local),
                ("origin", "http://localhost.evil.example".into()),
            ],
            true,
        ),
        ("loopback host", vec![host(&local)], false),
        ("localhost", vec![host("localhost")], false),
        (
            "local page",
            vec![host(&local), ("origin", "http://localhost:5173".into())],
            false,
        ),
        ("allowed host", vec![host("mcp.example.test:443")], false),
        (
            "allowed origin",
            vec![host(&local), ("origin", "https://app.example.test".into())],
            false,
        ),
    ]
}

/// Whether a response is the rebinding refusal (403 naming the setting).
async fn refused_as_rebinding(resp: reqwest::Response) -> (bool, u16, String) {
    let status = resp.status().as_u16();
    let streaming = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    // A stream that was let through is not read to its end.
    let text = match streaming {
        true => String::new(),
        false => resp.text().await.unwrap_or_default(),
    };
    let refused = status == 403
        && (text.contains("gateway.allowed_hosts") || text.contains("gateway.allowed_origins"));
    (refused, status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_and_endpoint_refuses_rebinding_alike() {
    let upstream = InProcess::demo().await;
    let keys = jwks_file();
    for with_token in [true, false] {
        let mut config = Config::new();
        if with_token {
            config = config.admin_token(ADMIN_TOKEN);
        }
        let text = config
            .gateway("allowed_hosts", vec!["mcp.example.test"])
            .gateway("allowed_origins", vec!["https://app.example.test"])
            .server("s", &upstream.url)
            .set("pinning", "off")
            .clients()
            .allow_all()
            .section("auth.jwt")
            .set("issuer", "https://idp.example.test")
            .set("audience", "https://mcp.example.test/mcp/s")
            .set("jwks_file", keys.path().display().to_string())
            .render();
        let gateway = TestGateway::start_raw(&text).await;
        let mcp = gateway.url("s");
        let mcp_base = mcp.trim_end_matches("/mcp/s").to_owned();
        let admin = gateway.admin_url();
        let mcp_port: u16 = mcp_base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        let admin_port: u16 = admin
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        let well_known = "/.well-known/oauth-protected-resource";
        let endpoints: Vec<(reqwest::Method, String, u16)> = vec![
            (reqwest::Method::POST, format!("{mcp_base}/mcp/s"), mcp_port),
            (reqwest::Method::GET, format!("{mcp_base}/mcp/s"), mcp_port),
            (
                reqwest::Method::DELETE,
                format!("{mcp_base}/mcp/s"),
                mcp_port,
            ),
            (reqwest::Method::POST, format!("{mcp_base}/mcp"), mcp_port),
            (
                reqwest::Method::GET,
                format!("{mcp_base}{well_known}"),
                mcp_port,
            ),
            (
                reqwest::Method::GET,
                format!("{mcp_base}{well_known}/mcp"),
                mcp_port,
            ),
            (
                reqwest::Method::GET,
                format!("{mcp_base}{well_known}/mcp/s"),
                mcp_port,
            ),
            (reqwest::Method::GET, format!("{admin}/healthz"), admin_port),
            (reqwest::Method::GET, format!("{admin}/readyz"), admin_port),
            (reqwest::Method::GET, format!("{admin}/metrics"), admin_port),
            (reqwest::Method::GET, format!("{admin}/"), admin_port),
            (
                reqwest::Method::GET,
                format!("{admin}/api/events"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/api/events/stream"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/api/events/1"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/api/overview"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/api/config"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/api/pins"),
                admin_port,
            ),
            (
                reqwest::Method::POST,
                format!("{admin}/api/pins/approve"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/api/reload"),
                admin_port,
            ),
            (
                reqwest::Method::POST,
                format!("{admin}/api/reload"),
                admin_port,
            ),
            (
                reqwest::Method::GET,
                format!("{admin}/no/such/path"),
                admin_port,
            ),
        ];
        let client = http();
        for (method, url, port) in &endpoints {
            for (case, headers, refuse) in header_cases(*port) {
                let mut req = client
                    .request(method.clone(), url)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
                let key = if url.starts_with(&admin) {
                    ADMIN_TOKEN
                } else {
                    ALICE
                };
                req = req.bearer_auth(key);
                for (k, v) in &headers {
                    req = req.header(*k, v.as_str());
                }
                let hits = upstream.hits();
                let resp = req.send().await.expect("request sent");
                let (refused, status, text) = refused_as_rebinding(resp).await;
                if refuse {
                    assert_eq!(
                        upstream.hits(),
                        hits,
                        "a refused {method} {url} reached the upstream"
                    );
                }
                assert_eq!(
                    refused, refuse,
                    "{method} {url} with {case} (admin token configured: {with_token}): {status} {text}"
                );
            }
        }
        // Without an admin token, the reads a rebinding page went for are open
        // on loopback to loopback names only.
        let events = client
            .get(format!("{admin}/api/events"))
            .send()
            .await
            .expect("sent");
        assert_eq!(events.status().as_u16(), if with_token { 401 } else { 200 });
        gateway.stop().await;
    }
}

// === Identifiers: bounded at the edge, bounded where kept ===

/// One identifier field: the name the refusal gives it, its cap, and a
/// message carrying `value` there.
struct Field {
    field: &'static str,
    cap: usize,
    message: fn(&str) -> Value,
}

const FIELDS: &[Field] = &[
    Field {
        field: "method",
        cap: 128,
        message: |v| json!({"jsonrpc": "2.0", "id": 1, "method": v}),
    },
    Field {
        field: "id",
        cap: 256,
        message: |v| json!({"jsonrpc": "2.0", "id": v, "method": "tools/list"}),
    },
    Field {
        field: "params.name",
        cap: 256,
        message: |v| json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": v, "arguments": {}}}),
    },
    Field {
        field: "params.name",
        cap: 256,
        message: |v| json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": {"name": v}}),
    },
    Field {
        field: "params.uri",
        cap: 4096,
        message: |v| json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": v}}),
    },
    Field {
        field: "params._meta.progressToken",
        cap: 256,
        message: |v| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": {"progressToken": v}}})
        },
    },
    Field {
        field: "params.cursor",
        cap: 4096,
        message: |v| json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": v}}),
    },
    Field {
        field: "params.requestId",
        cap: 256,
        message: |v| json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": v}}),
    },
    Field {
        field: "params.ref.name",
        cap: 256,
        message: |v| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "completion/complete",
            "params": {"ref": {"type": "ref/prompt", "name": v}, "argument": {"name": "a", "value": ""}}})
        },
    },
    Field {
        field: "params.taskId",
        cap: 256,
        message: |v| json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": v}}),
    },
];

/// Every string an event keeps, with its key.
fn strings(value: &Value, at: &str, out: &mut Vec<(String, usize)>) {
    match value {
        Value::String(s) => out.push((at.to_owned(), s.len())),
        Value::Array(items) => items.iter().for_each(|v| strings(v, at, out)),
        Value::Object(map) => map
            .iter()
            .for_each(|(k, v)| strings(v, &format!("{at}/{k}"), out)),
        _ => {}
    }
}

async fn newest_event(client: &reqwest::Client, admin: &str, after: u64) -> Value {
    for _ in 0..200 {
        let events: Value = client
            .get(format!("{admin}/api/events"))
            .send()
            .await
            .expect("events")
            .text()
            .await
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .expect("JSON");
        let newest = events["events"][0].clone();
        if newest["id"].as_u64().is_some_and(|id| id > after) {
            return newest;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no new event on /api/events");
}

/// Any identifier longer than its cap, of any characters, in any field, gets
/// the same refusal (HTTP 400, -32602, `identifier_too_long`, the field and
/// cap named, the value never echoed), reaches nothing upstream, and leaves
/// an event of bounded strings in the dashboard ring and the audit store.
#[test]
fn any_overlong_identifier_is_refused_alike_and_kept_bounded() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("audit.db");
    let (upstream, gateway) = runtime.block_on(async {
        let upstream = InProcess::demo().await;
        let rest = format!(
            "pinning = \"off\"\n{}{}[audit]\ndatabase = {:?}\narguments = \"full\"\n",
            clients(),
            allow_all(),
            db.display().to_string()
        );
        let gateway = TestGateway::start(&[("demo", &upstream.url)], &rest).await;
        (upstream, gateway)
    });
    let (url, admin) = (gateway.url("demo"), gateway.admin_url());
    let client = http();
    let last = std::cell::Cell::new(0u64);
    let cases = 40;
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        0..FIELDS.len(),
        1usize..20_000,
        prop::sample::select(vec!["a", "é", "𝄞", "\u{202e}", "\u{0}", "%2F"]),
    );
    runner
        .run(&strategy, |(index, extra, unit)| {
            let f = &FIELDS[index];
            // Past the cap by at least one byte, whatever the characters.
            let value = unit.repeat(f.cap / unit.len() + extra);
            let body = (f.message)(&value).to_string();
            runtime.block_on(async {
                let r =
                    raw_post(&url, &[("authorization", &format!("Bearer {ALICE}"))], body).await;
                prop_assert_eq!(
                    r.status,
                    400,
                    "{}: {}",
                    f.field,
                    &r.text[..r.text.len().min(300)]
                );
                let error = &r.body["error"];
                prop_assert_eq!(error["code"].as_i64(), Some(-32602));
                prop_assert_eq!(error["data"]["code"].as_str(), Some("identifier_too_long"));
                prop_assert_eq!(error["data"]["field"].as_str(), Some(f.field));
                prop_assert_eq!(error["data"]["limit"].as_u64(), Some(f.cap as u64));
                prop_assert!(
                    r.text.len() < 1024,
                    "the value is not echoed: {} bytes",
                    r.text.len()
                );
                let event = newest_event(&client, &admin, last.get()).await;
                last.set(event["id"].as_u64().unwrap_or(0));
                prop_assert_eq!(event["decision"].as_str(), Some("identifier_too_long"));
                let mut kept = Vec::new();
                strings(&event, "", &mut kept);
                for (key, len) in kept {
                    prop_assert!(len <= 256, "the event keeps {} bytes at {}", len, key);
                }
                Ok(())
            })
        })
        .expect("every overlong identifier is refused alike");
    runtime.block_on(gateway.stop());
    assert_eq!(upstream.hits(), 0, "nothing reached the upstream");
    let conn = rusqlite::Connection::open(&db).expect("audit store");
    let mut q = conn
        .prepare("SELECT method, tool, client, decision, violations FROM events")
        .expect("query");
    type Row = (String, Option<String>, Option<String>, String, String);
    let rows: Vec<Row> = q
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows read");
    assert_eq!(rows.len(), cases as usize, "one row per request");
    for (method, tool, client_name, decision, violations) in rows {
        assert_eq!(decision, "identifier_too_long");
        assert!(
            method.len() <= 256,
            "a stored method of {} bytes",
            method.len()
        );
        assert!(tool.map_or(0, |t| t.len()) <= 256);
        assert_eq!(client_name.as_deref(), Some("alice"));
        assert_eq!(violations, "[]");
    }
    runtime.block_on(async { drop(upstream) });
}

/// The log keeps no more of an identifier than the audit does.
///
/// The log read is this thread's only (`support::log`): every test of the
/// suite shares this process, and their logs must not land here. On a
/// current-thread runtime every task of the gateway started here runs on this
/// thread.
#[tokio::test]
async fn the_log_keeps_identifiers_bounded() {
    let captured = support::log::capture();
    let upstream = InProcess::demo().await;
    let rest = format!("pinning = \"off\"\n{}{}", clients(), allow_all());
    let gateway = TestGateway::start(&[("logged", &upstream.url)], &rest).await;
    let url = gateway.url("logged");
    let huge = "m".repeat(1 << 19);
    let auth = format!("Bearer {ALICE}");
    for body in [
        json!({"jsonrpc": "2.0", "id": 1, "method": huge}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": huge, "arguments": {}}}),
        json!({"jsonrpc": "2.0", "id": huge, "method": "tools/list"}),
    ] {
        let r = raw_post(&url, &[("authorization", &auth)], body.to_string()).await;
        assert_eq!(r.status, 400, "{}", &r.text[..r.text.len().min(300)]);
    }
    gateway.stop().await;
    let log = captured.text();
    let refusals = log
        .lines()
        .filter(|l| l.contains("identifier_too_long") && l.contains("\"logged\""))
        .count();
    assert_eq!(refusals, 3, "each refusal is logged");
    for line in log.lines() {
        assert!(line.len() < 2048, "a log line of {} bytes", line.len());
    }
}

// === A flood of the worst inputs ===

/// While clients flood the gateway with the most expensive names they can
/// send (over the cap, just under it, near misses of real tools), another
/// client's calls and `/healthz` are answered within their normal deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_worst_case_names_leaves_others_served() {
    let upstream = InProcess::demo().await;
    let rest = format!("pinning = \"off\"\n{}{}", clients(), allow_all());
    let gateway = TestGateway::start(&[("demo", &upstream.url)], &rest).await;
    let url = gateway.url("demo");
    let bodies: Vec<String> = vec![
        // Over the cap: refused at the edge, before any suggestion is computed.
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "ech".repeat(300_000), "arguments": {}}})
        .to_string(),
        // Just under the cap: the suggestion's work is bounded.
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "e".repeat(256), "arguments": {}}})
        .to_string(),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "ecoh", "arguments": {}}})
        .to_string(),
        json!({"jsonrpc": "2.0", "id": 1, "method": "m".repeat(1_000_000)}).to_string(),
    ];
    let flood: Vec<_> = (0..8)
        .map(|n| {
            let (url, bodies) = (url.clone(), bodies.clone());
            tokio::spawn(async move {
                let auth = format!("Bearer {ALICE}");
                let mut answered = 0;
                for i in 0..25 {
                    let body = bodies[(n + i) % bodies.len()].clone();
                    let r = raw_post(&url, &[("authorization", &auth)], body).await;
                    assert!(r.status == 400 || r.status == 200, "{}", r.status);
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let client = http();
    let headers = modern_call_headers(BOB, "echo");
    let headers = borrow(&headers);
    for i in 0..20 {
        let call = raw_post(
            &url,
            &headers,
            modern_call(i, "echo", json!({"text": "still here"})),
        );
        let r = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call is answered within the client's deadline");
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(
            r.body["result"]["_meta"]["portcullis/error"].is_null(),
            "{}",
            r.text
        );
        let health = client
            .get(format!("{}/healthz", gateway.admin_url()))
            .send()
            .await
            .expect("/healthz answers within its deadline");
        assert_eq!(health.status().as_u16(), 200);
    }
    for task in flood {
        assert_eq!(task.await.expect("flood task"), 25);
    }
    gateway.stop().await;
}
