//! The [`Recipient`]: who a reply is for, and the checks each upstream
//! message passes on its way to that client.
//!
//! Place: made from the request's context (`Context::recipient`, the one
//! place) before forwarding; the relay hands it every message of the
//! reply. It admits or drops a message, sanitizes it, keeps
//! the task scope, and turns the final answer to a `tools/call` into an
//! `isError` result when the upstream failed (see [`Recipient::finish`]).
//!
//! Invariants: a `tools/call` gets exactly one response with its own id; a
//! message the sanitizer did not change is passed on byte for byte.

use std::sync::Arc;

use axum::response::Response;
use http::HeaderMap;
use serde_json::Value;

use crate::config::SanitizeSettings;
use crate::error::{
    self, OutputRefusal, Rejection, RenderCtx, RpcError, UpstreamFailure, UpstreamKind,
};
use crate::mcp::methods::{self, Kind, Method};
use crate::mcp::sse::SseEvent;
use crate::mcp::version::Era;
use crate::pins::scan;
use crate::proxy::catalog::CallFacts;
use crate::proxy::catalog::Catalog;
use crate::proxy::tasks::{Reader, TaskScope};
use crate::record::trail::Trail;
use crate::sanitize::message::{Malformed, Shape, shape};
use crate::sanitize::{Report, Sanitizer};
use crate::transport::reply::UpstreamError;

use super::check::{
    Fault, META_POISONING, Verdict, check_message, check_result, content_text, error_text,
    json_len, misshapen_field, read_failure, relayed_error,
};

/// Longest path a poisoning flag quotes (the keys of a deep `structuredContent`).
const MAX_FLAG_PATH: usize = 256;

/// Who the reply is for, and what the gateway must guarantee about it.
#[derive(Debug, Clone)]
pub(crate) struct Recipient {
    /// The request's id (`None` for GET streams and notifications).
    pub id: Option<Value>,
    /// The request's method (`GET` for a GET stream), for logs.
    pub method: String,
    /// The method of the specification the request was typed as.
    pub rpc: Option<Method>,
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
    /// The flow labels set in the caller's session once the server's content
    /// reaches the client (a result, or a failure quoting its words): of a
    /// source tool, a labelled resource read or a labelled prompt get.
    pub flow: Option<crate::flow::Recording>,
    /// Which resources the reply may name (`None` in observe mode, where
    /// lists show everything).
    pub shown: Option<super::shown::Shown>,
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
        judge.flow = None;
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

    /// The method whose result this reply carries, for the positions of its
    /// identifiers: a tool's answer (to `tools/call`, to an operator-named
    /// method of class `tool`, or a task's result judged as its tool's) is a
    /// `tools/call` result.
    fn answering(&self) -> Option<&'static str> {
        if self.tool.is_some() {
            Some(Method::ToolsCall.name())
        } else {
            self.rpc.map(Method::name)
        }
    }

    pub(super) fn sanitizer(&self) -> Sanitizer<'_> {
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
    pub(super) fn refused(&self, e: UpstreamError, headers: HeaderMap) -> Response {
        let mut r = self.render(self.failure(e));
        r.headers_mut().extend(headers);
        r
    }

    pub(super) fn render(&self, rejection: Rejection) -> Response {
        self.trail
            .decided(rejection.code(), rejection.source().as_str());
        rejection.into_response(self.render_ctx())
    }

    pub(super) fn render_ctx(&self) -> RenderCtx<'_> {
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

    /// The framing of an upstream SSE event made safe to relay (its `data` is
    /// judged apart, as a message): an `id` is kept only when it is 1–256
    /// bytes of visible ASCII the sanitizer leaves as it is (no control, no
    /// secret), and is removed otherwise; an `event` name that is not such a
    /// plain token (`message`) leaves the whole event out. False: leave it out.
    pub(super) fn framing(&self, event: &mut SseEvent) -> bool {
        let sanitizer = self.sanitizer();
        let plain = |value: &str, max: usize, token: bool| {
            (1..=max).contains(&value.len())
                && value.bytes().all(|b| {
                    if token {
                        b.is_ascii_alphanumeric() || b"_.-/".contains(&b)
                    } else {
                        b.is_ascii_graphic()
                    }
                })
                && sanitizer.text(value, &mut Report::default()).is_none()
        };
        if event.id.as_deref().is_some_and(|id| !plain(id, 256, false)) {
            tracing::warn!(server = %self.server, method = %self.method,
                "an upstream SSE event id was removed: it is not plain visible text");
            event.id = None;
        }
        if event
            .event
            .as_deref()
            .is_some_and(|name| !plain(name, 64, true))
        {
            tracing::warn!(server = %self.server, method = %self.method,
                "an upstream SSE event was left out: its event name is not a plain token");
            return false;
        }
        true
    }

    /// The upstream's message, or `None` when it is not JSON.
    pub(super) fn inspect(&self, data: &str) -> Option<Value> {
        let message: Value = serde_json::from_str(data).ok()?;
        if methods::tool_list_changed(&message) {
            self.catalog.invalidate();
        }
        Some(message)
    }

    /// False when `message` is a request or notification the specification
    /// does not let a server send in this era (`crate::mcp::methods`): such a
    /// message is dropped, never relayed. Responses are judged as answers.
    pub(super) fn admits(&self, message: &Value) -> bool {
        let Some(method) = message.get("method") else {
            return true;
        };
        // An id of the gateway's own approval-question form is never relayed:
        // a client's answer to it can only answer the gateway; nor is a
        // server's question in the gateway's own words.
        let posing = methods::named_in(message) == Some(Method::ElicitationCreate)
            && message
                .get("params")
                .is_some_and(crate::approval::question::poses_as_gateway);
        if posing
            || message
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
    pub(super) fn answers(&self, message: &Value) -> bool {
        self.id.is_some()
            && self.id.as_ref() == message.get("id")
            && (message.get("result").is_some() || message.get("error").is_some())
    }

    /// A message on its way (anything but the final answer to a `tools/call`):
    /// its shape checked, sanitized whole, its texts bounded; a result also
    /// goes through the output checks every result reaching the model gets.
    pub(super) fn pass(&self, mut message: Value, raw_len: usize) -> Verdict {
        let mut report = Report::default();
        // A task's result inside it gets the checks of the task's tool first.
        let nested = (self.tasks.as_ref()).is_some_and(|t| self.check_nested_task(t, &mut message));
        if let Some(tasks) = &self.tasks {
            tasks.clean(&self.reader(), &mut message, &mut report);
        }
        let sanitizer = self.sanitizer();
        let outcome = match shape(&message) {
            Err(m) => Err(Fault::Malformed(m)),
            Ok(Shape::Result) => check_result(
                &sanitizer,
                None,
                &mut message,
                self.answering(),
                raw_len,
                &mut report,
            ),
            Ok(_) => check_message(&sanitizer, &mut message, raw_len, &mut report),
        };
        self.log(&report);
        if outcome.is_ok() && self.answers(&message) {
            // The answer to a labelled resource read or prompt get (its
            // content, or an error in the server's words) reaches the client.
            self.read_by_client();
        }
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

    /// True when `message` concerns a task that is not this client's, or
    /// names a resource this client's list hides.
    pub(super) fn hides(&self, message: &Value) -> bool {
        (self.tasks.as_ref()).is_some_and(|t| t.hides(&self.server, message))
            || (self.shown.as_ref()).is_some_and(|s| s.hides(&self.server, message))
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
        if outcome.is_ok() {
            // A result the client receives brings its content into the session.
            self.read_by_client();
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
    pub(super) fn finish_flagged(&self, message: Value, raw_len: usize) -> Option<Value> {
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
        // A path is made of the upstream's keys: sanitized as the keys of the
        // result are, and capped, so that the gateway's own flag quotes
        // nothing of the upstream's raw.
        let sanitizer = self.sanitizer();
        let path = |raw: &str| {
            let mut p = sanitizer
                .text(raw, &mut Report::default())
                .unwrap_or_else(|| raw.to_owned());
            let mut end = p.len().min(MAX_FLAG_PATH);
            while !p.is_char_boundary(end) {
                end -= 1;
            }
            p.truncate(end);
            p
        };
        let flags = findings
            .iter()
            .map(|f| serde_json::json!({"kind": f.kind.as_str(), "severity": f.severity, "path": path(&f.path)}))
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
        if let Some(why) = posing(result) {
            let e = UpstreamError::new(UpstreamKind::Protocol, why);
            return Err(self.failure_with(e, report));
        }
        // Every result type (complete, input_required, task) gets the same checks.
        let sanitizer = self.sanitizer();
        check_result(
            &sanitizer,
            self.call.output_schema.as_ref(),
            message,
            self.answering(),
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
        if quotes_server(&f) {
            // So does a failure that quotes the server's words to the client.
            self.read_by_client();
        }
        Rejection::Upstream(f)
    }

    /// The server's content reached the client: a source's labels are set in
    /// the caller's session.
    fn read_by_client(&self) {
        if let Some(flow) = &self.flow
            && flow.after_result()
        {
            let lines = flow.audit_lines();
            self.trail.note(|e| e.violations.extend(lines));
        }
    }
}

/// Whether the client receives words of the server's own with `failure`: its
/// text quoted (an `isError` result, an HTTP refusal, an unreadable body) or
/// its JSON-RPC error relayed. Such words are the source's content as much as
/// a result is, so they set its flow label too.
pub(super) fn quotes_server(failure: &UpstreamFailure) -> bool {
    failure.snippet.is_some() || failure.relayed.is_some()
}

/// Why a server's `input_required` result could pass for the gateway's own
/// approval question: it uses the gateway's reserved answer key, or asks in
/// the gateway's words. Such a result is refused, never relayed.
fn posing(result: &serde_json::Map<String, Value>) -> Option<&'static str> {
    use crate::approval::question::{INPUT_KEY, poses_as_gateway};
    let requests = result.get("inputRequests")?.as_object()?;
    if requests.contains_key(INPUT_KEY) {
        return Some(
            "its input_required result uses the key `portcullis_approval`, reserved for the gateway's own approval question",
        );
    }
    requests
        .values()
        .any(|r| r.get("params").is_some_and(poses_as_gateway))
        .then_some(
            "its input_required result asks in the words of the gateway's own approval question",
        )
}
