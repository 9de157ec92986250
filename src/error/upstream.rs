//! How an upstream failure reads: its text, its retry advice, and the
//! response relaying an upstream's HTTP refusal.
//!
//! Place: beneath the rendering, for [`Rejection::Upstream`]; the proxy
//! builds an [`UpstreamFailure`] and this file puts it into words.
//! Invariants: gateway-made text never embeds a raw upstream body, only a
//! sanitized, capped snippet; annotations shape advice, never a decision.

use axum::response::Response;
use http::StatusCode;
use serde_json::Value;

use super::rejection::{RpcError, ToolFailure, ToolHints, UpstreamFailure, UpstreamKind, codes};
use super::wire::{error_response, json_response};

// === impl UpstreamFailure ===

impl UpstreamFailure {
    /// A failure of `kind` on `server` (and `tool`, for `tools/call`).
    pub(crate) fn new(
        kind: UpstreamKind,
        server: &str,
        tool: Option<&str>,
        reason: String,
    ) -> Self {
        Self {
            kind,
            server: server.into(),
            tool: tool.map(str::to_owned),
            reason,
            snippet: None,
            not_run: false,
            unchecked: false,
            hints: ToolHints::default(),
            relayed: None,
        }
    }

    pub(super) fn detail(&self) -> serde_json::Map<String, Value> {
        let mut detail = serde_json::Map::new();
        detail.insert("server".into(), self.server.to_string().into());
        if let Some(tool) = &self.tool {
            detail.insert("tool".into(), tool.clone().into());
        }
        if let UpstreamKind::Error(e) = self.kind {
            detail.insert("upstream_code".into(), e.code.into());
        }
        if let Some(snippet) = &self.snippet {
            detail.insert("upstream_text".into(), snippet.clone().into());
        }
        detail.insert("retry".into(), self.retry().into());
        detail
    }

    /// `data` of the JSON-RPC error answering another method: only a missing
    /// credential says more than its code (what it is, whether to retry).
    pub(super) fn data(&self) -> Option<Value> {
        matches!(self.kind, UpstreamKind::Credentials { .. }).then(|| {
            let mut data = self.detail();
            data.insert("code".into(), self.kind.code().into());
            Value::Object(data)
        })
    }

    /// Machine-readable retry advice: `safe`, `check_first`, `later` or `no`.
    fn retry(&self) -> &'static str {
        let safe = self.hints.read_only || self.hints.idempotent;
        match self.kind {
            // Without a credential nothing is sent, tool list or call alike.
            UpstreamKind::Credentials { retry_helps: true } => "later",
            UpstreamKind::Credentials { retry_helps: false } => "no",
            UpstreamKind::Open => "later",
            _ if self.unchecked => "later",
            UpstreamKind::Error(RpcError { code: -32602, .. }) => "no",
            UpstreamKind::Unavailable if self.not_run => "later",
            UpstreamKind::Refused(_) => "no",
            _ if safe => "safe",
            _ => "check_first",
        }
    }

    pub(super) fn text(&self) -> String {
        let Some(tool) = &self.tool else {
            return self.method_text();
        };
        let server = &self.server;
        let said = match &self.snippet {
            Some(s) => format!(" (its reply said: \"{s}\")"),
            None => String::new(),
        };
        let quoted = match &self.snippet {
            Some(s) => format!(": \"{s}\""),
            None => String::new(),
        };
        let again = self.hints.if_it_ran(tool);
        // Without a credential nothing is sent, tool list or call alike.
        let credentials = matches!(self.kind, UpstreamKind::Credentials { .. });
        if self.unchecked && !credentials {
            return format!(
                "The gateway could not get the tool list of server `{server}`, which it needs to check the call of \
                 `{tool}`: {}{said}. The tool was not run. Retrying later may help; if it keeps failing, report that \
                 the server is unavailable.",
                self.reason
            );
        }
        match self.kind {
            UpstreamKind::Open => format!(
                "Server `{server}` is unavailable, so the gateway did not send the call of `{tool}`, and the tool did \
                 not run: {}",
                self.reason
            ),
            UpstreamKind::Credentials { retry_helps } => format!(
                "The gateway could not obtain the credential this client reaches server `{server}` with, so `{tool}` \
                 was not sent and did not run: {}. {}",
                self.reason,
                credentials_advice(retry_helps)
            ),
            UpstreamKind::Unavailable if self.not_run => format!(
                "The gateway could not reach server `{server}` to run `{tool}`: {}. The arguments were valid, and \
                 the tool did not run. Retrying later may help; if it keeps failing, report that the server is unavailable.",
                self.reason
            ),
            UpstreamKind::Unavailable => format!(
                "Server `{server}` failed while handling the call to `{tool}`: {}{said}. The arguments were valid. \
                 The call may or may not have run. Retrying later may help: {again}",
                self.reason
            ),
            UpstreamKind::Timeout => format!(
                "The gateway stopped waiting for `{tool}` on server `{server}`: {}. The arguments were valid. The call \
                 may still have run, or may still be running, on the server: {again}",
                self.reason
            ),
            UpstreamKind::Protocol => format!(
                "The gateway could not read the reply of server `{server}` to the call of `{tool}`: {}{said}. The \
                 arguments were valid, and the call may have run: {again}",
                self.reason
            ),
            UpstreamKind::Refused(status) => format!(
                "Server `{server}` refused the call of `{tool}` with HTTP {}{said}. The tool did not run.",
                status_words(status)
            ),
            UpstreamKind::Error(RpcError {
                unknown_tool: true, ..
            }) => format!(
                "Server `{server}` answered that it has no tool `{tool}`{said}, although it listed it before: its tools \
                 have changed. The arguments were valid and nothing was run. List the tools again (tools/list) and \
                 call one that is listed."
            ),
            UpstreamKind::Error(RpcError { code: -32602, .. }) => format!(
                "Server `{server}` refused the arguments for `{tool}` with JSON-RPC error -32602 (invalid params){quoted}, \
                 although they match the tool's published input schema: the server checks more than its schema says. \
                 The tool did not run. Retrying the same arguments will not help; change them as the server's message says."
            ),
            UpstreamKind::Error(RpcError { code, .. }) => format!(
                "The tool `{tool}` on server `{server}` failed with JSON-RPC error {code} ({}){quoted}. The arguments were \
                 valid for the tool's input schema, so the fault is on the server's side. {}",
                rpc_name(code),
                self.hints.after_failure(tool)
            ),
            UpstreamKind::ToolFailed(ToolFailure::Opaque) => format!(
                "The tool `{tool}` on server `{server}` failed without saying why: the server's SDK reported only \
                 \"Error executing tool {tool}\" (the cause is in the server's own log). The arguments were valid for \
                 the tool's input schema, so they are not the cause. {}",
                self.hints.after_failure(tool)
            ),
            UpstreamKind::ToolFailed(ToolFailure::Message) => {
                let message = match &self.snippet {
                    Some(s) => format!(": \"{s}\""),
                    None => " without a message".to_owned(),
                };
                format!(
                    "The tool `{tool}` on server `{server}` reported an error{message}. The arguments were valid for the \
                     tool's input schema; the message says what went wrong on the server's side. {}",
                    self.hints.after_failure(tool)
                )
            }
        }
    }

    /// The text of a failure of another method (an HTTP error, not a tool result).
    fn method_text(&self) -> String {
        let server = &self.server;
        match self.kind {
            UpstreamKind::Open => format!(
                "Server `{server}` is unavailable, so the gateway did not send the request: {}",
                self.reason
            ),
            UpstreamKind::Credentials { retry_helps } => format!(
                "The gateway could not obtain the credential this client reaches server `{server}` with, so the \
                 request was not sent: {}. {}",
                self.reason,
                credentials_advice(retry_helps)
            ),
            UpstreamKind::Timeout => format!(
                "The gateway stopped waiting for server `{server}`: {}. The request may still have run.",
                self.reason
            ),
            UpstreamKind::Protocol => format!(
                "The gateway could not read the reply of server `{server}`: {}. The request may have run.",
                self.reason
            ),
            UpstreamKind::Refused(status) => {
                let said = match &self.snippet {
                    Some(s) => format!(" (its reply said: \"{s}\")"),
                    None => String::new(),
                };
                format!(
                    "Server `{server}` refused the request with HTTP {}{said}. It did not run.",
                    status_words(status)
                )
            }
            _ => format!(
                "The gateway could not get an answer from server `{server}`: {}. Retrying later may help; if it keeps \
                 failing, report that the server is unavailable.",
                self.reason
            ),
        }
    }
}

impl UpstreamFailure {
    /// An upstream's HTTP refusal as the client gets it: the upstream's status,
    /// and its own JSON-RPC error (sanitized) under the request's id, or, when
    /// it sent none, the gateway's words for the refusal.
    pub(super) fn refusal_response(&self, id: Option<&Value>) -> Response {
        let UpstreamKind::Refused(status) = self.kind else {
            return error_response(
                StatusCode::BAD_GATEWAY,
                id,
                self.kind.json_rpc_code(),
                &self.text(),
                None,
            );
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        match &self.relayed {
            Some(error) => {
                let mut message = serde_json::Map::new();
                message.insert("jsonrpc".into(), "2.0".into());
                if let Some(id) = id {
                    message.insert("id".into(), id.clone());
                }
                message.insert("error".into(), (**error).clone());
                json_response(status, &Value::Object(message))
            }
            None => {
                let mut data = self.detail();
                data.insert("code".into(), self.kind.code().into());
                data.insert("upstream_status".into(), status.as_u16().into());
                error_response(
                    status,
                    id,
                    codes::UPSTREAM_REFUSED,
                    &self.text(),
                    Some(Value::Object(data)),
                )
            }
        }
    }
}

/// Whether retrying an `upstream_credentials_unavailable` call helps.
fn credentials_advice(retry_helps: bool) -> &'static str {
    if retry_helps {
        "Retrying later may help; if it keeps failing, report it to the gateway's operator."
    } else {
        "Retrying the same call will not help until that is fixed."
    }
}

/// `405 Method Not Allowed`, or the bare number when it has no reason phrase.
pub(crate) fn status_words(status: u16) -> String {
    match StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        Some(reason) => format!("{status} {reason}"),
        None => status.to_string(),
    }
}

impl ToolHints {
    /// Advice when the call may have run.
    fn if_it_ran(&self, tool: &str) -> String {
        if self.read_only {
            format!("`{tool}` is marked read-only, so retrying is safe.")
        } else if self.idempotent {
            format!("`{tool}` is marked idempotent, so retrying is safe.")
        } else {
            format!(
                "`{tool}` is not marked idempotent, so check whether the call took effect before retrying, or it may run twice."
            )
        }
    }

    /// Advice when the tool ran and reported a failure.
    fn after_failure(&self, tool: &str) -> String {
        if self.read_only || self.idempotent {
            let why = if self.read_only {
                "read-only"
            } else {
                "idempotent"
            };
            format!(
                "Retrying helps only if the cause was temporary; `{tool}` is marked {why}, so a retry is safe."
            )
        } else {
            format!(
                "Retry only if the cause was temporary: `{tool}` is not marked idempotent and may have done part of its \
                 work, so check its effect first."
            )
        }
    }
}

fn rpc_name(code: i64) -> &'static str {
    match code {
        -32700 => "parse error",
        -32600 => "invalid request",
        -32601 => "method not found",
        -32602 => "invalid params",
        -32603 => "internal error",
        -32099..=-32000 => "server error",
        _ => "an error code of the server's own",
    }
}

impl UpstreamKind {
    pub(crate) fn code(self) -> &'static str {
        match self {
            UpstreamKind::Unavailable => "upstream_unavailable",
            UpstreamKind::Timeout => "upstream_timeout",
            UpstreamKind::Protocol => "upstream_protocol_error",
            UpstreamKind::Error(_) => "upstream_error",
            UpstreamKind::ToolFailed(_) => "upstream_tool_failed",
            UpstreamKind::Refused(_) => "upstream_refused",
            UpstreamKind::Credentials { .. } => "upstream_credentials_unavailable",
            UpstreamKind::Open => "server_unavailable",
        }
    }

    pub(super) fn json_rpc_code(self) -> i64 {
        match self {
            UpstreamKind::Timeout => codes::UPSTREAM_TIMEOUT,
            UpstreamKind::Protocol => codes::UPSTREAM_PROTOCOL,
            UpstreamKind::Refused(_) => codes::UPSTREAM_REFUSED,
            UpstreamKind::Credentials { .. } => codes::UPSTREAM_CREDENTIALS,
            _ => codes::UPSTREAM_UNAVAILABLE,
        }
    }
}
