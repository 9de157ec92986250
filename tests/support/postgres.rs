//! A real PostgreSQL for tests: a cluster initialised by Debian's `initdb` in
//! the test's own temporary directory, served by `postgres` on a free
//! loopback port (no Unix socket outside that directory), stopped by its PID.
//!
//! PostgreSQL refuses to run as root: when the tests run as root (CI), the
//! cluster is owned by and run as the `postgres` user that Debian's package
//! creates. Its tests open with the `Postgres` tier's gate
//! (`support::tiers`); under `tests/run.sh` a missing server fails them with
//! the command that installs it.

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory of PostgreSQL's server programs: `$PORTCULLIS_PG_BIN`, or
/// the newest `/usr/lib/postgresql/N/bin` that has `initdb`, `postgres` and `psql`.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PORTCULLIS_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            ["initdb", "postgres", "psql"]
                .iter()
                .all(|p| super::tiers::executable(&bin.join(p)))
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn program(name: &str) -> PathBuf {
    bin_dir()
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL is not installed: run `apt-get install -y postgresql` \
                 (tests/run.sh installs it)"
            )
        })
        .join(name)
}

/// A running PostgreSQL cluster, stopped when dropped.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    /// Its loopback port.
    pub port: u16,
    /// The cluster's data directory (inside `dir`).
    data: PathBuf,
    /// Who runs it: `Some((uid, gid))` of `postgres` when the tests run as root.
    user: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// Initialises a cluster in a new temporary directory and starts it on a
    /// free loopback port; waits until it accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for PostgreSQL");
        let user = run_as();
        if let Some((uid, gid)) = user {
            chown(dir.path(), uid, gid);
        }
        let data = dir.path().join("data");
        let out = as_user(Command::new(program("initdb")), user)
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null())
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = Self {
            child: None,
            port: 0,
            data,
            user,
            dir,
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn_and_wait() {
                return server;
            }
        }
        panic!("PostgreSQL did not start on any of 5 free ports");
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server (a fast shutdown: SIGINT, then its exit); its port
    /// refuses connections until [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            super::signal(u64::from(child.id()), "INT");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the port it had.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.spawn_and_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("PostgreSQL did not restart on port {}", self.port);
    }

    /// Runs one SQL statement with `psql` and returns its unaligned output,
    /// trimmed (`SELECT count(*) …` gives the number).
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new(program("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-q"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// As [`query`](Self::query), for a number.
    pub fn count(&self, sql: &str) -> u64 {
        let text = self.query(sql);
        text.parse()
            .unwrap_or_else(|_| panic!("{sql:?} gave {text:?}, not a number"))
    }

    fn spawn_and_wait(&mut self) -> bool {
        let mut child = as_user(Command::new(program("postgres")), self.user)
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            // A test database: durability of the server's own files is not
            // what the tests measure.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=50"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("postgres starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return false;
            }
            let ready = Command::new(program("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGQUIT: immediate shutdown, the postmaster takes its backends with it.
            super::signal(u64::from(child.id()), "QUIT");
            let _ = child.wait();
        }
    }
}

/// The `postgres` user's ids when running as root (PostgreSQL refuses root).
fn run_as() -> Option<(u32, u32)> {
    if rustix::process::geteuid().as_raw() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("the postgres user exists (Debian's postgresql package creates it)");
    let fields: Vec<&str> = line.split(':').collect();
    Some((
        fields[2].parse().expect("uid"),
        fields[3].parse().expect("gid"),
    ))
}

fn as_user(mut cmd: Command, user: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

fn chown(path: &Path, uid: u32, gid: u32) {
    let status = Command::new("chown")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .status()
        .expect("chown runs");
    assert!(status.success(), "chown {}", path.display());
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
