//! The refusals of calls a rule marks for approval: declined, denied,
//! expired, unavailable, too large to show, or waiting for an operator.
//!
//! Place: the approval step of the pipeline turns an
//! [`crate::approval::Refusal`] into a [`Rejection`] here.
//! Invariants: each text says whether anything ran and whether calling again
//! helps; the approval's facts go in `_meta["portcullis/error"]`.

use serde_json::Value;

use super::refusals::wait_text;
use super::rejection::{Rejection, RenderCtx, ToolRefusal, codes};
use crate::mcp::jsonrpc;

/// A call a rule marks for approval that is not run (see
/// [`crate::approval::Refusal`]): the isError result, with its code and the
/// approval's facts in `_meta["portcullis/error"]`.
pub(crate) fn approval_refused(
    tool: &str,
    server: &str,
    refusal: &crate::approval::Refusal,
) -> Rejection {
    use crate::approval::Refusal as R;
    let call = format!("The call to `{tool}` on server `{server}`");
    let mut detail = serde_json::Map::new();
    detail.insert("tool".into(), tool.into());
    detail.insert("server".into(), server.into());
    let (code, text) = match refusal {
        R::CannotAsk => (
            "approval_unavailable",
            format!(
                "{call} runs only after the user approves it, and this client cannot be asked: it did not declare \
                 the elicitation capability (form mode; at `initialize` in the 2025 protocol era, in \
                 `_meta[\"io.modelcontextprotocol/clientCapabilities\"]` of each request in 2026-07-28). Nothing was run. \
                 Use a client that supports elicitation, or ask the gateway's operator to let an operator approve \
                 these calls (`approval = {{ by = \"operator\" }}` or `\"either\"` on the rule): such calls wait in the \
                 dashboard's approval queue and are approved there or with POST /api/approvals/<id>/approve on the \
                 admin listener."
            ),
        ),
        R::Declined { by } => {
            detail.insert("by".into(), (*by).into());
            (
                "approval_declined",
                format!(
                    "{call} was not approved (the user declined or did not confirm), so nothing was run. Do not \
                     retry it unless the user asks for it; calling again asks again."
                ),
            )
        }
        R::Denied { id, by } => {
            detail.insert("approval_id".into(), id.as_str().into());
            detail.insert("denied_by".into(), by.as_str().into());
            (
                "approval_denied",
                format!(
                    "{call} was denied by an operator (approval {id}), so nothing was run. Do not retry it; tell \
                     the user it was denied."
                ),
            )
        }
        R::Expired { by, timeout } => {
            detail.insert("by".into(), (*by).into());
            detail.insert("timeout_ms".into(), (timeout.as_millis() as u64).into());
            let who = if *by == "user" {
                "the user"
            } else {
                "an operator"
            };
            (
                "approval_expired",
                format!(
                    "{call} was not approved by {who} within {}, so nothing was run. Calling again asks again.",
                    wait_text(*timeout)
                ),
            )
        }
        R::StateInvalid => (
            "approval_invalid",
            format!(
                "{call} carries a requestState that is not one this gateway issued for this client and call (or \
                 one issued before the gateway restarted), so nothing was run. Call the tool again without \
                 requestState and inputResponses to be asked for approval."
            ),
        ),
        R::StateUsed => (
            "approval_used",
            format!(
                "{call} carries an approval that was used already: each approval runs one call, once. Nothing was \
                 run. Call the tool again without requestState to ask for a new approval."
            ),
        ),
        R::StateExpired => (
            "approval_expired",
            format!(
                "{call} carries an approval that has expired, so nothing was run. Call the tool again without \
                 requestState to ask again."
            ),
        ),
        R::StateUnavailable { store } => {
            detail.insert("store".into(), (*store).into());
            (
                "state_unavailable",
                format!(
                    "{call} carries an approval, and the gateway's shared state store ({store}) did not answer, so \
                     whether this approval was used already cannot be checked. Nothing was run and the approval was \
                     not used. Retry the same call (same requestState and answer) shortly; if it keeps failing, tell \
                     the gateway's operator that the {store} state store is unreachable."
                ),
            )
        }
        R::QueueUnavailable { store } => {
            detail.insert("store".into(), (*store).into());
            (
                "state_unavailable",
                format!(
                    "{call} needs an operator's approval, and the gateway's shared state store ({store}), where \
                     every operator of the gateway sees and answers the calls waiting, did not answer. Nothing was \
                     run. Call again shortly; if it keeps failing, tell the gateway's operator that the {store} \
                     state store is unreachable."
                ),
            )
        }
        R::Reloaded => (
            "approval_expired",
            format!(
                "{call} was waiting for approval when the gateway's configuration was reloaded, and the \
                 configuration in force no longer lets it run as it was approved (the tool or these arguments are \
                 no longer allowed to you, or another approver is required), so it was not run. Call again to be \
                 asked under the configuration in force, if it allows the call."
            ),
        ),
        R::UnknownId => (
            "approval_unknown",
            format!(
                "{call} names an approval id (`_meta[\"portcullis/approvalId\"]`) that is not pending or approved for \
                 you, so nothing was run. Leave the id out: the gateway finds an approval of this exact call by \
                 itself, or queues a new one."
            ),
        ),
        R::TooLargeToCarry { limit } => {
            detail.insert("limit".into(), (*limit as u64).into());
            (
                "approval_unavailable",
                format!(
                    "{call} needs the user's approval, and what it carries of the server's own input round \
                     (requestState and inputResponses) is larger than the {limit} bytes the gateway can carry across \
                     its question, so nothing was run. Answer the server with less, or ask the gateway's operator to \
                     let an operator approve this tool (`by = \"operator\"`)."
                ),
            )
        }
        R::Unpresentable { chars, limit } => {
            detail.insert("chars".into(), (*chars as u64).into());
            detail.insert("limit".into(), (*limit as u64).into());
            (
                "approval_unpresentable",
                format!(
                    "{call} needs a person's approval, and shown in full its question would be {chars} characters, \
                     more than the {limit} the gateway shows (`[approvals] max_question_chars`). Nothing is ever \
                     approved unseen or cut, so nothing was run and nobody was asked. Call it with smaller \
                     arguments (split the work into several calls), or ask the gateway's operator to raise \
                     `max_question_chars`."
                ),
            )
        }
        R::Busy { limit, per_client } => {
            detail.insert("limit".into(), (*limit as u64).into());
            let whose = if *per_client { "of yours " } else { "" };
            (
                "approval_busy",
                format!(
                    "{call} needs an approval, and {limit} approvals {whose}are open already (the gateway's limit), \
                     so nothing was run and nothing was queued. Wait for open approvals to be decided or to expire, \
                     then call again."
                ),
            )
        }
        R::Required {
            id,
            expires_ms,
            already,
        } => {
            detail.insert("approval_id".into(), id.as_str().into());
            detail.insert("expires_ms".into(), (*expires_ms).into());
            detail.insert("retry".into(), true.into());
            let state = if *already {
                "is still waiting for an operator's approval"
            } else {
                "needs an operator's approval and was queued for it"
            };
            (
                "approval_required",
                format!(
                    "{call} {state} (approval {id}, open until {}); it was not run yet. Tell the user it awaits \
                     approval. Once an operator approves it (in the gateway's dashboard, or with POST \
                     /api/approvals/{id}/approve on the admin listener), make exactly the same call again — same \
                     tool, same arguments — and it runs once. Other arguments need a new approval.",
                    crate::util::time::iso8601(*expires_ms)
                ),
            )
        }
    };
    Rejection::Tool(ToolRefusal { code, text, detail })
}

/// The reply to an approved call could not be read as JSON (2025-era
/// approval on the call's stream, where the reply becomes an SSE event).
pub(crate) fn unreadable_after_approval(cx: RenderCtx<'_>) -> Value {
    jsonrpc::error(
        cx.id,
        codes::UPSTREAM_PROTOCOL,
        "the approved call was forwarded, but the upstream's reply could not be read as JSON-RPC; the tool may have run",
        None,
    )
}
