//! Which strings of which MCP message reach the model, and how each is treated.
//!
//! Place in the path: called by the proxy for every upstream message (results,
//! errors, notifications, the server's own requests) and for list items.
//!
//! What is sanitized:
//! - tool results: `content[].text`, embedded `resource.text`, the titles and
//!   descriptions of `resource_link`s, every string of `structuredContent`;
//! - `resources/read`: `contents[].text` (never `blob`);
//! - `prompts/get`: `description` and each message's content;
//! - list items: `title`, `description`, and every `title` / `description`
//!   inside `inputSchema` and `outputSchema` (names, patterns, enums and
//!   defaults are left as they are: they are what calls are made of);
//! - errors: `message` and every string of `data`;
//! - notifications and server requests: log `data`, progress `message`,
//!   sampling and elicitation text; `instructions` of `initialize` and
//!   `server/discover`.
//!
//! Invariants: binary payloads (`image`, `audio`, `blob`) are never scanned;
//! text blocks are cut at `max_output_bytes` one by one; identifiers (tool and
//! prompt names, URIs, ids) are never changed.

use serde_json::{Map, Value};

use super::{Report, Sanitizer, cut};

impl Sanitizer<'_> {
    /// A whole JSON-RPC message from the upstream, by its shape.
    pub fn message(&self, message: &mut Value, report: &mut Report) {
        let Some(obj) = message.as_object_mut() else {
            return;
        };
        if let Some(method) = obj.get("method").and_then(Value::as_str).map(str::to_owned) {
            if let Some(Value::Object(params)) = obj.get_mut("params") {
                self.params(&method, params, report);
            }
            return;
        }
        if let Some(Value::Object(error)) = obj.get_mut("error") {
            self.error(error, report);
            return;
        }
        if let Some(Value::Object(result)) = obj.get_mut("result") {
            self.result(result, report);
        }
    }

    /// A JSON-RPC error object: its message and data.
    pub(crate) fn error(&self, error: &mut Map<String, Value>, report: &mut Report) {
        if let Some(Value::String(m)) = error.get_mut("message") {
            self.string(m, report);
        }
        if let Some(data) = error.get_mut("data") {
            self.value(data, report);
        }
    }

    /// A result of any method, by its shape.
    pub(crate) fn result(&self, result: &mut Map<String, Value>, report: &mut Report) {
        if result.contains_key("content") || result.contains_key("structuredContent") {
            self.call_result(result, report);
        }
        if let Some(Value::Array(contents)) = result.get_mut("contents") {
            for item in contents {
                if let Some(Value::String(t)) = item.get_mut("text") {
                    self.cut_text(t, report);
                }
            }
        }
        if let Some(Value::Array(messages)) = result.get_mut("messages") {
            for m in messages {
                if let Some(content) = m.get_mut("content") {
                    self.content(content, report);
                }
            }
        }
        for key in ["description", "instructions"] {
            if let Some(Value::String(s)) = result.get_mut(key) {
                self.string(s, report);
            }
        }
        for key in ["tools", "prompts", "resources", "resourceTemplates"] {
            if let Some(Value::Array(items)) = result.get_mut(key) {
                for item in items {
                    self.definition(item, report);
                }
            }
        }
        if let Some(Value::Array(values)) = result
            .get_mut("completion")
            .and_then(|c| c.get_mut("values"))
        {
            for v in values {
                self.value(v, report);
            }
        }
    }

    /// A `CallToolResult`: its content blocks and `structuredContent`. A text
    /// block that is the serialized `structuredContent` (as the spec asks
    /// servers to send) is written again from the sanitized value, so the two
    /// stay consistent and escapes hidden in JSON strings do not survive.
    pub(crate) fn call_result(&self, result: &mut Map<String, Value>, report: &mut Report) {
        let mirrors = mirror_blocks(result);
        if let Some(content) = result.get_mut("content") {
            self.content(content, report);
        }
        let Some(structured) = result.get_mut("structuredContent") else {
            return;
        };
        let before = report.clone();
        self.value(structured, report);
        if mirrors.is_empty() || *report == before {
            return;
        }
        let structured = structured.clone();
        if let Some(Value::Array(blocks)) = result.get_mut("content") {
            for (i, pretty) in mirrors {
                let text = if pretty {
                    serde_json::to_string_pretty(&structured)
                } else {
                    serde_json::to_string(&structured)
                };
                if let (Some(block), Ok(text)) = (blocks.get_mut(i), text) {
                    block["text"] = Value::String(text);
                }
            }
        }
    }

    /// One content block or an array of them.
    fn content(&self, content: &mut Value, report: &mut Report) {
        match content {
            Value::Array(blocks) => {
                for block in blocks {
                    self.block(block, report);
                }
            }
            Value::Object(_) => self.block(content, report),
            _ => {}
        }
    }

    fn block(&self, block: &mut Value, report: &mut Report) {
        let Some(obj) = block.as_object_mut() else {
            return;
        };
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(Value::String(t)) = obj.get_mut("text") {
                    self.cut_text(t, report);
                }
            }
            Some("resource") => {
                if let Some(Value::String(t)) =
                    obj.get_mut("resource").and_then(|r| r.get_mut("text"))
                {
                    self.cut_text(t, report);
                }
            }
            Some("resource_link") => {
                for key in ["name", "title", "description"] {
                    if let Some(Value::String(s)) = obj.get_mut(key) {
                        self.string(s, report);
                    }
                }
            }
            // image, audio: binary, never scanned.
            _ => {}
        }
    }

    /// A text for the model: sanitized, then cut.
    fn cut_text(&self, text: &mut String, report: &mut Report) {
        self.string(text, report);
        if let Some(max) = self.max_output_bytes() {
            cut(text, max, report);
        }
    }

    /// A list item: a tool, prompt, resource or resource template.
    pub(crate) fn definition(&self, item: &mut Value, report: &mut Report) {
        let Some(obj) = item.as_object_mut() else {
            return;
        };
        for key in ["title", "description"] {
            if let Some(Value::String(s)) = obj.get_mut(key) {
                self.string(s, report);
            }
        }
        // Resources and templates: `name` is a display name (the URI identifies).
        if (obj.contains_key("uri") || obj.contains_key("uriTemplate"))
            && let Some(Value::String(s)) = obj.get_mut("name")
        {
            self.string(s, report);
        }
        if let Some(Value::String(s)) = obj.get_mut("annotations").and_then(|a| a.get_mut("title"))
        {
            self.string(s, report);
        }
        for key in ["inputSchema", "outputSchema"] {
            if let Some(schema) = obj.get_mut(key) {
                self.schema_text(schema, report);
            }
        }
        if let Some(Value::Array(args)) = obj.get_mut("arguments") {
            for arg in args.iter_mut().filter_map(Value::as_object_mut) {
                for key in ["title", "description"] {
                    if let Some(Value::String(s)) = arg.get_mut(key) {
                        self.string(s, report);
                    }
                }
            }
        }
    }

    /// Every `title` and `description` string inside a schema.
    fn schema_text(&self, schema: &mut Value, report: &mut Report) {
        match schema {
            Value::Object(map) => {
                for (k, v) in map.iter_mut() {
                    match v {
                        Value::String(s) if k == "title" || k == "description" => {
                            self.string(s, report);
                        }
                        _ => self.schema_text(v, report),
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.schema_text(item, report);
                }
            }
            _ => {}
        }
    }

    /// Params of a notification or of a request the server sends the client.
    fn params(&self, method: &str, params: &mut Map<String, Value>, report: &mut Report) {
        match method {
            "notifications/message" => {
                if let Some(data) = params.get_mut("data") {
                    self.value(data, report);
                }
            }
            "notifications/progress" => {
                if let Some(Value::String(m)) = params.get_mut("message") {
                    self.string(m, report);
                }
            }
            "sampling/createMessage" => {
                if let Some(Value::String(s)) = params.get_mut("systemPrompt") {
                    self.string(s, report);
                }
                if let Some(Value::Array(messages)) = params.get_mut("messages") {
                    for m in messages {
                        if let Some(content) = m.get_mut("content") {
                            self.content(content, report);
                        }
                    }
                }
            }
            "elicitation/create" => {
                if let Some(Value::String(m)) = params.get_mut("message") {
                    self.string(m, report);
                }
            }
            _ => {}
        }
    }
}

/// Indices of the text blocks that are `structuredContent` serialized, each
/// with whether it was laid out over several lines.
fn mirror_blocks(result: &Map<String, Value>) -> Vec<(usize, bool)> {
    let (Some(structured), Some(Value::Array(blocks))) =
        (result.get("structuredContent"), result.get("content"))
    else {
        return Vec::new();
    };
    blocks
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            let text = b.get("text")?.as_str()?;
            let parsed: Value = serde_json::from_str(text).ok()?;
            (parsed == *structured).then_some((i, text.contains('\n')))
        })
        .collect()
}
