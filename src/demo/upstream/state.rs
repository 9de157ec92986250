//! The demo upstream's state: its options, the tool list serialised once,
//! the bounded log of executed calls, and the counter behind session and
//! event ids.
//!
//! Place: one [`Shared`] per router, behind every handler.
//! Invariants: the call log holds at most [`CALL_LOG_CAP`] entries, oldest
//! dropped first; a panic elsewhere never makes it unusable.

use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use super::catalog::tool_definitions;
use serde_json::Value;
use serde_json::value::RawValue;

/// Knobs for the demo upstream, mostly for benchmarks.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Answer every `tools/call` with `text/event-stream` instead of JSON.
    pub sse: bool,
    /// Extra bytes ('.') appended to the `echo` tool's output.
    pub pad_output: usize,
    /// Add this many trivial tools named `tool_0001`, `tool_0002`, … (for
    /// `tools/list` benchmarks); each returns "ok".
    pub extra_tools: usize,
}

/// Most recent tool calls kept by [`DemoUpstream::calls`]; older ones are dropped.
pub(super) const CALL_LOG_CAP: usize = 10_000;

/// State shared by all requests.
pub(super) struct Shared {
    pub(super) options: DemoOptions,
    /// The `tools` array, serialised once: `tools/list` is hot in list benchmarks.
    pub(super) tools_json: Box<RawValue>,
    /// Names of the extra tools, for dispatch without re-formatting.
    pub(super) extra_names: Vec<String>,
    /// Precomputed `echo` padding, so the echo path allocates only its output.
    pub(super) padding: String,
    calls: Mutex<VecDeque<(String, Value)>>,
    /// Feeds session ids and SSE event ids.
    counter: AtomicU64,
}

impl fmt::Debug for Shared {
    // The call log can hold thousands of entries; print its size only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("options", &self.options)
            .field("calls", &self.log().len())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(super) fn new(options: DemoOptions) -> Self {
        let extra_names: Vec<String> = (1..=options.extra_tools)
            .map(|n| format!("tool_{n:04}"))
            .collect();
        let tools = tool_definitions(&extra_names);
        let tools_json =
            serde_json::value::to_raw_value(&tools).unwrap_or_else(|_| raw_const("[]"));
        Self {
            padding: ".".repeat(options.pad_output),
            options,
            tools_json,
            extra_names,
            calls: Mutex::new(VecDeque::new()),
            counter: AtomicU64::new(1),
        }
    }

    pub(super) fn log(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Value)>> {
        // A panic elsewhere while holding the lock leaves the log usable.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn record(&self, name: String, arguments: Value) {
        let mut log = self.log();
        if log.len() >= CALL_LOG_CAP {
            log.pop_front();
        }
        log.push_back((name, arguments));
    }

    pub(super) fn next_id(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// 32 hex chars from two independently keyed SipHashes of a counter and
    /// the clock. Not cryptographic, which is acceptable because this demo
    /// never uses sessions for anything but echoing them.
    pub(super) fn new_session_id(&self) -> String {
        let n = self.next_id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // Every RandomState gets distinct SipHash keys (randomly seeded per thread).
        let first = RandomState::new().hash_one((n, nanos, 0u8));
        let second = RandomState::new().hash_one((n, nanos, 1u8));
        format!("{first:016x}{second:016x}")
    }
}

pub(super) fn raw_const(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).unwrap_or_default()
}
