//! The real `portcullis` binary as a process under observation: every byte it
//! writes to stdout and stderr is kept for scanning, and its resident memory
//! and open file descriptors are read from `/proc/<pid>`.
//!
//! Resource checks poll a bounded number of times for the process to come back
//! to its baseline; they never assert how long that takes.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// A running gateway process, killed when dropped.
#[derive(Debug)]
pub struct Observed {
    child: Child,
    pid: u32,
    /// `http://127.0.0.1:P` of the MCP listener.
    pub base: String,
    /// `127.0.0.1:P` of the MCP listener.
    pub addr: String,
    /// `http://127.0.0.1:P` of the admin listener (`/metrics`, the dashboard).
    pub admin: String,
    output: Arc<Mutex<Vec<String>>>,
    /// The configuration, in a directory of its own (so are its default
    /// stores), when the process was given a text rather than a file.
    config: Option<super::ConfigFile>,
}

impl Observed {
    /// Writes `config` to a file in a directory of its own (where the default
    /// stores land too) and runs `portcullis run --config <file>`.
    pub async fn start(config: &str) -> Self {
        let file = super::ConfigFile::new(config);
        let mut observed = Self::start_file(file.path()).await;
        observed.config = Some(file);
        observed
    }

    /// Runs `portcullis run --config <path>` (several processes may share
    /// one file, and so its stores).
    pub async fn start_file(path: &std::path::Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .arg("run")
            .arg("--config")
            .arg(path)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary starts");
        let pid = child.id().expect("pid");
        let output = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        keep(child.stdout.take().expect("stdout"), output.clone(), None);
        keep(
            child.stderr.take().expect("stderr"),
            output.clone(),
            Some(tx),
        );
        let (addr, admin) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                panic!(
                    "the binary logs its listening address; output: {:?}",
                    output.lock().expect("lock")
                )
            });
        Self {
            child,
            pid,
            base: format!("http://{addr}"),
            addr,
            admin: format!("http://{admin}"),
            output,
            config: None,
        }
    }

    /// `http://127.0.0.1:P/mcp/<server>`.
    pub fn url(&self, server: &str) -> String {
        format!("{}/mcp/{server}", self.base)
    }

    /// Everything the process wrote so far, one line per entry.
    pub fn output(&self) -> Vec<String> {
        self.output.lock().expect("lock").clone()
    }

    /// Resident memory (`VmRSS`), KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_field("VmRSS:")
    }

    /// Peak resident memory (`VmHWM`), KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_field("VmHWM:")
    }

    fn status_field(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("the process is alive");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/{}/status", self.pid))
    }

    /// Open file descriptors.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .expect("the process is alive")
            .count()
    }

    /// Whether the process is still running (no panic with `abort`, no exit).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The lowest count of open descriptors over `samples` looks, 50 ms apart:
    /// a baseline that connections closing on their own time do not inflate.
    pub async fn quiet_fds(&self, samples: usize) -> usize {
        let mut low = self.fds();
        for _ in 0..samples {
            tokio::time::sleep(Duration::from_millis(50)).await;
            low = low.min(self.fds());
        }
        low
    }

    /// Polls (at most `tries` times, 100 ms apart) until the open descriptors
    /// are back to at most `baseline`; returns the last count.
    pub async fn settle_fds(&self, baseline: usize, tries: usize) -> usize {
        let mut now = self.fds();
        for _ in 0..tries {
            if now <= baseline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = self.fds();
        }
        now
    }

    /// Stops the process by its PID and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM (a graceful stop: in-flight calls finish, stores are
    /// flushed) and waits at most `limit` for the exit; killed past it.
    /// Whether it exited by itself, successfully.
    pub async fn terminate(mut self, limit: Duration) -> bool {
        let pid = rustix::process::Pid::from_raw(self.pid as i32).expect("a live pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = self.child.kill().await;
                false
            }
        }
    }
}

/// Keeps every line of `pipe`; sends the MCP and admin addresses of the
/// `listening` line on `tx`.
fn keep(
    pipe: impl AsyncRead + Unpin + Send + 'static,
    output: Arc<Mutex<Vec<String>>>,
    mut tx: Option<tokio::sync::mpsc::UnboundedSender<(String, String)>>,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(sender) = &tx
                && let Some(addresses) = listening(&line)
            {
                let _ = sender.send(addresses);
                tx = None;
            }
            output.lock().expect("lock").push(line);
        }
    });
}

/// The MCP and admin addresses of a `listening` line, in either log format:
/// JSON (`"message":"listening"`) or pretty (`… listening mcp=A admin=B`).
fn listening(line: &str) -> Option<(String, String)> {
    if let Ok(v) = serde_json::from_str::<Value>(line) {
        let field = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        return (v["message"] == "listening").then(|| (field("mcp"), field("admin")));
    }
    // Colours, should the log have any, are not part of the words.
    let sgr = regex::Regex::new("\x1b\\[[0-9;]*m").expect("regex");
    let line = sgr.replace_all(line, "");
    let words: Vec<&str> = line.split_whitespace().collect();
    if !words.contains(&"listening") {
        return None;
    }
    let field = |k: &str| {
        words
            .iter()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_owned)
    };
    Some((field("mcp=")?, field("admin=")?))
}
