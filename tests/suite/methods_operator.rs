//! Methods the operator names in `[methods]`, seen from outside: such a method is forwarded
//! under the rules of the class it was given, and a tool method (`{name, arguments}`) passes
//! exactly the checks of `tools/call` and gets the same answer through either method.

use crate::methods::{ANONYMOUS, assert_method_not_found, headers, message, send};
use crate::support;
use support::tiers::{self, Tier};

use serde_json::json;
use support::*;

#[tokio::test]
async fn a_method_the_operator_names_is_forwarded_under_its_class_rules() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::PythonPaged).await;
    let rules = "[[rules]]\nclients = [\"alice\"]\nservers = [\"*\"]\ntools = [\"echo\"]\naction = \"allow\"\n";
    let echo = |name: Option<&str>| {
        let mut params = json!({"arguments": {"text": "hi"}});
        if let Some(name) = name {
            params["name"] = name.into();
        }
        message(Some(1), "x/echo", params, false)
    };
    // Not named: refused, as any unknown method.
    let unnamed = TestGateway::start(&[("py", &py.url)], &format!("{}{rules}", clients())).await;
    let r = send(&unnamed.url("py"), Some(ALICE), false, &echo(Some("echo"))).await;
    assert_method_not_found(&r, false, false, "x/echo, not named");
    unnamed.stop().await;
    assert!(py.ran().is_empty(), "{:?}", py.ran());

    // Named as a tool method: it acts on the tool in params.name, under that tool's rules.
    let config = format!("{}{rules}\n[methods]\n\"x/echo\" = \"tool\"\n", clients());
    let gateway = TestGateway::start(&[("py", &py.url)], &config).await;
    let url = gateway.url("py");
    let r = send(&url, Some(ALICE), false, &echo(Some("echo"))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body["result"]["echoed"]["arguments"]["text"], "hi",
        "{}",
        r.text
    );
    assert_eq!(py.ran(), vec!["x/echo".to_owned()]);
    // Refused as tools/call refuses (see the next test for every check).
    for (key, name) in [(ALICE, Some("admin_reset")), (BOB, Some("echo"))] {
        let r = send(&url, Some(key), false, &echo(name)).await;
        assert_eq!(r.refusal().as_deref(), Some("unknown_tool"));
    }
    let r = send(&url, Some(ALICE), false, &echo(None)).await;
    assert_eq!(
        r.body["error"]["code"], -32602,
        "without params.name: {}",
        r.text
    );
    // The name is exact.
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(2), "X/echo", json!({"name": "echo"}), false),
    )
    .await;
    assert_method_not_found(&r, false, false, "X/echo");
    gateway.stop().await;
    assert_eq!(py.ran(), vec!["x/echo".to_owned()], "nothing else ran");

    // Named as a lifecycle method: no rule applies, anyone admitted may call it.
    let config = format!(
        "{}{ANONYMOUS}[methods]\n\"x/echo\" = \"lifecycle\"\n",
        clients()
    );
    let open = TestGateway::start(&[("py", &py.url)], &config).await;
    let r = send(&open.url("py"), None, false, &echo(None)).await;
    assert_eq!(
        r.body["result"]["echoed"]["arguments"]["text"], "hi",
        "{}",
        r.text
    );
    open.stop().await;
    py.stop().await;
}

/// Every way to call a tool is a tool call: the server's own `x/call`
/// (`{name, arguments}`), named `"tool"` in `[methods]`, passes exactly the
/// checks of `tools/call` — the rules, their `arguments`, `inputSchema`, the
/// secret scan, approval and the rate (one bucket for both) — and each case
/// gets the same answer through either method, on `/mcp/<server>` in both
/// eras and on the merged view.
#[tokio::test]
async fn a_tool_method_passes_exactly_the_checks_of_tools_call() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::PythonPaged).await;
    let config = format!(
        "{}[[rules]]\nclients = [\"alice\"]\nservers = [\"py\"]\ntools = [\"echo\"]\naction = \"allow\"\n\
         arguments = {{ properties = {{ text = {{ maxLength = 60 }} }} }}\n\
         rate = {{ burst = 2, per_second = 0.001 }}\n\
         [[rules]]\nclients = [\"alice\"]\nservers = [\"py\"]\ntools = [\"admin_reset\"]\naction = \"allow\"\n\
         approval = {{ by = \"user\" }}\n\
         [methods]\n\"x/call\" = \"tool\"\n",
        clients()
    );
    let secret = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
    let cases = [
        (
            "a tool the rules hide",
            "book_flight",
            json!({}),
            "unknown_tool",
        ),
        (
            "arguments outside the rule",
            "echo",
            json!({"text": "x".repeat(70)}),
            "argument_not_permitted",
        ),
        (
            "arguments outside inputSchema",
            "echo",
            json!({"text": 5}),
            "invalid_arguments",
        ),
        (
            "a secret in the arguments",
            "echo",
            json!({"text": secret}),
            "argument_not_permitted",
        ),
        (
            "a call needing approval",
            "admin_reset",
            json!({}),
            "approval_unavailable",
        ),
        ("an allowed call", "echo", json!({"text": "hi"}), "ran"),
        (
            "a call past its rate",
            "echo",
            json!({"text": "hi"}),
            "rate_limited",
        ),
    ];
    let views = [
        ("handshake era", false, false),
        ("2026-07-28", true, false),
        ("merged view", true, true),
    ];
    for (view, modern, merged) in views {
        // A gateway of its own for each view: a full bucket each time.
        let gateway = TestGateway::start(&[("py", &py.url), ("other", &py.url)], &config).await;
        let url = if merged {
            gateway.merged_url()
        } else {
            gateway.url("py")
        };
        for (case, tool, arguments, expected) in &cases {
            let tool = if merged {
                format!("py__{tool}")
            } else {
                (*tool).to_owned()
            };
            let mut seen = Vec::new();
            for method in ["tools/call", "x/call"] {
                let params = json!({"name": tool, "arguments": arguments});
                let body = message(Some(1), method, params, modern);
                let mut h = headers(Some(ALICE), modern.then_some(method));
                if modern {
                    h.push(("mcp-name", tool.clone()));
                }
                let r = raw_post(&url, &borrow(&h), body).await;
                let what = format!("{view}, {case} via {method}");
                assert_eq!(r.status, 200, "{what}: {}", r.text);
                let result = &r.body["result"];
                let code = result["_meta"]["portcullis/error"]["code"]
                    .as_str()
                    .unwrap_or("ran");
                assert_eq!(code, *expected, "{what}: {}", r.text);
                // The wait a rate refusal announces shrinks between the two calls.
                let text = (code != "rate_limited").then(|| result["content"][0]["text"].clone());
                seen.push((code.to_owned(), result["isError"].clone(), text));
            }
            assert_eq!(
                seen[0], seen[1],
                "{view}, {case}: tools/call and x/call answer alike"
            );
        }
        gateway.stop().await;
    }
    assert_eq!(
        py.ran(),
        vec!["echo".to_owned(); 6],
        "only the allowed calls ran"
    );
    py.stop().await;
}
