//! The official MCP conformance suite, run differentially: each scenario once
//! directly against a Python SDK server and once through the gateway in front
//! of an identical server. A transparent gateway scores the same check by check;
//! every difference must be one the gateway makes on purpose (listed below with
//! its reason), or the test fails.
//!
//! CI runs a fast subset of transport scenarios in both eras. Set
//! `PORTCULLIS_CONFORMANCE_FULL=1` to run every server scenario the suite lists.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use support::{Peer, PeerServer, TestGateway};
use tokio::process::Command;

/// Scenario and spec version of the fast subset.
const FAST: &[(&str, &str)] = &[
    ("http-header-validation", "2026-07-28"),
    ("http-custom-header-server-validation", "2026-07-28"),
    ("dns-rebinding-protection", "2026-07-28"),
    ("caching", "2026-07-28"),
    ("server-stateless", "2026-07-28"),
    ("sep-2164-resource-not-found", "2026-07-28"),
    ("tools-list", "2026-07-28"),
    ("dns-rebinding-protection", "2025-11-25"),
    ("server-session-lifecycle", "2025-11-25"),
    ("server-sse-multiple-streams", "2025-11-25"),
    ("server-initialize", "2025-11-25"),
    ("ping", "2025-11-25"),
];

/// Checks whose outcome the gateway changes on purpose: (check id, why).
const INTENDED: &[(&str, &str)] = &[(
    "server-sse-streams-functional",
    "lists are collected across pages and filtered per client, so the gateway answers them as one \
     JSON response where the server streamed SSE (both are valid; the suite scores JSON as INFO)",
)];

/// The suite lets every client in: the gateway admits them as `anonymous`.
const OPEN_POLICY: &str = "[clients.anonymous]\n[[rules]]\nclients = [\"anonymous\"]\nservers = [\"*\"]\ntools = [\"*\"]\nresources = [\"*\"]\nprompts = [\"*\"]\naction = \"allow\"\n";

fn suite_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_CONFORMANCE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/portcullis-conformance"),
    }
}

/// Runs one scenario against `url`; returns check id → status.
async fn run(scenario: &str, spec: &str, url: &str, out: &Path) -> BTreeMap<String, String> {
    let dir = suite_dir();
    let node = dir.join("node_modules/.bin/node");
    let entry = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.exists() && entry.exists(),
        "the conformance suite is missing in {} — install it with `bash tests/conformance/setup.sh` (tests/run.sh does it)",
        dir.display()
    );
    let preload = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/force-loopback.cjs");
    let mut cmd = Command::new(node);
    cmd.arg("-r").arg(preload).arg(entry);
    cmd.args([
        "server",
        "--url",
        url,
        "--scenario",
        scenario,
        "--spec-version",
        spec,
        "-o",
    ])
    .arg(out);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let status = tokio::time::timeout(Duration::from_secs(180), cmd.status()).await;
    assert!(
        matches!(status, Ok(Ok(_))),
        "{scenario} did not finish against {url}"
    );
    let checks = find_checks(out)
        .unwrap_or_else(|| panic!("{scenario} wrote no checks.json under {}", out.display()));
    let parsed: Value = serde_json::from_str(&std::fs::read_to_string(checks).unwrap_or_default())
        .expect("checks.json");
    parsed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["id"].as_str()?.to_owned(),
                c["status"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

fn find_checks(dir: &Path) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_checks(&path) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == "checks.json") {
            return Some(path);
        }
    }
    None
}

async fn server_scenarios() -> Vec<(String, String)> {
    let dir = suite_dir();
    let output = Command::new(dir.join("node_modules/.bin/node"))
        .arg(dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["list", "--server"])
        .output()
        .await
        .expect("the suite lists its scenarios");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut all = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("- ") else {
            continue;
        };
        let Some((name, versions)) = rest.split_once(" [") else {
            continue;
        };
        for version in versions.trim_end_matches(']').split(',') {
            if version == "2025-11-25" || version == "2026-07-28" {
                all.push((name.to_owned(), version.to_owned()));
            }
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_scores_what_the_server_scores() {
    let scenarios: Vec<(String, String)> =
        if std::env::var_os("PORTCULLIS_CONFORMANCE_FULL").is_some() {
            server_scenarios().await
        } else {
            FAST.iter()
                .map(|(s, v)| ((*s).to_owned(), (*v).to_owned()))
                .collect()
        };
    let out = tempfile::tempdir().expect("temp dir");
    let mut differences = Vec::new();
    let mut table = Vec::new();
    for (scenario, spec) in &scenarios {
        // Fresh, identical servers: scenarios may change server state.
        let direct_server = PeerServer::start(Peer::Python).await;
        let proxied_server = PeerServer::start(Peer::Python).await;
        let gateway = TestGateway::start(&[("up", &proxied_server.url)], OPEN_POLICY).await;
        let label = format!("{scenario}-{spec}");
        let direct = run(
            scenario,
            spec,
            &direct_server.url,
            &out.path().join(format!("direct-{label}")),
        )
        .await;
        let proxied = run(
            scenario,
            spec,
            &gateway.url("up"),
            &out.path().join(format!("gateway-{label}")),
        )
        .await;
        let passed = |m: &BTreeMap<String, String>| m.values().filter(|s| *s == "SUCCESS").count();
        table.push(format!(
            "{scenario} ({spec}): direct {}/{} passed, through the gateway {}/{}",
            passed(&direct),
            direct.len(),
            passed(&proxied),
            proxied.len()
        ));
        let ids: std::collections::BTreeSet<&String> =
            direct.keys().chain(proxied.keys()).collect();
        for id in ids {
            let (a, b) = (direct.get(id), proxied.get(id));
            if a != b && !INTENDED.iter().any(|(i, _)| i == id) {
                differences.push(format!(
                    "{scenario} ({spec}) {id}: direct {a:?}, gateway {b:?}"
                ));
            }
        }
        gateway.stop().await;
        direct_server.stop().await;
        proxied_server.stop().await;
    }
    println!("{}", table.join("\n"));
    assert!(
        differences.is_empty(),
        "the gateway changed these outcomes:\n{}",
        differences.join("\n")
    );
}
