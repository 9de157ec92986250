//! Who may use the admin listener: the MCP listener's DNS-rebinding rules
//! on every path ([`guard`]), the admin token for every action ([`admin`])
//! and for every read once one is configured or off loopback ([`reader`]).
//!
//! Place: the admin layer's gate; every endpoint calls it. Invariants: the
//! token is checked against `[gateway] admin_token_sha256` in constant time
//! (401 without it or with a wrong one; 403 when no admin token is
//! configured, so nothing can be approved by whoever reaches the port).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use super::state::AdminState;
use crate::auth::hash_key;
use crate::error::{Rejection, json_response};
use crate::proxy::ingress::admit;

/// A read endpoint: it needs the admin token once one is configured, and
/// always off loopback (where a missing token refuses every read); open only
/// on a loopback listener without a token, behind [`guard`]'s Host check.
#[allow(clippy::result_large_err)]
pub(crate) fn reader(state: &AdminState, headers: &HeaderMap) -> Result<(), Response> {
    if state.config().gateway.admin_token_sha256.is_some() || !state.loopback {
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
    State(state): State<Arc<AdminState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let config = state.config();
    let authority = request.uri().authority().map(|a| a.as_str());
    if let Err(refusal) = admit(
        request.headers(),
        authority,
        &config.gateway,
        state.loopback,
    ) {
        let why = match refusal {
            Rejection::Forbidden(why) => why,
            other => other.code().to_owned(),
        };
        return problem(StatusCode::FORBIDDEN, why);
    }
    next.run(request).await
}

/// Checks the admin token.
// The refusal is the response itself, built once per refused request.
#[allow(clippy::result_large_err)]
pub(crate) fn admin(state: &AdminState, headers: &HeaderMap) -> Result<(), Response> {
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

/// 503 naming the shared state store that did not answer: never an empty
/// list, nor a decision or approval that was not taken.
pub(crate) fn store_unavailable(store: &str, what: &str) -> Response {
    let error = format!(
        "{what}: the shared state store ({store}) did not answer. Nothing was changed; try again shortly, and \
         check that every replica reaches {store} (GET /readyz shows it under \"state\")"
    );
    json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({"error": error, "store": store, "store_unavailable": true}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::Pins;

    fn state(token: bool, admin_loopback: bool) -> AdminState {
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
        let traces = Arc::new(crate::telemetry::Traces::off());
        let app = crate::proxy::state::AppState::new(
            Arc::new(config),
            pins,
            Arc::default(),
            traces.clone(),
            true,
        )
        .expect("state");
        let metrics = Arc::new(crate::metrics::Metrics::new(
            Arc::default(),
            traces.counters(),
        ));
        AdminState::new(Arc::new(app), admin_loopback, None, metrics, Arc::default())
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
