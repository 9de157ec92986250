//! The real MCP peers a story starts: servers over HTTP (Python SDK, FastMCP, TypeScript
//! SDK, server-everything) on loopback ports the OS picks, and stdio servers for the
//! gateway to spawn, each recording the tools it ran so a story can say what reached it;
//! and the signals a story sends to a process.

use super::*;

/// The calls a peer wrote to its `--record` file, one JSON line each (none
/// for a peer that does not record).
pub(super) fn recorded(record: Option<&tempfile::NamedTempFile>) -> Vec<Value> {
    let Some(record) = record else {
        return Vec::new();
    };
    std::fs::read_to_string(record.path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `tool` of each recorded call, in order.
fn tool_names(calls: &[Value]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|c| c["tool"].as_str().map(str::to_owned))
        .collect()
}

/// A peer MCP server process, killed when dropped.
#[derive(Debug)]
pub struct PeerServer {
    child: Child,
    /// `http://127.0.0.1:P/mcp`.
    pub url: String,
    peer: Peer,
    port: u16,
    record: Option<tempfile::NamedTempFile>,
    /// Every POST body the Python peers received, as it arrived (hex lines).
    bodies: Option<tempfile::NamedTempFile>,
}

/// Which peer server to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// Python SDK `mcp` 2.3.0 (both eras, sessions, SSE).
    Python,
    /// Python SDK, stateless.
    PythonStateless,
    /// Python SDK, stateless, answering with JSON bodies instead of SSE (no GET stream).
    PythonJson,
    /// Python SDK with the conformance suite's fixtures (`--fixtures`).
    PythonFixtures,
    /// Python SDK, stateless, listing its tools two per page, and serving the
    /// request method `x/echo` that the MCP specification does not define (`--paged 2`).
    PythonPaged,
    /// TypeScript SDK v2 (`createMcpHandler`).
    TypeScript,
    /// FastMCP 4.2.3 (its own venv).
    FastMcp,
    /// `@modelcontextprotocol/server-everything` (legacy only).
    Everything,
}

impl PeerServer {
    /// Starts `peer` on a free loopback port and waits until it listens.
    pub async fn start(peer: Peer) -> Self {
        let record = tempfile::NamedTempFile::new().expect("temp file");
        let bodies = tempfile::NamedTempFile::new().expect("temp file");
        let (child, port) = Self::launch(peer, 0, &record, &bodies).await;
        let python = matches!(
            peer,
            Peer::Python
                | Peer::PythonStateless
                | Peer::PythonJson
                | Peer::PythonFixtures
                | Peer::PythonPaged
        );
        let record = (peer != Peer::Everything).then_some(record);
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            peer,
            port,
            record,
            bodies: python.then_some(bodies),
        }
    }

    /// Kills the server by its PID and waits for it: its port refuses
    /// connections until [`Self::restart`].
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Starts the server again on the same port, recording to the same files
    /// (a Python peer appends), and waits until it listens.
    pub async fn restart(&mut self) {
        let _ = self.child.kill().await;
        let (Some(record), Some(bodies)) = (&self.record, &self.bodies) else {
            panic!("only a Python peer restarts");
        };
        let (child, _) = Self::launch(self.peer, self.port, record, bodies).await;
        self.child = child;
    }

    /// Spawns `peer` on `port` (0: a free one) and returns it with the port it announced.
    async fn launch(
        peer: Peer,
        port: u16,
        record: &tempfile::NamedTempFile,
        bodies: &tempfile::NamedTempFile,
    ) -> (Child, u16) {
        let peers = peers_dir();
        let record_path = record.path().to_string_lossy().into_owned();
        let bodies_path = bodies.path().to_string_lossy().into_owned();
        let port_arg = port.to_string();
        let mut cmd = match peer {
            Peer::Python
            | Peer::PythonStateless
            | Peer::PythonJson
            | Peer::PythonFixtures
            | Peer::PythonPaged => {
                let mut c = Command::new(require(
                    peers.join("venv/bin/python"),
                    "the Python SDK venv",
                ));
                c.arg(repo("tests/peers/py_server.py")).args([
                    "--port",
                    &port_arg,
                    "--record",
                    &record_path,
                    "--record-bodies",
                    &bodies_path,
                ]);
                if matches!(peer, Peer::PythonStateless | Peer::PythonJson) {
                    c.arg("--stateless");
                }
                if peer == Peer::PythonPaged {
                    c.args(["--stateless", "--paged", "2"]);
                }
                if peer == Peer::PythonJson {
                    c.arg("--json");
                }
                if peer == Peer::PythonFixtures {
                    c.arg("--fixtures");
                }
                c
            }
            Peer::FastMcp => {
                let mut c = Command::new(require(
                    peers.join("fastmcp-venv/bin/python"),
                    "the FastMCP venv",
                ));
                c.arg(repo("tests/peers/fastmcp_server.py")).args([
                    "--port",
                    &port_arg,
                    "--record",
                    &record_path,
                ]);
                c
            }
            Peer::TypeScript => {
                require(
                    peers.join("npm/node_modules/@modelcontextprotocol/server"),
                    "the TypeScript SDK",
                );
                let mut c = Command::new("node");
                c.arg(repo("tests/peers/ts_server.mjs")).args([
                    "--port",
                    &port_arg,
                    "--record",
                    &record_path,
                ]);
                c
            }
            Peer::Everything => {
                let entry = require(
                    peers.join(
                        "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
                    ),
                    "server-everything",
                );
                let mut c = Command::new("node");
                c.arg("-r")
                    .arg(repo("tests/peers/force-loopback.cjs"))
                    .arg(entry)
                    .arg("streamableHttp");
                c.env("PORT", &port_arg).env("PORTCULLIS_ANNOUNCE", "1");
                c
            }
        };
        cmd.env("PORTCULLIS_PEERS", &peers)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("peer server starts");
        let stdout = child.stdout.take().expect("stdout");
        let port = tokio::time::timeout(Duration::from_secs(60), async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(p) = line.strip_prefix("LISTENING ") {
                    // Keep draining stdout so the peer never blocks on a full pipe.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    return p.trim().parse::<u16>().ok();
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("{peer:?} did not announce its port"));
        (child, port)
    }

    /// Every POST body a Python peer received, byte for byte, in order.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        let Some(bodies) = &self.bodies else {
            return Vec::new();
        };
        std::fs::read_to_string(bodies.path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| hex::decode(l).ok())
            .collect()
    }

    /// Every tool call the server actually ran, as `{"tool", "arguments"}`.
    pub fn calls(&self) -> Vec<Value> {
        recorded(self.record.as_ref())
    }

    /// Names of the tools the server ran, in order.
    pub fn ran(&self) -> Vec<String> {
        tool_names(&self.calls())
    }

    /// Stops the process by its PID and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A stdio server for the gateway to spawn: its `[servers.NAME]` table, and
/// (for the Python peer) the file where it records every tool it ran.
#[derive(Debug)]
pub struct StdioPeer {
    /// `[servers.NAME]` with `command` and `timeout`.
    pub table: String,
    record: Option<tempfile::NamedTempFile>,
}

impl StdioPeer {
    /// `peer` (Python or Everything) served on stdio as server `name`.
    pub fn new(peer: Peer, name: &str) -> Self {
        let peers = peers_dir();
        let (command, record) = match peer {
            Peer::Python => {
                let python = require(peers.join("venv/bin/python"), "the Python SDK venv");
                let record = tempfile::NamedTempFile::new().expect("temp file");
                let command = vec![
                    python.to_string_lossy().into_owned(),
                    repo("tests/peers/py_server.py")
                        .to_string_lossy()
                        .into_owned(),
                    "--stdio".into(),
                    "--record".into(),
                    record.path().to_string_lossy().into_owned(),
                ];
                (command, Some(record))
            }
            Peer::Everything => {
                let entry = require(
                    peers.join(
                        "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
                    ),
                    "server-everything",
                );
                let command = vec![
                    "node".into(),
                    entry.to_string_lossy().into_owned(),
                    "stdio".into(),
                ];
                (command, None)
            }
            other => panic!("{other:?} has no stdio mode in the harness"),
        };
        let command: Vec<String> = command.iter().map(|w| format!("{w:?}")).collect();
        Self {
            table: format!(
                "[servers.{name}]\ncommand = [{}]\ntimeout = \"20s\"\n",
                command.join(", ")
            ),
            record,
        }
    }

    /// Every tool call the server actually ran, as `{"tool", "arguments"}`.
    pub fn calls(&self) -> Vec<Value> {
        recorded(self.record.as_ref())
    }

    /// Names of the tools the server ran, in order.
    pub fn ran(&self) -> Vec<String> {
        tool_names(&self.calls())
    }
}

impl TestGateway {
    /// Starts a gateway in front of stdio servers, with `rest` (clients, rules).
    pub async fn start_stdio(servers: &[&StdioPeer], rest: &str) -> Self {
        let mut config = Config::new();
        for server in servers {
            config = config.raw(&server.table);
        }
        Self::start_raw(&config.raw(rest).render()).await
    }

    /// `GET /readyz`: status and body.
    pub async fn readyz(&self) -> (u16, Value) {
        let response = http()
            .get(format!("{}/readyz", self.admin_url()))
            .send()
            .await
            .expect("readyz answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("readyz body");
        (status, serde_json::from_str(&text).expect("readyz is JSON"))
    }

    /// Waits until `server`'s process runs with a pid other than `not`; returns its pid.
    pub async fn running_pid(&self, server: &str, not: Option<u64>) -> u64 {
        for _ in 0..600 {
            let (_, body) = self.readyz().await;
            let state = &body["servers"][server];
            if state["state"] == "running"
                && let Some(pid) = state["pid"].as_u64()
                && Some(pid) != not
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{server} did not reach the running state");
    }
}

/// Sends `signal` (`TERM`, `HUP`, `KILL`, …) to the process `pid` with
/// `kill(1)`, asserting it was delivered.
pub fn signal(pid: u64, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// True while a process with `pid` exists (a zombie counts as gone).
pub fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(after != 'Z')
        })
        .unwrap_or(false)
}
