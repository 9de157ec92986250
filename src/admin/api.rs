//! The admin API: readiness, the Prometheus scrape, pin state and approvals.
//!
//! Place: the admin layer, behind [`super::access::guard`]. `GET /api/pins`
//! lists every pin with its status, scan findings and diff;
//! `POST /api/pins/approve` approves what a server serves now (with a shared
//! state store, for every replica: recorded there first); `GET /metrics`
//! is the Prometheus scrape (a read like the others: client and tool names);
//! `GET /readyz` says whether each server can take requests.
//!
//! Invariants: an action needs the admin token and a read needs it once one
//! is configured ([`super::access`]); nothing here can add an upstream or
//! read a secret.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::json;

use super::access::{admin, problem, reader, store_unavailable};
use super::state::AdminState;
use crate::error::json_response;
use crate::pins::{ApproveOutcome, Key};

/// `GET /metrics`: OpenMetrics text.
pub(crate) async fn metrics(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    // Client and tool names are in the labels: a read endpoint like the others.
    if let Err(refusal) = reader(&state, &headers) {
        return refusal;
    }
    state.metrics.set_breakers(state.app.breakers());
    let limiter = &state.app.limiter;
    state
        .metrics
        .set_rate_limit_store(limiter.backend_errors(), limiter.refunds_lost());
    let mut response = Response::new(state.metrics.encode().into());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// `GET /readyz`: 200 when every server can take requests, 503 while a stdio
/// server's process is starting or restarting; the body says which (open,
/// like `/healthz`: states and process ids only). `state` reports the
/// shared state store and whether it answers; an unreachable store does not
/// make the replica unready (calls that need no approval still run, and
/// those that do are refused with `state_unavailable` by every replica alike).
pub(crate) async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    let (ready, mut body) = state.app.readiness();
    body["state"] = state.app.approvals.shared.health().await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &body)
}

/// `GET /healthz`: the process is alive (always 200), which replica it is,
/// and the state of its stores (the audit store: `up`, or `down` with the
/// events it buffers meanwhile and those it lost). `status` is `degraded`
/// while a server's circuit breaker is not closed, with those servers in
/// `breakers`: the gateway still answers for them, so it is not down.
pub(crate) async fn healthz(State(state): State<Arc<AdminState>>) -> Response {
    let mut body = match &state.audit {
        Some(audit) => serde_json::json!({
            "status": "ok",
            "replica": audit.replica(),
            "stores": {"audit": audit.health()},
        }),
        None => serde_json::json!({"status": "ok"}),
    };
    let open: serde_json::Map<String, serde_json::Value> = (state.app.breakers().into_iter())
        .filter(|b| b.state != "closed")
        .map(|b| (b.server, b.state.into()))
        .collect();
    if !open.is_empty() {
        body["status"] = "degraded".into();
        body["breakers"] = open.into();
    }
    json_response(StatusCode::OK, &body)
}

/// `GET /api/pins`.
pub(crate) async fn pins(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    let config = state.config();
    if let Err(refusal) = reader(&state, &headers) {
        return refusal;
    }
    let modes: BTreeMap<String, _> = config
        .servers
        .iter()
        .map(|(name, s)| (name.clone(), s.pinning))
        .collect();
    json_response(StatusCode::OK, &state.app.pins.report(&modes))
}

/// The body of `POST /api/pins/approve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveRequest {
    server: String,
    tool: Option<String>,
    #[serde(default)]
    instructions: bool,
    /// The hash of the definition the operator reviewed (optional).
    hash: Option<String>,
}

/// `POST /api/pins/approve`.
pub(crate) async fn approve(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refusal) = admin(&state, &headers) {
        return refusal;
    }
    let request: ApproveRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!(
                    "the body must be JSON such as {{\"server\": \"S\", \"tool\": \"T\"}} \
                     (or {{\"server\": \"S\", \"instructions\": true}}), optionally with the \"hash\" you reviewed: {e}"
                ),
            );
        }
    };
    let config = state.config();
    if !config.servers.contains_key(&request.server) {
        let known: Vec<&str> = config.servers.keys().map(String::as_str).collect();
        return problem(
            StatusCode::NOT_FOUND,
            format!(
                "no server named {:?} is configured; configured servers: {}",
                request.server,
                known.join(", ")
            ),
        );
    }
    let key = match (&request.tool, request.instructions) {
        (Some(tool), false) => Key::tool(&request.server, tool),
        (None, true) => Key::instructions(&request.server),
        _ => {
            return problem(
                StatusCode::BAD_REQUEST,
                "name exactly one of \"tool\" or \"instructions\": true".into(),
            );
        }
    };
    let what = describe(&key);
    let mut expected = request.hash.clone();
    let shared = &state.app.approvals.shared;
    if shared.is_shared()
        && let Some(seen) = seen_hash(&state, &key)
        && expected
            .as_deref()
            .is_none_or(|h| h.eq_ignore_ascii_case(&seen))
    {
        // The fleet's record first: an approval no other replica would
        // accept is not taken on this one either.
        let value = crate::pins::fleet::value(&seen, "api");
        match shared
            .pin_approve(&crate::pins::fleet::field(&key), &value)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return problem(
                    StatusCode::INSUFFICIENT_STORAGE,
                    format!(
                        "the fleet holds approvals of {} pins already; nothing was approved",
                        crate::state::queue::MAX_PIN_APPROVALS
                    ),
                );
            }
            Err(e) => return store_unavailable(e.store, "the pin was not approved"),
        }
        // What this replica approves is exactly what the fleet recorded.
        expected = Some(seen);
    }
    match state.app.pins.approve(&key, expected.as_deref(), "api") {
        ApproveOutcome::Approved { hash } => json_response(
            StatusCode::OK,
            &json!({"approved": true, "server": key.server, "subject": what, "hash": hash,
                    "message": format!("approved {what} on server `{}`; calls to it are served again", key.server)}),
        ),
        ApproveOutcome::AlreadyApproved { hash } => json_response(
            StatusCode::OK,
            &json!({"approved": true, "already": true, "server": key.server, "subject": what, "hash": hash,
                    "message": format!("{what} on server `{}` already serves its approved definition", key.server)}),
        ),
        ApproveOutcome::Unknown => problem(
            StatusCode::NOT_FOUND,
            format!(
                "no pin for {what} on server `{}`: the gateway pins a tool when it first lists the server's tools, \
                 and instructions when a client first initializes",
                key.server
            ),
        ),
        ApproveOutcome::HashMismatch { seen } => {
            let mut r = problem(
                StatusCode::CONFLICT,
                format!(
                    "{what} on server `{}` changed since you reviewed it: it now hashes to {seen}; review it again \
                     (GET /api/pins, or `portcullis pins list --config {}`) and approve that hash",
                    key.server, config.source
                ),
            );
            if let Ok(v) = HeaderValue::from_str(&seen) {
                r.headers_mut().insert("x-portcullis-pin-hash", v);
            }
            r
        }
    }
}

/// The hash (hex) of the definition `key`'s server serves now, as
/// `GET /api/pins` reports it.
fn seen_hash(state: &AdminState, key: &Key) -> Option<String> {
    let config = state.config();
    let mode = config.servers.get(&key.server)?.pinning;
    let modes = BTreeMap::from([(key.server.clone(), mode)]);
    let report = state.app.pins.report(&modes);
    let server = &report["servers"][&key.server];
    let pin = match key.kind {
        crate::pins::PinKind::Tool => server["tools"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == key.name.as_str())?,
        crate::pins::PinKind::Instructions => &server["instructions"],
    };
    pin["seen"]["hash"].as_str().map(str::to_owned)
}

fn describe(key: &Key) -> String {
    match key.kind {
        crate::pins::PinKind::Tool => format!("tool `{}`", key.name),
        crate::pins::PinKind::Instructions => "the instructions".to_owned(),
    }
}
