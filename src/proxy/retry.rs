//! When the gateway sends a failed request to its upstream again by itself:
//! which failures qualify, how long it waits between tries, and the budget
//! that keeps retries from multiplying an outage.
//!
//! Place: inside [`super::forward::Forward::send`], around each exchange with
//! the upstream; the pipeline above sees one reply or one failure per request.
//!
//! Invariants:
//! - a request that certainly never reached the server (connection refused,
//!   DNS failure) may be sent again, up to `attempts` tries;
//! - a request that may have reached the server is sent again only when it is
//!   a call of a tool the operator marked repeatable, only after a transport
//!   failure, HTTP 502/503/504 or JSON-RPC -32603, and only once;
//! - -32601, -32602, any other 4xx and an `isError` result are never retried;
//! - every pause ends before the request's deadline, or there is no retry;
//! - at most `budget` of the requests of a window (and at least
//!   [`MIN_RETRIED`]) are retried at all, so an outage costs the server a
//!   bounded multiple of its traffic.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;

use crate::config::RetrySettings;
use crate::error::UpstreamKind;
use crate::transport::reply::{Reply, UpstreamError};

/// How long a budget window lasts: its counts start again after it.
const WINDOW: Duration = Duration::from_secs(10);
/// Requests that may be retried in any window, whatever the budget says (a
/// quiet server still gets its rare failures retried).
pub(crate) const MIN_RETRIED: u64 = 3;
/// The first pause's ceiling; each later one doubles it, up to [`MAX_PAUSE`].
const BASE_PAUSE: Duration = Duration::from_millis(50);
/// The ceiling of any pause chosen by the gateway (a `Retry-After` may ask
/// for longer, within the deadline).
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Per server: how many requests were sent and how many were retried in the
/// current window.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    started: Option<Instant>,
    requests: u64,
    retried: u64,
}

impl Budget {
    fn counts(&self) -> std::sync::MutexGuard<'_, Window> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if w.started.is_none_or(|s| now.duration_since(s) >= WINDOW) {
            *w = Window {
                started: Some(now),
                requests: 0,
                retried: 0,
            };
        }
        w
    }

    /// A request is about to be sent for the first time.
    pub(crate) fn sent(&self) {
        self.counts().requests += 1;
    }

    /// Whether one more request may be retried, taking its share if so.
    pub(crate) fn take(&self, fraction: f64) -> bool {
        let mut w = self.counts();
        // The budget's share of this window's requests, rounded down.
        let share = (fraction * w.requests as f64).floor() as u64;
        if w.retried < MIN_RETRIED.max(share) {
            w.retried += 1;
            true
        } else {
            false
        }
    }
}

/// One request's retries: what it may still do.
pub(crate) struct Retries<'a> {
    settings: &'a RetrySettings,
    budget: &'a Budget,
    /// A tool call the operator marked safe to run twice.
    repeatable: bool,
    deadline: Instant,
    /// Tries made so far.
    tries: u32,
    /// Whether this request has its share of the budget.
    funded: bool,
    /// Whether it was already sent again after it may have run.
    repeated: bool,
}

impl<'a> Retries<'a> {
    /// Before the first try: counts the request against the budget.
    pub(crate) fn new(
        settings: &'a RetrySettings,
        budget: &'a Budget,
        repeatable: bool,
        deadline: Instant,
    ) -> Self {
        budget.sent();
        Self {
            settings,
            budget,
            repeatable,
            deadline,
            tries: 0,
            funded: false,
            repeated: false,
        }
    }

    /// After a try: the pause before the next one, or `None` when `outcome`
    /// is the answer.
    pub(crate) fn after(&mut self, outcome: &Result<Reply, UpstreamError>) -> Option<Duration> {
        self.tries += 1;
        if self.tries >= self.settings.attempts {
            return None;
        }
        let (not_run, asked) = match outcome {
            Err(e) if e.not_run && !matches!(e.kind, UpstreamKind::Credentials { .. }) => {
                (true, None)
            }
            Err(e) if e.kind == UpstreamKind::Unavailable => (false, None),
            Err(_) => return None,
            // A reply means the request reached the server: it goes again only
            // as a repeatable call not repeated yet, so nothing else reads its body.
            Ok(_) if !self.repeatable || self.repeated => return None,
            Ok(reply) if transient(reply) => (false, retry_after(reply)),
            Ok(_) => return None,
        };
        if !not_run && (!self.repeatable || self.repeated) {
            return None;
        }
        let pause = asked.unwrap_or_else(|| jittered(self.tries));
        if Instant::now() + pause >= self.deadline {
            return None;
        }
        if !self.funded {
            if !self.budget.take(self.settings.budget) {
                return None;
            }
            self.funded = true;
        }
        self.repeated |= !not_run;
        Some(pause)
    }

    /// Tries made so far.
    pub(crate) fn tries(&self) -> u32 {
        self.tries
    }
}

/// Why a try was not the answer, as the audit event and its span name it:
/// the failure's result code, `http 502`, or `json-rpc -32603`.
pub(crate) fn cause(outcome: &Result<Reply, UpstreamError>) -> String {
    match outcome {
        Err(e) => e.kind.code().to_owned(),
        Ok(reply) if gateway_status(reply) => match status(reply) {
            Some(code) => format!("http {code}"),
            None => "upstream_unavailable".to_owned(),
        },
        Ok(_) => "json-rpc -32603".to_owned(),
    }
}

/// A transport failure, or HTTP 502/503: what the breaker counts. A timeout
/// is not one (the server may be busy, not gone), nor is HTTP 504 (a proxy in
/// front of the server gave up waiting, the same thing: a client calling a
/// slow tool on purpose must not open the breaker for everyone), nor any
/// answer of the server's own (a JSON-RPC error, an `isError` result), nor a
/// refusal by the gateway's own bound (`busy`), which any client can provoke.
pub(crate) fn broken(outcome: &Result<Reply, UpstreamError>) -> bool {
    match outcome {
        Err(e) => e.kind == UpstreamKind::Unavailable && !e.busy,
        Ok(reply) => status(reply).is_some_and(|s| {
            s == StatusCode::BAD_GATEWAY.as_u16() || s == StatusCode::SERVICE_UNAVAILABLE.as_u16()
        }),
    }
}

fn status(reply: &Reply) -> Option<u16> {
    match reply {
        Reply::Json { status, .. } | Reply::Sse { status, .. } | Reply::Empty { status, .. } => {
            status.code()
        }
        Reply::Other { status, .. } => Some(status.as_u16()),
    }
}

fn gateway_status(reply: &Reply) -> bool {
    const GATEWAY: [StatusCode; 3] = [
        StatusCode::BAD_GATEWAY,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::GATEWAY_TIMEOUT,
    ];
    status(reply).is_some_and(|status| GATEWAY.iter().any(|s| s.as_u16() == status))
}

/// A reply that says the server failed for now: HTTP 502, 503 or 504, or a
/// JSON body whose error is -32603 (internal error).
fn transient(reply: &Reply) -> bool {
    if gateway_status(reply) {
        return true;
    }
    match reply {
        Reply::Json { body, .. } => {
            serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|m| m.get("error")?.get("code")?.as_i64())
                == Some(-32603)
        }
        _ => false,
    }
}

/// A `Retry-After` in seconds (the date form is not used by MCP servers).
fn retry_after(reply: &Reply) -> Option<Duration> {
    let (Reply::Json { headers, .. }
    | Reply::Sse { headers, .. }
    | Reply::Empty { headers, .. }
    | Reply::Other { headers, .. }) = reply;
    let value = headers.get(http::header::RETRY_AFTER)?;
    let secs = value.to_str().ok()?.trim().parse::<u64>().ok()?;
    Some(Duration::from_secs(secs))
}

/// Exponential backoff with full jitter: a pause drawn evenly between zero
/// and `BASE_PAUSE · 2^(tries-1)`, capped at [`MAX_PAUSE`].
fn jittered(tries: u32) -> Duration {
    let ceiling = BASE_PAUSE
        .saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(MAX_PAUSE);
    let ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::random_range(0..=ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However many requests fail, the retried ones stay within the
        /// budget's share of them (or the floor).
        #[test]
        fn the_budget_caps_retried_requests(requests in 0u64..500, fraction in 0.0f64..=1.0) {
            let budget = Budget::default();
            let mut retried = 0u64;
            for _ in 0..requests {
                budget.sent();
                if budget.take(fraction) {
                    retried += 1;
                }
            }
            let share = (fraction * requests as f64).floor() as u64;
            prop_assert!(retried <= MIN_RETRIED.max(share));
            prop_assert!(retried <= requests);
        }

        /// A pause never exceeds its ceiling.
        #[test]
        fn pauses_stay_under_the_ceiling(tries in 1u32..40) {
            prop_assert!(jittered(tries) <= MAX_PAUSE);
        }
    }

    fn settings(attempts: u32) -> RetrySettings {
        RetrySettings {
            attempts,
            ..RetrySettings::default()
        }
    }

    fn refused() -> Result<Reply, UpstreamError> {
        let mut e = UpstreamError::new(UpstreamKind::Unavailable, "refused");
        e.not_run = true;
        Err(e)
    }

    #[test]
    fn the_gateways_own_bound_is_not_the_servers_failure() {
        let mut busy = UpstreamError::new(UpstreamKind::Unavailable, "table full");
        busy.not_run = true;
        busy.busy = true;
        assert!(!broken(&Err(busy)));
        assert!(broken(&refused()));
    }

    fn json(body: Value) -> Result<Reply, UpstreamError> {
        Ok(Reply::Json {
            status: crate::transport::reply::Framing::Http(StatusCode::OK),
            headers: http::HeaderMap::new(),
            body: serde_json::to_vec(&body).unwrap().into(),
        })
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn a_request_that_never_left_is_retried_up_to_its_attempts() {
        let (s, b) = (settings(3), Budget::default());
        let mut r = Retries::new(&s, &b, false, far());
        assert!(r.after(&refused()).is_some());
        assert!(r.after(&refused()).is_some());
        assert!(r.after(&refused()).is_none());
        assert_eq!(r.tries(), 3);
    }

    #[test]
    fn invalid_params_and_not_found_are_never_retried() {
        let (s, b) = (settings(5), Budget::default());
        for code in [-32602, -32601] {
            let mut r = Retries::new(&s, &b, true, far());
            let reply = json(
                serde_json::json!({"jsonrpc": "2.0", "id": 1, "error": {"code": code, "message": "x"}}),
            );
            assert!(r.after(&reply).is_none());
        }
    }

    #[test]
    fn an_internal_error_is_retried_once_and_only_for_a_repeatable_tool() {
        let (s, b) = (settings(5), Budget::default());
        let failed = || {
            json(
                serde_json::json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "x"}}),
            )
        };
        let mut r = Retries::new(&s, &b, false, far());
        assert!(r.after(&failed()).is_none());
        let mut r = Retries::new(&s, &b, true, far());
        assert!(r.after(&failed()).is_some());
        assert!(r.after(&failed()).is_none());
    }

    #[test]
    fn only_the_servers_own_failures_count_for_the_breaker() {
        let status = |code: u16| -> Result<Reply, UpstreamError> {
            Ok(Reply::Empty {
                status: crate::transport::reply::Framing::Http(StatusCode::from_u16(code).unwrap()),
                headers: http::HeaderMap::new(),
            })
        };
        assert!(broken(&refused()));
        assert!(broken(&status(502)));
        assert!(broken(&status(503)));
        // A proxy's timeout, like the gateway's own, says the server is slow.
        assert!(!broken(&status(504)));
        let timeout = UpstreamError::new(UpstreamKind::Timeout, "no response");
        assert!(!broken(&Err(timeout)));
        for code in [200, 400, 404, 429, 500] {
            assert!(!broken(&status(code)), "{code}");
        }
    }

    #[test]
    fn no_retry_past_the_deadline() {
        let (s, b) = (settings(5), Budget::default());
        let mut r = Retries::new(&s, &b, true, Instant::now());
        assert!(r.after(&refused()).is_none());
    }

    #[test]
    fn annotations_count_only_when_trusted() {
        let named = RetrySettings {
            idempotent_tools: vec![crate::policy::glob::Glob::new("search_*").unwrap()],
            ..RetrySettings::default()
        };
        assert!(named.repeatable("search_docs", false, false));
        assert!(!named.repeatable("delete_docs", true, true));
        let trusted = RetrySettings {
            trust_annotations: true,
            ..RetrySettings::default()
        };
        assert!(trusted.repeatable("delete_docs", false, true));
        assert!(trusted.repeatable("read_docs", true, false));
        assert!(!trusted.repeatable("delete_docs", false, false));
    }
}
