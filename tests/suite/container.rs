//! The image, for real: the repository's Dockerfile built with podman and the image run
//! (host network, read-only root, non-root) in front of a real Python SDK server; it
//! serves a real client, reports healthy, and drains a call in flight on SIGTERM.
//!
//! The base images the Dockerfile names are built from Debian packages on this machine by
//! `tests/container/images.sh` (no image registry is reachable; that script says what it
//! substitutes and why). The container uses the host network and 127.0.0.1 only, on ports
//! this test picks, under a name of this run alone, removed when the test ends whatever
//! happened ([`podman::Cleanup`]). Figures (image size, start to ready) are printed for
//! BENCHMARKS.md / the README. The image is built from the binary this test run compiled
//! (the Dockerfile's `BINARY=host` path): the same Dockerfile stages that lay out the
//! runtime file system, without compiling the dependency tree a second time inside the
//! build. The manifests and the compose file: `container_deploy.rs`.

use crate::support;
use support::podman::{self, ADMIN_TOKEN, AGENT_KEY, free_port, ready, sha256_hex};
use support::tiers::{self, Tier};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Mode, Peer, PeerServer, Sdk, call, gateway_code, list, sdk};

/// A directory the image's user (uid 10001) can write: the state volume.
fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("dir");
    let chown = Command::new("chown")
        .args(["10001:10001"])
        .arg(dir.path())
        .status()
        .expect("chown runs");
    assert!(chown.success());
    dir
}

fn config(gateway: u16, admin: u16, upstream: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:{gateway}"
admin_listen = "127.0.0.1:{admin}"
admin_token_sha256 = "{admin_sha}"
shutdown_grace = "20s"

[servers.tools]
url = "{upstream}"
pinning = "block"

[clients.agent]
api_key_sha256 = "{agent_sha}"

[[rules]]
clients = ["agent"]
servers = ["tools"]
tools = ["*"]
action = "allow"

[pins]
database = "/var/lib/portcullis/pins.db"

[audit]
database = "/var/lib/portcullis/audit.db"
"#,
        admin_sha = sha256_hex(ADMIN_TOKEN),
        agent_sha = sha256_hex(AGENT_KEY),
    )
}

/// Audit rows in the database the container left in its volume: (method, tool, decision).
fn audit_rows(db: &Path) -> Vec<(String, Option<String>, String)> {
    let conn = rusqlite::Connection::open(db).expect("the audit database opens");
    let mut stmt = conn
        .prepare("SELECT method, tool, decision FROM events ORDER BY id")
        .expect("query");
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_serves_a_real_client_read_only_and_non_root_and_drains_on_sigterm() {
    if !tiers::ready(&[Tier::Python, Tier::Podman]) {
        return;
    }
    let image = tokio::task::spawn_blocking(podman::image)
        .await
        .expect("built");
    let up = PeerServer::start(Peer::Python).await;
    let (gateway, admin) = (free_port(), free_port());
    let etc = tempfile::tempdir().expect("dir");
    let config_path = etc.path().join("portcullis.toml");
    std::fs::write(&config_path, config(gateway, admin, &up.url)).expect("write");
    let state = state_dir();
    let name = format!("portcullis-test-{}", podman::run_id());
    let _cleanup = podman::Cleanup(podman::Made {
        containers: vec![name.clone()],
        ..Default::default()
    });
    let started = Instant::now();
    podman::ok(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--network",
        "host",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--volume",
        &format!(
            "{}:/etc/portcullis/portcullis.toml:ro",
            config_path.display()
        ),
        "--volume",
        &format!("{}:/var/lib/portcullis", state.path().display()),
        image,
    ]);
    let to_ready = ready(
        &format!("http://127.0.0.1:{admin}/readyz"),
        Duration::from_secs(60),
    )
    .await;
    println!(
        "container start to ready: {:.0} ms (of which /readyz polling from `podman run`: {:.0} ms)",
        started.elapsed().as_secs_f64() * 1000.0,
        to_ready.as_secs_f64() * 1000.0
    );
    // It runs as the image's user, not root.
    let user = podman::ok(&["inspect", "--format", "{{.Config.User}}", &name]);
    assert_eq!(user, "10001:10001");
    let top = podman::ok(&["top", &name, "user"]);
    assert!(!top.lines().skip(1).any(|l| l.trim() == "root"), "{top}");

    let url = format!("http://127.0.0.1:{gateway}/mcp/tools");
    let results = sdk(
        Sdk::Python,
        Mode::Legacy,
        &url,
        AGENT_KEY,
        json!([
            list(),
            call("echo", json!({"text": "through the container"})),
            call("book_flight", json!({"origin": "nowhere"})),
        ]),
    )
    .await;
    let names: Vec<&str> = results[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"book_flight"),
        "{names:?}"
    );
    assert_eq!(results[1]["isError"], json!(false), "{}", results[1]);
    assert!(
        results[1]["text"]
            .as_str()
            .is_some_and(|t| t.contains("through the container"))
    );
    assert_eq!(
        gateway_code(&results[2]),
        Some("invalid_arguments"),
        "{}",
        results[2]
    );
    assert!(!up.ran().contains(&"book_flight".to_owned()));

    // The image's own health check (HEALTHCHECK in the Dockerfile) reports healthy; like
    // the engine, a probe that times out on a loaded machine is tried again (`--retries=3`).
    let mut health = podman::run(&["healthcheck", "run", &name]);
    for _ in 1..3 {
        if health.status.success() {
            break;
        }
        health = podman::run(&["healthcheck", "run", &name]);
    }
    assert!(
        health.status.success(),
        "healthcheck: {}{}",
        String::from_utf8_lossy(&health.stdout),
        String::from_utf8_lossy(&health.stderr)
    );

    // SIGTERM while a call is in flight: the call finishes, the container exits 0 within the
    // grace, and the audit trail in the volume holds every request.
    // One raw 2026-07-28 POST: exactly the request in flight (an SDK client would open
    // further requests of its own afterwards, which a stopping gateway refuses).
    let slow = tokio::spawn({
        let url = url.clone();
        async move {
            let headers = support::modern_call_headers(AGENT_KEY, "hang");
            support::raw_post(
                &url,
                &support::borrow(&headers),
                support::modern_call(7, "hang", json!({"seconds": 2})),
            )
            .await
        }
    });
    wait_for_call(&up, "hang").await;
    let stopping = Instant::now();
    let stop = tokio::task::spawn_blocking({
        let id = name.clone();
        move || podman::ok(&["stop", "--time", "30", &id])
    });
    let slow = slow.await.expect("the in-flight call returns");
    assert_eq!(slow.status, 200, "{}", slow.text);
    assert_eq!(
        slow.body["result"]["isError"],
        json!(false),
        "{}",
        slow.text
    );
    stop.await.expect("stopped");
    let exit = podman::ok(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(exit, "0", "the gateway exits cleanly on SIGTERM");
    println!(
        "SIGTERM to exit with a call in flight: {:.1} s",
        stopping.elapsed().as_secs_f64()
    );
    let rows = audit_rows(&state.path().join("audit.db"));
    let calls: Vec<_> = rows
        .iter()
        .filter(|(m, _, _)| m == "tools/call")
        .map(|(_, t, d)| (t.clone().unwrap_or_default(), d.clone()))
        .collect();
    assert!(
        calls.contains(&("echo".into(), "forwarded".into())),
        "{rows:?}"
    );
    assert!(
        calls.contains(&("book_flight".into(), "invalid_arguments".into())),
        "{rows:?}"
    );
    assert!(
        calls.contains(&("hang".into(), "forwarded".into())),
        "{rows:?}"
    );
    up.stop().await;
}

/// Waits until the upstream has started running `tool`.
async fn wait_for_call(up: &PeerServer, tool: &str) {
    let started = Instant::now();
    while !up.ran().iter().any(|t| t == tool) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{tool} never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
