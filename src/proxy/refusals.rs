//! The texts of the pipeline's refusals (unknown tool, invalid or not
//! permitted arguments, quarantined tools) built into [`Rejection`]s.
//!
//! Place: beside `error`, which renders every refusal; this module only
//! words them. Invariant: a text quotes client or upstream strings only
//! bounded and sanitized.

use serde_json::{Map, Value, json};

use crate::proxy::catalog::ToolSet;

use crate::auth::ClientId;
use crate::config::Config;
use crate::error::{Rejection, ToolRefusal};
use crate::pins::{self, Cause, Hold, Key as PinKey, scan};
use crate::policy::{ExpressionFailed, ListFacts, Subject, closest};
use crate::validate::Violation;

/// Most names listed in an `unknown_tool` answer.
pub(super) const MAX_LISTED: usize = 50;

pub(super) fn unknown_tool(
    config: &Config,
    client: &ClientId,
    server: &str,
    tools: &ToolSet,
    name: &str,
    prefix: &str,
    claims: Option<&Map<String, Value>>,
) -> Rejection {
    // The tools its list shows it, decided as the list decides them.
    let permitted: Vec<String> = tools
        .names()
        .filter(|t| {
            let facts = ListFacts {
                claims,
                annotations: tools
                    .tools
                    .get(*t)
                    .and_then(|e| e.definition.get("annotations")),
            };
            config
                .policy
                .decide_listed(client, server, Subject::Tool(t), &facts)
                .allowed
        })
        .map(|t| format!("{prefix}{t}"))
        .collect();
    let place = format!("on server `{server}`");
    refuse_unknown_tool(&format!("{prefix}{name}"), &place, &permitted)
}

/// The `unknown_tool` answer: the closest permitted names, and the list of them.
pub(super) fn refuse_unknown_tool(name: &str, place: &str, permitted: &[String]) -> Rejection {
    let permitted: Vec<&str> = permitted.iter().map(String::as_str).collect();
    let suggestions = closest(name, &permitted, 3);
    let mut text = format!("The tool `{name}` is not available {place}, so nothing was run.");
    if !suggestions.is_empty() {
        text.push_str(&format!(" Did you mean {}?", quote_list(&suggestions)));
    }
    if permitted.is_empty() {
        text.push_str(&format!(" No tools are available to you {place}."));
    } else {
        let shown: Vec<&str> = permitted.iter().take(MAX_LISTED).copied().collect();
        let more = permitted.len().saturating_sub(MAX_LISTED);
        text.push_str(&format!(" Tools you can call: {}", quote_list(&shown)));
        if more > 0 {
            text.push_str(&format!(" and {more} more (see tools/list)"));
        }
        text.push_str(". Call one of them by its exact name.");
    }
    let mut detail = Map::new();
    detail.insert("tool".into(), name.into());
    detail.insert("suggestions".into(), json!(suggestions));
    detail.insert(
        "permitted".into(),
        json!(permitted.iter().take(MAX_LISTED).collect::<Vec<_>>()),
    );
    Rejection::Tool(ToolRefusal {
        code: "unknown_tool",
        text,
        detail,
    })
}

pub(super) fn invalid_arguments(tool: &str, violations: &[Violation]) -> Rejection {
    let mut text = format!(
        "The arguments for `{tool}` do not match its input schema, so the tool was not run. Fix {} and call it again:",
        if violations.len() == 1 {
            "this"
        } else {
            "these"
        }
    );
    for v in violations {
        text.push_str("\n- ");
        text.push_str(&v.line());
    }
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("violations".into(), json!(violations));
    Rejection::Tool(ToolRefusal {
        code: "invalid_arguments",
        text,
        detail,
    })
}

pub(super) fn argument_not_permitted(
    tool: &str,
    rule: usize,
    violations: &[Violation],
) -> Rejection {
    let mut text = format!(
        "The arguments for `{tool}` are outside what this gateway's policy permits (rules[{rule}]), so the tool was not run:"
    );
    for v in violations {
        text.push_str("\n- ");
        text.push_str(&v.line());
    }
    text.push_str("\nA call within these limits may be allowed; do not retry the same arguments.");
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("rule".into(), format!("rules[{rule}]").into());
    detail.insert("violations".into(), json!(violations));
    Rejection::Tool(ToolRefusal {
        code: "argument_not_permitted",
        text,
        detail,
    })
}

/// Most characters of a CEL error quoted back (it may echo a value).
const MAX_REASON: usize = 300;

/// A rule's `when` failed at run time: the call is denied (fail closed).
pub(super) fn rule_expression_failed(tool: &str, failed: &ExpressionFailed) -> Rejection {
    let reason: String = failed.reason.chars().take(MAX_REASON).collect();
    let text = format!(
        "The call to `{tool}` was denied because the condition of rules[{}] (`when = {:?}`) could not be evaluated: {reason}. \
         A condition that fails denies the call; the gateway's operator can correct the rule, or a call whose arguments \
         have the fields it reads may be allowed.",
        failed.rule, failed.expression
    );
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("rule".into(), format!("rules[{}]", failed.rule).into());
    detail.insert("expression".into(), failed.expression.clone().into());
    detail.insert("error".into(), reason.into());
    Rejection::Tool(ToolRefusal {
        code: "rule_expression_failed",
        text,
        detail,
    })
}

/// Why the rules refused a listed use once its facts were known: the deny
/// rule whose condition is true, or every allow rule whose condition is false.
fn refused_because(config: &Config, rule: Option<usize>, falsified: &[usize]) -> String {
    let quote = |i: usize| format!("rules[{i}] (`when = {:?}`)", condition_of(config, i));
    match rule {
        Some(i) => format!("{} denies it", quote(i)),
        None => {
            let list: Vec<String> = falsified.iter().map(|i| quote(*i)).collect();
            format!("the condition of {} is false for it", list.join(", "))
        }
    }
}

/// The refusal's `data`: the deciding rule, and the rules whose conditions were false.
fn name_rules(detail: &mut Map<String, Value>, rule: Option<usize>, falsified: &[usize]) {
    if let Some(i) = rule {
        detail.insert("rule".into(), format!("rules[{i}]").into());
    }
    let named: Vec<String> = falsified.iter().map(|i| format!("rules[{i}]")).collect();
    detail.insert("false_conditions".into(), named.into());
}

/// A listed tool whose call the rules refuse once its call-time facts are
/// known: a deny rule's `when` is true, or every allow rule's `when` is false.
pub(super) fn call_not_permitted(
    config: &Config,
    tool: &str,
    rule: Option<usize>,
    falsified: &[usize],
) -> Rejection {
    let why = refused_because(config, rule, falsified);
    let text = format!(
        "This call to `{tool}` is outside what this gateway's policy permits: {why}, so the tool was not run. \
         A call that meets the condition may be allowed; do not retry the same call."
    );
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    name_rules(&mut detail, rule, falsified);
    Rejection::Tool(ToolRefusal {
        code: "call_not_permitted",
        text,
        detail,
    })
}

/// What a refused use of a resource or prompt names: its words in a text
/// (`the read of resource `…``), its key and value in `data`.
fn use_of(subject: Subject<'_>, method: &str) -> (String, &'static str, String) {
    let name = crate::util::text::clip(subject.name());
    let method = crate::util::text::clip(method);
    match subject {
        Subject::Resource(_) => (
            format!("This {method} of the resource `{name}`"),
            "resource",
            name,
        ),
        Subject::Prompt(_) => (
            format!("This {method} of the prompt `{name}`"),
            "prompt",
            name,
        ),
        Subject::Tool(_) => (format!("This {method} of `{name}`"), "tool", name),
    }
}

/// A listed resource or prompt whose use the rules refuse once the use's
/// facts are known (its session's labels, a prompt's arguments, its
/// method): `call_not_permitted`, as a listed tool's call gets it.
pub(super) fn use_not_permitted(
    config: &Config,
    subject: Subject<'_>,
    method: &str,
    rule: Option<usize>,
    falsified: &[usize],
) -> Rejection {
    let why = refused_because(config, rule, falsified);
    let (what, key, name) = use_of(subject, method);
    let text = format!(
        "{what} is outside what this gateway's policy permits: {why}, so nothing was sent to the server. \
         A use that meets the condition may be allowed; do not retry the same request."
    );
    let mut detail = Map::new();
    detail.insert(key.into(), name.into());
    detail.insert("method".into(), crate::util::text::clip(method).into());
    name_rules(&mut detail, rule, falsified);
    Rejection::Use(ToolRefusal {
        code: "call_not_permitted",
        text,
        detail,
    })
}

/// A resource or prompt use whose rule's condition failed at run time: it
/// is denied (fail closed), naming the rule, its condition and CEL's reason.
pub(super) fn use_expression_failed(
    subject: Subject<'_>,
    method: &str,
    failed: &ExpressionFailed,
) -> Rejection {
    let reason: String = failed.reason.chars().take(MAX_REASON).collect();
    let (what, key, name) = use_of(subject, method);
    let text = format!(
        "{what} was denied because the condition of rules[{}] (`when = {:?}`) could not be evaluated: {reason}. \
         A condition that fails denies the use, and nothing was sent to the server; the gateway's operator can \
         correct the rule, or a request that has the fields it reads may be allowed.",
        failed.rule, failed.expression
    );
    let mut detail = Map::new();
    detail.insert(key.into(), name.into());
    detail.insert("method".into(), crate::util::text::clip(method).into());
    detail.insert("rule".into(), format!("rules[{}]", failed.rule).into());
    detail.insert("expression".into(), failed.expression.clone().into());
    detail.insert("error".into(), reason.into());
    Rejection::Use(ToolRefusal {
        code: "rule_expression_failed",
        text,
        detail,
    })
}

/// The condition of rule `index` as written (empty when it has none).
fn condition_of(config: &Config, index: usize) -> String {
    (config.policy.rules.iter())
        .find(|r| r.index == index)
        .and_then(|r| r.when.as_ref())
        .map(|w| w.source().to_owned())
        .unwrap_or_default()
}

pub(super) fn quarantined(tool: &str, reason: &crate::validate::SchemaError) -> Rejection {
    let text = format!(
        "The tool `{tool}` cannot be called through this gateway: its input schema cannot be enforced ({reason}). \
         Nothing was run. An operator must fix the tool's schema on the server; retrying will not help."
    );
    let mut detail = Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("reason".into(), reason.to_string().into());
    Rejection::Tool(ToolRefusal {
        code: "tool_quarantined",
        text,
        detail,
    })
}

/// A tool whose definition is held by its pin (`pinning = "block"`).
pub(super) fn pin_quarantined(hold: &Hold) -> Rejection {
    let (server, tool) = (&hold.server, &hold.tool);
    let pinned_at = hold
        .pinned_at
        .map(|ms| format!(" on {}", crate::util::time::iso8601(ms)))
        .unwrap_or_default();
    let mut text = format!(
        "The tool `{tool}` on server `{server}` is quarantined by the gateway, so nothing was run. "
    );
    let key = match hold.cause {
        Cause::Changed => {
            let fields = pins::changed_fields(&hold.changes);
            text.push_str(&format!(
                "Its definition changed since it was approved{pinned_at}; clients are still shown the approved definition. \
                 Changed: {}.",
                fields.join(", ")
            ));
            PinKey::tool(server, tool)
        }
        Cause::New => {
            text.push_str(
                "It is new, and its definition was not trusted on first use because the gateway's scan flagged it; \
                 it is not listed until an operator approves it.",
            );
            PinKey::tool(server, tool)
        }
        Cause::Instructions => {
            text.push_str(&format!(
                "The server's instructions changed since they were approved{pinned_at}, so every tool of this server \
                 is held until an operator approves the new instructions."
            ));
            PinKey::instructions(server)
        }
    };
    for change in &hold.changes {
        text.push_str("\n- ");
        text.push_str(&change_line(change, &hold.findings));
    }
    if hold.total_changes > hold.changes.len() {
        text.push_str(&format!(
            "\n- … and {} more",
            hold.total_changes - hold.changes.len()
        ));
    }
    if !hold.findings.is_empty() {
        let found: Vec<String> = hold.findings.iter().map(finding_phrase).collect();
        text.push_str(&format!("\nScan findings: {}.", found.join("; ")));
    }
    let command = pins::approve_command(&hold.config, &key);
    let body = pins::approve_body(&key, Some(&hold.seen_hash));
    text.push_str(&format!(
        "\nRetrying will not help until an operator reviews the definition and approves it, with\n  {command}\n\
         or POST /api/pins/approve on the gateway's admin listener with the admin token (Authorization: Bearer …) and the body {body}. \
         Until then, use other tools or tell the user that `{tool}` awaits approval."
    ));
    let mut detail = Map::new();
    detail.insert("server".into(), server.as_str().into());
    detail.insert("tool".into(), tool.as_str().into());
    let reason = match hold.cause {
        Cause::Changed => "definition_changed",
        Cause::New => "unapproved_definition",
        Cause::Instructions => "instructions_changed",
    };
    detail.insert("reason".into(), reason.into());
    detail.insert("changed".into(), json!(pins::changed_fields(&hold.changes)));
    let findings: Vec<Value> = hold
        .findings
        .iter()
        .map(|f| json!({"kind": f.kind.as_str(), "severity": f.severity, "path": f.path}))
        .collect();
    detail.insert("findings".into(), Value::Array(findings));
    detail.insert(
        "approve".into(),
        json!({"cli": command, "api": {"method": "POST", "path": "/api/pins/approve", "body": body}}),
    );
    Rejection::Tool(ToolRefusal {
        code: "tool_quarantined",
        text,
        detail,
    })
}

/// One change for the model: pointer, approved value → live value, where a
/// value (or a key) the scan flagged is withheld rather than repeated.
pub(super) fn change_line(change: &pins::Change, findings: &[scan::Finding]) -> String {
    let warnings = findings
        .iter()
        .filter(|f| f.severity == scan::Severity::Warning);
    let mut withheld_value: Vec<&'static str> = Vec::new();
    for f in warnings {
        let (path, key) = match f.path.strip_suffix(" (key)") {
            Some(p) => (p, true),
            None => (f.path.as_str(), false),
        };
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        if key && under(&change.pointer, path) {
            return format!("(a change under a key withheld: {})", f.kind.describe());
        }
        if under(path, &change.pointer) || under(&change.pointer, path) {
            withheld_value.push(f.kind.describe());
        }
    }
    let before = change
        .before
        .as_ref()
        .map(pins::short)
        .unwrap_or_else(|| "(absent)".into());
    let after = match &change.after {
        _ if !withheld_value.is_empty() => {
            withheld_value.dedup();
            format!("(withheld: {})", withheld_value.join(", "))
        }
        Some(v) => pins::short(v),
        None => "(removed)".into(),
    };
    let pointer = if change.pointer.is_empty() {
        "/"
    } else {
        &change.pointer
    };
    format!("{pointer}: {before} → {after}")
}

pub(super) fn finding_phrase(f: &scan::Finding) -> String {
    let place = match f.path.strip_suffix(" (key)") {
        Some(p) => format!("in a key under {}", parent(p)),
        None => format!("in {}", f.path),
    };
    let notice = if f.severity == scan::Severity::Notice {
        " (notice)"
    } else {
        ""
    };
    format!("{} {place}{notice}", f.kind.describe())
}

pub(super) fn parent(pointer: &str) -> &str {
    match pointer.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &pointer[..i],
    }
}

pub(super) fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
