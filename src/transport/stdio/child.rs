//! The child process of a stdio server: spawned with a cleared environment,
//! handshaken with, read line by line, supervised and restarted.
//!
//! Place in the path: under [`super::Stdio`], which writes requests to the
//! stdin queue of the current [`Life`] and is handed every message the child
//! writes on stdout ([`super::Shared::route`]).
//!
//! Invariants:
//! - the child's environment is `PATH`, `HOME` and `LANG` (when the gateway
//!   has them) plus the server's `env`, nothing else: the gateway's own
//!   secrets never reach a third-party process;
//! - the child runs in its own process group, and the whole group is killed
//!   when the child ends (a wrapper such as `npx` leaves no orphan behind);
//!   so is every descendant that left the group (`setsid`), found while the
//!   child still runs ([`super::family`]);
//! - one [`Life`] per process: it becomes visible to requests only after the
//!   `initialize` handshake succeeded, and every request written to it is
//!   answered (by the child, or as failed when the process ends);
//! - restarts back off exponentially from `min_backoff` to `max_backoff`
//!   (`[servers.NAME.restart]`), and the delay resets once a process has
//!   stayed up for [`STABLE`]; after `max_restarts` restarts in a row the
//!   gateway stops restarting it ([`Link::CrashLoop`]);
//! - stopping closes stdin, waits [`STOP_GRACE`], then kills;
//! - every read is bounded: a stdout line by `max_response_bytes`, a stderr
//!   line by [`MAX_STDERR_LINE`] (the rest of a longer line is dropped).

use std::io;
use std::process::{ExitStatus, Stdio as Pipe};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::shared::{Life, Link, Pending, Shared, clip, line_of};
use crate::mcp::version::LEGACY;
use crate::util::time::humanize;

/// A process up this long resets the restart delay.
pub(crate) const STABLE: Duration = Duration::from_secs(30);
/// How long a stopping child may take to exit once its stdin is closed.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);
/// Longest stderr line logged.
pub(crate) const MAX_STDERR_LINE: usize = 4096;
/// Lines queued for the child's stdin.
const STDIN_QUEUE: usize = 256;
/// How much of a line cut for length is kept (to find its id, or to log it).
const HEAD: usize = 4096;
/// How long the output of an ended process is still read.
const DRAIN: Duration = Duration::from_millis(500);
/// The gateway's variables a child inherits.
const INHERITED: &[&str] = &["PATH", "HOME", "LANG"];

/// Why a process life ended.
enum End {
    /// Asked to stop: no restart.
    Stopped,
    /// Failed or exited: restart.
    Failed(String),
}

/// Runs processes one after another until `stop`, or until they crashed
/// more than `max_restarts` times in a row.
pub(super) async fn supervise(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let restart = shared.command.restart.clone();
    let mut backoff = restart.min_backoff;
    let mut crashes = 0u32;
    let mut generation = 0u64;
    // Ends when asked to stop; each turn is one process life and one delay.
    while !*stop.borrow() {
        generation += 1;
        shared.link.send_replace(Link::Starting);
        let started = Instant::now();
        let end = life(&shared, generation, &mut stop).await;
        let reason = match end {
            End::Stopped => {
                shared.fail_generation(generation, "the server process was stopped");
                break;
            }
            End::Failed(reason) => reason,
        };
        shared.fail_generation(
            generation,
            &format!("the server process ended while the request was in flight ({reason})"),
        );
        if started.elapsed() >= STABLE {
            backoff = restart.min_backoff;
            crashes = 0;
        }
        crashes = crashes.saturating_add(1);
        if restart.max_restarts > 0 && crashes > restart.max_restarts {
            tracing::error!(server = %shared.name, reason = %reason, crashes,
                "stdio server process keeps crashing; the gateway stopped restarting it (fix it, then change its configuration or restart the gateway)");
            shared.link.send_replace(Link::CrashLoop { crashes });
            until(&mut stop).await;
            break;
        }
        shared.restarts.fetch_add(1, Ordering::Relaxed);
        shared.link.send_replace(Link::Restarting {
            at: Instant::now() + backoff,
        });
        tracing::warn!(server = %shared.name, reason = %reason, restart_in_ms = backoff.as_millis() as u64,
            "stdio server process ended; restarting it");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = until(&mut stop) => break,
        }
        backoff = (backoff * 2).min(restart.max_backoff);
    }
    shared.link.send_replace(Link::Stopped);
}

/// One process: spawn, handshake, serve until it ends or `stop`.
async fn life(shared: &Arc<Shared>, generation: u64, stop: &mut watch::Receiver<bool>) -> End {
    let mut child = match spawn(shared) {
        Ok(child) => child,
        Err(e) => {
            return End::Failed(format!("cannot start `{}`: {e}", shared.command.program));
        }
    };
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(pid);
        let _ = child.kill().await;
        return End::Failed("its standard streams could not be opened".into());
    };
    tracing::info!(server = %shared.name, pid, generation, "stdio server process started");
    let mut logger = tokio::spawn(log_stderr(shared.name.clone(), pid, stderr));
    let (lines, queue) = mpsc::channel(STDIN_QUEUE);
    let (close, closed) = watch::channel(false);
    let writer = tokio::spawn(write_lines(stdin, queue, closed));
    let mut reader = tokio::spawn(read_lines(shared.clone(), stdout, lines.clone()));

    let end = tokio::select! {
        handshake = handshake(shared, generation, &lines) => match handshake {
            Ok((init, version)) => {
                let life = Life { pid, generation, stdin: lines.clone(), init, version };
                shared.link.send_replace(Link::Running(Arc::new(life)));
                if generation > 1 {
                    // A new process may serve other tools.
                    (shared.tools_changed)();
                }
                tracing::info!(server = %shared.name, pid, generation, "stdio server process ready");
                None
            }
            Err(reason) => Some(End::Failed(reason)),
        },
        status = child.wait() => Some(End::Failed(exited(status))),
        () = until(stop) => Some(End::Stopped),
    };
    let mut read_all = false;
    let end = match end {
        Some(end) => end,
        None => tokio::select! {
            status = child.wait() => End::Failed(exited(status)),
            _ = &mut reader => {
                read_all = true;
                End::Failed("it closed its standard output".into())
            }
            () = until(stop) => End::Stopped,
        },
    };
    // No request takes this life from now on; those that did are failed by the caller.
    shared.link.send_replace(match end {
        End::Stopped => Link::Stopped,
        End::Failed(_) => Link::Restarting { at: Instant::now() },
    });
    // Its descendants, while they are still its (an exited child's are init's).
    let family = pid.map(super::family::descendants).unwrap_or_default();
    drop(lines);
    let _ = close.send(true);
    let graceful = matches!(end, End::Stopped);
    finish(&mut child, pid, graceful).await;
    super::family::kill(&family);
    // What it wrote before it ended is still read (answers, a crash's last words).
    if !read_all && tokio::time::timeout(DRAIN, &mut reader).await.is_err() {
        reader.abort();
    }
    if tokio::time::timeout(DRAIN, &mut logger).await.is_err() {
        logger.abort();
    }
    writer.abort();
    tracing::info!(server = %shared.name, pid, generation, "stdio server process ended");
    end
}

/// Resolves once `flag` is true (or its sender is gone).
async fn until(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}

/// Spawns the command with the minimal environment, in its own process group.
fn spawn(shared: &Shared) -> io::Result<Child> {
    let command = &shared.command;
    let mut cmd = Command::new(&command.program);
    cmd.args(&command.args).env_clear();
    for key in INHERITED {
        if let Some(value) = std::env::var_os(key) {
            cmd.env(key, value);
        }
    }
    for (key, value) in &command.env {
        cmd.env(key, value);
    }
    if let Some(dir) = &command.cwd {
        cmd.current_dir(dir);
    }
    cmd.stdin(Pipe::piped())
        .stdout(Pipe::piped())
        .stderr(Pipe::piped())
        .kill_on_drop(true)
        .process_group(0);
    cmd.spawn()
}

/// `initialize` (the newest handshake-era version), then `notifications/initialized`.
async fn handshake(
    shared: &Arc<Shared>,
    generation: u64,
    stdin: &mpsc::Sender<Bytes>,
) -> Result<(Value, String), String> {
    let gid = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (done_tx, done) = oneshot::channel();
    let (notes, _) = mpsc::channel(1);
    shared.lock().insert(
        gid,
        Pending {
            generation,
            client_id: gid.into(),
            progress: None,
            session: None,
            modern: None,
            notes,
            done: Some(done_tx),
        },
    );
    let newest = LEGACY.last().copied().unwrap_or("2025-11-25");
    let request = json!({"jsonrpc": "2.0", "id": gid, "method": "initialize", "params": {
        "protocolVersion": newest,
        "capabilities": {},
        "clientInfo": {"name": "portcullis", "version": env!("CARGO_PKG_VERSION")}}});
    let answered = async {
        stdin
            .send(line_of(&request))
            .await
            .map_err(|_| "its stdin closed".to_owned())?;
        match tokio::time::timeout(shared.timeout, done).await {
            Err(_) => Err(format!(
                "it did not answer initialize within {}",
                humanize(shared.timeout)
            )),
            Ok(Err(_)) => Err("it ended during initialize".to_owned()),
            Ok(Ok(Err(e))) => Err(e.reason),
            Ok(Ok(Ok(message))) => Ok(message),
        }
    };
    let answered = answered.await;
    shared.lock().remove(&gid);
    let message = answered?;
    let Some(result) = message.get("result").filter(|r| r.is_object()) else {
        let error = message
            .get("error")
            .map(Value::to_string)
            .unwrap_or_default();
        return Err(format!("it refused initialize: {}", clip(&error)));
    };
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !LEGACY.contains(&version) {
        return Err(format!(
            "it answered initialize with protocol version {:?}, which the gateway does not speak",
            clip(version)
        ));
    }
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    stdin
        .send(line_of(&initialized))
        .await
        .map_err(|_| "its stdin closed".to_owned())?;
    Ok((result.clone(), version.to_owned()))
}

/// Ends a process: stdin is closed already; a graceful end waits for it to
/// exit first. Whatever is left of its process group is killed.
async fn finish(child: &mut Child, pid: Option<u32>, graceful: bool) {
    if graceful && tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
        kill_group(pid);
        return;
    }
    kill_group(pid);
    let _ = child.kill().await;
}

fn kill_group(pid: Option<u32>) {
    let group = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(group) = group {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
}

fn exited(status: io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => format!("it exited ({status})"),
        Err(e) => format!("it could not be waited for: {e}"),
    }
}

/// Writes queued lines to stdin until closed; dropping stdin closes it.
async fn write_lines(
    mut stdin: ChildStdin,
    mut queue: mpsc::Receiver<Bytes>,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            line = queue.recv() => {
                let Some(line) = line else { break };
                if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
            () = until(&mut closed) => break,
        }
    }
}

/// Routes every line the child writes on stdout, until it closes it.
async fn read_lines(shared: Arc<Shared>, stdout: ChildStdout, stdin: mpsc::Sender<Bytes>) {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    loop {
        match next_line(&mut reader, shared.max_line).await {
            Ok(Some(Line::Full(bytes))) => {
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(message @ Value::Object(_)) => {
                        if let Some(answer) = shared.route(message)
                            && stdin.try_send(answer).is_err()
                        {
                            tracing::warn!(server = %shared.name, "stdin queue full; a request of the server process went unanswered");
                        }
                    }
                    _ => {
                        let text = printable(&String::from_utf8_lossy(&bytes));
                        tracing::warn!(server = %shared.name, line = %clip(&text),
                            "the server process wrote a line on stdout that is not a JSON-RPC message; ignored");
                    }
                }
            }
            Ok(Some(Line::TooLong { head, len })) => shared.too_long(&head, len),
            Ok(None) | Err(_) => break,
        }
    }
}

/// Logs every stderr line with the server's name.
async fn log_stderr(name: String, pid: Option<u32>, stderr: ChildStderr) {
    let mut reader = BufReader::new(stderr);
    loop {
        match next_line(&mut reader, MAX_STDERR_LINE).await {
            Ok(Some(Line::Full(bytes))) => {
                let line = printable(&String::from_utf8_lossy(&bytes));
                tracing::info!(server = %name, pid, line = %line, "stdio server stderr");
            }
            Ok(Some(Line::TooLong { head, len })) => {
                let line = printable(&String::from_utf8_lossy(&head));
                tracing::info!(server = %name, pid, line = %line, cut_from = len, "stdio server stderr");
            }
            Ok(None) | Err(_) => break,
        }
    }
}

/// A line without control characters (tabs kept), so a log cannot be forged
/// or a terminal driven by what a child prints.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

/// One line read with a cap.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Full(Vec<u8>),
    /// Longer than the cap: its first [`HEAD`] bytes (at most the cap) and its length.
    TooLong {
        head: Vec<u8>,
        len: usize,
    },
}

/// The next `\n`-terminated line (a final unterminated one too), never
/// buffering more than `max` bytes of it; `None` at the end of the stream.
async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> io::Result<Option<Line>> {
    let mut out = Vec::new();
    let mut len = 0usize;
    let mut over = false;
    // Each turn consumes at least one byte or ends.
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            if len == 0 && !over {
                return Ok(None);
            }
            break;
        }
        let (part, used, found) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        len += part.len();
        if !over {
            if out.len() + part.len() > max {
                over = true;
                let keep = HEAD.min(max).saturating_sub(out.len().min(HEAD.min(max)));
                out.extend_from_slice(&part[..keep.min(part.len())]);
                out.truncate(HEAD.min(max));
            } else {
                out.extend_from_slice(part);
            }
        }
        reader.consume(used);
        if found {
            break;
        }
    }
    if over {
        return Ok(Some(Line::TooLong { head: out, len }));
    }
    if out.last() == Some(&b'\r') {
        out.pop();
    }
    Ok(Some(Line::Full(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut reader = BufReader::with_capacity(3, input);
        let mut out = Vec::new();
        while let Some(line) = next_line(&mut reader, max).await.expect("read") {
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn lines_are_split_and_capped() {
        let got = lines(b"ab\r\ncdefgh\n\nxyz", 4).await;
        assert_eq!(
            got,
            vec![
                Line::Full(b"ab".to_vec()),
                Line::TooLong {
                    head: b"cdef".to_vec(),
                    len: 6
                },
                Line::Full(Vec::new()),
                Line::Full(b"xyz".to_vec()),
            ]
        );
    }

    #[test]
    fn control_characters_do_not_reach_the_log() {
        assert_eq!(printable("a\x1b[31mb\tc\r"), "a\u{fffd}[31mb\tc\u{fffd}");
    }
}
