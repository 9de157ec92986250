//! A call held for a person is decided again when the answer comes, under
//! the configuration in force then: a reload that denies the tool, removes
//! the client, adds a flow rule, a rule over the tool's annotations or the
//! argument scan ends it with `approval_expired` and the server never runs
//! it; a reload that still allows it lets it run. Two tables of cases (one
//! through the official Python SDK client against a recording Python SDK
//! server, one through a raw client against the scripted server), each case
//! on a gateway of its own since a reload changes it.

use crate::held_calls::{ADMIN_TOKEN, BY_USER, config, python, until};
use crate::support;
use support::tiers::{self, Tier};

use std::path::PathBuf;

use portcullis::Gateway;
use serde_json::{Value, json};
use support::{ALICE, BOB, Config, Mode, Peer, PeerServer, TestGateway, call, gateway_code};

const BY_EITHER: &str = r#"{ by = "either", timeout = "1m" }"#;

/// A gateway started from a configuration file, reloaded when it changes.
struct Reloadable {
    gw: TestGateway,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Reloadable {
    async fn start(config: &Config) -> Self {
        support::init();
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("portcullis.toml");
        std::fs::write(&path, config.render()).expect("write");
        let handle = Gateway::start_file(&path).await.expect("gateway starts");
        Self {
            gw: TestGateway::from_handle(handle),
            path,
            _dir: dir,
        }
    }

    /// Replaces the file (write aside, rename over) and waits until the
    /// reload is in force: `applied` holds.
    /// `case` names the story in a failure.
    async fn reload(&self, case: &str, config: &Config, applied: impl AsyncFnMut() -> bool) {
        let aside = self.path.with_extension("toml.tmp");
        std::fs::write(&aside, config.render()).expect("write");
        std::fs::rename(&aside, &self.path).expect("rename");
        until(&format!("{case}: the reload is in force"), applied).await;
    }
}

/// How a case tells that a reload is in force: `key` calls `tool` with
/// `args` until the answer is `now`.
struct Probe {
    key: &'static str,
    tool: &'static str,
    args: fn() -> Value,
    now: Now,
}

/// What a probe's call gets once the reload is in force.
#[derive(Debug, Clone, Copy)]
enum Now {
    /// The tool runs.
    Runs,
    /// This refusal (`unauthenticated` for a client the file no longer names).
    Refused(&'static str),
    /// Anything but this refusal (a tool that was unknown before).
    NoLonger(&'static str),
}

/// `key` calling `tool` on `url` now: `None` when it ran, else the refusal.
async fn refusal(url: &str, key: &str, tool: &str, args: Value) -> Option<String> {
    let raw = support::tools_call(url, key, tool, args, &[]).await;
    if raw.status == 401 {
        return Some("unauthenticated".into());
    }
    raw.refusal()
}

impl Probe {
    async fn holds(&self, url: &str) -> bool {
        let got = refusal(url, self.key, self.tool, (self.args)()).await;
        match self.now {
            Now::Runs => got.is_none(),
            Now::Refused(code) => got.as_deref() == Some(code),
            Now::NoLonger(code) => got.as_deref() != Some(code),
        }
    }
}

/// Who a held call waits for.
#[derive(Debug, Clone, Copy)]
enum Holder {
    /// The client's user, asked in this era; answers yes after the reload.
    User(Mode),
    /// An operator (the legacy client cannot be asked: `either` falls to one);
    /// approves after the reload.
    Operator,
}

/// What the yes after the reload leads to.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// `approval_expired`, and the server never runs the call.
    Expired,
    /// The call runs once, with this result text.
    Runs(&'static str),
}

/// One held call meeting a reload, through the Python SDK client against
/// the recording Python SDK server.
struct SdkCase {
    name: &'static str,
    holder: Holder,
    /// The file the gateway starts from, for the server at a URL.
    before: fn(&str) -> Config,
    /// The calls made before the held one, in the same session; each runs.
    first: fn() -> Vec<Value>,
    /// The held call: tool and arguments.
    held: (&'static str, fn() -> Value),
    /// The file that replaces it while the call is held.
    after: fn(&str) -> Config,
    probe: Probe,
    outcome: Outcome,
}

/// `echo` private, `leaky_text` untrusted, `book_flight` egress and held for
/// an operator (`either`: a client that cannot be asked falls to one); with
/// `flow`, the egress rule also refuses a session holding both labels.
fn flow_config(upstream: &str, flow: bool) -> Config {
    let config = Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("files", upstream)
        .set("timeout", "20s")
        .set("pinning", "off")
        .set_raw(
            "labels",
            r#"{ echo = { source = "private" }, leaky_text = { source = "untrusted" }, book_flight = { sink = "egress" } }"#,
        )
        .clients()
        .allow(&["echo", "leaky_text"])
        .allow(&["book_flight"])
        .set_raw("approval", BY_EITHER);
    match flow {
        true => config.set_raw(
            "flow",
            r#"{ holds = ["private", "untrusted"], then = "deny" }"#,
        ),
        false => config,
    }
}

/// Bob may call `huge` (which no rule holds for a person): the new file allows it.
const BOB_RUNS_HUGE: Probe = Probe {
    key: BOB,
    tool: "huge",
    args: || json!({"size": 1}),
    now: Now::Runs,
};

/// The stories of a call held through the SDK client (old tests named in
/// each case): a reload that denies the tool, removes the client or adds a
/// flow rule ends it unrun; one that still allows it lets it run.
const SDK_CASES: &[SdkCase] = &[
    // a_reload_denying_the_tool_ends_a_call_waiting_for_the_user (2026-07-28)
    SdkCase {
        name: "the user is asked in 2026-07-28, a reload denies the tool",
        holder: Holder::User(Mode::Modern),
        before: |u| config(u, BY_USER, false, false),
        first: Vec::new,
        held: ("echo", || json!({"text": "held, modern"})),
        after: |u| config(u, BY_USER, false, true).allow(&["huge"]),
        probe: BOB_RUNS_HUGE,
        outcome: Outcome::Expired,
    },
    // a_reload_denying_the_tool_ends_a_call_waiting_for_the_user (2025-11-25)
    SdkCase {
        name: "the user is asked in 2025-11-25, a reload denies the tool",
        holder: Holder::User(Mode::Legacy),
        before: |u| config(u, BY_USER, false, false),
        first: Vec::new,
        held: ("echo", || json!({"text": "held, legacy"})),
        after: |u| config(u, BY_USER, false, true).allow(&["huge"]),
        probe: BOB_RUNS_HUGE,
        outcome: Outcome::Expired,
    },
    // a_reload_that_still_allows_the_call_lets_it_run
    SdkCase {
        name: "the user is asked, a reload only allows another tool",
        holder: Holder::User(Mode::Legacy),
        before: |u| config(u, BY_USER, false, false),
        first: Vec::new,
        held: ("echo", || json!({"text": "kept"})),
        after: |u| config(u, BY_USER, false, false).allow(&["huge"]),
        probe: BOB_RUNS_HUGE,
        outcome: Outcome::Runs("kept"),
    },
    // a_reload_denying_the_tool_or_removing_the_client_ends_a_call_held_for_an_operator
    SdkCase {
        name: "an operator holds the call, a reload denies the tool",
        holder: Holder::Operator,
        before: |u| config(u, BY_EITHER, false, false),
        first: Vec::new,
        held: ("echo", || json!({"text": "held for an operator"})),
        after: |u| config(u, BY_EITHER, false, true).allow(&["huge"]),
        probe: BOB_RUNS_HUGE,
        outcome: Outcome::Expired,
    },
    // a_reload_denying_the_tool_or_removing_the_client_ends_a_call_held_for_an_operator
    SdkCase {
        name: "an operator holds the call, a reload removes the client",
        holder: Holder::Operator,
        before: |u| config(u, BY_EITHER, false, false),
        first: Vec::new,
        held: (
            "echo",
            || json!({"text": "held for an operator, client removed"}),
        ),
        after: |u| {
            Config::new()
                .admin_token(ADMIN_TOKEN)
                .server("files", u)
                .set("timeout", "20s")
                .set("pinning", "off")
                .client("bob", BOB)
                .allow(&["echo"])
                .set_raw("approval", BY_EITHER)
                .allow(&["huge"])
        },
        probe: Probe {
            key: ALICE,
            now: Now::Refused("unauthenticated"),
            ..BOB_RUNS_HUGE
        },
        outcome: Outcome::Expired,
    },
    // a_reload_adding_a_flow_rule_ends_an_egress_call_held_for_an_operator:
    // the session read private data and untrusted content, then its egress
    // call waits; the reload adds the rule refusing such a session's egress.
    SdkCase {
        name: "an operator holds an egress call, a reload adds a flow rule",
        holder: Holder::Operator,
        before: |u| flow_config(u, false),
        first: || {
            vec![
                call("echo", json!({"text": "the quarterly numbers"})),
                call("leaky_text", json!({})),
            ]
        },
        held: (
            "book_flight",
            || json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-24", "passengers": 1}),
        ),
        // Also allows `progress`: its answering shows the reload is in force.
        after: |u| flow_config(u, true).allow(&["progress"]),
        probe: Probe {
            key: BOB,
            tool: "progress",
            args: || json!({"steps": 0}),
            now: Now::Runs,
        },
        outcome: Outcome::Expired,
    },
];

/// The calls of `tool` the server ran.
fn ran(upstream: &PeerServer, tool: &str) -> usize {
    upstream
        .calls()
        .iter()
        .filter(|c| c["tool"] == tool)
        .count()
}

/// Runs one case on a gateway of its own (a reload changes it) in front of
/// the shared recording server; every failure names the case.
async fn held_through_the_sdk(upstream: &PeerServer, case: &SdkCase) {
    let name = case.name;
    let gw = Reloadable::start(&(case.before)(&upstream.url)).await;
    let url = gw.gw.url("files");
    let (tool, args) = case.held;
    let ran_before = ran(upstream, tool);
    let dir = tempfile::tempdir().expect("dir");
    let answer = dir.path().join("answer");
    let (mode, elicit) = match case.holder {
        Holder::User(mode) => (mode, format!("wait:{}", answer.display())),
        Holder::Operator => (Mode::Legacy, "off".to_owned()),
    };
    let mut ops = (case.first)();
    ops.push(call(tool, args()));
    let client = {
        let url = url.clone();
        tokio::spawn(async move { python(mode, &url, ALICE, &elicit, Value::Array(ops)).await })
    };
    let operator = gw.gw.admin(ADMIN_TOKEN);
    let queued = match case.holder {
        Holder::User(_) => {
            let asked = answer.with_extension("asked");
            until(&format!("{name}: the user is asked"), async || {
                asked.exists()
            })
            .await;
            None
        }
        Holder::Operator => {
            let entry = operator.first_pending().await;
            Some(entry["id"].as_str().expect("queued id").to_owned())
        }
    };
    let changed = (case.after)(&upstream.url);
    gw.reload(name, &changed, async || case.probe.holds(&url).await)
        .await;
    match queued {
        None => std::fs::write(&answer, "yes").expect("answer"),
        Some(id) => assert_eq!(operator.decide(&id, "approve").await.0, 200, "{name}"),
    }
    let out = client.await.expect("client");
    let (held, first) = out.split_last().expect("the held call's answer");
    for (n, earlier) in first.iter().enumerate() {
        assert_eq!(gateway_code(earlier), None, "{name}: call {n}: {earlier}");
    }
    match case.outcome {
        Outcome::Expired => {
            assert_eq!(
                gateway_code(held),
                Some("approval_expired"),
                "{name}: {held}"
            );
            assert_eq!(
                ran(upstream, tool),
                ran_before,
                "{name}: the server never ran it"
            );
        }
        Outcome::Runs(text) => {
            assert_eq!(held["isError"], false, "{name}: {held}");
            assert_eq!(held["text"], text, "{name}: {held}");
            assert_eq!(ran(upstream, tool), ran_before + 1, "{name}: ran once");
        }
    }
    gw.gw.stop().await;
}

/// A call waiting for an answer is decided again when the answer comes,
/// under the configuration in force then: every case of [`SDK_CASES`],
/// against one recording server.
#[tokio::test]
async fn a_reload_while_a_call_is_held_decides_it_again() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let upstream = PeerServer::start(Peer::Python).await;
    for case in SDK_CASES {
        held_through_the_sdk(&upstream, case).await;
    }
    upstream.stop().await;
}

/// One call held for an operator through a raw 2026-07-28 client, against
/// the scripted server (whose `rpc_server_error` is marked idempotent).
struct RawCase {
    name: &'static str,
    /// The file for the server at a URL: before the reload and after it.
    before: fn(&str) -> Config,
    after: fn(&str) -> Config,
    /// The held call's `x` argument (never to reach the server).
    x: &'static str,
    probe: Probe,
    /// The refusal the same call made now by bob gets.
    now: &'static str,
}

/// `rpc_server_error` held for an operator.
fn scripted(upstream: &str) -> Config {
    Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("files", upstream)
        .set("timeout", "20s")
        .set("pinning", "off")
        .clients()
        .allow(&["rpc_server_error"])
        .set_raw("approval", BY_EITHER)
}

/// The stories of a call held for an operator that a reload's new kind of
/// rule ends: the operator's yes ends it with `approval_expired`, as the
/// same call made now would be refused, and nothing of it reaches the server.
const RAW_CASES: &[RawCase] = &[
    // a_reload_denying_the_tool_by_its_annotations_ends_a_held_call: a deny
    // rule reading the tool's annotations, guarded with `has(…)` as the book
    // advises.
    RawCase {
        name: "a reload denies the tool by its annotations",
        before: scripted,
        after: |u| {
            scripted(u)
                .deny(&["rpc_server_error"])
                .set(
                    "when",
                    "has(annotations.idempotentHint) && annotations.idempotentHint",
                )
                .allow(&["rpc_internal"])
        },
        x: "held until the annotations rule",
        // `rpc_internal` stops being an unknown tool once the reload is in force.
        probe: Probe {
            key: BOB,
            tool: "rpc_internal",
            args: || json!({}),
            now: Now::NoLonger("unknown_tool"),
        },
        // The reload hides the held tool from BOB's list: it is unknown now.
        now: "unknown_tool",
    },
    // a_reload_blocking_secrets_in_arguments_ends_a_held_call_carrying_one:
    // `[sanitize] arguments = "off"` let the credential out; the reload
    // restores the default (`block`).
    RawCase {
        name: "a reload blocks the credential the held call carries",
        before: |u| {
            scripted(u)
                .allow(&["rpc_internal"])
                .section("sanitize")
                .set("arguments", "off")
        },
        after: |u| {
            scripted(u)
                .allow(&["rpc_internal"])
                .section("sanitize")
                .set("arguments", "block")
        },
        x: support::misbehaving::CANARIES[0],
        // Another credential shows the reload in force: refused instead of sent.
        probe: Probe {
            key: BOB,
            tool: "rpc_internal",
            args: || json!({"x": support::misbehaving::CANARIES[1]}),
            now: Now::Refused("argument_not_permitted"),
        },
        now: "argument_not_permitted",
    },
];

/// A call held for an operator meets the live rules of every kind: each
/// case of [`RAW_CASES`] on a gateway of its own, against one scripted server.
#[tokio::test]
async fn a_reload_adding_a_rule_of_another_kind_ends_a_held_call() {
    let upstream = support::misbehaving::Misbehaving::start().await;
    for case in RAW_CASES {
        let name = case.name;
        let gw = Reloadable::start(&(case.before)(&upstream.url)).await;
        let url = gw.gw.url("files");
        let client = {
            let (url, x) = (url.clone(), case.x);
            tokio::spawn(async move {
                support::tools_call(&url, ALICE, "rpc_server_error", json!({"x": x}), &[]).await
            })
        };
        let operator = gw.gw.admin(ADMIN_TOKEN);
        let entry = operator.first_pending().await;
        let id = entry["id"].as_str().expect("queued id");
        gw.reload(name, &(case.after)(&upstream.url), async || {
            case.probe.holds(&url).await
        })
        .await;
        let before = upstream.calls();
        let now = refusal(&url, BOB, "rpc_server_error", json!({"x": case.x})).await;
        assert_eq!(now.as_deref(), Some(case.now), "{name}: the same call now");
        assert_eq!(operator.decide(id, "approve").await.0, 200, "{name}");
        let held = client.await.expect("client");
        let text = held.text.clone();
        assert_eq!(
            held.refusal().as_deref(),
            Some("approval_expired"),
            "{name}: {text}"
        );
        assert_eq!(upstream.calls(), before, "{name}: the server never ran it");
        assert!(
            !upstream.received(case.x),
            "{name}: nothing of it reached the server"
        );
        gw.gw.stop().await;
    }
}
