//! The reliability battery: every bad input a client can send and every fault
//! an upstream can inject, run against the real `portcullis` binary, with the
//! invariants checked after each story:
//!
//! - exactly one response per request id, never one for another id;
//! - the upstream runs exactly the calls policy allowed (they are counted), and
//!   the `canary_forbidden` tool never runs;
//! - no canary secret reaches a client byte or a line the process writes (and
//!   the log scanned holds the requests' own lines: an empty log fails);
//! - resident memory stays within a generous bound, open file descriptors come
//!   back to their baseline, and the process is still alive.
//!
//! The faults come from `tests/support/misbehaving.rs`; the process under
//! observation from `tests/support/process.rs`. RELIABILITY.md lists the cases. This file
//! holds the bench and the upstream faults; the client's side: `battery_clients.rs`.

use crate::support;
use support::Config;

use std::time::Duration;

use serde_json::{Value, json};
use support::misbehaving::{CANARY_FRAGMENTS, CARD_PATTERN, HUGE, Misbehaving};
use support::process::Observed;
use support::{ALICE, Raw, borrow, modern_call, modern_call_headers, raw_post};

/// The reply cap of the battery's gateway.
const MAX_RESPONSE: u64 = 1 << 20;
/// A generous memory bound: far below a buffered 1 GiB reply, far above any
/// honest working set of these stories.
const RSS_GROWTH_LIMIT_KIB: u64 = 96 * 1024;

fn config(upstream: &str) -> String {
    Config::new()
        .gateway("max_response_bytes", MAX_RESPONSE as i64)
        .gateway("client_timeout", "3s")
        .server("s", upstream)
        .set("timeout", "2s")
        .set("connect_timeout", "1s")
        .set("pinning", "warn")
        .clients()
        .allow(&["*"])
        .deny(&["canary_*"])
        .raw(&format!(
            "[[sanitize.patterns]]\nname = \"card\"\nregex = '{CARD_PATTERN}'\n"
        ))
        .memory_stores()
        .render()
}

/// The misbehaving upstream, the gateway process in front of it, and the
/// baselines the story must come back to.
pub(crate) struct Bench {
    pub(crate) upstream: Misbehaving,
    pub(crate) gateway: Observed,
    /// Calls policy let through so far: the upstream must have seen exactly these.
    pub(crate) allowed: usize,
    pub(crate) fds: usize,
    pub(crate) rss_kib: u64,
    pub(crate) next_id: u64,
}

impl Bench {
    /// Starts both, makes one good call (so the tool list is cached), and
    /// takes the baselines.
    pub(crate) async fn start() -> Self {
        support::init();
        let upstream = Misbehaving::start().await;
        let gateway = Observed::start(&config(&upstream.url)).await;
        let mut bench = Self {
            upstream,
            gateway,
            allowed: 0,
            fds: 0,
            rss_kib: 0,
            next_id: 100,
        };
        let warm = bench.call("python_opaque", json!({})).await;
        assert_eq!(warm["isError"], true, "{warm}");
        // The warm-up client's connection closes on its own time: take the
        // lowest of a few samples.
        bench.fds = bench.gateway.quiet_fds(10).await;
        bench.rss_kib = bench.gateway.rss_kib();
        bench
    }

    /// A 2026-07-28 `tools/call` the rules allow; returns its result after
    /// checking it is the one answer to its id.
    pub(crate) async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.allowed += 1;
        let r = self.send(tool, args).await;
        assert_eq!(r.status, 200, "{tool}: {}", r.text);
        response(&r.text)["result"].clone()
    }

    /// Sends a call and checks the single-answer invariant, without counting it as allowed.
    pub(crate) async fn send(&mut self, tool: &str, args: Value) -> Raw {
        self.next_id += 1;
        let id = self.next_id;
        let headers = modern_call_headers(ALICE, tool);
        let r = raw_post(
            &self.gateway.url("s"),
            &borrow(&headers),
            modern_call(id, tool, args),
        )
        .await;
        assert_one_answer(&r.text, &json!(id));
        assert_no_canary("client", &r.text);
        r
    }

    /// Raw POST with alice's key (2025-11-25 era unless the headers say otherwise).
    pub(crate) async fn post(
        &self,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Raw {
        let mut all = vec![("authorization", "Bearer alice-key")];
        all.extend_from_slice(headers);
        let r = raw_post(&self.gateway.url("s"), &all, body).await;
        assert_no_canary("client", &r.text);
        r
    }

    /// The invariants every story ends with.
    pub(crate) async fn finish(mut self) {
        assert!(self.gateway.alive(), "the gateway process died");
        assert_eq!(
            self.upstream.calls(),
            self.allowed,
            "upstream calls must equal the calls policy allowed: {:?}",
            self.upstream.ran()
        );
        assert!(
            !self.upstream.ran().iter().any(|t| t == "canary_forbidden"),
            "the forbidden canary tool ran"
        );
        let fds = self.gateway.settle_fds(self.fds, 200).await;
        assert!(
            fds <= self.fds,
            "open descriptors {fds}, baseline {}",
            self.fds
        );
        let growth = self.gateway.peak_rss_kib().saturating_sub(self.rss_kib);
        eprintln!(
            "RSS {} KiB at baseline, peak growth {growth} KiB; descriptors {fds} (baseline {})",
            self.rss_kib, self.fds
        );
        assert!(
            growth < RSS_GROWTH_LIMIT_KIB,
            "peak RSS grew by {growth} KiB (limit {RSS_GROWTH_LIMIT_KIB} KiB)"
        );
        // A log that is empty (the process logged nothing, or its output was
        // not captured) would pass the canary scan without proving anything:
        // the scan counts only over a log that holds the requests' own lines.
        let log = self.gateway.output();
        let requests = log
            .iter()
            .filter(|l| l.contains("\"message\":\"request\""))
            .count();
        assert!(
            requests > 0,
            "the gateway's log holds no request line ({} lines), so it cannot show that no canary reached it",
            log.len()
        );
        for line in &log {
            assert_no_canary("the gateway's log", line);
        }
        self.gateway.stop().await;
    }
}

/// JSON-RPC responses (not notifications) in a JSON or SSE body; an SSE
/// event's `data` lines are joined as the SSE standard says.
pub(crate) fn responses(text: &str) -> Vec<Value> {
    let messages: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => text
            .replace("\r\n", "\n")
            .split("\n\n")
            .filter_map(|event| {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                serde_json::from_str(&data.join("\n")).ok()
            })
            .collect(),
    };
    messages
        .into_iter()
        .filter(|m| m.get("result").is_some() || m.get("error").is_some())
        .collect()
}

/// The one response in a JSON or SSE body.
pub(crate) fn response(text: &str) -> Value {
    responses(text).pop().unwrap_or(Value::Null)
}

/// Exactly one response, and it answers `id`.
pub(crate) fn assert_one_answer(text: &str, id: &Value) {
    let found = responses(text);
    assert_eq!(found.len(), 1, "one response expected: {text}");
    assert_eq!(
        &found[0]["id"], id,
        "the response answers another id: {text}"
    );
}

pub(crate) fn assert_no_canary(place: &str, text: &str) {
    for canary in CANARY_FRAGMENTS {
        assert!(
            !text.contains(canary),
            "canary {canary:?} reached {place}: {text}"
        );
    }
}

pub(crate) fn code(result: &Value) -> &str {
    result["_meta"]["portcullis/error"]["code"]
        .as_str()
        .unwrap_or_default()
}

pub(crate) fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Calls `tool`, expects an `isError` result with one of the `expected` codes.
async fn fails_with(tool: &str, expected: &[&str]) {
    let mut bench = Bench::start().await;
    let result = bench.call(tool, json!({})).await;
    assert_eq!(result["isError"], true, "{tool}: {result}");
    assert!(expected.contains(&code(&result)), "{tool}: {result}");
    bench.finish().await;
}

/// Calls `tool`, expects a plain result whose text is `expected`.
async fn answers(tool: &str, expected: &str) {
    let mut bench = Bench::start().await;
    let result = bench.call(tool, json!({})).await;
    assert_ne!(result["isError"], true, "{tool}: {result}");
    assert_eq!(text(&result), expected, "{tool}: {result}");
    bench.finish().await;
}

// === Upstream faults ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_in_the_middle_of_an_event() {
    fails_with(
        "crash_mid_event",
        &["upstream_unavailable", "upstream_protocol_error"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_after_a_progress_event() {
    fails_with(
        "reset",
        &["upstream_unavailable", "upstream_protocol_error"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_hang_hits_the_deadline_and_the_connection_is_dropped() {
    let mut bench = Bench::start().await;
    let result = bench.call("hang", json!({})).await;
    assert_eq!(code(&result), "upstream_timeout", "{result}");
    // The gateway lets go of the upstream connection: the call is cancelled.
    let mut closed = bench.upstream.hangs_closed();
    for _ in 0..100 {
        if closed == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        closed = bench.upstream.hangs_closed();
    }
    assert_eq!(closed, 1, "the hung upstream connection was never closed");
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_dripping_one_byte_a_second_hits_the_deadline() {
    fails_with("drip", &["upstream_timeout"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sse_in_odd_chunks_decodes_correctly() {
    answers("chunked_sse", "chunked ok").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sse_with_a_byte_order_mark_decodes_correctly() {
    answers("sse_bom", "bom ok").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_json_for_another_id_is_not_forwarded() {
    fails_with("wrong_id", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sse_for_another_id_is_not_forwarded() {
    fails_with("sse_wrong_id", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_response_without_id_is_not_forwarded() {
    fails_with("no_id", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_response_with_result_and_error_is_refused() {
    fails_with(
        "both_result_error",
        &["upstream_error", "upstream_protocol_error"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_result_that_is_not_an_object_is_refused() {
    fails_with("result_not_object", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_is_error_that_is_not_a_bool_is_refused() {
    fails_with("is_error_not_bool", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reply_with_an_unknown_content_type_is_refused() {
    fails_with("text_plain", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_garbage_json_is_refused() {
    fails_with("garbage_json", &["upstream_protocol_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_html_502_is_unavailable_and_leaks_nothing() {
    fails_with("html_502", &["upstream_unavailable"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_401_is_not_the_clients_401_and_leaks_nothing() {
    fails_with(
        "html_401",
        &["upstream_unavailable", "upstream_protocol_error"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_text_with_secrets_leaks_nothing() {
    fails_with("leaky_error", &["upstream_error"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_result_and_log_with_secrets_are_redacted() {
    let mut bench = Bench::start().await;
    let result = bench.call("leaky", json!({})).await;
    assert_ne!(result["isError"], true, "{result}");
    let text = text(&result);
    for kind in [
        "aws-access-key-id",
        "github-token",
        "private-key",
        "jwt",
        "card",
    ] {
        assert!(
            text.contains(&format!("[REDACTED:{kind}]")),
            "{kind}: {text}"
        );
    }
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_session_id_and_cookies_are_not_relayed() {
    let mut bench = Bench::start().await;
    bench.allowed += 1;
    let r = bench.send("own_session", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(text(&response(&r.text)["result"]), "with a session");
    assert!(r.headers.get("set-cookie").is_none(), "{:?}", r.headers);
    assert!(r.headers.get("mcp-session-id").is_none(), "{:?}", r.headers);
    for (name, value) in &r.headers {
        assert_no_canary(name.as_str(), value.to_str().unwrap_or_default());
    }
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_json_reply_of_one_gib_is_cut_at_the_cap() {
    huge("huge_json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sse_event_of_one_gib_is_cut_at_the_cap() {
    huge("huge_sse_event").await;
}

async fn huge(tool: &str) {
    let mut bench = Bench::start().await;
    let result = bench.call(tool, json!({})).await;
    // Over the cap; or, on a machine too loaded to move 1 MiB within the
    // upstream's 2 s timeout, the deadline first. Either way one bounded answer.
    assert!(
        ["upstream_protocol_error", "upstream_timeout"].contains(&code(&result)),
        "{result}"
    );
    // The gateway stopped reading soon after the cap: the upstream could
    // write only what socket buffers hold past it, nowhere near 1 GiB.
    let sent = bench.upstream.huge_sent();
    eprintln!("{tool}: the upstream wrote {sent} bytes of its {HUGE}");
    assert!(sent < 64 * MAX_RESPONSE, "the upstream wrote {sent} bytes");
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_notification_flood_still_ends_with_one_answer() {
    let mut bench = Bench::start().await;
    let r = bench.send("flood", json!({})).await;
    bench.allowed += 1;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(text(&response(&r.text)["result"]), "flooded", "{}", r.text);
    let forwarded = r.text.matches("data:").count().saturating_sub(1);
    eprintln!("flood: {forwarded} of 10000 notifications reached the client");
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_faulty_calls_each_get_their_own_answer() {
    let mut bench = Bench::start().await;
    const TOOLS: [&str; 6] = [
        "chunked_sse",
        "sse_wrong_id",
        "python_opaque",
        "wrong_id",
        "split_escape",
        "truncated_sse",
    ];
    let url = bench.gateway.url("s");
    let mut calls = Vec::new();
    for round in 0..4u64 {
        for (k, tool) in TOOLS.iter().enumerate() {
            let id = 1000 + round * 10 + k as u64;
            let url = url.clone();
            calls.push(tokio::spawn(async move {
                let headers = modern_call_headers(ALICE, tool);
                let r = raw_post(&url, &borrow(&headers), modern_call(id, tool, json!({}))).await;
                (id, r.text)
            }));
        }
    }
    for call in calls {
        let (id, text) = call.await.expect("call task");
        assert_one_answer(&text, &json!(id));
        assert_no_canary("client", &text);
        bench.allowed += 1;
    }
    bench.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_call_releases_the_upstream_call() {
    let mut bench = Bench::start().await;
    let headers = modern_call_headers(ALICE, "hang");
    let body = modern_call(7, "hang", json!({}));
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let mut request = client
        .post(bench.gateway.url("s"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in &headers {
        request = request.header(*k, v);
    }
    let gone = request.body(body).send().await;
    assert!(gone.is_err(), "the client gave up before any answer");
    bench.allowed += 1;
    let mut closed = bench.upstream.hangs_closed();
    for _ in 0..100 {
        if closed == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        closed = bench.upstream.hangs_closed();
    }
    assert_eq!(closed, 1, "the upstream call outlived its client");
    // Others are served as before.
    let ok = bench.call("chunked_sse", json!({})).await;
    assert_eq!(text(&ok), "chunked ok");
    bench.finish().await;
}
