//! A typed builder of gateway configurations: a test names the servers,
//! clients, rules and settings it needs, and the builder renders the TOML the
//! gateway reads, so no test types the listener preamble or a rule table by
//! hand.
//!
//! ```ignore
//! let config = Config::new()
//!     .server("s", &upstream.url)
//!     .set("pinning", "off")
//!     .clients()
//!     .allow(&["lookup_order"])
//!     .rate(1, 0.01, "client+tool");
//! let gateway = TestGateway::start_config(&config).await;
//! ```
//!
//! Values go through `toml::Value`, so strings are quoted and escaped as TOML
//! wants. `set` sets a key of the table added last (the gateway table before
//! any other), `gateway` one of `[gateway]`, `raw` adds TOML as written in
//! its place; a test whose point is a particular TOML text (refusals of bad
//! configurations with their line numbers, shipped files) keeps that text.

use std::fmt::Write as _;

use super::{ADMIN, ALICE, BOB};

/// One part of the configuration, in the order it was added.
#[derive(Debug, Clone)]
enum Part {
    Table(Table),
    /// TOML as written (a table the builder has no word for).
    Raw(String),
}

/// A table with its keys.
#[derive(Debug, Clone)]
struct Table {
    /// `[servers.s]`, `[[rules]]`, …
    header: String,
    /// Keys and their values as TOML writes them, in the order first set.
    lines: Vec<(String, String)>,
}

/// A gateway configuration under construction; renders with [`Config::render`].
#[derive(Debug, Clone)]
pub struct Config {
    parts: Vec<Part>,
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

/// A TOML value as the builder takes it.
pub fn value(v: impl Into<toml::Value>) -> String {
    v.into().to_string()
}

/// Sets `key` in `lines`, replacing a value set before.
fn put(lines: &mut Vec<(String, String)>, key: &str, toml: &str) {
    match lines.iter_mut().find(|(k, _)| k == key) {
        Some(line) => line.1 = toml.to_owned(),
        None => lines.push((key.to_owned(), toml.to_owned())),
    }
}

impl Config {
    /// Both listeners on loopback ports the OS picks; nothing else.
    pub fn new() -> Self {
        let gateway = Table {
            header: "[gateway]".into(),
            lines: vec![
                ("listen".into(), "\"127.0.0.1:0\"".into()),
                ("admin_listen".into(), "\"127.0.0.1:0\"".into()),
            ],
        };
        Self {
            parts: vec![Part::Table(gateway)],
        }
    }

    /// No table at all: for fragments ([`super::clients`], [`super::allow_all`])
    /// that go into a text of their own.
    pub(super) fn fragment() -> Self {
        Self { parts: Vec::new() }
    }

    fn table(mut self, header: String) -> Self {
        self.parts.push(Part::Table(Table {
            header,
            lines: Vec::new(),
        }));
        self
    }

    /// Sets `key` to `v` in the table added last (again: the new value replaces the old).
    pub fn set(self, key: &str, v: impl Into<toml::Value>) -> Self {
        self.set_raw(key, &value(v))
    }

    /// Sets `key` to `toml`, a value as TOML writes it (`{ burst = 2, per_second = 1.0 }`).
    pub fn set_raw(mut self, key: &str, toml: &str) -> Self {
        match self.parts.last_mut() {
            Some(Part::Table(table)) => put(&mut table.lines, key, toml),
            _ => panic!("`{key}` set where no table was added last"),
        }
        self
    }

    /// Sets `key` in the `[gateway]` table, wherever the builder is.
    pub fn gateway(mut self, key: &str, v: impl Into<toml::Value>) -> Self {
        match self.parts.first_mut() {
            Some(Part::Table(table)) if table.header == "[gateway]" => {
                put(&mut table.lines, key, &value(v))
            }
            _ => panic!("a fragment has no [gateway] table for `{key}`"),
        }
        self
    }

    /// The admin listener's bearer token (its SHA-256 in `admin_token_sha256`).
    pub fn admin_token(self, token: &str) -> Self {
        let hash = hex::encode(portcullis::auth::hash_key(token));
        self.gateway("admin_token_sha256", hash)
    }

    /// `[servers.NAME]` reached at `url` (its other keys with [`Config::set`]).
    pub fn server(self, name: &str, url: &str) -> Self {
        self.table(format!("[servers.{name}]")).set("url", url)
    }

    /// `[clients.NAME]` holding `key`.
    pub fn client(self, name: &str, key: &str) -> Self {
        let hash = hex::encode(portcullis::auth::hash_key(key));
        self.table(format!("[clients.{name}]"))
            .set("api_key_sha256", hash)
    }

    /// The harness's clients: alice, bob and admin ([`ALICE`], [`BOB`], [`ADMIN`]).
    pub fn clients(self) -> Self {
        self.client("alice", ALICE)
            .client("bob", BOB)
            .client("admin", ADMIN)
    }

    /// A rule for every client and server on `tools`, with `action`.
    pub fn rule(self, tools: &[&str], action: &str) -> Self {
        self.table("[[rules]]".into())
            .set("clients", vec!["*"])
            .set("servers", vec!["*"])
            .set("tools", tools.to_vec())
            .set("action", action)
    }

    /// Everyone may call `tools` (`["*"]`: every tool).
    pub fn allow(self, tools: &[&str]) -> Self {
        self.rule(tools, "allow")
    }

    /// Nobody may call `tools`.
    pub fn deny(self, tools: &[&str]) -> Self {
        self.rule(tools, "deny")
    }

    /// Everyone may call every tool and read every resource and prompt
    /// (the rule of [`super::allow_all`]).
    pub fn allow_all(self) -> Self {
        self.allow(&["*"])
            .set("resources", vec!["*"])
            .set("prompts", vec!["*"])
    }

    /// A token bucket on the rule added last: `burst` calls, refilled at
    /// `per_second`, one bucket per `key` (`client`, `client+tool`, …).
    pub fn rate(self, burst: u32, per_second: f64, key: &str) -> Self {
        let mut rate = toml::Table::new();
        rate.insert("burst".into(), i64::from(burst).into());
        rate.insert("per_second".into(), per_second.into());
        rate.insert("key".into(), key.into());
        self.set("rate", rate)
    }

    /// Starts another table, `[NAME]` (`sanitize`, `telemetry`, …), for [`Config::set`].
    pub fn section(self, name: &str) -> Self {
        self.table(format!("[{name}]"))
    }

    /// `[telemetry]` exporting spans to `otlp`.
    pub fn otlp(self, endpoint: &str) -> Self {
        self.section("telemetry").set("otlp_endpoint", endpoint)
    }

    /// Pins and audit events in memory (what [`super::TestGateway::start_raw`]
    /// does on its own; for a configuration the real binary reads).
    pub fn memory_stores(self) -> Self {
        self.section("pins")
            .set("database", ":memory:")
            .section("audit")
            .set("database", ":memory:")
    }

    /// Adds `toml` as written, here in the order (bare keys in it land in
    /// the table added before it).
    pub fn raw(mut self, toml: &str) -> Self {
        let mut toml = toml.to_owned();
        if !toml.is_empty() && !toml.ends_with('\n') {
            toml.push('\n');
        }
        self.parts.push(Part::Raw(toml));
        self
    }

    /// The configuration text.
    pub fn render(&self) -> String {
        let mut text = String::new();
        for part in &self.parts {
            match part {
                Part::Table(table) => {
                    let _ = writeln!(text, "{}", table.header);
                    for (key, value) in &table.lines {
                        let _ = writeln!(text, "{key} = {value}");
                    }
                }
                Part::Raw(toml) => text.push_str(toml),
            }
        }
        text
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder renders what a test would have typed, and the gateway
    /// loads it.
    #[test]
    fn renders_the_configuration_a_test_would_type() {
        let built = Config::new()
            .gateway("max_response_bytes", 65536)
            .server("s", "http://127.0.0.1:1/mcp")
            .set("timeout", "20s")
            .set("pinning", "off")
            .client("alice", ALICE)
            .allow(&["lookup_order"])
            .rate(1, 0.01, "client+tool")
            .deny(&["t3"])
            .section("audit")
            .set("database", ":memory:")
            .render();
        let typed = format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nmax_response_bytes = 65536\n\
             [servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\ntimeout = \"20s\"\npinning = \"off\"\n\
             [clients.alice]\napi_key_sha256 = \"{}\"\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"lookup_order\"]\naction = \"allow\"\n\
             rate = {{ burst = 1, per_second = 0.01, key = \"client+tool\" }}\n\
             [[rules]]\nclients = [\"*\"]\nservers = [\"*\"]\ntools = [\"t3\"]\naction = \"deny\"\n\
             [audit]\ndatabase = \":memory:\"\n",
            hex::encode(portcullis::auth::hash_key(ALICE))
        );
        let parse = |t: &str| t.parse::<toml::Table>().expect("TOML");
        assert_eq!(parse(&built), parse(&typed), "{built}");
        portcullis::config::load_str(&built, "built.toml", &|_| None)
            .unwrap_or_else(|e| panic!("{e}\n{built}"));
    }

    /// The harness's fragments are the builder's.
    #[test]
    fn the_clients_and_allow_all_fragments_load() {
        let text = Config::new()
            .server("s", "http://127.0.0.1:1/mcp")
            .raw(&super::super::clients())
            .raw(super::super::allow_all())
            .render();
        portcullis::config::load_str(&text, "built.toml", &|_| None)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}
