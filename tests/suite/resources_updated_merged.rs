//! The merged view's `subscriptions/listen` carries every member's
//! `notifications/resources/updated`, and each is judged by the member that
//! sent it: a resource one member shows does not let another member's update
//! about the same URI through. Two Python test servers with the conformance
//! fixtures (their tool `announce` publishes an update on every listen stream
//! subscribed to its URI), a 2026-07-28 listen held open through a reload.
//!
//! The same URI on two servers names two resources. Once a reload hides
//! `test://static-text` on `b` (its stream was subscribed to it before),
//! `b`'s word that it changed would tell the client that `b` still has it,
//! however much `a` shows its own. Observe mode lists every resource, so
//! relays every update: the gateway's, for every member; a member's own,
//! for that member.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support;
use portcullis::Gateway;
use serde_json::json;
use support::tiers::{self, Tier};
use support::{ALICE, Config, Peer, PeerServer, TestGateway, modern_call};

const ADMIN_TOKEN: &str = "merged-updates-admin-token";
const TEXT: &str = "test://static-text";
const BINARY: &str = "test://static-binary";
/// A URI no member's rules let the client read.
const NOWHERE: &str = "test://nowhere";

/// Members `a` and `b`; `a` shows `TEXT`, `b` shows `on_b` (`b` in
/// observe mode of its own when `b_observes`); everyone may call `announce`.
fn config(a: &str, b: &str, on_b: &[&str], b_observes: bool) -> Config {
    let rules = format!(
        "[[rules]]\nclients = [\"*\"]\nservers = [\"a\"]\nresources = [\"{TEXT}\"]\naction = \"allow\"\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"b\"]\nresources = {}\naction = \"allow\"\n\
         [[rules]]\nclients = [\"*\"]\nservers = [\"a\", \"b\"]\ntools = [\"announce\"]\naction = \"allow\"\n",
        json!(on_b),
    );
    let mut config = Config::new()
        .admin_token(ADMIN_TOKEN)
        .server("a", a)
        .set("timeout", "20s")
        .set("pinning", "off")
        .server("b", b)
        .set("timeout", "20s")
        .set("pinning", "off");
    if b_observes {
        config = config.set("mode", "observe");
    }
    config.clients().raw(&rules).memory_stores()
}

/// Replaces the file the way editors do: write aside, rename over.
fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("toml.tmp");
    std::fs::write(&aside, text).expect("write");
    std::fs::rename(&aside, path).expect("rename");
}

/// A 2026-era listen on the merged view subscribed to `uris`.
async fn listen(url: &str, uris: &[&str]) -> (Arc<Mutex<String>>, tokio::task::JoinHandle<()>) {
    let open = support::listen(url, ALICE, json!({"resourceSubscriptions": uris})).await;
    (open.seen, open.reader)
}

/// The URIs of the updates the stream carried so far, in order.
fn updated(seen: &Arc<Mutex<String>>) -> Vec<String> {
    let text = seen.lock().expect("lock").clone();
    (text.lines())
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
        .filter(|m| m["method"] == "notifications/resources/updated")
        .filter_map(|m| m["params"]["uri"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until the stream has carried `n` updates, then names them.
async fn until_updated(seen: &Arc<Mutex<String>>, n: usize) -> Vec<String> {
    for _ in 0..200 {
        let uris = updated(seen);
        if uris.len() >= n {
            return uris;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} updates: {}", seen.lock().expect("lock"))
}

/// `tools/call` of `name` on the merged view, 2026 era: it must succeed.
async fn announce(url: &str, name: &str, uri: &str) {
    let body = modern_call(7, name, json!({"uri": uri}));
    let response = support::http()
        .post(url)
        .bearer_auth(ALICE)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(body)
        .send()
        .await
        .expect("call");
    let text = response.text().await.expect("body");
    assert!(
        text.contains("announced") && text.contains("\"isError\":false"),
        "{name}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_update_is_judged_by_that_member_on_the_merged_listen() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let a = PeerServer::start(Peer::PythonFixtures).await;
    let b = PeerServer::start(Peer::PythonFixtures).await;
    support::init();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(
        &path,
        config(&a.url, &b.url, &[TEXT, BINARY], false).render(),
    )
    .expect("write");
    let handle = Gateway::start_file(&path).await.expect("gateway starts");
    let gateway = TestGateway::from_handle(handle);
    let url = gateway.merged_url();

    // Both members may show TEXT: both are subscribed to it.
    let (seen, reader) = listen(&url, &[TEXT, BINARY]).await;
    let acknowledged = "notifications/subscriptions/acknowledged";
    for _ in 0..200 {
        if seen.lock().expect("lock").contains(acknowledged) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen.lock().expect("lock").contains(acknowledged),
        "the listen stream was never acknowledged: {}",
        seen.lock().expect("lock")
    );
    announce(&url, "b__announce", TEXT).await;
    assert_eq!(until_updated(&seen, 1).await, [TEXT], "b shows it still");

    // The reload hides TEXT on b; a still shows its own.
    replace(&path, &config(&a.url, &b.url, &[BINARY], false).render());
    gateway.admin(ADMIN_TOKEN).reloaded().await;

    // b's update about TEXT is sent before its update about BINARY, on the
    // same upstream stream: once BINARY is here, TEXT was judged.
    announce(&url, "b__announce", TEXT).await;
    announce(&url, "b__announce", BINARY).await;
    assert_eq!(
        until_updated(&seen, 2).await,
        [TEXT, BINARY],
        "b's update of a resource b hides is dropped, though a shows that URI"
    );
    // a's own update about TEXT is a's to give.
    announce(&url, "a__announce", TEXT).await;
    assert_eq!(until_updated(&seen, 3).await, [TEXT, BINARY, TEXT]);

    reader.abort();
    gateway.stop().await;
    a.stop().await;
    b.stop().await;
}

/// Observe mode shows every resource, so the merged listen relays every
/// update of a member in observe mode (the gateway's, or the member's own
/// while the gateway enforces): `b`'s about a URI its rules would hide
/// included, and a URI no member's rules allow is still asked of a member in
/// observe mode (its refusal recorded, not enforced), not refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_relays_every_members_update_on_the_merged_listen() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let a = PeerServer::start(Peer::PythonFixtures).await;
    let b = PeerServer::start(Peer::PythonFixtures).await;
    let gateway_observes = config(&a.url, &b.url, &[BINARY], false).gateway("mode", "observe");
    for observing in [config(&a.url, &b.url, &[BINARY], true), gateway_observes] {
        observed(&observing).await;
    }
    a.stop().await;
    b.stop().await;
}

/// `b` announces `TEXT`, which its rules hide, `NOWHERE`, which every rule
/// hides, then `BINARY`: the merged listen of a gateway configured with
/// `observing` carries all three.
async fn observed(observing: &Config) {
    let gateway = TestGateway::start_config(observing).await;
    let url = gateway.merged_url();
    let (seen, reader) = listen(&url, &[TEXT, NOWHERE, BINARY]).await;
    for _ in 0..200 {
        if seen
            .lock()
            .expect("lock")
            .contains("notifications/subscriptions/acknowledged")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    announce(&url, "b__announce", TEXT).await;
    announce(&url, "b__announce", NOWHERE).await;
    announce(&url, "b__announce", BINARY).await;
    assert_eq!(until_updated(&seen, 3).await, [TEXT, NOWHERE, BINARY]);
    reader.abort();
    gateway.stop().await;
}
