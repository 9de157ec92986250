//! `notifications/resources/updated` names only resources the client's list
//! shows, through the official Python SDK client in both eras against the
//! Python test server with the conformance fixtures (its tool `touch` says
//! on the call's stream that a URI changed), per server and through the
//! merged view, with a JWT whose claims a resource condition reads.
//!
//! A resource hidden from the client answers its read like a missing one; a
//! notification that it changed would tell the client it exists. The server
//! is told to touch a hidden URI (in two spellings) before a shown one: the
//! client sees the shown one only.

use crate::support;
use support::config::Config;
use support::tiers::{self, Tier};

use std::io::Write as _;

use serde_json::{Value, json};
use support::jwt::{Signer, claims, jwks};
use support::{Mode, Peer, PeerServer, Sdk, TestGateway, sdk};

const ISS: &str = "https://idp.example.test/realms/mcp";
const AUD: &str = "https://mcp.example.test/mcp";

const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["test://*"]
action = "allow"
when = "uri == 'test://static-' + claims.media"

[[rules]]
clients = ["*"]
servers = ["py"]
tools = ["touch"]
action = "allow"
"#;

fn touch(name: &str, uri: &str) -> Value {
    json!({"op": "call", "name": name, "args": {"uri": uri}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_a_hidden_resource_never_reaches_the_client() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::PythonFixtures).await;
    let key = Signer::ed25519("ed-1");
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(jwks(&[&key]).as_bytes()).expect("write");
    let rest = format!(
        "[auth.jwt]\nissuer = \"{ISS}\"\naudience = \"{AUD}\"\njwks_file = \"{}\"\n{RULES}",
        file.path().display(),
    );
    // A second member, on which no rule allows anything, makes /mcp the merged view.
    let config = Config::new()
        .server("py", &server.url)
        .set("timeout", "20s")
        .server("other", &server.url)
        .set("timeout", "20s")
        .raw(&rest);
    let gateway = TestGateway::start_config(&config).await;
    let mut c = claims(ISS, AUD, "carol", "");
    c["media"] = "text".into();
    let token = key.token(&c);
    for (url, prefix) in [(gateway.url("py"), ""), (gateway.merged_url(), "py__")] {
        let name = format!("{prefix}touch");
        for mode in [Mode::Legacy, Mode::Modern] {
            let at = format!("{mode:?} {url}");
            let steps = json!([
                {"op": "resources"},
                touch(&name, "test://static-binary"),
                touch(&name, "TEST://static-%62inary"),
                touch(&name, "test://static-text"),
                {"op": "updated", "until": "test://static-text"},
            ]);
            let o = sdk(Sdk::Python, mode, &url, &token, steps).await;
            assert_eq!(
                o[0]["resources"],
                json!(["test://static-text"]),
                "{at}: {o:?}"
            );
            for step in &o[1..4] {
                assert_eq!(step["isError"], false, "{at}: {o:?}");
            }
            // The shown one arrives after both hidden ones were sent.
            assert_eq!(
                o[4]["updated"],
                json!(["test://static-text"]),
                "{at}: {o:?}"
            );
        }
    }
    server.stop().await;
}
