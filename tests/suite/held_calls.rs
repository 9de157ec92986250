//! Calls held for a person meet the live configuration, and asking costs
//! nothing: through the official Python SDK client in both protocol eras and
//! a real Python SDK server that records every call it runs.
//!
//! A call waiting for an answer is decided again when the answer comes
//! (`held_calls_reload.rs`). A rate-limit token is
//! taken once, when a call runs: never by a question, a refusal or a
//! declined call — with buckets in memory and in a real redis-server.

use crate::support;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::{Value, json};
use support::redis::RedisServer;
use support::{ALICE, BOB, Config, Mode, Peer, PeerServer, TestGateway, call, gateway_code};

pub(crate) const ADMIN_TOKEN: &str = "held-admin-token";
pub(crate) const BY_USER: &str = r#"{ by = "user", timeout = "1m" }"#;

/// Server `files` in front of `upstream` and the harness's clients; everyone
/// may call `echo` with `approval`, at most once per client per 1000 s when
/// `rate`, and `progress` freely; `deny_echo` adds a rule denying `echo` to
/// everyone.
pub(crate) fn config(upstream: &str, approval: &str, rate: bool, deny_echo: bool) -> Config {
    let mut config = Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("files", upstream)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .allow(&["echo"])
        .set_raw("approval", approval);
    if rate {
        config = config.rate(1, 0.001, "client");
    }
    config = config.allow(&["progress"]);
    if deny_echo {
        config = config.deny(&["echo"]);
    }
    config
}

/// The Python SDK client answering elicitations as `elicit` says
/// (`approve`, `decline`, `off`, `wait:PATH`).
pub(crate) async fn python(
    mode: Mode,
    url: &str,
    key: &str,
    elicit: &str,
    ops: Value,
) -> Vec<Value> {
    support::eliciting(support::Sdk::Python, mode, url, key, elicit, ops).await
}

/// The calls of `echo` the server ran.
fn echoes(upstream: &PeerServer) -> usize {
    upstream
        .calls()
        .iter()
        .filter(|c| c["tool"] == "echo")
        .count()
}

fn echo(text: &str) -> Value {
    call("echo", json!({"text": text}))
}

/// Polls (bounded) until `check` holds.
pub(crate) async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

// === Asking costs nothing ===

/// With one token per client, each era's client is asked, answers yes, and
/// its call runs: the question took no token. The next call is refused for
/// its rate: the run took exactly one.
async fn one_token_is_taken_by_the_run_not_the_question(backend: Option<&str>) {
    let upstream = PeerServer::start(Peer::Python).await;
    let mut config = config(&upstream.url, BY_USER, true, false);
    if let Some(url) = backend {
        config = config
            .section("rate_limit")
            .set("backend", "redis")
            .set("redis_url", url);
    }
    let gw = TestGateway::start_config(&config).await;
    let url = gw.url("files");
    for (mode, key) in [(Mode::Modern, ALICE), (Mode::Legacy, BOB)] {
        let out = python(
            mode,
            &url,
            key,
            "approve",
            json!([echo("asked, then run"), echo("again")]),
        )
        .await;
        assert_eq!(out[0]["isError"], false, "{mode:?} {backend:?}: {}", out[0]);
        assert_eq!(out[0]["text"], "asked, then run");
        assert_eq!(
            gateway_code(&out[1]),
            Some("rate_limited"),
            "{mode:?} {backend:?}: {}",
            out[1]
        );
    }
    assert_eq!(echoes(&upstream), 2, "each client's approved call ran once");
    gw.stop().await;
    upstream.stop().await;
}

#[tokio::test]
async fn a_question_takes_no_token_in_memory() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    one_token_is_taken_by_the_run_not_the_question(None).await;
}

#[tokio::test]
async fn a_question_takes_no_token_in_redis() {
    if !tiers::ready(&[Tier::Python, Tier::Redis]) {
        return;
    }
    let redis = RedisServer::start();
    one_token_is_taken_by_the_run_not_the_question(Some(&redis.url())).await;
}

/// A secret in the arguments, invalid arguments, a declined call and an
/// unanswerable client are refused without taking the one token: the
/// approved call after them runs, and only the one after it is refused for
/// its rate.
#[tokio::test]
async fn refusals_and_declined_calls_take_no_token() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    let gw = TestGateway::start_config(&config(&upstream.url, BY_USER, true, false)).await;
    let url = gw.url("files");
    for mode in [Mode::Modern, Mode::Legacy] {
        let key = if mode == Mode::Modern { ALICE } else { BOB };
        let secret = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
        let refused = python(
            mode,
            &url,
            key,
            "decline",
            json!([
                echo(&format!("token {secret}")),
                call("echo", json!({"text": 5})),
                echo("declined"),
            ]),
        )
        .await;
        let codes: Vec<Option<&str>> = refused.iter().map(gateway_code).collect();
        assert_eq!(
            codes,
            [
                Some("argument_not_permitted"),
                Some("invalid_arguments"),
                Some("approval_declined")
            ],
            "{mode:?}: {refused:?}"
        );
        let off = python(mode, &url, key, "off", json!([echo("cannot ask")])).await;
        assert_eq!(gateway_code(&off[0]), Some("approval_unavailable"));
        let out = python(mode, &url, key, "approve", json!([echo("ran"), echo("no")])).await;
        assert_eq!(out[0]["text"], "ran", "{mode:?}: {}", out[0]);
        assert_eq!(gateway_code(&out[1]), Some("rate_limited"), "{}", out[1]);
    }
    assert_eq!(echoes(&upstream), 2);
    gw.stop().await;
    upstream.stop().await;
}
