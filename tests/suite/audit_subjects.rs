//! The audit says what a resource or prompt use was about, through the
//! official Python SDK server with the conformance fixtures: the admin API's
//! event of each `resources/read` carries the resource's canonical URI as
//! forwarded (its query included), whether the read was served, refused by
//! a rule (-31022), hidden (answered as a missing resource) or refused for
//! its spelling (then the URI as sent); a `prompts/get` carries the
//! prompt's name (in the merged view, the name its server knows, beside
//! the server); a `completion/complete` its reference. None of them names a
//! tool.

use crate::support;
use support::config::Config;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::{ALICE, Peer, PeerServer, TestGateway, modern_meta, raw_post};

const ADMIN_TOKEN: &str = "audit-subjects-admin-token";

/// `users://` and `test://` may be read, `test://static-binary` is hidden;
/// a `logs://` read is refused unless its `level` is `warn`; the simple
/// prompt is allowed.
const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["users://*", "test://*"]
action = "allow"

[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["logs://*"]
action = "allow"
when = "!has(query.level) || query.level == 'warn'"

[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["test://static-binary"]
action = "deny"

[[rules]]
clients = ["*"]
servers = ["py"]
prompts = ["test_simple_prompt"]
action = "allow"
"#;

/// A 2026-07-28 request of `method`, about `name` (its `Mcp-Name`, for the
/// methods that carry one), posted as is.
async fn ask(url: &str, method: &str, name: Option<&str>, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = modern_meta();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let auth = format!("Bearer {ALICE}");
    let mut headers = vec![
        ("authorization", auth.as_str()),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method),
    ];
    headers.extend(name.map(|name| ("mcp-name", name)));
    raw_post(url, &headers, body.to_string()).await.body
}

async fn read(url: &str, uri: &str) -> Value {
    ask(url, "resources/read", Some(uri), json!({"uri": uri})).await
}

/// The recorded events of `method`, oldest first, as `(server, subject, decision)`.
fn uses(events: &[Value], method: &str) -> Vec<(Value, Value, Value)> {
    let mut found: Vec<&Value> = events.iter().filter(|e| e["method"] == method).collect();
    found.sort_by_key(|e| e["id"].as_i64());
    (found.into_iter())
        .inspect(|e| assert!(e["tool"].is_null(), "no tool: {e}"))
        .map(|e| {
            (
                e["server"].clone(),
                e["subject"].clone(),
                e["decision"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resource_and_prompt_event_says_what_it_was_about() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::PythonFixtures).await;
    // A second member, on which no rule allows anything, makes /mcp the merged view.
    let config = Config::new()
        .server("py", &py.url)
        .set("timeout", "20s")
        .server("other", &py.url)
        .set("timeout", "20s")
        .clients()
        .admin_token(ADMIN_TOKEN)
        .raw(RULES);
    let gateway = TestGateway::start_config(&config).await;
    let url = gateway.url("py");

    // Served, spelled otherwise than canonically, with the query it runs with.
    let served = read(&url, "LOGS://api?level=warn").await;
    let text = &served["result"]["contents"][0]["text"];
    assert_eq!(text, "api log at warn", "{served}");
    // Refused by the condition of rules[1] on its query.
    let refused = read(&url, "logs://api?level=debug").await;
    assert_eq!(refused["error"]["code"], -31022, "{refused}");
    // Hidden: answered as a missing resource.
    let hidden = read(&url, "TEST://static-binary").await;
    let message = hidden["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not found"), "{hidden}");
    // A spelling that changes the URI's structure: refused before any rule.
    let spelled = read(&url, "users://bob/..%2Fadmin%2Fprofile").await;
    assert_eq!(spelled["error"]["code"], -31011, "{spelled}");
    let got = ask(
        &url,
        "prompts/get",
        Some("test_simple_prompt"),
        json!({"name": "test_simple_prompt"}),
    )
    .await;
    assert!(got["result"]["messages"].is_array(), "{got}");
    let reference = json!({"type": "ref/resource", "uri": "USERS://bob/profile?x=1"});
    let params = json!({"ref": reference, "argument": {"name": "user_id", "value": "b"}});
    ask(&url, "completion/complete", None, params).await;
    // The merged view: a prompt by its prefixed name, a resource no member shows.
    let merged = gateway.merged_url();
    let got = ask(
        &merged,
        "prompts/get",
        Some("py__test_simple_prompt"),
        json!({"name": "py__test_simple_prompt"}),
    )
    .await;
    assert!(got["result"]["messages"].is_array(), "{got}");
    let nowhere = read(&merged, "test://static-binary").await;
    assert!(nowhere["error"].is_object(), "{nowhere}");

    let admin = gateway.admin(ADMIN_TOKEN);
    let mut events = Vec::new();
    for _ in 0..200 {
        events = admin.events().await;
        if uses(&events, "resources/read").len() >= 5 && uses(&events, "prompts/get").len() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let on_py = json!("py");
    assert_eq!(
        uses(&events, "resources/read"),
        [
            (
                on_py.clone(),
                json!("logs://api?level=warn"),
                json!("forwarded")
            ),
            (
                on_py.clone(),
                json!("logs://api?level=debug"),
                json!("call_not_permitted")
            ),
            (
                on_py.clone(),
                json!("test://static-binary"),
                json!("not_found")
            ),
            (
                on_py.clone(),
                json!("users://bob/..%2Fadmin%2Fprofile"),
                json!("non_canonical_uri")
            ),
            (
                on_py.clone(),
                json!("test://static-binary"),
                json!("not_found")
            ),
        ],
        "{events:#?}"
    );
    assert_eq!(
        uses(&events, "prompts/get"),
        [
            (
                on_py.clone(),
                json!("test_simple_prompt"),
                json!("forwarded")
            ),
            (
                on_py.clone(),
                json!("test_simple_prompt"),
                json!("forwarded")
            ),
        ],
        "{events:#?}"
    );
    let completions = uses(&events, "completion/complete");
    assert_eq!(completions[0].1, "users://bob/profile", "{completions:?}");
    gateway.stop().await;
    py.stop().await;
}
