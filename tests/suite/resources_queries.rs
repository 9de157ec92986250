//! A condition over a resource URI's `query` on every method that carries a
//! URI, seen from outside: `resources/subscribe` and `resources/unsubscribe`
//! (handshake era) and each URI of a `subscriptions/listen` (2026-07-28) are
//! judged with the query they forward, as a read is; a completion, which
//! leaves a condition over the query to the read, forwards its resource
//! without the query; a URI whose query would
//! make a server's path climb is refused for its spelling; nothing refused
//! reaches the server, and what does carries the canonical query judged.

use crate::support;

use serde_json::json;
use support::misbehaving::Misbehaving;
use support::*;

use crate::methods::{message, send};

const RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["*"]
resources = ["logs://*", "file:///public/*"]
action = "allow"
when = "!has(query.level) || query.level == 'warn'"
"#;

#[tokio::test]
async fn every_method_carrying_a_uri_judges_its_query() {
    let up = Misbehaving::start().await;
    let gateway = TestGateway::start(&[("m", &up.url)], &format!("{}{RULES}", clients())).await;
    let url = gateway.url("m");
    let refused = |r: &Raw, what: &str| {
        assert!(r.body["error"].is_object(), "{what}: {}", r.text);
        assert!(r.text.contains("rules[0]"), "{what}: {}", r.text);
    };
    for (id, method) in [(1, "resources/subscribe"), (2, "resources/unsubscribe")] {
        let params = json!({"uri": "logs://api?level=debug"});
        let r = send(
            &url,
            Some(ALICE),
            false,
            &message(Some(id), method, params, false),
        )
        .await;
        refused(&r, method);
        let twice = json!({"uri": "logs://api?level=warn&level=debug"});
        let r = send(
            &url,
            Some(ALICE),
            false,
            &message(Some(id), method, twice, false),
        )
        .await;
        refused(&r, method);
        assert!(
            r.text.contains("names `level` twice"),
            "{method}: {}",
            r.text
        );
    }
    // Each URI a listen names is judged with its own query.
    let listen = json!({"notifications": {"resourceSubscriptions": ["logs://api?level=warn", "logs://api?level=debug"]}});
    let r = send(
        &url,
        Some(ALICE),
        true,
        &message(Some(3), "subscriptions/listen", listen, true),
    )
    .await;
    refused(&r, "subscriptions/listen");
    // A query that would make a path climb on a server that reads it into
    // the path (the TypeScript SDK's `file:///{+path}`) is refused for its spelling.
    let climbing = json!({"uri": "file:///public/a?/../../secret"});
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(4), "resources/read", climbing, false),
    )
    .await;
    assert_eq!(r.body["error"]["code"], -31011, "{}", r.text);
    assert_eq!(
        up.methods(),
        Vec::<String>::new(),
        "nothing reached the server"
    );
    // Allowed: forwarded with the canonical query judged, a `?` in it encoded.
    let params = json!({"uri": "logs://api?x?level=debug"});
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(5), "resources/subscribe", params, false),
    )
    .await;
    assert!(
        r.body["error"].is_null() || !r.text.contains("rules[0]"),
        "{}",
        r.text
    );
    assert_eq!(up.methods(), vec!["resources/subscribe".to_owned()]);
    assert!(
        up.received("logs://api?x%3Flevel=debug"),
        "the canonical query is forwarded"
    );
    // A completion leaves a condition over the query to the read, so it
    // forwards the resource it was decided on, without the query.
    let reference = json!({"ref": {"type": "ref/resource", "uri": "logs://api?level=debug"},
        "argument": {"name": "service", "value": "a"}});
    let r = send(
        &url,
        Some(ALICE),
        false,
        &message(Some(6), "completion/complete", reference, false),
    )
    .await;
    assert!(!r.text.contains("rules[0]"), "{}", r.text);
    assert_eq!(
        up.methods().last().map(String::as_str),
        Some("completion/complete")
    );
    assert!(
        !up.received("api?level=debug"),
        "no query the rules did not judge reaches the server"
    );
    gateway.stop().await;
}
