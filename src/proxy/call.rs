//! The tools/call branch: catalog, authorize, pin, rule arguments, rate
//! limit, validate; plus the session and task steps it relies on.
//!
//! Place: between dispatch and forward. Invariants: the token is taken once
//! per call that runs — by the rate step of the checks, given back when a
//! later check refuses the call, or, for a call put to a person, right
//! before it is forwarded (a question and a declined call take none) — and
//! nothing is sent upstream before validation passed.

use super::approve;
use super::context::Context;
use super::flow;
use super::forward::{Forward, upstream};
use super::rate::{Spend, give_back, rate_limit};
use super::refusals::{
    argument_not_permitted, call_not_permitted, invalid_arguments, pin_quarantined, quarantined,
    rule_expression_failed, unknown_tool,
};
use super::task_calls;

use std::borrow::Cow;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

use super::state::{AppState, Live};
use crate::proxy::catalog::CallFacts;
use crate::proxy::catalog::ToolSet;

use crate::audit;
use crate::auth::ClientId;
use crate::config::ArgumentScan;
use crate::error::{self, Rejection};
use crate::flow::SessionKey;
use crate::mcp::headers::{self};
use crate::mcp::jsonrpc::Message;
use crate::mcp::methods::Method as Rpc;
use crate::mcp::request::Request;
use crate::mcp::version::Era;
use crate::pins::{self};
use crate::policy::{Decision, Facts, ListFacts, Outcome, Subject};
use crate::sanitize::{Sanitizer, Skip};
use crate::validate::Violation;

/// A stream (a GET stream: `get_stream`, or `subscriptions/listen`) is held
/// for `client` on each of `servers`, so that a reload revoking its access
/// ends it; any other response is returned as it is.
pub(super) fn held<'a>(
    state: &AppState,
    ctx: &Context,
    client: &ClientId,
    servers: impl IntoIterator<Item = &'a str>,
    get_stream: bool,
    mut response: Response,
) -> Response {
    if !get_stream && ctx.rpc != Some(Rpc::SubscriptionsListen) {
        return response;
    }
    for server in servers {
        response = state.streams.hold(client, server, response);
    }
    response
}

/// A task method (`tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel`,
/// `tasks/update`, or an operator's method of class task): every task-scoped
/// request of a client passes here, and only here, on its way to the server.
pub(super) async fn task(
    ctx: &mut Context,
    forward: &Forward,
    client: &ClientId,
    headers: &HeaderMap,
    request: &Request,
    body: Bytes,
) -> Result<Response, Rejection> {
    let to = ctx.recipient(&forward.server);
    task_calls::serve(forward, client, &mut ctx.tool, headers, request, body, to).await
}

/// The outgoing secret scan of everything a message carries towards the
/// upstream (`sanitize.arguments = "block"`), as classification parsed it:
/// the (pointer, kind) of each finding. The arguments of a tool call
/// (`tools/call`, or an operator's method of class tool: `tool_call`) are
/// scanned in [`check_call`], under the tool's exemption.
pub(super) fn scan_outgoing(
    live: &Live,
    message: &Message,
    body: &Bytes,
    tool_call: bool,
) -> Vec<(String, String)> {
    if live.sanitize.arguments != ArgumentScan::Block {
        return Vec::new();
    }
    let sanitizer = Sanitizer::new(&live.sanitize, Skip::default());
    match message {
        Message::Request { params, .. } | Message::Notification { params, .. } => {
            let skip: &[&str] = if tool_call {
                &["/params/arguments"]
            } else {
                &[]
            };
            params
                .as_ref()
                .map(|p| sanitizer.find_outgoing_members(p, "/params", skip))
                .unwrap_or_default()
        }
        // A client's answer to a server's request (elicitation, sampling, …).
        Message::Response { .. } => serde_json::from_slice::<Value>(body)
            .map(|v| sanitizer.find_outgoing(&v, "", &[]))
            .unwrap_or_default(),
    }
}

/// The refusal of what [`scan_outgoing`] found in `request`, if anything.
pub(super) fn outgoing_refusal(
    request: &Request,
    found: Vec<(String, String)>,
) -> Result<(), Rejection> {
    if found.is_empty() {
        return Ok(());
    }
    if let (Some(name), false) = (request.tool(), request.is_notification()) {
        return Err(error::secret_in_call(name, &found));
    }
    Err(Rejection::SecretInParams(error::SecretFound {
        request: !request.is_notification() && request.called().is_some(),
        method: request.method_name().to_owned(),
        found,
    }))
}

/// A tool call: `tools/call`, or an operator's method of class tool (same
/// `params.name` and `params.arguments`, same steps, same refusals).
pub(super) async fn call_tool(
    ctx: &mut Context,
    forward: &Forward,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Request,
) -> Result<Response, Rejection> {
    let name = message.tool().unwrap_or_default().to_owned();
    ctx.tool = Some(name.clone());
    let server = &forward.server;
    let server_name = server.upstream.settings.name.as_str();
    let sanitize = &forward.live.sanitize;
    ctx.trail.stage("catalog");
    let tools = forward
        .tool_set(headers, message, ctx.id.as_ref())
        .await
        .map_err(|e| {
            let mut rejection = upstream(sanitize, server_name, Some(&name), e);
            if let Rejection::Upstream(f) = &mut rejection {
                f.unchecked = true;
            }
            rejection
        })?;
    let call = Call {
        client,
        headers,
        tools: &tools,
        name: &name,
        message,
    };
    let checked = match check_call(forward, ctx, &call).await {
        Ok(checked) => Some(checked),
        Err(rejection) => {
            let rejection = approve::lapsed(forward, ctx, client, message, rejection);
            ctx.observe_or_enforce::<()>(Err(rejection))?;
            None
        }
    };
    if checked.is_none() {
        // Observed: the transport's own check of `Mcp-Param-*` still holds.
        if let (Some(entry), Some(Value::Object(args))) =
            (tools.tools.get(&name), message.arguments())
        {
            let input_schema = entry.definition.get("inputSchema").unwrap_or(&Value::Null);
            headers::check_params(headers, args, input_schema, ctx.era == Era::Modern)
                .map_err(|m| Rejection::HeaderMismatch(m.0))?;
        }
    }
    let skip = sanitize.skip_for(server_name, &name);
    let facts = match tools.tools.get(&name) {
        Some(entry) => CallFacts::of(entry, skip),
        None => CallFacts::default(),
    };
    ctx.call = facts;
    let session = ctx.flow_key(client, server_name, message);
    let (store, labels) = (&forward.state.flows, &forward.live.config.flow);
    let annotations = (tools.tools.get(&name)).and_then(|e| e.definition.get("annotations"));
    ctx.flow = flow::recording(store, labels, session, (server_name, &name, annotations));
    let to = ctx.recipient(server);
    match checked {
        Some(Checked {
            approval: Some(requirement),
            decision,
        }) => {
            // Kept with a held call: the rules' `when` and the flow labels read them again when it is decided again.
            let checked = (&requirement, &decision, annotations);
            approve::approve(ctx, forward, client, headers, message, checked, to).await
        }
        // Its tokens were taken by the checks.
        Some(Checked { approval: None, .. }) => {
            forward.relay(headers, forwarded(message), to).await
        }
        // Observe mode, a check refused: forwarded, nothing taken.
        None => forward.relay(headers, forwarded(message), to).await,
    }
}

/// The call as forwarded: as the gateway serialises the parsed call, not as
/// the client spelled it, and never with an answer under the gateway's
/// reserved key.
fn forwarded(message: &Request) -> Bytes {
    approve::stripped(message, None)
}

/// What the checks of a `tools/call` found: the access decision (its rules'
/// rates are charged by the checks, or, for a call that needs an approval,
/// when it runs) and the approval it needs.
pub(super) struct Checked {
    pub(super) approval: Option<crate::approval::Requirement>,
    pub(super) decision: Decision,
}

/// A `tools/call` as the checks see it: who calls which tool, with what,
/// against the server's tools as the catalog knows them.
pub(super) struct Call<'a> {
    pub(super) client: &'a ClientId,
    /// The client's headers (`Mcp-Param-*` must agree with the arguments).
    pub(super) headers: &'a HeaderMap,
    pub(super) tools: &'a ToolSet,
    pub(super) name: &'a str,
    pub(super) message: &'a Request,
}

/// Every decision on a `tools/call`, in order, each a named step announced
/// here: access rules and pin (`authorize`), the rules' `when` and
/// `arguments`, `flow`, `rate_limit`, then `validate` (`Mcp-Param-*`,
/// `inputSchema`, secrets in the arguments); when all pass, the approval a
/// rule requires for it (put to a person last). A call past its rate is
/// refused at the rate step. A call that needs no approval takes its tokens
/// there (one decision of the backend) and gets them back ([`give_back`])
/// when a later step refuses it; a call that needs one only looks, and
/// takes when it runs, so neither a question nor a declined call costs a
/// token.
pub(super) async fn check_call(
    forward: &Forward,
    ctx: &Context,
    call: &Call<'_>,
) -> Result<Checked, Rejection> {
    let (state, live, server) = (&forward.state, &*forward.live, &forward.server);
    ctx.trail.stage("authorize");
    let entry = authorize(ctx, forward, call)?;
    let config = &*live.config;
    // The session's key, once: the labels a condition reads and the flow rules use it.
    let session = ctx.flow_key(call.client, forward.name(), call.message);
    let flows = (&*state.flows, &config.policy, &config.flow);
    let labels = flow::labels(flows, &session, call.name).await?;
    let (arguments, decision) = rule_arguments(ctx, forward, call, entry, &labels)?;
    ctx.trail.stage("flow");
    let approval = flow_rules(ctx, forward, call, &session, &decision).await?;
    ctx.trail.stage("rate_limit");
    let subject = Subject::Tool(call.name);
    // A call put to a person holds no token while it waits: its rate is
    // only looked at here and taken when it runs. Any other call takes its
    // token now (one decision of the backend), given back if a later check
    // refuses it.
    let spend = match approval {
        Some(_) => Spend::Peek,
        None => Spend::Take,
    };
    let tokens = rate_limit(state, live, call.client, server, subject, &decision, spend).await?;
    ctx.trail.stage("validate");
    let name = server.upstream.settings.name.as_str();
    if let Err(rejection) = validate(ctx, &live.config, entry, call, &arguments, name) {
        give_back(state, tokens).await;
        return Err(rejection);
    }
    Ok(Checked { approval, decision })
}

/// The access rules for the tool (hidden: the `unknown_tool` answer), then
/// its pin: a quarantined definition is not called.
fn authorize<'t>(
    ctx: &Context,
    forward: &Forward,
    call: &Call<'t>,
) -> Result<&'t crate::proxy::catalog::ToolEntry, Rejection> {
    let config = &*forward.live.config;
    let server_name = forward.name();
    let Call {
        client,
        tools,
        name,
        ..
    } = *call;
    let listed = tools.tools.contains_key(name);
    ctx.trail.note(|e| e.tool_listed = listed);
    // Decided first as the client's list decides it: a tool its list hides
    // (by a rule, or by a condition over its claims or the tool's
    // annotations) is unknown to its call, so no answer says it exists.
    let claims = ctx.token.as_ref().map(|t| t.claims());
    let known = tools.tools.get(name);
    let shown = ListFacts {
        claims,
        annotations: known.and_then(|e| e.definition.get("annotations")),
    };
    let decision = config
        .policy
        .decide_listed(client, server_name, Subject::Tool(name), &shown);
    ctx.trail.trace().rule(decision.rule);
    let entry = known.filter(|_| decision.allowed);
    let Some(entry) = entry else {
        return Err(unknown_tool(
            config,
            client,
            server_name,
            tools,
            name,
            &ctx.prefix,
            claims,
        ));
    };
    if let Some(hold) = entry.pin.held().or(entry.pin.flagged()) {
        let findings = serde_json::to_value(&*hold.findings).ok();
        ctx.trail.note(|e| e.pin_findings = findings);
    }
    if let Some(hold) = entry.pin.held() {
        return Err(pin_quarantined(hold));
    }
    if let Some(flag) = entry.pin.flagged() {
        tracing::warn!(server = server_name, tool = %name, changed = %pins::changed_fields(&flag.changes).join(","),
            findings = flag.findings.len(), "calling a tool whose definition is not the approved one (pinning = warn)");
    }
    Ok(entry)
}

/// The rules' `when` expressions, now that the call's facts are known, and
/// their `arguments`: the arguments (absent is `{}`; the call's own,
/// borrowed) and the decision.
fn rule_arguments<'c>(
    ctx: &Context,
    forward: &Forward,
    call: &Call<'c>,
    entry: &crate::proxy::catalog::ToolEntry,
    labels: &[&'static str],
) -> Result<(Cow<'c, Value>, Decision), Rejection> {
    let config = &*forward.live.config;
    let Call {
        client,
        name,
        message,
        ..
    } = *call;
    // Borrowed from the call, not copied: arguments can be large.
    let arguments = match message.arguments() {
        None | Some(Value::Null) => Cow::Owned(Value::Object(Map::new())),
        Some(a @ Value::Object(_)) => Cow::Borrowed(a),
        Some(_) => {
            let v = Violation {
                pointer: String::new(),
                expected: "an object".into(),
                received: "another JSON type".into(),
                description: None,
            };
            return Err(invalid_arguments(name, &[v]));
        }
    };
    let recorded = audit::record_arguments(config.audit.arguments, &config.sanitize, &arguments);
    ctx.trail.note(|e| e.arguments = recorded);
    let facts = Facts {
        claims: ctx.token.as_ref().map(|t| t.claims()),
        method: Rpc::ToolsCall.name(),
        arguments: Some(&arguments),
        annotations: entry.definition.get("annotations"),
        query: None,
        labels,
    };
    let mut falsified = Vec::new();
    let decision = config
        .policy
        .decide_with(
            client,
            forward.name(),
            Subject::Tool(name),
            Some(&facts),
            &mut |rule, o| {
                if *o == Outcome::False {
                    falsified.push(rule);
                }
            },
        )
        .map_err(|f| rule_expression_failed(name, &f))?;
    ctx.trail.trace().rule(decision.rule);
    if !decision.allowed {
        return Err(call_not_permitted(config, name, decision.rule, &falsified));
    }
    config
        .policy
        .check_arguments(&decision, &arguments)
        .map_err(|(rule, v)| argument_not_permitted(name, rule, &v))?;
    Ok((arguments, decision))
}

/// The flow rules for what the call's session holds (a call they deny
/// stops here), and the strictest approval the call needs, if any.
async fn flow_rules(
    ctx: &Context,
    forward: &Forward,
    call: &Call<'_>,
    session: &SessionKey,
    decision: &Decision,
) -> Result<Option<crate::approval::Requirement>, Rejection> {
    let config = &*forward.live.config;
    let server_name = forward.name();
    let flows = (&*forward.state.flows, &config.policy, &config.flow);
    let annotations =
        (call.tools.tools.get(call.name)).and_then(|e| e.definition.get("annotations"));
    let of = (server_name, call.name, annotations);
    let held = flow::check(flows, &ctx.trail, session, of, decision).await?;
    let approval = config.policy.approval(decision).into_iter().chain(held);
    Ok(config.policy.strictest_approval(approval).cloned())
}

/// The last checks of a `tools/call`: `Mcp-Param-*`, `inputSchema`, secrets
/// in the arguments (after the rate limit, so a call over its rate is
/// refused before its arguments are examined).
fn validate(
    ctx: &Context,
    config: &crate::config::Config,
    entry: &crate::proxy::catalog::ToolEntry,
    call: &Call<'_>,
    arguments: &Value,
    server_name: &str,
) -> Result<(), Rejection> {
    let (headers, name) = (call.headers, call.name);
    let sanitize = &config.sanitize;
    let schema = entry.schema.as_ref().map_err(|e| quarantined(name, e))?;
    let input_schema = entry.definition.get("inputSchema").unwrap_or(&Value::Null);
    if let Value::Object(args) = arguments {
        headers::check_params(headers, args, input_schema, ctx.era == Era::Modern)
            .map_err(|m| Rejection::HeaderMismatch(m.0))?;
    }
    schema.check(arguments).map_err(|v| {
        // Where and what was expected; never the value received.
        let lines = v
            .iter()
            .map(|v| format!("{}: expected {}", v.pointer, v.expected))
            .collect();
        ctx.trail.note(|e| e.violations = lines);
        invalid_arguments(name, &v)
    })?;
    let skip = sanitize.skip_for(server_name, name);
    if sanitize.arguments == ArgumentScan::Block && !skip.arguments {
        let found = Sanitizer::new(sanitize, skip).find_outgoing(arguments, "", &[]);
        if !found.is_empty() {
            return Err(error::secret_in_arguments(name, &found));
        }
    }
    Ok(())
}
