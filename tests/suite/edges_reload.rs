//! Edges a reload moves: a reload that revokes a client ends its open streams and sessions;
//! a JWT audience binds exactly one configured server or the whole gateway, or is refused,
//! and a reload that would unbind an audience is refused with the reason.

use crate::edges::{ADMIN_TOKEN, http, jwks_file};
use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::path::Path;
use std::time::Duration;

use portcullis::Gateway;
use serde_json::{Value, json};
use support::{ALICE, BOB, Peer, PeerServer, TestGateway};

/// A whole configuration file: server `s`, clients alice and bob (bob only
/// when `with_bob`), and an allow-all rule for `allowed` clients.
fn reload_config(url: &str, allowed: &[&str], with_bob: bool) -> String {
    let mut config = Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("s", url)
        .set("timeout", "20s")
        .set("pinning", "off")
        .client("alice", ALICE);
    if with_bob {
        config = config.client("bob", BOB);
    }
    config
        .client("admin", support::ADMIN)
        .allow_all()
        .set("clients", allowed.to_vec())
        .memory_stores()
        .render()
}

async fn reload(client: &reqwest::Client, admin: &str, path: &Path, text: &str) {
    let aside = path.with_extension("toml.tmp");
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, path).expect("rename");
    let r = client
        .post(format!("{admin}/api/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("reload");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.text().await.unwrap_or_default()
    );
}

/// A legacy session of `key` on `url`: initialize, then initialized.
async fn open_session(client: &reqwest::Client, url: &str, key: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "edges", "version": "1"}}});
    let r = client
        .post(url)
        .bearer_auth(key)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(init.to_string())
        .send()
        .await
        .expect("initialize");
    assert_eq!(r.status().as_u16(), 200);
    let session = r.headers()["mcp-session-id"]
        .to_str()
        .expect("id")
        .to_owned();
    let _ = r.text().await;
    let r = post_in(
        client,
        url,
        key,
        &session,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(r.0, 202);
    session
}

async fn post_in(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    session: &str,
    body: Value,
) -> (u16, String) {
    let r = client
        .post(url)
        .bearer_auth(key)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// The GET stream of a session, open.
async fn get_stream(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    session: &str,
) -> reqwest::Response {
    let r = client
        .get(url)
        .bearer_auth(key)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .expect("GET stream");
    assert_eq!(r.status().as_u16(), 200);
    r
}

/// Reads `stream` until it ends; bounded in chunks and by the client's deadline.
async fn ends(stream: &mut reqwest::Response) -> bool {
    for _ in 0..100 {
        match tokio::time::timeout(Duration::from_secs(10), stream.chunk()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) | Ok(Err(_)) => return true,
            Err(_) => return false,
        }
    }
    false
}

/// A stream that has not ended: data may come or not, but no end does.
async fn still_open(stream: &mut reqwest::Response) -> bool {
    !matches!(
        tokio::time::timeout(Duration::from_millis(300), stream.chunk()).await,
        Ok(Ok(None) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_revokes_ends_the_clients_streams_and_sessions() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, reload_config(&server.url, &["alice", "bob"], true)).expect("write");
    support::init();
    let handle = Gateway::bind_file(&path)
        .await
        .expect("binds")
        .watch_file(false);
    let addr = handle.local_addr().expect("addr");
    let admin_addr = handle.admin_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let gateway = tokio::spawn(handle.run(async move {
        let _ = stopped.await;
    }));
    let (url, admin) = (
        format!("http://{addr}/mcp/s"),
        format!("http://{admin_addr}"),
    );
    // No overall timeout: these streams are meant to stay open.
    let client = support::http();
    let alice = open_session(&client, &url, ALICE).await;
    let bob = open_session(&client, &url, BOB).await;
    let mut alice_stream = get_stream(&client, &url, ALICE, &alice).await;
    let mut bob_stream = get_stream(&client, &url, BOB, &bob).await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});

    // alice stays a client but may use nothing on `s` any more.
    reload(
        &client,
        &admin,
        &path,
        &reload_config(&server.url, &["bob"], true),
    )
    .await;
    assert!(
        ends(&mut alice_stream).await,
        "alice's GET stream ended with her rights"
    );
    let (status, text) = post_in(&client, &url, ALICE, &alice, list.clone()).await;
    assert_eq!(status, 404, "alice's session ended too: {text}");
    let (status, text) = post_in(&client, &url, BOB, &bob, list.clone()).await;
    assert_eq!(status, 200, "bob's session is untouched: {text}");
    assert!(
        still_open(&mut bob_stream).await,
        "bob's stream is untouched"
    );

    // bob is removed from the configuration altogether.
    reload(
        &client,
        &admin,
        &path,
        &reload_config(&server.url, &["alice"], false),
    )
    .await;
    assert!(
        ends(&mut bob_stream).await,
        "bob's GET stream ended with his client"
    );
    let (status, _) = post_in(&client, &url, BOB, &bob, list.clone()).await;
    assert_eq!(status, 401);

    // A stream the new configuration still grants stays open through a reload.
    let alice = open_session(&client, &url, ALICE).await;
    let mut kept = get_stream(&client, &url, ALICE, &alice).await;
    reload(
        &client,
        &admin,
        &path,
        &reload_config(&server.url, &["alice", "bob"], true),
    )
    .await;
    let (status, text) = post_in(&client, &url, ALICE, &alice, list).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        still_open(&mut kept).await,
        "a stream still granted stays open"
    );
    drop(kept);
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), gateway).await;
    server.stop().await;
}

/// Each audience, and what it admits tokens to (`Ok(None)` the whole gateway,
/// `Ok(Some(server))` one server) or the words its refusal must carry.
#[test]
fn an_audience_binds_one_configured_server_or_the_gateway_or_is_refused() {
    let keys = jwks_file();
    let load = |audience: &str| {
        let text = format!(
            "[servers.flights]\nurl = \"http://127.0.0.1:1/mcp\"\n[servers.hotels]\nurl = \"http://127.0.0.1:2/mcp\"\n\
             [auth.jwt]\nissuer = \"https://idp.example.test\"\naudience = {audience}\njwks_file = \"{}\"\n",
            keys.path().display()
        );
        match portcullis::config::load_str(&text, "t.toml", &|_| None) {
            Ok(c) => {
                let jwt = c.clients.jwt().expect("[auth.jwt]");
                let servers = jwt.settings().audiences.iter().map(|a| a.server.clone());
                Ok(servers.collect::<Vec<_>>())
            }
            Err(e) => Err(e.to_string()),
        }
    };
    let bound = |a: &[Option<&str>]| a.iter().map(|s| s.map(str::to_owned)).collect::<Vec<_>>();
    type Bound = Result<Vec<Option<String>>, &'static str>;
    let table: Vec<(&str, Bound)> = vec![
        (
            "\"https://gw.test/mcp/hotels\"",
            Ok(bound(&[Some("hotels")])),
        ),
        ("\"https://gw.test/mcp\"", Ok(bound(&[None]))),
        ("\"https://gw.test\"", Ok(bound(&[None]))),
        ("\"https://gw.test/\"", Ok(bound(&[None]))),
        (
            "[\"https://gw.test/mcp/flights\", \"https://gw.test/mcp/hotels\", \"https://gw.test/mcp\"]",
            Ok(bound(&[Some("flights"), Some("hotels"), None])),
        ),
        (
            "\"https://gw.test/mcp/cars\"",
            Err("`cars`, which is not configured"),
        ),
        (
            "\"https://gw.test/base/mcp/hotels\"",
            Err("none of this gateway's resources"),
        ),
        (
            "\"https://gw.test/mcp/hotels/extra\"",
            Err("none of this gateway's resources"),
        ),
        (
            "\"https://gw.test/api\"",
            Err("none of this gateway's resources"),
        ),
        (
            "\"https://gw.test/mcp/hotels/\"",
            Err("ends in `/`: write it as \"https://gw.test/mcp/hotels\""),
        ),
        ("\"https://gw.test/mcp/\"", Err("ends in `/`")),
        (
            "\"https://gw.test/mcp/hotels?tenant=1\"",
            Err("has a query"),
        ),
        (
            "\"https://gw.test/mcp/HOTELS\"",
            Err("`HOTELS`, which is not configured"),
        ),
        ("\"https://gw.test/mcp/hot%65ls\"", Err("not configured")),
        (
            "[\"https://gw.test/mcp/flights\", \"https://gw.test/mcp/cars\"]",
            Err("`cars`, which is not configured"),
        ),
    ];
    for (audience, expected) in table {
        match (load(audience), expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{audience}"),
            (Err(text), Err(words)) => {
                assert!(text.contains("auth.jwt.audience"), "{audience}: {text}");
                assert!(text.contains(words), "{audience}: {text}");
            }
            (got, want) => panic!("{audience}: got {got:?}, want {want:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_would_unbind_an_audience_is_refused_with_the_reason() {
    let keys = jwks_file();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("portcullis.toml");
    let text = |servers: &str| {
        Config::new()
            .admin_token(ADMIN_TOKEN)
            .raw(servers)
            .section("auth.jwt")
            .set("issuer", "https://idp.example.test")
            .set("audience", "https://gw.test/mcp/hotels")
            .set("jwks_file", keys.path().display().to_string())
            .memory_stores()
            .render()
    };
    let both = "[servers.flights]\nurl = \"http://127.0.0.1:1/mcp\"\n[servers.hotels]\nurl = \"http://127.0.0.1:2/mcp\"\n";
    let flights_only = "[servers.flights]\nurl = \"http://127.0.0.1:1/mcp\"\n";
    std::fs::write(&path, text(both)).expect("write");
    support::init();
    let handle = Gateway::start_file(&path).await.expect("starts");
    let gateway = TestGateway::from_handle(handle);
    std::fs::write(&path, text(flights_only)).expect("write");
    let client = http();
    let r = client
        .post(format!("{}/api/reload", gateway.admin_url()))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("reload");
    assert_eq!(r.status().as_u16(), 422);
    let report: Value = serde_json::from_str(&r.text().await.unwrap_or_default()).expect("JSON");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("auth.jwt.audience") && error.contains("`hotels`, which is not configured"),
        "{report}"
    );
    gateway.stop().await;
}
