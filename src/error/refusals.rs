//! The texts of refusals the gateway writes itself: secrets in what a client
//! sends, rate limits, and results withheld on the way back.
//!
//! Place: beneath the rendering; these build the words and the
//! `_meta["portcullis/error"]` fields a rendering puts in its body.
//! Invariants: a text names pointers and kinds of secrets, never a value;
//! a wait is rounded up, so that waiting that long is enough.

use std::time::Duration;

use serde_json::{Value, json};

use super::rejection::{
    Limited, OutputKind, OutputRefusal, RateLimited, Rejection, SecretFound, ToolRefusal,
};
use crate::policy::RateKey;
use crate::ratelimit::{ceil_millis, ceil_secs};

/// A call refused because its arguments carry secrets (`[sanitize] arguments
/// = "block"`): each finding as (JSON pointer, kind). Never a value.
pub(crate) fn secret_in_arguments(tool: &str, found: &[(String, String)]) -> Rejection {
    let mut text = format!(
        "The arguments for `{tool}` contain what looks like a credential, so the gateway did not send them and the tool was not run:"
    );
    for (pointer, kind) in found {
        let at = if pointer.is_empty() {
            "(the arguments)"
        } else {
            pointer
        };
        text.push_str(&format!("\n- {at}: {kind}"));
    }
    text.push_str(
        "\nSending secrets to a tool is refused so that they cannot leave through it. Remove the credential \
         from the arguments and call again; retrying the same arguments will be refused again. If the tool \
         really needs it, an operator can exempt the tool (`[[sanitize.exemptions]]` with `skip = [\"arguments\"]`).",
    );
    let mut detail = serde_json::Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert(
        "secrets".into(),
        Value::Array(
            found
                .iter()
                .map(|(pointer, kind)| json!({"pointer": pointer, "kind": kind}))
                .collect(),
        ),
    );
    Rejection::Tool(ToolRefusal {
        code: "argument_not_permitted",
        text,
        detail,
    })
}

/// The words and data of a [`Rejection::SecretInParams`].
pub(super) fn secret_in_params(s: &SecretFound) -> (String, Value) {
    let mut text = format!(
        "The {} message carries what looks like a credential, so the gateway did not send it upstream:",
        s.method
    );
    for (pointer, kind) in &s.found {
        let at = if pointer.is_empty() {
            "(the message)"
        } else {
            pointer
        };
        text.push_str(&format!("\n- {at}: {kind}"));
    }
    text.push_str(
        "\nSending secrets upstream is refused so that they cannot leave through a server. Remove the credential \
         and send the message again; sending it unchanged will be refused again.",
    );
    let secrets: Vec<Value> = s
        .found
        .iter()
        .map(|(pointer, kind)| json!({"pointer": pointer, "kind": kind}))
        .collect();
    let data = json!({"code": "argument_not_permitted", "method": s.method, "secrets": secrets});
    (text, data)
}

/// A `tools/call` whose params outside `arguments` (`_meta`, the name, a
/// key, …) carry secrets: the `argument_not_permitted` isError result.
pub(crate) fn secret_in_call(tool: &str, found: &[(String, String)]) -> Rejection {
    let mut text = format!(
        "The call to `{tool}` carries what looks like a credential, so the gateway did not send it and the tool was not run:"
    );
    for (pointer, kind) in found {
        text.push_str(&format!("\n- {pointer}: {kind}"));
    }
    text.push_str(
        "\nSending secrets to a tool is refused so that they cannot leave through it. Remove the credential \
         and call again; retrying the same call will be refused again.",
    );
    let mut detail = serde_json::Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert(
        "secrets".into(),
        Value::Array(
            found
                .iter()
                .map(|(pointer, kind)| json!({"pointer": pointer, "kind": kind}))
                .collect(),
        ),
    );
    Rejection::Tool(ToolRefusal {
        code: "argument_not_permitted",
        text,
        detail,
    })
}

// === impl RateLimited ===

impl RateLimited {
    /// "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s. Retry after 7.4 s."
    pub(super) fn text(&self) -> String {
        let what = match &self.subject {
            Limited::Tool(name) => format!("`{name}`"),
            Limited::Resource(uri) => format!("the resource `{uri}`"),
            Limited::Prompt(name) => format!("the prompt `{name}`"),
        };
        let wait = wait_text(self.retry_after);
        let Some(limit) = &self.limit else {
            return format!(
                "The rate limit for {what} cannot be checked right now (the gateway cannot reach its \
                 rate-limit store), so the call was not run. Retry after {wait}."
            );
        };
        let quota = limit.rate.quota_text();
        match limit.rate.key {
            RateKey::ClientTool => format!(
                "Rate limit for {what} reached for client `{}`: {quota}. Retry after {wait}.",
                self.client
            ),
            RateKey::Client => {
                let own = match &self.subject {
                    Limited::Tool(n) | Limited::Resource(n) | Limited::Prompt(n) => n,
                };
                let shared = if limit.shared_by.len() == 1 && limit.shared_by[0] == *own {
                    String::new()
                } else {
                    let names: Vec<String> =
                        limit.shared_by.iter().map(|p| format!("`{p}`")).collect();
                    format!(", counted together for {}", names.join(", "))
                };
                format!(
                    "Rate limit for {what} reached for client `{}`: {quota}{shared}. Retry after {wait}.",
                    self.client
                )
            }
            RateKey::All => format!(
                "Rate limit for {what} reached: {quota}, shared by all clients. Retry after {wait}."
            ),
        }
    }

    /// `_meta["portcullis/error"]` fields besides `code`.
    pub(super) fn detail(&self) -> serde_json::Map<String, Value> {
        let mut detail = serde_json::Map::new();
        let (kind, name) = match &self.subject {
            Limited::Tool(n) => ("tool", n),
            Limited::Resource(n) => ("resource", n),
            Limited::Prompt(n) => ("prompt", n),
        };
        detail.insert(kind.into(), name.clone().into());
        detail.insert("client".into(), self.client.clone().into());
        let limit = match &self.limit {
            Some(l) => json!({
                "rule": format!("rules[{}]", l.rule),
                "burst": l.rate.burst.get(),
                "per_second": l.rate.per_second,
                "key": match l.rate.key {
                    RateKey::Client => "client",
                    RateKey::ClientTool => "client+tool",
                    RateKey::All => "all",
                },
                "text": l.rate.describe(),
            }),
            None => {
                detail.insert("reason".into(), "backend_unavailable".into());
                Value::Null
            }
        };
        detail.insert("limit".into(), limit);
        detail.insert(
            "retry_after_ms".into(),
            ceil_millis(self.retry_after).into(),
        );
        detail
    }
}

/// A wait for a model to read, rounded up so that waiting that long is enough:
/// tenths of a second below a minute, then seconds, then minutes.
pub(super) fn wait_text(d: Duration) -> String {
    let tenths = d.as_nanos().div_ceil(100_000_000);
    if tenths < 600 {
        return if tenths.is_multiple_of(10) {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        };
    }
    let secs = ceil_secs(d);
    if secs < 3600 {
        return match secs % 60 {
            0 => format!("{} min", secs / 60),
            s => format!("{} min {s} s", secs / 60),
        };
    }
    let mins = secs.div_ceil(60);
    match mins % 60 {
        0 => format!("{} h", mins / 60),
        m => format!("{} h {m} min", mins / 60),
    }
}

// === impl OutputRefusal ===

impl OutputKind {
    pub(super) fn code(&self) -> &'static str {
        match self {
            OutputKind::Withheld(_) => "output_withheld",
            OutputKind::SchemaViolation { .. } => "output_schema_violation",
            OutputKind::TooLarge { .. } | OutputKind::OverBound { .. } => "output_too_large",
        }
    }
}

impl OutputRefusal {
    pub(super) fn detail(&self) -> serde_json::Map<String, Value> {
        let mut detail = serde_json::Map::new();
        detail.insert("server".into(), self.server.clone().into());
        match &self.tool {
            Some(tool) => detail.insert("tool".into(), tool.clone().into()),
            None => detail.insert("method".into(), self.method.clone().into()),
        };
        match &self.kind {
            OutputKind::Withheld(kinds) => {
                detail.insert("secrets".into(), json!(kinds));
            }
            OutputKind::SchemaViolation { violations, .. } => {
                detail.insert("violations".into(), json!(violations));
            }
            OutputKind::TooLarge { bytes, limit } | OutputKind::OverBound { bytes, limit } => {
                detail.insert("bytes".into(), json!(bytes));
                detail.insert("limit".into(), json!(limit));
            }
        }
        detail
    }

    pub(super) fn text(&self) -> String {
        let server = &self.server;
        let tool = match &self.tool {
            Some(tool) => format!("`{tool}`"),
            None => format!("this `{}` request", self.method),
        };
        let ran = if self.tool.is_some() {
            "The arguments were valid and the tool did run, so its effects stand."
        } else {
            "The request was valid and the server did answer it."
        };
        match &self.kind {
            OutputKind::TooLarge { bytes, limit } => format!(
                "The result of {tool} on server `{server}` was withheld: it would be a message of {bytes} bytes, \
                 and MCP clients accept at most {limit} bytes in one message (the gateway already cut its texts \
                 and could not leave out enough). {ran} Retrying will return the same; ask for less (a narrower \
                 query, fewer items, a page of the data), or ask an operator."
            ),
            OutputKind::OverBound { bytes, limit } => format!(
                "The result of {tool} on server `{server}` was withheld: its keys, short values and blocks alone \
                 come to {bytes} bytes, over the {limit} bytes this gateway lets one message carry (long texts \
                 are cut, these cannot be). {ran} Retrying will return the same; ask for less (fewer items, a \
                 page of the data), or ask an operator."
            ),
            OutputKind::Withheld(kinds) => {
                let what = if kinds.len() == 1 {
                    "a credential-like value"
                } else {
                    "credential-like values"
                };
                format!(
                    "The result of {tool} on server `{server}` was withheld: it contained {what} ({}), and this \
                     gateway withholds results that carry secrets. {ran} Retrying will return the same secret; ask \
                     for output that leaves it out (a narrower query, other fields), or ask an operator.",
                    kinds.join(", ")
                )
            }
            OutputKind::SchemaViolation {
                violations,
                sanitized,
            } => {
                let mut text = format!(
                    "The result of {tool} on server `{server}` does not match the tool's output schema{}, so it was withheld:",
                    if *sanitized {
                        " once the gateway removed unsafe content from it"
                    } else {
                        ""
                    }
                );
                for v in violations {
                    text.push_str("\n- ");
                    text.push_str(&v.line());
                }
                text.push_str(
                    "\nThe arguments were valid and the tool did run. Retrying will most likely return the same \
                     result; report the mismatch to the server's operator.",
                );
                text
            }
        }
    }
}
