//! Conditions on resource and prompt rules, through the official Python SDK
//! client in both eras against the Python test server with the conformance
//! fixtures (`test://static-text`, `test://static-binary`, the template
//! `users://{user_id}/profile`, the prompts `test_simple_prompt` and
//! `test_prompt_with_arguments`), per server and through the merged view,
//! with JWTs of two teams.
//!
//! A condition over `uri` and the token's claims is decided in the
//! resource list as in the read: each token's list shows what its reads
//! get, and a read its list hides is answered as a missing resource and
//! never reaches the server. A condition over a prompt's `arguments` keeps
//! the prompt listed and decides each `prompts/get`: a get it refuses gets
//! `call_not_permitted` (-31022) naming the rule, one whose condition fails
//! gets `rule_expression_failed`, neither reaches the server, and the audit
//! says which rule and why. A condition over the session's flow labels keeps
//! a resource listed and refuses its read once the session holds the label.

use crate::support;
use support::config::Config;
use support::tiers::{self, Tier};

use std::io::Write as _;

use serde_json::{Value, json};
use support::jwt::{Signer, claims, jwks};
use support::{Mode, Peer, PeerServer, Sdk, TestGateway, sdk};

const ISS: &str = "https://idp.example.test/realms/mcp";
const AUD: &str = "https://mcp.example.test/mcp";
const ADMIN_TOKEN: &str = "resource-conditions-admin-token";

/// The gateway's code for a refused use of a resource or a prompt.
const USE_NOT_PERMITTED: i64 = -31022;

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
resources = ["users://*"]
action = "allow"
when = "uri.startsWith('users://' + claims.team + '/') && method == 'resources/read'"

[[rules]]
clients = ["*"]
servers = ["py"]
prompts = ["test_prompt_with_arguments"]
action = "allow"
when = "prompt.startsWith('test_') && arguments.arg1 == claims.team"

[[rules]]
clients = ["*"]
servers = ["py"]
prompts = ["test_simple_prompt"]
action = "allow"
when = "claims.team == 'ops' && method == 'prompts/get'"
"#;

fn read(uri: &str) -> Value {
    json!({"op": "read", "uri": uri})
}

fn prompt(name: &str, args: Value) -> Value {
    json!({"op": "prompt", "name": name, "args": args})
}

fn sorted(result: &Value, key: &str) -> Vec<String> {
    let mut v: Vec<String> = (result[key].as_array().into_iter().flatten())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

/// Asserts the op was answered with content, not an error.
fn served(result: &Value, what: &str) {
    assert!(result["error"].is_null(), "{what}: {result}");
    assert!(result["texts"].is_array(), "{what}: {result}");
}

/// Asserts the op was refused as a missing resource or prompt is.
fn missing(result: &Value, what: &str) {
    assert_eq!(result["code"], -32602, "{what}: {result}");
    let text = result["error"].as_str().unwrap_or_default();
    assert!(
        text.contains("not found") || text.contains("Unknown prompt"),
        "{what}: {result}"
    );
}

/// Asserts the op was refused by the condition of `rule`.
fn refused(result: &Value, rule: &str, words: &str, what: &str) {
    assert_eq!(result["code"], USE_NOT_PERMITTED, "{what}: {result}");
    let text = result["error"].as_str().unwrap_or_default();
    assert!(text.contains(rule), "{what}: {result}");
    assert!(text.contains(words), "{what}: {result}");
}

/// How many `prompts/get` requests reached the server.
fn gets(server: &PeerServer) -> usize {
    let needle = b"\"prompts/get\"";
    (server.bodies().iter())
        .filter(|b| b.windows(needle.len()).any(|w| w == needle))
        .count()
}

/// The URIs of the `users://` reads the server resolved.
fn user_reads(server: &PeerServer) -> Vec<String> {
    (server.calls().iter())
        .filter(|c| c["tool"] == "read")
        .filter_map(|c| c["arguments"]["uri"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_over_uri_prompt_and_arguments_decide_lists_and_uses_alike() {
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
        .admin_token(ADMIN_TOKEN)
        .raw(&rest);
    let gateway = TestGateway::start_config(&config).await;
    let token = |team: &str, media: &str| {
        let mut c = claims(ISS, AUD, "carol", "");
        c["team"] = team.into();
        c["media"] = media.into();
        key.token(&c)
    };
    let (ops, dev) = (token("ops", "text"), token("dev", "binary"));
    let ops_ops = json!({"arg1": "ops", "arg2": "x"});
    let steps = |prefix: &str| {
        let p = |name: &str| format!("{prefix}{name}");
        json!([
            {"op": "resources"},
            {"op": "prompts"},
            read("test://static-text"),
            read("test://static-binary"),
            read("users://ops/profile"),
            read("users://dev/profile"),
            prompt(&p("test_prompt_with_arguments"), ops_ops.clone()),
            prompt(&p("test_prompt_with_arguments"), json!({"arg1": "dev", "arg2": "x"})),
            prompt(&p("test_simple_prompt"), json!({})),
        ])
    };
    let mut allowed_gets = 0;
    let mut allowed_reads = Vec::new();
    for (url, prefix) in [(gateway.url("py"), ""), (gateway.merged_url(), "py__")] {
        // The merged view routes a URI by the lists its client is shown: no
        // member lists the template of `users://…` to either team, so such a
        // read finds no member there, as its list says.
        let merged = !prefix.is_empty();
        for mode in [Mode::Legacy, Mode::Modern] {
            let at = format!("{mode:?} {url}");
            let o = sdk(Sdk::Python, mode, &url, &ops, steps(prefix)).await;
            // The list shows what the reads get; templates (decided on their
            // text, which no team's prefix starts) are hidden.
            assert_eq!(
                sorted(&o[0], "resources"),
                ["test://static-text"],
                "{at}: {o:?}"
            );
            assert!(sorted(&o[0], "templates").is_empty(), "{at}: {o:?}");
            let listed = [
                format!("{prefix}test_prompt_with_arguments"),
                format!("{prefix}test_simple_prompt"),
            ];
            assert_eq!(sorted(&o[1], "prompts"), listed, "{at}: {o:?}");
            served(&o[2], &at);
            missing(&o[3], &at);
            match merged {
                false => served(&o[4], &at),
                true => missing(&o[4], &at),
            }
            missing(&o[5], &at);
            served(&o[6], &at);
            refused(&o[7], "rules[2]", "arguments.arg1 == claims.team", &at);
            served(&o[8], &at);
            allowed_gets += 2;
            if !merged {
                allowed_reads.push("users://ops/profile");
            }

            let d = sdk(Sdk::Python, mode, &url, &dev, steps(prefix)).await;
            assert_eq!(
                sorted(&d[0], "resources"),
                ["test://static-binary"],
                "{at}: {d:?}"
            );
            // The condition over the arguments is left to the get: listed.
            let listed = [format!("{prefix}test_prompt_with_arguments")];
            assert_eq!(sorted(&d[1], "prompts"), listed, "{at}: {d:?}");
            missing(&d[2], &at);
            served(&d[3], &at);
            missing(&d[4], &at);
            match merged {
                false => served(&d[5], &at),
                true => missing(&d[5], &at),
            }
            refused(&d[6], "rules[2]", "is false", &at);
            served(&d[7], &at);
            missing(&d[8], &at);
            allowed_gets += 1;
            if !merged {
                allowed_reads.push("users://dev/profile");
            }

            // A condition that cannot be evaluated (no `arg1`) denies the get.
            let steps = json!([prompt(
                &format!("{prefix}test_prompt_with_arguments"),
                json!({"arg2": "x"})
            )]);
            let f = sdk(Sdk::Python, mode, &url, &ops, steps).await;
            refused(&f[0], "rules[2]", "could not be evaluated", &at);
        }
    }
    // Only what the rules allowed reached the server.
    assert_eq!(gets(&server), allowed_gets);
    assert_eq!(user_reads(&server), allowed_reads);

    // The audit says which rule refused, and why.
    let admin = gateway.admin(ADMIN_TOKEN);
    let lines = |events: &[Value], decision: &str| -> Vec<String> {
        (events.iter())
            .filter(|e| e["decision"] == decision)
            .flat_map(|e| e["violations"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut events = Vec::new();
    for _ in 0..200 {
        events = admin.events().await;
        if lines(&events, "rule_expression_failed").len() >= 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let denied = lines(&events, "call_not_permitted");
    assert!(
        denied.contains(&"when: false for rules[2]".to_owned()),
        "{denied:?}"
    );
    let failed = lines(&events, "rule_expression_failed");
    assert!(
        failed
            .iter()
            .any(|l| l.starts_with("when: rules[2] failed: ")),
        "{failed:?}"
    );
    gateway.stop().await;
    server.stop().await;
}

/// A condition over the session's flow labels on a resource rule: the list
/// leaves it to the read, and a read it refuses once the session holds the
/// label (set by reading a `private` resource) gets `call_not_permitted` and
/// never reaches the server; in both eras, each client's session its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_the_sessions_labels_refuses_a_listed_read() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let rest = format!(
        "{}\n{}",
        support::clients(),
        r#"
[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["file:///*"]
action = "allow"
when = "!('private' in labels) || uri.startsWith('file:///secret/')"
"#
    );
    let config = Config::new()
        .server("py", &server.url)
        .set("timeout", "20s")
        .raw(&format!(
            "{rest}\n[servers.py.resource_labels]\n\"file:///secret/*\" = {{ source = \"private\" }}\n"
        ));
    let gateway = TestGateway::start_config(&config).await;
    let url = gateway.url("py");
    for (mode, client) in [(Mode::Legacy, support::ALICE), (Mode::Modern, support::BOB)] {
        let at = format!("{mode:?}");
        let steps = json!([
            {"op": "resources"},
            read("file:///public/readme"),
            read("file:///secret/key"),
            read("file:///secret/other"),
            read("file:///public/readme"),
        ]);
        let out = sdk(Sdk::Python, mode, &url, client, steps).await;
        // The condition reads the labels: the template stays listed.
        assert_eq!(
            sorted(&out[0], "templates"),
            ["file:///{+path}"],
            "{at}: {out:?}"
        );
        served(&out[1], &at);
        served(&out[2], &at);
        served(&out[3], &at);
        refused(&out[4], "rules[0]", "is false", &at);
    }
    let reads = ["public/readme", "secret/key", "secret/other"].map(|p| format!("file:///{p}"));
    assert_eq!(user_reads(&server), [reads.clone(), reads].concat());
    gateway.stop().await;
    server.stop().await;
}

/// A template binding query values (`logs://{service}{?level,since}`): an
/// allow rule reads the level, a deny rule the date.
const QUERY_RULES: &str = r#"
[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["logs://*"]
action = "allow"
when = "!has(query.level) || query.level in ['info', 'warn']"

[[rules]]
clients = ["*"]
servers = ["py"]
resources = ["logs://audit"]
action = "deny"
when = "has(query.since) && query.since < '2026'"
"#;

/// Each `logs://` read the server ran: the service's URI and the values it
/// received.
fn log_reads(server: &PeerServer) -> Vec<[String; 3]> {
    (server.calls().iter())
        .filter(|c| c["tool"] == "read")
        .filter(|c| {
            c["arguments"]["uri"]
                .as_str()
                .is_some_and(|u| u.starts_with("logs://"))
        })
        .map(|c| {
            ["uri", "level", "since"].map(|k| c["arguments"][k].as_str().unwrap_or("?").to_owned())
        })
        .collect()
}

/// A condition over a resource URI's `query` judges the values the server
/// receives (the SDK decodes them; the gateway forwards the canonical query it
/// judged), through the official Python SDK client and server in both eras:
/// a read whose level the allow rule refuses, or whose date the deny rule
/// names, gets `call_not_permitted`; a query servers read differently (a
/// name twice, a raw `+`) fails the condition and is refused naming the cause;
/// none of those reaches the server, and what does carries what was judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_over_the_query_judges_the_values_the_server_reads() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = PeerServer::start(Peer::Python).await;
    let config = Config::new()
        .server("py", &server.url)
        .set("timeout", "20s")
        .raw(&format!("{}\n{QUERY_RULES}", support::clients()));
    let gateway = TestGateway::start_config(&config).await;
    let url = gateway.url("py");
    let mut expected = Vec::new();
    for (mode, client) in [(Mode::Legacy, support::ALICE), (Mode::Modern, support::BOB)] {
        let at = format!("{mode:?}");
        let steps = json!([
            read("logs://api"),
            read("logs://api?level=warn"),
            read("logs://api?level=w%61rn"),
            read("logs://api?level=debug"),
            read("logs://api?level=warn&level=debug"),
            read("logs://api?level=warn+debug"),
            read("logs://audit?since=2025-01"),
            read("logs://audit?since=2027-01&level=info"),
            read("logs://api?level=info&since=a%2Bb"),
        ]);
        let out = sdk(Sdk::Python, mode, &url, client, steps).await;
        served(&out[0], &at);
        served(&out[1], &at);
        served(&out[2], &at);
        refused(&out[3], "rules[0]", "is false", &at);
        refused(&out[4], "rules[0]", "names `level` twice", &at);
        refused(&out[5], "rules[0]", "raw `+`", &at);
        refused(&out[6], "rules[1]", "denies", &at);
        served(&out[7], &at);
        served(&out[8], &at);
        let each = |uri: &str, level: &str, since: &str| [uri, level, since].map(str::to_owned);
        expected.extend([
            each("logs://api", "info", ""),
            each("logs://api", "warn", ""),
            each("logs://api", "warn", ""),
            each("logs://audit", "info", "2027-01"),
            // The client's encoded plus reaches the server as a plus.
            each("logs://api", "info", "a+b"),
        ]);
    }
    assert_eq!(log_reads(&server), expected);
    gateway.stop().await;
    server.stop().await;
}
