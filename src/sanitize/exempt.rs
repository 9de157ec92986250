//! The strings the sanitizer leaves alone: the identifiers the MCP
//! specification defines, exempt only at the position the protocol gives them
//! in the message, each checked for its form instead.
//!
//! Place in the path: consulted by the message walk ([`super::message`]),
//! which carries the [`Pos`] of every object it enters: what that object is
//! by the protocol (the envelope, the result of the request it answers, a
//! tool of a `tools/list` result, a content block, a task, a `_meta`, …).
//! [`exempt`] says which string members of an object at a position are
//! identifiers; [`child`] says what the object or array under a member is.
//! Everything else is text and is sanitized; object keys are never exempt.
//!
//! Why position and not name: a tool's own data (its `structuredContent`, a
//! schema, a block's `input`, an error's `data`, any `_meta` but the
//! protocol's) is [`Pos::Data`], where no key is an identifier, so a tool that
//! names a field `cursor`, `requestId` or `mimeType` gets it sanitized (and,
//! with `secrets = "block"`, withheld) like any text.
//!
//! Why each identifier is exempt where it is: it is something the client
//! sends back verbatim (an id, a cursor, a `requestState`, a task id), uses to
//! address something (a URI, a tool or prompt name), or decodes (a base64
//! blob). Changing one breaks the protocol, and the secret detectors misread
//! some of them (`progressToken` is a `…token` key, so its value would be
//! taken for an assigned secret). In exchange the value must have its
//! identifier's form, which leaves no room for what the sanitizer removes: no
//! control or invisible character, no whitespace, a bounded length.
//!
//! Invariants: a value that fails its form check is either an upstream
//! protocol error ([`OnBad::Refuse`]: the identifier cannot be changed without
//! breaking the exchange, so the message is refused) or simply sanitized as
//! text ([`OnBad::Sanitize`]: a display-like value such as a resource `name`
//! with spaces; cleaning it is safe, at worst the item becomes unusable);
//! below [`Pos::Data`] nothing is exempt; lookups never allocate.

use serde_json::{Map, Value};

use super::unicode;
use crate::mcp::methods::{ListKind, Method};

/// What an exempt value must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Exactly `"2.0"`.
    JsonRpc,
    /// A JSON-RPC id, progress token, task id: 1–256 bytes of visible
    /// characters and spaces (clients choose ids and tokens too, and the spec
    /// allows any string), no control or invisible character.
    Id,
    /// A method name: 1–128 of `A-Z a-z 0-9 _ . / - $`.
    Method,
    /// An opaque token the client echoes (cursor, `requestState`): 1–64 KiB of
    /// visible ASCII.
    Opaque,
    /// A URI or URI template: 1–8 KiB, no control, whitespace or invisible
    /// character, no credential.
    Uri,
    /// A tool, prompt or argument name: 1–128 of the spec's tool-name
    /// characters (`A-Z a-z 0-9 _ . -`, plus `/` and `:` that servers use as
    /// separators), and no credential.
    Name,
    /// A MIME type: 1–255 printable ASCII characters (parameters have spaces).
    MimeType,
    /// Standard base64 (RFC 4648 §4, padded or not), possibly empty.
    Base64,
    /// A `resultType`: `complete`, `input_required`, `task`.
    ResultType,
    /// A `type` discriminator: 1–64 of `A-Z a-z 0-9 _ . / -`.
    Discriminator,
    /// A protocol version: `YYYY-MM-DD`.
    Version,
}

/// What a value that fails its form check becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBad {
    /// The message is an upstream protocol error.
    Refuse,
    /// The value is sanitized like any text.
    Sanitize,
}

/// One exempt identifier: the form its value must have, and what a value
/// without it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exempt {
    pub form: Form,
    pub on_bad: OnBad,
}

use Form::*;
use OnBad::*;

const fn ex(form: Form, on_bad: OnBad) -> Option<Exempt> {
    Some(Exempt { form, on_bad })
}

/// The request a response answers, as far as the positions of its result go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Initialize,
    ToolsList,
    PromptsList,
    ResourcesList,
    TemplatesList,
    ResourcesRead,
    PromptsGet,
    /// `tools/call`, or an operator-named method of class `tool`.
    ToolsCall,
    /// `tasks/*`: task state, and a tool result inside it.
    Tasks,
    /// Any other method, or none known: only what every result has.
    Other,
}

impl Answer {
    /// The answer to a request of `method`.
    pub fn of(method: Option<&str>) -> Answer {
        match method.and_then(Method::of) {
            Some(Method::Initialize) => Answer::Initialize,
            Some(Method::ToolsList) => Answer::ToolsList,
            Some(Method::PromptsList) => Answer::PromptsList,
            Some(Method::ResourcesList) => Answer::ResourcesList,
            Some(Method::ResourcesTemplatesList) => Answer::TemplatesList,
            Some(Method::ResourcesRead) => Answer::ResourcesRead,
            Some(Method::PromptsGet) => Answer::PromptsGet,
            Some(Method::ToolsCall) => Answer::ToolsCall,
            Some(
                Method::TasksGet
                | Method::TasksResult
                | Method::TasksList
                | Method::TasksCancel
                | Method::TasksUpdate,
            ) => Answer::Tasks,
            _ => Answer::Other,
        }
    }
}

/// A message the server sends (a request or notification), as far as the
/// positions of its params go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    Progress,
    Cancelled,
    ResourceUpdated,
    /// A task status notification, or a 2025-11-25 `tasks/*` request.
    Task,
    Sampling,
    Elicitation,
    Other,
}

impl Sent {
    fn of(method: Option<&Value>) -> Sent {
        match method.and_then(Value::as_str).and_then(Method::of) {
            Some(Method::Progress) => Sent::Progress,
            Some(Method::Cancelled) => Sent::Cancelled,
            Some(Method::ResourcesUpdated) => Sent::ResourceUpdated,
            Some(
                Method::TasksStatus
                | Method::Tasks
                | Method::TasksGet
                | Method::TasksResult
                | Method::TasksList
                | Method::TasksCancel
                | Method::TasksUpdate,
            ) => Sent::Task,
            Some(Method::SamplingCreateMessage) => Sent::Sampling,
            Some(Method::ElicitationCreate | Method::ElicitationComplete) => Sent::Elicitation,
            _ => Sent::Other,
        }
    }
}

/// What an object of a message is, by the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pos {
    /// The top-level JSON-RPC object of a response to `Answer` (or of a
    /// request or notification, whose own `method` says what its params are).
    Envelope(Answer),
    /// A result.
    Result(Answer),
    /// The params of a message the server sends.
    Params(Sent),
    /// A request inside a 2026 `inputRequests` (its `method` and `params`).
    InputRequest,
    /// The map of `inputRequests`.
    InputRequests,
    /// The protocol's `_meta` of a result or params.
    Meta,
    /// `_meta["io.modelcontextprotocol/related-task"]`.
    RelatedTask,
    Tool,
    Prompt,
    PromptArgument,
    Resource,
    Template,
    Icon,
    /// Resource contents (`resources/read`, an embedded resource).
    Contents,
    /// A prompt or sampling message (`role`, `content`).
    Message,
    /// A content block.
    Block,
    /// A task.
    Task,
    /// Data a tool or server chose: nothing under it is an identifier.
    Data,
}

impl Pos {
    /// The position of one item of a list the gateway collects.
    pub(crate) fn item(kind: ListKind) -> Pos {
        match kind {
            ListKind::Tools => Pos::Tool,
            ListKind::Prompts => Pos::Prompt,
            ListKind::Resources => Pos::Resource,
            ListKind::Templates => Pos::Template,
        }
    }
}

/// The type of a content block, as far as its identifiers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockType {
    Media,
    ResourceLink,
    ToolUse,
    ToolResult,
    Other,
}

/// What the members of one object need to know of the object itself: the
/// type of a content block, the method of a message. Read once per object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Around {
    block: BlockType,
    sent: Sent,
}

impl Around {
    /// The facts of `map`, an object at `at`.
    pub(crate) fn of(at: Pos, map: &Map<String, Value>) -> Around {
        let block = match at {
            Pos::Block => match map.get("type").and_then(Value::as_str) {
                Some("image" | "audio") => BlockType::Media,
                Some("resource_link") => BlockType::ResourceLink,
                Some("tool_use") => BlockType::ToolUse,
                Some("tool_result") => BlockType::ToolResult,
                _ => BlockType::Other,
            },
            _ => BlockType::Other,
        };
        let sent = match at {
            Pos::Envelope(_) | Pos::InputRequest => Sent::of(map.get("method")),
            _ => Sent::Other,
        };
        Around { block, sent }
    }
}

/// Whether the string under `key` of an object at `pos` (with `around` read
/// of it) is an identifier, and which.
pub(crate) fn exempt(pos: Pos, key: &str, around: Around) -> Option<Exempt> {
    match (pos, key) {
        (Pos::Envelope(_) | Pos::InputRequest, "jsonrpc") => ex(JsonRpc, Refuse),
        (Pos::Envelope(_), "id") => ex(Id, Refuse),
        (Pos::Envelope(_) | Pos::InputRequest, "method") => ex(Method, Refuse),
        (Pos::Result(a), _) => match (a, key) {
            (_, "resultType") => ex(ResultType, Refuse),
            (_, "nextCursor" | "requestState") => ex(Opaque, Refuse),
            (Answer::Initialize, "protocolVersion") => ex(Version, Refuse),
            (Answer::ToolsCall | Answer::Tasks, "taskId") => ex(Id, Refuse),
            _ => None,
        },
        (Pos::Params(s), _) => match (s, key) {
            (_, "cursor" | "requestState") => ex(Opaque, Refuse),
            (Sent::Progress, "progressToken") => ex(Id, Refuse),
            (Sent::Cancelled, "requestId") => ex(Id, Refuse),
            (Sent::ResourceUpdated, "uri") => ex(Uri, Refuse),
            (Sent::Task, "taskId") => ex(Id, Refuse),
            (Sent::Elicitation, "elicitationId") => ex(Id, Refuse),
            _ => None,
        },
        (Pos::Meta, "progressToken" | "io.modelcontextprotocol/subscriptionId") => ex(Id, Refuse),
        (Pos::RelatedTask | Pos::Task, "taskId") => ex(Id, Refuse),
        (Pos::Tool | Pos::Prompt | Pos::PromptArgument, "name") => ex(Name, Sanitize),
        (Pos::Resource, "uri") | (Pos::Template, "uriTemplate") => ex(Uri, Refuse),
        (Pos::Resource | Pos::Template, "name") => ex(Name, Sanitize),
        (Pos::Resource | Pos::Template | Pos::Icon | Pos::Contents, "mimeType") => {
            ex(MimeType, Sanitize)
        }
        (Pos::Contents, "uri") => ex(Uri, Refuse),
        (Pos::Contents, "blob") => ex(Base64, Refuse),
        (Pos::Block, "type") => ex(Discriminator, Sanitize),
        (Pos::Block, _) => match (around.block, key) {
            (BlockType::Media, "data") => ex(Base64, Refuse),
            (BlockType::Media | BlockType::ResourceLink, "mimeType") => ex(MimeType, Sanitize),
            (BlockType::ResourceLink, "uri") => ex(Uri, Refuse),
            (BlockType::ResourceLink | BlockType::ToolUse, "name") => ex(Name, Sanitize),
            (BlockType::ToolUse, "id") => ex(Id, Refuse),
            (BlockType::ToolResult, "toolUseId") => ex(Id, Refuse),
            _ => None,
        },
        _ => None,
    }
}

/// The position of the object (or of each object of the array) under `key`
/// of an object at `pos`. Arrays take the position of their items.
pub(crate) fn child(pos: Pos, key: &str, around: Around) -> Pos {
    match (pos, key) {
        (Pos::Envelope(a), "result") => Pos::Result(a),
        (Pos::Envelope(_) | Pos::InputRequest, "params") => Pos::Params(around.sent),
        (Pos::Result(_) | Pos::Params(_), "_meta") => Pos::Meta,
        (Pos::Result(_) | Pos::Task, "inputRequests") => Pos::InputRequests,
        (Pos::InputRequests, _) => Pos::InputRequest,
        (Pos::Meta, "io.modelcontextprotocol/related-task") => Pos::RelatedTask,
        (Pos::Result(a), _) => match (a, key) {
            (Answer::ToolsList, "tools") => Pos::Tool,
            (Answer::PromptsList, "prompts") => Pos::Prompt,
            (Answer::ResourcesList, "resources") => Pos::Resource,
            (Answer::TemplatesList, "resourceTemplates") => Pos::Template,
            (Answer::ResourcesRead, "contents") => Pos::Contents,
            (Answer::PromptsGet, "messages") => Pos::Message,
            (Answer::ToolsCall | Answer::Tasks, "content") => Pos::Block,
            (Answer::ToolsCall | Answer::Tasks, "task") | (Answer::Tasks, "tasks") => Pos::Task,
            (Answer::Tasks, "result") => Pos::Result(Answer::ToolsCall),
            _ => Pos::Data,
        },
        (Pos::Params(s), _) => match (s, key) {
            (Sent::Task, "result") => Pos::Result(Answer::ToolsCall),
            (Sent::Task, "task") => Pos::Task,
            (Sent::Sampling, "messages") => Pos::Message,
            (Sent::Sampling, "tools") => Pos::Tool,
            _ => Pos::Data,
        },
        (Pos::Task, "result") => Pos::Result(Answer::ToolsCall),
        (Pos::Tool | Pos::Prompt | Pos::Resource | Pos::Template | Pos::Block, "icons") => {
            Pos::Icon
        }
        (Pos::Prompt, "arguments") => Pos::PromptArgument,
        (Pos::Message, "content") => Pos::Block,
        (Pos::Block, "resource") => Pos::Contents,
        (Pos::Block, "content") if around.block == BlockType::ToolResult => Pos::Block,
        _ => Pos::Data,
    }
}

/// True when `key` names an identifier at some position of the protocol (for
/// the outgoing scan, which reads a client's message without positions).
pub(crate) fn identifier_key(key: &str) -> bool {
    matches!(
        key,
        "jsonrpc"
            | "method"
            | "progressToken"
            | "cursor"
            | "nextCursor"
            | "requestState"
            | "requestId"
            | "resultType"
            | "protocolVersion"
            | "taskId"
            | "toolUseId"
            | "elicitationId"
            | "mimeType"
            | "blob"
            | "type"
            | "io.modelcontextprotocol/subscriptionId"
    )
}

/// True when `value` has the form.
pub(crate) fn fits(form: Form, value: &str) -> bool {
    let len = value.len();
    match form {
        JsonRpc => value == "2.0",
        Id => (1..=256).contains(&len) && value.chars().all(|c| c == ' ' || uri_char(c)),
        Method => {
            (1..=128).contains(&len)
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_./-$".contains(&b))
        }
        Opaque => (1..=64 * 1024).contains(&len) && value.bytes().all(|b| b.is_ascii_graphic()),
        Uri => (1..=8 * 1024).contains(&len) && value.chars().all(uri_char),
        Name => {
            (1..=128).contains(&len)
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-/:".contains(&b))
        }
        MimeType => (1..=255).contains(&len) && value.bytes().all(|b| (0x20..0x7f).contains(&b)),
        Base64 => base64(value),
        ResultType => matches!(value, "complete" | "input_required" | "task"),
        Discriminator => {
            (1..=64).contains(&len)
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b))
        }
        Version => {
            let b = value.as_bytes();
            len == 10
                && b.iter().enumerate().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        *c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }
                })
        }
    }
}

/// True when the form must also be free of credentials (what the model reads
/// and what addresses something: names and URIs; opaque tokens are for the
/// client's code, and the detectors would misread random ones).
pub(crate) fn scanned_for_secrets(form: Form) -> bool {
    matches!(form, Uri | Name)
}

/// A character a URI may carry: visible ASCII, or a visible non-ASCII
/// character (IRIs), never a control, whitespace or invisible one.
fn uri_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_graphic();
    }
    !c.is_whitespace()
        && !('\u{80}'..='\u{9f}').contains(&c)
        && !unicode::needs_judging(c)
        && c != '\u{feff}'
}

/// Standard base64: the alphabet, at most two `=` at the end, a length that
/// padding makes a multiple of four.
fn base64(value: &str) -> bool {
    let bytes = value.as_bytes();
    let body = bytes
        .iter()
        .rposition(|b| *b != b'=')
        .map_or(0, |last| last + 1);
    let padding = bytes.len() - body;
    if padding > 2 || (padding > 0 && !bytes.len().is_multiple_of(4)) || body % 4 == 1 {
        return false;
    }
    bytes[..body]
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_accept_what_sdks_send_and_nothing_hidden() {
        assert!(fits(Base64, "iVBORw0KGgo="));
        assert!(fits(Base64, ""));
        assert!(!fits(Base64, "iVBOR\u{1b}[31m"));
        assert!(!fits(Base64, "abc=="));
        assert!(fits(Uri, "users://alice/profile"));
        assert!(fits(Uri, "file:///données/é.txt"));
        assert!(!fits(Uri, "res://a b"));
        assert!(!fits(Uri, "res://ad\u{200b}min"));
        assert!(!fits(Uri, "res://a\u{202e}b"));
        assert!(fits(Name, "get_weather"));
        assert!(!fits(Name, "get weather"));
        assert!(fits(MimeType, "text/plain; charset=utf-8"));
        assert!(fits(Version, "2026-07-28"));
        assert!(!fits(Version, "2026-07-28\u{1b}"));
        assert!(fits(Id, "abc-1"));
        assert!(fits(Id, "req 1 é"));
        assert!(!fits(Id, "req\u{1b}[2J"));
        assert!(!fits(Id, "re\u{202e}q"));
        assert!(!fits(Id, ""));
        assert!(fits(ResultType, "input_required"));
        assert!(!fits(ResultType, "later"));
    }
}
