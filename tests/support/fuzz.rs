//! The fuzz driver shared by every target (`tests/suite/fuzz.rs` for the public
//! modules, `src/mcp/fuzz.rs` for the wire parsers): each target first replays
//! its seed corpus in `tests/fuzz/corpus/<target>/`, then runs generated cases.
//!
//! CI runs a modest number of cases. `PORTCULLIS_FUZZ_CASES=N` sets the number
//! per round; `PORTCULLIS_FUZZ_SECONDS=S` keeps starting new rounds, each from
//! a fresh seed, until S seconds have passed, and prints how many inputs ran.
//! A failure prints the shrunk input: add it to the corpus once fixed.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Generated cases per round in CI.
const CI_CASES: u32 = 256;

/// The seed corpus of `target`: (file name, bytes), sorted by name. A target
/// without a corpus directory fails: the corpus is part of the suite.
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(e.path()).expect("read corpus file");
            (name, bytes)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Replays the corpus of `target` through `replay` (a panic names the file),
/// then runs `check` on generated inputs as described in the module header.
pub fn run<S: Strategy>(
    target: &str,
    replay: impl Fn(&[u8]),
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    for (name, bytes) in corpus(target) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay(&bytes)));
        if let Err(e) = outcome {
            std::panic::resume_unwind(Box::new(format!(
                "{target}: corpus file {name} failed: {}",
                e.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("panic")
            )));
        }
    }
    let cases = env_number("PORTCULLIS_FUZZ_CASES").map_or(CI_CASES, |n| n as u32);
    let budget = env_number("PORTCULLIS_FUZZ_SECONDS").map(Duration::from_secs);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let started = Instant::now();
    let mut executed: u64 = 0;
    let mut round: u64 = 0;
    loop {
        // Round 0 is reproducible; later rounds (long runs only) explore.
        let mut seed = [0u8; 32];
        let salt = if round == 0 {
            0
        } else {
            started.elapsed().as_nanos() as u64 ^ round.rotate_left(17)
        };
        seed[..8].copy_from_slice(&salt.to_le_bytes());
        seed[8..16].copy_from_slice(&round.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut runner = TestRunner::new_with_rng(config.clone(), rng);
        if let Err(e) = runner.run(&strategy, &check) {
            panic!("{target}: {e}");
        }
        executed += u64::from(cases);
        round += 1;
        match budget {
            Some(b) if started.elapsed() < b => continue,
            _ => break,
        }
    }
    if budget.is_some() {
        eprintln!(
            "fuzz {target}: {executed} generated inputs in {:.1} s ({} rounds), no failure",
            started.elapsed().as_secs_f64(),
            round
        );
    }
}
