//! The operator's approval queue on the admin listener:
//! `GET /api/approvals` lists the calls waiting for an operator (and those
//! approved but not used yet); `POST /api/approvals/{id}/approve` or `/deny`
//! decides one.
//!
//! Place: the admin API, beside pins; the queue itself is the gateway's
//! ([`crate::approval`]; the fleet's with a shared state store), reached
//! through [`AdminState::app`]. Invariants: listing is a read ([`reader`]),
//! deciding an admin action ([`admin`]); a decision names who made it in the
//! audit, bounded and without control characters; an entry is decided once
//! (fleet-wide: the first decision on any replica); a store that cannot
//! answer is a 503 naming it, never an empty list.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::access::{admin, problem, reader, store_unavailable};
use super::state::AdminState;
use crate::approval::queue::DecideError;
use crate::error::json_response;

/// `GET /api/approvals`: the operator queue (pending, and approved but not
/// used yet), oldest first; expired entries are taken out (and audited) first.
pub(crate) async fn approvals(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
) -> Response {
    if let Err(refusal) = reader(&state, &headers) {
        return refusal;
    }
    let now = crate::util::time::now_ms();
    let list = match state.app.approvals.list(now).await {
        Ok(list) => list,
        Err(e) => {
            return store_unavailable(
                e.store,
                "the calls waiting for an operator cannot be listed",
            );
        }
    };
    let list: Vec<Value> = list.iter().map(|e| e.to_json()).collect();
    let store = state.app.approvals.shared.store();
    json_response(
        StatusCode::OK,
        &json!({"approvals": list, "now_ms": now, "store": store}),
    )
}

/// The body of `POST /api/approvals/{id}/approve|deny` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideRequest {
    /// Who decides, for the audit (at most 64 characters).
    by: Option<String>,
}

/// `POST /api/approvals/{id}/approve` and `/deny`: an operator's decision.
pub(crate) async fn decide(
    State(state): State<Arc<AdminState>>,
    axum::extract::Path((id, verb)): axum::extract::Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refusal) = admin(&state, &headers) {
        return refusal;
    }
    let approve = match verb.as_str() {
        "approve" => true,
        "deny" => false,
        _ => {
            return problem(
                StatusCode::NOT_FOUND,
                "POST /api/approvals/<id>/approve or /api/approvals/<id>/deny".into(),
            );
        }
    };
    let request: DecideRequest = if body.is_empty() {
        DecideRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    format!("the body must be empty or JSON such as {{\"by\": \"alice\"}}: {e}"),
                );
            }
        }
    };
    let by = match request.by.as_deref().map(str::trim) {
        None | Some("") => "admin-api".to_owned(),
        Some(name) if name.chars().count() <= 64 && !name.chars().any(char::is_control) => {
            format!("admin-api:{name}")
        }
        Some(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "\"by\" is at most 64 characters, without control characters".into(),
            );
        }
    };
    let now = crate::util::time::now_ms();
    match state.app.approvals.decide(&id, approve, &by, now).await {
        Ok(entry) => json_response(
            StatusCode::OK,
            &json!({"decided": if approve { "approved" } else { "denied" }, "approval": entry.to_json()}),
        ),
        Err(DecideError::Unknown) => problem(
            StatusCode::NOT_FOUND,
            "no approval with this id is pending: it was never queued, expired, or was used (with the memory \
             state store the queue is this replica's, and a restart empties it)"
                .into(),
        ),
        Err(DecideError::Unavailable { store }) => {
            store_unavailable(store, "the decision was not taken")
        }
        Err(DecideError::Decided(entry)) => json_response(
            StatusCode::CONFLICT,
            &json!({"error": "this approval was decided already", "approval": entry.to_json()}),
        ),
    }
}
