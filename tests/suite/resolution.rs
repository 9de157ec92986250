//! One rule resolution: what `portcullis check` says a call gets is what the
//! gateway does with it. Generated configurations of overlapping allow and
//! deny rules (rates, `arguments` constraints, approvals by user, operator or
//! either) are explained with `check --explain`'s resolution, then the same
//! call is made four times through a gateway running that configuration
//! against the official Python SDK server: refused by the rules, refused by an
//! `arguments` constraint, asking the approver the strictest rule names, or
//! running as often as the smallest bucket allows.

use std::time::Duration;

use crate::support;
use support::tiers::{self, Tier};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{Value, json};
use support::{ALICE, Peer, PeerServer, TestGateway, clients, tools_call};

const ADMIN_TOKEN: &str = "operator-token";
const PATTERNS: [&str; 5] = ["book_flight", "book_*", "*", "*_flight", "admin_*"];
const TOOLS: [&str; 2] = ["book_flight", "admin_reset"];

#[derive(Debug, Clone)]
struct GenRule {
    pattern: &'static str,
    deny: bool,
    everyone: bool,
    burst: Option<u32>,
    maximum: Option<u32>,
    approval: Option<&'static str>,
}

fn rule() -> impl Strategy<Value = GenRule> {
    (
        0..PATTERNS.len(),
        prop::bool::weighted(0.2),
        any::<bool>(),
        prop::option::weighted(0.5, 1..=3u32),
        prop::option::weighted(0.3, 1..=5u32),
        prop::option::weighted(
            0.6,
            prop::sample::select(vec!["user", "operator", "either"]),
        ),
    )
        .prop_map(|(p, deny, everyone, burst, maximum, approval)| GenRule {
            pattern: PATTERNS[p],
            deny,
            everyone,
            burst,
            maximum,
            approval,
        })
}

fn render(rules: &[GenRule], upstream: &str) -> String {
    let token = hex::encode(portcullis::auth::hash_key(ADMIN_TOKEN));
    let mut text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         admin_token_sha256 = \"{token}\"\n\
         [servers.flights]\nurl = \"{upstream}\"\ntimeout = \"20s\"\n{}\n",
        clients()
    );
    for r in rules {
        let who = if r.everyone { "*" } else { "alice" };
        let action = if r.deny { "deny" } else { "allow" };
        text.push_str(&format!(
            "[[rules]]\nclients = [\"{who}\"]\nservers = [\"flights\"]\ntools = [\"{}\"]\naction = \"{action}\"\n",
            r.pattern
        ));
        if r.deny {
            continue;
        }
        if let Some(burst) = r.burst {
            // Refills once in a thousand seconds: never during a case.
            text.push_str(&format!(
                "rate = {{ burst = {burst}, per_second = 0.001, key = \"client\" }}\n"
            ));
        }
        if let Some(max) = r.maximum {
            text.push_str(&format!(
                "arguments = {{ properties = {{ passengers = {{ maximum = {max} }} }} }}\n"
            ));
        }
        if let Some(by) = r.approval {
            let pending = if by == "user" {
                ""
            } else {
                ", pending = \"retry\""
            };
            text.push_str(&format!("approval = {{ by = \"{by}\"{pending} }}\n"));
        }
    }
    text
}

/// What one call did: `ran`, the gateway's refusal code, or the JSON-RPC error code.
async fn outcome(url: &str, tool: &str, arguments: &Value) -> String {
    let raw = tools_call(url, ALICE, tool, arguments.clone(), &[]).await;
    if let Some(code) = raw.body["error"]["code"].as_i64() {
        return format!("error {code}");
    }
    raw.refusal().unwrap_or_else(|| "ran".to_owned())
}

async fn queued_rule(gw: &TestGateway) -> Option<String> {
    let queued = gw.admin(ADMIN_TOKEN).pending().await;
    queued.first()?["rule"].as_str().map(str::to_owned)
}

/// Arguments the tool's own `inputSchema` accepts: a booking with
/// `passengers` (which the generated constraints bound), nothing for the reset.
fn arguments(tool: &str, passengers: u32) -> Value {
    match tool {
        "book_flight" => json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01",
            "passengers": passengers}),
        _ => json!({}),
    }
}

/// The test's own model of the resolution, written from the README's words
/// and not from the code: what the call made four times gives, and the
/// `[[rules]]` index of the approval asked for.
fn model(rules: &[GenRule], tool: &str, passengers: u32) -> (Vec<String>, Option<usize>) {
    let matches = |p: &str| match p {
        "*" => true,
        "book_*" => tool.starts_with("book_"),
        "admin_*" => tool.starts_with("admin_"),
        "*_flight" => tool.ends_with("_flight"),
        literal => literal == tool,
    };
    let four = |s: &str| vec![s.to_owned(); 4];
    let hits: Vec<(usize, &GenRule)> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| matches(r.pattern))
        .collect();
    if hits.iter().any(|(_, r)| r.deny) || hits.is_empty() {
        return (four("not allowed"), None);
    }
    let sent = (tool == "book_flight").then_some(passengers);
    if hits
        .iter()
        .any(|(_, r)| matches!((r.maximum, sent), (Some(m), Some(p)) if p > m))
    {
        return (four("argument_not_permitted"), None);
    }
    let rank = |by: &str| ["user", "either", "operator"].iter().position(|b| *b == by);
    let mut strictest: Option<(usize, &str)> = None;
    for (i, r) in &hits {
        if let Some(by) = r.approval
            && strictest.is_none_or(|(_, b)| rank(by) > rank(b))
        {
            strictest = Some((*i, by));
        }
    }
    if let Some((i, by)) = strictest {
        let code = if by == "user" {
            "approval_unavailable"
        } else {
            "approval_required"
        };
        return (vec![code.to_owned()], Some(i));
    }
    let smallest = hits
        .iter()
        .filter_map(|(_, r)| r.burst)
        .min()
        .unwrap_or(4)
        .min(4) as usize;
    let mut v = vec!["ran".to_owned(); smallest];
    v.resize(4, "rate_limited".to_owned());
    (v, None)
}

/// What the same call made four times must give, from `check --explain`.
fn expected(explained: &Value) -> Vec<String> {
    let four = |s: &str| vec![s.to_owned(); 4];
    match explained["verdict"].as_str() {
        Some("refused") if explained["allowed"] != true => four("not allowed"),
        Some("refused") => four("argument_not_permitted"),
        Some("asks for approval") => {
            let code = match explained["approval"]["by"].as_str() {
                Some("user") => "approval_unavailable",
                _ => "approval_required",
            };
            vec![code.to_owned()]
        }
        Some("runs") => {
            let smallest = explained["rates"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["burst"].as_u64())
                .min()
                .unwrap_or(4)
                .min(4) as usize;
            let mut v = vec!["ran".to_owned(); smallest];
            v.resize(4, "rate_limited".to_owned());
            v
        }
        other => panic!("unexpected verdict {other:?}: {explained}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_explains_exactly_what_the_gateway_does() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 40,
        ..ProptestConfig::default()
    });
    let case = (
        prop::collection::vec(rule(), 1..=5),
        0..TOOLS.len(),
        1..=6u32,
    );
    for n in 0..40 {
        let (rules, tool, passengers) = case.new_tree(&mut runner).expect("a case").current();
        let tool = TOOLS[tool];
        let text = render(&rules, &server.url);
        let config = portcullis::config::load_str(&text, "case.toml", &|_| None)
            .unwrap_or_else(|e| panic!("case {n}: {e}\n{text}"));
        let arguments = arguments(tool, passengers);
        let request = json!({"client": "alice", "server": "flights", "tool": tool,
            "arguments": arguments})
        .to_string();
        let explained: Value = serde_json::from_str(
            &portcullis::cli::explain::explain(&config, &request, true).expect("explained"),
        )
        .expect("JSON");
        let want = expected(&explained);
        let (modelled, approval_rule) = model(&rules, tool, passengers);
        let context =
            format!("case {n}: {tool} passengers={passengers}\n{text}\nexplained: {explained:#}");
        assert_eq!(
            want, modelled,
            "check --explain and the rules' meaning disagree: {context}"
        );
        if let Some(i) = approval_rule {
            assert_eq!(explained["approval"]["rule"], i, "{context}");
        }
        let gw = TestGateway::start_raw(&text).await;
        let url = gw.url("flights");
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let o = outcome(&url, tool, &arguments).await;
            // The rules refuse a tool they do not allow as if it did not exist.
            got.push(if o == "unknown_tool" || o.starts_with("error") {
                "not allowed".to_owned()
            } else {
                o
            });
        }
        assert_eq!(got, want, "{context}");
        if want[0] == "approval_required" {
            let rule = tokio::time::timeout(Duration::from_secs(10), queued_rule(&gw)).await;
            let want_rule = format!("rules[{}]", explained["approval"]["rule"]);
            assert_eq!(rule.ok().flatten(), Some(want_rule), "{context}");
        }
        gw.stop().await;
    }
    server.stop().await;
}
