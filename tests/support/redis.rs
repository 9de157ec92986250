//! A real `redis-server` for tests: started on a free loopback port with no
//! persistence (`--save "" --appendonly no`), stopped by its PID.
//!
//! Its tests open with the `Redis` tier's gate (`support::tiers`); under
//! `tests/run.sh` a missing `redis-server` fails them with the command that
//! installs it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running redis-server, killed when stopped or dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    /// Its loopback port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts redis-server on a free loopback port and waits until it answers PING.
    pub fn start() -> Self {
        for _ in 0..5 {
            let port = free_port();
            if let Some(server) = Self::try_start(port) {
                return server;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts redis-server again on the port it had (after [`stop`](Self::stop)).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(mut child) = spawn(self.port, self.dir.path()) {
                let ready = wait_ready(self.port, &mut child);
                self.child = Some(child);
                if ready {
                    return;
                }
                self.stop();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    fn try_start(port: u16) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let mut child = spawn(port, dir.path())?;
        let ready = wait_ready(port, &mut child);
        let mut server = Self {
            child: Some(child),
            port,
            dir,
        };
        if ready {
            Some(server)
        } else {
            server.stop();
            None
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server by its PID and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends one inline command and returns the raw reply (for checks such as `DBSIZE`).
    pub fn command(&self, line: &str) -> String {
        let mut stream =
            TcpStream::connect(("127.0.0.1", self.port)).expect("connect to redis-server");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream
            .write_all(format!("{line}\r\n").as_bytes())
            .expect("send");
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn(port: u16, dir: &std::path::Path) -> Option<Child> {
    let spawned = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match spawned {
        Ok(child) => Some(child),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "redis-server is not installed: run `apt-get install -y redis-server` \
             (tests/run.sh installs it)"
        ),
        Err(e) => panic!("redis-server cannot be started: {e}"),
    }
}

/// Polls PING for up to 10 s; false at once if the server exited (port taken).
fn wait_ready(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 16];
            if s.write_all(b"PING\r\n").is_ok()
                && s.read(&mut buf)
                    .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
