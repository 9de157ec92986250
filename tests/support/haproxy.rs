//! A real HAProxy (Debian's) for tests: one HTTP frontend on a free loopback
//! port, round-robin over the given backends per request, no stickiness,
//! stopped by its PID.
//!
//! A backend that refuses connections (a replica killed) is taken out by
//! HAProxy's own health check and its requests redispatched, as a balancer
//! in front of a fleet does. Its tests open with the `Haproxy` tier's gate.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `haproxy` on the PATH, or Debian's `/usr/sbin/haproxy`.
pub fn program() -> Option<PathBuf> {
    if super::tiers::on_path("haproxy") {
        return Some(PathBuf::from("haproxy"));
    }
    let sbin = PathBuf::from("/usr/sbin/haproxy");
    super::tiers::executable(&sbin).then_some(sbin)
}

/// A running HAProxy, killed when dropped.
#[derive(Debug)]
pub struct Haproxy {
    child: Child,
    /// Its frontend's loopback port.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts HAProxy round-robin over `backends` (`host:port` each).
    pub fn start(backends: &[String]) -> Self {
        let program = program().unwrap_or_else(|| {
            panic!("haproxy is not installed: run `apt-get install -y haproxy` (tests/run.sh installs it)")
        });
        for _ in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("temp dir for haproxy");
            let config = dir.path().join("haproxy.cfg");
            std::fs::write(&config, render(port, backends)).expect("write haproxy.cfg");
            let mut child = Command::new(&program)
                .arg("-f")
                .arg(&config)
                // Foreground, logs to stderr; no master process.
                .arg("-db")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("haproxy starts");
            if wait_listening(port, &mut child) {
                return Self {
                    child,
                    port,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("haproxy did not start on any of 5 free ports");
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Round robin on every request (`http-server-close`: no server connection
/// is kept, so no request follows another to the same replica), no cookie,
/// no stickiness.
fn render(port: u16, backends: &[String]) -> String {
    let mut text = format!(
        "global\n    maxconn 512\n\n\
         defaults\n    mode http\n    option http-server-close\n    option redispatch\n    retries 3\n\
         \x20   timeout connect 2s\n    timeout client 120s\n    timeout server 120s\n\n\
         frontend fleet\n    bind 127.0.0.1:{port}\n    default_backend replicas\n\n\
         backend replicas\n    balance roundrobin\n"
    );
    for (i, b) in backends.iter().enumerate() {
        text.push_str(&format!(
            "    server r{i} {b} check inter 300ms fall 1 rise 1\n"
        ));
    }
    text
}

fn wait_listening(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
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
