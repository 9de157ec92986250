//! The dashboard on the admin listener: one embedded page (`/`) and the JSON
//! API behind it (`/api/events`, `/api/events/{id}`, `/api/events/stream`,
//! `/api/overview`, `/api/config`; pins are `admin`'s).
//!
//! Place in the path: beside it. When a request's audit event is let go it is
//! also kept here ([`Recent::push`]): in a ring of the latest events, from
//! which the overview is computed, and on a broadcast channel that the live
//! feed (server-sent events) follows.
//!
//! With `[audit] backend = "postgres"` the events, the trace pages and the
//! overview are the whole fleet's (the latest [`KEEP`], read from
//! PostgreSQL, each with its `replica`); the live feed stays this replica's.
//!
//! Invariants: memory is bounded (the ring holds [`KEEP`] events; a slow feed
//! reader skips events rather than holding them); nothing here blocks the
//! request path for longer than one push under a short lock; read endpoints
//! need the admin token once one is configured, as `GET /api/pins` does.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::{Html, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::state::AdminState;
use crate::error::json_response;
use crate::record::live::KEEP;

/// Minutes shown in the calls-per-minute chart.
const MINUTES: i64 = 30;

const INDEX: &str = include_str!("dashboard/index.html");

/// Filters of the feed and of `/api/events`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Filter {
    client: Option<String>,
    server: Option<String>,
    tool: Option<String>,
    /// What a resource, prompt, completion or listen request was about, exactly.
    subject: Option<String>,
    decision: Option<String>,
    /// Observe mode's would-be refusals: a result code, or `*` for any.
    would_refuse: Option<String>,
    /// Events at or after this time (Unix milliseconds).
    since: Option<i64>,
    /// Events at or before this time (Unix milliseconds).
    until: Option<i64>,
}

impl Filter {
    fn keeps(&self, e: &Value) -> bool {
        let is = |want: &Option<String>, key: &str| match want.as_deref() {
            None | Some("") => true,
            Some(w) => e.get(key).and_then(Value::as_str) == Some(w),
        };
        let time = e.get("time_ms").and_then(Value::as_i64).unwrap_or(0);
        is(&self.client, "client")
            && is(&self.server, "server")
            && is(&self.tool, "tool")
            && is(&self.subject, "subject")
            && is(&self.decision, "decision")
            && match self.would_refuse.as_deref() {
                None | Some("") => true,
                Some("*") => e.get("would_refuse").is_some_and(Value::is_string),
                Some(_) => is(&self.would_refuse, "would_refuse"),
            }
            && self.since.is_none_or(|t| time >= t)
            && self.until.is_none_or(|t| time <= t)
    }
}

/// `GET /`: the dashboard page.
pub(crate) async fn index() -> Html<&'static str> {
    Html(INDEX)
}

/// The events the dashboard shows, oldest first: the fleet's latest from
/// PostgreSQL when the audit is there (each with its `replica`), else (and
/// while PostgreSQL cannot answer) this replica's ring.
async fn latest(state: &AdminState) -> Vec<Arc<Value>> {
    if let Some(audit) = &state.audit
        && let Some(fleet) = audit.fleet_events(KEEP).await
    {
        match fleet {
            Ok(events) => return events.into_iter().map(Arc::new).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "the fleet's audit cannot be read; the dashboard shows this replica's events")
            }
        }
    }
    state.recent.snapshot()
}

/// `GET /api/events`: the latest events, newest first, filtered.
pub(crate) async fn events(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Response {
    if let Err(r) = super::access::reader(&state, &headers) {
        return r;
    }
    let list: Vec<Value> = latest(&state)
        .await
        .into_iter()
        .rev()
        .filter(|e| filter.keeps(e))
        .take(200)
        .map(|e| (*e).clone())
        .collect();
    json_response(StatusCode::OK, &json!({ "events": list }))
}

/// `GET /api/events/{id}`: one event (the trace page).
pub(crate) async fn event(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    if let Err(r) = super::access::reader(&state, &headers) {
        return r;
    }
    match latest(&state)
        .await
        .into_iter()
        .find(|e| e.get("id").and_then(Value::as_u64) == Some(id))
    {
        Some(e) => json_response(StatusCode::OK, &e),
        None => json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": format!("no event {id} among the latest {KEEP}")}),
        ),
    }
}

/// `GET /api/events/stream`: the live feed, as server-sent events.
pub(crate) async fn stream(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Query(filter): Query<Filter>,
) -> Response {
    if let Err(r) = super::access::reader(&state, &headers) {
        return r;
    }
    let rx = state.recent.feed.subscribe();
    let closed = state.recent.closed.subscribe();
    let start = (rx, closed, filter);
    let events = futures_util::stream::unfold(start, |(mut rx, mut closed, filter)| async move {
        loop {
            let next = tokio::select! {
                next = rx.recv() => next,
                _ = closed.wait_for(|c| *c) => return None,
            };
            match next {
                Ok(e) if filter.keeps(&e) => {
                    let frame = Bytes::from(format!("data: {e}\n\n"));
                    return Some((Ok::<_, Infallible>(frame), (rx, closed, filter)));
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let opening = futures_util::stream::once(async { Ok(Bytes::from_static(b": feed\n\n")) });
    let mut r = Response::new(Body::from_stream(opening.chain(events)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /api/overview`: calls per minute by decision, latency p50/p99, top
/// refused tools, top clients (over the events kept).
pub(crate) async fn overview(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(r) = super::access::reader(&state, &headers) {
        return r;
    }
    let events = latest(&state).await;
    let mut summary = summarize(&events, crate::util::time::now_ms() / 60_000);
    // Each server's circuit breaker as it is now.
    summary["breakers"] = (state.app.breakers().into_iter())
        .map(|b| json!({"server": b.server, "state": b.state, "opens": b.opens}))
        .collect();
    json_response(StatusCode::OK, &summary)
}

fn summarize(events: &[Arc<Value>], now_minute: i64) -> Value {
    let mut per_minute: BTreeMap<i64, BTreeMap<String, u64>> = BTreeMap::new();
    let mut latencies: Vec<u64> = Vec::new();
    let mut refused: HashMap<String, u64> = HashMap::new();
    let mut would_refuse_minute: BTreeMap<i64, BTreeMap<String, u64>> = BTreeMap::new();
    let mut would_refuse_tools: HashMap<String, u64> = HashMap::new();
    let mut clients: HashMap<String, u64> = HashMap::new();
    let field = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
    for e in events {
        let minute = e.get("time_ms").and_then(Value::as_i64).unwrap_or(0) / 60_000;
        let decision = field(e, "decision").unwrap_or_default();
        if minute > now_minute - MINUTES {
            *per_minute
                .entry(minute)
                .or_default()
                .entry(decision.clone())
                .or_default() += 1;
        }
        if let Some(code) = field(e, "would_refuse") {
            if minute > now_minute - MINUTES {
                *would_refuse_minute
                    .entry(minute)
                    .or_default()
                    .entry(code)
                    .or_default() += 1;
            }
            if let Some(tool) = field(e, "tool") {
                *would_refuse_tools.entry(tool).or_default() += 1;
            }
        }
        latencies.push(e.get("latency_us").and_then(Value::as_u64).unwrap_or(0));
        if decision != "forwarded"
            && let Some(tool) = field(e, "tool")
        {
            *refused.entry(tool).or_default() += 1;
        }
        if let Some(client) = field(e, "client") {
            *clients.entry(client).or_default() += 1;
        }
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies[i.min(latencies.len() - 1)]
    };
    let top = |m: HashMap<String, u64>| -> Vec<Value> {
        let mut v: Vec<(String, u64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter()
            .take(10)
            .map(|(name, n)| json!({"name": name, "count": n}))
            .collect()
    };
    let minutes: Vec<Value> = ((now_minute - MINUTES + 1)..=now_minute)
        .map(|m| {
            json!({
                "minute_ms": m * 60_000,
                "by_decision": per_minute.get(&m).cloned().unwrap_or_default(),
                // Observe mode: let through, though enforcement would have refused.
                "would_refuse": would_refuse_minute.get(&m).cloned().unwrap_or_default(),
            })
        })
        .collect();
    json!({
        "events": events.len(),
        "calls_per_minute": minutes,
        "latency_us": {"p50": pct(0.5), "p99": pct(0.99)},
        "top_refused_tools": top(refused),
        "top_would_refuse_tools": top(would_refuse_tools),
        "top_clients": top(clients),
    })
}

/// `GET /api/config`: the effective policy, as `portcullis check` prints it.
pub(crate) async fn config(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(r) = super::access::reader(&state, &headers) {
        return r;
    }
    json_response(
        StatusCode::OK,
        &json!({"source": state.config().source, "policy": state.config().describe()}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_window_keeps_events_inside_it() {
        let at = |ms: i64| json!({"time_ms": ms, "client": "alice"});
        let filter = Filter {
            since: Some(1_000),
            until: Some(2_000),
            client: Some("alice".into()),
            ..Filter::default()
        };
        assert!(!filter.keeps(&at(999)));
        assert!(filter.keeps(&at(1_000)));
        assert!(filter.keeps(&at(2_000)));
        assert!(!filter.keeps(&at(2_001)));
        assert!(Filter::default().keeps(&at(0)));
    }

    #[test]
    fn overview_counts_by_minute_and_ranks() {
        let now = 29_000_000i64;
        let ev = |d: &str, tool: &str, client: &str, us: u64| {
            Arc::new(
                json!({"time_ms": now * 60_000, "decision": d, "tool": tool, "client": client, "latency_us": us}),
            )
        };
        let events = vec![
            ev("forwarded", "a", "alice", 100),
            ev("unknown_tool", "x", "bob", 200),
            ev("unknown_tool", "x", "alice", 300),
            ev("invalid_arguments", "a", "alice", 10_000),
        ];
        let o = summarize(&events, now);
        let last = &o["calls_per_minute"][MINUTES as usize - 1];
        assert_eq!(last["by_decision"]["unknown_tool"], 2);
        assert_eq!(o["top_refused_tools"][0], json!({"name": "x", "count": 2}));
        assert_eq!(o["top_clients"][0], json!({"name": "alice", "count": 3}));
        assert_eq!(o["latency_us"]["p99"], 10_000);
    }

    #[test]
    fn observe_mode_would_be_refusals_have_their_series_and_filter() {
        let now = 29_000_000i64;
        let ev = |tool: &str, would: Option<&str>| {
            Arc::new(
                json!({"time_ms": now * 60_000, "decision": "forwarded", "tool": tool,
                "would_refuse": would, "latency_us": 1}),
            )
        };
        let events = vec![
            ev("a", None),
            ev("x", Some("unknown_tool")),
            ev("x", Some("unknown_tool")),
            ev("a", Some("invalid_arguments")),
        ];
        let o = summarize(&events, now);
        let last = &o["calls_per_minute"][MINUTES as usize - 1];
        assert_eq!(last["by_decision"]["forwarded"], 4);
        assert_eq!(
            last["would_refuse"],
            json!({"unknown_tool": 2, "invalid_arguments": 1})
        );
        assert_eq!(
            o["top_would_refuse_tools"][0],
            json!({"name": "x", "count": 2})
        );
        let keep = |q: &str| {
            let f: Filter = serde_json::from_value(json!({"would_refuse": q})).expect("filter");
            events.iter().filter(|e| f.keeps(e)).count()
        };
        assert_eq!(keep("*"), 3);
        assert_eq!(keep("invalid_arguments"), 1);
        assert_eq!(keep(""), 4);
    }

    #[test]
    fn the_subject_filter_keeps_the_uses_of_one_resource_only() {
        let ev = |method: &str, subject: Option<&str>| json!({"time_ms": 1, "decision": "forwarded", "method": method, "subject": subject});
        let events = [
            ev("resources/read", Some("file:///a.md")),
            ev("resources/read", Some("file:///a.md?rev=2")),
            ev("prompts/get", Some("greet")),
            ev("tools/call", None),
        ];
        let kept = |q: &str| {
            let f: Filter = serde_json::from_value(json!({"subject": q})).expect("filter");
            events.iter().filter(|e| f.keeps(e)).count()
        };
        assert_eq!(kept("file:///a.md"), 1);
        assert_eq!(kept("greet"), 1);
        assert_eq!(kept(""), 4);
    }
}
