//! The way back: upstream replies relayed to the client message by message, or
//! collected when the gateway needs the whole answer (lists).
//!
//! Place in the path: after forwarding. SSE streams are decoded event by event
//! and re-encoded as they arrive, so progress notifications are never held
//! back; each message is inspected on the way (a `tools/list_changed`
//! notification drops the cached tool list) and sanitized; the final response
//! to a `tools/call` is also rewritten when it is a failure (see
//! [`Recipient::finish`]).
//!
//! Invariants: a `tools/call` gets exactly one response with its own id — the
//! upstream's (sanitized), or a gateway-made `isError` result when the upstream
//! failed, answered another id, or ended the stream without answering; upstream
//! bodies that are not JSON-RPC are never shown to the client, at most a
//! sanitized, capped snippet of their text is quoted; a message the sanitizer
//! did not change is passed on byte for byte.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;

use super::catalog::CallFacts;
use super::catalog::Catalog;
use super::reply::{Reply, SseStream, UpstreamError};
use super::tasks::{Reader, TaskScope};
use crate::config::SanitizeSettings;
use crate::error::{
    self, OutputKind, OutputRefusal, Rejection, RenderCtx, RpcError, ToolFailure, UpstreamFailure,
    UpstreamKind, json_response,
};
use crate::mcp::methods::{self, Kind};
use crate::mcp::sse::{SseEvent, SseItem};
use crate::mcp::version::Era;
use crate::pins::scan;
use crate::record::trail::Trail;
use crate::sanitize::message::{Malformed, Shape, shape};
use crate::sanitize::{Report, Sanitizer, TRUNCATED};
use crate::validate::CompiledSchema;

/// The largest message the gateway sends a client. The official Python SDK
/// client refuses an SSE event over 1,048,576 bytes ("Server-sent event
/// exceeded the 1048576 byte limit") and then fails the whole session; the
/// TypeScript SDK client has no such limit. Room is kept for the SSE framing
/// (`event:`, `id:`, `data:` and the line ends around the JSON).
pub(crate) const MAX_CLIENT_MESSAGE: usize = 1_048_576 - 1024;

/// `_meta` key of the poisoning scan's flags on a tool result.
pub(crate) const META_POISONING: &str = "portcullis/poisoning";

/// Who the reply is for, and what the gateway must guarantee about it.
#[derive(Debug, Clone)]
pub(crate) struct Recipient {
    /// The request's id (`None` for GET streams and notifications).
    pub id: Option<Value>,
    /// The request's method (`GET` for a GET stream).
    pub method: String,
    pub era: Era,
    pub server: String,
    /// Set for `tools/call`: the tool, and the promise of exactly one answer.
    pub tool: Option<String>,
    /// Emptied when the upstream says its tool list changed.
    pub catalog: Arc<Catalog>,
    /// `[sanitize]`.
    pub sanitize: Arc<SanitizeSettings>,
    /// What is known of the called tool (default for other methods).
    pub call: CallFacts,
    /// The request's audit event, recorded once the reply has been sent.
    pub trail: Arc<Trail>,
    /// Whose tasks this reply may show, and whether it may create one.
    pub tasks: Option<TaskScope>,
}

impl Recipient {
    /// What the task scope of this reply reads of it.
    fn reader(&self) -> Reader<'_> {
        Reader {
            server: &self.server,
            tool: self.tool.as_deref(),
            era: self.era,
            call: &self.call,
            sanitize: &self.sanitize,
        }
    }

    /// Puts a task result carried inside `message` (a completed 2026
    /// `tasks/get`, a status notification with `result`) through the output
    /// checks of the task's tool, replacing it by the gateway's answer when
    /// they refuse it. True when the message changed.
    fn check_nested_task(&self, scope: &TaskScope, message: &mut Value) -> bool {
        let holder = if message.get("method").is_some() {
            message.get_mut("params")
        } else {
            message.get_mut("result")
        };
        let Some(holder) = holder.and_then(Value::as_object_mut) else {
            return false;
        };
        // Only task state carries a task's result: a `taskId` beside `result`.
        if !holder.get("result").is_some_and(Value::is_object) || !holder.contains_key("taskId") {
            return false;
        }
        let task = holder
            .get("taskId")
            .and_then(Value::as_str)
            .and_then(|id| scope.store.owned(&self.server, id, &scope.client));
        let mut judge = self.clone();
        judge.tasks = None;
        // A result the gateway cannot attribute is still checked, with no schema.
        let (tool, facts) =
            task.map_or((String::new(), CallFacts::default()), |t| (t.tool, t.facts));
        judge.tool = Some(tool);
        judge.call = facts;
        let nested = holder
            .get_mut("result")
            .map(Value::take)
            .unwrap_or(Value::Null);
        let id = self.id.clone().unwrap_or(Value::Null);
        let wrapped = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": nested});
        let (changed, mut out) = match judge.finish_message(wrapped.clone()) {
            Some(rewritten) => (true, rewritten),
            None => (false, wrapped),
        };
        let result = out
            .get_mut("result")
            .map(Value::take)
            .unwrap_or(Value::Null);
        holder.insert("result".into(), result);
        changed
    }

    fn sanitizer(&self) -> Sanitizer<'_> {
        Sanitizer::new(&self.sanitize, self.call.skip)
    }

    /// A failure of this request, attributed and with its upstream words made safe.
    pub(crate) fn failure(&self, e: UpstreamError) -> Rejection {
        let mut report = Report::default();
        let rejection = self.failure_with(e, &mut report);
        self.log(&report);
        rejection
    }

    /// The upstream's words, sanitized and capped; withheld whole when they
    /// carry a secret and secrets are blocked.
    fn snippet(&self, raw: &str, report: &mut Report) -> Option<String> {
        let sanitizer = self.sanitizer();
        let mut local = Report::default();
        let clean = sanitizer.text(raw, &mut local);
        report.merge(&local);
        let kinds = local.secret_kinds();
        if sanitizer.blocks_secrets() && !kinds.is_empty() {
            return Some(format!("[withheld: it contained {}]", kinds.join(", ")));
        }
        error::snippet(clean.as_deref().unwrap_or(raw))
    }

    /// The upstream's HTTP refusal, relayed with its status and its headers
    /// that may cross (`Allow`, `Retry-After`, …).
    fn refused(&self, e: UpstreamError, headers: HeaderMap) -> Response {
        let mut r = self.render(self.failure(e));
        r.headers_mut().extend(headers);
        r
    }

    fn render(&self, rejection: Rejection) -> Response {
        self.trail
            .decided(rejection.code(), rejection.source().as_str());
        rejection.into_response(self.render_ctx())
    }

    fn render_ctx(&self) -> RenderCtx<'_> {
        RenderCtx {
            id: self.id.as_ref(),
            era: self.era,
        }
    }

    fn log(&self, report: &Report) {
        self.trail.sanitized(report);
        if !report.is_empty() {
            tracing::info!(
                server = %self.server,
                tool = self.tool.as_deref(),
                actions = %report.summary(),
                "sanitized"
            );
        }
    }

    /// The upstream's message, or `None` when it is not JSON.
    fn inspect(&self, data: &str) -> Option<Value> {
        let message: Value = serde_json::from_str(data).ok()?;
        if message.get("method").and_then(Value::as_str) == Some("notifications/tools/list_changed")
        {
            self.catalog.invalidate();
        }
        Some(message)
    }

    /// False when `message` is a request or notification the specification
    /// does not let a server send in this era (`crate::mcp::methods`): such a
    /// message is dropped, never relayed. Responses are judged as answers.
    fn admits(&self, message: &Value) -> bool {
        let Some(method) = message.get("method") else {
            return true;
        };
        // An id of the gateway's own approval-question form is never relayed:
        // a client's answer to it can only answer the gateway.
        if message
            .get("id")
            .is_some_and(crate::approval::inband::is_question_id)
        {
            tracing::warn!(server = %self.server,
                "dropped a server request whose id has the form of the gateway's approval questions");
            return false;
        }
        let kind = match message.get("id") {
            Some(_) => Kind::Request,
            None => Kind::Notification,
        };
        let known = method
            .as_str()
            .is_some_and(|name| methods::server_message(name, kind, self.era).is_some());
        if !known {
            let shown: String = method.to_string().chars().take(80).collect();
            tracing::warn!(server = %self.server, method = %shown, era = self.era.as_str(),
                "dropped a message the MCP specification does not let a server send");
        }
        known
    }

    /// True when `message` claims to answer this request: it carries this
    /// request's id and a result or an error (well-formed or not; a request
    /// of the server's own may reuse the number, and does not claim).
    fn answers(&self, message: &Value) -> bool {
        self.id.is_some()
            && self.id.as_ref() == message.get("id")
            && (message.get("result").is_some() || message.get("error").is_some())
    }

    /// A message on its way (anything but the final answer to a `tools/call`):
    /// its shape checked, sanitized whole, its texts bounded; a result also
    /// goes through the output checks every result reaching the model gets.
    fn pass(&self, mut message: Value, raw_len: usize) -> Verdict {
        let mut report = Report::default();
        // A task's result inside it gets the checks of the task's tool first.
        let nested = (self.tasks.as_ref()).is_some_and(|t| self.check_nested_task(t, &mut message));
        if let Some(tasks) = &self.tasks {
            tasks.clean(&self.reader(), &mut message, &mut report);
        }
        let sanitizer = self.sanitizer();
        let outcome = match shape(&message) {
            Err(m) => Err(Fault::Malformed(m)),
            Ok(Shape::Result) => check_result(&sanitizer, None, &mut message, raw_len, &mut report),
            Ok(_) => check_message(&sanitizer, &mut message, raw_len, &mut report),
        };
        self.log(&report);
        match outcome {
            Ok(()) if report.is_empty() && !nested => Verdict::Unchanged,
            Ok(()) => Verdict::Changed(message),
            Err(fault) => {
                let rejection = self.fault(fault, &mut Report::default());
                Verdict::Refused(rejection)
            }
        }
    }

    /// [`Recipient::finish`] for a task's result met inside another message.
    pub(crate) fn finish_message(&self, message: Value) -> Option<Value> {
        let raw_len = json_len(&message);
        self.finish(message, raw_len)
    }

    /// True when `message` concerns a task that is not this client's.
    fn hides(&self, message: &Value) -> bool {
        (self.tasks.as_ref()).is_some_and(|t| t.hides(&self.server, message))
    }

    /// The final response to a `tools/call`: sanitized when it is a result,
    /// rewritten into the error table when it is a failure or must be withheld.
    /// `None` when it passes unchanged.
    fn finish(&self, mut message: Value, raw_len: usize) -> Option<Value> {
        let mut report = Report::default();
        // Task state in a tools/call answer (a CreateTaskResult) is sanitized
        // before the checks, so block mode applies to it.
        if let Some(tasks) = &self.tasks {
            tasks.clean(&self.reader(), &mut message, &mut report);
        }
        let outcome = self.judge(&mut message, raw_len, &mut report);
        self.log(&report);
        if let (Ok(()), Some(tasks)) = (&outcome, &self.tasks) {
            tasks.learn(&self.reader(), &message);
        }
        match outcome {
            Ok(()) if report.is_empty() => None,
            Ok(()) => Some(message),
            Err(rejection) => {
                self.trail
                    .decided(rejection.code(), rejection.source().as_str());
                rejection.tool_message(self.render_ctx())
            }
        }
    }

    /// [`Recipient::finish`], with the poisoning scan's flags on the result
    /// (`_meta["portcullis/poisoning"]`) when the upstream's words look like
    /// an injection. The scan reads the result as the upstream sent it and
    /// never changes its text.
    fn finish_flagged(&self, message: Value, raw_len: usize) -> Option<Value> {
        let Some(flags) = self.output_flags(&message) else {
            return self.finish(message, raw_len);
        };
        let mut message = self.finish(message.clone(), raw_len).unwrap_or(message);
        if let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) {
            let meta = result
                .entry("_meta")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(META_POISONING.to_owned(), flags);
            }
        }
        Some(message)
    }

    /// The scan's findings on a tool result, as kinds and paths (never the
    /// text, which is the upstream's), also counted in the audit event's
    /// sanitizer actions as `flagged_<kind>`. `None` when clean.
    fn output_flags(&self, message: &Value) -> Option<Value> {
        let findings = scan::output(message.get("result")?);
        if findings.is_empty() {
            return None;
        }
        let mut report = Report::default();
        for f in &findings {
            report.add(&format!("flagged_{}", f.kind.as_str()), 1);
        }
        self.trail.sanitized(&report);
        tracing::warn!(server = %self.server, tool = self.tool.as_deref(), flags = %report.summary(),
            "tool output looks like an injection");
        let flags = findings
            .iter()
            .map(|f| serde_json::json!({"kind": f.kind.as_str(), "severity": f.severity, "path": f.path}))
            .collect();
        Some(Value::Array(flags))
    }

    fn judge(
        &self,
        message: &mut Value,
        raw_len: usize,
        report: &mut Report,
    ) -> Result<(), Rejection> {
        let tool = self.tool.clone().unwrap_or_default();
        if let Err(m) = shape(message) {
            return Err(self.fault(Fault::Malformed(m), report));
        }
        if let Some(error) = message.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
            let text = error_text(error);
            let lower = text.to_lowercase();
            let unknown_tool = code == -32602
                && [
                    "not found",
                    "unknown tool",
                    "no such tool",
                    "does not exist",
                ]
                .iter()
                .any(|p| lower.contains(p));
            if unknown_tool {
                self.catalog.invalidate();
            }
            let e = UpstreamError::new(
                UpstreamKind::Error(RpcError { code, unknown_tool }),
                format!("JSON-RPC error {code}"),
            )
            .with_snippet(Some(text));
            return Err(self.failure_with(e, report));
        }
        let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
            // Not a tool result: forwarding it would hand the client a reply it cannot read.
            let e = UpstreamError::new(UpstreamKind::Protocol, "its result is not a JSON object");
            return Err(self.failure_with(e, report));
        };
        if let Some(field) = misshapen_field(result) {
            let e = UpstreamError::new(
                UpstreamKind::Protocol,
                format!("its result's {field} has the wrong type"),
            );
            return Err(self.failure_with(e, report));
        }
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            let text = content_text(result);
            let (failure, words) = read_failure(&text, &tool);
            let e = UpstreamError::new(UpstreamKind::ToolFailed(failure), String::new())
                .with_snippet(words);
            return Err(self.failure_with(e, report));
        }
        // Every result type (complete, input_required, task) gets the same checks.
        let sanitizer = self.sanitizer();
        check_result(
            &sanitizer,
            self.call.output_schema.as_ref(),
            message,
            raw_len,
            report,
        )
        .map_err(|fault| self.fault(fault, report))
    }

    /// The rejection for a fault of the output checks.
    pub(crate) fn fault(&self, fault: Fault, report: &mut Report) -> Rejection {
        match fault {
            Fault::Malformed(Malformed(why)) => {
                self.failure_with(UpstreamError::new(UpstreamKind::Protocol, why), report)
            }
            Fault::Output(kind) => Rejection::Output(OutputRefusal {
                kind,
                server: self.server.clone(),
                tool: self.tool.clone(),
                method: self.method.clone(),
                hints: self.call.hints,
            }),
        }
    }

    fn failure_with(&self, e: UpstreamError, report: &mut Report) -> Rejection {
        let snippet = e.snippet.as_deref().and_then(|s| self.snippet(s, report));
        let mut f = UpstreamFailure::new(e.kind, &self.server, self.tool.as_deref(), e.reason);
        f.relayed = e
            .error
            .and_then(|error| relayed_error(&self.sanitizer(), *error, report))
            .map(Box::new);
        f.snippet = snippet;
        f.not_run = e.not_run;
        f.hints = self.call.hints;
        Rejection::Upstream(f)
    }
}

/// What becomes of one upstream message on its way.
#[derive(Debug)]
enum Verdict {
    /// Passed on byte for byte.
    Unchanged,
    /// Passed on as sanitized.
    Changed(Value),
    /// Not passed on: the answer to the request becomes this refusal; any
    /// other message is dropped.
    Refused(Rejection),
}

/// Why the output checks refused a message.
#[derive(Debug)]
pub(crate) enum Fault {
    /// Not a message the gateway can read: an upstream protocol error.
    Malformed(Malformed),
    /// A result the gateway withholds.
    Output(OutputKind),
}

/// The output checks of every result that can reach the model, whatever its
/// method or `resultType`: the whole message sanitized; with `secrets =
/// "block"`, withheld when a secret was found anywhere in it; `structuredContent`
/// checked against `schema` (the tool's `outputSchema`, when it has one); its
/// texts bounded by `max_output_bytes`; and no larger than
/// [`MAX_CLIENT_MESSAGE`] (a `structuredContent` is left out, with a notice,
/// before the result is refused as too large). `raw_len` is the size of the
/// message as the upstream sent it. The caller has already checked the shape
/// and handled `error` and `isError`.
pub(crate) fn check_result(
    sanitizer: &Sanitizer<'_>,
    schema: Option<&CompiledSchema>,
    message: &mut Value,
    raw_len: usize,
    report: &mut Report,
) -> Result<(), Fault> {
    let before = schema.and_then(|_| message.pointer("/result/structuredContent").cloned());
    let mut local = Report::default();
    let texts = sanitizer
        .sanitize_message(message, &mut local)
        .map_err(Fault::Malformed)?;
    report.merge(&local);
    let kinds = local.secret_kinds();
    if sanitizer.blocks_secrets() && !kinds.is_empty() {
        return Err(Fault::Output(OutputKind::Withheld(
            kinds.iter().map(|k| (*k).to_owned()).collect(),
        )));
    }
    if let (Some(schema), Some(structured)) = (schema, message.pointer("/result/structuredContent"))
        && let Err(mut violations) = schema.check(structured)
    {
        let sanitized = before.as_ref() != Some(structured);
        for v in &mut violations {
            if v.pointer.is_empty() {
                v.pointer = "(structuredContent)".into();
            }
            if let Some(d) = v.description.as_mut() {
                sanitizer.string(d, report);
                quoted(d);
            }
            sanitizer.string(&mut v.received, report);
            quoted(&mut v.received);
        }
        return Err(Fault::Output(OutputKind::SchemaViolation {
            violations,
            sanitized,
        }));
    }
    let too_large = |bytes| {
        Fault::Output(OutputKind::TooLarge {
            bytes,
            limit: MAX_CLIENT_MESSAGE,
        })
    };
    let replaced = sanitizer.bound(message, texts, report);
    if replaced && schema.is_some() {
        // The client checks structuredContent against the schema: a notice in
        // its place would fail there.
        return Err(too_large(raw_len));
    }
    let changed = !report.is_empty();
    let mut size = if changed { json_len(message) } else { raw_len };
    if size > MAX_CLIENT_MESSAGE
        && let Some(structured) = message.pointer_mut("/result/structuredContent")
        && structured.get("portcullis/omitted").is_none()
    {
        if schema.is_some() {
            return Err(too_large(size));
        }
        *structured = serde_json::json!({"portcullis/omitted": format!(
            "[portcullis: structuredContent omitted here; it made the message larger than the {MAX_CLIENT_MESSAGE} bytes clients accept (limit {MAX_CLIENT_MESSAGE} bytes)]"
        )});
        report.add(TRUNCATED, 1);
        size = json_len(message);
    }
    if size > MAX_CLIENT_MESSAGE {
        return Err(too_large(size));
    }
    Ok(())
}

/// Any other message (a notification, a request of the server's own, an
/// error): sanitized whole, its texts bounded, no larger than
/// [`MAX_CLIENT_MESSAGE`].
fn check_message(
    sanitizer: &Sanitizer<'_>,
    message: &mut Value,
    raw_len: usize,
    report: &mut Report,
) -> Result<(), Fault> {
    let texts = sanitizer
        .sanitize_message(message, report)
        .map_err(Fault::Malformed)?;
    sanitizer.bound(message, texts, report);
    let size = if report.is_empty() {
        raw_len
    } else {
        json_len(message)
    };
    if size > MAX_CLIENT_MESSAGE {
        return Err(Fault::Output(OutputKind::TooLarge {
            bytes: size,
            limit: MAX_CLIENT_MESSAGE,
        }));
    }
    Ok(())
}

/// A sanitized text quoted inside a gateway text: no byte order mark (the
/// sanitizer keeps one that starts a text; inside a sentence it is invisible).
fn quoted(text: &mut String) {
    let clean = crate::sanitize::unbom(text);
    if clean.len() != text.len() {
        *text = clean.to_owned();
    }
}

/// The length of `value` serialized, without building the text.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The first field of a tool result whose JSON type breaks the MCP schema
/// (`isError` a boolean, `content` an array, `structuredContent` an object).
fn misshapen_field(result: &serde_json::Map<String, Value>) -> Option<&'static str> {
    let wrong = |key: &str, ok: fn(&Value) -> bool| result.get(key).is_some_and(|v| !ok(v));
    if wrong("isError", Value::is_boolean) {
        Some("isError")
    } else if wrong("content", Value::is_array) {
        Some("content")
    } else if wrong("structuredContent", Value::is_object) {
        Some("structuredContent")
    } else {
        None
    }
}

/// An error object's words: its message, and its data when that is text.
fn error_text(error: &Value) -> String {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match error.get("data") {
        Some(Value::String(d)) if !d.is_empty() => format!("{message}: {d}"),
        _ => message,
    }
}

/// A JSON-RPC error object as the spec shapes it: an integer `code` and a
/// string `message` (`data` optional). Only such an object is relayed.
fn is_rpc_error(error: &Value) -> bool {
    error.get("code").is_some_and(|c| c.is_i64())
        && error.get("message").is_some_and(Value::is_string)
}

/// The JSON-RPC error of a message that is an error response (no result, no method).
fn rpc_error_of(message: &Value) -> Option<&Value> {
    (message.get("method").is_none() && message.get("result").is_none())
        .then(|| message.get("error"))
        .flatten()
        .filter(|e| is_rpc_error(e))
}

/// An upstream's answer with a 4xx `status`: the upstream refused the request,
/// which therefore did not run. 401, 403 and 407 concern the gateway's own
/// credentials (the client's never cross), so the server is unavailable to
/// the gateway; any other 4xx is the upstream's answer to the client, relayed
/// with its status and, when it sent one, its JSON-RPC `error`.
pub(crate) fn refusal(
    status: StatusCode,
    error: Option<&Value>,
    words: Option<String>,
) -> UpstreamError {
    let code = status.as_u16();
    let mut e = if matches!(code, 401 | 403 | 407) {
        UpstreamError::new(
            UpstreamKind::Unavailable,
            format!(
                "it refused the gateway's own credentials (HTTP {})",
                status_words(status)
            ),
        )
        .with_snippet(words)
    } else {
        let error = error.filter(|e| is_rpc_error(e)).cloned();
        let words = error.as_ref().map(error_text).or(words);
        let mut e = UpstreamError::new(
            UpstreamKind::Refused(code),
            format!("it refused the request with HTTP {}", status_words(status)),
        )
        .with_snippet(words);
        e.error = error.map(Box::new);
        e
    };
    e.not_run = true;
    e
}

/// An upstream's error object made fit to relay: sanitized like any upstream
/// message; `None` (so that the gateway's words replace it) when it carries a
/// secret and secrets are blocked.
pub(crate) fn relayed_error(
    sanitizer: &Sanitizer<'_>,
    mut error: Value,
    report: &mut Report,
) -> Option<Value> {
    if !error.is_object() {
        return None;
    }
    // Walked as the error message it is, so the one table of exempt fields applies.
    let mut wrapped = serde_json::json!({"jsonrpc": "2.0", "id": 0, "error": error.take()});
    let mut local = Report::default();
    sanitizer.message(&mut wrapped, &mut local).ok()?;
    report.merge(&local);
    let withheld = sanitizer.blocks_secrets() && !local.secret_kinds().is_empty();
    (!withheld).then(|| wrapped["error"].take())
}

/// The text blocks of a result, joined.
fn content_text(result: &serde_json::Map<String, Value>) -> String {
    result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Reads an upstream `isError` text: the Python SDK's bare "Error executing
/// tool X" is opaque; its "Error executing tool X: …" and FastMCP's "Error
/// calling tool 'X': …" lose their prefix; anything else (the TypeScript SDK
/// passes raw exception text) is quoted as it is.
fn read_failure(text: &str, tool: &str) -> (ToolFailure, Option<String>) {
    let trimmed = text.trim();
    let python = format!("Error executing tool {tool}");
    if trimmed == python {
        return (ToolFailure::Opaque, None);
    }
    let prefixes = [
        format!("{python}: "),
        format!("Error calling tool '{tool}': "),
        format!("Error calling tool {tool}: "),
    ];
    let words = prefixes
        .iter()
        .find_map(|p| trimmed.strip_prefix(p.as_str()))
        .unwrap_or(trimmed);
    let words = (!words.is_empty()).then(|| words.to_owned());
    (ToolFailure::Message, words)
}

fn is_response(message: &Value) -> bool {
    message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// Relays a reply to the client.
pub(crate) fn relay(reply: Reply, to: Recipient) -> Response {
    match reply {
        // An HTTP refusal is the upstream's answer, whatever the method.
        Reply::Empty { status, headers } if status.is_client_error() => {
            to.refused(refusal(status, None, None), headers)
        }
        Reply::Other {
            status,
            headers,
            text,
        } if status.is_client_error() => to.refused(refusal(status, None, text), headers),
        // A tools/call is owed exactly one answer, even when the upstream sends none.
        Reply::Empty { status, .. } if to.tool.is_some() => {
            let e = UpstreamError::new(
                UpstreamKind::Protocol,
                format!(
                    "it answered HTTP {} without a response",
                    status_words(status)
                ),
            );
            to.render(to.failure(e))
        }
        Reply::Empty { status, headers } => {
            with_headers(Response::new(Body::empty()), status, headers)
        }
        Reply::Other { status, text, .. } => {
            let kind = if status.is_server_error() || status.is_redirection() {
                UpstreamKind::Unavailable
            } else {
                UpstreamKind::Protocol
            };
            let reason = format!(
                "it answered HTTP {} without a JSON-RPC message",
                status_words(status)
            );
            to.render(to.failure(UpstreamError::new(kind, reason).with_snippet(text)))
        }
        Reply::Json {
            status,
            headers,
            body,
        } => relay_json(status, headers, body, to),
        Reply::Sse {
            status,
            headers,
            events,
        } => {
            let mut r = Response::new(Body::from_stream(sse_relay(events, to)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            r.headers_mut()
                .insert("x-accel-buffering", HeaderValue::from_static("no"));
            with_headers(r, status, headers)
        }
    }
}

/// `502 Bad Gateway`, or the bare number when it has no reason phrase.
fn status_words(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// The start of a body that is not what it should be, as text to quote.
fn body_words(body: &[u8]) -> Option<String> {
    let head = &body[..body.len().min(1024)];
    let text = String::from_utf8_lossy(head);
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn relay_json(status: StatusCode, headers: HeaderMap, body: Bytes, to: Recipient) -> Response {
    let message = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| to.inspect(text));
    if status.is_client_error() {
        // Its error (the Python SDK's "Missing session ID" comes with the id
        // "server-error") is relayed under this request's id.
        let error = message.as_ref().and_then(rpc_error_of);
        let words = error.is_none().then(|| body_words(&body)).flatten();
        return to.refused(refusal(status, error, words), headers);
    }
    if to.tool.is_some() {
        let Some(message) = message else {
            let (kind, reason) = if status.is_server_error() {
                (
                    UpstreamKind::Unavailable,
                    format!("it answered HTTP {}", status_words(status)),
                )
            } else {
                (
                    UpstreamKind::Protocol,
                    "its reply is not valid JSON".to_owned(),
                )
            };
            let e = UpstreamError::new(kind, reason).with_snippet(body_words(&body));
            return to.render(to.failure(e));
        };
        if !to.answers(&message) {
            let e = if status.is_server_error() {
                let words = message.get("error").map(error_text);
                UpstreamError::new(
                    UpstreamKind::Unavailable,
                    format!("it answered HTTP {}", status_words(status)),
                )
                .with_snippet(words)
            } else {
                UpstreamError::new(
                    UpstreamKind::Protocol,
                    "its reply does not answer this request (wrong or missing id)",
                )
            };
            return to.render(to.failure(e));
        }
        return match to.finish_flagged(message, body.len()) {
            // A rewritten or sanitized answer is a JSON-RPC response like any other: HTTP 200.
            Some(rewritten) => json(&rewritten, headers),
            None if status.is_success() => json_bytes(status, headers, body),
            None => json_bytes(StatusCode::OK, headers, body),
        };
    }
    let Some(message) = message else {
        let reason = format!(
            "it answered HTTP {} with a body that is not JSON",
            status_words(status)
        );
        let e = UpstreamError::new(UpstreamKind::Protocol, reason).with_snippet(body_words(&body));
        return to.render(to.failure(e));
    };
    if !to.admits(&message) {
        let e = UpstreamError::new(
            UpstreamKind::Protocol,
            "it answered with a message the MCP specification does not let a server send",
        );
        return to.render(to.failure(e));
    }
    match to.pass(message, body.len()) {
        Verdict::Changed(clean) => {
            let mut r = json_response(status, &clean);
            r.headers_mut().extend(headers);
            r
        }
        Verdict::Unchanged => json_bytes(status, headers, body),
        Verdict::Refused(rejection) => to.render(rejection),
    }
}

fn json_bytes(status: StatusCode, headers: HeaderMap, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    with_headers(r, status, headers)
}

fn with_headers(mut response: Response, status: StatusCode, headers: HeaderMap) -> Response {
    *response.status_mut() = status;
    response.headers_mut().extend(headers);
    response
}

/// Re-encodes SSE items as they arrive, each message sanitized; for a
/// `tools/call`, rewrites the final response and guarantees the one answer.
fn sse_relay(
    events: SseStream,
    to: Recipient,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    struct State {
        events: SseStream,
        to: Recipient,
        answered: bool,
        /// A response to another id went by (the reason, if none comes for ours).
        other_id: bool,
        done: bool,
    }
    let state = State {
        events,
        to,
        answered: false,
        other_id: false,
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            let item = match st.events.next().await {
                Some(item) => item,
                None => {
                    st.done = true;
                    if st.to.tool.is_some() && !st.answered {
                        let reason = if st.other_id {
                            "its event stream answered another request id and ended without answering this one"
                        } else {
                            "its event stream ended without a response"
                        };
                        let e = UpstreamError::new(UpstreamKind::Protocol, reason);
                        return Some((Ok(gateway_event(&st.to, e)), st));
                    }
                    return None;
                }
            };
            match item {
                Ok(SseItem::Comment(c)) => return Some((Ok(SseItem::Comment(c).encode()), st)),
                Ok(SseItem::Event(event)) if event.data.is_empty() => {
                    return Some((Ok(SseItem::Event(event).encode()), st));
                }
                Ok(SseItem::Event(mut event)) => {
                    let Some(message) = st.to.inspect(&event.data) else {
                        if st.to.tool.is_some() {
                            st.done = true;
                            let e = UpstreamError::new(
                                UpstreamKind::Protocol,
                                "an event of its stream is not valid JSON",
                            )
                            .with_snippet(body_words(event.data.as_bytes()));
                            return Some((Ok(gateway_event(&st.to, e)), st));
                        }
                        // Not JSON-RPC: never shown to the client.
                        continue;
                    };
                    if !st.to.admits(&message) || st.to.hides(&message) {
                        continue;
                    }
                    let raw_len = event.data.len();
                    let changed = if st.to.tool.is_some() && st.to.answers(&message) {
                        st.answered = true;
                        // The final response ends the exchange.
                        st.done = true;
                        st.to.finish_flagged(message, raw_len)
                    } else if st.to.tool.is_some() && is_response(&message) {
                        // A response to another id is not this client's to see.
                        st.other_id = true;
                        continue;
                    } else {
                        let ours = st.to.answers(&message);
                        match st.to.pass(message, raw_len) {
                            Verdict::Unchanged => None,
                            Verdict::Changed(m) => Some(m),
                            Verdict::Refused(rejection) if ours => {
                                st.done = true;
                                st.to
                                    .trail
                                    .decided(rejection.code(), rejection.source().as_str());
                                rejection.rpc_message(st.to.render_ctx())
                            }
                            // Not the answer: a message the client could not
                            // use, or one that must not reach it, is left out.
                            Verdict::Refused(rejection) => {
                                tracing::warn!(
                                    server = %st.to.server,
                                    method = %st.to.method,
                                    code = rejection.code(),
                                    "an upstream message was left out of the stream"
                                );
                                continue;
                            }
                        }
                    };
                    if let Some(m) = changed {
                        event.data = m.to_string();
                    }
                    return Some((Ok(SseItem::Event(event).encode()), st));
                }
                Err(e) => {
                    st.done = true;
                    if st.to.tool.is_some() && !st.answered {
                        return Some((Ok(gateway_event(&st.to, e)), st));
                    }
                    return None;
                }
            }
        }
    })
}

fn gateway_event(to: &Recipient, e: UpstreamError) -> Bytes {
    let rejection = to.failure(e);
    to.trail
        .decided(rejection.code(), rejection.source().as_str());
    let message = rejection
        .tool_message(to.render_ctx())
        .unwrap_or(Value::Null);
    SseItem::Event(SseEvent::message(message.to_string())).encode()
}

/// Reads the response to `id` from a reply, whole.
pub(crate) async fn collect(
    reply: Reply,
    id: &Value,
    catalog: &Catalog,
) -> Result<Value, UpstreamError> {
    let protocol = |reason: &str| UpstreamError::new(UpstreamKind::Protocol, reason);
    match reply {
        Reply::Json { status, body, .. } if status.is_client_error() => {
            let message = serde_json::from_slice::<Value>(&body).ok();
            let error = message.as_ref().and_then(rpc_error_of);
            let words = error.is_none().then(|| body_words(&body)).flatten();
            Err(refusal(status, error, words))
        }
        Reply::Other { status, text, .. } if status.is_client_error() => {
            Err(refusal(status, None, text))
        }
        Reply::Empty { status, .. } if status.is_client_error() => Err(refusal(status, None, None)),
        Reply::Json { status, body, .. } => {
            let message: Value = serde_json::from_slice(&body).map_err(|_| {
                protocol("its reply is not valid JSON").with_snippet(body_words(&body))
            })?;
            if message.get("id") != Some(id) {
                let kind = if status.is_server_error() {
                    UpstreamKind::Unavailable
                } else {
                    UpstreamKind::Protocol
                };
                return Err(UpstreamError::new(
                    kind,
                    format!(
                        "it answered HTTP {} without a response to the request",
                        status_words(status)
                    ),
                ));
            }
            Ok(message)
        }
        Reply::Sse { mut events, .. } => {
            while let Some(item) = events.next().await {
                let SseItem::Event(event) = item? else {
                    continue;
                };
                if event.data.is_empty() {
                    continue;
                }
                let message: Value = serde_json::from_str(&event.data)
                    .map_err(|_| protocol("an event of its stream is not valid JSON"))?;
                if message.get("method").and_then(Value::as_str)
                    == Some("notifications/tools/list_changed")
                {
                    catalog.invalidate();
                }
                if is_response(&message) && message.get("id") == Some(id) {
                    return Ok(message);
                }
            }
            Err(protocol("its event stream ended without a response"))
        }
        Reply::Empty { status, .. } | Reply::Other { status, .. } => Err(UpstreamError::new(
            if status.is_server_error() {
                UpstreamKind::Unavailable
            } else {
                UpstreamKind::Protocol
            },
            format!(
                "it answered HTTP {} without a response",
                status_words(status)
            ),
        )),
    }
}

/// A JSON-RPC message already serialized, as an `application/json` response.
pub(crate) fn json_text(body: String, headers: HeaderMap) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().extend(headers);
    r
}

/// A JSON-RPC message as an `application/json` response.
pub(crate) fn json(message: &Value, headers: HeaderMap) -> Response {
    let mut r = json_response(StatusCode::OK, message);
    r.headers_mut().extend(headers);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_failure_texts_are_recognised() {
        assert_eq!(
            read_failure("Error executing tool explode", "explode"),
            (ToolFailure::Opaque, None)
        );
        assert_eq!(
            read_failure("Error executing tool explode: bad date", "explode"),
            (ToolFailure::Message, Some("bad date".into()))
        );
        assert_eq!(
            read_failure("Error calling tool 'explode': db down", "explode"),
            (ToolFailure::Message, Some("db down".into()))
        );
        assert_eq!(
            read_failure("cannot connect", "explode"),
            (ToolFailure::Message, Some("cannot connect".into()))
        );
        assert_eq!(read_failure("  ", "explode"), (ToolFailure::Message, None));
    }
}
