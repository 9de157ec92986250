//! `portcullis check --explain REQUEST.json`: what one call gets, and why.
//!
//! Place: the top layer beside the binary; it reads a compiled configuration
//! and asks the policy through [`Policy::resolve`], the resolution the
//! runtime's call check uses, so the answer is what the gateway would do
//! with the call (before the tool's own `inputSchema`, its pin and the
//! secrets in its arguments, which need the live server). The rules' `when`
//! conditions are evaluated with the request's optional `claims`, optional
//! `labels` (what the caller's session would hold) and optional `method`
//! (by default the use's own: `tools/call`, `resources/read`,
//! `prompts/get`); a tool call's with its `arguments` and optional
//! `annotations` (the tool's, as the live server would have them pinned;
//! absent, an empty map), a prompt's with its `arguments` (the `prompts/get`
//! arguments), a resource's with its canonical `uri` and `query`; a
//! completion's without arguments or query (left to the get or the read, as
//! the gateway leaves them); each outcome is printed.
//!
//! Invariant: the request names a client, a server and one of `tool`,
//! `resource` or `prompt`; anything else is refused with the reason, never
//! guessed.
//!
//! [`Policy::resolve`]: crate::policy::Policy::resolve

use serde_json::{Value, json};

use crate::auth::ClientId;
use crate::config::Config;
use crate::flow::Label;
use crate::mcp::methods::{Class, Method};
use crate::policy::{Effective, Facts, Subject, uri};

/// A request to explain, as written in `REQUEST.json`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    client: String,
    server: String,
    tool: Option<String>,
    resource: Option<String>,
    prompt: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
    /// The JWT claims the client would present (for rules' `when` over `claims`).
    #[serde(default)]
    claims: Option<serde_json::Map<String, Value>>,
    /// The tool's annotations (for rules' `when` over `annotations`).
    #[serde(default)]
    annotations: Option<Value>,
    /// The flow labels the caller's session would hold (for rules' `when`
    /// over `labels`): `private`, `untrusted`.
    #[serde(default)]
    labels: Vec<String>,
    /// The method the use is made with (for rules' `when` over `method`);
    /// by default the use's own (`tools/call`, `resources/read`, `prompts/get`).
    #[serde(default)]
    method: Option<String>,
}

/// The explanation of `request` (the text of `REQUEST.json`) under `config`:
/// text for a person, or JSON for a program.
pub fn explain(config: &Config, request: &str, as_json: bool) -> Result<String, String> {
    let request: Request =
        serde_json::from_str(request).map_err(|e| format!("the request is not valid: {e}"))?;
    let client = find_client(config, &request.client)?;
    if !config.servers.contains_key(&request.server) {
        let known: Vec<&str> = config.servers.keys().map(String::as_str).collect();
        return Err(format!(
            "no server named `{}` in the configuration (servers: {})",
            request.server,
            known.join(", ")
        ));
    }
    let canonical = match &request.resource {
        Some(r) => {
            Some(uri::canonical(r).map_err(|e| format!("the resource URI is refused: {e}"))?)
        }
        None => None,
    };
    let (kind, subject) = match (&request.tool, &canonical, &request.prompt) {
        (Some(t), None, None) => ("tool", Subject::Tool(t)),
        (None, Some(r), None) => ("resource", Subject::Resource(r.identity())),
        (None, None, Some(p)) => ("prompt", Subject::Prompt(p)),
        _ => return Err("the request names exactly one of `tool`, `resource` or `prompt`".into()),
    };
    // What each kind of use carries: a resource has no arguments, and
    // annotations are a tool's.
    if request.tool.is_none() && request.annotations.is_some() {
        return Err(format!(
            "`annotations` are a tool's; a {kind} request has none"
        ));
    }
    if request.resource.is_some() && request.arguments.is_some() {
        return Err("a resource is read without arguments; remove `arguments`".into());
    }
    let method = match (&request.method, subject) {
        (Some(m), _) => m.as_str(),
        (None, Subject::Tool(_)) => Method::ToolsCall.name(),
        (None, Subject::Resource(_)) => Method::ResourcesRead.name(),
        (None, Subject::Prompt(_)) => Method::PromptsGet.name(),
    };
    // A completion carries no arguments nor query of the prompt's or the
    // resource's own: the gateway leaves a condition over them to the get
    // or the read, and so does the explanation.
    let completion = Method::of(method) == Some(Method::CompletionComplete)
        || (config.methods.iter()).any(|(n, c)| n == method && c == Class::Completion);
    let arguments = request.arguments.unwrap_or_else(|| json!({}));
    let mut labels = Vec::new();
    for given in &request.labels {
        let label = Label::ALL
            .iter()
            .find(|(name, _)| name == given)
            .ok_or_else(|| format!("`{given}` is not a flow label (labels: private, untrusted)"))?;
        labels.push(label.1.as_str());
    }
    // Every use is resolved with its facts, so every `when` is evaluated as the gateway would.
    let mut conditions = Vec::new();
    let facts = Facts {
        claims: request.claims.as_ref(),
        method,
        arguments: (request.resource.is_none() && !completion).then_some(&arguments),
        annotations: request.annotations.as_ref(),
        // A resource's query as the gateway forwards it (canonical).
        query: (canonical.as_ref().filter(|_| !completion)).map(uri::CanonicalUri::query),
        labels: &labels,
    };
    let resolved =
        config
            .policy
            .resolve_use(&client, &request.server, subject, &facts, &mut |rule, o| {
                conditions.push(json!({"rule": rule, "when": o.describe()}));
            });
    let report = match resolved {
        Ok(effective) => {
            let mut r = report(config, &effective, &arguments);
            r["conditions"] = conditions.into();
            r
        }
        Err(failed) => json!({
            "allowed": false,
            "rule": failed.rule,
            "conditions": conditions,
            "expression_failed": {"rule": failed.rule, "expression": failed.expression, "error": failed.reason},
            "verdict": "refused",
        }),
    };
    if as_json {
        return Ok(serde_json::to_string_pretty(&report).unwrap_or_default());
    }
    let name = match subject {
        Subject::Tool(n) | Subject::Resource(n) | Subject::Prompt(n) => n,
    };
    Ok(text(&request.client, &request.server, kind, name, &report))
}

fn find_client(config: &Config, name: &str) -> Result<ClientId, String> {
    let ids = config.clients.ids();
    if let Some(id) = ids.iter().find(|c| c.name() == name) {
        return Ok(id.clone());
    }
    if config.clients.jwt().is_some() {
        // A client that signs in with a token needs no entry of its own.
        return Ok(ClientId::named(name));
    }
    let known: Vec<&str> = ids.iter().map(ClientId::name).collect();
    Err(format!(
        "no client named `{name}` in the configuration (clients: {})",
        known.join(", ")
    ))
}

/// The resolution as JSON: the same fields the runtime acts on.
fn report(config: &Config, e: &Effective<'_>, arguments: &Value) -> Value {
    let policy = &config.policy;
    let arguments: Vec<Value> = e
        .constraints
        .iter()
        .map(|rule| match policy.check_rule_arguments(*rule, arguments) {
            Ok(()) => json!({"rule": rule, "passes": true}),
            Err(v) => json!({"rule": rule, "passes": false, "violations": v}),
        })
        .collect();
    let rates: Vec<Value> = e
        .rates
        .iter()
        .map(|(rule, rate)| {
            json!({"rule": rule, "rate": rate.describe(), "burst": rate.burst.get(),
                "per_second": rate.per_second})
        })
        .collect();
    let approval = e.approval.map(|a| {
        json!({"rule": a.rule, "by": a.by.as_str(), "pending": a.pending.as_str(), "text": a.describe()})
    });
    let matching: Vec<usize> = e
        .decision
        .allow_rules
        .iter()
        .map(|i| policy.rules[*i].index)
        .collect();
    let runs = e.decision.allowed && arguments.iter().all(|a| a["passes"] == true);
    json!({
        "allowed": e.decision.allowed,
        "rule": e.decision.rule,
        "allow_rules": matching,
        "arguments": arguments,
        "rates": rates,
        "approval": approval,
        "verdict": match (runs, e.approval.is_some()) {
            (false, _) => "refused",
            (true, true) => "asks for approval",
            (true, false) => "runs",
        },
    })
}

fn text(client: &str, server: &str, kind: &str, name: &str, r: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "client {} on server {}: {kind} {}\n",
        visible(client),
        visible(server),
        visible(name)
    );
    let rule = r["rule"].as_u64();
    for c in r["conditions"].as_array().into_iter().flatten() {
        let when = c["when"].as_str().unwrap_or_default();
        let _ = writeln!(
            out,
            "  when: rules[{}] condition is {}",
            c["rule"],
            visible(when)
        );
    }
    if let Some(f) = r["expression_failed"].as_object() {
        let error = f["error"].as_str().unwrap_or_default();
        let _ = writeln!(
            out,
            "  denied: the condition of rules[{}] failed (a failing condition denies the call): {}",
            f["rule"],
            visible(error)
        );
        let _ = writeln!(out, "verdict: refused");
        return out;
    }
    if r["allowed"] != true {
        let why = match rule {
            Some(i) => format!("denied by rules[{i}] (a deny rule overrides every allow)"),
            None => "denied: no allow rule matches (deny by default)".to_owned(),
        };
        let _ = writeln!(out, "  {why}");
        let _ = writeln!(out, "verdict: refused");
        return out;
    }
    let all: Vec<String> = r["allow_rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| format!("rules[{i}]"))
        .collect();
    let _ = writeln!(
        out,
        "  allowed by {} (every matching allow rule applies)",
        all.join(", ")
    );
    for a in r["arguments"].as_array().into_iter().flatten() {
        let rule = &a["rule"];
        if a["passes"] == true {
            let _ = writeln!(out, "  arguments: rules[{rule}] constraint passes");
            continue;
        }
        let _ = writeln!(out, "  arguments: rules[{rule}] constraint refuses:");
        for v in a["violations"].as_array().into_iter().flatten() {
            let pointer = v["pointer"].as_str().unwrap_or_default();
            let expected = v["expected"].as_str().unwrap_or_default();
            let _ = writeln!(
                out,
                "    {}: expected {}",
                visible(pointer),
                visible(expected)
            );
        }
    }
    for rate in r["rates"].as_array().into_iter().flatten() {
        let text = rate["rate"].as_str().unwrap_or_default();
        let _ = writeln!(
            out,
            "  rate: {text} (rules[{}]); a call takes a token from each",
            rate["rule"]
        );
    }
    if let Some(a) = r["approval"].as_object() {
        let text = a["text"].as_str().unwrap_or_default();
        let _ = writeln!(
            out,
            "  approval: {text} (rules[{}], the strictest that matches)",
            a["rule"]
        );
    }
    let _ = writeln!(
        out,
        "verdict: {}",
        r["verdict"].as_str().unwrap_or_default()
    );
    out
}

/// Text of the configuration or the request as shown on a terminal: every
/// character that is not plainly visible escaped, so no name can move the
/// cursor or add a line. Quotes are plainly visible and stay as written
/// (CEL's reasons quote the operator they could not apply).
fn visible(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\'' | '"' => c.to_string(),
            c => c.escape_debug().to_string(),
        })
        .collect()
}
