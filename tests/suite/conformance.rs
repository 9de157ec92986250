//! The official MCP conformance suite, run differentially in both of its modes.
//!
//! Server mode: each scenario once directly against a Python SDK server (with
//! the fixture tools, resources and prompts the scenarios ask for, see
//! `tests/peers/py_server.py --fixtures`) and once through the gateway in front
//! of an identical server. Client mode: the suite
//! plays the server, and each scenario runs once with a Python SDK client talking
//! to it directly and once with the same client talking to the real `portcullis`
//! binary that has the suite's server as its upstream. A transparent gateway
//! scores the same check by check; every difference must be one the gateway
//! makes on purpose (listed in [`INTENDED`] with its reason), or the test fails.
//!
//! CI runs a fast subset. `PORTCULLIS_CONFORMANCE_FULL=1` runs every server
//! scenario the suite lists and every client scenario in [`CLIENT`];
//! `PORTCULLIS_CONFORMANCE_REPORT=CONFORMANCE.md` also writes the result tables
//! into that file (see CONFORMANCE.md for the exact command).

use crate::support;
use support::tiers::{self, Tier};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use support::{Peer, PeerServer, TestGateway, peers_dir};
use tokio::process::Command;

/// Server scenario and spec version of the fast subset.
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
    ("tools-call-with-progress", "2026-07-28"),
    ("tools-call-mixed-content", "2025-11-25"),
];

/// Client scenarios (and spec versions) an ordinary SDK client can play: the
/// protocol ones. The `auth/*` scenarios test a client's OAuth flow, which the
/// gateway does not take part in (it authenticates its own clients and holds
/// its own upstream credentials); `sse-retry` and `elicitation-*`,
/// `sep-2322-*`, `http-invalid-tool-headers` need client behaviour the Python
/// SDK client does not have. `json-schema-ref-no-deref` reads its server's
/// address before the listen completes, which the loopback-only preload
/// defers. The bool marks the fast subset.
const CLIENT: &[(&str, &str, bool)] = &[
    ("initialize", "2025-11-25", true),
    ("tools_call", "2025-11-25", true),
    ("tools_call", "2026-07-28", true),
    ("json-schema-2020-12-preservation", "2026-07-28", true),
    ("json-schema-2020-12-preservation", "2025-11-25", false),
    ("request-metadata", "2026-07-28", false),
    ("http-standard-headers", "2026-07-28", false),
    ("http-custom-headers", "2026-07-28", false),
];

/// Outcomes the gateway changes on purpose: (scenario, check id, why); `*`
/// matches every check of the scenario.
const INTENDED: &[(&str, &str, &str)] = &[
    (
        "server-sse-multiple-streams",
        "server-sse-streams-functional",
        "lists are collected across pages and filtered per client, so the gateway answers them as \
         one JSON response where the server streamed SSE (both are valid; the suite scores JSON as \
         INFO)",
    ),
    (
        "server-sse-polling",
        "*",
        "the server closes the call's SSE stream mid-call and answers on the stream the client \
         resumes with Last-Event-ID (SEP-1699 polling); the gateway gives every tools/call one \
         answer on the stream it was asked on, judged by its output checks (secrets = \"block\", \
         outputSchema, failure rewriting), which an answer arriving on a resumed GET stream would \
         escape, so it answers `upstream_protocol_error` when the stream ends unanswered",
    ),
    (
        "input-required-result-validate-input",
        "sep-2322-validate-input-responses",
        "the scenario calls `test_input_required_result_elicitation`, a tool the server does not \
         list (the fixtures lack the input-required tools); the gateway answers a call to an \
         unlisted tool itself with an actionable `isError` naming the tools there are, so the \
         server's own rejection of the malformed `inputResponses` (-32602) is never reached",
    ),
    (
        "http-custom-headers",
        "sep-2243-client-omit-null",
        "the gateway validates arguments against the tool's inputSchema: the scenario's call sends \
         `verbose: null` for a `boolean` property, which the gateway refuses as `invalid_arguments` \
         before it reaches the server, so the header check never runs",
    ),
];

/// The suite lets every client in: the gateway admits them as `anonymous`.
const OPEN_POLICY: &str = "[clients.anonymous]\n[[rules]]\nclients = [\"anonymous\"]\nservers = [\"*\"]\ntools = [\"*\"]\nresources = [\"*\"]\nprompts = [\"*\"]\naction = \"allow\"\n";

/// Serialises rewrites of the report file by the tests of this binary.
static REPORT: Mutex<()> = Mutex::new(());

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn full() -> bool {
    std::env::var_os("PORTCULLIS_CONFORMANCE_FULL").is_some()
}

/// Node 22 and the suite's entry point; fails (never skips) when either is missing.
fn suite() -> (PathBuf, PathBuf) {
    let dir = match std::env::var_os("PORTCULLIS_CONFORMANCE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/portcullis-conformance"),
    };
    let node = dir.join("node_modules/.bin/node");
    let entry = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.exists() && entry.exists(),
        "the conformance suite or Node 22 is missing in {} — install them with `bash tests/conformance/setup.sh` (tests/run.sh does it)",
        dir.display()
    );
    (node, entry)
}

fn suite_version() -> String {
    let (_, entry) = suite();
    let manifest = entry
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("package.json"));
    manifest
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .expect("the suite's package.json has a version")
}

/// One check's outcome, keyed by id and occurrence (a scenario may repeat an id).
type Checks = BTreeMap<(String, usize), String>;

/// Runs the suite with `args` (mode first) and `-o out`; returns its checks.
async fn run(args: &[&str], env: &[(&str, &str)], out: &Path) -> Checks {
    let (node, entry) = suite();
    let mut cmd = Command::new(node);
    cmd.arg("-r")
        .arg(repo("tests/peers/force-loopback.cjs"))
        .arg(entry)
        .args(args)
        .arg("-o")
        .arg(out)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(180), cmd.output()).await;
    let Ok(Ok(output)) = output else {
        panic!("{args:?} did not finish");
    };
    let checks = find_checks(out).unwrap_or_else(|| {
        let log = String::from_utf8_lossy(&output.stderr);
        let tail: String = log
            .chars()
            .rev()
            .take(1500)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        panic!(
            "{args:?} wrote no checks.json under {}; its log ends:\n{tail}",
            out.display()
        )
    });
    let parsed: Value = serde_json::from_str(&std::fs::read_to_string(checks).unwrap_or_default())
        .expect("checks.json");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut result = Checks::new();
    for c in parsed.as_array().into_iter().flatten() {
        let (Some(id), Some(status)) = (c["id"].as_str(), c["status"].as_str()) else {
            continue;
        };
        let n = seen.entry(id.to_owned()).or_default();
        *n += 1;
        result.insert((id.to_owned(), *n), status.to_owned());
    }
    result
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

/// Scenarios of one mode (`--server` / `--client`) with the spec versions the
/// suite lists for each, limited to the two eras the gateway speaks.
async fn listed(mode: &str) -> Vec<(String, String)> {
    let (node, entry) = suite();
    let output = Command::new(node)
        .arg(entry)
        .args(["list", mode])
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
    assert!(!all.is_empty(), "the suite listed no {mode} scenarios");
    all
}

/// One scenario's two runs, compared.
struct Row {
    scenario: String,
    spec: String,
    direct: Checks,
    gateway: Checks,
}

impl Row {
    fn compare(scenario: &str, spec: &str, direct: Checks, gateway: Checks) -> Self {
        Self {
            scenario: scenario.to_owned(),
            spec: spec.to_owned(),
            direct,
            gateway,
        }
    }

    /// (check id, direct status, gateway status, intended reason) of every check that differs.
    fn differences(&self) -> Vec<(String, String, String, Option<&'static str>)> {
        let keys: std::collections::BTreeSet<_> =
            self.direct.keys().chain(self.gateway.keys()).collect();
        keys.into_iter()
            .filter_map(|k| {
                let (a, b) = (self.direct.get(k), self.gateway.get(k));
                (a != b).then(|| {
                    let why = INTENDED
                        .iter()
                        .find(|(s, i, _)| *s == self.scenario && (*i == "*" || *i == k.0))
                        .map(|(_, _, w)| *w);
                    let show = |s: Option<&String>| s.cloned().unwrap_or_else(|| "absent".into());
                    (k.0.clone(), show(a), show(b), why)
                })
            })
            .collect()
    }
}

/// `passed / failed`, then the warnings and the unscored checks when there are any.
fn counts(checks: &Checks) -> String {
    let n = |s: &str| checks.values().filter(|v| *v == s).count();
    let (passed, failed, warned) = (n("SUCCESS"), n("FAILURE"), n("WARNING"));
    let mut text = format!("{passed} / {failed}");
    if warned > 0 {
        text.push_str(&format!(", {warned} warning"));
    }
    let unscored = checks.len() - passed - failed - warned;
    if unscored > 0 {
        text.push_str(&format!(", {unscored} info/skipped"));
    }
    text
}

/// Prints the table, writes it into the report file when one is asked for,
/// and fails on any difference the gateway does not make on purpose.
fn conclude(mode: &str, command: &str, rows: &[Row]) {
    let mut table = String::from(
        "| scenario | era | direct: passed / failed | through the gateway | differences |\n|---|---|---|---|---|\n",
    );
    let mut unexpected = Vec::new();
    for row in rows {
        let diffs = row.differences();
        let cell = if diffs.is_empty() {
            "none".to_owned()
        } else {
            diffs
                .iter()
                .map(|(id, a, b, why)| {
                    if why.is_none() {
                        unexpected.push(format!(
                            "{} ({}) {id}: direct {a}, gateway {b}",
                            row.scenario, row.spec
                        ));
                    }
                    let tag = if why.is_some() {
                        "intended"
                    } else {
                        "UNEXPECTED"
                    };
                    format!("`{id}` {a} → {b} ({tag})")
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        table.push_str(&format!(
            "| {} | {} | {} | {} | {cell} |\n",
            row.scenario,
            row.spec,
            counts(&row.direct),
            counts(&row.gateway)
        ));
    }
    println!("{table}");
    if let Some(path) = std::env::var_os("PORTCULLIS_CONFORMANCE_REPORT") {
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        let scope = if full() { "full" } else { "fast subset" };
        let block = format!(
            "Generated {date} by `{command}` ({scope}), suite `@modelcontextprotocol/conformance` {}.\n\n{table}",
            suite_version()
        );
        write_block(Path::new(&path), mode, &block);
    }
    assert!(
        unexpected.is_empty(),
        "the gateway changed these outcomes:\n{}",
        unexpected.join("\n")
    );
}

/// Replaces the text between `<!-- BEGIN {mode} -->` and `<!-- END {mode} -->`
/// in `path` (appending the block when the markers are absent).
fn write_block(path: &Path, mode: &str, block: &str) {
    let _guard = REPORT.lock().unwrap_or_else(|e| e.into_inner());
    let (begin, end) = (
        format!("<!-- BEGIN {mode} -->"),
        format!("<!-- END {mode} -->"),
    );
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let fresh = format!("{begin}\n{block}{end}");
    let updated = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => format!("{}{fresh}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{text}\n{fresh}\n"),
    };
    std::fs::write(path, updated).expect("the report file is writable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_scores_what_the_server_scores() {
    if !tiers::ready(&[Tier::Python, Tier::Conformance]) {
        return;
    }
    let scenarios: Vec<(String, String)> = if full() {
        listed("--server").await
    } else {
        FAST.iter()
            .map(|(s, v)| ((*s).to_owned(), (*v).to_owned()))
            .collect()
    };
    let out = tempfile::tempdir().expect("temp dir");
    let mut rows = Vec::new();
    for (scenario, spec) in &scenarios {
        // Fresh, identical servers: scenarios may change server state.
        let direct_server = PeerServer::start(Peer::PythonFixtures).await;
        let proxied_server = PeerServer::start(Peer::PythonFixtures).await;
        let gateway = TestGateway::start(&[("up", &proxied_server.url)], OPEN_POLICY).await;
        let label = format!("{scenario}-{spec}");
        let gateway_url = gateway.url("up");
        let mut legs = Vec::new();
        for (leg, url) in [("direct", &direct_server.url), ("gateway", &gateway_url)] {
            let args = [
                "server",
                "--url",
                url,
                "--scenario",
                scenario,
                "--spec-version",
                spec,
            ];
            legs.push(run(&args, &[], &out.path().join(format!("{leg}-{label}"))).await);
        }
        let proxied = legs.pop().unwrap_or_default();
        let direct = legs.pop().unwrap_or_default();
        rows.push(Row::compare(scenario, spec, direct, proxied));
        gateway.stop().await;
        direct_server.stop().await;
        proxied_server.stop().await;
    }
    conclude(
        "server",
        "PORTCULLIS_CONFORMANCE_FULL=1 PORTCULLIS_CONFORMANCE_REPORT=$PWD/CONFORMANCE.md cargo test --test suite conformance::",
        &rows,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_scores_the_same_through_the_gateway() {
    if !tiers::ready(&[Tier::Python, Tier::Conformance]) {
        return;
    }
    let python = peers_dir().join("venv/bin/python");
    assert!(
        python.exists(),
        "the Python SDK venv is missing at {} — install the test peers with `bash tests/peers/setup.sh`",
        python.display()
    );
    let client = repo("tests/conformance/client.py");
    let wrapper = repo("tests/conformance/through_gateway.sh");
    // The suite splits its --command on spaces.
    for p in [&python, &client, &wrapper] {
        assert!(
            !p.to_string_lossy().contains(' '),
            "{} has a space in its path",
            p.display()
        );
    }
    let direct_command = format!("{} {}", python.display(), client.display());
    let gateway_command = format!("bash {} {direct_command}", wrapper.display());
    let listed = listed("--client").await;
    let out = tempfile::tempdir().expect("temp dir");
    let mut rows = Vec::new();
    for (scenario, spec, fast) in CLIENT {
        if !fast && !full() {
            continue;
        }
        assert!(
            listed.iter().any(|(s, v)| s == scenario && v == spec),
            "the suite no longer lists the client scenario {scenario} at {spec}"
        );
        let label = format!("{scenario}-{spec}");
        let mut results = Vec::new();
        for (leg, command) in [("direct", &direct_command), ("gateway", &gateway_command)] {
            let args = [
                "client",
                "--command",
                command,
                "--scenario",
                scenario,
                "--spec-version",
                spec,
            ];
            let env = [("PORTCULLIS_BIN", env!("CARGO_BIN_EXE_portcullis"))];
            let checks = run(&args, &env, &out.path().join(format!("{leg}-{label}"))).await;
            results.push(checks);
        }
        let gateway = results.pop().unwrap_or_default();
        let direct = results.pop().unwrap_or_default();
        rows.push(Row::compare(scenario, spec, direct, gateway));
    }
    conclude(
        "client",
        "PORTCULLIS_CONFORMANCE_FULL=1 PORTCULLIS_CONFORMANCE_REPORT=$PWD/CONFORMANCE.md cargo test --test suite conformance::",
        &rows,
    );
}
