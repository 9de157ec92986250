//! The audit says what a resource or prompt use was about, through the
//! official Python SDK server with the conformance fixtures: the admin API's
//! event of each `resources/read` carries the resource's canonical URI as
//! forwarded (its query included), whether the read was served, refused by
//! a rule (-31022), hidden (answered as a missing resource) or refused for
//! its spelling (then the URI as sent); a `prompts/get` carries the
//! prompt's name (in the merged view, the name its server knows, beside
//! the server); a `completion/complete` its reference; a refused
//! `subscriptions/listen` the URIs it asked for. None of them names a
//! tool. A fleet's PostgreSQL table written before the subject existed
//! gains its column, keeps its rows, and the admin API reads the new rows'
//! subjects from it.

use crate::support;
use support::config::Config;
use support::tiers::{self, Tier};

use serde_json::{Value, json};
use support::fleet::eventually;
use support::postgres::PostgresServer;
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
    // A listen one of whose URIs is hidden: refused whole, as a missing resource.
    let uris = json!(["test://static-text", "TEST://static-binary"]);
    let params = json!({"notifications": {"resourceSubscriptions": uris}});
    let listen = ask(&url, "subscriptions/listen", None, params).await;
    assert!(listen["error"].is_object(), "{listen}");
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
    let listens = uses(&events, "subscriptions/listen");
    assert_eq!(
        listens,
        [(
            on_py.clone(),
            json!("test://static-text test://static-binary"),
            json!("not_found")
        )],
    );
    let completions = uses(&events, "completion/complete");
    assert_eq!(completions[0].1, "users://bob/profile", "{completions:?}");
    gateway.stop().await;
    py.stop().await;
}

/// The fleet's table as the first release made it, with its migration noted
/// and one row of the day (older ones retention would delete).
const FIRST_SCHEMA: &str = "CREATE TABLE portcullis_events (
        id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL UNIQUE, replica TEXT NOT NULL,
        time_ms BIGINT NOT NULL, trace_id TEXT, client TEXT, server TEXT,
        method TEXT NOT NULL, tool TEXT, decision TEXT NOT NULL, stage TEXT NOT NULL,
        would_refuse TEXT, violations TEXT NOT NULL DEFAULT '[]',
        sanitizer TEXT NOT NULL DEFAULT '{}', pin_findings TEXT, upstream_status INTEGER,
        upstream_latency_us BIGINT, latency_us BIGINT NOT NULL, http_status INTEGER,
        era TEXT NOT NULL, arguments TEXT, approval TEXT);
    CREATE TABLE portcullis_migrations (version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL);
    INSERT INTO portcullis_migrations VALUES (1, 0);
    INSERT INTO portcullis_events (key, replica, time_ms, method, decision, stage, latency_us, era)
        VALUES ('old:1', 'gw-old', (extract(epoch from now()) * 1000)::bigint, 'resources/read', 'forwarded', 'forwarded', 1, '2026-07-28');";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_table_of_the_first_schema_gains_the_subject_and_keeps_its_rows() {
    if !tiers::ready(&[Tier::Python, Tier::Postgres]) {
        return;
    }
    let pg = PostgresServer::start();
    pg.query(FIRST_SCHEMA);
    let py = PeerServer::start(Peer::PythonFixtures).await;
    let config = Config::new()
        .gateway("replica", "gw-new")
        .server("py", &py.url)
        .set("timeout", "20s")
        .clients()
        .admin_token(ADMIN_TOKEN)
        .raw(RULES)
        .section("audit")
        .set("backend", "postgres")
        .set("url", pg.url());
    let gateway = TestGateway::start_config(&config).await;
    let served = read(&gateway.url("py"), "LOGS://api?level=warn").await;
    assert!(served["result"].is_object(), "{served}");
    let hidden = read(&gateway.url("py"), "test://static-binary").await;
    assert!(hidden["error"].is_object(), "{hidden}");

    let new_rows = "SELECT count(*) FROM portcullis_events WHERE replica = 'gw-new'";
    let landed = eventually(std::time::Duration::from_secs(20), || {
        pg.count(new_rows) == 2
    })
    .await;
    assert!(landed, "{} rows", pg.count(new_rows));
    let rows = pg.query(
        "SELECT string_agg(replica || ' ' || coalesce(subject, '-'), ', ' ORDER BY id) \
         FROM portcullis_events",
    );
    assert_eq!(
        rows,
        "gw-old -, gw-new logs://api?level=warn, gw-new test://static-binary"
    );
    assert_eq!(
        pg.count("SELECT max(version) FROM portcullis_migrations"),
        3,
        "every later migration applied (3 adds `retries`)"
    );
    // The dashboard's API reads the fleet's rows, subjects included.
    let events = gateway.admin(ADMIN_TOKEN).events().await;
    let subjects: Vec<&Value> = (events.iter())
        .filter(|e| e["replica"] == "gw-new")
        .map(|e| &e["subject"])
        .collect();
    assert_eq!(subjects.len(), 2, "{events:#?}");
    assert!(
        subjects.contains(&&json!("logs://api?level=warn")),
        "{events:#?}"
    );
    assert!(
        subjects.contains(&&json!("test://static-binary")),
        "{events:#?}"
    );
    gateway.stop().await;
    py.stop().await;
}
