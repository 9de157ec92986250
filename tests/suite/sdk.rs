//! Both eras end to end through the gateway, with the official SDK clients in
//! front and the official SDK servers (and server-everything) behind.

use crate::support;
use support::tiers::{self, Tier};

use serde_json::json;
use support::{
    ALICE, Mode, Peer, PeerServer, Sdk, TestGateway, allow_all, call, clients, list, sdk,
};

async fn gateway_for(peer: &PeerServer) -> TestGateway {
    TestGateway::start(
        &[("up", &peer.url)],
        &format!("{}{}", clients(), allow_all()),
    )
    .await
}

/// List, a valid call, a call with progress over SSE, and a schema-violating call
/// the upstream never sees.
async fn story(peer: Peer, client: Sdk, mode: Mode) {
    let server = PeerServer::start(peer).await;
    let gateway = gateway_for(&server).await;
    let ops = json!([
        list(),
        call("echo", json!({"text": "hello through the gateway"})),
        {"op": "call", "name": "progress", "args": {"steps": 3}, "progress": true},
        call("book_flight", json!({"origin": "paris", "destination": "LHR", "date": "2026-12-01", "passengers": 2})),
        call("book_flight", json!({"origin": "CDG", "destination": "LHR", "date": "2026-12-01", "passengers": 2})),
    ]);
    let r = sdk(client, mode, &gateway.url("up"), ALICE, ops).await;
    let tools = r[0]["tools"].as_array().expect("a tool list");
    assert!(
        tools.contains(&json!("echo")) && tools.contains(&json!("book_flight")),
        "{r:?}"
    );
    assert_eq!(r[1]["text"], "hello through the gateway", "{r:?}");
    assert_eq!(r[1]["isError"], false);
    assert_eq!(r[2]["text"], "done 3", "{r:?}");
    let progress = r[2]["progress"].as_array().expect("progress values");
    assert_eq!(
        progress.len(),
        3,
        "every progress notification reaches the client: {r:?}"
    );
    assert_eq!(r[3]["isError"], true, "{r:?}");
    assert_eq!(
        support::gateway_code(&r[3]),
        Some("invalid_arguments"),
        "{r:?}"
    );
    assert!(
        r[3]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("/origin: expected a string matching the pattern ^[A-Z]{3}$, got \"paris\""),
        "{r:?}"
    );
    assert_eq!(r[4]["isError"], false, "{r:?}");
    // The upstream ran the valid calls only.
    assert_eq!(server.ran(), vec!["echo", "progress", "book_flight"]);
    assert_eq!(server.calls()[2]["arguments"]["origin"], "CDG");
    gateway.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_legacy_to_python_server() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    story(Peer::Python, Sdk::Python, Mode::Legacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_2026_to_python_server() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    story(Peer::Python, Sdk::Python, Mode::Modern).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_legacy_to_typescript_server() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    story(Peer::TypeScript, Sdk::TypeScript, Mode::Legacy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_2026_to_typescript_server() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    story(Peer::TypeScript, Sdk::TypeScript, Mode::Modern).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_2026_to_python_server() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    story(Peer::Python, Sdk::TypeScript, Mode::Modern).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_2026_to_stateless_python_server() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    story(Peer::PythonStateless, Sdk::Python, Mode::Modern).await;
}

/// server-everything speaks the handshake era, declares draft-07 on every
/// tool, and streams with priming events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_through_the_gateway() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let server = PeerServer::start(Peer::Everything).await;
    let gateway = gateway_for(&server).await;
    for client in [Sdk::Python, Sdk::TypeScript] {
        let ops = json!([
            list(),
            call("echo", json!({"message": "hi"})),
            call("echo", json!({"message": 5})),
            call("echo", json!({}))
        ]);
        let r = sdk(client, Mode::Legacy, &gateway.url("up"), ALICE, ops).await;
        let tools = r[0]["tools"].as_array().expect("a tool list");
        assert!(
            tools.len() > 5 && tools.contains(&json!("echo")),
            "{client:?}: {r:?}"
        );
        assert_eq!(r[1]["text"], "Echo: hi", "{client:?}: {r:?}");
        assert_eq!(
            support::gateway_code(&r[2]),
            Some("invalid_arguments"),
            "{client:?}: {r:?}"
        );
        assert!(
            r[2]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("/message: expected a value of type string, got 5"),
            "{r:?}"
        );
        assert_eq!(
            support::gateway_code(&r[3]),
            Some("invalid_arguments"),
            "{client:?}: {r:?}"
        );
        assert!(
            r[3]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("/message: expected a value (this property is required)"),
            "{r:?}"
        );
    }
    gateway.stop().await;
    server.stop().await;
}
