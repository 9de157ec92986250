//! Test harness: real MCP peers (Python SDK, FastMCP, TypeScript SDK, server-everything)
//! started on loopback, the gateway started in-process in front of them, and
//! real SDK clients driven through small scripts.
//!
//! A test that starts a peer opens with its tier's gate ([`tiers`]): a plain
//! `cargo test` skips it when the peer is absent and names the tiers it did
//! not run in one line; under `tests/run.sh` (`PORTCULLIS_TIERS=all`) a peer
//! that is missing fails the test with the command that installs it
//! (`bash tests/peers/setup.sh`).

pub mod admin;
pub mod config;
pub mod fleet;
pub mod fuzz;
pub mod haproxy;
pub mod identity;
pub mod jwt;
pub mod log;
pub mod misbehaving;
pub mod otlp;
pub mod peers;
pub mod podman;
pub mod postgres;
pub mod process;
pub mod raw;
pub mod redis;
pub mod tasks;
pub mod tiers;
pub mod upstreams;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Once;
use std::time::Duration;

pub use admin::Admin;
pub use config::Config;
pub use peers::{Peer, PeerServer, StdioPeer, alive, signal};
use portcullis::{Gateway, GatewayHandle};
pub use raw::{
    Listening, Raw, borrow, listen, modern_call, modern_call_headers, modern_meta, raw_post,
    tools_call,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Key of the client `alice` in [`keys`].
pub const ALICE: &str = "alice-key";
/// Key of the client `bob`.
pub const BOB: &str = "bob-key";
/// Key of the client `admin`.
pub const ADMIN: &str = "admin-key";

/// Where `tests/peers/setup.sh` installs the peers.
pub fn peers_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/portcullis-peers"),
    }
}

fn require(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{what} is missing at {} — install the test peers with `bash tests/peers/setup.sh` (tests/run.sh does it)",
        path.display()
    );
    path
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Installs the TLS provider reqwest needs, once per test binary.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The suite's one serialization: held for the whole run of a test that
/// measures against the wall clock (`rate_limit_replicas`: admissions of a
/// shared bucket over ten seconds) and of the tests that keep both cores busy
/// (the fuzz targets, `overload`'s thousands of connections). All tests share
/// one process; the per-file binaries ran such tests only beside their own
/// file's, and a measurement must not share the cores with a CPU-bound run.
/// Every other test runs beside them.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until no other [`exclusive`] test runs; hold the guard to the end.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    ALONE.lock().await
}

/// [`exclusive`] for a test that runs outside any async runtime.
pub fn exclusive_blocking() -> tokio::sync::MutexGuard<'static, ()> {
    ALONE.blocking_lock()
}

/// An HTTP client for loopback (no proxy from the environment), the TLS
/// provider installed.
pub fn http() -> reqwest::Client {
    init();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

/// `[clients]` tables for alice, bob and admin (as [`Config::clients`] writes them).
pub fn clients() -> String {
    Config::fragment().clients().render()
}

/// Compares `actual` with the snapshot `tests/snapshots/<topic>/<name>.txt`,
/// or writes it when `UPDATE_SNAPSHOTS=1` (then read the diff before
/// committing).
pub fn assert_snapshot(topic: &str, name: &str, actual: &str) {
    let path = repo(&format!("tests/snapshots/{topic}/{name}.txt"));
    let again = format!("UPDATE_SNAPSHOTS=1 cargo test --test suite {topic}::");
    if std::env::var("UPDATE_SNAPSHOTS").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().expect("snapshot dir")).expect("snapshot dir");
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\nrun `{again}` to create it",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "the text differs from {}\n--- expected\n{expected}\n--- actual\n{actual}\n---\n\
         if the change is intended, run `{again}`",
        path.display()
    );
}

// === Gateway ===

/// A gateway serving in-process on a free loopback port.
#[derive(Debug)]
pub struct TestGateway {
    handle: Option<GatewayHandle>,
    /// The gateway's own directory: a relative (or default) store path of its
    /// configuration lands here, never in the working or global temp directory.
    /// Held only to be removed when the gateway is dropped.
    _dir: Option<tempfile::TempDir>,
}

impl TestGateway {
    /// Starts a gateway with `servers` (name → upstream URL) and the given
    /// clients and rules (TOML).
    pub async fn start(servers: &[(&str, &str)], rest: &str) -> Self {
        Self::start_pinning(servers, None, rest).await
    }

    /// As [`TestGateway::start`], with `pinning` set on every server.
    pub async fn start_pinning(
        servers: &[(&str, &str)],
        pinning: Option<&str>,
        rest: &str,
    ) -> Self {
        let mut config = Config::new();
        for (name, url) in servers {
            config = config.server(name, url).set("timeout", "20s");
            if let Some(p) = pinning {
                config = config.set("pinning", p);
            }
        }
        Self::start_raw(&config.raw(rest).render()).await
    }

    /// Starts a gateway from a [`Config`] (as [`TestGateway::start_raw`]
    /// its text).
    pub async fn start_config(config: &Config) -> Self {
        Self::start_raw(&config.render()).await
    }

    /// Starts a gateway from a whole configuration text (listeners included).
    /// Unless the text has a `[pins]` (`[audit]`) table, pins (audit events)
    /// are kept in memory; a relative store path (or a table without one)
    /// lands in the gateway's own temporary directory, so tests never share
    /// a store.
    pub async fn start_raw(text: &str) -> Self {
        init();
        let mut text = text.to_owned();
        if !text.contains("[pins]") {
            text.push_str("\n[pins]\ndatabase = \":memory:\"\n");
        }
        if !text.contains("[audit]") {
            text.push_str("\n[audit]\ndatabase = \":memory:\"\n");
        }
        let dir = tempfile::tempdir().expect("the gateway's temp dir");
        let mut config = portcullis::config::load_str(&text, "test.toml", &|_| None)
            .unwrap_or_else(|e| panic!("{e}"));
        own_stores(&mut config, dir.path());
        let handle = Gateway::start(config).await.expect("gateway starts");
        Self {
            handle: Some(handle),
            _dir: Some(dir),
        }
    }

    /// Wraps a gateway started elsewhere (from a configuration file, say).
    pub fn from_handle(handle: GatewayHandle) -> Self {
        Self {
            handle: Some(handle),
            _dir: None,
        }
    }

    /// `http://127.0.0.1:P/mcp/<server>`.
    pub fn url(&self, server: &str) -> String {
        self.handle
            .as_ref()
            .map(|h| h.url(server))
            .unwrap_or_default()
    }

    /// `http://127.0.0.1:P/mcp`: the one server, or the merged view of several.
    pub fn merged_url(&self) -> String {
        self.url("").trim_end_matches('/').to_owned()
    }

    /// `http://127.0.0.1:P` of the admin listener.
    pub fn admin_url(&self) -> String {
        self.handle
            .as_ref()
            .map(|h| format!("http://{}", h.admin_addr))
            .unwrap_or_default()
    }

    /// Stops the gateway and waits for it to drain.
    pub async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await.expect("clean shutdown");
        }
    }
}

/// Moves the relative store paths of `config` (what `portcullis run` would
/// read from the configuration file's directory) into `dir`.
pub fn own_stores(config: &mut portcullis::config::Config, dir: &std::path::Path) {
    if let Some(db) = &mut config.pins.database
        && db.is_relative()
    {
        *db = dir.join(&*db);
    }
    if config.audit.database != ":memory:"
        && std::path::Path::new(&config.audit.database).is_relative()
    {
        config.audit.database = dir.join(&config.audit.database).display().to_string();
    }
    // A fleet audit's spool too: else it lands in the crate's directory.
    if let portcullis::audit::AuditBackend::Postgres { spool, .. } = &mut config.audit.backend
        && std::path::Path::new(spool.as_str()).is_relative()
    {
        *spool = dir.join(&*spool).display().to_string();
    }
}

/// A configuration file in a directory of its own: the store paths its
/// defaults name (`portcullis-audit.db`, `portcullis-pins.db`, relative to the
/// file) are private to it, never shared through the global temp directory.
#[derive(Debug)]
pub struct ConfigFile {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl ConfigFile {
    /// Writes `text` to `portcullis.toml` in a new temporary directory.
    pub fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("portcullis.toml");
        std::fs::write(&path, text).expect("write config");
        Self { dir, path }
    }

    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Its directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Rules that let everyone call everything (as [`Config::allow_all`] writes them).
pub fn allow_all() -> &'static str {
    static RULES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RULES.get_or_init(|| Config::fragment().allow_all().render())
}

// === The real binary ===

/// Reads the binary's log until its `listening` line; returns (MCP, admin) addresses.
pub async fn listening(child: &mut tokio::process::Child) -> (String, String) {
    let (mcp, admin, _log) = listening_log(child).await;
    (mcp, admin)
}

/// As [`listening`], and the log lines that follow, as they come.
pub async fn listening_log(
    child: &mut tokio::process::Child,
) -> (String, String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["message"] == "listening"
            {
                let field = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
                return Some((field("mcp"), field("admin")));
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("the binary logs its listening addresses");
    // Keep draining the log so the process never blocks on a full pipe.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = tx.send(line);
        }
    });
    (found.0, found.1, rx)
}

// === Peer clients ===

/// Which SDK client to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    /// Python SDK `mcp.Client`.
    Python,
    /// TypeScript SDK v2 `@modelcontextprotocol/client`.
    TypeScript,
}

/// Protocol era the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Handshake era (initialize, sessions).
    Legacy,
    /// 2026-07-28 (stateless).
    Modern,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Modern => "2026-07-28",
        }
    }
}

/// Runs `ops` with a real SDK client against `url` with `key`; returns one result per op.
pub async fn sdk(sdk: Sdk, mode: Mode, url: &str, key: &str, ops: Value) -> Vec<Value> {
    sdk_with(sdk, mode, url, key, &[], ops).await
}

/// As [`sdk`], with a client that answers elicitations as `elicit` says
/// (`approve`, `decline`, `off`; the Python client also `wait:PATH`, a yes
/// once that file exists). The TypeScript client without `--elicit` declares
/// no elicitation capability, which is what `off` means.
pub async fn eliciting(
    sdk: Sdk,
    mode: Mode,
    url: &str,
    key: &str,
    elicit: &str,
    ops: Value,
) -> Vec<Value> {
    let args: &[&str] = match (sdk, elicit) {
        (Sdk::TypeScript, "off") => &[],
        _ => &["--elicit", elicit],
    };
    sdk_with(sdk, mode, url, key, args, ops).await
}

/// [`sdk`] with `extra` arguments for the client script.
async fn sdk_with(
    sdk: Sdk,
    mode: Mode,
    url: &str,
    key: &str,
    extra: &[&str],
    ops: Value,
) -> Vec<Value> {
    let peers = peers_dir();
    let mut cmd = match sdk {
        Sdk::Python => {
            let mut c = Command::new(require(
                peers.join("venv/bin/python"),
                "the Python SDK venv",
            ));
            c.arg(repo("tests/peers/py_client.py"));
            c
        }
        Sdk::TypeScript => {
            require(
                peers.join("npm/node_modules/@modelcontextprotocol/client"),
                "the TypeScript SDK client",
            );
            let mut c = Command::new("node");
            c.arg(repo("tests/peers/ts_client.mjs"));
            c
        }
    };
    cmd.arg(url)
        .args([
            "--mode",
            mode.arg(),
            "--key",
            key,
            "--ops",
            &ops.to_string(),
        ])
        .args(extra)
        .env("PORTCULLIS_PEERS", &peers)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("client finishes in time")
        .expect("client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('[')).unwrap_or_else(|| {
        panic!(
            "{sdk:?} client ({mode:?}) printed no result; status {:?}\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let results: Value = serde_json::from_str(line).expect("client prints JSON");
    results.as_array().cloned().unwrap_or_default()
}

/// `{"op":"list"}`.
pub fn list() -> Value {
    serde_json::json!({"op": "list"})
}

/// `{"op":"call", ...}`.
pub fn call(name: &str, args: Value) -> Value {
    serde_json::json!({"op": "call", "name": name, "args": args})
}

/// The `portcullis/error` code of a call result, if the gateway made it.
pub fn gateway_code(result: &Value) -> Option<&str> {
    result["meta"]["portcullis/error"]["code"].as_str()
}

/// Starts the real `portcullis run` binary on `config` (with `extra` flags
/// before `--config`), its log on a pipe for [`listening`] / [`listening_log`];
/// killed when dropped.
pub fn run_binary(config: &std::path::Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .arg("run")
        .args(extra)
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts")
}
