//! Access rules seen through real SDK clients: each client's list is what its
//! rules allow, a hidden tool cannot be called, deny beats allow, and a rule's
//! `arguments` constraint holds even when the tool's own schema is looser.

use crate::support;
use support::tiers::{self, Tier};

use serde_json::json;
use support::{
    ADMIN, ALICE, BOB, Mode, Peer, PeerServer, Sdk, TestGateway, call, clients, list, sdk,
};

const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["flights"]
tools = ["echo", "book_flight", "progress"]
action = "allow"
arguments = { properties = { passengers = { maximum = 4 } } }

[[rules]]
clients = ["admin"]
servers = ["flights"]
tools = ["*"]
action = "allow"

[[rules]]
clients = ["bob"]
servers = ["flights"]
tools = ["book_*"]
action = "deny"
"#;

fn names(result: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = result["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_sees_and_calls_what_its_rules_allow() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(
        &[("flights", &server.url)],
        &format!("{}{RULES}", clients()),
    )
    .await;
    let url = gateway.url("flights");
    let booking =
        json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01", "passengers": 2});

    for mode in [Mode::Legacy, Mode::Modern] {
        // alice: the three allowed tools; the admin tools are hidden and uncallable.
        let r = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([
                list(),
                call("admin_reset", json!({})),
                call("explode", json!({}))
            ]),
        )
        .await;
        assert_eq!(
            names(&r[0]),
            ["book_flight", "echo", "progress"],
            "{mode:?}"
        );
        for refused in &r[1..] {
            assert_eq!(
                support::gateway_code(refused),
                Some("unknown_tool"),
                "{r:?}"
            );
        }
        // A forbidden tool and a tool that does not exist get the same answer.
        let r2 = sdk(
            Sdk::Python,
            mode,
            &url,
            ALICE,
            json!([
                call("admin_reset", json!({})),
                call("no_such_tool", json!({}))
            ]),
        )
        .await;
        let strip = |v: &serde_json::Value, name: &str| {
            v["text"].as_str().unwrap_or_default().replace(name, "X")
        };
        assert_eq!(
            strip(&r2[0], "admin_reset"),
            strip(&r2[1], "no_such_tool"),
            "no existence oracle: {r2:?}"
        );
        assert_eq!(
            r2[0]["meta"]["portcullis/error"]["permitted"],
            r2[1]["meta"]["portcullis/error"]["permitted"]
        );

        // bob: deny overrides the allow-all rule for book_*.
        let r = sdk(
            Sdk::TypeScript,
            mode,
            &url,
            BOB,
            json!([list(), call("book_flight", booking.clone())]),
        )
        .await;
        assert_eq!(names(&r[0]), ["echo", "progress"], "{mode:?}");
        assert_eq!(support::gateway_code(&r[1]), Some("unknown_tool"), "{r:?}");

        // admin: everything, but the arguments constraint of the first rule still applies.
        let r = sdk(Sdk::Python, mode, &url, ADMIN, json!([list(), call("admin_reset", json!({})),
            call("book_flight", json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01", "passengers": 6}))])).await;
        assert_eq!(
            names(&r[0]),
            [
                "admin_reset",
                "book_flight",
                "echo",
                "explode",
                "hang",
                "huge",
                "leaky_ask",
                "leaky_structured",
                "leaky_text",
                "mirror",
                "progress"
            ]
        );
        assert_eq!(r[1]["text"], "reset done");
        assert_eq!(
            support::gateway_code(&r[2]),
            Some("argument_not_permitted"),
            "{r:?}"
        );
        assert!(
            r[2]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("/passengers: expected a number ≤ 4, got 6"),
            "{r:?}"
        );
        assert_eq!(r[2]["meta"]["portcullis/error"]["rule"], "rules[0]");
    }
    // Only the admin's reset ever ran upstream; no refused call did.
    assert_eq!(server.ran(), vec!["admin_reset", "admin_reset"]);
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rule_means_no_access() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let gateway = TestGateway::start(&[("flights", &server.url)], &clients()).await;
    let r = sdk(
        Sdk::Python,
        Mode::Modern,
        &gateway.url("flights"),
        ALICE,
        json!([list(), call("echo", json!({"text": "x"}))]),
    )
    .await;
    assert_eq!(names(&r[0]), Vec::<String>::new());
    assert_eq!(support::gateway_code(&r[1]), Some("unknown_tool"));
    assert!(
        r[1]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("No tools are available to you"),
        "{r:?}"
    );
    assert!(server.ran().is_empty());
    gateway.stop().await;
    server.stop().await;
}
