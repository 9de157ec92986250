//! `/metrics` on the admin listener: the text parses as Prometheus/OpenMetrics
//! exposition and counts what happened — calls by server, tool, client and
//! decision (unlisted tool names as `other`), validation failures, sanitizer
//! actions, upstream errors, latency histograms, the audit queue, build info,
//! rate-limit refusals, configuration reloads and the span exporter.

use crate::support;
use support::tools_call;
use support::{Admin, Config};

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use support::upstreams::InProcess;
use support::{ALICE, TestGateway, allow_all, clients};

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// A small parser of the text exposition format: comments, then
/// `name{label="value",...} number` lines. Panics on anything else.
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed: {line}"));
                let mut labels = BTreeMap::new();
                let mut rest = body;
                while !rest.is_empty() {
                    let (key, after) = rest
                        .split_once("=\"")
                        .unwrap_or_else(|| panic!("label: {line}"));
                    let end = after
                        .find('"')
                        .unwrap_or_else(|| panic!("label value: {line}"));
                    labels.insert(key.to_owned(), after[..end].to_owned());
                    rest = after[end + 1..].trim_start_matches(',');
                }
                (name.to_owned(), labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name: {line}"
        );
        out.push((name, labels, value));
    }
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    out
}

/// The sum of the samples of `name` whose labels include `with`.
fn value(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

async fn scrape(admin: &str) -> Vec<Sample> {
    let resp = support::http()
        .get(format!("{admin}/metrics"))
        // Needed once a gateway has an admin token; ignored otherwise.
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("scrape");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("application/openmetrics-text")
    );
    parse(&resp.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_count_what_happened() {
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start(
        &[("demo", &upstream.url), ("dead", "http://127.0.0.1:9/mcp")],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    let url = gateway.url("demo");
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "ORD-004211"}),
        &[],
    )
    .await;
    tools_call(
        &url,
        ALICE,
        "lookup_order",
        json!({"order_id": "nope"}),
        &[],
    )
    .await;
    tools_call(&url, ALICE, "lookup_order", json!({"order_id": 7}), &[]).await;
    tools_call(&url, ALICE, "invented_name_1", json!({}), &[]).await;
    tools_call(&url, ALICE, "fetch_logs", json!({}), &[]).await;
    tools_call(&url, "wrong-key", "lookup_order", json!({}), &[]).await;
    tools_call(&gateway.url("dead"), ALICE, "anything", json!({}), &[]).await;

    // Events are counted once their response has been sent to the end.
    let admin = gateway.admin_url();
    let mut samples = scrape(&admin).await;
    for _ in 0..50 {
        if value(&samples, "portcullis_request_duration_seconds_count", &[]) >= 7.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        samples = scrape(&admin).await;
    }

    let calls = "portcullis_calls_total";
    let alice = ("client", "alice");
    let demo = ("server", "demo");
    assert_eq!(
        value(
            &samples,
            calls,
            &[
                demo,
                alice,
                ("tool", "lookup_order"),
                ("decision", "forwarded")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            calls,
            &[
                demo,
                alice,
                ("tool", "lookup_order"),
                ("decision", "invalid_arguments")
            ]
        ),
        2.0
    );
    assert_eq!(
        value(
            &samples,
            calls,
            &[demo, alice, ("tool", "other"), ("decision", "unknown_tool")]
        ),
        1.0,
        "an unlisted name is counted as other"
    );
    assert!(
        !samples
            .iter()
            .any(|(_, l, _)| l.values().any(|v| v == "invented_name_1")),
        "no label value a client invented"
    );
    assert_eq!(
        value(&samples, calls, &[demo, ("decision", "unauthenticated")]),
        1.0
    );
    assert_eq!(value(&samples, calls, &[]), 7.0);
    assert_eq!(
        value(
            &samples,
            "portcullis_validation_failures_total",
            &[demo, ("tool", "lookup_order")]
        ),
        2.0
    );
    assert!(value(&samples, "portcullis_sanitizer_actions_total", &[]) > 0.0);
    assert_eq!(
        value(
            &samples,
            "portcullis_upstream_errors_total",
            &[("server", "dead"), ("kind", "upstream_unavailable")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "portcullis_request_duration_seconds_count",
            &[demo]
        ),
        6.0
    );
    assert_eq!(
        value(
            &samples,
            "portcullis_request_duration_seconds_bucket",
            &[demo, ("le", "+Inf")]
        ),
        6.0
    );
    // Forwarded: the good call and fetch_logs (plus the tool list fetched for the first call).
    assert!(
        value(
            &samples,
            "portcullis_upstream_duration_seconds_count",
            &[demo]
        ) >= 2.0
    );
    assert_eq!(value(&samples, "portcullis_audit_dropped_total", &[]), 0.0);
    assert!(
        samples
            .iter()
            .any(|(n, _, _)| n == "portcullis_audit_queue_depth")
    );
    assert!(samples.iter().any(|(n, l, _)| n == "portcullis_build_info"
        && l.get("version").map(String::as_str) == Some(env!("CARGO_PKG_VERSION"))));
    gateway.stop().await;
    drop(upstream);
}

const ADMIN_TOKEN: &str = "metrics-admin-token";

/// Once an admin token is configured, `/metrics` needs it (its labels name clients and tools).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_admin_token_once_one_is_configured() {
    let upstream = InProcess::demo().await;
    let gateway = TestGateway::start_config(
        &Config::new()
            .admin_token(ADMIN_TOKEN)
            .server("demo", &upstream.url)
            .clients()
            .allow_all(),
    )
    .await;
    let client = support::http();
    let url = format!("{}/metrics", gateway.admin_url());
    let status = |r: reqwest::Response| r.status().as_u16();
    let without = client.get(&url).send().await.expect("scrape");
    assert_eq!(status(without), 401);
    let wrong = client
        .get(&url)
        .bearer_auth("nope")
        .send()
        .await
        .expect("scrape");
    assert_eq!(status(wrong), 401);
    let with = client
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("scrape");
    assert_eq!(with.status().as_u16(), 200);
    let text = with.text().await.expect("body");
    assert!(!parse(&text).is_empty());
    gateway.stop().await;
    drop(upstream);
}

/// A configuration file's text: one server, `lookup_order` allowed once per
/// 100 s per client, traces exported to `otlp`.
fn limited(url: &str, otlp: &str) -> String {
    Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("demo", url)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .allow(&["lookup_order"])
        .rate(1, 0.01, "client+tool")
        .memory_stores()
        .otlp(otlp)
        .render()
}

async fn reload(admin: &str) -> u16 {
    Admin::at(admin, Some(ADMIN_TOKEN)).reload().await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_rate_limit_refusals_reloads_and_span_export() {
    support::init();
    let upstream = InProcess::demo().await;
    let receiver = support::otlp::Receiver::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, limited(&upstream.url, &receiver.endpoint)).expect("write");
    // Reloads come from the API only, so each one is counted exactly once.
    let gateway = portcullis::Gateway::bind_file(&path)
        .await
        .expect("binds")
        .watch_file(false);
    let (mcp, admin) = (
        gateway.local_addr().expect("addr"),
        gateway.admin_addr().expect("addr"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(gateway.run(async {
        let _ = stopped.await;
    }));
    let (url, admin) = (format!("http://{mcp}/mcp/demo"), format!("http://{admin}"));

    let before = scrape(&admin).await;
    // (Refusals are counted per server from the first one on.)
    for name in [
        "portcullis_config_reloads_total",
        "portcullis_otel_spans_dropped_total",
        "portcullis_otel_spans_exported_total",
        "portcullis_otel_spans_failed_total",
        "portcullis_audit_queue_depth",
        "portcullis_audit_dropped_total",
        "portcullis_build_info",
    ] {
        assert!(
            before.iter().any(|(n, _, _)| n == name),
            "{name} is listed from the start"
        );
    }
    assert_eq!(
        value(
            &before,
            "portcullis_config_reloads_total",
            &[("result", "applied")]
        ),
        0.0
    );

    for _ in 0..3 {
        tools_call(
            &url,
            ALICE,
            "lookup_order",
            json!({"order_id": "ORD-004211"}),
            &[],
        )
        .await;
    }
    assert_eq!(reload(&admin).await, 200);
    std::fs::write(&path, "[gateway\nnot toml").expect("write");
    assert_ne!(reload(&admin).await, 200);

    // The request metrics count once a response is sent; spans go out in batches.
    let mut samples = scrape(&admin).await;
    for _ in 0..400 {
        if value(&samples, "portcullis_otel_spans_exported_total", &[]) > 0.0
            && value(&samples, "portcullis_rate_limit_refusals_total", &[]) >= 2.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        samples = scrape(&admin).await;
    }
    assert_eq!(
        value(
            &samples,
            "portcullis_rate_limit_refusals_total",
            &[("server", "demo")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &samples,
            "portcullis_config_reloads_total",
            &[("result", "applied")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "portcullis_config_reloads_total",
            &[("result", "refused")]
        ),
        1.0
    );
    assert!(value(&samples, "portcullis_otel_spans_exported_total", &[]) > 0.0);
    assert_eq!(
        value(&samples, "portcullis_otel_spans_dropped_total", &[]),
        0.0
    );
    assert_eq!(
        value(&samples, "portcullis_otel_spans_failed_total", &[]),
        0.0
    );
    let _ = stop.send(());
    served.await.expect("task").expect("clean shutdown");
}
