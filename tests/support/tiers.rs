//! Test tiers: the groups of tests that need something besides a Rust
//! toolchain (a real MCP peer, an engine, a browser), and the gate each such
//! test opens with.
//!
//! A plain `cargo test` runs every test that needs nothing else; a test of a
//! tier whose peer is absent returns at its gate, and the `tiers::summary`
//! test says in one line which tiers did not run and how to run them.
//! `tests/run.sh` (what CI runs) installs every peer and exports
//! `PORTCULLIS_TIERS=all`: then every tier is required and a missing peer
//! fails its tests, as it always did. `PORTCULLIS_TIERS=python,redis`
//! requires just those tiers (the others still run when their peer is there).
//!
//! Invariant: a test that starts a peer opens with
//! `if !tiers::ready(&[Tier::…]) { return; }` naming every tier it needs;
//! `tests/suite/tiers.rs` reads the suite's source and fails on a test that
//! does not.

use std::path::{Path, PathBuf};

use super::peers_dir;

/// One group of tests that needs something besides a Rust toolchain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// The official Python SDK's venv and FastMCP's (`tests/peers/setup.sh`).
    Python,
    /// Node with the TypeScript SDK, server-everything and the MCP Inspector
    /// (`tests/peers/setup.sh`).
    Node,
    /// The OAuth authorization server (oidc-provider on Node, `tests/peers/setup.sh`).
    Authz,
    /// `redis-server` on the PATH.
    Redis,
    /// Debian's PostgreSQL server binaries (`initdb`, `postgres`, `psql`;
    /// see `support::postgres::bin_dir`).
    Postgres,
    /// Debian's `haproxy` (on the PATH or in `/usr/sbin`).
    Haproxy,
    /// `podman` on the PATH and podman-compose (`tests/container/images.sh`).
    Podman,
    /// `chromium` on the PATH and playwright-core (`tests/peers/setup.sh`).
    Chromium,
    /// The official MCP conformance suite (`tests/conformance/setup.sh`).
    Conformance,
}

impl Tier {
    /// Every tier, in the order the summary names them.
    pub const ALL: [Tier; 9] = [
        Tier::Python,
        Tier::Node,
        Tier::Authz,
        Tier::Redis,
        Tier::Postgres,
        Tier::Haproxy,
        Tier::Podman,
        Tier::Chromium,
        Tier::Conformance,
    ];

    /// Its name in `PORTCULLIS_TIERS` and in the summary.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Python => "python",
            Tier::Node => "node",
            Tier::Authz => "authz",
            Tier::Redis => "redis",
            Tier::Postgres => "postgres",
            Tier::Haproxy => "haproxy",
            Tier::Podman => "podman",
            Tier::Chromium => "chromium",
            Tier::Conformance => "conformance",
        }
    }

    /// Whether what the tier's tests start is installed here.
    pub fn present(self) -> bool {
        let peers = peers_dir();
        let has = |rel: &str| peers.join(rel).exists();
        match self {
            Tier::Python => has("venv/bin/python") && has("fastmcp-venv/bin/python"),
            Tier::Node => {
                on_path("node")
                    && has("npm/node_modules/@modelcontextprotocol/server")
                    && has("npm/node_modules/@modelcontextprotocol/client")
                    && has("npm/node_modules/@modelcontextprotocol/server-everything")
                    && has("inspector/node_modules/.bin/node")
            }
            Tier::Authz => on_path("node") && has("authz/node_modules/oidc-provider"),
            Tier::Redis => on_path("redis-server"),
            Tier::Postgres => super::postgres::bin_dir().is_some(),
            Tier::Haproxy => super::haproxy::program().is_some(),
            Tier::Podman => on_path("podman") && has("compose-venv/bin/podman-compose"),
            Tier::Chromium => {
                on_path("chromium")
                    && on_path("node")
                    && has("browser/node_modules/playwright-core")
            }
            Tier::Conformance => {
                let dir = conformance_dir();
                dir.join("node_modules/.bin/node").exists()
                    && dir
                        .join("node_modules/@modelcontextprotocol/conformance/dist/index.js")
                        .exists()
            }
        }
    }

    /// Whether this run must run the tier, peer or not (`PORTCULLIS_TIERS`).
    pub fn required(self) -> bool {
        let Ok(list) = std::env::var("PORTCULLIS_TIERS") else {
            return false;
        };
        list.split(',')
            .map(str::trim)
            .any(|t| t == "all" || t == self.name())
    }

    /// Whether its tests run: required, or its peer is present.
    pub fn runs(self) -> bool {
        self.required() || self.present()
    }
}

/// The gate a test that needs `tiers` opens with: true when every one runs;
/// otherwise the test notes the skip (shown with `--nocapture`) and returns.
pub fn ready(tiers: &[Tier]) -> bool {
    let missing: Vec<&str> = tiers
        .iter()
        .filter(|t| !t.runs())
        .map(|t| t.name())
        .collect();
    if missing.is_empty() {
        return true;
    }
    eprintln!(
        "skipped: tier {} not ready — `bash tests/run.sh` installs its peers",
        missing.join(", ")
    );
    false
}

/// The tiers this run does not run, in [`Tier::ALL`] order.
pub fn not_run() -> Vec<Tier> {
    Tier::ALL.into_iter().filter(|t| !t.runs()).collect()
}

/// `$PORTCULLIS_CONFORMANCE`, or where `tests/conformance/setup.sh` installs the suite.
pub fn conformance_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_CONFORMANCE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/portcullis-conformance"),
    }
}

/// Whether an executable file named `program` is in a directory of `$PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(program))))
}

pub fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
