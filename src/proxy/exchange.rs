//! What the gateway knows about one request as it goes (the [`Exchange`]),
//! and the small steps every method shares: entering a server, observe or
//! enforce, the recipient of the reply.
//!
//! Place: the bottom of the pipeline's steps; every other step takes an
//! exchange. Invariant: the exchange is decided under one loaded
//! configuration ([`Live`]) to its end.

use std::sync::Arc;
use std::time::Instant;

use http::HeaderMap;
use serde_json::Value;

use super::state::{AppState, Live, ServerState};
use crate::proxy::catalog::CallFacts;
use crate::proxy::respond::Recipient;
use crate::proxy::tasks::{TaskScope, TaskStore};

use crate::auth::{ClientId, PresentedToken};
use crate::config::Mode;
use crate::error::{Rejection, RenderCtx};
use crate::identity::Caller;
use crate::mcp::headers::{self, MCP_SESSION_ID};
use crate::mcp::methods::Method as Rpc;
use crate::mcp::request::Request;
use crate::mcp::version::Era;
use crate::record::trail::Trail;

/// Accept header sent upstream on POST (MCP requires both).
pub(super) const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// What the gateway knows about the request so far.
#[derive(Debug)]
pub(super) struct Exchange {
    pub(super) started: Instant,
    pub(super) client: Option<ClientId>,
    /// The JWT the client authenticated with (not an API key): the subject of
    /// a token exchange, the claims of an identity template.
    pub(super) token: Option<PresentedToken>,
    pub(super) server: Option<String>,
    /// The method as received (or the HTTP method), for the audit and logs.
    pub(super) method: String,
    /// The method of the specification the request was typed as, once it is.
    pub(super) rpc: Option<Rpc>,
    pub(super) id: Option<Value>,
    pub(super) era: Era,
    pub(super) tool: Option<String>,
    /// In observe mode: what enforcement would have refused the request with.
    pub(super) would_refuse: Option<&'static str>,
    /// The mode the request was decided under.
    pub(super) mode: Mode,
    /// The audit event; later stages note on it what they learn.
    pub(super) trail: Arc<Trail>,
    /// In the merged view: `<server>__`, how the client knows this server's tools.
    pub(super) prefix: String,
    /// Tasks created through the gateway, and whose they are.
    pub(super) tasks: Arc<TaskStore>,
    /// The handshake-era session the client presented (the merged view's own
    /// in the merged view): what its `initialize` declared is known by it.
    pub(super) client_session: Option<String>,
}

impl Exchange {
    /// Whom the upstream requests of this exchange are sent for.
    pub(super) fn caller(&self, client: &ClientId) -> Caller {
        Caller {
            client: client.clone(),
            token: self.token.clone(),
        }
    }

    pub(super) fn render_ctx(&self) -> RenderCtx<'_> {
        RenderCtx {
            id: self.id.as_ref(),
            era: self.era,
        }
    }
}

/// The exchange is now about `server`: it is recorded, and its mode applies.
pub(super) fn enter(ex: &mut Exchange, live: &Live, server: &ServerState) {
    ex.server = Some(server.upstream.settings.name.clone());
    ex.mode = server
        .upstream
        .settings
        .mode
        .unwrap_or(live.config.gateway.mode);
}

/// In observe mode a policy, rate-limit or validation refusal is recorded, not
/// enforced (`None`); every other refusal (transport, headers, parameters) is
/// enforced always.
pub(super) fn observe_or_enforce<T>(
    ex: &mut Exchange,
    decided: Result<T, Rejection>,
) -> Result<Option<T>, Rejection> {
    match decided {
        Ok(value) => Ok(Some(value)),
        Err(
            rejection @ (Rejection::Tool(_)
            | Rejection::NotFound(_)
            | Rejection::RateLimited(_)
            | Rejection::SecretInParams(_)),
        ) if ex.mode == Mode::Observe => {
            ex.would_refuse = Some(rejection.code());
            Ok(None)
        }
        Err(other) => Err(other),
    }
}

pub(super) fn recipient(
    live: &Live,
    ex: &Exchange,
    server: &ServerState,
    tool: Option<String>,
) -> Recipient {
    let tasks = ex.client.clone().map(|client| TaskScope {
        store: ex.tasks.clone(),
        client,
        creates: ex.rpc == Some(Rpc::ToolsCall),
    });
    Recipient {
        tasks,
        id: ex.id.clone(),
        method: ex.method.clone(),
        rpc: ex.rpc,
        era: ex.era,
        server: server.upstream.settings.name.clone(),
        tool,
        catalog: server.catalog.clone(),
        sanitize: live.sanitize.clone(),
        call: CallFacts::default(),
        trail: ex.trail.clone(),
        flow: None,
    }
}

/// The bytes a call is forwarded as: the typed request serialised once,
/// canonically ([`crate::util::canonical`]), never the client's own spelling,
/// so the arguments the server receives are byte-for-byte those an approval
/// binds and a person is shown.
pub(super) fn canonical_body(request: &Request) -> bytes::Bytes {
    bytes::Bytes::from(crate::util::canonical::to_vec(&request.to_value()))
}

/// The session a legacy request presents must be this client's (known
/// here, or to the fleet's shared state store).
pub(super) async fn session(
    state: &AppState,
    server: &ServerState,
    client: &ClientId,
    headers: &HeaderMap,
    era: Era,
) -> Result<Option<String>, Rejection> {
    let presented =
        headers::single(headers, MCP_SESSION_ID).map_err(|m| Rejection::HeaderMismatch(m.0))?;
    let id = match (era, presented) {
        // 2026-07-28 has no sessions; a stray id is ignored (and not forwarded).
        (Era::Modern, _) | (_, None) => return Ok(None),
        (Era::Legacy, Some(id)) => id,
    };
    let known = state
        .sessions
        .check_in_fleet(&server.upstream.settings.name, id, client)
        .await
        .map_err(|e| Rejection::StateUnavailable(e.store))?;
    match known {
        true => Ok(Some(id.to_owned())),
        false => Err(Rejection::SessionNotFound),
    }
}
