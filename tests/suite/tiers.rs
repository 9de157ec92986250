//! The test tiers: the one line a plain `cargo test` prints about the tiers it
//! did not run, and a reading of the suite's source that keeps every test
//! which starts a peer behind its gate (see `tests/support/tiers.rs`).
//!
//! The reading is textual, as `layers` reads `src/`: each `tests/suite/*.rs`
//! file is cut into its functions; a test needs a tier when its body, or the
//! body of a function of the same file it calls (to any depth), names what
//! starts that tier's peer (the markers in [`MARKERS`]). Such a test must open
//! with `if !tiers::ready(&[Tier::…]) {` naming every tier it needs, so a new
//! test cannot forget its gate and fail on a machine with only Rust.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;

use support::tiers::{self, Tier};

/// Text that, in a test or a function it calls, means a tier's peer starts.
/// The harness's peer kinds name their tier (`Peer::Python`, `Sdk::TypeScript`);
/// a test that spawns a program itself names the program or its folder.
const MARKERS: &[(&str, Tier)] = &[
    ("Peer::Python", Tier::Python),
    ("Peer::FastMcp", Tier::Python),
    ("Sdk::Python", Tier::Python),
    ("IdentityPeer::start", Tier::Python),
    ("venv/bin/python", Tier::Python),
    ("Peer::TypeScript", Tier::Node),
    ("Peer::Everything", Tier::Node),
    ("Sdk::TypeScript", Tier::Node),
    ("Command::new(\"node\")", Tier::Node),
    ("join(\"inspector\")", Tier::Node),
    ("AuthServer::start", Tier::Authz),
    ("RedisServer::start", Tier::Redis),
    ("PostgresServer::start", Tier::Postgres),
    ("Haproxy::start", Tier::Haproxy),
    ("Command::new(\"podman\")", Tier::Podman),
    ("chromium", Tier::Chromium),
    ("portcullis-conformance", Tier::Conformance),
];

/// The harness's functions that start a peer. A test that reaches one must
/// be gated even when no marker tells the tier (a peer kind read from a table
/// outside any function, say): then the scan asks for a gate all the same.
const STARTERS: &[&str] = &[
    "PeerServer::start",
    "StdioPeer::new",
    "sdk(",
    "eliciting(",
    "AuthServer::start",
    "IdentityPeer::start",
    "RedisServer::start",
    "PostgresServer::start",
    "Haproxy::start",
];

/// The one line, once per run of the suite: which tiers did not run and how to
/// run them. Written to the process's stderr handle itself, which libtest
/// does not capture (it captures only the `print!` family), so it shows in a
/// plain `cargo test`.
#[test]
fn summary() {
    let skipped = tiers::not_run();
    if skipped.is_empty() {
        return;
    }
    let names: Vec<&str> = skipped.iter().map(|t| t.name()).collect();
    let line = format!(
        "\ntiers not run: {} — run `bash tests/run.sh` to install the peers and run them\n",
        names.join(", ")
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// `PORTCULLIS_TIERS=all` (what `tests/run.sh` exports) requires every tier,
/// so a missing peer fails instead of skipping.
#[test]
fn tests_run_sh_requires_every_tier() {
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/run.sh"))
            .expect("tests/run.sh");
    assert!(
        script
            .lines()
            .any(|l| l.trim() == "export PORTCULLIS_TIERS=all"),
        "tests/run.sh must export PORTCULLIS_TIERS=all: the test command runs every tier"
    );
}

/// Runs this test binary again on the `--exact` test `name` with nothing
/// installed (an empty peers folder, conformance folder and `PATH`) and
/// `tiers` as `PORTCULLIS_TIERS`: whether it passed, and its stdout and stderr.
fn rerun(name: &str, tiers: Option<&str>) -> (bool, String) {
    let empty = tempfile::tempdir().expect("temp dir");
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([name, "--exact", "--nocapture", "--test-threads", "1"])
        .env("PORTCULLIS_PEERS", empty.path())
        .env("PORTCULLIS_CONFORMANCE", empty.path())
        .env("PATH", empty.path())
        .env_remove("PORTCULLIS_TIERS");
    if let Some(tiers) = tiers {
        cmd.env("PORTCULLIS_TIERS", tiers);
    }
    let out = cmd.output().expect("the test binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// With nothing installed the summary names every tier in one line; with
/// every tier required it says nothing.
#[test]
fn the_summary_names_every_tier_not_run() {
    let (passed, text) = rerun("tiers::summary", None);
    assert!(passed, "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tiers not run:"))
        .collect();
    // PostgreSQL and HAProxy are found by their Debian paths, not the PATH:
    // where they are installed the emptied PATH still finds them.
    let not_run: Vec<&str> = [
        ("python", true),
        ("node", true),
        ("authz", true),
        ("redis", true),
        ("postgres", support::postgres::bin_dir().is_none()),
        ("haproxy", support::haproxy::program().is_none()),
        ("podman", true),
        ("chromium", true),
        ("conformance", true),
    ]
    .into_iter()
    .filter_map(|(tier, missing)| missing.then_some(tier))
    .collect();
    assert_eq!(
        lines,
        [format!(
            "tiers not run: {} — run `bash tests/run.sh` to install the peers and run them",
            not_run.join(", ")
        )],
        "{text}"
    );
    let (passed, text) = rerun("tiers::summary", Some("all"));
    assert!(passed && !text.contains("tiers not run"), "{text}");
}

/// A gated test passes without its peer, noting the skip; the same test with
/// its tier required (`tests/run.sh`) fails on the missing peer.
#[test]
fn a_gated_test_skips_without_its_peer_and_fails_when_its_tier_is_required() {
    let test = "sdk::python_client_legacy_to_python_server";
    let (passed, text) = rerun(test, None);
    assert!(passed, "{text}");
    assert!(text.contains("skipped: tier python not ready"), "{text}");
    for required in ["all", "python", "redis, python"] {
        let (passed, text) = rerun(test, Some(required));
        assert!(!passed, "PORTCULLIS_TIERS={required}: {text}");
        assert!(text.contains("the Python SDK venv is missing"), "{text}");
    }
    let (passed, text) = rerun(test, Some("redis"));
    assert!(passed && text.contains("skipped: tier python"), "{text}");
}

/// Every test that starts a tier's peer opens with the gate naming that tier.
#[test]
fn every_test_that_starts_a_peer_is_gated() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite");
    let mut problems = Vec::new();
    let mut gated = 0;
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/suite")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name == "tiers.rs" {
            continue; // its markers are the scan's own table
        }
        let (found, ok) = check(&name, &std::fs::read_to_string(&path).expect("read"));
        problems.extend(found);
        gated += ok;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(gated > 0, "the scan found no gated test: it reads nothing");
}

/// The checker on small files: it sees a missing gate, a gate that names
/// too few tiers or too many, a peer reached through a helper of the file, and
/// a peer started with no marker; a brace in a string opens no block; it
/// passes a gated test and one that starts nothing.
#[test]
fn the_checker_sees_an_ungated_test() {
    let file = r#"
fn helper() { let _ = RedisServer::start(); }
fn peer(kind: Peer) { let _ = PeerServer::start(kind); }
#[test]
fn too_many() {
    if !tiers::ready(&[Tier::Redis, Tier::Node]) {
        return;
    }
    let _ = "\"error\":{";
    helper();
}
#[test]
fn bare() { let _ = PeerServer::start(Peer::Python); }
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    let _ = PeerServer::start(Peer::Python).await;
    sdk(Sdk::TypeScript, Mode::Modern, "", "", list()).await;
}
#[test]
fn through_a_helper() { helper(); }
const KINDS: &[Sdk] = &[Sdk::TypeScript];
#[test]
fn unknown_kind() { peer(UNKNOWN[0]); }
#[test]
fn from_a_table() {
    if !tiers::ready(&[Tier::Python]) {
        return;
    }
    peer(KINDS[0]);
}
#[test]
fn gated() {
    if !tiers::ready(&[Tier::Redis]) {
        return;
    }
    helper();
}
#[test]
fn nothing() { let _ = run_sdk(1); }
"#;
    let (problems, gated) = check("x.rs", file);
    let named: Vec<&str> = problems
        .iter()
        .map(|p| p.split('`').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(
        named,
        [
            "too_many",
            "bare",
            "too_few",
            "through_a_helper",
            "unknown_kind",
            "from_a_table",
            "from_a_table"
        ],
        "{problems:#?}"
    );
    assert!(problems[0].contains("does not need"), "{}", problems[0]);
    assert!(problems[2].contains("needs tier node"), "{}", problems[2]);
    assert_eq!(gated, 1);
}

/// The problems of the file `name` with `text`, and how many tests it gates
/// as they should be.
fn check(name: &str, text: &str) -> (Vec<String>, usize) {
    let text = without_comments(text);
    let fns = functions(&text);
    let mut problems = Vec::new();
    let mut gated = 0;
    for test in tests(&blank_literals(&text)) {
        let (need, starts) = needs(&test, &fns);
        let have = gate(&fns[&test][0]);
        let extra: Vec<&str> = have
            .iter()
            .filter(|t| !need.contains(t))
            .map(|t| t.name())
            .collect();
        if !extra.is_empty() && (!need.is_empty() || !starts) {
            problems.push(format!(
                "{name}: `{test}` is gated on tier {} that it does not need: it would be \
                 skipped where it could run",
                extra.join(", ")
            ));
        }
        if need.is_empty() {
            if starts && have.is_empty() {
                problems.push(format!(
                    "{name}: `{test}` starts a peer through the harness but names no tier's \
                     marker; open it with `if !tiers::ready(&[Tier::…]) {{ return; }}` \
                     naming the tiers it needs"
                ));
            }
            continue;
        }
        let missing: Vec<&str> = need
            .iter()
            .filter(|t| !have.contains(t))
            .map(|t| t.name())
            .collect();
        if missing.is_empty() {
            gated += usize::from(extra.is_empty());
        } else {
            problems.push(format!(
                "{name}: `{test}` needs tier {} but does not open with \
                 `if !tiers::ready(&[{}]) {{ return; }}`",
                missing.join(", "),
                need.iter()
                    .map(|t| format!("Tier::{t:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    (problems, gated)
}

/// The tiers `test` needs: the markers in its body and in the bodies of the
/// file's functions it calls, to any depth; and whether those bodies call one
/// of the harness's [`STARTERS`].
fn needs(test: &str, fns: &BTreeMap<String, Vec<String>>) -> (BTreeSet<Tier>, bool) {
    let mut seen = BTreeSet::from([test.to_owned()]);
    let mut todo = vec![test.to_owned()];
    let mut need = BTreeSet::new();
    let mut starts = false;
    while let Some(f) = todo.pop() {
        for body in &fns[&f] {
            starts |= STARTERS.iter().any(|s| calls_starter(body, s));
            for (marker, tier) in MARKERS {
                if body.contains(marker) {
                    need.insert(*tier);
                }
            }
            for callee in calls(body) {
                if fns.contains_key(&callee) && seen.insert(callee.clone()) {
                    todo.push(callee);
                }
            }
        }
    }
    (need, starts)
}

/// Whether `body` calls `starter` (`sdk(` as a word, not `run_sdk(`).
fn calls_starter(body: &str, starter: &str) -> bool {
    body.match_indices(starter).any(|(i, _)| {
        !body[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The tiers named by the gate `body` opens with (none without one).
fn gate(body: &str) -> BTreeSet<Tier> {
    let body = body.trim_start_matches('{').trim_start();
    let Some(rest) = body
        .strip_prefix("if !tiers::ready(&[")
        .or_else(|| body.strip_prefix("if !support::tiers::ready(&["))
    else {
        return BTreeSet::new();
    };
    let list = rest.split("])").next().unwrap_or_default();
    Tier::ALL
        .into_iter()
        .filter(|t| list.contains(&format!("Tier::{t:?}")))
        .collect()
}

/// Names of the test functions of a file (`#[test]`, `#[tokio::test…]`).
fn tests(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[") {
        rest = &rest[at + 2..];
        let attr = rest.split(']').next().unwrap_or_default();
        // A proptest case (`fn name(x in strategy)`) cannot return early; none
        // starts a peer.
        let args = rest.split(')').next().unwrap_or_default();
        if (attr == "test" || attr.starts_with("tokio::test"))
            && !args.contains(" in ")
            && let Some(name) = next_fn(rest)
        {
            out.push(name);
        }
    }
    out
}

/// The name of the next `fn` in `text`.
fn next_fn(text: &str) -> Option<String> {
    let at = word(text, "fn")?;
    ident_after(&text[at + 2..])
}

/// The identifier `text` starts with, after blanks (`mut` skipped).
fn ident_after(text: &str) -> Option<String> {
    let text = text.trim_start();
    let text = text.strip_prefix("mut ").unwrap_or(text).trim_start();
    let name: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Every function of a file (methods too) by name, with its body (braces
/// included); a name defined twice keeps both bodies.
fn functions(text: &str) -> BTreeMap<String, Vec<String>> {
    // Items and braces are found in `code`, where literals are blanked; the
    // bodies are cut from `text` at the same offsets, markers and all.
    let code = blank_literals(text);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut from = 0;
    // A `const` or `static` (a table of peer kinds, say), up to its `;`.
    for kw in ["const", "static"] {
        let mut from = 0;
        while let Some(at) = word(&code[from..], kw) {
            let start = from + at;
            from = start + kw.len();
            let Some(name) = ident_after(&code[from..]) else {
                continue;
            };
            let end = code[start..].find(";\n").map_or(code.len(), |e| start + e);
            out.entry(name)
                .or_default()
                .push(text[start..end].to_owned());
        }
    }
    while let Some(at) = word(&code[from..], "fn") {
        let start = from + at;
        from = start + 2;
        let Some(name) = next_fn(&code[start..]) else {
            continue;
        };
        // The body: from the first `{` (a declaration ending in `;` has none).
        let after = &code[start..];
        let (Some(open), semi) = (after.find('{'), after.find(';')) else {
            continue;
        };
        if semi.is_some_and(|s| s < open) {
            continue;
        }
        let len = braced(&after[open..]).len();
        let body = &text[start + open..start + open + len];
        out.entry(name).or_default().push(body.to_owned());
    }
    out
}

/// `text` with the inside of every string and char literal replaced by
/// spaces of the same byte length, so a `{` in `"\"error\":{"` or `'{'`
/// opens no block.
fn blank_literals(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let blank = |out: &mut String, c: char| out.push_str(&" ".repeat(c.len_utf8()));
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // A raw string: r"…", r#"…"# (any number of #), br"…".
        if c == 'r' && !ident_before(&chars, i) {
            let hashes = chars[i + 1..].iter().take_while(|h| **h == '#').count();
            if chars.get(i + 1 + hashes) == Some(&'"') {
                for &h in &chars[i..i + 2 + hashes] {
                    out.push(h);
                }
                i += 2 + hashes;
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                while i < chars.len() {
                    let rest: String = chars[i..(i + close.len()).min(chars.len())]
                        .iter()
                        .collect();
                    if rest == close {
                        out.push_str(&close);
                        i += close.len();
                        break;
                    }
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                continue;
            }
        }
        if c == '"' {
            out.push(c);
            i += 1;
            while i < chars.len() {
                match chars[i] {
                    '\\' => {
                        blank(&mut out, chars[i]);
                        if let Some(&n) = chars.get(i + 1) {
                            blank(&mut out, n);
                        }
                        i += 2;
                    }
                    '"' => {
                        out.push('"');
                        i += 1;
                        break;
                    }
                    other => {
                        blank(&mut out, other);
                        i += 1;
                    }
                }
            }
            continue;
        }
        // A char literal ('{', '\n'); a lifetime ('a) has no closing quote.
        if c == '\'' {
            let len = if chars.get(i + 1) == Some(&'\\') {
                4
            } else {
                3
            };
            if chars.get(i + len - 1) == Some(&'\'') {
                out.push('\'');
                for &inner in &chars[i + 1..i + len - 1] {
                    blank(&mut out, inner);
                }
                out.push('\'');
                i += len;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Whether an identifier character stands before `chars[i]` (the `b` of a
/// byte string `br"…"` does not count).
fn ident_before(chars: &[char], i: usize) -> bool {
    let is_ident = |c: &char| c.is_alphanumeric() || *c == '_';
    match i.checked_sub(1).map(|p| (p, chars[p])) {
        None => false,
        Some((p, 'b')) => p.checked_sub(1).is_some_and(|q| is_ident(&chars[q])),
        Some((_, c)) => is_ident(&c),
    }
}

/// The `{…}` block `text` starts with.
fn braced(text: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return &text[..=i];
                }
            }
            _ => {}
        }
    }
    text
}

/// The identifiers in `body`: the functions it may call, the tables it reads.
fn calls(body: &str) -> BTreeSet<String> {
    body.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Where the keyword `kw` first stands as a word in `text`.
fn word(text: &str, kw: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(at) = text[from..].find(kw) {
        let i = from + at;
        let before = text[..i].chars().next_back();
        let after = text[i + kw.len()..].chars().next();
        if !before.is_some_and(is_ident) && !after.is_some_and(is_ident) {
            return Some(i);
        }
        from = i + kw.len();
    }
    None
}

/// The text without `//` comments (string literals kept: markers live there).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string (a URL) is kept.
            Some(i) if l[..i].matches('"').count() % 2 == 0 => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}
