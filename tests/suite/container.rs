//! The sidecar, for real: the repository's Dockerfile built with podman, the image run
//! (host network, read-only root, non-root) in front of a real Python SDK server, and the
//! Kubernetes manifests played with `podman kube play` beside a real MCP server container.
//!
//! The base images the Dockerfile names are built from Debian packages on this machine by
//! `tests/container/images.sh` (no image registry is reachable; that script says what it
//! substitutes and why). Every container uses the host network and 127.0.0.1 only, on
//! ports this test picks; the manifests are played from a copy in which only the ports,
//! the loopback addresses, the image names and the secrets' values are filled in.
//! Figures (image size, start to ready) are printed for BENCHMARKS.md / the README.
//! The image is built from the binary this test run compiled (the Dockerfile's `BINARY=host`
//! path): the same Dockerfile stages that lay out the runtime file system, without compiling
//! the dependency tree a second time inside the build.

use crate::support;
use support::tiers::{self, Tier};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Mode, Peer, PeerServer, Sdk, call, gateway_code, list, sdk};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const IMAGE: &str = "localhost/portcullis:test";
pub(crate) const MCP_IMAGE: &str = "localhost/portcullis-test-mcp:2.3.0";
pub(crate) const AGENT_KEY: &str = "agent-container-key";
pub(crate) const ADMIN_TOKEN: &str = "admin-container-token";

pub(crate) fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?} cannot run ({e}): tests/run.sh installs it"))
}

pub(crate) fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Builds the image from the repository's Dockerfile once per test binary.
pub(crate) fn image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let setup = Command::new("bash")
            .arg(Path::new(ROOT).join("tests/container/images.sh"))
            .status()
            .expect("bash runs");
        assert!(setup.success(), "tests/container/images.sh failed");
        let started = Instant::now();
        // The binary this test run was built with goes into the image: the Dockerfile's
        // `host` path, so the dependency tree is not compiled a second time inside it.
        let host = tempfile::tempdir().expect("dir");
        std::fs::copy(
            env!("CARGO_BIN_EXE_portcullis"),
            host.path().join("portcullis"),
        )
        .expect("copy the binary");
        let context = format!("host-binary={}", host.path().display());
        podman_ok(&[
            "build",
            "--format",
            "docker",
            "--network",
            "host",
            "--build-arg",
            "BINARY=host",
            "--build-context",
            &context,
            "--tag",
            IMAGE,
            ROOT,
        ]);
        let size: u64 = podman_ok(&["image", "inspect", "--format", "{{.Size}}", IMAGE])
            .parse()
            .expect("a size");
        println!(
            "image {IMAGE}: {:.1} MiB, built in {:.0} s",
            size as f64 / 1048576.0,
            started.elapsed().as_secs_f64()
        );
    });
    IMAGE
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(crate) fn sha256_hex(s: &str) -> String {
    hex::encode(portcullis::auth::hash_key(s))
}

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

/// Polls `url` until it answers 200; the time it took.
pub(crate) async fn ready(url: &str, within: Duration) -> Duration {
    support::init();
    let started = Instant::now();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    while started.elapsed() < within {
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} was not ready within {within:?}");
}

/// Waits until something accepts connections on 127.0.0.1:`port` (a server in a
/// container: the gateway's /readyz does not probe HTTP upstreams).
pub(crate) async fn listening(port: u16, within: Duration) {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < within,
            "nothing listens on 127.0.0.1:{port} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes a container when the test ends, whatever happened.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.0]);
    }
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
    let image = tokio::task::spawn_blocking(image).await.expect("built");
    let up = PeerServer::start(Peer::Python).await;
    let (gateway, admin) = (free_port(), free_port());
    let etc = tempfile::tempdir().expect("dir");
    let config_path = etc.path().join("portcullis.toml");
    std::fs::write(&config_path, config(gateway, admin, &up.url)).expect("write");
    let state = state_dir();
    let started = Instant::now();
    let id = podman_ok(&[
        "run",
        "--detach",
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
    let container = Container(id);
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
    let user = podman_ok(&["inspect", "--format", "{{.Config.User}}", &container.0]);
    assert_eq!(user, "10001:10001");
    let top = podman_ok(&["top", &container.0, "user"]);
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
    let mut health = podman(&["healthcheck", "run", &container.0]);
    for _ in 1..3 {
        if health.status.success() {
            break;
        }
        health = podman(&["healthcheck", "run", &container.0]);
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
        let id = container.0.clone();
        move || podman_ok(&["stop", "--time", "30", &id])
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
    let exit = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &container.0]);
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

/// Replaces `from` by `to` in `text`, which must contain it: a manifest that no longer
/// has what the test fills in fails here, loudly.
pub(crate) fn fill(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the manifest no longer contains {from:?}"
    );
    text.replace(from, to)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_manifests_play_as_a_sidecar_pod() {
    if !tiers::ready(&[Tier::Python, Tier::Podman]) {
        return;
    }
    let image = tokio::task::spawn_blocking(image).await.expect("built");
    let (gateway, admin, server) = (free_port(), free_port(), free_port());
    let read = |p: &str| std::fs::read_to_string(Path::new(ROOT).join(p)).expect(p);
    let configmap = on_loopback(
        &read("deploy/kubernetes/configmap.yaml"),
        gateway,
        admin,
        server,
    );
    let secret = fill(
        &fill(
            &read("deploy/kubernetes/secret.yaml"),
            "\"replace-with-64-hex-characters\"",
            &format!("\"{}\"", sha256_hex(ADMIN_TOKEN)),
        ),
        "\"replace-with-the-agent-api-key\"",
        &format!("\"{AGENT_KEY}\""),
    );
    let mut deployment = read("deploy/kubernetes/deployment.yaml");
    deployment = fill(&deployment, "ghcr.io/example/portcullis:latest", image);
    deployment = fill(
        &deployment,
        "image: ghcr.io/example/mcp-server:latest",
        &format!("image: {MCP_IMAGE}\n          args: [\"--port\", \"{server}\"]"),
    );
    // The pod's network is the host's here (no bridge networks on these machines), where
    // podman refuses port mappings: the listeners' own addresses are the pod's ports.
    deployment = fill(
        &deployment,
        "      terminationGracePeriodSeconds: 30",
        "      hostNetwork: true\n      terminationGracePeriodSeconds: 30",
    );
    deployment = fill(
        &deployment,
        "          ports:\n            - name: mcp\n              containerPort: 8080\n            - name: admin\n              containerPort: 9090\n",
        "",
    );
    // The probes name the admin port by its number once the named ports are gone.
    deployment = deployment.replace("port: admin", &format!("port: {admin}"));
    let dir = tempfile::tempdir().expect("dir");
    // podman 4.3 resolves `secretKeyRef` in its own secret store, where a secret holds the
    // Secret's `data` (base64 values); it is made here from the manifest's stringData.
    let data: serde_json::Map<String, Value> = secret
        .lines()
        .skip_while(|l| l.trim() != "stringData:")
        .skip(1)
        .filter_map(|l| l.trim().split_once(": "))
        .map(|(k, v)| {
            let v = v.trim_matches('"');
            (k.to_owned(), Value::String(base64_encode(v.as_bytes())))
        })
        .collect();
    assert_eq!(data.len(), 2, "the Secret's stringData: {secret}");
    let secret_file = dir.path().join("secret.json");
    std::fs::write(&secret_file, Value::Object(data).to_string()).expect("write");
    let _ = podman(&["secret", "rm", "portcullis-secrets"]);
    podman_ok(&[
        "secret",
        "create",
        "portcullis-secrets",
        &secret_file.to_string_lossy(),
    ]);
    struct SecretGone;
    impl Drop for SecretGone {
        fn drop(&mut self) {
            let _ = podman(&["secret", "rm", "portcullis-secrets"]);
        }
    }
    let _secret_gone = SecretGone;
    let manifest: PathBuf = dir.path().join("pod.yaml");
    std::fs::write(&manifest, format!("{configmap}\n---\n{deployment}")).expect("write");
    let manifest = manifest.to_string_lossy().into_owned();
    let _ = podman(&["kube", "down", &manifest]);
    let started = Instant::now();
    podman_ok(&["kube", "play", "--network", "host", &manifest]);
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = podman(&["kube", "down", &self.0]);
        }
    }
    let _down = Down(manifest.clone());
    let to_ready = ready(
        &format!("http://127.0.0.1:{admin}/readyz"),
        Duration::from_secs(90),
    )
    .await;
    println!(
        "pod played to ready: {:.1} s (readyz polling {:.1} s)",
        started.elapsed().as_secs_f64(),
        to_ready.as_secs_f64()
    );
    listening(server, Duration::from_secs(90)).await;
    let url = format!("http://127.0.0.1:{gateway}/mcp/tools");
    for mode in [Mode::Legacy, Mode::Modern] {
        lists_calls_and_refuses(&url, mode).await;
    }
    // The admin listener needs the token from the Secret for its API.
    support::init();
    let client = support::http();
    let events = format!("http://127.0.0.1:{admin}/api/events");
    let anonymous = client.get(&events).send().await.expect("answers");
    assert_eq!(anonymous.status().as_u16(), 401);
    let authorized: Value = serde_json::from_str(
        &client
            .get(&events)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answers")
            .text()
            .await
            .expect("a body"),
    )
    .expect("JSON");
    assert!(
        authorized.to_string().contains("book_flight"),
        "{authorized}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_file_comes_up_with_podman_compose() {
    if !tiers::ready(&[Tier::Python, Tier::Podman]) {
        return;
    }
    let image = tokio::task::spawn_blocking(image).await.expect("built");
    let compose = support::peers_dir().join("compose-venv/bin/podman-compose");
    assert!(
        compose.exists(),
        "podman-compose is missing: tests/container/images.sh installs it"
    );
    let (gateway, admin, server) = (free_port(), free_port(), free_port());
    let read = |p: &str| std::fs::read_to_string(Path::new(ROOT).join(p)).expect(p);
    let config = on_loopback(
        &read("deploy/compose/portcullis.toml"),
        gateway,
        admin,
        server,
    );
    let mut file = read("deploy/compose/compose.yaml");
    // The server: the real MCP server image, on the host's network (no bridge networks
    // here, where podman refuses published ports); Portcullis joins its namespace as written.
    file = fill(
        &file,
        "    image: node:22-bookworm-slim\n    command: [\"npx\", \"-y\", \"@modelcontextprotocol/server-everything\", \"streamableHttp\"]\n    environment:\n      PORT: \"3001\"\n    ports:\n      # The namespace is shared: these are Portcullis's ports, published here.\n      - \"8080:8080\"\n      - \"9090:9090\"\n",
        &format!(
            "    image: {MCP_IMAGE}\n    command: [\"--port\", \"{server}\"]\n    network_mode: host\n"
        ),
    );
    file = fill(
        &file,
        "    build:\n      context: ../..\n",
        &format!("    image: {image}\n"),
    );
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("portcullis.toml"), config).expect("write");
    std::fs::write(dir.path().join("compose.yaml"), file).expect("write");
    let project = format!("portcullis-test-{gateway}");
    let run = |args: &[&str]| {
        Command::new(&compose)
            .args(["--project-name", &project, "--file"])
            .arg(dir.path().join("compose.yaml"))
            .args(args)
            .env("PORTCULLIS_ADMIN_TOKEN_SHA256", sha256_hex(ADMIN_TOKEN))
            .env("AGENT_KEY", AGENT_KEY)
            .output()
            .expect("podman-compose runs")
    };
    struct Down<F: Fn()>(F);
    impl<F: Fn()> Drop for Down<F> {
        fn drop(&mut self) {
            (self.0)();
        }
    }
    let _down = Down(|| {
        let _ = run(&["down", "--volumes", "--timeout", "5"]);
    });
    let up = run(&["up", "--detach"]);
    assert!(
        up.status.success(),
        "podman-compose up: {}{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    ready(
        &format!("http://127.0.0.1:{admin}/readyz"),
        Duration::from_secs(90),
    )
    .await;
    listening(server, Duration::from_secs(90)).await;
    let url = format!("http://127.0.0.1:{gateway}/mcp/tools");
    lists_calls_and_refuses(&url, Mode::Modern).await;
}

/// A shipped configuration with its listeners on the ports the test picked on
/// 127.0.0.1, and its upstream on the MCP server's.
pub(crate) fn on_loopback(config: &str, gateway: u16, admin: u16, server: u16) -> String {
    let config = fill(
        config,
        "listen = \"0.0.0.0:8080\"",
        &format!("listen = \"127.0.0.1:{gateway}\""),
    );
    let config = fill(
        &config,
        "admin_listen = \"0.0.0.0:9090\"",
        &format!("admin_listen = \"127.0.0.1:{admin}\""),
    );
    fill(
        &config,
        "url = \"http://127.0.0.1:3001/mcp\"",
        &format!("url = \"http://127.0.0.1:{server}/mcp\""),
    )
}

/// A Python SDK client of `mode` lists the tools, calls one, and has a call that
/// breaks the advertised schema refused.
async fn lists_calls_and_refuses(url: &str, mode: Mode) {
    let results = sdk(
        Sdk::Python,
        mode,
        url,
        AGENT_KEY,
        json!([
            list(),
            call("echo", json!({"text": "through the deployment"})),
            call("book_flight", json!({"passengers": 99}))
        ]),
    )
    .await;
    assert!(
        results[0]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{mode:?}: {}",
        results[0]
    );
    assert_eq!(
        results[1]["isError"],
        json!(false),
        "{mode:?}: {}",
        results[1]
    );
    assert_eq!(
        gateway_code(&results[2]),
        Some("invalid_arguments"),
        "{mode:?}: {}",
        results[2]
    );
}
