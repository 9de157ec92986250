//! The reliability battery, the client's side: bad input not covered by `bad_input.rs`
//! (bad messages, bad tool calls, duplicate keys, transport mistakes) gets one refusal and no
//! upstream call, odd but valid calls run once as policy saw them, and slow or stuck clients
//! (slowloris headers, a client that never reads, a body one byte at a time, a silent HTTP/2
//! greeting) are cut while others are served. The invariants checked after each story are
//! the battery's (`battery.rs`).

use crate::battery::{Bench, assert_no_canary, assert_one_answer, code, response, responses, text};
use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{ALICE, borrow, modern_call, modern_call_headers, raw_post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Each bad body: its expected HTTP status; none reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_messages_get_one_refusal_and_no_upstream_call() {
    let bench = Bench::start().await;
    let call = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{params}}}"#)
    };
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "BOM before the JSON",
            format!("\u{feff}{}", call(r#"{"name":"python_opaque"}"#)).into_bytes(),
            400,
        ),
        (
            "invalid UTF-8",
            [b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/\xff\xfe\"}".as_slice()].concat(),
            400,
        ),
        (
            "lone surrogate escape",
            call(r#"{"name":"python_opaque","arguments":{"x":"\ud800"}}"#).into_bytes(),
            400,
        ),
        (
            "missing jsonrpc",
            br#"{"id":5,"method":"tools/list"}"#.to_vec(),
            400,
        ),
        (
            "id null",
            br#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#.to_vec(),
            400,
        ),
        (
            "id object",
            br#"{"jsonrpc":"2.0","id":{},"method":"tools/list"}"#.to_vec(),
            400,
        ),
        (
            "id 1e400",
            br#"{"jsonrpc":"2.0","id":1e400,"method":"tools/list"}"#.to_vec(),
            400,
        ),
        (
            "method not a string",
            br#"{"jsonrpc":"2.0","id":5,"method":["tools/call"]}"#.to_vec(),
            400,
        ),
        (
            "params an array",
            br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":["python_opaque"]}"#
                .to_vec(),
            400,
        ),
        (
            "NUL byte outside strings",
            b"{\"jsonrpc\":\"2.0\",\0}".to_vec(),
            400,
        ),
    ];
    let total = cases.len();
    for (what, body, status) in cases {
        let r = bench.post(&[], body).await;
        assert_eq!(r.status, status, "{what}: {}", r.text);
        assert_eq!(responses(&r.text).len(), 1, "{what}: {}", r.text);
        assert!(r.body.get("error").is_some(), "{what}: {}", r.text);
    }
    assert_eq!(total, 10);
    bench.finish().await;
}

/// `tools/call` requests that parse but name no callable tool, or break its
/// schema: each gets one `isError` (or JSON-RPC error) and the upstream sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_calls_are_refused_before_the_upstream() {
    let bench = Bench::start().await;
    let long = "n".repeat(10 * 1024);
    let cases: Vec<(&str, &str, Value)> = vec![
        ("no name", "", json!({"x": "a"})),
        ("a 10 KB name", &long, json!({})),
        (
            "a name with control characters",
            "python\u{1b}[2J_opaque\u{0}",
            json!({}),
        ),
        ("the forbidden canary", "canary_forbidden", json!({})),
        ("wrong argument type", "python_opaque", json!({"x": 5})),
    ];
    for (what, name, args) in cases {
        let body = if name.is_empty() {
            json!({"jsonrpc":"2.0","id":6,"method":"tools/call",
                   "params":{"arguments": args, "_meta": support::modern_meta()}})
            .to_string()
        } else {
            modern_call(6, name, args)
        };
        let mut headers = modern_call_headers(ALICE, "x");
        headers.pop();
        if !name.is_empty() && name.is_ascii() && !name.contains(['\u{0}', '\u{1b}']) {
            headers.push(("mcp-name", name.to_owned()));
        } else if !name.is_empty() {
            use base64::Engine as _;
            let encoded = base64::engine::general_purpose::STANDARD.encode(name);
            headers.push(("mcp-name", format!("=?base64?{encoded}?=")));
        }
        let r = raw_post(&bench.gateway.url("s"), &borrow(&headers), body).await;
        assert_one_answer(&r.text, &json!(6));
        assert_no_canary("client", &r.text);
        let answer = response(&r.text);
        let refused = answer.get("error").is_some() || answer["result"]["isError"] == true;
        assert!(refused, "{what}: {}", r.text);
    }
    bench.finish().await;
}

/// Messages that are valid but odd go through, once, with their oddity intact
/// or removed — never a second call, never the other key's tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_but_valid_calls_run_once_as_policy_saw_them() {
    let mut bench = Bench::start().await;
    // `__proto__` keys and NUL characters inside strings are data.
    let r = bench
        .call(
            "python_opaque",
            json!({"__proto__": {"admin": true}, "x": "nul\u{0}inside"}),
        )
        .await;
    assert_eq!(code(&r), "upstream_tool_failed", "{r}");
    // The same id reused by two concurrent requests: each gets its own answer.
    let url = bench.gateway.url("s");
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let headers = modern_call_headers(ALICE, "chunked_sse");
                raw_post(
                    &url,
                    &borrow(&headers),
                    modern_call(9, "chunked_sse", json!({})),
                )
                .await
            })
        })
        .collect();
    for twin in twins {
        let r = twin.await.expect("twin");
        assert_one_answer(&r.text, &json!(9));
        assert_eq!(
            text(&response(&r.text)["result"]),
            "chunked ok",
            "{}",
            r.text
        );
        bench.allowed += 1;
    }
    bench.finish().await;
}

/// Duplicate keys: the body is forwarded as it came, and a server whose parser
/// keeps the first key (the gateway's keeps the last) would run a tool the
/// rules never saw. Such a body is refused, and neither name reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_never_smuggle_a_name_past_policy() {
    let bench = Bench::start().await;
    for (first, last) in [
        ("canary_forbidden", "python_opaque"),
        ("python_opaque", "canary_forbidden"),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"name":"{first}","name":"{last}","arguments":{{}},"_meta":{}}}}}"#,
            support::modern_meta()
        );
        let headers = modern_call_headers(ALICE, last);
        let r = raw_post(&bench.gateway.url("s"), &borrow(&headers), body).await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert_eq!(r.body["error"]["code"], -32600, "{}", r.text);
        assert_no_canary("client", &r.text);
    }
    assert!(
        !bench.upstream.received("canary_forbidden"),
        "the forbidden tool's name reached the upstream"
    );
    bench.finish().await;
}

/// Transport-level refusals: wrong Content-Type, an Accept without
/// `text/event-stream`, an unknown method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_mistakes_get_one_refusal() {
    let bench = Bench::start().await;
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
    let client = support::http();
    let send = |content_type: &'static str, accept: &'static str, body: &'static str| {
        client
            .post(bench.gateway.url("s"))
            .header("authorization", format!("Bearer {ALICE}"))
            .header("content-type", content_type)
            .header("accept", accept)
            .body(body)
            .send()
    };
    // Either refused, or read as the JSON it is: one answer either way.
    for (content_type, accept) in [
        ("text/plain", "application/json, text/event-stream"),
        ("application/json", "application/json"),
        ("application/json", "text/html"),
    ] {
        let r = send(content_type, accept, list).await.expect("sent");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert!(matches!(status, 200 | 406 | 415), "{status}: {text}");
        if status == 200 {
            assert_one_answer(&text, &json!(3));
        }
        assert_no_canary("client", &text);
    }
    let r = bench
        .post(&[], r#"{"jsonrpc":"2.0","id":3,"method":"no/such/method"}"#)
        .await;
    assert_one_answer(&r.text, &json!(3));
    assert!(response(&r.text).get("error").is_some(), "{}", r.text);
    // Our keep-alive connection is not the gateway's leak.
    drop(client);
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_headers_are_cut_and_others_are_served() {
    let mut bench = Bench::start().await;
    let mut slow = TcpStream::connect(&bench.gateway.addr)
        .await
        .expect("connect");
    let head = b"POST /mcp/s HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa";
    // One byte at a time; a normal client meanwhile gets its answer.
    for (k, byte) in head.iter().enumerate() {
        if slow.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if k == 10 {
            let ok = bench.call("chunked_sse", json!({})).await;
            assert_eq!(text(&ok), "chunked ok");
        }
    }
    // Still holding our end: the gateway's descriptor for it must go.
    assert_connection_dropped(&bench, "slowloris").await;
    drop(slow);
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_and_others_are_served() {
    let mut bench = Bench::start().await;
    // Pipelined tools/list requests on one connection whose replies are never
    // read: once the socket buffers are full the gateway's writes stall.
    let mut stuck = TcpStream::connect(&bench.gateway.addr)
        .await
        .expect("connect");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let request = format!(
        "POST /mcp/s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    for _ in 0..5_000 {
        let wrote =
            tokio::time::timeout(Duration::from_secs(3), stuck.write_all(request.as_bytes())).await;
        if !matches!(wrote, Ok(Ok(()))) {
            break;
        }
    }
    let ok = bench.call("chunked_sse", json!({})).await;
    assert_eq!(text(&ok), "chunked ok");
    assert_connection_dropped(&bench, "never-reading client").await;
    drop(stuck);
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_one_byte_at_a_time_is_refused_and_others_are_served() {
    let mut bench = Bench::start().await;
    let mut slow = TcpStream::connect(&bench.gateway.addr)
        .await
        .expect("connect");
    let body = r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#;
    let head = format!(
        "POST /mcp/s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.expect("head");
    // Half the body, one byte at a time; a normal client meanwhile gets its answer.
    for (k, byte) in body.as_bytes()[..body.len() / 2].iter().enumerate() {
        if slow.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if k == 3 {
            let ok = bench.call("chunked_sse", json!({})).await;
            assert_eq!(text(&ok), "chunked ok");
        }
    }
    // The gateway gave up on the body: a 400 with the request's deadline.
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = slow.read(&mut buf).await {
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&reply).contains("\r\n\r\n{") {
                break;
            }
        }
    })
    .await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("did not arrive within 3 s"), "{reply}");
    drop(slow);
    bench.finish().await;
}

/// Connections that never finish their greeting: part of the HTTP/2 preface
/// (hyper waits for the rest to choose a protocol), or the whole preface and
/// then silence (no SETTINGS, no answer to pings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_http2_greeting_is_cut_and_others_are_served() {
    let mut bench = Bench::start().await;
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut partial = TcpStream::connect(&bench.gateway.addr)
        .await
        .expect("connect");
    partial.write_all(&preface[..10]).await.expect("write");
    let mut whole = TcpStream::connect(&bench.gateway.addr)
        .await
        .expect("connect");
    whole.write_all(preface).await.expect("write");
    let ok = bench.call("chunked_sse", json!({})).await;
    assert_eq!(text(&ok), "chunked ok");
    assert_connection_dropped(&bench, "silent HTTP/2").await;
    drop((partial, whole));
    bench.finish().await;
}

/// While the test still holds its end open, the gateway closes its own:
/// its descriptors come back to the baseline (bounded polling).
async fn assert_connection_dropped(bench: &Bench, who: &str) {
    let fds = bench.gateway.settle_fds(bench.fds, 200).await;
    assert!(
        fds <= bench.fds,
        "the gateway still holds the {who} connection: {fds} descriptors, baseline {}",
        bench.fds
    );
}
