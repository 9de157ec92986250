//! The audit event of one client request: what every sink of the record
//! layer (the SQLite store, the metrics, the dashboard's live ring, the
//! spans) receives once the request is over.
//!
//! Place: the bottom of the record layer; it knows no sink. Invariant: an
//! event handed to a sink has been [bounded](Event::bound), so no client-chosen
//! identifier reaches a store, a label or a span longer than
//! [`MAX_KEPT`](crate::util::text::MAX_KEPT) bytes, and no subject (a URI
//! with its query, a listen's URIs) longer than [`MAX_SUBJECT`] bytes.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// One client request, as recorded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Event {
    /// When the request arrived, in milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// The W3C trace id of the request's spans: the client's (`traceparent`
    /// in `params._meta` or the header), or one of the gateway's own when
    /// traces are exported.
    pub trace_id: Option<String>,
    pub client: Option<String>,
    /// The client is a JWT subject not named in `[clients]` (counted as
    /// `other` in metrics, so tokens cannot grow the registry).
    #[serde(skip)]
    pub client_unlisted: bool,
    pub server: Option<String>,
    /// The JSON-RPC method (or the HTTP method before the body was read).
    pub method: String,
    pub tool: Option<String>,
    /// What a resource, prompt, completion or listen request was about: the
    /// resource's canonical URI as forwarded (query included), the prompt's
    /// name, the completion's reference, the URIs listened to; as the
    /// client sent it (made printable) when it was refused before it could
    /// be read further. Never a tool's name (that is `tool`).
    pub subject: Option<String>,
    /// The tool is one the server listed (else metrics count it as `other`).
    #[serde(skip)]
    pub tool_listed: bool,
    /// `forwarded`, or the result code of the refusal (`Rejection::code`).
    pub decision: String,
    /// Who made the decision: `forwarded`, or the source of the refusal
    /// (`client`, `policy`, `upstream`, …).
    pub stage: String,
    /// In observe mode, the result code enforcement would have answered with
    /// (`unknown_tool`, `invalid_arguments`, `rate_limited`, …) while the call
    /// went through; `None` when nothing would have been refused.
    pub would_refuse: Option<String>,
    /// Schema violations, one line each.
    pub violations: Vec<String>,
    /// Sanitizer actions by kind.
    pub sanitizer: BTreeMap<String, u64>,
    /// The poisoning findings of the called tool's live definition, when it is
    /// held or flagged.
    pub pin_findings: Option<Value>,
    pub upstream_status: Option<u16>,
    pub upstream_latency_us: Option<u64>,
    /// Until the response body was sent to the end.
    pub latency_us: u64,
    /// The HTTP status the client got.
    pub http_status: Option<u16>,
    /// `2025` (handshake era) or `2026`.
    pub era: String,
    /// The arguments of a `tools/call`, per `[audit] arguments`.
    pub arguments: Option<Value>,
    /// When the gateway sent the request more than once: how many tries, and
    /// what ended each try that was not the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,
    /// Human approval: `{by, outcome, digest, id?, decided_by?, at_ms}`.
    pub approval: Option<Value>,
    /// On an approval's own event (method [`APPROVAL_METHOD`]): who was asked
    /// and the outcome, the labels it is counted under (not a request).
    #[serde(skip)]
    pub approval_counted: Option<(&'static str, &'static str)>,
}

/// A request the gateway sent to its server more than once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Retries {
    /// Tries made, the first included.
    pub attempts: u32,
    /// Why each try but the last was not the answer (`upstream_unavailable`,
    /// `http 502`, `json-rpc -32603`), in order.
    pub causes: Vec<String>,
}

/// The method of the events an approval records of its own (asked,
/// approved, denied, expired, …), beside the request events.
pub const APPROVAL_METHOD: &str = "portcullis/approval";

/// Most violation lines kept per event, and most bytes of each.
const MAX_VIOLATIONS: usize = 50;
const MAX_VIOLATION_LINE: usize = 512;
/// Most bytes of a subject kept: a URI with its query, or a listen's URIs,
/// outgrows an identifier's bound.
pub const MAX_SUBJECT: usize = 1024;

impl Event {
    /// Bounds what the event keeps of client-chosen text (method, tool,
    /// subject, client, violation lines): whatever stage noted it, the store, the
    /// dashboard ring, the metrics and the spans get at most
    /// [`MAX_KEPT`](crate::mcp::text::MAX_KEPT) bytes of each identifier.
    pub(crate) fn bound(&mut self) {
        use crate::util::text::{self, clip_opt};
        if self.method.len() > text::MAX_KEPT {
            self.method = text::clip(&self.method);
        }
        clip_opt(&mut self.tool);
        if let Some(subject) = self.subject.as_mut().filter(|s| s.len() > MAX_SUBJECT) {
            *subject = text::clip_to(subject, MAX_SUBJECT);
        }
        clip_opt(&mut self.client);
        clip_opt(&mut self.server);
        clip_opt(&mut self.trace_id);
        if self.violations.len() > MAX_VIOLATIONS {
            let more = self.violations.len() - MAX_VIOLATIONS + 1;
            self.violations.truncate(MAX_VIOLATIONS - 1);
            self.violations.push(format!("… and {more} more"));
        }
        for line in &mut self.violations {
            if line.len() > MAX_VIOLATION_LINE {
                *line = text::clip_to(line, MAX_VIOLATION_LINE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_bounded_subject_keeps_its_start_and_fits_its_bound(subject in ".{0,1500}") {
            let mut event = Event { subject: Some(subject.clone()), ..Event::default() };
            event.bound();
            let kept = event.subject.unwrap();
            prop_assert!(kept.len() <= MAX_SUBJECT);
            if subject.len() <= MAX_SUBJECT {
                prop_assert_eq!(kept, subject);
            } else {
                prop_assert!(subject.starts_with(kept.trim_end_matches('…')));
            }
        }
    }
}
