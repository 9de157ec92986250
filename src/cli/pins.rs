//! `portcullis pins list` and `portcullis pins approve`: the pin store read
//! and approved from the command line, with no gateway running or beside a
//! running one.
//!
//! Place in the path: none. The CLI writes the store file; a running gateway
//! with the same configuration notices the write (`PRAGMA data_version`,
//! polled every 250 ms by its pin writer) and serves the approved definition
//! from then on.
//!
//! Invariants: `list` never writes; `approve` changes only the approved
//! columns of one pin, to the definition the server served last (or fails
//! when `--hash` names another); every text a server chose (tool names,
//! JSON pointers into its definitions, findings) is shown escaped, so it
//! cannot drive the terminal or add a line to the listing.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::config::Config;
use crate::pins::model::{Key, PinKind, Record, Status};
use crate::pins::present::{diff, entry_json};
use crate::pins::scan;
use crate::pins::store::{self, ApproveOutcome};
use crate::util::escape::{escaped, json_escaped};
use crate::util::time::iso8601;

/// What to approve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// One tool's definition.
    Tool(String),
    /// The server's instructions.
    Instructions,
}

fn store_path(config: &Config) -> Result<&Path, String> {
    config.pins.database.as_deref().ok_or_else(|| {
        "this configuration keeps pins in memory only ([pins] database = \":memory:\"): ask the running \
         gateway instead, GET /api/pins and POST /api/pins/approve on its admin listener"
            .to_owned()
    })
}

/// `portcullis pins list`: every pin, its status, findings and diff; as JSON
/// (the shape of `GET /api/pins`) when `as_json`.
pub fn list(config: &Config, as_json: bool) -> Result<String, String> {
    let path = store_path(config)?;
    if !path.exists() {
        return Err(format!(
            "no pin store at {} yet: the gateway creates it when it first runs with this configuration",
            path.display()
        ));
    }
    let conn = store::open_read_only(path).map_err(|e| e.to_string())?;
    let rows = store::load(&conn).map_err(|e| format!("pin store {}: {e}", path.display()))?;
    let mut by_server: BTreeMap<String, Vec<(Key, Record)>> = BTreeMap::new();
    for (key, record) in rows {
        by_server
            .entry(key.server.clone())
            .or_default()
            .push((key, record));
    }
    if as_json {
        let mut servers = serde_json::Map::new();
        for (server, rows) in &by_server {
            let mode = config.servers.get(server).map(|s| s.pinning.as_str());
            let instructions = rows
                .iter()
                .find(|(k, _)| k.kind == PinKind::Instructions)
                .map(|(k, r)| entry_json(k, r, &config.source));
            let tools: Vec<Value> = rows
                .iter()
                .filter(|(k, _)| k.kind == PinKind::Tool)
                .map(|(k, r)| entry_json(k, r, &config.source))
                .collect();
            servers.insert(
                server.clone(),
                json!({"pinning": mode, "instructions": instructions, "tools": tools}),
            );
        }
        let report = json!({"store": path.display().to_string(), "servers": servers});
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        return Ok(json_escaped(&text).into_owned());
    }
    let mut out = format!("pin store {}\n", path.display());
    for name in config.servers.keys() {
        if !by_server.contains_key(name) {
            out.push_str(&format!(
                "\nserver {name}: no pins yet (tools are pinned when the gateway first lists them)\n"
            ));
        }
    }
    for (server, rows) in &by_server {
        let mode = match config.servers.get(server) {
            Some(s) => format!("pinning {}", s.pinning.as_str()),
            None => "not in this configuration".to_owned(),
        };
        out.push_str(&format!("\nserver {server} ({mode})\n"));
        for (key, record) in rows {
            out.push_str(&row_text(config, key, record));
        }
    }
    Ok(out)
}

fn row_text(config: &Config, key: &Key, r: &Record) -> String {
    let label = match key.kind {
        PinKind::Tool => escaped(&key.name).into_owned(),
        PinKind::Instructions => "(instructions)".to_owned(),
    };
    let status = match r.status() {
        Status::Trusted => "trusted",
        Status::Changed => "CHANGED",
        Status::Unapproved => "UNAPPROVED",
    };
    let mut line = format!("  {label:<28} {status:<10}");
    match &r.approved {
        Some(a) => line.push_str(&format!(
            " approved {} by {} ({}…)",
            iso8601(a.version.at),
            escaped(&a.by),
            &hex::encode(a.version.hash)[..12]
        )),
        None => line.push_str(" never approved"),
    }
    if r.status() != Status::Trusted {
        line.push_str(&format!(
            "; serving {}… since {}",
            &hex::encode(r.seen.hash)[..12],
            iso8601(r.seen.at)
        ));
    }
    if !r.present {
        line.push_str("; no longer listed by the server");
    }
    line.push('\n');
    if let Some(a) = r
        .approved
        .as_ref()
        .filter(|_| r.status() != Status::Trusted)
    {
        let (changes, total) = diff(&a.version.definition, &r.seen.definition);
        for c in &changes {
            let show = |v: &Option<Value>| match v {
                Some(v) => crate::pins::present::short(v),
                None => "(absent)".to_owned(),
            };
            line.push_str(&format!(
                "      {}: {} → {}\n",
                if c.pointer.is_empty() {
                    "/".into()
                } else {
                    escaped(&c.pointer)
                },
                show(&c.before),
                show(&c.after)
            ));
        }
        if total > changes.len() {
            line.push_str(&format!("      … and {} more\n", total - changes.len()));
        }
    }
    for f in r.findings.iter() {
        line.push_str(&format!(
            "      {} {} at {}: {}\n",
            match f.severity {
                scan::Severity::Warning => "warning",
                scan::Severity::Notice => "notice",
            },
            f.kind.as_str(),
            escaped(&f.path),
            escaped(&f.detail)
        ));
    }
    if r.status() != Status::Trusted {
        line.push_str(&format!(
            "      approve: {} --hash {}\n",
            crate::pins::present::approve_command(&config.source, key),
            hex::encode(r.seen.hash)
        ));
    }
    line
}

/// `portcullis pins approve`: approves what the server served last. Returns
/// the message to print.
pub fn approve(
    config: &Config,
    server: &str,
    subject: &Subject,
    hash: Option<&str>,
) -> Result<String, String> {
    if !config.servers.contains_key(server) {
        let known: Vec<&str> = config.servers.keys().map(String::as_str).collect();
        return Err(format!(
            "no server named {server:?} in {}; configured servers: {}",
            config.source,
            known.join(", ")
        ));
    }
    let path = store_path(config)?;
    let (key, what) = match subject {
        Subject::Tool(tool) => (Key::tool(server, tool), format!("tool `{}`", escaped(tool))),
        Subject::Instructions => (Key::instructions(server), "the instructions".to_owned()),
    };
    if !path.exists() {
        return Err(format!(
            "no pin store at {} yet: the gateway creates it when it first runs with this configuration",
            path.display()
        ));
    }
    match store::approve_in_file(path, &key, hash, "cli").map_err(|e| e.to_string())? {
        ApproveOutcome::Approved { hash } => Ok(format!(
            "approved {what} on server `{server}` (definition {hash}).\n\
             A gateway running with this configuration picks the approval up within a second."
        )),
        ApproveOutcome::AlreadyApproved { hash } => Ok(format!(
            "{what} on server `{server}` already serves its approved definition ({hash}); nothing to do."
        )),
        ApproveOutcome::Unknown => Err(format!(
            "no pin for {what} on server `{server}` in {}: see `portcullis pins list --config {}`",
            path.display(),
            config.source
        )),
        ApproveOutcome::HashMismatch { seen } => Err(format!(
            "{what} on server `{server}` now hashes to {seen}, not the hash given: it changed since you reviewed it. \
             Review it again with `portcullis pins list --config {}`",
            config.source
        )),
    }
}
