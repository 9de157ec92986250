//! The task methods a client sends (`tasks/get`, `tasks/result`,
//! `tasks/cancel`, `tasks/update`, `tasks/list`): each names a task the
//! client must own ([`super::tasks`]); `tasks/list` is collected whole and
//! filtered to the caller's own tasks.
//!
//! Place: the task branch of dispatch, before forward. Invariants: another
//! client's task, an expired one and one the gateway never saw created all
//! get the answer an unknown task gets, and the upstream is not called; a
//! task created through another replica of the deployment is found in the
//! shared state store, and when that store cannot answer the method is
//! refused (`state_unavailable`), never forwarded.

use axum::response::Response;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Value, json};

use super::catalog::CallFacts;
use super::forward::{Forward, Pages};
use super::respond::{self, Recipient};
use super::tasks::{TaskMethod, TaskStore};
use crate::auth::ClientId;
use crate::error::{Rejection, UpstreamKind};
use crate::mcp::methods::Method as Rpc;
use crate::mcp::request::{Ask, Request};
use crate::policy::{ListFacts, Subject};
use crate::sanitize::{Report, Sanitizer, Skip};
use crate::transport::reply::UpstreamError;

/// Serves a task method (one [`TaskMethod::of`] names) for `client` on
/// `forward`'s server.
pub(super) async fn serve(
    forward: &Forward,
    client: &ClientId,
    audit_tool: &mut Option<String>,
    headers: &HeaderMap,
    message: &Request,
    body: Bytes,
    mut to: Recipient,
) -> Result<Response, Rejection> {
    let name = message.method_name();
    let method = (message.method().and_then(TaskMethod::of))
        .ok_or_else(|| Rejection::MethodNotFound(name.to_owned()))?;
    let store = forward.state.tasks.clone();
    let server = forward.name().to_owned();
    if method == TaskMethod::List {
        return list(forward, &store, client, headers, message, to).await;
    }
    let task_id = match message.ask() {
        Ask::Task {
            task_id: Some(id), ..
        } => id.as_str(),
        _ => {
            return Err(Rejection::InvalidParams(format!(
                "{name} needs params.taskId, a string"
            )));
        }
    };
    let policy = &forward.live.config.policy;
    let task = match store.owned(&server, task_id, client) {
        Some(task) => Some(task),
        None => {
            // Maybe created through another replica: what this one's catalog
            // knows of the tool is what its result is checked against.
            let tools = forward
                .tool_set(headers, message, to.id.as_ref())
                .await
                .ok();
            let sanitize = &forward.live.sanitize;
            let facts = |tool: &str| {
                let entry = tools.as_ref().and_then(|t| t.tools.get(tool));
                entry.map_or_else(CallFacts::default, |e| {
                    CallFacts::of(e, sanitize.skip_for(&server, tool))
                })
            };
            store
                .owned_in_fleet(&server, task_id, client, facts)
                .await
                .map_err(|e| Rejection::StateUnavailable(e.store))?
        }
    };
    // A task whose tool the client may no longer call is not its to read:
    // decided as its list decides the tool (the token's claims, the tool's
    // annotations as the catalog holds them, the time), so a condition is
    // never left undecided here.
    let claims = forward.caller.token.as_ref().map(|t| t.claims());
    let known = forward.server.catalog.get();
    let task = task
        .filter(|t| t.era == to.era)
        .filter(|t| {
            let annotations = (known.as_ref())
                .and_then(|set| set.tools.get(&t.tool))
                .and_then(|e| e.definition.get("annotations"));
            let shown = ListFacts {
                claims,
                annotations,
            };
            policy
                .decide_listed(client, &server, Subject::Tool(&t.tool), &shown)
                .allowed
        })
        .ok_or(Rejection::UnknownTask)?;
    *audit_tool = Some(task.tool.clone());
    if method == TaskMethod::Result {
        // The answer stands for the tools/call: the same checks, exactly one answer.
        to.tool = Some(task.tool);
        to.call = task.facts;
    }
    forward.relay(headers, body, to).await
}

/// `tasks/list`: every page collected by the gateway, the caller's own tasks
/// answered on one page. The gateway hands out no cursor, so a request that
/// carries one is refused like an invalid cursor.
async fn list(
    forward: &Forward,
    store: &TaskStore,
    client: &ClientId,
    headers: &HeaderMap,
    message: &Request,
    to: Recipient,
) -> Result<Response, Rejection> {
    if let Ask::Task {
        cursor: Some(_), ..
    } = message.ask()
    {
        return Err(Rejection::InvalidParams(
            "tasks/list: the gateway answers every task of yours on one page and hands out no cursor; send tasks/list without one".into(),
        ));
    }
    // The client's own params (its `_meta`), its id, no cursor.
    let request = message.to_value();
    let sanitizer = Sanitizer::new(&to.sanitize, Skip::default());
    let mut report = Report::default();
    let server = forward.name();
    let pages = forward
        .all_pages(headers, request, "tasks")
        .await
        .map_err(|e| to.failure(e))?;
    let mut response = match pages {
        Pages::Complete(items, mut result, _) => {
            let own: Vec<Value> = items
                .into_iter()
                .filter(|t| {
                    t.get("taskId")
                        .and_then(Value::as_str)
                        .is_some_and(|id| store.owned(server, id, client).is_some())
                })
                .collect();
            result.remove("nextCursor");
            result.insert("tasks".into(), Value::Array(own));
            json!({"jsonrpc": "2.0", "id": to.id.clone().unwrap_or(Value::Null), "result": Value::Object(result)})
        }
        Pages::Refused(error, _) => error,
        Pages::Unchanged(..) => {
            let e = UpstreamError::new(UpstreamKind::Protocol, "its task list could not be read");
            return Err(to.failure(e));
        }
    };
    // The gateway built this response itself from the upstream's pages: its
    // shape is known, and every string in it is sanitized like any message.
    if sanitizer
        .message(&mut response, Some(Rpc::TasksList.name()), &mut report)
        .is_err()
    {
        let e = UpstreamError::new(UpstreamKind::Protocol, "its task list could not be read");
        return Err(to.failure(e));
    }
    to.trail.sanitized(&report);
    Ok(respond::json(&response, HeaderMap::new()))
}
