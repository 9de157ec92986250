//! The closed method table, seen from outside: a method the MCP specification
//! does not define for the request's era and direction — and that the
//! operator did not name in `[methods]` — is refused with -32601 for every
//! client and never reaches the server; what an upstream sends that the specification
//! does not let a server send is dropped; and the tool catalog is the
//! gateway's own, collected whole from the first page whatever a client's
//! list asked for. Methods the operator names: `methods_operator.rs`.

use crate::support;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::misbehaving::Misbehaving;
use support::*;

/// Lets requests without credentials in, as `anonymous`.
pub(crate) const ANONYMOUS: &str = "[clients.anonymous]\n";

/// Headers of a request from `key` (none: anonymous) in either era.
pub(crate) fn headers(key: Option<&str>, modern: Option<&str>) -> Vec<(&'static str, String)> {
    let mut h = Vec::new();
    if let Some(key) = key {
        h.push(("authorization", format!("Bearer {key}")));
    }
    if let Some(method) = modern {
        h.push(("mcp-protocol-version", "2026-07-28".into()));
        h.push(("mcp-method", method.into()));
    }
    h
}

/// A JSON-RPC message of `method` (a notification when `id` is `None`),
/// with the 2026-07-28 `_meta` when `modern`.
pub(crate) fn message(id: Option<u64>, method: &str, mut params: Value, modern: bool) -> String {
    if modern {
        params["_meta"] = modern_meta();
    }
    let mut m = json!({"jsonrpc": "2.0", "method": method, "params": params});
    if let Some(id) = id {
        m["id"] = id.into();
    }
    m.to_string()
}

pub(crate) async fn send(url: &str, key: Option<&str>, modern: bool, body: &str) -> Raw {
    let parsed: Value = serde_json::from_str(body).expect("a JSON body");
    let method = parsed["method"].as_str().unwrap_or_default();
    let mut h = headers(key, modern.then_some(method));
    if let (true, "tools/call", Some(name)) = (modern, method, parsed["params"]["name"].as_str()) {
        h.push(("mcp-name", name.to_owned()));
    }
    raw_post(url, &borrow(&h), body.to_owned()).await
}

/// A -32601 refusal with the era's HTTP status.
pub(crate) fn assert_method_not_found(r: &Raw, modern: bool, notification: bool, what: &str) {
    let status = match (modern, notification) {
        (true, _) => 404,
        (false, false) => 200,
        (false, true) => 400,
    };
    assert_eq!(r.status, status, "{what}: {}", r.text);
    assert_eq!(r.body["error"]["code"], -32601, "{what}: {}", r.text);
}

#[tokio::test]
async fn unknown_methods_are_refused_for_every_client_and_never_reach_the_server() {
    let up = Misbehaving::start().await;
    let config = format!("{}{ANONYMOUS}{}", clients(), allow_all());
    let gateway = TestGateway::start(&[("m", &up.url)], &config).await;
    let url = gateway.url("m");
    let call = json!({"name": "wrong_id", "arguments": {}});
    for key in [Some(ALICE), None] {
        for modern in [false, true] {
            let what = |m: &str| format!("{m} from {key:?}, modern {modern}");
            // Names that differ from the specification's only by case or
            // spelling, and methods nobody defined.
            for method in [
                "Tools/call",
                "tools/Call",
                "TOOLS/CALL",
                "tools/call.",
                "x/custom",
            ] {
                let r = send(
                    &url,
                    key,
                    modern,
                    &message(Some(1), method, call.clone(), modern),
                )
                .await;
                assert_method_not_found(&r, modern, false, &what(method));
            }
            // A request's method sent as a notification, a notification's
            // method sent as a request, and an unknown notification.
            let r = send(
                &url,
                key,
                modern,
                &message(None, "tools/call", call.clone(), modern),
            )
            .await;
            assert_method_not_found(&r, modern, true, &what("tools/call as a notification"));
            let r = send(
                &url,
                key,
                modern,
                &message(
                    Some(2),
                    "notifications/cancelled",
                    json!({"requestId": 1}),
                    modern,
                ),
            )
            .await;
            assert_method_not_found(
                &r,
                modern,
                false,
                &what("notifications/cancelled as a request"),
            );
            let r = send(
                &url,
                key,
                modern,
                &message(None, "x/note", json!({}), modern),
            )
            .await;
            assert_method_not_found(&r, modern, true, &what("x/note"));
        }
    }
    // Each era's methods only: the other era's are unknown too.
    let r = send(
        &url,
        Some(ALICE),
        true,
        &message(Some(3), "initialize", json!({}), true),
    )
    .await;
    assert_method_not_found(&r, true, false, "initialize in 2026-07-28");
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(4), "server/discover", json!({}), false),
    )
    .await;
    assert_method_not_found(&r, false, false, "server/discover before 2026-07-28");
    let r = send(
        &url,
        Some(ALICE),
        true,
        &message(Some(5), "tasks/list", json!({}), true),
    )
    .await;
    assert_method_not_found(&r, true, false, "tasks/list in 2026-07-28");
    // 2026-07-28 servers send no requests, so a client there sends no responses.
    let response = json!({"jsonrpc": "2.0", "id": "s-1", "result": {}}).to_string();
    let auth = format!("Bearer {ALICE}");
    let h = [
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
    ];
    let r = raw_post(&url, &h, response).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.body["error"]["code"], -32600, "{}", r.text);
    assert_eq!(
        up.methods(),
        Vec::<String>::new(),
        "nothing reached the server"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn subscribing_to_a_hidden_resource_is_refused_in_both_eras() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let up = Misbehaving::start().await;
    let rules = "[[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\nresources = [\"file:///public/*\"]\naction = \"allow\"\n";
    let gateway = TestGateway::start(&[("m", &up.url)], &format!("{}{rules}", clients())).await;
    let url = gateway.url("m");
    let hidden = json!({"uri": "file:///secret/key.txt"});
    // 2026-07-28 removed resources/subscribe: unknown in that era, whatever the URI.
    for params in [hidden.clone(), json!({"uri": "file:///public/a.txt"})] {
        let r = send(
            &url,
            Some(ALICE),
            true,
            &message(Some(1), "resources/subscribe", params.clone(), true),
        )
        .await;
        assert_method_not_found(&r, true, false, "resources/subscribe in 2026-07-28");
        let r = send(
            &url,
            Some(ALICE),
            true,
            &message(Some(2), "resources/unsubscribe", params, true),
        )
        .await;
        assert_method_not_found(&r, true, false, "resources/unsubscribe in 2026-07-28");
    }
    // Its replacement, subscriptions/listen, names its resources: a hidden one
    // gets the answer a missing one gets.
    let listen = json!({"notifications": {"resourceSubscriptions": ["file:///public/a.txt", "file:///secret/key.txt"]}});
    let r = send(
        &url,
        Some(ALICE),
        true,
        &message(Some(3), "subscriptions/listen", listen, true),
    )
    .await;
    assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);
    assert!(
        r.text
            .contains("Resource not found: file:///secret/key.txt"),
        "{}",
        r.text
    );
    let r = send(
        &url,
        Some(ALICE),
        true,
        &message(
            Some(4),
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": "file:///x"}}),
            true,
        ),
    )
    .await;
    assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);
    // The handshake era's subscribe is decided by the resource rules.
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(5), "resources/subscribe", hidden, false),
    )
    .await;
    assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);
    assert!(r.text.contains("Resource not found"), "{}", r.text);
    assert_eq!(
        up.methods(),
        Vec::<String>::new(),
        "nothing reached the server"
    );
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(
            Some(6),
            "resources/subscribe",
            json!({"uri": "file:///public/a.txt"}),
            false,
        ),
    )
    .await;
    assert_ne!(r.body["error"]["code"], -32602, "{}", r.text);
    assert_eq!(up.methods(), vec!["resources/subscribe".to_owned()]);
    gateway.stop().await;
}

#[tokio::test]
async fn one_clients_cursor_never_becomes_the_servers_catalog() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::PythonPaged).await;
    let config = format!("{}{}", clients(), allow_all());
    let gateway = TestGateway::start(&[("py", &py.url)], &config).await;
    let url = gateway.url("py");
    // Alice asks for the second page first: the gateway issues no cursors and refuses hers.
    for modern in [false, true] {
        let r = send(
            &url,
            Some(ALICE),
            modern,
            &message(Some(1), "tools/list", json!({"cursor": "2"}), modern),
        )
        .await;
        assert_eq!(r.status, 400, "{}", r.text);
        assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);
        assert!(r.text.contains("invalid cursor"), "{}", r.text);
    }
    // Bob's valid call finds its tool: the catalog is the whole list, from the first page.
    let r = send(
        &url,
        Some(BOB),
        false,
        &message(
            Some(2),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hi"}}),
            false,
        ),
    )
    .await;
    assert_ne!(r.body["result"]["isError"], true, "{}", r.text);
    assert_eq!(r.body["result"]["content"][0]["text"], "hi", "{}", r.text);
    assert_eq!(py.ran(), vec!["echo".to_owned()]);
    // And a list is answered whole, on one page, whichever page the server starts with.
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(3), "tools/list", json!({}), false),
    )
    .await;
    let tools = r.body["result"]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(tools.len() > 2, "every page: {}", r.text);
    assert!(tools.iter().any(|t| t["name"] == "echo"), "{}", r.text);
    assert_eq!(r.body["result"].get("nextCursor"), None, "{}", r.text);
    gateway.stop().await;
    py.stop().await;
}

#[tokio::test]
async fn what_an_upstream_may_not_send_is_dropped_on_the_way_back() {
    let up = Misbehaving::start().await;
    let gateway =
        TestGateway::start(&[("m", &up.url)], &format!("{}{}", clients(), allow_all())).await;
    let body = message(
        Some(1),
        "tools/call",
        json!({"name": "unknown_messages", "arguments": {}}),
        false,
    );
    let r = send(&gateway.url("m"), Some(ALICE), false, &body).await;
    assert_eq!(r.body["result"]["content"][0]["text"], "done", "{}", r.text);
    assert!(
        r.text.contains("known-log"),
        "a log message the spec defines passes: {}",
        r.text
    );
    for unknown in ["unknown-notification", "unknown-case", "unknown-request"] {
        assert!(
            !r.text.contains(unknown),
            "{unknown} reached the client: {}",
            r.text
        );
    }
    gateway.stop().await;
}

#[tokio::test]
async fn the_merged_view_refuses_unknown_methods_before_any_server() {
    let (a, b) = (Misbehaving::start().await, Misbehaving::start().await);
    let config = format!("{}{ANONYMOUS}{}", clients(), allow_all());
    let gateway = TestGateway::start(&[("a", &a.url), ("b", &b.url)], &config).await;
    let url = gateway.merged_url();
    for modern in [false, true] {
        let r = send(
            &url,
            None,
            modern,
            &message(
                Some(1),
                "Tools/call",
                json!({"name": "a__wrong_id"}),
                modern,
            ),
        )
        .await;
        assert_method_not_found(&r, modern, false, "Tools/call on the merged view");
        let r = send(
            &url,
            None,
            modern,
            &message(None, "x/note", json!({}), modern),
        )
        .await;
        assert_method_not_found(&r, modern, true, "x/note on the merged view");
    }
    let r = send(
        &url,
        None,
        false,
        &message(Some(2), "tools/list", json!({"cursor": "x"}), false),
    )
    .await;
    assert_eq!(r.body["error"]["code"], -32602, "{}", r.text);
    assert_eq!(a.methods(), Vec::<String>::new());
    assert_eq!(b.methods(), Vec::<String>::new());
    gateway.stop().await;
}

/// The method lists the gateway's table is tested against (`src/mcp/methods/tests.rs`
/// reads `tests/snapshots/methods/published_schemas.txt`) are the published
/// schemas' own: the message unions of `mcp-types` 2.3.0 (PyPI, a dependency of
/// `mcp` 2.3.0), generated from the specification's `schema/2025-11-25.json` and
/// `schema/2026-07-28.json`, read by `tests/peers/schema_methods.py`. No registry
/// publishes either era's `schema.ts` itself (the TypeScript SDK ships one
/// draft's `spec.types.ts`, of neither era), so these JSON forms of it are the
/// published copy. `UPDATE_SNAPSHOTS=1 cargo test --test suite methods::` writes
/// the snapshot again after a version bump; the unit test then says what the
/// table lacks.
#[test]
fn the_method_lists_are_the_published_schemas() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let python = peers_dir().join("venv/bin/python");
    assert!(
        python.exists(),
        "the Python SDK venv is missing at {} — install the test peers with `bash tests/peers/setup.sh`",
        python.display()
    );
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/peers/schema_methods.py"
        ))
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    support::assert_snapshot("methods", "published_schemas", &text);
}
