//! The request typed once, kept so: after classification (`src/mcp`) the
//! gateway reads a client's message only through `mcp::request::Request`,
//! and names a method only through the method table.
//!
//! Every source file outside `src/mcp` (the protocol model, where a message
//! is classified and typed), `src/config` (which names methods an operator
//! adds) and `src/demo` (a hand-written MCP server, a peer of the gateway
//! rather than part of it) is read as text, its test modules left out, and
//! three things are checked:
//!
//! 1. no call of `Message::params()`, and no read of a `"params"` member
//!    except the few in [`PARAMS_ALLOWED`], each of an upstream's message or
//!    of the transport beneath the steps, with the reason;
//! 2. no method name of the table written as a string in a comparison
//!    (`==`, `!=`, `Some("…")`, a `match` arm, `starts_with`, `contains`);
//! 3. one way to tell a tool-list change: `methods::tool_list_changed`; the
//!    `ToolsListChanged` method is otherwise only written, never matched;
//! 4. no member classification moves into the typed request read by its
//!    key: the input round's (`requestState`, `inputResponses`, the approval
//!    id in `_meta`) nowhere, and none of them (`name`, `arguments`, `_meta`,
//!    …) in the decisions that judge a client's call ([`DECISIONS`]).
//!
//! The same scan keeps one context per request: the `Forward` (how a
//! request reaches its server) and the `Recipient` (whom a reply is for) are
//! made from the request's context in `src/proxy/context.rs` and nowhere
//! else, and the hand-passed `Exchange` they replaced does not come back.
//!
//! `cargo test --test suite typed_request::` runs it; a failure names the
//! file, the line and what it found.

use std::path::{Path, PathBuf};

/// Where a `"params"` member may still be read outside the protocol model,
/// with how many times, and why.
const PARAMS_ALLOWED: &[(&str, usize, &str)] = &[
    // Upstream data: the params of what a server sends (its notifications,
    // its requests), judged as data on the way back.
    (
        "src/proxy/respond/recipient.rs",
        3,
        "a server's message: its params are sanitized, and a server's question in the gateway's words is dropped",
    ),
    (
        "src/proxy/tasks.rs",
        2,
        "a server's task status notification: whose task it names, and its task state sanitized",
    ),
    (
        "src/transport/stdio/shared.rs",
        3,
        "what a stdio child writes: its log messages, and progress tokens mapped back to the client's",
    ),
    (
        "src/sanitize/message.rs",
        1,
        "the shape every message must have (params an object), of any message sanitized",
    ),
    // The transport beneath the steps: the stdio transport stands in for the
    // HTTP server a child process is not, on the bytes already judged and
    // forwarded — the client's ids and tokens swapped for its own, and the
    // version of `initialize` answered from the cached handshake.
    (
        "src/transport/stdio.rs",
        4,
        "the stdio transport: ids and progress tokens of the forwarded bytes swapped for the child's",
    ),
    // The gateway's own request: the next page's cursor written into it.
    (
        "src/proxy/forward.rs",
        1,
        "the gateway's own list request: the next page's cursor written in",
    ),
];

/// Members of a tool call's input round, which the typed request holds
/// (`mcp::request::Round`): read by key nowhere outside the protocol model.
const ROUND_KEYS: &[&str] = &["\"requestState\"", "\"inputResponses\"", "META_APPROVAL_ID"];

/// Every params member classification moves into the typed request (or
/// reads through its accessors, as `_meta`).
const PARAM_KEYS: &[&str] = &[
    "\"name\"",
    "\"arguments\"",
    "\"uri\"",
    "\"ref\"",
    "\"notifications\"",
    "\"resourceSubscriptions\"",
    "\"taskId\"",
    "\"cursor\"",
    "\"requestId\"",
    "\"protocolVersion\"",
    "\"capabilities\"",
    "\"requestState\"",
    "\"inputResponses\"",
    "\"_meta\"",
    "META_APPROVAL_ID",
];

/// The decisions that judge a client's call from its typed request, where
/// no params member is read by key at all (what they read of a server's
/// message or of their own state uses other keys).
const DECISIONS: &[&str] = &["src/approval", "src/policy", "src/flow"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/` but the protocol model, config and demo,
/// as (path relative to the repository, text without its test modules).
fn sources() -> Vec<(String, String)> {
    let src = root().join("src");
    let mut out = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            let rel = path
                .strip_prefix(root())
                .expect("under the repository")
                .to_string_lossy()
                .replace('\\', "/");
            if path.is_dir() {
                let skipped = ["src/mcp", "src/config", "src/demo"];
                if !skipped.contains(&rel.as_str()) {
                    stack.push(path);
                }
                continue;
            }
            let skipped_file = ["src/mcp.rs", "src/config.rs", "src/demo.rs"];
            let is_test = path.file_stem().is_some_and(|s| s == "tests");
            if path.extension().is_some_and(|e| e == "rs")
                && !is_test
                && !skipped_file.contains(&rel.as_str())
            {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.push((rel, without_test_modules(&text)));
            }
        }
    }
    out.sort();
    out
}

/// `text` without its `#[cfg(test)] mod NAME { … }` blocks (braces counted
/// outside strings, chars and comments, well enough for this code base).
fn without_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        if !trimmed.starts_with("mod ") || !trimmed.split(';').next().unwrap_or("").contains('{') {
            // An item other than an inline test module: kept.
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let open = after.find('{').expect("a module body");
        let mut depth = 0usize;
        let mut end = after.len();
        let mut in_string = false;
        let mut escaped = false;
        for (i, c) in after[open..].char_indices() {
            match (in_string, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (true, false, '"') => in_string = false,
                (true, ..) => {}
                (false, _, '"') => in_string = true,
                (false, _, '{') => depth += 1,
                (false, _, '}') => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Lines of `text` that are code (not `//` comments), with their numbers.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

/// The method names of the table, read from `src/mcp/methods.rs`.
fn method_names() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("src/mcp/methods.rs")).expect("methods.rs");
    let table = text.split("methods! {").nth(1).expect("the methods! table");
    let table = &table[..table.find('}').expect("its end")];
    let names: Vec<String> = table
        .lines()
        .filter_map(|l| l.split_once("= \"").map(|(_, n)| n))
        .filter_map(|n| n.split_once('"').map(|(n, _)| n.to_owned()))
        .collect();
    assert!(names.len() > 30, "the method table was not read: {names:?}");
    names
}

#[test]
fn no_client_param_is_read_by_key_after_classification() {
    let mut found = Vec::new();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (path, text) in sources() {
        let mut reads = 0usize;
        for (n, line) in code_lines(&text) {
            if line.contains(".params()") {
                found.push(format!(
                    "{path}:{n}: Message::params() after classification: read the typed request instead\n    {}",
                    line.trim()
                ));
            }
            reads += params_reads(line);
        }
        if reads > 0 {
            counts.push((path, reads));
        }
    }
    for (path, reads) in &counts {
        match PARAMS_ALLOWED.iter().find(|(p, ..)| p == path) {
            Some((_, allowed, _)) if reads <= allowed => {}
            Some((_, allowed, why)) => found.push(format!(
                "{path}: {reads} reads of a \"params\" member, {allowed} allowed ({why}): \
                 a client's params are read through mcp::request::Request"
            )),
            None => found.push(format!(
                "{path}: {reads} reads of a \"params\" member: a client's params are read \
                 through mcp::request::Request (an upstream's message may be allowed in PARAMS_ALLOWED, with why)"
            )),
        }
    }
    // An allowance no longer used is taken back, so the list stays exact.
    for (path, allowed, _) in PARAMS_ALLOWED {
        let used = counts
            .iter()
            .find(|(p, _)| p == path)
            .map_or(0, |(_, n)| *n);
        if used < *allowed {
            found.push(format!(
                "{path}: allowed {allowed} reads of \"params\", {used} left: lower PARAMS_ALLOWED"
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The `keys` (each written as in the source: quoted, or a constant's name)
/// that `line` reads a member by.
fn key_reads<'k>(line: &str, keys: &[&'k str]) -> Vec<&'k str> {
    keys.iter()
        .filter(|key| {
            [
                "get(",
                "get_mut(",
                "remove(",
                "contains_key(",
                "entry(",
                "[",
            ]
            .iter()
            .any(|call| {
                let close = if *call == "[" { "]" } else { ")" };
                line.contains(&format!("{call}{key}{close}"))
            })
        })
        .copied()
        .collect()
}

#[test]
fn no_round_or_call_member_is_read_by_its_key() {
    let mut found = Vec::new();
    for (path, text) in sources() {
        let decision = DECISIONS
            .iter()
            .any(|d| path.starts_with(&format!("{d}/")) || path == format!("{d}.rs"));
        let keys = if decision { PARAM_KEYS } else { ROUND_KEYS };
        for (n, line) in code_lines(&text) {
            for key in key_reads(line, keys) {
                found.push(format!(
                    "{path}:{n}: a client's params member {key} read by key after classification: \
                     read the typed request (mcp::request::Request, its Round) instead\n    {}",
                    line.trim()
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Reads of a `"params"` member on `line`.
fn params_reads(line: &str) -> usize {
    ["get(\"params\")", "get_mut(\"params\")", "[\"params\"]"]
        .iter()
        .map(|p| line.matches(p).count())
        .sum()
}

/// What `line` of `path` (line `n`) compares of the method `names` as strings.
fn method_comparisons(path: &str, n: usize, line: &str, names: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for name in names {
        let quoted = format!("\"{name}\"");
        if !line.contains(&quoted) {
            continue;
        }
        let compared = [
            format!("== {quoted}"),
            format!("!= {quoted}"),
            format!("Some({quoted})"),
            format!("{quoted} =>"),
            format!("{quoted} |"),
            format!("| {quoted}"),
            format!("contains({quoted}"),
        ]
        .iter()
        .any(|p| line.contains(p.as_str()));
        if compared {
            found.push(format!(
                "{path}:{n}: the method {name} compared as a string: use mcp::methods::Method\n    {}",
                line.trim()
            ));
        }
    }
    // A prefix of method names (`tasks/`, `notifications/`) tested on a name.
    for call in ["starts_with(\"", "strip_prefix(\"", "contains(\""] {
        for (at, _) in line.match_indices(call) {
            let arg = &line[at + call.len()..];
            let arg = arg.split('"').next().unwrap_or_default();
            if arg.contains('/') && names.iter().any(|m| m.starts_with(arg)) {
                found.push(format!(
                    "{path}:{n}: method names told by the prefix {arg:?}: use mcp::methods::Method\n    {}",
                    line.trim()
                ));
            }
        }
    }
    found
}

#[test]
fn no_method_name_is_compared_as_a_string() {
    let names = method_names();
    let mut found = Vec::new();
    for (path, text) in sources() {
        for (n, line) in code_lines(&text) {
            found.extend(method_comparisons(&path, n, line, &names));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_tool_list_change_is_told_one_way() {
    let mut found = Vec::new();
    let mut told = 0usize;
    for (path, text) in sources() {
        for (n, line) in code_lines(&text) {
            told += line.matches("tool_list_changed(").count();
            if line.contains("\"notifications/tools/list_changed\"") {
                found.push(format!(
                    "{path}:{n}: the tool-list change named as a string: use methods::tool_list_changed\n    {}",
                    line.trim()
                ));
            }
            // Written (a notice of the gateway's own), never matched on.
            if line.contains("ToolsListChanged") && !line.contains("ToolsListChanged.name()") {
                found.push(format!(
                    "{path}:{n}: ToolsListChanged matched outside methods::tool_list_changed\n    {}",
                    line.trim()
                ));
            }
        }
    }
    assert!(
        told >= 4,
        "every path a server's message comes by (JSON reply, SSE, merged listen, stdio) tells a change with methods::tool_list_changed; found {told}"
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The checks see what they are meant to: each kind of comparison and read
/// they refuse, and not a message the gateway writes.
#[test]
fn the_checks_see_a_comparison_and_a_read() {
    let names = method_names();
    for bad in [
        r#"if method == "tools/call" {"#,
        r#"if to.method != "notifications/cancelled""#,
        r#"message.get("method").and_then(Value::as_str) == Some("elicitation/create")"#,
        r#"    "tools/list" => Answer::ToolsList,"#,
        r#"    "initialize" | "ping" => true,"#,
        r#"        | "prompts/list""#,
        r#"m if m.starts_with("tasks/") => Answer::Tasks,"#,
        r#"e.data.contains("notifications/subscriptions/acknowledged")"#,
    ] {
        assert!(
            !method_comparisons("x.rs", 1, bad, &names).is_empty(),
            "not seen: {bad}"
        );
    }
    for fine in [
        r#"let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled"});"#,
        r#"Err(no_server_answered("initialize"))"#,
        r#"if name.starts_with("io.modelcontextprotocol/") {"#,
    ] {
        assert!(
            method_comparisons("x.rs", 1, fine, &names).is_empty(),
            "seen: {fine}"
        );
    }
    assert_eq!(
        params_reads(r#"let p = message.get("params").and_then(|p| p.get("name"));"#),
        1
    );
    assert_eq!(params_reads(r#"request["params"]["uri"] = uri.into();"#), 1);
    assert_eq!(params_reads(r#"let params = json!({"params": {}});"#), 0);
    for bad in [
        r#"let presented = call.params.get("requestState").and_then(Value::as_str);"#,
        r#"if let Some(Value::Object(r)) = params.get_mut("inputResponses") {"#,
        r#"params.remove("requestState");"#,
        r#"let id = meta.get(META_APPROVAL_ID);"#,
        r#"assert_eq!(p["inputResponses"], json!({}));"#,
    ] {
        assert!(!key_reads(bad, ROUND_KEYS).is_empty(), "not seen: {bad}");
    }
    for bad in [
        r#"if let Some(id) = call.params.get("_meta").and_then(|m| m.get(META_APPROVAL_ID)) {"#,
        r#"let tool = params.get("name").and_then(Value::as_str);"#,
        r#"let uri = request["uri"].as_str();"#,
    ] {
        assert!(!key_reads(bad, PARAM_KEYS).is_empty(), "not seen: {bad}");
    }
    for fine in [
        r#"json!({"resultType": "input_required", "requestState": state})"#,
        r#"round.insert("requestState".into(), s);"#,
        r#"let accepted = result.get("action").and_then(Value::as_str);"#,
        r#"let answer = call.round.responses().and_then(|r| r.get(INPUT_KEY));"#,
    ] {
        assert!(key_reads(fine, PARAM_KEYS).is_empty(), "seen: {fine}");
    }
}

/// Where the objects a step needs are made from the request's context.
const CONTEXT_FILE: &str = "src/proxy/context.rs";

/// What a source line does against the one per-request context: makes a
/// `Forward` or a `Recipient` by hand outside [`CONTEXT_FILE`], or names an
/// `Exchange` in the request path.
fn context_breaches(path: &str, n: usize, line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for made in ["Forward", "Recipient"] {
        let literal = format!("{made} {{");
        let declared = [
            format!("struct {made} {{"),
            format!("impl {made} {{"),
            format!("-> {made} {{"),
        ];
        if path != CONTEXT_FILE
            && line.contains(&literal)
            && !declared.iter().any(|d| line.contains(d.as_str()))
        {
            found.push(format!(
                "{path}:{n}: a {made} made by hand: derive it from the request's Context ({CONTEXT_FILE})\n    {}",
                line.trim()
            ));
        }
    }
    let words = line.split(|c: char| !(c.is_alphanumeric() || c == '_'));
    if path.starts_with("src/proxy") && words.into_iter().any(|w| w == "Exchange") {
        found.push(format!(
            "{path}:{n}: an Exchange in the request path: steps take the request's Context\n    {}",
            line.trim()
        ));
    }
    found
}

#[test]
fn forward_and_recipient_are_made_from_the_context_only() {
    let mut found = Vec::new();
    let mut made = 0usize;
    for (path, text) in sources() {
        for (n, line) in code_lines(&text) {
            found.extend(context_breaches(&path, n, line));
            if path == CONTEXT_FILE {
                let line = line.trim_start();
                made +=
                    usize::from(line.starts_with("Forward {") || line.starts_with("Recipient {"));
            }
        }
    }
    assert!(
        !root().join("src/proxy/exchange.rs").exists(),
        "src/proxy/exchange.rs is back"
    );
    assert_eq!(
        made, 2,
        "{CONTEXT_FILE} makes one Forward and one Recipient"
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The context check sees a hand-made object and an `Exchange`, and not
/// their declarations.
#[test]
fn the_context_check_sees_a_hand_made_object() {
    for bad in [
        "        let forward = Forward {",
        "    Recipient {",
        "    ex: &mut Exchange,",
        "use super::exchange::{Exchange, enter};",
    ] {
        assert!(
            !context_breaches("src/proxy/dispatch.rs", 1, bad).is_empty(),
            "not seen: {bad}"
        );
    }
    for fine in [
        "pub(super) struct Forward {",
        "impl Recipient {",
        "    let forward = ctx.forward_to(client, server, session, listen);",
        "    pub(super) fn forward(&self, ctx: &Context, client: &ClientId) -> Forward {",
        "            ServerIdentity::Exchange(g) => {",
    ] {
        let path = match fine.contains("ServerIdentity") {
            true => "src/identity.rs",
            false => "src/proxy/forward.rs",
        };
        assert!(context_breaches(path, 1, fine).is_empty(), "seen: {fine}");
    }
}

/// The scan itself: a test module is left out, the code before and after it kept.
#[test]
fn test_modules_are_left_out_of_the_scan() {
    let text =
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn b() { let s = \"}\"; }\n}\nfn c() {}\n";
    let kept = without_test_modules(text);
    assert!(kept.contains("fn a()") && kept.contains("fn c()"), "{kept}");
    assert!(!kept.contains("fn b()"), "{kept}");
    let declared = "fn a() {}\n#[cfg(test)]\nmod tests;\nfn c() {}\n";
    assert!(without_test_modules(declared).contains("fn c()"));
    assert!(Path::new(&root()).join("src/mcp/request.rs").exists());
}
