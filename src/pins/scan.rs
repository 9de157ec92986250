//! The poisoning scan: deterministic flags over every string of a tool
//! definition (and of a server's instructions) that reaches the model.
//!
//! Place in the path: runs when a definition is seen for the first time or
//! with a new hash, never on a definition already scanned; its findings are
//! stored with the pin and shown to operators.
//!
//! What is flagged, in every string value and every object key (so parameter
//! names, descriptions, titles, defaults, enum values, examples and `_meta`
//! alike):
//! - instruction-like text: `<IMPORTANT>`-style tags, "ignore previous …",
//!   "do not tell the user", "before using this tool", "always BCC …";
//! - hidden characters: Unicode tags (but not a real subdivision flag such
//!   as 🏴󠁧󠁢󠁳󠁣󠁴󠁿), bidi embeddings, overrides and isolates, zero-width
//!   characters, variation-selector runs, C0/C1 control characters;
//! - references to secret files: `~/.ssh`, `id_rsa`, `.env`, `mcp.json`, …;
//! - URLs (except where a URL is the field's very meaning: `$schema`, `$id`,
//!   `$ref`, `icons[].src`) — a notice, not a warning, since plain reference
//!   servers put documentation links and default download URLs there;
//! - names of other servers' tools (`send_email`, `gmail__send_email`);
//! - chat-template and role tokens, role labels and context terminators
//!   (`<|im_start|>system`, `</untrusted> system: …`, `[SYSTEM]`);
//! - look-alike letters of another script inside Latin words, by the UTS #39
//!   confusable skeleton (`unicode-security`): the word is flagged, and every
//!   check reads the text with the look-alikes folded to the letters they imitate;
//! - claims of prior approval or authority ("the user has already approved");
//! - instructions to call other tools ("before replying, call http_post …");
//! - instructions to send data somewhere ("send the API key to …");
//! - base64, hex and percent-encoded runs that decode to text the checks flag.
//!
//! Every kind but `url` is a warning: with `pinning = "block"` it holds the
//! tool until an operator approves it. [`output`] runs the same checks over a
//! tool's result, for a flag that never changes the result's text.
//!
//! Invariants: pure and bounded (linear-time regexes, one pass per string);
//! a finding's `detail` is for operators and may quote the text, escaped so
//! that nothing hidden stays hidden; the model only ever sees kinds and paths.

use std::sync::LazyLock;

use serde_json::Value;

mod anchors;
mod checks;
mod encoded;
mod finding;
mod hidden;
mod patterns;

#[cfg(test)]
mod tests;

pub(crate) use finding::{Finding, OtherTools, Severity};
pub(crate) use hidden::is_hidden;

// The kinds are named by the tests of the pins module.
#[cfg(test)]
pub(crate) use finding::Kind;

use checks::{Field, collect_strings, text_findings, walk};
use encoded::ENCODED;
use patterns::{ANY, ANY_ASCII, PHRASES, SECRET_FILE, URL};

/// Builds every built-in pattern now: at load, so that the first tool
/// definition scanned costs what every other one does.
pub(crate) fn prepare() {
    LazyLock::force(&ANY);
    LazyLock::force(&ANY_ASCII);
    LazyLock::force(&PHRASES);
    LazyLock::force(&SECRET_FILE);
    LazyLock::force(&URL);
    LazyLock::force(&ENCODED);
    anchors::prepare();
}

/// Scans a whole tool definition.
pub(crate) fn tool(definition: &Value, others: &OtherTools) -> Vec<Finding> {
    let mut out = Vec::new();
    walk(definition, &mut String::new(), others, &mut out);
    out.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));
    out.dedup_by(|a, b| a.kind == b.kind && a.path == b.path);
    out
}

/// Scans a server's instructions.
pub(crate) fn instructions(text: &str, others: &OtherTools) -> Vec<Finding> {
    let mut out = Vec::new();
    text_findings(text, "/instructions", Field::Text, others, &mut out);
    out
}

/// Most bytes of one tool result the output scan reads: the scan flags, it
/// never blocks, so a longer result is flagged on what its start says.
const MAX_OUTPUT_SCAN_BYTES: usize = 256 * 1024;

/// Scans the text of a tool's result (text blocks, embedded text resources,
/// every string of `structuredContent`) with the same checks as definitions;
/// only the injection kinds are kept. Reads at most
/// [`MAX_OUTPUT_SCAN_BYTES`]; never changes the result.
pub(crate) fn output(result: &Value) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut budget = MAX_OUTPUT_SCAN_BYTES;
    let mut scan = |text: &str, path: &str, out: &mut Vec<Finding>| {
        if budget == 0 {
            return;
        }
        let mut end = text.len().min(budget);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        budget -= end;
        text_findings(&text[..end], path, Field::Text, &OtherTools::default(), out);
    };
    if let Some(blocks) = result.get("content").and_then(Value::as_array) {
        for (i, block) in blocks.iter().enumerate() {
            if let Some(text) = block.get("text").and_then(Value::as_str) {
                scan(text, &format!("/content/{i}/text"), &mut out);
            }
            if let Some(text) = block.pointer("/resource/text").and_then(Value::as_str) {
                scan(text, &format!("/content/{i}/resource/text"), &mut out);
            }
        }
    }
    if let Some(structured) = result.get("structuredContent") {
        let mut strings = Vec::new();
        collect_strings(
            structured,
            &mut String::from("/structuredContent"),
            &mut strings,
        );
        for (path, text) in strings {
            scan(text, &path, &mut out);
        }
    }
    out.retain(|f| f.kind.flags_output());
    out.sort_by(|a, b| (a.kind, &a.path).cmp(&(b.kind, &b.path)));
    out.dedup_by(|a, b| a.kind == b.kind && a.path == b.path);
    out
}
