//! The gateway sends a failed request again by itself only when that is safe:
//! always when it never reached the server, and, for a tool the operator marks
//! idempotent, once after the server said it failed for now. A restart of the
//! server is invisible to such a tool's client; a write that may have run is
//! never sent twice; invalid params are never retried; the retry budget keeps
//! an outage from being multiplied.

use crate::support;
use support::misbehaving::Misbehaving;
use support::tiers::{self, Tier};
use support::{Config, Peer, PeerServer, TestGateway};

use serde_json::{Value, json};

/// Server `s` at `url` with `retry` as its retry table.
fn config(url: &str, retry: &str) -> String {
    Config::new()
        .server("s", url)
        .set("timeout", "30s")
        .set("connect_timeout", "1s")
        .set_raw("retry", retry)
        .clients()
        .allow_all()
        .render()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

fn advice(result: &Value) -> &str {
    result["_meta"]["portcullis/error"]["retry"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_the_server_is_invisible_to_the_client_of_an_idempotent_tool() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut peer = PeerServer::start(Peer::PythonStateless).await;
    let gateway = TestGateway::start_raw(&config(
        &peer.url,
        r#"{ attempts = 20, idempotent_tools = ["ech?"] }"#,
    ))
    .await;
    assert_eq!(
        text(&gateway.call("s", "echo", json!({"text": "before"})).await),
        "before"
    );
    // The server goes away; a call arrives while it is down; it comes back.
    peer.kill().await;
    let url = gateway.url("s");
    let during = tokio::spawn(async move {
        support::tools_call(&url, support::ALICE, "echo", json!({"text": "during"}), &[])
            .await
            .result()
    });
    peer.restart().await;
    let result = during.await.expect("call");
    assert_ne!(result["isError"], true, "{result}");
    assert_eq!(text(&result), "during", "{result}");
    // Each call ran once on the server.
    assert_eq!(peer.ran(), ["echo", "echo"]);
    gateway.stop().await;
    peer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_may_have_run_is_not_sent_again() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut peer = PeerServer::start(Peer::PythonStateless).await;
    let gateway = TestGateway::start_raw(&config(
        &peer.url,
        r#"{ attempts = 20, idempotent_tools = ["echo"] }"#,
    ))
    .await;
    let url = gateway.url("s");
    let call = tokio::spawn(async move {
        support::tools_call(&url, support::ALICE, "hang", json!({"seconds": 20}), &[])
            .await
            .result()
    });
    // Once the server is running the tool, it dies, and comes back.
    while !peer.ran().contains(&"hang".to_owned()) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    peer.restart().await;
    let result = call.await.expect("call");
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(advice(&result), "check_first", "{result}");
    // The server's own record: it ran once, and was not asked again.
    assert_eq!(peer.ran(), ["hang"]);
    gateway.stop().await;
    peer.stop().await;
}

/// One failing call and how many times the gateway sends it.
struct Sends {
    name: &'static str,
    /// Server `s`'s retry table.
    retry: &'static str,
    /// A tool of the scripted server, each failing its own way.
    tool: &'static str,
    /// How many requests of the call reach the server.
    sends: usize,
}

const MARKED: &str =
    r#"{ attempts = 5, idempotent_tools = ["html_502", "rpc_internal", "rpc_invalid_params"] }"#;
const TRUSTED: &str = "{ trust_annotations = true }";

/// Which failures are sent again (old tests named above their cases).
const SENDS: &[Sends] = &[
    // a_bad_gateway_or_internal_error_is_retried_once_only_for_an_idempotent_tool
    Sends {
        name: "a bad gateway of a tool marked idempotent: sent twice, then the failure is the answer",
        retry: MARKED,
        tool: "html_502",
        sends: 2,
    },
    Sends {
        name: "an internal error of a tool marked idempotent: sent twice",
        retry: MARKED,
        tool: "rpc_internal",
        sends: 2,
    },
    Sends {
        name: "invalid params of a tool marked idempotent: the same arguments would fail the same way",
        retry: MARKED,
        tool: "rpc_invalid_params",
        sends: 1,
    },
    Sends {
        name: "a tool not marked, its idempotentHint not trusted by default",
        retry: MARKED,
        tool: "rpc_server_error",
        sends: 1,
    },
    // trusted_annotations_make_a_tool_idempotent
    Sends {
        name: "annotated idempotent and trusted, but -32000 is the server's own error",
        retry: TRUSTED,
        tool: "rpc_server_error",
        sends: 1,
    },
    Sends {
        name: "annotations trusted, but the tool has none",
        retry: TRUSTED,
        tool: "html_502",
        sends: 1,
    },
];

/// A failure is sent again once only when the tool is idempotent (marked,
/// or annotated with annotations trusted) and the failure is transient.
/// Each case on a gateway of its own (no breaker counts another case's
/// failures), against one scripted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_sent_again_once_only_when_the_tool_is_idempotent_and_it_is_transient() {
    let upstream = Misbehaving::start().await;
    for case in SENDS {
        let name = case.name;
        let gateway = TestGateway::start_raw(&config(&upstream.url, case.retry)).await;
        let before = upstream.calls();
        let result = gateway.call("s", case.tool, json!({})).await;
        assert_eq!(result["isError"], true, "{name}: {result}");
        assert_eq!(upstream.calls() - before, case.sends, "{name}");
        gateway.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_caps_retries_during_a_full_outage() {
    let upstream = Misbehaving::start().await;
    let gateway = TestGateway::start_raw(
        &config(
            &upstream.url,
            r#"{ budget = 0.1, idempotent_tools = ["html_502"] }"#,
        )
        // Without the breaker, which would stop the calls themselves.
        .replace(
            "[servers.s]",
            "[servers.s]\nbreaker = { failures = 0, ratio = 0 }",
        ),
    )
    .await;
    let calls = 20;
    for _ in 0..calls {
        let result = gateway.call("s", "html_502", json!({})).await;
        assert_eq!(result["isError"], true, "{result}");
    }
    // Without a budget every call would be sent twice (40). With 0.1, a
    // window retries at most 3 requests (its floor) or a tenth of them; a
    // slow run may span two windows.
    let attempts = upstream.calls();
    eprintln!(
        "full outage: {calls} calls, {attempts} attempts (budget 0.1; without it {})",
        calls * 2
    );
    assert!(attempts > calls, "some calls were retried: {attempts}");
    assert!(attempts <= calls + 6, "the budget held: {attempts}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_retry_table_is_refused_with_its_key() {
    for (retry, key) in [
        ("{ attempts = 0 }", "servers.s.retry.attempts"),
        ("{ budget = 1.5 }", "servers.s.retry.budget"),
        ("{ tries = 3 }", "tries"),
    ] {
        let text = config("http://127.0.0.1:1/mcp", retry);
        let err =
            portcullis::config::load_str(&text, "portcullis.toml", &|_| None).expect_err(retry);
        assert!(err.to_string().contains(key), "{retry}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_breaker_is_refused_with_its_key() {
    for (breaker, key) in [
        ("{ ratio = 1.5 }", "servers.s.breaker.ratio"),
        ("{ window = 0 }", "servers.s.breaker.window"),
        (
            "{ window = 5, min_calls = 6 }",
            "servers.s.breaker.min_calls",
        ),
        ("{ share = 0.5 }", "share"),
    ] {
        let text = Config::new()
            .server("s", "http://127.0.0.1:1/mcp")
            .set_raw("breaker", breaker)
            .clients()
            .allow_all()
            .render();
        let err =
            portcullis::config::load_str(&text, "portcullis.toml", &|_| None).expect_err(breaker);
        assert!(err.to_string().contains(key), "{breaker}: {err}");
    }
}

fn code(result: &Value) -> &str {
    result["_meta"]["portcullis/error"]["code"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_answers_without_the_server_half_opens_and_closes() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut peer = PeerServer::start(Peer::PythonStateless).await;
    let other = Misbehaving::start().await;
    let text_config = Config::new()
        .server("s", &peer.url)
        .set("connect_timeout", "1s")
        .set_raw("retry", "{ attempts = 1 }")
        .set_raw("breaker", r#"{ failures = 2, cool_down = "8s" }"#)
        .server("t", &other.url)
        .clients()
        .allow_all()
        .render();
    let gateway = TestGateway::start_raw(&text_config).await;
    let echo = |text: &str| json!({"text": text});
    assert_eq!(text(&gateway.call("s", "echo", echo("up")).await), "up");
    // Two transport failures in a row open it.
    peer.kill().await;
    for _ in 0..2 {
        let result = gateway.call("s", "echo", echo("down")).await;
        assert_eq!(code(&result), "upstream_unavailable", "{result}");
    }
    // The server is back, but the breaker is open: answered at once, not sent.
    peer.restart().await;
    let result = gateway.call("s", "echo", echo("open")).await;
    assert_eq!(code(&result), "server_unavailable", "{result}");
    assert_eq!(advice(&result), "later", "{result}");
    assert!(text(&result).contains("did not run"), "{result}");
    assert!(text(&result).contains("Retry in about"), "{result}");
    assert!(text(&result).contains("still work: t"), "{result}");
    // After the cool-down one probe goes through; its success closes it.
    let mut answered = None;
    for _ in 0..100 {
        let result = gateway.call("s", "echo", echo("probe")).await;
        if code(&result) != "server_unavailable" {
            answered = Some(result);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let probe = answered.expect("a probe after the cool-down");
    assert_eq!(text(&probe), "probe", "{probe}");
    assert_eq!(
        text(&gateway.call("s", "echo", echo("closed")).await),
        "closed"
    );
    // The server ran exactly the calls that were sent: none while open.
    let ran: Vec<String> = peer
        .calls()
        .iter()
        .filter_map(|c| c["arguments"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ran, ["up", "probe", "closed"]);
    gateway.stop().await;
    peer.stop().await;
}

/// The admin listener's `path`: its status and body.
async fn admin_get(admin: &str, path: &str) -> (u16, String) {
    let r = support::http()
        .get(format!("{admin}{path}"))
        .send()
        .await
        .expect("admin answers");
    let status = r.status().as_u16();
    (status, r.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_ratio_opens_the_breaker_and_health_metrics_and_the_dashboard_show_it() {
    let upstream = Misbehaving::start().await;
    let text_config = Config::new()
        .server("s", &upstream.url)
        .set_raw("retry", "{ attempts = 1 }")
        .set_raw(
            "breaker",
            r#"{ failures = 0, ratio = 0.5, window = 6, min_calls = 6, cool_down = "1h" }"#,
        )
        .clients()
        .allow_all()
        .render();
    let gateway = TestGateway::start_raw(&text_config).await;
    let admin = gateway.admin_url();
    let health = |admin: String| async move {
        let (status, body) = admin_get(&admin, "/healthz").await;
        let body: Value = serde_json::from_str(&body).expect("JSON");
        (status, body["status"].clone(), body["breakers"].clone())
    };
    assert_eq!(health(admin.clone()).await, (200, json!("ok"), Value::Null));
    let (_, metrics) = admin_get(&admin, "/metrics").await;
    for line in [
        r#"portcullis_breaker_state{server="s",state="closed"} 1"#,
        r#"portcullis_breaker_state{server="s",state="open"} 0"#,
        r#"portcullis_breaker_opens_total{server="s"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    // A JSON-RPC -32000 (the server's own answer: up) and a 502 (a
    // failure) in turn: never two failures in a row, so only the ratio can
    // open it. The tools/list the gateway sends first is a success too.
    for tool in [
        "rpc_server_error",
        "html_502",
        "rpc_server_error",
        "html_502",
        "rpc_server_error",
    ] {
        let result = gateway.call("s", tool, json!({})).await;
        assert_ne!(code(&result), "server_unavailable", "{tool}: {result}");
    }
    assert_eq!(
        health(admin.clone()).await,
        (200, json!("ok"), Value::Null),
        "two of the last six failed: still closed"
    );
    gateway.call("s", "html_502", json!({})).await;
    // Half of the last six failed, the last one included: open.
    assert_eq!(
        health(admin.clone()).await,
        (200, json!("degraded"), json!({"s": "open"})),
        "degraded, not down"
    );
    let (_, metrics) = admin_get(&admin, "/metrics").await;
    for line in [
        r#"portcullis_breaker_state{server="s",state="closed"} 0"#,
        r#"portcullis_breaker_state{server="s",state="open"} 1"#,
        r#"portcullis_breaker_state{server="s",state="half_open"} 0"#,
        r#"portcullis_breaker_opens_total{server="s"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    let (_, overview) = admin_get(&admin, "/api/overview").await;
    let overview: Value = serde_json::from_str(&overview).expect("JSON");
    assert_eq!(
        overview["breakers"],
        json!([{"server": "s", "state": "open", "opens": 1}])
    );
    let (status, ready) = admin_get(&admin, "/readyz").await;
    let ready: Value = serde_json::from_str(&ready).expect("JSON");
    assert_eq!(
        (status, &ready["servers"]["s"]["breaker"]),
        (200, &json!("open"))
    );
    // While open the server is not asked, and the answer does not wait for
    // a timeout (measured for RELIABILITY.md, not asserted).
    let before = upstream.calls();
    let mut took = Vec::new();
    for _ in 0..50 {
        let started = std::time::Instant::now();
        let result = gateway.call("s", "rpc_server_error", json!({})).await;
        took.push(started.elapsed());
        assert_eq!(code(&result), "server_unavailable", "{result}");
    }
    assert_eq!(upstream.calls(), before);
    took.sort();
    eprintln!(
        "refused while open: p50 {:?}, p99 {:?}, max {:?} (the server's timeout: 30s)",
        took[took.len() / 2],
        took[took.len() * 99 / 100],
        took[took.len() - 1]
    );
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_try_of_a_retried_call_is_a_span_and_the_event_names_the_causes() {
    let receiver = support::otlp::Receiver::start().await;
    let upstream = Misbehaving::start().await;
    let text_config = config(
        &upstream.url,
        r#"{ attempts = 5, idempotent_tools = ["html_502"] }"#,
    ) + &format!("\n[telemetry]\notlp_endpoint = \"{}\"\n", receiver.endpoint);
    let gateway = TestGateway::start_raw(&text_config).await;
    let result = gateway.call("s", "html_502", json!({})).await;
    assert_eq!(result["isError"], true, "{result}");
    // The event, as the dashboard's API serves it.
    let admin = gateway.admin_url();
    let mut event = Value::Null;
    for _ in 0..100 {
        let (_, events) = admin_get(&admin, "/api/events?tool=html_502").await;
        let events: Value = serde_json::from_str(&events).expect("JSON");
        event = events["events"][0].clone();
        if !event.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        event["retries"],
        json!({"attempts": 2, "causes": ["http 502"]}),
        "{event}"
    );
    gateway.stop().await;
    // One forward span per try, in order (after the gateway's own tools/list,
    // sent once); the first try ended with its cause.
    let spans = receiver.spans();
    let forwards: Vec<_> = spans.iter().filter(|s| s.name == "forward").collect();
    let attempts: Vec<_> = (forwards.iter())
        .map(|s| s.attr("portcullis.attempt").unwrap_or_default())
        .collect();
    assert_eq!(attempts, ["1", "1", "2"], "{spans:#?}");
    let (first, second) = (forwards[1], forwards[2]);
    assert_eq!(
        (first.status_code, first.status_message.as_str()),
        (2, "http 502"),
        "{first:#?}"
    );
    // Both in the request's trace, under its span.
    assert_eq!(first.trace_id, second.trace_id);
    assert_eq!(first.parent_span_id, second.parent_span_id);
}

/// A probe whose client goes away before the server answers does not keep
/// the breaker open: the next call after the cool-down probes in its place,
/// and the server, back up, closes the breaker for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_probe_does_not_keep_the_breaker_open() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let mut peer = PeerServer::start(Peer::PythonJson).await;
    let text_config = Config::new()
        .server("s", &peer.url)
        .set("connect_timeout", "1s")
        .set("timeout", "60s")
        .set_raw("retry", "{ attempts = 1 }")
        .set_raw("breaker", r#"{ failures = 1, cool_down = "1s" }"#)
        .clients()
        .allow_all()
        .render();
    let gateway = TestGateway::start_raw(&text_config).await;
    let echo = |text: &str| json!({"text": text});
    // The tool list is known before the server goes: the probe is a call.
    assert_eq!(text(&gateway.call("s", "echo", echo("up")).await), "up");
    peer.kill().await;
    let result = gateway.call("s", "echo", echo("down")).await;
    assert_eq!(code(&result), "upstream_unavailable", "{result}");
    peer.restart().await;
    // The first call after the cool-down is the probe: a slow one (the
    // server answers with one JSON body, so nothing comes back before the
    // tool ends), whose client gives up and closes its connection long
    // before that.
    let url = gateway.url("s");
    let mut abandoned = false;
    for _ in 0..100 {
        let headers = support::modern_call_headers(support::ALICE, "hang");
        let mut req = support::http()
            .post(&url)
            .timeout(std::time::Duration::from_millis(1500))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (k, v) in support::borrow(&headers) {
            req = req.header(k, v);
        }
        let body = support::modern_call(1, "hang", json!({"seconds": 40}));
        match req.body(body).send().await {
            Err(e) if e.is_timeout() => {
                abandoned = true;
                break;
            }
            Ok(resp) => {
                let text = resp.text().await.unwrap_or_default();
                assert!(text.contains("server_unavailable"), "{text}");
            }
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(abandoned, "a probe was sent and abandoned");
    // Well before the abandoned call would have ended, another call probes
    // and its success closes the breaker.
    let mut answered = None;
    for _ in 0..100 {
        let result = gateway.call("s", "echo", echo("probe")).await;
        if code(&result) != "server_unavailable" {
            answered = Some(result);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let probe = answered.expect("another probe after the abandoned one");
    assert_eq!(text(&probe), "probe", "{probe}");
    gateway.stop().await;
    peer.stop().await;
}
