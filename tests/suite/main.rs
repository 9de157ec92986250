//! The integration suite: one test binary, so the harness in `tests/support/`
//! is compiled once and shared by every story.
//!
//! Each module is one topic (the file names of the former per-file test
//! binaries, so `cargo test --test suite audit::` runs what
//! `cargo test --test audit` ran). Every test runs in this one process, in
//! parallel with the others (as many at once as libtest runs, two on two
//! cores, as the per-file binaries did): a test keeps its state in its own
//! temporary directory, its own ports (picked by the OS) and its own processes,
//! passes environment to the children it starts (`Command::env`), never to this
//! process, and never changes what the process shares (the current directory;
//! the log: a test reads it through `support::log`, one subscriber for the
//! process that keeps only the capturing thread's events). The one
//! process-wide change, `overload`'s raise of the soft descriptor limit to the
//! hard one, only gives every test more room. The one serialization,
//! `support::exclusive`, keeps the test that measures against the wall clock
//! apart from the CPU-bound ones (see there why).
//!
//! To add a topic: put `tests/suite/NAME.rs` next to the others, starting with
//! `use crate::support;` (and `use support::{...}` for the parts it needs), and
//! declare it below with `mod NAME;` in alphabetical order. A file that is not
//! declared here, or one left in `tests/` itself, is not compiled:
//! `every_module_is_declared` fails then.

#[path = "../support/mod.rs"]
mod support;

mod approvals;
mod approvals_bounds;
mod approvals_edges;
mod approvals_render;
mod approvals_settings;
mod audit;
mod audit_subjects;
mod bad_input;
mod battery;
mod battery_clients;
mod browser;
mod catalog;
mod check;
mod check_uses;
mod conformance;
mod container;
mod container_deploy;
mod container_fleet;
mod credentials;
mod dashboard;
mod demo;
mod deploy;
mod docs;
mod edges;
mod edges_reload;
mod expressions;
mod expressions_resources;
mod federation;
mod fleet;
mod fleet_approvals;
mod fleet_attacks;
mod fleet_flows;
mod fleet_state;
mod flow;
mod flow_attacks;
mod flow_sources;
mod fuzz;
mod held_calls;
mod held_calls_reload;
mod hostile_schemas;
mod identity;
mod identity_leaks;
mod jwt;
mod jwt_metadata;
mod layers;
mod methods;
mod methods_operator;
mod metrics;
mod observe;
mod overload;
mod pinning;
mod pinning_cli;
mod policy;
mod rate_limit_replicas;
mod rate_limits;
mod rate_refunds;
mod ratelimit;
mod refusals;
mod reload;
mod resilience;
mod resilience_deadlines;
mod resilience_merged;
mod resilience_stdio;
mod resolution;
mod resources;
mod resources_queries;
mod resources_references;
mod resources_spellings;
mod resources_updated;
mod resources_updated_merged;
mod rewrite;
mod sanitize;
mod sanitize_framing;
mod sanitize_messages;
mod sanitize_positions;
mod sanitize_props;
mod sanitize_results;
mod sdk;
mod shutdown;
mod stdio;
mod stores;
mod tasks;
mod telemetry;
mod tiers;
mod typed_request;
mod upstream_failures;

/// Every `tests/suite/*.rs` file is a module of this binary, and no test file
/// lies in `tests/` itself (with `autotests = false` Cargo builds none there):
/// one left out would never be compiled nor run, silently.
#[test]
fn every_module_is_declared() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let rust_files = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("a tests directory")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "rs"))
            .filter_map(|path| Some(path.file_stem()?.to_str()?.to_owned()))
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        rust_files(&tests),
        Vec::<String>::new(),
        "test files in tests/ are not built: move them to tests/suite/ and declare them in main.rs"
    );
    let main = std::fs::read_to_string(tests.join("suite/main.rs")).expect("main.rs");
    let missing: Vec<String> = rust_files(&tests.join("suite"))
        .into_iter()
        .filter(|name| name != "main" && !main.lines().any(|l| l.trim() == format!("mod {name};")))
        .collect();
    assert!(
        missing.is_empty(),
        "not declared in tests/suite/main.rs: {missing:?}"
    );
}
