//! stdio servers: the gateway spawns the Python SDK peer and server-everything
//! in stdio mode and serves them over HTTP to real SDK clients, with every
//! check of the HTTP path; it restarts a child that dies and stops it at shutdown.

use crate::support;
use support::Config;
use support::tiers::{self, Tier};

use std::time::Duration;

use serde_json::{Value, json};
use support::{
    ALICE, Mode, Peer, Sdk, StdioPeer, TestGateway, alive, allow_all, call, clients, gateway_code,
    list, sdk,
};

async fn gateway(servers: &[&StdioPeer]) -> TestGateway {
    TestGateway::start_stdio(servers, &format!("{}{}", clients(), allow_all())).await
}

fn kill(pid: u64) {
    support::signal(pid, "KILL");
}

/// Twenty clients at once, each in its own session (or none, in the 2026
/// era) and each numbering its requests from the start, share one process:
/// every client gets exactly its own answers back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_clients_share_one_process_and_get_their_own_answers() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = StdioPeer::new(Peer::Python, "py");
    let gw = gateway(&[&server]).await;
    let url = gw.url("py");
    let clients = (0..20).map(|i| {
        let url = url.clone();
        async move {
            let mode = if i % 2 == 0 {
                Mode::Legacy
            } else {
                Mode::Modern
            };
            let ops: Vec<Value> = (0..3)
                .map(|j| call("echo", json!({"text": format!("client {i} call {j}")})))
                .collect();
            (i, sdk(Sdk::Python, mode, &url, ALICE, json!(ops)).await)
        }
    });
    let results = futures_util::future::join_all(clients).await;
    for (i, r) in &results {
        let texts: Vec<&str> = r
            .iter()
            .map(|x| x["text"].as_str().unwrap_or("?"))
            .collect();
        let expected: Vec<String> = (0..3).map(|j| format!("client {i} call {j}")).collect();
        assert_eq!(texts, expected, "client {i}: {r:?}");
    }
    assert_eq!(
        server.ran().iter().filter(|t| *t == "echo").count(),
        60,
        "one process ran every call once"
    );
    gw.stop().await;
}

/// The gateway validates against the schema the child listed; a call that
/// violates it is answered by the gateway and never written to the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_violating_call_never_reaches_the_child() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let server = StdioPeer::new(Peer::Python, "py");
    let gw = gateway(&[&server]).await;
    let valid =
        json!({"origin": "CDG", "destination": "JFK", "date": "2026-12-01", "passengers": 2});
    let invalid =
        json!({"origin": "Paris", "destination": "JFK", "date": "2026-12-01", "passengers": 12});
    let r = sdk(
        Sdk::TypeScript,
        Mode::Legacy,
        &gw.url("py"),
        ALICE,
        json!([
            list(),
            call("book_flight", invalid),
            call("book_flight", valid)
        ]),
    )
    .await;
    assert!(
        r[0]["tools"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("book_flight"))),
        "{r:?}"
    );
    assert_eq!(gateway_code(&r[1]), Some("invalid_arguments"), "{r:?}");
    assert!(r[1]["isError"] == true, "{r:?}");
    assert_eq!(r[2]["isError"], false, "{r:?}");
    let ran = server.calls();
    assert_eq!(ran.len(), 1, "only the valid call ran: {ran:?}");
    assert_eq!(ran[0]["arguments"]["origin"], "CDG");
    gw.stop().await;
}

/// A stdio server answers with messages, not HTTP: the audit event of a call
/// it served records no upstream status (none is made up for it), and the
/// client still gets HTTP 200 with the tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_answer_is_recorded_without_an_http_status() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = StdioPeer::new(Peer::Python, "py");
    let gw = gateway(&[&server]).await;
    let answered =
        support::tools_call(&gw.url("py"), ALICE, "echo", json!({"text": "hi"}), &[]).await;
    assert_eq!(answered.status, 200, "{:?}", answered.body);
    assert_eq!(
        answered.body["result"]["isError"], false,
        "{}",
        answered.body
    );
    let events = format!("{}/api/events?decision=forwarded", gw.admin_url());
    let mut listed = Value::Null;
    for _ in 0..50 {
        listed = support::http()
            .get(&events)
            .send()
            .await
            .expect("events")
            .text()
            .await
            .map(|t| serde_json::from_str(&t).unwrap_or(Value::Null))
            .expect("text");
        if listed["events"].as_array().is_some_and(|e| !e.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let call = listed["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["tool"] == "echo"))
        .unwrap_or_else(|| panic!("the call's event: {listed}"));
    assert_eq!(call["upstream_status"], Value::Null, "{call}");
    assert!(call["upstream_latency_us"].is_u64(), "{call}");
    gw.stop().await;
}

/// A child killed in the middle of a call: that call gets `upstream_unavailable`,
/// the gateway starts a new process (and handshakes with it), and the next call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_killed_mid_call_is_reported_and_restarted() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let server = StdioPeer::new(Peer::Python, "py");
    let gw = gateway(&[&server]).await;
    let first = gw.running_pid("py", None).await;
    let url = gw.url("py");
    let hanging = tokio::spawn(async move {
        sdk(
            Sdk::Python,
            Mode::Legacy,
            &url,
            ALICE,
            json!([call("hang", json!({"seconds": 60}))]),
        )
        .await
    });
    // The call is in the child once its body has run.
    for _ in 0..600 {
        if server.ran().contains(&"hang".to_owned()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.ran(), vec!["hang"], "the call reached the child");
    kill(first);
    let r = hanging.await.expect("client task");
    assert_eq!(gateway_code(&r[0]), Some("upstream_unavailable"), "{r:?}");
    assert_eq!(r[0]["isError"], true, "{r:?}");

    let second = gw.running_pid("py", Some(first)).await;
    assert!(!alive(first), "the killed process is gone");
    let (status, body) = gw.readyz().await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["servers"]["py"]["restarts"].as_u64() >= Some(1),
        "{body}"
    );
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gw.url("py"),
        ALICE,
        json!([call("echo", json!({"text": "after the restart"}))]),
    )
    .await;
    assert_eq!(r[0]["text"], "after the restart", "{r:?}");
    assert!(alive(second));
    gw.stop().await;
}

/// server-everything on stdio: both SDK clients list and call through the
/// gateway, and the progress of its long-running tool reaches them as it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_on_stdio_streams_progress_to_the_client() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let server = StdioPeer::new(Peer::Everything, "everything");
    let gw = gateway(&[&server]).await;
    for client in [Sdk::Python, Sdk::TypeScript] {
        let ops = json!([
            list(),
            call("echo", json!({"message": "hi"})),
            call("echo", json!({"message": 5})),
            {"op": "call", "name": "trigger-long-running-operation",
             "args": {"duration": 1, "steps": 4}, "progress": true}
        ]);
        let r = sdk(client, Mode::Legacy, &gw.url("everything"), ALICE, ops).await;
        let tools = r[0]["tools"].as_array().expect("a tool list");
        assert!(tools.contains(&json!("echo")), "{client:?}: {r:?}");
        assert_eq!(r[1]["text"], "Echo: hi", "{client:?}: {r:?}");
        assert_eq!(
            gateway_code(&r[2]),
            Some("invalid_arguments"),
            "{client:?}: {r:?}"
        );
        assert!(
            r[3]["text"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Long running operation completed"),
            "{client:?}: {r:?}"
        );
        let progress: Vec<f64> = r[3]["progress"]
            .as_array()
            .map(|p| p.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        assert_eq!(progress, [1.0, 2.0, 3.0, 4.0], "{client:?}: {r:?}");
    }
    gw.stop().await;
}

/// Shutting the gateway down stops its children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_child() {
    if !tiers::ready(&[Tier::Python, Tier::Node]) {
        return;
    }
    let py = StdioPeer::new(Peer::Python, "py");
    let everything = StdioPeer::new(Peer::Everything, "everything");
    let gw = gateway(&[&py, &everything]).await;
    let pids = [
        gw.running_pid("py", None).await,
        gw.running_pid("everything", None).await,
    ];
    let (status, body) = gw.readyz().await;
    assert_eq!(status, 200, "{body}");
    assert!(pids.iter().all(|p| alive(*p)));
    gw.stop().await;
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived the gateway");
    }
}

/// What a stdio server writes on stderr is in the gateway's log, line by
/// line, with the server's name (the real binary, its JSON log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_lines_reach_the_gateway_log() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    let everything = StdioPeer::new(Peer::Everything, "everything");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("portcullis.toml");
    let text = Config::new()
        .raw(&everything.table)
        .clients()
        .allow_all()
        .memory_stores()
        .render();
    std::fs::write(&path, text).expect("config written");
    let mut child = support::run_binary(&path, &[]);
    let (_mcp, _admin, mut log) = support::listening_log(&mut child).await;
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = log.recv().await {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["message"] == "stdio server stderr"
                && v["server"] == "everything"
                && v["line"]
                    .as_str()
                    .is_some_and(|l| l.contains("Starting default (STDIO) server"))
            {
                return Some(v);
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    assert!(found.is_some(), "the child's stderr line is in the log");
    let _ = child.kill().await;
}

/// The child sees `PATH`, `HOME`, `LANG` and its own `env`, not the rest of
/// the gateway's environment (here: the variables cargo sets for the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_gets_a_minimal_environment() {
    if !tiers::ready(&[Tier::Node]) {
        return;
    }
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let mut everything = StdioPeer::new(Peer::Everything, "everything");
    everything
        .table
        .push_str("env = { PORTCULLIS_CHILD_VAR = \"given\" }\n");
    let gw = gateway(&[&everything]).await;
    let r = sdk(
        Sdk::TypeScript,
        Mode::Legacy,
        &gw.url("everything"),
        ALICE,
        json!([call("get-env", json!({}))]),
    )
    .await;
    let env: Value = serde_json::from_str(r[0]["text"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("get-env answers JSON ({e}): {r:?}"));
    assert_eq!(env["PORTCULLIS_CHILD_VAR"], "given", "{env}");
    assert!(env.get("PATH").is_some(), "{env}");
    assert!(env.get("CARGO_MANIFEST_DIR").is_none(), "{env}");
    gw.stop().await;
}

/// A command that keeps failing is restarted with a growing delay, `/readyz`
/// says so, and calls get `upstream_unavailable` instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_is_restarted_and_calls_do_not_hang() {
    let text = Config::new()
        .section("servers.crashy")
        .set("command", vec!["sh", "-c", "echo failing >&2; exit 3"])
        .set("timeout", "2s")
        .clients()
        .allow_all()
        .render();
    let gw = TestGateway::start_raw(&text).await;
    let mut seen = Value::Null;
    for _ in 0..200 {
        let (status, body) = gw.readyz().await;
        assert_eq!(status, 503, "never ready: {body}");
        if body["servers"]["crashy"]["restarts"].as_u64() >= Some(3) {
            seen = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen["ready"], false, "{seen}");
    assert_ne!(seen["servers"]["crashy"]["state"], "running", "{seen}");

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "anything", "arguments": {}}});
    let r = support::raw_post(
        &gw.url("crashy"),
        &[("authorization", &format!("Bearer {ALICE}"))],
        body.to_string(),
    )
    .await;
    assert_eq!(r.body["result"]["isError"], true, "{}", r.text);
    assert_eq!(
        r.body["result"]["_meta"]["portcullis/error"]["code"], "upstream_unavailable",
        "{}",
        r.text
    );
    gw.stop().await;
}

/// A reload that changes a stdio server replaces its process (the old one is
/// stopped); a reload that leaves the server as it was keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_replaces_only_a_changed_process() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = StdioPeer::new(Peer::Python, "py");
    let text = |timeout: &str, tools: &str| {
        Config::new()
            .admin_token("admin-token")
            .raw(
                &py.table
                    .replace("timeout = \"20s\"", &format!("timeout = \"{timeout}\"")),
            )
            .clients()
            .allow(&[])
            .set_raw("tools", &format!("[{tools}]"))
            .memory_stores()
            .render()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("portcullis.toml");
    std::fs::write(&path, text("20s", "\"echo\"")).expect("write");
    support::init();
    let gw = TestGateway::from_handle(
        portcullis::Gateway::start_file(&path)
            .await
            .expect("gateway starts"),
    );
    let first = gw.running_pid("py", None).await;
    let reload = |text: String| {
        let aside = path.with_extension("toml.tmp");
        std::fs::write(&aside, text).expect("write");
        std::fs::rename(&aside, &path).expect("rename");
    };
    let reloaded = || async {
        support::http()
            .post(format!("{}/api/reload", gw.admin_url()))
            .bearer_auth("admin-token")
            .send()
            .await
            .expect("reload answers")
            .status()
            .as_u16()
    };

    // A policy change only: the same process serves on.
    reload(text("20s", "\"echo\", \"hang\""));
    assert_eq!(reloaded().await, 200);
    assert_eq!(gw.running_pid("py", None).await, first);

    // The server's own settings change: a new process, and the old one ends.
    reload(text("25s", "\"echo\""));
    assert_eq!(reloaded().await, 200);
    let second = gw.running_pid("py", Some(first)).await;
    for _ in 0..200 {
        if !alive(first) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(first), "the replaced process was stopped");
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gw.url("py"),
        ALICE,
        json!([call("echo", json!({"text": "from the new process"}))]),
    )
    .await;
    assert_eq!(r[0]["text"], "from the new process", "{r:?}");
    gw.stop().await;
    assert!(!alive(second));
}

/// A line from the child longer than `max_response_bytes` is never buffered
/// whole: the call it answers gets `upstream_protocol_error`, and the process
/// serves the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_longer_than_the_cap_is_refused_and_the_process_serves_on() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let py = StdioPeer::new(Peer::Python, "py");
    let text = Config::new()
        .gateway("max_response_bytes", 65536)
        .raw(&py.table)
        .clients()
        .allow_all()
        .render();
    let gw = TestGateway::start_raw(&text).await;
    let r = sdk(
        Sdk::Python,
        Mode::Legacy,
        &gw.url("py"),
        ALICE,
        json!([
            call("huge", json!({"size": 200_000})),
            call("huge", json!({"size": 1000}))
        ]),
    )
    .await;
    assert_eq!(
        gateway_code(&r[0]),
        Some("upstream_protocol_error"),
        "{r:?}"
    );
    assert_eq!(r[1]["text"].as_str().map(str::len), Some(1000), "{r:?}");
    assert_eq!(py.ran(), vec!["huge", "huge"]);
    gw.stop().await;
}

/// A grandchild that left the server's process group (`setsid`) does not
/// outlive the gateway: the Python SDK server, started by a shell that
/// first detaches a sleeper into a session of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_that_left_the_process_group_ends_at_shutdown() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_file = dir.path().join("sleeper.pid");
    let python = support::peers_dir().join("venv/bin/python");
    let server = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/py_server.py");
    let script = format!(
        "setsid sleep 600 & echo $! > '{}'; exec '{}' '{}' --stdio",
        pid_file.display(),
        python.display(),
        server.display()
    );
    let text = Config::new()
        .section("servers.py")
        .set("command", vec!["sh", "-c", script.as_str()])
        .set("timeout", "20s")
        .clients()
        .allow_all()
        .render();
    let gw = TestGateway::start_raw(&text).await;
    let server_pid = gw.running_pid("py", None).await;
    let sleeper: u64 = std::fs::read_to_string(&pid_file)
        .expect("the sleeper's pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(alive(sleeper) && alive(server_pid));
    let session = |pid: u64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(3)
                    .map(str::to_owned)
            })
    };
    assert_ne!(
        session(sleeper),
        session(server_pid),
        "the sleeper left the group"
    );
    gw.stop().await;
    let outlived = alive(sleeper);
    if outlived {
        kill(sleeper);
    }
    assert!(!alive(server_pid), "the server outlived the gateway");
    assert!(
        !outlived,
        "the setsid grandchild {sleeper} outlived the gateway"
    );
}
