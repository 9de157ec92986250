//! The admin API on the admin listener: pin state and approvals, metrics.
//!
//! Place in the path: beside the MCP data path, never on it. `GET /api/pins`
//! lists every pin with its status, scan findings and diff;
//! `POST /api/pins/approve` approves what a server serves now; `GET /metrics`
//! is the Prometheus scrape (a read like the others: client and tool names);
//! `GET /readyz` says whether each server can take requests;
//! `GET /api/approvals` lists the calls waiting for an operator, and
//! `POST /api/approvals/{id}/approve` or `/deny` decides one.
//!
//! Invariants: every request to the admin listener passes [`guard`] first
//! (the Origin/Host rules of the MCP listener); an admin action needs `Authorization: Bearer <admin token>`,
//! checked against `[gateway] admin_token_sha256` in constant time (401
//! without it or with a wrong one; 403 when no admin token is configured, so
//! nothing can be approved by whoever reaches the port); every read but
//! `/healthz`, `/readyz` and the page itself needs the token too once one is
//! configured, and always off loopback; nothing here can add an upstream or
//! read a secret.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::auth::hash_key;
use crate::error::{Rejection, json_response};
use crate::pins::{ApproveOutcome, Key};
use crate::proxy::{AppState, admit};

/// `GET /metrics`: OpenMetrics text.
pub(crate) async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // Client and tool names are in the labels: a read endpoint like the others.
    if let Err(refusal) = reader(&state, &headers) {
        return refusal;
    }
    let mut response = Response::new(state.metrics.encode().into());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// `GET /readyz`: 200 when every server can take requests, 503 while a stdio
/// server's process is starting or restarting; the body says which (open,
/// like `/healthz`: states and process ids only).
pub(crate) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let (ready, body) = state.readiness();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &body)
}

/// A read endpoint: it needs the admin token once one is configured, and
/// always off loopback (where a missing token refuses every read); open only
/// on a loopback listener without a token, behind [`guard`]'s Host check.
#[allow(clippy::result_large_err)]
pub(crate) fn reader(state: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    if state.config().gateway.admin_token_sha256.is_some() || !state.admin_loopback {
        admin(state, headers)
    } else {
        Ok(())
    }
}

/// Before every endpoint of the admin listener: the MCP listener's DNS
/// rebinding defences, with the same settings — a present `Origin` must be
/// allowed (or local, on a loopback listener), and on a loopback listener
/// `Host` must name loopback or an `allowed_hosts` entry (403 otherwise).
pub(crate) async fn guard(
    State(state): State<Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let config = state.config();
    let authority = request.uri().authority().map(|a| a.as_str());
    if let Err(refusal) = admit(
        request.headers(),
        authority,
        &config.gateway,
        state.admin_loopback,
    ) {
        let why = match refusal {
            Rejection::Forbidden(why) => why,
            other => other.code().to_owned(),
        };
        return problem(StatusCode::FORBIDDEN, why);
    }
    next.run(request).await
}

/// `GET /api/pins`.
pub(crate) async fn pins(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let config = state.config();
    if let Err(refusal) = reader(&state, &headers) {
        return refusal;
    }
    let modes: BTreeMap<String, _> = config
        .servers
        .iter()
        .map(|(name, s)| (name.clone(), s.pinning))
        .collect();
    json_response(StatusCode::OK, &state.pins.report(&modes))
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
    State(state): State<Arc<AppState>>,
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
    match state.pins.approve(&key, request.hash.as_deref(), "api") {
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

/// `GET /api/approvals`: the operator queue (pending, and approved but not
/// used yet), oldest first; expired entries are taken out (and audited) first.
pub(crate) async fn approvals(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = reader(&state, &headers) {
        return refusal;
    }
    let now = crate::pins::now_ms();
    state.approvals.sweep(now);
    let list: Vec<Value> = state
        .approvals
        .queue
        .list(now)
        .iter()
        .map(|e| e.to_json())
        .collect();
    json_response(StatusCode::OK, &json!({"approvals": list, "now_ms": now}))
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
    State(state): State<Arc<AppState>>,
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
    let now = crate::pins::now_ms();
    match state.approvals.decide(&id, approve, &by, now) {
        Ok(entry) => json_response(
            StatusCode::OK,
            &json!({"decided": if approve { "approved" } else { "denied" }, "approval": entry.to_json()}),
        ),
        Err(crate::approval::queue::DecideError::Unknown) => problem(
            StatusCode::NOT_FOUND,
            "no approval with this id is pending: it was never queued, expired, or was used (the queue is in \
             memory: a restart empties it)"
                .into(),
        ),
        Err(crate::approval::queue::DecideError::Decided(entry)) => json_response(
            StatusCode::CONFLICT,
            &json!({"error": "this approval was decided already", "approval": entry.to_json()}),
        ),
    }
}

fn describe(key: &Key) -> String {
    match key.kind {
        crate::pins::PinKind::Tool => format!("tool `{}`", key.name),
        crate::pins::PinKind::Instructions => "the instructions".to_owned(),
    }
}

/// Checks the admin token.
// The refusal is the response itself, built once per refused request.
#[allow(clippy::result_large_err)]
pub(crate) fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    let config = state.config();
    let Some(expected) = &config.gateway.admin_token_sha256 else {
        return Err(problem(
            StatusCode::FORBIDDEN,
            "admin actions are disabled: no admin token is configured. Set [gateway] admin_token_sha256 to the \
             SHA-256 of a token (`portcullis hash-key` prints it), or approve with `portcullis pins approve`"
                .into(),
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|t| !t.is_empty());
    let ok = presented.is_some_and(|token| bool::from(hash_key(token).ct_eq(expected)));
    if ok {
        return Ok(());
    }
    let mut r = problem(
        StatusCode::UNAUTHORIZED,
        "this admin endpoint needs `Authorization: Bearer <admin token>`".into(),
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"portcullis-admin\""),
    );
    Err(r)
}

pub(crate) fn problem(status: StatusCode, message: String) -> Response {
    json_response(status, &json!({"error": Value::String(message)}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::Pins;

    fn state(token: bool, admin_loopback: bool) -> AppState {
        crate::app::install_crypto_provider();
        let token = match token {
            true => format!("admin_token_sha256 = \"{}\"\n", hex::encode(hash_key("t"))),
            false => String::new(),
        };
        let text = format!(
            "[gateway]\n{token}[servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [pins]\ndatabase = \":memory:\"\n[audit]\ndatabase = \":memory:\"\n"
        );
        let config = crate::config::load_str(&text, "t.toml", &|_| None).expect("config");
        let pins = Pins::open(None, "t.toml").expect("pins");
        let audit = crate::audit::Audit::open(&config.audit).expect("audit");
        let traces = Arc::new(crate::telemetry::Traces::off());
        let mut state =
            AppState::new(Arc::new(config), pins, audit, traces, true, None).expect("state");
        state.admin_loopback = admin_loopback;
        state
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("value");
        h.insert(header::AUTHORIZATION, value);
        h
    }

    #[test]
    fn reads_need_the_token_once_configured_and_always_off_loopback() {
        let status = |r: Result<(), Response>| r.err().map(|r| r.status().as_u16());
        let open = state(false, true);
        assert_eq!(status(reader(&open, &HeaderMap::new())), None);
        // Off loopback without a token (a configuration refuses this; the reads stay shut anyway).
        let exposed = state(false, false);
        assert_eq!(status(reader(&exposed, &HeaderMap::new())), Some(403));
        assert_eq!(status(reader(&exposed, &bearer("t"))), Some(403));
        for admin_loopback in [true, false] {
            let guarded = state(true, admin_loopback);
            assert_eq!(status(reader(&guarded, &HeaderMap::new())), Some(401));
            assert_eq!(status(reader(&guarded, &bearer("wrong"))), Some(401));
            assert_eq!(status(reader(&guarded, &bearer("t"))), None);
        }
    }
}
