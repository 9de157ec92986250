//! The test tiers: the one line a plain `cargo test` prints about the tiers it
//! did not run, and a reading of the suite's source that keeps every test
//! which starts a peer behind its gate (see `tests/support/tiers.rs`).
//!
//! The reading is textual, as `layers` reads `src/` ([`scan`]): each `tests/suite/*.rs`
//! file is cut into its functions; a test needs a tier when its body, or the body of a
//! function it calls (to any depth) of the same file or imported from another suite file
//! (`use crate::FILE::{…}`), names what starts that tier's peer (the markers in
//! [`MARKERS`]). Such a test must open with `if !tiers::ready(&[Tier::…]) {` naming every
//! tier it needs, so a new test cannot forget its gate and fail on a machine with only Rust.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;

use support::tiers::{self, Tier};

mod scan;
use scan::check;

/// Text that, in a test or a function it calls, means a tier's peer starts.
/// The harness's peer kinds name their tier (`Peer::Python`, `Sdk::TypeScript`), as its
/// `podman` module does; a test that spawns a program itself names it or its folder.
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
    ("\"node\".into()", Tier::Node),
    ("join(\"inspector\")", Tier::Node),
    ("AuthServer::start", Tier::Authz),
    ("RedisServer::start", Tier::Redis),
    ("PostgresServer::start", Tier::Postgres),
    ("Haproxy::start", Tier::Haproxy),
    ("Command::new(\"podman\")", Tier::Podman),
    ("podman::", Tier::Podman),
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
/// run them. Written to the process's stderr handle itself, which libtest does not capture
/// (it captures only the `print!` family), so it shows in a plain `cargo test`.
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

/// Runs this test binary again on the `--exact` test `name` with nothing installed (an empty
/// peers folder, conformance folder and `PATH`) and `tiers` as `PORTCULLIS_TIERS`: whether
/// it passed, and its stdout and stderr.
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

/// With nothing installed the summary names every tier in one line; with every tier
/// required it says nothing.
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
    let texts: BTreeMap<String, String> = files
        .iter()
        .map(|p| {
            let stem = p.file_stem().unwrap_or_default().to_string_lossy();
            (stem.into_owned(), std::fs::read_to_string(p).expect("read"))
        })
        .collect();
    for path in files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name == "tiers.rs" {
            continue; // its markers are the scan's own table
        }
        let text = &texts[name.trim_end_matches(".rs")];
        let (found, ok) = check(&name, &(text.clone() + &scan::imported(text, &texts)));
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

/// A helper imported from another suite file counts as the file's own: a test that starts
/// a peer through it needs the gate, and one gated on that peer's tier passes.
#[test]
fn the_checker_reads_helpers_imported_from_another_file() {
    let files = BTreeMap::from([(
        "shared".to_owned(),
        "pub(crate) async fn peer() { PeerServer::start(Peer::Python).await; }\n".to_owned(),
    )]);
    let file = "use crate::shared::{\n    peer,\n};\n#[test]\nfn bare() { peer(); }\n\
                #[test]\nfn gated() {\n    if !tiers::ready(&[Tier::Python]) {\n        \
                return;\n    }\n    peer();\n}\n";
    let (problems, gated) = check("x.rs", &(file.to_owned() + &scan::imported(file, &files)));
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(
        problems[0].contains("`bare` needs tier python"),
        "{problems:#?}"
    );
    assert_eq!(gated, 1);
}
