//! Several servers behind one endpoint: `/mcp` merges them, naming tools and
//! prompts `<server>__<name>`, while each server's rules still apply to it.

use crate::support;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::*;

/// alice may use everything on `py`, only `echo` on `ts`; bob nothing.
fn rules() -> String {
    format!(
        "{}\n[[rules]]\nclients = [\"alice\"]\nservers = [\"py\"]\ntools = [\"*\"]\naction = \"allow\"\n\
         [[rules]]\nclients = [\"alice\"]\nservers = [\"ts\"]\ntools = [\"echo\"]\naction = \"allow\"\n",
        clients()
    )
}

fn names(listed: &Value) -> Vec<String> {
    listed["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_same_tool_on_two_servers_is_reachable_under_each_prefix_and_rules_apply_per_server() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let ts = PeerServer::start(Peer::TypeScript).await;
    let gateway = TestGateway::start(&[("py", &py.url), ("ts", &ts.url)], &rules()).await;
    let clients = [
        (Sdk::Python, Mode::Legacy),
        (Sdk::Python, Mode::Modern),
        (Sdk::TypeScript, Mode::Legacy),
    ];
    for (n, (client, mode)) in clients.into_iter().enumerate() {
        let results = sdk(
            client,
            mode,
            &gateway.merged_url(),
            ALICE,
            json!([
                list(),
                call("py__echo", json!({"text": "from py"})),
                call("ts__echo", json!({"text": "from ts"})),
                call("echo", json!({"text": "no prefix"})),
                call("ts__book_flight", json!({})),
                call("py__echo", json!({"text": 5})),
                call("nowhere__echo", json!({"text": "x"})),
            ]),
        )
        .await;
        let context = format!("{client:?} {mode:?}: {results:#?}");
        let listed = names(&results[0]);
        for expected in ["py__echo", "py__book_flight", "ts__echo"] {
            assert!(
                listed.iter().any(|t| t == expected),
                "{expected} listed; {context}"
            );
        }
        assert!(
            listed
                .iter()
                .all(|t| t.starts_with("py__") || t == "ts__echo"),
            "only what alice may call, every name prefixed; {context}"
        );
        assert_eq!(results[1]["text"], "from py", "{context}");
        assert_eq!(results[1]["isError"], false, "{context}");
        assert_eq!(results[2]["text"], "from ts", "{context}");
        let unprefixed = &results[3];
        assert_eq!(gateway_code(unprefixed), Some("unknown_tool"), "{context}");
        let text = unprefixed["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("`py__echo`") && text.contains("`ts__echo`"),
            "suggestions name both: {context}"
        );
        let hidden = &results[4];
        assert_eq!(gateway_code(hidden), Some("unknown_tool"), "{context}");
        let offered = hidden["meta"]["portcullis/error"]["permitted"].to_string();
        assert!(
            offered.contains("ts__echo") && !offered.contains("book_flight"),
            "a hidden tool is never offered; {context}"
        );
        assert_eq!(
            gateway_code(&results[5]),
            Some("invalid_arguments"),
            "{context}"
        );
        assert_eq!(gateway_code(&results[6]), Some("unknown_tool"), "{context}");
        let expected_runs = vec!["echo".to_string(); n + 1];
        assert_eq!(
            py.ran(),
            expected_runs,
            "py ran only the valid echo calls; {context}"
        );
        assert_eq!(
            ts.ran(),
            expected_runs,
            "ts ran only the valid echo calls; {context}"
        );
    }
    gateway.stop().await;
    py.stop().await;
    ts.stop().await;
}

#[tokio::test]
async fn prompts_and_resources_of_every_server_are_merged_and_routed() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    let everything = PeerServer::start(Peer::Everything).await;
    let gateway = TestGateway::start(
        &[("py", &py.url), ("everything", &everything.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    let url = gateway.merged_url();
    let first = sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        ALICE,
        json!([{"op": "prompts"}, {"op": "resources"}, {"op": "ping"}]),
    )
    .await;
    let prompts = first[0]["prompts"].as_array().cloned().unwrap_or_default();
    assert!(
        prompts.iter().any(|p| p == "everything__simple-prompt"),
        "{first:#?}"
    );
    let resources = first[1]["resources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let static_uri = resources
        .iter()
        .filter_map(Value::as_str)
        .find(|u| u.starts_with("demo://resource/static/"))
        .unwrap_or_else(|| panic!("a static resource is listed: {first:#?}"))
        .to_owned();
    assert!(
        first[1]["templates"].as_array().is_some_and(|t| t
            .iter()
            .any(|t| t == "demo://resource/dynamic/text/{resourceId}")),
        "{first:#?}"
    );
    assert_eq!(first[2]["pong"], true);
    let second = sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        ALICE,
        json!([
            {"op": "prompt", "name": "everything__simple-prompt"},
            {"op": "read", "uri": static_uri},
            {"op": "read", "uri": "demo://resource/dynamic/text/7"},
            {"op": "read", "uri": "demo://nowhere/1"},
            {"op": "prompt", "name": "simple-prompt"},
            call("everything__echo", json!({"message": "merged"})),
        ]),
    )
    .await;
    let context = format!("{second:#?}");
    assert!(
        second[0]["texts"].as_array().is_some_and(|t| !t.is_empty()),
        "{context}"
    );
    assert!(
        second[1]["texts"].as_array().is_some_and(|t| !t.is_empty()),
        "{context}"
    );
    assert!(
        second[2]["texts"].to_string().contains('7'),
        "a templated URI is routed to its server: {context}"
    );
    assert!(
        second[3]["error"].is_string(),
        "an unknown URI is not found: {context}"
    );
    assert!(
        second[4]["error"].is_string(),
        "a prompt needs its prefix: {context}"
    );
    assert!(
        second[5]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("merged"),
        "{context}"
    );
    gateway.stop().await;
    py.stop().await;
    everything.stop().await;
}

#[tokio::test]
async fn a_merged_session_belongs_to_its_client_and_an_unreachable_server_is_left_out() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = PeerServer::start(Peer::Python).await;
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}/mcp", l.local_addr().expect("addr"))
    };
    let gateway = TestGateway::start(
        &[("py", &py.url), ("gone", &closed)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await;
    let url = gateway.merged_url();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let alice = format!("Bearer {ALICE}");
    let opened = raw_post(&url, &[("authorization", &alice)], init.to_string()).await;
    assert_eq!(opened.status, 200, "{}", opened.text);
    let result = &opened.body["result"];
    assert_eq!(result["protocolVersion"], "2025-11-25");
    assert_eq!(result["serverInfo"]["name"], "portcullis");
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    let session = opened.headers["mcp-session-id"]
        .to_str()
        .expect("session id")
        .to_owned();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let session_headers = |key: &str| {
        vec![
            ("authorization", format!("Bearer {key}")),
            ("mcp-session-id", session.clone()),
            ("mcp-protocol-version", "2025-11-25".to_owned()),
        ]
    };
    let listed = raw_post(&url, &borrow(&session_headers(ALICE)), list.clone()).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let tools: Vec<&str> = listed.body["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(tools.contains(&"py__echo"), "{tools:?}");
    assert!(tools.iter().all(|t| t.starts_with("py__")), "{tools:?}");
    let stolen = raw_post(&url, &borrow(&session_headers(BOB)), list).await;
    assert_eq!(
        stolen.status, 404,
        "another client's merged session: {}",
        stolen.text
    );
    let unknown = raw_post(
        &url,
        &borrow(&session_headers(ALICE)),
        json!({"jsonrpc": "2.0", "id": 3, "method": "no/such/method"}).to_string(),
    )
    .await;
    assert_eq!(unknown.body["error"]["code"], -32601, "{}", unknown.text);
    assert!(py.ran().is_empty());
    gateway.stop().await;
    py.stop().await;
}

#[test]
fn a_server_name_that_would_make_merged_names_ambiguous_is_refused() {
    for name in ["a__b", "a_"] {
        let text = format!("[servers.{name}]\nurl = \"http://127.0.0.1:1/mcp\"\n");
        let err = portcullis::config::load_str(&text, "p.toml", &|_| None)
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("may not contain `__` or end with `_`"),
            "{err}"
        );
        assert!(err.contains(&format!("servers.{name}")), "{err}");
    }
}
